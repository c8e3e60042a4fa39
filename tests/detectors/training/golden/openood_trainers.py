"""Imports OpenOOD trainer modules straight from a fetched OpenOOD git directory, for the golden scripts (make_*.py
here, run by hand during development; pytest collects none of this folder).

OpenOOD does not install here (its package __init__ pulls the whole framework), so the files a trainer needs are written
out of the git directory at `COMMIT` into a temporary package: the trainer, the network and `utils/comm.py` are the
reference's own text; `openood/utils/__init__.py` only provides the `Config` name the trainers import, and `.cuda()`
and `.to('cuda')` are the identity (the step runs on the CPU). Usage:
    OPENOOD_GIT=/path/to/OpenOOD/.git python tests/detectors/training/golden/make_cider.py
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
import torch

COMMIT = "3c35632ee91b54b09d1f085d04f94744cece7d0b"
"""Jingkang50/OpenOOD, the snapshot the golden numbers were made from."""
GIT_DIR = os.environ.get("OPENOOD_GIT", "/work/.mirror/Jingkang50+OpenOOD/repo")
HERE = Path(__file__).resolve().parent


def show(path: str) -> str:
    """The text of `path` in OpenOOD at COMMIT."""
    return subprocess.run(["git", f"--git-dir={GIT_DIR}", "show", f"{COMMIT}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def load(*paths: str) -> list:
    """The modules of `paths` (OpenOOD files at COMMIT, with utils/comm.py), imported from a temporary tree."""
    root = Path(tempfile.mkdtemp(prefix="openood_trainers_"))
    files = ("openood/utils/comm.py", *paths)
    for package in sorted({str(Path(path).parent) for path in files} | {"openood"}):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    (root / "openood/utils/__init__.py").write_text("Config = dict  # the name the trainers import\n")
    for path in files:
        (root / path).write_text(show(path))
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # the step runs on the CPU
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    to = torch.Tensor.to
    torch.Tensor.to = lambda self, *args, **kwargs: self if args[:1] == ("cuda",) else to(self, *args, **kwargs)
    sys.path.insert(0, str(root))
    return [importlib.import_module(path[:-3].replace("/", ".")) for path in paths]


class Batches:
    """A loader whose iterator has a length, as a torch DataLoader's (the trainers call `len(iter(loader))`)."""

    def __init__(self, batches: list):
        self.batches = batches

    def __iter__(self):
        return Batches._Iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    class _Iter:
        def __init__(self, batches: list):
            self.batches, self.at = batches, 0

        def __len__(self) -> int:
            return len(self.batches)

        def __iter__(self):
            return self

        def __next__(self):
            if self.at >= len(self.batches):
                raise StopIteration
            self.at += 1
            return self.batches[self.at - 1]


def namespace(tree: dict) -> SimpleNamespace:
    """An OpenOOD-style config (attribute access all the way down) from nested dicts."""
    return SimpleNamespace(**{k: namespace(v) if isinstance(v, dict) else v for k, v in tree.items()})


def rounded(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """Normal draws rounded to 4 decimals, float32: written to JSON as decimals, they read back bit for bit."""
    return np.round(rng.normal(size=shape) * scale, 4).astype(np.float32)


def as_list(x) -> list:
    """Nested lists of an array (float64 values)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64).tolist()


def write(name: str, script: str, payload: dict) -> Path:
    """golden/<name>.json with the commit and the script that made it."""
    out = HERE / f"{name}.json"
    record = {"openood_commit": COMMIT, "made_by": f"tests/detectors/training/golden/{script}", **payload}
    out.write_text(json.dumps(record, indent=None, separators=(",", ":")) + "\n")
    return out
