"""ViM against pytorch-ood 0.4's ViM on the same synthetic features: fit + score time, best of `--repeats`, one run.

For each size (default 20k x 1024 and 100k x 2048, 1,000 classes, 10k test rows) a float16 feature cache is written
(benchmarks/scale.py's writer). Every measurement runs in a fresh process (imports done before the clock starts),
the cases of each repeat in a random order. Ours: `detectors.build("vim")`, fit and score from the memory-mapped float16
cache (the runner's path). pytorch-ood: its `ViM(None, d, w, b)` built (that computes u = -pinv(W) b, part of ViM's fit)
and `fit_features` / `predict_features` on float32 tensors already in memory (loading not timed). Both use ViM's default
principal dimension (1000 for D >= 2048, 256 for D >= 512). The scores are compared with a float64 NumPy computation of
the official recipe (EmpiricalCovariance about u, eigh, alpha = mean max logit / mean residual).

    python -m benchmarks.vim                        # both sizes, 3 repeats -> benchmarks/vim.json
    python -m benchmarks.vim --sizes 20000:1024 --repeats 1
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.scale import _rss, pytorch_ood_detector, write_cache


def principal(dim: int) -> int:
    return 1000 if dim >= 2048 else (256 if dim >= 512 else dim // 2)


def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    import detectors
    from detectors import FeatureSet
    from pipelines.features import FeatureCache

    train, test = FeatureCache.load(spec["train"], mmap=True), FeatureCache.load(spec["test"], mmap=True)
    detectors.build("vim")  # the registry's imports, untimed (as pytorch-ood's import below)
    start, cpu = time.perf_counter(), time.process_time()
    det = detectors.build("vim").fit(train.to_featureset(), head=train.head())
    fit_s, fit_cpu = time.perf_counter() - start, time.process_time() - cpu
    start, cpu = time.perf_counter(), time.process_time()
    scores = det.score(FeatureSet(test.features, test.logits))
    score_s, score_cpu = time.perf_counter() - start, time.process_time() - cpu
    np.save(spec["scores"], scores)
    return {"fit_s": fit_s, "score_s": score_s, "total_s": fit_s + score_s, "cpu_s": fit_cpu + score_cpu, **_rss()}


def run_pytorch_ood(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from pipelines.features import FeatureCache

    train, test = FeatureCache.load(spec["train"], mmap=True), FeatureCache.load(spec["test"], mmap=True)
    z = torch.from_numpy(np.asarray(train.features, dtype=np.float32))
    y = torch.from_numpy(np.asarray(train.labels))
    q = torch.from_numpy(np.asarray(test.features, dtype=np.float32))
    w, b = torch.from_numpy(np.array(train.head_weight)), torch.from_numpy(np.array(train.head_bias))
    pytorch_ood_detector("knn", w, b)  # imports pytorch_ood.detector, untimed
    start, cpu = time.perf_counter(), time.process_time()
    det = pytorch_ood_detector("vim", w, b)  # ViM.__init__: u = -pinv(W) b
    build_s = time.perf_counter() - start
    with torch.no_grad():
        det.fit_features(z, y)
        fit_s = time.perf_counter() - start
        scores = -det.predict_features(q).double().numpy()
    total_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    np.save(spec["scores"], scores)
    return ({"build_s": build_s, "fit_s": fit_s, "score_s": total_s - fit_s, "total_s": total_s, "cpu_s": cpu_s,
             **_rss()})


def run_reference(spec: dict[str, Any]) -> dict[str, Any]:
    """The official recipe in float64 NumPy (not timed): the scores both are compared with."""
    from scipy.special import logsumexp

    from pipelines.features import FeatureCache

    train, test = FeatureCache.load(spec["train"], mmap=True), FeatureCache.load(spec["test"], mmap=True)
    w, b = np.array(train.head_weight, dtype=np.float64), np.array(train.head_bias, dtype=np.float64)
    h, q = np.asarray(train.features, dtype=np.float64), np.asarray(test.features, dtype=np.float64)
    u = -np.linalg.pinv(w) @ b
    t = h - u
    values, vectors = np.linalg.eigh(t.T @ t / len(t))
    null = vectors[:, np.argsort(-values)[principal(h.shape[1]):]]
    alpha = (h @ w.T + b).max(axis=1).mean() / np.linalg.norm(t @ null, axis=1).mean()
    del t, h
    scores = logsumexp(q @ w.T + b, axis=1) - alpha * np.linalg.norm((q - u) @ null, axis=1)
    np.save(spec["scores"], scores)
    return {}


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.vim", "--child", json.dumps(spec)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_size(n: int, dim: int, args: argparse.Namespace, workdir: Path, rng: random.Random) -> dict[str, Any]:
    """Caches for one size, the float64 reference, then `repeats` rounds of both cases in a random order."""
    spec = {"train": str(workdir / f"train-{n}-{dim}.safetensors"), "test": str(workdir / f"test-{dim}.safetensors")}
    write_cache(Path(spec["train"]), n, dim, args.classes, seed=3)
    write_cache(Path(spec["test"]), args.test, dim, args.classes, seed=2)
    files = {case: str(workdir / f"{case}-{n}-{dim}.npy") for case in ("reference", "ours", "pytorch_ood")}
    run_child({**spec, "what": "reference", "scores": files["reference"]})
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "pytorch_ood": []}
    for repeat in range(args.repeats):
        for case in rng.sample(sorted(runs), 2):
            row = {"repeat": repeat, **run_child({**spec, "what": case, "scores": files[case]})}
            runs[case].append(row)
            print(json.dumps({"rows": n, "dim": dim, "case": case, **row}), flush=True)
    reference = np.load(files["reference"])
    out = {"rows": n, "dim": dim, "principal_dim": principal(dim), "runs": runs}
    for case in runs:
        scores = np.load(files[case])
        out[f"{case}_max_abs_diff_vs_float64"] = float(np.max(np.abs(scores - reference)))
    out["reference_score_range"] = float(np.ptp(reference))
    best = {case: min(r["total_s"] for r in rows if "total_s" in r) for case, rows in runs.items()}
    out.update({"ours_best_s": best["ours"], "pytorch_ood_best_s": best["pytorch_ood"],
                "speedup": best["pytorch_ood"] / best["ours"]})
    without_build = min(r["total_s"] - r["build_s"] for r in runs["pytorch_ood"] if "total_s" in r)
    out["speedup_without_their_pinv"] = without_build / best["ours"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", nargs="*", default=["20000:1024", "100000:2048"], help="ROWS:DIM train sizes")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--test", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="seed of the case order")
    parser.add_argument("--workdir", type=Path, default=None, help="where the temporary caches go (deleted afterwards)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        run = {"ours": run_ours, "pytorch_ood": run_pytorch_ood, "reference": run_reference}[spec["what"]]
        print(json.dumps(run(spec)))
        return {}
    workdir = Path(tempfile.mkdtemp(prefix="bench_vim-", dir=args.workdir))
    result: dict[str, Any] = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                          "python": platform.python_version(), "load_avg": os.getloadavg()},
                              "classes": args.classes, "test": args.test, "repeats": args.repeats, "sizes": []}
    rng = random.Random(args.seed)
    try:
        for size in args.sizes:
            n, dim = (int(v) for v in size.split(":"))
            result["sizes"].append(bench_size(n, dim, args, workdir, rng))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for row in result["sizes"]:
        print(f"{row['rows']} x {row['dim']}: ours {row['ours_best_s']:.2f} s, pytorch-ood "
              f"{row['pytorch_ood_best_s']:.2f} s "
              f"-> {row['speedup']:.2f}x ({row['speedup_without_their_pinv']:.2f}x without their pinv)")
    return result


if __name__ == "__main__":
    main()
