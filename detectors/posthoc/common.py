"""Shared numerics of logit/feature-level post-hoc detectors: stable float64 softmax, log-softmax, logsumexp on numpy,
and access to a FeatureSet's arrays (as stored, for streaming passes, or converted)."""
from __future__ import annotations

from typing import Any

import numpy as np

from detectors.base import FeatureSet, as_numpy


def logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """log(sum(exp(x))) along `axis` in float64, stable for large magnitudes."""
    x = np.asarray(x, dtype=np.float64)
    top = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(top, axis=axis) + np.log(np.sum(np.exp(x - top), axis=axis))


def logsumexp_rows(z: np.ndarray) -> np.ndarray:
    """log(sum(exp(z))) of each row of z [N,C] in z's own precision (shift by the row's maximum, exp), the row sums and
    the log in float64: the float64 result [N]. Overwrites z (pass scratch, e.g. logits just computed)."""
    top = z.max(axis=1)
    z -= top[:, None]
    np.exp(z, out=z)
    return top + np.log(z.sum(axis=1, dtype=np.float64))


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """log softmax along `axis` in float64."""
    x = np.asarray(x, dtype=np.float64)
    return x - np.expand_dims(logsumexp(x, axis=axis), axis)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """softmax along `axis` in float64."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def logits_of(batch: Any, who: str) -> np.ndarray:
    """float64 logits [N,C] of a FeatureSet or an array-like of logits."""
    if isinstance(batch, FeatureSet):
        batch.require("logits", who=who)
        batch = batch.logits
    out = as_numpy(batch, np.float64)
    if out.ndim != 2:
        raise ValueError(f"{who} needs logits of shape [N,C], got {out.shape}")
    return out


def stored_logits(batch: Any, who: str) -> np.ndarray:
    """Logits [N,C] of a FeatureSet or array-like in the model's precision (float32 and float64 as they are, others as
    float32): for elementwise scores that work block by block in that precision and sum in float64."""
    if isinstance(batch, FeatureSet):
        batch.require("logits", who=who)
        batch = batch.logits
    out = as_numpy(batch)
    if out.ndim != 2:
        raise ValueError(f"{who} needs logits of shape [N,C], got {out.shape}")
    return out if out.dtype in (np.float32, np.float64) else out.astype(np.float32)


def labels_of(data: FeatureSet, who: str) -> np.ndarray:
    """int64 class labels [N] of a FeatureSet (raises when it has none)."""
    data.require("labels", who=who)
    return np.asarray(data.labels).astype(np.int64).reshape(-1)


def raw_features(batch: Any, who: str) -> np.ndarray:
    """Features [N,D] of a FeatureSet or array-like in their own float dtype (no float64 copy of a float32 cache)."""
    if isinstance(batch, FeatureSet):
        batch.require("features", who=who)
        batch = batch.features
    out = as_numpy(batch)
    if out.ndim != 2:
        raise ValueError(f"{who} needs features of shape [N,D], got {out.shape}")
    return out if out.dtype in (np.float32, np.float64) else out.astype(np.float32)


def stored_features(batch: Any, who: str) -> np.ndarray:
    """Features [N,D] exactly as stored, no conversion (a float16 np.memmap stays on disk): for streaming passes, which
    convert chunk by chunk (see `detectors.posthoc.streaming`)."""
    if isinstance(batch, FeatureSet):
        batch.require("features", who=who)
        batch = batch.features
    out = batch if isinstance(batch, np.ndarray) else as_numpy(batch)
    if out.ndim != 2:
        raise ValueError(f"{who} needs features of shape [N,D], got {out.shape}")
    return out


def model_precision(block: np.ndarray) -> np.ndarray:
    """A chunk of stored features in the precision the in-memory path uses: float32/float64 as they are, else
    float32."""
    return block if block.dtype in (np.float32, np.float64) else block.astype(np.float32)


def float32_features(batch: Any, who: str) -> np.ndarray:
    """float32 features (no copy when already float32): for faiss and projections through the head in model
    precision."""
    return np.asarray(raw_features(batch, who), dtype=np.float32)


def feature_mean(batch: Any, who: str) -> np.ndarray:
    """float64 mean feature, streamed in chunks (reduced across processes inside `streaming.across_processes`)."""
    from detectors.posthoc.streaming import column_mean

    return column_mean(stored_features(batch, who))
