"""The generation job on bad inputs, given masks, changed input folders and per-item model errors (fake pipeline)."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from badinputs import bad_images, bad_manifest, bad_masks, object_array, object_mask
from PIL import Image

from gen.job import JOB_FOLDER, GenerationConfig, build_pipeline, mark_finished, run_generation, wait_for_shards
from gen.jobplan import PlanChangedError
from gen.ledger import Ledger
from pipelines.data import read_manifest
from pipelines.runtime import item_seed


def config_for(tmp_path: Path, targets: Path, materials: Path, **extra) -> GenerationConfig:
    values = {"task": "transferred_container", "targets": str(targets), "materials": str(materials),
              "out": str(tmp_path / "out"), "resolution": 16, "num_inference_steps": 2, "batch_size": 2, "seed": 7}
    return GenerationConfig.from_dict({**values, **extra})


class Recorder:
    """Copies each target to the output size and keeps the masks it was given, by target size."""

    model_ids = {"base": "recorder"}

    def __init__(self):
        self.masks: list[Image.Image] = []
        self.items = 0

    def __call__(self, targets, materials, masks=None, seeds=None, resolution=16, **params):
        self.masks.extend(masks)
        self.items += len(targets)
        return [t.resize((resolution, resolution)) for t in targets]


def test_bad_input_matrix_gives_failed_records_and_the_job_completes(tmp_path, bronzes, fake_zest):
    targets = tmp_path / "targets"
    cases = bad_images(targets)
    manifest = bad_manifest(targets, cases, role="ood", ood_set="containers", group="hard", label=-1)
    config = config_for(tmp_path, targets, bronzes)
    summary = run_generation(config, pipeline=fake_zest())

    generating = {str(c.path) for c in cases.values() if c.generates}
    done = read_manifest(config.out, check_files=True)
    assert summary["done"] == len(done) == len(generating)
    assert {row["provenance"]["source_target"] for row in done} == generating
    failures = {f["file"]: f["reason"] for f in summary["failed"]}
    expected = {str(c.path): c.reason or "image too small" for c in cases.values() if not c.generates}
    assert set(failures) == set(expected)
    for file, fragment in expected.items():
        assert fragment in failures[file], (file, failures[file])
    assert "1x1 (each side needs >= 8 px)" in failures[str(cases["one_by_one"].path)]
    skipped = {(s["line"], s["field"]) for s in summary["skipped_inputs"]}
    assert skipped == set(manifest["bad_lines"].items())
    assert all(s["file"] == str(manifest["file"]) for s in summary["skipped_inputs"])

    again = fake_zest()  # a rerun retries the failures, keeps every finished image and completes again
    before = {row["file_name"]: (Path(config.out) / row["file_name"]).read_bytes() for row in done}
    rerun = run_generation(config, pipeline=again)
    assert again.items == 0 and rerun["done"] == len(generating) and len(rerun["failed"]) == len(expected)
    assert {name: (Path(config.out) / name).read_bytes() for name in before} == before


def test_given_masks_are_read_by_alpha_and_bad_ones_are_failed_records(tmp_path, bronzes):
    targets = tmp_path / "targets"
    sizes = {f"t{i}": (40 + 8 * i, 30 + 6 * i) for i in range(6)}  # same aspect ratio, different sizes
    for i, (stem, size) in enumerate(sizes.items()):
        targets.mkdir(exist_ok=True)
        Image.fromarray(object_array(size, seed=i)).save(targets / f"{stem}.png")
    cases = bad_masks(tmp_path / "masks", dict(list(sizes.items())[:5]))
    for suffix in ("png", "jpg"):  # two masks named like target t5: ambiguous
        Image.fromarray(np.where(object_mask(sizes["t5"]), 255, 0).astype(np.uint8)).save(
            tmp_path / "masks" / f"t5.{suffix}")
    recorder = Recorder()
    summary = run_generation(config_for(tmp_path, targets, bronzes, masks=str(tmp_path / "masks")), pipeline=recorder)

    assert summary["done"] == 2 and recorder.items == 2
    by_size = {mask.size: np.asarray(mask) > 0 for mask in recorder.masks}
    rgba_size = sizes["t0"]
    np.testing.assert_array_equal(by_size[rgba_size], object_mask(rgba_size))  # the object, not its background
    assert by_size[sizes["t3"]].shape == sizes["t3"][::-1]  # half-size mask resized to its target
    failures = {f["file"]: f["reason"] for f in summary["failed"]}
    assert "does not match the image size 48x36" in failures[str(cases["wrong_size"].path)]
    assert "empty foreground mask (given)" in failures[str(cases["empty"].path)]
    assert "no mask named t4.*" in failures[str(targets / "t4.png")]
    assert "2 masks (t5.jpg, t5.png) match t5.*" in failures[str(targets / "t5.png")]
    rows = read_manifest(tmp_path / "out").rows
    assert {row["provenance"]["params"]["mask"] for row in rows} == {"given"}


def test_changed_inputs_are_refused_with_the_changes_named_or_extended_without_reusing_indices(
        tmp_path, bronzes, image_writer, fake_zest):
    targets = tmp_path / "targets"
    image_writer(targets, [f"c{i}.png" for i in range(5)], seed=4)
    config = config_for(tmp_path, targets, bronzes)
    first = run_generation(config, pipeline=fake_zest())
    out = Path(config.out)
    before = {row["file_name"]: (out / row["file_name"]).read_bytes() for row in read_manifest(out)}

    image_writer(targets, ["c5.png", "c6.png"], seed=5)
    (targets / "c1.png").unlink()
    with pytest.raises(PlanChangedError,
                       match=r"targets added: c5.png, c6.png; targets removed: c1.png.*plan_change=extend"):
        run_generation(config, pipeline=fake_zest())
    with pytest.raises(PlanChangedError):
        run_generation(config, dry_run=True)

    extend = config_for(tmp_path, targets, bronzes, plan_change="extend")
    pipe = fake_zest()
    summary = run_generation(extend, pipeline=pipe)
    assert summary["extended"] == 2 and pipe.items == 2 and summary["plan_hash"] != first["plan_hash"]
    rows = read_manifest(out, check_files=True).rows
    assert [r["file_name"][7:14] for r in rows] == ["0000000", "0000001", "0000002", "0000003", "0000004",
                                                      "0000005", "0000006"]
    targets_used = [Path(r["provenance"]["source_target"]).name for r in rows]
    assert sorted(targets_used) == [f"c{i}.png" for i in range(7)]  # each target exactly once, c1 kept from before
    assert {name: (out / name).read_bytes() for name in before} == before
    assert [r["provenance"]["seed"] for r in rows] == [item_seed(7, i) for i in range(7)]
    # the extended plan is now the stored one: the default (refuse) resumes it with nothing to do
    again = fake_zest()
    assert run_generation(config, pipeline=again)["done"] == 7 and again.items == 0


class FailsOn:
    """A pipeline raising ValueError (as OpenCV or a shape check would) for one item's seed; RuntimeError otherwise."""

    model_ids = {"base": "fails-on"}

    def __init__(self, bad_seed: int):
        self.bad_seed, self.calls = bad_seed, []

    def __call__(self, targets, materials, masks=None, seeds=None, resolution=16, **params):
        self.calls.append(list(seeds))
        if self.bad_seed in seeds:
            raise ValueError("cannot process this item")
        return [t.resize((resolution, resolution)) for t in targets]


def test_a_model_error_on_one_item_is_its_failed_record_and_its_batch_partner_is_done(tmp_path, bronzes, containers):
    config = config_for(tmp_path, containers, bronzes)
    pipe = FailsOn(item_seed(7, 3))
    summary = run_generation(config, pipeline=pipe)
    assert summary["done"] == 6
    (failure,) = summary["failed"]
    assert failure["index"] == 3 and failure["stage"] == "generate" and "cannot process this item" in failure["reason"]
    assert [item_seed(7, 2)] in pipe.calls and [item_seed(7, 3)] in pipe.calls  # the batch was retried item by item
    rerun = FailsOn(item_seed(7, 3))
    assert run_generation(config, pipeline=rerun)["done"] == 6 and rerun.calls == [[item_seed(7, 3)]]


def test_image_bytes_are_fsynced_before_their_ledger_line(tmp_path, bronzes, containers, fake_zest, monkeypatch):
    events: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        events.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    real_append = Ledger.append

    def append(self, *records):
        events.append("ledger:" + ",".join(str(r["index"]) for r in records))
        real_append(self, *records)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Ledger, "append", append)
    run_generation(config_for(tmp_path, containers, bronzes), pipeline=fake_zest())
    ledger_lines = [i for i, e in enumerate(events) if e.startswith("ledger:")]
    assert len(ledger_lines) == 4
    previous = -1
    for position in ledger_lines:
        batch = events[previous + 1:position]
        images = [e for e in batch if ".png" in e and ".tmp" in e]  # the temp files, synced before their rename
        folders = [e for e in batch if e.endswith("/images")]
        assert len(images) == len(events[position].split(",")) and len(folders) == 1
        assert batch.index(folders[0]) > max(batch.index(e) for e in images)
        previous = position


def test_the_main_process_waits_for_shard_marks_without_a_collective(tmp_path):
    out = tmp_path / "out"
    mark_finished(out, 0, {"process": 0})
    late = threading.Timer(0.3, mark_finished, args=(out, 1, {"process": 1}))
    late.start()
    started = time.monotonic()
    marks = wait_for_shards(out, 2, poll_s=0.02)
    assert [m["process"] for m in marks] == [0, 1] and time.monotonic() - started >= 0.25
    with pytest.raises(TimeoutError, match="2 of 3 processes finished"):
        wait_for_shards(out, 3, poll_s=0.02, timeout_s=0.1)


class OneProcess:
    """A stand-in accelerate state that counts collective barriers."""

    is_main_process, process_index, num_processes, device = True, 0, 1, "cpu"

    def __init__(self):
        self.barriers = 0

    def wait_for_everyone(self):
        self.barriers += 1


def test_only_the_start_is_a_collective_barrier(tmp_path, bronzes, containers, fake_zest):
    state = OneProcess()
    summary = run_generation(config_for(tmp_path, containers, bronzes), pipeline=fake_zest(), state=state)
    assert state.barriers == 1 and summary["done"] == 7 and summary["shards"][0]["generated_here"] == 7
    assert not list((tmp_path / "out" / JOB_FOLDER / "finished").glob("*.tmp*"))


def test_new_config_keys_are_validated_passed_to_the_pipeline_and_not_decisive(tmp_path, bronzes, containers,
                                                                               fake_zest, monkeypatch):
    base = {"task": "custom", "targets": "t", "materials": "m", "out": "o"}
    for key, value, message in [("attention", "flash", "^attention: must be one of"),
                                ("compile", "yes", "^compile: must be true or false"),
                                ("mask_method", "grabcut", "^mask_method: must be one of"),
                                ("plan_change", "merge", "^plan_change: must be one of")]:
        with pytest.raises(ValueError, match=message):
            GenerationConfig.from_dict({**base, key: value})
    config = GenerationConfig.from_dict({**base, "attention": "sdpa", "compile": True, "precision": "fp32"})
    assert config.fingerprint() == GenerationConfig.from_dict(base | {"precision": "fp32"}).fingerprint()
    assert config.fingerprint() != GenerationConfig.from_dict({**base, "mask_method": "opencv"}).fingerprint()

    import gen.zest

    seen = {}
    monkeypatch.setattr(gen.zest.ZeSTPipeline, "from_config",
                        classmethod(lambda cls, models, **kwargs: seen.update(kwargs) or "pipe"))
    monkeypatch.setattr("gen.job.resolve_models", lambda models, state=None: "models")
    assert build_pipeline(config, OneProcess()) == "pipe"
    assert (seen["attention"], seen["compile"], str(seen["dtype"])) == ("sdpa", True, "torch.float32")

    # a job.json written before these keys existed resumes (missing keys count as their defaults)
    job = config_for(tmp_path, containers, bronzes)
    run_generation(job, pipeline=fake_zest())
    job_file = Path(job.out) / JOB_FOLDER / "job.json"
    stored = json.loads(job_file.read_text())
    for key in ("mask_method", "attention", "compile", "plan_change"):
        del stored["config"][key]
    stored["fingerprint"] = "from-an-older-version"
    job_file.write_text(json.dumps(stored))
    assert run_generation(job, pipeline=fake_zest())["done"] == 7
    with pytest.raises(ValueError, match=r"changed keys: \['mask_method'\]"):
        run_generation(config_for(tmp_path, containers, bronzes, mask_method="opencv"), pipeline=fake_zest())
