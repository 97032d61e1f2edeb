"""lm-eval bridge (eval/lm_eval_bridge.py): the offline toy task end to end on a tiny random model."""
from pathlib import Path

import pytest

from eval import lm_eval_bridge

pytest.importorskip("lm_eval", reason="lm-eval is the optional [eval] extra (requirements-cpu.txt installs it)")

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


def _lm_eval_cell(quantizer, tmp_path, task):
    from hydra import compose, initialize_config_dir

    from harness.pipeline import run_cell
    from report.store import ResultsStore
    configs = Path(__file__).resolve().parent.parent / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        cfg = compose("config", ["model=tiny_qwen3", f"quantizer={quantizer}", "task=lm_eval", f"task.tasks=[{task}]",
                                 "task.limit=2", f"results_dir={tmp_path}"])
    return run_cell(cfg, ResultsStore(tmp_path))


def test_perplexity_is_scored_in_quantized_context(tmp_path):
    bf16 = {r["metric"]: r for r in _lm_eval_cell("bf16", tmp_path / "bf16", "toy_ppl")}
    int2 = {r["metric"]: r for r in _lm_eval_cell("naive_int2", tmp_path / "int2", "toy_ppl")}
    assert int2["toy_ppl/bits_per_byte"]["status"] == "ok"
    assert int2["toy_ppl/bits_per_byte"]["value"] != pytest.approx(bf16["toy_ppl/bits_per_byte"]["value"], rel=1e-4)
    assert int2["toy_ppl/bits_per_byte"]["run"]["decode_batches"]["quantized_context"] > 0   # the row says how
    assert "quantized_context" not in bf16["toy_ppl/bits_per_byte"]["run"]["decode_batches"]


def test_loglikelihood_task_runs_under_a_quantizer(tmp_path):
    rows = {r["metric"]: r for r in _lm_eval_cell("naive_int2", tmp_path, "toy_choice")}
    assert rows["toy_choice/acc"]["status"] == "ok"


def test_unknown_tasks_names_only_what_lm_eval_cannot_resolve():
    """Local task names, YAML files and built-in tasks resolve; built-ins are indexed only for a non-local name."""
    yaml_path = str(next(Path(TASKS).glob("*.yaml")))
    assert lm_eval_bridge.unknown_tasks(["toy_qa", yaml_path], TASKS) == []
    assert lm_eval_bridge.unknown_tasks(["toy_qa", "hellaswag", "no_such_task"], TASKS) == ["no_such_task"]


def test_the_task_index_is_built_once_for_validation_and_the_run():
    """Indexing lm-eval's built-in tasks takes seconds: a cell's validate() and its run share one index."""
    lm_eval_bridge.task_manager.cache_clear()
    assert lm_eval_bridge.unknown_tasks(["toy_qa"], TASKS) == []
    first = lm_eval_bridge.task_manager(TASKS, False)
    assert lm_eval_bridge.task_manager(TASKS, False) is first
    assert lm_eval_bridge.task_manager.cache_info().misses == 1


def test_generation_lengths_come_from_the_indexed_task_configs():
    """toy_qa asks for 8 tokens itself; a generate_until task without a limit gets HFLM's 256; other output types and
    unknown names are not generate_until tasks here."""
    assert lm_eval_bridge.generation_lengths(["toy_qa", "toy_choice", "nope"], TASKS) == {"toy_qa": 8}
    assert lm_eval_bridge.generation_lengths(["gsm8k"], TASKS) == {"gsm8k": lm_eval_bridge.DEFAULT_GEN_TOKENS}


def test_a_context_at_the_generation_length_is_refused_before_the_weights_load(tmp_path, monkeypatch):
    """ctx.tokens=8 and toy_qa's 8 generated tokens: lm-eval would assert after loading; the cell ends in one
    sentence with the tokenizer alone, and its error row says why."""
    import json

    from hydra import compose, initialize_config_dir

    import harness.pipeline as pipeline
    from report.store import ResultsStore

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights loaded")
    monkeypatch.setattr(pipeline, "load_prepared", no_weights)
    with initialize_config_dir(config_dir=str(Path(TASKS).parents[1] / "configs"), version_base="1.3"):
        cfg = compose("config", ["model=tiny_qwen3", "task=lm_eval", "task.tasks=[toy_qa]", "ctx.tokens=8",
                                 f"results_dir={tmp_path}"])
    with pytest.raises(pipeline.CellError, match=r"task.tasks \['toy_qa'\] generate up to 8 tokens") as err:
        pipeline.run_cell(cfg, ResultsStore(tmp_path))
    assert "\n" not in str(err.value) and "ctx.tokens above 8" in str(err.value)
    (row,) = [json.loads(line) for path in tmp_path.rglob("rows/**/*.jsonl") for line in path.open()]
    assert row["status"] == "error" and row["error"] == str(err.value)
    assert pipeline.validate(cfg).task.check_prompts(None, False, 9, 0) is None           # 9 leaves one prompt token
