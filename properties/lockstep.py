"""The lockstep driver: one workload step runs on the model and on a target, then compared.

The driver plays the scheduler: it keeps each request's row (its full slots by
position), turns a step into allocator calls, asks the model whether each call keeps
the caller's contract, runs it on the target, and compares what the target returned
and the state the call touched. A full census (every page, every peer) runs every
`census_every` steps, after clear/resize/group end, and at the end.
"""

from __future__ import annotations

import contextlib
import os
import traceback
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from impl import config as config_schema
from properties import observe
from properties.steps import (
    Admit, AdmitTail, Break, Clear, Decode, DropTail, Evict, Extend, Finish,
    GroupBegin, GroupEnd, MergeSort, Repair, Resize, Step, StepFormatError,
)
from reference import Contract, Model, Violation, layout, names

RELEASED = -1  # a pure SWA row's position whose slot window eviction released
_TOLERATED = object()  # result of a call whose broken contract the target accepted


def runs_of(slots: list[int], pred) -> list[tuple[int, int]]:
    """Maximal runs [lo, hi) of positions whose slot satisfies pred."""
    out, lo = [], None
    for i, s in enumerate(slots):
        if pred(s):
            if lo is None:
                lo = i
        elif lo is not None:
            out.append((lo, i))
            lo = None
    if lo is not None:
        out.append((lo, len(slots)))
    return out


CONFIG_KEYS = config_schema.KEYS
LEVELS = config_schema.LEVELS
_HARNESS_DIRS = tuple(str(Path(__file__).resolve().parent.parent / d) + os.sep for d in ("properties", "reference", "fuzz"))


class TargetCrash(Exception):
    """The target raised where the harness did not call it to be refused: building it,
    or reading its state. `original` is what it raised."""

    def __init__(self, what: str, original: BaseException):
        self.original = original
        super().__init__(f"the target raised {type(original).__name__} while {what}: {original}")


class HarnessError(Exception):
    """The harness's own code (model, driver, observation) raised: a bug here, not in the
    target. `traceback` is the formatted traceback of the original exception."""

    def __init__(self, where: str, original: BaseException):
        self.original = original
        self.traceback = "".join(traceback.format_exception(original))
        super().__init__(f"harness error at {where}: {type(original).__name__}: {original}")


def raised_in_harness(exc: BaseException) -> bool:
    """Whether the innermost frame that raised `exc` is the harness's own code."""
    tb = exc.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_HARNESS_DIRS)


class Observer:
    """Watches every Lockstep driver built while it is registered (`observing`): a
    campaign journals and counts steps through it. Methods are called with the driver."""

    def started(self, ls: "Lockstep") -> None:
        """A driver was built (once per example; a restart inside it is not a new start)."""

    def before_step(self, ls: "Lockstep", step: Step) -> None:
        """A step is about to run (it is already in `ls.trace`)."""

    def after_step(self, ls: "Lockstep", step: Step) -> None:
        """A step ended: it ran, failed, or restarted the run."""


_OBSERVERS: list[Observer] = []


@contextlib.contextmanager
def observing(observer: Observer):
    """Register `observer` for every driver built and every step run inside the block."""
    _OBSERVERS.append(observer)
    try:
        yield observer
    finally:
        _OBSERVERS.remove(observer)


class _Unchecked(Exception):
    """A call whose effect the model cannot predict ran: the run ends after it."""


class LockstepFailure(AssertionError):
    """The target diverged from the model: names the invariant, the step, and what differs."""

    def __init__(
        self,
        invariant: str,
        index: int,
        step: Step | None,
        details: list[str],
        config: dict | None = None,
        steps: list[Step] | None = None,
    ):
        self.invariant = invariant
        self.index = index
        self.step = step
        self.details = details
        self.config = config  # with steps: a trace that replays this failure
        self.steps = steps
        if step is not None:
            where = f"step {index}: {step!r}"
        else:
            where = "the census after construction" if index < 0 else "the closing census"
        lines = [f"{invariant} at {where}"] + [f"  - {d}" for d in details[:8]]
        if len(details) > 8:
            lines.append(f"  ... {len(details) - 8} more")
        super().__init__("\n".join(lines))


_FAILURE_CLASSES: dict[str, type[LockstepFailure]] = {}


def failure_class(invariant: str) -> type[LockstepFailure]:
    """A LockstepFailure subclass per invariant: hypothesis tells bugs apart by exception
    type, so its shrinker keeps to the invariant it found instead of drifting to
    another one raised from the same line."""
    cls = _FAILURE_CLASSES.get(invariant)
    if cls is None:
        name = "LockstepFailure_" + "".join(c if c.isalnum() else "_" for c in invariant)
        cls = _FAILURE_CLASSES[invariant] = type(name, (LockstepFailure,), {"__module__": __name__})
    return cls


def check_config(config: dict) -> dict:
    """A complete, validated configuration (SPEC 4.3, `impl.config`); ConfigError (a
    ValueError) names the bad key. The driver needs a level: strict unless one is given."""
    cfg = config_schema.validate(config)
    if cfg["check_level"] is None:
        cfg["check_level"] = "strict"
    return cfg


@dataclass
class _Row:
    """A request's row: its full slot per position, as a list for the model and as a
    device tensor whose views the frees pass, as a scheduler's token row is."""

    slots: list[int]
    req_slot: int | None = None
    buf: torch.Tensor | None = None

    def append(self, chunk: torch.Tensor) -> None:
        n, have = len(self.slots), 0 if self.buf is None else self.buf.numel()
        if n > have:
            grown = torch.zeros(max(2 * have, n, 8), dtype=torch.int64, device=chunk.device)
            if have:
                grown[:have] = self.buf
            self.buf = grown
        self.buf[n - chunk.numel() : n] = chunk

    def view(self, lo: int, hi: int) -> torch.Tensor:
        return self.buf[lo:hi]

    def overwrite(self, lo: int = 0) -> None:
        """The scheduler reuses the row: a free group must hold copies, not these views."""
        if self.buf is not None:
            self.buf[lo:].fill_(0)


# SPEC 2.1: what each guard does when its contract is broken, by level (the bucket x
# level matrix). swa.peer_mapped is FATAL_UNCONTAINABLE, swa.peer_released GUARD; at
# off nothing is evaluated, so nothing is counted either.
GUARD_REACTIONS = {
    names.PEER_MAPPED: {"off": "silent", "warn": "crash", "strict": "crash"},
    names.PEER_RELEASED: {"off": "silent", "warn": "count", "strict": "crash"},
}


@dataclass
class _Reaction:
    """What the target must do with one call, from the contract and the level."""

    kind: str  # "run": legal; "raise": refused, state unchanged; "skip": not sent; "count"/"silent": accepted
    contract: Contract | None = None


def _expected(contract: Contract | None, level: str) -> _Reaction:
    if contract is None:
        return _Reaction("run")
    if contract.reaction == names.ERROR:
        return _Reaction("raise", contract)
    if contract.reaction == names.UNNOTICED:
        return _Reaction("skip", contract)
    guard = GUARD_REACTIONS[contract.reaction][level]
    return _Reaction("raise" if guard == "crash" else guard, contract)


def _guard_wants(contract: Contract | None, level: str) -> dict[str, str]:
    """Each guard's owed reaction to one call: its own contract's entry, silent otherwise."""
    return {g: GUARD_REACTIONS[g][level] if contract is not None and contract.reaction == g else "silent" for g in names.GUARDS}


@dataclass
class Lockstep:
    """Runs steps on a model and a target allocator in lockstep.

    A call whose effect the model cannot follow (a broken contract the target accepted
    and then ran on, e.g. swa.peer_mapped at level off) ends its run: the state is
    censused before the call, and after it the driver builds a fresh model and target
    and goes on, so every later step is still compared. `counters()` says how many
    steps ran, how many were compared, and how many runs were restarted.
    """

    config: dict
    target: object  # make(config) -> allocator
    census_every: int = 16
    rows: dict[int, _Row] = field(default_factory=dict)
    labels: Counter = field(default_factory=Counter)

    def __post_init__(self):
        self.config = check_config(self.config)
        c = self.config
        self.ps = c["page_size"]
        self.level = c["check_level"]
        self.index = -1
        self.step: Step | None = None
        self.steps_run = 0
        self.steps_compared = 0
        self.runs_restarted = 0
        self.restarted_because: str | None = None
        self.trace: list[Step] = []
        self._build()
        for o in _OBSERVERS:
            o.started(self)
        self.census()

    def _build(self) -> None:
        """A fresh target and model for the configuration, with no requests."""
        c = self.config
        try:
            self.alloc = self.target(dict(c))
        except NotImplementedError:
            raise  # SPEC 4.3: a configuration the target does not build
        except Exception as e:
            raise TargetCrash(f"building the allocator for {c}", e) from e
        self.model = Model(c["kind"], c["size"], c["size_swa"], c["page_size"], c["need_sort"], c["ring_size"], c["req_slots"])
        self.device = self.alloc.full_to_swa_index_mapping.device
        self.tags = observe.Tags(self.alloc)
        self.rows = {}
        self.ghosts: dict[int, list[int]] = {}

    def counters(self) -> dict[str, int]:
        """Steps run, steps whose every call was compared with the model, runs restarted
        after a call the model could not follow."""
        return {"steps_run": self.steps_run, "steps_compared": self.steps_compared, "runs_restarted": self.runs_restarted}

    # ----------------------------------------------------------- plumbing
    def _fail(self, violations: list[Violation] | Violation) -> None:
        if isinstance(violations, Violation):
            violations = [violations]
        if violations:
            raise failure_class(violations[0].invariant)(
                violations[0].invariant, self.index, self.step, [str(v) for v in violations], self.config, list(self.trace)
            )

    def _t(self, values, cpu: bool = False) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device="cpu" if cpu else self.device)

    @property
    def pure(self) -> bool:
        return self.config["kind"] == "pure_swa"

    @property
    def ring(self) -> bool:
        return self.config["ring_size"] is not None

    def _row(self, rid: int, field_name: str = "rid") -> _Row:
        row = self.rows.get(rid)
        if row is None:
            raise StepFormatError(field_name, f"request {rid} is not live")
        return row

    def _check_guards(self, what: str, contract: Contract | None, exc: Exception | None, before, after) -> None:
        """Each guard crashed, counted or stayed silent exactly as owed (SPEC 2.1, 3.3)."""
        wants = _guard_wants(contract, self.level)
        named = getattr(exc, "invariant", None)
        on = f"on the legal call {what}" if contract is None else f"on {what}, which breaks {contract}"
        for g, want in wants.items():
            counted = None if before is None or after is None else after.get(g, 0) - before.get(g, 0)
            if named == g:
                got = "crash"
            elif counted:
                got = "count"
            elif counted is None and want == "count":
                continue  # SPEC 4.3: a target without invariant_hits() is not compared on counts
            elif want == "crash" and exc is not None and named is None:
                # An error naming no invariant (a device assert names none) stands for
                # the guard's crash; _check_unchanged then makes sure it changed nothing.
                got = "crash"
            else:
                got = "silent"
            if got != want:
                said = {"crash": "crashed", "count": f"counted {counted} hits", "silent": "stayed silent"}[got]
                evaluated = " (at off a guard is not even evaluated)" if self.level == "off" and got != "silent" else ""
                self._fail(Violation(g, f"{g} {said} at level {self.level} {on}; it must {want} there{evaluated}"))

    def _invoke(self, what: str, fn, contract: Contract | None):
        """Run one call as its contract and the level require; returns (ran, result)."""
        reaction = _expected(contract, self.level)
        if reaction.kind == "skip":
            # SPEC 3.2: a break the allocator need not notice is never sent.
            if isinstance(self.step, Break):
                self.labels[f"contract break not sent: {self.step.kind} ({contract.name})"] += 1
            else:
                self.labels[f"workload step breaks a contract, not sent: {contract.name}"] += 1
            return False, None
        if reaction.kind != "run":
            # Whatever is already wrong is named now, not blamed on the break below, and
            # a break the model may not follow leaves a checked state behind it.
            self._fail(self.census_violations())
        before = observe.hits(self.alloc)
        try:
            result, exc = fn(), None
        except Exception as e:  # a target's error is data here, compared below
            result, exc = None, e
        after = observe.hits(self.alloc)
        self._check_guards(what, contract, exc, before, after)
        named = getattr(exc, "invariant", None)
        if reaction.kind == "run":
            if exc is not None:
                self._fail(Violation(named or "crash", f"{what} raised {type(exc).__name__}: {exc} on a legal call"))
            return True, result
        if reaction.kind == "raise":
            if exc is None:
                self._fail(Violation(f"contract.{contract.name}", f"{what} returned normally, but {contract} must raise at level {self.level}"))
            guard = contract.reaction if contract.reaction in names.GUARDS else None
            if named is not None and named != guard:
                self._fail(Violation(named, f"{what} raised for {named}; {contract} must be refused with a clear error"))
            # A guard owes the refusal: an error that is not the guard's is accepted
            # only if nothing changed, and is blamed on the guard if something did.
            blame = guard if guard and named != guard else names.ATOMIC
            self._check_unchanged(what, blame, exc)
            self.labels[f"contract refused: {contract.name}"] += 1
            return False, None
        # Accepted (count or silent), as the level owes.
        if exc is not None:
            # The allocator let the break in and then failed on it: from here the state
            # is the caller's fault, so this run ends (checked up to the call).
            self.labels[f"guard {reaction.kind}, then the target raised: {contract.reaction}"] += 1
            raise _Unchecked(f"{contract} accepted at level {self.level}, then {type(exc).__name__}: {exc}")
        self.labels[f"guard {reaction.kind}: {contract.reaction}"] += 1
        if contract.reaction == names.PEER_RELEASED:
            # Tolerated, as production runs at warn: the model strands the peers and
            # the run goes on (a later call must cope with the stale entries).
            return True, _TOLERATED
        # swa.peer_mapped accepted hands out the padding slot: the model cannot follow.
        raise _Unchecked(f"{contract} accepted at level {self.level}")

    def _check_unchanged(self, what: str, blame: str, exc: Exception) -> None:
        v = self.census_violations()  # sizes included
        said = f"{type(exc).__name__}: {exc}".strip()
        self._fail([Violation(blame, f"{what} raised ({said[:120]}) but changed state: {x}") for x in v])

    def _after_call(self, touched_full: list[int], returned_none: bool = False) -> None:
        """The state one call touched: sizes, the touched peers, the sentinel."""
        v = self.model.check_sizes(observe.sizes(self.alloc))
        if not self.pure and not self.ring:
            v += self.model.check_peers(touched_full, observe.peers(self.alloc, touched_full))
        s = observe.sentinel(self.alloc)
        if s != -1:
            v.append(Violation(names.SENTINEL, f"mapping[-1] is {s}, not -1"))
        if v:
            # The census says which pages and peers differ, not only that a count
            # does, so what it finds comes first.
            v = [x for x in self.census_violations() if x not in v] + v
        if returned_none:
            v = [Violation(names.ATOMIC, f"a call that returned None changed state: {x}") for x in v]
        self._fail(v)

    def _tag(self, rid: int, positions: range, full: list[int]) -> None:
        if not self.tags.enabled:
            return
        values = [observe.Tags.value(rid, p) for p in positions]
        self.tags.write("full", full, values)
        if not self.pure and not self.ring:
            pairs = [(self.model.peer[f], val) for f, val in zip(full, values) if f in self.model.peer]
            if pairs:
                self.tags.write("swa", [s for s, _ in pairs], [val for _, val in pairs])

    def _check_tags(self, rid: int, lo: int, slots: list[int], swa_too: bool) -> None:
        """Before a free: every slot still holds what its owner wrote (kv.integrity)."""
        if not self.tags.enabled or not slots:
            return
        want = [observe.Tags.value(rid, lo + i) for i in range(len(slots))]
        got = self.tags.read("full", slots)
        bad = [(lo + i, s, g) for i, (s, g, w) in enumerate(zip(slots, got, want)) if g != w]
        if swa_too and not self.pure and not self.ring:
            paired = [(lo + i, self.model.peer[s]) for i, s in enumerate(slots) if s in self.model.peer]
            got = self.tags.read("swa", [s for _, s in paired])
            bad += [(p, s, g) for (p, s), g in zip(paired, got) if g != observe.Tags.value(rid, p)]
        if bad:
            p, s, g = bad[0]
            self._fail(Violation(names.KV_INTEGRITY, f"request {rid} position {p}: slot {s} holds tag {g:#x}, its owner wrote {observe.Tags.value(rid, p):#x} ({len(bad)} slots overwritten)"))

    # ------------------------------------------------------------- public
    def run(self, step: Step) -> None:
        """Run one step. Raises LockstepFailure on a divergence, StepFormatError on a step
        that cannot apply, TargetCrash when the target raises outside a call the harness
        compares, HarnessError when the harness's own code raises."""
        self.index += 1
        self.step = step
        self.trace.append(step)
        for o in _OBSERVERS:
            o.before_step(self, step)
        try:
            try:
                getattr(self, "_" + step.op)(step)
            except _Unchecked as e:
                self.steps_run += 1
                self._restart(str(e))
                return
            except (LockstepFailure, StepFormatError, TargetCrash, HarnessError):
                raise
            except Exception as e:
                if raised_in_harness(e):
                    raise HarnessError(f"step {self.index}: {step!r}", e) from e
                raise TargetCrash(f"step {self.index} ran {step!r}", e) from e
            self.steps_run += 1
            self.steps_compared += 1
            if self.census_every and self.index % self.census_every == self.census_every - 1:
                self.census()
        finally:
            for o in _OBSERVERS:
                o.after_step(self, step)

    def _restart(self, why: str) -> None:
        """End the run after a call the model cannot follow: a fresh target and model."""
        self.runs_restarted += 1
        self.labels["run restarted after an unchecked call"] += 1
        self.restarted_because = f"step {self.index}: {why}"
        self._build()
        self.census()

    def close(self) -> None:
        """The closing census, after the last step."""
        self.index += 1
        self.step = None
        self.census()

    def census_violations(self) -> list[Violation]:
        a = self.alloc
        full_free = observe.free_pages(a.full_attn_allocator)
        swa_free = None if self.pure or self.ring else observe.free_pages(a.swa_attn_allocator)
        v = self.model.census(full_free, swa_free, observe.mapping(a))
        v += self.model.check_sizes(observe.sizes(a))
        open_now = getattr(a, "free_group", None) is not None
        if open_now != self.model.group_open:
            v.append(Violation(names.GROUP_DEFERRED, f"the allocator's free group is {'open' if open_now else 'closed'}, the model's {'open' if self.model.group_open else 'closed'}"))
        model_errors = self.model.self_check()
        if model_errors:  # the model itself broke SPEC 3.1: a harness bug, said as such
            v += [Violation(x.invariant, f"reference model inconsistent: {x.detail}") for x in model_errors]
        return v

    def census(self) -> None:
        try:
            v = self.census_violations()
        except Exception as e:
            if raised_in_harness(e):
                raise HarnessError("the census", e) from e
            raise TargetCrash("the census read its state", e) from e
        self._fail(v)

    # --------------------------------------------------------------- allocs
    def _alloc_rows(self, what: str, batch: list[tuple[int, int, int]], new: bool) -> list[int] | None:
        """Grow rows: batch of (rid, prefix_len, seq_len). Returns the full slots or None."""
        m, a = self.model, self.alloc
        rids = [r for r, _, _ in batch]
        prefix = [p for _, p, _ in batch]
        seq = [s for _, _, s in batch]
        last = [self.rows[r].slots[-1] if p else -1 for r, p, _ in batch]
        if self.ps == 1:
            total = sum(seq) - sum(prefix)
            ran, res = self._invoke(f"alloc({total})", lambda: a.alloc(total), m.classify_alloc(total))
            if not ran:
                return None
            full = None if res is None else res.tolist()
            swa = None if full is None or self.pure else observe.peers(a, full)
            owners = [r for r, p, s in batch for _ in range(s - p)]
            self._fail(m.alloc(total, full, swa, owners))
        else:
            contract = m.classify_paged("alloc_decode" if what == "decode" else "alloc_extend")
            contract = contract or m.classify_continuation(prefix, last)
            if what == "decode":
                fn = lambda: a.alloc_decode(self._t(seq), self._t(seq, True), self._t(last))
            else:
                fn = lambda: a.alloc_extend(
                    self._t(prefix), self._t(prefix, True), self._t(seq), self._t(seq, True), self._t(last), sum(seq) - sum(prefix)
                )
            ran, res = self._invoke(what, fn, contract)
            if not ran:
                return None
            if what == "decode":
                label, n = "decode onto a new page", sum(1 for s in seq if (s - 1) % self.ps == 0)
            else:
                label, n = "extend from a prefix inside a page", sum(1 for p in prefix if p % self.ps)
            if n:
                self.labels[label] += n
            full = None if res is None else res.tolist()
            swa = None if full is None or self.ring else observe.peers(a, full)
            check = m.alloc_decode(seq, last, full, swa, rids) if what == "decode" else m.alloc_extend(prefix, seq, last, full, swa, rids)
            self._fail(check)
        if full is None:
            self.labels["pool exhausted"] += 1
            self._after_call([], returned_none=True)
            return None
        self._after_call(full)
        i = 0
        for r, p, s in batch:
            chunk = full[i : i + s - p]
            row = self.rows[r]
            row.slots.extend(chunk)
            row.append(res[i : i + s - p])
            i += s - p
            self._tag(r, range(p, s), chunk)
        return full

    def _take_req_slots(self, rids: list[int]) -> list[int]:
        """Ring mode: each admitted request holds a request slot; returns those admitted."""
        admitted = []
        for r in rids:
            slot = None
            if self.ring:
                slot = self.alloc._req_to_token_pool.alloc()
                self._fail(self.model.req_alloc(slot))
                if slot is None:
                    self.labels["request slots exhausted"] += 1
                    continue
            self.rows[r] = _Row([], slot)
            admitted.append(r)
        return admitted

    def _drop_rows(self, rids: list[int]) -> None:
        for r in rids:
            row = self.rows.pop(r)
            if row.req_slot is not None:
                self.alloc._req_to_token_pool.free(row.req_slot)
                self.model.req_free_slot(row.req_slot)

    def _admit(self, step: Admit) -> None:
        for i, (r, n) in enumerate(step.reqs):
            if r in self.rows or n < 1:
                raise StepFormatError("reqs", f"entry {i}: request {r} must be new and length {n} >= 1")
        admitted = self._take_req_slots([r for r, _ in step.reqs])
        lengths = dict(step.reqs)
        if not admitted:
            return
        if self._alloc_rows("admit", [(r, 0, lengths[r]) for r in admitted], new=True) is None:
            self._drop_rows(admitted)

    def _extend(self, step: Extend) -> None:
        batch = []
        for i, (r, n) in enumerate(step.reqs):
            if n < 1:
                raise StepFormatError("reqs", f"entry {i}: add {n} must be >= 1")
            L = len(self._row(r, "reqs").slots)
            batch.append((r, L, L + n))
        self._alloc_rows("extend", batch, new=False)

    def _decode(self, step: Decode) -> None:
        batch = []
        for r in step.rids:
            L = len(self._row(r, "rids").slots)
            batch.append((r, L, L + 1))
        self._alloc_rows("decode", batch, new=False)

    def _admit_tail(self, step: AdmitTail) -> None:
        m, a = self.model, self.alloc
        r, n, tail = step.rid, step.length, step.tail
        if r in self.rows or n < 1:
            raise StepFormatError("rid", f"request {r} must be new and length {n} >= 1")
        if not self._take_req_slots([r]):
            return
        contract = m.classify_tail([0], [n], n, tail)
        fn = lambda: a.alloc_extend_swa_tail(self._t([0]), self._t([0], True), self._t([n]), self._t([n], True), self._t([-1]), n, tail)
        ran, res = self._invoke(f"alloc_extend_swa_tail(tail={tail})", fn, contract)
        full = None if not ran or res is None else res.tolist()
        if ran:
            swa = None if full is None or self.ring else observe.peers(a, full)
            self._fail(m.alloc_extend_swa_tail(0, n, -1, tail, full, swa, r))
        if full is None:
            self.labels["pool exhausted"] += ran
            self._drop_rows([r])
            if ran:
                self._after_call([], returned_none=True)
            return
        self.labels["admitted with an SWA tail" if tail else "admitted with an empty SWA tail"] += 1
        self._after_call(full)
        self.rows[r].slots = full
        self.rows[r].append(res)
        self._tag(r, range(0, n), full)

    # ---------------------------------------------------------------- frees
    def _free_call(self, call: str, rid: int, lo: int, hi: int, start_pos: int | None = None) -> bool:
        """One free-like call on positions lo..hi-1 of request rid; True when it ran."""
        m, a = self.model, self.alloc
        row = self.rows[rid]
        slots = row.slots[lo:hi]
        contract = m.classify_free(call, slots, start_pos, rid)
        if contract is None:
            self._check_tags(rid, lo, slots, swa_too=call != "free_full")
        idx = row.view(lo, hi)
        if start_pos is None:
            fn = lambda: getattr(a, call)(idx)
        else:
            fn = lambda: getattr(a, call)(idx, start_pos=start_pos)
        ran, res = self._invoke(f"{call}(request {rid}, positions {lo}..{lo + len(slots) - 1})", fn, contract)
        if not ran:
            return False
        touched = layout.expand_to_pages(slots, self.ps) if self.ps > 1 else slots
        touched = [f for f in touched if f < m.mapping_len - 1]
        if res is _TOLERATED:
            m.strand(slots)
        else:
            m.free(call, slots)
        if m.group_open:
            self.labels[f"group holding a {call}"] += 1
        self._after_call(touched)
        return True

    def _evict(self, step: Evict) -> None:
        row = self._row(step.rid)
        if not 0 <= step.lo < step.hi <= len(row.slots):
            raise StepFormatError("hi", f"positions {step.lo}..{step.hi - 1} outside request {step.rid}'s {len(row.slots)}")
        if self._free_call("free_swa", step.rid, step.lo, step.hi):
            self.labels["window evicted"] += 1
            if self.pure:  # one pool: the evicted positions hold no slot any more
                row.slots[step.lo : step.hi] = [RELEASED] * (step.hi - step.lo)

    def _repair(self, step: Repair) -> None:
        m, a = self.model, self.alloc
        row = self._row(step.rid)
        lo, n, off = step.lo, step.n, step.offset
        if self.pure or self.ring:
            raise StepFormatError("op", "repair needs a hybrid allocator without a ring")
        if n < 1 or not 0 <= lo < lo + n <= len(row.slots) or not 0 <= off < self.ps or lo % self.ps:
            raise StepFormatError("n", f"positions {lo}..{lo + n - 1} (offset {off}) do not fit request {step.rid}")
        full = row.slots[lo : lo + n]
        contract = m.classify_repair(full)
        if contract is not None:
            raise StepFormatError("lo", f"positions {lo}..{lo + n - 1} of request {step.rid} cannot be re-paired: {contract.detail}")
        pages = layout.pages_spanned(off + n, self.ps)
        ran, res = self._invoke(f"swa_attn_allocator.alloc({pages * self.ps})", lambda: a.swa_attn_allocator.alloc(pages * self.ps), None)
        swa_all = None if res is None else res.tolist()
        self._fail(m.swa_alloc(pages * self.ps, swa_all))
        if swa_all is None:
            self.labels["pool exhausted"] += 1
            return
        swa = swa_all[off : off + n]
        ran, _ = self._invoke("set_full_to_swa_mapping", lambda: a.set_full_to_swa_mapping(self._t(full), self._t(swa)), None)
        m.set_mapping(full, swa)
        self.labels["evicted then re-paired"] += 1
        if off:
            self.labels["re-paired from inside an SWA page"] += 1
        if m.group_open:
            self.labels["group holding a re-pair"] += 1
        self._after_call(full)
        self.tags.write("swa", swa, [observe.Tags.value(step.rid, lo + i) for i in range(n)])

    def _finish_calls(self, rid: int, how: str) -> list[tuple[str, int, int]]:
        """(call, lo, hi) runs that release a whole row the way `how` names."""
        row = self.rows[rid]
        L, ps, peer = len(row.slots), self.ps, self.model.peer
        if self.pure:
            return [("free", lo, hi) for lo, hi in runs_of(row.slots, lambda s: s != RELEASED)]
        if self.ring:
            return [("free", 0, L)]
        # A page with any paired position is freed with free (SWA side first); the rest
        # with free_full. At page_size 1 that is per position.
        runs: list[tuple[str, int, int]] = []
        for lo in range(0, L, ps):
            hi = min(lo + ps, L)
            call = "free" if any(s in peer for s in row.slots[lo:hi]) else "free_full"
            if runs and runs[-1][0] == call:
                runs[-1] = (call, runs[-1][1], hi)
            else:
                runs.append((call, lo, hi))
        if how == "free" and (ps > 1 or all(c == "free" for c, _, _ in runs)):
            return [("free", 0, L)]
        return runs

    def _finish(self, step: Finish) -> None:
        row = self._row(step.rid)
        L = len(row.slots)
        if step.how == "segments" and self.ps > 1 and not self.pure:
            segs = [(row.slots[lo : min(lo + self.ps, L)], lo) for lo in range(0, L, self.ps)]
            if not self._free_segments(step.rid, segs):
                return
            how = "segments"
        else:
            # free_segments needs pages and both pools; elsewhere a "segments" finish
            # frees as "split" does. The label names the calls that ran.
            calls = self._finish_calls(step.rid, step.how)
            for call, lo, hi in calls:
                if not self._free_call(call, step.rid, lo, hi):
                    return
            kinds = {call for call, _, _ in calls}
            if calls == [("free", 0, L)]:
                how = "free"
            elif kinds == {"free", "free_full"}:
                how = "split"  # free_full of the evicted pages, free of the rest
            elif kinds == {"free_full"}:
                how = "free_full"  # every page evicted
            else:
                how = "frees of the unevicted runs"  # pure SWA: evicted positions hold nothing
        self.labels[f"finished by {how}"] += 1
        self._retire(step.rid)

    def _retire(self, rid: int) -> None:
        """A finished request: its slots stay known for double-free breaks, its row is reused."""
        row = self.rows[rid]
        self.ghosts = {rid: list(row.slots)}
        row.overwrite()
        self._drop_rows([rid])

    def _free_segments(self, rid: int, segs: list[tuple[list[int], int]]) -> bool:
        m, a = self.model, self.alloc
        contract = m.classify_segments(segs, rid)
        if contract is None:
            for idx, lo in segs:
                self._check_tags(rid, lo, idx, swa_too=True)
        row = self.rows[rid]
        arg = [(row.view(lo, lo + len(idx)), lo) for idx, lo in segs]
        ran, _ = self._invoke(f"free_segments(request {rid}, {len(segs)} segments)", lambda: a.free_segments(arg), contract)
        if not ran:
            return False
        touched = []
        for idx, _ in segs:
            m.free("free_segment", idx)
            touched += layout.expand_to_pages(idx, self.ps)
        self._after_call([f for f in touched if f < m.mapping_len - 1])
        self.labels["freed by free_segments"] += 1
        return True

    def _drop_tail(self, step: DropTail) -> None:
        row = self._row(step.rid)
        if not 0 <= step.keep < len(row.slots):
            raise StepFormatError("keep", f"keep {step.keep} outside 0..{len(row.slots) - 1}")
        if self._free_call("free_segment", step.rid, step.keep, len(row.slots), start_pos=step.keep):
            self.labels["tail dropped"] += 1
            row.overwrite(step.keep)
            row.slots = row.slots[: step.keep]
            if not row.slots:
                self._drop_rows([step.rid])

    # --------------------------------------------------------------- others
    def _group_begin(self, step: GroupBegin) -> None:
        ran, _ = self._invoke("free_group_begin", self.alloc.free_group_begin, self.model.classify_group_begin())
        if ran:
            self.model.group_begin()
            self._after_call([])

    def _group_end(self, step: GroupEnd) -> None:
        if not self.model.group_open:
            raise StepFormatError("op", "group_end with no open group")
        self._invoke("free_group_end", self.alloc.free_group_end, None)
        self.model.group_end()
        self.labels["group ended"] += 1
        self._after_call([])

    def _merge_sort(self, step: MergeSort) -> None:
        subs = [self.alloc.full_attn_allocator]
        if self.alloc.swa_attn_allocator is not subs[0]:
            subs.append(self.alloc.swa_attn_allocator)
        for sub in subs:
            self._invoke("merge_and_sort_free", sub.merge_and_sort_free, None)
        self._after_call([])

    def _forget_rows(self) -> None:
        self._drop_rows(list(self.rows))
        self.ghosts = {}

    def _clear(self, step: Clear) -> None:
        if self.model.group_open:
            self.labels["clear inside a group"] += 1
        self._invoke("clear", self.alloc.clear, None)
        self.model.clear()
        self._forget_rows()
        self.census()

    def _resize(self, step: Resize) -> None:
        cfg = types.SimpleNamespace(full_max_total_num_tokens=step.size, swa_max_total_num_tokens=step.size_swa)
        ran, _ = self._invoke(f"resize({step.size}, {step.size_swa})", lambda: self.alloc.resize(cfg), self.model.classify_resize(step.size, step.size_swa))
        if ran:
            self.model.resize(step.size, step.size_swa)
            self._forget_rows()
            self.labels["resized"] += 1
            self.census()

    def _break(self, step: Break) -> None:
        """A deliberate contract break; the model must classify it, the target react as owed."""
        m, a, ps, kind = self.model, self.alloc, self.ps, step.kind
        if kind in ("nested_group", "tail_batch", "tail_long", "paged_on_token", "alloc_on_paged", "resize_grow", "never_allocated", "double_free"):
            row = None
        else:
            row = self._row(step.rid)
        t = self._t
        if kind == "free_unpaired":
            slots = [s for s in row.slots if s not in m.peer][:1] or row.slots[:1]
            what, contract = "free", m.classify_free("free", slots, None, step.rid)
            fn = lambda: a.free(t(slots))
        elif kind == "free_full_paired":
            # A request finished with free_full although some positions keep SWA peers.
            if self._free_call("free_full", step.rid, 0, len(row.slots)):
                self._retire(step.rid)
            return
        elif kind == "double_free":
            slots = next(iter(self.ghosts.values()), [])[:1]
            if not slots:
                raise StepFormatError("kind", "double_free needs a finished request")
            what, contract = "free", m.classify_free("free", slots, None, -1)
            fn = lambda: a.free(t(slots))
        elif kind == "never_allocated":
            page = next(iter(m.full.free), None)  # any free page; no scan of the pool
            if page is None:
                raise StepFormatError("kind", "never_allocated needs a free page")
            slots = [page * ps]
            what, contract = "free", m.classify_free("free", slots, None, -1)
            fn = lambda: a.free(t(slots))
        elif kind == "partial_page":
            slots = row.slots[:1]
            what = "free" if slots[0] in m.peer else "free_full"  # the call that fits the slot
            contract = m.classify_free(what, slots, None, step.rid)
            fn = lambda: getattr(a, what)(t(slots))
        elif kind == "nested_group":
            what, contract, fn = "free_group_begin", m.classify_group_begin(), a.free_group_begin
        elif kind == "unaligned_segment":
            slots = row.slots[1:]
            what, contract = "free_segment", m.classify_free("free_segment", slots, 1, step.rid)
            fn = lambda: a.free_segment(t(slots), start_pos=1)
        elif kind in ("tail_batch", "tail_long"):
            bs, n = (2, 2) if kind == "tail_batch" else (1, 2)
            tail = 1 if kind == "tail_batch" else n + 1
            what, contract = "alloc_extend_swa_tail", m.classify_tail([0] * bs, [n] * bs, n * bs, tail)
            fn = lambda: a.alloc_extend_swa_tail(t([0] * bs), t([0] * bs, True), t([n] * bs), t([n] * bs, True), t([-1] * bs), n * bs, tail)
        elif kind == "paged_on_token":
            what, contract = "alloc_extend", m.classify_paged("alloc_extend")
            fn = lambda: a.alloc_extend(t([0]), t([0], True), t([1]), t([1], True), t([-1]), 1)
        elif kind == "alloc_on_paged":
            what, contract = "alloc", m.classify_alloc(ps)
            fn = lambda: a.alloc(ps)
        elif kind == "resize_grow":
            size, size_swa = m.built_size + ps, m.built_size_swa + ps
            what, contract = "resize", m.classify_resize(size, size_swa)
            cfg = types.SimpleNamespace(full_max_total_num_tokens=size, swa_max_total_num_tokens=size_swa)
            fn = lambda: a.resize(cfg)
        else:
            raise StepFormatError("kind", f"unknown contract break {kind!r}")
        if contract is None:
            raise StepFormatError("kind", f"{kind} keeps the contract in this state (the model sees no break)")
        self._invoke(f"{what} ({kind})", fn, contract)


def replay(config: dict, steps: list[Step], target, census_every: int = 16) -> Lockstep:
    """Run a whole trace and the closing census; raises LockstepFailure on a divergence,
    StepFormatError (with `.index`) on a step that cannot apply."""
    ls = Lockstep(config, target, census_every=census_every)
    for i, step in enumerate(steps):
        try:
            ls.run(step)
        except StepFormatError as e:
            e.index = i
            raise
    ls.close()
    return ls


def minimize(config: dict, steps: list[Step], target, invariant: str, max_replays: int = 300):
    """Drop steps, one at a time and then adjacent pairs (a group's begin and end),
    while the trace still trips `invariant`.

    Hypothesis shrinks the choices that made the run; a step that survives that (its
    rule's choices are shared with a step the failure needs) is cut here, where the
    unit is the step itself. Returns (steps, failure) for the shortest trace found.
    """
    failure = None
    best = list(steps)
    replays = 0
    changed = True
    while changed and replays < max_replays:
        changed = False
        for width in (1, 2):
            for i in reversed(range(len(best) - width + 1)):
                if replays >= max_replays:
                    break
                candidate = best[:i] + best[i + width :]
                replays += 1
                try:
                    replay(config, candidate, target)
                except LockstepFailure as e:
                    if e.invariant == invariant:
                        best, failure, changed = candidate, e, True
                        break
                except HarnessError:
                    raise  # a bug here, not a shorter trace
                except Exception:  # a step that no longer applies, or a target crash: keep it
                    pass
            if changed:
                break
    return best, failure
