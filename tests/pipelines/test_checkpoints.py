"""Training checkpoints without pickles: the state tree round-trips exactly through safetensors + JSON, a file that is
not such a checkpoint is ignored (one warning line) and never executed, and foreign .pt files load tensors only."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from torch import nn

from pipelines.checkpoints import (
    FORMAT,
    checkpoint_matches,
    decode_tree,
    encode_tree,
    load_checkpoint,
    load_tree,
    read_metadata,
    safe_torch_load,
    save_checkpoint,
    save_tree,
)
from pipelines.errors import UserInputError
from pipelines.training.loop import TrainResult


class Planted:
    """A pickle that runs a shell command when loaded (what a hostile file in a shared run folder would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plant(path, marker) -> None:
    torch.save({"format": FORMAT, "key": "k", "epoch": 1, "payload": Planted(marker)}, path)


def test_a_state_tree_round_trips_exactly(tmp_path):
    shared = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    tree = {"a": 1, "b": [1.5, math.inf, None, True, "x"], "c": (1, (2, 3)), 0: "int key", (1, 2): "tuple key",
            "t": {"w": shared, "w_again": shared, "half": torch.ones(2, dtype=torch.bfloat16),
                  "step": torch.tensor(3.0), "rng": torch.get_rng_state(), "empty": torch.zeros(0, 4)},
            "np": np.arange(5, dtype=np.int64), "scalar": np.float64(0.25), "$tensor": "a key that looks like a mark"}
    save_tree(tmp_path / "s.safetensors", tree, {"format": "test"})
    back = load_tree(tmp_path / "s.safetensors")
    assert back["a"] == 1 and back["b"][0] == 1.5 and back["b"][1] == math.inf and back["b"][2:] == [None, True, "x"]
    assert back["c"] == (1, (2, 3)) and back[0] == "int key" and back[(1, 2)] == "tuple key"
    assert back["$tensor"] == "a key that looks like a mark" and back["scalar"] == 0.25
    for name, value in tree["t"].items():
        assert back["t"][name].dtype == value.dtype and torch.equal(back["t"][name], value)
    assert isinstance(back["np"], np.ndarray) and back["np"].tolist() == [0, 1, 2, 3, 4]
    assert read_metadata(tmp_path / "s.safetensors")["format"] == "test"
    assert decode_tree(encode_tree([{"k": (1,)}], {}), {}) == [{"k": (1,)}]
    with pytest.raises(TypeError, match="cannot hold a Planted"):
        encode_tree({"x": Planted(tmp_path / "m")}, {})


def _training_objects(seed: int):
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    objective = nn.Module()
    objective.margin, objective.table, objective.vocab = 0.5, torch.arange(4), {"era": ["a", "b"]}
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    return module, objective, optimizer, scheduler


def test_a_checkpoint_restores_every_state(tmp_path):
    module, objective, optimizer, scheduler = _training_objects(0)
    for _ in range(3):
        module(torch.randn(8, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    objective.margin, objective.table = 0.75, torch.arange(4) * 2
    result = TrainResult(history=[{"epoch": 1, "loss": 0.5}], lrs=[0.1, 0.05, 1 / 30], steps=3, seconds=1.25)
    generator = torch.Generator().manual_seed(7)
    torch.randn(3, generator=generator)
    path = tmp_path / "checkpoint.safetensors"
    save_checkpoint(path, "key-1", 2, module, objective, optimizer, scheduler, result, [generator, None])
    assert read_metadata(path)["epoch"] == "2" and checkpoint_matches(path, "key-1")

    fresh = _training_objects(1)
    got, gen2 = TrainResult(), torch.Generator()
    assert load_checkpoint(path, "key-1", *fresh, got, [gen2, None]) == 2
    for a, b in zip(module.state_dict().values(), fresh[0].state_dict().values()):
        assert torch.equal(a, b)
    assert (fresh[1].margin == 0.75 and torch.equal(fresh[1].table, objective.table)
            and fresh[1].vocab == {"era": ["a", "b"]})
    assert fresh[2].state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    for a, b in zip(optimizer.state_dict()["state"].values(), fresh[2].state_dict()["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert fresh[3].state_dict() == scheduler.state_dict()
    assert (got.history, got.lrs, got.steps, got.seconds) == (result.history, result.lrs, 3, 1.25)
    assert torch.equal(torch.randn(3, generator=gen2), torch.randn(3, generator=generator))
    assert load_checkpoint(path, "another run", *_training_objects(2), TrainResult(), [None]) == 0


@pytest.mark.parametrize("content", ["pickle", "garbage", "other safetensors"])
def test_a_file_that_is_no_checkpoint_is_ignored_and_never_run(tmp_path, capsys, content):
    path, marker = tmp_path / "checkpoint.safetensors", tmp_path / "ran"
    if content == "pickle":
        plant(path, marker)
    elif content == "garbage":
        path.write_bytes(b"\x00" * 100)
    else:
        save_tree(path, {"x": 1}, {"format": "something else", "key": "k"})
    assert load_checkpoint(path, "k", *_training_objects(0), TrainResult(), [None]) == 0
    assert not marker.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ignoring" in err and str(path) in err and "weights_only" not in err


def test_safe_torch_load_reads_tensors_and_refuses_anything_else(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    assert torch.equal(safe_torch_load(tmp_path / "ok.pt")["w"], torch.ones(2))
    plant(tmp_path / "bad.pt", tmp_path / "ran")
    with pytest.raises(UserInputError) as err:
        safe_torch_load(tmp_path / "bad.pt", "ADM checkpoint")
    message = str(err.value)
    assert not (tmp_path / "ran").exists()
    assert message.startswith("ADM checkpoint") and "bad.pt" in message and "\n" not in message
    assert "weights_only" not in message


# -- safetensors headers that do not fit their file (safetensors itself raises a SafetensorError traceback) ----------
def header_bomb(path, declared: int = 2 ** 62):
    """A file whose 8-byte header length declares `declared` bytes, followed by a tiny JSON header."""
    path.write_bytes(declared.to_bytes(8, "little") + b'{"__metadata__": {}}')
    return path


def _file(path, header: bytes, data: bytes = b"") -> object:
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def test_check_safetensors_refuses_each_malformed_header_in_one_line(tmp_path):
    from safetensors.torch import save_file

    from pipelines.checkpoints import UnsafeFileError, check_safetensors

    save_file({"w": torch.ones(3)}, str(tmp_path / "good.safetensors"))
    check_safetensors(tmp_path / "good.safetensors")
    os.mkfifo(tmp_path / "pipe.safetensors")
    cases = {
        header_bomb(tmp_path / "bomb.safetensors"): "declares a 4611686018427387904-byte header, more than the file's",
        header_bomb(tmp_path / "big.safetensors", 200_000_000): "more than the file's",
        _file(tmp_path / "text.safetensors", b"not json"): "its header is not JSON",
        _file(tmp_path / "list.safetensors", b"[1, 2]"): "its header is not a JSON object",
        _file(tmp_path / "range.safetensors", b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}',
              b"\0" * 8): "tensor 'w' has data_offsets [0, 16] outside its 8 data bytes",
        tmp_path / "pipe.safetensors": "not a regular file (FIFO)",
    }
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    cases[tmp_path / "short.safetensors"] = "2 bytes, shorter than the 8-byte header length"
    for path, reason in cases.items():
        with pytest.raises(UnsafeFileError) as err:
            check_safetensors(path)
        message = str(err.value)
        assert message.startswith(f"{path}: not a readable safetensors file (") and "\n" not in message
        assert reason in message, message


def test_a_header_bomb_checkpoint_is_ignored_and_load_tree_refuses_it(tmp_path, capsys):
    from pipelines.checkpoints import UnsafeFileError

    bomb = header_bomb(tmp_path / "checkpoint.safetensors")
    assert read_metadata(bomb) is None
    assert not checkpoint_matches(bomb, "k")
    assert "ignoring" in capsys.readouterr().err
    with pytest.raises(UnsafeFileError, match="declares a 4611686018427387904-byte header"):
        load_tree(bomb)
