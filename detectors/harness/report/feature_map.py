"""Feature maps of the data types (ShiftedBronzes Figure 2(c)): N random images per set, the features of one or more
models (an image classifier's penultimate layer, CLIP's image embedding), a 2-D embedding (t-SNE), one PNG per model.

Features are cached by content (the model's weights and preprocessing, the sampled rows and their image files), so a
rerun with the same sample reuses them: classifier features through `pipelines.features`, CLIP features through
`detectors.clip.features`.
"""
from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipelines.data import Manifest, read_manifest
from pipelines.errors import UserInputError

EMBEDDINGS = ("tsne", "opentsne", "umap")


@dataclass(frozen=True)
class Sample:
    """The sampled rows of one set (`name`), in manifest order."""

    name: str
    manifest: Manifest


def sample_sets(id_manifest: str | os.PathLike, ood_manifests: Sequence[str | os.PathLike], n: int, seed: int,
                split: str = "test", sets: Sequence[str] | None = None) -> list[Sample]:
    """`n` random rows (all when fewer) of the ID rows and of each OOD set of split `split`; set `s` draws with the
    seed (`seed`, crc32(s)), so a set's sample does not depend on the other sets."""
    parts = [("ID", read_manifest(id_manifest).select(role="id", split=split))]
    for folder in ood_manifests:
        manifest = read_manifest(folder).select(role="ood", split=split)
        parts += [(name, manifest.select(ood_set=name)) for name in manifest.ood_sets() if not sets or name in sets]
    samples = []
    for name, part in parts:
        if not len(part):
            raise UserInputError(f"feature map: set {name!r} has no rows with split {split!r}")
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        keep = np.sort(rng.choice(len(part), size=min(n, len(part)), replace=False))
        samples.append(Sample(name, Manifest(part.root, [part.rows[i] for i in keep])))
    return samples


Features = tuple[np.ndarray, np.ndarray]
"""Features [N, D] of a sample's rows and their positions [N] in the sample (rows that failed to load are absent)."""


def classifier_features(folder: str | os.PathLike, samples: list[Sample], cache_dir: Path, batch_size: int = 64,
                        device: str | None = None, protocol: str = "exact") -> list[Features]:
    """Penultimate-layer features of an image classifier folder, per sample, with the evaluation pixels of `protocol`
    (`pipelines.pixels.run_pixels`; `exact`: the folder's recorded transform, else its processor)."""
    from pipelines.classifier import ImageClassifier
    from pipelines.features import cache_path, extract_features
    from pipelines.fingerprint import combine, images_fingerprint, preprocessing_fingerprint, weights_fingerprint
    from pipelines.pixels import run_pixels

    clf = ImageClassifier.from_pretrained(str(folder)).eval()
    clf.pixels = run_pixels(clf, protocol, record=clf.record).eval
    model_key = combine("feature-map-v1", weights_fingerprint(clf), preprocessing_fingerprint(clf))
    out = []
    for sample in samples:
        key = combine(model_key, images_fingerprint(sample.manifest))
        cache = extract_features(clf, sample.manifest, batch_size=batch_size, device=device, key=key, desc=sample.name,
                                 cache=cache_path(cache_dir, f"fmap-{sample.name}", key))
        out.append((np.asarray(cache.features, dtype=np.float32), np.asarray(cache.index, dtype=np.int64)))
    return out


def clip_features(model: str, samples: list[Sample], cache_dir: Path, batch_size: int = 64,
                  device: str | None = None) -> list[Features]:
    """CLIP image embeddings per sample."""
    from detectors.base import ImageSet
    from detectors.clip.backbone import ClipBackbone
    from detectors.clip.features import image_features

    backbone = ClipBackbone.load(model, device=device)
    out = []
    for s in samples:
        feats = image_features(backbone, ImageSet(manifest=s.manifest), cache_dir=cache_dir, batch_size=batch_size,
                               progress=False)
        out.append((feats.global_.float().numpy(), np.arange(len(s.manifest))))
    return out


EMBEDDING_PACKAGES = {"opentsne": ("openTSNE", "openTSNE"), "umap": ("umap", "umap-learn")}
"""The optional embeddings: module to import, package to install."""


def check_embedding(method: str) -> None:
    """`method` is an embedding this machine can run, else one UserInputError (before any feature is extracted)."""
    import importlib.util

    if method not in EMBEDDINGS:
        raise UserInputError(f"--embedding: one of {list(EMBEDDINGS)}, got {method!r}")
    if method in EMBEDDING_PACKAGES and importlib.util.find_spec(EMBEDDING_PACKAGES[method][0]) is None:
        raise UserInputError(f"--embedding {method}: not installed (pip install {EMBEDDING_PACKAGES[method][1]}), or "
                             "use the default tsne (scikit-learn)")


def embed_2d(features: np.ndarray, method: str = "tsne", seed: int = 0, perplexity: float = 30.0) -> np.ndarray:
    """[N, 2] coordinates: PCA to 50 dimensions (when wider), then t-SNE (scikit-learn or openTSNE) or UMAP."""
    from sklearn.decomposition import PCA

    x = np.asarray(features, dtype=np.float64)
    if x.shape[1] > 50 and len(x) > 50:
        x = PCA(n_components=50, random_state=seed).fit_transform(x)
    perplexity = float(min(perplexity, max(1.0, (len(x) - 1) / 3)))
    if method == "tsne":
        from sklearn.manifold import TSNE

        return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(x)
    if method == "opentsne":
        from openTSNE import TSNE as OpenTSNE

        return np.asarray(OpenTSNE(n_components=2, perplexity=perplexity, random_state=seed).fit(x))
    if method == "umap":
        import umap

        return umap.UMAP(n_components=2, random_state=seed).fit_transform(x)
    raise UserInputError(f"--embedding: one of {list(EMBEDDINGS)}, got {method!r}")


def feature_map(samples: list[Sample], features: list[Features], method: str = "tsne", seed: int = 0,
                perplexity: float = 30.0) -> pd.DataFrame:
    """One embedding of every sample together: rows `set, file_name, x, y`."""
    empty = [s.name for s, (f, _) in zip(samples, features) if len(f) == 0]
    if empty:
        raise UserInputError(f"feature map: no image of set(s) {empty} could be read")
    xy = embed_2d(np.concatenate([f for f, _ in features]), method, seed, perplexity)
    names = [s.name for s, (_, at) in zip(samples, features) for _ in at]
    files = [s.manifest.rows[i]["file_name"] for s, (_, at) in zip(samples, features) for i in at]
    return pd.DataFrame({"set": names, "file_name": files, "x": xy[:, 0], "y": xy[:, 1]})


def feature_map_figure(points: pd.DataFrame, title: str) -> Any:
    """A scatter of the embedding, one colour and marker per set (`figures.styles`, the sets' display names), ID
    first. The report's Figure 2(c) sets several side by side (`plots.feature_maps_figure`)."""
    from detectors.harness.report.figures import new_figure, styles
    from detectors.harness.report.names import set_label

    figure = new_figure(7.5, 6.0)
    axes = figure.add_subplot()
    groups = list(points.groupby("set", sort=False))
    for style, (name, part) in zip(styles(len(groups)), groups):
        axes.scatter(part["x"], part["y"], s=14, alpha=0.8, marker=style.marker, color=style.color, linewidths=0,
                     label=f"{set_label(name)} (n={len(part)})")
    axes.set_xticks([])
    axes.set_yticks([])
    axes.set_title(title, fontsize="medium")
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), markerscale=1.5)
    return figure


def plot_feature_map(points: pd.DataFrame, title: str, path: str | os.PathLike) -> Path:
    """`feature_map_figure` saved as a PNG."""
    from detectors.harness.report.figures import save_figure

    return save_figure(feature_map_figure(points, title), path)


__all__ = ["EMBEDDINGS", "EMBEDDING_PACKAGES", "Sample", "check_embedding", "sample_sets", "classifier_features",
           "clip_features", "embed_2d", "feature_map", "feature_map_figure", "plot_feature_map"]
