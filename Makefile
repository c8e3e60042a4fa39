# Two-command quick start: `make demo` and `make test`. Both create .venv if missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast layers lint wheel-check library-check floors bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# CPU torch first (a plain `torch` requirement would pull a multi-GB CUDA build on a CPU machine). The references
# installed without their dependencies come last: a resolving install after them would print pip's dependency-resolver
# ERROR about the requirements they skip (tests/test_install_order.py).
$(STAMP): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -e ".[all,test]"  # the library's core, every extra the commands use (pyproject.toml), the tests
	bash .ci/parity_deps $(PY)  # libMR, pytorch-ood 0.4, guided-diffusion-sdk (OpenAI's ADM code): test references
	$(PIP) install --no-deps open_clip_torch  # ships OpenAI's CLIP BPE vocabulary (detectors/clip/vocab.py)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py --out demo_out

test: $(STAMP)
	$(PY) -m pytest -q tests

# The suite without the tests marked slow (@pytest.mark.slow: subprocess pipelines, trainings, full protocols).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

# No upward import (pipelines < gen, detectors < oodforge < scripts, benchmarks; gen and detectors apart; the detector
# methods never import detectors/harness), no import circle (lazy ones included), and docs/architecture.md's map is true.
layers: $(STAMP)
	$(PY) scripts/check_layers.py

# ruff (pyproject.toml [tool.ruff]): pyflakes, bugbear, import order, pyupgrade, complexity over 10 (C901) and lines
# over 120 characters.
lint: $(STAMP)
	$(PY) -m ruff check .

# The built wheel carries the real hub configs the tiny stand-ins need (package data).
wheel-check: $(STAMP)
	rm -rf build/wheel-check && $(PY) -m pip wheel --no-deps -q -w build/wheel-check .
	$(PY) -c "import sys, zipfile, pathlib; names = set(zipfile.ZipFile(next(pathlib.Path('build/wheel-check').glob('*.whl'))).namelist()); want = {p.as_posix() for p in pathlib.Path('pipelines/hub_configs').rglob('*') if p.is_file()}; missing = sorted(want - names); sys.exit(f'wheel lacks {missing}' if missing else print(f'wheel: {len(want)} hub config files shipped'))"

# `pip install` of that wheel without extras in a fresh venv gives a working detectors library (docs/library.md).
library-check: wheel-check
	bash .ci/library build/wheel-check

# The lowest versions pyproject.toml allows, installed exactly into .venv-floors, must pass the suite too.
floors:
	bash .ci/floors .venv-floors

bench: $(STAMP)
	$(PY) -m benchmarks.detectors

clean:
	rm -rf demo_out .pytest_cache .venv-floors build
