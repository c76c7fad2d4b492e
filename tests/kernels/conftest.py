"""Kernel tests run on CUDA when present, else on the Triton CPU interpreter.

TRITON_INTERPRET must be set before any `kernels` module is imported: `triton.jit` reads it when
the kernel is decorated.
"""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
