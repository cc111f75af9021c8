"""``python -m cellpilot_services.borgmaster``: one Borgmaster replica.

Settings come from ``CELLPILOT_BORGMASTER_*`` environment variables (see ``settings.py``);
``cellpilot run`` starts three replicas (``CELLPILOT_REPLICA_INDEX`` 0, 1, 2) listening on
127.0.0.1:7100, 7101 and 7102; one of them is elected master.
"""

from __future__ import annotations

from cellpilot.platform.service import service_main
from cellpilot_services.borgmaster.borgmaster_service import serve
from cellpilot_services.borgmaster.settings import BorgmasterSettings


def main() -> None:
    service_main(BorgmasterSettings, serve)


if __name__ == "__main__":
    main()
