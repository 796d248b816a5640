"""Ring neighbours and point-to-point steps with timeouts that name who waited for whom.

A ring step sends to the right neighbour and receives from the left one at the same time
(isend + irecv). Messages of unknown size go as a small int64 header, then the payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from ringps.comm.meter import PayloadMeter
from ringps.comm.wait import wait


@dataclass
class Ring:
    group: Optional[dist.ProcessGroup]
    timeout: float = 120.0
    meter: Optional[PayloadMeter] = None

    def __post_init__(self) -> None:
        self.size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.right = (self.rank + 1) % self.size
        self.left = (self.rank - 1) % self.size

    def global_rank(self, r: int) -> int:
        return dist.get_global_rank(self.group, r) if self.group is not None else r

    def _wait(self, work, what: str, peer: int) -> None:
        wait(work, self.timeout, f"rank {self.global_rank(self.rank)}: {what} with rank {self.global_rank(peer)}")

    def step(self, send: torch.Tensor, recv: torch.Tensor, what: str, name: str = "ring") -> None:
        """Send `send` right and fill `recv` from the left, concurrently."""
        if self.size == 1:
            recv.copy_(send)
            return
        rq = dist.irecv(recv, group=self.group, group_src=self.left)
        sq = dist.isend(send, group=self.group, group_dst=self.right)
        self._wait(sq, f"sending {what}", self.right)
        self._wait(rq, f"{what}", self.left)
        if self.meter is not None:
            self.meter.add(name, send.numel() * send.element_size(), recv.numel() * recv.element_size())

    def step_varsize(self, send: torch.Tensor, header: list[int], what: str, name: str = "ring") -> tuple[list[int], torch.Tensor]:
        """Like `step`, for payloads whose size the receiver learns from a header.

        header: small ints describing `send` (header[0] must be its numel). Returns the left
        neighbour's header and payload (same dtype as `send`)."""
        h_send = torch.tensor(header, dtype=torch.int64, device=send.device)  # NCCL: on the payload's device
        h_recv = torch.empty_like(h_send)
        self.step(h_send, h_recv, f"{what} (header)", name)
        got = h_recv.tolist()
        recv = torch.empty(got[0], dtype=send.dtype, device=send.device)
        self.step(send, recv, what, name)
        return got, recv
