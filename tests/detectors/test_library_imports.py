"""`detectors` stands alone as a library: `detectors.build("knn").fit(...).score(...)` in a fresh interpreter loads
neither the generative / CLIP stacks (diffusers, transformers, accelerate) nor the application (`gen`, `oodforge`),
the experiment harness or another family's modules; and `pip install .` without extras is enough for it: with every
distribution outside pyproject.toml's core dependencies (and what they require) hidden, every post-hoc detector
builds, fits, scores and round-trips through save/load, and every family's detectors are listed
(tests/helpers/library_user.py); docs/library.md's examples run as written. The oracle is the interpreter's own
`sys.modules` and the installed distributions' metadata (`importlib.metadata`)."""
from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from helpers.library_user import HEAVY, canonical, core_requirements

import detectors

ROOT = Path(__file__).resolve().parents[2]
KNN = """
import json, sys
import numpy as np
import detectors
from detectors import FeatureSet
rng = np.random.default_rng(0)
det = detectors.build("knn").fit(FeatureSet(features=rng.normal(size=(50, 8)).astype(np.float32)))
scores = det.score(FeatureSet(features=rng.normal(size=(10, 8)).astype(np.float32)))
assert scores.shape == (10,) and np.isfinite(scores).all()
print(json.dumps(sorted(sys.modules)))
"""


def run(args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_knn_loads_no_heavy_module():
    loaded = json.loads(run(["-c", KNN]))
    heavy = [m for m in loaded if m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY))]
    assert heavy == []
    assert "detectors.posthoc.knn" in loaded and "detectors.registry" in loaded


@pytest.fixture(scope="module")
def library_user() -> dict:
    return json.loads(run([str(ROOT / "tests" / "helpers" / "library_user.py")]))


@pytest.mark.slow
def test_every_posthoc_detector_runs_on_the_core_alone(library_user):
    """Every feature-space post-hoc detector ran with no heavy module loaded, ODIN ran on images, and all families'
    detectors were listed, with the non-core distributions hidden."""
    shipped = [n for n in detectors.available() if detectors.detector_class(n).__module__.startswith("detectors.")]
    feature = [n for n in detectors.available("posthoc") if n in shipped
               and "images" not in detectors.detector_class(n).inputs]
    assert library_user["heavy_after_features"] == []
    assert library_user["ran"] == [*feature, "odin"]
    assert library_user["listed"] == len(shipped)  # other tests register detectors of their own in this process
    assert {"diffusers", "transformers", "pandas", "matplotlib", "cv2"} <= set(library_user["hidden"])


@pytest.mark.slow
def test_core_dependencies_name_what_the_library_imports(library_user):
    """Each third-party distribution that library code imported itself is a core dependency (not merely a requirement
    of one)."""
    core = set(core_requirements())
    missing = {top: entry for top, entry in library_user["imported"].items()
               if not set(entry["distributions"]) & core}
    assert missing == {}
    assert {"torch", "numpy", "faiss-cpu", "safetensors"} <= {d for e in library_user["imported"].values()
                                                             for d in e["distributions"]}


def test_core_leaves_out_the_application_and_all_installs_every_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = set(core_requirements())
    assert not core & {"diffusers", "transformers", "opencv-python-headless", "pandas", "pyarrow", "matplotlib"}
    extras = project["optional-dependencies"]
    named = project["optional-dependencies"]["all"][0].split("[")[1].rstrip("]").split(",")
    assert extras["all"] == [f"{project['name']}[{','.join(named)}]"]
    assert sorted(named) == sorted(set(extras) - {"all", "gpu", "masks", "test"})
    assert canonical(project["name"]) == "oodforge"


def test_the_library_page_examples_run_as_written(tmp_path, monkeypatch):
    """docs/library.md's Python blocks, in order, in one namespace (the save/load block writes under the cwd)."""
    text = (ROOT / "docs" / "library.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "library_page"}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile("\n".join(blocks), "docs/library.md", "exec"), namespace)  # noqa: S102 - the page's own example
    metrics = ast.literal_eval(printed.getvalue().splitlines()[0])
    assert set(metrics) >= {"auroc", "fpr95"} and metrics["auroc"] > 0.9
    assert np.allclose(namespace["again"].score(namespace["id_test"]), namespace["vim"].score(namespace["id_test"]))
    assert namespace["cls"] is detectors.detector_class("vim")
