"""Regenerate every results table (Markdown + LaTeX) from the results store.

    python scripts/make_tables.py                                  # results/ -> results/tables/
    python scripts/make_tables.py --results outputs/debug_results --out /tmp/tables

Writes main, ruler_niah_by_ctx, ruler_niah_variants and fidelity as <name>.md and <name>.tex
(booktabs), plus bench.md with every results/bench/*.md verbatim. Only status=ok rows count; seeds
are averaged; cells that were not run print as "–". The logic lives in report/tables.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report.store import load_rows  # noqa: E402
from report.tables import write_tables  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="results store (rows/ below it)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <results>/tables)")
    args = parser.parse_args()
    out = args.out or args.results / "tables"
    for path in write_tables(load_rows(args.results), args.results / "bench", out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
