"""Which op launches the large strided copy beside Swin's efficient-attention calls?

probe_window_attention.py found, beside SDPA's memory-efficient kernels at Swin-T's windows
with a broadcast (1, heads, T, T) bias, a generic strided copy (`elementwise_kernel<128, 4>`)
of about 0.3 ms at stage 1 (H100), more than the forward attention kernel itself; the meta
trace has no such copy. That probe feeds contiguous (B, heads, T, d) q, k, v and a contiguous
output gradient, which timm's attention does not: it unbinds q, k, v from one permuted qkv
projection and transposes the output back. This times one forward and backward per layout
and attributes each kernel's device time to the ATen op that launched it (torch.profiler),
so the copy gets a name and the layout that pays it is known:

- `contiguous q`: the probe's layout;
- `timm`: q, k, v as timm's `Attention` builds them, the output transposed back, its
  gradient contiguous in that layout;
- `timm, padded bias`: the same with the bias stored (1, heads, T, T padded to 8) and sliced,
  so SDPA need not pad it;
- `timm, frozen bias`: the bias without a gradient (what the bias's gradient costs).

    python benchmarks/kernels/diagnose_window_bias.py --out diagnose_window_bias.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.bench import compare, write_results  # noqa: E402

# (windows x batch, heads, tokens, head size): Swin-T's stages 1 and 3 at batch 64
SHAPES = [(4096, 3, 49, 32), (256, 12, 49, 32)]
LAYOUTS = ("contiguous q", "timm", "timm, padded bias", "timm, frozen bias")


def build(layout: str, shape: tuple[int, ...], device: str, dtype: torch.dtype):
    """A step (forward and backward of one attention call) for `layout`."""
    b, h, t, d = shape
    width = t + (-t % 8) if layout == "timm, padded bias" else t  # padded: sliced back to t
    bias_grad = layout != "timm, frozen bias"
    store = torch.zeros(1, h, t, width, device=device, dtype=dtype, requires_grad=bias_grad)
    if layout == "contiguous q":
        q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))  # fmt: skip
        grad = torch.randn(shape, device=device, dtype=dtype)

        def step():
            F.scaled_dot_product_attention(q, k, v, attn_mask=store).backward(grad)

        return step
    qkv = torch.randn(b, t, 3 * h * d, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(b, t, h * d, device=device, dtype=dtype)

    def step():  # timm's Attention.forward from the qkv projection's output on
        q, k, v = qkv.reshape(b, t, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=store[..., :t])
        out.transpose(1, 2).reshape(b, t, h * d).backward(grad)

    return step


def by_op(step) -> tuple[dict[str, float], dict[str, float]]:
    """Device microseconds a step, by the ATen op that launched the kernels and by kernel."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    ops, kernels = {}, {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0.0)
        if us <= 0:
            continue
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.key[:120]] = us
        else:
            ops[e.key] = us
    return ops, kernels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("diagnose_window_bias.json"))
    p.add_argument("--device", default="cuda", help="cpu: a smoke test (tiny shapes, no kernels)")
    args = p.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("diagnose_window_bias.py: needs a CUDA device; none is visible")
    shapes = SHAPES if cuda else [(4, 2, 9, 8)]
    dtype = torch.bfloat16 if cuda else torch.float32
    steps = {}
    for shape in shapes:
        for layout in LAYOUTS:
            steps[f"{'x'.join(map(str, shape))} {layout}"] = build(
                layout, shape, args.device, dtype
            )
    for fn in steps.values():
        fn()
    timings = compare(steps, rounds=args.rounds, repeats_per_round=5, warmup=1)
    rows = {}
    for key, fn in steps.items():
        ops, kernels = by_op(fn) if cuda else ({}, {})
        rows[key] = {
            "step_ms": timings[key].median_s * 1e3,
            "kernels_us": sum(kernels.values()),
            "by_op_us": dict(sorted(ops.items(), key=lambda kv: -kv[1])),
            "by_kernel_us": dict(sorted(kernels.items(), key=lambda kv: -kv[1])),
        }
    write_results(args.out, {"shapes": [list(s) for s in shapes], "rows": rows})
    for key, r in rows.items():
        top = ", ".join(f"{op} {us:.0f}" for op, us in list(r["by_op_us"].items())[:5])
        print(f"{key:36} step {r['step_ms']:7.3f} ms, kernels {r['kernels_us']:7.1f} us: {top}")


if __name__ == "__main__":
    main()
