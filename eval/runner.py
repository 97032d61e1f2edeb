"""Runs a task module over the installed seam and returns (metrics, per-example records).

Generation tasks implement build_examples / score / aggregate (see eval/base.py); tasks that drive
the model themselves (fidelity, lm-eval) implement `run(loaded, seam, task_cfg, ctx, seed)`.
"""
from __future__ import annotations

from omegaconf import OmegaConf

from eval.base import Record
from eval.generate import generate_outputs

RUNNER_KEYS = ("name", "module", "batch_size", "stop", "sampling")


def task_options(task_cfg) -> dict:
    opts = OmegaConf.to_container(task_cfg, resolve=True)
    return {k: v for k, v in opts.items() if k not in RUNNER_KEYS}


def run_task(module, task_cfg, loaded, seam, ctx: int, seed: int, static_decode: str = "off",
             paths: dict | None = None):
    if hasattr(module, "run"):
        return module.run(loaded, seam, task_cfg, ctx, seed)
    opts = task_options(task_cfg)
    examples = module.build_examples(loaded.tokenizer, ctx, int(opts.pop("samples")), seed, chat=loaded.chat, **opts)
    outputs = generate_outputs(loaded.model, loaded.tokenizer, examples, seam.new_cache,
                               batch_size=int(task_cfg.get("batch_size", 1)),
                               sampling=task_cfg.get("sampling"), stop=list(task_cfg.get("stop") or []),
                               desc=task_cfg.name, static_decode=static_decode, paths=paths)
    records = [Record(ex.id, out, float(module.score(ex, out)), len(loaded.tokenizer(ex.prompt)["input_ids"]), ex.meta)
               for ex, out in zip(examples, outputs)]
    return module.aggregate(records), records
