"""The generation job with a fake pipeline: manifest and provenance, resume after a crash, corrupt inputs, config."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gen.job import JOB_FOLDER, GenerationConfig, run_generation
from gen.ledger import Ledger
from gen.zest import ZeSTConfig
from pipelines.configfile import apply_overrides
from pipelines.data import read_manifest
from pipelines.errors import ConfigError
from pipelines.runtime import item_seed


def config_for(tmp_path: Path, targets: Path, materials: Path, **extra) -> GenerationConfig:
    values = {"task": "transferred_container", "targets": str(targets), "materials": str(materials),
              "out": str(tmp_path / "out"), "resolution": 16, "num_inference_steps": 2, "batch_size": 2, "seed": 7}
    return GenerationConfig.from_dict({**values, **extra})


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and ".tmp" in p.name]


def test_output_manifest_validates_and_carries_labels_and_provenance(tmp_path, bronzes, containers, fake_zest):
    config = config_for(tmp_path, containers, bronzes, name="my_transfer")
    pipe = fake_zest()
    summary = run_generation(config, pipeline=pipe)

    manifest = read_manifest(config.out, check_files=True)
    assert summary["done"] == len(manifest) == 7 and summary["failed"] == []
    assert pipe.calls == 4 and pipe.items == 7
    bronze_rows = {str(bronzes / r["file_name"]): r for r in read_manifest(bronzes)}
    for index, row in enumerate(manifest):
        assert ((row["role"], row["ood_set"], row["group"], row["split"], row["label"])
                == ("ood", "my_transfer", "hard", "test", -1))
        prov = row["provenance"]
        bronze = bronze_rows[prov["source_material"]]
        assert (row["era"], row["category"], row["dynasty"], row["source_label"]) == (
            bronze["era"], bronze["category"], bronze["dynasty"], bronze["label"])
        assert Path(prov["source_target"]).parent == containers
        assert prov["seed"] == item_seed(7, index)
        assert prov["pipeline"] == "zest" and prov["model_ids"] == fake_zest.model_ids
        assert prov["params"]["num_inference_steps"] == 2 and prov["params"]["strength"] == 0.9999
        assert set(prov) == {"source_target", "source_material", "seed", "pipeline", "model_ids", "model_revisions",
                             "params", "created"}
        assert (prov["params"]["dtype"], prov["params"]["mask"], prov["params"]["mask_method"]) == (
            "float32", "opencv", "auto")  # CPU policy; rembg is not installed here, so auto fell back to OpenCV
        assert prov["params"]["attention"] == "auto" and prov["params"]["compile"] is False
    assert Path(summary["contact_sheet"]).is_file()
    assert not temp_files(Path(config.out))
    assert summary["warnings"] == ["mask_method auto fell back to the OpenCV GrabCut masks: rembg is not installed"]
    job = json.loads((Path(config.out) / JOB_FOLDER / "job.json").read_text())
    assert job["plan_hash"] == summary["plan_hash"] and job["plan_size"] == 7


def test_crash_then_rerun_finishes_every_item_exactly_once(tmp_path, bronzes, containers, fake_zest):
    config = config_for(tmp_path, containers, bronzes)
    with pytest.raises(RuntimeError, match="injected crash"):
        run_generation(config, pipeline=fake_zest(fail_after=2))
    out = Path(config.out)
    assert len(Ledger(out / JOB_FOLDER / "ledger").records()) == 4
    assert not (out / "metadata.jsonl").exists()
    stale = out / "images" / ".0000005_x.png.abc123.tmp.png"
    stale.write_bytes(b"partial")  # what a killed writer leaves behind

    resumed = fake_zest()
    summary = run_generation(config, pipeline=resumed)
    assert resumed.items == 3 and summary["skipped"] == 4

    reference = fake_zest()
    reference_summary = run_generation(config_for(tmp_path / "ref", containers, bronzes), pipeline=reference)
    rows = read_manifest(out, check_files=True).rows
    assert [r["file_name"] for r in rows] == sorted({r["file_name"] for r in rows}) and len(rows) == 7
    assert sorted(p.name for p in (out / "images").iterdir()) == [r["file_name"].split("/")[1] for r in rows]
    for row in rows:  # resumed outputs equal those of an uninterrupted run
        assert ((out / row["file_name"]).read_bytes()
                == (Path(reference_summary["manifest"]).parent / row["file_name"]).read_bytes())
    assert not temp_files(out)
    merged = (out / JOB_FOLDER / "ledger" / "merged.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["index"] for line in merged) == list(range(7))

    again = fake_zest()
    assert run_generation(config, pipeline=again)["done"] == 7 and again.calls == 0


def test_corrupt_input_is_recorded_and_skipped(tmp_path, bronzes, containers, fake_zest):
    (containers / "container_3.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    config = config_for(tmp_path, containers, bronzes)
    summary = run_generation(config, pipeline=fake_zest())

    assert summary["done"] == 6
    (failure,) = summary["failed"]
    assert failure["file"].endswith("container_3.png") and "cannot decode" in failure["reason"]
    assert "container_3" not in " ".join(r["file_name"] for r in read_manifest(config.out))
    stored = json.loads((Path(config.out) / JOB_FOLDER / "summary.json").read_text())
    assert stored["failed"] == summary["failed"]


def test_masks_folder_is_matched_by_target_name(tmp_path, bronzes, containers, image_writer):
    image_writer(tmp_path / "masks", [f"container_{i}.png" for i in range(6)], seed=3)
    seen = []

    class MaskRecorder:
        model_ids: dict[str, str] = {}

        def __call__(self, targets, materials, masks=None, seeds=None, resolution=16, **params):
            seen.extend(m.mode for m in masks)
            return [t.resize((resolution, resolution)) for t in targets]

    summary = run_generation(config_for(tmp_path, containers, bronzes, masks=str(tmp_path / "masks")),
                             pipeline=MaskRecorder())
    assert seen == ["L"] * 6 and summary["done"] == 6
    assert "no mask named container_6" in summary["failed"][0]["reason"]


def test_dry_run_plans_without_models(tmp_path, bronzes, containers):
    summary = run_generation(config_for(tmp_path, containers, bronzes, limit=5), dry_run=True)
    assert summary == {"dry_run": True, "task": "transferred_container", "ood_set": "transferred_container",
                       "planned": 5, "targets": 5, "materials": 3, "material_use": [1, 2], "already_done": 0,
                       "pending": 5, "plan_hash": summary["plan_hash"], "extended": 0, "skipped_inputs": []}
    assert len(summary["plan_hash"]) == 16
    assert not Path(tmp_path / "out").exists()


def test_a_different_job_in_the_same_folder_is_refused(tmp_path, bronzes, containers, fake_zest):
    run_generation(config_for(tmp_path, containers, bronzes, limit=2), pipeline=fake_zest())
    extended = fake_zest()
    assert run_generation(config_for(tmp_path, containers, bronzes, limit=4), pipeline=extended)["done"] == 4
    assert extended.items == 2
    with pytest.raises(ValueError, match=r"different generation job \(changed keys: \['seed'\]\)"):
        run_generation(config_for(tmp_path, containers, bronzes, seed=8), pipeline=fake_zest())


def test_config_rejects_unknown_keys_and_applies_overrides(tmp_path):
    base = {"task": "custom", "targets": "t", "materials": "m", "out": "o"}
    with pytest.raises(ConfigError, match=r"^stepz: unknown key \(allowed: attention, "):
        GenerationConfig.from_dict({**base, "stepz": 3})
    with pytest.raises(ConfigError, match=r"^num_inference_step: unknown key \(did you mean 'num_inference_steps'\?\)"):
        GenerationConfig.from_dict({**base, "num_inference_step": 3})
    with pytest.raises(ConfigError, match="^batch_size: must be >= 1, got 0"):
        GenerationConfig.from_dict({**base, "batch_size": 0})
    with pytest.raises(ConfigError, match=r"^out: required"):
        GenerationConfig.from_dict({k: v for k, v in base.items() if k != "out"})
    path = tmp_path / "gen.yaml"
    path.write_text("task: custom\ntargets: t\nmaterials: m\nout: o\nmodels: {depth: Intel/dpt-hybrid-midas}\n")
    config = GenerationConfig.from_yaml(path, ["batch_size=4", "models.vae=madebyollin/sdxl-vae-fp16-fix", "limit=null",
                                               "composite=true"])
    assert (config.batch_size, config.limit, config.composite) == (4, None, True)
    assert config.models == ZeSTConfig(depth="Intel/dpt-hybrid-midas", vae="madebyollin/sdxl-vae-fp16-fix")
    assert apply_overrides({"a": 1}, ["a=2"]) == {"a": 2}


KILLED_JOB = """
import json, sys, threading
from pathlib import Path
from gen.job import run_generation

class CopyThenHold:
    \"\"\"Copies the first `n` batches, then holds the next call until killed, its arrival marked by a file.\"\"\"
    model_ids = {"base": "copy"}
    calls = 0

    def __call__(self, targets, materials, masks=None, seeds=None, resolution=16, **params):
        CopyThenHold.calls += 1
        if CopyThenHold.calls > int(sys.argv[2]):
            Path(sys.argv[3]).touch()
            threading.Event().wait()
        return [t.resize((resolution, resolution)) for t in targets]

run_generation(json.loads(sys.argv[1]), pipeline=CopyThenHold())
"""


@pytest.mark.slow
def test_killed_process_is_resumed_without_duplicates(tmp_path, bronzes, containers):
    """The job copies 2 items and holds the third: once the ledger holds the 2 and the third call is held, the kill
    comes (no sleep decides how far the job got)."""
    config = config_for(tmp_path, containers, bronzes, batch_size=1)
    script, held = tmp_path / "job.py", tmp_path / "held"
    script.write_text(KILLED_JOB)
    ledger_file = Path(config.out) / JOB_FOLDER / "ledger" / "process-000.jsonl"
    process = subprocess.Popen([sys.executable, str(script), json.dumps(config.to_dict()), "2", str(held)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (held.exists() and ledger_file.is_file() and len(ledger_file.read_text().splitlines()) >= 2):
            assert process.poll() is None and time.monotonic() < deadline, "the job ended before it could be killed"
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    done_before = len(Ledger(ledger_file.parent).records())
    assert done_before == 2

    class Copy:  # the killed job's pipeline without the delay
        model_ids = {"base": "copy"}

        def __call__(self, targets, materials, masks=None, seeds=None, resolution=16, **params):
            return [t.resize((resolution, resolution)) for t in targets]

    summary = run_generation(config, pipeline=Copy())
    assert summary["skipped"] == done_before and summary["done"] == 7
    rows = read_manifest(config.out, check_files=True).rows
    assert sorted(r["provenance"]["seed"] for r in rows) == sorted(item_seed(7, i) for i in range(7))
    assert len(list((Path(config.out) / "images").iterdir())) == 7
    assert not temp_files(Path(config.out))


def test_cli_dry_run_prints_the_plan_and_counts(tmp_path, bronzes, containers, capsys):
    from oodforge.commands import generate

    config_file = tmp_path / "gen.yaml"
    config_file.write_text(f"task: transferred_container\ntargets: {containers}\nmaterials: {bronzes}\nout: "
                           f"{tmp_path / 'out'}\n")
    main = generate.main
    main(["--config", str(config_file), "--dry-run", "--show", "2", "limit=3", "seed=9"])
    printed = capsys.readouterr().out
    plan_lines, rest = printed.split("... and 1 more\n")
    assert len(plan_lines.strip().splitlines()) == 2 and "<-" in plan_lines
    assert rest.splitlines() == [  # a readable plan, not raw JSON
        "plan: 3 item(s) of task transferred_container (OOD set transferred_container) from 3 target(s) and 3 "
        "material(s), each material used 1 time(s)",
        "already done: 0; to generate: 3",
        f"dry run: every start-up check passed; nothing written to {tmp_path / 'out'}"]
    assert not (tmp_path / "out").exists()


def test_contact_sheet_shows_labelled_target_material_output_groups(tmp_path):
    from PIL import Image, ImageFont

    from gen.sheet import FRAME, GROUP_GAP, MISSING, PAD, contact_sheet, sheet_font, short_name

    colours = {"t.png": (200, 30, 30), "m.png": (30, 200, 30), "o.png": (30, 30, 200), "wide.png": (240, 200, 0)}
    for name, colour in colours.items():
        Image.new("RGB", (40, 20) if name == "wide.png" else (24, 24), colour).save(tmp_path / name)
    rows = [{"file_name": "o.png", "provenance": {"source_target": str(tmp_path / "t.png"),
                                                  "source_material": str(tmp_path / "m.png")}},
            {"file_name": "o.png", "provenance": {"source_target": str(tmp_path / "gone.png"),
                                                  "source_material": str(tmp_path / "wide.png")}},
            {"file_name": "o.png", "provenance": {"source_target": str(tmp_path / "t.png"),
                                                  "source_material": str(tmp_path / "m.png")}}]
    tile = 100
    sheet = Image.open(contact_sheet(rows, tmp_path, tmp_path / "sheet.png", tile=tile)).convert("RGB")
    font = sheet_font()
    line = round(font.getbbox("Ag")[3]) + PAD
    group = 3 * tile + 2 * PAD
    assert sheet.size == (2 * group + GROUP_GAP + 2 * PAD, PAD + line + 2 * (tile + line + PAD))

    def centre(item: int, column: int) -> tuple[int, int, int]:
        lane, side = divmod(item, 2)
        x = PAD + side * (group + GROUP_GAP) + column * (tile + PAD) + tile // 2
        return sheet.getpixel((x, PAD + line + lane * (tile + line + PAD) + tile // 2))

    assert [centre(0, c) for c in range(3)] == [colours["t.png"], colours["m.png"], colours["o.png"]]
    assert centre(1, 1) == colours["wide.png"]  # a 2:1 image fitted into its tile
    assert sheet.getpixel((PAD + group + GROUP_GAP + 2 * (tile + PAD) + 5, PAD + line + 5)) == colours["o.png"]
    missing = sheet.crop((PAD + group + GROUP_GAP, PAD + line, PAD + group + GROUP_GAP + tile, PAD + line + tile))
    assert max(missing.getcolors(tile * tile))[1] == MISSING  # the removed target: a grey tile...
    assert min(missing.convert("L").getdata()) < 100  # ...saying "unreadable"
    lane_gap = sheet.crop((PAD + group + 1, PAD + line, PAD + group + GROUP_GAP - 1, sheet.height - PAD))
    assert FRAME in {colour for _, colour in lane_gap.getcolors(lane_gap.width * lane_gap.height)}  # the rule
    header = sheet.crop((0, 0, sheet.width, line))
    assert min(header.convert("L").getdata()) < 100  # the column names are drawn
    assert isinstance(font, ImageFont.FreeTypeFont) and font.size >= 16
    long = "a_very_long_container_photo_name_0001234.png"
    short = short_name(long, font, 150)
    assert font.getlength(short) <= 150 and short.startswith("a_very") and short.endswith(".png") and "…" in short
    assert contact_sheet([], tmp_path, tmp_path / "none.png") is None
