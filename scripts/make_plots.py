"""Regenerate every results figure (PNG + PDF) from the results store and the benchmark JSON.

    python scripts/make_plots.py                                   # results/ -> results/plots/
    python scripts/make_plots.py --results outputs/debug_results --out /tmp/plots

Figures: accuracy_vs_ctx_<model>, accuracy_vs_bpe_<model>, layer_fidelity_<model>_<ctx> and, for each
results/bench/*.json holding decode timings, decode_speedup_<file>. Figures with no data are skipped.
The logic lives in report/plots.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report.plots import write_plots  # noqa: E402
from report.store import load_rows  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="results store (rows/ below it)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <results>/plots)")
    args = parser.parse_args()
    out = args.out or args.results / "plots"
    if not (args.results / "rows").is_dir():
        sys.exit(f"error: '{args.results}' is not a results store (it has no rows/ folder); pass --results DIR.")
    for path in write_plots(load_rows(args.results), args.results / "bench", out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
