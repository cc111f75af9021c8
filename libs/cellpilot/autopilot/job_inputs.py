"""What the Autopilot master knows of a job's recommenders between decisions (Autopilot §3.1).

The master "reads every recommender's output" and chooses per job; it keeps the newest output
of each recommender for each resource (a :class:`Candidate`, keyed ``<resource>|<label>``) and
the newest horizontal signal of each source (a :class:`HorizontalInput`, keyed ``builtin`` or
``custom:<name>``). Outputs of one batch are offered one by one (a newer window replaces an
older one); a batch's outputs then replace the stored ones of the same key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from cellpilot.autopilot.decisions import Candidate, HorizontalConfig, HorizontalInput
from cellpilot.job_vocabulary import HorizontalSource
from cellpilot.usage.buckets import Resource

RESOURCES = (Resource.CPU, Resource.MEMORY)


@dataclass
class JobInputs:
    vertical: dict[str, Candidate] = field(default_factory=dict)  # by Candidate.key
    horizontal: dict[str, HorizontalInput] = field(default_factory=dict)  # by HorizontalInput.label

    @classmethod
    def of(cls, vertical: Iterable[Candidate], horizontal: Iterable[HorizontalInput]) -> JobInputs:
        """The newest of each key among ``vertical`` and ``horizontal``."""
        inputs = cls()
        for candidate in vertical:
            inputs.offer_vertical(candidate)
        for signal in horizontal:
            inputs.offer_horizontal(signal)
        return inputs

    def offer_vertical(self, candidate: Candidate) -> None:
        """Keep ``candidate`` unless the one of its key is of a newer window (of two outputs of the
        same window, the later offered wins)."""
        previous = self.vertical.get(candidate.key)
        if previous is None or candidate.window_end_ms >= previous.window_end_ms:
            self.vertical[candidate.key] = candidate

    def offer_horizontal(self, signal: HorizontalInput) -> None:
        previous = self.horizontal.get(signal.label)
        if previous is None or signal.window_end_ms >= previous.window_end_ms:
            self.horizontal[signal.label] = signal

    def updated_with(self, newer: JobInputs) -> JobInputs:
        """These inputs with ``newer``'s (a new batch's) replacing those of the same key."""
        return JobInputs({**self.vertical, **newer.vertical}, {**self.horizontal, **newer.horizontal})

    def __bool__(self) -> bool:
        return bool(self.vertical or self.horizontal)

    @property
    def newest_window_ms(self) -> int:
        """The newest window end among them (0 when there is none)."""
        ends = [c.window_end_ms for c in self.vertical.values()]
        ends += [h.window_end_ms for h in self.horizontal.values()]
        return max([*ends, 0])

    def candidates(self) -> dict[Resource, dict[str, Candidate]]:
        """Per resource, each recommender's candidate by label (what :func:`decide` takes)."""
        out: dict[Resource, dict[str, Candidate]] = {r: {} for r in RESOURCES}
        for candidate in self.vertical.values():
            out[candidate.resource][candidate.ref.label] = candidate
        return out

    def signal(self, config: HorizontalConfig) -> HorizontalInput | None:
        """The input the job's horizontal source reads: the built-in CPU signal, or its
        target-size recommender's (§3.3)."""
        if config.source is HorizontalSource.CPU_UTILIZATION:
            return self.horizontal.get("builtin")
        return self.horizontal.get(f"custom:{config.target_size_recommender}")
