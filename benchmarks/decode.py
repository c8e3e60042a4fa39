#!/usr/bin/env python
"""Image decoding and preprocessing per core at camera size, ours beside torchvision 0.14 (Debian's, under
/usr/bin/python3 with its own torch and Pillow, in a subprocess on the same files, interleaved, best of N):
`python -m benchmarks.decode` -> benchmarks/decode.json.

    nice python -m benchmarks.decode                            # 8 synthetic 3 MP JPEGs, 3 rounds
    python -m benchmarks.decode --images 64 --megapixels 12 --rounds 5

The images are made here: camera-like content (smooth colour fields, blobs, sharp edges, sensor noise) saved as
JPEG (quality 90, 4:2:0) at about `--megapixels`, sizes varied so the resized long side takes every value mod 4, every
other one with an EXIF orientation tag (6, 3 or 8). Each stage runs in one process on one thread without loader
workers (img/s per core):
- decode: a file to an RGB image at full size (torchvision: ImageFolder's loader, `Image.open(f).convert("RGB")`;
  ours: `load_image` with the stored orientation, as the references read images);
- eval: files -> Resize(128) + CenterCrop(126) -> normalised batches of 32 through a DataLoader (ours: the feature
  extractor's dataset, `pipelines.features.ManifestPixels`, full decode and draft; torchvision: an ImageFolder-style
  dataset with ToTensor + Normalize);
- train: files -> Open-Insect's ami transform -> normalised batches (ours: `ImageRows` through `make_loader`, full
  decode and draft; torchvision: RandomResizedCrop(126, 0.3-1), flip, RandAugment(2, 9), Resize, ToTensor, Normalize);
- decode_to_need: a file decoded to what the eval resize needs (twice its size): PIL's draft (ours), simplejpeg and
  PyTurboJPEG with DCT scaling (each when it imports here).
Tolerances: on each eval image, our pixels (full decode, draft) against torchvision's, in grey levels: max, mean and the
share of values more than 1 apart; per size class (the resized long side L mod 4).
"""
from __future__ import annotations

import io
import json
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from benchmarks.cases.tools import Torchvision
from pipelines.cli import parser, run_main
from pipelines.io import atomic_write_json

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGE_SIZE, PRE_SIZE, BATCH = 126, 128, 32
ORIENTATIONS = (1, 6, 1, 3, 1, 8)

def camera_like(width: int, height: int, seed: int) -> Image.Image:
    """A synthetic photo: a smooth colour field, blobs, sharp edges and sensor noise (JPEG-realistic content)."""
    rng = np.random.default_rng(seed)
    field = Image.fromarray(rng.integers(0, 256, (height // 64 + 2, width // 64 + 2, 3), dtype=np.uint8))
    base = np.asarray(field.resize((width, height), Image.BICUBIC), dtype=np.float32)
    blobs = Image.fromarray(rng.integers(0, 121, (height // 8 + 2, width // 8 + 2), dtype=np.uint8))
    mid = np.asarray(blobs.resize((width, height), Image.BILINEAR), dtype=np.float32)[..., None] - 60
    yy, xx = np.mgrid[0:height, 0:width]
    edges = ((((xx // 97) + (yy // 131)) % 2) * 50 - 25)[..., None].astype(np.float32)
    noise = rng.normal(0, 6, (height, width, 3)).astype(np.float32)
    return Image.fromarray(np.clip(base + mid + edges + noise, 0, 255).astype(np.uint8))


def make_images(folder: Path, count: int, megapixels: float) -> list[Path]:
    """`count` camera-like JPEGs of about `megapixels` (about 4:3; the long side set so that the eval resize's long
    side L = int(128 * long / short) runs through 168..171, every class mod 4), EXIF orientation on every other one."""
    height = int(round((megapixels * 1e6 * 3 / 4) ** 0.5))
    paths = []
    for i in range(count):
        short = height + i
        long_side = int(np.ceil(short * (168 + i % 4 + 0.5) / PRE_SIZE))
        image = camera_like(long_side, short, seed=i)
        exif = Image.Exif()
        if ORIENTATIONS[i % len(ORIENTATIONS)] != 1:
            exif[0x0112] = ORIENTATIONS[i % len(ORIENTATIONS)]
        path = folder / f"{i:04d}.jpg"
        image.save(path, "JPEG", quality=90, exif=exif.tobytes())
        paths.append(path)
    return paths


def timed(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def ours(files: list[Path]) -> dict[str, Callable[[], Any]]:
    """Our stages over `files` (the references' orientation: the stored pixel order)."""
    from pipelines.data import Manifest, load_image, make_row
    from pipelines.decode import Decode
    from pipelines.features import ManifestPixels, pixel_loader
    from pipelines.training.loaders import ImageRows, make_loader
    from pipelines.training.transforms import Normalize, reference_eval, reference_train

    manifest = Manifest(files[0].parent, [make_row(f.name, split="train", label=0) for f in files])
    normalize = Normalize(MEAN, STD)
    positions = list(range(len(files)))

    def evaluate(draft: bool) -> Callable[[], Any]:
        pixels = reference_eval(IMAGE_SIZE, PRE_SIZE, Decode(draft=draft, orient=False))
        return lambda: [normalize(x) for _, x, _ in pixel_loader(ManifestPixels(manifest, positions, pixels), BATCH, 0)]

    def train(draft: bool) -> Callable[[], Any]:
        transform = reference_train("ami", IMAGE_SIZE, PRE_SIZE, Decode(draft=draft, orient=False))
        rows = ImageRows(manifest, manifest.labels(), None, transform=transform)
        return lambda: [normalize(b["x"]) for b in make_loader(rows, BATCH, shuffle=False, seed=0, num_workers=0)]

    return {"decode": lambda: [load_image(f, orient=False) for f in files], "eval": evaluate(False),
            "eval_draft": evaluate(True), "train": train(False), "train_draft": train(True)}


def decoders(files: list[Path]) -> dict[str, Callable[[], Any]]:
    """Decoders to the eval resize's need (its shorter side at least twice the output's): PIL's draft, simplejpeg,
    PyTurboJPEG (those that import and run here)."""
    from pipelines.decode import DRAFT_HEADROOM, Decode, Region, decode
    from pipelines.training.transforms import resized_size

    blobs = [f.read_bytes() for f in files]
    need = []
    for data in blobs:
        with Image.open(io.BytesIO(data)) as img:
            need.append(tuple(int(DRAFT_HEADROOM * v) for v in resized_size(*img.size, PRE_SIZE)))
    how = Decode(draft=True, orient=False)
    found = {"pil_draft": lambda: [decode(f, how, lambda w, h: Region((0, 0, w, h), resized_size(w, h, PRE_SIZE)))
                                   for f in files]}
    try:
        import simplejpeg

        simplejpeg.decode_jpeg(blobs[0], colorspace="RGB", min_width=need[0][0], min_height=need[0][1])
        found["simplejpeg"] = lambda: [simplejpeg.decode_jpeg(d, colorspace="RGB", min_width=w, min_height=h)
                                       for d, (w, h) in zip(blobs, need)]
    except Exception:  # not installed, or no usable library: not a candidate here
        pass
    try:
        from turbojpeg import TJPF_RGB, TurboJPEG

        turbo = TurboJPEG()

        def scaled(data: bytes, want: tuple[int, int]) -> Any:
            width, height, _, _ = turbo.decode_header(data)
            factor = next((f for f in ((1, 8), (1, 4), (1, 2)) if width * f[0] / f[1] >= want[0]
                           and height * f[0] / f[1] >= want[1]), (1, 1))
            return turbo.decode(data, pixel_format=TJPF_RGB, scaling_factor=factor)

        scaled(blobs[0], need[0])
        found["pyturbojpeg"] = lambda: [scaled(d, n) for d, n in zip(blobs, need)]
    except Exception:  # PyTurboJPEG needs the system's libturbojpeg
        pass
    return found


def tolerance(files: list[Path], theirs: list[np.ndarray]) -> dict[str, Any]:
    """Our eval pixels (full decode, draft) against torchvision's, overall and per size class (L mod 4)."""
    from pipelines.decode import Decode
    from pipelines.training.transforms import reference_eval, resized_size

    out: dict[str, Any] = {}
    for name, draft in (("full_decode", False), ("draft", True)):
        pixels = reference_eval(IMAGE_SIZE, PRE_SIZE, Decode(draft=draft, orient=False))
        diffs, classes = [], {}
        for f, want in zip(files, theirs):
            got = pixels.load(f).permute(1, 2, 0).numpy().astype(np.int16)
            diff = np.abs(got - want.astype(np.int16))
            diffs.append(diff)
            with Image.open(f) as img:
                size_class = f"L={max(resized_size(*img.size, PRE_SIZE)) % 4} mod 4"
            entry = classes.setdefault(size_class, {"images": 0, "max": 0})
            entry["images"] += 1
            entry["max"] = max(entry["max"], int(diff.max()))
        every = np.stack(diffs)
        out[name] = {"max": int(every.max()), "mean": round(float(every.mean()), 4),
                     "share_over_1": round(float((every > 1).mean()), 5), "size_classes": dict(sorted(classes.items()))}
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, out=True)
    p.add_argument("--images", type=int, default=8, help="synthetic camera-sized JPEGs")
    p.add_argument("--megapixels", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best time of each counts")
    args = p.parse_args(argv)
    out = Path(args.out or Path(__file__).with_suffix(".json"))
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        files = make_images(Path(scratch), args.images, args.megapixels)
        tv = Torchvision(image_size=IMAGE_SIZE, pre_size=PRE_SIZE, batch=BATCH)
        try:
            numbers = measure(files, tv, args.rounds, Path(scratch))
        finally:
            tv.close()
    usage = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    result = {"benchmark": "decode", "created": datetime.now(UTC).isoformat(timespec="seconds"),
              "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
              "pillow": Image.__version__, "oracle": tv.versions, "threads": 1, "workers": 0,
              "settings": {"images": args.images, "megapixels": args.megapixels, "rounds": args.rounds,
                           "image_size": IMAGE_SIZE, "pre_size": PRE_SIZE, "batch": BATCH},
              **numbers, "peak_rss_mib": {"self": round(usage[0], 1), "children": round(usage[1], 1)}}
    atomic_write_json(out, result)
    print(json.dumps(result["stages"], indent=1))
    print(json.dumps(result["tolerance"], indent=1))
    print(f"wrote {out}")
    return 0


def measure(files: list[Path], tv: Torchvision, rounds: int, scratch: Path) -> dict[str, Any]:
    """Best-of-`rounds` img/s of every stage, ours and torchvision's interleaved; the candidates; the tolerances."""
    mine, candidates = ours(files), decoders(files)
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, float("inf")), seconds)

    for _ in range(rounds):
        for stage in ("decode", "eval", "train"):
            keep(f"torchvision_{stage}", tv.run(stage, files))
            for name in (stage, f"{stage}_draft"):
                if name in mine:
                    keep(f"ours_{name}", timed(mine[name]))
        for name, run in candidates.items():
            keep(f"candidate_{name}", timed(run))
    rate = {k: len(files) / v for k, v in best.items()}
    stages = {}
    for stage in ("decode", "eval", "train"):
        entry = {"torchvision_img_s": round(rate[f"torchvision_{stage}"], 2),
                 "ours_img_s": round(rate[f"ours_{stage}"], 2),
                 "ratio": round(rate[f"ours_{stage}"] / rate[f"torchvision_{stage}"], 3)}
        if f"ours_{stage}_draft" in rate:
            entry["ours_draft_img_s"] = round(rate[f"ours_{stage}_draft"], 2)
            entry["ratio_draft"] = round(rate[f"ours_{stage}_draft"] / rate[f"torchvision_{stage}"], 3)
        stages[stage] = entry
    stages["decode_to_need"] = {name: round(rate[f"candidate_{name}"], 2) for name in candidates}
    tv.run("pixels", files, out=str(scratch / "theirs.npz"))
    with np.load(scratch / "theirs.npz") as saved:
        theirs = [saved[f"arr_{i}"] for i in range(len(files))]
    return {"stages": stages, "tolerance": tolerance(files, theirs)}


if __name__ == "__main__":
    sys.exit(run_main(main, doc="README.md, section 'Commands'"))
