"""RULER NIAH generator (eval/ruler_niah.py): determinism, needle placement, templates, length fitting, scoring."""
import re
import uuid

import pytest

from eval import ruler_data, ruler_niah
from harness.task import Record

QWEN_LIKE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A small byte-level BPE trained on three essays, BOS prepended, Qwen3-like chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    words = ruler_data.essay_words()
    texts = [" ".join(words[i:i + 200]) for i in range(0, 6000, 200)]
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<bos>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>"]
    core.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=800, special_tokens=specials,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                  unk_token="<unk>")
    tok.chat_template = QWEN_LIKE_TEMPLATE
    return tok


def context_of(example) -> str:
    """The haystack (with needles) between the template's first and last lines."""
    return example.prompt.split("afterwards.\n", 1)[1].rsplit("\nWhat ", 1)[0]


def needle_text(example, needle) -> str:
    return ruler_data.NEEDLE_TEMPLATE.format(type_needle_v=ruler_niah.VARIANTS[example.meta["variant"]].value_type,
                                             key=needle["key"], value=needle["value"])


@pytest.mark.parametrize("ctx,chat", [(1024, True), (3000, False), (4096, True)])
def test_fitted_prompts_stay_within_ctx_and_fill_it(bpe_tokenizer, ctx, chat):
    examples = ruler_niah.build_examples(bpe_tokenizer, ctx, 2, seed=0, chat=chat)
    assert len(examples) == 2 * len(ruler_niah.VARIANTS)
    for ex in examples:
        tokens = len(bpe_tokenizer(ex.prompt)["input_ids"])
        assert tokens == ex.meta["prompt_tokens"]
        assert tokens + ex.max_new_tokens <= ctx
        # the haystack fills the budget, less RULER's per-sample decrement (500 essay words from 4K on)
        assert tokens + ex.max_new_tokens >= 0.7 * ctx, (ex.id, tokens)


def test_generation_is_deterministic_per_seed(bpe_tokenizer):
    first = ruler_niah.build_examples(bpe_tokenizer, 2048, 2, seed=3, chat=False)
    again = ruler_niah.build_examples(bpe_tokenizer, 2048, 2, seed=3, chat=False)
    other = ruler_niah.build_examples(bpe_tokenizer, 2048, 2, seed=4, chat=False)
    assert [(e.prompt, e.answers, e.meta) for e in first] == [(e.prompt, e.answers, e.meta) for e in again]
    assert [e.answers for e in first] != [e.answers for e in other]


def test_needles_sit_at_their_stated_depth_and_answers_are_in_the_prompt(bpe_tokenizer):
    for ex in ruler_niah.build_examples(bpe_tokenizer, 4096, 3, seed=1, chat=True):
        context = context_of(ex)
        for needle in ex.meta["needles"]:
            text = needle_text(ex, needle)
            assert context.count(text) == 1, (ex.id, text)
            values_per_key = ruler_niah.VARIANTS[ex.meta["variant"]].num_values
            assert context.count(f"for {needle['key']} is:") == values_per_key     # no distractor reuses a key
            assert abs(context.index(text) / len(context) - needle["depth"] / 100) < 0.1, (ex.id, needle)
        for answer in ex.answers:
            assert answer in context
        assert all(key in ex.prompt.rsplit("\nWhat ", 1)[1] for key in ex.meta["query_keys"])


def test_line_haystacks_insert_needles_before_the_drawn_line():
    variant = ruler_niah.VARIANTS["niah_single_1"]
    sample = ruler_niah.make_sample(variant, 40, "seed")
    lines = sample.task_input.split("\n")[1:-1]
    assert len(lines) == 41
    position = next(i for i, line in enumerate(lines) if line.startswith("One of the special magic"))
    assert position == round(sample.needles[0]["depth"] * 40 / 100)
    assert [line for line in lines if line != ruler_data.NOISE_SENTENCE] == [lines[position]]


def test_templates_singular_plural_and_answer_prefix(bpe_tokenizer):
    single = ruler_niah.make_sample(ruler_niah.VARIANTS["niah_single_2"], 300, "s")
    assert single.task_input.startswith("A special magic number is hidden within the following text. Make sure to "
                                        "memorize it. I will quiz you about the number afterwards.\n")
    assert single.task_input.endswith(f"\nWhat is the special magic number for {single.query_keys[0]} mentioned in "
                                      "the provided text?")
    assert single.answer_prefix == (f" The special magic number for {single.query_keys[0]} mentioned in the "
                                    "provided text is")
    multi = ruler_niah.make_sample(ruler_niah.VARIANTS["niah_multiquery"], 300, "s")
    assert multi.task_input.startswith("Some special magic numbers are hidden")
    k = multi.query_keys
    assert multi.answer_prefix == (f" The special magic numbers for {k[0]}, {k[1]}, {k[2]}, and {k[3]} mentioned in "
                                   "the provided text are")
    assert len(multi.answers) == 4 and len(set(multi.keys)) == 4
    assert len(ruler_niah.make_sample(ruler_niah.VARIANTS["niah_multivalue"], 300, "s").answers) == 4
    chat = ruler_niah.render_prompt(bpe_tokenizer, single, chat=True)
    assert chat.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n" + single.answer_prefix)
    assert ruler_niah.render_prompt(bpe_tokenizer, single, chat=False) == single.task_input + single.answer_prefix


def test_key_and_value_formats():
    sample = ruler_niah.make_sample(ruler_niah.VARIANTS["niah_single_3"], 50, "f")
    assert uuid.UUID(sample.answers[0]).version == 4
    adjective, noun = sample.keys[0].split("-", 1)
    assert adjective in ruler_data._word_list("adjectivelist.txt") and noun in ruler_data._word_list("nounlist.txt")
    number = ruler_niah.make_sample(ruler_niah.VARIANTS["niah_single_1"], 10, "f").answers[0]
    assert re.fullmatch(r"[1-9]\d{6}", number)
    uuid_keys = ruler_niah.make_sample(ruler_niah.VARIANTS["niah_multikey_3"], 10, "f")
    assert uuid.UUID(uuid_keys.keys[0]) and uuid.UUID(uuid_keys.answers[0])


def test_essay_dir_replaces_the_paul_graham_corpus(tmp_path, bpe_tokenizer):
    (tmp_path / "mine.txt").write_text("Zebras graze at dawn. Otters float at noon! " * 50)
    [ex] = ruler_niah.build_examples(bpe_tokenizer, 1024, 1, seed=0, variants=["niah_single_2"],
                                     essay_dir=str(tmp_path))
    assert "Zebras graze at dawn." in ex.prompt and "Paul" not in ex.prompt
    with pytest.raises(ValueError, match="No .txt essays"):
        ruler_niah.build_examples(bpe_tokenizer, 1024, 1, seed=0, variants=["niah_single_2"],
                                  essay_dir=str(tmp_path / "empty"))


def test_bad_config_raises_one_clear_error(bpe_tokenizer):
    with pytest.raises(ValueError, match="Unknown RULER NIAH variant"):
        ruler_niah.build_examples(bpe_tokenizer, 2048, 1, seed=0, variants=["niah_single_9"])
    with pytest.raises(ValueError, match="ctx leaves"):
        ruler_niah.build_examples(bpe_tokenizer, 160, 1, seed=0, variants=["niah_single_1"])


@pytest.mark.parametrize("output,answers,expected", [
    ("The number is 1234567.", ["1234567"], 1.0),
    ("nothing useful", ["1234567"], 0.0),
    ("1234567 and 7654321", ["1234567", "7654321", "1111111", "2222222"], 0.5),
    ("  UUID: AB12-CD34\x00", ["ab12-cd34"], 1.0),
    ("123\x0b4567", ["1234567"], 0.0),                 # a control char splits the number
    ("first: 111\nsecond:\t222", ["111", "222"], 1.0),
])
def test_string_match_all(output, answers, expected):
    assert ruler_niah.string_match_all(output, answers) == pytest.approx(expected)


def test_aggregate_is_per_variant_x100_and_unweighted_mean():
    records = [Record("a", "", 1.0, 0, {"variant": "niah_single_1"}),
               Record("b", "", 0.0, 0, {"variant": "niah_single_1"}),
               Record("c", "", 0.25, 0, {"variant": "niah_multivalue"})]
    metrics = ruler_niah.aggregate(records)
    assert metrics == pytest.approx({"niah_single_1": 50.0, "niah_multivalue": 25.0, "ruler_niah": 37.5})


def test_regex_sentence_split():
    text = 'He said "stop." Then left! Did he? Yes. e.g.no split'
    assert ruler_data.split_sentences(text) == ['He said "stop."', "Then left!", "Did he?", "Yes.", "e.g.no split"]


def _shingles(words, n=12):
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def test_no_calibration_passage_appears_in_any_essay_haystack():
    """OSCAR's default calibration text (the essays' calibration split) and RULER's haystacks are disjoint.

    A passage is a 12-word shingle of the calibration text that the held-out essays do not also contain (the
    essays share boilerplate such as "Want to start a startup? Get funded by Y Combinator.")."""
    from harness.capture import calibration_text
    heldout = ruler_data.essay_words()
    calibration = _shingles(calibration_text("essays").split()) - _shingles(list(heldout) + list(heldout[:11]))
    essay_variants = [v for v in ruler_niah.VARIANTS.values() if v.haystack == "essay"]
    assert essay_variants
    for variant in essay_variants:       # a haystack larger than the held-out essays (they are cycled)
        sample = ruler_niah.make_sample(variant, len(heldout) + 5000, "disjoint")
        assert not _shingles(sample.task_input.split()) & calibration, variant
    everything = ruler_data.essay_words(None, "all")      # RULER's own choice overlaps: the check can fail
    assert _shingles(list(everything[:20000])) & calibration
