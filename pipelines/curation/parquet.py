"""Parquet tables as plain columns of text and numbers, the shape every table reader here expects.

A Parquet file can hold what a CSV cannot: lists, structs and maps (unhashable in pandas: `duplicated` fails on them)
and binary columns (bytes, perhaps not UTF-8 text). A column the caller reads (`used`: url, species, lat, ...) holding
nested values is one `TableError` naming the column and its type; any other nested column becomes its values' JSON
text (kept as metadata, as a CSV would have kept it). A binary column is decoded as UTF-8; bytes that are not are one
TableError naming the column and the row (from 1, as `pipelines.importers` counts Parquet rows).
"""
from __future__ import annotations

import json
import os
from collections.abc import Collection

import pandas as pd
import pyarrow as pa

from pipelines.curation.delimited import TableError


def _nested(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return _nested(kind.value_type)
    return pa.types.is_nested(kind)


def _binary(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)


def _text(column: pa.ChunkedArray, name: str, source: str) -> pa.ChunkedArray:
    """A binary column as UTF-8 text; the first value that is not UTF-8 is one TableError naming its row."""
    try:
        return column.cast(pa.large_string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    for row, value in enumerate(column.to_pylist()):
        if value is not None:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                raise TableError(f"{source}: row {row + 1}: column {name!r} holds bytes that are not UTF-8 text "
                                 f"({value[:16]!r}); write it as a text or number column") from None
    raise TableError(f"{source}: column {name!r}: binary values that cannot be read as text")


def _json_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    values = [None if v is None else json.dumps(v, default=str, ensure_ascii=False) for v in column.to_pylist()]
    return pa.chunked_array([pa.array(values, pa.large_string())])


def plain_table(table: pa.Table, source: str, used: Collection[str]) -> pa.Table:
    """`table` with every column text or a number (module docstring); `used`: the columns the caller reads."""
    columns = {}
    for field, column in zip(table.schema, table.columns):
        if _nested(field.type):
            if field.name in used:
                raise TableError(f"{source}: column {field.name!r} holds {field.type} values (lists, structs or maps);"
                                 " it must hold text or numbers, one value a row")
            column = _json_text(column)
        elif _binary(field.type):
            column = _text(column, field.name, source)
        columns[field.name] = column
    return pa.table(columns, metadata=table.schema.metadata)


def read_parquet(path: str | os.PathLike, used: Collection[str]) -> pd.DataFrame:
    """A Parquet file as a DataFrame of plain columns (`plain_table`); an unreadable file raises pyarrow's error, which
    each caller words as its own one line."""
    import pyarrow.parquet as pq

    return plain_table(pq.read_table(path), os.fspath(path), used).to_pandas()
