"""Malformed make_splits invocations: each is refused in one line naming the option, exit status 2, before a table is
read or a file written."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from oodforge.commands import make_splits
from pipelines.cli import run_main

CASES = [  # (extra arguments, text the one line must hold)
    (["--synthetic", "-5"], "--synthetic: must be >= 1, got -5"),
    (["--synthetic", "abc"], "--synthetic: must be an integer, got str 'abc'"),
    (["--synthetic", "50", "--id-fractions", "0.8", "0.3", "0.2"],
     "--id-fractions: three fractions TRAIN VAL TEST in [0, 1] summing to 1, got 0.8 0.3 0.2 (sum 1.3)"),
    (["--synthetic", "50", "--pad", "-1", "3"], "--pad: must be >= 0, got -1.0"),
    (["--synthetic", "50", "--pad", "1", "east"], "--pad: must be a number, got str 'east'"),
    (["--synthetic", "50", "--min-images", "0"], "--min-images: must be >= 1, got 0"),
    (["--synthetic", "50", "split.aux_species_by_region.c-america=-2"],
     "split.aux_species_by_region.c-america: must be >= 1 or null"),
    (["--synthetic", "50", "--box", "mars=10,5,0,1"], "--box mars: a box needs lat_min < lat_max"),
    (["--synthetic", "50", "--taxon-filter", "moth"],
     "--taxon-filter: must be one of 'moths', got str 'moth' (did you mean 'moths'?)"),
    (["--synthetic", "50", "--exclude", "Noctuidae"], "--exclude: a rule is RANK=VALUE[,VALUE...]"),
    (["--synthetic", "50", "--seed", "1.5"], "--seed: must be an integer, got float 1.5"),
    ([], "give one of --occurrences and --synthetic"),
]


@pytest.mark.parametrize("extra, message", CASES, ids=[" ".join(c[0]) or "no source" for c in CASES])
def test_malformed_invocation_is_one_line_naming_the_option(extra, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_main(make_splits.main, [*extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert message in err, err
    assert not out.exists()  # refused before any work


def test_a_latitude_that_is_not_a_number_is_refused_naming_the_row(tmp_path, capsys):
    """'abc' in lat is a typo, not a blank: refused naming the file, the row and the value (blank lat is counted as
    'no coordinates' in summary.md)."""
    (tmp_path / "occ.csv").write_text("species,genus,family,lat,lon,file_name\na b,a,f,50,1,x.jpg\na "
                                      "b,a,f,abc,2,y.jpg\n")
    (tmp_path / "ids.csv").write_text("region,species\nne-america,a b\n")
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--id-species", str(tmp_path / "ids.csv"), "--image-root",
            str(tmp_path), "--out", str(tmp_path / "out")]
    assert run_main(make_splits.main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert "occ.csv: row file_name=y.jpg: lat 'abc' is not a latitude" in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_dry_run_prints_what_the_run_writes_and_writes_nothing(tmp_path, capsys):
    main = make_splits.main
    argv = ["--synthetic", "3000", "--aux-species", "0", "--out", str(tmp_path / "out")]
    assert run_main(main, [*argv, "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert not (tmp_path / "out").exists()
    assert run_main(main, argv) == 0
    run = capsys.readouterr().out
    written = sorted(p.parent.name for p in (tmp_path / "out").glob("*/metadata.jsonl"))
    assert (written and [f"would write {tmp_path / 'out' / r}/metadata.jsonl ({r})" in dry for r in written]
            == [True] * len(written))
    def table(text: str) -> str:  # the summary table and drop lines
        return text.split("\nwould write")[0].split("\nwrote")[0]

    assert table(dry) == table(run) and "dry run: every check passed" in dry


@pytest.mark.parametrize("dry_run", [False, True])
def test_dry_run_refuses_where_the_run_refuses(tmp_path, capsys, dry_run):
    (tmp_path / "occ.csv").write_text("species,genus,family,lat,lon,file_name\n"
                                      + "".join(f"a b,a,f,45,-75,{i}.jpg\n" for i in range(20)))
    (tmp_path / "ids.csv").write_text("region,species\nne-america,a b\nne-america,c d\n")
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--id-species", str(tmp_path / "ids.csv"), "--image-root",
            str(tmp_path), "--out", str(tmp_path / "out"), *(["--dry-run"] if dry_run else [])]
    assert run_main(make_splits.main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "c d" in err and "allow-missing-id-species" in err, err
    assert not (tmp_path / "out").exists()


def _table(tmp_path: Path, names: list[str]) -> list[str]:
    """An occurrence table of one NE-American species whose rows have `names` as file_name, and its ID table."""
    rows = "".join(f"a b,a,f,50,-70,{name}\n" for name in names)
    (tmp_path / "occ.csv").write_text("species,genus,family,lat,lon,file_name\n" + rows)
    (tmp_path / "ids.csv").write_text("region,species\nne-america,a b\n")
    return ["--occurrences", str(tmp_path / "occ.csv"), "--id-species", str(tmp_path / "ids.csv"),
            "--image-root", str(tmp_path / "images"), "--out", str(tmp_path / "out")]


def _images(tmp_path: Path, count: int) -> list[str]:
    names = [f"img/{i}.jpg" for i in range(count)]
    for name in names:
        (tmp_path / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "images" / name).write_bytes(b"jpeg")
    return names


def _outside(tmp_path: Path) -> Path:
    secret = tmp_path / "elsewhere" / "private.jpg"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_bytes(b"private")
    return secret


PATH_CASES = {  # name -> (make the tree and return the extra file names, extra flags, text of the one line)
    "dot-dot name": (lambda t: ["../elsewhere/private.jpg"], [], "file_name '../elsewhere/private.jpg' leads outside"),
    "dot-dot name, files checked": (lambda t: ["img/../../elsewhere/private.jpg"], ["--check-files"],
                                    "leads outside the image root"),
    "absolute name": (lambda t: [str(_outside(t))], ["--check-files"], "leads outside the image root"),
    "symlinked image": (lambda t: (t / "images" / "img" / "link.jpg").symlink_to(_outside(t)) or ["img/link.jpg"],
                        ["--check-files"], "file_name 'img/link.jpg' resolves outside the image root"),
    "symlinked folder": (lambda t: (t / "images" / "out").symlink_to(_outside(t).parent, target_is_directory=True)
                         or ["out/private.jpg"], ["--check-files"], "resolves outside the image root"),
}


@pytest.mark.parametrize("case", sorted(PATH_CASES))
def test_a_file_name_that_leaves_the_image_root_is_one_line(case, tmp_path, capsys):
    """A path from the table is checked before any file is touched, and on disk after its symlinks are resolved."""
    make, flags, message = PATH_CASES[case]
    names = _images(tmp_path, 10)
    argv = _table(tmp_path, names + make(tmp_path)) + flags
    for dry in ([], ["--dry-run"]):
        assert run_main(make_splits.main, argv + dry) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and message in err and "occ.csv: row" in err, err
        assert not (tmp_path / "out").exists()


def test_fifos_blanks_and_missing_images_are_counted_never_opened(tmp_path, capsys):
    names = _images(tmp_path, 10)
    os.mkfifo(tmp_path / "images" / "img" / "pipe.jpg")  # opening it would block forever
    (tmp_path / "images" / "img" / "folder.jpg").mkdir()
    argv = _table(tmp_path, names + ["img/pipe.jpg", "img/folder.jpg", "img/never.jpg", ""]) + ["--check-files",
                                                                                               "--min-images", "1"]
    assert run_main(make_splits.main, argv) == 0
    out = capsys.readouterr().out
    assert "rows dropped: no file name 1, missing file 3" in out, out
    record = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert record["dropped"] == {"no file name": 1, "missing file": 3}
    rows = [json.loads(line) for line in open(tmp_path / "out" / "ne-america" / "metadata.jsonl")]
    assert sorted(r["file_name"] for r in rows) == sorted(names)


def test_a_non_target_table_and_a_region_name_cannot_leave_their_roots(tmp_path, capsys):
    names = _images(tmp_path, 10)
    argv = _table(tmp_path, names)
    (tmp_path / "beetles.csv").write_text("file_name\nbeetle/1.jpg\n../../x.jpg\n")
    main = make_splits.main
    assert run_main(main, argv + ["--non-target", str(tmp_path / "beetles.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert "a file_name that leads outside the image root" in err and "'../../x.jpg'" in err and "\n" not in err, err
    assert run_main(main, argv + ["--box", "../ne=42,63,-80,-57"]) == 2
    assert "--box: region name '../ne' must be letters" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_table_limits_are_flags_and_the_dry_run_tells_the_cost(tmp_path, capsys):
    names = _images(tmp_path, 30)
    argv = _table(tmp_path, names)
    main = make_splits.main
    assert run_main(main, argv + ["--max-rows", "20"]) == 2
    assert "occ.csv: more than max_rows=20 rows (TableLimits)" in capsys.readouterr().err
    assert run_main(main, argv + ["--max-line-bytes", "2KiB"]) == 2
    assert "--max-line-bytes: must be >= 4096 and <= 1073741824, got 2048" in capsys.readouterr().err
    assert run_main(main, argv + ["--max-line-bytes", "4 KiB", "--max-kept-bytes", "1GiB", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "estimate: read" in dry and "(30 rows," in dry and "measured by this dry run on your input" in dry, dry
    assert "estimate: disk" in dry and not (tmp_path / "out").exists()
    assert run_main(main, argv) == 0
    written = (tmp_path / "out" / "ne-america" / "metadata.jsonl").stat().st_size
    assert f"estimate: disk {written / 2**10:,.0f} KiB" in dry, (dry, written)


def test_the_estimate_adds_the_writing_at_the_benchmarks_rate(tmp_path):
    from gen.insects.cost import estimate, write_rate

    (tmp_path / "splits.json").write_text(json.dumps({"disk_write_mib_per_s": 100.0}))
    timings = {"read": 2.0, "rows": 1000, "build": 1.0, "manifests": 1.0, "manifest_rows": 800, "bytes": 300 * 2**20}
    lines = estimate(timings, write_rate(tmp_path / "splits.json"))
    assert (f"writing 300.0 MiB at 100 MiB/s ({tmp_path / 'splits.json'}) takes 3.0 s; the run takes about 7.0 s"
            in lines[1])
    assert "rate not known here" in estimate(timings, write_rate(tmp_path / "none.json"))[1]
