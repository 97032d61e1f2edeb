"""run.py end to end on the tiny model: bad input fails early with one sentence; finished cells are skipped."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.pipeline import validate

ROOT = Path(__file__).resolve().parent.parent


def run(*overrides, results_dir, timeout=300):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(ROOT / "run.py"), f"results_dir={results_dir}", "hydra.run.dir=" + str(results_dir / "hy"),
           *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.parametrize("overrides, needle", [
    (["quantizer=no_such_quantizer"], "no_such_quantizer"),
    (["model=no_such_model"], "no_such_model"),
    (["task=no_such_task"], "no_such_task"),
    (["ctx=64k"], "exceeds model 'gemma3_270m''s 32768 positions"),
    (["model=glm47_fp8"], "Model 'glm47_fp8' cannot run here: GLM-4.7-FP8 is a 358B glm4_moe"),
    (["model=tiny_qwen3", "model.source=local", "model.path=/nonexistent/model"], "/nonexistent/model"),
    (["quantizer=oscar", "quantizer.rotation_dir=/nonexistent/rotations"], "/nonexistent/rotations"),
    (["quantizer=oscar", "quantizer.center_keys=true", "quantizer.rotation_dir=configs"],
     "center_keys needs key_mean_qqt_r_h_pbr.pt"),
])
def test_bad_input_fails_fast_with_one_sentence(tmp_path, overrides, needle):
    proc = run(*overrides, results_dir=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "rows").exists()


def test_the_headline_command_on_the_default_model_suggests_a_runnable_one(tmp_path):
    """`python run.py quantizer=oscar task=ruler_niah ctx=128k`: one sentence naming the models that reach
    128k and a random-weight dry-run command with the same settings; nothing written."""
    proc = run("quantizer=oscar", "task=ruler_niah", "ctx=128k", results_dir=tmp_path, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "qwen3_8b (Qwen/Qwen3-8B)" in line and "gemma3_270m" in line and "smollm2" not in line
    assert line.endswith("python run.py model=qwen3_8b model.source=random quantizer=oscar task=ruler_niah ctx=128k")
    assert not (tmp_path / "rows").exists()
    suggested = line.rpartition("python run.py ")[2].split()
    assert validate(compose_cell(suggested + [f"results_dir={tmp_path}"])).key["model"] == "qwen3_8b@random"


def compose_cell(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("config", overrides)


def test_tiny_run_writes_rows_then_skips(tmp_path):
    first = run("debug=tiny", "quantizer=oscar", "quantizer=bf16", results_dir=tmp_path)   # the later one wins
    assert first.returncode == 0, first.stderr[-2000:]
    assert "model=tiny_qwen3 quantizer=bf16 task=ruler_niah ctx=4k" in first.stdout      # said before it runs
    files = list((tmp_path / "rows").glob("*/*.jsonl"))
    assert len(files) == 1
    rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert {r["metric"] for r in rows} >= {"niah_single_1", "ruler_niah", "bits_per_element"}
    for row in rows:
        assert {"model", "quantizer", "task", "ctx", "seed", "metric", "value", "git_sha", "config_hash",
                "versions", "device", "wall_time_s", "peak_mem_mb", "status"} <= row.keys()
        assert row["status"] == "ok" and row["model"] == "tiny_qwen3"
        assert row["run"]["static_decode"] == "auto" and sum(row["run"]["decode_batches"].values()) >= 1
    second = run("debug=tiny", results_dir=tmp_path)
    assert second.returncode == 0 and "[skip]" in second.stdout


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file below `folder`: relative path -> (size, mtime in ns)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def test_debug_tiny_leaves_the_committed_results_untouched(tmp_path):
    """debug=tiny writes into its own store (outputs/debug_results), never into results/ (its default store)."""
    before = tree(ROOT / "results")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "debug=tiny", "force=true", "task.samples=1",
                           "task.max_new_tokens=4", "ctx.tokens=1024", f"hydra.run.dir={tmp_path / 'hy'}"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert tree(ROOT / "results") == before
    assert list((ROOT / "outputs" / "debug_results" / "rows").glob("*/*.jsonl"))


def test_calibrate_script_writes_rotationzoo_files(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OSCAR_CACHE=str(tmp_path))
    proc = subprocess.run([sys.executable, "scripts/calibrate.py", "model=tiny_qwen3",      # quantizer=oscar: default
                           "quantizer.calibration.budget=512", "quantizer.calibration.seq_len=256",
                           f"hydra.run.dir={tmp_path / 'hy'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = sorted((tmp_path / "rotations").glob("*/*.pt"))
    assert [f.name for f in files] == ["k_rotation_qqt_r_h_pbr.pt", "key_mean_qqt_r_h_pbr.pt",
                                       "v_rotation_sst_r_h_pbr.pt"]
    assert "(2 layers)" in proc.stdout


def test_calibrate_script_takes_an_oscar_ablation_config(tmp_path):
    """quantizer=ablation/oscar_h (an OSCAR config by another name) calibrates its own rotation files."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OSCAR_CACHE=str(tmp_path))
    proc = subprocess.run([sys.executable, "scripts/calibrate.py", "model=tiny_qwen3", "quantizer=ablation/oscar_h",
                           "quantizer.calibration.budget=512", "quantizer.calibration.seq_len=256",
                           f"hydra.run.dir={tmp_path / 'hy'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = sorted(f.name for f in (tmp_path / "rotations").glob("*/*.pt"))
    assert files == ["k_rotation_qqt_h.pt", "key_mean_qqt_h.pt", "v_rotation_sst_h.pt"]


def test_calibrate_script_refuses_an_unknown_model_and_a_quantizer_other_than_oscar(tmp_path):
    for args, needle in ((["model=nope"], "error: model=nope names no config in configs/model/"),
                         (["quantizer=bf16"], "error: scripts/calibrate.py calibrates OSCAR quantizers only "
                                              "(quantizer=oscar or an ablation/oscar_* config), got quantizer=bf16.")):
        proc = subprocess.run([sys.executable, "scripts/calibrate.py", *args, f"hydra.run.dir={tmp_path / 'hy'}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-600:]
