"""Tensor parallelism: one model split across the processes of one machine (torch.distributed).

group.py            the rank's place in the group and the collectives the model calls (identity for one rank)
partition.py        which slice of each weight a rank holds: the one source of the sharding rules
parallel_linear.py  column- and row-parallel linear layers (both model paths)
vocab_parallel.py   vocabulary-parallel embedding and LM head (sliced matmul on the CPU)
weight_loader.py    each parameter's weight loader, and the one checkpoint -> parameters loop
rank_runner.py      what every rank builds before stepping: build_rank_runner
executor.py         rank 0: sends each step to the other ranks, then runs it
step_message.py     the step on the wire: one int64 header, one broadcast
rank_processes.py   rank 0's side: spawn, watch and stop ranks 1..N-1; rank_process.py: their main loop
"""
