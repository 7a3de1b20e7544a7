"""The input pipeline section (data-h200/): one training step fed four ways, each against the
synthetic ceiling, the loader settings gpushape recommended and the criteria."""

from __future__ import annotations

from pathlib import Path

from .common import criteria_table, environment_line, link, load, md_table

RESULT = "data-h200/input_pipeline.json"


def _ms(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def variants_table(rows: list[dict]) -> list[str]:
    body = [
        (
            f"`{r['variant']}`",
            r["description"],
            "yes" if r["kept_up"] else "no",
            f"{r['img_per_s']:,.0f}",
            f"{r['fraction_of_synthetic']:.1%}",
            _ms(r["median_step_ms"]),
            _ms(r.get("data_wait_ms_median")),
            _ms(r["stall_ms_per_step"]),
            f"{r['steps']}" + (" (capped)" if r["capped"] else ""),
        )
        for r in rows
    ]
    head = ("variant", "fed by", "kept up", "img/s", "of synthetic", "step ms", "wait ms")
    return md_table((*head, "stall ms", "steps"), body, right=6)


def loader_lines(rows: list[dict]) -> list[str]:
    """The DataLoader settings recommended for each variant that used them, with the reasons."""
    out = []
    for r in rows:
        loader = r.get("loader")
        if not loader:
            continue
        settings = ", ".join(f"{k}={v}" for k, v in loader.items())
        out.append(
            f"- `{r['variant']}`: {settings}, from one batch loaded in "
            f"{r['load_ms_per_batch']:.1f} ms in-process:"
        )
        out += [f"  - {line}" for line in r.get("reasoning", [])]
    return out


def pipeline_section() -> list[str]:
    data = load(RESULT)
    setup, config, rows = data["setup"], data["config"], data["results"]
    log = RESULT.replace(".json", ".log")
    out = [
        "## Input pipeline",
        "",
        f"`benchmarks/data/bench_input_pipeline.py` ({link(RESULT, Path(RESULT).name)}, "
        f"{link(log, 'log')}): {environment_line(data['environment'])}. One training step of "
        f"{setup['model']} (batch {setup['batch']}) on {setup['device']}, fed from "
        f"{setup['images']:,} {setup['image_format']} images of {config['image_size']}x"
        f"{config['image_size']} ({setup['image_bytes_mean'] / 1e3:.1f} kB on average, written "
        f"in {setup['write_images_s']:.1f} s; {setup['shard_images']:,} of them pre-decoded into "
        f"the shard) with {setup['cores']} CPU cores; the whole run took "
        f"{setup['total_s']:.0f} s. Each variant runs {config['warmup']} warm-up and "
        f"{config['steps']} timed steps, fewer when it reaches {config['seconds']:.0f} s of "
        "wall time (capped). Step: CUDA events between consecutive step ends, so the GPU's "
        "idle time waiting for data counts; img/s: the batch over the median step; of "
        "synthetic: img/s against the batch already on the GPU; wait: the host's median wait "
        "for the next batch; stall: the step minus the synthetic step.",
        "",
        *variants_table(rows),
        "",
    ]
    loaders = loader_lines(rows)
    if loaders:
        out += [
            "The loader settings `gpushape.data.recommend_loader` gave, for the synthetic "
            "step time, and its reasoning:",
            "",
            *loaders,
            "",
        ]
    return [*out, *criteria_table(data["criteria"]), ""]
