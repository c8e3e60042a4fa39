"""Importing the easy OOD sets from a generated fake OpenOOD data folder and from plain folders."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pipelines.data import load_image, read_manifest
from pipelines.importers import EASY_SETS, ImportListError, import_folder, import_imglist, import_openood, read_imglist

ROOT = Path(__file__).resolve().parents[2]


def _png(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(path)


def fake_openood(root: Path) -> dict[str, list[str]]:
    """OpenOOD's layout: lists under benchmark_imglist/imagenet (OpenOOD's own file names), texture images under
    images_classic, the others under images_largescale; returns the listed paths per set."""
    layout = {"species": ("test_species.txt", "images_largescale", "species_sub/{i}.jpg", 4),
              "inaturalist": ("test_inaturalist.txt", "images_largescale", "inaturalist/images/{i}.jpg", 3),
              "texture": ("test_textures.txt", "images_classic", "texture/banded/banded {i}.jpg", 2),
              "openimage_o": ("test_openimage_o.txt", "images_largescale", "openimage_o/images/{i}.jpg", 5)}
    listed = {}
    for k, (list_name, data_dir, pattern, n) in enumerate(layout.values()):
        name = list(layout)[k]
        paths = [pattern.format(i=i).replace(" ", "_") for i in range(n)]
        for i, p in enumerate(paths):
            _png(root / data_dir / p, seed=10 * k + i)
        lines = [f"{p} -1" for p in paths]
        (root / "benchmark_imglist" / "imagenet").mkdir(parents=True, exist_ok=True)
        (root / "benchmark_imglist" / "imagenet" / list_name).write_text("\n".join(lines) + "\n\n")
        listed[name] = paths
    return listed


def test_five_easy_sets_in_one_command(tmp_path, capsys):
    root = tmp_path / "openood"
    listed = fake_openood(root)
    plain = tmp_path / "imagenet-o"
    for i, name in enumerate(["n01443537/a.jpg", "n01443537/b.png", "n01704323/c.jpg"]):
        _png(plain / name, seed=100 + i)
    cli = importlib.import_module("oodforge.commands.import_openood")
    out = tmp_path / "easy"
    cli.main(["--root", str(root), "--out", str(out), "--folder", f"imagenet_o={plain}"])

    summary = json.loads((out / "import_summary.json").read_text())
    assert [row["ood_set"] for row in summary] == list(EASY_SETS)
    expected_roots = {"texture": root / "images_classic", "imagenet_o": plain}
    for name in EASY_SETS:
        manifest = read_manifest(out / name, check_files=True)  # every image resolves through manifest_info.json
        assert manifest.root == expected_roots.get(name, root / "images_largescale").resolve()
        assert {(r["role"], r["split"], r["group"], r["ood_set"], r["label"])
                for r in manifest} == {("ood", "test", "easy", name, -1)}
        if name in listed:
            assert [r["file_name"] for r in manifest] == listed[name]
            assert {r["source_label"] for r in manifest} == {"-1"}
        assert load_image(manifest.path(manifest.rows[0])).size == (6, 6)
    assert [r["file_name"] for r in read_manifest(out / "imagenet_o")] == ["n01443537/a.jpg", "n01443537/b.png",
                                                                           "n01704323/c.jpg"]
    printed = capsys.readouterr().out
    assert "species: 4 images" in printed and "texture: 2 images" in printed


def test_missing_images_and_bad_lists_are_named(tmp_path):
    root = tmp_path / "openood"
    listed = fake_openood(root)
    (root / "images_largescale" / listed["species"][1]).unlink()
    with pytest.raises(ImportListError, match=r"test_species\.txt: 1 of 4 images not found"):
        import_openood(root, tmp_path / "out", sets=["species"])
    result = import_openood(root, tmp_path / "out", sets=["species"], skip_missing=True)[0]
    assert len(result.manifest) == 3 and result.missing == [listed["species"][1]]
    assert json.loads((tmp_path / "out" / "import_summary.json").read_text())[0]["missing"] == 1

    with pytest.raises(FileNotFoundError, match="test_imagenet_o.txt"):
        import_openood(root, tmp_path / "out2", sets=["imagenet_o"])
    bad = tmp_path / "bad.txt"
    bad.write_text("ok.jpg 0\n../escape.jpg 0\n")
    with pytest.raises(ImportListError, match=r"bad\.txt, line 2"):
        read_imglist(bad)
    elsewhere = tmp_path / "list.txt"
    elsewhere.write_text("x/1.jpg 3\n")
    with pytest.raises(ImportListError, match="none of its first images"):
        import_imglist(elsewhere, tmp_path / "out3", ood_set="x", openood_root=root)


def test_explicit_list_with_its_own_image_root_and_id_folder(tmp_path):
    images = tmp_path / "dtd"
    _png(images / "a" / "1.jpg", 1)
    _png(images / "b" / "2.jpg", 2)
    listing = tmp_path / "dtd.txt"
    listing.write_text("a/1.jpg 0\nb/2.jpg 1\na/1.jpg 0\n")  # duplicates are kept once
    result = import_openood(None, tmp_path / "out", sets=[], lists={"texture": listing}, image_root=images)[0]
    assert ([r["file_name"] for r in read_manifest(tmp_path / "out" / "texture", check_files=True)]
            == ["a/1.jpg", "b/2.jpg"])
    assert result.manifest.root == images.resolve()

    ids = import_folder(images, tmp_path / "id", ood_set=None, role="id", label=2, split="train", group=None,
                        category_from_subfolder=True)
    rows = read_manifest(tmp_path / "id").rows
    assert [(r["role"], r["ood_set"], r["label"], r["category"]) for r in rows] == [("id", None, 2, "a"),
                                                                                    ("id", None, 2, "b")]
    assert ids.ood_set == "dtd"


# -- class folders and tables -> ID manifests -------------------------------------------------------------------
from pipelines.importers import ClassImport, import_classes, import_ood_folders  # noqa: E402
from pipelines.splits import SplitError, quotas, stratified_split  # noqa: E402
from tests.pipelines.own_data_helpers import class_tree, ood_tree, png  # noqa: E402


def _script(name: str):
    module = importlib.import_module(f"oodforge.commands.{name}")
    return module


def test_split_tree_keeps_splits_sorted_labels_and_records_unreadable_images(tmp_path):
    root = class_tree(tmp_path / "photos", {"train": 3, "val": 1, "test": 2})
    (root / "test" / "cat" / "broken.png").write_bytes(b"not an image")
    result = import_classes(root, tmp_path / "id")
    manifest = read_manifest(tmp_path / "id", check_files=True)
    assert manifest.root == root.resolve() and len(manifest) == 3 * 6
    assert {(r["class_name"], r["label"]) for r in manifest} == {("ant", 0), ("bee", 1), ("cat", 2)}
    assert all(r["file_name"].split("/")[0] == r["split"] for r in manifest)
    assert json.loads((tmp_path / "id" / "class_names.json").read_text())["names"] == ["ant", "bee", "cat"]
    failures = json.loads((tmp_path / "id" / "failures.json").read_text())
    assert ([f["file"] for f in failures] == ["test/cat/broken.png"] and result.failures == failures
            and not result.missing)


def test_largest_remainder_quotas_and_seeded_stratified_split():
    assert quotas(7, (4, 1, 5)) == [3, 1, 3]      # shares 2.8 / 0.7 / 3.5
    assert quotas(5, (4, 1, 5)) == [2, 1, 2]      # 2 / 0.5 / 2.5: ties go to the earlier split
    assert quotas(10, (4, 1, 5)) == [4, 1, 5] and quotas(2, (4, 1, 5)) == [1, 0, 1]
    for n in range(3, 40):
        q = quotas(n, (4, 1, 5))
        assert sum(q) == n and all(abs(c - n * r / 10) < 1 for c, r in zip(q, (4, 1, 5)))
    strata = ["a"] * 7 + ["b"] * 10
    splits = stratified_split(strata, (4, 1, 5), seed=3)
    for key, want in (("a", [3, 1, 3]), ("b", [4, 1, 5])):
        got = [s for s, k in zip(splits, strata) if k == key]
        assert [got.count(name) for name in ("train", "val", "test")] == want
    assert stratified_split(strata, (4, 1, 5), seed=3) == splits != stratified_split(strata, (4, 1, 5), seed=4)
    with pytest.raises(SplitError, match=r"stratum 'c' has 2 image\(s\), fewer than the 3 splits"):
        stratified_split(strata + ["c", "c"], (4, 1, 5))


def test_flat_folders_and_tables_with_levels_and_strata(tmp_path):
    rng = np.random.default_rng(0)
    for name, n in (("ant", 7), ("bee", 10)):
        for i in range(n):
            png(tmp_path / "flat" / name / f"{i}.png", (100, 20 * i, 50), rng)
    import_classes(tmp_path / "flat", tmp_path / "id", ClassImport(split="4:1:5", seed=1))
    rows = read_manifest(tmp_path / "id").rows
    assert sorted((r["class_name"], r["split"]) for r in rows).count(("ant", "val")) == 1
    assert [sum(r["split"] == s and r["class_name"] == "bee"
                for r in rows) for s in ("train", "val", "test")] == [4, 1, 5]
    table = pd.DataFrame({"file_name": [r["file_name"] for r in rows],
                          "category": [r["class_name"] for r in rows],
                          "fine_era": [f"era{i % 2}" for i in range(len(rows))],
                          "period": ["early" if i % 2 else "late" for i in range(len(rows))]})
    table.to_csv(tmp_path / "rows.csv", index=False)
    options = ClassImport(table=tmp_path / "rows.csv", label="fine_era", levels=["category", "fine_era"],
                          stratify=["period", "category"], split="4:1:5")
    import_classes(tmp_path / "flat", tmp_path / "levels", options)
    saved = read_manifest(tmp_path / "levels").rows
    assert {r["class_name"] for r in saved} == {"era0", "era1"} and {r["label"] for r in saved} == {0, 1}
    assert {r["category"] for r in saved} == {"ant", "bee"} and "period" in saved[0]
    info = json.loads((tmp_path / "levels" / "class_names.json").read_text())
    assert info == {"names": ["era0", "era1"], "label_field": "fine_era", "levels": ["category", "fine_era"]}


def test_nested_level_folders_give_level_fields(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 2), ("test", 1)):
        for cat, era in (("ding", "shang"), ("ding", "zhou"), ("gui", "zhou")):
            for i in range(n):
                png(tmp_path / "b" / split / cat / era / f"{i}.png", (90, 90, 90), rng)
    import_classes(tmp_path / "b", tmp_path / "id", ClassImport(levels=["category", "era"]))
    rows = read_manifest(tmp_path / "id").rows
    assert {(r["category"], r["era"], r["class_name"], r["label"]) for r in rows} == {
        ("ding", "shang", "shang", 0), ("ding", "zhou", "zhou", 1), ("gui", "zhou", "zhou", 1)}


def test_bad_inputs_are_one_line_each(tmp_path, capsys):
    cli = _script("import_folder")
    root = class_tree(tmp_path / "photos", {"train": 2, "test": 1})
    (root / "train" / "empty").mkdir()
    assert _run(cli, [str(root), "--out", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: class folder {root / 'train' / 'empty'} holds no images") and err.count("\n") == 1
    (root / "train" / "empty").rmdir()
    (root / "test" / "ant" / "copy.png").write_bytes((root / "train" / "ant" / "0.png").read_bytes())
    assert _run(cli, [str(root), "--out", str(tmp_path / "o2")]) == 2
    assert ("the same image is in two splits: train/ant/0.png (train) and test/ant/copy.png (test)"
            in capsys.readouterr().err)
    pd.DataFrame({"file_name": ["a.png"], "kind": ["x"]}).to_csv(tmp_path / "t.csv", index=False)
    assert _run(cli, [str(root), "--out", str(tmp_path / "o3"), "--table", str(tmp_path / "t.csv")]) == 2
    assert "t.csv: no column 'label'" in capsys.readouterr().err
    rng = np.random.default_rng(0)
    for i in range(2):
        png(tmp_path / "small" / "ant" / f"{i}.png", (10 * i, 0, 0), rng)
    assert _run(cli, [str(tmp_path / "small"), "--out", str(tmp_path / "o4")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stratum ('ant',) has 2 image(s), fewer than the 3 splits" in err


def _run(cli, argv: list[str]) -> int:
    from pipelines.cli import run_main

    return run_main(cli.main, argv)


def test_ood_subfolders_become_sets_and_openood_folder_needs_no_sets(tmp_path, capsys):
    ood = ood_tree(tmp_path / "new")
    result = import_ood_folders(ood, tmp_path / "ood", group="near")
    rows = read_manifest(tmp_path / "ood", check_files=True).rows
    assert {(r["ood_set"], r["group"], r["role"], r["label"]) for r in rows} == {("moths", "near", "ood", -1),
                                                                                 ("rocks", "near", "ood", -1)}
    assert result.manifest.root == ood.resolve()
    cli = _script("import_openood")
    assert _run(cli, ["--out", str(tmp_path / "easy"), "--folder", f"texture={ood / 'rocks'}"]) == 0
    assert [r["ood_set"] for r in read_manifest(tmp_path / "easy" / "texture")] == ["texture"] * 4
    assert _run(cli, ["--out", str(tmp_path / "none")]) == 2
    assert "nothing to import" in capsys.readouterr().err


# -- import edges: table rows named, one bad split refused, skipped entries counted, names kept inside --out ---------
def _table(tmp_path: Path, root: Path, **columns) -> Path:
    names = [p.relative_to(root).as_posix() for p in sorted(root.rglob("*.png"))]
    frame = pd.DataFrame({"file_name": names, "label": [n.split("/")[-2] for n in names]})
    for key, values in columns.items():
        frame[key] = values(len(names)) if callable(values) else values
    frame.to_csv(tmp_path / "rows.csv", index=False)
    return tmp_path / "rows.csv"


def test_table_faults_name_the_table_line_and_one_bad_split_is_refused(tmp_path, capsys):
    cli = _script("import_folder")
    root = class_tree(tmp_path / "photos", {"train": 2, "test": 2})
    splits = lambda n: ["train", "test"] * (n // 2)  # noqa: E731
    table = _table(tmp_path, root, split=splits)
    assert _run(cli, [str(root), "--out", str(tmp_path / "ok"), "--table", str(table)]) == 0
    kept = read_manifest(tmp_path / "ok").rows
    assert [r["split"] for r in kept] == splits(len(kept))  # the table's own splits, nothing re-split

    frame = pd.read_csv(table)
    frame.loc[4, "split"] = "tset"
    frame.to_csv(table, index=False)
    assert _run(cli, [str(root), "--out", str(tmp_path / "o1"), "--table", str(table)]) == 2
    err = capsys.readouterr().err
    assert (err.startswith(f"error: {table}, line 6: split must be one of train, val, test, got 'tset'")
            and err.count("\n") == 1)
    assert not (tmp_path / "o1" / "metadata.jsonl").exists()

    base = pd.read_csv(table).drop(columns="split")
    cases = [("lat", "abc", "line 3: lat must be a finite number, got 'abc'"),
             ("lat", "inf", "line 3: lat must be a finite number, got 'inf'"),
             ("file_name", "../escape.png", "line 3: file_name must be a relative path inside the image folder"),
             ("file_name", "test/ant/0.png", "line 3: file_name 'test/ant/0.png' is already on line 2")]
    for column, value, message in cases:
        frame = base.assign(lat=1.5).astype(object)
        frame.loc[1, column] = value
        frame.to_csv(table, index=False)
        assert _run(cli, [str(root), "--out", str(tmp_path / "o2"), "--table", str(table)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {table}, {message}") and err.count("\n") == 1, err
    base.assign(lat=1.5).to_csv(table, index=False)
    assert _run(cli, [str(root), "--out", str(tmp_path / "o3"), "--table", str(table)]) == 0
    assert {r["lat"] for r in read_manifest(tmp_path / "o3").rows} == {1.5}  # numbers, not strings


def test_empty_csv_and_corrupt_parquet_are_one_line(tmp_path, capsys):
    cli = _script("import_folder")
    root = class_tree(tmp_path / "photos", {"train": 2, "test": 1})
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "header.csv").write_text("file_name,label\n")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    expected = {"empty.csv": "the table is empty", "header.csv": "the table has a header but no rows",
                "bad.parquet": "not a readable Parquet table"}
    for name, message in expected.items():
        assert _run(cli, [str(root), "--out", str(tmp_path / "o"), "--table", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {tmp_path / name}: {message}") and err.count("\n") == 1, err


def test_hidden_entries_and_dangling_links_are_counted(tmp_path, capsys):
    cli = _script("import_folder")
    root = class_tree(tmp_path / "photos", {"train": 2, "test": 1})
    png(root / "train" / ".thumbnails" / "t.png", (0, 0, 0), np.random.default_rng(1))
    png(root / "train" / "ant" / ".DS_hidden.png", (0, 0, 0), np.random.default_rng(2))
    (root / "train" / "bee" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (root / "test" / "lost_class").symlink_to(tmp_path / "nowhere_dir")
    assert _run(cli, [str(root), "--out", str(tmp_path / "id")]) == 0
    summary = json.loads((tmp_path / "id" / "import_summary.json").read_text())
    assert summary["hidden"] == 2 and set(summary["hidden_examples"]) == {"train/.thumbnails/",
                                                                          "train/ant/.DS_hidden.png"}
    assert summary["dangling_links"] == 2 and set(summary["dangling_link_examples"]) == {"train/bee/gone.png",
                                                                                         "test/lost_class"}
    assert len(read_manifest(tmp_path / "id")) == 9
    assert "skipped 2 hidden (dot-named) entries and 2 dangling symlink(s)" in capsys.readouterr().out

    ood = ood_tree(tmp_path / "new")
    (ood / ".cache").mkdir()
    (ood / "moths" / "dead.png").symlink_to(tmp_path / "nowhere.png")
    result = import_ood_folders(ood, tmp_path / "ood")
    assert (result.skipped.hidden, result.skipped.dangling_links) == ([".cache/"], ["moths/dead.png"])
    assert json.loads((tmp_path / "ood" / "import_summary.json").read_text())["dangling_links"] == 1
    plain = import_folder(ood / "moths", tmp_path / "plain", ood_set="moths")
    assert plain.skipped.dangling_links == ["dead.png"] and plain.summary()["dangling_links"] == 1


def test_names_from_the_command_line_never_leave_out(tmp_path):
    cli = _script("import_openood")
    ood = ood_tree(tmp_path / "new")
    out = tmp_path / "nest" / "easy"
    assert _run(cli,
                ["--out", str(out), "--folder", f"../escape_set={ood / 'rocks'}", "--folder",
                 f"a/b={ood / 'moths'}"]) == 0
    assert not (tmp_path / "nest" / "escape_set").exists()
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("metadata.jsonl"))
    assert len(written) == 2 and all("/" not in w.removesuffix("/metadata.jsonl") for w in written)
    summary = json.loads((out / "import_summary.json").read_text())
    assert [row["ood_set"] for row in summary] == ["../escape_set", "a/b"]  # the names themselves are kept as data
    assert all(Path(row["folder"]).parent == out for row in summary)


# -- field sets --------------------------------------------------------------------------------------------------
def _classifier_folder(path: Path, names: list[str], as_id2label: bool = False) -> Path:
    path.mkdir(parents=True)
    if as_id2label:
        (path / "config.json").write_text(json.dumps({"id2label": {str(i): n for i, n in enumerate(names)}}))
    else:
        (path / "class_names.json").write_text(json.dumps({"names": names, "label_field": "species", "levels": []}))
    return path


def _species_tree(root: Path, species: list[str], n: int = 2) -> Path:
    rng = np.random.default_rng(3)
    for k, name in enumerate(species):
        for i in range(n):
            png(root / name / f"{i}.png", (30 * k, 90, 90), rng)
    return root


def test_field_set_from_folders_labels_known_species_by_the_classifier(tmp_path, capsys):
    from pipelines.importers import import_field

    classes = ["Actias luna", "Antheraea polyphemus", "Hyalophora cecropia"]
    model = _classifier_folder(tmp_path / "clf", classes)
    root = _species_tree(tmp_path / "field", ["Hyalophora_cecropia", "Actias luna", "Nova species", "Unknown moth"])
    cli = _script("import_folder")
    assert _run(cli, [str(root), "--field", "--model", str(model), "--name", "bci", "--out", str(tmp_path / "f")]) == 0
    rows = read_manifest(tmp_path / "f", check_files=True).rows
    ids = {(r["species"], r["label"], r["split"]) for r in rows if r["role"] == "id"}
    assert ids == {("Actias luna", 0, "test"), ("Hyalophora cecropia", 2, "test")}
    novel = {(r["species"], r["ood_set"], r["label"]) for r in rows if r["role"] == "ood"}
    assert novel == {("Nova species", "bci", -1), ("Unknown moth", "bci", -1)}
    assert "field set bci: 4 images of 2 known species, 4 of 2 novel species" in capsys.readouterr().out

    # the classifier's config.json id2label works the same; --known names the known folders
    by_config = _classifier_folder(tmp_path / "clf2", classes, as_id2label=True)
    result = import_field(root, tmp_path / "f2", model=by_config, known=["Actias luna", "Hyalophora_cecropia"])
    assert {r["label"] for r in result.manifest.rows if r["role"] == "id"} == {0, 2}

    refusals = [(["--known", "Nova species"], "--known 'Nova species': the classifier"),
                (["--known", "Actias luna"], "Hyalophora_cecropia: a class of the classifier but not in --known"),
                (["--known", "Missing"], "--known 'Missing': no such folder")]
    for extra, message in refusals:
        assert _run(cli, [str(root), "--field", "--model", str(model), "--out", str(tmp_path / "f3"), *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    unrelated = _classifier_folder(tmp_path / "clf3", ["Danaus plexippus"])
    assert _run(cli, [str(root), "--field", "--model", str(unrelated), "--out", str(tmp_path / "f4")]) == 2
    assert "no folder is a species of the classifier" in capsys.readouterr().err
    assert _run(cli, [str(root), "--field", "--model", str(tmp_path), "--out", str(tmp_path / "f5")]) == 2
    assert "not a classifier folder with class names" in capsys.readouterr().err


def test_identical_undecodable_files_are_failures_never_duplicates(tmp_path, capsys):
    """Identical undecodable files (0-byte `.jpg`s in class folders) are failures, never duplicates that refuse the
    whole import ("the same image is in two splits"): they are listed in failures.json and the rest imported; two
    identical images that decode, in two splits, are still one line."""
    cli = _script("import_folder")
    rng = np.random.default_rng(0)
    for name, colour in (("ant", (200, 0, 0)), ("bee", (0, 200, 0))):
        for i in range(6):
            png(tmp_path / "flat" / name / f"{i}.png", colour, rng)
        for i in range(3):
            (tmp_path / "flat" / name / f"empty{i}.jpg").write_bytes(b"")
    out = tmp_path / "id"
    assert _run(cli, [str(tmp_path / "flat"), "--out", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    failures = json.loads((out / "failures.json").read_text())
    assert sorted(f["file"] for f in failures) == sorted(f"{c}/empty{i}.jpg" for c in ("ant", "bee") for i in range(3))
    assert len({f["reason"] for f in failures}) == 1
    rows = read_manifest(out).rows
    assert len(rows) == 12 and {r["split"] for r in rows} == {"train", "val", "test"}
    (tmp_path / "flat" / "ant" / "copy.png").write_bytes((tmp_path / "flat" / "ant" / "0.png").read_bytes())
    (tmp_path / "flat" / "ant" / "copy2.png").write_bytes((tmp_path / "flat" / "ant" / "0.png").read_bytes())
    assert _run(cli, [str(tmp_path / "flat"), "--out", str(tmp_path / "id2")]) == 2
    assert "the same image is in two splits: ant/" in capsys.readouterr().err


def test_table_rows_bind_each_row_to_its_own_where(tmp_path, monkeypatch):
    """`_check_inside`'s `where` names the row it was given for, whenever it is called (bound per row, not to the
    loop's last index)."""
    import pipelines.importers as importers

    root = tmp_path / "photos"
    for j in range(3):
        _png(root / "ant" / f"{j}.png", j)
    table = tmp_path / "rows.csv"
    table.write_text("file_name,label\n" + "".join(f"ant/{j}.png,ant\n" for j in range(3)))
    kept = []
    monkeypatch.setattr(importers, "_check_inside", lambda root, names, where: kept.append((names[0], where)))
    importers._table_rows(table, ["label"], root)
    assert [(name, where(name)) for name, where in kept] == [(f"ant/{j}.png", f"{table}, line {j + 2}")
                                                             for j in range(3)]
