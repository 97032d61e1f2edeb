"""LiveCodeBench v6, code generation (livecodebench/code_generation_lite, release_v6), pass@1.

Data: the release_v6 JSONL files of the hub data set (`hf_files`, read with `datasets`' json loader:
the official loading script is refused by datasets>=4), or `data_path`, a local JSONL of the same
records {"question_id", "question_title", "question_content", "platform", "contest_date", "starter_code",
"difficulty", "public_test_cases", "private_test_cases", "metadata"}. Only problems whose contest_date
lies in `date_window` [start, end] (inclusive, as the official runner's start/end dates) are kept: the
paper does not state its window (METHOD_OSCAR.md, BASELINES_AND_TASKS.md), so the default
2025-02-01..2025-05-01 is our choice (the problems new in v6), a config option.
Prompt: the official runner's chat prompt (its generic system message + the question and the format
instruction: starter code for LeetCode problems, stdin/stdout otherwise); thinking on. Program: the last
```python block after `</think>`. Tests: public + private, stdin and functional, each in the sandbox with
`timeout_s` per test (6 s, the official default) and `memory_mb` (eval/lcb_tests.py).
Follows the official LiveCodeBench runner (lcb_runner at 28fef95, its OpenAIChat prompt style) for data,
prompt, tests and comparison; the execution is our sandbox. lm-eval has no LiveCodeBench task.
"""
from __future__ import annotations

import json
from datetime import datetime

from eval.codegen import code_block
from eval.data import load_rows
from eval.lcb_tests import decode_tests, passes_all
from eval.reasoning import ReasoningTask, budgeted_example, pass_metrics, render_turn
from eval.sandbox import Limits
from harness.task import Example

SYSTEM = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
          "generate a correct Python program that matches the specification and passes all tests.")
WITH_STARTER = ("You will use the following starter code to write the solution to the problem and enclose your code "
                "within delimiters.")
WITHOUT_STARTER = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test "
                   "on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python "
                   "program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.")
RELEASE_V6 = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl")
FIELDS = ("question_id", "question_content", "contest_date", "starter_code", "public_test_cases",
          "private_test_cases", "metadata")


def question_prompt(row: dict) -> str:
    """The official generic question prompt (question, format instruction, answer cue)."""
    fence = "```"
    if row.get("starter_code"):
        form = f"### Format: {WITH_STARTER}\n{fence}python\n{row['starter_code']}\n{fence}\n\n"
    else:
        form = f"### Format: {WITHOUT_STARTER}\n{fence}python\n# YOUR CODE HERE\n{fence}\n\n"
    return f"### Question:\n{row['question_content']}\n\n{form}### Answer: (use the provided format with backticks)\n\n"


def in_window(row: dict, date_window: list[str]) -> bool:
    """contest_date within [start, end] (ISO dates; inclusive, as the official start/end filter)."""
    start, end = (datetime.fromisoformat(day) for day in date_window)
    return start <= datetime.fromisoformat(row["contest_date"]) <= end


def load_problems(data_path, hf_dataset, hf_files, revision, date_window) -> list[dict]:
    """The problems of the window, in data order."""
    files = [f"hf://datasets/{hf_dataset}{'@' + revision if revision else ''}/{name}" for name in hf_files]
    rows = load_rows("LiveCodeBench", data_path, FIELDS, source=hf_dataset, path="json", data_files=files,
                     split="train")
    kept = [row for row in rows if in_window(row, date_window)]
    if not kept:
        raise ValueError(f"LiveCodeBench has no problem in date_window={list(date_window)} among {len(rows)} rows.")
    return kept


def build_examples(tokenizer, ctx: int, n: int, seed: int, chat: bool = False, data_path: str | None = None,
                   hf_dataset: str = "livecodebench/code_generation_lite", hf_files: list[str] = RELEASE_V6,
                   revision: str | None = None, date_window: list[str] = ("2025-02-01", "2025-05-01"),
                   max_new_tokens: int = 32768, enable_thinking: bool = True, timeout_s: float = 6.0,
                   memory_mb: int = 4096) -> list[Example]:
    """The first `n` problems of the window (all when n <= 0); answers = [the tests as JSON]."""
    examples = []
    for row in load_problems(data_path, hf_dataset, hf_files, revision, date_window):
        if 0 < n <= len(examples):
            break
        tests = decode_tests(row["public_test_cases"]) + decode_tests(row["private_test_cases"])
        prompt = render_turn(tokenizer, question_prompt(row), chat, enable_thinking, system=SYSTEM,
                             plain=f"{SYSTEM}\n\n{question_prompt(row)}")
        examples.append(budgeted_example(
            tokenizer, str(row["question_id"]), prompt, [json.dumps(tests)], ctx, max_new_tokens,
            thinking=bool(chat and enable_thinking), func_name=json.loads(row["metadata"] or "{}").get("func_name"),
            platform=row.get("platform"), difficulty=row.get("difficulty"), contest_date=row["contest_date"],
            tests=len(tests), timeout_s=timeout_s, memory_mb=memory_mb))
    return examples


def score(example: Example, output: str) -> float:
    """1.0 when the last python block passes every test of the problem."""
    code = code_block(output)
    if code is None:
        return 0.0
    limits = Limits(timeout_s=example.meta["timeout_s"], memory_mb=example.meta["memory_mb"])
    return float(passes_all(code, json.loads(example.answers[0]), example.meta["func_name"], limits))


def aggregate(records) -> dict[str, float]:
    """`livecodebench_pass1` (x100) and, in thinking mode, the % of outputs that never closed </think>."""
    return pass_metrics("livecodebench", records)


class LiveCodeBench(ReasoningTask):
    """LiveCodeBench v6 code generation, pass@1: configs/task/livecodebench.yaml's `_target_`."""

    build_examples, score, aggregate = staticmethod(build_examples), staticmethod(score), staticmethod(aggregate)
    HUB_DATASET, FIXTURE = "livecodebench/code_generation_lite", "tests/fixtures/livecodebench_tiny.jsonl"
