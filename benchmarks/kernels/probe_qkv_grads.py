"""What layout dq, dk, dv arrive in from scaled_dot_product_attention's backward, and what that
does to FusedQKV's advantage over three Linear layers, on one GPU (bf16).

    python benchmarks/kernels/probe_qkv_grads.py [--out probe_qkv_grads.json]

bench_attention.py once drew the gradients of q, k, v contiguous in (B, heads, T, D). In a model
they come from SDPA's backward, in the layout it writes. When that layout is (B, T, heads, D)
memory (the Linear output's own), the three-Linear baseline reshapes them for free; with
(B, heads, T, D) gradients it pays a transposing copy per projection. This probe finds the
layout each SDPA backend gives (for the baseline's views and for FusedQKV's), then times, from
CUDA graphs and alternated in one run (`gpushape.bench.compare`):

- the projections' forward+backward with gradients in each layout. Variants: three Linear;
  FusedQKV; FusedQKV's GEMM and views without its autograd.Function (autograd's cat assembles
  the gradient); a backward with no assembly (dX by one mm and two in-place addmm, dW by three
  mm into the weight gradient's row blocks, reading the gradients where they lie); and
  FusedQKV's three GEMMs with the assembly taken as free, the ceiling of merging projections;
- the projections with SDPA, forward+backward, for the flash and memory-efficient backends.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench import compare, kernel_times
from gpushape.bench.record import environment
from gpushape.kernels import FusedQKV
from gpushape.kernels.attention.fused_qkv import _split_heads

DT = torch.bfloat16
SHAPES = {
    "BERT-base": dict(E=768, H=12, T=512, B=32, bias=True, causal=False),
    "LLaMA-7B": dict(E=4096, H=32, T=2048, B=1, bias=False, causal=True),
}
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}


class _NoAssembly(torch.autograd.Function):
    """The projection as one GEMM whose backward reads dq, dk, dv where they lie: three dX GEMMs
    accumulated in place, three dW GEMMs into row blocks. Needs each gradient viewable as a
    (B*T, heads*D) matrix, which the (B, T, heads, D) layout is."""

    @staticmethod
    def forward(ctx, x, weight, bias, heads, d):
        ctx.save_for_backward(x, weight)
        ctx.heads, ctx.d, ctx.has_bias = heads, d, bias is not None
        return _split_heads(F.linear(x, weight, bias), heads, d)

    @staticmethod
    def backward(ctx, *grads):
        x, weight = ctx.saved_tensors
        b, t, e = x.shape
        x2 = x.reshape(b * t, e)
        mats = [g.transpose(1, 2).reshape(b * t, h * ctx.d) for g, h in zip(grads, ctx.heads)]
        ws = weight.split([h * ctx.d for h in ctx.heads])
        dx = torch.mm(mats[0], ws[0])
        for m, w in zip(mats[1:], ws[1:]):
            dx.addmm_(m, w)
        dw = torch.empty_like(weight)
        for m, part in zip(mats, dw.split([h * ctx.d for h in ctx.heads])):
            torch.mm(m.t(), x2, out=part)
        db = torch.cat([m.sum(0) for m in mats]) if ctx.has_bias else None
        return dx.view(b, t, e), dw, db, None, None


class _AssemblyFree(torch.autograd.Function):
    """The ceiling: FusedQKV's three GEMMs with the gradient assembly taken as free. The backward
    ignores the gradients' values and reads a preallocated (B, T, R) gradient of the same size
    in their place (so it computes the right amount, not the right numbers)."""

    @staticmethod
    def forward(ctx, x, weight, bias, heads, d, packed):
        ctx.save_for_backward(x, weight, packed)
        ctx.has_bias = bias is not None
        return _split_heads(F.linear(x, weight, bias), heads, d)

    @staticmethod
    def backward(ctx, *grads):
        x, weight, packed = ctx.saved_tensors
        dy = packed.view(-1, packed.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        db = dy.sum(0) if ctx.has_bias else None
        return torch.mm(dy, weight).view(x.shape), torch.mm(dy.t(), x2), db, None, None, None


def modules(cfg):
    fused = FusedQKV(cfg["E"], cfg["H"], bias=cfg["bias"], device="cuda", dtype=DT)
    three = fused.to_linears()
    d = cfg["E"] // cfg["H"]
    heads = (cfg["H"],) * 3

    def three_run(x):
        b, t, _ = x.shape
        return tuple(layer(x).view(b, t, -1, d).transpose(1, 2) for layer in three)

    def no_assembly(x):
        return _NoAssembly.apply(x, fused.weight, fused.bias, heads, d)

    packed = torch.randn(cfg["B"], cfg["T"], 3 * cfg["E"], device="cuda", dtype=DT)

    def assembly_free(x):
        return _AssemblyFree.apply(x, fused.weight, fused.bias, heads, d, packed)

    def plain_views(x):  # FusedQKV's GEMM and views without its Function: autograd's cat
        return _split_heads(F.linear(x, fused.weight, fused.bias), heads, d)

    fns = {
        "3 Linear": three_run,
        "FusedQKV": fused,
        "FusedQKV plain views": plain_views,
        "FusedQKV no-assembly": no_assembly,
        "FusedQKV assembly free (ceiling)": assembly_free,
    }
    params = {name: list(fused.parameters()) for name in fns}
    params["3 Linear"] = [p for layer in three for p in layer.parameters()]
    return fns, params


def describe(g: torch.Tensor, base: torch.Tensor) -> dict:
    return dict(
        shape=list(g.shape),
        stride=list(g.stride()),
        bthd_contiguous=g.transpose(1, 2).is_contiguous(),
        contiguous=g.is_contiguous(),
        storage_offset_elems=(g.data_ptr() - base.data_ptr()) // g.element_size(),
    )


def layouts(cfg, fns) -> dict:
    """The strides of dq, dk, dv that each SDPA backend's backward gives each variant."""
    x = torch.randn(cfg["B"], cfg["T"], cfg["E"], device="cuda", dtype=DT, requires_grad=True)
    out = {}
    for bname, backend in BACKENDS.items():
        for vname in ("3 Linear", "FusedQKV"):
            q, k, v = fns[vname](x)
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=cfg["causal"])
            grads = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
            shared = len({g.untyped_storage().data_ptr() for g in grads}) == 1
            out[f"{bname} / {vname}"] = dict(
                shared_storage=shared, parts=[describe(g, grads[0]) for g in grads]
            )
    return out


def sdpa_layout_grads(cfg):
    d = cfg["E"] // cfg["H"]
    return [
        torch.randn(cfg["B"], cfg["T"], cfg["H"], d, device="cuda", dtype=DT).transpose(1, 2)
        for _ in range(3)
    ]


def bhtd_grads(cfg):
    d = cfg["E"] // cfg["H"]
    return [torch.randn(cfg["B"], cfg["H"], cfg["T"], d, device="cuda", dtype=DT) for _ in range(3)]


def timed_variants(cfg, fns, params) -> dict[str, dict[str, callable]]:
    x = torch.randn(cfg["B"], cfg["T"], cfg["E"], device="cuda", dtype=DT, requires_grad=True)
    cases = {}
    for gname, grads in (
        ("grads (B,H,T,D) contiguous", bhtd_grads(cfg)),
        ("grads as SDPA gives (B,T,H,D)", sdpa_layout_grads(cfg)),
    ):
        cases[f"proj fwd+bwd, {gname}"] = {
            name: (lambda f=f, w=[x, *params[name]], g=grads: torch.autograd.grad(f(x), w, g))
            for name, f in fns.items()
        }
    go = torch.randn(cfg["B"], cfg["H"], cfg["T"], cfg["E"] // cfg["H"], device="cuda", dtype=DT)
    for bname, backend in BACKENDS.items():

        def run(f, w, backend=backend):
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(*f(x), is_causal=cfg["causal"])
            return torch.autograd.grad(o, w, go)

        cases[f"proj+SDPA fwd+bwd, {bname}"] = {
            name: (lambda f=f, w=[x, *params[name]], run=run: run(f, w)) for name, f in fns.items()
        }
    return cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="probe_qkv_grads.json")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    if common.cuda_missing("cuda", "probe_qkv_grads.py"):
        return 2
    result = dict(environment=environment(), command=" ".join(sys.argv), shapes={})
    table = []
    for label, cfg in SHAPES.items():
        fns, params = modules(cfg)
        entry = result["shapes"][label] = dict(
            config=cfg, layouts=layouts(cfg, fns), times={}, kernels={}
        )
        for lname, lay in entry["layouts"].items():
            print(
                f"{label:10} {lname:28} shared={lay['shared_storage']} "
                f"{[p['stride'] for p in lay['parts']]}",
                flush=True,
            )
        for case, variants in timed_variants(cfg, fns, params).items():
            graphs = {n: common.graphed(f, "cuda") for n, f in variants.items()}
            graphs = {n: g for n, g in graphs.items() if g is not None}
            times = compare(graphs, rounds=args.rounds, repeats_per_round=10, warmup=2)
            entry["times"][case] = {n: t.median_s * 1e3 for n, t in times.items()}
            entry["kernels"][case] = {n: kernel_times(f) for n, f in variants.items()}
            base = times["3 Linear"].median_s
            for n, t in times.items():
                table.append((label, case, n, t.median_s * 1e3, base / t.median_s))
            print(f"timed {label} {case}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("\nms = median of CUDA-graph replays; speed-up = 3 Linear / variant")
    for label, case, n, ms, sp in table:
        print(f"{label:10} {case:40} {n:32} {ms:8.3f}  {sp:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
