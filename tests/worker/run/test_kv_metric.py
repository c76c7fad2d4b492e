"""The KV cache's unwritten share (engine.kv_waste) reaches Prometheus as conveyor_kv_unwritten_ratio."""

from __future__ import annotations

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from worker.run.metrics import Metrics
from worker.run.observer import Observer


def test_the_unwritten_share_of_held_kv_slots_is_exported(tiny_model_dir):
    engine = LLMEngine(str(tiny_model_dir("llama")), num_kv_blocks=32, block_size=16, device="cpu")
    engine.add_request("a", list(range(1, 21)), SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()  # the 20-token prompt computed: 2 blocks held, 32 slots, 12 of them unwritten
    assert engine.kv_waste() == (12, 32)
    metrics = Metrics({"consumer": "w"})
    observer = Observer(metrics)
    observer._last_rate -= 2  # a second has passed: the metrics are refreshed
    observer.stepped(1, engine)
    assert metrics.registry.get_sample_value("conveyor_kv_unwritten_ratio", {"consumer": "w"}) == 12 / 32
