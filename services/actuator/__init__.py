"""The actuator (Autopilot §3.1): applies the Autopilot master's decisions to the Borgmaster."""
