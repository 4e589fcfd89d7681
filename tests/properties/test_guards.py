"""Every guard's reaction is checked on every call, at every level (SPEC 2.1, 3.3).

Each target in guard_targets reacts wrongly in one way; the driver must fail the
trace naming the guard, the level and the call, while the bundled allocator passes
the same trace.
"""

import pytest

from properties.lockstep import LockstepFailure, replay
from properties.steps import Admit, Break, Evict, Finish
from properties.targets import resolve
from tests.properties import guard_targets as gt

BASE = {"kind": "hybrid", "size": 32, "size_swa": 32, "page_size": 1}
RELEASED_BREAK = [Admit(((0, 3),)), Break("free_full_paired", 0)]
MAPPED_BREAK = [Admit(((0, 3),)), Evict(0, 0, 1), Break("free_unpaired", 0)]
LEGAL_FREE = [Admit(((0, 3),)), Finish(0, "free")]
# free_swa_segment from a page whose first position's window was evicted.
SEGMENT_BREAK = [Admit(((0, 8),)), Evict(0, 0, 4), Break("segment_unpaired", 0)]

CASES = [
    # (target class, level, steps, guard, what the failure must say)
    (gt.ReleasedCrashesAlways, "warn", RELEASED_BREAK, "swa.peer_released", "crashed at level warn"),
    (gt.ReleasedCrashesAlways, "off", RELEASED_BREAK, "swa.peer_released", "crashed at level off"),
    (gt.ReleasedEvaluatedAtOff, "off", RELEASED_BREAK, "swa.peer_released", "not even evaluated"),
    (gt.ReleasedNeverChecked, "warn", RELEASED_BREAK, "swa.peer_released", "stayed silent at level warn"),
    (gt.ReleasedNeverChecked, "strict", RELEASED_BREAK, "swa.peer_released", "stayed silent at level strict"),
    (gt.ReleasedCountsOnLegalFree, "warn", LEGAL_FREE, "swa.peer_released", "on the legal call free"),
    (gt.MappedCountsAtWarn, "warn", MAPPED_BREAK, "swa.peer_mapped", "counted 1 hits at level warn"),
    (gt.MappedCrashesAtOff, "off", MAPPED_BREAK, "swa.peer_mapped", "crashed at level off"),
]


@pytest.mark.parametrize("cls, level, steps, guard, said", CASES, ids=[f"{c[0].__name__}-{c[1]}" for c in CASES])
def test_wrong_guard_reaction_is_found(cls, level, steps, guard, said):
    config = {**BASE, "check_level": level}
    replay(config, steps, resolve("impl"))  # the bundled allocator reacts as owed
    with pytest.raises(LockstepFailure) as info:
        replay(config, steps, gt.factory(cls))
    f = info.value
    assert f.invariant == guard, str(f)
    assert said in str(f), str(f)
    assert f"level {level}" in str(f) and f.index == len(steps) - 1, str(f)


@pytest.mark.parametrize("level", ["strict", "warn", "off"])
def test_overridden_targets_are_right_where_their_reaction_is_owed(level):
    """Each wrong target is wrong only where the cases say: elsewhere it passes, so the
    failures above come from the reaction, not from the override itself."""
    right = {
        (gt.ReleasedCrashesAlways, "strict"): RELEASED_BREAK,
        (gt.ReleasedEvaluatedAtOff, "warn"): RELEASED_BREAK,
        (gt.ReleasedEvaluatedAtOff, "strict"): RELEASED_BREAK,
        (gt.ReleasedCountsOnLegalFree, "off"): LEGAL_FREE,
        (gt.MappedCountsAtWarn, "strict"): MAPPED_BREAK,
        (gt.MappedCrashesAtOff, "warn"): MAPPED_BREAK,
        (gt.MappedCrashesAtOff, "strict"): MAPPED_BREAK,
    }
    for (cls, lvl), steps in right.items():
        if lvl == level:
            replay({**BASE, "check_level": level}, steps, gt.factory(cls))


@pytest.mark.parametrize("ps", [1, 4])
def test_segment_free_of_an_unpaired_representative_is_refused(ps):
    """SPEC 3.2: free_swa_segment over a page whose representative has no SWA peer is
    swa.peer_mapped's to refuse at strict, state unchanged; a target without that guard
    is named for the guard that stayed silent."""
    config = {**BASE, "page_size": ps, "size": 32 * ps, "size_swa": 32 * ps, "check_level": "strict"}
    ls = replay(config, SEGMENT_BREAK, resolve("impl"))
    assert ls.labels["contract refused: swa_segment.unpaired_rep" if ps > 1 else "contract refused: free.unpaired"] == 1
    with pytest.raises(LockstepFailure) as info:
        replay(config, SEGMENT_BREAK, gt.factory(gt.SegmentUnguarded))
    assert info.value.invariant == "swa.peer_mapped", str(info.value)
    assert "stayed silent at level strict on free_swa_segment (segment_unpaired)" in str(info.value)
    assert info.value.index == len(SEGMENT_BREAK) - 1, str(info.value)
