"""``python -m cellpilot_services.recommender``: one recommender worker replica.

Settings come from ``CELLPILOT_RECOMMENDER_*`` environment variables (see ``settings.py``);
``cellpilot run`` starts three replicas in one consumer group; replica ``i`` serves gRPC
health on 127.0.0.1:750i.
"""

from __future__ import annotations

from cellpilot.platform.service import service_main
from cellpilot_services.recommender.settings import RecommenderSettings
from cellpilot_services.recommender.worker import serve


def main() -> None:
    service_main(RecommenderSettings, serve)


if __name__ == "__main__":
    main()
