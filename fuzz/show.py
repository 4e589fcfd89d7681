"""`python -m fuzz show`: the pages of both pools and the history of the slots a failure involves.

A trace is replayed step by step on a `properties.lockstep.Lockstep` up to its failing
step (or the step asked for). There the model's state (owner of each page, free,
padding, held by an open free group) is read next to the target's (its free lists and
its mapping), and the pages where they disagree are marked. The pages drawn are the
involved ones: those the failure's details name, those the differences name, those
the last steps touched, and their SWA peers; the rest of a pool is folded into runs
counted from the model's free set, so a pool of a million slots costs what its free
list costs, once, and never one element per slot.

With a page file asked for, the trace is replayed a second time to sample the involved
pages after every step (a timeline) and to take the map of the step before the failure.
Everything is read through public attributes, `properties.observe` and the model's
read-only accessors; the driver runs unchanged.
"""

from __future__ import annotations

import array
import bisect
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fuzz import trace as trace_mod
from properties import observe
from properties.lockstep import RELEASED, Lockstep, LockstepFailure, check_config
from properties.steps import Break, GroupEnd, Step, StepFormatError
from reference import Model

ROW = 16  # pages per row of a map
NEIGHBOURS = 2  # pages drawn on each side of an involved page
WHOLE_ROWS = 16  # a pool of at most this many rows is drawn whole
MAX_INVOLVED = 40  # involved pages per pool, before their peers
MAX_PEERS = 24  # peer pages added per pool
LAST_STEPS = 3  # the steps whose touched pages count as involved
MAX_SLOT_ROWS = 16  # slots the failure names that get a timeline row of their own


# ------------------------------------------------------------------ states
@dataclass(frozen=True)
class PageState:
    """One page of one pool, as the model has it and as the target shows it."""

    side: str  # "full" or "swa"
    page: int
    model: str  # "padding", "free", "held" (an open free group releases it), "owned", "beyond"
    owners: tuple[int, ...] = ()
    live: int = 0  # live slots on the page (model)
    peers: tuple[int, ...] = ()  # model: SWA pages of a full page's peers, full pages pairing into an SWA page
    target_free: bool | None = None  # in the target's free or staged list; None when not read
    target_peers: tuple[int, ...] | None = None  # full pages only: SWA pages the target's mapping names
    differs: tuple[str, ...] = ()  # how model and target disagree on this page

    @property
    def symbol(self) -> str:
        """At most three characters: P padding, . free, H held, rN request N, r+ several,
        o owned by no live request, x beyond the pool's current size."""
        if self.model == "owned":
            if len(self.owners) > 1:
                return "r+"
            if self.owners:
                r = self.owners[0]
                return f"r{r}" if 0 <= r < 100 else "r#"
            return "o"
        return {"padding": "P", "free": ".", "held": "H", "beyond": "x"}[self.model]

    def state(self) -> str:
        """The model's state in words: free, padding, held, or who owns it."""
        if self.model == "owned":
            return "owned by " + (", ".join(f"request {r}" for r in self.owners) or "no live request")
        if self.model == "held":
            return "held by the open free group (released at its end)"
        if self.model == "beyond":
            return "beyond the pool's current size"
        return self.model

    def describe(self) -> str:
        """A sentence for a tooltip or a table row."""
        text = self.state()
        if self.model == "owned":
            text += f", {self.live} live slot{'s' * (self.live != 1)}"
        if self.peers:
            other = "SWA" if self.side == "full" else "full"
            text += f"; {'peers on' if self.side == 'full' else 'paired from'} {other} pages {join_ints(self.peers)}"
        if self.target_free is not None:
            text += f"; target: {'free' if self.target_free else 'not free'}"
        if self.target_peers is not None and self.target_peers != self.peers:
            text += f", mapping names SWA pages {join_ints(self.target_peers) or 'none'}"
        return text


@dataclass(frozen=True)
class SlotState:
    """One slot a failure names: live or not, its request, its peer (model and target)."""

    side: str
    slot: int
    live: bool
    owner: int | None
    peer: int  # full slot: the model's mapping entry; SWA slot: the full slot paired into it (0: none)
    target_peer: int | None = None  # full slot: mapping[slot] as the target holds it

    @property
    def symbol(self) -> str:
        if not self.live:
            return "."
        return f"r{self.owner}" if self.owner is not None and 0 <= self.owner < 100 else "o"

    @property
    def differs(self) -> bool:
        return self.target_peer is not None and self.target_peer != self.peer

    def describe(self) -> str:
        text = (f"live, request {self.owner}" if self.owner is not None else "live") if self.live else "not live"
        if self.side == "full":
            text += f"; peer {self.peer or 'none'}"
            if self.target_peer is not None and self.target_peer != self.peer:
                text += f", target mapping {self.target_peer}"
        elif self.peer:
            text += f"; paired from full slot {self.peer}"
        return text


@dataclass(frozen=True)
class Fold:
    """Rows of pages not drawn: [lo, hi) with the model's counts and the target's."""

    lo: int
    hi: int
    free: int
    held: int
    target_free: int
    differ: int

    @property
    def owned(self) -> int:
        return self.hi - self.lo - self.free - self.held


@dataclass
class PoolMap:
    side: str  # "full" or "swa"
    title: str
    page_size: int
    num_pages: int  # pages 1..num_pages hold KV; page 0 is padding
    extent: int  # pages 0..extent-1 are laid out (beyond num_pages only where something is there)
    pages: dict[int, PageState]  # every drawn page
    layout: list[int | Fold]  # row starts (multiples of ROW) and folded runs, in order
    involved: list[int]  # pages the view is about, most telling first
    model_free: int
    target_free: int | None
    differing: int  # pages where model and target disagree, drawn or folded


@dataclass
class Snapshot:
    """Both pools at one point of the run."""

    index: int  # the step after which this was taken; -1: after construction
    label: str
    pools: list[PoolMap]
    sizes: dict[str, tuple[int, int | None]]  # name -> (model, target)
    group: tuple[bool, bool]  # free group open: (model, target)
    req_slots: list[str] | None  # ring mode: each request slot, "." free or "rN"
    slots: list[SlotState] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class TimelineRow:
    key: str  # "full page 3", "swa slot 17"
    cells: list[PageState | SlotState]  # one per step, 0..index


@dataclass
class Shown:
    """What `show` found: the failure, the map at the step shown, and (for a page) the
    map before it and the timeline of the involved pages and slots."""

    trace: trace_mod.Trace
    target: str
    device: str
    outcome: str
    expected: str
    message: str  # the failure as the driver says it, or "" for a pass
    failing: int | None  # the failing step; len(steps) for the closing census; -1 at construction
    index: int  # the step shown (the state after it); -1: after construction
    at: Snapshot | None
    before: Snapshot | None = None
    timeline: list[TimelineRow] = field(default_factory=list)
    unreadable: str | None = None  # why there is no map

    @property
    def matches(self) -> bool:
        return self.outcome == self.expected


def _tensor(ints) -> torch.Tensor:
    """An int64 tensor of a set's or dict's ints; through array, which reads them at C
    speed (torch.tensor of a list costs several times more on a million)."""
    buf = array.array("q", ints)
    return torch.frombuffer(buf, dtype=torch.int64).clone() if buf else torch.zeros(0, dtype=torch.int64)


def join_ints(values) -> str:
    return ",".join(str(v) for v in values)


# --------------------------------------------------------- what is involved
_NAMED = re.compile(r"\b(slots?|pages?)\s+(\[[^\]]*\]|\d+)|mapping\[(\d+)\]")
_SIDE = re.compile(r"\b(full|SWA)\b")


def named_in(details: list[str], page_size: int, pure: bool) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """The pages and slots a failure's details name, by pool: ({side: pages}, {side: slots}).

    A number counts for the pool named last before it ("SWA pages [2]", "full
    (request 0, position 3) slot 9"); with none named, the full pool."""
    pages: dict[str, list[int]] = {"full": [], "swa": []}
    slots: dict[str, list[int]] = {"full": [], "swa": []}
    for text in details:
        for m in _NAMED.finditer(text):
            sides = _SIDE.findall(text[: m.start()])
            side = "swa" if sides and sides[-1] == "SWA" and not pure else "full"
            if m.group(3) is not None:
                slots["full"].append(int(m.group(3)))
                continue
            numbers = [int(x) for x in re.findall(r"-?\d+", m.group(2))]
            if m.group(1).startswith("page"):
                pages[side] += numbers
            else:
                slots[side] += numbers
    for side in pages:
        pages[side] += [s // page_size for s in slots[side] if s >= 0]
    return pages, slots


def _step_rids(step: Step) -> list[int]:
    rids = []
    if hasattr(step, "reqs"):
        rids += [r for r, _ in step.reqs]
    if hasattr(step, "rids"):
        rids += list(step.rids)
    if getattr(step, "rid", -1) >= 0:
        rids.append(step.rid)
    return rids


def touched(ls: Lockstep, step: Step) -> tuple[set[int], set[int]]:
    """The full and SWA pages a step's requests hold right now (call before and after
    the step): O(the rows the step names)."""
    m, ps = ls.model, ls.ps
    full, swa = set(), set()
    slots: list[int] = []
    for r in _step_rids(step):
        row = ls.rows.get(r)
        if row is not None:
            slots += row.slots
    if isinstance(step, Break):
        for ghost in ls.ghosts.values():
            slots += ghost
    for s in slots:
        if s == RELEASED or s < 0:
            continue
        full.add(s // ps)
        p = m.peer.get(s)
        if p is not None:
            swa.add(p // ps)
    if isinstance(step, GroupEnd):
        full.update(m.held_full)
        swa.update(m.held_swa)
    if m.pure:
        full |= swa
        swa = set()
    return full, swa


# ------------------------------------------------------------------ reading
class _Pools:
    """Model and target side by side at one point of the run."""

    def __init__(self, model: Model, alloc, config: dict):
        self.model, self.alloc, self.config = model, alloc, config
        self.ps = model.page_size
        self.sides = ["full"] if model.pure or model.ring else ["full", "swa"]

    def pool(self, side: str):
        return self.model.full if side == "full" else self.model.swa

    def sub(self, side: str):
        return self.alloc.full_attn_allocator if side == "full" else self.alloc.swa_attn_allocator

    def held(self, side: str) -> list[int]:
        return self.model.held_full if side == "full" else self.model.held_swa

    def title(self, side: str) -> str:
        if self.model.pure:
            return "pool (pure SWA: the only pool)"
        return "full pool" if side == "full" else "SWA pool"

    def page_state(self, side: str, page: int, target_free: bool | None, target_peers=None, differs=()) -> PageState:
        m, pool, ps = self.model, self.pool(side), self.ps
        if page == 0:
            kind = "padding"
        elif page > pool.num_pages or page < 0:
            kind = "beyond"
        elif page in pool.free:
            kind = "free"
        elif page in self.held(side):
            kind = "held"
        else:
            kind = "owned"
        live = pool.used.get(page, 0)
        owners = tuple(m.page_owners(side, page)) if kind == "owned" and live else ()
        peers: set[int] = set()
        if live and not m.pure and not m.ring and page >= 0:
            table = m.peer if side == "full" else m.rev
            for s in range(page * ps, page * ps + ps):
                other = table.get(s)
                if other is not None:
                    peers.add(other // ps)
        return PageState(side, page, kind, owners, live, tuple(sorted(peers)), target_free,
                         None if target_peers is None else tuple(target_peers), tuple(differs))

    def target_peer_pages(self, pages: list[int]) -> dict[int, tuple[int, ...]]:
        """The SWA pages the target's mapping names for each full page (O(pages * page_size))."""
        if self.model.pure or self.model.ring or not pages:
            return {}
        ps, limit = self.ps, self.model.mapping_len - 1
        slots = [s for p in pages for s in range(p * ps, p * ps + ps) if 0 <= s < limit]
        got = dict(zip(slots, observe.peers(self.alloc, slots)))
        return {p: tuple(sorted({got[s] // ps for s in range(p * ps, p * ps + ps) if got.get(s, 0) > 0})) for p in pages}

    def slot_state(self, side: str, slot: int, target_peer: int | None = None) -> SlotState:
        m = self.model
        if side == "full" or m.pure:
            return SlotState("full", slot, slot in m.full.live, m.full.owner.get(slot), m.peer_of(slot) if not m.pure else 0, target_peer)
        f = m.rev.get(slot, 0)
        return SlotState("swa", slot, slot in m.swa.live, m.full.owner.get(f) if f else None, f)

    def slot_states(self, slots: list[tuple[str, int]]) -> list[SlotState]:
        m = self.model
        full = [s for side, s in slots if side == "full" and 0 <= s < m.mapping_len - 1]
        got = dict(zip(full, observe.peers(self.alloc, full))) if full and not m.pure else {}
        return [self.slot_state(side, s, got.get(s)) for side, s in slots]

    # -- the once-per-view comparison: O(free list + mapping), vectorized
    def differences(self) -> tuple[dict[str, dict[int, list[str]]], list[str]]:
        """Per pool, the pages where the target's free list or mapping disagrees with the
        model (the first few with their reasons; all of them in a mask, for the folded
        counts), and lines for what differs outside the pools."""
        m, ps = self.model, self.ps
        limit = 4 * MAX_INVOLVED
        out: dict[str, dict[int, list[str]]] = {side: {} for side in self.sides}
        self.masks: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.outside: dict[str, set[int]] = {}
        for side in self.sides:
            pool, diff = self.pool(side), out[side]
            n = pool.num_pages + 1
            listed = observe.free_page_tensor(self.sub(side)).cpu()
            inside = (listed >= 0) & (listed < n)
            counts = torch.bincount(listed[inside], minlength=n)
            beyond = Counter(listed[~inside].tolist())  # pages a correct free list never holds
            mfree = torch.zeros(n, dtype=torch.bool)
            if pool.free:
                mfree[_tensor(pool.free)] = True
            tfree = counts > 0
            dmask = (tfree != mfree) | (counts > 1)
            self.masks[side] = (mfree, tfree, dmask)
            self.outside[side] = set(beyond)
            held = set(self.held(side))
            for p in (counts > 1).nonzero().flatten()[:limit].tolist():
                diff.setdefault(p, []).append(f"{int(counts[p])} times in the target's free list")
            for p, k in list(beyond.items())[:limit]:
                diff.setdefault(p, []).append(f"in the target's free list{f' {k} times' if k > 1 else ''}, beyond the pool's {pool.num_pages} pages")
            for p in (tfree & ~mfree).nonzero().flatten()[:limit].tolist():
                if p == 0:
                    why = "the padding page is in the target's free list"
                elif p in held:
                    why = "free in the target, held by the open free group in the model"
                else:
                    why = "free in the target, owned in the model"
                diff.setdefault(p, []).append(why)
            for p in (mfree & ~tfree).nonzero().flatten()[:limit].tolist():
                diff.setdefault(p, []).append("free in the model, missing from the target's free list")
        lines: list[str] = []
        if not m.pure:
            got = observe.mapping_tensor(self.alloc).to("cpu", torch.int64)
            if got.numel() != m.mapping_len:
                lines.append(f"mapping has {got.numel()} entries, the model {m.mapping_len}")
                return out, lines
            if int(got[-1]) != -1:
                lines.append(f"the mapping's sentinel (last entry) is {int(got[-1])}, not -1")
            want = torch.zeros(m.mapping_len - 1, dtype=torch.int64)
            for table in (m.stale, m.peer):  # a live peer overrides a stale entry, as in the census
                if table:
                    want[_tensor(table)] = _tensor(table.values())
            wrong = (got[:-1] != want).nonzero().flatten()
            if wrong.numel():
                g, w = got[wrong], want[wrong]
                self._mark("full", wrong // ps)
                if "swa" in out:
                    self._mark("swa", torch.cat([g[g > 0], w[w > 0]]) // ps)
                for f, gf, wf in zip(wrong[:limit].tolist(), g[:limit].tolist(), w[:limit].tolist()):
                    out["full"].setdefault(f // ps, []).append(f"mapping[{f}] is {gf}, model says {wf}")
                    if "swa" in out:
                        for slot, who in ((gf, "target"), (wf, "model")):
                            if slot > 0:
                                out["swa"].setdefault(slot // ps, []).append(f"the {who} pairs full slot {f} into slot {slot}")
                lines.append(f"{wrong.numel()} mapping entries differ (first: mapping[{int(wrong[0])}] is {int(g[0])}, model says {int(w[0])})")
        return out, lines

    def _mark(self, side: str, pages: torch.Tensor) -> None:
        dmask = self.masks[side][2]
        dmask[pages[(pages >= 0) & (pages < dmask.numel())]] = True

    def differing(self, side: str) -> int:
        return int(self.masks[side][2].sum()) + len(self.outside[side])

    def target_free_count(self, side: str) -> int:
        return int(self.masks[side][1].sum()) + len(self.outside[side])

    def target_free(self, side: str, pages: list[int]) -> dict[int, bool]:
        tfree = self.masks[side][1]
        n = tfree.numel()
        inside = [p for p in pages if 0 <= p < n]
        got = dict(zip(inside, tfree[torch.tensor(inside, dtype=torch.int64)].tolist())) if inside else {}
        return {p: got.get(p, p in self.outside[side]) for p in pages}

    def fold_counts(self, side: str):
        """Counts over [lo, hi) page runs from prefix sums of the masks: O(pages) once,
        vectorized; then O(1) per run."""
        mfree, tfree, dmask = self.masks[side]
        sums = [torch.cat([torch.zeros(1, dtype=torch.int64), x.to(torch.int64).cumsum(0)]) for x in (mfree, tfree, dmask)]
        n = mfree.numel()
        held = sorted(self.held(side))

        def fold(lo: int, hi: int) -> Fold:
            a, b = min(lo, n), min(hi, n)
            f, t, d = (int(c[b] - c[a]) for c in sums)
            return Fold(lo, hi, f, bisect.bisect_left(held, hi) - bisect.bisect_left(held, lo), t, d)

        return fold


def _layout(extent: int, involved: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """Row starts to draw and [lo, hi) runs of rows to fold, for pages 0..extent-1."""
    nrows = -(-extent // ROW)
    if nrows <= WHOLE_ROWS:
        return [r * ROW for r in range(nrows)], []
    keep = {0}
    for p in involved:
        for q in (p - NEIGHBOURS, p, p + NEIGHBOURS):
            if 0 <= q < extent:
                keep.add(q // ROW)
    rows = sorted(keep)
    folds = []
    prev = -1
    for r in rows + [nrows]:
        if r > prev + 1:
            folds.append(((prev + 1) * ROW, min(r * ROW, extent)))
        prev = r
    return [r * ROW for r in rows], folds


def _pick(groups: list[list[int]], limit: int) -> list[int]:
    seen: dict[int, None] = {}
    for g in groups:
        for p in g:
            if len(seen) >= limit:
                return list(seen)
            seen.setdefault(p, None)
    return list(seen)


def snapshot(
    model: Model,
    alloc,
    config: dict,
    index: int,
    label: str,
    hints: dict[str, list[list[int]]],
    slots: list[tuple[str, int]] = (),
    rows: dict | None = None,
) -> Snapshot:
    """The map of both pools now: the pages in `hints` (per pool, groups in order of
    importance) plus the pages that differ, and their peers; everything else folded."""
    r = _Pools(model, alloc, config)
    diffs, lines = r.differences()
    base = {side: [p for p in _pick([sorted(diffs[side])] + hints.get(side, []), MAX_INVOLVED) if p >= 0] for side in r.sides}
    # The pairs are what a reader follows: the SWA pages the involved full pages pair
    # into (as the model and as the target's mapping say), and the full pages that
    # pair into the involved SWA pages.
    peers: dict[str, list[int]] = {side: [] for side in r.sides}
    if "swa" in base:
        tpeers = r.target_peer_pages(base["full"])
        for p in base["full"]:
            peers["swa"] += [*r.page_state("full", p, None).peers, *tpeers.get(p, ())]
        for p in base["swa"]:
            peers["full"] += r.page_state("swa", p, None).peers
    pools = []
    for side in r.sides:
        pool, diff = r.pool(side), diffs[side]
        involved = _pick([base[side], sorted(set(peers[side]))], MAX_INVOLVED + MAX_PEERS)
        extent = max([pool.num_pages + 1] + [p + 1 for p in involved])
        row_starts, fold_runs = _layout(extent, involved)
        drawn = [p for start in row_starts for p in range(start, min(start + ROW, extent))]
        tfree = r.target_free(side, drawn)
        tpeers = r.target_peer_pages([p for p in drawn if r.pool(side).used.get(p, 0) or p in diff]) if side == "full" else {}
        pages = {p: r.page_state(side, p, tfree[p], tpeers.get(p), diff.get(p, ())) for p in drawn}
        fold = r.fold_counts(side)
        layout: list[int | Fold] = [*row_starts, *(fold(lo, hi) for lo, hi in fold_runs)]
        layout.sort(key=lambda x: x if isinstance(x, int) else x.lo)
        pools.append(PoolMap(side, r.title(side), r.ps, pool.num_pages, extent, pages, layout, involved,
                             len(pool.free), r.target_free_count(side), r.differing(side)))
    sizes_t = observe.sizes(alloc)
    sizes = {k: (v, sizes_t.get(k)) for k, v in model.sizes().items()}
    group = (model.group_open, getattr(alloc, "free_group", None) is not None)
    req = None
    if model.ring:
        holder = {row.req_slot: rid for rid, row in (rows or {}).items() if row.req_slot is not None}
        req = ["." if s in model.req_free else (f"r{holder[s]}" if s in holder else "o") for s in range(model.req_slots)]
    snap = Snapshot(index, label, pools, sizes, group, req, r.slot_states(list(slots)), lines)
    return snap


# ------------------------------------------------------------------ replaying
class _Run:
    """A trace replayed step by step, as `properties.lockstep.replay` does, keeping the
    driver at hand between steps."""

    def __init__(self, trace: trace_mod.Trace, factory, device: str):
        self.trace, self.factory = trace, factory
        self.config = check_config(dict(trace.config, device=device))
        self.ls: Lockstep | None = None
        self.model: Model | None = None
        self.alloc = None
        self.failure: LockstepFailure | None = None
        self.crash: str | None = None
        self.unsupported: str | None = None
        self.failed_at: int | None = None  # step index of the failure; -1 at construction
        self.touched: list[tuple[set[int], set[int]]] = []

    def start(self) -> bool:
        try:
            self.ls = Lockstep(self.config, self.factory)
        except LockstepFailure as e:
            # The census after construction failed: the pools as built are the state.
            self.failure, self.failed_at = e, -1
            c = self.config
            try:
                self.alloc = self.factory(dict(c))
            except Exception as again:  # it built once; a second build that fails is a crash
                self.crash = f"{type(again).__name__}: {again}"
                return False
            self.model = Model(c["kind"], c["size"], c["size_swa"], c["page_size"], c["need_sort"], c["ring_size"], c["req_slots"])
            return False
        except NotImplementedError as e:
            self.unsupported = f"the target does not build this configuration: {e}"
            return False
        except Exception as e:  # the target failed while being built
            self.crash, self.failed_at = f"{type(e).__name__}: {e}", -1
            return False
        self.model, self.alloc = self.ls.model, self.ls.alloc
        return True

    def step(self, i: int) -> bool:
        """Run step i; False when the run stops here (a failure or a crash)."""
        step = self.trace.steps[i]
        before = touched(self.ls, step)
        try:
            self.ls.run(step)
        except LockstepFailure as e:
            self.failure, self.failed_at = e, i
        except StepFormatError as e:
            raise trace_mod.TraceError(self.trace.path or self.trace.name, str(e).split(": ", 1)[1], index=i, field=e.field) from None
        except Exception as e:  # an escape from the target is a crash, as in replay
            self.crash, self.failed_at = f"{type(e).__name__}: {e}", i
        after = touched(self.ls, step)
        self.touched.append((before[0] | after[0], before[1] | after[1]))
        return self.failed_at is None

    def close(self) -> None:
        """The closing census, as replay runs it, without moving the driver's counters."""
        v = self.ls.census_violations()
        if v:
            n = len(self.trace.steps)
            self.failure = LockstepFailure(v[0].invariant, n, None, [str(x) for x in v])
            self.failed_at = n

    @property
    def outcome(self) -> str:
        if self.unsupported:
            return trace_mod.UNSUPPORTED
        if self.crash:
            return trace_mod.CRASH
        return self.failure.invariant if self.failure else trace_mod.PASS

    @property
    def message(self) -> str:
        if self.unsupported:
            return self.unsupported
        if self.crash:
            return self.crash
        return str(self.failure) if self.failure else ""


def _label(trace: trace_mod.Trace, index: int) -> str:
    if index < 0:
        return "after construction"
    return f"after step {index}: {trace.steps[index]!r}"


def _hints(run: _Run, upto: int, named: dict[str, list[int]]) -> dict[str, list[list[int]]]:
    """Involved pages by pool, most telling first: named by the failure, touched by the
    step shown, then by the steps before it."""
    out: dict[str, list[list[int]]] = {"full": [sorted(named["full"])], "swa": [sorted(named["swa"])]}
    for i in range(upto, max(-1, upto - LAST_STEPS), -1):
        if i < len(run.touched):
            full, swa = run.touched[i]
            out["full"].append(sorted(full))
            out["swa"].append(sorted(swa))
    return out


def show(trace: trace_mod.Trace, factory, target: str, device: str = "cpu", step: int | None = None, page: bool = False) -> Shown:
    """Replay `trace` on `factory` to its failing step (or to `step`) and read the map
    there; with `page`, also the step before and the timeline of the involved pages."""
    n = len(trace.steps)
    run = _Run(trace, factory, device)
    started = run.start()
    shown_at = -1
    if started:
        stop = n - 1 if step is None else step
        for i in range(stop + 1):
            if not run.step(i):
                break
        shown_at = run.failed_at if run.failed_at is not None else stop
        if run.failed_at is None and step is None:
            run.close()
            shown_at = n - 1
    ps = run.config["page_size"]
    pure = run.config["kind"] == "pure_swa"
    details = run.failure.details if run.failure is not None and (step is None or run.failed_at is not None) else []
    named, named_slots = named_in(details, ps, pure)
    result = Shown(trace, target, device, run.outcome, trace.expected_on(target), run.message, run.failed_at, shown_at, None)
    if run.unsupported or run.model is None:
        return result
    slot_keys = [(side, s) for side in ("full", "swa") for s in dict.fromkeys(named_slots[side]) if s >= 0][:MAX_SLOT_ROWS] if ps > 1 else []
    rows = run.ls.rows if run.ls is not None else {}
    try:
        result.at = snapshot(run.model, run.alloc, run.config, shown_at, _label(trace, shown_at), _hints(run, shown_at, named), slot_keys, rows)
    except Exception as e:
        if not run.crash:
            raise
        # A target that crashed may not answer any more; the crash is the outcome.
        result.unreadable = f"the target's state cannot be read after its crash ({type(e).__name__}: {e})"
        return result
    if run.ls is not None and run.ls.restarted_because:
        result.at.notes.append(f"the run restarted on a fresh allocator and model after {run.ls.restarted_because}")
    if run.crash:
        result.at.notes.append(f"the target crashed: {run.crash}")
    if step is not None and run.failed_at is None:
        # The rest of the trace decides the exit code, as replay would.
        for i in range(step + 1, n):
            if not run.step(i):
                break
        if run.failed_at is None:
            run.close()
        result.outcome, result.message, result.failing = run.outcome, run.message, run.failed_at
    if page and shown_at >= 0:
        _history(result, factory, device, slot_keys)
    return result


def _history(result: Shown, factory, device: str, slot_keys: list[tuple[str, int]]) -> None:
    """Replay again up to the step shown: the involved pages and slots after every step,
    and the map after the step before it (same pages, so the two line up)."""
    trace, at = result.trace, result.at
    run = _Run(trace, factory, device)
    if not run.start():
        return
    keys = [(pm.side, p) for pm in at.pools for p in pm.involved]
    rows = {f"{side} page {p}": TimelineRow(f"{side} page {p}", []) for side, p in keys}
    rows.update({f"{side} slot {s}": TimelineRow(f"{side} slot {s}", []) for side, s in slot_keys})
    hints = {pm.side: [pm.involved] for pm in at.pools}
    if result.index == 0:
        result.before = snapshot(run.model, run.alloc, run.config, -1, _label(trace, -1), hints, slot_keys, run.ls.rows)
    for i in range(result.index + 1):
        went_on = run.step(i)
        r = _Pools(run.model, run.alloc, run.config)
        try:
            sampled = []
            for side in r.sides:
                pages = [p for s, p in keys if s == side]
                free = observe.free_mask(r.sub(side), pages)
                tpeers = r.target_peer_pages(pages) if side == "full" else {}
                sampled += [(f"{side} page {p}", r.page_state(side, p, f, tpeers.get(p))) for p, f in zip(pages, free)]
            sampled += [(f"{st.side} slot {st.slot}", st) for st in r.slot_states(slot_keys)]
        except Exception:
            if not run.crash:
                raise
            break  # the target crashed in this step and cannot be read: the timeline ends before it
        for key, cell in sampled:
            rows[key].cells.append(cell)
        if i == result.index - 1:
            result.before = snapshot(run.model, run.alloc, run.config, i, _label(trace, i), hints, slot_keys, run.ls.rows)
        if not went_on:
            break
    result.timeline = list(rows.values())


# ---------------------------------------------------------------- the page
def page_path(trace_path: str | Path) -> Path:
    """Where the page for a trace goes: beside it, the same name with .html."""
    return Path(trace_path).with_suffix(".html")


def page_beside(trace_path: str | Path, target: str, device: str, timeout_s: float = 300.0) -> tuple[Path | None, str | None]:
    """Write the page for a saved trace beside it, from a child process (a target that
    kills its process then loses the page, not the campaign). Returns (path, None) or
    (None, why not)."""
    out = page_path(trace_path)
    cmd = [sys.executable, "-m", "fuzz", "show", str(trace_path), "--target", target, "--device", device,
           "--html", str(out), "--color", "never"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"show took longer than {timeout_s:g} s"
    if r.returncode not in (0, 1) or not out.exists():
        tail = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
        return None, tail
    return out, None
