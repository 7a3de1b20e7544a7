"""The examples run (on the CPU here: PyTorch reference paths, small sizes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpushape_example_{name}", EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fused_block_runs_and_matches(capsys):
    assert _load("fused_block.py").main(["--width", "64", "--tokens", "32", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "max relative difference" in out and "gpushape eager" in out


def test_audit_attention_finds_the_hand_written_attention_and_clears_it(capsys):
    assert _load("audit_attention.py").main(["--batch", "2", "--seq", "256"]) == 0
    out = capsys.readouterr().out
    hand, fixed = out.split("\nfixed:")
    for rule in ("manual-attention", "separate-qkv", "unfused-softmax-dropout"):
        assert rule in hand and rule not in fixed, rule
    assert "is_causal=True" in hand  # (so small a block is launch-bound either way)


def test_audit_channels_last_names_nchw_conv_and_clears_it(capsys):
    assert _load("audit_channels_last.py").main(["--batch", "8"]) == 0
    out = capsys.readouterr().out
    nchw, cl = out.split("\nchannels_last:")
    assert "nchw-conv" in nchw and "NCHW BatchNorm/pooling" in nchw
    assert "no nchw-conv finding" in cl
    before, after = (float(part.split("predicted ")[1].split(" ms")[0]) for part in (nchw, cl))
    assert after < before


def test_hf_decoder_compiled_fixes_the_cache_and_the_packed_mask(capsys):
    import pytest

    pytest.importorskip("transformers")
    example = _load("hf_decoder_compiled.py")
    assert example.main(["--layers", "2", "--batch", "2", "--seq", "256"]) == 0
    assert "applied no-kv-cache" in capsys.readouterr().out
    assert example.main(["--no-cache"]) == 0  # GPT-2 at 32 x 1024: GPU-bound compiled
    out = capsys.readouterr().out
    given, fixed = out.split("optimized, compiled")
    assert "materialized-attention-mask" in given and "applied skip-attention-mask" in given
    assert "materialized-attention-mask" not in fixed
