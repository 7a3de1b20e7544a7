"""Measuring: timing, memory, kernel counts, A/B of baseline against optimized."""

from .record import copy_bandwidth_bytes_per_s, environment, write_results
from .timer import Timing, compare, cuda_graph, kernel_times, kernel_totals, time_fn

__all__ = [
    "Timing",
    "compare",
    "copy_bandwidth_bytes_per_s",
    "cuda_graph",
    "environment",
    "kernel_times",
    "kernel_totals",
    "time_fn",
    "write_results",
]
