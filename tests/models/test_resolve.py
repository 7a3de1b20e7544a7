"""MODEL resolution: zoo names, path/to/file.py:factory, package.module:factory, and its errors."""

from __future__ import annotations

import sys
import textwrap
import uuid

import pytest
import torch

from gpushape.errors import GpushapeError
from gpushape.models import ResolvedModel, resolve_model

HEADER = "import torch\nfrom torch import nn\n"


def write(directory, filename: str, source: str):
    path = directory / filename
    path.write_text(HEADER + textwrap.dedent(source))
    return path


def _module_of(path):
    """The loaded user file (it stays in sys.modules so pickling and dataclasses work)."""
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(path))


def error_of(spec: str, **kwargs) -> str:
    with pytest.raises(GpushapeError) as info:
        resolve_model(spec, **kwargs)
    message = str(info.value)
    assert "\n" not in message  # the CLI prints one line
    return message


# --- zoo names -------------------------------------------------------------------------------


def test_zoo_name_builds_on_meta_in_bf16():
    resolved = resolve_model("resnet50", batch=2)
    assert isinstance(resolved, ResolvedModel) and resolved.name == "resnet50"
    (x,) = resolved.example_inputs
    assert tuple(x.shape) == (2, 3, 224, 224) and x.dtype == torch.bfloat16 and x.is_meta
    assert resolved.model.conv1.weight.is_meta


def test_input_strings_replace_a_zoo_models_inputs():
    resolved = resolve_model("vit-b16", inputs=["1x3x224x224:fp32"])
    (x,) = resolved.example_inputs
    assert tuple(x.shape) == (1, 3, 224, 224) and x.dtype == torch.float32


def test_unknown_zoo_name_lists_the_zoo_and_the_other_forms():
    message = error_of("gtp2")
    assert message.startswith("unknown model 'gtp2' (did you mean gpt2?); known: bert-base, gpt2")
    assert message.endswith(
        "or give path/to/file.py:factory, package.module:factory, hf:<model type> or timm:<name>"
    )


# --- path/to/file.py:factory -----------------------------------------------------------------


def test_file_factory_without_a_device_argument_runs_under_the_meta_device(tmp_path):
    path = write(
        tmp_path,
        "net.py",
        """
        SEEN = []
        def make():
            SEEN.append(torch.empty(1).device.type)
            return nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    """,
    )
    resolved = resolve_model(f"{path}:make", inputs=["2x4"])
    assert resolved.name == f"{path}:make"
    weight = resolved.model[0].weight
    assert weight.is_meta and weight.dtype == torch.bfloat16
    (x,) = resolved.example_inputs
    assert x.is_meta and x.dtype == torch.bfloat16 and tuple(x.shape) == (2, 4)
    assert resolved.model(x).shape == (2, 8)
    assert _module_of(path).SEEN == ["meta"]


def test_file_factory_gets_the_arguments_it_names(tmp_path):
    path = write(
        tmp_path,
        "named.py",
        """
        GOT = {}
        def make(batch=1, dtype=torch.float32, device="cpu"):
            GOT.update(batch=batch, dtype=dtype, device=str(device))
            model = nn.Linear(4, 3, dtype=dtype, device=device)
            return model, torch.randn(batch, 4, dtype=dtype, device=device)
    """,
    )
    resolved = resolve_model(f"{path}:make", batch=3, dtype=torch.float64, device="cpu")
    got = _module_of(path).GOT
    assert got == {"batch": 3, "dtype": torch.float64, "device": "cpu"}
    (x,) = resolved.example_inputs
    assert tuple(x.shape) == (3, 4) and x.dtype == torch.float64
    assert torch.isfinite(resolved.model(x)).all()


def test_file_factory_without_dtype_is_cast_but_integer_inputs_are_kept(tmp_path):
    path = write(
        tmp_path,
        "cast.py",
        """
        def make():
            return nn.Linear(4, 4), (torch.randn(2, 4), torch.zeros(2, dtype=torch.int64))
    """,
    )
    resolved = resolve_model(f"{path}:make", dtype=torch.float16, device="cpu")
    assert resolved.model.weight.dtype == torch.float16 and not resolved.model.weight.is_meta
    x, ids = resolved.example_inputs
    assert x.dtype == torch.float16 and ids.dtype == torch.int64


def test_file_can_import_its_siblings_and_sys_path_is_restored(tmp_path):
    helper = f"helper_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{helper}.py").write_text("WIDTH = 5\n")
    path = write(
        tmp_path,
        "sib.py",
        f"""
        from {helper} import WIDTH
        def make():
            return nn.Linear(WIDTH, 2), torch.randn(1, WIDTH)
    """,
    )
    before = list(sys.path)
    resolved = resolve_model(f"{path}:make")
    assert resolved.model.in_features == 5
    assert sys.path == before


def test_a_module_instance_and_a_module_class_can_be_named(tmp_path):
    path = write(
        tmp_path,
        "objs.py",
        """
        MODEL = nn.Linear(4, 4)
        class Net(nn.Module):
            def __init__(self, width=6):
                super().__init__()
                self.fc = nn.Linear(width, 2)
            def forward(self, x):
                return self.fc(x)
    """,
    )
    instance = resolve_model(f"{path}:MODEL", inputs=["1x4"])
    assert instance.model.weight.is_meta  # built on the CPU at import, moved to meta
    built = resolve_model(f"{path}:Net", inputs=["1x6"])
    assert built.model.fc.weight.is_meta and built.model.fc.weight.dtype == torch.bfloat16


# --- package.module:factory ------------------------------------------------------------------


def make_package(tmp_path, modules: dict[str, str]) -> str:
    package = f"gs_pkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    for name, source in modules.items():
        write(tmp_path / package, f"{name}.py", source)
    return package


def test_package_module_factory_is_found_from_the_working_directory(tmp_path, monkeypatch):
    package = make_package(
        tmp_path,
        {
            "nets": """
        def make(batch=4):
            return nn.Linear(4, 2), torch.randn(batch, 4)
    """
        },
    )
    monkeypatch.chdir(tmp_path)
    resolved = resolve_model(f"{package}.nets:make", batch=2)
    (x,) = resolved.example_inputs
    assert tuple(x.shape) == (2, 4) and x.is_meta and x.dtype == torch.bfloat16
    assert resolved.name == f"{package}.nets:make"


def test_installed_module_factory():
    resolved = resolve_model("gpushape.models.gpt2:gpt2", batch=1)
    assert resolved.example_inputs[0].shape == (1, 1024)


# --- errors ----------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "absent.py"
    assert error_of(f"{path}:make").startswith(f"model file not found: {path}")


def test_file_that_fails_to_import(tmp_path):
    path = write(tmp_path, "broken.py", "x = 1 / 0\n")
    assert error_of(f"{path}:make") == (
        f"importing {path} failed: ZeroDivisionError: division by zero"
    )


def test_file_with_a_syntax_error(tmp_path):
    path = write(tmp_path, "syntax.py", "def make(:\n")
    assert error_of(f"{path}:make").startswith(f"importing {path} failed: SyntaxError: ")


def test_module_that_does_not_exist():
    assert error_of("no_such_module_xyz.nets:make") == (
        "cannot import module 'no_such_module_xyz.nets': No module named 'no_such_module_xyz' "
        "(is it installed, or in the current directory?)"
    )


def test_module_whose_own_import_fails_says_why(tmp_path, monkeypatch):
    package = make_package(tmp_path, {"bad": "import missing_dep_xyz\n"})
    monkeypatch.chdir(tmp_path)
    assert error_of(f"{package}.bad:make") == (
        f"importing '{package}.bad' failed: ModuleNotFoundError: No module named 'missing_dep_xyz'"
    )


def test_missing_attribute_lists_what_the_file_defines(tmp_path):
    path = write(tmp_path, "attrs.py", "def make():\n    return nn.Linear(1, 1)\nVALUE = 3\n")
    assert error_of(f"{path}:nope") == f"{path} has no attribute 'nope'; it defines: make"


def test_attribute_that_is_not_callable(tmp_path):
    path = write(tmp_path, "value.py", "VALUE = 3\n")
    assert error_of(f"{path}:VALUE") == (
        f"{path}:VALUE is an object of type 'int', not a factory; name a function or class "
        f"that returns an nn.Module or (module, example_inputs)"
    )


def test_factory_that_raises_is_named_with_the_exception(tmp_path):
    path = write(
        tmp_path,
        "raises.py",
        """
        def make():
            raise ValueError("bad width\\nsecond line")
    """,
    )
    assert error_of(f"{path}:make") == (
        f"factory {path}:make raised ValueError: bad width second line"
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "return 3",
            "returned an object of type 'int'; expected an nn.Module or (module, example_inputs)",
        ),
        (
            "return 1, 2",
            "returned a tuple of (int, int); expected an nn.Module or (module, example_inputs)",
        ),
        (
            "return nn.Linear(1, 1), 'x'",
            "returned example inputs that are an object of type "
            "'str'; expected a tensor or a tuple of tensors",
        ),
    ],
)
def test_factory_returning_the_wrong_thing(tmp_path, body, expected):
    path = write(tmp_path, "wrong.py", f"def make():\n    {body}\n")
    assert error_of(f"{path}:make") == f"factory {path}:make {expected}"


def test_factory_with_an_argument_nobody_supplies(tmp_path):
    path = write(tmp_path, "needs.py", "def make(width, batch=1):\n    return nn.Linear(1, 1)\n")
    assert error_of(f"{path}:make").startswith(
        f"factory {path}:make needs argument(s) width, which gpushape cannot supply"
    )


def test_meta_parameters_cannot_go_to_a_real_device(tmp_path):
    path = write(
        tmp_path,
        "meta.py",
        """
        def make():
            return nn.Linear(2, 2, device="meta"), torch.randn(1, 2)
    """,
    )
    assert error_of(f"{path}:make", device="cpu").startswith(
        f"{path}:make has parameters or inputs on the meta device, which hold no values, but "
        f"device 'cpu' was asked"
    )


def test_factory_without_inputs_and_no_input_strings(tmp_path):
    path = write(tmp_path, "noin.py", "def make():\n    return nn.Linear(2, 2)\n")
    assert error_of(f"{path}:make").startswith(
        f"{path}:make gave no example inputs; return (module, example_inputs) from the factory "
        f"or pass --input SHAPE[:DTYPE]"
    )


def test_batch_for_a_factory_without_a_batch_argument(tmp_path):
    path = write(tmp_path, "nobatch.py", "def make():\n    return nn.Linear(2, 2)\n")
    assert error_of(f"{path}:make", batch=4, inputs=["4x2"]).startswith(
        f"{path}:make takes no batch argument, so a batch size cannot be applied"
    )


def test_malformed_input_string(tmp_path):
    path = write(tmp_path, "ok.py", "def make():\n    return nn.Linear(2, 2)\n")
    assert error_of(f"{path}:make", inputs=["4by2"]) == (
        "bad --input '4by2': expected SHAPE[:DTYPE], e.g. 8x3x224x224 or 8x512:int64"
    )


@pytest.mark.parametrize(
    ("spec", "kwargs", "expected"),
    [
        (
            "net.py:",
            {},
            "bad model 'net.py:': expected a zoo name, path/to/file.py:factory, "
            "package.module:factory, hf:<model type> or timm:<name>",
        ),
        (":make", {}, "bad model ':make': expected a zoo name"),
        ("net.py", {}, "'net.py' names a file but no factory; write net.py:FACTORY"),
        ("resnet50", {"device": "nodevice"}, "bad device 'nodevice': "),
        ("resnet50", {"dtype": torch.int32}, "dtype must be a floating-point torch.dtype"),
        ("resnet50", {"batch": -1}, "batch must be a positive integer, got -1"),
    ],
)
def test_bad_arguments(spec, kwargs, expected):
    assert error_of(spec, **kwargs).startswith(expected)


# --- exits, interrupts and devices -----------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "shown"),
    [("sys.exit(3)", "sys.exit(3)"), ("sys.exit()", "sys.exit()"), ("exit('bye')", "'bye'")],
)
def test_factory_calling_sys_exit_is_an_error_not_an_exit(tmp_path, call, shown):
    """A SystemExit would end gpushape with the user's code (3, or 1: '--fail-on failed')."""
    path = write(tmp_path, "quits.py", f"import sys\n\ndef make():\n    {call}\n")
    message = error_of(f"{path}:make")
    assert message.startswith(f"model factory '{path}:make' called sys.exit(") and shown in message


def test_file_and_module_calling_sys_exit_on_import(tmp_path, monkeypatch):
    name = f"quits_{uuid.uuid4().hex[:8]}"
    path = write(tmp_path, f"{name}.py", "import sys\nsys.exit(4)\n")
    assert error_of(f"{path}:make") == f"importing {path} called sys.exit(4)"
    monkeypatch.chdir(tmp_path)
    assert error_of(f"{name}:make") == f"importing '{name}' called sys.exit(4)"


def test_keyboard_interrupt_passes_through(tmp_path):
    path = write(tmp_path, "stops.py", "def make():\n    raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        resolve_model(f"{path}:make")


def test_a_device_this_machine_lacks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert error_of("resnet50", device="cuda:0") == (
        "device 'cuda:0' is not available: torch sees no CUDA GPU on this machine; trace on "
        "meta (the default) or cpu"
    )
