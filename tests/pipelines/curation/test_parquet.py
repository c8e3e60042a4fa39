"""Parquet columns a CSV cannot hold: a list `url` and a struct `species` (in fetch-images --dry-run, where pandas
would raise `TypeError: unhashable type: 'dict'`), a binary `lat` with non-UTF-8 bytes (in make-splits, a
`UnicodeDecodeError`). Each is one line naming the file and the column (and the row), exit 2;
nested columns nobody reads are kept as JSON text, UTF-8 bytes as text."""
from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oodforge.commands import fetch_images, import_folder, make_splits
from pipelines.cli import run_main
from pipelines.curation.delimited import TableError
from pipelines.curation.gbif import read_table
from pipelines.curation.parquet import plain_table


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_nested_columns_that_are_read_are_refused_naming_the_column(tmp_path, capsys):
    table = pa.table({"url": pa.array([["http://a/1.jpg"], ["http://a/2.jpg"]]),
                      "species": pa.array([{"name": "a b"}, {"name": "c d"}])})
    pq.write_table(table, tmp_path / "occ.parquet")
    out = tmp_path / "out"
    assert run_main(fetch_images.main, ["--occurrences", str(tmp_path / "occ.parquet"), "--out", str(out),
                                        "--dry-run"]) == 2
    line = error_line(capsys)
    assert f"{tmp_path / 'occ.parquet'}: column 'url' holds list<element: string> values" in line, line
    assert "must hold text or numbers" in line and not out.exists()
    with pytest.raises(TableError, match="column 'species' holds struct<name: string> values"):
        plain_table(table.select(["species"]), "t", used={"species"})


def test_non_utf8_bytes_are_refused_naming_the_column_and_row_utf8_bytes_are_text(tmp_path, capsys):
    frame = {"species": ["a b", "a b", "c d"], "genus": ["a", "a", "c"], "family": ["f", "f", "f"],
             "lon": ["1", "2", "3"], "file_name": ["x.jpg", "y.jpg", "z.jpg"]}
    pq.write_table(pa.table({**frame, "lat": pa.array([b"50", b"51\xff\xfe", b"52"], pa.binary())}),
                   tmp_path / "occ.parquet")
    (tmp_path / "ids.csv").write_text("region,species\nne-america,a b\n")
    argv = ["--occurrences", str(tmp_path / "occ.parquet"), "--id-species", str(tmp_path / "ids.csv"),
            "--image-root", str(tmp_path), "--out", str(tmp_path / "out")]
    assert run_main(make_splits.main, argv) == 2
    line = error_line(capsys)
    assert "occ.parquet: row 2: column 'lat' holds bytes that are not UTF-8 text (b'51\\xff\\xfe')" in line, line
    assert not (tmp_path / "out").exists()
    pq.write_table(pa.table({**frame, "lat": pa.array([b"50", b"51.5", None], pa.binary()),
                             "tags": pa.array([["x", "y"], [], None]), "raw": pa.array([b"ok", b"\xc3\xa9", b""])}),
                   tmp_path / "fine.parquet")
    read = read_table(tmp_path / "fine.parquet")
    assert read["lat"].tolist()[:2] == ["50", "51.5"] and pd.isna(read["lat"].iloc[2])
    assert read["raw"].tolist() == ["ok", "é", ""]
    assert [json.loads(v) if isinstance(v, str) else v for v in read["tags"]][:2] == [["x", "y"], []]
    assert pd.isna(read["tags"].iloc[2])


def test_import_folder_table_refuses_a_nested_label_column_in_one_line(tmp_path, capsys):
    pq.write_table(pa.table({"file_name": ["a.jpg"], "label": pa.array([{"x": 1}])}), tmp_path / "list.parquet")
    out = tmp_path / "out"
    assert run_main(import_folder.main, [str(tmp_path), "--table", str(tmp_path / "list.parquet"), "--out",
                                         str(out)]) == 2
    line = error_line(capsys)
    assert "list.parquet: column 'label' holds struct<x: int64> values" in line, line
