"""fuse-norm-act's module swaps, beside its graph rewrites (fuse_norm_act.py): library modules
that already pair a BatchNorm with an activation (timm's BatchNormAct2d) swapped for gpushape's,
and the BatchNorm2d that computes a fused site's residual (ResNet's shortcut) moved onto the
kernel with no activation. Each swap shares the norm's parameters and buffers and carries its
own undo."""

from __future__ import annotations

from torch import nn

from ..kernels import BatchNormAct2d
from ._core import (
    Change,
    Outcome,
    Refusal,
    TransformContext,
    has_hooks,
    install,
    module_holders,
    parent_of,
)
from ._norm_act_match import is_norm_act_module, norm_act_activation

ID = "fuse-norm-act"
# the kernels' activation names, as a report says them
ACT_NAMES = {
    "relu": "ReLU",
    "silu": "SiLU",
    "gelu": "GELU",
    "gelu_tanh": "GELU (tanh)",
    "hardswish": "Hardswish",
}


def refusal(fqn: str, reason: str) -> Refusal:
    return Refusal(transform=ID, module=fqn, reason=reason)


def residual_norm(site: dict, parent: nn.Module, fqn: str) -> tuple | None:
    """(holder, attribute, BatchNorm2d, its name) when a fused site's residual is the output
    of a plain BatchNorm2d: a child of the parent, or the last module of a child Sequential."""
    node = site.get("residual")
    if node is None or node.op != "call_module":
        return None
    if sum(n.op == "call_module" and n.target == node.target for n in node.graph.nodes) > 1:
        return None  # the branch runs twice: its norm sees two batches
    branch = parent.get_submodule(node.target)
    prefix = f"{fqn}.{node.target}" if fqn else node.target
    if type(branch) is nn.BatchNorm2d:
        holder, attr, name = parent, node.target, prefix
    elif type(branch) is nn.Sequential and len(branch) and type(branch[-1]) is nn.BatchNorm2d:
        if has_hooks(branch):
            return None
        holder, attr = branch, list(branch._modules)[-1]
        name = f"{prefix}.{attr}"
    else:
        return None
    norm = getattr(holder, attr)
    return None if has_hooks(norm) else (holder, attr, norm, name)


def swap_residual_norms(
    found: list[tuple], model: nn.Module, ctx: TransformContext, out: Outcome
) -> None:
    """Each residual-branch BatchNorm2d (see the module docstring) onto gpushape's kernel."""
    holders = module_holders(model)
    for _, _, norm, name in found:
        holder, attr = parent_of(model, name)  # the rewritten parent, where it holds the norm
        if getattr(holder, attr, None) is not norm or not ctx.allows(norm, name):
            continue
        if len(holders[id(norm)]) > 1:
            out.refusals.append(refusal(name, "the module is held in more than one place"))
            continue
        _, undo = install(model, name, BatchNormAct2d.from_batchnorm(norm, "none"), out)
        detail = "BatchNorm2d feeding a fused residual add, on the fused kernel (no activation)"
        out.changes.append(Change(transform=ID, module=name, detail=detail, undo=undo))


def _library_refusal(m: nn.Module, holders: list) -> str | None:
    if has_hooks(m) or has_hooks(m.drop) or has_hooks(m.act):
        return "a hook is registered: it would see other values"
    if len(holders) > 1:
        return "the module is held in more than one place"
    return None


def fuse_library_modules(model: nn.Module, ctx: TransformContext, out: Outcome) -> nn.Module:
    """timm's BatchNormAct2d (see the module docstring) swapped for gpushape's in its holder;
    returns the root (the swapped module itself when it is the root)."""
    holders = module_holders(model)
    for fqn, m in list(model.named_modules()):
        if not is_norm_act_module(m) or not ctx.allows(m, fqn):
            continue
        name, reason = norm_act_activation(m)
        reason = reason or (_library_refusal(m, holders[id(m)]) if name else None)
        fused = BatchNormAct2d.from_batchnorm(m, name) if name and not reason else None
        if fused is not None and list(fused.state_dict()) != list(m.state_dict()):
            reason, fused = "the swap would change the state_dict's keys", None
        if reason is not None:
            out.refusals.append(refusal(fqn, reason))
        if fused is None:
            continue
        model, undo = install(model, fqn, fused, out)
        detail = f"{type(m).__name__} (BatchNorm2d + {ACT_NAMES[name]}) fused"
        out.changes.append(Change(transform=ID, module=fqn, detail=detail, undo=undo))
    return model
