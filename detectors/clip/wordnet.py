"""NegLabel's corpus from WordNet 3.0 (read by `pipelines.curation.wordnet`, the project's one WordNet reader).

The corpus is one word per synset: the synset's first lemma, lower-cased, underscores as spaces, adjective markers
such as "(a)" removed, grouped by lexicographer file (noun.artifact, adj.all, ...). That is what the official
`txtfiles/<lexname>.txt` lists hold (XueJiang16/NegLabel), which leave out noun.animal and noun.food.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from pipelines.curation.wordnet import read_wordnet

# the lexicographer files the official NegLabel corpus leaves out
NEGLABEL_EXCLUDED: tuple[str, ...] = ("noun.animal", "noun.food")


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
