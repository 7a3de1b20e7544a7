"""Why does fuse-group-norm fail optimize's numeric check on PoolFormerV2-S12 on a GPU?

On an H100 the check rolled the transform back: the gradient of a stage-3 `norm1.weight`
(timm's GroupNorm1NoBias, one group, 512 channels on 7x7 maps, batch 64) came out 5.5-5.9 from
float64 in relative error, against a bound of 0.13-0.14. The Triton interpreter on a CPU passes
the same check. Four parts, each printing one line per case:

1. the kernels alone against float64 at that norm's shapes (and 320 channels, 14x14 maps), each
   dtype and layout, with and without a bias;
2. the original and the transformed model in float32, side by side: the stage-3 norms' inputs,
   outputs and gradients captured by hooks and compared, their strides printed, and the kernels
   run again on the transformed model's very tensors against float64;
3. optimize's own check (fuse-group-norm alone; and after s2d-stem and channels-last, as the
   loop's planning copy applies them), its verdict and reason;
4. the original against fuse-group-norm with and without safe-avg-pool, float32: part 2 found
   the cause in PyTorch's channels_last avg-pool backward (pytorch#188344), which the guard
   sidesteps.

    python benchmarks/kernels/check_group_norm_poolformerv2.py [--parts 1,2,3,4]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

DEV = "cuda"
BATCH, IMAGE = 64, 224  # the loop's default batch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def kernels_alone() -> None:
    from gpushape.kernels import GroupNormAct

    shapes = itertools.product([512, 320], [7, 14], [False, True], [torch.float32, torch.bfloat16])
    for (c, h, bias, dtype), cl in itertools.product(shapes, [False, True]):
        x = torch.randn(BATCH, c, h, h, device=DEV, dtype=dtype)
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        x.requires_grad_()
        m = GroupNormAct(1, c).to(DEV, dtype)
        if not bias:
            m.bias = None
        with torch.no_grad():
            m.weight.copy_(torch.rand(c) + 0.5)
        y = m(x)
        dy = torch.randn_like(y)
        gx, gw = torch.autograd.grad(y, (x, m.weight), dy)
        x64 = x.detach().double().requires_grad_()
        w64 = m.weight.detach().double().requires_grad_()
        b64 = None if m.bias is None else m.bias.detach().double()
        y64 = F.group_norm(x64, 1, w64, b64, m.eps)
        rx, rw = torch.autograd.grad(y64, (x64, w64), dy.double())
        print(f"kernel c={c} {h}x{h} bias={bias} {str(dtype)[6:]} channels_last={cl}: "
              f"y {rel(y, y64):.1e} dx {rel(gx, rx):.1e} dw {rel(gw, rw):.1e}")  # fmt: skip


def _describe(t: torch.Tensor) -> str:
    cl = t.is_contiguous(memory_format=torch.channels_last)
    return f"strides {tuple(t.stride())} offset {t.storage_offset()} channels_last={cl}"


def models_side_by_side() -> None:
    import timm

    from gpushape.kernels.group_norm._launch import group_norm_backward, group_norm_forward
    from gpushape.transforms import get_transform, load_transforms
    from gpushape.transforms._core import TransformContext

    load_transforms()
    torch.manual_seed(0)
    ref = timm.create_model("poolformerv2_s12").to(DEV).train()
    fused = copy.deepcopy(ref)
    x = torch.randn(BATCH, 3, IMAGE, IMAGE, device=DEV)
    get_transform("fuse-group-norm").apply(fused, TransformContext(example_inputs=(x,)))
    seen: dict[tuple, torch.Tensor] = {}
    for tag, model in (("ref", ref), ("fused", fused)):
        for b in (0, 1):
            norm = model.stages[3].blocks[b].norm1

            def forward(mod, args, y, key=(tag, b)):
                seen[(*key, "x")], seen[(*key, "y")] = args[0].detach(), y.detach()

            def backward(mod, grad_in, grad_out, key=(tag, b)):
                seen[(*key, "dy")], seen[(*key, "dx")] = grad_out[0].detach(), grad_in[0].detach()

            norm.register_forward_hook(forward)
            norm.register_full_backward_hook(backward)
    outs = {}
    for tag, model in (("ref", ref), ("fused", fused)):
        y = model(x)
        outs[tag] = y.detach()
        gen = torch.Generator(device=DEV).manual_seed(1)
        y.backward(torch.randn(y.shape, generator=gen, device=DEV))
    print(f"float32 logits: {rel(outs['fused'], outs['ref']):.1e}")
    for b, k in itertools.product((0, 1), ("x", "y", "dy", "dx")):
        f, r = seen[("fused", b, k)], seen[("ref", b, k)]
        print(f"stages.3.blocks.{b}.norm1 {k}: {rel(f, r):.1e} (fused {_describe(f)}; "
              f"original {_describe(r)})")  # fmt: skip
    named = dict(fused.named_parameters())
    worst = sorted(
        ((rel(named[n].grad, p.grad), n) for n, p in ref.named_parameters() if p.grad is not None),
        reverse=True,
    )[:6]
    print("worst parameter gradients:", ", ".join(f"{n} {e:.1e}" for e, n in worst))
    for b in (0, 1):
        xx, dd = seen[("fused", b, "x")], seen[("fused", b, "dy")]
        w = fused.stages[3].blocks[b].norm1.weight.detach()
        zeros = torch.zeros_like(w)
        yk, stats = group_norm_forward(xx, w, zeros, 1, 1e-6, 0, xx.dtype)
        dxk, dwk, _ = group_norm_backward(dd, xx, w, zeros, stats, 1, 1e-6, 0)
        x64, w64 = xx.double().requires_grad_(), w.double().requires_grad_()
        y64 = F.group_norm(x64, 1, w64, None, 1e-6)
        gx, gw = torch.autograd.grad(y64, (x64, w64), dd.double())
        print(f"the kernels on block {b}'s tensors: y {rel(yk, y64):.1e} dx {rel(dxk, gx):.1e} "
              f"dw {rel(dwk, gw):.1e}")  # fmt: skip


def with_the_guard() -> None:
    """The original against fuse-group-norm alone and against fuse-group-norm with safe-avg-pool
    (applied by name, whatever the device's check says), float32: logits and the six worst
    parameter gradients. With pytorch#188344 on the device, the guarded model's gradients
    should agree with the original's as closely as its logits do; fuse-group-norm's alone not."""
    import timm

    from gpushape.transforms import get_transform, load_transforms
    from gpushape.transforms._core import TransformContext

    load_transforms()
    torch.manual_seed(0)
    ref = timm.create_model("poolformerv2_s12").to(DEV).train()
    x = torch.randn(BATCH, 3, IMAGE, IMAGE, device=DEV)
    models = {"original": ref}
    variants = {
        "fuse-group-norm": ["fuse-group-norm"],
        "fuse-group-norm + safe-avg-pool": ["safe-avg-pool", "fuse-group-norm"],
    }
    for name, ids in variants.items():
        models[name] = copy.deepcopy(ref)
        for tid in ids:
            get_transform(tid).apply(models[name], TransformContext(example_inputs=(x,)))
    outs = {}
    for name, model in models.items():
        y = model(x)
        outs[name] = y.detach()
        y.backward(torch.randn(y.shape, generator=torch.Generator(DEV).manual_seed(1), device=DEV))
    grads = {n: dict(m.named_parameters()) for n, m in models.items()}
    for name in list(models)[1:]:
        worst = sorted(
            ((rel(grads[name][n].grad, p.grad), n) for n, p in grads["original"].items()
             if p.grad is not None), reverse=True,
        )[:6]  # fmt: skip
        print(f"{name}: logits {rel(outs[name], outs['original']):.1e}; worst gradients "
              + ", ".join(f"{n} {e:.1e}" for e, n in worst))  # fmt: skip


def optimize_check() -> None:
    import timm

    import gpushape

    cases = (
        (False, ["fuse-group-norm"]),
        (True, ["fuse-group-norm"]),
        (False, ["s2d-stem", "channels-last", "fuse-group-norm"]),
    )
    for cl, transforms in cases:
        torch.manual_seed(0)
        model = timm.create_model("poolformerv2_s12").to(DEV, torch.bfloat16).train()
        x = torch.randn(BATCH, 3, IMAGE, IMAGE, device=DEV, dtype=torch.bfloat16)
        if cl:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        _, report = gpushape.optimize(model, (x,), gpu="h200", transforms=transforms)
        applied = sorted({c.transform for c in report.applied})
        rolled = [f"{r.transform}: {r.reason}" for r in report.rolled_back]
        print(f"optimize channels_last={cl} {transforms}: applied {applied}; rolled back {rolled}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="1,2,3,4")
    parts = parser.parse_args().parts.split(",")
    if not torch.cuda.is_available():
        sys.exit("check_group_norm_poolformerv2.py: needs a CUDA GPU")
    import timm

    print(f"torch {torch.__version__}, timm {timm.__version__}, {torch.cuda.get_device_name()}")
    parts_run = (("1", kernels_alone), ("2", models_side_by_side), ("3", optimize_check),
                 ("4", with_the_guard))  # fmt: skip
    for part, run in parts_run:
        if part in parts:
            run()


if __name__ == "__main__":
    main()
