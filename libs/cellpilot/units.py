"""The unit of every quantity, defined once.

On the wire (every ``*.proto``), in the Borgmaster's core and in the Autopilot master: CPU in
millicores (Borg §2.3: "CPU in milli-cores"), memory and disk in bytes, times in milliseconds.
The usage histograms and the recommenders that read them (:mod:`cellpilot.usage.buckets`,
:mod:`cellpilot.recommend`, :mod:`cellpilot.autopilot.candidates`) hold CPU in cores, the
unit the bucket scheme's boundaries and the ML margins (Autopilot §3.2.3, eq. 7) are stated
in; :func:`cellpilot.usage.buckets.wire_per_scheme_unit` is the one conversion between the
two, used where samples enter the histograms and where recommendations leave them. Cores and
GiB for people are a matter for the CLI and the dashboard.
"""

from __future__ import annotations

MILLICORES_PER_CORE = 1000
KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
