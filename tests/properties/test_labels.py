"""Each coverage label the driver counts names exactly the event it counts.

Every scenario below runs through `replay` and must produce exactly the label counts
given: a label counted for another event (or in a configuration where its state
cannot occur) adds a key or changes a count, and the test fails. The scenarios
together count every label of properties/lockstep.py at least once.
"""

import pytest

from impl import make_allocator
from impl.swa import SWATokenToKVPoolAllocator
from properties.lockstep import replay
from properties.steps import (
    Admit, AdmitTail, Break, Clear, Decode, DropTail, Evict, Extend, Finish, GroupBegin, GroupEnd, Repair, Resize,
)
from properties.targets import resolve


def hybrid(ps, **kw):
    return {"kind": "hybrid", "size": 16 * ps, "size_swa": 16 * ps, "page_size": ps, "check_level": "strict", **kw}


PURE = {"kind": "pure_swa", "size": 16, "size_swa": 16, "page_size": 1, "check_level": "strict"}


class _FreeFullFailsAfterAccepting(SWATokenToKVPoolAllocator):
    """At level off, free_full of paired slots is accepted and then fails."""

    def free_full(self, free_index):
        if bool((self.full_to_swa_index_mapping[free_index] != 0).any()):
            raise RuntimeError("index out of range on a stale peer")
        super().free_full(free_index)


def _fails_after_accepting(config):
    a = make_allocator(config)
    a.__class__ = _FreeFullFailsAfterAccepting
    return a


SCENARIOS = {
    # id: (config, steps, target, exact label counts)
    "paged workload": (hybrid(4), [
        Admit(((0, 5), (1, 8))), Extend(((0, 2), (1, 1))), Decode((0, 1)), Evict(0, 0, 4), Repair(0, 0, 3, 1, True),
        Finish(0, "segments"), DropTail(1, 4), Finish(1, "split"),
    ], None, {
        "extend from a prefix inside a page": 1,  # request 0 from 5; request 1 from 8 is aligned
        "window evicted": 1, "evicted then re-paired": 1, "re-paired from inside an SWA page": 1,
        "re-paired from int32 SWA indices": 1,
        "finished by segments": 1, "freed by free_segments": 1, "tail dropped": 1,
        "finished by free": 1,  # every page of request 1 still paired: one free
    }),
    "decode opens a page, tails": (hybrid(2), [
        AdmitTail(0, 3, 0), AdmitTail(1, 5, 2), Admit(((2, 3),)), Extend(((2, 1),)), Decode((1, 2)),
    ], None, {
        "admitted with an empty SWA tail": 1, "admitted with an SWA tail": 1,
        "extend from a prefix inside a page": 1,  # request 2 from 3
        "decode onto a new page": 1,  # request 2 at 4 opens a page; request 1 at 5 does not
    }),
    "segments at page size 1": (hybrid(1), [
        Admit(((0, 3),)), Finish(0, "segments"), Admit(((1, 3),)), Evict(1, 0, 1), Finish(1, "segments"),
    ], None, {"finished by free": 1, "window evicted": 1, "finished by split": 1}),
    "segments on pure SWA": (PURE, [
        Admit(((0, 3),)), Finish(0, "segments"), Admit(((1, 4),)), Evict(1, 1, 2), Finish(1, "segments"),
    ], None, {"finished by free": 1, "window evicted": 1, "finished by frees of the unevicted runs": 1}),
    "every page evicted": (hybrid(2), [
        Admit(((0, 4),)), Evict(0, 0, 4), GroupBegin(), Finish(0, "split"), GroupEnd(),
    ], None, {"window evicted": 1, "group holding a free_full": 1, "finished by free_full": 1, "group ended": 1}),
    "group": (hybrid(2), [
        Admit(((0, 4), (1, 4), (2, 4))), GroupBegin(), Evict(0, 0, 2), Repair(0, 0, 2, 0), Finish(1, "free"),
        DropTail(2, 2), Clear(),
    ], None, {
        "group holding a free_swa": 1, "window evicted": 1, "group holding a re-pair": 1, "evicted then re-paired": 1,
        "group holding a free": 1, "finished by free": 1, "group holding a free_segment": 1, "tail dropped": 1,
        "clear inside a group": 1,
    }),
    "pools run out": (hybrid(2, size=4, size_swa=4), [
        Admit(((0, 2),)), Admit(((1, 8),)), AdmitTail(2, 3, 0), AdmitTail(3, 2, 1), Resize(2, 2),
    ], None, {"pool exhausted": 2, "admitted with an SWA tail": 1, "resized": 1}),
    "request slots run out": (hybrid(2, ring_size=2, req_slots=1), [
        Admit(((0, 2),)), Admit(((1, 2),)), Finish(0, "free"),
    ], None, {"request slots exhausted": 1, "finished by free": 1}),
    "breaks refused or not sent": (hybrid(2), [
        Admit(((0, 4),)), Finish(0, "free"), Break("double_free"), Admit(((1, 4),)), Break("partial_page", 1),
        Break("never_allocated"), Break("unaligned_segment", 1), Break("tail_batch"), Break("tail_long"),
        Break("alloc_on_paged"), Break("resize_grow"), GroupBegin(), Break("nested_group"), GroupEnd(),
    ], None, {
        "finished by free": 1,
        "contract break not sent: double_free (free.double)": 1,
        "contract break not sent: partial_page (free.partial_page)": 1,
        "contract break not sent: never_allocated (free.double)": 1,
        "contract refused: segment.unaligned": 1, "contract refused: tail.batch": 1, "contract refused: tail.length": 1,
        "contract refused: alloc.paged": 1, "contract refused: resize.grow": 1, "contract refused: group.nested": 1,
        "group ended": 1,
    }),
    "guard breaks at strict": (hybrid(1), [
        Admit(((0, 3),)), Evict(0, 0, 1), Break("free_unpaired", 0), Break("free_full_paired", 0), Break("paged_on_token"),
    ], None, {
        "window evicted": 1, "contract refused: free.unpaired": 1, "contract refused: free_full.paired": 1,
        "contract refused: paged.token": 1,
    }),
    "guard breaks at warn": (hybrid(1, check_level="warn"), [
        Admit(((0, 3),)), Break("free_full_paired", 0), Admit(((1, 3),)), Evict(1, 0, 1), Break("free_unpaired", 1),
    ], None, {"guard count: swa.peer_released": 1, "window evicted": 1, "contract refused: free.unpaired": 1}),
    "guard breaks at off": (hybrid(1, check_level="off"), [
        Admit(((0, 3),)), Break("free_full_paired", 0), Admit(((1, 3),)), Evict(1, 0, 1), Break("free_unpaired", 1),
        Admit(((2, 2),)),
    ], None, {
        "guard silent: swa.peer_released": 1, "window evicted": 1, "guard silent: swa.peer_mapped": 1,
        "run restarted after an unchecked call": 1,
    }),
    "accepted, then the target raised": (hybrid(1, check_level="off"), [
        Admit(((0, 3),)), Break("free_full_paired", 0), Admit(((1, 2),)),
    ], _fails_after_accepting, {
        "guard silent, then the target raised: swa.peer_released": 1, "run restarted after an unchecked call": 1,
    }),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_labels_count_exactly_their_events(name):
    config, steps, target, want = SCENARIOS[name]
    ls = replay(config, steps, target or resolve("impl"))
    assert dict(ls.labels) == want


def test_a_workload_step_that_breaks_a_contract_is_labelled_apart_from_a_break():
    """Extending a request whose SWA tail was empty would continue a row with no SWA
    peers: the model withholds that call, and the label says a workload step (not a
    deliberate Break) was not sent."""
    ls = replay(hybrid(2), [AdmitTail(0, 3, 0), Extend(((0, 1),))], resolve("impl"))
    assert dict(ls.labels) == {
        "admitted with an empty SWA tail": 1,
        "workload step breaks a contract, not sent: row.unpaired_continuation": 1,
    }
