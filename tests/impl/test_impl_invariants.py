import itertools

import pytest
import torch

from impl import invariants as inv
from impl.invariants import (
    Bucket,
    InRange,
    Invariant,
    InvariantViolation,
    IsTrue,
    Level,
    PageAligned,
    expect,
)

_names = itertools.count()


def fresh(bucket, prop=None, recover=None):
    """An invariant with a name no other test uses."""
    return Invariant(f"test.inv{next(_names)}", bucket, prop or IsTrue(), recover=recover)


# ---------------------------------------------------------------- declaration


def test_invariant_registers_by_name():
    i = fresh(Bucket.GUARD)
    assert inv.registered_invariants()[i.name] is i


def test_duplicate_name_is_refused_naming_it():
    i = fresh(Bucket.SOFTEN)
    with pytest.raises(ValueError, match=i.name):
        Invariant(i.name, Bucket.SOFTEN, IsTrue())


def test_uncontainable_fatal_cannot_have_recover():
    with pytest.raises(ValueError, match="FATAL_UNCONTAINABLE"):
        Invariant("test.fatal_with_recover", Bucket.FATAL_UNCONTAINABLE, IsTrue(), recover=lambda v: v)
    assert "test.fatal_with_recover" not in inv.registered_invariants()


def test_swa_invariants_are_declared_with_their_buckets():
    import impl.swa  # noqa: F401  (declares them)

    reg = inv.registered_invariants()
    assert reg["swa.peer_mapped"].bucket is Bucket.FATAL_UNCONTAINABLE
    assert reg["swa.peer_released"].bucket is Bucket.GUARD
    assert reg["swa.peer_mapped"].recover is None


# ---------------------------------------------------------------- properties


def test_properties_are_elementwise_with_readable_repr():
    v = torch.tensor([0, 3, 4, 8, 9])
    assert IsTrue()(v > 3).tolist() == [False, False, True, True, True]
    assert InRange(3, 9)(v).tolist() == [False, True, True, True, False]
    assert PageAligned(4)(v).tolist() == [True, False, True, True, False]
    assert repr(IsTrue()) == "IsTrue()"
    assert repr(InRange(3, 9)) == "InRange(3, 9)"
    assert repr(PageAligned(4)) == "PageAligned(4)"
    assert PageAligned(4).ok(v).dtype == torch.bool


def test_bad_property_arguments():
    with pytest.raises(ValueError):
        InRange(5, 1)
    with pytest.raises(ValueError):
        PageAligned(0)


# ---------------------------------------------------------------- level


def test_level_defaults_to_warn(monkeypatch):
    monkeypatch.delenv(inv.ENV_VAR, raising=False)
    assert inv.current_level() is Level.WARN
    assert Level.OFF < Level.WARN < Level.STRICT


@pytest.mark.parametrize("raw,level", [("off", Level.OFF), ("warn", Level.WARN), ("STRICT", Level.STRICT)])
def test_level_from_environment(monkeypatch, raw, level):
    monkeypatch.setenv("SWA_LOCKSTEP_INVARIANTS", raw)
    assert inv.current_level() is level


def test_bad_environment_value_names_variable_and_choices(monkeypatch):
    monkeypatch.setenv("SWA_LOCKSTEP_INVARIANTS", "loud")
    with pytest.raises(ValueError, match="SWA_LOCKSTEP_INVARIANTS") as err:
        inv.current_level()
    assert "off" in str(err.value) and "strict" in str(err.value)


def test_override_beats_environment_and_restores(monkeypatch):
    monkeypatch.setenv("SWA_LOCKSTEP_INVARIANTS", "off")
    inv.set_level("strict")
    assert inv.current_level() is Level.STRICT
    with inv.override_level(Level.WARN):
        assert inv.current_level() is Level.WARN
    assert inv.current_level() is Level.STRICT
    inv.set_level(None)
    assert inv.current_level() is Level.OFF
    with pytest.raises(ValueError):
        inv.set_level("everything")


# ---------------------------------------------------------------- crash matrix

CRASHES = {
    (Bucket.SOFTEN, Level.OFF): False,
    (Bucket.SOFTEN, Level.WARN): False,
    (Bucket.SOFTEN, Level.STRICT): False,
    (Bucket.GUARD, Level.OFF): False,
    (Bucket.GUARD, Level.WARN): False,
    (Bucket.GUARD, Level.STRICT): True,
    (Bucket.FATAL_CONTAINABLE, Level.OFF): False,
    (Bucket.FATAL_CONTAINABLE, Level.WARN): False,
    (Bucket.FATAL_CONTAINABLE, Level.STRICT): True,
    (Bucket.FATAL_UNCONTAINABLE, Level.OFF): False,
    (Bucket.FATAL_UNCONTAINABLE, Level.WARN): True,
    (Bucket.FATAL_UNCONTAINABLE, Level.STRICT): True,
}


@pytest.mark.parametrize("bucket,level", list(CRASHES))
def test_crash_matrix(bucket, level):
    assert inv.crashes(bucket, level) is CRASHES[(bucket, level)]
    i = fresh(bucket)
    bad = torch.tensor([True, False, False, True])
    with inv.override_level(level):
        if CRASHES[(bucket, level)]:
            with pytest.raises(InvariantViolation) as err:
                expect(i, bad, msg="why it matters")
            assert err.value.invariant == i.name
            assert err.value.msg == "why it matters"
            assert isinstance(err.value, RuntimeError)
            assert inv.hit_counts()[i.name] == 0
        else:
            assert expect(i, bad) is bad
            counted = 2 if level >= Level.WARN else 0
            assert inv.hit_counts()[i.name] == counted
        # A passing value never crashes and never counts.
        expect(i, torch.ones(3, dtype=torch.bool))
    assert inv.hit_counts()[i.name] == (2 if not CRASHES[(bucket, level)] and level >= Level.WARN else 0)


def test_hits_accumulate_by_name_and_reset():
    i = fresh(Bucket.SOFTEN, InRange(0, 10))
    with inv.override_level("warn"):
        expect(i, torch.tensor([1, 11, 12]))
        expect(i, torch.tensor([-1, 5]))
    assert inv.hit_counts()[i.name] == 3
    inv.reset_hits()
    assert inv.hit_counts()[i.name] == 0


def test_counting_keeps_a_device_tensor_per_invariant_and_device():
    i = fresh(Bucket.GUARD)
    with inv.override_level("warn"):
        expect(i, torch.tensor([False]))
    counters = [t for (name, _dev), t in inv._COUNTERS.items() if name == i.name]
    assert len(counters) == 1 and counters[0].dtype == torch.int64


def test_recover_applies_at_every_level():
    i = fresh(Bucket.GUARD, InRange(0, 4), recover=lambda v: v.clamp(0, 3))
    for level in ("off", "warn"):
        with inv.override_level(level):
            assert expect(i, torch.tensor([-2, 1, 9])).tolist() == [0, 1, 3]
    with inv.override_level("strict"):
        assert expect(i, torch.tensor([2])).tolist() == [2]
        with pytest.raises(InvariantViolation):
            expect(i, torch.tensor([9]))


def test_off_does_not_evaluate_and_empty_or_none_is_a_pass():
    calls = []

    class Spy(IsTrue):
        def __call__(self, value):
            calls.append(1)
            return super().__call__(value)

    i = fresh(Bucket.FATAL_UNCONTAINABLE, Spy())
    with inv.override_level("off"):
        expect(i, torch.tensor([False]))
    assert calls == []
    with inv.override_level("strict"):
        assert expect(i, None) is None
        expect(i, torch.zeros(0, dtype=torch.bool))
    assert calls == []
