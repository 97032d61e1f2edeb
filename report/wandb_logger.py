"""Optional experiment loggers (`logger=wandb`); `logger=none` logs nothing.

Each computed cell is one wandb run (a skipped cell is not logged again): the resolved config, its metrics, the rows
and the per-example records as tables, and the cell's plot (a bar per metric); a failed cell is a run too, with its
error. Runs of one sweep share a group (the sweep's folder name, unless `logger.group` is set), so a dashboard
compares the quantizers of a sweep side by side. wandb runs offline (WANDB_MODE=offline) unless an API key is
configured, so no network is ever needed; `wandb sync outputs/wandb/offline-run-*` uploads later.
"""
from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf


def _start(cfg: DictConfig, group: str | None, status: str):
    """A wandb run for this cell (None when logging is off)."""
    if cfg.logger.name == "none":
        return None
    if cfg.logger.name != "wandb":
        raise ValueError(f"Unknown logger '{cfg.logger.name}'; expected none or wandb.")
    import wandb
    if not (os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE")):
        os.environ["WANDB_MODE"] = "offline"
    os.makedirs(cfg.logger.dir, exist_ok=True)          # wandb writes <dir>/wandb/<run>
    name = f"{cfg.model.name}/{cfg.quantizer.name}/{cfg.task.name}/{cfg.ctx.name}/seed{cfg.seed}"
    return wandb.init(project=cfg.logger.project, group=cfg.logger.get("group") or group or str(cfg.task.name),
                      name=name, tags=[*cfg.logger.tags, status], dir=cfg.logger.dir,
                      config=OmegaConf.to_container(cfg, resolve=True), reinit="finish_previous")


def log_cell(cfg: DictConfig, rows: list[dict], records=(), group: str | None = None) -> str | None:
    """Log one computed cell: metrics, its rows and per-example records as tables; returns the run directory."""
    run = _start(cfg, group, "ok")
    if run is None:
        return None
    import wandb
    scores = {row["metric"]: row["value"] for row in rows if row.get("status") == "ok"}
    run.log(scores)
    run.log({"rows": wandb.Table(dataframe=_frame(rows))})
    run.log({"metrics_plot": _metrics_plot(wandb, scores, run.name)})
    if records:
        run.log({"examples": wandb.Table(dataframe=_frame([_flat(r) for r in records]))})
    run.finish()
    return run.dir


def log_failure(cfg: DictConfig, error: str, group: str | None = None) -> str | None:
    """Log a cell that failed while running: its config and the error, as a run marked failed."""
    run = _start(cfg, group, "error")
    if run is None:
        return None
    run.summary["error"] = error
    run.finish(exit_code=1)
    return run.dir


def _metrics_plot(wandb, scores: dict, title: str):
    """The cell's plot: a bar per metric (RULER's variants, fidelity's layers, ...), drawn by wandb from a table."""
    import pandas as pd
    table = wandb.Table(dataframe=pd.DataFrame({"metric": list(scores), "value": [float(v) for v in scores.values()]}))
    return wandb.plot.bar(table, "metric", "value", title=title)


def _frame(items):
    import pandas as pd
    return pd.DataFrame([{k: (str(v) if isinstance(v, (dict, list)) else v) for k, v in item.items()} for item in items])


def _flat(record) -> dict:
    from dataclasses import asdict, is_dataclass
    return asdict(record) if is_dataclass(record) else dict(record)
