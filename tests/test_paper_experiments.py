"""The paper's experiments (configs/experiment/paper_*.yaml) expand to the paper's grids (METHOD_OSCAR.md §11)."""
import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.pipeline import build_checked_quantizer
from report.sweep_plan import grid_axes

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
PAPER_MODELS = ["qwen3_4b_thinking", "qwen3_8b", "qwen3_32b"]
PAPER_TASKS = ["gpqa_diamond", "humaneval", "livecodebench", "aime25", "math500"]
MAIN_QUANTIZERS = ["bf16", "saw_int4", "turboquant_k3v3", "quarot_int2", "naive_int2", "oscar"]
ABLATIONS = ["oscar", "ablation/oscar_tensor", "ablation/oscar_h", "ablation/oscar_none", "ablation/oscar_u",
             "ablation/oscar_center", "ablation/oscar_kchan"]


@pytest.fixture(scope="module")
def composer():
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        yield lambda overrides: compose(config_name="config", overrides=overrides, return_hydra_config=True)


def grid(config) -> set[tuple]:
    return {tuple(c[a] for a in ("model", "quantizer", "task", "ctx", "seed")) for c in grid_axes(config)}


def product(*axes) -> set[tuple]:
    return set(itertools.product(*axes))


def test_paper_main_is_the_main_table_grid(composer):
    config = composer(["experiment=paper_main"])
    assert config.hydra.mode.name == "MULTIRUN"
    assert grid(config) == product(PAPER_MODELS, MAIN_QUANTIZERS, PAPER_TASKS, ["32k"], list("01234"))
    assert len(grid_axes(config)) == 450


def test_paper_aime_int2_runs_aime25_at_32k(composer):
    config = composer(["experiment=paper_aime_int2"])
    assert config.task.name == "aime25"
    assert grid(config) == product(["qwen3_8b", "qwen3_32b"], ["bf16", "kivi2", "quarot_int2", "naive_int2", "oscar"],
                                   ["aime25"], ["32k"], list("01234"))


def test_paper_ruler_sweeps_16k_to_128k(composer):
    config = composer(["experiment=paper_ruler"])
    assert len(config.task.variants) == 8 and config.task.prefill_chunk == 8192     # the release's chunked prefill
    assert config.quantizer.chunk_keeps_recent is False
    for name in ("bf16", "quarot_int2", "oscar"):
        cell = composer(["experiment=paper_ruler", f"quantizer={name}"])
        assert build_checked_quantizer(cell.quantizer).chunk_keeps_recent is False
    assert grid(config) == product(["qwen3_8b", "qwen3_32b"], ["bf16", "quarot_int2", "oscar"], ["ruler_niah"],
                                   ["16k", "32k", "64k", "128k"], ["0"])


def test_ruler_128k_runs_every_quantizer_and_each_cell_fits_one_80gb_gpu(composer):
    """experiment=ruler_128k (the headline command's sweep): Qwen3-8B x every quantizer x 16k-128k, and the memory
    plan of its largest cell (BF16 at 128k) fits one H100."""
    from harness.memory_plan import plan_cell
    config = composer(["experiment=ruler_128k"])
    quantizers = ["bf16", "int4", "kivi2", "quarot_int2", "naive_int2", "turboquant_k3v3", "oscar"]
    assert grid(config) == product(["qwen3_8b"], quantizers, ["ruler_niah"], ["16k", "32k", "64k", "128k"], ["0"])
    largest = composer(["experiment=ruler_128k", "ctx=128k", "quantizer=bf16", "model.source=random",
                        "model.dtype=bfloat16"])                          # as on a GPU (auto: float32 on a CPU)
    h100 = {"cuda:0": 79 * 2**30}
    plan = plan_cell(largest, build_checked_quantizer(largest.quantizer), "cuda:0", use_kernels=True, budgets=h100)
    assert plan.refusal() is None and plan.devices["cuda:0"].total > 30 * 2**30, plan.describe()


def test_paper_ablation_maps_the_variants_to_oscar_options(composer):
    config = composer(["experiment=paper_ablation"])
    assert config.results_dir == "results/paper_ablation"
    assert grid(config) == product(["qwen3_8b"], ABLATIONS, PAPER_TASKS, ["32k"], ["0", "1", "2"])
    attention, tensor = ("query", "surrogate"), ("tensor", "tensor")       # (key_target, value_target)
    expected = {"oscar": ("r_h_pbr", False, "token", attention),
                "ablation/oscar_tensor": ("r_h_pbr", False, "token", tensor),
                "ablation/oscar_h": ("h", False, "token", attention),
                "ablation/oscar_none": ("none", False, "token", attention),
                "ablation/oscar_u": ("u", False, "token", attention),
                "ablation/oscar_center": ("r_h_pbr", True, "token", attention),
                "ablation/oscar_kchan": ("r_h_pbr", False, "channel", attention)}
    assert set(expected) == set(ABLATIONS)
    for name, options in expected.items():
        q = composer([f"quantizer={name}"]).quantizer
        assert (q.compose, q.center_keys, q.key.axis, (q.key_target, q.value_target)) == options
        assert build_checked_quantizer(q).name == name.split("/")[-1]        # distinct names: distinct table rows


def test_the_ablation_fidelity_command_overrides_the_sweep(composer):
    config = composer(["experiment=paper_ablation", "task=fidelity", "seed=0", "model=qwen3_4b_thinking"])
    assert grid(config) == product(["qwen3_4b_thinking"], ABLATIONS, ["fidelity"], ["32k"], ["0"])


def test_paper_throughput_points_at_the_benchmark(composer):
    settings = composer(["experiment=paper_throughput"]).paper_throughput
    assert (CONFIGS.parent / settings.script).is_file()
    assert list(settings.batch) == [1, 8, 32] and settings.ctx == 102400
    assert "bf16+graph" in settings.quantizers                      # BF16 on the engine OSCAR runs on


@pytest.mark.parametrize("name", ["paper_main", "paper_aime_int2", "paper_ruler", "paper_ablation"])
def test_each_paper_experiment_says_how_to_run_it_and_composes_a_random_dry_run(composer, name):
    assert f"experiment={name}" in (CONFIGS / "experiment" / f"{name}.yaml").read_text()
    assert composer([f"experiment={name}", "model.source=random"]).model.source == "random"


def test_paper_ruler_offline_is_the_main_tables_quantizers_on_the_offline_models_sampled(composer):
    """experiment=paper_ruler_offline: both offline models x the main table's six quantizers x RULER-NIAH 4k x five
    seeds, sampled as the paper's client (METHOD_OSCAR.md §10), in a store apart from results/; every cell passes the
    pre-load checks and the memory plan fits it on one 80 GB GPU."""
    from harness.memory_plan import plan_cell
    from harness.pipeline import validate
    config = composer(["experiment=paper_ruler_offline"])
    assert grid(config) == product(["gemma3_270m", "smollm2_135m"], MAIN_QUANTIZERS, ["ruler_niah"], ["4k"],
                                   list("01234"))
    assert dict(config.task.sampling) == {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 40}
    assert len(config.task.variants) == 8 and config.task.max_new_tokens == 128        # RULER's budget
    assert config.results_dir == "results/paper_ruler_offline"
    for cell in grid_axes(config):
        cfg = composer(["experiment=paper_ruler_offline", "device=cpu", *cell["job"]])
        plan = validate(cfg)
        assert plan.key["model"] == cell["model"] and plan.key["seed"] == int(cell["seed"])
        if cell["seed"] == "0" and cell["quantizer"] in ("bf16", "oscar"):
            gpu = composer(["experiment=paper_ruler_offline", "model.dtype=bfloat16", *cell["job"]])
            memory = plan_cell(gpu, plan.quantizer, "cuda:0", use_kernels=True, budgets={"cuda:0": 79 * 2**30})
            assert memory.refusal() is None, memory.describe()
