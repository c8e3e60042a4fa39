"""Malformed make_splits invocations: each is refused in one line naming the option, exit status 2, before a table is
read or a file written (issue 27's make_splits cases and their neighbours)."""
from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from pipelines.cli import run_main

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_splits.py"
CASES = [  # (extra arguments, text the one line must hold)
    (["--synthetic", "-5"], "--synthetic: must be >= 1, got -5"),
    (["--synthetic", "abc"], "--synthetic: must be an integer, got str 'abc'"),
    (["--synthetic", "50", "--id-fractions", "0.8", "0.3", "0.2"], "--id-fractions: three fractions TRAIN VAL TEST in [0, 1] summing to 1, got 0.8 0.3 0.2 (sum 1.3)"),
    (["--synthetic", "50", "--pad", "-1", "3"], "--pad: must be >= 0, got -1.0"),
    (["--synthetic", "50", "--pad", "1", "east"], "--pad: must be a number, got str 'east'"),
    (["--synthetic", "50", "--min-images", "0"], "--min-images: must be >= 1, got 0"),
    (["--synthetic", "50", "--aux-species-c-america", "-2"], "--aux-species-c-america c-america: must be >= 1 or null"),
    (["--synthetic", "50", "--box", "mars=10,5,0,1"], "--box mars: a box needs lat_min < lat_max"),
    (["--synthetic", "50", "--taxon-filter", "moth"], "--taxon-filter: must be one of 'moths', got str 'moth' (did you mean 'moths'?)"),
    (["--synthetic", "50", "--exclude", "Noctuidae"], "--exclude: a rule is RANK=VALUE[,VALUE...]"),
    (["--synthetic", "50", "--seed", "1.5"], "--seed: must be an integer, got float 1.5"),
    ([], "give one of --occurrences and --synthetic"),
]


@pytest.mark.parametrize("extra, message", CASES, ids=[" ".join(c[0]) or "no source" for c in CASES])
def test_malformed_invocation_is_one_line_naming_the_option(extra, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_main(runpy.run_path(str(SCRIPT))["main"], [*extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert message in err, err
    assert not out.exists()  # refused before any work


def test_a_latitude_that_is_not_a_number_is_refused_naming_the_row(tmp_path, capsys):
    """'abc' in lat is a typo, not a blank: refused naming the file, the row and the value (blank lat is counted as
    'no coordinates' in summary.md)."""
    (tmp_path / "occ.csv").write_text("species,genus,family,lat,lon,file_name\na b,a,f,50,1,x.jpg\na b,a,f,abc,2,y.jpg\n")
    (tmp_path / "ids.csv").write_text("region,species\nne-america,a b\n")
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--id-species", str(tmp_path / "ids.csv"), "--image-root",
            str(tmp_path), "--out", str(tmp_path / "out")]
    assert run_main(runpy.run_path(str(SCRIPT))["main"], argv) == 2
    err = capsys.readouterr().err.strip()
    assert "occ.csv: row file_name=y.jpg: lat 'abc' is not a latitude" in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_dry_run_prints_what_the_run_writes_and_writes_nothing(tmp_path, capsys):
    main = runpy.run_path(str(SCRIPT))["main"]
    argv = ["--synthetic", "3000", "--aux-species", "0", "--out", str(tmp_path / "out")]
    assert run_main(main, [*argv, "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert not (tmp_path / "out").exists()
    assert run_main(main, argv) == 0
    run = capsys.readouterr().out
    written = sorted(p.parent.name for p in (tmp_path / "out").glob("*/metadata.jsonl"))
    assert written and [f"would write {tmp_path / 'out' / r}/metadata.jsonl ({r})" in dry for r in written] == [True] * len(written)
    table = lambda text: text.split("\nwould write")[0].split("\nwrote")[0]  # the summary table and drop lines
    assert table(dry) == table(run) and "dry run: every check passed" in dry


@pytest.mark.parametrize("dry_run", [False, True])
def test_dry_run_refuses_where_the_run_refuses(tmp_path, capsys, dry_run):
    (tmp_path / "occ.csv").write_text("species,genus,family,lat,lon,file_name\n"
                                      + "".join(f"a b,a,f,45,-75,{i}.jpg\n" for i in range(20)))
    (tmp_path / "ids.csv").write_text("region,species\nne-america,a b\nne-america,c d\n")
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--id-species", str(tmp_path / "ids.csv"), "--image-root",
            str(tmp_path), "--out", str(tmp_path / "out"), *(["--dry-run"] if dry_run else [])]
    assert run_main(runpy.run_path(str(SCRIPT))["main"], argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "c d" in err and "allow-missing-id-species" in err, err
    assert not (tmp_path / "out").exists()
