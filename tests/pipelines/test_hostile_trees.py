"""Hostile trees: symlink loops, symlinks out of the folder, FIFOs, sockets and devices,
0-byte and text "images", names with control characters, and tables or image lists whose paths leave their folder
through a symlink. Each row asserts what the import (or curation) must do: the walk
ends with every real image once, nothing outside is listed, nothing blocks, every undecodable file is a recorded
failure, and a refusal is one line with exit 2 and no output folder."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.cli import run_main
from pipelines.data import list_images, read_manifest
from pipelines.importers import import_classes, import_field, import_imglist, import_ood_folders, import_openood
from pipelines.io import NotRegularFile, open_regular
from pipelines.walk import UnsafeName, walk_files

ROOT = Path(__file__).resolve().parents[2]
KNOWN = ["Genus0 species0", "Genus1 species1"]
NOVEL = ["Genus2 species2", "Genus3 species3"]


def _png(path: Path, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (6, 7, 3), dtype=np.uint8)).save(path)
    return path


def _script(name: str):
    module = importlib.import_module(f"oodforge.commands.{name}")
    return module


def _one_line(capsys, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path) -> socket.socket:
    """A listening unix socket at `path` (bound in a short temp folder, then moved: socket paths are short)."""
    short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(short / "s"))
    os.rename(short / "s", path)
    short.rmdir()
    return sock


def _classifier(folder: Path, names: list[str]) -> Path:
    folder.mkdir(parents=True)
    (folder / "class_names.json").write_text(json.dumps({"names": names, "label_field": "species", "levels": []}))
    return folder


def _hostile_field_tree(tmp_path: Path) -> tuple[Path, list[socket.socket]]:
    """20 real images in four species folders (two known, two novel), and the attacks: links back to the root and to
    a folder's own parent (loops), a self-referential link, links out to /etc/passwd and to a private image, a FIFO
    and a socket named like images, a hidden folder."""
    root = tmp_path / "field"
    for k, species in enumerate(KNOWN + NOVEL):
        for i in range(5):
            _png(root / species / f"{i}.png", 10 * k + i)
    private = _png(tmp_path / "private" / "secret.jpg", 99)
    (root / NOVEL[0] / "loop").symlink_to(root)                        # the loop: novel folder -> the root
    (root / KNOWN[0] / "up").symlink_to("..")                          # a relative loop
    (root / KNOWN[0] / "again").symlink_to(".")                        # the folder itself
    (root / KNOWN[1] / "self.jpg").symlink_to("self.jpg")              # a link to itself (loops for the kernel)
    (root / KNOWN[1] / "passwd.jpg").symlink_to("/etc/passwd")         # out of the tree, to a system file
    (root / NOVEL[1] / "secret.jpg").symlink_to(private)               # out of the tree, to a real image
    _fifo(root / KNOWN[0] / "pipe.jpg")                                 # blocked file_identity forever
    sockets = [_socket(root / NOVEL[1] / "sock.png")]
    _png(root / NOVEL[1] / ".thumbs" / "t.png", 7)
    return root, sockets


@pytest.mark.slow
def test_a_field_walk_ends_with_each_real_image_once_and_the_labels_stay(tmp_path):
    """20 images stay 20 rows (symlink loops and links out add none), the known-species images keep their labels and
    the summary names each dangling link, link out, FIFO and socket. Run as the command (a subprocess, so that a FIFO
    that blocks fails the test instead of hanging it)."""
    root, sockets = _hostile_field_tree(tmp_path)
    model = _classifier(tmp_path / "clf", KNOWN + ["Other species"])
    out = tmp_path / "out"
    try:
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_folder.py"), str(root), "--field",
                               "--model", str(model), "--out", str(out)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    finally:
        for sock in sockets:
            sock.close()
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_manifest(out, check_files=True).rows
    assert len(rows) == 20 and len({r["file_name"] for r in rows}) == 20
    by_species = {(r["species"], r["role"], r["label"]) for r in rows}
    assert by_species == {(KNOWN[0], "id", 0), (KNOWN[1], "id", 1), (NOVEL[0], "ood", -1), (NOVEL[1], "ood", -1)}
    assert all(r["file_name"].split("/")[0] == r["species"] for r in rows)  # no image listed under another folder
    summary = json.loads((out / "import_summary.json").read_text())
    assert summary["dangling_links"] == 1 and summary["dangling_link_examples"] == [f"{KNOWN[1]}/self.jpg"]
    assert sorted(summary["links_out_examples"]) == sorted([f"{KNOWN[0]}/up/", f"{KNOWN[1]}/passwd.jpg",
                                                             f"{NOVEL[0]}/loop/", f"{NOVEL[1]}/secret.jpg"])
    assert summary["links_inside_examples"] == [f"{KNOWN[0]}/again/"]
    assert sorted(summary["not_regular_examples"]) == [f"{KNOWN[0]}/pipe.jpg (FIFO)", f"{NOVEL[1]}/sock.png (socket)"]
    assert summary["hidden_examples"] == [f"{NOVEL[1]}/.thumbs/"]
    assert "1 dangling symlink(s), 4 symlink(s) leading out of the folder" in done.stdout
    assert json.loads((out / "failures.json").read_text()) == []


def test_no_symlink_out_of_the_folder_is_listed_and_a_bind_like_loop_ends(tmp_path):
    """walk_files itself: links are never followed (in or out); `list_images` (generation, curation) walks alike."""
    root = tmp_path / "tree"
    _png(root / "a" / "x.png", 1)
    _png(root / "a" / "b" / "y.png", 2)
    (root / "a" / "b" / "parent").symlink_to(root / "a")
    (root / "out.png").symlink_to(_png(tmp_path / "elsewhere.png", 3))
    (root / "alias.png").symlink_to(root / "a" / "x.png")
    _fifo(root / "pipe.png")
    files, skipped = walk_files(root, (".png",))
    assert [p.relative_to(root).as_posix() for p in files] == ["a/b/y.png", "a/x.png"]
    assert skipped.links_out == ["out.png"] and sorted(skipped.links_inside) == ["a/b/parent/", "alias.png"]
    assert skipped.not_regular == ["pipe.png (FIFO)"]
    assert [p.relative_to(root).as_posix() for p in list_images(root)] == ["a/b/y.png", "a/x.png"]


def _within(seconds: float, work):
    """Run `work` in a thread and return its result; a reader that blocks (the attack) fails instead of hanging."""
    result: dict = {}

    def target():
        try:
            result["value"] = work()
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            result["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the reader blocked"
    if "error" in result:
        raise result["error"]
    return result["value"]


def test_fifos_and_devices_are_never_read(tmp_path):
    from pipelines.fingerprint import file_identity

    pipe = _fifo(tmp_path / "pipe.jpg")
    for path in (pipe, Path("/dev/zero")):
        assert _within(60, lambda p=path: file_identity(p, "content")) is None
        assert file_identity(path, "stat") is None
        with pytest.raises(NotRegularFile, match="not a regular file"):
            _within(60, lambda p=path: open_regular(p))
    link = tmp_path / "link.jpg"
    link.symlink_to(pipe)
    with pytest.raises(NotRegularFile, match=r"\(FIFO\)"):
        open_regular(link)
    _png(tmp_path / "real.png", 1)
    with open_regular(tmp_path / "real.png") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def _bad_images(folder: Path) -> None:
    """The issue's undecodable "images": a 0-byte file and a text file, named like images."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "notes.png").write_text("hello, not an image\n")


def test_images_that_do_not_decode_are_failures_in_every_importer(tmp_path):
    classes = tmp_path / "classes"
    for k, name in enumerate(["ant", "bee"]):
        for i in range(5):
            _png(classes / name / f"{i}.png", 10 * k + i)
    _bad_images(classes / "ant")
    result = import_classes(classes, tmp_path / "id")
    assert {f["file"] for f in result.failures} == {"ant/empty.jpg", "ant/notes.png"} and len(result.manifest) == 10
    assert ({f["file"] for f in json.loads((tmp_path / "id" / "failures.json").read_text())}
            == {"ant/empty.jpg", "ant/notes.png"})

    ood = import_ood_folders(classes, tmp_path / "ood")
    assert len(ood.manifest) == 10 and len(ood.failures) == 2

    field = import_field(classes, tmp_path / "field", model=_classifier(tmp_path / "clf", ["ant"]))
    assert len(field.manifest) == 10 and {f["reason"] for f in field.failures} >= {"empty file (0 bytes)"}

    plain = import_openood(None, tmp_path / "easy", folders={"noise": classes / "ant"})[0]
    assert len(plain.manifest) == 5 and sorted(f["file"] for f in plain.failures) == ["empty.jpg", "notes.png"]
    assert json.loads((tmp_path / "easy" / "import_summary.json").read_text())[0]["unreadable"] == 2

    listing = tmp_path / "list.txt"
    listing.write_text("ant/0.png 0\nant/empty.jpg 0\nant/notes.png 0\n")
    listed = import_imglist(listing, tmp_path / "listed", ood_set="x", image_root=classes)
    assert [r["file_name"] for r in listed.manifest.rows] == ["ant/0.png"] and len(listed.failures) == 2
    assert len(json.loads((tmp_path / "listed" / "failures.json").read_text())) == 2


def test_table_and_list_paths_through_a_symlink_out_of_the_folder_are_refused(tmp_path, capsys):
    root = tmp_path / "photos"
    for i, name in enumerate(["ant", "bee"]):
        for j in range(3):
            _png(root / name / f"{j}.png", 10 * i + j)
    _png(tmp_path / "private" / "secret.png", 5)
    (root / "door").symlink_to(tmp_path / "private")
    table = tmp_path / "rows.csv"
    table.write_text("file_name,label\n" + "".join(f"{n}/{j}.png,{n}\n" for n in ["ant", "bee"] for j in range(3))
                     + "door/secret.png,ant\n")
    cli = _script("import_folder")
    err = _one_line(capsys, run_main(cli.main, [str(root), "--out", str(tmp_path / "o1"), "--table", str(table)]))
    assert f"{table}, line 8: image path 'door/secret.png' leads outside the image folder" in err
    assert not (tmp_path / "o1").exists()

    listing = tmp_path / "list.txt"
    listing.write_text("ant/0.png 0\ndoor/secret.png 0\n")
    openood = _script("import_openood")
    err = _one_line(capsys, run_main(openood.main, ["--out", str(tmp_path / "o2"), "--list", f"x={listing}",
                                                    "--image-root", str(root)]))
    assert "image path 'door/secret.png' leads outside the image folder" in err
    assert not (tmp_path / "o2" / "x").exists()


def test_names_with_control_characters_are_refused_in_one_line(tmp_path, capsys):
    """`Genus0 species0\\n` would merge into the known class `Genus0 species0`. Refused, not kept distinct: kept, it
    would be a novel species whose images are the known one's, and its name would break every line-based output."""
    root = tmp_path / "field"
    for k, species in enumerate([*KNOWN, *NOVEL, KNOWN[0] + "\n"]):
        for i in range(2):
            _png(root / species / f"{i}.png", 10 * k + i)
    model = _classifier(tmp_path / "clf", KNOWN)
    cli = _script("import_folder")
    out = tmp_path / "out"
    err = _one_line(capsys, run_main(cli.main, [str(root), "--field", "--model", str(model), "--out", str(out)]))
    assert ascii(str(root / (KNOWN[0] + "\n"))) in err and "a control character (U+000A)" in err
    assert not out.exists()

    classes = tmp_path / "classes"
    for name in ["ant", "bee"]:
        _png(classes / name / "0.png", 1)
    _png(classes / "bee" / "tab\there.png", 2)
    with pytest.raises(UnsafeName, match=r"U\+0009"):
        import_classes(classes, tmp_path / "id")
    table = tmp_path / "rows.csv"
    table.write_text('file_name,label\nant/0.png,"ant\r"\nbee/0.png,bee\n')
    err = _one_line(capsys, run_main(cli.main, [str(classes), "--out", str(tmp_path / "t"), "--table", str(table)]))
    assert f"{table}, line 2: label 'ant\\r'" in err and "U+000D" in err
    assert not (tmp_path / "t").exists() and not (tmp_path / "id").exists()


needs_wordnet = pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").is_file(),
                                   reason="WordNet 3.0 is not installed (apt-get install wordnet-base)")


@needs_wordnet
def test_curate_containers_without_the_filter_lists_only_decodable_regular_images(tmp_path, capsys):
    """The issue: without --filter, 0-byte, text and symlinked-to-/etc/passwd "images" went into the manifest with
    nothing recorded."""
    tree = tmp_path / "in21k"
    cup, jar = tree / "n03147509", tree / "n03593526"
    for i in range(2):
        _png(cup / f"good_{i}.JPEG", i)
    _bad_images(cup)
    (cup / "passwd.JPEG").symlink_to("/etc/passwd")
    _fifo(cup / "pipe.JPEG")
    _png(tmp_path / "elsewhere" / "n03593526" / "jar.JPEG", 5)
    jar.symlink_to(tmp_path / "elsewhere" / "n03593526")  # a whole wnid folder linked in from outside
    cli = _script("curate_containers")
    out = tmp_path / "containers"
    assert run_main(cli.main,
                    ["--imagenet21k", str(tree), "--out", str(out), "--categories", "n03147509,n03593526"]) == 0
    rows = read_manifest(out, check_files=True).rows
    assert sorted(r["file_name"] for r in rows) == ["n03147509/good_0.JPEG", "n03147509/good_1.JPEG"]
    with open(out / "dropped.csv") as fh:
        dropped = {row["file_name"]: row["reason"] for row in csv.DictReader(fh)}
    assert set(dropped) == {"n03147509/empty.jpg", "n03147509/notes.png"}
    assert all(reason.startswith("unreadable: ") for reason in dropped.values())
    record = json.loads((out / "curation.json").read_text())
    assert sorted(record["skipped"]["links_out_examples"]) == ["n03147509/passwd.JPEG", "n03593526/"]
    assert record["skipped"]["links_inside"] == 0 and record["skipped"]["not_regular"] == 1
    assert record["not_in_tree"] == ["n03593526"]  # the linked-in folder is not taken for a category
    capsys.readouterr()
