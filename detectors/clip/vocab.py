"""OpenAI CLIP's real BPE vocabulary (49,408 tokens) as a transformers `CLIPTokenizer`, built offline from the
`bpe_simple_vocab_16e6.txt.gz` that ships inside the `open_clip_torch` wheel (`pip install --no-deps
open_clip_torch`; the package is located, not imported, so torchvision is not needed)."""
from __future__ import annotations

import functools
import gzip
import importlib.util
from pathlib import Path
from typing import Any

BPE_FILE = "bpe_simple_vocab_16e6.txt.gz"
N_MERGES = 49152 - 256 - 2  # CLIP keeps the first 48,894 merges: 512 byte tokens + merges + 2 specials = 49,408
CONTEXT_LENGTH = 77


def openai_bpe_path() -> Path:
    """Path of OpenAI's BPE merges file inside the installed open_clip package."""
    spec = importlib.util.find_spec("open_clip")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / BPE_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{BPE_FILE} not found: pip install --no-deps open_clip_torch (it ships OpenAI's CLIP "
                            "vocabulary)")


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins of the bytes 0..255 used by byte-level BPE (GPT-2 / CLIP), in CLIP's order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return [chr(c) for c in codes]


@functools.lru_cache(maxsize=1)
def openai_vocab() -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    """(token -> id, merges) of OpenAI CLIP: bytes, bytes + `</w>`, one token per merge, then BOS and EOS."""
    lines = gzip.open(openai_bpe_path(), "rt", encoding="utf-8").read().split("\n")[1:N_MERGES + 1]
    merges = tuple(tuple(line.split()) for line in lines)
    symbols = byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges] + ["<|startoftext|>",
                                                                                       "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}, merges


def openai_clip_tokenizer() -> Any:
    """A `CLIPTokenizer` with OpenAI's vocabulary (BOS 49406, EOS = pad = 49407, context length 77)."""
    from transformers import CLIPTokenizer

    vocab, merges = openai_vocab()
    return CLIPTokenizer(vocab=dict(vocab), merges=list(merges), model_max_length=CONTEXT_LENGTH)
