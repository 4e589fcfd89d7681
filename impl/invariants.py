"""Declared invariants and the level-gated check that enforces them.

An invariant has a name, a bucket (how bad a violation is) and an elementwise
property. ``expect`` evaluates the property at the current level and then
either crashes or counts, by the bucket x level matrix in ``crashes``:

    bucket \\ level       OFF    WARN   STRICT
    SOFTEN               -      count  count
    GUARD                -      count  crash
    FATAL_CONTAINABLE    -      count  crash
    FATAL_UNCONTAINABLE  -      crash  crash

Nothing here reads a tensor back to the host on the hot path: a crash on CUDA
is ``torch._assert_async`` and counts accumulate in device tensors, read only
by ``hit_counts()``. On CPU a crash raises ``InvariantViolation`` at once,
which is what CI sees.

The level comes from the environment variable ``SWA_LOCKSTEP_INVARIANTS``
(off | warn | strict, default warn); ``set_level`` / ``override_level`` take
precedence so that tests and the harness need not touch the environment.
"""

from __future__ import annotations

import contextlib
import enum
import os
from typing import Callable, Iterator, Optional

import torch

ENV_VAR = "SWA_LOCKSTEP_INVARIANTS"

__all__ = [
    "ENV_VAR",
    "Bucket",
    "Level",
    "Property",
    "IsTrue",
    "InRange",
    "PageAligned",
    "Invariant",
    "InvariantViolation",
    "crashes",
    "current_level",
    "set_level",
    "override_level",
    "expect",
    "hit_counts",
    "reset_hits",
    "registered_invariants",
]


class Bucket(enum.Enum):
    """How bad a violation is: blast radius and whether it can be recovered."""

    SOFTEN = "soften"  # a legitimate event, counted for visibility
    GUARD = "guard"  # recoverable, but the caller has a bug
    FATAL_CONTAINABLE = "fatal_containable"  # wrong, though the damage is local
    FATAL_UNCONTAINABLE = "fatal_uncontainable"  # corrupts shared state


class Level(enum.IntEnum):
    OFF = 0
    WARN = 1
    STRICT = 2


class InvariantViolation(RuntimeError):
    """Raised on a host device when an invariant's bucket says crash."""

    def __init__(self, invariant: str, msg: str, detail: str = ""):
        self.invariant = invariant
        self.msg = msg
        text = f"invariant {invariant!r} violated"
        if detail:
            text += f" ({detail})"
        if msg:
            text += f": {msg}"
        super().__init__(text)


# ---------------------------------------------------------------- properties


class Property:
    """Elementwise predicate: maps a tensor to a bool tensor of the same shape.

    No reduction happens here, so evaluating a property never syncs.
    """

    name = "property"

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # sglang's spelling, so its call sites work on these properties too.
    def ok(self, value: torch.Tensor) -> torch.Tensor:
        return self(value)

    def __repr__(self) -> str:
        return self.name


class IsTrue(Property):
    """The value already is the condition (a comparison computed by the caller)."""

    name = "IsTrue()"

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        return value.to(torch.bool)


class InRange(Property):
    """lo <= value < hi (half-open, the usual index-domain check)."""

    def __init__(self, lo, hi):
        if hi < lo:
            raise ValueError(f"InRange needs lo <= hi, got lo={lo} hi={hi}")
        self.lo = lo
        self.hi = hi
        self.name = f"InRange({lo}, {hi})"

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        return (value >= self.lo) & (value < self.hi)


class PageAligned(Property):
    """value % page_size == 0."""

    def __init__(self, page_size: int):
        if page_size < 1:
            raise ValueError(f"PageAligned needs page_size >= 1, got {page_size}")
        self.page_size = page_size
        self.name = f"PageAligned({page_size})"

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        return value % self.page_size == 0


# ---------------------------------------------------------------- registry

_REGISTRY: dict[str, "Invariant"] = {}


class Invariant:
    """A declared invariant. Constructing one registers it under its name.

    ``recover`` is the data-side repair, applied at every level (even OFF);
    an uncontainable fatal has no correct repair, so it may not have one.
    """

    def __init__(
        self,
        name: str,
        bucket: Bucket,
        prop: Property,
        recover: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    ):
        if not isinstance(bucket, Bucket):
            raise ValueError(f"invariant {name!r}: bucket must be a Bucket, got {bucket!r}")
        if bucket is Bucket.FATAL_UNCONTAINABLE and recover is not None:
            raise ValueError(
                f"invariant {name!r} is FATAL_UNCONTAINABLE and so cannot have a "
                "recover; use FATAL_CONTAINABLE if a repair exists"
            )
        if name in _REGISTRY:
            raise ValueError(
                f"invariant name {name!r} is already registered; names must be unique"
            )
        self.name = name
        self.bucket = bucket
        self.prop = prop
        self.recover = recover
        _REGISTRY[name] = self

    def __repr__(self) -> str:
        return f"Invariant({self.name!r}, {self.bucket.name}, {self.prop!r})"


def registered_invariants() -> dict[str, Invariant]:
    return dict(_REGISTRY)


# ---------------------------------------------------------------- level

_LEVEL_NAMES = {"off": Level.OFF, "warn": Level.WARN, "strict": Level.STRICT}
_override: Optional[Level] = None


def _parse_level(value, what: str) -> Level:
    if isinstance(value, Level):
        return value
    if isinstance(value, str) and value.strip().lower() in _LEVEL_NAMES:
        return _LEVEL_NAMES[value.strip().lower()]
    raise ValueError(
        f"{what}={value!r} is not a valid invariant level; "
        f"use one of {', '.join(_LEVEL_NAMES)}"
    )


def current_level() -> Level:
    """The override if one is set, else the environment (default WARN)."""
    if _override is not None:
        return _override
    raw = os.environ.get(ENV_VAR)
    if raw is None or raw == "":
        return Level.WARN
    return _parse_level(raw, ENV_VAR)


def set_level(level) -> None:
    """Override the environment; ``None`` drops the override."""
    global _override
    _override = None if level is None else _parse_level(level, "level")


@contextlib.contextmanager
def override_level(level) -> Iterator[Level]:
    global _override
    new = _parse_level(level, "level")
    saved = _override
    _override = new
    try:
        yield new
    finally:
        _override = saved


def crashes(bucket: Bucket, level: Level) -> bool:
    """The bucket x level crash decision (see the module docstring)."""
    if level <= Level.OFF or bucket is Bucket.SOFTEN:
        return False
    if bucket is Bucket.FATAL_UNCONTAINABLE:
        return True
    return level >= Level.STRICT


# ---------------------------------------------------------------- counting

# (invariant name, device string) -> int64 counter living on that device, so a
# count is one in-place add with no readback.
_COUNTERS: dict[tuple[str, str], torch.Tensor] = {}


def _count(name: str, ok: torch.Tensor) -> None:
    key = (name, str(ok.device))
    counter = _COUNTERS.get(key)
    if counter is None:
        counter = torch.zeros((), dtype=torch.int64, device=ok.device)
        _COUNTERS[key] = counter
    counter.add_((~ok).sum())


def hit_counts() -> dict[str, int]:
    """Cumulative violations by invariant name, summed over devices.

    Every registered invariant appears (0 when never hit). This is the one
    place that reads the counters back, so it synchronizes.
    """
    out = {name: 0 for name in _REGISTRY}
    for (name, _device), counter in _COUNTERS.items():
        out[name] = out.get(name, 0) + int(counter.item())
    return out


def reset_hits() -> None:
    _COUNTERS.clear()


# ---------------------------------------------------------------- expect


def _crash(inv: Invariant, ok: torch.Tensor, msg: str) -> None:
    if ok.device.type == "cuda":
        # Fires when the stream reaches it; the host carries on without a sync.
        torch._assert_async(ok.all(), f"invariant {inv.name!r} violated: {msg}")
        return
    if not bool(ok.all()):
        bad = int((~ok).sum())
        raise InvariantViolation(
            inv.name,
            msg,
            f"{inv.bucket.name}, {bad} of {ok.numel()} elements fail {inv.prop!r}",
        )


def expect(inv: Invariant, value, msg: str = ""):
    """Check ``inv`` over ``value`` at the current level; return the value.

    The returned value is ``inv.recover(value)`` where a recover is given
    (applied at every level), else ``value`` itself.
    """
    level = current_level()
    if level >= Level.WARN and value is not None:
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(value)
        if value.numel() > 0:
            ok = inv.prop(value)
            if ok.dtype != torch.bool:
                ok = ok.to(torch.bool)
            if crashes(inv.bucket, level):
                _crash(inv, ok, msg)
            else:
                _count(inv.name, ok)
    if inv.recover is not None and value is not None:
        return inv.recover(value)
    return value
