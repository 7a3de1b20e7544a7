"""Op-level patterns in a forward trace: what follows what, and paths that name many modules.

In eager PyTorch the forward runs in program order, so "the next op that does work, reading a
tensor of the shape this op wrote" is how a fusion compiler would see a producer and its
consumer. Views and allocations launch nothing and are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from ..tracing.records import OpRecord, TensorMeta

# Normalizations whose output an elementwise epilogue could be fused into (op packet names).
NORM_OPS = frozenset(
    {
        "native_batch_norm",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
        "cudnn_batch_norm",
        "_batch_norm_with_update",
        "_batch_norm_no_update",
        "native_layer_norm",
        "native_group_norm",
        "_fused_rms_norm",
    }
)
BATCH_NORM_OPS = frozenset(n for n in NORM_OPS if "batch_norm" in n)
ACTIVATION_OPS = frozenset(
    {
        "relu",
        "relu_",
        "gelu",
        "gelu_",
        "silu",
        "silu_",
        "sigmoid",
        "sigmoid_",
        "tanh",
        "tanh_",
        "hardswish",
        "hardswish_",
        "hardsigmoid",
        "hardsigmoid_",
        "leaky_relu",
        "leaky_relu_",
        "elu",
        "elu_",
        "mish",
        "mish_",
        "hardtanh",
        "hardtanh_",
        "threshold",
        "threshold_",
        "softplus",
        "celu",
        "celu_",
        "selu",
        "selu_",
    }
)
# Elementwise ops that may sit between a norm and its activation (a residual add, a scale).
BINARY_POINTWISE_OPS = frozenset({"add", "add_", "mul", "mul_", "sub", "sub_"})
SOFTMAX_OPS = frozenset({"_softmax", "_safe_softmax"})
DROPOUT_OPS = frozenset({"native_dropout"})
BMM_OPS = frozenset({"bmm", "baddbmm"})
CONV_OPS = frozenset(
    {"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable"}
)
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm"})


def param_pair(rec: OpRecord, name: str, default: int) -> tuple[int, int]:
    """A 2-D op's int[2] argument `name` (stride, padding, kernel_size...) as a pair: one
    value for both sides; `default` where the op was not given it."""
    value = rec.params.get(name)
    if value is None or value == []:
        return default, default
    if isinstance(value, int):
        return value, value
    items = tuple(int(v) for v in value)
    return (items[0], items[0]) if len(items) == 1 else (items[0], items[1])


def following(ops: Sequence[OpRecord], start: int, *, limit: int = 8) -> Iterator[OpRecord]:
    """The forward ops that do work after position `start` of `ops` (at most `limit`)."""
    seen = 0
    for rec in ops[start + 1 :]:
        if rec.phase != "forward":
            return
        if rec.kind != "compute":
            continue
        yield rec
        seen += 1
        if seen >= limit:
            return


def preceding(ops: Sequence[OpRecord], start: int, *, limit: int = 8) -> Iterator[OpRecord]:
    """The forward ops that do work before position `start`, nearest first."""
    seen = 0
    for rec in reversed(ops[:start]):
        if rec.phase != "forward":
            return
        if rec.kind != "compute":
            continue
        yield rec
        seen += 1
        if seen >= limit:
            return


def reads_like(rec: OpRecord, produced: TensorMeta, *, by_numel: bool = False) -> bool:
    """Whether `rec` reads a tensor shaped like `produced` (same dtype; same shape, or the same
    element count when a view may have reshaped it in between)."""
    for t in rec.inputs:
        if t.dtype != produced.dtype:
            continue
        if t.shape == produced.shape or (by_numel and t.numel == produced.numel):
            return True
    return False


MAX_PATTERNS = 3  # module_pattern: patterns of paths at different depths, listed


def _component_pattern(parts: tuple[str, ...]) -> str:
    """'layer1', 'layer2' -> 'layer*'; '0', '11' -> '*'; equal parts stay."""
    if len(set(parts)) == 1:
        return parts[0]
    prefix = _common_start(list(parts))
    suffix = _common_start([p[len(prefix) :][::-1] for p in parts])[::-1]
    return f"{prefix}*{suffix}"


def _common_start(texts: list[str]) -> str:
    """The longest string every text starts with, character by character."""
    first = min(texts, key=len)
    for i, char in enumerate(first):
        if any(t[i] != char for t in texts):
            return first[:i]
    return first


def module_pattern(paths: Iterable[str]) -> str:
    """One path naming many modules: equal depth -> differing components wildcarded
    ('layer1.0.bn3', 'layer2.5.bn3' -> 'layer*.*.bn3'); paths of a few depths -> one such
    pattern per depth, comma-separated (at most `MAX_PATTERNS`); else their common prefix."""
    unique = list(dict.fromkeys(paths))
    if not unique:
        return ""
    if len(unique) == 1:
        return unique[0]
    split = [p.split(".") for p in unique]
    if len({len(s) for s in split}) == 1:
        return ".".join(_component_pattern(parts) for parts in zip(*split))
    by_depth: dict[int, list[str]] = {}
    for path, parts in zip(unique, split):
        by_depth.setdefault(len(parts), []).append(path)
    if len(by_depth) <= MAX_PATTERNS:
        return ", ".join(module_pattern(group) for group in by_depth.values())
    prefix: list[str] = []
    for parts in zip(*split):
        if len(set(parts)) != 1:
            break
        prefix.append(parts[0])
    return ".".join(prefix)


def first_modules(paths: Iterable[str], n: int = 5) -> list[str]:
    """Up to `n` distinct paths, for evidence ("" shown as the root)."""
    unique = list(dict.fromkeys(p or "(root)" for p in paths))
    return unique[:n] + ([f"... {len(unique) - n} more"] if len(unique) > n else [])
