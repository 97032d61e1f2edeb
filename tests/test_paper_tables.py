"""The paper's tables: the paper's value beside ours and the difference, cells not run as "–", random-weight dry
runs left out by default and marked when asked for; results/paper/oscar_paper.yaml's schema."""
import json
import math

import pandas as pd
import pytest

from report.paper_tables import (DRY_MARK, PAPER_FILE, load_paper, paper_tables, split_dry_runs)
from report.store import CellRecorder, load_rows
from report.tables import MISSING, to_latex, to_markdown, write_tables

FIELDS = {"source", "model", "method", "label", "task", "metric", "ctx", "value", "std", "runs"}


def write_cell(store, model, quantizer, task, seed, metrics):
    key = {"model": model, "quantizer": quantizer, "task": task, "ctx": "32k", "seed": seed}
    CellRecorder(store, key, {**key, "tag": "test"}).write_ok(metrics)


@pytest.fixture
def rows(tmp_path):
    """Qwen3-8B OSCAR AIME25 over two seeds (60, 70), BF16 one seed, and a dry run of OSCAR GPQA."""
    for seed, value in ((0, 60.0), (1, 70.0)):
        write_cell(tmp_path, "qwen3_8b", "oscar", "aime25", seed, {"aime25_pass1": value, "bits_per_element": 2.38})
    write_cell(tmp_path, "qwen3_8b", "bf16", "aime25", 0, {"aime25_pass1": 80.0, "bits_per_element": 16.0})
    write_cell(tmp_path, "qwen3_8b@random", "oscar", "gpqa_diamond", 0, {"gpqa_diamond_pass1": 25.0})
    return load_rows(tmp_path)


def block_rows(table, model, method_label):
    block = next(b for b in table.blocks if b.title == model)
    return {row[1]: dict(zip(block.columns, row)) for row in block.rows if row[0] == method_label}


def test_the_paper_file_has_every_number_with_its_source():
    paper = load_paper()
    assert set(paper.columns) == FIELDS
    assert len(paper) == 233                      # 188 main table, 20 AIME INT2, 2 RULER, 5 ablation, 18 throughput
    assert paper["source"].str.contains("METHOD_OSCAR.md §11.").all()
    assert paper["value"].map(lambda v: isinstance(v, float)).all()
    assert not paper.duplicated(["source", "model", "method", "metric", "ctx"]).any()
    counts = paper.groupby(paper["source"].str.extract(r"(§11\.\d)")[0]).size().to_dict()
    assert counts == {"§11.1": 188, "§11.2": 20, "§11.3": 2, "§11.4": 18, "§11.7": 5}
    main = paper[paper["source"].str.contains("§11.1")]
    assert len(main[main["metric"].str.endswith("_pass1")]) == 4 * 6 * 5       # models x methods x tasks


def test_ours_sits_beside_the_paper_with_the_difference(rows):
    aime = next(t for t in paper_tables(rows) if t.name == "paper_aime_int2")
    oscar = block_rows(aime, "qwen3_8b", "OSCAR")
    assert oscar["paper"]["AIME25"] == "66.67±3.33"                               # METHOD_OSCAR.md §11.2
    assert oscar["ours"]["AIME25"] == f"65.00±{pd.Series([60.0, 70.0]).std():.2f}"
    assert oscar["ours - paper"]["AIME25"] == f"{65.0 - 66.67:+.2f}"
    assert oscar["ours"]["BPE"] == "2.38" and oscar["ours - paper"]["BPE"] == ""
    kitty = block_rows(aime, "qwen3_8b", "Kitty")
    assert kitty["paper"]["AIME25"] == "59.67±10.33" and kitty["ours"]["AIME25"] == MISSING
    assert kitty["ours - paper"]["AIME25"] == MISSING


def test_cells_not_run_are_missing_and_the_paper_main_table_keeps_its_layout(rows):
    main = next(t for t in paper_tables(rows) if t.name == "paper_main")
    assert [b.title for b in main.blocks] == ["qwen3_4b_thinking", "qwen3_8b", "qwen3_32b", "glm47_fp8"]
    assert main.blocks[0].columns == ["Method", "Row", "BPE", "GPQA", "HumanE", "LCB v6", "AIME25", "MATH500",
                                      "Mean", "Drop"]
    oscar = block_rows(main, "qwen3_8b", "OSCAR")
    assert oscar["paper"]["GPQA"] == "55.05±1.47" and oscar["paper"]["Mean"] == "69.416"
    assert oscar["ours"]["AIME25"].startswith("65.00±") and oscar["ours - paper"]["AIME25"] == f"{65 - 66.67:+.2f}"
    assert oscar["ours"]["GPQA"] == MISSING and oscar["ours"]["Mean"] == MISSING     # four tasks not run: no mean
    assert block_rows(main, "qwen3_32b", "Saw-INT4")["paper"]["Drop"] == "+0.24"


def test_dry_runs_are_left_out_unless_asked_and_then_marked(rows):
    main = next(t for t in paper_tables(rows) if t.name == "paper_main")
    assert "dry run" not in to_markdown(main)
    main = next(t for t in paper_tables(rows, dry_runs=True) if t.name == "paper_main")
    oscar = block_rows(main, "qwen3_8b", "OSCAR")
    assert oscar[f"dry run {DRY_MARK}"]["GPQA"] == f"25.00{DRY_MARK}"
    assert oscar["ours"]["GPQA"] == MISSING                                 # never shown as ours
    assert any(DRY_MARK in note for note in main.notes) and r"\ddagger" in to_latex(main)


def test_a_dry_run_flagged_by_run_weights_is_marked_too(rows):
    rows = rows.copy()
    flagged = (rows["quantizer"] == "bf16").to_numpy()
    rows["run"] = [{"weights": "random"} if f else {} for f in flagged]
    real, dry = split_dry_runs(rows)
    assert set(real["quantizer"]) == {"oscar"} and set(dry["model"]) == {"qwen3_8b"}
    main = next(t for t in paper_tables(rows, dry_runs=True) if t.name == "paper_main")
    bf16 = block_rows(main, "qwen3_8b", "BF16")                           # a dry run as run.py writes it: shown
    assert bf16[f"dry run {DRY_MARK}"]["AIME25"] == f"80.00{DRY_MARK}" and bf16["ours"]["AIME25"] == MISSING


def test_write_tables_writes_the_paper_tables_and_keeps_dry_runs_out_of_the_others(rows, tmp_path):
    write_cell(tmp_path, "qwen3_8b@random", "oscar", "aime25", 0, {"aime25_pass1": 3.0})     # main.md shows AIME25
    rows = load_rows(tmp_path)
    out = tmp_path / "tables"
    names = {p.name for p in write_tables(rows, tmp_path / "bench", out, allow_dirty=True)}
    assert {"paper_main.md", "paper_aime_int2.tex", "paper_ruler.md", "paper_ablation.md"} <= names
    assert "@random" not in (out / "main.md").read_text()
    write_tables(rows, tmp_path / "bench", out, allow_dirty=True, dry_runs=True)
    assert "qwen3_8b@random" in (out / "main.md").read_text()


def test_the_paper_file_is_the_default():
    assert PAPER_FILE.is_file() and not math.isnan(load_paper(PAPER_FILE)["value"].sum())


def _bench_run(path, model="qwen3_4b", argv=("scripts/bench_throughput.py",), oscar_budget_batch=27, device=None):
    rows = [{"quantizer": q, "batch": b, "ctx": 102400, "ms_per_step": ms, "tokens_per_s": b * 1e3 / ms}
            for q, b, ms in (("bf16+graph", 1, 12.0), ("oscar:model+graph", 1, 8.0), ("bf16_static", 1, 80.0),
                             ("bf16+graph", 8, 40.0), ("oscar:model+graph", 8, 10.0))]
    budget = [{"quantizer": "bf16+graph", "batch": 4, "tokens_per_s": 100.0, "max_batch_in_budget": 4},
              {"quantizer": "oscar:model+graph", "batch": oscar_budget_batch, "tokens_per_s": 550.0,
               "max_batch_in_budget": 27},
              {"quantizer": "bf16_static", "batch": 4, "tokens_per_s": 50.0}]
    payload = {"model": model, "date": "2026-11-25", "argv": list(argv), "rows": rows, "same_budget": budget}
    path.write_text(json.dumps(payload if device is None else {**payload, "device": device}))


def test_throughput_table_puts_each_engines_speedup_beside_the_paper(tmp_path):
    from report.paper_throughput import throughput_table
    _bench_run(tmp_path / "run.json")
    _bench_run(tmp_path / "profile.json", argv=("scripts/bench_throughput.py", "--profile"))   # left out
    _bench_run(tmp_path / "capped.json", model="qwen3_8b", oscar_budget_batch=1)   # --same-budget-cap 1: no ratio
    (tmp_path / "kernels.json").write_text(json.dumps({"decode": []}))                         # not a throughput run
    table = throughput_table(tmp_path, load_paper())
    qwen4b, qwen8b = table.blocks
    paper, same_engine, stock = qwen4b.rows
    assert paper == ["paper, OSCAR vs BF16 (SGLang)", "3.08×", "5.19×", "6.17×", MISSING]
    assert "bf16+graph" in same_engine[0] and same_engine[1:] == ["1.50×", "4.00×", MISSING, "5.50×"]
    assert "StaticCache" in stock[0] and stock[1:] == ["10.00×", MISSING, MISSING, "11.00×"]
    paper8b, capped, _ = qwen8b.rows
    assert paper8b[1] == "2.88×" and capped[1] == "1.50×" and capped[4] == MISSING
    assert "median step" in same_engine[0] and "median step" in capped[0]


def test_throughput_table_takes_the_mean_step_where_the_run_has_it(tmp_path):
    """A run whose rows carry the mean step over whole demotion pages is compared on it (and says so), not on the
    median, which skips the demoting steps."""
    from report.paper_throughput import throughput_table
    _bench_run(tmp_path / "run.json")
    payload = json.loads((tmp_path / "run.json").read_text())
    for row in payload["rows"]:
        row["ms_per_step_mean"] = row["ms_per_step"] * (2 if "oscar" in row["quantizer"] else 1)
    (tmp_path / "run.json").write_text(json.dumps(payload))
    _, same_engine, stock = throughput_table(tmp_path, load_paper()).blocks[0].rows
    assert "mean step" in same_engine[0] and same_engine[1:3] == ["0.75×", "2.00×"]
    assert stock[1] == "5.00×"


def test_throughput_rows_name_their_gpu(tmp_path):
    """Runs on an H100 and an H200 sit in one block: each row names its GPU (their bandwidths differ), and a run
    from before the device field says it was not recorded."""
    from report.paper_throughput import throughput_table
    _bench_run(tmp_path / "a_h100.json", device="NVIDIA H100 80GB HBM3")
    _bench_run(tmp_path / "b_h200.json", device="NVIDIA H200")
    _bench_run(tmp_path / "c_old.json")
    labels = [row[0] for row in throughput_table(tmp_path, load_paper()).blocks[0].rows[1:]]
    assert all("NVIDIA" not in label for label in labels)
    for name, gpu in (("a_h100.json", "H100 80GB HBM3"), ("b_h200.json", "H200"), ("c_old.json", "GPU not recorded")):
        assert sum(f"({name}, {gpu}, 2026-11-25," in label for label in labels) == 2     # bf16+graph and StaticCache


PAPER_SAMPLING = {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 40}


def write_ruler_cell(store, model, quantizer, seed, score, ctx="4k", sampling=PAPER_SAMPLING, n=32,
                     ci95=(0.0, 100.0)):
    """A RULER-NIAH cell as run.py writes it: the task config (sampling, samples, variants), n and interval."""
    key = {"model": model, "quantizer": quantizer, "task": "ruler_niah", "ctx": ctx, "seed": seed}
    task = {"name": "ruler_niah", "samples": 4, "variants": [f"v{i}" for i in range(8)], "max_new_tokens": 128,
            "sampling": sampling}
    recorder = CellRecorder(store, key, {**key, "task": task})
    recorder.intervals = {"ruler_niah": {"n": n, "ci95": list(ci95)}}
    recorder.write_ok({"ruler_niah": score, "bits_per_element": {"bf16": 16.0, "oscar": 3.5}.get(quantizer, 2.25)})


@pytest.fixture
def offline_rows(tmp_path):
    """Gemma: BF16 at 60 and OSCAR at 10..50 over five sampled seeds, naive INT2 near 0 (its t interval crosses 0),
    QuaRot-INT2 one seed; beside them rows the table must leave out: a greedy SmolLM2 BF16 row (the headline's kind),
    a sampled 8k row and a sampled random-weight dry run."""
    for seed, score in enumerate((10.0, 20.0, 30.0, 40.0, 50.0)):
        write_ruler_cell(tmp_path, "gemma3_270m", "oscar", seed, score)
        write_ruler_cell(tmp_path, "gemma3_270m", "bf16", seed, 60.0)
        write_ruler_cell(tmp_path, "gemma3_270m", "naive_int2", seed, 5.0 if seed == 4 else 0.0)
    write_ruler_cell(tmp_path, "gemma3_270m", "quarot_int2", 0, 12.5, ci95=(3.1, 25.0))
    write_ruler_cell(tmp_path, "smollm2_135m", "bf16", 0, 50.0, sampling=None)
    write_ruler_cell(tmp_path, "smollm2_135m", "oscar", 0, 40.0, ctx="8k")
    write_ruler_cell(tmp_path, "smollm2_135m@random", "turboquant_k3v3", 0, 1.0)
    return load_rows(tmp_path)


def offline_table(rows):
    return next(t for t in paper_tables(rows) if t.name == "paper_ruler_offline")


def test_offline_ruler_table_is_mean_std_interval_and_n_over_the_seeds(offline_rows):
    table = offline_table(offline_rows)
    gemma, smollm = table.blocks
    assert (gemma.title, smollm.title) == ("gemma3_270m", "smollm2_135m")
    assert gemma.columns == ["Method", "BPE", "RULER-NIAH 4k", "95% CI", "seeds", "n", "Drop"]
    cells = {row[0]: dict(zip(gemma.columns, row)) for row in gemma.rows}
    assert list(cells) == ["BF16", "Saw-INT4", "TurboQuant K3V3", "QuaRot-INT2", "Naive INT2", "OSCAR"]
    half = 2.7764451 * pd.Series([10.0, 20.0, 30.0, 40.0, 50.0]).std() / 5 ** 0.5      # t(0.975, 4) s / sqrt(5)
    assert cells["OSCAR"] == {"Method": "OSCAR", "BPE": "3.50", "RULER-NIAH 4k": "30.00±15.81",
                              "95% CI": f"[{30 - half:.1f}, {30 + half:.1f}]", "seeds": "5", "n": "160",
                              "Drop": "-30.00"}
    assert cells["BF16"]["RULER-NIAH 4k"] == "60.00±0.00" and cells["BF16"]["95% CI"] == "[60.0, 60.0]"
    assert cells["BF16"]["Drop"] == "ref."
    assert cells["Naive INT2"]["95% CI"].startswith("[0.0, ")                       # clipped to the score range
    assert cells["QuaRot-INT2"]["RULER-NIAH 4k"] == "12.50" and cells["QuaRot-INT2"]["95% CI"] == "[3.1, 25.0]"
    assert cells["QuaRot-INT2"]["seeds"] == "1" and cells["QuaRot-INT2"]["n"] == "32"
    assert cells["Saw-INT4"] == {"Method": "Saw-INT4", **{c: MISSING for c in gemma.columns[1:]}}


def test_offline_ruler_table_leaves_out_greedy_other_lengths_and_dry_runs(offline_rows):
    smollm = offline_table(offline_rows).blocks[1]
    assert all(cell == MISSING for row in smollm.rows for cell in row[1:])
    assert "@random" not in to_markdown(offline_table(offline_rows))
    dry = next(t for t in paper_tables(offline_rows, dry_runs=True) if t.name == "paper_ruler_offline")
    assert to_markdown(dry) == to_markdown(offline_table(offline_rows))


def test_offline_ruler_table_quotes_the_paper_and_the_settings_from_files_and_rows(offline_rows):
    notes = " ".join(offline_table(offline_rows).notes)
    ruler = load_paper().query("source.str.contains('§11.3')", engine="python")
    for entry in ruler.itertuples():
        assert f"{entry.label} {entry.value:.2f}" in notes                          # from oscar_paper.yaml
    assert "no difference is claimed" in notes and "ours - paper" not in to_markdown(offline_table(offline_rows))
    assert "temperature 1.0, top-p 0.95, top-k 40; 4 samples x 8 variants per seed, 128 new tokens" in notes
    assert "none yet" in " ".join(offline_table(offline_rows.iloc[0:0]).notes)


def test_write_tables_writes_the_offline_ruler_table(offline_rows, tmp_path):
    out = tmp_path / "tables"
    names = {p.name for p in write_tables(offline_rows, tmp_path / "bench", out, allow_dirty=True)}
    assert {"paper_ruler_offline.md", "paper_ruler_offline.tex"} <= names
    assert "| OSCAR | 3.50 | 30.00±15.81 |" in (out / "paper_ruler_offline.md").read_text()
