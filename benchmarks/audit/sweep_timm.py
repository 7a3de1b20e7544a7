"""Audit about 30 timm families users train on the meta device (no GPU, no weights), in eager
and in compile mode, a bf16 training step on the H200 profile, and check four things: (a) no
fp32-math or manual-attention finding at high or medium on a model whose attention runs
through SDPA (timm's `fused_attn` True on every attention module); (b) no wave-quantization
or tc-align finding on a depthwise or grouped convolution (a Conv2d with groups > 1); (c) no
model that fails to build or trace; (d) no finding whose est_saving_s is negative or NaN (a
negative wall_saving_s, a fix that slows the wall clock, is listed apart). Each model is built
at gpushape's default image batch (64; the sweep traces in about a minute, so no smaller batch
is needed); names the installed timm lacks are listed and skipped.

    python benchmarks/audit/sweep_timm.py --out benchmarks/results/audit-cpu/sweep_timm.json
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from fnmatch import fnmatchcase
from pathlib import Path

import timm
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.auditing import audit  # noqa: E402
from gpushape.auditing.finding import Severity  # noqa: E402
from gpushape.bench import write_results  # noqa: E402
from gpushape.models import resolve_model  # noqa: E402

MODELS = (
    "resnet50", "resnet18", "resnext50_32x4d", "wide_resnet50_2", "regnety_016",
    "efficientnet_b0", "efficientnetv2_rw_s", "mobilenetv3_large_100", "mobilenetv4_conv_small",
    "ghostnet_100", "convnext_tiny", "convnextv2_tiny", "densenet121", "inception_v3",
    "vit_small_patch16_224", "vit_base_patch16_224", "deit_small_patch16_224",
    "beit_base_patch16_224", "eva02_small_patch14_224", "swin_tiny_patch4_window7_224",
    "swinv2_tiny_window8_256", "maxvit_tiny_tf_224", "coatnet_0_rw_224", "mobilevit_s",
    "levit_128", "poolformer_s12", "cait_xxs24_224", "xcit_tiny_12_p16_224",
    "twins_pcpvt_small", "pvt_v2_b0", "edgenext_small", "repvgg_a2", "dla34", "hrnet_w18_small",
)  # fmt: skip
MODES = ("eager", "compile")
ATTENTION_RULES = ("fp32-math", "manual-attention")
SHAPE_RULES = ("wave-quantization", "tc-align")


def _num(x):
    return "nan" if isinstance(x, float) and math.isnan(x) else x


def _attention(model: nn.Module) -> str | None:
    fused = [m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")]
    return None if not fused else "sdpa" if all(fused) else "eager" if not any(fused) else "mixed"


def _grouped(model: nn.Module) -> dict[str, int]:
    convs = ((n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d))
    return {n: m.groups for n, m in convs if m.groups > 1}


def _finding(f, grouped: dict[str, int]) -> dict:
    # the GEMM sites' own module list where the rule gives one (its pattern may cover more)
    names = [m for m in f.evidence.get("modules", ()) if not m.startswith("...")] or [f.module]
    on = sorted({g for g in grouped for p in names if p and fnmatchcase(g, p)})
    wall = _num(f.evidence.get("wall_saving_s"))
    row = {"severity": f.severity.label, "rule": f.rule, "module": f.module, "fix": f.fix,
           "est_saving_s": _num(f.est_saving_s), "wall_saving_s": wall}  # fmt: skip
    if f.rule in SHAPE_RULES and on:
        row["grouped_convs"] = {g: grouped[g] for g in on}  # name -> groups
    return row


def sweep(names) -> list[dict]:
    rows = []
    for name in names:
        row: dict = {"model": name}
        rows.append(row)
        start = time.perf_counter()
        try:
            r = resolve_model(f"timm:{name}")
            row["build_s"] = round(time.perf_counter() - start, 2)
        except Exception as exc:
            row["error"] = f"build: {type(exc).__name__}: {exc}"[:300]
            continue
        grouped = _grouped(r.model)
        row |= {"class": type(r.model).__name__, "attention": _attention(r.model),
                "batch": r.example_inputs[0].shape[0], "grouped_convs": len(grouped)}  # fmt: skip
        for mode in MODES:
            out: dict = row.setdefault("modes", {}).setdefault(mode, {})
            start = time.perf_counter()
            try:
                report = audit(r.model, r.example_inputs, "h200-sxm", train=True, mode=mode)
            except Exception as exc:
                out["error"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            finally:
                out["trace_s"] = round(time.perf_counter() - start, 2)
            step = report.step
            out |= {k: getattr(step, k, None) for k in ("gpu_s", "host_s", "wall_s", "kernels")}
            out["findings"] = [_finding(f, grouped) for f in report.findings]
    return rows


def checks(rows) -> dict[str, list]:
    found: dict[str, list] = {"sdpa_attention": [], "grouped_conv_shape": [], "failed": [],
                              "bad_est_saving": [], "negative_wall_saving": []}  # fmt: skip
    for r in rows:
        if "error" in r:
            found["failed"].append({"model": r["model"], "error": r["error"]})
        for mode, out in r.get("modes", {}).items():
            if "error" in out:
                found["failed"].append({"model": r["model"], "mode": mode, **out})
            for f in out.get("findings", ()):
                at = {"model": r["model"], "mode": mode, **f}
                if (r["attention"] == "sdpa" and f["rule"] in ATTENTION_RULES
                        and Severity.parse(f["severity"]) >= Severity.MEDIUM):  # fmt: skip
                    found["sdpa_attention"].append(at)
                if "grouped_convs" in f:
                    found["grouped_conv_shape"].append(at)
                est, wall = f["est_saving_s"], f["wall_saving_s"]
                if est == "nan" or wall == "nan" or (isinstance(est, float) and est < 0):
                    found["bad_est_saving"].append(at)
                elif isinstance(wall, float) and wall < 0:  # the fix slows the wall clock
                    found["negative_wall_saving"].append(at)
    return found


def _ms(x, width: int = 8) -> str:
    return f"{x * 1e3:{width}.2f}" if isinstance(x, float) else f"{x!s:>{width}}"


def _line(key: str, f: dict) -> str:
    if "rule" not in f:
        return f"  {key}: {f['model']} {f.get('mode', '')} {f['error'][:120]}"
    saving = f"saving {_ms(f['est_saving_s'], 0)} ms, wall {_ms(f['wall_saving_s'], 0)} ms"
    where = " ".join(f.get("grouped_convs", {}))
    at = f"{f['module'] or '(model)'} {where}"
    return f"  {key}: {f['model']} {f['mode']} {f['severity']} {f['rule']} {saving} @ {at}"[:200]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--out", default="sweep_timm.json")
    args = p.parse_args()
    names, known = args.models.split(","), set(timm.list_models())
    missing = [n for n in names if n not in known]
    rows = sweep([n for n in names if n in known])
    found = checks(rows)
    counts = {k: len(v) for k, v in found.items()}
    write_results(args.out, rows, gpu_profile="h200-sxm", modes=list(MODES), timm=timm.__version__,
                  missing=missing, check_counts=counts, checks=found)  # fmt: skip
    print(f"{'model':24} {'mode':7} {'trace s':>7} {'GPU ms':>8} {'host ms':>8}  medium+ findings")
    for r in rows:
        if "error" in r:
            print(f"{r['model'][:24]:24} error: {r['error'][:120]}")
        for mode, out in r.get("modes", {}).items():
            top = [f"{f['severity']} {f['rule']}" for f in out.get("findings", ())
                   if Severity.parse(f["severity"]) >= Severity.MEDIUM]  # fmt: skip
            said = out.get("error") or ", ".join(top) or "-"
            print(f"{r['model'][:24]:24} {mode:7} {out['trace_s']:7.1f} {_ms(out.get('gpu_s'))} "
                  f"{_ms(out.get('host_s'))}  {said}"[:170])  # fmt: skip
    bad = {f["model"] for f in found["failed"]}
    print(f"missing from timm {timm.__version__}: {', '.join(missing) or 'none'}")
    print(f"{len(rows) - len(bad)} of {len(rows)} models audited in eager and compile")
    print(f"check counts: {counts}")
    for key, items in found.items():
        for f in items:
            print(_line(key, f))


if __name__ == "__main__":
    main()
