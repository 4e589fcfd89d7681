"""`python -m fuzz`: exit codes, failures saved and replayed, crash isolation, list.

Each test runs the CLI as a user does (a subprocess) with a budget of a few seconds.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import trace as trace_mod
from properties.steps import Admit, Finish

ROOT = Path(__file__).resolve().parent.parent
CRASHER = "tests.crashing_target:crash_on_second_admit"
RAISER = "tests.crashing_target:raise_on_alloc"


def fuzz(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "fuzz", *map(str, args)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.fixture
def dirs(tmp_path):
    return ["--db", tmp_path / "db", "--corpus", tmp_path / "corpus"]


def good_trace(tmp_path, **kw) -> Path:
    t = trace_mod.Trace(
        name="small", expect="pass", steps=[Admit(((0, 3),)), Finish(0, "split")],
        config={"kind": "hybrid", "size": 8, "size_swa": 8, "page_size": 1, "check_level": "strict"}, **kw,
    )
    return trace_mod.dump(t, tmp_path / "small.json")


# ------------------------------------------------------------------ exit 2
@pytest.mark.parametrize(
    "args, names",
    [
        (["run", "--target", "no_such_variant"], "--target"),
        (["run", "--target", "no_such_module_xyz:make"], "--target"),
        (["run", "--seconds", "0"], "--seconds"),
        (["run", "--seconds", "soon"], "--seconds"),
        (["run", "--examples", "-3"], "--examples"),
        (["run", "--workers", "0"], "--workers"),
        (["run", "--device", "nowhere"], "--device"),
        (["list", "--corpus", "/nonexistent/corpus"], "--corpus"),
        (["run", "--config", "no_such_key=3"], "--config"),
        (["run", "--config", "page_size=0"], "--config"),
        (["run", "--config", "kind=pure_swa", "--config", "page_size=4"], "--config"),
        (["run", "--config", "check_level=loud"], "--config"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_it(args, names, dirs):
    extra = dirs if args[0] == "run" else []
    r = fuzz(*args, *extra)
    assert r.returncode == 2, r.stderr
    assert names in last_line(r.stderr)
    assert "Traceback" not in r.stderr


def test_unreadable_corpus_dir_is_bad_input(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = fuzz("run", "--seconds", "1", "--db", tmp_path / "db", "--corpus", blocker / "corpus")
    assert r.returncode == 2 and "--corpus" in last_line(r.stderr)


def test_malformed_trace_exits_2_naming_file_step_and_field(tmp_path):
    data = json.loads(good_trace(tmp_path).read_text())
    data["steps"][1]["rid"] = "zero"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    r = fuzz("replay", bad)
    assert r.returncode == 2
    assert f"{bad}: step 1: field 'rid': must be an integer" in last_line(r.stderr)


def test_bad_config_value_in_a_trace_exits_2_naming_the_field(tmp_path):
    """size 0 is bad input, not a target crash (exit 1)."""
    data = json.loads(good_trace(tmp_path).read_text())
    data["config"]["size"] = 0
    bad = tmp_path / "size0.json"
    bad.write_text(json.dumps(data))
    r = fuzz("replay", bad, "--target", "impl")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{bad}: field 'config.size': must be an integer >= 1, got 0" in last_line(r.stderr)


# --------------------------------------------------------------------- exit 3
def test_a_harness_bug_is_a_harness_error_not_a_crash(dirs, tmp_path):
    r = fuzz("run", "--target", "tests.harness_fault:make", "--examples", "2", "--seed", "1", *dirs)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "HARNESS ERROR in worker 0" in r.stderr and "TypeError" in r.stderr
    assert "Traceback" in r.stderr and "reference/model.py" in r.stderr
    assert "FAILURE" not in r.stdout and "harness errors 1" in r.stdout
    assert not list((tmp_path / "corpus").glob("*.json")), "a harness error is never saved as a trace"
    replayed = fuzz("replay", good_trace(tmp_path), "--target", "tests.harness_fault:make")
    assert replayed.returncode == 3 and "HARNESS ERROR" in replayed.stdout, replayed.stdout + replayed.stderr


# --------------------------------------------------------------- exit 0 / 1
def test_clean_campaign_exits_0_with_summary(dirs):
    r = fuzz("run", "--examples", "4", "--seed", "3", *dirs)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "summary:" in r.stdout and "failures 0" in r.stdout and "harness errors 0" in r.stdout
    assert "steps compared with the model (" in r.stdout
    assert "labels reached" in r.stdout
    assert " steps (" in r.stderr  # the progress line


def test_pinned_campaign_names_its_pins(dirs):
    r = fuzz("run", "--examples", "3", "--seed", "3", "--config", "page_size=16", "--config", "need_sort=true", *dirs)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pinned: page_size=16, need_sort=True" in r.stdout
    assert "failures 0" in r.stdout


def test_replay_ok_and_mismatch(tmp_path):
    p = good_trace(tmp_path)
    r = fuzz("replay", p, "--target", "impl")
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr
    wrong = trace_mod.load(p)
    wrong.expect, wrong.name = "pool.no_leak", "wrong"
    q = trace_mod.dump(wrong, tmp_path / "wrong.json")
    r = fuzz("replay", q)  # its own target is impl, which passes it
    assert r.returncode == 1 and "MISMATCH" in r.stdout and "expected pool.no_leak, got pass" in r.stdout


def test_campaign_against_a_variant_fails_and_replay_reproduces(tmp_path, dirs):
    # The found failure is shrunk, which hypothesis bounds at five minutes.
    r = fuzz("run", "--target", "free_full_unguarded", "--seconds", "8", "--seed", "1", *dirs, timeout=420)
    assert r.returncode == 1, r.stdout + r.stderr
    saved = [line.split("saved: ", 1)[1] for line in r.stdout.splitlines() if "saved: " in line]
    assert len(saved) == 1
    t = trace_mod.load(saved[0])
    assert t.variant == "free_full_unguarded" and t.expect != "pass"
    assert f"FAILURE in worker 0: {t.expect}" in r.stdout
    cmd = next(line.split("replay: ", 1)[1] for line in r.stdout.splitlines() if "replay: " in line)
    assert cmd == f"python -m fuzz replay {saved[0]} --target free_full_unguarded"
    again = fuzz(*cmd.split()[3:])
    assert again.returncode == 0 and again.stdout.startswith("ok"), again.stdout + again.stderr
    on_impl = fuzz("replay", saved[0], "--target", "impl")
    assert on_impl.returncode == 0 and "(impl: pass)" in on_impl.stdout


def test_exception_from_the_target_is_a_crash_failure(dirs):
    r = fuzz("run", "--target", RAISER, "--examples", "3", "--seed", "1", *dirs)
    assert r.returncode == 1
    assert "FAILURE in worker 0: crash" in r.stdout and "device-side assert" in r.stdout


# ------------------------------------------------------------ crash isolation
def test_a_worker_killed_by_its_target_is_reported_and_the_other_goes_on(dirs):
    r = fuzz("run", "--target", CRASHER, "--workers", "2", "--seconds", "4", "--seed", "1", *dirs)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILURE in worker 0: crash" in r.stdout and "died with exit code 3" in r.stdout
    assert "FAILURE in worker 1" not in r.stdout
    summary = next(line for line in r.stdout.splitlines() if line.startswith("summary:"))
    steps = int(summary.split()[1])
    assert steps > 20  # worker 1 kept fuzzing and its results count
    saved = next(line.split("saved: ", 1)[1] for line in r.stdout.splitlines() if "saved: " in line)
    t = trace_mod.load(saved)
    assert t.expect == "crash" and t.steps and "not shrunk" in t.note
    # The replay runs in a child too: the crash is an outcome, not a lost replay.
    again = fuzz("replay", saved, env={"FUZZ_CRASH_ALL": "1"})
    assert again.returncode == 0 and again.stdout.startswith("ok"), again.stdout + again.stderr


# --------------------------------------------------------------------- list
def test_list_shows_the_corpus(tmp_path):
    good_trace(tmp_path, variant="free_full_unguarded", target="free_full_unguarded")
    r = fuzz("list", "--corpus", tmp_path)
    assert r.returncode == 0, r.stderr
    head, row = r.stdout.splitlines()[:2]
    assert head.split() == ["name", "expect", "variant", "config", "steps"]
    assert row.split()[:3] == ["small", "pass", "free_full_unguarded"]
    assert "hybrid ps=1 size=8/8" in row and row.split()[-1] == "2"
