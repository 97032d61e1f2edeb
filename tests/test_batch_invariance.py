"""A prompt decodes the same alone as inside a left-padded batch of longer prompts (per-sequence regions).

Every quantizer on the reference path; the Triton kernels (dynamic cache) and the frozen static cache for the
code-storing quantizers with kernels (the affine format's, or their own: TurboQuant). On CPU the kernels run under
the interpreter (OSCAR and KIVI only, for time; TurboQuant's kernel path is held to its reference path on a
left-padded batch in tests/test_turboquant_seam.py); on a GPU box (TRITON_INTERPRET=0) every such quantizer runs
on CUDA.
"""
import pytest
import torch

from harness.quantizer import build_quantizer, known_quantizers
from harness.seam import install, lacks_kernels
from harness.static_cache import static_generate

PROMPT = "The grass is green and the sky is blue. The magic number is 4213. Remember it well, " * 3
LONGER = ["A much longer neighbour that pads the batch: " + "words and more words, " * 12 + PROMPT,
          "Another neighbour of a middling length, " + "with several clauses, " * 6]
STEPS = 12
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SMALL_WINDOWS = {"sink": 4, "recent": 8, "page": 4}           # sink, history and recent all reached, pages demoted
KIVI_WINDOWS = {"recent": 32, "page": 32}                    # channel groups of 32 tokens
NOT_OURS = {"hf_quantized_cache"}                            # transformers' QuantizedCache: not this cache
KERNEL_ON_CPU = {"oscar", "kivi2"}


def _prepared(tiny, name, tmp_path, monkeypatch, **options):
    """(tiny Qwen3 on DEVICE, its tokenizer, quantizer `name` with small windows and `options`, calibrated)."""
    monkeypatch.setenv("OSCAR_CACHE", str(tmp_path))
    model, tok = tiny("qwen3")
    model.to(DEVICE)
    overrides = KIVI_WINDOWS if name.startswith("kivi") else {} if name == "bf16" else SMALL_WINDOWS
    quantizer = build_quantizer(name, **overrides, **options)
    quantizer.check(model.config)
    quantizer.prepare(model, tok)
    return model, tok, quantizer


def _greedy(model, tok, quantizer, prompts, kernels):
    """(new tokens [B, STEPS], logits [B, STEPS, V]) of transformers' generate through the seam."""
    enc = tok(prompts, return_tensors="pt", padding=True).to(DEVICE)
    with install(model, quantizer, kernels=kernels) as seam, torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=tok.pad_token_id,
                             past_key_values=seam.new_cache())
    return out.sequences[:, enc.input_ids.shape[1]:], torch.stack(out.logits, dim=1)


def _static(model, tok, quantizer, prompts, compile_step=False, prefill_chunk=None):
    """New tokens [B, STEPS] of the frozen cache (CUDA graph on a GPU; its RMSNorms, MLPs and RoPE compiled if
    compile_step; the prompt prefilled in chunks of prefill_chunk tokens if given)."""
    enc = tok(prompts, return_tensors="pt", padding=True).to(DEVICE)
    with install(model, quantizer, kernels="triton") as seam:
        return static_generate(model, dict(enc), seam.new_cache(), STEPS, [], tok.pad_token_id, graph=CUDA,
                               compile_step=compile_step, prefill_chunk=prefill_chunk)


def _assert_same(alone, batched):
    """Row 0 of the batch is the lone prompt: the same tokens, and logits within fp32 rounding."""
    tokens, logits = alone
    assert torch.equal(batched[0][:1], tokens), "the batch changed the lone prompt's greedy tokens"
    torch.testing.assert_close(batched[1][:1], logits, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", sorted(set(known_quantizers()) - NOT_OURS))
def test_reference_path_is_batch_invariant(tiny, tmp_path, monkeypatch, name):
    model, tok, quantizer = _prepared(tiny, name, tmp_path, monkeypatch)
    alone = _greedy(model, tok, quantizer, [PROMPT], "reference")
    _assert_same(alone, _greedy(model, tok, quantizer, [PROMPT, *LONGER], "reference"))


def _kernel_names():
    """Quantizers with kernels (not those with quantize/dequantize hooks of their own and no kernels); bf16 reads
    fp rows only."""
    names = sorted(n for n in set(known_quantizers()) - NOT_OURS if not lacks_kernels(build_quantizer(n)))
    return names if CUDA else sorted(KERNEL_ON_CPU)


@pytest.mark.parametrize("name", _kernel_names())
def test_kernels_and_static_cache_are_batch_invariant(tiny, tmp_path, monkeypatch, name):
    model, tok, quantizer = _prepared(tiny, name, tmp_path, monkeypatch)
    alone = _greedy(model, tok, quantizer, [PROMPT], "triton")
    _assert_same(alone, _greedy(model, tok, quantizer, [PROMPT, *LONGER], "triton"))
    static_alone = _static(model, tok, quantizer, [PROMPT])
    assert torch.equal(static_alone, alone[0])
    assert torch.equal(_static(model, tok, quantizer, [PROMPT, *LONGER])[:1], static_alone)


@pytest.mark.skipif(not CUDA, reason="the compiled step is what compile_step=auto runs on CUDA")
@pytest.mark.parametrize("name", ["bf16", "oscar", "naive_int2"])
def test_compiled_static_step_is_batch_invariant(tiny, tmp_path, monkeypatch, name):
    """Inductor picks its reduction strategy from the shapes it sees: the compiled step must still decode a prompt
    alone as inside a batch, and as the uncompiled step does."""
    model, tok, quantizer = _prepared(tiny, name, tmp_path, monkeypatch)
    alone = _static(model, tok, quantizer, [PROMPT], compile_step=True)
    assert torch.equal(_static(model, tok, quantizer, [PROMPT, *LONGER], compile_step=True)[:1], alone)
    assert torch.equal(alone, _static(model, tok, quantizer, [PROMPT]))


CHUNK = 64    # the lone prompt's left padding inside the batch is longer: its first chunks hold padding only


@pytest.mark.parametrize("name, keeps_recent", [("oscar", True), ("oscar", False), ("bf16", True)])
def test_chunked_prefill_is_batch_invariant_on_both_paths(tiny, tmp_path, monkeypatch, name, keeps_recent):
    """task.prefill_chunk: a prompt prefilled in chunks decodes the same alone as inside a left-padded batch whose
    first chunks are all padding for it, on the frozen cache and through generate, with either placement of a
    non-final chunk (`chunk_keeps_recent`); BF16 (nothing quantized) gives the one-forward prefill's tokens."""
    from harness.generate import generate_outputs
    from harness.task import Example
    model, tok, quantizer = _prepared(tiny, name, tmp_path, monkeypatch, chunk_keeps_recent=keeps_recent)
    enc = tok([PROMPT, *LONGER], return_tensors="pt", padding=True)
    assert (enc.attention_mask[0] == 0).sum() > 2 * CHUNK
    alone = _static(model, tok, quantizer, [PROMPT], prefill_chunk=CHUNK)
    assert torch.equal(_static(model, tok, quantizer, [PROMPT, *LONGER], prefill_chunk=CHUNK)[:1], alone)
    if name == "bf16":
        assert torch.equal(alone, _static(model, tok, quantizer, [PROMPT]))
    examples = [Example(str(i), p, [], max_new_tokens=STEPS) for i, p in enumerate([PROMPT, *LONGER])]
    with install(model, quantizer, kernels="triton") as seam:
        def texts(exs, batch_size):
            return generate_outputs(model, tok, exs, seam.new_cache, batch_size=batch_size, static_decode="off",
                                    prefill_chunk=CHUNK)
        assert texts(examples[:1], 1) == texts(examples, 3)[:1]


def test_the_lone_prompt_really_is_padded_and_quantized(tiny):
    """Guards the test's premise: the lone prompt gets left padding, and reaches sink, history and recent."""
    model, tok = tiny("qwen3")
    enc = tok([PROMPT, *LONGER], return_tensors="pt", padding=True)
    assert enc.attention_mask[0].sum() < enc.attention_mask[1].sum() and enc.attention_mask[0, 0] == 0
    quantizer = build_quantizer("naive_int2", **SMALL_WINDOWS)
    quantizer.check(model.config)
    with install(model, quantizer, kernels="reference") as seam, torch.inference_mode():
        cache = seam.new_cache()
        model(**enc, past_key_values=cache)
    sink, hist, recent = cache.layers[0].regions()
    assert sink[0] == 4 and recent[0] == 8 and hist[0] == int(enc.attention_mask[0].sum()) - 12
