"""Committed tables and plot data cannot drift: each equals a rebuild from the committed rows, byte for byte.

A table or plot CSV edited by hand, or rows changed without `python scripts/make_tables.py --allow-dirty`
and `python scripts/make_plots.py`, fail here; the README's headline table must equal the generated one
between its markers.
"""
import shutil
from pathlib import Path

import pandas as pd
import pytest

from report.includes import documents, refresh_includes
from report.plots import write_plots
from report.store import load_rows
from report.tables import (HEADLINE_BEGIN, HEADLINE_END, check_clean, headline_markdown, splice_headline,
                           write_tables)

ROOT = Path(__file__).resolve().parent.parent
STORES = [ROOT / "results", ROOT / "results" / "ablations", ROOT / "results" / "paper_ruler_offline",
          ROOT / "results" / "multi_gpu"]                          # results/archive: stale, not rebuilt
DRY_RUN_STORES = [ROOT / "results" / "dryrun", ROOT / "results" / "dryrun_ablation"]   # built with --dry-runs


def drifted_tables(store: Path, scratch: Path) -> list[str]:
    """Names of the store's committed tables that differ from a rebuild (or that a rebuild would not write)."""
    written = {p.name: p for p in write_tables(load_rows(store), store / "bench", scratch, allow_dirty=True,
                                               dry_runs=store in DRY_RUN_STORES)}
    committed = {p.name: p for p in (store / "tables").glob("*") if p.suffix in (".md", ".tex")}
    return sorted(name for name in set(written) | set(committed)
                  if name not in written or name not in committed
                  or written[name].read_bytes() != committed[name].read_bytes())


@pytest.mark.parametrize("store", [*STORES, *DRY_RUN_STORES], ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_tables_equal_a_rebuild_from_rows(store, tmp_path):
    assert drifted_tables(store, tmp_path) == [], \
        "regenerate with: python scripts/make_tables.py --allow-dirty --results " + str(store) + \
        (" --dry-runs" if store in DRY_RUN_STORES else "")


def test_committed_plot_data_equals_a_rebuild_from_rows(tmp_path):
    store = ROOT / "results"
    written = {p.name: p for p in write_plots(load_rows(store), store / "bench", tmp_path) if p.suffix == ".csv"}
    committed = {p.name: p for p in (store / "plots").glob("*.csv")}
    assert written and sorted(written) == sorted(committed), "regenerate with: python scripts/make_plots.py"
    assert [n for n in written if written[n].read_bytes() != committed[n].read_bytes()] == []


def test_rows_from_a_modified_tree_are_refused_unless_asked():
    rows = pd.DataFrame([{"cell": "a", "status": "ok", "git_sha": "0123abcd"},
                         {"cell": "b", "status": "ok", "git_sha": "0123abcd-dirty"}])
    with pytest.raises(ValueError, match="1 cells ran from a modified tree"):
        check_clean(rows)
    check_clean(rows, allow_dirty=True)
    check_clean(rows[rows["cell"] == "a"])


def test_a_hand_edited_table_is_caught(tmp_path):
    store = tmp_path / "store"
    shutil.copytree(ROOT / "results" / "rows", store / "rows")
    shutil.copytree(ROOT / "results" / "tables", store / "tables")
    edited = store / "tables" / "main.md"
    edited.write_text(edited.read_text().replace("| 4k | BF16 |", "| 4k | BF16 (edited) |", 1))
    assert "main.md" in drifted_tables(store, tmp_path / "rebuild")


def test_readme_headline_table_is_the_generated_one():
    readme = (ROOT / "README.md").read_text()
    assert HEADLINE_BEGIN in readme and HEADLINE_END in readme
    assert splice_headline(readme, headline_markdown(load_rows(ROOT / "results"))) == readme, \
        "regenerate with: python scripts/make_tables.py"


def test_tables_included_in_the_docs_are_the_generated_ones():
    stale = [doc.name for doc in documents(ROOT) if refresh_includes(doc.read_text(), ROOT) != doc.read_text()]
    assert stale == [], "regenerate with: python scripts/make_tables.py"


def test_an_include_copies_the_file_with_deeper_headings(tmp_path):
    (tmp_path / "t.md").write_text("# Title\n\n| a |\n|---|\n| 1 |\n")
    doc = "intro\n<!-- include:t.md:begin (generated) -->\nold numbers\n<!-- include:t.md:end -->\noutro\n"
    assert refresh_includes(doc, tmp_path) == ("intro\n<!-- include:t.md:begin (generated) -->\n### Title\n\n"
                                               "| a |\n|---|\n| 1 |\n<!-- include:t.md:end -->\noutro\n")
    with pytest.raises(ValueError, match="no such file"):
        refresh_includes(doc.replace("t.md", "u.md"), tmp_path)
