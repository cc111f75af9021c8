"""``python -m cellpilot_services.autopilot``: one Autopilot master replica.

Settings come from ``CELLPILOT_AUTOPILOT_*`` environment variables (see ``settings.py``);
``cellpilot run`` starts two replicas (``CELLPILOT_REPLICA_INDEX`` 0, 1) on 127.0.0.1:7400
and 7401; the one holding the Redis lock acts.
"""

from __future__ import annotations

from cellpilot.platform.service import service_main
from cellpilot_services.autopilot.autopilot_service import serve
from cellpilot_services.autopilot.settings import AutopilotSettings


def main() -> None:
    service_main(AutopilotSettings, serve)


if __name__ == "__main__":
    main()
