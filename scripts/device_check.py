"""The device checks (run by scripts/device_check on a machine with a CUDA GPU).

1. the lockstep differential, CPU against CUDA (results and state slot for slot);
2. the torch layouts against the Triton kernels, both on CUDA (kernels compiled);
3. the sync check on CUDA, under torch.cuda.set_sync_debug_mode("error"), for both
   layouts, and a planted host read in free that it must catch;
4. the regression corpus replayed on CUDA, each trace in a child process, against the
   bundled allocator and against each entry's variant (a guard at strict is expected
   to kill the process there).

Writes one JSON report and prints its path; exits 1 when a check fails. Each phase has
a time share, so the whole run stays under the budget (default 420 s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The device under test; --device cpu is a dry run of the script itself on a CPU machine.
DEVICE = "cuda"


def _hypothesis_run(machine, examples: int) -> dict:
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    from properties.lockstep import LockstepFailure

    s = settings(
        max_examples=examples, deadline=None, database=None, derandomize=True, stateful_step_count=40,
        suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
    )
    try:
        run_state_machine_as_test(machine, settings=s)
    except LockstepFailure as e:
        return {"ok": False, "examples": examples, "failure": str(e)[:4000]}
    return {"ok": True, "examples": examples}


def check_cpu_against_cuda(examples: int) -> dict:
    from properties.machine import machine_for
    from properties.targets import resolve

    impl = resolve("impl")
    return _hypothesis_run(machine_for(impl, peer=impl, sides=({"device": "cpu"}, {"device": DEVICE})), examples)


def check_torch_against_triton(examples: int) -> dict:
    import random

    import torch

    from impl import paged, triton_layout
    from properties.machine import machine_for
    from properties.targets import resolve
    from tests.triton_targets import paged_triton

    # The kernels alone first, on random batches of CUDA tensors.
    rng = random.Random(14)
    dev = DEVICE
    for case in range(200):
        ps = rng.choice([2, 3, 4, 16, 64])
        n = rng.randint(1, 9)
        pre = [rng.choice([0, rng.randint(0, 300)]) for _ in range(n)]
        seq = [p + rng.randint(0, 300) for p in pre]
        last = [rng.randint(1, 30) * ps + (p - 1) % ps if p else -1 for p in pre]
        need = sum(-(-s // ps) - (-(-p // ps)) for p, s in zip(pre, seq))
        pages = (torch.randperm(4000)[:need] + 1).to(dev)
        args = (torch.tensor(pre, device=dev), torch.tensor(seq, device=dev), torch.tensor(last, device=dev),
                pages, ps, sum(seq) - sum(pre))
        if not torch.equal(triton_layout.extend_layout(*args), paged.extend_layout(*args)):
            return {"ok": False, "failure": f"extend layout differs on case {case}: {args}"}
        mapping = torch.randint(0, 500, (ps * 64 + ps + 1,), device=dev)
        want_mapping = mapping.clone()
        idx = torch.randint(0, ps * 64, (rng.randint(1, 40),), device=dev)
        slots = ((idx // ps * ps)[:, None] + torch.arange(ps, device=dev)).reshape(-1)
        want = want_mapping[slots].clone()
        want_mapping.index_fill_(0, slots, 0)
        got = triton_layout.gather_and_clear_pages(idx, mapping, ps)
        if not (torch.equal(got, want) and torch.equal(mapping, want_mapping)):
            return {"ok": False, "failure": f"gather-and-clear differs on case {case} (ps={ps}, idx={idx.tolist()})"}
    out = _hypothesis_run(
        machine_for(resolve("impl"), peer=paged_triton, sides=({"device": DEVICE, "layout": "torch"}, {"device": DEVICE, "layout": "triton"})),
        examples,
    )
    out["kernel_cases"] = 200
    return out


def check_sync() -> dict:
    from properties import sync
    from properties.targets import resolve
    from tests.sync_targets import bounds_checked_free

    out = {}
    for layout in ("torch", "triton"):
        r = sync.check(resolve("impl"), "impl", DEVICE, extra={"layout": layout})
        out[f"impl, layout {layout}"] = r.to_json()
    planted = sync.check(bounds_checked_free, "bounds_checked_free", DEVICE)
    out["planted host read in free"] = planted.to_json()
    out["ok"] = all(out[f"impl, layout {x}"]["ok"] for x in ("torch", "triton")) and not planted.ok
    return out


def check_corpus() -> dict:
    """`python -m fuzz replay` on CUDA, on the bundled allocator and on each entry's own
    target (its variant). An entry whose own target does not build here (sglang's, where
    sglang is not installed) is left out of the second pass and listed."""
    from fuzz import campaign
    from fuzz import trace as trace_mod
    from properties.targets import TargetError

    files = sorted((ROOT / "fuzz" / "corpus").glob("*.json"))
    own, unresolved = [], []
    for f in files:
        try:
            campaign.resolve(trace_mod.load(f).own_target)
            own.append(str(f))
        except TargetError as e:
            unresolved.append(f"{f.name}: {e}")
    out = {"ok": True, "own target not resolvable here": unresolved}
    for label, paths, extra in (("impl", [str(ROOT / "fuzz" / "corpus")], ["--target", "impl"]), ("own variants", own, [])):
        t0 = time.monotonic()
        p = subprocess.run(
            [sys.executable, "-m", "fuzz", "replay", *paths, "--device", DEVICE, *extra],
            cwd=ROOT, capture_output=True, text=True,
        )
        lines = p.stdout.splitlines()
        out[label] = {
            "exit": p.returncode,
            "ok_lines": sum(line.startswith("ok ") for line in lines),
            "mismatch_lines": [line for line in lines if line.startswith(("MISMATCH", "          |"))][:60],
            "stderr_tail": p.stderr[-2000:],
            "seconds": round(time.monotonic() - t0, 1),
        }
        out["ok"] = out["ok"] and p.returncode == 0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", required=True, help="where to write the JSON report")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all phases together (default 420)")
    ap.add_argument("--examples", type=int, default=150, help="hypothesis examples per differential (default 150)")
    ap.add_argument("--device", default="cuda", help="device under test (default cuda; cpu is a dry run of this script)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device

    import torch

    report: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE,
        "checks": {},
    }
    # The version from the package metadata: importing triton here, before
    # impl.triton_layout decides on the interpreter, would fix that choice.
    from importlib import metadata

    try:
        report["triton"] = metadata.version("triton")
    except metadata.PackageNotFoundError:
        report["triton"] = None
    start = time.monotonic()
    phases = [
        ("cpu_against_cuda", lambda: check_cpu_against_cuda(args.examples)),
        ("torch_against_triton_on_cuda", lambda: check_torch_against_triton(args.examples)),
        ("sync_on_cuda", check_sync),
        ("corpus_on_cuda", check_corpus),
    ]
    for name, fn in phases:
        if time.monotonic() - start > args.budget:
            report["checks"][name] = {"ok": False, "skipped": f"the {args.budget:g} s budget was spent before it started"}
            continue
        t0 = time.monotonic()
        try:
            result = fn()
        except Exception as e:  # a phase that cannot run is a failed check, with its trace
            result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        result["seconds"] = round(time.monotonic() - t0, 1)
        report["checks"][name] = result
        print(f"device_check: {name}: {'ok' if result['ok'] else 'FAILED'} ({result['seconds']} s)", flush=True)
    report["seconds"] = round(time.monotonic() - start, 1)
    report["ok"] = all(c["ok"] for c in report["checks"].values())
    Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    print(f"device_check: report written to {args.report}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
