"""A frozen cache's page demotion as a CUDA graph: captured once, then replayed (harness/static_cache.py uses it).

    state.demotions = DemotionGraphs(state)    # DecodeStep(graph=True) sets it where `demotion_graph_refusal` is None
    trim = state.demotions.demote(counts)      # None: this demotion cannot be graphed (the caller runs it eagerly)

Eagerly, one page demotion of a Qwen3-4B cache launches about 580 kernels: about 1.5 ms of GPU work under 34 ms of
host time at batch 1 (scripts/dev/profile_demotion.py), paid one decode step in `page_tokens`. Between two
demotions of a static decode the fp rows come back to the same layout (sink | recent window | one page), so each
demotion quantizes and moves the same fp rows; only the histories' write offsets grow, and the graph reads those
from the device lengths (`PackedHistory.write_at`). The first demotion of a layout runs the graph's kernels eagerly
(compiling them), the second captures and replays them, later ones only replay. The host's lengths are kept by the
same Python either way (`PackedHistory.count_appended`).

A layout is graphed when every sequence demotes the same count at the same fp rows (one recent count, sink and fp
start; the histories' lengths may differ), so no per-sequence index is built on the host.
"""
from __future__ import annotations

import weakref

import torch

from harness.packed_history import DeviceOffsets

MAX_LAYOUTS = 4          # graphs kept; a static decode has one layout once its first page is demoted


def demotion_graph_refusal(state) -> str | None:
    """Why a frozen cache's demotions cannot be graphed (one sentence), or None."""
    layers = state.layers
    if len(state.mirrors) != 1 or not next(iter(state.mirrors)).startswith("cuda"):
        return "graphed demotions need the frozen cache on one CUDA device."
    if any(layer.history_k is None or not layer.use_kernels for layer in layers):
        return "graphed demotions need packed histories written by the kernels."
    return None


class DemotionGraphs:
    """One CUDA graph per demotion layout of a frozen cache (capture=False: the same device work, eager; for tests
    on CPU)."""

    def __init__(self, state, capture: bool = True):
        self.state = weakref.proxy(state)   # the state holds this: no cycle, so dropping a cache frees its graphs at once
        self.capture = capture              # (a cyclic collection could release them inside a later graph's capture)
        self.seen: set[tuple] = set()
        self.graphs: dict[tuple, tuple] = {}              # layout -> (CUDAGraph, trim)

    def layout(self, counts: list[int]) -> tuple | None:
        """(fp rows in use, sink, recent, fp start, count) shared by every sequence; None where they differ."""
        first = self.state.layers[0]
        sink, _, recent = first.regions()
        per_sequence = set(zip(sink, recent, first.fp_starts(), counts))
        return (self.state.n_fp, *per_sequence.pop()) if len(per_sequence) == 1 else None

    def demote(self, counts: list[int]) -> int | None:
        """Demote counts[b] rows of every sequence (the device work and the histories' host lengths); returns the
        trim of the fp rows (the caller shifts its lengths), or None when the layout cannot be graphed."""
        layout = self.layout(counts)
        if layout is None:
            return None
        if layout in self.graphs:
            graph, trim = self.graphs[layout]
            graph.replay()
        elif self.capture and layout in self.seen and len(self.graphs) < MAX_LAYOUTS:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                trim = self._device_work(counts)
            graph.replay()
            self.graphs[layout] = (graph, trim)
        else:
            self.seen.add(layout)
            trim = self._device_work(counts)
        for layer in self.state.layers:
            layer.history_k.count_appended(counts)
            layer.history_v.count_appended(counts)
        return trim

    def _device_work(self, counts: list[int]) -> int:
        """Every layer's demotion with the histories written at the device lengths (read when the work runs)."""
        offsets = DeviceOffsets(self.state.hist_len)      # from the tokens each history holds before this page
        return self.state.demote_on_device(counts, write=lambda history, rows: history.write_at(rows, offsets))
