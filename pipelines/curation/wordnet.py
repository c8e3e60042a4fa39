"""A reader of the Princeton WordNet 3.0 database files (`data.<pos>`, `index.<pos>`; Debian package `wordnet-base`
installs them under /usr/share/wordnet), parsed directly: no nltk, nothing downloaded.

Two users: NegLabel's corpus (`detectors.clip.wordnet`: first lemmas per lexicographer file) and the ImageNet-21K
container curation (`pipelines.curation.containers`: noun hyponymy). ImageNet's category ids are noun synsets,
`n` + the 8-digit offset of the synset's line in `data.noun` (`wnid`).
"""
from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

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
DEFAULT_ROOTS: tuple[str, ...] = ("/usr/share/wordnet", "/usr/local/WordNet-3.0/dict", "/usr/share/wordnet/dict")
HYPONYM_POINTERS = ("~", "~i")  # hyponym, instance hyponym (wninput(5WN))
_MARKER = re.compile(r"\((?:a|p|ip)\)$")
_WNID = re.compile(r"n\d{8}")
_SENSE = re.compile(r"(.+)\.n\.(\d+)")
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


@dataclass(frozen=True)
class Synset:
    """One line of a `data.<pos>` file: its offset, lexicographer file, lemmas and pointers (symbol, offset, pos)."""

    offset: int
    lexname: str
    words: tuple[str, ...]
    pointers: tuple[tuple[str, int, str], ...] = ()

    @property
    def wnid(self) -> str:
        """ImageNet's id of a noun synset: `n` + the 8-digit offset."""
        return f"n{self.offset:08d}"


def _lines(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, space-separated fields) of every database line (the license header lines start with spaces)."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("  ") or not line.strip():
                continue
            yield number, line.split()


def read_synsets(path: str | os.PathLike) -> Iterable[Synset]:
    """Every synset line of a WordNet `data.<pos>` file.

    Line layout (wndb(5WN)): offset, lex_filenum (2 decimal digits), ss_type, w_cnt (2 hex digits), then w_cnt pairs
    of (word, lex_id), p_cnt (3 decimal digits), then p_cnt pointers of (symbol, offset, pos, source/target).
    """
    path = Path(path)
    for number, fields in _lines(path):
        try:
            count = int(fields[3], 16)
            words = tuple(fields[4 + 2 * i] for i in range(count))
            at = 4 + 2 * count
            pointers = tuple((fields[at + 1 + 4 * i], int(fields[at + 2 + 4 * i]), fields[at + 3 + 4 * i])
                             for i in range(int(fields[at])))
            yield Synset(int(fields[0]), LEXNAMES[int(fields[1])], words, pointers)
        except (IndexError, ValueError) as err:
            raise ValueError(f"{path}:{number}: not a WordNet data line ({err})") from None


def read_wordnet(root: str | os.PathLike | None = None, pos: str = "noun",
                 exclude: Sequence[str] = ()) -> dict[str, list[str]]:
    """First lemma of every synset of part of speech `pos` ("noun", "adj", "verb", "adv"), cleaned, per lexicographer
    file (in file order, duplicates within a file dropped), without the lexicographer files in `exclude`."""
    out: dict[str, dict[str, None]] = {}
    for synset in read_synsets(wordnet_dir(root) / f"data.{pos}"):
        if synset.lexname not in exclude:
            out.setdefault(synset.lexname, {})[clean_lemma(synset.words[0])] = None
    return {name: list(words) for name, words in out.items()}


class Nouns:
    """The noun synsets of WordNet 3.0 by offset, the sense index (`index.noun`: lemma -> offsets in sense order)
    and hyponymy. Names: a wnid (`n03147509`), a sense (`cup.n.01`, nltk's spelling: the synset holding the lemma's
    first sense) or a bare lemma (`wine glass`, every noun sense of it)."""

    def __init__(self, synsets: dict[int, Synset], senses: dict[str, list[int]]):
        self.synsets, self.senses = synsets, senses

    @classmethod
    def load(cls, root: str | os.PathLike | None = None) -> Nouns:
        """The nouns of the database at `wordnet_dir(root)`, parsed once per process while its files are unchanged."""
        folder = wordnet_dir(root)
        stamps = tuple((folder / name).stat().st_mtime_ns if (folder / name).is_file() else None
                       for name in ("data.noun", "index.noun"))
        return cls._parse(folder.resolve(), stamps)

    @classmethod
    @functools.lru_cache(maxsize=2)
    def _parse(cls, folder: Path, stamps: tuple[int | None, ...]) -> Nouns:
        synsets = {s.offset: s for s in read_synsets(folder / "data.noun")}
        senses: dict[str, list[int]] = {}
        index = folder / "index.noun"
        if not index.is_file():
            raise FileNotFoundError(f"no WordNet sense index {index}: {INSTALL_HINT}")
        for number, fields in _lines(index):
            try:  # lemma pos synset_cnt p_cnt [ptr_symbol...] sense_cnt tagsense_cnt synset_offset...
                count = int(fields[2])
                senses[fields[0]] = [int(f) for f in fields[len(fields) - count:]]
            except (IndexError, ValueError) as err:
                raise ValueError(f"{index}:{number}: not a WordNet index line ({err})") from None
        return cls(synsets, senses)

    def synset(self, wnid: str) -> Synset | None:
        return self.synsets.get(int(wnid[1:])) if _WNID.fullmatch(wnid) else None

    def resolve(self, name: str) -> list[str]:
        """The wnids a name stands for (class docstring); an unknown name raises ValueError naming it."""
        text = name.strip()
        if _WNID.fullmatch(text):
            if self.synset(text) is None:
                raise ValueError(f"{text!r} is not a WordNet 3.0 noun synset id")
            return [text]
        sense = _SENSE.fullmatch(text.lower())
        lemma = (sense[1] if sense else text.lower()).replace(" ", "_")
        offsets = self.senses.get(lemma)
        if not offsets:
            raise ValueError(f"{name!r} is not a WordNet 3.0 noun (give a wnid such as n03147509, a sense such as "
                             "cup.n.01 or a noun)")
        if sense:
            number = int(sense[2])
            if not 1 <= number <= len(offsets):
                raise ValueError(f"{name!r}: the noun {lemma!r} has {len(offsets)} sense(s)")
            offsets = [offsets[number - 1]]
        return [f"n{o:08d}" for o in offsets]

    def name(self, wnid: str) -> str:
        """nltk's name of a synset: its first lemma, `.n.`, the lemma's sense number of this synset."""
        synset = self.synsets[int(wnid[1:])]
        lemma = synset.words[0].lower()
        return f"{lemma}.n.{self.senses[lemma].index(synset.offset) + 1:02d}"

    def label(self, wnid: str) -> str:
        """The synset's first lemma as a category label ("wine glass")."""
        return clean_lemma(self.synsets[int(wnid[1:])].words[0])

    def hyponyms(self, wnids: Iterable[str]) -> set[str]:
        """`wnids` and every synset below them (hyponyms and instance hyponyms, transitively)."""
        seen: set[int] = set()
        todo = [int(w[1:]) for w in wnids]
        while todo:
            offset = todo.pop()
            if offset in seen:
                continue
            seen.add(offset)
            todo += [o for symbol, o, pos in self.synsets[offset].pointers if symbol in HYPONYM_POINTERS and pos == "n"]
        return {f"n{o:08d}" for o in seen}
