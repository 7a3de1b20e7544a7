"""slow-max-pool: max pooling through PyTorch's kernels, whose backward is slow.

PyTorch's max pooling stores an int64 index per output (8 bytes where the output is 2) and its
backward scatters the gradient through them; on the H200 the pair moves its minimum bytes at
about 15% of the copy rate (the profile's `pool` family: ResNet-50's stem pool, measured by
`gpushape probe`), and in the ResNet-50 step timed kernel by kernel it took 2.67 ms of
35.7 (`benchmarks/results/steps-h200/roofline_resnet50.json`). gpushape's MaxPool2d saves a
1-byte window position instead and gathers the gradient without atomics.

Fires on the forward max-pool ops of `nn.MaxPool2d` modules the fix can take (4-D input,
dilation 1, no ceil_mode, at most 127 taps). Saving: those ops and their backward as the cost
model prices them, less gpushape's kernel moving its minimum bytes (forward: x, y and the
positions; backward: the positions, dy and dx) at the rate measured for it (`fused_max_pool`,
the copy rate where the profile has not measured it), in eager and graph mode. Under
torch.compile Inductor writes its own max-pool kernels: those ops are priced at the rate
measured for them (`pool_compiled`: at ResNet-50's stem, 1.81 ms forward and backward against
eager's 2.78 and gpushape's 0.73, `benchmarks/results/kernels-h200/bench_max_pool.json`), and
where the profile has no such rate the finding is info there. **Fix:** `fast-max-pool`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...tracing.families import COMPILED_POOL, NCHW_VARIANTS, priced_family
from ...tracing.layout import runs_nchw
from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding
from ..patterns import module_pattern, param_pair
from ..registry import register_rule

RULE = "slow-max-pool"
FAMILY = "fused_max_pool"  # the kernel on channels_last input
FAMILY_NCHW = NCHW_VARIANTS[FAMILY]  # the kernel on NCHW input (planes, not channels, a tile)
MAX_TAPS = 127  # the kernel's window position is one signed byte
QUIET = {
    "compile": "under torch.compile Inductor generates its own max-pool kernels, and the "
    "profile has no rate measured for them",
}


def takes(rec: OpRecord) -> bool:
    """Whether gpushape's MaxPool2d computes this traced max pool (what fast-max-pool swaps)."""
    kh, kw = param_pair(rec, "kernel_size", 1)
    return (
        rec.module_type == "MaxPool2d"
        and len(rec.inputs[0].shape) == 4
        and param_pair(rec, "dilation", 1) == (1, 1)
        and not rec.params.get("ceil_mode", False)
        and kh * kw <= MAX_TAPS
        and str(rec.inputs[0].dtype) in ("float32", "float16", "bfloat16")
    )


def kernel_bytes(rec: OpRecord, train: bool) -> int:
    """gpushape's kernel's minimum bytes for one pool, forward and (training) backward."""
    x, y = rec.inputs[0], rec.outputs[0]
    if not train:
        return x.nbytes + y.nbytes
    return 2 * (x.nbytes + y.nbytes + y.numel)


def _efficiency(ctx: AuditContext, rec: OpRecord) -> float:
    """The rate measured for gpushape's kernel in this pool's layout (an unmeasured NCHW rate
    falls back to channels_last's, as the cost model's families do; 1 where neither was)."""
    achievable = ctx.gpu.achievable
    family = FAMILY_NCHW if runs_nchw(rec) else FAMILY
    return achievable.memory(priced_family(family, achievable.memory_efficiency))


@register_rule(RULE, title="max pooling through PyTorch's int64-index kernels")
def check(ctx: AuditContext) -> Iterable[Finding]:
    pools = [r for r in ctx.forward_compute() if r.name == "max_pool2d_with_indices" and takes(r)]
    if not pools:
        return
    ops = [o for r in pools for o in ctx.with_backward(r)]
    before_s = ctx.time_s(ops)
    nbytes = sum(kernel_bytes(r, ctx.train) for r in pools)
    after_s = sum(ctx.bytes_time_s(kernel_bytes(r, ctx.train)) / _efficiency(ctx, r) for r in pools)
    efficiency = ctx.bytes_time_s(nbytes) / after_s if after_s > 0 else 1.0
    saving = max(before_s - after_s, 0.0)
    if saving <= 0:
        return
    achievable = ctx.gpu.achievable
    compiled_s = None  # Inductor's kernels: the ops' bytes at the rate measured for them
    if COMPILED_POOL in achievable.memory_efficiency:
        pool_bytes = sum(ctx.op_cost(o).min_bytes for o in ops)
        compiled_s = ctx.bytes_time_s(pool_bytes) / achievable.memory(COMPILED_POOL)
    compile_saving = max(compiled_s - after_s, 0.0) if compiled_s is not None else 0.0
    by_mode = {"eager": saving, "graph": saving, "compile": compile_saving}
    x = pools[0].inputs[0]
    evidence = {
        "pools": len(pools),
        "input_shape": list(x.shape),
        "dtype": x.dtype,
        "time_pytorch_s": before_s,
        "time_inductor_s": compiled_s,
        "time_kernel_s": after_s,
        "kernel_bytes": nbytes,
        "kernel_efficiency": efficiency,
        "kernel_efficiency_measured": FAMILY in ctx.gpu.achievable.memory_efficiency,
        "nchw_pools": sum(runs_nchw(r) for r in pools),
        "saving_by_mode_s": by_mode,
        "why_quiet": QUIET,
    }
    message = (
        f"{len(pools)} max pool(s) run PyTorch's kernels ({before_s * 1e3:,.3f} ms with the "
        f"backward): gpushape's MaxPool2d moves {nbytes / 1e6:,.0f} MB in "
        f"{after_s * 1e3:,.3f} ms, a 1-byte window position in place of the int64 index"
    )
    yield ctx.finding(
        RULE,
        module_pattern(r.module for r in pools),
        message,
        evidence,
        saving_s=saving,
        fix="fast-max-pool",
        replaces=pools,
    )
