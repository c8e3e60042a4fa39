"""The released Open-Insect benchmark imported from its three sources (`helpers.open_insect` builds stand-ins in the
released layouts): every released row in its released split, set and label, the images where download.py puts them
(fetched through fetch_images from the loopback server where they are not on disk), missing images counted and
listed, bad lines one line naming the file and line, the hub id read through `load_dataset` (a stand-in module built
from the repository's own files: `datasets` is not a dependency)."""
from __future__ import annotations

import json
import sys
import types
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.http_server import HostileServer
from helpers.open_insect import (
    SIZES,
    bci_files,
    category_map,
    download_folder,
    hub_files,
    jpeg_bytes,
    released_rows,
    species_image,
    write_json,
)
from PIL import Image

from oodforge.commands import import_open_insect as command
from pipelines.cli import run_main
from pipelines.curation.open_insect import (
    BCI_HUB_ID,
    HUB_ID,
    RELEASE_SPLITS,
    OpenInsectError,
    read_category_map,
    read_release,
)
from pipelines.curation.open_insect_import import OpenInsectImport, import_open_insect
from pipelines.data import read_manifest

MAKE_SPLITS_SET = {"train_id": "id_train", "val_id": "id_val", "test_id": "id_test", "test_ood_local": "local_test",
                   "test_ood_non-local": "non_local_test", "test_ood_non-moth": "non_target_test",
                   "train_aux": "aux_train", "val_ood": "aux_val"}
"""Each released split and the make-splits set that holds the same rows (the paper's protocol)."""


def run(argv: list[str]) -> int:
    return run_main(command.main, argv)


def imported(source: Path | str, out: Path, **options) -> pd.DataFrame:
    cfg = OpenInsectImport.from_dict({"source": str(source), "out": str(out), "region": "c-america", **options})
    import_open_insect(cfg)
    folder = out / ("field_bci" if options.get("bci") else "c-america")
    manifest = read_manifest(folder)
    frame = pd.DataFrame(manifest.rows)
    return frame.assign(path=[str(p) for p in manifest.paths()])


def test_released_splits_are_the_sets_make_splits_writes():
    from gen.insects.manifests import SET_FIELDS

    assert set(MAKE_SPLITS_SET) == set(RELEASE_SPLITS)
    for release, fields in RELEASE_SPLITS.items():
        assert fields == SET_FIELDS[MAKE_SPLITS_SET[release]], release


def test_a_download_folder_imports_every_row_in_its_released_split(tmp_path):
    released = download_folder(tmp_path / "src")
    mapping = category_map(6)
    frame = imported(tmp_path / "src", tmp_path / "splits",
                     category_map=str(write_json(tmp_path / "c-america_category_map.json", mapping)))
    names = {label: key for key, label in mapping.items()}
    for name, rows in released.items():
        got = frame[frame["release_split"] == name]
        want = (rows["image_path"].tolist(), rows["label"].tolist())
        assert (got["file_name"].tolist(), got["label"].tolist()) == want, name  # every row, in the list's order
        split, role, ood_set, group = RELEASE_SPLITS[name]
        assert set(zip(got["split"], got["role"], got["ood_set"].fillna("-"), got["group"].fillna("-"))) == {
            (split, role, ood_set or "-", group or "-")}
        want_species = [names[label] for label in rows["label"]] if role == "id" else [None] * len(rows)
        assert got["species"].astype(object).where(got["species"].notna(), None).tolist() == want_species
    assert all(Path(p).is_file() and Path(p).is_relative_to(tmp_path / "src" / "images") for p in frame["path"])
    names_file = json.loads((tmp_path / "splits" / "c-america" / "class_names.json").read_text())
    assert names_file == {"names": [names[i] for i in range(6)], "label_field": "species", "levels": []}

    # the summary in make-splits' schema, as the report's Table 5 reads it; Table 1 counted from the lists by hand
    from detectors.harness.report.open_insects import split_counts

    table, hops, notes = split_counts(tmp_path / "splits")
    by_set = {(r.set, r.split): r.images for r in table.itertuples()}
    lines = {name: len((tmp_path / "src" / "metadata" / "c-america" / f"{name}.txt").read_text().splitlines())
             for name in SIZES}
    assert by_set == {("id", "train"): lines["train_id"], ("id", "val"): lines["val_id"],
                      ("id", "test"): lines["test_id"], ("local", "test"): lines["test_ood_local"],
                      ("non_local", "test"): lines["test_ood_non-local"],
                      ("non_target", "test"): lines["test_ood_non-moth"],
                      ("auxiliary", "train"): lines["train_aux"], ("auxiliary", "val"): lines["val_ood"]}
    assert notes == [] and set(table[table.set == "id"]["species"]) == {6}


def test_the_bci_field_set_of_a_download_folder(tmp_path):
    download_folder(tmp_path / "src", bci=4)
    frame = imported(tmp_path / "src", tmp_path / "data", bci=True)
    assert frame["file_name"].tolist() == [f"bci/BCI_{i:04d}.jpg" for i in range(4)]
    assert set(frame["ood_set"]) == {"bci"} and set(frame["role"]) == {"ood"} and set(frame["split"]) == {"test"}
    assert all(Path(p).is_file() for p in frame["path"])
    with pytest.raises(Exception, match="region: the BCI field set is c-america's"):
        OpenInsectImport.from_dict({"source": "x", "out": "y", "region": "w-europe", "bci": True})


def test_missing_images_are_counted_listed_and_left_out(tmp_path, capsys):
    released = download_folder(tmp_path / "src", bci=0)
    gone = [released["test_id"]["image_path"][1], released["train_aux"]["image_path"][0]]
    for path in gone:
        (tmp_path / "src" / "images" / path).unlink()
    assert run([str(tmp_path / "src"), "--region", "c-america", "--out", str(tmp_path / "splits")]) == 0
    out = capsys.readouterr().out
    assert "2 image(s) missing" in out and f"test_id: {gone[0]}: image not found" in out
    missing = pd.read_csv(tmp_path / "splits" / "c-america" / "missing.csv")
    assert missing[["release_split", "image_path"]].values.tolist() == [["test_id", gone[0]], ["train_aux", gone[1]]]
    rows = read_manifest(tmp_path / "splits" / "c-america").rows
    assert len(rows) == sum(map(len, released.values())) - 2 and not {r["file_name"] for r in rows} & set(gone)
    info = json.loads((tmp_path / "splits" / "c-america" / "manifest_info.json").read_text())
    assert info["missing_images"] == 2 and info["classes"] is None
    summary = json.loads((tmp_path / "splits" / "summary.json").read_text())
    assert summary["dropped"] == {"missing image (c-america)": 2}


def test_dry_run_prints_table_1_and_writes_nothing(tmp_path, capsys):
    download_folder(tmp_path / "src", bci=0)
    assert run([str(tmp_path / "src"), "--region", "c-america", "--out", str(tmp_path / "splits"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    table = [line.split() for line in out.splitlines()[1:9]]
    assert [(r[0], int(r[4])) for r in table] == [(n, s * (6 if n.endswith("_id") else 1)) for n, s in SIZES.items()]
    assert "dry run: every row checked" in out and not (tmp_path / "splits").exists()


BAD = [
    ("train_id", "../escape.jpg 0", "image_path '../escape.jpg' leaves the image root ('..')"),
    ("test_ood_local", "/etc/passwd -1", "image_path '/etc/passwd' is absolute"),
    ("train_id", "x/new.jpg 6", "label '6' of 'x/new.jpg': expected a label 0..5 of the category map"),
    ("val_ood", "x/new.jpg 3", "label '3' of 'x/new.jpg': expected -1 (OOD)"),
    ("val_id", "x/new.jpg", "'x/new.jpg' has no label (a line is `<image_path> <label>`)"),
    ("test_id", "x/new.jpg moth", "label 'moth' of 'x/new.jpg'"),
]


@pytest.mark.parametrize("split, line, message", BAD, ids=[b[2][:24] for b in BAD])
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_a_bad_line_is_one_line_naming_the_file_and_line(tmp_path, capsys, split, line, message, dry_run):
    download_folder(tmp_path / "src", bci=0)
    listing = tmp_path / "src" / "metadata" / "c-america" / f"{split}.txt"
    lines = listing.read_text().splitlines()
    listing.write_text("\n".join([*lines[:2], line, *lines[2:]]) + "\n")
    cmap = write_json(tmp_path / "map.json", category_map(6))
    argv = [str(tmp_path / "src"), "--region", "c-america", "--out", str(tmp_path / "splits"), "--category-map",
            str(cmap), *(["--dry-run"] if dry_run else [])]
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {listing}:3: ") and message in err, err
    assert not (tmp_path / "splits").exists()


def test_a_repeated_image_and_a_bad_category_map_are_one_line(tmp_path, capsys):
    released = download_folder(tmp_path / "src", bci=0)
    listing = tmp_path / "src" / "metadata" / "c-america" / "test_ood_local.txt"
    twice = released["train_aux"]["image_path"][0]
    listing.write_text(listing.read_text() + f"{twice} -1\n")
    assert run([str(tmp_path / "src"), "--region", "c-america", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"train_aux.txt:1: image_path {twice!r} is also at " in err and "test_ood_local.txt:7 (one image" in err
    for bad, message in (({"1": 0, "2": 2}, "label indices must be 0..1"), (["a"], "expected a JSON object")):
        with pytest.raises(OpenInsectError, match=message):
            read_category_map(write_json(tmp_path / "bad.json", bad))
    assert run([str(tmp_path / "src"), "--out", str(tmp_path / "o")]) == 2
    assert "error: --region: required" in capsys.readouterr().err


@pytest.fixture()
def server():
    with HostileServer() as s:
        yield s


@pytest.mark.slow
def test_repository_files_fetch_their_images_through_fetch_images(server, tmp_path, capsys):
    """The hub's files (its card's split names, CSV tables): images fetched by URL to OUT/images/<image_path>,
    resized as download.py --resize_size 224; a 404 is a missing image; a rerun requests nothing."""
    released = hub_files(tmp_path / "repo", server.base)
    table = tmp_path / "repo" / "c-america" / "test_ood_local.csv"
    frame = pd.read_csv(table, dtype=str)
    frame.loc[2, "identifier"] = server.base + "/missing/7.jpg"
    frame.to_csv(table, index=False)
    argv = [str(tmp_path / "repo"), "--region", "c-america", "--out", str(tmp_path / "splits"), "--workers", "4",
            "retries=0"]
    assert run([*argv, "--dry-run"]) == 0
    total = sum(map(len, released.values()))
    assert f"fetch: {total} URLs, 0 already fetched, {total} to fetch from 1 host(s)" in capsys.readouterr().out
    assert sum(server.counts.values()) == 0 and not (tmp_path / "splits").exists()
    assert run(argv) == 0
    rows = read_manifest(tmp_path / "splits" / "c-america")
    assert len(rows) == total - 1
    by_split = Counter(r["release_split"] for r in rows)
    assert by_split == {n: len(f) - (n == "test_ood_local") for n, f in released.items()}  # val_aux -> val_ood
    for row, path in zip(rows.rows[:3], rows.paths()[:3]):
        assert row["url"].startswith(server.base) and path == tmp_path / "splits" / "images" / row["file_name"]
        with Image.open(path) as image:
            assert image.size == (298, 224)  # the reference resize: 200 x 150 -> shorter side 224
    missing = pd.read_csv(tmp_path / "splits" / "c-america" / "missing.csv")
    assert missing[["release_split", "reason"]].values.tolist() == [["test_ood_local", "HTTP 404"]]
    assert rows.rows[0]["speciesKey"] == int(released["train_id"]["speciesKey"][0])  # released columns kept
    before = sum(server.counts.values())
    assert run(argv) == 0 and sum(server.counts.values()) == before + 0  # finished and final failures: no request
    capsys.readouterr()


def _stand_in_datasets(repo: Path, bci: Path, calls: list) -> types.ModuleType:
    """A `datasets` module whose `load_dataset` reads the repositories' own files as the hub would serve them: a
    mapping split -> a dataset with `to_pandas()`, the card's split names."""
    class Dataset:
        def __init__(self, frame: pd.DataFrame):
            self.frame = frame

        def to_pandas(self) -> pd.DataFrame:
            return self.frame.copy()

    def load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        if path == BCI_HUB_ID:
            return Dataset(pq.read_table(bci / "data" / "test-00000-of-00001.parquet").to_pandas())
        import yaml

        card = yaml.safe_load((repo / "README.md").read_text().split("---")[1])
        files = {f["split"]: f["path"] for c in card["configs"] if c["config_name"] == name for f in c["data_files"]}
        return {s: Dataset(pd.read_csv(repo / p, dtype={"image_path": str})) for s, p in files.items()}

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    return module


def test_the_hub_id_reads_through_load_dataset(server, tmp_path, monkeypatch):
    released = hub_files(tmp_path / "repo", server.base)
    bci = bci_files(tmp_path / "bci", n=3)
    calls: list = []
    monkeypatch.setitem(sys.modules, "datasets", _stand_in_datasets(tmp_path / "repo", tmp_path / "bci", calls))
    release = read_release(HUB_ID, "c-america")
    assert calls == [(HUB_ID, "c-america", None)] and release.kind == "hub" and release.absent == []
    for name, frame in released.items():
        got = release.splits[name].rows
        assert got["image_path"].tolist() == frame["image_path"].tolist()
        assert got["label"].tolist() == frame["label"].tolist()
    frame = imported(HUB_ID, tmp_path / "data", bci=True)  # images inside the rows: written as stored
    assert calls[-1] == (BCI_HUB_ID, None, "test")
    assert frame["file_name"].tolist() == [f"bci/{p}" for p in bci["image_path"]]
    for path, image in zip(frame["path"], bci["image"]):
        assert Path(path) == tmp_path / "data" / "images" / "bci" / Path(path).name
        assert Path(path).read_bytes() == image["bytes"]
    assert sum(server.counts.values()) == 0
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(OpenInsectError, match="needs the `datasets` package: pip install datasets"):
        read_release(HUB_ID, "c-america")


def test_parquet_shards_arrow_and_the_parquet_conversion_layouts(tmp_path):
    """The repository's tables in the layouts `push_to_hub` (`<split>-00000-of-00002.parquet`), the parquet
    conversion (`<split>/0000.parquet`) and the `datasets` cache (Arrow stream) write, with no card."""
    released = released_rows()
    root = tmp_path / "repo" / "c-america"
    root.mkdir(parents=True)
    for i, (name, frame) in enumerate(released.items()):
        hub = {"test_ood_non-local": "test_ood_non_local", "val_ood": "val_aux"}.get(name, name)
        table = pa.Table.from_pandas(frame, preserve_index=False)
        if i % 3 == 0:
            half = len(frame) // 2
            pq.write_table(table.slice(0, half), root / f"{hub}-00000-of-00002.parquet")
            pq.write_table(table.slice(half), root / f"{hub}-00001-of-00002.parquet")
        elif i % 3 == 1:
            (root / hub).mkdir()
            pq.write_table(table, root / hub / "0000.parquet")
        else:
            with pa.OSFile(str(root / f"{hub}.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
    release = read_release(str(tmp_path / "repo"), "c-america")
    assert release.kind == "files" and release.absent == []
    for name, frame in released.items():
        got = release.splits[name].rows.drop(columns="line")
        pd.testing.assert_frame_equal(got.reset_index(drop=True), frame, check_dtype=False)


def test_rows_carrying_images_are_written_inside_out(tmp_path):
    """An image_path of the BCI repository that leaves the image root is one line; stored bytes land under OUT."""
    root = tmp_path / "bci" / "data"
    root.mkdir(parents=True)
    data = jpeg_bytes(species_image("x", 1))
    pq.write_table(pa.table({"image": [{"bytes": data, "path": "a.jpg"}], "image_path": ["../../a.jpg"]}),
                   root / "test-00000-of-00001.parquet")
    with pytest.raises(OpenInsectError, match=r"test-00000-of-00001.parquet:1: image_path '../../a.jpg' leaves"):
        imported(tmp_path / "bci", tmp_path / "out", bci=True)
    assert not (tmp_path / "out").exists() and not (tmp_path / "a.jpg").exists()


def test_download_sh_writes_into_the_repository_checkout(tmp_path, capsys):
    """download.sh runs download.py with --download_dir . in the repository: its README.md, data/ and the class
    distributions in metadata/ sit beside metadata/<region>/; a region not downloaded is one line."""
    released = download_folder(tmp_path / "repo", bci=0)
    (tmp_path / "repo" / "README.md").write_text("# Open-Insect\n")
    (tmp_path / "repo" / "data").mkdir()
    write_json(tmp_path / "repo" / "data" / "c-america_category_map.json", category_map(6))
    write_json(tmp_path / "repo" / "metadata" / "c-america_id_class_distribution.json", {"0": 4})
    frame = imported(tmp_path / "repo", tmp_path / "splits")  # the checkout's own data/c-america_category_map.json
    assert len(frame) == sum(map(len, released.values()))
    names = {label: key for key, label in category_map(6).items()}
    ids = frame[frame.role == "id"]
    assert ids["species"].tolist() == [names[label] for label in ids["label"]]
    info = json.loads((tmp_path / "splits" / "c-america" / "manifest_info.json").read_text())
    assert info["source"]["category_map"] == str(tmp_path / "repo" / "data" / "c-america_category_map.json")
    assert run([str(tmp_path / "repo"), "--region", "w-europe", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "neither download.py's metadata/w-europe/ nor a table of the w-europe splits" in err


def test_species_of_the_hub_tables_give_every_row_its_species_and_the_aux_rows_their_class(tmp_path, capsys):
    """The hub tables' speciesKey: each row's species (ID: the category map's, checked against it), the auxiliary
    rows' `aux_label` = their species' rank among the auxiliary species (train_aux and val_ood share the index)."""
    released = hub_files(tmp_path / "repo", "http://127.0.0.1:9")
    mapping = write_json(tmp_path / "map.json", category_map(6))
    cfg = OpenInsectImport.from_dict({"source": str(tmp_path / "repo"), "out": str(tmp_path / "o"),
                                      "region": "c-america", "category_map": str(mapping)})
    release = read_release(cfg.source, "c-america")
    from pipelines.curation.open_insect import manifest_rows
    from pipelines.curation.open_insect_import import aux_labels

    rows = {n: manifest_rows(p, "", read_category_map(mapping), "non_target") for n, p in release.splits.items()}
    aux_labels(rows)
    for name, frame in released.items():
        assert [r["species"] for r in rows[name]] == [str(k) for k in frame["speciesKey"]]
    aux = [r for n in ("train_aux", "val_ood") for r in rows[n]]
    vocab = sorted({int(r["species"]) for r in aux})
    assert [r["aux_label"] for r in aux] == [vocab.index(int(r["species"])) for r in aux]
    assert all("aux_label" not in r for n in ("train_id", "test_ood_local") for r in rows[n])

    table = tmp_path / "repo" / "c-america" / "val_id.csv"
    frame = pd.read_csv(table, dtype=str)
    frame.loc[3, "speciesKey"] = "42"
    frame.to_csv(table, index=False)
    assert run([str(tmp_path / "repo"), "--region", "c-america", "--out", str(tmp_path / "o"), "--category-map",
                str(mapping), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"val_id.csv:5: speciesKey 42 of {frame.image_path[3]!r} is not label {frame.label[3]}'s" in err


def test_config_file_overrides_and_flags_reach_the_typed_config(tmp_path, capsys):
    """`--config` + `key=value` + flags, the flag winning; `non_target_name` renames the non-moth set; a released
    split the source lacks is a warning, the rest imported."""
    from oodforge.args import parse

    released = download_folder(tmp_path / "src", bci=0)
    (tmp_path / "src" / "metadata" / "c-america" / "val_ood.txt").unlink()
    config = tmp_path / "import.yaml"
    config.write_text(f"source: {tmp_path / 'src'}\nout: {tmp_path / 'splits'}\nregion: w-europe\ntimeout: 5\n")
    args = parse(command.build_parser(), ["--config", str(config), "non_target_name=non_moth", "--region",
                                          "c-america"], intermixed=True)
    cfg = command.config_of(args)
    assert (cfg.region, cfg.timeout, cfg.non_target_name, cfg.retries) == ("c-america", 5.0, "non_moth", 3)
    assert run(["--config", str(config), "non_target_name=non_moth", "--region", "c-america"]) == 0
    assert "warning: the source holds no val_ood (not imported)" in capsys.readouterr().out
    rows = read_manifest(tmp_path / "splits" / "c-america").rows
    assert Counter(r["ood_set"] for r in rows if r["release_split"] == "test_ood_non-moth") == {
        "non_moth": len(released["test_ood_non-moth"])}
    assert not any(r["release_split"] == "val_ood" for r in rows)
    assert run(["--config", str(config), "region=mars"]) == 2
    assert "override region=mars: region: one of ne-america, w-europe, c-america, got 'mars'" in capsys.readouterr().err
