"""write_splits writes the bytes of a plain per-row writer (a dict per row, then aux_label deleted from the
non-auxiliary rows), one json.dumps(row, default=str) per line."""
import json

import numpy as np
import pandas as pd

from gen.insects import SplitConfig, build_splits, manifest_table, read_id_species, synthetic_occurrences, write_splits


def previous_manifest_rows(frame: pd.DataFrame, non_target_name: str = "non_target") -> list[dict]:
    table = manifest_table(frame, non_target_name)  # the same table; only the row building differs
    rows = []
    for i in range(len(table)):
        row = {name: (None if pd.isna(table[name].iloc[i]) else table[name].iloc[i].item()
                      if hasattr(table[name].iloc[i], "item") else table[name].iloc[i]) for name in table.columns}
        if "aux_label" in frame.columns and row["ood_set"] == "auxiliary":
            value = frame["aux_label"].iloc[i]
            row["aux_label"] = -1 if pd.isna(value) else int(value)
        rows.append(row)
    return rows


def test_write_splits_bytes_equal_the_previous_writer(tmp_path):
    occurrences, id_table = synthetic_occurrences(2500, seed=3)
    occurrences.loc[occurrences.index[::7], "lat"] = np.nan  # missing coordinates become null
    splits = build_splits(occurrences, read_id_species(id_table), SplitConfig(target_taxon="moth", seed=3))
    written = write_splits(splits, tmp_path / "splits", image_root=tmp_path)
    assert written
    for region, folder in written.items():
        expected = "".join(json.dumps(r, default=str) + "\n" for r in previous_manifest_rows(splits.regions[region]))
        assert (folder / "metadata.jsonl").read_text(encoding="utf-8") == expected, region


def test_a_row_the_schema_refuses_takes_the_row_by_row_writer_which_names_its_line(tmp_path, monkeypatch):
    import pytest

    import gen.insects.manifests as manifests
    from pipelines.schema import ManifestError

    occurrences, id_table = synthetic_occurrences(2500, seed=3)
    splits = build_splits(occurrences, read_id_species(id_table), SplitConfig(target_taxon="moth", seed=3))
    region, frame = next(iter(splits.regions.items()))
    assert manifests._manifest_bytes(frame, "non_target") is not None  # the fast path vouches for good rows
    frame["file_name"] = frame["file_name"].astype(object)
    frame.loc[3, "file_name"] = "../outside.jpg"
    assert manifests._manifest_bytes(frame, "non_target") is None  # pipelines.schema.table_certainly_valid said no
    with pytest.raises(ManifestError, match=r"line 4, field 'file_name'"):
        write_splits(splits, tmp_path / "splits", image_root=tmp_path)
