"""`pipelines.shard_stream.ShardStream`, the appendable shard store fetch writes: the pack's format (each finished
shard sound by `verify_shard`), resume after a kill at each step (inside the shard being written, between a shard's
index and store.json), and every store it must not touch as one ShardError naming the file."""
from __future__ import annotations

import json
import logging
import os

import pytest

from pipelines.shard_stream import ShardStream
from pipelines.shards import PackConfig
from pipelines.store import STORE_FILE, ShardError, index_path, read_store, store_members, verify_shard

SETTINGS = PackConfig().settings()


def _image(i: int) -> bytes:
    return bytes([i % 251]) * (700 + 37 * i)  # not an image: stored as it is, named .bin by its file name


def _fill(root, names, samples=2, close=True) -> ShardStream:
    stream = ShardStream(root, SETTINGS, samples, 1 << 30)
    for name in names:
        stream.add(name, _image(int(name.split(".")[0])))
    if close:
        stream.close()
    return stream


def test_images_are_cut_into_finished_shards_with_keys_unique_in_the_store(tmp_path):
    stream = _fill(tmp_path, [f"{i}.bin" for i in range(5)])
    records = read_store(tmp_path)
    assert sorted(records) == ["000000.tar", "000001.tar", "000002.tar"]
    assert all(verify_shard(tmp_path / n, r) == [] for n, r in records.items())
    members = store_members(tmp_path)
    assert [members[f"{i}.bin"].read_bytes() for i in range(5)] == [_image(i) for i in range(5)]
    assert [members[f"{i}.bin"].member for i in range(5)] == [f"{i:09d}.bin" for i in range(5)]
    assert stream.members == members
    assert json.loads((tmp_path / STORE_FILE).read_text())["resize"] == "none"
    again = _fill(tmp_path, ["5.bin", "6.bin"])  # a later run appends after the finished shards
    assert again.members["5.bin"].member == "000000005.bin" and len(read_store(tmp_path)) == 4


def test_a_killed_stream_loses_only_the_shard_being_written(tmp_path, caplog):
    stream = _fill(tmp_path, [f"{i}.bin" for i in range(3)], close=False)  # 000000 finished, 000001 being written
    stream.writer.abandon()  # the process dies: the tar is cut, no index
    unfinished = tmp_path / "000001.tar"
    with open(unfinished, "r+b") as fh:
        fh.truncate(600)  # inside the member
    first = (tmp_path / "000000.tar").read_bytes()
    with caplog.at_level(logging.WARNING, logger="pipelines.shard_stream"):
        resumed = ShardStream(tmp_path, SETTINGS, 2, 1 << 30)
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]  # the one warning (INFO: shards finished)
    assert str(unfinished) in record.getMessage() and "unfinished shard" in record.getMessage()
    assert not unfinished.exists() and sorted(resumed.members) == ["0.bin", "1.bin"]
    resumed.add("2.bin", _image(2))
    resumed.close()
    assert (tmp_path / "000000.tar").read_bytes() == first
    assert store_members(tmp_path)["2.bin"].member == "000000002.bin"  # the key the lost member had
    assert all(verify_shard(tmp_path / n, r) == [] for n, r in read_store(tmp_path).items())


def test_a_shard_indexed_but_not_yet_listed_in_store_json_is_kept(tmp_path):
    _fill(tmp_path, [f"{i}.bin" for i in range(4)])
    document = json.loads((tmp_path / STORE_FILE).read_text())
    document["shardlist"] = document["shardlist"][:1]  # killed between 000001's index and store.json
    (tmp_path / STORE_FILE).write_text(json.dumps(document))
    resumed = ShardStream(tmp_path, SETTINGS, 2, 1 << 30)
    assert sorted(read_store(tmp_path)) == ["000000.tar", "000001.tar"] and len(resumed.members) == 4


def test_stores_it_must_not_touch_are_one_shard_error_naming_the_file(tmp_path):
    _fill(tmp_path, [f"{i}.bin" for i in range(4)])
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ShardError, match="000000.index.json.*keep_ratio"):
        ShardStream(tmp_path, PackConfig(resize="keep_ratio").settings(), 2, 1 << 30)
    shard = tmp_path / "000001.tar"
    shard.write_bytes(files["000001.tar"][:-512])
    with pytest.raises(ShardError, match=f"{shard}.*truncated"):
        ShardStream(tmp_path, SETTINGS, 2, 1 << 30)
    changed = bytearray(files["000001.tar"])
    changed[520] ^= 1
    shard.write_bytes(bytes(changed))
    with pytest.raises(ShardError, match=f"{shard}: its sha256"):
        ShardStream(tmp_path, SETTINGS, 2, 1 << 30)
    shard.write_bytes(files["000001.tar"])
    os.utime(shard, ns=(json.loads(index_path(shard).read_text())["mtime_ns"],) * 2)
    (tmp_path / "000005.tar").write_bytes(b"")
    with pytest.raises(ShardError, match="000005.tar: a shard out of sequence"):
        ShardStream(tmp_path, SETTINGS, 2, 1 << 30)
    (tmp_path / "000005.tar").unlink()
    index_path(tmp_path / "000000.tar").unlink()
    with pytest.raises(ShardError, match="000000.tar: listed in"):
        ShardStream(tmp_path, SETTINGS, 2, 1 << 30)
    document = json.loads((tmp_path / STORE_FILE).read_text())
    (tmp_path / STORE_FILE).write_text(json.dumps({**document, "shardlist": []}))
    with pytest.raises(ShardError, match="000001.tar: a shard out of sequence"):  # 000000 is not taken as unfinished
        ShardStream(tmp_path, SETTINGS, 2, 1 << 30)
    (tmp_path / STORE_FILE).write_text(json.dumps(document))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(files) - {"000000.index.json"})
