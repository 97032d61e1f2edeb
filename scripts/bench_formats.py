"""Decode attention of every stored format on its own kernels (GPU): INT2, INT4, KIVI-2, TurboQuant K3V3 beside BF16.

    python scripts/bench_formats.py                                        # 3 attention shapes x 3 points
    python scripts/bench_formats.py --head-dims 128 --points 32:102400 --formats int2,turboquant_k3v3
    python scripts/bench_formats.py --formats turboquant_k3v3 --launch 'block_n=128;num_warps=8'   # launch variants
    python scripts/bench_formats.py --formats int2 --q-tokens 4      # a verification step: 4 tokens per sequence
    python scripts/bench_formats.py --formats int2 --head-dims 256 --groups 4 --kv-heads 1 --points grid
                                                                       # a model's own heads (Gemma 3 270M's 4 / 1)
    python scripts/bench_formats.py --formats int4,kivi2 --groups 1,3,4,8,12,16 --head-dims 128 --points grid
                                                                       # bench_kernel_grid.py's grid, per format
    python scripts/bench_formats.py --from-json a.json b.json          # no GPU: each format's targets, the tables
    python scripts/bench_formats.py --from-json after.json --against before.json   # and each format's time there / here
    python scripts/bench_formats.py --from-json run.json --variant-ratios   # each variant's time / its default's
    python scripts/bench_formats.py --grid-only --from-json $(grep -v '^#' results/bench/bench_formats_h200_grid.txt)
                                                                       # the H200 grid's targets, newest row per point

Each format is a quantizer's stored layout (configs/quantizer/<name>.yaml, its `key_spec` / `value_spec` and
`kernel_ops()`, as the cache decodes it): int2 is OSCAR's and naive INT2's (2 bits, an fp16 scale/zero per token
group of 128: one group at head_dim <= 128, two at 256, Gemma 3's), int4 SAW-INT4's and INT4's (group 128), kivi2
KIVI's per-channel keys (groups of 32 tokens) with per-token value groups of 32, turboquant_k3v3 vLLM's 3-bit tight
rows with an fp16 key norm; kivi2 runs its default launch (`kernels.decode.default_launch`: per-channel keys on warp
tiles, whole 32-token key groups per warp), kivi2_rowmajor the same format on the row-major loop that was its default
before; kivi4 / kivi4_rowmajor the same for KIVI's 4-bit layout. The history is random stored parts of the format's
shapes (`part_shapes`: random code bytes, positive scales), with a BF16 sink + recent segment of 64 + 256 rows as
bench_kernels.py uses; timings are CUDA-graph replays over inputs larger than L2 (bench_kernels.graph_ms) beside BF16
SDPA on the same shape in the same run. "of copy" divides the bytes the call must move (every stored part, the BF16
segment, q and out) by the device-to-device copy bandwidth measured in the run. Before timing, each format's default
call at every shape and at each batch of the points (a 1k context) is checked against `attention_reference` over the
quantizer's own dequantization of the same parts ("correctness:"; launch variants are not); the kernel tests
(tests/test_kernels_decode.py, tests/test_turboquant_kernels.py with TRITON_INTERPRET=0) are the full check. With
$OUT set the rows also go to $OUT/bench_formats.json; the Markdown table is printed last. --from-json prints, from such
files of one GPU, each format's kernel targets as bench_kernel_grid.py counts INT2's (`format_targets`; with
--grid-only over the must-show grid's batch x ctx points only), with --variant-ratios each launch variant's time over
its default's at the same points of the same run (`variant_time_ratios`), then with --against (earlier runs of the
same GPU) each format's time there over its time here (`format_time_ratios`), then each file's table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import fields, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import (KV_HEADS, RECENT, SINK, AttnShape, bf16_bytes, bf16_kernel_call,  # noqa: E402
                           copy_bandwidth, decode_args, graph_ms, point_grid, point_launch, sdpa_call)
from bench_kernel_grid import (GRID_BATCHES, GRID_CTXS, describe_runs, median_span, one_device,  # noqa: E402
                               read_runs, target_summary)
from harness.cli_args import (batch_ctx_points, kernel_head_dims, positive_int,  # noqa: E402
                              positive_ints)
from harness.quantizer import build_quantizer  # noqa: E402
from kernels.decode import default_config, per_token_layouts  # noqa: E402
from kernels.decode.common import WARP_TILE_ROWS  # noqa: E402
from kernels.decode.launch import DecodeConfig  # noqa: E402
from kernels.decode.reference import attention_reference  # noqa: E402
from kernels.format import QuantizedTensor  # noqa: E402
from kernels.turbo.decode import gpu_config as turbo_gpu_config  # noqa: E402
from bench_out import out_file, save  # noqa: E402

FORMATS = {"int2": "naive_int2", "int4": "saw_int4", "kivi2": "kivi2", "turboquant_k3v3": "turboquant_k3v3",
           "kivi2_rowmajor": "kivi2", "kivi4": "kivi4", "kivi4_rowmajor": "kivi4"}
CHECK_CTX = SINK + RECENT + 704    # `check_format`'s context: 704 packed rows (whole 32-token KIVI key groups)
LAUNCH_CHANGES = {"kivi2_rowmajor": {}, "kivi4_rowmajor": {}}   # changes of default_config (which never puts
                                                                # channel keys on warp tiles)


def random_parts(ops, shape: list[int], spec, device: str = "cuda") -> tuple[torch.Tensor, ...]:
    """(codes, scale, zero) of the format's stored shapes: random code bytes, positive fp metadata."""
    parts = []
    for name, (size, dtype) in ops.part_shapes(shape, spec).items():
        if dtype == torch.uint8:
            parts.append(torch.randint(0, 256, size, dtype=dtype, device=device))
        else:
            parts.append((torch.rand(size, device=device) * 0.2 + 0.05).to(dtype))
    return tuple(parts)


def stored_format(fmt: str, head_dim: int):
    """(quantizer resolved for head_dim, its kernels) of one format."""
    quantizer = build_quantizer(FORMATS[fmt])
    quantizer._resolve(head_dim)
    return quantizer, quantizer.kernel_ops()


def format_bytes(fmt: str, batch: int, ctx: int, shape: AttnShape) -> int:
    """Bytes one decode call must move: every stored part of K and V, the BF16 segment, q and out."""
    quantizer, ops = stored_format(fmt, shape.head_dim)
    hist = [batch, shape.kv_heads, ctx - SINK - RECENT, shape.head_dim]
    stored = sum(torch.Size(size).numel() * dtype.itemsize for spec in (quantizer.key_spec, quantizer.value_spec)
                 for size, dtype in ops.part_shapes(hist, spec).values())
    fp_segment = 2 * batch * shape.kv_heads * (SINK + RECENT) * shape.head_dim * 2
    return stored + fp_segment + 2 * batch * shape.q_heads * shape.q_tokens * shape.head_dim * 2


def format_launch(fmt: str, batch: int, ctx: int, shape: AttnShape, quantizer) -> DecodeConfig:
    """The launch a format's decode call takes by default at this point (what `--launch` variants change)."""
    d, k_spec, v_spec = shape.head_dim, quantizer.key_spec, quantizer.value_spec
    grid, rows = point_grid(batch, ctx, shape), shape.rows
    if fmt == "turboquant_k3v3":
        return turbo_gpu_config(d, grid, ctx - SINK - RECENT)
    if fmt in LAUNCH_CHANGES:
        return replace(default_config(d, True, grid, per_token_layouts(k_spec, v_spec, d), rows), **LAUNCH_CHANGES[fmt])
    return point_launch(batch, ctx, shape, k_spec, v_spec)


def format_inputs(fmt: str, batch: int, ctx: int, shape: AttnShape, changes: dict | None = None,
                  device: str = "cuda"):
    """(quantizer, kernels, decode_attention's positional arguments, its keywords) of one format on fresh random
    stored parts of one point (`changes`: fields of its default launch to change)."""
    quantizer, ops = stored_format(fmt, shape.head_dim)
    d, heads, n_hist = shape.head_dim, shape.kv_heads, ctx - SINK - RECENT
    k_parts = random_parts(ops, [batch, heads, n_hist, d], quantizer.key_spec, device)
    v_parts = random_parts(ops, [batch, heads, n_hist, d], quantizer.value_spec, device)
    args = decode_args(batch, ctx, shape, k_parts, v_parts)
    spec_kw = dict(sm_scale=d ** -0.5, k_spec=quantizer.key_spec, v_spec=quantizer.value_spec)
    if changes or fmt in LAUNCH_CHANGES:
        spec_kw["config"] = replace(format_launch(fmt, batch, ctx, shape, quantizer), **(changes or {}))
    return quantizer, ops, args, spec_kw


def format_call(fmt: str, batch: int, ctx: int, shape: AttnShape, changes: dict | None = None):
    """A zero-argument decode call of one format on fresh random stored parts of one point."""
    _, ops, args, spec_kw = format_inputs(fmt, batch, ctx, shape, changes)
    return lambda: ops.decode_attention(*args, **spec_kw)


def check_format(fmt: str, shape: AttnShape, batch: int, ctx: int = CHECK_CTX, device: str = "cuda") -> list[str]:
    """The format's default decode call on random stored parts against `attention_reference` over the quantizer's own
    dequantization of the same parts (relative error < 1e-2: fp16 dot operands): [] or one failure line (a launch
    error too). device "cpu": the kernels under TRITON_INTERPRET (the tests)."""
    quantizer, ops, args, spec_kw = format_inputs(fmt, batch, ctx, shape, device=device)
    d = shape.head_dim
    k_hist, v_hist = (quantizer.dequantize(QuantizedTensor(*args[i:i + 3], spec, d)).float()
                      for i, spec in ((1, quantizer.key_spec), (4, quantizer.value_spec)))
    ref = attention_reference(args[0], k_hist, v_hist, *args[7:], sm_scale=spec_kw["sm_scale"]).float()
    try:
        out = ops.decode_attention(*args, **spec_kw).float()
    except Exception as exc:                                       # noqa: BLE001 (reported, the run goes on)
        return [f"{fmt} {shape} batch {batch} ctx {ctx}: {str(exc).splitlines()[0][:100]}"]
    err = ((out - ref).norm() / ref.norm()).item()
    return [] if err < 1e-2 else [f"{fmt} {shape} batch {batch} ctx {ctx}: rel err {err:.2e}"]


def format_points(text: str) -> list[tuple[int, int]]:
    """argparse type of --points: 'batch:ctx,...' (`batch_ctx_points`), or 'grid': bench_kernel_grid.py's 16 points
    (batch 1 / 3 / 8 / 32 at each ctx)."""
    if text == "grid":
        return [(batch, ctx) for ctx in GRID_CTXS for batch in GRID_BATCHES]
    return batch_ctx_points(text)


LAUNCH_WORDS = {"true": True, "false": False}
OPTIONAL_LAUNCH_FIELDS = ("maxnreg", "warp_rows")   # DecodeConfig fields whose None `--launch` writes as 'none'


def parse_launches(text: str) -> list[dict]:
    """'block_n=128,num_warps=8;num_stages=3' -> [{'block_n': 128, 'num_warps': 8}, {'num_stages': 3}] (integer
    or true/false fields of DecodeConfig; 'none' for OPTIONAL_LAUNCH_FIELDS: maxnreg=none is no register cap, which
    maxnreg=255 is not)."""
    known = {f.name for f in fields(DecodeConfig)}
    variants = []
    for part in filter(None, text.split(";")):
        changes = {}
        for item in part.split(","):
            name, _, value = item.partition("=")
            if name not in known:
                raise SystemExit(f"--launch: unknown DecodeConfig field '{name}'; known: {', '.join(sorted(known))}.")
            if value == "none" and name in OPTIONAL_LAUNCH_FIELDS:
                changes[name] = None
            elif value in LAUNCH_WORDS:
                changes[name] = LAUNCH_WORDS[value]
            elif value.lstrip("-").isdigit():
                changes[name] = int(value)
            else:
                other = " or none" if name in OPTIONAL_LAUNCH_FIELDS else ""
                raise SystemExit(f"--launch: {name} needs an integer or true/false{other}, got '{value}'.")
        variants.append(changes)
    return variants


def bench_point(shape: AttnShape, batch: int, ctx: int, formats: list[str], copy_tbs: float,
                launches: list[dict] = ()) -> list[dict]:
    """Rows of one (shape, batch, ctx): BF16 SDPA first, BF16 on the harness's decode kernel (every row in its
    full-precision segment, as `bf16+graph` decodes), then each format (at its default launch, then at each of
    `launches`) with its speedup over SDPA."""
    base = {"head_dim": shape.head_dim, "group": shape.q_heads // shape.kv_heads, "kv_heads": shape.kv_heads,
            "q_tokens": shape.q_tokens, "batch": batch, "ctx": ctx}
    bf16 = bf16_bytes(batch, ctx, shape)
    sdpa_ms = graph_ms(lambda _: sdpa_call(batch, ctx, shape), bf16)
    kernel_ms = graph_ms(lambda _: bf16_kernel_call(batch, ctx, shape), bf16)
    rows = [{**base, "format": "bf16 (SDPA)", "ms": sdpa_ms, "of_copy": bf16 / sdpa_ms / 1e9 / copy_tbs,
             "vs_sdpa": 1.0},
            {**base, "format": "bf16 (kernel)", "ms": kernel_ms, "of_copy": bf16 / kernel_ms / 1e9 / copy_tbs,
             "vs_sdpa": sdpa_ms / kernel_ms}]
    for fmt, changes in [(fmt, changes) for fmt in formats for changes in ({}, *launches)]:
        label = fmt + (" [" + " ".join(f"{k}={v}" for k, v in changes.items()) + "]" if changes else "")
        try:
            nbytes = format_bytes(fmt, batch, ctx, shape)
            ms = graph_ms(lambda _, fmt=fmt, changes=changes: format_call(fmt, batch, ctx, shape, changes), nbytes)
        except Exception as exc:                                   # noqa: BLE001 (a format may not launch here)
            torch.cuda.empty_cache()
            rows.append({**base, "format": label, "error": str(exc).splitlines()[0][:100]})
            continue
        rows.append({**base, "format": label, "ms": ms, "of_copy": nbytes / ms / 1e9 / copy_tbs,
                     "vs_sdpa": sdpa_ms / ms})
    return rows


def kv_heads(rows: list[dict]) -> str:
    """The KV heads of a run's rows (runs before --kv-heads have 8: KV_HEADS)."""
    return ", ".join(str(n) for n in sorted({r.get("kv_heads", KV_HEADS) for r in rows}))


def markdown(device: str, copy_tbs: float, rows: list[dict], q_tokens: int = 1, date: str | None = None) -> str:
    tokens = "one query token" if q_tokens == 1 else f"{q_tokens} query tokens per sequence (causal, lower-right)"
    lines = [f"Device: {device}; date {date or datetime.date.today().isoformat()}; copy bandwidth {copy_tbs:.2f} TB/s "
             f"(read + write); {kv_heads(rows)} KV heads, {tokens}.", "",
             "| head_dim | group | batch | ctx | format | ms | of copy | vs BF16 SDPA |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        key = f"| {r['head_dim']} | {r['group']} | {r['batch']} | {r['ctx']} | {r['format']} |"
        if "error" in r:
            lines.append(f"{key} failed: {r['error']} | | |")
        else:
            lines.append(f"{key} {r['ms']:.3f} | {r['of_copy']:.0%} | {r['vs_sdpa']:.2f}x |")
    return "\n".join(lines)


def format_targets(rows: list[dict]) -> str:
    """bench_kernel_grid's kernel targets (`target_summary`) for each packed format of one-query-token rows at its
    default launch (no --launch variant), each point counted once (a later row replaces an earlier one); the 5x
    target for 2-bit formats only; rows that failed to launch are listed, not counted."""
    parts = []
    timed = [r for r in rows if r.get("q_tokens", 1) == 1 and r["format"] in FORMATS]
    for fmt in dict.fromkeys(r["format"] for r in timed):
        failed = [r for r in timed if r["format"] == fmt and "error" in r]
        points = {(r["head_dim"], r["group"], r["batch"], r["ctx"]): {
            **{k: r[k] for k in ("head_dim", "group", "batch", "ctx")},
            f"{fmt}_vs_sdpa": r["vs_sdpa"], f"{fmt}_of_copy": r["of_copy"]}
            for r in timed if r["format"] == fmt and "error" not in r}
        two_bit = stored_format(fmt, 128)[0].key_spec.bits == 2
        parts.append(f"{fmt}:\n\n" + target_summary(list(points.values()), fmt, fmt, fivefold=two_bit))
        if failed:
            parts.append(f"{fmt} failed to launch at: " + ", ".join(
                f"{r['head_dim']}/{r['group']}/{r['batch']}/{r['ctx']} ({r['error']})" for r in failed) + ".")
    return "\n\n".join(parts)


def _timed_points(rows: list[dict]) -> dict[tuple, dict]:
    """One-query-token rows that ran, by (format, head_dim, group, batch, ctx); a later row replaces an earlier one."""
    return {(r["format"], r["head_dim"], r["group"], r["batch"], r["ctx"]): r for r in rows
            if r.get("q_tokens", 1) == 1 and "ms" in r}


def format_time_ratios(rows: list[dict], baseline: list[dict]) -> str:
    """Per format (launch variants included) and (head_dim, group): the baseline rows' time over these rows' time,
    median and range, at the points both hold, beside BF16 SDPA's ratio at the same points (the run-to-run
    control)."""
    here, before = _timed_points(rows), _timed_points(baseline)
    lines = ["| format | head_dim | group | points | baseline ms / these ms, median (min-max) | SDPA: the same |",
             "|---|---|---|---|---|---|"]
    shared = sorted(key for key in here if key in before and key[0] != "bf16 (SDPA)")
    for fmt, d, group in dict.fromkeys(key[:3] for key in shared):
        at = [key for key in shared if key[:3] == (fmt, d, group)]
        cells = []
        for name in (fmt, "bf16 (SDPA)"):
            ratios = [before[(name, *key[1:])]["ms"] / here[(name, *key[1:])]["ms"] for key in at
                      if (name, *key[1:]) in before and (name, *key[1:]) in here]
            cells.append(median_span(ratios))
        lines.append(f"| {fmt} | {d} | {group} | {len(at)} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def variant_time_ratios(payloads: list[dict]) -> str:
    """Each --launch variant's time over its format's default launch at the same point of the same run, as median
    (min-max) over the groups at each (head_dim, batch, ctx), groups of up to WARP_TILE_ROWS query rows apart from
    the wider ones (other programs); "" when no run holds a variant."""
    spans: dict[tuple, list[tuple[int, float]]] = {}
    for payload in payloads:
        points = _timed_points(payload["rows"])
        for (name, d, group, batch, ctx), row in points.items():
            default = points.get((name.split(" [")[0], d, group, batch, ctx))
            if " [" in name and default:
                key = (name, d, group > WARP_TILE_ROWS, batch, ctx)
                spans.setdefault(key, []).append((group, row["ms"] / default["ms"]))
    if not spans:
        return ""
    lines = ["Launch variants, time over the default launch's (same point, same run):", "",
             "| variant | head_dim | groups | batch | ctx | points | variant ms / default ms, median (min-max) |",
             "|---|---|---|---|---|---|---|"]
    for (name, d, _, batch, ctx), pairs in sorted(spans.items()):
        groups = ", ".join(str(g) for g in sorted({g for g, _ in pairs}))
        lines.append(f"| {name} | {d} | {groups} | {batch} | {ctx} | {len(pairs)} | "
                     f"{median_span([r for _, r in pairs])} |")
    return "\n".join(lines)


def on_grid(row: dict) -> bool:
    """A row at one of the must-show grid's batch x ctx points (bench_kernel_grid.py's GRID_BATCHES x GRID_CTXS)."""
    return row["batch"] in GRID_BATCHES and row["ctx"] in GRID_CTXS


def from_json(paths: list[str], against: list[str] | None = None, grid_only: bool = False,
              variants: bool = False) -> str:
    """What --from-json prints: the targets of each format over the saved runs' rows (grid_only: over the rows at the
    must-show grid's points), with variants each launch variant's time over its default's, with --against each
    format's time ratios against those runs, then each run's table."""
    payloads = read_runs(paths, "--from-json", "format")
    one_device(payloads, "--from-json")
    rows = [r for p in payloads for r in p["rows"]]
    parts = [format_targets([r for r in rows if on_grid(r)] if grid_only else rows)]
    if variants:
        parts.append(variant_time_ratios(payloads) or "No launch variants in these runs.")
    if against:
        baselines = read_runs(against, "--against", "format")
        parts.append(f"Against {describe_runs(baselines)}:\n\n" +
                     format_time_ratios(rows, [r for p in baselines for r in p["rows"]]))
    parts += [markdown(p["device"], p["copy_tbs"], p["rows"], p["rows"][0].get("q_tokens", 1), p["date"])
              for p in payloads]
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=kernel_head_dims, default=[64, 128, 256])
    parser.add_argument("--groups", "--group", type=positive_ints, default=[4], help="query heads per KV head")
    parser.add_argument("--points", type=format_points, default=[(1, 32768), (8, 32768), (32, 102400)],
                        help="batch:ctx,... or 'grid' (bench_kernel_grid.py's 16 points)")
    parser.add_argument("--kv-heads", type=positive_int, default=KV_HEADS,
                        help="KV heads per sequence (8: the grid's; a model's own, e.g. Gemma 3 270M's 1)")
    parser.add_argument("--q-tokens", type=positive_int, default=1,
                        help="query tokens per sequence (a verification step)")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--launch", default="", help="launch variants of every format, e.g. "
                        "'block_n=128,num_warps=8;num_stages=3' (DecodeConfig fields changed from its default)")
    parser.add_argument("--from-json", nargs="+", metavar="FILE", help="print saved runs' targets and tables; no GPU")
    parser.add_argument("--against", nargs="+", metavar="FILE",
                        help="with --from-json: earlier runs to compare each format's time with")
    parser.add_argument("--grid-only", action="store_true",
                        help="with --from-json: count the targets over the must-show grid's batch x ctx points only")
    parser.add_argument("--variant-ratios", action="store_true",
                        help="with --from-json: each launch variant's time over its default's (same point, same run)")
    args = parser.parse_args()
    if args.against and not args.from_json:
        raise SystemExit("--against compares saved runs: give the runs to compare with --from-json.")
    if args.grid_only and not args.from_json:
        raise SystemExit("--grid-only counts saved runs' targets: give the runs with --from-json.")
    if args.variant_ratios and not args.from_json:
        raise SystemExit("--variant-ratios reads saved runs: give the runs with --from-json.")
    if args.from_json:
        for flag, paths in (("--from-json", args.from_json), ("--against", args.against or [])):
            missing = [p for p in paths if not Path(p).is_file()]
            if missing:
                raise SystemExit(f"{flag}: no such file: {', '.join(missing)}.")
        print(from_json(args.from_json, args.against, args.grid_only, args.variant_ratios))
        return
    launches = parse_launches(args.launch)
    if not torch.cuda.is_available():
        raise SystemExit("bench_formats.py needs a CUDA GPU.")
    out = out_file("bench_formats.json")
    formats = args.formats.split(",")
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise SystemExit(f"Unknown format(s) {unknown}; known: {', '.join(FORMATS)}.")
    shapes = [AttnShape(g * args.kv_heads, args.kv_heads, d, args.q_tokens) for d in args.head_dims
              for g in args.groups]
    batches = sorted({batch for batch, _ in args.points})           # each batch's launch family, at a 1k context
    failures = [f for shape in shapes for fmt in formats for batch in batches for f in check_format(fmt, shape, batch)]
    print("correctness:", "all passed" if not failures else failures, flush=True)
    copy_tbs = copy_bandwidth()
    print(f"copy bandwidth: {copy_tbs} TB/s", flush=True)          # a log cut short keeps what its rows need
    device, rows = torch.cuda.get_device_name(), []
    payload = {"device": device, "date": datetime.date.today().isoformat(), "argv": sys.argv,
               "copy_tbs": copy_tbs, "failures": failures, "rows": rows}
    for shape in shapes:
        for batch, ctx in args.points:
            point_rows = bench_point(shape, batch, ctx, formats, copy_tbs, launches)
            rows += point_rows
            print("rows:", json.dumps(point_rows), flush=True)
            save(out, payload)
    print(markdown(device, copy_tbs, rows, args.q_tokens))


if __name__ == "__main__":
    main()
