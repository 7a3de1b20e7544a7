"""The results page, docs/results-h200.md, rendered from the result files under
benchmarks/results/ by `python benchmarks/summarize.py docs`; one module per group of sections.

- `common`: where the files are, reading them, table helpers, and `summarize(path)` (one file's
  tables, the script's default mode);
- `probe`: ceilings and cliffs, eager kernels' families, fused attention, the guide's claims;
- `audit`: the cost model against the profiler, the audit's savings against measurement;
- `kernels` (with `qkv`): the fused kernels, their headline speed-ups (`speedups()`, which the
  README's kernel table quotes) and the host's share;
- `optimize`: models as written against `gpushape.optimize`, with the audit's predicted step;
- `scoreboard`: every timed fix-by-fix loop re-predicted by the cost model as it is now;
- `pipeline`: the input pipeline, each way of feeding a step against synthetic data;
- `examples`: the examples' logs, the test runs, tracing speed on a CPU;
- `page`: the header, the sections in order and the index of the result files no section
  cites (committed files only; the baselines measured outside the repository apart).
"""
