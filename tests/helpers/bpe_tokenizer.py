"""A small byte-level BPE tokenizer trained in memory (no hub) on text with multibyte characters: accents,
CJK, emoji with modifiers and flags, Greek and Cyrillic, so tokens split characters between them."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from engine.tiny_model import train_byte_level_bpe

_TEXT = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "Café crème brûlée, déjà vu, naïve résumé, élève.",
    "中文分词测试，你好世界。我们喜欢中文和日本語のテキスト。",
    "Emoji time 😀🎉🚀👍🏽 and flags 🇫🇷 with text 🙂.",
    "Mixed: naïve 中文 😀 tokens; stop STOP stop### end.",
    "Ελληνικά και русский текст тоже есть.",
]


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = train_byte_level_bpe(600, ["<eos>", "<pad>"], texts=_TEXT * 20)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", clean_up_tokenization_spaces=False
    )
