"""Render Markdown from benchmark result files: tables for one file, or the whole results page.

    python benchmarks/summarize.py benchmarks/results/kernels-h200/bench_*.json   # tables
    python benchmarks/summarize.py docs > docs/results-h200.md                    # the page
    python benchmarks/summarize.py readme --write     # the README's case-study table

Each result file is what `gpushape.bench.write_results` wrote: an "environment" (GPU, versions,
date, command), the "criteria" the issue sets with measured values and verdicts, and "results".
The `docs` mode renders docs/results-h200.md from everything under benchmarks/results/ and the
profile shipped for the H200 (src/gpushape/hardware/profiles/h200-sxm.json, itself a probe
result): every number on that page is read from those files, the prose around it is templates.
The sections live in benchmarks/summary/, one module per group; this file is the command.
tests/test_summarize.py checks that the committed page is what this renders.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the summary package beside this file

from summary import cases, common, kernels, page

DOCS_COMMAND = common.DOCS_COMMAND
docs_page = page.docs_page
speedups = kernels.speedups
summarize = common.summarize
_load = common.load  # tests/test_summarize.py reads result files through it
readme_block = cases.readme_block
README = Path(__file__).resolve().parents[1] / "README.md"


def main(argv: list[str]) -> int:
    if argv[:1] == ["docs"]:
        sys.stdout.write(docs_page())
        return 0
    if argv[:1] == ["readme"]:
        if argv[1:] == ["--write"]:
            cases.write_readme(README)
        else:
            sys.stdout.write(readme_block())
        return 0
    for name in argv:
        print(summarize(Path(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
