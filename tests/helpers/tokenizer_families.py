"""One in-memory tokenizer per fast-tokenizer family (no hub), wrapped as transformers does, and the text
rule the detokenizer must follow for each: the continuation `decode(prompt + output) - decode(prompt)`."""

from __future__ import annotations

from functools import cache

from transformers import PreTrainedTokenizerFast

from engine.decoder_profile import REPLACEMENT, decoder_profile
from engine.tiny_model import CORPUS as ENGLISH
from engine.tiny_model import train_byte_level_bpe
from engine.tiny_sentencepiece import CORPUS as KOREAN_AND_ENGLISH
from engine.tiny_sentencepiece import train_sentencepiece_bpe, train_unigram_metaspace

FAMILIES = ("byte_level", "sentencepiece_bpe", "unigram")
TEXTS = [*KOREAN_AND_ENGLISH, "김치는 맛있습니다 🍜", "Emoji 😀🎉 and café 中文", *ENGLISH.splitlines()[:4]]


@cache
def family_tokenizer(family: str) -> PreTrainedTokenizerFast:
    if family == "byte_level":
        tok = train_byte_level_bpe(500, ["<eos>"], texts=(KOREAN_AND_ENGLISH + ENGLISH.splitlines()) * 5)
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, eos_token="<eos>", clean_up_tokenization_spaces=False
        )
    tok = train_sentencepiece_bpe() if family == "sentencepiece_bpe" else train_unigram_metaspace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


@cache
def family_profile(family: str):
    return decoder_profile(family_tokenizer(family))


def decode(family: str, ids: list[int]) -> str:
    return family_tokenizer(family).backend_tokenizer.decode(ids, skip_special_tokens=True)


def continuation(family: str, prompt: list[int], output: list[int]) -> str | None:
    """decode(prompt + output) - decode(prompt), or None where that is no difference of texts: the prompt
    ends mid-character, or output bytes merge with a byte run the prompt ends in and change its text."""
    head, full = decode(family, prompt), decode(family, prompt + output)
    if head.endswith(REPLACEMENT) or not full.startswith(head):
        return None
    return full[len(head) :]


def separated(family: str, output: list[int]) -> str:
    """The output's text where `continuation` is None: as if the prompt had ended on a character
    boundary (after a plain token, so a SentencePiece decoder strips no space of the output's)."""
    if family == "byte_level":
        return decode(family, output)
    sep = family_profile(family).separator
    return decode(family, [sep] + output)[len(decode(family, [sep])) :]
