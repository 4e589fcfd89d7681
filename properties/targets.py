"""What is tested: a target is a factory `make(config: dict) -> allocator` (SPEC 4.3).

`resolve` knows the bundled impl ("impl") and `module:callable` for anyone's
allocator. Named variants are supplied by whoever holds them (the fuzz package's
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


def resolve(spec: str = "impl", variants: Mapping[str, Target] | None = None) -> Target:
    if spec == "impl":
        return _bundled
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
    known = ", ".join(["impl", *sorted(variants or ())])
    raise TargetError(f"unknown target {spec!r}; use one of {known}, or module:callable")
