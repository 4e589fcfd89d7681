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
try:
    import hypothesis_crosshair_provider  # noqa: F401  (the `test` extra installs it)
except ImportError:
    # A plain install has no crosshair backend: the profile is left out, and asking
    # for it says why (hypothesis names the profiles it knows).
    pass
else:
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


_VARIANT_REPORT = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def variant_report(request):
    """Lines the variant search adds to the terminal summary (worst examples-to-find)."""
    return request.config.stash.setdefault(_VARIANT_REPORT, [])


@pytest.fixture(scope="session")
def target_spec(request):
    return request.config.getoption("--target")


@pytest.fixture(scope="session")
def device(request):
    return request.config.getoption("--device")


class _StepTally:
    """Counts, over the whole session, the steps every lockstep driver ran and compared."""

    def __init__(self):
        from properties.lockstep import Observer

        self.totals = {"steps_run": 0, "steps_compared": 0, "runs_restarted": 0}
        self._seen: dict[int, dict] = {}
        tally = self

        class _Watch(Observer):
            def started(self, ls):
                tally._seen[id(ls)] = ls.counters()

            def after_step(self, ls, step):
                now, was = ls.counters(), tally._seen.get(id(ls), dict.fromkeys(tally.totals, 0))
                for k in tally.totals:
                    tally.totals[k] += now[k] - was[k]
                tally._seen[id(ls)] = now

        self.observer = _Watch()


_TALLY: list = []


def pytest_configure(config):
    from properties.lockstep import observing

    tally = _StepTally()
    _TALLY.append(tally)
    ctx = observing(tally.observer)
    ctx.__enter__()
    config.add_cleanup(lambda: ctx.__exit__(None, None, None))


def pytest_terminal_summary(terminalreporter, config):
    from properties.machine import LABELS_SEEN

    for line in config.stash.get(_VARIANT_REPORT, []):
        terminalreporter.write_line(f"swa-lockstep variant search: {line}")

    if not _TALLY or not _TALLY[0].totals["steps_run"]:
        return
    t = _TALLY[0].totals
    terminalreporter.write_line(
        f"swa-lockstep: {t['steps_run']} workload steps run, {t['steps_compared']} compared with the model "
        f"({100 * t['steps_compared'] / t['steps_run']:.1f}%), {t['runs_restarted']} runs restarted after a call "
        f"the model cannot follow, {len(LABELS_SEEN)} coverage labels reached"
    )
