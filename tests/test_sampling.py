"""Token choice (harness/sampling.py): top-k / top-p filtering, the sampler's distribution, seeds, bad settings."""
import pytest
import torch

from harness.sampling import ChooserProcessor, TokenChooser, example_seeds, filtered_probs

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def test_top_k_keeps_the_k_most_likely_tokens_renormalised():
    torch.testing.assert_close(filtered_probs(LOGITS, 2, 1.0), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    torch.testing.assert_close(filtered_probs(LOGITS, 0, 0.7), torch.tensor([[0.5, 0.3, 0.0, 0.0]]) / 0.8)
    torch.testing.assert_close(filtered_probs(LOGITS, 0, 0.85), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    torch.testing.assert_close(filtered_probs(LOGITS, 0, 0.1), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_samples_follow_the_filtered_distribution():
    chooser = TokenChooser({"do_sample": True, "top_p": 0.96}, seeds=[7], device="cpu")
    draws = torch.cat([chooser(LOGITS) for _ in range(20000)])
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]) / 1.0, atol=0.015, rtol=0)


def test_temperature_sharpens():
    cold = TokenChooser({"do_sample": True, "temperature": 0.05}, seeds=[1], device="cpu")
    assert all(int(cold(LOGITS)) == 0 for _ in range(200))


def test_each_example_has_its_own_stream():
    seeds = example_seeds(0, ["a", "b"])
    assert seeds == example_seeds(0, ["a", "b"]) and seeds[0] != seeds[1] and seeds != example_seeds(1, ["a", "b"])
    logits = torch.zeros(2, 1000)
    pair = TokenChooser({"do_sample": True}, seeds, "cpu")
    alone = TokenChooser({"do_sample": True}, seeds[1:], "cpu")
    both = torch.stack([pair(logits) for _ in range(5)])        # [steps, 2]
    lone = torch.stack([alone(logits[:1]) for _ in range(5)])   # [steps, 1]
    assert torch.equal(both[:, 1:], lone)


def test_greedy_chooser_and_the_generate_processor():
    assert int(TokenChooser(None, [0], "cpu")(LOGITS)) == 0
    scores = ChooserProcessor(TokenChooser({"do_sample": True}, [3], "cpu"))(None, LOGITS.clone())
    assert torch.isfinite(scores).sum() == 1


@pytest.mark.parametrize("sampling, message", [({"temperature": 0}, "temperature"), ({"top_p": 1.5}, "top_p"),
                                               ({"top_k": -1}, "top_k"), ({"min_p": 0.1}, "unknown: min_p")])
def test_bad_settings_are_one_sentence(sampling, message):
    with pytest.raises(ValueError, match=message):
        TokenChooser(sampling, [0], "cpu")
