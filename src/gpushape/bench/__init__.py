"""Measuring: timing, memory, kernel counts, A/B of baseline against optimized."""

from .timer import Timing, compare, time_fn

__all__ = ["Timing", "compare", "time_fn"]
