"""Study shards on a Dask distributed cluster: the cluster's ``ShardRunner``.

:func:`dask_runner` connects to a running scheduler (``tcp://host:8786``, e.g. the compose
profile ``dask``) or, for ``"local"``, starts a ``LocalCluster`` of single-threaded worker
processes on this machine. :class:`DaskShards` implements
:class:`cellpilot.evaluate.sharding.ShardRunner`: the study's context is scattered to every
worker once, each shard is one task (bigger shards first when costs are given), and results
are put back in shard order as they finish, so a study's outcome is the same as in one
process. The per-shard functions are the studies' own module-level pure functions; the
workers import them from the same ``cellpilot`` version (the services image, or this
environment for a local cluster).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from distributed import Client, LocalCluster, as_completed

from cellpilot.evaluate.sharding import ShardRunner

C = TypeVar("C")
S = TypeVar("S")
R = TypeVar("R")

LOCAL = "local"


class DaskShards(ShardRunner):
    """A :class:`~cellpilot.evaluate.sharding.ShardRunner` over a ``distributed.Client``."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @property
    def workers(self) -> int:
        return max(1, sum(self.client.nthreads().values()))

    def finished(
        self, fn: Callable[[C, S], R], context: C, shards: Sequence[S], costs: Sequence[float] | None
    ) -> Generator[tuple[int, R], None, None]:
        # In a list: scattering a tuple or dict would scatter its items one by one.
        [shared] = self.client.scatter([context], broadcast=True, hash=False)
        order = range(len(shards)) if costs is None else sorted(range(len(shards)), key=lambda i: -costs[i])
        run = uuid.uuid4().hex[:12]
        index: dict[str, int] = {}
        futures = []
        for rank, i in enumerate(order):
            key = f"{getattr(fn, '__name__', 'shard')}-{run}-{i}"
            index[key] = i
            # Earlier-submitted (bigger) shards first; Dask runs higher priorities first.
            futures.append(self.client.submit(fn, shared, shards[i], key=key, priority=-rank, pure=False))
        try:
            for future in as_completed(futures):
                result = future.result()
                future.release()
                yield index[future.key], result
        finally:
            for future in futures:
                future.cancel()
            shared.release()


@contextmanager
def dask_runner(address: str, workers: int = 2, connect_timeout: float = 10.0) -> Iterator[DaskShards]:
    """A runner on the scheduler at ``address``, or on a local cluster of ``workers`` processes
    (listening on the loopback interface only).

    Raises ``OSError`` when the scheduler cannot be reached within ``connect_timeout`` seconds.
    """
    if address == LOCAL:
        if workers < 1:
            raise ValueError("a local cluster needs at least one worker")
        with (
            LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",  # its HTTP routes on a free port, not 8787
                silence_logs=logging.ERROR,
            ) as cluster,
            Client(cluster) as client,
        ):
            yield DaskShards(client)
        return
    try:
        # Through the scheduler: the workers (e.g. containers) need not be reachable from here.
        client = Client(address, timeout=f"{connect_timeout}s", direct_to_workers=False)
    except (OSError, TimeoutError, ValueError) as error:
        raise OSError(f"cannot reach the Dask scheduler at {address}: {error}") from error
    with client:
        yield DaskShards(client)
