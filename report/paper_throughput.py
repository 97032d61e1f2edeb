"""The paper's throughput figure (P Fig. 6, METHOD_OSCAR.md §11.4) beside our scripts/bench_throughput.py runs.

    table = throughput_table(Path("results/bench"))      # Table("paper_throughput")

Ours come from each results/bench/*.json that bench_throughput.py wrote (a payload with "model", "rows" and
"same_budget"; `--profile` runs are left out). In one run, for each BF16 engine that ran beside OSCAR:
  BS=b         BF16's ms per step over OSCAR's, both at batch b and the run's longest context;
  same budget  OSCAR's tokens/s at the largest batch that fits the run's memory budget over BF16's at its own.
Both from the mean step over whole demotion pages where the run has it (`step_measure`), else the median step; the
row says which.
The paper's BS=8 and BS=32 are job-level throughputs under one memory budget (BF16 does not fit batch 8 at 100K
on one H100), which is what our "same budget" column measures at the largest batches; its BS=1 is a decode
speedup against SGLang's BF16. The BF16 engines: `bf16+graph` (the harness's frozen cache, kernel and CUDA
graph: the engine OSCAR's rows run on), `bf16+graph+compile` (the same with compile_step, against OSCAR's compiled
row) and transformers' `bf16_static` / `bf16` (stock, eager). The runs use
random weights with the public configs' shapes (speed does not depend on the values).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from report.tables import MISSING, MISSING_NOTE, Block, Table

MODELS = {"qwen3_4b": "qwen3_4b_thinking", "qwen3_8b": "qwen3_8b"}     # bench config -> paper model (same shapes)
PAPER_LABELS = {"qwen3_4b_thinking": "Qwen3-4B-Thinking-2507 (bench: qwen3_4b shapes)", "qwen3_8b": "Qwen3-8B"}
OSCAR_ROWS = ("oscar:model+graph", "oscar+graph")
COMPILED = "+compile"     # a compiled step (compile_step) is compared with the compiled BF16 step only
BASELINES = {"bf16+graph+compile": "BF16 on the same engine, compiled (bf16+graph+compile)",
             "bf16+graph": "BF16 on the same engine (bf16+graph)", "bf16_static": "transformers StaticCache",
             "bf16": "transformers DynamicCache"}
BATCHES = (1, 8, 32)
HEADER = ["Row", *(f"BS={b}" for b in BATCHES), "Same budget"]


def bench_payloads(bench_dir: Path) -> list[tuple[str, dict]]:
    """(file name, payload) of every bench_throughput.py JSON in `bench_dir` (not profile runs)."""
    found = []
    for path in sorted(Path(bench_dir).glob("*.json")):
        payload = json.loads(path.read_text())
        if isinstance(payload, dict) and payload.get("model") in MODELS and payload.get("rows") \
                and "--profile" not in payload.get("argv", []):
            found.append((path.name, payload))
    return found


def step_measure(payload: dict) -> str:
    """"mean" for a run whose rows carry the mean step over whole demotion pages (bench_throughput since b4898b4,
    whose tokens/s come from it too), else "median" (the steady step: it skips the step in page_tokens that demotes)."""
    return "mean" if any("ms_per_step_mean" in r for r in payload["rows"]) else "median"


def _ms(rows: list[dict], quantizer: str, batch: int, ctx: int, measure: str) -> float | None:
    key = "ms_per_step_mean" if measure == "mean" else "ms_per_step"
    return next((r[key] for r in rows if r["quantizer"] == quantizer and r["batch"] == batch
                 and r["ctx"] == ctx and r.get(key)), None)


def at_budget_batch(row: dict) -> bool:
    """Whether a same-budget row ran at the largest batch its budget holds (a run with --same-budget-cap holds rows
    below it: their ratio would be a smaller batch's speedup, not a same-memory throughput)."""
    return row["batch"] >= row.get("max_batch_in_budget", row["batch"])


def _budget_tps(payload: dict, quantizer: str) -> float | None:
    """tokens/s of `quantizer`'s same-budget row, None where it ran below the batch that fills the budget."""
    return next((r["tokens_per_s"] for r in payload.get("same_budget", [])
                 if r["quantizer"] == quantizer and r.get("tokens_per_s") and at_budget_batch(r)), None)


def _ratio(numerator: float | None, denominator: float | None) -> str:
    return MISSING if not numerator or not denominator else f"{numerator / denominator:.2f}×"


def our_rows(name: str, payload: dict) -> list[list[str]]:
    """One row per BF16 engine that ran beside OSCAR in this payload."""
    rows, ctx = payload["rows"], max(r["ctx"] for r in payload["rows"])
    present, measure = {r["quantizer"] for r in rows}, step_measure(payload)
    built = []
    for base, label in BASELINES.items():
        suffix = COMPILED if base.endswith(COMPILED) else ""
        oscar = next((q + suffix for q in OSCAR_ROWS if q + suffix in present), None)
        if base not in present or oscar is None:
            continue
        cells = [_ratio(_ms(rows, base, b, ctx, measure), _ms(rows, oscar, b, ctx, measure)) for b in BATCHES]
        budget = _ratio(_budget_tps(payload, oscar), _budget_tps(payload, base))
        built.append([f"ours, {oscar} vs {label} ({name}, {gpu_name(payload)}, {payload.get('date', '?')}, "
                      f"ctx {ctx}, {measure} step)", *cells, budget])
    return built


def gpu_name(payload: dict) -> str:
    """The GPU a run measured on, as its payload names it without the vendor ("H100 80GB HBM3", "2 x H200");
    "GPU not recorded" for runs that predate the field. Runs on different GPUs are not comparable (their copy
    bandwidths differ), so every row names its own."""
    device = payload.get("device")
    return device.replace("NVIDIA ", "") if device else "GPU not recorded"


def paper_row(paper: pd.DataFrame, model: str) -> list[str]:
    entries = paper[(paper["task"] == "throughput") & (paper["model"] == model) & (paper["method"] == "oscar")]
    values = {row.metric: row.value for row in entries.itertuples()}
    return ["paper, OSCAR vs BF16 (SGLang)", *(f"{values[f'speedup_bs{b}']:.2f}×" if f"speedup_bs{b}" in values
                                               else MISSING for b in BATCHES), MISSING]


def throughput_table(bench_dir: Path, paper: pd.DataFrame) -> Table:
    """Table "paper_throughput": per paper model, the paper's speedups and ours from each benchmark run."""
    payloads = bench_payloads(bench_dir)
    blocks = []
    for bench_model, model in MODELS.items():
        ours = [row for name, payload in payloads if payload["model"] == bench_model
                for row in our_rows(name, payload)]
        blocks.append(Block(PAPER_LABELS[model], HEADER, [paper_row(paper, model), *ours]))
    notes = ["Paper values: results/paper/oscar_paper.yaml (P Fig. 6, METHOD_OSCAR.md §11.4; H100, 100K context). "
             "Ours: python scripts/bench_throughput.py (commands in results/bench/bench_throughput.md and the .md beside "
             "each JSON), on the GPU each row names (rows of different GPUs do not compare: their memory bandwidths "
             "differ), random weights with the model's shapes, the context each row names.",
             "BS=b: BF16's ms per decode step over OSCAR's at batch b in the same run. Same budget: tokens/s of each "
             "at the largest batch that fits the run's memory budget (OSCAR's over BF16's); the paper's BS=8 and "
             "BS=32 are such job-level throughputs at those batches.",
             "Each row says its step: 'mean step' is the mean over whole demotion pages (what a generated token costs, "
             "the one step in 8 that demotes a page included; tokens/s come from it too), 'median step' the steady "
             "step of runs from before the mean was recorded (it skips the demoting step, so those ratios are "
             "higher than sustained ones).",
             MISSING_NOTE.replace("no status=ok row for this cell", "no such row in a benchmark run")]
    return Table("paper_throughput", "Paper throughput (P Fig. 6): speedup of OSCAR over BF16", blocks, notes)
