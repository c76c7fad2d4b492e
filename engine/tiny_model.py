"""Make a small random checkpoint folder (weights, config, tokenizer, generation config) for tests and demos.

Loadable offline by transformers and by our loader. Weights use a large init range so that logits are
spread out: greedy generation then varies from token to token and the top two logits are far apart, so
comparisons of greedy tokens with transformers are not decided by float noise. The special tokens' output
rows are zero, so a random model never picks them greedily (tests stop on eos with stop_token_ids instead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
WINDOW_ARCHS = ("mistral", "qwen2", "qwen3")  # transformers' LlamaForCausalLM has no sliding window
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}" + BOS + "{{ m['role'] }}\n{{ m['content'] }}" + EOS + "\n{% endfor %}"
    "{% if add_generation_prompt %}" + BOS + "assistant\n{% endif %}"
)

# Enough varied English that byte-level BPE finds a few thousand merges.
CORPUS = """\
The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun.
A journey of a thousand miles begins with a single step, and every step teaches something new.
Engines turn fuel into motion; inference engines turn prompts into tokens, one step at a time.
She sells sea shells by the sea shore, and the shells she sells are surely sea shells.
When the train left the station, the passengers opened their books and newspapers and began to read.
In the beginning there was only darkness, then light, then the long slow story of stars and planets.
Programmers write functions, test them, find bugs, fix them, and write more functions tomorrow.
The river flows past the old mill, through the village, under the stone bridge and into the valley.
Mathematics is the language of patterns: numbers, shapes, changes, and the relations between them.
Good morning! How are you today? I am fine, thank you. Would you like some tea or coffee?
Memory is organised in blocks of tokens, and each block can be shared between several sequences.
Scheduling decides which requests run next; batching lets many requests share one forward pass.
Winter brings snow and cold winds; summer brings long days, green fields and thunderstorms at night.
The library holds thousands of books about history, science, poetry, music, cooking and travel.
Children played football in the park until their parents called them home for dinner.
Every language model predicts the next token from the previous ones, over and over again.
Numbers like 1, 2, 3, 10, 42, 100 and 2024 appear in text just as often as words do.
Questions, answers, stories, letters, recipes, reports: writing comes in many different forms.
The committee discussed the proposal carefully, considered several alternatives, and voted.
Birds migrate south for the winter, following ancient routes across mountains, deserts and seas.
"""


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer)
    # A small corpus may run out of merges: top the vocab up with reserved tokens to the exact size.
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level BPE (needs >= 259)")
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE
    )


def _config(arch: str, sliding_window: int | None, max_window_layers: int, **kw: Any):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    classes = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
    if arch not in classes:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    if sliding_window is not None and (arch not in WINDOW_ARCHS or sliding_window < 1):
        raise ValueError(f"sliding_window must be >= 1 and needs arch in {', '.join(WINDOW_ARCHS)}")
    if arch == "mistral":
        kw["sliding_window"] = sliding_window  # None: full context (MistralConfig's default is 4096)
    if arch in ("qwen2", "qwen3"):
        kw["use_sliding_window"] = sliding_window is not None
        kw["sliding_window"] = sliding_window
        kw["max_window_layers"] = max_window_layers
    return classes[arch](**kw)


def make_tiny_model(
    out_dir: str | Path,
    arch: str = "llama",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 512,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    tie_word_embeddings: bool | None = None,
    torch_dtype: str = "float32",
    head_dim: int | None = None,
    rope_theta: float = 10000.0,
    rope_scaling: dict[str, Any] | None = None,
    initializer_range: float = 0.2,
    sliding_window: int | None = None,
    max_window_layers: int = 0,
) -> Path:
    """Write a random `arch` checkpoint to `out_dir` and return the folder.

    qwen3 gets head_dim 32 by default (q width != hidden size, as in real Qwen3). `rope_scaling`, e.g.
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64}, is stored the transformers-5 way, as `rope_parameters`.
    `sliding_window` N: mistral windows every layer; qwen2/qwen3 set `use_sliding_window` and window the
    layers from index `max_window_layers` on (0: all), as their transformers configs do.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(vocab_size)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD)}
    if head_dim is None:
        head_dim = 32 if arch == "qwen3" else hidden_size // num_heads
    config = _config(
        arch,
        sliding_window,
        max_window_layers,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        rms_norm_eps=1e-6,
        tie_word_embeddings=bool(tie_word_embeddings),
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta, **(rope_scaling or {})},
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
        dtype=torch_dtype,
    )
    config.architectures = [type(config).__name__.replace("Config", "ForCausalLM")]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, torch_dtype))
    with torch.no_grad():
        # Special tokens get logit 0, far below the argmax of the random rows: greedy output never hits
        # eos by chance, so references that suppress eos (min_new_tokens) and engines that ignore it agree.
        model.get_output_embeddings().weight[list(ids.values())] = 0.0
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig(bos_token_id=ids[BOS], eos_token_id=ids[EOS], pad_token_id=ids[PAD]).save_pretrained(out)
    return out
