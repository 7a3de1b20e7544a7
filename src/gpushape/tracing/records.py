"""What a trace holds: one `OpRecord` per aten op, plus the model's module tree.

Records are plain data (tuples, strings, numbers): they hold no tensor, so a trace of a 7B model
is a few hundred kilobytes and pickles or prints as it is.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Phase = Literal["forward", "backward"]
# compute: launches a kernel that moves or computes data; view: metadata only (a view, detach,
# an in-place view op): no kernel, no bytes; alloc: an allocation with no kernel (empty...).
OpKind = Literal["compute", "view", "alloc"]

DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
}


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """A tensor as the cost model sees it: shape, dtype, layout. No values.

    `memory_format` is "contiguous", "channels_last" (4-D NHWC in memory), "channels_last_3d"
    (5-D), or "strided" (anything else: a transposed or sliced view). A tensor that is both
    contiguous and channels_last (C == 1, or H == W == 1) reads as "contiguous".
    `same_as` is the position of an earlier input of the same op that is the very same tensor
    (x * x), so that it is counted as read once. `storage` names the memory the tensor views,
    the same number for every view of it within one trace (None where the tracer could not
    tell, and in a trace on a real device): which op's output another op reads, for pricing
    what Inductor fuses. `offset` is where in it the view starts, in elements (recorded with
    `storage`): two halves of one output are different data to read.
    """

    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.": "bfloat16", "int64"
    strides: tuple[int, ...]
    memory_format: str
    itemsize: int
    same_as: int | None = None
    storage: int | None = field(default=None, compare=False)
    offset: int | None = field(default=None, compare=False)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def unique_numel(self) -> int:
        """Elements actually stored: broadcast (stride-0) dimensions count once."""
        if not self.shape or 0 in self.shape:
            return self.numel
        return math.prod(n for n, s in zip(self.shape, self.strides) if s != 0)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies (broadcast dimensions stored once)."""
        return self.unique_numel * self.itemsize

    @property
    def is_floating(self) -> bool:
        return self.dtype.startswith(("float", "bfloat"))

    @property
    def channels_last(self) -> bool:
        return self.memory_format in ("channels_last", "channels_last_3d")

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "strides": list(self.strides),
            "memory_format": self.memory_format,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class OpRecord:
    """One aten op as it was dispatched.

    `inputs` are the tensor arguments in schema order (tensor lists flattened, a list argument
    `tensors` giving names `tensors[0]`, `tensors[1]`...), named by `input_names`; an optional
    tensor argument passed as None is absent. `params` holds every non-tensor argument by its
    schema name (convolution: stride, padding, dilation, transposed, output_padding, groups;
    softmax: dim, half_to_float; SDPA: dropout_p, is_causal, scale; ...), with dtypes, devices
    and memory formats as strings.

    Backward ops carry `fwd_index`, the index of the forward op whose autograd node ran them,
    and take `module` from it: a conv's `convolution_backward` belongs to the conv module.
    """

    index: int
    op: str  # "aten.convolution.default"
    module: str  # fully qualified module path; "" is the root module
    module_type: str  # "Conv2d"
    phase: Phase
    kind: OpKind
    inputs: tuple[TensorMeta, ...]
    input_names: tuple[str, ...]
    outputs: tuple[TensorMeta, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    inplace: bool = False
    tags: tuple[str, ...] = ()  # of "pointwise", "reduction", "nondeterministic_seeded"
    fwd_index: int | None = None  # backward only: the forward op this is the gradient of
    grad_fn: str | None = None  # backward only: the autograd node ("ConvolutionBackward0")

    @property
    def name(self) -> str:
        """'convolution' for 'aten.convolution.default'."""
        parts = self.op.split(".")
        return parts[1] if len(parts) >= 2 else self.op

    def has_input(self, name: str) -> bool:
        return name in self.input_names

    def input(self, name: str) -> TensorMeta:
        """The tensor argument called `name` in the op's schema."""
        try:
            return self.inputs[self.input_names.index(name)]
        except ValueError:
            raise KeyError(
                f"{self.op} has no tensor input {name!r}; inputs: {', '.join(self.input_names)}"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "op": self.op,
            "module": self.module,
            "module_type": self.module_type,
            "phase": self.phase,
            "kind": self.kind,
            "inputs": {n: t.to_dict() for n, t in zip(self.input_names, self.inputs)},
            "outputs": [t.to_dict() for t in self.outputs],
            "params": {k: _plain(v) for k, v in self.params.items()},
            "inplace": self.inplace,
            "tags": list(self.tags),
            "fwd_index": self.fwd_index,
            "grad_fn": self.grad_fn,
        }


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


@dataclass(kw_only=True)
class Trace:
    """Every aten op one forward (and, with `train`, one backward) pass dispatched.

    `modules` maps each module path to its type name, in `named_modules()` order ("" is the
    root). `device` is where tensors lived while tracing ("meta": shapes only). `grad_leaves`:
    the tensors a training step's backward accumulates gradients into (the parameters that
    require grad, and inputs that do); 0 without `train`.
    """

    model: str
    train: bool
    device: str
    ops: list[OpRecord]
    modules: dict[str, str]
    grad_leaves: int = 0
    boundary_bytes: int = 0
    """Bytes that reach a step's compiled graphs from outside each step: the model's tensor
    inputs and, in training, a gradient for each of its outputs that requires grad (AOTAutograd's
    backward takes one for every such output, a zero-filled one for an output the loss does not
    use: a Hugging Face model's logits beside the loss it computes). CUDA graphs copy them into
    their static inputs on every replay (`auditing.modes.compile_graphs_step`)."""

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[OpRecord]:
        return iter(self.ops)

    def forward_ops(self) -> list[OpRecord]:
        return [op for op in self.ops if op.phase == "forward"]

    def backward_ops(self) -> list[OpRecord]:
        return [op for op in self.ops if op.phase == "backward"]

    def ops_in(self, module: str, *, inclusive: bool = True) -> list[OpRecord]:
        """Ops attributed to `module` (and, if inclusive, to its submodules)."""
        prefix = module + "." if module else ""
        return [
            op
            for op in self.ops
            if op.module == module or (inclusive and op.module.startswith(prefix))
        ]

    def backward_of(self, index: int) -> list[OpRecord]:
        """The backward ops that the autograd node of forward op `index` ran."""
        return [op for op in self.ops if op.fwd_index == index]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "train": self.train,
            "device": self.device,
            "modules": dict(self.modules),
            "grad_leaves": self.grad_leaves,
            "boundary_bytes": self.boundary_bytes,
            "ops": [op.to_dict() for op in self.ops],
        }
