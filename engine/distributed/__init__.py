"""Tensor parallelism: one model split across the processes of one machine (torch.distributed).

group.py      the rank's place in the group and the collectives the model calls (identity for one rank)
partition.py  which slice of each weight a rank holds: the one source of the sharding rules
"""
