"""eval/sandbox.py: model-written code runs in a separate, limited process and cannot harm the harness."""
import os
import time

import pytest

from eval.sandbox import Limits, run_python

QUICK = Limits(timeout_s=2.0, memory_mb=1024)


def test_runs_a_program_with_stdin_in_a_fresh_temporary_directory(tmp_path):
    outcome = run_python("import os\nprint(input()[::-1]); print(os.getcwd()); print(__name__)", stdin="abc\n")
    assert outcome.status == "ok" and outcome.returncode == 0
    reversed_text, cwd, name = outcome.stdout.split()
    assert reversed_text == "cba" and name == "__main__"
    assert os.path.basename(cwd).startswith("oscar-run-") and not os.path.exists(cwd)      # removed afterwards
    assert run_python("print(__name__)", as_main=False).stdout.strip() == "solution"


def test_errors_and_syntax_errors_are_failures():
    crashed = run_python("raise ValueError('boom')")
    assert crashed.status == "error" and "ValueError: boom" in crashed.stderr
    assert run_python("def f(:\n  pass").status == "error"
    assert run_python("import sys; sys.exit(3)").status == "error"


@pytest.mark.parametrize("source", ["while True:\n    pass", "import time\ntime.sleep(60)"])
def test_a_program_that_does_not_end_is_killed_at_the_time_limit(source):
    started = time.monotonic()
    outcome = run_python(source, limits=Limits(timeout_s=1.0))
    assert outcome.status == "timeout"
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("write", [
    "open({target!r}, 'w').write('escaped')",
    "open({target!r}, 'a').write('escaped')",
    "import pathlib; pathlib.Path({target!r}).write_text('escaped')",
    "import os; os.close(os.open({target!r}, os.O_WRONLY | os.O_CREAT))",
    "import io; io.FileIO({target!r}, 'w')",
    "import shutil; open('local.txt', 'w').write('x'); shutil.copy('local.txt', {target!r})",
    "import os; open('local.txt', 'w').write('x'); os.rename('local.txt', {target!r})",
    "import os; os.symlink('/etc/hostname', {target!r})",
    "import os; os.system('touch ' + {target!r})",
    "import subprocess; subprocess.run(['touch', {target!r}])",
    "import os; os.chdir({folder!r}); open('escaped.txt', 'w').write('escaped')",
    "import ctypes; ctypes.CDLL(None).system(('touch ' + {target!r}).encode())",
])
def test_a_file_write_outside_the_temporary_directory_does_not_happen(tmp_path, write):
    target = tmp_path / "escaped.txt"
    outcome = run_python(write.format(target=str(target), folder=str(tmp_path)), limits=QUICK)
    assert outcome.status == "error" and "sandbox:" in outcome.stderr
    assert not target.exists() and not target.is_symlink()


def test_files_outside_cannot_be_removed_but_inside_work_normally(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    assert run_python(f"import os; os.remove({str(keep)!r})", limits=QUICK).status == "error"
    assert keep.read_text() == "mine"
    inside = run_python("import os\nos.mkdir('d'); open('d/x.txt', 'w').write('ok'); print(open('d/x.txt').read())\n"
                        f"print(open({str(keep)!r}).read())", limits=QUICK)                  # reading is allowed
    assert inside.status == "ok" and inside.stdout.split() == ["ok", "mine"]


def test_the_harness_process_survives_hostile_programs():
    for source in (f"import os; os.kill({os.getpid()}, 9)", f"import os; os.killpg({os.getpgid(0)}, 9)",
                   "import signal, os; os.kill(os.getppid(), signal.SIGTERM)"):
        assert run_python(source, limits=QUICK).status == "error"
    assert run_python("import resource; resource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6))",
                      limits=QUICK).status == "error"
    assert run_python("print('still here')").stdout == "still here\n"


def test_memory_output_and_environment_are_bounded(monkeypatch):
    assert "MemoryError" in run_python("x = bytearray(4 * 1024**3)", limits=Limits(memory_mb=512)).stderr
    flood = run_python("while True:\n    print('x' * 1000)", limits=Limits(timeout_s=5, output_mb=1))
    assert flood.status != "ok" and len(flood.stdout) <= 2**20
    monkeypatch.setenv("OSCAR_SECRET_TOKEN", "hunter2")
    env = run_python("import os; print(sorted(os.environ))").stdout
    assert "OSCAR_SECRET_TOKEN" not in env and "HOME" in env


def test_threads_and_recursion_limits_still_work():
    outcome = run_python("import sys, threading\nsys.setrecursionlimit(10**5)\nthreading.stack_size(2**26)\n"
                         "t = threading.Thread(target=lambda: print('thread ran')); t.start(); t.join()")
    assert outcome.status == "ok" and outcome.stdout == "thread ran\n"
