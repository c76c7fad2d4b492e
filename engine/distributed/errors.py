"""The error every tensor-parallel failure on rank 0 turns into (torch-free: the worker CLI catches it)."""


class TensorParallelError(RuntimeError):
    """A rank died, hung, or a step failed part-way: the group is out of step and this engine is unusable."""
