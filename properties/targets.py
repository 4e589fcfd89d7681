"""What is tested: a target is a factory `make(config: dict) -> allocator` (SPEC 4.3).

`resolve` knows the bundled impl ("impl"), the installed sglang's own allocators
("sglang", `properties.sglang_target`), and `module:callable` for anyone's allocator. Named variants are supplied by whoever holds them (the fuzz package's
seeded-bug variants), as a mapping, so this package does not depend on them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

Target = Callable[[dict], Any]


class TargetError(ValueError):
    """A target spec that names nothing importable."""


def _bundled(config: dict):
    from impl import make_allocator

    return make_allocator(config)


def _bundled_builds(config: dict) -> bool:
    """The configurations the bundled impl builds on any machine: every kind, page
    size, ring and pool the workload draws (pure SWA at page size 1 without a ring, a
    ring above page size 1), on the CPU with the torch layout. Another device, backend
    or layout needs what a machine may lack, and the impl says so by raising
    NotImplementedError there, as any target may."""
    pure, ring, ps = config["kind"] == "pure_swa", config.get("ring_size") is not None, config["page_size"]
    if (pure and (ps != 1 or ring)) or (ring and ps == 1):
        return False
    return (torch_device_type(config.get("device", "cpu")) == "cpu" and config.get("layout", "torch") == "torch"
            and config.get("backend", "auto") in ("auto", "cpu"))


def torch_device_type(name) -> str | None:
    """The device type a configuration names ("cuda:1" -> "cuda"), or None if it names none."""
    return str(name).split(":")[0] if name is not None else None


_bundled.builds = _bundled_builds


def declares_it_builds(target: Target, config: dict) -> bool:
    """Whether a target declares it builds this configuration (its `builds(config)`):
    a NotImplementedError from it there is a failure, not a skip. SPEC 4.3's skip is
    for what a target does not build, which it says by raising it."""
    builds = getattr(target, "builds", None)
    return bool(builds(config)) if callable(builds) else False


def unrefused_breaks(target: Target) -> frozenset[str]:
    """The SPEC 3.2 breaks a target declares it does not refuse (SPEC 4.7): the
    harness never sends them to it."""
    return frozenset(getattr(target, "unrefused_breaks", ()))


def resolve(spec: str = "impl", variants: Mapping[str, Target] | None = None) -> Target:
    if spec == "impl":
        return _bundled
    if spec == "sglang":
        from properties.sglang_target import available, make

        ok, why = available()
        if not ok:
            raise TargetError(f"target 'sglang': {why}")
        return make
    if variants and spec in variants:
        return variants[spec]
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise TargetError(f"target {spec!r}: cannot import {module_name!r} ({e})") from e
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise TargetError(f"target {spec!r}: {module_name} has no callable {attr!r}")
        return factory
    known = ", ".join(["impl", "sglang", *sorted(variants or ())])
    raise TargetError(f"unknown target {spec!r}; use one of {known}, or module:callable")
