"""How long the GPU idles where one CUDA graph's replay ends and the next one's begins.

graph-layers (transforms/graph_layers.py) replays each captured layer from two CUDA graphs a
step, its forward and its backward, so a step of N captured layers launches 2N graphs where a
whole-step graph launches one. Inside a graph the GPU idles about 0.25 us between kernels (the
profile's `device_gap` "graph"); at a boundary between two graphs it waits longer, for the
next graph's launch to reach it, even when the host queued that launch long before. The loop
priced those boundaries at nothing, so it under-predicted what a whole-step graph saves after
graph-layers (on an H100, 0.05 ms predicted for ResNet-50-GN's 16 captured layers against 0.21
measured; `benchmarks/results/loops-h100-30`).

`measure_graph_replay_gap` times, with the GPU held busy while the host queues everything,
`GRAPHS` graphs of `KERNELS` in-place multiplications each, replayed back to back, against one
graph holding all of those kernels; the difference over the boundaries (GRAPHS - 1) is the gap
a replay adds. It goes into a profile as `device_gap["graph_replay"]`.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

__all__ = ["measure_graph_replay_gap"]

GRAPHS = 48  # graphs in the chain (graph-layers captures 12-24 layers: 24-48 launches a step)
KERNELS = 4  # kernels in each graph
ELEMENTS = 1 << 21  # 4 MB of float16 a kernel: a few microseconds on a Hopper GPU


def _graph(body: Any, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        body()  # warm-up on the side stream, as capture wants
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph, stream=stream):
        body()
    return graph


def measure_graph_replay_gap(
    device: str = "cuda", repeats: int = 7, graphs: int = GRAPHS
) -> dict[str, Any] | None:
    """{"seconds": the GPU's idle time a graph replay adds, "chain_s", "single_s", ...};
    None without CUDA (a CPU replays no graphs)."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    from ..bench.timer import hold_gpu

    buf = torch.ones(ELEMENTS, device=device, dtype=torch.float16)

    def kernels(n: int) -> Any:
        def body() -> None:
            for _ in range(n):
                buf.mul_(1.0)

        return body

    stream = torch.cuda.Stream()
    chain = [_graph(kernels(KERNELS), stream) for _ in range(graphs)]
    single = _graph(kernels(KERNELS * graphs), stream)
    torch.cuda.synchronize()

    def timed(run: Any) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        hold_gpu(0.005)  # the host queues every launch before the GPU reaches the first
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    def replay_chain() -> None:
        for g in chain:
            g.replay()

    for run in (replay_chain, single.replay):  # first replays
        timed(run)
    chain_s, single_s = [], []
    for _ in range(repeats):  # alternating
        chain_s.append(timed(replay_chain))
        single_s.append(timed(single.replay))
    chain_med, single_med = statistics.median(chain_s), statistics.median(single_s)
    return {
        "seconds": max(chain_med - single_med, 0.0) / (graphs - 1),
        "chain_s": chain_med,
        "single_s": single_med,
        "workload": f"{graphs} CUDA graphs of {KERNELS} in-place multiplications of "
        f"{ELEMENTS} float16 values replayed back to back, against one graph of all "
        f"{graphs * KERNELS}, the GPU held busy while the host queued them; CUDA events, "
        f"medians of {repeats} alternated rounds; the difference over the {graphs - 1} "
        "boundaries",
        "source": "gpushape.probe.gaps.measure_graph_replay_gap",
    }
