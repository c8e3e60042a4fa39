"""Delimited text (a Darwin Core Archive's data file, a CSV / TSV table) streamed through pyarrow's CSV reader into an
Arrow table of text columns, only the columns asked for, within `TableLimits`.

Memory: the file is read 1 MiB at a time and parsed in chunks of whole rows (a row longer than `max_line_bytes` is
refused once that many bytes hold no row end, so a 1 GiB field never reaches memory) plus the kept columns' text; rows
past `max_rows` or kept text past `max_kept_bytes` stop the read with one line naming the key. Every value is text (a
blank is null); a row with another number of fields than the file's first row is refused naming its line.
"""
from __future__ import annotations

import codecs
import io
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pacsv

from pipelines.errors import UserInputError
from pipelines.params import Config, config, param

DELIMITERS = ("\t", ",", ";", "|")


class TableError(UserInputError):
    """A bad occurrence table or archive: the message names the file, column or value."""


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


@config
class TableLimits(Config):
    """What one table or archive may cost: rows, bytes read, one line, the text kept. Each is checked while reading;
    the first exceeded is one TableError naming the file and the key. Defaults fit a GBIF download of 20M images."""

    DOC = "docs/species.md"

    max_rows: int = param(20_000_000, "rows of one table or archive data file at most (a GBIF download of 2.9M images "
                                      "has 2.9M)", ge=1)
    max_member_bytes: int = param(2**37, "uncompressed bytes of one archive member or table file at most (128 GiB; "
                                         "GBIF's occurrence.txt is about 1-2 KB a row)", ge=1)
    max_line_bytes: int = param(2**24, "bytes of one line at most (16 MiB; the reader's block, held in memory once)",
                                ge=2**12, le=2**30)
    max_kept_bytes: int = param(2**33, "text bytes of the columns kept from one data file at most (8 GiB; about 400 "
                                       "bytes a GBIF row)", ge=1)

    def describe(self, key: str) -> str:
        value = getattr(self, key)
        return f"{key}={value:,}" if key == "max_rows" else f"{key}={_size(value)}"


@dataclass(frozen=True)
class Dialect:
    """How a text file is laid out: field separator, quote character (None: fields are never quoted), header lines
    skipped, encoding."""

    sep: str = "\t"
    quote: str | None = None
    header_lines: int = 0
    encoding: str = "utf-8"

    def check(self, source: str) -> None:
        if len(self.sep) != 1 or self.sep in "\r\n":
            raise TableError(f"{source}: fields separated by {self.sep!r}; one character other than a line end is read")
        if self.quote is not None and (len(self.quote) != 1 or self.quote == self.sep or self.quote in "\r\n"):
            raise TableError(f"{source}: fields enclosed by {self.quote!r}; one character other than the separator "
                             "and a line end is read")
        try:
            codecs.lookup(self.encoding)
        except LookupError:
            raise TableError(f"{source}: unknown text encoding {self.encoding!r}") from None


BLOCK = 1 << 20
"""Bytes read at a time (1 MiB): pyarrow parses whole rows a chunk of about this size at a time (its memory pool
keeps some 30 chunks' worth, so chunks stay small; a longer row makes a longer chunk, up to `max_line_bytes`)."""
Opener = Callable[[], IO[bytes]]
"""Opens the file afresh (the first line is peeked, then the whole file streamed)."""


def sniff_delimiter(header: str) -> str:
    """The most frequent of tab, comma, semicolon and bar in a header line (comma when none occurs)."""
    counts = {d: header.count(d) for d in DELIMITERS}
    best = max(DELIMITERS, key=lambda d: counts[d])
    return best if counts[best] else ","


def first_lines(opener: Opener, dialect: Dialect, count: int, limits: TableLimits, source: str) -> list[str]:
    """The first `count` lines (fewer when the file is shorter), without their line ends or a BOM; a line longer than
    `max_line_bytes` is refused."""
    lines = []
    with opener() as raw:
        text = io.TextIOWrapper(raw, encoding=dialect.encoding, errors="strict", newline="")
        try:
            for _ in range(count):
                line = text.readline(limits.max_line_bytes + 1)
                if not line:
                    break
                if len(line) > limits.max_line_bytes:
                    raise TableError(f"{source}: line {len(lines) + 1} is longer than "
                                     f"{limits.describe('max_line_bytes')}"
                                     " (TableLimits)", doc=TableLimits.DOC)
                lines.append(line.lstrip("\ufeff") if not lines else line)
        except UnicodeDecodeError as err:
            raise TableError(f"{source}: not valid {dialect.encoding} text ({err.reason})") from None
    return [line.rstrip("\r\n") for line in lines]


def split_line(line: str, dialect: Dialect) -> list[str]:
    """One line's fields, quotes honoured as the dialect says (by the reader's own parser)."""
    if dialect.quote is None:
        return line.split(dialect.sep)
    parse = pacsv.ParseOptions(delimiter=dialect.sep, quote_char=dialect.quote, double_quote=True, escape_char=False,
                               newlines_in_values=True)
    data = (line + "\n").encode("utf-8")
    read = pacsv.ReadOptions(autogenerate_column_names=True, use_threads=False, block_size=max(len(data) * 2, 4096))
    try:
        width = pacsv.read_csv(io.BytesIO(data), read_options=read, parse_options=parse).num_columns
        convert = pacsv.ConvertOptions(column_types={f"f{i}": pa.string() for i in range(width)},
                                       strings_can_be_null=False, quoted_strings_can_be_null=False)
        row = pacsv.read_csv(io.BytesIO(data), read_options=read, parse_options=parse, convert_options=convert)
    except pa.ArrowInvalid:
        return [line]
    return [row.column(i)[0].as_py() for i in range(width)]


def read_delimited(opener: Opener, dialect: Dialect, columns: dict[str, int] | None, limits: TableLimits, source: str,
                   *, names: list[str] | None = None, keep: Callable[[pa.RecordBatch], Any] | None = None,
                   size: int | None = None, declared: dict[str, int] | None = None) -> pa.Table:
    """The file's columns as text: `columns` maps a name to a column index (None: every column, named `names`, the
    header's). `keep(batch)` may return a boolean mask of the rows to keep (applied per block, so what is dropped is
    never held). `size` is the file's uncompressed size when known (checked against `max_member_bytes` first);
    `declared` (name -> index of every column a descriptor declares, read or not) must fit the file too."""
    dialect.check(source)
    if size is not None and size > limits.max_member_bytes:
        raise TableError(f"{source}: {size:,} bytes uncompressed, over {limits.describe('max_member_bytes')} "
                         "(TableLimits)", doc=TableLimits.DOC)
    peek = first_lines(opener, dialect, dialect.header_lines + 1, limits, source)
    data = peek[dialect.header_lines:] if len(peek) > dialect.header_lines else []
    width = len(split_line(data[0], dialect)) if data else len(names or []) or 1 + max((columns or {0: 0}).values())
    if names is not None and data and width != len(names):
        raise TableError(f"{source}: line {dialect.header_lines + 1} has {width} fields, the header {len(names)}")
    wanted = dict(columns) if columns is not None else {name: i for i, name in enumerate(names or [])}
    beyond = {name: i for name, i in {**(declared or {}), **wanted}.items() if i >= width}
    if beyond:
        name, index = next(iter(beyond.items()))
        raise TableError(f"{source}: column {index} ({name}) is beyond the file's {width} columns")
    raw_names = [f"c{i}" for i in range(width)]
    used = sorted(set(wanted.values()))
    schema = pa.schema([(raw_names[i], pa.string()) for i in used])
    try:
        batches = _batches(opener, dialect, raw_names, used, limits, source, wanted, keep) if data else []
    finally:
        pa.default_memory_pool().release_unused()
    table = pa.Table.from_batches(batches, schema=schema)
    return pa.table({name: table.column(raw_names[index]) for name, index in wanted.items()})


def _row_pattern(dialect: Dialect) -> re.Pattern[bytes]:
    """One row of a quoted file, as pyarrow parses it: a field opening with the quote runs to the closing quote
    (a doubled quote is one quote; separators and line ends inside are text), the rest of a field is literal."""
    q, sep = re.escape(dialect.quote.encode()), re.escape(dialect.sep.encode())
    field = rb"(?:%s(?:[^%s]|%s%s)*%s[^%s\r\n]*|[^%s%s\r\n][^%s\r\n]*|)" % (q, q, q, q, q, sep, q, sep, sep)
    return re.compile(rb"%s(?:%s%s)*(?:\r\n|\n|\r)" % (field, sep, field))


def _complete(buffer: bytes, row: re.Pattern[bytes] | None) -> int:
    """The length of the longest prefix of `buffer` made of whole rows."""
    if row is None:
        return max(buffer.rfind(b"\n"), buffer.rfind(b"\r")) + 1
    end, match = 0, row.match(buffer)
    while match is not None and match.end() > end:
        end = match.end()
        match = row.match(buffer, end)
    return end


def _blocks(opener: Opener, dialect: Dialect) -> Iterator[bytes]:
    """The file's bytes as UTF-8 in blocks of about `BLOCK` (another encoding is transcoded on the way)."""
    utf8 = codecs.lookup(dialect.encoding).name == "utf-8"
    decoder = None if utf8 else codecs.getincrementaldecoder(dialect.encoding)(errors="strict")
    with opener() as stream:
        while True:
            raw = stream.read(BLOCK)
            if decoder is not None:
                text = decoder.decode(raw, final=not raw)
                raw, done = text.encode("utf-8"), not raw
                if raw:
                    yield raw
                if done:
                    return
                continue
            if not raw:
                return
            yield raw


def _chunks(opener: Opener, dialect: Dialect, limits: TableLimits, source: str) -> Iterator[tuple[bytes, int]]:
    """Whole rows in chunks of about `BLOCK` bytes, each with the file line its first row starts on; a row longer
    than `max_line_bytes` is refused once that many bytes hold no row end (memory: one row and one block)."""
    row = None if dialect.quote is None else _row_pattern(dialect)
    pending, line, ends = b"", 1, None
    for block in _blocks(opener, dialect):
        pending += block
        cut = _complete(pending, row)
        if not cut:
            if len(pending) > limits.max_line_bytes:
                hint = " (a quote that never closes?)" if row is not None else ""
                raise TableError(f"{source}: line {line} is longer than {limits.describe('max_line_bytes')}{hint} "
                                 "(TableLimits)", doc=TableLimits.DOC)
            continue
        chunk, pending = pending[:cut], pending[cut:]
        ends = ends or (b"\n" if b"\n" in chunk else b"\r")
        yield chunk, line
        line += chunk.count(ends)
    if pending.strip(b"\r\n"):  # the last row (no line end, or a quote left open)
        yield pending if pending.endswith((b"\n", b"\r")) else pending + b"\n", line


def _batches(opener: Opener, dialect: Dialect, raw_names: list[str], used: list[int], limits: TableLimits,
             source: str, wanted: dict[str, int], keep: Callable[[pa.RecordBatch], Any] | None) -> list[pa.RecordBatch]:
    """Each chunk of whole rows parsed by pyarrow from memory (no Python file is handed to pyarrow's threads)."""
    parse = pacsv.ParseOptions(delimiter=dialect.sep, quote_char=dialect.quote or False, double_quote=True,
                               escape_char=False, newlines_in_values=dialect.quote is not None, ignore_empty_lines=True)
    convert = pacsv.ConvertOptions(column_types={raw_names[i]: pa.string() for i in used},
                                   include_columns=[raw_names[i] for i in used], strings_can_be_null=True,
                                   null_values=[""], quoted_strings_can_be_null=True)
    batches, rows, kept, skip = [], 0, 0, dialect.header_lines
    for chunk, line in _chunks(opener, dialect, limits, source):
        read = pacsv.ReadOptions(use_threads=False, block_size=len(chunk) + 1, skip_rows=skip, column_names=raw_names)
        try:
            table = pacsv.read_csv(pa.py_buffer(chunk), read_options=read, parse_options=parse,
                                   convert_options=convert)
        except pa.ArrowInvalid as err:
            if "Empty CSV" in str(err):  # only header lines (or blank lines) so far
                skip = max(skip - max(chunk.count(b"\n"), chunk.count(b"\r")), 0)
                continue
            raise TableError(_reason(err, source, dialect, line - 1)) from None
        except pa.ArrowException as err:
            raise TableError(f"{source}: not readable ({_short(err)})") from None
        skip = 0
        for batch in table.to_batches():
            rows += batch.num_rows
            if rows > limits.max_rows:
                raise TableError(f"{source}: more than {limits.describe('max_rows')} rows (TableLimits)",
                                 doc=TableLimits.DOC)
            if keep is not None:
                batch = batch.filter(keep(batch.rename_columns(_names(batch, wanted, raw_names))))
            kept += batch.nbytes
            if kept > limits.max_kept_bytes:
                raise TableError(f"{source}: the columns read hold more than {limits.describe('max_kept_bytes')} "
                                 "(TableLimits)", doc=TableLimits.DOC)
            batches.append(batch)
    return batches


def _names(batch: pa.RecordBatch, wanted: dict[str, int], raw_names: list[str]) -> list[str]:
    """The batch's columns under the first name asked for each (for `keep`)."""
    first = {}
    for name, index in wanted.items():
        first.setdefault(raw_names[index], name)
    return [first[c] for c in batch.schema.names]


def _short(err: BaseException) -> str:
    return " ".join(str(err).split())[:200]


def _reason(err: pa.ArrowInvalid, source: str, dialect: Dialect, offset: int = 0) -> str:
    text = str(err)
    if "UTF8" in text or "UTF-8" in text:
        return f"{source}: not valid {dialect.encoding} text ({_short(err)})"
    if "Expected" in text and "columns" in text:
        head, _, tail = text.partition(": Row #")
        where, _, rest = tail.partition(": ")
        expected, _, got = rest.partition(", got ")
        got = got.split(":", 1)[0]
        if where.isdigit() and expected.startswith("Expected") and got.strip().isdigit():
            return (f"{source}: line {int(where) + offset} has {got.strip()} fields, the file's first line "
                    f"{expected.removeprefix('Expected ').removesuffix(' columns')}")
    return f"{source}: not readable ({_short(err)})"


def stat_regular(path: str | os.PathLike) -> os.stat_result:
    """os.stat of a path that must be a regular file (a FIFO, socket or device is refused, never opened)."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise TableError(f"{path}: not a regular file")
    return info
