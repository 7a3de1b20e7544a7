"""fast-max-pool: `nn.MaxPool2d` becomes gpushape's MaxPool2d, the same function whose backward
reads a 1-byte window position instead of PyTorch's int64 index (kernels/pooling/).

Matched by type: exactly `torch.nn.MaxPool2d` (a subclass may change what it computes), with
settings the kernel takes (dilation 1, no ceil_mode, no return_indices, at most 127 taps:
`MaxPool2d.from_torch` says which one it does not), wherever the model holds it. The output
equals PyTorch's bit for bit, ties and NaN included (a tie goes to the first maximum in the
window, as PyTorch's kernels do), and so do the gradients. Refused: a module with hooks (they
would no longer run) and the settings above. No parameters or buffers: the state_dict is
untouched; undo puts the original module back. Under torch.compile it pays too: the kernel is a
custom op Inductor calls as it is, and at ResNet-50's stem it took 0.73 ms forward and
backward against 1.81 for Inductor's own max-pool kernels (`bench_max_pool.json`, H200).
"""

from __future__ import annotations

from torch import nn

from ..kernels import MaxPool2d
from ._core import Outcome, TransformContext, register_transform, swap_each

ID = "fast-max-pool"


def _build(module: nn.Module) -> tuple[nn.Module, str]:
    new = MaxPool2d.from_torch(module)  # ValueError: a setting the kernel lacks
    return new, f"{module!r} -> gpushape {new!r}: int8 window positions for backward"


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    return swap_each(model, ctx, ID, lambda m: type(m) is nn.MaxPool2d, _build)
