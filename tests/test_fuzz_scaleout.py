"""The lockstep properties as a plain pytest test class, so HypoFuzz (`hypothesis fuzz`)
can collect and fuzz them across processes and machines with a shared database.
`--target` / `--device` are not read here: HypoFuzz runs the bundled impl on CPU."""

from properties.machine import machine_for

TestLockstep = machine_for().TestCase
