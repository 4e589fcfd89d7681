"""The regression corpus (SPEC 5): every entry passes on the bundled impl and trips its
expected invariant on the variant it was made on, on every available device; and the
corpus covers every invariant of SPEC 3.3 and every seeded variant."""

from pathlib import Path

import pytest
import torch

from fuzz import campaign, trace as trace_mod
from properties.lockstep import asserts_kill
from properties.steps import Admit, Break, Clear
from properties.targets import resolve
from reference import names

CORPUS = Path(__file__).resolve().parent.parent / "fuzz" / "corpus"
ALL_FILES = sorted(CORPUS.glob("*.json"))
# Findings in upstream sglang (target "sglang", no variant) are checked on sglang itself.
UPSTREAM = [p for p in ALL_FILES if trace_mod.load(p).target == "sglang"]
FILES = [p for p in ALL_FILES if p not in UPSTREAM]
VARIANTS, _ = campaign.variants()


def _devices():
    yield pytest.param("cpu", id="cpu")
    yield pytest.param(
        "cuda", id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="cuda not run: torch.cuda.is_available() is false on this machine"),
    )


DEVICES = list(_devices())


def test_corpus_is_there():
    assert FILES, f"no traces in {CORPUS}"


def _replay(path, t, spec, target, device):
    """(expected, outcome). On CUDA each replay has its own process: a guard at strict
    is a device assert there, and the process it kills is the expected outcome."""
    want = trace_mod.expected_outcome(t, spec, target, device)
    if not asserts_kill(device):
        return want, trace_mod.run(t, target, device)
    return want, campaign.replay_isolated(path, spec, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_entry_passes_on_impl(path, device):
    t = trace_mod.load(path)
    want, out = _replay(path, t, "impl", resolve("impl"), device)
    assert out.outcome == want, f"{path.name} on the bundled impl ({device}): expected {want}, got {out.outcome}\n{out.message}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_entry_fails_on_its_variant(path, device):
    t = trace_mod.load(path)
    assert t.variant in VARIANTS, f"{path.name}: variant {t.variant!r} is not in fuzz.variants"
    want, out = _replay(path, t, t.variant, VARIANTS[t.variant], device)
    assert out.outcome == want, f"{path.name} on {t.variant} ({device}): expected {want}, got {out.outcome}\n{out.message}"
    if device == "cpu":
        assert want == t.expect


@pytest.mark.parametrize("path", UPSTREAM, ids=[p.stem for p in UPSTREAM])
def test_upstream_entry_fails_on_sglang_and_passes_on_impl(path):
    """A finding in sglang trips its invariant on the installed sglang and passes on the
    bundled impl, which has the fix."""
    from properties.sglang_target import available

    t = trace_mod.load(path)
    assert trace_mod.run(t, resolve("impl"), "cpu").outcome == "pass"
    ok, why = available()
    if not ok:
        pytest.skip(f"sglang not importable: {why}")
    out = trace_mod.run(t, resolve("sglang"), "cpu")
    assert out.outcome == t.expect, f"{path.name} on sglang: expected {t.expect}, got {out.outcome}\n{out.message}"


def test_every_variant_has_an_entry():
    covered = {trace_mod.load(p).variant for p in FILES}
    assert sorted(set(VARIANTS) - covered) == []


def test_entries_cover_the_invariants_and_variants():
    """Every invariant of SPEC 3.3 and every seeded-bug variant (so every bug class of
    SPEC 7) has an entry."""
    traces = [trace_mod.load(p) for p in FILES]
    assert sorted(set(names.INVARIANTS) - {t.expect for t in traces}) == []
    assert sorted(set(VARIANTS) - {t.variant for t in traces}) == []


# CUDA semantics, checked here on CPU: the expectation a CUDA replay is held to.
GUARD_ENTRIES = [p for p in FILES if trace_mod.load(p).expect in names.GUARDS]


def test_there_are_guard_entries_at_strict():
    assert {trace_mod.load(p).expect for p in GUARD_ENTRIES} == set(names.GUARDS)
    assert all(trace_mod.load(p).config["check_level"] == "strict" for p in GUARD_ENTRIES)


@pytest.mark.parametrize("path", GUARD_ENTRIES, ids=[p.stem for p in GUARD_ENTRIES])
def test_on_cuda_the_impl_is_expected_to_die_where_its_guard_refuses(path):
    t = trace_mod.load(path)
    cpu = trace_mod.run(t, resolve("impl"), "cpu")
    assert cpu.outcome == "pass" and cpu.guard_refusals, cpu
    assert trace_mod.expected_outcome(t, "impl", resolve("impl"), "cuda") == trace_mod.CRASH
    assert trace_mod.expected_outcome(t, "impl", resolve("impl"), "cpu") == "pass"


@pytest.mark.parametrize("path", GUARD_ENTRIES, ids=[p.stem for p in GUARD_ENTRIES])
def test_on_cuda_a_variant_without_the_guard_fails_as_on_cpu(path):
    """No guard, no device assert: the unguarded call returns and the lockstep names it."""
    t = trace_mod.load(path)
    assert trace_mod.expected_outcome(t, t.variant, VARIANTS[t.variant], "cuda") == t.expect


def test_on_cuda_entries_without_a_guard_refusal_expect_what_cpu_gives():
    for path in FILES:
        t = trace_mod.load(path)
        if not trace_mod.run(t, resolve("impl"), "cpu").guard_refusals:
            assert trace_mod.expected_outcome(t, "impl", resolve("impl"), "cuda") == "pass", path.name


def test_a_guard_refusal_before_a_failure_is_a_death_on_cuda():
    """A run that refuses a guard break and fails later never reaches the failure on
    CUDA: the expectation is the dead process."""
    config = {**trace_mod.load(GUARD_ENTRIES[0]).config, "kind": "hybrid", "page_size": 1, "check_level": "strict"}
    steps = [Admit(((0, 1),)), Break("free_full_paired", 0), Clear()]
    t = trace_mod.Trace("refusal-then-failure", names.SENTINEL, config, steps, "clear_wipes_sentinel", "clear_wipes_sentinel")
    target = VARIANTS["clear_wipes_sentinel"]
    cpu = trace_mod.run(t, target, "cpu")
    assert (cpu.outcome, cpu.guard_refusals, cpu.steps_run) == (names.SENTINEL, [1], 2), cpu
    assert trace_mod.expected_outcome(t, "clear_wipes_sentinel", target, "cuda") == trace_mod.CRASH
    # Without the refusal the failure is reached on CUDA as on CPU.
    t.steps = [Admit(((0, 1),)), Clear()]
    assert trace_mod.expected_outcome(t, "clear_wipes_sentinel", target, "cuda") == names.SENTINEL


def test_an_isolated_replay_reports_a_killed_process_as_a_crash(monkeypatch, tmp_path):
    """What a device assert does to a CUDA replay, done here by a target that ends
    its process at its third allocation: the child dies, the replay says crash."""
    config = dict(trace_mod.load(GUARD_ENTRIES[0]).config, size=16, size_swa=16)
    steps = [Admit(((i, 1),)) for i in range(4)]
    path = trace_mod.dump(trace_mod.Trace("four-admits", "pass", config, steps), tmp_path / "four-admits.json")
    assert campaign.replay_isolated(path, "impl", "cpu").outcome == "pass"
    monkeypatch.setenv("FUZZ_CRASH_ALL", "1")
    out = campaign.replay_isolated(path, "tests.crashing_target:crash_on_second_admit", "cpu")
    assert (out.outcome, out.message) == (trace_mod.CRASH, "the replay process died"), out


def test_an_in_process_run_on_cuda_does_not_send_a_break_its_guard_would_die_on():
    """The hypothesis machine runs in one process: on CUDA (flag set here on CPU) a
    guard break at strict is counted as not sent, and nothing is called."""
    from properties.lockstep import Lockstep

    config = trace_mod.load(GUARD_ENTRIES[0]).config
    for skip, refusals in ((False, [1]), (True, [])):
        ls = Lockstep(dict(config), resolve("impl"), skip_device_asserts=skip)
        ls.run(Admit(((0, 1),)))
        ls.run(Break("free_full_paired", 0))
        ls.census()
        assert ls.guard_refusals == refusals
        sent = [k for k in ls.labels if k.startswith("not sent where a guard kills the process")]
        assert bool(sent) == skip, ls.labels
