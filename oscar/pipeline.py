"""One cell of the grid: validate -> skip if done -> load -> quantizer -> seam -> task -> rows.

run.py is a thin Hydra wrapper around `run_cell(cfg)`; everything that can be checked without
weights is checked first, so bad input fails in seconds with one sentence.
"""
from __future__ import annotations

import importlib
import random
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from oscar.quantizer import build_quantizer
from oscar.results import CellRecorder, cell_is_done, read_jsonl, rows_path

REPO_ROOT = Path(__file__).resolve().parent.parent


class CellError(ValueError):
    """Bad input detected before any weights are loaded; the message is one sentence for the user."""


@dataclass
class CellPlan:
    cfg: DictConfig
    quantizer: object
    task_module: object
    recorder: CellRecorder
    results_dir: Path


def cell_definition(cfg: DictConfig) -> tuple[dict, dict]:
    """(row key, full cell config) — the key names the cell in tables, the config hash identifies it."""
    key = {"model": cfg.model.name, "quantizer": cfg.quantizer.name, "task": cfg.task.name,
           "ctx": cfg.ctx.name, "seed": int(cfg.seed)}
    full = {name: OmegaConf.to_container(cfg[name], resolve=True) for name in ("model", "quantizer", "task", "ctx")}
    full["seed"] = int(cfg.seed)
    return key, full


def import_task(cfg: DictConfig):
    try:
        return importlib.import_module(cfg.task.module)
    except ModuleNotFoundError as err:
        raise CellError(f"Task '{cfg.task.name}' names module '{cfg.task.module}', which cannot be imported ({err}).")


def validate(cfg: DictConfig) -> CellPlan:
    """Every check that needs no weights: names, paths, ctx vs the model's positions, quantizer vs model."""
    from oscar.models import resolve_location
    from oscar.seam import SUPPORTED_MODEL_TYPES
    try:
        quantizer = build_quantizer(cfg.quantizer.name, **_options(cfg.quantizer))
        resolve_location(cfg.model)
    except (ValueError, FileNotFoundError) as err:
        raise CellError(str(err)) from None
    if cfg.model.get("model_type") and cfg.model.model_type not in SUPPORTED_MODEL_TYPES:
        raise CellError(f"Model '{cfg.model.name}' is a '{cfg.model.model_type}' architecture, which the KV seam "
                        f"does not support (supported: {', '.join(SUPPORTED_MODEL_TYPES)}).")
    max_pos = int(cfg.model.get("max_positions") or 0)
    if max_pos and cfg.ctx.tokens > max_pos:
        raise CellError(f"ctx={cfg.ctx.name} ({cfg.ctx.tokens} tokens) exceeds model '{cfg.model.name}''s "
                        f"{max_pos} positions.")
    task_module = import_task(cfg)
    results_dir = Path(cfg.results_dir)
    results_dir = results_dir if results_dir.is_absolute() else REPO_ROOT / results_dir
    key, full = cell_definition(cfg)
    return CellPlan(cfg, quantizer, task_module, CellRecorder(results_dir, key, full), results_dir)


def _options(node: DictConfig) -> dict:
    opts = OmegaConf.to_container(node, resolve=True)
    opts.pop("name", None)
    return opts


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> str:
    import torch
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise CellError("device=cuda was asked for, but no CUDA device is available.")
    return name


def run_cell(cfg: DictConfig) -> list[dict]:
    """Run (or skip) one cell and return its rows."""
    plan = validate(cfg)
    rec = plan.recorder
    if not cfg.force and cell_is_done(plan.results_dir, rec.key["task"], rec.cell):
        print(f"[skip] {rec.key} already has rows ({rec.cell}).")
        return read_jsonl(rows_path(plan.results_dir, rec.key["task"], rec.cell))
    device = resolve_device(cfg.device)
    try:
        metrics, records = execute(plan, device)
    except (KeyboardInterrupt, CellError):
        raise
    except Exception as err:  # a failed cell leaves an error row and is retried by the next sweep
        plan.recorder.write_error(f"{type(err).__name__}: {err}")
        raise
    return plan.recorder.write_ok(metrics, records)


def execute(plan: CellPlan, device: str):
    from eval.runner import run_task
    from oscar.models import load_model
    from oscar.seam import check_architecture, install
    cfg = plan.cfg
    seed_everything(int(cfg.seed))
    loaded = load_model(cfg.model, device=device)
    check_architecture(loaded.model.config)
    plan.quantizer.check(loaded.model.config)
    plan.quantizer.prepare(loaded.model, loaded.tokenizer)
    with install(loaded.model, plan.quantizer, kernels=cfg.kernels) as seam:
        paths: dict[str, int] = {}
        static_decode = str(cfg.get("static_decode", "auto"))
        metrics, records = run_task(plan.task_module, cfg.task, loaded, seam, cfg.ctx.tokens, int(cfg.seed),
                                    static_decode=static_decode, paths=paths)
        plan.recorder.run = {"kernels": seam.use_kernels, "static_decode": static_decode, "decode_batches": paths}
    metrics["bits_per_element"] = plan.quantizer.bits_per_element(cfg.ctx.tokens)
    return metrics, records
