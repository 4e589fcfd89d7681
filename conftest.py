"""Hypothesis profiles and the harness's pytest options (SPEC 4.3, 4.4).

Profiles: `fast` (local default), `ci` (deterministic, bounded; CI=true selects it),
`nightly` (long soak), `crosshair` (the crosshair backend). Pick one with
`--hypothesis-profile=NAME`. `--target` and `--device` choose what the lockstep
properties run against.
"""

import os

import pytest
from hypothesis import HealthCheck, Phase, Verbosity, settings

_common = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    stateful_step_count=40,
    # One failure, shrunk, per run: the harness reports the first invariant it saw.
    report_multiple_bugs=False,
)
settings.register_profile("fast", max_examples=60, **_common)
settings.register_profile("ci", max_examples=2000, derandomize=True, print_blob=True, **_common)
settings.register_profile(
    "nightly",
    max_examples=6000,
    **{**_common, "stateful_step_count": 60},
)
settings.register_profile(
    "crosshair",
    backend="crosshair",
    max_examples=20,
    **{**_common, "stateful_step_count": 10},
)
# The mutation score (bench/mutation.py): ci's derandomized search on a smaller budget,
# without shrinking (a mutant is killed by any failure) and without a database.
settings.register_profile(
    "mutation",
    max_examples=int(os.environ.get("SWA_LOCKSTEP_MUTATION_EXAMPLES", "100")),
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    **_common,
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "fast"))


def pytest_addoption(parser):
    group = parser.getgroup("swa-lockstep")
    group.addoption(
        "--target",
        default="impl",
        help="allocator under test: impl (default), a seeded-bug variant name, or module:callable",
    )
    group.addoption(
        "--device",
        default="cpu",
        help="torch device for the target: cpu (default), cuda, npu",
    )


@pytest.fixture(scope="session")
def target_spec(request):
    return request.config.getoption("--target")


@pytest.fixture(scope="session")
def device(request):
    return request.config.getoption("--device")


def pytest_terminal_summary(terminalreporter):
    from properties.machine import LABELS_SEEN, STATS

    if STATS["steps"]:
        terminalreporter.write_line(
            f"swa-lockstep: {STATS['steps']} workload steps run, {len(LABELS_SEEN)} coverage labels reached"
        )
