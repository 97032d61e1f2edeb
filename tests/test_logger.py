"""logger=wandb writes an offline run directory holding the rows; logger=none does nothing."""
import os

from hydra import compose, initialize_config_dir

from report.wandb_logger import log_cell

CONFIGS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "configs"))
ROWS = [{"model": "m", "quantizer": "q", "task": "ruler_niah", "ctx": "4k", "seed": 0, "metric": "acc",
         "value": 0.75, "status": "ok"}]


def test_wandb_offline_writes_a_run_with_the_rows(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        cfg = compose("config", ["logger=wandb", f"logger.dir={tmp_path}"])
    run_dir = log_cell(cfg, ROWS)
    assert run_dir and str(tmp_path) in run_dir
    files = list(tmp_path.rglob("*.wandb"))
    assert files and files[0].stat().st_size > 0
    assert b"0.75" in files[0].read_bytes() or b"acc" in files[0].read_bytes()


def test_logger_none_logs_nothing():
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        cfg = compose("config", [])
    assert log_cell(cfg, ROWS) is None
