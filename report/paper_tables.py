"""The paper's tables in its layout, with the paper's value beside ours and the difference (ours - paper).

    from report.paper_tables import paper_tables
    tables = paper_tables(load_rows("results"))                    # [Table("paper_main"), ...]
    tables = paper_tables(rows, dry_runs=True)                      # also the random-weight dry runs, marked
    table = offline_ruler_table(rows, load_paper())                 # the main table's methods on the offline models

The paper's numbers come from results/paper/oscar_paper.yaml (each with its source in METHOD_OSCAR.md §11). Per
method a block has three rows: "paper", "ours" (mean±std over seeds, report.tables.Summary / format_stat) and
"ours - paper" (difference of the means). A cell not run is MISSING ("–"). Random-weight dry runs (a model name
ending in "@random", or `run.weights == "random"`) are left out unless `dry_runs`; then they get a row of their
own, every value marked DRY_MARK, and are never compared with the paper.

`offline_ruler_table` is the paper layout on real rows of models the paper did not run (Gemma 3 270M, SmolLM2):
RULER-NIAH sampled as the paper samples, mean±std over seeds with a t interval and the examples behind it. It has
no paper row and no difference: the paper's RULER numbers (another model and length) are quoted in a note only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from scipy import stats as scipy_stats

from report.tables import (BPE_METRIC, DRY_RUN_SUFFIX, MISSING, MISSING_NOTE, REFERENCE, Block, Stat, Summary,
                           Table, drop_cell, dry_run_mask, format_stat, mean_or_none, quantizer_label)

PAPER_FILE = Path(__file__).resolve().parent.parent / "results" / "paper" / "oscar_paper.yaml"
DRY_MARK = "‡"
DRY_NOTE = (f"{DRY_MARK} = random-weight dry run (model.source=random, the paper model's shapes): checks the path, "
            "speed and memory; not a result, never compared with the paper.")
PAPER_TASKS = {"gpqa_diamond": "GPQA", "humaneval": "HumanE", "livecodebench": "LCB v6", "aime25": "AIME25",
               "math500": "MATH500"}
MAIN_METHODS = ("bf16", "saw_int4", "turboquant_k3v3", "quarot_int2", "naive_int2", "oscar")
MAIN_MODELS = ("qwen3_4b_thinking", "qwen3_8b", "qwen3_32b", "glm47_fp8")
NOT_RUNNABLE = {"glm47_fp8": "GLM-4.7-FP8 is not run: its architecture (glm4_moe) is refused by the KV seam.",
                "kivi2_star": "KIVI-KV2* and Kitty are copied by the paper from the Kitty paper; the harness runs "
                              "neither (its kivi2 is KIVI-2 with groups of 32: 3.0 bits, not the table's 2.25)."}
RUN_CTX = "32k"
OFFLINE_MODELS = ("gemma3_270m", "smollm2_135m")     # real weights on a CPU or one GPU (configs/model)
OFFLINE_CTX = "4k"
SCORE_RANGE = (0.0, 100.0)


@dataclass(frozen=True)
class Column:
    """One value column: our (task, metric) at `ctx`, the paper's `metric` at `paper_ctx` (default: ctx)."""
    label: str
    task: str
    metric: str
    ctx: str
    paper_ctx: str | None = None


def load_paper(path: Path = PAPER_FILE) -> pd.DataFrame:
    """The paper's numbers, one row per entry of the YAML file."""
    return pd.DataFrame(yaml.safe_load(Path(path).read_text())["entries"])


def split_dry_runs(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(real rows, dry-run rows with DRY_RUN_SUFFIX taken off their model names)."""
    mask = dry_run_mask(rows)
    dry = rows[mask].copy()
    dry["model"] = dry["model"].astype(str).str.removesuffix(DRY_RUN_SUFFIX)
    return rows[~mask], dry


class PaperLookup:
    """The paper's value (and ±) of (model, method, metric, ctx)."""

    def __init__(self, paper: pd.DataFrame):
        self.entries = {(e.model, e.method, e.metric, str(e.ctx)): e for e in paper.itertuples()}

    def get(self, model: str, method: str, metric: str, ctx: str):
        return self.entries.get((model, method, metric, ctx))

    def text(self, model: str, method: str, metric: str, ctx: str) -> str:
        entry = self.get(model, method, metric, ctx)
        if entry is None:
            return MISSING
        std = entry.std if isinstance(entry.std, (int, float)) and entry.std == entry.std else None
        value = float(entry.value)
        shown = f"{value:.2f}" if round(value, 2) == value else repr(value)      # 71.864 as printed
        shown = f"{value:+.2f}" if metric == "drop" else shown                     # +0.27 as printed
        return shown + (f"±{std:.2f}" if std is not None else "")


def five_task_mean(summary: Summary, model: str, method: str, ctx: str) -> float | None:
    """Unweighted mean of the five paper tasks' means (None if one is missing), as the paper's "Mean"."""
    stats = [summary.get(model, method, task, ctx, f"{task}_pass1") for task in PAPER_TASKS]
    return mean_or_none([s.mean if s else None for s in stats])


def our_stat(summary: Summary | None, model: str, method: str, column: Column) -> Stat | None:
    """Our value of a column: a seed-averaged metric, the BPE, or the paper's Mean / Drop over the five tasks."""
    if summary is None:
        return None
    if column.task == "mean":
        mean = five_task_mean(summary, model, method, column.ctx)
        ref = five_task_mean(summary, model, "bf16", column.ctx) if column.metric == "drop" else 0.0
        return None if mean is None or ref is None else Stat(mean - ref, math.nan, 1)
    if column.metric == BPE_METRIC:
        return summary.bpe(model, method, column.ctx, set(PAPER_TASKS) | {column.task})
    return summary.get(model, method, column.task, column.ctx, column.metric)


def method_rows(paper: PaperLookup, summary: Summary | None, dry: Summary | None, model: str, method: str,
                columns: list[Column]) -> list[list[str]]:
    """The paper / ours / ours - paper rows of one method (and its dry-run row when `dry` has one)."""
    label = paper_label(paper, model, method)
    ours = [our_stat(summary, model, method, c) for c in columns]
    papers = [paper.get(model, method, c.metric, c.paper_ctx or c.ctx) for c in columns]
    rows = [[label, "paper", *(paper.text(model, method, c.metric, c.paper_ctx or c.ctx) for c in columns)],
            [label, "ours", *(format_stat(s) for s in ours)],
            [label, "ours - paper", *(difference(s, p, c) for s, p, c in zip(ours, papers, columns))]]
    dry_stats = [our_stat(dry, model, method, c) for c in columns]
    if any(s is not None for s in dry_stats):
        rows.append([label, f"dry run {DRY_MARK}", *(dry_cell(s) for s in dry_stats)])
    return rows


def paper_label(paper: PaperLookup, model: str, method: str) -> str:
    labels = {e.label for (m, q, _, _), e in paper.entries.items() if (m, q) == (model, method)}
    return sorted(labels)[0] if len(labels) == 1 else quantizer_label(method)


def difference(ours: Stat | None, paper_entry, column: Column) -> str:
    """ours - paper of the means; blank for BPE (counted at other contexts), MISSING when either is absent."""
    if column.metric == BPE_METRIC:
        return ""
    if ours is None or paper_entry is None:
        return MISSING
    return f"{ours.mean - float(paper_entry.value):+.2f}"


def dry_cell(stat: Stat | None) -> str:
    return MISSING if stat is None else format_stat(stat) + DRY_MARK


def summaries(rows: pd.DataFrame, dry_runs: bool) -> tuple[Summary | None, Summary | None]:
    """(Summary of the real rows, Summary of the dry runs when asked for and present)."""
    real, dry = split_dry_runs(rows)
    return (Summary(real) if len(real) else None), (Summary(dry, dry_runs=True) if dry_runs and len(dry) else None)


def paper_table(name: str, title: str, section: str, blocks: dict[str, list[str]], columns: list[Column],
                paper: pd.DataFrame, rows: pd.DataFrame, dry_runs: bool, notes: list[str]) -> Table:
    """A table with one block per model of `blocks` ({model: methods}), three rows per method; the paper's
    values are the entries whose source names `section` (e.g. "§11.1")."""
    lookup = PaperLookup(paper[paper["source"].str.contains(section, regex=False)])
    summary, dry = summaries(rows, dry_runs)
    header = ["Method", "Row", *(c.label for c in columns)]
    built = [Block(model, header, [row for method in methods
                                   for row in method_rows(lookup, summary, dry, model, method, columns)])
             for model, methods in blocks.items()]
    notes = notes + ["ours = mean±std over seeds (one seed: the mean); ours - paper = difference of the means.",
                     MISSING_NOTE] + ([DRY_NOTE] if dry is not None else [])
    return Table(name, title, built, notes)


def main_columns() -> list[Column]:
    return [Column("BPE", "all", BPE_METRIC, RUN_CTX, "128k"),
            *(Column(label, task, f"{task}_pass1", RUN_CTX) for task, label in PAPER_TASKS.items()),
            Column("Mean", "mean", "mean", RUN_CTX), Column("Drop", "mean", "drop", RUN_CTX)]


def paper_tables(rows: pd.DataFrame, dry_runs: bool = False, paper_file: Path = PAPER_FILE) -> list[Table]:
    """The paper's main table, AIME25 INT2 table, RULER-NIAH and ablation, each beside our rows, and the paper
    layout on the offline models' real rows (`offline_ruler_table`)."""
    paper = load_paper(paper_file)
    source = "Paper values: results/paper/oscar_paper.yaml, transcribed from METHOD_OSCAR.md"
    aime_methods = ["bf16", "kivi2", "kivi2_star", "kitty", "oscar"]
    ablation = ["bf16", "oscar", "oscar_tensor", "oscar_h", "oscar_none", "oscar_u", "oscar_center",
                "oscar_kchan"]
    return [
        paper_table("paper_main", "Paper main table (P Table 2)", "§11.1",
                    {m: list(MAIN_METHODS) for m in MAIN_MODELS},
                    main_columns(), paper, rows, dry_runs,
                    [f"{source} §11.1. Ours at ctx {RUN_CTX} (python run.py -m experiment=paper_main). BPE: the "
                     f"paper's at 128K, ours at {RUN_CTX}. Mean = unweighted mean of the five tasks; Drop = Mean - "
                     "BF16 Mean.", NOT_RUNNABLE["glm47_fp8"]]),
        paper_table("paper_aime_int2", "Paper AIME25 INT2 comparison", "§11.2",
                    {m: aime_methods for m in ("qwen3_8b", "qwen3_32b")},
                    [Column("BPE", "all", BPE_METRIC, RUN_CTX), Column("AIME25", "aime25", "aime25_pass1", RUN_CTX)],
                    paper, rows, dry_runs,
                    [f"{source} §11.2. Ours: python run.py -m experiment=paper_aime_int2.",
                     NOT_RUNNABLE["kivi2_star"]]),
        paper_table("paper_ruler", "Paper RULER-NIAH", "§11.3",
                    {m: ["bf16", "quarot_int2", "oscar"] for m in ("qwen3_8b", "qwen3_32b")},
                    [Column(c, "ruler_niah", "ruler_niah", c) for c in ("16k", "32k", "64k", "128k")],
                    paper, rows, dry_runs,
                    [f"{source} §11.3: only Qwen3-8B at 128K is known. Ours: python run.py -m experiment=paper_ruler "
                     "(eight needle variants)."]),
        paper_table("paper_ablation", "Paper OSCAR ablation (Qwen3-8B)", "§11.7", {"qwen3_8b": ablation},
                    [Column("Mean", "mean", "mean", RUN_CTX)], paper, rows, dry_runs,
                    [f"{source} §11.7 (3 seeds). Ours: python run.py -m experiment=paper_ablation (its own store, "
                     "results/paper_ablation). oscar_u, oscar_center and oscar_kchan are beyond the paper."]),
        offline_ruler_table(rows, paper),
    ]


def sampled(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows whose task sampled (config task.sampling.do_sample), as the paper decodes; greedy rows left out."""
    def samples(config) -> bool:
        task = config.get("task") if isinstance(config, dict) else None
        return bool(((task or {}).get("sampling") or {}).get("do_sample"))
    return rows[rows["config"].map(samples)] if "config" in rows and len(rows) else rows.iloc[0:0]


def seed_interval(stat: Stat | None) -> tuple[float, float] | None:
    """95% interval of a cell's mean: Student's t over the seeds' means (several seeds), clipped to the score range,
    else the lone seed's bootstrap interval over its examples (None when its row has none)."""
    if stat is None or stat.n < 2 or math.isnan(stat.std):
        return None if stat is None else stat.ci95
    half = float(scipy_stats.t.ppf(0.975, stat.n - 1)) * stat.std / math.sqrt(stat.n)
    return max(SCORE_RANGE[0], stat.mean - half), min(SCORE_RANGE[1], stat.mean + half)


def settings_text(rows: pd.DataFrame) -> str:
    """The decoding and sample settings of `rows` (RULER cells), each distinct one once: what the table averages."""
    found = []
    for config in rows["config"]:
        task, sampling = config["task"], config["task"]["sampling"]
        text = (f"temperature {sampling.get('temperature', 1.0)}, top-p {sampling.get('top_p', 1.0)}, top-k "
                f"{sampling.get('top_k', 0)}; {task['samples']} samples x {len(task['variants'])} variants per seed, "
                f"{task['max_new_tokens']} new tokens")
        if text not in found:
            found.append(text)
    return " / ".join(found)


def offline_ruler_table(rows: pd.DataFrame, paper: pd.DataFrame) -> Table:
    """The main table's methods on the offline models' real rows, RULER-NIAH sampled as the paper samples.

    Per method: BPE, the mean±std over seeds, its 95% interval (`seed_interval`), the seeds, n = examples over
    every seed and Drop = mean - BF16 mean. Only sampled rows count (`sampled`); dry runs never do."""
    real, _ = split_dry_runs(rows)
    real = sampled(real[real["model"].isin(OFFLINE_MODELS) & (real["ctx"].astype(str) == OFFLINE_CTX)]
                   if len(real) else real)
    summary = Summary(real) if len(real) else None
    header = ["Method", "BPE", f"RULER-NIAH {OFFLINE_CTX}", "95% CI", "seeds", "n", "Drop"]
    blocks = []
    for model in OFFLINE_MODELS:
        def stat(method: str) -> Stat | None:
            return summary.get(model, method, "ruler_niah", OFFLINE_CTX, "ruler_niah") if summary else None
        reference = stat(REFERENCE)
        lines = []
        for method in MAIN_METHODS:
            score, interval = stat(method), seed_interval(stat(method))
            bpe = summary.bpe(model, method, OFFLINE_CTX, {"ruler_niah"}) if summary else None
            lines.append([quantizer_label(method), format_stat(bpe), format_stat(score),
                          MISSING if interval is None else f"[{interval[0]:.1f}, {interval[1]:.1f}]",
                          MISSING if score is None else str(score.n),
                          MISSING if score is None or score.examples is None else str(score.examples),
                          MISSING if score is None else
                          drop_cell(method, score.mean, None if reference is None else reference.mean)])
        blocks.append(Block(model, header, lines))
    ruler = paper[paper["source"].str.contains("§11.3", regex=False)]
    quoted = ", ".join(f"{e.label} {float(e.value):.2f}" for e in ruler.itertuples())
    where = ", ".join(sorted({f"{e.model} at {e.ctx}" for e in ruler.itertuples()}))
    notes = [f"Real weights of the offline models ({', '.join(OFFLINE_MODELS)}), not the paper's: no paper value "
             f"stands beside them and no difference is claimed. The paper's RULER-NIAH numbers, another model and "
             f"length, for reference only ({where}; results/paper/oscar_paper.yaml, METHOD_OSCAR.md §11.3): {quoted}.",
             "RULER-NIAH = mean over the needle variants (0..100) of the rows that sampled, as the paper's client "
             "does (greedy rows, e.g. the headline's, are left out): "
             + (settings_text(real) if len(real) else "none yet") + ". Ours: python run.py -m "
             "experiment=paper_ruler_offline (store results/paper_ruler_offline).",
             "mean±std over seeds (a seed draws its own haystacks, needles and samples); 95% CI = Student's t "
             "interval of the mean over the seeds, clipped to 0..100 (one seed: its bootstrap interval over the "
             "examples); n = examples over all seeds; Drop = mean - BF16 mean. Random-weight dry runs are never "
             "shown here.", MISSING_NOTE]
    return Table("paper_ruler_offline", f"Paper layout on real rows: RULER-NIAH {OFFLINE_CTX}, offline models",
                 blocks, notes)

