"""A GBIF download as GBIF lays it out (meta.xml + occurrence.txt + multimedia.txt, tab separated, unquoted, the real
column names and meta.xml layout), built by the tests of pipelines.curation."""
from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import pandas as pd

DWC, GBIF, DC = "http://rs.tdwg.org/dwc/terms/", "http://rs.gbif.org/terms/1.0/", "http://purl.org/dc/terms/"
OCC_TERMS = [GBIF + "gbifID", DC + "identifier", DC + "type", DC + "license", DWC + "basisOfRecord", DWC + "occurrenceID", DWC + "lifeStage",
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
    return ('<?xml version="1.0" encoding="utf-8"?>\n<archive xmlns="http://rs.tdwg.org/dwc/text/" metadata="metadata.xml">\n'
            + section("core", DWC + "Occurrence", "occurrence.txt", "id", OCC_TERMS) + "\n"
            + section("extension", GBIF + "Multimedia", "multimedia.txt", "coreid", MEDIA_TERMS) + "\n</archive>\n")


def tsv(terms: list[str], rows: list[dict]) -> str:
    names = [t.rsplit("/", 1)[-1] for t in terms]
    return "\t".join(names) + "\n" + "".join("\t".join("" if r.get(n) is None else str(r[n]) for n in names) + "\n" for r in rows)


def occurrence(gbif_id: int, species: str, lat, lon, *, family="Noctuidae", genus=None, order="Lepidoptera",
               status="ACCEPTED", rank="SPECIES", key=None) -> dict:
    genus = genus or (species.split()[0] if species else "")
    return dict(gbifID=gbif_id, identifier=f"urn:catalog:{gbif_id}", type="PhysicalObject", license="CC_BY_4_0", basisOfRecord="HUMAN_OBSERVATION", occurrenceID=f"urn:{gbif_id}",
                lifeStage="Adult", decimalLatitude=lat, decimalLongitude=lon, scientificName=f"{species} (L., 1758)",
                kingdom="Animalia", order=order, family=family, genus=genus, taxonRank=rank, taxonomicStatus=status,
                taxonKey=key, orderKey=797, familyKey=zlib.crc32(family.encode()) % 10**7, genusKey=zlib.crc32(genus.encode()) % 10**7,
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
