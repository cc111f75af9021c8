"""The Borglet service: the per-machine agent (Borg §3.3), one machine or a fleet of simulated ones."""
