"""The tiny byte-level CLIP BPE tokenizer of the stand-ins: CLIP's byte symbols, whole-word merges for a few words,
BOS and EOS last (as in CLIP's real vocabulary), and the special tokens of the real model's tokenizer config."""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from pipelines.hub import effective_config, real_config
from pipelines.hub_ids import CLIP_ID

DEFAULT_VOCAB_WORDS = (
    "a", "photo", "of", "the", "best", "quality", "high", "monochrome", "lowres", "bad", "anatomy", "worst", "low",
    "bronze", "container", "vessel", "moth", "insect", "bird", "dog", "cat", "no", "not", "this", "is",
)
TOKENIZER_MAX_LENGTH = 77
BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"


def _byte_symbols() -> list[str]:
    """The 256 printable characters GPT-2/CLIP byte-level BPE uses for the bytes 0..255, in CLIP's vocabulary order:
    the printable bytes first ('!' = id 0, '"' = 1, '#' = 2, ...), then the remapped ones (chr(256), chr(257), ...)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    remapped = [256 + n for n in range(256 - len(printable))]
    return [chr(c) for c in printable + remapped]


def _word_merges(words: Iterable[str]) -> list[tuple[str, str]]:
    """Left-to-right merges that assemble each (lower-case ASCII) word into one `word</w>` token."""
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for word in words:
        word = word.lower()
        if not word.isascii() or not word.isalpha() or len(word) < 2:
            continue
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        merged = pieces[0]
        for piece in pieces[1:]:
            pair = (merged, piece)
            if pair not in seen:
                seen.add(pair)
                merges.append(pair)
            merged += piece
    return merges


def tiny_tokenizer_vocab(vocab_words: Iterable[str] = DEFAULT_VOCAB_WORDS
                         ) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges of a byte-level CLIP BPE: bytes, bytes + `</w>`, merged words, then BOS and EOS last."""
    symbols = _byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols]
    merges = _word_merges(vocab_words)
    for left, right in merges:
        token = left + right
        if token not in tokens:
            tokens.append(token)
    tokens += [BOS_TOKEN, EOS_TOKEN]
    return {token: i for i, token in enumerate(tokens)}, merges


def save_tiny_tokenizer(folder: str | os.PathLike, vocab_words: Iterable[str] = DEFAULT_VOCAB_WORDS,
                        model_id: str = CLIP_ID, subfolder: str = "") -> Path:
    """Write a working byte-level CLIP BPE tokenizer to `folder` and return the folder.

    The folder holds `vocab.json`, `merges.txt`, `tokenizer.json` and `tokenizer_config.json` (model_max_length 77),
    loadable with `CLIPTokenizer`, `CLIPTokenizerFast` and `AutoTokenizer`. Its vocabulary size is `len(tokenizer)`;
    BOS and EOS are the last two ids, as in CLIP's real vocabulary (49406, 49407). The special tokens (bos, eos, pad,
    unk) are those of `model_id`'s real tokenizer config in `subfolder` (SDXL's `tokenizer_2` pads with "!").
    """
    from transformers import CLIPTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = tiny_tokenizer_vocab(vocab_words)
    special = _tokenizer_special_tokens(model_id, subfolder)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=TOKENIZER_MAX_LENGTH, **special)
    tokenizer.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_text = "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in merges)
    (folder / "merges.txt").write_text(merges_text, encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(model_max_length=TOKENIZER_MAX_LENGTH, tokenizer_class="CLIPTokenizer")
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return folder


def _tokenizer_special_tokens(model_id: str, subfolder: str) -> dict[str, str]:
    prefix = f"{subfolder}/" if subfolder else ""
    special = real_config(model_id, f"{prefix}special_tokens_map.json")
    eff = effective_config("tokenizer", real_config(model_id, f"{prefix}tokenizer_config.json"), special)
    return {k: eff[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")}


def load_tiny_tokenizer(model_id: str = CLIP_ID, subfolder: str = "", vocab_words: Iterable[str] = DEFAULT_VOCAB_WORDS):
    """The tiny BPE as a `CLIPTokenizer` with the special tokens (bos/eos/pad/unk) of `model_id`'s real tokenizer."""
    with tempfile.TemporaryDirectory() as scratch:
        from transformers import CLIPTokenizer

        return CLIPTokenizer.from_pretrained(save_tiny_tokenizer(scratch, vocab_words, model_id, subfolder))



TINY_VOCAB_SIZE = len(tiny_tokenizer_vocab()[0])  # the tiny BPE's size with the default words; BOS, EOS last
