"""The modules fuse-qkv puts in place: one `FusedLinear` holding the concatenated weight, and a
`FusedSlice` at each original projection's place returning its columns of the fused output. The
first slice holds the FusedLinear as its child `fused` (the others refer to it unregistered): the
fused layer lives wherever the slices do, also where a rewrite rebuilds their parent from the
children its forward calls (fuse-norm-act's GraphModule).

The first slice called with an input runs the one GEMM for all of them and keeps its output for
that input (`_Round`); each other slice called with the very same tensor (same object, same
version, same grad mode) returns its columns of that output, a view. A slice called with any
other tensor (a call the trace did not see), or one whose input was modified in place, computes
its own rows of the weight instead: never a stale result. The round is dropped once every slice
has taken its columns (or when a slice already served is called again: a new input); a member
the forward skips keeps the last round (its input and output) alive until the next call. While
torch.compile traces, the version is not compared (Dynamo cannot read version counters without
breaking the graph): compiled code that modifies an input in place between two of its
projections would be served the output from before.

State dict: the original keys and shapes. Each slice saves its rows under the original names
(`prefix + "weight"`, `prefix + "bias"`: views of the fused Parameter, detached) and loads them
into its rows; the FusedLinear saves nothing and reports nothing missing (a dict that does hold
its own keys loads as usual). With `load_state_dict(..., assign=True)` a fused Parameter on
another device or dtype (the meta device: a model built there) is first re-made on the loaded
tensors' device and dtype, then filled row by row. Methods rather than registered hooks, so that
deepcopy and pickling keep them.

`fused_from`, `alias_rows` and `copy_back` build the fused layer from the Linears and undo it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PARTS = ("weight", "bias")


class _Round:
    """One input's fused output, split into the members' columns, and which members have taken
    theirs (a bit each). One split rather than a slice per member: in backward autograd then
    concatenates the members' gradients in one kernel, where separate slices would each write
    a zero-filled gradient of the whole fused output and add them up."""

    __slots__ = ("grad", "out", "served", "version", "x")

    def __init__(self, x: torch.Tensor, out: tuple[torch.Tensor, ...]):
        self.x, self.version, self.grad = x, _version(x), torch.is_grad_enabled()
        self.out, self.served = out, 0

    def matches(self, x: torch.Tensor) -> bool:
        return self.x is x and self.version == _version(x) and self.grad == torch.is_grad_enabled()


def _version(x: torch.Tensor) -> int:
    """The tensor's version counter; -1 for inference tensors, which keep none, and while
    torch.compile traces (Dynamo cannot read it without breaking the graph)."""
    if torch.compiler.is_compiling() or x.is_inference():
        return -1
    return x._version


class FusedLinear(nn.Linear):
    """One Linear whose output rows are the projections `members` (attribute names in the parent,
    `sizes` rows each, in that order)."""

    _round: _Round | None = None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, members, sizes):
        nn.Module.__init__(self)
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight)
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = nn.Parameter(bias)
        self.members, self.sizes = tuple(members), tuple(sizes)
        self.starts = tuple(sum(self.sizes[:i]) for i in range(len(self.sizes)))

    def rows(self, index: int, t: torch.Tensor) -> torch.Tensor:
        return t.narrow(0, self.starts[index], self.sizes[index])

    def project(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Member `index`'s output for input `x` (see the module docstring)."""
        r, bit = self._round, 1 << index
        if r is None or r.served & bit:
            r = self._round = _Round(x, self(x).split(self.sizes, dim=-1))
        elif not r.matches(x):
            bias = None if self.bias is None else self.rows(index, self.bias)
            return F.linear(x, self.rows(index, self.weight), bias)
        r.served |= bit
        if r.served == (1 << len(self.sizes)) - 1:
            self._round = None
        return r.out[index]

    def original_rows(self, fqn: str) -> dict[str, tuple[str, int, int]]:
        """{original parameter name: (this module's attribute, first row, rows)}; `fqn` is this
        module's name in the model, under the first slice (the gate in `_verify.py` reads
        gradients this way)."""
        parent = fqn.rpartition(".")[0].rpartition(".")[0]
        prefix = f"{parent}." if parent else ""
        return {
            f"{prefix}{member}.{part}": (part, start, size)
            for member, start, size in zip(self.members, self.starts, self.sizes, strict=True)
            for part in PARTS
            if getattr(self, part) is not None
        }

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        """Nothing: the slices save the rows under the original names."""

    def _load_from_state_dict(self, state_dict, prefix, metadata, strict, missing, *args):
        super()._load_from_state_dict(state_dict, prefix, metadata, strict, missing, *args)
        own = [prefix + part for part in PARTS]
        missing[:] = [k for k in missing if k not in own]  # the slices load these rows

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_round", None)  # an input and its output: never copied or pickled
        return state

    def extra_repr(self) -> str:
        parts = ", ".join(f"{m}: {n}" for m, n in zip(self.members, self.sizes, strict=True))
        return f"{super().extra_repr()}, fused=({parts})"


class FusedSlice(nn.Module):
    """Where a fused projection was: its columns of the FusedLinear's output. Its `weight` and
    `bias` are its rows of the fused Parameters (views, for code that reads their dtype/shape)."""

    def __init__(self, fused: FusedLinear, index: int):
        super().__init__()
        if index == 0:
            self.fused = fused
        else:
            self.__dict__["fused"] = fused  # not registered: the first slice holds it
        self.index = index
        self.in_features, self.out_features = fused.in_features, fused.sizes[index]

    @property
    def weight(self) -> torch.Tensor:
        return self.fused.rows(self.index, self.fused.weight)

    @property
    def bias(self) -> torch.Tensor | None:
        bias = self.fused.bias
        return None if bias is None else self.fused.rows(self.index, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.project(x, self.index)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        for part in PARTS:
            t = getattr(self.fused, part)
            if t is not None:
                t = t if keep_vars else t.detach()
                destination[prefix + part] = self.fused.rows(self.index, t)

    def _load_from_state_dict(self, state_dict, prefix, metadata, strict, missing, *rest):
        own = {p: state_dict[prefix + p] for p in PARTS if prefix + p in state_dict}
        others = {k: v for k, v in state_dict.items() if k not in {prefix + p for p in own}}
        super()._load_from_state_dict(others, prefix, metadata, strict, missing, *rest)
        errors = rest[-1]
        for part in PARTS:
            target = getattr(self.fused, part)
            if target is None:
                continue
            if part not in own:
                missing.append(prefix + part)
                continue
            value = own[part]
            rows = self.fused.rows(self.index, target)
            if not isinstance(value, torch.Tensor) or value.shape != rows.shape:
                shape = getattr(value, "shape", type(value).__name__)
                errors.append(
                    f"size mismatch for {prefix}{part}: copying a param with shape {shape} from "
                    f"checkpoint, the shape in current model is {rows.shape}."
                )
                continue
            if metadata.get("assign_to_params_buffers", False):
                _rehome(self.fused, part, value)
            with torch.no_grad():
                self.fused.rows(self.index, getattr(self.fused, part)).copy_(value)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fused"


# ---- building and undoing -------------------------------------------------------------------
def _cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    if tensors[0] is None:
        return None
    with torch.no_grad():
        return torch.cat([t.detach() for t in tensors])


def fused_from(linears: list[nn.Linear], names: list[str]) -> FusedLinear:
    """The FusedLinear of the Linears' current values, gradients, flags and Parameter tags."""
    sizes = [m.out_features for m in linears]
    weight = _cat([m.weight for m in linears])
    fused = FusedLinear(weight, _cat([m.bias for m in linears]), names, sizes)
    fused.train(linears[0].training)
    for part in PARTS:
        new, old = getattr(fused, part), [getattr(m, part) for m in linears]
        if new is None:
            continue
        new.requires_grad_(old[0].requires_grad)
        if all(p.grad is not None for p in old):
            new.grad = _cat([p.grad for p in old])
        for p in old:  # attributes tagged on the Parameters (no-decay flags...)
            for key, value in vars(p).items():
                new.__dict__.setdefault(key, value)
    return fused


def alias_rows(linears: list[nn.Linear], fused: FusedLinear) -> None:
    """The originals' Parameters made views of their rows: no second copy of the weights."""
    for i, m in enumerate(linears):
        for part in PARTS:
            p = getattr(m, part)
            if p is not None:
                p.data, p.grad = fused.rows(i, getattr(fused, part).detach()), None


def copy_back(linears: list[nn.Linear], fused: FusedLinear) -> None:
    """The fused Parameters' current rows, gradients and flags into the originals'."""
    for i, m in enumerate(linears):
        m.train(fused.training)
        for part in PARTS:
            p, now = getattr(m, part), getattr(fused, part)
            if p is None:
                continue
            p.data = fused.rows(i, now.detach()).clone()
            p.requires_grad_(now.requires_grad)
            p.grad = None if now.grad is None else fused.rows(i, now.grad).clone()


def _rehome(fused: FusedLinear, part: str, like: torch.Tensor) -> None:
    """assign=True: the fused Parameter re-made on `like`'s device and dtype (its values kept
    unless it is on the meta device), so the rows loaded next are kept, not dropped."""
    p = getattr(fused, part)
    if p.device == like.device and p.dtype == like.dtype:
        return
    if p.is_meta:
        data = torch.empty(p.shape, device=like.device, dtype=like.dtype)
    else:
        data = p.detach().to(like.device, like.dtype, copy=True)
    new = nn.Parameter(data, requires_grad=p.requires_grad)
    new.__dict__.update(vars(p))
    setattr(fused, part, new)
