"""Single-step experiments the bench section reports: why torch.compile was slower than eager
on BERT (steps-h200/why_bert_compile.json), whether padding the vocabulary pays compiled
(compile_pad.json), GPT-2's key/value cache (compile_cache.json) and ResNet-50's kernel classes
against their rooflines (roofline_resnet50.json)."""

from __future__ import annotations

import json
from pathlib import Path

from .common import RESULTS, link

POOL_FILE = "kernels-h200/bench_max_pool.json"

FOLDER = "bench-h200"


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
        "(peak memory 20.8 GB against 9.0). The cause is transformers' (5.17): while dynamo "
        "traces, or a CUDA stream captures, its `is_tracing()` check keeps it from skipping an "
        "all-true attention mask, so SDPA gets one and leaves flash. gpushape's "
        "`materialized-attention-mask` rule says so in compile and graph mode, and its "
        f"`skip-attention-mask` fix passes no mask where eager passes none: {_bert_compiled()}",
        "",
    ]


def _bert_compiled() -> str:
    """BERT's compiled steps with and without gpushape's compile-mode fixes (bench-h200)."""
    v = json.loads((RESULTS / FOLDER / "bert.json").read_text())["variants"]

    def ms(name: str) -> str:
        return f"{v[name]['median_s'] * 1e3:.1f} ms"

    def rate(name: str) -> str:
        return f"{v[name]['samples'] / v[name]['median_s']:,.0f} seq/s"

    graphs = "optimize-compile+compile-graphs"
    text = (
        f"torch.compile alone {ms('compile')} ({rate('compile')}), eager {ms('eager')}; "
        f"`optimize-compile+compile` (skip-attention-mask and masked-lm-head, then "
        f"torch.compile) {ms('optimize-compile+compile')}"
    )
    if graphs not in v:  # the run timed no compile-graphs variant
        return text + "."
    return (
        f"{text}, and with torch.compile's CUDA graphs (`compile-graphs`) {ms(graphs)} "
        f"({rate(graphs)}, GPU busy {v[graphs]['gpu_busy_s'] * 1e3:.1f} ms)."
    )


def compile_pad() -> list[str]:
    """Whether padding the vocabulary pays under torch.compile (steps-h200/compile_pad.json)."""
    rel = "steps-h200/compile_pad.json"
    data = json.loads((RESULTS / rel).read_text())["results"]
    parts = []
    for model, r in data.items():
        v = r["variants"]
        plain, padded = v["compiled"], v["compiled, padded"]
        parts.append(
            f"{model} (batch {r['batch']}) {plain['median_ms']:.2f} ms unpadded against "
            f"{padded['median_ms']:.2f} padded (GPU busy {plain['gpu_busy_ms']:.2f} against "
            f"{padded['gpu_busy_ms']:.2f})"
        )
    return [
        "Does padding the vocabulary still pay under torch.compile, as the compile-mode audit "
        "says it does not (Inductor pads matmuls itself)? The optimize-compile rewrite under "
        "torch.compile's CUDA graphs, with and without pad-channels, alternated in one process "
        f"({link(rel, 'compile_pad.json')}, `benchmarks/steps/compile_pad.py`): "
        f"{'; '.join(parts)}. Within noise: the advice holds.",
        "",
    ]


def cache_and_roofline() -> list[str]:
    """GPT-2's key/value cache in training (steps-h200/compile_cache.json) and ResNet-50's
    kernel classes against their rooflines (steps-h200/roofline_resnet50.json)."""
    cache = json.loads((RESULTS / "steps-h200/compile_cache.json").read_text())["results"]
    rows, told = cache["rows"], cache["predicted"]["cache"]
    parts = []
    for mode, key in (("eager", "eager"), ("compiled", "compile")):
        base, fixed = rows[f"{mode}, cache"], rows[f"{mode}, no-kv-cache"]
        parts.append(
            f"{mode} {base['median_ms']:.2f} -> {fixed['median_ms']:.2f} ms (GPU "
            f"{base['gpu_ms']:.2f} -> {fixed['gpu_ms']:.2f}; predicted "
            f"{told[key].get('kv-cache-in-training_ms', 0.0):.2f} ms of GPU work)"
        )
    attention = {k: sum(r["attention_kernels_ms"].values()) for k, r in rows.items()}
    compiled_att = min(v for k, v in attention.items() if k.startswith("compiled"))
    roof = json.loads((RESULTS / "steps-h200/roofline_resnet50.json").read_text())["results"]
    lines = []
    for name, v in roof["variants"].items():
        b = v["bounds_s"]
        bounds = ", ".join(f"{k} {t * 1e3:.2f} ms" for k, t in b.items())
        lines.append(f"`{name}` {v['step_s'] * 1e3:.2f} ms a step ({bounds})")
    pooling = roof["variants"]["optimize+graph"]["classes"]["pooling"]
    pool_runs = json.loads((RESULTS / POOL_FILE).read_text())["results"]
    pool_now = next(
        r["median_ms"]
        for r in pool_runs
        if r["shape"] == [256, 64, 112, 112] and r["layout"] == "cl"
        and r["direction"] == "fwd+bwd" and r["variant"] == "gpushape"
    )  # fmt: skip
    return [
        "What GPT-2's key/value cache costs a training step (batch 8 x 1024; transformers "
        "builds it unless told not to; `no-kv-cache` drops it), alternated in one process "
        f"({link('steps-h200/compile_cache.json', 'compile_cache.json')}, "
        f"`benchmarks/steps/compile_cache.py`): {'; '.join(parts)}. The fix saves more than "
        "priced; on this image's transformers (5.17) every compiled variant already ran its "
        f"attention with the all-true mask (at least {compiled_att:.1f} ms of attention "
        f"kernels against {attention['eager, cache']:.1f} eager), so use_cache=False's own "
        "mask could not show here.",
        "",
        "ResNet-50 at batch 256, each kernel class against its roofline "
        f"({link('steps-h200/roofline_resnet50.json', 'roofline_resnet50.json')}, "
        f"`benchmarks/steps/roofline_step.py`, target {roof['target']:,.0f} img/s = "
        f"{roof['samples'] / roof['target'] * 1e3:.2f} ms a step): {'; '.join(lines)}. "
        "With the convolutions as cuDNN runs them and every memory-bound class at its "
        "roofline the step could reach the target; as measured, normalization and pooling "
        f"stood in the way (`optimize+graph`'s pooling {pooling['measured_s'] * 1e3:.2f} ms "
        f"against a roofline of {pooling['roofline_s'] * 1e3:.2f}). This run predates "
        "gpushape's max-pooling kernel (its forward and backward at ResNet-50's shape now "
        f"take {pool_now:.2f} ms, {link(POOL_FILE, Path(POOL_FILE).name)}) "
        "and the fused norms' residual-gradient hand-over.",
        "",
    ]
