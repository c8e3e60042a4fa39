"""Manifests: validation errors name file, line and field; robust image loading of every common mode."""
import io
import json

import numpy as np
import pytest
from PIL import Image

from pipelines.data import (
    ImageLoadError,
    ManifestError,
    load_image,
    load_images,
    make_row,
    open_image_source,
    read_manifest,
    write_manifest,
)


def _write_lines(folder, lines):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metadata.jsonl").write_text("".join(lines))


def test_roundtrip_and_select(tmp_path):
    rows = [make_row("a.png", split="train", label=1, category="ding"),
            make_row("b.png", split="test", role="ood", ood_set="container", group="hard", lat=1.5)]
    write_manifest(tmp_path, rows)
    m = read_manifest(tmp_path)
    assert m.rows == rows
    assert m.rows[1]["label"] == -1
    assert [r["file_name"] for r in m.select(role="ood")] == ["b.png"]
    assert len(m.select(split=["train", "test"])) == 2
    assert m.ood_sets() == ["container"]
    assert m.fingerprint() == read_manifest(tmp_path).fingerprint()
    assert m.fingerprint() != write_manifest(tmp_path / "x", rows[:1]).fingerprint()


@pytest.mark.parametrize("row, field", [
    ({"split": "test", "role": "id", "ood_set": None, "group": None, "label": 0}, "file_name"),
    ({"file_name": "a.png", "split": "dev", "role": "id", "ood_set": None, "group": None, "label": 0}, "split"),
    ({"file_name": "a.png", "split": "test", "role": "x", "ood_set": None, "group": None, "label": 0}, "role"),
    ({"file_name": "a.png", "split": "test", "role": "id", "ood_set": None, "group": None, "label": "3"}, "label"),
    ({"file_name": "a.png", "split": "test", "role": "id", "ood_set": None, "group": None, "label": -1}, "label"),
    ({"file_name": "a.png", "split": "test", "role": "ood", "ood_set": None, "group": "hard", "label": -1}, "ood_set"),
    ({"file_name": "a.png", "split": "test", "role": "ood", "ood_set": "s", "group": "medium", "label": -1}, "group"),
    ({"file_name": "a.png", "split": "test", "role": "ood", "ood_set": "s", "group": None, "label": 2}, "label"),
    ({"file_name": "../a.png", "split": "test", "role": "id", "ood_set": None, "group": None, "label": 0}, "file_name"),
    ({"file_name": "a.png", "split": "test", "role": "id", "ood_set": None, "group": None, "label": 0, "lat": "north"},
     "lat"),
])
def test_bad_field_names_file_line_field(tmp_path, row, field):
    good = json.dumps(make_row("ok.png")) + "\n"
    _write_lines(tmp_path, [good, json.dumps(row) + "\n"])
    with pytest.raises(ManifestError) as err:
        read_manifest(tmp_path)
    assert err.value.line == 2 and err.value.field == field
    assert "metadata.jsonl" in str(err.value) and "line 2" in str(err.value) and f"'{field}'" in str(err.value)


def test_bad_json_and_duplicates_and_missing(tmp_path):
    _write_lines(tmp_path / "a", [json.dumps(make_row("x.png")) + "\n", "{not json\n"])
    with pytest.raises(ManifestError, match="line 2"):
        read_manifest(tmp_path / "a")
    _write_lines(tmp_path / "b", [json.dumps(make_row("x.png")) + "\n"] * 2)
    with pytest.raises(ManifestError, match="duplicate of line 1"):
        read_manifest(tmp_path / "b")
    with pytest.raises(ManifestError, match="no metadata.jsonl"):
        read_manifest(tmp_path / "c")
    _write_lines(tmp_path / "d", [json.dumps(make_row("x.png")) + "\n"])
    with pytest.raises(ManifestError, match="image not found"):
        read_manifest(tmp_path / "d", check_files=True)


def test_plain_folder_as_manifest(tmp_path):
    for name in ("b/2.png", "a/1.jpg", "c.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("txt"):
            (tmp_path / name).write_text("x")
        else:
            Image.new("RGB", (4, 4)).save(tmp_path / name)
    m = open_image_source(tmp_path, role="ood", ood_set="materials")
    assert [r["file_name"] for r in m] == ["a/1.jpg", "b/2.png"]
    assert all(r["label"] == -1 and r["ood_set"] == "materials" for r in m)


def _exif_rotated(tmp_path):
    """A 4x2 image whose EXIF says 'rotate 90 CW' (orientation 6): it must load as 2x4."""
    img = Image.new("RGB", (4, 2), (255, 0, 0))
    img.putpixel((0, 0), (0, 0, 255))
    exif = img.getexif()
    exif[0x0112] = 6
    path = tmp_path / "rot.jpg"
    img.save(path, exif=exif.tobytes(), quality=100)
    return path


def test_image_modes(tmp_path):
    assert load_image(_exif_rotated(tmp_path)).size == (2, 4)
    rgba = Image.new("RGBA", (3, 3), (10, 20, 30, 0))
    rgba.save(tmp_path / "a.png")
    assert load_image(tmp_path / "a.png").getpixel((0, 0)) == (255, 255, 255)  # transparent -> white background
    Image.new("CMYK", (3, 3), (0, 255, 255, 0)).save(tmp_path / "c.jpg")
    r, g, b = load_image(tmp_path / "c.jpg").getpixel((1, 1))
    assert r > 200 and g < 50 and b < 50
    pal = Image.new("P", (3, 3))
    pal.putpalette([0, 255, 0] * 256)
    pal.save(tmp_path / "p.png")
    assert load_image(tmp_path / "p.png").getpixel((0, 0)) == (0, 255, 0)
    arr16 = np.full((3, 3), 65535 // 2, dtype=np.uint16)
    Image.fromarray(arr16).save(tmp_path / "g16.png")
    assert load_image(tmp_path / "g16.png").getpixel((0, 0)) == (127, 127, 127)  # round(32767 / 65535 * 255)
    Image.new("L", (3, 3), 77).save(tmp_path / "l.png")
    img = load_image(tmp_path / "l.png")
    assert img.mode == "RGB" and img.getpixel((0, 0)) == (77, 77, 77)


def test_corrupt_image_is_a_recorded_failure(tmp_path):
    good = tmp_path / "good.png"
    Image.new("RGB", (2, 2)).save(good)
    bad = tmp_path / "bad.png"
    buf = io.BytesIO()
    Image.new("RGB", (64, 64)).save(buf, format="PNG")
    bad.write_bytes(buf.getvalue()[:40])
    with pytest.raises(ImageLoadError, match="bad.png"):
        load_image(bad)
    images, failures = load_images([good, bad, tmp_path / "missing.png"])
    assert images[0] is not None and images[1] is None and images[2] is None
    assert [(f.index, "bad.png" in f.file) for f in failures][:1] == [(1, True)]
    assert failures[1].reason == "file not found"


def test_image_root_sidecar(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (2, 2)).save(images / "a.png")
    folder = tmp_path / "manifest"
    write_manifest(folder, [make_row("a.png")])
    assert read_manifest(folder).root == folder
    (folder / "manifest_info.json").write_text(json.dumps({"image_root": "../images"}))
    m = read_manifest(folder, check_files=True)
    assert m.path(m.rows[0]).resolve() == (images / "a.png").resolve()
    assert read_manifest(folder, image_root=images).root == images
    (folder / "manifest_info.json").write_text(json.dumps({"image_root": 3}))
    with pytest.raises(ManifestError, match="image_root"):
        read_manifest(folder)


def test_bad_input_matrix_loads_or_fails_naming_the_file_and_reason(tmp_path):
    from badinputs import bad_images

    cases = bad_images(tmp_path)
    for case in cases.values():
        if case.loads:
            image = load_image(case.path)
            assert image.mode == "RGB" and image.size == case.size, case.name
        else:
            with pytest.raises(ImageLoadError, match=case.reason) as err:
                load_image(case.path)
            assert err.value.path == str(case.path) and case.path.name in str(err.value)
    images, failures = load_images([case.path for case in cases.values()])
    assert {f.file for f in failures} == {str(c.path) for c in cases.values() if not c.loads}
    assert [image is None for image in images] == [not c.loads for c in cases.values()]
    # the odd modes decode to the right pixels: 16-bit rescaled, transparent palette entries on white, EXIF turned
    gray16 = np.asarray(Image.open(cases["gray16"].path), dtype=np.float64)
    np.testing.assert_array_equal(np.asarray(load_image(cases["gray16"].path))[..., 0], np.rint(gray16 / 65535 * 255))
    with Image.open(cases["palette_transparency"].path) as palette:
        transparent = np.asarray(palette) == palette.info["transparency"]
    assert transparent.any() and (np.asarray(load_image(cases["palette_transparency"].path))[transparent] == 255).all()
    good = np.asarray(load_image(cases["good"].path), dtype=np.int64)
    turned = np.asarray(load_image(cases["exif_rotated"].path), dtype=np.int64)
    assert np.abs(turned - np.rot90(good, k=-1)).mean() < 8  # JPEG noise only


def test_huge_image_is_refused_from_its_header_without_decoding(tmp_path, monkeypatch):
    from badinputs import bad_images
    from PIL import ImageFile

    huge = bad_images(tmp_path)["huge"].path

    def no_decoding(self):
        raise AssertionError("the pixels of an over-limit image must not be decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    with pytest.raises(ImageLoadError, match=r"10000x5000 = 50.0 MP exceeds the 40 MP limit"):
        load_image(huge)
    monkeypatch.undo()
    with Image.open(huge) as image:  # a real, valid 1-bit PNG: only its size is the problem
        assert image.size == (10_000, 5_000) and image.mode == "1"


def test_check_files_is_not_fooled_by_a_link_loop_beside_the_images(tmp_path):
    """A self-referential symlink in an image folder (ELOOP on stat) leaves the folder's real images found."""
    from pipelines.data import make_row, read_manifest, write_manifest

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "0.png").write_bytes(b"x")
    (tmp_path / "a" / "loop.jpg").symlink_to("loop.jpg")
    write_manifest(tmp_path, [make_row("a/0.png")])
    assert [r["file_name"] for r in read_manifest(tmp_path, check_files=True).rows] == ["a/0.png"]
