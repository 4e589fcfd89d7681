"""The lockstep properties against the chosen target (--target, --device), and coverage."""

from collections import Counter

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


from properties.test_lockstep_property import test_lockstep as _installed_test  # noqa: E402

# What test_lockstep's run reached, when that run was the ci profile's search over the
# bundled impl on CPU: the same derandomized examples the coverage test would draw.
_CI_SEARCH: dict[str, Counter] = {}


def _reach(run) -> tuple[Counter, Counter]:
    """The coverage labels and cells that `run()` reached."""
    labels, shapes = Counter(LABELS_SEEN), Counter(SHAPES_SEEN)
    run()
    return LABELS_SEEN - labels, SHAPES_SEEN - shapes


def _is_the_ci_search(current: settings) -> bool:
    ci = settings.get_profile("ci")
    return current.database is None and all(
        getattr(current, key) == getattr(ci, key)
        for key in ("max_examples", "derandomize", "stateful_step_count", "phases", "suppress_health_check"))


def test_lockstep(target_spec, device):
    """The bundled impl (or --target) keeps every invariant of SPEC 3.3 under the
    workload: the installed test module that `pytest --pyargs
    properties.test_lockstep_property` runs from any directory, run here too."""
    labels, shapes = _reach(lambda: _installed_test(target_spec, device))
    if target_spec == "impl" and device == "cpu" and _is_the_ci_search(settings.default):
        _CI_SEARCH.update(labels=labels, shapes=shapes)


def test_coverage_labels_and_cells_reached():
    """Each coverage label, and each cell of the coverage table (properties/coverage.py:
    method by argument shape), is reached within the deterministic ci profile."""
    if _CI_SEARCH:
        # test_lockstep ran that very search in this session (under CI=true): read it.
        labels, shapes = _CI_SEARCH["labels"], _CI_SEARCH["shapes"]
    else:
        # The claim is about the ci profile, whichever profile this run loaded.
        labels, shapes = _reach(lambda: run_state_machine_as_test(machine_for(resolve("impl")), settings=settings.get_profile("ci")))
    absent = [label for label in REQUIRED_LABELS if not labels[label]]
    assert not absent, f"labels never reached: {absent}; reached: {sorted(labels)}"
    assert not missing(shapes), render(shapes)
