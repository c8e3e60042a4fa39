"""Pairing plans: counts, balance, label inheritance, determinism."""
from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gen.job import GenerationConfig, load_plan
from gen.pairing import balanced_pairs, inherited_labels, load_source, make_plan, plan_task, use_counts
from pipelines.data import make_row, read_manifest, write_manifest


def test_transferred_container_uses_every_container_once_and_inherits_bronze_labels(bronzes, containers):
    bronze_rows = {str(bronzes / r["file_name"]): r for r in read_manifest(bronzes)}
    plan = plan_task("transferred_container", load_source(containers, "targets"), load_source(bronzes, "materials"),
                     seed=3)

    assert len(plan) == 7
    assert sorted(Path(item.target).name for item in plan) == [f"container_{i}.png" for i in range(7)]
    assert sorted(Counter(item.material for item in plan).values()) == [2, 2, 3]
    for item in plan:
        bronze = bronze_rows[item.material]
        assert item.material_row == bronze
        assert item.labels == {"era": bronze["era"], "category": bronze["category"], "dynasty": bronze["dynasty"],
                               "source_label": bronze["label"]}
    assert len({item.output for item in plan}) == 7
    assert [item.index for item in plan] == list(range(7))


def test_transferred_bronze_uses_every_container_once_on_balanced_bronzes(bronzes, containers):
    plan = plan_task("transferred_bronze", load_source(bronzes, "targets"), load_source(containers, "materials"),
                     seed=0)

    assert len(plan) == 7  # one output per container exemplar
    assert sorted(Path(item.material).name for item in plan) == [f"container_{i}.png" for i in range(7)]
    assert sorted(Counter(item.target for item in plan).values()) == [2, 2, 3]
    by_target: dict[str, list[str]] = {}
    for item in plan:
        by_target.setdefault(item.target, []).append(item.material)
        assert item.labels == {"category": item.material_row["category"]}
        assert item.labels["category"] == "vase" + Path(item.material).stem.split("_")[1]
    assert all(len(set(m)) == len(m) for m in by_target.values())
    assert len({item.output for item in plan}) == 7


def _metadata_only(folder: Path, n: int, role: str) -> Path:
    """A manifest of n rows and no image files (planning never opens an image)."""
    rows = [make_row(f"{i:06d}.jpg", split="test", role=role, label=0, ood_set="container" if role == "ood" else None,
                     category=f"c{i % 83}") for i in range(n)]
    write_manifest(folder, rows)
    return folder


@pytest.mark.slow
def test_dry_run_prints_the_papers_counts(tmp_path, capsys):
    # the paper's sizes: 2,861 bronze test images, 51,023 container images
    script = importlib.import_module("oodforge.commands.generate")
    main = script.main
    bronzes = _metadata_only(tmp_path / "bronzes", 2861, "id")
    containers = _metadata_only(tmp_path / "containers", 51023, "ood")
    expected = {"transferred_container": (containers, bronzes, 51023, 51023, 2861),
                "transferred_bronze": (bronzes, containers, 51023, 2861, 51023)}
    for task, (targets, materials, planned, n_targets, n_materials) in expected.items():
        config = tmp_path / f"{task}.yaml"
        config.write_text(f"task: {task}\ntargets: {targets}\nmaterials: {materials}\nout: {tmp_path / task}\n")
        main(["--config", str(config), "--dry-run", "--show", "0"])
        printed = capsys.readouterr().out
        assert (f"plan: {planned:,} item(s) of task {task} (OOD set {task}) from {n_targets:,} target(s) and "
                f"{n_materials:,} material(s)") in printed
        if task == "transferred_bronze":
            assert "each material used 1 time(s)" in printed
            plan = load_plan(GenerationConfig.from_yaml(config, []))
            per_bronze = Counter(item.target for item in plan)
            assert (min(per_bronze.values()), max(per_bronze.values())) == (17, 18)  # 51,023 / 2,861 = 17.83
        else:
            assert "each material used 17 to 18 times" in printed


def test_custom_per_target_gives_distinct_balanced_exemplars(bronzes, containers):
    plan = plan_task("custom", load_source(bronzes, "targets"), load_source(containers, "materials"), per_target=5,
                     seed=1, inherit="target")
    assert len(plan) == 15
    by_target: dict[str, list[str]] = {}
    for item in plan:
        by_target.setdefault(item.target, []).append(item.material)
        assert item.labels == inherited_labels(item.target_row)
    assert all(len(set(m)) == 5 for m in by_target.values())
    assert sorted(Counter(item.material for item in plan).values()) == [2, 2, 2, 2, 2, 2, 3]


@pytest.mark.parametrize("n_targets,n_materials,per_target",
                         [(17, 5, 1), (5, 17, 1), (40, 7, 3), (1, 1, 1), (12, 4, 4)])
def test_balanced_pairs_are_within_one_on_every_prefix_and_distinct_per_target(n_targets, n_materials, per_target):
    pairs = balanced_pairs(n_targets, n_materials, per_target, seed=11)
    assert sorted(Counter(pairs[:, 0].tolist()).values()) == [per_target] * n_targets
    for stop in range(1, len(pairs) + 1):
        counts = np.bincount(pairs[:stop, 1], minlength=n_materials)
        assert counts.max() - counts.min() <= 1
    per_target_materials: dict[int, set[int]] = {}
    for t, m in pairs.tolist():
        per_target_materials.setdefault(t, set()).add(m)
    assert all(len(s) == per_target for s in per_target_materials.values())


def test_plan_is_deterministic_for_a_seed_and_changes_with_it(tmp_path, image_writer):
    image_writer(tmp_path / "t", [f"t{i}.png" for i in range(20)], seed=0, size=4)
    image_writer(tmp_path / "m", [f"m{i}.png" for i in range(20)], seed=0, size=4)
    targets, materials = load_source(tmp_path / "t", "targets"), load_source(tmp_path / "m", "materials")
    first = [(i.target, i.material) for i in plan_task("custom", targets, materials, seed=5)]
    again = [(i.target, i.material) for i in plan_task("custom", targets, materials, seed=5)]
    other = [(i.target, i.material) for i in plan_task("custom", targets, materials, seed=6)]
    assert first == again
    assert first != other


def test_cover_materials_rejects_several_per_target_and_empty_targets(bronzes, containers, tmp_path):
    targets, materials = load_source(bronzes, "targets"), load_source(containers, "materials")
    with pytest.raises(ValueError, match="per_target must be 1"):
        make_plan(targets, materials, per_target=2, cover="materials")
    with pytest.raises(ValueError, match="cover must be one of"):
        make_plan(targets, materials, cover="both")
    limited = plan_task("transferred_bronze", targets, materials, seed=4, limit=5)
    assert len({item.material for item in limited}) == 5
    counts = Counter(item.target for item in limited).values()
    assert max(counts) - min(counts) <= 1


def test_limit_keeps_a_balanced_prefix(bronzes, containers):
    full = plan_task("transferred_container", load_source(containers, "t"), load_source(bronzes, "m"), seed=2)
    limited = plan_task("transferred_container", load_source(containers, "t"), load_source(bronzes, "m"), seed=2,
                        limit=4)
    assert [i.to_dict() for i in limited] == [i.to_dict() for i in full[:4]]
    assert max(use_counts(limited).values()) - min(use_counts(limited).values()) <= 1


def test_plain_folder_subfolder_becomes_category(tmp_path, image_writer):
    image_writer(tmp_path / "src", ["jar/a.png", "jar/b.png", "bowl/c.png", "loose.png"], seed=0, size=4)
    source = load_source(tmp_path / "src", "materials")
    assert {r["file_name"]: r.get("category") for r in source} == {
        "bowl/c.png": "bowl", "jar/a.png": "jar", "jar/b.png": "jar", "loose.png": None}
    assert [inherited_labels(r) for r in source] == [{"category": "bowl"}, {"category": "jar"}, {"category": "jar"}, {}]


def test_invalid_requests_raise_clear_errors(bronzes, containers, tmp_path):
    targets, materials = load_source(bronzes, "targets"), load_source(containers, "materials")
    with pytest.raises(ValueError, match="per_target=8 exceeds the 7"):
        plan_task("custom", targets, materials, per_target=8)
    with pytest.raises(ValueError, match="use task 'custom'"):
        plan_task("transferred_bronze", targets, materials, per_target=2)
    with pytest.raises(ValueError, match="task must be one of"):
        plan_task("bogus", targets, materials)
    with pytest.raises(FileNotFoundError, match="materials folder not found"):
        load_source(tmp_path / "missing", "materials")
