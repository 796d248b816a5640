"""What ring-topk's hook does with one bucket, on its communication thread: compensate the large
tensors with the memory, reduce them with the bucket's exchange (or all-reduce the bucket dense),
keep what was not sent, and all-reduce the step's deferred small tensors in one message.

A mixin of `RingTopkState` (ring_topk.py), which holds what these methods read: the memory,
the selector, the ring, the plan of each bucket's exchange and the statistics.
"""

from __future__ import annotations

import zlib
from typing import Optional

import torch
import torch.distributed as dist

from ringps.comm.exchanges import Segment
from ringps.cost import ring_bytes


class BucketWork:
    """The per-bucket work of the ring-topk hook (the state's methods the hook calls)."""

    def buffers(self, index: int, names: list[str], large: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The bucket's flat accumulator (the memories' buffers, contiguous) and its output
        buffer, made once per bucket layout and reused every step."""
        key = (index, tuple(names))
        if key not in self._flat:
            n = sum(g.numel() for g in large)
            acc = torch.empty(n, dtype=large[0].dtype, device=large[0].device)
            offset = 0
            for name, g in zip(names, large):
                self.memory.place(name, acc[offset : offset + g.numel()])
                offset += g.numel()
            out = torch.empty_like(acc) if len(large) > 1 else None  # one tensor: write into its grad
            self._flat[key] = (acc, out)
        return self._flat[key]

    def name_of(self, index: int, i: int, p: torch.Tensor) -> str:
        return self.names.get(id(p), f"bucket{index}.{i}")

    def process(self, index: int, buffer: torch.Tensor, grads: list[torch.Tensor], params: list[torch.Tensor],
                step: int) -> tuple[list[tuple[str, torch.Tensor]], Optional[torch.futures.Future]]:
        """Reduce the bucket's large tensors in place; return its small ones, named (deferred), and
        the future of an all-reduce still in flight (a dense bucket), if any."""
        if not self._ready:
            self.first_use(params)
        named = [(self.name_of(index, i, p), g) for i, (g, p) in enumerate(zip(grads, params))]
        large = [(n, g) for n, g in named if g.numel() >= self.dense_below]
        large_params = [p for g, p in zip(grads, params) if g.numel() >= self.dense_below]
        if self.memory_units == "update":
            for (tname, _), p in zip(large, large_params):
                self.to_units_of_lr(tname, p)
        small = [(n, g) for n, g in named if g.numel() < self.dense_below]
        if not large:
            return small, None
        names = [n for n, _ in large]
        segments, offset = [], 0
        for tname, g in large:
            # the key seeds randomk's positions: from the name, so it survives DDP's bucket rebuild
            segments.append(Segment(offset, g.numel(), self.schedule.k(g.numel(), step), zlib.crc32(tname.encode()), tname,
                                    g.view(-1)))
            offset += g.numel()
        overlap = min(self.overlap.get(id(p), 0.0) for p in large_params)
        name = self.plan(segments, overlap, step)
        self.chosen[name] = self.chosen.get(name, 0) + 1
        ex = self.exchange(name)
        if ex.whole:
            return self.dense_bucket(buffer, named, large, small, ex.value_dtype)
        acc, out = self.buffers(index, names, [g for _, g in large])
        for tname, g in large:
            self.memory.compensate(tname, g.view(-1))  # accumulates into acc in place
        dest = out if out is not None else large[0][1].view(-1)
        sent = ex.reduce(acc, segments, self.selector, self.ring, step, dest).sent
        for seg, (tname, g) in zip(segments, large):
            if out is not None:
                g.view(-1).copy_(out[seg.offset : seg.offset + seg.numel])
            if sent is None:
                self.memory.update(tname, None)
            else:
                lo, hi = torch.searchsorted(sent, torch.tensor([seg.offset, seg.offset + seg.numel], device=sent.device)).tolist()
                self.memory.update(tname, sent[lo:hi] - seg.offset)
        return small, None

    def to_units_of_lr(self, name: str, param: torch.Tensor) -> None:
        """Keep the memory in update units (Stich et al. 2018, Mem-SGD: m + lr * g): what was held
        back at the lr of its step is applied at that lr when it is sent, not at the lr of the step
        that sends it. The memory is kept in gradient units of the current lr, so when the lr moves
        (warm-up, cosine decay) it is rescaled by old lr / new lr before the new gradient joins."""
        group = self.groups.get(id(param))
        lr = float(group["lr"]) if group is not None else 0.0
        if lr <= 0.0:  # no lr (or a zero one): keep the units the memory has
            return
        last = self.memory_lr.get(name)
        self.memory_lr[name] = lr
        if last and last != lr and not self.memory.is_clean(name):
            self.memory.rescale(name, last / lr)

    def dense_bucket(self, buffer: torch.Tensor, named: list, large: list, small: list, dtype: torch.dtype
                     ) -> tuple[list[tuple[str, torch.Tensor]], Optional[torch.futures.Future]]:
        """The bucket all-reduced dense, its values in `dtype` on the wire. With nothing held back
        in the memory this is DDP's all-reduce of the whole bucket, small tensors too, issued
        asynchronously as DDP's own hooks do: the thread goes on to the next bucket while gloo
        sums this one (issued from this one thread, so every rank's collectives keep one order),
        and the memory makes the update of every tensor (DGC: momentum on the average) once the
        sum lands. A memory that holds something is flushed with it (error feedback's residual,
        DGC's velocity and local momentum), synchronously."""
        if all(self.memory.is_clean(t) for t, _ in large):
            def update(summed: torch.futures.Future) -> torch.Tensor:
                for tname, g in named:
                    self.memory.dense(tname, g.view(-1))
                return summed.value()

            done = self.mean_over_ring_async(buffer, dtype).then(update)
            if self.measuring_compute:
                done.wait()  # the steps that measure compute: the hook's time must hold the collective's
                return [], None
            return [], done
        parts = [self.memory.flush_input(t, g.view(-1)) for t, g in large]
        msg = torch.cat(parts)
        self.mean_over_ring_async(msg, dtype).wait()
        at = 0
        for (tname, g), part in zip(large, parts):
            self.memory.flush_output(tname, msg[at : at + part.numel()], g.view(-1))
            at += part.numel()
        return small, None

    def mean_over_ring_async(self, t: torch.Tensor, dtype: torch.dtype) -> torch.futures.Future:
        """t <- its mean over the ring, in place, once the returned future completes. In 16 bits
        (dense-fp16, --value-dtype) it travels as t / N in 16 bits, summed in that format, exactly
        as DDP's fp16 compression hook sends a bucket (cast, then divide)."""
        n = self.ring.size
        wire = t if dtype == t.dtype else t.to(dtype).div_(n)
        work = dist.all_reduce(wire, group=self.process_group, async_op=True)
        self.meter.add("dense", int(ring_bytes(wire.numel(), n, wire.element_size())))
        if wire is t:
            return work.get_future().then(lambda f: t.div_(n))
        return work.get_future().then(lambda f: t.copy_(f.value()[0]))

    def reduce_small(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """One dense all-reduce for every deferred small tensor of the step."""
        if not tensors:
            return
        flat = torch.cat([t.flatten() for _, t in tensors])
        dist.all_reduce(flat, group=self.process_group)
        n = self.ring.size
        self.meter.add("dense-small", int(ring_bytes(flat.numel(), n, flat.element_size())))
        flat.div_(n)
        offset = 0
        for name, t in tensors:
            part = flat[offset : offset + t.numel()]
            self.memory.dense(name, part)
            t.copy_(part.view_as(t))
            offset += t.numel()
