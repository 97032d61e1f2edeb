"""The Python API for notebooks: a model with a KV quantizer installed, and one cell from overrides.

    import notebook
    session = notebook.load(model="gemma3_270m", quantizer="oscar")      # calibrates OSCAR if needed
    text = session.generate("The capital of France is", max_new_tokens=8)
    logits = session.forward("The capital of France is").logits        # the prompt through the quantized cache
    rows = notebook.run_cell("quantizer=oscar", "task=ruler_niah", "ctx=4k", "task.samples=2")
    session.close()                                                     # restores the model's weights

`load` and `run_cell` take the same names and overrides as `python run.py` (configs/); `run_cell` writes
and returns the cell's rows exactly as the CLI does (same store, same skip of finished cells).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from harness.pipeline import load_prepared, resolve_device, run_cell as pipeline_run_cell, validate
from harness.seam import Seam
from run import results_store

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def config(*overrides: str) -> DictConfig:
    """The resolved run configuration of `python run.py <overrides>` (without Hydra's run directory)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


@dataclass
class Session:
    """A loaded model with a quantizer installed: generate and forward go through its three-region cache."""

    model: torch.nn.Module
    tokenizer: object
    seam: Seam

    def new_cache(self):
        """A fresh quantized cache (pass as past_key_values to model.generate / model(...))."""
        return self.seam.new_cache()

    def _encode(self, prompts: str | list[str]) -> dict:
        enc = self.tokenizer(prompts if isinstance(prompts, list) else [prompts], return_tensors="pt", padding=True)
        return {k: v.to(self.model.device) for k, v in enc.items()}

    def generate(self, prompts: str | list[str], **generate_kwargs) -> str | list[str]:
        """model.generate through a fresh quantized cache (greedy unless asked); the new text of each prompt."""
        enc = self._encode(prompts)
        generate_kwargs.setdefault("do_sample", False)
        generate_kwargs.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        with torch.inference_mode():
            out = self.model.generate(**enc, past_key_values=self.new_cache(), **generate_kwargs)
        texts = self.tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return texts if isinstance(prompts, list) else texts[0]

    def forward(self, prompts: str | list[str], cache=None):
        """One forward pass of the prompts through `cache` (a fresh quantized one by default)."""
        with torch.inference_mode():
            return self.model(**self._encode(prompts), past_key_values=cache or self.new_cache(), use_cache=True)

    def close(self) -> None:
        """Uninstall the quantizer: the model's weights and attention implementation are restored."""
        self.seam.remove()


def load(model: str = "gemma3_270m", quantizer: str = "bf16", *overrides: str, kernels: str = "auto") -> Session:
    """Load `model` and install `quantizer` (calibrated / loaded as a run would), checked before the weights load."""
    cfg = config(f"model={model}", f"quantizer={quantizer}", *overrides)
    plan = validate(cfg)
    loaded = load_prepared(plan, resolve_device(cfg.device))
    return Session(loaded.model, loaded.tokenizer, Seam(loaded.model, plan.quantizer, kernels).apply())


def run_cell(*overrides: str) -> list[dict]:
    """Run (or skip, when its rows exist) the cell that `python run.py <overrides>` would; returns its rows."""
    cfg = config(*overrides)
    return pipeline_run_cell(cfg, results_store(cfg.results_dir))
