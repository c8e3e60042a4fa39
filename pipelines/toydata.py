"""The embedded default data set (no download): scikit-learn's bundled digits as ID and OOD manifests.

ID: digits 0-5 (split 4:1:5 per class). OOD: digits 6-9 (`digits_6_9`, near), edge-sketch renderings of held-out ID
digits made with opencv (`sketch`, near), and synthetic textures (`texture`, far).
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from pipelines.data import make_row, write_manifest

ID_CLASSES = (0, 1, 2, 3, 4, 5)
SIZE = 32


def _digit_image(pixels: np.ndarray) -> Image.Image:
    """An 8x8 digit (0-16) -> a 32x32 RGB image, white strokes on black, smoothly upscaled."""
    gray = (pixels.reshape(8, 8) / 16.0 * 255.0).astype(np.uint8)
    big = cv2.resize(gray, (SIZE, SIZE), interpolation=cv2.INTER_CUBIC)
    return Image.fromarray(big).convert("RGB")


def _sketch(image: Image.Image) -> Image.Image:
    """A sketch-like rendering: Canny edges of the digit, dilated once."""
    edges = cv2.Canny(np.asarray(image.convert("L")), 60, 140)
    edges = cv2.dilate(edges, np.ones((2, 2), np.uint8))
    return Image.fromarray(edges).convert("RGB")


def _texture(rng: np.random.Generator) -> Image.Image:
    """Band-limited noise or stripes, coloured at random."""
    if rng.random() < 0.5:
        noise = cv2.GaussianBlur(rng.random((SIZE, SIZE)).astype(np.float32), (0, 0), rng.uniform(0.8, 2.5))
    else:
        yy, xx = np.mgrid[:SIZE, :SIZE]
        angle, freq = rng.uniform(0, np.pi), rng.uniform(0.2, 0.9)
        noise = 0.5 + 0.5 * np.sin(freq * (xx * np.cos(angle) + yy * np.sin(angle)))
    noise = (noise - noise.min()) / (np.ptp(noise) + 1e-8)
    colour = rng.uniform(0.3, 1.0, size=3)
    return Image.fromarray((noise[..., None] * colour * 255).astype(np.uint8))


def write_digits(root: str | Path, seed: int = 0, n_textures: int = 200) -> tuple[Path, Path]:
    """Write `root/id` and `root/ood` manifests; returns their folders."""
    from sklearn.datasets import load_digits

    root = Path(root)
    rng = np.random.default_rng(seed)
    digits = load_digits()
    id_rows, ood_rows = [], []
    for label in ID_CLASSES:
        idx = rng.permutation(np.flatnonzero(digits.target == label))
        n_train, n_val = int(len(idx) * 0.4), int(len(idx) * 0.1)
        for rank, i in enumerate(idx):
            split = "train" if rank < n_train else "val" if rank < n_train + n_val else "test"
            name = f"{split}/{label}/{i:04d}.png"
            image = _digit_image(digits.data[i])
            (root / "id" / name).parent.mkdir(parents=True, exist_ok=True)
            image.save(root / "id" / name)
            id_rows.append(make_row(name, split=split, role="id", label=label, class_name=f"digit {label}"))
            if split == "test" and rank % 2 == 0:
                sketch = f"sketch/{label}_{i:04d}.png"
                (root / "ood" / sketch).parent.mkdir(parents=True, exist_ok=True)
                _sketch(image).save(root / "ood" / sketch)
                ood_rows.append(make_row(sketch, split="test", role="ood", ood_set="sketch", group="near",
                                         source_label=label))
    for i in np.flatnonzero(digits.target > max(ID_CLASSES)):
        name = f"digits_6_9/{digits.target[i]}_{i:04d}.png"
        (root / "ood" / name).parent.mkdir(parents=True, exist_ok=True)
        _digit_image(digits.data[i]).save(root / "ood" / name)
        ood_rows.append(make_row(name, split="test", role="ood", ood_set="digits_6_9", group="near",
                                 digit=int(digits.target[i])))
    (root / "ood" / "texture").mkdir(parents=True, exist_ok=True)
    for i in range(n_textures):
        name = f"texture/{i:04d}.png"
        _texture(rng).save(root / "ood" / name)
        ood_rows.append(make_row(name, split="test", role="ood", ood_set="texture", group="far"))
    write_manifest(root / "id", id_rows)
    write_manifest(root / "ood", ood_rows)
    return root / "id", root / "ood"


def tiny_digit_classifier_config(num_labels: int = len(ID_CLASSES)):
    """A small transformers ResNet for 32x32 digits and its image processor (random weights)."""
    from transformers import ResNetConfig, ViTImageProcessor

    config = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1], layer_type="basic",
                          num_labels=num_labels, downsample_in_first_stage=False)
    config.id2label = {i: f"digit {c}" for i, c in enumerate(ID_CLASSES[:num_labels])}
    config.label2id = {v: k for k, v in config.id2label.items()}
    processor = ViTImageProcessor(size={"height": SIZE, "width": SIZE}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return config, processor
