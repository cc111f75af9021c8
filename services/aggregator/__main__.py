"""``python -m cellpilot_services.aggregator``: one aggregator replica.

Settings come from ``CELLPILOT_AGGREGATOR_*`` environment variables (see ``settings.py``);
``cellpilot run`` starts two replicas sharing the ``usage.samples`` partitions; replica
``i`` serves the Monitoring API on 127.0.0.1:730i.
"""

from __future__ import annotations

from cellpilot.platform.service import service_main
from cellpilot_services.aggregator.aggregator_service import serve
from cellpilot_services.aggregator.settings import AggregatorSettings


def main() -> None:
    service_main(AggregatorSettings, serve)


if __name__ == "__main__":
    main()
