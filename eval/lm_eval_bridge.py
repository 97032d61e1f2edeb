"""Run lm-evaluation-harness tasks on the already-loaded (and quantizer-patched) model.

lm-eval drives generation here, so its HFLM is subclassed to hand every `generate` call a fresh cache
from `new_cache()` (the quantized cache only acts if it is the one generate uses), and to score
loglikelihood / perplexity requests in quantized context (each token attends to the quantized history
before it, harness/quantized_context.py) instead of one full-precision forward pass. Tasks come from
lm-eval's registry or from `include_path`, a folder of task YAMLs; a local `json` task there may give
`dataset_kwargs.data_files` relative to its YAML (see eval/lm_eval_tasks/toy_qa.yaml), which works
offline.

    metrics = run_lm_eval(model, tok, seam.new_cache, ["toy_qa"], include_path="eval/lm_eval_tasks",
                          limit=None, batch_size=4)     # {"toy_qa/exact_match": ..., ...}
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from harness.checks import list_option
from harness.quantized_context import quantized_context_logits, quantizes_cache
from harness.task import Task

SHIPPED_TASKS = Path(__file__).parent / "lm_eval_tasks"
DEFAULT_GEN_TOKENS = 256    # HFLM.max_gen_toks: what a generate_until task without a limit of its own asks for
GEN_TOKEN_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")   # lm-eval's spellings


def _cached_hflm_class():
    """HFLM subclass whose generation uses `new_cache()`; built lazily so lm-eval is imported only when used."""
    from lm_eval.models.huggingface import HFLM

    class CachedHFLM(HFLM):
        def __init__(self, new_cache, quantizer=None, paths: dict | None = None, **kwargs):
            super().__init__(**kwargs)
            self.new_cache, self.quantizer = new_cache, quantizer
            self.paths = {} if paths is None else paths

        def _model_call(self, inps, attn_mask=None, labels=None):
            # inps: [B, T] right-padded token ids of loglikelihood / perplexity requests -> logits [B, T, V]
            if self.quantizer is None or not quantizes_cache(self.quantizer):
                return super()._model_call(inps, attn_mask, labels)
            self.paths["quantized_context"] = self.paths.get("quantized_context", 0) + 1
            return quantized_context_logits(self.model, inps, self.new_cache, self.quantizer)

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


@functools.lru_cache(maxsize=4)
def task_manager(include_path: str | None, include_defaults: bool):
    """lm-eval's task index, built once per (include_path, include_defaults) in a process: indexing its ~14k built-in
    task YAMLs takes seconds, and a cell's validation and its run both need it."""
    from lm_eval.tasks import TaskManager
    return TaskManager(include_path=include_path, include_defaults=include_defaults)


def unknown_tasks(tasks: list[str], include_path: str) -> list[str]:
    """The names in `tasks` that are neither a task, group or tag lm-eval knows (include_path's YAMLs, then its
    built-in ones, indexed only when a name is not local) nor a YAML file."""
    names = [task for task in tasks if not (str(task).endswith(".yaml") and Path(task).is_file())]
    return [name for name in names if name not in _task_index(names, include_path)]


def _task_index(tasks: list[str], include_path: str) -> dict:
    """lm-eval's index entries by name: include_path's alone when it defines every task, else the built-in ones too."""
    local = task_manager(include_path, False).task_index
    return local if all(task in local for task in tasks) else task_manager(include_path, True).task_index


def generation_lengths(tasks: list[str], include_path: str) -> dict[str, int]:
    """{task: tokens it asks to generate} for the generate_until tasks named in `tasks` whose indexed config says
    so itself (`generation_kwargs`, else HFLM's DEFAULT_GEN_TOKENS); groups, tags and configs that `include`
    another are left to lm-eval's own check."""
    index, lengths = _task_index(tasks, include_path), {}
    for task in tasks:
        cfg = getattr(index.get(task), "cfg", None) or {}
        if cfg.get("output_type") != "generate_until" or "include" in cfg:
            continue
        kwargs = cfg.get("generation_kwargs") or {}
        lengths[task] = next((int(kwargs[key]) for key in GEN_TOKEN_KEYS if key in kwargs), DEFAULT_GEN_TOKENS)
    return lengths


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


def run_lm_eval(model, tokenizer, new_cache, tasks: list[str], include_path: str | None = None,
                limit: int | float | None = None, batch_size: int = 1, max_length: int | None = None,
                seed: int = 0, quantizer=None, paths: dict | None = None) -> dict[str, float]:
    """Evaluate `tasks` with lm-eval on the given model/tokenizer; generation goes through `new_cache()`.

    `max_length` caps context + generation (lm-eval's default otherwise); `seed` seeds python, numpy,
    torch and few-shot sampling. With a `quantizer` that quantizes the cache, loglikelihood and perplexity
    requests are scored in quantized context (harness/quantized_context.py) and counted in `paths`.
    """
    from lm_eval import simple_evaluate

    lm = _cached_hflm_class()(new_cache, quantizer=quantizer, paths=paths, pretrained=model, tokenizer=tokenizer,
                              batch_size=batch_size, max_length=max_length)
    specs = local_task_configs(tasks, include_path)
    # built-in task YAMLs are indexed only when a task needs them (`task_manager`)
    manager = task_manager(include_path, any(isinstance(s, str) for s in specs))
    output = simple_evaluate(model=lm, tasks=specs, limit=limit,
                             task_manager=manager, log_samples=False, bootstrap_iters=0,
                             random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                             fewshot_random_seed=seed)
    return flatten_results(output["results"])


def evaluate(loaded, seam, task_cfg, ctx: int, seed: int, paths: dict | None = None):
    """The LmEval task's evaluation: task config fields `tasks`, `include_path` (default: the shipped
    eval/lm_eval_tasks), `limit`, `batch_size`. Returns (metrics, no per-example records); `paths` counts
    the quantized-context scoring batches (recorded in the row's decode paths)."""
    metrics = run_lm_eval(loaded.model, loaded.tokenizer, seam.new_cache, list(task_cfg.tasks),
                          include_path=str(task_cfg.get("include_path") or SHIPPED_TASKS),
                          limit=task_cfg.get("limit"), batch_size=int(task_cfg.get("batch_size", 1)), max_length=ctx,
                          seed=seed, quantizer=seam.quantizer, paths=paths)
    return metrics, []


class LmEval(Task):
    """Any lm-evaluation-harness task: configs/task/lm_eval.yaml's `_target_`."""

    def validate(self) -> None:
        """lm-eval is installed (an optional extra), `include_path`, when given, is a folder, and every task is one
        lm-eval knows (before any weights load)."""
        super().validate()
        if importlib.util.find_spec("lm_eval") is None:
            raise ValueError("task=lm_eval needs the optional package lm-eval: pip install -e '.[eval]'.")
        include = self.cfg.get("include_path")
        if include and not Path(str(include)).is_dir():
            raise ValueError(f"task.include_path '{include}' is not a folder of lm-eval task YAMLs.")
        unknown = unknown_tasks(list_option(self.cfg.tasks, "task.tasks"), str(include or SHIPPED_TASKS))
        if unknown:
            raise ValueError(f"task.tasks names {unknown}, which lm-eval does not know (neither in "
                             f"{include or 'eval/lm_eval_tasks'} nor among its built-in tasks, groups and tags).")

    def check_prompts(self, tokenizer, chat: bool, ctx: int, seed: int) -> None:
        """A generate_until task needs ctx.tokens above the tokens it generates (lm-eval asserts it only once the
        weights have loaded)."""
        include = str(self.cfg.get("include_path") or SHIPPED_TASKS)
        lengths = generation_lengths(list_option(self.cfg.tasks, "task.tasks"), include)
        short = sorted(task for task, tokens in lengths.items() if tokens >= ctx)
        if short:
            most = max(lengths[task] for task in short)
            raise ValueError(f"task.tasks {short} generate up to {most} tokens, which leaves no room for a prompt "
                             f"in ctx.tokens={ctx}; give ctx.tokens above {most}.")

    def run(self, loaded, seam, ctx, seed, static_decode="off", paths=None, compile_step=False):
        return evaluate(loaded, seam, self.cfg, ctx, seed, paths)
