"""The telemetry tests run the Autopilot end-to-end pipeline of tests/integration/autopilot_master."""

import sys
from pathlib import Path

# Reuse its harness and pipeline (autopilot_master_harness, test_autopilot_end_to_end.usage_pipeline).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "autopilot_master"))
