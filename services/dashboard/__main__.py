"""``python -m cellpilot_services.dashboard``: the dashboard on https://127.0.0.1:8080 (see app.py)."""

from __future__ import annotations

from cellpilot.platform.service import service_main
from cellpilot_services.dashboard.app import serve
from cellpilot_services.dashboard.settings import DashboardSettings


def main() -> None:
    # The dashboard serves /metrics on its own HTTP port (app.py), so no separate metrics port.
    service_main(DashboardSettings, serve, prometheus=True)


if __name__ == "__main__":
    main()
