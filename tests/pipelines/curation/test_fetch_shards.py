"""`fetch_images --store shards` against the loopback server (`helpers.http_server`): images go straight into tar
shards in pack_shards' format, a rerun fetches nothing, a kill -9 loses only the shard being written (rewritten on
resume, in one line), a truncated or changed shard is one line and exit 2 with nothing lost, and make_splits' manifests
read the fetched shards with the same rows and pixels as the folder store gives."""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers.gbif import build_archive
from helpers.http_server import HostileServer, png, seed

from pipelines.cli import run_main
from pipelines.curation.fetch_resize import prepare
from pipelines.curation.gbif import image_file_name
from pipelines.data import load_image, read_manifest
from pipelines.fingerprint import images_fingerprint
from pipelines.store import STORE_FILE, MemberPath, ShardError, index_path, read_store, store_members, verify_shard

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "scripts"
FAST = ["--backoff", "0.01", "--timeout", "2", "--min-bytes", "100", "--min-side", "32", "--workers", "4"]


@pytest.fixture()
def server():
    with HostileServer() as s:
        yield s


def script(name: str, argv: list[str]) -> int:
    return run_main(importlib.import_module(f"oodforge.commands.{name}").main, argv)


def table(base: str, paths: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"gbifID": [str(1000 + i) for i in range(len(paths))], "url": [base + p for p in paths],
                         "species": [f"Moth sp{i % 3}" for i in range(len(paths))], "genus": "Moth",
                         "family": "Noctuidae", "decimalLatitude": "50.0", "decimalLongitude": "-70.0"})


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_fetched_images_go_into_shards_and_a_rerun_fetches_nothing(server, tmp_path, capsys):
    paths = [f"/img/{i}.png" for i in range(10)] + ["/missing/10"]
    table(server.base, paths).to_csv(tmp_path / "occ.csv", index=False)
    out = tmp_path / "out"
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), "--store", "shards",
            "--samples-per-shard", "4", *FAST]
    assert script("fetch_images", argv) == 0
    store = out / "shards"
    records = read_store(store)
    assert sorted(records) == ["000000.tar", "000001.tar", "000002.tar"]
    assert [r.samples for _, r in sorted(records.items())] == [4, 4, 2]
    assert all(verify_shard(store / name, record) == [] for name, record in records.items())
    assert not (out / "images").exists()  # no file per image
    images = pd.read_csv(out / "images.csv", dtype=str)
    assert len(images) == 10
    members = store_members(store)
    for url, name, digest in zip(images["url"], images["file_name"], images["sha256"]):
        member = members[name]
        data = member.read_bytes()
        expected = prepare(png(seed(url.removeprefix(server.base))), name, 224, 10**9, 75, "reference").data
        assert data == expected and hashlib.sha256(data).hexdigest() == digest  # fetch's own resize, unchanged
        assert member.member.endswith(".png") and load_image(member).size == (298, 224)
    settings = json.loads((store / STORE_FILE).read_text())
    assert (settings["resize"], settings["short_side"], settings["quality"]) == ("reference", 224, 75)
    before, stored = Counter(server.counts), snapshot(store)
    assert script("fetch_images", argv) == 0
    assert server.counts == before and snapshot(store) == stored  # nothing fetched, nothing rewritten
    capsys.readouterr()
    assert script("fetch_images", argv + ["--dry-run"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["already_fetched"] == 10 and planned["to_fetch"] == 0
    assert script("fetch_images", [*argv, "--resize", "keep_ratio"]) == 2  # other settings: refused, one line
    (line,) = error_lines(capsys)
    assert "000000.index.json" in line and "keep_ratio" in line and snapshot(store) == stored
    assert script("fetch_images", [*argv, "--resize", "keep_ratio", "--dry-run"]) == 2
    (line,) = error_lines(capsys)
    assert str(store / STORE_FILE) in line and "keep_ratio" in line


@pytest.mark.slow
def test_kill_9_loses_only_the_shard_being_written_and_the_rerun_rewrites_it(tmp_path):
    """The server answers the first 6 URLs and holds the rest: once both workers are held, 6 images are finished,
    4 of them in the finished shard 000000 and 2 in the unfinished 000001; the kill comes then."""
    paths = [f"/gate/{i}.png" for i in range(12)]
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPTS / "fetch_images.py"), "--occurrences", str(tmp_path / "occ.csv"), "--out",
           str(out), "--store", "shards", "--samples-per-shard", "4", "--workers", "2", "--min-bytes", "100",
           "--min-side", "32"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OODFORGE_PROGRESS": "off"}
    store = out / "shards"
    with HostileServer(gate_from=6) as server:
        table(server.base, paths).to_csv(tmp_path / "occ.csv", index=False)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert server.wait_blocked(2), proc.stderr.read() if proc.poll() is not None else "no request held"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert sorted(read_store(store)) == ["000000.tar"]
        assert (store / "000001.tar").is_file() and not index_path(store / "000001.tar").exists()
        kept = {m.member: (m.offset, m.size) for m in store_members(store).values()}
        first = (store / "000000.tar").read_bytes()
        in_first = set(store_members(store))
        assert len(in_first) == 4
        counts_at_kill = Counter(server.counts)
        server.release.set()
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        lines = [line for line in run.stderr.splitlines() if "shard" in line]  # (beside the stale lock's line)
        assert len(lines) == 1 and "000001.tar: unfinished shard" in lines[0], run.stderr
        for path in paths:
            name = image_file_name(server.base + path)
            assert server.counts[path] - counts_at_kill[path] == (0 if name in in_first else 1), path
    assert (store / "000000.tar").read_bytes() == first  # the finished shard is kept as it was
    records = read_store(store)
    assert sorted(records) == ["000000.tar", "000001.tar", "000002.tar"]
    assert all(verify_shard(store / name, record) == [] for name, record in records.items())
    members = store_members(store)
    images = pd.read_csv(out / "images.csv", dtype=str)
    assert sorted(images["file_name"]) == sorted(members) and len(members) == 12
    assert {m.member: (m.offset, m.size) for n, m in members.items() if n in in_first} == kept
    assert len({m.member for m in members.values()}) == 12  # keys run on across shards: unique in the store
    for name, digest in zip(images["file_name"], images["sha256"]):
        assert hashlib.sha256(members[name].read_bytes()).hexdigest() == digest


def test_a_truncated_or_changed_shard_is_one_line_exit_2_and_nothing_is_lost(server, tmp_path, capsys):
    paths = [f"/img/{i}.png" for i in range(8)]
    table(server.base, paths).to_csv(tmp_path / "occ.csv", index=False)
    out = tmp_path / "out"
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), "--store", "shards",
            "--samples-per-shard", "4", *FAST]
    assert script("fetch_images", argv) == 0
    capsys.readouterr()
    shard = out / "shards" / "000000.tar"
    whole = shard.read_bytes()
    for broken, what in ((whole[:-1536], "truncated"), (whole[:600] + bytes([whole[600] ^ 1]) + whole[601:], "sha256")):
        shard.write_bytes(broken)
        before, counts = snapshot(out), Counter(server.counts)
        assert script("fetch_images", argv) == 2
        (line,) = error_lines(capsys)
        assert line.startswith("error: ") and str(shard) in line and what in line, line
        assert snapshot(out) == before and server.counts == counts  # nothing deleted, rewritten or fetched
        assert script("fetch_images", argv + ["--dry-run"]) == 2
        (line,) = error_lines(capsys)
        assert str(shard) in line and what in line
    shard.write_bytes(whole)
    assert script("fetch_images", argv) == 0  # restored: the run goes on where it was
    assert server.counts == counts


@pytest.mark.slow
def test_make_splits_reads_the_fetched_shards_with_the_folder_stores_rows_and_pixels(server, tmp_path, capsys):
    """The README's fetch -> splits path on both stores: the same rows (the shard manifest's rows add only the member
    fields), the same decoded pixels; no pack step; a changed shard stops make_splits in one line naming it."""
    path, ids = build_archive(tmp_path / "download", base=server.base)
    ids.to_csv(tmp_path / "ids.csv", index=False)
    rows = {}
    for store in ("folder", "shards"):
        fetched = tmp_path / store / "data"
        assert script("fetch_images", ["--occurrences", str(path), "--taxon-filter", "moths", "--out", str(fetched),
                                       "--store", store, "--samples-per-shard", "16", *FAST]) == 0
        splits = tmp_path / store / "splits"
        assert script("make_splits", ["--occurrences", str(path), "--taxon-filter", "moths", "--id-species",
                                      str(tmp_path / "ids.csv"), "--image-root", str(fetched), "--out",
                                      str(splits)]) == 0
        text = capsys.readouterr().out
        assert ("no pack step" in text) == (store == "shards")
        rows[store] = read_manifest(splits / "ne-america", check_files=True)
    folder, shards = rows["folder"], rows["shards"]
    fields = ("shard_file", "shard_member", "shard_offset", "shard_bytes")
    assert [{k: v for k, v in r.items() if k not in fields} for r in shards.rows] == folder.rows
    assert all(r["shard_file"].endswith(".tar") and "/" not in r["shard_file"] for r in shards.rows)
    assert not (tmp_path / "shards" / "data" / "images").exists()
    assert not (tmp_path / "shards" / "splits" / "shards").exists()  # nothing packed
    for a, b in zip(folder.rows[::7], shards.rows[::7]):
        member = shards.path(b)
        assert isinstance(member, MemberPath)
        assert np.array_equal(np.asarray(load_image(folder.path(a))), np.asarray(load_image(member)))
    key = images_fingerprint(shards, "content")  # the run's key from the shards' digests, every shard checked
    assert key == images_fingerprint(read_manifest(tmp_path / "shards" / "splits" / "ne-america"), "stat")
    summary = [json.loads((tmp_path / s / "splits" / "summary.json").read_text()) for s in ("folder", "shards")]
    assert summary[0] == summary[1]
    info = json.loads((tmp_path / "shards" / "splits" / "ne-america" / "manifest_info.json").read_text())
    assert info["store"] == "shards" and Path(info["image_root"]) == (tmp_path / "shards" / "data" / "shards").resolve()
    shard = tmp_path / "shards" / "data" / "shards" / "000000.tar"
    data = bytearray(shard.read_bytes())
    data[700] ^= 1
    shard.write_bytes(bytes(data))
    manifests = snapshot(tmp_path / "shards" / "splits")
    assert script("make_splits", ["--occurrences", str(path), "--taxon-filter", "moths", "--id-species",
                                  str(tmp_path / "ids.csv"), "--image-root", str(tmp_path / "shards" / "data"),
                                  "--out", str(tmp_path / "shards" / "splits")]) == 2
    (line,) = error_lines(capsys)
    assert line.startswith("error: ") and str(shard) in line and "sha256" in line
    assert snapshot(tmp_path / "shards" / "splits") == manifests  # the manifests written before are kept
    with pytest.raises(ShardError, match="sha256"):  # and a run on them is stopped the same way
        images_fingerprint(read_manifest(tmp_path / "shards" / "splits" / "ne-america"), "stat")
