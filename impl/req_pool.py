"""A minimal request-slot pool: one slot per live request.

Ring mode counts SWA capacity in free request slots, and a harness acting as
the scheduler takes and returns slots through this pool.
"""

from __future__ import annotations

from typing import Optional

import torch


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, device="cpu"):
        if size < 0 or max_context_len < 0:
            raise ValueError(
                f"ReqToTokenPool: size={size} and max_context_len={max_context_len} "
                "must be non-negative"
            )
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self._req_to_token: Optional[torch.Tensor] = None
        self.clear()

    @property
    def req_to_token(self) -> torch.Tensor:
        # Built on first use: size x max_context_len can be large, and ring
        # accounting alone never reads it.
        if self._req_to_token is None:
            self._req_to_token = torch.zeros(
                (self.size, self.max_context_len), dtype=torch.int32, device=self.device
            )
        return self._req_to_token

    def clear(self) -> None:
        # Lowest slot first, so slot numbers are deterministic.
        self._free_slots = list(range(self.size - 1, -1, -1))
        self._in_use: set[int] = set()

    def available_size(self) -> int:
        return len(self._free_slots)

    def alloc(self) -> Optional[int]:
        """One free request slot, or None when all are taken."""
        if not self._free_slots:
            return None
        slot = self._free_slots.pop()
        self._in_use.add(slot)
        return slot

    def free(self, slot) -> None:
        slots = [int(s) for s in slot] if isinstance(slot, (list, tuple)) else [int(slot)]
        if len(set(slots)) != len(slots):
            raise ValueError(f"ReqToTokenPool.free: slots {slots} repeat a slot")
        for s in slots:
            if s not in self._in_use:
                raise ValueError(
                    f"ReqToTokenPool.free: slot {s} is not in use; free only a "
                    "slot that alloc() returned, once"
                )
        for s in slots:
            self._in_use.remove(s)
            self._free_slots.append(s)
