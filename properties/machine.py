"""The hypothesis state machine: a serving scheduler's workload, driven through the
lockstep driver.

Each rule is one thing a scheduler does (a prefill batch, a decode batch, a window
eviction, a retract, a cache eviction, ...). Its choices are drawn from the current
state (`data.draw` over the live requests, entries and positions), so a shrink keeps
what it targets, and a rule is enabled only where the state lets it act (its
precondition). The driver runs each step on the model and the target and compares.
Hypothesis's own stateful rule selection is swarm testing: each run switches a
random subset of rules off.

The workload has no knowledge of any seeded bug: its shapes come from what a
scheduler sends (SPEC 4.1), at every scale from a pool of two pages to 100,000+
slots.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import event, note, reject
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from properties.differential import Differential
from properties.lockstep import RELEASED, Lockstep, census_every_for, runs_of, unpaired_segment
from properties.steps import (
    BREAKS, EMPTY_CALLS, GUARD_BREAKS, NEW, OTHER_BREAKS, PAGE_ID_BREAKS, PAGED_CALLS, TOKEN_CALLS, AdmitTail, Break, CacheFree, Clear, Decode,
    DropTail, Empty, EvictSegment, FreePages,
    Evict, Finish, GroupBegin, GroupEnd, MergeSort, Prefill, Repair, Resize, Resume, Retract, Step,
)
from properties.targets import Target, resolve, unrefused_breaks
from reference.layout import new_pages, pages_spanned

# Every coverage label and every (method, argument shape) cell any run in this
# process reached, for the closing summaries.
LABELS_SEEN: Counter = Counter()
SHAPES_SEEN: Counter = Counter()

# Page size 1 (the token allocators) is as much code as every paged size together.
# Nothing in the API asks for a power of two, and an allocator's page arithmetic
# often has a shift-and-mask path for those beside the general one: 3 and 48 take it.
PAGE_SIZES = (1, 1, 1, 1, 1, 2, 3, 4, 8, 16, 48, 64, 256)
# Pools: a few pages (they run out), a serving pool, production scale.
SCALES = ("tiny", "tiny", "tiny", "medium", "large")
LARGE_SLOTS = 131072  # a large pool holds a quarter of this to all of it: > 70,000 pages at page size 1
BATCH_MAX = 16
BUSY_MAX = 320
DECODE_MAX = 256
DECODE_RUN = 64
DECODE_RUN_POSITIONS = 2048


def power_band(e: int, top: int | None = None) -> st.SearchStrategy[int]:
    """An integer from 2^e to 2^(e+1) - 1, at most `top`."""
    hi = 2 ** (e + 1) - 1
    return st.integers(2**e, hi if top is None else min(hi, top))


@st.composite
def configs(draw, device: str = "cpu", fixed: dict | None = None, serving: bool = False) -> dict:
    """A configuration of SPEC 4.1, from pools that run out to production scale.

    `fixed` pins keys; the others are drawn to fit them (sizes are whole pages of a
    fixed page size, pure SWA only at page size 1). `serving`: a pool for a server
    that runs dozens or hundreds of requests at once: small, serving or production
    scale, one in three each (not three in five small, as for an idle server)."""
    fixed = fixed or {}
    kinds = ("hybrid", "hybrid", "hybrid") + (("pure_swa",) if fixed.get("page_size", 1) == 1 else ())
    kind = fixed.get("kind") or draw(st.sampled_from(kinds))
    ps = fixed.get("page_size") or (1 if kind == "pure_swa" else draw(st.sampled_from(PAGE_SIZES)))
    scale = draw(st.sampled_from(("tiny", "medium", "large") if serving else SCALES))
    if scale == "tiny":
        pages = draw(st.integers(2, 12))
        swa_pages = draw(st.integers(2, 12))
    elif scale == "medium":
        # Spread over each power of two from 64 to 8191 pages (no more slots than a
        # large pool): a fault that starts at a table's or a dtype's bound (2^12
        # pages, 2^15 slots, ...) sits anywhere between the round sizes.
        top = max(64, LARGE_SLOTS // ps)
        e = draw(st.integers(6, max(6, min(12, top.bit_length() - 1))))
        pages = draw(power_band(e, top))
        swa_pages = draw(st.integers(16, pages))
    else:
        # One band in three each: 2^15 to 2^16 slots, 2^16 to 2^17, and the top
        # (page ids near 2^17 at page size 1).
        band = draw(st.integers(0, 2))
        if band == 2:
            pages = max(2, LARGE_SLOTS // ps + draw(st.integers(0, 7)))
        else:
            pages = max(2, draw(power_band(LARGE_SLOTS.bit_length() - 3 + band)) // ps)
        swa_pages = max(2, pages // draw(st.sampled_from((1, 2, 4, 8))))
    if kind == "pure_swa":
        swa_pages = pages
    ring = kind == "hybrid" and ps > 1 and draw(st.integers(0, 4)) == 0
    # A pool size need not be whole pages: the part past the last page is unused.
    spare = draw(st.integers(0, ps - 1)) if ps > 1 and draw(st.integers(0, 3)) == 0 else 0
    drawn = {
        "kind": kind,
        "size": pages * ps + spare,
        "size_swa": swa_pages * ps + spare,
        "page_size": ps,
        "device": device,
        "need_sort": draw(st.booleans()),
        "ring_size": draw(st.integers(1, 2 * ps)) if ring else None,
        "req_slots": draw(st.integers(1, 24)) if ring else None,
        "check_level": draw(st.sampled_from(("strict", "warn", "off"))),
    }
    # sglang's SGLANG_DEBUG_MEMORY_POOL checks; the key is sent only when on, so a
    # target that knows nothing of it still builds every other configuration.
    if draw(st.integers(0, 3)) == 0:
        drawn["debug_memory_pool"] = True
    return {**drawn, **fixed}


@st.composite
def lengths(draw, ps: int, room: int = 0) -> int:
    """Tokens a request adds: a few (speculative or jump-forward extends, inside one
    page), up to a few pages, one in eight up to thousands, and one in sixteen any
    share of the `room` the pools have left: a scheduler admits while the pool has
    room, so a busy server runs it nearly full and its page ids reach the top of a
    large pool, where a request of a few thousand tokens never goes."""
    kind = draw(st.integers(0, 15))
    if kind == 15 and room > 0:
        return draw(st.integers(1, room))
    if kind >= 13:
        return draw(st.integers(1, 4096))
    if kind < 4:
        return draw(st.integers(1, max(1, ps // 2)))
    return draw(st.integers(1, 3 * ps + 2))


def in_some_order(data, items: list, label: str) -> list:
    """`items` in a drawn order: any permutation for a batch of up to BATCH_MAX, and a
    seeded shuffle (one choice) for a larger one. A permutation costs a choice an
    item, and hypothesis ends an example at 8 KB of choices: a busy server's decode
    batch of hundreds of requests, drawn so, overran it and never ran."""
    if len(items) <= BATCH_MAX:
        return data.draw(st.permutations(items), label=label)
    seed = data.draw(st.integers(0, 2**32 - 1), label=f"{label} (shuffle seed)")
    return random.Random(seed).sample(items, len(items))


def fit_to_pages(start: int, add: int, pages: int, ps: int) -> tuple[int, int]:
    """What a scheduler's prefill adder admits of an entry that adds `add` tokens to a
    prefix of `start`, with `pages` new pages left: (tokens, pages then left). Fewer
    tokens than asked is a chunk cut at the end of the last page it can have (0: none
    fits, though a prefix's partial last page may still take some)."""
    need = new_pages(start, start + add, ps)
    if need <= pages:
        return add, pages - need
    return (pages_spanned(start, ps) + pages) * ps - start, 0


class LockstepMachine(RuleBasedStateMachine):
    """Subclassed by `machine_for` with a target and a device."""

    target: Target = staticmethod(resolve("impl"))
    device: str = "cpu"
    census_every: int = 16
    # Differential runs (SPEC 4.5): a second target and what each side's config adds.
    peer: Target | None = None
    sides: tuple[dict, dict] = ({}, {})
    # Keys fixed for every run (a campaign on one page size, a benchmark's pool).
    fixed: dict = {}

    def __init__(self):
        super().__init__()
        self.ls: Lockstep | None = None
        self.next_rid = 0
        self.window = 1
        self._seen: Counter = Counter()
        self._shapes: Counter = Counter()
        self.failed = False
        self._memo: dict = {}
        self._memo_at = None

    # ------------------------------------------------------------ helpers
    def _go(self, step: Step) -> None:
        # Outside hypothesis (a benchmark driving the rules by hand) there is no one
        # to tell.
        quiet = not currently_in_test_context()
        if not quiet:
            note(f"step {self.ls.index + 1}: {step!r}")
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
            for cell, n in self.ls.shapes.items():
                if n > self._shapes[cell]:
                    SHAPES_SEEN[cell] += n - self._shapes[cell]
                    self._shapes[cell] = n

    def _cached_for_step(self, key, compute):
        """State-derived candidates, computed once per driver step: hypothesis asks
        every precondition before each rule, and a scan of the rows is not free."""
        at = (self.ls.index, self.ls.counters()["steps_run"])
        if at != self._memo_at:
            self._memo, self._memo_at = {}, at
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _new_rid(self) -> int:
        self.next_rid += 1
        return self.next_rid - 1

    @property
    def _live(self) -> list[int]:
        return sorted(self.ls.rows)

    def _paired(self, slot: int) -> bool:
        """Whether a position's slot still holds SWA KV."""
        return slot != RELEASED if self.ls.pure else slot in self.ls.model.peer

    def _runs(self, slots: list[int], paired: bool, start: int = 0) -> list[tuple[int, int]]:
        """Maximal runs [lo, hi) of positions from `start` on that are (un)paired."""
        return [(lo + start, hi + start) for lo, hi in runs_of(slots[start:], lambda s: self._paired(s) == paired)]

    def _room(self) -> int:
        """Tokens the tighter pool has left (the full pool alone in ring mode)."""
        return self.ls.model.available()

    def _own(self, rid: int) -> tuple[int, int]:
        row = self.ls.rows[rid]
        return row.shared, len(row.slots)

    # ---------------------------------------------------------- predicates
    def _has_rows(self) -> bool:
        return self.ls is not None and bool(self.ls.rows)

    def _hybrid(self) -> bool:
        return self.ls is not None and not self.ls.pure

    def _evictable(self) -> list[int]:
        def compute():
            out = []
            for r in self._live:
                row = self.ls.rows[r]
                # Eviction takes the oldest positions first, so the last is the likeliest paired.
                if row.slots and (self._paired(row.slots[-1]) or any(self._paired(s) for s in row.slots[row.shared :])):
                    out.append(r)
            return out

        return self._cached_for_step("evictable", compute)

    def _hittable(self, e: int) -> bool:
        """Whether a prompt can hit cached entry `e`: share a page-aligned prefix of it
        (any entry of a page or more), or take over an unlocked entry whole, which
        ends mid-page only where its last position keeps its peer (continuable)."""
        slots = self.ls.cache[e].slots
        if self.ls.locks[e]:
            return len(slots) >= self.ls.ps
        return len(slots) % self.ls.ps == 0 or self.ls.continuable(slots)

    def _cached(self) -> list[int]:
        return sorted(r for r in self.ls.cache if not self.ls.locks[r])

    # --------------------------------------------------------------- init
    @initialize(window=st.integers(1, 64), data=st.data())
    def init(self, window, data):
        """Build both sides; the server starts with a few requests in flight, so a run
        whose swarm switched admission off still has rows to work on."""
        cls = type(self)
        # A server is idle (a few requests in flight), busy (dozens) or at its cap
        # (hundreds: a serving engine caps its running batch there), one in three
        # each. A busy server's pool is more often one that holds them (configs).
        load = data.draw(st.integers(0, 2), label="load")
        config = data.draw(configs(self.device, cls.fixed, serving=load > 0), label="config")
        census = census_every_for(config, cls.census_every)
        try:
            if cls.peer is None:
                self.ls = Lockstep(config, cls.target, census_every=census)
            else:
                self.ls = Differential(config, cls.target, cls.peer, *cls.sides, census_every=census)
        except NotImplementedError as e:
            # SPEC 4.3: skip what the target does not build, and say so in the statistics.
            event(f"configuration not supported by the target: {e}")
            LABELS_SEEN["unsupported configuration"] += 1
            reject()
        # The attention window the scheduler evicts by; at page sizes above it, a page
        # outlives the window.
        self.window = window
        if currently_in_test_context():
            event(f"page_size {config['page_size']}, {config['kind']}{', ring' if config['ring_size'] else ''}, level {config['check_level']}")
        # Its requests are admitted in prefill batches as its scheduler forms them.
        # The count is drawn first: a list strategy's average length is about five,
        # whatever its bound, and a busy server's decode batches are its whole point.
        count = data.draw(st.integers(*((0, 4), (8, 64), (65, BUSY_MAX))[load]), label="requests in flight")
        # A request's share of the room (its "any share" case) is its share of what
        # the pools hold for all of them: a busy server's rows fit its pool together.
        share = self._room() // max(1, count)
        first = data.draw(st.lists(lengths(self.ls.ps, share), min_size=count, max_size=count), label="first requests")
        # Many short prompts go in one prefill, or batches of up to 16 in turn, each
        # budgeted by the prefill adder; between forwards the scheduler evicts what
        # left the window, so a small SWA pool still holds hundreds of rows.
        one = count > BATCH_MAX and data.draw(st.booleans(), label="one prefill")
        for i in range(0, count, count if one else BATCH_MAX):
            if i:
                self._sweep()
            budget = self._room() // self.ls.ps
            batch = []
            for n in first[i : i + (count if one else BATCH_MAX)]:
                fit, budget = fit_to_pages(0, n, budget, self.ls.ps)
                if fit > 0:
                    batch.append((self._new_rid(), NEW, 0, fit))
                if fit < n:
                    break
            if batch:
                self._go(Prefill(tuple(batch)))

    # ------------------------------------------------------- scheduling
    @precondition(lambda self: self.ls is not None)
    @rule(data=st.data())
    def prefill(self, data):
        """A prefill batch of 1-16 entries in any order: new requests from prefix 0,
        cache hits (an aligned prefix of a cached entry, or a whole entry taken over
        mid-page), and chunked continuations of live requests.

        Like a scheduler's prefill adder, the batch is sized to the pages the tighter
        pool has left: the entry that does not fit is cut to what does (a chunk, its
        rest for a later batch) and closes the batch (`fit_to_pages`). One batch in
        four is not budgeted, as an estimate that ran over: pools run out mid-batch."""
        ps = self.ls.ps
        size = data.draw(st.integers(1, 4) if data.draw(st.integers(0, 3)) else st.integers(1, BATCH_MAX), label="batch size")
        budget = None if data.draw(st.integers(0, 3), label="over budget") == 3 else self._room() // ps
        live = [r for r in self._live if self.ls.continuable(self.ls.rows[r].slots)]
        # A prefix in use stays in the cache for other prompts to hit (its lock stops
        # eviction only), as a system prompt is shared by every request that sends it.
        cached = sorted(self.ls.cache)
        taken: set[int] = set()
        batch = []
        kinds = ["new"] + (["continue"] if live else []) + (["hit"] if cached else [])
        for _ in range(size):
            kind = data.draw(st.sampled_from(kinds), label="entry kind")
            add = data.draw(lengths(ps, self._room()), label="tokens")
            if kind == "continue" and live:
                r = data.draw(st.sampled_from(live), label="continuing request")
                live.remove(r)
                entry = (r, r, len(self.ls.rows[r].slots))
            else:
                entry = (self._new_rid(), NEW, 0)
                hittable = [e for e in cached if e not in taken and self._hittable(e)]
                if kind == "hit" and hittable:
                    e = data.draw(st.sampled_from(hittable), label="cached entry")
                    n = len(self.ls.cache[e].slots)
                    prefix = data.draw(st.integers(1, n), label="prefix")
                    locked = bool(self.ls.locks[e])
                    if prefix % ps and (prefix != n or locked):
                        prefix -= prefix % ps  # a shared prefix ends on a page boundary
                    # Under a page: an unlocked entry is taken over whole (mid-page
                    # where it ends so); one in use is shared from its first page.
                    prefix = prefix or (ps if locked else n)
                    taken.add(e)
                    entry = (entry[0], e, prefix)
            if budget is None:
                batch.append((*entry, add))
                continue
            fit, budget = fit_to_pages(entry[2], add, budget, ps)
            if fit > 0:
                batch.append((*entry, fit))
            if fit < add:
                break  # the chunk closes the batch
        if not batch:
            return
        order = data.draw(st.permutations(batch), label="batch order")
        self._go(Prefill(tuple(order)))

    @precondition(lambda self: self.ls is not None and self.ls.ps > 1 and not self.ls.pure)
    @rule(data=st.data())
    def admit_tail(self, data):
        n = data.draw(lengths(self.ls.ps, self._room()), label="tokens")
        tail = data.draw(st.integers(0, n), label="tail")
        self._go(AdmitTail(self._new_rid(), n, tail))

    def _decodable(self) -> list[int]:
        return self._cached_for_step("decodable", lambda: [r for r in self._live if self.ls.continuable(self.ls.rows[r].slots)])

    @precondition(lambda self: self._has_rows() and bool(self._decodable()))
    @rule(data=st.data())
    def decode(self, data):
        """A run of decode steps over one batch in a scheduler's order (not sorted):
        every running request, or some of them; requests cross page boundaries at
        different steps, several in one step."""
        live = self._decodable()
        if data.draw(st.booleans(), label="all running"):
            rids = in_some_order(data, live[:DECODE_MAX], "decoding")
        else:
            rids = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=min(DECODE_MAX, len(live)), unique=True), label="decoding")
        steps = data.draw(st.integers(1, 2 * min(self.ls.ps, 8) + 1), label="decode steps")
        # One run in four goes on until a pool cannot take the batch's next step, as a
        # scheduler decodes until it must retract: at most DECODE_RUN steps and
        # DECODE_RUN_POSITIONS positions in all.
        until_refused = data.draw(st.integers(0, 3), label="until refused") == 0
        if until_refused:
            steps = max(steps, min(DECODE_RUN, DECODE_RUN_POSITIONS // len(rids)))
        for _ in range(steps):
            rids = [r for r in rids if r in self.ls.rows and self.ls.continuable(self.ls.rows[r].slots)]
            if not rids:
                break
            before = len(self.ls.rows[rids[0]].slots)
            self._go(Decode(tuple(rids)))
            if until_refused and rids[0] in self.ls.rows and len(self.ls.rows[rids[0]].slots) == before:
                break  # refused

    @precondition(lambda self: self._has_rows() and bool(self._evictable()))
    @rule(data=st.data())
    def evict(self, data):
        """Window eviction: the SWA KV of a request's positions that left the window,
        or of any span of its paired positions (page-granular when paged). Or a sweep:
        after a decode step the scheduler evicts what left the window of every request
        that has any, one call each."""
        if data.draw(st.integers(0, 3), label="sweep") == 0:
            self._sweep()
            return
        rid = data.draw(st.sampled_from(self._evictable()), label="request")
        row = self.ls.rows[rid]
        lo, hi = self._runs(row.slots, True, row.shared)[0]
        L = len(row.slots)
        if data.draw(st.booleans(), label="by window"):
            lo, hi = self._window_left(rid) or (lo, lo + 1)
        else:
            if self.ls.ps > 1:
                hi = L  # the allocator evicts whole pages anyway
            hi = data.draw(st.integers(lo + 1, hi), label="evict to")
        self._go(Evict(rid, lo, hi))

    def _sweep(self) -> None:
        """What a scheduler evicts after a forward: for every request, one call for
        the positions that left its window."""
        for rid in self._evictable():
            span = self._window_left(rid, sweep=True) if rid in self.ls.rows else None
            if span:
                self._go(Evict(rid, *span))

    def _window_left(self, rid: int, sweep: bool = False) -> tuple[int, int] | None:
        """The span of a request's oldest paired positions up to where its window
        begins (at least one position), or None where it has no paired position; in
        a sweep, None also where no paired position has left the window."""
        row = self.ls.rows[rid]
        slots, L, ps, paired = row.slots, len(row.slots), self.ls.ps, self._paired
        lo = next((p for p in range(row.shared, L) if paired(slots[p])), None)
        if lo is None:
            return None
        if sweep:
            # A scheduler's sweep (sglang's free_swa_out_of_window_slots) frees only the
            # whole pages that left the window: the page the window starts in keeps its
            # SWA KV, and with it the request's last position, which decodes on.
            limit = L - self.window if ps == 1 else (L - self.window) // ps * ps
            if limit <= lo:
                return None
        else:
            limit = max(lo + 1, L - self.window)
        if ps > 1:
            return lo, limit
        # At page size 1 a slot with no peer cannot be evicted: the span stops at one.
        hi = lo + 1
        while hi < limit and paired(slots[hi]):
            hi += 1
        return lo, hi

    def _aligned_unpaired(self, rid: int) -> list[tuple[int, int]]:
        """Unpaired own runs from their first page boundary on: a load-back starts on a full page."""
        ps = self.ls.ps
        row = self.ls.rows[rid]
        runs = [(-(-lo // ps) * ps, hi) for lo, hi in self._runs(row.slots, False, row.shared)]
        return [(lo, hi) for lo, hi in runs if lo < hi]

    def _repairable(self) -> list[int]:
        def has_aligned_unpaired(r):
            # Asked before every step: set operations, not a Python loop over a long row.
            row, ls = self.ls.rows[r], self.ls
            heads = row.slots[row.shared :: ls.ps]
            return RELEASED in heads if ls.pure else not ls.model.peer.keys() >= set(heads)

        return self._cached_for_step("repairable", lambda: [r for r in self._live if has_aligned_unpaired(r)])

    @precondition(lambda self: self._has_rows() and not self.ls.pure and not self.ls.ring and bool(self._repairable()))
    @rule(data=st.data())
    def repair(self, data):
        """A host-cache load-back: evicted positions paired with new SWA slots, the SWA
        chunk starting anywhere inside its first page."""
        rid = data.draw(st.sampled_from(self._repairable()), label="request")
        lo, hi = data.draw(st.sampled_from(self._aligned_unpaired(rid)), label="run")
        # What a load-back restores: any part of the evicted run, or all of it (the
        # host held the whole prefix), or its last window's worth from that page on
        # (what the request reads next, so the window later slides over it).
        span = data.draw(st.sampled_from(("any", "whole", "window")), label="load-back span")
        if span == "any":
            n = data.draw(st.integers(1, hi - lo), label="positions")
        else:
            if span == "window":
                lo = max(lo, hi - self.window) // self.ls.ps * self.ls.ps
            n = hi - lo
        offset = data.draw(st.integers(0, self.ls.ps - 1), label="offset")
        self._go(Repair(rid, lo, n, offset, data.draw(st.booleans(), label="SWA indices int32")))
        ps = self.ls.ps
        pages = -(-n // ps)
        loaded = rid in self.ls.rows and self._paired(self.ls.rows[rid].slots[lo])  # not refused
        if pages > 1 and loaded and data.draw(st.booleans(), label="window slides into it"):
            # Decoding on, the window leaves the loaded positions behind a page at a time.
            k = data.draw(st.integers(1, pages - 1), label="pages left behind")
            self._go(Evict(rid, lo, lo + k * ps))

    def _segment_page_ok(self, row, p: int) -> bool:
        """Whether free_swa_segment can release the page at position `p` of `row`: its
        representative paired, and the page in step with its full page."""
        ls, ps = self.ls, self.ls.ps
        s = row.slots[p]
        if ls.pure:
            return s != RELEASED
        peer = ls.model.peer.get(s)
        return peer is not None and peer % ps == s % ps and all(
            ls.model.peer.get(x, -1) - peer == x - s for x in row.slots[p : min(p + ps, len(row.slots))])

    def _segment_span(self, rid: int) -> tuple[int, int] | None:
        """Whole pages from the first one whose SWA KV free_swa_segment can release, as
        far as they go."""
        ls, ps = self.ls, self.ls.ps
        row = ls.rows[rid]
        L = len(row.slots)
        if ls.ring:
            return (row.shared, L) if row.shared < L else None
        lo = next((p for p in range(row.shared, L, ps) if self._segment_page_ok(row, p)), None)
        if lo is None:
            return None
        hi = lo
        while hi < L and self._segment_page_ok(row, hi):
            hi = min(hi + ps, L)
        return lo, hi

    def _segment_evictable(self) -> list[int]:
        def has_span(rid: int) -> bool:
            # The rows that have a span, asked before every step: the window keeps a
            # row's last pages, so look from the end (the span itself only for the row drawn).
            row, ps = self.ls.rows[rid], self.ls.ps
            if self.ls.ring:
                return row.shared < len(row.slots)
            return any(self._segment_page_ok(row, p) for p in reversed(range(row.shared, len(row.slots), ps)))

        return self._cached_for_step("segment", lambda: [r for r in self._live if has_span(r)])

    @precondition(lambda self: self._has_rows() and bool(self._segment_evictable()))
    @rule(data=st.data())
    def evict_segment(self, data):
        """Window eviction by segment (sglang 0.5.23's free_swa_segment)."""
        rid = data.draw(st.sampled_from(self._segment_evictable()), label="request")
        lo, hi = self._segment_span(rid)
        hi = data.draw(st.integers(lo + 1, hi), label="evict to")
        self._go(EvictSegment(rid, lo, hi))

    def _page_free_start(self, rid: int) -> int | None:
        """The first page-aligned position from which the row holds no SWA KV."""
        ls, ps = self.ls, self.ls.ps
        row = ls.rows[rid]
        L = len(row.slots)
        if ls.pure or ls.ring:
            return row.shared if row.shared < L else None
        start = L
        while start > row.shared and row.slots[start - 1] not in ls.model.peer:
            start -= 1
        start = -(-start // ps) * ps
        return start if start < L else None

    def _page_freeable(self) -> list[int]:
        return self._cached_for_step("page ids", lambda: [r for r in self._live if self._page_free_start(r) is not None])

    @precondition(lambda self: self._has_rows() and bool(self._page_freeable()))
    @rule(data=st.data())
    def free_pages(self, data):
        """A cache-style free by page id (sglang 0.5.23's free_page_ids) of a row's
        tail whose SWA KV is already gone."""
        rid = data.draw(st.sampled_from(self._page_freeable()), label="request")
        start = self._page_free_start(rid)
        L, ps = len(self.ls.rows[rid].slots), self.ls.ps
        start = data.draw(st.integers(start // ps, (L - 1) // ps), label="from page") * ps
        self._go(FreePages(rid, start))

    def _finish_hows(self, rid: int) -> list[str]:
        ls = self.ls
        row = ls.rows[rid]
        hows = ["split", "full_segments"]
        unpaired = self._runs(row.slots, False, row.shared)
        if ls.ps > 1 or ls.pure or not unpaired:
            hows.append("free")  # free at page size 1 of a slot with no peer breaks a contract
        if ls.ps > 1 and not ls.pure:
            hows.append("segments")
        if not ls.pure and not row.shared:
            hows.append("cache")
        return hows

    @precondition(_has_rows)
    @rule(data=st.data())
    def finish(self, data):
        rid = data.draw(st.sampled_from(self._live), label="request")
        hows = self._finish_hows(rid)
        # A server with a radix cache keeps every finished request that may be cached
        # (so later prompts hit it and its eviction frees many entries' pieces at
        # once); the other ways out are a server's without one. Uniform over the five,
        # one finish in five went to the cache and cache hits were rare.
        if "cache" in hows and data.draw(st.booleans(), label="radix cache"):
            how = "cache"
        else:
            how = data.draw(st.sampled_from(hows), label="how")
        self._go(Finish(rid, how))

    def _droppable(self) -> list[int]:
        def compute():
            if self.ls.ps > 1:
                return [r for r in self._live if self._own(r)[0] < self._own(r)[1]]
            # At page size 1 the tail from the last unpaired position on.
            return [r for r in self._live if self._paired(self.ls.rows[r].slots[-1])]

        return self._cached_for_step("droppable", compute)

    def _drop_floor(self, rid: int) -> int:
        """The first position a free_segment of the row's tail may start at."""
        lo, L = self._own(rid)
        if self.ls.ps == 1:  # a free of a slot with no peer breaks a contract at page 1
            unpaired = self._runs(self.ls.rows[rid].slots, False, lo)
            return unpaired[-1][1] if unpaired else lo
        return lo

    @precondition(lambda self: self._has_rows() and bool(self._droppable()))
    @rule(data=st.data())
    def drop_tail(self, data):
        rid = data.draw(st.sampled_from(self._droppable()), label="request")
        floor, L = self._drop_floor(rid), len(self.ls.rows[rid].slots)
        keep = data.draw(st.integers(floor, L - 1), label="keep")
        if self.ls.ps > 1:
            keep -= keep % self.ls.ps
            keep = max(keep, floor)
        self._go(DropTail(rid, keep))

    @precondition(lambda self: self._has_rows() and not self.ls.pure)
    @rule(data=st.data())
    def retract(self, data):
        """Retract a batch under memory pressure: host copies, then one free per kind."""
        rids = data.draw(st.lists(st.sampled_from(self._live), min_size=1, max_size=8, unique=True), label="retracting")
        self._go(Retract(tuple(rids)))

    @precondition(lambda self: self.ls is not None and bool(self.ls.retracted))
    @rule(data=st.data())
    def resume(self, data):
        waiting = sorted(self.ls.retracted)
        rids = data.draw(st.lists(st.sampled_from(waiting), min_size=1, max_size=8, unique=True), label="resuming")
        self._go(Resume(tuple(rids)))

    def _cache_pieces(self, call: str, rid: int) -> tuple[int, int] | None:
        """The span of a cached entry `call` can evict legally, or None."""
        ls = self.ls
        slots = ls.cache[rid].slots
        L, ps = len(slots), ls.ps
        paired = self._runs(slots, True)
        unpaired = self._runs(slots, False)
        if call == "free_swa":
            if not paired:
                return None
            lo, hi = paired[-1]
            if ps > 1:
                lo -= lo % ps
            return lo, hi
        if call == "free":  # from the end; at page size 1 every slot freed needs its peer
            lo = unpaired[-1][1] if ps == 1 and unpaired else 0
            return (lo, L) if lo < L else None
        # free_full: only pages with no paired slot left
        if not paired:
            return 0, L
        lo = paired[-1][1]
        lo = -(-lo // ps) * ps
        return (lo, L) if lo < L else None

    def _evictions(self) -> dict[str, dict[int, tuple[int, int]]]:
        """call -> {cached entry: the span that call may evict}, where any."""
        def compute():
            out = {}
            for call in ("free", "free_swa", "free_full"):
                spans = {r: self._cache_pieces(call, r) for r in self._cached()}
                spans = {r: span for r, span in spans.items() if span}
                if spans:
                    out[call] = spans
            return out

        return self._cached_for_step("evictions", compute)

    @precondition(lambda self: self.ls is not None and bool(self._evictions()))
    @rule(data=st.data())
    def cache_free(self, data):
        """A cache eviction over the concatenated tails of several cached entries."""
        evictions = self._evictions()
        call = data.draw(st.sampled_from(sorted(evictions)), label="call")
        spans = evictions[call]
        picked = data.draw(st.lists(st.sampled_from(sorted(spans)), min_size=1, max_size=8, unique=True), label="entries")
        pieces = []
        for r in picked:
            lo, hi = spans[r]
            if data.draw(st.booleans(), label="part"):
                step = self.ls.ps
                cut = data.draw(st.integers(lo // step, (hi - 1) // step), label="from page") * step
                lo = max(lo, cut)
            pieces.append((r, lo, hi))
        interleave = len(pieces) > 1 and data.draw(st.booleans(), label="interleave")
        self._go(CacheFree(call, tuple(pieces), interleave))

    @precondition(lambda self: self.ls is not None)
    @rule(data=st.data())
    def empty(self, data):
        ps1 = self.ls.ps == 1
        calls = [c for c in EMPTY_CALLS if (c not in TOKEN_CALLS or ps1) and (c not in PAGED_CALLS or not ps1)]
        self._go(Empty(data.draw(st.sampled_from(calls), label="call")))

    # ------------------------------------------------------------- upkeep
    @precondition(lambda self: self.ls is not None and not self.ls.model.group_open)
    @rule()
    def group_begin(self):
        self._go(GroupBegin())

    @precondition(lambda self: self.ls is not None and self.ls.model.group_open)
    @rule()
    def group_end(self):
        self._go(GroupEnd())

    @precondition(lambda self: self.ls is not None)
    @rule(op=st.sampled_from(("merge_sort", "clear", "resize")), data=st.data())
    def maintain(self, op, data):
        """Upkeep that touches every page: merge/sort the free lists, clear, or resize."""
        if op == "merge_sort":
            self._go(MergeSort())
        elif op == "clear":
            self._go(Clear())
        else:
            m, ps = self.ls.model, self.ls.ps
            # As at construction, a size need not be whole pages.
            spare = data.draw(st.integers(0, ps - 1)) if ps > 1 and data.draw(st.integers(0, 3)) == 0 else 0
            size = min(m.built_size, data.draw(st.integers(0, m.built_size // ps), label="full pages") * ps + spare)
            size_swa = size if m.pure else min(
                m.built_size_swa, data.draw(st.integers(0, m.built_size_swa // ps), label="SWA pages") * ps + spare)
            self._go(Resize(size, size_swa))

    # ------------------------------------------------------ contract breaks
    def _can_break(self, kinds: tuple[str, ...]) -> bool:
        return self._cached_for_step(("breaks", kinds), lambda: any(self._breaks(kind, limit=1) for kind in kinds))

    def _draw_break(self, data, kinds: tuple[str, ...]) -> Break:
        kind = data.draw(st.sampled_from([k for k in kinds if self._breaks(k, limit=1)]), label="break kind")
        return data.draw(st.sampled_from(self._breaks(kind)), label="break")

    @precondition(lambda self: self.ls is not None and self._can_break(OTHER_BREAKS + PAGE_ID_BREAKS))
    @rule(data=st.data())
    def contract_break(self, data):
        self._go(self._draw_break(data, OTHER_BREAKS + PAGE_ID_BREAKS))

    @precondition(lambda self: self._has_rows() and self._can_break(GUARD_BREAKS))
    @rule(data=st.data())
    def guard_break(self, data):
        """The breaks the allocator's own guards watch (swa.peer_mapped and
        swa.peer_released): guard agreement at every level is checked on these, and
        a break tolerated at warn or off leaves stale entries later calls must cope with."""
        self._go(self._draw_break(data, GUARD_BREAKS))

    def _breaks(self, kind: str, limit: int = 8) -> list[Break]:
        """The breaks of this kind the current state can make (at most `limit`)."""
        ls, m = self.ls, self.ls.model
        hybrid = not m.pure
        if kind in unrefused_breaks(type(self).target):
            return []  # SPEC 4.7: the target declares it does not refuse this break
        if BREAKS[kind] == "debug":
            # Sent only where sglang's debug mode refuses them: elsewhere the allocator
            # need not notice, and the harness never sends those.
            if not (ls.debug and ls.ps > 1 and not m.group_open):
                return []
            if kind != "page_ids_twice":
                return [Break(kind)] if kind == "page_ids_padding" or m.full.free else []
            return [Break(kind, r) for r in self._live[:limit] if ls.rows[r].slots[ls.rows[r].shared :]]
        if BREAKS[kind] != "guard" and kind not in ("partial_page", "unaligned_segment"):
            if kind == "nested_group":
                ok = m.group_open
            elif kind in ("tail_batch", "tail_long"):
                ok = ls.ps > 1 and hybrid
            elif kind in ("paged_on_token", "decode_on_token", "tail_on_token"):
                ok = ls.ps == 1
            elif kind in ("pair_on_pure", "unpair_on_pure"):
                ok = m.pure
            elif kind == "alloc_on_paged":
                ok = ls.ps > 1
            elif kind == "double_free":
                ok = any(ls.ghosts.values())
            elif kind == "never_allocated":
                ok = bool(m.full.free)
            else:  # resize_grow
                ok = True
            return [Break(kind)] if ok else []
        out = []
        for rid in self._live:
            row = ls.rows[rid]
            own = row.slots[row.shared :]
            if not own:
                continue
            if kind == "free_unpaired":
                ok = hybrid and ls.ps == 1 and not ls.ring and any(s not in m.peer for s in own)
            elif kind == "free_full_paired":
                ok = hybrid and any(s in m.peer for s in own)
            elif kind == "segment_unpaired":
                ok = hybrid and not ls.ring and unpaired_segment(row, ls.ps, m.peer) is not None
            else:  # partial_page, unaligned_segment
                ok = ls.ps > 1 and len(own) > 1
            if ok:
                out.append(Break(kind, rid))
                if len(out) >= limit:
                    break
        return out

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
    fixed: dict | None = None,
) -> type[LockstepMachine]:
    """A LockstepMachine class bound to one target and device.

    With `peer`, every step also runs on a second target and the two must agree slot
    for slot; `sides` adds config keys per side, e.g. ({"device": "cpu"}, {"device":
    "cuda"}) or ({"backend": "cpu"}, {"backend": "npu_emulated"}). `fixed` pins
    configuration keys (e.g. {"page_size": 16}) over the drawn ones.
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
            "fixed": dict(fixed or {}),
        },
    )
