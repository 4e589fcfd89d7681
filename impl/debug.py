"""The memory-pool debug switch, read as sglang reads ``SGLANG_DEBUG_MEMORY_POOL``.

sglang's paged allocator reads the variable once, when it is built, through its
boolean environment helper: ``true`` or ``1`` (any case) turns debug mode on;
unset, ``false`` or ``0`` leave it off; any other value is off too, with one
warning per process. The allocators here read ``debug_memory_pool()`` at
construction in the same way, and an override (``set_debug_memory_pool`` /
``override_debug_memory_pool``) takes precedence so tests need not touch the
environment.

Debug mode adds host-side checks that cost a device sync or an O(pool) scan
(a page freed twice, page 0, a dead SWA representative, ...); they raise
``AssertionError``, as sglang's do. Off, none of them runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator, Optional

ENV_VAR = "SGLANG_DEBUG_MEMORY_POOL"

_ON = ("true", "1")
_OFF = ("false", "0")

logger = logging.getLogger(__name__)

_override: Optional[bool] = None
_warned = False


def debug_memory_pool() -> bool:
    """The override if one is set, else the environment variable (default off)."""
    global _warned
    if _override is not None:
        return _override
    value = os.environ.get(ENV_VAR, "false").lower()
    if value not in _ON and value not in _OFF and not _warned:
        _warned = True
        logger.warning("%s=%r is not one of true/1/false/0; debug mode stays off", ENV_VAR, value)
    return value in _ON


def set_debug_memory_pool(value: Optional[bool]) -> None:
    """Override the environment for allocators built from now on; None drops it."""
    global _override
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"set_debug_memory_pool: expected a bool or None, got {value!r}")
    _override = value


@contextlib.contextmanager
def override_debug_memory_pool(value: bool) -> Iterator[None]:
    """Allocators built inside the block see ``value``; the old override comes back after."""
    saved = _override
    set_debug_memory_pool(value)
    try:
        yield
    finally:
        set_debug_memory_pool(saved)
