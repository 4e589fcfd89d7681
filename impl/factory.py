"""Build an allocator from a plain configuration dict (the harness's target API)."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from impl import invariants
from impl.backend import BACKEND_NAMES
from impl.kv_pool import SWAKVPool
from impl.paged import LAYOUTS
from impl.req_pool import ReqToTokenPool
from impl.swa import PureSWATokenToKVPoolAllocator, SWATokenToKVPoolAllocator

KINDS = ("hybrid", "pure_swa")
LEVELS = ("off", "warn", "strict")
_REQUIRED = ("kind", "size", "page_size")
_DEFAULTS: dict[str, Any] = {
    "size_swa": None,  # None: same as size
    "device": "cpu",
    "need_sort": False,
    "ring_size": None,
    "req_slots": None,
    "check_level": None,  # None: leave the current level alone
    "backend": "auto",
    # sglang's SGLANG_DEBUG_MEMORY_POOL checks (impl.debug); the config decides,
    # not the environment, so that one configuration always means one behaviour.
    "debug_memory_pool": False,
    "layout": "torch",  # the paged layouts' implementation: torch or triton kernels
}
KEYS = _REQUIRED + tuple(_DEFAULTS)


def _bad(key: str, value, want: str) -> ValueError:
    return ValueError(f"config[{key!r}]={value!r} is invalid: expected {want}")


def _int(cfg, key: str, minimum: int) -> int:
    value = cfg[key]
    # bool is an int subclass; True as a size is a caller mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(key, value, f"an int >= {minimum}")
    return value


def _validate(config: dict) -> dict:
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise ValueError(f"config has unknown key(s) {unknown}; known keys: {list(KEYS)}")
    for key in _REQUIRED:
        if key not in config:
            raise ValueError(f"config lacks required key {key!r}")
    cfg = {**_DEFAULTS, **config}

    if cfg["kind"] not in KINDS:
        raise _bad("kind", cfg["kind"], f"one of {KINDS}")
    _int(cfg, "size", 1)
    _int(cfg, "page_size", 1)
    if cfg["size_swa"] is None:
        cfg["size_swa"] = cfg["size"]
    _int(cfg, "size_swa", 1)
    for key in ("need_sort", "debug_memory_pool"):
        if not isinstance(cfg[key], bool):
            raise _bad(key, cfg[key], "a bool")
    if cfg["ring_size"] is not None:
        _int(cfg, "ring_size", 1)
        if cfg["req_slots"] is None:
            raise ValueError("config lacks 'req_slots', required when 'ring_size' is set")
    if cfg["req_slots"] is not None:
        _int(cfg, "req_slots", 1)
    if cfg["check_level"] is not None and cfg["check_level"] not in LEVELS:
        raise _bad("check_level", cfg["check_level"], f"one of {LEVELS}")
    if cfg["layout"] not in LAYOUTS:
        raise _bad("layout", cfg["layout"], f"one of {LAYOUTS}")
    if cfg["backend"] not in BACKEND_NAMES:
        raise _bad("backend", cfg["backend"], f"one of {BACKEND_NAMES}")
    try:
        torch.device(cfg["device"])
    except (RuntimeError, TypeError, ValueError) as exc:
        raise _bad("device", cfg["device"], "a torch device string such as 'cpu'") from exc
    return cfg


def _require_triton(device) -> None:
    if importlib.util.find_spec("triton") is None:
        raise NotImplementedError(
            "layout 'triton' needs the triton package, which is not installed; "
            "install the extra: pip install -e '.[triton]'"
        )
    from impl import triton_layout

    if not triton_layout.runs_on(device):
        raise NotImplementedError(
            f"layout 'triton' cannot run on device {device!r} in this process: kernels "
            "compile for CUDA only; to run them on CPU under triton's interpreter, set "
            "TRITON_INTERPRET=1 before anything imports triton"
        )


def make_allocator(config: dict):
    """An allocator with sglang's API for ``config`` (keys: see ``KEYS``).

    ValueError names a bad or unknown key; NotImplementedError means a valid
    configuration this implementation does not build.
    """
    cfg = _validate(config)
    kind, page_size, device = cfg["kind"], cfg["page_size"], cfg["device"]

    if kind == "pure_swa":
        if page_size != 1:
            raise NotImplementedError("pure_swa supports page_size 1 only")
        if cfg["ring_size"] is not None:
            raise NotImplementedError("pure_swa has no per-request SWA ring")
    if cfg["ring_size"] is not None and page_size == 1:
        raise NotImplementedError("a per-request SWA ring needs page_size > 1")

    dev_type = torch.device(device).type
    if dev_type == "cuda" and not torch.cuda.is_available():
        raise NotImplementedError("device 'cuda' requested but CUDA is not available here")
    if dev_type == "npu" or cfg["backend"] == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError as exc:
            raise NotImplementedError(
                "an NPU device or backend needs torch_npu, which is not installed; "
                "backend 'npu_emulated' runs the NPU branch elsewhere"
            ) from exc

    if cfg["layout"] == "triton":
        _require_triton(device)

    if cfg["check_level"] is not None:
        invariants.set_level(cfg["check_level"])

    allocator = _build(cfg)
    allocator.debug_mode = cfg["debug_memory_pool"]
    return allocator


def _build(cfg: dict):
    kind, page_size, device = cfg["kind"], cfg["page_size"], cfg["device"]
    dtype = torch.int64
    if kind == "pure_swa":
        size = cfg["size_swa"]
        kvcache = SWAKVPool(size, size, page_size, device)
        return PureSWATokenToKVPoolAllocator(
            size, page_size, dtype, device, kvcache, cfg["need_sort"], backend=cfg["backend"]
        )

    req_pool = None
    if cfg["ring_size"] is not None:
        req_pool = ReqToTokenPool(cfg["req_slots"], cfg["size"] + page_size, device)
    kvcache = SWAKVPool(
        cfg["size"], cfg["size_swa"], page_size, device, swa_req_ring_size=cfg["ring_size"]
    )
    return SWATokenToKVPoolAllocator(
        cfg["size"],
        cfg["size_swa"],
        page_size,
        dtype,
        device,
        kvcache,
        cfg["need_sort"],
        req_to_token_pool=req_pool,
        backend=cfg["backend"],
        layout=cfg["layout"],
    )


# The harness's target protocol calls the factory ``make``.
make = make_allocator
