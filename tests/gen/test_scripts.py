"""`oodforge generate` and `oodforge make-splits` on pipelines.cli: main(argv) returns a status; input errors are one
line and status 2."""
from __future__ import annotations

import importlib

from pipelines.cli import run_main


def script_main(name: str):
    """`main` of the command `name` names (`generate.py`: oodforge.commands.generate)."""
    return importlib.import_module(f"oodforge.commands.{name.removesuffix('.py')}").main


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_generate_config_errors_are_one_line_and_status_2(tmp_path, capsys):
    main = script_main("generate.py")
    config = tmp_path / "gen.yaml"
    config.write_text(f"task: custom\ntargets: {tmp_path}\nmaterials: {tmp_path}\nout: {tmp_path / 'out'}\nstepz: 3\n")
    assert run_main(main, ["--config", str(config), "--dry-run"]) == 2
    assert one_line_error(capsys).startswith(f"error: {config}: stepz: unknown key (allowed: attention, ")
    config.write_text("task: custom\ntargets: [unclosed\n")
    assert run_main(main, ["--config", str(config), "--dry-run"]) == 2
    assert "not valid YAML" in one_line_error(capsys)
    assert run_main(main, ["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "no such config file" in one_line_error(capsys)


def test_generate_refuses_changed_inputs_in_one_line(tmp_path, capsys, bronzes, image_writer, fake_zest):
    targets = tmp_path / "targets"
    image_writer(targets, ["a.png", "b.png"], seed=1)
    config = tmp_path / "gen.yaml"
    config.write_text(f"task: transferred_container\ntargets: {targets}\nmaterials: {bronzes}\nout: "
                      f"{tmp_path / 'out'}\n"
                      "resolution: 16\nmask_method: opencv\n")
    main = script_main("generate.py")
    from gen.job import GenerationConfig, run_generation

    run_generation(GenerationConfig.from_yaml(config), pipeline=fake_zest())  # a job with finished items
    image_writer(targets, ["c.png"], seed=2)
    capsys.readouterr()
    assert run_main(main, ["--config", str(config), "--dry-run"]) == 2
    assert "targets added: c.png" in one_line_error(capsys)
    assert run_main(main, ["--config", str(config), "--dry-run", "plan_change=extend"]) == 0
    printed = capsys.readouterr().out
    assert "plan: 3 item(s) of task transferred_container" in printed and "(1 added to the stored plan)" in printed
    assert run_main(main, ["--config", str(config), "--dry-run", "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err  # --debug: the traceback


def test_make_splits_argument_errors_are_one_line_and_status_2(tmp_path, capsys):
    main = script_main("make_splits.py")
    assert run_main(main, ["--synthetic", "100", "--out", str(tmp_path), "--box", "mars=1,2,3"]) == 2
    assert "--box mars: a box is 'lat_min,lat_max,lon_min,lon_max'" in one_line_error(capsys)
    assert run_main(main, ["--synthetic", "100", "--out", str(tmp_path), "--box", "mars"]) == 2
    assert "--box takes NAME=VALUE" in one_line_error(capsys)
    assert run_main(main, ["--occurrences", str(tmp_path / "occ.csv"), "--out", str(tmp_path)]) == 2
    assert "--occurrences needs --id-species and --image-root" in one_line_error(capsys)
    table = tmp_path / "occ.csv"
    table.write_text("species,lat\nsp1,1\n")
    ids = tmp_path / "ids.csv"
    ids.write_text("region,species\nne-america,sp1\n")
    assert run_main(main, ["--occurrences", str(table), "--id-species", str(ids), "--image-root", str(tmp_path),
                           "--out", str(tmp_path / "out")]) == 2
    assert "occurrence table: missing column(s) ['genus', 'family', 'lon', 'file_name']" in one_line_error(capsys)
