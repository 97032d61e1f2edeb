"""The direction of dependence (docs/architecture.md): import-linter's contracts in pyproject.toml hold."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lint_imports(*args, cwd=ROOT):
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    return subprocess.run([exe, "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_no_package_imports_upward():
    proc = lint_imports()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The contracts can fail: a copy of the tree where the core imports a task is rejected."""
    for name in ("kernels", "harness", "oscar", "baselines", "eval", "report"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "harness" / "cache.py", "a") as fh:
        fh.write("\nimport eval.fidelity  # upward\n")
    proc = lint_imports(cwd=tmp_path)
    assert proc.returncode != 0 and "harness.cache -> eval.fidelity" in proc.stdout, proc.stdout[-3000:]
