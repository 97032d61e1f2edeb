"""Run one cell of the grid (or sweep with -m): model x quantizer x task x ctx.

    python run.py                                   # Gemma 3 270M, bf16, RULER niah_single_1, 4k (offline)
    python run.py quantizer=oscar task=ruler_niah ctx=8k
    python run.py -m quantizer=bf16,naive_int2 ctx=4k,8k
    python run.py debug=tiny                        # 2-layer random model, a handful of examples
"""
import sys

import hydra
from omegaconf import DictConfig

from oscar.logger import log_cell
from oscar.pipeline import CellError, run_cell
from oscar.report import print_summary


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        rows = run_cell(cfg)
    except CellError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print_summary(rows)
    log_cell(cfg, rows)


if __name__ == "__main__":
    main()
