"""The paper's tasks (MATH-500, GPQA-Diamond, HumanEval, LiveCodeBench) run end to end through run_cell
on a tiny random model with their offline fixtures: rows with intervals and per-example records."""
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.pipeline import run_cell
from report.store import ResultsStore

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.mark.parametrize("task, fixture", [("math500", "math500_tiny.jsonl"), ("gpqa_diamond", "gpqa_tiny.jsonl"),
                                           ("humaneval", "humaneval_tiny.jsonl"),
                                           ("livecodebench", "livecodebench_tiny.jsonl")])
def test_paper_task_runs_through_the_pipeline(tmp_path, task, fixture):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", ["model=tiny_llama", "quantizer=naive_int2", f"task={task}", "ctx=4k",
                                 f"results_dir={tmp_path}", f"task.data_path={FIXTURES / fixture}",
                                 "task.max_new_tokens=8", "task.samples=2"])
    rows = {r["metric"]: r for r in run_cell(cfg, ResultsStore(tmp_path))}
    metric = f"{task}_pass1"
    assert rows[metric]["status"] == "ok" and 0.0 <= rows[metric]["value"] <= 100.0
    assert rows[metric]["n"] == 2
    [records_file] = (tmp_path / "records" / task).glob("*.jsonl")
    records = [json.loads(line) for line in records_file.read_text().splitlines()]
    assert len(records) == 2 and all(r["meta"]["max_new_tokens"] == 8 for r in records)
