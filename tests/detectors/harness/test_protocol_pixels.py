"""Evaluation pixels end to end under `protocol: open-insects`, with the README's commands: train_classifier.py (recipe
open-insects-scratch: 126 px, the model folder records Resize(128) + CenterCrop(126)) -> evaluate.py. The run's
max-logit scores equal those of the reference's pixels, made by Debian's torchvision 0.14
(`Image.open(f).convert("RGB")` then Resize(128, bilinear) + CenterCrop(126): Open-Insect's imglist_dataset.py:83 and
test_preprocessor.py:14-21), on images of every size class (resized long side L mod 4, landscape and portrait, JPEGs
with EXIF orientation tags that the reference does not apply); a floor-offset crop's scores differ exactly where L = 1
(mod 4). The ID train features the fits read are the region branch's seeded draws, not the evaluation pixels
(`pixels.fit`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from pipelines.data import make_row, write_manifest
from pipelines.decode import Decode
from pipelines.training import transforms as T
from tests.pipelines.training.test_training_transforms import SYSTEM_PYTHON, _FloorCrop, needs_torchvision

ROOT = Path(__file__).resolve().parents[3]
SIZES = [(130, 96), (131, 96), (132, 96), (133, 96), (96, 134), (96, 135), (97, 129), (161, 120)]
"""(width, height): L = int(128 * long / short) = 173, 174, 176, 177, 178, 180, 170, 171: every class mod 4."""
ORACLE = r"""
import json, sys
import numpy as np
from PIL import Image
import torchvision.transforms as T

evaluate = T.Compose([T.Resize(128, interpolation=T.InterpolationMode.BILINEAR), T.CenterCrop(126)])
out = {}
for name in json.loads(open(sys.argv[1]).read()):
    with open(name, "rb") as fh:
        out[name] = np.asarray(evaluate(Image.open(fh).convert("RGB")))
np.savez(sys.argv[2], **{str(i): out[k] for i, k in enumerate(out)})
"""

pytestmark = pytest.mark.slow


def _image(path: Path, label: int, size: tuple[int, int], seed: int, orientation: int = 1) -> None:
    """A class-coloured image with noise (the class is learnable), as JPEG with an EXIF orientation tag or PNG."""
    rng = np.random.default_rng(seed)
    colour = np.array([[200, 40, 40], [40, 60, 200]][label], dtype=np.float32)
    pixels = np.clip(colour + rng.normal(0, 50, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
    if path.suffix == ".jpg":
        exif = Image.Exif()
        if orientation != 1:
            exif[0x0112] = orientation
        Image.fromarray(pixels).save(path, "JPEG", quality=92, exif=exif.tobytes())
    else:
        Image.fromarray(pixels).save(path)


def _data(root: Path) -> tuple[Path, Path, list[str]]:
    id_rows, ood_rows, tested = [], [], []
    (root / "id").mkdir()
    (root / "ood").mkdir()
    for i in range(40):
        split = "train" if i < 24 else "val" if i < 28 else "test"
        size = SIZES[i % len(SIZES)]
        name = f"{split}_{i}.{'jpg' if i % 2 else 'png'}"
        _image(root / "id" / name, i % 2, size, i, orientation=6 if i % 4 == 1 else 1)
        id_rows.append(make_row(name, split=split, role="id", label=i % 2, class_name=f"c{i % 2}"))
        if split == "test":
            tested.append(str(root / "id" / name))
    for i in range(8):
        name = f"ood_{i}.jpg"
        _image(root / "ood" / name, i % 2, SIZES[i], 100 + i, orientation=8 if i % 2 else 1)
        ood_rows.append(make_row(name, split="test", role="ood", ood_set="far", group="far"))
        tested.append(str(root / "ood" / name))
    write_manifest(root / "id", id_rows)
    write_manifest(root / "ood", ood_rows)
    return root / "id", root / "ood", tested


def _script(name: str, *args: str, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@needs_torchvision
def test_open_insects_scores_are_the_reference_pixels_scores(tmp_path):
    from pipelines.classifier import ImageClassifier
    from pipelines.tiny import RESNET_ID, save_tiny_model

    id_dir, ood_dir, tested = _data(tmp_path)
    save_tiny_model(tmp_path / "tiny_resnet", RESNET_ID)
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({"id": str(id_dir), "out": str(tmp_path / "classifier"),
                                                         "model": str(tmp_path / "tiny_resnet"), "pretrained": False,
                                                         "recipe": "open-insects-scratch"}))
    _script("train_classifier.py", "--config", tmp_path / "train.yaml", "epochs=1", "warmup_epochs=0", "batch_size=8",
            cwd=tmp_path)
    model = tmp_path / "classifier"
    assert json.loads((model / "eval_pixels.json").read_text()) == {
        "transform": "reference", "image_size": 126, "pre_size": 128, "resample": "bilinear", "orient": False}
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump({
        "model": str(model), "id": str(id_dir), "ood": [{"manifest": str(ood_dir)}], "out": str(tmp_path / "run"),
        "protocol": "open-insects", "detectors": ["mls", {"name": "knn", "params": {"k": 3}}]}))
    _script("evaluate.py", "--config", tmp_path / "eval.yaml", cwd=tmp_path)
    scores = pd.read_parquet(tmp_path / "run" / "scores.parquet")
    mls = scores[scores.method == "mls"]
    ours = dict(zip(mls["file_name"], mls["score"]))  # ID test_* and OOD ood_* names do not clash

    (tmp_path / "files.json").write_text(json.dumps(tested))
    (tmp_path / "oracle.py").write_text(ORACLE)
    done = subprocess.run([SYSTEM_PYTHON, str(tmp_path / "oracle.py"), str(tmp_path / "files.json"),
                           str(tmp_path / "theirs.npz")], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = np.load(tmp_path / "theirs.npz")
    clf = ImageClassifier.from_pretrained(model).eval()
    pixels = torch.from_numpy(np.stack([theirs[str(i)] for i in range(len(tested))])).permute(0, 3, 1, 2).contiguous()
    floor = T.Compose([T.Resize(128), _FloorCrop(126)], Decode(orient=False))  # transformers' centre-crop offsets
    floored = torch.stack([floor.load(name) for name in tested])
    with torch.no_grad():
        reference = clf(clf.standardize(pixels))[0].max(1).values.double().numpy()
        floor_scores = clf(clf.standardize(floored))[0].max(1).values.double().numpy()
    got = np.array([ours[Path(name).name] for name in tested])
    classes = []
    for name in tested:
        with Image.open(name) as img:
            classes.append(int(128 * max(img.size) / min(img.size)) % 4)
    classes = np.array(classes)
    assert set(classes) == {0, 1, 2, 3}
    # Pillow 13 against Debian's 9.4: one grey level at most in the resize, far below a crop offset's effect
    tolerance = 1e-3 * np.abs(reference).max()
    np.testing.assert_allclose(got, reference, rtol=0, atol=tolerance)
    off = np.abs(floor_scores - reference) > tolerance
    assert np.array_equal(off, classes == 1), (off, classes)  # the floor offset: one pixel off where L = 1 (mod 4)

    # the fits read the region branch's seeded draws of the ID train rows (pixels.fit), the test rows the eval pixels
    from pipelines.data import read_manifest
    from pipelines.features import FeatureCache, extract_features
    from pipelines.pixels import run_pixels

    (cache,) = (tmp_path / "run" / "cache").glob("id-id_train-*.safetensors")
    saved = FeatureCache.load(cache).features
    train = read_manifest(id_dir).select(split="train", role="id")
    chosen = run_pixels(clf, "open-insects")
    clf.pixels = chosen.eval
    drawn = extract_features(clf, train, num_workers=0, pixels=chosen.fit, seed=0).features
    evaluated = extract_features(clf, train, num_workers=0).features
    np.testing.assert_allclose(saved, drawn, rtol=1e-4, atol=1e-4)
    assert not np.allclose(saved, evaluated, rtol=1e-3, atol=1e-3)
