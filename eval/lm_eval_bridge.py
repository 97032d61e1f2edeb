"""Run lm-evaluation-harness tasks on the already-loaded (and quantizer-patched) model.

lm-eval drives generation here, so its HFLM is subclassed to hand every `generate` call a fresh cache
from `new_cache()` (the quantized cache only acts if it is the one generate uses). Tasks come from
lm-eval's registry or from `include_path`, a folder of task YAMLs; a local `json` task there may give
`dataset_kwargs.data_files` relative to its YAML (see eval/lm_eval_tasks/toy_qa.yaml), which works
offline.

    metrics = run_lm_eval(model, tok, seam.new_cache, ["toy_qa"], include_path="eval/lm_eval_tasks",
                          limit=None, batch_size=4)     # {"toy_qa/exact_match": ..., ...}
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from harness.pipeline import CellError
from harness.task import Task

SHIPPED_TASKS = Path(__file__).parent / "lm_eval_tasks"


def _cached_hflm_class():
    """HFLM subclass whose generation uses `new_cache()`; built lazily so lm-eval is imported only when used."""
    from lm_eval.models.huggingface import HFLM

    class CachedHFLM(HFLM):
        def __init__(self, new_cache, scoring_refusal: str | None = None, **kwargs):
            super().__init__(**kwargs)
            self.new_cache, self.scoring_refusal = new_cache, scoring_refusal

        def loglikelihood(self, requests, *args, **kwargs):
            self._refuse_scoring()
            return super().loglikelihood(requests, *args, **kwargs)

        def loglikelihood_rolling(self, requests, *args, **kwargs):
            self._refuse_scoring()
            return super().loglikelihood_rolling(requests, *args, **kwargs)

        def _refuse_scoring(self):
            if self.scoring_refusal:
                raise CellError(self.scoring_refusal)

        def _model_generate(self, context, max_length, stop, **generation_kwargs):
            # context: [B, T] left-padded token ids; attention_mask arrives in generation_kwargs
            return super()._model_generate(context, max_length, stop, past_key_values=self.new_cache(),
                                           **generation_kwargs)

    return CachedHFLM


def _resolve_data_files(data_files, base: Path):
    """Relative local data_files (str, list or split -> path dict) resolved against the YAML's folder."""
    if isinstance(data_files, dict):
        return {split: _resolve_data_files(files, base) for split, files in data_files.items()}
    if isinstance(data_files, list):
        return [_resolve_data_files(files, base) for files in data_files]
    return str(base / data_files) if "://" not in data_files else data_files


def local_task_configs(tasks: list[str], include_path: str | None) -> list:
    """Task names, with those defined by a local `json` YAML in include_path replaced by their resolved config."""
    if not include_path:
        return list(tasks)
    from lm_eval.tasks._yaml_loader import load_yaml
    configs = {}
    for yaml_path in sorted(Path(include_path).glob("*.yaml")):
        config = load_yaml(yaml_path)
        kwargs = config.get("dataset_kwargs") or {}
        if config.get("dataset_path") == "json" and "data_files" in kwargs:
            kwargs["data_files"] = _resolve_data_files(kwargs["data_files"], yaml_path.parent)
            configs[config.get("task")] = config
    return [configs.get(task, task) for task in tasks]


def flatten_results(results: dict) -> dict[str, float]:
    """lm-eval's {task: {"metric,filter": value}} -> {"task/metric": value} (filter kept unless "none")."""
    flat = {}
    for task, metrics in results.items():
        for key, value in metrics.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue       # alias, "N/A" stderr, ...
            metric, _, filter_name = key.partition(",")
            name = metric if filter_name in ("", "none") else f"{metric},{filter_name}"
            flat[f"{task}/{name}"] = float(value)
    return flat


def scoring_refusal(quantizer) -> str | None:
    """Why loglikelihood / perplexity requests cannot measure `quantizer` (None for the identity).

    lm-eval scores them with one forward pass and no cache: every token attends to its context in full
    precision, so a KV quantizer would leave the numbers untouched while the rows claimed its bits.
    """
    if not quantizer.stores_codes:
        return None
    return (f"lm-eval loglikelihood and perplexity requests never read a KV cache back (each token attends to its "
            f"context in full precision), so quantizer '{quantizer.name}' would not be measured: run such tasks "
            f"with quantizer=bf16, or use generate_until tasks.")


def run_lm_eval(model, tokenizer, new_cache, tasks: list[str], include_path: str | None = None,
                limit: int | float | None = None, batch_size: int = 1, max_length: int | None = None,
                seed: int = 0, refusal: str | None = None) -> dict[str, float]:
    """Evaluate `tasks` with lm-eval on the given model/tokenizer; generation goes through `new_cache()`.

    `max_length` caps context + generation (lm-eval's default otherwise); `seed` seeds python, numpy,
    torch and few-shot sampling; `refusal` (see `scoring_refusal`) stops loglikelihood requests.
    """
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    lm = _cached_hflm_class()(new_cache, scoring_refusal=refusal, pretrained=model, tokenizer=tokenizer,
                              batch_size=batch_size, max_length=max_length)
    specs = local_task_configs(tasks, include_path)
    # indexing lm-eval's ~14k built-in task YAMLs takes ~10 s on a small CPU: only when a task needs them
    manager = TaskManager(include_path=include_path, include_defaults=any(isinstance(s, str) for s in specs))
    output = simple_evaluate(model=lm, tasks=specs, limit=limit,
                             task_manager=manager, log_samples=False, bootstrap_iters=0,
                             random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                             fewshot_random_seed=seed)
    return flatten_results(output["results"])


def evaluate(loaded, seam, task_cfg, ctx: int, seed: int):
    """The LmEval task's evaluation: task config fields `tasks`, `include_path` (default: the shipped
    eval/lm_eval_tasks), `limit`, `batch_size`. Returns (metrics, no per-example records)."""
    metrics = run_lm_eval(loaded.model, loaded.tokenizer, seam.new_cache, list(task_cfg.tasks),
                          include_path=str(task_cfg.get("include_path") or SHIPPED_TASKS),
                          limit=task_cfg.get("limit"), batch_size=int(task_cfg.get("batch_size", 1)), max_length=ctx,
                          seed=seed, refusal=scoring_refusal(seam.quantizer))
    return metrics, []


class LmEval(Task):
    """Any lm-evaluation-harness task: configs/task/lm_eval.yaml's `_target_`."""

    def validate(self) -> None:
        """lm-eval is installed (an optional extra) and `include_path`, when given, is a folder."""
        super().validate()
        if importlib.util.find_spec("lm_eval") is None:
            raise ValueError("task=lm_eval needs the optional package lm-eval: pip install -e '.[eval]'.")
        include = self.cfg.get("include_path")
        if include and not Path(str(include)).is_dir():
            raise ValueError(f"task.include_path '{include}' is not a folder of lm-eval task YAMLs.")

    def run(self, loaded, seam, ctx, seed, static_decode="off", paths=None):
        return evaluate(loaded, seam, self.cfg, ctx, seed)
