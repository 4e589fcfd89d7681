"""The project's hypothesis profiles (SPEC 4.3, 4.4), registered on import.

Profiles: `fast` (local default), `ci` (deterministic, bounded; CI=true selects it),
`nightly` (long soak), `crosshair` (the crosshair backend, only where the `test` extra
installed it), `mutation` (bench/mutation.py). They live here, not in conftest.py, so a
process that pytest did not start (a spawned search worker, a benchmark) gets the same
profiles: hypothesis ships a built-in profile also called `ci`, which would otherwise
answer silently with other settings.
"""

import os

from hypothesis import HealthCheck, Phase, settings

_common = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    stateful_step_count=40,
    # One failure, shrunk, per run: the harness reports the first invariant it saw.
    report_multiple_bugs=False,
)
settings.register_profile("fast", max_examples=60, **_common)
# No database: a derandomized search draws the same examples every run, and replayed
# entries from earlier local runs would make one run's reach differ from another's.
settings.register_profile("ci", max_examples=2000, derandomize=True, print_blob=True, database=None, **_common)
settings.register_profile("nightly", max_examples=6000, **{**_common, "stateful_step_count": 60})
try:
    import hypothesis_crosshair_provider  # noqa: F401  (the `test` extra installs it)
except ImportError:
    # A plain install has no crosshair backend: the profile is left out, and asking
    # for it says why (hypothesis names the profiles it knows).
    pass
else:
    settings.register_profile("crosshair", backend="crosshair", max_examples=20, **{**_common, "stateful_step_count": 10})
# ci's derandomized search on a smaller budget, without shrinking (a mutant is killed
# by any failure) and without a database.
settings.register_profile(
    "mutation",
    max_examples=int(os.environ.get("SWA_LOCKSTEP_MUTATION_EXAMPLES", "100")),
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    **_common,
)


def default_profile() -> str:
    """The profile a run loads when none is named: `ci` under CI=true, else
    $HYPOTHESIS_PROFILE, else `fast`."""
    return "ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "fast")
