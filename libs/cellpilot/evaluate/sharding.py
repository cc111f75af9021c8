"""A study as a map over shards: one pure function per shard, results combined in shard order.

Every study splits its work the same way: a ``context`` every shard needs (the study's
configuration, a trained model, a workload) and a list of ``shards`` (chunks of jobs,
policy runs, Monte Carlo instances, seeds), each carrying whatever seed it needs. The
per-shard function ``fn(context, shard)`` is pure and module-level (so it can run in
another process or on another machine); its results come back as a list in shard order,
so a study gives the same answer however and wherever its shards ran.

:class:`InProcess` runs the shards one after the other in this process. A runner that
spreads them over a cluster (``cellpilot.platform.dask_shards``) is another
:class:`ShardRunner`, outside the core; studies only ever see :class:`ShardRunner`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from contextlib import closing
from typing import Any, TypeVar

C = TypeVar("C")
S = TypeVar("S")
R = TypeVar("R")

ShardDone = Callable[[int], None]  # called with the shard's index as each shard finishes


def counting_shards(progress: Callable[[int], None] | None) -> ShardDone:
    """An ``on_done`` that tells ``progress`` how many shards have finished so far."""
    done = 0

    def finished(_: int) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done)

    return finished


class ShardRunner(ABC):
    """Maps a pure per-shard function over shards; results in shard order.

    :meth:`map` is the one place that puts results back in shard order and reports each
    finished shard; a runner says only where shards run (:meth:`finished`) and how many at once.
    """

    @property
    @abstractmethod
    def workers(self) -> int:
        """How many shards run at once (a hint for how finely to split the work)."""

    @abstractmethod
    def finished(
        self, fn: Callable[[C, S], R], context: C, shards: Sequence[S], costs: Sequence[float] | None
    ) -> Generator[tuple[int, R], None, None]:
        """``(index, fn(context, shards[index]))`` for every shard, in the order they finish."""

    def map(
        self,
        fn: Callable[[C, S], R],
        context: C,
        shards: Sequence[S],
        *,
        costs: Sequence[float] | None = None,
        on_done: ShardDone | None = None,
    ) -> list[R]:
        """``costs`` (optional, one per shard) lets a parallel runner start the biggest first."""
        if not shards:
            return []
        results: list[Any] = [None] * len(shards)
        with closing(self.finished(fn, context, shards, costs)) as finished:
            for index, result in finished:
                results[index] = result
                if on_done is not None:
                    on_done(index)
        return results


class InProcess(ShardRunner):
    """Runs every shard here, in order."""

    @property
    def workers(self) -> int:
        return 1

    def finished(
        self, fn: Callable[[C, S], R], context: C, shards: Sequence[S], costs: Sequence[float] | None
    ) -> Generator[tuple[int, R], None, None]:
        del costs  # one at a time: order does not matter
        for index, shard in enumerate(shards):
            yield index, fn(context, shard)


IN_PROCESS = InProcess()
