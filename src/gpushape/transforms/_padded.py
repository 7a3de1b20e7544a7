"""The padded modules `pad-channels` puts in place: nn.Linear, nn.Conv2d and nn.Embedding whose
parameters have zero rows past the original size, whose output is sliced back, and whose
state_dict keeps the original shapes both ways (see pad_channels.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _Padded:
    """Parameters whose first dimension is padded past `logical_rows`; the state_dict keeps
    the logical shape."""

    padded_names: tuple[str, ...] = ("weight", "bias")

    @property
    def logical_rows(self) -> int:
        raise NotImplementedError

    @property
    def padded_rows(self) -> int:
        return self.weight.shape[0]

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        rows = self.logical_rows
        for name in self.padded_names:
            t = destination.get(prefix + name)
            if t is not None and t.dim() and t.shape[0] > rows:
                destination[prefix + name] = t.narrow(0, 0, rows)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        for name in self.padded_names:
            t, p = state_dict.get(prefix + name), getattr(self, name, None)
            if _is_logical(t, p, self.logical_rows):
                state_dict[prefix + name] = pad_rows(t, p.shape[0])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, padded_to={self.padded_rows}"


class PaddedLinear(_Padded, nn.Linear):
    """nn.Linear with zero rows past `out_features`; its output is sliced back to them."""

    @property
    def logical_rows(self) -> int:
        return self.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)[..., : self.out_features]


class PaddedConv2d(_Padded, nn.Conv2d):
    """nn.Conv2d with zero filters past `out_channels`; its output is sliced back to them."""

    @property
    def logical_rows(self) -> int:
        return self.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.weight, self.bias).narrow(-3, 0, self.out_channels)


class PaddedEmbedding(_Padded, nn.Embedding):
    """nn.Embedding sharing a PaddedLinear's weight: rows past `num_embeddings` are never read."""

    padded_names = ("weight",)

    @property
    def logical_rows(self) -> int:
        return self.num_embeddings


def _is_logical(t, p, rows: int) -> bool:
    """Whether a loaded `t` is padded Parameter `p` in its original (unpadded) shape."""
    if not isinstance(t, torch.Tensor) or p is None or t.dim() != p.dim():
        return False
    return t.shape[0] == rows and t.shape[1:] == p.shape[1:]


PADDED = {nn.Linear: PaddedLinear, nn.Conv2d: PaddedConv2d, nn.Embedding: PaddedEmbedding}


def pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with zero rows appended along dimension 0 up to `rows` (its memory format kept)."""
    out = t.new_zeros((rows, *t.shape[1:]))
    if (
        t.dim() == 4
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
    ):
        out = out.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        out[: t.shape[0]].copy_(t.detach())
    return out
