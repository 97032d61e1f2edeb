"""What the reasoning-model tasks share: one chat turn with thinking, the budget, the answer after </think>.

AIME25, MATH-500, GPQA-Diamond, HumanEval and LiveCodeBench all render one user turn (chat models:
the model's chat template, thinking on by default; other models: a plain completion prompt), give the
model `max_new_tokens` (32768, the paper's budget) or what ctx leaves after the prompt, score only the
text after the last `</think>`, and report pass@1 (x100) beside the share of outputs that never closed
their thought.
"""
from __future__ import annotations

from harness.checks import integer_option
from harness.task import Example, GenerationTask, check_task_data

THINK_END = "</think>"


def after_thinking(text: str) -> str:
    """The text after the last `</think>` (all of it when there is none)."""
    return text.rsplit(THINK_END, 1)[-1]


def render_turn(tokenizer, content: str, chat: bool, enable_thinking: bool, plain: str | None = None,
                system: str | None = None) -> str:
    """One user turn through the chat template (chat models), else `plain` (default: `content`)."""
    if not chat:
        return content if plain is None else plain
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=enable_thinking)


def budgeted_example(tokenizer, example_id: str, prompt: str, answers: list[str], ctx: int, max_new_tokens: int,
                     thinking: bool, **meta) -> Example:
    """An Example whose generation budget is `max_new_tokens`, cut to what ctx leaves after the prompt.

    The budget is recorded in meta (`max_new_tokens`) with the prompt length and whether the model thinks.
    """
    prompt_tokens = len(tokenizer(prompt)["input_ids"])
    budget = min(max_new_tokens, ctx - prompt_tokens)
    if budget <= 0:
        raise ValueError(f"ctx={ctx} is too small for example {example_id} ({prompt_tokens} prompt tokens).")
    return Example(id=example_id, prompt=prompt, answers=answers, max_new_tokens=budget,
                   meta=dict(meta, ctx=ctx, prompt_tokens=prompt_tokens, max_new_tokens=budget, thinking=thinking))


def pass_metrics(name: str, records) -> dict[str, float]:
    """`<name>_pass1` (mean score x100) and, in thinking mode, `<name>_unfinished_thinking` (% without </think>)."""
    metrics = {f"{name}_pass1": 100.0 * sum(r.score for r in records) / len(records)}
    thinking = [r for r in records if r.meta.get("thinking")]
    if thinking:
        unfinished = sum(THINK_END not in r.output for r in thinking)
        metrics[f"{name}_unfinished_thinking"] = 100.0 * unfinished / len(thinking)
    return metrics


class ReasoningTask(GenerationTask):
    """A task of the paper's table: `samples: 0` takes the whole data set, whose source (a local `data_path`,
    or the hub: `hf_dataset`, default `HUB_DATASET`) and generation budget are checked before weights load."""

    samples_zero_means_all = True
    HUB_DATASET = ""
    FIXTURE = ""                  # the offline example the refusal suggests

    def validate(self) -> None:
        super().validate()
        check_task_data(self.name, self.cfg.get("data_path"), self.cfg.get("hf_dataset", self.HUB_DATASET),
                        self.FIXTURE)
        integer_option(self.cfg.get("max_new_tokens", 32768), "task.max_new_tokens", minimum=1)
