"""Fast, exact JSON-lines encoding of manifest rows: the bytes of `json.dumps(row, default=str)` per row, 10x faster.

Rows that share their keys (in order) and hold only plain scalars (str, int, float, bool, None) are encoded column by
column with the json module's own C string escaper and `int.__repr__` / `float.__repr__` (what `json.dumps` uses),
then formatted through one template per key set. Any other row goes through a C encoder built once with the exact
options of `json.dumps(row, default=str)`.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring_ascii
from operator import itemgetter
from typing import Any

try:  # the C encoder (CPython); the pure-Python fallback is exact too, only slower
    from json.encoder import c_make_encoder
except ImportError:  # pragma: no cover
    c_make_encoder = None


_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _float(value: float) -> str:
    text = float.__repr__(value)
    return _NON_FINITE.get(text, text)


_SCALAR: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii, int: int.__repr__, float: _float, bool: lambda v: "true" if v else "false",
    type(None): lambda v: "null",
}


def _row_encoder() -> Callable[[Any], str]:
    """A reusable encoder producing exactly json.dumps(obj, default=str)."""
    if c_make_encoder is None:  # pragma: no cover
        return lambda obj: json.dumps(obj, default=str)
    encode = c_make_encoder({}, str, encode_basestring_ascii, None, ": ", ", ", False, False, True)
    return lambda obj: "".join(encode(obj, 0))


def _column(values: list[Any]) -> list[str] | None:
    """JSON text of each value of a column of plain scalars (None when some value is not one)."""
    kinds = set(map(type, values))
    if kinds == {str}:
        return list(map(encode_basestring_ascii, values))
    if kinds == {int}:
        return list(map(int.__repr__, values))
    if kinds == {float}:
        texts = list(map(float.__repr__, values))
        if any(t in _NON_FINITE for t in texts):
            texts = [_NON_FINITE.get(t, t) for t in texts]
        return texts
    if not kinds <= _SCALAR.keys():
        return None
    return [_SCALAR[type(v)](v) for v in values]


def encode_lines(rows: Iterable[dict[str, Any]]) -> str:
    """"".join(json.dumps(row, default=str) + "\\n" for row in rows), byte for byte."""
    rows = rows if isinstance(rows, list) else list(rows)
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(tuple(row), []).append(i)
    if len(groups) == 1:
        return "".join(_encode_group(next(iter(groups)), rows))
    lines: list[str] = [""] * len(rows)
    for keys, members in groups.items():
        for i, line in zip(members, _encode_group(keys, [rows[i] for i in members])):
            lines[i] = line
    return "".join(lines)


def _encode_group(keys: tuple, rows: list[dict[str, Any]]) -> list[str]:
    """Lines of rows that all have exactly `keys`, in that order."""
    columns = [_column(list(map(itemgetter(k), rows))) for k in keys] if all(type(k) is str for k in keys) else [None]
    if any(c is None for c in columns):
        encode = _row_encoder()
        return [encode(row) + "\n" for row in rows]
    if not keys:
        return ["{}\n"] * len(rows)
    template = "{" + ", ".join(encode_basestring_ascii(k).replace("%", "%%") + ": %s" for k in keys) + "}\n"
    return [template % texts for texts in zip(*columns)]


def column_texts(series: Any) -> Any:
    """JSON text of each value of a pandas Series (a list or pyarrow array of str), as `json.dumps` writes it once
    missing values become None; categoricals encode each category once. None when some value is not a plain scalar."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    if isinstance(series.dtype, pd.CategoricalDtype):
        categories = _column(list(series.cat.categories))
        if categories is None:
            return None
        codes = series.cat.codes.to_numpy().astype(np.int64)
        codes[codes < 0] = len(categories)
        return pa.array(categories + ["null"], pa.large_string()).take(pa.array(codes))
    if pd.api.types.is_float_dtype(series.dtype):
        values = series.to_numpy(dtype=np.float64)
        texts = list(map(float.__repr__, values.tolist()))
        for i in np.flatnonzero(~np.isfinite(values)).tolist():
            texts[i] = "null" if np.isnan(values[i]) else _float(float(values[i]))
        return texts
    if series.dtype == np.int64:
        return pa.array(series.to_numpy()).cast(pa.large_string())  # Arrow's decimal digits are int.__repr__'s
    values = series.to_numpy(dtype=object)
    missing = pd.isna(series).to_numpy()
    if missing.any():
        values[missing] = None
    return _column(values.tolist())


def join_lines(pieces: list[Any]) -> bytes:
    """Concatenate string pieces row by row (each piece a sequence with one string per row, or one str for every
    row) and return all rows together as UTF-8 bytes; the pieces hold the separators and line ends themselves."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = [pa.scalar(p, pa.large_string()) if isinstance(p, str)
              else p.cast(pa.large_string()) if isinstance(p, pa.Array) else pa.array(p, pa.large_string())
              for p in pieces]
    joined = pc.binary_join_element_wise(*arrays, pa.scalar("", pa.large_string()))
    if isinstance(joined, pa.ChunkedArray):
        joined = joined.combine_chunks()
    if len(joined) == 0:
        return b""
    _, offsets, data = joined.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64)[joined.offset:joined.offset + len(joined) + 1]
    return data.to_pybytes()[int(bounds[0]):int(bounds[-1])]
