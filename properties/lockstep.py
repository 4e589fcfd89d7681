"""The lockstep driver: one workload step runs on the model and on a target, then compared.

The driver plays the scheduler: it keeps each request's row (its full slots by
position), turns a step into allocator calls, asks the model whether each call keeps
the caller's contract, runs it on the target, and compares what the target returned
and the state the call touched. A full census (every page, every peer) runs every
`census_every` steps, before and after clear/resize, after group end, and at the end;
a refused call is held to the target's raw state as it was before the call.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import traceback
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from impl import config as config_schema
from properties import observe
from properties.coverage import DEBUG_CELL
from properties.targets import declares_it_builds
from properties.steps import (
    NEW, PAGE_ID_BREAKS, PAGED_CALLS, ROW_BREAKS, Admit, AdmitTail, Break, CacheFree, Clear, Decode, DropTail, Empty, Evict,
    EvictSegment, Extend, Finish, FreePages, GroupBegin, GroupEnd, MergeSort, Prefill, Repair, Resize,
    Resume, Retract, Step, StepFormatError,
)
from reference import Contract, Model, Violation, layout, names

LARGE_POOL_PAGES = 8192  # above this, no census at construction (see Lockstep)
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
    """Whether the innermost frame that raised `exc` is the harness's own code. A device
    assert never is: the harness issues none, and one the target's kernels issued is
    reported at whichever later call synchronizes, often the harness's read of state."""
    if is_device_assert(exc):
        return False
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


def is_device_assert(exc: BaseException) -> bool:
    """A failed device assert, as torch reports it at the next synchronization."""
    return isinstance(exc, RuntimeError) and "device-side assert triggered" in str(exc)


def asserts_kill(device) -> bool:
    """Whether a guard at strict on ``device`` is a device assert that kills the process."""
    return torch.device(device).type == "cuda"


def target_config(cfg: dict) -> dict:
    """What a target's factory is handed: the keys of SPEC 4.3, and the keys beyond
    them only where they differ from their defaults, so a factory written before
    those keys existed builds every configuration that does not need them."""
    return {k: v for k, v in cfg.items() if k in config_schema.SPEC_KEYS or v != config_schema.DEFAULTS.get(k)}


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
    # The first `shared` positions are a cached entry's (`src`), reused, not owned:
    # the request never frees them, and the entry stays locked while it lives.
    shared: int = 0
    src: int | None = None

    def append(self, chunk: torch.Tensor) -> None:
        n, have = len(self.slots), 0 if self.buf is None else self.buf.numel()
        if n > have:
            # int32, as sglang's req_to_token: the frees get int32 views of it.
            grown = torch.zeros(max(2 * have, n, 8), dtype=torch.int32, device=chunk.device)
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
class _Retracted:
    """A retracted request: its host copy, and what it must read once resumed."""

    length: int
    shared: int
    src: int | None
    copy: object  # whatever the target's get_cpu_copy returned; opaque here
    paired: list[bool]  # per own position: whether it held SWA KV when copied


def _changes(before: dict, after: dict) -> list[str]:
    """What differs between two raw reads of a target (Lockstep._raw_state), named:
    pages a free list gained or lost (its order is the allocator's own), mapping
    entries, where a live slot resolves, sizes."""
    out = []
    slots = before["resolved slots"]
    for key, was in before.items():
        now = after.get(key)
        if key == "resolved slots":
            continue
        if isinstance(was, dict) and isinstance(now, dict):
            out += [f"{k} was {was.get(k)}, is {now.get(k)}" for k in sorted(was.keys() | now.keys()) if was.get(k) != now.get(k)]
            continue
        if not isinstance(was, torch.Tensor) or not isinstance(now, torch.Tensor):
            if was != now:
                out.append(f"{key} was {was}, is {now}")
            continue
        if was.dtype != now.dtype or was.device != now.device or was.shape != now.shape:
            if not (key.endswith("free list") and was.dtype == now.dtype and was.device == now.device):
                out.append(f"{key} was {tuple(was.shape)} {was.dtype} on {was.device}, is {tuple(now.shape)} {now.dtype} on {now.device}")
                continue
        elif torch.equal(was, now):
            continue
        if key.endswith("free list"):
            gained, lost = Counter(now.tolist()), Counter(was.tolist())
            gained, lost = gained - lost, lost - gained
            moved = [f"{how} pages {sorted(pages.elements())[:6]}" for how, pages in (("gained", gained), ("lost", lost)) if pages]
            if moved:
                out.append(f"the {key} {' and '.join(moved)}")
            continue
        where = (was != now).nonzero().reshape(-1).tolist()
        i = where[0]
        at = f"[{i}]" if key == "mapping" else f" of full slot {slots[i]}"
        out.append(f"{key}{at} was {was[i].item()}, is {now[i].item()} ({len(where)} entries differ)")
    return out


def _same_device(named, device: torch.device) -> bool:
    """Whether a device a target names ("cuda", "cuda:0", a torch.device) is `device`;
    a name without an index matches any index of its type. Whatever names no device
    (None, a misspelt name) is not `device`."""
    try:
        d = torch.device(named)
    except (RuntimeError, TypeError, ValueError):
        return False
    return d.type == device.type and (d.index is None or device.index is None or d.index == device.index)


def _index_tensor_fault(res, device: torch.device, n: int) -> str | None:
    """What is wrong with an index tensor a call returned (int64, on `device`, shape
    (n,)), or None."""
    if not isinstance(res, torch.Tensor):
        return f"a {type(res).__name__}, not a tensor"
    if res.dtype != torch.int64:
        return f"dtype {res.dtype}, want torch.int64"
    if res.device != device:
        return f"device {res.device}, want {device}"
    if tuple(res.shape) != (n,):
        return f"shape {tuple(res.shape)}, want ({n},)"
    return None


def _is_count(value) -> bool:
    """An int, or a one-element integer tensor (a page count some modules return so)."""
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.dtype.is_floating_point
    return isinstance(value, int) and not isinstance(value, bool)


def _batch_desc(prefix: list[int], seq: list[int]) -> str:
    """A batch in a failure message: its lengths when it is short, else its size."""
    if len(seq) <= 8:
        return f"prefix_lens {prefix}, seq_lens {seq}"
    return f"a batch of {len(seq)} requests ({sum(seq) - sum(prefix)} new positions)"


def bucket(n: int) -> str:
    """Batch-size bucket for the coverage table."""
    return "1" if n <= 1 else "2-4" if n <= 4 else "5-16" if n <= 16 else "17-128" if n <= 128 else "129+"


@dataclass
class _Reaction:
    """What the target must do with one call, from the contract and the level."""

    kind: str  # "run": legal; "raise": refused, state unchanged; "skip": not sent; "count"/"silent": accepted
    contract: Contract | None = None


def _expected(contract: Contract | None, level: str, debug: bool = False) -> _Reaction:
    if contract is None:
        return _Reaction("run")
    if debug and contract.debug_refuses and not (contract.reaction in names.GUARDS and level != "off"):
        # sglang's debug mode asserts before anything changes (a guard that is on
        # still speaks first).
        return _Reaction("raise", contract)
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
    # (method, argument shape) -> calls: the coverage table of SPEC 4.6.
    shapes: Counter = field(default_factory=Counter)
    # Finished requests the cache keeps (their rows), how many live rows reuse each,
    # and retracted requests waiting to resume.
    cache: dict[int, _Row] = field(default_factory=dict)
    locks: Counter = field(default_factory=Counter)
    retracted: dict[int, _Retracted] = field(default_factory=dict)
    # On CUDA a guard at strict is torch._assert_async: it kills the process, so an
    # in-process run (the hypothesis machine) does not send such a break; a replay,
    # which runs in a child process, does. None: skip where the device kills.
    skip_device_asserts: bool | None = None

    def __post_init__(self):
        self.config = check_config(self.config)
        c = self.config
        self.ps = c["page_size"]
        self.level = c["check_level"]
        self.debug = c["debug_memory_pool"]
        if self.skip_device_asserts is None:
            self.skip_device_asserts = asserts_kill(c["device"])
        self.index = -1
        self.step: Step | None = None
        self.steps_run = 0
        self.steps_compared = 0
        self.runs_restarted = 0
        self.restarted_because: str | None = None
        self.trace: list[Step] = []
        # Steps at which a guard refused a call at strict (a dead process on CUDA).
        self.guard_refusals: list[int] = []
        self._build()
        for o in _OBSERVERS:
            o.started(self)
        # The state as built. Above LARGE_POOL_PAGES this O(pool) check is left to the
        # periodic and closing census: a shrink replays an example hundreds of times.
        if self.model.full.num_pages <= LARGE_POOL_PAGES:
            self.census()

    def _build(self) -> None:
        """A fresh target and model for the configuration, with no requests."""
        c = self.config
        try:
            self.alloc = self.target(target_config(c))
        except NotImplementedError as e:
            if declares_it_builds(self.target, c):
                raise TargetCrash(f"building the allocator for {c}, which it declares it builds", e) from e
            raise  # SPEC 4.3: a configuration the target does not build
        except Exception as e:
            raise TargetCrash(f"building the allocator for {c}", e) from e
        self.model = Model(c["kind"], c["size"], c["size_swa"], c["page_size"], c["need_sort"], c["ring_size"], c["req_slots"])
        self.device = self.alloc.full_to_swa_index_mapping.device
        self.tags = observe.Tags(self.alloc)
        self.module_fns = observe.module_functions(self.alloc)
        self.rows = {}
        self.ghosts: dict[int, list[int]] = {}
        self.cache, self.locks, self.retracted = {}, Counter(), {}

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

    def _last_loc(self, last: list[int]) -> torch.Tensor:
        """last_loc as a scheduler reads it out of req_to_token: int32."""
        return torch.tensor(last, dtype=torch.int32, device=self.device)

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
        reaction = _expected(contract, self.level, self.debug)
        if reaction.kind == "raise" and self.skip_device_asserts and contract.reaction in names.GUARDS:
            self.labels[f"not sent where a guard kills the process: {contract.name}"] += 1
            return False, None
        if reaction.kind == "skip":
            # SPEC 3.2: a break the allocator need not notice is never sent.
            if isinstance(self.step, Break):
                self.labels[f"contract break not sent: {self.step.kind} ({contract.name})"] += 1
            else:
                self.labels[f"workload step breaks a contract, not sent: {contract.name}"] += 1
            return False, None
        if reaction.kind == "raise":
            # A refusal must leave the state as it was: read raw now, compared after.
            # What was already wrong is left to the next census, which still comes.
            state = self._raw_state()
        elif reaction.kind != "run":
            # An accepted break may end the run: whatever is already wrong is named
            # now, before a restart would throw it away.
            self._fail(self.census_violations())
        before = observe.hits(self.alloc)
        try:
            result, exc = fn(), None
        except Exception as e:  # a target's error is data here, compared below
            result, exc = None, e
        if reaction.kind == "raise" and contract.reaction in names.GUARDS and asserts_kill(self.device):
            # The guard's refusal is a device assert that lands at the next sync: take
            # it here, so the run ends at the refusing call as the server's process would,
            # and a guard that did not fire is told from one that has not fired yet.
            try:
                torch.cuda.synchronize(self.device)
            except Exception as e:
                raise TargetCrash(f"{what}: the guard's device assert", e) from e
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
            self._check_unchanged(what, blame, exc, state)
            if guard:
                self.guard_refusals.append(self.index)
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

    def _check_unchanged(self, what: str, blame: str, exc: Exception, before: dict) -> None:
        changed = _changes(before, self._raw_state(before["resolved slots"]))
        said = f"{type(exc).__name__}: {exc}".strip()
        self._fail([Violation(blame, f"{what} raised ({said[:120]}) but changed state: {x}") for x in changed])

    def _raw_state(self, slots: list[int] | None = None) -> dict:
        """Everything the census reads of the target, as read (tensors copied), so that
        two reads compare in O(pool) tensor ops and not the census's Python set work:
        the free lists, the mapping, sizes, capacities, the group's state, what each
        sub-allocator says of its pool, and where attention resolves the live slots."""
        a = self.alloc
        state: dict = {"full free list": observe.free_page_tensor(a.full_attn_allocator).clone()}
        if not self.pure and not self.ring:
            state["SWA free list"] = observe.free_page_tensor(a.swa_attn_allocator).clone()
        state["mapping"] = observe.mapping_tensor(a).clone()
        state["sizes"] = observe.sizes(a)
        state["capacities"] = observe.capacities(a)
        state["free group"] = (getattr(a, "free_group", None) is not None, observe.outside_group(a))
        state["sub-allocators"] = [observe.sub_facts(sub) for sub in observe.sub_allocators(a)]
        if slots is None:
            slots = [] if self.ring else list(self.model.full.live)
        state["resolved slots"] = slots
        for how, got in observe.resolve(a, slots).items():
            state[how] = got.clone() if isinstance(got, torch.Tensor) else got
        return state

    def _after_call(self, touched_full: list[int], returned_none: bool = False) -> None:
        """The state one call touched: sizes, the touched peers, the sentinel."""
        v = self.model.check_sizes(observe.sizes(self.alloc))
        if not self.pure and not self.ring:
            v += self.model.check_peers(touched_full, observe.peers(self.alloc, touched_full))
        if not v and not self.ring:
            v += self._check_resolve(touched_full)
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

    def _check_resolve(self, full_slots: list[int], sentinel: bool = False) -> list[Violation]:
        """kv.resolve: the SWA slot attention reads for each full slot, through the
        KV pool and through the allocator's translate, is the model's peer; each result
        is an int64 tensor on the allocator's device with one entry per index
        (alloc.dtype). With `sentinel` (the census), a last_loc of -1 must translate
        to -1 too (map.sentinel) where attention translates one: a KV transfer moves
        real slots only."""
        m = self.model
        top = m.mapping_len - 1
        real = [f for f in full_slots if 0 < f < top]
        full_slots = real + ([-1] if sentinel else [])
        # The model's answer once for all three routes (a list compare per route).
        want = m.peers_of(real)
        out = []
        for via, res in observe.resolve(self.alloc, full_slots).items():
            self._cover("translate_loc_from_full_to_swa", f"via {via}")
            bad = _index_tensor_fault(res, self.device, len(full_slots))
            if bad:
                out.append(Violation(names.DTYPE, f"{via} returned {bad}"))
                continue
            got = res.tolist()
            if sentinel and got[-1] != -1 and "transfer" not in via:
                out.append(Violation(names.SENTINEL, f"{via}(-1) reads {got[-1]}, not -1: a request with no prefix has no last slot"))
            if got[: len(real)] != want:
                f, g, w = next((f, g, w) for f, g, w in zip(real, got, want) if g != w)
                out.append(Violation(names.KV_RESOLVE, f"{via}({f}) reads SWA slot {g}, the model says {w}"))
        return out

    def _tag(self, rid: int, positions: range, full: list[int]) -> None:
        self._tag_slots(full, [observe.Tags.value(rid, p) for p in positions])

    def _tag_slots(self, full: list[int], values: list[int]) -> None:
        """Write each full slot's tag, and its SWA peer's, as the owner's KV would land."""
        if not self.tags.enabled:
            return
        self.tags.write("full", full, values)
        if not self.pure and not self.ring:
            peer = self.model.peer
            pairs = [(peer[f], val) for f, val in zip(full, values) if f in peer]
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
        v += self.model.check_capacities(observe.capacities(a))
        open_now = getattr(a, "free_group", None) is not None
        outside = observe.outside_group(a)
        if outside is not None and outside == open_now:
            v.append(Violation(names.GROUP_DEFERRED, f"is_not_in_free_group is {outside} while free_group is {'open' if open_now else 'closed'}"))
        if open_now != self.model.group_open:
            v.append(Violation(names.GROUP_DEFERRED, f"the allocator's free group is {'open' if open_now else 'closed'}, the model's {'open' if self.model.group_open else 'closed'}"))
        v += self._check_subs()
        if not v and not self.ring:
            v += self._check_resolve(sorted(self.model.full.live), sentinel=True)
        model_errors = self.model.self_check()
        if model_errors:  # the model itself broke SPEC 3.1: a harness bug, said as such
            v += [Violation(x.invariant, f"reference model inconsistent: {x.detail}") for x in model_errors]
        return v

    def _check_subs(self) -> list[Violation]:
        """Each sub-allocator describes the pool it serves as the hybrid does: its size
        and page count (pool.capacity), the hybrid's dtype and device (alloc.dtype), and
        the KV sub-pool its slots index (kv.resolve)."""
        a, m = self.alloc, self.model
        kv = a.get_kvcache() if callable(getattr(a, "get_kvcache", None)) else None
        if self.pure:
            sides = [("swa_attn_allocator", m.size_full, "swa_kv_pool")]
        else:
            # Ring mode sizes the SWA side by request slots; its sub-allocator keeps the
            # token count the pool was given, which no caller reads as capacity.
            sides = [("full_attn_allocator", m.size_full, "full_kv_pool"),
                     ("swa_attn_allocator", None if self.ring else m.size_swa, "swa_kv_pool")]
        # A hybrid that has a dtype answers for its sub-allocators' dtype, a None too.
        has_dtype, want_dtype = hasattr(a, "dtype"), getattr(a, "dtype", None)
        out = self._check_need_sort("the allocator", a)
        if hasattr(a, "device") and not _same_device(a.device, self.device):
            out.append(Violation(names.DTYPE, f"the allocator's device is {a.device!r}, its mapping's is {self.device}"))
        # In ring mode a scheduler's prefill budget reads the ring's cost per request.
        ring = getattr(a, "swa_req_ring", None)
        if isinstance(ring, bool) and ring != self.ring:
            out.append(Violation(names.CAPACITY, f"swa_req_ring is {ring}, the configuration's ring_size is {self.config['ring_size']}"))
        is_ring = self.module_fns.get("is_swa_req_ring")
        said = self.ring if is_ring is None else is_ring(a)
        if bool(said) != self.ring:
            out.append(Violation(names.CAPACITY, f"is_swa_req_ring(allocator) is {said}, the configuration's ring_size is {self.config['ring_size']}"))
        if self.ring and hasattr(a, "swa_ring_cost_tokens") and a.swa_ring_cost_tokens != m.ring_cost:
            out.append(Violation(names.CAPACITY, f"swa_ring_cost_tokens is {a.swa_ring_cost_tokens}, the model says {m.ring_cost}"))
        for name, size, pool in sides:
            sub = getattr(a, name, None)
            if sub is None:
                continue
            out += self._check_need_sort(name, sub)
            facts = observe.sub_facts(sub)
            wants = {"page_size": self.ps}
            if size is not None:
                wants["size"] = size
                if self.ps > 1:
                    wants["num_pages"] = size // self.ps
            for key, want in wants.items():
                if key in facts and facts[key] != want:
                    out.append(Violation(names.CAPACITY, f"{name}.{key} is {facts[key]}, the model says {want}"))
            if has_dtype and "dtype" in facts and facts["dtype"] != want_dtype:
                out.append(Violation(names.DTYPE, f"{name}.dtype is {facts['dtype']}, the allocator's is {want_dtype}"))
            if "device" in facts and not _same_device(facts["device"], self.device):
                out.append(Violation(names.DTYPE, f"{name}.device is {facts['device']!r}, the mapping's is {self.device}"))
            sub_pool = getattr(kv, pool, None)
            if sub_pool is not None and "kvcache" in facts and facts["kvcache"] is not sub_pool:
                out.append(Violation(names.KV_RESOLVE, f"{name}.get_kvcache() is not the KV pool's {pool}: its slots index another pool"))
        return out

    def _check_need_sort(self, name: str, allocator) -> list[Violation]:
        """`need_sort` (SPEC 2.3) is the reuse policy the pool was built with: a bool,
        the configuration's. A None would read as False, and its free lists would be
        merged unsorted where the configuration asked for sorting."""
        if not hasattr(allocator, "need_sort"):
            return []
        got, want = allocator.need_sort, bool(self.config.get("need_sort"))
        if isinstance(got, bool) and got == want:
            return []
        return [Violation(names.CAPACITY, f"{name}'s need_sort is {got!r}, the configuration's is {want}")]

    def census(self) -> None:
        try:
            v = self.census_violations()
        except Exception as e:
            if raised_in_harness(e):
                raise HarnessError("the census", e) from e
            raise TargetCrash("the census read its state", e) from e
        self._fail(v)

    # --------------------------------------------------------------- allocs
    def _alloc_rows(self, what: str, batch: list[tuple[int, int, int]], new: bool, tags: bool = True) -> list[int] | None:
        """Grow rows: batch of (rid, prefix_len, seq_len). Returns the full slots or None.

        tags=False leaves the new slots' KV to the caller (a resume loads it back)."""
        m, a = self.model, self.alloc
        rids = [r for r, _, _ in batch]
        prefix = [p for _, p, _ in batch]
        seq = [s for _, _, s in batch]
        last = [self.rows[r].slots[-1] if p else -1 for r, p, _ in batch]
        need = layout.total_new_pages(prefix, seq, self.ps)
        short = self._short_sides(need)
        self._check_pages_available(need, short)
        # A batch past a prefill's 16 that meets a short pool: the scheduler's batch
        # at scale under memory pressure, where a path for large batches is taken.
        pressure = (f"batch 17+, short: {short}",) if len(batch) > 16 and short != "none" else ()
        if self.ps == 1:
            total = sum(seq) - sum(prefix)
            self._cover("alloc", f"batch {bucket(len(batch))}", self._prefix_kinds(batch), f"short: {short}", *pressure)
            ran, res = self._invoke(f"alloc({total})", lambda: a.alloc(total), m.classify_alloc(total))
            if not ran:
                return None
            self._check_index_tensor(f"alloc({total})", res, total)
            full = None if res is None else res.tolist()
            swa = None if full is None or self.pure else observe.peers(a, full)
            owners = [r for r, p, s in batch for _ in range(s - p)]
            self._fail(m.alloc(total, full, swa, owners))
        else:
            self._check_page_count(prefix, seq, need, what == "decode")
            contract = m.classify_paged("alloc_decode" if what == "decode" else "alloc_extend")
            contract = contract or m.classify_continuation(prefix, last)
            call = "alloc_decode" if what == "decode" else "alloc_extend"
            if what == "decode":
                opening = sum(1 for p in prefix if p % self.ps == 0)
                self._cover(call, f"batch {bucket(len(batch))}",
                            "new page: " + ("none" if not opening else "all" if opening == len(batch) else "some"),
                            *(("new page: several",) if opening > 1 else ()),
                            "order: " + ("sorted" if rids == sorted(rids) else "unsorted"), f"short: {short}", *pressure, *self._debug_cell())
            else:
                self._cover(call, f"batch {bucket(len(batch))}", self._prefix_kinds(batch), f"short: {short}", *pressure, *self._debug_cell())
            if what == "decode":
                fn = lambda: a.alloc_decode(self._t(seq), self._t(seq, True), self._last_loc(last))
            else:
                fn = lambda: a.alloc_extend(
                    self._t(prefix), self._t(prefix, True), self._t(seq), self._t(seq, True), self._last_loc(last), sum(seq) - sum(prefix)
                )
            ran, res = self._invoke(what, fn, contract)
            if not ran:
                return None
            self._check_index_tensor(call, res, sum(seq) - sum(prefix))
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
            if full is not None:
                self._check_layout_standin(what == "decode", prefix, seq, last, full)
        if full is None:
            self.labels["pool exhausted"] += 1
            self._after_call([], returned_none=True)
            return None
        self._after_call(full)
        self._cover(call if self.ps > 1 else "alloc", self._occupancy())
        i = 0
        for r, p, s in batch:
            row = self.rows[r]
            row.slots.extend(full[i : i + s - p])
            row.append(res[i : i + s - p])
            i += s - p
        if tags:
            # One write per pool for the whole batch: the slots in `full` order.
            self._tag_slots(full, [observe.Tags.value(r, pos) for r, p, s in batch for pos in range(p, s)])
        return full

    def _short_sides(self, n: int) -> str:
        """Which pool cannot serve a batch that needs n new pages: none, full, swa or
        both (coverage)."""
        m = self.model
        full = len(m.full.free) < n
        swa = not (self.pure or self.ring) and len(m.swa.free) < n
        return "both" if full and swa else "full" if full else "swa" if swa else "none"

    def _check_pages_available(self, n: int, short: str) -> None:
        """new_pages_available(n, n) for the n new pages a batch needs must say what the
        model says: a scheduler asks it before it forms the batch."""
        ask = getattr(self.alloc, "new_pages_available", None)
        if ask is None:
            return
        ran, got = self._invoke(f"new_pages_available({n}, {n})", lambda: ask(n, n), None)
        want = short == "none"
        self._cover("new_pages_available", "enough" if want else "short")
        if ran and bool(got) != want:
            self._fail(Violation(names.CAPACITY, f"new_pages_available({n}, {n}) is {got}, the model says {want} ({self.model.free_desc()})"))

    def _check_page_count(self, prefix: list[int], seq: list[int], want: int, decode: bool) -> None:
        """The page count the allocator's module offers (`get_num_new_pages`, on the
        host copies of the lengths) must be the model's: sglang's schedulers size a
        paged batch by it before they send it, and its allocators take that many pages.
        `want` is the model's count."""
        count = self.module_fns.get("get_num_new_pages")
        if count is None:
            return
        seq_cpu = self._t(seq, True)
        if decode:
            what, fn = "get_num_new_pages(decode=True)", lambda: count(seq_lens=seq_cpu, page_size=self.ps, decode=True)
        else:
            pre_cpu = self._t(prefix, True)
            what, fn = "get_num_new_pages", lambda: count(seq_lens=seq_cpu, page_size=self.ps, prefix_lens=pre_cpu)
        self._cover("get_num_new_pages", "decode" if decode else "extend")
        ran, got = self._invoke(what, fn, None)
        if ran and not (_is_count(got) and int(got) == want):
            self._fail(Violation(names.CAPACITY, f"{what} is {got!r} for {_batch_desc(prefix, seq)} at page size {self.ps}, the model says {want}"))

    def _check_layout_standin(self, decode: bool, prefix: list[int], seq: list[int], last: list[int], full: list[int]) -> None:
        """The module's torch stand-in for the layout kernel (`alloc_extend_naive` /
        `alloc_decode_naive`, the kernel's arguments), given the pages this legal call
        took in the order it took them, must lay the batch out as the call did: SPEC 2.5
        fixes the layout once the pages are known. Where the allocator runs the Triton
        kernel, this is the kernel against its stand-in (SPEC 4.5)."""
        name = "alloc_decode_naive" if decode else "alloc_extend_naive"
        fn = self.module_fns.get(name)
        if fn is None:
            return
        ps = self.ps
        positions = (pos for p, s in zip(prefix, seq) for pos in range(p, s))
        pages = [slot // ps for slot, pos in zip(full, positions) if pos % ps == 0]
        out = torch.full((len(full),), -1, dtype=torch.int64, device=self.device)
        pages_t, seq_t, last_t = self._t(pages), self._t(seq), self._last_loc(last)
        if decode:
            call = lambda: fn(seq_t, last_t, pages_t, out, ps, len(pages))
        else:
            pre_t = self._t(prefix)
            call = lambda: fn(pre_t, seq_t, last_t, pages_t, out, ps, self.device)
        self._cover(name, "new pages: some" if pages else "new pages: none")
        ran, _ = self._invoke(name, call, None)
        if not ran:
            return
        got = out.tolist()
        if got != full:
            method = "alloc_decode" if decode else "alloc_extend"
            i = next(i for i, (g, f) in enumerate(zip(got, full)) if g != f)
            self._fail(Violation(names.LAYOUT, (
                f"{name}, given the {len(pages)} pages {method} took, lays out "
                f"{_batch_desc(prefix, seq)} differently: entry {i} is {got[i]}, the call handed out {full[i]}"
            )))

    def _prefix_kinds(self, batch: list[tuple[int, int, int]]) -> str:
        """Coverage: the prefixes of a prefill batch (zero, aligned, unaligned or mixed)."""
        kinds = {"zero" if p == 0 else "aligned" if p % self.ps == 0 else "unaligned" for _, p, _ in batch}
        return "prefix: " + (kinds.pop() if len(kinds) == 1 else "mixed")

    def _occupancy(self) -> str:
        """Coverage: how full the fuller pool is after a call, and whether the full pool
        is a large one (a busy server runs its pools nearly full, so page ids reach the
        top of a large one)."""
        m = self.model
        pools = (m.full,) if self.pure or self.ring else (m.full, m.swa)
        used = max(1 - len(p.free) / max(1, p.num_pages) for p in pools)
        size = "large pool" if m.full.num_pages > LARGE_POOL_PAGES else "pool"
        return f"{size} {'over 90 %' if used > 0.9 else 'over half' if used > 0.5 else 'under half'} full"

    def _cover(self, method: str, *shape: str) -> None:
        for cell in shape:
            self.shapes[(method, cell)] += 1

    def _below_sentinel(self, full_slots: list[int]) -> list[int]:
        """The slots a free touched that have a mapping entry of their own: the last
        entry is the -1 sentinel, not a slot's (an expanded last page can reach it)."""
        top = self.model.mapping_len - 1
        return [f for f in full_slots if f < top]

    def _debug_cell(self) -> tuple[str, ...]:
        """The cell of a call sglang's debug mode checks: only a paged hybrid has those
        checks (page ids released twice, segments' pages in step)."""
        return (DEBUG_CELL,) if self.debug and self.ps > 1 and not self.pure else ()

    def _check_index_tensor(self, what: str, res, n: int) -> None:
        """alloc.dtype: an index tensor a call returns is int64, on the allocator's
        device, one-dimensional with one entry per position asked for."""
        if res is None:
            return
        bad = _index_tensor_fault(res, self.device, n)
        if bad:
            self._fail(Violation(names.DTYPE, f"{what} returned {bad}"))

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
            if row.src is not None:
                self.locks[row.src] -= 1
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
        if contract is None:
            # The SWA side needs only the pages of the tail's positions n-tail..n-1.
            ps = self.ps
            full_need = layout.pages_spanned(n, ps)
            swa_need = 0 if tail == 0 else full_need - (n - tail) // ps
            full_short = len(m.full.free) < full_need
            swa_short = not self.ring and len(m.swa.free) < swa_need
            short = "both" if full_short and swa_short else "full" if full_short else "swa" if swa_short else "none"
            kind = "zero" if tail == 0 else "whole" if tail == n else "part"
            self._cover("alloc_extend_swa_tail", f"tail: {kind}", f"short: {short}", *self._debug_cell())
            if not self.ring and not m.swa.free:
                # A tail of 0 needs no SWA page: it must not be refused for want of one.
                self._cover("alloc_extend_swa_tail", f"tail: {kind}, SWA pool empty")
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
        return self._free_pieces(call, [(rid, lo, hi)], start_pos)

    def _holder(self, rid: int) -> _Row:
        """The row of a live request or of a cached entry."""
        return self.rows[rid] if rid in self.rows else self.cache[rid]

    def _free_pieces(self, call: str, pieces: list[tuple[int, int, int]], start_pos: int | None = None, interleave: bool = False) -> bool:
        """One free-like call over positions lo..hi-1 of each (rid, lo, hi) piece,
        concatenated in order (as a cache eviction or a retracted batch passes them),
        or round-robin across the pieces with `interleave`. True when it ran."""
        m, a = self.model, self.alloc
        held = [(rid, lo, self._holder(rid).slots[lo:hi]) for rid, lo, hi in pieces]
        slots = [s for _, _, piece in held for s in piece]
        order = None
        if interleave and len(held) > 1:
            # Position j of piece i sits at order[k]: the pieces' slots dealt in turn.
            starts = [0]
            for _, _, piece in held:
                starts.append(starts[-1] + len(piece))
            longest = max(len(piece) for _, _, piece in held)
            order = [starts[i] + j for j in range(longest) for i, (_, _, piece) in enumerate(held) if j < len(piece)]
            slots = [slots[k] for k in order]
        if call == "free_swa_segment":
            contract = m.classify_free_swa_segment(slots, start_pos, held[0][0])
        else:
            contract = m.classify_free(call, slots, start_pos, held[0][0] if len(held) == 1 else None)
        if contract is None and len(held) > 1:
            for rid, _, piece in held:  # each piece must be its own request's
                contract = contract or m.classify_free(call, piece, start_pos, rid)
        if contract is None:
            for rid, lo, piece in held:
                self._check_tags(rid, lo, piece, swa_too=call != "free_full")
        views = [self._holder(rid).view(lo, lo + len(piece)) for rid, lo, piece in held]
        idx = views[0] if len(views) == 1 else torch.cat(views)
        if order is not None:
            idx = idx[self._t(order)]
        requests = len({rid for rid, _, _ in held})
        self._cover(call, "pieces: " + ("one request" if requests == 1 else "several requests"), *self._debug_cell())
        if order is not None:
            self._cover(call, "pieces: interleaved")
        if start_pos is None:
            fn = lambda: getattr(a, call)(idx)
        else:
            fn = lambda: getattr(a, call)(idx, start_pos=start_pos)
        what = ", ".join(f"request {rid} positions {lo}..{lo + len(p) - 1}" for rid, lo, p in held[:3])
        ran, res = self._invoke(f"{call}({what}{', ...' if len(held) > 3 else ''})", fn, contract)
        if not ran:
            return False
        touched = layout.expand_to_pages(slots, self.ps) if self.ps > 1 else slots
        touched = self._below_sentinel(touched)
        kept = m.kept_paired
        if res is _TOLERATED:
            m.strand(slots)
        else:
            m.free(call, slots)
        if m.kept_paired > kept:
            self.labels["SWA page kept: another full page still pairs into it"] += 1
        if m.group_open:
            self.labels[f"group holding a {call}"] += 1
        self._after_call(touched)
        return True

    def _evict(self, step: Evict) -> None:
        row = self._row(step.rid)
        if not row.shared <= step.lo < step.hi <= len(row.slots):
            raise StepFormatError("hi", f"positions {step.lo}..{step.hi - 1} outside request {step.rid}'s own {row.shared}..{len(row.slots) - 1}")
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
        if n < 1 or not row.shared <= lo < lo + n <= len(row.slots) or not 0 <= off < self.ps or lo % self.ps:
            raise StepFormatError("n", f"positions {lo}..{lo + n - 1} (offset {off}) do not fit request {step.rid}")
        full = row.slots[lo : lo + n]
        contract = m.classify_repair(full)
        if contract is not None:
            raise StepFormatError("lo", f"positions {lo}..{lo + n - 1} of request {step.rid} cannot be re-paired: {contract.detail}")
        pages = layout.pages_spanned(off + n, self.ps)
        ran, res = self._invoke(f"swa_attn_allocator.alloc({pages * self.ps})", lambda: a.swa_attn_allocator.alloc(pages * self.ps), None)
        self._check_index_tensor("swa_attn_allocator.alloc", res, pages * self.ps)
        swa_all = None if res is None else res.tolist()
        self._fail(m.swa_alloc(pages * self.ps, swa_all))
        if swa_all is None:
            self.labels["pool exhausted"] += 1
            return
        swa = swa_all[off : off + n]
        # As a load-back passes them: the request's int32 row view, and a slice of the
        # SWA slots the sub-allocator just returned.
        full_idx, swa_idx = self._holder(step.rid).view(lo, lo + n), res[off : off + n]
        if step.swa_int32:
            swa_idx = swa_idx.to(torch.int32)
            self.labels["re-paired from int32 SWA indices"] += 1
        ran, _ = self._invoke("set_full_to_swa_mapping", lambda: a.set_full_to_swa_mapping(full_idx, swa_idx), None)
        m.set_mapping(full, swa)
        self.labels["evicted then re-paired"] += 1
        if off:
            self.labels["re-paired from inside an SWA page"] += 1
        if m.group_open:
            self.labels["group holding a re-pair"] += 1
        self._after_call(full)
        self.tags.write("swa", swa, [observe.Tags.value(step.rid, lo + i) for i in range(n)])

    def _release_runs(self, row: _Row, lo: int, hi: int, how: str) -> list[tuple[str, int, int]]:
        """(call, lo, hi) runs that release positions lo..hi-1 of a row the way `how`
        names; lo is page-aligned. A page with any paired position goes by free (SWA
        side first), the rest by free_full (per position at page_size 1)."""
        ps, peer = self.ps, self.model.peer
        if self.pure:
            return [("free", a, b) for a, b in runs_of(row.slots[lo:hi], lambda s: s != RELEASED) for a, b in [(a + lo, b + lo)]]
        if self.ring:
            return [("free", lo, hi)] if hi > lo else []
        runs: list[tuple[str, int, int]] = []
        for a in range(lo, hi, ps):
            b = min(a + ps, hi)
            call = "free" if any(s in peer for s in row.slots[a:b]) else "free_full"
            if runs and runs[-1][0] == call:
                runs[-1] = (call, runs[-1][1], b)
            else:
                runs.append((call, a, b))
        if how == "free" and (ps > 1 or all(c == "free" for c, _, _ in runs)):
            return [("free", lo, hi)] if hi > lo else []
        return runs

    def _segment_runs(self, row: _Row, lo: int, hi: int) -> list[tuple[str, int, int]]:
        """(call, lo, hi) runs that release positions lo..hi-1 by segment the way a
        caller of sglang 0.5.23 must, page by page: its free_segment frees the SWA half
        through free_swa_segment, whose page representative must still have a peer
        (SPEC 3.2), so a page whose SWA half was already released goes by
        free_full_segment, and a page that is neither (re-paired from inside an SWA
        page, or sharing an SWA page) by a set-shaped free. An unaligned start, a pure
        SWA pool and a ring stay one free_segment, as the model classifies them."""
        ps, m = self.ps, self.model
        if self.pure or self.ring or lo % ps or hi <= lo:
            return [("free_segment", lo, hi)] if hi > lo else []
        runs: list[tuple[str, int, int]] = []
        for a in range(lo, hi, ps):
            b = min(a + ps, hi)
            piece = row.slots[a:b]
            if m.classify_free_swa_segment(piece, a) is None:
                call = "free_segment"
            elif not any(m.peer_of(s) for s in piece):
                call = "free_full_segment"
            else:
                call = "free"
            if runs and runs[-1][0] == call:
                runs[-1] = (call, runs[-1][1], b)
            else:
                runs.append((call, a, b))
        return runs

    def _release(self, rid: int, lo: int, hi: int, how: str) -> set[str] | None:
        """Release positions lo..hi-1 of row rid as `how` says; the calls that ran, or
        None when one did not."""
        row = self._holder(rid)
        if how == "segments" and self.ps > 1 and not self.pure:
            runs = self._segment_runs(row, lo, hi)
            ran = set()
            segs = [(row.slots[x : min(x + self.ps, b)], x) for call, a, b in runs if call == "free_segment" for x in range(a, b, self.ps)]
            if segs:
                if not self._free_segments(rid, segs):
                    return None
                ran.add("free_segments")
            for call, a, b in runs:
                if call != "free_segment":
                    if not self._free_call(call, rid, a, b, start_pos=a if call.endswith("_segment") else None):
                        return None
                    ran.add(call)
            return ran
        ran = set()
        for call, a, b in self._release_runs(row, lo, hi, how):
            if how == "full_segments" and call == "free_full" and not self.pure:
                call = "free_full_segment"
            if not self._free_call(call, rid, a, b, start_pos=a if call.endswith("_segment") else None):
                return None
            ran.add(call)
        return ran

    def _finish(self, step: Finish) -> None:
        row = self._row(step.rid)
        L = len(row.slots)
        if step.how == "cache":
            self._finish_into_cache(step.rid)
            return
        evicted = self.pure and RELEASED in row.slots
        calls = self._release(step.rid, row.shared, L, step.how)
        if calls is None:
            return
        # The label names the calls that ran: a "free" finish at page size 1 of a
        # row with evicted positions is a split, a pure SWA row has no full side.
        if evicted:
            how = "frees of the unevicted runs"
        elif calls == {"free"}:
            how = "free"
        elif calls == {"free_segments"}:
            how = "segments"
        elif "free" in calls:
            how = "split" + (" with free_full_segment" if "free_full_segment" in calls else "")
        else:
            how = " and ".join(sorted(calls))  # every page evicted: free_full or free_full_segment
        self.labels[f"finished by {how}"] += 1
        self._retire(step.rid)

    def _finish_into_cache(self, rid: int) -> None:
        """The cache keeps the page-aligned part of a finished row as an entry, as a
        paged radix cache does; the partial last page is freed."""
        row = self._row(rid)
        if self.pure or row.shared:
            raise StepFormatError("how", f"request {rid} cannot be cached: {'pure SWA' if self.pure else 'it reuses a cached prefix'}")
        L = len(row.slots)
        # A partial last page stays only where a later request could continue it.
        keep = L if self.continuable(row.slots) else L - L % self.ps
        if keep < L and not self._release(rid, keep, L, "split"):
            return
        self.labels["finished into the cache"] += 1
        row.slots = row.slots[:keep]
        self.rows.pop(rid)
        if row.req_slot is not None:
            self.alloc._req_to_token_pool.free(row.req_slot)
            self.model.req_free_slot(row.req_slot)
            row.req_slot = None
        if keep:
            # A radix cache keeps an int64 copy of the row (sglang's cache_finished_req),
            # and its evictions free views of that copy, which it later overwrites.
            row.buf = row.buf[:keep].to(torch.int64, copy=True)
            self.cache[rid] = row

    def _retire(self, rid: int) -> None:
        """A finished request: its slots stay known for double-free breaks, its row is reused."""
        row = self.rows[rid]
        self.ghosts = {rid: list(row.slots[row.shared :])}
        row.overwrite(row.shared)
        self._drop_rows([rid])

    def _free_segments(self, rid: int, segs: list[tuple[list[int], int]]) -> bool:
        m, a = self.model, self.alloc
        contract = m.classify_segments(segs, rid)
        if contract is None:
            for idx, lo in segs:
                self._check_tags(rid, lo, idx, swa_too=True)
        row = self._holder(rid)
        arg = [(row.view(lo, lo + len(idx)), lo) for idx, lo in segs]
        self._cover("free_segments", f"segments {bucket(len(segs))}", *self._debug_cell())
        ran, _ = self._invoke(f"free_segments(request {rid}, {len(segs)} segments)", lambda: a.free_segments(arg), contract)
        if not ran:
            return False
        touched = []
        for idx, _ in segs:
            m.free("free_segment", idx)
            touched += layout.expand_to_pages(idx, self.ps)
        self._after_call(self._below_sentinel(touched))
        self.labels["freed by free_segments"] += 1
        return True

    def _drop_tail(self, step: DropTail) -> None:
        row = self._row(step.rid)
        if not row.shared <= step.keep < len(row.slots):
            raise StepFormatError("keep", f"keep {step.keep} outside {row.shared}..{len(row.slots) - 1}")
        ran = set()
        for call, a, b in self._segment_runs(row, step.keep, len(row.slots)):
            if not self._free_call(call, step.rid, a, b, start_pos=a if call.endswith("_segment") else None):
                return
            ran.add(call)
        if ran:
            self.labels["tail dropped"] += 1
            if ran != {"free_segment"}:
                self.labels["tail dropped over evicted pages: " + " and ".join(sorted(ran))] += 1
            row.overwrite(step.keep)
            row.slots = row.slots[: step.keep]
            if len(row.slots) == row.shared:  # nothing of its own left: the request is done
                self._drop_rows([step.rid])

    # ------------------------------------------------- scheduler and cache
    def _new_row(self, rid: int, field_name: str) -> None:
        if rid in self.rows or rid in self.cache or rid in self.retracted:
            raise StepFormatError(field_name, f"request {rid} is not new")

    def _prefill(self, step: Prefill) -> None:
        """A mixed prefill batch: new requests, cache hits and chunked continuations."""
        batch, fresh, hits, takeovers, seen, used = [], [], [], {}, set(), set()
        for i, (r, src, prefix, add) in enumerate(step.batch):
            where = f"entry {i}"
            if r in seen or add < 1:
                raise StepFormatError("batch", f"{where}: request {r} twice, or add {add} < 1")
            seen.add(r)
            if src == NEW:
                self._new_row(r, "batch")
                if prefix:
                    raise StepFormatError("batch", f"{where}: a new request starts at prefix 0, not {prefix}")
                fresh.append(r)
            elif src == r:
                L = len(self._row(r, "batch").slots)
                if prefix != L:
                    raise StepFormatError("batch", f"{where}: request {r} continues from {L}, not {prefix}")
            else:
                self._new_row(r, "batch")
                entry = self.cache.get(src)
                if entry is None or not 0 < prefix <= len(entry.slots):
                    raise StepFormatError("batch", f"{where}: no cached entry {src} with {prefix} positions")
                if src in used:
                    raise StepFormatError("batch", f"{where}: cached entry {src} twice in one batch")
                used.add(src)
                if prefix % self.ps:
                    if prefix != len(entry.slots) or self.locks[src]:
                        raise StepFormatError("batch", f"{where}: a prefix inside a page takes over all of unlocked entry {src}")
                    takeovers[r] = src
                hits.append((r, src, prefix))
            batch.append((r, prefix, prefix + add))
        admitted = set(self._take_req_slots(fresh + [r for r, _, _ in hits]))
        for r, src, prefix in hits:
            if r not in admitted:
                continue
            entry = self.cache[src]
            row = self.rows[r]
            row.slots = entry.slots[:prefix]
            row.append(entry.view(0, prefix))
            if r not in takeovers:
                row.shared, row.src = prefix, src
                if self.locks[src]:
                    self.labels["prefill: cache hit on a prefix in use"] += 1
                self.locks[src] += 1
        batch = [b for b in batch if b[0] in self.rows]  # new ones without a request slot wait
        if not batch:
            return
        for r, p, _ in batch:
            if r in admitted:
                self.labels["prefill: cache hit" if p else "prefill: new request"] += 1
            else:
                self.labels["prefill: chunked continuation"] += 1
        if len({r in admitted for r, _, _ in batch}) == 2:
            self.labels["prefill: new and continuing requests in one batch"] += 1
        if self._alloc_rows("prefill", batch, new=True) is None:
            self._drop_rows([r for r in admitted if r in self.rows])
            return
        for r, src in takeovers.items():
            if r in self.rows:
                self._take_over(r, src)

    def continuable(self, slots: list[int]) -> bool:
        """Whether a row of these slots can be extended (SPEC 2.5): its last page is full,
        or its last position still has its SWA peer at the same in-page offset."""
        ps = self.ps
        if not slots or len(slots) % ps == 0 or self.pure or self.ring:
            return True
        peer = self.model.peer.get(slots[-1])
        return peer is not None and peer % ps == slots[-1] % ps

    def _take_over(self, rid: int, src: int) -> None:
        """The request now owns a cached entry's slots (and their KV, retagged)."""
        entry = self.cache.pop(src)
        n = len(entry.slots)
        self.model.transfer(entry.slots, rid)
        self._tag(rid, range(n), entry.slots)
        self.labels["prefill: cached entry taken over mid-page"] += 1

    def _retract(self, step: Retract) -> None:
        """Copy each request's KV to the host, then free the batch's slots, one call
        per kind over all the rows concatenated."""
        if self.pure:
            raise StepFormatError("op", "retract needs a hybrid allocator")
        a = self.alloc
        if len(set(step.rids)) != len(step.rids):
            raise StepFormatError("rids", f"a request twice in {step.rids}")
        saved = {}
        for r in step.rids:
            row = self._row(r, "rids")
            own = row.slots[row.shared :]
            idx = row.view(row.shared, len(row.slots))
            self._cover("get_cpu_copy", f"positions {bucket(len(own))}")
            ran, copy = self._host_copy("get_cpu_copy", r, lambda kw: a.get_cpu_copy(idx, **kw))
            paired = [False] * len(own) if self.ring else [s in self.model.peer for s in own]
            saved[r] = _Retracted(len(row.slots), row.shared, row.src, copy, paired)
        by_call: dict[str, list[tuple[int, int, int]]] = {}
        for r in step.rids:
            row = self.rows[r]
            for call, lo, hi in self._release_runs(row, row.shared, len(row.slots), "free"):
                by_call.setdefault(call, []).append((r, lo, hi))
        for call, pieces in by_call.items():
            if not self._free_pieces(call, pieces):
                return
        for r in step.rids:
            row = self.rows[r]
            row.overwrite(row.shared)
            src = row.src
            row.src = None  # the retracted request keeps its lock on the entry
            self._drop_rows([r])
            self.retracted[r] = saved[r]
            saved[r].src = src
        self.labels["retracted"] += 1
        if len(step.rids) > 1:
            self.labels["retracted a batch"] += 1

    def _resume(self, step: Resume) -> None:
        """Re-admit retracted requests and load their host copies into the new slots:
        each position must then read the KV it had (kv.integrity through kv.resolve)."""
        a = self.alloc
        if len(set(step.rids)) != len(step.rids) or any(r not in self.retracted for r in step.rids):
            raise StepFormatError("rids", f"requests {step.rids} are not all retracted, once each")
        admitted = self._take_req_slots(list(step.rids))
        batch = []
        for r in admitted:
            saved = self.retracted[r]
            row = self.rows[r]
            if saved.src is not None:
                entry = self.cache[saved.src]
                row.slots = entry.slots[: saved.shared]
                row.append(entry.view(0, saved.shared))
                row.shared, row.src = saved.shared, saved.src
                self.locks[saved.src] += 1
            batch.append((r, saved.shared, saved.length))
        if not batch:
            return
        if self._alloc_rows("resume", batch, new=True, tags=False) is None:
            self._drop_rows(admitted)  # still retracted, still holding their entries
            return
        for r in admitted:
            saved = self.retracted.pop(r)
            if saved.src is not None:
                self.locks[saved.src] -= 1  # the row holds its own lock now
            row = self.rows[r]
            own = row.slots[saved.shared :]
            idx = row.view(saved.shared, saved.length)
            self._cover("load_cpu_copy", f"positions {bucket(len(own))}")
            self._host_copy("load_cpu_copy", r, lambda kw: a.load_cpu_copy(saved.copy, idx, **kw))
            self._check_loaded(r, saved, own)
        self.labels["resumed"] += 1

    def _host_copy(self, method: str, rid: int, call) -> tuple[bool, object]:
        """One host copy call (`get_cpu_copy` or `load_cpu_copy`) for a request, with
        the request's arguments a scheduler passes (its row in the request pool and its
        mamba state's indices): the allocator must hand them on to its KV pool's
        method, since a pool that keeps state per request (a hybrid mamba pool) copies
        by them (kv.integrity)."""
        slot = self.rows[rid].req_slot
        index = rid if slot is None else slot
        sent = {"mamba_indices": torch.tensor([index], dtype=torch.int64, device=self.device), "req_pool_index": index}
        what = f"{method}(request {rid})"
        getter = getattr(self.alloc, "get_kvcache", None)
        kv = getter() if callable(getter) else None
        inner = getattr(kv, method, None)
        own = getattr(kv, "__dict__", None)
        if not callable(inner) or own is None:
            return self._invoke(what, lambda: call(sent), None)
        had = own.get(method)
        received = []

        def recording(*args, **kwargs):
            received.append((args, kwargs))
            return inner(*args, **kwargs)

        setattr(kv, method, recording)
        try:
            ran, result = self._invoke(what, lambda: call(sent), None)
        finally:
            if had is None:
                delattr(kv, method)
            else:
                setattr(kv, method, had)
        if ran and received:
            self.labels["host copy's request arguments checked"] += 1
            params = inspect.signature(inner)
            for args, kwargs in received:
                try:
                    got = params.bind(*args, **kwargs).arguments
                except TypeError:
                    continue  # a call the pool itself refused has already failed the step
                for name, want in sent.items():
                    have = got.get(name)
                    same = (isinstance(have, torch.Tensor) and have.shape == want.shape
                            and torch.equal(have.cpu(), want.cpu())) if isinstance(want, torch.Tensor) else have == want
                    if not same:
                        self._fail(Violation(names.KV_INTEGRITY, (
                            f"{what} was given {name}={want!r}, and passed {name}={have!r} to its KV pool's "
                            f"{method}: a pool that keeps state per request copies another request's")))
        return ran, result

    def _check_loaded(self, rid: int, saved: _Retracted, own: list[int]) -> None:
        """After a load-back, the full KV and the SWA KV that each position resolves to
        are what the request had; positions whose SWA KV was gone when copied are
        recomputed (the harness writes their tags)."""
        if not self.tags.enabled:
            return
        lo = saved.shared
        want = [observe.Tags.value(rid, lo + i) for i in range(len(own))]
        got = self.tags.read("full", own)
        bad = [(lo + i, s, g) for i, (s, g, w) in enumerate(zip(own, got, want)) if g != w]
        if not self.ring and not self.pure and not bad:
            kept = [(lo + i, s) for i, s in enumerate(own) if saved.paired[i]]
            swa = observe.peers(self.alloc, [s for _, s in kept])
            got = self.tags.read("swa", swa)
            bad = [(p, s, g) for (p, s), g in zip(kept, got) if g != observe.Tags.value(rid, p)]
            redo = [(lo + i, s) for i, s in enumerate(own) if not saved.paired[i]]
            if redo:
                self._tag(rid, [p for p, _ in redo], [s for _, s in redo])
        if bad:
            p, s, g = bad[0]
            self._fail(Violation(names.KV_INTEGRITY, f"request {rid} position {p} (slot {s}) reads tag {g:#x} after load_cpu_copy, it had {observe.Tags.value(rid, p):#x} ({len(bad)} positions wrong)"))

    def _cache_free(self, step: CacheFree) -> None:
        """A cache eviction over several entries: free / free_full drop each entry's
        tail from lo on; free_swa releases the SWA KV of lo..hi-1 and keeps the full."""
        pieces = []
        for i, (rid, lo, hi) in enumerate(step.pieces):
            entry = self.cache.get(rid)
            if entry is None or self.locks[rid] or not 0 <= lo < hi <= len(entry.slots):
                raise StepFormatError("pieces", f"entry {i}: {rid} is no unlocked cached entry holding {lo}..{hi - 1}")
            if step.call != "free_swa" and hi != len(entry.slots):
                raise StepFormatError("pieces", f"entry {i}: {step.call} evicts an entry's tail, so hi must be {len(entry.slots)}")
            pieces.append((rid, lo, hi))
        if len({rid for rid, _, _ in pieces}) != len(pieces):
            raise StepFormatError("pieces", "an entry twice")
        if not self._free_pieces(step.call, pieces, interleave=step.interleave):
            return
        self.labels[f"cache evicted by {step.call}" + (" over several entries" if len(pieces) > 1 else "")] += 1
        if step.call == "free_swa":
            return
        for rid, lo, _ in pieces:
            entry = self.cache[rid]
            entry.overwrite(lo)
            entry.slots = entry.slots[:lo]
            if not lo:
                self.ghosts = {rid: []}
                del self.cache[rid]

    def _empty(self, step: Empty) -> None:
        """A call with nothing in it: a batch of no requests, a free of no slots. It must
        return what it owes (an empty int64 index tensor for an alloc) and change nothing."""
        a, call, m = self.alloc, step.call, self.model
        none = torch.empty((0,), dtype=torch.int64, device=self.device)
        self._cover(call, "empty input")
        if call == "alloc":
            if self.ps != 1:
                raise StepFormatError("call", "alloc(0) is a page_size 1 call")
            ran, res = self._invoke("alloc(0)", lambda: a.alloc(0), m.classify_alloc(0))
            self._check_index_tensor("alloc(0)", res, 0)
        elif call in PAGED_CALLS:
            if self.ps == 1:
                raise StepFormatError("call", f"{call} of no requests is a paged call")
            self._check_page_count([], [], 0, call == "alloc_decode")
            cpu, last = self._t([], True), self._last_loc([])
            if call == "alloc_extend":
                fn = lambda: a.alloc_extend(none, cpu, none, cpu, last, 0)
            else:
                fn = lambda: a.alloc_decode(none, cpu, last)
            ran, res = self._invoke(f"{call} of no requests", fn, m.classify_paged(call))
            if ran and res is None:
                self._fail(Violation(names.CAPACITY, f"{call} of no requests returned None ({m.free_desc()})"))
            self._check_index_tensor(f"{call} of no requests", res, 0)
        elif call.endswith("segment"):
            if hasattr(a, call):
                self._invoke(f"{call}(empty, start_pos=0)", lambda: getattr(a, call)(none, start_pos=0), None)
        else:
            self._invoke(f"{call}(empty)", lambda: getattr(a, call)(none), None)
        self.labels["empty call"] += 1
        self._after_call([])

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

    def _own_merge(self) -> bool:
        """Whether the hybrid (or pure SWA) has a merge_and_sort_free of its own, not one
        inherited from the class its sub-allocators derive from: that one merges a free
        list the hybrid does not hold (sglang 0.5.23's wrappers inherit it and raise
        TypeError on their absent release_pages; its own code merges the sub-allocators)."""
        definer = next((c for c in type(self.alloc).__mro__ if "merge_and_sort_free" in vars(c)), None)
        return definer is not None and not any(isinstance(sub, definer) for sub in observe.sub_allocators(self.alloc))

    def _merge_sort(self, step: MergeSort) -> None:
        if self._own_merge():  # the target's own entry point
            self._cover("merge_and_sort_free", "hybrid" if not self.pure else "pure")
            self._invoke("merge_and_sort_free", self.alloc.merge_and_sort_free, None)
        else:  # the seed's hybrid has none: each sub-allocator's
            for sub in observe.sub_allocators(self.alloc):
                self._invoke("merge_and_sort_free", sub.merge_and_sort_free, None)
        self._after_call([])

    def _forget_rows(self) -> None:
        self._drop_rows(list(self.rows))
        self.ghosts = {}
        self.cache.clear()
        self.locks.clear()
        self.retracted.clear()

    def _clear(self, step: Clear) -> None:
        if self.model.group_open:
            self.labels["clear inside a group"] += 1
        # A clear wipes what a census would find (a leak, a stale peer): look first.
        self.census()
        self._invoke("clear", self.alloc.clear, None)
        self.model.clear()
        self._forget_rows()
        self.census()

    def _resize(self, step: Resize) -> None:
        cfg = types.SimpleNamespace(full_max_total_num_tokens=step.size, swa_max_total_num_tokens=step.size_swa)
        contract = self.model.classify_resize(step.size, step.size_swa)
        if contract is None:
            self.census()  # as before a clear: a resize starts the pools over
        ran, _ = self._invoke(f"resize({step.size}, {step.size_swa})", lambda: self.alloc.resize(cfg), contract)
        if ran:
            self.model.resize(step.size, step.size_swa)
            self._forget_rows()
            self.labels["resized"] += 1
            self.census()

    def _break(self, step: Break) -> None:
        """A deliberate contract break; the model must classify it, the target react as owed."""
        m, a, ps, kind = self.model, self.alloc, self.ps, step.kind
        if kind in PAGE_ID_BREAKS:
            self._break_page_ids(step)
            return
        row = self._row(step.rid) if kind in ROW_BREAKS else None
        t = self._t
        if kind == "free_unpaired":
            own = row.slots[row.shared :]
            slots = [s for s in own if s not in m.peer][:1] or own[:1]
            what, contract = "free", m.classify_free("free", slots, None, step.rid)
            fn = lambda: a.free(t(slots))
        elif kind == "segment_unpaired":
            lo = unpaired_segment(row, ps, m.peer)
            if lo is None:
                raise StepFormatError("rid", f"request {step.rid} has no page-aligned position without an SWA peer")
            if not hasattr(a, "free_swa_segment"):
                self.labels["contract break not expressible: no free_swa_segment"] += 1
                return
            slots = row.slots[lo : lo + ps]
            what, contract = "free_swa_segment", m.classify_free_swa_segment(slots, lo, step.rid)
            fn = lambda: a.free_swa_segment(self._holder(step.rid).view(lo, lo + len(slots)), start_pos=lo)
        elif kind == "free_full_paired":
            # A request finished with free_full although some positions keep SWA peers.
            if self._free_call("free_full", step.rid, row.shared, len(row.slots)):
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
            slots = row.slots[row.shared : row.shared + 1]
            what = "free" if slots[0] in m.peer else "free_full"  # the call that fits the slot
            contract = m.classify_free(what, slots, None, step.rid)
            fn = lambda: getattr(a, what)(t(slots))
        elif kind == "nested_group":
            what, contract, fn = "free_group_begin", m.classify_group_begin(), a.free_group_begin
        elif kind == "unaligned_segment":
            start = row.shared + 1
            slots = row.slots[start:]
            what, contract = "free_segment", m.classify_free("free_segment", slots, start, step.rid)
            fn = lambda: a.free_segment(t(slots), start_pos=start)
        elif kind in ("tail_batch", "tail_long"):
            bs, n = (2, 2) if kind == "tail_batch" else (1, 2)
            tail = 1 if kind == "tail_batch" else n + 1
            what, contract = "alloc_extend_swa_tail", m.classify_tail([0] * bs, [n] * bs, n * bs, tail)
            fn = lambda: a.alloc_extend_swa_tail(t([0] * bs), t([0] * bs, True), t([n] * bs), t([n] * bs, True), t([-1] * bs), n * bs, tail)
        elif kind == "paged_on_token":
            what, contract = "alloc_extend", m.classify_paged("alloc_extend")
            fn = lambda: a.alloc_extend(t([0]), t([0], True), t([1]), t([1], True), t([-1]), 1)
        elif kind == "decode_on_token":
            what, contract = "alloc_decode", m.classify_paged("alloc_decode")
            fn = lambda: a.alloc_decode(t([1]), t([1], True), t([-1]))
        elif kind == "tail_on_token":
            what, contract = "alloc_extend_swa_tail", m.classify_tail([0], [2], 2, 1)
            fn = lambda: a.alloc_extend_swa_tail(t([0]), t([0], True), t([2]), t([2], True), t([-1]), 2, 1)
        elif kind in ("pair_on_pure", "unpair_on_pure"):
            # Slot 1 pointing at itself: what the identity mapping already holds, so
            # only the refusal tells a rewrite apart.
            what = "set_full_to_swa_mapping" if kind == "pair_on_pure" else "clear_full_to_swa_mapping"
            contract = m.classify_mapping(what)
            if kind == "pair_on_pure":
                fn = lambda: a.set_full_to_swa_mapping(t([1]), t([1]))
            else:
                fn = lambda: a.clear_full_to_swa_mapping(t([1]))
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


    # ------------------------------------------------ sglang 0.5.23's segment and page-id frees
    def _evict_segment(self, step: EvictSegment) -> None:
        """free_swa_segment of positions lo..hi-1; free_swa where the target has none."""
        row = self._row(step.rid)
        if not row.shared <= step.lo < step.hi <= len(row.slots):
            raise StepFormatError("hi", f"positions {step.lo}..{step.hi - 1} outside request {step.rid}'s own {row.shared}..{len(row.slots) - 1}")
        if hasattr(self.alloc, "free_swa_segment"):
            ran = self._free_call("free_swa_segment", step.rid, step.lo, step.hi, start_pos=step.lo)
        else:
            ran = self._free_call("free_swa", step.rid, step.lo, step.hi)
        if ran:
            self.labels["window evicted by segment"] += 1
            if self.pure:
                row.slots[step.lo : step.hi] = [RELEASED] * (step.hi - step.lo)

    def _page_ids_call(self, what: str, pages: list[int], slots: list[int], contract: Contract | None) -> bool:
        """free_page_ids(pages) on the full pool; free of those pages' slots where the
        sub-allocator has no free_page_ids. True when it ran."""
        sub = self.alloc.full_attn_allocator
        if hasattr(sub, "free_page_ids"):
            fn = lambda: sub.free_page_ids(self._t(pages))
        else:
            every = [p * self.ps + i for p in pages for i in range(self.ps)]
            fn = lambda: sub.free(self._t(every))
        ran, _ = self._invoke(what, fn, contract)
        return ran

    def _free_pages(self, step: FreePages) -> None:
        """A cache-style free: the full pages under positions start.. by page id."""
        m = self.model
        row = self._row(step.rid)
        L = len(row.slots)
        if not row.shared <= step.start < L:
            raise StepFormatError("start", f"start {step.start} outside {row.shared}..{L - 1}")
        slots = [s for s in row.slots[step.start :] if s != RELEASED]
        pages = list(dict.fromkeys(s // self.ps for s in slots))
        contract = m.classify_free_page_ids(pages, slots, step.rid)
        if contract is None:
            for lo, hi in runs_of(row.slots[step.start :], lambda s: s != RELEASED):
                self._check_tags(step.rid, step.start + lo, row.slots[step.start + lo : step.start + hi], swa_too=False)
        if not self._page_ids_call(f"free_page_ids(request {step.rid}, positions {step.start}..{L - 1})", pages, slots, contract):
            return
        m.free_page_ids(slots)
        if m.group_open:
            self.labels["group holding a free_page_ids"] += 1
        touched = layout.expand_to_pages(slots, self.ps) if self.ps > 1 else slots
        self._after_call(self._below_sentinel(touched))
        self.labels["freed by page id"] += 1
        if step.start == row.shared:
            self._retire(step.rid)
        else:
            row.overwrite(step.start)
            row.slots = row.slots[: step.start]

    def _break_page_ids(self, step: Break) -> None:
        """free_page_ids naming a page twice, page 0, or a free page."""
        m, kind = self.model, step.kind
        if not hasattr(self.alloc.full_attn_allocator, "free_page_ids"):
            self.labels["contract break not expressible: no free_page_ids"] += 1
            return
        if kind == "page_ids_twice":
            row = self._row(step.rid)
            last = [s for s in row.slots if s != RELEASED][-1:]
            if not last:
                raise StepFormatError("rid", f"request {step.rid} holds no slot")
            pages = [last[0] // self.ps] * 2
        elif kind == "page_ids_padding":
            pages = [0]
        else:
            page = next(iter(m.full.free), None)
            if page is None:
                raise StepFormatError("kind", "page_ids_free needs a free page")
            pages = [page]
        contract = m.classify_free_page_ids(pages, [])
        self._page_ids_call(f"free_page_ids({pages}) ({kind})", pages, [], contract)


def unpaired_segment(row: _Row, ps: int, peer: dict[int, int]) -> int | None:
    """The first page-aligned position of the row's own part whose full slot has no SWA
    peer (window-evicted, or before an SWA tail): free_swa_segment from there breaks
    SPEC 3.2's swa.peer_mapped. None where there is none. Reads one position a page."""
    for lo in range(-(-row.shared // ps) * ps, len(row.slots), ps):
        if row.slots[lo] != RELEASED and row.slots[lo] not in peer:
            return lo
    return None


def census_every_for(config: dict, base: int = 16) -> int:
    """Steps between periodic censuses for this configuration: `base`, and 16 times
    that above LARGE_POOL_PAGES full pages, where the census is a cost the step budget
    cannot carry (per-step checks still cover what each call touched). The machine
    and every replay keep the same schedule, so a trace trips the invariant it was
    found with."""
    pages = int(config["size"]) // int(config["page_size"])
    return base if pages <= LARGE_POOL_PAGES else base * 16


def replay(config: dict, steps: list[Step], target, census_every: int | None = None, started=None, skip_device_asserts=False) -> Lockstep:
    """Run a whole trace and the closing census; raises LockstepFailure on a divergence,
    StepFormatError (with `.index`) on a step that cannot apply. `started(ls)`, when
    given, sees the driver before the first step (to read it after a failure).
    A replay sends even a break whose guard kills the process (it runs in a child
    process); `skip_device_asserts=None` holds those back as the machine does."""
    if census_every is None:
        census_every = census_every_for(config)
    ls = Lockstep(config, target, census_every=census_every, skip_device_asserts=skip_device_asserts)
    if started is not None:
        started(ls)
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
                    # In the searching process, as the machine ran: no device-assert breaks.
                    replay(config, candidate, target, skip_device_asserts=None)
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
