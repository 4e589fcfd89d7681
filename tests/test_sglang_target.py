"""The built-in `sglang` target (SPEC 4.3, 4.7): the installed sglang's own allocators,
driven by the lockstep. Skipped, with the reason, where sglang does not import
(`bash scripts/install-sglang` installs it for CPU; CI runs these)."""

import pytest

from properties.sglang_target import UNREFUSED_BREAKS, available, layout_path
from properties.lockstep import LockstepFailure, replay
from properties.steps import Admit, Break, Decode, DropTail, Evict, Extend, Finish, GroupBegin, GroupEnd, Resize
from properties.targets import TargetError, resolve

OK, WHY = available()
pytestmark = pytest.mark.skipif(not OK, reason=f"sglang not importable: {WHY}")

HYBRID = {"kind": "hybrid", "size": 64, "size_swa": 64, "device": "cpu", "need_sort": False, "check_level": "strict"}


@pytest.mark.parametrize("ps", [1, 4, 16, 64, 256])
@pytest.mark.parametrize("need_sort", [False, True])
def test_workload_runs_on_sglang(ps, need_sort):
    """One workload of admit, extend, decode, window eviction, tail drop, a free group
    and finish passes the lockstep on sglang's own hybrid allocator."""
    cfg = dict(HYBRID, page_size=ps, size=8 * ps, size_swa=8 * ps, need_sort=need_sort)
    steps = [
        Admit(((0, ps + 1), (1, 2))), Extend(((0, 3),)), Decode((0, 1)), Evict(0, 0, 1),
        GroupBegin(), Finish(1, "free"), GroupEnd(), DropTail(0, ps if ps > 1 else 2), Finish(0, "free"),
    ]
    ls = replay(cfg, steps, resolve("sglang"))
    assert type(ls.alloc).__mro__[1].__module__ == "sglang.srt.mem_cache.allocator.swa"
    assert ls.tags.enabled, "kv.integrity tags must reach sglang's KV buffers"
    # At page size 1 the evicted position makes row 0's finish a split (free of the
    # unevicted run, free_full of the evicted one); above it the page keeps its SWA half.
    finished = {"finished by free": 1, "finished by split": 1} if ps == 1 else {"finished by free": 2}
    assert ls.labels["window evicted"] == 1
    assert {k: v for k, v in ls.labels.items() if k.startswith("finished by")} == finished


def test_pure_swa_and_unsupported_configs():
    cfg = dict(HYBRID, kind="pure_swa", page_size=1, size=16, size_swa=16)
    replay(cfg, [Admit(((0, 5),)), Evict(0, 0, 2), Finish(0, "free")], resolve("sglang"))
    with pytest.raises(NotImplementedError):
        resolve("sglang")(dict(cfg, page_size=4, size=64, size_swa=64))
    with pytest.raises(NotImplementedError):
        resolve("sglang")(dict(HYBRID, page_size=4, ring_size=4, req_slots=2))


def test_guard_fires_at_strict_and_counts_at_warn():
    """sglang's own swa.peer_released guard: raises at strict, counts at warn; the
    lockstep checks both against the model."""
    for level in ("strict", "warn", "off"):
        cfg = dict(HYBRID, page_size=1, size=8, size_swa=8, check_level=level)
        replay(cfg, [Admit(((0, 3),)), Break("free_full_paired", 0)], resolve("sglang"))


def test_layout_path_is_sglangs_torch_path_on_cpu():
    alloc = resolve("sglang")(dict(HYBRID, page_size=16, size=64, size_swa=64))
    assert layout_path(alloc) == "sglang torch path (alloc_extend_naive, alloc_decode_naive)"


def test_resize_grow_is_declared_and_really_unrefused():
    """The declaration is measured: sent anyway, sglang does not refuse the break."""
    assert "resize_grow" in resolve("sglang").unrefused_breaks == UNREFUSED_BREAKS
    cfg = dict(HYBRID, page_size=1, size=8, size_swa=8)
    with pytest.raises(LockstepFailure):
        replay(cfg, [Break("resize_grow")], resolve("sglang"))


def test_decode_not_atomic_in_sglang():
    """The finding (FINDINGS.md): a decode the full pool cannot serve returns None but
    keeps the SWA page it took."""
    cfg = dict(HYBRID, page_size=2, size=4, size_swa=6)
    with pytest.raises(LockstepFailure) as e:
        replay(cfg, [Admit(((0, 4),)), Decode((0,))], resolve("sglang"))
    assert e.value.invariant == "alloc.atomic"
    replay(cfg, [Admit(((0, 4),)), Decode((0,))], resolve("impl"))


def test_version_in_the_description():
    from properties.sglang_target import describe

    assert describe().startswith(f"sglang {WHY}")
