"""Borg's job, task and machine lifecycles as data (Borg §2.2–§2.3, Figure 2).

Pure core: plain enums and transition tables, no I/O. The Borgmaster service changes
state only through these tables, so an illegal transition is a returned result, and the
checkpoint log replays to exactly the state the live master had.
"""
