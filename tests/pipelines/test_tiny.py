"""The tiny stand-ins load back through the real `from_pretrained` code paths and behave like their real
counterparts."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer, CLIPTokenizer, CLIPTokenizerFast

from pipelines.tiny import BOS_TOKEN, EOS_TOKEN, save_tiny_tokenizer, tiny_tokenizer_vocab


@pytest.mark.parametrize("loader", [CLIPTokenizer, CLIPTokenizerFast, AutoTokenizer])
def test_tiny_tokenizer_round_trips_through_every_loader(tmp_path, loader):
    folder = save_tiny_tokenizer(tmp_path / "tok", vocab_words=["bronze", "vessel"])
    tokenizer = loader.from_pretrained(folder)
    vocab, _ = tiny_tokenizer_vocab(["bronze", "vessel"])
    assert tokenizer.model_max_length == 77
    assert len(tokenizer) == len(vocab)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (len(vocab) - 2, len(vocab) - 1)
    ids = tokenizer("Bronze vessel xq").input_ids
    # known answer: BOS, one merged token per vocabulary word, unknown words fall back to byte symbols, EOS
    expected = [vocab[BOS_TOKEN], vocab["bronze</w>"], vocab["vessel</w>"], vocab["x"], vocab["q</w>"],
                vocab[EOS_TOKEN]]
    assert ids == expected
    assert tokenizer.decode(ids, skip_special_tokens=True) == "bronze vessel xq"


def test_tiny_tokenizer_files_follow_the_clip_layout(tmp_path):
    folder = save_tiny_tokenizer(tmp_path / "tok")
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) >= 512 + 2 and list(vocab)[-2:] == [BOS_TOKEN, EOS_TOKEN]
    assert (folder / "merges.txt").read_text(encoding="utf-8").startswith("#version:")
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == 77
