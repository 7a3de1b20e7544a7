"""`gpushape audit`: table and JSON output, files, and bad input (exit 2, one line)."""

from __future__ import annotations

import itertools
import json
import textwrap

import pytest

from gpushape.cli.main import main
from gpushape.tracing import TraceError

FACTORIES = textwrap.dedent("""
    import torch
    from torch import nn


    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


    class Gate(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x  # reads a value: impossible on meta


    class NeedsValues(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.gate = Gate()

        def forward(self, x):
            return self.gate(self.fc(x))


    def tiny(batch=2):
        return Tiny(), (torch.randn(batch, 3, 8, 8),)


    def needs_values():
        return NeedsValues(), (torch.randn(2, 4),)


    def broken():
        raise RuntimeError("cannot build")
""")


@pytest.fixture
def factories(tmp_path):
    path = tmp_path / "nets.py"
    path.write_text(FACTORIES)
    return str(path)


# The keys and types of the audit JSON, schema 1 (docs/design.md, "The audit JSON").
TOP = {
    "schema": int,
    "model": str,
    "gpu": str,
    "dtype": str,
    "train": bool,
    "totals": dict,
    "layers": list,
    "findings": list,
}
TOTALS = {"flops": int, "min_bytes": int, "roofline_time_s": float, "ops": int}
LAYER = {
    "module": str,
    "op": str,
    "flops": int,
    "min_bytes": int,
    "intensity": float,
    "bound": str,
    "roofline_time_s": float,
    "tensor_cores": bool,
}


def _check_schema(doc: dict) -> None:
    for keys, obj in ((TOP, doc), (TOTALS, doc["totals"])):
        for key, kind in keys.items():
            assert isinstance(obj[key], kind), (key, obj.get(key))
    assert doc["schema"] == 1 and doc["layers"]
    for layer in doc["layers"]:
        for key, kind in LAYER.items():
            assert isinstance(layer[key], kind), (key, layer)
        assert layer["bound"] in ("compute", "memory")


def test_json_follows_schema_1(capsys):
    argv = ["audit", "resnet50", "--batch", "2", "--gpu", "h100", "--format", "json", "--train"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    _check_schema(doc)
    assert (doc["model"], doc["gpu"], doc["dtype"], doc["train"]) == (
        "resnet50",
        "h100-sxm",
        "bf16",
        True,
    )
    times = [layer["roofline_time_s"] for layer in doc["layers"]]
    assert times == sorted(times, reverse=True)
    assert sum(layer["flops"] for layer in doc["layers"]) == doc["totals"]["flops"]
    assert doc["totals"]["gemm_flops"] == pytest.approx(2 * 3 * 4.09e9 * 2, rel=0.03)  # b2 train
    ops = {layer["op"] for layer in doc["layers"] if layer["module"] == "layer1.0.conv2"}
    assert ops == {"aten.convolution.default", "aten.convolution_backward.default"}


def test_table_names_gpu_and_dtype_and_the_flop_convention(capsys, factories):
    assert main(["audit", f"{factories}:tiny", "--gpu", "a100", "--dtype", "tf32"]) == 0
    out = capsys.readouterr().out
    assert "A100" in out and "tf32" in out and "2 x MACs" in out
    for column in ("module", "op(s)", "GFLOP", "MB", "FLOP/B", "bound", "predicted ms", "share"):
        assert column in out
    assert "conv" in out and "fc" in out


def test_output_files(tmp_path, factories, capsys):
    out_json, out_txt = tmp_path / "a.json", tmp_path / "a.txt"
    assert main(["audit", f"{factories}:tiny", "--format", "json", "-o", str(out_json)]) == 0
    _check_schema(json.loads(out_json.read_text()))
    assert main(["audit", f"{factories}:tiny", "-o", str(out_txt)]) == 0
    assert "predicted ms" in out_txt.read_text()
    assert capsys.readouterr().out == ""


def test_input_replaces_the_example_inputs(capsys, factories):
    assert main(["audit", f"{factories}:tiny", "--input", "4x3x16x16", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    conv = next(layer for layer in doc["layers"] if layer["op"] == "aten.convolution.default")
    assert conv["flops"] == 2 * 4 * 8 * 16 * 16 * 3 * 9 + 4 * 8 * 16 * 16  # MACs x 2 + bias


def _fails(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpushape: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_unknown_model(capsys):
    assert "unknown model 'resnet51'" in _fails(capsys, ["audit", "resnet51"])


def test_unknown_factory_path(capsys, tmp_path):
    assert "not found" in _fails(capsys, ["audit", f"{tmp_path}/none.py:make"])


def test_factory_that_raises(capsys, factories):
    assert "cannot build" in _fails(capsys, ["audit", f"{factories}:broken"])


def test_malformed_input(capsys):
    assert "bad --input" in _fails(capsys, ["audit", "resnet50", "--input", "8xZx224"])


def test_unknown_gpu(capsys):
    assert "unknown GPU 'h300'" in _fails(capsys, ["audit", "resnet50", "--gpu", "h300"])


def test_an_input_the_model_refuses_points_at_the_input(capsys):
    err = _fails(capsys, ["audit", "resnet50", "--input", "8x3x224"])
    assert "module 'conv1'" in err and "check the inputs" in err and "--device cpu" not in err


def test_meta_failure_names_op_and_module_and_cpu_works(capsys, factories):
    err = _fails(capsys, ["audit", f"{factories}:needs_values"])
    assert "aten." in err and "module 'gate' (Gate)" in err and "--device cpu" in err
    assert main(["audit", f"{factories}:needs_values", "--device", "cpu"]) == 0


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_prints_the_traceback_and_still_exits_2(capsys, factories, where):
    """--debug goes before or after the subcommand; the exit code stays 2 (1 means findings)."""
    argv = ["audit", f"{factories}:needs_values"]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and f"{TraceError.__module__}.TraceError" in err
    assert err.strip().splitlines()[-1].startswith("gpushape: error: aten.")


def test_the_optimizer_a_training_step_runs_is_in_the_audit(capsys):
    import re

    def gpu_ms(out: str) -> float:  # the header: "(eager: ..., 1.234 ms on the GPU, ...)"
        return float(re.search(r"([0-9.]+) ms on the GPU", " ".join(out.split())).group(1))

    argv = ["audit", "bert-base", "--batch", "2", "--gpu", "h200", "--train"]
    assert main(argv) == 0
    without = capsys.readouterr().out
    assert main([*argv, "--optimizer", "adamw"]) == 0  # foreach AdamW, as bench builds it
    out = capsys.readouterr().out
    assert "optimizer-not-fused" in out and "optimizer-not-fused" not in without
    assert gpu_ms(out) > gpu_ms(without)  # its step's bytes on the GPU's side
    assert main(["audit", "bert-base", "--optimizer", "sgd"]) == 2
    assert "--train" in capsys.readouterr().err


def test_a_long_trace_says_how_far_it_has_come(capsys, tmp_path, monkeypatch):
    """A forward that loops in Python traces every step: past PROGRESS_EVERY ops the audit
    says so on stderr, then again each time the count doubles (here every 40 ops)."""
    from gpushape.tracing import recorder

    monkeypatch.setattr(recorder, "PROGRESS_EVERY", 40)
    path = tmp_path / "loop.py"
    path.write_text(
        textwrap.dedent("""
        import torch
        from torch import nn


        class Scan(nn.Module):
            def forward(self, x):
                h = torch.zeros_like(x[:, 0])
                for t in range(x.shape[1]):  # one step a position, as a reference scan does
                    h = 0.9 * h + x[:, t]
                return h


        def scan():
            return Scan(), (torch.randn(2, 64, 8),)
    """)
    )
    assert main(["audit", f"{path}:scan", "--format", "json"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "ops so far" in ln]
    counts = [int(ln.split(": ")[2].split(" ops")[0].replace(",", "")) for ln in lines]
    assert counts[0] == 40 and "loops in Python" in lines[0] and len(lines) >= 2
    assert all(b >= 2 * a for a, b in itertools.pairwise(counts))
    assert "loops in Python" not in "".join(lines[1:])


def test_a_short_trace_says_nothing_of_its_progress(capsys, factories):
    assert main(["audit", f"{factories}:tiny", "--format", "json"]) == 0
    assert "ops so far" not in capsys.readouterr().err
