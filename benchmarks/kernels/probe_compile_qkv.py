"""Why does torch.compile's gradient of a fused QKV projection run at a fraction of the copy
rate, and does an Inductor setting fix it? One GPU, bf16.

Hugging Face GPT-2 projects q, k and v with one GEMM (`c_attn`, C -> 3C), splits the output
and views each part as heads, (B, T, 3C) -> 3 x (B, heads, T, D). In the backward the three
gradients SDPA returns are assembled into the GEMM output's gradient. Compiled, GPT-2 (batch
32 x 1024) spent 4.7 ms a step on H200 in that kernel (`triton_poi_fused_..._cat_clone_transpose
_...`, 12 launches, about 0.8 TB/s counting its bytes once each way), against 1.2 ms at the
copy rate (bench-h200/gpt2-b32.json). gpushape's eager kernel for the same assembly runs at
4.2 TB/s (FusedQKV, kernels-h200). A transposing copy written as a one-dimensional pointwise
kernel reads or writes across strides; Inductor tiles in two dimensions only where its
heuristics say so.

This probe compiles GPT-2's attention block (the projection, split, causal SDPA, the output
projection) under each Inductor setting in CONFIGS, checks each against eager, times forward
and backward alternately in one run (CUDA events, `gpushape.bench.compare`), and profiles one
forward+backward of each: the assembly kernel's time and bandwidth beside the block's.

    python benchmarks/kernels/probe_compile_qkv.py --out $OUT/probe_compile_qkv.json
    python benchmarks/kernels/probe_compile_qkv.py --device cpu --tiny    # plumbing only
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results

CONFIGS = {  # name -> torch._inductor.config overrides
    "default": {},
    "nd-tiling": {"triton.prefer_nd_tiling": True},
    "nd-tiling-3": {"triton.prefer_nd_tiling": True, "triton.max_tiles": 3},
    "coordinate-descent": {"coordinate_descent_tuning": True},
    "coalesce-analysis": {"triton.coalesce_tiling_analysis": True},
}
GPT2 = dict(B=32, T=1024, C=768, H=12)
TINY = dict(B=2, T=16, C=32, H=2)


class Attention(nn.Module):
    """GPT-2's attention block as transformers writes it (Linear in place of its Conv1D)."""

    def __init__(self, c: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (p.view(b, t, self.heads, c // self.heads).transpose(1, 2) for p in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


def _step(model: nn.Module, x: torch.Tensor, grad: torch.Tensor):
    def run() -> None:
        model.zero_grad(set_to_none=True)
        x.grad = None
        model(x).backward(grad)

    return run


def _compiled(block: nn.Module, overrides: dict, x: torch.Tensor, grad: torch.Tensor):
    """A copy of the block compiled with `overrides` as its Inductor options (a torch.compile
    of its own: dynamo keeps each backend's graphs apart), compiled by one forward+backward."""
    compiled = torch.compile(copy.deepcopy(block), options=dict(overrides) or None)
    _step(compiled, x, grad)()
    return compiled


def _assembly(kernels: list[tuple[str, float]]) -> tuple[str, float]:
    """The kernel that assembles dq, dk, dv (a `cat` in its name), and its seconds a call."""
    cats = [(n, s) for n, s in kernels if "cat" in n]
    return max(cats, key=lambda k: k[1]) if cats else ("", 0.0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="probe_compile_qkv.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="small shapes: checks the script")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    shape = TINY if args.tiny else GPT2
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    block = Attention(shape["C"], shape["H"], args.dropout).to(args.device, dtype)
    x = torch.randn(shape["B"], shape["T"], shape["C"], device=args.device, dtype=dtype,
                    requires_grad=True)  # fmt: skip
    grad = torch.randn_like(x)
    eager_run = _step(block, x, grad)
    eager_run()
    want = [t.grad.clone() for t in (x, *block.parameters())]
    runs, checks = {"eager": eager_run}, {}
    failed = {}
    for name, overrides in CONFIGS.items():
        try:
            compiled = _compiled(block, overrides, x, grad)
        except Exception as exc:  # a setting this torch does not have: said, the rest run
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            print(f"{name}: failed: {failed[name]}", flush=True)
            continue
        run = _step(compiled, x, grad)
        run()
        got = [t.grad for t in (x, *compiled.parameters())]
        worst = max(float((g - w).abs().max() / (w.abs().max() + 1e-6)) for g, w in zip(got, want))
        checks[name] = worst
        runs[name] = run
        print(f"{name}: compiled; worst gradient error {worst:.2e} of the largest", flush=True)
    times = _time(runs, args.rounds, cuda)
    kernels = {name: _kernels(run, cuda) for name, run in runs.items()}
    b, t, c = shape["B"], shape["T"], shape["C"]
    nbytes = 2 * 3 * b * t * c * x.element_size()  # the three gradients read, one written
    rows = {}
    for name, run_times in times.items():
        kname, secs = _assembly(kernels[name])
        rows[name] = {
            "fwd_bwd_s": statistics.median(run_times),
            "times_s": run_times,
            "assembly_kernel": kname,
            "assembly_s": secs,
            "assembly_bytes_per_s": nbytes / secs if secs else None,
            "worst_grad_error": checks.get(name),
            "top_kernels": kernels[name][:12],
        }
    print(f"\n{'config':20} {'fwd+bwd ms':>11} {'assembly us':>12} {'TB/s':>6}  kernel")
    for name, r in rows.items():
        rate = r["assembly_bytes_per_s"]
        print(f"{name:20} {r['fwd_bwd_s'] * 1e3:11.3f} {r['assembly_s'] * 1e6:12.1f} "
              f"{(rate or 0) / 1e12:6.2f}  {r['assembly_kernel'][:60]}")  # fmt: skip
    write_results(args.out, results={"shape": shape, "dropout": args.dropout, "rows": rows,
                                     "configs": CONFIGS, "failed": failed})  # fmt: skip


def _time(runs: dict, rounds: int, cuda: bool) -> dict[str, list[float]]:
    from gpushape.steps.measure import time_blocks

    return time_blocks(runs, rounds=rounds, block=10, cuda=cuda)


def _kernels(run, cuda: bool) -> list[tuple[str, float]]:
    """Each kernel's seconds in one forward+backward, longest first (none without CUDA)."""
    if not cuda:
        return []
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    by_name: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time_total / 1e6
    return sorted(by_name.items(), key=lambda kv: -kv[1])


if __name__ == "__main__":
    main()
