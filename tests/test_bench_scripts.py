"""The GPU benchmark scripts' logic runs on CPU on tiny shapes (so they cannot rot)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_bench_throughput_tiny_runs_and_reports(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--tiny", "--steps", "2", "--ctx", "600",
                           "--batch", "1", "--budget-gb", "0.005", "--quantizers",
                           "bf16,bf16_static,bf16+graph,bf16+graph+compile,naive_int2,oscar,oscar+graph"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Same memory budget" in proc.stdout
    import json
    data = json.loads((tmp_path / "bench_throughput.json").read_text())
    per_token = {r["quantizer"]: r["kv_bytes_per_token"] for r in data["rows"]}
    assert per_token["bf16"] > 4 * per_token["naive_int2"]          # INT2 history is far smaller than fp32 rows
    assert per_token["oscar"] < per_token["oscar+graph"] < 1.2 * per_token["oscar"]   # frozen: a little slack
    assert all(r["max_batch_in_budget"] >= 0 for r in data["same_budget"])
    assert per_token["bf16"] <= per_token["bf16_static"] < 1.1 * per_token["bf16"]   # static: ctx + a few slack rows
    assert per_token["bf16"] <= per_token["bf16+graph"] < 1.1 * per_token["bf16"]   # every row in the fp buffer
    assert per_token["bf16+graph+compile"] == per_token["bf16+graph"]              # the same cache, compiled step
    assert all("throughput_vs_bf16" in r and "throughput_vs_bf16_static" in r and "throughput_vs_bf16+graph" in r
               and "throughput_vs_bf16+graph+compile" in r for r in data["same_budget"] if r["batch"])
    assert all(r["timed_steps"] == 2 and r["warmup_steps"] == 2 for r in data["rows"])    # CPU: no page rounding
    for r in data["rows"]:   # tokens/s comes from the unrounded mean; the row keeps the mean to 0.001 ms
        mean_ms = r["ms_per_step_mean"]
        rounding_slack = r["batch"] * 1e3 * 0.0005 / (mean_ms - 0.0005) ** 2 + 0.05
        assert abs(r["tokens_per_s"] - r["batch"] * 1e3 / mean_ms) <= rounding_slack, r
    saved = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--from-json",
                            str(tmp_path / "bench_throughput.json")], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert saved.returncode == 0, saved.stderr[-2000:]
    tables = saved.stdout.strip()
    assert tables.startswith("### Decode step, tiny shapes") and proc.stdout.rstrip().endswith(tables)


def test_bench_throughput_tables_of_a_run_without_recorded_weights_derive_them_from_a_floor():
    """Runs saved before weights_bytes was recorded: the budget table's weights come from a row's floor_ms (the
    committed Qwen3-4B run: 8.0 GB, as that run printed)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_throughput import payload_weights, tables
    payload = json.loads((ROOT / "results/bench/bench_throughput_h200_027aef4_4b.json").read_text())
    assert "weights_bytes" not in payload
    assert abs(payload_weights(payload) - 8.045e9) < 0.01e9
    text = tables(payload)
    assert "### Same memory budget (70.0 GB incl. 8.0 GB weights: --budget-gb), ctx 102400" in text
    assert "| oscar:model+graph+compile | 26 | 102400 | 23.128 |" in text
    committed = (ROOT / "results/bench/bench_throughput_h200_027aef4.md").read_text()
    assert all(line in committed for line in text.splitlines())          # the committed tables are these


@pytest.mark.parametrize("content, needle", [(None, "no such file"), ("{", "is not JSON"),
                                             ('{"rows": []}', "is not a bench_throughput.py run")])
def test_bench_throughput_from_json_refuses_bad_files_in_one_sentence(tmp_path, content, needle):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    proc = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--from-json", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_gpu_rows_time_whole_demotion_pages_after_two_demotions():
    """A quantizer row on the GPU times whole pages of page_tokens steps (their mean carries the demotions), after a
    warm-up that demotes twice (compiling, then capturing the demotion's graph); a cache without pages keeps its
    steps."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_throughput import whole_pages
    from harness.quantizer import build_quantizer
    oscar = build_quantizer("oscar")
    assert oscar.page_tokens == 8
    assert whole_pages(2, oscar) == (8, 17) and whole_pages(16, oscar) == (16, 17) and whole_pages(17, oscar) == (24, 17)
    assert whole_pages(5, object()) == (5, 2) and whole_pages(16, oscar, stagger=True) == (16, 25)


def test_bench_throughput_refuses_compile_without_graph_before_building_the_model():
    proc = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--tiny", "--quantizers", "bf16,oscar+compile"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "oscar+compile: +compile compiles the frozen step" in proc.stderr
    assert "copy bandwidth" not in proc.stdout


@pytest.mark.parametrize("args, needle", [
    (["--quantizers", "bf16,nope+graph"], "nope+graph: a row is bf16 or bf16_static, or a quantizer ("),
    (["--quantizers", "bf16_static+graph"], "bf16_static+graph: a row is"),
    (["--ctx", "4k"], "argument --ctx: '4k' is not a comma-separated list of integers."),
    (["--batch", "1,0"], "argument --batch: '1,0': every value must be at least 1."),
    (["--steps", "8,16"], "argument --steps: '8,16' is not one integer."),
])
def test_bench_throughput_refuses_bad_rows_and_numbers_in_one_line_before_building_the_model(args, needle):
    proc = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--tiny", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-600:]
    assert "copy bandwidth" not in proc.stdout


@pytest.mark.parametrize("script, args, needle", [
    ("bench_kernel_grid.py", ["--head-dims", "96"], "argument --head-dims: '96': the kernels take head_dim 64, 128"),
    ("bench_kernel_grid.py", ["--batches", "0"], "argument --batches: '0': every value must be at least 1."),
    ("bench_formats.py", ["--points", "8x32768"], "argument --points: '8x32768': each point is batch:ctx"),
])
def test_kernel_benchmarks_refuse_bad_shapes_in_one_line_without_a_gpu(script, args, needle):
    proc = subprocess.run([sys.executable, f"scripts/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-600:]


def test_bench_throughput_budget_from_a_row_fits_that_rows_batch(tmp_path):
    """--budget-from bf16+frozen: BF16's own batch fills the budget, the INT2 cache fits several times more."""
    import json
    env = {**os.environ, "OUT": str(tmp_path), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--tiny", "--steps", "1", "--ctx", "300",
                           "--batch", "1", "--quantizers", "bf16+frozen,naive_int2+frozen", "--budget-from",
                           "bf16+frozen", "--same-budget-cap", "64"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "bench_throughput.json").read_text())
    per_token = {r["quantizer"]: r["kv_bytes_per_token"] for r in data["rows"]}
    budget = {r["quantizer"]: r for r in data["same_budget"]}
    assert budget["bf16+frozen"]["batch"] == 1
    assert budget["naive_int2+frozen"]["batch"] == int(per_token["bf16+frozen"] / per_token["naive_int2+frozen"])
    assert budget["naive_int2+frozen"]["batch"] > 2 and budget["naive_int2+frozen"]["throughput_vs_bf16+frozen"] > 0
    assert "what bf16+frozen at batch 1 holds" in proc.stdout


def test_same_budget_ratio_only_between_rows_at_their_budgets_batch(monkeypatch):
    """A row that --same-budget-cap holds below the batch its budget fits gets no throughput ratio (it would be a
    smaller batch's speedup, not a same-memory one), and the paper table's reader skips it the same way."""
    from types import SimpleNamespace
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_throughput
    from report.paper_throughput import at_budget_batch
    monkeypatch.setattr(bench_throughput, "measure_or_oom",
                        lambda model, q, batch, ctx, *a, **k: {"quantizer": q, "batch": batch, "ctx": ctx,
                                                               "tokens_per_s": 100.0 * batch})
    rows = [{"quantizer": "bf16", "ctx": 100, "kv_bytes_per_token": 1e6},
            {"quantizer": "naive_int2", "ctx": 100, "kv_bytes_per_token": 1e5}]
    args = SimpleNamespace(steps=1, eager_demotions=False, stagger=False)
    out = {r["quantizer"]: r for r in bench_throughput.same_budget_rows(
        None, rows, ["bf16", "naive_int2"], 100, 1.0, 16, args, "cpu", None, 0, 1.0)}
    assert out["bf16"]["batch"] == out["bf16"]["max_batch_in_budget"] == 10 and out["bf16"]["throughput_vs_bf16"] == 1.0
    assert out["naive_int2"]["batch"] == 16 and out["naive_int2"]["max_batch_in_budget"] == 100
    assert "throughput_vs_bf16" not in out["naive_int2"] and not at_budget_batch(out["naive_int2"])
    uncapped = {r["quantizer"]: r for r in bench_throughput.same_budget_rows(
        None, rows, ["bf16", "naive_int2"], 100, 1.0, 128, args, "cpu", None, 0, 1.0)}
    assert uncapped["naive_int2"]["throughput_vs_bf16"] == 10.0


def test_bench_throughput_records_an_oom_and_goes_on(tmp_path, monkeypatch, capsys):
    """A configuration that does not fit (BF16 at a batch beyond the GPU) ends its own row with status=oom."""
    import json
    import torch
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_throughput
    real = bench_throughput.measure

    def measure(model, name, *args, **kwargs):
        if name == "bf16":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB.\nmore lines")
        return real(model, name, *args, **kwargs)

    monkeypatch.setattr(bench_throughput, "measure", measure)
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["bench_throughput.py", "--tiny", "--steps", "1", "--ctx", "600", "--batch", "1",
                                      "--quantizers", "bf16,naive_int2"])
    bench_throughput.main()
    data = json.loads((tmp_path / "bench_throughput.json").read_text())
    rows = {r["quantizer"]: r for r in data["rows"]}
    assert rows["bf16"]["status"] == "oom" and rows["bf16"]["error"].endswith(
        "KV cache 0.0 GB at batch 1 x 601 tokens); CUDA out of memory. Tried to allocate 9.00 GiB.")
    assert rows["naive_int2"]["ms_per_step"] > 0
    budget = {r["quantizer"]: r for r in data["same_budget"]}
    assert budget["bf16"]["batch"] == 0 and budget["naive_int2"]["batch"] > 0
    assert "| oom |" in capsys.readouterr().out


def test_an_oom_row_names_the_planned_cache_bytes(monkeypatch):
    """The bytes an OOM row asks for are the memory plan's: a BF16 cache holds K and V at 2 bytes per element per
    layer; a 2-bit cache, with its BF16 sink and recent rows, about 7x less at 100k tokens."""
    from types import SimpleNamespace
    from transformers import Qwen3Config
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_throughput
    config = Qwen3Config(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                         hidden_size=512)
    model = SimpleNamespace(config=config)
    bf16 = bench_throughput.planned_kv_bytes(model, "bf16", 4, 100_000)
    assert bf16 == 3 * 2 * 4 * 100_000 * 2 * 128 * 2
    assert 5 < bf16 / bench_throughput.planned_kv_bytes(model, "naive_int2+graph", 4, 100_000) < 8
    error = RuntimeError("CUDA out of memory. Tried to allocate 1 GiB. GPU 0 has a total capacity of ...\nmore")
    row = bench_throughput.oom_row(model, "bf16", 4, 99_990, 10, 2 * 10**9, error)
    assert row["status"] == "oom" and row["asked_gb"] == round((2 * 10**9 + bf16) / 1e9, 2)
    assert row["error"].endswith("(weights 2.0 GB + KV cache 1.2 GB at batch 4 x 100000 tokens); CUDA out of memory. "
                                 "Tried to allocate 1 GiB.")


def test_step_profile_splits_gpu_time_by_kernel_kind():
    from types import SimpleNamespace
    from torch.autograd import DeviceType
    from harness.step_profile import kernel_kind, split_kernel_times
    assert kernel_kind("_decode_stage1_kernel") == "attn"
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm90") == "attn"
    assert kernel_kind("_quantize_pack_kernel") == "kv_write"
    assert kernel_kind("nvjet_tst_128x64_64x8_1x1_v_bz_TNN") == "gemm"
    assert kernel_kind("vectorized_elementwise_kernel") == "other"
    ev = lambda name, us, dev=DeviceType.CUDA: SimpleNamespace(name=name, self_device_time_total=us, device_type=dev)
    split = split_kernel_times([ev("_decode_stage1_kernel", 500), ev("sm90_xmma_gemm", 1500), ev("elementwise", 125),
                                ev("elementwise", 125), ev("aten::mm", 9000, DeviceType.CPU)])
    assert split["gpu_attn_ms"] == 0.5 and split["gpu_gemm_ms"] == 1.5 and split["gpu_other_ms"] == 0.25
    assert split["gpu_ms"] == 2.25 and split["kernels"] == 4          # CPU-side ops are not counted
    assert split["top_kernels"] == [["sm90_xmma_gemm", 1.5, 1], ["_decode_stage1_kernel", 0.5, 1],
                                    ["elementwise", 0.25, 2]]


def test_profile_rows_profiles_a_steady_step_past_a_demoting_one():
    """With a frozen cache's predicate, a step that would start with a page demotion runs unprofiled first and the
    row says the profiled step was steady; without one, the row has no such key."""
    from harness.step_profile import profile_rows
    calls = []
    demoting = {3}                                   # the third call would demote (after the two warm-up calls)

    def step():
        calls.append(len(calls) + 1)
        sum(range(4))

    row = profile_rows(step, demotes_next=lambda: len(calls) + 1 in demoting)
    assert calls == [1, 2, 3, 4] and row["profiled_demotion"] is False
    demoting = set(range(1, 10))                     # every step demotes: two skipped, then profiled anyway
    calls.clear()
    assert profile_rows(step, demotes_next=lambda: len(calls) + 1 in demoting)["profiled_demotion"] is True
    assert len(calls) == 5
    assert "profiled_demotion" not in profile_rows(step)


def test_bench_throughput_profile_mode_reports_the_split(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--tiny", "--steps", "1", "--ctx", "600",
                           "--batch", "1", "--profile", "--quantizers", "bf16,naive_int2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json
    rows = json.loads((tmp_path / "bench_throughput_profile.json").read_text())["rows"]
    assert [r["quantizer"] for r in rows] == ["bf16", "naive_int2"]
    assert all(r["wall_ms"] > 0 and "gpu_attn_ms" in r for r in rows)
    assert "Same memory budget" not in proc.stdout


def test_count_step_ops_runs_and_model_dtype_rotations_drop_the_casts():
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "scripts/dev/count_step_ops.py", "--layers", "2", "--ctx", "640",
                           "--quantizers", "bf16,oscar,oscar:model,oscar:model+compile"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split("|")[1].strip(): int(line.split("|")[2]) for line in proc.stdout.splitlines()
            if line.startswith("| ") and line.split("|")[2].strip().isdigit()}
    assert set(rows) == {"bf16", "oscar", "oscar:model", "oscar:model+compile"}
    assert rows["bf16"] < rows["oscar:model"] < rows["oscar"]   # bf16 model: fp32 rotations cast q, k and out there and back
    assert rows["oscar:model+compile"] < rows["oscar:model"] / 2   # RMSNorms, RoPE, SiLU*up: one kernel each


def test_time_prefill_runs_on_the_offline_gemma_and_both_paths_agree():
    proc = subprocess.run([sys.executable, "scripts/dev/time_prefill.py", "--ctx", "1100", "--repeats", "1"], cwd=ROOT,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = [line for line in proc.stdout.splitlines() if line.startswith("| gemma3_270m")]
    assert len(row) == 1
    max_logit_diff = float(row[0].split("|")[8])
    assert max_logit_diff < 0.1                          # windowed (1100 > 2 x 512 rows) vs one full-mask SDPA


def test_decode_sass_counts_the_history_loops_and_warp_tiles_issue_fewer_instructions():
    """scripts/dev/decode_sass.py compiles stage 1 for sm_90a offline (Triton's ptxas/nvdisasm): no GPU needed."""
    proc = subprocess.run([sys.executable, "scripts/dev/decode_sass.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {(row[0].strip(), row[1].strip()): row for row in
            (line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith(("| row", "| warp")))}
    ops = {key: {op.split()[0]: int(op.split()[1]) for op in row[6].split(",")} | {"per128": int(row[5])}
           for key, row in rows.items()}
    # row-major: 4 fields x (K and V) x 8 MMAs per warp per 128-token tile; warp tiles (64 tokens per warp, one
    # N=8 tile of query rows): scores 4 M-tiles x 8 k-steps, values 4 fields x 2 M-tiles x 4 k-steps
    assert ops["row-major", "True"]["HMMA"] == 64 and ops["warp tiles", "True"]["HMMA"] == 64
    for asm in ("False", "True"):  # one AND per fp16 pair and field (128 per 128 tokens and warp), a few others
        assert 128 <= ops["row-major", asm]["LOP3"] <= 136 and 256 <= ops["warp tiles", asm]["LOP3"] <= 272
    assert ops["warp tiles", "True"]["per128"] < 0.5 * ops["row-major", "True"]["per128"]
    shared = {key: {op.split()[0]: int(op.split()[1]) for op in row[7].split(",")} for key, row in rows.items()}
    barriers = {key: sum(n for op, n in ops.items() if op.startswith("BAR.SYNC")) for key, ops in shared.items()}
    assert 0 < barriers["warp tiles", "False"] < barriers["row-major", "False"]  # fewer block barriers per tile
    # the codes reach both MMAs as 16-bit words through matrix loads, no byte gathers (the row-major loop's remain)
    assert "LDS.U8" not in shared["warp tiles", "False"] and shared["row-major", "False"]["LDS.U8"] == 32
    assert sum(n for op, n in shared["warp tiles", "False"].items() if op.startswith("LDSM")) >= 12


def test_decode_sass_counts_kivi4_and_its_launch_rules_issue_fewer_instructions():
    """decode_sass.py --layout kivi4 / kivi4-d64 (4-bit per-channel keys, offline): the inline-PTX unpack that
    `channel_key_asm` takes at head_dim 128 and 64 issues fewer instructions per 128 tokens than the byte unpack,
    and at head_dim 64 two key groups per warp (the default's 256-token tiles) fewer than one."""
    per128 = {}
    for layout in ("kivi4", "kivi4-d64"):
        proc = subprocess.run([sys.executable, "scripts/dev/decode_sass.py", "--layout", layout], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        for row in (line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| warp")):
            assert row[0].strip() == "warp tiles, channel keys"
            per128[layout, row[1].strip(), int(row[2])] = int(row[5])
    assert set(per128) == {("kivi4", "False", 128), ("kivi4", "True", 128), ("kivi4-d64", "False", 128),
                           ("kivi4-d64", "False", 256), ("kivi4-d64", "True", 256)}
    assert per128["kivi4", "True", 128] < per128["kivi4", "False", 128]
    assert per128["kivi4-d64", "False", 256] < per128["kivi4-d64", "False", 128]
    assert per128["kivi4-d64", "True", 256] < per128["kivi4-d64", "False", 256]


def test_decode_sass_compiles_the_wide_pairs_as_run_with_fewer_loop_instructions():
    """`decode_sass.py --layout int2-wide`: the large grid's 8-row launch at head_dim 128, GQA 4, the same launch after
    `four_row_pairs` (4-row programs over 64-byte pair rows), after `column_meta_pairs` and after
    `masked_pair_tile_launches` (as run), offline: each of the first three issues fewer loop instructions per 128
    tokens than the one before under the same 168-register cap, the column meta fewer block barriers
    (results/bench/bench_kernel_wide_pairs_limits_h200.md, _column_meta_h200.md), and the loop of whole unmasked
    tiles fewer than the one that masks every tile; the 8-row loop's partial-tile mask is a branch whole tiles
    skip."""
    proc = subprocess.run([sys.executable, "scripts/dev/decode_sass.py", "--layout", "int2-wide"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {row[0].strip(): row for row in (line.split("|")[1:-1] for line in proc.stdout.splitlines()
                                            if line.startswith("| warp"))}
    columns, masked = "warp tiles, pairs, column meta", "warp tiles, pairs, column meta, masked tiles"
    assert set(rows) == {"warp tiles", "warp tiles, pairs", columns, masked}
    per128 = {name: int(row[5]) for name, row in rows.items()}
    barriers = {name: int(re.search(r"BAR\.SYNC\S* (\d+)", row[7]).group(1)) for name, row in rows.items()}
    assert per128[columns] < per128["warp tiles, pairs"] < per128["warp tiles"]
    assert per128[columns] < per128[masked]
    assert barriers[columns] < barriers["warp tiles, pairs"]
    assert all(int(row[3]) <= 168 for row in rows.values())
    assert all(int(rows[name][8]) == per128[name] for name in rows if "pairs" in name)  # no forward branches
    assert int(rows["warp tiles"][8]) < per128["warp tiles"]


def test_decode_sass_skips_the_bodies_of_forward_branches():
    """`skipping_forward_branches` drops what a forward branch jumps over, keeps the loop's back branch and the
    label's instructions (the path of a tile that skips a rarely needed fix-up, e.g. a rescale)."""
    sass = ["  .L_x_3:", "        /*0000*/  HMMA.16816.F32 R1, R2, R4, R1 ;", "        /*0010*/  @!P2 BRA `(.L_x_2) ;",
            "        /*0020*/  FMUL R5, R5, R6 ;", "        /*0030*/  FMUL R7, R7, R6 ;", "  .L_x_2:",
            "        /*0040*/  MUFU.EX2 R8, R9 ;", "        /*0050*/  @!P1 BRA `(.L_x_3) ;"]
    code = ("import sys; sys.path.insert(0, 'scripts/dev'); import decode_sass as d; import json; "
            f"lines = json.loads({json.dumps(json.dumps(sass))}); "
            "print(d.skipping_forward_branches(lines), d.opcodes(lines))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("] [")[0] + "]" == "['HMMA', 'BRA', 'MUFU', 'BRA']"
    assert proc.stdout.strip().endswith("['HMMA', 'BRA', 'FMUL', 'FMUL', 'MUFU', 'BRA']")


def test_decode_sass_launches_spill_nowhere_but_under_the_small_grids_cap():
    """`decode_sass.py --launches` compiles INT2's launch on every grid (head_dim 64 / 128 / 256, GQA 4 and 16) for
    sm_90a offline, `four_row_pairs` applied as at run time: no history loop spills except under the small grid's
    128-register cap and in head_dim 64's 16-row pair programs (255 registers: a few, since whole tiles compile
    unmasked beside the masked partial ones, timed faster, results/bench/bench_kernel_whole_tiles_h200.md); GQA 4
    reads 4-row pair programs at head_dim 64 and wide pairs at 128 off the small grids, each
    below the 8-row pair-word loop's instruction count (714 / 417 per 128 tokens, results/bench/decode_sass.md)."""
    proc = subprocess.run([sys.executable, "scripts/dev/decode_sass.py", "--launches"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()]
    launches = {(int(r[0]), int(r[1]), r[2].strip()): (r[5].strip(), r[6].strip(), int(r[8]), int(r[9]), int(r[10]))
                for r in rows}
    assert len(launches) == 24
    for (head_dim, group, grid), (maxnreg, _, registers, per128, spills) in launches.items():
        assert spills == 0 or maxnreg == "128" or (head_dim, group) == (64, 16), (head_dim, group, grid, spills)
    four_rows = {key for key, launch in launches.items() if launch[1] == "4"}
    assert four_rows == {(64, 4, grid) for grid in ("tiny", "small", "medium", "large")} | \
        {(128, 4, "medium"), (128, 4, "large")}
    assert launches[64, 4, "tiny"][2] <= 168 and launches[64, 4, "tiny"][3] < 714   # 6 programs per SM fit
    assert launches[128, 4, "large"][3] < 417 and launches[256, 4, "large"][3] < 710   # 570 / 990 as bytes


@pytest.mark.parametrize("layout", ["kivi2", "kivi4"])
def test_decode_sass_launches_of_kivi_name_their_spills(layout):
    """`decode_sass.py --launches --layout kivi2 / kivi4` compiles KIVI's launch (`launch_config`, then
    `four_row_pairs`: KIVI-2's 4-row channel-key pair programs at head_dim 64, GQA 4) on every grid for
    sm_90a offline, with its 8-row programs and inline-PTX unpack. Its history loop spills only where the registers
    run out: under the small grid's 128-register cap, or at 255 (KIVI-2's 16-row programs at head_dim 64;
    bench_formats_kivi4_grid_h200.md lists the counts); KIVI-4 at head_dim 256, chunked (`_key_chunks`), not at all.
    KIVI-4 unpacks in inline PTX at head_dim 256, at 128 off the tiny grid or with 16 rows, and at 64 in 8-row
    programs; KIVI-2 at 128 and on the tiny grid at 64."""
    proc = subprocess.run([sys.executable, "scripts/dev/decode_sass.py", "--launches", "--layout", layout], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in proc.stdout.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert len(rows) == 24
    for head_dim, group, grid, _, _, maxnreg, warp_rows, asm, registers, per128, spills in rows:
        assert int(spills) == 0 or maxnreg == "128" or registers == "255", (head_dim, group, grid)
        assert int(spills) == 0 or head_dim != "256"
        asm_kivi4 = head_dim == "256" or (head_dim == "128" and (grid != "tiny" or group == "16")) or \
            (head_dim == "64" and group == "4")
        asm_kivi2 = head_dim == "128" or (head_dim == "64" and grid == "tiny")
        assert asm == str(asm_kivi4 if layout == "kivi4" else asm_kivi2)
        eight = group == "16" and head_dim == "256"
        four = layout == "kivi2" and head_dim == "64" and group == "4"    # `four_row_pairs`: channel-key pairs
        assert warp_rows == ("8" if eight else "4" if four else "None")


def test_single_launch_merge_orders_its_memory_on_the_h100():
    """DecodeConfig.single_launch compiled for sm_90a offline: the partials are stored before a block barrier, one
    thread fences (release) and takes the counter at GPU scope, invalidates L1 (acquire) and shares the count
    through a barrier before any thread reads the other programs' partials."""
    proc = subprocess.run([sys.executable, "scripts/dev/decode_sass.py", "--single-launch"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    orderings = [line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("single-launch")]
    assert orderings == ["BAR.SYNC MEMBAR.ALL.GPU ATOMG.E.ADD.STRONG.GPU CCTL.IVALL BAR.SYNC"] * 2


def test_write_sass_counts_the_clip_and_the_descent_issues_fewer_instructions_than_extraction():
    """scripts/dev/write_sass.py compiles the write kernel for sm_90a offline: no GPU needed."""
    proc = subprocess.run([sys.executable, "scripts/dev/write_sass.py", "--methods", "no clip,extract,descend"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith(("| none", "| bf16"))]
    per_row = {(row[0].strip(), row[1].strip()): int(row[6]) for row in rows}
    spills = {(row[0].strip(), row[1].strip()): int(row[4]) for row in rows}
    for rotation in ("none", "bf16"):
        assert per_row[rotation, "no clip"] < per_row[rotation, "descend"] < per_row[rotation, "extract"]
        assert spills[rotation, "descend"] == 0


def test_turbo_sass_counts_the_warp_tile_loop():
    """scripts/dev/turbo_sass.py compiles TurboQuant's stage 1 for sm_90a offline. At head_dim 128 (128-token tiles,
    4 warps of 32 tokens) the scores, the squared-centroid sums and the values are 16 m16n8k16 steps each per warp
    and tile (8 chunks of 16 rows); a lane holds 128 key codes per tile, whose centroids the byte-table lookup
    picks with 6 PRMT per 4 codes at 2 and 3 bits (no select per code), and the codes reach the MMA layout as bytes
    (no 16-bit shared-memory round trip)."""
    proc = subprocess.run([sys.executable, "scripts/dev/turbo_sass.py", "--head-dims", "128", "--bits", "3:3,2:4",
                           "--top", "40"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {row[1].strip(): row for row in (line.split("|")[1:-1] for line in proc.stdout.splitlines()
                                            if line.startswith("| 128 "))}
    ops = {bits: {op.split()[0]: int(op.split()[1]) for op in row[7].split(",")} | {"per128": int(row[6])}
           for bits, row in rows.items()}
    for bits, row in rows.items():
        assert ops[bits]["HMMA"] == 48
        assert ops[bits]["PRMT"] >= 6 * 128 // 4 and ops[bits].get("FSEL", 0) < 128
        assert "STS.U16" not in row[8] and "STS.U8" in row[8]


def test_bench_formats_launch_variants_parse_and_refuse_unknown_fields(monkeypatch):
    """`--launch` names DecodeConfig fields to change from a format's default launch ('none' lifts the register cap
    or the row rule); a typo ends the run."""
    import pytest
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_formats import parse_launches
    assert parse_launches("block_n=128,num_warps=8;single_launch=true") == [
        {"block_n": 128, "num_warps": 8}, {"single_launch": True}]
    assert parse_launches("") == []
    with pytest.raises(SystemExit, match="unknown DecodeConfig field 'blockn'"):
        parse_launches("blockn=128")
    with pytest.raises(SystemExit, match="block_n needs an integer or true/false, got '12x'"):
        parse_launches("block_n=12x")
    assert parse_launches("maxnreg=none,warp_rows=none;maxnreg=255") == [{"maxnreg": None, "warp_rows": None},
                                                                          {"maxnreg": 255}]
    with pytest.raises(SystemExit, match="block_n needs an integer or true/false, got 'none'"):
        parse_launches("block_n=none")
    with pytest.raises(SystemExit, match="maxnreg needs an integer or true/false or none, got 'x'"):
        parse_launches("maxnreg=x")


def test_bench_formats_points_take_the_kernel_grid_by_name(monkeypatch):
    """--points grid is bench_kernel_grid.py's 16 points, batch fastest (the order of the committed format grid's
    runs); other text stays batch:ctx and is refused otherwise."""
    import argparse
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_formats import format_points
    grid = format_points("grid")
    assert len(grid) == 16 and grid[:5] == [(1, 1024), (3, 1024), (8, 1024), (32, 1024), (1, 8192)]
    assert grid[-1] == (32, 102400) and format_points("2:4096") == [(2, 4096)]
    with pytest.raises(argparse.ArgumentTypeError, match="each point is batch:ctx"):
        format_points("grids")


def test_bench_formats_check_fails_a_wrong_or_failing_kernel(monkeypatch):
    """check_format compares a format's decode call with attention_reference over the quantizer's own dequantization
    of the same random parts (here under the Triton interpreter): KIVI-2 and INT2 pass; a kernel 5 % off, or one that
    raises, gives one failure line each."""
    import kernels.decode
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_formats import check_format
    from bench_kernels import AttnShape
    shape = AttnShape(16, 2, 64)
    assert check_format("kivi2", shape, 1, device="cpu") == [] and check_format("int2", shape, 1, device="cpu") == []
    decode = kernels.decode.decode_attention
    monkeypatch.setattr(kernels.decode, "decode_attention", lambda *a, **kw: decode(*a, **kw) * 1.05)
    failed = check_format("int2", shape, 1, device="cpu")
    assert len(failed) == 1 and "rel err" in failed[0]

    def refuse(*args, **kwargs):
        raise ValueError("no launch here.\nsecond line")
    monkeypatch.setattr(kernels.decode, "decode_attention", refuse)
    assert check_format("int2", shape, 1, device="cpu")[0].endswith("batch 1 ctx 1024: no launch here.")


def test_bench_formats_targets_count_each_format_at_its_default_launch(monkeypatch):
    """format_targets gives each packed format the grid's targets from its own rows: one-token rows at the default
    launch only (a --launch variant and BF16 rows are not counted), the 5x target for 2-bit formats only, and the
    points a format failed to launch at listed apart."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_formats import format_targets

    def row(fmt, batch, ctx, vs_sdpa, of_copy, **extra):
        return dict(head_dim=64, group=12, batch=batch, ctx=ctx, q_tokens=1, format=fmt, vs_sdpa=vs_sdpa,
                    of_copy=of_copy, **extra)
    rows = [row("bf16 (SDPA)", 32, 102400, 1.0, 1.0), row("kivi2", 32, 102400, 5.2, 0.81),
            row("kivi2", 1, 1024, 0.7, 0.1), row("kivi2 [block_n=64]", 1, 1024, 1.5, 0.2),
            row("int4", 32, 102400, 3.1, 0.9), row("int4", 8, 32768, 0.0, 0.0, error="out of resources")]
    del rows[-1]["vs_sdpa"], rows[-1]["of_copy"]
    text = format_targets(rows)
    kivi, int4 = text.split("int4:")
    assert "kivi2 >= BF16 SDPA at 1 of 2 points; below: 64/12/1/1024." in kivi
    assert ">= 5x BF16 SDPA at batch 32 / ctx >= 100k: 1 of 1 points: 64/12/32/102400." in kivi
    assert "int4 >= BF16 SDPA at 1 of 1 points; below: none." in int4 and "5x" not in int4
    assert "int4 failed to launch at: 64/12/8/32768 (out of resources)." in int4


def test_kernel_grid_targets_count_the_rows(monkeypatch):
    """target_summary counts each target from the rows: a point below SDPA, one at >= 80 % of copy (only at ctx >= 32k
    and batch >= 8), one at >= 5x (only at batch 32 / >= 100k)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_kernel_grid import target_summary

    def row(batch, ctx, vs_sdpa, of_copy):
        return dict(head_dim=128, group=4, batch=batch, ctx=ctx, int2_vs_sdpa=vs_sdpa, int2_of_copy=of_copy)
    rows = [row(1, 1024, 0.9, 0.9), row(8, 32768, 3.0, 0.85), row(8, 8192, 2.0, 0.95), row(32, 102400, 5.5, 0.7),
            row(32, 32768, 6.0, 0.5)]
    text = target_summary(rows)
    assert "| 128 | 1024 | 0.90-0.90x | 1 of 1 | - |" in text
    assert "INT2 >= BF16 SDPA at 4 of 5 points; below: 128/4/1/1024." in text
    assert "copy bandwidth at ctx >= 32k and batch >= 8: 1 of 3 points: 128/4/8/32768." in text
    assert ">= 5x BF16 SDPA at batch 32 / ctx >= 100k: 1 of 1 points: 128/4/32/102400." in text


WIDE_HEAD = "bench_kernel_wide_head_launches_h200"   # its sweeps, confirmations and grid points


@pytest.mark.parametrize("script, runs, committed, least_lines, needle", [
    ("bench_kernel_grid.py", "bench_kernel_grid_final_d{}.json", "bench_kernel_grid_final.md", 300,
     "INT2 >= BF16 SDPA"),
    ("bench_kernel_grid.py", ["bench_kernel_grid_h200_c8f5e6d_a.json", "bench_kernel_grid_h200_1b6083b_a.json",
                              "bench_kernel_grid_h200_1b6083b_b.json"], "bench_kernel_grid_h200_1b6083b.md", 450,
     "INT2 >= BF16 SDPA at 242 of 288 points"),
    ("bench_kernel_grid.py", ["bench_kernel_grid_h200_c8f5e6d_a.json", "bench_kernel_grid_h200_1b6083b_a.json",
                              "bench_kernel_grid_h200_1b6083b_b.json", "bench_kernel_grid_h200_2311a7c_d128.json"],
     "bench_kernel_grid_h200_2311a7c.md", 450, "INT2 >= BF16 SDPA at 243 of 288 points"),
    ("bench_kernel_grid.py", ["bench_kernel_grid_h200_e284aa1_d128_g16.json"],
     "bench_kernel_grid_h200_e284aa1_d128_g16.md", 25, "INT2 >= BF16 SDPA at 13 of 16 points"),
    ("bench_kernel_grid.py", ["bench_kernel_grid_h200_2cd8a04_d64_d128.json",
                              "bench_kernel_grid_h200_e6cb4ca_d128_g16.json",
                              "bench_kernel_grid_h200_e6cb4ca_d256.json"],
     "bench_kernel_grid_h200_one_tree.md", 300, "INT2 >= BF16 SDPA at 241 of 288 points"),
    ("bench_formats.py", ["bench_formats_kivi2_grid_h200_e284aa1_d64.json"], "bench_formats_kivi2_h200_e284aa1.md", 290,
     "kivi2 >= BF16 SDPA at 43 of 96 points"),
    ("bench_formats.py", ["bench_formats_kivi2_b2_h200_e284aa1.json"], "bench_formats_kivi2_h200_e284aa1.md", 100,
     "kivi2 >= BF16 SDPA at 12 of 18 points"),
    ("bench_formats.py", ["sweep_pairs_kivi_d128_h200_call1_int2.json"], "sweep_pairs_kivi_d128_h200.md", 70,
     "| 128 | 4 | 110 | 102400 | int2 [warp_rows=4 wide_pairs=True] | 2.216 | 70% | 4.67x |"),
    ("bench_formats.py", ["sweep_pairs_kivi_d128_h200_call1_kivi2.json"], "sweep_pairs_kivi_d128_h200.md", 40,
     "| 64 | 4 | 110 | 102400 | kivi2 [warp_rows=4] | 3.034 | 34% | 1.71x |"),
    ("bench_formats.py", "bench_formats_grid_h200_d{}.json", "bench_formats_kivi_grid_h200.md", 1000,
     "int4 >= BF16 SDPA at 235 of 288 points"),
    ("bench_formats.py", "bench_formats_kivi4_grid_h200_d{}.json", "bench_formats_kivi4_grid_h200.md", 800,
     "kivi4 >= BF16 SDPA at 106 of 288 points"),
    ("bench_formats.py", ["bench_formats_kivi4_chunks_h200_d256.json"], "bench_formats_kivi_tiny_h200.md", 250,
     "kivi4 >= BF16 SDPA at 60 of 96 points"),
    ("bench_formats.py", ["bench_formats_kivi_tiny_after_h200.json"], "bench_formats_kivi_tiny_h200.md", 150,
     "kivi2 >= BF16 SDPA at"),
    ("bench_formats.py", ["bench_formats_kivi_rules_b1_h200.json"], "bench_formats_kivi_rows16_h200.md", 90,
     "kivi2 >= BF16 SDPA at 14 of 32 points"),
    ("bench_formats.py", ["bench_formats_kivi_small_h200.json"], "bench_formats_kivi_small_h200.md", 100,
     "kivi2 >= BF16 SDPA at 5 of 19 points"),
    ("bench_formats.py", ["bench_formats_kivi_small_final_h200.json"], "bench_formats_kivi_small_h200.md", 80,
     "kivi4 >= BF16 SDPA at 7 of 16 points"),
    ("bench_formats.py", ["bench_formats_turbo_words_base_h200.json"], "bench_formats_turbo_words_h200.md", 40,
     "turboquant_k3v3 >= BF16 SDPA at 0 of 12 points"),
    ("bench_formats.py", ["bench_formats_turbo_keywords_keys1_h200.json",
                          "bench_formats_turbo_keywords_keys2_h200.json"],
     "bench_formats_turbo_keywords_h200.md", 40, "turboquant_k3v3 >= BF16 SDPA at 0 of 12 points"),
    ("bench_formats.py", ["bench_formats_turbo_keywords_launch_h200.json"], "bench_formats_turbo_keywords_h200.md", 30,
     "turboquant_k3v3 >= BF16 SDPA at 0 of 6 points"),
    ("bench_formats.py", "bench_formats_turbo_grid_h200_d{}.json", "bench_formats_turbo_grid_h200.md", 300,
     "turboquant_k3v3 >= BF16 SDPA at 4 of 288 points"),
    ("bench_formats.py", ["bench_formats_turbo_b1_warps_h200.json"], "bench_formats_turbo_keywords_h200.md", 30,
     "turboquant_k3v3 >= BF16 SDPA at 0 of 8 points"),
    ("bench_formats.py", ["bench_formats_turbo_b1_rule_h200.json"], "bench_formats_turbo_keywords_h200.md", 25,
     "turboquant_k3v3 >= BF16 SDPA at 0 of 6 points"),
    ("bench_formats.py", ["bench_formats_turbo_small_launch_h200.json"], "bench_formats_turbo_keywords_h200.md", 40,
     "turboquant_k3v3 >= BF16 SDPA at 0 of 9 points"),
    ("bench_formats.py", ["bench_kernel_column_meta_rows_h200_r1.json"], "bench_kernel_column_meta_rows_h200.md", 130,
     "int2 >= BF16 SDPA at 16 of 30 points"),
    ("bench_kernel_grid.py", ["bench_kernel_grid_h200_027aef4_d64_d128.json", "bench_kernel_grid_h200_027aef4_d256.json"],
     "bench_kernel_grid_h200_027aef4.md", 300, "INT2 >= BF16 SDPA at 242 of 288 points"),
    ("bench_kernel_grid.py", ["bench_kernel_grid_h200_0143580_d64_d128.json", "bench_kernel_grid_h200_0143580_d256.json"],
     "bench_kernel_grid_h200_0143580.md", 300, "INT2 >= BF16 SDPA at 260 of 288 points"),
    ("bench_formats.py", ["bench_kernel_short_four_rows_h200_sweep.json"], "bench_kernel_short_four_rows_h200.md", 100,
     "int2 >= BF16 SDPA at 11 of 30 points"),
    ("bench_formats.py", ["bench_kernel_short_four_rows_h200_confirm.json"], "bench_kernel_short_four_rows_h200.md", 40,
     "int2 >= BF16 SDPA at 2 of 12 points"),
    ("bench_kernel_grid.py", ["bench_kernel_grid_h200_2fd0b10_d64_1k_rows8_12.json"],
     "bench_kernel_short_four_rows_h200.md", 10, "INT2 >= BF16 SDPA at 2 of 6 points"),
    ("bench_kernel_grid.py", ["bench_kernel_grid_h200_a42cb08_1k.json"], "bench_kernel_grid_h200_a42cb08_1k.md", 50,
     "INT2 >= BF16 SDPA at 29 of 43 points"),
    ("bench_formats.py", ["bench_kernel_short_splits_h200_call2_one_split.json"], "bench_kernel_short_splits_h200.md",
     200, "int2 >= BF16 SDPA at 43 of 54 points"),
    ("bench_formats.py", ["bench_kernel_short_splits_h200_call1_d128.json"], "bench_kernel_short_splits_h200.md",
     150, "int2 >= BF16 SDPA at 7 of 17 points"),
    ("bench_formats.py", [f"{WIDE_HEAD}_sweep_d64.json"], f"{WIDE_HEAD}.md", 100, "int2 >= BF16 SDPA at 1 of 9 points"),
    ("bench_formats.py", [f"{WIDE_HEAD}_confirm_{name}.json" for name in ("tiny1", "tiny2", "med1", "med2", "medlong",
                                                                        "medall")],
     f"{WIDE_HEAD}.md", 200, "int2 >= BF16 SDPA at 39 of 54 points"),
    ("bench_kernel_grid.py", [f"bench_kernel_grid_h200_ea096d1_1k_{name}.json" for name in ("d256", "d128_g16",
                                                                                           "d128_g12")],
     f"{WIDE_HEAD}.md", 40, "INT2 >= BF16 SDPA at 18 of 29 points"),
    ("bench_formats.py", ["bench_formats_model_heads_h200_gemma3_270m.json"], "bench_formats_model_heads_h200.md", 40,
     "int2 >= BF16 SDPA at 14 of 16 points"),
    ("bench_formats.py", ["bench_formats_model_heads_h200_smollm2_135m.json"], "bench_formats_model_heads_h200.md", 40,
     "int2 >= BF16 SDPA at 14 of 16 points"),
    ("bench_formats.py", ["bench_formats_model_heads_h200_sweep_d64_two_tiles.json"],
     "bench_formats_model_heads_h200.md", 40, "int2 >= BF16 SDPA at 16 of 20 points"),
])
def test_from_json_rebuilds_the_committed_grid(script, runs, committed, least_lines, needle):
    """A committed grid (bench_kernel_grid.py's INT2 grid, bench_formats.py's INT4 / KIVI-2 and KIVI-4 grids, and
    KIVI's later runs: one file each) is what the script's --from-json prints from its JSON (targets and tables, no
    hand-typed line), and a missing file is refused in one sentence."""
    bench = ROOT / "results" / "bench"
    names = [runs.format(d) for d in (64, 128, 256)] if isinstance(runs, str) else runs
    files = [str(bench / name) for name in names]
    proc = subprocess.run([sys.executable, f"scripts/{script}", "--from-json", *files], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (bench / committed).read_text()
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) > least_lines and all(line in text for line in lines) and needle in proc.stdout
    proc = subprocess.run([sys.executable, f"scripts/{script}", "--from-json", "missing.json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--from-json: no such file: missing.json." in proc.stderr


def test_known_limits_cite_the_merged_h200_grid_of_the_formats():
    """docs/known_limits.md's counts of INT4 / KIVI-2 / KIVI-4 / TurboQuant K3V3 points below BF16 SDPA on the H200
    are what `bench_formats.py --grid-only --from-json` prints over results/bench/bench_formats_h200_grid.txt's runs (a
    later run's row of a point replacing an earlier one): 288 grid points each, none typed apart from the rows."""
    manifest = ROOT / "results" / "bench" / "bench_formats_h200_grid.txt"
    files = [line for line in manifest.read_text().splitlines() if line.strip() and not line.startswith("#")]
    proc = subprocess.run([sys.executable, "scripts/bench_formats.py", "--grid-only", "--from-json", *files], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = {fmt: int(at) for fmt, at in re.findall(r"^(\w+) >= BF16 SDPA at (\d+) of 288 points", proc.stdout, re.M)}
    formats = ("kivi2", "kivi4", "int4", "turboquant_k3v3")
    assert set(counts) == set(formats)
    limits = " ".join((ROOT / "docs" / "known_limits.md").read_text().split())
    below = re.search(r"KIVI-2 at (\d+) of the grid's 288 points on the H200, KIVI-4 at (\d+), INT4 at (\d+), "
                      r"TurboQuant K3V3 at (\d+)", limits)
    assert below and tuple(map(int, below.groups())) == tuple(288 - counts[f] for f in formats)
    proc = subprocess.run([sys.executable, "scripts/bench_formats.py", "--grid-only"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "--grid-only counts saved runs' targets" in proc.stderr


def test_saved_runs_of_another_kind_are_refused_in_one_sentence(monkeypatch, tmp_path):
    """read_runs (both scripts' --from-json and --against) takes only JSON runs whose rows hold the script's key:
    a bench_formats run given to bench_kernel_grid, a composite file or a broken file ends with one sentence."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_kernel_grid import read_runs
    bench = ROOT / "results" / "bench"
    assert len(read_runs([str(bench / "bench_formats_grid_h200_d64.json")], "--from-json", "format")) == 1
    with pytest.raises(SystemExit, match=r"^--from-json: .*d64.json is not a run of this script \(its rows need "
                                         r"'int2_ms'\)\.$"):
        read_runs([str(bench / "bench_formats_grid_h200_d64.json")], "--from-json", "int2_ms")
    with pytest.raises(SystemExit, match="is not a run of this script"):
        read_runs([str(bench / "bench_formats_two_warps.json")], "--from-json", "format")
    broken = tmp_path / "broken.json"
    broken.write_text('{"rows": [')
    with pytest.raises(SystemExit, match=r"^--against: .*broken.json is not a readable JSON file "
                                         r"\(JSONDecodeError\)\.$"):
        read_runs([str(broken)], "--against", "int2_ms")


def test_bench_formats_time_ratios_pair_each_format_and_point(monkeypatch, tmp_path):
    """format_time_ratios divides the baseline's time by these rows' per format (launch variants apart) and
    (head_dim, group), at the points both hold, with SDPA's ratio at the same points beside; rows that failed or
    hold several query tokens are left out. --against without --from-json, or with a missing file, is refused in one
    sentence."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_formats import format_time_ratios

    def row(fmt, group, batch, ms, q_tokens=1):
        return dict(head_dim=64, group=group, batch=batch, ctx=1024, q_tokens=q_tokens, format=fmt, ms=ms)
    rows = [row("bf16 (SDPA)", 4, 1, 1.0), row("bf16 (SDPA)", 4, 8, 2.0), row("kivi4", 4, 1, 1.0),
            row("kivi4", 4, 8, 2.0), row("kivi4 [warp_rows=8]", 4, 1, 4.0), row("kivi4", 16, 1, 3.0),
            row("kivi4", 4, 32, 1.0), row("kivi2", 4, 1, 1.0, q_tokens=4)]
    baseline = [row("bf16 (SDPA)", 4, 1, 1.0), row("bf16 (SDPA)", 4, 8, 3.0), row("kivi4", 4, 1, 2.0),
                row("kivi4", 4, 8, 3.0), row("kivi4 [warp_rows=8]", 4, 1, 2.0), row("kivi4", 16, 1, 6.0),
                row("kivi2", 4, 1, 9.0, q_tokens=4)]
    failed = {**row("kivi4", 16, 8, 0.0), "error": "out of resources"}
    del failed["ms"]
    text = format_time_ratios(rows + [failed], baseline + [row("kivi4", 16, 8, 1.0)])
    assert "| kivi4 | 64 | 4 | 2 | 1.75 (1.50-2.00) | 1.25 (1.00-1.50) |" in text
    assert "| kivi4 [warp_rows=8] | 64 | 4 | 1 | 0.50 (0.50-0.50) | 1.00 (1.00-1.00) |" in text
    assert "| kivi4 | 64 | 16 | 1 | 2.00 (2.00-2.00) | - |" in text                 # no SDPA row at group 16
    assert "kivi2" not in text and "| bf16 (SDPA) |" not in text
    for args, needle in ((["--against", "a.json"], "--against compares saved runs"),
                         (["--from-json", str(ROOT / "results/bench/bench_formats_kivi4_grid_h200_d64.json"),
                           "--against", "missing.json"], "--against: no such file: missing.json.")):
        proc = subprocess.run([sys.executable, "scripts/bench_formats.py", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode != 0 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_kernel_grid_time_ratios_pair_the_same_points(monkeypatch):
    """time_ratios divides the baseline's time by these rows' at the same (head_dim, group, batch, ctx) only, per
    head_dim, for INT2 and SDPA apart; points the baseline lacks are left out."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_kernel_grid import time_ratios

    def row(head_dim, batch, int2_ms, sdpa_ms):
        return dict(head_dim=head_dim, group=4, batch=batch, ctx=1024, int2_ms=int2_ms, sdpa_ms=sdpa_ms)
    rows = [row(64, 1, 1.0, 1.0), row(64, 8, 2.0, 1.0), row(64, 32, 4.0, 4.0), row(128, 1, 1.0, 2.0)]
    baseline = [row(64, 1, 1.0, 3.0), row(64, 8, 3.0, 2.0), row(128, 1, 9.0, 9.0), row(128, 1, 2.0, 4.0)]
    text = time_ratios(rows, baseline)
    assert "| 64 | 2 | 1.25 (1.00-1.50) | 2.50 (2.00-3.00) |" in text
    assert "| 128 | 1 | 2.00 (2.00-2.00) | 2.00 (2.00-2.00) |" in text      # the later baseline row of a point


def test_kernel_grid_counts_a_point_once_from_the_last_run_and_one_gpu_at_a_time(monkeypatch):
    """--from-json over a full run and a partial re-run counts each point once, from the later file (a re-run of the
    same points used to be counted twice); runs of two GPUs are refused in one sentence."""
    import pytest
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_kernel_grid import newest_rows, one_device

    def row(batch, vs_sdpa):
        return dict(head_dim=64, group=4, batch=batch, ctx=1024, int2_vs_sdpa=vs_sdpa)
    full = {"device": "GPU A", "rows": [row(1, 0.9), row(8, 1.2)]}
    rerun = {"device": "GPU A", "rows": [row(1, 1.1)]}
    rows, replaced = newest_rows([full, rerun])
    assert replaced == 1 and sorted((r["batch"], r["int2_vs_sdpa"]) for r in rows) == [(1, 1.1), (8, 1.2)]
    one_device([full, rerun], "--from-json")
    with pytest.raises(SystemExit, match="these runs come from different GPUs \\(GPU A, GPU B\\)"):
        one_device([full, {**rerun, "device": "GPU B"}], "--from-json")


def test_kernel_grid_merge_table_is_rebuilt_from_its_runs():
    """bench_kernel_grid_merge_h200.md holds what --from-json prints for its first run with the fitted merge
    --against the base run of the same call (targets, time ratios and the run's table)."""
    bench = ROOT / "results" / "bench"
    proc = subprocess.run([sys.executable, "scripts/bench_kernel_grid.py", "--from-json",
                           str(bench / "bench_kernel_grid_merge_h200_new1.json"), "--against",
                           str(bench / "bench_kernel_grid_merge_h200_base2.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    committed = (bench / "bench_kernel_grid_merge_h200.md").read_text()
    lines = [line for line in proc.stdout.splitlines() if line.strip() and not line.startswith("Against")]
    assert len(lines) > 100 and all(line in committed for line in lines)


def test_kernel_grid_h200_table_is_rebuilt_against_the_h100_runs():
    """bench_kernel_grid_h200.md is what --from-json prints for the H200 runs --against the H100 runs (the time
    ratios included); --against alone is refused in one sentence."""
    bench = ROOT / "results" / "bench"
    runs = [str(bench / f"bench_kernel_grid_h200_d{d}.json") for d in (64, 128, 256)]
    h100 = [str(bench / f"bench_kernel_grid_final_d{d}.json") for d in (64, 128, 256)]
    h100.append(str(bench / "bench_kernel_grid_int2_layout_d256.json"))
    proc = subprocess.run([sys.executable, "scripts/bench_kernel_grid.py", "--from-json", *runs, "--against", *h100],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    committed = (bench / "bench_kernel_grid_h200.md").read_text()
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert any(line.startswith("| 128 | 96 | ") for line in lines)
    assert len(lines) > 300 and all(line in committed for line in lines)
    proc = subprocess.run([sys.executable, "scripts/bench_kernel_grid.py", "--against", h100[0]], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--against compares saved runs: give them with --from-json." in proc.stderr


def test_compare_runs_rebuilds_the_committed_before_after_tables():
    """scripts/dev/compare_runs.py builds the before / after tables of results/bench from the committed run JSON: every
    line it prints is in the Markdown file that quotes it (no hand-typed table), and it refuses a missing call."""
    bench = ROOT / "results" / "bench"
    jobs = [(bench / "bench_formats_words.md", ["bench_formats_words_runs.json", "--call", str(call), "--before",
                                                "before", "--after", "words"]) for call in (1, 2, 4)]
    jobs.append((bench / "bench_formats_d64_cap.md", ["bench_formats_d64_cap_runs.json", "--call", "1", "--before",
                                                      "before", "--after", "head"]))
    jobs += [(bench / f"bench_kernel_{name}_h200.md", [f"bench_kernel_{name}_h200_runs.json", "--call", "1",
                                                       "--before", "base", "--after", "new"])
             for name in ("score_chains", "tiny_fold")]
    jobs += [(bench / f"bench_kernel_{name}_h200.md", [f"bench_kernel_{name}_h200_runs.json", "--grid", "--before",
                                                       "base", "--after", "new"])
             for name in ("fp_only", "fp_tiles", "pair_halves")]
    splits = bench / "bench_kernel_large_batch_splits_h200.md"
    jobs += [(splits, ["bench_kernel_large_batch_splits_h200_call1_runs.json", "--grid", "--before", "s1", "--after",
                       after]) for after in ("s3", "s6")]
    jobs += [(splits, [f"bench_kernel_large_batch_splits_h200_{call}_runs.json", "--grid", "--before", "base",
                       "--after", "new"]) for call in ("call2", "call4")]
    jobs.append((splits, ["bench_kernel_large_batch_splits_h200_formats_runs.json", "--call", "1", "--before", "base",
                          "--after", "new"]))
    jobs += [(bench / "sweep_rows4_h200.md", ["sweep_rows4_h200_grid_runs.json", "--grid", "--before", "base", "--after",
                                              "new"]),
             (bench / "sweep_rows4_h200.md", ["bench_throughput_llama32_1b_h200_rows4_runs.json", "--throughput"]),
             (bench / "sweep_pairs_kivi_d128_h200.md", ["sweep_pairs_kivi_d128_h200_grid_runs.json", "--grid",
                                                       "--before", "base", "--after", "new"]),
             (bench / "sweep_pairs_kivi_d128_h200.md", ["sweep_pairs_kivi_d128_h200_kivi_runs.json", "--call", "2",
                                                       "--before", "base", "--after", "new"])]
    jobs += [(bench / "bench_throughput_words.md", ["bench_throughput_words_runs.json", "--throughput"]),
             (bench / "sweep_tiny_int2_words.md", ["sweep_tiny_int2_words_e2e_runs.json", "--throughput"]),
             (bench / "bench_kernels_write_epilogue.md", ["bench_kernels_write_final_runs.json", "--write", "--before",
                                                          "base", "--after", "new"])]
    for markdown, args in jobs:
        proc = subprocess.run([sys.executable, "scripts/dev/compare_runs.py", str(bench / args[0]), *args[1:]],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = proc.stdout.strip().splitlines()
        text = markdown.read_text()
        assert len(lines) > 3 and all(line in text for line in lines), markdown.name
    proc = subprocess.run([sys.executable, "scripts/dev/compare_runs.py", str(bench / "bench_formats_words_runs.json"),
                           "--call", "3", "--before", "before", "--after", "words"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "no call 3" in proc.stderr


def test_turbo_profile_table_quotes_its_nsight_reports():
    """results/bench/ncu_h200_decode_turbo_profiles.md's table is the three committed Nsight Compute reports' lines:
    each cell (column = report) is the last field of a line of its report that names the row's metric."""
    bench = ROOT / "results" / "bench"
    reports = [(bench / name).read_text() for name in ("ncu_h200_decode_int2_b32_100k_beside_turbo.txt",
                                                       "ncu_h200_decode_turbo_b32_100k.txt",
                                                       "ncu_h200_decode_turbo_b1_100k.txt")]
    table = [line.split("|")[1:-1] for line in (bench / "ncu_h200_decode_turbo_profiles.md").read_text().splitlines()
             if line.startswith("| ") and not line.startswith("| line ")]
    assert len(table) == 15
    for name, *cells in table:
        for cell, report in zip(cells, reports, strict=True):
            if name.strip() == "grid x block":
                grid, block = cell.strip().split(" x ")
                assert f"{grid}x({block}, 1, 1)" in report, cell
                continue
            metric, value = name.strip().removesuffix(" per issue"), cell.split()[0]
            assert any(line.split()[-1] == value for line in report.splitlines() if metric in line), (name, cell)


def test_target_status_rebuilds_the_known_limits_tables():
    """docs/known_limits.md's target tables are scripts/target_status.py's output for the commands it quotes (each run
    from the doc's own text), and the script refuses runs of two GPUs counted together and a missing file."""
    import re
    import shlex
    text = (ROOT / "docs" / "known_limits.md").read_text()
    commands = re.findall(r"`(python scripts/target_status\.py [^`]+)`", text)
    assert len(commands) == 2
    for command in commands:
        proc = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 12 and all(line in text for line in lines), lines
    assert "| 262 of 288 points (26 below, 18 of them at 1k) | no |" in text
    bench = ROOT / "results" / "bench"
    mixed = [sys.executable, "scripts/target_status.py", "--grid", str(bench / "bench_kernel_grid_final_d64.json"),
             "--write", str(bench / "bench_kernels_write_final_runs.json"), "--write-tree", "new",
             "--throughput", str(bench / "bench_throughput_h200_55c8058_4b.json")]
    proc = subprocess.run(mixed, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "come from different GPUs" in proc.stderr
    proc = subprocess.run(mixed[:-1] + [str(bench / "missing.json")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "missing.json is not a readable JSON file" in proc.stderr


def test_target_status_counts_an_oscar_cell_that_did_not_fit_as_missing_the_memory_target(monkeypatch):
    """`memory_row`: a BF16 cell that did not fit leaves OSCAR's row within the target; an OSCAR cell that did not fit
    (no peak, status=oom) misses it, where BF16 fit."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from target_status import memory_row
    oscar = [{"batch": 1, "peak_gb": 10.0}, {"batch": 4, "status": "oom"}]
    bf16 = {1: {"batch": 1, "peak_gb": 20.0}, 4: {"batch": 4, "peak_gb": 70.0}}
    _, measured, met = memory_row("m", oscar, bf16)
    assert met == "no" and measured == "1 of 2 OSCAR rows (largest OSCAR / BF16: 0.50; OSCAR status=oom in 1)"
    bf16[4] = {"batch": 4, "status": "oom"}
    _, measured, met = memory_row("m", oscar[:1] + [{"batch": 4, "peak_gb": 30.0}], bf16)
    assert met == "yes" and measured.endswith("(largest OSCAR / BF16: 0.50; BF16 status=oom in 1)")


def test_bench_gemv_shapes_come_from_the_model_configs():
    """scripts/dev/bench_gemv.py times the step's fused projections: derived from bench_throughput's configs, the
    Qwen3-4B shapes of results/bench/bench_gemv.md."""
    import importlib.util
    sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "scripts" / "dev")]
    try:
        spec = importlib.util.spec_from_file_location("bench_gemv", ROOT / "scripts" / "dev" / "bench_gemv.py")
        bench_gemv = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench_gemv)
    finally:
        del sys.path[:2]
    assert bench_gemv.step_shapes(bench_gemv.model_config("qwen3_4b")) == {
        "qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728),
        "lm_head": (151936, 2560)}
    assert bench_gemv.step_shapes(bench_gemv.model_config("qwen3_8b"))["gate_up"] == (24576, 4096)


def test_profile_prefill_times_each_cache_on_a_tiny_model():
    """scripts/dev/profile_prefill.py on CPU: one row per cache (transformers' own, the seam's BF16, OSCAR)."""
    proc = subprocess.run([sys.executable, "scripts/dev/profile_prefill.py", "--model", "tiny", "--tokens", "300",
                           "--quantizers", "dynamic,bf16,oscar", "--repeats", "1"],
                          cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows[1:] == ["dynamic", "bf16", "oscar"]


def test_out_folder_is_made_or_refused_before_anything_is_timed(tmp_path, monkeypatch):
    """$OUT: a new folder is made up front; one that cannot be made (a file in its path) ends the run in one sentence
    before the model is built, not with a traceback after the rows are measured."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_out import out_file
    monkeypatch.setenv("OUT", str(tmp_path / "new" / "folder"))
    assert out_file("x.json") == tmp_path / "new" / "folder" / "x.json" and (tmp_path / "new" / "folder").is_dir()
    monkeypatch.delenv("OUT")
    assert out_file("x.json") is None
    (tmp_path / "file").write_text("")
    env = {**os.environ, "OUT": str(tmp_path / "file" / "sub"), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--tiny", "--steps", "1", "--ctx", "64",
                           "--batch", "1", "--quantizers", "bf16"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "cannot make that folder for the results" in proc.stderr
    assert "Traceback" not in proc.stderr and "copy bandwidth" not in proc.stdout


def test_grid_keeps_the_points_timed_before_a_run_stops(tmp_path, monkeypatch):
    """bench_kernel_grid.py rewrites $OUT's JSON after every point: a run stopped on its third point (a device call's
    time limit, here an interrupt) leaves the first two points with the run's copy bandwidth."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_kernel_grid as grid
    timed = []

    def fake_point(shape, batch, ctx, copy_tbs):
        if len(timed) == 2:
            raise KeyboardInterrupt
        timed.append({"head_dim": shape.head_dim, "batch": batch, "ctx": ctx})
        return timed[-1]

    monkeypatch.setattr(grid.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(grid.torch.cuda, "get_device_name", lambda: "fake GPU")
    monkeypatch.setattr(grid, "check_shape", lambda shape: [])
    monkeypatch.setattr(grid, "copy_bandwidth", lambda: 3.5)
    monkeypatch.setattr(grid, "bench_point", fake_point)
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["bench_kernel_grid.py", "--head-dims", "64", "--groups", "1",
                                      "--batches", "1", "--ctxs", "1024,8192,32768"])
    with pytest.raises(KeyboardInterrupt):
        grid.main()
    saved = json.loads((tmp_path / "bench_kernel_grid.json").read_text())
    assert saved["rows"] == timed and [r["ctx"] for r in timed] == [1024, 8192] and saved["copy_tbs"] == 3.5


def test_grid_run_cut_short_is_its_logged_rows(monkeypatch):
    """results/bench/bench_kernel_grid_h200_2cd8a04_d64_d128.json (a run cut by its time limit before it saved) holds
    exactly its log's `row:` lines, in order, and a copy bandwidth that every row's SDPA share agrees with."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_kernels import AttnShape, bf16_bytes
    bench = ROOT / "results" / "bench"
    log = (bench / "bench_kernel_grid_h200_2cd8a04_log.txt").read_text().splitlines()
    logged = [json.loads(line[5:]) for line in log if line.startswith("row: ")]
    saved = json.loads((bench / "bench_kernel_grid_h200_2cd8a04_d64_d128.json").read_text())
    assert saved["rows"] == logged and len(logged) == 181
    for r in logged:
        nbytes = bf16_bytes(r["batch"], r["ctx"], AttnShape(r["group"] * 8, 8, r["head_dim"]))
        assert nbytes / r["sdpa_ms"] / 1e9 / saved["copy_tbs"] == pytest.approx(r["sdpa_of_copy"], rel=1e-9)


def test_variant_ratios_divide_each_variant_by_its_default_at_the_same_point_of_the_same_run(monkeypatch):
    """bench_formats.py --variant-ratios: a variant's ms over the default's at the same (format, head_dim, group,
    batch, ctx) of one run, groups of up to 8 rows apart from wider ones; runs without variants say so; the flag
    without saved runs is refused in one sentence."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_formats import variant_time_ratios

    def row(fmt, group, ms, batch=1):
        return {"format": fmt, "head_dim": 256, "group": group, "batch": batch, "ctx": 1024, "ms": ms}
    runs = [{"rows": [row("int2", 1, 2.0), row("int2 [num_warps=2]", 1, 1.0), row("int2", 4, 1.0),
                      row("int2 [num_warps=2]", 4, 2.0), row("int2", 16, 1.0), row("int2 [num_warps=2]", 16, 3.0),
                      row("int2 [num_warps=2]", 8, 1.0)]},          # no default at group 8: not counted
            {"rows": [row("int2", 1, 4.0, batch=3), row("int2 [num_warps=2]", 1, 1.0, batch=3)]}]
    text = variant_time_ratios(runs)
    assert "| int2 [num_warps=2] | 256 | 1, 4 | 1 | 1024 | 2 | 1.25 (0.50-2.00) |" in text
    assert "| int2 [num_warps=2] | 256 | 16 | 1 | 1024 | 1 | 3.00 (3.00-3.00) |" in text
    assert "| int2 [num_warps=2] | 256 | 1 | 3 | 1024 | 1 | 0.25 (0.25-0.25) |" in text
    assert variant_time_ratios([{"rows": [row("int2", 1, 1.0)]}]) == ""
    proc = subprocess.run([sys.executable, "scripts/bench_formats.py", "--variant-ratios"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--variant-ratios reads saved runs" in proc.stderr


def test_format_rows_record_their_kv_heads_and_the_table_says_them(monkeypatch):
    """bench_formats.py --kv-heads (a model's own heads): each row records its KV heads and the table's heading says
    them; runs saved before the flag had the grid's 8."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_formats import markdown
    row = {"head_dim": 256, "group": 4, "batch": 1, "ctx": 1024, "format": "int2", "ms": 0.01, "of_copy": 0.1,
           "vs_sdpa": 1.0}
    assert "; 1 KV heads, one query token." in markdown("GPU", 4.0, [{**row, "kv_heads": 1}], date="2026-12-02")
    assert "; 8 KV heads, one query token." in markdown("GPU", 4.0, [row], date="2026-12-02")
    proc = subprocess.run([sys.executable, "scripts/bench_formats.py", "--kv-heads", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--kv-heads" in proc.stderr and "Traceback" not in proc.stderr
