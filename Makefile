# Two-command quick start: `make demo` and `make test`. Both create .venv if missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed

.PHONY: install demo test floors bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# CPU torch first (a plain `torch` requirement would pull a multi-GB CUDA build on a CPU machine).
$(STAMP): $(PY) pyproject.toml
	$(PIP) install --no-deps guided-diffusion-sdk==1.0.0  # OpenAI's ADM code: reference of the checkpoint converter's tests
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -e ".[test]"
	bash .ci/parity_deps $(PY)  # libMR, pytorch-ood 0.4: references of tests/**/test_parity_*.py
	$(PIP) install --no-deps open_clip_torch  # ships OpenAI's CLIP BPE vocabulary (detectors/clip/vocab.py)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py --out demo_out

test: $(STAMP)
	$(PY) -m pytest -q tests

# The lowest versions pyproject.toml allows, installed exactly into .venv-floors, must pass the suite too.
floors:
	bash .ci/floors .venv-floors

bench: $(STAMP)
	$(PY) scripts/bench_detectors.py

clean:
	rm -rf demo_out .pytest_cache .venv-floors
