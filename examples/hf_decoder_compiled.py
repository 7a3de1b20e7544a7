"""Audit a Hugging Face GPT-2 trained under torch.compile, let gpushape fix it, audit again; on a
GPU, also time the compiled training steps side by side.

    python examples/hf_decoder_compiled.py [--gpu h200] [--batch 32] [--seq 1024] [--layers 12]
                                           [--no-cache] [--measure]

The model is the user's own object (here built from its config, as `from_pretrained` would give
it), trained with its own loss (`labels=`). gpushape audits it for torch.compile, on the meta
device when the model is (no weights, no GPU): what Inductor already does (padding the 50257-wide
vocabulary GEMM, fusing the loss) is not advised again. What is left is what transformers does
in a training step: with the default `use_cache=True` every layer copies its keys and values
into a cache nobody reads (kv-cache-in-training); with `--no-cache` (use_cache=False, as many
training scripts set), transformers checks the position ids for packed sequences, cannot while
dynamo traces, and builds a full causal mask, so attention leaves its flash kernel
(materialized-attention-mask). `gpushape.optimize` audits, applies the fixes (no-kv-cache,
skip-attention-mask), checks the rewritten model's outputs and gradients against the
original's where it has weights (with --measure, on the GPU), and audits again. With
--measure on a CUDA machine, the original and the optimized model are compiled and their
training steps (fused AdamW) timed alternately.
"""

from __future__ import annotations

import argparse
import copy

import torch

import gpushape
from gpushape.bench import compare


def build(layers: int, seq: int, use_cache: bool, device: str) -> torch.nn.Module:
    import transformers

    config = transformers.GPT2Config(n_layer=layers, n_positions=max(seq, 1024))
    config.use_cache = use_cache
    config._attn_implementation = "sdpa"
    with torch.device(device):
        return transformers.GPT2LMHeadModel(config).to(torch.bfloat16)


def show(title: str, report, step_s: float) -> None:
    print(
        f"{title}: predicted step {step_s * 1e3:.2f} ms ({report.step.gpu_s * 1e3:.2f} on the GPU)"
    )
    worth = [f for f in report.findings if f.severity.label != "info" and f.est_saving_s]
    for f in worth:
        wall = f.evidence.get("wall_saving_s", f.est_saving_s)
        print(f"  {f.severity.label:6} {f.rule:30} saves {wall * 1e3:7.3f} ms  fix: {f.fix}")
    if not worth:
        print("  nothing left worth a change")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu", default="h200")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--no-cache", action="store_true", help="configure use_cache=False")
    p.add_argument("--measure", action="store_true", help="time both compiled steps (CUDA)")
    args = p.parse_args(argv)
    measure = args.measure and torch.cuda.is_available()
    device = "cuda" if measure else "meta"
    model = build(args.layers, args.seq, not args.no_cache, device).train()
    ids = torch.zeros(args.batch, args.seq, dtype=torch.int64, device=device)
    original = copy.deepcopy(model) if measure else None

    model, report = gpushape.optimize(model, (ids,), gpu=args.gpu, mode="compile")
    show("as given, compiled", report.before, report.step_before_s)
    for change in report.applied:
        print(f"  applied {change.transform}: {change.detail}")
    for refusal in report.refused + report.rolled_back:
        print(f"  not applied {refusal.transform}: {refusal.reason}")
    show("optimized, compiled", report.after, report.step_after_s)

    if measure:
        steps = {}
        for name, m in (("as given", original), ("optimized", model)):
            opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
            compiled = torch.compile(m)

            def step(compiled=compiled, opt=opt):
                compiled(ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            for _ in range(3):  # compile and warm up
                step()
            steps[name] = step
        timings = compare(steps, rounds=5, repeats_per_round=5)
        for name, timing in timings.items():
            print(f"measured {name}: {timing.median_s * 1e3:.2f} ms a step (median)")
    elif args.measure:
        print("--measure needs a CUDA GPU: skipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
