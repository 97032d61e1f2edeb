"""Rows of a task's data set: a local JSONL (`task.data_path`) or the HF hub, failing in one sentence.

    rows = load_rows("MATH-500", data_path, ("problem", "answer"), path="HuggingFaceH4/MATH-500", split="test")
"""
from __future__ import annotations

import json
from pathlib import Path


def load_rows(task: str, data_path: str | None, fields: tuple[str, ...], source: str | None = None,
              **hub) -> list[dict]:
    """Every row of `data_path` (one JSON object a line), else of `datasets.load_dataset(**hub)`.

    `source` names the hub data set in the error (default: `hub["path"]`).
    """
    if data_path:
        return read_jsonl(task, data_path)
    import datasets
    try:
        return list(datasets.load_dataset(**hub))
    except Exception as err:       # offline, gated, unknown repo, ...: one actionable sentence instead of a stack
        raise ValueError(f"{task} data '{source or hub.get('path')}' could not be loaded ({type(err).__name__}); "
                         f"set task.data_path=<a local JSONL of {{{', '.join(fields)}}}>.") from err


def read_jsonl(task: str, data_path: str) -> list[dict]:
    """The JSON objects of a local JSONL file, blank lines skipped."""
    path = Path(data_path).expanduser()
    if not path.is_file():
        raise ValueError(f"{task} task.data_path={path} is not a file.")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
