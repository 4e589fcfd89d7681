"""The regression corpus (SPEC 5): every entry passes on the bundled impl and trips its
expected invariant on the variant it was made on, on every available device; and the
corpus covers every invariant of SPEC 3.3 and every seeded variant."""

from pathlib import Path

import pytest
import torch

from fuzz import campaign, trace as trace_mod
from fuzz.variants import AWAITING_WORKLOAD, VARIANTS
from properties.targets import resolve
from reference import names

CORPUS = Path(__file__).resolve().parent.parent / "fuzz" / "corpus"
FILES = sorted(CORPUS.glob("*.json"))
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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_entry_passes_on_impl(path, device):
    t = trace_mod.load(path)
    out = trace_mod.run(t, resolve("impl"), device)
    assert out.outcome == "pass", f"{path.name} must pass on the bundled impl:\n{out.message}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_entry_fails_on_its_variant(path, device):
    t = trace_mod.load(path)
    assert t.variant in VARIANTS, f"{path.name}: variant {t.variant!r} is not in fuzz.variants"
    out = trace_mod.run(t, VARIANTS[t.variant], device)
    assert out.outcome == t.expect, f"{path.name} on {t.variant}: expected {t.expect}, got {out.outcome}\n{out.message}"


def test_every_variant_has_an_entry():
    covered = {trace_mod.load(p).variant for p in FILES}
    assert sorted(set(VARIANTS) - AWAITING_WORKLOAD - covered) == []


def test_entries_cover_the_invariants_and_variants():
    """Every invariant of SPEC 3.3 and every seeded-bug variant (so every bug class of
    SPEC 7) has an entry."""
    traces = [trace_mod.load(p) for p in FILES]
    assert sorted(set(names.INVARIANTS) - {t.expect for t in traces}) == []
    assert sorted(set(VARIANTS) - AWAITING_WORKLOAD - {t.variant for t in traces}) == []
