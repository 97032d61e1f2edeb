"""Benchmark the Triton KV kernels on a GPU: decode attention (INT2/INT4 vs BF16 SDPA) and the write path.

Run on the GPU box from the repo root (needs only torch, triton, kernels/ and oscar/quantize.py):

    python scripts/bench_kernels.py            # full table: Qwen3-8B shapes, batch 1/8/32, ctx 8k/32k/128k
    python scripts/bench_kernels.py --quick    # tiny smoke run
    python scripts/dev/sweep_decode_tiles.py       # decode tile / split variants: a script of its own

Decode shapes: 32 query heads, 8 KV heads, head_dim 128, one query token, a BF16 segment of
64 sink + 256 recent tokens and ctx - 320 packed history tokens (fp16 scale/zero per INT_GROUP coordinates of a
token row, naive INT2's and OSCAR's groups: one per row up to head_dim 128, two at 256). Each kernel's TB/s counts
the bytes it must read (codes + metadata + fp segment + q) and write (out); "of copy" divides by the
device-to-device copy bandwidth measured in the same run (bytes read + written). Timings are
`triton.testing.do_bench` medians of CUDA-graph replays that run the call over enough independent input sets to exceed L2 (no launch overhead, no cache reuse);
the eager host cost per call is reported separately (launch_us in the JSON). Before timing, the kernels are checked against `kernels.reference` on small random inputs.
The Markdown table is printed last; with $OUT set, all numbers also go to $OUT/bench_kernels.json.
"""
from __future__ import annotations

import argparse
import datetime
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.decode import (GRIDS, DecodeConfig, decode_attention, default_config, default_launch,  # noqa: E402
                            grid_size, launch_grid)
from kernels.quant import quantize_pack  # noqa: E402
from kernels.decode.reference import decode_attention_reference  # noqa: E402
from kernels.reference import quantize_pack_reference  # noqa: E402
from harness.cache import empty_history  # noqa: E402
from kernels.format import QuantSpec  # noqa: E402
from bench_out import out_file, save  # noqa: E402

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


@dataclass(frozen=True)
class AttnShape:
    """Attention heads of one decode call: query heads, KV heads, head_dim, and query tokens per sequence (1: a
    decode step; more: a verification step, each token causal over the history and the tokens before it)."""

    q_heads: int = Q_HEADS
    kv_heads: int = KV_HEADS
    head_dim: int = HEAD_DIM
    q_tokens: int = 1

    @property
    def rows(self) -> int:
        """Query rows per KV head: group x query tokens."""
        return self.q_heads // self.kv_heads * self.q_tokens


QWEN3_8B = AttnShape()
SINK, RECENT = 64, 256
INT_GROUP = 128            # coordinates per (scale, zero) of the harness's INT2 and OSCAR caches (configs/quantizer)
FULL_SHAPES = [(1, 8192), (1, 32768), (1, 131072), (8, 8192), (8, 32768), (8, 131072),
               (32, 8192), (32, 32768), (32, 102400)]
QUICK_SHAPES = [(1, 4096), (8, 8192)]
ROTATE_BYTES = 256 << 20   # inputs per timed graph: ~5x the H100's 50 MB L2


def bench_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def graph_ms(make_call, bytes_per_call: int, copies: int | None = None) -> float:
    """Median ms per call, timed as CUDA-graph replays over enough independent input sets to exceed L2 (or `copies`).

    make_call(i) builds the i-th input set and returns a zero-argument call on it. The graph removes
    the Python launch overhead, the input rotation keeps each call reading from HBM.
    """
    copies = copies or max(1, -(-ROTATE_BYTES // bytes_per_call))
    calls = [make_call(i) for i in range(copies)]
    for call in calls:  # compile and warm up outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    ms = bench_ms(graph.replay) / copies
    del graph, calls
    torch.cuda.empty_cache()
    return ms


def launch_us(call, n: int = 50) -> float:
    """Host time per eager call (Python + launch), with the GPU kept busy."""
    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / n * 1e6


def copy_bandwidth(n_bytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in TB/s, counting bytes read plus bytes written."""
    src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * n_bytes / ms / 1e9


def point_launch(batch: int, ctx: int, shape: AttnShape, k_spec: QuantSpec, v_spec: QuantSpec) -> DecodeConfig:
    """The launch (`kernels.decode.default_launch`) a decode call of this point with these specs takes by default on
    GPU 0."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return default_launch(shape.head_dim, k_spec, v_spec, shape.rows, batch * shape.kv_heads, sms, ctx - SINK - RECENT)


def point_grid(batch: int, ctx: int, shape: AttnShape, spec: QuantSpec | None = None) -> str:
    """The launch family a decode call of this point takes by default: `batch` x KV heads units over ctx - SINK -
    RECENT packed history rows on GPU 0 (`kernels.decode.launch_grid` for K and V stored as `spec`, else
    `grid_size`)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    units, history = batch * shape.kv_heads, ctx - SINK - RECENT
    if spec is None:
        return grid_size(units, sms, history, shape.rows)
    return launch_grid(shape.head_dim, spec, spec, shape.rows, units, sms, history)


def decode_args(batch: int, ctx: int, shape: AttnShape, k_parts: tuple, v_parts: tuple) -> tuple:
    """decode_attention's positional arguments around a history's stored parts: q, the BF16 sink + recent segment
    (SINK + RECENT rows), per-sequence lengths of ctx - SINK - RECENT history rows, zero starts; on the parts'
    device."""
    heads, d, device = shape.kv_heads, shape.head_dim, k_parts[0].device
    q = torch.randn(batch, shape.q_heads, shape.q_tokens, d, device=device, dtype=torch.bfloat16)
    fp_k, fp_v = (torch.randn(batch, heads, SINK + RECENT, d, device=device, dtype=torch.bfloat16) for _ in range(2))
    hist_len = torch.full((batch,), ctx - SINK - RECENT, dtype=torch.int32, device=device)
    fp_len = torch.full((batch,), SINK + RECENT, dtype=torch.int32, device=device)
    starts = torch.zeros(batch, dtype=torch.int32, device=device)
    return (q, *k_parts, *v_parts, fp_k, fp_v, hist_len, fp_len, starts, starts)


def int_spec(bits: int, head_dim: int) -> QuantSpec:
    """The token-major INT layout these benchmarks time: one (scale, zero) per INT_GROUP coordinates of a row."""
    return QuantSpec(bits=bits, group=min(head_dim, INT_GROUP))


def decode_inputs(batch: int, ctx: int, bits: int, shape: AttnShape = QWEN3_8B):
    """Random packed cache (`int_spec`) + fp segment + q for one (batch, ctx, bits) point -> (args, spec, bytes)."""
    heads, d = shape.kv_heads, shape.head_dim
    spec = int_spec(bits, d)
    rows = (batch, heads, ctx - SINK - RECENT)
    groups = d // spec.group
    parts = [(torch.randint(0, 256, (*rows, d * bits // 8), dtype=torch.uint8, device="cuda"),
              (torch.rand(*rows, groups, device="cuda") * 0.2 + 0.05).half(),
              (torch.rand(*rows, groups, device="cuda") * (2 ** bits - 1)).half()) for _ in range(2)]
    args = decode_args(batch, ctx, shape, *parts)
    nbytes = sum(t.numel() * t.element_size() for t in args[1:9]) + 2 * args[0].numel() * args[0].element_size()
    return args, spec, nbytes


def decode_call(batch: int, ctx: int, bits: int, cfg: DecodeConfig | None = None, shape: AttnShape = QWEN3_8B):
    """A zero-argument INT decode call on fresh random inputs of one (batch, ctx, bits) point."""
    args, spec, _ = decode_inputs(batch, ctx, bits, shape)
    return lambda: decode_attention(*args, sm_scale=shape.head_dim ** -0.5, k_spec=spec, v_spec=spec, config=cfg)


def bf16_kernel_args(batch: int, ctx: int, shape: AttnShape) -> tuple:
    """Decode arguments of a BF16 cache on the harness kernel: an empty packed history, all `ctx` rows in the
    fp segment -> (args, spec)."""
    d, heads = shape.head_dim, shape.kv_heads
    q = torch.randn(batch, shape.q_heads, shape.q_tokens, d, device="cuda", dtype=torch.bfloat16)
    fp_k, fp_v = (torch.randn(batch, heads, ctx, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    spec = QuantSpec(bits=2, group=d)
    no_history = empty_history(fp_k, spec)                       # what the cache hands the kernel for the identity
    hist_len, starts = (torch.zeros(batch, dtype=torch.int32, device="cuda") for _ in range(2))
    fp_len = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    return (q, *no_history * 2, fp_k, fp_v, hist_len, fp_len, starts, starts), spec


def bf16_kernel_call(batch: int, ctx: int, shape: AttnShape, cfg: DecodeConfig | None = None):
    """A zero-argument BF16 decode call on the harness kernel (`bf16_kernel_args`), on its default launch or `cfg`."""
    args, spec = bf16_kernel_args(batch, ctx, shape)
    return lambda: decode_attention(*args, sm_scale=shape.head_dim ** -0.5, k_spec=spec, v_spec=spec, config=cfg)


def bf16_bytes(batch: int, ctx: int, shape: AttnShape = QWEN3_8B) -> int:
    """Bytes a BF16 decode call must move: K and V of every token, q and out."""
    return 2 * batch * shape.head_dim * 2 * (shape.kv_heads * ctx + shape.q_heads * shape.q_tokens)


def sdpa_call(batch: int, ctx: int, shape: AttnShape = QWEN3_8B):
    """A zero-argument BF16 SDPA decode call (GQA; several query tokens causal as the last rows, lower-right) on fresh
    random inputs."""
    q = torch.randn(batch, shape.q_heads, shape.q_tokens, shape.head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, shape.kv_heads, ctx, shape.head_dim, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    mask = causal_lower_right(shape.q_tokens, ctx) if shape.q_tokens > 1 else None
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def bench_decode_point(batch: int, ctx: int, copy_tbs: float) -> dict:
    """Time BF16 SDPA, INT2 and INT4 decode at one (batch, ctx)."""
    row = {"batch": batch, "ctx": ctx}
    kv_bytes = bf16_bytes(batch, ctx)
    row["bf16_ms"] = graph_ms(lambda _: sdpa_call(batch, ctx), kv_bytes)
    row["bf16_tbs"] = kv_bytes / row["bf16_ms"] / 1e9
    for bits in (2, 4):
        nbytes = _decode_bytes(batch, ctx, bits)

        def call(_, bits=bits):
            return decode_call(batch, ctx, bits)

        ms = graph_ms(call, nbytes)
        tbs = nbytes / ms / 1e9
        row.update({f"int{bits}_ms": ms, f"int{bits}_tbs": tbs, f"int{bits}_of_copy": tbs / copy_tbs,
                    f"int{bits}_speedup": row["bf16_ms"] / ms, f"int{bits}_launch_us": launch_us(call(0))})
    return row


def _decode_bytes(batch: int, ctx: int, bits: int, shape: AttnShape = QWEN3_8B) -> int:
    """Bytes one INT decode call must move: codes + fp16 scale/zero per group (`int_spec`) + BF16 fp segment + q +
    out."""
    n_hist, n_fp, d = ctx - SINK - RECENT, SINK + RECENT, shape.head_dim
    groups = d // int_spec(bits, d).group
    per_head = n_hist * (d * bits // 8 + 4 * groups) * 2 + n_fp * d * 2 * 2
    return batch * shape.kv_heads * per_head + 2 * batch * shape.q_heads * d * 2


def bench_write(tokens: int, batch: int, copy_tbs: float, tiles: tuple = ((None, None, {}),),
                clip_methods: tuple = (None,)) -> list[dict]:
    """quantize_pack of [batch, 8, tokens, 128] bf16 rows: plain, with clip, with a bf16 rotation, with both;
    each with every (block_t, num_warps, rotated-write knobs) of `tiles` (None: the default), the clipped ones also
    with every method of `clip_methods` (None: `kernels.quant.default_clip_method`); a tile with rotated-write knobs
    times only the rotated writes."""
    rotation = torch.linalg.qr(torch.randn(HEAD_DIM, HEAD_DIM, device="cuda"))[0].to(torch.bfloat16)
    rows = []
    variants = (("int2", QuantSpec(bits=2, group=128), None),
                ("int2 clip", QuantSpec(bits=2, group=128, clip_ratio=0.96), None),
                ("int2 rot", QuantSpec(bits=2, group=128), rotation),
                ("int2 clip+rot", QuantSpec(bits=2, group=128, clip_ratio=0.96), rotation),
                ("int4 g32", QuantSpec(bits=4, group=32), None))
    points = [(v, t, m) for v in variants for m in (clip_methods if v[1].clip_ratio else (None,)) for t in tiles
              if v[2] is not None or not t[2]]
    for (label, spec, rot), (block_t, warps, knobs), method in points:
        label += "" if method is None else f" {method}"
        label += "" if block_t is None else f" block_t={block_t} warps={warps}"
        label += "".join(f" {k}={v}" for k, v in knobs.items())

        def call(_, spec=spec, rot=rot, block_t=block_t, warps=warps, method=method, knobs=knobs):
            x = torch.randn(batch, KV_HEADS, tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            kw = dict(block_t=block_t, num_warps=warps, clip_method=method, **knobs)
            out = quantize_pack(x, spec, rot, **kw)
            return lambda: quantize_pack(x, spec, rot, out=out, **kw)

        x_bytes = batch * KV_HEADS * tokens * HEAD_DIM * 2
        nbytes = x_bytes + x_bytes * spec.container_bits // 16 + batch * KV_HEADS * tokens * 4 * (HEAD_DIM // spec.group)
        ms = graph_ms(call, nbytes)
        tbs = nbytes / ms / 1e9
        rows.append({"what": label, "shape": [batch, KV_HEADS, tokens, HEAD_DIM], "ms": ms, "tbs": tbs,
                     "of_copy": tbs / copy_tbs})
    return rows


def check_write_variants(tiles: tuple, clip_methods: tuple) -> list[str]:
    """Every benchmarked clip method and tile against the reference on the GPU (random bf16 rows; quarter-integer
    rows, full of ties, also through a +-1 Hadamard, where x @ R is exact); returns failure messages."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    spec = QuantSpec(bits=2, group=128, clip_ratio=0.96)
    hadamard = torch.tensor([[1.0]], device="cuda")
    while hadamard.shape[0] < HEAD_DIM:
        hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)], 0)
    noise = torch.randn(2, KV_HEADS, 200, HEAD_DIM, device="cuda", generator=gen).bfloat16()
    quarters = torch.randint(-4, 5, noise.shape, device="cuda", generator=gen).bfloat16() / 4  # ties; x @ R exact
    failures = []
    for x, rot in ((noise, None), (quarters, None), (quarters, hadamard.bfloat16())):
        ref = quantize_pack_reference(x, spec, rot)
        for (block_t, warps, knobs), method in [(t, m) for t in tiles for m in clip_methods]:
            got = quantize_pack(x, spec, rot, block_t=block_t, num_warps=warps, clip_method=method, **knobs)
            if not all(torch.equal(a, b) for a, b in zip(got, ref)):
                failures.append(f"quantize_pack clip {method} block_t={block_t} warps={warps} {knobs} "
                                f"rotation={rot is not None}: not bit-exact")
    return failures


def _random_cache(batch, kv_heads, n_hist, head_dim, spec, gen):
    x = torch.randn(batch, kv_heads, n_hist, head_dim, device="cuda", generator=gen)
    return quantize_pack_reference(x, spec)


def check_correctness() -> list[str]:
    """Small GPU checks against the references; returns failure messages (empty when all pass)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    failures = []
    for spec, head_dim in ((QuantSpec(bits=2, group=128, clip_ratio=0.96), 128),
                           (QuantSpec(bits=4, group=32), 64),
                           (QuantSpec(bits=2, group=64, symmetric=True), 256),
                           (QuantSpec(bits=2, group=32, axis="channel"), 128)):
        x = torch.randn(3, 4, 96, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
        got, ref = quantize_pack(x, spec), quantize_pack_reference(x, spec)
        if not all(torch.equal(a, b) for a, b in zip(got, ref)):
            failures.append(f"quantize_pack {spec} D={head_dim}: not bit-exact")
    cases = [(4, 1, 1, 128, 2000, QuantSpec(bits=2, group=128), QuantSpec(bits=2, group=128)),
             (3, 3, 4, 64, 777, QuantSpec(bits=4, group=64), QuantSpec(bits=4, group=32)),
             (8, 2, 1, 256, 512, QuantSpec(bits=2, group=32, axis="channel"), QuantSpec(bits=2, group=256)),
             (1, 2, 16, 128, 129, QuantSpec(bits=4, group=128), QuantSpec(bits=2, group=128))]
    for group, batch, q_tokens, head_dim, n_hist, k_spec, v_spec in cases:
        kv_heads = 2
        q = torch.randn(batch, kv_heads * group, q_tokens, head_dim, device="cuda", generator=gen).bfloat16()
        kc, ks, kz = _random_cache(batch, kv_heads, n_hist, head_dim, k_spec, gen)
        vc, vs, vz = _random_cache(batch, kv_heads, n_hist, head_dim, v_spec, gen)
        fp_k, fp_v = (torch.randn(batch, kv_heads, 40, head_dim, device="cuda", generator=gen).bfloat16()
                      for _ in range(2))
        lens = [torch.tensor(v, dtype=torch.int32, device="cuda")[:batch]
                for v in ([n_hist, n_hist - 5, n_hist - 1], [40, 38, 37], [0, 3, 1], [0, 2, 1])]
        args = (q, kc, ks, kz, vc, vs, vz, fp_k, fp_v, *lens)
        kw = dict(sm_scale=head_dim ** -0.5, k_spec=k_spec, v_spec=v_spec)
        out = decode_attention(*args, **kw).float()
        ref = decode_attention_reference(*args, **kw).float()
        err = ((out - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            failures.append(f"decode group={group} T_q={q_tokens} D={head_dim} {k_spec.axis}: rel err {err:.2e}")
    return failures


def markdown(device: str, copy_tbs: float, decode_rows: list[dict], write_rows: list[dict]) -> str:
    lines = [f"Device: {device}; date {datetime.date.today().isoformat()}; copy bandwidth {copy_tbs:.2f} TB/s "
             f"(read + write); decode tiles by `kernels.decode.grid_size`: "
             + "; ".join(f"{grid} {default_config(HEAD_DIM, True, grid)}" for grid in GRIDS) + ".", ""]
    if decode_rows:
        lines += ["| batch | ctx | BF16 SDPA ms | INT2 ms | INT2 TB/s | INT2 of copy | INT2 speedup | "
                  "INT4 ms | INT4 TB/s | INT4 of copy | INT4 speedup |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in decode_rows:
        lines.append(f"| {r['batch']} | {r['ctx']} | {r['bf16_ms']:.3f} | {r['int2_ms']:.3f} | {r['int2_tbs']:.2f} | "
                     f"{r['int2_of_copy']:.0%} | {r['int2_speedup']:.2f}x | {r['int4_ms']:.3f} | {r['int4_tbs']:.2f} | "
                     f"{r['int4_of_copy']:.0%} | {r['int4_speedup']:.2f}x |")
    lines += ["", "| write path | x shape | ms | TB/s | of copy |", "|---|---|---|---|---|"]
    for r in write_rows:
        lines.append(f"| {r['what']} | {r['shape']} | {r['ms']:.4f} | {r['tbs']:.2f} | {r['of_copy']:.0%} |")
    return "\n".join(lines)


WRITE_TILE = re.compile(r"(\d+)x(\d+)(?:r(\d+))?")


def write_tile(text: str) -> tuple[int, int, dict]:
    """'64x4' -> (64, 4, {}); '64x4r128' -> (64, 4, {"rot_block": 128}): block_t, num_warps and the rotated-write
    knob of `quantize_pack` (the rotation's slice width)."""
    match = WRITE_TILE.fullmatch(text)
    if match is None:
        raise SystemExit(f"--write-tiles: {text!r} is not BLOCKxWARPS[rROT_BLOCK], e.g. 64x4 or 64x4r128.")
    block_t, warps, rot_block = match.groups()
    return int(block_t), int(warps), {} if rot_block is None else {"rot_block": int(rot_block)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small decode points, small write path")
    parser.add_argument("--skip-check", action="store_true", help="skip the correctness checks")
    parser.add_argument("--write-tiles", default="",
                        help="extra write-path tiles, e.g. 32x4,64x8,64x4r128 (block_t x warps [r rot_block])")
    parser.add_argument("--clip-methods", default="",
                        help="write-path clip methods to compare, e.g. extract,descend,distinct (CLIP_METHODS)")
    parser.add_argument("--write-only", action="store_true", help="skip the decode points (write path only)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels.py needs a CUDA GPU.")
    out = out_file("bench_kernels.json")
    device = torch.cuda.get_device_name()
    tiles = ((None, None, {}), *(write_tile(t) for t in args.write_tiles.split(",") if t))
    clip_methods = tuple(args.clip_methods.split(",")) if args.clip_methods else (None,)
    failures = [] if args.skip_check else check_write_variants(tiles, clip_methods)
    failures += [] if args.skip_check or args.write_only else check_correctness()
    print("correctness:", "all passed" if not failures else failures, flush=True)
    copy_tbs = copy_bandwidth(256 << 20 if args.quick else 2 << 30)
    shapes = [] if args.write_only else QUICK_SHAPES if args.quick else FULL_SHAPES
    decode_rows, write_rows = [], []
    payload = {"device": device, "date": datetime.date.today().isoformat(), "copy_tbs": copy_tbs,
               "failures": failures, "decode": decode_rows, "write": write_rows}
    for batch, ctx in shapes:
        decode_rows.append(bench_decode_point(batch, ctx, copy_tbs))
        print(decode_rows[-1], flush=True)
        save(out, payload)
    write_rows += bench_write(4096, 1, copy_tbs) + ([] if args.quick else
                                                    bench_write(4096, 16, copy_tbs, tiles, clip_methods))
    save(out, payload)
    print(markdown(device, copy_tbs, decode_rows, write_rows))


if __name__ == "__main__":
    main()
