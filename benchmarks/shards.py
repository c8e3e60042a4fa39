"""Image stores side by side, one core: `python -m benchmarks.shards` (small: 1,500 images) or
`--images 20000 --rows 2900000` (closer to the papers' size; run it on a quiet machine).

Synthetic JPEGs of the size a resize-on-fetch stores (512 px shorter side, quality 90, ~50-80 KB) are written once as
one file per image (today's folder store), as this project's shards (`pipelines.shards`, WebDataset layout), and, when
the packages are installed (`/work/venvs/shards`, see docs/shards.md), as litdata chunks, mosaicml-streaming MDS shards,
a Parquet file (row groups of 1,000) and an Arrow IPC file (memory-mapped). Each store is then read under the
training protocol's access pattern: a seeded permutation of all rows (EpochSampler), read + decode (PIL, RGB) per
image; also sequentially, and read only (bytes, no decode). WebDataset itself (`webdataset` 1.0.2) streams the same
tars sequentially; random access through it needs a shuffle buffer, which changes which rows share a batch: it is
measured sequentially only. Rates are best of `--repeats`, stores interleaved within each repeat, one process.

Startup is the time to open a store and reach its first image; at the papers' 2.9M rows it is extrapolated
linearly. The run key (`images_fingerprint`) and `read_manifest(check_files=True)` are timed on `--rows` rows (the
folder store's per-file stat measured on the files here and extrapolated; the shard store's manifest of `--rows` rows
over `--rows / 10,000` shards built in place) and extrapolated to 2.9M. Writes benchmarks/shards.json.
"""
from __future__ import annotations

import importlib.machinery
import io
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from pipelines.cli import parser, run_main
from pipelines.data import make_row, read_manifest, write_manifest
from pipelines.fingerprint import images_fingerprint
from pipelines.io import atomic_write_json
from pipelines.shards import PackConfig, pack_manifest
from pipelines.store import STORE_FILE, ShardRecord, store_document

PAPER_ROWS = 2_912_168  # Open-Insects' global moth images (REFERENCE.md)


def synthetic_jpeg(rng: np.random.Generator, short: int = 512) -> bytes:
    """A photo-like JPEG (smooth colour fields plus texture) at `short` px on the shorter side, aspect 4:3."""
    low = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
    image = Image.fromarray(low).resize((short * 4 // 3, short), Image.Resampling.BICUBIC)
    noise = rng.normal(0, 12, (short, short * 4 // 3, 3))
    pixels = np.clip(np.asarray(image, dtype=np.float64) + noise, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def decode(data: bytes) -> None:
    with Image.open(io.BytesIO(data)) as image:
        image.convert("RGB").load()


# -- stores: each gives (open, n, get(i) -> bytes) ---------------------------------------------------------------------
class Store:
    name = ""
    random_access = True

    def open(self) -> None: ...

    def get(self, i: int) -> bytes: ...

    def sequential(self):
        for i in range(self.n):
            yield self.get(i)


class FolderStore(Store):
    name = "folder (one file per image)"

    def __init__(self, folder: Path):
        self.folder = folder

    def open(self) -> None:
        self.manifest = read_manifest(self.folder)
        self.n = len(self.manifest)

    def get(self, i: int) -> bytes:
        with self.manifest.path(self.manifest.rows[i]).open("rb") as fh:
            return fh.read()


class ShardStore(FolderStore):
    name = "oodforge shards (indexed WebDataset tar)"


class WebDatasetStore(Store):
    name = "webdataset 1.0.2 (same tars, streamed)"
    random_access = False

    def __init__(self, urls: list[str]):
        self.urls = urls

    def open(self) -> None:
        import webdataset as wds

        self.dataset = wds.WebDataset(self.urls, shardshuffle=False, empty_check=False)
        self.n = None

    def sequential(self):
        for sample in self.dataset:
            yield sample["jpg"]


class WidsStore(Store):
    name = "wids 0.1.11 (same tars, indexed)"

    def __init__(self, descriptor: Path):
        self.descriptor = descriptor

    def open(self) -> None:
        import wids

        self.dataset = wids.ShardListDataset(str(self.descriptor), keep=True, transformations=[])
        self.n = len(self.dataset)

    def get(self, i: int) -> bytes:
        return self.dataset[i][".jpg"].getvalue()  # wids hands a BytesIO per member


class LitdataStore(Store):
    name = "litdata (optimize chunks)"

    def __init__(self, folder: Path):
        self.folder = folder

    def open(self) -> None:
        import litdata

        self.dataset = litdata.StreamingDataset(str(self.folder))
        self.n = len(self.dataset)

    def get(self, i: int) -> bytes:
        return self.dataset[i]["jpg"]


class MdsStore(Store):
    name = "mosaicml-streaming MDS"

    def __init__(self, folder: Path):
        self.folder = folder

    def open(self) -> None:
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        self.dataset = StreamingDataset(local=str(self.folder), shuffle=False, batch_size=1)
        self.n = len(self.dataset)

    def get(self, i: int) -> bytes:
        return self.dataset.get_item(i)["jpg"]


class ParquetStore(Store):
    name = "Parquet (binary column, row groups of 1,000)"

    def __init__(self, path: Path):
        self.path = path

    def open(self) -> None:
        import pyarrow.parquet as pq

        self.file = pq.ParquetFile(self.path)
        self.group = self.file.metadata.row_group(0).num_rows
        self.n = self.file.metadata.num_rows
        self.cached: tuple[int, Any] | None = None

    def get(self, i: int) -> bytes:  # random access reads (and decompresses) the whole row group of the row
        g, k = divmod(i, self.group)
        if self.cached is None or self.cached[0] != g:
            self.cached = (g, self.file.read_row_group(g, columns=["jpg"]).column(0))
        return self.cached[1][k].as_py()


class ArrowStore(Store):
    name = "Arrow IPC (binary column, memory-mapped)"

    def __init__(self, path: Path):
        self.path = path

    def open(self) -> None:
        import pyarrow as pa

        self.column = pa.ipc.open_file(pa.memory_map(str(self.path))).read_all().column("jpg")
        self.n = len(self.column)

    def get(self, i: int) -> bytes:
        return self.column[i].as_py()


# -- writing the stores ------------------------------------------------------------------------------------------------
def stub_torchvision() -> None:
    """mosaicml-streaming and litdata import torchvision at import time; torchvision cannot sit beside CPU torch 2.13
    here (REFERENCE.md), so the benchmark gives them an empty stand-in (they read bytes, never torchvision)."""
    if "torchvision" in sys.modules:
        return
    try:
        import torchvision  # noqa: F401
        return
    except ImportError:
        pass
    for name in ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional",
                 "torchvision.io"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__path__ = []
        sys.modules[name] = module
    sys.modules["torchvision.datasets"].VisionDataset = object
    sys.modules["torchvision"].datasets = sys.modules["torchvision.datasets"]
    functional = sys.modules["torchvision.transforms.functional"]
    functional.to_tensor = functional.to_pil_image = lambda *a, **k: None


def write_stores(work: Path, images: int, seed: int) -> tuple[list[Store], dict[str, Any]]:
    rng = np.random.default_rng(seed)
    folder = work / "folder"
    rows, blobs = [], []
    for i in range(images):
        name = f"s{i % 97:02d}/{i:07d}.jpg"
        data = synthetic_jpeg(rng)
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
        rows.append(make_row(name, split="train", label=i % 97))
        blobs.append(data)
    write_manifest(folder, rows)
    info: dict[str, Any] = {"mean_image_bytes": float(np.mean([len(b) for b in blobs])), "missing": {}}
    start = time.perf_counter()
    pack_manifest(folder, work / "shards", PackConfig(samples_per_shard=max(1, images // 4), resize="none"))
    info["pack_seconds"] = time.perf_counter() - start
    tars = sorted(str(p) for p in (work / "shards" / "shards").glob("*.tar"))
    stores: list[Store] = [FolderStore(folder), ShardStore(work / "shards")]
    optional: list[tuple[str, Callable[[], Store]]] = []
    try:
        import webdataset  # noqa: F401
        optional.append(("webdataset", lambda: WebDatasetStore(tars)))
    except ImportError:
        info["missing"]["webdataset"] = "not installed"
    try:
        import wids  # noqa: F401
        optional.append(("wids", lambda: WidsStore(work / "shards" / "shards" / STORE_FILE)))
    except ImportError:
        info["missing"]["wids"] = "not installed"
    for key, writer in (("litdata", write_litdata), ("mosaicml-streaming", write_mds), ("pyarrow", write_arrow)):
        try:
            optional += writer(work, blobs)
        except ImportError as err:
            info["missing"][key] = f"not installed ({err.name})"
    for _name, make in optional:
        stores.append(make())
    return stores, info


def _litdata_item(blob: bytes) -> dict[str, Any]:
    return {"jpg": blob}


def write_litdata(work: Path, blobs: list[bytes]) -> list[tuple[str, Callable[[], Store]]]:
    stub_torchvision()
    import litdata

    out = work / "litdata"
    litdata.optimize(fn=_litdata_item, inputs=blobs, output_dir=str(out), chunk_bytes="64MB", num_workers=1,
                     mode="overwrite")
    return [("litdata", lambda: LitdataStore(out))]


def write_mds(work: Path, blobs: list[bytes]) -> list[tuple[str, Callable[[], Store]]]:
    stub_torchvision()
    from streaming import MDSWriter

    out = work / "mds"
    with MDSWriter(out=str(out), columns={"jpg": "bytes"}, size_limit=1 << 26) as writer:
        for blob in blobs:
            writer.write({"jpg": blob})
    return [("mds", lambda: MdsStore(out))]


def write_arrow(work: Path, blobs: list[bytes]) -> list[tuple[str, Callable[[], Store]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"jpg": pa.array(blobs, pa.binary())})
    pq.write_table(table, work / "images.parquet", row_group_size=1000, compression="none")
    with pa.OSFile(str(work / "images.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return [("parquet", lambda: ParquetStore(work / "images.parquet")),
            ("arrow", lambda: ArrowStore(work / "images.arrow"))]


# -- measuring ---------------------------------------------------------------------------------------------------------
def measure(store: Store, order: np.ndarray, limit: int) -> dict[str, float]:
    start = time.perf_counter()
    store.open()
    first = next(iter(store.sequential()))
    found = {"startup_s": time.perf_counter() - start}
    decode(first)
    if store.random_access:
        picked = order[:limit]
        start = time.perf_counter()
        for i in picked:
            store.get(int(i))
        found["random_read_img_s"] = len(picked) / (time.perf_counter() - start)
        start = time.perf_counter()
        for i in picked:
            decode(store.get(int(i)))
        found["random_img_s"] = len(picked) / (time.perf_counter() - start)
    start, count = time.perf_counter(), 0
    for blob in store.sequential():
        decode(blob)
        count += 1
        if count >= limit:
            break
    found["sequential_img_s"] = count / (time.perf_counter() - start)
    return found


def key_costs(work: Path, files: int, rows: int) -> dict[str, Any]:
    """images_fingerprint and read_manifest(check_files) on a folder store of `files` small files (100 a folder) and
    on a shard manifest of `rows` rows (its shards are placeholders recorded in store.json; only their stat is read)."""
    folder = work / "keys"
    names = [f"s{i // 100:05d}/{i:07d}.jpg" for i in range(files)]
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(os.urandom(64 * 1024))  # about a stored image's bytes, for content mode
    write_manifest(folder, [make_row(n, split="train", label=i % 97) for i, n in enumerate(names)])
    manifest = read_manifest(folder)
    found: dict[str, Any] = {}
    for mode in ("stat", "content"):
        start = time.perf_counter()
        images_fingerprint(manifest, mode)
        found[f"folder_key_{mode}_s_per_row"] = (time.perf_counter() - start) / files
    start = time.perf_counter()
    for row in manifest.rows:
        (manifest.root / row["file_name"]).is_file()
    found["folder_check_files_before_s_per_row"] = (time.perf_counter() - start) / files
    start = time.perf_counter()
    read_manifest(folder, check_files=True)
    found["folder_read_check_files_s_per_row"] = (time.perf_counter() - start) / files
    start = time.perf_counter()
    read_manifest(folder)
    found["folder_read_s_per_row"] = (time.perf_counter() - start) / files

    store = work / "big" / "shards"
    store.mkdir(parents=True, exist_ok=True)
    per = 10_000
    records = []
    for k in range(-(-rows // per)):
        path = store / f"{k:06d}.tar"
        path.write_bytes(b"\0" * 1024)
        st = path.stat()
        records.append(ShardRecord(path.name, st.st_size, st.st_mtime_ns, f"{k:064x}", min(per, rows - k * per)))
    atomic_write_json(store / STORE_FILE, store_document(records))
    big = [dict(make_row(f"s{i % 97:02d}/{i:07d}.jpg", split="train", label=i % 97), shard_file=f"{i // per:06d}.tar",
                shard_member=f"{i:09d}.jpg", shard_offset=512, shard_bytes=1) for i in range(rows)]
    write_manifest(work / "big", big)
    (work / "big" / "manifest_info.json").write_text(json.dumps({"image_root": "shards", "store": "shards"}))
    del big
    start = time.perf_counter()
    sharded = read_manifest(work / "big")
    found["shard_read_s_per_row"] = (time.perf_counter() - start) / rows
    for mode in ("stat",):
        start = time.perf_counter()
        images_fingerprint(sharded, mode)
        found[f"shard_key_{mode}_s_per_row"] = (time.perf_counter() - start) / rows
    from pipelines.data import missing_images

    start = time.perf_counter()
    list(missing_images(sharded))
    found["shard_check_files_s_per_row"] = (time.perf_counter() - start) / rows
    found["shard_key_content_note"] = ("content mode re-hashes each shard once per run: the bytes of the store, "
                                       "I/O- and sha256-bound (sha256_mb_s below)")
    blob = os.urandom(1 << 26)
    import hashlib

    start = time.perf_counter()
    hashlib.sha256(blob).hexdigest()
    found["sha256_mb_s"] = 64 / (time.perf_counter() - start) * (1 << 20) / 1e6
    found["rows"], found["files"] = rows, files
    shutil.rmtree(work / "big")
    shutil.rmtree(folder)
    return found


def best_of_repeats(stores: list[Store], order: np.ndarray, images: int,
                    repeats: int) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Each store measured `repeats` times, interleaved, keeping the best of each number (the least seconds, the most
    images a second); a store that raises is reported in the errors and not measured again."""
    best: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for store in stores:
            if store.name in errors:
                continue
            try:
                found = measure(store, order, images)
            except Exception as err:  # a candidate that fails here is reported, the others go on
                errors[store.name] = f"{type(err).__name__}: {err}"[:300]
                continue
            mine = best.setdefault(store.name, {})
            for key, value in found.items():
                keep = min if key.endswith("_s") and not key.endswith("img_s") else max
                mine[key] = keep(mine.get(key, value), value)
    return best, errors


def add_ratios(best: dict[str, dict[str, float]], images: int) -> None:
    """Adds each store's startup at the paper's rows and its rates against the folder store's."""
    for found in best.values():
        found["startup_at_paper_rows_s"] = found["startup_s"] * PAPER_ROWS / images
    base = best[FolderStore.name]
    for found in best.values():
        for key in ("random_img_s", "sequential_img_s", "random_read_img_s"):
            if key in found:
                found[key.replace("_img_s", "_ratio_vs_folder")] = found[key] / base[key]


def print_stores(best: dict[str, dict[str, float]]) -> None:
    """One line a store: its rates, its ratio to the folder store, its startup."""
    width = max(len(n) for n in best)
    print(f"{'store':<{width}}  random img/s  (ratio)  sequential img/s  read-only random img/s  startup s (at 2.9M)")
    for name, f in best.items():
        random = (f"{f['random_img_s']:12.0f}  ({f['random_ratio_vs_folder']:.2f})" if "random_img_s" in f
                  else f"{'-':>12}  (  - )")
        read = f"{f['random_read_img_s']:22.0f}" if "random_read_img_s" in f else f"{'-':>22}"
        print(f"{name:<{width}}  {random}  {f['sequential_img_s']:16.0f}  {read}  {f['startup_s']:.3f} "
              f"({f['startup_at_paper_rows_s']:.0f})")


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--images", type=int, default=1500, help="synthetic images (default 1500)")
    p.add_argument("--rows", type=int, default=300_000, help="rows of the key / check_files timing (default 300000)")
    p.add_argument("--key-files", type=int, default=20_000,
                   help="files of the folder store's key timing (default 20000)")
    p.add_argument("--repeats", type=int, default=3, help="repeats, stores interleaved (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default a temporary one)")
    p.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_shards_"))
    try:
        stores, info = write_stores(work, args.images, args.seed)
        order = np.random.default_rng([args.seed, 1]).permutation(args.images)  # one epoch's EpochSampler order
        best, errors = best_of_repeats(stores, order, args.images, args.repeats)
        add_ratios(best, args.images)
        keys = key_costs(work, args.key_files, args.rows)
        keys_paper = {k.replace("_s_per_row", "_at_paper_rows_s"): v * PAPER_ROWS for k, v in keys.items()
                      if k.endswith("_s_per_row")}
        result = {"benchmark": "shards", "created": datetime.now(UTC).isoformat(timespec="seconds"),
                  "python": platform.python_version(),
                  "settings": {"images": args.images, "rows": args.rows, "key_files": args.key_files,
                                                                    "repeats": args.repeats, "image_short_side": 512,
                                                                    "jpeg_quality": 90},
                  **info, "stores": best, "failed": errors, "keys": keys, "keys_at_paper_rows": keys_paper,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    print_stores(best)
    for name, reason in {**errors, **info["missing"]}.items():
        print(f"{name}: {reason}")
    print("at 2.9M rows, seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in keys_paper.items()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
