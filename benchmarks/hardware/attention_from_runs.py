"""SDPA's own attention kernel rates ("default/...") from kernel times of timed H200 steps.

The probe measures what SDPA picks by itself (`gpushape.probe.attention`, backend "default").
Until it has run on the H200, the same rates are taken from the training steps the library
loops timed there: torch.profiler's time of cuDNN's attention kernels in one step
(`top_kernels`: `cudnn_generated_fort_native_sdpa_sm90_flash_fprop_*` forward,
`..._bprop_*` backward) over the calls the model makes, against the GEMM model's compute time for
that call (the probe's own `model_s`, its attention factor left at 1). Only each pass's main kernel
is in the lists (cuDNN's backward runs small helper kernels too), so the backward's rate is
slightly optimistic. A row says which run and stage it came from; a probe run replaces it.

    python benchmarks/hardware/attention_from_runs.py [--write]   # --write: into the profile
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.attention import AttentionConfig, model_s  # noqa: E402
from gpushape.probe.memory import capped  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402

PROFILE = ROOT / "src/gpushape/hardware/profiles/h200-sxm.json"
RESULTS = ROOT / "benchmarks/results"
# (configuration, (batch, heads, tokens), calls a step, run, stage): each a step on the H200
# whose SDPA calls all had this shape; heads are the query's. The LLaMA-style model's calls are
# grouped (4 K/V heads): cuDNN runs them natively with the kernel a plain call gets (GPT-2's),
# no expansion kernel in the step, so they stand for the plain causal call
SOURCES = (
    (AttentionConfig("default", 64, causal=True), (8, 16, 1024), 8,
     "loops-h200-5/loop-hf_llama_hidden_size_1024_intermediate_size_2816_num_hidden_layers_8"
     "_num_attention_heads_16_num_key_value_heads_4_vocab_size_32000-compile.json",
     "+ fused-optimizer"),
    (AttentionConfig("default", 64, dropout=0.1, causal=True), (8, 12, 1024), 12,
     "loops-h200-4/loop-hf_gpt2-eager.json", "as given"),
    (AttentionConfig("default", 64, dropout=0.1), (32, 12, 512), 12,
     "loops-h200-5/loop-hf_bert-eager.json", "as given"),
    (AttentionConfig("default", 64), (64, 12, 197), 12,
     "loops-h200-5/loop-timm_vit_base_patch16_224-compile.json", "as given"),
)  # fmt: skip
KERNEL = "cudnn_generated_fort_native_sdpa_sm90_flash_"


def rows(spec) -> dict[str, dict]:
    out = {}
    for cfg, shape, calls, run, stage in SOURCES:
        data = json.loads((RESULTS / run).read_text())
        if "H200" not in data["environment"]["gpu"]:
            raise SystemExit(f"{run}: not an H200 run")
        kernels = dict(data["stages"][stage]["top_kernels"])
        fwd = sum(s for k, s in kernels.items() if k.startswith(KERNEL + "fprop")) / calls
        bwd = sum(s for k, s in kernels.items() if k.startswith(KERNEL + "bprop")) / calls
        model_fwd, model_bwd, flops_fwd, flops_bwd = model_s(spec, cfg, shape, torch.bfloat16)
        b, h, t = shape
        row = {
            "workload": f"{cfg.describe}, {b}x{h}x{t}x{cfg.head_dim}",
            "dtype": "bfloat16",
            "measured_fwd_s": fwd,
            "measured_bwd_s": bwd,
            "model_fwd_s": model_fwd,
            "model_bwd_s": model_bwd,
            "tflops_fwd": _tflops(flops_fwd, fwd),
            "tflops_bwd": _tflops(flops_bwd, bwd),
            "kernels": [k[:100] for k in kernels if k.startswith(KERNEL)],
            "source": f"benchmarks/results/{run}, stage {stage!r}: {calls} calls a step "
            "(torch.profiler kernel times; attention_from_runs.py)",
        }
        if fwd > 0:
            row[cfg.key(False)] = capped(model_fwd, fwd)
        if bwd > 0:
            row[cfg.key(True)] = capped(model_bwd, bwd)
        out[cfg.key(False).replace("/fwd", "")] = row
    return out


def _tflops(flops: int, seconds: float) -> float:
    return round(flops / seconds / 1e12, 1) if seconds > 0 and math.isfinite(seconds) else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"merge into {PROFILE.name}")
    args = parser.parse_args()
    profile = read_profile(PROFILE)
    spec = apply_profile(get_gpu(profile["gpu"]), profile, origin=str(PROFILE))
    found = rows(spec)
    print(f"{'attention (SDPA default)':<52} {'fwd':>6} {'TFLOP/s':>8} {'bwd':>6} {'TFLOP/s':>8}")
    for r in found.values():
        fwd = next((v for k, v in r.items() if "/fwd/" in k), float("nan"))
        bwd = next((v for k, v in r.items() if "/bwd/" in k), float("nan"))
        print(f"{r['workload']:<52} {fwd:>6.3f} {r['tflops_fwd']:>8.0f} {bwd:>6.3f} "
              f"{r['tflops_bwd']:>8.0f}")  # fmt: skip
    if args.write:
        profile["attention"] = {**(profile.get("attention") or {}), **found}
        profile.setdefault("probe", {})["attention_default_from"] = (
            "benchmarks/hardware/attention_from_runs.py (kernel times of timed H200 steps)"
        )
        print(f"wrote {write_profile(profile, PROFILE)}")


if __name__ == "__main__":
    main()
