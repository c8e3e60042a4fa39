"""Shared fixtures for the pipelines tests: the tiny ZeST stand-ins are built once per session."""
from __future__ import annotations

import pytest
import torch

from pipelines.tiny import save_tiny_zest
from pipelines.zest import ZeSTConfig, ZeSTPipeline


@pytest.fixture(scope="session")
def tiny_zest_config(tmp_path_factory) -> ZeSTConfig:
    """A `ZeSTConfig` of tiny random-weight components saved in the real folder layouts."""
    return save_tiny_zest(tmp_path_factory.mktemp("tiny_zest"))


@pytest.fixture(scope="session")
def tiny_zest(tiny_zest_config) -> ZeSTPipeline:
    """The tiny ZeST pipeline loaded on the CPU in fp32 through `ZeSTPipeline.from_config`."""
    return ZeSTPipeline.from_config(tiny_zest_config, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest single-threaded on a loaded CPU; restores the thread count afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
