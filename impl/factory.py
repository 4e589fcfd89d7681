"""Build an allocator from a plain configuration dict (the harness's target API)."""

from __future__ import annotations

import importlib.util

import torch

from impl import config as config_schema
from impl import invariants
from impl.kv_pool import SWAKVPool
from impl.req_pool import ReqToTokenPool
from impl.swa import PureSWATokenToKVPoolAllocator, SWATokenToKVPoolAllocator

KINDS, LEVELS, KEYS = config_schema.KINDS, config_schema.LEVELS, config_schema.KEYS


def _validate(config: dict) -> dict:
    cfg = config_schema.validate(config)
    try:
        torch.device(cfg["device"])
    except (RuntimeError, TypeError, ValueError) as exc:
        raise config_schema.ConfigError("device", f"{cfg['device']!r} is not a torch device ({exc})") from None
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

    ``impl.config.ConfigError`` (a ValueError) names a bad or unknown key;
    NotImplementedError means a valid configuration this implementation does not build.
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
            size, page_size, dtype, device, kvcache, cfg["need_sort"], **_asked(cfg, "backend")
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
        **_asked(cfg, "backend", "layout"),
    )


def _asked(cfg: dict, *keys: str) -> dict:
    """The keyword arguments a configuration sets away from their defaults. The others
    are left to the constructor's own defaults, as sglang's callers leave them (its
    constructors have no such arguments), so those defaults are what every run that
    asks nothing special builds with."""
    return {k: cfg[k] for k in keys if cfg[k] != config_schema.DEFAULTS[k]}


# The harness's target protocol calls the factory ``make``.
make = make_allocator
