"""The page arithmetic the reference model calls, with contracts `crosshair check` analyses.

Everything here is a total function of small integers and lists of integers, so the
model can use it per call and crosshair can search it for counterexamples. Only what
the model calls lives here. Each post-condition states a property the allocator
relies on in other terms than the body computes it, so a wrong body breaks at least
one of them; tests/reference/test_crosshair_not_vacuous.py plants a bug in each
function and shows crosshair refutes it.
"""

from __future__ import annotations


def pages_spanned(num_tokens: int, page_size: int) -> int:
    """Pages that hold positions 0..num_tokens-1.

    pre: num_tokens >= 0
    pre: page_size >= 1
    post: __return__ * page_size >= num_tokens
    post: (__return__ - 1) * page_size < num_tokens or __return__ == 0
    """
    return (num_tokens + page_size - 1) // page_size


def new_pages(prefix_len: int, seq_len: int, page_size: int) -> int:
    """Pages a request needs to grow from prefix_len to seq_len positions.

    The positions that do not continue the last partial page fill fresh pages from
    offset 0, so they need exactly as many pages as they span.

    pre: 0 <= prefix_len <= seq_len
    pre: page_size >= 1
    post: __return__ >= 0
    post: __return__ <= (seq_len - prefix_len + page_size - 1) // page_size
    post: seq_len == prefix_len or prefix_len % page_size != 0 or __return__ >= 1
    post: __return__ == pages_spanned(seq_len - prefix_len - continued_count(prefix_len, seq_len, page_size), page_size)
    """
    return pages_spanned(seq_len, page_size) - pages_spanned(prefix_len, page_size)


def total_new_pages(prefix_lens: list[int], seq_lens: list[int], page_size: int) -> int:
    """
    pre: len(prefix_lens) == len(seq_lens)
    pre: all(0 <= p <= s for p, s in zip(prefix_lens, seq_lens))
    pre: page_size >= 1
    post: __return__ >= 0
    post: __return__ <= sum(seq_lens) - sum(prefix_lens)
    post: __return__ >= sum(1 for p, s in zip(prefix_lens, seq_lens) if s > p and p % page_size == 0)
    post: __return__ == 0 or any(s > p for p, s in zip(prefix_lens, seq_lens))
    """
    return sum(new_pages(p, s, page_size) for p, s in zip(prefix_lens, seq_lens))


def continued_count(prefix_len: int, seq_len: int, page_size: int) -> int:
    """How many of the new positions continue the request's last, partial page.

    pre: 0 <= prefix_len <= seq_len
    pre: page_size >= 1
    post: 0 <= __return__ <= seq_len - prefix_len
    post: __return__ < page_size
    post: prefix_len % page_size != 0 or __return__ == 0
    post: __return__ == seq_len - prefix_len or (prefix_len + __return__) % page_size == 0
    post: __return__ == 0 or (prefix_len + __return__ - 1) // page_size == prefix_len // page_size
    post: prefix_len % page_size == 0 or seq_len == prefix_len or __return__ >= 1
    """
    if prefix_len % page_size == 0:
        return 0
    return min(seq_len, (prefix_len // page_size + 1) * page_size) - prefix_len


def expand_to_pages(slots: list[int], page_size: int) -> list[int]:
    """Every slot of every page that `slots` touch, each page once, in first-touch order.

    pre: page_size >= 1
    pre: all(s >= 0 for s in slots)
    post: len(__return__) % page_size == 0
    post: set(s // page_size for s in __return__) == set(s // page_size for s in slots)
    post: len(__return__) == len(set(__return__))
    post: len(__return__) == page_size * len(set(s // page_size for s in slots))
    post: all(s % page_size == i % page_size for i, s in enumerate(__return__))
    post: [__return__[i] // page_size for i in range(0, len(__return__), page_size)] == list(dict.fromkeys(s // page_size for s in slots))
    """
    seen: dict[int, None] = {}
    for s in slots:
        seen.setdefault(s // page_size, None)
    return [p * page_size + o for p in seen for o in range(page_size)]


def tail_pages_bounds(seq_len: int, tail_len: int, page_size: int) -> tuple[int, int]:
    """Fewest and most fresh SWA pages a legal tail allocation takes.

    The tail's SWA slots may start at offset 0 of a fresh page (tail_len packed) or
    keep the full side's in-page offsets; either holds the tail, and the second may
    straddle one more page.

    pre: 0 <= tail_len <= seq_len
    pre: page_size >= 1
    post: __return__[0] <= __return__[1] <= __return__[0] + 1
    post: __return__[0] * page_size >= tail_len
    post: __return__[0] == 0 or (__return__[0] - 1) * page_size < tail_len
    post: __return__[1] == len({q // page_size for q in range(seq_len - tail_len, seq_len)})
    """
    packed = pages_spanned(tail_len, page_size)
    aligned = pages_spanned(seq_len, page_size) - (seq_len - tail_len) // page_size
    if tail_len == 0:
        aligned = 0
    return packed, max(packed, aligned)


# Layouts a correct allocator makes. The model never calls them (it checks layouts by
# their properties, above); its own tests and benchmark use them to play a correct
# allocator against it, where the model is what checks them. No contracts here.


def extend_layout(
    prefix_len: int, seq_len: int, last_loc: int, pages: list[int], page_size: int
) -> list[int]:
    """Slots for positions prefix_len..seq_len-1: continue last_loc's page, then `pages`."""
    k = continued_count(prefix_len, seq_len, page_size)
    out = [last_loc + 1 + i for i in range(k)]
    for pos in range(prefix_len + k, seq_len):
        out.append(pages[(pos - prefix_len - k) // page_size] * page_size + pos % page_size)
    return out


def decode_layout(seq_len: int, last_loc: int, page: int, page_size: int) -> int:
    """The slot of decode position seq_len-1: last_loc+1 inside the page, else the first
    slot of `page` (ignored when no page opens)."""
    if (seq_len - 1) % page_size:
        return last_loc + 1
    return page * page_size


def tail_layout(extend_len: int, tail_len: int, pages: list[int], page_size: int, aligned: bool) -> list[int]:
    """SWA slots of the last tail_len positions of an extend from position 0: packed from
    offset 0 of the first page, or (aligned) at the full side's in-page offsets."""
    off = (extend_len - tail_len) % page_size if aligned else 0
    return [pages[(off + j) // page_size] * page_size + (off + j) % page_size for j in range(tail_len)]
