"""Resumable image download for occurrence tables: an archive or table in, images plus a table with `file_name` out.

A small client on the standard library (`urllib.request`, threads): a worker pool with a per-host rate limit,
retries with exponential backoff on timeouts, connection errors, 429 and 5xx (4xx are final), a timeout per request;
a cap per species (the first `per_species` URLs in the order of a URL hash, so the cap does not depend on the table's
order); dedupe by URL and by content hash; minimum-size and thumbnail filters (a URL pattern and the image's longer
side). Each image is written atomically (`pipelines.io`) at `image_file_name(url)`, the name make_splits derives from
the same URL, so a file present is complete; the outcome of every URL is appended to `OUT/.fetch/ledger.jsonl`. A
rerun (after a kill -9 too) fetches only what is missing: finished files and final failures are skipped, transient
failures are retried, temp files of a killed run are removed.

Outputs: `OUT/images/...`, `OUT/images.csv` (the input's rows that were fetched, with file_name, sha256, width,
height), `OUT/failures.csv` (url, file_name, species, reason, final), `OUT/fetch_summary.json`, and with a classifier
filter `OUT/filtered.csv` (the rows it dropped, with the predicted class).
"""
from __future__ import annotations

import hashlib
import http.client
import io
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from pipelines.curation.gbif import (BLANK_SPECIES, DUPLICATE_URL, TAXON_FILTER, TaxonFilter, TableError,
                                     read_occurrences)
from pipelines.errors import ConfigError
from pipelines.io import atomic_write_bytes, atomic_write_text
from pipelines.params import REQUIRED, Config, config, param
from pipelines.progress import progress

SPECIES_CAP = "over the species cap"
LEDGER = Path(".fetch") / "ledger.jsonl"


def _check_pattern(pattern: str | None, key: str) -> None:
    try:
        re.compile(pattern or "")
    except re.error as err:
        raise ConfigError(f"{key}: not a regular expression ({err})") from None


@config
class FetchConfig(Config):
    """What fetch_images reads and how it downloads; a fault is one ConfigError naming the key."""

    DOC = "docs/species.md"

    occurrences: str = param(REQUIRED, "GBIF Darwin Core Archive (zip or folder) or a table with a url column")
    out: str = param(REQUIRED, "output folder (images, images.csv, failures.csv)")
    taxa: TaxonFilter = param(TaxonFilter(), "which taxa to fetch")
    per_species: int | None = param(1000, "images a species at most (Open-Insects: 1,000); None: no cap", ge=1)
    workers: int = param(8, "parallel downloads", ge=1, runtime=True)
    rate: float = param(2.0, "requests a second per host at most", gt=0)
    timeout: float = param(30.0, "seconds a request may take", gt=0)
    retries: int = param(3, "retries of a transient failure (timeout, connection error, 429, 5xx)", ge=0)
    backoff: float = param(1.0, "seconds before the first retry, doubled each time", ge=0)
    min_bytes: int = param(1024, "smaller downloads are dropped", ge=0)
    min_side: int = param(128, "thumbnail filter: images whose longer side is shorter are dropped", ge=0)
    thumbnail_pattern: str | None = param(r"(?i)(thumb|/square\.|_sq\.)", "URLs matching it are not fetched",
                                          check=_check_pattern)
    max_bytes: int = param(64 * 2**20, "larger downloads are refused", ge=1)
    retry_failed: bool = param(False, "retry URLs whose failure was final (4xx, filters) too")
    user_agent: str = param("oodforge-fetch/0.1 (research image download)", "the User-Agent header")


class FetchFailure(Exception):
    """One URL's failure: `reason` in words, `final` when a rerun should not retry it."""

    def __init__(self, reason: str, final: bool):
        super().__init__(reason)
        self.reason, self.final = reason, final


class HostLimiter:
    """At most `rate` request starts a second per host (the slot is reserved under a lock, the wait is outside it)."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate
        self.next: dict[str, float] = {}
        self.lock = threading.Lock()

    def wait(self, url: str) -> None:
        host = urlsplit(url).netloc
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next.get(host, now))
            self.next[host] = start + self.interval
        if start > now:
            time.sleep(start - now)


def download(url: str, cfg: FetchConfig, limiter: HostLimiter) -> bytes:
    """The bytes at `url` (redirects followed), retried with backoff on transient failures; else FetchFailure."""
    reason = ""
    for attempt in range(cfg.retries + 1):
        if attempt:
            time.sleep(cfg.backoff * 2 ** (attempt - 1))
        limiter.wait(url)
        try:
            request = urllib.request.Request(url, headers={"User-Agent": cfg.user_agent})
            with urllib.request.urlopen(request, timeout=cfg.timeout) as response:
                data = response.read(cfg.max_bytes + 1)
            if len(data) > cfg.max_bytes:
                raise FetchFailure(f"larger than max_bytes={cfg.max_bytes}", True)
            return data
        except urllib.error.HTTPError as err:
            reason = f"HTTP {err.code}"
            if err.code != 429 and err.code < 500:
                raise FetchFailure(reason, True) from None
        except (TimeoutError, urllib.error.URLError, http.client.HTTPException, OSError) as err:
            cause = getattr(err, "reason", err)
            reason = "timeout" if isinstance(cause, TimeoutError) or "timed out" in str(cause) else f"connection: {cause}"
            if isinstance(err, urllib.error.URLError) and isinstance(cause, ValueError):
                raise FetchFailure(f"bad URL: {cause}", True) from None
        except ValueError as err:  # not a URL urllib can open
            raise FetchFailure(f"bad URL: {err}", True) from None
    raise FetchFailure(f"{reason} (after {cfg.retries} retries)" if cfg.retries else reason, False)


@dataclass
class Plan:
    """The rows to fetch (one per URL) and the rows dropped before any download, by reason."""

    rows: pd.DataFrame
    dropped: Counter


def plan(cfg: FetchConfig) -> Plan:
    """The input read (`read_occurrences`), the taxon filter, rows without species or URL dropped, one row per URL,
    then at most `per_species` URLs a species (ordered by a hash of the URL)."""
    frame = read_occurrences(cfg.occurrences)
    for column in ("url", "species"):
        if column not in frame.columns:
            raise TableError(f"{cfg.occurrences}: no {column} column (a GBIF archive's multimedia identifier, or a "
                             f"table's url column); columns: {', '.join(map(str, frame.columns[:30]))}")
    dropped: Counter = Counter()

    def drop(mask: Any, reason: str) -> None:
        nonlocal frame
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            dropped[reason] += int(mask.sum())
            frame = frame.loc[~mask]

    if cfg.taxa.active:
        drop(~cfg.taxa.keep(frame, cfg.occurrences), TAXON_FILTER)
    drop(frame["species"].isna() | (frame["species"].astype("string").str.strip() == "").fillna(True), BLANK_SPECIES)
    drop(frame["url"].isna(), "no URL")
    drop(frame["url"].duplicated(), DUPLICATE_URL)
    if cfg.per_species is not None:
        key = [hashlib.sha256(u.encode()).hexdigest() for u in frame["url"]]
        order = frame.assign(_key=key).sort_values(["species", "_key"], kind="stable")
        rank = order.groupby("species", sort=False).cumcount()
        over = pd.Series(rank.to_numpy() >= cfg.per_species, index=order.index).reindex(frame.index)
        drop(over.to_numpy(), SPECIES_CAP)
    return Plan(frame.reset_index(drop=True), dropped)


class Fetcher:
    """Downloads a plan's URLs into `out`, resumably (see the module docstring)."""

    def __init__(self, cfg: FetchConfig):
        self.cfg, self.out = cfg, Path(cfg.out)
        self.limiter = HostLimiter(cfg.rate)
        self.thumbnail = re.compile(cfg.thumbnail_pattern) if cfg.thumbnail_pattern else None
        self.lock = threading.RLock()
        self.seen: dict[str, tuple[int, str, str]] = {}  # content hash -> (plan position, file_name, url) of its holder
        self.position: dict[str, int] = {}
        self.records: dict[str, dict[str, Any]] = {}  # url -> last ledger record

    def run(self, rows: pd.DataFrame) -> dict[str, dict[str, Any]]:
        """Fetch every row's URL not already done; returns url -> record (status ok or failed)."""
        remove_stale_temp_files(self.out / "images")
        self.records = read_ledger(self.out / LEDGER)
        self.position = {u: i for i, u in enumerate(rows["url"])}
        for record in list(self.records.values()):
            if record["status"] == "ok":
                try:
                    self._keep(record["sha256"], record["url"], record["file_name"])
                except FetchFailure as failure:  # the plan's order changed: the earlier URL keeps the content
                    (self.out / record["file_name"]).unlink(missing_ok=True)
                    self._record(record["url"], record["file_name"], failure=failure)
        todo = [(u, f) for u, f in zip(rows["url"], rows["file_name"]) if not self._finished(u, f)]
        (self.out / LEDGER).parent.mkdir(parents=True, exist_ok=True)
        with open(self.out / LEDGER, "a", encoding="utf-8") as self.ledger, \
                ThreadPoolExecutor(self.cfg.workers) as pool:
            for _ in progress(pool.map(self._fetch, *zip(*todo)) if todo else [], "fetch", total=len(todo), unit="img"):
                pass
        return self.records

    def _keep(self, digest: str, url: str, file_name: str) -> tuple[int, str, str] | None:
        """Make `url` the holder of the content `digest` unless a URL earlier in the plan holds it; returns the holder
        it replaced (None if none) or raises FetchFailure naming the earlier holder (so the same URL keeps the
        content whatever order the downloads finish in)."""
        here = (self.position.get(url, -1), file_name, url)
        first = self.seen.get(digest)
        if first is not None and first[2] != url and first[0] <= here[0]:
            raise FetchFailure(f"duplicate content of {first[1]}", True)
        self.seen[digest] = here
        return first if first is not None and first[2] != url else None

    def _finished(self, url: str, file_name: str) -> bool:
        """Done (its file exists: atomic writes never leave a partial one) or failed for good."""
        record = self.records.get(url)
        if (self.out / file_name).is_file():
            if record is None or record["status"] != "ok":  # killed between the rename and the ledger line
                try:
                    info = _image_record((self.out / file_name).read_bytes())
                    self._keep(info["sha256"], url, file_name)
                    self._record(url, file_name, ok=info)
                except FetchFailure as failure:
                    (self.out / file_name).unlink()
                    self._record(url, file_name, failure=failure)
            return True
        return record is not None and record["status"] == "failed" and record["final"] and not self.cfg.retry_failed

    def _fetch(self, url: str, file_name: str) -> None:
        try:
            if self.thumbnail is not None and self.thumbnail.search(url):
                raise FetchFailure("thumbnail URL", True)
            data = download(url, self.cfg, self.limiter)
            if len(data) < self.cfg.min_bytes:
                raise FetchFailure(f"too small ({len(data)} bytes < min_bytes={self.cfg.min_bytes})", True)
            info = _image_record(data)
            if max(info["width"], info["height"]) < self.cfg.min_side:
                raise FetchFailure(f"thumbnail ({info['width']}x{info['height']} < min_side={self.cfg.min_side})", True)
            with self.lock:  # writes are serialised so that a replaced holder is never half-written
                replaced = self._keep(info["sha256"], url, file_name)
                atomic_write_bytes(self.out / file_name, data)
                self._record(url, file_name, ok=info)
                if replaced is not None:
                    (self.out / replaced[1]).unlink(missing_ok=True)
                    self._record(replaced[2], replaced[1], failure=FetchFailure(f"duplicate content of {file_name}", True))
        except FetchFailure as failure:
            self._record(url, file_name, failure=failure)

    def _record(self, url: str, file_name: str, *, ok: dict[str, Any] | None = None,
                failure: FetchFailure | None = None) -> None:
        record = {"url": url, "file_name": file_name, "status": "ok", **ok} if ok is not None else \
            {"url": url, "file_name": file_name, "status": "failed", "reason": failure.reason, "final": failure.final}
        with self.lock:
            self.records[url] = record
            if getattr(self, "ledger", None) is not None and not self.ledger.closed:
                self.ledger.write(json.dumps(record) + "\n")
                self.ledger.flush()
            else:
                with open(self.out / LEDGER, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(record) + "\n")


def _image_record(data: bytes) -> dict[str, Any]:
    """sha256, width, height and bytes of an image; FetchFailure when it does not decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            width, height = image.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as err:
        raise FetchFailure(f"not an image ({type(err).__name__})", True) from None
    return {"sha256": hashlib.sha256(data).hexdigest(), "width": int(width), "height": int(height), "bytes": len(data)}


def read_ledger(path: Path) -> dict[str, dict[str, Any]]:
    """url -> its last record (a line cut short by a kill is skipped)."""
    records: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            records[record["url"]] = record
    return records


def remove_stale_temp_files(folder: Path) -> int:
    """Delete temp files a killed writer left (pipelines.io names them `.<name>.<random>.tmp<suffix>`)."""
    removed = 0
    if folder.is_dir():
        for path in folder.rglob(".*.tmp*"):
            if path.is_file():
                path.unlink()
                removed += 1
    return removed


def filter_classes(model: str, drop: Iterable[str]) -> list[str]:
    """The class names of the filter classifier (its config's `id2label`, read without its weights); a class to drop
    that it does not know is one ConfigError, so a fetch is refused before it downloads anything."""
    from transformers import AutoConfig

    from pipelines.runtime import check_model_ref, load_pretrained

    check_model_ref(model, "filter_model")
    config = load_pretrained(AutoConfig.from_pretrained, model, "the filter classifier's config")
    id2label = getattr(config, "id2label", None) or {}
    names = [str(id2label[i]) for i in range(len(id2label))]
    unknown = sorted(set(drop) - set(names))
    if unknown:
        raise ConfigError(f"drop_class: {unknown} not among the classifier's classes {names}")
    return names


def drop_by_classifier(images: pd.DataFrame, root: Path, model: str, drop: Iterable[str], batch_size: int = 32,
                       device: str = "cpu") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run an image-classifier folder over the fetched images; rows whose predicted class is in `drop` (class names
    from the model's id2label) move to the second frame, with `predicted` and `probability`."""
    import torch

    from pipelines.classifier import ImageClassifier
    from pipelines.data import load_image

    names = filter_classes(model, drop)
    classifier = ImageClassifier.from_pretrained(model).to(device).eval()
    predicted, probability = [], []
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            batch = [load_image(root / f) for f in images["file_name"].iloc[start:start + batch_size]]
            logits, _ = classifier(classifier.preprocess(batch).to(device))
            p = torch.softmax(logits.float(), dim=1)
            predicted += [names[i] for i in p.argmax(1).tolist()]
            probability += p.max(1).values.tolist()
    images = images.assign(predicted=predicted, probability=probability)
    out = images["predicted"].isin(list(drop)).to_numpy()
    return images.loc[~out].drop(columns=["predicted", "probability"]), images.loc[out]


def fetch_images(cfg: FetchConfig, filter_model: str | None = None, drop_class: Iterable[str] = ()) -> dict[str, Any]:
    """Plan, fetch, write images.csv / failures.csv / fetch_summary.json (and filtered.csv); returns the summary."""
    out = Path(cfg.out)
    planned = plan(cfg)
    if filter_model is not None:
        filter_classes(filter_model, drop_class)
    records = Fetcher(cfg).run(planned.rows)
    rows = planned.rows
    status = [records.get(u, {}).get("status") for u in rows["url"]]
    ok = rows.loc[[s == "ok" for s in status]].copy()
    for key in ("sha256", "width", "height"):
        ok[key] = [records[u][key] for u in ok["url"]]
    failed = [records[u] | {"species": s} for u, s in zip(rows["url"], rows["species"]) if records.get(u, {}).get("status") == "failed"]
    filtered = ok.iloc[:0]
    if filter_model is not None and len(ok):
        ok, filtered = drop_by_classifier(ok, out, filter_model, drop_class)
        atomic_write_text(out / "filtered.csv", filtered.to_csv(index=False))
    atomic_write_text(out / "images.csv", ok.to_csv(index=False))
    failures = pd.DataFrame(failed, columns=["url", "file_name", "species", "reason", "final"])
    atomic_write_text(out / "failures.csv", failures.to_csv(index=False))
    summary = {"planned": int(len(rows)), "fetched": int(len(ok) + len(filtered)), "kept": int(len(ok)),
               "failed": dict(Counter(_reason_kind(r["reason"]) for r in failed)),
               "dropped": dict(planned.dropped), "filtered": {str(k): int(v) for k, v in
                                                             filtered.get("predicted", pd.Series()).value_counts().items()}}
    atomic_write_text(out / "fetch_summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def fetch_plan(cfg: FetchConfig) -> dict[str, Any]:
    """What `fetch_images` would do, from the input and the ledger alone (the dry run: nothing requested or
    written): rows planned and dropped, how many are already fetched, failed for good (retried only with
    `retry_failed`), and left to fetch, and across how many hosts."""
    planned = plan(cfg)
    records, out = read_ledger(Path(cfg.out) / LEDGER), Path(cfg.out)
    done = final = 0
    hosts = set()
    for url, file_name in zip(planned.rows["url"], planned.rows["file_name"]):
        record = records.get(url)
        if (out / file_name).is_file():
            done += 1
        elif record is not None and record["status"] == "failed" and record["final"] and not cfg.retry_failed:
            final += 1
        else:
            hosts.add(urlsplit(url).netloc)
    todo = len(planned.rows) - done - final
    return {"planned": int(len(planned.rows)), "dropped": dict(planned.dropped), "already_fetched": done,
            "failed_for_good": final, "to_fetch": todo, "hosts": len(hosts)}


def _reason_kind(reason: str) -> str:
    """'HTTP 404', 'timeout (after 3 retries)', 'duplicate content of x' -> a countable kind."""
    return re.sub(r" \(.*\)$| of .*$|: .*$", "", reason)
