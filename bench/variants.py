"""Per seeded-bug variant: time to the first failure and the shrunk counterexample (SPEC 6).

One run, fixed seed (hypothesis derandomized, the CI profile's budget): for each
variant the lockstep machine searches until its first failure, then hypothesis
shrinks it. Printed: the seconds to the first failure, the invariant it named, the
seconds the whole run took (search and shrink), the shrunk trace's step count and
the invariant the shrunk failure names.

    CI=true .venv/bin/python -m bench.variants [NAME ...]
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("CI", "true")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import conftest  # noqa: E402,F401  (registers and loads the hypothesis profiles)
from hypothesis import settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from fuzz.variants import EXPECTED, VARIANTS  # noqa: E402
from impl import invariants  # noqa: E402
from properties.lockstep import LockstepFailure  # noqa: E402
from properties.machine import machine_for  # noqa: E402


def measure(name: str) -> dict:
    invariants.set_level(None)
    invariants.reset_hits()
    base = machine_for(VARIANTS[name])
    first: dict = {}
    start = time.perf_counter()

    class Timed(base):  # records the first failure the search meets
        def _go(self, step):
            try:
                super()._go(step)
            except LockstepFailure as e:
                first.setdefault("t", time.perf_counter() - start)
                first.setdefault("inv", e.invariant)
                raise

    row = {"name": name, "expected": EXPECTED.get(name, "?")}
    try:
        run_state_machine_as_test(Timed, settings=settings(database=None, derandomize=True))
    except LockstepFailure as e:
        row.update(shrunk_steps=len(e.steps or ()), shrunk_inv=e.invariant)
    except Exception as e:  # a variant that breaks the driver itself is a finding too
        row.update(shrunk_steps=None, shrunk_inv=f"{type(e).__name__}")
    if "t" not in first and "shrunk_inv" in row:
        # Wrong from construction: the failure came out of the machine's init, not a step.
        first.update(t=None, inv=f"{row['shrunk_inv']} (at init)")
    row.update(total=time.perf_counter() - start, first=first.get("t"), first_inv=first.get("inv"))
    return row


def main(argv: list[str]) -> int:
    names = argv or list(VARIANTS)
    print(f"{'variant':28} {'first s':>8} {'first invariant':26} {'total s':>8} {'steps':>5}  shrunk invariant")
    for name in names:
        r = measure(name)
        first = "-" if r["first"] is None else f"{r['first']:.2f}"
        steps = "-" if r.get("shrunk_steps") is None else str(r["shrunk_steps"])
        print(
            f"{name:28} {first:>8} {str(r['first_inv'] or 'not found'):26} {r['total']:8.1f} {steps:>5}  {r.get('shrunk_inv', '-')}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
