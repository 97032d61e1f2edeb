"""Optional experiment loggers (`logger=wandb`); `logger=none` logs nothing.

wandb runs offline (WANDB_MODE=offline) unless an API key is configured, so no network is ever
needed; `wandb sync outputs/wandb/offline-run-*` uploads later.
"""
from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf


def log_cell(cfg: DictConfig, rows: list[dict], records=()) -> str | None:
    """Log one finished cell; returns the run directory (None when logging is off)."""
    if cfg.logger.name == "none":
        return None
    if cfg.logger.name != "wandb":
        raise ValueError(f"Unknown logger '{cfg.logger.name}'; expected none or wandb.")
    import wandb
    if not (os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE")):
        os.environ["WANDB_MODE"] = "offline"
    os.makedirs(cfg.logger.dir, exist_ok=True)
    run = wandb.init(project=cfg.logger.project, group=cfg.logger.group, tags=list(cfg.logger.tags),
                     dir=cfg.logger.dir, config=OmegaConf.to_container(cfg, resolve=True), reinit="finish_previous")
    run.log({row["metric"]: row["value"] for row in rows if row.get("status") == "ok"})
    run.log({"rows": wandb.Table(dataframe=_frame(rows))})
    if records:
        run.log({"examples": wandb.Table(dataframe=_frame([_flat(r) for r in records]))})
    run.finish()
    return run.dir


def _frame(items):
    import pandas as pd
    return pd.DataFrame([{k: (str(v) if isinstance(v, (dict, list)) else v) for k, v in item.items()} for item in items])


def _flat(record) -> dict:
    from dataclasses import asdict, is_dataclass
    return asdict(record) if is_dataclass(record) else dict(record)
