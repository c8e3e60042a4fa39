"""Importing the easy OOD sets from a generated fake OpenOOD data folder and from plain folders."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
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
    spec = importlib.util.spec_from_file_location("import_cli", ROOT / "scripts" / "import_openood.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out = tmp_path / "easy"
    cli.main(["--root", str(root), "--out", str(out), "--folder", f"imagenet_o={plain}"])

    summary = json.loads((out / "import_summary.json").read_text())
    assert [row["ood_set"] for row in summary] == list(EASY_SETS)
    expected_roots = {"texture": root / "images_classic", "imagenet_o": plain}
    for name in EASY_SETS:
        manifest = read_manifest(out / name, check_files=True)  # every image resolves through manifest_info.json
        assert manifest.root == expected_roots.get(name, root / "images_largescale").resolve()
        assert {(r["role"], r["split"], r["group"], r["ood_set"], r["label"]) for r in manifest} == {("ood", "test", "easy", name, -1)}
        if name in listed:
            assert [r["file_name"] for r in manifest] == listed[name]
            assert {r["source_label"] for r in manifest} == {"-1"}
        assert load_image(manifest.path(manifest.rows[0])).size == (6, 6)
    assert [r["file_name"] for r in read_manifest(out / "imagenet_o")] == ["n01443537/a.jpg", "n01443537/b.png", "n01704323/c.jpg"]
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
    assert [r["file_name"] for r in read_manifest(tmp_path / "out" / "texture", check_files=True)] == ["a/1.jpg", "b/2.jpg"]
    assert result.manifest.root == images.resolve()

    ids = import_folder(images, tmp_path / "id", ood_set=None, role="id", label=2, split="train", group=None,
                        category_from_subfolder=True)
    rows = read_manifest(tmp_path / "id").rows
    assert [(r["role"], r["ood_set"], r["label"], r["category"]) for r in rows] == [("id", None, 2, "a"), ("id", None, 2, "b")]
    assert ids.ood_set == "dtd"
