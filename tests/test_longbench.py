"""LongBench QA task (eval/longbench.py): local data, templates, middle truncation within ctx, qa_f1, buckets."""
import json
from pathlib import Path

import pytest

from eval import longbench
from harness.task import Record
from harness.models import char_tokenizer

FIXTURE = str(Path(__file__).parent / "fixtures" / "longbench_tiny.jsonl")


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A small byte-level BPE (decode/re-encode around a cut is not exact), BOS prepended, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    rows = [json.loads(line) for line in Path(FIXTURE).read_text().splitlines()]
    texts = [row["context"] + " " + row["input"] for row in rows] + list(longbench.PROMPTS.values())
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<bos>", "<eos>"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    return tok


def test_untruncated_prompt_is_the_longbench_template(bpe_tokenizer):
    examples = longbench.build_examples(bpe_tokenizer, 100000, 0, seed=0, data_path=FIXTURE, subsets=["hotpotqa"])
    assert [e.meta["source_id"] for e in examples] == ["hp-1", "hp-2", "hp-3"]
    first = examples[0]
    assert first.prompt == longbench.PROMPTS["hotpotqa"].format(
        context="Passage 1:\nThe Aurel Bridge is a stone footbridge in Velmora, a small country on the northern coast."
                "\nPassage 2:\nVelmora's capital city is Ostrin, a port founded in the ninth century.\nPassage 3:\n"
                "The river Tesk flows through Ostrin before reaching the sea.",
        input="Which city is the capital of the country where the Aurel Bridge stands?")
    assert first.answers == ["Ostrin"] and first.max_new_tokens == 32
    assert [e.meta["bucket"] for e in examples] == ["0-4k", "4-8k", "8k+"]
    assert not any(e.meta["truncated"] for e in examples)


def test_all_six_subsets_by_default_and_e_variant(bpe_tokenizer):
    examples = longbench.build_examples(bpe_tokenizer, 100000, 0, seed=0, data_path=FIXTURE)
    assert sorted({e.meta["dataset"] for e in examples}) == sorted(longbench.PROMPTS)
    assert {e.id.split("-")[0]: e.max_new_tokens for e in examples}["narrativeqa"] == 128
    e_examples = longbench.build_examples(bpe_tokenizer, 100000, 0, seed=0, data_path=FIXTURE, longbench_e=True)
    assert [(e.meta["dataset"], e.meta["source_id"]) for e in e_examples] == [("hotpotqa_e", "hpe-1"),
                                                                             ("hotpotqa_e", "hpe-2")]


@pytest.mark.parametrize("ctx", [200, 280, 400])
@pytest.mark.parametrize("chat", [False, True])
def test_middle_truncation_keeps_prompt_plus_generation_within_ctx(bpe_tokenizer, ctx, chat):
    full = longbench.build_examples(bpe_tokenizer, 100000, 0, seed=0, data_path=FIXTURE, chat=chat,
                                    use_chat_template=True)
    fitted = longbench.build_examples(bpe_tokenizer, ctx, 0, seed=0, data_path=FIXTURE, chat=chat,
                                      use_chat_template=True)
    assert any(ex.meta["truncated"] for ex in fitted)
    for whole, ex in zip(full, fitted):
        tokens = len(bpe_tokenizer(ex.prompt)["input_ids"])
        assert tokens == ex.meta["prompt_tokens"]
        assert tokens + ex.max_new_tokens <= ctx
        assert ex.meta["truncated"] == (whole.meta["prompt_tokens"] + ex.max_new_tokens > ctx)
        if ex.meta["truncated"]:
            assert tokens + ex.max_new_tokens >= ctx - 8               # the cut keeps (almost) all it may
            assert ex.prompt[:10] == whole.prompt[:10]                   # head and tail of the template survive
            assert ex.prompt.endswith("Answer:" + ("\n[assistant]" if chat else ""))
        else:
            assert ex.prompt == whole.prompt


def test_chat_template_only_when_asked(bpe_tokenizer):
    plain = longbench.build_examples(bpe_tokenizer, 100000, 1, seed=0, data_path=FIXTURE, chat=True,
                                     subsets=["qasper"])
    wrapped = longbench.build_examples(bpe_tokenizer, 100000, 1, seed=0, data_path=FIXTURE, chat=True,
                                       subsets=["qasper"], use_chat_template=True)
    assert plain[0].prompt.startswith("You are given a scientific article")
    assert wrapped[0].prompt == f"[user]{plain[0].prompt}\n[assistant]"


def test_sampling_is_deterministic_per_seed():
    tok = char_tokenizer()
    pick = [longbench.build_examples(tok, 100000, 2, seed=s, data_path=FIXTURE, subsets=["hotpotqa"]) for s in (0, 0)]
    assert [e.id for e in pick[0]] == [e.id for e in pick[1]] and len(pick[0]) == 2


def test_data_folder_layout(tmp_path):
    rows = [json.loads(line) for line in Path(FIXTURE).read_text().splitlines()]
    with open(tmp_path / "musique.jsonl", "w") as f:
        for row in rows:
            if row["dataset"] == "musique":
                f.write(json.dumps({k: v for k, v in row.items() if k != "dataset"}) + "\n")
    [ex] = longbench.build_examples(char_tokenizer(), 100000, 0, seed=0, data_path=str(tmp_path), subsets=["musique"])
    assert ex.answers == ["12,000", "12000"]
    with pytest.raises(ValueError, match="no hotpotqa.jsonl"):
        longbench.build_examples(char_tokenizer(), 100000, 0, seed=0, data_path=str(tmp_path), subsets=["hotpotqa"])


def test_bad_config_raises_one_clear_error(bpe_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="Unknown LongBench-E subset"):
        longbench.build_examples(bpe_tokenizer, 4096, 1, seed=0, data_path=FIXTURE, subsets=["narrativeqa"],
                                 longbench_e=True)
    with pytest.raises(ValueError, match="Unknown LongBench subset"):
        longbench.build_examples(bpe_tokenizer, 4096, 1, seed=0, data_path=FIXTURE, subsets=["gov_report"])
    with pytest.raises(ValueError, match="neither a JSONL file nor a folder"):
        longbench.build_examples(bpe_tokenizer, 4096, 1, seed=0, data_path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="set data_path"):     # the hub is offline in tests
        longbench.build_examples(bpe_tokenizer, 4096, 1, seed=0, subsets=["qasper"], hf_dataset="oscar-test/missing")
    with pytest.raises(ValueError, match="too few"):
        longbench.build_examples(bpe_tokenizer, 40, 1, seed=0, data_path=FIXTURE, subsets=["qasper"])


@pytest.mark.parametrize("prediction,answers,expected", [
    ("Ostrin", ["Ostrin"], 1.0),
    ("  The Penn Treebank.\n", ["Penn Treebank"], 1.0),                 # articles, punctuation, case, spaces
    ("Ilse", ["Ilse Varga"], 2 / 3),                                    # precision 1, recall 1/2
    ("Ilse Varga designed it", ["Ilse Varga"], 2 * 0.5 * 1 / 1.5),       # precision 1/2, recall 1
    ("Paris", ["Ostrin"], 0.0),
    ("12000 people", ["12,000", "12000"], 2 / 3),                        # best reference wins
    ("", ["Ostrin"], 0.0),
    ("the the", ["a"], 0.0),                                             # both normalise to nothing
])
def test_qa_f1(prediction, answers, expected):
    assert longbench.qa_f1(prediction, answers) == pytest.approx(expected)


def test_normalize_answer():
    assert longbench.normalize_answer("  The  Cat, a DOG & an owl!  ") == "cat dog owl"


def test_aggregate_reports_datasets_buckets_and_summaries():
    def rec(dataset, bucket, value):
        return Record("x", "", value, 0, {"dataset": dataset, "bucket": bucket})
    records = [rec("hotpotqa_e", "0-4k", 1.0), rec("hotpotqa_e", "0-4k", 0.0), rec("hotpotqa_e", "8k+", 1.0),
               rec("qasper_e", "4-8k", 0.5)]
    metrics = longbench.aggregate(records)
    assert metrics == pytest.approx({
        "hotpotqa_e": 200 / 3, "hotpotqa_e/0-4k": 50.0, "hotpotqa_e/8k+": 100.0,
        "qasper_e": 50.0, "qasper_e/4-8k": 50.0,
        "longbench": (200 / 3 + 50) / 2, "longbench_bucket_mean": (75.0 + 50.0) / 2, "longbench_sample_mean": 62.5})
