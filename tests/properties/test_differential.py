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
