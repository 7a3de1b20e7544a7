"""Do gpushape's GRN kernels give the same y and dx for bf16 and for float32 parameters?

    python benchmarks/kernels/probe_grn_param_dtypes.py [--out grn_param_dtypes.json]
                                                        [--shape 4x14x14x1536] [--ptx DIR]
                                                        [--device cuda|cpu]

Autocast keeps a GRN's weight and bias in float32 while x is bf16; a model cast to bf16 has them
in bf16. The kernels read the parameters in their own dtype and compute in float32, so with
values exact in bf16 the two calls compute the same numbers, up to how each compiled build
rounds. For one N x H x W x C shape in both layouts (default: ConvNeXt-V2-T's third stage at
batch 4), the parameters
alternate bf16 and float32, five calls each way round, and the script reports:
  - whether each dtype's calls agree bit for bit among themselves (determinism),
  - how many elements of y and dx differ between the two dtypes, and by how much,
  - for each dtype, how many elements of y and dx differ from the float64 result rounded to
    bf16 (which build, if either, rounds further from the exact answer).
--ptx DIR also writes the PTX of every compiled build of the per-sample and elementwise kernels,
to diff. --device cpu runs Triton's interpreter (TRITON_INTERPRET=1): the algorithm alone; its
conversion of float32 to bf16 truncates where a GPU rounds to nearest, so there about half the
elements sit one unit from the rounded exact answer.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results
from gpushape.kernels import global_response_norm
from gpushape.kernels.grn._kernels import _grn_apply_kernel, _grn_sample_kernel
from gpushape.kernels.grn._reference import reference_backward, reference_forward

EPS = 1e-6
SHAPE = (4, 14, 14, 1536)
DTYPES = (torch.bfloat16, torch.float32) * 2 + (torch.bfloat16,)


def _case(nhwc: tuple[int, ...], layout: str, device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cpu").manual_seed(0)
    n, h, w, c = nhwc
    shape = nhwc if layout == "nhwc" else (n, c, h, w)
    x = (0.7 * torch.randn(shape, generator=g) - 0.3).to(torch.bfloat16)
    w, b = (torch.randn(c, generator=g).to(torch.bfloat16) for _ in range(2))
    dy = torch.randn(shape, generator=g).to(torch.bfloat16)
    return tuple(t.to(device) for t in (x, w, b, dy))


def _call(x, w, b, dy, channels_last):
    x = x.detach().requires_grad_()
    w, b = (t.detach().requires_grad_() for t in (w, b))
    y = global_response_norm(x, w, b, EPS, channels_last)
    (dx,) = torch.autograd.grad(y, (x,), dy)
    return y.detach(), dx


def _exact(x, w, b, dy, channels_last):
    """y and dx in float64 (the reference path), rounded once to bf16."""
    x64, w64, b64, dy64 = (t.double() for t in (x, w, b, dy))
    y, _ = reference_forward(x64, w64, b64, EPS, channels_last)
    dx, _, _ = reference_backward(dy64, x64, w64, EPS, channels_last)
    return y.to(torch.bfloat16), dx.to(torch.bfloat16)


def _diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a.float() - b.float()).abs()
    return {"elements": int((a != b).sum()), "max_abs": float(d.max()) if d.numel() else 0.0}


def probe(nhwc: tuple[int, ...], layout: str, device: str) -> dict:
    channels_last = layout == "nhwc"
    x, w, b, dy = _case(nhwc, layout, device)
    runs: dict[str, list] = {}
    for dtype in DTYPES:
        runs.setdefault(str(dtype).split(".")[-1], []).append(
            _call(x, w.to(dtype), b.to(dtype), dy, channels_last)
        )
    exact = _exact(x, w, b, dy, channels_last)
    row: dict = {"layout": layout, "shape": list(x.shape), "elements": x.numel()}
    for name, calls in runs.items():
        row[name] = {
            "calls": len(calls),
            "deterministic": all(torch.equal(c[i], calls[0][i]) for c in calls for i in (0, 1)),
            "y_vs_exact": _diff(calls[0][0], exact[0]),
            "dx_vs_exact": _diff(calls[0][1], exact[1]),
        }
    bf, fp = runs["bfloat16"][0], runs["float32"][0]
    row["y_bf16_vs_fp32"], row["dx_bf16_vs_fp32"] = _diff(bf[0], fp[0]), _diff(bf[1], fp[1])
    return row


def write_ptx(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kernel in (_grn_sample_kernel, _grn_apply_kernel):
        for cache in getattr(kernel, "device_caches", {}).values():
            for i, (key, compiled) in enumerate(cache[0].items()):
                path = folder / f"{kernel.fn.__name__}-{i}.ptx"
                path.write_text(f"// {key}\n" + compiled.asm.get("ptx", ""))
                written.append(path.name)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default=os.path.join(os.environ.get("OUT", "out"), "grn_param_dtypes.json")
    )
    ap.add_argument("--shape", default="x".join(map(str, SHAPE)), help="N x H x W x C")
    ap.add_argument("--ptx", type=Path, help="write the kernels' PTX here")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("probe_grn_param_dtypes: no CUDA device (try --device cpu with TRITON_INTERPRET=1)")
        return 2
    try:
        nhwc = tuple(int(v) for v in args.shape.lower().split("x"))
        assert len(nhwc) == 4 and min(nhwc) > 0
    except (ValueError, AssertionError):
        ap.error(f"--shape: {args.shape!r} is not N x H x W x C, e.g. 4x14x14x1536")
    rows = [probe(nhwc, layout, args.device) for layout in ("nchw", "nhwc")]
    ptx = write_ptx(args.ptx) if args.ptx and args.device == "cuda" else []
    write_results(args.out, rows, shape_nhwc=list(nhwc), eps=EPS, ptx=ptx)
    print(f"{'layout':7}{'dtype':>10}{'determ.':>9}{'y!=exact':>10}{'dx!=exact':>11}")
    for r in rows:
        for name in ("bfloat16", "float32"):
            s = r[name]
            print(
                f"{r['layout']:7}{name:>10}{s['deterministic']!s:>9}"
                f"{s['y_vs_exact']['elements']:>10}{s['dx_vs_exact']['elements']:>11}"
            )
        print(
            f"{r['layout']:7}{'bf16-fp32':>10}{'':>9}{r['y_bf16_vs_fp32']['elements']:>10}"
            f"{r['dx_bf16_vs_fp32']['elements']:>11}   of {r['elements']:,}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
