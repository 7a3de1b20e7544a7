# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# The virtual environment sees the host interpreter's packages (a torch already installed is
# reused, as on a GPU image); torch==2.13.0 (CPU build) is installed only when none imports.
# transformers (the `hf` extra) comes with the tests: the Hugging Face model tests run in CI.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gpushape-installed
TORCH_PIN ?= torch==2.13.0
PYTEST_WORKERS ?= 2

.PHONY: demo test test-gpu lint format clean venv

demo: $(STAMP)
	$(VENV)/bin/gpushape audit resnet50 --gpu h100

test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -m "not gpu" -n $(PYTEST_WORKERS) -q

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu -q

lint: $(STAMP)
	@$(PY) -m ruff --version >/dev/null 2>&1 || $(PY) -m pip install -q "ruff>=0.5"
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m ruff format --check src tests benchmarks examples

format: $(STAMP)
	@$(PY) -m ruff --version >/dev/null 2>&1 || $(PY) -m pip install -q "ruff>=0.5"
	$(PY) -m ruff format src tests benchmarks examples
	$(PY) -m ruff check --fix src tests benchmarks examples

venv: $(STAMP)

$(PY):
	$(PYTHON) -m venv --system-site-packages $(VENV)
	@# When the host python is itself a venv (GPU images), --system-site-packages does not reach
	@# its packages: point the new venv at them with a .pth file so its torch is reused.
	$(PYTHON) -c "import site; print('\n'.join(site.getsitepackages()))" \
	  > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_gpushape_host.pth"

$(STAMP): $(PY) pyproject.toml
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_PIN)"
	@$(PY) -c "import triton, numpy" 2>/dev/null || $(PY) -m pip install -q triton numpy
	$(PY) -m pip install -q --no-build-isolation -e ".[test,hf]"
	@touch $(STAMP)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
