"""The import graph runs one way (ARCHITECTURE.md): lower layers never import higher ones."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpushape"

# layer -> layers it must never import
FORBIDDEN = {
    "hardware": {"trace", "audit", "transforms", "cli", "bench", "models", "kernels"},
    "trace": {"audit", "transforms", "cli", "bench"},
    "kernels": {"audit", "transforms", "cli", "trace"},
    "models": {"audit", "transforms", "cli"},
    "bench": {"audit", "transforms", "cli"},
}


def _imported_layers(path: Path, layer: str) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.startswith("gpushape."):
                found.add(node.module.split(".")[1])
            elif node.level >= 1:
                depth = len(path.relative_to(PACKAGE).parts) - 1  # folders below gpushape/
                if node.level > depth:  # climbs out of the layer: "..x" from layer/file.py
                    found.add((node.module or "").split(".")[0])
                elif node.level == depth and node.module is None:
                    found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("gpushape."):
                    found.add(alias.name.split(".")[1])
    return found - {layer, ""}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_run_one_way(layer):
    folder = PACKAGE / layer
    if not folder.exists():
        pytest.skip(f"{layer}/ does not exist yet")
    for path in folder.rglob("*.py"):
        bad = _imported_layers(path, layer) & FORBIDDEN[layer]
        assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"
