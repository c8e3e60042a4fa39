"""A reader of the Princeton WordNet 3.0 database files (`data.noun`, `data.adj`; Debian package `wordnet-base`
installs them under /usr/share/wordnet), parsed directly: no nltk, nothing downloaded.

NegLabel's corpus is one word per synset: the synset's first lemma, lower-cased, underscores as spaces, adjective
markers such as "(a)" removed, grouped by lexicographer file (noun.artifact, adj.all, ...). That is what the
official `txtfiles/<lexname>.txt` lists hold (XueJiang16/NegLabel), which leave out noun.animal and noun.food.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Sequence

# lexicographer file numbers of WordNet 3.0 (lexnames(5WN))
LEXNAMES: tuple[str, ...] = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute",
    "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant", "noun.possession",
    "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition", "verb.consumption",
    "verb.contact", "verb.creation", "verb.emotion", "verb.motion", "verb.perception", "verb.possession",
    "verb.social", "verb.stative", "verb.weather", "adj.ppl",
)
# the lexicographer files the official NegLabel corpus leaves out
NEGLABEL_EXCLUDED: tuple[str, ...] = ("noun.animal", "noun.food")
DEFAULT_ROOTS: tuple[str, ...] = ("/usr/share/wordnet", "/usr/local/WordNet-3.0/dict", "/usr/share/wordnet/dict")
_MARKER = re.compile(r"\((?:a|p|ip)\)$")
INSTALL_HINT = "install WordNet 3.0 (Debian/Ubuntu: apt-get install wordnet-base) or set $WNHOME / pass wordnet_dir"


def wordnet_dir(root: str | os.PathLike | None = None) -> Path:
    """The folder holding `data.noun`: `root`, else $WNHOME (or $WNHOME/dict), else the usual install paths."""
    candidates = [Path(root)] if root else []
    if not root and os.environ.get("WNHOME"):
        candidates += [Path(os.environ["WNHOME"]), Path(os.environ["WNHOME"]) / "dict"]
    if not root:
        candidates += [Path(p) for p in DEFAULT_ROOTS]
    for folder in candidates:
        if (folder / "data.noun").is_file():
            return folder
    raise FileNotFoundError(f"no WordNet database (data.noun) in {[str(c) for c in candidates]}: {INSTALL_HINT}")


def clean_lemma(word: str) -> str:
    """A data-file lemma as a label: adjective marker removed, underscores as spaces, lower case."""
    return _MARKER.sub("", word).replace("_", " ").lower()


def read_synsets(path: str | os.PathLike) -> Iterable[tuple[str, list[str]]]:
    """(lexicographer file name, lemmas) of each synset line of a WordNet `data.<pos>` file.

    Line layout (wndb(5WN)): offset, lex_filenum (2 decimal digits), ss_type, w_cnt (2 hex digits), then w_cnt pairs
    of (word, lex_id); the license header lines start with two spaces.
    """
    path = Path(path)
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("  ") or not line.strip():
                continue
            fields = line.split(" ")
            try:
                lexname = LEXNAMES[int(fields[1])]
                count = int(fields[3], 16)
                words = [fields[4 + 2 * i] for i in range(count)]
            except (IndexError, ValueError) as err:
                raise ValueError(f"{path}:{number}: not a WordNet data line ({err})") from None
            yield lexname, words


def read_wordnet(root: str | os.PathLike | None = None, pos: str = "noun",
                 exclude: Sequence[str] = NEGLABEL_EXCLUDED) -> dict[str, list[str]]:
    """First lemma of every synset of part of speech `pos` ("noun", "adj", "verb", "adv"), cleaned, per lexicographer
    file (in file order, duplicates within a file dropped), without the lexicographer files in `exclude`."""
    out: dict[str, dict[str, None]] = {}
    for lexname, words in read_synsets(wordnet_dir(root) / f"data.{pos}"):
        if lexname not in exclude:
            out.setdefault(lexname, {})[clean_lemma(words[0])] = None
    return {name: list(words) for name, words in out.items()}


def neglabel_corpus(root: str | os.PathLike | None = None,
                    exclude: Sequence[str] = NEGLABEL_EXCLUDED) -> tuple[list[str], list[str]]:
    """(nouns, adjectives) of NegLabel's corpus: every noun lexicographer file, then adj.all, adj.pert and adj.ppl,
    each word kept once (a word that is both a noun and an adjective stays a noun)."""
    seen: dict[str, None] = {}
    parts = []
    for pos in ("noun", "adj"):
        words = [w for group in read_wordnet(root, pos, exclude).values() for w in group if w not in seen]
        seen.update(dict.fromkeys(words))
        parts.append(list(dict.fromkeys(words)))
    return parts[0], parts[1]
