import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from gpushape.errors import UnknownGPUError
from gpushape.hardware import current_gpu


def _fake_device(monkeypatch, name, sms=132, memory=150_000_000_000, l2=60 * 2**20):
    props = SimpleNamespace(
        name=name, multi_processor_count=sms, total_memory=memory, L2_cache_size=l2
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: props)


def test_no_cuda_gives_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert current_gpu() is None


def test_driver_numbers_override_the_datasheet(monkeypatch):
    _fake_device(monkeypatch, "NVIDIA H200", sms=130, memory=143_771 * 2**20)
    spec = current_gpu()
    assert spec.name == "h200-sxm"
    assert spec.sm_count == 130 and spec.memory_bytes == 143_771 * 2**20
    assert spec.overridden["sm_count"].startswith("driver")


def test_unknown_device_names_the_catalog(monkeypatch):
    _fake_device(monkeypatch, "NVIDIA Imaginary X1")
    with pytest.raises(UnknownGPUError, match="known: "):
        current_gpu()


def test_no_driver_answers_without_importing_torch():
    """`gpushape gpus` on a machine without an NVIDIA driver must not pay torch's import."""
    code = (
        "import sys\n"
        "import gpushape.hardware.lookup as lookup\n"
        "lookup._nvidia_driver_present = lambda: False\n"
        "print(lookup.current_gpu(), 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["None", "False"]
