"""Tidy result rows with provenance, written atomically, one file per cell; finished cells are skipped.

Layout under `results_dir`:
    rows/<task>/<cell>.jsonl       one JSON row per metric: model quantizer task ctx seed metric value, its n
                                   and 95% interval (scored tasks) + provenance
                                   (the resolved cell settings, artifact digests, how it ran, git commit and dirty flag)
    records/<task>/<cell>.jsonl    per-example outputs and scores (the audit trail of a score)
`<cell>` is a hash of the config that defines the cell, so a sweep re-run skips what exists and
retries cells whose rows say status=error (or status=oom: refused by the memory plan).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path

ROW_KEYS = ("model", "quantizer", "task", "ctx", "seed", "metric", "value")
DAMAGED_SUFFIX = ".damaged"      # rows/<task>/<cell>.jsonl.damaged: lines of a rows file that do not parse

log = logging.getLogger(__name__)


def cell_hash(cell_config: dict) -> str:
    """Stable 12-hex hash of the config that defines a cell (model, quantizer, task, ctx, seed and options)."""
    blob = json.dumps(cell_config, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def rows_path(results_dir, task: str, cell: str) -> Path:
    return Path(results_dir) / "rows" / task / f"{cell}.jsonl"


def records_path(results_dir, task: str, cell: str) -> Path:
    return Path(results_dir) / "records" / task / f"{cell}.jsonl"


def atomic_write_jsonl(path: Path, items) -> None:
    """Write all lines to a temp file in the same folder, fsync, then rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".jsonl")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())      # mkstemp makes 0600; colleagues on a shared store read rows
        with os.fdopen(fd, "w") as fh:
            for item in items:
                fh.write(json.dumps(asdict(item) if is_dataclass(item) else item, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def parse_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    """(the JSON objects of a .jsonl file, its lines that are not one: e.g. a half-written last line)."""
    items, damaged = [], []
    with open(path, errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                item = None
            if isinstance(item, dict):
                items.append(item)
            else:
                damaged.append(line.rstrip("\n"))
    return items, damaged


def set_aside(path: Path, damaged: list[str]) -> None:
    """Keep damaged lines in <file>.damaged beside the file, and say so once (not again while they are kept)."""
    side = path.with_name(path.name + DAMAGED_SUFFIX)
    text = "\n".join(damaged) + "\n"
    if side.is_file() and side.read_text(errors="replace") == text:
        return
    try:
        side.write_text(text)
    except OSError:                   # a read-only store: still read the good rows, and say so
        side = "nowhere (the store is read-only)"
    log.warning("%s has %d line(s) that do not parse (e.g. a half-written write); kept in %s, the other rows are "
                "read, and the cell counts as not done.", path, len(damaged), side)


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a .jsonl file; lines that do not parse are set aside (`set_aside`) and skipped."""
    items, damaged = parse_jsonl(path)
    if damaged:
        set_aside(Path(path), damaged)
    return items


def cell_is_done(results_dir, task: str, cell: str) -> bool:
    """True when the cell has rows, all of them whole, and none records an error (errors are retried)."""
    path = rows_path(results_dir, task, cell)
    if not path.exists():
        return False
    rows, damaged = parse_jsonl(path)
    if damaged:
        set_aside(path, damaged)
    return not damaged and bool(rows) and all(r.get("status") == "ok" for r in rows)


def git_sha(repo: Path = Path(__file__).parent) -> str:
    """Commit of the code that ran ($OSCAR_GIT_SHA wins, for copies of the tree without .git, e.g. a GPU box), with
    "-dirty" when tracked files outside results/ differ from it (rows a sweep rewrites do not make later cells
    dirty)."""
    if os.environ.get("OSCAR_GIT_SHA"):
        return os.environ["OSCAR_GIT_SHA"]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=repo, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":/",
                                ":(exclude,top)results"], capture_output=True, text=True, cwd=repo,
                               timeout=10).stdout.strip()               # the results store is data, not code
        return (sha or "unknown") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class CellRecorder:
    """Collects the provenance of one cell and writes its rows (ok or error) atomically."""

    def __init__(self, results_dir, cell_key: dict, cell_config: dict, environment=dict, on_write=None):
        self.results_dir, self.key = results_dir, cell_key
        self.on_write = on_write or (lambda cell: None)   # told the cell id once its rows are written
        self.cell, self.config = cell_hash(cell_config), cell_config
        self.artifacts: dict = {}        # digest of each file the cell was built from (rotations, calibration text)
        self.environment = environment   # () -> {"versions", "device", "peak_mem_mb"}: measured by the caller
        self.started = time.time()
        self.run: dict = {}       # how the cell ran (kernel path, decode path per batch): provenance, not identity
        self.intervals: dict = {}  # metric -> {"n": examples, "ci95": [low, high]} (harness/intervals.py)

    def _provenance(self) -> dict:
        """The fields every row of one write shares (git and the machine are asked once, not per metric)."""
        sha = git_sha()
        return {"cell": self.cell, "config_hash": self.cell, "config": self.config, "artifacts": self.artifacts,
                "git_sha": sha, "git_dirty": sha.endswith("-dirty"), **self.environment(),
                "wall_time_s": round(time.time() - self.started, 2),
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "run": self.run}

    def write_ok(self, metrics: dict, records=()) -> list[dict]:
        shared = self._provenance()
        rows = [{**self.key, "metric": name, "value": float(value), "status": "ok", "error": "",
                 **self.intervals.get(name, {}), **shared} for name, value in metrics.items()]
        if records:
            atomic_write_jsonl(records_path(self.results_dir, self.key["task"], self.cell), records)
        atomic_write_jsonl(rows_path(self.results_dir, self.key["task"], self.cell), rows)
        self.on_write(self.cell)
        return rows

    def write_error(self, message: str, status: str = "error") -> list[dict]:
        """One row saying why the cell has no results: status `error` (it failed) or `oom` (refused by its memory
        plan); either is retried by the next sweep."""
        rows = [{**self.key, "metric": "error", "value": float("nan"), "status": status, "error": message,
                 **self._provenance()}]
        atomic_write_jsonl(rows_path(self.results_dir, self.key["task"], self.cell), rows)
        self.on_write(self.cell)
        return rows


class ResultsStore:
    """One results directory: hands out a cell's recorder, says whether a cell is done, reads its rows."""

    def __init__(self, results_dir):
        self.results_dir = Path(results_dir)
        self.written: list[str] = []      # ids of the cells whose rows this store wrote (skipped cells are not)

    def recorder(self, cell_key: dict, cell_config: dict, environment=dict) -> CellRecorder:
        return CellRecorder(self.results_dir, cell_key, cell_config, environment, on_write=self.written.append)

    def check_writable(self) -> None:
        """ValueError (one sentence) unless rows can be written under results_dir: checked before a cell computes,
        leaving nothing behind (the nearest existing folder of results_dir/rows must take a new folder: a trial
        one is made and removed, as permissions alone would let root, or a folder under /proc, through)."""
        target = self.results_dir / "rows"
        existing = next(path for path in (target, *target.parents) if path.exists())
        if not existing.is_dir():
            problem = f"'{existing}' is not a folder"
        elif not os.access(existing, os.W_OK | os.X_OK):
            problem = f"'{existing}' is read-only"
        else:
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=existing))
                return
            except OSError as err:
                problem = f"'{existing}' takes no new folder: {err.strerror}"
        raise ValueError(f"results_dir '{self.results_dir}' cannot be written ({problem}); pass a writable folder "
                         f"with results_dir=DIR.")

    def is_done(self, recorder: CellRecorder) -> bool:
        return cell_is_done(self.results_dir, recorder.key["task"], recorder.cell)

    def rows(self, recorder: CellRecorder) -> list[dict]:
        return read_jsonl(rows_path(self.results_dir, recorder.key["task"], recorder.cell))

    def records(self, task: str, cell: str) -> list[dict]:
        """The per-example records of a cell (none for a task without them)."""
        path = records_path(self.results_dir, task, cell)
        return read_jsonl(path) if path.exists() else []


def load_rows(results_dir) -> "pandas.DataFrame":
    """Every row under results_dir/rows as one DataFrame (empty with the row columns if there is none)."""
    import pandas as pd
    rows = [r for p in sorted(Path(results_dir, "rows").glob("*/*.jsonl")) for r in read_jsonl(p)]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(ROW_KEYS) + ["status"])
