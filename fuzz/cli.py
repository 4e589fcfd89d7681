"""`python -m fuzz`: run campaigns, replay traces, list the corpus, check sync-freedom.

Exit codes (every subcommand):
  0  nothing failed: the campaign found no failure, every trace had its expected outcome
  1  a failure: the campaign found one, or a trace's outcome differs from what it expects
  2  bad input: unknown target, bad budget or device, unreadable corpus, malformed trace;
     one line on stderr names the input and says what would be accepted
  3  harness error: the harness's own code (model, driver, observation) raised; its
     traceback is printed on stderr and nothing is saved to the corpus
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_HARNESS_ERROR = 0, 1, 2, 3
DEFAULT_SECONDS = 20.0
DEFAULT_CORPUS = Path(__file__).resolve().parent / "corpus"
DEFAULT_DB = ".hypothesis/fuzz-db"
HARNESS_ERROR = "harness error"  # a replay's outcome when the harness itself raised


class BadInput(Exception):
    """Input the command cannot run with; the message is the one line printed."""


def _positive_float(name: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = -1.0
        if not v > 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{name} must be a positive number, got {text!r}")
        return v

    return parse


def _positive_int(name: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = 0
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be an integer >= 1, got {text!r}")
        return v

    return parse


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed must be an integer, got {text!r}") from None


def _int_step(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--step must be an integer, got {text!r}") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line naming the bad input, exit 2
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_PINNABLE = ("kind", "size", "size_swa", "page_size", "need_sort", "ring_size", "req_slots", "check_level", "debug_memory_pool")


def _pin(text: str) -> tuple[str, object]:
    key, eq, raw = text.partition("=")
    if not eq or key not in _PINNABLE:
        raise argparse.ArgumentTypeError(f"--config: {text!r} must be KEY=VALUE with KEY one of {', '.join(_PINNABLE)}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw  # a bare word: hybrid, strict
    return key, value


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m fuzz", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    targets = "impl (the bundled allocator, default), a seeded-bug variant name, or module:callable"
    r = sub.add_parser("run", help="run a fuzzing campaign", description="Run the lockstep state machine against a target under a budget; save and print each failure.")
    r.add_argument("--seconds", type=_positive_float("--seconds"), help=f"time budget (default {DEFAULT_SECONDS:g} s when --examples is not given)")
    r.add_argument("--examples", type=_positive_int("--examples"), help="example budget, shared by the workers")
    r.add_argument("--seed", type=_int, help="campaign seed; each worker derives its own (default: random, printed)")
    r.add_argument("--target", default="impl", help=targets)
    r.add_argument("--device", default="cpu", help="torch device for the target: cpu (default), cuda, npu")
    r.add_argument("--workers", type=_positive_int("--workers"), default=1, help="worker processes (default 1)")
    r.add_argument("--db", default=DEFAULT_DB, help=f"shared hypothesis example database folder (default {DEFAULT_DB})")
    r.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="folder failures are saved into (default fuzz/corpus)")
    r.add_argument(
        "--config", action="append", default=[], type=_pin, metavar="KEY=VALUE",
        help="pin a configuration key over the drawn ones, e.g. --config page_size=16 --config kind=pure_swa "
        "--config need_sort=true --config debug_memory_pool=true (repeatable; VALUE is JSON or a bare word)",
    )

    rp = sub.add_parser("replay", help="replay trace files against a target", description="Replay traces; each must have its expected outcome.")
    rp.add_argument("files", nargs="+", help="trace files (.json) or folders of them")
    rp.add_argument("--target", help=f"{targets}; default: the target each trace was made on")
    rp.add_argument("--device", default="cpu", help="torch device (replaces the trace's own)")

    sh = sub.add_parser("show", help="draw a trace's pools at its failing step", description="Replay a trace to its failing step (or --step N) and draw both pools' pages, the pages where model and target differ, and the involved pages' peers.")
    sh.add_argument("trace", help="a trace file (.json)")
    sh.add_argument("--target", help=f"{targets}; default: the target the trace was made on")
    sh.add_argument("--device", default="cpu", help="torch device (replaces the trace's own)")
    sh.add_argument("--step", type=_int_step, help="show the state after step N (0-based) instead of at the failure")
    sh.add_argument("--html", help="also write one self-contained page (the maps before and at the step, and a timeline) to this file")
    sh.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour: auto (a terminal without NO_COLOR), always, never")

    ls = sub.add_parser("list", help="show the corpus", description="A table of the corpus: name, expected outcome, variant, configuration, steps.")
    ls.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="corpus folder (default fuzz/corpus)")

    sy = sub.add_parser("sync", help="check the sync-free paths for host reads", description="Run free, free_swa, free_group_end, clear_full_to_swa_mapping, free_segment and alloc_decode under a watch for host reads and data-dependent shapes (properties/sync.py); exit 1 names the path and the op.")
    sy.add_argument("--target", default="impl", help=targets)
    sy.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda (adds set_sync_debug_mode('error'))")
    sy.add_argument("--layout", choices=("torch", "triton"), default="torch", help="paged layout implementation (default torch)")
    sy.add_argument("--json", help="also write the report as JSON to this file")
    return p


# ------------------------------------------------------------------ checks
def check_target(spec: str):
    from fuzz import campaign
    from properties.targets import TargetError

    try:
        return campaign.resolve(spec)
    except TargetError as e:
        raise BadInput(f"--target: {e}") from None


def check_device(device: str) -> None:
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise BadInput(f"--device: {device!r} is not a torch device ({e}); use cpu, cuda or npu") from None
    if dev.type == "cpu":
        return
    backend = getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise BadInput(f"--device: {device!r} is not available on this machine (torch.{dev.type}.is_available() is false); use --device cpu")


def check_corpus_dir(path: str, create: bool) -> Path:
    p = Path(path)
    if create:
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BadInput(f"--corpus: cannot create {path}: {e.strerror or e}") from None
    if not p.is_dir():
        raise BadInput(f"--corpus: {path} is not a folder" + ("" if p.exists() else " (it does not exist)"))
    if not os.access(p, os.R_OK | os.X_OK) or (create and not os.access(p, os.W_OK)):
        raise BadInput(f"--corpus: {path} is not {'writable' if create else 'readable'}")
    return p


# --------------------------------------------------------------------- run
def _progress(result) -> None:
    rate = result.steps / result.elapsed if result.elapsed else 0.0
    line = (
        f"[{result.elapsed:6.1f}s] {result.steps} steps ({rate:.0f}/s, {100 * result.compared_fraction:.1f}% compared), "
        f"{result.examples} examples, {len(result.labels)} labels, {len(result.failures)} failures"
    )
    if result.harness_errors:
        line += f", {len(result.harness_errors)} harness errors"
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[2K" + line)
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _print_failure(f, target: str, device: str) -> None:
    from fuzz.trace import summary

    if sys.stderr.isatty():
        sys.stderr.write("\n")
    t = f.trace
    how = "shrunk" if f.shrunk else "not shrunk: the worker process died"
    print(f"FAILURE in worker {f.wid}: {f.outcome} ({len(t.steps)} steps, {how})")
    if t.config:
        print(f"  config: {summary(t.config)}")
    for i, step in enumerate(t.steps):
        print(f"  {i:3d}  {step!r}")
    for line in f.message.splitlines():
        print(f"  | {line}")
    if f.path is not None:
        dev = f" --device {device}" if device != "cpu" else ""
        print(f"  saved: {f.path}")
        print(f"  replay: python -m fuzz replay {f.path} --target {target}{dev}")
    if f.page is not None:
        print(f"  page: {f.page} (open it in a browser)")
    sys.stdout.flush()


def _print_harness_error(h) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(f"HARNESS ERROR in worker {h.wid} (a bug in swa-lockstep, not in the target; nothing saved): {h.message}", file=sys.stderr)
    sys.stderr.write(h.traceback)
    sys.stderr.flush()


def cmd_run(args) -> int:
    from fuzz import campaign

    if args.seconds is None and args.examples is None:
        args.seconds = DEFAULT_SECONDS
    factory = check_target(args.target)
    check_device(args.device)
    check_corpus_dir(args.corpus, create=True)
    try:
        Path(args.db).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"--db: cannot create {args.db}: {e.strerror or e}") from None
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    budget = " and ".join(x for x in (f"{args.seconds:g} s" if args.seconds else "", f"{args.examples} examples" if args.examples else "") if x)
    pins = dict(args.config)
    try:
        from properties.lockstep import check_config

        ps = pins.get("page_size", 1)
        if pins.get("kind") == "pure_swa" and ps != 1:
            raise ValueError("kind=pure_swa is page size 1 only")
        # The pins over a small configuration of their page size: a bad value fails here,
        # naming its key, not in every worker.
        check_config({"kind": "hybrid", "size": 4 * ps, "size_swa": 4 * ps, "page_size": ps, **pins})
    except (ValueError, KeyError, TypeError) as e:
        raise BadInput(f"--config: {e}") from None
    about = campaign.describe_target(factory)
    print(f"campaign: target {args.target}, device {args.device}, seed {seed}, {args.workers} worker(s), budget {budget}, db {args.db}", file=sys.stderr)
    for line in about + ([f"pinned: {', '.join(f'{k}={v}' for k, v in pins.items())}"] if pins else []):
        print(line)
    sys.stdout.flush()
    result = campaign.run_campaign(
        args.target, args.device, args.seconds, args.examples, seed, args.workers, args.db, args.corpus,
        progress=_progress, on_failure=lambda f: _print_failure(f, args.target, args.device),
        on_harness_error=_print_harness_error, fixed=pins, about=about,
    )
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    rate = result.steps / result.elapsed if result.elapsed else 0.0
    print(
        f"summary: {result.steps} steps in {result.elapsed:.1f} s ({rate:.0f} steps/s), {result.examples} examples, "
        f"{result.compared} steps compared with the model ({100 * result.compared_fraction:.1f}%; "
        f"{result.restarted} runs restarted after a call the model cannot follow), "
        f"labels reached {len(result.labels)} of {result.known} known, failures {len(result.failures)}, "
        f"harness errors {len(result.harness_errors)}"
        f" (seed {seed}; rerun: python -m fuzz run --target {args.target} --seed {seed})"
    )
    from properties.coverage import render

    print(render(result.shapes))
    if result.harness_errors:
        return EXIT_HARNESS_ERROR
    return EXIT_FAILED if result.failures else EXIT_OK


# ------------------------------------------------------------------ replay
def _trace_files(items: list[str]) -> list[Path]:
    out = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            out += sorted(p.glob("*.json"))
        else:
            out.append(p)
    return out


def _replay_one(path: str, target_spec: str | None, device: str):
    """Runs in a child process, so a target that kills its process only loses this trace."""
    from fuzz import campaign, trace as trace_mod

    from properties.lockstep import HarnessError

    t = trace_mod.load(path)
    spec = target_spec or t.own_target
    try:
        out = trace_mod.run(t, campaign.resolve(spec), device)
    except HarnessError as e:
        return spec, HARNESS_ERROR, f"{e}\n{e.traceback}"
    return spec, out.outcome, out.message


def cmd_replay(args) -> int:
    import concurrent.futures as cf
    import multiprocessing as mp

    from fuzz import trace as trace_mod
    from properties.lockstep import asserts_kill

    files = _trace_files(args.files)
    if not files:
        raise BadInput(f"replay: no trace files in {' '.join(args.files)}")
    traces = {}
    for f in files:
        try:
            traces[f] = trace_mod.load(f)
        except trace_mod.TraceError as e:
            raise BadInput(str(e)) from None
    if args.target is not None:
        check_target(args.target)
    else:
        for f, t in traces.items():
            try:
                check_target(t.own_target)
            except BadInput as e:
                raise BadInput(f"{f}: the trace's own target cannot be resolved ({e}); pass --target") from None
    check_device(args.device)
    mismatches = harness_errors = 0
    pool = None
    try:
        for f in files:
            if pool is None:
                pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
            t = traces[f]
            spec = args.target or t.own_target
            try:
                # On CUDA a guard at strict kills the process: the expectation says so.
                want = trace_mod.expected_outcome(t, spec, check_target(spec), args.device)
                spec, got, message = pool.submit(_replay_one, str(f), args.target, args.device).result()
            except cf.process.BrokenProcessPool:
                got, message = trace_mod.CRASH, "the replay process died (the target killed its process)"
                pool.shutdown(wait=False)
                pool = None
            except trace_mod.TraceError as e:
                raise BadInput(str(e)) from None
            if pool is not None and got in (trace_mod.CRASH, HARNESS_ERROR) and asserts_kill(args.device):
                # A device assert leaves the CUDA context unusable, and a harness error
                # may have come after one: a fresh process for the next trace.
                pool.shutdown(wait=False)
                pool = None
            if got == HARNESS_ERROR:
                harness_errors += 1
                print(f"HARNESS ERROR  {f}  ({spec}; a bug in swa-lockstep, not in the target)")
                sys.stderr.write(message)
            elif got == want:
                print(f"ok        {f}  ({spec}: {got})")
            else:
                mismatches += 1
                print(f"MISMATCH  {f}  ({spec}: expected {want}, got {got})")
                for line in message.splitlines()[:12]:
                    print(f"          | {line}")
            sys.stdout.flush()
    finally:
        if pool is not None:
            pool.shutdown()
    if harness_errors:
        return EXIT_HARNESS_ERROR
    return EXIT_FAILED if mismatches else EXIT_OK


# -------------------------------------------------------------------- show
def cmd_show(args) -> int:
    from fuzz import show, show_render
    from fuzz import trace as trace_mod

    try:
        t = trace_mod.load(args.trace)
    except trace_mod.TraceError as e:
        raise BadInput(str(e)) from None
    spec = args.target or t.own_target
    try:
        factory = check_target(spec)
    except BadInput as e:
        if args.target is None:
            raise BadInput(f"{args.trace}: the trace's own target cannot be resolved ({e}); pass --target") from None
        raise
    check_device(args.device)
    if args.step is not None and not 0 <= args.step < len(t.steps):
        raise BadInput(f"--step: {args.step} is outside 0..{len(t.steps) - 1} ({args.trace} has {len(t.steps)} steps)")
    if args.html is not None:
        folder = Path(args.html).resolve().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise BadInput(f"--html: cannot write {args.html} (its folder {folder} is not a writable folder)")
    try:
        shown = show.show(t, factory, spec, args.device, args.step, page=args.html is not None)
    except trace_mod.TraceError as e:
        raise BadInput(str(e)) from None
    sys.stdout.write(show_render.text(shown, show_render.use_colour(args.color, sys.stdout)))
    if args.html is not None:
        trace_mod.write_atomic(args.html, show_render.page(shown))
        print(f"page: {args.html}")
    return EXIT_OK if shown.matches else EXIT_FAILED


# -------------------------------------------------------------------- sync
def cmd_sync(args) -> int:
    import json

    from properties import sync

    target = check_target(args.target)
    check_device(args.device)
    extra = {"layout": args.layout} if args.layout != "torch" else None
    report = sync.check(target, args.target, args.device, extra=extra)
    for line in report.lines():
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return EXIT_OK if report.ok else EXIT_FAILED


# -------------------------------------------------------------------- list
def cmd_list(args) -> int:
    from fuzz import trace as trace_mod

    corpus = check_corpus_dir(args.corpus, create=False)
    rows, bad = [], []
    for f in sorted(corpus.glob("*.json")):
        try:
            t = trace_mod.load(f)
        except trace_mod.TraceError as e:
            bad.append(str(e))
            continue
        rows.append((t.name, t.expect, t.variant or f"({t.target})", trace_mod.summary(t.config), str(len(t.steps))))
    head = ("name", "expect", "variant", "config", "steps")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"{len(rows)} traces in {corpus}")
    for line in bad:
        print(f"malformed: {line}", file=sys.stderr)
    return EXIT_BAD_INPUT if bad else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return {"run": cmd_run, "replay": cmd_replay, "show": cmd_show, "list": cmd_list, "sync": cmd_sync}[args.command](args)
    except BadInput as e:
        print(f"python -m fuzz {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
