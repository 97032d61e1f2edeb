"""The configured models (configs/model/*.yaml), read without loading any: what a too-long context can run on.

    print(context_refusal(cfg))   # the one sentence for `ctx` beyond the model, with a runnable suggestion
"""
from __future__ import annotations

from pathlib import Path

import yaml

MODEL_CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "model"
DRY_RUN_MODEL = "qwen3_8b"         # the paper's main long-context model: its shapes for a random-weight dry run


def configured_models() -> dict[str, dict]:
    """{name: config} of every real model configured whose architecture the seam runs (tiny test models left out)."""
    from harness.seam import SUPPORTED_MODEL_TYPES
    models = {}
    for path in sorted(MODEL_CONFIGS.glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text()) or {}
        if cfg.get("source") != "tiny" and cfg.get("model_type", "qwen3") in SUPPORTED_MODEL_TYPES:
            models[path.stem] = cfg
    return models


def context_refusal(model_name: str, ctx_name: str, tokens: int, max_positions: int, overrides: str) -> str:
    """One sentence: the context is beyond the model, which configured models reach it, and a dry-run command.

    `overrides` are the cell's other command-line settings (e.g. "quantizer=oscar task=ruler_niah").
    """
    reach = [f"{name} ({cfg['path']})" if cfg.get("source") == "hub" else name
             for name, cfg in configured_models().items() if int(cfg.get("max_positions") or 0) >= tokens]
    where = (f"models configured for it: {', '.join(reach)} (from the hub, or model.source=local model.path=DIR)"
             if reach else "no configured model reaches it")
    dry = (f"python run.py model={DRY_RUN_MODEL} model.source=random {overrides} ctx={ctx_name}").replace("  ", " ")
    return (f"ctx={ctx_name} ({tokens} tokens) exceeds model '{model_name}''s {max_positions} positions; {where}; "
            f"for a speed-and-memory dry run on random weights with {DRY_RUN_MODEL}'s shapes (no download): {dry}")
