"""Rates of SDPA's fused kernel given an explicit mask, from `probe_masked_sdpa.py`'s kernel
times, into a gpushape profile's "attention" rows as backend "cudnn_masked".

On the H200 (torch 2.11) every masked bf16 call the probe made ran cuDNN's attention kernels,
eagerly and compiled, over the whole square of scores. The rates are those kernels' times
against the GEMM model's compute time for the same work (at rate 1), forward and
backward, without and with dropout, from the probe's bidirectional shape (BERT's) with a 2-D
boolean all-true mask; materialized-attention-mask prices a masked call with them. The causal
shape's masked calls (GPT-2's) are printed against what the rates predict for them, as a check
on shapes the rates were not fitted on.

    python benchmarks/kernels/fit_masked_sdpa.py \
        benchmarks/results/kernels-h200/probe_masked_sdpa.json \
        [--profile src/gpushape/hardware/profiles/h200-sxm.json] [-o PROFILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.auditing.pricing.attention import AttentionShape, fused_records  # noqa: E402
from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402
from gpushape.tracing.cost import op_cost  # noqa: E402

DEFAULT = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"
MASK = "bool all-true"
BACKEND = "cudnn_masked"  # tracing/flops/attention.kernel_of: cuDNN's op with an attn_bias


def kernel_s(row: dict, which: str) -> float:
    """Seconds a call of the kernels whose name has `which` ("fprop", "bprop")."""
    return sum(us for name, us in row["kernels_us"].items() if which in name) * 1e-6


def _costs(spec, b: int, h: int, t: int, d: int, dropout: bool):
    shape = AttentionShape(bh=b * h, tq=t, tk=t, d=d, dv=d, dtype="bfloat16", has_mask=True,
                           dropout=dropout)  # fmt: skip
    return [op_cost(r, spec) for r in fused_records(shape, True, "cudnn", causal=False)]


def model_s(spec, b: int, h: int, t: int, d: int, dropout: bool) -> tuple[float, float]:
    """(forward, backward) seconds of the masked call as the cost model prices cuDNN's kernel
    with `spec`'s rates: every score computed."""
    fwd, bwd = _costs(spec, b, h, t, d, dropout)
    return fwd.kernel_time_s, bwd.kernel_time_s


def fit(probe: dict, profile: dict) -> tuple[dict, list[str]]:
    """The profile's new "attention" rows, and lines comparing measured with predicted."""
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, attention={}))
    rows = probe["results"]["rows"]
    decoder, encoder = (tuple(s) for s in probe["results"]["shapes"][:2])
    b, h, t, d = encoder
    new, lines = {}, []
    for dropout in (False, True):
        row = rows[f"{b}x{h}x{t}x{d} eager, {MASK}, dropout {0.1 if dropout else 0.0}"]
        fwd_s, bwd_s = kernel_s(row, "fprop"), kernel_s(row, "bprop")
        fwd_cost, bwd_cost = _costs(flat, b, h, t, d, dropout)
        # the rate scales the model's compute side alone (probe/attention.py): taken against it
        model_fwd, model_bwd = fwd_cost.compute_s, bwd_cost.compute_s
        flags = "dropout/" if dropout else ""
        new[f"{BACKEND}/{flags}d{d}"] = {
            f"{BACKEND}/fwd/{flags}d{d}": round(model_fwd / fwd_s, 4),
            f"{BACKEND}/bwd/{flags}d{d}": round(model_bwd / bwd_s, 4),
            "workload": f"cuDNN's SDPA given a {MASK} boolean mask, head size {d}"
            f"{', dropout 0.1' if dropout else ''}, {b}x{h}x{t}x{d} (probe_masked_sdpa.py)",
            "dtype": "bfloat16",
            "measured_fwd_s": fwd_s,
            "measured_bwd_s": bwd_s,
            "model_fwd_s": model_fwd,
            "model_bwd_s": model_bwd,
            "tflops_fwd": round(fwd_cost.flops / fwd_s / 1e12, 1),
            "tflops_bwd": round(bwd_cost.flops / bwd_s / 1e12, 1),
        }
    fitted = apply_profile(get_gpu(profile["gpu"]), {**profile, "attention": {
        **profile.get("attention", {}), **new}})  # fmt: skip
    for shape, masks in ((encoder, ("bool all-true b1tt",)), (decoder, ("bool causal",))):
        b, h, t, d = shape
        for kind in masks:
            for dropout in (False, True):
                row = rows.get(f"{b}x{h}x{t}x{d} eager, {kind}, dropout {0.1 if dropout else 0.0}")
                if row is None:
                    continue
                measured = kernel_s(row, "fprop") + kernel_s(row, "bprop")
                predicted = sum(model_s(fitted, b, h, t, d, dropout))
                lines.append(
                    f"{b}x{h}x{t}x{d} {kind}, dropout {dropout}: measured "
                    f"{measured * 1e6:.0f} us, predicted {predicted * 1e6:.0f} us "
                    f"({predicted / measured:.2f})"
                )
    return new, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", help="probe_masked_sdpa.py's JSON")
    p.add_argument("--profile", default=str(DEFAULT))
    p.add_argument("-o", "--output", help="where to write the profile (default: --profile)")
    args = p.parse_args(argv)
    probe = json.loads(Path(args.probe).read_text())
    profile = read_profile(args.profile)
    new, lines = fit(probe, profile)
    profile["attention"] = {**profile.get("attention", {}), **new}
    profile.setdefault("probe", {})["masked_attention_fitted_from"] = str(args.probe)
    out = write_profile(profile, args.output or args.profile)
    print(f"wrote {out}")
    for key, row in new.items():
        rates = {k: v for k, v in row.items() if k.startswith(f"{BACKEND}/")}
        print(key, rates)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
