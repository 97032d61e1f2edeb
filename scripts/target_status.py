"""The performance issue's targets (#20) over committed runs of one GPU: one Markdown table (no GPU needed).

    python scripts/target_status.py \
        --grid results/bench/bench_kernel_grid_h200_c8f5e6d_a.json results/bench/bench_kernel_grid_h200_c8f5e6d_b.json \
        --write results/bench/bench_kernels_write_final_runs.json --write-tree new \
        --throughput results/bench/bench_throughput_h200_55c8058_4b.json \
        results/bench/bench_throughput_h200_55c8058_8b.json

--grid: bench_kernel_grid.py runs (each point counted once, the last file's row: `newest_rows`); --write: a
bench_kernels.py run, or a compare_runs.py --write file ({"runs": [{"tree", "round", "payload"}]}) whose
--write-tree runs are averaged (rows named --write-row, by default "int2 clip+rot"); --throughput:
bench_throughput.py runs (one model each). Every figure is read from those rows; the table says, per target, what
was measured and whether it meets the target. docs/known_limits.md quotes this table for the H200 and the H100 (a
test rebuilds both).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernel_grid import newest_rows, read_runs  # noqa: E402

BF16_ENGINE = "bf16+graph+compile"      # BF16 on the same engine as OSCAR (bench_throughput's fair baseline)
CLIP_ROTATION = "int2 clip+rot"         # bench_kernels.py's write row with OSCAR's clip and rotation (--write-row)
STEP_MODEL = "qwen3_4b"                 # the model whose step and same-budget throughput the issue sets targets for


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


def _percent(share: float) -> str:
    return f"{share * 100:.0f} %"


def grid_rows(rows: list[dict]) -> list[tuple[str, str, str]]:
    """The kernel grid's three targets: INT2 >= SDPA everywhere, >= 80 % of copy at long contexts and large batches,
    >= 5x SDPA at batch 32 / 100k+."""
    below = [r for r in rows if r["int2_vs_sdpa"] < 1]
    short = sum(r["ctx"] <= 1024 for r in below)
    long = [r for r in rows if r["ctx"] >= 32768 and r["batch"] >= 8]
    near = [r for r in long if r["int2_of_copy"] >= 0.8]
    largest = [r for r in rows if r["batch"] == 32 and r["ctx"] >= 100_000]
    five = [r for r in largest if r["int2_vs_sdpa"] >= 5]
    best_share = max(r["int2_of_copy"] for r in long)
    per_dim = ", ".join(f"{d}: {max(r['int2_vs_sdpa'] for r in largest if r['head_dim'] == d):.2f}x"
                        for d in sorted({r["head_dim"] for r in largest}))
    return [
        ("INT2 decode >= BF16 SDPA at every grid point",
         f"{len(rows) - len(below)} of {len(rows)} points ({len(below)} below, {short} of them at 1k)",
         _met(not below)),
        ("INT2 >= 80 % of copy at ctx >= 32k and batch >= 8", f"{len(near)} of {len(long)} points (best "
         f"{_percent(best_share)})", _met(len(near) == len(long))),
        ("INT2 >= 5x BF16 SDPA at batch 32 / ctx >= 100k, every head_dim",
         f"{len(five)} of {len(largest)} points (best per head_dim {per_dim})", _met(len(five) == len(largest))),
    ]


def write_row(payloads: list[dict], name: str = CLIP_ROTATION) -> tuple[str, str, str]:
    """Clip + rotation's share of copy (the write rows called `name`) at its largest shape, averaged over the runs."""
    found = [w for p in payloads for w in p["write"] if w["what"] == name]
    if not found:
        raise SystemExit(f"--write: no '{name}' row in those runs.")
    shape = max((w["shape"] for w in found), key=lambda s: s[0] * s[1] * s[2])
    shares = [w["of_copy"] for w in found if w["shape"] == shape]
    return ("write path, clip + rotation >= 50 % of copy",
            f"{_percent(statistics.mean(shares))} (shape {shape}; runs averaged: {len(shares)})",
            _met(statistics.mean(shares) >= 0.5))


def throughput_rows(run: dict) -> list[tuple[str, str, str]]:
    """One model's run: its peak-memory target (OSCAR at or below BF16 on the same engine at each batch), and for
    STEP_MODEL OSCAR's batch-1 share of its floor and its same-budget throughput against BF16 on the same engine
    (rows timed at the budget's batch)."""
    model, rows = run["model"], run["rows"]
    oscar = [r for r in rows if r["quantizer"].startswith("oscar")]
    out = []
    at_one = [r for r in oscar if r["batch"] == 1]
    if model == STEP_MODEL and at_one:
        best = max(at_one, key=lambda r: r["of_floor"])
        out.append((f"OSCAR batch-1 step >= 0.70 of its floor ({model}, ctx {best['ctx']})",
                    f"{best['of_floor']:.2f} ({best['quantizer']}, the best of the OSCAR rows at batch 1)",
                    _met(best["of_floor"] >= 0.7)))
    ratio_key = f"throughput_vs_{BF16_ENGINE}"
    budget = [r for r in run.get("same_budget", []) if r["quantizer"].startswith("oscar")
              and r["batch"] == r.get("max_batch_in_budget") and ratio_key in r]
    if model == STEP_MODEL and budget:
        top = max(budget, key=lambda r: r[ratio_key])
        base = next(r for r in run["same_budget"] if r["quantizer"] == BF16_ENGINE)
        out.append((f"same-budget throughput >= 5x BF16 on the same engine ({model})",
                    f"{top[ratio_key]:.2f}x ({top['quantizer']} batch {top['batch']} against batch {base['batch']}, "
                    f"{run['budget_gb']:g} GB)", _met(top[ratio_key] >= 5)))
    out.append(memory_row(model, oscar, {r["batch"]: r for r in rows if r["quantizer"] == BF16_ENGINE}))
    return out


def memory_row(model: str, oscar: list[dict], bf16: dict[int, dict]) -> tuple[str, str, str]:
    """OSCAR's peak memory against BF16's at each batch both were run at. A row without a peak did not fit
    (status=oom): an OSCAR one misses the target, a BF16 one leaves OSCAR's row within it."""
    pairs = [(r, bf16[r["batch"]]) for r in oscar if r["batch"] in bf16]
    within = [r for r, b in pairs if "peak_gb" in r and ("peak_gb" not in b or r["peak_gb"] <= b["peak_gb"])]
    ratios = [r["peak_gb"] / b["peak_gb"] for r, b in pairs if "peak_gb" in r and "peak_gb" in b]
    batches = ", ".join(str(b) for b in sorted({r["batch"] for r, _ in pairs}))
    notes = [f"largest OSCAR / BF16: {max(ratios):.2f}"] if ratios else []
    for name, unfit in (("OSCAR", [r for r, _ in pairs if "peak_gb" not in r]),
                        ("BF16", [b for _, b in pairs if "peak_gb" not in b])):
        if unfit:
            notes.append(f"{name} status={'/'.join(sorted({r.get('status', 'missing') for r in unfit}))} "
                         f"in {len(unfit)}")
    return (f"OSCAR peak memory <= BF16's ({model}, batch {batches})",
            f"{len(within)} of {len(pairs)} OSCAR rows ({'; '.join(notes)})", _met(len(within) == len(pairs)))


def read_json(path: str, flag: str, keys: set[str]) -> dict:
    """One JSON object with `keys`, or a one-sentence refusal naming the flag and the file."""
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{flag}: {path} is not a readable JSON file ({exc.__class__.__name__}).") from None
    if not isinstance(payload, dict) or not keys <= payload.keys():
        raise SystemExit(f"{flag}: {path} is not a run of the script {flag} takes (it needs {sorted(keys)}).")
    return payload


def read_write(path: str, tree: str | None) -> list[dict]:
    """bench_kernels.py payloads of --write: the file itself, or its `tree` runs of a compare_runs file."""
    payload = read_json(path, "--write", set())
    if "runs" not in payload:
        if not {"device", "date", "write"} <= payload.keys():
            raise SystemExit(f"--write: {path} is neither a bench_kernels.py run nor a compare_runs.py --write file.")
        return [payload]
    if tree is None:
        raise SystemExit(f"--write: {path} holds runs of several trees; name one with --write-tree.")
    runs = [r["payload"] for r in payload["runs"] if r["tree"] == tree]
    if not runs:
        raise SystemExit(f"--write: {path} has no runs of tree '{tree}'.")
    return runs


def status(grid: list[str], write: str, write_tree: str | None, throughput: list[str],
           write_name: str = CLIP_ROTATION) -> str:
    """The table of every target over those runs, with the GPU and dates it was measured on."""
    grid_runs = read_runs(grid, "--grid", "int2_ms")
    writes = read_write(write, write_tree)
    loads = [read_json(p, "--throughput", {"device", "date", "model", "rows"}) for p in throughput]
    devices = sorted({p["device"] for p in grid_runs + writes + loads})
    if len(devices) > 1:
        raise SystemExit(f"these runs come from different GPUs ({', '.join(devices)}); give one GPU's runs.")
    dates = sorted({p["date"] for p in grid_runs + writes + loads})
    rows = grid_rows(newest_rows(grid_runs)[0]) + [write_row(writes, write_name)]
    for run in loads:
        rows += throughput_rows(run)
    met = sum(r[2] == "yes" for r in rows)
    lines = [f"{devices[0]}, runs of {', '.join(dates)}: {met} of {len(rows)} targets met.", "",
             "| target | measured | met |", "|---|---|---|"]
    return "\n".join(lines + [f"| {a} | {b} | {c} |" for a, b, c in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", nargs="+", required=True, help="bench_kernel_grid.py JSON runs of one GPU")
    parser.add_argument("--write", required=True, help="a bench_kernels.py run or a compare_runs --write file")
    parser.add_argument("--write-tree", default=None, help="the tree whose runs count, in a compare_runs file")
    parser.add_argument("--write-row", default=CLIP_ROTATION,
                        help="the write rows' name with clip and rotation at the default launch")
    parser.add_argument("--throughput", nargs="+", required=True, help="bench_throughput.py JSON runs")
    args = parser.parse_args()
    print(status(args.grid, args.write, args.write_tree, args.throughput, args.write_row))


if __name__ == "__main__":
    main()
