"""What the generic path refuses at load, each refusal with the architecture and the reason in its message.

Config-level refusals need only a config.json (no weights); the probe-level ones load a tiny model whose
transformers code is patched to misbehave the way a refused model would.
"""

from __future__ import annotations

import pytest
import transformers

from engine.model_loader import load_model
from engine.models.config import UnsupportedModelError
from engine.models.generic.attention import ProbeCall
from engine.models.generic.checks import refuse_probe

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "vocab_size": 320}
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 320}


def _config_dir(tmp_path, class_name: str, architecture: str, **kw):
    config = getattr(transformers, class_name)(**kw)
    config.architectures = [architecture]
    config.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("class_name", "architecture", "kw", "message"),
    [
        ("BartConfig", "BartForConditionalGeneration", {}, "encoder-decoder models are not supported"),
        ("Gemma3Config", "Gemma3ForConditionalGeneration", {}, "takes vision or audio inputs"),
        ("LlavaConfig", "LlavaForConditionalGeneration", {}, "takes vision or audio inputs"),
        ("MambaConfig", "MambaForCausalLM", {}, "state-space or hybrid layers"),
        ("JambaConfig", "JambaForCausalLM", {}, "state-space or hybrid layers"),
        ("FalconH1Config", "FalconH1ForCausalLM", {}, "state-space or hybrid layers"),
        (
            "Llama4TextConfig",
            "Llama4ForCausalLM",
            {},
            r"layer types \['chunked_attention'\] are not supported",
        ),
        ("BloomConfig", "BloomForCausalLM", {}, "bypassing transformers' attention interface"),
        (
            "Gemma3TextConfig",
            "Gemma3ForCausalLM",
            {"use_bidirectional_attention": True},
            "not supported; only causal",
        ),
        (
            "GPTNeoXConfig",
            "GPTNeoXForCausalLM",
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
            "rope type 'dynamic' is not supported",
        ),
        (
            "Phi3Config",
            "Phi3ForCausalLM",
            {
                **SMALL,
                "original_max_position_embeddings": 64,
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": [1.0] * 4,
                    "long_factor": [2.0] * 4,
                },
            },
            "rope type 'longrope' is not supported",
        ),
    ],
)
def test_config_refusals(tmp_path, class_name, architecture, kw, message):
    folder = _config_dir(tmp_path, class_name, architecture, **kw)
    with pytest.raises(UnsupportedModelError, match=message) as info:
        load_model(folder)
    assert str(info.value).startswith(architecture + ":")


def test_native_refuses_what_it_does_not_implement(tiny_model_dir):
    with pytest.raises(UnsupportedModelError, match="unsupported model"):
        load_model(tiny_model_dir("olmo2", **TINY), model_impl="native")


def test_unknown_model_impl():
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match="model_impl must be one of auto, native, transformers"):
        EngineConfig(model="x", model_impl="vllm")  # type: ignore[arg-type]


def test_probe_refuses_a_layer_that_bypasses_the_interface(tiny_model_dir, monkeypatch):
    from transformers.models.olmo2 import modeling_olmo2

    original = modeling_olmo2.Olmo2Attention.forward

    def eager_in_layer_1(self, *args, **kwargs):
        # As a model with its own attention code would: layer 1 never reaches the attention interface.
        if self.layer_idx != 1:
            return original(self, *args, **kwargs)
        saved, self.config._attn_implementation = self.config._attn_implementation, "sdpa"
        try:
            return original(self, *args, **kwargs)
        finally:
            self.config._attn_implementation = saved

    monkeypatch.setattr(modeling_olmo2.Olmo2Attention, "forward", eager_in_layer_1)
    with pytest.raises(UnsupportedModelError, match=r"Olmo2ForCausalLM: its attention bypasses .*\[0\]"):
        load_model(tiny_model_dir("olmo2", **TINY))


def test_probe_refuses_a_head_it_does_not_repeat(tiny_model_dir, monkeypatch):
    from transformers.models.olmo2 import modeling_olmo2

    original = modeling_olmo2.Olmo2ForCausalLM.forward

    def doubled_logits(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        out.logits = out.logits * 2  # a multiplier the generic head does not know
        return out

    monkeypatch.setattr(modeling_olmo2.Olmo2ForCausalLM, "forward", doubled_logits)
    with pytest.raises(UnsupportedModelError, match="forward does more after the base model"):
        load_model(tiny_model_dir("olmo2", **TINY))


def _call(layer: int, **changes) -> ProbeCall:
    fields = {"layer_idx": layer, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "value_head_dim": 8}
    fields["mask_is_none"] = True
    fields |= {"is_causal": True, "kwargs": {}, **changes}
    return ProbeCall(**fields)


class _Config:
    architectures = ["SomeForCausalLM"]


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ([_call(0)], "bypasses transformers' attention interface"),  # one call for two layers
        ([_call(0), _call(0)], "bypasses transformers' attention interface"),  # layer 0 twice
        ([_call(0), _call(1, is_causal=False)], "layer 1 attention is not causal"),
        ([_call(0), _call(1, mask_is_none=False)], "layer 1 builds its own attention mask"),
        ([_call(0, kwargs={"s_aux": object()}), _call(1)], "layer 0 uses attention sinks"),
        ([_call(0), _call(1, head_dim=16, value_head_dim=16)], "layers differ in attention shape"),
        ([_call(0, value_head_dim=16), _call(1)], "layer 0: key and value head sizes differ"),
    ],
)
def test_probe_call_refusals(calls, message):
    with pytest.raises(UnsupportedModelError, match=message) as info:
        refuse_probe(_Config(), calls, num_layers=2)
    assert str(info.value).startswith("SomeForCausalLM:")
