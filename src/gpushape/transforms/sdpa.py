"""sdpa: attention that libraries can run either way, switched to scaled_dot_product_attention.

- Hugging Face models loaded with `attn_implementation="eager"` (softmax(QK^T)V written out, the
  score matrix through memory several times) are switched to "sdpa" with
  `model.set_attn_implementation("sdpa")`, where the model class supports it.
- timm modules with a `fused_attn` switch that is off get it on.

Both are the libraries' own code paths, selected by their own switches: no module is replaced,
Parameters and the state_dict are untouched, and undo turns the switch back. Attention written
by hand in a user's own module is not rewritten (its masks and layouts are the user's code):
the manual-attention finding says what to write instead. The numeric check runs with dropout
off, since the two paths draw their dropout masks differently (`_verify.py`).
"""

from __future__ import annotations

from torch import nn

from ._core import Change, Outcome, Refusal, TransformContext, register_transform

ID = "sdpa"


def _hf_switch(model: nn.Module, fqn: str, out: Outcome) -> bool:
    """Switch a Hugging Face model's eager attention to sdpa; True when it is one."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        return False
    if getattr(config, "_attn_implementation", None) != "eager":
        return True
    if not getattr(model, "_supports_sdpa", False):
        out.refusals.append(
            Refusal(transform=ID, module=fqn, reason=f"{type(model).__name__} has no sdpa path")
        )
        return True
    model.set_attn_implementation("sdpa")
    out.changes.append(
        Change(
            transform=ID,
            module=fqn,
            detail="Hugging Face attention: eager -> sdpa (set_attn_implementation)",
            undo=lambda: model.set_attn_implementation("eager"),
        )
    )
    return True


def _timm_switch(module: nn.Module, fqn: str, out: Outcome) -> None:
    if not type(module).__module__.startswith("timm.") or module.fused_attn is not False:
        return
    module.fused_attn = True
    out.changes.append(
        Change(
            transform=ID,
            module=fqn,
            detail="timm attention: fused_attn on",
            undo=lambda: setattr(module, "fused_attn", False),
        )
    )


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    for fqn, module in model.named_modules():
        if not ctx.allows(module, fqn):
            continue
        if _hf_switch(module, fqn, out):
            break  # one switch sets the whole model (its sub-models share the setting)
        if hasattr(module, "fused_attn"):
            _timm_switch(module, fqn, out)
    return out
