"""Tiny random-weight stand-ins of the real models, saved with `save_pretrained` in the real folder layouts.

Tests, the demo and CPU benchmarks build these once, save them to a folder and load them back through the same
`from_pretrained` code paths users run with hub ids, so no weights are ever downloaded. Sizes follow diffusers' and
transformers' own test configurations (REFERENCE.md, "Tiny stand-ins").
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import torch

DEFAULT_VOCAB_WORDS = (
    "a", "photo", "of", "the", "best", "quality", "high", "monochrome", "lowres", "bad", "anatomy", "worst", "low",
    "bronze", "container", "vessel", "moth", "insect", "bird", "dog", "cat", "no", "not", "this", "is",
)
TOKENIZER_MAX_LENGTH = 77
BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"


def _byte_symbols() -> list[str]:
    """The 256 printable characters GPT-2/CLIP byte-level BPE uses for the bytes 0..255, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    by_byte = dict(zip(printable, codes))
    return [chr(by_byte[b]) for b in range(256)]


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


def tiny_tokenizer_vocab(vocab_words: Iterable[str] = DEFAULT_VOCAB_WORDS) -> tuple[dict[str, int], list[tuple[str, str]]]:
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


def save_tiny_tokenizer(folder: str | os.PathLike, vocab_words: Iterable[str] = DEFAULT_VOCAB_WORDS) -> Path:
    """Write a working byte-level CLIP BPE tokenizer to `folder` and return the folder.

    The folder holds `vocab.json`, `merges.txt`, `tokenizer.json` and `tokenizer_config.json` (model_max_length 77),
    loadable with `CLIPTokenizer`, `CLIPTokenizerFast` and `AutoTokenizer`. Its vocabulary size is
    `len(tokenizer)`; BOS and EOS are the last two ids (set a text config's `eos_token_id`/`pad_token_id` to match).
    """
    from transformers import CLIPTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = tiny_tokenizer_vocab(vocab_words)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=TOKENIZER_MAX_LENGTH)
    tokenizer.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_text = "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in merges)
    (folder / "merges.txt").write_text(merges_text, encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(model_max_length=TOKENIZER_MAX_LENGTH, tokenizer_class="CLIPTokenizer")
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return folder


# --- CLIP ---
def save_tiny_clip(folder: str | os.PathLike, seed: int = 0) -> Path:
    """A random-weight `CLIPModel` + `CLIPProcessor` folder (REFERENCE.md "CLIP" sizes) with the tiny BPE tokenizer.

    Vision: hidden 32, 2 layers, image 32, patch 8; text: hidden 32, 2 layers, 77 positions; projection 16. The text
    config's vocabulary size, BOS, EOS and pad ids match the tokenizer, so pooling at the end-of-text token works.
    Loads with `CLIPModel.from_pretrained(folder)` and `CLIPProcessor.from_pretrained(folder)`.
    """
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    import tempfile

    folder = Path(folder)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = CLIPTokenizer.from_pretrained(save_tiny_tokenizer(tmp))
    text_config = dict(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=TOKENIZER_MAX_LENGTH, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
    )
    vision_config = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text_config, vision_config=vision_config, projection_dim=16)).eval()
    model.save_pretrained(folder)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder
