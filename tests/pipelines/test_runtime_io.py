"""Runtime policy (dtype, seeds, clear loading errors) and atomic writes."""
import os

import pytest
import torch

from pipelines.io import atomic_path, atomic_write_json, atomic_write_text
from pipelines.runtime import item_generator, item_seed, load_pretrained, resolve_dtype


def test_dtype_policy():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
    assert resolve_dtype("fp16", "cpu") == torch.float16
    with pytest.raises(ValueError, match="precision"):
        resolve_dtype("fp8", "cpu")


def test_item_seed_depends_only_on_seed_and_key():
    assert item_seed(42, 7) == item_seed(42, 7)
    assert len({item_seed(42, i) for i in range(1000)}) == 1000
    assert item_seed(42, 7) != item_seed(43, 7)
    a = torch.randn(3, generator=item_generator(item_seed(1, 5)))
    b = torch.randn(3, generator=item_generator(item_seed(1, 5)))
    assert torch.equal(a, b)


def test_offline_error_names_id_and_folder_hint(monkeypatch):
    def loader(name, **kwargs):
        raise OSError("We couldn't connect to the hub")

    with pytest.raises(OSError) as err:
        load_pretrained(loader, "stabilityai/not-cached", "base model")
    assert "stabilityai/not-cached" in str(err.value) and "local folder" in str(err.value)


def test_atomic_write_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("crash mid-write")
    assert target.read_text().strip().startswith("{") and '"a": 1' in target.read_text()
    assert sorted(os.listdir(tmp_path)) == ["out.json"]
    atomic_write_text(tmp_path / "sub" / "t.txt", "hi")
    assert (tmp_path / "sub" / "t.txt").read_text() == "hi"
