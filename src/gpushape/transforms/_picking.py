"""Which fixes optimize() applies, in which order, and where: the findings' fixes (or the ones
asked for by name), the step-level ones it leaves to the training step, and the sites of a fix
whose finding saves nothing in the mode while another finding of the same fix pays.

`out` is the OptimizeReport being filled (`predicted_saving_s`, `skipped`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from ._core import Refusal, TransformContext, get_transform, load_transforms

# Structural rewrites first (they change which modules exist), layouts next; masked-lm-head
# last: it replaces the whole forward (for a labelled batch; the audit traces a training step
# with labels, models/labels.py, so the audits after it see its saving).
ORDER = (
    # first: a correctness guard (pytorch#188344) in place before anything makes a padded
    # average pool's input channels_last (fuse-group-norm's GroupNormAct, channels-last)
    "safe-avg-pool",
    "pad-channels",
    "fuse-qkv",
    "sdpa",
    "no-kv-cache",  # before skip-attention-mask: it reads positions as unpacked itself
    "skip-attention-mask",
    "fuse-activation",
    "fuse-norm-act",
    "fuse-dropout-add-norm",  # a BERT-style block output's forward, on its instance
    "fuse-grn",
    "fuse-group-norm",  # before graph-layers (applied after these), which captures the layers
    "fast-max-pool",  # after fuse-norm-act's fx rewrite, which keeps nn.MaxPool2d a module
    "s2d-stem",  # likewise: the fx rewrite keeps nn.Conv2d a module
    "channels-last",
    "masked-lm-head",
    # last: autocast wraps the forward of the model the others left (a module they replace,
    # or the root fuse-norm-act rewrites with fx, would lose its wrapper) and a forward
    # replaced on the instance (masked-lm-head's) runs inside it. Nothing before it depends
    # on the dtype it brings: pad-channels pads float32 layers to bf16's granularity anyway,
    # the fusions match structure; its own check runs their kernels in bf16.
    "autocast-bf16",
)

# Fixes of the training step rather than the model: optimize rewrites the model, and says where
# the step's own fix lives.
STEP_LEVEL = {
    "cuda-graphs": "a fix of the training step, not the model: capture the step with "
    "gpushape.transforms.capture_step (`gpushape bench --vs graph` times it)",
}


def pick(report: Any, asked: list[str] | None, mode: str, out: Any) -> list[str]:
    """Transform ids to apply, in ORDER: the ones asked for, or the fixes the findings name."""
    known = load_transforms()
    if asked is not None:
        for tid in asked:
            get_transform(tid)  # unknown ids fail loudly, with the list
        return [t for t in ORDER if t in asked] + [t for t in asked if t not in ORDER]
    # Every fix with a transform is applied, overlapping ones too: where one fix removes the
    # ops another targets (SDPA replacing a softmax that fuse-softmax-dropout would fuse), the
    # later transform finds nothing left to change; where they complement each other
    # (channels_last and fused BatchNorm), both pay.
    wanted = []
    for f in report.findings:
        if not worth(f):
            continue
        out.predicted_saving_s[f.fix] = out.predicted_saving_s.get(f.fix, 0.0) + f.est_saving_s
        if f.fix in STEP_LEVEL:
            out.skipped.append(Refusal(transform=f.fix, module=f.module, reason=STEP_LEVEL[f.fix]))
        elif f.fix not in known:
            out.skipped.append(
                Refusal(transform=f.fix, module=f.module, reason="no transform for this fix yet")
            )
        elif mode == "compile" and not known[f.fix].pays_under_compile:
            out.skipped.append(
                Refusal(transform=f.fix, module=f.module, reason="torch.compile already does this")
            )
        elif f.fix not in wanted:
            wanted.append(f.fix)
    return sorted(wanted, key=lambda t: ORDER.index(t) if t in ORDER else len(ORDER))


def quiet_sites(report: Any, mode: str, out: Any) -> dict[str, set[str]]:
    """Per fix, the parent modules of its findings that save nothing in `mode` where another
    finding of the same fix pays (separate-qkv: an attention with rotary embeddings under
    torch.compile, beside a gated MLP): the transform leaves those sites alone."""
    quiet: dict[str, set[str]] = {}
    for f in report.findings:
        why = (f.evidence.get("why_quiet") or {}).get(mode)
        parents = f.evidence.get("parents")
        if f.fix and why and parents and not worth(f):
            quiet.setdefault(f.fix, set()).update(parents)
            out.skipped.append(Refusal(transform=f.fix, module=f.module, reason=why))
    return quiet


def without(ctx: TransformContext, parents: set[str]) -> TransformContext:
    """`ctx` whose filter also refuses the children of `parents`."""
    user = ctx.filter_fn

    def allowed(module: nn.Module, fqn: str) -> bool:
        if fqn.rpartition(".")[0] in parents:
            return False
        return user is None or bool(user(module, fqn))

    return dataclasses.replace(ctx, filter_fn=allowed)


def held_back(report: Any, picked: list[str]) -> list[str]:
    """Fixes to look at again once `picked` are applied: channels-last, where the audit of the
    model as given found converting saves nothing because ops in it return NCHW tensors (the
    nchw-conv finding's `return_nchw`, auditing/layout_check.py). A picked fix may replace
    those ops with kernels that keep channels_last (fuse-group-norm's GroupNormAct for
    PyTorch's GroupNorm, which returns NCHW whatever it is given): the model the fixes leave is
    then audited again and channels-last applied where that audit says it pays."""
    return [
        f.fix
        for f in report.findings
        if f.rule == "nchw-conv"
        and f.fix
        and f.fix not in picked
        and f.evidence.get("return_nchw")
        and not worth(f)
    ][:1]


def now_worth(report: Any, fixes: list[str]) -> dict[str, float]:
    """Of `fixes`, those `report` (an audit of the rewritten model) finds worth applying, with
    their predicted saving."""
    found: dict[str, float] = {}
    for f in report.findings:
        if f.fix in fixes and worth(f):
            found[f.fix] = found.get(f.fix, 0.0) + f.est_saving_s
    return found


def worth(f: Any) -> bool:
    return bool(f.fix and f.est_saving_s and f.est_saving_s > 0)
