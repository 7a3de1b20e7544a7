"""Which high and medium findings does the audit raise on the library models, per mode? What
issue #15's loop has to time: every such finding's fix, applied and measured, in eager and in
compile mode. The audit needs no GPU (a meta trace priced on the H200's shipped profile), so
this runs anywhere and says how many `gpushape bench MODEL --optimize --mode M` runs the GPU
has to do, and which (a model with no such finding in a mode has nothing to time there).

    python benchmarks/audit/survey_findings.py --out $OUT/survey_findings.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.auditing import audit  # noqa: E402
from gpushape.auditing.finding import Severity  # noqa: E402
from gpushape.bench import write_results  # noqa: E402
from gpushape.models import resolve_model  # noqa: E402

MODELS = (
    "timm:mobilenetv3_large_100",
    "timm:efficientnet_b0",
    "timm:convnext_tiny",
    "timm:vit_base_patch16_224",
    "timm:swin_tiny_patch4_window7_224",
    "hf:gpt2",
    "hf:bert",
    "hf:llama?hidden_size=1024&intermediate_size=2816&num_hidden_layers=8"
    "&num_attention_heads=16&num_key_value_heads=4&vocab_size=32000",
)


# the batches the GPU loop (benchmarks/gpu_run.sh loops-lib) times a model at, where not its own
BATCH = {"hf:bert": 32}


def survey(models, modes, gpu: str = "h200-sxm") -> list[dict]:
    rows = []
    for spec in models:
        try:
            r = resolve_model(spec, batch=BATCH.get(spec))
        except Exception as exc:  # a library that is not installed: say so, go on
            rows.append({"model": spec, "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        for mode in modes:
            report = audit(r.model, r.example_inputs, gpu, train=True, mode=mode)
            step = report.step
            rows.append(
                {
                    "model": spec,
                    "batch": BATCH.get(spec),
                    "mode": mode,
                    "step_wall_s": step.wall_s if step else None,
                    "step_gpu_s": step.gpu_s if step else None,
                    "step_host_s": step.host_s if step else None,
                    "findings": [
                        {
                            "rule": f.rule,
                            "severity": f.severity.label,
                            "module": f.module,
                            "fix": f.fix,
                            "saving_s": f.est_saving_s,
                            "wall_saving_s": f.evidence.get("wall_saving_s"),
                        }
                        for f in report.findings
                        if f.severity >= Severity.MEDIUM
                    ],
                }
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--out", default="survey_findings.json")
    args = p.parse_args()
    models = args.models.split(",")
    rows = survey(models, args.modes.split(","))
    write_results(args.out, rows, gpu_profile="h200-sxm", modes=args.modes.split(","))
    for row in rows:
        if "error" in row:
            print(f"{row['model']}: {row['error']}")
            continue
        found = ", ".join(
            f"{f['severity']} {f['rule']} ({f['fix']}, {f['saving_s'] * 1e3:.2f} ms GPU, "
            f"{(f['wall_saving_s'] or 0) * 1e3:.2f} wall)"
            for f in row["findings"]
        )
        step = (f"GPU {row['step_gpu_s'] * 1e3:.1f} host {row['step_host_s'] * 1e3:.1f}"
                if row["step_gpu_s"] is not None else "")  # fmt: skip
        print(f"{row['model'][:40]:40} {row['mode']:8} {step:22} {found or '-'}")


if __name__ == "__main__":
    main()
