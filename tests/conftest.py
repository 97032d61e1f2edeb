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


@pytest.fixture
def full_attention_qwen3():
    """Factory: a tiny random Qwen3 (fp32, seed 0) of `layers` full-attention layers and its character tokenizer
    (left padding)."""
    def make(layers: int):
        from transformers import AutoModelForCausalLM
        from harness.models import char_tokenizer, tiny_config
        tok = char_tokenizer()
        tok.padding_side = "left"
        config = tiny_config("qwen3", len(tok))
        config.num_hidden_layers, config.layer_types = layers, ["full_attention"] * layers
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval(), tok
    return make


THINKING_TEMPLATE = (     # a Qwen3-like chat template with the enable_thinking switch, for the reasoning tasks
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


@pytest.fixture
def tok():
    """The character tokenizer with THINKING_TEMPLATE (tests of the paper's reasoning tasks)."""
    from harness.models import char_tokenizer
    tokenizer = char_tokenizer()
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer
