"""The contracts in reference/layout.py are not vacuous: crosshair refutes a planted
bug in every contracted function, and the contracted functions are the ones the
model calls.

Each plant copies layout.py into a scratch module with one wrong line in one
function; `crosshair check` on that function must exit 1 and name it in a
counterexample. If it passed, the contracts (or the way crosshair is run) could not
tell a right body from a wrong one.
"""

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reference import layout

PLANTS = [
    # (function, correct text, planted text)
    ("pages_spanned", "(num_tokens + page_size - 1) // page_size", "(num_tokens + page_size) // page_size"),
    # the classic: a continuation of the last partial page counted as a fresh page
    ("new_pages", "pages_spanned(seq_len, page_size) - pages_spanned(prefix_len, page_size)", "pages_spanned(seq_len - prefix_len, page_size)"),
    # the last request of the batch dropped
    ("total_new_pages", "new_pages(p, s, page_size) for p, s in zip(prefix_lens, seq_lens))", "new_pages(p, s, page_size) for p, s in zip(prefix_lens[:-1], seq_lens))"),
    ("continued_count", "(prefix_len // page_size + 1) * page_size) - prefix_len", "(prefix_len // page_size + 1) * page_size) - prefix_len + 1"),
    ("expand_to_pages", "for o in range(page_size)]", "for o in range(page_size - 1)]"),
    ("tail_pages_bounds", "- (seq_len - tail_len) // page_size", "- (seq_len - tail_len + 1) // page_size"),
]
SOURCE = Path(layout.__file__).read_text()


def contracted() -> set[str]:
    tree = ast.parse(SOURCE)
    return {
        n.name for n in tree.body
        if isinstance(n, ast.FunctionDef) and any(line.strip().startswith("post:") for line in (ast.get_docstring(n) or "").splitlines())
    }


def crosshair(module_dir: Path, target: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "crosshair", "check", "--analysis_kind=PEP316", "--per_condition_timeout=4", target],
        capture_output=True, text=True, timeout=180, cwd=module_dir, env={"PYTHONPATH": str(module_dir), "PATH": "/usr/bin:/bin"},
    )


def test_every_contracted_function_has_a_plant():
    assert contracted() == {name for name, _, _ in PLANTS}


def test_the_contracted_functions_are_the_ones_the_model_calls():
    model = Path(layout.__file__).with_name("model.py").read_text()
    called = set(re.findall(r"\blayout\.([a-z_]+)\(", model))
    assert contracted() == called


@pytest.mark.parametrize("name, good, bad", PLANTS, ids=[p[0] for p in PLANTS])
def test_crosshair_refutes_a_planted_bug(tmp_path, name, good, bad):
    body = inspect.getsource(getattr(layout, name))
    assert body.count(good) == 1, f"{name} no longer contains {good!r} once; update the plant"
    (tmp_path / "planted.py").write_text(SOURCE.replace(body, body.replace(good, bad)))
    proc = crosshair(tmp_path, f"planted.{name}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"crosshair exit {proc.returncode}, want 1 (a counterexample):\n{out}"
    assert f"{name}(" in out and "error" in out, out


def test_the_unplanted_copy_passes(tmp_path):
    """The same run on an unplanted copy finds nothing, so the failures above come from
    the plants, not from copying the module."""
    (tmp_path / "planted.py").write_text(SOURCE)
    proc = crosshair(tmp_path, "planted.new_pages")
    assert proc.returncode == 0, proc.stdout + proc.stderr
