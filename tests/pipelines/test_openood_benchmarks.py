"""`oodforge import-openood --benchmark`: a whole OpenOOD v1.5 benchmark from its data folder in the released layout
(tests/helpers/openood_release.py) as one manifest: ID splits with labels, near / far OOD test sets, OOD validation."""
from __future__ import annotations

import importlib
import json

import pytest

from pipelines.data import read_manifest
from pipelines.errors import UserInputError
from pipelines.importers import ImportListError
from pipelines.openood_benchmarks import BENCHMARKS, import_benchmark
from tests.helpers.openood_release import RELEASE, fake_benchmark

CLI = importlib.import_module("oodforge.commands.import_openood")


def test_cifar10_imports_whole(tmp_path, capsys):
    root = tmp_path / "data"
    lists = fake_benchmark(root, "cifar10")
    CLI.main(["--root", str(root), "--benchmark", "cifar10", "--out", str(tmp_path / "out")])
    manifest = read_manifest(tmp_path / "out" / "cifar10", check_files=True)  # every file resolves
    assert manifest.root == root.resolve()
    rows = {r["file_name"]: r for r in manifest}
    for split in ("train", "val", "test"):
        for path, label in lists[f"{split}_cifar10.txt"]:
            row = rows[f"images_classic/{path}"]
            assert (row["role"], row["split"], row["label"], row["ood_set"], row["group"]) == \
                ("id", split, int(label), None, None)
            assert row["source_list"] == f"{split}_cifar10.txt"
    expected = {"cifar100": "near", "tin": "near", "mnist": "far", "svhn": "far", "texture": "far",
                "places365": "far"}
    for name, group in expected.items():
        for path, label in lists[f"test_{name}.txt"]:
            row = rows[f"images_classic/{path}"]
            assert (row["role"], row["split"], row["label"], row["ood_set"], row["group"], row["source_label"]) == \
                ("ood", "test", -1, name, group, label)
    val = [r for r in manifest if r["split"] == "val" and r["role"] == "ood"]
    assert [r["file_name"] for r in val] == [f"images_classic/{p}" for p, _ in lists["val_tin.txt"]]
    assert {r["ood_set"] for r in val} == {"ood_val"} and {r["group"] for r in val} == {None}
    assert len(manifest) == sum(len(v) for v in lists.values())
    printed = capsys.readouterr().out
    assert ("cifar10: ID train 12, val 4, test 6; OOD near:cifar100 3, near:tin 3, far:mnist 3, far:svhn 3, "
            "far:texture 3, far:places365 3, ood_val 3 ->") in printed
    summary = json.loads((tmp_path / "out" / "import_summary.json").read_text())[0]
    assert summary["id"] == {"train": 12, "val": 4, "test": 6} and summary["missing"] == 0


def test_dry_run_checks_the_lists_and_writes_nothing(tmp_path, capsys):
    root = tmp_path / "data"
    fake_benchmark(root, "cifar10", id_counts=(3, 2, 2), ood_count=2)
    CLI.main(["--root", str(root), "--benchmark", "cifar10", "--out", str(tmp_path / "out"), "--dry-run"])
    assert "cifar10: ID train 3, val 2, test 2; OOD near:cifar100 2" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()
    (root / "benchmark_imglist" / "cifar10" / "train_cifar10.txt").write_text("cifar10/train/x.png 0\n")
    with pytest.raises(ImportListError, match=r"train_cifar10\.txt: 1 of 1 images not found"):
        CLI.main(["--root", str(root), "--benchmark", "cifar10", "--out", str(tmp_path / "out"), "--dry-run"])
    with pytest.raises(UserInputError, match=r"--dry-run: only with --benchmark imported whole"):
        CLI.main(["--root", str(root), "--sets", "svhn", "--out", str(tmp_path / "out"), "--dry-run"])


def test_imagenet200_reads_textures_from_images_classic(tmp_path):
    root = tmp_path / "data"
    lists = fake_benchmark(root, "imagenet200", id_counts=(3, 2, 2), ood_count=2, size=(20, 16))
    result = import_benchmark(root, tmp_path / "out", "imagenet200")
    rows = {r["file_name"]: r for r in result.manifest}
    assert {f"images_classic/{p}" for p, _ in lists["test_textures.txt"]} <= set(rows)
    assert {f"images_largescale/{p}" for p, _ in lists["test_ninco.txt"]} <= set(rows)
    groups = {(r["ood_set"], r["group"]) for r in result.manifest if r["role"] == "ood"}
    assert groups == {("ssb_hard", "near"), ("ninco", "near"), ("inaturalist", "far"), ("textures", "far"),
                      ("openimage_o", "far"), ("ood_val", None)}
    assert BENCHMARKS["imagenet200"].num_classes == 200 and BENCHMARKS["imagenet"].folder == "imagenet"


def test_the_benchmark_facts_match_the_released_names():
    """Every list file and image folder of the stand-in (written out from OpenOOD's DATA_INFO) is the module's."""
    for name, (folder, id_data, val, near, far) in RELEASE.items():
        bench = BENCHMARKS[name]
        assert (bench.folder, bench.id_data, bench.ood_val, bench.near, bench.far) == (folder, id_data, val, near, far)
        assert bench.id_lists == {s: f"{s}_{name}.txt" for s in ("train", "val", "test")}
    assert BENCHMARKS["cifar100"].near == {"cifar10": ("test_cifar10.txt", "images_classic"),
                                           "tin": ("test_tin.txt", "images_classic")}


def test_bad_lists_are_named(tmp_path):
    root = tmp_path / "data"
    lists = fake_benchmark(root, "cifar10", id_counts=(3, 2, 2), ood_count=2)
    listing = root / "benchmark_imglist" / "cifar10"
    original = (listing / "test_cifar10.txt").read_text()
    (listing / "test_cifar10.txt").write_text(original.replace(" 1\n", " 10\n", 1))
    with pytest.raises(ImportListError, match=r"test_cifar10\.txt: image 'cifar10/test/class1/0001\.png' has label "
                                              r"'10', not a class index in \[0, 10\)"):
        import_benchmark(root, tmp_path / "out", "cifar10")
    (listing / "test_cifar10.txt").write_text(original)
    (listing / "val_tin.txt").write_text((listing / "val_tin.txt").read_text() + f"{lists['test_tin.txt'][0][0]} -1\n")
    with pytest.raises(ImportListError, match=r"val_tin\.txt: image 'tin/test/000\.png' is listed again \(first in "
                                              r"test_tin\.txt\)"):
        import_benchmark(root, tmp_path / "out", "cifar10")
    (listing / "val_tin.txt").write_text("".join(f"{p} {la}\n" for p, la in lists["val_tin.txt"]))
    (root / "images_classic" / lists["test_svhn.txt"][1][0]).unlink()
    with pytest.raises(ImportListError, match=r"test_svhn\.txt: 1 of 2 images not found"):
        import_benchmark(root, tmp_path / "out", "cifar10")
    result = import_benchmark(root, tmp_path / "out", "cifar10", skip_missing=True)
    assert result.missing == [f"images_classic/{lists['test_svhn.txt'][1][0]}"]
    assert sum(r["ood_set"] == "svhn" for r in result.manifest) == 1
    (listing / "test_mnist.txt").write_text("../../outside.png -1\n")
    with pytest.raises(ImportListError, match=r"test_mnist\.txt, line 1: image path must be relative"):
        import_benchmark(root, tmp_path / "out", "cifar10")


def test_command_errors_and_the_per_set_mode_kept(tmp_path):
    root = tmp_path / "data"
    lists = fake_benchmark(root, "cifar10", id_counts=(3, 2, 2), ood_count=2)
    with pytest.raises(UserInputError, match=r"unknown OpenOOD benchmark 'cifar9'; one of \['cifar10', 'cifar100', "
                                             r"'imagenet', 'imagenet200'\]"):
        CLI.main(["--root", str(root), "--benchmark", "cifar9", "--out", str(tmp_path / "out")])
    with pytest.raises(UserInputError, match=r"imagenet200: no such folder; is .* OpenOOD's data folder"):
        CLI.main(["--root", str(root), "--benchmark", "imagenet200", "--out", str(tmp_path / "out")])
    with pytest.raises(UserInputError, match=r"--benchmark: give --root"):
        CLI.main(["--benchmark", "cifar10", "--out", str(tmp_path / "out")])
    # with --sets, --benchmark names the list folder only: one OOD manifest a set, as before
    CLI.main(["--root", str(root), "--benchmark", "cifar10", "--sets", "svhn", "--group", "far",
              "--out", str(tmp_path / "sets")])
    manifest = read_manifest(tmp_path / "sets" / "svhn")
    assert [r["file_name"] for r in manifest] == [p for p, _ in lists["test_svhn.txt"]]
    assert {(r["group"], r["ood_set"]) for r in manifest} == {("far", "svhn")}
