# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# The virtual environment sees the host interpreter's packages (a torch already installed is
# reused, as on a GPU image, whose torch comes with torchvision and timm); TORCH_PIN is
# installed only when no torch imports.
# transformers (the `hf` extra) comes with the tests: the Hugging Face model tests run in CI.
# timm (the `timm` extra) comes with them where torchvision imports, so the timm model tests
# run in CI too. timm needs a torchvision built for the installed torch: PyPI's torchvision
# does not import beside the CPU-only torch==2.13.0 ("operator torchvision::nms does not
# exist"), so the pin is torch 2.14.1 with its torchvision 0.29.1 (the CI machine has both
# wheels on its disk for Python 3.11: pip installs them in about a minute; a CUDA build,
# 5.6 GB in the venv, that runs on the CPU). A reused torch without torchvision is kept as it
# is: the timm tests then skip (installing the extra would replace that torch).
# That pair needs disk: with less than TORCH_FULL_FREE_GB free where the venv goes, the
# Makefile takes the CPU-only torch==2.13.0 instead (about 1 GB; timm and its tests skip) and
# says so. A CI run once failed with "No space left on device" halfway through the large pair.
# `make TORCH_PIN=torch==2.13.0` asks for the small CPU-only venv, without timm, whatever the disk.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gpushape-installed
TORCH_PIN ?= auto
TORCH_FULL  := torch==2.14.1 torchvision==0.29.1
TORCH_SMALL := torch==2.13.0
TORCH_FULL_FREE_GB ?= 12
PIP_INSTALL := -m pip install -q --no-cache-dir
PYTEST_WORKERS ?= 2
# One intra-op thread per pytest worker: the workers already fill the cores, and torch's
# default of a thread per core in each of them makes its OpenMP threads spin waiting for one
# another (on 2 busy cores tests/transforms/test_timm_models.py took 145 s with the default,
# 11 s with one thread).
TEST_THREADS ?= 1

.PHONY: demo test test-gpu lint format clean venv

demo: $(STAMP)
	$(VENV)/bin/gpushape audit resnet50 --gpu h100

test: $(STAMP)
	OMP_NUM_THREADS=$(TEST_THREADS) TRITON_INTERPRET=1 \
	  $(PY) -m pytest -m "not gpu" -n $(PYTEST_WORKERS) -q

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
	@$(PY) -c "import torch" 2>/dev/null || { pin="$(TORCH_PIN)"; \
	  if [ "$$pin" = auto ]; then pin="$(TORCH_FULL)"; \
	    if ! $(PY) -c "import shutil, sys; sys.exit(shutil.disk_usage('.').free < $(TORCH_FULL_FREE_GB) * 2**30)"; then \
	      pin="$(TORCH_SMALL)"; \
	      echo "less than $(TORCH_FULL_FREE_GB) GB free here: installing $$pin (CPU-only; timm and its tests skip)"; \
	    fi; \
	  fi; \
	  echo "$(PY) $(PIP_INSTALL) $$pin"; $(PY) $(PIP_INSTALL) $$pin; }
	@$(PY) -c "import triton, numpy" 2>/dev/null || $(PY) $(PIP_INSTALL) triton numpy
	@# timm only beside a torchvision that imports with this torch (see the top of this file)
	@if $(PY) -c "import torchvision" 2>/dev/null; then extras=test,hf,timm; else \
	  extras=test,hf; echo "torchvision does not import here: timm not installed, its tests skip"; \
	fi; \
	echo "$(PY) $(PIP_INSTALL) --no-build-isolation -e .[$$extras]"; \
	$(PY) $(PIP_INSTALL) --no-build-isolation -e ".[$$extras]"
	@touch $(STAMP)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
