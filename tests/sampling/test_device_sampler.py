"""The sampler's device path, run on CPU tensors under a mode that counts host reads: every preset makes
exactly one per step (the sampled ids, with the logprobs when asked), and seeded rows draw the tokens the
CPU path draws (same hash, same candidates)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from engine.sampling.device_sampler import DeviceSampler
from engine.sampling.host_sampler import Sampler
from engine.sampling.make_sampler import make_sampler
from tests.sampling.conftest import make_request

V = 320
EOS = 3
# Reading a tensor's values on the host: on CUDA each one waits for the device.
HOST_READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero"}
HOST_READS |= {"masked_select", "unique", "repeat_interleave"}


class HostReads(TorchFunctionMode):
    """Counts host reads of tensors; a second one in a step fails at once (where it happens)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        bool_index = name in ("__getitem__", "__setitem__") and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in _flat(args[1:2])
        )
        if name in HOST_READS or bool_index:
            self.reads.append(name)
            if len(self.reads) > 1:
                raise AssertionError(f"a second host read in one step: {self.reads}")
        return func(*args, **(kwargs or {}))


def _flat(xs):
    for x in xs:
        if isinstance(x, tuple | list):
            yield from _flat(x)
        else:
            yield x


PRESETS = {
    "greedy": dict(temperature=0.0),
    "greedy_logprobs": dict(temperature=0.0, logprobs=3),
    "temperature": dict(temperature=0.8, seed=11),
    "top_p": dict(temperature=1.0, top_p=0.7, seed=12),
    "top_k": dict(temperature=0.9, top_k=20, seed=13),
    "min_p": dict(temperature=1.1, min_p=0.2, seed=14),
    "top_k_top_p_min_p": dict(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=15),
    "repetition_top_k": dict(temperature=0.8, top_k=10, repetition_penalty=1.3, seed=16),
    "repetition_greedy": dict(temperature=0.0, repetition_penalty=1.5),
    "repetition_top_p": dict(temperature=1.0, top_p=0.8, repetition_penalty=0.8, seed=17),
    "presence_frequency": dict(temperature=0.9, presence_penalty=0.7, frequency_penalty=0.4, seed=18),
    "min_tokens": dict(temperature=1.0, min_tokens=9, stop_token_ids=[5, 7], seed=19),
    "logprobs": dict(temperature=0.9, top_k=30, logprobs=5, seed=20),
    "logprobs_zero": dict(temperature=0.9, logprobs=0, seed=21),
    "unseeded": dict(temperature=0.9, top_k=1),
}


def _requests(names: list[str]) -> list:
    g = np.random.default_rng(0)
    return [
        make_request(
            prompt=g.integers(0, V, 12).tolist(),
            output=g.integers(0, V, 5).tolist(),
            sample_index=i % 2,
            **PRESETS[n],
        )
        for i, n in enumerate(names)
    ]


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, V + 4, generator=g) * 3  # padded vocabulary: 4 columns past V
    x[:, EOS] = 8.0  # EOS and the stop ids likely, so that min_tokens bans matter
    x[:, 5] = 7.0
    return x


def _device_step(sampler: DeviceSampler, logits: torch.Tensor, requests: list):
    with HostReads() as mode:
        result = sampler(logits, requests)
    assert len(mode.reads) == 1, mode.reads
    return result


CASES = [[n] * 3 for n in PRESETS] + [list(PRESETS), list(reversed(PRESETS))]


@pytest.mark.parametrize(
    "names", CASES, ids=["+".join(sorted(set(c))) if len(set(c)) == 1 else "mixed" for c in CASES]
)
def test_one_host_read_per_step_and_the_cpu_paths_tokens(names):
    requests = _requests(names)
    device = DeviceSampler(V, frozenset({EOS}))
    host = Sampler(V, frozenset({EOS}))
    for step in range(3):
        logits = _logits(len(requests), step)
        got = _device_step(device, logits, requests)
        want = host(logits.clone(), requests)
        for r, a, b, la, lb in zip(
            requests, got.token_ids, want.token_ids, got.logprobs, want.logprobs, strict=True
        ):
            if r.params.seed is not None or r.params.temperature == 0 or r.params.top_k == 1:
                assert a == b, (r.params, step)
            assert 0 <= a < V
            if r.params.min_tokens > len(r.output_token_ids):
                assert a not in (EOS, 5, 7)
            assert (la is None) == (lb is None)
            if la is not None and lb is not None and a == b:
                assert [t for t, _ in la] == [t for t, _ in lb]
                assert np.allclose([v for _, v in la], [v for _, v in lb], atol=1e-5)
        for r, t in zip(requests, got.token_ids, strict=True):
            r.output_token_ids.append(t)


def test_seeded_draws_do_not_depend_on_the_batch():
    requests = _requests(["top_k", "temperature", "top_p", "min_p", "repetition_top_k"])
    x = _logits(1, 5)[:, :V]
    alone = [_device_step(DeviceSampler(V, frozenset()), x, [r]).token_ids[0] for r in requests]
    rows = x.expand(len(requests), V).contiguous()
    together = _device_step(DeviceSampler(V, frozenset()), rows, requests).token_ids
    assert together == alone
    backwards = _device_step(DeviceSampler(V, frozenset()), rows, requests[::-1]).token_ids
    assert backwards == alone[::-1]


def test_the_path_is_chosen_from_the_device_at_build():
    assert type(make_sampler(V, frozenset(), torch.device("cpu"))) is Sampler
    assert type(make_sampler(V, frozenset(), torch.device("cuda", 0))) is DeviceSampler


def test_the_counter_catches_a_second_read():
    with pytest.raises(AssertionError, match="second host read"), HostReads():
        x = torch.ones(3)
        x.tolist()
        bool(x.any())
