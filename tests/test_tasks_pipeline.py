"""Every task config runs end to end through run_cell on a tiny model with offline fixtures."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.pipeline import run_cell
from report.store import ResultsStore

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.mark.parametrize("task, overrides, metric", [
    ("aime25", [f"task.data_path={FIXTURES / 'aime_tiny.jsonl'}", "task.max_new_tokens=8", "task.samples=2"],
     "aime25_pass1"),
    ("longbench", [f"task.data_path={FIXTURES / 'longbench_tiny.jsonl'}", "task.samples=1",
                   "task.subsets=[hotpotqa]"], "hotpotqa"),
    ("ruler_niah", ["task.samples=1", "task.max_new_tokens=8", "task.variants=[niah_multikey_1,niah_multivalue]"],
     "ruler_niah"),
])
def test_task_runs_through_the_pipeline(tmp_path, task, overrides, metric):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", ["model=tiny_llama", "quantizer=naive_int2", f"task={task}", "ctx=4k",
                                 f"results_dir={tmp_path}", *overrides])
    rows = {r["metric"]: r for r in run_cell(cfg, ResultsStore(tmp_path))}
    assert metric in rows and rows[metric]["status"] == "ok"
    assert 0.0 <= rows[metric]["value"] <= 100.0
    assert list((tmp_path / "records" / task).glob("*.jsonl")), "per-example outputs were not saved"
