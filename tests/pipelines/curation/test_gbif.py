"""GBIF Darwin Core Archives as a GBIF download lays them out (meta.xml + occurrence.txt + multimedia.txt, tab
separated, unquoted, GBIF column names), read into one row per image, filtered and cleaned, then taken to splits by
the README's command with no Python."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers.gbif import OCC_TERMS, build_archive

from pipelines.curation.gbif import (
    TableError,
    TaxonFilter,
    clean,
    image_file_name,
    is_archive,
    read_occurrences,
    read_table,
)
from pipelines.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture()
def archive(tmp_path):
    return build_archive(tmp_path / "gbif")


def test_archive_reads_one_row_per_image_with_gbif_names_mapped(archive, tmp_path):
    path, _ = archive
    assert is_archive(path)
    frame = read_occurrences(path)
    n_occ = 3 * 12 + 6 + 8 + 4 * 25 + 7 + 6 + 6 + 5 + 2
    assert len(frame) == n_occ + 2  # one more row for the duplicate URL and one for the second image; the video not
    assert {"lat", "lon", "url", "file_name", "gbifID", "speciesKey", "genusKey", "familyKey", "order",
            "taxonomicStatus", "taxonRank", "basisOfRecord"} <= set(frame.columns)
    assert "decimalLatitude" not in frame.columns and not frame["url"].str.endswith(".mp4").any()
    two = frame[frame["gbifID"] == "1002"]
    assert sorted(two["url"]) == ["https://images.example.org/1002/original.jpg",
                                  "https://images.example.org/1002/second.png"]
    assert two["file_name"].tolist() == [image_file_name(u) for u in two["url"]]
    assert image_file_name(two["url"].iloc[1]).endswith(".png") and frame["gbifID"].map(type).eq(str).all()
    unpacked = read_occurrences(build_archive(tmp_path / "plain", zipped=False)[0])  # the unpacked folder reads alike
    pd.testing.assert_frame_equal(unpacked.reset_index(drop=True), frame.reset_index(drop=True))


def test_plain_tables_have_their_delimiter_detected(archive, tmp_path):
    path, _ = archive
    with zipfile.ZipFile(path) as zf:
        (tmp_path / "occurrence.txt").write_bytes(zf.read("occurrence.txt"))
    tab = read_table(tmp_path / "occurrence.txt")  # tab separated, a stray '"' inside a field
    assert len(tab.columns) == len(OCC_TERMS) and tab["locality"].iloc[0] == 'a "quoted" field with no escape'
    tab.to_csv(tmp_path / "occ.csv", index=False)
    tab.to_csv(tmp_path / "occ_semicolon.csv", index=False, sep=";")
    tab.to_parquet(tmp_path / "occ.parquet")
    for name in ("occ.csv", "occ_semicolon.csv", "occ.parquet"):
        pd.testing.assert_frame_equal(read_table(tmp_path / name), tab, check_dtype=False)
    with zipfile.ZipFile(tmp_path / "simple.zip", "w") as zf:  # GBIF's SIMPLE_CSV download: one TSV, no meta.xml
        zf.write(tmp_path / "occurrence.txt", "0012345-250101000000000.csv")
    pd.testing.assert_frame_equal(read_occurrences(tmp_path / "simple.zip"),
                                  read_occurrences(tmp_path / "occurrence.txt"))
    with zipfile.ZipFile(tmp_path / "two.zip", "w") as zf:
        zf.writestr("a.csv", "x\n1\n")
        zf.writestr("b.csv", "x\n2\n")
    with pytest.raises(TableError, match="two.zip: no meta.xml .* and 2 files, not one table"):
        read_occurrences(tmp_path / "two.zip")
    mapped = read_occurrences(tmp_path / "occurrence.txt")
    assert {"lat", "lon"} <= set(mapped.columns) and "file_name" not in mapped.columns  # no URL in the core alone
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(TableError, match="empty.csv: not a readable table"):
        read_table(tmp_path / "empty.csv")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(TableError, match="bad.parquet: not a readable table"):
        read_table(tmp_path / "bad.parquet")


def test_moth_rule_include_exclude_and_drop_reasons(archive, tmp_path):
    path, _ = archive
    frame = read_occurrences(path)
    kept, dropped = clean(frame, TaxonFilter(preset="moths"))
    assert set(kept["order"]) == {"Lepidoptera"} and "Nymphalidae" not in set(kept["family"])
    assert set(kept["taxonomicStatus"]) == {"ACCEPTED"} and set(kept["taxonRank"]) == {"SPECIES"}
    # butterflies 7, synonym 6, genus rank 6, beetles 5, the blank species (order-level, Noctuidae moth rule passes)
    assert dropped == {"taxon filter": 7 + 6 + 6 + 5, "no coordinates": 1, "duplicate URL": 1}
    assert kept["lat"].dtype == np.float64 and not kept["url"].duplicated().any()
    noctuids = TaxonFilter.from_dict({"preset": "moths", "exclude": ["family=noctuidae"]})
    assert "Noctuidae" not in set(clean(frame, noctuids)[0]["family"])
    only = TaxonFilter.from_dict({"include": ["family=Geometridae,Erebidae", "order=Lepidoptera"]})
    assert set(clean(frame, only)[0]["family"]) == {"Geometridae", "Erebidae"}
    (tmp_path / "img").mkdir()
    some = frame.loc[frame["species"] == "Auxmoth sp1", "file_name"].iloc[:3]
    for name in some:
        (tmp_path / "img" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "img" / name).write_bytes(b"x")
    present, dropped = clean(frame, image_root=tmp_path / "img")
    assert sorted(present["file_name"]) == sorted(some) and dropped["missing file"] == len(frame) - 3 - 2
    with pytest.raises(TableError, match=r"needs column\(s\) \['tribe'\]"):
        clean(frame, TaxonFilter.from_dict({"exclude": ["tribe=Noctuini"]}))
    with pytest.raises(ConfigError, match=r"taxa.include: a rule is RANK=VALUE"):
        TaxonFilter.from_dict({"include": ["Noctuidae"]}, "taxa")
    with pytest.raises(ConfigError, match="taxa.preset: must be one of 'moths'"):
        TaxonFilter.from_dict({"preset": "butterflies"}, "taxa")


def test_a_coordinate_that_is_not_a_number_is_refused_naming_the_row(tmp_path):
    table = pd.DataFrame({"species": ["a b", "a b"], "genus": "a", "family": "f", "lat": ["50.5", "abc"],
                          "lon": ["1", "2"], "file_name": ["x.jpg", "y.jpg"]})
    with pytest.raises(TableError, match=r"row file_name=y.jpg: lat 'abc' is not a latitude"):
        clean(table)
    table["lat"] = ["50.5", "95"]
    with pytest.raises(TableError, match=r"lat '95' is not a latitude"):
        clean(table)
    table.drop(columns="file_name").to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(TableError, match=r"line 3: lat '95'"):
        clean(read_table(tmp_path / "t.csv"))


@pytest.mark.slow
def test_readme_command_takes_a_gbif_zip_to_splits(archive, tmp_path):
    """The README's command, run as written (no Python): archive + ID species -> splits with counted drops,
    shortfalls, GBIF ids on every row and summary.json."""
    path, ids = archive
    ids.to_csv(tmp_path / "ids.csv", index=False)
    images = tmp_path / "images_root"
    frame = read_occurrences(path)
    never = set(frame.loc[frame["species"] == "Auxmoth sp3", "file_name"].iloc[:3])  # three images never downloaded
    for name in set(frame["file_name"]) - never:
        (images / name).parent.mkdir(parents=True, exist_ok=True)
        (images / name).write_bytes(b"jpeg")
    out = tmp_path / "splits"
    cmd = [sys.executable, "scripts/make_splits.py", "--occurrences", str(path), "--taxon-filter", "moths",
           "--id-species", str(tmp_path / "ids.csv"), "--image-root", str(images), "--out", str(out),
           "--aux-species", "8000", "--aux-per-species", "20"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "warning: ne-america: 8000 auxiliary species with >= 20 images requested, 4 found" in run.stdout
    record = json.loads((out / "summary.json").read_text())
    assert record["shortfalls"] == [{"region": "ne-america", "what": "auxiliary species with >= 20 images",
                                     "requested": 8000, "found": 4}]
    assert record["dropped"] == {"taxon filter": 24, "blank species": 1, "no coordinates": 1, "duplicate URL": 1,
                                 "missing file": 3}
    sets = {(s["name"], s["split"]): s for s in record["sets"] if s["region"] == "ne-america"}
    assert sets[("id", "train")]["species"] == 3 and sets[("local", "test")]["species"] == 1
    assert sets[("non_local", "test")]["images"] == 8 and sets[("auxiliary", "train")]["images"] == 4 * 20
    assert sets[("local", "test")]["hops"] == [{"hop": 1, "species": 1, "images": 6}]
    assert sum(s["images"] for s in record["sets"]) == sum(1 for _ in open(out / "ne-america" / "metadata.jsonl"))
    rows = [json.loads(line) for line in open(out / "ne-america" / "metadata.jsonl")]
    assert all(r["gbifID"] and r["speciesKey"] and r["url"].startswith("https://") for r in rows)
    assert all((images / r["file_name"]).is_file() for r in rows)
    md = (out / "summary.md").read_text()
    assert "| taxon filter | 24 |" in md and "| ne-america | auxiliary species with >= 20 images | 8000 | 4 |" in md
