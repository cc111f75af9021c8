"""The Autopilot master (Autopilot §3.1): elected replicas that choose, post-process and actuate."""
