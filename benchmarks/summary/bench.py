"""The `gpushape bench` section (bench-h200/): training steps side by side and the loop, each
fix's predicted saving beside the measured one; and the README's case-study table."""

from __future__ import annotations

import csv
import json

from .common import RESULTS, link, md_table

FOLDER = "bench-h200"
CASES = {  # model as run -> (name, its variants file, its loop file)
    "torchvision.models:resnet50": ("ResNet-50 (torchvision, NCHW, 256 x 224^2)", "resnet50"),
    "hf:gpt2": ("GPT-2 124M (Hugging Face, 8 x 1024)", "gpt2"),
    "hf:bert": ("BERT-base MLM (Hugging Face, 32 x 512, fused AdamW)", "bert"),
}


def rows(name: str) -> list[dict]:
    with (RESULTS / FOLDER / name).open(newline="") as f:
        return list(csv.DictReader(f))


def _rate(r: dict) -> str:
    tokens = r.get("tokens_per_s")
    return f"{float(tokens):,.0f} tok/s" if tokens else f"{float(r['samples_per_s']):,.0f} img/s"


def _num(text: str, digits: int = 2) -> str:
    return "-" if text in ("", None) else f"{float(text):,.{digits}f}"


def variants_table() -> list[str]:
    body = []
    for r in rows("bench.csv"):
        name = CASES.get(r["model"], (r["model"],))[0]
        body.append(
            (
                name,
                f"`{r['variant']}`",
                _num(r["median_ms"]),
                _rate(r),
                _num(r["speedup_vs_baseline"]),
                _num(r["warmup_s"], 1),
                _num(r["peak_memory_gb"], 1),
                r["kernels_per_step"] or "-",
                f"{_num(r['mfu_pct'], 1)}%",
                r["bound"],
            )
        )
    head = ("model", "variant", "step ms", "rate", "x eager", "warm-up s", "peak GB")
    return md_table((*head, "kernels", "MFU", "bound"), body, right=8)


def loop_table() -> list[str]:
    body = [
        (
            CASES.get(r["model"], (r["model"],))[0],
            f"`{r['fix']}`",
            r["places"],
            _num(r["predicted_wall_ms"], 3),
            _num(r["measured_wall_ms"], 3),
            _num(r["predicted_over_measured"]),
            _num(r["step_ms_after"]),
        )
        for r in rows("loop.csv")
    ]
    head = ("model", "fix", "places", "predicted ms", "measured ms", "pred/meas")
    return md_table((*head, "step ms after"), body, right=5)


def loop_speedups() -> dict[str, tuple[float, float, float]]:
    """model -> (step as given, step after every fix, ratio), from the loop files."""
    out = {}
    for model, (_, stem) in CASES.items():
        data = json.loads((RESULTS / FOLDER / f"loop-{stem}.json").read_text())
        stages = list(data["stages"].values())
        first, last = stages[0]["median_s"], stages[-1]["median_s"]
        out[model] = (first, last, first / last)
    return out


def why_bert_compile() -> list[str]:
    """What torch.compile runs for BERT's step, from the top kernels of one step."""
    rel = "steps-h200/why_bert_compile.json"
    data = json.loads((RESULTS / rel).read_text())["results"]
    fp32 = sum(t for k, t in data["compile"] if "f32f32" in k)
    softmax = sum(t for k, t in data["compile"] if "softmax" in k)
    flash = sum(t for k, t in data["eager"] if "sdpa" in k)
    return [
        f"Why torch.compile is slower than eager on BERT ({link(rel, 'why_bert_compile.json')}, "
        "`benchmarks/steps/why_bert_compile.py`, the top kernels of one step): eager runs "
        f"cuDNN's flash attention ({flash:.1f} ms forward and backward); compiled, the same "
        "SDPA call (training, dropout 0.1) is lowered to the math path, whose score GEMMs run "
        f"as fp32 CUDA-core kernels (`sm80_xmma_gemm_f32f32`, {fp32:.1f} ms) and its softmax "
        f"and dropout as Triton kernels ({softmax:.1f} ms), with the scores materialised "
        "(peak memory 20.8 GB against 9.0). No fix of gpushape's changes that; eager with the "
        "padded vocabulary is the faster way to train this model.",
        "",
    ]


def bench_section() -> list[str]:
    env = rows("bench.csv")[0]
    plots = ", ".join(
        link(f"{FOLDER}/{p}.png", p)
        for _, (_, stem) in CASES.items()
        for p in (stem, f"loop-{stem}")
    )
    return [
        "## gpushape bench",
        "",
        f"`gpushape bench MODEL --vs ...` and `gpushape bench MODEL --optimize` on "
        f"{env['gpu']}, torch {env['torch']}, triton {env['triton']} "
        f"({link(FOLDER + '/bench.csv', 'bench.csv')}, {link(FOLDER + '/loop.csv', 'loop.csv')}; "
        f"the commands are in each row; plots: {plots}). bf16 training steps on synthetic data "
        "(token ids over the vocabulary, 15% masked for BERT), the optimizer as PyTorch builds "
        "it (SGD with momentum for ResNet-50, AdamW for GPT-2, fused AdamW for BERT); variants "
        "alternated in 5 rounds of 10-step blocks, medians of CUDA-event timings. Warm-up counts "
        "from building the variant (rewrites, checks, compilation, capture) to the end of its "
        "first 3 steps; it includes compiling gpushape's Triton kernels where a variant uses "
        "them first in the process (ResNet-50's `optimize`: its `optimize+graph`, built next "
        "with the same rewrites, checks and a capture besides, took seconds).",
        "",
        *variants_table(),
        "",
        "The loop (`--optimize`): each fix applied on top of the ones above it, its saving "
        "predicted by the audit of each stage's model and measured as the step-time "
        "difference:",
        "",
        *loop_table(),
        "",
        *why_bert_compile(),
    ]
