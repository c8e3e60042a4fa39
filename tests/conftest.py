"""Fixtures shared by the whole suite."""
import pytest
import torch


@pytest.fixture()
def single_torch_thread():
    """Tiny models run fastest on one intra-op thread; extra threads only oversubscribe the shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
