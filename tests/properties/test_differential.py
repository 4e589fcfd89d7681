"""Differential lockstep (SPEC 4.5): two targets must agree slot for slot."""

import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from properties.differential import DIFF, Differential
from properties.lockstep import LockstepFailure
from properties.machine import machine_for
from properties.steps import Admit, Finish
from properties.targets import resolve

impl = resolve("impl")


def test_cpu_backend_against_emulated_npu_backend():
    """The NPU branch (its scatter update emulated) gives the CPU branch's results."""
    run_state_machine_as_test(
        machine_for(impl, peer=impl, sides=({"backend": "cpu"}, {"backend": "npu_emulated"})),
        settings=settings(settings.default, max_examples=min(settings.default.max_examples, 60), database=None),
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: not run on this machine")
def test_cpu_against_cuda():
    run_state_machine_as_test(
        machine_for(impl, peer=impl, sides=({"device": "cpu"}, {"device": "cuda"})),
        settings=settings(settings.default, database=None),
    )


def test_a_different_reuse_order_is_a_disagreement():
    """Each side is legal on its own (need_sort only changes the reuse order); the
    differential still tells them apart."""
    d = Differential({"kind": "hybrid", "size": 16, "size_swa": 16, "page_size": 1}, impl, impl, {"need_sort": False}, {"need_sort": True})
    with pytest.raises(LockstepFailure) as e:
        for step in [Admit(((0, 6),)), Finish(0, "free"), Admit(((1, 14),))]:
            d.run(step)
    assert e.value.invariant == DIFF and "request 1 holds" in str(e.value)


def test_a_difference_names_the_step_and_both_values():
    # Eight pages: the last admission finds four on the free list and merges the
    # released ones back, sorted on one side only.
    d = Differential({"kind": "hybrid", "size": 32, "size_swa": 32, "page_size": 4}, impl, impl, {"need_sort": False}, {"need_sort": True})
    with pytest.raises(LockstepFailure) as e:
        for step in [Admit(((0, 9),)), Admit(((1, 4),)), Finish(1, "free"), Finish(0, "free"), Admit(((2, 20),))]:
            d.run(step)
    assert e.value.invariant == DIFF
    text = str(e.value)
    assert "Admit(reqs=((2, 20),))" in text, text
    assert "request 2 holds [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 16, 17, 18, 19] on one side, [4, 5, 6," in text, text


def test_a_state_difference_at_a_census_names_both_values():
    d = Differential({"kind": "hybrid", "size": 32, "size_swa": 32, "page_size": 4}, impl, impl, {}, {})
    for step in [Admit(((0, 9),)), Admit(((1, 4),)), Finish(1, "free"), Finish(0, "free")]:
        d.run(step)
    # A legal call on one side only: the free list's order changes, no result does.
    d.b.alloc.merge_and_sort_free()
    with pytest.raises(LockstepFailure) as e:
        d.census()
    assert e.value.invariant == DIFF
    assert "full_free differs first at index 0: 5 on one side, 1 on the other (8 and 8 entries)" in str(e.value), str(e.value)
