"""The manifest rules live once (pipelines.schema): the column-wise checks never vouch for rows the row check rejects,
and do vouch for plain valid rows."""
import math

import pandas as pd
import pytest

from pipelines.data import make_row
from pipelines.schema import ManifestError, rows_certainly_valid, table_certainly_valid, validate_row


def valid_rows():
    return [make_row(f"img/{i}.png", split=("train", "val", "test")[i % 3], role="ood" if i % 3 == 0 else "id",
                     label=i % 4, ood_set="far_set" if i % 3 == 0 else None, group=(None, "near", "far")[i % 3],
                     lat=float(i), lon=None if i % 2 else -1.5) for i in range(12)]


FAULTS = {  # field -> a value the row check rejects, on row 1 (an ID row)
    "file_name": "../outside.png", "split": "holdout", "role": "both", "group": "middle", "label": -1,
    "ood_set": "oops", "lat": math.inf,
}


def test_valid_rows_pass_all_three_checks():
    rows = valid_rows()
    assert all(validate_row(r) is r for r in rows)
    assert rows_certainly_valid(rows)
    assert table_certainly_valid(pd.DataFrame(rows))


@pytest.mark.parametrize("field", sorted(FAULTS))
def test_column_checks_never_vouch_for_a_rejected_row(field):
    rows = valid_rows()
    rows[1] = {**rows[1], field: FAULTS[field]}
    with pytest.raises(ManifestError) as err:
        validate_row(rows[1], "m/metadata.jsonl", 2)
    assert f"m/metadata.jsonl, line 2, field '{field}'" in str(err.value)
    assert not rows_certainly_valid(rows)
    assert not table_certainly_valid(pd.DataFrame(rows))


def test_repeated_file_name_is_not_vouched_for():
    rows = valid_rows()
    rows[2] = {**rows[2], "file_name": rows[0]["file_name"]}
    assert not rows_certainly_valid(rows)
    assert not table_certainly_valid(pd.DataFrame(rows))


def test_ood_row_with_class_label_and_float_labels():
    rows = valid_rows()
    rows[0] = {**rows[0], "label": 2}  # an OOD row must have label -1
    with pytest.raises(ManifestError, match="label"):
        validate_row(rows[0])
    assert not rows_certainly_valid(rows) and not table_certainly_valid(pd.DataFrame(rows))
    floats = pd.DataFrame(valid_rows()).astype({"label": float})  # would be written as 3.0: not an integer label
    assert not table_certainly_valid(floats)
