"""A library user's session in a fresh interpreter, as if only `pip install .` (no extras) had run: every installed
distribution outside pyproject.toml's core dependencies and what they require is hidden (importing one raises
ModuleNotFoundError, as on such an install). Run by tests/detectors/test_library_imports.py:

    python tests/helpers/library_user.py

1. builds, fits and scores every post-hoc feature-space detector (toy features, its declared fit inputs) with a
   save/load round trip, and records the heavy modules loaded by then;
2. scores ODIN (an image-level post-hoc detector) on a few images with a tiny torch classifier;
3. lists every family's detectors (`detectors.available()`: each family's modules import on the core alone).

Prints one JSON object: the heavy modules after step 1, the third-party distributions that library code (`detectors`,
`pipelines`) imported itself, the detectors run, and the hidden modules."""
from __future__ import annotations

import builtins
import importlib.metadata
import json
import re
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("detectors", "pipelines", "gen", "oodforge", "benchmarks", "scripts", "tests", "helpers")
HEAVY = ("diffusers", "transformers", "accelerate", "gen", "oodforge", "detectors.harness", "detectors.clip",
         "detectors.generative", "detectors.training")
"""What a feature-space detector must not load: the generative and CLIP stacks, the application, the harness and the
other families."""


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def core_requirements() -> list[str]:
    """pyproject.toml's `[project] dependencies`, the distribution names only."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [canonical(Requirement(spec).name) for spec in project["dependencies"]]


def closure(names: list[str]) -> set[str]:
    """`names` and every distribution they require, transitively (extras' requirements left out), as installed."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for spec in requires:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonical(req.name))
    return seen


def hide_outside(allowed: set[str]) -> list[str]:
    """Hide the top-level modules of installed distributions outside `allowed`: a None in `sys.modules` makes
    `import` raise ModuleNotFoundError and `importlib.util.find_spec` return None, as for a module not installed."""
    owners = importlib.metadata.packages_distributions()
    hidden = sorted(top for top, dists in owners.items() if top not in FIRST_PARTY and top not in sys.modules
                    and not {canonical(d) for d in dists} & allowed)
    for top in hidden:
        sys.modules[top] = None
    return hidden


def record_library_imports() -> dict[str, set[str]]:
    """Top-level third-party module -> the library modules (`detectors`, `pipelines`) that imported it."""
    seen: dict[str, set[str]] = {}
    original = builtins.__import__

    def hook(name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {}).get("__name__", "")
        top = name.split(".")[0]
        if (not level and importer.split(".")[0] in ("detectors", "pipelines") and top not in FIRST_PARTY
                and top not in sys.stdlib_module_names):
            seen.setdefault(top, set()).add(importer)
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = hook
    return seen


def feature_detectors() -> list[str]:
    """Build, fit, score and save/load every post-hoc detector that reads features; the names run."""
    import numpy as np

    import detectors
    from helpers.toys import toy_features, toy_head

    head = toy_head()
    train, val, ood_val = toy_features(90, seed=0), toy_features(30, seed=1), toy_features(30, seed=2, ood=True)
    test = toy_features(20, seed=3)
    inputs = {"head": head, "id_val": val, "ood_val": ood_val, "aux": ood_val}
    ran = []
    for name in detectors.available("posthoc"):
        cls = detectors.detector_class(name)
        if "images" in cls.inputs:
            continue
        det = detectors.build(name).fit(train, **{k: v for k, v in inputs.items() if k in cls.fit_inputs})
        scores = det.score(test)
        with tempfile.TemporaryDirectory() as folder:
            det.save_pretrained(folder)
            again = detectors.load(folder).score(test)
        if scores.shape != (len(test),) or not np.allclose(scores, again, equal_nan=True):
            raise AssertionError(f"{name}: scores {scores.shape} differ after a save/load round trip")
        ran.append(name)
    return ran


def image_detector() -> str:
    """ODIN's scores on four images through a tiny torch classifier (`ImageClassifier.from_module`)."""
    import numpy as np
    import torch
    from PIL import Image

    import detectors
    from detectors import ImageSet
    from pipelines.classifier import ImageClassifier

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.body(x).mean(dim=(2, 3))
            return self.fc(h), h

    torch.manual_seed(0)
    classifier = ImageClassifier.from_module(Tiny().eval(), image_size=16)
    images = [Image.fromarray(np.full((16, 16, 3), 60 * i, np.uint8)) for i in range(4)]
    scores = detectors.build("odin", classifier=classifier).fit(ImageSet(images=images)).score(ImageSet(images=images))
    if scores.shape != (4,) or not np.isfinite(scores).all():
        raise AssertionError(f"odin: scores {scores}")
    return "odin"


def main() -> None:
    sys.path.insert(0, str(ROOT / "tests"))  # helpers.toys
    hidden = hide_outside(closure(core_requirements()))
    imported = record_library_imports()
    ran = feature_detectors()
    heavy = sorted(m for m, module in sys.modules.items()
                   if module is not None and (m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY))))
    ran.append(image_detector())
    import detectors

    listed = detectors.available()
    owners = importlib.metadata.packages_distributions()
    dists = {top: sorted({canonical(d) for d in owners.get(top, [top])}) for top in imported}
    print(json.dumps({"heavy_after_features": heavy, "ran": ran, "listed": len(listed),
                      "imported": {top: {"distributions": dists[top], "by": sorted(who)}
                                   for top, who in sorted(imported.items())},
                      "hidden": hidden}))


if __name__ == "__main__":
    main()
