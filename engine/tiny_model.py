"""Make a small random checkpoint folder (weights, config, tokenizer, generation config) for tests and demos.

Loadable offline by transformers and by our loader. Weights use a large init range so that logits are
spread out: greedy generation then varies from token to token and the top two logits are far apart, so
comparisons of greedy tokens with transformers are not decided by float noise. The special tokens' output
rows are zero, so a random model never picks them greedily (tests stop on eos with stop_token_ids instead).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.models.registry import TINY_ARCHS

if TYPE_CHECKING:
    from tokenizers import Tokenizer

ARCHS = TINY_ARCHS  # every architecture the engine runs has a tiny model
# Families whose transformers config has a sliding window (transformers' LlamaForCausalLM has none).
WINDOW_ARCHS = ("mistral", "qwen2", "qwen3", "gemma2", "gemma3", "mixtral", "phi3")
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


def train_byte_level_bpe(
    vocab_size: int,
    special_tokens: list[str],
    texts: Iterable[str] = (),
    files: Sequence[str] = (),
) -> Tokenizer:
    """A byte-level BPE (GPT-2 style: every byte representable, no unknown token) trained in memory on
    `texts` or on the text `files`. The one trainer behind the tiny models, tests and benchmarks."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if files:
        tok.train(list(files), trainer)
    else:
        tok.train_from_iterator(texts, trainer)
    return tok


def _train_tokenizer(vocab_size: int, family: str = "byte_level"):
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    if family == "sentencepiece":  # Llama 2's layout (engine/tiny_sentencepiece.py), our special tokens
        from engine.tiny_sentencepiece import train_sentencepiece_bpe

        tok = train_sentencepiece_bpe()
        tok.add_special_tokens([BOS, EOS, PAD])
    elif family == "byte_level":
        tok = train_byte_level_bpe(vocab_size, [BOS, EOS, PAD], texts=CORPUS.splitlines() * 4)
    else:
        raise ValueError(f"tokenizer must be 'byte_level' or 'sentencepiece', got {family!r}")
    # A small corpus may run out of merges: top the vocab up with reserved tokens to the exact size.
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is too small for this tokenizer")
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE
    )


# arch -> (transformers config class, architecture, fixed settings). The first four run on our native code;
# the rest on the generic path (their own transformers modules), each showing one feature of its family.
CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),  # full context
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": False}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    # Soft-capped attention and logits, alternating sliding/full layers, scaled embeddings, sandwich norms.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {}),
    # Five sliding layers to one full one, per-layer-type rotary bases, q/k norms.
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {}),
    # Fused qkv and gate/up projections; partial rotary (half of each head).
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"partial_rotary_factor": 0.5}),
    # Norms after attention and MLP, q/k norms over all heads.
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "norm_topk_prob": True},
    ),
    # Parallel residual, LayerNorm with bias, partial rotary (a quarter of each head), multi-head KV.
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"partial_rotary_factor": 0.25}),
}
# Rotary settings that transformers 5 keeps inside rope_parameters.
_ROPE_KEYS = ("partial_rotary_factor",)


def _config(arch: str, rope: dict[str, Any], windows: dict[str, Any], overrides: dict[str, Any], **kw: Any):
    import transformers

    # A family in the registry but missing here fails loudly.
    if arch not in ARCHS or arch not in CONFIGS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    class_name, architecture, fixed = CONFIGS[arch]
    settings = {**fixed, **windows, **overrides}
    rope = {**rope, **{k: settings.pop(k) for k in _ROPE_KEYS if k in settings}}
    if arch == "gpt_neox":  # multi-head KV, its head size from hidden / heads, LayerNorm
        for key in ("num_key_value_heads", "head_dim", "rms_norm_eps"):
            kw.pop(key)
    if arch != "gemma3" or rope.get("rope_type", "default") != "default":
        kw["rope_parameters"] = rope  # gemma3 keeps its own per-layer-type bases unless scaling is asked for
    config = getattr(transformers, class_name)(**kw, **settings)
    config.architectures = [architecture]
    return config


def _windows(arch: str, sliding_window: int | None, max_window_layers: int) -> dict[str, Any]:
    """Config fields for a window of `sliding_window` tokens (None: the family's default)."""
    if sliding_window is None:
        return {}
    if arch not in WINDOW_ARCHS or sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 and needs arch in {', '.join(WINDOW_ARCHS)}")
    if arch in ("qwen2", "qwen3"):
        return {
            "use_sliding_window": True,
            "sliding_window": sliding_window,
            "max_window_layers": max_window_layers,
        }
    return {"sliding_window": sliding_window}  # the layers it applies to: the family's layer_types


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
    config_overrides: dict[str, Any] | None = None,
    tokenizer: str = "byte_level",
) -> Path:
    """Write a random `arch` checkpoint to `out_dir` and return the folder.

    qwen3 gets head_dim 32 by default (q width != hidden size, as in real Qwen3). `rope_scaling`, e.g.
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64}, is stored the transformers-5 way, as `rope_parameters`.
    `sliding_window` N: mistral windows every layer; qwen2/qwen3 set `use_sliding_window` and window the
    layers from index `max_window_layers` on (0: all), as their transformers configs do; the other families
    window the layers their `layer_types` mark sliding. `config_overrides` sets any other config field (e.g.
    {"layer_types": [...], "partial_rotary_factor": 0.5}). `tokenizer`: "byte_level" (GPT-2 style) or
    "sentencepiece" (Llama 2 style, with byte fallback; trained on Korean and English).
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trained = _train_tokenizer(vocab_size, tokenizer)
    ids = {t: trained.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD)}
    if head_dim is None:
        head_dim = 32 if arch == "qwen3" else hidden_size // num_heads
    config = _config(
        arch,
        {"rope_type": "default", "rope_theta": rope_theta, **(rope_scaling or {})},
        _windows(arch, sliding_window, max_window_layers),
        dict(config_overrides or {}),
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
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
        dtype=torch_dtype,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, torch_dtype))
    with torch.no_grad():
        # Special tokens get logit 0, far below the argmax of the random rows: greedy output never hits
        # eos by chance, so references that suppress eos (min_new_tokens) and engines that ignore it agree.
        model.get_output_embeddings().weight[list(ids.values())] = 0.0
    model.save_pretrained(out)
    trained.save_pretrained(out)
    GenerationConfig(bos_token_id=ids[BOS], eos_token_id=ids[EOS], pad_token_id=ids[PAD]).save_pretrained(out)
    return out
