"""The "attention_pass" memory family's efficiency from kernel times of timed training steps.

A fused attention backward (cuDNN's, FlashAttention-2's) runs memory-bound kernels beside its
main one: `compute_dot_do_o` (the row sums of dO . O) and `convert_dq_to_16bits` (dQ from its
float32 accumulator), among others (`gpushape.tracing.flops.attention.backward_passes`). The
cost model prices them at this family's rate. Here it is taken from a BERT-base step
(32 x 12 heads x 512 x 64, 12 SDPA calls) that each chip ran with its kernel times listed:
those two kernels' torch.profiler time a step over the calls, against the cost model's time
for the same two passes at the copy rate. The zeroing memset and a grouped-query call's head
reduction are not in the lists (memsets are not kernels there; BERT's heads are not grouped):
they take the copy rate and this family's rate as they are.

    python benchmarks/hardware/attention_pass_from_runs.py [--profile P] [--write]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from _family_row import derived_row  # noqa: E402

from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402
from gpushape.tracing.flops.attention import ATTENTION_PASS, backward_passes  # noqa: E402
from gpushape.tracing.tracer import trace  # noqa: E402

PROFILE = ROOT / "src/gpushape/hardware/profiles/h200-sxm.json"
RESULTS = ROOT / "benchmarks/results"
# by the profile's chip: (run, where its kernel list is, (batch, heads, length, head size), calls)
SOURCES = {
    "h200-sxm": ("bench-h200/case-bert-20261205-2202.json", ("variants", "eager"),
                 (32, 12, 512, 64), 12),
    "h100-sxm": ("loops-h100-19/loop-hf_bert-eager.json", ("stages", "as given"),
                 (32, 12, 512, 64), 12),
}  # fmt: skip
KERNELS = ("compute_dot_do_o", "convert_dq_to_16bits")  # the two passes the lists hold


class _Sdpa(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def model_s(spec, shape: tuple[int, int, int, int]) -> float:
    """The cost model's seconds for a call's row sums and dQ conversion at the copy rate."""
    b, h, t, d = shape
    qkv = tuple(
        torch.empty(b, h, t, d, dtype=torch.bfloat16, device="meta", requires_grad=True)
        for _ in range(3)
    )
    rec = next(r for r in trace(_Sdpa(), qkv, train=True).ops if r.op.endswith("backward.default"))
    bandwidth = spec.attainable_bandwidth_bytes_per_s()
    return sum(n / bandwidth for n, family in backward_passes(rec) if family == ATTENTION_PASS)


def row(gpu: str, spec) -> dict:
    run, where, shape, calls = SOURCES[gpu]
    data = json.loads((RESULTS / run).read_text())
    kernels = dict(data[where[0]][where[1]]["top_kernels"])
    found = {k: s for k, s in kernels.items() if any(name in k for name in KERNELS)}
    if len(found) != len(KERNELS):
        raise SystemExit(f"{run}: {', '.join(KERNELS)} not all in its kernel list")
    measured = sum(found.values()) / calls
    family = model_s(spec, shape)
    b, h, t, d = shape
    return derived_row(
        family,
        measured,
        f"a fused attention backward's dO . O row sums and dQ conversion, {b}x{h}x{t}x{d} "
        "(BERT-base's calls)",
        f"benchmarks/results/{run}, {where[1]!r}: {calls} calls a step (torch.profiler kernel "
        "times; attention_pass_from_runs.py)",
        kernels=[k[:100] for k in found],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--write", action="store_true", help="merge into --profile")
    args = parser.parse_args()
    profile = read_profile(args.profile)
    gpu = profile["gpu"]
    if gpu not in SOURCES:
        raise SystemExit(f"no committed run lists {gpu}'s attention kernels: {sorted(SOURCES)}")
    spec = apply_profile(get_gpu(gpu), profile, origin=str(args.profile))
    flat = spec.replace(
        achievable=dataclasses.replace(spec.achievable, memory_efficiency={})
    )  # the copy rate
    found = row(gpu, flat)
    print(
        f"{gpu}: {found['measured_s'] * 1e6:.1f} us a call measured, "
        f"{found['family_roofline_s'] * 1e6:.1f} us at the copy rate: {found['efficiency']:.4f}"
    )
    if args.write:
        profile.setdefault("memory_efficiency", {})[ATTENTION_PASS] = found
        print(f"wrote {write_profile(profile, args.profile)}")


if __name__ == "__main__":
    main()
