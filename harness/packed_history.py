"""Quantized rows of one tensor (K or V) of one cache layer, each batch row with its own length.

    history = PackedHistory(quantizer, quantizer.key_spec, use_kernels=False)
    history.append(rows, counts=[64, 0])     # rows [B, H_kv, n, D]: batch row b keeps its first counts[b]
    history.lengths                          # [64, 0]: tokens held per batch row

Each batch row's tokens start at index 0 of the token axis (so per-channel token groups start at each
sequence's first quantized token); rows beyond a row's length are unused.
"""
from __future__ import annotations

import torch

from harness.placement import on_device

MIRROR = "mirror"     # the reference path's dequantized rows, kept beside the packed parts
GROWTH, MIN_ROWS = 2, 64   # a buffer grows to GROWTH x the rows it needs (at least MIN_ROWS): amortised appends


def grown_rows(needed: int) -> int:
    """Rows a growing buffer is given when it must hold `needed` (what harness/memory_plan.py plans for)."""
    return max(GROWTH * needed, MIN_ROWS)


class DeviceOffsets:
    """Where each batch row's next rows go in a packed part, from the tokens held (int32 [B] on the device): the index
    of p rows for n tokens is built once per (p, n) and shared by every history written with these offsets."""

    def __init__(self, lengths: torch.Tensor):
        self.lengths = lengths
        self._rows: dict[tuple[int, int], torch.Tensor] = {}

    def rows(self, p: int, tokens: int) -> torch.Tensor:
        """Long [B, p]: the rows of batch row b's p new part rows (p rows hold `tokens` tokens)."""
        if (p, tokens) not in self._rows:
            first = self.lengths.long() * p // tokens                                  # [B]
            self._rows[p, tokens] = first[:, None] + torch.arange(p, device=self.lengths.device)
        return self._rows[p, tokens]


class PackedHistory:
    """Growable packed buffers along the token axis (codes/scale/zero, and the reference path's mirror).

    On the reference path each row is dequantized once, when it is written (`dequantized`); on the kernel
    path only the packed bytes exist, written and read by the kernels of the quantizer's format (`kernel_ops`).
    """

    def __init__(self, quantizer, spec, use_kernels: bool):
        self.quantizer, self.spec, self.use_kernels = quantizer, spec, use_kernels
        self.lengths: list[int] = []                   # tokens held by each batch row
        self.head_dim = 0
        self.buffers: dict[str, torch.Tensor] = {}     # token-like axis at dim -2
        self.used: dict[str, int] = {}                 # rows of each buffer that `view` shows

    @property
    def length(self) -> int:
        """Tokens of the longest batch row (the width the decode kernel is handed)."""
        return max(self.lengths, default=0)

    def append(self, rows: torch.Tensor, counts: list[int] | None = None) -> None:
        """Quantize `rows` [B, H_kv, n, D] and store the first counts[b] of batch row b after its held tokens.

        counts=None keeps all n of every row. Channel-axis specs need every count a multiple of the group.
        """
        batch, tokens = rows.shape[0], rows.shape[-2]
        if tokens == 0:
            return
        counts = [tokens] * batch if counts is None else counts
        self._check_alignment(counts)
        self.head_dim, self.dtype = rows.shape[-1], rows.dtype
        if not self.lengths:
            self.lengths = [0] * batch
        if self.use_kernels:
            views = self._write_views(rows, counts)
            with on_device(rows.device):                 # the layer's GPU (models split over several)
                ops = self.quantizer.kernel_ops()
                if views is not None:                    # the write kernel stores into the buffers: no copies
                    ops.quantize_pack(rows, self.spec, out=tuple(views.values()))
                    self.count_appended(counts)
                    return
                packed = ops.quantize_pack(rows, self.spec)   # the format's write kernel
            parts = dict(zip(("codes", "scale", "zero"), packed))
        else:
            qt = self.quantizer.quantize(rows.float(), self.spec)
            parts = {"codes": qt.codes, "scale": qt.scale, "zero": qt.zero,
                     MIRROR: self.quantizer.dequantize(qt).to(rows.dtype)}
        for key, part in parts.items():
            self._write(key, part, tokens, counts)
        self.lengths = [held + n for held, n in zip(self.lengths, counts)]
        self._mark_used(parts, tokens)

    def _mark_used(self, parts: dict, tokens: int) -> None:
        for key, part in parts.items():
            self.used[key] = self.length * part.shape[-2] // tokens

    def write_at(self, rows: torch.Tensor, offsets: DeviceOffsets) -> None:
        """The device half of appending all n of `rows` [B, H_kv, n, D] to every batch row b after the tokens it holds
        by `offsets` (read on the device, never by the host, so a CUDA graph can capture the write and replay it at
        later offsets: harness/demotion_graph.py): by the format's write kernel where it takes `row_offsets`, else its
        parts scattered in. Needs the packed buffers to hold the rows (a frozen cache's); the host half is
        `count_appended`."""
        tokens, ops = rows.shape[-2], self.quantizer.kernel_ops()
        with on_device(rows.device):
            if getattr(ops, "writes_at_offsets", False):               # the write kernel reads the offsets itself
                buffers = tuple(self.buffers[key] for key in ("codes", "scale", "zero"))
                ops.quantize_pack(rows, self.spec, out=buffers, row_offsets=offsets.lengths)
                return
            packed = ops.quantize_pack(rows, self.spec)
        for key, part in zip(("codes", "scale", "zero"), packed):                 # part [B, H_kv, p, *]
            index = offsets.rows(part.shape[-2], tokens)                            # [B, p]
            self.buffers[key].scatter_(-2, index[:, None, :, None].expand_as(part), part)

    def count_appended(self, counts: list[int]) -> None:
        """The host half of an append on the kernel path: batch row b holds counts[b] more tokens (`used` follows
        the format's rows per token)."""
        self.lengths = [held + n for held, n in zip(self.lengths, counts)]
        tokens = max(counts)
        for key, (shape, _) in self.quantizer.kernel_ops().part_shapes([1, 1, tokens, self.head_dim],
                                                                       self.spec).items():
            self.used[key] = self.length * shape[-2] // tokens

    def _write_views(self, rows: torch.Tensor, counts: list[int]) -> dict[str, torch.Tensor] | None:
        """Each packed buffer's rows where `rows` [B, H_kv, n, D] go, when every batch row appends all n at one
        held length, the buffers already hold them and the format's write kernel takes `out` (a frozen cache's page
        demotion); else None (`_write` copies the kernel's output in)."""
        ops, tokens = self.quantizer.kernel_ops(), rows.shape[-2]
        if (not getattr(ops, "writes_into", False) or not self.buffers or set(counts) != {tokens}
                or len(set(self.lengths)) != 1):
            return None
        views = {}
        for key, (shape, dtype) in ops.part_shapes(list(rows.shape), self.spec).items():
            buf, p = self.buffers.get(key), shape[-2]
            offset = self.lengths[0] * p // tokens
            if buf is None or buf.dtype != dtype or list(buf.shape[:-2]) != list(shape[:-2]) \
                    or buf.shape[-1] != shape[-1] or offset + p > buf.shape[-2]:
                return None
            views[key] = buf[..., offset:offset + p, :]
        return views

    def _check_alignment(self, counts: list[int]) -> None:
        if getattr(self.spec, "axis", "token") == "channel" and any(n % self.spec.group for n in counts):
            raise ValueError(f"channel-axis history appends whole groups of {self.spec.group} tokens, got {counts}.")

    def _write(self, key: str, part: torch.Tensor, tokens: int, counts: list[int]) -> None:
        """Write the first counts[b] tokens' rows of `part` [B, H_kv, p, *] (p rows for `tokens` tokens)
        at each batch row's held length."""
        p = part.shape[-2]
        offsets = [held * p // tokens for held in self.lengths]
        sizes = [n * p // tokens for n in counts]
        buf = self._room(key, part, max(o + n for o, n in zip(offsets, sizes)), tokens)
        if len(set(offsets)) == 1 and set(sizes) == {p}:
            buf[..., offsets[0]:offsets[0] + p, :] = part
            return
        for b, (offset, size) in enumerate(zip(offsets, sizes)):
            buf[b, :, offset:offset + size, :] = part[b, :, :size]

    def _room(self, key: str, part: torch.Tensor, needed: int, tokens: int) -> torch.Tensor:
        """The buffer of `key`, grown (kept rows copied) when it holds fewer than `needed` rows."""
        buf, used = self.buffers.get(key), self.used.get(key, 0)
        if buf is not None and needed <= buf.shape[-2]:
            return buf
        reserved = getattr(self, "reserved_tokens", 0) * part.shape[-2] // max(tokens, 1)
        capacity = max(reserved, needed) if buf is None and reserved else grown_rows(needed)
        grown = part.new_empty(*part.shape[:-2], capacity, part.shape[-1])
        if buf is not None:
            grown[..., :used, :] = buf[..., :used, :]
        self.buffers[key] = grown
        return grown

    def allocate(self, like: torch.Tensor, tokens: int) -> None:
        """Make the packed buffers hold `tokens` rows of the shape of `like` [B, H_kv, *, D] (kept rows copied).

        Gives an empty history its (empty) operands for the decode kernel, and a frozen cache its fixed storage.
        """
        self.head_dim, self.dtype = like.shape[-1], getattr(self, "dtype", like.dtype)
        if not self.lengths:
            self.lengths = [0] * like.shape[0]
        parts = self.quantizer.kernel_ops().part_shapes((*like.shape[:-2], tokens, like.shape[-1]), self.spec)
        for key, (shape, dtype) in parts.items():
            used = self.used.get(key, 0)
            buf = like.new_zeros(shape, dtype=dtype)
            if used:
                buf[..., :used, :] = self.buffers[key][..., :used, :]
            self.buffers[key], self.used[key] = buf, used

    def capacity(self) -> int:
        """Tokens each batch row can hold without growing the packed buffers."""
        return self.buffers["codes"].shape[-2] if self.buffers else 0

    def reserve(self, tokens: int) -> None:
        """Size the buffers for `tokens` rows when they are first created (no doubling slack, e.g. benchmarks)."""
        self.reserved_tokens = tokens

    def decode_into(self, out: torch.Tensor, row: int) -> None:
        """Write batch row `row`'s first h tokens, dequantized, into out [H_kv, h, D] (the model's dtype): copied
        from the mirror, or on the kernel path decoded from the packed bytes one KV head at a time, so the decode's
        fp32 temporaries are one head's size, not the whole history's."""
        tokens = out.shape[-2]
        if tokens == 0:
            return
        if MIRROR in self.buffers:
            out.copy_(self.view(MIRROR)[row, :, :tokens])
            return
        from kernels.format import QuantizedTensor
        codes, scale, zero = (self.view(key)[row] for key in ("codes", "scale", "zero"))   # [H_kv, rows, *]
        for head in range(out.shape[0]):
            one = slice(head, head + 1)
            qt = QuantizedTensor(codes[one], scale[one], zero[one], self.spec, self.head_dim)
            out[head] = self.quantizer.dequantize(qt)[0, :tokens]                          # [h, D]

    def view(self, key: str) -> torch.Tensor:
        return self.buffers[key][..., : self.used[key], :]

    def select_batch(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` [B'] (in that order, repeats allowed) of every buffer."""
        self.buffers = {key: buf[index.to(buf.device)] for key, buf in self.buffers.items()}
        self.lengths = [self.lengths[i] for i in index.tolist()] if self.lengths else []

    def nbytes(self) -> int:
        """Bytes of the packed parts in use (the reference path's mirror is not storage)."""
        return sum(self.view(k).numel() * self.view(k).element_size() for k in self.buffers if k != MIRROR)
