"""scripts/pack_shards.py (dry run with estimates, pack, resume, --verify), import_folder and make_splits with
`--store shards`: each bad input is one line and exit 2, nothing lost."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.cli import run_main
from pipelines.data import Manifest, make_row, read_manifest, write_manifest
from pipelines.store import STORE_FILE, MemberPath
from tests.pipelines.own_data_helpers import class_tree

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    module = importlib.import_module(f"oodforge.commands.{name}")
    return module


@pytest.fixture()
def source(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        path = tmp_path / "src" / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)).save(path, quality=90)
        rows.append(make_row(f"{i}.jpg", split="train", label=i % 2))
    write_manifest(tmp_path / "src", rows)
    (tmp_path / "src" / "class_names.json").write_text(json.dumps({"names": ["a", "b"]}))
    return tmp_path / "src"


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_dry_run_estimates_time_and_disk_and_writes_nothing(source, tmp_path, capsys):
    script = load("pack_shards")
    out = tmp_path / "out"
    args = ([str(source), "--out", str(out), "--samples-per-shard", "4", "--resize", "keep_ratio", "--short-side",
             "128", "--workers", "1"])
    assert run_main(script.main, args + ["--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "would pack 6 of 6 images into 2 shard(s) (0 of 2 already finished)" in text
    assert "estimate at the rate measured here" in text and "GB of shards" in text
    assert not out.exists()
    assert run_main(script.main, args) == 0
    assert "2 shard(s) written, 0 kept" in capsys.readouterr().out
    manifest = read_manifest(out, check_files=True)
    assert all(isinstance(manifest.path(r), MemberPath) for r in manifest.rows)
    assert (out / "class_names.json").read_text() == (source / "class_names.json").read_text()
    assert run_main(script.main, args + ["--dry-run"]) == 0
    assert "would pack 0 of 6 images into 0 shard(s) (2 of 2 already finished)" in capsys.readouterr().out
    assert run_main(script.main, args) == 0
    assert "0 shard(s) written, 2 kept" in capsys.readouterr().out


def test_verify_passes_a_sound_store_and_names_a_broken_shard(source, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OODFORGE_PROGRESS", "off")
    script = load("pack_shards")
    out = tmp_path / "out"
    assert run_main(script.main, [str(source), "--out", str(out), "--samples-per-shard", "4", "--workers", "1"]) == 0
    capsys.readouterr()
    assert run_main(script.main, ["--verify", str(out)]) == 0
    assert "2 shard(s) in" in capsys.readouterr().out
    shard = out / "shards" / "000001.tar"
    shard.write_bytes(shard.read_bytes()[:-2048])
    assert run_main(script.main, ["--verify", str(out / "shards")]) == 2
    line = _error_line(capsys)
    assert line.startswith("error: 1 problem(s) in the store") and "000001.tar" in line and "truncated" in line
    assert run_main(script.main, ["--verify", str(tmp_path)]) == 2
    assert "neither a shard store" in _error_line(capsys)


def test_bad_sources_and_options_are_one_line(source, tmp_path, capsys):
    script = load("pack_shards")
    assert run_main(script.main, [str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 2
    assert "not a manifest folder" in _error_line(capsys)
    assert run_main(script.main, [str(source), "--out", str(tmp_path / "o"), "--quality", "101"]) == 2
    assert "quality" in _error_line(capsys)
    assert not (tmp_path / "o").exists()


def test_a_changed_shard_is_a_shard_error_naming_it(source, tmp_path):
    from pipelines.fingerprint import images_fingerprint
    from pipelines.store import ShardError

    script = load("pack_shards")
    out = tmp_path / "out"
    assert run_main(script.main, [str(source), "--out", str(out), "--workers", "1"]) == 0
    (out / "shards" / "000000.tar").write_bytes(b"")
    with pytest.raises(ShardError, match="000000.tar: 0 bytes, the store recorded"):
        images_fingerprint(read_manifest(out))


def test_import_folder_store_shards(tmp_path, capsys):
    script = load("import_folder")
    photos = class_tree(tmp_path / "photos", {"train": 3, "val": 1, "test": 1})
    assert run_main(script.main, [str(photos), "--out", str(tmp_path / "id"), "--store", "shards"]) == 0
    assert "packed into 1 shard(s)" in capsys.readouterr().out
    manifest = read_manifest(tmp_path / "id", check_files=True)
    assert all(isinstance(manifest.path(r), MemberPath) for r in manifest.rows)
    assert (tmp_path / "id" / "shards" / STORE_FILE).is_file()
    assert sorted(r["split"] for r in manifest.rows) == sorted(r["split"] for r in manifest.rows)  # rows kept
    assert {manifest.path(r).read_bytes() for r in manifest.rows} == {
        (photos / r["file_name"]).read_bytes() for r in manifest.rows}  # small images stay byte for byte
    assert run_main(script.main, [str(photos), "--out", str(tmp_path / "id"), "--store", "shards"]) == 0  # rerun
    assert read_manifest(tmp_path / "id").rows == manifest.rows


def test_make_splits_store_shards_packs_the_regions_images_once(tmp_path, capsys):
    script = load("make_splits")
    out = tmp_path / "splits"
    assert run_main(script.main, ["--synthetic", "4000", "--out", str(out), "--store", "shards", "--min-images", "1",
                                  "--allow-missing-id-species"]) == 0
    text = capsys.readouterr().out
    assert "packed" in text and "missing" in text  # synthetic rows name no image on disk
    regions = [p.parent for p in out.glob("*/metadata.jsonl")]
    assert regions
    for folder in regions:
        info = json.loads((folder / "manifest_info.json").read_text())
        assert info["image_root"] == "../shards" and info["store"] == "shards" and "config" in info
        assert read_manifest(folder).root.resolve() == (out / "shards").resolve()


def test_verify_checks_every_shard_row_against_the_store_and_readers_refuse_an_escaping_row(source, tmp_path, capsys,
                                                                                             monkeypatch):
    """A row with `shard_file: ../../../outside/evil.tar` fails `--verify`."""
    from pipelines.fingerprint import images_fingerprint
    from pipelines.store import ShardError

    monkeypatch.setenv("OODFORGE_PROGRESS", "off")
    script = load("pack_shards")
    out = tmp_path / "out"
    assert run_main(script.main, [str(source), "--out", str(out), "--samples-per-shard", "4", "--workers", "1"]) == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.tar").write_bytes((out / "shards" / "000000.tar").read_bytes())  # a real tar, outside the store
    (out / "shards" / "stray.tar").write_bytes((out / "shards" / "000001.tar").read_bytes())  # inside, unrecorded
    good = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    bad = [dict(r) for r in good]
    bad[1]["shard_file"] = "../../../outside/evil.tar"
    bad[2]["shard_file"] = "stray.tar"
    bad[3]["shard_offset"] += 512
    bad[4]["shard_member"] = "nobody.jpg"
    (out / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    capsys.readouterr()
    assert run_main(script.main, ["--verify", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: 4 problem(s) in the store") and "line 2" in err[-1], err
    assert "invalid shard reference (shard_file '../../../outside/evil.tar'" in err[-1]
    lines = "\n".join(err)
    assert "line 3: '2.jpg': shard_file 'stray.tar' is not in" in lines and "line 4:" in lines and "at offset" in lines
    assert "line 5: shard_member 'nobody.jpg' is not in the index of" in lines and "line 1:" not in lines
    manifest = read_manifest(out)
    for row in bad[1:3]:  # every reader: neither the escaping row nor the unrecorded shard has a path or a run key
        with pytest.raises(ShardError):
            images_fingerprint(Manifest(manifest.root, [row]))
    with pytest.raises(ShardError, match="invalid shard reference"):
        manifest.path(bad[1])
    with pytest.raises(ShardError, match="shard_file 'stray.tar' is not in .*store.json"):
        manifest.path(bad[2])
    (out / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good))
    assert run_main(script.main, ["--verify", str(out)]) == 0
