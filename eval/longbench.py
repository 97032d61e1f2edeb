"""LongBench / LongBench-E single- and multi-document QA, scored by qa_f1 (docs/BASELINES_AND_TASKS.md §3.3).

Subsets: narrativeqa, qasper, multifieldqa_en, hotpotqa, 2wikimqa, musique (LongBench-E has no
narrativeqa or musique). Records carry LongBench's fields (input, context, answers, length, _id). The
prompt is LongBench's per-dataset template; when it does not fit, its tokens are cut in the middle so
that prompt + the dataset's max-new-tokens stays within ctx. By default no chat template is applied
(the protocol behind OSCAR's LongBench-E numbers); `use_chat_template: true` wraps it in one user turn
when the model is a chat model.

Data, first match wins:
  * `data_path` = a JSONL file (records may carry `dataset`, e.g. "hotpotqa_e", to mix subsets), or a
    folder with LongBench's `<name>.jsonl` / `<name>_e.jsonl` files (the official data.zip layout);
  * otherwise `datasets.load_dataset(hf_dataset, "<name>[_e]", split="test")`. THUDM/LongBench is a
    loading-script dataset that datasets>=4 refuses, so the default is its parquet mirror
    Xnhyacinth/LongBench (the one lm-eval uses; field `question` is read as `input`).
"""
from __future__ import annotations

import json
import random
import re
import string
from collections import Counter, defaultdict
from pathlib import Path

from harness.checks import integer_option, list_option
from harness.task import Example, GenerationTask, check_task_data

_MULTI_DOC = ("Answer the question based on the given passages. Only give me the answer and do not output any "
              "other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the "
              "given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\n"
              "Answer:")
PROMPTS = {       # LongBench dataset2prompt, verbatim (the "asconcisely" typo is LongBench's own)
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\n"
        "Story: {context}\n\nNow, answer the question based on the story asconcisely as you can, using a single "
        "phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"),
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely as you can, using a "
        "single phrase or sentence if possible. If the question cannot be answered based on the information in the "
        "article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or "
        "\"unanswerable\". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on "
        "the above article as concisely as you can, using a single phrase or sentence if possible. If the question "
        "cannot be answered based on the information in the article, write \"unanswerable\". If the question is a "
        "yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\n"
        "Question: {input}\n\nAnswer:"),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on "
        "the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"),
    "hotpotqa": _MULTI_DOC,
    "2wikimqa": _MULTI_DOC,
    "musique": _MULTI_DOC,
}
MAX_NEW_TOKENS = {"narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "hotpotqa": 32, "2wikimqa": 32,
                  "musique": 32}       # LongBench dataset2maxlen
E_SUBSETS = ("qasper", "multifieldqa_en", "hotpotqa", "2wikimqa")
_PUNCTUATION = frozenset(string.punctuation)
LENGTH_BUCKETS = ((4000, "0-4k"), (8000, "4-8k"), (float("inf"), "8k+"))


# ----------------------------------------------------------------------------- data
def _normalized_record(row: dict, index: int) -> dict:
    """LongBench fields, accepting the parquet mirror's `question` for `input`."""
    return {"input": row.get("input", row.get("question", "")), "context": row["context"],
            "answers": list(row["answers"]), "length": int(row.get("length") or 0),
            "_id": str(row.get("_id") or index)}


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _local_records(data_path: str, config_name: str) -> list[dict]:
    """Records of one LongBench config from a JSONL file (filtered by `dataset`) or a data folder."""
    path = Path(data_path).expanduser()
    if path.is_dir():
        file = path / f"{config_name}.jsonl"
        if not file.is_file():
            raise ValueError(f"LongBench data folder '{path}' has no {config_name}.jsonl.")
        return _read_jsonl(file)
    if not path.is_file():
        raise ValueError(f"LongBench data_path '{path}' is neither a JSONL file nor a folder.")
    rows = _read_jsonl(path)
    return [row for row in rows if row.get("dataset", config_name) == config_name]


def _hub_records(hf_dataset: str, config_name: str, revision: str | None) -> list[dict]:
    import datasets
    try:
        return list(datasets.load_dataset(hf_dataset, config_name, split="test", revision=revision))
    except Exception as err:       # offline, script dataset, unknown config: one actionable sentence
        raise ValueError(f"LongBench '{hf_dataset}/{config_name}' could not be loaded ({type(err).__name__}); "
                         "set data_path to a local JSONL file or LongBench data folder.") from err


def load_records(subset: str, longbench_e: bool, data_path: str | None, hf_dataset: str,
                 revision: str | None) -> list[dict]:
    config_name = f"{subset}_e" if longbench_e else subset
    rows = _local_records(data_path, config_name) if data_path else _hub_records(hf_dataset, config_name, revision)
    return [_normalized_record(row, index) for index, row in enumerate(rows)]


# ----------------------------------------------------------------------------- prompts
def _wrap(tokenizer, text: str, chat: bool) -> str:
    if not chat:
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)


def _count_tokens(tokenizer, prompt: str) -> int:
    """Prompt length as the runner records it (special tokens included; an upper bound of what is fed)."""
    return len(tokenizer(prompt)["input_ids"])


def middle_truncate(tokenizer, text: str, max_tokens: int) -> str:
    """Keep the first and last max_tokens/2 tokens of `text` (LongBench's truncation)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return text
    head = max_tokens // 2
    return tokenizer.decode(ids[:head]) + tokenizer.decode(ids[len(ids) - (max_tokens - head):])


def fit_prompt(tokenizer, text: str, chat: bool, budget: int) -> tuple[str, int, bool]:
    """Chat-wrapped (or plain) prompt of at most `budget` tokens: (prompt, tokens, truncated).

    Decoding and re-encoding around the cut can shift the count by a token or two, so the cut is
    tightened by the overshoot until the final prompt fits.
    """
    prompt = _wrap(tokenizer, text, chat)
    tokens = _count_tokens(tokenizer, prompt)
    text_budget = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    truncated = False
    while tokens > budget:
        text_budget -= tokens - budget
        if text_budget <= 0:
            raise ValueError(f"ctx leaves {budget} prompt tokens, too few for a LongBench prompt.")
        prompt = _wrap(tokenizer, middle_truncate(tokenizer, text, text_budget), chat)
        tokens, truncated = _count_tokens(tokenizer, prompt), True
    return prompt, tokens, truncated


def length_bucket(length: int) -> str:
    return next(name for limit, name in LENGTH_BUCKETS if length < limit)


# ----------------------------------------------------------------------------- task interface
def _check_subsets(subsets: list[str], longbench_e: bool) -> None:
    allowed = E_SUBSETS if longbench_e else tuple(PROMPTS)
    unknown = [name for name in subsets if name not in allowed]
    if unknown:
        raise ValueError(f"Unknown LongBench{'-E' if longbench_e else ''} subset(s) {unknown}; known: {list(allowed)}.")


def _pick(records: list[dict], n: int, rng: random.Random) -> list[dict]:
    """All records when n <= 0 or n >= len; else n of them chosen by `rng`, in file order."""
    if n <= 0 or n >= len(records):
        return records
    return [records[i] for i in sorted(rng.sample(range(len(records)), n))]


def build_examples(tokenizer, ctx: int, n: int, seed: int, chat: bool = False, subsets: list[str] | None = None,
                   longbench_e: bool = False, use_chat_template: bool = False, data_path: str | None = None,
                   hf_dataset: str = "Xnhyacinth/LongBench", revision: str | None = None,
                   max_new_tokens: int | None = None) -> list[Example]:
    """`n` records per subset (all when n <= 0), prompts middle-truncated to ctx - max_new_tokens.

    max_new_tokens: None = LongBench's budget per dataset; a number caps it (short debug runs)."""
    names = list(subsets) if subsets else list(E_SUBSETS if longbench_e else PROMPTS)
    _check_subsets(names, longbench_e)
    use_chat = chat and use_chat_template
    examples = []
    for name in names:
        dataset = f"{name}_e" if longbench_e else name
        rng = random.Random(f"{seed}/{dataset}")
        budget = MAX_NEW_TOKENS[name] if max_new_tokens is None else min(MAX_NEW_TOKENS[name], int(max_new_tokens))
        for record in _pick(load_records(name, longbench_e, data_path, hf_dataset, revision), n, rng):
            text = PROMPTS[name].format(context=record["context"], input=record["input"])
            prompt, tokens, truncated = fit_prompt(tokenizer, text, use_chat, ctx - budget)
            meta = dict(dataset=dataset, ctx=ctx, length=record["length"], bucket=length_bucket(record["length"]),
                        truncated=truncated, prompt_tokens=tokens, source_id=record["_id"])
            examples.append(Example(id=f"{dataset}-{record['_id']}", prompt=prompt, answers=record["answers"],
                                    max_new_tokens=budget, meta=meta))
    return examples


def normalize_answer(text: str) -> str:
    """LongBench/SQuAD normalisation: lower-case, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def token_f1(prediction: str, reference: str) -> float:
    """Token-multiset F1 between the normalised strings (0 without overlap)."""
    pred_tokens, ref_tokens = normalize_answer(prediction).split(), normalize_answer(reference).split()
    overlap = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, references: list[str]) -> float:
    """Best token F1 over the reference answers."""
    return max((token_f1(prediction, ref) for ref in references), default=0.0)


def score(example: Example, output: str) -> float:
    return qa_f1(output.strip(), example.answers)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def aggregate(records) -> dict[str, float]:
    """x100 qa_f1 per dataset and per `<dataset>/<bucket>`, plus three summaries.

    `longbench`: mean over datasets; `longbench_bucket_mean`: mean over datasets of the mean over
    that dataset's length buckets (LongBench-E style); `longbench_sample_mean`: mean over all samples.
    """
    by_dataset: dict[str, list[float]] = defaultdict(list)
    by_bucket: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        by_dataset[record.meta["dataset"]].append(record.score)
        by_bucket[record.meta["dataset"]][record.meta["bucket"]].append(record.score)
    metrics = {}
    for dataset, scores in by_dataset.items():
        metrics[dataset] = 100.0 * _mean(scores)
        for bucket, bucket_scores in by_bucket[dataset].items():
            metrics[f"{dataset}/{bucket}"] = 100.0 * _mean(bucket_scores)
    if by_dataset:
        metrics["longbench"] = _mean(metrics[d] for d in by_dataset)
        metrics["longbench_bucket_mean"] = _mean(_mean(metrics[f"{d}/{b}"] for b in by_bucket[d]) for d in by_dataset)
        metrics["longbench_sample_mean"] = 100.0 * _mean(r.score for r in records)
    return metrics


class LongBench(GenerationTask):
    """LongBench / LongBench-E QA subsets: configs/task/longbench.yaml's `_target_`."""

    build_examples, score, aggregate = staticmethod(build_examples), staticmethod(score), staticmethod(aggregate)
    samples_zero_means_all = True

    def validate(self) -> None:
        """Known subsets, and data that is reachable (a local data_path, or the hub)."""
        super().validate()
        subsets = list_option(self.cfg.get("subsets"), "task.subsets")
        if subsets:
            _check_subsets(subsets, bool(self.cfg.get("longbench_e", False)))
        check_task_data(self.name, self.cfg.get("data_path"), self.cfg.get("hf_dataset", "Xnhyacinth/LongBench"),
                        "tests/fixtures/longbench_tiny.jsonl")
        if self.cfg.get("max_new_tokens") is not None:
            integer_option(self.cfg.max_new_tokens, "task.max_new_tokens", minimum=1)

    def stratum(self, record) -> str:
        return f"{record.meta['dataset']}/{record.meta['bucket']}"   # summaries average datasets and buckets
