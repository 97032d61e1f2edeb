"""Run untrusted Python (model-written code) in a separate, limited process; never in the harness process.

    outcome = run_python(source, stdin="1 2\\n", limits=Limits(timeout_s=6))
    outcome.status        # "ok" (exit 0) | "error" (exception, non-zero exit, refused action) | "timeout"
    outcome.stdout

Each run: a fresh temporary directory as cwd (removed afterwards) holding only main.py; a fresh
interpreter (`python -I -B`: no user site, no environment variables of Python's, cwd not on sys.path)
with a minimal environment (PATH, LANG, HOME=TMPDIR=cwd, one thread for BLAS); its own process group,
killed whole at the wall-clock limit; resource limits set in the child (CPU seconds = the time limit
rounded up + 1, address space, largest file written, no core); stdin / stdout / stderr are files in a
second temporary directory (so output size is bounded by the file limit and the program cannot forge
them); the guard of eval/sandbox_child.py refuses writes outside the cwd, process creation and the like.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")
_ENV_KEEP = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0",
             "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Limits:
    """What one run may use."""

    timeout_s: float = 10.0        # wall clock
    memory_mb: int = 4096          # address space
    output_mb: int = 16            # largest file written, stdout and stderr included


@dataclass(frozen=True)
class Outcome:
    """How one run ended."""

    status: str                    # ok | error | timeout
    returncode: int | None
    stdout: str
    stderr: str


def run_python(source: str, stdin: str = "", limits: Limits = Limits(), as_main: bool = True) -> Outcome:
    """Run `source` as main.py (`__name__` is "__main__" unless `as_main` is false) with `stdin`."""
    with tempfile.TemporaryDirectory(prefix="oscar-run-") as work, \
            tempfile.TemporaryDirectory(prefix="oscar-io-") as streams_dir:
        Path(work, "main.py").write_text(source, encoding="utf-8")
        streams = Path(streams_dir)
        (streams / "stdin").write_text(stdin, encoding="utf-8")
        config = {"cpu_s": math.ceil(limits.timeout_s) + 1, "memory_bytes": limits.memory_mb * 2**20,
                  "file_bytes": limits.output_mb * 2**20, "as_main": as_main}
        with open(streams / "stdin", "rb") as inp, open(streams / "stdout", "wb") as out, \
                open(streams / "stderr", "wb") as err:
            process = subprocess.Popen([sys.executable, "-I", "-B", str(CHILD), json.dumps(config)], stdin=inp,
                                       stdout=out, stderr=err, cwd=work, env=dict(_ENV_KEEP, HOME=work, TMPDIR=work),
                                       start_new_session=True)
            timed_out = _wait(process, limits.timeout_s)
        stdout, stderr = (_read(streams / name, limits.output_mb) for name in ("stdout", "stderr"))
        return Outcome(_status(process.returncode, timed_out), process.returncode, stdout, stderr)


def _read(path: Path, limit_mb: int) -> str:
    """At most `limit_mb` MiB of a captured stream, as text."""
    return path.read_bytes()[:limit_mb * 2**20].decode("utf-8", "replace")


def _wait(process: subprocess.Popen, timeout_s: float) -> bool:
    """Wait up to `timeout_s`; kill the whole process group in any case. True if the time ran out."""
    try:
        process.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:                     # the group is gone already
        pass
    process.wait()
    return timed_out


def _status(returncode: int, timed_out: bool) -> str:
    if timed_out or returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    return "ok" if returncode == 0 else "error"
