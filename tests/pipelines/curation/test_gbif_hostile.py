"""Hostile archives and tables, each refused in one line naming the file and what is wrong:
locations and symlinks that lead out of the archive, bombs (a 1 GiB field in a 1 MB zip, duplicate core ids,
too many rows), field indexes beyond the columns, malformed descriptors. Through make_splits each is exit 2 with
nothing written; the bombs also stay within a stated peak RSS."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.gbif import (
    DWC,
    GBIF,
    GBIF_CORE,
    GBIF_MEDIA,
    OCC_TERMS,
    archive_xml,
    bomb_zip,
    gbif_meta,
    section,
    small_gbif,
    write_archive,
)

from oodforge.commands import make_splits
from pipelines.cli import run_main
from pipelines.curation.gbif import TableError, TableLimits, read_occurrences, read_table

ROOT = Path(__file__).resolve().parents[3]
SECRET = "s3cret-field\tvalue\n"


def _secret(tmp_path: Path) -> Path:
    """A file outside every archive that nothing may read (its text must never reach a message or a row)."""
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SECRET * 3)
    return path


def _gbif_files(**meta_kw) -> dict[str, str]:
    occ, media = small_gbif(3)
    return {"meta.xml": gbif_meta(**meta_kw), "occurrence.txt": occ, "multimedia.txt": media}


def location(where: str) -> callable:
    def build(tmp_path: Path, zipped: bool) -> Path:
        secret = _secret(tmp_path)
        target = where.format(secret=secret, rel=os.path.relpath(secret, tmp_path / "a"))
        return write_archive(tmp_path / "a", _gbif_files(location=target), zipped)
    return build


def symlinked(member: str) -> callable:
    def build(tmp_path: Path, zipped: bool) -> Path:
        secret = _secret(tmp_path)
        path = write_archive(tmp_path / "a", _gbif_files(), zipped=False)
        (path / member).unlink()
        (path / member).symlink_to(secret)
        return path
    return build


def symlinked_folder(tmp_path: Path, zipped: bool) -> Path:
    secret = _secret(tmp_path)
    path = write_archive(tmp_path / "a", {**_gbif_files(location="data/occurrence.txt")}, zipped=False)
    (path / "data").symlink_to(secret.parent, target_is_directory=True)
    (secret.parent / "occurrence.txt").write_text(small_gbif(3)[0])
    return path


def fifo(tmp_path: Path, zipped: bool) -> Path:
    path = write_archive(tmp_path / "a", _gbif_files(), zipped=False)
    (path / "occurrence.txt").unlink()
    os.mkfifo(path / "occurrence.txt")
    return path


def symlink_loop(tmp_path: Path, zipped: bool) -> Path:
    path = write_archive(tmp_path / "a", _gbif_files(location="loop/occurrence.txt"), zipped=False)
    (path / "loop").symlink_to(path / "loop")
    return path


def files(**replace: str | bytes) -> callable:
    def build(tmp_path: Path, zipped: bool) -> Path:
        return write_archive(tmp_path / "a", {**_gbif_files(), **replace}, zipped)
    return build


def meta(**meta_kw) -> callable:
    return files(**{"meta.xml": gbif_meta(**meta_kw)})


def duplicate_ids(tmp_path: Path, zipped: bool) -> Path:
    """Every core row and every image with one id (a merge made rows x images rows: 4.8 GB, then a MergeError)."""
    occ, media = small_gbif(1)
    occ_head, occ_row = occ.splitlines()
    media_head, media_row = media.splitlines()
    return write_archive(tmp_path / "a",
                         {"meta.xml": gbif_meta(), "occurrence.txt": occ_head + "\n" + (occ_row + "\n") * 30_000,
                                          "multimedia.txt": media_head + "\n" + (media_row + "\n") * 30_000}, zipped)


def field_bomb(tmp_path: Path, zipped: bool) -> Path:
    """A 1 MB zip whose occurrence.txt holds a 1 GiB field (it reached 5.5 GB RSS with rc 0)."""
    occ, media = small_gbif(3)
    return bomb_zip(tmp_path / "bomb.zip", {"meta.xml": gbif_meta(), "multimedia.txt": media}, "occurrence.txt",
                    occ.rstrip("\n").encode(), b"a" * 2**20, 1024, b"\n")


SPECIES = OCC_TERMS.index(GBIF + "species")
ATTACKS = {  # name -> (builder, zip and folder alike?, text of the one line)
    "location /etc/passwd": (location("/etc/passwd"), True,
                             "meta.xml names '/etc/passwd', which lies outside the archive"),
    "location absolute secret": (location("{secret}"), True, "which lies outside the archive"),
    "location ../file": (location("{rel}"), True, "which lies outside the archive"),
    "location url": (location("http://127.0.0.1:9/occurrence.txt"), True, "not a file of the archive"),
    "symlinked data file": (symlinked("occurrence.txt"), False, "occurrence.txt leads outside the archive folder"),
    "symlinked meta.xml": (symlinked("meta.xml"), False, "meta.xml leads outside the archive folder"),
    "symlinked folder": (symlinked_folder, False, "data/occurrence.txt leads outside the archive folder"),
    "fifo data file": (fifo, False, "occurrence.txt: not a regular file"),
    "symlink loop": (symlink_loop, False, "loop/occurrence.txt"),
    "1 GiB field": (field_bomb, None, "line 4 is longer than max_line_bytes=16 MiB (TableLimits)"),
    "duplicate core ids": (duplicate_ids, True, "core id '100' appears on 30000 rows"),
    "index beyond the columns": (meta(core_fields=[*GBIF_CORE, (40, DWC + "recordedBy")]), True,
                                 "column 40 (recordedBy) is beyond the file's 23 columns"),
    "term declared twice": (meta(core_fields=[*GBIF_CORE, (4, GBIF + "species")]), True,
                            "meta.xml declares species twice"),
    "ragged row": (files(**{"occurrence.txt": small_gbif(3)[0] + "104\tonly two\n"}), True,
                   "occurrence.txt: line 5 has 2 fields, the file's first line 23"),
    "not utf-8": (files(**{"occurrence.txt": small_gbif(3)[0].encode() + b"105\t\xff\xfe" + b"\tx" * 21 + b"\n"}), True,
                  "not valid UTF-8 text"),
    "unknown encoding": (meta(attrs={"encoding": "klingon-8"}), True, "unknown text encoding 'klingon-8'"),
    "two-character separator": (meta(attrs={"fieldsTerminatedBy": "||"}), True, "fields separated by '||'"),
    "odd line end": (meta(attrs={"linesTerminatedBy": ";"}), True, "linesTerminatedBy ';'"),
    "header lines not a number": (meta(attrs={"ignoreHeaderLines": "one"}), True, "ignoreHeaderLines 'one'"),
    "index not a number": (meta(core_fields=[*GBIF_CORE[:-1], ("x", DWC + "locality")]), True,
                           "locality has index 'x', not a column number"),
    "no core": (files(**{"meta.xml": archive_xml(section("extension", fields=GBIF_MEDIA))}), True,
                "meta.xml has 0 <core> elements, not one"),
    "media without core id": (meta(id_index=None), True, "<core> has no <id index=...>"),
    "missing member": (meta(location="nothere.txt"), True,
                       "meta.xml names nothere.txt, which the archive does not hold"),
    "not xml": (files(**{"meta.xml": "<archive><core>"}), True, "meta.xml is not XML"),
    "billion laughs": (files(**{"meta.xml": '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY a "aaaa"><!ENTITY b '
                                '"&a;&a;&a;">]>'
                                            "<archive><core>&b;</core></archive>"}), True,
                                            "declares a DTD or entities"),
    "external entity": (files(**{"meta.xml": '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x SYSTEM '
                                 '"file:///etc/passwd">]>'
                                             "<archive>&x;</archive>"}), True, "declares a DTD or entities"),
    "huge meta.xml": (files(**{"meta.xml": gbif_meta() + "<!--" + "x" * (5 << 20) + "-->"}), True,
                      "more than a descriptor ever needs"),
}


@pytest.fixture(params=sorted(ATTACKS), ids=sorted(ATTACKS))
def attack(request, tmp_path):
    build, both, message = ATTACKS[request.param]
    if build is fifo and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    kinds = [True, False] if both else [False] if both is False else [True]
    return [build(tmp_path / ("zip" if z else "dir"), z) for z in kinds], message


def test_each_attack_is_one_line_naming_the_file(attack):
    paths, message = attack
    for path in paths:
        with pytest.raises(TableError) as caught:
            read_occurrences(path)
        text = str(caught.value)
        assert message in text and "\n" not in text and "s3cret" not in text, text
        assert text.startswith(str(path)), text


@pytest.mark.parametrize("name", ["location /etc/passwd", "symlinked data file", "duplicate core ids", "fifo data file",
                                  "index beyond the columns", "ragged row"])
def test_make_splits_refuses_each_in_one_line_and_writes_nothing(name, tmp_path, capsys):
    build, both, message = ATTACKS[name]
    path = build(tmp_path / "in", both is not False)
    (tmp_path / "ids.csv").write_text("region,species\nne-america,Idmoth sp0\n")
    out = tmp_path / "out"
    argv = ["--occurrences", str(path), "--id-species", str(tmp_path / "ids.csv"), "--image-root", str(tmp_path),
            "--out", str(out)]
    assert run_main(make_splits.main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err and "Traceback" not in err, err
    assert not out.exists()


def test_the_limits_are_keys_each_named_in_its_line(tmp_path):
    path = write_archive(tmp_path / "a", _gbif_files())
    for limits, text in ((TableLimits(max_rows=2), "more than max_rows=2 rows"),
                         (TableLimits(max_member_bytes=100), "over max_member_bytes=100 bytes"),
                         (TableLimits(max_kept_bytes=64), "the columns read hold more than max_kept_bytes=64 bytes"),
                         (TableLimits(max_line_bytes=2**12), None)):
        if text is None:  # GBIF's lines are short: a 4 KiB line cap reads them
            assert len(read_occurrences(path, limits)) == 3
            continue
        with pytest.raises(TableError, match=text):
            read_occurrences(path, limits)
    table = tmp_path / "t.csv"
    table.write_text("species,lat\n" + "a b,1\n" * 5)
    with pytest.raises(TableError, match=r"t.csv: more than max_rows=4 rows"):
        read_table(table, TableLimits(max_rows=4))
    with pytest.raises(TableError, match="header names column 'x' twice"):
        (tmp_path / "d.csv").write_text("x,x\n1,2\n")
        read_table(tmp_path / "d.csv")


PEAK = """
import sys
from pathlib import Path
from pipelines.curation.gbif import TableError, read_occurrences
def kib(field):
    return next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field))
Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here (ru_maxrss would count pytest's own peak)
base = kib("VmRSS:")
try:
    read_occurrences(sys.argv[1])
except TableError as err:
    print(err)
print((kib("VmHWM:") - base) // 1024)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS read from Linux's /proc")
@pytest.mark.parametrize("name, bound_mib", [("1 GiB field", 150), ("duplicate core ids", 150)])
def test_bombs_stay_within_a_stated_peak(name, bound_mib, tmp_path):
    """The peak RSS reading adds to its imports, in a fresh process (before: 5.5 GB and rc 0 for the field, 4.8 GB
    then a MergeError traceback for the ids)."""
    build, _, message = ATTACKS[name]
    path = build(tmp_path / "in", True)
    run = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    error, peak = run.stdout.strip().rsplit("\n", 1)
    assert run.returncode == 0 and message in error, run.stdout + run.stderr
    assert int(peak) < bound_mib, f"reading added {peak} MiB to the peak RSS"
