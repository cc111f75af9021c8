"""``python -m cellpilot_services.actuator``: the actuator (one replica, health on 127.0.0.1:7600)."""

from __future__ import annotations

from cellpilot.platform.service import service_main
from cellpilot_services.actuator.actuator_service import serve
from cellpilot_services.actuator.settings import ActuatorSettings


def main() -> None:
    service_main(ActuatorSettings, serve)


if __name__ == "__main__":
    main()
