"""Where a ``cellpilot eval`` study runs its shards: the ``--dask`` and ``--workers`` options.

* neither (or ``--workers 1``): every shard in this process;
* ``--workers N`` (N > 1): a local Dask cluster of N single-threaded worker processes;
* ``--dask`` or ``--dask local``: the same local cluster (``--workers`` processes, at least 2);
* ``--dask tcp://HOST:8786``: the scheduler there (e.g. ``docker compose --profile dask up -d``).

Results do not depend on the choice: shards carry their own seeds and are combined in order
(:mod:`cellpilot.evaluate.sharding`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Annotated

import typer

from cellpilot.cli.output import register_with_options, shared_option
from cellpilot.evaluate.sharding import IN_PROCESS, ShardRunner
from cellpilot.platform.dask_shards import LOCAL, dask_runner

DaskOption = Annotated[
    str | None,
    typer.Option(
        "--dask",
        metavar="[ADDRESS]",
        help="run the shards on a Dask cluster: a scheduler ADDRESS (tcp://host:8786), "
        "or no address / 'local' for a local cluster of --workers processes",
    ),
]
WorkersOption = Annotated[
    int, typer.Option(help="processes: more than 1 runs the shards on a local Dask cluster")
]


def bare_dask_means_local(argv: list[str]) -> list[str]:
    """``--dask`` given without an address (last, or before another option) means ``--dask local``.

    The command line's parser has no options with an optional value, so the entry point
    fills the value in before parsing.
    """
    out: list[str] = []
    for i, token in enumerate(argv):
        out.append(token)
        if token == "--dask" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append(LOCAL)
    return out


@dataclass(frozen=True)
class ShardPlacement:
    """Where a study's shards run, as ``--dask`` and ``--workers`` ask."""

    dask: str | None
    workers: int

    def runner(self) -> AbstractContextManager[ShardRunner]:
        return study_runner(self.dask, self.workers)


def register_study(eval_app: typer.Typer, name: str, study: Callable[..., None], workers: int = 1) -> None:
    """Registers ``cellpilot eval NAME``: the study function's own options, then ``--workers``
    (default ``workers``) and ``--dask``; the function is given them as ``placement``."""
    options = (shared_option("workers", WorkersOption, workers), shared_option("dask", DaskOption, None))

    def run(bound: Callable[..., None], workers: int, dask: str | None) -> None:
        bound(placement=ShardPlacement(dask, workers))

    register_with_options(eval_app, name, study, options, run, supplied=("placement",))


@contextmanager
def study_runner(dask: str | None, workers: int) -> Iterator[ShardRunner]:
    """The runner the options ask for (a cluster is shut down, or disconnected from, on exit)."""
    if workers < 1:
        raise typer.BadParameter("--workers must be >= 1", param_hint="--workers")
    if dask is None and workers == 1:
        yield IN_PROCESS
        return
    address = LOCAL if dask is None or dask.strip() in ("", LOCAL) else dask.strip()
    if address != LOCAL and "://" not in address and ":" not in address:
        raise typer.BadParameter(
            f"{address!r} is not a scheduler address (tcp://HOST:PORT)", param_hint="--dask"
        )
    cluster = dask_runner(address, max(workers, 2) if dask is not None else workers)
    try:
        runner = cluster.__enter__()
    except OSError as error:
        raise typer.BadParameter(str(error), param_hint="--dask") from error
    try:
        yield runner
    except BaseException as error:
        if not cluster.__exit__(type(error), error, error.__traceback__):
            raise
    else:
        cluster.__exit__(None, None, None)
