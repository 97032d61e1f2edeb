"""Shared test setup: offline, CPU, deterministic; Triton kernels under the interpreter."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture
def tiny():
    """Factory: a fresh tiny random (model, tokenizer) of one architecture, left padding."""
    from harness.models import build_tiny

    def make(arch: str, seed: int = 0):
        model, tok = build_tiny(arch, seed=seed)
        tok.padding_side = "left"
        return model, tok
    return make
