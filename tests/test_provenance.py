"""Rows carry the resolved cell settings, artifact digests, how the cell ran and git state; the cell id
rule (hash of the settings that change results) keeps existing ids when a new option is added at its default."""
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.pipeline import ID_NEUTRAL_DEFAULTS, cell_definition, run_cell
from report.store import cell_hash, load_rows
from report.store import ResultsStore

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def compose_cell(*overrides):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("config", ["model=tiny_qwen3", "task.samples=1", "task.max_new_tokens=4", *overrides])


def cell_id(*overrides) -> str:
    return cell_hash(cell_definition(compose_cell(*overrides))[1])


def test_an_option_added_at_its_old_default_keeps_the_cell_id():
    assert ("quantizer", "rotation_dtype") in ID_NEUTRAL_DEFAULTS
    plain = cell_id("quantizer=oscar")
    assert cell_id("quantizer=oscar", "+quantizer.rotation_dtype=float32") == plain
    assert cell_id("quantizer=oscar", "+quantizer.rotation_dtype=model") != plain
    assert "key_target" not in cell_definition(compose_cell("quantizer=oscar"))[1]["quantizer"]   # as before it existed
    assert cell_id("quantizer=oscar", "quantizer.key_target=tensor") != plain
    assert cell_id("quantizer=oscar", "+quantizer.chunk_keeps_recent=true") == plain
    assert cell_id("quantizer=oscar", "+quantizer.chunk_keeps_recent=false") != plain
    assert cell_id("quantizer=oscar", "+quantizer.prefill_attends_quantized=false") == plain
    assert cell_id("quantizer=oscar", "+quantizer.prefill_attends_quantized=true") != plain


def test_settings_that_change_results_change_the_id_and_code_paths_do_not():
    plain = cell_id("quantizer=naive_int2")
    assert cell_id("quantizer=naive_int2", "quantizer.recent=8") != plain
    assert cell_id("quantizer=naive_int2", "seed=1") != plain
    assert cell_id("quantizer=naive_int2", "task.samples=2") != plain
    assert cell_id("quantizer=naive_int2", "kernels=reference") == plain           # how it ran: provenance only
    assert cell_id("quantizer=naive_int2", "quantizer._target_=harness.uniform.UniformKVQuantizer") == plain


def test_a_ctx_tokens_override_keys_the_cell_by_its_count_not_the_ctx_name():
    """`ctx=4k ctx.tokens=1024` is a 1024-token cell: keyed "1024" so a table never shows it as 4k; a name that is
    its count, or not a count at all, stays."""
    assert cell_definition(compose_cell("ctx=4k"))[0]["ctx"] == "4k"
    assert cell_definition(compose_cell("ctx=4k", "ctx.tokens=1024"))[0]["ctx"] == "1024"
    assert cell_definition(compose_cell("ctx=4k", "ctx.tokens=4096"))[0]["ctx"] == "4k"
    assert cell_definition(compose_cell("ctx=4k", "ctx.name=long", "ctx.tokens=3000"))[0]["ctx"] == "long"
    assert cell_id("ctx=4k", "ctx.tokens=1024") != cell_id("ctx=4k")


def test_rows_record_settings_artifacts_run_and_git(tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path / "cache"))
    cfg = compose_cell("quantizer=oscar", "quantizer.sink=4", "quantizer.recent=16", "quantizer.calibration.budget=256",
                       "quantizer.calibration.seq_len=128", f"results_dir={tmp_path}")
    rows = run_cell(cfg, ResultsStore(tmp_path))
    row = rows[0]
    assert row["config"] == cell_definition(cfg)[1] and row["config"]["quantizer"]["sink"] == 4
    assert set(row["artifacts"]) == {"k_rotation_qqt_r_h_pbr.pt", "v_rotation_sst_r_h_pbr.pt", "calibration_text"}
    assert all(len(digest) == 16 for digest in row["artifacts"].values())
    assert row["run"]["device"] == "cpu" and row["run"]["kernels"] is False
    assert row["run"]["prefill_attends_quantized"] is False                   # recorded even at its default
    assert isinstance(row["git_dirty"], bool) and row["git_sha"]


def test_a_row_written_before_the_provenance_fields_still_loads(tmp_path):
    old = {"model": "m", "quantizer": "q", "task": "t", "ctx": "4k", "seed": 0, "metric": "acc", "value": 0.5,
           "status": "ok", "error": "", "cell": "abc", "config_hash": "abc", "git_sha": "1234"}
    path = tmp_path / "rows" / "t" / "abc.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old) + "\n")
    frame = load_rows(tmp_path)
    assert frame.loc[0, "value"] == pytest.approx(0.5) and frame.loc[0, "git_sha"] == "1234"


def test_a_rewritten_results_file_does_not_mark_the_code_dirty(tmp_path, monkeypatch):
    """A sweep with force=true rewrites tracked rows: later cells still ran the committed code; a code edit is dirty."""
    import subprocess
    from report.store import git_sha
    monkeypatch.delenv("OSCAR_GIT_SHA", raising=False)

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "rows.jsonl").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    clean = git_sha(tmp_path)
    assert clean and not clean.endswith("-dirty")
    (tmp_path / "results" / "rows.jsonl").write_text("{}\n{}\n")
    assert git_sha(tmp_path) == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_sha(tmp_path) == clean + "-dirty"
