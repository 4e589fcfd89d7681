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


# The bundled impl builds every configuration the workload draws, so a
# NotImplementedError from it is a fault, never a configuration to skip.
_bundled.builds_every_configuration = True


def builds_every_configuration(target: Target) -> bool:
    """Whether a target declares it builds every configuration of SPEC 4.3: its
    NotImplementedError is then a failure, not a skip (SPEC 4.3's skip is for
    targets that say what they do not build by raising it)."""
    return bool(getattr(target, "builds_every_configuration", False))


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
