"""The generation demo stage and the `models: tiny` cache."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

import gen.job
from gen.demo import MATERIALS, TARGETS, generation_demo
from pipelines.data import read_manifest


@pytest.mark.slow
def test_tiny_models_are_built_once_into_the_cache(tmp_path, monkeypatch, tiny_zest_models):
    import gen.tiny_zest
    import pipelines.tiny
    from gen.zest import ZeSTConfig

    builds = []

    def fake_build(folder):
        builds.append(Path(folder))
        return ZeSTConfig.from_dict(tiny_zest_models)

    monkeypatch.setenv("OODFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gen.tiny_zest, "save_tiny_zest", fake_build)
    first = gen.job.resolve_models("tiny")
    second = gen.job.resolve_models("tiny")
    assert builds == [tmp_path / "cache" / f"tiny_zest-{pipelines.tiny.standin_fingerprint()}"]
    assert first == second == ZeSTConfig.from_dict(tiny_zest_models)


@pytest.mark.slow
def test_generation_demo_writes_a_manifest_with_inherited_categories(tmp_path, monkeypatch, tiny_zest_models,
                                                                     single_thread):
    monkeypatch.setenv("OODFORGE_CACHE", str(tmp_path / "cache"))
    cache = gen.job.tiny_models_folder()
    cache.mkdir(parents=True)
    (cache / "zest_config.json").write_text(json.dumps(tiny_zest_models))  # reuse the session's tiny models

    result = generation_demo(tmp_path / "demo")

    rows = read_manifest(Path(result["manifest"]).parent, check_files=True).rows
    assert len(rows) == len(TARGETS)
    assert sorted(Path(r["provenance"]["source_target"]).stem for r in rows) == sorted(TARGETS)
    for row in rows:
        material = Path(row["provenance"]["source_material"])
        assert row["category"] == material.parent.name == material.stem
        assert row["ood_set"] == "demo_transfer" and "source_label" not in row
    uses = Counter(r["category"] for r in rows)
    assert set(uses) <= set(MATERIALS) and max(uses.values()) - min(uses.values()) <= 1
    from gen.sheet import GROUP_GAP, PAD, TILE

    with Image.open(result["contact_sheet"]) as sheet:  # 4 outputs: two (target, material, output) groups a line
        assert sheet.width == 2 * (3 * TILE + 2 * PAD) + GROUP_GAP + 2 * PAD and 2 * TILE < sheet.height < 3 * TILE
