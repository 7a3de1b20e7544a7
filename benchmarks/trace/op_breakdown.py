"""Which ops does the cost model misprice? A correlate run's modules, op by op.

`correlate.py --ops` keeps, for every module it compares, the cost model's kernel seconds per
traced op (forward and backward apart) and the measured device seconds per op that launched
kernels (torch.profiler: the innermost op, `aten::cudnn_convolution` under `aten::conv2d`).
The two sides name ops differently (the trace sees ATen after autograd, the profiler the ops
that ran), so both are folded to a base name (`BASES`): `convolution` for `aten::cudnn_convolution`
and `aten.convolution.default`, `add` for `aten::add_` and `aten.add.Tensor`.

Prints, per model: the base ops by measured time with predicted / measured, then the modules
whose predicted time is furthest from the measured (by seconds), each with both op lists.

    python benchmarks/trace/op_breakdown.py RESULTS.json [--models timm:convnext_tiny] \\
        [--modules 8] [--ops 15]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

# profiler names that run what the trace records under another name
BASES = {
    "cudnn_convolution": "convolution",
    "_convolution": "convolution",
    "cudnn_convolution_transpose": "convolution",
    "_conv_depthwise2d": "convolution",
    "mkldnn_convolution": "convolution",
    "addmm": "mm",
    "_addmm_activation": "mm",
    "linear": "mm",
    "matmul": "mm",
    "baddbmm": "bmm",
    "clone": "copy",
    "contiguous": "copy",
    "_to_copy": "copy",
    "copy_": "copy",
    "native_dropout": "dropout",
    "native_dropout_backward": "dropout_backward",
    "_softmax": "softmax",
    "_softmax_backward_data": "softmax_backward",
    "_log_softmax": "log_softmax",
    "_log_softmax_backward_data": "log_softmax_backward",
    "embedding_dense_backward": "embedding_backward",
    "fill_": "zeros",
    "zero_": "zeros",
    "new_zeros": "zeros",
    "zeros_like": "zeros",
}


def base(name: str) -> str:
    """`aten::add_` and `aten.add.Tensor (forward)` -> `add`; aliases folded by `BASES`."""
    name = re.sub(r" \((forward|backward)\)$", "", name)
    name = name.removeprefix("aten::").removeprefix("aten.")
    name = name.split(".")[0]
    if name not in BASES and name.endswith("_") and not name.endswith("__"):
        name = name[:-1]  # in-place variants: add_ -> add
    name = BASES.get(name, name)
    if (
        name.startswith("_scaled_dot_product")
        or name.startswith("_efficient_attention")
        or (name.startswith("_flash_attention") or name.startswith("_cudnn_attention"))
    ):
        return "attention_backward" if name.endswith("backward") else "attention"
    return name


def by_base(ops: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, seconds in ops.items():
        out[base(name)] += seconds
    return dict(out)


def _fmt(ops: dict[str, float], top: int) -> str:
    items = sorted(ops.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{k} {v * 1e3:.3f}" for k, v in items) or "-"


def report(result: dict, modules: int, top: int) -> list[str]:
    ops = result.get("ops")
    if not ops:
        return [f"{result['model']}: no per-op data (run correlate.py with --ops)"]
    predicted: dict[str, float] = defaultdict(float)
    measured: dict[str, float] = defaultdict(float)
    for sides in ops.values():
        for k, v in by_base(sides["predicted_s"]).items():
            predicted[k] += v
        for k, v in by_base(sides["measured_s"]).items():
            measured[k] += v
    lines = [f"{result['model']} (batch {result.get('batch')}): ops by measured ms a step"]
    lines.append(f"  {'op':28} {'measured':>9} {'predicted':>10} {'pred/meas':>9}")
    for name in sorted(set(predicted) | set(measured), key=lambda k: -measured.get(k, 0.0))[:top]:
        m, p = measured.get(name, 0.0), predicted.get(name, 0.0)
        ratio = f"{p / m:.2f}" if m > 0 else "-"
        lines.append(f"  {name:28} {m * 1e3:9.3f} {p * 1e3:10.3f} {ratio:>9}")
    rows = sorted(result["rows"], key=lambda r: -abs(r["predicted_kernel_s"] - r["measured_s"]))[
        :modules
    ]
    lines.append("  modules furthest off (ms a step): predicted ops | measured ops")
    for r in rows:
        sides = ops.get(r["module"], {"predicted_s": {}, "measured_s": {}})
        lines.append(
            f"  {r['module']} ({r['type']}): {r['predicted_kernel_s'] * 1e3:.3f} predicted, "
            f"{r['measured_s'] * 1e3:.3f} measured"
        )
        lines.append(f"      predicted: {_fmt(by_base(sides['predicted_s']), top)}")
        lines.append(f"      measured:  {_fmt(by_base(sides['measured_s']), top)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path, help="a correlate.py JSON written with --ops")
    p.add_argument("--models", default=None, help="comma-separated; default: every model")
    p.add_argument("--modules", type=int, default=8, help="modules furthest off to show")
    p.add_argument("--ops", type=int, default=15, help="ops to list")
    args = p.parse_args(argv)
    try:
        data = json.loads(args.results.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"op_breakdown.py: cannot read {args.results}: {exc}", file=sys.stderr)
        return 2
    results = data.get("results", data) if isinstance(data, dict) else data
    wanted = set(args.models.split(",")) if args.models else None
    for result in results:
        if wanted is None or result["model"] in wanted:
            print("\n".join(report(result, args.modules, args.ops)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
