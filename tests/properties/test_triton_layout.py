"""The Triton layouts against the torch ones (SPEC 2.5, 4.5), on CPU under triton's
interpreter. Needs the triton extra (`pip install -e '.[triton]'`); skipped without it."""

import importlib.util
import random

import pytest
import torch
from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

if importlib.util.find_spec("triton") is None:
    pytest.skip("the triton extra is not installed (pip install -e '.[triton]')", allow_module_level=True)

from impl import paged, triton_layout  # noqa: E402

if not triton_layout.runs_on("cpu"):
    pytest.skip(
        "triton's interpreter is off in this process (a CUDA device without TRITON_INTERPRET=1, "
        "or triton imported before it was set), so the kernels do not take CPU tensors; "
        "scripts/device_check compares them on CUDA",
        allow_module_level=True,
    )

from properties.differential import Differential  # noqa: E402
from properties.lockstep import LockstepFailure  # noqa: E402
from properties.machine import machine_for  # noqa: E402
from properties.steps import Admit, Decode, DropTail, Evict, Finish  # noqa: E402
from properties.targets import resolve  # noqa: E402
from tests.triton_targets import page_per_index, paged_triton  # noqa: E402

impl = resolve("impl")
TORCH, TRITON = {"layout": "torch"}, {"layout": "triton"}
# The interpreter costs milliseconds a kernel call; this bounds the differential's
# share of the test command (SPEC 4.5 asks for it on every CI run, not for a soak).
DIFFERENTIAL_EXAMPLES = 40


def _ceil(a, b):
    return -(-a // b)


def test_kernels_give_the_torch_layouts_on_random_batches():
    rng = random.Random(14)
    for _ in range(40):
        ps = rng.choice([2, 3, 4, 16])
        n = rng.randint(1, 5)
        pre = [rng.choice([0, rng.randint(0, 40)]) for _ in range(n)]
        seq = [p + rng.randint(0, 40) for p in pre]
        last = [rng.randint(1, 30) * ps + (p - 1) % ps if p else -1 for p in pre]
        need = sum(_ceil(s, ps) - _ceil(p, ps) for p, s in zip(pre, seq))
        pages = torch.randperm(200)[:need] + 1
        args = (torch.tensor(pre), torch.tensor(seq), torch.tensor(last), pages, ps, sum(seq) - sum(pre))
        assert torch.equal(triton_layout.extend_layout(*args), paged.extend_layout(*args)), args

        dseq = [rng.randint(1, 40) for _ in range(n)]
        dlast = [rng.randint(1, 30) * ps + (s - 2) % ps for s in dseq]
        dpages = torch.randperm(200)[: sum((s - 1) % ps == 0 for s in dseq)] + 1
        dargs = (torch.tensor(dseq), torch.tensor(dlast), dpages, ps)
        assert torch.equal(triton_layout.decode_layout(*dargs), paged.decode_layout(*dargs)), dargs

        # Indices repeat pages on purpose: every page is read before any is cleared.
        mapping = torch.randint(0, 50, (ps * 20 + ps + 1,))
        idx = torch.randint(0, ps * 20, (rng.randint(1, 12),))
        want_mapping = mapping.clone()
        slots = ((idx // ps * ps)[:, None] + torch.arange(ps)).reshape(-1)
        want = want_mapping[slots].clone()
        want_mapping.index_fill_(0, slots, 0)
        got = triton_layout.gather_and_clear_pages(idx, mapping, ps)
        assert torch.equal(got, want) and torch.equal(mapping, want_mapping), (idx, ps)


def test_torch_layout_against_triton_layout():
    run_state_machine_as_test(
        machine_for(impl, peer=paged_triton, sides=(TORCH, TRITON)),
        settings=settings(settings.default, max_examples=min(settings.default.max_examples, DIFFERENTIAL_EXAMPLES), database=None),
    )


CONFIG = {"kind": "hybrid", "size": 64, "size_swa": 64, "page_size": 4}


def test_a_kernel_that_assumes_distinct_pages_agrees_while_they_are():
    """One-slot requests free each page once; a segment free hands the kernel one
    index per page."""
    d = Differential(CONFIG, impl, page_per_index, TORCH, TRITON)
    for step in [
        Admit(((0, 1), (1, 1), (2, 1))), Finish(1, "free"), Finish(0, "free"), Admit(((3, 1), (4, 13))),
        Decode((2, 3)), DropTail(4, 4), Finish(4, "segments"),
    ]:
        d.run(step)
    d.census()


@pytest.mark.parametrize("steps", [
    [Admit(((0, 8),)), Finish(0, "free")],
    [Admit(((0, 3), (1, 6))), Decode((1,)), Finish(1, "free")],
    [Admit(((0, 12),)), Evict(0, 0, 8)],
])
def test_the_differential_finds_a_kernel_that_assumes_distinct_pages(steps):
    d = Differential(CONFIG, impl, page_per_index, TORCH, TRITON)
    with pytest.raises(LockstepFailure) as e:
        for step in steps:
            d.run(step)
        d.census()
    assert e.value.step == steps[-1], e.value


@pytest.mark.parametrize("search_seed", [1, 2, 3])
def test_the_hypothesis_differential_finds_it_too(search_seed):
    """Found by the search as well, on each of three seeds; not shrunk, since shrinking
    under the interpreter costs minutes and the steps above are the short form."""
    machine = seed(search_seed)(machine_for(impl, peer=page_per_index, sides=(TORCH, TRITON)))
    with pytest.raises(LockstepFailure):
        run_state_machine_as_test(
            machine,
            settings=settings(
                settings.default, max_examples=DIFFERENTIAL_EXAMPLES, database=None, derandomize=False,
                phases=[Phase.explicit, Phase.generate],
            ),
        )
