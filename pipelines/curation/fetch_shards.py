"""`fetch_images` with `store: shards`: each fetched (resized) image goes straight into the shard store `OUT/shards/`
(`pipelines.shard_stream`, pack_shards' format: `store.json`, `NNNNNN.tar` + `NNNNNN.index.json`), no file per image.
`ShardImages` is what `fetch.Fetcher` asks, in place of the files, what is stored and where it goes.

The ledger and the shards agree on what is done: a URL is finished when the ledger says this URL wrote its
file_name (`ok`, or `writing` whose sha256 the member's bytes have) and a finished shard holds a member of that
file_name and size. A kill -9 loses the shard being written; the rerun names it in one line, rewrites it and fetches
its images again; a truncated or changed finished shard, or a store written with other resize settings, is one
ShardError (exit 2) and nothing is deleted. A member whose URL later turned out to duplicate an earlier URL's
content stays in its shard, unreferenced (images.csv and make_splits take only the ledger's finished rows).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pipelines.curation.fetch_resize import IMAGE_COLUMNS, mode_settings
from pipelines.shard_stream import ShardStream
from pipelines.store import STORE_FILE, MemberPath, ShardError, store_members


def fetch_settings(cfg: Any) -> dict[str, Any]:
    """What decides the stored bytes of a fetch (recorded in every shard index, compared on resume)."""
    return mode_settings(cfg.resize, cfg.short_side, cfg.quality)


def finished_members(root: Path, cfg: Any) -> dict[str, MemberPath]:
    """The store's finished members, read only (the dry run's view; nothing is removed), after the same checks a run
    makes of the finished shards and of the settings they were written with."""
    if (root / STORE_FILE).is_file():
        settings = fetch_settings(cfg)
        try:
            found = {k: json.loads((root / STORE_FILE).read_text(encoding="utf-8")).get(k) for k in settings}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
            raise ShardError(f"{root / STORE_FILE}: malformed shard store index ({err})") from None
        if found != settings:
            raise ShardError(f"{root / STORE_FILE}: written with {found}, this run asks {settings}; use the same "
                             "resize options or another --out")
    return store_members(root)


class ShardImages:
    """The fetched images of one run as shard members (module docstring); `open` reads and checks the store."""

    def __init__(self, root: Path, cfg: Any):
        self.root, self.cfg = root, cfg
        self.stream: ShardStream | None = None

    def open(self) -> None:
        self.stream = ShardStream(self.root, fetch_settings(self.cfg), self.cfg.samples_per_shard,
                                  self.cfg.shard_bytes)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()

    def holds(self, record: dict[str, Any]) -> bool:
        """A finished shard holds the member a finished record wrote (its file_name, its size)."""
        member = self.stream.members.get(record.get("file_name"))
        return member is not None and member.size == record.get("bytes")

    def finished(self, record: dict[str, Any] | None, file_name: str) -> dict[str, Any] | None:
        """The image columns of a URL whose image is stored (None: fetch it): a finished member of its file_name
        agrees with the ledger's `ok` line, or with its `writing` line's sha256 (killed after the shard, before
        `ok`)."""
        if record is None or record.get("file_name") != file_name or not self.holds(record):
            return None
        if record["status"] == "ok" or (record["status"] == "writing" and hashlib.sha256(
                self.stream.members[file_name].read_bytes()).hexdigest() == record.get("sha256")):
            return {k: record[k] for k in IMAGE_COLUMNS if k in record}
        return None

    def add(self, file_name: str, data: bytes, info: dict[str, Any] | None) -> None:
        fields = {"original_size": [info["original_width"], info["original_height"]],
                  "size": [info["width"], info["height"]]} if info else {}
        self.stream.add(file_name, data, fields)

    def locate(self, file_name: str) -> MemberPath | None:
        return self.stream.members.get(file_name) if self.stream is not None else None
