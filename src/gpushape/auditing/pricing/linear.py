"""A Linear layer's kernels as records: y = x W^T + b, and in training its three gradients.

    forward:      addmm(b, x (M, K), W^T (K, N)) -> y (M, N)
    grad_input:   mm(dy (M, N), W (N, K))        -> dx (M, K)
    grad_weight:  mm(dy^T (N, M), x (M, K))      -> dW (N, K)
    grad_bias:    sum(dy, dim 0)                 -> db (N,)
These are the ops PyTorch runs for nn.Linear on 2-D input (3-D input is viewed as 2-D), so
pricing them with the trace's cost model prices a Linear of any shape, e.g. three projections
merged into one (separate-qkv).
"""

from __future__ import annotations

import dataclasses

from ...tracing.records import OpRecord
from .synth import record, tensor


def linear_records(
    m: int,
    k: int,
    n: int,
    dtype: str,
    *,
    bias: bool = True,
    train: bool = True,
    input_grad: bool = True,
) -> list[OpRecord]:
    x, w = tensor((m, k), dtype), tensor((n, k), dtype)
    wt = dataclasses.replace(tensor((k, n), dtype), strides=(1, k))  # W^T: a view of W
    y = tensor((m, n), dtype)
    fwd_inputs = {"self": tensor((n,), dtype)} if bias else {}
    fwd_inputs |= {"mat1": x, "mat2": wt}
    recs = [record("aten.addmm.default" if bias else "aten.mm.default", fwd_inputs, [y])]
    if not train:
        return recs
    dyt = dataclasses.replace(tensor((n, m), dtype), strides=(1, n))  # dy^T, a view
    back = [record("aten.mm.default", {"self": dyt, "mat2": x}, [w])]
    if input_grad:
        back.append(record("aten.mm.default", {"self": y, "mat2": w}, [x]))
    if bias:
        back.append(record("aten.sum.dim_IntList", {"self": y}, [tensor((1, n), dtype)]))
    return recs + [dataclasses.replace(r, phase="backward") for r in back]
