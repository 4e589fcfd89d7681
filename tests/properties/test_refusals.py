"""A refused call must leave the target as it was: the driver reads the target's raw state
before the call and compares it after (SPEC 3.2), naming what changed; the census that
used to run on both sides of a refusal now runs before a clear or a resize instead, where
a reset would otherwise wipe what it finds."""

from pathlib import Path

import pytest
import torch

from fuzz import trace as trace_mod
from fuzz.variants import VARIANTS
from impl.swa import SWATokenToKVPoolAllocator
from properties.lockstep import Lockstep, LockstepFailure, _changes, replay
from properties.steps import Admit, Break, Clear, Finish, GroupBegin, GroupEnd, Resize
from properties.targets import resolve

BASE = {"kind": "hybrid", "size": 32, "size_swa": 32, "page_size": 1, "check_level": "strict"}
CORPUS = Path(__file__).resolve().parents[2] / "fuzz" / "corpus"


def _state(free, mapping, sizes=None):
    return {"resolved slots": [5, 9], "full free list": torch.tensor(free), "mapping": torch.tensor(mapping),
            "sizes": sizes or {"available_size": len(free)}}


def test_changes_names_pages_entries_and_sizes():
    was = _state([1, 2, 3], [0, 4, 5, -1])
    assert _changes(was, _state([3, 1, 2], [0, 4, 5, -1])) == []  # the list's order is the allocator's own
    assert _changes(was, _state([1, 2, 3, 3], [0, 4, 5, -1], {"available_size": 3})) == ["the full free list gained pages [3]"]
    assert _changes(was, _state([1, 2], [0, 4, 7, -1], {"available_size": 2})) == [
        "the full free list lost pages [3]", "mapping[2] was 5, is 7 (1 entries differ)", "available_size was 3, is 2"]
    now = _state([1, 2, 3], [0, 4, 5, -1])
    now["mapping"] = now["mapping"].to(torch.int32)
    assert _changes(was, now) == ["mapping was (4,) torch.int64 on cpu, is (4,) torch.int32 on cpu"]


def test_a_refusal_that_changed_state_is_blamed_on_the_call_with_the_change():
    """seed_segment_checks_late frees the segment's SWA side before it checks the
    alignment it then refuses."""
    path = next(CORPUS.glob("seed-segment-checks-late-*.json"))
    t = trace_mod.load(path)
    with pytest.raises(LockstepFailure) as failed:
        replay(t.config, t.steps, VARIANTS[t.variant])
    text = str(failed.value)
    assert failed.value.invariant == "alloc.atomic" and failed.value.index == 1, text
    assert "raised (PageAlignmentError" in text and "changed state: the SWA free list gained pages [1]" in text, text
    assert "changed state: mapping[2] was 2, is 0" in text, text  # written in place: the read before is a copy
    replay(t.config, t.steps, resolve("impl"))


class _ShufflesWhenRefusing(SWATokenToKVPoolAllocator):
    """Refuses a nested free group as it must, after reversing its full free list:
    the same pages, so nothing a caller can see has changed."""

    def free_group_begin(self):
        if self.free_group is not None:
            self.full_attn_allocator.free_pages = self.full_attn_allocator.free_pages.flip(0)
        super().free_group_begin()


class _TakesAPageWhenRefusing(SWATokenToKVPoolAllocator):
    def free_group_begin(self):
        if self.free_group is not None:
            self.full_attn_allocator.free_pages = self.full_attn_allocator.free_pages[1:]
        super().free_group_begin()


def _as(cls):
    def make(config):
        a = resolve("impl")(config)
        a.__class__ = cls
        return a
    return make


def test_a_refusal_may_reorder_but_not_take_pages():
    steps = [Admit(((0, 3),)), GroupBegin(), Break("nested_group", -1), GroupEnd()]
    replay(BASE, steps, _as(_ShufflesWhenRefusing))
    with pytest.raises(LockstepFailure) as failed:
        replay(BASE, steps, _as(_TakesAPageWhenRefusing))
    assert failed.value.index == 2 and "changed state: the full free list lost pages [4]" in str(failed.value), str(failed.value)


class _FreesTheWrongSlot(SWATokenToKVPoolAllocator):
    """Frees a request's slots but puts a neighbour's slot on the full free list in place
    of the last one: sizes and the freed slots' peers are right, so only a census sees it."""

    def free(self, free_index):
        super().free(free_index)
        full = self.full_attn_allocator
        last = int(free_index[-1])
        full.free_pages = torch.where(full.free_pages == last, last + 1, full.free_pages)


@pytest.mark.parametrize("reset", [Clear(), Resize(32, 32)], ids=["clear", "resize"])
def test_a_fault_just_before_a_reset_is_found_there(reset):
    ls = Lockstep(BASE, _as(_FreesTheWrongSlot), census_every=0)
    for step in (Admit(((0, 3), (1, 3))), Finish(0, "free")):
        ls.run(step)  # the step's own checks do not see it
    with pytest.raises(LockstepFailure) as failed:
        ls.run(reset)
    assert failed.value.index == 2 and failed.value.invariant == "pool.no_double_ownership", str(failed.value)
