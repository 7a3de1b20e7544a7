"""What fuse-norm-act recognises as an activation, and library modules that already pair a
BatchNorm with one (timm's `BatchNormAct2d`), read from torch.fx data flow.

An activation is a call of one of PyTorch's functions (`F.relu`, `torch.relu`, `.relu()`,
`F.silu`, `F.gelu` with its `approximate`, `F.hardswish`), one of PyTorch's modules (`nn.ReLU`,
`nn.SiLU`, `nn.GELU`, `nn.Hardswish`), or any other module without parameters, buffers or
hooks whose traced forward is exactly one such call on its input (timm's `GELU`, `GELUTanh`).
Its name is the one gpushape's kernels take: relu, silu, gelu (erf), gelu_tanh, hardswish.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..kernels.batch_norm.batch_norm_act import BatchNormAct2d
from ._core import has_hooks

# what each fused kernel takes after its norm
BATCH_NORM_ACTS = ("relu", "silu", "gelu", "gelu_tanh", "hardswish")
LAYER_NORM_ACTS = ("gelu", "gelu_tanh")

_FUNCTIONS = {
    F.relu: "relu",
    torch.relu: "relu",
    "relu": "relu",
    "relu_": "relu",
    F.silu: "silu",
    F.hardswish: "hardswish",
    F.gelu: "gelu",
    "gelu": "gelu",
}
_MODULES = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Hardswish: "hardswish"}
_GELU = {"none": "gelu", "tanh": "gelu_tanh"}


class ChildrenAsLeaves(fx.Tracer):
    """Trace one module's own forward: every child is a leaf call."""

    def __init__(self, root: nn.Module):
        super().__init__()
        self.children = {id(m) for m in root.children()}

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return id(m) in self.children or super().is_leaf_module(m, qualname)


def callee(node: fx.Node, module: nn.Module):
    """What a call node calls: the module, the function, or the method name."""
    if node.op == "call_module":
        return module.get_submodule(node.target)
    if node.op in ("call_function", "call_method"):
        return node.target
    return None


def _call_activation(node: fx.Node, target) -> str | None:
    """The activation a call_function / call_method node computes on its first argument."""
    try:
        name = _FUNCTIONS.get(target)
    except TypeError:  # an unhashable target
        return None
    if name == "gelu":
        approximate = node.args[1] if len(node.args) > 1 else node.kwargs.get("approximate")
        return _GELU.get(approximate or "none")
    return name


def module_activation(m: nn.Module) -> str | None:
    """The activation module `m` computes, or None (see the module docstring). A module with
    hooks is None: folded into a norm's kernel, it would no longer run them."""
    if has_hooks(m):
        return None
    if isinstance(m, nn.GELU) and type(m).forward is nn.GELU.forward:
        return _GELU.get(m.approximate)
    if type(m) in _MODULES:
        return _MODULES[type(m)]
    if type(m) in (nn.Identity, BatchNormAct2d) or any(True for _ in m.children()):
        return None
    if any(True for _ in m.parameters()) or any(True for _ in m.buffers()) or has_hooks(m):
        return None
    try:
        graph = ChildrenAsLeaves(m).trace(m)
    except Exception:  # not traceable: not recognised
        return None
    calls = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    if len(calls) != 1 or len(inputs) != 1 or calls[0].op not in ("call_function", "call_method"):
        return None
    (call,) = calls
    if not call.args or call.args[0] is not inputs[0] or [u.op for u in call.users] != ["output"]:
        return None
    return _call_activation(call, call.target)


def activation(node: fx.Node, parent: nn.Module) -> str | None:
    """The activation a node of `parent`'s traced forward computes, or None."""
    target = callee(node, parent)
    if isinstance(target, nn.Module):
        return module_activation(target)
    if node.op in ("call_function", "call_method"):
        return _call_activation(node, target)
    return None


# ---- library LayerNorms that are nn.LayerNorm's function (timm's LayerNorm) ----

_LN_ARGS = ("input", "normalized_shape", "weight", "bias", "eps")


def is_plain_layer_norm(m: nn.Module) -> bool:
    """nn.LayerNorm, or a subclass that computes exactly what it does: no parameters or
    buffers of its own beyond weight and bias, no children, no hooks, and a traced forward that
    is one F.layer_norm of its input with its own normalized_shape, weight, bias and eps
    (timm's LayerNorm unless its fast norm is on)."""
    if type(m) is nn.LayerNorm:
        return True
    if not isinstance(m, nn.LayerNorm) or any(True for _ in m.children()) or has_hooks(m):
        return False
    if set(dict(m.named_parameters())) - {"weight", "bias"} or any(True for _ in m.buffers()):
        return False
    try:
        graph = ChildrenAsLeaves(m).trace(m)
    except Exception:  # not traceable: not recognised
        return False
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    calls = [n for n in graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    if len(inputs) != 1 or len(calls) != 1 or calls[0].target is not F.layer_norm:
        return False
    (ln,) = calls
    bound = dict(zip(_LN_ARGS, ln.args)) | dict(ln.kwargs)
    for name in ("weight", "bias"):
        arg = bound.get(name)
        own = getattr(m, name)
        if own is None and arg is not None:
            return False
        if own is not None and not (isinstance(arg, fx.Node) and arg.op == "get_attr"):
            return False
        if own is not None and arg.target != name:
            return False
    shape = bound.get("normalized_shape")
    return (
        bound.get("input") is inputs[0]
        and shape is not None
        and tuple(shape) == tuple(m.normalized_shape)
        and bound.get("eps", 1e-5) == m.eps
        and [u.op for u in ln.users] == ["output"]
    )


# ---- library modules that pair BatchNorm2d with an activation (timm's BatchNormAct2d) ----

_BN_ARGS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum")


def is_norm_act_module(m: nn.Module) -> bool:
    """A BatchNorm2d subclass holding `drop` and `act` modules (timm's BatchNormAct2d's shape)."""
    return (
        isinstance(m, nn.BatchNorm2d)
        and type(m) not in (nn.BatchNorm2d, BatchNormAct2d)
        and isinstance(getattr(m, "drop", None), nn.Module)
        and isinstance(getattr(m, "act", None), nn.Module)
    )


def _trace_keeping_counts(m: nn.Module) -> fx.Graph:
    """m's forward traced; buffers are not proxied, so a training forward's
    `num_batches_tracked.add_(1)` really runs while tracing: undone here."""
    counter = getattr(m, "num_batches_tracked", None)
    saved = counter.clone() if isinstance(counter, torch.Tensor) else None
    try:
        return ChildrenAsLeaves(m).trace(m)
    finally:
        if saved is not None:
            counter.copy_(saved)


def _normalises_like_batchnorm2d(bn: fx.Node, m: nn.Module, x: fx.Node) -> bool:
    """F.batch_norm(x, ..., m.weight, m.bias, ..., m.eps) on the module's own input."""
    bound = dict(zip((*_BN_ARGS, "eps"), bn.args)) | dict(bn.kwargs)
    for name in ("weight", "bias"):
        arg = bound.get(name)
        expected = getattr(m, name) is None
        if (arg is None) != expected or (arg is not None and getattr(arg, "target", None) != name):
            return False
    return bound.get("input") is x and bound.get("eps", 1e-5) == m.eps


def norm_act_activation(m: nn.Module) -> tuple[str | None, str | None]:
    """(the activation to fuse, None), (None, why not), or (None, None) when `m` pairs its
    norm with no activation (act is nn.Identity: a plain BatchNorm, nothing to fuse)."""
    drop, act = m.drop, m.act
    if type(act) is nn.Identity:
        return None, None
    if type(drop) is not nn.Identity:
        return None, f"its drop ({type(drop).__name__}) runs between the norm and the activation"
    if has_hooks(act):
        return None, "a hook is registered: it would see other values"
    name = module_activation(act)
    if name not in BATCH_NORM_ACTS:
        return None, (
            f"its activation {type(act).__name__} is not one BatchNormAct2d fuses "
            f"({', '.join(BATCH_NORM_ACTS)})"
        )
    try:
        graph = _trace_keeping_counts(m)
    except Exception as exc:  # FX cannot trace it: refuse, say why
        return None, f"torch.fx cannot trace its forward ({type(exc).__name__}: {exc})"[:200]
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    bns = [n for n in graph.nodes if n.op == "call_function" and n.target is F.batch_norm]
    flow = len(inputs) == 1 and len(bns) == 1 and _normalises_like_batchnorm2d(bns[0], m, inputs[0])
    node = bns[0] if flow else None
    for step in ("drop", "act"):  # batch_norm -> drop -> act -> output, nothing else reading
        users = list(node.users) if node is not None else []
        node = users[0] if len(users) == 1 and users[0].target == step else None
    if node is None or [u.op for u in node.users] != ["output"]:
        return None, "its forward does not run batch_norm -> drop -> act on its input"
    return name, None


# ---- what fuse-norm-act and fuse-group-norm share in their fx rewrites ----------------------
def only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def through_identity(node: fx.Node, module: nn.Module) -> fx.Node | None:
    """The node's only user when it is a call of a plain nn.Identity without hooks, called
    once (timm's `drop_block` between a norm and its activation when no drop rate is set)."""
    user = only_user(node)
    if user is None or user.op != "call_module":
        return None
    m = callee(user, module)
    if type(m) is not nn.Identity or has_hooks(m):
        return None
    calls = sum(n.op == "call_module" and n.target == user.target for n in node.graph.nodes)
    return user if calls == 1 else None


def keep_order(rewritten: nn.Module, parent: nn.Module) -> None:
    """Children, parameters and buffers in the parent's order (GraphModule registers them in
    the order the graph uses them), so the state_dict lists its keys as before."""
    for attr in ("_modules", "_parameters", "_buffers"):
        mine, theirs = getattr(rewritten, attr), getattr(parent, attr)
        order = [k for k in theirs if k in mine] + [k for k in mine if k not in theirs]
        setattr(rewritten, attr, {k: mine[k] for k in order})
