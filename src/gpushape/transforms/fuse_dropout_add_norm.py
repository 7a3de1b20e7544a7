"""fuse-dropout-add-norm: a post-norm block's output, LayerNorm(dropout(dense(h)) + residual), with
the dropout, the add and the LayerNorm in one kernel each way (gpushape.kernels.norms.
dropout_add_layer_norm), whose backward regenerates the mask instead of reading it.

The pattern is the one Hugging Face's BERT family writes in `BertSelfOutput` and `BertOutput`
(RoBERTa, ELECTRA, ... copy them): a module with exactly the children `dense` (nn.Linear),
`dropout` (nn.Dropout) and `LayerNorm` (nn.LayerNorm over the last dimension) whose forward is,
statement for statement (read from its source),

    h = self.dense(h); h = self.dropout(h); h = self.LayerNorm(h + residual); return h

Anything else (other statements, another order, hooks on the module) is left alone. The forward
is replaced on the instance (an `InstanceForward`: it copies and pickles with the module;
parameters, the state_dict and the class are untouched); undo removes it. Under autocast, or
when the residual's dtype differs from the projection's, a call runs the class's forward.

Why under torch.compile too: Inductor (torch 2.11) fuses these ops itself, but its generated
dropout runs one Philox call per element; BERT-base's fused dropout + add + LayerNorm forward
kernels took about three times what their bytes take at the copy rate on the H100 and H200.
The mask this kernel draws differs from nn.Dropout's, with the same drop probability; the
numeric gate of optimize() runs with dropout off, and the kernel's tests check the dropout.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import torch
from torch import nn

from ..models.instance_forward import InstanceForward
from ._core import Change, Outcome, Refusal, TransformContext, has_hooks, register_transform

ID = "fuse-dropout-add-norm"
CHILDREN = {"dense": nn.Linear, "dropout": nn.Dropout, "LayerNorm": nn.LayerNorm}


def _fused_forward(self: nn.Module, hidden_states: torch.Tensor, input_tensor: torch.Tensor):
    from ..kernels.norms.dropout_add_layer_norm import dropout_add_layer_norm

    h = self.dense(hidden_states)
    norm, dropout = self.LayerNorm, self.dropout
    autocast = h.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(h.device.type)
    if autocast or input_tensor.dtype != h.dtype:
        return type(self).forward(self, hidden_states, input_tensor)
    return dropout_add_layer_norm(h, input_tensor, norm.weight, norm.bias, float(norm.eps),
                                  p=float(dropout.p), training=dropout.training)  # fmt: skip


def _statements(fn: Any) -> tuple[list[str], list[str]] | None:
    """(argument names after self, the body's statements as source) of `fn`, docstring
    dropped; None where the source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    func = tree.body[0] if tree.body else None
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    args = func.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or args.defaults:
        return None
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return [a.arg for a in args.args[1:]], [ast.unparse(s) for s in body]


def matches_pattern(module: nn.Module) -> str | None:
    """Why `module` is not the dense -> dropout -> LayerNorm(+ residual) output block, or None
    when it is."""
    children = dict(module.named_children())
    if set(children) != set(CHILDREN):
        return "not the children dense, dropout, LayerNorm"
    for name, kind in CHILDREN.items():
        if type(children[name]) is not kind:
            return f"{name} is a {type(children[name]).__name__}, not an nn.{kind.__name__}"
    norm = children["LayerNorm"]
    if (
        len(norm.normalized_shape) != 1
        or norm.normalized_shape[0] != children["dense"].out_features
    ):
        return "the LayerNorm does not normalise the projection's features"
    found = _statements(type(module).forward)
    if found is None:
        return "its forward's source cannot be read"
    names, body = found
    if len(names) != 2:
        return "its forward does not take (hidden states, residual)"
    h, r = names
    expected = [f"{h} = self.dense({h})", f"{h} = self.dropout({h})"]
    sums = (f"{h} + {r}", f"{r} + {h}")
    tails = [[f"{h} = self.LayerNorm({s})", f"return {h}"] for s in sums]
    tails += [[f"return self.LayerNorm({s})"] for s in sums]
    if not any(body == expected + tail for tail in tails):
        return "its forward is not dense, dropout, then LayerNorm of the sum with the residual"
    return None


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    for fqn, module in model.named_modules():
        if "dropout" not in module._modules:
            continue
        if matches_pattern(module) is not None or not ctx.allows(module, fqn):
            continue
        if "forward" in module.__dict__:
            continue  # already replaced (this transform, applied before, or another wrapper)
        if has_hooks(module):
            reason = "forward or backward hooks are registered on it"
            out.refusals.append(Refusal(transform=ID, module=fqn, reason=reason))
            continue
        module.forward = InstanceForward(_fused_forward, module)
        out.changes.append(
            Change(
                transform=ID,
                module=fqn,
                detail=f"dropout (p={module.dropout.p}), residual add and LayerNorm in one "
                "kernel each way",
                undo=_undo(module),
            )
        )
    return out


def _undo(module: nn.Module):
    def undo() -> None:
        module.__dict__.pop("forward", None)

    return undo
