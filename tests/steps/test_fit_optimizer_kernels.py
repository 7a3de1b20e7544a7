"""benchmarks/steps/fit_optimizer_kernels.py on the CPU: which kernels of a timed loop stage are
an optimizer step's, when a kept list may miss some, the fit over made-up steps, and the
profile rows it writes as the cost model reads them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "steps"))
import fit_optimizer_kernels as fok

from gpushape.hardware import get_gpu
from gpushape.hardware.profile import apply_profile

NS = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<"
    "at::native::(anonymous namespace)::"
)


def _stage(*kernels, filler=0):
    return {"top_kernels": [*kernels, *[(f"gemm{i}", 1e-3) for i in range(filler)]]}


def test_a_stage_counts_its_multi_tensor_kernels_only_when_none_can_be_missing():
    meta, scalars = (NS + "TensorListMetadata<2", 4e-4), (NS + "TensorListScalarLis", 2e-4)
    assert fok.optimizer_kernels_s(
        _stage(meta, scalars, filler=10), "foreach", "AdamW"
    ) == pytest.approx(6e-4)
    # foreach AdamW runs two kinds of kernel: one of them alone may be a cut list's
    assert fok.optimizer_kernels_s(_stage(meta, filler=10), "foreach", "AdamW") is None
    assert fok.optimizer_kernels_s(_stage(meta, filler=39), "foreach", "AdamW") == 4e-4
    assert fok.optimizer_kernels_s(_stage(meta, filler=10), "foreach", "SGD") == 4e-4
    fused = (NS + "FusedOptimizerTensorListMetadata<", 3e-4)
    assert fok.optimizer_kernels_s(_stage(fused, filler=10), "fused", "AdamW") == 3e-4
    assert fok.optimizer_kernels_s(_stage(filler=10), "fused", "SGD") is None


def _row(model, impl, cls, nbytes, tensors, kernels, bandwidth, efficiency, per_tensor):
    measured = nbytes / (bandwidth * efficiency) + per_tensor * tensors * kernels
    return {"model": model, "impl": impl, "class": cls, "bytes": nbytes, "tensors": tensors,
            "kernels": kernels, "measured_s": measured, "runs": 1}  # fmt: skip


def test_the_fit_recovers_a_rate_by_class_and_a_time_per_tensor():
    bw = 3e12
    rows = [
        _row("a", "foreach", "SGD", 8e7, 213, 3, bw, 0.9, 1.3e-7),
        _row("b", "foreach", "SGD", 4.5e8, 182, 3, bw, 0.9, 1.3e-7),
        _row("c", "foreach", "AdamW", 5e9, 148, 8, bw, 0.85, 1.3e-7),
        _row("d", "foreach", "AdamW", 6e9, 75, 8, bw, 0.85, 1.3e-7),
        _row("c", "fused", "AdamW", 1.7e9, 148, 1, bw, 0.75, 2e-7),
    ]
    fitted = fok.fit(rows, bw)
    assert fitted["foreach"]["tensor_seconds"] == pytest.approx(1.3e-7, rel=1e-3)
    assert fitted["foreach/SGD"]["efficiency"] == pytest.approx(0.9, abs=1e-3)
    assert fitted["foreach/AdamW"]["efficiency"] == pytest.approx(0.85, abs=1e-3)
    # one model timed fused: its time per tensor is foreach's, its rate what remains
    assert fitted["fused"]["tensor_seconds"] == fitted["foreach"]["tensor_seconds"]
    assert fitted["fused"]["tensor_seconds_from"] == "the other implementation's fit"
    for r in rows[:4]:
        assert fok.predicted_s(r, fitted, bw) == pytest.approx(r["measured_s"], rel=1e-3)
    # the profile rows, read back as the cost model's rates
    spec = apply_profile(get_gpu("h100"), {"gpu": "h100", "optimizer_kernels": fitted})
    rates = spec.achievable.optimizer_kernels
    assert rates["foreach/SGD"] == fitted["foreach/SGD"]["efficiency"]
    assert rates["foreach/tensor"] == fitted["foreach"]["tensor_seconds"]
    assert "foreach/SGD/tensor" not in rates  # a class row carries its rate only
