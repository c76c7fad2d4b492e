"""CUDA graphs for decode steps: one captured model forward per batch-size bucket, replayed in place.

A decode step of B sequences is padded to the smallest bucket b >= B (padding sequences have slot -1, so
they write no K/V; their rows are ignored), its inputs are copied into the `InputBatch` device buffers
(the addresses a graph was captured with), and the graph of bucket b is replayed: one launch instead of
hundreds of kernel launches from Python. The LM head and sampling run eagerly on the rows that are sampled.

    buckets (max_num_seqs = 64):  1 2 4 8 16 24 32 40 48 56 64

What a graph bakes in, and why it is safe: tensor addresses (the persistent buffers; `DeviceBuffers.frozen`
makes a step that would need bigger ones fail loudly), shapes (b rows; block tables at full width) and the
host ints of the metadata at capture: is_decode_only, and max_seq_len, from which the attention backend
picks its split-KV count. A graph must split as an eager step of the same context would (else the rounding
differs from eager), so each bucket is captured once per split choice (`split_key`: the backend's count for
each sliding window the model has) over a ladder of contexts (1, 256, 512, ... max_model_len), and a step
replays only the graph of its own bucket and split choice; a step whose choice was not captured (a context
between two rungs with a count the ladder does not reach, e.g. 3 splits) runs eagerly. Each graph is
captured at the longest context of its rung with that choice. Only decode-only steps replay; prefill and
mixed steps run eagerly.

Off by default (`enable_cuda_graphs`): it has not yet run on a GPU (see README); the bucket/padding logic is
tested on the CPU through the torch attention path, and the capture/replay calls with stand-ins for
`torch.cuda.CUDAGraph` / `torch.cuda.graph`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from engine.attention.metadata import AttentionMetadata
from engine.input_batch import DeviceBuffers, InputBatch


def batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every multiple of 8, up to and including max_num_seqs."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 8))
    return (*sizes, max_num_seqs)


def bucket_for(num_seqs: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding num_seqs sequences; None if none does."""
    for b in buckets:
        if b >= num_seqs:
            return b
    return None


# Contexts each bucket is captured at (capped at max_model_len): the split heuristic's count grows with the
# context in steps of MIN_TOKENS_PER_SPLIT (kernels/paged_decode_split.py) up to its cap of 64.
LADDER = (1, *(256 * 2**k for k in range(8)))


def context_ladder(max_model_len: int) -> list[int]:
    """The contexts to capture at, longest first (a split choice keeps the longest context that gives it)."""
    return sorted({min(n, max_model_len) for n in LADDER} | {max_model_len}, reverse=True)


class CudaGraphs:
    def __init__(
        self,
        model: Any,
        kv_caches: list,
        batch: InputBatch,
        buckets: tuple[int, ...],
        max_model_len: int,
    ) -> None:
        self.model, self.kv_caches, self.batch = model, kv_caches, batch
        self.buckets = buckets
        self.max_model_len = max_model_len
        # (bucket, split_key) -> (graph, its output: [b, hidden] written by every replay)
        self.graphs: dict[tuple[int, tuple[int, ...]], tuple[Any, torch.Tensor]] = {}
        # The windows the backend is asked about: every layer's (None: full attention).
        windows = (
            {getattr(m, "window", None) for m in model.modules()} if hasattr(model, "modules") else set()
        )
        self.windows = sorted(windows | {None}, key=lambda w: -1 if w is None else w)

    def split_key(self, meta: AttentionMetadata) -> tuple[int, ...]:
        """The backend's split-KV count for this step, per window; () for a backend that never splits."""
        backend = getattr(self.model, "attn_backend", None)
        num_splits = getattr(backend, "num_splits", None)
        if num_splits is None or not self.kv_caches:
            return ()
        k_cache = self.kv_caches[0][0]  # [num_blocks, block_size, Hkv, D]
        return tuple(num_splits(meta, k_cache.shape[2], k_cache.device, w) for w in self.windows)

    def capture_meta(self, b: int, max_seq_len: int | None = None) -> AttentionMetadata:
        """Metadata of b padding sequences in the buffers: the views every real step of bucket b also uses."""
        buf = self.batch.buffers
        put = DeviceBuffers.put
        return AttentionMetadata(
            slot_mapping=put(buf.slot_mapping, np.full(b, -1, dtype=np.int64)),
            query_start_loc=put(buf.query_start_loc, np.arange(b + 1, dtype=np.int32)),
            seq_lens=put(buf.seq_lens, np.ones(b, dtype=np.int32)),
            block_tables=put(buf.block_tables, np.zeros((b, buf.max_blocks), dtype=np.int32)),
            max_query_len=1,
            max_seq_len=self.max_model_len if max_seq_len is None else max_seq_len,
            is_decode_only=True,
            query_lens_cpu=(1,) * b,
            seq_lens_cpu=(1,) * b,
        )

    def capture(self) -> None:
        buf = self.batch.buffers
        buf.fit(self.buckets[-1], self.buckets[-1], -(-self.max_model_len // self.batch.block_size))
        buf.frozen = True
        pool = None
        with torch.inference_mode():
            for b in reversed(self.buckets):  # largest first: the smaller graphs reuse its memory pool
                for context in context_ladder(self.max_model_len):
                    meta = self.capture_meta(b, context)
                    key = (b, self.split_key(meta))
                    if key in self.graphs:
                        continue
                    ids = DeviceBuffers.put(buf.input_ids, np.zeros(b, dtype=np.int64))
                    pos = DeviceBuffers.put(buf.positions, np.zeros(b, dtype=np.int64))
                    self.model(ids, pos, self.kv_caches, meta)  # warm-up: Triton compiles outside the capture
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        out = self.model(ids, pos, self.kv_caches, meta)  # [b, hidden]
                    pool = graph.pool() if pool is None else pool
                    self.graphs[key] = (graph, out)

    def find(self, meta: AttentionMetadata, input_ids: torch.Tensor) -> tuple[int, tuple[int, ...]] | None:
        """The graph for this step: a decode-only step laid out at a captured bucket, in the captured
        buffers, splitting as the graph does. None: run it eagerly."""
        if not (
            meta.is_decode_only
            and input_ids.data_ptr() == self.batch.buffers.input_ids.data_ptr()
            and meta.block_tables.shape[1] == self.batch.buffers.max_blocks
        ):
            return None
        key = (input_ids.shape[0], self.split_key(meta))
        return key if key in self.graphs else None

    def replay(self, key: tuple[int, tuple[int, ...]]) -> torch.Tensor:
        graph, out = self.graphs[key]
        graph.replay()
        return out
