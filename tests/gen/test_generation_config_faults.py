"""Malformed generation configs through `scripts/generate.py`: each is refused in one line naming the key, exit 2,
before any job file is written (the `out` folder holds no `.job`), or accepted on purpose. Then the checks made before
any work: a start refused or failed leaves nothing that binds the corrected rerun, and `--dry-run` refuses
where the run does, in the same line."""
from __future__ import annotations

from pathlib import Path

import pytest

from gen.job import JOB_FOLDER, GenerationConfig, run_generation
from gen.masks import rembg_available
from oodforge.commands import generate
from pipelines.cli import run_main

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
MAIN = generate.main

FAULTS = [  # (config lines added to a valid config, the error's text after "error: <file>: ")
    ("stepz: 3", "stepz: unknown key (allowed: attention, "),
    ("models: {bsae: stabilityai/sdxl}", "models.bsae: unknown key (did you mean 'base'?)"),
    ("models: {base: /no/such/dir}", "models.base: the local model folder '/no/such/dir' does not exist"),
    ("models: tini",
     "models: must be ZeSTConfig or one of 'tiny' or null (None), got str 'tini' (did you mean 'tiny'?)"),
    ("name: 2024", "name: must be a string, got int 2024"),
    ("strength: 1.5", "strength: must be > 0 and <= 1, got 1.5"),
    ("strength: 0", "strength: must be > 0 and <= 1, got 0.0"),
    ("num_inference_steps: 1", "strength: times num_inference_steps must reach 1 denoising step, got 0.9999 x 1"),
    ("resolution: 100", "resolution: must be a multiple of 8"),
    ("batch_size: 0", "batch_size: must be >= 1, got 0"),
    ("seed: abc", "seed: must be an integer, got str 'abc'"),
    ("guidance_scale: '5'", "guidance_scale: must be a number, got str '5'"),
    ("precision: fp64", "precision: must be one of 'auto', 'bf16', 'fp16', 'fp32', got str 'fp64'"),
    ("limit: -1", "limit: must be >= 0, got -1"),
    ("inherit: targets", "inherit: must be one of 'material', 'target', 'none', got str 'targets' (did you mean "),
    ("masks: /no/such/masks", "masks: the folder '/no/such/masks' does not exist"),
    ("resize: crop", "resize: must be one of 'squash', 'pad', got str 'crop'"),
    ("targets: {manifest: TARGETS, splt: test}", "targets.splt: unknown key (did you mean 'split'?)"),
    ("materials: {manifest: MATERIALS, group: hard}", "materials.group: generated images are always group 'hard'"),
]
ACCEPTED = [  # on purpose: each is a meaningful setting
    "strength: 1",  # pure noise start (no illumination guidance): diffusers allows it
    "guidance_scale: 0",  # no classifier-free guidance
    "limit: 0",  # plan the job, run nothing yet
    "name: '2024'",  # a quoted number is a name
    "materials: {manifest: MATERIALS, split: null}",  # a generation input with split null reads every split
]


def write_config(tmp_path: Path, targets: Path, materials: Path, extra: str) -> Path:
    lines = {"task": "transferred_container", "targets": str(targets), "materials": str(materials),
             "out": str(tmp_path / "out"), "resolution": "16", "mask_method": "opencv"}
    for line in filter(None, extra.replace("TARGETS", str(targets)).replace("MATERIALS", str(materials)).split("\n")):
        key, _, value = line.partition(": ")
        lines[key] = value
    path = tmp_path / "gen.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return path


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
@pytest.mark.parametrize("extra, message", FAULTS, ids=[f[0].split(":")[0] for f in FAULTS])
def test_a_malformed_config_is_one_line_naming_the_key_before_any_job_file(tmp_path, capsys, containers, bronzes,
                                                                          extra, message, dry_run):
    config = write_config(tmp_path, containers, bronzes, extra)
    assert run_main(MAIN, ["--config", str(config), *(["--dry-run"] if dry_run else [])]) == 2
    line = error_line(capsys)
    assert line.startswith(f"error: {config}: {message}"), line
    assert line.endswith("(see docs/generation.md)")
    assert not (tmp_path / "out" / JOB_FOLDER).exists()


@pytest.mark.parametrize("extra", ACCEPTED)
def test_meaningful_settings_are_accepted(tmp_path, capsys, containers, bronzes, extra):
    config = write_config(tmp_path, containers, bronzes, extra)
    assert run_main(MAIN, ["--config", str(config), "--dry-run"]) == 0, capsys.readouterr().err


@pytest.mark.skipif(rembg_available(), reason="rembg is installed here")
def test_an_unusable_mask_method_is_refused_at_start_up(tmp_path, capsys, containers, bronzes):
    config = write_config(tmp_path, containers, bronzes, "mask_method: rembg")
    assert run_main(MAIN, ["--config", str(config)]) == 2
    assert "mask_method: mask_method 'rembg' needs the optional package rembg" in error_line(capsys)
    assert not (tmp_path / "out" / JOB_FOLDER).exists()


class FailsEveryItem:
    """A pipeline whose every call fails (as a bad value once did, item by item)."""

    model_ids = {"base": "fake/base"}

    def __call__(self, targets, materials, masks=None, seeds=None, **params):
        raise ValueError("every item fails")


def test_a_corrected_rerun_after_a_failed_start_is_not_a_different_job(tmp_path, containers, bronzes, fake_zest):
    config = write_config(tmp_path, containers, bronzes, "seed: 1")
    first = run_generation(GenerationConfig.from_yaml(config), pipeline=FailsEveryItem())
    assert first["done"] == 0 and len(first["failed"]) == 7
    corrected = GenerationConfig.from_yaml(config, ["seed=2", "guidance_scale=4.0"])
    second = run_generation(corrected, pipeline=fake_zest())
    assert second["done"] == 7 and second["failed"] == [] and second["skipped"] == 0
    # once an item is finished the job binds: a changed key is refused
    with pytest.raises(ValueError, match=r"different generation job \(changed keys: \['seed'\]\)"):
        run_generation(GenerationConfig.from_yaml(config, ["seed=3", "guidance_scale=4.0"]), pipeline=fake_zest())


def test_dry_run_refuses_a_folder_holding_another_job_in_the_line_the_run_gives(tmp_path, capsys, containers, bronzes,
                                                                                fake_zest):
    config = write_config(tmp_path, containers, bronzes, "seed: 1")
    run_generation(GenerationConfig.from_yaml(config), pipeline=fake_zest())
    capsys.readouterr()
    assert run_main(MAIN, ["--config", str(config), "seed=5"]) == 2
    run_line = error_line(capsys)
    assert run_main(MAIN, ["--config", str(config), "seed=5", "--dry-run"]) == 2
    assert error_line(capsys) == run_line
    assert "holds a different generation job (changed keys: ['seed'])" in run_line
    assert run_main(MAIN, ["--config", str(config), "--dry-run"]) == 0
    assert "already done: 7; to generate: 0" in capsys.readouterr().out


def test_the_run_reports_done_failed_and_skipped(tmp_path, capsys, containers, bronzes, fake_zest, monkeypatch):
    """The console counts what happened: a rerun of a finished job says 0 done, 0 failed, 7 skipped."""
    config = write_config(tmp_path, containers, bronzes, "")
    run_generation(GenerationConfig.from_yaml(config), pipeline=fake_zest())
    capsys.readouterr()
    monkeypatch.setattr("gen.job.build_pipeline", lambda *a: pytest.fail("no pipeline is built for a finished job"))
    assert run_main(MAIN, ["--config", str(config)]) == 0
    assert ("generate: 0 done, 0 failed, 7 skipped (finished before); 7 of 7 planned in the manifest"
            in capsys.readouterr().err)


def test_failures_are_counted_as_failures(tmp_path, capsys, containers, bronzes, monkeypatch):
    config = write_config(tmp_path, containers, bronzes, "batch_size: 2")
    monkeypatch.setattr("gen.job.build_pipeline", lambda *a: FailsEveryItem())
    monkeypatch.setenv("OODFORGE_PROGRESS", "lines")
    assert run_main(MAIN, ["--config", str(config)]) == 1  # every item failed: the run failed
    err = capsys.readouterr().err
    assert "generate: 0 done, 7 failed, 0 skipped (finished before); 0 of 7 planned in the manifest" in err
    assert err.strip().splitlines()[-1].startswith("error: every planned item failed (7); the first, ")
    assert "7 img in" in err and "done=0, failed=7" in err and "done, 7 img" not in err


def test_an_unavailable_hub_model_is_one_line_and_the_corrected_rerun_runs(tmp_path, capsys, containers, bronzes,
                                                                          fake_zest, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    missing = ", ".join(f"{key}: oodforge-tests/no-such-{key}" for key in ("base", "controlnet", "ip_adapter", "depth"))
    config = write_config(tmp_path, containers, bronzes, f"models: {{{missing}}}")
    assert run_main(MAIN, ["--config", str(config)]) == 2
    line = error_line(capsys)
    assert "could not load" in line and "oodforge-tests/no-such-" in line and "pass DIR instead" in line
    corrected = GenerationConfig.from_yaml(config, ["models=null"])  # e.g. the real models, now downloaded
    assert run_generation(corrected, pipeline=fake_zest())["done"] == 7


@pytest.mark.parametrize("name", sorted(p.name for p in (SCRIPTS.parent / "configs").glob("gen_*.yaml")))
def test_the_shipped_generation_configs_load(name):
    config = GenerationConfig.from_yaml(SCRIPTS.parent / "configs" / name)
    assert config.task in ("transferred_container", "custom") and config.call().strength == 0.9999


def test_the_generation_config_classes_are_documented_and_round_trip_through_yaml(tmp_path):
    """Every field of GenerationConfig, ZeSTConfig and ZeSTCall has a one-line doc; a config written as YAML reads
    back equal."""
    import yaml

    from gen.zest import ZeSTCall, ZeSTConfig

    for cls in (GenerationConfig, ZeSTConfig, ZeSTCall):
        undocumented = [name for name in cls.fields() if not cls.doc(name) or "\n" in cls.doc(name)]
        assert not undocumented, (cls.__name__, undocumented)
    assert ZeSTConfig.from_dict(ZeSTConfig().to_dict()) == ZeSTConfig() and ZeSTCall.from_dict({}) == ZeSTCall()
    config = GenerationConfig.from_dict({"task": "custom", "targets": {"manifest": "t", "split": "test", "sets": ["a"]},
                                         "materials": "m", "out": "o",
                                         "models": {"vae": "madebyollin/sdxl-vae-fp16-fix"},
                                         "name": "x", "feather": 2.0})
    path = tmp_path / "again.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    assert GenerationConfig.from_yaml(path) == config
    assert GenerationConfig.from_dict({**config.to_dict(), "models": "tiny"}).models == "tiny"
