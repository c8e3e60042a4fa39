"""Tiny heads train fastest on one thread (and the shared 2-core test machine is oversubscribed otherwise)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
