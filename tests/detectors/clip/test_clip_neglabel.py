"""NegLabel: the WordNet reader on the real database files, OpenAI's real BPE vocabulary, negative selection and
grouping against independent computations of the official code's behaviour, and the small-corpus warning."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.images import CLASSES, colour_images
from scipy.special import softmax

import detectors
from detectors.base import ImageSet
from detectors.clip.neglabel import ADJ_TEMPLATE, NOUN_TEMPLATE, PAPER_NEGATIVES, mine_negatives
from detectors.clip.scores import neglabel
from detectors.clip.wordnet import NEGLABEL_EXCLUDED, neglabel_corpus
from pipelines.curation.wordnet import LEXNAMES, read_wordnet

WORDNET = Path("/usr/share/wordnet")
needs_wordnet = pytest.mark.skipif(not (WORDNET / "data.noun").is_file(),
                                   reason="WordNet 3.0 is not installed (apt-get install wordnet-base)")


def unit64(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def hf_text(backbone, texts) -> np.ndarray:
    tok = backbone.processor.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return unit64(backbone.model.get_text_features(**tok).pooler_output.numpy())


def regex_first_lemmas(path: Path) -> dict[str, list[str]]:
    """Independent parse: first word of each synset line (regex on the wndb layout) per lexicographer file."""
    out: dict[str, dict[str, None]] = {}
    pattern = re.compile(r"^\d{8} (\d\d) [nasrv] [0-9a-f]{2} (\S+) ", re.M)
    for lex, word in pattern.findall(path.read_text(encoding="utf-8", errors="replace")):
        word = re.sub(r"\((a|p|ip)\)$", "", word).replace("_", " ").lower()
        out.setdefault(LEXNAMES[int(lex)], {})[word] = None
    return {name: list(words) for name, words in out.items()}


@needs_wordnet
@pytest.mark.slow
def test_wordnet_reader_on_the_real_database():
    nouns = read_wordnet(WORDNET, "noun", exclude=())
    adjs = read_wordnet(WORDNET, "adj", exclude=())
    # WordNet 3.0 statistics (wnstats(7WN)): 82,115 noun synsets, 18,156 adjective synsets
    synset_lines = lambda pos: sum(1 for line in open(WORDNET / f"data.{pos}", errors="replace") if line[:1].isdigit())  # noqa: E731
    assert synset_lines("noun") == 82115 and synset_lines("adj") == 18156
    assert nouns == regex_first_lemmas(WORDNET / "data.noun")
    assert adjs == regex_first_lemmas(WORDNET / "data.adj")
    assert nouns["noun.Tops"][:3] == ["entity", "physical entity", "abstraction"]
    assert set(adjs) == {"adj.all", "adj.pert", "adj.ppl"} and not any("(" in w or "_" in w for g in adjs.values()
                                                                       for w in g)
    # NegLabel's corpus: nouns minus noun.animal / noun.food (as the official word lists), then new adjectives
    corpus_nouns, corpus_adjs = neglabel_corpus(WORDNET)
    kept = [w for name, group in nouns.items() if name not in NEGLABEL_EXCLUDED for w in group]
    assert corpus_nouns == list(dict.fromkeys(kept))
    kept_set = set(kept)
    assert corpus_adjs == [w for w in dict.fromkeys(w for g in adjs.values() for w in g) if w not in kept_set]
    assert "hydraulic pump" in corpus_nouns and "lovesick" in corpus_adjs
    # 15% of each part gives about the paper's 10,000 negatives (the official lists give 10,499)
    assert 0.95 * PAPER_NEGATIVES < int(0.15 * len(corpus_nouns)) + int(0.15 * len(corpus_adjs)) < 1.1 * PAPER_NEGATIVES


def test_wordnet_reader_names_a_bad_line(tmp_path):
    (tmp_path / "data.noun").write_text("  1 license header\n00001740 xx n 01 entity 0 000 | gloss\n")
    with pytest.raises(ValueError, match=r"data.noun:2"):
        read_wordnet(tmp_path, "noun")
    with pytest.raises(FileNotFoundError, match="wordnet-base"):
        read_wordnet(tmp_path / "missing", "noun")


@needs_wordnet
@pytest.mark.slow
def test_real_clip_vocabulary_tokenizes_every_wordnet_prompt_within_the_context():
    pytest.importorskip("transformers")
    from detectors.clip.vocab import openai_bpe_path, openai_clip_tokenizer

    try:
        openai_bpe_path()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    tok = openai_clip_tokenizer()
    assert len(tok) == 49408 and tok.eos_token_id == 49407
    assert tok(["a photo of a dog"])["input_ids"][0] == [49406, 320, 1125, 539, 320, 1929, 49407]  # OpenAI's ids
    nouns, adjs = neglabel_corpus(WORDNET)
    texts = [NOUN_TEMPLATE.format(w) for w in nouns] + [ADJ_TEMPLATE.format(w) for w in adjs]
    lengths = [len(ids) for ids in tok(texts)["input_ids"]]
    assert max(lengths) <= 77  # as the official clip.tokenize requires: no candidate is truncated


def test_selection_matches_an_independent_quantile_ranking():
    gen = torch.Generator().manual_seed(0)
    cand, classes = torch.randn(23, 6, generator=gen), torch.randn(4, 6, generator=gen)
    got = mine_negatives(cand, classes, fraction=0.3, percentile=0.95, chunk=5)  # chunk boundaries inside
    quant = np.quantile(unit64(cand) @ unit64(classes).T, 0.95, axis=1)
    np.testing.assert_array_equal(got.numpy(), np.argsort(quant, kind="stable")[: int(23 * 0.3)])


def test_neglabel_mines_nouns_and_adjectives_separately_with_the_official_prompts(backbone):
    nouns = ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat", "ice", "jar", "red"]
    adjs = ["shiny", "wooden", "tiny", "ancient", "blue", "soft", "loud"]
    with pytest.warns(UserWarning, match="only 5 negative labels"):
        det = detectors.build("neglabel", model=backbone, class_names=CLASSES, words=nouns, adjectives=adjs,
                              neg_fraction=0.3, percentile=0.9, ngroup=1, temperature=0.05)
        words = det.negative_words
    pos = hf_text(backbone, [f"the nice {c}" for c in CLASSES])
    noun_t = hf_text(backbone, [f"the nice {w}" for w in nouns])
    adj_t = hf_text(backbone, [f"This is a {w} photo" for w in adjs])
    keep_n = np.argsort(np.quantile(noun_t @ pos.T, 0.9, axis=1), kind="stable")[: int(len(nouns) * 0.3)]
    keep_a = np.argsort(np.quantile(adj_t @ pos.T, 0.9, axis=1), kind="stable")[: int(len(adjs) * 0.3)]
    assert words == [nouns[i] for i in keep_n] + [adjs[i] for i in keep_a]
    images = colour_images([0], 3, 7)
    pixels = backbone.processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        img = unit64(backbone.model.get_image_features(pixel_values=pixels).pooler_output.numpy())
    neg = np.concatenate([noun_t[keep_n], adj_t[keep_a]])
    full = softmax(np.concatenate([img @ pos.T, img @ neg.T], axis=1) / 0.05, axis=1)
    np.testing.assert_allclose(det.score(ImageSet(images=images)), full[:, :2].sum(1), rtol=1e-5)


def test_grouping_drops_the_remainder_then_permutes_as_the_official_code():
    gen = torch.Generator().manual_seed(2)
    g, pos, neg = torch.randn(4, 8, generator=gen), torch.randn(3, 8, generator=gen), torch.randn(11, 8, generator=gen)
    got = neglabel(g, pos, neg, temperature=0.1, ngroup=3, seed=5, batch_size=3)
    gs, ps, ns = unit64(g), unit64(pos), unit64(neg)
    kept = ns[:9]  # the last 11 % 3 = 2 negatives are dropped before permuting
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(5)).numpy()
    groups = kept[perm].reshape(3, 3, -1)
    expected = np.mean([softmax(np.concatenate([gs @ ps.T, gs @ grp.T], 1) / 0.1, axis=1)[:, :3].sum(1)
                        for grp in groups], axis=0)
    np.testing.assert_allclose(got, expected, rtol=1e-6)  # cosines in float32


@needs_wordnet
@pytest.mark.slow
def test_neglabel_defaults_read_wordnet_and_cap_groups(backbone):
    small = [n for n in LEXNAMES if n not in ("noun.Tops", "noun.motive", "adj.ppl")]  # keep three small files
    det = detectors.build("neglabel", model=backbone, class_names=CLASSES, wordnet_exclude=small)
    assert (det.params["templates"] == ["the nice {}"] and det.params["ngroup"] == 100
            and det.params["neg_fraction"] == 0.15)
    with pytest.warns(UserWarning, match="M = 10,000"):
        words = det.negative_words
    nouns, adjs = neglabel_corpus(WORDNET, small)
    assert len(words) == int(0.15 * len(nouns)) + int(0.15 * len(adjs)) and det.groups() == len(words)
    assert set(words[: int(0.15 * len(nouns))]) <= set(nouns) and set(words[int(0.15 * len(nouns)):]) <= set(adjs)
    m = detectors.build("neglabel", model=backbone, class_names=CLASSES, wordnet_exclude=small, n_negatives=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert abs(len(m.negative_words) - 20) <= 2  # M / candidates of each part
