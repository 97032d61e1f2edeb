"""The plan printed before a sweep: its cells, measured time per example (or "unknown") and memory per cell."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from report.sweep_plan import (CellGroup, cell_groups, measured_seconds, memory_gb, plan_text, sweep_jobs,
                               task_examples)

REPO = Path(__file__).resolve().parent.parent


def test_the_grid_expands_like_hydras_basic_sweeper_with_the_command_line_winning():
    jobs = sweep_jobs({"model": "a,b", "seed": "0,1,2"}, ["seed=5", "device=cuda"])
    assert jobs == [["model=a", "seed=5", "device=cuda"], ["model=b", "seed=5", "device=cuda"]]


def test_memory_is_bf16_weights_plus_a_bf16_kv_cache():
    # Qwen3-8B: 8.2e9 params x 2 bytes + 2 (K, V) x 36 layers x 8 heads x 128 x 32768 tokens x 2 bytes
    assert memory_gb("qwen3_8b", 32768, 1) == pytest.approx((8.2e9 * 2 + 2 * 36 * 8 * 128 * 32768 * 2) / 1e9)
    assert memory_gb("qwen3_8b", 32768, 2) > memory_gb("qwen3_8b", 32768, 1)
    assert memory_gb("unknown_model", 4096, 1) is None


def test_examples_per_cell_by_task():
    assert task_examples(_Cfg(name="aime25", samples=0)) == 30
    assert task_examples(_Cfg(name="aime25", samples=3)) == 3
    assert task_examples(_Cfg(name="ruler_niah", samples=20, variants=["a", "b"])) == 40
    assert task_examples(_Cfg(name="livecodebench", samples=0)) is None      # depends on the date window


def test_time_per_example_is_measured_from_the_store_or_unknown():
    rows = pd.DataFrame([
        {"cell": "c1", "model": "m", "task": "t", "ctx": "4k", "status": "ok", "wall_time_s": 10.0, "n": 5,
         "device": "H100"},
        {"cell": "c1", "model": "m", "task": "t", "ctx": "4k", "status": "ok", "wall_time_s": 20.0, "n": 10,
         "device": "H100"},
        {"cell": "c2", "model": "m", "task": "t", "ctx": "4k", "status": "error", "wall_time_s": 1.0, "n": 10,
         "device": "H100"}])
    measured = measured_seconds(rows)
    assert measured == {("m", "t", "4k"): [(2.0, "H100")]}                   # 20 s / 10 examples; errors ignored
    cells = [{"model": "m", "quantizer": q, "task": "t", "ctx": "4k", "seed": "0", "job": []} for q in "ab"] + \
            [{"model": "m", "quantizer": "a", "task": "t", "ctx": "8k", "seed": "0", "job": []}]
    groups = cell_groups(cells, lambda job: _Cfg(model=_Cfg(), ctx=_Cfg(tokens=4096),
                                                 task=_Cfg(name="t", samples=30)), measured, "store")
    known, unknown = groups
    assert (known.cells, known.gpu_hours) == (2, pytest.approx(2 * 30 * 2.0 / 3600))
    assert "measured" in known.time_source and "H100" in known.time_source
    assert unknown.gpu_hours is None and unknown.time_source.startswith("unknown")
    text = plan_text(cells, groups)
    assert text.startswith("sweep plan: 3 cells (model 1 x quantizer 2 x task 1 x ctx 2 x seed 1)")
    assert "2 cells with a measured time; 1 cells unknown" in text


def test_a_group_with_an_unknown_example_count_has_unknown_hours():
    group = CellGroup("m", "t", "4k", 3, 1, None, 1.0, "measured", 1.0)
    assert group.gpu_hours is None


def test_the_script_prints_the_paper_main_plan():
    out = subprocess.run([sys.executable, "scripts/sweep_plan.py", "experiment=paper_main", "seed=0,1"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("sweep plan: 180 cells (model 3 x quantizer 6 x task 5 x ctx 1 x seed 2)")
    assert "qwen3_32b" in out and "unknown" in out


@pytest.mark.parametrize("args, needle", [
    (["experiment=nope"], "experiment=nope names no config in configs/experiment/; known: fidelity,"),
    (["experiment=paper_main", "quantizer=bf16,zzz"], "quantizer=zzz names no config in configs/quantizer/"),
    (["nope"], "Error parsing override 'nope'"),
    (["quantizer.nokey=3"], "Could not override 'quantizer.nokey'. To append to your config use +quantizer.nokey=3"),
])
def test_the_script_refuses_a_bad_override_in_one_line(args, needle):
    """experiment is an optional group: Hydra alone drops an unknown choice of it and prints the default plan."""
    proc = subprocess.run([sys.executable, "scripts/sweep_plan.py", *args], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.startswith(f"error: {needle}"), proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_sweep_naming_an_unknown_choice_runs_no_cell(tmp_path):
    proc = subprocess.run([sys.executable, "run.py", "-m", "debug=tiny", "quantizer=bf16,zzz",
                           f"results_dir={tmp_path / 'store'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "quantizer=zzz names no config in configs/quantizer/" in proc.stderr
    assert not (tmp_path / "store").exists() and "tiny_qwen3 | bf16" not in proc.stdout


def test_a_multirun_prints_the_plan_before_its_first_cell(tmp_path):
    out = subprocess.run([sys.executable, "run.py", "-m", "debug=tiny", "quantizer=bf16,naive_int2",
                          "task.samples=1", "task.max_new_tokens=2", f"results_dir={tmp_path / 'store'}",
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.index("sweep plan: 2 cells") < out.index("tiny_qwen3 | bf16")


class _Cfg(dict):
    """A config stand-in: attribute access and .get, as an OmegaConf node."""
    __getattr__ = dict.__getitem__
