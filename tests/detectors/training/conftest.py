"""Tiny heads train fastest on one thread (and the shared 2-core test machine is oversubscribed otherwise)."""
import pytest


@pytest.fixture(autouse=True)
def _single_thread(single_torch_thread):
    """Every training-method test runs on one torch thread (tests/conftest.py)."""
