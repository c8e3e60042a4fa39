"""Benchmark feature-level detectors at paper scale: streamed fits from memory-mapped float16 caches.

For each train size (default 100k, 400k and 1.28M rows x 2048, ImageNet-1k scale) a synthetic feature cache is written
to disk in float16 (features and logits), then every feature-level detector is fitted and scored in a fresh process
(so its peak resident set is its own) from `FeatureCache.load(path, mmap=True)`. Each time is compared with its floor:
  read floor  = one streamed pass over the train features (float16 -> float64 chunks), measured, times the passes the
                method needs at least (ViM 2: covariance, then residuals; the others 1);
  GEMM floor  = the method's dense products (table FLOPS) at the matmul rates measured around each run.
Side by side, pytorch-ood 0.4 (Mahalanobis, RMD, ViM, KNN, DICE, SHE, NCI) runs on the same data held in memory as
float32 tensors, where that fits (`--pytorch-ood-max-rows`). pytorch-ood is imported without its package
`__init__` (which pulls torchvision, not installable beside CPU torch here): only `pytorch_ood.detector` is loaded,
no torchvision stand-in is needed. It is never a project dependency (`pip install --no-deps pytorch-ood` to compare).
KNN's float16 IVF index is compared with the exact search (recall of the k neighbours, score error).
Finally the species-manifest writer (gen.insects.write_splits) is timed against a per-row baseline writer on ~2M rows.

    python -m benchmarks.scale                                   # full: 100k, 400k, 1.28M rows (~8 GB of temp files)
    python -m benchmarks.scale --sizes 20000 50000 --test 2000 --only mds vim knn --manifest-occurrences 100000
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DETECTORS = ["mds", "rmds", "vim", "neco", "nci", "react", "dice", "she", "knn", "ash"]
POOD = {"mds": "Mahalanobis", "rmds": "RMD", "vim": "ViM", "knn": "KNN", "dice": "DICE", "she": "SHE", "nci": "NCI"}
TRAIN_PASSES = {"vim": 2, "ash": 0}  # minimal passes over the train features (others: 1)
POOD_SCORE_ROWS = 128  # pytorch-ood scores one 128-row batch, timed and extrapolated linearly to all test rows


# -- synthetic caches ---------------------------------------------------------------------------------------------
def write_cache(path: Path, n: int, dim: int, classes: int, seed: int, chunk: int = 16384) -> None:
    """A safetensors feature cache written chunk by chunk: features and logits float16, ReLU'd Gaussian clusters."""
    rng = np.random.default_rng(0)  # the same centres and head for every file
    centres = rng.normal(0.0, 1.0, (classes, dim)).astype(np.float32)
    weight = (centres * 0.05).astype(np.float32)
    bias = rng.normal(0.0, 0.1, classes).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n).astype(np.int64)
    layout = [("features", "F16", (n, dim), 2), ("logits", "F16", (n, classes), 2), ("labels", "I64", (n,), 8),
              ("index", "I64", (n,), 8), ("head.weight", "F32", (classes, dim), 4), ("head.bias", "F32", (classes,), 4)]
    header, offset = {"__metadata__": {"model": "synthetic", "dtype": "float16"}}, 0
    for name, dtype, shape, size in layout:
        nbytes = int(np.prod(shape)) * size
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little"))
        fh.write(text)
        logits = []
        for start in range(0, n, chunk):
            block = rng.standard_normal((min(chunk, n - start), dim), dtype=np.float32)
            block += centres[labels[start:start + chunk]]
            np.maximum(block, 0.0, out=block)
            half = block.astype(np.float16)
            fh.write(half.tobytes())
            logits.append((half.astype(np.float32) @ weight.T + bias).astype(np.float16))
        for block in logits:
            fh.write(block.tobytes())
        fh.write(labels.tobytes())
        fh.write(np.arange(n, dtype=np.int64).tobytes())
        fh.write(weight.tobytes())
        fh.write(bias.tobytes())
    tmp.rename(path)


# -- machine rates ------------------------------------------------------------------------------------------------
def rates(dim: int, classes: int, rows: int = 4096) -> dict[str, float]:
    """GFLOP/s now: float64 x.T @ x (symmetric rank-k, counted as rows * dim^2), float64 and float32 products."""
    rng = np.random.default_rng(0)
    x64 = rng.random((rows, dim))
    x32, w32 = x64.astype(np.float32), rng.random((dim, classes)).astype(np.float32)
    w64 = rng.random((dim, 1000))
    out = {}
    for key, fn, flops in (("syrk64", lambda: x64.T @ x64, rows * dim ** 2),
                           ("gemm64", lambda: x64 @ w64, 2 * rows * dim * 1000),
                           ("gemm32", lambda: x32 @ w32, 2 * rows * dim * classes)):
        fn()
        start = time.perf_counter()
        fn()
        out[key] = flops / (time.perf_counter() - start) / 1e9
    return out


def gemm_seconds(name: str, n: int, m: int, dim: int, classes: int, rate: dict[str, float],
                 knn_m: int) -> tuple[float, float]:
    """(fit, score) seconds of the method's dense products at `rate` (FLOPS table of docs/bench_scale.md)."""
    k = 1000 if dim >= 2048 else (256 if dim >= 512 else dim // 2)
    k = min(k, dim - k)  # ViM keeps the smaller basis
    s64, g64, g32 = (rate[key] * 1e9 for key in ("syrk64", "gemm64", "gemm32"))
    eigh = (8 / 3 * dim ** 3 + 4 * dim ** 2 * k) / g64
    inverse = 2 * dim ** 3 / g64
    head = lambda rows: 2 * rows * dim * classes / g32  # noqa: E731
    table = {
        "mds": (n * dim ** 2 / s64 + inverse, (2 * m * dim ** 2 + 2 * m * dim * classes) / g64),
        "rmds": (n * dim ** 2 / s64 + 2 * inverse, (4 * m * dim ** 2 + 2 * m * dim * classes) / g64),
        # ViM's alpha reads the cache's logits (the head's outputs), so its fit has no N x D x C product
        "vim": (n * dim ** 2 / s64 + eigh + 2 * n * dim * k / g32, head(m) + 2 * m * dim * k / g32),
        "neco": (n * dim ** 2 / s64 + eigh, 2 * m * dim * k / g64),
        "knn": (0.0, 2 * knn_m * n * dim / g32),
        "ash": (0.0, 2 * m * round(dim * 0.1) * classes / g32),
    }
    return table.get(name, (0.0, head(m)))


# -- child processes ----------------------------------------------------------------------------------------------
def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in this (fresh) process; returns times and the peak resident set."""
    import warnings

    warnings.filterwarnings("ignore")
    from pipelines.features import FeatureCache

    load = lambda key: FeatureCache.load(spec[key], mmap=True)  # noqa: E731
    train, val, test = load("train"), load("val"), load("test")
    if spec["what"] == "read":
        from detectors.posthoc import streaming

        start = time.perf_counter()
        for _, block in streaming.chunks(train.features, np.float64):
            block.sum()
        return {"read_s": time.perf_counter() - start, **_rss()}
    test_rows = slice(0, spec["knn_test"]) if spec["name"] == "knn" else slice(0, len(test))
    if spec["what"] == "ours":
        import detectors
        from detectors import FeatureSet

        det = detectors.build(spec["name"], **spec.get("params", {}))
        base = _rss()["peak_rss_mb"]
        start, cpu = time.perf_counter(), time.process_time()
        det.fit(train.to_featureset(), head=train.head(), id_val=val.to_featureset())
        fit_s, fit_cpu = time.perf_counter() - start, time.process_time() - cpu
        queries = FeatureSet(test.features[test_rows], test.logits[test_rows], test.labels[test_rows])
        start, cpu = time.perf_counter(), time.process_time()
        scores = det.score(queries)
        out = {"fit_s": fit_s, "fit_cpu_s": fit_cpu, "score_s": time.perf_counter() - start,
               "score_cpu_s": time.process_time() - cpu, "baseline_rss_mb": base, **_rss()}
        np.save(spec["scores"], scores)
        if spec.get("recall_against"):
            out.update(knn_recall(det, queries, scores, spec))
        return out
    return pytorch_ood_run(spec, train, test, test_rows)


def knn_recall(det: Any, queries: Any, scores: np.ndarray, spec: dict[str, Any]) -> dict[str, Any]:
    """Recall of the k exact neighbours by an approximate index, and its largest score error against the exact KNN."""
    import faiss

    from detectors.posthoc import streaming
    from detectors.posthoc.knn import l2_normalise
    from pipelines.features import FeatureCache

    k = int(det.params["k"])
    q = l2_normalise(queries.features)
    _, found = det._index.search(q, k)
    best_d, best_i = None, None
    for rows, block in streaming.chunks(FeatureCache.load(spec["train"], mmap=True).features):
        d, i = faiss.knn(q, l2_normalise(block), k)
        d, i = ((d, i + rows.start) if best_d is None else (np.concatenate([best_d, d], 1),
                                                            np.concatenate([best_i, i + rows.start], 1)))
        keep = np.argpartition(d, k - 1, axis=1)[:, :k]
        best_d, best_i = np.take_along_axis(d, keep, 1), np.take_along_axis(i, keep, 1)
    recall = float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(found, best_i)]))
    exact = np.load(spec["recall_against"])
    return {"recall_at_k": recall, "max_abs_score_diff": float(np.max(np.abs(scores - exact)))}


def pytorch_ood_detector(name: str, weight: Any, bias: Any):
    """pytorch-ood's detector class, imported without the package __init__ (which imports torchvision)."""
    import importlib.util
    import types

    import torch

    if "pytorch_ood" not in sys.modules:
        found = importlib.util.find_spec("pytorch_ood")
        if found is None:
            raise ImportError("pytorch-ood is not installed (pip install --no-deps pytorch-ood)")
        package = types.ModuleType("pytorch_ood")
        package.__path__ = list(found.submodule_search_locations)
        sys.modules["pytorch_ood"] = package
    import pytorch_ood.detector as pood

    linear = torch.nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    dim = weight.shape[1]
    d = 1000 if dim >= 2048 else (256 if dim >= 512 else dim // 2)
    return {"mds": lambda: pood.Mahalanobis(None), "rmds": lambda: pood.RMD(None), "knn": lambda: pood.KNN(None, k=50),
            "vim": lambda: pood.ViM(None, d=d, w=weight, b=bias),
            "dice": lambda: pood.DICE(None, w=weight, b=bias, p=0.9),
            "she": lambda: pood.SHE(None, head=linear), "nci": lambda: pood.NCI(None, head=linear, alpha=1e-4)}[name]()


def pytorch_ood_run(spec: dict[str, Any], train: Any, test: Any, test_rows: slice) -> dict[str, Any]:
    """pytorch-ood's fit_features / predict_features on float32 tensors in memory (loading not timed)."""
    import torch

    z = torch.from_numpy(np.asarray(train.features, dtype=np.float32))
    y = torch.from_numpy(np.asarray(train.labels))
    q = torch.from_numpy(np.asarray(test.features[test_rows], dtype=np.float32))
    det = (pytorch_ood_detector(spec["name"], torch.from_numpy(np.array(train.head_weight)),
                                torch.from_numpy(np.array(train.head_bias))))
    base = _rss()["peak_rss_mb"]
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        det.fit_features(z, y)
    fit_s, fit_cpu = time.perf_counter() - start, time.process_time() - cpu
    rows = min(len(q), POOD_SCORE_ROWS)  # its Mahalanobis scores class by class: D^2 work per class and row
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        det.predict_features(q[:rows])
    scale = len(q) / rows
    return {"fit_s": fit_s, "fit_cpu_s": fit_cpu, "score_s": (time.perf_counter() - start) * scale,
            "score_cpu_s": (time.process_time() - cpu) * scale, "score_rows_timed": rows, "baseline_rss_mb": base,
            **_rss()}


def _rss() -> dict[str, float]:
    """This process's peak resident set: VmHWM of its own address space (ru_maxrss would also count the parent's
    peak, which Linux carries over fork and exec)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return {"peak_rss_mb": int(line.split()[1]) / 1024}
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--child", json.dumps(spec)], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- manifests ----------------------------------------------------------------------------------------------------
def previous_write_splits_rows(frame: Any, non_target_name: str) -> list[dict[str, Any]]:
    """The per-row baseline writer: a dict per row, then aux_label deleted from the non-auxiliary rows."""
    from gen.insects import manifest_table, object_columns

    # the same table and columns as write_splits: only the per-row dicts and key deletions differ, the cost measured
    columns = object_columns(manifest_table(frame, non_target_name))
    if "aux_label" in frame.columns:
        columns["aux_label"] = frame["aux_label"].fillna(-1).astype(np.int64).tolist()
    names = list(columns)
    rows = [dict(zip(names, values)) for values in zip(*columns.values())]
    if "aux_label" in columns:
        for row in rows:
            if row["ood_set"] != "auxiliary":
                del row["aux_label"]
    return rows


def bench_manifests(occurrences: int, workdir: Path) -> dict[str, Any]:
    """write_splits against the per-row baseline (a dict, validate_row and json.dumps per row; the same file writes and
    summary)."""
    from gen.insects import SplitConfig, build_splits, read_id_species, summarize, synthetic_occurrences, write_splits
    from pipelines.data import validate_row
    from pipelines.io import atomic_write_bytes, atomic_write_json, atomic_write_text

    occ, ids = synthetic_occurrences(occurrences, seed=0)
    splits = build_splits(occ, read_id_species(ids), SplitConfig(target_taxon="moth", seed=0))
    rows_written = sum(len(f) for f in splits.regions.values())
    out = workdir / "manifests"
    start, cpu = time.perf_counter(), time.process_time()
    written = write_splits(splits, out / "new", image_root=workdir)
    new_s, new_cpu = time.perf_counter() - start, time.process_time() - cpu
    start, cpu = time.perf_counter(), time.process_time()
    previous = {}
    for region, frame in splits.regions.items():
        rows = previous_write_splits_rows(frame, splits.config.non_target_name)
        seen = set()
        for number, row in enumerate(rows, start=1):
            validate_row(row, "metadata.jsonl", number)
            assert row["file_name"] not in seen
            seen.add(row["file_name"])
        previous[region] = "".join(json.dumps(r, default=str) + "\n" for r in rows).encode()
        atomic_write_bytes(out / "old" / region / "metadata.jsonl", previous[region])
        atomic_write_json(out / "old" / region / "manifest_info.json", {"image_root": str(workdir), "region": region,
                                                                        "config": splits.config.to_dict()})
    summary = summarize(splits)
    atomic_write_text(out / "old" / "summary.csv", summary.to_csv(index=False))
    old_s, old_cpu = time.perf_counter() - start, time.process_time() - cpu
    same = all((written[r] / "metadata.jsonl").read_bytes() == previous[r] for r in written)
    shutil.rmtree(out, ignore_errors=True)
    return {"occurrences": occurrences, "rows_written": rows_written, "write_splits_s": new_s,
            "write_splits_cpu_s": new_cpu,
            "previous_writer_s": old_s, "previous_writer_cpu_s": old_cpu, "speedup": old_s / new_s,
            "speedup_cpu": old_cpu / new_cpu, "byte_identical": same,
            "note": "previous writer = former manifest_rows + validate_row + json.dumps per row, file writes and "
            "summary"}


# -- driver -------------------------------------------------------------------------------------------------------
def markdown(result: dict[str, Any]) -> str:
    f = lambda v, spec=".2f": "—" if v is None else format(v, spec)  # noqa: E731
    lines = ["| rows | detector | fit s | fit / floor | score s | peak RSS MiB | fit µs/row | "
             "pytorch-ood fit+score s | pytorch-ood / ours | pytorch-ood peak RSS MiB |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["runs"]:
        if "error" in r:
            lines.append(f"| {r['rows']} | {r['detector']} | error: {r['error']} |||||||||")
            continue
        p = r.get("pytorch_ood") or {}
        lines.append(f"| {r['rows']} | {r['detector']} | {r['fit_s']:.2f} | {f(r['fit_over_floor'])} | "
                     f"{r['score_s']:.2f} | "
                     f"{r['peak_rss_mb']:.0f} | {f(r['fit_us_per_row'], '.3f')} | "
                     f"{f(p.get('total_s')) if 'total_s' in p else p.get('error', '—')} | {f(p.get('ratio'))} | "
                     f"{f(p.get('peak_rss_mb'), '.0f')} |")
    lines += ["", "| detector | µs per train row by size (fit; KNN: score) | largest / smallest |", "|---|---|---:|"]
    for name, row in result["linearity"].items():
        lines.append(f"| {name} | {', '.join(f'{k}: {v:.3f}' for k, v in row['us_per_row'].items())} | "
                     f"{f(row['growth'])} |")
    if result.get("knn_ivf"):
        k = result["knn_ivf"]
        lines += ["",
                  f"KNN `index='ivf'` (float16, nprobe {k['nprobe']}) at {k['rows']} rows: fit {k['fit_s']:.1f} s, "
                  "score "
                      f"{k['score_s']:.2f} s (exact: {k['exact_score_s']:.2f} s), recall@50 {k['recall_at_k']:.4f}, "
                      f"max |score diff| {f(k['max_abs_score_diff'], '.2e')}."]
    if result.get("manifests"):
        m = result["manifests"]
        lines += ["", f"Manifests: {m['rows_written']} rows, write_splits {m['write_splits_s']:.1f} s wall "
                      f"({m['write_splits_cpu_s']:.1f} s CPU), previous writer {m['previous_writer_s']:.1f} s wall "
                      f"({m['previous_writer_cpu_s']:.1f} s CPU): {m['speedup']:.1f}x wall, {m['speedup_cpu']:.1f}x "
                      "CPU, "
                      f"byte-identical: {m['byte_identical']}."]
    return "\n".join(lines)


PRESETS = {  # ImageNet-21k x ViT-B: 13M rows x 768 in float16 (about 20 GB on disk), beside ImageNet-1k's 1.28M rows
    "imagenet21k": ["--sizes", "1280000", "13000000", "--dim", "768", "--only", "mds", "vim", "knn",
                    "--pytorch-ood-max-rows", "0", "--manifest-occurrences", "0", "--out", "benchmarks/scale_21k.json"],
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named set of the options below (given ones win)")
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 400_000, 1_280_000],
                        help="train rows (none: skip)")
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--val", type=int, default=20_000, help="ID val rows (ReAct's percentile)")
    parser.add_argument("--test", type=int, default=10_000, help="rows scored")
    parser.add_argument("--knn-test", type=int, default=1000, help="rows scored by KNN (its cost is test x train)")
    parser.add_argument("--only", nargs="*", default=DETECTORS)
    parser.add_argument("--only-large", nargs="*", default=None,
                        help="detectors run at sizes >= --large-from (default: all)")
    parser.add_argument("--large-from", type=int, default=1_000_000)
    parser.add_argument("--pytorch-ood-max-rows", type=int, default=100_000,
                        help="largest train size run with pytorch-ood (it holds the features as float32 tensors, and "
                        "copies)")
    parser.add_argument("--ivf-rows", type=int, default=None,
                        help="train size for the KNN IVF recall check (default: largest)")
    parser.add_argument("--manifest-occurrences", type=int, default=3_000_000, help="0 skips the manifest benchmark")
    parser.add_argument("--workdir", type=Path, default=None, help="where the temporary caches go (deleted afterwards)")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    parser.add_argument("--update", action="store_true",
                        help="keep the sections of an existing --out that this run skips")
    parser.add_argument("--merge", type=Path, nargs="*", help="combine the JSON of runs made separately into --out")
    args = parser.parse_args(argv)
    if args.preset:  # the preset's values, then the command line's again on top
        return parser.parse_args(PRESETS[args.preset] + list(sys.argv[1:] if argv is None else argv))
    return args


def bench_detector(name: str, n: int, spec: dict[str, Any], reads: dict[str, Any], args: argparse.Namespace,
                   workdir: Path) -> dict[str, Any]:
    """One detector at one train size: our run with its floors, and pytorch-ood's beside it where it applies."""
    before = rates(args.dim, args.classes)
    ours = run_child({**spec, "what": "ours", "name": name, "scores": str(workdir / f"{name}-{n}.npy")}, args.timeout)
    after = rates(args.dim, args.classes)
    rate = {k: (before[k] + after[k]) / 2 for k in before}
    row = {"rows": n, "detector": name, "read_s": reads["train"].get("read_s"), "rates_gflops": rate, **ours}
    if "error" not in ours:
        fit_gemm, score_gemm = gemm_seconds(name, n, args.test, args.dim, args.classes, rate, args.knn_test)
        passes = TRAIN_PASSES.get(name, 1)
        source_read = reads["val"]["read_s"] if name == "react" else reads["train"]["read_s"]
        row["fit_floor_s"] = passes * source_read + fit_gemm if name != "react" else source_read
        row["fit_over_floor"] = ours["fit_s"] / row["fit_floor_s"] if row["fit_floor_s"] > 0 else None
        row["score_floor_s"] = score_gemm
        row["fit_us_per_row"] = ours["fit_s"] / n * 1e6 if name not in ("react", "ash", "knn") else None
    if name in POOD and n <= args.pytorch_ood_max_rows:
        pood = run_child({**spec, "what": "pytorch_ood", "name": name}, args.timeout)
        if "error" not in pood and "error" not in ours:
            pood["total_s"] = pood["fit_s"] + pood["score_s"]
            pood["ratio"] = pood["total_s"] / (ours["fit_s"] + ours["score_s"])
            if "fit_cpu_s" in pood and "fit_cpu_s" in ours:
                pood["ratio_cpu"] = ((pood["fit_cpu_s"] + pood["score_cpu_s"])
                                     / (ours["fit_cpu_s"] + ours["score_cpu_s"]))
        row["pytorch_ood"] = pood
    return row


def bench_size(n: int, caches: dict[str, Path], args: argparse.Namespace, workdir: Path,
               result: dict[str, Any]) -> None:
    """Every chosen detector at train size n (cache written here, deleted after), then KNN's IVF recall check."""
    train = workdir / f"train-{n}.safetensors"
    start = time.perf_counter()
    write_cache(train, n, args.dim, args.classes, seed=3)
    print(f"{n} rows: cache written in {time.perf_counter() - start:.0f} s ({train.stat().st_size / 2**30:.2f} GiB)",
          flush=True)
    spec = {"train": str(train), "val": str(caches["val"]), "test": str(caches["test"]), "knn_test": args.knn_test}
    reads = {"train": run_child({**spec, "what": "read"}, args.timeout),
             "val": run_child({**spec, "train": str(caches["val"]), "what": "read"}, args.timeout)}
    names = (args.only if n < args.large_from or args.only_large is None
             else [m for m in args.only if m in args.only_large])
    for name in names:
        row = bench_detector(name, n, spec, reads, args, workdir)
        result["runs"].append(row)
        print(json.dumps(row), flush=True)
        save(args.out, result, args.update)  # partial results survive an interrupted run
    if n == (args.ivf_rows or max(args.sizes)) and "knn" in args.only:
        exact = workdir / f"knn-{n}.npy"
        ivf = run_child({**spec, "what": "ours", "name": "knn", "params": {"index": "ivf"},
                         "scores": str(workdir / f"knn-ivf-{n}.npy"), "recall_against": str(exact)}, args.timeout)
        exact_row = next(r for r in result["runs"] if r["detector"] == "knn" and r["rows"] == n)
        if "error" not in ivf:
            result["knn_ivf"] = {"rows": n, "nprobe": 16, "exact_score_s": exact_row.get("score_s"), **ivf}
        print(json.dumps(result.get("knn_ivf", ivf)), flush=True)
    train.unlink()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return {}
    if args.merge:
        return merge(args.merge, args.out)
    workdir = Path(tempfile.mkdtemp(prefix="bench_scale-", dir=args.workdir))
    result: dict[str, Any] = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                          "python": platform.python_version()},
                              "sizes": args.sizes, "dim": args.dim, "classes": args.classes, "val": args.val,
                              "test": args.test, "knn_test": args.knn_test, "runs": [], "linearity": {}}
    try:
        caches = {"val": workdir / "val.safetensors", "test": workdir / "test.safetensors"}
        if args.sizes:
            write_cache(caches["val"], args.val, args.dim, args.classes, seed=1)
            write_cache(caches["test"], args.test, args.dim, args.classes, seed=2)
        for n in args.sizes:
            bench_size(n, caches, args, workdir, result)
        result["linearity"] = linearity(result["runs"])
        if args.manifest_occurrences:
            result["manifests"] = bench_manifests(args.manifest_occurrences, workdir)
            print(json.dumps(result["manifests"]), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    save(args.out, result, args.update)
    print(markdown(result))
    return result


def linearity(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Time per train row at each size (fit; KNN: scoring, its search over the bank, since a bank too large for memory
    is searched where it is stored and its fit does nothing), and its growth from the smallest to the largest size."""
    out = {}
    for name in dict.fromkeys(r["detector"] for r in runs):
        key = "score_s" if name == "knn" else "fit_s"
        per_row = {r["rows"]: r[key] / r["rows"] * 1e6 for r in runs
                   if r["detector"] == name and "error" not in r and (name == "knn" or r.get("fit_us_per_row"))}
        if per_row:
            sizes = sorted(per_row)
            out[name] = {"us_per_row": {n: per_row[n] for n in sizes}, "growth": per_row[sizes[-1]] / per_row[sizes[0]]}
    return out


def merge(parts: list[Path], out: Path) -> dict[str, Any]:
    """One result from runs made in separate invocations (e.g. the largest size on its own); for a (size, detector)
    run twice, the later part wins."""
    result: dict[str, Any] = {"runs": []}
    for part in parts:
        data = json.loads(part.read_text())
        result["runs"] += data.pop("runs", [])
        for key, value in data.items():
            if key == "sizes":
                result["sizes"] = sorted(set(result.get("sizes", [])) | set(value))
            elif value or key not in result:
                result[key] = value
    latest = {(r["rows"], r["detector"]): r for r in result["runs"]}  # a later part's rerun replaces an earlier run
    result["runs"] = sorted(latest.values(),
                            key=lambda r: (r["rows"],
                                           DETECTORS.index(r["detector"]) if r["detector"] in DETECTORS else 99))
    result["linearity"] = linearity(result["runs"])
    save(out, result, False)
    print(markdown(result))
    return result


def save(out: Path, result: dict[str, Any], update: bool) -> None:
    """Write the JSON; with `update`, sections this run did not produce are kept from the existing file."""
    from pipelines.io import atomic_write_json

    out.parent.mkdir(parents=True, exist_ok=True)
    merged = dict(result)
    if update and out.is_file():
        previous = json.loads(out.read_text())
        for key, value in previous.items():
            if key not in merged or (key in ("runs", "linearity", "sizes") and not merged[key]):
                merged[key] = value
    atomic_write_json(out, json.loads(json.dumps(merged, default=str)))


if __name__ == "__main__":
    main()
