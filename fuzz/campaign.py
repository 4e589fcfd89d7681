"""A fuzzing campaign: worker processes running the lockstep state machine under a budget.

Each worker is its own process (spawn), so a target that kills its process (os._exit,
a segfault, a CUDA context lost to a device assert) takes down one worker, not the
campaign. Before each step runs, a worker appends it to a per-worker journal file
(the example's configuration first); when a worker dies without saying why, the
parent reads the journal and saves that trace, unshrunk, as a crash. Failures a
worker survives are shrunk by hypothesis, and the worker sends the shrunk trace.

All workers share one hypothesis example database, keyed by target, so an example one
worker saves is replayed by the others on their next batch and by the next campaign.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue as queue_mod
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from fuzz import trace as trace_mod

STATS_EVERY_S = 0.5
# Past the deadline, a worker that is still running is killed as hung. A worker may be
# shrinking a failure it found, which hypothesis bounds at five minutes: on a pool of
# 100,000+ slots each shrink replay costs a census, so the grace covers that bound.
HANG_GRACE_S = 330.0
BATCH_MAX = 200


def variants() -> tuple[dict, dict]:
    """The seeded-bug variants and the invariant each must trip: (VARIANTS, EXPECTED)."""
    try:
        from fuzz.variants import EXPECTED, VARIANTS
    except ModuleNotFoundError as e:
        if e.name != "fuzz.variants":
            raise
        return {}, {}
    return dict(VARIANTS), dict(EXPECTED)


def resolve(spec: str):
    from properties.targets import resolve as _resolve

    return _resolve(spec, variants()[0])


@dataclass
class Job:
    wid: int
    target: str
    device: str
    seed: int
    seconds: float | None  # time budget, counted from when the worker is ready
    examples: int | None  # this worker's share of the example budget
    db: str
    journal: str
    stateful_step_count: int = 40
    fixed: dict = field(default_factory=dict)  # configuration keys pinned (--config)


class Journal:
    """The current example, kept in a file that survives the process: one JSON line for
    the configuration, then one per step, each written before the step runs."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.config: dict | None = None
        self.steps: list = []

    def _write(self, obj) -> None:
        os.write(self.fd, (json.dumps(obj) + "\n").encode())

    def begin(self, config: dict) -> None:
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        self.config, self.steps = dict(config), []
        self._write({"config": self.config})

    def step(self, step) -> None:
        self.steps.append(step)
        self._write(step.to_json())


def _replay_child(path: str, spec: str, device: str) -> tuple[str, str]:
    out = trace_mod.run(trace_mod.load(path), resolve(spec), device)
    return out.outcome, out.message


def replay_isolated(path: str | os.PathLike, spec: str, device: str) -> trace_mod.Outcome:
    """Replay one trace in a fresh child process, so a target or a device assert that
    kills its process (a guard at strict on CUDA) is the outcome ``crash``, not a lost run."""
    import concurrent.futures as cf

    with cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        try:
            outcome, message = pool.submit(_replay_child, str(path), spec, device).result()
        except cf.process.BrokenProcessPool:
            return trace_mod.Outcome(trace_mod.CRASH, "the replay process died")
    return trace_mod.Outcome(outcome, message)


def read_journal(path: str | os.PathLike) -> tuple[dict | None, list]:
    """The configuration and steps a dead worker was running; a torn last line is dropped."""
    from properties.steps import StepFormatError, step_from_json

    config, steps = None, []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, []
    for line in lines:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            break
        if config is None:
            config = obj.get("config") if isinstance(obj, dict) else None
            continue
        try:
            steps.append(step_from_json(obj))
        except StepFormatError:
            break
    return config, steps


def _derive(seed: int, wid: int, batch: int) -> int:
    return random.Random(f"swa-lockstep:{seed}:{wid}:{batch}").getrandbits(64)


def machine_class(target_spec: str, factory, device: str, fixed: dict | None = None):
    """The machine for one target. Its name carries the target (and any pinned keys),
    so the shared database keeps each target's examples apart (hypothesis keys
    stateful tests by the class)."""
    from properties.machine import machine_for

    base = machine_for(factory, device, fixed=fixed)
    pins = "".join(f",{k}={v}" for k, v in sorted((fixed or {}).items()))
    return type(f"LockstepMachine[{target_spec}{pins}]", (base,), {"__module__": __name__})


def describe_target(factory) -> list[str]:
    """Lines for a campaign header: what the target says it is (sglang: its version,
    stand-ins and layout path), and the contract breaks it declares it does not refuse,
    which the campaign never sends (SPEC 4.7)."""
    lines = []
    describe = getattr(factory, "describe", None)
    if callable(describe):
        lines.append(f"target: {describe()}")
    breaks = sorted(getattr(factory, "unrefused_breaks", ()))
    if breaks:
        lines.append(f"not sent (the target declares it does not refuse them): {', '.join(breaks)}")
    return lines


def worker_main(job: Job, out) -> None:
    """One worker: batches of the state machine under a per-batch seed until the budget
    is spent or a failure is found; reports stats, the failure, and 'done' on `out`."""
    from hypothesis import HealthCheck, Phase, Verbosity, seed, settings
    from hypothesis.database import DirectoryBasedExampleDatabase
    from hypothesis.stateful import run_state_machine_as_test

    from properties.lockstep import HarnessError, LockstepFailure, Observer, TargetCrash, minimize, observing
    from properties.machine import LABELS_SEEN, SHAPES_SEEN

    import torch

    # The tensors are tiny: intra-op threads only contend with the other workers.
    torch.set_num_threads(1)
    journal = Journal(job.journal)
    factory = resolve(job.target)
    counts = {"steps": 0, "compared": 0, "restarted": 0, "examples": 0}
    last_sent = [0.0]

    def send_stats(force: bool = False) -> None:
        now = time.time()
        if force or now - last_sent[0] >= STATS_EVERY_S:
            last_sent[0] = now
            out.put(("stats", job.wid, dict(counts), sorted(LABELS_SEEN), [[m, c, n] for (m, c), n in SHAPES_SEEN.items()]))

    class Journaling(Observer):
        """Every example's configuration and steps go to the journal before they run."""

        def started(self, ls):
            counts["examples"] += 1
            journal.begin(ls.config)
            self.seen = ls.counters()

        def before_step(self, ls, step):
            journal.step(step)

        def after_step(self, ls, step):
            now = ls.counters()
            counts["steps"] += now["steps_run"] - self.seen["steps_run"]
            counts["compared"] += now["steps_compared"] - self.seen["steps_compared"]
            counts["restarted"] += now["runs_restarted"] - self.seen["runs_restarted"]
            self.seen = now
            send_stats()

    journaling = Journaling()

    base = machine_class(job.target, factory, job.device, job.fixed)
    db = DirectoryBasedExampleDatabase(job.db)
    # The budget is fuzzing time: it starts once the imports (torch) are done.
    ready = time.time()
    deadline = None if job.seconds is None else ready + job.seconds
    out.put(("ready", job.wid, ready))
    batch, size, done_examples = 0, 10, 0
    try:
        while True:
            if deadline is not None and time.time() >= deadline:
                break
            if job.examples is not None:
                if done_examples >= job.examples:
                    break
                size = min(size, job.examples - done_examples)
            cls = seed(_derive(job.seed, job.wid, batch))(type(base.__name__, (base,), {"__module__": __name__}))
            s = settings(
                max_examples=size,
                database=db,
                deadline=None,
                stateful_step_count=job.stateful_step_count,
                derandomize=False,
                report_multiple_bugs=False,
                verbosity=Verbosity.quiet,
                phases=[Phase.reuse, Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            )
            t0 = time.time()
            try:
                with observing(journaling):
                    run_state_machine_as_test(cls, settings=s)
            except LockstepFailure as e:
                send_stats(force=True)
                config = e.config or journal.config
                steps = e.steps if e.steps is not None else journal.steps
                try:
                    shorter, again = minimize(config, steps, factory, e.invariant)
                except HarnessError as h:  # a replay of the failure hit a harness bug
                    out.put(("harness_error", job.wid, {"message": str(h), "traceback": h.traceback}))
                    return
                if again is not None:
                    steps, e = shorter, again
                out.put(("failure", job.wid, {
                    "outcome": e.invariant,
                    "message": str(e),
                    "config": config,
                    "steps": [x.to_json() for x in steps],
                    "shrunk": True,
                }))
                return
            except TargetCrash as e:  # the target raised outside a compared call (SPEC 5)
                send_stats(force=True)
                out.put(("failure", job.wid, {
                    "outcome": trace_mod.CRASH,
                    "message": str(e),
                    "config": journal.config,
                    "steps": [x.to_json() for x in journal.steps],
                    "shrunk": True,
                }))
                return
            except Exception as e:  # the harness's own code raised: never a corpus trace
                send_stats(force=True)
                tb = e.traceback if isinstance(e, HarnessError) else "".join(traceback.format_exception(e))
                out.put(("harness_error", job.wid, {"message": f"{type(e).__name__}: {e}", "traceback": tb}))
                return
            done_examples += size
            batch += 1
            # Batches of about two seconds: the deadline is checked between them.
            took = max(time.time() - t0, 1e-3)
            size = max(1, min(BATCH_MAX, int(size * 2.0 / took)))
    finally:
        send_stats(force=True)
        out.put(("done", job.wid))


@dataclass
class Failure:
    wid: int
    outcome: str
    message: str
    trace: trace_mod.Trace
    path: Path | None
    shrunk: bool
    page: Path | None = None  # the failure drawn as a page, beside the trace


@dataclass
class HarnessFailure:
    """The harness's own code raised in a worker: a bug here, reported with its traceback."""

    wid: int
    message: str
    traceback: str


@dataclass
class Result:
    steps: int = 0
    compared: int = 0  # steps whose every call's result and state were compared
    restarted: int = 0  # runs ended after a call the model cannot follow
    examples: int = 0
    labels: set = field(default_factory=set)
    # (method, argument shape) -> calls, summed over the workers: the coverage table.
    shapes: Counter = field(default_factory=Counter)
    known: int = 0
    failures: list[Failure] = field(default_factory=list)
    harness_errors: list[HarnessFailure] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def compared_fraction(self) -> float:
        return self.compared / self.steps if self.steps else 1.0


def _labels_file(db: str) -> Path:
    return Path(db) / "swa-lockstep-labels.json"


def _known_labels(db: str, reached: set) -> set:
    """Labels any campaign on this database has reached, so 'reached out of known' means
    something without a fixed list of labels (the driver makes some from contract names)."""
    path = _labels_file(db)
    try:
        known = set(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        known = set()
    known |= reached
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(known)))
        os.replace(tmp, path)
    except OSError:
        pass
    return known


def _variant_of(target: str) -> str | None:
    return target if target in variants()[0] else None


def run_campaign(
    target: str,
    device: str = "cpu",
    seconds: float | None = 20.0,
    examples: int | None = None,
    seed: int = 0,
    workers: int = 1,
    db: str = ".hypothesis/fuzz-db",
    corpus: str = "fuzz/corpus",
    progress=None,
    on_failure=None,
    on_harness_error=None,
    fixed: dict | None = None,
    about: list[str] | None = None,
) -> Result:
    """Run workers until the budget is spent; save each failure's trace into `corpus`."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    jdir = tempfile.mkdtemp(prefix="swa-lockstep-journal-")
    ready: dict[int, float] = {}
    per = None if examples is None else -(-examples // workers)
    procs = {}
    stats: dict[int, tuple[dict, list]] = {}
    done: set[int] = set()
    result = Result()
    if about is None:
        about = describe_target(resolve(target))
    try:
        for wid in range(workers):
            job = Job(wid, target, device, seed, seconds, per, db, os.path.join(jdir, f"worker-{wid}.jsonl"),
                      fixed=dict(fixed or {}))
            p = ctx.Process(target=worker_main, args=(job, out), name=f"fuzz-worker-{wid}", daemon=True)
            p.start()
            procs[wid] = p

        def handle(msg) -> None:
            kind, wid = msg[0], msg[1]
            if kind == "ready":
                ready[wid] = msg[2]
            elif kind == "stats":
                stats[wid] = (msg[2], msg[3], msg[4])
            elif kind == "harness_error":
                h = HarnessFailure(wid, msg[2]["message"], msg[2]["traceback"])
                result.harness_errors.append(h)
                if on_harness_error is not None:
                    on_harness_error(h)
            elif kind == "done":
                done.add(wid)
            elif kind == "failure":
                f = msg[2]
                config = dict(f["config"] or {})
                from properties.steps import step_from_json

                steps = [step_from_json(s) for s in f["steps"]]
                _record(result, wid, f["outcome"], f["message"], config, steps, f["shrunk"], target, device, corpus, on_failure, about)

        def drain(block_s: float = 0.0) -> None:
            try:
                handle(out.get(timeout=block_s) if block_s else out.get_nowait())
                while True:
                    handle(out.get_nowait())
            except queue_mod.Empty:
                pass

        finished: set[int] = set()
        last_progress = 0.0
        while len(finished) < workers:
            drain(0.2)
            now = time.time()
            for wid, p in procs.items():
                if wid in finished:
                    continue
                hung = seconds is not None and wid in ready and now > ready[wid] + seconds + HANG_GRACE_S and p.is_alive()
                if hung:
                    p.kill()
                    p.join()
                if p.is_alive():
                    continue
                p.join()
                drain()
                finished.add(wid)
                if wid not in done or hung:
                    why = "hung past the budget and was killed" if hung else f"died with exit code {p.exitcode}"
                    config, steps = read_journal(os.path.join(jdir, f"worker-{wid}.jsonl"))
                    if config is None:
                        config = {}
                    _record(result, wid, trace_mod.CRASH, f"worker {wid} {why} (the target killed its process) during the last step of this trace",
                            config, steps, False, target, device, corpus, on_failure, about)
            # No line until a worker has started: before that there is nothing to count,
            # and a slow import (sglang's takes seconds) printed the same empty line.
            if progress is not None and ready and now - last_progress >= 1.0:
                last_progress = now
                _sum(result, stats, ready)
                progress(result)
        _sum(result, stats, ready)
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(jdir, ignore_errors=True)
    result.known = len(_known_labels(db, result.labels))
    return result


def _sum(result: Result, stats: dict, ready: dict) -> None:
    """Totals over the workers; elapsed runs from the first worker ready, so steps/s
    measures fuzzing, not process start-up."""
    result.steps = sum(s[0]["steps"] for s in stats.values())
    result.compared = sum(s[0]["compared"] for s in stats.values())
    result.restarted = sum(s[0]["restarted"] for s in stats.values())
    result.examples = sum(s[0]["examples"] for s in stats.values())
    result.labels = set().union(*[set(s[1]) for s in stats.values()]) if stats else set()
    result.shapes = Counter()
    for s in stats.values():
        for m, c, n in s[2]:
            result.shapes[(m, c)] += n
    result.elapsed = time.time() - min(ready.values()) if ready else 0.0


def _record(result, wid, outcome, message, config, steps, shrunk, target, device, corpus, on_failure, about=()) -> None:
    variant = _variant_of(target)
    path = None
    t = trace_mod.Trace(
        name="",
        expect=outcome if trace_mod.valid_outcome(outcome) else trace_mod.CRASH,
        config=config,
        steps=steps,
        target=target,
        variant=variant,
        note=("shrunk by hypothesis" if shrunk else "not shrunk: the worker process died")
        + f"; found on {target} ({device}): {message.splitlines()[0] if message else outcome}"
        + "".join(f"; {line}" for line in about),
    )
    if config:
        try:
            path = trace_mod.save(t, corpus)
        except OSError as e:
            message += f"\n(could not save the trace into {corpus}: {e})"
    page = None
    if path is not None:
        from fuzz.show import page_beside

        page, why = page_beside(path, target, device)
        if why:
            message += f"\n(could not draw the failure page: {why})"
    failure = Failure(wid, outcome, message, t, path, shrunk, page)
    result.failures.append(failure)
    if on_failure is not None:
        on_failure(failure)
