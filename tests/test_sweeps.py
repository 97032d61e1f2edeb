"""Sweeps as a user runs them: launcher configs compose, and a re-run skips ok cells and retries failed ones."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from report.store import atomic_write_jsonl, read_jsonl

REPO = Path(__file__).resolve().parent.parent
# The smallest sweep that still goes through run.py end to end: tiny random model, one short example.
TINY_SWEEP = ["debug=tiny", "quantizer=bf16,naive_int2", "task.samples=1", "task.max_new_tokens=8", "ctx.tokens=1024"]


@pytest.fixture
def compose_with_hydra(monkeypatch):
    monkeypatch.delenv("OSCAR_SLURM_PARTITION", raising=False)
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        yield lambda overrides: compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_slurm_launcher_composes_and_instantiates_without_a_cluster(compose_with_hydra):
    launcher_cfg = compose_with_hydra(["hydra/launcher=slurm"]).hydra.launcher
    assert launcher_cfg._target_.endswith("SlurmLauncher")
    assert launcher_cfg.gpus_per_node == 1 and launcher_cfg.partition is None and launcher_cfg.timeout_min > 0
    launcher = instantiate(launcher_cfg)
    assert launcher.params["gpus_per_node"] == 1 and launcher.params["mem_gb"] > 0


def test_slurm_gpus_follow_the_model_and_partition_the_environment(compose_with_hydra, monkeypatch):
    assert compose_with_hydra(["hydra/launcher=slurm", "+model.gpus=4"]).hydra.launcher.gpus_per_node == 4
    monkeypatch.setenv("OSCAR_SLURM_PARTITION", "gpu-h100")
    assert compose_with_hydra(["hydra/launcher=slurm"]).hydra.launcher.partition == "gpu-h100"


def test_local_launcher_is_the_basic_one(compose_with_hydra):
    assert compose_with_hydra(["hydra/launcher=local"]).hydra.launcher._target_.endswith("BasicLauncher")


def test_table_main_sweeps_the_main_grid(compose_with_hydra):
    params = compose_with_hydra(["experiment=table_main"]).hydra.sweeper.params
    assert params.model.split(",") == ["gemma3_270m", "smollm2_135m"]
    assert params.quantizer.split(",") == ["bf16", "naive_int2", "quarot_int2", "kivi2", "int4", "oscar"]
    assert params.task.split(",") == ["ruler_niah", "fidelity"]


def run_sweep(results: Path, *extra: str) -> str:
    """`python run.py -m <TINY_SWEEP>` into `results`; returns stdout (fails the test on a non-zero exit)."""
    cmd = [sys.executable, "run.py", "-m", *TINY_SWEEP, f"results_dir={results}",
           f"hydra.sweep.dir={results.parent / 'multirun'}", *extra]
    env = {**os.environ, "OSCAR_GIT_SHA": "test"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def cell_files(results: Path) -> dict[str, Path]:
    """{quantizer: its rows file} of the ruler_niah cells."""
    return {read_jsonl(p)[0]["quantizer"]: p for p in (results / "rows" / "ruler_niah").glob("*.jsonl")}


def test_rerun_skips_ok_cells_and_recomputes_failed_ones(tmp_path):
    results = tmp_path / "results"
    run_sweep(results)
    files = cell_files(results)
    assert set(files) == {"bf16", "naive_int2"}
    bf16_before = files["bf16"].read_bytes()
    failed = {**read_jsonl(files["naive_int2"])[0], "metric": "error", "value": float("nan"), "status": "error",
              "error": "RuntimeError: simulated crash"}
    atomic_write_jsonl(files["naive_int2"], [failed])

    out = run_sweep(results, "hydra/launcher=local")
    skipped = [line for line in out.splitlines() if "[skip]" in line]
    assert len(skipped) == 1 and "'quantizer': 'bf16'" in skipped[0]
    assert files["bf16"].read_bytes() == bf16_before
    retried = read_jsonl(files["naive_int2"])
    assert {r["status"] for r in retried} == {"ok"}
    assert {"ruler_niah", "bits_per_element"} <= {r["metric"] for r in retried}


def test_a_sweep_goes_past_a_failed_cell_then_exits_non_zero_naming_it(tmp_path):
    """ctx.tokens=100 leaves RULER's template no room: that cell is refused before its weights load (an error
    row); the other cell still runs, and the sweep's exit code and last lines say which cell failed (SLURM sees it)."""
    results = tmp_path / "results"
    cmd = [sys.executable, "run.py", "-m", "debug=tiny", "task.samples=1", "task.max_new_tokens=8",
           "ctx.tokens=100,1024", f"results_dir={results}", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    env = {**os.environ, "OSCAR_GIT_SHA": "test"}
    env.pop("HYDRA_FULL_ERROR", None)
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    summary = done.stderr[done.stderr.index("1 cell(s) of this sweep failed"):]
    assert "ctx=100 " in summary and "RULER template alone needs" in summary     # the count, not ctx=4k
    statuses = {row["config"]["ctx"]["tokens"]: row["status"]
                for path in (results / "rows" / "ruler_niah").glob("*.jsonl") for row in read_jsonl(path)}
    assert statuses == {100: "error", 1024: "ok"}
