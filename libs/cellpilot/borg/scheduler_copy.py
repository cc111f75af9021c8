"""The scheduler's cached copy of the cell and what it does with it (Borg §3.4).

"A scheduler replica operates on a cached copy of the cell state. It repeatedly: retrieves
state changes from the elected master (including both assigned and pending work); updates its
local copy; does a scheduling pass to assign tasks; and informs the elected master of those
assignments." A :class:`SchedulerCopy` is that copy: it follows the checkpoint log like a
standby (:class:`CellCopy`), takes the master's soft state (reservations, CPU moments, the
cell's event time: :mod:`cellpilot.borg.soft_feed`), turns a pass into a
:class:`PlacementProposal` stamped with its log position and the master's epoch, and after the
master's verdict puts back what the master did not take (:meth:`SchedulerCopy.reconcile`).

Lifetime-aware placement (LAVA §4.2-4.3) lives here too: before a pass the tracker follows the
copy and predicts the pending jobs; the LAVA host states a pass (or the lifetime timer:
repredictions and deadlines) changes travel with the proposal.
"""

from __future__ import annotations

from collections.abc import Collection

from cellpilot.borg.cell_copy import CellCopy
from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.borg.mutations import LavaHost, LavaHostsChanged, TaskScheduled, TaskStateChanged
from cellpilot.borg.proposals import PlacementProposal, proposed_placements
from cellpilot.borg.records import TaskKey
from cellpilot.borg.scheduling_view import Plan, SchedulingView
from cellpilot.borg.soft_feed import TaskSoftState
from cellpilot.schedule.lifetime_aware.lava import EMPTY


class SchedulerCopy(CellCopy):
    def __init__(
        self,
        scheduler_id: str,
        view: SchedulingView,
        lifetimes: LifetimeTracker | None = None,
        keeps_lava_host_states: bool = False,
    ) -> None:
        super().__init__(view)
        self.scheduler_id = scheduler_id
        self.lifetimes = lifetimes or LifetimeTracker()
        self.keeps_lava_host_states = keeps_lava_host_states
        self.soft_epoch = 0  # the master whose feed the copy took, and up to which version
        self.soft_version = 0
        self.soft_generation = -1  # the view's rebuild the feed was taken into
        self.cell_event_ms = 0  # the cell's event time, as the master last said

    # ------------------------------------------------------------------ the master's soft state
    def feed_since(self, epoch: int) -> int:
        """The feed version to ask the master of ``epoch`` for (0: everything anew)."""
        fresh = epoch == self.soft_epoch and self.view.generation == self.soft_generation
        return self.soft_version if fresh and not self.view.stale else 0

    def take_soft(self, epoch: int, version: int, event_time_ms: int, entries: list[TaskSoftState]) -> None:
        if self.view.stale:
            self.view.rebuild(self.state)
        self.view.take_soft(entries)
        self.soft_epoch, self.soft_version, self.soft_generation = epoch, version, self.view.generation
        self.cell_event_ms = max(self.cell_event_ms, event_time_ms)

    def event_now_ms(self, wall_ms: int) -> int:
        return max(wall_ms, self.cell_event_ms)

    # ------------------------------------------------------------------ passes
    def plan(
        self, wall_ms: int, epoch: int, max_tasks: int, in_flight: Collection[TaskKey] = ()
    ) -> tuple[PlacementProposal | None, Plan]:
        """One pass over the pending queue on this copy, as a proposal to the master of ``epoch``
        (None when it placed nothing and changed no LAVA host). The placements stay bound in the
        copy until the verdict says otherwise; ``in_flight``, the tasks a proposal the master has
        not answered yet placed, are not placed again."""
        now = self.event_now_ms(wall_ms)
        self._follow_lifetimes(now)
        self.lifetimes.expect_pending(self.state, self.view.cell, now)
        plan = self.view.plan(self.state, now, max_tasks, now, skip=in_flight)
        self._follow_lifetimes(now)
        hosts = self._host_changes()
        return self._proposal(epoch, plan, hosts), plan

    def lifetimes_tick(self, wall_ms: int, epoch: int) -> PlacementProposal | None:
        """Repredicts the running tasks at their uptime (LAVA §3) and moves hosts past their
        deadline one class up (§4.3): the host states that changed, as a proposal."""
        now = self.event_now_ms(wall_ms)
        self._follow_lifetimes(now)
        self.lifetimes.repredict(self.state, now / 1000.0)
        self.lifetimes.advance(now / 1000.0)
        hosts = self._host_changes()
        return None if hosts is None else self._proposal(epoch, Plan((), 0, 0, 0, frozenset()), hosts)

    @staticmethod
    def placed_by(plan: Plan) -> tuple[TaskKey, ...]:
        """The tasks ``plan`` placed or preempted, in its order: what a proposal of it has in flight."""
        moved = (m for m in plan.mutations if isinstance(m, TaskScheduled | TaskStateChanged))
        keys = ((m.job_id, m.task_index) for m in moved)
        return tuple(dict.fromkeys(keys))

    def reconcile(self, plan: Plan) -> None:
        """After the verdict (and the log up to it is applied): the copy's bindings of every task
        the pass placed or preempted match the state again."""
        self.view.reconcile(self.state, self.placed_by(plan))

    # ------------------------------------------------------------------ internals
    def _follow_lifetimes(self, now_ms: int) -> None:
        if self.view.stale:
            self.view.rebuild(self.state)
        self.lifetimes.sync(self.state, self.view.cell, now_ms / 1000.0)

    def _host_changes(self) -> LavaHostsChanged | None:
        if self.keeps_lava_host_states:
            return self.lifetimes.changes(self.state)
        if self.state.lava_hosts:  # left by an earlier LAVA policy: no policy keeps them now
            return LavaHostsChanged(tuple(LavaHost(m, EMPTY, -1) for m in sorted(self.state.lava_hosts)))
        return None

    def _proposal(self, epoch: int, plan: Plan, hosts: LavaHostsChanged | None) -> PlacementProposal | None:
        versions = {
            m.job_id: self.state.jobs[m.job_id].spec_version
            for m in plan.mutations
            if isinstance(m, TaskScheduled | TaskStateChanged)
        }
        placements = proposed_placements(plan.mutations, versions)
        if not placements and hosts is None:
            return None
        return PlacementProposal(self.scheduler_id, epoch, self.state.last_sequence, placements, hosts)
