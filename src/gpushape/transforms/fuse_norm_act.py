"""fuse-norm-act: a normalization and the activation after it (and a residual add between
them) become one of gpushape's fused kernels, found from the data flow.

Patterns, in the forward of the module that calls the norm (its parent):
- BatchNorm2d -> act                    -> BatchNormAct2d(activation=act); an nn.Identity
  between them (timm's drop_block with no drop rate) stays, after the fused call
- BatchNorm2d -> add(., residual) -> act -> BatchNormAct2d(activation=act), residual passed in
  (act: ReLU, SiLU, GELU (erf or tanh) or Hardswish)
- LayerNorm   -> GELU                   -> LayerNormGELU (same approximation)
- add(a, b)   -> LayerNorm               -> AddLayerNorm(a, b), which also returns the sum for
  its other users (BERT's `LayerNorm(hidden + input)`, a pre-norm block's residual stream)
- the residual of a fused BatchNorm2d site, when it is the output of a BatchNorm2d (a child
  of the parent, or the last module of a child nn.Sequential: ResNet's `downsample` branch)
  -> BatchNormAct2d(activation="none"). Nothing is fused there: gpushape's kernel is the
  faster BatchNorm (on the H200, PyTorch's channels_last statistics kernel read ResNet-50's
  four shortcut norms at about 0.72 TB/s, a fifth of copy bandwidth; see docs/optimize.md),
  and this branch is as large as the block's output.
The activation may be a module (PyTorch's, or one whose forward is just the function: timm's
GELU), the function (`F.relu`, `torch.relu`, `F.silu`, `F.gelu`, `F.hardswish`) or the tensor
method (`_norm_act_match.py`); the add may be `+`, `+=` or `torch.add`. The data flow comes from
torch.fx: the parent is traced with its children as leaves, so the graph shows which call's
output feeds which. A site is fused only when the norm's output (and the sum's) has no other
user, the norm module is called once, and no hook is registered on the parent or the norm;
otherwise it is refused with the reason.

Library modules that already pair the two: timm's `BatchNormAct2d` (a BatchNorm2d subclass whose
forward runs batch_norm, then `self.drop`, then `self.act`, as its own traced data flow shows)
becomes gpushape's BatchNormAct2d when drop is nn.Identity and act is one of the activations
above; otherwise it is refused with the reason (one whose act is nn.Identity is a plain
BatchNorm: nothing to fuse, left alone).
A parent whose forward is replaced on the instance (autocast-bf16's wrapper, a checkpoint) is
refused too: torch.fx traces the class's forward, and the rewrite would drop the replacement.

In a parent with a fused residual site, an input that also feeds a convolution branch besides
the first (ResNet's downsampling) reaches that branch through `hand_over`: where the input is a
fused norm's output, that gradient joins the norm's backward inside its kernels instead of
autograd's add (the residual's own gradient does so by itself: see kernels/batch_norm/_ops.py).

The fused modules share the norm's parameters and buffers (same objects, same names), so the
state_dict, its keys and the optimizer's state are unchanged. A rewritten parent becomes an
fx.GraphModule holding the same children under the same names; undo puts the original back.
The module swaps (timm's BatchNormAct2d, the residual's BatchNorm2d) are in _norm_act_swaps.py.
"""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from ..kernels import AddLayerNorm, BatchNormAct2d, LayerNormGELU, LayoutSafeAvgPool2d
from ..kernels.batch_norm.batch_norm_act import hand_over
from ._core import (
    Change,
    Outcome,
    TransformContext,
    has_hooks,
    install,
    register_transform,
)
from ._norm_act_match import (
    BATCH_NORM_ACTS,
    LAYER_NORM_ACTS,
    activation,
    is_plain_layer_norm,
    keep_order,
    only_user,
    through_identity,
)
from ._norm_act_match import ChildrenAsLeaves as _ChildrenAsLeaves
from ._norm_act_match import callee as _callee
from ._norm_act_swaps import (
    ACT_NAMES,
    ID,
    fuse_library_modules,
    refusal,
    residual_norm,
    swap_residual_norms,
)

ADD = {operator.add, operator.iadd, torch.add, "add", "add_"}


def _act_of(node: fx.Node, parent: nn.Module, kind: str) -> str | None:
    """The activation `node` computes when the norm of this kind fuses it, else None."""
    name = activation(node, parent)
    return name if name in (BATCH_NORM_ACTS if kind == "bn" else LAYER_NORM_ACTS) else None


def _residual_add(node: fx.Node, module: nn.Module) -> tuple[fx.Node, fx.Node] | None:
    """(add node, the other operand) when `node`'s only user adds another tensor to it."""
    add = only_user(node)
    if add is None or _callee(add, module) not in ADD or add.kwargs.get("alpha", 1) != 1:
        return None
    if len(add.args) != 2 or node not in add.args:
        return None
    other = add.args[1] if add.args[0] is node else add.args[0]
    return (add, other) if isinstance(other, fx.Node) and other is not node else None


def _summed(node: fx.Node, module: nn.Module) -> fx.Node | None:
    """The add node when the norm's only input is the sum of two tensors a + b."""
    if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], fx.Node):
        return None
    add = node.args[0]
    if _callee(add, module) not in ADD or add.kwargs or len(add.args) != 2:
        return None
    a, b = add.args
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)) or a is b:
        return None
    if _callee(add, module) in (operator.iadd, "add_"):
        return None  # in place: `a` itself changes, and other nodes may read it as the sum
    return add


def _sites(parent: nn.Module, graph: fx.Graph) -> list[dict]:
    """Norm call sites in `graph` and the nodes a fused kernel replaces."""
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    sites, taken = [], set()  # taken: the adds a residual site absorbs (bn(a) + bn(b): once)
    for node in graph.nodes:
        norm = _callee(node, parent) if node.op == "call_module" else None
        if type(norm) is nn.BatchNorm2d:
            kind = "bn"
        elif isinstance(norm, nn.LayerNorm) and is_plain_layer_norm(norm):
            kind = "ln"
        else:
            continue
        site = {"node": node, "norm": norm, "kind": kind, "calls": calls[node.target]}
        user = only_user(node)
        residual = _residual_add(node, parent) if kind == "bn" else None
        if residual is not None and residual[0] in taken:
            continue  # the other operand's norm fused this add; this norm is its residual
        if residual is not None and only_user(residual[0]) is not None:
            act = only_user(residual[0])
            if _act_of(act, parent, kind):
                taken.add(residual[0])
                sites.append(
                    {
                        **site,
                        "add": residual[0],
                        "residual": residual[1],
                        "act": act,
                        "act_name": _act_of(act, parent, kind),
                    }
                )
                continue
        through = through_identity(node, parent)
        after = only_user(through) if through is not None else None
        if user is not None and _act_of(user, parent, kind):
            sites.append({**site, "act": user, "act_name": _act_of(user, parent, kind)})
        elif after is not None and _act_of(after, parent, kind):
            act_name = _act_of(after, parent, kind)
            sites.append({**site, "act": after, "act_name": act_name, "through": through})
        elif kind == "ln" and _summed(node, parent) is not None:
            sites.append({**site, "kind": "add_ln", "add": _summed(node, parent)})
        elif any(_act_of(u, parent, kind) for u in node.users):
            sites.append(
                {
                    **site,
                    "refuse": "the norm's output has other users besides the "
                    "activation: fusing would lose the intermediate they read",
                }
            )
    return sites


def _fused(site: dict, parent: nn.Module) -> nn.Module:
    norm = site["norm"]
    if site["kind"] == "bn":
        return BatchNormAct2d.from_batchnorm(norm, site["act_name"])
    cls = AddLayerNorm if site["kind"] == "add_ln" else LayerNormGELU
    fused = cls.__new__(cls)
    nn.Module.__init__(fused)
    fused.normalized_shape, fused.eps = tuple(norm.normalized_shape), norm.eps
    fused.elementwise_affine = norm.elementwise_affine
    if cls is LayerNormGELU:
        fused.approximate = "tanh" if site["act_name"] == "gelu_tanh" else "none"
    fused.weight, fused.bias = norm.weight, norm.bias  # the same Parameters
    return fused


def _rewrite(site: dict, parent: nn.Module, graph: fx.Graph) -> None:
    node = site["node"]
    if site["kind"] == "add_ln":  # one call computes both: y for the norm's users, s for the sum's
        add = site["add"]
        with graph.inserting_before(add):
            # the add's operands as they are now (an earlier rewrite may have replaced one)
            both = graph.call_module(node.target, args=tuple(add.args))
            y = graph.call_function(operator.getitem, (both, 0))
            total = graph.call_function(operator.getitem, (both, 1))
        node.replace_all_uses_with(y)
        graph.erase_node(node)
        add.replace_all_uses_with(total)
        graph.erase_node(add)
        return
    act = site["act"]
    if "residual" in site:
        # The residual may be computed after the norm (torchvision's Bottleneck runs its
        # downsample last): the norm moves down to the add, after both of its inputs.
        site["add"].prepend(node)
        node.args = (*node.args, site["residual"])
        act.replace_all_uses_with(node)
        graph.erase_node(act)
        graph.erase_node(site["add"])
    else:  # an Identity between norm and act stays, after the fused call (a no-op either way)
        act.replace_all_uses_with(site.get("through", node))
        graph.erase_node(act)


def _fuse_in(
    parent: nn.Module, fqn: str, ctx: TransformContext, out: Outcome, residual_norms: list
) -> nn.Module | None:
    """The rewritten parent (a GraphModule) or None when nothing there was fused; the
    residual-branch norms of its fused sites are added to `residual_norms`."""
    try:
        graph = _ChildrenAsLeaves(parent).trace(parent)
    except Exception as exc:  # FX cannot trace data-dependent control flow: refuse, say why
        reason = f"torch.fx cannot trace its forward ({type(exc).__name__}: {exc})".split("\n")[0]
        out.refusals.append(refusal(fqn, reason[:200]))
        return None
    fused = []
    for site in _sites(parent, graph):
        name = f"{fqn}.{site['node'].target}" if fqn else site["node"].target
        if "refuse" in site:
            out.refusals.append(refusal(name, site["refuse"]))
        elif site["calls"] > 1:
            out.refusals.append(refusal(name, "the norm module is called more than once"))
        elif has_hooks(site["norm"]) or has_hooks(parent):
            out.refusals.append(refusal(name, "a hook is registered: it would see other values"))
        elif ctx.allows(site["norm"], name):
            fused.append(site)
    if not fused:
        return None
    for site in fused:
        found = residual_norm(site, parent, fqn)
        if found is not None:
            residual_norms.append(found)
        _rewrite(site, parent, graph)
    handed = _hand_over_shared_inputs(graph, parent, fused)
    graph.lint()
    rewritten = fx.GraphModule(parent, graph, class_name=f"Fused{type(parent).__name__}")
    for site in fused:
        rewritten.set_submodule(site["node"].target, _fused(site, parent))
    rewritten.train(parent.training)
    keep_order(rewritten, parent)
    keys = set(parent.state_dict())
    if set(rewritten.state_dict()) != keys:
        out.refusals.append(refusal(fqn, "the rewrite would change the state_dict's keys"))
        return None
    for site in fused:
        name = f"{fqn}.{site['node'].target}" if fqn else site["node"].target
        act = ACT_NAMES.get(site.get("act_name"), "")
        what = {"bn": f"BatchNorm2d + {act}", "ln": f"LayerNorm + {act}"}.get(
            site["kind"], "add + LayerNorm"
        )
        what = f"BatchNorm2d + residual add + {act}" if "residual" in site else what
        out.changes.append(
            Change(transform=ID, module=name, detail=f"{what} fused", undo=lambda: None)
        )
    for target in handed:
        name = f"{fqn}.{target}" if fqn else target
        detail = "its input's gradient handed to the fused norm that produced the input"
        out.changes.append(Change(transform=ID, module=name, detail=detail, undo=lambda: None))
    return rewritten


def _branch_entry(module: nn.Module) -> bool:
    """A convolution, or a Sequential that starts with one (after an average pool, safe-avg-pool's
    included): a residual's downsampling branch, which reads its input and never changes it in
    place."""
    if type(module) is nn.Sequential and len(module):
        first = module[0]
        if type(first) in (nn.AvgPool2d, LayoutSafeAvgPool2d) and len(module) > 1:
            first = module[1]
        return isinstance(first, nn.Conv2d) and not has_hooks(module)
    return isinstance(module, nn.Conv2d)


def _hand_over_shared_inputs(graph: fx.Graph, parent: nn.Module, fused: list) -> list[str]:
    """In a parent with a fused BatchNorm residual site (a ResNet block), each input that
    feeds several users: the block's first convolution keeps autograd's edge, and every other
    user that is a convolution branch reads it through `hand_over`, which at run time hands
    that gradient to the fused norm that produced the input, if one did (the previous block's
    last norm): the two gradients meet in its kernels, not in autograd's add. (A fused residual
    site hands over by itself.) Returns the targets of the users so wrapped."""
    sites = {site["node"] for site in fused if site["kind"] == "bn" and "residual" in site}
    if not sites:
        return []
    handed = []
    for p in [n for n in graph.nodes if n.op == "placeholder"]:
        others = [u for u in p.users if u not in sites]
        for user in others[1:]:
            if user.op != "call_module" or not _branch_entry(parent.get_submodule(user.target)):
                continue
            with graph.inserting_before(user):
                alias = graph.call_function(hand_over, (p,))
            user.replace_input_with(p, alias)
            handed.append(user.target)
    return handed


def _parents(model: nn.Module) -> list[str]:
    """Names of the modules that call a BatchNorm2d or LayerNorm child, deepest first."""
    names = {
        fqn.rpartition(".")[0]
        for fqn, m in model.named_modules()
        if fqn and (type(m) is nn.BatchNorm2d or isinstance(m, nn.LayerNorm))
    }
    return sorted(names, key=lambda n: -n.count(".") if n else 1)


@register_transform(ID, pays_under_compile=False)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    model = fuse_library_modules(model, ctx, out)
    for fqn in _parents(model):
        parent = model.get_submodule(fqn)
        if not ctx.allows(parent, fqn):
            continue
        before = len(out.changes)
        residual_norms: list = []
        rewritten = _fuse_in(parent, fqn, ctx, out, residual_norms)
        if rewritten is None:
            continue
        if "forward" in parent.__dict__:  # fx traced the class's forward: it would be dropped
            del out.changes[before:]
            why = "its forward is replaced on the instance (autocast, a checkpoint): fx drops it"
            out.refusals.append(refusal(fqn, why))
            continue
        model, undo = install(model, fqn, rewritten, out)
        # one undo for the parent's rewrite, carried by its first change
        first = out.changes[before]
        out.changes[before] = Change(
            transform=ID, module=first.module, detail=first.detail, undo=undo
        )
        swap_residual_norms(residual_norms, model, ctx, out)
    return out
