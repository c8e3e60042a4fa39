"""The fast manifest writer produces the plain writer's bytes (json.dumps(row, default=str) per line) on varied rows,
and its column-wise schema check never vouches for a row that validate_row rejects."""
import json
import math

import numpy as np
import pytest

from pipelines.data import ManifestError, make_row, validate_row, write_manifest
from pipelines.jsonl import encode_lines
from pipelines.schema import rows_certainly_valid


def previous_writer(rows):
    return "".join(json.dumps(r, default=str) + "\n" for r in rows)


class Label(str):
    pass


def varied_rows():
    rng = np.random.default_rng(0)
    floats = [0.1, -0.0, 1e-05, 1e16, 123456789.125, float("nan"), float("inf"), -float("inf"), 5e-324,
              1.7976931348623157e308]
    rows = []
    for i in range(300):
        row = make_row(f"images/{i}/é漢字 \"q\"\\%s\n\t\u2028.jpg", split=("train", "val", "test")[i % 3],
                       role="ood" if i % 4 == 0 else "id", label=i % 7, ood_set="local" if i % 4 == 0 else None,
                       group=(None, "near", "far")[i % 3],
                       species=("Ärgerlich moth", None, "\U0001f98b", "")[i % 4], lat=floats[i % len(floats)],
                       lon=float(rng.normal()) if i % 5 else None, hop=int(rng.integers(0, 4)), big=10 ** 30 + i,
                       flag=bool(i % 2))
        if i % 11 == 0:
            row["provenance"] = {"seed": i, "params": [1.5, None, "x"], "model_ids": {"a": "b"}}
        if i % 13 == 0:
            row["aux_label"] = -1
        if i % 17 == 0:
            row = dict(reversed(list(row.items())))  # another key order
        if i % 19 == 0:
            row["label_name"] = Label("subclass")  # str subclass
            row["count"] = np.int64(3)  # default=str path
            row["score"] = np.float64(0.25)  # float subclass
            row[1] = "non-string key"
            row["100%"] = "percent in key"
        rows.append(row)
    return rows


def test_encode_lines_is_byte_identical_to_json_dumps():
    rows = varied_rows()
    assert encode_lines(rows) == previous_writer(rows)
    assert encode_lines([]) == previous_writer([]) == ""
    assert encode_lines([{}, {"a": 1}, {}]) == previous_writer([{}, {"a": 1}, {}])
    uniform = [{"file_name": f"{i}.png", "lat": x} for i, x in enumerate([0.5, math.nan, 2.0, -math.inf])]
    assert encode_lines(uniform) == previous_writer(uniform)


def test_write_manifest_bytes_and_errors(tmp_path):
    rows = [r for r in varied_rows() if isinstance(r.get("lat"), float) and math.isfinite(r["lat"]) and 1 not in r]
    manifest = write_manifest(tmp_path / "m", rows)
    assert (tmp_path / "m" / "metadata.jsonl").read_bytes() == previous_writer(rows).encode()
    assert manifest.rows == rows
    dup = rows[:3] + [dict(rows[1])]
    with pytest.raises(ManifestError, match="line 4.*file_name.*duplicate"):
        write_manifest(tmp_path / "d", dup)
    bad = [dict(r) for r in rows[:5]]
    bad[2]["split"] = "training"
    with pytest.raises(ManifestError, match="line 3.*'split'"):
        write_manifest(tmp_path / "b", bad)


def test_fast_check_never_vouches_for_an_invalid_row():
    base = make_row("a/b.png", split="train", label=2, lat=1.0, lon=2.0)
    variants = [
        {}, {"file_name": "/abs.png"}, {"file_name": "../up.png"}, {"file_name": "a/../b.png"}, {"file_name": ""},
        {"file_name": 3}, {"split": "dev"}, {"role": "both"}, {"label": True}, {"label": 1.0}, {"label": -1},
        {"role": "ood"}, {"role": "ood", "label": -1}, {"role": "ood", "label": -1, "ood_set": ""},
        {"role": "ood", "label": 0, "ood_set": "x"}, {"ood_set": "x"}, {"group": "medium"}, {"group": ["hard"]},
        {"lat": float("nan")}, {"lon": "north"}, {"lat": float("inf")}, {"provenance": "text"},
        {"file_name": "a\\b.png"},
        {"role": "ood", "label": -1, "ood_set": "x", "group": "far"}, {"label": np.int64(2)}, {"lat": None},
    ]
    for change in variants:
        row = {**base, **change}
        try:
            validate_row(row)
            valid = True
        except ManifestError:
            valid = False
        if rows_certainly_valid([row, make_row("other.png")]):
            assert valid, change
    missing = dict(base)
    del missing["group"]
    assert not rows_certainly_valid([missing])
    assert not rows_certainly_valid([base, dict(base)])  # duplicate file_name
    assert not rows_certainly_valid([base, "not a dict"])
    assert rows_certainly_valid([base, make_row("c.png", role="ood", ood_set="far_set", group="far")])
