"""Run one cell of the grid (or sweep with -m): model x quantizer x task x ctx.

    python run.py                                   # Gemma 3 270M, bf16, RULER niah_single_1, 4k (offline)
    python run.py quantizer=oscar task=ruler_niah ctx=8k
    python run.py -m quantizer=bf16,naive_int2 ctx=4k,8k
    python run.py debug=tiny                        # 2-layer random model, a handful of examples
"""
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.pipeline import CellDoesNotFit, CellError, run_cell
from report.store import ResultsStore
from report.summary import print_summary
from report.wandb_logger import log_cell

REPO_ROOT = Path(__file__).resolve().parent


def results_store(results_dir: str) -> ResultsStore:
    """The store at `results_dir`; a relative path is taken from the repository root."""
    path = Path(results_dir)
    return ResultsStore(path if path.is_absolute() else REPO_ROOT / path)


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        rows = run_cell(cfg, results_store(cfg.results_dir))
    except CellDoesNotFit as err:     # recorded as status=oom; in a sweep the other cells go on
        print(f"error: {err}", file=sys.stderr)
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            sys.exit(2)
        return
    except CellError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:  # in a sweep, a failed cell (already recorded as status=error) must not stop the rest
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            raise
        print(f"[error] cell failed and was recorded; the sweep goes on: {type(err).__name__}: {err}", file=sys.stderr)
        return
    print_summary(rows)
    log_cell(cfg, rows)


if __name__ == "__main__":
    main()
