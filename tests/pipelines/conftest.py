"""Shared fixtures for the pipelines tests: the tiny ZeST stand-ins are built once per session."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest
import torch

from pipelines.tiny import save_tiny_zest
from pipelines.zest import ZeSTConfig, ZeSTPipeline


@pytest.fixture(scope="session")
def tiny_zest_config(tmp_path_factory) -> ZeSTConfig:
    """A `ZeSTConfig` of tiny random-weight components saved in the real folder layouts."""
    with _threads(1):
        return save_tiny_zest(tmp_path_factory.mktemp("tiny_zest"))


@pytest.fixture(scope="session")
def tiny_zest(tiny_zest_config) -> ZeSTPipeline:
    """The tiny ZeST pipeline loaded on the CPU in fp32 through `ZeSTPipeline.from_config`."""
    with _threads(1):
        return ZeSTPipeline.from_config(tiny_zest_config, device="cpu", dtype=torch.float32)


@contextmanager
def _threads(count: int) -> Iterator[None]:
    """Run with `count` torch threads (tiny models are fastest single-threaded on a shared CPU), then restore."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def one_thread():
    """Module-wide single-threaded torch, so repeated model calls are also bitwise identical."""
    with _threads(1):
        yield
