"""Criteria, table and plot of benchmarks/kernels/bench_attention.py (kept apart so the
measuring script stays short)."""

from __future__ import annotations


def cases(rows) -> list[str]:
    """The cases the rows cover, in the order they were measured."""
    return list(dict.fromkeys(r["case"] for r in rows))


def pick(rows, **match):
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def criteria(sm, qkv, counts, kv) -> list[dict]:
    out = []

    def judge(name, value, target, at_most=False):
        ok = value is not None and (value <= target if at_most else value >= target)
        out.append(
            dict(
                criterion=name,
                value=value,
                target=target,
                verdict="not run" if value is None else ("PASS" if ok else "FAIL"),
            )
        )

    def ratio(rows, base, ours, field="median_ms", **match):
        a, b = pick(rows, variant=base, **match), pick(rows, variant=ours, **match)
        if a is None or b is None or a.get(field) is None or b.get(field) is None:
            return None
        return a[field] / b[field]

    main = "262144x1024"
    judge(
        "softmax_dropout fwd+bwd vs eager @262144x1024",
        ratio(sm, "eager", "gpushape", case=main, direction="fwd+bwd"),
        1.5,
    )
    judge(
        "softmax_dropout fwd+bwd vs torch.compile @262144x1024",
        ratio(sm, "compile", "gpushape", case=main, direction="fwd+bwd"),
        1.2,
    )
    mem = ratio(sm, "eager", "gpushape", field="held_mb", case=main, direction="memory")
    judge("softmax_dropout memory held / eager @262144x1024", mem and 1 / mem, 0.5, True)
    for label in cases(qkv):
        # gradients of q, k, v as scaled_dot_product_attention's backward lays them out
        judge(
            f"FusedQKV fwd+bwd (SDPA's grad layout) vs 3 Linear @{label}",
            ratio(qkv, "3 Linear", "gpushape", case=label, direction="fwd+bwd"),
            1.15,
        )
        judge(
            f"FusedQKV fwd+bwd GPU time (CUDA graph, SDPA's grad layout) vs 3 Linear @{label}",
            ratio(qkv, "3 Linear", "gpushape", case=label, direction="fwd+bwd graph"),
            1.15,
        )
        c = counts.get(label)
        judge(
            f"FusedQKV no kernel between GEMM and SDPA @{label}",
            None if c is None else float(c["no_kernel_between_gemm_and_sdpa"]),
            1.0,
        )
    lengths = sorted({r["length"] for r in kv})
    flat = (
        None
        if not lengths
        else (
            pick(kv, variant="append", length=lengths[-1])["median_us"]
            / pick(kv, variant="append", length=lengths[0])["median_us"]
        )
    )
    judge("KV append time at longest / shortest cache", flat, 1.25, True)
    return out


def plot(sm, qkv, kv, path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    for ax, rows, title in (
        (axes[0], sm, "softmax+dropout p=0.1, bf16"),
        (axes[1], qkv, "q/k/v projection, bf16"),
    ):
        keys = sorted({(r["case"], r["direction"]) for r in rows if "median_ms" in r})
        names = sorted({r["variant"] for r in rows})
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            vals = [
                (pick(rows, case=c, direction=d, variant=name) or {}).get("median_ms", 0)
                for c, d in keys
            ]
            ax.bar([j + i * width for j in range(len(keys))], vals, width, label=name)
        ax.set_xticks(
            [j + 0.4 - width / 2 for j in range(len(keys))],
            [f"{c}\n{d}" for c, d in keys],
            fontsize=7,
        )
        ax.set(title=title, ylabel="ms (median, CUDA events)")
        ax.legend(fontsize=8)
    for name in sorted({r["variant"] for r in kv}):
        sel = [r for r in kv if r["variant"] == name]
        axes[2].loglog([r["length"] for r in sel], [r["median_us"] for r in sel], "o-", label=name)
    axes[2].set(
        title="append 1 step (B 4, 32 heads, D 128)", xlabel="cache length", ylabel="us (median)"
    )
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(sm, qkv, counts, kv, verdicts, copy_gbps) -> None:
    print(f"\ncopy bandwidth (same run): {copy_gbps:.0f} GB/s; ms = median of CUDA events")
    print(
        f"{'softmax+dropout':16s} {'dir':8s} {'eager':>8s} {'compile':>8s} {'gpushape':>9s}"
        f" {'GB/s':>6s} {'x eager':>8s} {'x comp':>7s}"
    )
    for case in dict.fromkeys(r["case"] for r in sm):
        for d in ("fwd", "fwd+bwd"):
            e, c, g = (
                pick(sm, case=case, direction=d, variant=v)
                for v in ("eager", "compile", "gpushape")
            )
            if g:
                ms = "".join(f" {r['median_ms']:{w}.3f}" for r, w in ((e, 8), (c, 8), (g, 9)))
                up = e["median_ms"] / g["median_ms"], c["median_ms"] / g["median_ms"]
                print(f"{case:16s} {d:8s}{ms} {g['gbps']:6.0f} {up[0]:8.2f} {up[1]:7.2f}")
        mem = [
            pick(sm, case=case, direction="memory", variant=v)
            for v in ("eager", "compile", "gpushape")
        ]
        print(
            f"{case:16s} {'held MB':8s}"
            + "".join(
                f" {m['held_mb']:8.0f}" if m["held_mb"] is not None else f" {'n/a':>8s}"
                for m in mem
            )
        )
    print(
        "\nFusedQKV: gradients of q, k, v laid out as SDPA's backward gives them, unless the row"
        " says otherwise"
    )
    print(
        f"{'FusedQKV':10s} {'dir':31s} {'3 Linear':>9s} {'gpushape':>9s} {'speedup':>8s}"
        f" {'kernels fwd+SDPA':>17s} {'bwd':>9s} {'bwd copies':>11s}"
    )
    for case in cases(qkv):
        for d in dict.fromkeys(r["direction"] for r in qkv if r["case"] == case):
            b, g = (
                pick(qkv, case=case, direction=d, variant="3 Linear"),
                pick(qkv, case=case, direction=d, variant="gpushape"),
            )
            if b is None:
                continue
            k = (
                ""
                if d != "fwd"
                else "".join(
                    f" {counts[case]['3 Linear'][key]:>{w}d}->{counts[case]['gpushape'][key]:<4d}"
                    for key, w in (
                        ("fwd_with_sdpa_kernels", 12),
                        ("bwd_kernels", 4),
                        ("bwd_copy_kernels", 6),
                    )
                )
            )
            print(
                f"{case:10s} {d:31s} {b['median_ms']:9.3f} {g['median_ms']:9.3f} "
                f"{b['median_ms'] / g['median_ms']:8.2f}{k}"
            )
    if kv:
        names = list(dict.fromkeys(r["variant"] for r in kv))
        print(f"\n{'KV append us':14s}" + "".join(f"{n:>20s}" for n in names))
        for length in sorted({r["length"] for r in kv}):
            print(
                f"{length:14d}"
                + "".join(f"{pick(kv, length=length, variant=n)['median_us']:20.1f}" for n in names)
            )
    print()
    for v in verdicts:
        value = "n/a" if v["value"] is None else f"{v['value']:.3g}"
        bound = "<=" if "held" in v["criterion"] or "longest" in v["criterion"] else ">="
        print(f"{v['verdict']:8s} {v['criterion']}: {value} (target {bound} {v['target']:g})")
