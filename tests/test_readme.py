"""The README's promises: it opens with the two make commands, stays short, and every Python
block in it runs as written on a CPU (blocks whose first line is `# needs a GPU` are skipped)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
LIMIT_BYTES = 14_000  # 12,000 until the case-study table (commands in full) came in
GPU_MARK = "# needs a GPU"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.M | re.S)


def test_readme_starts_with_the_two_make_commands():
    """Title, three lines saying what gpushape is, then `make demo` and `make test` alone in a
    code block, each with a comment saying what it does."""
    lines = README.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1] == ""
    assert all(line.strip() and not line.startswith(("#", "`")) for line in lines[2:5])
    assert lines[5] == "" and lines[6] == "```" and lines[9] == "```"
    for line, target in zip(lines[7:9], ("demo", "test")):
        command, _, comment = line.partition("#")
        assert command.split() == ["make", target], line
        assert comment.strip(), f"`make {target}` needs a comment saying what it does"


def test_readme_is_short():
    assert len(README.read_bytes()) < LIMIT_BYTES


def test_readme_has_python_blocks():
    assert python_blocks(), "the quick start's Python block is gone"


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_block_runs(index, tmp_path, monkeypatch):
    code = python_blocks()[index]
    if code.lstrip().startswith(GPU_MARK):
        pytest.skip("the block needs a GPU")
    monkeypatch.chdir(tmp_path)  # blocks may write files (report.html)
    exec(compile(code, f"README.md python block {index + 1}", "exec"), {"__name__": "__readme__"})
