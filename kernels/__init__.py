"""Triton kernels for Conveyor: each file holds one kernel family, its launcher and a pure-torch `*_ref`."""
