"""The audit of library models in every mode, as the installed torch traces them: run it under
two torch releases and compare the files, to find where a release's meta kernels change what
gpushape predicts.

    python benchmarks/audit/step_by_release.py --out step-torch214.json
    /path/to/other/venv/bin/python benchmarks/audit/step_by_release.py --out step-torch211.json
    python benchmarks/audit/step_by_release.py --compare step-torch211.json step-torch214.json

Each model is built on the meta device at its default inputs and audited as a bf16 training
step with bench's default optimizer, in eager, compile and graph mode, against the H100 profile
(`--profile` for another): the step's GPU and host time and every finding's saving. The GPU
machines run torch 2.11 while the CPU that re-checks their runs has 2.14; torch 2.11's meta
kernel for a convolution's backward picked another layout than CUDA does, which priced
EfficientNet-B0's compiled step 4 ms high there (tracing/routing.py). Use the same timm and
transformers releases on both sides: only torch should differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from survey_findings import MODELS as SURVEYED  # noqa: E402

MODELS = (*SURVEYED, "timm:resnet50")  # the surveyed library models, and a plain ResNet
PROFILE = ROOT / "benchmarks/results/probe-h100/h100-sxm.json"
MODES = ("eager", "compile", "graph")


def audit_all(models: tuple[str, ...], profile: str) -> dict:
    from gpushape.auditing.api import audit
    from gpushape.models import resolve_model
    from gpushape.steps.batch import synthetic_batch
    from gpushape.steps.step import make_optimizer

    out = {}
    for model in models:
        r = resolve_model(model)
        optimizer = make_optimizer(r.model, synthetic_batch(r.model, r.example_inputs), "auto")
        row = {}
        for mode in MODES:
            rep = audit(r.model, r.example_inputs, None, train=True, mode=mode,
                        optimizer=optimizer, profile=profile)  # fmt: skip
            row[mode] = {
                "gpu_ms": rep.step.gpu_s * 1e3,
                "host_ms": rep.step.host_s * 1e3,
                "wall_ms": rep.step.wall_s * 1e3,
                "findings": {
                    f"{f.rule}/{f.fix}": round((f.est_saving_s or 0.0) * 1e3, 3)
                    for f in rep.findings
                    if (f.est_saving_s or 0.0) > 5e-5
                },
            }
        out[model] = row
        cells = " ".join(f"{m} {row[m]['gpu_ms']:.2f}/{row[m]['host_ms']:.2f}" for m in MODES)
        print(f"{model[:40]:40} {cells}  (GPU/host ms)", flush=True)
    return out


def compare(a_path: str, b_path: str) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (a_path, b_path))
    ra, rb = a["results"], b["results"]
    print(f"{a['environment']['torch']} against {b['environment']['torch']}")
    differ = 0
    for model in sorted(set(ra) | set(rb)):
        if model not in ra or model not in rb:
            print(f"{model}: only in one file")
            differ += 1
            continue
        for mode in MODES:
            x, y = ra[model][mode], rb[model][mode]
            for key in ("gpu_ms", "host_ms", "wall_ms"):
                if abs(x[key] - y[key]) > 1e-6:
                    print(f"{model} {mode} {key}: {x[key]:.3f} / {y[key]:.3f}")
                    differ += 1
            if x["findings"] != y["findings"]:
                diff = sorted(set(x["findings"].items()) ^ set(y["findings"].items()))
                print(f"{model} {mode} findings: {diff}")
                differ += 1
    print(f"{len(ra)} models x {len(MODES)} modes: {differ} difference(s)")
    return differ


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write this torch's audits here (JSON)")
    p.add_argument("--profile", default=str(PROFILE))
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated MODELs")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two --out files")
    args = p.parse_args()
    if args.compare:
        sys.exit(1 if compare(*args.compare) else 0)
    if not args.out:
        p.error("--out or --compare")
    warnings.filterwarnings("ignore")
    from gpushape.bench import write_results

    models = tuple(m for m in args.models.split(",") if m)
    write_results(args.out, audit_all(models, args.profile))


if __name__ == "__main__":
    main()
