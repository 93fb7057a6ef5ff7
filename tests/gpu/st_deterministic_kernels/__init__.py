"""A --user-dir that registers nothing: it makes every process of a GPU run use deterministic kernels.

Attention's backward on a GPU adds with atomics in a varying order, so two runs from the same state
differ in the last bits whatever a checkpoint holds; an exact resume test needs them alike
(tests/helpers/rng_mains.py does the same in-process). The runs also need
CUBLAS_WORKSPACE_CONFIG=:4096:8 in their environment (read when cuBLAS starts).
"""
import torch

torch.use_deterministic_algorithms(True, warn_only=True)
