"""Measured time per module from torch.profiler events, attributed the way gpushape's tracer
attributes ops, and Spearman's rank correlation without scipy.

Forward: module forward hooks push `record_function("gs::<module path>")` ranges; a kernel
belongs to the innermost range around the op that launched it. Backward: the op runs inside
`autograd::engine::evaluate_function: <Node>` whose sequence number is the forward op's, so it
belongs to the module the forward op ran in. Every op that passes autograd records the
sequence number the next node will take, so ops that make no node (a view of the token ids
before an embedding) carry the same number as the op after them that does: the number belongs
to the last forward op that carried it (an embedding's backward to the Embedding, not to the
parent that reshaped its ids).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

PREFIX = "gs::"
BACKWARD = "autograd::engine::evaluate_function: "


@contextlib.contextmanager
def module_ranges(model: nn.Module) -> Iterator[None]:
    """A profiler range named gs::<path> around every module's forward while active."""
    names = {id(m): name for name, m in model.named_modules()}
    open_ranges: dict[int, list] = defaultdict(list)

    def push(module, args):
        rf = torch.autograd.profiler.record_function(PREFIX + names.get(id(module), "?"))
        rf.__enter__()
        open_ranges[id(module)].append(rf)

    def pop(module, args, output):
        if open_ranges[id(module)]:
            open_ranges[id(module)].pop().__exit__(None, None, None)

    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(push))
        handles.append(m.register_forward_hook(pop, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _self_time_us(event, device: bool) -> float:
    if device:
        value = getattr(event, "self_device_time_total", None)
        return float(value if value is not None else event.self_cuda_time_total)
    return float(event.self_cpu_time_total)


def _forward_module(event) -> str | None:
    e = event
    while e is not None:
        if e.name.startswith(PREFIX):
            return e.name[len(PREFIX) :]
        if e.name.startswith(BACKWARD):
            return None
        e = e.cpu_parent
    return None


def _backward_node(event):
    e = event
    while e is not None:
        if e.name.startswith(BACKWARD):
            return e
        e = e.cpu_parent
    return None


def node_modules(events) -> dict[int, str]:
    """Autograd sequence number -> the module of the last forward op that carried it (the op
    whose node took it; see the module docstring)."""
    forward = sorted(
        (
            e
            for e in events
            if e.sequence_nr is not None and e.sequence_nr >= 0 and not e.name.startswith(BACKWARD)
        ),
        key=lambda e: e.time_range.start,
    )
    seq_module: dict[int, str] = {}
    for e in forward:
        module = _forward_module(e)
        if module is not None:
            seq_module[e.sequence_nr] = module
    return seq_module


def _attributed(events, device: bool) -> Iterator[tuple[str | None, str, float]]:
    """(module or None, op name, seconds) of every op that ran kernels (device=True) or, on a
    machine without a GPU, of every aten op's CPU self time (device=False)."""
    seq_module = node_modules(events)
    for e in events:
        # Kernels appear twice: as device events of their own and inside the CPU op that
        # launched them (its self device time). Count them once, through the CPU op.
        if not str(e.device_type).endswith("CPU") or e.is_async:
            continue
        if not device and not e.name.startswith("aten::"):
            continue
        t = _self_time_us(e, device) * 1e-6
        if t <= 0:
            continue
        module = _forward_module(e)
        if module is None:
            node = _backward_node(e)
            module = seq_module.get(node.sequence_nr) if node is not None else None
        yield module, e.name, t


def time_per_module(events, *, device: bool = True) -> tuple[dict[str, float], float, float]:
    """(seconds per module, seconds not attributed, total seconds) over the profiled events.

    device=True sums kernels' device time (CUDA); device=False sums CPU self time of aten ops
    (for checking this attribution on a machine without a GPU).
    """
    per_module: dict[str, float] = defaultdict(float)
    unattributed = total = 0.0
    for module, _, t in _attributed(events, device):
        total += t
        if module is None:
            unattributed += t
        else:
            per_module[module] += t
    return dict(per_module), unattributed, total


def time_per_module_op(events, *, device: bool = True) -> dict[str, dict[str, float]]:
    """Seconds per module and, within it, per op that launched the kernels (the innermost:
    `aten::cudnn_convolution`, not the `aten::conv2d` around it), as `time_per_module` counts
    them; ops attributed to no module are left out."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for module, op, t in _attributed(events, device):
        if module is not None:
            out[module][op] += t
    return {m: dict(ops) for m, ops in out.items()}


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    order = np.argsort(values, kind="stable")
    sorted_vals = values[order]
    r = np.empty(len(values))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        r[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a, b) -> float:
    """Spearman's rho: Pearson correlation of the ranks."""
    ra, rb = ranks(np.asarray(a, dtype=float)), ranks(np.asarray(b, dtype=float))
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])
