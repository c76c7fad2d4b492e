"""cuda:N becomes the current device of the thread that loads and steps the model (Triton launches on the
thread's current device). torch.cuda.set_device is a stand-in that records its calls and threads."""

from __future__ import annotations

import threading

import pytest
import torch

import engine.llm_engine as llm_engine
from engine.attention.torch_backend import TorchAttentionBackend
from engine.device import DeviceBinding

CUDA1 = torch.device("cuda", 1)


@pytest.fixture
def set_device_calls(monkeypatch) -> list[tuple[torch.device, int]]:
    calls: list[tuple[torch.device, int]] = []
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda d: calls.append((torch.device(d), threading.get_ident()))
    )
    return calls


def test_engine_sets_cuda_1_on_its_own_thread_before_loading(monkeypatch, set_device_calls, tiny_model):
    monkeypatch.setattr(llm_engine, "resolve_device", lambda name: CUDA1)
    monkeypatch.setattr(llm_engine, "get_attention_backend", lambda name, device: TorchAttentionBackend())
    calls_at_load: list[list[tuple[torch.device, int]]] = []

    class Stop(Exception):
        pass

    def load(*args, **kwargs):
        calls_at_load.append(list(set_device_calls))
        raise Stop

    monkeypatch.setattr(llm_engine, "build_rank_runner", load)
    with pytest.raises(Stop):
        llm_engine.LLMEngine(tiny_model, device="cuda:1", num_kv_blocks=16)
    assert calls_at_load == [[(CUDA1, threading.get_ident())]]


def test_binding_sets_the_device_once_per_stepping_thread(set_device_calls):
    binding = DeviceBinding(CUDA1)
    binding.bind()
    binding.bind()
    other = threading.Thread(target=binding.bind)
    other.start()
    other.join()
    assert [d for d, _ in set_device_calls] == [CUDA1, CUDA1]
    assert set_device_calls[0][1] == threading.get_ident()
    assert set_device_calls[1][1] == other.ident


def test_binding_is_a_no_op_on_the_cpu(set_device_calls):
    DeviceBinding(torch.device("cpu")).bind()
    assert set_device_calls == []
