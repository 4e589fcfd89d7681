"""The built-in `sglang` target: the installed sglang's own allocators on CPU (SPEC 4.3, 4.7).

`make(config)` builds sglang's `SWATokenToKVPoolAllocator` (kind "hybrid") or
`PureSWATokenToKVPoolAllocator` (kind "pure_swa") over sglang's own `SWAKVPool` of two
`MHATokenToKVPool`s (one layer each, one head of width 1, float64 so the harness's
integer tags survive a round trip). Nothing of sglang is re-implemented here.

sglang imports modules that cannot load on a machine without a GPU stack. Where one of
`STAND_IN_MODULES` is not installed, a stand-in is importable while sglang's modules
load and is removed again afterwards: kernel definitions (`@triton.jit`) and type
references become inert names. An installed module is always used
as it is. The paged layouts then run where sglang's own code sends them on this
platform: its torch path (`alloc_extend_naive`, `alloc_decode_naive`) when the
platform does not support Triton, its Triton kernels when it does; `layout_path`
says which.

Levels: `check_level` sets `SGLANG_INVARIANT_CHECK` (0 off, 1 warn, 2 strict), which
sglang reads on every check, so it is process-wide: the last allocator built sets it.
`debug_memory_pool` (a config key, default off) sets `SGLANG_DEBUG_MEMORY_POOL`, which
sglang's paged allocators read when they are built.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

# Absent on a CPU-only machine and not loadable without a GPU stack; sglang imports
# them at module level on the allocator's import path.
STAND_IN_MODULES = ("triton", "torchvision")

_LEVEL_ENV = {"off": "0", "warn": "1", "strict": "2"}

# SPEC 3.2 breaks that sglang 0.5.23 does not refuse, so the harness must not send them
# (SPEC 4.7). Measured, not assumed: `resize` past the construction size returns
# normally on the pure-SWA allocator (its free list simply grows past the KV buffers and
# the mapping) and fails inside with an IndexError on the hybrid one. FINDINGS.md lists
# it once.
UNREFUSED_BREAKS = frozenset({"resize_grow"})


class SglangUnavailable(ImportError):
    """sglang, or a module its allocators import, cannot be imported here."""


class _StandIn(types.ModuleType):
    """A module whose every name is an inert stand-in (see `_Inert`)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []
        # transformers reads the version of any torchvision it finds; a parseable one
        # that says what this is keeps it from failing on "N/A".
        self.__version__ = "0.0.0+stand.in"

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"{self.__name__}.{name}", name)


class _InertClass(type):
    """Class-like stand-ins (`triton.Config`, `InterpolationMode`): subclassable, and
    their attributes are inert too."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"{cls.__qualname__}.{name}", name)


class _Inert:
    """A stand-in value: as a decorator it returns what it decorates, so a kernel
    definition loads as the plain Python function (launching it, `kernel[grid](...)`,
    then fails); any other call gives another inert value (`tl.constexpr(4)` at
    module level)."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"{self._qualname}.{name}", name)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # @triton.jit
        if not args:
            return lambda fn: fn  # @triton.jit(do_not_specialize=...)
        return _Inert(f"{self._qualname}(...)")


def _inert(qualname: str, name: str):
    if name[:1].isupper():
        return _InertClass(name, (), {"__qualname__": qualname, "__module__": qualname.rpartition(".")[0]})
    return _Inert(qualname)


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: tuple[str, ...]):
        self.roots = roots

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StandIn(spec.name)

    def exec_module(self, module):
        pass


@contextlib.contextmanager
def _stand_ins(roots: tuple[str, ...]):
    """Stand-ins for `roots` while the block runs; sys.modules loses them afterwards,
    so later code in this process sees those packages absent, as they are."""
    if not roots:
        yield
        return
    finder = _StandInFinder(roots)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, _StandIn)]:
            del sys.modules[name]


@functools.lru_cache(maxsize=None)
def load() -> types.SimpleNamespace:
    """Import sglang's allocator and KV pool classes; SglangUnavailable says why not."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        sglang_version = version("sglang")
    except PackageNotFoundError as e:
        raise SglangUnavailable("sglang is not installed (bash scripts/install-sglang installs it for CPU)") from e
    absent = tuple(m for m in STAND_IN_MODULES if importlib.util.find_spec(m) is None)
    if "triton" in absent:
        # torch probes for triton once, when this module is first imported; probing
        # before the stand-in exists keeps torch's answer true (no triton).
        with contextlib.suppress(ImportError):
            importlib.import_module("torch._inductor.runtime.triton_compat")
    try:
        with _stand_ins(absent):
            swa = importlib.import_module("sglang.srt.mem_cache.allocator.swa")
            paged = importlib.import_module("sglang.srt.mem_cache.allocator.paged")
            pools = importlib.import_module("sglang.srt.mem_cache.swa_memory_pool")
            memory_pool = importlib.import_module("sglang.srt.mem_cache.memory_pool")
            invariants = importlib.import_module("sglang.srt.utils.invariants")
    except ImportError as e:
        raise SglangUnavailable(
            f"sglang {sglang_version} is installed but its allocators do not import: {e} "
            "(bash scripts/install-sglang installs what they need)"
        ) from e
    return types.SimpleNamespace(
        version=sglang_version,
        stand_ins=absent,
        SWATokenToKVPoolAllocator=swa.SWATokenToKVPoolAllocator,
        PureSWATokenToKVPoolAllocator=swa.PureSWATokenToKVPoolAllocator,
        PagedTokenToKVPoolAllocator=paged.PagedTokenToKVPoolAllocator,
        SWAKVPool=pools.SWAKVPool,
        MHATokenToKVPool=memory_pool.MHATokenToKVPool,
        invariants=invariants,
    )


def available() -> tuple[bool, str]:
    """(True, version) where sglang's allocators import, else (False, the reason)."""
    try:
        return True, load().version
    except SglangUnavailable as e:
        return False, str(e)


def _hit_counts(invariants) -> dict[str, int]:
    """sglang's warn-level hit counts by invariant name, summed over ranks.

    sglang keeps them in its reporter's on-device counters (its log line is throttled,
    so it cannot be counted); they are read, never written."""
    reporter = getattr(invariants, "_reporter", None)
    counters = getattr(reporter, "_dev", None) or {}
    out: dict[str, int] = {}
    for key, t in counters.items():
        name = key.rpartition("@rank")[0] or key
        out[name] = out.get(name, 0) + int(t.sum())
    return out


@functools.lru_cache(maxsize=None)
def _classes():
    sg = load()

    class Hybrid(sg.SWATokenToKVPoolAllocator):
        """sglang's hybrid allocator, unchanged; adds only `invariant_hits` (a read)."""

        def invariant_hits(self) -> dict[str, int]:
            return _hit_counts(sg.invariants)

    class PureSWA(sg.PureSWATokenToKVPoolAllocator):
        """sglang's pure-SWA allocator, unchanged; adds only `invariant_hits` (a read)."""

        def invariant_hits(self) -> dict[str, int]:
            return _hit_counts(sg.invariants)

    for cls, base in ((Hybrid, sg.SWATokenToKVPoolAllocator), (PureSWA, sg.PureSWATokenToKVPoolAllocator)):
        cls.__name__ = cls.__qualname__ = base.__name__
    return Hybrid, PureSWA


def layout_path(allocator) -> str:
    """Which code computes the paged layouts of this allocator."""
    if allocator.page_size == 1:
        return "sglang token allocator (no paged layout)"
    sub = allocator.full_attn_allocator
    if getattr(sub, "use_triton_kernels", False):
        return "sglang Triton kernels (alloc_extend_kernel, alloc_decode_kernel)"
    return "sglang torch path (alloc_extend_naive, alloc_decode_naive)"


def describe() -> str:
    """One line for a campaign header: version, stand-ins, layout path."""
    ok, what = available()
    if not ok:
        return f"sglang: unavailable ({what})"
    sg = load()
    probe = make({"kind": "hybrid", "size": 8, "size_swa": 8, "page_size": 4, "device": "cpu", "check_level": "off"})
    stand = ", ".join(sg.stand_ins) or "none"
    return f"sglang {sg.version}; stand-ins for absent modules: {stand}; paged layouts: {layout_path(probe)}"


def make(config: dict):
    """A SPEC 4.3 factory over the installed sglang's own classes."""
    sg = load()
    import torch

    kind, ps = config["kind"], config["page_size"]
    device = config.get("device", "cpu")
    if config.get("ring_size") is not None:
        raise NotImplementedError("sglang target: per-request SWA ring mode is not built (it needs sglang's ReqToTokenPool and scheduler)")
    if kind == "pure_swa" and ps != 1:
        raise NotImplementedError("sglang's PureSWATokenToKVPoolAllocator is page_size 1 only")
    level = config.get("check_level") or "off"
    os.environ["SGLANG_INVARIANT_CHECK"] = _LEVEL_ENV[level]
    os.environ["SGLANG_DEBUG_MEMORY_POOL"] = "1" if config.get("debug_memory_pool") else "0"
    size = config["size"]
    size_swa = config.get("size_swa") or size
    Hybrid, PureSWA = _classes()
    if kind == "pure_swa":
        kv = sg.SWAKVPool(
            size=size_swa, size_swa=size_swa, page_size=ps, dtype=torch.float64, head_num=1, head_dim=1,
            swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device=device,
        )
        return PureSWA(size_swa, ps, torch.int64, device, kv, bool(config.get("need_sort")))
    kv = sg.SWAKVPool(
        size=size, size_swa=size_swa, page_size=ps, dtype=torch.float64, head_num=1, head_dim=1,
        swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device=device,
    )
    return Hybrid(size, size_swa, ps, torch.int64, device, kv, bool(config.get("need_sort")))


make.unrefused_breaks = UNREFUSED_BREAKS
make.describe = describe
