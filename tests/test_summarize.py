"""docs/results-h200.md is what benchmarks/summarize.py renders from the committed result files.

When a result file changes, regenerate the page:

    python benchmarks/summarize.py docs > docs/results-h200.md
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results-h200.md"


@pytest.fixture(scope="module")
def summarize():
    spec = importlib.util.spec_from_file_location(
        "_gpushape_summarize", ROOT / "benchmarks" / "summarize.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page(summarize):
    return summarize.docs_page()


def test_committed_page_is_current(summarize, page):
    assert PAGE.read_text() == page, (
        f"docs/results-h200.md is stale: run `{summarize.DOCS_COMMAND}` and commit it"
    )


def test_page_has_the_key_sections(summarize, page):
    assert page.startswith("# Measured on an H200\n")
    assert summarize.DOCS_COMMAND in page.split("\n## ", 1)[0]  # said at the top
    for heading in (
        "## The probe: ceilings and cliffs",
        "## Eager kernels against the copy rate",
        "## Fused attention against the GEMM model",
        "## The design guide's rules of thumb on this H200",
        "## Cost model against the profiler",
        "## The audit's savings against measurement",
        "## Fused kernels",
        "## Examples",
        "## Test runs on the H200",
    ):
        assert f"\n{heading}\n" in page, heading
    for table_head in (
        "| family | workload | fraction of copy |",
        "| kernel | fwd fraction | fwd TFLOP/s |",
        "| claim | the guide says |",
        "| case | predicted ms | measured ms (graph) |",
        "| criterion | measured | target | verdict |",
        "| op | shape | pass | eager ms |",
    ):
        assert table_head in page, table_head


def test_page_links_only_files_that_exist(page):
    for target in re.findall(r"\]\((\.\./[^)#]+)\)", page):
        assert (PAGE.parent / target).resolve().exists(), target


def test_every_audit_rule_validated_is_a_registered_rule(summarize):
    from gpushape.auditing.registry import load_rules

    validated = summarize._load("audit-validate-h200/validate_savings.json")["results"]
    assert {r["rule"] for r in validated} <= set(load_rules())


def test_readme_kernel_speedups_come_from_the_result_files(summarize):
    """Each row of the README's kernel table quotes the speed-up summarize.py computes and
    cites the file it comes from."""
    readme = (ROOT / "README.md").read_text()
    for kernel, (value, _, rel) in summarize.speedups().items():
        rows = [ln for ln in readme.splitlines() if ln.startswith(f"| `{kernel}`")]
        assert len(rows) == 1, f"README has no kernel-table row for {kernel}"
        assert f"{value:.2f}x" in rows[0], (kernel, f"{value:.2f}x", rows[0])
        assert rel in rows[0], (kernel, rel)


def test_readme_headline_bench_figures_come_from_bench_csv():
    """The README's headline speed-ups over eager are the latest rows of bench-h200/bench.csv
    for each case (the case-study table is checked whole above)."""
    import csv

    with (ROOT / "benchmarks/results/bench-h200/bench.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))

    def row(model: str, batch: str, variant: str) -> dict:
        found = [
            r for r in rows if (r["model"], r["batch"], r["variant"]) == (model, batch, variant)
        ]
        assert found, (model, batch, variant)
        return max(found, key=lambda r: r["date_utc"])

    resnet = ("torchvision.models:resnet50", "256x3x224x224:bfloat16")
    cases = {
        ("hf:gpt2", "8x1024:int64", "optimize"): "speedup",
        (*resnet, "optimize"): "speedup",
    }
    readme = " ".join((ROOT / "README.md").read_text().split())
    for (model, batch, variant), what in cases.items():
        r = row(model, batch, variant)
        if what == "speedup":
            expected = f"{float(r['speedup_vs_baseline']):.2f}x"
        else:
            expected = f"{float(r['samples_per_s']):,.0f}"
        assert expected in readme, (model, variant, expected)


def test_readme_case_studies_are_what_the_result_files_say(summarize):
    """The README's case-study block is what `summarize.py readme` renders from the files."""
    readme = (ROOT / "README.md").read_text()
    block = summarize.readme_block()
    assert block.rstrip("\n") in readme, (
        "README.md's case studies are stale: run `python benchmarks/summarize.py readme --write`"
    )
    assert "| ResNet-50 (torchvision" in block and "| DDP on two H200s |" in block


def test_a_case_study_command_keeps_how_it_ran_not_where_it_wrote(summarize):
    from summary.cases import command

    env = {"command": "python -m gpushape bench hf:gpt2 --batch 32 --kernels 8 --csv /o/b.csv "
           "--plot=/o/g.png -o /o/g.json --rounds 4"}  # fmt: skip
    assert command({"environment": env}) == "gpushape bench hf:gpt2 --batch 32 --rounds 4"
    env = {"command": "python -m gpushape bench 'hf:gpt2?attn_pdrop=0&embd_pdrop=0' --batch 32"}
    # quoted as a shell needs it: the row's command must run as written
    assert command({"environment": env}) == (
        "gpushape bench 'hf:gpt2?attn_pdrop=0&embd_pdrop=0' --batch 32"
    )


def test_a_case_no_h200_ran_shows_the_h100_run_and_says_so(summarize, tmp_path, monkeypatch):
    import json

    from summary import cases

    case = cases.CASES[-1]
    (tmp_path / cases.FOLDER).mkdir()
    monkeypatch.setattr(cases, "RESULTS", tmp_path)
    assert cases._row(case)[2:] == ("not run yet", "-", "-", "-")
    (tmp_path / cases.OTHER_CHIP).mkdir()
    run = {
        "model": case.model,
        "batch": [case.batch],
        "environment": {"command": f"python -m gpushape bench '{case.model}' --rounds 3"},
        "variants": {"compile": {case.rate: 400_000.0}, "best": {case.rate: 460_000.0}},
    }
    (tmp_path / cases.OTHER_CHIP / "run.json").write_text(json.dumps(run))
    row = cases._row(case)
    assert row[2].startswith("on an H100 only: `best` 460,000") and "(1.15x)" in row[3]
    assert row[4] == "-"  # no verdict: the target is the H200's


def test_a_plot_belongs_to_the_last_run_that_wrote_it(summarize, tmp_path, monkeypatch):
    import json

    from summary import cases

    folder = tmp_path / cases.FOLDER
    folder.mkdir()
    (folder / "bert.png").write_bytes(b"png")

    def run(name: str, date: str, plot: str) -> dict:
        data = {"environment": {"date_utc": date, "command": f"gpushape bench hf:bert --plot "
                                f"/o/{plot} -o /o/{name}"}}  # fmt: skip
        (folder / name).write_text(json.dumps(data))
        return data

    early = run("early.json", "2026-12-01T00:00", "bert.png")
    late = run("late.json", "2026-12-02T00:00", "bert.png")
    gone = run("gone.json", "2026-12-03T00:00", "missing.png")
    monkeypatch.setattr(cases, "RESULTS", tmp_path)
    assert cases.plot_of(f"{cases.FOLDER}/late.json", late) == f"{cases.FOLDER}/bert.png"
    assert cases.plot_of(f"{cases.FOLDER}/early.json", early) is None  # overwritten since
    assert cases.plot_of(f"{cases.FOLDER}/gone.json", gone) is None  # no such file committed
