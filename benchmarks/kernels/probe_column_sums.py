"""How fast does PyTorch sum a tensor down to one value a channel, by rows and channels?

    python benchmarks/kernels/probe_column_sums.py [--out column_sums.json] [--rounds 3]

Training steps take many such sums: a Linear's bias gradient (`grad.sum(0)` over every token, a
column sum of a rows x channels matrix), a channels_last convolution's bias gradient (the same
sum), and in NCHW the per-channel sums of a convolution's bias gradient or of a layer scale's
gradient (`x.sum((0, 2, 3))` of an N x C x H x W tensor). PyTorch's reduction kernel picks its
launch from both sizes, and its rate is not one number: on an H100, ConvNeXt-T's 50176 x 192
sums (stage 2 at batch 64) ran at about 200 GB/s, its 200704 x 384 sums at 1,300 GB/s
(benchmarks/results/correlate-h100/correlate-ops.json), where the cost model priced every
narrow sum at the rate of the one width it had measured (16384 x 768).

This times both layouts over a grid of rows (the positions of ConvNeXt-T's and Swin-T's four
stages at batch 64, and BERT's 16384 tokens) and channels (96 to 3072), bf16, each call from a
CUDA graph of `CALLS` calls (GPU time alone), checked against an fp32 sum first.
`fit_column_sums.py` turns the JSON into the profile's "reduction@<rows>x<channels>" and
"channel_sum@<rows>x<channels>" figures (tracing/families.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import compare, copy_bandwidth_bytes_per_s, cuda_graph, write_results

BATCH = 64  # the NCHW tensors' N; their H x W is rows / BATCH
ROWS = (3136, 12544, 16384, 50176, 200704)
CHANNELS = (96, 192, 384, 768, 1536, 3072)
CALLS = 20  # sums a timed graph replays
LAYOUTS = ("columns", "nchw")


def tensor_for(layout: str, rows: int, channels: int) -> torch.Tensor:
    """The tensor one sum reads: rows x channels, or N x channels x H x W with N x H x W rows."""
    if layout == "columns":
        return torch.randn(rows, channels, device="cuda", dtype=torch.bfloat16)
    side = round((rows / BATCH) ** 0.5)
    if BATCH * side * side != rows:
        raise ValueError(f"{rows} rows are not {BATCH} square images")
    return torch.randn(BATCH, channels, side, side, device="cuda", dtype=torch.bfloat16)


def summed(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0) if x.dim() == 2 else x.sum((0, 2, 3))


def shapes(rows: tuple[int, ...] = ROWS, channels: tuple[int, ...] = CHANNELS):
    """(layout, rows, channels) of every timed sum; the NCHW layout at whole images only."""
    for layout in LAYOUTS:
        for m in rows:
            if layout == "nchw" and m % BATCH:
                continue
            side = round((m / BATCH) ** 0.5)
            if layout == "nchw" and BATCH * side * side != m:
                continue
            for c in channels:
                yield layout, m, c


def _graphed(x: torch.Tensor):
    def many():
        for _ in range(CALLS):
            summed(x)

    return cuda_graph(many)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="column_sums.json")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    copy_bps = copy_bandwidth_bytes_per_s()
    rows = []
    for layout, m, c in shapes():
        x = tensor_for(layout, m, c)
        ref = summed(x.float())
        error = float((summed(x).float() - ref).abs().max() / ref.abs().max())
        graph = _graphed(x)
        gpu_s = compare({"graph": graph}, rounds=args.rounds, repeats_per_round=5)["graph"]
        gpu_s = gpu_s.median_s / CALLS
        nbytes = x.numel() * x.element_size()
        rows.append(
            {
                "layout": layout,
                "rows": m,
                "channels": c,
                "shape": list(x.shape),
                "graph_us": gpu_s * 1e6,
                "of_copy_rate": nbytes / gpu_s / copy_bps,
                "max_rel_error": error,
            }
        )
        del graph, x
    write_results(args.out, rows, copy_gbps=copy_bps / 1e9, calls_per_graph=CALLS)
    print(f"copy rate {copy_bps / 1e9:,.0f} GB/s; share of it by rows (down) and channels")
    for layout in LAYOUTS:
        print(f"{layout:>8} " + " ".join(f"{c:>6}" for c in CHANNELS))
        for m in ROWS:
            cells = {r["channels"]: r for r in rows if r["layout"] == layout and r["rows"] == m}
            if cells:
                print(f"{m:>8} " + " ".join(f"{cells[c]['of_copy_rate']:6.2f}" for c in CHANNELS))


if __name__ == "__main__":
    main()
