"""Differential lockstep (SPEC 4.5): one workload on two targets, e.g. CPU against CUDA
or NPU, or one backend against another. Each side runs in lockstep with its own model;
on top, the two must agree slot for slot: the slots each step handed out, and at
every census the free lists (in order), the mapping and the sizes.
"""

from __future__ import annotations

from properties import observe
from properties.lockstep import Lockstep, asserts_kill, failure_class
from properties.steps import Step

DIFF = "diff.state"  # the name a disagreement between the two sides is reported under


def _state(ls: Lockstep) -> dict:
    a = ls.alloc
    subs = observe.sub_allocators(a)
    out = {"sizes": observe.sizes(a), "mapping": observe.mapping(a), "full_free": observe.free_pages(subs[0])}
    if len(subs) > 1:
        out["swa_free"] = observe.free_pages(subs[1])
    return out


class Differential:
    """Driven as a Lockstep is (the machine drives it the same way); runs both sides.
    What the machine reads (rows, model, page size, ...) is side a's; both sides hold
    the same requests, which `run` checks after every step."""

    def __init__(self, config: dict, target_a, target_b, side_a: dict, side_b: dict, census_every: int = 16):
        # Where either side is on CUDA, neither sends a break whose guard kills the process.
        kills = any(asserts_kill({**config, **side}.get("device", "cpu")) for side in (side_a, side_b))
        self.a = Lockstep({**config, **side_a}, target_a, census_every=census_every, skip_device_asserts=kills)
        self.b = Lockstep({**config, **side_b}, target_b, census_every=census_every, skip_device_asserts=kills)
        self.sides = (side_a, side_b)
        self.census_every = census_every

    # What the state machine reads to choose its next step: side a's view.
    @property
    def config(self) -> dict:
        return self.a.config

    @property
    def rows(self):
        return self.a.rows

    @property
    def model(self):
        return self.a.model

    @property
    def ghosts(self):
        return self.a.ghosts

    @property
    def labels(self):
        return self.a.labels

    @property
    def shapes(self):
        return self.a.shapes

    @property
    def cache(self):
        return self.a.cache

    @property
    def locks(self):
        return self.a.locks

    @property
    def retracted(self):
        return self.a.retracted

    @property
    def debug(self) -> bool:
        return self.a.debug

    def continuable(self, slots: list[int]) -> bool:
        return self.a.continuable(slots)

    @property
    def ps(self) -> int:
        return self.a.ps

    @property
    def pure(self) -> bool:
        return self.a.pure

    @property
    def ring(self) -> bool:
        return self.a.ring

    @property
    def index(self) -> int:
        return self.a.index

    @property
    def step(self):
        return self.a.step

    @property
    def trace(self):
        return self.a.trace

    def counters(self) -> dict[str, int]:
        return self.a.counters()

    def _fail(self, detail: str) -> None:
        a = self.a
        raise failure_class(DIFF)(DIFF, a.index, a.step, [f"{self.sides[0]} vs {self.sides[1]}: {detail}"], a.config, list(a.trace))

    def run(self, step: Step) -> None:
        self.a.run(step)
        self.b.run(step)
        if self.a.runs_restarted != self.b.runs_restarted:
            restarted = self.a if self.a.runs_restarted > self.b.runs_restarted else self.b
            self._fail(f"only one side's run ended on a call the model cannot follow: {restarted.restarted_because}")
        for rid in set(self.a.rows) | set(self.b.rows):
            ra, rb = self.a.rows.get(rid), self.b.rows.get(rid)
            if (ra and ra.slots) != (rb and rb.slots):
                self._fail(f"request {rid} holds {ra and ra.slots} on one side, {rb and rb.slots} on the other")
        if self.census_every and self.a.index % self.census_every == self.census_every - 1:
            self.compare()

    def compare(self) -> None:
        sa, sb = _state(self.a), _state(self.b)
        for key in sa:
            va, vb = sa[key], sb[key]
            if va == vb:
                continue
            if isinstance(va, list):
                i = next((i for i, (x, y) in enumerate(zip(va, vb)) if x != y), min(len(va), len(vb)))
                at = lambda v: v[i] if i < len(v) else "nothing"  # noqa: E731
                self._fail(
                    f"{key} differs first at index {i}: {at(va)} on one side, {at(vb)} on the other "
                    f"({len(va)} and {len(vb)} entries)"
                )
            self._fail(f"{key} differs: {va} on one side, {vb} on the other")

    def census(self) -> None:
        self.a.census()
        self.b.census()
        self.compare()

    def close(self) -> None:
        """The closing census on both sides, then the slot-for-slot comparison."""
        self.a.close()
        self.b.close()
        self.compare()
