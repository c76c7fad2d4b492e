"""cuda:N becomes the current device of the thread that loads and steps the model (Triton launches on the
thread's current device). torch.cuda.set_device is a stand-in that records its calls and threads, after
checking its argument exactly as the real one does first (torch.cuda._utils._get_device_index, in torch's
Python layer, before any CUDA call): an unindexed torch.device("cuda") fails here as it would on a GPU."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.cuda._utils import _get_device_index

import engine.llm_engine as llm_engine
from engine.attention.torch_backend import TorchAttentionBackend
from engine.device import DeviceBinding, resolve_device

CUDA1 = torch.device("cuda", 1)


@pytest.fixture
def set_device_calls(monkeypatch) -> list[tuple[torch.device, int]]:
    calls: list[tuple[torch.device, int]] = []

    def set_device(d: torch.device) -> None:
        index = _get_device_index(d)  # what torch.cuda.set_device runs before _cuda_setDevice(index)
        calls.append((torch.device("cuda", index), threading.get_ident()))

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    return calls


@pytest.fixture
def one_gpu(monkeypatch) -> None:
    """CUDA is available, and the thread's current device is cuda:2 (as after torch.cuda.set_device(2))."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)


@pytest.mark.parametrize("name", ["cuda", "auto", torch.device("cuda")])
def test_cuda_and_auto_resolve_to_the_current_indexed_device(one_gpu, name):
    device = resolve_device(name)
    assert device == torch.device("cuda", 2)
    assert _get_device_index(device) == 2  # accepted by torch.cuda.set_device


def test_an_explicit_index_is_kept(one_gpu):
    assert resolve_device("cuda:1") == CUDA1


def test_auto_is_the_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")


@pytest.mark.parametrize("name", ["cuda", "auto"])
def test_binding_a_resolved_cuda_device_passes_set_devices_check(one_gpu, set_device_calls, name):
    DeviceBinding(resolve_device(name)).bind()
    assert [d for d, _ in set_device_calls] == [torch.device("cuda", 2)]


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
