"""What does torch.compile's mode="reduce-overhead" copy each step? A model's compiled training
step replayed from CUDA graphs (the `compile-graphs` variant of `gpushape bench`, fused AdamW),
profiled over three steps: the device copies and memsets a step, and the CPU ops that made
them. Run with TORCH_LOGS=cudagraphs to see each graph's recorded inputs.

    TORCH_LOGS=cudagraphs python benchmarks/steps/graph_copies.py > graph_copies.log

On an H100 (benchmarks/results/bench-h100/graph_copies.log) the Hugging Face LLaMA-style
decoder's step copied 18 tensors into the graphs' static inputs, 420 us a step, by
`aten::_foreach_copy_` (its backward graph takes the logits' gradient, 8x1024x32000 bf16,
made outside the graphs); timm's ViT-B/16 copied its images only (40 us).
"""

import collections
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.models import resolve_model
from gpushape.steps import synthetic_batch
from gpushape.steps.variants import Spec, build_variant

L = (
    "hf:llama?hidden_size=1024&intermediate_size=2816&num_hidden_layers=8"
    "&num_attention_heads=16&num_key_value_heads=4&vocab_size=32000"
)
for m in [L, "timm:vit_base_patch16_224"]:
    r = resolve_model(m, dtype=torch.bfloat16, device="cuda")
    batch = synthetic_batch(r.model, r.example_inputs)
    v = build_variant(
        "compile-graphs", r.model, batch, optimizer="adamw-fused", spec=Spec.of("compile-graphs")
    )
    for _ in range(6):
        v.run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            v.run()
        torch.cuda.synchronize()
    dev = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.name.startswith(("Memcpy", "Memset")):
            dev[e.name][0] += 1
            dev[e.name][1] += e.device_time
    print("==", m[:30], "params", sum(p.numel() for p in r.model.parameters()))
    for k, (n, t) in sorted(dev.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:40} {n / 3:8.1f} a step {t / 3:9.1f} us a step")
    rows = [
        a
        for a in prof.key_averages()
        if "copy" in a.key or "Memcpy" in a.key or "cudagraph" in a.key.lower()
    ]
    for a in sorted(rows, key=lambda a: -a.device_time_total)[:10]:
        print(
            f"  cpu-op {a.key[:60]:60} calls {a.count / 3:7.1f} "
            f"dev {a.device_time_total / 3:9.1f} us"
        )
    del v
    torch.cuda.empty_cache()
