"""Audit a hand-written GPT block for a GPU you do not have, fix what the audit names, audit again.

    python examples/audit_attention.py [--gpu h200] [--batch 8] [--seq 1024]

The block is written the way many research codebases write it (nanoGPT's style): three
projections, attention spelled out as softmax(QK^T / sqrt(d)) with a causal mask filled in and
dropout on the probabilities, then @ V. The model is traced on the meta device (no weights in
memory, no GPU needed), every op priced on the target chip's calibrated roofline, and the rules
report what each fix would save there. The fixed block uses one fused q/k/v projection
(gpushape's FusedQKV, which keeps the three Linear layers' state_dict) and
F.scaled_dot_product_attention with is_causal=True; the second audit shows the findings gone
and the predicted step time it expects instead.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

import gpushape
from gpushape.kernels import FusedQKV


class HandWrittenBlock(nn.Module):
    def __init__(self, width: int = 768, heads: int = 12, max_len: int = 1024):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, width)
        self.drop = nn.Dropout(0.1)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, c // self.heads).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        y = self.drop(torch.softmax(scores, dim=-1)) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class FixedBlock(nn.Module):
    def __init__(self, width: int = 768, heads: int = 12):
        super().__init__()
        self.qkv = FusedQKV(width, heads)
        self.out = nn.Linear(width, width)
        self.p = 0.1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0
        )
        return self.out(y.transpose(1, 2).reshape(b, t, c))


def report(title: str, model: nn.Module, x: torch.Tensor, gpu: str) -> float:
    rep = gpushape.audit(model, (x,), gpu=gpu, dtype=torch.bfloat16, train=True)
    step_ms = rep.totals.roofline_time_s * 1e3
    print(f"\n{title}: predicted {step_ms:.2f} ms a training step on {rep.gpu}")
    for f in rep.findings:
        saving = "" if f.est_saving_s is None else f" (saves {f.est_saving_s * 1e3:.2f} ms)"
        overlap = f" [overlaps {f.subsumed_by}: not added]" if f.subsumed_by else ""
        print(f"  [{f.severity.name.lower()}] {f.rule}{saving}{overlap}: {f.message}")
    if not rep.findings:
        print("  no findings")
    elif rep.combined is not None:
        print(f"  together, without overlaps: {rep.combined.saving_s * 1e3:.2f} ms")
    return step_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    args = parser.parse_args(argv)
    x = torch.empty(
        args.batch, args.seq, 768, device="meta", dtype=torch.bfloat16, requires_grad=True
    )
    before = report(
        "hand-written", HandWrittenBlock(max_len=args.seq).to(torch.bfloat16), x, args.gpu
    )
    after = report("fixed", FixedBlock().to(torch.bfloat16), x, args.gpu)
    print(
        f"\npredicted: {before:.2f} -> {after:.2f} ms ({before / after:.2f}x); the audit's "
        "numbers are the cost model's, measured against the H200 in docs/results-h200.md"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
