"""fused-optimizer: the same torch.optim optimizer, stepping with fused=True (or foreach=True).

A for-loop optimizer launches a handful of kernels per parameter tensor; foreach launches them
once per list of tensors; fused runs the whole update in one kernel per device and dtype group
(the optimizer-not-fused rule prices the difference). The implementation is a constructor
option, so the fix is a new optimizer of the same class over the same param_groups (learning
rates, weight decay and every other option kept per group) and the same state (moments,
momentum buffers, step counts), so training continues where it was.

`fused=True` where torch has a fused kernel for the class and for these parameters (floating
point, on a device torch lists for fused kernels: torch's own choice,
`_default_to_fused_or_foreach`); otherwise `foreach=True` where the parameters are on a device
with foreach kernels (CUDA; torch's foreach on the CPU is the same loop); otherwise unchanged.

The new optimizer takes over the old one's state tensors without copying them (no second copy
of Adam's moments on the GPU): step only the new one from then on. An LR scheduler holds the
optimizer it was built with: build it again on the new one. Optimizers with step hooks, and
classes from outside torch.optim (their constructors may differ), are not rebuilt.
"""

from __future__ import annotations

import inspect

import torch

from ._core import TransformError

ID = "fused-optimizer"

try:  # torch's own test of which parameters the fused / foreach kernels take
    from torch.optim.optimizer import _default_to_fused_or_foreach
except ImportError:  # pragma: no cover - older or newer torch without it
    _default_to_fused_or_foreach = None


def accepts(optimizer: torch.optim.Optimizer, option: str) -> bool:
    """Whether the optimizer's class takes `option` in its constructor."""
    return option in inspect.signature(type(optimizer).__init__).parameters


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def _torch_would(params: list[torch.Tensor], fused: bool) -> tuple[bool, bool]:
    """(fused, foreach): what torch's kernels take for these parameters."""
    if _default_to_fused_or_foreach is not None:
        return _default_to_fused_or_foreach(params, False, use_fused=fused)
    on = {p.device.type for p in params}
    floating = all(torch.is_floating_point(p) for p in params)
    use_fused = fused and floating and on <= {"cuda", "cpu", "xpu", "mps"}
    return use_fused, not use_fused and on <= {"cuda", "xpu"}


def _step_value(value, param: torch.Tensor, on_device: bool, fused: bool):
    """A state's `step` where the rebuilt optimizer keeps it: on the parameter's device as a
    float32 tensor when fused or capturable (torch's rule), left where it was otherwise."""
    if not on_device:
        return value
    wide = not fused and torch.get_default_dtype() == torch.float64
    dtype = torch.float64 if wide else torch.float32
    if not isinstance(value, torch.Tensor):
        return torch.tensor(float(value), dtype=dtype, device=param.device)
    return value.to(dtype=dtype, device=param.device)


def rebuild(optimizer: torch.optim.Optimizer, **options) -> torch.optim.Optimizer:
    """A new optimizer of the same class over the same param_groups, with `options` set in every
    group and the state carried over (shared, not copied). Options the class does not take are
    dropped; the constructor's own checks raise as usual."""
    cls = type(optimizer)
    taken = inspect.signature(cls.__init__).parameters
    options = {k: v for k, v in options.items() if k in taken}
    defaults = {k: v for k, v in optimizer.defaults.items() if k in taken} | options
    groups = [{**g, **options} for g in optimizer.param_groups]
    new = cls(groups, **defaults)
    for group in new.param_groups:
        on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            old = optimizer.state.get(p)
            if old:
                new.state[p] = {
                    k: _step_value(v, p, on_device, bool(group.get("fused"))) if k == "step" else v
                    for k, v in old.items()
                }
    return new


def _check_rebuildable(optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TransformError(
            f"{ID}: {type(optimizer).__name__} is not a torch.optim optimizer; construct it with "
            "its library's fused option"
        )
    module = type(optimizer).__module__
    if not module.startswith("torch.optim"):
        raise TransformError(
            f"{ID}: {type(optimizer).__name__} ({module}) is not one of torch.optim's classes: "
            "its constructor may take other options, so it is not rebuilt"
        )


def _has_step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    names = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")
    return any(getattr(optimizer, n, None) for n in names)


def _defaults_to_foreach(group: dict) -> bool:
    """Whether torch picks foreach for this group by itself (neither option given; a tensor
    learning rate keeps the for-loop unless capturable)."""
    tensor_lr = isinstance(group.get("lr"), torch.Tensor) and not group.get("capturable")
    return group.get("foreach") is None and group.get("fused") is None and not tensor_lr


def _plan(optimizer: torch.optim.Optimizer) -> tuple[dict, str]:
    """The options to rebuild with (empty: leave it) and why, in one line."""
    name = type(optimizer).__name__
    groups = optimizer.param_groups
    params = _params(optimizer)
    if groups and all(g.get("fused") for g in groups):
        return {}, f"{name} unchanged: already fused"
    if any(g.get("differentiable") for g in groups):
        return {}, f"{name} unchanged: differentiable=True has no fused or foreach implementation"
    if _has_step_hooks(optimizer):
        return {}, f"{name} unchanged: it has step hooks, which a new optimizer would not carry"
    devices = ", ".join(sorted({p.device.type for p in params})) or "no parameters"
    if accepts(optimizer, "fused") and params and _torch_would(params, True)[0]:
        return {"fused": True, "foreach": None}, (
            f"{name}: fused=True (one kernel per device and dtype group for "
            f"{len(params)} parameter tensors on {devices}); state carried over"
        )
    why_not = (
        f"{name} has no fused implementation"
        if not accepts(optimizer, "fused")
        else f"the fused {name} does not take these parameters (non-floating or on {devices})"
    )
    if not (accepts(optimizer, "foreach") and params and _torch_would(params, False)[1]):
        return {}, f"{name} unchanged: {why_not}, and no foreach kernels for {devices}"
    if all(g.get("foreach") for g in groups):
        return {}, f"{name} unchanged: already foreach; {why_not}"
    if all(_defaults_to_foreach(g) for g in groups):
        return {}, f"{name} unchanged: already foreach (torch's default on {devices}); {why_not}"
    return {"foreach": True, "fused": None}, (
        f"{name}: foreach=True ({why_not}); state carried over"
    )


def fuse_optimizer(optimizer: torch.optim.Optimizer) -> tuple[torch.optim.Optimizer, str]:
    """`optimizer` rebuilt with fused=True, else foreach=True, else as it was; with one line
    saying what was done and why. Raises TransformError for optimizers outside torch.optim."""
    _check_rebuildable(optimizer)
    options, why = _plan(optimizer)
    if not options:
        return optimizer, why
    try:
        return rebuild(optimizer, **options), why
    except (RuntimeError, ValueError) as exc:  # the constructor's own checks (tensor lr, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return optimizer, f"{type(optimizer).__name__} unchanged: torch refused it: {first}"
