"""Triton kernels for the packed KV cache (write path `quant`, read path `decode`) and their torch references."""
