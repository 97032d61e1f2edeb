"""The notebook API (notebook.py): a session's generate / forward go through the quantized cache, a cell
runs from overrides and returns the rows it wrote."""
import torch

import notebook
from harness.cache import ThreeRegionLayer


def test_a_session_decodes_through_the_three_region_cache_and_restores_the_model():
    session = notebook.load("tiny_qwen3", "naive_int2", "quantizer.recent=8", "quantizer.page=4")
    cache = session.new_cache()
    session.forward("a prompt long enough to reach the quantized history: " * 2, cache=cache)
    layer = next(layer for layer in cache.layers if isinstance(layer, ThreeRegionLayer))
    assert layer.history_length > 0
    text = session.generate(["one", "a second, longer prompt"], max_new_tokens=4)
    assert isinstance(text, list) and len(text) == 2
    before = session.model.config._attn_implementation
    session.close()
    assert before == "kvq" and session.model.config._attn_implementation != "kvq"


def test_bf16_session_logits_equal_the_stock_model():
    session = notebook.load("tiny_llama", "bf16")
    ours = session.forward("the same words").logits
    session.close()
    with torch.inference_mode():
        stock = session.model(**session._encode("the same words")).logits
    torch.testing.assert_close(ours, stock)


def test_run_cell_writes_and_returns_rows(tmp_path):
    rows = notebook.run_cell("debug=tiny", f"results_dir={tmp_path}", "task.samples=2")
    assert rows and {r["status"] for r in rows} == {"ok"}
    assert list(tmp_path.glob("rows/*/*.jsonl"))
    assert notebook.run_cell("debug=tiny", f"results_dir={tmp_path}", "task.samples=2") == rows   # skipped: same rows
