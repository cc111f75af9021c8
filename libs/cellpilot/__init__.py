"""Cellpilot: Borg, Autopilot, GPA and LAVA as one open cluster manager.

The package is split in two layers (see docs/architecture.md):

* the core (``usage``, ``recommend``, ``schedule``, ``lifetimes``, ``workloads``,
  ``evaluate``) is pure numpy code with no I/O;
* ``platform`` and the services around it do the I/O (gRPC, Kafka, Redis, PostgreSQL).
"""

__version__ = "0.1.0"
