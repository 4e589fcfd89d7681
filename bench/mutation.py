"""Mutation score of the lockstep property over impl/ (SPEC 4.6; a benchmark, not CI).

    python bench/mutation.py [--examples N] [--files paged token ...] [--max-children K]
                             [--every N] [--fresh] [--report-only]
                             [--gaps | --survivors | --unclassified] [--triton]

Runs mutmut (configured in pyproject.toml, [tool.mutmut]) with the lockstep tests
as its tests (``tests/test_lockstep.py::test_lockstep`` over the default target, and
``tests/properties/test_general_paths.py`` over the general paths a subclass gets,
which the default target never runs), on the "mutation" hypothesis profile
(conftest.py: ci's derandomized search, ``--examples`` examples, no shrinking), then
reads mutmut's results and prints:

- total mutants, killed, survived, no tests (a mutant in a function the lockstep never
  calls), timeouts, suspicious (a crash of the test process), and those not run yet;
- the score = killed / (all - shown equivalent). Survivors, no-tests, timeouts and
  suspicious all count against it: a mutant no test reaches is not a kill, and a hang
  the harness cannot report is a gap, not a kill;
- every mutant that is not killed, with its status, and whether
  bench/mutation_survivors.md classifies it (``equivalent`` with a reason, or ``gap``);
- beside the score, the required cells of the coverage table that the profile leaves
  unreached at that budget on the unmutated impl (one run of it, 10 to 40 s): code
  only those calls execute cannot be judged by the score.

``--triton``, given alone after a mutmut run, runs the mutants that run left alive
(those not shown equivalent) in the functions whose code names the Triton layout
against the torch-versus-Triton differential, under triton's interpreter (the triton
extra), on the first ``TRITON_EXAMPLES`` examples of its derandomized search: the
lockstep tests run the torch layout only, so the hybrid's Triton branches are reached
by no other test, and only in those functions do the two layouts run different code.
A mutant it finds counts as killed, and the report says how many were. A later mutmut
run (``--survivors`` and the like) drops its verdicts: run it again after one.

The last line is one JSON object with the figures. mutmut keeps its results in
``mutants/`` and resumes where it stopped; ``--fresh`` starts over (needed after
changing ``--examples``, which mutmut does not see). The run is slow: 4.2 mutants a
minute at 100 examples on a shared 2-core machine (about 5 hours for all four files);
``--files`` and ``--every N`` (a sample) make it shorter.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ("swa", "paged", "token", "kv_pool")
SURVIVORS_MD = ROOT / "bench" / "mutation_survivors.md"
# The torch layout against the Triton one, under triton's interpreter on CPU: the only
# test that runs the hybrid's Triton branches. Too slow for every mutant, so `--triton`
# runs it on the mutants the lockstep tests leave alive.
TRITON_TEST = "tests/properties/test_triton_layout.py::test_torch_layout_against_triton_layout"
TRITON_RESULTS = ROOT / "mutants" / "triton-results.json"
# The interpreter runs a kernel's programs one at a time in Python, a program a page:
# the search's first 5 examples take about 7 s, its first 10 about 420 s (a serving-size
# pool's frees). Of the 9 runs the first 5 examples take, 4 send paged frees through
# the Triton layout's kernel (3 to 14 calls each).
TRITON_EXAMPLES = 5

# mutmut 3's exit-code meanings (mutmut.stats.status_by_exit_code), folded into the
# categories this report counts.
_STATUS = {
    1: "killed", 3: "killed",
    0: "survived",
    5: "no tests", 33: "no tests",
    36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
    None: "not run",
}
_ENTRY = re.compile(r"^[-*]\s+`(?P<name>impl\.[^`]+)`\s*(?:\([^)]*\))?\s*:\s*(?P<kind>equivalent|gap)\b", re.I)


def status_of(code) -> str:
    return _STATUS.get(code, "suspicious")


def classified() -> dict[str, str]:
    """mutant name -> 'equivalent' | 'gap', from bench/mutation_survivors.md."""
    out: dict[str, str] = {}
    if SURVIVORS_MD.exists():
        for line in SURVIVORS_MD.read_text().splitlines():
            m = _ENTRY.match(line.strip())
            if m:
                out[m.group("name")] = m.group("kind").lower()
    return out


def load_results(files) -> dict[str, object]:
    """mutant name -> mutmut exit code (None: not run yet), for the chosen files."""
    results: dict[str, object] = {}
    for f in files:
        meta = ROOT / "mutants" / "impl" / f"{f}.py.meta"
        if meta.exists():
            results.update(json.loads(meta.read_text())["exit_code_by_key"])
    return results


def triton_results() -> dict[str, str]:
    """mutant name -> 'killed' | 'survived' by the Triton differential (``--triton``)."""
    return json.loads(TRITON_RESULTS.read_text()) if TRITON_RESULTS.exists() else {}


def _order(name: str):
    stem, _, n = name.rpartition("__mutmut_")
    return stem, int(n) if n.isdigit() else 0


def not_killed(results: dict[str, object], keep=lambda name: True) -> list[str]:
    """The mutants of `results` that were run and not killed, and that `keep` keeps, in
    source order."""
    return sorted((n for n, code in results.items() if status_of(code) not in ("killed", "not run") and keep(n)), key=_order)


def refresh_harness() -> None:
    """Copy the harness into mutants/ again. mutmut copies its ``also_copy`` paths only
    when it creates mutants/, so without this a run after a change to properties/ (or
    tests/) would measure the harness as it was then."""
    import tomllib

    work = ROOT / "mutants"
    if not work.exists():
        return
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    for rel in [*config.get("also_copy", []), "tests"]:
        src, dst = ROOT / rel, work / rel
        if src.is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dst)


def run_mutmut(files, examples: int, max_children: int, every: int, names: list[str] | None = None) -> float:
    env = dict(os.environ, SWA_LOCKSTEP_MUTATION_EXAMPLES=str(examples), OMP_NUM_THREADS="1")
    mutmut = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    done = load_results(files)
    if names:
        # Named mutants run again whatever their last result: the workload may have changed.
        mutmut += names
    elif all((ROOT / "mutants" / "impl" / f"{f}.py.meta").exists() for f in files):
        # mutmut reruns every mutant a name selects, so resume by naming those not run.
        todo = [n for n in sorted(done, key=_order)[::every] if done[n] is None]
        if not todo:
            return 0.0
        mutmut += todo
    elif set(files) != set(FILES) or every > 1:
        if every > 1:
            raise SystemExit("--every needs the mutants generated: run once without it first")
        mutmut += [f"impl.{f}.*" for f in files]
    refresh_harness()
    t0 = time.monotonic()
    subprocess.run(["nice", "-n", "10", *mutmut], cwd=ROOT, env=env, check=False)
    return time.monotonic() - t0


def _pytest_in_mutants(mutant: str, examples: int) -> subprocess.CompletedProcess:
    """The Triton differential in mutants/ with `mutant` switched on (mutmut's
    trampolines read MUTANT_UNDER_TEST; "" runs the code as written)."""
    env = dict(os.environ, SWA_LOCKSTEP_MUTATION_EXAMPLES=str(examples), OMP_NUM_THREADS="1",
               TRITON_INTERPRET="1", MUTANT_UNDER_TEST=mutant)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           "--hypothesis-profile=mutation", TRITON_TEST]
    return subprocess.run(["nice", "-n", "10", *cmd], cwd=ROOT / "mutants", env=env, capture_output=True, text=True)


def _function_of(name: str) -> tuple[str, str]:
    """(module, function) of a mutmut mutant name, e.g. ("impl.swa", "free_swa") for
    impl.swa.xǁSWATokenToKVPoolAllocatorǁfree_swa__mutmut_21."""
    stem = name.rpartition("__mutmut_")[0]
    module, _, rest = stem.partition(".x")
    # A method is xǁClassǁname, a module function x_name.
    return module, rest.split("ǁ")[-1] if rest.startswith("ǁ") else rest[1:]


def triton_functions(files) -> set[tuple[str, str]]:
    """The functions of impl/ whose code names the Triton layout: only there do the
    two layouts run different code, so only a mutant there can make them disagree (a
    mutant elsewhere runs the same on both sides of the differential, and the lockstep
    tests judge it)."""
    import ast

    out = set()
    for f in files:
        src = (ROOT / "impl" / f"{f}.py").read_text()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "triton" in (ast.get_source_segment(src, node) or ""):
                out.add((f"impl.{f}", node.name))
    return out


def run_triton(names: list[str], max_children: int, examples: int = TRITON_EXAMPLES) -> float:
    """Run each named mutant against the Triton differential and record killed or
    survived in TRITON_RESULTS. The code as written must pass it first, or every
    mutant would look killed."""
    from concurrent.futures import ThreadPoolExecutor

    refresh_harness()
    clean = _pytest_in_mutants("", examples)
    if clean.returncode != 0 or not re.search(r"\b1 passed\b", clean.stdout):
        raise SystemExit("--triton: the Triton differential does not pass on the unmutated impl in mutants/ "
                         f"(is the triton extra installed?):\n{clean.stdout[-2000:]}{clean.stderr[-2000:]}")
    results = triton_results()
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_children) as pool:
        for name, done in zip(names, pool.map(lambda n: _pytest_in_mutants(n, examples), names)):
            # pytest: 1 a test failed (the mutant is found), 0 all passed; anything else
            # (a usage or collection error) is the harness's, not a verdict.
            if done.returncode not in (0, 1):
                raise SystemExit(f"--triton: pytest exited {done.returncode} on {name}:\n{done.stdout[-2000:]}")
            results[name] = "killed" if done.returncode == 1 else "survived"
            TRITON_RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True))
            print(f"  {name}  {results[name]} (Triton differential)", flush=True)
    return time.monotonic() - t0


def coverage_missed(examples: int) -> list[str]:
    """The required cells of the coverage table (properties/coverage.py) that the
    mutation profile leaves unreached at this budget, on the unmutated impl. A mutant
    only those calls execute survives any harness, so the score is read beside these."""
    sys.path.insert(0, str(ROOT))
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    import properties.profiles  # noqa: F401  (registers the profiles)
    from properties.coverage import missing
    from properties.machine import SHAPES_SEEN, machine_for
    from properties.targets import resolve

    SHAPES_SEEN.clear()
    run_state_machine_as_test(
        machine_for(resolve("impl")), settings=settings(settings.get_profile("mutation"), max_examples=examples)
    )
    return [f"{method} [{cell}]" for method, cell in missing(SHAPES_SEEN)]


def report(files, examples: int, wall_s: float | None) -> dict:
    results = load_results(files)
    if not results:
        raise SystemExit("no mutmut results under mutants/; run without --report-only first")
    status = {name: status_of(code) for name, code in results.items()}
    # A mutant the lockstep tests leave alive that the Triton differential finds.
    by_triton = [n for n, verdict in triton_results().items()
                 if verdict == "killed" and status.get(n) not in (None, "killed", "not run")]
    status.update(dict.fromkeys(by_triton, "killed"))
    counts = Counter(status.values())
    marks = classified()
    not_killed = sorted(n for n, s in status.items() if s not in ("killed", "not run"))
    equivalent = [n for n in not_killed if marks.get(n) == "equivalent"]
    run = len(results) - counts["not run"]
    denominator = run - len(equivalent)
    score = counts["killed"] / denominator if denominator else 0.0

    print(f"mutation score over impl/{{{','.join(files)}}}.py, lockstep tests, {examples} examples per mutant")
    for key in ("killed", "survived", "no tests", "timeout", "suspicious", "not run"):
        print(f"  {key:<11} {counts[key]}")
    print(f"  {'total':<11} {len(results)} (run: {run})")
    print(f"  equivalent  {len(equivalent)} (bench/mutation_survivors.md)")
    print(f"  score       {counts['killed']} / ({run} - {len(equivalent)}) = {100 * score:.1f} %"
          + (f" ({len(by_triton)} of the killed by the Triton differential, --triton)" if by_triton else ""))
    if wall_s is not None:
        print(f"  wall        {wall_s:.0f} s")
    gaps = coverage_missed(examples)
    print(f"  coverage    {len(gaps)} required cells of the coverage table not reached at {examples} examples"
          + (": " + "; ".join(gaps) if gaps else ""))
    print("not killed (status, classification):")
    for n in not_killed:
        print(f"  {n}  {status[n]}  {marks.get(n, 'UNCLASSIFIED')}")
    by_file = {
        f: dict(Counter(s for n, s in status.items() if n.startswith(f"impl.{f}."))) for f in files
    }
    return {
        "bench": "mutation",
        "examples": examples,
        "files": list(files),
        "total": len(results),
        "run": run,
        "killed": counts["killed"],
        "killed_by_triton": len(by_triton),
        "survived": counts["survived"],
        "no_tests": counts["no tests"],
        "timeout": counts["timeout"],
        "suspicious": counts["suspicious"],
        "not_run": counts["not run"],
        "equivalent": len(equivalent),
        "unclassified": sum(1 for n in not_killed if n not in marks),
        "score": round(score, 4),
        "wall_s": None if wall_s is None else round(wall_s, 1),
        "coverage_cells_missed": gaps,
        "by_file": by_file,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=100, help="hypothesis examples per mutant (default 100)")
    p.add_argument("--files", nargs="+", choices=FILES, default=list(FILES), help="which impl/ modules (default all four)")
    p.add_argument("--max-children", type=int, default=2, help="mutants run at once (default 2)")
    p.add_argument("--every", type=int, default=1, help="run every N-th mutant only, a sample (default 1: all)")
    p.add_argument("--fresh", action="store_true", help="delete mutants/ (mutmut's results) first")
    p.add_argument("--report-only", action="store_true", help="only read the results of earlier runs")
    p.add_argument(
        "--gaps", action="store_true",
        help="run only the mutants bench/mutation_survivors.md marks `gap` (a survivor of an earlier run), again",
    )
    p.add_argument(
        "--survivors", action="store_true",
        help="after a change to the harness: run again every mutant of the last results that was not killed and "
        "that bench/mutation_survivors.md does not show equivalent",
    )
    p.add_argument(
        "--unclassified", action="store_true",
        help="run again only the mutants of the last results that were not killed and that "
        "bench/mutation_survivors.md does not list (after a change that moved the workload's draws)",
    )
    p.add_argument(
        "--triton", action="store_true",
        help="instead of mutmut: run the mutants the last mutmut results left alive in the functions that "
        "name the Triton layout (those bench/mutation_survivors.md does not show equivalent) against the "
        "Triton differential (needs the triton extra; about 10 s a mutant)",
    )
    args = p.parse_args(argv)
    if args.gaps + args.survivors + args.unclassified > 1:
        p.error("--gaps, --survivors and --unclassified each choose the mutants to run again: give one")
    if min(args.examples, args.max_children, args.every) < 1:
        p.error("--examples, --max-children and --every must be >= 1")
    if args.triton and (args.report_only or args.fresh or args.gaps or args.survivors or args.unclassified):
        p.error("--triton runs the Triton differential over the last mutmut results: give it without "
                "--report-only, --fresh, --gaps, --survivors and --unclassified")
    if args.fresh and (args.gaps or args.survivors or args.unclassified):
        p.error("--fresh deletes the results --gaps, --survivors and --unclassified choose from")
    wall = None
    names = None
    if not (args.report_only or args.triton):
        if args.fresh:
            shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        if args.survivors or args.unclassified:
            flag = "--unclassified" if args.unclassified else "--survivors"
            marks, results = classified(), load_results(args.files)
            if not results:
                p.error(f"no mutmut results under mutants/ to choose from; run once without {flag} first")
            keep = (lambda n: n not in marks) if args.unclassified else (lambda n: marks.get(n) != "equivalent")
            names = not_killed(results, keep)
            if not names:
                p.error(f"{flag}: the last results hold no mutant that is not killed and "
                        + ("not listed in bench/mutation_survivors.md" if args.unclassified else "not shown equivalent"))
            # Which functions the test reaches is recorded once per run of the clean
            # test; a harness that now calls more of the impl must be measured again.
            (ROOT / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
        if args.gaps:
            names = sorted((n for n, kind in classified().items() if kind == "gap" and n.split(".")[1] in args.files), key=_order)
            if not names:
                p.error(f"--gaps: bench/mutation_survivors.md marks no mutant of impl/{{{','.join(args.files)}}}.py as a gap")
        # The Triton differential's verdicts judged the results this run replaces.
        TRITON_RESULTS.unlink(missing_ok=True)
        wall = run_mutmut(args.files, args.examples, args.max_children, args.every, names)
    if args.triton:
        marks, results = classified(), load_results(args.files)
        layout_fns = triton_functions(args.files)
        alive = not_killed(results, lambda n: marks.get(n) != "equivalent" and _function_of(n) in layout_fns)
        print(f"--triton: {len(alive)} mutants left alive by the lockstep tests, against {TRITON_TEST}")
        if not alive:
            p.error("--triton: the last results leave no mutant alive in a function that names the Triton layout")
        wall = run_triton(alive, args.max_children)
    out = report(args.files, args.examples, wall)
    if names:
        results = load_results(args.files)
        again = {n: status_of(results.get(n)) for n in names}
        which = ("gaps of bench/mutation_survivors.md" if args.gaps else
                 "unclassified survivors of the last results" if args.unclassified else "survivors of the last results")
        print(f"the {len(names)} {which}, run again: " + ", ".join(
            f"{k} {v}" for k, v in sorted(Counter(again.values()).items())))
        for n in names:
            print(f"  {n}  {again[n]}")
        out["run_again"] = dict(Counter(again.values()))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
