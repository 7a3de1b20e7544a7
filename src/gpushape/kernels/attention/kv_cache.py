"""KVCache: preallocated key/value buffers for decoding, appended in place.

    cache = KVCache(batch=8, num_heads=32, max_len=4096, head_dim=128,
                    dtype=torch.bfloat16, device="cuda")
    k_all, v_all = cache.append(k, v)        # k, v (B, H, t, D); views over [:length]

Two ways to append; use one of them per cache between resets:

- `append(k, v)` (eager): writes the new steps into the buffers with one copy per tensor, cost
  O(t) whatever the length already cached (torch.cat would copy the whole cache every step),
  and returns views over the filled part. The length is a Python int, so appending past
  max_len raises ValueError. Not for CUDA graphs: the returned shape changes every step.
- `append_static(k, v)` (CUDA-graph safe): the write position is a device tensor, advanced on
  the device, so a captured step replays correctly with no host sync. It returns the full
  (B, H, max_len, D) buffers; `attention_mask(t)` gives the (t, max_len) bool mask of the
  positions the t new queries may attend to (causal within the new steps). Steps past max_len
  cannot raise without a sync: they land in one spare slot past the end that is never
  returned, and `overflowed` (a device bool) records it; `check()` syncs and raises.
"""

from __future__ import annotations

import torch
from torch import nn

from .._dispatch import check_same_device

__all__ = ["KVCache"]


class KVCache(nn.Module):
    """Preallocated (B, H, max_len, D) key and value buffers (non-persistent module buffers)."""

    def __init__(
        self,
        batch: int,
        num_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("batch", batch),
            ("num_heads", num_heads),
            ("max_len", max_len),
            ("head_dim", head_dim),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}")
        if not dtype.is_floating_point:
            raise TypeError(f"KVCache: dtype must be a floating dtype, got {dtype}")
        self.batch, self.num_heads = batch, num_heads
        self.max_len, self.head_dim = max_len, head_dim
        # one spare slot past max_len takes the static API's overflowing writes
        shape = (batch, num_heads, max_len + 1, head_dim)
        self.register_buffer(
            "k_buffer", torch.zeros(shape, dtype=dtype, device=device), persistent=False
        )
        self.register_buffer(
            "v_buffer", torch.zeros(shape, dtype=dtype, device=device), persistent=False
        )
        self.register_buffer(
            "position", torch.zeros((), dtype=torch.int64, device=device), persistent=False
        )
        self.register_buffer(
            "overflowed", torch.zeros((), dtype=torch.bool, device=device), persistent=False
        )
        self.register_buffer("_steps", torch.arange(max_len, device=device), persistent=False)
        self.length = 0  # filled steps, for the eager API

    @property
    def k_cache(self) -> torch.Tensor:
        """(B, H, max_len, D) view of the key buffer."""
        return self.k_buffer[:, :, : self.max_len]

    @property
    def v_cache(self) -> torch.Tensor:
        """(B, H, max_len, D) view of the value buffer."""
        return self.v_buffer[:, :, : self.max_len]

    def _check_step(self, k: torch.Tensor, v: torch.Tensor) -> int:
        """Number of new steps t, after checking k and v against the cache."""
        check_same_device("KVCache.append", k=k, v=v, cache=self.k_buffer)
        expected = (self.batch, self.num_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != expected:
                raise ValueError(
                    f"KVCache.append: {name} must have shape (batch={self.batch}, "
                    f"heads={self.num_heads}, steps, head_dim={self.head_dim}), "
                    f"got {tuple(t.shape)}"
                )
            if t.dtype != self.k_buffer.dtype:
                raise TypeError(
                    f"KVCache.append: {name} is {t.dtype}, the cache holds {self.k_buffer.dtype}"
                )
        if k.shape[2] != v.shape[2] or k.shape[2] < 1:
            raise ValueError(
                f"KVCache.append: k and v need the same number (>= 1) of steps, "
                f"got {k.shape[2]} and {v.shape[2]}"
            )
        return k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write t new steps at the current length; return (B, H, length, D) views of k and v."""
        steps = self._check_step(k, v)
        start, end = self.length, self.length + steps
        if end > self.max_len:
            raise ValueError(
                f"KVCache is full: length {start} + {steps} new steps > max_len "
                f"{self.max_len}; allocate a larger cache or call reset()"
            )
        self.k_buffer[:, :, start:end].copy_(k)  # O(steps), never O(length)
        self.v_buffer[:, :, start:end].copy_(v)
        self.length = end
        return self.k_buffer[:, :, :end], self.v_buffer[:, :, :end]

    def append_static(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Graph-safe append at the device position; returns the full (B, H, max_len, D) views.

        Writes past max_len go to the spare slot and set `overflowed` (see `check()`)."""
        steps = self._check_step(k, v)
        slots = (self.position + self._steps[:steps]).clamp_(max=self.max_len)  # (t,)
        self.k_buffer.index_copy_(2, slots, k)
        self.v_buffer.index_copy_(2, slots, v)
        self.overflowed |= self.position + steps > self.max_len
        self.position += steps
        return self.k_cache, self.v_cache

    def attention_mask(self, num_queries: int) -> torch.Tensor:
        """(num_queries, max_len) bool, True where query i of the last append_static may attend:
        cached positions and the new steps up to its own (causal). Device ops only."""
        first = self.position - num_queries  # absolute position of the first new query
        query_pos = first + self._steps[:num_queries, None]  # (t, 1)
        return self._steps[None, :] <= query_pos  # (t, max_len)

    def check(self) -> None:
        """Raise if a static append ran past max_len (synchronises with the device)."""
        if bool(self.overflowed):
            raise ValueError(
                f"KVCache overflowed: append_static wrote past max_len "
                f"{self.max_len} (position {int(self.position)}); those steps were "
                "dropped"
            )

    def reset(self) -> None:
        """Forget the cached steps (buffers keep their memory; contents are not cleared)."""
        self.length = 0
        self.position.zero_()
        self.overflowed.zero_()

    def extra_repr(self) -> str:
        return (
            f"batch={self.batch}, num_heads={self.num_heads}, max_len={self.max_len}, "
            f"head_dim={self.head_dim}, dtype={self.k_buffer.dtype}"
        )
