import functools
import os
from pathlib import Path

import pytest
import torch

# Not tests/kernels: pytest puts tests/ on sys.path, and a package named `kernels` there would
# shadow the PyPI package of that name, which transformers (5.2x) imports when it is installed.
KERNEL_TESTS = Path(__file__).parent / "kernel_ops"


@functools.cache
def interpreter_problem() -> str | None:
    """Why this Triton's interpreter cannot run gpushape's kernels, or None when it can.

    The kernels loop over row blocks with bounds that depend on the program id; Triton 3.6's
    interpreter fails on such loops ("only 0-dimensional arrays can be converted to Python
    scalars"). Checked once by running a tiny kernel of that shape.
    """
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return "Triton is not installed"

    @triton.jit
    def strided_sum(x_ptr, out_ptr, n, STEP: tl.constexpr):
        pid = tl.program_id(0)
        acc = 0.0
        for i in range(pid, n, STEP):
            acc += tl.load(x_ptr + i)
        tl.store(out_ptr + pid, acc)

    x = torch.arange(8, dtype=torch.float32)
    out = torch.zeros(2)
    try:
        strided_sum[(2,)](x, out, 8, STEP=2)
    except Exception as exc:  # the interpreter's own failure, whatever its type
        return f"Triton {triton.__version__}'s interpreter fails on runtime loop bounds ({exc})"
    if out.tolist() != [12.0, 16.0]:
        return f"Triton {triton.__version__}'s interpreter computes runtime loops wrongly"
    return None


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(
            reason="needs a CUDA device (run `pytest -m gpu` on the GPU machine)"
        )
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
        return
    # A CUDA machine whose Triton interpreter is too old (the GPU image's Triton 3.6): its CPU
    # interpreter lane cannot run the kernels; the GPU lane (`pytest -m gpu`) tests them there.
    if os.environ.get("TRITON_INTERPRET") == "1" and interpreter_problem():
        skip = pytest.mark.skip(
            reason=f"{interpreter_problem()}; `pytest -m gpu` tests the "
            "kernels on this machine's GPU"
        )
        for item in items:
            if "gpu" not in item.keywords and KERNEL_TESTS in Path(str(item.fspath)).parents:
                item.add_marker(skip)


@pytest.fixture
def interpret():
    """Tests that run Triton kernels on CPU tensors need TRITON_INTERPRET=1 (make test sets it)."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("set TRITON_INTERPRET=1 to run Triton kernels on the CPU")


@pytest.fixture
def parts(monkeypatch):
    """One entry per fused BatchNorm backward that runs: whether it read a second part of its
    output's gradient (a residual gradient handed over, kernels/batch_norm/_ops.py)."""
    from gpushape.kernels.batch_norm import _ops

    seen = []
    real = _ops._backward_parts

    def spy(dy, dy2, *args):
        seen.append(dy2 is not None)
        return real(dy, dy2, *args)

    monkeypatch.setattr(_ops, "_backward_parts", spy)
    return seen
