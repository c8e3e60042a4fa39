"""Imports OpenOOD postprocessor modules straight from a fetched OpenOOD git directory, for the golden-score scripts
(make_*.py here, run by hand during development; pytest collects none of this folder).

OpenOOD does not install here (its package __init__ pulls the whole framework), so the files a postprocessor needs are
written out of the git directory at `COMMIT` into a temporary package whose `__init__` files are empty; the
postprocessor, `base_postprocessor.py` and `utils/comm.py` are the reference's own text. Usage:
    OPENOOD_GIT=/path/to/OpenOOD/.git python tests/detectors/posthoc/golden/make_residual.py
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

COMMIT = "3c35632ee91b54b09d1f085d04f94744cece7d0b"
"""Jingkang50/OpenOOD, the snapshot the golden scores were made from."""
GIT_DIR = os.environ.get("OPENOOD_GIT", "/work/.mirror/Jingkang50+OpenOOD/repo")
HERE = Path(__file__).resolve().parent
SUPPORT = ("openood/postprocessors/base_postprocessor.py", "openood/utils/comm.py")


def show(path: str) -> str:
    """The text of `path` in OpenOOD at COMMIT."""
    return subprocess.run(["git", f"--git-dir={GIT_DIR}", "show", f"{COMMIT}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def load(module: str, extra: tuple[str, ...] = ()):
    """`openood.postprocessors.<module>` from COMMIT (with the support files and the `extra` paths it imports),
    imported from a temporary tree."""
    root = Path(tempfile.mkdtemp(prefix="openood_ref_"))
    files = (*SUPPORT, *extra, f"openood/postprocessors/{module}.py")
    for package in sorted({str(Path(path).parent) for path in files} | {"openood"}):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    for path in files:
        (root / path).write_text(show(path))
    sys.path.insert(0, str(root))
    return importlib.import_module(f"openood.postprocessors.{module}")


def config(**args) -> SimpleNamespace:
    """An OpenOOD config carrying `postprocessor.postprocessor_args` (and an empty sweep)."""
    return SimpleNamespace(postprocessor=SimpleNamespace(postprocessor_args=SimpleNamespace(**args),
                                                         postprocessor_sweep={}))


def rounded(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """Normal draws rounded to 4 decimals, float32: written to JSON as decimals, they read back bit for bit."""
    return np.round(rng.normal(size=shape) * scale, 4).astype(np.float32)


def write(name: str, script: str, payload: dict) -> Path:
    """golden/<name>.json with the commit and the script that made it."""
    out = HERE / f"{name}.json"
    record = {"openood_commit": COMMIT, "made_by": f"tests/detectors/posthoc/golden/{script}", **payload}
    out.write_text(json.dumps(record, indent=None, separators=(",", ":")) + "\n")
    return out


def as_list(x) -> list:
    """Nested lists of an array: float32 inputs as their 4-decimal values, anything else as float64."""
    arr = np.asarray(x)
    if arr.dtype == np.float32:
        return np.round(arr.astype(np.float64), 4).tolist()
    return np.asarray(arr, dtype=np.float64).tolist()
