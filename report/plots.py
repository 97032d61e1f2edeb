"""Figures (PNG + PDF, Agg) as pure functions of the results store and the benchmark JSON.

    from report.store import load_rows
    from report.plots import write_plots
    write_plots(load_rows("results"), Path("results/bench"), Path("results/plots"))

`scripts/make_plots.py` is the CLI. Every figure colours a quantizer with QUANTIZER_COLOURS, takes
only status=ok rows (seed means via report.tables.Summary; error bars: a lone seed's 95% interval, else
± the std over seeds) and puts its legend outside the axes. Each figure's data is written beside it as
<stem>.csv, which tests/test_committed_tables.py rebuilds from the committed rows.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from report.tables import (FIDELITY_METRICS, HEADLINE_METRICS, Stat, Summary, ctx_tokens, quantizer_label,
                          quantizer_rank)

# One colour per quantizer in every figure (Okabe-Ito based; INT2/INT4 siblings share a hue).
QUANTIZER_COLOURS = {"bf16": "#000000", "int4": "#56B4E9", "saw_int4": "#0072B2", "quarot_int4": "#7FCDB4",
                     "quarot_int2": "#009E73", "kivi4": "#F2C572", "kivi2": "#E69F00", "naive_int2": "#999999",
                     "oscar": "#D55E00", "turboquant_k3v3": "#8C6BB1"}
FALLBACK_COLOUR = "#CC79A7"
# Decode kernels in the benchmark JSON -> (quantizer whose colour they take, legend label). Every INT2 cache
# (OSCAR's included) decodes with the one INT2 kernel, drawn in OSCAR's colour.
BENCH_PROVIDERS = {"int2": ("oscar", "INT2 decode kernel"), "int4": ("int4", "INT4 decode kernel")}
BPE_TICKS = (2, 3, 4, 8, 16)
BATCH_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
FIDELITY_UNITS = {"k_mse": "K MSE (per element)", "v_mse": "V MSE (per element)", "logit_mse": "logit MSE",
                  "attn_kl": "attention KL (nats per row)", "attn_output_rel_err": "attn-output rel. error",
                  "attn_output_mse": "attn-output MSE (per element)",
                  "propagated_hidden_mse": "propagated hidden-state MSE (per element)"}
LAYER_METRIC = re.compile(r"(?P<metric>.+)/layer_(?P<layer>\d+)$")


def colour(quantizer: str) -> str:
    return QUANTIZER_COLOURS.get(quantizer, FALLBACK_COLOUR)


def bench_provider(name: str) -> tuple[str, str]:
    """(quantizer whose colour a benchmark provider takes, its legend label); unknown names stand for themselves."""
    return BENCH_PROVIDERS.get(name, (name, name))


def batch_markers(batches: list) -> dict:
    return {b: BATCH_MARKERS[i % len(BATCH_MARKERS)] for i, b in enumerate(batches)}


def new_figure(n_panels: int, ncols: int = 3, panel_size=(4.2, 3.2)) -> tuple[Figure, list]:
    """A constrained-layout Figure (Agg canvas) with n_panels axes on a grid; unused cells removed."""
    ncols = min(ncols, n_panels)
    nrows = math.ceil(n_panels / ncols)
    fig = Figure(figsize=(panel_size[0] * ncols + 2.2, panel_size[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n_panels:]:
        ax.remove()
    return fig, axes[:n_panels]


def save(fig: Figure, out_dir: Path, stem: str, data: list[dict]) -> list[Path]:
    """Write <stem>.png (150 dpi), <stem>.pdf and the points drawn as <stem>.csv; return the three paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.pdf"]
    for path in paths:
        fig.savefig(path, dpi=150)
    paths.append(out_dir / f"{stem}.csv")
    pd.DataFrame(data).to_csv(paths[-1], index=False, float_format="%.6g")
    return paths


def quantizer_legend(fig: Figure, quantizers, title: str = "KV quantizer") -> None:
    handles = [Line2D([], [], color=colour(q), marker="o", label=quantizer_label(q)) for q in quantizers]
    fig.legend(handles=handles, loc="outside right upper", title=title, frameon=False)


def ctx_axis(ax, ctxs: list[str]) -> None:
    """Log2 context-length axis ticked at the measured contexts."""
    ax.set_xscale("log", base=2)
    ax.set_xticks([ctx_tokens(c) for c in ctxs], labels=ctxs)
    ax.minorticks_off()
    ax.set_xlabel("context length (tokens)")


def error_bar(stat: Stat) -> tuple[float, float]:
    """(below, above) the mean: a lone seed's 95% interval, else ± the std over seeds, else none."""
    if stat.n == 1 and stat.ci95 is not None:
        return stat.mean - stat.ci95[0], stat.ci95[1] - stat.mean
    spread = 0.0 if stat.n < 2 or math.isnan(stat.std) else stat.std
    return spread, spread


def point(stat: Stat, **where) -> dict:
    """One drawn point as a CSV row: where it sits, its mean and error bar."""
    below, above = error_bar(stat)
    return {**where, "mean": stat.mean, "err_below": below, "err_above": above, "seeds": stat.n,
            "examples": stat.examples}


def yerr(stats: list[Stat]) -> list[list[float]]:
    """matplotlib's asymmetric [[below...], [above...]]."""
    bars = [error_bar(s) for s in stats]
    return [[b for b, _ in bars], [a for _, a in bars]]


def model_tasks(summary: Summary, model: str) -> list[str]:
    return [t for t in HEADLINE_METRICS if model in summary.models({t})]


def accuracy_vs_ctx(summary: Summary, out_dir: Path) -> list[Path]:
    """Per model: headline score vs context length, one line per quantizer, one panel per task."""
    paths = []
    for model in summary.models(HEADLINE_METRICS):
        tasks = model_tasks(summary, model)
        fig, axes = new_figure(len(tasks))
        drawn, data = set(), []
        for ax, task in zip(axes, tasks):
            metric, label = HEADLINE_METRICS[task]
            ctxs = [c for c in summary.ctxs(model, {task}) if math.isfinite(ctx_tokens(c))]
            for q in summary.quantizers(model, {task}):
                points = [(c, s) for c in ctxs if (s := summary.get(model, q, task, c, metric))]
                if points:
                    drawn.add(q)
                    data += [point(s, task=task, quantizer=q, ctx=c, ctx_tokens=ctx_tokens(c)) for c, s in points]
                    ax.errorbar([ctx_tokens(c) for c, _ in points], [s.mean for _, s in points],
                                yerr=yerr([s for _, s in points]), color=colour(q), marker="o", capsize=3)
            ctx_axis(ax, ctxs)
            ax.set(ylabel=f"{label} score (%)", ylim=(-3, 103), title=label)
            ax.grid(alpha=0.3)
        fig.suptitle(f"{model}: accuracy vs context length")
        quantizer_legend(fig, sorted(drawn, key=quantizer_rank))
        paths += save(fig, out_dir, f"accuracy_vs_ctx_{model}", data)
    return paths


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats with fewer-or-equal bits and a higher-or-equal score, by bits."""
    front, best = [], -math.inf
    for bits, score in sorted(points, key=lambda p: (p[0], -p[1])):
        if score > best:
            front.append((bits, score))
            best = score
    return front


def accuracy_vs_bpe(summary: Summary, out_dir: Path) -> list[Path]:
    """Per model: headline score vs KV bits per element, one panel per (task, ctx), Pareto front dashed."""
    paths = []
    for model in summary.models(HEADLINE_METRICS):
        panels = [(t, c) for t in model_tasks(summary, model) for c in summary.ctxs(model, {t})]
        fig, axes = new_figure(len(panels))
        drawn, data = set(), []
        for ax, (task, ctx) in zip(axes, panels):
            metric, label = HEADLINE_METRICS[task]
            points = []
            for q in summary.quantizers(model, {task}, ctx):
                score, bpe = summary.get(model, q, task, ctx, metric), summary.bpe(model, q, ctx, {task})
                if score and bpe:
                    drawn.add(q)
                    points.append((bpe.mean, score.mean))
                    data.append(point(score, task=task, ctx=ctx, quantizer=q, bits_per_element=bpe.mean))
                    ax.errorbar(bpe.mean, score.mean, yerr=yerr([score]), color=colour(q), marker="o",
                                markersize=7, capsize=3)
            if points:
                ax.plot(*zip(*pareto_front(points)), color="0.5", linestyle="--", linewidth=1, zorder=0)
            ax.set_xscale("log", base=2)
            ax.set_xticks(BPE_TICKS, labels=[str(t) for t in BPE_TICKS])
            ax.minorticks_off()
            ax.set(xlabel="KV bits per element (log scale)", ylabel=f"{label} score (%)", ylim=(-3, 103),
                   title=f"{label} @ {ctx}")
            ax.grid(alpha=0.3)
        fig.suptitle(f"{model}: accuracy vs KV bits (dashed: Pareto front)")
        quantizer_legend(fig, sorted(drawn, key=quantizer_rank))
        paths += save(fig, out_dir, f"accuracy_vs_bpe_{model}", data)
    return paths


def layer_series(summary: Summary, model: str, quantizer: str, ctx: str, metric: str) -> list[tuple[int, float]]:
    """[(layer, seed-mean value)] of `<metric>/layer_<l>` rows, by layer."""
    found = []
    for (m, q, task, c, name), stat in summary.stats.items():
        match = LAYER_METRIC.match(name)
        if (m, q, task, c) == (model, quantizer, "fidelity", ctx) and match and match["metric"] == metric:
            found.append((int(match["layer"]), stat.mean))
    return sorted(found)


def layer_axis(ax, layers: list[int]) -> None:
    """Tick every measured layer when there are few (e.g. Gemma 3's global layers 5, 11, 17), else integers."""
    if 0 < len(layers) <= 12:
        ax.set_xticks(layers)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def layer_fidelity(summary: Summary, out_dir: Path) -> list[Path]:
    """Per model and ctx: each fidelity metric vs layer index (log y), one panel per metric that has per-layer
    rows (cells recorded before a metric existed have none of it).

    Quantizers whose error is 0 at every layer (bf16) cannot sit on a log axis; the legend says so."""
    paths = []
    for model in summary.models({"fidelity"}):
        for ctx in summary.ctxs(model, {"fidelity"}):
            quantizers = summary.quantizers(model, {"fidelity"}, ctx)
            metrics = [m for m in FIDELITY_METRICS if any(layer_series(summary, model, q, ctx, m) for q in quantizers)]
            fig, axes = new_figure(len(metrics))
            zero_only, data = set(quantizers), []
            for ax, metric in zip(axes, metrics):
                layers = set()
                for q in quantizers:
                    series = [(layer, v) for layer, v in layer_series(summary, model, q, ctx, metric) if v > 0]
                    if series:
                        data += [{"metric": metric, "quantizer": q, "layer": layer, "value": v} for layer, v in series]
                        zero_only.discard(q)
                        layers.update(layer for layer, _ in series)
                        ax.plot(*zip(*series), color=colour(q), marker="o", markersize=4)
                ax.set_yscale("log")
                layer_axis(ax, sorted(layers))
                ax.set(xlabel="layer index (full-attention layers)", ylabel=FIDELITY_UNITS[metric],
                       title=FIDELITY_METRICS[metric])
                ax.grid(alpha=0.3, which="both")
            handles = [Line2D([], [], color=colour(q), marker="o",
                              label=quantizer_label(q) + (" (0, not drawn)" if q in zero_only else ""))
                       for q in quantizers]
            fig.legend(handles=handles, loc="outside right upper", title="KV quantizer", frameon=False)
            fig.suptitle(f"{model} @ {ctx}: per-layer error vs full precision (lower is better)")
            paths += save(fig, out_dir, f"layer_fidelity_{model}_{ctx}", data)
    return paths


def speedup_records(payload) -> list[dict]:
    """Every dict found in the JSON (at any depth) that has batch, ctx and at least one `<x>_speedup`."""
    if isinstance(payload, list):
        return [r for item in payload for r in speedup_records(item)]
    if not isinstance(payload, dict):
        return []
    if {"batch", "ctx"} <= payload.keys() and any(k.endswith("_speedup") for k in payload):
        return [payload]
    return [r for value in payload.values() for r in speedup_records(value)]


def decode_speedup(bench_dir: Path, out_dir: Path) -> list[Path]:
    """Per benchmark JSON with decode timings: speedup over BF16 vs ctx, colour = kernel, marker = batch."""
    paths = []
    for source in sorted(Path(bench_dir).glob("*.json")):
        payload = json.loads(source.read_text())
        records = pd.DataFrame(speedup_records(payload))
        if records.empty:
            continue
        fig, (ax,) = new_figure(1, panel_size=(6.0, 4.0))
        providers = [c.removesuffix("_speedup") for c in records.columns if c.endswith("_speedup")]
        markers = batch_markers(sorted(records["batch"].unique()))
        for provider in providers:
            for batch, marker in markers.items():
                part = records[records["batch"] == batch].sort_values("ctx")
                ax.plot(part["ctx"], part[f"{provider}_speedup"], color=colour(bench_provider(provider)[0]),
                        marker=marker)
        ax.axhline(1.0, color="0.4", linestyle=":", linewidth=1)
        ctxs = sorted(records["ctx"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(ctxs, labels=[f"{c // 1024}k" if c % 1024 == 0 else str(c) for c in ctxs])
        ax.minorticks_off()
        ax.set(xlabel="context length (tokens)", ylabel="decode speedup over BF16 SDPA (×)")
        ax.grid(alpha=0.3)
        device = payload.get("device", "") if isinstance(payload, dict) else ""
        ax.set_title(f"{source.stem}: decode attention speedup" + (f" ({device})" if device else ""))
        fig.legend(handles=speedup_legend(providers, markers), loc="outside right upper", frameon=False)
        columns = ["batch", "ctx", *(f"{p}_speedup" for p in providers)]
        data = records[columns].sort_values(["batch", "ctx"]).to_dict("records")
        paths += save(fig, out_dir, f"decode_speedup_{source.stem}", data)
    return paths


def speedup_legend(providers: list[str], markers: dict) -> list[Line2D]:
    """Colour = kernel, marker = batch size."""
    kernels = [Line2D([], [], color=colour(bench_provider(p)[0]), label=bench_provider(p)[1]) for p in providers]
    sizes = [Line2D([], [], color="0.3", marker=m, linestyle="none", label=f"batch {b}") for b, m in markers.items()]
    reference = Line2D([], [], color="0.4", linestyle=":", label="BF16 SDPA (1×)")
    return kernels + [reference] + sizes


def write_plots(rows: pd.DataFrame, bench_dir: Path, out_dir: Path) -> list[Path]:
    """Every figure the rows and benchmark JSON can fill; returns the PNG, PDF and CSV paths written."""
    summary = Summary(rows)
    out_dir = Path(out_dir)
    return (accuracy_vs_ctx(summary, out_dir) + accuracy_vs_bpe(summary, out_dir)
            + layer_fidelity(summary, out_dir) + decode_speedup(Path(bench_dir), out_dir))
