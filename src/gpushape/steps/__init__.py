"""Training steps measured on the GPU: `gpushape bench` and the audit -> optimize -> measure
loop.

    from gpushape.steps import bench, loop
    result = bench(model, inputs, variants=["compile", "optimize+graph"])
    proof = loop(model, inputs)            # each fix: predicted saving beside measured

`batch.py` makes a synthetic batch and its loss for any model; `step.py` the training step
(forward, loss, backward, optimizer); `variants.py` the ways a step can run (channels-last,
optimize, fused optimizer, torch.compile, one CUDA graph; `compiling.py` how a variant is
compiled); `measure.py` the alternated timing,
kernels, GPU busy time and peak memory; `run.py` `bench()`; `fix_by_fix.py` `loop()`; `results.py`
the CSV rows, tables and plots; `distributed.py` `--nproc N`: DDP under torchrun.
"""

from .batch import Batch, synthetic_batch
from .fix_by_fix import FixRow, LoopResult, loop
from .measure import StepStats
from .run import BenchResult, bench
from .step import TrainingStep, build_step
from .variants import PARTS, parse_variant

__all__ = [
    "PARTS",
    "Batch",
    "BenchResult",
    "FixRow",
    "LoopResult",
    "StepStats",
    "TrainingStep",
    "bench",
    "build_step",
    "loop",
    "parse_variant",
    "synthetic_batch",
]
