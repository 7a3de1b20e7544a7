"""A pre-norm transformer MLP block on a gpushape fused kernel, timed eagerly and from a CUDA graph.

    python examples/fused_block.py [--width 4096] [--tokens 16384] [--steps 20]

The block takes the running residual stream `r` and the previous sublayer's output `x` and
returns `(fc2(gelu(fc1(norm(x + r)))), x + r)`, written twice: with PyTorch's modules, and with
gpushape's AddLayerNorm, which fuses the residual add into the norm and returns both the
normalised tensor and the new residual stream. Both start from the same weights (the same
state_dict layout) and are checked against each other first. On a GPU each training step
(forward and backward) is then timed as plain eager calls and replayed from a CUDA graph
(`torch.cuda.make_graphed_callables`). On a machine without CUDA the example runs the eager
steps on the CPU (PyTorch reference path).

What to expect: the fused add+norm saves memory traffic, not FLOPs, so in a block dominated by
its GEMMs the saving is a few percent of the step. On an H200 (bf16, width 4096, 16384 tokens,
2026-11-30, benchmarks/results/examples-h200/fused_block.log) one step took 21.0 ms with
PyTorch's modules and 20.7 ms with AddLayerNorm, and 21.4 / 21.7 ms replayed from CUDA graphs:
differences within the run-to-run spread. The kernels' own speed-ups are measured in
benchmarks/kernels/ (docs/results-h200.md); graphs matter where steps are small and the
host's per-op cost in eager mode decides.
"""

from __future__ import annotations

import argparse
import copy

import torch
from torch import nn

from gpushape.bench import compare
from gpushape.kernels import AddLayerNorm


class TorchBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x, residual):
        s = x + residual
        return self.fc2(nn.functional.gelu(self.fc1(self.norm(s)))), s


class FusedBlock(TorchBlock):
    """TorchBlock with the add and the norm in one kernel (same parameters and state_dict)."""

    def __init__(self, width: int) -> None:
        super().__init__(width)
        self.norm = AddLayerNorm(width)

    def forward(self, x, residual):
        y, s = self.norm(x, residual)  # (norm(x + residual), x + residual)
        return self.fc2(nn.functional.gelu(self.fc1(y))), s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=20, help="timed steps a round")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    torch.manual_seed(0)
    ref = TorchBlock(args.width).to(device, dtype)
    fused = FusedBlock(args.width).to(device, dtype)
    fused.load_state_dict(ref.state_dict())  # same parameters, same checkpoint layout
    x = torch.randn(args.tokens, args.width, device=device, dtype=dtype, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True)

    (y_ref, s_ref), (y_fused, s_fused) = ref(x, r), fused(x, r)
    scale = y_ref.float().abs().max().item()
    err = (y_ref.float() - y_fused.float()).abs().max().item() / scale
    print(f"fused block against PyTorch's: max relative difference {err:.2e} ({dtype})")
    torch.testing.assert_close(s_fused, s_ref)
    del y_ref, s_ref, y_fused, s_fused  # their autograd graphs hold x's and r's grad nodes

    grads = (torch.randn_like(x), torch.randn_like(x))

    def step(block, x, r):
        def run():
            y, s = block(x, r)
            torch.autograd.grad((y, s), [x, r, *block.parameters()], grads, allow_unused=True)

        return run

    runs = {"torch eager": step(ref, x, r), "gpushape eager": step(fused, x, r)}
    if cuda:
        for name, block in (("torch graph", ref), ("gpushape graph", fused)):
            # make_graphed_callables replaces the module's forward: graph a copy; and give it
            # inputs of its own (a leaf's gradient node is created on the stream first used)
            xg, rg = (t.detach().clone().requires_grad_() for t in (x, r))
            graphed = torch.cuda.make_graphed_callables(copy.deepcopy(block), (xg, rg))
            runs[name] = step(graphed, xg, rg)
    timings = compare(runs, rounds=3, repeats_per_round=args.steps, warmup=2)
    base = timings["torch eager"].median_s
    for name, t in timings.items():
        print(
            f"{name:16s} {t.median_s * 1e3:8.3f} ms a training step  "
            f"({base / t.median_s:.2f}x torch eager)"
        )
    if not cuda:
        print("(no CUDA device: CPU reference path; the kernels and the graphs need a GPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
