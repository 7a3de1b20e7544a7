"""Which kernel does SDPA with an explicit mask run, eagerly and under torch.compile?

The materialized-attention-mask rule prices a compiled masked call as PyTorch's math path in
float32, as measured for BERT-base (transformers' all-true bidirectional mask: fp32 score GEMMs,
0.67x eager). GPT-2 compiled with transformers' all-true causal mask ran cuDNN's attention
kernels instead, 2.3x the unmasked time. This times one attention call's forward and backward
(bf16, training) at GPT-2's shape with no mask (is_causal), a boolean causal mask, a boolean
all-true mask (2-D, and 4-D per sequence as transformers builds it) and a float additive mask,
and at BERT's shape with no mask and the two all-true masks; with and without dropout, eagerly
and compiled; and names the kernels each ran.

    python benchmarks/kernels/probe_masked_sdpa.py --out $OUT/probe_masked_sdpa.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import compare, kernel_totals, write_results

MASKS = ("none, is_causal", "bool causal", "bool all-true", "bool all-true b1tt", "float causal")
# the shapes after the first are an encoder's (BERT's): bidirectional, no causal mask
ENCODER_MASKS = ("none", "bool all-true", "bool all-true b1tt")


def _mask(kind: str, b: int, t: int, device: str, dtype: torch.dtype):
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    if kind == "bool causal":
        return causal
    if kind == "bool all-true":
        return torch.ones(t, t, dtype=torch.bool, device=device)
    if kind == "bool all-true b1tt":  # transformers' 4-D mask: per sequence, over heads
        return torch.ones(b, 1, t, t, dtype=torch.bool, device=device)
    if kind == "float causal":
        zeros = torch.zeros(t, t, dtype=dtype, device=device)
        return zeros.masked_fill(~causal, torch.finfo(dtype).min)
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="probe_masked_sdpa.json")
    p.add_argument(
        "--shapes",
        default="8,12,1024,64;32,12,512,64",
        help="batch, heads, sequence, head size; several separated by ';' (GPT-2's, BERT's)",
    )
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    steps = {}
    shapes = [tuple(int(x) for x in one.split(",")) for one in args.shapes.split(";") if one]
    for b, h, t, d in shapes:
        q, k, v = (
            torch.randn(b, h, t, d, device=args.device, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        grad = torch.randn(b, h, t, d, device=args.device, dtype=dtype)
        for kind in MASKS if (b, h, t, d) == shapes[0] else ENCODER_MASKS:
            mask = _mask(kind, b, t, args.device, dtype)
            for p_drop in (0.0, 0.1):

                def attend(q, k, v, mask=mask, p_drop=p_drop, causal=kind == MASKS[0]):
                    return F.scaled_dot_product_attention(
                        q, k, v, attn_mask=mask, dropout_p=p_drop, is_causal=causal
                    )

                for mode, fn in (("eager", attend), ("compiled", torch.compile(attend))):

                    def step(fn=fn, q=q, k=k, v=v, grad=grad):
                        fn(q, k, v).backward(grad)

                    steps[f"{b}x{h}x{t}x{d} {mode}, {kind}, dropout {p_drop}"] = step
    for name, fn in steps.items():
        print(f"warming up {name}", flush=True)
        for _ in range(2):
            fn()
    timings = compare(steps, rounds=args.rounds, repeats_per_round=5, warmup=1)
    rows = {}
    for name, fn in steps.items():
        kernels = kernel_totals(fn) if args.device == "cuda" else {}
        top = sorted(kernels.items(), key=lambda kv: -kv[1])[:4]
        rows[name] = {
            "median_ms": timings[name].median_s * 1e3,
            "kernels_us": dict(top),
        }
    write_results(args.out, {"shapes": [list(x) for x in shapes], "rows": rows})
    print(f"{'call':60} {'fwd+bwd ms':>10}  top kernel")
    for name, row in rows.items():
        top = next(iter(row["kernels_us"]), "-")
        print(f"{name:60} {row['median_ms']:10.3f}  {top[:70]}")


if __name__ == "__main__":
    main()
