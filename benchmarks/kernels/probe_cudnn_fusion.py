"""Can cuDNN's graph API take BatchNorm's work into ResNet-50's convolutions on this GPU, and
what would it save? A feasibility probe for #17's lead (MLPerf's fused conv-BN graphs).

    python benchmarks/kernels/probe_cudnn_fusion.py [--out probe_cudnn_fusion.json]

Needs `nvidia-cudnn-frontend` (a wheel carried to the GPU machine: gpu_run.sh installs .whl/).
For every convolution shape of torchvision's ResNet-50 at batch 256 x 224² (bf16, NHWC), in
one run, alternated:
- `torch`: F.conv2d as the optimized step runs it (cuDNN through PyTorch);
- `torch + stats`: that and gpushape's BatchNorm statistics kernel over its output (what the
  step runs today before the apply kernel);
- `genstats`: one cuDNN graph, the convolution with per-channel sum and sum of squares of its
  output (fp32) fused in;
- `sbr+genstats`: the same with the previous BatchNorm's scale, bias and ReLU applied to the
  input inside the convolution (the whole forward of a BatchNorm but for its statistics'
  finalisation), where the input comes from a BatchNorm.
Each graph's support is checked first; an unsupported graph is reported as such. Sums are
checked against fp32 PyTorch on the same output. The table weights each shape by how often
ResNet-50 runs it: the forward time the fusions would take off a training step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench import compare
from gpushape.bench.record import environment

N = 256
# (name, C in, C out, kernel, stride, input side, times in ResNet-50, input from a BatchNorm)
SHAPES = [
    ("stem 7x7 s2", 3, 64, 7, 2, 224, 1, False),
    ("l1 1x1 64-64", 64, 64, 1, 1, 56, 1, True),
    ("l1 1x1 256-64", 256, 64, 1, 1, 56, 2, True),
    ("l1 3x3 64", 64, 64, 3, 1, 56, 3, True),
    ("l1 1x1 64-256", 64, 256, 1, 1, 56, 4, True),
    ("l2 1x1 256-128", 256, 128, 1, 1, 56, 1, True),
    ("l2 3x3 128 s2", 128, 128, 3, 2, 56, 1, True),
    ("l2 1x1 s2 256-512", 256, 512, 1, 2, 56, 1, True),
    ("l2 1x1 512-128", 512, 128, 1, 1, 28, 3, True),
    ("l2 3x3 128", 128, 128, 3, 1, 28, 3, True),
    ("l2 1x1 128-512", 128, 512, 1, 1, 28, 4, True),
    ("l3 1x1 512-256", 512, 256, 1, 1, 28, 1, True),
    ("l3 3x3 256 s2", 256, 256, 3, 2, 28, 1, True),
    ("l3 1x1 s2 512-1024", 512, 1024, 1, 2, 28, 1, True),
    ("l3 1x1 1024-256", 1024, 256, 1, 1, 14, 5, True),
    ("l3 3x3 256", 256, 256, 3, 1, 14, 5, True),
    ("l3 1x1 256-1024", 256, 1024, 1, 1, 14, 6, True),
    ("l4 1x1 1024-512", 1024, 512, 1, 1, 14, 1, True),
    ("l4 3x3 512 s2", 512, 512, 3, 2, 14, 1, True),
    ("l4 1x1 s2 1024-2048", 1024, 2048, 1, 2, 14, 1, True),
    ("l4 1x1 2048-512", 2048, 512, 1, 1, 7, 2, True),
    ("l4 3x3 512", 512, 512, 3, 1, 7, 2, True),
    ("l4 1x1 512-2048", 512, 2048, 1, 1, 7, 3, True),
]


def _graph(cudnn, handle, x, w, y, pad, stride, prologue: bool, scale=None, bias=None):
    """A built cuDNN graph and its tensor map: conv_fprop (+ the scale-bias-ReLU prologue)
    with genstats; raises what cuDNN raises where the graph is not supported."""
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.BFLOAT16,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    X = g.tensor(name="X", dim=x.size(), stride=x.stride(), data_type=x.dtype)
    W = g.tensor(name="W", dim=w.size(), stride=w.stride(), data_type=w.dtype)
    inp, extra = X, {}
    if prologue:
        S = g.tensor(name="S", dim=scale.size(), stride=scale.stride(), data_type=scale.dtype)
        B = g.tensor(name="B", dim=bias.size(), stride=bias.stride(), data_type=bias.dtype)
        inp = g.relu(name="relu", input=g.bias(name="bias", input=g.scale(name="scale",
                     input=X, scale=S), bias=B))  # fmt: skip
        extra = {S: scale, B: bias}
    Y = g.conv_fprop(image=inp, weight=W, padding=[pad, pad], stride=[stride, stride],
                     dilation=[1, 1])  # fmt: skip
    Y.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
    SUM, SQ = g.genstats(name="genstats", input=Y)
    SUM.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    SQ.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    c = w.shape[0]
    s = torch.zeros(1, c, 1, 1, device="cuda", dtype=torch.float32)
    sq = torch.zeros_like(s)
    ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
    pack = {X: x, W: w, Y: y, SUM: s, SQ: sq, **extra}
    return lambda: g.execute(pack, ws, handle=handle), s, sq


def shape_rows(cudnn, handle, rounds: int, repeats: int) -> list[dict]:
    from gpushape.kernels.batch_norm import _launch

    rows = []
    for shape in SHAPES:
        row = _one_shape(cudnn, handle, _launch, shape, rounds, repeats)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _one_shape(cudnn, handle, _launch, shape, rounds: int, repeats: int) -> dict:
    name, cin, cout, k, stride, side, times, after_bn = shape
    row = {"shape": name, "times": times}
    x = torch.randn(N, cin, side, side, device="cuda", dtype=torch.bfloat16)
    x = x.to(memory_format=torch.channels_last)
    w = torch.randn(cout, cin, k, k, device="cuda", dtype=torch.bfloat16) / (cin * k * k) ** 0.5
    w = w.to(memory_format=torch.channels_last)
    pad = k // 2
    ref = F.conv2d(x, w, stride=stride, padding=pad)
    y = torch.empty_like(ref)
    rm, rv = torch.zeros(cout, device="cuda"), torch.ones(cout, device="cuda")
    fns = {
        "torch": lambda: F.conv2d(x, w, stride=stride, padding=pad),
        "torch + stats": lambda: _launch.batch_stats(
            F.conv2d(x, w, stride=stride, padding=pad), rm, rv, 0.1, 1e-5
        ),
    }
    ref32 = ref.float()
    want = (ref32.sum((0, 2, 3)), (ref32 * ref32).sum((0, 2, 3)))
    scale = torch.rand(1, cin, 1, 1, device="cuda", dtype=torch.bfloat16) + 0.5
    bias = torch.randn(1, cin, 1, 1, device="cuda", dtype=torch.bfloat16) * 0.1
    for label, prologue in (("genstats", False), ("sbr+genstats", True)):
        if prologue and not after_bn:
            continue
        try:
            run, s, sq = _graph(cudnn, handle, x, w, y, pad, stride, prologue, scale, bias)
            run()
            torch.cuda.synchronize()
            if not prologue:
                err_y = (y.float() - ref32).abs().max().item()
                err_s = ((s.flatten() - want[0]).abs().max() / want[0].abs().max()).item()
                err_q = ((sq.flatten() - want[1]).abs().max() / want[1].abs().max()).item()
                row[f"{label} error"] = {"y": err_y, "sum": err_s, "sq_sum": err_q}
            fns[label] = run
        except Exception as e:  # an unsupported graph is a result, not a failure
            row[f"{label} unsupported"] = f"{type(e).__name__}: {str(e)[:300]}"
    timings = compare(fns, rounds=rounds, repeats_per_round=repeats, warmup=3)
    for label, t in timings.items():
        row[f"{label} us"] = t.median_s * 1e6
    return row


def summary(rows: list[dict]) -> dict:
    out = {}
    for label in ("torch", "torch + stats", "genstats", "sbr+genstats"):
        have = [r for r in rows if f"{label} us" in r]
        out[f"{label} ms a step"] = sum(r[f"{label} us"] * r["times"] for r in have) / 1e3
        out[f"{label} shapes"] = len(have)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if common.cuda_missing("cuda", "probe_cudnn_fusion.py"):
        sys.exit(2)
    try:
        import cudnn
    except ImportError as e:
        sys.exit(f"probe_cudnn_fusion: nvidia-cudnn-frontend is not installed ({e})")
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    print("cudnn backend", cudnn.backend_version(), "frontend", getattr(cudnn, "__version__", "?"))
    rows = shape_rows(cudnn, handle, args.rounds, args.repeats)
    total = summary(rows)
    result = {"environment": environment(), "batch": N, "rows": rows, "summary": total,
              "cudnn_backend": cudnn.backend_version()}  # fmt: skip
    print(f"\n{'shape':22} {'x':>2} {'torch':>8} {'+stats':>8} {'genstats':>9} {'sbr+gs':>8}")
    for r in rows:
        cells = [r.get(f"{k} us") for k in ("torch", "torch + stats", "genstats", "sbr+genstats")]
        text = " ".join(f"{c:8.1f}" if c is not None else "       -" for c in cells)
        print(f"{r['shape']:22} {r['times']:>2} {text}")
    print(json.dumps(total, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
