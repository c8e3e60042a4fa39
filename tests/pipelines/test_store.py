"""The shard store (pipelines.store, pipelines.shards): the WebDataset layout, the member surface loaders use, resize
on pack, resume shard by shard, the run key from shard digests, and every bad input as one ShardError naming the file:
a truncated, changed or missing shard, a member the index names but the tar lacks, hostile member names and types."""
from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.data import ImageLoadError, ManifestError, load_image, make_row, read_manifest, write_manifest
from pipelines.fingerprint import file_identity, images_fingerprint
from pipelines.shards import PackConfig, PackError, pack_images, pack_manifest, plan_shards
from pipelines.store import (
    STORE_FILE,
    MemberPath,
    ShardError,
    image_path,
    index_path,
    read_index,
    read_member,
    read_store,
    scan_tar,
    verify_shard,
)


def _jpeg(path: Path, size: tuple[int, int], seed: int, **save) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path, quality=90, **save)
    return path.read_bytes()


@pytest.fixture()
def source(tmp_path):
    """A folder manifest of 5 small JPEGs (stored byte for byte) under tmp_path/src."""
    rows = []
    for i in range(5):
        _jpeg(tmp_path / "src" / "c" / f"{i}.jpg", (40 + i, 30), i)
        rows.append(make_row(f"c/{i}.jpg", split="train", label=i % 2))
    write_manifest(tmp_path / "src", rows)
    return tmp_path / "src"


def _packed(source: Path, out: Path, **config) -> Path:
    pack_manifest(source, out, PackConfig(**{"samples_per_shard": 2, **config}))
    return out


# -- layout and surface
# -------------------------------------------------------------------------------------------------
def test_shards_are_webdataset_tars_with_an_index_and_a_wids_descriptor(source, tmp_path):
    out = _packed(source, tmp_path / "out")
    store = out / "shards"
    assert sorted(p.name for p in store.glob("*.tar")) == ["000000.tar", "000001.tar", "000002.tar"]  # 2 + 2 + 1
    with tarfile.open(store / "000000.tar") as tar:
        names = tar.getnames()
        meta = json.loads(tar.extractfile("000000001.json").read())
    assert names == ["000000000.jpg", "000000000.json", "000000001.jpg", "000000001.json"]  # <key>.<ext> pairs
    assert meta["file_name"] == "c/1.jpg" and meta["original_size"] == [41, 30]
    assert meta["sha256"] == hashlib.sha256((source / "c" / "1.jpg").read_bytes()).hexdigest()
    descriptor = json.loads((store / STORE_FILE).read_text())
    assert descriptor["wids_version"] == 1 and [s["nsamples"] for s in descriptor["shardlist"]] == [2, 2, 1]
    record = read_store(store)["000000.tar"]
    assert record.sha256 == hashlib.sha256((store / "000000.tar").read_bytes()).hexdigest()
    info = json.loads((out / "manifest_info.json").read_text())
    assert info == {"image_root": "shards", "store": "shards"}


def test_member_path_has_the_path_surface_and_exact_bytes(source, tmp_path):
    manifest = read_manifest(_packed(source, tmp_path / "out"), check_files=True)
    path = manifest.path(manifest.rows[3])
    raw = (source / "c" / "3.jpg").read_bytes()
    assert isinstance(path, MemberPath) and path.is_file() and path.exists()
    assert path.name == "000000003.jpg" and path.suffix == ".jpg"
    assert str(path) == f"{tmp_path / 'out' / 'shards' / '000001.tar'}#000000003.jpg"
    assert path.stat().st_size == len(raw) and path.stat().st_mtime_ns == os.stat(path.shard).st_mtime_ns
    with path.open("rb") as fh:
        assert fh.read() == raw and fh.seek(0) == 0 and fh.read(3) == raw[:3]
    assert path == manifest.path(manifest.rows[3]) and len({path, manifest.path(manifest.rows[3])}) == 1
    assert pickle.loads(pickle.dumps(path)) == path and path.resolve() == path
    assert np.array_equal(np.asarray(load_image(path)), np.asarray(load_image(source / "c" / "3.jpg")))
    assert file_identity(path, "content") == hashlib.sha256(raw).hexdigest()
    assert image_path(str(path)) == path and image_path(str(source / "c" / "3.jpg")) == source / "c" / "3.jpg"
    with pytest.raises(ValueError, match="read-only"):
        path.open("wb")


def _child_reads(path: MemberPath, queue) -> None:
    queue.put(hashlib.sha256(path.read_bytes()).hexdigest())


def test_a_forked_child_reads_members_through_its_own_handles(source, tmp_path):
    manifest = read_manifest(_packed(source, tmp_path / "out"))
    path = manifest.path(manifest.rows[0])
    expect = hashlib.sha256(path.read_bytes()).hexdigest()  # the parent holds the shard open now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_reads, args=(path, queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert got == expect and child.exitcode == 0
    assert hashlib.sha256(path.read_bytes()).hexdigest() == expect  # and the parent's handle still works


# -- packing
# --------------------------------------------------------------------------------------------------------------
def test_pack_resizes_in_fetchs_modes_by_fetchs_own_code(tmp_path):
    """keep_ratio: larger images resized (EXIF applied, as img2dataset), smaller ones byte for byte; reference: every
    image to the shorter side given, as fetch writes it; none (the default): bytes unchanged. Each member is exactly
    what `fetch_resize.prepare` makes of the source bytes (one resize definition for fetch and pack)."""
    from pipelines.curation.fetch_resize import prepare

    big = _jpeg(tmp_path / "src" / "big.jpg", (900, 600), 1)
    small = _jpeg(tmp_path / "src" / "small.jpg", (300, 200), 2)
    rotated = Image.open(io.BytesIO(_jpeg(tmp_path / "src" / "rot.jpg", (800, 600), 3)))
    exif = rotated.getexif()
    exif[0x0112] = 6  # EXIF orientation: rotate 90 degrees on display
    rotated.save(tmp_path / "src" / "rot.jpg", exif=exif, quality=90)
    write_manifest(tmp_path / "src", [make_row(n) for n in ("big.jpg", "small.jpg", "rot.jpg")])
    manifest = read_manifest(_packed(tmp_path / "src", tmp_path / "out", resize="keep_ratio", short_side=256))
    paths = {r["file_name"]: manifest.path(r) for r in manifest.rows}
    assert load_image(paths["big.jpg"]).size == (384, 256) and paths["big.jpg"].stat().st_size < len(big)
    assert paths["big.jpg"].read_bytes() == prepare(big, "big.jpg", 256, 10**9, 95, "keep_ratio").data
    assert paths["small.jpg"].read_bytes() == small  # at most short_side already: byte for byte
    assert load_image(paths["rot.jpg"]).size == (256, 341)  # orientation applied before the resize, as loaders see it
    assert load_image(tmp_path / "src" / "rot.jpg").size == (600, 800)
    reference = read_manifest(_packed(tmp_path / "src", tmp_path / "ref", resize="reference"))
    paths = {r["file_name"]: reference.path(r) for r in reference.rows}
    with Image.open(paths["small.jpg"].open()) as image:  # Resize(224) on the shorter side, up or down; PIL's quality
                                                          # 75
        assert image.size == (336, 224) and image.format == "JPEG"
    assert paths["small.jpg"].read_bytes() == prepare(small, "small.jpg", 224, 10**9, 75, "reference").data
    kept = read_manifest(_packed(tmp_path / "src", tmp_path / "none"))
    assert [kept.path(r).read_bytes() for r in kept.rows] == [(tmp_path / "src" / r["file_name"]).read_bytes()
                                                              for r in kept.rows]
    assert json.loads((tmp_path / "none" / "shards" / STORE_FILE).read_text())["resize"] == "none"


def test_missing_and_undecodable_images_fail_to_load_as_in_the_folder_store(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bad.png").write_bytes(b"not an image")
    write_manifest(tmp_path / "src", [make_row("gone.jpg"), make_row("bad.png")])
    manifest, result = pack_manifest(tmp_path / "src", tmp_path / "out")
    assert result.missing == ["gone.jpg"] and result.undecoded == ["bad.png"]
    with pytest.raises(ImageLoadError, match="file not found"):
        load_image(manifest.path(manifest.rows[0]))
    assert manifest.path(manifest.rows[1]).read_bytes() == b"not an image"  # stored as it was
    with pytest.raises(ImageLoadError, match="cannot decode"):
        load_image(manifest.path(manifest.rows[1]))


def test_plan_cuts_by_count_and_source_bytes():
    config = PackConfig(samples_per_shard=3, shard_bytes=100)
    assert plan_shards([10, 10, 10, 10, None, 90, 20, 200, 1], config) == [
        range(0, 3), range(3, 6), range(6, 7), range(7, 8), range(8, 9)]
    assert plan_shards([], config) == []


def test_a_killed_pack_resumes_with_the_unfinished_shards_only(source, tmp_path):
    sources = [(f"c/{i}.jpg", source / "c" / f"{i}.jpg") for i in range(5)]
    config = PackConfig(samples_per_shard=2)
    store = tmp_path / "store"

    class Killed(Exception):
        pass

    def die_after_first(index):
        raise Killed(index["shard"])

    with pytest.raises(Killed):
        pack_images(sources, store, config, on_shard=die_after_first)
    first = (store / "000000.tar").stat().st_mtime_ns
    assert not index_path(store / "000001.tar").exists()
    result = pack_images(sources, store, config)
    assert result.kept == ["000000.tar"] and result.written == ["000001.tar", "000002.tar"]
    assert (store / "000000.tar").stat().st_mtime_ns == first
    assert sorted(read_store(store)) == ["000000.tar", "000001.tar", "000002.tar"]
    again = pack_images(sources, store, config)
    assert again.written == [] and len(again.kept) == 3
    with pytest.raises(PackError, match="other images or settings"):
        pack_images(sources, store, PackConfig(samples_per_shard=2, resize="keep_ratio"))
    with pytest.raises(PackError, match="000000.tar"):
        pack_images(sources[::-1], store, config)


def test_pack_in_place_and_reserved_fields(source, tmp_path):
    manifest, _ = pack_manifest(source, source)  # a folder manifest converted where it is
    assert read_manifest(source).rows == manifest.rows and (source / "shards" / STORE_FILE).is_file()
    rows = [make_row("c/0.jpg", shard_offset=3)]
    write_manifest(tmp_path / "odd", rows)
    with pytest.raises(ManifestError, match="shard_offset.*reserved"):
        pack_manifest(tmp_path / "odd", tmp_path / "odd_out")


def test_repacking_a_shard_manifest_reads_its_members(source, tmp_path):
    first = _packed(source, tmp_path / "a")
    second, _ = pack_manifest(first, tmp_path / "b", PackConfig(samples_per_shard=5))
    assert len(list((tmp_path / "b" / "shards").glob("*.tar"))) == 1
    assert [second.path(r).read_bytes() for r in second.rows] == [(source / r["file_name"]).read_bytes()
                                                                   for r in second.rows]


# -- keys and checks
# --------------------------------------------------------------------------------------------------------
def test_the_key_is_the_shard_digest_and_a_changed_shard_is_one_error(source, tmp_path):
    manifest = read_manifest(_packed(source, tmp_path / "out"))
    shard = tmp_path / "out" / "shards" / "000001.tar"
    key = images_fingerprint(manifest, "stat")
    assert images_fingerprint(manifest, "content") == key
    assert images_fingerprint(manifest.select(label=0)) != key  # rows are part of it
    before = os.stat(shard)
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF  # one byte of an image, same size
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    with pytest.raises(ShardError, match="000001.tar: its sha256"):
        images_fingerprint(manifest, "stat")  # mtime changed: re-hashed, and the bytes differ
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # the mtime put back: only content mode sees it
    assert images_fingerprint(manifest, "stat") == key
    with pytest.raises(ShardError, match="000001.tar: its sha256"):
        images_fingerprint(manifest, "content")
    shard.write_bytes(bytes(data[:-1024]))
    with pytest.raises(ShardError, match=r"000001.tar: \d+ bytes, the store recorded \d+ \(truncated"):
        images_fingerprint(manifest, "stat")
    shard.unlink()
    with pytest.raises(ShardError, match="000001.tar: shard missing"):
        images_fingerprint(manifest)
    with pytest.raises(ManifestError, match="line 3, field 'file_name'.*shard not found"):
        read_manifest(tmp_path / "out", check_files=True)


def test_a_copied_store_with_new_mtimes_is_rehashed_and_accepted(source, tmp_path):
    manifest = read_manifest(_packed(source, tmp_path / "out"))
    key = images_fingerprint(manifest)
    for shard in (tmp_path / "out" / "shards").glob("*.tar"):
        os.utime(shard, ns=(1, 1))
    assert images_fingerprint(manifest) == key


def test_check_files_lists_folders_once_and_names_the_line(tmp_path):
    (tmp_path / "d" / "a").mkdir(parents=True)
    for name in ("a/1.png", "a/2.png"):
        Image.new("RGB", (4, 4)).save(tmp_path / "d" / name)
    (tmp_path / "d" / "a" / "sub.png").mkdir()  # a folder with an image's name is no image
    os.symlink(tmp_path / "d" / "a" / "1.png", tmp_path / "d" / "a" / "link.png")
    rows = [make_row(n) for n in ("a/1.png", "a/2.png", "a/link.png")]
    write_manifest(tmp_path / "d", rows)
    assert len(read_manifest(tmp_path / "d", check_files=True)) == 3
    for bad in ("a/sub.png", "a/none.png", "b/none.png"):
        write_manifest(tmp_path / "d", rows + [make_row(bad)])
        with pytest.raises(ManifestError, match=f"line 4, field 'file_name': image not found: .*{bad}"):
            read_manifest(tmp_path / "d", check_files=True)


# -- bad input
# --------------------------------------------------------------------------------------------------------------
def test_a_row_pointing_at_another_member_or_outside_the_root_is_refused(source, tmp_path):
    out = _packed(source, tmp_path / "out")
    rows = read_manifest(out).rows
    moved = dict(rows[1], shard_offset=rows[0]["shard_offset"])  # the bytes of another member
    with pytest.raises(ImageLoadError, match="tar header .* names '000000000.jpg'"):
        load_image(read_manifest(out).path(moved))
    for bad in ({"shard_file": "../x.tar"}, {"shard_file": "/etc/x.tar"}, {"shard_offset": "512"},
                {"shard_file": "000000.tar\0"}):
        with pytest.raises(ShardError, match="invalid shard reference"):
            read_manifest(out).path(dict(rows[0], **bad))
    huge = MemberPath(out / "shards" / "000000.tar", rows[0]["shard_member"], 512, 1 << 40)
    with pytest.raises(OSError, match="byte limit"):
        huge.read_bytes()  # refused before anything is allocated
    assert not huge.is_file()
    with pytest.raises(OSError, match="invalid member position"):
        read_member(out / "shards" / "000000.tar", "x.jpg", 100, 4)


def test_verify_finds_a_member_the_index_names_but_the_tar_lacks(source, tmp_path):
    store = _packed(source, tmp_path / "out") / "shards"
    shard = store / "000000.tar"
    assert verify_shard(shard, read_store(store)["000000.tar"]) == []
    index = read_index(shard)
    index["members"]["000000099.jpg"] = [512, 10, "c/99.jpg"]
    index_path(shard).write_text(json.dumps(index))
    assert verify_shard(shard) == [f"{shard}: member '000000099.jpg' is in the index but not in the tar"]


def _tar(path: Path, *members: tarfile.TarInfo) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 1, **fields) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size if kind == tarfile.REGTYPE else 0
    for key, value in fields.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize("member, message", [
    (_info("../x.jpg"), "would leave the folder"),
    (_info("/etc/x.jpg"), "would leave the folder"),
    (_info("a/../../x.jpg"), "would leave the folder"),
    (_info("link.jpg", tarfile.SYMTYPE, linkname="/etc/passwd"), "is a symlink"),
    (_info("hard.jpg", tarfile.LNKTYPE, linkname="000.jpg"), "is a hardlink"),
    (_info("dev.jpg", tarfile.CHRTYPE, devmajor=1, devminor=3), "is a device"),
    (_info("fifo.jpg", tarfile.FIFOTYPE), "is a FIFO"),
])
def test_hostile_members_are_refused_without_extracting(tmp_path, member, message):
    path = _tar(tmp_path / "bad.tar", _info("000.jpg"), member)
    with pytest.raises(ShardError, match=message):
        scan_tar(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar"]  # nothing was written beside it


def test_a_huge_declared_size_or_a_truncated_tar_is_refused(tmp_path):
    path = _tar(tmp_path / "t.tar", _info("000.jpg", size=4096))
    data = path.read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[:2048])
    with pytest.raises(ShardError, match="past the end"):
        scan_tar(tmp_path / "cut.tar")
    header = bytearray(data[:512])
    header[124:136] = b"77777777777\0"  # 8 GiB declared
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}\0 ".encode()
    (tmp_path / "huge.tar").write_bytes(bytes(header) + data[512:])
    with pytest.raises(ShardError, match="past the end"):
        scan_tar(tmp_path / "huge.tar")
    assert [m.name for m in scan_tar(path)] == ["000.jpg"]
