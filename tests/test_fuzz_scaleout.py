"""The lockstep properties as a plain pytest test class, so HypoFuzz (`hypothesis fuzz`)
can collect and fuzz them across processes and machines with a shared database.
`--target` / `--device` are not read here: HypoFuzz runs the bundled impl on CPU.

Under plain pytest it runs a short search only: tests/test_lockstep.py runs the same
machine on the profile's whole budget, and HypoFuzz ignores example budgets."""

from hypothesis import settings

from properties.machine import machine_for

TestLockstep = machine_for().TestCase
TestLockstep.settings = settings(TestLockstep.settings, max_examples=20)
