"""Attacks on where fetch_images writes: file names the file system cannot hold, the run's own outputs as a
`file_name`, a folder as a `file_name`, and a full disk. Each bad row is one final
failure in failures.csv with the rest fetched; a full disk is one line naming the path, exit 2."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pandas as pd
import pytest
from helpers.http_server import HostileServer

from oodforge.commands import fetch_images
from pipelines.cli import run_main
from pipelines.curation import fetch_ledger
from pipelines.curation.fetch_ledger import LEDGER, NAME_MAX, PATH_MAX, RESERVED

FAST = ["--backoff", "0.01", "--timeout", "1", "--min-bytes", "100", "--min-side", "32", "--workers", "2",
        "--resize", "keep_ratio"]


@pytest.fixture()
def server():
    with HostileServer() as s:
        yield s


def fetch(argv: list[str]) -> int:
    return run_main(fetch_images.main, argv)


def table(path: Path, urls: list[str], file_names: list[str]) -> Path:
    pd.DataFrame({"url": urls, "species": "Moth a", "file_name": file_names}).to_csv(path, index=False)
    return path


def failures(out: Path) -> dict[str, str]:
    frame = pd.read_csv(out / "failures.csv", keep_default_na=False)
    assert all(str(f) == "True" for f in frame["final"])
    return dict(zip(frame["file_name"], frame["reason"]))


def test_names_too_long_for_the_file_system_fail_their_row_and_the_rest_are_fetched(server, tmp_path, capsys):
    """A 5,000-character name; 30 folders of 200 characters (each part fits, the path does not)."""
    names = {"/img/1.png": "images/" + "a" * 5000 + ".png", "/img/2.png": "/".join(["b" * 200] * 30) + ".png",
             "/img/3.png": "images/" + "c" * (NAME_MAX - 4) + ".png", "/img/4.png": "images/good.png"}
    out = tmp_path / "out"
    table(tmp_path / "occ.csv", [server.base + p for p in names], list(names.values()))
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    reasons = failures(out)
    assert set(reasons) == {names["/img/1.png"], names["/img/2.png"]}
    assert f"a part of 5004 bytes; at most {NAME_MAX}" in reasons[names["/img/1.png"]]
    assert f"at most {PATH_MAX - 1})" in reasons[names["/img/2.png"]]
    assert all(len(r) < 400 for r in reasons.values())  # the name is cut in the message, one readable line
    fetched = pd.read_csv(out / "images.csv")["file_name"].tolist()
    assert sorted(fetched) == sorted([names["/img/3.png"], "images/good.png"])  # a 255-byte part still fits
    assert server.counts["/img/1.png"] == server.counts["/img/2.png"] == 0  # refused before any request
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST, "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["refused"] == 2


@pytest.mark.parametrize("name", ["images.csv", "failures.csv", "fetch_summary.json", "IMAGES.CSV", "./images.csv",
                                  ".fetch/ledger.jsonl", "originals/x.png", "shards/000000.tar", ".oodforge.lock"])
def test_the_runs_own_outputs_are_refused_as_file_names(server, tmp_path, name):
    """`file_name: images.csv` (or another of the run's own outputs) fails its row: the run's own file would
    overwrite the image."""
    out = tmp_path / "out"
    table(tmp_path / "occ.csv", [server.base + "/img/1.png", server.base + "/img/2.png"], [name, "images/ok.png"])
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST, "--keep-originals"]) == 0
    assert "is the fetch's own output in --out" in failures(out)[name]
    kept = pd.read_csv(out / "images.csv")  # the run's table is a table, and its one row is the good image
    assert kept["file_name"].tolist() == ["images/ok.png"]
    assert (out / "originals" / "images" / "ok.png").is_file()  # the run's own folder still takes its own writes
    assert server.counts["/img/1.png"] == 0
    assert set(RESERVED) >= {"images.csv", "failures.csv", "fetch_summary.json", "filtered.csv", ".fetch"}


def test_a_folder_as_a_file_name_fails_its_row_whether_it_exists_or_other_rows_create_it(server, tmp_path, capsys):
    """`file_name: images` where images/ exists (or other rows' names make it) fails that row, never an
    IsADirectoryError or FileExistsError traceback."""
    out = tmp_path / "out"
    (out / "made").mkdir(parents=True)
    names = {"/img/1.png": "made", "/img/2.png": "images", "/img/3.png": "images/a.png", "/img/4.png": "images/b.png"}
    table(tmp_path / "occ.csv", [server.base + p for p in names], list(names.values()))
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]) == 0
    assert "Traceback" not in capsys.readouterr().err
    reasons = failures(out)
    assert reasons == {"made": "file_name 'made' exists and is not a regular file",
                       "images": "unsafe file_name 'images': other rows' file_names lie in this folder"}
    assert sorted(pd.read_csv(out / "images.csv")["file_name"]) == ["images/a.png", "images/b.png"]
    assert (out / "made").is_dir()


def test_a_row_whose_write_the_file_system_refuses_fails_alone(server, tmp_path, monkeypatch):
    """What no check foresees (a folder appearing between the plan and the write): the write's own error fails
    that row only, and its content is not held against a later URL."""
    import pipelines.curation.fetch as fetch_module

    real = fetch_module.atomic_write_bytes

    def write(path, data):
        if path.name == "a.png":
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        real(path, data)

    monkeypatch.setattr(fetch_module, "atomic_write_bytes", write)
    out = tmp_path / "out"
    # the same image served twice: the second URL gets it when the first cannot be written
    table(tmp_path / "occ.csv", [server.base + "/img/1.png", server.base + "/img/1.png?again"],
          ["images/a.png", "images/b.png"])
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST, "--workers", "1"]) == 0
    assert failures(out) == {"images/a.png": "file_name 'images/a.png' cannot be written: Is a directory"}
    assert pd.read_csv(out / "images.csv")["file_name"].tolist() == ["images/b.png"]


class _FullDisk:
    """A ledger file whose buffered writes fail as a full disk's do: an OSError with no file name."""

    def __init__(self, handle, after: int):
        self.handle, self.left = handle, after

    def write(self, text: str) -> int:
        return self.handle.write(text)

    def flush(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


def test_a_full_disk_during_fetch_is_one_line_naming_the_path(server, tmp_path, capsys, monkeypatch):
    """The README promises `error: <path>: No space left on device`, the ledger's append included."""
    real_init = fetch_ledger.Ledger.__init__

    def init(self, out):
        real_init(self, out)
        self.handle = _FullDisk(self.handle, after=3)

    monkeypatch.setattr(fetch_ledger.Ledger, "__init__", init)
    out = tmp_path / "out"
    table(tmp_path / "occ.csv", [server.base + f"/img/{i}.png" for i in range(8)],
          [f"images/{i}.png" for i in range(8)])
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"error: {out / LEDGER}: No space left on device; free some disk space"), lines[0]
    monkeypatch.setattr(fetch_ledger.Ledger, "__init__", real_init)
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]) == 0  # the rerun finishes
    assert len(pd.read_csv(out / "images.csv")) == 8


def test_a_full_disk_while_writing_a_shard_names_the_shard(server, tmp_path, capsys, monkeypatch):
    """A full disk with `store: shards`: the tar being written is named (a buffered write's error carries no file
    name)."""
    from pipelines import shards

    real_add, calls = shards.ShardWriter.add, []

    def add(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_add(self, *args, **kwargs)

    monkeypatch.setattr(shards.ShardWriter, "add", add)
    out = tmp_path / "out"
    table(tmp_path / "occ.csv", [server.base + f"/img/{i}.png" for i in range(6)],
          [f"images/{i}.png" for i in range(6)])
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST, "--store", "shards"]
    assert fetch(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"error: {out / 'shards' / '000000.tar'}: No space left on device"), lines[0]
    monkeypatch.setattr(shards.ShardWriter, "add", real_add)
    assert fetch(argv) == 0 and len(pd.read_csv(out / "images.csv")) == 6  # the rerun rewrites the unfinished shard
