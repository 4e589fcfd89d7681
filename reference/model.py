"""The ownership model: what a correct hybrid SWA allocator's state is after each call.

Pure Python over ints, lists, sets and dicts. Every call costs O(slots it touches);
only `census` and `self_check` walk a whole pool, and the harness runs them
periodically. Where the allocator may choose (which free page), the model checks
that the choice is legal and adopts it: reuse order is the allocator's policy.

Each allocator call is modelled in two halves: `classify_*` says whether the call
keeps the caller's side of the contract (SPEC 3.2) before anything runs, and the
method of the call's own name checks an observed result against the model and
adopts it, returning the violations it found (SPEC 3.3 names).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from reference import layout, names


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


@dataclass(frozen=True)
class Contract:
    """A broken caller contract, and the reaction the allocator owes it.

    debug_refuses: sglang's memory-pool debug mode (SGLANG_DEBUG_MEMORY_POOL) catches
    this break at the call, before anything changes, so with debug mode on the
    allocator owes a refusal (an AssertionError) where `reaction` alone says it need
    not notice, or where a guard is off.
    """

    name: str
    reaction: str  # names.ERROR, names.UNNOTICED, or one of names.GUARDS
    detail: str
    debug_refuses: bool = False

    def __str__(self) -> str:
        return f"contract {self.name} ({self.reaction}): {self.detail}"


class _Pool:
    """One pool: free pages (free list and staging alike) and live slots per page."""

    def __init__(self, size: int, page_size: int):
        self.page_size = page_size
        self.num_pages = size // page_size
        self.free: set[int] = set(range(1, self.num_pages + 1))
        self.live: set[int] = set()
        self.used: Counter[int] = Counter()  # page -> live slots on it
        self.owner: dict[int, int] = {}  # live slot -> request, where the caller said

    def available(self) -> int:
        return len(self.free) * self.page_size

    def page(self, slot: int) -> int:
        return slot // self.page_size

    def take_live(self, slot: int, owner: int | None = None) -> None:
        self.live.add(slot)
        self.used[slot // self.page_size] += 1
        if owner is not None:
            self.owner[slot] = owner

    def take_live_all(self, slots: list[int], owners: list[int] | None = None) -> None:
        """take_live for each slot (none live yet, none named twice), in C-level passes."""
        self.live.update(slots)
        ps = self.page_size
        self.used.update(slots if ps == 1 else [s // ps for s in slots])
        if owners is not None:
            self.owner.update(zip(slots, owners))

    def drop_live_all(self, slots: list[int]) -> None:
        """drop_live for each live slot of `slots`; the others, and repeats, are skipped."""
        live = self.live
        slots = [s for s in dict.fromkeys(slots) if s in live]
        live.difference_update(slots)
        pop = self.owner.pop
        for s in slots:
            pop(s, None)
        ps = self.page_size
        pages = slots if ps == 1 else [s // ps for s in slots]
        used = self.used
        used.subtract(pages)
        for p in set(pages):
            if used[p] == 0:
                del used[p]

    def drop_live(self, slot: int) -> None:
        self.live.discard(slot)
        self.owner.pop(slot, None)
        p = slot // self.page_size
        self.used[p] -= 1
        if self.used[p] == 0:
            del self.used[p]

    def owned(self, page: int) -> bool:
        return 1 <= page <= self.num_pages and page not in self.free


class Model:
    """Reference state of one allocator.

    kind: "hybrid" or "pure_swa"; ring_size set (hybrid, page_size > 1) models the
    per-request SWA ring, whose SWA side is counted in request slots, not paged.
    """

    def __init__(
        self,
        kind: str,
        size: int,
        size_swa: int,
        page_size: int,
        need_sort: bool = False,
        ring_size: int | None = None,
        req_slots: int | None = None,
    ):
        if kind not in ("hybrid", "pure_swa"):
            raise ValueError(f"kind must be 'hybrid' or 'pure_swa', got {kind!r}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if kind == "pure_swa" and page_size != 1:
            raise ValueError("pure_swa supports page_size 1 only")
        if ring_size is not None and (kind != "hybrid" or req_slots is None):
            raise ValueError("ring mode needs kind 'hybrid' and req_slots")
        self.kind = kind
        self.page_size = page_size
        self.need_sort = need_sort
        self.ring_size = ring_size
        self.req_slots = req_slots
        self.built_size = size
        self.built_size_swa = size if kind == "pure_swa" else size_swa
        self.ring_cost = 0 if ring_size is None else layout.pages_spanned(ring_size, page_size) * page_size
        self.req_free: set[int] = set(range(req_slots)) if ring_size is not None else set()
        # SWA pages a release left owned because another full page still pairs into
        # them (a re-pair from inside a page): a count for the harness's coverage.
        self.kept_paired = 0
        self._reset(size, self.built_size_swa)

    # ----------------------------------------------------------------- state
    def _reset(self, size: int, size_swa: int) -> None:
        self.size_full = size
        self.size_swa = size_swa
        self.full = _Pool(size, self.page_size)
        self.swa = self.full if self.kind == "pure_swa" else _Pool(size_swa, self.page_size)
        self.peer: dict[int, int] = {}  # full slot -> SWA slot
        self.rev: dict[int, int] = {}  # SWA slot -> full slot
        # Freed full slots whose peer a tolerated free_full left in the mapping; the
        # SWA slot stays owned (stranded) until the mapping entry is reused.
        self.stale: dict[int, int] = {}
        self.leaked: set[int] = set()  # SWA pages only lost stranded slots kept owned
        self.group_released: tuple[set[int], set[int]] = (set(), set())  # by the last group end
        self.group_open = False
        self.held_full: list[int] = []  # full pages a group will release
        self.held_swa: list[int] = []  # SWA pages a group will release

    @property
    def pure(self) -> bool:
        return self.kind == "pure_swa"

    @property
    def ring(self) -> bool:
        return self.ring_size is not None

    @property
    def mapping_len(self) -> int:
        """Length of the observed mapping, sentinel included."""
        return self.built_size + self.page_size + 1

    def full_available(self) -> int:
        return self.full.available()

    def swa_available(self) -> int:
        if self.ring:
            return len(self.req_free) * self.ring_cost
        return self.swa.available()

    def available(self) -> int:
        if self.ring:
            return self.full_available()
        return min(self.full_available(), self.swa_available())

    def sizes(self) -> dict[str, int]:
        return {
            "available_size": self.available(),
            "full_available_size": self.full_available(),
            "swa_available_size": self.swa_available(),
        }

    def capacities(self) -> dict[str, int]:
        """What the allocator's size_full, size_swa and size must say: each pool's size
        in slots since the last resize (in ring mode the SWA side is the request slots'
        rings, as its available size counts them)."""
        swa = self.req_slots * self.ring_cost if self.ring else self.size_swa
        return {"size_full": self.size_full, "size_swa": swa, "size": min(self.size_full, swa)}

    def check_capacities(self, observed: dict[str, int]) -> list[Violation]:
        """Compare the observed pool sizes (those the target has) with the model's."""
        return [
            Violation(names.CAPACITY, f"{key} is {observed[key]}, model says {want}")
            for key, want in self.capacities().items()
            if key in observed and observed[key] != want
        ]

    def peer_of(self, full_slot: int) -> int:
        """What mapping[full_slot] must read: the peer, or 0."""
        if self.pure:
            return full_slot
        return self.peer.get(full_slot) or self.stale.get(full_slot, 0)

    def peers_of(self, full_slots: list[int]) -> list[int]:
        """peer_of for each slot: one pass, for the per-call checks."""
        if self.pure:
            return list(full_slots)
        peer, stale = self.peer.get, self.stale.get
        return [peer(f) or stale(f, 0) for f in full_slots]

    def page_owners(self, side: str, page: int) -> list[int]:
        """The requests with a live slot on `page` of the "full" or "swa" pool, read-only
        and O(page_size). An SWA slot belongs to the request of the full slot paired
        into it; a slot no request is known for (an unpaired re-pair, a stranded peer)
        adds nothing."""
        ps = self.page_size
        owners: set[int] = set()
        for s in range(page * ps, page * ps + ps):
            if side == "full" or self.pure:
                r = self.full.owner.get(s)
            else:
                f = self.rev.get(s)
                r = None if f is None else self.full.owner.get(f)
            if r is not None:
                owners.add(r)
        return sorted(owners)

    # --------------------------------------------------------- classification
    def classify_alloc(self, n: int) -> Contract | None:
        if n < 0:
            return Contract("alloc.negative", names.ERROR, f"alloc({n})")
        if self.page_size != 1:
            return Contract("alloc.paged", names.ERROR, f"alloc on page_size {self.page_size}")
        return None

    def classify_paged(self, call: str) -> Contract | None:
        if self.pure:
            return Contract("pure.paged", names.ERROR, f"{call} on a pure SWA allocator")
        if self.page_size == 1:
            return Contract("paged.token", names.ERROR, f"{call} on page_size 1")
        return None

    def classify_mapping(self, call: str) -> Contract | None:
        """set_full_to_swa_mapping / clear_full_to_swa_mapping: a pure SWA allocator's
        mapping is the identity and is never rewritten (SPEC 2.7)."""
        if self.pure:
            return Contract("pure.mapping", names.ERROR, f"{call} on a pure SWA allocator")
        return None

    def classify_continuation(self, prefix_lens: list[int], last_locs: list[int]) -> Contract | None:
        """A row continued mid-page must still have an SWA peer at its last position, at
        its full slot's in-page offset. The allocator only lays peers out that way, so
        another offset comes from a re-pair, and leaves the SWA row nothing to continue."""
        if self.ring or self.pure:
            return None
        ps = self.page_size
        for i, (p, last) in enumerate(zip(prefix_lens, last_locs)):
            if not p % ps:
                continue
            if last not in self.peer:
                return Contract(
                    "row.unpaired_continuation",
                    names.UNNOTICED,
                    f"request {i} continues the page of slot {last} (prefix {p}) but that slot has no SWA peer",
                )
            if self.peer[last] % ps != last % ps:
                return Contract(
                    "row.misaligned_continuation",
                    names.UNNOTICED,
                    f"request {i} continues mid-page from slot {last}, re-paired at SWA offset {self.peer[last] % ps}",
                )
        return None

    def classify_tail(self, prefix_lens: list[int], seq_lens: list[int], extend_num_tokens: int, tail: int) -> Contract | None:
        c = self.classify_paged("alloc_extend_swa_tail")
        if c:
            return c
        if len(seq_lens) != 1 or len(prefix_lens) != 1:
            return Contract("tail.batch", names.ERROR, f"batch size {len(seq_lens)}, must be 1")
        if not 0 <= tail <= extend_num_tokens:
            return Contract("tail.length", names.ERROR, f"tail {tail} outside 0..{extend_num_tokens}")
        return None

    def classify_free(
        self, call: str, slots: list[int], start_pos: int | None = None, row: int | None = None
    ) -> Contract | None:
        """call: free, free_swa, free_full, free_segment, free_full_segment.

        row, where given, is the request the caller frees for: a slot another request
        owns is a foreign free."""
        if start_pos is not None and start_pos % self.page_size:
            return Contract("segment.unaligned", names.ERROR, f"start_pos {start_pos} not a multiple of {self.page_size}")
        if not slots:
            return None
        if not self.pure:
            if call in ("free_full", "free_full_segment"):
                paired = [s for s in slots if self.peer_of(s)]
                if paired:
                    return Contract("free_full.paired", names.PEER_RELEASED, f"{call} of slots {paired[:4]} that still have SWA peers")
            elif self.page_size == 1:
                unpaired = [s for s in slots if not self.peer_of(s)]
                if unpaired:
                    return Contract("free.unpaired", names.PEER_MAPPED, f"{call} of slots {unpaired[:4]} with no SWA peer")
        if call == "free_swa" and not self.pure:
            return None  # full slots stay; nothing is released twice on the full side
        if self.pure and call in ("free_full", "free_full_segment"):
            return None  # no full pool: a no-op
        dead = [s for s in slots if s not in self.full.live]
        if dead:
            return Contract("free.double", names.UNNOTICED, f"{call} of slots {dead[:4]} not in use", self._debug_sees_free_page(slots))
        if len(set(slots)) != len(slots):
            return Contract("free.double", names.UNNOTICED, f"{call} names a slot twice")
        if row is not None:
            foreign = [s for s in slots if self.full.owner.get(s, row) != row]
            if foreign:
                return Contract("free.foreign", names.UNNOTICED, f"{call} of slots {foreign[:4]} that another request owns")
        if self.page_size > 1:
            on_page = Counter(s // self.page_size for s in slots)
            for p, k in on_page.items():
                if self.full.used[p] != k:
                    return Contract(
                        "free.partial_page",
                        names.UNNOTICED,
                        f"{call} releases page {p} while {self.full.used[p] - k} other slots on it are in use",
                    )
            if call == "free_segment" and not self.pure and not self.ring and start_pos is not None:
                # sglang 0.5.23's free_segment frees its SWA half through
                # free_swa_segment: a page whose representative has no peer (its SWA
                # half already released) goes by free_full_segment. The seed's and the
                # impl's set-shaped SWA half do not notice, sglang's guard does: never sent.
                half = self.classify_free_swa_segment(slots, start_pos, row)
                if half is not None:
                    return Contract("segment.swa_half", names.UNNOTICED, f"free_segment's SWA half breaks {half}")
        return None

    def _debug_sees_free_page(self, slots: list[int]) -> bool:
        """Debug mode refuses a paged full-side release of a page that is already free
        (or page 0) before anything changes: outside a group (inside one it checks only
        at the group end), and where no stale peer on those pages would be released
        first by the SWA half. Page size 1 has no debug checks, as in sglang 0.5.23."""
        ps = self.page_size
        if ps == 1 or self.group_open:
            return False
        pages = {s // ps for s in slots}
        if not any(p == 0 or p in self.full.free for p in pages):
            return False
        return not any(f in self.stale for f in layout.expand_to_pages(slots, ps))

    def classify_free_swa_segment(self, slots: list[int], start_pos: int, row: int | None = None) -> Contract | None:
        """free_swa_segment(slots, start_pos) (sglang 0.5.23): one representative per
        page, slots[::page_size]; each one's SWA peer page is released whole and its full
        page unpaired. Legal when the start is aligned, every representative has a peer,
        and each full page and its representative's SWA page are paired in step (the
        full page's peers lie on that SWA page, which pairs with no other full page)."""
        ps = self.page_size
        if start_pos % ps:
            return Contract("segment.unaligned", names.ERROR, f"start_pos {start_pos} not a multiple of {ps}")
        if not slots or self.ring:
            return None  # ring mode: a no-op, the SWA side is not paged
        if self.pure or ps == 1:
            return self.classify_free("free_swa", slots, None, row)
        dead = [s for s in slots if s not in self.full.live]
        if dead:
            return Contract("free.double", names.UNNOTICED, f"free_swa_segment of slots {dead[:4]} not in use")
        expanded = layout.expand_to_pages(slots, ps)
        if any(f in self.stale for f in expanded):
            return Contract("swa_segment.stale", names.UNNOTICED, "a page of the segment keeps a stale peer")
        reps = slots[::ps]
        unpaired = [f for f in reps if f not in self.peer]
        if unpaired:
            return Contract(
                "swa_segment.unpaired_rep", names.PEER_MAPPED,
                f"free_swa_segment: page representatives {unpaired[:4]} have no SWA peer", True,
            )
        rep_pages = sorted(self.peer[f] // ps for f in reps)
        mapped = sorted({self.peer[f] // ps for f in expanded if f in self.peer})
        if rep_pages != mapped:
            return Contract(
                "swa_segment.not_in_step", names.UNNOTICED,
                f"free_swa_segment: representatives' SWA pages {rep_pages[:4]}, the full pages map into {mapped[:4]}", True,
            )
        paired_here = Counter(self.peer[f] // ps for f in expanded if f in self.peer)
        shared = [p for p, k in paired_here.items() if self.swa.used[p] != k]
        if shared:
            return Contract("swa_segment.shared_page", names.UNNOTICED, f"SWA pages {shared[:4]} also pair with full pages outside the segment")
        return None

    def classify_free_page_ids(self, pages: list[int], slots: list[int], row: int | None = None) -> Contract | None:
        """free_page_ids(pages) on the full pool (the only pool when pure): exactly these
        pages, none twice, never page 0, none free. Legal when `slots` (the caller's live
        slots on them) are every live slot on those pages, and none has an SWA peer:
        the call does not look at the mapping."""
        ps = self.page_size
        debug = ps > 1 and not self.group_open  # page size 1 (pure included) has no checks
        named = set(pages)
        if len(named) != len(pages):
            return Contract("page_ids.twice", names.UNNOTICED, f"free_page_ids names a page twice: {pages[:6]}", debug)
        if 0 in pages:
            return Contract("page_ids.padding", names.UNNOTICED, "free_page_ids names page 0, the padding page", debug)
        free = [p for p in pages if p in self.full.free or not 1 <= p <= self.full.num_pages]
        if free:
            return Contract("page_ids.double", names.UNNOTICED, f"free_page_ids of pages {free[:4]} not in use", debug)
        dead = [s for s in slots if s not in self.full.live or s // ps not in named]
        if dead or len(set(slots)) != len(slots):
            return Contract("free.double", names.UNNOTICED, f"free_page_ids: slots {dead[:4]} not in use or named twice")
        if row is not None:
            foreign = [s for s in slots if self.full.owner.get(s, row) != row]
            if foreign:
                return Contract("free.foreign", names.UNNOTICED, f"free_page_ids over slots {foreign[:4]} another request owns")
        on_page = Counter(s // ps for s in slots)
        busy = [p for p in pages if self.full.used[p] != on_page[p]]
        if busy:
            return Contract("free.partial_page", names.UNNOTICED, f"free_page_ids releases pages {busy[:4]} whose other slots are in use")
        if not self.pure:
            paired = [s for s in slots if self.peer_of(s)]
            if paired:
                return Contract("page_ids.paired", names.UNNOTICED, f"free_page_ids of slots {paired[:4]} that still have SWA peers")
        return None

    def classify_segments(self, segments: list[tuple[list[int], int]], row: int | None = None) -> Contract | None:
        """free_segments: each piece legal on its own, starts ascending, no page shared."""
        last_start, seen = -1, set()
        for idx, start in segments:
            c = self.classify_free("free_segment", idx, start, row)
            if c:
                return c
            pages = {s // self.page_size for s in idx}
            if start <= last_start or pages & seen:
                return Contract("segments.order", names.ERROR, f"segment at {start} is out of order or shares a page")
            last_start = start
            seen |= pages
        return None

    def classify_group_begin(self) -> Contract | None:
        if self.group_open:
            return Contract("group.nested", names.ERROR, "free_group_begin while a group is open")
        return None

    def classify_resize(self, size: int, size_swa: int) -> Contract | None:
        if size > self.built_size or (not self.pure and size_swa > self.built_size_swa):
            return Contract(
                "resize.grow",
                names.ERROR,
                f"resize to ({size}, {size_swa}) above built ({self.built_size}, {self.built_size_swa})",
            )
        if size < 0 or size_swa < 0:
            return Contract("resize.negative", names.ERROR, f"resize to ({size}, {size_swa})")
        return None

    def classify_repair(self, full_slots: list[int]) -> Contract | None:
        """A re-pair (set_full_to_swa_mapping onto fresh SWA slots) of these full slots."""
        c = self.classify_mapping("set_full_to_swa_mapping")
        if c:
            return c
        bad = [f for f in full_slots if f not in self.full.live or f in self.peer]
        if bad or len(set(full_slots)) != len(full_slots):
            return Contract("pair.taken", names.UNNOTICED, f"full slots {bad[:4]} not in use, already paired, or named twice")
        return None

    # ---------------------------------------------------------------- allocs
    def _check_new(self, pool: _Pool, slot: int, fresh: dict[int, None], what: str, out: list[Violation]) -> None:
        """A slot on a page this call takes from the free list."""
        p = slot // self.page_size
        if p == 0:
            out.append(Violation(names.PADDING_RESERVED, f"{what} slot {slot} is on the padding page"))
        elif p in fresh:
            return
        elif p > pool.num_pages or p < 0:
            out.append(Violation(names.CAPACITY, f"{what} slot {slot} lies outside the pool ({pool.num_pages} pages)"))
        elif p not in pool.free:
            out.append(Violation(names.NO_DOUBLE_OWNERSHIP, f"{what} slot {slot} is on page {p}, which is already owned"))
        fresh[p] = None

    def _check_cont(self, pool: _Pool, slot: int, prev: int, what: str, out: list[Violation]) -> None:
        """A slot continuing the page of `prev`, the row's previous slot."""
        ps = self.page_size
        if slot != prev + 1:
            out.append(Violation(names.LAYOUT, f"{what} slot {slot} should continue slot {prev} at {prev + 1}"))
        elif slot // ps != prev // ps:
            out.append(Violation(
                names.NO_DOUBLE_OWNERSHIP,
                f"{what} slot {slot} runs past the end of page {prev // ps} into page {slot // ps}, which the row does not own",
            ))
        elif slot in pool.live:
            out.append(Violation(names.NO_DOUBLE_OWNERSHIP, f"{what} slot {slot} is already in use"))

    def _adopt(self, pool: _Pool, slots: list[int], fresh: dict[int, None], owners: list[int] | None = None) -> None:
        pool.free.difference_update(fresh)
        pool.take_live_all(slots, owners)

    @staticmethod
    def _per_slot(owners: list[int] | None, prefix_lens: list[int], seq_lens: list[int]) -> list[int] | None:
        if owners is None:
            return None
        return [r for r, p, s in zip(owners, prefix_lens, seq_lens) for _ in range(s - p)]

    def _commit(self, full_slots, fresh, owners, swa_slots, sfresh, paired_full=None) -> None:
        """Adopt a checked allocation: both sides' slots, and the new pairs."""
        self._adopt(self.full, full_slots, fresh, owners)
        self._adopt(self.swa, swa_slots, sfresh)
        self._pair(full_slots if paired_full is None else paired_full, swa_slots)

    def _pair(self, full_slots: list[int], swa_slots: list[int]) -> None:
        self._unmap(full_slots)
        for f, s in zip(full_slots, swa_slots):
            self.peer[f] = s
            self.rev[s] = f

    def _unmap(self, full_slots) -> None:
        """These entries are written over: a stale peer there is lost for good, and
        an SWA page left holding only lost slots leaks (the caller's doing)."""
        for f in full_slots:
            s = self.stale.pop(f, None)
            if s is not None:
                self.swa.drop_live(s)
                if not self.swa.used[s // self.page_size]:
                    self.leaked.add(s // self.page_size)

    def transfer(self, full_slots: list[int], owner: int) -> None:
        """These live full slots now belong to `owner` (a cached entry handed to a request)."""
        for f in full_slots:
            self.full.owner[f] = owner

    def strand(self, slots: list[int]) -> None:
        """A free_full of paired slots that the allocator accepted (guard off or counting):
        the full slots go, their mapping entries and SWA peers stay behind."""
        for f in slots:
            s = self.peer.pop(f, None)
            if s is not None:
                del self.rev[s]
                self.stale[f] = s
        self._free_full_slots(slots)

    def _short(self, n_full: int, n_swa: int) -> bool:
        if len(self.full.free) < n_full:
            return True
        if self.ring or self.pure:
            return False
        return len(self.swa.free) < n_swa

    def _check_none(self, result, short: bool, call: str, out: list[Violation]) -> bool:
        """True when the result is None (checked); records a capacity mismatch."""
        if result is None:
            if not short:
                out.append(Violation(names.CAPACITY, f"{call} returned None with enough free pages ({self.free_desc()})"))
            return True
        if short:
            out.append(Violation(names.CAPACITY, f"{call} returned slots although a pool is short ({self.free_desc()})"))
        return False

    def free_desc(self) -> str:
        if self.pure:
            return f"free {len(self.full.free)}"
        return f"full free {len(self.full.free)} pages, SWA free {len(self.swa.free)} pages"

    def _check_swa_side(self, full_slots: list[int], swa_slots: list[int] | None, out: list[Violation]) -> bool:
        """The observed peers of new full slots must be distinct, nonzero slots."""
        if swa_slots is None or len(swa_slots) != len(full_slots):
            out.append(Violation(names.MAP_LIVE, f"new full slots {full_slots[:4]} have no readable peers"))
            return False
        if len(set(swa_slots)) != len(swa_slots):
            dup = [s for s, k in Counter(swa_slots).items() if k > 1]
            out.append(Violation(names.NO_DOUBLE_OWNERSHIP, f"SWA slots {dup[:4]} paired with two new full slots"))
            return False
        return True

    def alloc(
        self, n: int, full_slots: list[int] | None, swa_slots: list[int] | None, owners: list[int] | None = None
    ) -> list[Violation]:
        """alloc(n) at page_size 1: any n free slots; hybrid pairs each with a fresh SWA slot.

        owners, where given, names the request of each slot, in order."""
        out: list[Violation] = []
        if self._check_none(full_slots, self._short(n, n), f"alloc({n})", out):
            return out
        if len(full_slots) != n or len(set(full_slots)) != n:
            out.append(Violation(names.LAYOUT, f"alloc({n}) returned {len(full_slots)} slots, {len(set(full_slots))} distinct"))
            return out
        fresh = self._fresh_slots(self.full, full_slots, "full", out)
        if self.pure:
            if out:
                return out
            self._adopt(self.full, full_slots, fresh, owners)
            return out
        if not self._check_swa_side(full_slots, swa_slots, out):
            return out
        sfresh = self._fresh_slots(self.swa, swa_slots, "SWA", out)
        if not out:
            self._commit(full_slots, fresh, owners, swa_slots, sfresh)
        return out

    def _fresh_slots(self, pool: _Pool, slots: list[int], what: str, out: list[Violation]) -> dict[int, None]:
        """_check_new for each slot of an alloc(n) at page size 1, where a slot is its
        own page: one subset test when all are free, the named checks otherwise."""
        if pool.page_size == 1 and slots and 0 < min(slots) and max(slots) <= pool.num_pages and pool.free.issuperset(slots):
            return dict.fromkeys(slots)
        fresh: dict[int, None] = {}
        for s in slots:
            self._check_new(pool, s, fresh, what, out)
        return fresh

    def alloc_extend(
        self,
        prefix_lens: list[int],
        seq_lens: list[int],
        last_locs: list[int],
        full_slots: list[int] | None,
        swa_slots: list[int] | None,
        owners: list[int] | None = None,
    ) -> list[Violation]:
        """Positions prefix..seq-1 of each request, laid out as SPEC 2.5 says on both sides.

        owners, where given, names each request of the batch."""
        out: list[Violation] = []
        n = layout.total_new_pages(prefix_lens, seq_lens, self.page_size)
        if self._check_none(full_slots, self._short(n, n), "alloc_extend", out):
            return out
        want = sum(seq_lens) - sum(prefix_lens)
        if len(full_slots) != want:
            out.append(Violation(names.LAYOUT, f"alloc_extend returned {len(full_slots)} slots for {want} positions"))
            return out
        return self._place(prefix_lens, seq_lens, last_locs, full_slots, swa_slots, out, owners)

    def alloc_decode(
        self,
        seq_lens: list[int],
        last_locs: list[int],
        full_slots: list[int] | None,
        swa_slots: list[int] | None,
        owners: list[int] | None = None,
    ) -> list[Violation]:
        out: list[Violation] = []
        prefix_lens = [s - 1 for s in seq_lens]
        n = layout.total_new_pages(prefix_lens, seq_lens, self.page_size)
        if self._check_none(full_slots, self._short(n, n), "alloc_decode", out):
            return out
        if len(full_slots) != len(seq_lens):
            out.append(Violation(names.LAYOUT, f"alloc_decode returned {len(full_slots)} slots for {len(seq_lens)} requests"))
            return out
        return self._place(prefix_lens, seq_lens, last_locs, full_slots, swa_slots, out, owners)

    def _check_rows(self, pool, side, prefix_lens, seq_lens, last_locs, slots, out) -> dict[int, None]:
        """SPEC 2.5 layout of each request's new positions; returns the fresh pages."""
        ps = self.page_size
        fresh: dict[int, None] = {}
        live, free, top = pool.live, pool.free, pool.num_pages
        i = 0
        for r, (p, s, last) in enumerate(zip(prefix_lens, seq_lens, last_locs)):
            k = layout.continued_count(p, s, ps)
            prev = last
            for pos in range(p, s):
                slot = slots[i]
                # The common case is tested inline; the checks that name what is wrong
                # (and build the message) run only where it fails.
                if pos < p + k or pos % ps:
                    if slot != prev + 1 or slot // ps != prev // ps or slot in live:
                        self._check_cont(pool, slot, prev, f"{side} (request {r}, position {pos})", out)
                elif slot % ps:
                    out.append(Violation(names.LAYOUT, f"{side} (request {r}, position {pos}) slot {slot} does not open a page"))
                else:
                    page = slot // ps
                    if page in fresh or not 0 < page <= top or page not in free:
                        what = f"{side} (request {r}, position {pos})"
                        if page in fresh:
                            out.append(Violation(names.NO_DOUBLE_OWNERSHIP, f"{what} page {page} handed out twice in one call"))
                        self._check_new(pool, slot, fresh, what, out)
                    else:
                        fresh[page] = None
                prev = slot
                i += 1
        return fresh

    def _place(self, prefix_lens, seq_lens, last_locs, full_slots, swa_slots, out, owners) -> list[Violation]:
        fresh = self._check_rows(self.full, "full", prefix_lens, seq_lens, last_locs, full_slots, out)
        owners = self._per_slot(owners, prefix_lens, seq_lens)
        if out:
            return out
        if self.ring:
            self._adopt(self.full, full_slots, fresh, owners)
            return out
        # The SWA side continues from the peer of each last_loc.
        if not self._check_swa_side(full_slots, swa_slots, out):
            return out
        swa_last = [self.peer.get(last, 0) if last >= 0 else last for last in last_locs]
        sfresh = self._check_rows(self.swa, "SWA", prefix_lens, seq_lens, swa_last, swa_slots, out)
        if not out:
            self._commit(full_slots, fresh, owners, swa_slots, sfresh)
        return out

    def alloc_extend_swa_tail(
        self,
        prefix_len: int,
        seq_len: int,
        last_loc: int,
        tail: int,
        full_slots: list[int] | None,
        swa_slots: list[int] | None,
        owner: int | None = None,
    ) -> list[Violation]:
        """Full KV for the whole extend, SWA only for its last `tail` positions.

        swa_slots is the mapping read at every new full slot. The tail's SWA slots lie
        on fresh pages at their full slots' in-page offsets: extend and decode page by
        full positions, so a tail packed from offset 0 would have a later decode run
        past its SWA page, and would put one SWA page under two full pages.
        """
        out: list[Violation] = []
        ps = self.page_size
        n_full = layout.new_pages(prefix_len, seq_len, ps)
        n_swa = 0 if self.ring else layout.tail_pages_bounds(seq_len - prefix_len, tail, ps)[1]
        if self._check_none(full_slots, self._short(n_full, n_swa), "alloc_extend_swa_tail", out) or out:
            return out
        if len(full_slots) != seq_len - prefix_len:
            out.append(Violation(names.LAYOUT, f"alloc_extend_swa_tail returned {len(full_slots)} slots for {seq_len - prefix_len} positions"))
            return out
        fresh = self._check_rows(self.full, "full", [prefix_len], [seq_len], [last_loc], full_slots, out)
        owners = None if owner is None else [owner] * len(full_slots)
        if out or self.ring:
            if not out:
                self._adopt(self.full, full_slots, fresh, owners)
            return out
        if swa_slots is None or len(swa_slots) != len(full_slots):
            out.append(Violation(names.MAP_LIVE, "the mapping of the new full slots could not be read"))
            return out
        head = full_slots[: len(full_slots) - tail]
        tail_full, tail_swa = full_slots[len(head):], swa_slots[len(head):]
        stale = [(f, s) for f, s in zip(head, swa_slots) if s != 0]
        if stale:
            out.append(Violation(names.MAP_LIVE, f"full slots before the tail keep stale peers (slot, peer) {stale[:4]}"))
        self._unmap(head)
        if tail and not self._check_swa_side(tail_full, tail_swa, out):
            return out
        sfresh: dict[int, None] = {}
        prev = None
        for pos, slot in zip(range(seq_len - tail, seq_len), tail_swa):
            what = f"SWA tail (position {pos})"
            if slot % ps != pos % ps:
                out.append(Violation(names.LAYOUT, f"{what} slot {slot} has in-page offset {slot % ps}, its full slot {pos % ps}: a later decode would run past the SWA page"))
            elif prev is not None and slot // ps == prev // ps:
                if slot != prev + 1:
                    out.append(Violation(names.LAYOUT, f"{what} slot {slot} should follow slot {prev}"))
            elif slot // ps in sfresh:
                out.append(Violation(names.LAYOUT, f"{what} slot {slot} returns to page {slot // ps}"))
            else:
                self._check_new(self.swa, slot, sfresh, what, out)
            prev = slot
        if not out and len(sfresh) != n_swa:
            out.append(Violation(names.LAYOUT, f"SWA tail of {tail} took {len(sfresh)} pages, want {n_swa}"))
        if not out:
            self._commit(full_slots, fresh, owners, tail_swa, sfresh, tail_full)
        return out

    def swa_alloc(self, n: int, swa_slots: list[int] | None) -> list[Violation]:
        """The SWA sub-allocator's own alloc(n), as a host-cache load-back calls it.

        The pages are owned and unpaired until `set_mapping` pairs slots into them.
        """
        out: list[Violation] = []
        if self._check_none(swa_slots, len(self.swa.free) < n // self.page_size, f"swa alloc({n})", out):
            return out
        if len(swa_slots) != n:
            out.append(Violation(names.LAYOUT, f"swa alloc({n}) returned {len(swa_slots)} slots"))
            return out
        fresh: dict[int, None] = {}
        for j, s in enumerate(swa_slots):
            if j % self.page_size:
                if s != swa_slots[j - 1] + 1:
                    out.append(Violation(names.LAYOUT, f"swa alloc slot {s} should follow {swa_slots[j - 1]}"))
            elif s % self.page_size:
                out.append(Violation(names.LAYOUT, f"swa alloc slot {s} does not open a page"))
            else:
                self._check_new(self.swa, s, fresh, "SWA", out)
        if not out:
            self.swa.free.difference_update(fresh)
        return out

    def set_mapping(self, full_slots: list[int], swa_slots: list[int]) -> list[Violation]:
        """Pair live, unpaired full slots with owned, unpaired SWA slots (a re-pair)."""
        for s in swa_slots:
            self.swa.take_live(s)
        self._pair(full_slots, swa_slots)
        return []

    # ----------------------------------------------------------------- frees
    def _unpair_pages(self, slots: list[int]) -> list[int]:
        """Unpair every full slot on the pages `slots` touch (slots themselves at page 1).

        Returns the SWA pages left with no paired slot: the ones to release.
        """
        ps = self.page_size
        targets = slots if ps == 1 else layout.expand_to_pages(slots, ps)
        emptied: dict[int, None] = {}
        touched: set[int] = set()
        for f in targets:
            s = self.peer.pop(f, None)
            if s is None:
                # A stale entry is read and released like a peer: the allocator
                # releases whatever the mapping points at.
                s = self.stale.pop(f, None)
                if s is None:
                    continue
            else:
                del self.rev[s]
            self.swa.drop_live(s)
            touched.add(s // ps)
            if self.swa.used[s // ps] == 0:
                emptied[s // ps] = None
        self.kept_paired += len(touched) - len(emptied)
        return list(emptied)

    def _release(self, pool: _Pool, pages: list[int], held: list[int]) -> None:
        if self.group_open:
            held.extend(pages)
        else:
            pool.free.update(pages)

    def _free_full_slots(self, slots: list[int]) -> None:
        self.full.drop_live_all(slots)
        ps, used = self.page_size, self.full.used
        pages = dict.fromkeys(slots if ps == 1 else [s // ps for s in slots])
        self._release(self.full, [p for p in pages if used[p] == 0], self.held_full)

    def free(self, call: str, slots: list[int]) -> list[Violation]:
        """Adopt a legal free, free_swa, free_swa_segment, free_full, free_segment or
        free_full_segment. A legal free_swa_segment releases what free_swa would: its
        representatives' SWA pages are the pages its full pages empty."""
        if not slots:
            return []
        if self.pure:
            if call in ("free_full", "free_full_segment"):
                return []
            self._free_full_slots(slots)
            return []
        if call in ("free", "free_swa", "free_swa_segment", "free_segment"):
            emptied = self._unpair_pages(slots)
            if not self.ring:
                self._release(self.swa, emptied, self.held_swa)
        if call not in ("free_swa", "free_swa_segment"):
            self._free_full_slots(slots)
        return []

    def free_page_ids(self, slots: list[int]) -> list[Violation]:
        """Adopt a legal free_page_ids on the full sub-allocator: `slots`, every live
        slot on the freed pages. The hybrid's group is also its full sub-allocator's;
        the pure SWA allocator's group is its own, so the sub-allocator frees at once."""
        if self.pure and self.group_open:
            for s in slots:
                self.full.drop_live(s)
            self.full.free.update(s // self.page_size for s in slots)
            return []
        self._free_full_slots(slots)
        return []

    def group_begin(self) -> list[Violation]:
        self.group_open = True
        return []

    def group_end(self) -> tuple[list[int], list[int]]:
        """Close the group; returns the (full, SWA) pages it released."""
        full, swa = self.held_full, self.held_swa
        self.group_released = (set(full), set(swa))
        self.group_open = False
        self.held_full, self.held_swa = [], []
        self.full.free.update(full)
        if not self.pure:
            self.swa.free.update(swa)
        return full, swa

    def clear(self) -> None:
        self._reset(self.size_full, self.size_swa)

    def resize(self, size: int, size_swa: int) -> None:
        self._reset(size, size if self.pure else size_swa)

    # ------------------------------------------------------------ ring slots
    def req_alloc(self, slot: int | None) -> list[Violation]:
        if slot is None:
            if self.req_free:
                return [Violation(names.CAPACITY, f"request-slot alloc returned None with {len(self.req_free)} free")]
            return []
        if slot not in self.req_free:
            return [Violation(names.NO_DOUBLE_OWNERSHIP, f"request slot {slot} handed out while in use")]
        self.req_free.discard(slot)
        return []

    def req_free_slot(self, slot: int) -> None:
        self.req_free.add(slot)

    # ------------------------------------------------------------- checking
    def check_sizes(self, observed: dict[str, int]) -> list[Violation]:
        """Compare observed available sizes with the model's (O(1)).

        More than the model inside a free group means something held was released
        early; any other difference is a capacity miscount (the census then says
        which pages)."""
        out = []
        for key, want in self.sizes().items():
            got = observed.get(key)
            if got is None or got == want:
                continue
            inv = names.GROUP_DEFERRED if self.group_open and got > want else names.CAPACITY
            out.append(Violation(inv, f"{key}() is {got}, model says {want}"))
        return out

    def check_peers(self, full_slots: list[int], observed: list[int]) -> list[Violation]:
        """mapping[f] for the touched full slots must read the model's peer or 0."""
        wants = self.peers_of(full_slots)
        if list(observed) == wants:
            return []
        out = []
        for f, got, want in zip(full_slots, observed, wants):
            if got != want:
                state = f"paired with {want}" if want else "unpaired"
                out.append(Violation(names.MAP_LIVE, f"mapping[{f}] is {got}, but slot {f} is {state}"))
        return out

    def census(self, full_free: list[int], swa_free: list[int] | None, mapping: list[int], context: str = "") -> list[Violation]:
        """Every page and every peer, against the observed allocator state (O(pool))."""
        out: list[Violation] = []
        tag = f" ({context})" if context else ""
        pools = [("full", self.full, full_free)]
        if not self.pure and not self.ring and swa_free is not None:
            pools.append(("SWA", self.swa, swa_free))
        for name, pool, observed in pools:
            # Set operations, not a Python loop over the pool: this runs every census.
            seen = set(observed)
            if 0 in seen:
                out.append(Violation(names.PADDING_RESERVED, f"page 0 is in the {name} free list{tag}"))
            if len(seen) != len(observed):
                twice = [p for p, k in Counter(observed).items() if k > 1]
                out.append(Violation(names.NO_DOUBLE_OWNERSHIP, f"{name} pages {sorted(twice)[:6]} are in the free list twice{tag}"))
            if seen and (max(seen) > pool.num_pages or min(seen) < 0):
                outside = [p for p in seen if p > pool.num_pages or p < 0]
                out.append(Violation(names.CAPACITY, f"{name} free list holds pages {sorted(outside)[:6]} beyond {pool.num_pages}{tag}"))
            # A page a free group holds, or released at its end, names the group.
            group = set(self.held_full if pool is self.full else self.held_swa)
            group |= self.group_released[0 if pool is self.full else 1]
            owned_but_free = sorted(p for p in seen.difference(pool.free) if 0 < p <= pool.num_pages)
            if owned_but_free:
                inv = names.GROUP_DEFERRED if group.intersection(owned_but_free) else names.NO_DOUBLE_OWNERSHIP
                out.append(Violation(inv, f"{name} pages {owned_but_free[:6]} are free but owned{tag}"))
            lost = sorted(pool.free.difference(seen))
            if lost:
                inv = names.GROUP_DEFERRED if group.intersection(lost) else names.NO_LEAK
                out.append(Violation(inv, f"{name} pages {lost[:6]} should be free but are not in the free list{tag}"))
        if len(mapping) != self.mapping_len:
            out.append(Violation(names.CAPACITY, f"mapping has {len(mapping)} entries, want {self.mapping_len}{tag}"))
        elif mapping[-1] != -1:
            out.append(Violation(names.SENTINEL, f"the mapping's last entry is {mapping[-1]}, not -1{tag}"))
        if not self.pure and len(mapping) == self.mapping_len:
            want = [0] * (self.mapping_len - 1)
            for table in (self.stale, self.peer):
                for f, s in table.items():
                    want[f] = s
            got = mapping[:-1]
            if got != want:
                wrong = [f for f, (g, w) in enumerate(zip(got, want)) if g != w]
                f = wrong[0]
                out.append(Violation(names.MAP_LIVE, f"{len(wrong)} mapping entries differ; mapping[{f}] is {got[f]}, want {want[f]}{tag}"))
        return out

    def self_check(self) -> list[Violation]:
        """SPEC 3.1 on the model's own state (O(pool)); empty unless the model is wrong."""
        out: list[Violation] = []
        pools = [("full", self.full, self.held_full)]
        if not self.pure and not self.ring:
            pools.append(("SWA", self.swa, self.held_swa))
        for name, pool, held in pools:
            if 0 in pool.free:
                out.append(Violation(names.PADDING_RESERVED, f"model: page 0 free in {name}"))
            busy = pool.free.intersection(pool.used)
            if busy:
                out.append(Violation(names.NO_DOUBLE_OWNERSHIP, f"model: {name} pages {sorted(busy)[:6]} free with live slots"))
            orphans = set(range(1, pool.num_pages + 1)).difference(pool.free, pool.used, held)
            if pool is self.swa:
                orphans -= self.leaked
            if orphans:
                out.append(Violation(names.NO_LEAK, f"model: {name} pages {sorted(orphans)[:6]} owned by nothing"))
        if len(set(self.peer.values())) != len(self.peer):
            out.append(Violation(names.MAP_LIVE, "model: pairing not injective"))
        for f in self.peer:
            if f not in self.full.live:
                out.append(Violation(names.MAP_LIVE, f"model: freed full slot {f} has a peer"))
        return out
