"""Shared fixtures of the CLIP detector tests: one tiny random-weight CLIP folder and its loaded backbone."""
from __future__ import annotations

import pytest
import torch

from pipelines.tiny import save_tiny_clip


@pytest.fixture(autouse=True)
def private_feature_cache(tmp_path, monkeypatch):
    """Keep CLIP feature caches of manifest-backed image sets out of the user's ~/.cache."""
    monkeypatch.setenv("OODFORGE_CACHE", str(tmp_path / "oodforge_cache"))


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


@pytest.fixture(scope="session")
def backbone(tiny_clip_dir):
    from detectors.clip.backbone import ClipBackbone

    return ClipBackbone.load(str(tiny_clip_dir), device="cpu")
