"""Darwin Core Archives (a zip, or its unpacked folder) read as the DwC-A text guide describes them
(tdwg/dwc docs/text/index.md): `meta.xml` names the core and its extensions, each with its files' `<location>`, its
layout (`fieldsTerminatedBy`, default ","; `fieldsEnclosedBy`, default '"', "" for none; `linesTerminatedBy`;
`ignoreHeaderLines`; `encoding`, default UTF-8), its `<id>` / `<coreid>` column and a `<field>` per term (a column
`index`, a `default`, or both). Columns are taken by their declared index, whatever gaps or shared indexes the
declaration has; a term declared twice, an index beyond the file's columns or a malformed descriptor is one line.

Every member is read in place (nothing extracted) and must lie inside the archive: a `<location>` that is a URL,
absolute, has a `..` part or (in a folder) resolves outside it through a symlink is refused, as is anything but a
regular file. Reading is bounded by `TableLimits`.
"""
from __future__ import annotations

import codecs
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any
from xml.etree import ElementTree

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.curation.delimited import Dialect, TableError, TableLimits, read_delimited, stat_regular

META = "meta.xml"
MAX_META_BYTES = 1 << 22
"""meta.xml is read whole: at most 4 MiB (GBIF's, with 250 fields, is about 40 KB)."""
DEFAULTS = {"fieldsTerminatedBy": ",", "fieldsEnclosedBy": '"', "linesTerminatedBy": "\n", "encoding": "UTF-8",
            "ignoreHeaderLines": "0"}
"""The DwC-A text guide's defaults (python-dwca-reader assumes a tab and no quotes instead)."""
LINE_ENDS = ("\n", "\r\n", "\r")
ID = "<id>"
"""The column name of a core's <id> / an extension's <coreid> while reading (no term's short name has brackets)."""


@dataclass(frozen=True)
class Field:
    """One `<field>`: its short name (the term's last part), the term, its column (None: a constant) and default."""

    name: str
    term: str
    index: int | None
    default: str | None


@dataclass(frozen=True)
class FileDescriptor:
    """A core or extension of meta.xml."""

    core: bool
    row_type: str | None
    locations: tuple[str, ...]
    dialect: Dialect
    id_index: int | None
    fields: tuple[Field, ...] = field(default_factory=tuple)

    @property
    def tag(self) -> str:
        return "core" if self.core else "extension"


def _local(tag: Any) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _children(element: ElementTree.Element, name: str) -> list[ElementTree.Element]:
    return [child for child in element if _local(child.tag).casefold() == name.casefold()]


def _escapes(text: str) -> str:
    """An attribute's backslash escapes decoded (GBIF writes a tab as the two characters \\t)."""
    if "\\" not in text:
        return text
    try:
        return codecs.decode(text.encode("latin-1", "backslashreplace"), "unicode_escape")
    except UnicodeDecodeError:
        return text


def parse_meta(text: str, source: str) -> tuple[FileDescriptor, list[FileDescriptor]]:
    """The core and the extensions of a meta.xml; a malformed one is one TableError. Namespaces are ignored
    (any prefix or quoting; `coreid` and the guide's `coreId` alike)."""
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise TableError(f"{source}: meta.xml declares a DTD or entities, which a descriptor never needs")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as err:
        raise TableError(f"{source}: meta.xml is not XML ({err})") from None
    if _local(root.tag) != "archive":
        raise TableError(f"{source}: meta.xml's root is <{_local(root.tag)}>, not a Darwin Core <archive>")
    cores = _children(root, "core")
    if len(cores) != 1:
        raise TableError(f"{source}: meta.xml has {len(cores)} <core> elements, not one")
    core = _descriptor(cores[0], True, source)
    return core, [_descriptor(e, False, source) for e in _children(root, "extension")]


def _descriptor(element: ElementTree.Element, core: bool, source: str) -> FileDescriptor:
    tag = "core" if core else "extension"
    where = f"{source}: meta.xml <{tag}{' ' + element.get('rowType') if element.get('rowType') else ''}>"
    dialect = _dialect(element, where)
    locations = tuple((loc.text or "").strip() for files in _children(element, "files")
                      for loc in _children(files, "location"))
    if not locations or not all(locations):
        raise TableError(f"{where}: no <files><location> naming its data file")
    id_index = _id_index(element, core, where)
    fields = tuple(_field(item, where) for item in _children(element, "field"))
    return FileDescriptor(core, element.get("rowType"), locations, dialect, id_index, fields)


def _dialect(element: ElementTree.Element, where: str) -> Dialect:
    """The file's delimited-text dialect from its attributes (DEFAULTS where absent); one we do not read raises."""
    attrs = {key: _escapes(element.get(key, default)) for key, default in DEFAULTS.items()}
    if attrs["linesTerminatedBy"] not in LINE_ENDS:
        raise TableError(f"{where}: linesTerminatedBy {attrs['linesTerminatedBy']!r}; lines end with \\n, \\r\\n or "
                         "\\r")
    try:
        header = int(attrs["ignoreHeaderLines"])
    except ValueError:
        header = -1
    if header < 0:
        raise TableError(f"{where}: ignoreHeaderLines {attrs['ignoreHeaderLines']!r} is not a count of lines")
    dialect = Dialect(sep=attrs["fieldsTerminatedBy"], quote=attrs["fieldsEnclosedBy"] or None, header_lines=header,
                      encoding=attrs["encoding"] or "UTF-8")
    dialect.check(where)
    return dialect


def _id_index(element: ElementTree.Element, core: bool, where: str) -> int | None:
    """The column of the core's <id> or an extension's <coreid> (which an extension must have); at most one."""
    tag = "id" if core else "coreid"
    ids = _children(element, tag)
    if len(ids) > 1:
        raise TableError(f"{where}: {len(ids)} <{tag}> elements, not one")
    id_index = _index(ids[0], where, tag) if ids else None
    if ids and id_index is None:
        raise TableError(f"{where}: <{tag}> has no index")
    if not core and id_index is None:
        raise TableError(f"{where}: no <coreid index=...> linking its rows to the core")
    return id_index


def _field(item: ElementTree.Element, where: str) -> Field:
    """One <field>: its term's last part as the name, its column index and/or default (one of them needed)."""
    term = (item.get("term") or "").strip()
    if not term:
        raise TableError(f"{where}: a <field> without a term")
    index = _index(item, where, term)
    if index is None and item.get("default") is None:
        raise TableError(f"{where}: field {term} has neither an index nor a default")
    return Field(term.rstrip("/").rsplit("/", 1)[-1], term, index, item.get("default"))


def _index(element: ElementTree.Element, where: str, what: str) -> int | None:
    text = element.get("index")
    if text is None or not text.strip():
        return None
    if not re.fullmatch(r"\s*\d{1,6}\s*", text):
        raise TableError(f"{where}: {what} has index {text!r}, not a column number (0, 1, ...)")
    return int(text)


def check_location(location: str, source: str) -> str:
    """A member name inside the archive (`./a.txt` is `a.txt`); a URL, an absolute path or a `..` part is refused."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", location):
        raise TableError(f"{source}: meta.xml names {location!r}, not a file of the archive (remote and drive-letter "
                         "locations are never read)")
    path = PurePosixPath(location.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts or "\x00" in location:
        raise TableError(f"{source}: meta.xml names {location!r}, which lies outside the archive")
    return path.as_posix()


class Members:
    """The files of an archive, zipped or unpacked, read in place; every name is checked to lie inside it."""

    def __init__(self, path: Path):
        self.path = path
        self.zip = zipfile.ZipFile(path) if path.is_file() else None
        self.root = None if self.zip is not None else path.resolve()

    def __enter__(self) -> Members:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.zip is not None:
            self.zip.close()

    def source(self, name: str) -> str:
        return f"{self.path}: {name}" if self.zip is not None else str(self.path / name)

    def locate(self, name: str) -> tuple[Callable[[], IO[bytes]], int]:
        """An opener of the member and its uncompressed size; KeyError when absent, TableError when outside."""
        name = check_location(name, str(self.path))
        if self.zip is not None:
            info = self.zip.getinfo(name)  # KeyError when absent
            if info.is_dir():
                raise KeyError(name)
            return (lambda: self.zip.open(info)), info.file_size
        try:
            target = (self.root / name).resolve()
        except (OSError, RuntimeError) as err:  # a symlink loop
            raise TableError(f"{self.path}: {name} cannot be resolved ({err})") from None
        if not target.is_relative_to(self.root):
            raise TableError(f"{self.path}: {name} leads outside the archive folder (a symlink to {target})")
        if not target.exists():
            raise KeyError(name)
        size = stat_regular(target).st_size
        return (lambda: open(target, "rb")), size

    def read_text(self, name: str, limit: int) -> str:
        opener, size = self.locate(name)
        if size > limit:
            raise TableError(f"{self.source(name)}: {size:,} bytes, more than a descriptor ever needs ({limit:,})")
        with opener() as handle:
            data = handle.read(limit + 1)
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise TableError(f"{self.source(name)}: not UTF-8 text ({err.reason} at byte {err.start})") from None

    def files(self) -> list[str]:
        """The regular files of a zip (folders left out); an unpacked folder lists none (it has meta.xml)."""
        return [n for n in self.zip.namelist() if not n.endswith("/")] if self.zip is not None else []


def read_data_file(members: Members, descriptor: FileDescriptor, keep_names: Callable[[str], bool], limits: TableLimits,
                   keep_rows: Callable[[pa.RecordBatch], Any] | None = None) -> pa.Table:
    """The kept fields of a core or extension (every location in turn) as text columns in column order, the id
    column as `ID` when declared; a default fills the blanks of its field (or makes a constant column, last).
    `keep_rows(batch)` may drop rows while reading (`read_delimited`)."""
    first = _kept_fields(members, descriptor, keep_names)
    indexed = [(item.index, 1, name) for name, item in first.items() if item.index is not None]
    if descriptor.id_index is not None:
        indexed.append((descriptor.id_index, 0, ID))
    columns = {name: index for index, _, name in sorted(indexed)}
    declared = {item.name: item.index for item in descriptor.fields if item.index is not None}
    parts = []
    for location in descriptor.locations:
        try:
            opener, size = members.locate(location)
        except KeyError:
            raise TableError(f"{members.path}: meta.xml names {location}, which the archive does not hold") from None
        parts.append(read_delimited(opener, descriptor.dialect, columns, limits, members.source(location),
                                    keep=keep_rows, size=size, declared=declared))
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    if sum(len(p) for p in parts) > limits.max_rows:
        raise TableError(f"{members.source(descriptor.locations[0])}: more than {limits.describe('max_rows')} rows "
                         "(TableLimits)", doc=TableLimits.DOC)
    return _with_defaults(table, first)


def _kept_fields(members: Members, descriptor: FileDescriptor, keep_names: Callable[[str], bool]) -> dict[str, Field]:
    """The kept fields by name; a name declared twice with different terms or columns raises."""
    first: dict[str, Field] = {}
    for item in descriptor.fields:
        if keep_names(item.name):
            if item.name in first and first[item.name] != item:
                raise TableError(f"{members.source(descriptor.locations[0])}: meta.xml declares {item.name} twice "
                                 f"({first[item.name].term} and {item.term})")
            first[item.name] = item
    return first


def _with_defaults(table: pa.Table, fields: dict[str, Field]) -> pa.Table:
    """Each default filling its column's blanks, or appended as a constant column when its field has no index."""
    for name, item in fields.items():
        if item.default is not None:
            constant = pa.array([item.default] * len(table), pa.string()) if item.index is None else None
            if constant is not None:
                table = table.append_column(name, constant)
            else:
                filled = pc.coalesce(table.column(name), pa.scalar(item.default, pa.string()))
                table = table.set_column(table.schema.get_field_index(name), name, filled)
    return table


def star_rows(core_ids: pa.ChunkedArray, ext_ids: pa.ChunkedArray, source: str) -> tuple[np.ndarray, np.ndarray]:
    """The star join as row positions (core rows, extension rows): one pair per extension row whose core id is a
    core row's, in the core's order and then the extension's (as pandas' inner merge orders them). The core ids must
    be unique (DwC-A text guide)."""
    ids = core_ids.combine_chunks()
    present = pc.drop_null(ids)
    if len(pc.unique(present)) != len(present):
        counts = pc.value_counts(present)
        repeated = counts.filter(pc.greater(counts.field("counts"), 1))
        value, times = repeated[0]["values"].as_py(), repeated[0]["counts"].as_py()
        raise TableError(f"{source}: core id {value!r} appears on {times} rows ({len(repeated):,} ids repeat); a "
                         "core's "
                         "<id> must be unique (DwC-A text guide)")
    position = pc.index_in(ext_ids, value_set=ids, skip_nulls=True)
    matched = np.flatnonzero(pc.is_valid(position).to_numpy(zero_copy_only=False))
    where = pc.drop_null(position).to_numpy().astype(np.int64)
    if len(where) > 1 and not (where[1:] >= where[:-1]).all():
        order = np.argsort(where, kind="stable")
        where, matched = where[order], matched[order]
    return where, matched


def take_columns(columns: dict[str, pa.ChunkedArray], rows: np.ndarray) -> dict[str, pa.ChunkedArray]:
    """`columns` at `rows`, emptied column by column as it goes (each source column is freed once taken, so the
    peak is one table and a column, not two tables); the same columns when `rows` is every row in order."""
    n = len(next(iter(columns.values()))) if columns else 0
    if len(rows) == n and (n == 0 or (rows[0] == 0 and (np.diff(rows) == 1).all())):
        out = dict(columns)
        columns.clear()
        return out
    indices = pa.array(rows)
    out = {}
    for name in list(columns):
        out[name] = pc.take(columns.pop(name), indices)
    return out
