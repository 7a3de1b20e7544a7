"""pad-channels: grow a layer's output features / channels to the tensor-core granularity with
zero weights, and slice its output back.

Padded, where the size misses `hardware.alignment.align` on the target chip (`ctx.gpu`):
- nn.Linear out_features (the GEMM's N) -> PaddedLinear;
- nn.Embedding whose weight is the same Parameter as such a Linear's (a language model's
  lm_head tied to the token embedding) -> PaddedEmbedding, sharing the one padded Parameter:
  its lookups never reach the padded rows, so its forward is unchanged;
- nn.Conv2d out_channels (groups=1) -> PaddedConv2d.
Not padded: a Linear's in_features and a convolution's in_channels (K): that needs the input
padded, a copy of the activation at every call costing about what the aligned GEMM saves. A
convolution with fewer output channels than the granularity is refused: cuDNN pads tiny
channel counts itself (the audit's tc-align rule says so too). `optimize()` picks this
transform where the tc-align rule priced a saving; asked for by name it pads every misaligned
output size.

The granularity is that of the parameters' dtype; for fp32 parameters it is also that of bf16
and fp16 (their least common multiple: 8 on every catalog chip), since on a GPU fp32 models
mostly train under autocast or TF32, and one padding then serves every mode they run in, at a
few zero rows more.

Same function: the padded rows and bias are zeros, so the extra outputs are zeros and the
slice drops them; the kept rows are the original weights, so values are unchanged (up to the
GEMM's summation order), the padded rows' gradients are zero (an optimizer keeps them zero)
and the original rows' gradients are the unpadded model's. The output is a view of the padded
result (no copy): its shape is the original's, its row stride the padded one (`.view()` that
merges the last dimension with another then needs `.reshape()`). Embedding ids between the
original and the padded size, which raised before, read zero rows.

State dict: the original keys and shapes. Each padded module slices its padded tensors back
when saving and zero-pads loaded ones (its `_save_to_state_dict` / `_load_from_state_dict`,
the state_dict post-hook and load pre-hook kept as methods so deepcopy and pickling keep them):
the original checkpoint loads with strict=True into the padded model, and the padded model's
checkpoint into a fresh original.

Optimizer: the padded weights are new Parameter objects (their shape changes): create the
optimizer after `optimize()`; one made before holds the old Parameters, which no longer train.
Undo puts the original modules back, their original Parameters holding the current values (the
leading slice, on the padded ones' current device and dtype).

Refused with the reason: a Linear whose weight is shared with anything but a plain
nn.Embedding; modules with hooks; subclasses and wrappers (quantized, LoRA: anything not
exactly nn.Linear / nn.Conv2d / nn.Embedding, whose forward may read the weight's shape);
grouped convolutions (padding per group would reorder the channels).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from torch import nn

from ..hardware import GPUSpec, dtype_key
from ..hardware.alignment import granularity, round_up, target_gpu
from ._core import (
    Change,
    Holders,
    Outcome,
    Owners,
    Refusal,
    TransformContext,
    has_hooks,
    module_holders,
    param_owners,
    register_transform,
)
from ._padded import PADDED, PaddedEmbedding, _is_logical, _Padded, pad_rows
from ._padded import PaddedConv2d as PaddedConv2d  # re-exported from their home, _padded.py
from ._padded import PaddedLinear as PaddedLinear

ID = "pad-channels"
NEW_PARAMETERS = "new Parameter objects: create the optimizer after optimize()"


# ---- where parameters and modules live ---------------------------------------------------------
# ---- which layers, to what size ----------------------------------------------------------------
def _granularity(gpu: GPUSpec, kind: str, dtype: torch.dtype) -> int:
    """The dtype's granularity; fp32 parameters also take autocast's (see the docstring)."""
    key = dtype_key(dtype)
    keys = (key, "bf16", "fp16") if key == "fp32" else (key,)
    return math.lcm(*(granularity(kind, gpu, k) for k in keys))


def _target(module: nn.Module, gpu: GPUSpec) -> tuple[int, int, int] | None:
    """(rows, padded rows, granularity) of a Linear/Conv2d whose output size is misaligned."""
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or isinstance(w, nn.parameter.UninitializedParameter):
        return None
    if not w.is_floating_point() or w.dim() < 2:
        return None
    kind = "conv" if isinstance(module, nn.Conv2d) else "gemm"
    step = _granularity(gpu, kind, w.dtype)
    rows = w.shape[0]
    return (rows, round_up(rows, step), step) if rows % step else None


def _wrapper(module: nn.Module, holders: Holders) -> nn.Module | None:
    """The layer wrapping `module` as its base (peft's LoRA layers hold it as `base_layer`)."""
    for parent, name in holders.get(id(module), ()):
        if name == "base_layer" or hasattr(parent, "lora_A"):
            return parent
    return None


def _refusal(fqn: str, reason: str) -> Refusal:
    return Refusal(transform=ID, module=fqn, reason=reason)


def _layer_refusal(fqn: str, module: nn.Module, step: int, holders: Holders) -> str | None:
    """Why this misaligned layer itself cannot be padded (None: it can)."""
    if type(module) not in PADDED:
        base = "Conv2d" if isinstance(module, nn.Conv2d) else "Linear"
        return (
            f"a {type(module).__name__}, not a plain nn.{base}: its forward (quantized, "
            "adapter...) may read the weight's shape"
        )
    wrapper = _wrapper(module, holders)
    if wrapper is not None:
        return f"wrapped by a {type(wrapper).__name__}, which reads its weight's shape"
    if has_hooks(module):
        return "a hook is registered: it would see the padded tensors"
    if "forward" in module.__dict__:
        return "its forward is replaced on the instance (autocast): the padded layer would drop it"
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            return "a grouped convolution: padding per group would reorder its channels"
        if module.out_channels < step:
            return (
                f"{module.out_channels} output channels are fewer than {step}: the library pads "
                "them itself, so padding the model saves nothing"
            )
    return None


def _bias_holders(fqn: str, module: nn.Module, owners: Owners, ctx: TransformContext):
    """(modules that hold the layer's bias as a plain attribute, or the reason it cannot be
    padded). Hugging Face's masked-LM heads keep the decoder's bias as their own `bias` too
    (tied, so that resizing the vocabulary resizes both): such a holder, which computes
    nothing with it itself, gets the padded Parameter and saves its leading rows."""
    bias = getattr(module, "bias", None)
    if bias is None:
        return [], None
    others = [o for key, o in owners[id(bias)].items() if key != id(module)]
    for name, other, _attr in others:
        if isinstance(other, (nn.Linear, nn.Conv2d, nn.Embedding)) or has_hooks(other):
            return [], f"its bias is shared with {name or 'the root'} ({type(other).__name__})"
        if not ctx.allows(other, name):
            return [], f"its bias is shared with {name}, which filter_fn excludes"
    return others, None


def _tied(fqn: str, module: nn.Module, owners: Owners, ctx: TransformContext):
    """(embeddings sharing the Linear's weight, or the reason it cannot be padded)."""
    tied = [o for key, o in owners[id(module.weight)].items() if key != id(module)]
    for name, other, attr in tied:
        what = f"its weight is shared with {name or 'the root'} ({type(other).__name__})"
        if type(other) is not nn.Embedding or attr != "weight" or isinstance(module, nn.Conv2d):
            return [], f"{what}: only a tied plain nn.Embedding is padded with it"
        if has_hooks(other):
            return [], f"{what}, which has a hook: it would see the padded weight"
        if not ctx.allows(other, name):
            return [], f"{what}, which filter_fn excludes: tied weights are padded together"
    return tied, None


# ---- the rewrite -------------------------------------------------------------------------------
def _clone_as(module: nn.Module, cls: type) -> nn.Module:
    """A `cls` with the module's attributes (its own dicts: hooks and parameters stay apart)."""
    new = cls.__new__(cls)
    new.__dict__.update(
        {
            k: copy.copy(v) if isinstance(v, (dict, set, list)) else v
            for k, v in vars(module).items()
        }
    )
    return new


def _padded_parameter(p: nn.Parameter, rows: int) -> nn.Parameter:
    new = nn.Parameter(pad_rows(p.detach(), rows), requires_grad=p.requires_grad)
    new.__dict__.update(vars(p))  # attributes tagged on the Parameter (no-decay flags...)
    return new


def _copy_back(original: nn.Module, padded: nn.Module) -> None:
    """The padded module's current values (leading rows), device and dtype into the original
    module's own Parameter objects."""
    original.train(padded.training)
    for name, p in original._parameters.items():
        now = padded._parameters.get(name)
        if p is None or now is None:
            continue
        rows = p.shape[0]
        p.data = now.detach()[:rows].clone()
        p.requires_grad_(now.requires_grad)
        p.grad = None if now.grad is None else now.grad[:rows].clone()


def _swap(
    original: nn.Module, new: nn.Module, holders: Holders, out: Outcome
) -> Callable[[], nn.Module | None]:
    """Put `new` wherever `original` is held (the root: `out.root`); the undo."""
    places = holders.get(id(original), [])
    for parent, name in places:
        setattr(parent, name, new)
    if not places:
        out.root = new

    def undo() -> nn.Module | None:
        _copy_back(original, new)
        for parent, name in places:
            setattr(parent, name, original)
        return None if places else original

    return undo


def _pad_site(site: dict, holders: Holders, out: Outcome) -> None:
    fqn, module, rows, padded, step = (site[k] for k in ("fqn", "module", "rows", "padded", "step"))
    new = _clone_as(module, PADDED[type(module)])
    new.weight = _padded_parameter(module.weight, padded)
    if getattr(module, "bias", None) is not None:
        new.bias = _padded_parameter(module.bias, padded)
    size = "out_channels" if isinstance(module, nn.Conv2d) else "out_features"
    names = [name or "the root" for name, _, _ in site["tied"]]
    tied = f"; weight tied to {', '.join(names)}, padded with it" if names else ""
    out.changes.append(
        Change(
            transform=ID,
            module=fqn,
            detail=f"{size} {rows} -> {padded} (multiple of {step}): zero rows, output sliced "
            f"back{tied}; {NEW_PARAMETERS}",
            undo=_swap(module, new, holders, out),
        )
    )
    for name, holder, attr in site.get("bias_holders", ()):
        out.changes.append(_share_bias(name, holder, attr, new.bias, rows, fqn))
    for name, embedding, _ in site["tied"]:
        new_embedding = _clone_as(embedding, PaddedEmbedding)
        new_embedding.weight = new.weight  # the one padded Parameter: still tied
        out.changes.append(
            Change(
                transform=ID,
                module=name,
                detail=f"num_embeddings {rows} -> {padded}: shares {fqn or 'the root'}'s padded "
                f"weight (tied); {NEW_PARAMETERS}",
                undo=_swap(embedding, new_embedding, holders, out),
            )
        )


def _share_bias(
    name: str, holder: nn.Module, attr: str, padded: nn.Parameter, rows: int, layer: str
) -> Change:
    """`holder.attr` becomes the layer's padded bias (still tied); its state_dict entry keeps
    the logical rows and a logical one loads into it."""
    original = holder._parameters[attr]
    holder._parameters[attr] = padded

    def save(module, state_dict, prefix, local_metadata):
        t = state_dict.get(prefix + attr)
        if t is not None and t.shape[0] > rows:
            state_dict[prefix + attr] = t.narrow(0, 0, rows)

    def load(module, state_dict, prefix, *args):
        t = state_dict.get(prefix + attr)
        if _is_logical(t, module._parameters[attr], rows):
            state_dict[prefix + attr] = pad_rows(t, module._parameters[attr].shape[0])

    handles = [
        holder._register_state_dict_hook(save),
        holder.register_load_state_dict_pre_hook(load),
    ]

    def undo() -> None:
        for h in handles:
            h.remove()
        holder._parameters[attr] = original  # the layer's undo copies the values back into it

    return Change(
        transform=ID,
        module=name,
        detail=f"{attr}: the padded bias of {layer} (tied to it); state_dict keeps {rows} rows",
        undo=undo,
    )


def _site(fqn: str, module: nn.Module, gpu: GPUSpec, maps: tuple, ctx: TransformContext):
    """The rewrite planned for one module, a Refusal, or None (nothing to do)."""
    if isinstance(module, _Padded) or not isinstance(module, (nn.Linear, nn.Conv2d)):
        return None
    target = _target(module, gpu)
    if target is None or not ctx.allows(module, fqn):
        return None
    owners, holders = maps
    rows, padded, step = target
    reason = _layer_refusal(fqn, module, step, holders)
    tied: list = []
    bias_holders: list = []
    if reason is None:
        bias_holders, reason = _bias_holders(fqn, module, owners, ctx)
    if reason is None:
        tied, reason = _tied(fqn, module, owners, ctx)
    if reason is not None:
        return _refusal(fqn, reason)
    return {
        "fqn": fqn,
        "module": module,
        "rows": rows,
        "padded": padded,
        "step": step,
        "tied": tied,
        "bias_holders": bias_holders,
    }


@register_transform(ID, pays_under_compile=False)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    gpu = target_gpu(ctx.gpu)
    maps = (param_owners(model), module_holders(model))
    for fqn, module in list(model.named_modules()):
        site = _site(fqn, module, gpu, maps, ctx)
        if isinstance(site, Refusal):
            out.refusals.append(site)
        elif site is not None:
            _pad_site(site, maps[1], out)
    return out
