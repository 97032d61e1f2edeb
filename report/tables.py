"""Paper-style tables (Markdown and LaTeX) as pure functions of the results store.

    from report.store import load_rows
    from report.tables import all_tables, to_markdown, to_latex
    tables = all_tables(load_rows("results"))      # [Table(name="main", ...), ...]
    print(to_markdown(tables[0]))

`scripts/make_tables.py` writes every table into results/tables/. Only `status == "ok"` rows count;
seeds are averaged (mean, and ± sample std when there is more than one seed). A one-seed cell of a scored
task shows its 95% bootstrap interval and example count, "67.27 [58.1, 75.9] n=100", from the row
(harness/intervals.py); a row from before intervals were recorded is marked NO_INTERVAL. A cell with no ok
row prints as MISSING ("–", footnoted), never as 0.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

QUANTIZER_ORDER = ("bf16", "int4", "saw_int4", "quarot_int4", "kivi4", "turboquant_k3v3", "kivi2", "quarot_int2",
                   "naive_int2", "oscar")
QUANTIZER_LABELS = {"bf16": "BF16", "int4": "INT4", "saw_int4": "Saw-INT4", "quarot_int4": "QuaRot-INT4",
                    "kivi4": "KIVI-4", "turboquant_k3v3": "TurboQuant K3V3", "kivi2": "KIVI-2",
                    "quarot_int2": "QuaRot-INT2", "naive_int2": "Naive INT2", "oscar": "OSCAR"}
# Accuracy tasks of the main table, in column order: task -> (headline metric, column label). Scores are 0..100.
HEADLINE_METRICS = {"ruler_niah": ("ruler_niah", "RULER-NIAH"), "longbench": ("longbench", "LongBench"),
                    "aime25": ("aime25_pass1", "AIME25")}
FIDELITY_METRICS = {"k_mse": "K MSE", "v_mse": "V MSE", "logit_mse": "logit MSE", "attn_kl": "attn KL",
                    "attn_output_rel_err": "attn-out rel. err", "attn_output_mse": "attn-out MSE",
                    "propagated_hidden_mse": "hidden MSE (propagated)"}
BPE_METRIC = "bits_per_element"
REFERENCE = "bf16"
MISSING = "–"
MISSING_NOTE = f"{MISSING} = not run (no status=ok row for this cell)."
NO_INTERVAL = "†"
SEED_NOTE = ("Values are means over seeds; ± is the sample std when there is more than one seed. One seed: "
             "[95% bootstrap interval over the examples] and n = examples; "
             f"{NO_INTERVAL} = the row predates recorded intervals. Call an ordering only where intervals separate.")
CELL_KEYS = ("model", "quantizer", "task", "ctx")
DRY_RUN_SUFFIX = "@random"     # harness.pipeline.cell_definition names a random-weight model's rows <model>@random
DRY_RUN_NOTE = ("Models named <model>@random are dry runs with random weights of the model's shape (model.source=random): "
                "their scores mean nothing; only their speed, memory and placement do.")
LATEX_ESCAPES = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "_": r"\_", "%": r"\%", "&": r"\&",
                 "#": r"\#", "$": r"\$", "^": r"\^{}", "~": r"\~{}"}


@dataclass(frozen=True)
class Stat:
    """One table cell's numbers: mean over seeds, sample std (nan for one seed) and the seed count; for a scored
    task, its examples summed over the seeds, and for one seed its 95% interval (None when the rows have none)."""
    mean: float
    std: float
    n: int
    examples: int | None = None
    ci95: tuple[float, float] | None = None


@dataclass
class Block:
    """One rectangular table (e.g. one model's rows) with its own heading."""
    title: str
    columns: list[str]
    rows: list[list[str]]


@dataclass
class Table:
    """A named table: `name` is the file stem under results/tables/, notes become footnotes."""
    name: str
    title: str
    blocks: list[Block]
    notes: list[str] = field(default_factory=list)


def ctx_tokens(name: str) -> float:
    """Token count of a ctx name ("4k" -> 4096, "512" -> 512); unknown names sort last (inf)."""
    match = re.fullmatch(r"(\d+)([kK]?)", str(name))
    if not match:
        return math.inf
    return int(match.group(1)) * (1024 if match.group(2) else 1)


def quantizer_rank(name: str) -> tuple[int, str]:
    """Sort key: the canonical order first, unknown quantizers after it, alphabetically."""
    return (QUANTIZER_ORDER.index(name) if name in QUANTIZER_ORDER else len(QUANTIZER_ORDER), name)


def quantizer_label(name: str) -> str:
    return QUANTIZER_LABELS.get(name, name)


def dry_run_mask(rows: pd.DataFrame) -> pd.Series:
    """True for rows of random-weight dry runs (model named <model>@random, or `run` saying weights: random)."""
    named = rows["model"].astype(str).str.endswith(DRY_RUN_SUFFIX)
    if "run" not in rows:
        return named
    return named | rows["run"].map(lambda run: isinstance(run, dict) and run.get("weights") == "random")


class Summary:
    """Seed-averaged ok metrics, plus which cells exist at all (ok or not), looked up by name.

    Dry-run rows (random weights) are dropped unless `dry_runs`."""

    def __init__(self, rows: pd.DataFrame, dry_runs: bool = False):
        self.has_dry_runs = bool(dry_run_mask(rows).any()) if len(rows) else False
        if not dry_runs and self.has_dry_runs:
            rows = rows[~dry_run_mask(rows)]
        self.cells = {tuple(c) for c in rows[list(CELL_KEYS)].astype(str).drop_duplicates().itertuples(index=False)}
        self.stats = seed_stats(latest_ok_rows(rows))

    def get(self, model: str, quantizer: str, task: str, ctx: str, metric: str) -> Stat | None:
        return self.stats.get((model, quantizer, task, ctx, metric))

    def models(self, tasks) -> list[str]:
        return sorted({c[0] for c in self.cells if c[2] in tasks})

    def ctxs(self, model: str, tasks) -> list[str]:
        return sorted({c[3] for c in self.cells if c[0] == model and c[2] in tasks}, key=lambda c: (ctx_tokens(c), c))

    def quantizers(self, model: str, tasks, ctx: str | None = None) -> list[str]:
        found = {c[1] for c in self.cells if c[0] == model and c[2] in tasks and ctx in (None, c[3])}
        return sorted(found, key=quantizer_rank)

    def tasks(self) -> set[str]:
        return {c[2] for c in self.cells}

    def metrics(self, model: str, task: str) -> list[str]:
        return sorted({k[4] for k in self.stats if k[0] == model and k[2] == task})

    def bpe(self, model: str, quantizer: str, ctx: str, tasks) -> Stat | None:
        """Bits per element of a quantizer at a context, as recorded by `tasks` (fidelity quantizes every
        token, a generation task keeps the full-precision windows): the mean over those tasks."""
        means = [s.mean for (m, q, t, c, metric), s in self.stats.items()
                 if (m, q, c, metric) == (model, quantizer, ctx, BPE_METRIC) and t in tasks]
        return Stat(sum(means) / len(means), math.nan, 1) if means else None


HEADLINE_BEGIN = "<!-- headline-table:begin"
HEADLINE_END = "<!-- headline-table:end -->"


def latest_ok_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """status == "ok" rows with a numeric value; if a seed was recorded twice (a re-run with other
    options under the same names), only its latest row counts, so it is not averaged as two seeds."""
    ok = rows[rows["status"] == "ok"].copy()
    ok["value"] = pd.to_numeric(ok["value"], errors="coerce")
    ok = ok.dropna(subset=["value"])
    ok["timestamp"] = ok["timestamp"].astype(str) if "timestamp" in ok else ""
    for key in CELL_KEYS + ("metric",):
        ok[key] = ok[key].astype(str)
    ok = ok.sort_values("timestamp", kind="stable")
    return ok.drop_duplicates(subset=list(CELL_KEYS) + ["seed", "metric"], keep="last")


def seed_stats(ok: pd.DataFrame) -> dict[tuple, Stat]:
    """{(model, quantizer, task, ctx, metric): Stat} over seeds (with the interval of a lone seed's row, and the
    examples of every seed's rows)."""
    stats = {}
    for key, group in ok.groupby(list(CELL_KEYS) + ["metric"]):
        values = group["value"]
        if len(group) == 1:
            examples, interval = _row_interval(group.iloc[0])
        else:
            examples, interval = _seed_examples(group), None
        stats[key] = Stat(float(values.mean()), float(values.std()) if len(group) > 1 else math.nan, len(group),
                          examples, interval)
    return stats


def _seed_examples(group: pd.DataFrame) -> int | None:
    """Examples behind several seeds' rows of one metric (the sum of their n), or None if a row has none."""
    counts = pd.to_numeric(group["n"], errors="coerce") if "n" in group else pd.Series([math.nan])
    return None if counts.isna().any() else int(counts.sum())


def _row_interval(row) -> tuple[int | None, tuple[float, float] | None]:
    """(examples, (low, high)) recorded on a row, or (None, None)."""
    ci = row.get("ci95")
    if not isinstance(ci, (list, tuple)) or len(ci) != 2:
        return None, None
    return int(row["n"]), (float(ci[0]), float(ci[1]))


def format_stat(stat: Stat | None, digits: str = ".2f", interval: bool = False) -> str:
    """"67.27±1.80" for several seeds, "67.27" for one; with `interval` (scored tasks) a lone seed shows
    "67.27 [58.1, 75.9] n=100", or "67.27†" when its row has no interval; MISSING for none."""
    if stat is None:
        return MISSING
    if stat.n > 1 and not math.isnan(stat.std):
        return f"{stat.mean:{digits}}±{stat.std:{digits}}"
    if not interval:
        return f"{stat.mean:{digits}}"
    if stat.ci95 is None:
        return f"{stat.mean:{digits}}{NO_INTERVAL}"
    return f"{stat.mean:{digits}} [{stat.ci95[0]:.1f}, {stat.ci95[1]:.1f}] n={stat.examples}"


def mean_or_none(values: list[float | None]) -> float | None:
    """Unweighted mean, or None as soon as one value is missing (a partial mean is not comparable)."""
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def main_block(summary: Summary, model: str, tasks: list[str]) -> Block:
    """One model's rows: for each ctx, quantizers in canonical order with BPE, task scores, Mean, Drop."""
    columns = ["Ctx", "Method", "BPE", *(HEADLINE_METRICS[t][1] for t in tasks), "Mean", "Drop"]
    rows = []
    for ctx in summary.ctxs(model, tasks):
        ref_scores = [summary.get(model, REFERENCE, t, ctx, HEADLINE_METRICS[t][0]) for t in tasks]
        ref_mean = mean_or_none([s.mean if s else None for s in ref_scores])
        for quantizer in summary.quantizers(model, tasks, ctx):
            scores = [summary.get(model, quantizer, t, ctx, HEADLINE_METRICS[t][0]) for t in tasks]
            row_mean = mean_or_none([s.mean if s else None for s in scores])
            rows.append([ctx, quantizer_label(quantizer), format_stat(summary.bpe(model, quantizer, ctx, tasks)),
                         *(format_stat(s, interval=True) for s in scores), MISSING if row_mean is None else f"{row_mean:.2f}",
                         drop_cell(quantizer, row_mean, ref_mean)])
    return Block(model, columns, rows)


def drop_cell(quantizer: str, row_mean: float | None, ref_mean: float | None) -> str:
    if quantizer == REFERENCE:
        return "ref."
    if row_mean is None or ref_mean is None:
        return MISSING
    return f"{row_mean - ref_mean:+.2f}"


def main_table(summary: Summary) -> Table:
    """The paper's main table (METHOD_OSCAR §11.1): one block per model, accuracy tasks as columns."""
    tasks = [t for t in HEADLINE_METRICS if t in summary.tasks()]
    blocks = [main_block(summary, model, tasks) for model in summary.models(tasks)]
    notes = ["BPE = KV bits per element at the row's context. Scores are 0..100. "
             f"Mean = unweighted mean of the task columns; Drop = Mean - {quantizer_label(REFERENCE)} Mean "
             "(same model and context).", SEED_NOTE, MISSING_NOTE]
    return Table("main", "Main results", blocks, notes)


def ruler_by_ctx_table(summary: Summary) -> Table:
    """`ruler_niah` (mean over variants) per quantizer and context length, one block per model."""
    blocks = []
    for model in summary.models({"ruler_niah"}):
        ctxs = summary.ctxs(model, {"ruler_niah"})
        rows = [[quantizer_label(q), *(format_stat(summary.get(model, q, "ruler_niah", c, "ruler_niah"), interval=True)
                                       for c in ctxs)]
                for q in summary.quantizers(model, {"ruler_niah"})]
        blocks.append(Block(model, ["Method", *ctxs], rows))
    notes = ["RULER-NIAH score (0..100, mean over the needle variants run) by context length.", SEED_NOTE, MISSING_NOTE]
    return Table("ruler_niah_by_ctx", "RULER-NIAH by context length", blocks, notes)


def ruler_variants_table(summary: Summary) -> Table:
    """Per-variant RULER scores (niah_single_1, ...) per quantizer and context, one block per model."""
    blocks = []
    for model in summary.models({"ruler_niah"}):
        ctxs = summary.ctxs(model, {"ruler_niah"})
        variants = [m for m in summary.metrics(model, "ruler_niah") if m not in ("ruler_niah", BPE_METRIC)]
        rows = [[quantizer_label(q), v, *(format_stat(summary.get(model, q, "ruler_niah", c, v), interval=True)
                                          for c in ctxs)]
                for q in summary.quantizers(model, {"ruler_niah"}) for v in variants]
        blocks.append(Block(model, ["Method", "Variant", *ctxs], rows))
    notes = ["RULER needle variants (0..100) by context length.", SEED_NOTE, MISSING_NOTE]
    return Table("ruler_niah_variants", "RULER-NIAH per variant", blocks, notes)


def fidelity_table(summary: Summary) -> Table:
    """Mean-over-layers K/V reconstruction, attention and hidden-state errors, one block per model."""
    blocks = []
    for model in summary.models({"fidelity"}):
        rows = [[ctx, quantizer_label(q), format_stat(summary.bpe(model, q, ctx, {"fidelity"})),
                 *(format_stat(summary.get(model, q, "fidelity", ctx, m), ".3g") for m in FIDELITY_METRICS)]
                for ctx in summary.ctxs(model, {"fidelity"}) for q in summary.quantizers(model, {"fidelity"}, ctx)]
        blocks.append(Block(model, ["Ctx", "Method", "BPE", *FIDELITY_METRICS.values()], rows))
    notes = ["Mean over the full-attention layers measured, against full precision; lower is better. "
             "K/V MSE per element (in the rotated basis), logit MSE of the scaled causal logits q k^T, attn KL "
             "= KL(p_ref || p_quant) in nats per attention row, attn-out rel. err = ||o - o_ref|| / ||o_ref|| "
             "and attn-out MSE the squared error per element of the attention output after o_proj (that layer "
             "alone quantized), hidden MSE (propagated) = squared error per element of the hidden state after the "
             "layer when every layer's K/V is quantized. A cell recorded before a metric existed shows – for it "
             "(re-run it with force=true).",
             SEED_NOTE, MISSING_NOTE]
    return Table("fidelity", "KV, attention and hidden-state fidelity", blocks, notes)


def dirty_cells(rows: pd.DataFrame) -> list[str]:
    """Cells whose ok rows ran from a modified tree (git_sha ending in -dirty)."""
    if "git_sha" not in rows:
        return []
    ok = rows[rows["status"] == "ok"]
    return sorted(ok.loc[ok["git_sha"].astype(str).str.endswith("-dirty"), "cell"].astype(str).unique())


def check_clean(rows: pd.DataFrame, allow_dirty: bool = False) -> None:
    """Refuse, in one sentence, rows that ran from a modified tree unless `allow_dirty`."""
    cells = dirty_cells(rows)
    if cells and not allow_dirty:
        raise ValueError(f"{len(cells)} cells ran from a modified tree (git_sha ends in -dirty, e.g. cell {cells[0]}); "
                         f"re-run them from a clean commit, or pass --allow-dirty to build tables that say so.")


def all_tables(rows: pd.DataFrame, dry_runs: bool = False) -> list[Table]:
    """Every results table that the rows can fill (a table with no block is still returned, empty); dry runs
    (random weights) only with `dry_runs`, footnoted."""
    summary = Summary(rows, dry_runs)
    tables = [main_table(summary), ruler_by_ctx_table(summary), ruler_variants_table(summary),
              fidelity_table(summary)]
    if dry_runs and summary.has_dry_runs:
        for table in tables:
            table.notes.append(DRY_RUN_NOTE)
    dirty = dirty_cells(rows)
    if dirty:
        cells = rows[rows["status"] == "ok"]["cell"].nunique()
        for table in tables:
            table.notes.append(f"{len(dirty)} of {cells} cells in this store ran from a modified tree (git_sha "
                               "ends in -dirty); built with --allow-dirty.")
    return tables


def block_markdown(block: Block) -> list[str]:
    """One block as Markdown table lines (header, rule, rows)."""
    return (["| " + " | ".join(block.columns) + " |", "|" + "---|" * len(block.columns)]
            + ["| " + " | ".join(row) + " |" for row in block.rows])


def to_markdown(table: Table) -> str:
    """`# title`, one `## block` table each, then the footnotes."""
    lines = [f"# {table.title}", ""]
    if not table.blocks:
        lines += ["No status=ok rows for this table yet.", ""]
    for block in table.blocks:
        lines += [f"## {block.title}", "", *block_markdown(block), ""]
    lines += [f"{note}  " for note in table.notes]
    return "\n".join(lines).rstrip() + "\n"


def headline_markdown(rows: pd.DataFrame) -> str:
    """The README's headline table: the main table's first block (the first model), as Markdown lines."""
    blocks = main_table(Summary(rows)).blocks
    return "\n".join(block_markdown(blocks[0])) + "\n" if blocks else "No status=ok rows for the main table yet.\n"


def splice_headline(text: str, table: str) -> str:
    """`text` (the README) with the lines between its headline markers replaced by `table`."""
    lines = text.splitlines(keepends=True)
    begin = next((i for i, line in enumerate(lines) if line.startswith(HEADLINE_BEGIN)), None)
    end = next((i for i, line in enumerate(lines) if line.startswith(HEADLINE_END)), None)
    if begin is None or end is None or end < begin:
        raise ValueError(f"The README has no '{HEADLINE_BEGIN} ...' / '{HEADLINE_END}' marker pair.")
    return "".join(lines[:begin + 1]) + table + "".join(lines[end:])


def latex_cell(text: str) -> str:
    """Escape LaTeX specials; ± -> $\\pm$, † -> $^\\dagger$, ‡ -> $^\\ddagger$, a leading minus -> $-$, MISSING -> --."""
    if text == MISSING:
        return "--"
    text = re.sub(r"[\\{}_%&#$^~]", lambda m: LATEX_ESCAPES[m.group()], text)
    text = re.sub(r"^-(?=\d)", "$-$", text)
    return text.replace("±", r"$\pm$").replace(NO_INTERVAL, r"$^\dagger$").replace("‡", r"$^\ddagger$")


def to_latex(table: Table) -> str:
    """One booktabs `table` float per block (\\usepackage{booktabs}); notes as a small paragraph under each."""
    parts = [f"% {table.title}: generated by scripts/make_tables.py from the results store; do not edit."]
    notes = " ".join(latex_cell(n.replace(MISSING, "--")) for n in table.notes)
    for block in table.blocks:
        spec = "l" * sum(1 for c in block.columns if c in ("Ctx", "Method", "Variant"))
        spec += "r" * (len(block.columns) - len(spec))
        body = [" & ".join(latex_cell(c) for c in row) + r" \\" for row in block.rows]
        parts += [r"\begin{table}[t]", r"\centering\small", rf"\caption{{{latex_cell(table.title)}: {latex_cell(block.title)}}}",
                  rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
                  " & ".join(latex_cell(c) for c in block.columns) + r" \\", r"\midrule", *body, r"\bottomrule",
                  r"\end{tabular}", rf"\par\smallskip{{\footnotesize {notes}}}", r"\end{table}", ""]
    return "\n".join(parts)


def bench_markdown(bench_dir: Path) -> str | None:
    """Every results/bench/*.md, verbatim, under a heading naming its file; None when there is none."""
    files = sorted(Path(bench_dir).glob("*.md"))
    if not files:
        return None
    sections = [f"## {path.name}\n\n{path.read_text().strip()}\n" for path in files]
    return "# Kernel and throughput benchmarks\n\n" + "\n".join(sections)


def write_tables(rows: pd.DataFrame, bench_dir: Path, out_dir: Path, allow_dirty: bool = False,
                 dry_runs: bool = False) -> list[Path]:
    """Write <name>.md and <name>.tex for each table, each paper table (report/paper_tables.py) and the paper's
    throughput figure as a table (report/paper_throughput.py, from the benchmark JSONs), and bench.md when
    benchmarks exist; return the paths.

    Rows from a modified tree are refused unless `allow_dirty` (the tables then say how many cells). Random-weight
    dry runs are left out unless `dry_runs`; then they are footnoted, and marked "@random" in every table."""
    from report.paper_tables import load_paper, paper_tables   # they build on this module
    from report.engine_table import engine_markdown
    from report.paper_throughput import throughput_table
    check_clean(rows, allow_dirty)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    tables = all_tables(rows, dry_runs) + paper_tables(rows, dry_runs) + [throughput_table(bench_dir, load_paper())]
    for table in tables:
        for suffix, render in ((".md", to_markdown), (".tex", to_latex)):
            path = out_dir / f"{table.name}{suffix}"
            path.write_text(render(table))
            written.append(path)
    bench = bench_markdown(bench_dir)
    if bench is not None:
        (out_dir / "bench.md").write_text(bench)
        written.append(out_dir / "bench.md")
    engine = engine_markdown(rows)
    if engine is not None:
        (out_dir / "engine.md").write_text(engine)
        written.append(out_dir / "engine.md")
    return written
