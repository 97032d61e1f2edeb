"""HumanEval (164 Python functions with unit tests), pass@1 by sandboxed execution.

Data: `datasets.load_dataset("openai/openai_humaneval", split="test")`, or `data_path`, a local JSONL
with {"task_id", "prompt", "canonical_solution", "test", "entry_point"}.
Prompt: simple-evals' HumanEval instruction followed by the function's signature and docstring, one
user turn (thinking on). Program: the last ```python block after `</think>` (the whole answer after it
when there is none, as simple-evals); a block that defines the entry point is appended to the prompt
(so the prompt's imports and helpers stay), a bare body is appended as the function's body; then the
data set's `check` function runs on the entry point, as human-eval's check_correctness does. Pass when
the program exits 0 after `check` returned (a marker printed after it, so an early `exit()` fails).
Execution: eval/sandbox.py, `timeout_s` per problem (10 s; human-eval uses 3 s on an idle machine:
ours shares its CPU with the GPU run), `memory_mb` address space.
Our own module for prompting and extraction (simple-evals' prompt; its extraction strips the first
`:\\n    ` of the block, which breaks on helper functions and imports), human-eval's test protocol;
lm-eval's humaneval tasks use other prompts.
"""
from __future__ import annotations

import re
import secrets

from eval.codegen import code_block
from eval.data import load_rows
from eval.reasoning import ReasoningTask, after_thinking, budgeted_example, pass_metrics, render_turn
from eval.sandbox import Limits, run_python
from harness.task import Example

INSTRUCTION = ("Read the following function signature and docstring, and fully implement the function described. "
               "Your response should only contain the code for this function.\n")
FIELDS = ("task_id", "prompt", "test", "entry_point")


def build_examples(tokenizer, ctx: int, n: int, seed: int, chat: bool = False, data_path: str | None = None,
                   hf_dataset: str = "openai/openai_humaneval", split: str = "test", revision: str | None = None,
                   max_new_tokens: int = 32768, enable_thinking: bool = True, timeout_s: float = 10.0,
                   memory_mb: int = 4096) -> list[Example]:
    """The first `n` problems (all when n <= 0); answers = [the test code]; `seed` only varies the sampling."""
    rows = load_rows("HumanEval", data_path, FIELDS, path=hf_dataset, split=split, revision=revision)
    return [budgeted_example(tokenizer, row["task_id"], render_turn(tokenizer, INSTRUCTION + row["prompt"], chat,
                                                                    enable_thinking),
                             [row["test"]], ctx, max_new_tokens, thinking=bool(chat and enable_thinking),
                             code_prompt=row["prompt"], entry_point=row["entry_point"], timeout_s=timeout_s,
                             memory_mb=memory_mb)
            for row in (rows[:n] if n > 0 else rows)]


def completion_code(output: str) -> str:
    """The program text the model answered with (its last python block, else all of its answer)."""
    block = code_block(output)
    return block if block is not None else after_thinking(output)


def program(code_prompt: str, code: str, test: str, entry_point: str, marker: str) -> str:
    """prompt + the model's code (a whole function or its body) + the tests + `check(entry_point)` + marker."""
    defines = re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE)
    body = f"{code_prompt}\n{code}" if defines else code_prompt + code
    return f"{body}\n\n{test}\n\ncheck({entry_point})\nprint({marker!r})\n"


def score(example: Example, output: str) -> float:
    """1.0 when the model's function passes the problem's tests in the sandbox."""
    meta, marker = example.meta, f"humaneval-passed-{secrets.token_hex(8)}"
    source = program(meta["code_prompt"], completion_code(output), example.answers[0], meta["entry_point"], marker)
    outcome = run_python(source, limits=Limits(timeout_s=meta["timeout_s"], memory_mb=meta["memory_mb"]),
                         as_main=False)
    return float(outcome.status == "ok" and marker in outcome.stdout.splitlines())


def aggregate(records) -> dict[str, float]:
    """`humaneval_pass1` (x100) and, in thinking mode, the % of outputs that never closed </think>."""
    return pass_metrics("humaneval", records)


class HumanEval(ReasoningTask):
    """HumanEval, pass@1: configs/task/humaneval.yaml's `_target_`."""

    build_examples, score, aggregate = staticmethod(build_examples), staticmethod(score), staticmethod(aggregate)
    HUB_DATASET, FIXTURE = "openai/openai_humaneval", "tests/fixtures/humaneval_tiny.jsonl"
