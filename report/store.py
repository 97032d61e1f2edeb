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
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path

ROW_KEYS = ("model", "quantizer", "task", "ctx", "seed", "metric", "value")


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
        with os.fdopen(fd, "w") as fh:
            for item in items:
                fh.write(json.dumps(asdict(item) if is_dataclass(item) else item, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def cell_is_done(results_dir, task: str, cell: str) -> bool:
    """True when the cell has rows and none of them records an error (errors are retried)."""
    path = rows_path(results_dir, task, cell)
    return path.exists() and all(r.get("status") == "ok" for r in read_jsonl(path))


def git_sha() -> str:
    """Commit of the code that ran ($OSCAR_GIT_SHA wins, for copies of the tree without .git, e.g. a GPU box)."""
    if os.environ.get("OSCAR_GIT_SHA"):
        return os.environ["OSCAR_GIT_SHA"]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=Path(__file__).parent, timeout=10).stdout.strip()
        return (sha or "unknown") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class CellRecorder:
    """Collects the provenance of one cell and writes its rows (ok or error) atomically."""

    def __init__(self, results_dir, cell_key: dict, cell_config: dict, environment=dict):
        self.results_dir, self.key = results_dir, cell_key
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
        return rows

    def write_error(self, message: str, status: str = "error") -> list[dict]:
        """One row saying why the cell has no results: status `error` (it failed) or `oom` (refused by its memory
        plan); either is retried by the next sweep."""
        rows = [{**self.key, "metric": "error", "value": float("nan"), "status": status, "error": message,
                 **self._provenance()}]
        atomic_write_jsonl(rows_path(self.results_dir, self.key["task"], self.cell), rows)
        return rows


class ResultsStore:
    """One results directory: hands out a cell's recorder, says whether a cell is done, reads its rows."""

    def __init__(self, results_dir):
        self.results_dir = Path(results_dir)

    def recorder(self, cell_key: dict, cell_config: dict, environment=dict) -> CellRecorder:
        return CellRecorder(self.results_dir, cell_key, cell_config, environment)

    def is_done(self, recorder: CellRecorder) -> bool:
        return cell_is_done(self.results_dir, recorder.key["task"], recorder.cell)

    def rows(self, recorder: CellRecorder) -> list[dict]:
        return read_jsonl(rows_path(self.results_dir, recorder.key["task"], recorder.cell))


def load_rows(results_dir) -> "pandas.DataFrame":
    """Every row under results_dir/rows as one DataFrame (empty with the row columns if there is none)."""
    import pandas as pd
    rows = [r for p in sorted(Path(results_dir, "rows").glob("*/*.jsonl")) for r in read_jsonl(p)]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(ROW_KEYS) + ["status"])
