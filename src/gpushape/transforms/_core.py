"""What a transform returns and how it is undone: `Change`, `Refusal`, `Outcome`, the registry.

A transform is a function `apply(model, ctx) -> Outcome` registered under the fix id that
findings name (`auditing.fixes.FIXES`). It rewrites `model` in place where it matched and
`ctx.filter_fn(module, fqn)` allows, and reports every module it touched (`Change`, each with
its own undo) and every place it would not touch with the reason (`Refusal`). It never rewrites
part of a pattern: a site is changed whole or refused. Applying a transform twice equals once:
the second run finds nothing left to change.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..auditing.fixes import FIXES
from ..errors import GpushapeError

FilterFn = Callable[[nn.Module, str], bool]


class TransformError(GpushapeError):
    """A transform asked for that does not exist, or cannot run on this model at all."""


@dataclass(frozen=True, kw_only=True)
class Change:
    """One rewrite at one place."""

    transform: str
    module: str
    """Fully qualified name of the module changed ("" for the root)."""
    detail: str
    """What was done, in one line."""
    undo: Callable[[], Any] = field(repr=False, compare=False)
    """Restores the module as it was; returns the new root when the root itself was replaced."""


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """A place a transform matched but would not rewrite, and why."""

    transform: str
    module: str
    reason: str


@dataclass(kw_only=True)
class Outcome:
    changes: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    root: nn.Module | None = None
    """The new root when a transform had to replace it (an FX rewrite of the root module)."""
    measured: tuple[float, float] | None = None
    """(seconds before, seconds after) of what the transform timed on the GPU, where it did."""


@dataclass(frozen=True, kw_only=True)
class TransformContext:
    """What a transform may read besides the model."""

    example_inputs: tuple
    train: bool = True
    mode: str = "eager"
    gpu: Any = None
    """The target GPUSpec (alignment, for padding)."""
    filter_fn: FilterFn | None = None
    memory_budget: int | None = None
    """Bytes of activations kept for backward that the step must fit (activation-checkpoint)."""
    measure: bool = False
    """Apply only what a measurement on the model's GPU says pays (graph-layers: only a stack of
    layers whose eager forward and backward is host-bound is captured)."""

    def allows(self, module: nn.Module, fqn: str) -> bool:
        return self.filter_fn is None or bool(self.filter_fn(module, fqn))


@dataclass(frozen=True)
class TransformInfo:
    id: str
    apply: Callable[[nn.Module, TransformContext], Outcome]
    pays_under_compile: bool
    """Whether the rewrite still saves time when the model runs under torch.compile (Inductor
    pads GEMMs and fuses pointwise ops into norms by itself; it does not change layouts or
    attention implementations)."""


TRANSFORMS: dict[str, TransformInfo] = {}


def register_transform(fix_id: str, *, pays_under_compile: bool):
    """Register `apply(model, ctx) -> Outcome` as the transform for findings' `fix_id`."""
    if fix_id not in FIXES:
        raise ValueError(f"unknown fix id {fix_id!r}; add it to auditing/fixes.py first")

    def register(fn):
        TRANSFORMS[fix_id] = TransformInfo(fix_id, fn, pays_under_compile)
        return fn

    return register


def get_transform(fix_id: str) -> TransformInfo:
    load_transforms()
    if fix_id not in TRANSFORMS:
        known = ", ".join(sorted(TRANSFORMS))
        raise TransformError(f"unknown transform {fix_id!r}; known: {known}")
    return TRANSFORMS[fix_id]


def load_transforms() -> dict[str, TransformInfo]:
    """Import every transform module once (each registers itself)."""
    from . import (  # noqa: F401
        activation_checkpoint,
        attention_mask,
        autocast,
        channels_last,
        fast_max_pool,
        fuse_activation,
        fuse_dropout_add_norm,
        fuse_grn,
        fuse_group_norm,
        fuse_norm_act,
        fuse_qkv,
        graph_layers,
        masked_lm_head,
        no_kv_cache,
        pad_channels,
        s2d_stem,
        safe_avg_pool,
        sdpa,
    )

    return TRANSFORMS


# ---- the undo log: what optimize() changed on which model, for revert() -------------------
_APPLIED: weakref.WeakKeyDictionary[nn.Module, list[Change]] = weakref.WeakKeyDictionary()


def remember(model: nn.Module, changes: list[Change]) -> None:
    _APPLIED.setdefault(model, []).extend(changes)


def applied(model: nn.Module) -> list[Change]:
    """The changes gpushape made to `model` that are still in place."""
    return list(_APPLIED.get(model, ()))


def undo(changes: list[Change]) -> nn.Module | None:
    """Undo `changes`, last first; the restored root if one of them had replaced it."""
    root = None
    for change in reversed(changes):
        new_root = change.undo()
        if isinstance(new_root, nn.Module):
            root = new_root
    return root


def revert(model: nn.Module) -> nn.Module:
    """Undo everything gpushape's transforms changed on `model`; returns the original model
    (the same object, or the original root where a transform had replaced it)."""
    changes = _APPLIED.pop(model, [])
    return undo(changes) or model


def forget(model: nn.Module, old: nn.Module | None = None) -> None:
    """Move the log from `old` to `model` (a transform replaced the root) or drop it."""
    if old is not None and old in _APPLIED:
        _APPLIED[model] = _APPLIED.pop(old)


Owners = dict[int, dict[int, tuple[str, nn.Module, str]]]
Holders = dict[int, list[tuple[nn.Module, str]]]


def param_owners(model: nn.Module) -> Owners:
    """id(Parameter) -> {id(module): (name, module, attribute)} for every module holding it."""
    owners: Owners = defaultdict(dict)
    for fqn, module in model.named_modules(remove_duplicate=False):
        for attr, p in module._parameters.items():
            if p is not None:
                owners[id(p)].setdefault(id(module), (fqn, module, attr))
    return owners


def module_holders(model: nn.Module) -> Holders:
    """id(module) -> every (parent, attribute) holding it (a shared module has several)."""
    holders: Holders = defaultdict(list)
    for _, parent in model.named_modules(remove_duplicate=False):
        for name, child in parent._modules.items():
            if child is not None and (parent, name) not in holders[id(child)]:
                holders[id(child)].append((parent, name))
    return holders


def swap_module(
    module: nn.Module, new: nn.Module, where: list, *, transform: str, fqn: str, detail: str
) -> Change:
    """Put `new` in every (parent, attribute) of `where` that holds `module` (a shared module
    is swapped everywhere), in `module`'s train/eval state; the Change's undo puts `module`
    back. `detail` gets the count of the other places appended."""
    for parent, attr in where:
        setattr(parent, attr, new)
    new.train(module.training)

    def undo() -> None:
        for parent, attr in where:
            setattr(parent, attr, module)

    more = f" (and {len(where) - 1} other place(s) holding it)" if len(where) > 1 else ""
    return Change(transform=transform, module=fqn, detail=f"{detail}{more}", undo=undo)


def swap_each(
    model: nn.Module,
    ctx: TransformContext,
    transform: str,
    matches: Callable[[nn.Module], bool],
    build: Callable[[nn.Module], tuple[nn.Module, str]],
) -> Outcome:
    """Each module `matches` takes, once however many places hold it, swapped (`swap_module`)
    for `build(module)`'s (new module, detail), where `ctx` allows. Refused, with the reason:
    a module with hooks (the new one would not run them), and one `build` rejects with a
    ValueError or TypeError (its message)."""
    out = Outcome()
    places = module_holders(model)
    seen: set[int] = set()
    for fqn, module in list(model.named_modules()):
        if not matches(module) or id(module) in seen or id(module) not in places:
            continue
        seen.add(id(module))
        if not ctx.allows(module, fqn):
            continue
        if has_hooks(module):
            reason = f"{type(module).__name__} has hooks, which the new module would not run"
            out.refusals.append(Refusal(transform=transform, module=fqn, reason=reason))
            continue
        try:
            new, detail = build(module)
        except (ValueError, TypeError) as exc:
            out.refusals.append(Refusal(transform=transform, module=fqn, reason=str(exc)))
            continue
        where = places[id(module)]
        out.changes.append(
            swap_module(module, new, where, transform=transform, fqn=fqn, detail=detail)
        )
    return out


def parent_of(model: nn.Module, fqn: str) -> tuple[nn.Module, str]:
    """The module holding `fqn` and the attribute name under which it holds it."""
    parent_name, _, name = fqn.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), name


def install(model: nn.Module, fqn: str, new: nn.Module, out: Outcome) -> tuple[nn.Module, Callable]:
    """`new` in place of the module at `fqn` (the root when fqn is "": then `out.root`);
    (the model's root now, the undo, which puts the old module back)."""
    if not fqn:
        old_root = model
        out.root = new
        return new, lambda: old_root
    holder, attr = parent_of(model, fqn)
    old = getattr(holder, attr)
    setattr(holder, attr, new)
    return model, lambda: setattr(holder, attr, old)


def has_hooks(module: nn.Module) -> bool:
    """Whether forward or backward hooks are registered on the module (a rewrite would skip
    or change what they see)."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or getattr(module, "_backward_pre_hooks", None)
    )


@contextlib.contextmanager
def state_restored(model: nn.Module, inputs: tuple = ()):
    """The model's buffers (BatchNorm's running statistics, copied back in place, so that memory
    a CUDA graph updates stays the same) and the random generators (CPU and the CUDA devices of
    the model and inputs) as they were, whatever the runs inside did to them."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    tensors = [*model.parameters(), *inputs]
    devices = sorted(
        {
            t.device.index or 0
            for t in tensors
            if isinstance(t, torch.Tensor) and t.device.type == "cuda"
        }
    )
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            with torch.no_grad():
                for buffer, saved in buffers:
                    buffer.copy_(saved)
