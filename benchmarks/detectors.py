"""Benchmark every registered feature/logit-level post-hoc detector against its roofline floor and naive references.

Synthetic data: ReLU'd Gaussian class clusters (float32, as a feature cache holds them) and a random linear head.
First the machine's float32/float64 matmul rates and memory read bandwidth are measured; each detector's floor is
max(unavoidable multiply-adds at the rate of the precision it computes in, bytes it must read at that bandwidth).
Floors use the matmul rates measured just before and after each detector (the machine may be shared).
Side by side, reference formulations (OpenOOD's Mahalanobis `(t @ P @ t.T).diag()` per class, GradNorm with one
autograd backward per sample, scikit-learn's brute NearestNeighbors) are timed on a subsample (one 128-row batch,
1000 rows, 2000 rows by default) and extrapolated linearly in the number of test rows. Then the detectors pytorch-ood
0.4 also ships (`benchmarks/cases/peers.py`: the feature-level methods both ship, and ViM) run beside pytorch-ood's,
fit + score at `--peer-size` (20k x 1024, 200 classes), as ratios measured in the same run. Writes
`benchmarks/detectors.json` and prints markdown tables.

    python -m benchmarks.detectors                       # 50k train, 20k test, 2048-d, 1000 classes; peers
    python -m benchmarks.detectors --n-train 5000 --n-test 2000 --dim 256 --classes 100 --only mds knn
    python -m benchmarks.detectors --peers-only --peers scale vim
"""
from __future__ import annotations

import argparse
import json
import os
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import detectors
from benchmarks.cases import peers
from benchmarks.cases.tools import cpu_model
from detectors import FeatureSet, LinearHead
from pipelines.io import atomic_write_json
from pipelines.progress import progress

Sizes = dict[str, int]
# name -> (sizes, fitted detector) -> {"fit"|"score": (float32 flops, float64 flops)}; flops = 2 x multiply-adds.
FlopFormula = Callable[[Sizes, Any], dict[str, tuple[float, float]]]


def _head_projection(s: Sizes, rows: str = "M") -> float:
    return 2.0 * s[rows] * s["D"] * s["C"]


def _residual_width(det: Any) -> int:
    return det.basis.shape[1]


def _eigh(d: int, vectors: int) -> float:
    """Householder tridiagonalisation (4/3 D^3 multiply-adds) and back-transformation of `vectors` eigenvectors."""
    return 8.0 / 3.0 * d ** 3 + 4.0 * d ** 2 * vectors


def _cholesky_inverse(d: int) -> float:
    """Cholesky factor (D^3/3 multiply-adds) and inverse from it (2 D^3/3)."""
    return 2.0 * d ** 3


FLOPS: dict[str, FlopFormula] = {
    # head projections run in float32 (the model's precision), statistics and quadratic forms in float64
    "react": lambda s, d: {"fit": (0, 0), "score": (_head_projection(s), 0)},
    "dice": lambda s, d: {"fit": (0, 0), "score": (_head_projection(s), 0)},
    # ASH sums only the k kept columns of W per row (k = D - round(D * percentile / 100))
    "ash": lambda s, d: {"fit": (0, 0),
                         "score": (2.0 * s["M"] * (s["D"] - round(s["D"] * d.params["percentile"] / 100)) * s["C"], 0)},
    "fdbd": lambda s, d: {"fit": (0, 2.0 * s["C"] ** 2 * s["D"] / 2), "score": (_head_projection(s), 0)},
    "nci": lambda s, d: {"fit": (0, 0), "score": (_head_projection(s), 0)},
    # covariance N D^2 (symmetric rank-N update), inverse via Cholesky; score: t @ P and t P @ means^T
    "mds": lambda s, d: {"fit": (0, s["N"] * s["D"] ** 2 + _cholesky_inverse(s["D"])),
                         "score": (0, 2.0 * s["M"] * s["D"] ** 2 + 2.0 * s["M"] * s["D"] * s["C"])},
    # one pass of moments gives both the tied and the class-agnostic covariance; two inverses
    "rmds": lambda s, d: {"fit": (0, s["N"] * s["D"] ** 2 + 2 * _cholesky_inverse(s["D"])),
                          "score": (0, 4.0 * s["M"] * s["D"] ** 2 + 2.0 * s["M"] * s["D"] * s["C"])},
    # one distance matrix against the whole bank
    "knn": lambda s, d: {"fit": (0, 0), "score": (2.0 * s["M"] * s["N"] * s["D"], 0)},
    # pinv(W) ~ 2 C D^2, covariance, eigh of the kept basis only; train logits and residuals (alpha) in float32
    "vim": lambda s, d: {"fit": (_head_projection(s, "N") + 2.0 * s["N"] * s["D"] * _residual_width(d),
                                 2.0 * s["C"] * s["D"] ** 2 + s["N"] * s["D"] ** 2 + _eigh(s["D"], _residual_width(d))),
                         "score": (_head_projection(s), 2.0 * s["M"] * s["D"] * _residual_width(d))},
    "neco": lambda s, d: {"fit": (0, s["N"] * s["D"] ** 2 + _eigh(s["D"], d.components.shape[1])),
                          "score": (_head_projection(s) if d.params["max_logit"] else 0,
                                    2.0 * s["M"] * s["D"] * d.components.shape[1])},
    # group A: GradNorm projects through the head in float64; KLM's KL to C class templates is one [M,C] x [C,C] product
    "gradnorm": lambda s, d: {"fit": (0, 0), "score": (0, _head_projection(s))},
    "klm": lambda s, d: {"fit": (0, 0), "score": (0, 2.0 * s["M"] * s["C"] ** 2)},
    # OpenOOD's post-hoc postprocessors (no pytorch-ood peer): Residual is ViM's fit without alpha's train pass
    "residual": lambda s, d: {"fit": (0, 2.0 * s["C"] * s["D"] ** 2 + s["N"] * s["D"] ** 2
                                      + _eigh(s["D"], _residual_width(d))),
                              "score": (2.0 * s["M"] * s["D"] * _residual_width(d), 0)},
    # RELATION: every test row against every banked training row, features and probabilities, float32
    "relation": lambda s, d: {"fit": (0, 0), "score": (2.0 * s["M"] * s["N"] * (s["D"] + s["C"]), 0)},
    # CF-OOD: the reference set's own distance table, then each test row against it, float64
    "cfood": lambda s, d: {"fit": (0, 2.0 * len(d.ref) ** 2 * s["D"]),
                           "score": (0, 2.0 * s["M"] * len(d.ref) * s["D"])},
    "vra": lambda s, d: {"fit": (0, 0), "score": (_head_projection(s), 0)},
    # MC dropout: `times` head projections
    "dropout": lambda s, d: {"fit": (0, 0), "score": (d.params["times"] * _head_projection(s), 0)},
}


def matmul_rate(dtype: Any, size: int = 2048, repeats: int = 3) -> float:
    """GFLOP/s of a square matrix product (numpy, the BLAS every detector uses) in `dtype`."""
    rng = np.random.default_rng(0)
    a, b = rng.random((size, size)).astype(dtype), rng.random((size, size)).astype(dtype)
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2.0 * size ** 3 * repeats / (time.perf_counter() - start) / 1e9


def read_bandwidth(n: int = 50_000_000, repeats: int = 3) -> float:
    """GB/s of a streaming read (sum of a float64 array larger than any cache)."""
    x = np.ones(n)
    x.sum()
    start = time.perf_counter()
    for _ in range(repeats):
        x.sum()
    return x.nbytes * repeats / (time.perf_counter() - start) / 1e9


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class PeakMemory:
    """Peak numpy/Python allocations (tracemalloc) and peak resident-set growth (VmHWM after resetting it), in MB."""

    def __enter__(self) -> PeakMemory:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS counter (Linux)
        except OSError:
            pass
        self.rss_before = _status_kb("VmRSS")
        tracemalloc.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.traced_mb = tracemalloc.get_traced_memory()[1] / 2 ** 20
        tracemalloc.stop()
        self.rss_mb = max(_status_kb("VmHWM") - self.rss_before, 0) / 2 ** 10


def synthetic(n: int, head: LinearHead, centres: np.ndarray, rng: np.random.Generator, chunk: int = 8192) -> FeatureSet:
    """n float32 features relu(centre[label] + N(0, 1)) with their logits through `head`."""
    classes, dim = centres.shape
    labels = rng.integers(0, classes, n)
    features = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, chunk):
        block = rng.standard_normal((min(chunk, n - start), dim), dtype=np.float32)
        block += centres[labels[start:start + chunk]]
        features[start:start + chunk] = np.maximum(block, 0.0)
    logits = head(features)
    return FeatureSet(features, logits, labels)


def make_data(args: argparse.Namespace) -> tuple[FeatureSet, FeatureSet, FeatureSet, LinearHead]:
    rng = np.random.default_rng(args.seed)
    centres = rng.normal(0.0, 1.0, (args.classes, args.dim)).astype(np.float32)
    head = (LinearHead(rng.normal(0.0, 1.0 / np.sqrt(args.dim), (args.classes, args.dim)),
                       rng.normal(0.0, 0.1, args.classes)))
    return (synthetic(args.n_train, head, centres, rng), synthetic(args.n_val, head, centres, rng),
            synthetic(args.n_test, head, centres, rng), head)


def input_bytes(data: FeatureSet, inputs: frozenset[str]) -> float:
    return float(sum(getattr(data, name).nbytes for name in ("features", "logits") if name in inputs))


def floor_seconds(flops: tuple[float, float], nbytes: float, machine: dict[str, float]) -> float:
    compute = flops[0] / (machine["float32_gflops"] * 1e9) + flops[1] / (machine["float64_gflops"] * 1e9)
    return max(compute, nbytes / (machine["read_gbps"] * 1e9))


def timed(fn: Callable[[], Any]) -> tuple[Any, float, PeakMemory]:
    with PeakMemory() as memory:
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
    return out, seconds, memory


def current_rates(machine: dict[str, float]) -> dict[str, float]:
    """Matmul rates measured now (size 1024): the machine may be shared, so floors use rates taken around each run."""
    return ({**machine, "float32_gflops": matmul_rate(np.float32, 1024, 2),
             "float64_gflops": matmul_rate(np.float64, 1024, 2)})


def bench_detector(name: str, train: FeatureSet, val: FeatureSet, test: FeatureSet, head: LinearHead,
                   machine: dict[str, float]) -> tuple[dict[str, Any], Any, np.ndarray]:
    """Fit and score one detector with its defaults; times, peak memory, and floors at the rates measured around it."""
    det = detectors.build(name)
    before = current_rates(machine)
    _, fit_s, fit_mem = timed(lambda: det.fit(train, head=head, id_val=val))
    scores, score_s, score_mem = timed(lambda: det.score(test))
    after = current_rates(machine)
    machine = {**machine, **{key: (before[key] + after[key]) / 2 for key in ("float32_gflops", "float64_gflops")}}
    sizes = {"N": len(train), "M": len(test), "D": train.features.shape[1], "C": train.logits.shape[1]}
    formula = FLOPS.get(name)
    flops = formula(sizes, det) if formula else {"fit": (0.0, 0.0), "score": (0.0, 0.0)}
    fit_floor = floor_seconds(flops["fit"], input_bytes(train, det.inputs) if any(flops["fit"]) else 0.0, machine)
    score_floor = floor_seconds(flops["score"], input_bytes(test, det.inputs), machine)
    row = {"detector": name, "inputs": sorted(det.inputs), "params": det.params, "flop_formula": formula is not None,
           "float32_gflops": machine["float32_gflops"], "float64_gflops": machine["float64_gflops"],
           "fit_s": fit_s, "fit_floor_s": fit_floor, "fit_over_floor": fit_s / fit_floor if fit_floor > 0 else None,
           "score_s": score_s, "score_floor_s": score_floor, "score_over_floor": score_s / score_floor,
           "fit_gflop": [f / 1e9 for f in flops["fit"]], "score_gflop": [f / 1e9 for f in flops["score"]],
           "fit_peak_traced_mb": fit_mem.traced_mb, "fit_peak_rss_mb": fit_mem.rss_mb,
           "score_peak_traced_mb": score_mem.traced_mb, "score_peak_rss_mb": score_mem.rss_mb}
    return row, det, scores


def mahalanobis_diag_reference(mds: Any, test: FeatureSet, rows: int) -> tuple[float, float]:
    """OpenOOD's formulation on `rows` test rows in float32 torch: per class -(t @ P @ t.T).diag(), then max.

    Returns (seconds extrapolated linearly to all test rows, max |difference| to our scores on those rows).
    The per-class product is quadratic in the batch, so linear extrapolation from a small batch flatters it.
    """
    x = torch.from_numpy(np.ascontiguousarray(test.features[:rows], dtype=np.float32))
    means = torch.from_numpy(mds.means.astype(np.float32))
    precision = torch.from_numpy(mds.precision.astype(np.float32))
    start = time.perf_counter()
    per_class = torch.empty(rows, len(means))
    for c in range(len(means)):
        t = x - means[c]
        per_class[:, c] = -torch.matmul(torch.matmul(t, precision), t.t()).diag()
    reference = per_class.max(dim=1).values.double().numpy()
    seconds = (time.perf_counter() - start) * len(test) / rows
    ours = mds.score(test.subset(slice(0, rows)))
    return seconds, float(np.max(np.abs(reference - ours) / np.maximum(np.abs(ours), 1.0)))


def gradnorm_autograd_reference(head: LinearHead, test: FeatureSet, rows: int) -> tuple[float, np.ndarray]:
    """GradNorm as OpenOOD runs it: per sample, backward of KL(uniform || softmax(W h + b)) and ||dL/dW||_1.

    Returns (seconds extrapolated linearly to all test rows, the `rows` scores).
    """
    fc = torch.nn.Linear(head.weight.shape[1], head.weight.shape[0])
    with torch.no_grad():
        fc.weight.copy_(torch.from_numpy(head.weight))
        fc.bias.copy_(torch.from_numpy(head.bias))
    x = torch.from_numpy(np.ascontiguousarray(test.features[:rows], dtype=np.float32))
    uniform = torch.full((1, fc.out_features), 1.0 / fc.out_features)
    scores = np.empty(rows)
    start = time.perf_counter()
    for i in range(rows):
        fc.zero_grad()
        loss = torch.sum(-uniform * torch.log_softmax(fc(x[i:i + 1]), dim=-1))
        loss.backward()
        scores[i] = fc.weight.grad.abs().sum().item()
    return (time.perf_counter() - start) * len(test) / rows, scores


def knn_sklearn_reference(knn: Any, test: FeatureSet, rows: int) -> tuple[float, float]:
    """scikit-learn NearestNeighbors (brute) on the same normalised bank, `rows` queries, extrapolated linearly."""
    from sklearn.neighbors import NearestNeighbors

    from detectors.posthoc.knn import l2_normalise

    queries = l2_normalise(test.features[:rows].astype(np.float64))
    start = time.perf_counter()
    index = NearestNeighbors(n_neighbors=int(knn.params["k"]), algorithm="brute").fit(knn.bank)
    distances, _ = index.kneighbors(queries)
    seconds = (time.perf_counter() - start) * len(test) / rows
    ours = knn.score(test.subset(slice(0, rows)))
    return seconds, float(np.max(np.abs(-distances[:, -1] - ours)))


def references(fitted: dict[str, tuple[dict[str, Any], Any]], test: FeatureSet, head: LinearHead,
               args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    if "mds" in fitted:
        row, det = fitted["mds"]
        rows = min(len(test), args.mds_reference_rows)
        seconds, diff = mahalanobis_diag_reference(det, test, rows)
        out.append({"what": "mds vs per-class (t@P@t.T).diag() (torch float32)", "ours_s": row["score_s"],
                    "reference_s": seconds,
                    "speedup": seconds / row["score_s"], "reference_rows": rows, "max_rel_diff": diff})
    grad_rows = min(len(test), args.gradnorm_reference_rows)
    seconds, reference_scores = gradnorm_autograd_reference(head, test, grad_rows)
    if "gradnorm" in fitted:
        row, det = fitted["gradnorm"]
        ours_s, label = row["score_s"], "gradnorm detector"
        ours = det.score(test.subset(slice(0, grad_rows)))
    else:  # gradnorm not among --only: time its closed form directly
        from detectors.posthoc.gradnorm import gradnorm_score

        start = time.perf_counter()
        gradnorm_score(test.features, head.weight, head.bias)
        ours_s, label = time.perf_counter() - start, "closed form, gradnorm not benchmarked"
        ours = gradnorm_score(test.features[:grad_rows], head.weight, head.bias)
    out.append({"what": f"gradnorm ({label}) vs one autograd backward per sample", "ours_s": ours_s,
                "reference_s": seconds, "speedup": seconds / ours_s, "reference_rows": grad_rows,
                "max_rel_diff": float(np.max(np.abs(ours - reference_scores) / np.abs(reference_scores)))})
    if "knn" in fitted:
        row, det = fitted["knn"]
        knn_rows = min(len(test), args.knn_reference_rows)
        seconds, diff = knn_sklearn_reference(det, test, knn_rows)
        out.append({"what": "knn (faiss IndexFlatL2) vs sklearn NearestNeighbors brute", "ours_s": row["score_s"],
                    "reference_s": seconds,
                    "speedup": seconds / row["score_s"], "reference_rows": knn_rows, "max_rel_diff": diff})
    return out


def markdown(result: dict[str, Any]) -> str:
    fmt = lambda v, spec=".2f": "—" if v is None else format(v, spec)  # noqa: E731
    m, s = result["machine"], result["sizes"]
    lines = [f"Sizes: {s['n_train']} train, {s['n_val']} val, {s['n_test']} test, D={s['dim']}, C={s['classes']}. "
             f"Machine: {m['cpus']} CPUs, float32 matmul {m['float32_gflops']:.1f} GFLOP/s, float64 "
             f"{m['float64_gflops']:.1f} GFLOP/s, "
             f"read {m['read_gbps']:.1f} GB/s.", "",
             "| detector | inputs | fit s | fit / floor | score s | score / floor | fit peak MB (traced / RSS) | score "
             "peak MB (traced / RSS) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["detectors"]:
        mark = "" if r["flop_formula"] else " †"
        lines.append(f"| {r['detector']}{mark} | {', '.join(r['inputs'])} | {r['fit_s']:.2f} | "
                     f"{fmt(r['fit_over_floor'])} | "
                     f"{r['score_s']:.2f} | {fmt(r['score_over_floor'])} | {r['fit_peak_traced_mb']:.0f} / "
                     f"{r['fit_peak_rss_mb']:.0f} | "
                     f"{r['score_peak_traced_mb']:.0f} / {r['score_peak_rss_mb']:.0f} |")
    lines += ["", "† no FLOP formula: the floor is reading the inputs once at the measured bandwidth.", "",
              "| comparison | ours s | reference s (extrapolated) | speed-up | reference rows | max rel. diff |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in result["references"]:
        lines.append(f"| {r['what']} | {r['ours_s']:.3f} | {r['reference_s']:.1f} | {r['speedup']:.3g}x | "
                     f"{r['reference_rows']} | "
                     f"{r['max_rel_diff']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-train", type=int, default=50_000)
    parser.add_argument("--n-val", type=int, default=5_000)
    parser.add_argument("--n-test", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--mds-reference-rows", type=int, default=128,
                        help="test rows (one batch, OpenOOD-sized) for the per-class (t@P@t.T).diag() reference")
    parser.add_argument("--gradnorm-reference-rows", type=int, default=1000,
                        help="test rows for per-sample autograd GradNorm")
    parser.add_argument("--knn-reference-rows", type=int, default=2000,
                        help="test rows for scikit-learn's brute NearestNeighbors")
    parser.add_argument("--only", nargs="*",
                        help="detector names (default: every posthoc detector without image inputs)")
    parser.add_argument("--peers", nargs="*", choices=sorted(peers.CASES), default=sorted(peers.CASES),
                        help="detectors timed beside pytorch-ood's (default: all of them; none: skip)")
    parser.add_argument("--peer-size", default="20000:1024:200",
                        help="rows (train and test each):D:classes of the pytorch-ood comparison")
    parser.add_argument("--peer-repeats", type=int, default=3, help="repeats per side (best of; ratios of each)")
    parser.add_argument("--peers-only", action="store_true", help="only the pytorch-ood comparison")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = parser.parse_args(argv)
    if args.peers_only:  # the JSON's other sections are kept, and the peers' rows not rerun
        kept = json.loads(args.out.read_text()) if args.out.is_file() else {}
        return write(args, {**kept, **merged_peers(kept.get("peers"), peer_section(args))})

    machine = {"cpus": os.cpu_count(), "processor": cpu_model(),
               "torch_threads": torch.get_num_threads(), "float32_gflops": matmul_rate(np.float32),
               "float64_gflops": matmul_rate(np.float64), "read_gbps": read_bandwidth()}
    print(f"float32 {machine['float32_gflops']:.1f} GFLOP/s, float64 {machine['float64_gflops']:.1f} GFLOP/s, "
          f"read {machine['read_gbps']:.1f} GB/s", flush=True)
    train, val, test, head = make_data(args)
    names = args.only or [n for n in detectors.available("posthoc")
                          if "images" not in detectors.detector_class(n).inputs]
    rows, fitted = [], {}
    bar = progress(names, "detectors", unit="detector")
    for name in bar:
        row, det, _ = bench_detector(name, train, val, test, head, machine)
        rows.append(row)
        fitted[name] = (row, det)
        bar.write(f"{name}: fit {row['fit_s']:.2f}s, score {row['score_s']:.2f}s ({row['score_over_floor']:.2f}x "
                  "floor)")
    result = {"machine": machine, "sizes": {"n_train": args.n_train, "n_val": args.n_val, "n_test": args.n_test,
                                            "dim": args.dim, "classes": args.classes},
              "detectors": rows, "references": references(fitted, test, head, args)}
    print(markdown(result))
    return write(args, {**result, **peer_section(args)})


def peer_section(args: argparse.Namespace) -> dict[str, Any]:
    """The pytorch-ood comparison (`--peers`), printed, as the JSON's `peers` entry."""
    if not args.peers:
        return {}
    n, dim, classes = (int(v) for v in args.peer_size.split(":"))
    load_before = os.getloadavg()
    rows = peers.compare(args.peers, peers.make(n, dim, classes, args.seed), args.peer_repeats)
    sizes = f"{n} train and {n} test rows, D={dim}, C={classes}"
    print(peers.markdown(rows, sizes), flush=True)
    run = {"repeats": args.peer_repeats, "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model(), "cpus": os.cpu_count()}
    return {"peers": {"sizes": {"rows": n, "dim": dim, "classes": classes}, **run,
                      "rows": [{**row, "run": run} for row in rows]}}


def merged_peers(kept: dict[str, Any] | None, fresh: dict[str, Any]) -> dict[str, Any]:
    """`fresh`'s peer rows in place of the kept rows of the same detectors, the others kept (each row says its run;
    rows without one were measured in the run the kept section's own fields describe); a kept section at other
    sizes is replaced."""
    if not fresh or not kept or kept.get("sizes") != fresh["peers"]["sizes"]:
        return fresh
    old_run = {k: kept[k] for k in ("repeats", "load_avg_before", "load_avg_after", "date") if k in kept}
    rerun = {row["detector"]: row for row in fresh["peers"]["rows"]}
    rows = [rerun.pop(row["detector"], None) or {**row, "run": row.get("run", old_run)} for row in kept["rows"]]
    return {"peers": {**fresh["peers"], "rows": rows + list(rerun.values())}}


def write(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, json.loads(json.dumps(result, default=str)))
    return result


if __name__ == "__main__":
    main()
