"""Tables and plots from a small synthetic results store: values, Mean/Drop, blanks, files."""
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib.image
import pytest

from report.plots import QUANTIZER_COLOURS, decode_speedup, pareto_front, write_plots
from report.store import atomic_write_jsonl, load_rows
from report.tables import MISSING, QUANTIZER_ORDER, all_tables, to_latex, to_markdown

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BENCH_MD = "| batch | ctx | INT2 speedup |\n|---|---|---|\n| 1 | 8192 | 2.10x |"
BENCH_JSON = {"device": "Fake GPU", "decode": [
    {"batch": b, "ctx": c, "bf16_ms": 1.0, "int2_speedup": s, "int4_speedup": s / 2}
    for b, c, s in [(1, 8192, 1.5), (1, 32768, 2.5), (8, 8192, 2.0), (8, 32768, 3.5)]]}


def ok(model, quantizer, task, ctx, metrics, seed=0, timestamp="2026-01-01T00:00:00", interval=True):
    """One cell's rows, bits_per_element included as run.py writes it; scored metrics get n = 20 and a
    95% interval of +-10 (clipped to 0..100) unless `interval` is False (a row from before intervals)."""
    bpe = {"bf16": 16.0, "naive_int2": 2.25, "oscar": 2.28}[quantizer]
    scored = interval and task != "fidelity"
    return [{"model": model, "quantizer": quantizer, "task": task, "ctx": ctx, "seed": seed, "metric": m,
             "value": v, "status": "ok", "error": "", "timestamp": timestamp,
             **({"n": 20, "ci95": [max(0.0, v - 10), min(100.0, v + 10)]} if scored and m != "bits_per_element"
                else {})}
            for m, v in {**metrics, "bits_per_element": bpe}.items()]


def error(model, quantizer, task, ctx):
    return [{"model": model, "quantizer": quantizer, "task": task, "ctx": ctx, "seed": 0, "metric": "error",
             "value": float("nan"), "status": "error", "error": "RuntimeError: boom", "timestamp": ""}]


def ruler(mean):
    return {"niah_single_1": mean - 5, "niah_single_2": mean + 5, "ruler_niah": mean}


def fidelity(scale, hidden=True):
    """Fidelity rows; hidden=False: a cell recorded before the block-output and hidden-state metrics existed."""
    layered = ("k_mse", "attn_kl", "propagated_hidden_mse") if hidden else ("k_mse", "attn_kl")
    per_layer = {f"{m}/layer_{layer}": scale * (layer + 1) for m in layered for layer in (0, 1)}
    later = {"attn_output_mse": 0.5 * scale, "propagated_hidden_mse": 1.5 * scale} if hidden else {}
    return {**per_layer, "k_mse": 1.5 * scale, "v_mse": 0.1 * scale, "logit_mse": 2 * scale,
            "attn_kl": 1.5 * scale, "attn_output_rel_err": 0.3 * scale, **later}


CELLS = [
    ok("toy", "bf16", "ruler_niah", "4k", ruler(90.0), seed=0),
    ok("toy", "bf16", "ruler_niah", "4k", ruler(100.0), seed=1),
    ok("toy", "naive_int2", "ruler_niah", "4k", ruler(0.0)),           # a real zero score
    ok("toy", "oscar", "ruler_niah", "4k", ruler(70.0), timestamp="2026-01-01T00:00:00"),
    ok("toy", "oscar", "ruler_niah", "4k", ruler(80.0), timestamp="2026-02-01T00:00:00"),  # re-run: wins
    ok("toy", "bf16", "ruler_niah", "8k", ruler(85.0)),
    ok("toy", "oscar", "ruler_niah", "8k", ruler(60.0), interval=False),  # naive_int2 @ 8k: not run
    ok("toy", "bf16", "aime25", "4k", {"aime25_pass1": 60.0}),
    ok("toy", "oscar", "aime25", "4k", {"aime25_pass1": 50.0}),
    error("toy", "naive_int2", "aime25", "4k"),                         # failed cell: must not count
    ok("toy", "bf16", "fidelity", "4k", fidelity(0.0)),
    ok("toy", "oscar", "fidelity", "4k", fidelity(0.2)),
    ok("toy", "naive_int2", "fidelity", "4k", fidelity(1.0, hidden=False)),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """results/ with rows/<task>/<cell>.jsonl and bench/ (one Markdown table and its JSON)."""
    root = tmp_path_factory.mktemp("results")
    by_task = defaultdict(int)
    for rows in CELLS:
        task = rows[0]["task"]
        by_task[task] += 1
        atomic_write_jsonl(root / "rows" / task / f"cell{by_task[task]}.jsonl", rows)
    (root / "bench").mkdir()
    (root / "bench" / "bench_kernels.md").write_text(BENCH_MD + "\n")
    (root / "bench" / "bench_kernels.json").write_text(json.dumps(BENCH_JSON))
    return root


@pytest.fixture(scope="module")
def tables(store):
    return {t.name: t for t in all_tables(load_rows(store))}


def block_rows(table, title="toy") -> dict[tuple, list[str]]:
    """{(first cells...): row} of one block, keyed by the label columns."""
    block = next(b for b in table.blocks if b.title == title)
    labels = sum(1 for c in block.columns if c in ("Ctx", "Method", "Variant"))
    return {tuple(r[:labels]): dict(zip(block.columns, r)) for r in block.rows}


def test_main_table_cells_mean_and_drop(tables):
    rows = block_rows(tables["main"])
    assert list(rows) == [("4k", "BF16"), ("4k", "Naive INT2"), ("4k", "OSCAR"), ("8k", "BF16"), ("8k", "OSCAR")]
    bf16, oscar = rows[("4k", "BF16")], rows[("4k", "OSCAR")]
    assert bf16["RULER-NIAH"] == "95.00±7.07" and bf16["BPE"] == "16.00"                 # two seeds: ± std
    assert bf16["AIME25"] == "60.00 [50.0, 70.0] n=20"                                    # one seed: interval, n
    assert bf16["Mean"] == "77.50" and bf16["Drop"] == "ref."
    assert oscar["RULER-NIAH"] == "80.00 [70.0, 90.0] n=20" and oscar["Mean"] == "65.00" and oscar["Drop"] == "-12.50"
    assert oscar["BPE"] == "2.28"
    assert rows[("8k", "OSCAR")]["AIME25"] == MISSING and rows[("8k", "OSCAR")]["Drop"] == MISSING


def test_error_row_is_blank_and_blanks_the_mean(tables):
    naive = block_rows(tables["main"])[("4k", "Naive INT2")]
    assert naive["RULER-NIAH"] == "0.00 [0.0, 10.0] n=20"
    assert naive["AIME25"] == MISSING and naive["Mean"] == MISSING and naive["Drop"] == MISSING


def test_ruler_by_ctx_blank_not_zero(tables):
    rows = block_rows(tables["ruler_niah_by_ctx"])
    assert rows[("Naive INT2",)] == {"Method": "Naive INT2", "4k": "0.00 [0.0, 10.0] n=20", "8k": MISSING}
    assert rows[("OSCAR",)] == {"Method": "OSCAR", "4k": "80.00 [70.0, 90.0] n=20", "8k": "60.00†"}   # no interval


def test_ruler_variants_table(tables):
    rows = block_rows(tables["ruler_niah_variants"])
    assert rows[("BF16", "niah_single_2")]["4k"] == "100.00±7.07"
    assert rows[("OSCAR", "niah_single_1")]["8k"] == "55.00†"


def test_fidelity_table(tables):
    rows = block_rows(tables["fidelity"])
    assert list(rows) == [("4k", "BF16"), ("4k", "Naive INT2"), ("4k", "OSCAR")]
    assert rows[("4k", "OSCAR")]["K MSE"] == "0.3" and rows[("4k", "OSCAR")]["attn-out rel. err"] == "0.06"
    assert rows[("4k", "BF16")]["V MSE"] == "0"
    assert rows[("4k", "OSCAR")]["attn-out MSE"] == "0.1" and rows[("4k", "OSCAR")]["hidden MSE (propagated)"] == "0.3"
    assert rows[("4k", "Naive INT2")]["hidden MSE (propagated)"] == MISSING        # recorded before it existed


def test_markdown_and_latex_render_blanks_with_a_footnote(tables):
    markdown, latex = to_markdown(tables["ruler_niah_by_ctx"]), to_latex(tables["ruler_niah_by_ctx"])
    assert "| Naive INT2 | 0.00 [0.0, 10.0] n=20 | – |" in markdown and "– = not run" in markdown
    assert r"Naive INT2 & 0.00 [0.0, 10.0] n=20 & -- \\" in latex and r"\toprule" in latex and "-- = not run" in latex
    assert r"95.00$\pm$7.07" in latex and r"60.00$^\dagger$" in latex


def test_cli_writes_every_table_and_copies_bench_verbatim(store, tmp_path):
    out = tmp_path / "tables"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tables.py"), "--results", str(store),
                    "--out", str(out)], check=True, capture_output=True, cwd=tmp_path)
    names = {p.name for p in out.iterdir()}
    for stem in ("main", "ruler_niah_by_ctx", "ruler_niah_variants", "fidelity"):
        assert {f"{stem}.md", f"{stem}.tex"} <= names
    bench = (out / "bench.md").read_text()
    assert "## bench_kernels.md" in bench and BENCH_MD in bench


@pytest.fixture(scope="module")
def plots(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("plots")
    return out, write_plots(load_rows(store), store / "bench", out)


def test_every_plot_is_written_as_png_pdf_and_its_data_as_csv(plots):
    out, paths = plots
    stems = {"accuracy_vs_ctx_toy", "accuracy_vs_bpe_toy", "layer_fidelity_toy_4k", "decode_speedup_bench_kernels"}
    assert {p.name for p in paths} == {f"{s}.{ext}" for s in stems for ext in ("png", "pdf", "csv")}
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC
        height, width, _ = matplotlib.image.imread(png).shape
        assert height > 200 and width > 200
    assert all(p.read_bytes()[:4] == b"%PDF" for p in out.glob("*.pdf"))


def test_plot_data_holds_the_points_and_their_error_bars(plots):
    import pandas as pd
    out, _ = plots
    data = pd.read_csv(out / "accuracy_vs_ctx_toy.csv")
    oscar = data[(data["quantizer"] == "oscar") & (data["task"] == "ruler_niah")].set_index("ctx")
    assert oscar.loc["4k", ["mean", "err_below", "err_above", "examples"]].tolist() == [80.0, 10.0, 10.0, 20]
    assert oscar.loc["8k", ["mean", "err_below", "err_above"]].tolist() == [60.0, 0.0, 0.0]      # no interval
    bf16 = data[(data["quantizer"] == "bf16") & (data["task"] == "ruler_niah")].set_index("ctx")
    assert bf16.loc["4k", "seeds"] == 2 and round(bf16.loc["4k", "err_below"], 2) == 7.07       # ± std of seeds


def test_layer_fidelity_draws_a_panel_per_metric_with_per_layer_rows(store, tmp_path, monkeypatch):
    import report.plots
    figures = []
    monkeypatch.setattr(report.plots, "save", lambda fig, out_dir, stem, data: figures.append(fig) or [])
    report.plots.layer_fidelity(report.plots.Summary(load_rows(store)), tmp_path)
    assert [ax.get_title() for ax in figures[0].axes] == ["K MSE", "attn KL", "hidden MSE (propagated)"]


def test_speedup_plot_is_skipped_without_decode_timings(tmp_path):
    assert decode_speedup(tmp_path / "no_bench", tmp_path) == []
    (tmp_path / "write_only.json").write_text(json.dumps({"write": [{"what": "int2", "ms": 0.1}]}))
    assert decode_speedup(tmp_path, tmp_path) == [] and not list(tmp_path.glob("*.png"))


def test_every_canonical_quantizer_has_its_own_colour():
    assert set(QUANTIZER_ORDER) <= set(QUANTIZER_COLOURS)
    assert len(set(QUANTIZER_COLOURS.values())) == len(QUANTIZER_COLOURS)


def test_pareto_front_keeps_only_undominated_points():
    assert pareto_front([(16, 95), (2.28, 80), (2.25, 0), (4.25, 70), (2.28, 60)]) == [(2.25, 0), (2.28, 80), (16, 95)]


def test_engine_table_shows_timed_cells_once_with_each_gpus_peak():
    """One line per ok cell whose rows time the first decode step apart; older timings and errors are left out."""
    import pandas as pd
    from report.engine_table import engine_markdown
    timing = {"prefills": 1, "prefill_s": 50.5, "first_step_s": 5.4, "decode_steps": 30, "decode_ms_per_step": 137.9}
    run = {"weights": "random", "device": "cuda", "decode_timing": timing, "decode_batches": {"static": 1},
           "placement": {"cuda:0": "layers 0-31", "cuda:1": "layers 32-63"},
           "static_decode_graph": "off: a CUDA graph captures one device"}
    base = {"model": "qwen3_32b@random", "quantizer": "bf16", "ctx": "128k", "seed": 0, "status": "ok",
            "device": "2 x H100", "git_sha": "abc", "config": {"task": {"batch_size": 1}}, "run": run,
            "peak_mem_mb": 72022.9, "peak_mem_mb_by_device": {"cuda:0": 72022.9, "cuda:1": 70742.9}}
    old = {**base, "cell": "old", "quantizer": "oscar",
           "run": {**run, "decode_timing": {k: v for k, v in timing.items() if k != "first_step_s"}}}
    failed = {**base, "cell": "err", "quantizer": "kivi2", "status": "error"}
    rows = pd.DataFrame([{**base, "cell": "a", "metric": "m1"}, {**base, "cell": "a", "metric": "m2"}, old, failed])
    text = engine_markdown(rows)
    lines = [line for line in text.splitlines() if line.startswith("| qwen3_32b")]
    assert len(lines) == 1 and "| bf16 |" in lines[0] and "| random |" in lines[0]
    assert "cuda:0 75.5 / cuda:1 74.2" in lines[0] and "| 137.9 |" in lines[0] and "no (several GPUs)" in lines[0]
    assert engine_markdown(rows[rows["cell"] == "old"]) is None and engine_markdown(pd.DataFrame()) is None
    graphed = {**base, "cell": "g", "run": {**run, "static_decode_graph": "per GPU: one CUDA graph on each of ..."}}
    assert "| yes, one per GPU |" in engine_markdown(pd.DataFrame([graphed]))
    rerun = {**graphed, "cell": "a", "git_sha": "f" * 40, "timestamp": "2026-11-26T12:12:18",
             "run": {**graphed["run"], "decode_timing": {**timing, "decode_ms_per_step": 41.1}}}
    first = {**base, "cell": "a", "timestamp": "2026-11-25T18:59:09"}
    for order in ([first, rerun], [rerun, first]):                  # the latest by timestamp, in either order
        lines = [line for line in engine_markdown(pd.DataFrame(order)).splitlines() if line.startswith("| qwen")]
        assert len(lines) == 1 and "| 41.1 |" in lines[0] and lines[0].endswith(f"| {'f' * 12} |")


def test_engine_table_marks_graph_timings_that_counted_the_capture():
    """A one-GPU CUDA-graph row without setup_steps counted its graph capture among the decode steps: §; a quantized
    cache's without demotion_setups its demotions' compiles and captures: ¶. A row with both, BF16's without
    demotions, and an eager one, are not marked."""
    import pandas as pd
    from report.engine_table import engine_markdown
    timing = {"prefills": 1, "prefill_s": 2.0, "first_step_s": 1.5, "decode_steps": 14, "decode_ms_per_step": 88.9}
    run = {"weights": "random", "device": "cuda", "decode_batches": {"static": 1}, "placement": {"cuda:0": "all"}}
    base = {"model": "qwen3_8b@random", "ctx": "16k", "seed": 0, "status": "ok", "device": "H100", "git_sha": "abc",
            "config": {"task": {"batch_size": 1}}, "peak_mem_mb": 1000.0, "metric": "m"}
    rows = pd.DataFrame([
        {**base, "cell": "old", "quantizer": "quarot_int2", "run": {**run, "decode_timing": timing}},
        {**base, "cell": "new", "quantizer": "oscar",
         "run": {**run, "decode_timing": {**timing, "setup_steps": 3, "demotion_setups": 1}}},
        {**base, "cell": "mid", "quantizer": "kivi2", "run": {**run, "decode_timing": {**timing, "setup_steps": 2}}},
        {**base, "cell": "graph_bf16", "quantizer": "bf16", "run": {**run, "decode_timing": {**timing, "setup_steps": 2}}},
        {**base, "cell": "eager", "quantizer": "bf16",
         "run": {**run, "device": "cpu", "decode_timing": timing}}])
    lines = {line.split(" | ")[1]: line for line in engine_markdown(rows).splitlines() if line.startswith("| qwen3")}
    assert "| 88.9§¶ |" in lines["quarot_int2"] and "| 88.9¶ |" in lines["kivi2"]
    assert "| 88.9 |" in lines["oscar"]
    bf16 = [line for line in engine_markdown(rows).splitlines() if "| bf16 |" in line]
    assert len(bf16) == 2 and all("| 88.9 |" in line for line in bf16)
