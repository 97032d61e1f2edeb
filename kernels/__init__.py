"""Triton kernels for the packed KV cache (write path `quant`, read path `decode`) and their torch references."""
from kernels.dispatch import interpreter_forced

if interpreter_forced():                  # TRITON_INTERPRET=1: the CPU interpreter, without its repeated patching
    from kernels.interpreter import skip_nested_lang_patches
    skip_nested_lang_patches()
