"""What the API commands share: service addresses, the client, JSON output, error messages
(the words for API messages are :mod:`cellpilot.client.wording`, shared with the dashboard),
tables (:func:`print_table`, the one way a command prints rows), and the options every command
of a kind takes (:func:`register_with_options`).

Addresses default to the stack's agreed ports (Borgmaster 7100-7102, Monitoring 7300-7301,
Autopilot 7400-7401) and can be set per command (``--borgmaster``, ``--autopilot``) or
through ``CELLPILOT_CLI_BORGMASTER`` / ``CELLPILOT_CLI_AUTOPILOT`` (comma-separated).

Calls go over mTLS with the stack's ``client`` certificate (``CELLPILOT_CERTS_DIR``, read from
the stack's ``stack.env`` like every service) and say who the user is with a bearer token:
``cellpilot --token TOKEN ...`` or ``CELLPILOT_TOKEN`` (``cellpilot certs token --user NAME``).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

import typer
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console
from rich.errors import MarkupError
from rich.table import Table
from rich.text import Text

from cellpilot.client import CellpilotError, RetryPolicy, SyncCellpilotClient
from cellpilot.client import errors as refusals
from cellpilot.security.tls import SecurityConfigError, SecuritySettings

DEFAULT_BORGMASTER = "127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102"
DEFAULT_AUTOPILOT = "127.0.0.1:7400,127.0.0.1:7401"
DEFAULT_MONITORING = "127.0.0.1:7300,127.0.0.1:7301"

T = TypeVar("T")

console = Console()
errors = Console(stderr=True)

BorgmasterOption = Annotated[
    str,
    typer.Option(
        "--borgmaster",
        envvar="CELLPILOT_CLI_BORGMASTER",
        help="Borgmaster replicas, host:port[,host:port...]; the master is found automatically.",
    ),
]
AutopilotOption = Annotated[
    str,
    typer.Option(
        "--autopilot", envvar="CELLPILOT_CLI_AUTOPILOT", help="Autopilot replicas, host:port[,...]."
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON.")]
OUTPUT_FORMATS = ("wide", "json")
OutputOption = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        help="wide: every column of a table, however wide the lines; json: as --json.",
        show_default=False,
    ),
]
TimeoutOption = Annotated[
    float, typer.Option("--timeout", min=0.5, help="Seconds to keep trying unreachable replicas.")
]


TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="CELLPILOT_TOKEN",
        help="Your bearer token (`cellpilot certs token --user NAME`).",
        show_default=False,
    ),
]
_token: dict[str, str | None] = {"value": None}


def use_token(token: TokenOption = None) -> None:
    """The ``cellpilot`` callback: remember ``--token`` for the API commands of this run."""
    _token["value"] = token


def current_token() -> str | None:
    """The user's bearer token: ``--token``, else ``CELLPILOT_TOKEN`` (or the stack's env file)."""
    return _token["value"] or SecuritySettings.load().token


def client_security() -> dict[str, Any]:
    """Credentials and token for the client (``CellpilotClient(**client_security())``)."""
    try:
        security = SecuritySettings.load()
        options = security.client_options()
    except SecurityConfigError as error:
        errors.print(f"[red]error:[/red] {error}", highlight=False)
        raise typer.Exit(1) from error
    options["token"] = _token["value"] or options["token"]
    return options


def addresses(value: str) -> list[str]:
    found = [a.strip() for a in value.split(",") if a.strip()]
    if not found:
        raise typer.BadParameter("give at least one host:port")
    for address in found:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise typer.BadParameter(f"{address!r} is not host:port")
    return found


@contextmanager
def connect(
    borgmaster: str = DEFAULT_BORGMASTER,
    autopilot: str = DEFAULT_AUTOPILOT,
    monitoring: str = DEFAULT_MONITORING,
    timeout_s: float = 10.0,
) -> Iterator[SyncCellpilotClient]:
    """A blocking client; gRPC failures inside the block become a one-line message and exit 1."""
    policy = RetryPolicy(budget_s=timeout_s, call_timeout_s=min(10.0, timeout_s), max_backoff_s=1.0)
    client = SyncCellpilotClient(
        addresses(borgmaster), addresses(autopilot), addresses(monitoring), policy=policy, **client_security()
    )
    try:
        with api_errors():
            yield client
    finally:
        client.close()


# What each kind of refusal means to a person, in the order they are tried: {method} is
# " (Service/Method)" when known, {details} the server's message.
_ERROR_WORDS: tuple[tuple[type[CellpilotError], str], ...] = (
    (refusals.RequestTooLargeError, "request too large{method}: {details}"),
    (refusals.InvalidArgumentError, "the request was refused as invalid{method}: {details}"),
    (refusals.NotFoundError, "not found{method}: {details}"),
    (refusals.QuotaExceededError, "over quota{method}: {details} (see `cellpilot cell quota`)"),
    (refusals.AlreadyExistsError, "already exists{method}: {details}"),
    (refusals.ConflictError, "conflict{method}: {details}"),
    (
        refusals.UnauthenticatedError,
        "not authenticated{method}: {details}. Pass --token or set CELLPILOT_TOKEN "
        "(`cellpilot certs token --user NAME`).",
    ),
    (refusals.PermissionDeniedError, "permission denied{method}: {details}"),
)


def describe_error(error: CellpilotError) -> str:
    """One line a person can act on, from a client exception."""
    method = f" ({error.method})" if error.method else ""
    if isinstance(error, refusals.UnavailableError):
        if error.reason:  # it answered, but cannot take the call now
            return f"the service is unavailable for now{method}: {error.details}. Try again shortly."
        return (
            f"cannot reach the service{method}: {error.details}. Is it running? "
            "Start everything with `cellpilot run`, or pass the address with --borgmaster/--autopilot."
        )
    for kind, words in _ERROR_WORDS:
        if isinstance(error, kind):
            return words.format(method=method, details=error.details)
    return f"{error.code.name.lower()}{method}: {error.details}"


@contextmanager
def api_errors() -> Iterator[None]:
    try:
        yield
    except CellpilotError as error:
        errors.print(f"[red]error:[/red] {describe_error(error)}", highlight=False)
        raise typer.Exit(1) from error


def message_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def print_json(value: Any) -> None:
    if isinstance(value, Message):
        value = message_dict(value)
    elif isinstance(value, list):
        value = [message_dict(v) if isinstance(v, Message) else v for v in value]
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


def print_answer(answer: T, as_json: bool, show: Callable[[T], None]) -> None:
    """The API's answer as JSON (``--json``), else as ``show`` writes it for a person."""
    if as_json:
        print_json(answer)
    else:
        show(answer)


_tables = {"wide": False}


def use_output(output: str, as_json: bool = False) -> bool:
    """Take ``-o``/``--output`` (``wide`` or ``json``): remember whether tables show every column;
    returns whether the answer is printed as JSON."""
    if output and output not in OUTPUT_FORMATS:
        raise typer.BadParameter(f"{output!r}; one of {', '.join(OUTPUT_FORMATS)}", param_hint="--output")
    _tables["wide"] = output == "wide"
    return as_json or output == "json"


@dataclass(frozen=True)
class BorgmasterQuery(Generic[T]):
    """What a Borgmaster command asks (``call``) and how it prints the answer without ``--json``."""

    call: Callable[[SyncCellpilotClient], T]
    show: Callable[[T], None]


def shared_option(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    """An option several commands take, added to each by :func:`register_with_options`."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def register_with_options(
    app: typer.Typer,
    name: str | None,
    query: Callable[..., Any],
    options: Sequence[inspect.Parameter],
    run: Callable[..., None],
    supplied: Collection[str] = (),
) -> None:
    """Registers the command ``name`` (default: the query's name): the query function's own
    arguments and options, then the shared ``options``. It runs ``run(bound, **options)``, ``bound``
    being the query function given the command line's own arguments; its ``supplied`` keyword
    arguments are not on the command line, ``run`` gives them."""

    def command(**given: Any) -> None:
        shared = {option.name: given.pop(option.name) for option in options}
        run(functools.partial(query, **given), **shared)

    parameters = inspect.signature(query, eval_str=True).parameters.values()
    own = [parameter for parameter in parameters if parameter.name not in supplied]
    command.__signature__ = inspect.Signature([*own, *options])  # type: ignore[attr-defined]
    command.__name__, command.__doc__ = query.__name__, query.__doc__
    app.command(name)(command)


QueryFunction = Callable[..., BorgmasterQuery[Any]]


def borgmaster_command(
    app: typer.Typer, name: str | None = None, timeout_s: float = 10.0
) -> Callable[[QueryFunction], QueryFunction]:
    """Registers a command that asks the Borgmaster once and prints its answer (text or ``--json``).

    The decorated function takes the command's own arguments and options and returns its query;
    the command takes ``--borgmaster``, ``--json`` and ``--timeout`` (default ``timeout_s``) after them.
    """
    options = [
        shared_option("borgmaster", BorgmasterOption, DEFAULT_BORGMASTER),
        shared_option("as_json", JsonOption, False),
        shared_option("output", OutputOption, ""),
        shared_option("timeout", TimeoutOption, timeout_s),
    ]

    def run(
        bound: Callable[[], BorgmasterQuery[Any]], borgmaster: str, as_json: bool, output: str, timeout: float
    ) -> None:
        as_json = use_output(output, as_json)
        asked = bound()
        with connect(borgmaster, timeout_s=timeout) as client:
            answer = asked.call(client)
        print_answer(answer, as_json, asked.show)

    def register(query: QueryFunction) -> QueryFunction:
        register_with_options(app, name, query, options, run)
        return query

    return register


@dataclass(frozen=True)
class Column:
    """A table's column: its header and how one row's cell is written. An ``identifier`` names
    the row (a job, a task, a machine) and is never cut; when a table is wider than the terminal
    (80 columns when piped), the other columns give way, the last listed first (kubectl's habit):
    left out while more than one of them remains, then folded. A ``prose`` column (an
    explanation, a detail) is kept, folded, while :data:`PROSE_WIDTH` of it fits. ``-o wide``
    shows every column whole."""

    header: str
    cell: Callable[[Any], str]
    identifier: bool = False
    prose: bool = False


PROSE_WIDTH = 20  # the narrowest a prose column is folded to before it is left out


def _cell_len(markup: str) -> int:
    try:
        return Text.from_markup(markup).cell_len
    except MarkupError:
        return Text(markup).cell_len


def _table_width(widths: Sequence[int]) -> int:
    """The width of a table whose columns are ``widths`` wide (a cell's padding, and the rules)."""
    return sum(widths) + 3 * len(widths) + 1


def print_table(title: str | None, columns: Sequence[Column], rows: Iterable[Any]) -> None:
    """One table row per item, its cells written by the columns' functions, fitted to the
    terminal as :class:`Column` says (all of it with ``-o wide``)."""
    cells = [[column.cell(row) for column in columns] for row in rows]
    widths = [
        max([_cell_len(column.header), *(_cell_len(line[i]) for line in cells)])
        for i, column in enumerate(columns)
    ]
    fitted = [
        min(widths[i], max(_cell_len(column.header), PROSE_WIDTH)) if column.prose else widths[i]
        for i, column in enumerate(columns)
    ]
    shown = list(range(len(columns)))
    wide, room = _tables["wide"], console.width
    for i in reversed(range(len(columns))):
        others = [j for j in shown if not columns[j].identifier]
        if wide or _table_width([fitted[j] for j in shown]) <= room:
            break
        if not columns[i].identifier and len(others) > 1:
            shown.remove(i)
    hidden = [columns[i].header or f"column {i + 1}" for i in range(len(columns)) if i not in shown]
    caption = f"-o wide adds {', '.join(hidden)}" if hidden else None
    table = Table(title=title, caption=caption, caption_justify="left")
    least = []  # what each shown column needs: an identifier (any column with -o wide) all of its
    for i in shown:  # width, another that of its header (its cells fold)
        column = columns[i]
        fixed = column.identifier or wide
        least.append(widths[i] if fixed else _cell_len(column.header))
        table.add_column(column.header, no_wrap=fixed, min_width=least[-1], overflow="fold")
    for line in cells:
        table.add_row(*(line[i] for i in shown))
    # What cannot fold keeps its width, past the terminal's if need be.
    _console_at_least(_table_width(least)).print(table)


def _console_at_least(width: int) -> Console:
    """The CLI's console, or one like it as wide as ``width`` (a console never prints wider)."""
    if width <= console.width:
        return console
    colours: Any = console.color_system  # its name, one of those the constructor takes
    return Console(file=console.file, width=width, force_terminal=console.is_terminal, color_system=colours)


def state_filter(names: list[str] | None, states: Mapping[str, int], option: str = "--state") -> list[int]:
    """The wire values of the states named on the command line; an unknown name is refused."""
    values = []
    for name in names or []:
        if name not in states:
            raise typer.BadParameter(f"{name!r}; one of {', '.join(states)}", param_hint=option)
        values.append(states[name])
    return values
