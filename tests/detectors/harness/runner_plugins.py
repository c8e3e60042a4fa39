"""Detectors for runner tests, loaded through the config key `plugins: [runner_plugins]`.

Their family, "plugin", is none of the runner's families, so `detectors: all` never picks them up.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.registry import register_detector


@register_detector("plugin_fail")
class FailingDetector(Detector):
    """Raises in fit: the runner must record it and go on."""

    family = "plugin"
    inputs = frozenset({"logits"})

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        raise RuntimeError("plugin_fail always fails")


@register_detector("plugin_block")
class BlockingMSP(Detector):
    """Max logit that, while $PLUGIN_BLOCK names a folder, announces itself there and waits for a `release` file;
    every fit is appended to `fits.txt` in that folder."""

    family = "plugin"
    inputs = frozenset({"logits"})

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        folder = os.environ.get("PLUGIN_BLOCK")
        if folder:
            with open(Path(folder) / "fits.txt", "a") as fh:
                fh.write("fit\n")

    def _score(self, batch: FeatureSet) -> np.ndarray:
        folder = os.environ.get("PLUGIN_BLOCK")
        if folder:
            (Path(folder) / "blocking").touch()
            deadline = time.monotonic() + 120
            while not (Path(folder) / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return batch.logits.max(1).astype(np.float64)


@register_detector("plugin_die")
class DyingMSP(Detector):
    """Max logit whose fit, while $PLUGIN_DIE names a folder without a `died` file, waits for the file
    $PLUGIN_DIE_AFTER (when set; up to 2 minutes), writes `died` and kills its own process (SIGKILL: no handler, no
    cleanup), as a machine lost mid-run; the rerun then fits normally."""

    family = "plugin"
    inputs = frozenset({"logits"})

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        import signal

        folder = os.environ.get("PLUGIN_DIE")
        if folder and not (Path(folder) / "died").exists():
            after, deadline = os.environ.get("PLUGIN_DIE_AFTER"), time.monotonic() + 120
            while after and not Path(after).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            (Path(folder) / "died").write_text(os.environ.get("RANK", "0"))
            os.kill(os.getpid(), signal.SIGKILL)

    def _score(self, batch: FeatureSet) -> np.ndarray:
        return batch.logits.max(1).astype(np.float64)


@register_detector("plugin_shard_fail")
class ShardFailingMSP(Detector):
    """Max logit whose sharded fit (`fits_from_shards`, every rank together) raises on rank 1 only, before the
    column mean's collective that rank 0 then waits in (one process: it fits)."""

    family = "plugin"
    fits_from_shards = True
    inputs = frozenset({"features", "logits"})

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        from detectors.posthoc import streaming

        if os.environ.get("RANK", "0") == "1":
            raise RuntimeError("plugin_shard_fail fails on rank 1")
        streaming.column_mean(np.asarray(id_train.features))

    def _score(self, batch: FeatureSet) -> np.ndarray:
        return batch.logits.max(1).astype(np.float64)
