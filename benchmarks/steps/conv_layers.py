"""Each convolution of a model timed alone, forward and backward, against its own roofline:
which convolutions keep a training step from its target, and by how much?

One forward of the model (channels_last by default, as gpushape's optimize runs it) records
every Conv2d call: input shape, weight, stride, padding, dilation, groups. Each distinct call
is then timed alone with CUDA events (medians of `--repeats` blocks, the three passes
alternated): the forward (`F.conv2d`), the input gradient and the weight gradient
(`aten.convolution_backward`, one output mask at a time; the first convolution of a model,
which reads the data, has no input gradient in a training step). A pass's roofline is the
larger of its FLOPs at the bf16 GEMM peak `gpushape probe` measured and its minimum bytes
(inputs read once, output written once) at the measured copy rate; "of roofline" is
roofline / measured. Rows are sorted by their time in one step (a call's passes x its count).

    python benchmarks/steps/conv_layers.py torchvision.models:resnet50 \\
        --input 256x3x224x224 --out $OUT/conv_layers_resnet50.json
    python benchmarks/steps/conv_layers.py resnet50 --batch 2 --device cpu   # plumbing
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import time_fn, write_results
from gpushape.hardware import calibrated, get_gpu
from gpushape.models import resolve_model

PASSES = ("forward", "input grad", "weight grad")


@dataclass(frozen=True)
class ConvCall:
    """One distinct Conv2d call: what the kernels see."""

    input: tuple[int, ...]
    weight: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    @property
    def output(self) -> tuple[int, int, int, int]:
        n, _, h, w = self.input
        k, _, kh, kw = self.weight
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
        ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        return n, k, ho, wo

    def flops(self) -> int:
        """Multiply-adds x 2 of one pass (each of the three has the same count)."""
        n, k, ho, wo = self.output
        _, cin_g, kh, kw = self.weight
        return 2 * n * k * ho * wo * cin_g * kh * kw

    def pass_bytes(self, itemsize: int) -> dict[str, int]:
        """Minimum bytes of each pass: its two operands read once, its result written once."""
        x, w, y = (torch.Size(s).numel() * itemsize for s in (self.input, self.weight, self.output))
        return {"forward": x + w + y, "input grad": y + w + x, "weight grad": y + x + w}


def record_calls(model: nn.Module, inputs: tuple) -> list[tuple[str, ConvCall]]:
    """(module name, call) of every Conv2d call in one forward, in order."""
    calls: list[tuple[str, ConvCall]] = []
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):

            def hook(mod, args, _out, name=name):
                calls.append((name, ConvCall(tuple(args[0].shape), tuple(mod.weight.shape),
                                             mod.stride, mod.padding, mod.dilation,
                                             mod.groups)))  # fmt: skip

            hooks.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return calls


def time_call(call: ConvCall, first: bool, device, dtype, fmt, rounds: int, repeats: int) -> dict:
    """Median seconds of each pass of `call` (the input gradient absent for the first)."""
    x = torch.randn(call.input, device=device, dtype=dtype).to(memory_format=fmt)
    w = torch.randn(call.weight, device=device, dtype=dtype).to(memory_format=fmt) * 0.05
    y = F.conv2d(x, w, None, call.stride, call.padding, call.dilation, call.groups)
    dy = torch.randn_like(y)
    geometry = (call.stride, call.padding, call.dilation, False, (0, 0), call.groups)
    bwd = torch.ops.aten.convolution_backward.default
    runs = {
        "forward": lambda: F.conv2d(
            x, w, None, call.stride, call.padding, call.dilation, call.groups
        ),
        "weight grad": lambda: bwd(dy, x, w, None, *geometry, (False, True, False)),
    }
    if not first:
        runs["input grad"] = lambda: bwd(dy, x, w, None, *geometry, (True, False, False))
    for fn in runs.values():  # warm-up: cuDNN's plans, the allocator
        fn()
    times: dict[str, list[float]] = {p: [] for p in runs}
    for _ in range(rounds):
        for p, fn in runs.items():
            times[p].append(time_fn(fn, warmup=0, repeats=repeats, device=device).median_s)
    return {p: statistics.median(v) for p, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--input", action="append", help="as gpushape's --input, e.g. 256x3x224x224")
    p.add_argument("--batch", type=int)
    p.add_argument("--device", default="cuda")
    p.add_argument("--nchw", action="store_true", help="time NCHW tensors (default channels_last)")
    p.add_argument("--gpu", default="h200", help="the chip whose profile gives the rates")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default="conv_layers.json")
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    fmt = torch.contiguous_format if args.nchw else torch.channels_last
    resolved = resolve_model(args.model, batch=args.batch, dtype=dtype, device=args.device,
                             inputs=args.input)  # fmt: skip
    model = resolved.model.to(memory_format=fmt)
    inputs = tuple(
        t.to(memory_format=fmt) if isinstance(t, torch.Tensor) and t.dim() == 4 else t
        for t in resolved.example_inputs
    )
    calls = record_calls(model, inputs)
    if not calls:
        raise SystemExit(f"{args.model}: no Conv2d call in its forward")
    spec = calibrated(get_gpu(args.gpu))
    peak, copy_rate = spec.attainable_flops(dtype), spec.attainable_bandwidth_bytes_per_s()
    itemsize = torch.empty((), dtype=dtype).element_size()
    distinct: dict[ConvCall, dict] = {}
    for i, (name, call) in enumerate(calls):
        row = distinct.setdefault(call, {"modules": [], "first": i == 0})
        row["modules"].append(name)
    rows = []
    for call, row in distinct.items():
        measured = time_call(call, row["first"], device, dtype, fmt, args.rounds, args.repeats)
        flops, nbytes = call.flops(), call.pass_bytes(itemsize)
        passes = {
            pas: {
                "measured_s": secs,
                "roofline_s": max(flops / peak, nbytes[pas] / copy_rate),
                "bound": "compute" if flops / peak >= nbytes[pas] / copy_rate else "memory",
            }
            for pas, secs in measured.items()
        }
        count = len(row["modules"])
        rows.append(
            {
                "call": asdict(call),
                "output": call.output,
                "modules": row["modules"],
                "count": count,
                "flops_per_pass": flops,
                "passes": passes,
                "step_s": count * sum(v["measured_s"] for v in passes.values()),
                "step_roofline_s": count * sum(v["roofline_s"] for v in passes.values()),
            }
        )
        print(f"timed {row['modules'][0]} (x{count})", flush=True)
    rows.sort(key=lambda r: -r["step_s"])
    total, roof = sum(r["step_s"] for r in rows), sum(r["step_roofline_s"] for r in rows)
    print(f"\n{args.model}: {len(calls)} convolution calls, {len(rows)} distinct; a step's "
          f"convolutions {total * 1e3:.2f} ms, at their rooflines {roof * 1e3:.2f} ms "
          f"({roof / total:.0%})")  # fmt: skip
    print(f"{'first module':24} {'x':>3} {'input':>18} {'weight':>16} " + " ".join(
        f"{pas:>17}" for pas in PASSES) + f" {'step ms':>8}")  # fmt: skip
    for r in rows:
        cells = []
        for pas in PASSES:
            v = r["passes"].get(pas)
            cells.append(
                f"{v['measured_s'] * 1e3:7.3f} ms {v['roofline_s'] / v['measured_s']:5.0%}"
                if v
                else f"{'-':>17}"
            )
        shape = "x".join(map(str, r["call"]["input"]))
        weight = "x".join(map(str, r["call"]["weight"]))
        head = f"{r['modules'][0][:24]:24} {r['count']:3} {shape:>18} {weight:>16} "
        print(head + " ".join(cells) + f" {r['step_s'] * 1e3:8.3f}")
    results = {
        "model": args.model,
        "layout": "nchw" if args.nchw else "channels_last",
        "dtype": str(dtype).replace("torch.", ""),
        "peak_flops": peak,
        "copy_bytes_per_s": copy_rate,
        "step_s": total,
        "step_roofline_s": roof,
        "rows": rows,
    }
    write_results(args.out, results=results)


if __name__ == "__main__":
    main()
