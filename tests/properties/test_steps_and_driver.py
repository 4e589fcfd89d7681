"""The workload language, the configuration checks, targets, and the driver's reactions."""

import pytest

from properties.lockstep import Lockstep, LockstepFailure, check_config, replay
from properties.steps import (
    NEW, STEP_TYPES, Admit, AdmitTail, Break, CacheFree, Clear, Decode, DropTail, Empty, Evict, EvictSegment,
    Extend, Finish, FreePages, GroupBegin, GroupEnd, MergeSort, Prefill, Repair, Resize, Resume, Retract,
    StepFormatError, step_from_json,
)
from properties.targets import TargetError, resolve
from properties import steps as steps_module

EXAMPLES = [
    Admit(((0, 5), (1, 3))), AdmitTail(2, 7, 3), Extend(((0, 2),)), Decode((0, 1)),
    Evict(0, 0, 4), Repair(0, 0, 4, 1), Finish(0, "split"), DropTail(1, 2), GroupBegin(),
    GroupEnd(), MergeSort(), Clear(), Resize(8, 8), Break("double_free"), Break("partial_page", 3),
    Prefill(((3, NEW, 0, 9), (0, 0, 5, 2), (4, 7, 4, 1))), Retract((0, 1)), Resume((1, 0)),
    CacheFree("free_swa", ((7, 0, 4), (8, 2, 3))), CacheFree("free", ((7, 0, 4), (8, 2, 3)), True), Empty("free_segment"),
    EvictSegment(0, 4, 9), FreePages(1, 0), Break("page_ids_twice", 1),
]


def test_every_op_has_an_example():
    assert {s.op for s in EXAMPLES} == set(STEP_TYPES)


@pytest.mark.parametrize("step", EXAMPLES, ids=lambda s: s.op)
def test_step_json_round_trip_and_repr_is_python(step):
    assert step_from_json(step.to_json()) == step
    assert eval(repr(step), vars(steps_module)) == step


@pytest.mark.parametrize(
    "data, field",
    [
        ({"op": "nope"}, "op"),
        ({"op": "admit"}, "reqs"),
        ({"op": "admit", "reqs": [[0]]}, "reqs"),
        ({"op": "decode", "rids": []}, "rids"),
        ({"op": "evict", "rid": 0, "lo": "1", "hi": 2}, "lo"),
        ({"op": "finish", "rid": 0, "how": "gently"}, "how"),
        ({"op": "break", "kind": "everything"}, "kind"),
        ({"op": "clear", "extra": 1}, "extra"),
        ({"op": "prefill", "batch": [[0, -1, 0]]}, "batch"),
        ({"op": "cache_free", "call": "free_segment", "pieces": [[0, 0, 1]]}, "call"),
        ({"op": "cache_free", "call": "free", "pieces": [[0, 0, True]]}, "pieces"),
        ({"op": "empty", "call": "resize"}, "call"),
        ({"op": "cache_free", "call": "free", "pieces": [[0, 0, 1]], "interleave": 1}, "interleave"),
        ([1, 2], "op"),
    ],
)
def test_malformed_steps_name_the_field(data, field):
    with pytest.raises(StepFormatError) as e:
        step_from_json(data)
    assert e.value.field == field and repr(field) in str(e.value)


BASE = {"kind": "hybrid", "size": 32, "size_swa": 32, "page_size": 1}


@pytest.mark.parametrize(
    "change, key",
    [({"kind": "other"}, "kind"), ({"size": -1}, "size"), ({"page_size": 0}, "page_size"),
     ({"check_level": "loud"}, "check_level"), ({"colour": 1}, "colour"), ({"ring_size": 4}, "req_slots")],
)
def test_bad_config_names_the_key(change, key):
    with pytest.raises(ValueError, match=key):
        check_config({**BASE, **change})


def test_targets_resolve():
    assert callable(resolve("impl"))
    assert resolve("impl:make_allocator").__name__ == "make_allocator"
    assert resolve("mine", {"mine": len}) is len
    with pytest.raises(TargetError, match="unknown target 'nope'.*impl"):
        resolve("nope")
    with pytest.raises(TargetError, match="cannot import"):
        resolve("no_such_module_here:make")
    with pytest.raises(TargetError, match="no callable"):
        resolve("impl:no_such_factory")


def run(level, *steps, page_size=1, **extra):
    return replay({**BASE, "page_size": page_size, "check_level": level, **extra}, list(steps), resolve("impl"))


@pytest.mark.parametrize("level", ["strict", "warn", "off"])
def test_legal_workload_passes_at_every_level(level):
    ls = run(level, Admit(((0, 4), (1, 2))), Decode((0, 1)), Evict(0, 0, 2), Repair(0, 0, 2, 0),
             Evict(0, 0, 3), Finish(0, "split"), GroupBegin(), Finish(1, "free"), GroupEnd())
    assert not ls.rows
    assert ls.counters() == {"steps_run": 9, "steps_compared": 9, "runs_restarted": 0}


def test_guard_peer_mapped_raises_at_strict_and_warn_and_is_silent_at_off():
    for level in ("strict", "warn"):
        ls = run(level, Admit(((0, 3),)), Evict(0, 0, 1), Break("free_unpaired", 0))
        assert ls.labels["contract refused: free.unpaired"] == 1 and ls.runs_restarted == 0
    ls = run("off", Admit(((0, 3),)), Evict(0, 0, 1), Break("free_unpaired", 0))
    assert ls.labels["guard silent: swa.peer_mapped"] == 1
    assert ls.runs_restarted == 1 and "accepted at level off" in ls.restarted_because


def test_guard_peer_released_raises_at_strict_counts_at_warn_silent_at_off():
    ls = run("strict", Admit(((0, 3),)), Break("free_full_paired", 0))
    assert ls.labels["contract refused: free_full.paired"] == 1 and 0 in ls.rows
    ls = run("warn", Admit(((0, 3),)), Break("free_full_paired", 0), Admit(((1, 10),)), Finish(1, "free"))
    assert ls.labels["guard count: swa.peer_released"] == 1
    assert ls.counters() == {"steps_run": 4, "steps_compared": 4, "runs_restarted": 0}
    ls = run("off", Admit(((0, 3),)), Break("free_full_paired", 0))
    assert ls.labels["guard silent: swa.peer_released"] == 1 and ls.runs_restarted == 0


def test_unnoticed_breaks_are_classified_and_not_sent():
    ls = run("strict", Admit(((0, 2),)), Finish(0, "split"), Break("double_free"), page_size=4)
    assert ls.labels["contract break not sent: double_free (free.double)"] == 1


def test_a_step_naming_a_dead_request_is_a_format_error():
    with pytest.raises(StepFormatError) as e:
        run("strict", Admit(((0, 2),)), Decode((7,)))
    assert e.value.field == "rids" and e.value.index == 1


class _NoGuard:
    """A target whose free_full never checks the peer: the harness must notice."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def free_full(self, idx):
        self._inner.full_attn_allocator.free(idx)


def test_failure_names_invariant_step_and_difference():
    target = lambda config: _NoGuard(resolve("impl")(config))
    with pytest.raises(LockstepFailure) as e:
        replay({**BASE, "check_level": "strict"}, [Admit(((0, 3),)), Break("free_full_paired", 0)], target)
    f = e.value
    assert f.invariant == "swa.peer_released" and f.index == 1
    assert str(f).startswith("swa.peer_released at step 1: Break(kind='free_full_paired', rid=0)")
    assert f.steps == [Admit(((0, 3),)), Break("free_full_paired", 0)] and f.config["check_level"] == "strict"
