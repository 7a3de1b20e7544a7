"""Every module imports the ordinary way: no function or class shadows a module of its package."""

import importlib
import pkgutil
import sys
import types

import pytest

import gpushape


def _module_names() -> list[str]:
    names = ["gpushape"]
    for info in pkgutil.walk_packages(gpushape.__path__, prefix="gpushape."):
        if not info.name.endswith("__main__"):  # `python -m gpushape` runs the CLI on import
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _module_names())
def test_import_as(name):
    namespace: dict = {}
    exec(f"import {name} as m", namespace)  # fails when an attribute shadows a submodule
    assert namespace["m"] is sys.modules[name]


@pytest.mark.parametrize("name", [n for n in _module_names() if "." in n])
def test_parent_attribute_is_the_module(name):
    importlib.import_module(name)
    parent, _, child = name.rpartition(".")
    assert isinstance(getattr(sys.modules[parent], child), types.ModuleType), (
        f"{parent}.{child} is not the module {name}"
    )


def test_front_door_functions():
    assert callable(gpushape.audit) and callable(gpushape.trace) and callable(gpushape.cost)
    assert not isinstance(gpushape.audit, types.ModuleType)
