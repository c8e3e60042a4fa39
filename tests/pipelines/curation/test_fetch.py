"""fetch_images against the misbehaving loopback server (`helpers.http_server`): failing (500 / 404), flaky,
redirecting, hanging, duplicate and thumbnail URLs; resume after a rerun and after a kill -9 (at a point the server's
gate fixes, not a timing window); the classifier filter; the dry run. The hostile inputs are in
test_fetch_attacks.py, the scheduler and the resize in their own files."""
from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from helpers.gbif import build_archive
from helpers.http_server import HostileServer, png, seed
from PIL import Image

from oodforge.commands import fetch_images
from pipelines.cli import run_main
from pipelines.curation.gbif import image_file_name

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "fetch_images.py"


@pytest.fixture()
def server():
    with HostileServer() as s:
        yield s


def table(base: str, paths: list[str], species: list[str] | None = None) -> pd.DataFrame:
    return pd.DataFrame({"gbifID": [str(1000 + i) for i in range(len(paths))], "url": [base + p for p in paths],
                         "species": species or [f"Moth sp{i % 3}" for i in range(len(paths))],
                         "genus": "Moth", "family": "Noctuidae", "decimalLatitude": "50.0",
                         "decimalLongitude": "-70.0"})


def fetch(argv: list[str]) -> int:
    return run_main(fetch_images.main, argv)


FAST = ["--backoff", "0.01", "--timeout", "0.5", "--min-bytes", "100", "--min-side", "32", "--workers", "4"]


@pytest.mark.slow
def test_fetch_records_every_failure_and_a_rerun_fetches_only_what_is_missing(server, tmp_path, capsys):
    paths = ["/img/1.png", "/img/2.png", "/slow/3.png", "/flaky/4.png", "/fail/5", "/missing/6", "/redirect/7.png",
             "/img/0.png", "/dup/8.png", "/tiny/9.png", "/short/10", "/hang/11", "/thumb/12.jpg", "/img/1.png"]
    table(server.base, paths).to_csv(tmp_path / "occ.csv", index=False)
    out = tmp_path / "fetched"
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), "--retries", "2", *FAST]
    assert fetch(argv) == 0
    images = pd.read_csv(out / "images.csv", dtype=str)
    want = ["/img/1.png", "/img/2.png", "/slow/3.png", "/flaky/4.png", "/redirect/7.png", "/img/0.png"]
    assert sorted(images["url"]) == sorted(server.base + p for p in want)
    assert images["file_name"].tolist() == [image_file_name(u) for u in images["url"]]
    for name in images["file_name"]:
        with Image.open(out / name) as image:  # the reference resize: 200 x 150 -> shorter side 224, int(224 * 4 / 3)
            assert image.size == (298, 224)
    assert "lat" in images.columns and images["gbifID"].notna().all()  # GBIF names mapped, ids kept
    failures = pd.read_csv(out / "failures.csv").set_index("url")["reason"]
    reasons = {u.removeprefix(server.base): r for u, r in failures.items()}
    assert reasons == {"/fail/5": "HTTP 500 (after 2 retries)", "/missing/6": "HTTP 404",
                       "/dup/8.png": f"duplicate content of {image_file_name(server.base + '/img/0.png')}",
                       "/tiny/9.png": "thumbnail (16x16 < min_side=32)",
                       "/short/10": "too small (10 bytes < min_bytes=100)",
                       "/hang/11": "timeout (after 2 retries)", "/thumb/12.jpg": "thumbnail URL"}
    assert server.counts["/fail/5"] == 3 and server.counts["/missing/6"] == 1 and server.counts["/flaky/4.png"] == 2
    assert server.counts["/thumb/12.jpg"] == 0 and server.counts["/img/1.png"] == 1  # the duplicate URL fetched once
    summary = json.loads((out / "fetch_summary.json").read_text())
    assert summary["dropped"] == {"duplicate URL": 1} and summary["kept"] == 6
    assert summary["failed"] == {"HTTP 500": 1, "HTTP 404": 1, "duplicate content": 1, "thumbnail": 1, "too small": 1,
                                 "timeout": 1, "thumbnail URL": 1}
    before = Counter(server.counts)
    assert fetch(argv) == 0  # rerun: only the transient failures (500, timeout) are tried again
    again = {p: server.counts[p] - before[p] for p in server.counts if server.counts[p] != before[p]}
    assert again == {"/fail/5": 3, "/hang/11": 3}
    assert pd.read_csv(out / "images.csv", dtype=str)["url"].tolist() == images["url"].tolist()
    capsys.readouterr()


def test_cap_per_species_taxon_filter_and_bad_options(server, tmp_path, capsys):
    paths = [f"/img/{i}.png" for i in range(1, 9)]
    frame = table(server.base, paths, species=["Moth a"] * 5 + ["Moth b"] * 2 + [""])
    frame.loc[6, "family"] = "Nymphalidae"
    frame.to_csv(tmp_path / "occ.tsv", index=False, sep="\t")
    out = tmp_path / "out"
    assert fetch(["--occurrences", str(tmp_path / "occ.tsv"), "--out", str(out), "--per-species", "3",
                  "--exclude", "family=Nymphalidae", *FAST]) == 0
    images = pd.read_csv(out / "images.csv", dtype=str)
    assert images["species"].value_counts().to_dict() == {"Moth a": 3, "Moth b": 1}
    summary = json.loads((out / "fetch_summary.json").read_text())
    assert summary["dropped"] == {"taxon filter": 1, "blank species": 1, "over the species cap": 2}
    capsys.readouterr()
    for extra, message in ((["--rate", "0"], "--rate: must be > 0"),
                           (["--workers", "two"], "argument --workers: invalid int value: 'two'"),
                           (["--per-species", "-1"], "--per-species: must be >= 1"),
                           (["--thumbnail-pattern", "(["], "--thumbnail-pattern: not a regular expression"),
                           (["--taxon-filter", "moth"], "--taxon-filter: must be one of 'moths'")):
        assert fetch(["--occurrences", str(tmp_path / "occ.tsv"), "--out", str(tmp_path / "bad"), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and message in err, err
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_fetches_only_what_is_missing(tmp_path):
    """The server answers the first 6 URLs and holds the rest: once both workers are held, exactly 6 images are
    finished (each worker finishes an image before it takes the next), and the kill comes then."""
    paths = [f"/gate/{i}.png" for i in range(24)]
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--occurrences", str(tmp_path / "occ.csv"), "--out", str(out),
           "--workers", "2", "--min-bytes", "100", "--min-side", "32"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OODFORGE_PROGRESS": "off"}
    with HostileServer(gate_from=6) as server:
        table(server.base, paths).to_csv(tmp_path / "occ.csv", index=False)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert server.wait_blocked(2), proc.stderr.read() if proc.poll() is not None else "no request held"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        done = {p.relative_to(out).as_posix() for p in (out / "images").rglob("*.png") if not p.name.startswith(".")}
        names = {server.base + p: image_file_name(server.base + p) for p in paths}
        assert done == {names[server.base + p] for p in paths[:6]}
        for name in done:  # never a partial file under the final name
            with Image.open(out / name) as image:
                assert image.size == (298, 224)
        counts_at_kill = Counter(server.counts)
        server.release.set()
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        for url, name in names.items():
            path = url.removeprefix(server.base)
            assert server.counts[path] - counts_at_kill[path] == (0 if name in done else 1), path
    images = pd.read_csv(out / "images.csv", dtype=str)
    assert sorted(images["file_name"]) == sorted(names.values())
    assert not [p for p in out.rglob(".*.tmp*")]  # the killed run's temp files are gone
    assert not (out / ".oodforge.lock").exists()  # the killed run's lock was taken over, the rerun's removed


def test_classifier_filter_drops_a_class_and_records_it(server, tmp_path, capsys):
    """The life-stage filter: any image-classifier folder (a tiny random ResNet here) over the fetched images."""
    import torch
    from helpers.models import tiny_resnet_classifier

    model = tiny_resnet_classifier(tmp_path / "lifestage", classes=3, seed=1)
    paths = [f"/img/{i}.png" for i in range(1, 13)]
    table(server.base, paths).to_csv(tmp_path / "occ.csv", index=False)
    out = tmp_path / "out"
    with torch.no_grad():
        images = [Image.open(io.BytesIO(png(seed(p)))).convert("RGB") for p in paths]
        predicted = model(model.preprocess(images))[0].argmax(1).tolist()
    names = model.class_names
    drop = names[Counter(predicted).most_common(1)[0][0]]
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST,
                  "--filter-model", str(tmp_path / "lifestage"), "--drop-class", drop]) == 0
    filtered = pd.read_csv(out / "filtered.csv", dtype=str)
    kept = pd.read_csv(out / "images.csv", dtype=str)
    want = {server.base + p for p, c in zip(paths, predicted) if names[c] == drop}
    assert set(filtered["url"]) == want and set(filtered["predicted"]) == {drop}
    assert set(kept["url"]) == {server.base + p for p in paths} - want
    assert json.loads((out / "fetch_summary.json").read_text())["filtered"] == {drop: len(want)}
    capsys.readouterr()
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), "--filter-model",
                  str(tmp_path / "lifestage"), "--drop-class", "pupa"]) == 2
    assert "--drop-class: ['pupa'] not among the classifier's classes" in capsys.readouterr().err
    requests = sum(server.counts.values())
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(tmp_path / "never"), "--filter-model",
                  str(tmp_path / "lifestage"), "--drop-class", "pupa"]) == 2
    assert sum(server.counts.values()) == requests and not (tmp_path / "never").exists()  # refused before any download
    capsys.readouterr()
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(tmp_path / "x"), "--filter-model",
                  str(tmp_path / "no-such-model"), "--drop-class", "pupa"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --filter-model: the local model folder") and "huggingface" not in err, err


def test_dry_run_counts_what_a_run_would_fetch_and_requests_nothing(server, tmp_path, capsys):
    paths = ["/img/1.png", "/img/2.png", "/missing/3", "/img/4.png", "/img/4.png"]
    frame = table(server.base, paths)
    frame.loc[3, "species"] = ""
    frame.to_csv(tmp_path / "occ.csv", index=False)
    out = tmp_path / "out"
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]

    def dry() -> dict:
        capsys.readouterr()
        before = sum(server.counts.values())
        assert fetch([*argv, "--dry-run"]) == 0
        assert sum(server.counts.values()) == before  # nothing requested
        captured = capsys.readouterr()
        assert captured.err.startswith("estimate: ")  # the cost in words, before any work
        return json.loads(captured.out)

    first = dry()
    assert not out.exists()
    estimate = first.pop("estimate")
    assert first == {"planned": 4, "dropped": {"blank species": 1}, "already_fetched": 0, "failed_for_good": 0,
                     "refused": 0, "to_fetch": 4, "hosts": 1}  # the blank-species row goes first, so its URL's other
                                                               # row is kept
    assert estimate["source"] is None or estimate["source"].startswith("benchmarks/fetch.json")
    assert fetch(argv) == 0
    after = dry()
    assert (after["already_fetched"], after["failed_for_good"], after["to_fetch"]) == (3, 1, 0)  # the 404 is final
    assert fetch([*argv, "--retry-failed", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["to_fetch"] == 1


@pytest.mark.slow
def test_readme_path_gbif_zip_to_images_to_splits(server, tmp_path):
    """The README's two commands as written (fetch_images then make_splits on the same GBIF zip), the archive's image
    URLs served on the loopback."""
    readme = (ROOT / "README.md").read_text()
    lines = [line for line in readme.splitlines()
             if line.startswith(("python scripts/fetch_images.py --occurrences gbif.zip",
                                 "python scripts/make_splits.py --occurrences gbif.zip",
                                 "oodforge fetch-images --occurrences gbif.zip",
                                 "oodforge make-splits --occurrences gbif.zip"))]
    commands = [line.split()[1].removeprefix("scripts/").removesuffix(".py").replace("_", "-") for line in lines]
    assert commands == ["fetch-images", "make-splits"]
    path, ids = build_archive(tmp_path / "download", base=server.base)
    path.rename(tmp_path / "gbif.zip")
    ids.to_csv(tmp_path / "ids.csv", index=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OODFORGE_PROGRESS": "off"}
    for command, line in zip(commands, lines):
        argv = shlex.split(line)[2:]
        run = subprocess.run([sys.executable, "-m", "oodforge", command, *argv], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
    fetched = json.loads((tmp_path / "data/moths/fetch_summary.json").read_text())
    assert fetched["dropped"] == {"taxon filter": 24, "blank species": 1, "duplicate URL": 1} and not fetched["failed"]
    record = json.loads((tmp_path / "splits/summary.json").read_text())
    assert record["dropped"] == {"taxon filter": 24, "no coordinates": 1, "duplicate URL": 1, "missing file": 1}
    assert record["shortfalls"] == [{"region": "ne-america", "what": "auxiliary species with >= 20 images",
                                     "requested": 8000, "found": 4}]
    rows = [json.loads(line) for line in open(tmp_path / "splits/ne-america/metadata.jsonl")]
    assert {r["species"] for r in rows if r["role"] == "id"} == {"Idmoth sp0", "Idmoth sp1", "Idmoth sp2"}
    assert all((tmp_path / "data/moths" / r["file_name"]).is_file() and r["gbifID"] and r["speciesKey"] for r in rows)
    assert len(rows) == sum(s["images"] for s in record["sets"])


def test_the_url_earliest_in_the_table_keeps_a_duplicated_content(server, tmp_path, capsys):
    out = tmp_path / "out"
    for order in (["/img/0.png", "/dup/8.png"], ["/dup/8.png", "/img/0.png"]):
        table(server.base, order).to_csv(tmp_path / "occ.csv", index=False)
        assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), "--retry-failed", *FAST]) == 0
        kept = pd.read_csv(out / "images.csv", dtype=str)
        assert kept["url"].tolist() == [server.base + order[0]]
        assert [p.name for p in (out / "images").rglob("*.png")] == [Path(kept["file_name"][0]).name]
        reasons = pd.read_csv(out / "failures.csv")["reason"].tolist()
        assert reasons == [f"duplicate content of {kept['file_name'][0]}"]
    capsys.readouterr()


def test_a_full_disk_stops_the_fetch_in_one_line_and_the_rerun_resumes(server, tmp_path, capsys, monkeypatch):
    import errno

    import pipelines.curation.fetch as fetch_module

    paths = [f"/img/{i}.png" for i in range(40)]
    table(server.base, paths).to_csv(tmp_path / "occ.csv", index=False)
    out = tmp_path / "out"
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]
    real_write, writes = fetch_module.atomic_write_bytes, []

    def write_until_full(path, data):
        if len(writes) >= 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        writes.append(path)
        real_write(path, data)

    monkeypatch.setattr(fetch_module, "atomic_write_bytes", write_until_full)
    assert fetch(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "No space left on device" in errors[0] and "Traceback" not in err, err
    assert "free some disk space, then rerun the same command" in errors[0]
    assert sum(server.counts.values()) < len(paths)  # the fetch stopped: the queued downloads were not all made
    done = {p.name for p in (out / "images").rglob("*.png") if not p.name.startswith(".")}
    assert len(done) == 3
    monkeypatch.setattr(fetch_module, "atomic_write_bytes", real_write)
    counts_before = Counter(server.counts)
    assert fetch(argv) == 0
    assert len(pd.read_csv(out / "images.csv")) == len(paths)
    refetched = [p for p in paths if server.counts[p] > counts_before[p]]
    assert len(refetched) == len(paths) - 3  # the three finished images are not downloaded again
