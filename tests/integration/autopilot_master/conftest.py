"""The Autopilot master tests also start aggregators and recommender workers as processes:
they reuse the helpers of tests/integration/autopilot (``autopilot_processes``), importable
from here whichever test directory pytest collected first."""

from __future__ import annotations

import sys
from pathlib import Path

_AUTOPILOT_TESTS = str(Path(__file__).resolve().parents[1] / "autopilot")
if _AUTOPILOT_TESTS not in sys.path:
    sys.path.append(_AUTOPILOT_TESTS)
