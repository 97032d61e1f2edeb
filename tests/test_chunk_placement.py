"""Where a chunked prefill's tokens sit when the next chunk reads them (`quantizer.chunk_keeps_recent`). A chunk
demotes what lies beyond the recent window before it attends, so a chunk at least a window long reads every earlier
token past the sink quantized either way; a shorter one reads the tail of the chunk before it in full precision by
default, quantized with false, as the release's server (METHOD_OSCAR §7.2: a non-final chunk keeps only its sink)."""
import pytest
import torch

from harness.cache import KERNEL_MAX_QUERY_TOKENS, ThreeRegionLayer, set_padding
from harness.quantizer import build_quantizer

SINK, RECENT, HEADS, DIM = 4, 32, 2, 128    # head_dim 128: the groups a quantizer resolves before a model


def _layer(keeps_recent: bool) -> ThreeRegionLayer:
    quantizer = build_quantizer("naive_int2", sink=SINK, recent=RECENT, page=8, chunk_keeps_recent=keeps_recent)
    return ThreeRegionLayer(quantizer, layer_idx=0)


def _chunk(tokens: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, HEADS, tokens, DIM, generator=gen)                   # [B, H_kv, T, D]


def _prefill(layer, chunks):
    """Feed the chunks as a chunked prefill (unpadded); returns the K each chunk attended to."""
    layer.pad = [0]
    seen = []
    for chunk in chunks:
        view, _ = layer.update(chunk, chunk.clone())
        seen.append(view.keys)
    return seen


@pytest.mark.parametrize("keeps_recent", [True, False])
@pytest.mark.parametrize("second_chunk", [50, 20])
def test_a_later_chunk_reads_the_earlier_ones_as_the_option_says(keeps_recent, second_chunk):
    first, second = _chunk(100, 0), _chunk(second_chunk, 1)
    seen = _prefill(_layer(keeps_recent), [first, second])[1]                  # [1, H, 100 + second_chunk, D]
    tail = 100 + second_chunk - RECENT                                         # the window after the second chunk
    assert torch.equal(seen[..., :SINK, :], first[..., :SINK, :])              # the sink: full precision always
    assert not torch.equal(seen[..., SINK:min(tail, 100), :], first[..., SINK:min(tail, 100), :])   # quantized
    if tail < 100:                                   # the first chunk's rows still inside the window
        assert torch.equal(seen[..., tail:100, :], first[..., tail:100, :]) == keeps_recent
    assert torch.equal(seen[..., 100:, :], second)                             # a chunk reads itself unquantized


@pytest.mark.parametrize("last_chunk", [50, 20])
def test_the_last_chunk_keeps_its_window_and_a_non_final_one_does_not(last_chunk):
    """After the prefill (settled by the first decode step) the regions are those of a serving engine: with the
    release's placement the recent window holds only the last chunk's tokens, never an earlier chunk's."""
    regions = {}
    for keeps_recent in (True, False):
        layer = _layer(keeps_recent)
        _prefill(layer, [_chunk(100, 0), _chunk(last_chunk, 1)])
        layer.settle()
        regions[keeps_recent] = layer.regions()
    assert regions[True] == ([SINK], [100 + last_chunk - SINK - RECENT], [RECENT])
    assert regions[False] == ([SINK], [100 + last_chunk - SINK - min(RECENT, last_chunk)], [min(RECENT, last_chunk)])


def test_one_forward_prefill_is_the_same_either_way():
    layers = {keeps_recent: _layer(keeps_recent) for keeps_recent in (True, False)}
    for layer in layers.values():
        _prefill(layer, [_chunk(120, 2)])
        layer.settle()
    assert layers[True].regions() == layers[False].regions() == ([SINK], [120 - SINK - RECENT], [RECENT])
    assert all(torch.equal(a, b) for a, b in zip(layers[True].materialize(), layers[False].materialize()))


class _Cache:
    def __init__(self, layer):
        self.layers = [layer]


@pytest.mark.parametrize("keeps_recent", [True, False])
def test_a_short_last_chunk_of_a_known_prompt_is_a_prefill_chunk(keeps_recent):
    """A chunked prefill whose last chunk has at most KERNEL_MAX_QUERY_TOKENS tokens (prompts of 8192 k + 1..16
    tokens): once `set_padding` told the layer the prompt's length, that chunk reads the one before it as a later
    chunk does (with the release's placement everything past the sink quantized), and the first call after the
    prompt is a decode step again. Without the prompt's length the short chunk was taken as a decode step, which
    keeps the window of the chunk before it in full precision whatever the option says."""
    short = KERNEL_MAX_QUERY_TOKENS - 4
    first, last = _chunk(100, 0), _chunk(short, 1)
    layer = _layer(keeps_recent)
    set_padding(_Cache(layer), torch.ones(1, 100 + short, dtype=torch.bool))
    seen = _prefill(layer, [first, last])[1]                                   # [1, H, 100 + short, D]
    tail = 100 + short - RECENT
    assert torch.equal(seen[..., :SINK, :], first[..., :SINK, :])
    assert torch.equal(seen[..., tail:100, :], first[..., tail:100, :]) == keeps_recent
    assert torch.equal(seen[..., 100:, :], last)
    layer.update(_chunk(1, 2), _chunk(1, 2))                                  # a decode step: settles the prompt
    kept = RECENT if keeps_recent else short                                  # the window after the last chunk
    assert layer.regions() == ([SINK], [100 + short - SINK - kept], [kept + 1])   # + the step's own token


def test_a_short_prompt_is_a_prefill_alone_as_inside_a_longer_batch():
    """A cache's first call is a prefill however short: a prompt of at most KERNEL_MAX_QUERY_TOKENS tokens attends
    through the prefill path (the materialized rows) whether it runs alone or left-padded beside a longer prompt,
    never through the decode kernel alone (last-bit differences between the two). Its next call is a decode step."""
    short = _chunk(KERNEL_MAX_QUERY_TOKENS - 6, 3)
    layer = ThreeRegionLayer(build_quantizer("naive_int2", sink=SINK, recent=RECENT, page=8), 0, use_kernels=True)
    view, _ = layer.update(short, short.clone())
    assert view.keys is not None and torch.equal(view.keys, short)            # prefill: the rows, not the kernel
    step, _ = layer.update(_chunk(1, 4), _chunk(1, 4))
    assert step.keys is None                                                  # a decode step reads the packed storage
