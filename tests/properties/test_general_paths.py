"""The lockstep over the bundled allocator's general paths (tests/properties/
subclass_targets.py): the code a subclass gets where it overrides a method the fast
paths depend on. The default target never runs it, so without this a fault there
goes unseen (and bench/mutation.py counts its mutants as reached by no test)."""

from unittest import mock

import torch
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from impl.swa import SWATokenToKVPoolAllocator
from properties.machine import machine_for
from tests.properties.subclass_targets import general_paths

# A share of the ci profile's budget: the general paths are a few branches of code the
# default target's 2,000 examples already drive through everything around them.
EXAMPLES = 300


def test_the_target_takes_the_general_paths():
    a = general_paths({"kind": "hybrid", "size": 64, "size_swa": 64, "page_size": 4})
    assert not a._joint_layouts("_extend") and not a._joint_layouts("_decode")
    assert not a._frees_whole_pages()
    full = a.alloc_extend(*(torch.tensor([0]),) * 2, *(torch.tensor([6]),) * 2, torch.tensor([-1]), 6)
    with mock.patch.object(SWATokenToKVPoolAllocator, "_clear_read_mapping", autospec=True,
                           side_effect=SWATokenToKVPoolAllocator._clear_read_mapping) as read:
        a.free(full)
    assert read.call_count == 1
    assert a.full_available_size() == a.swa_available_size() == 64


# Built as on a host with several devices, where the device names its index (cuda:1):
# the rest of the suite spells it plain, and an allocator that takes the plain name
# apart (a backend chosen by its text) is seen only here.
INDEXED_DEVICE = "cpu:0"


def test_lockstep_through_the_general_paths():
    run_state_machine_as_test(
        machine_for(general_paths, device=INDEXED_DEVICE),
        settings=settings(settings.default, max_examples=min(settings.default.max_examples, EXAMPLES)),
    )
