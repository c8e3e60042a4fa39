"""The runner's three parts on their own: `prepare(plan)` -> `PreparedRun`, `run_unit(unit, prepared, context)` a
function of its arguments (no module state), result rows built from `RESULT_COLUMNS` only."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from detectors.harness.results import RESULT_COLUMNS, result_row
from tests.detectors.harness.runner_helpers import eval_config


def test_result_row_takes_the_columns_in_their_order_and_refuses_a_missing_one():
    values = {c: i for i, c in enumerate(reversed(RESULT_COLUMNS))} | {"not_a_column": 1}
    row = result_row(**values)
    assert list(row) == list(RESULT_COLUMNS)  # the oracle: the one column list, in its order
    assert all(row[c] == values[c] for c in RESULT_COLUMNS)
    with pytest.raises(KeyError, match="seconds"):
        result_row(**{c: 0 for c in RESULT_COLUMNS if c != "seconds"})


def test_run_unit_gives_what_the_runner_wrote_and_keeps_no_state(digits, tmp_path):
    """Each unit run again from the prepared data, twice, in another process context, gives the rows and scores the
    runner wrote (its `seconds` aside); no run-time setting is left behind."""
    from detectors.harness.evaluate import run_config
    from detectors.harness.execute import UnitContext, run_unit
    from detectors.harness.outputs import results_table
    from detectors.harness.plan import make_plan
    from detectors.harness.prepare import prepare
    from detectors.harness.units import UnitStore
    from detectors.posthoc import streaming

    _, ood_dir, _ = digits
    config = eval_config(digits, tmp_path / "run", detectors=["msp", "knn", "mds"],
                         ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9", "texture"]}])
    run_config(config)
    plan = make_plan(config)
    store = UnitStore(plan.out)
    prepared = prepare(plan)
    before = streaming.current()
    for unit in plan.units:
        written = store.finished(unit.method, unit.key)
        for ctx in (UnitContext(store), UnitContext(UnitStore(tmp_path / "elsewhere"), writes=False)):
            result = run_unit(unit, prepared, ctx)
            assert result.trained is None  # no rule re-scores these
            # as the tables hold them (text columns read back empty); float sums within tolerance: BLAS may thread
            pd.testing.assert_frame_equal(results_table([result]).drop(columns="seconds"),
                                          results_table([written]).drop(columns="seconds"), check_dtype=False)
            pd.testing.assert_frame_equal(result.scores, written.scores, check_dtype=False, rtol=1e-6)
    assert streaming.current() == before
    assert not (tmp_path / "elsewhere").exists()


def test_a_stream_context_holds_inside_using_only():
    from detectors.posthoc import streaming

    outside = streaming.current()
    with streaming.using(streaming.StreamContext(rows=5)):
        assert list(streaming.row_slices(12)) == [slice(0, 5), slice(5, 10), slice(10, 12)]
        with streaming.across_processes():
            assert streaming.current() == streaming.StreamContext(rows=5, distributed=True)
        assert not streaming.current().distributed
    assert streaming.current() == outside
    assert list(streaming.row_slices(3, rows=2)) == [slice(0, 2), slice(2, 3)]
    with pytest.raises(ValueError, match="chunk rows must be >= 1"):
        streaming.chunk_rows(0)
    assert math.ceil(40 / outside.rows) == len(list(streaming.row_slices(40)))
