"""The append-only ledger: merge across process files, done beats failed, torn lines ignored."""
from __future__ import annotations

import json

import pytest

from gen.ledger import MERGED, Ledger


def test_records_merge_processes_prefer_done_and_skip_torn_lines(tmp_path):
    first, second = Ledger(tmp_path, rank=0), Ledger(tmp_path, rank=1)
    first.append({"index": 0, "status": "done", "output": "a.png"}, {"index": 1, "status": "failed", "reason": "x"})
    second.append({"index": 1, "status": "done", "output": "b.png"}, {"index": 2, "status": "failed", "reason": "y"})
    first.append({"index": 0, "status": "failed", "reason": "late failure does not undo a done item"})
    with open(second.path, "a") as fh:
        fh.write('{"index": 3, "status": "do')  # a line cut short by a kill

    records = first.records()
    assert {i: r["status"] for i, r in records.items()} == {0: "done", 1: "done", 2: "failed"}

    merged = first.merge()
    assert merged == records
    assert [p.name for p in first.files()] == [MERGED]
    lines = [json.loads(line) for line in (tmp_path / MERGED).read_text().splitlines()]
    assert [r["index"] for r in lines] == [0, 1, 2]
    assert Ledger(tmp_path, rank=5).records() == records


def test_append_rejects_malformed_records(tmp_path):
    with pytest.raises(ValueError, match="int 'index' and status"):
        Ledger(tmp_path).append({"index": "0", "status": "done"})
    with pytest.raises(ValueError, match="int 'index' and status"):
        Ledger(tmp_path).append({"index": 0, "status": "maybe"})
