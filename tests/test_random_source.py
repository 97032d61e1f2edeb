"""model.source=random: random weights of a real model's shape, built on their device, rows marked as dry runs."""
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.models import build_tiny, load_model, tiny_config
from harness.pipeline import CellError, cell_definition, run_cell, validate
from harness.random_model import materialize, meta_model, shape_config, shape_file
from report.store import ResultsStore, cell_hash
from report.tables import all_tables, to_markdown

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
TINY_SHAPE = ROOT / "tests" / "fixtures" / "tiny_qwen3_shape.json"
# Parameters of the released checkpoints (model cards), to 1 %: the shape files must give these models.
PAPER_PARAMS = {"qwen3_8b": 8.19e9, "qwen3_32b": 32.8e9, "qwen3_4b_thinking": 4.02e9, "llama31_8b_instruct": 8.03e9}


def compose_cell(*overrides):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("config", list(overrides))


@pytest.mark.parametrize("model", sorted(PAPER_PARAMS))
def test_shape_files_give_the_paper_models(model):
    cfg = OmegaConf.load(CONFIGS / "model" / f"{model}.yaml")
    config = shape_config(shape_file(cfg.shape, model))
    assert config.model_type == cfg.model_type
    assert config.max_position_embeddings >= cfg.max_positions
    params = {id(p): p.numel() for p in meta_model(config, torch.bfloat16).parameters()}   # tied counted once
    assert sum(params.values()) == pytest.approx(PAPER_PARAMS[model], rel=0.01)


def test_speed_only_shape_file_gives_llama_3_2_1b():
    """configs/model/shapes/llama32_1b.json (bench_throughput's head_dim-64 model, no model config): 1.24e9 parameters
    (tied embeddings counted once), 32 query / 8 KV heads of 64."""
    config = shape_config(CONFIGS / "model" / "shapes" / "llama32_1b.json")
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (32, 8, 64)
    params = {id(p): p.numel() for p in meta_model(config, torch.bfloat16).parameters()}
    assert sum(params.values()) == pytest.approx(1.236e9, rel=0.01)


@pytest.mark.parametrize("arch", ["qwen3", "llama", "gemma3"])
def test_materialized_buffers_match_a_normal_build(arch):
    config = tiny_config(arch, 100)
    model = materialize(meta_model(config, torch.float32), {"": "cpu"}, seed=0)
    built = build_tiny(arch)[0]
    reference = dict(built.named_buffers())
    for name, buffer in model.named_buffers():                    # RoPE frequencies, Gemma's embed scale
        assert torch.equal(buffer, reference[name]), name
    assert not any(p.is_meta for p in model.parameters())
    assert torch.equal(model.model.norm.weight, built.model.norm.weight)   # ones (Gemma: zeros, it adds 1)
    assert 0.015 < model.model.layers[0].mlp.up_proj.weight.std() < 0.025   # drawn, not left empty


def test_materialize_ties_embeddings_and_refuses_a_partial_map():
    config = shape_config(TINY_SHAPE)
    model = materialize(meta_model(config, torch.float32), {"": "cpu"}, seed=0)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with pytest.raises(ValueError, match="no device for"):
        materialize(meta_model(config, torch.float32), {"model.layers": "cpu"}, seed=0)


def test_load_model_random_source_says_where_weights_and_tokenizer_came_from():
    cfg = compose_cell("model=qwen3_8b", "model.source=random", f"model.shape={TINY_SHAPE}",
                       "+model.random_tokenizer=char").model
    loaded = load_model(cfg, device="cpu", seed=3)
    assert (loaded.weights, loaded.tokenizer_name, loaded.chat) == ("random", "char", True)
    assert loaded.model.config.num_hidden_layers == 2 and loaded.model.dtype == torch.float32
    again = load_model(cfg, device="cpu", seed=3).model.model.layers[1].self_attn.q_proj.weight
    assert torch.equal(again, loaded.model.model.layers[1].self_attn.q_proj.weight)     # seeded


@pytest.mark.parametrize("overrides, needle", [
    (["model=qwen3_8b", "model.source=random", "+model.random_tokenizer=gemma3_270m"],
     "262144 ids, more than the 151936"),
    (["model=qwen3_8b", "model.source=random", "+model.random_tokenizer=nope"], "not an offline tokenizer"),
    (["model=gemma3_270m", "model.source=random"], "has no `shape:` file"),
    (["model=qwen3_8b", "model.source=random", "model.shape=/nonexistent.json"], "/nonexistent.json"),
])
def test_bad_random_sources_fail_before_loading(overrides, needle):
    with pytest.raises(CellError, match=needle):
        validate(compose_cell(*overrides))


def test_random_cells_are_labelled_and_hashed_apart():
    real = cell_definition(compose_cell("model=qwen3_8b"))
    dry = cell_definition(compose_cell("model=qwen3_8b", "model.source=random"))
    assert real[0]["model"] == "qwen3_8b" and dry[0]["model"] == "qwen3_8b@random"
    assert cell_hash(real[1]) != cell_hash(dry[1])


def test_oscar_dry_run_writes_rows_that_the_tables_leave_out(tmp_path, monkeypatch):
    """OSCAR calibrates on random weights (mechanically); the rows say dry run and stay out of the tables."""
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path / "cache"))
    cfg = compose_cell("model=qwen3_8b", "model.source=random", f"model.shape={TINY_SHAPE}",
                       "+model.random_tokenizer=char", "quantizer=oscar", "quantizer.calibration.budget=256",
                       "quantizer.calibration.seq_len=128", "task.samples=1", "task.max_new_tokens=4", "ctx=4k",
                       f"results_dir={tmp_path}")
    rows = run_cell(cfg, ResultsStore(tmp_path))
    assert {r["model"] for r in rows} == {"qwen3_8b@random"}
    assert rows[0]["run"]["weights"] == "random" and rows[0]["run"]["tokenizer"] == "char"
    assert rows[0]["artifacts"]                                   # calibrated rotations on the random weights
    real = {**{k: rows[0][k] for k in ("quantizer", "task", "ctx", "seed", "metric", "value", "status")},
            "model": "qwen3_8b", "run": {"weights": "pretrained"}, "timestamp": "t"}
    frame = pd.DataFrame([*rows, real])
    plain = to_markdown(all_tables(frame)[1])                    # ruler_niah_by_ctx
    assert "## qwen3_8b\n" in plain and "@random" not in plain
    labelled = to_markdown(all_tables(frame, dry_runs=True)[1])
    assert "## qwen3_8b@random" in labelled and "dry runs with random weights" in labelled


def test_dry_runs_are_recognised_by_their_run_field_too():
    row = {"model": "m", "quantizer": "bf16", "task": "ruler_niah", "ctx": "4k", "seed": 0, "metric": "ruler_niah",
           "value": 50.0, "status": "ok", "run": {"weights": "random"}, "timestamp": "t"}
    assert "## m" not in to_markdown(all_tables(pd.DataFrame([row]))[1])
    assert json.dumps(row)       # a plain row, as the store writes it
