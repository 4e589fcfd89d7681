"""The trace file: a versioned JSON record of one workload and the outcome it must have.

    {"format": "swa-lockstep-trace", "version": 1, "name": "...",
     "expect": "pass" | "<invariant>" | "crash",
     "target": "<where it was found>", "variant": "<variant name>" | null,
     "config": {...SPEC 4.3 keys...}, "steps": [step.to_json(), ...], "note": "..."}

Steps name requests and positions, never slot ids, so a trace replays on any target
and device; the config's `device` records where the trace was found and the replay
device replaces it. `expect` is the outcome on the target the trace was found on (the
named variant, else `target`); every other target must pass it, since a correct
allocator passes every trace. Loading validates every field and names the file, the
step and the field that is wrong; writing is atomic (a temporary file, then
`os.replace`), so a reader never sees half a trace.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from impl.config import ConfigError
from properties.lockstep import CONFIG_KEYS, HarnessError, LockstepFailure, TargetCrash, asserts_kill, check_config, replay
from properties.steps import Step, StepFormatError, step_from_json
from reference import names

FORMAT = "swa-lockstep-trace"
VERSION = 1
PASS = "pass"
CRASH = "crash"  # the target raised outside the contract, or its process died
UNSUPPORTED = "unsupported"  # the target's factory raised NotImplementedError for the config
_FIELDS = ("format", "version", "name", "expect", "target", "variant", "config", "steps", "note")


class TraceError(ValueError):
    """A trace that cannot be read or applied: names the file, the step and the field."""

    def __init__(self, path: str | os.PathLike, message: str, index: int | None = None, field: str | None = None):
        self.path, self.index, self.field, self.reason = str(path), index, field, message
        where = [self.path]
        if index is not None:
            where.append(f"step {index}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(": ".join(where + [message]))


def valid_outcome(value: Any) -> bool:
    """What `expect` may say: pass, crash, an invariant of SPEC 3.3, or a contract the
    target failed to refuse (`contract.<name>`, as the lockstep driver reports it)."""
    return isinstance(value, str) and (
        value in (PASS, CRASH) or value in names.INVARIANTS or (value.startswith("contract.") and len(value) > 9)
    )


@dataclass
class Trace:
    name: str
    expect: str
    config: dict
    steps: list[Step]
    target: str = "impl"
    variant: str | None = None
    note: str = ""
    path: Path | None = field(default=None, compare=False)

    @property
    def own_target(self) -> str:
        """The target `expect` is about: the variant it was made on, else where it was found."""
        return self.variant or self.target

    def expected_on(self, target_spec: str) -> str:
        return self.expect if target_spec == self.own_target else PASS

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "expect": self.expect,
            "target": self.target,
            "variant": self.variant,
            "config": {k: self.config[k] for k in CONFIG_KEYS if k in self.config},
            "steps": [s.to_json() for s in self.steps],
            "note": self.note,
        }

    def digest(self) -> str:
        """A short content hash of config and steps: the same workload, the same name."""
        body = json.dumps([self.to_json()["config"], [s.to_json() for s in self.steps]], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:10]


def _check_config(path, cfg: Any) -> dict:
    """The one configuration schema (impl.config), through the driver's defaults."""
    if not isinstance(cfg, dict):
        raise TraceError(path, f"must be an object of configuration keys, got {type(cfg).__name__}", field="config")
    try:
        return check_config(cfg)
    except ConfigError as e:
        raise TraceError(path, str(e).split(": ", 1)[1], field=f"config.{e.field}") from None


def from_json(data: Any, path: str | os.PathLike = "<trace>") -> Trace:
    """Validate a parsed trace; TraceError names the first thing that is wrong."""
    if not isinstance(data, dict):
        raise TraceError(path, f"a trace is a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise TraceError(path, f"must be {FORMAT!r}, got {data.get('format')!r}; this is not a swa-lockstep trace", field="format")
    version = data.get("version")
    if version != VERSION:
        raise TraceError(
            path,
            f"version {version!r} is not supported; this swa-lockstep reads version {VERSION} (upgrade swa-lockstep to read newer traces)",
            field="version",
        )
    extra = sorted(set(data) - set(_FIELDS))
    if extra:
        raise TraceError(path, f"not a field of a version {VERSION} trace; known: {', '.join(_FIELDS)}", field=extra[0])
    for key in ("name", "target"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise TraceError(path, f"must be a non-empty string, got {data.get(key)!r}", field=key)
    if not valid_outcome(data.get("expect")):
        raise TraceError(
            path,
            f"must be 'pass', 'crash', 'contract.<name>' or one of {', '.join(names.INVARIANTS)}; got {data.get('expect')!r}",
            field="expect",
        )
    variant = data.get("variant")
    if variant is not None and (not isinstance(variant, str) or not variant):
        raise TraceError(path, f"must be a variant name or null, got {variant!r}", field="variant")
    note = data.get("note", "")
    if not isinstance(note, str):
        raise TraceError(path, f"must be a string, got {note!r}", field="note")
    config = _check_config(path, data.get("config"))
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list):
        raise TraceError(path, f"must be a list of steps, got {type(raw_steps).__name__}", field="steps")
    steps = []
    for i, raw in enumerate(raw_steps):
        try:
            steps.append(step_from_json(raw))
        except StepFormatError as e:
            raise TraceError(path, str(e).split(": ", 1)[1], index=i, field=e.field) from None
    return Trace(data["name"], data["expect"], config, steps, data["target"], variant, note, Path(path))


def load(path: str | os.PathLike) -> Trace:
    """Read and validate one trace file; TraceError on anything wrong with it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(path, f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return from_json(data, path)


def dump(trace: Trace, path: str | os.PathLike) -> Path:
    """Write a trace atomically: a temporary file in the same folder, then os.replace."""
    path = write_atomic(path, json.dumps(trace.to_json(), indent=1) + "\n")
    trace.path = path
    return path


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write a text file so that no reader sees half of it: a temporary file in the same
    folder, then os.replace; an error leaves the old file intact."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text).strip("-") or "x"


def save(trace: Trace, corpus: str | os.PathLike) -> Path:
    """Save into a corpus folder under a name from the target, the outcome and the
    content hash; the same workload found again lands on the same file."""
    corpus = Path(corpus)
    corpus.mkdir(parents=True, exist_ok=True)
    if not trace.name:
        trace.name = f"{slug(trace.own_target)}-{slug(trace.expect)}-{trace.digest()}"
    return dump(trace, corpus / f"{trace.name}.json")


@dataclass
class Outcome:
    outcome: str  # pass, an invariant, contract.<name>, crash, unsupported
    message: str = ""
    steps_run: int = 0  # on a failure, the index of the failing step
    guard_refusals: list[int] = field(default_factory=list)  # steps a guard refused at strict


def run(trace: Trace, target, device: str = "cpu") -> Outcome:
    """Replay a trace on a target factory and a device (the device replaces the
    trace's). A step that cannot apply is the trace's fault: TraceError."""
    config = dict(trace.config, device=device)
    seen: list = []
    try:
        ls = replay(config, trace.steps, target, started=seen.append)
    except LockstepFailure as e:
        return Outcome(e.invariant, str(e), e.index, _refusals(seen))
    except StepFormatError as e:
        index = getattr(e, "index", None)
        raise TraceError(trace.path or trace.name, str(e).split(": ", 1)[1], index=index, field=e.field) from None
    except NotImplementedError as e:
        return Outcome(UNSUPPORTED, f"the target does not build this configuration: {e}")
    except TargetCrash as e:  # the target raised outside a compared call, as on a server
        return Outcome(CRASH, str(e), guard_refusals=_refusals(seen))
    # HarnessError propagates: a bug in the harness is not the trace's outcome.
    return Outcome(PASS, "", ls.steps_run, list(ls.guard_refusals))


def _refusals(seen: list) -> list[int]:
    return list(seen[0].guard_refusals) if seen else []


def expected_outcome(trace: Trace, target_spec: str, target, device: str) -> str:
    """What a replay of ``trace`` on ``target`` must give on ``device``.

    On CPU, the trace's own rule (``Trace.expected_on``). Where a guard at strict is a
    device assert (CUDA), the process dies at the first step a guard refuses, so a run
    that reaches such a refusal must end in ``crash``; otherwise the outcome is the
    CPU one. Which steps a guard refuses is read off a replay on CPU.
    """
    want = trace.expected_on(target_spec)
    if not asserts_kill(device):
        return want
    cpu = run(trace, target, "cpu")
    if cpu.outcome == UNSUPPORTED:
        return want
    # A failure at the refusing step itself is the guard's own (it raised, but wrongly
    # or changing state): that step's outcome stands.
    killed = [i for i in cpu.guard_refusals if cpu.outcome in (PASS, CRASH) or i < cpu.steps_run]
    return CRASH if killed else want


def summary(config: dict) -> str:
    """One line for a table: kind, page size, sizes, ring, level."""
    ring = f" ring={config['ring_size']}x{config['req_slots']}" if config.get("ring_size") else ""
    sort = " sort" if config.get("need_sort") else ""
    return f"{config['kind']} ps={config['page_size']} size={config['size']}/{config['size_swa']}{ring}{sort} {config.get('check_level', 'strict')}"
