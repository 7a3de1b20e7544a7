"""`CUDAPrefetcher`: batches copied to the GPU on a side stream while the previous step runs.

A training loop that does `x = x.to("cuda")` copies from pageable memory on the compute stream:
the copy is staged through a driver buffer and the GPU waits for it every step. The prefetcher
instead pins each batch (unless the DataLoader already did), issues the copy with
`non_blocking=True` on its own CUDA stream `depth` batches ahead, and hands a batch out only
after the consumer's current stream has been told to wait on the copy's event. Each handed-out
tensor is `record_stream`-ed on the consumer stream, so the caching allocator does not give its
memory to another allocation until the consumer's queued work on it has run. Optional GPU-side
transforms (`GPUTransform`: cast, resize, normalize, channels_last) run on the side stream too.

Without CUDA (or with `device="cpu"`) it is a pass-through: the source's batch objects come out
as they went in (the same objects), after the transform and channels_last when those are given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ._tree import iter_tensors, map_tensors
from .errors import DataPipelineError, NotIterableError
from .gpu_transforms import to_channels_last

Transform = Callable[[Any], Any]


@dataclass
class _InFlight:
    """A batch whose copy (and transform) is queued on the side stream, done when `event` is."""

    batch: Any
    event: torch.cuda.Event


@dataclass
class _Failed:
    """The source (or the copy) raised here; re-raised when this batch's turn comes."""

    error: Exception


class CUDAPrefetcher:
    """Iterate over `iterable`'s batches, each already on `device`, copied `depth` batches ahead.

    Batches may be tensors or any nesting of tuples, lists and dicts; non-tensor leaves pass
    through. `transform(batch)` runs on the GPU after the copy (a `GPUTransform` or any function
    of the batch); `channels_last=True` converts every 4-D tensor afterwards. An exception from
    the source reaches the caller when the batch it replaced would have been handed out, after
    every earlier batch. `len()` is the source's; every `iter()` starts the source over.
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        device: str | torch.device = "cuda",
        transform: Transform | None = None,
        channels_last: bool = False,
        depth: int = 2,
    ) -> None:
        if not (hasattr(type(iterable), "__iter__") or hasattr(type(iterable), "__getitem__")):
            raise NotIterableError(
                f"CUDAPrefetcher needs an iterable of batches (a DataLoader, list, generator), "
                f"got {type(iterable).__name__}"
            )
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise DataPipelineError(f"depth must be an integer >= 1 (batches ahead), got {depth!r}")
        if transform is not None and not callable(transform):
            raise DataPipelineError(
                f"transform must be callable on a batch, got {type(transform).__name__}"
            )
        self.iterable = iterable
        self.device = _check_device(device)
        self.transform = transform
        self.channels_last = bool(channels_last)
        self.depth = depth
        self._stream: torch.cuda.Stream | None = None

    @property
    def active(self) -> bool:
        """True when batches are copied on a side CUDA stream; False for the pass-through."""
        return self.device.type == "cuda"

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]  # TypeError when the source has none

    def __iter__(self) -> Iterator[Any]:
        return self._prefetch() if self.active else self._passthrough()

    def __repr__(self) -> str:
        return (
            f"CUDAPrefetcher(device={self.device}, depth={self.depth}, "
            f"transform={self.transform!r}, channels_last={self.channels_last})"
        )

    def _finish(self, batch: Any) -> Any:
        """The transform, then channels_last: on the side stream, or on the CPU when inactive."""
        if self.transform is not None:
            batch = self.transform(batch)
        if self.channels_last:
            batch = map_tensors(to_channels_last, batch)
        return batch

    def _passthrough(self) -> Iterator[Any]:
        for batch in self.iterable:
            yield self._finish(batch)

    def _prefetch(self) -> Iterator[Any]:
        queue = _Queue(iter(self.iterable), self.depth, self._enqueue)
        while queue.fill():
            item = queue.pending.popleft()
            queue.fill()  # queue the next copy before this batch's step is launched
            if isinstance(item, _Failed):
                raise item.error
            batch = self._hand_out(item)
            del item
            yield batch
            del batch  # let its memory go before the next copy is queued

    def _side_stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        return self._stream

    def _enqueue(self, batch: Any) -> _InFlight:
        """Pin, copy and transform `batch` on the side stream; record the event that ends it."""
        stream = self._side_stream()
        if any(t.is_cuda for t in iter_tensors(batch)):  # produced on the GPU: wait for it
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            moved = self._finish(map_tensors(self._copy, batch))
            event = torch.cuda.Event()
            event.record(stream)
        return _InFlight(moved, event)

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def _hand_out(self, item: _InFlight) -> Any:
        """Make the consumer's stream wait for the copy, and keep the allocator off its memory."""
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(item.event)
        for tensor in iter_tensors(item.batch):
            if tensor.device == self.device:
                tensor.record_stream(consumer)
        return item.batch


class _Queue:
    """The batches in flight: pulled from the source in order, stopped by its end or an error."""

    def __init__(self, source: Iterator[Any], depth: int, enqueue: Callable[[Any], _InFlight]):
        self.source = source
        self.depth = depth
        self.enqueue = enqueue
        self.pending: deque[_InFlight | _Failed] = deque()
        self.done = False

    def fill(self) -> bool:
        """Queue batches until `depth` are pending or the source is done; True while any is."""
        while not self.done and len(self.pending) < self.depth:
            try:
                batch = next(self.source)
            except StopIteration:
                self.done = True
                break
            except Exception as error:  # the caller gets it in order, after the batches before
                self.pending.append(_Failed(error))
                self.done = True
                break
            try:
                self.pending.append(self.enqueue(batch))
            except Exception as error:  # a failed copy or transform, also in order
                self.pending.append(_Failed(error))
                self.done = True
        return bool(self.pending)


def _check_device(device: str | torch.device) -> torch.device:
    """A CUDA device with its index when CUDA is available; `cpu` (the pass-through) otherwise."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise DataPipelineError(f"device must be 'cuda', 'cuda:N' or 'cpu', got {device!r}") from (
            error
        )
    if device.type not in ("cuda", "cpu"):
        raise DataPipelineError(f"device must be 'cuda', 'cuda:N' or 'cpu', got {str(device)!r}")
    if device.type == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    index = torch.cuda.current_device() if device.index is None else device.index
    return torch.device("cuda", index)
