"""An occurrence table written as a GBIF download lays it out: a zip of `meta.xml`, `occurrence.txt` (GBIF's column
names and order for the columns the project reads, filler columns up to GBIF's width, tab separated, unquoted) and
`multimedia.txt` (one still image a row, its URL in `identifier`), for benchmarks and end-to-end runs at the papers'
size (`benchmarks/gbif.py`, `benchmarks/splits.py --archive`). Built column-wise with pyarrow in chunks, so
millions of rows take seconds and little memory."""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

DWC, GBIF, DC = "http://rs.tdwg.org/dwc/terms/", "http://rs.gbif.org/terms/1.0/", "http://purl.org/dc/terms/"
OCCURRENCE_TERMS = [GBIF + "gbifID", DC + "identifier", DC + "license", DC + "rightsHolder", DC + "type",
                    DWC + "basisOfRecord", DWC + "occurrenceID", DWC + "lifeStage", DWC + "countryCode",
                    DWC + "decimalLatitude", DWC + "decimalLongitude", DWC + "scientificName", DWC + "kingdom",
                    DWC + "phylum", DWC + "class", DWC + "order", DWC + "family", DWC + "genus", DWC + "taxonRank",
                    DWC + "taxonomicStatus", GBIF + "datasetKey", GBIF + "taxonKey", GBIF + "orderKey",
                    GBIF + "familyKey", GBIF + "genusKey", GBIF + "speciesKey", GBIF + "species"]
"""The occurrence.txt columns the project reads (GBIF's relative order; GBIF ships about 250 columns in all)."""
MEDIA_TERMS = [GBIF + "gbifID", DC + "type", DC + "format", DC + "identifier", DC + "references", DC + "created",
               DC + "creator", DC + "publisher", DC + "license", DC + "rightsHolder"]
DATASETS = ("50c9509d-22c7-4a22-a47d-8c48425ef4a7", "7a3679ef-5582-4aaa-81f0-8c2545cafc81",
            "e45c7d91-81c6-4455-86e3-2965a5739b1f")
COUNTRIES = ("US", "CA", "GB", "DE", "FR", "AU", "CR", "PA", "MX", "NL")


def _meta(occurrence_terms: list[str]) -> str:
    def section(tag: str, row_type: str, location: str, id_tag: str, terms: list[str]) -> str:
        fields = "\n".join(f'    <field index="{i}" term="{t}"/>' for i, t in enumerate(terms))
        return (f'  <{tag} encoding="UTF-8" fieldsTerminatedBy="\\t" linesTerminatedBy="\\n" fieldsEnclosedBy="" '
                f'ignoreHeaderLines="1" rowType="{row_type}">\n    <files>\n      <location>{location}</location>\n'
                f'    </files>\n    <{id_tag} index="0" />\n{fields}\n  </{tag}>')
    return ('<?xml version="1.0" encoding="utf-8"?>\n<archive xmlns="http://rs.tdwg.org/dwc/text/" '
            'metadata="metadata.xml">\n' + section("core", DWC + "Occurrence", "occurrence.txt", "id", occurrence_terms)
            + "\n" + section("extension", GBIF + "Multimedia", "multimedia.txt", "coreid", MEDIA_TERMS)
            + "\n</archive>\n")


def _text(values: np.ndarray, prefix: str = "", suffix: str = "") -> pa.Array:
    out = pc.cast(pa.array(values), pa.string())
    return pc.binary_join_element_wise(prefix, out, suffix, "") if prefix or suffix else out


def _pick(choices: tuple[str, ...], index: np.ndarray) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(index % len(choices), pa.int32()),
                                          pa.array(choices)).cast(pa.string())


def _chunk(occ: pd.DataFrame, start: int, stop: int, columns: int,
           rng: np.random.Generator) -> tuple[pa.Table, pa.Table]:
    part = occ.iloc[start:stop]
    n = len(part)
    row = np.arange(start, stop, dtype=np.int64)
    gbif_id = row + 1_000_000_000
    species = pa.array(part["species"].astype(object).to_numpy(), pa.string())
    genus = pa.array(part["genus"].astype(object).to_numpy(), pa.string())
    family = pa.array(part["family"].astype(object).to_numpy(), pa.string())
    key = part["species"].cat.codes.to_numpy(np.int64) + 1_000_000
    genus_key = part["genus"].cat.codes.to_numpy(np.int64) + 2_000_000
    family_key = part["family"].cat.codes.to_numpy(np.int64) + 9_000
    moth = part["taxon"].to_numpy() == "moth" if "taxon" in part.columns else np.ones(n, dtype=bool)
    occurrence = {
        "gbifID": _text(gbif_id), "identifier": _text(gbif_id, "https://www.inaturalist.org/observations/"),
        "license": _pick(("CC_BY_4_0", "CC_BY_NC_4_0", "CC0_1_0"), gbif_id),
        "rightsHolder": _text(row % 5000, "observer "),
        "type": _pick(("", "StillImage"), gbif_id), "basisOfRecord": _pick(("HUMAN_OBSERVATION",), gbif_id),
        "occurrenceID": _text(gbif_id, "https://www.inaturalist.org/observations/"),
        "lifeStage": _pick(("Adult", "", "Adult", "Larva"), gbif_id), "countryCode": _pick(COUNTRIES, row),
        "decimalLatitude": _text(np.round(part["lat"].to_numpy(), 6)),
        "decimalLongitude": _text(np.round(part["lon"].to_numpy(), 6)),
        "scientificName": pc.binary_join_element_wise(species, " (Author, ", _text(1758 + key % 250), ")", ""),
        "kingdom": _pick(("Animalia",), row), "phylum": _pick(("Arthropoda",), row), "class": _pick(("Insecta",), row),
        "order": pa.array(np.where(moth, "Lepidoptera", "Coleoptera"), pa.string()), "family": family, "genus": genus,
        "taxonRank": _pick(("SPECIES",), row), "taxonomicStatus": _pick(("ACCEPTED",), row),
        "datasetKey": _pick(DATASETS, row // 7), "taxonKey": _text(key), "orderKey": _pick(("797",), row),
        "familyKey": _text(family_key), "genusKey": _text(genus_key), "speciesKey": _text(key), "species": species,
    }
    filler = [_pick(("", "", f"value {i}", "12.5", "2021-06-0" + str(i % 9 + 1)), rng.integers(0, 5, n))
              for i in range(max(columns - len(occurrence), 0))]
    core = pa.table({**occurrence, **{f"field{i}": f for i, f in enumerate(filler)}})
    url = _text(gbif_id, "https://inaturalist-open-data.s3.amazonaws.com/photos/", "/original.jpg")
    media = pa.table({
        "gbifID": _text(gbif_id), "type": _pick(("StillImage",), row), "format": _pick(("image/jpeg",), row),
        "identifier": url, "references": _text(gbif_id, "https://www.inaturalist.org/photos/"),
        "created": _pick(("2021-06-01T10:00:00Z", "2022-07-15T21:30:00Z"), row),
        "creator": _text(row % 5000, "observer "), "publisher": _pick(("iNaturalist",), row),
        "license": _pick(("http://creativecommons.org/licenses/by-nc/4.0/",
                          "http://creativecommons.org/licenses/by/4.0/"), row),
        "rightsHolder": _text(row % 5000, "observer "),
    })
    return core, media


def write_gbif_archive(path: str | os.PathLike, occ: pd.DataFrame, *, columns: int = 130, seed: int = 0,
                       chunk_rows: int = 200_000) -> Path:
    """Write `occ` (gen.insects.synthetic_occurrences' table: species, genus, family, lat, lon, taxon) as a GBIF
    download zip of `columns` occurrence columns, one image per occurrence (`taxon` other than "moth" becomes order
    Coleoptera, so Open-Insects' moth rule drops it). Returns the path."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    occ = occ.assign(**{c: occ[c].astype("category") for c in ("species", "genus", "family")})
    terms = OCCURRENCE_TERMS + [f"{DWC}field{i}" for i in range(max(columns - len(OCCURRENCE_TERMS), 0))]
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("meta.xml", _meta(terms))
        zf.writestr("metadata.xml", "<eml/>\n")
        for member, which in (("occurrence.txt", 0), ("multimedia.txt", 1)):
            with zf.open(member, "w", force_zip64=True) as handle:
                header = [t.rsplit("/", 1)[-1] for t in (terms if which == 0 else MEDIA_TERMS)]
                handle.write(("\t".join(header) + "\n").encode())  # unquoted, as GBIF writes it
                for start in range(0, len(occ), chunk_rows):
                    table = _chunk(occ, start, min(start + chunk_rows, len(occ)), columns, rng)[which]
                    pacsv.write_csv(table, handle, pacsv.WriteOptions(include_header=False, delimiter="\t",
                                                                      quoting_style="none"))
    return path
