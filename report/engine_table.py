"""How each cell ran, from its rows' provenance: engine, placement, peak memory per GPU, prefill and decode time.

    python scripts/make_tables.py --results results/multi_gpu     # writes <out>/engine.md among the other tables

One line per cell (status ok) whose rows record `run.decode_timing` with the first decode step apart (`first_step_s`;
the rows of an earlier commit counted its kernel compiles in the per-step time and are left out); stores with none
get no engine table. A CUDA-graph row without `setup_steps` counted its graph capture among the decode steps (before
the clock kept it with the setup): its per-step time is marked §; a quantized cache's CUDA-graph row without
`demotion_setups` counted its page demotions' one-time kernel compiles and graph captures among the decode steps: ¶.
No score is shown, so random-weight dry runs
appear, marked in the Weights column: what they measure (placement, memory, time) does not depend on the weights.
"""
from __future__ import annotations

import pandas as pd

COLUMNS = ["Model", "Method", "Ctx", "Batch", "Weights", "Device", "Placement", "Peak GB per GPU", "Prefill s",
           "First step s", "Decode ms/step", "Steps", "CUDA graph", "Commit"]


def _peaks(row) -> str:
    by_device = row.get("peak_mem_mb_by_device")
    if isinstance(by_device, dict) and by_device:
        return " / ".join(f"{device} {mb * 2**20 / 1e9:.1f}" for device, mb in by_device.items())
    return f"{row['peak_mem_mb'] * 2**20 / 1e9:.1f}" if pd.notna(row.get("peak_mem_mb")) else "–"


def _placement(run: dict) -> str:
    placement = run.get("placement") or {}
    return "; ".join(f"{device}: {span}" for device, span in placement.items()) or run.get("device", "–")


def _per_step(timing: dict, graph: str, quantizer: str) -> str:
    """Decode ms/step, marked § when a CUDA-graph generation's capture was counted in it (rows without setup_steps),
    ¶ when a quantized cache's demotion compiles and captures were (CUDA-graph rows without demotion_setups)."""
    stale = graph == "yes" and "setup_steps" not in timing
    demotions = graph.startswith("yes") and quantizer != "bf16" and "demotion_setups" not in timing
    return f"{timing['decode_ms_per_step']}" + ("§" if stale else "") + ("¶" if demotions else "")


def engine_line(row) -> list:
    """The table's cells for one row of a cell."""
    run, timing = row["run"], row["run"]["decode_timing"]
    batch = ((row.get("config") or {}).get("task") or {}).get("batch_size", "–")
    note = str(run.get("static_decode_graph", ""))
    graph = "no (several GPUs)" if note.startswith("off") else "yes, one per GPU" if note.startswith("per GPU") else \
        ("yes" if run.get("decode_batches", {}).get("static") and "cuda" in str(run.get("device")) else "no")
    return [str(row["model"]).removesuffix("@random"), row["quantizer"], row["ctx"], batch, run.get("weights", "–"),
            row["device"], _placement(run), _peaks(row), timing["prefill_s"], timing["first_step_s"],
            _per_step(timing, graph, row["quantizer"]), timing["decode_steps"], graph, str(row["git_sha"])[:12]]


def engine_markdown(rows: pd.DataFrame) -> str | None:
    """The engine table of a store's rows, or None when no ok row records its decode timing."""
    if rows.empty or "run" not in rows:
        return None
    timed = rows[(rows["status"] == "ok") & rows["run"].map(
        lambda run: isinstance(run, dict) and "first_step_s" in (run.get("decode_timing") or {}))]
    if timed.empty:
        return None
    if "timestamp" in timed:                        # a cell run again shows its latest timing (as latest_ok_rows)
        timed = timed.sort_values("timestamp", kind="stable")
    cells = timed.drop_duplicates("cell", keep="last").sort_values(["model", "ctx", "quantizer", "seed"])
    lines = ["# How each cell ran: placement, memory and decode time", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(v) for v in engine_line(row)) + " |" for _, row in cells.iterrows()]
    lines += ["", "From the rows' provenance (`run.decode_timing`, `run.placement`, `peak_mem_mb_by_device`): peak GB "
              "is the allocator's peak on each GPU during the cell (prefill included); Prefill s, First step s (each "
              "generation's setup steps: the first decode step, which compiles the kernels, and with a CUDA graph the "
              "second, which captures it) and Decode ms/step (the later steps) are wall times with every GPU "
              "synchronised, summed over the cell's batches (a decode step includes choosing the token). § = a row "
              "recorded before the capture was counted with the setup: its mean includes one graph capture per "
              "generation (large for short generations). ¶ = a quantized cache's row recorded before a step whose page "
              "demotion compiles its kernels or captures its graph (each demotion layout's first two) was counted with "
              "the setup: its mean includes them (large for short generations on a fresh machine). Weights `random` = a dry run with the model's shapes: its "
              "scores mean nothing and are in no other table."]
    return "\n".join(lines) + "\n"
