"""Which inputs a job reads: `plan_change: extend` on the covered side, and manifest sources limited to a split and
sets."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gen.job import GenerationConfig, job_plan, run_generation
from pipelines.data import make_row, read_manifest, write_manifest
from pipelines.errors import ConfigError
from pipelines.runtime import item_seed


def config_for(tmp_path: Path, targets, materials, **extra) -> GenerationConfig:
    values = {"task": "transferred_container", "targets": targets, "materials": materials,
              "out": str(tmp_path / "out"), "resolution": 16, "num_inference_steps": 2, "batch_size": 2, "seed": 7}
    return GenerationConfig.from_dict({**values, **extra})


def test_extend_covers_added_containers_of_a_transferred_bronze_job(tmp_path, bronzes, fake_zest, image_writer):
    containers = tmp_path / "containers"
    image_writer(containers, [f"c{i}.png" for i in range(5)], seed=4)
    config = config_for(tmp_path, str(bronzes), str(containers), task="transferred_bronze", plan_change="extend")
    run_generation(config, pipeline=fake_zest())
    out = Path(config.out)
    before = {row["file_name"]: (out / row["file_name"]).read_bytes() for row in read_manifest(out)}

    image_writer(containers, ["c5.png", "c6.png", "c7.png"], seed=5)  # the materials: the side covered once
    pipe = fake_zest()
    summary = run_generation(config, pipeline=pipe)
    assert summary["extended"] == 3 and pipe.items == 3 and summary["done"] == 8
    rows = read_manifest(out, check_files=True).rows
    assert [int(r["file_name"][7:14]) for r in rows] == list(range(8))
    materials = [Path(r["provenance"]["source_material"]).name for r in rows]
    assert sorted(materials) == [f"c{i}.png" for i in range(8)]  # every container exactly once
    assert set(materials[5:]) == {"c5.png", "c6.png", "c7.png"}
    assert {name: (out / name).read_bytes() for name in before} == before
    new_targets = Counter(Path(r["provenance"]["source_target"]).name for r in rows[5:])
    assert max(new_targets.values()) == 1  # the added containers are dealt balanced over the bronzes
    assert [r["provenance"]["seed"] for r in rows] == [item_seed(7, i) for i in range(8)]


def test_extend_on_a_target_covering_task_leaves_added_materials_for_added_targets(tmp_path, containers, fake_zest,
                                                                                  image_writer):
    materials = tmp_path / "materials"
    image_writer(materials, ["m0.png", "m1.png"], seed=6)
    config = config_for(tmp_path, str(containers), str(materials), plan_change="extend")
    run_generation(config, pipeline=fake_zest())
    image_writer(materials, ["m2.png"], seed=7)
    pipe = fake_zest()
    assert run_generation(config, pipeline=pipe)["extended"] == 0 and pipe.items == 0


def split_manifest(folder: Path, write_images) -> Path:
    """Bronzes in train / val / test, and two OOD sets in test."""
    rows = []
    for split, n in (("train", 3), ("val", 2), ("test", 4)):
        names = [f"{split}_{i}.png" for i in range(n)]
        write_images(folder, names, seed=len(rows))
        rows += [make_row(name, split=split, role="id", label=i % 2, era=f"era{i}") for i, name in enumerate(names)]
    for ood_set in ("sketch", "container"):
        names = [f"{ood_set}_{i}.png" for i in range(2)]
        write_images(folder, names, seed=9)
        rows += [make_row(name, split="test", role="ood", ood_set=ood_set, group="hard", label=-1) for name in names]
    write_manifest(folder, rows)
    return folder


def test_manifest_sources_are_limited_to_a_split_and_sets(tmp_path, containers, image_writer):
    bronzes = split_manifest(tmp_path / "bronzes", image_writer)
    plan = job_plan(config_for(tmp_path, str(containers), {"manifest": str(bronzes), "split": "test"}))
    used = {Path(item.material).name for item in plan.items}
    assert used <= {f"test_{i}.png" for i in range(4)} | {f"{s}_{i}.png" for s in ("sketch", "container")
                                                           for i in range(2)}
    assert not any(name.startswith(("train_", "val_")) for name in plan.materials)
    assert len(plan.materials) == 8

    only_sketch = job_plan(config_for(tmp_path / "b", str(containers),
                                      {"manifest": str(bronzes), "split": "test", "sets": ["sketch"]}))
    assert sorted(only_sketch.materials) == ["sketch_0.png", "sketch_1.png"]
    every_split = job_plan(config_for(tmp_path / "c", str(containers), {"manifest": str(bronzes), "split": None}))
    assert len(every_split.materials) == 13
    plain = job_plan(config_for(tmp_path / "d", str(containers), str(bronzes)))  # a folder string: every row
    assert len(plain.materials) == 13


def test_bad_source_mappings_are_config_errors_naming_the_key(tmp_path, containers, image_writer):
    bronzes = split_manifest(tmp_path / "bronzes", image_writer)
    for materials, message in [({"manifest": str(bronzes), "splt": "test"},
                                r"^materials.splt: unknown key \(did you mean 'split'\?\)"),
                               ({"split": "test"}, r"^materials.manifest: required"),
                               ({"manifest": str(bronzes), "split": "dev"}, "^materials.split: must be one of"),
                               ({"manifest": str(bronzes), "sets": "sketch"}, "^materials.sets: must be a list"),
                               ({"manifest": str(bronzes), "group": "hard"}, "^materials.group: generated images are")]:
        with pytest.raises(ConfigError, match=message):
            config_for(tmp_path, str(containers), materials)
    with pytest.raises(ConfigError, match=r"materials: no row of .*bronzes with split .test. and ood_set in "
                                          r"\[.sculpture.\] \(sets there: container, sketch;"):
        job_plan(config_for(tmp_path, str(containers),
                            {"manifest": str(bronzes), "split": "test", "sets": ["sculpture"]}))


def test_changing_a_source_filter_is_a_different_job(tmp_path, containers, fake_zest, image_writer):
    bronzes = split_manifest(tmp_path / "bronzes", image_writer)
    run_generation(config_for(tmp_path, str(containers), {"manifest": str(bronzes), "split": "test"}),
                   pipeline=fake_zest())
    with pytest.raises(ValueError, match=r"changed keys: \['materials'\]"):
        run_generation(config_for(tmp_path, str(containers), {"manifest": str(bronzes), "split": "val"}),
                       pipeline=fake_zest())


def test_a_bare_folder_with_train_and_val_rows_is_warned_about(tmp_path, containers, fake_zest, image_writer):
    bronzes = split_manifest(tmp_path / "bronzes", image_writer)
    expected = (f"materials: {bronzes} holds 5 train/val row(s) of 13, all used; write {{manifest: {bronzes}, "
                f"split: test}} to use its test rows only")
    assert run_generation(config_for(tmp_path / "a", str(containers), str(bronzes)), dry_run=True)["warnings"] == [
        expected]
    summary = run_generation(config_for(tmp_path / "b", str(containers), str(bronzes), mask_method="opencv"),
                             pipeline=fake_zest())
    assert summary["warnings"] == [expected]
    whole = run_generation(config_for(tmp_path / "c", str(containers), {"manifest": str(bronzes)}), dry_run=True)
    assert whole["warnings"] == [expected]  # a mapping without a split reads every split too (pipelines.sources)
    filtered = run_generation(config_for(tmp_path / "d", str(containers), {"manifest": str(bronzes), "split": "test"}),
                              dry_run=True)
    assert "warnings" not in filtered
