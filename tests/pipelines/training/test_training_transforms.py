"""pipelines.training.transforms against torchvision itself (Debian's python3-torchvision under /usr/bin/python3, its
own torch, in a separate process: `apt-get install -y python3-torchvision`) and against hand computations.

Each deterministic op is compared pixel for pixel at fixed parameters (the oracle's PIL is Debian's, ours the venv's:
resampling filters may differ by one grey level); the random ops' sampling rules are checked by hand.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.training import transforms as T

pytestmark = pytest.mark.slow  # its module fixture alone takes seconds (make test-fast leaves it out)

SYSTEM_PYTHON = "/usr/bin/python3"

ORACLE = r"""
import json, math, sys
import numpy as np
from PIL import Image
import torch
import torchvision.transforms.functional as F
from torchvision.transforms import InterpolationMode, RandAugment
from torchvision.transforms.autoaugment import _apply_op

spec = json.loads(open(sys.argv[1]).read())
images = np.load(sys.argv[2])
out = {}
for case in spec["cases"]:
    img = Image.fromarray(images[case["image"]])
    kind = case["kind"]
    if kind == "op":
        res = _apply_op(img, case["op"], case["magnitude"], interpolation=InterpolationMode.NEAREST, fill=None)
    elif kind == "resize":
        res = F.resize(img, case["size"], interpolation=InterpolationMode.BILINEAR)
    elif kind == "center_crop":
        res = F.center_crop(img, case["size"])
    elif kind == "resized_crop":
        top, left, h, w = case["box"]
        res = F.resized_crop(img, top, left, h, w, [case["size"], case["size"]],
                             interpolation=InterpolationMode.BILINEAR)
    elif kind == "pad_crop":
        top, left = case["at"]
        res = F.crop(F.pad(img, case["padding"], fill=0), top, left, case["size"], case["size"])
    out[case["name"]] = np.asarray(res)
space = RandAugment()._augmentation_space(31, (spec["height"], spec["width"]))
table = {name: [float(m[9]) if m.ndim else 0.0, bool(signed)] for name, (m, signed) in space.items()}
np.savez(sys.argv[3], **out)
open(sys.argv[4], "w").write(json.dumps({"ops": list(space), "table": table}))
"""


def _has_torchvision() -> bool:
    if not Path(SYSTEM_PYTHON).is_file():
        return False
    return subprocess.run([SYSTEM_PYTHON, "-c", "import torchvision"], capture_output=True).returncode == 0


needs_torchvision = pytest.mark.skipif(
    not _has_torchvision(), reason="the oracle is Debian's torchvision: apt-get install -y python3-torchvision "
                                   "(it runs under /usr/bin/python3 with its own torch)")


def _images() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    smooth = np.stack(np.meshgrid(np.linspace(0, 255, 57), np.linspace(30, 200, 43)), -1)
    smooth = np.concatenate([smooth, (smooth[..., :1] * 0.5 + 40)], -1)
    return {"noise": rng.integers(0, 256, (43, 57, 3), dtype=np.uint8),  # H=43, W=57: odd, not square
            "smooth": np.clip(smooth + rng.normal(0, 8, smooth.shape), 0, 255).astype(np.uint8),
            "tall": rng.integers(0, 256, (70, 31, 3), dtype=np.uint8)}


def _cases() -> list[dict]:
    cases = []
    for image in ("noise", "smooth"):
        for op in T.RANDAUGMENT_OPS:
            magnitude, signed = T.randaugment_magnitude(op, 9, 31, 57, 43)
            for sign in ((1, -1) if signed else (1,)):
                cases.append({"name": f"{image}-{op}-{sign}", "kind": "op", "image": image, "op": op,
                              "magnitude": sign * magnitude})
    for image in ("noise", "tall"):
        for size in (20, 128, [30, 40]):
            cases.append({"name": f"{image}-resize-{size}", "kind": "resize", "image": image, "size": size})
        for size in (20, 25, 64):
            cases.append({"name": f"{image}-center-{size}", "kind": "center_crop", "image": image, "size": size})
        cases.append({"name": f"{image}-rrc", "kind": "resized_crop", "image": image, "box": [3, 5, 21, 17],
                      "size": 26})
        cases.append({"name": f"{image}-padcrop", "kind": "pad_crop", "image": image, "padding": 4, "at": [0, 7],
                      "size": 26})
    return cases


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """torchvision's outputs for every case, its RandAugment op list and magnitude table (one subprocess)."""
    folder = tmp_path_factory.mktemp("oracle")
    images = _images()
    np.savez(folder / "images.npz", **images)
    (folder / "spec.json").write_text(json.dumps({"cases": _cases(), "height": 43, "width": 57}))
    (folder / "oracle.py").write_text(ORACLE)
    done = subprocess.run([SYSTEM_PYTHON, str(folder / "oracle.py"), str(folder / "spec.json"),
                           str(folder / "images.npz"),
                           str(folder / "out.npz"), str(folder / "table.json")], capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return images, dict(np.load(folder / "out.npz")), json.loads((folder / "table.json").read_text())


class _Draws:
    """A generator stand-in whose `integers` returns the given values in order."""

    def __init__(self, values: list[int]):
        self.values = list(values)

    def integers(self, low: int, high: int) -> int:
        value = self.values.pop(0)
        assert low <= value < high
        return value


def _ours(case: dict, image: Image.Image) -> np.ndarray:
    kind = case["kind"]
    if kind == "op":
        return np.asarray(T.apply_op(image, case["op"], case["magnitude"]))
    if kind == "resize":
        size = case["size"] if isinstance(case["size"], int) else tuple(case["size"])
        return np.asarray(T.Resize(size)(image))
    if kind == "center_crop":
        return np.asarray(T.CenterCrop(case["size"])(image))
    if kind == "resized_crop":
        top, left, h, w = case["box"]
        crop = T.RandomResizedCrop(case["size"])
        crop.box = lambda *_: (left, top, w, h)
        return np.asarray(crop(image, None))
    padded = T.RandomCrop(case["size"], padding=case["padding"])
    fixed = _Draws(case["at"])  # torchvision draws the top offset, then the left one
    return np.asarray(padded(image, fixed))


@needs_torchvision
def test_randaugment_op_list_and_magnitudes_are_torchvisions(oracle):
    _, _, table = oracle
    assert list(T.RANDAUGMENT_OPS) == table["ops"]
    for op, (magnitude, signed) in table["table"].items():
        ours = T.randaugment_magnitude(op, 9, 31, 57, 43)
        assert ours[1] == signed and ours[0] == pytest.approx(magnitude, rel=1e-6, abs=1e-6), op


@needs_torchvision
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_each_op_matches_torchvision(oracle, case):
    images, theirs, _ = oracle
    ours = _ours(case, Image.fromarray(images[case["image"]]))
    want = theirs[case["name"]]
    assert ours.shape == want.shape
    diff = np.abs(ours.astype(int) - want.astype(int))
    # the venv's PIL (13) and Debian's (9.4) round a downscaling filter's sums differently: one grey level at most
    resampled = case["kind"] in ("resize", "resized_crop")
    assert diff.max() <= (1 if resampled else 0), (case["name"], int(diff.max()), float((diff > 0).mean()))


def test_center_crop_rounds_offsets_and_pads_small_images():
    image = Image.fromarray(np.arange(5 * 8 * 3, dtype=np.uint8).reshape(5, 8, 3))
    got = np.asarray(T.CenterCrop(3)(image))
    # (8 - 3) / 2 = 2.5 rounds to 2 (half to even), (5 - 3) / 2 = 1
    assert np.array_equal(got, np.asarray(image)[1:4, 2:5])
    padded = np.asarray(T.CenterCrop(7)(image))
    assert padded.shape == (7, 7, 3) and (padded[0] == 0).all() and np.array_equal(padded[1:6, :],
                                                                                   np.asarray(image)[:, 0:7])


def test_resize_keeps_the_aspect_with_a_truncated_long_side():
    assert T.resized_size(57, 43, 128) == (int(128 * 57 / 43), 128)
    assert T.resized_size(31, 70, 128) == (128, int(128 * 70 / 31))
    assert T.resized_size(31, 70, (30, 40)) == (40, 30)


def test_random_crop_pads_with_zeros_and_covers_every_offset():
    image = Image.new("RGB", (10, 10), (200, 100, 50))
    crop = T.RandomCrop(10, padding=4)
    rng = np.random.default_rng(0)
    corners = {tuple(np.asarray(crop(image, rng))[0, 0]) for _ in range(200)}
    assert corners == {(0, 0, 0), (200, 100, 50)}
    tops = [int(np.random.default_rng([s]).integers(0, 9)) for s in range(300)]
    assert set(tops) == set(range(9))


def test_random_resized_crop_box_follows_the_scale_and_ratio():
    crop = T.RandomResizedCrop(126, scale=(0.3, 1.0))
    rng = np.random.default_rng(1)
    boxes = [crop.box(200, 150, rng) for _ in range(500)]
    shares = np.array([w * h / (200 * 150) for _, _, w, h in boxes])
    ratios = np.array([w / h for _, _, w, h in boxes])
    assert all(0 <= l and 0 <= t and l + w <= 200 and t + h <= 150 for l, t, w, h in boxes)
    assert shares.min() > 0.29 and shares.max() <= 1.0 + 1e-9
    assert ratios.min() > 0.74 and ratios.max() < 1.34
    # a strip far outside the ratio range takes the fallback: the centre crop clamped to ratio 4/3
    wide = T.RandomResizedCrop(8, scale=(0.99, 1.0))
    assert wide.box(400, 10, np.random.default_rng(0)) == ((400 - 13) // 2, 0, 13, 10)


def test_randaugment_draws_two_ops_with_random_signs():
    ra = T.RandAugment(2, 9)
    rng = np.random.default_rng(0)
    draws = [ra.draws(126, 126, rng) for _ in range(2000)]
    assert all(len(d) == 2 for d in draws)
    names = [op for d in draws for op, _ in d]
    counts = np.array([names.count(op) for op in T.RANDAUGMENT_OPS])
    assert counts.min() > 0.7 * len(names) / 14  # uniform over the 14 ops
    rotations = {m for d in draws for op, m in d if op == "Rotate"}
    assert rotations == {9.0, -9.0}  # 30 degrees * 9 / 30, either sign


def test_reference_pipelines_give_the_reference_sizes_and_vary_per_draw():
    image = Image.fromarray(_images()["noise"]).resize((160, 120))
    ami, region = T.reference_train("ami", 126, 128), T.reference_train("region", 126, 128)
    evaluation = T.reference_eval(126, 128)
    for tf in (ami, region, evaluation):
        assert tuple(tf(image, np.random.default_rng(0)).shape) == (3, 126, 126)
    for tf in (ami, region):
        a, b = tf(image, np.random.default_rng([0, 0, 3])), tf(image, np.random.default_rng([0, 1, 3]))
        assert not np.array_equal(a.numpy(), b.numpy())  # another epoch, other pixels
        assert np.array_equal(a.numpy(), tf(image, np.random.default_rng([0, 0, 3])).numpy())  # same seed, same pixels
    expected = np.asarray(image.resize((170, 128), Image.BILINEAR))[1:127, 22:148]  # round(44 / 2) = 22, round(2 / 2) =
                                                                                    # 1
    assert np.array_equal(evaluation(image).permute(1, 2, 0).numpy(), expected)


# -- the evaluation transform on files, against torchvision 0.14 ------------------------------------------------------
FILE_ORACLE = r"""
import json, sys
import numpy as np
from PIL import Image, ImageOps
import torchvision.transforms as T

files = json.loads(open(sys.argv[1]).read())
evaluate = T.Compose([T.Resize(128, interpolation=T.InterpolationMode.BILINEAR), T.CenterCrop(126)])
out = {}
for i, f in enumerate(files):
    with open(f, "rb") as fh:  # torchvision.datasets.folder.pil_loader, as Open-Insect's ImglistDataset reads
        img = Image.open(fh)
        out[f"stored{i}"] = np.asarray(evaluate(img.convert("RGB")))
    with open(f, "rb") as fh:
        out[f"upright{i}"] = np.asarray(evaluate(ImageOps.exif_transpose(Image.open(fh)).convert("RGB")))
np.savez(sys.argv[2], **out)
"""
EVAL_TOLERANCE = 1  # Pillow 13 against Debian's 9.4: a downscaling filter's sums rounded apart by one grey level
DRAFT_TOLERANCE = {"max": 4, "mean": 0.75}  # draft (DCT scale keeping twice the output) against the full decode, on
# camera-like content (benchmarks/decode.json: max 3, mean 0.44 at 3 MP); pure noise or hard 32 px blocks reach 7


def _sized_files(folder: Path) -> list[tuple[Path, int]]:
    """(file, L mod 4): small noise images whose resized long side L = int(128 * long / short) takes each class mod 4
    (landscape and portrait), and two camera-sized JPEGs (3 MP) with L = 1 and 3 mod 4, one with EXIF orientation 6."""
    rng = np.random.default_rng(5)
    made = []
    for i, (w, h) in enumerate([(130, 96), (131, 96), (132, 96), (133, 96), (96, 134), (96, 135), (97, 129),
                                (200, 150)]):
        path = folder / f"small{i}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        made.append((path, int(128 * max(w, h) / min(w, h)) % 4))
    for i, (w, orientation) in enumerate([(2030, 6), (2054, 1)]):
        field = (Image.fromarray(rng.integers(0, 256, (26, w // 64 + 2, 3), dtype=np.uint8))
                 .resize((w, 1536), Image.BICUBIC))
        yy, xx = np.mgrid[0:1536, 0:w]
        edges = ((((xx // 97) + (yy // 131)) % 2) * 50 - 25)[..., None]  # camera-like: smooth colour, edges, sensor
                                                                         # noise
        image = np.clip(np.asarray(field, np.float32) + edges + rng.normal(0, 6, (1536, w, 3)), 0, 255).astype(np.uint8)
        exif = Image.Exif()
        if orientation != 1:
            exif[0x0112] = orientation
        path = folder / f"camera{i}.jpg"
        Image.fromarray(image).save(path, "JPEG", quality=90, exif=exif.tobytes())
        made.append((path, int(128 * w / 1536) % 4))
    return made


@pytest.fixture(scope="module")
def file_oracle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files")
    files = _sized_files(folder)
    (folder / "files.json").write_text(json.dumps([str(f) for f, _ in files]))
    (folder / "oracle.py").write_text(FILE_ORACLE)
    done = subprocess.run([SYSTEM_PYTHON, str(folder / "oracle.py"), str(folder / "files.json"),
                           str(folder / "out.npz")],
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return files, dict(np.load(folder / "out.npz"))


@needs_torchvision
def test_reference_eval_equals_torchvision_on_every_size_class_and_draft_stays_within_its_tolerance(file_oracle):
    from pipelines.decode import Decode

    files, theirs = file_oracle
    assert {c for _, c in files} == {0, 1, 2, 3}
    floor_differs = []
    for i, (path, size_class) in enumerate(files):
        for orient, key in ((False, "stored"), (True, "upright")):
            ours = T.reference_eval(126, 128, Decode(orient=orient)).load(path).permute(1, 2, 0).numpy().astype(int)
            want = theirs[f"{key}{i}"].astype(int)
            assert ours.shape == want.shape == (126, 126, 3)
            assert np.abs(ours - want).max() <= EVAL_TOLERANCE, (path.name, orient, size_class)
        drafted = T.reference_eval(126, 128, Decode(draft=True, orient=False)).load(path).permute(1, 2, 0).numpy()
        diff = np.abs(drafted.astype(int) - theirs[f"stored{i}"].astype(int))
        assert diff.max() <= DRAFT_TOLERANCE["max"] and diff.mean() <= DRAFT_TOLERANCE["mean"], (path.name, diff.max(),
                                                                                                 diff.mean())
        # a floor offset (transformers' centre crop) is one pixel off exactly where L = 1 (mod 4)
        floor = T.Compose([T.Resize(128), _FloorCrop(126)], Decode(orient=False)).load(path).permute(1, 2, 0).numpy()
        floor_differs.append((size_class, int(np.abs(floor.astype(int) - theirs[f"stored{i}"].astype(int)).max())))
    assert all((size_class == 1) == (worst > EVAL_TOLERANCE) for size_class, worst in floor_differs), floor_differs


class _FloorCrop:
    """A centre crop with floor offsets (the image processor's)."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, image, rng=None):
        left, top = (image.width - self.size) // 2, (image.height - self.size) // 2
        return image.crop((left, top, left + self.size, top + self.size))
