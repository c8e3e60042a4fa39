"""Two generation jobs on one `out`: while another process holds the folder, the job is refused in
one line and writes nothing (no plan, no ledger); the dry run takes no lock; once the holder is gone the job runs."""
from __future__ import annotations

import pytest
from helpers.locks import held

from gen.job import JOB_FOLDER, GenerationConfig, run_generation
from pipelines.locks import LOCK_NAME, FolderBusy


def test_a_second_generation_on_the_same_out_is_refused(tmp_path, bronzes, containers, fake_zest):
    out = tmp_path / "out"
    config = GenerationConfig.from_dict({"task": "transferred_container", "targets": str(containers),
                                         "materials": str(bronzes), "out": str(out), "resolution": 16,
                                         "num_inference_steps": 2, "batch_size": 2, "mask_method": "opencv"})
    pipe = fake_zest()
    with held(out, "generate") as holder:
        with pytest.raises(FolderBusy) as err:
            run_generation(config, pipeline=pipe)
        assert f"in use by pid {holder.pid} on " in str(err.value) and "\n" not in str(err.value)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME] and pipe.calls == 0
        assert run_generation(config, dry_run=True)["dry_run"] is True
    summary = run_generation(config, pipeline=pipe)
    assert summary["done"] == 7 and (out / JOB_FOLDER / "job.json").is_file() and not (out / LOCK_NAME).exists()
