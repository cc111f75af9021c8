"""Start, check and stop an embedded stack (``cellpilot stack up|down|status``).

Each process runs in its own session (so a Ctrl-C in the shell that started it does not
reach it) with its output in ``DATA_DIR/logs/NAME.log``; the pids, ports and endpoints
live in ``DATA_DIR/stack.json`` and the connection settings in ``DATA_DIR/stack.env``
(with ``CELLPILOT_CERTS_DIR``: ``up`` issues the stack's CA, service certificates, token
secret and store passwords in ``DATA_DIR/certs`` once, so every service and client of the
stack uses mTLS, and every service reaches PostgreSQL and Redis as its own account).
``down`` stops every process it started, waits for each to exit and for its port to be
released, so no orphan is left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from cellpilot.platform.kafka import ensure_topic_layout, ensure_topics
from cellpilot.platform.launch_as import start_as
from cellpilot.platform.postgres import apply_migrations, ensure_database
from cellpilot.platform.redis_client import ping_redis
from cellpilot.platform.store_accounts import provision_postgres_roles, write_redis_acl
from cellpilot.security.store_secrets import read_store_password
from cellpilot.security.tls import ensure_stack_credentials
from cellpilot.stack import components
from cellpilot.stack.broker_users import create_broker_users, refused_logins
from cellpilot.stack.components import Component
from cellpilot.stack.config import StackConfig, StackEndpoints, port_in_use
from cellpilot.stack.kafka_access import BROKER_USERS
from cellpilot.stack.processes import ProcessHandle, StopRequest, listens, stop_processes
from cellpilot.stack.service_accounts import protect_credentials
from cellpilot.stack.services import SERVICES
from cellpilot.stack.supervision_state import write_json_atomically

START_TIMEOUT_S = 60.0
# A component gets this long to stop cleanly before SIGKILL (PostgreSQL's fast shutdown, Redis
# flushing its append-only file and the broker take well under a second).
STOP_GRACE_S = 5.0
PORT_RELEASE_TIMEOUT_S = 5.0
USER_ATTEMPTS = 3  # creations of the durable broker's users before the stack gives up


class StackError(RuntimeError):
    """The stack could not be brought to the requested state; the message says why."""


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    port: int
    listening: bool


def _log_tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return "\n--- last lines of " + str(log) + " ---\n" + "\n".join(log.read_text().splitlines()[-15:])


def _wait_until(
    check: Callable[[], bool],
    timeout_s: float,
    what: str,
    log: Path | None = None,
    process: ProcessHandle | None = None,
) -> None:
    """Poll ``check`` until true; fail at the timeout, or at once if ``process`` exits meanwhile."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as error:  # the check talks to a server that may still be starting
            last_error = error
        ended = process.poll() if process is not None else None
        if ended is not None:
            raise StackError(f"the process ended ({ended.describe()}) waiting for {what}{_log_tail(log)}")
        time.sleep(0.2)
    raise StackError(
        f"timed out after {timeout_s:.0f} s waiting for {what} (last error: {last_error}){_log_tail(log)}"
    )


class Stack:
    """One embedded stack, identified by its data directory."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config.with_ports_resolved()
        # The component processes this object started (reaped through their handles).
        self._handles: dict[str, ProcessHandle] = {}

    # -- the state file -------------------------------------------------------------------------
    def _read_state(self) -> dict[str, object]:
        if not self.config.state_path.exists():
            return {}
        state: dict[str, object] = json.loads(self.config.state_path.read_text())
        return state

    def _pids(self) -> dict[str, int]:
        pids = self._read_state().get("pids", {})
        assert isinstance(pids, dict)
        return {str(k): int(v) for k, v in pids.items()}

    def _write_state(self, pids: dict[str, int]) -> None:
        c = self.config
        state = {
            "ports": {
                "kafka_port": c.kafka_port,
                "postgres_port": c.postgres_port,
                "redis_port": c.redis_port,
            },
            "pids": pids,
            "broker": c.broker,
            "endpoints": c.endpoints().as_dict(),
        }
        write_json_atomically(c.state_path, state)

    @property
    def endpoints(self) -> StackEndpoints:
        return self.config.endpoints()

    def components(self) -> list[Component]:
        """Every component in start order (stopped in the reverse order)."""
        return [
            components.postgres(self.config),
            components.redis(self.config),
            components.broker(self.config),
        ]

    def component(self, name: str) -> Component:
        return next(component for component in self.components() if component.name == name)

    def handle(self, name: str) -> ProcessHandle | None:
        """The component's process: the one started here, else the one the state file names."""
        if name in self._handles:
            return self._handles[name]
        pid = self._pids().get(name)
        return ProcessHandle(pid) if pid is not None and self._alive(name, pid) else None

    # -- up -------------------------------------------------------------------------------------
    def up(self, progress: Callable[[str], None] = lambda _: None) -> StackEndpoints:
        """Start whatever is not running, wait until healthy, create topics, migrate the database."""
        c = self.config
        (c.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        (c.data_dir / "redis").mkdir(parents=True, exist_ok=True)
        pids = {name: pid for name, pid in self._pids().items() if self._alive(name, pid)}
        # Check every port before starting anything, so a clash leaves nothing half-started.
        for component in self.components():
            if component.name not in pids and port_in_use(c.host, component.port):
                raise StackError(
                    f"port {component.port} for {component.name} is taken by another process; "
                    f"choose another with --{component.name}-port or another --data-dir"
                )
        # Credentials first: Redis starts with the ACL file made from the store passwords.
        issued = ensure_stack_credentials(c.certs_dir)
        if issued:
            progress(f"certificates: issued {len(issued)} in {c.certs_dir}")
        write_redis_acl(c.certs_dir)
        # Each service's key and password files to its own account (when we are root).
        protect_credentials(c.certs_dir, [spec.name for spec in SERVICES])
        for component in self.components():
            if component.name in pids:
                progress(f"{component.name} already running (pid {pids[component.name]})")
                continue
            self._start(component, pids, progress)
        c.endpoints().write_env_file(c.env_path)
        self._write_state(pids)
        progress("postgres: applying migrations, provisioning the service roles")
        asyncio.run(self._prepare_database())
        progress("kafka: creating topics")
        asyncio.run(ensure_topics(c.endpoints().broker_admin()))
        return c.endpoints()

    def restart_component(self, name: str, progress: Callable[[str], None] = lambda _: None) -> ProcessHandle:
        """Start component ``name`` again after it died; the broker gets its topics back.

        The in-memory broker loses its log, so a restarted one is empty: the topics are created
        again before anyone is told it is back, each with its declared partition count (services
        reconnecting at once may have made the broker create some with its default count: those
        are created again, see ``ensure_topic_layout``). The durable broker comes back with its
        topics and records; the same check then finds nothing to do.
        """
        handle = self._start(self.component(name), self._pids(), progress)
        if name == "kafka":
            progress("kafka: creating topics")
            recreated = asyncio.run(ensure_topic_layout(self.config.endpoints().broker_admin()))
            if recreated:
                progress(f"kafka: created again with their declared partition counts: {', '.join(recreated)}")
        return handle

    def _start(
        self, component: Component, pids: dict[str, int], progress: Callable[[str], None]
    ) -> ProcessHandle:
        """Spawn ``component``, record its pid in ``pids`` and the state file, wait until healthy."""
        if component.name == "redis":
            write_redis_acl(self.config.certs_dir)
        if component.name == "postgres":
            progress("postgres: initialising the data directory")
            components.initialise_postgres(self.config, component.run_as)
        if component.name == "kafka" and self.config.broker == "durable":
            return self._start_durable_broker(component, pids, progress)
        handle = self._spawn(component)
        pids[component.name] = handle.pid
        self._write_state(pids)
        progress(f"{component.name}: started (pid {handle.pid}), waiting until healthy")
        self._wait_healthy(component, handle)
        return handle

    def _start_durable_broker(
        self, component: Component, pids: dict[str, int], progress: Callable[[str], None]
    ) -> ProcessHandle:
        """Create the SCRAM users, start the broker, and log in as each: a user the broker
        refuses is created again (cellpilot.stack.broker_users), up to ``USER_ATTEMPTS`` times."""
        c = self.config
        users_log = c.data_dir / "logs" / "kafka-users.log"
        passwords = {user: read_store_password(c.certs_dir, user) for user in BROKER_USERS}
        users = tuple(passwords)
        for attempt in range(1, USER_ATTEMPTS + 1):
            progress(f"kafka: durable ({c.broker_db}); creating its SCRAM users: {', '.join(users)}")
            create_broker_users(c, users_log, users)
            handle = self._spawn(component)
            pids[component.name] = handle.pid
            self._write_state(pids)
            progress(f"kafka: started (pid {handle.pid}), waiting until healthy")
            self._wait_healthy(component, handle)
            refused = refused_logins(f"{c.host}:{c.kafka_port}", passwords)
            if not refused:
                return handle
            progress(f"kafka: WARNING: refused the logins of {', '.join(refused)} (attempt {attempt})")
            stop_processes([StopRequest("kafka", handle, component.stop_signal, group=False)], STOP_GRACE_S)
            _wait_until(
                lambda: not port_in_use(c.host, c.kafka_port), PORT_RELEASE_TIMEOUT_S, "kafka port release"
            )
            users = tuple(refused)
        raise RuntimeError(
            f"the durable broker refused the logins of {', '.join(users)} after creating them "
            f"{USER_ATTEMPTS} times: see {users_log} and {c.data_dir / 'logs' / 'kafka.log'}"
        )

    def _spawn(self, component: Component) -> ProcessHandle:
        log_path = self.config.data_dir / "logs" / f"{component.name}.log"
        with open(log_path, "ab") as log:
            process = start_as(
                component.argv,
                executable=component.executable,
                env={**os.environ, **component.env},
                uid=component.run_as.uid,
                gid=component.run_as.gid,
                groups=component.run_as.groups(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.config.data_dir,
            )
        handle = ProcessHandle.started(process)
        self._handles[component.name] = handle
        return handle

    def _wait_healthy(self, component: Component, process: ProcessHandle) -> None:
        c = self.config
        log = c.data_dir / "logs" / f"{component.name}.log"
        _wait_until(
            lambda: listens(process.pid, c.host, component.port),
            START_TIMEOUT_S,
            f"{component.name} to listen on its port {component.port}",
            log,
            process,
        )
        if component.name == "redis":
            _wait_until(
                lambda: ping_redis(c.admin_endpoints().redis_url), START_TIMEOUT_S, "redis PING", log, process
            )
        elif component.name == "postgres":
            pg_isready = str(components.postgres_bin_dir() / "pg_isready")
            _wait_until(
                lambda: (
                    subprocess.run(
                        [pg_isready, "-h", c.host, "-p", str(c.postgres_port)], capture_output=True
                    ).returncode
                    == 0
                ),
                START_TIMEOUT_S,
                "postgres to accept connections",
                log,
                process,
            )

    @property
    def admin_endpoints(self) -> StackEndpoints:
        """The administrator's connections (StackConfig.admin_endpoints): the stack's own use and tests."""
        return self.config.admin_endpoints()

    async def _prepare_database(self) -> None:
        admin_url = self.admin_endpoints.postgres_url
        await ensure_database(admin_url)
        await apply_migrations(admin_url)
        await provision_postgres_roles(admin_url, self.config.certs_dir)

    # -- status and down ------------------------------------------------------------------------
    def _alive(self, name: str, pid: int) -> bool:
        """True if ``pid`` is still our component (not a recycled pid of another program)."""
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
            expected = {"kafka": "tansu", "postgres": "postgres", "redis": "redis-server"}[name]
            return any(expected in part for part in process.cmdline()[:1])
        except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError):
            return False

    def status(self) -> list[ComponentStatus]:
        pids = self._pids()
        result = []
        for component in self.components():
            pid = pids.get(component.name)
            result.append(
                ComponentStatus(
                    name=component.name,
                    pid=pid,
                    running=pid is not None and self._alive(component.name, pid),
                    port=component.port,
                    listening=port_in_use(self.config.host, component.port),
                )
            )
        return result

    def down(self, progress: Callable[[str], None] = lambda _: None, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every component at once: its clean-stop signal, SIGKILL to its process group after
        ``grace_s``; then wait for the ports to be released. The components do not depend on one
        another while stopping (the services, their only clients, are stopped before), so one slow
        component does not add its grace period to the others'."""
        stopped = []
        requests = []
        for component in reversed(self.components()):
            handle = self.handle(component.name)
            if handle is None or handle.poll() is not None:
                continue
            progress(f"{component.name}: stopping (pid {handle.pid})")
            # The clean-stop signal goes to the server alone: PostgreSQL's postmaster shuts its
            # backends down itself.
            requests.append(StopRequest(component.name, handle, component.stop_signal, group=False))
            stopped.append(component)
        stop_processes(requests, grace_s, progress)
        for component in stopped:
            _wait_until(
                lambda port=component.port: not port_in_use(self.config.host, port),  # type: ignore[misc]
                PORT_RELEASE_TIMEOUT_S,
                f"port {component.port} ({component.name}) to be released",
            )
        self._write_state({})
        progress("stack stopped")
