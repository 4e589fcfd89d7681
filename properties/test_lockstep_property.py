"""The lockstep property (SPEC 4) against the chosen target, as an installed test module:

    pytest --pyargs properties.test_lockstep_property --target module:callable [--device cuda]

runs from any directory where swa-lockstep is installed (its pytest plugin,
properties/pytest_plugin.py, adds --target and --device). The project's own suite
(tests/test_lockstep.py) runs this same test.
"""

from hypothesis.stateful import run_state_machine_as_test

from properties.machine import machine_for


def _resolve(spec: str):
    # The fuzz package's seeded-bug variants by name where it is installed with us.
    try:
        from fuzz.campaign import resolve
    except ImportError:
        from properties.targets import resolve
    return resolve(spec)


def test_lockstep(target_spec, device):
    """The target keeps every invariant of SPEC 3.3 under the workload."""
    run_state_machine_as_test(machine_for(_resolve(target_spec), device))
