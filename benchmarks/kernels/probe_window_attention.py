"""What does SDPA's memory-efficient kernel cost on short windows, with and without a bias?

Swin-T's sdpa fix (timm's fused attention) was predicted to save 2.4-2.9 ms of GPU time a
compiled step and saved 1.8-2.0 (H200 and H100): the cost model priced the 12 efficient-attention
calls at 1.55 ms (0.38 forward, 1.17 backward) and they ran 2.73 (0.91, 1.82) on the H200.
Windows of 49 tokens with 32-wide heads give each (window, head) a CTA of its own that does
almost no arithmetic, and the relative-position bias (a parameter: its gradient is written) is
read beside Q, K and V. This times one call's forward and backward (bf16, training) at Swin-T's
four stages (batch 64) and a few other window sizes, with no mask, a broadcast (1, heads, T, T)
bias and a materialized (windows, heads, T, T) bias (what timm builds for shifted windows), each
bias requiring grad; sums the attention kernels' device time from the profiler, and sets it
beside what the cost model prices the traced call at on this GPU's profile. (Without a bias
SDPA picks cuDNN's kernel on Hopper, torch 2.11; a bias sends it to the efficient kernel.)

    python benchmarks/kernels/probe_window_attention.py [--profile PATH] --out window.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.bench import compare, kernel_totals, write_results  # noqa: E402
from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.tracing.cost import cost  # noqa: E402
from gpushape.tracing.tracer import trace  # noqa: E402

PROFILES = {
    "H200": ROOT / "src/gpushape/hardware/profiles/h200-sxm.json",
    "H100": ROOT / "benchmarks/results/probe-h100/h100-sxm.json",
}
# (windows x batch, heads, tokens, head size): Swin-T's stages at batch 64, then other windows
SHAPES = [
    (4096, 3, 49, 32),
    (1024, 6, 49, 32),
    (256, 12, 49, 32),
    (64, 24, 49, 32),
    (1024, 6, 144, 32),
    (256, 8, 64, 64),
    (64, 12, 197, 64),
]
BIASES = ("none", "bias 1hTT", "bias BhTT")
ATTENTION = ("fmha", "attention", "Attention", "flash", "sdpa")
BACKWARD = ("Backward", "cutlassB", "bwd", "bprop")


class Attend(nn.Module):
    def __init__(self, h: int, t: int, bias: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.kind = bias
        self.bias = nn.Parameter(torch.zeros(1, h, t, t, dtype=dtype)) if bias != "none" else None

    def forward(self, q, k, v):
        mask = self.bias
        if self.kind == "bias BhTT":  # timm's shifted windows: bias + window mask, materialized
            mask = mask + q.new_zeros(q.shape[0], 1, q.shape[-2], q.shape[-2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def predicted(module: nn.Module, shape: tuple, gpu) -> tuple[float, float, float]:
    """The cost model's forward and backward attention-op time, and every op's, on the meta
    device."""
    meta = Attend(shape[1], shape[2], module.kind, torch.bfloat16).to("meta")
    args = tuple(torch.empty(shape, device="meta", dtype=torch.bfloat16) for _ in range(3))
    for a in args:
        a.requires_grad_(True)
    traced = trace(meta, args, train=True)
    costed = cost(traced, gpu)
    fwd = bwd = total = 0.0
    for rec, c in zip(traced.ops, costed.ops):
        total += c.kernel_time_s
        if "scaled_dot_product" in rec.op:
            if "_backward" in rec.op:
                bwd += c.kernel_time_s
            else:
                fwd += c.kernel_time_s
    return fwd, bwd, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", type=Path, default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("window_attention.json"))
    p.add_argument("--device", default="cuda", help="cpu: a smoke test (tiny shapes, no kernels)")
    args = p.parse_args()
    shapes = SHAPES if args.device == "cuda" else [(4, 2, 9, 8), (2, 2, 16, 8)]
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("probe_window_attention.py: needs a CUDA device; none is visible")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "H200 (CPU smoke test)"
    path = args.profile or next((v for k, v in PROFILES.items() if k in name), None)
    if path is None:
        sys.exit(f"probe_window_attention.py: no shipped profile for {name}; pass --profile")
    profile = read_profile(path)
    gpu = apply_profile(get_gpu(profile["gpu"]), profile)
    steps, modules = {}, {}
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    for shape in shapes:
        q, k, v = (torch.randn(shape, device=args.device, dtype=dtype, requires_grad=True)
                   for _ in range(3))  # fmt: skip
        grad = torch.randn(shape, device=args.device, dtype=dtype)
        for bias in BIASES:
            module = Attend(shape[1], shape[2], bias, dtype).to(args.device)
            key = f"{'x'.join(map(str, shape))} {bias}"

            def step(module=module, q=q, k=k, v=v, grad=grad):
                module(q, k, v).backward(grad)

            steps[key], modules[key] = step, (module, shape)
    for fn in steps.values():
        fn()
        fn()
    timings = compare(steps, rounds=args.rounds, repeats_per_round=5, warmup=1)
    rows = {}
    for key, fn in steps.items():
        kernels = kernel_totals(fn) if args.device == "cuda" else {}
        attn = {n: us for n, us in kernels.items() if any(a in n for a in ATTENTION)}
        fwd_us = sum(us for n, us in attn.items() if not any(b in n for b in BACKWARD))
        bwd_us = sum(attn.values()) - fwd_us
        p_fwd, p_bwd, p_all = predicted(*modules[key], gpu)
        rows[key] = {
            "step_ms": timings[key].median_s * 1e3,
            "kernels_us": sum(kernels.values()) or float("nan"),
            "attention_fwd_us": fwd_us,
            "attention_bwd_us": bwd_us,
            "predicted_fwd_us": p_fwd * 1e6,
            "predicted_bwd_us": p_bwd * 1e6,
            "predicted_all_us": p_all * 1e6,
            "attention_kernels": {n[:120]: us for n, us in attn.items()},
            "other_kernels": {n[:120]: us for n, us in kernels.items() if n not in attn},
        }
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    write_results(args.out, {"shapes": [list(s) for s in shapes], "rows": rows}, profile=str(shown))
    print(f"{'call':32} {'fwd us':>8} {'x':>5} {'bwd us':>8} {'x':>5} {'all us':>8} {'x':>5}")
    print("(x: predicted / measured)")
    for key, r in rows.items():
        cells = [f"{key:32}"]
        for part in ("attention_fwd", "attention_bwd", "kernels"):
            measured = r[f"{part}_us"]
            pred = r[
                "predicted_all_us"
                if part == "kernels"
                else part.replace("attention", "predicted") + "_us"
            ]
            ratio = pred / measured if measured > 0 else float("nan")
            cells.append(f"{measured:8.1f} {ratio:5.2f}")
        print(" ".join(cells))


if __name__ == "__main__":
    main()
