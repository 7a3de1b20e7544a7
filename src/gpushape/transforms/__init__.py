"""What to change: each transform rewrites a user's model where the audit found a fix for it.

    model, report = gpushape.optimize(model, example_inputs, gpu="h200")
    gpushape.transforms.revert(model)          # undo everything

One transform per file, registered under the fix id findings name (`auditing/fixes.py`):
`channels_last.py` (channels-last), `fuse_norm_act.py` (fuse-norm-act), `pad_channels.py`
(pad-channels), `sdpa.py` (sdpa: the libraries' eager attention switched to SDPA),
`fuse_grn.py` (fuse-grn: ConvNeXt-V2's GRN on gpushape's kernels),
`activation_checkpoint.py` (recompute what a memory budget asks, at the least time),
`autocast.py` (autocast-bf16: the forward under torch.autocast, parameters float32),
`safe_avg_pool.py` (safe-avg-pool: a guard against pytorch#188344, applied unasked). `_core.py`
holds the registry, `Change`/`Refusal` and the undo log; `_verify.py` the numeric gate a
rewritten model must pass; `_optimize.py` `optimize()` and its report.

Step-level tools act on the training step or the optimizer, not on modules, so they are plain
functions: `cuda_graph.py` (`capture_step`, `capture_reasons`, `make_capturable`),
`fused_optimizer.py` (`fuse_optimizer`), `compile.py` (`compile_model` with `PRESETS`).
"""

from ._core import (
    TRANSFORMS,
    Change,
    Outcome,
    Refusal,
    TransformContext,
    TransformError,
    applied,
    get_transform,
    load_transforms,
    register_transform,
    revert,
)
from ._optimize import OptimizeReport, optimize
from ._verify import Verification, verify
from .compile import PRESETS, CompileReport, compile_model
from .cuda_graph import (
    GraphCaptureError,
    GraphedStep,
    capture_reasons,
    capture_step,
    capture_warnings,
    make_capturable,
)
from .fused_optimizer import fuse_optimizer

__all__ = [
    "PRESETS",
    "TRANSFORMS",
    "Change",
    "CompileReport",
    "GraphCaptureError",
    "GraphedStep",
    "OptimizeReport",
    "Outcome",
    "Refusal",
    "TransformContext",
    "TransformError",
    "Verification",
    "applied",
    "capture_reasons",
    "capture_step",
    "capture_warnings",
    "compile_model",
    "fuse_optimizer",
    "get_transform",
    "load_transforms",
    "make_capturable",
    "optimize",
    "register_transform",
    "revert",
    "verify",
]
