"""Tables of benchmark runs of two trees made in one device call, from their JSON (no GPU needed).

    python scripts/dev/compare_runs.py results/bench/bench_formats_words_runs.json --call 1 \
        --before before --after words
    python scripts/dev/compare_runs.py results/bench/bench_throughput_words_runs.json --throughput
    python scripts/dev/compare_runs.py results/bench/bench_kernels_write_epilogue_runs.json --write \
        --before base --after new
    python scripts/dev/compare_runs.py results/bench/bench_kernel_fp_only_h200_runs.json --grid \
        --before base --after new

bench_formats.py runs: the file holds {"calls": [{"call": n, "trees": {...}, "runs": [{"tree": label, "round": r,
"payload": <bench_formats.py JSON>}]}]}; for each point and format the table gives both trees' mean time over the
call's rounds (each round's times in brackets), the after tree's share of the copy bandwidth and speed against BF16
SDPA (SDPA timed in the same run), and after / before. --throughput: the file holds {"runs": [{"tree", "round",
"payload": <bench_throughput.py JSON>}]}; every row and same-budget row of every run, in run order. --write: the
file holds {"runs": [{"tree", "round", "payload": <bench_kernels.py JSON>}]}; for each write-path row both trees'
times by round, the after tree's share of the copy bandwidth (mean) and after / before (means). --grid: the file
holds {"runs": [{"tree", "round", "payload": <bench_kernel_grid.py JSON>}]}; for each point SDPA's time (after tree)
and both trees' BF16-kernel and INT2 times (means over rounds) with after / before.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def times(runs: list[dict], tree: str) -> dict[tuple, list[dict]]:
    """(head_dim, group, batch, ctx, format) -> that tree's rows, one per round."""
    found = defaultdict(list)
    for run in runs:
        if run["tree"] == tree:
            for row in run["payload"]["rows"]:
                found[row["head_dim"], row["group"], row["batch"], row["ctx"], row["format"]].append(row)
    return found


def table(runs: list[dict], before: str, after: str) -> list[str]:
    old, new = times(runs, before), times(runs, after)
    lines = [f"| head_dim | group | batch | ctx | format | {before} ms | {after} ms | {after} of copy | "
             f"{after} vs SDPA | {before} vs SDPA | {after} / {before} |", "|" + "---|" * 11]
    for key in new:
        if key[4].startswith("bf16") or key not in old:
            continue
        sdpa = statistics.mean(r["ms"] for r in new[key[:4] + ("bf16 (SDPA)",)])
        sdpa_old = statistics.mean(r["ms"] for r in old[key[:4] + ("bf16 (SDPA)",)])
        b, a = (statistics.mean(r["ms"] for r in rows) for rows in (old[key], new[key]))
        spread = (" (" + " / ".join(f"{r['ms']:.3f}" for r in rows) + ")" for rows in (old[key], new[key]))
        of_copy = statistics.mean(r["of_copy"] for r in new[key])
        lines.append(f"| {' | '.join(map(str, key))} | {b:.3f}{next(spread)} | {a:.3f}{next(spread)} | "
                     f"{of_copy:.0%} | {sdpa / a:.2f}x | {sdpa_old / b:.2f}x | {a / b:.2f} |")
    return lines


THROUGHPUT_COLUMNS = ("quantizer", "batch", "ms_per_step", "tokens_per_s", "peak_gb", "floor_ms", "of_floor")


def throughput_table(runs: list[dict]) -> list[str]:
    """One line per bench_throughput.py row (the batch rows, then the same-budget rows) of every run."""
    lines = ["| run | tree | " + " | ".join(THROUGHPUT_COLUMNS) + " | same budget: throughput vs BF16 |",
             "|" + "---|" * (len(THROUGHPUT_COLUMNS) + 3)]
    for run in runs:
        payload = run["payload"]
        for kind in ("rows", "same_budget"):
            for row in payload[kind]:
                ratio = "" if kind == "rows" else next((v for k, v in row.items() if k.startswith("throughput_vs")), "")
                cells = " | ".join(str(row[c]) for c in THROUGHPUT_COLUMNS)
                lines.append(f"| {run['round']} | {run['tree']} | {cells} | {ratio} |")
    return lines


def write_table(runs: list[dict], before: str, after: str) -> list[str]:
    """One line per bench_kernels.py write-path row (what, shape) found in both trees' runs."""
    found = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for row in run["payload"]["write"]:
            found[row["what"], str(row["shape"])][run["tree"]].append(row)
    lines = [f"| write path | x shape | {before} ms | {after} ms | {after} of copy | {after} / {before} |",
             "|" + "---|" * 6]
    for (what, shape), by_tree in found.items():
        if before not in by_tree or after not in by_tree:
            continue
        b, a = (statistics.mean(r["ms"] for r in by_tree[t]) for t in (before, after))
        cells = (" / ".join(f"{r['ms']:.4f}" for r in by_tree[t]) for t in (before, after))
        of_copy = statistics.mean(r["of_copy"] for r in by_tree[after])
        lines.append(f"| {what} | {shape} | {next(cells)} | {next(cells)} | {of_copy:.0%} | {a / b:.2f} |")
    return lines


GRID_CALLS = ("bf16_kernel", "int2")


def grid_table(runs: list[dict], before: str, after: str) -> list[str]:
    """One line per bench_kernel_grid.py point in both trees' runs: SDPA (after), then per call before / after."""
    found = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for row in run["payload"]["rows"]:
            found[row["head_dim"], row["group"], row["batch"], row["ctx"]][run["tree"]].append(row)
    header = " | ".join(f"{c} {before} us | {c} {after} us | {c} {after} / {before}" for c in GRID_CALLS)
    lines = [f"| head_dim | group | batch | ctx | SDPA us | {header} |", "|" + "---|" * (5 + 3 * len(GRID_CALLS))]
    for point, by_tree in sorted(found.items()):
        if before not in by_tree or after not in by_tree:
            continue
        cells = [f"{statistics.mean(r['sdpa_ms'] for r in by_tree[after]) * 1e3:.1f}"]
        for call in GRID_CALLS:
            b, a = (statistics.mean(r[f"{call}_ms"] for r in by_tree[t]) for t in (before, after))
            cells += [f"{b * 1e3:.1f}", f"{a * 1e3:.1f}", f"{a / b:.2f}"]
        lines.append(f"| {' | '.join(map(str, point))} | {' | '.join(cells)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--call", type=int, help="bench_formats runs: the call to tabulate")
    parser.add_argument("--before", help="bench_formats, --write and --grid runs: the tree label of the baseline")
    parser.add_argument("--after", help="bench_formats, --write and --grid runs: the tree label compared with it")
    parser.add_argument("--throughput", action="store_true", help="the file holds bench_throughput.py runs")
    parser.add_argument("--write", action="store_true", help="the file holds bench_kernels.py runs (write path)")
    parser.add_argument("--grid", action="store_true", help="the file holds bench_kernel_grid.py runs")
    args = parser.parse_args()
    data = json.loads(args.runs.read_text())
    if args.throughput:
        print("\n".join(throughput_table(data["runs"])))
        return
    if args.write or args.grid:
        if not args.before or not args.after:
            parser.error("--write and --grid need --before and --after.")
        tabulate = write_table if args.write else grid_table
        print("\n".join(tabulate(data["runs"], args.before, args.after)))
        return
    if args.call is None or not args.before or not args.after:
        parser.error("bench_formats runs need --call, --before and --after.")
    call = next((c for c in data["calls"] if c["call"] == args.call), None)
    if call is None:
        parser.error(f"no call {args.call} in {args.runs}.")
    print("\n".join(table(call["runs"], args.before, args.after)))


if __name__ == "__main__":
    main()
