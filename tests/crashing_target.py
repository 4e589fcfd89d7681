"""Test-only targets that kill or break their process, for crash isolation (SPEC 5).

`crash_on_second_admit`: the bundled allocator, except that in worker 0 of a campaign
(or any process when FUZZ_CRASH_ALL=1) the third allocation call on one allocator ends
the process with os._exit(3), as a segfault or a lost CUDA context would. The count is
per allocator, so the saved trace (the crashing example's steps) crashes again on replay.
`raise_on_alloc`: raises RuntimeError from alloc_extend/alloc, as a CUDA device assert does.
"""

import multiprocessing
import os

from impl import make_allocator

def _crashes_here() -> bool:
    if os.environ.get("FUZZ_CRASH_ALL") == "1":
        return True
    return multiprocessing.current_process().name == "fuzz-worker-0"


def crash_on_second_admit(config):
    alloc = make_allocator(config)
    if not _crashes_here():
        return alloc
    cls = type(alloc)

    def wrap(name):
        original = getattr(cls, name)

        def call(self, *args, **kwargs):
            self._alloc_calls = getattr(self, "_alloc_calls", 0) + 1
            if self._alloc_calls >= 3:
                os._exit(3)
            return original(self, *args, **kwargs)

        return call

    alloc.__class__ = type(cls.__name__, (cls,), {n: wrap(n) for n in ("alloc", "alloc_extend", "alloc_decode")})
    return alloc


def raise_on_alloc(config):
    alloc = make_allocator(config)
    cls = type(alloc)

    def boom(self, *args, **kwargs):
        raise RuntimeError("CUDA error: device-side assert triggered")

    alloc.__class__ = type(cls.__name__, (cls,), {"alloc": boom, "alloc_extend": boom, "alloc_decode": boom})
    return alloc
