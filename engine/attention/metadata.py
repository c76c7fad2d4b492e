"""Per-step tensors that tell an attention backend where every token's K/V lives.

A step's batch is ragged: sequence s contributes `q_len[s] = query_start_loc[s+1] - query_start_loc[s]`
new tokens (a prefill chunk, or 1 for a decode), which sit at absolute positions
`seq_lens[s] - q_len[s] ... seq_lens[s] - 1`. Query token i of sequence s attends causally to keys
0 .. seq_lens[s] - q_len[s] + i, all read from the paged cache after this step's K/V were written.

    block_tables[s] = [7, 2, 9]           block_size = 4
    logical position p  ->  slot = block_tables[s][p // 4] * 4 + p % 4
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    # [num_tokens] int64: flat slot of each new token in the pool; -1 marks a padding token (skipped).
    slot_mapping: torch.Tensor
    # [num_seqs + 1] int32: cumulative count of new tokens; query_start_loc[-1] == real token count.
    query_start_loc: torch.Tensor
    # [num_seqs] int32: context length of each sequence after this step (cached + new tokens).
    seq_lens: torch.Tensor
    # [num_seqs, max_blocks_per_seq] int32: physical block ids; entries past a sequence's last block are 0.
    block_tables: torch.Tensor
    # Host-side copies of the maxima, so backends never synchronise with the device to size a launch.
    max_query_len: int
    max_seq_len: int
    # True when every sequence has exactly one new token (pure decode step).
    is_decode_only: bool
    # Python lists mirroring the tensors above, for the CPU torch path (no device reads).
    query_lens_cpu: tuple[int, ...]
    seq_lens_cpu: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)
