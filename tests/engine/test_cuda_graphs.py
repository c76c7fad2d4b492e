"""Decode batches padded to buckets give the same tokens; the CUDA-graph path is driven with stand-ins.

No GPU here: `torch.cuda.CUDAGraph` and `torch.cuda.graph` are replaced by fakes, and a fake replay runs the
model eagerly on the persistent buffers (what a real replay does on the device), so what is tested is the
runner's side: capture per bucket into a shared pool, buffers frozen, decode-only steps routed to the graph
of their bucket, prefill steps run eagerly, the graph's output rows read back.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from engine.config import EngineConfig
from engine.core.request import Request
from engine.core.scheduler_output import NewRequest, ScheduledSequence, SchedulerOutput
from engine.llm_engine import LLMEngine
from engine.model_loader import load_model
from engine.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from tests.helpers.model_helpers import GreedySampler

BS = 4


def _steps(prompts: dict[str, list[int]], runners: list[ModelRunner], num_decodes: int) -> list[list[dict]]:
    """Prefill every prompt in one step, then decode; the same SchedulerOutputs go to every runner.
    Blocks start at 1 so block 0 (where padding rows point) stays unused. Returns per runner the
    sampled ids of each step."""
    reqs = {
        r: Request(r, p, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True), 0.0)
        for r, p in prompts.items()
    }
    tables = {r: [] for r in prompts}
    next_block = 1
    outs: list[list[dict]] = [[] for _ in runners]
    for step in range(num_decodes + 1):
        seqs = []
        for r, req in reqs.items():
            start, end = req.num_computed_tokens, req.num_tokens
            known = len(tables[r])
            while len(tables[r]) * BS < end:
                tables[r].append(next_block)
                next_block += 1
            seqs.append(ScheduledSequence(r, end - start, start, tuple(tables[r][known:]), True, known == 0))
        new = (
            [NewRequest(r, q.prompt_token_ids, q.params, 0, []) for r, q in reqs.items()] if step == 0 else []
        )
        sched = SchedulerOutput(seqs, sum(s.num_new_tokens for s in seqs), new_requests=new)
        results = [runner.execute(sched).sampled_token_ids for runner in runners]
        for i, res in enumerate(results):
            outs[i].append(res)
        for s in seqs:
            reqs[s.request_id].num_computed_tokens = s.context_len
            reqs[s.request_id].append_output_token(results[0][s.request_id])
    return outs


def _prompts(n: int, vocab: int) -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(n)
    return {
        f"r{i}": torch.randint(3, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        for i in range(n)
    }


@pytest.mark.parametrize("num_seqs", [3, 5])
def test_padded_decode_batches_give_the_same_tokens(tiny_model_dir, num_seqs):
    model, spec = load_model(tiny_model_dir("llama"))
    plain = ModelRunner(model, spec, 64, BS, "cpu", sampler=GreedySampler(), max_num_seqs=8)
    padded = ModelRunner(model, spec, 64, BS, "cpu", sampler=GreedySampler(), max_num_seqs=8)
    padded.pad_decode_batches = True
    seen_rows: list[int] = []
    prepare = padded.prepare

    def spy(*args):
        out = prepare(*args)
        seen_rows.append(out[0].shape[0])
        return out

    padded.prepare = spy
    a, b = _steps(_prompts(num_seqs, spec.vocab_size), [plain, padded], num_decodes=6)
    assert a == b
    bucket = 4 if num_seqs == 3 else 8
    assert seen_rows[1:] == [bucket] * 6  # every decode step ran padded
    # Padding rows (slot -1) wrote no K/V: block 0, the only block they point at, is untouched.
    assert not padded.kv_pool[:, :, 0].any()
    torch.testing.assert_close(padded.kv_pool, plain.kv_pool)


class _FakeGraph:
    def __init__(self) -> None:
        self.replays = 0
        self.run = None  # set by the test: what a real replay would compute

    def replay(self) -> None:
        self.replays += 1
        self.run()

    def pool(self) -> str:
        return f"pool-of-{id(self)}"


def test_cuda_graph_capture_and_replay_with_stand_ins(tiny_model_dir, monkeypatch):
    pools = []

    @contextmanager
    def fake_graph(graph, pool=None):
        pools.append(pool)
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    model, spec = load_model(tiny_model_dir("llama"))
    eager = ModelRunner(model, spec, 64, BS, "cpu", sampler=GreedySampler(), max_num_seqs=8)
    graphed = ModelRunner(
        model, spec, 64, BS, "cpu", sampler=GreedySampler(), max_num_seqs=8, max_model_len=128,
        enable_cuda_graphs=True,
    )  # fmt: skip
    graphs = graphed.graphs.graphs
    assert sorted(graphs) == [(1, ()), (2, ()), (4, ()), (8, ())]  # the torch backend never splits
    assert pools[0] is None and len(set(pools[1:])) == 1  # largest first; the others share its pool
    assert graphed.batch.buffers.frozen

    last = {}
    prepare = graphed.prepare

    def spy(*args):
        last["step"] = out = prepare(*args)
        return out

    graphed.prepare = spy
    buf = graphed.batch.buffers
    for (b, _), (graph, out) in graphs.items():

        def run(b=b, out=out):
            ids, pos, meta = last["step"][:3]
            assert ids.data_ptr() == buf.input_ids.data_ptr() and ids.shape[0] == b
            out.copy_(model(buf.input_ids[:b], buf.positions[:b], graphed.kv_caches, meta))

        graph.run = run
    a, b = _steps(_prompts(3, spec.vocab_size), [eager, graphed], num_decodes=5)
    assert a == b
    assert graphs[4, ()][0].replays == 5  # the 5 decode steps of 3 sequences; the prefill step ran eagerly
    assert sum(g.replays for g, _ in graphs.values()) == 5


def test_cuda_graphs_are_refused_off_cuda(tiny_model_dir):
    with pytest.raises(ValueError, match="CUDA device"):
        EngineConfig(model="m", device="cpu", enable_cuda_graphs=True)
    with pytest.raises(ValueError, match="triton"):
        EngineConfig(model="m", attention_backend="torch", enable_cuda_graphs=True)
    with pytest.raises(ValueError, match="true or false"):
        EngineConfig(model="m", enable_cuda_graphs="yes")  # type: ignore[arg-type]
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA device"):
            LLMEngine(str(tiny_model_dir("llama")), enable_cuda_graphs=True)


class _SplittingBackend:
    """The torch backend's attention with the Triton backend's split-KV choice (64 "SMs"), recording the
    split count each forward would use: a graph must split as an eager step of the same context does."""

    def __init__(self) -> None:
        from engine.attention.torch_backend import TorchAttentionBackend
        from engine.attention.triton_backend import TritonAttentionBackend

        self.torch, self.triton = TorchAttentionBackend(), TritonAttentionBackend(num_sms=64)
        self.name, self.seen = "torch", []

    def num_splits(self, *args, **kwargs) -> int:
        return self.triton.num_splits(*args, **kwargs)

    def write_kv(self, *args, **kwargs) -> None:
        self.torch.write_kv(*args, **kwargs)

    def forward(self, query, key, value, k_cache, v_cache, meta, scale, *, window=None, **kw):
        self.seen.append(self.num_splits(meta, k_cache.shape[2], query.device, window))
        return self.torch.forward(query, key, value, k_cache, v_cache, meta, scale, window=window, **kw)


def test_a_replayed_graph_splits_as_the_eager_step_would(tiny_model_dir, monkeypatch):
    """Short contexts split once eagerly; a graph captured for max_model_len would bake in 8 splits."""
    captured_splits: dict[int, int] = {}
    backend = _SplittingBackend()

    @contextmanager
    def fake_graph(graph, pool=None):
        backend.seen.clear()
        yield
        captured_splits[id(graph)] = backend.seen[0]

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    model, spec = load_model(tiny_model_dir("llama"))
    model.attn_backend = backend
    graphed = ModelRunner(
        model, spec, 256, BS, "cpu", sampler=GreedySampler(), max_num_seqs=8, max_model_len=4096,
        enable_cuda_graphs=True,
    )  # fmt: skip
    replayed: list[tuple[int, int]] = []
    prepare = graphed.prepare

    def spy(*args):
        step = prepare(*args)
        ids, _, meta = step[:3]
        eager = backend.num_splits(meta, graphed.kv_caches[0][0].shape[2], ids.device, None)
        for graph, out in graphed.graphs.graphs.values():
            graph.run = lambda graph=graph, out=out, eager=eager: replayed.append(
                (captured_splits[id(graph)], eager)
            )
        return step

    graphed.prepare = spy
    _steps(_prompts(3, spec.vocab_size), [graphed], num_decodes=3)
    assert len(replayed) == 3  # every decode step replayed a graph
    assert all(graph == eager for graph, eager in replayed), replayed
