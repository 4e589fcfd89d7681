"""The harness's pytest plugin (SPEC 4.3, 4.4), registered through the `pytest11` entry
point, so any pytest in an environment where swa-lockstep is installed has it.

It adds `--target` (impl, sglang, a seeded-bug variant name, or module:callable for
anyone's allocator) and `--device`, the fixtures `target_spec` and `device`, loads the
project's hypothesis profile (properties/profiles.py; `--hypothesis-profile=NAME` picks
another), and prints how many workload steps the lockstep drivers ran. With it, a user's
own repository runs the lockstep property against its fork of the allocator from any
directory:

    pytest --pyargs properties.test_lockstep_property --target mypkg.alloc:make
"""

import pytest
from hypothesis import settings

from properties.profiles import default_profile

settings.load_profile(default_profile())


def pytest_addoption(parser):
    group = parser.getgroup("swa-lockstep")
    group.addoption(
        "--target",
        default="impl",
        help="allocator under test: impl (default), sglang, a seeded-bug variant name, or module:callable",
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

    if not _TALLY or not _TALLY[-1].totals["steps_run"]:
        return
    t = _TALLY[-1].totals
    terminalreporter.write_line(
        f"swa-lockstep: {t['steps_run']} workload steps run, {t['steps_compared']} compared with the model "
        f"({100 * t['steps_compared'] / t['steps_run']:.1f}%), {t['runs_restarted']} runs restarted after a call "
        f"the model cannot follow, {len(LABELS_SEEN)} coverage labels reached"
    )
