"""Headless Chromium for the HTML report test, installed once when missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,2000",
)


@pytest.fixture(autouse=True)
def _transformers_with_the_mask_gap(request):
    """materialized-attention-mask's cases on a transformers release with the gap, whichever
    release is installed (tests/_hf_masks.py)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or callspec.params.get("rule") != "materialized-attention-mask":
        yield
        return
    pytest.importorskip("transformers")
    from _hf_masks import old_masks

    with old_masks():
        yield


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "chromium: needs headless Chromium (installed when missing, with apt-get)"
    )


def _install() -> str | None:
    """apt-get install chromium (Debian's package); the reason it failed, or None."""
    if shutil.which("apt-get") is None:
        return "no apt-get on this machine"
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(cmd)}: {exc}"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            return f"{' '.join(cmd)} failed: {tail[0]}"
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        why = _install()
        path = shutil.which("chromium")
        if path is None:
            pytest.skip(f"headless Chromium is not installed and installing it failed: {why}")
    return path


@pytest.fixture
def chromium_screenshot(chromium, tmp_path):
    """screenshot(html_path) -> path of a 1280x2000 PNG of the rendered page."""

    def screenshot(page: Path) -> Path:
        png = tmp_path / "screenshot.png"
        profile = tmp_path / "chromium-profile"
        cmd = [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            Path(page).resolve().as_uri(),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert png.exists(), f"chromium wrote no screenshot: {done.stderr[-500:]}"
        return png

    return screenshot
