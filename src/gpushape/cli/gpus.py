"""`gpushape gpus [NAME] [--json]`: the chip catalog, or one chip's whole spec.

Names and sources come from the catalog and the driver: printed as `rich.text.Text`, never as
markup or emoji codes. An unknown NAME is one line and exit 2."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import UnknownGPUError
from ..hardware import CATALOG, DTYPES, GPUSpec, current_gpu, get_gpu
from .output import to_stdout


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gpus",
        help="the GPU catalog, or one chip's spec",
        description="List the GPU catalog (the current device is marked), "
        "or show one chip's whole spec.",
    )
    p.add_argument("name", nargs="?", help="a chip name or alias (h100, 'nvidia h200', ...)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _current() -> tuple[GPUSpec | None, str | None]:
    """The current device's spec, or a note saying why there is none."""
    try:
        spec = current_gpu()
    except UnknownGPUError as exc:
        return None, f"current device is not in the catalog: {exc}"
    return spec, None if spec else "no CUDA device on this machine"


def _tflops(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e12:,.1f}"


def run(args: argparse.Namespace) -> int:
    with to_stdout():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    console = Console(emoji=False)
    current, note = _current()
    if args.name:
        spec = get_gpu(args.name)
        is_current = current is not None and current.name == spec.name
        spec = current if is_current else spec
        if args.json:
            print(json.dumps({**spec.to_dict(), "current": is_current}, indent=2))
        else:
            _show_one(console, spec, is_current)
        return 0
    rows = [current if current is not None and s.name == current.name else s for s in CATALOG]
    if args.json:
        print(
            json.dumps(
                [
                    {**s.to_dict(), "current": current is not None and s.name == current.name}
                    for s in rows
                ],
                indent=2,
            )
        )
        return 0
    _show_catalog(console, rows, current)
    if note:
        console.print(Text(note, style="dim"))
    return 0


def _show_catalog(console: Console, rows: list[GPUSpec], current: GPUSpec | None) -> None:
    table = Table(
        title="GPU catalog: dense datasheet peaks, TFLOP/s on tensor cores except fp32;\n"
        "ridge = bf16 (fp16 on V100) peak / bandwidth; * = this machine's device"
    )
    table.add_column("")
    table.add_column("name", no_wrap=True)
    for col in (
        "SMs",
        "mem GB",
        "mem TB/s",
        "L2 MiB",
        "bf16 TFLOP/s",
        "tf32",
        "fp32",
        "ridge FLOP/B",
    ):
        table.add_column(col, justify="right")
    for s in rows:
        mark = "*" if current is not None and s.name == current.name else ""
        half = "bf16" if s.has_tensor_cores("bf16") else "fp16"
        table.add_row(
            mark,
            Text(s.name),
            str(s.sm_count),
            f"{s.memory_bytes / 1e9:,.0f}",
            f"{s.memory_bandwidth_bytes_per_s / 1e12:.2f}",
            f"{s.l2_bytes / 2**20:.0f}",
            _tflops(s.tensor_core_flops.get(half)),
            _tflops(s.tensor_core_flops.get("tf32")),
            _tflops(s.cuda_core_flops["fp32"]),
            f"{s.ridge_point(half):.0f}",
        )
    console.print(table)


def _show_one(console: Console, s: GPUSpec, is_current: bool) -> None:
    title = f"{s.full_name} ({s.name})" + ("  * this machine's device" if is_current else "")
    table = Table(title=Text(title, style="table.title"), show_header=False)
    table.add_column("field")
    table.add_column("value")

    def src(field: str) -> str:
        return f"  ({s.overridden[field]})" if field in s.overridden else ""

    def row(field: str, value: str) -> None:  # the user's and the driver's text: never markup
        table.add_row(Text(field), Text(value))

    row("aliases", ", ".join(s.aliases))
    major, minor = s.compute_capability
    row("architecture", f"{s.arch}, compute capability {major}.{minor}")
    row("SMs", f"{s.sm_count}{src('sm_count')}")
    row("boost clock", f"{s.boost_clock_hz / 1e6:,.0f} MHz")
    row("memory", f"{s.memory_bytes / 1e9:,.1f} GB{src('memory_bytes')}")
    row("memory bandwidth", f"{s.memory_bandwidth_bytes_per_s / 1e12:.2f} TB/s")
    row("L2", f"{s.l2_bytes / 2**20:.0f} MiB{src('l2_bytes')}")
    for d in DTYPES:
        tc, cc = s.tensor_core_flops.get(d), s.cuda_core_flops.get(d)
        if tc or cc:
            unit = "TOP/s" if d == "int8" else "TFLOP/s"
            row(f"{d} peak", f"tensor cores {_tflops(tc)}, CUDA cores {_tflops(cc)} {unit}")
    row(
        "tensor-core alignment",
        ", ".join(f"{d}: {n}" for d, n in s.tc_align_elems.items()) + " elements",
    )
    lim = s.sm_limits
    row(
        "per SM",
        f"{lim.max_threads} threads, {lim.max_warps} warps, "
        f"{lim.max_blocks} blocks, {lim.registers} registers, "
        f"{lim.shared_mem_bytes // 1024} KiB shared "
        f"({lim.max_shared_mem_per_block_bytes // 1024} KiB per block)",
    )
    nvlink = s.nvlink_bandwidth_bytes_per_s
    links = f"NVLink {nvlink / 1e9:,.0f} GB/s" if nvlink else "no NVLink"
    row(
        "interconnect",
        f"{links}, PCIe {s.pcie_bandwidth_bytes_per_s / 1e9:,.0f} GB/s (totals, both directions)",
    )
    a = s.achievable
    row(
        "achievable (" + a.source + ")",
        f"copy {a.memory_bandwidth_fraction:.0%} of bandwidth, GEMM "
        + ", ".join(f"{k} {v:.0%}" for k, v in a.gemm_fraction.items())
        + f" of peak; launch {a.launch_overhead_s * 1e6:.1f} us eager, "
        f"{a.graph_launch_overhead_s * 1e6:.1f} us in a CUDA graph",
    )
    row("sources", "; ".join(s.sources))
    console.print(table)
