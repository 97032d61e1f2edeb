"""Bad input is one sentence before any weights load (or, for files checked against the model, at load), a
non-zero exit, no traceback and nothing written. Most cases run `validate` / `run_cell` in-process; a few go
through `python run.py` to check the exit code and stderr as a user sees them."""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from harness.pipeline import CellError, run_cell, validate
from harness.quantizer import instantiate
from oscar.rotation import save_rotations
from report.store import ResultsStore

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def compose_cell(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("config", ["model=tiny_qwen3", *overrides])


def refused(*overrides) -> str:
    """The CellError sentence of `validate` for a cell (fails the test when it is accepted)."""
    with pytest.raises(CellError) as err:
        validate(compose_cell(*overrides))
    message = str(err.value)
    assert message and "\n" not in message
    return message


def rotation_folder(folder: Path, layers, dim: int) -> Path:
    """A RotationZoo folder holding identity R_K and R_V of size `dim` for `layers`."""
    eye = {layer: torch.eye(dim) for layer in layers}
    values = {layer: torch.ones(dim) for layer in layers}
    save_rotations(folder / "k_rotation_qqt_r_h_pbr.pt", eye, values, "qqt_r_h_pbr")
    save_rotations(folder / "v_rotation_sst_r_h_pbr.pt", eye, values, "sst_r_h_pbr")
    return folder


@pytest.fixture
def no_gpu_path(monkeypatch):
    """This CPU machine without the Triton interpreter (conftest turns it on for the kernel tests)."""
    if torch.cuda.is_available():
        pytest.skip("checks the refusal without CUDA")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize("overrides, needle", [
    (["ctx.tokens=0"], "ctx.tokens must be at least 1"),
    (["ctx.tokens=-5"], "ctx.tokens must be at least 1"),
    (["ctx.tokens=abc"], "ctx.tokens must be an integer"),
    (["seed=abc"], "seed must be an integer"),
    (["seed=-1"], "seed must be at least 0"),
    (["+task.essay_dir=/nonexistent"], "No .txt essays found in '/nonexistent'"),
    (["+task.sampling={do_sample: true, temperature: -1}"], "sampling.temperature must be > 0, got -1"),
    (["+task.sampling={do_sample: true, top_p: 2}"], "sampling.top_p must be in (0, 1], got 2"),
    (["seed=4294967296"], "seed must be at most 4294967295"),
    (["device=tpu"], "device=tpu is not one of"),
    (["kernels=fast"], "kernels=fast is not one of"),
    (["static_decode=maybe"], "static_decode=maybe is not one of"),
    (["compile_step=yes"], "compile_step=yes is not one of"),
    (["static_decode=off", "compile_step=on"], "static_decode=off never runs"),
    (["quantizer=oscar", "quantizer.sink=-1"], "sink and recent must be >= 0"),
    (["quantizer=naive_int2", "quantizer.recent=-8"], "sink and recent must be >= 0"),
    (["quantizer=oscar", "quantizer.page=0"], "page must be >= 1"),
    (["quantizer=oscar", "+quantizer.clip=0.9"], "Quantizer 'oscar' has no option 'clip'; it takes: calibration"),
    (["quantizer=ablation/oscar_h", "+quantizer.rotaton=none"], "has no option 'rotaton'"),
    (["quantizer=oscar", "quantizer.recent=250"], "recent (250) must be a multiple of the demotion page (8)"),
    (["model=local", "model.path=/nonexistent/model"], "'/nonexistent/model' does not exist"),
    (["model=local"], "needs model.path=DIR"),
    (["quantizer=oscar", "quantizer.calibration.budget=0"], "calibration.budget must be at least 1"),
    (["quantizer=oscar", "quantizer.calibration.source=web"], "Unknown calibration source 'web'"),
    (["quantizer=oscar", "quantizer.key_target=keys"], "key_target must be one of ('query', 'tensor'), got 'keys'"),
    (["quantizer=oscar", "quantizer.compose=zzz"],
     "compose must be one of ('r_h_pbr', 'u', 'h', 'u_h', 'none'), got 'zzz'"),
    (["quantizer=hf_quantized_cache", "quantizer.nbits=3"],
     "hf_quantized_cache nbits with the quanto backend must be one of (2, 4), got 3"),
    (["quantizer=hf_quantized_cache", "quantizer.backend=hqq", "quantizer.axis_key=-1"],
     "axis_key and axis_value with the hqq backend must be one of (0, 1), got -1 and 0"),
    (["task=lm_eval", "task.tasks=[toy_qa,nope]"], "task.tasks names ['nope'], which lm-eval does not know"),
    (["task=lm_eval", "task.tasks=toy_qa"], "task.tasks is a list: task.tasks=[toy_qa]."),
    (["task.variants=niah_single_1"], "task.variants is a list: task.variants=[niah_single_1]."),
    (["task=longbench", "task.subsets=hotpotqa"], "task.subsets is a list: task.subsets=[hotpotqa]."),
    (["model.dtype=int8"], "model.dtype=int8 is not one of"),
    (["quantizer=oscar", "quantizer.value_target=vtv"],
     "value_target must be one of ('surrogate', 'softmax', 'tensor'), got 'vtv'"),
    (["quantizer=oscar", "quantizer.calibration.source=file", "quantizer.calibration.path=/nonexistent.txt"],
     "'/nonexistent.txt' does not exist"),
    (["quantizer=oscar", "quantizer.calibration.source=file"], "set quantizer.calibration.path=FILE"),
    (["task.samples=0"], "task.samples must be at least 1"),
    (["task.samples=-3"], "task.samples must be at least 1"),
    (["task.batch_size=0"], "task.batch_size must be at least 1"),
    (["task.variants=[niah_single_9]"], "Unknown RULER NIAH variant(s) ['niah_single_9']"),
    (["task=aime25"], "task.data_path="),
    (["task=longbench"], "task.data_path="),
    (["task=aime25", "task.data_path=/nonexistent.jsonl"], "'/nonexistent.jsonl' does not exist"),
    (["task=longbench", "task.subsets=[klingon]"], "Unknown LongBench subset(s) ['klingon']"),
    (["task=fidelity", "task.source=file"], "Fidelity text file 'None' does not exist"),
    (["task=longbench", "+task.temperature=2"], "does not take option(s) ['temperature']"),
    (["model=qwen3_8b"], "not in the local hub cache"),
])
def test_bad_config_is_one_sentence_before_any_weights_load(overrides, needle, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert needle in refused(*overrides)


def test_cuda_only_settings_are_refused_without_cuda(no_gpu_path):
    assert "no CUDA device" in refused("device=cuda")
    assert "kernels=triton needs a CUDA device" in refused("kernels=triton")
    assert "static_decode=on needs the Triton kernel path" in refused("static_decode=on")


def test_static_decode_on_takes_bf16_too(monkeypatch):
    """BF16 (the identity) decodes through the same frozen cache and kernel as the quantizers."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    validate(compose_cell("kernels=triton", "static_decode=on", "quantizer=bf16"))


def test_compile_step_on_the_cpu_needs_a_cpp_compiler(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert "needs a C++ compiler" in refused("device=cpu", "compile_step=on")
    monkeypatch.undo()
    validate(compose_cell("device=cpu", "compile_step=on"))


def test_compile_step_auto_is_on_for_cuda_graph_steps_only():
    from harness.checks import compile_step_enabled
    assert compile_step_enabled("auto", "cuda:1") and compile_step_enabled("on", "cpu")
    assert not compile_step_enabled("auto", "cpu") and not compile_step_enabled("off", "cuda")


def test_empty_calibration_file_is_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert "is empty" in refused("quantizer=oscar", "quantizer.calibration.source=file",
                                 f"quantizer.calibration.path={empty}")


@pytest.mark.parametrize("content, needle", [
    (None, "lacks k_rotation_qqt_r_h_pbr.pt and v_rotation_sst_r_h_pbr.pt"),     # empty folder
    (b"not a torch file", "could not be read as a torch file"),
    ("truncated", "could not be read as a torch file"),
])
def test_bad_rotation_folder_is_refused_before_load(tmp_path, content, needle):
    if content == "truncated":
        rotation_folder(tmp_path, [0, 1], 64)
        path = tmp_path / "k_rotation_qqt_r_h_pbr.pt"
        path.write_bytes(path.read_bytes()[:200])
    elif content is not None:
        (tmp_path / "k_rotation_qqt_r_h_pbr.pt").write_bytes(content)
        (tmp_path / "v_rotation_sst_r_h_pbr.pt").write_bytes(content)
    assert needle in refused("quantizer=oscar", f"quantizer.rotation_dir={tmp_path}")
    assert "does not exist" in refused("quantizer=oscar", f"quantizer.rotation_dir={tmp_path / 'missing'}")


@pytest.mark.parametrize("layers, dim, needle", [
    ([0, 1], 32, "head_dim is 64"),                     # made for another head_dim: was a bmm error mid-run
    ([5, 6], 64, "no key rotation for layer(s) [0, 1]"),  # other layers: was silently no rotation at all
    ([0, 1, 2, 3], 64, "beyond this model's 2 layers"),
])
def test_rotation_folder_that_does_not_fit_the_model_is_refused_at_load(tmp_path, layers, dim, needle):
    folder = rotation_folder(tmp_path / "rot", layers, dim)
    results = tmp_path / "results"
    cfg = compose_cell("quantizer=oscar", f"quantizer.rotation_dir={folder}", "task.samples=1",
                       f"results_dir={results}")
    with pytest.raises(CellError, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        run_cell(cfg, ResultsStore(results))
    assert not list(results.rglob("*.jsonl")), "a refused cell wrote rows"


def local_model(tmp_path, config=None, weights=True, tokenizer=True) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config if config is not None else json.dumps({"model_type": "qwen3"}))
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder


@pytest.mark.parametrize("kwargs, needle", [
    ({"config": "{not json"}, "unreadable config.json"),
    ({"config": "[]"}, "without a model_type"),
    ({"weights": False}, "holds no weights"),
    ({"tokenizer": False}, "holds no tokenizer"),
    ({"config": json.dumps({"model_type": "glm4_moe"})}, "'glm4_moe' architecture"),
])
def test_broken_local_model_folder_is_one_sentence(tmp_path, kwargs, needle):
    folder = local_model(tmp_path, **kwargs)
    assert needle in refused("model=local", f"model.path={folder}")


def test_local_model_takes_its_folder_name_and_facts(tmp_path):
    folder = local_model(tmp_path, config=json.dumps({"model_type": "llama", "max_position_embeddings": 2048}))
    with pytest.raises(CellError, match="exceeds model 'model''s 2048 positions"):
        validate(compose_cell("model=local", f"model.path={folder}", "ctx=4k"))
    plan = validate(compose_cell("model=local", f"model.path={folder}", "ctx.tokens=1024"))
    assert plan.key["model"] == "model" and plan.cfg.model.model_type == "llama"


def test_a_class_that_does_not_take_an_option_is_one_sentence():
    with pytest.raises(ValueError, match="cannot be built from its options"):
        instantiate({"_target_": "kernels.format.QuantSpec", "name": "odd", "colour": "red"}, "Quantizer")


def test_missing_optional_package_is_one_sentence(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else find_spec(name, *a))
    assert "pip install -e '.[eval]'" in refused("task=lm_eval")


def test_a_cell_that_checks_its_prompts_loads_its_tokenizer_once(tmp_path, monkeypatch):
    """RULER checks its prompts with the tokenizer before the weights load; the load reuses that tokenizer."""
    import harness.models as models
    calls, real = [], models.load_tokenizer
    monkeypatch.setattr(models, "load_tokenizer", lambda cfg: calls.append(cfg.name) or real(cfg))
    cfg = compose_cell("debug=tiny", "task.samples=1", "task.max_new_tokens=2", "ctx.tokens=1024",
                       f"results_dir={tmp_path}")
    rows = run_cell(cfg, ResultsStore(tmp_path))
    assert rows[0]["status"] == "ok" and calls == ["tiny_qwen3"]


def test_debug_tiny_runs_longbench_from_a_local_file(tmp_path):
    cfg = compose_cell("debug=tiny", "task=longbench", f"task.data_path={FIXTURES / 'longbench_tiny.jsonl'}",
                       "task.subsets=[hotpotqa]", "task.samples=1", f"results_dir={tmp_path}")
    rows = {row["metric"]: row for row in run_cell(cfg, ResultsStore(tmp_path))}
    assert rows["longbench"]["status"] == "ok"
    records = [json.loads(line) for line in next((tmp_path / "records").rglob("*.jsonl")).read_text().splitlines()]
    assert all(r["meta"]["prompt_tokens"] <= 4096 - 16 for r in records)   # debug's 16-token budget


def test_a_finished_cell_leaves_no_model_behind(tmp_path, monkeypatch):
    """The next cell of a sweep (same process) plans with the whole free memory: this cell's model is gone, and the
    GPU allocator's cached blocks are handed back (release_memory) before the next memory plan."""
    import weakref
    import harness.pipeline as pipeline
    models, released = [], []
    real_load, real_release = pipeline.load_prepared, pipeline.release_memory

    def load_prepared(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        models.append(weakref.ref(loaded.model))
        return loaded
    monkeypatch.setattr(pipeline, "load_prepared", load_prepared)
    monkeypatch.setattr(pipeline, "release_memory", lambda: released.append(len(models)) or real_release())
    cfg = compose_cell("debug=tiny", "task.samples=1", f"results_dir={tmp_path}")
    assert run_cell(cfg, ResultsStore(tmp_path))[0]["status"] == "ok"
    assert len(models) == 1 and models[0]() is None
    assert released == [0, 1]                    # before the plan, and once the cell ended


def test_a_failed_cell_leaves_no_model_behind(tmp_path, monkeypatch):
    """A cell that fails while running (status=error) frees its model too, though its exception lives on (a sweep
    keeps it): the frames of its traceback no longer hold the model (on the H100 each failed fidelity cell shrank
    the next cell's budget by ~8 GB)."""
    import weakref
    import harness.pipeline as pipeline
    models = []
    real_load = pipeline.load_prepared

    def load_prepared(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        models.append(weakref.ref(loaded.model))
        return loaded

    def failing_run(self, loaded, *args, **kwargs):
        raise RuntimeError("a kernel failed")
    from eval.ruler_niah import RulerNiah
    monkeypatch.setattr(pipeline, "load_prepared", load_prepared)
    monkeypatch.setattr(RulerNiah, "run", failing_run)
    cfg = compose_cell("debug=tiny", "task.samples=1", f"results_dir={tmp_path}")
    with pytest.raises(RuntimeError) as caught:
        run_cell(cfg, ResultsStore(tmp_path))
    assert caught.value.__traceback__ is not None
    assert len(models) == 1 and models[0]() is None


def test_running_out_of_memory_mid_cell_leaves_an_oom_row(tmp_path, monkeypatch):
    """A cell that passed its memory plan but ran out of device memory while running ends as status=oom, its
    row naming the bytes asked (the allocator's first sentence), not a status=error traceback."""
    import torch
    from eval.ruler_niah import RulerNiah
    from harness.pipeline import CellDoesNotFit

    def out_of_memory(self, loaded, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.60 GiB. GPU 0 has a total capacity "
                                     "of 79.19 GiB of which 3.12 GiB is free.\nIncluding non-PyTorch memory ...")
    monkeypatch.setattr(RulerNiah, "run", out_of_memory)
    cfg = compose_cell("debug=tiny", "task.samples=1", f"results_dir={tmp_path}")
    with pytest.raises(CellDoesNotFit, match="Tried to allocate 8.60 GiB"):
        run_cell(cfg, ResultsStore(tmp_path))
    (row,) = [json.loads(line) for path in tmp_path.rglob("rows/**/*.jsonl") for line in path.open()]
    assert row["status"] == "oom" and "Tried to allocate 8.60 GiB" in row["error"]
    assert "\n" not in row["error"] and "total capacity" not in row["error"]


def test_a_context_too_small_for_the_template_is_refused_before_the_weights_load(tmp_path, monkeypatch):
    """ctx.tokens=100 leaves RULER's template no room: with the tokenizer alone (no weights, no calibration) the
    cell ends in one sentence, and its error row says why."""
    import harness.pipeline as pipeline

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights loaded")
    monkeypatch.setattr(pipeline, "load_prepared", no_weights)
    cfg = compose_cell("debug=tiny", "quantizer=oscar", "ctx.tokens=100", f"results_dir={tmp_path}")
    with pytest.raises(CellError, match="the RULER template alone needs") as err:
        run_cell(cfg, ResultsStore(tmp_path))
    assert "\n" not in str(err.value)
    (row,) = [json.loads(line) for path in tmp_path.rglob("rows/**/*.jsonl") for line in path.open()]
    assert row["status"] == "error" and row["error"] == str(err.value)


# ------------------------------------------------------------------------------- through run.py
def run_py(*args, results: Path, **kwargs):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, str(ROOT / "run.py"), *args, f"results_dir={results}",
           f"hydra.run.dir={results.parent / 'hy'}", f"hydra.sweep.dir={results.parent / 'sweep'}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, **kwargs)


@pytest.mark.parametrize("args, needle", [
    (["ctx=0"], "ctx=0 names no config in configs/ctx/"),
    (["seed=abc"], "seed must be an integer"),
    (["task.nope=1"], "task.nope is not a key of the composed config (a typo, or an option it lacks); to add it: +"),
    (["-m", "hydra/launcher=slurm", "debug=tiny"], "hydra/launcher=slurm needs a SLURM cluster"),
    (["-m", "quantizer=bf16,oscar", "task.nope=1"], "task.nope is not a key of the composed config"),
    (["model=qwen3_8b", "model.source=random", f"model.shape={ROOT / 'tests/fixtures/tiny_qwen3_hd96_shape.json'}",
      "+model.random_tokenizer=char", "kernels=triton"], "the Triton kernels take head_dim 64, 128, 256"),
])
def test_run_py_prints_one_line_and_exits_non_zero(tmp_path, args, needle):
    results = tmp_path / "results"
    proc = run_py(*args, results=results)
    assert proc.returncode != 0
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if needle in line]) == 1
    assert not results.exists()


def _default_sigint() -> None:
    """A background job (`cmd &` without job control) starts with SIGINT ignored and its children inherit that;
    the child must see Ctrl-C as a terminal would send it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_starting_is_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "debug=tiny", f"results_dir={tmp_path / 'r'}",
                             f"hydra.run.dir={tmp_path / 'hy'}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    time.sleep(1.0)                          # torch and transformers are still importing
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr and "Traceback" not in stderr
