"""autocast-bf16: the model's forward under torch.autocast, its parameters kept in float32.

Mixed precision as users mean it: matmuls and convolutions run in bf16 on tensor cores while
the weights stay float32 (master weights: the optimizer updates them at full precision) and
autocast keeps its float32 list (softmax, norms, losses, reductions) in float32. The dtype is
bf16 where the target chip (`ctx.gpu`, else `torch.cuda.is_bf16_supported()`) has bf16 tensor
cores, fp16 where it has none. The device type is read at each call from the tensors the
forward gets ("cuda", "cpu", ...), so a model wrapped on the CPU and moved to the GPU autocasts
there; the CPU runs the same dtype, so the numeric gate checks what the chip will compute.

How: `module.forward` is replaced on the instance by an `AutocastForward` holding the module (an
object, not a closure, so that a deep copy or a pickled model wraps its own copy) and calling the
forward it found: the class's, or one another tool put on the instance (a checkpoint, a
masked-LM head), which then runs inside autocast. The class, the Parameters and the state_dict
are untouched (keys, dtypes and values); undo puts back the forward it found. Without `filter_fn`
the root is wrapped; with one, each outermost module it allows (autocast is a context:
everything called inside a wrapped module runs under it).

Outputs: floating outputs left in the autocast dtype come back as float32. A module outside the
wrapped part would otherwise get bf16 tensors against its float32 weights (a dtype error), and a
loss computed after the forward would run in bf16: torch.amp's advice is to compute the loss
under autocast, which runs softmax, log_softmax and the cross-entropy losses in float32; out here
the cast gives the loss the float32 logits it had before. Cost: one cast of each output forward
and one of its gradient backward (a language model's logits: B x T x vocabulary elements).

fp16: training in fp16 needs a `torch.amp.GradScaler` around the optimizer step (small gradients
underflow), which a model rewrite cannot add. On a chip without bf16, `optimize(train=True)`
therefore refuses, saying so; `autocast_model(model, torch.float16)` applies it when asked for
explicitly (the scaler is then the caller's). Inference in fp16 is applied, and the change says
fp16.

TF32 is left out: `torch.backends.cuda.matmul.allow_tf32` and `cudnn.allow_tf32` are switches of
the process, not of a model; a rewrite that flipped them would change every other model's math
and could not be undone per model. Set them (or `torch.set_float32_matmul_precision("high")`)
yourself: the audit reads them, and fp32-math then prices TF32.

Refused, with the reason: parameters already in bf16/fp16 (nothing to do) or float64 (autocast
leaves float64 alone); a forward already under autocast (a `torch.autocast` decorator on the
class's forward or on one replaced on the instance); hooks on a module inside the wrapped one
(they would see bf16 tensors where they saw float32). Hooks on the wrapped module itself still
see what they saw: the inputs as given, float32 outputs. A torch.fx GraphModule (fuse-norm-act
rewrites parents into them) rebuilds itself from its graph when deep-copied: the wrapper is
also kept in its `meta` under the key torch.fx restores attributes from.

The audit traces on the meta device, where autocast does nothing: it sees autocast through
`audit_flags` (optimize passes them) when the whole model is wrapped; a model wrapped in parts
is still priced in float32 there (fp32-math keeps firing: conservative). Under torch.compile
dynamo keeps the autocast context and Inductor does not lower fp32 matmuls by itself, so the
transform pays there too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from ..auditing.api import model_dtype
from ..auditing.context import BackendFlags
from ..hardware import dtype_key
from ._core import (
    Change,
    FilterFn,
    Outcome,
    Refusal,
    TransformContext,
    has_hooks,
    register_transform,
    remember,
)

ID = "autocast-bf16"
LOW = (torch.bfloat16, torch.float16)
PRESERVED = getattr(fx.graph_module, "_USER_PRESERVED_ATTRIBUTES_KEY", "_user_preserved_attributes")


class AutocastForward:
    """`module.forward` while the transform is in place: the class's forward under
    torch.autocast, floating outputs in the autocast dtype cast back to float32."""

    def __init__(self, module: nn.Module, dtype: torch.dtype, inner: Any = None):
        self.module = module
        self.autocast_dtype = dtype
        """Read by the numeric gate (`_verify.compute_dtype`) and by `audit_flags`."""
        self.inner = inner
        """The forward found on the instance (None: the class's)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, dtype = self.module, self.autocast_dtype
        if self.inner is not None:
            forward, args = self.inner, args
        else:
            forward, args = type(module).forward, (module, *args)
        device = _device_type(module, args, kwargs)
        if device is None:  # meta tensors (gpushape's own trace): autocast does nothing there
            return forward(*args, **kwargs)
        with torch.autocast(device, dtype=dtype):
            out = forward(*args, **kwargs)
        return pytree.tree_map(lambda v: _to_float32(v, dtype), out)

    def __repr__(self) -> str:
        return f"AutocastForward({type(self.module).__name__}, {self.autocast_dtype})"


def _to_float32(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == dtype:
        return value.float()
    return value


def _device_type(module: nn.Module, args: tuple, kwargs: dict) -> str | None:
    """The device type of the first floating tensor argument (else of the first parameter or
    buffer), when autocast runs there."""
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    first = next((t for t in tensors if t.is_floating_point()), None)
    if first is None:
        first = next(iter([*module.parameters(), *module.buffers()]), None)
    if first is None:
        return None
    kind = first.device.type
    return kind if torch.amp.is_autocast_available(kind) else None


def wrapped(module: nn.Module) -> AutocastForward | None:
    forward = module.__dict__.get("forward")
    return forward if isinstance(forward, AutocastForward) else None


def choose_dtype(gpu: Any) -> torch.dtype:
    """bf16 where the chip has bf16 tensor cores, else fp16; with no chip named, the CUDA
    device's answer, else bf16 (the CPU's autocast dtype)."""
    if gpu is not None:
        return torch.bfloat16 if gpu.has_tensor_cores("bf16") else torch.float16
    if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def audit_flags(model: nn.Module) -> BackendFlags | None:
    """The flags an audit of `model` runs with: this process's, with autocast's dtype when the
    model's whole forward runs under it (the meta trace cannot see autocast); None when it
    does not (the audit's default)."""
    forward = wrapped(model)
    if forward is None:
        return None
    return BackendFlags.current(autocast=dtype_key(forward.autocast_dtype))


# ---- which modules, and why not ----------------------------------------------------------------
def _sites(model: nn.Module, filter_fn: FilterFn | None) -> list[tuple[str, nn.Module]]:
    """The outermost modules `filter_fn` allows (the root without one); containers without a
    forward of their own (ModuleList, ModuleDict) are looked into."""
    sites: list[tuple[str, nn.Module]] = []
    for fqn, module in model.named_modules():
        if any(fqn.startswith(f"{done}.") or not done for done, _ in sites):
            continue
        if type(module).forward is nn.Module.forward:
            continue
        if filter_fn is None or filter_fn(module, fqn):
            sites.append((fqn, module))
    return sites


def _autocast_decorated(fn: Any) -> bool:
    """Whether a forward is, or wraps, a function `torch.autocast(...)` decorated (through
    bound methods, functools.partial and functools.wraps)."""
    for _ in range(32):  # a chain of wrappers, not a cycle
        fn = getattr(fn, "__func__", None) or getattr(fn, "func", None) or fn
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_name == "decorate_autocast":
            return True
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            return False
    return False


def _hooked_inside(module: nn.Module, fqn: str) -> str | None:
    for name, inner in module.named_modules():
        if name and has_hooks(inner):
            return f"{fqn}.{name}" if fqn else name
    return None


def _refusal(fqn: str, module: nn.Module) -> str | None:
    """Why this module's forward is not wrapped (None: it can be)."""
    dtype = model_dtype(module)
    if dtype in LOW:
        return f"its parameters are {dtype} already: its matmuls run in {dtype}, nothing to do"
    if dtype == torch.float64:
        return "float64 parameters: autocast leaves float64 ops alone"
    if _autocast_decorated(module.forward):
        return "its forward already runs under torch.autocast (a decorator)"
    hooked = _hooked_inside(module, fqn)
    if hooked is not None:
        return f"a hook on {hooked} would see bf16/fp16 tensors where it saw float32 ones"
    return None


# ---- applying ------------------------------------------------------------------------------------
def _kept_by_deepcopy(module: nn.Module) -> dict:
    """Where a GraphModule keeps attributes across deep copies (it rebuilds itself from the
    graph, dropping the rest of its __dict__); an unused dict for other modules."""
    if not isinstance(module, fx.GraphModule):
        return {}
    return module.meta.setdefault(PRESERVED, {})


def _wrap(module: nn.Module, fqn: str, dtype: torch.dtype, note: str) -> Change:
    inner = module.__dict__.get("forward")
    forward = module.forward = AutocastForward(module, dtype, inner)
    kept = _kept_by_deepcopy(module)
    kept_before = kept.get("forward")
    kept["forward"] = forward

    def undo() -> None:
        if module.__dict__.get("forward") is not forward:
            return  # another wrapper went on top, and is undone first (last first)
        if inner is None:
            del module.__dict__["forward"]
        else:
            module.forward = inner
        if kept_before is None:
            kept.pop("forward", None)
        else:
            kept["forward"] = kept_before

    return Change(
        transform=ID,
        module=fqn,
        detail=f"forward under torch.autocast({dtype}), parameters float32, outputs back to "
        f"float32{note}",
        undo=undo,
    )


def _wrap_all(model: nn.Module, dtype: torch.dtype, filter_fn: FilterFn | None, note="") -> Outcome:
    out = Outcome()
    for fqn, module in _sites(model, filter_fn):
        if wrapped(module) is not None:
            continue  # wrapped already: twice = once
        reason = _refusal(fqn, module)
        if reason is not None:
            out.refusals.append(Refusal(transform=ID, module=fqn, reason=reason))
        else:
            out.changes.append(_wrap(module, fqn, dtype, note))
    return out


FP16_TRAINING = (
    "this chip has no bf16 tensor cores, and training in fp16 needs a torch.amp.GradScaler "
    "around the optimizer step, which a model rewrite cannot add: call "
    "gpushape.transforms.autocast.autocast_model(model, torch.float16) and scale the loss yourself"
)


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    dtype = choose_dtype(ctx.gpu)
    if dtype == torch.float16 and ctx.train:
        if not any(wrapped(m) for m in model.modules()):
            return Outcome(refusals=[Refusal(transform=ID, module="", reason=FP16_TRAINING)])
        return Outcome()
    note = "; fp16: this chip has no bf16 tensor cores" if dtype == torch.float16 else ""
    return _wrap_all(model, dtype, ctx.filter_fn, note)


def autocast_model(
    model: nn.Module, dtype: torch.dtype = torch.bfloat16, *, filter_fn: FilterFn | None = None
) -> Outcome:
    """Wrap `model` (or the outermost modules `filter_fn` allows) in autocast to `dtype`, as
    asked: fp16 for training included, whose GradScaler is then the caller's. The changes are
    logged for `gpushape.transforms.revert(model)`; nothing is checked numerically (optimize
    does that)."""
    if dtype not in LOW:
        raise ValueError(f"autocast_model: dtype torch.bfloat16 or torch.float16, not {dtype}")
    note = "; fp16 training needs a torch.amp.GradScaler" if dtype == torch.float16 else ""
    out = _wrap_all(model, dtype, filter_fn, note)
    remember(model, out.changes)
    return out
