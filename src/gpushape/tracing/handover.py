"""Gradients handed over between fused BatchNorm calls, as the eager step runs them.

Autograd's engine adds the gradients of a tensor with several users (one elementwise kernel:
two reads, one write). Where that tensor is the output of gpushape's fused BatchNorm with ReLU
or no activation, and the parts come from a later fused norm's residual gradient or from
convolutions' input gradients (a ResNet block's output feeding the next block's first
convolution and its residual add, or its downsampling branch), the eager path skips the add:
the norm's backward reads both parts in its kernels (`kernels/batch_norm/_ops.py`). A trace on
the meta device runs the custom ops, which do not, so `hand_overs` rewrites the recorded
backward as the GPU runs it: the add is dropped and the norm's backward reads a second
gradient (`dy2`). The rewritten trace stands for the eager and graph modes: optimize does not
apply fuse-norm-act under torch.compile (Inductor fuses PyTorch's own norms and that add).

Approximation: two convolutions' gradients are assumed handed over whenever they meet at a
fused norm's output; gpushape's rewrite wires that only for a block's downsampling branch
(`transforms/fuse_norm_act.py`), the one place its fused models have it.
"""

from __future__ import annotations

import dataclasses

from .records import OpRecord

BN_BACKWARD = "gpushape.batch_norm_act_backward.default"
CONV_BACKWARD = "aten.convolution_backward.default"
ADD = "aten.add.Tensor"
# (op, output index) whose gradient may be handed over: a fused norm's residual gradient, a
# convolution's input gradient, an average pool's (a downsampling branch that pools first:
# timm's ResNet-D)
PARTS = {(BN_BACKWARD, 3), (CONV_BACKWARD, 0), ("aten.avg_pool2d_backward.default", 0)}


def _is_fold(add: OpRecord, users: dict, made: dict) -> OpRecord | None:
    """The fused norm's backward that reads `add`'s sum as its dy, when the add is skipped."""
    if add.op != ADD or add.inplace or len(add.inputs) != 2 or add.params.get("alpha", 1) != 1:
        return None
    out = add.outputs[0].storage
    readers = users.get(out, [])
    if out is None or len(readers) != 1 or readers[0].op != BN_BACKWARD:
        return None
    bn = readers[0]
    if bn.params.get("activation") not in ("relu", "none") or bn.inputs[0].storage != out:
        return None
    parts = [made.get(t.storage) for t in add.inputs]
    return bn if all(p in PARTS for p in parts) else None


def hand_overs(ops: list[OpRecord]) -> list[OpRecord]:
    """`ops` with each handed-over add dropped and its norm's backward reading both parts
    (records renumbered; forward records and every `fwd_index` unchanged)."""
    made: dict[int, tuple[str, int]] = {}
    users: dict[int, list[OpRecord]] = {}
    for rec in ops:
        if rec.phase != "backward":
            continue
        for t in rec.inputs:
            if t.storage is not None:
                users.setdefault(t.storage, []).append(rec)
        for k, t in enumerate(rec.outputs):
            if t.storage is not None:
                made[t.storage] = (rec.op, k)
    dropped: set[int] = set()
    reads: dict[int, OpRecord] = {}
    for rec in ops:
        bn = _is_fold(rec, users, made) if rec.phase == "backward" else None
        if bn is not None:
            dropped.add(rec.index)
            a, b = (dataclasses.replace(t, same_as=None) for t in rec.inputs)
            rest = [  # positions move up by one after the inserted dy2
                t
                if t.same_as is None or t.same_as < 1
                else dataclasses.replace(t, same_as=t.same_as + 1)
                for t in bn.inputs[1:]
            ]
            reads[bn.index] = dataclasses.replace(
                bn,
                inputs=(a, b, *rest),
                input_names=("dy", "dy2", *bn.input_names[1:]),
                params={**bn.params, "handed_over": True},
            )
    if not dropped:
        return ops
    kept = [reads.get(rec.index, rec) for rec in ops if rec.index not in dropped]
    return [dataclasses.replace(rec, index=i) for i, rec in enumerate(kept)]
