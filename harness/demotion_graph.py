"""A frozen cache's page demotion as a CUDA graph: captured once, then replayed (harness/static_cache.py uses it).

    state.demotions = DemotionGraphs(state)    # DecodeStep(graph=True) sets it where `demotion_graph_refusal` is None
    trim = state.demotions.demote(counts)      # replays the layout's graph, or runs it eagerly (capturing it next)

Eagerly, one page demotion of a Qwen3-4B cache launches about 580 kernels: about 1.5 ms of GPU work under 34 ms of
host time at batch 1 (scripts/dev/profile_demotion.py), paid one decode step in `page_tokens`. Between two
demotions of a static decode the fp rows come back to the same layout (sink | recent window | one page), so each
demotion quantizes and moves the same fp rows; only the histories' write offsets grow, and the graph reads those
from the device lengths (`PackedHistory.write_at`). The first demotion of a layout runs the graph's kernels eagerly
(compiling them), the second captures and replays them, later ones only replay. The host's lengths are kept by the
same Python either way (`PackedHistory.count_appended`).

A layout (the fp rows in use and each sequence's sink, recent count, fp start and demoted count) fixes every index
the demotion uses, so each layout has its graph; the histories' lengths may differ. Sequences of different prompt
lengths demote in different steps (each keeps its own recent window, as alone), so such a batch cycles through up to
page_tokens layouts (one per phase), each recurring every page_tokens steps: each is captured on its second
occurrence. The graphs of a GPU share one memory pool: each replays alone, between decode steps, and keeps nothing
it allocates past its replay (it writes the cache's own buffers), so a batch of many phases holds one demotion's
temporaries, not one per layout. Where sequences differ, each buffer's demoted and kept rows are gathered into place through device
row indices (`harness.static_cache._demote_by_gather`, `harness.cache.RowIndex`) built on the layout's first, eager
run and kept with its graph. A cache split over
several GPUs (a segmented decode, harness/segmented_graph.py) has one graph per GPU and layout: each holds that
GPU's layers and its mirror of the lengths, and replays on that GPU's current stream, so it runs after the GPU's
part of the previous step and before its part of the next.
"""
from __future__ import annotations

import weakref

import torch

from harness.cache import RowIndex
from harness.packed_history import DeviceOffsets

MAX_LAYOUTS = 64   # graphs kept: a static decode has one layout per demotion phase of its sequences (<= page_tokens:
                   # 32 for KIVI, 8 for OSCAR); beyond it a layout demotes eagerly


def demotion_graph_refusal(state) -> str | None:
    """Why a frozen cache's demotions cannot be graphed (one sentence), or None."""
    layers = state.layers
    if not all(device.startswith("cuda") for device in state.mirrors):
        return "graphed demotions need the frozen cache on CUDA devices."
    if any(layer.history_k is None or not layer.use_kernels for layer in layers):
        return "graphed demotions need packed histories written by the kernels."
    return None


class DemotionGraphs:
    """Per demotion layout, one CUDA graph per GPU of a frozen cache (capture=False: the same device work, eager; for
    tests on CPU)."""

    def __init__(self, state, capture: bool = True):
        self.state = weakref.proxy(state)   # the state holds this: no cycle, so dropping a cache frees its graphs at once
        self.capture = capture              # (a cyclic collection could release them inside a later graph's capture)
        self.seen: set[tuple] = set()
        self.graphs: dict[tuple, tuple[dict[str, torch.cuda.CUDAGraph], int]] = {}   # layout -> ({GPU: graph}, trim)
        self.indices: dict[tuple, RowIndex] = {}    # layout -> the row indices its graph reads
        self.pools: dict[str, tuple] = {}           # GPU -> the memory pool every layout's graph there shares

    def layout(self, counts: list[int]) -> tuple:
        """(fp rows in use, ((sink, recent, fp start, count) of each sequence)): what fixes the demotion's indices."""
        first = self.state.layers[0]
        sink, _, recent = first.regions()
        return self.state.n_fp, tuple(zip(sink, recent, first.fp_starts(), counts))

    def sets_up(self, counts: list[int]) -> bool:
        """Whether demoting `counts` now is a layout's first demotion (eager, compiling its kernels) or its capture."""
        layout = self.layout(counts)
        return layout not in self.seen or self._captures(layout)

    def _captures(self, layout: tuple) -> bool:
        """Whether demoting `layout` now captures its graph: its second demotion, with room for one more graph."""
        return self.capture and layout in self.seen and layout not in self.graphs and len(self.graphs) < MAX_LAYOUTS

    def demote(self, counts: list[int]) -> int:
        """Demote counts[b] rows of every sequence (the device work and the histories' host lengths); returns the
        trim of the fp rows (the caller shifts its lengths)."""
        layout = self.layout(counts)
        if layout in self.graphs:
            graphs, trim = self.graphs[layout]
            _replay(graphs)
        elif self._captures(layout):
            graphs = {device: torch.cuda.CUDAGraph() for device in self.state.mirrors}
            for device, graph in graphs.items():        # a capture stream on the graph's GPU: torch.cuda.graph's
                side = torch.cuda.Stream(device=device)     # default is one stream, made on the first capture's GPU
                pool = self.pools.setdefault(device, torch.cuda.graph_pool_handle())
                with torch.cuda.device(device), torch.cuda.graph(graph, pool=pool, stream=side):
                    trim = self._device_work(counts, device, self.indices[layout])
            _replay(graphs)
            self.graphs[layout] = (graphs, trim)
        else:
            self.seen.add(layout)
            index = self.indices.setdefault(layout, RowIndex()) if len(self.graphs) < MAX_LAYOUTS else RowIndex()
            for device in self.state.mirrors:
                trim = self._device_work(counts, device, index)
        for layer in self.state.layers:
            layer.history_k.count_appended(counts)
            layer.history_v.count_appended(counts)
        return trim

    def _device_work(self, counts: list[int], device: str, index: RowIndex) -> int:
        """The demotion of every layer on `device` with the histories written at the device lengths (read when the
        work runs) of that GPU's mirror. A sequence that demotes fewer rows than another gets the others' count
        written past its length, where nothing reads them and its next demotion writes over them."""
        offsets = DeviceOffsets(self.state.mirrors[device].hist_len)   # the tokens each history holds before this page
        return self.state.demote_on_device(counts, write=lambda history, rows: history.write_at(rows, offsets),
                                           device=device, index=index)


def _replay(graphs: dict[str, torch.cuda.CUDAGraph]) -> None:
    """Each GPU's graph on that GPU's current stream."""
    for device, graph in graphs.items():
        with torch.cuda.device(device):
            graph.replay()
