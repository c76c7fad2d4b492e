"""Tokens per KV block: every size the engine takes, and the sizes the Triton kernels take.

The kernels' KV tiles are one cache block wide (BLOCK_N = block_size), and tl.dot needs every dimension
>= 16 on GPUs, so 8 runs on the torch backend only. The one source for EngineConfig, the launchers and
kernels/compile_check.py; imports nothing, so the config can use it without pulling in triton.
"""

BLOCK_SIZES = (8, 16, 32, 64, 128)
TRITON_BLOCK_SIZES = (16, 32, 64, 128)
