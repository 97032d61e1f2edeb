"""Placement over several devices (fake GPU budgets, no GPU needed) and per-device cache tensors (CPU + meta)."""
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers.cache_utils import Cache

from harness import placement as pl
from harness.cache import ThreeRegionLayer
from harness.memory_plan import plan_cell
from harness.models import load_model, model_config
from harness.pipeline import static_decode_note
from harness.quantizer import build_quantizer
from harness.random_model import materialize, meta_model, shape_config
from harness.seam import Seam, install
from harness.static_cache import DecodeStep, freeze

ROOT = Path(__file__).resolve().parent.parent
TINY_SHAPE = ROOT / "tests" / "fixtures" / "tiny_qwen3_shape.json"
GB = 10**9


def compose_cell(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("config", list(overrides))


def test_split_fills_devices_in_order_within_their_limits():
    items = [("head", 3), *((f"layer{i}", 10) for i in range(6)), ("tail", 3)]
    even = pl.split(items, {"cuda:0": 100, "cuda:1": 100})
    assert [even[f"layer{i}"] for i in range(6)] == ["cuda:0"] * 3 + ["cuda:1"] * 3   # both GPUs used, in order
    assert even["head"] == "cuda:0" and even["tail"] == "cuda:1"
    tight = pl.split(items, {"cuda:0": 25, "cuda:1": 30, "cuda:2": 20})
    for device, limit in {"cuda:0": 25, "cuda:1": 30, "cuda:2": 20}.items():
        assert sum(c for n, c in items if tight[n] == device) <= limit                 # max_memory respected
    assert list(tight.values()) == sorted(tight.values())                              # layer order kept
    assert pl.split(items, {"cuda:0": 30, "cuda:1": 30}) is None                        # 66 bytes do not fit in 60


@pytest.mark.parametrize("model, head, tail", [
    ("qwen3_8b", ["model.embed_tokens", "model.rotary_emb"], ["model.norm", "lm_head"]),
    ("qwen3_4b_thinking", ["model.embed_tokens", "model.rotary_emb", "lm_head"], ["model.norm"]),   # tied lm_head
])
def test_layout_keeps_tied_weights_with_the_embedding(model, head, tail):
    meta = meta_model(model_config(compose_cell(f"model={model}").model), torch.bfloat16)
    layout = pl.module_layout(meta)
    assert layout.head == head and layout.tail == tail and len(layout.layers) == 36
    sizes = pl.module_bytes(meta, layout.head + layout.layers + layout.tail)
    assert sum(sizes.values()) == sum(p.numel() * 2 for p in {id(p): p for p in meta.parameters()}.values()) \
        + sum(b.numel() * b.element_size() for b in meta.buffers())


def test_auto_places_qwen3_32b_at_128k_over_two_80gb_gpus_and_refuses_one():
    cfg = compose_cell("model=qwen3_32b", "model.source=random", "model.dtype=bfloat16", "ctx=128k", "device_map=auto")
    budgets = {"cuda:0": 80 * GB, "cuda:1": 80 * GB}
    plan = plan_cell(cfg, build_quantizer("bf16"), "cuda", use_kernels=True, budgets=budgets)
    assert plan.refusal() is None
    assert plan.layer_devices == sorted(plan.layer_devices) and set(plan.layer_devices) == set(budgets)
    assert plan.device_map["model.embed_tokens"] == "cuda:0" and plan.device_map["lm_head"] == "cuda:1"
    for device, part in plan.devices.items():
        assert 0 < part.total <= budgets[device]
    assert sum(p.weights for p in plan.devices.values()) == pytest.approx(65.5 * GB, rel=0.01)
    one = plan_cell(cfg, build_quantizer("bf16"), "cuda", use_kernels=True, budgets={"cuda:0": 80 * GB})
    assert one.device_map is None and one.refusal().startswith("This cell needs ")


def test_max_memory_caps_what_auto_puts_on_a_gpu():
    cfg = compose_cell("model=qwen3_8b", "model.source=random", "model.dtype=bfloat16", "ctx=32k", "device_map=auto",
                       "max_memory={0: 10GB, 1: 80GB}")
    budgets = pl.budgets(["cuda:0", "cuda:1"], cfg.max_memory)
    assert budgets == {"cuda:0": 10 * GB, "cuda:1": 80 * GB}
    plan = plan_cell(cfg, build_quantizer("kivi2"), "cuda", use_kernels=True, budgets=budgets)
    assert plan.refusal() is None and plan.devices["cuda:0"].total <= 10 * GB
    assert plan.layer_devices.count("cuda:0") < plan.layer_devices.count("cuda:1")


def test_model_gpus_above_one_means_auto_and_explicit_maps_are_kept():
    from harness.memory_plan import requested_devices
    assert requested_devices(compose_cell(), "cpu") == ("single", ["cpu"])
    mode, _ = requested_devices(compose_cell("model=qwen3_32b", "+model.gpus=2"), "cuda")
    assert mode == "auto"
    mode, device_map = requested_devices(compose_cell("device_map={model: 0, lm_head: 1}"), "cuda")
    assert (mode, device_map) == ("explicit", {"model": "cuda:0", "lm_head": "cuda:1"})


def test_an_explicit_split_places_each_layer_and_its_cache():
    cfg = compose_cell("model=qwen3_8b", "model.source=random", "model.dtype=bfloat16", "ctx=32k",
                       "device_map={model.embed_tokens: 0, model.rotary_emb: 0, model.layers.0: 0, model.layers: 1, "
                       "model.norm: 1, lm_head: 1}")
    plan = plan_cell(cfg, build_quantizer("bf16"), "cuda", use_kernels=True,
                     budgets={"cuda:0": 80 * GB, "cuda:1": 80 * GB})
    assert plan.layer_devices == ["cuda:0"] + ["cuda:1"] * 35
    assert plan.devices["cuda:1"].kv == 35 * plan.devices["cuda:0"].kv


def test_materialize_follows_a_device_map_of_several_entries():
    config = shape_config(TINY_SHAPE)
    meta = meta_model(config, torch.float32)
    layout = pl.module_layout(meta)
    device_map = {name: "cpu" for name in layout.head + layout.layers + layout.tail}
    model = materialize(meta, device_map, seed=0)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert pl.layer_devices(device_map, layout) == ["cpu", "cpu"]


def test_cache_tensors_live_on_their_layers_device():
    """Layer 0 on the CPU and layer 1 on the meta device (a stand-in for a second GPU)."""
    quantizer = build_quantizer("quarot_int2", recent=8, page=8)
    quantizer.check(shape_config(TINY_SHAPE))
    memo = {}
    layers = [ThreeRegionLayer(quantizer, i, step_memo=memo) for i in range(2)]
    cache = Cache(layers=layers)
    for idx, device in enumerate(["cpu", "meta"]):
        rows = torch.randn(2, 2, 40, 64, device=device)                          # [B, H_kv, T, D]
        cache.update(rows, rows, idx)
        cache.update(rows[..., :1, :], rows[..., :1, :], idx)                   # a decode step demotes
    for layer, device in zip(layers, ["cpu", "meta"]):
        assert layer.history_length > 0
        tensors = [layer.keys, layer.values, layer.key_rotation, *layer.history_k.buffers.values(),
                   *layer.history_v.buffers.values(), *layer.decode_lengths(None, torch.device(device))]
        assert {t.device.type for t in tensors} == {device}


def test_value_rotation_is_folded_on_each_layers_device(tiny):
    model, _ = tiny("qwen3")
    model.model.layers[1].to("meta")
    quantizer = build_quantizer("quarot_int2")
    quantizer.check(model.config)
    seam = Seam(model, quantizer).apply()
    try:
        devices = [m._kvq_output_rotation.device.type for m in seam.modules]
        assert devices == ["cpu", "meta"]
    finally:
        seam.remove()


def test_static_decode_across_devices_says_it_replays_a_graph_per_gpu():
    assert static_decode_note(compose_cell(), ["cuda:0"]) == ""
    assert static_decode_note(compose_cell("static_decode=off"), ["cuda:0", "cuda:1"]) == ""
    note = static_decode_note(compose_cell("static_decode=on"), ["cuda:0", "cuda:1"])
    assert note.startswith("per GPU:") and "each of cuda:0, cuda:1" in note


def test_frozen_cache_mirrors_its_lengths_on_each_layers_device():
    """Layer 0 on the CPU, layer 1 on the meta device (a stand-in for a second GPU): each layer's kernel reads
    lengths on its own device, a step advances every mirror; a CUDA graph off CUDA is refused in one sentence."""
    quantizer = build_quantizer("quarot_int2", recent=8, page=8)
    quantizer.check(shape_config(TINY_SHAPE))
    layers = [ThreeRegionLayer(quantizer, i, step_memo={}) for i in range(2)]
    cache = Cache(layers=layers)
    for idx, device in enumerate(["cpu", "meta"]):
        rows = torch.randn(2, 2, 40, 64, device=device)                          # [B, H_kv, T, D]
        cache.update(rows, rows, idx)
        layers[idx].use_kernels = True        # what freeze asks for; the history itself packs on the reference path
    state = freeze(cache, 4)
    assert list(state.mirrors) == ["cpu", "meta"]
    for layer, device in zip(layers, ["cpu", "meta"]):
        assert {t.device.type for t in layer.decode_lengths(None, torch.device(device))} == {device}
    fp_len = state.fp_len.tolist()
    state.advance()
    assert state.fp_len.tolist() == [n + 1 for n in fp_len] and state.mirrors["meta"][1].device.type == "meta"
    with pytest.raises(ValueError, match="CUDA-graph decode needs the frozen cache on CUDA devices, got cpu, meta"):
        DecodeStep(torch.nn.Module(), cache, state, graph=True)


def test_a_split_model_keeps_hooks_on_its_blocks_only_and_its_layers_stay_fusable(tiny):
    """dispatch over two devices (CPU + meta): accelerate's hooks stay on the device map's blocks (the layers move
    their inputs), the modules inside a layer lose theirs (compile_step swaps their forwards), and a fused decoder
    layer swaps the forward its hook wraps, restored after."""
    import functools
    from harness.compiled_step import compilable_modules
    from harness.fused_residuals import forward_slot, fused_residuals, residual_layer_forward, residual_layers
    model = tiny("qwen3")[0]
    layout = pl.module_layout(model)
    device_map = {name: "cpu" for name in layout.head + layout.layers[:1]}
    device_map |= {name: "meta" for name in layout.layers[1:] + layout.tail}
    for name, device in device_map.items():
        model.get_submodule(name).to(device)
    pl.dispatch(model, device_map)
    hooked = {name for name, m in model.named_modules() if hasattr(m, "_hf_hook")}
    assert hooked - {""} == set(device_map)
    layers = list(model.model.layers)
    assert len(compilable_modules(model)) == 5 * len(layers)              # two norms, q/k norms and the MLP each
    assert residual_layers(model) == layers and {forward_slot(layer) for layer in layers} == {"_old_forward"}
    with fused_residuals(layers, set()):
        for layer in layers:
            assert isinstance(layer._old_forward, functools.partial)
            assert layer._old_forward.func is residual_layer_forward and "_hf_hook" in vars(layer)
    assert all(layer._old_forward.__func__ is type(layer).forward for layer in layers)


def test_tiny_model_loads_through_a_one_device_map():
    loaded = load_model(compose_cell("model=tiny_llama").model, device_map={"": "cpu"})
    assert loaded.model.hf_device_map == {"": "cpu"} and loaded.weights == "tiny"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_frozen_cache_split_over_two_gpus_decodes_like_one_gpu(tiny):
    """The same greedy tokens from a model on one GPU and split over two, in eager frozen steps and replaying one
    CUDA graph per GPU (harness.segmented_graph), with the step compiled too (harness.compiled_step); with sequences
    of one layout (no padding) the page demotions are graphs per GPU too (harness.demotion_graph), with the eager
    steps' tokens."""
    from harness.static_cache import static_generate
    model, tok = tiny("qwen3")
    quantizer = build_quantizer("naive_int2", sink=4, recent=16, page=4)
    quantizer.check(model.config)
    enc = tok(["The grass is green. The sky is blue. " * 3, "Here we go."], return_tensors="pt", padding=True)
    unpadded = tok(["The grass is green. The sky is blue. " * 3] * 2, return_tensors="pt")

    def greedy(device, graph=False, encoded=enc, compile_step=False):
        batch = {k: v.to(device) for k, v in encoded.items()}
        with install(model, quantizer, kernels="triton") as seam:
            cache = seam.new_cache()
            tokens = static_generate(model, batch, cache, 24, [], tok.pad_token_id, graph=graph,
                                     compile_step=compile_step)
        return tokens.cpu(), cache

    model.to("cuda:0")
    one, _ = greedy("cuda:0")
    layout = pl.module_layout(model)
    half = len(layout.layers) // 2
    device_map = {name: "cuda:0" for name in layout.head + layout.layers[:half]}
    device_map |= {name: "cuda:1" for name in layout.layers[half:] + layout.tail}
    for name, device in device_map.items():
        model.get_submodule(name).to(device)
    pl.dispatch(model, device_map)
    split, cache = greedy("cuda:0")
    assert torch.equal(split, one)
    graphed, _ = greedy("cuda:0", graph=True)
    assert torch.equal(graphed, one) and torch.cuda.current_device() == 0   # the capture leaves the current GPU
    compiled, _ = greedy("cuda:0", graph=True, compile_step=True)
    assert torch.equal(compiled, one) and torch.cuda.current_device() == 0
    assert {str(layer.keys.device) for layer in cache.layers} == {"cuda:0", "cuda:1"}
    eager_steps, _ = greedy("cuda:0", encoded=unpadded)
    graphed, graphed_cache = greedy("cuda:0", graph=True, encoded=unpadded)
    demotions = graphed_cache.layers[0].static.demotions                     # page demotions: one graph per GPU
    assert torch.equal(graphed, eager_steps)
    assert [sorted(graphs) for graphs, _ in demotions.graphs.values()] == [["cuda:0", "cuda:1"]]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_graph_decode_on_a_gpu_other_than_the_current_one(tiny):
    """A whole model on cuda:1 while cuda:0 is current: the CUDA-graph step and its demotions are captured on cuda:1
    (torch.cuda.graph's default capture stream lives on the current GPU), with the eager steps' tokens."""
    from harness.static_cache import static_generate
    model, tok = tiny("qwen3")
    quantizer = build_quantizer("naive_int2", sink=4, recent=16, page=4)
    quantizer.check(model.config)
    model.to("cuda:1")
    batch = {k: v.to("cuda:1") for k, v in tok(["The grass is green. The sky is blue. " * 3] * 2,
                                                 return_tensors="pt").items()}
    outs = []
    for graph in (False, True):
        with install(model, quantizer, kernels="triton") as seam:
            cache = seam.new_cache()
            outs.append(static_generate(model, batch, cache, 24, [], tok.pad_token_id, graph=graph).cpu())
    assert torch.cuda.current_device() == 0 and torch.equal(outs[1], outs[0])
    assert [sorted(graphs) for graphs, _ in cache.layers[0].static.demotions.graphs.values()] == [["cuda:1"]]


def test_segmented_capture_refuses_a_tensor_crossing_devices_mid_segment(tiny):
    """Only tensors handed to a segment's first module are copied to its device; any other crossing is named."""
    from harness.segmented_graph import SegmentedGraph, output_hooks
    model = tiny("qwen3")[0]
    graph = SegmentedGraph(model)
    names = [type(m).__name__ for m in graph.watched]
    assert names[0] == "Embedding" and "Linear" in names and names.count("Qwen3DecoderLayer") == 2   # lm_head too
    here, there = torch.zeros(2), torch.zeros(2, device="meta")
    graph.moved[id(there), torch.device("cpu")] = here
    assert graph._local({"x": (there, 1)}, torch.device("cpu"), model) == {"x": (here, 1)}
    with pytest.raises(ValueError, match="a tensor on meta reaches Qwen3ForCausalLM on cpu inside a captured segment"):
        graph._local([torch.zeros(1, device="meta")], torch.device("cpu"), model)
    assert output_hooks(model) == []
