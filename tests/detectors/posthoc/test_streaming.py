"""Streaming statistics: moments and percentiles equal their in-memory numpy values; every feature-level detector fitted
from a memory-mapped float16 cache in small chunks equals the fit on the same arrays in memory in one chunk."""
import tracemalloc

import numpy as np
import pytest

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc import streaming
from pipelines.features import FeatureCache

STREAMED = ["mds", "rmds", "vim", "neco", "nci", "react", "dice", "she", "knn"]


def clusters(n=600, d=12, c=5, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c, n)
    centres = rng.normal(0.0, 3.0, (c, d)) + 20.0  # far from the origin: sums about 0 would lose digits
    features = np.maximum(centres[labels] + rng.normal(size=(n, d)) * np.linspace(2.0, 0.2, d), 0.0)
    weight = centres - centres.mean(axis=0) + rng.normal(size=(c, d)) * 0.3  # mostly right, some mistakes (SHE)
    weight -= weight.mean(axis=1, keepdims=True)  # blind to the common offset of 20
    head = LinearHead(weight / np.sqrt(d), rng.normal(size=c) * 0.1)
    return features, labels, head


def test_moments_equal_numpy_for_any_chunking_and_merge_order():
    x, labels, _ = clusters()
    means = np.stack([x[labels == k].mean(axis=0) for k in range(5)])
    within = sum((x[labels == k] - means[k]).T @ (x[labels == k] - means[k]) for k in range(5))
    pooled = (x - x.mean(0)).T @ (x - x.mean(0))
    point = np.linspace(-1.0, 1.0, x.shape[1])
    for rows in (1, 7, 599, 10_000):
        with streaming.chunk_rows(rows):
            m = streaming.moments(x, labels)
        np.testing.assert_array_equal(m.groups, np.arange(5))
        np.testing.assert_array_equal(m.count, np.bincount(labels))
        np.testing.assert_allclose(m.means(), means, rtol=1e-12)
        np.testing.assert_allclose(m.mean(), x.mean(0), rtol=1e-12)
        np.testing.assert_allclose(m.within_scatter(), within, rtol=1e-9, atol=1e-9 * np.abs(within).max())
        np.testing.assert_allclose(m.pooled_scatter(), pooled, rtol=1e-9, atol=1e-9 * np.abs(pooled).max())
        np.testing.assert_allclose(m.second_moment_about(point), (x - point).T @ (x - point) / len(x), rtol=1e-10)
    # shards with their own shifts and disjoint groups merge into the whole, in either order
    a, b = streaming.Moments.of(x[:200], labels[:200]), streaming.Moments.of(x[200:] + 0.0, labels[200:])
    for merged in (a.merge(b), b.merge(a)):
        np.testing.assert_allclose(merged.within_scatter(), within, rtol=1e-9, atol=1e-9 * np.abs(within).max())
        np.testing.assert_allclose(merged.means(), means, rtol=1e-12)
    only_low = (streaming.Moments.of(x[labels < 2], labels[labels < 2])
                .merge(streaming.Moments.of(x[labels >= 2], labels[labels >= 2])))
    np.testing.assert_allclose(only_low.means(), means, rtol=1e-12)


def assert_numpy_percentile(got: float, x: np.ndarray, q: float, where) -> None:
    """Equal to numpy's "linear" percentile: bit for bit against np.percentile on numpy >= 2.4 (whose interpolation the
    code follows), and within two units in the last place of the data's dtype of the same rule worked in float64 by
    hand (numpy 2.0, the floor, interpolates float16/float32 data in lower precision)."""
    values = np.sort(np.asarray(x, dtype=np.float64).ravel())
    h = (len(values) - 1) * q / 100.0
    lo = int(np.floor(h))
    hi = min(lo + 1, len(values) - 1)
    expect = values[lo] + (h - lo) * (values[hi] - values[lo])
    ulp = (float(np.spacing(np.abs(np.asarray(expect, dtype=x.dtype)))) if x.dtype != np.float64
           else 4 * np.spacing(abs(expect)))
    assert abs(got - expect) <= 2 * ulp, (where, got, expect)
    if np.lib.NumpyVersion(np.__version__) >= "2.4.0":
        assert got == float(np.percentile(x, q)), where


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_percentile_equals_numpy_exactly(dtype):
    rng = np.random.default_rng(1)
    for trial in range(40):
        n, d = int(rng.integers(1, 200)), int(rng.integers(1, 6))
        x = np.maximum(rng.normal(size=(n, d)) * rng.choice([1e-3, 1.0, 300.0]), 0.0).astype(dtype)
        if trial % 4 == 0:
            x[: n // 2] = -0.0  # signed zeros and many ties
        if trial % 5 == 0:
            x = -x
        q = float(rng.choice([0.0, 100.0, 90.0, 50.0, rng.uniform(0, 100)]))
        with streaming.chunk_rows(int(rng.integers(1, 40))):
            assert_numpy_percentile(streaming.percentile(x, q), x, q, (trial, q))
    for q in (0, 10, 33.3, 90, 99.99, 100):  # float16 data read as float32 (one exact histogram pass)
        x16 = (rng.normal(size=(500, 3)) * 10).astype(np.float16)
        x16[:50] = -0.0
        for dtype in (np.float32, np.float64, np.float16):
            assert_numpy_percentile(streaming.percentile(x16, q, dtype=dtype), x16.astype(dtype), q, (q, dtype))
    with pytest.raises(ValueError, match="NaN"):
        streaming.percentile(np.array([[1.0, np.nan]]), 50)


def write_cache(path, features, labels, head, dtype=np.float16):
    logits = head(features.astype(dtype).astype(np.float32))
    FeatureCache(features.astype(dtype), logits.astype(np.float32), labels, np.arange(len(labels)),
                 head.weight.astype(np.float32), head.bias.astype(np.float32), {"model": "m"}).save(path)
    return path


def test_feature_cache_memory_maps_safetensors(tmp_path):
    x, labels, head = clusters(50, 6, 3)
    path = write_cache(tmp_path / "c.safetensors", x, labels, head)
    eager, mapped = FeatureCache.load(path), FeatureCache.load(path, mmap=True)
    for name in ("features", "logits", "labels", "index", "head_weight", "head_bias"):
        assert isinstance(getattr(mapped, name), np.memmap), name
        np.testing.assert_array_equal(getattr(mapped, name), getattr(eager, name))
        assert getattr(mapped, name).dtype == getattr(eager, name).dtype
    assert mapped.metadata == eager.metadata == {"model": "m"}
    data = mapped.to_featureset()
    assert data.features.dtype == np.float16 and streaming._mapping(data.features) is not None  # still on disk
    assert data.subset(slice(0, 10)).features.dtype == np.float16
    assert FeatureSet(np.asarray(eager.features)).features.dtype == np.float32  # in-memory float16 is converted
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(ValueError, match="bad.safetensors"):
        FeatureCache.load(bad, mmap=True)


def fitted(name, train, val, head, **params):
    return detectors.build(name, **params).fit(train, head=head, id_val=val)


@pytest.mark.parametrize("name", STREAMED)
def test_streamed_fit_from_memory_mapped_cache_equals_in_memory_fit(name, tmp_path):
    x, labels, head = clusters(700, 12, 5)
    train = FeatureCache.load(write_cache(tmp_path / "train.safetensors", x[:600], labels[:600], head), mmap=True)
    val = FeatureCache.load(write_cache(tmp_path / "val.safetensors", x[600:], labels[600:], head), mmap=True)
    in_memory = [FeatureSet(np.asarray(c.features, dtype=np.float32), np.array(c.logits), np.array(c.labels))
                 for c in (train, val)]
    params = {"k": 9} if name == "knn" else {}
    with streaming.chunk_rows(1 << 30):  # one chunk: the plain in-memory computation
        reference = fitted(name, *in_memory, head, **params)
    with streaming.chunk_rows(37):
        streamed = fitted(name, train.to_featureset(), val.to_featureset(), head, **params)
        scores = streamed.score(val.to_featureset())
    expected_state, got_state = reference.state(), streamed.state()
    assert expected_state.keys() == got_state.keys()
    # ViM's covariance products are float32 per chunk (as its reference code): chunking moves them at float32 rounding
    rtol, atol = (1e-4, 1e-5) if name == "vim" else (1e-9, 1e-10)
    for key in expected_state:
        np.testing.assert_allclose(got_state[key], expected_state[key], rtol=rtol, atol=atol, err_msg=key)
    np.testing.assert_allclose(scores, reference.score(in_memory[1]), rtol=1e-6, atol=1e-4 if name == "vim" else 1e-6)


def test_knn_streamed_exact_search_and_float16_ivf_indexes(tmp_path, monkeypatch):
    from detectors.posthoc import knn

    x, labels, head = clusters(900, 16, 5, seed=3)
    cache = (FeatureCache.load(write_cache(tmp_path / "t.safetensors", x, labels, head, np.float32), mmap=True)
             .to_featureset())
    queries = FeatureSet(x[:80] + np.random.default_rng(0).normal(size=(80, 16)))
    exact = detectors.build("knn", k=10).fit(cache)
    assert exact.bank is not None
    monkeypatch.setattr(knn, "IN_MEMORY_BYTES", 1000)  # too big for memory: searched chunk by chunk, same distances
    with streaming.chunk_rows(64):
        streamed = detectors.build("knn", k=10).fit(cache)
        assert streamed.bank is None and streamed._source is not None
        np.testing.assert_allclose(streamed.score(queries), exact.score(queries), rtol=1e-5, atol=1e-6)
        again = detectors.Detector.from_pretrained(streamed.save_pretrained(tmp_path / "knn"))
        np.testing.assert_allclose(again.score(queries), exact.score(queries), rtol=1e-5, atol=1e-6)
    half = detectors.build("knn", k=10, index="flat16").fit(cache)
    np.testing.assert_allclose(half.score(queries), exact.score(queries), atol=2e-3)
    ivf = detectors.build("knn", k=10, index="ivf", nprobe=10_000).fit(cache)  # every list probed: exhaustive
    np.testing.assert_allclose(ivf.score(queries), exact.score(queries), atol=2e-3)
    reloaded = detectors.Detector.from_pretrained(ivf.save_pretrained(tmp_path / "ivf"))
    np.testing.assert_array_equal(reloaded.score(queries), ivf.score(queries))
    with pytest.raises(ValueError, match="knn: index must be one of 'flat', 'flat16', 'ivf', 'auto', got 'hnsw'"):
        detectors.build("knn", index="hnsw").fit(cache)


@pytest.mark.parametrize("name", ["mds", "vim", "neco", "react", "she", "nci"])
def test_fit_memory_is_bounded_by_the_chunk_size(name, tmp_path):
    rng = np.random.default_rng(0)
    n, d = 160_000, 32
    labels = rng.integers(0, 4, n)
    x = np.maximum(rng.normal(size=(n, d)) + labels[:, None], 0.0)
    head = LinearHead(rng.normal(size=(4, d)), rng.normal(size=4))
    data = FeatureCache.load(write_cache(tmp_path / "big.safetensors", x, labels, head), mmap=True).to_featureset()
    del x
    det = detectors.build(name, **({"dim": 8} if name in ("vim", "neco") else {}))
    with streaming.chunk_rows(2000):
        tracemalloc.start()
        det.fit(data, head=head, id_val=data)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    whole = n * d * 8  # the features in float64, as an in-memory fit would hold them
    assert peak < whole / 8, (peak, whole)


def test_map_rows_read_only_views_and_copies(tmp_path):
    x, labels, head = clusters(50, 6, 3)
    x32 = x.astype(np.float32)
    seen = []

    def fn(part, rows):
        seen.append((rows.flags.writeable, np.shares_memory(rows, x32)))
        return rows.sum(axis=1, dtype=np.float64) + part.start
    expected = x32.sum(axis=1, dtype=np.float64) + np.repeat(np.arange(0, 50, 7), 7)[:50]
    np.testing.assert_array_equal(streaming.map_rows(fn, x32, np.float32, rows=7, read_only=True), expected)
    assert seen == [(False, True)] * 8 and x32.flags.writeable  # views, the array itself still writable
    seen.clear()
    np.testing.assert_array_equal(streaming.map_rows(fn, x32, rows=7), expected)  # default: fresh copies
    assert seen == [(True, False)] * 8
    seen.clear()
    mapped = FeatureCache.load(write_cache(tmp_path / "c.safetensors", x, labels, head), mmap=True).features
    half = np.asarray(mapped, dtype=np.float32).sum(axis=1, dtype=np.float64) + np.repeat(np.arange(0, 50, 7), 7)[:50]
    np.testing.assert_array_equal(streaming.map_rows(fn, mapped, np.float32, rows=7, read_only=True), half)
    assert seen == [(True, False)] * 8  # a float16 memory map is converted chunk by chunk
    assert streaming.map_rows(fn, x32[:0], read_only=True).shape == (0,)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scratch_is_a_writable_array_of_the_asked_shape_and_dtype(dtype):
    buffer = streaming.scratch((3, 5), dtype)
    assert buffer.shape == (3, 5) and buffer.dtype == dtype and buffer.flags.writeable and buffer.flags.c_contiguous
    buffer[...] = 2.0
    np.testing.assert_array_equal(buffer, np.full((3, 5), 2.0, dtype))
