"""The results store: atomic writes, skip-if-done, error rows retried, damaged files set aside, files readable
by colleagues (umask), an unwritable store refused before a cell computes."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness import pipeline
from report.store import (CellRecorder, ResultsStore, atomic_write_jsonl, cell_is_done, load_rows, records_path,
                          rows_path)

ROOT = Path(__file__).resolve().parent.parent

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


def test_a_half_written_last_line_is_set_aside_once_and_the_cell_reruns(tmp_path, caplog):
    rec = CellRecorder(tmp_path, KEY, {"cfg": 1})
    rec.write_ok({"acc": 0.5, "f1": 0.25})
    path = rows_path(tmp_path, "t", rec.cell)
    whole = path.read_text()
    path.write_text(whole + '{"model": "m", "metric": "ex')          # a write cut off mid-line
    with caplog.at_level("WARNING", logger="report.store"):
        assert not cell_is_done(tmp_path, "t", rec.cell)            # the cell runs again
        frame = load_rows(tmp_path)                                  # the whole rows still count
        load_rows(tmp_path)
    assert sorted(frame["metric"]) == ["acc", "f1"]
    side = path.with_name(path.name + ".damaged")
    assert side.read_text() == '{"model": "m", "metric": "ex\n'
    assert len([r for r in caplog.records if "do not parse" in r.getMessage()]) == 1   # reported once
    rec.write_ok({"acc": 0.5, "f1": 0.25})                           # the re-run replaces the damaged file
    assert cell_is_done(tmp_path, "t", rec.cell) and path.read_text().count("\n") == 2


def test_tables_build_from_a_store_with_a_damaged_rows_file(tmp_path):
    rec = CellRecorder(tmp_path, {**KEY, "task": "ruler_niah", "quantizer": "bf16"}, {"cfg": 1})
    rec.write_ok({"ruler_niah": 50.0, "bits_per_element": 16.0})
    path = rows_path(tmp_path, "ruler_niah", rec.cell)
    path.write_text(path.read_text() + "{not json")
    done = make_tables("--results", str(tmp_path), "--out", str(tmp_path / "tables"), "--allow-dirty")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "50" in (tmp_path / "tables" / "main.md").read_text()


def test_make_tables_refuses_a_missing_store_in_one_sentence(tmp_path):
    done = make_tables("--results", str(tmp_path / "nowhere"), "--out", str(tmp_path / "tables"))
    assert done.returncode != 0 and "is not a results store" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "tables").exists()


def make_tables(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tables.py"), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664)])
def test_rows_and_records_files_follow_the_umask(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        rec = CellRecorder(tmp_path, KEY, {"cfg": 1})
        rec.write_ok({"acc": 0.5}, records=[{"example_id": "a", "score": 1.0}])
    finally:
        os.umask(previous)
    for path in (rows_path(tmp_path, "t", rec.cell), records_path(tmp_path, "t", rec.cell)):
        assert stat.S_IMODE(path.stat().st_mode) == mode


def test_an_unwritable_results_dir_is_refused_before_the_cell_computes(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match="cannot be written"):
        ResultsStore(blocker).check_writable()
    monkeypatch.setattr(pipeline, "execute", lambda *a: pytest.fail("computed a cell whose rows cannot be written"))
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", ["model=tiny_qwen3", f"results_dir={blocker}"])
    with pytest.raises(pipeline.CellError, match="cannot be written"):
        pipeline.run_cell(cfg, ResultsStore(blocker))


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_folder_that_takes_no_new_folder_is_refused_whoever_runs(tmp_path):
    """/proc passes a permission check for root, yet takes no folder: the rows would be lost after the cell ran."""
    with pytest.raises(ValueError, match="results_dir '/proc/oscar-results' cannot be written"):
        ResultsStore("/proc/oscar-results").check_writable()
    ResultsStore(tmp_path / "new").check_writable()
    assert list(tmp_path.iterdir()) == []                  # the trial folder is gone, nothing was created


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_results_dir_is_refused(tmp_path):
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows").chmod(0o500)
    try:
        with pytest.raises(ValueError, match="cannot be written"):
            ResultsStore(tmp_path).check_writable()
    finally:
        (tmp_path / "rows").chmod(0o700)
