"""The memory plan against what a prefill really holds (weights + KV cache storage), and cells refused by it."""
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from harness.cache import reserve_history
from harness.memory_plan import kv_per_layer, plan_cell
from harness.models import load_model
from harness.packed_history import PackedHistory
from harness.pipeline import CellDoesNotFit, run_cell
from harness.quantizer import build_quantizer
from harness.seam import install
from report.store import ResultsStore

ROOT = Path(__file__).resolve().parent.parent
PROMPT = 512
QUANTIZERS = ("bf16", "naive_int2", "kivi2", "quarot_int2")
OFFLINE_QUANTIZERS = ("bf16", "kivi2")      # the offline models' prefills are slow on 2 cores: two layouts


def compose_cell(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("config", list(overrides))


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (what is allocated, not what a view shows)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def cache_tensors(cache) -> list[torch.Tensor]:
    out = []
    for layer in cache.layers:
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                out.append(value)
            elif isinstance(value, PackedHistory):
                out.extend(value.buffers.values())
    return out


@pytest.mark.parametrize("model", ["tiny_qwen3", "tiny_gemma3", "gemma3_270m", "smollm2_135m"])
def test_plan_matches_weights_and_cache_after_a_prefill(model):
    cfg = compose_cell(f"model={model}", f"ctx.tokens={PROMPT}", "task.max_new_tokens=0")
    loaded = load_model(cfg.model, device="cpu")
    weights = storage_bytes([*loaded.model.parameters(), *loaded.model.buffers()])
    ids = torch.randint(5, loaded.model.config.vocab_size, (1, PROMPT))
    for name in QUANTIZERS if model.startswith("tiny") else OFFLINE_QUANTIZERS:
        quantizer = build_quantizer(name)
        plan = plan_cell(cfg, quantizer, "cpu", use_kernels=False, budgets={"cpu": 10**12}).devices["cpu"]
        with install(loaded.model, quantizer, kernels="reference") as seam, torch.inference_mode():
            cache = seam.new_cache()
            reserve_history(cache, PROMPT)                    # as harness.generate does before a prefill
            loaded.model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        kv = storage_bytes(cache_tensors(cache))
        assert plan.weights == pytest.approx(weights, rel=0.01), name
        assert plan.kv == pytest.approx(kv, rel=0.15), name
        assert plan.weights + plan.kv == pytest.approx(weights + kv, rel=0.15), name


def test_a_reserved_history_is_allocated_at_its_size_not_doubled():
    """Without a reservation a prefill's packed history is allocated at twice what it holds (buffers grow by
    doubling), and the plan of a task without a generation budget counts that; a generation reserves prompt +
    budget, so the history is what it holds and the plan counts no slack."""
    cfg = compose_cell("model=tiny_qwen3", f"ctx.tokens={PROMPT}", "task.max_new_tokens=0")
    loaded = load_model(cfg.model, device="cpu")
    ids = torch.randint(5, 90, (1, PROMPT))
    quantizer = build_quantizer("kivi2")
    rows = PROMPT - quantizer.recent_tokens - (quantizer.sink_tokens or 0)        # what the history holds
    allocated = {}
    for reserved in (False, True):
        with install(loaded.model, quantizer, kernels="reference") as seam, torch.inference_mode():
            cache = seam.new_cache()
            if reserved:
                reserve_history(cache, PROMPT)
            loaded.model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        history = cache.layers[0].history_k
        assert history.lengths == [rows]
        allocated[reserved] = history.buffers["codes"].shape[-2]
    assert allocated == {False: 2 * rows, True: rows}
    generation, no_budget = (compose_cell("model=tiny_qwen3", "ctx.tokens=65536", *task)
                             for task in ([], ["task=lm_eval"]))
    plans = [plan_cell(c, quantizer, "cpu", use_kernels=True, budgets={"cpu": 10**12}).devices["cpu"].kv
             for c in (generation, no_budget)]
    assert 1.95 * plans[0] < plans[1] < 2.05 * plans[0]                 # the windows' rows are a rounding here


def test_a_prefill_keeps_only_the_windows_in_full_precision():
    """The fp rows of a prefilled three-region layer are a buffer of sink + recent rows, not a view of the prompt."""
    cfg = compose_cell("model=tiny_qwen3")
    loaded = load_model(cfg.model, device="cpu")
    quantizer = build_quantizer("kivi2")
    with install(loaded.model, quantizer, kernels="reference") as seam, torch.inference_mode():
        cache = seam.new_cache()
        loaded.model(torch.randint(5, 90, (1, PROMPT)), past_key_values=cache, use_cache=True, logits_to_keep=1)
    layer = cache.layers[0]
    assert layer.keys.shape[-2] == quantizer.recent_tokens
    assert layer.keys.untyped_storage().nbytes() == layer.keys.numel() * layer.keys.element_size()


def test_a_cell_that_does_not_fit_is_refused_before_loading_and_recorded_as_oom(tmp_path, monkeypatch):
    import harness.memory_plan as memory_plan
    monkeypatch.setattr(memory_plan.pl, "device_budget", lambda device: 2 * 10**6)      # a 2 MB "device"
    monkeypatch.setattr("harness.models.load_model", lambda *a, **k: pytest.fail("weights were loaded"))
    cfg = compose_cell("model=tiny_qwen3", "ctx=4k", "device=cpu", f"results_dir={tmp_path}")
    with pytest.raises(CellDoesNotFit, match=r"^This cell needs \d+\.\d GB on cpu \(weights .* but has 0\.0 GB"):
        run_cell(cfg, ResultsStore(tmp_path))
    rows = [json.loads(line) for path in (tmp_path / "rows").glob("*/*.jsonl")
            for line in path.read_text().splitlines()]
    assert [row["status"] for row in rows] == ["oom"] and "refused before loading any weights" in rows[0]["error"]


def test_rows_record_the_placement_and_the_plan(tmp_path):
    cfg = compose_cell("model=tiny_qwen3", "quantizer=naive_int2", "task.samples=1", "task.max_new_tokens=4",
                       "device=cpu", f"results_dir={tmp_path}")
    row = run_cell(cfg, ResultsStore(tmp_path))[0]
    assert row["run"]["placement"] == {"cpu": "layers 0-1"}
    assert row["run"]["memory_plan"]["cpu"]["weights"] > 0 and row["run"]["host_peak_mb"] > 0


def test_prefill_chunks_shrink_the_planned_activations_and_say_so():
    """task.prefill_chunk bounds a prefill forward's transients by the chunk, plus the cache read as full-precision
    K/V and the chunk's mask: far below a one-forward prefill of a long prompt."""
    from harness.memory_plan import Workload, activation_bytes
    from harness.models import model_config
    config = model_config(compose_cell("model=qwen3_8b", "model.source=random").model)
    whole = Workload(batch=4, tokens=131072, dtype_bytes=2, reference_path=False)
    chunked = Workload(batch=4, tokens=131072, dtype_bytes=2, reference_path=False, prefill_chunk=8192)
    assert activation_bytes(config, chunked) < activation_bytes(config, whole) / 3
    mask = 4 * 131072 * 131072                  # the batch's [B, T, T] mask: on the H100 this cell asked 63.9 GiB
    assert activation_bytes(config, whole) > mask > activation_bytes(config, chunked)
    assert activation_bytes(config, Workload(1, 131072, 2, False)) < mask / 4         # one sequence: causal flag
    # results/bench/prefill_memory.md, H100 allocator trace: 4 x 32k in 8k chunks, QuaRot-INT2, peaked 10.02 GB above
    # the weights (bool mask, SDPA's float copy, repeat_kv); the plan planned 7.55 GB before it counted the last two
    traced = Workload(4, 32768, 2, False, prefill_chunk=8192, reserved=True)
    planned = activation_bytes(config, traced) + sum(kv_per_layer(config, build_quantizer("quarot_int2"), traced))
    assert 10.02e9 <= planned <= 1.25 * 10.02e9
    grouped = Workload(4, 32768, 2, False, prefill_chunk=8192, reserved=True, gpu_prefill=True, padding_mask=True)
    repeated = 2 * 32 * 4 * 32768 * 128 * 2                                       # K and V for 32 query heads
    float_mask = 2 * 4 * 8192 * 32768                                             # SDPA's copy of the bool mask
    assert activation_bytes(config, traced) - activation_bytes(config, grouped) == repeated + float_mask
    # the same trace after the seam's grouped SDPA (GPU): 7.87 GB; one sequence's GPU chunks, without a mask: 1.59 GB
    planned = activation_bytes(config, grouped) + sum(kv_per_layer(config, build_quantizer("quarot_int2"), grouped))
    assert 7.87e9 - 2.147e9 <= planned <= 1.25 * 7.87e9       # less SDPA's float copy of the mask (2.147 GB there)
    # after the seam attends sequence by sequence (no float copy) and decodes the history a sequence and KV head at a
    # time, with transformers' bool mask: 7.33 GB at 4 x 32k; with the padding rows alone: 6.26 GB, 14.69 at 4 x 128k
    for tokens, traced_gb, mask in ((32768, 7.33, True), (32768, 6.26, False), (131072, 14.69, False)):
        work = Workload(4, tokens, 2, False, prefill_chunk=8192, reserved=True, gpu_prefill=True, packed_history=True,
                        padding_mask=mask)
        planned = activation_bytes(config, work) + sum(kv_per_layer(config, build_quantizer("quarot_int2"), work))
        assert traced_gb * 1e9 <= planned <= 1.3 * traced_gb * 1e9, (tokens, mask)
    alone = Workload(1, 32768, 2, False, prefill_chunk=8192, reserved=True, gpu_prefill=True, packed_history=True)
    planned = activation_bytes(config, alone) + sum(kv_per_layer(config, build_quantizer("quarot_int2"), alone))
    assert 1.59e9 <= planned <= 1.3 * 1.59e9
    one = Workload(1, 32768, 2, False, prefill_chunk=8192, reserved=True)              # one sequence: no mask
    one_gpu = Workload(1, 32768, 2, False, prefill_chunk=8192, reserved=True, gpu_prefill=True)   # on the GPU
    assert activation_bytes(config, one) - activation_bytes(config, one_gpu) == 3 * 8192 * 32768 + repeated // 4
    assert activation_bytes(config, Workload(4, 4096, 2, False, prefill_chunk=8192)) == \
        activation_bytes(config, Workload(4, 4096, 2, False))                       # a chunk longer than the prompt
    cfg = compose_cell("model=qwen3_8b", "model.source=random", "task.prefill_chunk=4096", "ctx=128k")
    plan = plan_cell(cfg, build_quantizer("bf16"), "cpu", use_kernels=False, budgets={"cpu": 10**13})
    one_forward = plan_cell(compose_cell("model=qwen3_8b", "model.source=random", "ctx=128k"), build_quantizer("bf16"),
                            "cpu", use_kernels=False, budgets={"cpu": 10**13})
    assert "prefill chunks of 4096 tokens" in plan.describe()
    assert plan.devices["cpu"].activations < one_forward.devices["cpu"].activations / 2


def test_the_kernel_path_plan_counts_the_history_decode_and_the_reference_path_reads_its_mirror():
    """A chunk on the kernel path decodes the packed history one sequence and KV head at a time, through three fp32
    temporaries of that size (results/bench/prefill_memory.md); the reference path reads its dequantized mirror."""
    from harness.memory_plan import cell_workload
    cfg = compose_cell("model=qwen3_8b", "model.source=random", "task.prefill_chunk=4096", "ctx=128k")
    plans = [plan_cell(cfg, build_quantizer("naive_int2"), "cpu", use_kernels=kernels, budgets={"cpu": 10**13})
             for kernels in (True, False)]
    tokens = cell_workload(cfg, "cpu", True).tokens
    decode = 3 * tokens * 128 * 4                                                  # one KV head, head_dim 128, fp32
    assert plans[0].devices["cpu"].activations - plans[1].devices["cpu"].activations == decode


def test_a_padded_gpu_prefill_over_the_seams_cache_plans_no_batch_mask():
    """On the GPU the seam's own cache gets each sequence's padding rows, not the [B, 1, q, T] bool mask
    (harness.seam.kvq_mask); a quantizer with its own cache (transformers' QuantizedCache) and the CPU keep it."""
    cfg = compose_cell("model=qwen3_8b", "model.source=random", "task.prefill_chunk=8192", "task.batch_size=4",
                       "ctx=128k")                                            # attention, not the MLP, is the peak
    budgets = {"cuda:0": 10**13, "cpu": 10**13}
    seams, own_cache = (plan_cell(cfg, build_quantizer(name), "cuda", use_kernels=False, budgets=budgets)
                        for name in ("bf16", "hf_quantized_cache"))
    tokens = 4 * 8192 * (131072 + int(cfg.task.max_new_tokens))                  # the chunk's queries x every key
    assert own_cache.devices["cuda:0"].activations - seams.devices["cuda:0"].activations == tokens


def test_a_prefill_that_attends_to_the_stored_rows_plans_its_history_decode():
    """`prefill_attends_quantized`: a one-forward prefill reads its rows as stored in place of its own, decoding the
    packed history one sequence and KV head at a time on the kernel path (three fp32 temporaries, as a later chunk
    does); a chunked prefill plans that already; the identity stores no codes."""
    from harness.memory_plan import cell_workload
    budgets = {"cpu": 10**13}

    def activations(cfg, name, kernels, **options):
        quantizer = build_quantizer(name, **options)
        return plan_cell(cfg, quantizer, "cpu", use_kernels=kernels, budgets=budgets).devices["cpu"].activations
    whole = compose_cell("model=qwen3_8b", "model.source=random", "task.batch_size=4", "ctx=128k")  # attention's peak
    chunked = compose_cell("model=qwen3_8b", "model.source=random", "task.batch_size=4", "ctx=128k",
                           "task.prefill_chunk=8192")
    tokens = cell_workload(whole, "cpu", False).tokens
    for cfg, kernels, decode in ((whole, False, 0), (whole, True, 3 * tokens * 128 * 4), (chunked, True, 0)):
        assert activations(cfg, "naive_int2", kernels, prefill_attends_quantized=True) - \
            activations(cfg, "naive_int2", kernels) == decode
    assert activations(whole, "bf16", True, prefill_attends_quantized=True) == activations(whole, "bf16", True)
