"""The speed paths agree with the plain ones they stand in for.

Host-side counts: Python ints for small batches, one torch pass for large ones
(impl.paged._HOST_LIST_MAX); both must give get_num_new_pages and the same errors.
Joint layouts: one extend/decode pass over two pools equals one pass per pool.
Run-table extends (from the host lengths) equal the vectorized layout.
The SWA release: dedup by marking equals torch.unique; the hybrid's free by
deduplicated pages equals its free_swa then the full pool's free.
"""

from __future__ import annotations

import random

import pytest
import torch

from impl import make_allocator
from impl import paged, swa
from impl.paged import PagedTokenToKVPoolAllocator as Paged
from impl.paged import decode_layout, extend_layout, get_num_new_pages


def T(values):
    return torch.tensor(values, dtype=torch.int64)


@pytest.mark.parametrize("n", [1, 3, paged._HOST_LIST_MAX, paged._HOST_LIST_MAX + 1, 300])
@pytest.mark.parametrize("ps", [2, 16, 24, 64])
def test_host_counts_match_get_num_new_pages(n, ps):
    rng = random.Random(n * 1000 + ps)
    for _ in range(20):
        pre = [rng.randrange(0, 300) for _ in range(n)]
        seq = [p + rng.randrange(0, 200) for p in pre]
        args = (T(pre), T(pre), T(seq), T(seq), T([-1] * n), sum(seq) - sum(pre))
        assert Paged._checked_extend_pages(*args, ps) == get_num_new_pages(T(seq), ps, T(pre))
        dec = [s + 1 for s in seq]
        assert Paged._checked_decode_pages(T(dec), T(dec), T(dec), ps) == get_num_new_pages(
            seq_lens=T(dec), page_size=ps, decode=True
        )


@pytest.mark.parametrize("n", [2, paged._HOST_LIST_MAX + 2])
def test_host_counts_refuse_the_same_batches(n):
    pre, seq = [4] * n, [9] * n
    ok = (T(pre), T(pre), T(seq), T(seq), T([-1] * n))
    with pytest.raises(ValueError, match="extend_num_tokens"):
        Paged._checked_extend_pages(*ok, 5 * n + 1, 16)
    bad_seq = list(seq)
    bad_seq[-1] = 3
    with pytest.raises(ValueError, match="below its prefix_len"):
        Paged._checked_extend_pages(T(pre), T(pre), T(bad_seq), T(bad_seq), T([-1] * n), 0, 16)
    bad_pre = list(pre)
    bad_pre[0] = -1
    with pytest.raises(ValueError, match="prefix_len is negative"):
        Paged._checked_extend_pages(T(bad_pre), T(bad_pre), T(seq), T(seq), T([-1] * n), sum(seq) - sum(bad_pre), 16)
    with pytest.raises(ValueError, match=">= 1"):
        Paged._checked_decode_pages(T([0] + seq[1:]), T([0] + seq[1:]), T(seq), 16)


@pytest.mark.parametrize("ps", [2, 16, 24])
def test_joint_layouts_equal_one_per_pool(ps):
    rng = random.Random(ps)
    for _ in range(50):
        n = rng.randrange(1, 9)
        pre = [rng.randrange(0, 40) for _ in range(n)]
        seq = [p + rng.randrange(0, 40) for p in pre]
        pages = get_num_new_pages(T(seq), ps, T(pre))
        lasts = [T([rng.randrange(1000) if p else -1 for p in pre]) for _ in range(2)]
        new = [T(rng.sample(range(1, 500), pages)) for _ in range(2)]
        total = sum(seq) - sum(pre)
        both = extend_layout(T(pre), T(seq), torch.stack(lasts), torch.stack(new), ps, total)
        vec = paged._extend_vectorized(T(pre), T(seq), torch.stack(lasts), torch.stack(new), ps, total)
        for k in range(2):
            assert torch.equal(both[k], extend_layout(T(pre), T(seq), lasts[k], new[k], ps, total))
            assert torch.equal(vec[k], paged._extend_vectorized(T(pre), T(seq), lasts[k], new[k], ps, total))
        dpages = get_num_new_pages(seq_lens=T(seq), page_size=ps, decode=True) if min(seq) > 0 else 0
        if min(seq) > 0:
            dnew = [T(rng.sample(range(1, 500), dpages)) for _ in range(2)]
            both = decode_layout(T(seq), torch.stack(lasts), torch.stack(dnew), ps)
            for k in range(2):
                assert torch.equal(both[k], decode_layout(T(seq), lasts[k], dnew[k], ps))


def test_release_dedup_by_marking_equals_unique(monkeypatch):
    """Two allocators, one deduplicating every release by marking, end with the
    same free lists after the same large frees."""
    def run():
        a = make_allocator(dict(kind="hybrid", size=1 << 14, size_swa=1 << 14, page_size=16, check_level="warn"))
        rows = []
        for n in (1000, 37, 4096, 513):
            p = T([0])
            rows.append(a.alloc_extend(p, p, T([n]), T([n]), T([-1]), n))
        a.free(torch.cat((rows[2], rows[0])))
        a.free(rows[1])
        a.free(rows[3])
        return [x.tolist() for x in (a.swa_attn_allocator.free_pages, a.full_attn_allocator.free_pages)]

    plain = run()
    monkeypatch.setattr(swa, "_MARK_DEDUP_MIN", 0)
    assert run() == plain
    monkeypatch.setattr(swa, "_MARK_DEDUP_MIN", 1 << 30)
    assert run() == plain


@pytest.mark.parametrize("ps", [2, 3, 16, 64])
def test_run_table_extend_equals_the_vectorized_layout(ps):
    rng = random.Random(ps * 7)
    for _ in range(200):
        n = rng.randrange(1, 12)
        pre = [rng.choice((0, ps, rng.randrange(0, 5 * ps))) for _ in range(n)]
        seq = [p + rng.choice((1, ps - 1, ps, ps + 1, rng.randrange(1, 6 * ps))) for p in pre]
        total = sum(seq) - sum(pre)
        pages = get_num_new_pages(T(seq), ps, T(pre))
        for k in (None, 2):
            shape = (n,) if k is None else (k, n)
            last = torch.tensor([rng.randrange(1, 10_000) for _ in range(n * (k or 1))]).reshape(shape)
            new = torch.tensor([rng.randrange(1, 10_000) for _ in range(pages * (k or 1))]).reshape(shape[:-1] + (pages,))
            plain = paged._extend_vectorized(T(pre), T(seq), last, new, ps, total)
            runs = paged._extend_runs(pre, seq, last, new, ps, total)
            assert torch.equal(runs, plain), (pre, seq, ps)
            assert torch.equal(extend_layout(T(pre), T(seq), last, new, ps, total, (T(pre), T(seq))), plain)


def test_extend_layout_takes_the_run_table_only_for_small_batches(monkeypatch):
    ps, calls = 16, []
    monkeypatch.setattr(paged, "_extend_runs", lambda *a: calls.append("runs") or torch.zeros(a[-1], dtype=torch.int64))
    monkeypatch.setattr(paged, "_extend_vectorized", lambda *a: calls.append("vectorized") or torch.zeros(a[-1], dtype=torch.int64))
    for pages in (1, paged._RUNS_MAX - 1, paged._RUNS_MAX):
        lens = (T([0]), T([pages * ps]))
        extend_layout(*lens, T([-1]), T(list(range(1, pages + 1))), ps, pages * ps, lens)
    extend_layout(*lens, T([-1]), T([1]), ps, ps)  # no host lengths given: never the run table
    assert calls == ["runs", "runs", "vectorized", "vectorized"]


@pytest.mark.parametrize("ps", [2, 16])
def test_free_by_pages_equals_free_swa_then_full_free(ps):
    """free() outside a group takes the deduplicated pages to both halves; the
    two-step path (free_swa, then the full pool's free) must leave the same state."""
    def run(two_step):
        rng = random.Random(ps)
        a = make_allocator(dict(kind="hybrid", size=1 << 12, size_swa=1 << 11, page_size=ps, check_level="warn"))
        rows = []
        for _ in range(40):
            n = rng.randrange(1, 5 * ps)
            p = T([0])
            rows.append(a.alloc_extend(p, p, T([n]), T([n]), T([-1]), n))
            if rng.random() < 0.4:
                got = [rows.pop(rng.randrange(len(rows))) for _ in range(min(len(rows), rng.randrange(1, 4)))]
                idx = torch.cat(got)[torch.randperm(sum(map(len, got)), generator=torch.Generator().manual_seed(len(rows)))]
                if two_step:
                    a.free_swa(idx)
                    a.full_attn_allocator.free(idx)
                else:
                    a.free(idx)
        return [t.tolist() for t in (a.full_to_swa_index_mapping, a.swa_attn_allocator.free_pages,
                                     a.full_attn_allocator.free_pages, a._swa_to_full)]

    assert run(two_step=False) == run(two_step=True)


def test_page_row_views_follow_a_replaced_table():
    """The free reads and clears the mapping through a (page, offset) view made once
    per table: a mapping put in the old one's place (a subclass's clear may do so)
    is the one the next free clears, and the old tensor is left alone."""
    a = make_allocator(dict(kind="hybrid", size=64, size_swa=64, page_size=4, check_level="strict"))
    row = a.alloc_extend(T([0]), T([0]), T([6]), T([6]), T([-1]), 6)
    a.free(a.alloc_extend(T([0]), T([0]), T([4]), T([4]), T([-1]), 4))  # the old table's view is made
    old = a.full_to_swa_index_mapping
    a.full_to_swa_index_mapping = old.clone()
    a.free(row)
    assert a.full_to_swa_index_mapping[row].eq(0).all()
    assert old[row].ne(0).all()
