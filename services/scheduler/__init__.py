"""The Borg scheduler as a process of its own beside the elected Borgmaster (Borg §3.4)."""
