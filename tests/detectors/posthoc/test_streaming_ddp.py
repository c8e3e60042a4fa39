"""Two processes (torchrun, CPU) fitting from their own halves of a memory-mapped cache inside
`streaming.across_processes()` reach the detector state of one process fitting on all rows."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import detectors
from pipelines.features import FeatureCache

NAMES = ["mds", "rmds", "vim", "neco", "nci", "react", "dice", "she"]

DDP_SCRIPT = """
import os, sys
import numpy as np
import torch.distributed
from accelerate import PartialState
import detectors
from detectors import FeatureSet
from detectors.posthoc import streaming
from pipelines.features import FeatureCache

state = PartialState(cpu=True)
train, val = (FeatureCache.load(p, mmap=True) for p in sys.argv[1:3])
shard = lambda cache: FeatureSet(*(a[streaming.process_rows(len(cache))]
                                   for a in (cache.features, cache.logits, cache.labels)))
with streaming.chunk_rows(23), streaming.across_processes():
    for name in sys.argv[4].split(","):
        det = detectors.build(name, **({"dim": 5} if name in ("vim", "neco") else {}))
        det.fit(shard(train), head=train.head(), id_val=shard(val))
        np.savez(os.path.join(sys.argv[3], f"{name}-rank{state.process_index}.npz"), **det.state(),
                 rows=np.array([len(shard(train))]))
    one_row = np.load(os.path.join(sys.argv[3], "one_row.npy"))  # fewer rows than processes: rank 1's share is empty
    mine = one_row[streaming.process_rows(len(one_row))]
    stats = streaming.moments(mine, np.zeros(len(mine), np.int64))
    np.savez(os.path.join(sys.argv[3], f"one_row-rank{state.process_index}.npz"), rows=np.array([len(mine)]),
             mean=stats.mean(), scatter=stats.scatter, column_mean=streaming.column_mean(mine),
             percentile=np.array([streaming.percentile(mine, 90)]))
state.wait_for_everyone()
torch.distributed.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("val_rows", [61, 1])
def test_two_processes_give_the_one_process_detector_state(tmp_path, val_rows):
    """With one ID val row, rank 1's val share is empty (fewer rows than processes), as is its share of a one-row
    array: an empty share adds nothing to the sums and the percentile's candidates, and the results are one
    process's."""
    val_stop = 240 + val_rows
    rng = np.random.default_rng(0)
    n, d, c = 301, 10, 4
    labels = rng.integers(0, c, n)
    centres = rng.normal(0, 3, (c, d))
    x = np.maximum(rng.normal(size=(n, d)) + centres[labels] + 5, 0).astype(np.float16)
    weight = (centres - centres.mean(axis=1, keepdims=True) + rng.normal(size=(c, d))).astype(np.float32)
    bias = rng.normal(size=c).astype(np.float32)
    paths = []
    for name, rows in (("train", slice(0, 240)), ("val", slice(240, val_stop))):
        logits = x[rows].astype(np.float32) @ weight.T + bias
        paths.append(FeatureCache(x[rows], logits, labels[rows], np.arange(len(labels[rows])), weight, bias)
                     .save(tmp_path / f"{name}.safetensors"))
    one_row = rng.normal(size=(1, d)).astype(np.float32)
    np.save(tmp_path / "one_row.npy", one_row)
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), *map(str, paths),
                           str(tmp_path), ",".join(NAMES)],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-3000:]
    train, val = (FeatureCache.load(p) for p in paths)
    for name in NAMES:
        one = detectors.build(name, **({"dim": 5} if name in ("vim", "neco") else {}))
        one.fit(train.to_featureset(), head=train.head(), id_val=val.to_featureset())
        ranks = [dict(np.load(tmp_path / f"{name}-rank{r}.npz")) for r in (0, 1)]
        assert [int(r.pop("rows")[0]) for r in ranks] == [120, 120]  # each process saw half the rows
        for key, value in one.state().items():
            np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=f"{name}.{key}: ranks disagree")
            rtol, atol = (1e-4, 1e-5) if name == "vim" else (1e-9, 1e-10)  # ViM: float32 covariance products
            np.testing.assert_allclose(ranks[0][key], value, rtol=rtol, atol=atol, err_msg=f"{name}.{key}")
    # the one-row statistics: the float64 formulas by hand
    ranks = [dict(np.load(tmp_path / f"one_row-rank{r}.npz")) for r in (0, 1)]
    assert [int(r["rows"][0]) for r in ranks] == [1, 0]
    for got in ranks:
        np.testing.assert_array_equal(got["mean"], one_row[0].astype(np.float64))
        np.testing.assert_array_equal(got["scatter"], np.zeros((d, d)))
        np.testing.assert_array_equal(got["column_mean"], one_row[0].astype(np.float64))
        # float32 data interpolated as numpy >= 2.4.1 does (in float32); the float64 percentile to float32 rounding
        assert got["percentile"][0] == pytest.approx(np.percentile(one_row.astype(np.float64), 90), rel=1e-6)
