"""Compile the decode kernel (stage 1) for an H100 offline and count the SASS of its history loop.

No GPU needed: Triton's bundled ptxas and nvdisasm (triton/backends/nvidia/bin) do the work.

    python scripts/dev/decode_sass.py                  # INT2, head_dim 128: both history loops, +- asm_unpack
    python scripts/dev/decode_sass.py --layout int2-d64  # head_dim 64 (GQA 3): warp tiles with and without pairs,
                                                         # pairs with every tile masked
    python scripts/dev/decode_sass.py --layout int2-wide --top 24  # head_dim 128, GQA 4, large grid: 8 rows, wide pairs
                                                                   # with four (scale, zero) tensors and column meta
    python scripts/dev/decode_sass.py --layout int2-g16  # head_dim 128, GQA 16, large grid: the 16-row warp tiles
    python scripts/dev/decode_sass.py --layout kivi2     # KIVI-2 (channel keys, value groups of 32): row-major, tiles
    python scripts/dev/decode_sass.py --layout kivi2-d64  # KIVI-2, head_dim 64: channel-key tiles +- pairs
    python scripts/dev/decode_sass.py --layout kivi4     # KIVI-4 (4-bit channel keys), head_dim 128: +- asm_unpack
    python scripts/dev/decode_sass.py --layout kivi4-d64  # KIVI-4, head_dim 64: one / two key groups per warp
    python scripts/dev/decode_sass.py --single-launch    # the memory ordering of DecodeConfig.single_launch's merge
    python scripts/dev/decode_sass.py --launches         # INT2's launch per grid, head_dim and 8 / 16 query rows
    python scripts/dev/decode_sass.py --launches --layout kivi4   # the same for KIVI-4's launch (kivi2: KIVI-2's)
    python scripts/dev/decode_sass.py --launches --no-cap --layout kivi4   # each of those launches without maxnreg
    python scripts/dev/decode_sass.py --launches --fp-only   # and each launch's registers without the history loops
    python scripts/dev/decode_sass.py --wide-head-groups  # head_dim 256, one or two groups a row, 8- / 16-row programs

The kernel is specialized as a launch of `scripts/bench_kernels.py`'s batch-8 / 32k INT2 call would specialize
it (pointers and multiples of 16 marked divisible by 16, arguments equal to 1 folded to constants). The history
loop is the loop whose body holds the HMMA instructions; its static instruction count is what one warp issues
per BLOCK_N-token tile (in a loop with forward branches, the bodies they skip included). Prints a Markdown table:
registers, loop instructions (also per 128 tokens), the leading opcodes, the shared-memory accesses and barriers by
full opcode (LDS.U8: byte gathers) and the loop's instructions per 128 tokens with those bodies skipped, for the
row-major loop (`_history_split`, 128-token tiles) and the warp tiles (`_history_warp_tiles`, the GPU default
for this shape, 256-token tiles). --launches compiles INT2's launch (`launch_config`) on every grid at head_dim
64 / 128 / 256 with GQA 4 and 16 (16-row programs), with `four_row_pairs`, `column_meta_pairs` and
`masked_pair_tile_launches` applied as at run
time over this history (GQA 4: 4-row pair programs at head_dim 64, and on the medium and large grids wide pairs at
128; 8 rows elsewhere): registers, loop instructions per 128 tokens and spill instructions (LDL / STL) inside the
loop. To compare trees, copy this script into a `git archive` of the other tree and run it there (it imports the
kernels of the tree it sits in).
"""
from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"      # compile only (nothing runs), so the interpreter must stay off

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels.decode import (CHANNEL, GRIDS, LOG2E, ROW_BLOCK, TOKEN, TOKEN_GROUPED, WARP_TILE_ROWS,  # noqa: E402
                            DecodeConfig, _decode_stage1_kernel, default_config, launch_config)
from kernels.decode import launch as launch_rules  # noqa: E402
from kernels.decode.launch import _warp_rows  # noqa: E402
from kernels.format import QuantSpec  # noqa: E402

# Launch rules an older tree may lack (this script copied into it to compare trees): there the launch did without
# them, and its kernels ignore the constexprs they feed (PAIR_WORDS, COLUMN_META).
uses_pair_words = getattr(launch_rules, "uses_pair_words", lambda cfg, row_block: True)
four_row_pairs = getattr(launch_rules, "four_row_pairs", lambda cfg, *rule_args: cfg)
column_meta_pairs = getattr(launch_rules, "column_meta_pairs", lambda cfg, *rule_args: cfg)
masked_pair_tile_launches = getattr(launch_rules, "masked_pair_tile_launches", lambda cfg, *rule_args: cfg)
reads_token_pairs = getattr(launch_rules, "reads_token_pairs", lambda cfg, token_bytes, *specs_and_head_dim: (
    launch_rules.uses_token_pairs(cfg, *[torch.empty(1, 1, 2, token_bytes, dtype=torch.uint8)] * 2,
                                  *specs_and_head_dim)))


def column_meta(cfg: DecodeConfig) -> bool:
    """cfg.column_meta (False in an older tree's DecodeConfig, which lacks the field)."""
    return getattr(cfg, "column_meta", False)


KV_HEADS, HIST, FP_ROWS, BITS = 8, 32448, 320, 2


@dataclass(frozen=True)
class Layout:
    """One stored layout at one attention shape: head_dim, query heads, (scale, zero) groups of K and V."""

    head_dim: int = 128
    q_heads: int = 32
    k_group: int = 128               # coordinates per token group (token axis) or tokens per group (channel axis)
    v_group: int = 128
    k_channel: bool = False          # KIVI's keys: one (scale, zero) per channel per k_group tokens
    bits: int = BITS                 # code bits of K and V

    def codes(self, group: int, channel: bool) -> int:
        """The kernel's layout code of one side."""
        return CHANNEL if channel else (TOKEN if group == self.head_dim else TOKEN_GROUPED)

    @property
    def per_token(self) -> bool:
        return not self.k_channel

    def specs(self) -> tuple[QuantSpec, QuantSpec]:
        """The (key, value) QuantSpecs of this layout."""
        return (QuantSpec(bits=self.bits, group=self.k_group, axis="channel" if self.k_channel else "token"),
                QuantSpec(bits=self.bits, group=self.v_group))

    def reads_pairs(self, cfg: DecodeConfig) -> bool:
        """Whether `cfg`'s warp tiles read pair rows of this layout's tokens (`reads_token_pairs`, as at run time)."""
        return reads_token_pairs(cfg, self.head_dim * self.bits // 8, *self.specs(), self.head_dim)


LAYOUTS = {"int2": Layout(), "int2-d64": Layout(64, 24, 64, 64), "int2-wide": Layout(), "int2-g16": Layout(128, 128),
           "kivi2": Layout(k_group=32, v_group=32, k_channel=True),
           "kivi2-d64": Layout(64, 24, k_group=32, v_group=32, k_channel=True),
           "kivi4": Layout(k_group=32, v_group=32, k_channel=True, bits=4),
           "kivi4-d64": Layout(64, 24, k_group=32, v_group=32, k_channel=True, bits=4)}
POINTER_TYPES = {"q_ptr": "*bf16", "kc_ptr": "*u8", "ks_ptr": "*fp16", "kz_ptr": "*fp16", "vc_ptr": "*u8",
                 "vs_ptr": "*fp16", "vz_ptr": "*fp16", "fk_ptr": "*bf16", "fv_ptr": "*bf16", "hist_len_ptr": "*i32",
                 "fp_len_ptr": "*i32", "hist_start_ptr": "*i32", "fp_start_ptr": "*i32", "part_o_ptr": "*fp32",
                 "part_lse_ptr": "*fp32", "counter_ptr": "*i32", "out_ptr": "*bf16"}


def runtime_arguments(layout: Layout) -> dict:
    """Scalar arguments of the batch-8 INT2 launch ([B, H, T, D] contiguous tensors as bench_kernels builds them)."""
    d, q_heads, nb = layout.head_dim, layout.q_heads, layout.head_dim * layout.bits // 8
    k_rows, k_cols = (HIST // layout.k_group, d) if layout.k_channel else (HIST, d // layout.k_group)
    v_cols = d // layout.v_group
    return dict(qk_scale=d ** -0.5 * LOG2E, kv_heads=KV_HEADS, q_tokens=1, n_rows=q_heads // KV_HEADS,
                n_hist_splits=16, n_fp_splits=1, stride_ob=q_heads * d, stride_oh=d, stride_ot=d,
                stride_qb=q_heads * d, stride_qh=d, stride_qt=d,
                stride_kcb=KV_HEADS * HIST * nb, stride_kch=HIST * nb, stride_kcn=nb,
                stride_ksb=KV_HEADS * k_rows * k_cols, stride_ksh=k_rows * k_cols, stride_ksn=k_cols,
                stride_vcb=KV_HEADS * HIST * nb, stride_vch=HIST * nb, stride_vcn=nb,
                stride_vsb=KV_HEADS * HIST * v_cols, stride_vsh=HIST * v_cols, stride_vsn=v_cols,
                stride_fb=KV_HEADS * FP_ROWS * d, stride_fh=FP_ROWS * d, stride_fn=d)


def compile_for_h100(kernel, constexprs: dict, scalars: dict, pointer_types: dict, options: dict):
    """triton.compile of `kernel` for sm_90a, specialized as a runtime launch with these arguments specializes it:
    pointers and integer multiples of 16 marked divisible by 16, integers equal to 1 folded to constants."""
    names = list(inspect.signature(kernel.fn).parameters)
    signature, folded, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in constexprs:
            signature[name], folded[(i,)] = "constexpr", constexprs[name]
        elif name in pointer_types:
            signature[name], attrs[(i,)] = pointer_types[name], [["tt.divisibility", 16]]
        elif isinstance(scalars[name], float):
            signature[name] = "fp32"
        elif scalars[name] == 1:
            signature[name], folded[(i,)] = "constexpr", 1
        else:
            signature[name] = "i32"
            if scalars[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(kernel, signature, constexprs=folded, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_stage1(cfg: DecodeConfig, layout: Layout = LAYOUTS["int2"], rows: int | None = None,
                   history: bool = True):
    """triton.compile of stage 1 for sm_90a, specialized like the runtime launch (warp-tile programs of
    `_warp_rows(cfg, rows)` query rows, rows the layout's GQA group by default); history=False: a call without
    history splits (HISTORY, `kernels.decode.launch.compiles_history`)."""
    d = layout.head_dim
    warp_tiles = cfg.warp_tiles and (layout.per_token or cfg.channel_key_tiles)
    block_r = _warp_rows(cfg, rows or layout.q_heads // KV_HEADS) if warp_tiles else ROW_BLOCK
    pairs = warp_tiles and layout.reads_pairs(cfg)
    constexprs = dict(GROUP=layout.q_heads // KV_HEADS, D=d, K_BITS=layout.bits, V_BITS=layout.bits,
                      K_LAYOUT=layout.codes(layout.k_group, layout.k_channel),
                      V_LAYOUT=layout.codes(layout.v_group, False), K_GROUP=layout.k_group, V_GROUP=layout.v_group,
                      WARP_TILES=warp_tiles, TOKEN_PAIRS=pairs, PAIR_WORDS=uses_pair_words(cfg, block_r),
                      COLUMN_META=column_meta(cfg) and pairs, WARPS=cfg.num_warps, BLOCK_R=block_r,
                      BLOCK_N=cfg.block_n, BLOCK_F=cfg.block_f, FP16=True, ASM_UNPACK=cfg.asm_unpack,
                      SINGLE_LAUNCH=cfg.single_launch, PDL=cfg.pdl, HISTORY=history,
                      MASKED_PAIRS=cfg.masked_pair_tiles)
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                   **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}))
    return compile_for_h100(_decode_stage1_kernel, constexprs, runtime_arguments(layout), POINTER_TYPES, options)


def cuda_tool(tool: str, cubin: bytes, *flags: str) -> str:
    """Run one of Triton's bundled CUDA binaries (nvdisasm, cuobjdump) on a cubin; its stdout."""
    binary = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(binary), *flags, f.name], capture_output=True, text=True, check=True).stdout


def registers(cubin: bytes) -> int:
    return int(re.search(r"REG:(\d+)", cuda_tool("cuobjdump", cubin, "--dump-resource-usage")).group(1))


INSTRUCTION = re.compile(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
BRANCH = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)")  # a branch to a label (backward: a loop; forward: a skip)
SHARED = re.compile(r"\b((?:LDS|STS|LDSM|STSM|BAR)(?:\.[A-Z0-9_]+)*)\b")  # with modifiers: LDS.U8, BAR.SYNC...


def opcodes(lines: list[str]) -> list[str]:
    return [m.group(1) for m in map(INSTRUCTION.search, lines) if m]


def shared_memory_ops(lines: list[str]) -> collections.Counter:
    """Shared-memory accesses and block barriers of a loop, by full opcode (LDS.U8 is a byte gather)."""
    return collections.Counter(m.group(1) for m in map(SHARED.search, lines) if m)


def history_loop(lines: list[str]) -> list[str]:
    """SASS lines of the loop (label .. backward branch) holding the most HMMA instructions."""
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if line.strip().startswith(".L_x_")}
    best, best_mma = [], 0
    for end, line in enumerate(lines):
        match = BRANCH.search(line)
        if not match or labels.get(match.group(1), end) >= end:
            continue
        body = lines[labels[match.group(1)]:end + 1]
        if (mma := opcodes(body).count("HMMA")) > best_mma:
            best, best_mma = body, mma
    return best


def skipping_forward_branches(lines: list[str]) -> list[str]:
    """A loop's instructions without the bodies its forward branches jump over (branch .. label): the path a tile
    takes when every such branch is taken, e.g. a rarely needed fix-up skipped. Equal to `opcodes(lines)` for a loop
    without forward branches."""
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if line.strip().startswith(".L_x_")}
    skipped = set()
    for i, line in enumerate(lines):
        match = BRANCH.search(line)
        if match and labels.get(match.group(1), -1) > i:
            skipped.update(range(i + 1, labels[match.group(1)]))
    return opcodes([line for i, line in enumerate(lines) if i not in skipped])


def kivi_specs(bits: int) -> tuple[QuantSpec, QuantSpec]:
    """KIVI's (key, value) specs at `bits`: per-channel keys in 32-token groups, per-token value groups of 32."""
    return QuantSpec(bits=bits, group=32, axis="channel"), QuantSpec(bits=bits, group=32)


def variants(name: str) -> list[DecodeConfig]:
    """int2: the row-major loop (128-token tiles) and warp tiles (the default), each without and with asm_unpack;
    int2-d64: warp tiles with and without token pairs (8-row programs, whole pair tiles unmasked), and the pairs with
    every tile masked (`masked_pair_tile_launches`' choice there); int2-g16: the large grid's 16-row launch at
    head_dim 128 (GQA 16); int2-wide: the large grid's 8-row launch (`launch_config`),
    what `four_row_pairs` makes of it at GQA 4 (4-row programs over wide pairs), `column_meta_pairs` then, with whole
    tiles unmasked, and `masked_pair_tile_launches` then (as run: every tile masked); kivi2: its default (the
    row-major loop) and channel-key warp tiles (one 32-token key group per warp); kivi2-d64: channel-key warp tiles
    over token pairs with one and two key groups per warp (128- and 256-token tiles, the latter the default), and
    without pairs; kivi4: the large grid's
    launch (`launch_config`) without and with asm_unpack (its default); kivi4-d64: one and two key groups per warp
    on the byte unpack, and the default (two with asm_unpack)."""
    layout = LAYOUTS[name]
    if name.startswith("kivi4"):
        launch = launch_config(layout.head_dim, True, "large", *kivi_specs(layout.bits))
        if name == "kivi4":
            return [replace(launch, asm_unpack=False), replace(launch, asm_unpack=True)]
        on_bytes = replace(launch, asm_unpack=False)
        return [replace(on_bytes, block_n=128), on_bytes, launch]
    default = default_config(layout.head_dim, on_gpu=True, per_token=layout.per_token)
    if name == "int2-d64":
        return [default, replace(default, token_pairs=False), replace(default, masked_pair_tiles=True)]
    if name == "int2-g16":                                   # the large grid's 16-row launch (uncapped)
        return [launch_config(layout.head_dim, True, "large", QuantSpec(bits=BITS, group=layout.head_dim),
                              QuantSpec(bits=BITS, group=layout.head_dim), layout.q_heads // KV_HEADS)]
    if name == "int2-wide":
        spec = QuantSpec(bits=BITS, group=layout.head_dim)
        large = launch_config(layout.head_dim, True, "large", spec, spec, layout.q_heads // KV_HEADS)
        pairs = four_row_pairs(large, "large", layout.head_dim, layout.q_heads // KV_HEADS, HIST, spec, spec)
        columns = column_meta_pairs(pairs, "large", layout.head_dim, spec, spec)
        rows = layout.q_heads // KV_HEADS
        return [large, pairs, columns, masked_pair_tile_launches(columns, "large", layout.head_dim, rows, spec, spec)]
    channel_tiles = replace(default, warp_tiles=True, channel_key_tiles=True, asm_unpack=False)
    if name == "kivi2":
        return [default, channel_tiles]
    if name == "kivi2-d64":
        return [channel_tiles, replace(channel_tiles, block_n=256), replace(channel_tiles, token_pairs=False)]
    row_major = replace(default, warp_tiles=False, block_n=128)
    return [replace(cfg, asm_unpack=asm) for cfg in (row_major, default) for asm in (False, True)]


def loop_name(cfg: DecodeConfig, layout: Layout) -> str:
    if cfg.warp_tiles and cfg.channel_key_tiles and layout.k_channel:
        name = "warp tiles, channel keys"
    elif cfg.warp_tiles and layout.per_token:
        name = "warp tiles"
    else:
        return "row-major"
    if not layout.reads_pairs(cfg):
        return name
    name = name + (", pairs, column meta" if column_meta(cfg) else ", pairs")
    return name + (", masked tiles" if getattr(cfg, "masked_pair_tiles", False) else "")


def spill_count(loop: list[str]) -> int:
    """Spill instructions (LDL / STL) in a loop's SASS lines."""
    return sum(1 for line in loop if re.search(r"\b(LDL|STL)\b", line))


def loop_counts(cfg: DecodeConfig, layout: Layout, rows: int) -> str:
    """'registers | loop instructions per 128 tokens | spill instructions (LDL / STL) in the loop' of one launch."""
    cubin = compile_stage1(cfg, layout, rows=rows).asm["cubin"]
    loop = history_loop(cuda_tool("nvdisasm", cubin, "-c").splitlines())
    return f"{registers(cubin)} | {len(opcodes(loop)) * 128 // cfg.block_n} | {spill_count(loop)}"


def launch_rows(head_dims=(64, 128, 256), groups=(4, 16), kivi_bits: int | None = None,
                uncapped: bool = False, fp_only: bool = False) -> list[str]:
    """Markdown rows of INT2's launch (kivi_bits: KIVI's, per-channel keys in 32-token groups and per-token value
    groups of 32 at that many bits) on every grid: registers, loop instructions per 128 tokens, loop spills;
    uncapped: each launch without its register cap (maxnreg); fp_only: also the registers of the same launch
    compiled for a call without history splits (HISTORY=False)."""
    lines = []
    for d in head_dims:
        k_spec, v_spec = kivi_specs(kivi_bits) if kivi_bits else (QuantSpec(bits=BITS, group=d),) * 2
        for group in groups:
            layout = Layout(d, group * KV_HEADS, k_spec.group, v_spec.group, bool(kivi_bits), kivi_bits or BITS)
            for grid in GRIDS:
                cfg = four_row_pairs(launch_config(d, True, grid, k_spec, v_spec, group), grid, d, group, HIST,
                                     k_spec, v_spec)
                cfg = masked_pair_tile_launches(column_meta_pairs(cfg, grid, d, k_spec, v_spec), grid, d, group, k_spec,
                                                v_spec)
                cfg = replace(cfg, maxnreg=None) if uncapped else cfg
                fp = f" {registers(compile_stage1(cfg, layout, group, history=False).asm['cubin'])} |" if fp_only else ""
                lines.append(f"| {d} | {group} | {grid} | {cfg.block_n} | {cfg.num_warps} | {cfg.maxnreg} | "
                             f"{cfg.warp_rows} | {cfg.asm_unpack} | {loop_counts(cfg, layout, group)} |{fp}")
    return lines


def wide_head_group_rows(head_dim: int = 256, group_sizes: tuple = (256, 128)) -> list[str]:
    """Markdown rows of the large-grid INT2 launch at head_dim 256 with one (scale, zero) per row and with groups of
    128 (naive INT2's and OSCAR's layout there), 16 query rows as one 16-row program and as 8-row programs
    (`kernels.decode.launch.eight_row_programs`), and 4 rows: registers, loop instructions per 128 tokens, spills."""
    lines = []
    for coords in group_sizes:
        spec = QuantSpec(bits=BITS, group=coords)
        for rows, warp_rows in ((16, ROW_BLOCK), (16, WARP_TILE_ROWS), (4, None)):
            cfg = replace(launch_config(head_dim, True, "large", spec, spec, rows), warp_rows=warp_rows)
            lines.append(f"| {head_dim // coords} | {rows} | {_warp_rows(cfg, rows)} | "
                         f"{loop_counts(cfg, Layout(head_dim, rows * KV_HEADS, coords, coords), rows)} |")
    return lines


ORDERING = re.compile(r"\b(BAR\.SYNC|MEMBAR\.\w+\.\w+|ATOMG\.E\.\w+\.STRONG\.GPU|CCTL\.IVALL)")


def merge_ordering(cfg: DecodeConfig, layout: Layout = LAYOUTS["int2"]) -> list[str]:
    """The synchronisation around the single-launch merge's counter, in program order: the block barrier after the
    partial stores, the release fence, the atomic, the L1 invalidation and the barrier that shares its result."""
    lines = cuda_tool("nvdisasm", compile_stage1(replace(cfg, single_launch=True), layout).asm["cubin"], "-c")
    ops = [m.group(1) for m in map(ORDERING.search, lines.splitlines()) if m]
    first_atomic = next(i for i, op in enumerate(ops) if op.startswith("ATOMG"))
    return ops[max(first_atomic - 2, 0):first_atomic + 3]


def print_table(header: list[str], rows: list[str]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    print("\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=8, help="opcodes listed per row")
    parser.add_argument("--layout", default="int2", choices=sorted(LAYOUTS))
    parser.add_argument("--single-launch", action="store_true", help="print the merge's memory ordering and stop")
    parser.add_argument("--launches", action="store_true",
                        help="INT2's launch (a kivi --layout: KIVI's) per grid, head_dim and rows; stop")
    parser.add_argument("--no-cap", action="store_true", help="with --launches: each launch without its register cap")
    parser.add_argument("--fp-only", action="store_true",
                        help="with --launches: also each launch's registers without the history loops (HISTORY=False)")
    parser.add_argument("--wide-head-groups", action="store_true",
                        help="head_dim 256 with one or two groups a row, 8- and 16-row programs; stop")
    args = parser.parse_args()
    layout = LAYOUTS[args.layout]
    counts = ["registers", "loop instructions / 128 tokens", "loop spills"]
    if args.wide_head_groups:
        print_table(["groups per row", "query rows", "rows per program", *counts], wide_head_group_rows())
        return
    if args.launches:
        kivi_bits = layout.bits if layout.k_channel else None
        fp = ["registers without history (HISTORY=False)"] if args.fp_only else []
        print_table(["head_dim", "GQA", "grid", "tokens / tile", "warps", "maxnreg", "warp_rows", "asm_unpack",
                     *counts, *fp], launch_rows(kivi_bits=kivi_bits, uncapped=args.no_cap, fp_only=args.fp_only))
        return
    if args.single_launch:
        for grid in ("small", "large"):
            cfg = default_config(layout.head_dim, on_gpu=True, grid=grid)
            print(f"single-launch merge, grid={grid}: " + " ".join(merge_ordering(cfg, layout)))
            print(f"registers, grid={grid}: " + ", ".join(
                f"single_launch={on} {registers(compile_stage1(replace(cfg, single_launch=on), layout).asm['cubin'])}"
                for on in (False, True)))
        return
    print("| history loop | asm_unpack | tokens / tile | registers | instructions / warp / tile | per 128 tokens "
          "| leading opcodes | shared memory and barriers | per 128 tokens, forward branches taken | loop spills |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cfg in variants(args.layout):
        cubin = compile_stage1(cfg, layout).asm["cubin"]
        lines = history_loop(cuda_tool("nvdisasm", cubin, "-c").splitlines())
        loop = opcodes(lines)
        counts = collections.Counter(loop).most_common(args.top)
        shared = ", ".join(f"{op} {n}" for op, n in shared_memory_ops(lines).most_common())
        print(f"| {loop_name(cfg, layout)} | {cfg.asm_unpack} | {cfg.block_n} | {registers(cubin)} | {len(loop)} | "
              f"{len(loop) * 128 // cfg.block_n} | " + ", ".join(f"{op} {n}" for op, n in counts) + f" | {shared} | "
              f"{len(skipping_forward_branches(lines)) * 128 // cfg.block_n} | {spill_count(lines)} |", flush=True)


if __name__ == "__main__":
    main()
