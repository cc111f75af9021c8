"""LAS / LAVA in the live cell: predictions, LAVA's host states and their log records.

The scheduling view's cell is the pool LAVA's state machine (:class:`LavaHosts`, §4.3) runs on;
:class:`LifetimeTracker` keeps it in step with the cell and is what the profile's LAS and LAVA
scorers read (:class:`~cellpilot.schedule.lifetime_aware.borg_scorers.LifetimeSource`):

* the model is the one recorded in the state (:class:`LifetimeModelTrained`); without one the
  tracker is idle, the scorers score every machine alike and no host state is kept;
* :meth:`sync` follows the cell: a task that left its machine is ``removed`` from LAVA's
  states, a task newly running is predicted at its uptime and ``placed`` (§4.3), in task order;
* :meth:`expect_pending` predicts the pending jobs' lifetimes at uptime 0 before a pass;
* :meth:`repredict` re-runs the model for every running task at its current uptime (§3:
  repredictions correct the mispredictions of earlier ones; LAS §4.2 scores with them) and
  :meth:`advance` moves hosts past their deadline one class up (§4.3, Figure 5c);
* :meth:`changes` is the :class:`LavaHostsChanged` record of what differs from the state.

The host states are data in the Borgmaster's state (written to the checkpoint log), so a new
master, or this one after its copy of the cell was rebuilt, loads them (:meth:`sync` on a new
cell) instead of recomputing them; predictions are not logged: the model and the tasks'
uptimes give them back.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cellpilot.array_types import FloatArray, IntpArray
from cellpilot.borg.cell_state import CellState, TaskKey
from cellpilot.borg.lifecycle import TaskState
from cellpilot.borg.mutations import LavaHost, LavaHostsChanged, LifetimeModelTrained
from cellpilot.borg.task_lifetimes import TaskLifetime, predict
from cellpilot.lifetimes.distribution_model import DistributionModel
from cellpilot.schedule import Cell
from cellpilot.schedule.lifetime_aware.borg_scorers import CellLifetimes
from cellpilot.schedule.lifetime_aware.lava import EMPTY, RANK_EMPTY


def _task_id(key: TaskKey) -> str:
    return f"{key[0]}/{key[1]}"


class LifetimeTracker:
    """Predicted lifetimes of a cell's tasks and LAVA's host states, over one :class:`Cell`."""

    def __init__(self) -> None:
        self.model: DistributionModel | None = None
        self.model_record: LifetimeModelTrained | None = None
        self.lifetimes: CellLifetimes | None = None
        self.predicted: dict[TaskKey, TaskLifetime] = {}
        self._known: dict[TaskKey, tuple[int, int]] = {}  # running task -> (handle, machine)
        self._cell: Cell | None = None
        self._cell_uid = -1
        self._machines = 0
        self._pending: dict[int, float] = {}
        self._pending_class: dict[int, int] = {}

    # ------------------------------------------------------------- LifetimeSource
    @property
    def job_remaining(self) -> Mapping[int, float]:
        return self.lifetimes.job_remaining if self.lifetimes is not None else self._pending

    @property
    def job_class(self) -> Mapping[int, int]:
        return self.lifetimes.job_class if self.lifetimes is not None else self._pending_class

    @property
    def now(self) -> float:
        return self.lifetimes.now if self.lifetimes is not None else 0.0

    def machine_exit(self, machines: IntpArray) -> FloatArray:
        if self.lifetimes is None:
            return np.zeros(machines.shape[0])
        return self.lifetimes.machine_exit(machines)

    def ranks(self, vm_class: int, machines: IntpArray) -> IntpArray:
        if self.lifetimes is None:
            return np.full(machines.shape[0], RANK_EMPTY, dtype=np.int64)
        return self.lifetimes.ranks(vm_class, machines)

    # ------------------------------------------------------------- following the cell
    @property
    def active(self) -> bool:
        return self.model is not None and self.lifetimes is not None

    def sync(self, state: CellState, cell: Cell, now: float) -> None:
        """Brings the model, the host states and the tracked tasks up to ``state`` and ``cell``."""
        if self._refresh_model(state):
            self._cell = None
        if self.model is None:
            self.lifetimes, self._known, self.predicted = None, {}, {}
            return
        if cell is not self._cell or cell.uid != self._cell_uid or cell.n_machines != self._machines:
            self._load(state, cell, now)
        assert self.lifetimes is not None
        self.lifetimes.now = now
        running = self._running(cell)
        for key, (handle, machine) in list(self._known.items()):
            if running.get(key) != (handle, machine):
                del self._known[key]
                self.predicted.pop(key, None)
                self.lifetimes.ended(handle, machine, now)
        new = sorted(key for key in running if key not in self._known)
        for key, lifetime in zip(new, self._predict(state, new, now), strict=True):
            handle, _ = running[key]
            self._known[key] = running[key]
            self.predicted[key] = lifetime
            self.lifetimes.started(handle, lifetime.remaining_s, now, lifetime.lifetime_class)

    def _refresh_model(self, state: CellState) -> bool:
        """Loads the state's model if it changed; True if it did."""
        if state.lifetime_model is self.model_record:
            return False
        self.model_record = state.lifetime_model
        self.model = None
        if self.model_record is not None:
            try:
                self.model = DistributionModel.from_json(self.model_record.model_json)
            except ValueError:
                # A model of another format (the earlier point model) or other features/bins:
                # idle, as without a model, until the cell trains again.
                self.model = None
        return True

    def _running(self, cell: Cell) -> dict[TaskKey, tuple[int, int]]:
        out: dict[TaskKey, tuple[int, int]] = {}
        for machine, handles in enumerate(cell.machine_tasks[: cell.n_machines]):
            for handle in handles:
                spec = cell.spec(handle)
                if not spec.shape.is_alloc:
                    out[(spec.job, spec.index)] = (handle, machine)
        return out

    def _load(self, state: CellState, cell: Cell, now: float) -> None:
        """LAVA's states from the state's records, predictions for every running task."""
        self._cell, self._cell_uid, self._machines = cell, cell.uid, cell.n_machines
        lifetimes = self.lifetimes = CellLifetimes(cell)
        lifetimes.now = now
        hosts = lifetimes.hosts
        for machine_id, record in state.lava_hosts.items():
            machine = cell.machine_index.get(machine_id)
            if machine is None:
                continue
            hosts.state[machine] = record.state
            hosts.host_class[machine] = record.lifetime_class
            hosts.deadline[machine] = record.deadline_ms / 1000.0 if record.deadline_ms else np.inf
            for key in record.residual:
                handle = cell.task_handle.get(_task_id(key))
                if handle is not None and int(cell.t_machine[handle]) == machine:
                    hosts.residual_on[handle] = machine
                    hosts.residuals[machine] += 1
        running = self._running(cell)
        keys = sorted(running)
        self._known = dict(running)
        self.predicted = dict(zip(keys, self._predict(state, keys, now), strict=True))
        for key in keys:
            handle, machine = running[key]
            lifetimes.set_exit(handle, machine, now + self.predicted[key].remaining_s)
        for machine in range(cell.n_machines):  # a host whose tasks all left meanwhile
            if hosts.state[machine] != EMPTY and not cell.machine_tasks[machine]:
                hosts.removed(machine, -1, now)

    def _predict(self, state: CellState, keys: list[TaskKey], now: float) -> list[TaskLifetime]:
        assert self.model is not None
        rows = []
        for job_id, index in keys:
            job = state.jobs[job_id]
            task = job.tasks[index]
            started = task.state_since_ms if task.state is TaskState.RUNNING else round(now * 1000)
            rows.append((job.spec, started, now - started / 1000.0))
        return predict(self.model, rows)

    # ------------------------------------------------------------- timers and passes
    def expect_pending(self, state: CellState, cell: Cell, now_ms: int) -> None:
        """Predicted lifetimes (at uptime 0) of the jobs with tasks waiting to schedule."""
        if self.lifetimes is None or self.model is None:
            return
        jobs = sorted({job.job_id for job, _ in state.schedulable_pending(now_ms)})
        specs = [state.jobs[j].spec for j in jobs]
        lifetimes = predict(self.model, [(spec, now_ms, 0.0) for spec in specs])
        self.lifetimes.forget_pending()
        for job_id, lifetime in zip(jobs, lifetimes, strict=True):
            self.lifetimes.expect(job_id, lifetime.remaining_s, lifetime.lifetime_class)

    def repredict(self, state: CellState, now: float) -> int:
        """Re-runs the model for every running task at its uptime (§3); returns how many."""
        if self.lifetimes is None:
            return 0
        keys = sorted(self._known)
        for key, lifetime in zip(keys, self._predict(state, keys, now), strict=True):
            self.predicted[key] = lifetime
            self.lifetimes.repredicted(self._known[key][0], lifetime.remaining_s, now)
        return len(keys)

    def advance(self, now: float) -> None:
        """Hosts still occupied at their deadline move one class up (§4.3, Figure 5c)."""
        if self.lifetimes is not None:
            self.lifetimes.advance(now)

    # ------------------------------------------------------------- records
    def hosts(self) -> dict[str, LavaHost]:
        """LAVA's current state of every machine that is not empty."""
        if self.lifetimes is None or self._cell is None:
            return {}
        cell, hosts = self._cell, self.lifetimes.hosts
        residual: dict[int, list[TaskKey]] = {}
        for handle, machine in hosts.residual_on.items():
            if cell.t_alive[handle]:
                spec = cell.spec(handle)
                residual.setdefault(machine, []).append((spec.job, spec.index))
        out = {}
        for machine in np.flatnonzero(hosts.state[: hosts.state.shape[0]] != EMPTY).tolist():
            machine_id = cell.machine_names[machine]
            deadline = float(hosts.deadline[machine])
            out[machine_id] = LavaHost(
                machine_id,
                int(hosts.state[machine]),
                int(hosts.host_class[machine]),
                round(deadline * 1000) if np.isfinite(deadline) else 0,
                tuple(sorted(residual.get(machine, ()))),
            )
        return out

    def changes(self, state: CellState) -> LavaHostsChanged | None:
        """The record that brings ``state.lava_hosts`` to the tracker's states (None: equal)."""
        if self.lifetimes is None:
            return None
        current = self.hosts()
        changed = [h for machine_id, h in sorted(current.items()) if state.lava_hosts.get(machine_id) != h]
        changed += [
            LavaHost(machine_id, EMPTY, -1)
            for machine_id in sorted(state.lava_hosts)
            if machine_id not in current
        ]
        return LavaHostsChanged(tuple(changed)) if changed else None

    def lifetime_of(self, state: CellState, key: TaskKey, now: float) -> TaskLifetime | None:
        """A task's predicted lifetime now: running, at its uptime; pending, at uptime 0. The
        same on every replica (the model is in the state; a prediction is a pure function)."""
        if self._refresh_model(state):
            self._cell = None  # the next sync reloads with the new model
        if self.model is None or state.task(key) is None:
            return None
        return self._predict(state, [key], now)[0]
