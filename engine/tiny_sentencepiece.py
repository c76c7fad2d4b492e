"""SentencePiece-style tokenizers trained in memory (no hub), for tests and tiny models.

`train_sentencepiece_bpe` lays a BPE out the way Llama 2's tokenizer.json does: `<unk>`, `<s>`, `</s>` at
ids 0-2, the byte-fallback tokens `<0x00>`..`<0xFF>` at ids 3..258, then the merges; normalizer
Prepend("▁") + Replace(" ", "▁"); decoder Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0).
Characters the training text lacks (emoji, rare syllables) are encoded as byte tokens.

`train_unigram_metaspace` is a Unigram model with a Metaspace pre-tokenizer and decoder (T5, ALBERT,
XLNet-style).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL = ["<unk>", "<s>", "</s>"]
FIRST_BYTE_ID = len(SPECIAL)  # <0x00> is id 3, <0xFF> id 258, as in Llama 2

# Korean and English, so that merges cover common syllables and words; emoji are left to byte fallback.
CORPUS = [
    "김치는 맛있습니다",
    "한국어 문장을 토큰으로 나눕니다",
    "오늘 날씨가 정말 좋네요",
    "저는 학생입니다 그리고 공부를 합니다",
    "서울은 한국의 수도입니다",
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "The weather is nice today and kimchi is tasty.",
    "Tokens, words and sentences: a small corpus for a small tokenizer.",
]


def train_sentencepiece_bpe(vocab_size: int = 600, texts: Iterable[str] = ()) -> Tokenizer:
    """A Llama 2-style BPE with byte fallback (see the module docstring); `vocab_size` includes the 259
    special and byte tokens."""
    corpus = list(texts) or CORPUS * 10
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Training splits at word starts ("▁"), as SentencePiece does, so no merge spans two words.
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    merges_wanted = max(vocab_size - FIRST_BYTE_ID - 256, 1)
    trainer = trainers.BpeTrainer(
        vocab_size=merges_wanted + len(SPECIAL), special_tokens=SPECIAL, show_progress=False
    )
    trainer_tok.train_from_iterator(corpus, trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {token: i for i, token in enumerate(SPECIAL)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    pairs = [m.split(" ") if isinstance(m, str) else m for m in trained["merges"]]
    merges = [(a, b) for a, b in pairs]
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(SPECIAL)
    return tok


def train_unigram_metaspace(vocab_size: int = 300, texts: Iterable[str] = ()) -> Tokenizer:
    """A Unigram model with Metaspace pre-tokenizer and decoder; unknown characters become `<unk>`."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(list(texts) or CORPUS * 10, trainer)
    return tok
