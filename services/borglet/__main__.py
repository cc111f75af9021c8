"""``python -m cellpilot_services.borglet``: one Borglet process (one machine, or a fleet).

Settings come from ``CELLPILOT_BORGLET_*`` environment variables (see ``settings.py``), e.g.
``CELLPILOT_BORGLET_FLEET_SIZE=100 CELLPILOT_BORGLET_SPEEDUP=10
CELLPILOT_BORGLET_BORGMASTER_ADDRESSES=127.0.0.1:7100,127.0.0.1:7101``.
"""

from __future__ import annotations

from cellpilot.platform.service import service_main
from cellpilot_services.borglet.borglet_service import serve
from cellpilot_services.borglet.settings import BorgletSettings


def main() -> None:
    service_main(BorgletSettings, serve)


if __name__ == "__main__":
    main()
