"""Run one cell of the grid (or sweep with -m): model x quantizer x task x ctx.

    python run.py                                   # Gemma 3 270M, bf16, RULER niah_single_1, 4k (offline)
    python run.py quantizer=oscar task=ruler_niah ctx=8k
    python run.py -m quantizer=bf16,naive_int2 ctx=4k,8k
    python run.py debug=tiny                        # 2-layer random model, a handful of examples

A failure is one line on stderr (HYDRA_FULL_ERROR=1 shows the traceback) and a non-zero exit: 2 for bad
input (nothing written), 1 for a cell that failed while running (its rows say status=error). A sweep goes
on past a failed cell and exits non-zero at the end, naming every cell that failed.
"""
import os
import signal
import sys


def _interrupted_while_starting(signum, frame) -> None:
    """Ctrl-C during the imports: one line and exit 130 at once. Raising KeyboardInterrupt there can land inside a
    C++ extension's callback (torch's pybind11 import), which aborts the process with a C++ traceback instead."""
    print("interrupted while starting; nothing was run.", file=sys.stderr, flush=True)
    os._exit(130)


_sigint_before_imports = signal.getsignal(signal.SIGINT)
if _sigint_before_imports is signal.default_int_handler:      # left alone where SIGINT is ignored (background jobs)
    signal.signal(signal.SIGINT, _interrupted_while_starting)
try:
    import logging
    from pathlib import Path

    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import CompactHydraException
    from hydra.types import RunMode
    from omegaconf import DictConfig

    from harness.cli_args import bad_group_choice, bad_override
    from harness.pipeline import CellDoesNotFit, CellError, ctx_label, run_cell
    from report.store import ResultsStore
    from report.summary import summary_text
    from report.wandb_logger import log_cell, log_failure
finally:
    signal.signal(signal.SIGINT, _sigint_before_imports)

REPO_ROOT = Path(__file__).resolve().parent
log = logging.getLogger("run")
FAILED: list[str] = []          # the failed cells of this sweep (launchers that run the cells in this process)


class CellFailed(CompactHydraException):
    """A sweep's cell failed; Hydra's sweeper raises the first one after every cell ran (one line, no traceback)."""


def results_store(results_dir: str) -> ResultsStore:
    """The store at `results_dir`; a relative path is taken from the repository root."""
    path = Path(results_dir)
    return ResultsStore(path if path.is_absolute() else REPO_ROOT / path)


def report(message: str) -> None:
    """One line on stderr, and the same line in the job's log file (Hydra's file handler), if there is one."""
    print(message, file=sys.stderr)
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def cell_name(cfg: DictConfig) -> str:
    return (f"model={cfg.model.name} quantizer={cfg.quantizer.name} task={cfg.task.name} ctx={ctx_label(cfg.ctx)} "
            f"seed={cfg.seed}")


def fail(cfg: DictConfig, err: Exception, logged: bool) -> None:
    """Report a failed cell in one line; a single run exits (2: bad input, 1: failed while running), a sweep
    records it and raises CellFailed, so that the job counts as failed (SLURM too) and the sweep goes on.
    `logged`: an error row was written (the cell ran), so the failure goes to the experiment logger too."""
    bad_input = isinstance(err, CellError)
    detail = str(err) if bad_input else f"{type(err).__name__}: {err}"
    status = "oom" if isinstance(err, CellDoesNotFit) else "error"
    line = f"error: {cell_name(cfg)}: {detail}" + (f" (its rows say status={status})" if logged else "")
    if logged:
        log_failure(cfg, detail, group=sweep_group())
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        report(line)
        FAILED.append(line)
        raise CellFailed(f"a cell of this sweep failed ({len(FAILED)} so far); the other cells ran") from None
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    report(line)
    sys.exit(2 if bad_input else 1)


def sweep_group() -> str | None:
    """The wandb group of this job: its sweep (multirun folder), or None for a single run."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    return "sweep-" + "_".join(Path(hydra_cfg.sweep.dir).parts[-2:])


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> None:
    store = results_store(cfg.results_dir)
    try:
        rows = run_cell(cfg, store)
    except Exception as err:
        fail(cfg, err, logged=bool(store.written))
    log.info(summary_text(rows))
    if store.written:                      # computed here, not skipped: log it (once)
        log_cell(cfg, rows, store.records(rows[0]["task"], rows[0]["cell"]), group=sweep_group())


def entry() -> None:
    """run.py's command line: group names checked first, Ctrl-C one line, a sweep's failed cells named at the end."""
    problem = (bad_group_choice(sys.argv[1:], REPO_ROOT / "configs")
               or bad_override(sys.argv[1:], REPO_ROOT / "configs"))
    if problem:
        report(f"error: {problem}")
        sys.exit(2)
    try:
        main()
    except KeyboardInterrupt:
        report("interrupted; finished cells keep their rows, a re-run skips them.")
        sys.exit(130)
    finally:
        if FAILED:
            report(f"{len(FAILED)} cell(s) of this sweep failed:\n  " + "\n  ".join(FAILED))


if __name__ == "__main__":
    entry()
