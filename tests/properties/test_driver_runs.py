"""The driver's runs: a call the model cannot follow ends its run after a census and a
fresh pair goes on, compared; harness errors apart from target crashes; observers;
the differential driver's explicit attributes."""

import pytest
import torch

from impl import make_allocator
from impl.swa import PureSWATokenToKVPoolAllocator, SWATokenToKVPoolAllocator
from properties.differential import Differential
from properties import observe
from properties.lockstep import HarnessError, Lockstep, LockstepFailure, Observer, TargetCrash, observing, raised_in_harness, replay
from properties.steps import Admit, Break, Decode, Evict, Finish
from properties.targets import resolve

BASE = {"kind": "hybrid", "size": 32, "size_swa": 32, "page_size": 1}
# swa.peer_mapped accepted at off: the model cannot follow, so the run ends there.
UNCHECKED = [Admit(((0, 3),)), Evict(0, 0, 1), Break("free_unpaired", 0)]


def test_steps_after_an_unchecked_call_are_compared():
    ls = replay({**BASE, "check_level": "off"}, UNCHECKED + [Admit(((1, 4),)), Decode((1,)), Finish(1, "free")], resolve("impl"))
    assert ls.counters() == {"steps_run": 6, "steps_compared": 5, "runs_restarted": 1}
    assert ls.labels["run restarted after an unchecked call"] == 1 and not ls.rows


def test_a_fault_after_the_restart_is_found():
    """The second pair is a variant that miscounts its pages: only a driver that goes
    on comparing after the unchecked call can see it."""
    built = []

    def target(config):
        a = make_allocator(config)
        built.append(a)
        if len(built) == 2:
            a.__class__ = _MiscountsAfterAlloc
        return a

    with pytest.raises(LockstepFailure) as info:
        replay({**BASE, "check_level": "off"}, UNCHECKED + [Admit(((1, 4),))], target)
    assert len(built) == 2 and info.value.index == 3 and info.value.invariant == "pool.capacity", str(info.value)


class _MiscountsAfterAlloc(SWATokenToKVPoolAllocator):
    """Reports one slot too many once it has handed any out."""

    handed = False

    def alloc(self, need_size):
        self.handed = True
        return super().alloc(need_size)

    def available_size(self):
        return super().available_size() + self.handed


class _RaisesOnRead:
    """A target whose available_size() raises: a crash of the target, read by the driver."""

    def __init__(self, inner):
        self.__dict__["_inner"] = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def available_size(self):
        raise RuntimeError("device lost")


def test_a_target_raising_while_observed_is_a_target_crash():
    with pytest.raises(TargetCrash) as info:
        Lockstep({**BASE}, lambda c: _RaisesOnRead(make_allocator(c)))
    assert isinstance(info.value.original, RuntimeError) and "device lost" in str(info.value)


def test_the_harness_raising_is_a_harness_error_with_its_traceback():
    ls = Lockstep({**BASE}, resolve("impl"))
    ls.model.peer = None  # a model in a state no code of its own makes: its next read fails
    with pytest.raises(HarnessError) as info:
        ls.run(Admit(((0, 3),)))
    assert "reference/model.py" in info.value.traceback and "step 0" in str(info.value)


def test_a_device_assert_seen_at_the_harness_read_is_a_target_crash():
    """A device assert lands at the next synchronization, which is often the harness's
    own read of state: it is still the target's crash, not a bug in the harness."""
    ls = Lockstep({**BASE}, resolve("impl"))
    try:
        observe.free_pages(None)  # fails inside the harness's own observation code
    except AttributeError as e:
        assert raised_in_harness(e)
        where = e.__traceback__

    def census_violations():
        raise torch.AcceleratorError("CUDA error: device-side assert triggered").with_traceback(where)

    ls.census_violations = census_violations
    with pytest.raises(TargetCrash) as info:
        ls.census()
    assert "device-side assert" in str(info.value)


def test_observers_see_every_driver_and_step():
    seen = []

    class Record(Observer):
        def started(self, ls):
            seen.append("started")

        def before_step(self, ls, step):
            seen.append(("before", step.op))

        def after_step(self, ls, step):
            seen.append(("after", step.op, ls.counters()["steps_run"]))

    with observing(Record()):
        replay({**BASE, "check_level": "off"}, UNCHECKED, resolve("impl"))
    replay({**BASE}, [Admit(((0, 1),))], resolve("impl"))  # not observed any more
    assert seen == ["started", ("before", "admit"), ("after", "admit", 1), ("before", "evict"), ("after", "evict", 2),
                    ("before", "break"), ("after", "break", 3)]


def test_differential_exposes_side_a_read_only_and_closes_both():
    d = Differential({**BASE}, resolve("impl"), resolve("impl"), {"backend": "cpu"}, {"backend": "npu_emulated"})
    d.run(Admit(((0, 3),)))
    assert d.rows is d.a.rows and d.index == 0
    with pytest.raises(AttributeError):
        d.index = 5  # read-only: the machine cannot shadow a side's state
    d.close()
    assert d.a.index == d.b.index == 1
    assert not hasattr(Differential, "__getattr__")


RING = {"kind": "hybrid", "size": 64, "size_swa": 32, "page_size": 4, "ring_size": 4, "req_slots": 4}


def _refuses_ring(config):
    if config.get("ring_size") is not None:
        raise NotImplementedError("no ring mode here")
    return make_allocator(config)


def test_a_target_that_does_not_build_a_configuration_is_skipped_there():
    """SPEC 4.3: a factory's NotImplementedError says what it does not build."""
    with pytest.raises(NotImplementedError, match="no ring mode"):
        replay(RING, [], _refuses_ring)


def test_the_bundled_impl_may_not_refuse_a_configuration_it_builds():
    """The impl declares what it builds on any machine: a NotImplementedError from it
    there (a mutated ring check, say) is a failure, not a configuration skipped unseen;
    where it depends on the machine (another device or layout), a skip as before."""
    builds = resolve("impl").builds
    assert builds({**RING, "device": "cpu"}) and not builds({**RING, "page_size": 1})
    assert not builds({**RING, "device": "cuda"}) and not builds({**RING, "layout": "triton"})

    def impl_refusing_ring(config):
        return _refuses_ring(config)

    impl_refusing_ring.builds = builds
    with pytest.raises(TargetCrash, match="declares it builds"):
        replay(RING, [], impl_refusing_ring)
    with pytest.raises(NotImplementedError):
        replay({**RING, "device": "meta"}, [], impl_refusing_ring)
    replay(RING, [Admit(((0, 3),))], resolve("impl"))


class _PureRewritesMapping(PureSWATokenToKVPoolAllocator):
    """A pure SWA allocator that lets the hybrid's mapping rewrites through instead
    of refusing them (SPEC 2.7)."""

    set_full_to_swa_mapping = SWATokenToKVPoolAllocator.set_full_to_swa_mapping
    clear_full_to_swa_mapping = SWATokenToKVPoolAllocator.clear_full_to_swa_mapping


def _pure_rewrites(config):
    a = make_allocator(config)
    a.__class__ = _PureRewritesMapping
    return a


PURE = {"kind": "pure_swa", "size": 32, "size_swa": 32, "page_size": 1, "check_level": "strict"}


@pytest.mark.parametrize("kind, contract", [
    ("pair_on_pure", "pure.mapping"), ("unpair_on_pure", "pure.mapping"),
    ("paged_on_token", "pure.paged"), ("decode_on_token", "pure.paged"), ("tail_on_token", "pure.paged"),
])
def test_pure_swa_refuses_mapping_rewrites_and_paged_calls(kind, contract):
    ls = replay(PURE, [Admit(((0, 3),)), Break(kind)], resolve("impl"))
    assert ls.labels[f"contract refused: {contract}"] == 1


@pytest.mark.parametrize("kind", ["pair_on_pure", "unpair_on_pure"])
def test_a_pure_swa_mapping_rewrite_let_through_is_named(kind):
    with pytest.raises(LockstepFailure) as info:
        replay(PURE, [Admit(((0, 3),)), Break(kind)], _pure_rewrites)
    assert info.value.invariant == "contract.pure.mapping"
