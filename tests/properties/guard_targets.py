"""Targets whose guards react wrongly, one way each: the bundled allocator with one
method overridden. The driver must report each as the guard, the level and the call."""

from __future__ import annotations

from impl import invariants, make_allocator
from impl.swa import SWA_PEER_MAPPED, SWA_PEER_RELEASED, SWATokenToKVPoolAllocator


class ReleasedCrashesAlways(SWATokenToKVPoolAllocator):
    """swa.peer_released crashes at every level, where warn owes a count."""

    def free_full(self, free_index):
        if bool((self.full_to_swa_index_mapping[free_index] != 0).any()):
            raise invariants.InvariantViolation(SWA_PEER_RELEASED.name, "crashes at every level")
        super().free_full(free_index)


class ReleasedEvaluatedAtOff(SWATokenToKVPoolAllocator):
    """swa.peer_released is evaluated (and counted) even at level off."""

    def free_full(self, free_index):
        if invariants.current_level() is invariants.Level.OFF:
            with invariants.override_level("warn"):
                return super().free_full(free_index)
        return super().free_full(free_index)


class ReleasedNeverChecked(SWATokenToKVPoolAllocator):
    """free_full never looks at the peers: silent where warn owes a count."""

    def free_full(self, free_index):
        self.full_attn_allocator.free(free_index)


class ReleasedCountsOnLegalFree(SWATokenToKVPoolAllocator):
    """A legal free counts a swa.peer_released hit at warn (a false alarm)."""

    def free(self, free_index):
        invariants.expect(SWA_PEER_RELEASED, self.full_to_swa_index_mapping[free_index] == 0)
        super().free(free_index)


class MappedCountsAtWarn(SWATokenToKVPoolAllocator):
    """swa.peer_mapped counts at warn (and frees nothing), where FATAL_UNCONTAINABLE
    owes a crash. It keeps its own count, reported through invariant_hits()."""

    mapped_hits = 0

    def free_swa(self, free_index):
        swa = self.full_to_swa_index_mapping[free_index]
        if invariants.current_level() is invariants.Level.WARN and bool((swa <= 0).any()):
            type(self).mapped_hits += int((swa <= 0).sum())
            return
        super().free_swa(free_index)

    def invariant_hits(self):
        hits = super().invariant_hits()
        hits[SWA_PEER_MAPPED.name] += self.mapped_hits
        return hits


class MappedCrashesAtOff(SWATokenToKVPoolAllocator):
    """swa.peer_mapped crashes at level off, where nothing is evaluated."""

    def free_swa(self, free_index):
        if bool((self.full_to_swa_index_mapping[free_index] <= 0).any()):
            raise invariants.InvariantViolation(SWA_PEER_MAPPED.name, "crashes at every level")
        super().free_swa(free_index)


def factory(cls: type):
    """A target: the bundled hybrid allocator with `cls`'s override."""

    def make(config: dict):
        a = make_allocator(config)
        assert type(a) is SWATokenToKVPoolAllocator, "these targets override the hybrid allocator"
        a.__class__ = cls
        return a

    make.__name__ = f"make_{cls.__name__}"
    return make


class SegmentUnguarded(SWATokenToKVPoolAllocator):
    """free_swa_segment never looks for a representative without a peer: at strict it
    goes on and releases SWA page 0 (the padding page) where SPEC 3.2 owes a refusal."""

    def free_swa_segment(self, free_index, *, start_pos):
        with invariants.override_level("off"):
            super().free_swa_segment(free_index, start_pos=start_pos)
