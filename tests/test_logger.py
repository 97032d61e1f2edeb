"""logger=wandb: one run per computed cell (config, metrics, rows and per-example records), failed cells as
failed runs, skipped cells not again, runs of a sweep in one group, offline files in <dir>/wandb/; none: nothing."""
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from report.wandb_logger import log_cell, log_failure

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = str(ROOT / "configs")
ROWS = [{"model": "m", "quantizer": "q", "task": "ruler_niah", "ctx": "4k", "seed": 0, "metric": "acc",
         "value": 0.75, "status": "ok"}]
RECORDS = [{"example_id": "niah-0", "output": "42", "score": 1.0, "prompt_tokens": 12, "meta": {"variant": "v"}}]


def wandb_cfg(*overrides):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose("config", ["logger=wandb", *overrides])


class FakeRun:
    def __init__(self, **init):
        self.init, self.logged, self.summary, self.exit_code, self.dir = init, {}, {}, None, "fake-dir"
        self.name = init["name"]

    def log(self, data):
        self.logged.update(data)

    def finish(self, exit_code=None):
        self.exit_code = exit_code


@pytest.fixture
def fake_wandb(monkeypatch):
    runs = []
    module = types.SimpleNamespace(init=lambda **kw: runs.append(FakeRun(**kw)) or runs[-1],
                                   Table=lambda dataframe: dataframe,
                                   plot=types.SimpleNamespace(bar=lambda table, x, y, title: (table, x, y, title)))
    monkeypatch.setitem(sys.modules, "wandb", module)
    return runs


def test_a_cell_logs_metrics_rows_and_per_example_records_in_its_sweep_group(fake_wandb, tmp_path):
    log_cell(wandb_cfg(f"logger.dir={tmp_path}"), ROWS, RECORDS, group="sweep-2026-11-25_10-00-00")
    (run,) = fake_wandb
    assert run.logged["acc"] == 0.75 and list(run.logged["rows"]["metric"]) == ["acc"]
    assert list(run.logged["examples"]["example_id"]) == ["niah-0"]
    table, x, y, _ = run.logged["metrics_plot"]                            # the cell's plot: a bar per metric
    assert (x, y) == ("metric", "value") and table.to_dict("list") == {"metric": ["acc"], "value": [0.75]}
    assert run.init["group"] == "sweep-2026-11-25_10-00-00" and run.init["dir"] == str(tmp_path)
    assert run.init["config"]["quantizer"]["name"] == "bf16" and "ok" in run.init["tags"]


def test_a_failed_cell_is_a_failed_run_with_its_error(fake_wandb, tmp_path):
    log_failure(wandb_cfg(f"logger.dir={tmp_path}"), "ValueError: boom")
    (run,) = fake_wandb
    assert run.summary["error"] == "ValueError: boom" and run.exit_code == 1 and "error" in run.init["tags"]
    assert run.init["group"] == "ruler_niah"                       # a single run: grouped by task


def test_logger_none_logs_nothing(fake_wandb):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        cfg = compose("config", [])
    assert log_cell(cfg, ROWS) is None and log_failure(cfg, "x") is None and not fake_wandb


def run_py(tmp_path, *overrides):
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", PYTHONPATH=str(ROOT))
    env.pop("WANDB_API_KEY", None)
    cmd = [sys.executable, str(ROOT / "run.py"), "debug=tiny", "logger=wandb", f"logger.dir={tmp_path / 'wb'}",
           "task.samples=1", "task.max_new_tokens=4", f"results_dir={tmp_path / 'results'}",
           f"hydra.run.dir={tmp_path / 'hy'}", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_offline_runs_once_per_computed_cell_failures_too(tmp_path):
    def runs():
        return sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))     # <dir>/wandb/, not <dir>/wandb/wandb/
    assert run_py(tmp_path, "ctx.tokens=100").returncode == 2      # refused before the weights load, with a row: logged
    assert len(runs()) == 1
    assert run_py(tmp_path, "ctx.tokens=1024").returncode == 0
    assert len(runs()) == 2 and any(p.stat().st_size for p in runs()[-1].glob("*.wandb"))
    assert run_py(tmp_path, "ctx.tokens=1024").returncode == 0                  # skipped: not logged again
    assert len(runs()) == 2
