"""The hypothesis state machine that drives a request workload through the lockstep driver.

Rules draw small, shrinkable choices (which live request, how long, which kind of
free) and turn them into workload steps the current state can take; the driver
runs each step on the model and the target and compares. Hypothesis's own stateful
rule selection is swarm testing: each run switches a random subset of rules off.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import event, note, reject
from hypothesis.control import currently_in_test_context
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from properties.differential import Differential
from properties.lockstep import RELEASED, Lockstep, runs_of
from properties.steps import (
    BREAKS, FINISH_HOWS, Admit, AdmitTail, Break, Clear, Decode, DropTail, Evict, Extend,
    Finish, GroupBegin, GroupEnd, MergeSort, Repair, Resize, Step,
)
from properties.targets import Target, resolve

# Every coverage label any run reached, so a test can show each one is reached,
# and the workload steps run in this process, for the closing summaries.
LABELS_SEEN: Counter = Counter()
STATS: Counter = Counter()

# Page size 1 (the token allocators) is as much code as every paged size together.
PAGE_SIZES = (1, 1, 1, 2, 4, 16)


@st.composite
def configs(draw, device: str = "cpu") -> dict:
    """A configuration of SPEC 4.1: small pools that run out, every mode and level."""
    kind = draw(st.sampled_from(("hybrid", "hybrid", "hybrid", "pure_swa")))
    ps = 1 if kind == "pure_swa" else draw(st.sampled_from(PAGE_SIZES))
    pages = draw(st.integers(2, 12))
    swa_pages = pages if kind == "pure_swa" else draw(st.integers(2, 12))
    ring = kind == "hybrid" and ps > 1 and draw(st.integers(0, 4)) == 0
    return {
        "kind": kind,
        "size": pages * ps,
        "size_swa": swa_pages * ps,
        "page_size": ps,
        "device": device,
        "need_sort": draw(st.booleans()),
        "ring_size": draw(st.integers(1, 2 * ps)) if ring else None,
        "req_slots": draw(st.integers(1, 6)) if ring else None,
        "check_level": draw(st.sampled_from(("strict", "warn", "off"))),
    }


class LockstepMachine(RuleBasedStateMachine):
    """Subclassed by `machine_for` with a target and a device."""

    target: Target = staticmethod(resolve("impl"))
    device: str = "cpu"
    census_every: int = 16
    # Differential runs (SPEC 4.5): a second target and what each side's config adds.
    peer: Target | None = None
    sides: tuple[dict, dict] = ({}, {})

    def __init__(self):
        super().__init__()
        self.ls: Lockstep | None = None
        self.next_rid = 0
        self._seen: Counter = Counter()
        self.failed = False

    # ------------------------------------------------------------ helpers
    @property
    def ok(self) -> bool:
        return self.ls is not None

    def _go(self, step: Step) -> None:
        # Outside hypothesis (a benchmark driving the rules by hand) there is no one
        # to tell.
        quiet = not currently_in_test_context()
        if not quiet:
            note(f"step {self.ls.index + 1}: {step!r}")
        STATS["steps"] += 1
        try:
            self.ls.run(step)
        except BaseException:
            self.failed = True
            raise
        finally:
            for label, n in self.ls.labels.items():
                if n > self._seen[label]:
                    if not quiet:
                        event(label)
                    LABELS_SEEN[label] += n - self._seen[label]
                    self._seen[label] = n

    def _pick(self, i: int) -> int:
        rids = sorted(self.ls.rows)
        return rids[i % len(rids)]

    def _new_rid(self) -> int:
        self.next_rid += 1
        return self.next_rid - 1

    def _len(self, raw: int) -> int:
        return 1 + (raw - 1) % (3 * self.ls.ps + 2)

    def _has_rows(self) -> bool:
        return self.ok and bool(self.ls.rows)

    def _paired(self, slot: int) -> bool:
        """Whether a position's slot still holds SWA KV."""
        return slot != RELEASED if self.ls.pure else slot in self.ls.model.peer

    def _runs(self, rid: int, paired: bool) -> list[tuple[int, int]]:
        """Maximal runs [lo, hi) of positions that are (un)paired."""
        return runs_of(self.ls.rows[rid].slots, lambda s: self._paired(s) == paired)

    # --------------------------------------------------------------- init
    @initialize(config=configs(), first=st.lists(st.integers(1, 64), max_size=4))
    def init(self, config, first=()):
        """Build both sides; the server starts with the `first` requests in flight,
        so a run whose swarm switched admission off still has rows to work on."""
        config = dict(config, device=self.device)
        cls = type(self)
        try:
            if cls.peer is None:
                self.ls = Lockstep(config, cls.target, census_every=self.census_every)
            else:
                self.ls = Differential(config, cls.target, cls.peer, *cls.sides, census_every=self.census_every)
        except NotImplementedError as e:
            # SPEC 4.3: skip what the target does not build, and say so in the statistics.
            event(f"configuration not supported by the target: {e}")
            LABELS_SEEN["unsupported configuration"] += 1
            reject()
        if currently_in_test_context():
            event(f"page_size {config['page_size']}, {config['kind']}{', ring' if config['ring_size'] else ''}, level {config['check_level']}")
        for n in first:
            self._go(Admit(((self._new_rid(), self._len(n)),)))

    # -------------------------------------------------------------- rules
    @precondition(lambda self: self.ok)
    @rule(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=3))
    def admit(self, lengths):
        self._go(Admit(tuple((self._new_rid(), self._len(n)) for n in lengths)))

    @precondition(lambda self: self.ok and self.ls.ps > 1 and not self.ls.pure)
    @rule(length=st.integers(1, 64), tail=st.integers(0, 64))
    def admit_tail(self, length, tail):
        n = self._len(length)
        self._go(AdmitTail(self._new_rid(), n, tail % (n + 1)))

    @precondition(_has_rows)
    @rule(picks=st.lists(st.integers(0, 63), min_size=1, max_size=2, unique=True), add=st.integers(1, 64))
    def extend(self, picks, add):
        rids = sorted({self._pick(i) for i in picks})
        self._go(Extend(tuple((r, self._len(add)) for r in rids)))

    @precondition(_has_rows)
    @rule(picks=st.lists(st.integers(0, 63), min_size=1, max_size=4, unique=True))
    def decode(self, picks):
        self._go(Decode(tuple(sorted({self._pick(i) for i in picks}))))

    @precondition(_has_rows)
    @rule(pick=st.integers(0, 63), span=st.integers(1, 64))
    def evict(self, pick, span):
        rid = self._pick(pick)
        runs = self._runs(rid, paired=True)
        if not runs:
            return
        lo, hi = runs[0]
        if self.ls.ps > 1:
            hi = len(self.ls.rows[rid].slots)  # the allocator evicts whole pages anyway
        # Spread over the legal range, not clipped to its end: clipping would make
        # evicting everything the likeliest choice.
        self._go(Evict(rid, lo, lo + 1 + (span - 1) % (hi - lo)))

    @precondition(lambda self: self._has_rows() and not self.ls.pure and not self.ls.ring)
    @rule(pick=st.integers(0, 63), n=st.integers(1, 64), offset=st.integers(0, 15))
    def repair(self, pick, n, offset):
        """A host-cache load-back of evicted positions. What is loaded back was evicted
        first: where the request has nothing evicted yet, its oldest positions are."""
        rid = self._pick(pick)
        ps = self.ls.ps
        if not self._aligned_unpaired(rid):
            L = len(self.ls.rows[rid].slots)
            self._go(Evict(rid, 0, 1 + (n - 1) % L))
        for lo, hi in self._aligned_unpaired(rid):
            self._go(Repair(rid, lo, 1 + (n - 1) % (hi - lo), offset % ps))
            return

    def _aligned_unpaired(self, rid: int) -> list[tuple[int, int]]:
        """Unpaired runs from their first page boundary on: a load-back starts on a full page."""
        ps = self.ls.ps
        runs = [(-(-lo // ps) * ps, hi) for lo, hi in self._runs(rid, paired=False)] if rid in self.ls.rows else []
        return [(lo, hi) for lo, hi in runs if lo < hi]

    @precondition(_has_rows)
    @rule(pick=st.integers(0, 63), how=st.sampled_from(FINISH_HOWS))
    def finish(self, pick, how):
        rid = self._pick(pick)
        if self.ls.ps == 1 and how != "split" and self._runs(rid, paired=False):
            how = "split"  # free of a position with no SWA peer breaks a contract at page 1
        self._go(Finish(rid, how))

    @precondition(_has_rows)
    @rule(pick=st.integers(0, 63), keep=st.integers(0, 64))
    def drop_tail(self, pick, keep):
        rid = self._pick(pick)
        L, ps = len(self.ls.rows[rid].slots), self.ls.ps
        if ps > 1:
            keep = (keep % -(-L // ps)) * ps
        else:
            unpaired = self._runs(rid, paired=False)
            floor = unpaired[-1][1] if unpaired else 0
            if floor >= L:
                return
            keep = floor + keep % (L - floor)
        self._go(DropTail(rid, keep))

    @precondition(lambda self: self.ok and not self.ls.model.group_open)
    @rule()
    def group_begin(self):
        self._go(GroupBegin())

    @precondition(lambda self: self.ok and self.ls.model.group_open)
    @rule()
    def group_end(self):
        self._go(GroupEnd())

    @precondition(lambda self: self.ok)
    @rule(op=st.sampled_from(("merge_sort", "clear", "resize")), full=st.integers(0, 64), swa=st.integers(0, 64))
    def maintain(self, op, full, swa):
        """Upkeep that touches every page: merge/sort the free lists, clear, or resize."""
        if op == "merge_sort":
            self._go(MergeSort())
        elif op == "clear":
            self._go(Clear())
        else:
            m, ps = self.ls.model, self.ls.ps
            size = (1 + full % (m.built_size // ps)) * ps
            size_swa = size if m.pure else (1 + swa % (m.built_size_swa // ps)) * ps
            self._go(Resize(size, size_swa))

    @precondition(lambda self: self.ok)
    @rule(kind=st.sampled_from(BREAKS[2:]), pick=st.integers(0, 63))
    def contract_break(self, kind, pick):
        self._first_break(BREAKS[2:], kind, pick)

    @precondition(_has_rows)
    @rule(kind=st.sampled_from(BREAKS[:2]), pick=st.integers(0, 63))
    def guard_break(self, kind, pick):
        """The two breaks the allocator's own guards watch (swa.peer_mapped and
        swa.peer_released): guard agreement at every level is checked on these, and
        a break tolerated at warn or off leaves stale entries later calls must cope with."""
        self._first_break(BREAKS[:2], kind, pick)

    def _first_break(self, kinds: tuple[str, ...], kind: str, pick: int) -> None:
        # The drawn kind, or the next one the current state can make, so that a draw
        # is rarely wasted and shrinks toward the first kinds.
        start = kinds.index(kind)
        for k in kinds[start:] + kinds[:start]:
            step = self._break_step(k, pick)
            if step is not None:
                self._go(step)
                return

    def _break_step(self, kind: str, pick: int) -> Break | None:
        """The break, where the current state can make it; None where it cannot."""
        ls, m = self.ls, self.ls.model
        hybrid = not m.pure
        if kind == "nested_group":
            return Break(kind) if m.group_open else None
        if kind in ("tail_batch", "tail_long"):
            return Break(kind) if ls.ps > 1 and hybrid else None
        if kind == "paged_on_token":
            return Break(kind) if ls.ps == 1 else None
        if kind == "alloc_on_paged":
            return Break(kind) if ls.ps > 1 else None
        if kind == "resize_grow":
            return Break(kind)
        if kind == "double_free":
            return Break(kind) if ls.ghosts else None
        if kind == "never_allocated":
            return Break(kind) if m.full.free else None
        if not ls.rows:
            return None
        rid = self._pick(pick)
        slots = ls.rows[rid].slots
        if kind == "free_unpaired":
            ok = hybrid and ls.ps == 1 and not ls.ring and any(s not in m.peer for s in slots)
        elif kind == "free_full_paired":
            ok = hybrid and any(s in m.peer for s in slots)
        elif kind == "partial_page":
            ok = ls.ps > 1 and len(slots) > 1
        else:  # unaligned_segment
            ok = ls.ps > 1 and len(slots) > 1
        return Break(kind, rid) if ok else None

    # ----------------------------------------------------------- teardown
    def teardown(self):
        if self.ls is not None and not self.failed:
            self.ls.close()


def machine_for(
    target: Target | None = None,
    device: str = "cpu",
    census_every: int = 16,
    peer: Target | None = None,
    sides: tuple[dict, dict] = ({}, {}),
) -> type[LockstepMachine]:
    """A LockstepMachine class bound to one target and device.

    With `peer`, every step also runs on a second target and the two must agree slot
    for slot; `sides` adds config keys per side, e.g. ({"device": "cpu"}, {"device":
    "cuda"}) or ({"backend": "cpu"}, {"backend": "npu_emulated"}).
    """
    return type(
        "LockstepMachine",
        (LockstepMachine,),
        {
            "target": staticmethod(target or resolve("impl")),
            "device": device,
            "census_every": census_every,
            "peer": None if peer is None else staticmethod(peer),
            "sides": sides,
        },
    )
