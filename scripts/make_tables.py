"""Regenerate every results table (Markdown + LaTeX) from the results store.

    python scripts/make_tables.py                                  # results/ -> results/tables/
    python scripts/make_tables.py --results outputs/debug_results --out /tmp/tables

Writes main, ruler_niah_by_ctx, ruler_niah_variants and fidelity as <name>.md and <name>.tex (booktabs), plus
bench.md with every results/bench/*.md verbatim. Only status=ok rows count; seeds are averaged; cells that were not
run print as "–". For the default store (results/ into results/tables) it also rewrites the README's headline table
between its markers; every run refreshes the generated tables that README.md and docs/*.md include
(report/includes.py). The logic lives in report/tables.py; tests/test_committed_tables.py fails when a committed
table differs from a rebuild. Rows that ran from a modified tree (git_sha ...-dirty) are refused unless
--allow-dirty; the tables then say how many cells did. It also writes the paper's tables (paper_main,
paper_aime_int2, paper_ruler, paper_ablation; report/paper_tables.py): the paper's value
(results/paper/oscar_paper.yaml) beside ours and the difference, and paper_throughput (report/paper_throughput.py):
the paper's throughput speedups beside each bench_throughput.py run's JSON in results/bench. Random-weight dry runs
(model "...@random" or run.weights == "random") are left out of every table unless --dry-runs, which shows them
marked, never as results.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report.includes import documents, refresh_includes  # noqa: E402
from report.store import load_rows  # noqa: E402
from report.paper_tables import split_dry_runs  # noqa: E402
from report.tables import headline_markdown, splice_headline, write_tables  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="results store (rows/ below it)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <results>/tables)")
    parser.add_argument("--allow-dirty", action="store_true", help="accept rows that ran from a modified tree")
    parser.add_argument("--dry-runs", action="store_true", help="show random-weight dry runs too, marked")
    args = parser.parse_args()
    out = args.out or args.results / "tables"
    if not (args.results / "rows").is_dir():
        sys.exit(f"error: '{args.results}' is not a results store (it has no rows/ folder); pass --results DIR.")
    rows = load_rows(args.results)
    try:
        written = write_tables(rows, args.results / "bench", out, allow_dirty=args.allow_dirty, dry_runs=args.dry_runs)
    except ValueError as err:
        sys.exit(f"error: {err}")
    for path in written:
        print(f"wrote {path}")
    if args.out is None and args.results.resolve() == (ROOT / "results").resolve():
        readme = ROOT / "README.md"
        readme.write_text(splice_headline(readme.read_text(), headline_markdown(split_dry_runs(rows)[0])))
        print(f"wrote {readme} (headline table)")
    refresh_documents()


def refresh_documents() -> None:
    """Re-include the committed generated tables wherever README.md or docs/*.md include them."""
    for doc in documents(ROOT):
        text = doc.read_text()
        try:
            fresh = refresh_includes(text, ROOT)
        except ValueError as err:
            sys.exit(f"error: {doc.relative_to(ROOT)}: {err}")
        if fresh != text:
            doc.write_text(fresh)
            print(f"wrote {doc} (included tables)")


if __name__ == "__main__":
    main()
