"""The lockstep properties against the chosen target (--target, --device), and coverage."""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from properties.coverage import missing, render
from properties.machine import LABELS_SEEN, SHAPES_SEEN, machine_for
from properties.targets import resolve

# The states SPEC 4.4 names, and the other workload corners the generator must reach.
REQUIRED_LABELS = (
    "pool exhausted",
    "window evicted",
    "evicted then re-paired",
    "re-paired from inside an SWA page",
    "re-paired from int32 SWA indices",
    "SWA page kept: another full page still pairs into it",
    "group holding a re-pair",
    "group holding a free",
    "group holding a free_swa",
    "group holding a free_segment",
    "group ended",
    "extend from a prefix inside a page",
    "decode onto a new page",
    "admitted with an SWA tail",
    "admitted with an empty SWA tail",
    "tail dropped",
    "finished by split",
    "finished by free",
    "finished by segments",
    "freed by free_segments",
    "clear inside a group",
    "resized",
    "request slots exhausted",
    "guard count: swa.peer_released",
    "guard silent: swa.peer_released",
    "contract refused: free.unpaired",
    "contract refused: swa_segment.unpaired_rep",
    "contract refused: free_full.paired",
    "contract refused: group.nested",
    "contract refused: segment.unaligned",
    "contract refused: tail.batch",
    "contract refused: tail.length",
    "contract refused: paged.token",
    "contract refused: alloc.paged",
    "contract refused: resize.grow",
    "contract break not sent: double_free (free.double)",
    "contract break not sent: partial_page (free.partial_page)",
    # The scheduler's own moves (SPEC 4.1).
    "prefill: new request",
    "prefill: cache hit",
    "prefill: chunked continuation",
    "prefill: new and continuing requests in one batch",
    "finished into the cache",
    "retracted",
    "retracted a batch",
    "resumed",
    "host copy's request arguments checked",
    "cache evicted by free",
    "cache evicted by free_swa",
    "window evicted by segment",
    "freed by page id",
    "empty call",
)


# The bundled impl (or --target) keeps every invariant of SPEC 3.3 under the workload:
# the installed test module that `pytest --pyargs properties.test_lockstep_property`
# runs from any directory, run here too.
from properties.test_lockstep_property import test_lockstep  # noqa: E402,F401


def test_coverage_labels_and_cells_reached():
    """Each coverage label, and each cell of the coverage table (properties/coverage.py:
    method by argument shape), is reached within the deterministic ci profile."""
    LABELS_SEEN.clear()
    SHAPES_SEEN.clear()
    # The claim is about the ci profile, whichever profile this run loaded.
    run_state_machine_as_test(machine_for(resolve("impl")), settings=settings(settings.get_profile("ci"), database=None))
    absent = [label for label in REQUIRED_LABELS if not LABELS_SEEN[label]]
    assert not absent, f"labels never reached: {absent}; reached: {sorted(LABELS_SEEN)}"
    assert not missing(SHAPES_SEEN), render(SHAPES_SEEN)
