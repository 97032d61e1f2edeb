"""Batched generation through the installed seam: left padding, sampling, stop strings, a progress bar.

    outputs = generate_outputs(model, tokenizer, examples, seam.new_cache, batch_size=4, static_decode="auto",
                               sampling={"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}, seed=0)

Both decode paths pick tokens with the same `harness.sampling.TokenChooser` (one random stream per example,
seeded from the run seed and the example id), so an example's text does not depend on its batch or path.
"""
from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from harness.cache import reserve_history, set_padding
from harness.decode_clock import ClockProcessor, DecodeClock
from harness.sampling import ChooserProcessor, TokenChooser, check_sampling, example_seeds
from harness.static_cache import static_decode_refusal, static_generate

STATIC_MODES = ("auto", "on", "off")


def _batches(examples, batch_size: int):
    """Group examples of equal max_new_tokens into batches, longest prompts first (less padding)."""
    order = sorted(range(len(examples)), key=lambda i: (examples[i].max_new_tokens, -len(examples[i].prompt)))
    batch: list[int] = []
    for idx in order:
        if batch and (len(batch) == batch_size or examples[batch[0]].max_new_tokens != examples[idx].max_new_tokens):
            yield batch
            batch = []
        batch.append(idx)
    if batch:
        yield batch


def truncate_at_stop(text: str, stop: list[str] | None) -> str:
    cut = min([text.find(s) for s in (stop or []) if s and s in text], default=-1)
    return text if cut < 0 else text[:cut]


def generate_outputs(model, tokenizer, examples, new_cache, batch_size: int = 1, sampling: dict | None = None,
                     stop: list[str] | None = None, desc: str = "generate", static_decode: str = "off",
                     paths: dict | None = None, seed: int = 0, compile_step: bool = False,
                     prefill_chunk: int | None = None) -> list[str]:
    """Generate one continuation per example (greedy unless `sampling` says do_sample; `seed` seeds it).

    static_decode: off (transformers' generate), on (the frozen cache + CUDA graph of harness.static_cache;
    refused with one sentence where it cannot serve), auto (it where it can, generate elsewhere).
    paths: if given, counts the batches each path served ({"static": n, "generate": m}: row provenance) and keeps
    under "clock" a harness.decode_clock.DecodeClock of their prefills and decode steps.
    compile_step: the static path's steps run the model's RMSNorms, MLPs and RoPE compiled (harness.compiled_step).
    prefill_chunk: tokens per prefill forward on both paths (None: the whole prompt in one forward).
    The static path replays each step as a CUDA graph on the GPU (a model split over several as one graph per GPU,
    harness.segmented_graph).
    """
    if static_decode not in STATIC_MODES:
        raise ValueError(f"static_decode must be one of {STATIC_MODES}, got {static_decode!r}.")
    check_sampling(sampling)
    outputs: list[str] = [""] * len(examples)
    device = next(model.parameters()).device
    graph = all(p.device.type == "cuda" for p in model.parameters())
    clock = paths.setdefault("clock", DecodeClock()) if paths is not None else None
    started = time.time()
    with tqdm(total=len(examples), desc=desc, unit="ex", dynamic_ncols=True) as bar:
        for batch in _batches(examples, batch_size):
            prompts = [examples[i].prompt for i in batch]
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=_needs_bos(tokenizer, prompts))
            enc = {k: v.to(device) for k, v in enc.items()}
            max_new = examples[batch[0]].max_new_tokens
            cache = new_cache()
            reserve_history(cache, enc["input_ids"].shape[1] + max_new)
            chooser = TokenChooser(sampling, example_seeds(seed, [examples[i].id for i in batch]), device)
            refusal = "off" if static_decode == "off" else static_decode_refusal(cache, enc["input_ids"].shape[1])
            if paths is not None:
                path = "static" if refusal is None else "generate"
                paths[path] = paths.get(path, 0) + 1
            if refusal is None:
                new_tokens = static_generate(model, enc, cache, max_new, _eos_ids(model), tokenizer.pad_token_id,
                                             graph=graph, choose=chooser, stopped=stop_watcher(tokenizer, stop),
                                             compile_step=compile_step, clock=clock, prefill_chunk=prefill_chunk)
            elif static_decode == "on":
                raise ValueError(refusal)
            else:
                new_tokens = _generate(model, tokenizer, enc, cache, max_new, chooser, stop, clock, prefill_chunk)
            for i, text in zip(batch, tokenizer.batch_decode(new_tokens, skip_special_tokens=True)):
                outputs[i] = truncate_at_stop(text, stop)
            bar.update(len(batch))
            bar.set_postfix(ex_per_s=f"{bar.n / max(time.time() - started, 1e-9):.2f}")
    return outputs


def _generate(model, tokenizer, enc: dict, cache, max_new_tokens: int, chooser: TokenChooser, stop,
              clock: DecodeClock | None = None, prefill_chunk: int | None = None) -> torch.Tensor:
    """transformers' generate through the seam's cache -> the new tokens [B, <= max_new_tokens].

    generate decodes greedily over the chooser's scores, so a sampling chooser picks every token; prefill_chunk
    becomes its prefill_chunk_size (the layers learn their padding from the whole prompt's mask first).
    """
    gen_kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, do_sample=False)
    if prefill_chunk and prefill_chunk < enc["input_ids"].shape[1]:
        set_padding(cache, enc["attention_mask"])
        gen_kwargs["prefill_chunk_size"] = prefill_chunk
    timer = ClockProcessor(clock) if clock else None
    processors = ([ChooserProcessor(chooser)] if chooser.sample else []) + ([timer] if timer else [])
    if processors:
        gen_kwargs["logits_processor"] = processors
    if stop:
        gen_kwargs.update(stop_strings=stop, tokenizer=tokenizer)
    with torch.inference_mode():
        out = model.generate(**enc, past_key_values=cache, **gen_kwargs)
    if timer:
        timer.finish()
    return out[:, enc["input_ids"].shape[1]:]


STOP_WINDOW = 32     # tokens decoded per check: a stop string ends within the 8 tokens since the last check


def stop_watcher(tokenizer, stop: list[str] | None):
    """For static_generate: the tokens so far (a list of [B]) -> bool [B], whose recent text holds a stop string."""
    if not stop:
        return None

    def stopped(tokens: list[torch.Tensor]) -> torch.Tensor:
        tail = torch.stack(tokens[-STOP_WINDOW:], dim=1).tolist()                     # [B, <= STOP_WINDOW]
        texts = tokenizer.batch_decode(tail, skip_special_tokens=True)
        return torch.tensor([any(s and s in text for s in stop) for text in texts], device=tokens[0].device)
    return stopped


def _eos_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _needs_bos(tokenizer, prompts) -> bool:
    """Chat-templated prompts already carry the BOS token; plain prompts get the tokenizer's specials."""
    bos = tokenizer.bos_token
    return not (bos and all(p.startswith(bos) for p in prompts))
