"""Decode attention over a grid of attention shapes (GPU): INT2 against BF16, each point in one run.

    python scripts/bench_kernel_grid.py                                   # head_dim 64/128/256 x group 1-16
    python scripts/bench_kernel_grid.py --head-dims 64 --groups 3 --batches 1,32 --ctxs 1024,102400
    python scripts/bench_kernel_grid.py --from-json a.json b.json     # no GPU: the targets and tables of saved runs
    python scripts/bench_kernel_grid.py --from-json a.json --against h100.json   # and each call's time there / here

Each point (head_dim, GQA group, batch, ctx; 8 KV heads, one query token) times three calls on the same
shape: BF16 SDPA (torch, `enable_gqa`), BF16 on the harness's kernel (`kernels.decode` with no packed
history: the whole context in its full-precision segment, what `bf16+graph` decodes with) and the INT2
kernel (64 sink + 256 recent BF16 rows, the rest packed, as bench_kernels.py: one (scale, zero) per 128 coordinates,
naive INT2's and OSCAR's layout, so two per row at head_dim 256; rows record it as int2_group, and runs without
that key had one per row at every head_dim). Timings are CUDA-graph
replays over inputs larger than L2 (bench_kernels.graph_ms). "of copy" divides the bytes a call must move
by the device-to-device copy bandwidth measured in the same run. Before timing, every shape's INT2 and
BF16 kernel calls are checked against `decode_attention_reference`. With $OUT set the rows also go to
$OUT/bench_kernel_grid.json, rewritten after every point (a run stopped early keeps the points it timed); the
Markdown table is printed last. --from-json prints, from such files of one GPU,
the issue's kernel targets (`target_summary`), each point counted once (a later file's row of a point replaces an
earlier one: a partial re-run over a full grid), then each file's table; with --against (other saved runs, e.g.
another GPU's) first, per head_dim, how many times longer INT2 and SDPA took there at the same points
(`time_ratios`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import (AttnShape, _decode_bytes, bf16_bytes, bf16_kernel_args, bf16_kernel_call,  # noqa: E402
                           copy_bandwidth, decode_call, decode_inputs, graph_ms, int_spec, point_grid, point_launch,
                           sdpa_call)
from harness.cli_args import kernel_head_dims, positive_ints  # noqa: E402
from kernels.decode import decode_attention, decode_attention_reference  # noqa: E402
from bench_out import out_file, save  # noqa: E402

KV_HEADS = 8
GRID_BATCHES, GRID_CTXS = [1, 3, 8, 32], [1024, 8192, 32768, 102400]    # the grid (with head_dim x group)


def check_shape(shape: AttnShape) -> list[str]:
    """INT2 (packed + fp segment) and BF16 (fp segment only) against the reference on short caches."""
    failures = []
    for label, (args, spec) in (("INT2", decode_inputs(3, 1000, 2, shape)[:2]),
                                ("BF16 kernel", bf16_kernel_args(3, 700, shape))):
        kw = dict(sm_scale=shape.head_dim ** -0.5, k_spec=spec, v_spec=spec)
        out, ref = decode_attention(*args, **kw).float(), decode_attention_reference(*args, **kw).float()
        err = ((out - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            failures.append(f"{label} {shape}: rel err {err:.2e}")
    return failures


def bench_point(shape: AttnShape, batch: int, ctx: int, copy_tbs: float) -> dict:
    """One grid point: ms, TB/s and fraction of the copy bandwidth of each call, INT2's speedups."""
    row = {"head_dim": shape.head_dim, "group": shape.q_heads // shape.kv_heads, "batch": batch, "ctx": ctx}
    bf16 = bf16_bytes(batch, ctx, shape)
    int2 = _decode_bytes(batch, ctx, 2, shape)
    calls = {"sdpa": (lambda _: sdpa_call(batch, ctx, shape), bf16),
             "bf16_kernel": (lambda _: bf16_kernel_call(batch, ctx, shape), bf16),
             "int2": (lambda _: decode_call(batch, ctx, 2, shape=shape), int2)}
    for name, (make, nbytes) in calls.items():
        ms = graph_ms(make, nbytes)
        row[f"{name}_ms"], row[f"{name}_of_copy"] = ms, nbytes / ms / 1e9 / copy_tbs
    row["int2_vs_sdpa"] = row["sdpa_ms"] / row["int2_ms"]
    row["int2_vs_bf16_kernel"] = row["bf16_kernel_ms"] / row["int2_ms"]
    spec = int_spec(2, shape.head_dim)
    row["grid"] = point_grid(batch, ctx, shape, spec)
    row["int2_group"] = spec.group
    row["config"] = str(point_launch(batch, ctx, shape, spec, spec))
    return row


def markdown(device: str, copy_tbs: float, rows: list[dict], date: str | None = None) -> str:
    lines = [f"Device: {device}; date {date or datetime.date.today().isoformat()}; copy bandwidth {copy_tbs:.2f} TB/s "
             f"(read + write); {KV_HEADS} KV heads, one query token.", "",
             "| head_dim | group | batch | ctx | SDPA ms | SDPA of copy | BF16 kernel ms | BF16 kernel of copy | "
             "INT2 ms | INT2 of copy | INT2 vs SDPA | INT2 vs BF16 kernel |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['head_dim']} | {r['group']} | {r['batch']} | {r['ctx']} | {r['sdpa_ms']:.3f} | "
                     f"{r['sdpa_of_copy']:.0%} | {r['bf16_kernel_ms']:.3f} | {r['bf16_kernel_of_copy']:.0%} | "
                     f"{r['int2_ms']:.3f} | {r['int2_of_copy']:.0%} | {r['int2_vs_sdpa']:.2f}x | "
                     f"{r['int2_vs_bf16_kernel']:.2f}x |")
    return "\n".join(lines)


def _span(values: list[float], fmt: str) -> str:
    return "-" if not values else f"{min(values):{fmt}}-{max(values):{fmt}}"


def median_span(ratios: list[float]) -> str:
    """'median (min-max)' of time ratios, two decimals; '-' without any."""
    return f"{statistics.median(ratios):.2f} ({_span(ratios, '.2f')})" if ratios else "-"


def _points(rows: list[dict]) -> str:
    """Grid points as 'head_dim/group/batch/ctx', comma-separated."""
    return ", ".join(f"{r['head_dim']}/{r['group']}/{r['batch']}/{r['ctx']}" for r in rows) or "none"


def target_summary(rows: list[dict], call: str = "int2", label: str = "INT2", fivefold: bool = True) -> str:
    """The issue's kernel targets over grid rows for the packed call `call` (rows hold f"{call}_vs_sdpa" and
    f"{call}_of_copy"; `label` names it): per head_dim and ctx the span of its speed against SDPA, the points below
    it and its share of the copy bandwidth at batch >= 8; then each target's count with the points that meet (or,
    for the first, miss) it, as head_dim/group/batch/ctx. fivefold: also the 5x target at batch 32 / 100k (a 2-bit
    format's)."""
    ratio, share = f"{call}_vs_sdpa", f"{call}_of_copy"
    lines = [f"| head_dim | ctx | {label} vs SDPA (min-max) | points below SDPA | "
             f"{label} of copy, batch >= 8 (min-max) |",
             "|---|---|---|---|---|"]
    for d in sorted({r["head_dim"] for r in rows}):
        for ctx in sorted({r["ctx"] for r in rows if r["head_dim"] == d}):
            at = [r for r in rows if r["head_dim"] == d and r["ctx"] == ctx]
            below = sum(r[ratio] < 1 for r in at)
            lines.append(f"| {d} | {ctx} | {_span([r[ratio] for r in at], '.2f')}x | {below} of {len(at)} | "
                         f"{_span([r[share] for r in at if r['batch'] >= 8], '.0%')} |")
    below = [r for r in rows if r[ratio] < 1]
    long = [r for r in rows if r["ctx"] >= 32768 and r["batch"] >= 8]
    near_copy = [r for r in long if r[share] >= 0.8]
    lines += ["", f"{label} >= BF16 SDPA at {len(rows) - len(below)} of {len(rows)} points; below: {_points(below)}.",
              f">= 80 % of the copy bandwidth at ctx >= 32k and batch >= 8: {len(near_copy)} of {len(long)} points: "
              f"{_points(near_copy)}."]
    if fivefold:
        largest = [r for r in rows if r["batch"] == 32 and r["ctx"] >= 100_000]
        five = [r for r in largest if r[ratio] >= 5]
        lines.append(f">= 5x BF16 SDPA at batch 32 / ctx >= 100k: {len(five)} of {len(largest)} points: "
                     f"{_points(five)}.")
    return "\n".join(lines)


def _point(row: dict) -> tuple[int, int, int, int]:
    return row["head_dim"], row["group"], row["batch"], row["ctx"]


def time_ratios(rows: list[dict], baseline: list[dict]) -> str:
    """Per head_dim, the baseline rows' time over these rows' time for the INT2 kernel and for SDPA (median and
    range) at the points both hold (a later baseline row of a point replaces an earlier one)."""
    before = {_point(r): r for r in baseline}
    lines = ["| head_dim | points | INT2: baseline ms / these ms, median (min-max) | SDPA: the same |",
             "|---|---|---|---|"]
    for d in sorted({r["head_dim"] for r in rows}):
        pairs = [(before[_point(r)], r) for r in rows if r["head_dim"] == d and _point(r) in before]
        if not pairs:
            continue
        cells = []
        for call in ("int2", "sdpa"):
            ratios = [b[f"{call}_ms"] / r[f"{call}_ms"] for b, r in pairs]
            cells.append(median_span(ratios))
        lines.append(f"| {d} | {len(pairs)} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def describe_runs(payloads: list[dict]) -> str:
    """Each saved run as 'device, date, head_dim [...]', '; '-separated."""
    return "; ".join(f"{p['device']}, {p['date']}, head_dim {sorted({r['head_dim'] for r in p['rows']})}"
                     for p in payloads)


def newest_rows(payloads: list[dict]) -> tuple[list[dict], int]:
    """The saved runs' rows, one per grid point: a later run's row of a point replaces an earlier one (a partial
    re-run over a full grid) -> (rows, how many were replaced)."""
    by_point = {}
    for payload in payloads:
        by_point.update({_point(r): r for r in payload["rows"]})
    return list(by_point.values()), sum(len(p["rows"]) for p in payloads) - len(by_point)


def read_runs(paths: list[str], flag: str, row_key: str) -> list[dict]:
    """The saved runs at `paths`, each refused in one sentence unless it is a JSON run (device, copy_tbs, date, rows)
    whose rows hold `row_key` (another script's run, say)."""
    payloads = []
    for path in paths:
        try:
            payload = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{flag}: {path} is not a readable JSON file ({exc.__class__.__name__}).") from None
        run = isinstance(payload, dict) and {"device", "copy_tbs", "date"} <= payload.keys() and \
            isinstance(payload.get("rows"), list) and all(isinstance(r, dict) and row_key in r for r in payload["rows"])
        if not run:
            raise SystemExit(f"{flag}: {path} is not a run of this script (its rows need '{row_key}').")
        payloads.append(payload)
    return payloads


def one_device(payloads: list[dict], flag: str) -> None:
    """Refuse, in one sentence, runs of different GPUs counted together."""
    devices = sorted({p["device"] for p in payloads})
    if len(devices) > 1:
        raise SystemExit(f"{flag}: these runs come from different GPUs ({', '.join(devices)}); count each GPU's runs "
                         f"apart, or compare them with --against.")


def from_json(paths: list[str], against: list[str] | None = None) -> str:
    """The targets over the saved runs' rows (one per point, the last file's: `newest_rows`), the time ratios
    against other runs if given, then each run's table (what --from-json prints)."""
    payloads = read_runs(paths, "--from-json", "int2_ms")
    one_device(payloads, "--from-json")
    rows, replaced = newest_rows(payloads)
    parts = [target_summary(rows)]
    if replaced:
        parts.append(f"{replaced} rows of earlier files were replaced by a later file's row of the same point: the "
                     f"targets count each point once, from the last file that holds it.")
    if against:
        baseline = read_runs(against, "--against", "int2_ms")
        parts += [f"Against {describe_runs(baseline)} (these runs: {describe_runs(payloads)}):",
                  time_ratios(rows, [r for p in baseline for r in p["rows"]])]
    parts += [markdown(p["device"], p["copy_tbs"], p["rows"], p["date"]) for p in payloads]
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=kernel_head_dims, default=[64, 128, 256])
    parser.add_argument("--groups", type=positive_ints, default=[1, 3, 4, 8, 12, 16], help="query heads per KV head")
    parser.add_argument("--batches", type=positive_ints, default=GRID_BATCHES)
    parser.add_argument("--ctxs", type=positive_ints, default=GRID_CTXS)
    parser.add_argument("--from-json", nargs="+", metavar="FILE", help="print saved runs' targets and tables; no GPU")
    parser.add_argument("--against", nargs="+", metavar="FILE",
                        help="with --from-json: saved runs to compare each point's times with")
    args = parser.parse_args()
    if args.against and not args.from_json:
        parser.error("--against compares saved runs: give them with --from-json.")
    if args.from_json:
        for flag, paths in (("--from-json", args.from_json), ("--against", args.against or [])):
            missing = [p for p in paths if not Path(p).is_file()]
            if missing:
                raise SystemExit(f"{flag}: no such file: {', '.join(missing)}.")
        print(from_json(args.from_json, args.against))
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernel_grid.py needs a CUDA GPU.")
    out = out_file("bench_kernel_grid.json")
    shapes = [AttnShape(g * KV_HEADS, KV_HEADS, d) for d in args.head_dims for g in args.groups]
    failures = [f for shape in shapes for f in check_shape(shape)]
    print("correctness:", "all passed" if not failures else failures, flush=True)
    copy_tbs = copy_bandwidth()
    print(f"copy bandwidth: {copy_tbs:.4f} TB/s", flush=True)
    device, rows = torch.cuda.get_device_name(), []
    payload = {"device": device, "date": datetime.date.today().isoformat(), "argv": sys.argv,
               "copy_tbs": copy_tbs, "failures": failures, "rows": rows}
    for shape in shapes:
        for batch in args.batches:
            for ctx in args.ctxs:
                rows.append(bench_point(shape, batch, ctx, copy_tbs))
                print("row:", json.dumps(rows[-1]), flush=True)
                save(out, payload)
    print(markdown(device, copy_tbs, rows))


if __name__ == "__main__":
    main()
