"""RULER needle-in-a-haystack: the eight NIAH variants, fitted to a context length, scored by string_match_all.

Follows NVIDIA/RULER `scripts/data/synthetic/niah.py` (see docs/BASELINES_AND_TASKS.md §3.1):
needles `One of the special magic {values} for {key} is: {value}.` hidden in a noise, essay or needle
haystack; the prompt asks for the values of the queried keys and ends with an answer prefix the model
continues (after the assistant header in chat mode). The haystack size is the largest that keeps
prompt tokens + `max_new_tokens` within `ctx`, counted with the model's own tokenizer (chat template
included): binary search once per variant, then per sample decremented until it fits.

    examples = build_examples(tokenizer, ctx=8192, n=20, seed=0, chat=True, variants=["niah_single_2"])
"""
from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from eval import ruler_data
from harness.checks import integer_option, list_option
from harness.task import Example, GenerationTask

TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
            "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?")
ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
SINGULAR_REWRITES = (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer"))


@dataclass(frozen=True)
class NiahVariant:
    """One RULER NIAH task: haystack kind, key/value types and needle counts."""

    haystack: str            # noise | essay | needle
    key_type: str            # words | numbers | uuids
    value_type: str
    num_keys: int = 1
    num_values: int = 1      # values per key
    num_queries: int = 1     # keys asked about (num_keys is raised to at least this)


VARIANTS = {
    "niah_single_1": NiahVariant("noise", "words", "numbers"),
    "niah_single_2": NiahVariant("essay", "words", "numbers"),
    "niah_single_3": NiahVariant("essay", "words", "uuids"),
    "niah_multikey_1": NiahVariant("essay", "words", "numbers", num_keys=4),
    "niah_multikey_2": NiahVariant("needle", "words", "numbers"),
    "niah_multikey_3": NiahVariant("needle", "uuids", "uuids"),
    "niah_multivalue": NiahVariant("essay", "words", "numbers", num_values=4),
    "niah_multiquery": NiahVariant("essay", "words", "numbers", num_keys=4, num_queries=4),
}


@dataclass
class NiahSample:
    """One generated sample before chat templating."""

    task_input: str          # template with context and query filled in
    answer_prefix: str
    answers: list[str]       # values of the queried keys
    needles: list[dict]      # {"key", "value", "depth"} in document order; depth in percent
    keys: list[str]
    query_keys: list[str]


# ----------------------------------------------------------------------------- sample generation
def _fresh(make, rng: random.Random, taken) -> str:
    """One random string from `make` that is not in `taken`."""
    candidate = make(rng)
    while candidate in taken:
        candidate = make(rng)
    return candidate


def _distinct(make, rng: random.Random, count: int) -> list[str]:
    """`count` distinct random strings from `make`."""
    out: list[str] = []
    while len(out) < count:
        out.append(_fresh(make, rng, out))
    return out


def _place_needles(variant: NiahVariant, size: int, needles: list[str], keys: list[str],
                   rng: random.Random, words: tuple[str, ...] | None) -> tuple[str, list[float]]:
    """Build the haystack of `size` units with the needles inside; return (context, depth % per needle)."""
    type_v = variant.value_type
    if variant.haystack == "essay":
        corpus = words if words is not None else ruler_data.essay_words()
        sentences = ruler_data.split_sentences(ruler_data.essay_text(corpus, size))
        depths = sorted(rng.sample(ruler_data.DEPTHS, len(needles)))
        return ruler_data.insert_at_depths(sentences, needles, depths), [float(d) for d in depths]
    if variant.haystack == "noise":
        lines = [ruler_data.NOISE_SENTENCE] * size
    else:
        make_key, make_value = ruler_data.RANDOM_VALUE[variant.key_type], ruler_data.RANDOM_VALUE[type_v]
        real_keys = set(keys)       # a distractor never reuses a real key (RULER does not check)
        lines = [ruler_data.NEEDLE_TEMPLATE.format(type_needle_v=type_v, key=_fresh(make_key, rng, real_keys),
                                                   value=make_value(rng)) for _ in range(size)]
    indices = sorted(rng.sample(range(size), len(needles)))
    return ruler_data.insert_at_lines(lines, needles, indices), [100.0 * i / size for i in indices]


def _query_text(query_keys: list[str]) -> str:
    return query_keys[0] if len(query_keys) == 1 else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]


def make_sample(variant: NiahVariant, size: int, sample_seed: str, words: tuple[str, ...] | None = None) -> NiahSample:
    """Generate one sample with a haystack of `size` words (essay) or lines (noise/needle).

    The same `sample_seed` gives the same keys, values and query at every size, so a sample can be
    shrunk until it fits without changing what is asked.
    """
    rng = random.Random(sample_seed)
    num_keys = max(variant.num_keys, variant.num_queries)
    keys = _distinct(ruler_data.RANDOM_VALUE[variant.key_type], rng, num_keys)
    values = [[ruler_data.RANDOM_VALUE[variant.value_type](rng) for _ in range(variant.num_values)] for _ in keys]
    pairs = [(key, value) for key, key_values in zip(keys, values) for value in key_values]
    rng.shuffle(pairs)
    needle_texts = [ruler_data.NEEDLE_TEMPLATE.format(type_needle_v=variant.value_type, key=k, value=v)
                    for k, v in pairs]
    context, depths = _place_needles(variant, size, needle_texts, keys, rng, words)
    query_idx = rng.sample(range(num_keys), variant.num_queries)
    query_keys = [keys[i] for i in query_idx]
    template, prefix, type_v = TEMPLATE, ANSWER_PREFIX, variant.value_type
    if variant.num_queries * variant.num_values == 1:
        for plural, singular in SINGULAR_REWRITES:
            template, prefix = template.replace(plural, singular), prefix.replace(plural, singular)
        type_v = type_v[:-1]
    query = _query_text(query_keys)
    return NiahSample(
        task_input=template.format(type_needle_v=type_v, context=context, query=query),
        answer_prefix=prefix.format(type_needle_v=type_v, query=query),
        answers=[v for i in query_idx for v in values[i]],
        needles=[{"key": k, "value": v, "depth": d} for (k, v), d in zip(pairs, depths)],
        keys=keys, query_keys=query_keys)


# ----------------------------------------------------------------------------- prompts and length fitting
def render_prompt(tokenizer, sample: NiahSample, chat: bool) -> str:
    """Final prompt: task input (chat-templated as one user turn, thinking off) + answer prefix."""
    if not chat:
        return sample.task_input + sample.answer_prefix
    header = tokenizer.apply_chat_template([{"role": "user", "content": sample.task_input}], tokenize=False,
                                           add_generation_prompt=True, enable_thinking=False)
    return header + sample.answer_prefix


def count_tokens(tokenizer, prompt: str) -> int:
    """Prompt length as the runner records it (special tokens included; an upper bound of what is fed)."""
    return len(tokenizer(prompt)["input_ids"])


def size_step(variant: NiahVariant, ctx: int) -> int:
    """RULER's haystack increment: 500 essay words / 25 lines; 5 below a 4K context."""
    if ctx < 4096:
        return 5
    return 500 if variant.haystack == "essay" else 25


def _largest_fitting_size(fits, smallest: int, guess: int) -> int:
    """Largest size >= smallest with fits(size), by doubling from `guess` then binary search."""
    good, bad = smallest, max(guess, smallest + 1)
    while fits(bad):
        good, bad = bad, bad * 2
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


class _Fitter:
    """Builds prompts of one variant and checks them against ctx - max_new_tokens."""

    def __init__(self, tokenizer, variant: NiahVariant, ctx: int, max_new_tokens: int, chat: bool,
                 words: tuple[str, ...]):
        self.tokenizer, self.variant, self.chat, self.words = tokenizer, variant, chat, words
        self.budget = ctx - max_new_tokens
        self.step = size_step(variant, ctx)
        num_needles = max(variant.num_keys, variant.num_queries) * variant.num_values
        self.smallest = 1 if variant.haystack == "essay" else num_needles     # line haystacks need a slot each

    def build(self, size: int, sample_seed: str) -> tuple[NiahSample, str, int]:
        sample = make_sample(self.variant, size, sample_seed, self.words)
        prompt = render_prompt(self.tokenizer, sample, self.chat)
        return sample, prompt, count_tokens(self.tokenizer, prompt)

    def template_tokens(self, sample_seed: str) -> int:
        """Tokens of `sample_seed`'s prompt at the smallest haystack; ValueError where even that exceeds the budget."""
        _, _, base = self.build(self.smallest, sample_seed)
        if base > self.budget:
            raise ValueError(f"ctx leaves {self.budget} prompt tokens but the RULER template alone needs {base}.")
        return base

    def search_size(self, sample_seed: str) -> int:
        """Haystack size for this variant: the largest at which `sample_seed`'s prompt fits."""
        base = self.template_tokens(sample_seed)
        _, _, bigger = self.build(self.smallest + self.step, sample_seed)
        per_unit = max((bigger - base) / self.step, 0.5)        # tokens per word/line; the floor caps the guess
        guess = self.smallest + int((self.budget - base) / per_unit)
        return _largest_fitting_size(lambda size: self.build(size, sample_seed)[2] <= self.budget,
                                     self.smallest, guess)

    def fit_sample(self, size: int, sample_seed: str) -> tuple[NiahSample, str, int, int]:
        """Shrink `size` by the RULER step (by 1 near the minimum) until this sample's prompt fits."""
        while True:
            sample, prompt, tokens = self.build(size, sample_seed)
            if tokens <= self.budget:
                return sample, prompt, tokens, size
            if size <= self.smallest:
                raise ValueError(f"ctx leaves {self.budget} prompt tokens, too few for a RULER sample.")
            size = size - self.step if size - self.step >= self.smallest else size - 1


# ----------------------------------------------------------------------------- task interface
def build_examples(tokenizer, ctx: int, n: int, seed: int, chat: bool = False, variants: list[str] | None = None,
                   max_new_tokens: int = 128, essay_dir: str | None = None,
                   essays: str = "heldout") -> list[Example]:
    """`n` fitted samples per variant (default: all eight), deterministic for `seed`.

    Essay haystacks come from `essay_dir` (every .txt there) or the offline Paul Graham essays: `essays=heldout`
    (default) takes only those outside OSCAR's calibration split, `all` every essay as RULER does (that
    overlaps the default calibration text; the cell's settings record the choice)."""
    names = list(variants) if variants else list(VARIANTS)
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        raise ValueError(f"Unknown RULER NIAH variant(s) {unknown}; known: {sorted(VARIANTS)}.")
    examples = []
    for name in names:
        variant = VARIANTS[name]
        fitter = _Fitter(tokenizer, variant, ctx, max_new_tokens, chat, ruler_data.essay_words(essay_dir, essays))
        size = fitter.search_size(f"{seed}/{name}/0")
        for index in range(n):
            sample, prompt, tokens, used = fitter.fit_sample(size, f"{seed}/{name}/{index}")
            meta = dict(variant=name, ctx=ctx, haystack=variant.haystack, haystack_size=used,
                        depths=[needle["depth"] for needle in sample.needles], needles=sample.needles,
                        keys=sample.keys, query_keys=sample.query_keys, answer_prefix=sample.answer_prefix,
                        prompt_tokens=tokens)
            examples.append(Example(id=f"{name}-{index}", prompt=prompt, answers=sample.answers,
                                    max_new_tokens=max_new_tokens, meta=meta))
    return examples


def _clean_prediction(output: str) -> str:
    """RULER post-processing: strip, then control characters (\\x00-\\x1f) become newlines."""
    return "".join("\n" if ord(ch) < 32 else ch for ch in output.strip())


def string_match_all(prediction: str, references: list[str]) -> float:
    """Fraction of references found in the prediction, case-insensitively."""
    text = _clean_prediction(prediction).lower()
    return sum(ref.lower() in text for ref in references) / len(references)


def score(example: Example, output: str) -> float:
    return string_match_all(output, example.answers)


def aggregate(records) -> dict[str, float]:
    """Per-variant mean x100 (`niah_single_1`, ...) and `ruler_niah`, their unweighted mean."""
    by_variant: dict[str, list[float]] = defaultdict(list)
    for record in records:
        by_variant[record.meta["variant"]].append(record.score)
    metrics = {name: 100.0 * sum(scores) / len(scores) for name, scores in by_variant.items()}
    if metrics:
        metrics["ruler_niah"] = sum(metrics.values()) / len(metrics)
    return metrics


class RulerNiah(GenerationTask):
    """RULER needle-in-a-haystack: configs/task/ruler_niah.yaml's `_target_`."""

    build_examples, score, aggregate = staticmethod(build_examples), staticmethod(score), staticmethod(aggregate)

    def validate(self) -> None:
        """Known variants, a known essay split, an essay folder with .txt files (where one is given), a generation
        budget of at least one token."""
        super().validate()
        unknown = [name for name in list_option(self.cfg.get("variants"), "task.variants") if name not in VARIANTS]
        if unknown:
            raise ValueError(f"Unknown RULER NIAH variant(s) {unknown}; known: {sorted(VARIANTS)}.")
        if self.cfg.get("essays", "heldout") not in ("heldout", "all"):
            raise ValueError(f"task.essays must be heldout or all, got '{self.cfg.essays}'.")
        if self.cfg.get("essay_dir"):                 # a folder of the user's: its .txt files, read once per process
            ruler_data.essay_words(str(self.cfg.essay_dir), str(self.cfg.get("essays", "heldout")))
        integer_option(self.cfg.get("max_new_tokens", 128), "task.max_new_tokens", minimum=1)

    def check_prompts(self, tokenizer, chat: bool, ctx: int, seed: int) -> None:
        """Every variant's template (its smallest haystack) fits ctx - max_new_tokens: what `build_examples` would
        refuse after the weights load, refused before."""
        opts = self.options()
        words = ruler_data.essay_words(opts.get("essay_dir"), opts.get("essays", "heldout"))
        for name in opts.get("variants") or VARIANTS:
            fitter = _Fitter(tokenizer, VARIANTS[name], ctx, int(opts.get("max_new_tokens", 128)), chat, words)
            fitter.template_tokens(f"{seed}/{name}/0")

    def stratum(self, record) -> str:
        return record.meta["variant"]          # `ruler_niah` averages the variants: resample within each
