"""A GBIF download as GBIF lays it out (meta.xml + occurrence.txt + multimedia.txt, tab separated, unquoted, the real
column names and meta.xml layout), built by the tests of pipelines.curation."""
from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import pandas as pd

DWC, GBIF, DC = "http://rs.tdwg.org/dwc/terms/", "http://rs.gbif.org/terms/1.0/", "http://purl.org/dc/terms/"
OCC_TERMS = [GBIF + "gbifID", DC + "identifier", DC + "type", DC + "license", DWC + "basisOfRecord",
             DWC + "occurrenceID", DWC + "lifeStage",
             DWC + "decimalLatitude", DWC + "decimalLongitude", DWC + "scientificName", DWC + "kingdom", DWC + "order",
             DWC + "family", DWC + "genus", DWC + "taxonRank", DWC + "taxonomicStatus", GBIF + "taxonKey",
             GBIF + "orderKey", GBIF + "familyKey", GBIF + "genusKey", GBIF + "speciesKey", GBIF + "species",
             DWC + "locality"]
MEDIA_TERMS = [GBIF + "gbifID", DC + "type", DC + "format", DC + "identifier", DC + "references", DC + "title",
               DC + "creator", DC + "license"]


def meta_xml() -> str:
    """meta.xml as GBIF writes it: `<id index="0"/>` beside the gbifID field at index 0, `\\t` separators, no quotes."""
    def section(tag: str, row_type: str, location: str, id_tag: str, terms: list[str]) -> str:
        fields = "\n".join(f'    <field index="{i}" term="{t}"/>' for i, t in enumerate(terms))
        return (f'  <{tag} encoding="UTF-8" fieldsTerminatedBy="\\t" linesTerminatedBy="\\n" fieldsEnclosedBy="" '
                f'ignoreHeaderLines="1" rowType="{row_type}">\n    <files>\n      <location>{location}</location>\n'
                f'    </files>\n    <{id_tag} index="0" />\n{fields}\n  </{tag}>')
    return ('<?xml version="1.0" encoding="utf-8"?>\n<archive xmlns="http://rs.tdwg.org/dwc/text/" '
            'metadata="metadata.xml">\n'
            + section("core", DWC + "Occurrence", "occurrence.txt", "id", OCC_TERMS) + "\n"
            + section("extension", GBIF + "Multimedia", "multimedia.txt", "coreid", MEDIA_TERMS) + "\n</archive>\n")


def tsv(terms: list[str], rows: list[dict]) -> str:
    names = [t.rsplit("/", 1)[-1] for t in terms]
    return "\t".join(names) + "\n" + "".join("\t".join("" if r.get(n) is None else str(r[n]) for n in names) + "\n"
                                             for r in rows)


def occurrence(gbif_id: int, species: str, lat, lon, *, family="Noctuidae", genus=None, order="Lepidoptera",
               status="ACCEPTED", rank="SPECIES", key=None) -> dict:
    genus = genus or (species.split()[0] if species else "")
    return dict(gbifID=gbif_id, identifier=f"urn:catalog:{gbif_id}", type="PhysicalObject", license="CC_BY_4_0",
                basisOfRecord="HUMAN_OBSERVATION", occurrenceID=f"urn:{gbif_id}",
                lifeStage="Adult", decimalLatitude=lat, decimalLongitude=lon, scientificName=f"{species} (L., 1758)",
                kingdom="Animalia", order=order, family=family, genus=genus, taxonRank=rank, taxonomicStatus=status,
                taxonKey=key, orderKey=797, familyKey=zlib.crc32(family.encode()) % 10**7,
                genusKey=zlib.crc32(genus.encode()) % 10**7,
                speciesKey=key, species=species, locality='a "quoted" field\twith no escape'.replace("\t", " "))


def build_archive(folder: Path, *, images_per_species: int = 12, zipped: bool = True,
                  base: str = "https://images.example.org") -> tuple[Path, pd.DataFrame]:
    """An archive of: 3 ID moths in NE-America, local moths, Australian moths, auxiliary moths, butterflies
    (Nymphalidae), a synonym, a genus-rank record, a blank species, an occurrence without coordinates, a duplicate
    URL, a video, and an occurrence with two images, image URLs under `base`. Returns the archive and the ID species
    table."""
    occ, media = [], []
    next_id = [1000]

    def add(species: str, lat, lon, n: int = images_per_species, **kw) -> None:
        key = 5000 + zlib.crc32(species.encode()) % 10**6
        for _ in range(n):
            gid = next_id[0]
            next_id[0] += 1
            occ.append(occurrence(gid, species, lat, lon, key=key, **kw))
            media.append(dict(gbifID=gid, type="StillImage", format="image/jpeg",
                              identifier=f"{base}/{gid}/original.jpg", creator="someone"))

    for i in range(3):
        add(f"Idmoth sp{i}", 50.0 + i, -70.0)
    add("Idmoth local", 41.5, -70.0, n=6)  # local OOD of NE-America (same genus: hop 1)
    add("Ausmoth one", -25.0, 135.0, n=8, family="Erebidae")
    for i in range(4):
        add(f"Auxmoth sp{i}", 0.0, 20.0 + i, n=25, family="Geometridae")
    add("Vanessa cardui", 50.0, -70.0, n=7, family="Nymphalidae")  # a butterfly: out by the moth rule
    add("Synonym moth", 0.0, 10.0, n=6, status="SYNONYM")
    add("Genusonly", 0.0, 10.0, n=6, rank="GENUS")
    add("Beetle one", 0.0, 10.0, n=5, order="Coleoptera", family="Carabidae")
    occ.append(occurrence(90001, "", 0.0, 10.0, key=""))  # blank species (an order-level record)
    occ[-1].update(taxonRank="SPECIES")
    media.append(dict(gbifID=90001, type="StillImage", identifier=f"{base}/blank.jpg"))
    occ.append(occurrence(90002, "Auxmoth sp0", "", "", key=7, family="Geometridae"))  # no coordinates
    media.append(dict(gbifID=90002, type="StillImage", identifier=f"{base}/nocoords.jpg"))
    media.append(dict(gbifID=1000, type="StillImage", identifier=f"{base}/1001/original.jpg"))  # dup URL
    media.append(dict(gbifID=1000, type="MovingImage", identifier=f"{base}/video.mp4"))  # not an image
    media.append(dict(gbifID=1002, type="StillImage", identifier=f"{base}/1002/second.png"))  # 2nd image
    folder.mkdir(parents=True, exist_ok=True)
    files = {"meta.xml": meta_xml(), "occurrence.txt": tsv(OCC_TERMS, occ), "multimedia.txt": tsv(MEDIA_TERMS, media),
             "verbatim.txt": "gbifID\tverbatimLocality\n1000\tsomewhere\n", "metadata.xml": "<eml/>\n",
             "citations.txt": "cite GBIF\n", "rights.txt": "CC BY\n"}
    ids = pd.DataFrame({"region": "ne-america", "species": [f"Idmoth sp{i}" for i in range(3)]})
    if zipped:
        path = folder / "0012345-250101000000000.zip"
        with zipfile.ZipFile(path, "w") as zf:
            for name, text in files.items():
                zf.writestr(name, text)
            zf.writestr("dataset/abc.xml", "<eml/>\n")
    else:
        path = folder / "archive"
        path.mkdir()
        for name, text in files.items():
            (path / name).write_text(text)
    return path, ids


# -- archives as strangers write them: any meta.xml, any member, bombs --------------------------------------------

def section(tag: str = "core", *, location: str = "occurrence.txt", fields: list[tuple] = (), id_index: int | None = 0,
            id_tag: str | None = None, row_type: str | None = None, attrs: dict[str, str] | None = None) -> str:
    """One <core> / <extension> of meta.xml: `fields` are (index, term) or (index, term, default) with index None for a
    constant; GBIF's attributes unless `attrs` replaces some (a value None leaves the attribute out)."""
    row_type = row_type or (DWC + "Occurrence" if tag == "core" else GBIF + "Multimedia")
    base = {"encoding": "UTF-8", "fieldsTerminatedBy": "\\t", "linesTerminatedBy": "\\n", "fieldsEnclosedBy": "",
            "ignoreHeaderLines": "1", "rowType": row_type, **(attrs or {})}
    attributes = " ".join(f'{k}="{v}"' for k, v in base.items() if v is not None)
    items = []
    for item in fields:
        index, term, default = (*item, None)[:3]
        items.append("<field" + (f' index="{index}"' if index is not None else "") + f' term="{term}"'
                     + (f' default="{default}"' if default is not None else "") + "/>")
    id_tag = id_tag or ("id" if tag == "core" else "coreid")
    ident = f'<{id_tag} index="{id_index}"/>' if id_index is not None else ""
    return f"<{tag} {attributes}><files><location>{location}</location></files>{ident}{''.join(items)}</{tag}>"


def archive_xml(*sections: str, xmlns: str = ' xmlns="http://rs.tdwg.org/dwc/text/"') -> str:
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<archive{xmlns}>' + "".join(sections) + "</archive>\n"


GBIF_CORE = [(i, t) for i, t in enumerate(OCC_TERMS)]
GBIF_MEDIA = [(i, t) for i, t in enumerate(MEDIA_TERMS)]


def gbif_meta(core_fields: list[tuple] = GBIF_CORE, media_fields: list[tuple] | None = GBIF_MEDIA, **core_kw) -> str:
    """GBIF's meta.xml with the core's fields (or section keywords) replaced; `media_fields` None: no extension."""
    parts = [section("core", fields=core_fields, **core_kw)]
    if media_fields is not None:
        parts.append(section("extension", location="multimedia.txt", fields=media_fields))
    return archive_xml(*parts)


def small_gbif(n: int = 3, base: str = "https://images.example.org") -> tuple[str, str]:
    """occurrence.txt and multimedia.txt of `n` moths with one image each (GBIF's columns)."""
    occ = [occurrence(100 + i, f"Idmoth sp{i}", 50.0, -70.0, key=7000 + i) for i in range(n)]
    media = [dict(gbifID=100 + i, type="StillImage", identifier=f"{base}/{100 + i}.jpg") for i in range(n)]
    return tsv(OCC_TERMS, occ), tsv(MEDIA_TERMS, media)


def write_archive(folder: Path, files: dict[str, str | bytes], zipped: bool = True) -> Path:
    """`files` (name -> text or bytes) as a zip `folder.zip` or an unpacked folder `folder`."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    if zipped:
        path = folder.with_suffix(".zip")
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in files.items():
                zf.writestr(name, data)
        return path
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return folder


def _member(name: str, method: int, data: bytes, crc: int, size: int) -> tuple[bytes, bytes]:
    """A zip member's local header + data and its central directory entry (offset patched by `raw_zip`)."""
    import struct

    encoded = name.encode()
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(data), size, len(encoded), 0)
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc, len(data), size, len(encoded),
                          0, 0, 0, 0, 0, 0)
    return local + encoded + data, central + encoded


def bomb_zip(path: Path, files: dict[str, str], bomb: str, head: bytes, fill: bytes, repeat: int, tail: bytes) -> Path:
    """A zip whose member `bomb` is `head + fill * repeat + tail` (e.g. one 1 GiB field), stored as a deflate stream
    whose flushed `fill` block is repeated (so a GiB costs a few MB and no GiB of compression work), beside `files`."""
    import struct

    path.parent.mkdir(parents=True, exist_ok=True)
    members = []
    for name, text in files.items():
        data = text.encode()
        members.append(_member(name, 0, data, zlib.crc32(data), len(data)))
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    start = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(fill) + deflate.flush(zlib.Z_FULL_FLUSH)  # no back-reference crosses a full flush
    end = deflate.compress(tail) + deflate.flush(zlib.Z_FINISH)
    crc = zlib.crc32(head)
    for _ in range(repeat):
        crc = zlib.crc32(fill, crc)
    crc = zlib.crc32(tail, crc)
    size = len(head) + len(fill) * repeat + len(tail)
    members.append(_member(bomb, 8, start + block * repeat + end, crc, size))
    with open(path, "wb") as out:
        central, offset = b"", 0
        for local, entry in members:
            central += entry[:42] + struct.pack("<L", offset) + entry[46:]
            out.write(local)
            offset += len(local)
        out.write(central)
        out.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), offset, 0))
    return path
