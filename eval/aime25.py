"""AIME 2025 (30 integer-answer problems), reasoning-model protocol (docs/BASELINES_AND_TASKS.md §3.2).

Data: `datasets.load_dataset("math-ai/aime25", split="test")` when the hub is reachable, or
`data_path`, a local JSONL with {"problem", "answer", "id"}. Prompt: the problem followed by Qwen3's
instruction to put the final answer in \\boxed{}; chat mode renders one user turn (thinking on by
default). Score: the last \\boxed{...} after the last `</think>` (the whole text if there is none),
normalised to an integer, equal to the reference. Sampling (T=0.6, top-p 0.95, top-k 20) and the k
seeds live in the task config and the runner; pass@1 here is the mean over one seed's examples.
Our own module, written to the protocol of docs/BASELINES_AND_TASKS.md §3.2.
"""
from __future__ import annotations

import re

from eval.boxed import INSTRUCTION, boxed_prompt, last_boxed
from eval.data import load_rows
from eval.reasoning import ReasoningTask, budgeted_example, pass_metrics
from harness.task import Example

_TEXT_WRAPPER = re.compile(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}")
_INTEGER = re.compile(r"-?\d+")
__all__ = ["INSTRUCTION", "Aime25", "build_examples", "extract_answer", "score", "aggregate"]


# ----------------------------------------------------------------------------- data
def load_problems(data_path: str | None, hf_dataset: str, split: str, revision: str | None) -> list[dict]:
    """Rows {"problem", "answer", "id"} from a local JSONL, else from the HF hub."""
    rows = load_rows("AIME", data_path, ("problem", "answer", "id"), path=hf_dataset, split=split, revision=revision)
    return [{"problem": row["problem"], "answer": row["answer"], "id": str(row.get("id", index))}
            for index, row in enumerate(rows)]


def build_examples(tokenizer, ctx: int, n: int, seed: int, chat: bool = False, data_path: str | None = None,
                   hf_dataset: str = "math-ai/aime25", split: str = "test", revision: str | None = None,
                   max_new_tokens: int = 32768, enable_thinking: bool = True) -> list[Example]:
    """The first `n` problems (all when n <= 0); `seed` only varies the sampling, done by the runner.

    The generation budget is cut to ctx - prompt tokens when the prompt would not leave
    `max_new_tokens` (recorded in meta as `max_new_tokens`).
    """
    problems = load_problems(data_path, hf_dataset, split, revision)
    examples = []
    for row in problems[:n] if n > 0 else problems:
        answer = normalize_integer(str(row["answer"]))
        if answer is None:
            raise ValueError(f"AIME problem {row['id']} has a non-integer answer {row['answer']!r}.")
        prompt = boxed_prompt(tokenizer, row["problem"], chat, enable_thinking)
        examples.append(budgeted_example(tokenizer, row["id"], prompt, [str(answer)], ctx, max_new_tokens,
                                         thinking=bool(chat and enable_thinking)))
    return examples


# ----------------------------------------------------------------------------- answer extraction
def normalize_integer(answer: str) -> int | None:
    """'$033$', '1,000', '\\text{ 42 }.', '90^\\circ', '{5}' -> int; None when not an integer."""
    text = _TEXT_WRAPPER.sub(r"\1", answer)
    for noise in ("$", ",", "\\,", "\\!", "\\ ", "^\\circ", "^{\\circ}", " ", "{", "}"):
        text = text.replace(noise, "")
    text = text.strip().rstrip(".")
    return int(text) if _INTEGER.fullmatch(text) else None


def extract_answer(text: str) -> int | None:
    """Integer in the last complete \\boxed{} after the last `</think>` (whole text without one)."""
    box = last_boxed(text)
    return normalize_integer(box) if box is not None else None


def score(example: Example, output: str) -> float:
    return float(extract_answer(output) == int(example.answers[0]))


def aggregate(records) -> dict[str, float]:
    """`aime25_pass1` (x100) and, in thinking mode, the % of outputs that never closed </think>."""
    return pass_metrics("aime25", records)


class Aime25(ReasoningTask):
    """AIME 2025, pass@1: configs/task/aime25.yaml's `_target_`."""

    build_examples, score, aggregate = staticmethod(build_examples), staticmethod(score), staticmethod(aggregate)
    HUB_DATASET, FIXTURE = "math-ai/aime25", "tests/fixtures/aime_tiny.jsonl"
