"""The task interface: a task config's `_target_` class, built from the config's keys, runs over the seam.

A generation task subclasses `GenerationTask` and provides
    build_examples(tokenizer, ctx, n, seed, **task_options) -> list[Example]
    score(example, output) -> float
    aggregate(records) -> dict[str, float]        # metric name -> value for the result rows
    stratum(record) -> str                        # optional: the group its intervals resample within
A task that drives the model itself (fidelity, lm-eval) subclasses `Task` and overrides `run`.
Task configs live in configs/task/<name>.yaml; their `_target_` names the class (in eval/).
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.checks import integer_option
from harness.generate import generate_outputs
from harness.intervals import metric_intervals
from harness.sampling import check_sampling

RUNNER_KEYS = ("name", "batch_size", "stop", "sampling", "prefill_chunk")   # generation settings, not example options
MIN_PREFILL_CHUNK = 64     # task.prefill_chunk: tokens per prefill forward; shorter chunks would take the decode kernel


@dataclass
class Example:
    """One prompt to generate from, and what a correct answer must contain."""

    id: str
    prompt: str                      # fully templated text given to the tokenizer (chat template already applied)
    answers: list[str]               # reference strings used by the task's scorer
    max_new_tokens: int = 128
    meta: dict = field(default_factory=dict)   # variant, depth, length, ... (kept in the per-example records)


@dataclass
class Record:
    """One scored generation: the audit trail written beside the result rows."""

    example_id: str
    output: str
    score: float
    prompt_tokens: int
    meta: dict = field(default_factory=dict)


class Task:
    """Base of every task: keeps its config (as the task code reads it) and runs one cell's evaluation."""

    samples_zero_means_all = False      # True where `samples: 0` asks for every example of the data set

    def __init__(self, **options):
        self.cfg: DictConfig = OmegaConf.create(options)
        self.name = str(self.cfg.name)

    def validate(self) -> None:
        """Raise ValueError (one sentence) for options no run can use; called before any weights load.

        Subclasses extend it (calling super().validate()): the one `harness.pipeline.validate` pass of a cell."""
        if "samples" in self.cfg:
            integer_option(self.cfg.samples, "task.samples", minimum=0 if self.samples_zero_means_all else 1)
        if "batch_size" in self.cfg:
            integer_option(self.cfg.batch_size, "task.batch_size", minimum=1)
        if self.cfg.get("prefill_chunk") is not None:
            integer_option(self.cfg.prefill_chunk, "task.prefill_chunk", minimum=MIN_PREFILL_CHUNK)

    def check_prompts(self, tokenizer, chat: bool, ctx: int, seed: int) -> None:
        """Raise ValueError (one sentence) where this task's prompts cannot fit `ctx` tokens with this tokenizer;
        `harness.pipeline.prompt_problem` calls it with the tokenizer alone, before any weights load. Tasks whose
        prompts always fit (truncated, or short) leave it as it is, and no tokenizer is loaded for them."""

    def run(self, loaded, seam, ctx: int, seed: int, static_decode: str = "off",
            paths: dict | None = None, compile_step: bool = False) -> tuple[dict, list]:
        """(metrics, per-example records) of the model behind `seam` at context `ctx` (static_decode, paths and
        compile_step: as `harness.generate.generate_outputs` takes them, for tasks that generate)."""
        raise NotImplementedError

    def intervals(self, records: list) -> dict[str, dict]:
        """{metric: {"n", "ci95"}} for the rows (harness/intervals.py); none for a task without example scores."""
        return {}

    def bits_per_element(self, quantizer, ctx: int) -> float:
        """The stored bits per K/V element of what this task measured (the row's `bits_per_element`)."""
        return quantizer.bits_per_element(ctx)


class GenerationTask(Task):
    """Build prompts, generate through the seam's cache, score each output, aggregate."""

    def build_examples(self, tokenizer, ctx: int, n: int, seed: int, **options) -> list[Example]:
        raise NotImplementedError

    def score(self, example: Example, output: str) -> float:
        raise NotImplementedError

    def aggregate(self, records: list[Record]) -> dict[str, float]:
        raise NotImplementedError

    def stratum(self, record: Record) -> str:
        """The group a bootstrap resamples within (one group unless a task averages several)."""
        return ""

    def intervals(self, records: list[Record]) -> dict[str, dict]:
        return metric_intervals(records, self.aggregate, self.stratum)

    def options(self) -> dict:
        opts = OmegaConf.to_container(self.cfg, resolve=True)
        return {k: v for k, v in opts.items() if k not in RUNNER_KEYS}

    def validate(self) -> None:
        """Also: the sampling settings (`harness.sampling.check_sampling`) and every option is one that
        `build_examples` takes (a key meant for another task is refused)."""
        super().validate()
        sampling = self.cfg.get("sampling")
        check_sampling(None if sampling is None else OmegaConf.to_container(sampling, resolve=True))
        parameters = inspect.signature(self.build_examples).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return
        taken = set(parameters) - {"tokenizer", "ctx", "n", "seed", "chat"}
        unknown = sorted(set(self.options()) - taken - {"samples"})
        if unknown:
            raise ValueError(f"task={self.name} does not take option(s) {unknown}; it takes {sorted(taken)}.")

    def run(self, loaded, seam, ctx, seed, static_decode="off", paths=None, compile_step=False):
        opts = self.options()
        examples = self.build_examples(loaded.tokenizer, ctx, int(opts.pop("samples")), seed, chat=loaded.chat,
                                       **opts)
        if not examples:
            raise ValueError(f"task={self.name} built no examples (check task.samples and its data).")
        outputs = generate_outputs(loaded.model, loaded.tokenizer, examples, seam.new_cache,
                                   batch_size=int(self.cfg.get("batch_size", 1)),
                                   sampling=self.cfg.get("sampling"), stop=list(self.cfg.get("stop") or []),
                                   desc=self.name, static_decode=static_decode, paths=paths,
                                   seed=seed, compile_step=compile_step,
                                   prefill_chunk=self.cfg.get("prefill_chunk"))
        records = [Record(ex.id, out, float(self.score(ex, out)), len(loaded.tokenizer(ex.prompt)["input_ids"]),
                          ex.meta) for ex, out in zip(examples, outputs)]
        return self.aggregate(records), records


def check_task_data(task: str, data_path, hub_id: str, example: str) -> None:
    """A task reading a hub dataset: `data_path`, when given, exists; offline, without it, the dataset must be in
    the local datasets cache, else one sentence naming task.data_path."""
    if data_path:
        if not Path(str(data_path)).expanduser().exists():
            raise ValueError(f"task.data_path '{data_path}' does not exist.")
        return
    offline = "1" in (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_DATASETS_OFFLINE"))
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
    cache = Path(os.environ.get("HF_DATASETS_CACHE", home / "datasets")).expanduser()
    if offline and not (cache / hub_id.replace("/", "___")).exists():
        raise ValueError(f"task={task} reads '{hub_id}' from the hub, which is offline here; pass a local copy "
                         f"with task.data_path=... (e.g. task.data_path={example}).")
