"""benchmarks/kernels/sanitize_kernels.py, the workload compute-sanitizer runs on the GPU: every
case runs in Triton's interpreter here and matches plain PyTorch, and every fused op the package
exports has one (KVCache runs no kernel of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gpushape.kernels

SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"


@pytest.fixture(scope="module")
def cases():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(SCRIPTS))
        return __import__("sanitize_kernels").cases("cpu")


def test_every_exported_fused_op_has_a_case(cases):
    ops = {
        name
        for name in dir(gpushape.kernels)
        if not name.startswith("_")
        and name[0].islower()
        and callable(getattr(gpushape.kernels, name))
    }
    covered = {name.split()[0] for name in cases}
    assert len(ops) >= 7 and ops <= covered
    assert "FusedQKV" in covered


@pytest.mark.parametrize("seed", [0, 1])
def test_every_case_matches_pytorch_in_the_interpreter(cases, seed):
    torch.manual_seed(seed)
    errors = {name: run() for name, run in cases.items()}
    assert len(errors) >= 20
    assert all(err < 0.05 for err in errors.values()), errors
