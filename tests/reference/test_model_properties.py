"""Property tests of the reference model alone (no torch, no allocator).

`ModelMachine` plays a correct allocator against the model: it takes free pages from
the model's own free sets, lays the slots out with `reference.layout`, keeps its own
mapping array as the allocator would write it, and feeds each result to the model.
A correct allocator never earns a violation, so after every call the model's result
must be empty, `self_check()` (SPEC 3.1) must be empty, and the census of the observed
state (the model's free sets, the machine's own mapping) must be empty. Every contract
break of SPEC 3.2 the state allows is classified, and the reaction is compared with the
table as SPEC 3.2 states it, computed here independently of the model's code.

The fixed examples at the end pin the classification table itself.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import event, note, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from reference import Model, layout, names

KINDS = ("hybrid", "pure_swa", "ring")


@st.composite
def configs(draw):
    mode = draw(st.sampled_from(KINDS))
    ps = 1 if mode == "pure_swa" else draw(st.sampled_from((2, 4) if mode == "ring" else (1, 2, 4)))
    full_pages = draw(st.integers(2, 8))
    swa_pages = draw(st.integers(1, 8))
    cfg = dict(
        kind="pure_swa" if mode == "pure_swa" else "hybrid",
        size=full_pages * ps,
        size_swa=swa_pages * ps,
        page_size=ps,
        need_sort=draw(st.booleans()),
        ring_size=None,
        req_slots=None,
    )
    if mode == "ring":
        cfg["ring_size"] = draw(st.integers(1, 3 * ps))
        cfg["req_slots"] = draw(st.integers(1, 4))
    return cfg


def snapshot(m: Model):
    """Everything a classification must leave alone."""
    pools = [m.full] if m.swa is m.full else [m.full, m.swa]
    return (
        [(frozenset(p.free), frozenset(p.live), dict(p.used), dict(p.owner)) for p in pools],
        dict(m.peer),
        dict(m.stale),
        m.group_open,
        list(m.held_full),
        list(m.held_swa),
        frozenset(m.req_free),
    )


class ModelMachine(RuleBasedStateMachine):
    # ------------------------------------------------------------ set up
    @initialize(cfg=configs())
    def setup(self, cfg):
        note(f"config {cfg}")
        self.cfg = cfg
        self.m = Model(**cfg)
        self.ps = cfg["page_size"]
        self.pure = cfg["kind"] == "pure_swa"
        self.ring = cfg["ring_size"] is not None
        self.hybrid = not self.pure and not self.ring  # paired SWA side present
        self.rows: dict[int, list[int]] = {}
        self.req_slot: dict[int, int] = {}
        self.next_rid = 0
        self._reset_mapping()

    def _reset_mapping(self):
        n = self.m.mapping_len - 1
        self.mapping = (list(range(n)) if self.pure else [0] * n) + [-1]

    # ------------------------------------------------------------ helpers
    def _ok(self, violations, what):
        assert violations == [], f"{what}: a correct allocator got {[str(v) for v in violations]}"

    def _pick(self, free: set[int], n: int, rng: random.Random) -> list[int]:
        return rng.sample(sorted(free), n)

    def _write(self, full, swa):
        for f, s in zip(full, swa):
            self.mapping[f] = s

    def _clear_map(self, slots):
        if not self.hybrid:
            return
        targets = layout.expand_to_pages(slots, self.ps) if self.ps > 1 else slots
        for f in targets:
            if f < len(self.mapping) - 1:
                self.mapping[f] = 0

    def _new_rows(self, count: int) -> list[int]:
        rids = []
        for _ in range(count):
            rid, self.next_rid = self.next_rid, self.next_rid + 1
            if self.ring:
                slot = min(self.m.req_free) if self.m.req_free else None
                self._ok(self.m.req_alloc(slot), "request-slot alloc")
                if slot is None:
                    continue
                self.req_slot[rid] = slot
            rids.append(rid)
        return rids

    def _drop_row(self, rid):
        del self.rows[rid]
        slot = self.req_slot.pop(rid, None)
        if slot is not None:
            self.m.req_free_slot(slot)

    def _grow(self, batch: list[tuple[int, int, int]], what: str, rng: random.Random) -> bool:
        """Give positions prefix..seq-1 of each (rid, prefix, seq); False when short."""
        m, ps = self.m, self.ps
        rids = [r for r, _, _ in batch]
        prefix = [p for _, p, _ in batch]
        seq = [s for _, _, s in batch]
        if ps == 1:
            n = sum(seq) - sum(prefix)
            assert m.classify_alloc(n) is None
            owners = [r for r, p, s in batch for _ in range(s - p)]
            if len(m.full.free) < n or (self.hybrid and len(m.swa.free) < n):
                self._ok(m.alloc(n, None, None, owners), f"alloc({n}) -> None")
                return False
            full = self._pick(m.full.free, n, rng)
            swa = self._pick(m.swa.free, n, rng) if self.hybrid else None
            self._ok(m.alloc(n, full, swa, owners), f"alloc({n})")
        else:
            last = [self.rows[r][-1] if p else -1 for r, p, _ in batch]
            assert m.classify_paged(what) is None
            assert m.classify_continuation(prefix, last) is None
            n = layout.total_new_pages(prefix, seq, ps)
            call = m.alloc_decode if what == "alloc_decode" else m.alloc_extend
            args = (seq, last) if what == "alloc_decode" else (prefix, seq, last)
            if any(p % ps for p in prefix):
                event(f"{what} continues a page mid-way")
            if len(m.full.free) < n or (self.hybrid and len(m.swa.free) < n):
                event("pool exhausted")
                self._ok(call(*args, None, None, rids), f"{what} -> None")
                return False
            fpages = self._pick(m.full.free, n, rng)
            spages = self._pick(m.swa.free, n, rng) if self.hybrid else None
            full, swa, i = [], [] if self.hybrid else None, 0
            for r, p, s, lst in zip(rids, prefix, seq, last):
                k = layout.new_pages(p, s, ps)
                if what == "alloc_decode":
                    full.append(layout.decode_layout(s, lst, fpages[i] if k else -1, ps))
                else:
                    full += layout.extend_layout(p, s, lst, fpages[i : i + k], ps)
                if self.hybrid:
                    slast = m.peer.get(lst, 0) if lst >= 0 else lst
                    swa += layout.extend_layout(p, s, slast, spages[i : i + k], ps)
                i += k
            self._ok(call(*args, full, swa, rids), what)
        if self.hybrid:
            self._write(full, swa)
        i = 0
        for r, p, s in batch:
            self.rows.setdefault(r, []).extend(full[i : i + s - p])
            i += s - p
        return True

    def _free(self, call: str, rid: int, lo: int, hi: int, start_pos=None):
        slots = self.rows[rid][lo:hi]
        c = self.m.classify_free(call, slots, start_pos, rid)
        assert c is None, f"{call} of request {rid} positions {lo}..{hi - 1} is legal, model says {c}"
        self._ok(self.m.free(call, slots), call)
        if self.m.group_open:
            event("group holding a free")
        if call != "free_full" and call != "free_full_segment":
            self._clear_map(slots)

    def _paired(self, f: int) -> bool:
        return f in self.m.peer

    def _segment_calls(self, rid: int, lo: int, hi: int) -> list[tuple[str, int, int]]:
        """Per page from an aligned lo: free_segment where its SWA half may go through
        free_swa_segment (sglang 0.5.23), free_full_segment where that half is already
        released, free where neither fits (re-paired from inside an SWA page)."""
        row, ps, m = self.rows[rid], self.ps, self.m
        if not self.hybrid or ps == 1:
            return [("free_segment", lo, hi)] if hi > lo else []
        out = []
        for a in range(lo, hi, ps):
            piece = row[a : min(a + ps, hi)]
            if m.classify_free_swa_segment(piece, a) is None:
                call = "free_segment"
            elif not any(m.peer_of(f) for f in piece):
                call = "free_full_segment"
            else:
                call = "free"
            out.append((call, a, min(a + ps, hi)))
        return out

    # ------------------------------------------------------------ rules
    @rule(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3), rng=st.randoms(use_true_random=False))
    def admit(self, lengths, rng):
        rids = self._new_rows(len(lengths))
        if not rids:
            return
        what = "alloc_extend" if self.ps > 1 else "alloc"
        if not self._grow([(r, 0, n) for r, n in zip(rids, lengths)], what, rng):
            for r in rids:
                self.rows[r] = []
                self._drop_row(r)

    def _continuable(self, rid) -> bool:
        row, ps = self.rows[rid], self.ps
        if ps == 1:
            return True
        if self.m.classify_continuation([len(row)], [row[-1]]) is not None:
            return False
        # A packed SWA tail sits at other in-page offsets than its full slots; the model
        # does not classify continuing it (see test_packed_tail_continuation_*), so a
        # correct caller here does not do it.
        peer = self.m.peer.get(row[-1])
        return not (len(row) % ps and peer is not None and peer % ps != row[-1] % ps)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), rng=st.randoms(use_true_random=False))
    def extend(self, data, rng):
        rids = [r for r in sorted(self.rows) if self._continuable(r)]
        if not rids:
            return
        chosen = data.draw(st.lists(st.sampled_from(rids), min_size=1, max_size=3, unique=True))
        adds = data.draw(st.lists(st.integers(1, 7), min_size=len(chosen), max_size=len(chosen)))
        batch = [(r, len(self.rows[r]), len(self.rows[r]) + a) for r, a in zip(chosen, adds)]
        self._grow(batch, "alloc_extend" if self.ps > 1 else "alloc", rng)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), rng=st.randoms(use_true_random=False))
    def decode(self, data, rng):
        rids = [r for r in sorted(self.rows) if self._continuable(r)]
        if not rids:
            return
        chosen = data.draw(st.lists(st.sampled_from(rids), min_size=1, max_size=4, unique=True))
        batch = [(r, len(self.rows[r]), len(self.rows[r]) + 1) for r in chosen]
        self._grow(batch, "alloc_decode" if self.ps > 1 else "alloc", rng)

    @precondition(lambda self: not self.pure and self.ps > 1)
    @rule(n=st.integers(1, 12), data=st.data(), rng=st.randoms(use_true_random=False))
    def admit_tail(self, n, data, rng):
        m, ps = self.m, self.ps
        tail = data.draw(st.integers(0, n))
        rids = self._new_rows(1)
        if not rids:
            return
        rid = rids[0]
        assert m.classify_tail([0], [n], n, tail) is None
        n_full = layout.new_pages(0, n, ps)
        n_swa = 0 if self.ring else layout.tail_pages_bounds(n, tail, ps)[1]
        if len(m.full.free) < n_full or len(m.swa.free) < n_swa:
            self._ok(m.alloc_extend_swa_tail(0, n, -1, tail, None, None, rid), "alloc_extend_swa_tail -> None")
            self.rows[rid] = []
            self._drop_row(rid)
            return
        full = layout.extend_layout(0, n, -1, self._pick(m.full.free, n_full, rng), ps)
        swa = None
        if not self.ring:
            tail_swa = layout.tail_layout(n, tail, self._pick(m.swa.free, n_swa, rng), ps, aligned=True)
            swa = [0] * (n - tail) + tail_swa
        self._ok(m.alloc_extend_swa_tail(0, n, -1, tail, full, swa, rid), f"alloc_extend_swa_tail(tail={tail})")
        event("SWA tail admitted")
        if swa is not None:
            self._write(full, swa)
        self.rows[rid] = full

    @precondition(lambda self: self.rows and self.hybrid)
    @rule(data=st.data())
    def evict(self, data):
        """free_swa of a run of a request's oldest-or-any positions (page-granular when paged)."""
        ps = self.ps
        rids = [r for r in sorted(self.rows) if ps > 1 or any(map(self._paired, self.rows[r]))]
        if not rids:
            return
        rid = data.draw(st.sampled_from(rids))
        row = self.rows[rid]
        if ps == 1:
            paired = [i for i, f in enumerate(row) if self._paired(f)]
            lo = data.draw(st.sampled_from(paired))
            hi = lo + 1
            while hi < len(row) and self._paired(row[hi]) and data.draw(st.booleans()):
                hi += 1
        else:
            npages = layout.pages_spanned(len(row), ps)
            a = data.draw(st.integers(0, npages - 1))
            b = data.draw(st.integers(a + 1, npages))
            lo, hi = a * ps, min(b * ps, len(row))
        self._free("free_swa", rid, lo, hi)
        event("window evicted")

    @precondition(lambda self: self.rows and self.hybrid)
    @rule(data=st.data(), rng=st.randoms(use_true_random=False))
    def repair(self, data, rng):
        """A host-cache load-back: fresh SWA slots for an evicted run, maybe mid-page."""
        m, ps = self.m, self.ps
        cands = {r: [i for i in range(0, len(row), ps) if not self._paired(row[i])] for r, row in sorted(self.rows.items())}
        rids = [r for r, starts in cands.items() if starts]
        if not rids:
            return
        rid = data.draw(st.sampled_from(rids))
        row, starts = self.rows[rid], cands[rid]
        lo = data.draw(st.sampled_from(starts))
        n = 1
        while lo + n < len(row) and not self._paired(row[lo + n]) and data.draw(st.booleans()):
            n += 1
        off = data.draw(st.integers(0, ps - 1))
        full = row[lo : lo + n]
        assert m.classify_repair(full) is None
        pages = layout.pages_spanned(off + n, ps)
        if len(m.swa.free) < pages:
            event("SWA pool exhausted on re-pair")
            self._ok(m.swa_alloc(pages * ps, None), "swa alloc -> None")
            return
        swa_all = layout.expand_to_pages([p * ps for p in self._pick(m.swa.free, pages, rng)], ps)
        self._ok(m.swa_alloc(pages * ps, swa_all), "swa alloc")
        swa = swa_all[off : off + n]
        self._ok(m.set_mapping(full, swa), "set_mapping")
        event("evicted then re-paired")
        if m.group_open:
            event("group holding a re-pair")
        self._write(full, swa)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), how=st.sampled_from(("free", "runs", "segments")))
    def finish(self, data, how):
        rid = data.draw(st.sampled_from(sorted(self.rows)))
        row, ps = self.rows[rid], self.ps
        L = len(row)
        if not self.hybrid:
            self._free("free", rid, 0, L)
        elif how == "segments" and ps > 1:
            calls = self._segment_calls(rid, 0, L)
            segs = [(row[lo:hi], lo) for call, lo, hi in calls if call == "free_segment"]
            assert self.m.classify_segments(segs, rid) is None
            for idx, _ in segs:
                self._ok(self.m.free("free_segment", idx), "free_segments")
                self._clear_map(idx)
            for call, lo, hi in calls:
                if call != "free_segment":
                    self._free(call, rid, lo, hi, start_pos=lo if call.endswith("_segment") else None)
        else:
            # A page with a paired position goes by free (SWA side first), the rest by
            # free_full; at page_size 1 that is per position.
            runs: list[list] = []
            for lo in range(0, L, ps):
                hi = min(lo + ps, L)
                call = "free" if any(self._paired(f) for f in row[lo:hi]) else "free_full"
                if how == "free" and ps > 1:
                    call = "free"
                if runs and runs[-1][0] == call:
                    runs[-1][2] = hi
                else:
                    runs.append([call, lo, hi])
            for call, lo, hi in runs:
                self._free(call, rid, lo, hi)
        self._drop_row(rid)

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def drop_tail(self, data):
        """free_segment of a request's positions keep.. (keep page-aligned)."""
        rid = data.draw(st.sampled_from(sorted(self.rows)))
        row, ps = self.rows[rid], self.ps
        keep = data.draw(st.sampled_from(range(0, len(row), ps)))
        if self.hybrid and ps == 1:
            # free_segment at page_size 1 needs every freed slot paired.
            while keep < len(row) and not all(self._paired(f) for f in row[keep:]):
                keep += 1
            if keep == len(row):
                return
        for call, lo, hi in self._segment_calls(rid, keep, len(row)):
            self._free(call, rid, lo, hi, start_pos=lo if call.endswith("_segment") else None)
        del row[keep:]
        if not row:
            self._drop_row(rid)

    @precondition(lambda self: self.rows and self.hybrid)
    @rule(data=st.data())
    def strand(self, data):
        """free_full of a request that still has SWA peers, accepted with the guard off:
        the SWA peers stay behind as stale mapping entries."""
        rids = [r for r in sorted(self.rows) if any(map(self._paired, self.rows[r]))]
        if not rids:
            return
        rid = data.draw(st.sampled_from(rids))
        row = self.rows[rid]
        c = self.m.classify_free("free_full", row, None, rid)
        assert c is not None and c.reaction == names.PEER_RELEASED, c
        self.m.strand(list(row))
        event("stranded by a tolerated free_full")
        self._drop_row(rid)

    @precondition(lambda self: not self.m.group_open)
    @rule()
    def group_begin(self):
        assert self.m.classify_group_begin() is None
        self._ok(self.m.group_begin(), "free_group_begin")

    @precondition(lambda self: self.m.group_open)
    @rule()
    def group_end(self):
        held_full, held_swa = list(self.m.held_full), list(self.m.held_swa)
        full, swa = self.m.group_end()
        assert (full, swa) == (held_full, held_swa)
        assert not self.m.group_open

    def _forget_rows(self):
        for rid in list(self.rows):
            self._drop_row(rid)
        self._reset_mapping()

    @rule()
    def clear(self):
        self.m.clear()
        self._forget_rows()
        assert not self.m.group_open

    @rule(data=st.data())
    def resize(self, data):
        ps, m = self.ps, self.m
        size = data.draw(st.integers(1, m.built_size // ps)) * ps
        size_swa = size if self.pure else data.draw(st.integers(1, m.built_size_swa // ps)) * ps
        assert m.classify_resize(size, size_swa) is None
        m.resize(size, size_swa)
        self._forget_rows()

    # ------------------------------------------------------------ contract breaks
    def _breaks(self):
        """(name, thunk that classifies, the reaction SPEC 3.2 owes) for each break the
        state allows."""
        m, ps = self.m, self.ps
        out = [
            ("resize_grow", lambda: m.classify_resize(m.built_size + ps, m.built_size_swa + ps), names.ERROR),
            ("tail_batch", lambda: m.classify_tail([0, 0], [2, 2], 4, 1), names.ERROR),
            ("tail_long", lambda: m.classify_tail([0], [2], 2, 3), names.ERROR),
        ]
        if m.group_open:
            out.append(("nested_group", m.classify_group_begin, names.ERROR))
        if ps == 1:
            out.append(("paged_on_token", lambda: m.classify_paged("alloc_extend"), names.ERROR))
            out.append(("paged_decode_on_token", lambda: m.classify_paged("alloc_decode"), names.ERROR))
        else:
            out.append(("alloc_on_paged", lambda: m.classify_alloc(ps), names.ERROR))
        if self.pure:
            out.append(("pure_repair", lambda: m.classify_repair([1]), names.ERROR))
        for rid, row in sorted(self.rows.items()):
            paired = [f for f in row if self._paired(f)]
            unpaired = [f for f in row if not self._paired(f)]
            if ps > 1 and len(row) >= 2:
                out.append(("unaligned_segment", lambda row=row, rid=rid: m.classify_free("free_segment", row[1:], 1, rid), names.ERROR))
            if self.hybrid and paired:
                for call in ("free_full", "free_full_segment"):
                    out.append((f"{call}_paired", lambda call=call, f=paired[0], rid=rid: m.classify_free(call, [f], None, rid), names.PEER_RELEASED))
            if self.hybrid and ps == 1 and unpaired:
                for call in ("free", "free_swa"):
                    out.append((f"{call}_unpaired", lambda call=call, f=unpaired[0], rid=rid: m.classify_free(call, [f], None, rid), names.PEER_MAPPED))
            legal_call = "free" if (ps > 1 or not self.hybrid or paired) else "free_full"
            legal = paired if legal_call == "free" and self.hybrid and ps == 1 else row
            whole = [f for f in legal if all(g in legal for g in row if g // ps == f // ps)]
            if whole:
                f = whole[0]
                out.append(("free_named_twice", lambda f=f, c=legal_call, rid=rid: m.classify_free(c, [f, f], None, rid), names.UNNOTICED))
                others = [r for r in self.rows if r != rid]
                if others:
                    out.append(("free_foreign", lambda f=f, c=legal_call, o=others[0]: m.classify_free(c, [f], None, o), names.UNNOTICED))
            if ps > 1 and not self.pure:
                by_page: dict[int, list[int]] = {}
                for f in row:
                    by_page.setdefault(f // ps, []).append(f)
                split = [fs for fs in by_page.values() if len(fs) >= 2]
                if split:
                    out.append(("partial_page", lambda f=split[0][0], rid=rid: m.classify_free("free", [f], None, rid), names.UNNOTICED))
                if self.hybrid and len(row) % ps and row[-1] not in m.peer:
                    out.append(("unpaired_continuation", lambda row=row: m.classify_continuation([len(row)], [row[-1]]), names.UNNOTICED))
        # A slot no live row holds: freed before, or never handed out. At page_size 1 on a
        # hybrid pool it has no peer, so the peer-mapped guard is what fires first.
        dead_pages = sorted(m.full.free)
        if dead_pages:
            f = dead_pages[0] * ps
            want = names.PEER_MAPPED if self.hybrid and ps == 1 and not m.peer_of(f) else names.UNNOTICED
            out.append(("free_dead", lambda f=f: m.classify_free("free", [f], None, None), want))
        return out

    @rule(data=st.data())
    def contract_break(self, data):
        breaks = self._breaks()
        name, classify, want = data.draw(st.sampled_from(breaks))
        before = snapshot(self.m)
        c = classify()
        assert snapshot(self.m) == before, f"classifying {name} changed the model"
        assert c is not None, f"{name}: the model sees no broken contract"
        assert c.reaction == want, f"{name}: model says {c}, SPEC 3.2 owes {want}"

    # ------------------------------------------------------------ invariants
    @invariant()
    def model_consistent(self):
        if not hasattr(self, "m"):
            return
        m = self.m
        assert m.self_check() == [], [str(v) for v in m.self_check()]
        # The model against what this machine kept on its own, never the model's state
        # against itself: the live full slots are exactly those the machine's rows hold,
        # each on an owned page, and each row slot's peer in the model is the one the
        # machine wrote into its own mapping.
        held = {f for row in self.rows.values() for f in row if f > 0}
        if not m.group_open:
            assert m.full.live == held, (sorted(m.full.live ^ held)[:8], "model vs the machine's rows")
        for rid, row in self.rows.items():
            for f in row:
                if f <= 0:
                    continue
                assert f in m.full.live and f // self.ps not in m.full.free, (rid, f)
                if self.hybrid and not self.ring:
                    assert self.mapping[f] == m.peer_of(f), (rid, f, self.mapping[f], m.peer_of(f))
        # Conservation per pool: free + owned = capacity, with owned read off the model's
        # live slots, group holds and leaks.
        pools = [(m.full, set(m.held_full), set())]
        if self.hybrid:
            pools.append((m.swa, set(m.held_swa), set(m.leaked)))
        for pool, held, leaked in pools:
            owned = {p for p, k in pool.used.items() if k} | held | leaked
            assert not owned & pool.free
            assert len(pool.free) + len(owned) == pool.num_pages  # conservation


TestModelMachine = ModelMachine.TestCase


# ---------------------------------------------------------------- fixed examples
def _hybrid(ps=1, **kw):
    return Model("hybrid", size=8 * ps, size_swa=8 * ps, page_size=ps, **kw)


def _alloc1(m, slots, swa, owner=0):
    assert m.alloc(len(slots), slots, swa, [owner] * len(slots)) == []


def _reaction(c):
    return None if c is None else c.reaction


def test_token_guards():
    m = _hybrid()
    _alloc1(m, [1, 2], [3, 4])
    assert m.free("free_swa", [1]) == []  # slot 1 evicted: no peer now
    assert _reaction(m.classify_free("free", [1])) == names.PEER_MAPPED
    assert _reaction(m.classify_free("free_swa", [1])) == names.PEER_MAPPED
    assert _reaction(m.classify_free("free_segment", [1], 0)) == names.PEER_MAPPED
    assert _reaction(m.classify_free("free_full", [2])) == names.PEER_RELEASED
    assert _reaction(m.classify_free("free_full_segment", [2], 0)) == names.PEER_RELEASED
    assert m.classify_free("free_full", [1]) is None
    assert m.classify_free("free", [2]) is None
    assert m.classify_free("free_swa", [2]) is None


def test_paged_guards_only_peer_released():
    m = _hybrid(ps=4)
    assert m.alloc_extend([0], [3], [-1], [4, 5, 6], [8, 9, 10], [0]) == []
    assert m.free("free_swa", [4, 5, 6]) == []
    # Paged: no peer-mapped guard; a free of unpaired slots is legal.
    assert m.classify_free("free", [4, 5, 6]) is None
    assert m.classify_free("free_swa", [4, 5, 6]) is None
    m2 = _hybrid(ps=4)
    assert m2.alloc_extend([0], [3], [-1], [4, 5, 6], [8, 9, 10], [0]) == []
    assert _reaction(m2.classify_free("free_full", [4, 5, 6])) == names.PEER_RELEASED


@pytest.mark.parametrize(
    "make, call, want",
    [
        (lambda: _hybrid(), lambda m: m.classify_paged("alloc_extend"), "paged.token"),
        (lambda: _hybrid(), lambda m: m.classify_paged("alloc_decode"), "paged.token"),
        (lambda: _hybrid(), lambda m: m.classify_tail([0], [2], 2, 1), "paged.token"),
        (lambda: _hybrid(ps=4), lambda m: m.classify_alloc(4), "alloc.paged"),
        (lambda: _hybrid(ps=4), lambda m: m.classify_tail([0, 0], [2, 2], 4, 1), "tail.batch"),
        (lambda: _hybrid(ps=4), lambda m: m.classify_tail([0], [2], 2, 3), "tail.length"),
        (lambda: _hybrid(ps=4), lambda m: m.classify_free("free_segment", [5], 1), "segment.unaligned"),
        (lambda: _hybrid(), lambda m: m.classify_resize(9, 8), "resize.grow"),
        (lambda: _hybrid(), lambda m: m.classify_resize(8, 9), "resize.grow"),
        (lambda: Model("pure_swa", 8, 8, 1), lambda m: m.classify_paged("alloc_extend"), "pure.paged"),
        (lambda: Model("pure_swa", 8, 8, 1), lambda m: m.classify_repair([1]), "pure.mapping"),
    ],
)
def test_error_contracts(make, call, want):
    m = make()
    before = snapshot(m)
    c = call(m)
    assert c is not None and (c.name, c.reaction) == (want, names.ERROR), c
    assert snapshot(m) == before


def test_nested_group_is_an_error():
    m = _hybrid()
    assert m.classify_group_begin() is None
    m.group_begin()
    c = m.classify_group_begin()
    assert c is not None and c.reaction == names.ERROR


def test_resize_shrink_is_legal():
    m = _hybrid()
    assert m.classify_resize(4, 8) is None
    assert m.classify_resize(8, 8) is None


@pytest.mark.parametrize("ps", [1, 4])
def test_unnoticed_contracts(ps):
    m = _hybrid(ps=ps)
    if ps == 1:
        _alloc1(m, [1, 2], [3, 4], owner=0)
        _alloc1(m, [5], [6], owner=1)
        legal = [1]
    else:
        assert m.alloc_extend([0, 0], [3, 2], [-1, -1], [4, 5, 6, 12, 13], [8, 9, 10, 20, 21], [0, 1]) == []
        legal = [4, 5, 6]
    assert m.classify_free("free", legal, None, 0) is None
    c = m.classify_free("free", legal + legal[:1], None, 0)
    assert (c.name, c.reaction) == ("free.double", names.UNNOTICED)
    c = m.classify_free("free", legal, None, 1)
    assert (c.name, c.reaction) == ("free.foreign", names.UNNOTICED)
    assert m.free("free", legal) == []
    # Now freed: a double free. At page_size 1 the slot lost its peer too, and the
    # peer-mapped guard is the reaction owed first.
    c = m.classify_free("free", legal)
    assert c.reaction == (names.PEER_MAPPED if ps == 1 else names.UNNOTICED)
    if ps > 1:
        assert c.name == "free.double"
        # Never handed out.
        c = m.classify_free("free", [7 * ps])
        assert (c.name, c.reaction) == ("free.double", names.UNNOTICED)
        # Half a page of request 1 (positions 0 and 1 on page 3).
        c = m.classify_free("free", [12], None, 1)
        assert (c.name, c.reaction) == ("free.partial_page", names.UNNOTICED)


def test_double_free_of_stranded_slot_is_unnoticed():
    """A slot freed by a tolerated free_full keeps a stale peer, so the peer-mapped guard
    stays quiet on a second free: only the harness notices."""
    m = _hybrid()
    _alloc1(m, [1], [2])
    m.strand([1])
    assert m.self_check() == []
    c = m.classify_free("free", [1])
    assert (c.name, c.reaction) == ("free.double", names.UNNOTICED)


def test_continuation_contracts():
    m = _hybrid(ps=4)
    assert m.alloc_extend([0], [3], [-1], [4, 5, 6], [8, 9, 10], [0]) == []
    assert m.classify_continuation([3], [6]) is None
    assert m.free("free_swa", [4, 5, 6]) == []
    c = m.classify_continuation([3], [6])
    assert (c.name, c.reaction) == ("row.unpaired_continuation", names.UNNOTICED)
    # Re-paired at another in-page offset than the full side: nothing to continue.
    assert m.swa_alloc(4, [12, 13, 14, 15]) == []
    assert m.set_mapping([4, 5, 6], [13, 14, 15]) == []
    c = m.classify_continuation([3], [6])
    assert (c.name, c.reaction) == ("row.misaligned_continuation", names.UNNOTICED)
    assert m.self_check() == []


def test_release_keeps_an_swa_page_another_full_page_pairs_into():
    """A load-back from inside an SWA page pairs two full pages into one SWA page; a
    window eviction of the first leaves that page owned, and the model counts it."""
    m = _hybrid(ps=4)
    full = layout.extend_layout(0, 8, -1, [1, 2], 4)  # positions 0..7: slots 4..11
    assert m.alloc_extend([0], [8], [-1], full, layout.extend_layout(0, 8, -1, [1, 2], 4), [0]) == []
    assert m.free("free_swa", full) == []
    assert m.kept_paired == 0
    # Positions 0..7 paired again from offset 1 of a fresh SWA run: 13..20, so SWA
    # page 4 (16..19) holds peers of both full pages.
    assert m.swa_alloc(12, [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]) == []
    assert m.set_mapping(full, list(range(13, 21))) == []
    assert m.free("free_swa", full[:4]) == []
    assert m.kept_paired == 1  # page 4: 17..19 still paired from full page 2
    assert 4 not in m.swa.free and 3 in m.swa.free
    assert m.self_check() == []


def test_packed_tail_is_a_layout_violation():
    """A tail packed from offset 0 leaves the SWA row nothing a later decode can
    continue (FINDINGS.md), so the model wants the full side's in-page offsets."""
    m = _hybrid(ps=4)
    full = layout.extend_layout(0, 5, -1, [1, 2], 4)  # positions 0..4: slots 4..8
    packed = layout.tail_layout(5, 3, [3], 4, aligned=False)  # positions 2..4 at 12..14
    got = m.alloc_extend_swa_tail(0, 5, -1, 3, full, [0, 0] + packed, 0)
    assert got and got[0].invariant == names.LAYOUT and "offset" in got[0].detail
    aligned = layout.tail_layout(5, 3, [3, 4], 4, aligned=True)  # at offsets 2, 3, 0
    assert m.alloc_extend_swa_tail(0, 5, -1, 3, full, [0, 0] + aligned, 0) == []
    f2 = layout.extend_layout(5, 8, full[-1], [], 4)
    s2 = layout.extend_layout(5, 8, m.peer[full[-1]], [], 4)
    assert m.classify_continuation([5], [full[-1]]) is None
    assert m.alloc_extend([5], [8], [full[-1]], f2, s2, [0]) == []


def test_pure_swa_free_full_is_a_no_op():
    m = Model("pure_swa", 8, 8, 1)
    assert m.alloc(2, [1, 2], None, [0, 0]) == []
    assert m.classify_free("free_full", [1, 2]) is None
    assert m.free("free_full", [1, 2]) == []
    assert m.full.live == {1, 2}


def test_correct_allocator_reaches_every_state_kind():
    """Smoke: one scripted run per kind with self_check and census clean."""
    for cfg in (
        dict(kind="hybrid", size=8, size_swa=8, page_size=1),
        dict(kind="hybrid", size=32, size_swa=32, page_size=4),
        dict(kind="pure_swa", size=8, size_swa=8, page_size=1),
        dict(kind="hybrid", size=32, size_swa=32, page_size=4, ring_size=4, req_slots=2),
    ):
        m = Model(**cfg)
        ps = cfg["page_size"]
        if ps == 1:
            assert m.alloc(3, [1, 2, 3], None if m.pure else [4, 5, 6]) == []
        else:
            swa = None if m.ring else [8, 9, 10, 11, 12]
            assert m.alloc_extend([0], [5], [-1], [4, 5, 6, 7, 8], swa) == []
        assert m.self_check() == []
