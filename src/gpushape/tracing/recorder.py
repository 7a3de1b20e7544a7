"""Run a model once under a dispatch-level recorder: every aten op, with its module and phase.

How attribution works:
- Forward: global module forward pre/post hooks keep a stack of the modules being called; an op
  belongs to the innermost one ("" is the root module, functional code in a parent's forward
  belongs to the parent).
- Backward: autograd numbers each node it creates (a thread-local sequence number, bumped when
  the node of a forward op is made, just before that op reaches the dispatcher), so the recorder
  maps sequence number -> forward op. While the engine runs a node,
  `torch._C._current_autograd_node()` names it; its sequence number gives the forward op, and
  the backward op takes that op's module and `fwd_index`. Gradient accumulation into a leaf
  (AccumulateGrad) goes to the module owning the parameter.

What runs: on the meta device (default) no memory is allocated and nothing is computed; weights
that exist are swapped for meta stand-ins during the call; `scaled_dot_product_attention` and
dropout are routed to the fused kernels a GPU would run (`routing.py`). On a real device the
model runs for real. Train mode runs the forward with grad enabled, then `torch.autograd.grad`
of every output that requires grad (seeded with ones) with respect to every parameter (and
every example input that requires grad), so no `.grad` is touched (tracer.py).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import GpushapeError, meta_only
from .records import DTYPE_BYTES, OpRecord, TensorMeta
from .routing import cuda_output_layout, in_half_math_sdpa

_ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"
_VIEW_OPS = {
    "aten._unsafe_view",
    "aten.detach",
    "aten.lift_fresh",
    "aten.alias",
    "aten._reshape_alias",
    "aten.set_",
}
# Tags differ between torch releases (Tag.inplace is newer than torch 2.11): look them up by name.
# the tag of ops an SDPA call on half inputs ran on CUDA's math path (in fp32 there)
SDPA_MATH = "sdpa_math"
_KEPT_TAGS = {
    getattr(torch.Tag, name)
    for name in ("pointwise", "reduction", "nondeterministic_seeded")
    if hasattr(torch.Tag, name)
}
_INPLACE_TAG = getattr(torch.Tag, "inplace", None)
_INPLACE_VIEW_TAG = getattr(torch.Tag, "inplace_view", None)
_ALLOC_OPS = {
    "aten.empty",
    "aten.empty_strided",
    "aten.new_empty",
    "aten.new_empty_strided",
    "aten.empty_like",
    "aten.resize_",
    "aten.resize_as_",
}


class TraceError(GpushapeError, RuntimeError):
    """The model's forward or backward failed while being traced."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _memory_format(t: torch.Tensor) -> str:
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return "channels_last_3d"
    return "strided"


def tensor_meta(
    t: torch.Tensor, same_as: int | None = None, storage: int | None = None
) -> TensorMeta:
    name = _dtype_name(t.dtype)
    try:
        strides, fmt = tuple(t.stride()), _memory_format(t)
    except RuntimeError:  # sparse / nested tensors have no strides
        strides, fmt = (), "strided"
    return TensorMeta(
        shape=tuple(t.shape),
        dtype=name,
        strides=strides,
        memory_format=fmt,
        itemsize=DTYPE_BYTES.get(name, t.element_size()),
        same_as=same_as,
        storage=storage,
        offset=_offset(t) if storage is not None else None,
    )


def _offset(t: torch.Tensor) -> int | None:
    try:
        return int(t.storage_offset())
    except (RuntimeError, NotImplementedError):
        return None


def _plain(value: Any) -> Any:
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def failure_message(
    op: str | None, module: str, module_type: str, phase: str, device: str, exc: BaseException
) -> str:
    """One line: what failed, in which module, and (on meta) what to do about it."""
    where = f"module '{module}' ({module_type})" if module else f"the root module ({module_type})"
    message = " ".join(str(exc).split())[:300] or type(exc).__name__
    what = f"{op} failed" if op else f"{type(exc).__name__} raised"
    text = f"{what} in {where} during the {phase} pass on {device}: {message}"
    if device == "meta" and not meta_only(exc):  # its own check: any device refuses it
        text += (
            f"; {'the op' if op else 'the model'} refuses these shapes or arguments on any "
            "device: check the inputs against what the model expects (--input, or the "
            "factory's example inputs)"
        )
    elif device == "meta":
        text += (
            "; if the model needs tensor values (meta tensors have shapes only) or an op "
            "has no meta kernel, trace it with real tensors: --device cpu "
            "(API: device='cpu')"
        )
    return text


def kept_tags(func: torch._ops.OpOverload) -> tuple[str, ...]:
    """The tags a record of `func` carries ("pointwise", "reduction", ...), sorted."""
    return tuple(sorted(str(t).removeprefix("Tag.") for t in set(func.tags) & _KEPT_TAGS))


def op_tags(op: str) -> tuple[str, ...]:
    """`kept_tags` of an op named as records name it ("aten.sum.dim_IntList"); () for a name
    that is not an ATen overload."""
    namespace, _, rest = op.partition(".")
    packet, _, overload = rest.partition(".")
    try:
        func = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
    except (AttributeError, RuntimeError):
        return ()
    return kept_tags(func) if isinstance(func, torch._ops.OpOverload) else ()


class _Schema:
    """Per-op facts computed once: argument names, op name, kind, in-place."""

    __slots__ = ("arg_names", "inplace", "kind", "name", "tags")

    def __init__(self, func: torch._ops.OpOverload) -> None:
        self.name = str(func)  # "aten.convolution.default"
        self.arg_names = tuple(a.name for a in func._schema.arguments)
        tags = set(func.tags)
        self.tags = kept_tags(func)
        packet = self.name.rsplit(".", 1)[0]
        self.inplace = _INPLACE_TAG in tags or packet.endswith("_")
        if func.is_view or _INPLACE_VIEW_TAG in tags or packet in _VIEW_OPS:
            self.kind = "view"
        elif packet in _ALLOC_OPS:
            self.kind = "alloc"
        else:
            self.kind = "compute"


class ModuleStack:
    """Which module is running: global forward hooks push and pop module paths."""

    def __init__(self, root: nn.Module) -> None:
        self.names = {id(m): name for name, m in root.named_modules()}
        self.keep = list(root.modules())  # ids stay valid while we hold the modules
        self.stack: list[tuple[str, str]] = [("", type(root).__name__)]
        self.failed_in: tuple[str, str] | None = None

    def push(self, module: nn.Module, args: Any) -> None:
        name = self.names.get(id(module))
        if name is None:  # a module the model does not hold (built during forward: transformers
            # 5.25 wraps functions such as its rotary embedding in one): its ops are its
            # caller's, as the profiler's module ranges and the user's module paths see them
            self.stack.append(self.stack[-1])
        else:
            self.stack.append((name, type(module).__name__))

    def pop(self, module: nn.Module, args: Any, output: Any) -> None:
        if sys.exc_info()[1] is not None and self.failed_in is None:
            self.failed_in = self.stack[-1]  # the innermost module an exception left
        if len(self.stack) > 1:
            self.stack.pop()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        pre = register_module_forward_pre_hook(self.push)
        post = register_module_forward_hook(self.pop, always_call=True)
        try:
            yield
        finally:
            pre.remove()
            post.remove()


# A trace in `reporting(callback)` calls it with (ops recorded so far, phase) every
# PROGRESS_EVERY ops: a model that loops in Python over its sequence traces every step.
PROGRESS_EVERY = 50_000
_PROGRESS: ContextVar[Callable[[int, str], None] | None] = ContextVar("progress", default=None)


@contextlib.contextmanager
def reporting(callback: Callable[[int, str], None]) -> Iterator[None]:
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


class Recorder(TorchDispatchMode):
    """Records each aten op that reaches the dispatcher as an `OpRecord`."""

    def __init__(
        self,
        modules: ModuleStack,
        module_types: dict[str, str],
        param_modules: dict[int, str],
        device: str,
    ) -> None:
        super().__init__()
        self.modules = modules
        self.module_types = module_types  # module path -> type name
        self.param_modules = param_modules  # id(leaf tensor) -> owning module path
        self.device = device
        self.ops: list[OpRecord] = []
        self.phase = "forward"
        self.seq_to_op: dict[int, int] = {}
        self.last_seq = torch._C._autograd._get_sequence_nr()
        self.schemas: dict[Any, _Schema] = {}
        # storage -> its number in this trace (meta only); the storages are kept alive while it
        # records, so that no freed one's address is taken for a new one's
        self.storages: dict[int, int] = {}
        self._kept: list[Any] = []

        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except TraceError:
            raise
        except Exception as exc:
            module, mtype, *_ = self._attribution(None)
            raise TraceError(
                failure_message(str(func), module, mtype, self.phase, self.device, exc)
            ) from exc
        if self.device == "meta":
            out = cuda_output_layout(func, args, out)
        self._record(func, args, kwargs, out)
        return out

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Ops run in this block are not recorded (the gradient seeds of train mode)."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    # ---- recording ---------------------------------------------------------------------------
    def _schema(self, func) -> _Schema:
        schema = self.schemas.get(func)
        if schema is None:
            schema = self.schemas[func] = _Schema(func)
        return schema

    def _record(self, func, args, kwargs, out) -> None:
        schema = self._schema(func)
        inputs, names, params = self._arguments(schema, args, kwargs)
        outputs = tuple(
            tensor_meta(t, storage=self._storage(t))
            for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor)
        )
        index = len(self.ops)
        if index and index % PROGRESS_EVERY == 0 and (callback := _PROGRESS.get()) is not None:
            callback(index, self.phase)
        module, mtype, phase, fwd_index, grad_fn = self._attribution(index)
        self.ops.append(
            OpRecord(
                index=index,
                op=schema.name,
                module=module,
                module_type=mtype,
                phase=phase,
                kind=schema.kind,
                inputs=inputs,
                input_names=names,
                outputs=outputs,
                params=params,
                inplace=schema.inplace,
                tags=(*schema.tags, SDPA_MATH) if in_half_math_sdpa() else schema.tags,
                fwd_index=fwd_index,
                grad_fn=grad_fn,
            )
        )

    def _storage(self, t: torch.Tensor) -> int | None:
        """The number of the memory `t` views (module docstring of records.TensorMeta). Only on
        the meta device, where keeping every storage alive until the trace ends costs no
        memory; a trace on a real device records none."""
        if self.device != "meta":
            return None
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested: no single storage
            return None
        key = storage._cdata
        number = self.storages.get(key)
        if number is None:
            number = self.storages[key] = len(self.storages)
            self._kept.append(storage)
        return number

    def _arguments(self, schema: _Schema, args, kwargs):
        inputs: list[TensorMeta] = []
        names: list[str] = []
        params: dict[str, Any] = {}
        seen: dict[int, int] = {}

        def add(name: str, t: torch.Tensor) -> None:
            same = seen.get(id(t))
            if same is None:
                seen[id(t)] = len(inputs)
            inputs.append(tensor_meta(t, same_as=same, storage=self._storage(t)))
            names.append(name)

        bound = list(zip(schema.arg_names, args)) + list(kwargs.items())
        for name, value in bound:
            if isinstance(value, torch.Tensor):
                add(name, value)
            elif isinstance(value, (list, tuple)) and any(
                isinstance(v, torch.Tensor) for v in value
            ):
                for i, v in enumerate(value):
                    if isinstance(v, torch.Tensor):
                        add(f"{name}[{i}]", v)
            elif value is not None:
                params[name] = _plain(value)
        return tuple(inputs), tuple(names), params

    def _attribution(self, index: int | None):
        """(module, module type, phase, forward op index, autograd node name) for a new op."""
        node = torch._C._current_autograd_node()
        if node is None:
            module, mtype = self.modules.stack[-1]
            if self.phase == "forward" and index is not None:
                self._note_forward_node(index)
            return module, mtype, self.phase, None, None
        name = node.name()
        if name == _ACCUMULATE_GRAD:
            module = self.param_modules.get(id(getattr(node, "variable", None)), "")
            return module, self.module_types.get(module, ""), "backward", None, name
        fwd = self.seq_to_op.get(node._sequence_nr())
        if fwd is None:
            root, rtype = self.modules.stack[0]
            return root, rtype, "backward", None, name
        op = self.ops[fwd]
        return op.module, op.module_type, "backward", fwd, name

    def _note_forward_node(self, index: int) -> None:
        """Map the autograd nodes made since the last op (this op's node) to this op."""
        seq = torch._C._autograd._get_sequence_nr()
        if seq != self.last_seq:
            for s in range(max(self.last_seq, seq - 8), seq):
                self.seq_to_op[s] = index
            self.last_seq = seq
