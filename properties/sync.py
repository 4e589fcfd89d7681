"""Sync-freedom of the paths the seed keeps off the host (SPEC 2.5, 2.9).

On CUDA a host read of a device tensor (``.item()``, ``.tolist()``, a tensor's truth
value) or an op whose output size depends on the data (``nonzero``, ``unique``,
boolean-mask indexing) stalls the scheduler until the stream drains. The seed keeps
``free``, ``free_swa``, ``free_group_end``, ``clear_full_to_swa_mapping``,
``free_segment`` and ``alloc_decode`` (after its page count, which reads the CPU copies
of the lengths) free of both. This module checks any target for that.

How. Each path runs on a small, freshly set-up allocator inside a torch function mode
and a torch dispatch mode that record every such operation, with the function that
issued it. Tensors the caller passes as host copies (``seq_lens_cpu``) and whatever is
computed from them alone are host tensors: reading them costs nothing. On CPU, where
every tensor lives on the host, that lineage is what tells the two apart; on CUDA the
device does, and ``torch.cuda.set_sync_debug_mode`` reports every sync the CUDA runtime
sees: each op that triggers one is recorded like the rest (in "warn" mode, so that a
sync allowed by name below does not abort the path).

Allowed by name. A sync issued from a function listed in ``ALLOWED`` (``Class.method``
and the op) is reported as allowed, not as a finding:

- debug-only checks, which run only with ``debug_mode`` set;
- an invariant's crash check on CPU, which raises at once there and is
  ``torch._assert_async`` on CUDA;
- the paged release's page dedup and the SWA release's filter. A paged free must know
  how many distinct pages it returns, and the SWA release which pages are unpaired,
  for the free list's length is a host number; the seed has the same two syncs (its
  ``_release_swa`` says "one filter per group, not per call"). They are listed so the
  report shows them and so that any other sync in the same paths is a finding.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that read a tensor's value back to the host.
HOST_READS = frozenset({"_local_scalar_dense", "is_nonzero", "item", "equal"})
# aten ops whose output size depends on the data.
DATA_SHAPES = frozenset({
    "nonzero", "argwhere", "masked_select", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "unique_dim_consecutive",
})
# Tensor methods that read values without an aten op on CPU.
HOST_READ_METHODS = frozenset({"tolist", "numpy"})

# Function (``Class.method``) -> the ops it may issue, with the reason.
ALLOWED: dict[str, tuple[frozenset[str], str]] = {
    "PagedTokenToKVPoolAllocator.free": (
        frozenset({"_unique2"}), "page dedup: the free list's length is a host number"),
    "SWATokenToKVPoolAllocator.free": (
        frozenset({"_unique2"}), "page dedup, once for both halves (it stands for the full pool's own)"),
    "PagedTokenToKVPoolAllocator.free_group_end": (
        frozenset({"_unique2"}), "page dedup of the held frees, as free does at once"),
    "SWATokenToKVPoolAllocator._release_swa": (
        frozenset({"index", "_unique2"}), "drops unpaired SWA slots and pages still paired, each page looked at once"),
    # The CPU spelling of a device assert: on CUDA it is torch._assert_async, no sync.
    "_crash": (frozenset({"_local_scalar_dense"}), "an invariant's crash check on CPU (torch._assert_async on CUDA)"),
    "BaseTokenToKVPoolAllocator._debug_check_release": (
        frozenset({"*"}), "debug_mode only"),
    "SWATokenToKVPoolAllocator._expand_to_full_pages": (
        frozenset({"_unique2", "equal", "_local_scalar_dense"}), "debug_mode only"),
}

_TORCH_DIR = torch.__file__.rsplit("/", 1)[0]


@dataclass(frozen=True)
class SyncEvent:
    path: str  # e.g. "free (hybrid, page size 4)"
    op: str  # e.g. "_local_scalar_dense (host read)"
    where: str  # "Class.method (file:line)" of the issuing code
    allowed: str | None = None  # the reason, when ALLOWED names it


@dataclass
class SyncReport:
    target: str
    device: str
    findings: list[SyncEvent] = field(default_factory=list)
    allowed: list[SyncEvent] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def lines(self) -> list[str]:
        out = [f"sync check of {self.target} on {self.device}: {len(self.checked)} paths checked, "
               f"{len(self.findings)} finding(s)"]
        out += [f"  SYNC     {e.path}: {e.op} in {e.where}" for e in self.findings]
        seen = set()
        for e in self.allowed:
            key = (e.op, e.where.split(" (")[0], e.allowed)
            if key not in seen:
                seen.add(key)
                out.append(f"  allowed  {e.op} in {key[1]}: {e.allowed}")
        out += [f"  skipped  {s}" for s in self.skipped]
        return out

    def to_json(self) -> dict:
        return {
            "target": self.target, "device": self.device, "ok": self.ok, "checked": self.checked,
            "skipped": self.skipped,
            "findings": [e.__dict__ for e in self.findings],
            "allowed": sorted({f"{e.op} in {e.where.split(' (')[0]}" for e in self.allowed}),
        }


def _issuer() -> tuple[str, str]:
    """The innermost frame outside torch and this module: (Class.method, file:line)."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_TORCH_DIR) and fn != __file__:
            return f.f_code.co_qualname, f"{fn.rsplit('/', 1)[-1]}:{f.f_lineno}"
        f = f.f_back
    return "?", "?"


class _Watch(TorchDispatchMode):
    """Records host reads and data-dependent shapes of non-host tensors."""

    def __init__(self, on_host_device: bool):
        super().__init__()
        # On CPU every tensor is on the host: lineage from the declared host copies
        # decides. On an accelerator, the device does.
        self.on_host_device = on_host_device
        self.cuda = not on_host_device and torch.cuda.is_available()
        self._host: dict[int, weakref.ref] = {}
        self.path = ""
        self.events: list[SyncEvent] = []

    def mark_host(self, t) -> None:
        if isinstance(t, torch.Tensor):
            self._host[id(t)] = weakref.ref(t)

    def is_host(self, t: torch.Tensor) -> bool:
        if not self.on_host_device:
            return t.device.type == "cpu"
        ref = self._host.get(id(t))
        return ref is not None and ref() is t

    def record(self, op: str) -> None:
        qualname, line = _issuer()
        ops_reason = ALLOWED.get(qualname)
        allowed = None
        if ops_reason is not None and ("*" in ops_reason[0] or op.split(" (")[0] in ops_reason[0]):
            allowed = ops_reason[1]
        self.events.append(SyncEvent(self.path, op, f"{qualname} ({line})", allowed))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        tensors = [a for a in _flat(args, kwargs) if isinstance(a, torch.Tensor)]
        device_inputs = [t for t in tensors if not self.is_host(t)]
        before = len(self.events)
        if device_inputs:
            if name in HOST_READS:
                self.record(f"{name} (host read)")
            elif name in DATA_SHAPES:
                self.record(f"{name} (data-dependent shape)")
            elif name in ("index", "index_put", "index_put_", "_index_put_impl_") and _bool_index(args):
                self.record("index (boolean mask)")
            elif name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3:
                self.record("repeat_interleave without output_size (data-dependent shape)")
            elif name in ("_to_copy", "copy_") and _to_host(func, args, kwargs):
                self.record(f"{name} to the host")
        if not self.cuda:
            out = func(*args, **kwargs)
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = func(*args, **kwargs)
            synced = [w for w in caught if "synchroniz" in str(w.message)]
            if synced and len(self.events) == before:
                self.record(f"{name} (CUDA sync: {str(synced[0].message).splitlines()[0][:80]})")
            for w in caught:
                if w not in synced:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if self.on_host_device and tensors and not device_inputs:
            for o in _flat((out,), {}):
                self.mark_host(o)
        return out


class _MethodWatch(TorchFunctionMode):
    """Tensor methods that read values without dispatching an op (``tolist``)."""

    def __init__(self, watch: _Watch):
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READ_METHODS and args and isinstance(args[0], torch.Tensor) and not self.watch.is_host(args[0]):
            self.watch.record(f"{name} (host read)")
        return func(*args, **(kwargs or {}))


def _flat(args, kwargs) -> Iterator:
    stack = [*args, *kwargs.values()]
    while stack:
        a = stack.pop()
        if isinstance(a, (list, tuple)):
            stack.extend(a)
        else:
            yield a


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _to_host(func, args, kwargs) -> bool:
    if func.overloadpacket.__name__ == "copy_":
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    dev = kwargs.get("device")
    return dev is not None and torch.device(dev).type == "cpu" and args[0].device.type != "cpu"


@contextlib.contextmanager
def _cuda_sync_warnings(device: str):
    if torch.device(device).type != "cuda":
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


# ------------------------------------------------------------------ the paths


def _t(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


class _Scene:
    """A small allocator with requests in flight, set up outside the watch."""

    def __init__(self, target, config: dict):
        self.alloc = target(config)
        self.ps = config["page_size"]
        self.device = config["device"]
        self.rows: list[torch.Tensor] = []
        if self.ps == 1:
            for n in (6, 5, 3):
                self.rows.append(self.alloc.alloc(n))
        else:
            lens = [2 * self.ps + 1, self.ps + 2, self.ps]
            got = self.alloc.alloc_extend(*self.extend_args(lens))
            start = 0
            for n in lens:
                self.rows.append(got[start:start + n])
                start += n
        if any(r is None for r in self.rows):
            raise RuntimeError("setup: the allocator refused the first requests of an empty pool")

    def extend_args(self, lens):
        d = self.device
        n = len(lens)
        return (_t([0] * n, d), torch.zeros(n, dtype=torch.int64), _t(lens, d), torch.tensor(lens),
                _t([-1] * n, d), sum(lens))

    def decode_args(self):
        """One more token for each request: the first opens no page, the last opens one."""
        lens = [len(r) + 1 for r in self.rows]
        last = torch.stack([r[-1] for r in self.rows])
        return _t(lens, self.device), torch.tensor(lens), last


# name -> (runs on page size 1, call(scene, watch)); the call marks host copies.
def _free(s, w):
    s.alloc.free(s.rows[0])


def _free_swa(s, w):
    s.alloc.free_swa(s.rows[0][: max(1, s.ps)])


def _clear(s, w):
    s.alloc.clear_full_to_swa_mapping(s.rows[1])


def _free_segment(s, w):
    s.alloc.free_segment(s.rows[0][s.ps:], start_pos=s.ps)


def _free_group_end(s, w):
    s.alloc.free_group_end()


def _group_setup(s):
    s.alloc.free_group_begin()
    s.alloc.free(s.rows[0])
    s.alloc.free_segment(s.rows[1][s.ps:], start_pos=s.ps)
    s.alloc.free_swa(s.rows[2][:1])


def _alloc_decode(s, w):
    seq, seq_cpu, last = s.decode_args()
    w.mark_host(seq_cpu)
    if s.alloc.alloc_decode(seq, seq_cpu, last) is None:
        raise RuntimeError("alloc_decode returned None on a pool with room")


PATHS: dict[str, tuple[bool, Callable | None, Callable]] = {
    "free": (True, None, _free),
    "free_swa": (True, None, _free_swa),
    "clear_full_to_swa_mapping": (True, None, _clear),
    "free_segment": (True, None, _free_segment),
    "free_group_end": (True, _group_setup, _free_group_end),
    "alloc_decode": (False, None, _alloc_decode),
}

CONFIGS = (
    {"kind": "hybrid", "size": 64, "size_swa": 64, "page_size": 1},
    {"kind": "hybrid", "size": 64, "size_swa": 64, "page_size": 4},
    {"kind": "hybrid", "size": 64, "size_swa": 64, "page_size": 4, "need_sort": True},
)


def _label(config: dict) -> str:
    extra = ", need_sort" if config.get("need_sort") else ""
    return f"{config['kind']}, page size {config['page_size']}{extra}"


def check(target, target_name: str = "target", device: str = "cpu", configs=CONFIGS, extra: dict | None = None) -> SyncReport:
    """Run every path of ``PATHS`` on ``target`` under the watch; the report names
    each sync, the path and the issuing function. Invariants run at ``warn``: hits are
    counted on the device (at strict on CPU a guard is a host read by design)."""
    report = SyncReport(target_name, device)
    on_cuda = torch.device(device).type == "cuda"
    for base in configs:
        config = {**base, "device": device, "check_level": "warn", **(extra or {})}
        for name, (on_ps1, setup, call) in PATHS.items():
            path = f"{name} ({_label(config)})"
            if config["page_size"] == 1 and not on_ps1:
                continue
            try:
                scene = _Scene(target, config)
            except NotImplementedError as e:
                report.skipped.append(f"{path}: the target does not build it ({e})")
                continue
            if setup is not None:
                setup(scene)
            if on_cuda:
                torch.cuda.synchronize()
            watch = _Watch(on_host_device=not on_cuda)
            watch.path = path
            with _cuda_sync_warnings(device), watch, _MethodWatch(watch):
                call(scene, watch)
            report.checked.append(path)
            for e in watch.events:
                (report.allowed if e.allowed else report.findings).append(e)
    return report
