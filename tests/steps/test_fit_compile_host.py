"""benchmarks/steps/fit_compile_host.py on the CPU: which committed compile-mode loops of
another GPU kind it fits the host's cost per compiled kernel on, and at which batch."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "steps"))
import fit_compile_host as fch


def test_another_gpus_compile_loops_are_found_at_the_batch_their_command_gave():
    runs = {name: (stage, model, batch) for name, stage, model, batch in fch.discovered("h100")}
    assert runs["loops-h100-14/loop-resnet50-compile.json"] == (
        "as given", "torchvision.models:resnet50", "256x3x224x224")  # fmt: skip
    assert runs["loops-h100-15/loop-hf_bert-compile.json"][1:] == ("hf:bert", 32)
    assert runs["loops-h100-20/loop-hf_gpt2-compile.json"][1:] == ("hf:gpt2", None)
    assert not any("eager" in name for name in runs)
    assert fch.discovered("no-such-gpu") == ()
