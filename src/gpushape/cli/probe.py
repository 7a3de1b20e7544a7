"""`gpushape probe [--quick] [-o profile.json] [--report-dir DIR]`: measure this GPU.

Measures the ceilings (copy bandwidth, GEMM peak per dtype, launch overhead eager and in a CUDA
graph), sweeps GEMM and convolution shapes for alignment cliffs, batch sizes and wave
quantization, checks the design guide's rules of thumb, and writes a calibrated profile that
`gpushape audit --profile` reads, plus a Markdown report with PNG plots.

The output paths are checked before anything is measured (a missing or unwritable folder is one
line and exit 2, not minutes of measuring lost), and so is the GPU: without CUDA, one line and
exit 2. The profile is written whole or not at all (`output.write_text`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..errors import NoCudaError
from ..hardware import current_gpu
from ..hardware.spec import Achievable
from .output import check_file, check_folder, to_stdout, write_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "probe",
        help="measure this GPU's ceilings and shape cliffs",
        description="Measure this GPU's real ceilings and shape cliffs, check the "
        "design guide's rules of thumb on it, and write a calibrated "
        "profile plus a Markdown report with plots.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer dtypes and sweep points (under 90 s on an H200; full: under 5 min)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="PROFILE",
        help="profile JSON to write (default: gpushape-profile-<gpu>.json)",
    )
    p.add_argument(
        "--report-dir",
        type=Path,
        metavar="DIR",
        help="folder for probe-report.md and plots/ (default: the profile's folder)",
    )
    p.set_defaults(func=run)


def _check_output(path: str | Path) -> None:
    """The profile's folder may not exist yet (the probe makes it), but must be makeable."""
    check_folder(Path(path).parent)
    if Path(path).parent.exists():
        check_file(path)


def run(args: argparse.Namespace) -> int:
    if args.output is not None:
        _check_output(args.output)
    if args.report_dir is not None:
        check_folder(args.report_dir)
    import torch  # here, not at the top: `gpushape gpus` and `--help` need no torch

    if not torch.cuda.is_available():
        raise NoCudaError(
            "gpushape probe measures a GPU and needs a CUDA device; none is visible on this machine"
        )
    # imported here: the measuring code pulls in matplotlib and the claims' modules
    from ..probe.plan import full_plan, quick_plan
    from ..probe.profile import dumps_profile
    from ..probe.report import write_report
    from ..probe.runner import run_probe

    spec = current_gpu()
    assert spec is not None  # CUDA is available
    out = Path(args.output or f"gpushape-profile-{spec.name}.json")
    _check_output(out)
    profile = run_probe(
        quick_plan() if args.quick else full_plan(),
        spec=spec,
        console=Console(stderr=True, emoji=False),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, dumps_profile(profile))
    report = write_report(profile, args.report_dir or out.parent)  # OSError: one line, exit 2
    console = Console(emoji=False)
    with to_stdout():
        console.print(_summary(profile, spec))
        console.print(
            Text(f"profile: {out}\nreport:  {report} (plots in {report.parent / 'plots'})")
        )
    return 0


def _summary(profile: dict[str, Any], spec: Any) -> Table:
    c = profile["ceilings"]
    table = Table(
        title=escape(
            f"gpushape probe: {profile['device_name']} ({profile['probe']['mode']}, "
            f"{profile['probe']['timing']['total_s']:.0f} s); medians by CUDA events"
        )
    )
    table.add_column("measured")
    table.add_column("value", justify="right")
    table.add_column("datasheet / rule", justify="right")
    table.add_row(
        "copy bandwidth (read + write)",
        f"{c['copy_bytes_per_s'] / 1e9:,.0f} GB/s",
        f"{spec.memory_bandwidth_bytes_per_s / 1e9:,.0f} GB/s",
    )
    for dtype, flops in c["gemm_flops"].items():
        table.add_row(
            f"{dtype} GEMM peak",
            f"{flops / 1e12:,.1f} TFLOP/s",
            f"{spec.peak_flops(dtype) / 1e12:,.1f} TFLOP/s",
        )
    for dtype, flops in c.get("gemm_flops_cuda_cores", {}).items():
        table.add_row(
            f"{dtype} GEMM peak, TF32 off",
            f"{flops / 1e12:,.1f} TFLOP/s",
            f"{spec.peak_flops(dtype, tensor_cores=False) / 1e12:,.1f} TFLOP/s",
        )
    table.add_row(
        "launch, eager / CUDA graph",
        f"{c['launch_overhead_s'] * 1e6:.2f} / "
        f"{c.get('graph_launch_overhead_s', float('nan')) * 1e6:.2f} us",
        "-",
    )
    assumed = Achievable()
    for key, label, default_s in (
        ("gemm_latency", "GEMM kernel latency (fit)", assumed.gemm_latency_s),
        ("kernel_floor", "kernel floor", assumed.kernel_floor_s),
    ):
        seconds = (profile.get(key) or {}).get("seconds")
        if seconds is not None:
            table.add_row(label, f"{seconds * 1e6:.2f} us", f"{default_s * 1e6:.2f} us assumed")
    for dtype, g in profile["tc_align_elems"].items():
        table.add_row(
            f"{dtype} alignment cliff",
            f"{g} elements",
            f"{spec.tc_align_elems.get(dtype, '-')} elements",
        )
    for claim in profile["guide_claims"]:
        gain = "-" if claim["gain"] is None else f"{claim['gain']:+.2f}"
        table.add_row(f"guide: {claim['id']}", f"gain {gain}", claim["verdict"])
    return table
