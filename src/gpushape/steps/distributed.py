"""Several GPUs: `gpushape bench MODEL --nproc N` times the training step under
DistributedDataParallel (NCCL) against one GPU alone, in the same run: how well it scales.

`launch()` re-runs the command under torchrun (`python -m torch.distributed.run --standalone`)
without --nproc and with the hidden `--ddp-worker`; each worker builds the model on
`cuda:LOCAL_RANK` and calls `ddp_bench()`. Several hosts: run torchrun on every host with its
rendezvous flags and the worker command (docs/bench.md), e.g.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST0:29500 \\
        --rdzv-id bench1 -m gpushape bench resnet50 --ddp-worker --csv ddp.csv

Every rank holds a copy of the model for the plain step (a GPU alone) and one for each step
under DDP (gradients all-reduced in buckets of `bucket_mb` during the backward,
`gradient_as_bucket_view` so they are not copied into the buckets): one bucket size, or with
`bucket_mb=None` ("auto") each of BUCKET_SWEEP, the fastest kept. They alternate in rounds,
every block started on all ranks at once (a barrier), each rank on its own batch (seeded by
its rank). Rank 0 reports the DDP step (the slowest rank's median: every step waits for the
last all-reduce), total
samples/s = N x batch / that step, scaling efficiency = the step alone (every rank's blocks
pooled) / the DDP step = total samples/s over N GPUs alone, and the gradient bytes all-reduced
per step (halved for fp32 weights by bf16 compression, which pays only where the all-reduce
is link-bound). Without CUDA the workers use gloo on the CPU: plumbing, not a measurement.
"""

from __future__ import annotations

import copy
import gc
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..bench import environment
from ..errors import GpushapeError
from .batch import synthetic_batch
from .measure import StepStats, time_blocks, warm
from .run import BenchResult, _shapes
from .step import build_step

WORKER_FLAG = "--ddp-worker"
COMMAND_VAR = "GPUSHAPE_COMMAND"  # the user's command line, for the workers' CSV rows
ERROR_PREFIXES = ("gpushape: error:", "gpushape: internal error:")
BUCKET_SWEEP = (10.0, 25.0, 50.0, 100.0)  # MB: "auto" times DDP with each, keeps the fastest
LINK_BOUND = "bf16 compression halves the bytes all-reduced: it pays only where the all-reduce \
is link-bound (PCIe, Ethernet between hosts), not over NVLink"


def worker_argv(argv: list[str]) -> list[str]:
    """The command a worker runs: `argv` without --nproc, with --ddp-worker."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc=") and arg != WORKER_FLAG:
            out.append(arg)
    return [*out, WORKER_FLAG]


def launch(argv: list[str], nproc: int) -> int:
    """Run `gpushape <argv>` as `nproc` DDP workers under torchrun on this host; its exit code.

    The workers' output streams through; after the first worker's error line the rest
    (torchrun's report of the failure, the other ranks' same line) is dropped, and the exit
    code is 2, as for any gpushape error."""
    if nproc < 1:
        raise GpushapeError(f"--nproc must be at least 1, got {nproc}")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command = [*torchrun, f"--nproc-per-node={nproc}", "-m", "gpushape", *worker_argv(argv)]
    sys.stdout.flush()
    sys.stderr.flush()
    with subprocess.Popen(
        command, env=_worker_env(argv, nproc), stderr=subprocess.PIPE, text=True, bufsize=1
    ) as proc:
        reported = _relay(proc.stderr)
        code = proc.wait()
    if code == 0:
        return 0
    if reported:
        return 2  # a worker's one error line is out already
    raise GpushapeError(f"torchrun exited with code {code}: a DDP worker failed (see above)")


def _worker_env(argv: list[str], nproc: int) -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # the workers import this very gpushape
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env[COMMAND_VAR] = shlex.join(["gpushape", *argv])
    return env


def _relay(lines) -> bool:
    """Copy the workers' stderr to ours up to the first error line; whether there was one."""
    for line in lines:
        if line.startswith(ERROR_PREFIXES):  # two ranks' lines written into one: the first
            again = min((i for p in ERROR_PREFIXES if (i := line.find(p, 1)) > 0), default=0)
            line = line[:again].rstrip("\n") + "\n" if again else line
        sys.stderr.write(line)
        sys.stderr.flush()
        if line.startswith(ERROR_PREFIXES):
            for _ in lines:  # drain, so that torchrun never blocks on a full pipe
                pass
            return True
    return False


def ranks() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment."""
    try:
        rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    except (KeyError, ValueError):
        raise GpushapeError(
            f"{WORKER_FLAG} runs as one rank under torchrun (RANK, WORLD_SIZE, LOCAL_RANK are "
            "not set); use --nproc N on one host, or torchrun on each (docs/bench.md)"
        ) from None
    return rank, world, local


def worker_device(device: str) -> str:
    """Where this rank builds its model: `cuda:LOCAL_RANK` (made current) for a CUDA run."""
    rank, _, local = ranks()
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return device
    if local >= torch.cuda.device_count():
        raise GpushapeError(
            f"rank {rank}: LOCAL_RANK {local}, but this host sees only "
            f"{torch.cuda.device_count()} GPU(s); lower --nproc-per-node"
        )
    torch.cuda.set_device(local)
    return f"cuda:{local}"


@dataclass
class DDPResult:
    """Every rank's step alone and under DDP; rank 0's view is the one reported."""

    model: str
    task: str
    batch_shapes: list[str]
    backend: str
    bucket_mb: float
    compress: str | None
    grad_bytes: int
    """Bytes of the trainable parameters' gradients, as the model holds them."""
    wire_bytes: int
    """Bytes all-reduced per step: grad_bytes, or 2 per value with bf16 compression."""
    single: list[StepStats]
    ddp: list[StepStats]
    rank: int = 0
    env: dict[str, Any] = field(default_factory=environment)
    sweep: dict[float, list[StepStats]] = field(default_factory=dict)
    """With bucket size "auto": every size timed (MB -> each rank's DDP step); `bucket_mb`
    and `ddp` are the fastest's."""

    def __post_init__(self) -> None:
        self.env["command"] = os.environ.get(COMMAND_VAR) or self.env.get("command")

    @property
    def world(self) -> int:
        return len(self.ddp)

    @property
    def name(self) -> str:
        return f"ddp x{self.world}"

    @property
    def alone(self) -> StepStats:
        """One GPU alone: every rank's blocks of the plain step, pooled."""
        times = tuple(t for s in self.single for t in s.step_times_s)
        warmup = max(s.warmup_s for s in self.single)
        return replace(self.single[0], variant="alone", step_times_s=times, warmup_s=warmup)

    @property
    def total(self) -> StepStats:
        """The slowest rank's DDP step, with the samples of all ranks."""
        slowest = max(self.ddp, key=lambda s: s.median_s)
        n = self.world
        return replace(
            slowest, variant=self.name, samples=slowest.samples * n, tokens=slowest.tokens * n
        )

    @property
    def efficiency(self) -> float:
        return self.alone.median_s / self.total.median_s

    def sweep_efficiency(self) -> dict[float, float]:
        """Each bucket size's scaling efficiency (the slowest rank's DDP step at that size)."""
        alone = self.alone.median_s
        return {mb: alone / max(s.median_s for s in per_rank)
                for mb, per_rank in self.sweep.items()}  # fmt: skip

    def notes(self) -> list[str]:
        sent = f"{_size(self.wire_bytes)} all-reduced per step"
        if self.wire_bytes != self.grad_bytes:
            sent += f" as bf16 ({_size(self.grad_bytes)} of gradients)"
        out = [f"{self.backend}, buckets of {self.bucket_mb:g} MB: {sent}"]
        if len(self.sweep) > 1:
            tried = ", ".join(f"{mb:g} MB {e:.1%}" for mb, e in self.sweep_efficiency().items())
            out.append(f"bucket size tuned: the fastest of {tried}")
        if self.compress and self.wire_bytes == self.grad_bytes:
            out.append("bf16 compression changes nothing here: the gradients are 16-bit already")
        elif self.compress:
            out.append(LINK_BOUND)
        if self.backend == "gloo":
            out.append("gloo on the CPU: checks the plumbing, says nothing about GPUs")
        return out

    def as_bench(self) -> BenchResult:
        """As `bench()`'s result, for its CSV rows and JSON: the DDP row's samples/s are all
        ranks', its `speedup_vs_baseline` (step alone / DDP step) the scaling efficiency."""
        eff = f"scaling efficiency {self.efficiency:.1%} (speedup_vs_baseline), {self.world} ranks"
        stats = {"alone": self.alone, self.name: self.total}
        alone = ["no DDP, one rank's batch, every rank's blocks pooled"]
        notes = {"alone": alone, self.name: [eff, *self.notes()]}
        return BenchResult(
            self.model, "alone", self.task, self.batch_shapes, stats, notes, env=self.env
        )

    def to_dict(self) -> dict[str, Any]:
        keys = ("world", "backend", "bucket_mb", "compress", "grad_bytes", "wire_bytes")
        ranks = [{"alone": s.to_dict(), "ddp": d.to_dict()} for s, d in zip(self.single, self.ddp)]
        sweep = {f"{mb:g}": e for mb, e in self.sweep_efficiency().items()}
        return {**self.as_bench().to_dict(), **{k: getattr(self, k) for k in keys},
                "scaling_efficiency": self.efficiency, "bucket_sweep": sweep,
                "ranks": ranks}  # fmt: skip


def ddp_bench(
    model: torch.nn.Module,
    example_inputs: Any,
    *,
    bucket_mb: float | None = None,
    compress: str | None = None,
    rounds: int = 5,
    block: int = 10,
    warmup: int = 3,
    optimizer: str = "auto",
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> DDPResult:
    """In each torchrun worker: the step alone and under DDP, alternated; every rank's result.
    `bucket_mb` None: DDP timed at each size of BUCKET_SWEEP, the fastest reported."""
    buckets = BUCKET_SWEEP if bucket_mb is None else (float(bucket_mb),)
    if compress not in (None, "bf16"):
        raise GpushapeError(f"unknown DDP compression {compress!r}: none or bf16")
    rank, world, local = ranks()
    say = (progress or (lambda _: None)) if rank == 0 else (lambda _: None)
    cuda = torch.cuda.is_available() and any(p.is_cuda for p in model.parameters())
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    try:
        say(f"DDP x{world} over {dist.get_backend()}: building and warming up")
        inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
        batch = synthetic_batch(model.to(device), inputs, seed=rank)
        steps = _steps(
            model, batch, cuda=cuda, buckets=buckets, compress=compress, optimizer=optimizer
        )
        warm_s = [warm(step, warmup, cuda=cuda) for step in steps]
        sizes = ", ".join(f"{mb:g}" for mb in buckets)
        say(f"timing alone and DDP (buckets of {sizes} MB) alternately: {rounds} rounds of "
            f"{block} steps")  # fmt: skip
        times = _alternate(steps, rounds=rounds, block=block, cuda=cuda)
        single, *per_bucket = _gather(times, warm_s, batch, device)
        del steps  # DDP's reducer goes before its process group does
        gc.collect()
        dist.barrier()  # no rank tears down while another still talks (gloo aborts then)
    finally:
        if own:
            dist.destroy_process_group()
    grads = [p for p in model.parameters() if p.requires_grad]
    nbytes = sum(p.numel() * p.element_size() for p in grads)
    wire = sum(p.numel() * (2 if compress else p.element_size()) for p in grads)
    backend = "nccl" if cuda else "gloo"
    model_name = name or type(model).__name__
    sweep = dict(zip(buckets, per_bucket, strict=True))
    best = min(sweep, key=lambda mb: max(s.median_s for s in sweep[mb]))
    return DDPResult(model_name, batch.task, _shapes(batch), backend, best, compress,
                     nbytes, wire, single, sweep[best], rank, sweep=sweep)  # fmt: skip


def _steps(
    model, batch, *, cuda: bool, buckets: tuple[float, ...], compress: str | None, optimizer: str
) -> list:
    """[the plain step, the DDP step at each bucket size], each on its own copy of `model`."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [torch.cuda.current_device()] if cuda else None
    steps = [build_step(copy.deepcopy(model), batch, optimizer)]
    for mb in buckets:
        wrapped = DistributedDataParallel(
            copy.deepcopy(model),
            device_ids=device_ids,
            bucket_cap_mb=mb,
            gradient_as_bucket_view=True,
        )
        if compress:
            wrapped.register_comm_hook(None, _bf16_hook(cuda))
        steps.append(build_step(wrapped, batch, optimizer))
    return steps


def _gather(times: list[list[float]], warm_s: list[float], batch, device) -> tuple[list, ...]:
    """Every rank's StepStats for each step (alone, then DDP at each bucket size), gathered on
    every rank: one list per step, a StepStats per rank."""
    mine = torch.tensor(
        [[*t, w] for t, w in zip(times, warm_s, strict=True)], dtype=torch.float64, device=device
    )
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    rows = [part.cpu().tolist() for part in parts]
    return tuple(
        [StepStats(variant="alone" if i == 0 else "ddp", step_times_s=tuple(r[i][:-1]),
                   warmup_s=r[i][-1], samples=batch.samples, tokens=batch.tokens) for r in rows]
        for i in range(len(times))
    )  # fmt: skip


def _bf16_hook(cuda: bool):
    """PyTorch's bf16_compress_hook. DDP refuses it by its name without NCCL, though gloo
    all-reduces bf16 as well: on the CPU (the tests' gloo) it goes in under another name."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    if cuda:
        return bf16_compress_hook

    def gloo_bf16(state, bucket):  # no annotations: DDP would compare them, as strings here
        return bf16_compress_hook(state, bucket)

    return gloo_bf16


def _alternate(steps: list, *, rounds: int, block: int, cuda: bool) -> list[list[float]]:
    """Seconds per step, one value per block, each block started on every rank at once."""
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for i, step in enumerate(steps):
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            times[i] += time_blocks({"s": step}, rounds=1, block=block, cuda=cuda)["s"]
    return times


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def ddp_table(result: DDPResult, console: Console) -> None:
    """Each rank alone and under DDP, all of them, the scaling efficiency, the notes."""
    n, alone, total = result.world, result.alone, result.total
    title = (
        f"{result.model}: DDP x{n} against the step alone, "
        f"{' '.join(result.batch_shapes)} per rank ({result.task})"
    )
    table = Table(title=escape(title), title_justify="left")
    for col in ("rank", "alone ms", "DDP ms", "DDP p10-p90", "alone samples/s", "DDP samples/s"):
        table.add_column(col, justify="left" if col == "rank" else "right")
    rows = [
        (str(r), s, s.samples_per_s, d) for r, (s, d) in enumerate(zip(result.single, result.ddp))
    ]
    rows.append((f"all {n}", alone, n * alone.samples_per_s, total))
    for label, s, rate, d in rows:
        spread = f"{d.quantile(0.1) * 1e3:,.2f}-{d.quantile(0.9) * 1e3:,.2f}"
        cells = (s.median_s * 1e3, d.median_s * 1e3, spread, rate, d.samples_per_s)
        table.add_row(label, *(c if isinstance(c, str) else f"{c:,.2f}" for c in cells))
    console.print(table)
    console.print(
        f"scaling efficiency {result.efficiency:.1%}: {total.samples_per_s:,.1f} samples/s on "
        f"{n} rank(s) against {n} x {alone.samples_per_s:,.1f} alone (the slowest rank's DDP "
        f"step, {total.median_s * 1e3:,.2f} ms, against {alone.median_s * 1e3:,.2f} ms alone)"
    )
    for note in result.notes():
        console.print(escape(note))
