r"""MATH-500 (500 problems of the MATH test set, OpenAI's "Let's Verify Step by Step" split), pass@1.

Data: `datasets.load_dataset("HuggingFaceH4/MATH-500", split="test")`, or `data_path`, a local JSONL
with {"problem", "answer", "unique_id", "subject", "level"}. Prompt: the problem followed by Qwen3's
instruction to box the final answer (eval/boxed.py, the same as AIME25); chat mode renders one user
turn, thinking on by default. Score: the last \boxed{...} after the last `</think>`, equivalent to the
reference by eval/math_equiv.py (our own checker: normalised strings, tuples, then sympy numeric
equality; `math_verify` is not installed here). Bootstrap intervals resample within each subject.
Our own module: the paper's protocol is Qwen3's boxed instruction in a thinking turn over the 500-problem
split, which lm-eval's MATH tasks (hendrycks_math, minerva_math: few-shot prompts) do not follow.
"""
from __future__ import annotations

from eval.boxed import boxed_prompt, last_boxed
from eval.data import load_rows
from eval.math_equiv import is_equivalent
from eval.reasoning import ReasoningTask, budgeted_example, pass_metrics
from harness.task import Example

FIELDS = ("problem", "answer", "unique_id", "subject", "level")


def build_examples(tokenizer, ctx: int, n: int, seed: int, chat: bool = False, data_path: str | None = None,
                   hf_dataset: str = "HuggingFaceH4/MATH-500", split: str = "test", revision: str | None = None,
                   max_new_tokens: int = 32768, enable_thinking: bool = True) -> list[Example]:
    """The first `n` problems (all when n <= 0); `seed` only varies the sampling, done by the runner."""
    rows = load_rows("MATH-500", data_path, FIELDS, path=hf_dataset, split=split, revision=revision)
    return [budgeted_example(tokenizer, str(row.get("unique_id", index)),
                             boxed_prompt(tokenizer, row["problem"], chat, enable_thinking), [str(row["answer"])],
                             ctx, max_new_tokens, thinking=bool(chat and enable_thinking),
                             subject=str(row.get("subject", "")), level=row.get("level"))
            for index, row in enumerate(rows[:n] if n > 0 else rows)]


def score(example: Example, output: str) -> float:
    return float(is_equivalent(last_boxed(output), example.answers[0]))


def aggregate(records) -> dict[str, float]:
    """`math500_pass1` (x100) and, in thinking mode, the % of outputs that never closed </think>."""
    return pass_metrics("math500", records)


class Math500(ReasoningTask):
    """MATH-500, pass@1: configs/task/math500.yaml's `_target_`; intervals resample within subjects."""

    build_examples, score, aggregate = staticmethod(build_examples), staticmethod(score), staticmethod(aggregate)
    HUB_DATASET, FIXTURE = "HuggingFaceH4/MATH-500", "tests/fixtures/math500_tiny.jsonl"

    def stratum(self, record) -> str:
        return str(record.meta.get("subject", ""))
