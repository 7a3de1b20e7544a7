"""Real timm models through `gpushape.optimize` on the CPU, built small with pretrained=False:
a ResNet (timm's Bottleneck, ResNet-50's block: BatchNorm2d -> ReLU, and BatchNorm2d ->
residual add -> ReLU), the same blocks with timm's GroupNorm (ResNet-50-GN's: GroupNorm ->
ReLU, and GroupNorm -> residual add), MobileNetV3 (depthwise convolutions, squeeze-excite,
timm's own BatchNormAct2d with ReLU and Hardswish), a ViT (timm's `fused_attn` switch, a width that
misses the tensor-core alignment) and ConvNeXt-V2 (its GRN over channels-last and over NCHW
tensors, weights drawn at random: timm's are zeros, which would make it the identity).

For each, with the transforms that run on the CPU: every applied transform passes the numeric
gate in training (outputs and every original parameter's gradient, `transforms/_verify.py`) and
the rewritten model passes it again in eval mode on other inputs; the original state_dict loads
with strict=True and the rewritten model saves in the original layout; a second optimize
changes nothing; revert gives the original model back exactly; the audit of the rewritten model
no longer raises what was fixed, including what timm writes its own way (timm's LayerNorm
subclass, its drop_block Identity between norm and activation, 1x1 squeeze-excite convolutions
whose weights are contiguous both ways).

The ResNet's fused BatchNorms and ConvNeXt-V2's GRNs run as CI runs every kernel on the CPU, in
Triton's interpreter (with TRITON_INTERPRET=1); the other models' run their plain-PyTorch
reference, as without TRITON_INTERPRET: in the interpreter MobileNetV3's 23 fused BatchNorms
alone take about 45 s, and tests/kernel_ops checks the ReLU and Hardswish kernels in the
interpreter on their own.
"""

from __future__ import annotations

import copy
import fnmatch

import pytest
import torch
from torch import nn

from gpushape.auditing.api import audit
from gpushape.kernels import _dispatch
from gpushape.transforms import (
    TransformContext,
    applied,
    get_transform,
    optimize,
    revert,
    verify,
)
from gpushape.transforms._verify import reference

try:
    import timm
except Exception as exc:  # not installed, or its torchvision does not import with this torch
    pytest.skip(f"timm does not import here: {type(exc).__name__}: {exc}", allow_module_level=True)

# Every module-level transform that runs on the CPU (activation-checkpoint needs a budget).
CPU_TRANSFORMS = ["pad-channels", "fuse-qkv", "sdpa", "fuse-activation", "fuse-norm-act",
                  "fuse-grn", "fuse-group-norm", "channels-last"]  # fmt: skip
# name -> (timm model, create_model options, image size, transforms that must apply)
MODELS = {
    "resnet": (
        "resnet26",  # Bottleneck blocks; one a stage, narrow
        dict(layers=(1, 1, 1, 1), channels=(8, 8, 16, 16), stem_width=16),
        64,
        {"pad-channels", "fuse-norm-act", "channels-last"},
    ),
    # ResNet-50-GN's blocks (timm's GroupNorm, 32 groups: 32 channels at least) made narrow
    "resnet-gn": (
        "resnet50_gn",
        dict(layers=(1, 1, 1, 1), channels=(32, 32, 32, 32), stem_width=32),
        32,
        {"fuse-group-norm", "channels-last"},
    ),
    "mobilenetv3": ("mobilenetv3_small_050", {}, 64, {"fuse-norm-act", "channels-last"}),
    "vit": (
        "vit_tiny_patch16_224",  # width 100 and 10 classes: off the alignment of 8
        dict(img_size=32, patch_size=8, embed_dim=100, depth=2, num_heads=2),
        32,
        {"pad-channels", "sdpa", "fuse-norm-act", "channels-last"},
    ),
    # ConvNeXt-V2: depthwise convolutions, GRN in the MLP over (N, H, W, C) (conv_mlp=False,
    # as ConvNeXt-V2-Tiny and up) and over (N, C, H, W) (conv_mlp=True, as atto to nano)
    "convnextv2": (
        "convnextv2_atto",
        dict(depths=(1, 1, 1, 1), dims=(16, 24, 32, 40), conv_mlp=False),
        64,
        {"fuse-grn", "channels-last"},
    ),
    "convnextv2-conv-mlp": (
        "convnextv2_atto",
        dict(depths=(1, 1, 1, 1), dims=(16, 24, 32, 40), conv_mlp=True),
        64,
        {"fuse-grn", "channels-last"},
    ),
}
KERNELS_INTERPRETED = ("resnet", "convnextv2", "convnextv2-conv-mlp")
# The finding each transform clears.
RULE_OF = {
    "fuse-norm-act": "unfused-norm-act",
    "channels-last": "nchw-conv",
    "fuse-grn": "unfused-grn",
    "fuse-group-norm": "slow-group-norm",
}


def _build(name: str, batch: int = 2, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    arch, options, size, _ = MODELS[name]
    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False, num_classes=10, **options)
    if name == "vit":  # attention written out, as `timm:...?attn=eager` builds it
        for module in model.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = False
    for module in model.modules():  # GRN: trained-like weights, not timm's zeros
        if type(module).__name__ == "GlobalResponseNorm":
            nn.init.normal_(module.weight), nn.init.normal_(module.bias)
    return model, torch.randn(batch, 3, size, size)


def _apply(tid: str, model: nn.Module, x: torch.Tensor):
    """One transform alone (no numeric check, no audit): the model and its outcome."""
    outcome = get_transform(tid).apply(model, TransformContext(example_inputs=(x,)))
    return outcome.root or model, outcome


def _audit(model: nn.Module, x: torch.Tensor):
    return audit(model, (x,), "h200", dtype=torch.float32, train=True)


def _named(finding) -> list[str]:
    return [finding.module, *finding.evidence.get("modules", [])]


def _names(model: nn.Module, finding) -> set[str]:
    """The model's modules a finding names (its pattern and its evidence's list)."""
    patterns = [p for p in _named(finding) if p]
    return {n for n, _ in model.named_modules() if any(fnmatch.fnmatchcase(n, p) for p in patterns)}


def _saving(report, rule: str) -> float:
    return sum(f.est_saving_s for f in report.findings if f.rule == rule)


@pytest.mark.parametrize("name", MODELS)
def test_optimized_checked_same_checkpoint_idempotent_and_reverted(name, monkeypatch):
    if (
        name not in KERNELS_INTERPRETED
    ):  # the kernels' reference; TRITON_INTERPRET itself stays as it is:
        # Triton reads it when a kernel module is imported, and a kernel imported without it
        # would fail under the interpreter in the tests that follow in this process
        monkeypatch.setattr(_dispatch, "interpreting", lambda: False)
    model, x = _build(name)
    pristine = copy.deepcopy(model)
    params = dict(model.named_parameters())
    strides = {k: p.stride() for k, p in params.items()}
    layout = [(n, type(m), getattr(m, "fused_attn", None)) for n, m in model.named_modules()]

    optimized, report = optimize(
        model, (x,), gpu="h200", dtype=torch.float32, transforms=CPU_TRANSFORMS
    )

    # Applied where it should, each transform checked in training and kept.
    done = {c.transform for c in report.applied}
    assert done >= MODELS[name][3] and not report.rolled_back, (done, report.rolled_back)
    for tid in done:
        check = report.verified[tid]
        assert check.passed and check.checked > len(params), (tid, check)

    # The same function in eval mode (running statistics) on another batch.
    torch.manual_seed(1)
    other = (torch.randn(3, *x.shape[1:]),)
    ref = reference(copy.deepcopy(pristine).eval(), other)
    again = verify(copy.deepcopy(optimized).eval(), other, ref)
    assert again.passed and again.checked > len(params), again

    # The checkpoint: original keys and shapes both ways.
    sd, original = optimized.state_dict(), pristine.state_dict()
    assert {k: v.shape for k, v in sd.items()} == {k: v.shape for k, v in original.items()}
    copy.deepcopy(optimized).load_state_dict(original, strict=True)
    copy.deepcopy(pristine).load_state_dict(sd, strict=True)
    assert all(torch.equal(sd[k], v) for k, v in original.items())

    # The audit no longer raises what was fixed.
    for tid, rule in RULE_OF.items():
        if tid in done:
            assert _saving(report.after, rule) < 0.5 * _saving(report.before, rule), rule
    fused = {c.module for c in report.applied if c.transform == "fuse-norm-act"}
    for f in report.after.findings:
        if f.rule == "unfused-norm-act":
            assert not fused & _names(optimized, f), f.module

    # Twice equals once.
    second, report2 = optimize(
        optimized, (x,), gpu="h200", dtype=torch.float32, transforms=CPU_TRANSFORMS
    )
    assert second is optimized and not report2.applied and not report2.rolled_back
    assert all(torch.equal(second.state_dict()[k], v) for k, v in original.items())

    # Revert: the very model given, its modules, Parameters, strides and switches as they were.
    restored = revert(optimized)
    assert restored is model and not applied(restored)
    assert [(n, type(m), getattr(m, "fused_attn", None)) for n, m in restored.named_modules()] == (
        layout
    )
    assert dict(restored.named_parameters()) == params  # the same Parameter objects
    assert {k: p.stride() for k, p in restored.named_parameters()} == strides
    assert not restored._forward_pre_hooks
    for k, v in original.items():
        assert torch.equal(restored.state_dict()[k], v), k
    with torch.no_grad():
        assert torch.equal(restored.eval()(other[0]), pristine.eval()(other[0]))


def test_resnet_fuses_the_stem_and_every_block_s_first_and_residual_norm():
    model, x = _build("resnet")
    model, outcome = _apply("fuse-norm-act", model, x)
    fused = {c.module for c in outcome.changes}
    blocks = {f"layer{i}.0.bn{j}" for i in range(1, 5) for j in (1, 3)}
    assert fused >= {"bn1", *blocks}
    residual = {c.module for c in outcome.changes if "residual add +" in c.detail}
    assert residual == {f"layer{i}.0.bn3" for i in range(1, 5)}
    shortcut = {c.module for c in outcome.changes if "no activation" in c.detail}
    assert shortcut == {f"layer{i}.0.downsample.1" for i in range(1, 5)}


def test_resnet_norm_before_drop_block_is_fused():
    """timm's Bottleneck calls drop_block, an nn.Identity unless drop_block_rate is set,
    between bn2 and act2: the norm and the activation fuse, the Identity stays after them."""
    model, x = _build("resnet")
    model, outcome = _apply("fuse-norm-act", model, x)
    fused = {c.module for c in outcome.changes}
    assert {f"layer{i}.0.bn2" for i in range(1, 5)} <= fused
    assert not any(f.rule == "unfused-norm-act" for f in _audit(model, x).findings)


def test_mobilenetv3_refuses_timm_s_linear_head_with_the_reason():
    model, x = _build("mobilenetv3")
    _, outcome = _apply("pad-channels", model, x)
    assert not outcome.changes
    (refusal,) = [r for r in outcome.refusals if r.module == "classifier"]
    assert "not a plain nn.Linear" in refusal.reason


def test_mobilenetv3_channels_last_leaves_no_nchw_convolution():
    """A 1x1 weight (C_out, C_in, 1, 1) with strides (C_in, 1, 1, 1) is contiguous both ways
    and PyTorch runs it NCHW: channels-last gives it (C_in, 1, C_in, C_in), so MobileNetV3's
    squeeze-excite convolutions on pooled N x C x 1 x 1 inputs run channels_last too."""
    model, x = _build("mobilenetv3")
    model, outcome = _apply("channels-last", model, x)
    assert outcome.changes
    assert not [f.module for f in _audit(model, x).findings if f.rule == "nchw-conv"]


def test_vit_residual_add_and_norm_fused():
    """timm's ViT blocks hold timm.layers.LayerNorm, a subclass that is F.layer_norm unless
    timm's fast norm is on: its residual add -> norm2 fuses, and the audit stops naming it."""
    model, x = _build("vit")
    before = {f.module for f in _audit(model, x).findings if f.rule == "unfused-norm-act"}
    model, outcome = _apply("fuse-norm-act", model, x)
    assert {c.module for c in outcome.changes} >= {"blocks.0.norm2", "blocks.1.norm2"}
    after = [f for f in _audit(model, x).findings if f.rule == "unfused-norm-act"]
    assert before and not after
