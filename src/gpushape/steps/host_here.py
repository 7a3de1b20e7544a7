"""The host the loop runs on, priced from its own step: the loop's second prediction.

The audit prices the host's side of a step (dispatch in eager mode, a compiled step's wrapper
per kernel) at the profile's rates, which were measured on another host. Hosts differ by more
than a fix's margin: the H200's lent hosts issued the same compiled MobileNetV3 step in 37.3
and 19.7 ms, and a compiled step's host cost per kernel spread 26-63 us over 23 steps. Where
the host and the GPU are close, that decides whether a fix's GPU saving reaches the wall clock
and what a CUDA graph saves: a fifth lease's compiled ViT-B/16 and GPT-2 steps issued in about
their GPU time where the profile's rate priced their hosts 1.3x and 1.1x longer, and CUDA
graphs, predicted to save 7.95 and 9.22 ms, saved 0.50 and 1.13
(benchmarks/results/loops-h200-5).

The loop times the step as given before any fix: the host's issue time of that step (from an
idle GPU, `StepStats.issue_s`) over the audit's host time for it scales every host rate of
the profile, and each stage is predicted again with the scaled rates. Only the step as given
is read, never a fix's stage: what each fix saves stays a prediction.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .measure import StepStats

# the host side's spread once it is measured on this host: its issue time of one step varied
# 3-14% from stage to stage of one loop where the kernels barely changed (a fifth H200 lease:
# ViT-B/16 18.0-19.0 ms, Swin-T 23.2-25.4, ConvNeXt-T 21.3-24.5), against +-35% between the
# lent hosts the profile's rates came from (auditing/modes.py HOST_SPREAD)
HERE_SPREAD = 0.1
# scales outside this band are not taken: an issue time that far from the audit's host is a
# host that waited on something the audit does not price (a sync, a full launch queue)
SANE = (0.2, 5.0)


# a step issued in this share of its GPU time or more may have made the host wait on the GPU
# (a full launch queue, a sync): its issue time is then an upper bound of the host's own
WAITED = 0.9
# ... unless the step ran this much longer than its GPU was busy: the GPU idled between
# kernels, the launch queue never filled, and the host set the pace (PoolFormerV2-S12 eager on
# an H100: 26.8 ms steps, 23.6 of GPU work, 26.8 to issue; capped, graph-layers was predicted
# to save 0.72 ms and saved 3.10, benchmarks/results/loops-h100-32)
HOST_BOUND = 1.05


def host_scale(given: StepStats | None, predicted_host_s: float | None) -> float | None:
    """This host's issue time of the step as given over the audit's host time for it; None
    where either is unknown (no CUDA: the CPU runs the step itself) or the ratio is not sane.
    Where the issue time may include a wait on the GPU (`WAITED`) and the step kept the GPU
    busy (`HOST_BOUND`) it bounds the host's from above, so it only lowers the profile's rates
    (a GPU-bound eager GPT-2 step issued in 2.4x the audit's host time, about its GPU time, on
    a lease where its fixes' GPU savings all reached the wall clock)."""
    # Not `StepStats.host_s` (issued with the GPU held busy): it can overstate the host's
    # steady cost too. PoolFormer-S12 eager on an H100 "held" 23.4 ms of host a step and ran
    # 18.4 ms steps (benchmarks/results/loops-h100-30): with the GPU held, its launches fill
    # the queue and the host waits after all.
    if given is None or given.issue_s is None or not predicted_host_s or predicted_host_s <= 0:
        return None
    # a host issues every step of a block in turn, so its steady cost is at most the step's
    # median: an issue time from an idle GPU above that overstates it (GPT-2 compiled, a fifth
    # H200 lease: one stage issued in 22.0 ms from an idle GPU and ran 20.5 ms a step)
    issue = min(given.issue_s, given.median_s) if given.step_times_s else given.issue_s
    scale = issue / predicted_host_s
    busy = given.gpu_busy_s
    if busy is not None and issue >= WAITED * busy and given.median_s < HOST_BOUND * busy:
        scale = min(scale, 1.0)
    return scale if SANE[0] <= scale <= SANE[1] else None


def scaled_target(gpu: Any, scale: float) -> Any:
    """The audit's target for `gpu` with every measured host rate times `scale`."""
    from ..auditing.target import Target, resolve_target

    target = resolve_target(gpu)
    spec = target.spec
    host = {k: v * scale for k, v in (spec.achievable.host or {}).items()}
    achievable = dataclasses.replace(spec.achievable, host=host, host_spread=HERE_SPREAD)
    note = f"host rates x {scale:.2f}, from this host's step as given"
    spec = spec.replace(note=note, achievable=achievable)
    calibration = f"{target.calibration or 'datasheet'}; {note}"
    return Target(spec, calibration, target.measured, target.reason)
