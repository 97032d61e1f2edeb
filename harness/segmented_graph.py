"""A decode step over a model split across GPUs as one CUDA graph per device segment (a graph captures one device).

    graph = SegmentedGraph(model)                                   # boundaries: where a module's device changes
    logits = graph.capture(forward, first_device, on_begin)          # runs forward() once, capturing each segment
    graph.replay()                                                   # every later step: logits updated in place

The capture runs the stock forward once. A forward pre-hook on each top-level part of the model (embedding, RoPE,
decoder layers, final norm, lm_head, tied to the embedding or not) watches the device of the module about to run:
where it differs from the segment being captured, that capture ends and the next begins on the module's device, on
a side stream of its own, with a private memory pool.
Tensors handed across the boundary (the hidden state, RoPE's cos / sin, position ids) are copied eagerly into
buffers on the new device, and every later module of the segment receives those copies (accelerate's hooks would
otherwise copy them again inside the capture, a cross-device copy no graph of one device can hold). A replay
launches the segments in order, each after its copies-in (PyTorch's cross-device copy orders the two GPUs'
streams). accelerate's hook on the model itself is held for the capture: it would move the inputs to its main
device (any of the GPUs: accelerate picks it from a set) and the output back to the input's device; the logits
are copied into a buffer on the first device after each replay instead.
`on_begin(device)` runs inside each segment's capture first (the frozen cache advances that device's lengths).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from harness.placement import module_layout


@dataclass
class Segment:
    """One device's captured part of the step and the copies that feed it."""

    device: torch.device
    graph: torch.cuda.CUDAGraph
    stream: torch.cuda.Stream
    copies: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)   # (source, buffer here)


def module_device(module: torch.nn.Module) -> torch.device | None:
    """The device of a module's first parameter or buffer (None for a module with neither)."""
    held = next(itertools.chain(module.parameters(), module.buffers()), None)
    return None if held is None else held.device


class SegmentedGraph:
    """The step's CUDA graphs, one per run of consecutive modules on one device (module docstring)."""

    def __init__(self, model: torch.nn.Module, split_before: tuple[torch.nn.Module, ...] = ()):
        layout = module_layout(model)
        self.model = model
        self.watched = [model.get_submodule(name) for name in layout.head + layout.layers + layout.tail]
        self.split_before = {id(m) for m in split_before}   # extra boundaries on one device (tests of the mechanism)
        self.segments: list[Segment] = []
        self.moved: dict[tuple[int, torch.device], torch.Tensor] = {}
        self.streams: dict[torch.device, torch.cuda.Stream] = {}      # each device's stream before the capture
        self.output = self.result = None
        self.on_begin, self.begun = None, set()                        # devices whose on_begin ran
        self.open = False                                              # a segment's capture has begun, not ended

    def capture(self, forward, first_device: torch.device, on_begin) -> torch.Tensor:
        """Run forward() (-> logits) once, capturing it segment by segment; returns the logits buffer on
        first_device that `replay` refreshes."""
        torch.cuda.synchronize()
        self.on_begin, self.begun = on_begin, set()
        current = torch.cuda.current_device()                # set_stream makes a stream's GPU the current one
        handles = [m.register_forward_pre_hook(self._pre_hook, with_kwargs=True) for m in self.watched]
        hooks = output_hooks(self.model)
        held = [(hook, hook.execution_device) for hook in hooks]
        try:
            for hook in hooks:                   # inputs stay where they are, the output where the last part put it
                hook.io_same_device, hook.execution_device = False, first_device
            self._begin(first_device)
            try:
                self.output = forward()                                       # [B, 1, V] on the last device
            finally:
                if self.open:
                    self._end()                  # also after an error: a stream left capturing fails every later call
        finally:
            for hook, device in held:
                hook.io_same_device, hook.execution_device = True, device
            for handle in handles:
                handle.remove()
            torch.cuda.set_device(current)
        self.result = self.output.to(first_device, copy=True)
        return self.result

    def replay(self) -> torch.Tensor:
        previous = None
        for segment in self.segments:
            if previous is not None and previous.device != segment.device:
                torch.cuda.current_stream(segment.device).wait_stream(torch.cuda.current_stream(previous.device))
            for source, buffer in segment.copies:
                buffer.copy_(source)
            segment.graph.replay()
            previous = segment
        self.result.copy_(self.output)
        return self.result

    # ------------------------------------------------------------------ capture internals
    def _pre_hook(self, module, args, kwargs):
        device = module_device(module)
        if device is None:
            return None
        forced = id(module) in self.split_before
        if device != self.segments[-1].device or forced:
            if forced:
                self.split_before.discard(id(module))
            self._end()
            self._begin(device, (args, kwargs))
        return self._local(args, device, module), self._local(kwargs, device, module)

    def _begin(self, device: torch.device, crossing=None) -> None:
        """Copy the tensors `crossing` holds from other devices to buffers here, then capture on `device`."""
        segment = Segment(device, torch.cuda.CUDAGraph(), torch.cuda.Stream(device=device))
        for source in _tensors(crossing):
            if source.device != device and (id(source), device) not in self.moved:
                buffer = source.to(device)
                segment.copies.append((source, buffer))
                self.moved[id(source), device] = buffer
        self.streams.setdefault(device, torch.cuda.current_stream(device))
        segment.stream.wait_stream(torch.cuda.current_stream(device))
        torch.cuda.set_stream(segment.stream)
        with torch.cuda.device(device):
            segment.graph.capture_begin()
        self.segments.append(segment)
        self.open = True
        if device not in self.begun:
            self.begun.add(device)
            self.on_begin(device)

    def _end(self) -> None:
        segment = self.segments[-1]
        self.open = False
        try:
            with torch.cuda.device(segment.device):
                segment.graph.capture_end()
        finally:
            torch.cuda.set_stream(self.streams[segment.device])
        torch.cuda.current_stream(segment.device).wait_stream(segment.stream)

    def _local(self, value, device: torch.device, module):
        """value with every tensor from another device replaced by its copy here (copied at the boundary)."""
        if isinstance(value, torch.Tensor):
            if value.device == device:
                return value
            buffer = self.moved.get((id(value), device))
            if buffer is None:
                raise ValueError(f"a tensor on {value.device} reaches {type(module).__name__} on {device} inside a "
                                 f"captured segment (only tensors handed to a segment's first module are copied).")
            return buffer
        if isinstance(value, (tuple, list)):
            return type(value)(self._local(v, device, module) for v in value)
        if isinstance(value, dict):
            return {k: self._local(v, device, module) for k, v in value.items()}
        return value


def _tensors(value):
    """Every tensor in nested tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def output_hooks(model: torch.nn.Module) -> list:
    """accelerate's hooks on the model itself that move its inputs to a main device and its output back."""
    hook = getattr(model, "_hf_hook", None)
    hooks = getattr(hook, "hooks", [hook] if hook is not None else [])
    return [h for h in hooks if getattr(h, "io_same_device", False)]
