"""What an Autopilot master replica's API and its decision loop work with.

Every replica serves the API (:class:`~cellpilot_services.autopilot.servicer.AutopilotServicer`);
the elected one also runs the :class:`~cellpilot_services.autopilot.decision_loop.DecisionLoop`.
Both read and write the same Redis state, under the same lease, against the same Borgmaster
and Kafka producer: one :class:`AutopilotReplica`, built once by the service.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellpilot.client.async_client import BorgmasterClient
from cellpilot.platform.kafka import MessageProducer
from cellpilot.platform.leadership import LeaderLease
from cellpilot.platform.stream_access import StreamAccess
from cellpilot_services.autopilot.settings import AutopilotSettings
from cellpilot_services.autopilot.state_store import StateStore


@dataclass(frozen=True)
class AutopilotReplica:
    settings: AutopilotSettings
    store: StateStore  # the Redis state every replica reads and the leader writes, fenced
    lock: LeaderLease  # the election (Redis lock with a fencing token)
    borgmaster: BorgmasterClient  # as this service; the API changes jobs as its caller
    producer: MessageProducer  # recommendations (custom recommenders) and actuations
    access: StreamAccess  # the service's stream access (the decision loop's consumer)
