"""The GPU benchmark scripts' logic runs on CPU on tiny shapes (so they cannot rot)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_throughput_tiny_runs_and_reports(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--tiny", "--steps", "2", "--ctx", "600",
                           "--batch", "1", "--budget-gb", "0.005", "--quantizers", "bf16,naive_int2,oscar"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Same memory budget" in proc.stdout
    import json
    data = json.loads((tmp_path / "bench_throughput.json").read_text())
    per_token = {r["quantizer"]: r["kv_bytes_per_token"] for r in data["rows"]}
    assert per_token["bf16"] > 4 * per_token["naive_int2"]          # INT2 history is far smaller than fp32 rows
    assert all(r["max_batch_in_budget"] >= 0 for r in data["same_budget"])
