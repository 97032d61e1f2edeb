"""The plan of a sweep, printed before its first cell: the cells, estimated GPU-hours and memory per cell.

    python scripts/sweep_plan.py experiment=paper_main          # print it without running anything
    python run.py -m experiment=paper_main                      # prints it first (the SweepPlan callback)

The grid is expanded exactly as Hydra's basic sweeper expands it (the experiment's `hydra.sweeper.params`, then
the command line). Time per example is *measured*: the median over the results store's ok cells of the same
(model, task, ctx) of the cell's wall time over its examples (any quantizer, so a quantizer's own speed is not
modelled; random-weight dry runs in results/dryrun count for their model's shapes, marked as such); with no such
cell it prints "unknown", never a guess. Memory per cell is arithmetic on the model
shapes of MODEL_FACTS (from the model cards): bf16 weights plus a BF16 KV cache of ctx tokens per sequence of a
batch, an upper bound for every quantizer's cache; activations, logits and CUDA graph pools are not counted.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from hydra.experimental.callback import Callback

from report.tables import DRY_RUN_SUFFIX

# name: (parameters in billions, layers, KV heads, head_dim, source)
MODEL_FACTS = {
    "qwen3_4b_thinking": (4.0, 36, 8, 128, "Qwen/Qwen3-4B-Thinking-2507 model card"),
    "qwen3_8b": (8.2, 36, 8, 128, "Qwen/Qwen3-8B model card"),
    "qwen3_32b": (32.8, 64, 8, 128, "Qwen/Qwen3-32B model card"),
    "gemma3_270m": (0.27, 18, 1, 256, "google/gemma-3-270m config.json"),
    "smollm2_135m": (0.135, 30, 3, 64, "HuggingFaceTB/SmolLM2-135M config.json"),
}
# Examples of a task run with samples=0 (all): the data sets' sizes (BASELINES_AND_TASKS.md, the tasks' configs).
DATASET_SIZES = {"aime25": 30, "math500": 500, "gpqa_diamond": 198, "humaneval": 164}
AXES = ("model", "quantizer", "task", "ctx", "seed")
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class CellGroup:
    """Cells of one (model, task, ctx) and what one of them costs."""
    model: str
    task: str
    ctx: str
    cells: int
    gpus: int
    examples: int | None
    seconds_per_example: float | None
    time_source: str
    memory_gb: float | None

    @property
    def gpu_hours(self) -> float | None:
        if self.examples is None or self.seconds_per_example is None:
            return None
        return self.cells * self.gpus * self.examples * self.seconds_per_example / 3600


def sweep_jobs(params: dict, overrides: list[str]) -> list[list[str]]:
    """Each job's overrides, as Hydra's BasicSweeper builds them (config params first, the command line wins)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + list(overrides))
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def job_axes(job: list[str], defaults: dict) -> dict:
    """{model, quantizer, task, ctx, seed, job} of one job: its overrides over the composed config's choices."""
    axes = dict(defaults, job=job)
    for item in job:
        key, _, value = item.partition("=")
        if key in AXES:
            axes[key] = value
    return axes


def grid_axes(config) -> list[dict]:
    """The axes of every cell a multirun of `config` (composed with its hydra node) will run."""
    choices = config.hydra.runtime.choices
    defaults = {axis: str(choices.get(axis)) for axis in AXES[:-1]} | {"seed": str(config.seed)}
    return [job_axes(job, defaults) for job in jobs_of(config)]


def jobs_of(config) -> list[list[str]]:
    params = config.hydra.sweeper.get("params") or {}
    return sweep_jobs(dict(params), list(config.hydra.overrides.task))


def measured_seconds(rows: pd.DataFrame) -> dict[tuple[str, str, str], list[tuple[float, str]]]:
    """{(model, task, ctx): [(wall seconds per example, device) of each ok cell]} from a store's rows."""
    if rows.empty or "wall_time_s" not in rows or "n" not in rows:
        return {}
    ok = rows[rows["status"] == "ok"].copy()
    ok["n"] = pd.to_numeric(ok["n"], errors="coerce")
    per_cell = ok.groupby("cell").agg(model=("model", "first"), task=("task", "first"), ctx=("ctx", "first"),
                                      device=("device", "first"), wall=("wall_time_s", "max"), n=("n", "max")).dropna()
    found: dict[tuple[str, str, str], list[tuple[float, str]]] = {}
    for cell in per_cell[per_cell["n"] > 0].itertuples():
        model, dry = str(cell.model).removesuffix(DRY_RUN_SUFFIX), str(cell.model).endswith(DRY_RUN_SUFFIX)
        device = f"{cell.device}, random-weight dry run" if dry else str(cell.device)
        found.setdefault((model, str(cell.task), str(cell.ctx)), []).append((cell.wall / cell.n, device))
    return found


def task_examples(task_cfg) -> int | None:
    """Examples one cell of this task runs, or None when it depends on data not known here."""
    samples = int(task_cfg.get("samples", 0) or 0)
    if task_cfg.name == "fidelity":
        return 1
    if task_cfg.name == "ruler_niah":
        return samples * len(task_cfg.get("variants") or [])
    return samples or DATASET_SIZES.get(str(task_cfg.name))


def memory_gb(model: str, tokens: int, batch: int) -> float | None:
    """bf16 weights + a BF16 KV cache of `tokens` per sequence for `batch` sequences, in GB (1e9 bytes)."""
    if model not in MODEL_FACTS:
        return None
    params, layers, kv_heads, head_dim, _ = MODEL_FACTS[model]
    kv_bytes = 2 * layers * kv_heads * head_dim * tokens * batch * 2
    return (params * 1e9 * 2 + kv_bytes) / 1e9


def cell_groups(cells: list[dict], cell_config, measured: dict, store: str) -> list[CellGroup]:
    """One CellGroup per (model, task, ctx); `cell_config(job)` composes the config of a job's overrides."""
    counts = Counter((c["model"], c["task"], c["ctx"]) for c in cells)
    first = {}
    for c in cells:
        first.setdefault((c["model"], c["task"], c["ctx"]), c)
    groups = []
    for key, count in counts.items():
        cfg = cell_config(first[key]["job"])
        times = measured.get(key, [])
        devices = ", ".join(sorted({device for _, device in times}))
        source = (f"measured: median of {len(times)} cell(s) in {store} on {devices}" if times
                  else "unknown (no measured cell)")
        groups.append(CellGroup(*key, count, int(cfg.model.get("gpus", 1) or 1), task_examples(cfg.task),
                                statistics.median(t for t, _ in times) if times else None, source,
                                memory_gb(key[0], int(cfg.ctx.tokens), int(cfg.task.get("batch_size", 1) or 1))))
    return groups


def _fmt(value: float | None, spec: str) -> str:
    return "unknown" if value is None or math.isnan(value) else format(value, spec)


def plan_text(cells: list[dict], groups: list[CellGroup]) -> str:
    """The printed plan: the grid's size by axis, one line per (model, task, ctx), and the known total."""
    sizes = " x ".join(f"{a} {len({c[a] for c in cells})}" for a in AXES)
    lines = [f"sweep plan: {len(cells)} cells ({sizes})",
             f"{'model':<20} {'task':<14} {'ctx':<5} {'cells':>5} {'examples':>8} {'s/example':>10} {'GPU-h':>8} "
             f"{'GB/cell':>8}  time source"]
    for g in groups:
        lines.append(f"{g.model:<20} {g.task:<14} {g.ctx:<5} {g.cells:>5} {_fmt(g.examples, 'd'):>8} "
                     f"{_fmt(g.seconds_per_example, '.2f'):>10} {_fmt(g.gpu_hours, '.2f'):>8} "
                     f"{_fmt(g.memory_gb, '.1f'):>8}  {g.time_source}")
    known = [g for g in groups if g.gpu_hours is not None]
    unknown = sum(g.cells for g in groups) - sum(g.cells for g in known)
    lines.append(f"estimated: {sum(g.gpu_hours for g in known):.2f} GPU-hours for {len(cells) - unknown} cells "
                 f"with a measured time; {unknown} cells unknown. GB/cell = bf16 weights + BF16 KV cache at ctx x "
                 f"task.batch_size (model cards; activations not counted).")
    return "\n".join(lines)


def sweep_plan(config) -> str:
    """The plan of a multirun of `config` (composed with its hydra node, inside an initialized Hydra)."""
    from hydra.core.global_hydra import GlobalHydra
    from report.store import load_rows
    loader = GlobalHydra.instance().config_loader()
    cells = grid_axes(config)
    store = Path(str(config.results_dir))
    store = store if store.is_absolute() else REPO / store
    stores = [store, REPO / "results" / "dryrun"]          # a dry run times a model's shapes as well as real weights
    rows = pd.concat([load_rows(path) for path in stores if (path / "rows").is_dir()] or [pd.DataFrame()])

    def cell_config(job: list[str]):
        return loader.load_sweep_config(config, list(job))

    return plan_text(cells, cell_groups(cells, cell_config, measured_seconds(rows), str(config.results_dir)))


class SweepPlan(Callback):
    """Before a multirun starts: print its plan (a failure to plan is one line, never a stopped sweep)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        try:
            print(sweep_plan(config), flush=True)
        except Exception as err:  # noqa: BLE001 - a plan is advice; the sweep runs without it
            print(f"sweep plan unavailable: {type(err).__name__}: {err}", flush=True)
