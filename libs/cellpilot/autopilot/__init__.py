"""Pure decision logic of the running Autopilot services (Autopilot §3.1-§3.3, §5); no I/O.

* :mod:`event_windows`: the aggregator's event-time windows per input partition
  (watermark, grace period, late and duplicate accounting, checkpoint bytes);
* :mod:`job_windows`: per-job sums s[t] of closed per-task windows s_i[t] (§3.2.1);
* :mod:`candidates`: every built-in recommender's output per job and resource, OOM
  feedback, and the CPU-utilisation signal of horizontal scaling (§3.2-§3.3);
* :mod:`selection`: which recommender sizes a job's resource, user bounds (§3.2, §5.4);
* :mod:`decisions`: the master's per-job decision: dead band, horizontal stabilisation,
  reconciliation of horizontal and vertical steps, dry run, hold release;
* :mod:`rate_limit`: token buckets for the actuator;
* :mod:`array_bundle`: a compact byte form for checkpoints.

The services in ``services/`` are thin async shells around these modules.
"""
