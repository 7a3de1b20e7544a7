"""`gpushape probe`: measure this GPU's real ceilings and write a calibrated profile.

runner.py (tasks, budget, progress), plan.py (the quick and full sweeps as data), measure.py
(one GEMM / conv / copy / launch timed), cliffs.py (alignment and wave analysis), memory.py
and workloads.py, convs.py, attention.py (rates the cost model prices ops at), profile.py (sweeps ->
profile JSON), claim_check.py + guide_claims*.py (the design guide's claims measured),
report.py + plots.py (Markdown and PNG report).

It sits above `tracing/` and `kernels/`: it times real steps of traced ops and of gpushape's
own kernels, with the timing core of `bench/`.
"""
