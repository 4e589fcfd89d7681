"""The allocator configuration (SPEC 4.3): one schema for the factory, the lockstep
driver, trace files and the command line.

Plain Python (no torch), so whoever reads a configuration (a trace loader, a CLI)
checks it the same way the factory will. `validate` returns a complete copy with the
defaults filled in; `ConfigError` (a ValueError) names the first bad field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

KINDS = ("hybrid", "pure_swa")
LEVELS = ("off", "warn", "strict")
BACKENDS = ("auto", "cpu", "cuda", "npu", "npu_emulated")
LAYOUTS = ("torch", "triton")
_DEVICE = re.compile(r"[a-z][a-z0-9_]*(:[0-9]+)?")


class ConfigError(ValueError):
    """A configuration that cannot be built: `field` is the key at fault."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"config key {field!r}: {message}")


@dataclass(frozen=True)
class Field:
    name: str
    default: Any
    required: bool
    doc: str


FIELDS: tuple[Field, ...] = (
    Field("kind", None, True, "'hybrid' (full + SWA pools) or 'pure_swa' (one SWA pool)"),
    Field("size", None, True, "full pool slots, an integer >= 1"),
    Field("size_swa", None, False, "SWA pool slots, an integer >= 1 (default: size)"),
    Field("page_size", None, True, "slots per page, an integer >= 1"),
    Field("device", "cpu", False, "a torch device name such as 'cpu', 'cuda' or 'cuda:1'"),
    Field("need_sort", False, False, "true or false: frees staged and merged sorted"),
    Field("ring_size", None, False, "null, or the per-request SWA ring size (an integer >= 1)"),
    Field("req_slots", None, False, "null, or the request slots (an integer >= 1; required with ring_size)"),
    Field("check_level", None, False, "null (the level in force), or one of " + ", ".join(LEVELS)),
    Field("backend", "auto", False, "one of " + ", ".join(BACKENDS)),
    Field("layout", "torch", False, "the paged layouts' implementation, one of " + ", ".join(LAYOUTS)),
    Field("debug_memory_pool", False, False, "true or false: the allocator's debug checks (double frees refused)"),
)
KEYS: tuple[str, ...] = tuple(f.name for f in FIELDS)
# The keys SPEC 4.3 hands every target; the others (backend, layout,
# debug_memory_pool) go to a target only where they are not their default.
SPEC_KEYS: tuple[str, ...] = KEYS[:9]
REQUIRED: tuple[str, ...] = tuple(f.name for f in FIELDS if f.required)
DEFAULTS: dict[str, Any] = {f.name: f.default for f in FIELDS if not f.required}


def _int(cfg: dict, key: str, minimum: int) -> None:
    v = cfg[key]
    # bool is an int subclass; True as a size is a caller's mistake.
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(key, f"must be an integer >= {minimum}, got {v!r}")


def _one_of(cfg: dict, key: str, allowed: tuple) -> None:
    if cfg[key] not in allowed:
        raise ConfigError(key, f"must be one of {', '.join(map(repr, allowed))}, got {cfg[key]!r}")


def _bool(cfg: dict, key: str) -> None:
    if not isinstance(cfg[key], bool):
        raise ConfigError(key, f"must be true or false, got {cfg[key]!r}")


def validate(config: Any) -> dict:
    """A complete, checked copy of `config`; ConfigError names the first bad key."""
    if not isinstance(config, dict):
        raise ConfigError("config", f"must be a mapping of configuration keys, got {type(config).__name__}")
    for key in config:
        if key not in KEYS:
            raise ConfigError(str(key), f"unknown; known keys: {', '.join(KEYS)}")
    for key in REQUIRED:
        if key not in config:
            raise ConfigError(key, f"missing; required: {', '.join(REQUIRED)}")
    cfg = {**DEFAULTS, **config}
    if cfg["size_swa"] is None:
        cfg["size_swa"] = cfg["size"]
    _one_of(cfg, "kind", KINDS)
    for key in ("size", "size_swa", "page_size"):
        _int(cfg, key, 1)
    if not isinstance(cfg["device"], str) or not _DEVICE.fullmatch(cfg["device"]):
        raise ConfigError("device", f"must be a torch device name such as 'cpu' or 'cuda:0', got {cfg['device']!r}")
    _bool(cfg, "need_sort")
    if cfg["ring_size"] is not None:
        _int(cfg, "ring_size", 1)
        if cfg["req_slots"] is None:
            raise ConfigError("req_slots", "must be set (an integer >= 1) when ring_size is set")
    if cfg["req_slots"] is not None:
        _int(cfg, "req_slots", 1)
    if cfg["check_level"] is not None:
        _one_of(cfg, "check_level", LEVELS)
    _one_of(cfg, "backend", BACKENDS)
    _one_of(cfg, "layout", LAYOUTS)
    _bool(cfg, "debug_memory_pool")
    return cfg
