"""Audit many Hugging Face model types on the meta device (no GPU, no weights) and check the
advice about attention: no fp32-math or manual-attention finding at high or medium on a bf16
model whose attention runs through SDPA, and manual-attention where a model has no SDPA path
(transformers builds those with eager attention). Each type is built from its default config,
one or two layers where the config takes `num_hidden_layers` (or the encoder-decoders' layer
counts), at gpushape's default inputs, and audited for a training step on the H200 profile.
Types that cannot be built or traced say why (a missing input the model needs, a config
transformers cannot build).

    python benchmarks/audit/sweep_hf.py --out benchmarks/results/audit-cpu/sweep_hf.json
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

TYPES = (
    "bert", "roberta", "albert", "distilbert", "electra", "xlm-roberta", "mpnet", "deberta-v2",
    "megatron-bert", "gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2",
    "phi", "phi3", "opt", "gpt_neox", "gptj", "bloom", "falcon", "starcoder2", "olmo",
    "stablelm", "cohere", "granite", "t5", "mt5", "bart", "mbart", "pegasus", "marian",
    "whisper", "vit", "swin", "convnext", "clip", "siglip",
)  # fmt: skip
SMALL = ("num_hidden_layers=2", "encoder_layers=2&decoder_layers=2", "num_layers=2", "")
ATTENTION_RULES = ("fp32-math", "manual-attention")


def _audited(kind: str):
    """(the model built, the options that built it, its audit): the first of SMALL's options
    the type takes and traces with (an option a config accepts may still not fit the model:
    ConvNeXt's stages), else the default config."""
    error: Exception | None = None
    for small in SMALL:
        try:
            r = resolve_model(f"hf:{kind}" + (f"?{small}" if small else ""))
            return r, small, audit(r.model, r.example_inputs, "h200-sxm", train=True)
        except Exception as exc:  # the next option, or the default config
            error = exc
    assert error is not None
    raise error


def sweep(types) -> list[dict]:
    rows = []
    for kind in types:
        row: dict = {"type": kind}
        try:
            r, small, report = _audited(kind)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            continue
        row["options"] = small
        row["class"] = type(r.model).__name__
        row["attention"] = getattr(r.model.config, "_attn_implementation", None)
        found = [f for f in report.findings if f.severity >= Severity.MEDIUM]
        row["findings"] = [f"{f.severity.label} {f.rule}" for f in found]
        attention = [f.rule for f in found if f.rule in ATTENTION_RULES]
        row["attention_findings"] = attention
        row["false_attention_alarm"] = bool(attention) and row["attention"] == "sdpa"
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--out", default="sweep_hf.json")
    args = p.parse_args()
    rows = sweep(args.types.split(","))
    alarms = [r["type"] for r in rows if r.get("false_attention_alarm")]
    failed = [r["type"] for r in rows if "error" in r]
    write_results(args.out, rows, false_attention_alarms=alarms, failed=failed)
    for r in rows:
        if "error" in r:
            print(f"{r['type']:14} error: {r['error'][:110]}")
        else:
            print(f"{r['type']:14} {r['class'][:34]:34} {r['attention'] or '-':6} "
                  f"{', '.join(r['findings']) or '-'}"[:160])  # fmt: skip
    print(
        f"{len(rows) - len(failed)} of {len(rows)} types audited on meta; SDPA models with "
        f"an fp32-math or manual-attention finding: {', '.join(alarms) or 'none'}"
    )


if __name__ == "__main__":
    main()
