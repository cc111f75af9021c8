"""Where each service keeps its state in Redis: the key prefixes the services default to, and
that the chaos run's evidence reads (one definition for both)."""

from __future__ import annotations

AUTOPILOT_PREFIX = "cellpilot:autopilot"  # the Autopilot master's lock, decisions and held jobs
ACTUATOR_PREFIX = "cellpilot:actuator"  # the actuator's applied actuations and its fencing floor
RECOMMENDER_PREFIX = "cellpilot:recommender"  # <prefix>:<group>:p<partition>:{epoch,offsets,jobs}
