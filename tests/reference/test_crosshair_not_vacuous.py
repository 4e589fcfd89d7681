"""The contracts in reference/layout.py are not vacuous: crosshair refutes a planted bug.

A contracted function is copied, contract and all, into a scratch module with an
off-by-one planted in its body; `crosshair check` must then exit 1 and name the
function in its counterexample. If it passed, the contracts (or the way crosshair is
run) could not tell a right body from a wrong one.
"""

import inspect
import subprocess
import sys

import pytest

from reference import layout

PLANTS = [
    # (function, correct text, planted text)
    ("pages_spanned", "(num_tokens + page_size - 1) // page_size", "(num_tokens + page_size) // page_size"),
    ("expand_to_pages", "for o in range(page_size)]", "for o in range(page_size - 1)]"),
]


@pytest.mark.parametrize("name, good, bad", PLANTS, ids=[p[0] for p in PLANTS])
def test_crosshair_finds_planted_off_by_one(tmp_path, name, good, bad):
    src = inspect.getsource(getattr(layout, name))
    assert good in src, f"{name} no longer contains {good!r}; update the plant"
    mutant = tmp_path / "planted.py"
    mutant.write_text("from __future__ import annotations\n\n\n" + src.replace(good, bad))
    proc = subprocess.run(
        [sys.executable, "-m", "crosshair", "check", "--analysis_kind=PEP316", "--per_condition_timeout=4", str(mutant)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"crosshair exit {proc.returncode}, want 1 (counterexample):\n{out}"
    assert f"{name}(" in out and "error" in out, out


def test_correct_copy_passes(tmp_path):
    """The same harness on the unplanted copy finds nothing, so the failures above come
    from the plant, not from copying the function out of its module."""
    src = inspect.getsource(layout.pages_spanned)
    ok = tmp_path / "copied.py"
    ok.write_text("from __future__ import annotations\n\n\n" + src)
    proc = subprocess.run(
        [sys.executable, "-m", "crosshair", "check", "--analysis_kind=PEP316", "--per_condition_timeout=4", str(ok)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
