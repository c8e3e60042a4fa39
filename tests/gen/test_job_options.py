"""Job options and checks: the rembg start-up check, the seed mode, the batch size and mask warnings in provenance and
summary (fake pipeline)."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
from badinputs import object_array, object_mask
from PIL import Image

import gen.masks as masks
from gen.job import JOB_FOLDER, GenerationConfig, run_generation
from gen.ledger import Ledger
from pipelines.data import read_manifest
from pipelines.runtime import item_seed


def config_for(tmp_path: Path, targets: Path, materials: Path, **extra) -> GenerationConfig:
    values = {"task": "transferred_container", "targets": str(targets), "materials": str(materials),
              "out": str(tmp_path / "out"), "resolution": 16, "num_inference_steps": 2, "batch_size": 2, "seed": 7}
    return GenerationConfig.from_dict({**values, **extra})


@pytest.fixture
def unreachable_rembg(monkeypatch):
    """rembg 'installed', but its model cannot be fetched; returns the list of session attempts."""
    attempts: list[str] = []

    def new_session(model):
        attempts.append(model)
        raise ConnectionError("cannot reach github.com")

    monkeypatch.setitem(sys.modules, "rembg", types.SimpleNamespace(new_session=new_session, remove=None))
    monkeypatch.setattr(masks, "rembg_available", lambda: True)
    masks.rembg_session.cache_clear()
    yield attempts
    masks.rembg_session.cache_clear()


@pytest.mark.parametrize("method", ["rembg", "auto"])
def test_an_unreachable_rembg_model_stops_the_job_once_at_start_up(tmp_path, bronzes, containers, fake_zest,
                                                                  unreachable_rembg, method):
    pipe = fake_zest()
    with pytest.raises(masks.MaskModelError, match=r"rembg cannot load its 'u2net' model \(ConnectionError"):
        run_generation(config_for(tmp_path, containers, bronzes, mask_method=method), pipeline=pipe)
    assert unreachable_rembg == ["u2net"] and pipe.calls == 0  # once, not once per item
    assert Ledger(tmp_path / "out" / JOB_FOLDER / "ledger").records() == {}


def test_given_masks_need_no_rembg(tmp_path, bronzes, containers, fake_zest, unreachable_rembg, image_writer):
    image_writer(tmp_path / "masks", [f"container_{i}.png" for i in range(7)], seed=3)
    summary = run_generation(config_for(tmp_path, containers, bronzes, mask_method="rembg",
                                        masks=str(tmp_path / "masks")), pipeline=fake_zest())
    assert summary["done"] == 7 and unreachable_rembg == [] and summary["mask_method"] == "given"


def test_rembg_missing_for_mask_method_rembg_is_a_one_line_error(tmp_path, bronzes, containers, fake_zest,
                                                                 monkeypatch):
    monkeypatch.setattr(masks, "rembg_available", lambda: False)
    with pytest.raises(masks.MaskModelError, match="pip install 'oodforge\\[masks\\]'"):
        run_generation(config_for(tmp_path, containers, bronzes, mask_method="rembg"), pipeline=fake_zest())


def test_seed_mode_constant_gives_every_item_the_seed_and_per_item_stays_the_default(tmp_path, bronzes, containers,
                                                                                    fake_zest):
    per_item = run_generation(config_for(tmp_path / "a", containers, bronzes), pipeline=fake_zest())
    constant = run_generation(config_for(tmp_path / "b", containers, bronzes, seed_mode="constant", seed=42),
                              pipeline=fake_zest())
    seeds = [row["provenance"]["seed"] for row in read_manifest(Path(per_item["manifest"]).parent)]
    assert seeds == [item_seed(7, i) for i in range(7)] and len(set(seeds)) == 7
    assert [row["provenance"]["seed"] for row in read_manifest(Path(constant["manifest"]).parent)] == [42] * 7
    assert GenerationConfig.from_dict({"task": "custom", "targets": "t", "materials": "m", "out": "o"}).seed_mode \
        == "per_item"
    with pytest.raises(ValueError, match="^seed_mode: must be one of"):
        config_for(tmp_path, containers, bronzes, seed_mode="fixed")
    with pytest.raises(ValueError, match=r"changed keys: \['seed_mode'\]"):  # it changes the images: decisive
        run_generation(config_for(tmp_path / "a", containers, bronzes, seed_mode="constant"), pipeline=fake_zest())


class FailsOnSeed:
    """Copies the target; raises ValueError for a call holding `bad_seed` (so the batch is retried one by one)."""

    model_ids = {"base": "copy"}

    def __init__(self, bad_seed: int):
        self.bad_seed = bad_seed

    def __call__(self, targets, materials, masks=None, seeds=None, resolution=16, **params):
        if self.bad_seed in seeds and len(seeds) > 1:
            raise ValueError("only alone")
        return [t.resize((resolution, resolution)) for t in targets]


def test_the_size_of_the_call_that_made_each_image_is_in_its_provenance(tmp_path, bronzes, containers):
    summary = run_generation(config_for(tmp_path, containers, bronzes, batch_size=3),
                             pipeline=FailsOnSeed(item_seed(7, 4)))
    sizes = [row["provenance"]["params"]["batch_size"] for row in read_manifest(Path(summary["manifest"]).parent)]
    assert sizes == [3, 3, 3, 1, 1, 1, 1]  # items 3-5 retried one by one, item 6 alone in the last batch


def test_suspicious_masks_are_counted_in_the_summary_and_their_coverage_recorded(tmp_path, bronzes):
    targets, mask_folder = tmp_path / "targets", tmp_path / "masks"
    targets.mkdir()
    mask_folder.mkdir()
    size = (40, 30)
    for i in range(4):
        Image.fromarray(object_array(size, seed=i)).save(targets / f"t{i}.png")
    ellipse = np.where(object_mask(size), 255, 0).astype(np.uint8)
    Image.fromarray(ellipse).save(mask_folder / "t0.png")  # a plain mask: no warning
    opaque = np.dstack([ellipse, ellipse, ellipse, np.full_like(ellipse, 255)])
    Image.fromarray(opaque, "RGBA").save(mask_folder / "t1.png")  # black-and-white saved as RGBA, opaque alpha
    Image.fromarray(np.full(size[::-1], 255, np.uint8)).save(mask_folder / "t2.png")  # the whole image
    speck = np.zeros(size[::-1], np.uint8)
    speck[0, :3] = 255
    Image.fromarray(speck).save(mask_folder / "t3.png")  # 3 of 1,200 pixels

    summary = run_generation(config_for(tmp_path, targets, bronzes, masks=str(mask_folder)), pipeline=FailsOnSeed(-1))
    assert summary["done"] == 4
    assert summary["mask_warnings"] == {
        "constant_alpha": {"count": 1, "examples": [str(mask_folder / "t1.png")]},
        "coverage_full": {"count": 1, "examples": [str(mask_folder / "t2.png")]},
        "coverage_tiny": {"count": 1, "examples": [str(mask_folder / "t3.png")]},
    }
    assert any(line.startswith("1 given mask(s) have a constant alpha channel") for line in summary["warnings"])
    rows = {Path(r["provenance"]["source_target"]).name: r for r in read_manifest(tmp_path / "out")}
    coverage = {name: row["provenance"]["params"]["mask_coverage"] for name, row in rows.items()}
    expected = round(float(object_mask(size).mean()), 4)
    assert coverage == {"t0.png": expected, "t1.png": expected, "t2.png": 1.0, "t3.png": 0.0025}
