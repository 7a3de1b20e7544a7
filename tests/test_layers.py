"""The import graph runs one way (ARCHITECTURE.md): each layer imports only the layers it may."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpushape"

# layer -> the layers it may import (ARCHITECTURE.md's table); every subpackage needs a row
ALLOWED = {
    "errors": set(),
    "hardware": {"errors"},
    "tracing": {"hardware", "errors"},
    "models": {"errors"},
    "kernels": {"errors"},
    "bench": {"hardware", "errors"},
    "data": {"bench", "hardware", "errors"},
    "probe": {"bench", "tracing", "kernels", "models", "hardware", "errors"},
    "auditing": {"tracing", "models", "data", "hardware", "errors"},
    "transforms": {"auditing", "tracing", "kernels", "models", "bench", "hardware", "errors"},
    "steps": {"transforms", "auditing", "tracing", "models", "bench", "hardware", "errors"},
    "cli": {
        "steps",
        "auditing",
        "transforms",
        "probe",
        "data",
        "bench",
        "tracing",
        "kernels",
        "models",
        "hardware",
        "errors",
    },
}
# the package's own front door (`gpushape.audit()` and friends) and `python -m gpushape`
TOP_LEVEL = {"__init__", "__main__"}


def _imported_layers(path: Path) -> set[str]:
    """The top-level gpushape layers `path` imports, from absolute and relative imports."""
    depth = len(path.relative_to(PACKAGE).parts) - 1  # folders below gpushape/
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.startswith("gpushape."):
                found.add(node.module.split(".")[1])
            elif node.level > depth:  # climbs to gpushape/: "..x" from layer/file.py
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("gpushape."))
    return found


def _layers() -> list[str]:
    folders = [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()]
    files = [p.stem for p in PACKAGE.glob("*.py") if p.stem not in TOP_LEVEL]
    return sorted(folders + files)


def test_every_layer_has_a_row():
    missing = [layer for layer in _layers() if layer not in ALLOWED]
    assert not missing, f"add {missing} to ALLOWED (and to ARCHITECTURE.md's layer table)"


@pytest.mark.parametrize("layer", _layers())
def test_layer_imports_run_one_way(layer):
    root = PACKAGE / layer
    paths = list(root.rglob("*.py")) if root.is_dir() else [PACKAGE / f"{layer}.py"]
    for path in paths:
        bad = _imported_layers(path) - ALLOWED[layer] - {layer}
        assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


def test_architecture_lists_every_layer():
    text = (PACKAGE.parents[1] / "ARCHITECTURE.md").read_text()
    missing = [
        layer for layer in _layers() if f"`{layer}/`" not in text and f"`{layer}.py`" not in text
    ]
    assert not missing, f"ARCHITECTURE.md does not describe {missing}"


def test_no_package_folder_past_sixteen_modules():
    """Folders of one file per registered id (rules/, transforms/) are the exception."""
    for folder in PACKAGE.rglob("__init__.py"):
        if folder.parent.name in {"rules", "transforms"}:
            continue
        modules = [p for p in folder.parent.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= 16, f"{folder.parent.relative_to(PACKAGE)} has {len(modules)}"
