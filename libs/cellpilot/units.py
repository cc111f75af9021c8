"""The unit of every quantity, defined once.

CPU is in millicores end to end (Borg §2.3: "CPU in milli-cores"): on the wire (every
``*.proto``), in the Borgmaster's core, in the usage histograms (:data:`CPU_SCHEME
<cellpilot.usage.buckets.CPU_SCHEME>` is a millicore scheme), in every recommender that reads
them (:mod:`cellpilot.recommend`, :mod:`cellpilot.autopilot`), in the Autopilot master, the
simulated world and the workload models. Memory and disk are in bytes, times in milliseconds.
Parameters stated per core or per GiB (the ML ensemble's additive margins, Autopilot §3.2.3
eq. 7; the margin curve's breakpoints) are converted once, where they are configured, with
the constants below. Cores and GiB for people are a matter for the CLI, the dashboard and
the study reports. Histograms stored under the old cores scheme are re-labelled on read
(:data:`cellpilot.usage.buckets.LEGACY_SCHEMES`).
"""

from __future__ import annotations

MILLICORES_PER_CORE = 1000
KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
