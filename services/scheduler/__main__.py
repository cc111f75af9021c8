"""``python -m cellpilot_services.scheduler``: the Borg scheduler beside the elected master (Borg §3.4).

Settings come from ``CELLPILOT_SCHEDULER_*`` (see ``settings.py``); the cell's scheduling policy
from ``CELLPILOT_BORGMASTER_*``. ``cellpilot run`` starts one, serving gRPC health on
127.0.0.1:7700 and Prometheus metrics on 8700.
"""

from __future__ import annotations

from cellpilot.platform.service import service_main
from cellpilot_services.scheduler.scheduler_service import serve
from cellpilot_services.scheduler.settings import SchedulerSettings


def main() -> None:
    service_main(SchedulerSettings, serve)


if __name__ == "__main__":
    main()
