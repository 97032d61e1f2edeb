"""lm-eval bridge (eval/lm_eval_bridge.py): the offline toy task end to end on a tiny random model."""
from pathlib import Path

import pytest

from eval import lm_eval_bridge

TASKS = str(Path(lm_eval_bridge.__file__).parent / "lm_eval_tasks")


def test_toy_task_runs_end_to_end_through_the_given_cache(tiny):
    from transformers import DynamicCache
    model, tok = tiny("qwen3")
    caches = []

    def new_cache():
        caches.append(DynamicCache(config=model.config))
        return caches[-1]

    metrics = lm_eval_bridge.run_lm_eval(model, tok, new_cache, ["toy_qa"], include_path=TASKS, limit=3,
                                         batch_size=2, max_length=256)
    assert 0.0 <= metrics["toy_qa/exact_match"] <= 1.0          # a random model: the value itself is garbage
    assert all(key.startswith("toy_qa/") and isinstance(v, float) for key, v in metrics.items())
    assert len(caches) == 2                                      # one fresh cache per generate call (3 docs, batch 2)
    assert all(cache.get_seq_length() > 0 for cache in caches)   # ... and generate actually filled it


def test_local_json_data_files_resolve_against_the_yaml_folder():
    [config, name] = lm_eval_bridge.local_task_configs(["toy_qa", "hellaswag"], TASKS)
    assert config["task"] == "toy_qa" and name == "hellaswag"
    assert config["dataset_kwargs"]["data_files"] == {"test": str(Path(TASKS) / "toy_qa.jsonl")}
    assert lm_eval_bridge.local_task_configs(["toy_qa"], None) == ["toy_qa"]


def test_flatten_results():
    results = {"toy_qa": {"alias": "toy_qa", "exact_match,none": 0.5, "exact_match_stderr,none": "N/A"},
               "gsm8k": {"exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.1}}
    assert lm_eval_bridge.flatten_results(results) == pytest.approx({
        "toy_qa/exact_match": 0.5, "gsm8k/exact_match,strict-match": 0.25,
        "gsm8k/exact_match_stderr,strict-match": 0.1})
