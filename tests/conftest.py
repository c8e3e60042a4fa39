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


@pytest.fixture(autouse=True)
def console_logging():
    """The console logging every command sets up (`pipelines.cli.configure_logging`, INFO): the library's messages
    reach the test's stdout / stderr (capsys) as they reach a command's user; each test starts at INFO."""
    from pipelines.cli import configure_logging

    configure_logging()
    yield
