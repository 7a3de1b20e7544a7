"""Is a rewritten model still the same function? The kernels' numeric gate, for a whole model.

For the example inputs and a random (seeded) gradient of the outputs, the outputs and the
gradient of every original parameter are compared three ways, each by its relative error
e(a) = ||a - ref64|| / ||ref64|| (L2 norms over the finite positions):

    e(rewritten) <= k * e(original) + tol,   k = 2 (fp32), 3 (fp16/bf16), as the kernels' gate

where ref64 is the original model run in float64 and `original` the original in its own dtype:
a rewrite may be as far from exact as PyTorch itself is at that dtype, a little more, never
much more. `original` is the worse of two runs where the model has 4-D weights, its NCHW and
its channels_last one: PyTorch's kernels for the two formats round differently (on CPU its
channels_last convolutions land several times further from float64 on ResNet-50's BatchNorm
gradients), and both are PyTorch at that dtype. Norms rather than the kernels' max-abs: across
a deep network a rewrite moves a few elements of an ill-conditioned gradient (BatchNorm over
few values, a bias before BatchNorm whose true gradient is zero) further than PyTorch's own run
happened to, while the tensor as a whole stays as close. `tol` (1e-4 fp32, 1e-2 fp16,
3e-2 bf16) absorbs that; a wrong rewrite (a lost activation, a residual added twice, a padded
row leaking) moves whole tensors by tens of percent. Models run on deep copies with the same
random seed and with dropout off (two implementations of one layer, eager attention and SDPA
say, draw different masks; the kernels' tests check dropout itself), so running statistics and
the user's parameters are left as they were. A padded parameter's gradient is compared on the
original shape (the leading slice); a fused one's (fuse-qkv) per original parameter, on its rows
(`original_gradients`).

A run of the original that is itself wrong is left out of PyTorch's error for that tensor
(`own_error`): where one run's error is above 0.5 (relative) and more than 10x the best run's,
while the best run is within `tol` (rounding at the dtype), that run meets a PyTorch bug, it
does not show PyTorch's rounding. pytorch#188344: on CUDA, avg_pool2d's channels_last backward
drops the padding. Measured on an H100 (torch 2.11), with PoolFormerV2-S12's pools fed
channels_last tensors the gradients reaching its stage-3 norms were 1.9-3.1 (190-310 %) from
right, while gpushape's kernels on those tensors were right to 1e-7. There the original's
channels_last run was spared (PyTorch's group norm hands the pools NCHW tensors whatever its
input), and the check failed, rightly; in a model whose pools see channels_last tensors in that
run, it meets the same bug, and kept it would make the bound about k x 3 and the check unable
to fail for any rewrite that makes those tensors channels_last. Rounding does
not do that: the two formats' runs differ by a few times (ResNet-50's BatchNorm gradients
above, hence the factor 10), and a wrong rewrite already moves whole tensors by tens of
percent (hence 0.5). A gradient whose true value is about zero (a bias before BatchNorm) is
far from float64, relatively, in every run, the best one above `tol` too: nothing is left out
there. The errors of the runs left out are in `Verification.left_out`.

A tensor too ill-conditioned to judge at bf16 or fp16 is judged at float32 instead (`WIDER`):
where the original's float32 run is already e32 from float64, that dtype's rounding alone moves
it by about e32 x (its epsilon / float32's), and once that is above WRONG_FLOOR a comparison at
that dtype says nothing. A PoolFormerV2-S12 StarReLU's `scale` (one number, the sum over a
stage's activations, which nearly cancels) came out 2.8 from float64 in bf16 under
fuse-group-norm against 0.31 for PyTorch, while in float32 the two agreed to 2e-3 (an H100).
Such a tensor, when it fails its bound, is compared again with both models run in float32,
against that dtype's gate (2 x e32 + 1e-4): a wrong rewrite still moves it by tens of percent
there. Only tensors that fail are re-run, so a passing check costs nothing more; the tensors
judged so are in `Verification.widened`.

A rewrite that computes below the parameters' dtype (autocast-bf16: float32 weights, bf16
matmuls; `compute_dtype`) is still compared with the float64 run of the original, never with
the original under the same autocast (identical by construction: a check that cannot fail), at
that dtype's level: k and tol of bf16 (fp16), and PyTorch's own error is also taken from the
original cast to that dtype (`lower`, when the caller has it: `optimize` does). A fixed 3e-2
alone is not that level: on tests/transforms/nets.py's ConvNet, bf16 autocast lands a
BatchNorm weight's gradient 27 % from float64, and the model cast to bf16 lands it as far.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils import _pytree as pytree

GATE_K = {torch.float64: 2.0, torch.float32: 2.0, torch.float16: 3.0, torch.bfloat16: 3.0}
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}
SEED = 1234
WRONG_FACTOR = 10.0  # a run of the original this many times the best run's error ...
WRONG_FLOOR = 0.5  # ... and this far (relative) from float64 is wrong, not rounded
WIDER = torch.float32  # where a tensor too ill-conditioned for bf16 or fp16 is judged


@dataclass(frozen=True, kw_only=True)
class Verification:
    passed: bool
    checked: int
    """How many tensors were compared (outputs and parameter gradients)."""
    worst: str = ""
    """The comparison furthest over (or closest to) its bound, in one line."""
    errors: dict[str, float] = field(default_factory=dict, repr=False)
    left_out: dict[str, list[float]] = field(default_factory=dict, repr=False)
    """Per tensor, the errors of the original's runs left out of its bound as wrong
    (`own_error`)."""
    widened: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)
    """Per tensor judged at WIDER (too ill-conditioned at the model's dtype): (its error there,
    its bound there)."""


def _tensors(out) -> list[torch.Tensor]:
    if hasattr(out, "to_tuple"):  # transformers' ModelOutput
        out = out.to_tuple()
    leaves = pytree.tree_leaves(out)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _run(
    model: nn.Module, inputs: tuple, dtype: torch.dtype | None, channels_last: bool = False
) -> dict[str, torch.Tensor]:
    """Outputs and parameter gradients of one seeded forward and backward, on a deep copy
    (with its 4-D parameters and inputs in channels_last when asked)."""
    model = copy.deepcopy(model)
    for m in model.modules():  # dropout off: two implementations draw different masks
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
    if channels_last:
        model, inputs = model.to(memory_format=torch.channels_last), _nhwc(inputs)
    if dtype is not None:
        model = model.to(dtype)
        inputs = pytree.tree_map(
            lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
            inputs,
        )
    inputs = pytree.tree_map(
        lambda t: t.detach().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t,
        inputs,
    )
    torch.manual_seed(SEED)
    outs = _tensors(model(*inputs))
    gen = torch.Generator(device="cpu").manual_seed(SEED + 1)
    loss = sum(
        (o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)).sum()
        for o in outs
    )
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        loss.backward()
    result = {f"output[{i}]": o.detach() for i, o in enumerate(outs)}
    result.update({f"grad {name}": g for name, g in original_gradients(model).items()})
    return result


def original_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, under the original model's names: a module that holds several
    original parameters as rows of one (fuse-qkv's FusedLinear) names them with
    `original_rows(fqn) -> {original name: (its attribute, first row, rows)}`."""
    grads = {name: p.grad.detach() for name, p in model.named_parameters() if p.grad is not None}
    for fqn, module in model.named_modules():
        rows = getattr(module, "original_rows", None)
        if not callable(rows):
            continue
        for name, (attr, start, n) in rows(fqn).items():
            grad = getattr(module, attr).grad
            if grad is not None:
                grads[name] = grad.detach().narrow(0, start, n)
    return grads


def _err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error of `a` (its leading slice, if padded) against `ref`."""
    a = a[tuple(slice(0, n) for n in ref.shape)] if a.shape != ref.shape else a
    ref = ref.double()
    finite = torch.isfinite(ref)
    if not finite.any():
        return 0.0
    diff = float(torch.linalg.vector_norm((a.double() - ref)[finite]))
    norm = float(torch.linalg.vector_norm(ref[finite]))
    return diff / norm if norm > 0 else diff


def _nhwc(inputs: tuple) -> tuple:
    return pytree.tree_map(
        lambda t: (
            t.contiguous(memory_format=torch.channels_last)
            if isinstance(t, torch.Tensor) and t.dim() == 4
            else t
        ),
        inputs,
    )


def reference(model: nn.Module, inputs: tuple) -> tuple[dict, list[dict], torch.dtype]:
    """(float64 results, same-dtype results, dtype) of the original model. PyTorch's own error
    at the dtype is taken over both memory formats where the model has 4-D weights (its NCHW
    and channels_last kernels round differently): the spread of its own algorithms."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    same = [_run(model, inputs, None)]
    if any(p.dim() == 4 for p in model.parameters()):
        same.append(_run(model, inputs, None, channels_last=True))
    return _run(model, inputs, torch.float64), same, dtype


def compute_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype a rewrite makes (part of) the model compute in, below its parameters': a
    module whose forward carries `autocast_dtype` (autocast.py's wrapper); None: its own."""
    for module in model.modules():
        dtype = getattr(module.__dict__.get("forward"), "autocast_dtype", None)
        if isinstance(dtype, torch.dtype):
            return dtype
    return None


def lower_reference(model: nn.Module, inputs: tuple, dtype: torch.dtype) -> dict | None:
    """The original model run cast to `dtype`: PyTorch's own error there (None: it cannot run
    in that dtype on this device)."""
    try:
        return _run(model, inputs, dtype)
    except RuntimeError:
        return None


def own_error(errs: list[float], tol: float) -> tuple[float, list[float]]:
    """PyTorch's own error for one tensor from its runs' errors against float64: the worst run
    that is not wrong (see the module docstring), and the errors of the runs left out."""
    best = min(errs)
    if best > tol:  # no run is at rounding: none can be told wrong from ill-conditioned
        return max(errs), []
    wrong = [e for e in errs if e > WRONG_FLOOR and e > WRONG_FACTOR * best]
    return max(e for e in errs if e not in wrong), wrong


def ill_conditioned(e_wider: float, dtype: torch.dtype) -> bool:
    """Whether a tensor the original computes `e_wider` from float64 at WIDER is beyond judging
    at `dtype`: that dtype's rounding alone would move it by more than WRONG_FLOOR."""
    if dtype.itemsize >= WIDER.itemsize or not dtype.is_floating_point:
        return False
    return e_wider * torch.finfo(dtype).eps / torch.finfo(WIDER).eps > WRONG_FLOOR


class _Wider:
    """The original's and the rewritten model's runs at WIDER, each made when first needed (None:
    it cannot run there)."""

    def __init__(self, model: nn.Module, inputs: tuple, original_at) -> None:
        self.model, self.inputs, self.original_at = model, inputs, original_at
        self._ours: dict | None = None
        self._tried = False

    def original(self) -> dict | None:
        return self.original_at(WIDER)  # the caller keeps it (optimize's `_Reference.at`)

    def ours(self) -> dict | None:
        if not self._tried:
            self._tried = True
            try:
                self._ours = _run(self.model, self.inputs, WIDER)
            except Exception:  # a kernel's own dtype check too: the verdict at
                self._ours = None  # the model's dtype stands, the stricter one
        return self._ours


def verify(
    model: nn.Module,
    inputs: tuple,
    ref: tuple[dict, list, torch.dtype],
    lower: dict | None = None,
    original_at=None,
) -> Verification:
    """Gate the rewritten `model` against the original's `reference(...)`; `lower`: the
    original's `lower_reference` at `compute_dtype(model)`, when that is below its own;
    `original_at(dtype)`: the original's `lower_reference` at a dtype, for the tensors judged
    at WIDER (none are without it)."""
    ref64, sames, dtype = ref
    own_tol = TOLERANCE.get(dtype, 3e-2)  # the original's own runs round at its dtype
    lowers = []
    math = compute_dtype(model)
    if math is not None and math.itemsize < dtype.itemsize:
        dtype = math
        lowers = [lower] if lower is not None else []
    ours = _run(model, inputs, None)
    k = GATE_K.get(dtype, 3.0)
    tol = TOLERANCE.get(dtype, 3e-2)
    narrow = dtype.itemsize < WIDER.itemsize and not lowers  # bf16, fp16, not autocast
    wider = _Wider(model, inputs, original_at) if original_at and narrow else None
    worst, worst_ratio, errors, ok, left_out, widened = "", -1.0, {}, True, {}, {}
    for name, exact in ref64.items():
        if any(name not in same for same in (*sames, *lowers)):
            continue
        if name not in ours:
            return Verification(passed=False, checked=len(errors), worst=f"{name} missing")
        own, wrong = own_error([_err(same[name], exact) for same in sames], own_tol)
        bound = k * max([own, *(_err(low[name], exact) for low in lowers)]) + tol
        err = _err(ours[name], exact)
        if err > bound and wider is not None:
            judged = _judge_wider(wider, name, exact, dtype)
            if judged is not None:
                (err, bound), widened[name] = judged, judged
        errors[name] = err
        if wrong:
            left_out[name] = wrong
        ratio = err / bound if bound > 0 else (0.0 if err == 0 else float("inf"))
        if ratio > worst_ratio:
            worst_ratio, worst = ratio, f"{name}: relative error {err:.3g}, bound {bound:.3g}"
            if name in widened:
                worst += f" (in {str(WIDER).removeprefix('torch.')}: ill-conditioned at its dtype)"
            if wrong:
                worst += f" (a run of the original {', '.join(f'{e:.3g}' for e in wrong)} "
                worst += "from float64 left out as wrong)"
        ok = ok and err <= bound
    return Verification(
        passed=ok,
        checked=len(errors),
        worst=worst,
        errors=errors,
        left_out=left_out,
        widened=widened,
    )


def _judge_wider(
    wider: _Wider, name: str, exact: torch.Tensor, dtype: torch.dtype
) -> tuple[float, float] | None:
    """(error, bound) of tensor `name` at WIDER, where the original's run there shows it too
    ill-conditioned to judge at `dtype`; None: judge it at `dtype`."""
    original = wider.original()
    if original is None or name not in original:
        return None
    e_wider = _err(original[name], exact)
    if not ill_conditioned(e_wider, dtype):
        return None
    ours = wider.ours()  # run only once a tensor is shown too ill-conditioned
    if ours is None or name not in ours:
        return None
    return _err(ours[name], exact), GATE_K[WIDER] * e_wider + TOLERANCE[WIDER]
