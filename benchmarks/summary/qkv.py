"""FusedQKV and KVCache within the fused kernels' section (kernels-h200/bench_attention.json
and the probes of where FusedQKV's time goes)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .common import kernel_name, link, load, md_table, ratio


def fused_qkv() -> list[str]:
    att = load("kernels-h200/bench_attention.json")
    table: dict[tuple, dict] = defaultdict(dict)
    for r in att["results"]["fused_qkv"]:
        table[(r["case"], r["direction"])][r["variant"]] = r["median_ms"]
    rows = [
        (
            case,
            d,
            f"{t['3 Linear']:.3f}",
            f"{t['gpushape']:.3f}",
            ratio(t["3 Linear"], t["gpushape"]),
        )
        for (case, d), t in table.items()
    ]
    out = [
        "#### FusedQKV",
        "",
        "The projections' forward+backward with the gradients of q, k, v laid out as "
        "`scaled_dot_product_attention`'s backward gives them ((B, T, heads, D) memory seen "
        "as (B, heads, T, D)), unless the row says otherwise; `with SDPA` includes flash "
        "attention.",
        "",
        *md_table(("shape", "pass", "3 Linear ms", "FusedQKV ms", "speed-up"), rows, right=3),
        "",
    ]
    rel = "kernels-h200/probe_qkv_grads_rerun.json"
    grads = load(rel)
    rows = []
    for case, s in grads["shapes"].items():
        for what, t in s["times"].items():
            rows.append(
                (
                    case,
                    what,
                    *(f"{t[v]:.3f}" for v in t),
                    ratio(t["3 Linear"], t["FusedQKV assembly free (ceiling)"]),
                )
            )
    variants = list(next(iter(next(iter(grads["shapes"].values()))["times"].values())))
    out += [
        f"Where FusedQKV's time goes (`benchmarks/kernels/probe_qkv_grads.py`, "
        f"{link(rel, Path(rel).name)}, CUDA graphs, variants alternated): `plain views` "
        "leaves the gradient to autograd's `cat`, `no-assembly` reads the gradients where they "
        "lie, and `assembly free` runs FusedQKV's GEMMs with the gradient assembly taken as "
        "free: the ceiling of merging the projections at that shape.",
        "",
        *md_table(
            ("shape", "what", *(f"{v} ms" for v in variants), "ceiling speed-up"),
            rows,
            right=len(variants) + 1,
        ),
        "",
    ]
    rel = "kernels-h200/probe_qkv_gemms.json"
    gemms = load(rel)
    rows = []
    for variant, kernels in gemms["kernels"].items():
        by_name: dict[str, list[float]] = defaultdict(list)
        for name, us in kernels:
            by_name[kernel_name(name)].append(us)
        for name, times in by_name.items():
            low, high = f"{min(times):.1f}", f"{max(times):.1f}"
            each = low if low == high else f"{low}-{high}"
            rows.append((variant, f"`{name}`", len(times), each, f"{sum(times):.1f}"))
    out += [
        f"LLaMA-7B's projection kernels (`benchmarks/kernels/probe_qkv_gemms.py`, "
        f"{link(rel, Path(rel).name)}, torch.profiler, one fwd+bwd):",
        "",
        *md_table(("step", "kernel", "calls", "us each", "us in all"), rows, right=3),
        "",
    ]
    kv: dict[int, dict] = defaultdict(dict)
    for r in att["results"]["kv_append"]:
        kv[r["length"]][r["variant"]] = r["median_us"]
    kv_variants = list(next(iter(kv.values())))
    out += [
        "#### KVCache",
        "",
        "One decode step's append to a cache of the given length, us (`append_static graph`: "
        "the CUDA-graph-safe variant replayed from a graph):",
        "",
        *md_table(
            ("cache length", *kv_variants),
            ((n, *(f"{v[k]:.1f}" for k in kv_variants)) for n, v in kv.items()),
            right=len(kv_variants),
        ),
        "",
    ]
    return out
