"""A plain install (`pip install -e .`, no `test` extra) can load the pytest plugin:
the crosshair profile needs hypothesis-crosshair, so it is only registered where the
backend imports."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_WITHOUT_CROSSHAIR = """
import sys, runpy
sys.modules["hypothesis_crosshair_provider"] = None  # as if not installed
ns = runpy.run_path(sys.argv[1])
from hypothesis import settings
try:
    settings.get_profile("crosshair")
except Exception as e:
    print("crosshair profile:", type(e).__name__)
print("loaded")
"""


def test_plugin_loads_without_the_crosshair_backend():
    # HYPOTHESIS_NO_PLUGINS: hypothesis must not load the installed plugin's entry point.
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_CROSSHAIR, str(ROOT / "properties" / "pytest_plugin.py")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={"HYPOTHESIS_NO_PLUGINS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-2:] == ["crosshair profile: InvalidArgument", "loaded"], proc.stdout


def test_a_process_pytest_did_not_start_gets_the_projects_ci_profile():
    # hypothesis ships its own `ci` profile: a spawned search worker that only asked for
    # "ci" got that one (other step count, multiple-bug reports) without a word.
    from hypothesis import settings

    import properties.profiles  # noqa: F401

    proc = subprocess.run(
        [sys.executable, "-c", "from hypothesis import settings; import properties.profiles; "
         "c = settings.get_profile('ci'); print(c.stateful_step_count, c.report_multiple_bugs, c.max_examples)"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    ours = settings.get_profile("ci")
    assert proc.stdout.split() == [str(ours.stateful_step_count), str(ours.report_multiple_bugs), str(ours.max_examples)]
    assert (ours.stateful_step_count, ours.report_multiple_bugs) == (40, False)
