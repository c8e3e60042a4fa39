"""Resumable image download for occurrence tables: an archive or table in, images plus a table with `file_name` out.

A client on the standard library (`fetch_client`: http.client, keep-alive, a wall-clock deadline per request, only
http/https), worker threads fed by a per-host scheduler (`fetch_gate`: an adaptive rate per host that backs off on
429/503 and honours `Retry-After`, a fair share of the workers between hosts, an optional fixed cap `rate`), retries
with exponential backoff on timeouts, connection errors, truncated bodies and 5xx (other 4xx are final); a cap per
species (the first `per_species` URLs in the order of a URL hash, so the cap does not depend on the table's order);
dedupe by URL and by content hash; minimum-size and thumbnail filters (a URL pattern and the original's longer side);
a pixel cap read from the header before any decode; resize on fetch (`fetch_resize`: by default the reference's,
Open-Insect's download.py: the shorter side to 224, PIL's JPEG quality 75; img2dataset's keep_ratio one key away). Each
image is written atomically (`pipelines.io`) at its `file_name` (`image_file_name(url)`, the name make_splits derives
from the same URL, unless the table has its own), which must lie under `out` (`fetch_ledger.Paths`). Every outcome is
appended to `OUT/.fetch/ledger.jsonl`; a file present counts as done only when the ledger says this URL wrote it, and
nothing is deleted that the ledger does not prove the fetch wrote. A rerun (after a kill -9 too) fetches only what is
missing: finished files and final failures are skipped, transient failures are retried, temp files of a killed run are
removed. One fetch at a time per `out` (`pipelines.locks.folder_lock`).

Outputs: `OUT/images/...` (with `store: shards`, `OUT/shards/` instead: tar shards in pack_shards' format, written as
images arrive, `fetch_shards`), `OUT/images.csv` (the input's rows that were fetched, with file_name, sha256, width,
height, bytes and the original's original_width, original_height, original_bytes), `OUT/failures.csv` (url,
file_name, species, reason, final), `OUT/fetch_summary.json`, with `keep_originals` the downloaded bytes under
`OUT/originals/<file_name>`, and with a classifier filter `OUT/filtered.csv` (the rows it dropped, with the
predicted class).
"""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
import re
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from pipelines.curation.fetch_client import Client, FetchFailure, Throttled, host_of
from pipelines.curation.fetch_estimate import estimate
from pipelines.curation.fetch_gate import Item, Scheduler
from pipelines.curation.fetch_ledger import LEDGER, FileStore, Ledger, Paths, file_sha256, read_ledger
from pipelines.curation.fetch_resize import IMAGE_COLUMNS, MAX_PIXELS, mode_settings, prepare
from pipelines.curation.fetch_shards import ShardImages, finished_members
from pipelines.curation.gbif import (
    BLANK_SPECIES,
    DUPLICATE_URL,
    TAXON_FILTER,
    TableError,
    TaxonFilter,
    read_occurrences,
)
from pipelines.errors import ConfigError, UserInputError
from pipelines.io import atomic_write_bytes, atomic_write_text, remove_orphan_temps
from pipelines.locks import folder_lock
from pipelines.params import REQUIRED, Config, config, param
from pipelines.progress import progress
from pipelines.shards import SAMPLES_PER_SHARD, SHARD_BYTES, SHARD_FOLDER

__all__ = ["FetchConfig", "FetchFailure", "Fetcher", "HostsThrottled", "LEDGER", "Plan", "fetch_images", "fetch_plan",
           "filter_classes", "plan", "read_ledger"]

SPECIES_CAP = "over the species cap"
DUPLICATE_FILE_NAME = "duplicate file_name"
ORIGINALS = "originals"
ROW_WRITE_ERRORS = frozenset({errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG})
"""Write errors that are one row's (its file_name is a folder, passes through a file, is too long): that row fails
for good and the rest go on; any other (a full disk) stops the run."""
log = logging.getLogger(__name__)


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
    workers: int = param(32, "parallel downloads (shared fairly between the hosts with work)", ge=1, runtime=True)
    rate: float | None = param(None, "requests a second per host at most, a fixed cap; None: adaptive only (starts "
                                     "unthrottled, backs off on 429/503)", gt=0)
    timeout: float = param(30.0, "seconds a request may take, connect to last byte (a wall-clock deadline)", gt=0)
    retries: int = param(3, "retries of a transient failure (timeout, connection error, truncated body, 5xx)", ge=0)
    backoff: float = param(1.0, "seconds before the first retry, doubled each time (also a throttled host's pause "
                                "when it sends no Retry-After)", ge=0)
    retry_after_max: float = param(60.0, "the longest pause a host's Retry-After imposes, in seconds", ge=0)
    give_up_after: int = param(10, "throttle rounds (429/503) in a row with no success before a host's URLs are left "
                                   "for a rerun", ge=1)
    resize: Literal["reference", "keep_ratio", "none"] = param(
        "reference", "resize on fetch: `reference` as Open-Insect's download.py:10-31 (torchvision Resize(224) on the "
                     "shorter side, up or down, no EXIF transpose, PIL's JPEG quality 75), `keep_ratio` as img2dataset "
                     "(shorter side 512, never upscaled, area filter, EXIF applied, quality 95), `none`: the originals")
    short_side: int | None = param(None, "the shorter side of resized images (None: the mode's, 224 / 512)", ge=1)
    quality: int | None = param(None, "JPEG / WebP quality of resized images (None: the mode's, 75 / 95)", ge=1,
                                le=100)
    keep_originals: bool = param(False, "also keep the downloaded bytes under OUT/originals/")
    store: Literal["folder", "shards"] = param("folder", "where fetched images go: `folder`, one file each under OUT; "
                                                         "`shards`, members of tar shards in OUT/shards/ "
                                                         "(pipelines.curation.fetch_shards, docs/shards.md)")
    samples_per_shard: int = param(SAMPLES_PER_SHARD, "with store shards: images a shard at most", ge=1)
    shard_bytes: int = param(SHARD_BYTES, "with store shards: bytes a shard at most (after resize)", ge=1)
    max_pixels: int = param(MAX_PIXELS, "images with more pixels are refused from their header, before decoding (PIL's "
                                        "bomb limit is 89.5 MP)", ge=1)
    min_bytes: int = param(1024, "smaller downloads are dropped", ge=0)
    min_side: int = param(128, "thumbnail filter: images whose longer side is shorter are dropped", ge=0)
    thumbnail_pattern: str | None = param(r"(?i)(thumb|/square\.|_sq\.)", "URLs matching it are not fetched",
                                          check=_check_pattern)
    max_bytes: int = param(64 * 2**20, "larger downloads are refused", ge=1)
    retry_failed: bool = param(False, "retry URLs whose failure was final (4xx, filters) too")
    user_agent: str = param("oodforge-fetch/0.2 (research image download)", "the User-Agent header")


class HostsThrottled(UserInputError):
    """Hosts that answered only 429/503 until given up; their URLs are recorded as transient failures."""

    doc = "docs/species.md"


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
    if "file_name" in frame.columns:  # a table's own names: two URLs never write one file
        drop(frame["file_name"].duplicated() & frame["file_name"].notna(), DUPLICATE_FILE_NAME)
    if cfg.per_species is not None:
        key = [hashlib.sha256(str(u).encode()).hexdigest() for u in frame["url"]]
        order = frame.assign(_key=key).sort_values(["species", "_key"], kind="stable")
        rank = order.groupby("species", sort=False).cumcount()
        over = pd.Series(rank.to_numpy() >= cfg.per_species, index=order.index).reindex(frame.index)
        drop(over.to_numpy(), SPECIES_CAP)
    frame = frame.reset_index(drop=True)
    frame["url"] = frame["url"].astype(str)
    frame["file_name"] = [f if isinstance(f, str) else None for f in frame["file_name"]]
    return Plan(frame, dropped)


class Fetcher:
    """Downloads a plan's URLs into `out`, resumably (see the module docstring). `store` writes a finished image
    (one file each by default)."""

    def __init__(self, cfg: FetchConfig, store: Any = None):
        self.cfg, self.out = cfg, Path(cfg.out)
        settings = mode_settings(cfg.resize, cfg.short_side, cfg.quality)
        self.short_side, self.quality = settings["short_side"], settings["quality"] or 0  # none: never encodes
        self.paths = Paths(self.out)
        self.client = Client(cfg.user_agent, cfg.timeout, cfg.max_bytes)
        self.store = store if store is not None else FileStore(self.out, lambda p, d: atomic_write_bytes(p, d))
        self.shards = ShardImages(self.out / SHARD_FOLDER, cfg) if cfg.store == "shards" else None
        self.thumbnail = re.compile(cfg.thumbnail_pattern) if cfg.thumbnail_pattern else None
        self.lock = threading.RLock()
        self.seen: dict[str, tuple[int, str, str]] = {}  # content hash -> (plan position, file_name, url) of its holder
        self.position: dict[str, int] = {}
        self.records: dict[str, dict[str, Any]] = {}  # url -> last ledger record
        self.ledger: Ledger | None = None
        self.error: BaseException | None = None
        self.given_up: dict[str, dict[str, Any]] = {}  # host -> {urls, rounds, retry_after}
        self.folders: frozenset[str] = frozenset()  # the folders the plan's file_names lie in

    # -- the run -------------------------------------------------------------------------------------------------

    def run(self, rows: pd.DataFrame) -> dict[str, dict[str, Any]]:
        """Fetch every row's URL not already done; returns url -> record (status ok or failed)."""
        for folder in ("images", ORIGINALS):
            remove_orphan_temps(self.out / folder)
        self.records = read_ledger(self.out / LEDGER)
        if self.shards is not None:
            self.shards.open()
        self.ledger = Ledger(self.out)
        try:
            self.position = {u: i for i, u in enumerate(rows["url"])}
            self.folders = folder_names(rows["file_name"])
            self._reload()
            items = [item for item in map(self._classify, rows["url"], rows["file_name"]) if item is not None]
            if items:
                self._download(items)
        finally:
            self.ledger.close()
            if self.shards is not None:
                self.shards.close()
        return self.records

    def _download(self, items: list[Item]) -> None:
        cfg = self.cfg
        scheduler = Scheduler(items, host_of, workers=cfg.workers, cap=cfg.rate, backoff=cfg.backoff,
                              retry_after_max=cfg.retry_after_max, give_up_after=cfg.give_up_after)
        with progress(desc="fetch", total=len(items), unit="img") as bar:
            threads = [threading.Thread(target=self._worker, args=(scheduler, bar), daemon=True,
                                        name=f"fetch-{i}") for i in range(min(cfg.workers, len(items)))]
            for thread in threads:
                thread.start()
            try:
                for thread in threads:
                    thread.join()
            except BaseException:  # Ctrl-C: the workers finish the image in hand and take no other
                scheduler.stop()
                raise
        for host, item in scheduler.given_up:
            state = scheduler.hosts[host]
            entry = self.given_up.setdefault(host, {"urls": 0, "rounds": state.rounds,
                                                    "retry_after": state.last_retry_after})
            entry["urls"] += 1
            self._record(item.url, item.file_name, failure=FetchFailure(
                f"host throttled: {state.rounds} rounds of HTTP 429/503 with no success (rerun later)", False))
        if self.error is not None:
            raise self.error

    def _worker(self, scheduler: Scheduler, bar: Any) -> None:
        try:
            self._work(scheduler, bar)
        finally:
            self.client.close_thread()

    def _work(self, scheduler: Scheduler, bar: Any) -> None:
        cfg = self.cfg
        while (job := scheduler.take()) is not None:
            host, item, started = job
            try:
                try:
                    self._fetch(item, functools.partial(scheduler.answered, host))
                except Throttled as throttle:
                    scheduler.throttled(host, item, started, throttle.retry_after)
                    continue
                except FetchFailure as failure:
                    if not failure.final and item.attempt < cfg.retries:
                        item.attempt += 1
                        scheduler.retry(host, item, cfg.backoff * 2 ** (item.attempt - 1))
                        continue
                    if not failure.final and item.attempt:
                        failure = FetchFailure(f"{failure.reason} (after {item.attempt} retries)", False)
                    self._record(item.url, item.file_name, failure=failure)
                scheduler.finished(host, started)
                with self.lock:
                    bar.update(1)
            except BaseException as err:  # noqa: BLE001 - a full disk, a bug: the run stops, the main thread raises it
                with self.lock:
                    self.error = self.error or err
                scheduler.stop()
                return

    # -- what is done already ------------------------------------------------------------------------------------

    def _reload(self) -> None:
        """The ledger's finished images claim their contents (an earlier URL in this plan's order wins)."""
        for record in list(self.records.values()):
            if record.get("status") == "ok" and record.get("url") in self.position and self.holds(record):
                try:
                    self._keep(record["sha256"], record["url"], record["file_name"])
                except FetchFailure as failure:  # the plan's order changed: the earlier URL keeps the content
                    self._remove_ours(record)
                    self._record(record["url"], record["file_name"], failure=failure)

    def holds(self, record: dict[str, Any]) -> bool:
        """Whether the store still holds the image of a finished record (a file found is checked by `_classify`)."""
        return self.shards is None or self.shards.holds(record)

    def locate(self, file_name: str) -> Any:
        """Where a finished image is read from."""
        member = self.shards.locate(file_name) if self.shards is not None else None
        return member if member is not None else self.out / file_name

    def _classify(self, url: str, file_name: Any) -> Item | None:
        """None when the URL needs no request (done, failed for good, refused); else its Item (`foreign` when a
        file the ledger does not prove this fetch wrote sits at its path)."""
        record = self.records.get(url)
        try:
            path = self.paths.resolve(file_name)
            folder_clash(file_name, self.folders)
        except FetchFailure as failure:
            self._record(url, file_name, failure=failure)
            return None
        if record is not None and record["status"] == "failed" and record.get("final") and not self.cfg.retry_failed:
            return None
        if self.thumbnail is not None and self.thumbnail.search(url):
            self._record(url, file_name, failure=FetchFailure("thumbnail URL", True))
            return None
        if self.shards is not None:  # the shards stand in for the files (fetch_shards)
            return self._classify_in_shards(url, file_name, record)
        return self._classify_file(url, file_name, path, record)

    def _classify_in_shards(self, url: str, file_name: Any, record: dict[str, Any] | None) -> Item | None:
        """`_classify` against the shard store: an Item unless the shards hold the image (adopted when the ledger's
        last line for it is `writing`)."""
        info = self.shards.finished(record, file_name)
        if info is None:
            return Item(url, file_name)
        if record["status"] == "writing":
            self._adopt(url, file_name, info)
        return None

    def _classify_file(self, url: str, file_name: Any, path: Path, record: dict[str, Any] | None) -> Item | None:
        """`_classify` against the image folder: None when the file is this URL's finished image (adopted when the
        ledger's `writing` line and its hash prove it) or is not a regular file (recorded as failed)."""
        try:
            size = path.stat().st_size if path.is_file() else None
        except OSError:
            size = None
        if size is None:
            if path.exists():
                self._record(url, file_name, failure=FetchFailure(f"file_name {file_name!r} exists and is not a "
                                                                  "regular file", True))
                return None
            return Item(url, file_name)
        if record is not None and record.get("file_name") == file_name and record.get("bytes") == size:
            if record["status"] == "ok":
                return None
            if record["status"] == "writing" and file_sha256(path) == record.get("sha256"):
                self._adopt(url, file_name, {k: record[k] for k in IMAGE_COLUMNS if k in record})
                return None
        return Item(url, file_name, extra={"foreign": True})

    def _adopt(self, url: str, file_name: str, info: dict[str, Any]) -> None:
        """Record a file this URL wrote (the ledger's `writing` line and its hash prove it) as finished."""
        try:
            with self.lock:
                self._keep(info["sha256"], url, file_name)
                self._record(url, file_name, ok=info)
        except FetchFailure as failure:
            self._remove_ours({"url": url, "file_name": file_name, **info})
            self._record(url, file_name, failure=failure)

    def _remove_ours(self, record: dict[str, Any]) -> None:
        """Delete an image the ledger says this fetch wrote, if it is still exactly that (its size and hash); a shard
        member cannot leave its shard and stays, unreferenced (fetch_shards)."""
        if self.shards is not None:
            return
        try:
            path = self.paths.resolve(record.get("file_name"))
        except FetchFailure:
            return
        if path.is_file() and path.stat().st_size == record.get("bytes") and file_sha256(path) == record.get("sha256"):
            self.store.remove(path)
            original = self.out / ORIGINALS / record["file_name"]
            if original.is_file() and not original.is_symlink():
                self.store.remove(original)

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

    def _unkeep(self, digest: str, replaced: tuple[int, str, str] | None) -> None:
        """Undo `_keep` for an image that was not written: the content goes back to the holder it replaced."""
        if replaced is None:
            self.seen.pop(digest, None)
        else:
            self.seen[digest] = replaced

    # -- one URL -------------------------------------------------------------------------------------------------

    def _fetch(self, item: Item, answered: Any = None) -> None:
        cfg = self.cfg
        data = self.client.get(item.url)
        if answered is not None:
            answered()
        if len(data) < cfg.min_bytes:
            raise FetchFailure(f"too small ({len(data)} bytes < min_bytes={cfg.min_bytes})", True)
        prepared = prepare(data, item.file_name, self.short_side, cfg.max_pixels, self.quality, cfg.resize)
        if max(prepared.original_width, prepared.original_height) < cfg.min_side:
            raise FetchFailure(f"thumbnail ({prepared.original_width}x{prepared.original_height} < "
                               f"min_side={cfg.min_side})", True)
        path = self.paths.resolve(item.file_name)
        info = prepared.record()
        if item.extra.get("foreign"):
            if not (path.is_file() and file_sha256(path) == info["sha256"]):
                raise FetchFailure("file_name exists and this fetch did not write it (its content differs): move it "
                                   "away or use another --out", True)
            return self._adopt(item.url, item.file_name, info)
        with self.lock:  # writes are serialised so that a replaced holder is never half-written
            replaced = self._keep(info["sha256"], item.url, item.file_name)
            self.ledger.write({"url": item.url, "file_name": item.file_name, "status": "writing", **info})
            try:
                self.write_image(path, prepared.data, data if cfg.keep_originals else None, item.file_name, info)
            except OSError as err:
                if err.errno not in ROW_WRITE_ERRORS:  # a full disk, a refused folder: the run stops in one line
                    raise
                self._unkeep(info["sha256"], replaced)
                raise FetchFailure(f"file_name {item.file_name[:120]!r} cannot be written: {err.strerror}", True) \
                    from None
            self._record(item.url, item.file_name, ok=info)
            if replaced is not None:
                self._remove_ours(self.records.get(replaced[2], {}))
                self._record(replaced[2], replaced[1],
                             failure=FetchFailure(f"duplicate content of {item.file_name}", True))
        return None

    def write_image(self, path: Path, data: bytes, original: bytes | None, file_name: str,
                    info: dict[str, Any] | None = None) -> None:
        """The one step that stores a finished image (and, on request, its original); `info` is its record."""
        if original is not None:
            self.store.write(self.paths.resolve(f"{ORIGINALS}/{file_name}", own=True), original)
        if self.shards is not None:
            self.shards.add(file_name, data, info)
        else:
            self.store.write(path, data)

    def _record(self, url: str, file_name: Any, *, ok: dict[str, Any] | None = None,
                failure: FetchFailure | None = None) -> None:
        record = {"url": url, "file_name": file_name, "status": "ok", **ok} if ok is not None else \
            {"url": url, "file_name": file_name, "status": "failed", "reason": failure.reason, "final": failure.final}
        with self.lock:
            self.records[url] = record
            self.ledger.write(record)


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


def drop_by_classifier(images: pd.DataFrame, locate: Any, model: str, drop: Iterable[str], batch_size: int = 32,
                       device: str = "cpu") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run an image-classifier folder over the fetched images (`locate(file_name)`: where each is read); rows whose
    predicted class is in `drop` (class names from the model's id2label) move to the second frame, with `predicted` and
    `probability`."""
    import torch

    from pipelines.classifier import ImageClassifier
    from pipelines.data import load_image

    names = filter_classes(model, drop)
    classifier = ImageClassifier.from_pretrained(model).to(device).eval()
    predicted, probability = [], []
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            batch = [load_image(locate(f)) for f in images["file_name"].iloc[start:start + batch_size]]
            logits, _ = classifier(classifier.preprocess(batch).to(device))
            p = torch.softmax(logits.float(), dim=1)
            predicted += [names[i] for i in p.argmax(1).tolist()]
            probability += p.max(1).values.tolist()
    images = images.assign(predicted=predicted, probability=probability)
    out = images["predicted"].isin(list(drop)).to_numpy()
    return images.loc[~out].drop(columns=["predicted", "probability"]), images.loc[out]


def fetch_images(cfg: FetchConfig, filter_model: str | None = None, drop_class: Iterable[str] = ()) -> dict[str, Any]:
    """Plan, fetch (holding OUT's lock), write images.csv / failures.csv / fetch_summary.json (and filtered.csv);
    returns the summary. Hosts given up for throttling raise HostsThrottled once everything is written."""
    out = Path(cfg.out)
    planned = plan(cfg)
    if filter_model is not None:
        filter_classes(filter_model, drop_class)
    with folder_lock(out, "fetch_images"):
        fetcher = Fetcher(cfg)
        records = fetcher.run(planned.rows)
        summary = _write_outputs(cfg, planned, records, filter_model, drop_class, fetcher.locate)
    if fetcher.given_up:
        hosts = "; ".join(f"{h}: {v['urls']} URLs after {v['rounds']} rounds"
                          + (f" (last Retry-After {v['retry_after']:.0f} s)" if v["retry_after"] is not None else "")
                          for h, v in sorted(fetcher.given_up.items()))
        raise HostsThrottled(f"{out}: hosts answered only HTTP 429/503 and were given up ({hosts}); their URLs are "
                             "in failures.csv as transient failures and everything else is written: rerun the same "
                             "command later (or with --rate) to fetch them")
    return summary


def _write_outputs(cfg: FetchConfig, planned: Plan, records: dict[str, dict[str, Any]], filter_model: str | None,
                   drop_class: Iterable[str], locate: Any) -> dict[str, Any]:
    out, rows = Path(cfg.out), planned.rows
    status = [records.get(u, {}).get("status") for u in rows["url"]]
    ok = rows.loc[[s == "ok" for s in status]].copy()
    for key in IMAGE_COLUMNS:
        ok[key] = [records[u].get(key) for u in ok["url"]]
    failed = [records[u] | {"species": s} for u, s in zip(rows["url"], rows["species"])
              if records.get(u, {}).get("status") == "failed"]
    filtered = ok.iloc[:0]
    if filter_model is not None and len(ok):
        ok, filtered = drop_by_classifier(ok, locate, filter_model, drop_class)
        atomic_write_text(out / "filtered.csv", filtered.to_csv(index=False))
    atomic_write_text(out / "images.csv", ok.to_csv(index=False))
    failures = pd.DataFrame(failed, columns=["url", "file_name", "species", "reason", "final"])
    atomic_write_text(out / "failures.csv", failures.to_csv(index=False))
    summary = {"planned": int(len(rows)), "fetched": int(len(ok) + len(filtered)), "kept": int(len(ok)),
               "failed": dict(Counter(_reason_kind(r["reason"]) for r in failed)),
               "dropped": dict(planned.dropped),
               "filtered": {str(k): int(v) for k, v in filtered.get("predicted", pd.Series()).value_counts().items()}}
    atomic_write_text(out / "fetch_summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def fetch_plan(cfg: FetchConfig) -> dict[str, Any]:
    """What `fetch_images` would do, from the input and the ledger alone (the dry run: nothing requested or
    written): rows planned and dropped, how many are already fetched, failed for good (retried only with
    `retry_failed`), refused (unsafe file_name) and left to fetch, across how many hosts, and the estimated time and
    disk (`fetch_estimate`)."""
    planned = plan(cfg)
    out = Path(cfg.out)
    records, paths = read_ledger(out / LEDGER), Paths(out)
    folders = folder_names(planned.rows["file_name"])
    members = finished_members(out / SHARD_FOLDER, cfg) if cfg.store == "shards" else None
    done = final = refused = 0
    todo = []
    for url, file_name in zip(planned.rows["url"], planned.rows["file_name"]):
        record = records.get(url)
        try:
            path = paths.resolve(file_name)
            folder_clash(file_name, folders)
        except FetchFailure:
            refused += 1
            continue
        if record is not None and record["status"] == "failed" and record.get("final") and not cfg.retry_failed:
            final += 1
        elif (record is not None and record["status"] in ("ok", "writing") and record.get("file_name") == file_name
              and _stored_size(path, members, file_name) == record.get("bytes")):
            done += 1
        else:
            todo.append(url)
    hosts = Counter(map(host_of, todo))
    return {"planned": int(len(planned.rows)), "dropped": dict(planned.dropped), "already_fetched": done,
            "failed_for_good": final, "refused": refused, "to_fetch": len(todo), "hosts": len(hosts),
            "estimate": estimate(hosts, records)}


def folder_names(file_names: Iterable[Any]) -> frozenset[str]:
    """Every folder the file names lie in ('a/b/c.jpg' -> 'a', 'a/b'), normalised as `folder_clash` compares them."""
    folders = set()
    for name in file_names:
        if isinstance(name, str):
            parts = os.path.normpath(name).split(os.sep)[:-1]
            folders.update("/".join(parts[:n]) for n in range(1, len(parts) + 1))
    return frozenset(folders)


def folder_clash(file_name: str, folders: frozenset[str]) -> None:
    """A final FetchFailure when `file_name` is a folder other rows' images go into (one would overwrite the other)."""
    if os.path.normpath(file_name) in folders:
        raise FetchFailure(f"unsafe file_name {file_name[:120]!r}: other rows' file_names lie in this folder", True)


def _stored_size(path: Path, members: dict[str, Any] | None, file_name: str) -> int | None:
    """The size of a fetched image as stored: its shard member's (`members` given), else its file's."""
    if members is not None:
        member = members.get(file_name)
        return None if member is None else member.size
    return path.stat().st_size if path.is_file() else None


def _reason_kind(reason: str) -> str:
    """'HTTP 404', 'timeout (after 3 retries)', 'duplicate content of x' -> a countable kind."""
    return re.sub(r" \(.*\)$| of .*$|: .*$", "", reason)
