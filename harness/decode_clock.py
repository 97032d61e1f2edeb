"""Wall time of generation: the prefills and the decode steps, with every GPU synchronised at each mark.

    clock = DecodeClock()
    start = clock.mark(); prefill(); start = clock.prefilled(start)   # one prefill
    step(); step(); start = clock.set_up(start, 2)                     # the setup steps (compile; graph capture)
    n = decode(); clock.decoded(start, n)                              # n more decode steps (a forward each)
    clock.as_row()   # {"prefills": 1, "prefill_s": ..., "first_step_s": ..., "setup_steps": 2, "decode_steps": n, ...}

A row's `run.decode_timing` comes from here: it says how long a cell's decode steps took on its engine
(frozen cache or transformers' generate; one device or several), summed over the cell's batches. The setup steps
of each generation are kept apart (`first_step_s`): the first decode step JIT-compiles the Triton kernels on a fresh
machine, and with a CUDA graph the second captures it (`DecodeStep.setup_calls`); before 2026-11-25's fix the
capture was counted among the decode steps, which inflated `decode_ms_per_step` of short graph generations. A frozen
cache's steps whose page demotion compiles its write kernels or captures its graph (each demotion layout's first
two, `StaticState.next_demotion_sets_up`) are setup steps too (since 2026-11-28).
"""
from __future__ import annotations

import time

import torch
from transformers import LogitsProcessor


def synchronize_all() -> None:
    """Wait for the queued work of every visible GPU (a model split over several runs on each in turn)."""
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


class DecodeClock:
    """Seconds spent in prefills and in decode steps, and how many of each."""

    def __init__(self):
        self.prefills, self.prefill_s, self.first_step_s, self.setup_steps = 0, 0.0, 0.0, 0
        self.demotion_setups = 0
        self.decode_steps, self.decode_s = 0, 0.0

    @staticmethod
    def mark() -> float:
        synchronize_all()
        return time.perf_counter()

    def prefilled(self, start: float) -> float:
        """Count one prefill that began at `start`; returns now (the decode's start)."""
        now = self.mark()
        self.prefills, self.prefill_s = self.prefills + 1, self.prefill_s + now - start
        return now

    def set_up(self, start: float, steps: int = 1) -> float:
        """Count a generation's `steps` setup steps (its first decode step; with a CUDA graph also the capture),
        begun at `start`, apart; returns now."""
        now = self.mark()
        self.first_step_s, self.setup_steps = self.first_step_s + now - start, self.setup_steps + steps
        return now

    def set_up_demotion(self, start: float) -> float:
        """Count one step whose page demotion compiled its kernels or captured its graph, begun at `start`, with the
        setup steps; returns now."""
        self.demotion_setups += 1
        return self.set_up(start, 1)

    def decoded(self, start: float, steps: int) -> float:
        """Count `steps` decode forwards run since `start`; returns now."""
        now = self.mark()
        self.decode_steps, self.decode_s = self.decode_steps + steps, self.decode_s + now - start
        return now

    def as_row(self) -> dict:
        per_step = self.decode_s * 1e3 / self.decode_steps if self.decode_steps else None
        return {"prefills": self.prefills, "prefill_s": round(self.prefill_s, 3),
                "first_step_s": round(self.first_step_s, 3), "setup_steps": self.setup_steps,
                "demotion_setups": self.demotion_setups,
                "decode_steps": self.decode_steps,
                "decode_ms_per_step": None if per_step is None else round(per_step, 3)}


class ClockProcessor(LogitsProcessor):
    """A logits processor for transformers' generate that times it: its first call ends the prefill, its second the
    first decode step, each later call one more decode step (`finish` closes the last)."""

    def __init__(self, clock: DecodeClock):
        self.clock, self.start, self.calls = clock, clock.mark(), 0

    def __call__(self, input_ids, scores):
        if self.calls == 0:
            self.start = self.clock.prefilled(self.start)
        elif self.calls == 1:
            self.start = self.clock.set_up(self.start)
        self.calls += 1
        return scores

    def finish(self) -> None:
        if self.calls > 1:
            self.clock.decoded(self.start, self.calls - 2)
