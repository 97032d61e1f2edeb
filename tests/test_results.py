"""The results store: atomic writes, skip-if-done, error rows retried."""
import json

import pytest

from report.store import CellRecorder, atomic_write_jsonl, cell_is_done, load_rows, rows_path

KEY = {"model": "m", "quantizer": "q", "task": "t", "ctx": "4k", "seed": 0}


def test_interrupted_write_leaves_no_file(tmp_path):
    path = tmp_path / "rows" / "t" / "cell.jsonl"

    def items():
        yield {"a": 1}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write_jsonl(path, items())
    assert not path.exists()
    assert list(path.parent.iterdir()) == []


def test_ok_rows_mark_cell_done_and_error_rows_do_not(tmp_path):
    rec = CellRecorder(tmp_path, KEY, {"cfg": 1})
    rec.write_error("RuntimeError: boom")
    assert not cell_is_done(tmp_path, "t", rec.cell)
    rows = rec.write_ok({"acc": 0.5})
    assert cell_is_done(tmp_path, "t", rec.cell)
    assert rows[0]["value"] == 0.5 and rows[0]["status"] == "ok"
    stored = [json.loads(x) for x in rows_path(tmp_path, "t", rec.cell).read_text().splitlines()]
    assert [r["metric"] for r in stored] == ["acc"]
    frame = load_rows(tmp_path)
    assert list(frame[["model", "quantizer", "task", "ctx", "seed", "metric", "value"]].iloc[0]) == \
        ["m", "q", "t", "4k", 0, "acc", 0.5]


def test_cell_hash_depends_on_the_config(tmp_path):
    assert CellRecorder(tmp_path, KEY, {"x": 1}).cell != CellRecorder(tmp_path, KEY, {"x": 2}).cell
    assert CellRecorder(tmp_path, KEY, {"x": 1}).cell == CellRecorder(tmp_path, KEY, {"x": 1}).cell
