"""Stand-ins of the released Open-Insect benchmark (RolnickLab/Open-Insect e0aa51e; the hub dataset
yuyan-chen/open-insect at revision d175689), sizes shrunk, layout, names and columns kept:

- `download_folder`: download.py's output, `images/<dataset key>/<gbifID>.jpg` and the OpenOOD image lists
  `metadata/<region>/<split>.txt` (`<image_path> <label>`, the repository's example/metadata), download_bci.py's
  `images/bci/<image_path>` + `metadata/c-america/test_ood_bci.txt` (`bci/<image_path> -1`);
- `category_map`: `data/<region>_category_map.json`, GBIF speciesKey (a string) -> label index;
- `hub_files`: the dataset repository as the hub stores it: README.md whose YAML `configs` name
  `<region>/<split>.csv` per split (the hub's split names: `val_aux`, `test_ood_non_local`, `test_ood_non_moth`; the
  files keep the hyphens), CSV columns identifier, image_path, label (+ speciesKey);
- `bci_files`: the BCI repository as `datasets.push_to_hub` writes it, `data/test-00000-of-00001.parquet` with
  `image` ({bytes, path}, the Image feature's storage) and `image_path`.
"""
from __future__ import annotations

import hashlib
import io
import json
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

DATASET_KEYS = ("50c9509d-22c7-4a22-a47d-8c48425ef4a7", "040c5662-da76-4782-a48e-cdea1892d14c",
                "8a863029-f435-446a-821e-275f4f641165")
"""GBIF dataset keys the example's image folders are named by (iNaturalist, Observation.org, ...)."""
SIZES = {"train_id": 4, "val_id": 2, "test_id": 2, "test_ood_local": 6, "test_ood_non-local": 5,
         "test_ood_non-moth": 5, "train_aux": 8, "val_ood": 6}
"""Rows a split (ID splits: a class); the example has 1 train image a class and 10 in each other split."""
HUB_SPLITS = {"train_id": "train_id", "train_aux": "train_aux", "val_id": "val_id", "val_aux": "val_ood",
              "test_id": "test_id", "test_ood_local": "test_ood_local", "test_ood_non_local": "test_ood_non-local",
              "test_ood_non_moth": "test_ood_non-moth"}
"""The hub card's split name -> download.py's (the card's file names keep the hyphens)."""


def species_image(key: str, seed: int, size: int = 32) -> Image.Image:
    """A small image whose colour layout is the species' (a hash) plus per-image noise."""
    code = hashlib.sha256(str(key).encode()).digest()
    base = np.array(list(code[:12]), dtype=np.float32).reshape(2, 2, 3)
    pixels = np.kron(base, np.ones((size // 2, size // 2, 1))) + np.random.default_rng(seed).normal(0, 12,
                                                                                                  (size, size, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def jpeg_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def category_map(classes: int, seed: int = 0) -> dict[str, int]:
    """speciesKey -> label, keys sorted as the released maps are (label 0 the smallest key)."""
    keys = sorted(np.random.default_rng(seed).choice(np.arange(1_700_000, 1_800_000), classes, replace=False))
    return {str(k): i for i, k in enumerate(keys)}


def released_rows(classes: int = 6, seed: int = 0) -> dict[str, pd.DataFrame]:
    """download.py's split -> rows (identifier, image_path, label, speciesKey), OOD species keys outside the map."""
    species = list(category_map(classes, seed))
    rng = np.random.default_rng(seed)
    ids = iter(1_000_000_000 + rng.choice(3_500_000_000, 10_000, replace=False))
    splits = {}
    for name, size in SIZES.items():
        rows = []
        ood = not name.endswith("_id")
        for i in range(size if ood else size * classes):
            label = -1 if ood else i % classes
            key = species[label] if not ood else str(5_000_000 + 100 * list(SIZES).index(name) + i % 3)
            gbif = int(next(ids))
            folder = DATASET_KEYS[2] if name == "test_ood_non-moth" else DATASET_KEYS[i % 2]
            path = f"{folder}/{gbif}.jpg"
            rows.append({"identifier": f"/img/{gbif}.jpg", "image_path": path, "label": label, "speciesKey": key})
        splits[name] = pd.DataFrame(rows)
    return splits


def bci_rows(n: int = 5) -> pd.DataFrame:
    return pd.DataFrame({"image_path": [f"BCI_{i:04d}.jpg" for i in range(n)]})


def download_folder(root: Path, region: str = "c-america", classes: int = 6, seed: int = 0,
                    bci: int = 5) -> dict[str, pd.DataFrame]:
    """download.py's folder (and download_bci.py's, `bci` images) under `root`; returns the released rows."""
    splits = released_rows(classes, seed)
    meta = root / "metadata" / region
    meta.mkdir(parents=True)
    for name, frame in splits.items():
        for i, row in enumerate(frame.itertuples(index=False)):
            path = root / "images" / row.image_path
            path.parent.mkdir(parents=True, exist_ok=True)
            species_image(row.speciesKey, zlib.crc32(f"{name}/{i}".encode())).save(path, quality=90)
        (meta / f"{name}.txt").write_text("".join(f"{p} {lab}\n" for p, lab in zip(frame.image_path, frame.label)))
    if bci:
        folder = root / "images" / "bci"
        folder.mkdir(parents=True)
        for i, name in enumerate(bci_rows(bci)["image_path"]):
            species_image(f"bci{i % 3}", 90_000 + i).save(folder / name)
        (root / "metadata" / "c-america" / "test_ood_bci.txt").write_text(
            "".join(f"bci/{p} -1\n" for p in bci_rows(bci)["image_path"]))
    return splits


def hub_card(region: str = "c-america") -> str:
    """The dataset card's YAML front matter (its configs' data_files) for one region."""
    lines = ["---", "configs:", f"- config_name: {region}", "  data_files:"]
    for split, name in HUB_SPLITS.items():
        lines += [f"  - split: {split}", f"    path: {region}/{name}.csv"]
    return "\n".join(lines + ["license: cc-by-nc-sa-4.0", "pretty_name: Open-Insect", "---", "## Description", ""])


def hub_files(root: Path, base_url: str, region: str = "c-america", classes: int = 6,
              seed: int = 0) -> dict[str, pd.DataFrame]:
    """The dataset repository's files (README.md + `<region>/<split>.csv`), URLs on `base_url`."""
    splits = released_rows(classes, seed)
    (root / region).mkdir(parents=True)
    (root / "README.md").write_text(hub_card(region))
    for name, frame in splits.items():
        frame.assign(identifier=base_url + frame["identifier"]).to_csv(root / region / f"{name}.csv", index=False)
    return splits


def bci_files(root: Path, n: int = 5) -> pd.DataFrame:
    """The BCI repository's Parquet shard: image ({bytes, path}) and image_path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = bci_rows(n)
    images = [{"bytes": jpeg_bytes(species_image(f"bci{i % 3}", 90_000 + i)), "path": name}
              for i, name in enumerate(rows["image_path"])]
    (root / "data").mkdir(parents=True)
    table = pa.table({"image": images, "image_path": rows["image_path"].tolist()})
    pq.write_table(table, root / "data" / "test-00000-of-00001.parquet")
    return rows.assign(image=images)


def write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value))
    return path
