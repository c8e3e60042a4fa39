"""The generation job with the real ZeST pipeline on tiny random-weight models: crash + resume, two processes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gen.job import GenerationConfig, run_generation
from pipelines.data import read_manifest

REPO = Path(__file__).resolve().parents[2]


class CrashAfter:
    """Wraps a pipeline and raises once `calls` batches went through (an injected crash mid-job)."""

    def __init__(self, pipe, calls: int):
        self.pipe, self.calls, self.model_ids = pipe, calls, pipe.model_ids

    def __call__(self, *args, **kwargs):
        if self.calls == 0:
            raise RuntimeError("injected crash")
        self.calls -= 1
        return self.pipe(*args, **kwargs)


@pytest.mark.slow
def test_resumed_and_two_process_runs_write_identical_files(tmp_path, bronzes, containers, tiny_zest_models,
                                                            single_thread):
    from gen.zest import ZeSTConfig, ZeSTPipeline

    values = {"task": "transferred_container", "targets": str(containers), "materials": str(bronzes),
              "models": tiny_zest_models, "resolution": 32, "num_inference_steps": 2, "batch_size": 2, "limit": 4,
              "seed": 3, "precision": "fp32"}
    one = GenerationConfig.from_dict({**values, "out": str(tmp_path / "one")})
    pipe = ZeSTPipeline.from_config(ZeSTConfig.from_dict(tiny_zest_models), device="cpu", dtype="fp32")
    with pytest.raises(RuntimeError, match="injected crash"):
        run_generation(one, pipeline=CrashAfter(pipe, calls=1))
    summary = run_generation(one, pipeline=pipe)
    assert (summary["skipped"], summary["generated_here"], summary["done"]) == (2, 2, 4)

    manifest = read_manifest(one.out, check_files=True)
    assert len(manifest) == 4
    for row in manifest:
        assert row["provenance"]["model_ids"]["base"] == tiny_zest_models["base"]
        assert "era" in row and row["role"] == "ood"
    assert not [p for p in Path(one.out).rglob("*") if ".tmp" in p.name]

    config_file = tmp_path / "two.yaml"
    config_file.write_text(yaml.safe_dump({**values, "out": str(tmp_path / "two")}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(REPO / "scripts" / "generate.py"), "--config", str(config_file)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"processes": 2' in result.stdout
    # the console: no diffusers chatter (a warning per model move, the loading bar) and no carriage returns in logs
    assert "should be kept in float32" not in result.stderr and "Loading pipeline components" not in result.stderr
    assert "\r" not in result.stderr
    assert "generate: 4 done, 0 failed, 0 skipped (finished before); 4 of 4 planned in the manifest" in result.stderr
    two = read_manifest(tmp_path / "two", check_files=True)
    assert [r["file_name"] for r in two] == [r["file_name"] for r in manifest]
    for row in manifest:
        assert (tmp_path / "two" / row["file_name"]).read_bytes() == (tmp_path / "one" / row["file_name"]).read_bytes()
