"""AIME 2025 (30 integer-answer problems), reasoning-model protocol (docs/BASELINES_AND_TASKS.md §3.2).

Data: `datasets.load_dataset("math-ai/aime25", split="test")` when the hub is reachable, or
`data_path`, a local JSONL with {"problem", "answer", "id"}. Prompt: the problem followed by Qwen3's
instruction to put the final answer in \\boxed{}; chat mode renders one user turn (thinking on by
default). Score: the last \\boxed{...} after the last `</think>` (the whole text if there is none),
normalised to an integer, equal to the reference. Sampling (T=0.6, top-p 0.95, top-k 20) and the k
seeds live in the task config and the runner; pass@1 here is the mean over one seed's examples.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from harness.checks import integer_option
from harness.task import Example, GenerationTask, check_task_data

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
THINK_END = "</think>"
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\{")
_TEXT_WRAPPER = re.compile(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}")
_INTEGER = re.compile(r"-?\d+")


# ----------------------------------------------------------------------------- data
def load_problems(data_path: str | None, hf_dataset: str, split: str, revision: str | None) -> list[dict]:
    """Rows {"problem", "answer", "id"} from a local JSONL, else from the HF hub."""
    if data_path:
        path = Path(data_path).expanduser()
        if not path.is_file():
            raise ValueError(f"AIME data_path '{path}' is not a file.")
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        rows = _load_hub(hf_dataset, split, revision)
    return [{"problem": row["problem"], "answer": row["answer"], "id": str(row.get("id", index))}
            for index, row in enumerate(rows)]


def _load_hub(hf_dataset: str, split: str, revision: str | None) -> list[dict]:
    import datasets
    try:
        return list(datasets.load_dataset(hf_dataset, split=split, revision=revision))
    except Exception as err:       # offline, unknown repo, ...: one actionable sentence instead of a stack
        raise ValueError(f"AIME data '{hf_dataset}' could not be loaded ({type(err).__name__}); "
                         f"set data_path to a local JSONL of {{problem, answer, id}}.") from err


def render_prompt(tokenizer, problem: str, chat: bool, enable_thinking: bool) -> str:
    """One user turn (chat) or a Question/Answer completion prompt."""
    if not chat:
        return f"Question: {problem}\n{INSTRUCTION}\nAnswer:"
    return tokenizer.apply_chat_template([{"role": "user", "content": f"{problem}\n{INSTRUCTION}"}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=enable_thinking)


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
        prompt = render_prompt(tokenizer, row["problem"], chat, enable_thinking)
        prompt_tokens = len(tokenizer(prompt)["input_ids"])
        budget = min(max_new_tokens, ctx - prompt_tokens)
        if budget <= 0:
            raise ValueError(f"ctx={ctx} is too small for AIME problem {row['id']} ({prompt_tokens} prompt tokens).")
        examples.append(Example(id=row["id"], prompt=prompt, answers=[str(answer)], max_new_tokens=budget,
                                meta=dict(ctx=ctx, prompt_tokens=prompt_tokens, max_new_tokens=budget,
                                          thinking=bool(chat and enable_thinking))))
    return examples


# ----------------------------------------------------------------------------- answer extraction
def _box_contents(text: str) -> list[str]:
    """Contents of every complete \\boxed{...} / \\fbox{...}, in order, with nested braces matched."""
    found = []
    for match in _BOX_OPEN.finditer(text):
        depth, start = 1, match.end()
        for pos in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[pos], 0)
            if depth == 0:
                found.append(text[start:pos])
                break
    return found


def normalize_integer(answer: str) -> int | None:
    """'$033$', '1,000', '\\text{ 42 }.', '90^\\circ', '{5}' -> int; None when not an integer."""
    text = _TEXT_WRAPPER.sub(r"\1", answer)
    for noise in ("$", ",", "\\,", "\\!", "\\ ", "^\\circ", "^{\\circ}", " ", "{", "}"):
        text = text.replace(noise, "")
    text = text.strip().rstrip(".")
    return int(text) if _INTEGER.fullmatch(text) else None


def extract_answer(text: str) -> int | None:
    """Integer in the last complete \\boxed{} after the last `</think>` (whole text without one)."""
    final = text.rsplit(THINK_END, 1)[-1]
    boxes = _box_contents(final)
    return normalize_integer(boxes[-1]) if boxes else None


def score(example: Example, output: str) -> float:
    return float(extract_answer(output) == int(example.answers[0]))


def aggregate(records) -> dict[str, float]:
    """`aime25_pass1` (x100) and, in thinking mode, the % of outputs that never closed </think>."""
    metrics = {"aime25_pass1": 100.0 * sum(r.score for r in records) / len(records)}
    thinking = [r for r in records if r.meta.get("thinking")]
    if thinking:
        metrics["aime25_unfinished_thinking"] = 100.0 * sum(THINK_END not in r.output for r in thinking) / len(thinking)
    return metrics


class Aime25(GenerationTask):
    """AIME 2025, pass@1: configs/task/aime25.yaml's `_target_`."""

    build_examples, score, aggregate = staticmethod(build_examples), staticmethod(score), staticmethod(aggregate)
    samples_zero_means_all = True

    def validate(self) -> None:
        """The data is reachable (a local data_path, or the hub), and the generation budget is positive."""
        super().validate()
        check_task_data(self.name, self.cfg.get("data_path"), self.cfg.get("hf_dataset", "math-ai/aime25"),
                        "tests/fixtures/aime_tiny.jsonl")
        integer_option(self.cfg.get("max_new_tokens", 32768), "task.max_new_tokens", minimum=1)
