"""One cell of the grid: validate -> skip if done -> load -> quantizer -> seam -> task -> rows.

run.py is a thin Hydra wrapper around `run_cell(cfg, store)`; everything that can be checked without
weights is checked first, so bad input fails in seconds with one sentence. The quantizer and the task
are the classes their configs' `_target_` name: this module imports no concrete quantizer or task.
`store` is the results store (report.store.ResultsStore, passed in by the caller: the core does not
import the reporting layer); it hashes the cell, skips finished cells and writes rows atomically.
"""
from __future__ import annotations

import logging
import os
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.checks import check_cell_options, check_device, check_model_source, compile_step_enabled
from harness.environment import environment, release_memory, reset_peak_memory
from harness.quantizer import instantiate, quantizer_from_config
from harness.task import Task

log = logging.getLogger(__name__)


class CellError(ValueError):
    """Bad input detected before any weights are loaded; the message is one sentence for the user."""


class CellDoesNotFit(CellError):
    """The cell's memory plan exceeds the devices it was given (recorded as status=oom; a sweep goes on)."""


@dataclass
class CellPlan:
    cfg: DictConfig
    quantizer: object
    task: object
    key: dict
    definition: dict
    device: str = "cpu"       # where the cell runs (device=auto resolved)
    tokenizer: tuple | None = None   # (tokenizer, name) that checked the prompts (`prompt_problem`), reused at load


# Options added after cells were first recorded, with the value every earlier cell ran with. Such an option
# enters the cell id only when set to another value, so adding it leaves existing cells' ids (and their
# skip-if-done) unchanged. Add each new result-changing option here with its old behaviour as the value.
ID_NEUTRAL_DEFAULTS: dict[tuple[str, str], object] = {
    ("quantizer", "rotation_dtype"): "float32",
    ("quantizer", "key_target"): "query",     # OSCAR's key covariance target (tensor: the K^T K ablation)
    ("task", "max_new_tokens"): None,         # LongBench's cap (null: its per-dataset budgets); other tasks set it
    ("task", "prefill_chunk"): None,          # tokens per prefill forward (null: the whole prompt in one)
    ("quantizer", "chunk_keeps_recent"): True,  # a non-final prefill chunk keeps its recent window in full precision
    ("quantizer", "prefill_attends_quantized"): False,  # a prefill chunk attends to its own rows in full precision
}
DRY_RUN_SUFFIX = "@random"    # a random-weight model's rows are <model>@random (report/tables.py leaves them out)


def model_label(model_cfg: DictConfig) -> str:
    """The model name of a cell's rows: `<name>@random` for random weights (a dry run), else the name."""
    return f"{model_cfg.name}{DRY_RUN_SUFFIX}" if model_cfg.get("source") == "random" else str(model_cfg.name)


def ctx_label(ctx_cfg: DictConfig) -> str:
    """A cell's ctx in its rows and messages: the ctx config's name ("4k"), or the token count where ctx.tokens
    overrides what the name says (`ctx=4k ctx.tokens=1024` is keyed "1024", so it never stands in a 4k column).
    A name that is not a count ("long") stays."""
    name, tokens = str(ctx_cfg.name), int(ctx_cfg.tokens)
    count = re.fullmatch(r"(\d+)([kK]?)", name)
    if count is None or int(count.group(1)) * (1024 if count.group(2) else 1) == tokens:
        return name
    return str(tokens)


def cell_definition(cfg: DictConfig) -> tuple[dict, dict]:
    """(row key, cell settings): the key names the cell in tables; the hash of the settings is the cell id.

    A random-weight cell's key names its model `<name>@random` (`model_label`), so it never joins real rows, and
    a ctx.tokens override its ctx by the count (`ctx_label`).

    The settings are the resolved model, quantizer, task and ctx groups and the seed (everything that
    changes results), less `_target_` (code, not a setting) and less ID_NEUTRAL_DEFAULTS at their defaults.
    """
    key = {"model": model_label(cfg.model), "quantizer": cfg.quantizer.name, "task": cfg.task.name,
           "ctx": ctx_label(cfg.ctx), "seed": int(cfg.seed)}
    full = {name: _settings(cfg[name]) for name in ("model", "quantizer", "task", "ctx")}
    full["task"]["module"] = str(cfg.task._target_).rpartition(".")[0]   # the task's identity is its module
    for (group, option), default in ID_NEUTRAL_DEFAULTS.items():
        if full[group].get(option, default) == default:
            full[group].pop(option, None)
    full["seed"] = int(cfg.seed)
    return key, full


def _settings(node: DictConfig) -> dict:
    """A config group's settings without `_target_` (which class runs them is code, not a setting)."""
    settings = OmegaConf.to_container(node, resolve=True)
    settings.pop("_target_", None)
    return settings


def build_task(task_cfg: DictConfig):
    """The task object its config's `_target_` names, built from the other keys and validated."""
    task = instantiate(OmegaConf.to_container(task_cfg, resolve=True), "Task")
    task.validate()
    return task


def build_checked_quantizer(quantizer_cfg: DictConfig):
    """The quantizer its config's `_target_` names, built from the other keys and validated."""
    quantizer = quantizer_from_config(OmegaConf.to_container(quantizer_cfg, resolve=True))
    quantizer.validate()
    return quantizer


def fill_model_facts(model_cfg: DictConfig, model_config: dict) -> None:
    """A model config without a name (configs/model/local.yaml) takes its folder's; without model_type or
    max_positions, those of its config.json, so that the checks below see them before any weights load."""
    if not model_cfg.get("name"):
        model_cfg.name = Path(os.path.expanduser(str(model_cfg.path))).resolve().name
    if model_config.get("model_type") and not model_cfg.get("model_type"):
        model_cfg.model_type = model_config["model_type"]
    if model_config.get("max_position_embeddings") and not model_cfg.get("max_positions"):
        model_cfg.max_positions = int(model_config["max_position_embeddings"])


def validate(cfg: DictConfig) -> CellPlan:
    """Every check that needs no weights, in one pass: the cell-wide keys (seed, device, kernels, static_decode,
    ctx), the model's source, ctx vs its positions, and the quantizer's and the task's own `validate()`.
    CellError (one sentence) at the first that fails."""
    from harness.models import resolve_location
    from harness.seam import SUPPORTED_MODEL_TYPES
    if cfg.model.get("unsupported"):
        raise CellError(f"Model '{cfg.model.name}' cannot run here: {cfg.model.unsupported}")
    try:
        device = check_cell_options(cfg)
        quantizer = build_checked_quantizer(cfg.quantizer)
        model_config = check_model_source(cfg.model)
        resolve_location(cfg.model)
        task = build_task(cfg.task)
    except (ValueError, FileNotFoundError) as err:
        raise CellError(str(err)) from None
    fill_model_facts(cfg.model, model_config)
    if cfg.model.get("model_type") and cfg.model.model_type not in SUPPORTED_MODEL_TYPES:
        raise CellError(f"Model '{cfg.model.name}' is a '{cfg.model.model_type}' architecture, which the KV seam "
                        f"does not support (supported: {', '.join(SUPPORTED_MODEL_TYPES)}).")
    max_pos = int(cfg.model.get("max_positions") or 0)
    if max_pos and cfg.ctx.tokens > max_pos:
        from harness.model_catalog import context_refusal
        raise CellError(context_refusal(cfg.model.name, cfg.ctx.name, int(cfg.ctx.tokens), max_pos,
                                        f"quantizer={cfg.quantizer.name} task={cfg.task.name}"))
    key, full = cell_definition(cfg)
    return CellPlan(cfg, quantizer, task, key, full, device)


def prompt_problem(plan: CellPlan) -> str | None:
    """The task's prompt check (`Task.check_prompts`) with the model's tokenizer alone, before any weights load or
    calibration runs: one sentence where the cell's context cannot hold the task's prompts, else None (no tokenizer
    is loaded for a task without a check). The tokenizer stays on the plan: the model's load takes it instead of
    loading it again."""
    if type(plan.task).check_prompts is Task.check_prompts:
        return None
    from harness.models import chat_prompts, load_tokenizer
    plan.tokenizer = load_tokenizer(plan.cfg.model)
    tok = plan.tokenizer[0]
    try:
        plan.task.check_prompts(tok, chat_prompts(plan.cfg.model, tok), int(plan.cfg.ctx.tokens), int(plan.cfg.seed))
    except ValueError as err:
        return str(err)
    return None


def seed_everything(seed: int) -> None:
    """python, numpy and torch (every device) seeded by transformers' own helper."""
    from transformers import set_seed
    set_seed(seed)


def resolve_device(name: str) -> str:
    """The device a `device=` setting names (auto resolved); CellError when it is unknown or absent."""
    try:
        return check_device(name)
    except ValueError as err:
        raise CellError(str(err)) from None


def describe(plan: CellPlan) -> str:
    """One line naming the cell as it will run (after every override): model, quantizer, task, ctx, seed, device."""
    cfg = plan.cfg
    return (f"model={cfg.model.name} quantizer={cfg.quantizer.name} task={cfg.task.name} "
            f"ctx={cfg.ctx.name} ({cfg.ctx.tokens} tokens) seed={cfg.seed} device={plan.device}")


def run_cell(cfg: DictConfig, store) -> list[dict]:
    """Run (or skip) one cell and return its rows; `store` is a report.store.ResultsStore."""
    plan = validate(cfg)
    recorder = store.recorder(plan.key, plan.definition, environment)
    if not cfg.force and store.is_done(recorder):
        log.info("[skip] %s already has rows (%s).", plan.key, recorder.cell)
        return store.rows(recorder)
    try:
        store.check_writable()
    except ValueError as err:
        raise CellError(str(err)) from None
    problem = prompt_problem(plan)
    if problem:                            # the cell cannot run at this ctx: an error row says why, no weights loaded
        recorder.write_error(problem)
        raise CellError(problem)
    log.info("cell %s: %s", recorder.cell, describe(plan))
    release_memory()                       # an earlier cell of this process must not shrink this one's budget
    reset_peak_memory()
    memory = plan_memory(plan, plan.device)
    refusal = memory.refusal()
    if refusal:
        recorder.write_error(refusal, status="oom")
        raise CellDoesNotFit(refusal)
    try:
        metrics, records = execute(plan, plan.device, recorder, memory)
    except (KeyboardInterrupt, CellError):
        raise
    except Exception as err:  # a failed cell leaves an error row and is retried by the next sweep
        traceback.clear_frames(err.__traceback__)   # a sweep keeps err: its frames must not keep the model alive
        if not is_out_of_memory(err):
            recorder.write_error(f"{type(err).__name__}: {err}")
            raise
        detail = out_of_memory_detail(err)
        recorder.write_error(detail, status="oom")
        raise CellDoesNotFit(detail) from None
    finally:
        release_memory()
    return recorder.write_ok(metrics, records)


def is_out_of_memory(err: BaseException) -> bool:
    """A device allocation failed while the cell ran (past its memory plan, which only estimates activations)."""
    import torch
    return isinstance(err, torch.OutOfMemoryError)


def out_of_memory_detail(err: BaseException) -> str:
    """One sentence naming what was asked, from the allocator's message (its first sentence)."""
    asked = str(err).split("\n")[0].split(". GPU")[0].strip().rstrip(".")
    return (f"The cell ran out of device memory while running, past its memory plan ({asked}); give it more "
            f"memory, a smaller batch or context, or task.prefill_chunk.")


def plan_memory(plan: CellPlan, device: str):
    """The cell's placement and memory plan (harness/memory_plan.py), printed; made before any weight loads."""
    import torch
    from harness.memory_plan import model_head_dim, plan_cell
    from harness.models import model_config
    from harness.placement import device_of
    from harness.seam import kernels_enabled
    from kernels.dispatch import unsupported_head_dim
    try:
        config = model_config(plan.cfg.model)
        head_dim = model_head_dim(config)
        use_kernels = kernels_enabled(torch.device(device_of(device)), str(plan.cfg.kernels), plan.quantizer,
                                      head_dim)
        memory = plan_cell(plan.cfg, plan.quantizer, device, use_kernels, config=config)
    except (ValueError, FileNotFoundError) as err:
        raise CellError(str(err)) from None
    no_build = unsupported_head_dim(head_dim)
    if no_build and str(plan.cfg.kernels) == "auto" and device_of(device).startswith("cuda"):
        log.warning("%s: this cell runs the PyTorch reference path (slower; its rows say run.kernels=false).",
                    no_build)
    log.info("memory plan:\n%s", memory.describe())
    return memory


def static_decode_note(cfg: DictConfig, devices: list[str]) -> str:
    """How a static decode over several devices runs (a row's `run.static_decode_graph`), or '' on one device."""
    if len(devices) < 2 or str(cfg.get("static_decode", "auto")) == "off":
        return ""
    return (f"per GPU: the frozen cache's step replays one CUDA graph on each of {', '.join(devices)} "
            f"(harness.segmented_graph)")


def load_prepared(plan: CellPlan, device: str, device_map: dict | None = None):
    """The cell's model on `device` (or placed by `device_map`; a LoadedModel), its architecture and quantizer
    checked, the quantizer prepared (calibrated or loaded): what a run and a notebook session (notebook.py)
    both start from."""
    from harness.models import load_model
    from harness.seam import check_architecture
    log.info("loading model %s (%s) on %s", plan.cfg.model.name, plan.cfg.model.source, device)
    loaded = load_model(plan.cfg.model, device=device, seed=int(plan.cfg.seed), device_map=device_map,
                        tokenizer=plan.tokenizer)
    try:
        check_architecture(loaded.model.config)
        plan.quantizer.check(loaded.model.config)      # against the model: head_dim, layers, rotation files
    except ValueError as err:
        raise CellError(str(err)) from None
    log.info("preparing quantizer %s", plan.quantizer.name)
    plan.quantizer.prepare(loaded.model, loaded.tokenizer)
    return loaded


def execute(plan: CellPlan, device: str, recorder, memory=None):
    """Load, install the quantizer, run the task; `memory` (a MemoryPlan) places the model across devices."""
    from harness.placement import devices_in
    from harness.seam import install
    cfg = plan.cfg
    device_map = memory.device_map if memory is not None else None
    devices = devices_in(device_map) if device_map else [device]
    static_decode, graph_note = str(cfg.get("static_decode", "auto")), static_decode_note(cfg, devices)
    compile_step = compile_step_enabled(str(cfg.get("compile_step", "off")), device)   # on every GPU of a split
    seed_everything(int(cfg.seed))
    loaded = load_prepared(plan, device, device_map)
    recorder.artifacts = plan.quantizer.artifacts()
    with install(loaded.model, plan.quantizer, kernels=cfg.kernels) as seam:
        paths: dict = {}
        metrics, records = plan.task.run(loaded, seam, cfg.ctx.tokens, int(cfg.seed),
                                         static_decode=static_decode, paths=paths, compile_step=compile_step)
        clock = paths.pop("clock", None)
        recorder.run = {"kernels": seam.use_kernels, "kernels_setting": str(cfg.kernels), "device": device,
                        "prefill_attends_quantized": plan.quantizer.prefill_attends_quantized,
                        "static_decode": static_decode, "decode_batches": paths,
                        "decode_timing": clock.as_row() if clock else None, "compile_step": compile_step,
                        "weights": loaded.weights, "tokenizer": loaded.tokenizer_name,
                        **placement_provenance(memory, graph_note)}
    metrics["bits_per_element"] = plan.task.bits_per_element(plan.quantizer, cfg.ctx.tokens)
    recorder.intervals = plan.task.intervals(records)
    return metrics, records


def placement_provenance(memory, graph_note: str) -> dict:
    """Where the model lived (layer span per device), its memory plan in GB, and the host's peak RSS."""
    import resource
    out = {"host_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if graph_note:
        out["static_decode_graph"] = graph_note
    if memory is None:
        return out
    layers: dict[str, list[int]] = {}
    for index, dev in enumerate(memory.layer_devices):
        layers.setdefault(dev, []).append(index)
    out["placement"] = {dev: f"layers {idx[0]}-{idx[-1]}" for dev, idx in layers.items()}
    out["memory_plan"] = memory.as_row()
    return out
