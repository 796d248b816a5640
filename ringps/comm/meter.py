"""Byte meters.

`TcpCounters` reads what the kernel actually moved on this process's TCP sockets (tcp_info's
bytes_acked / bytes_received), so every strategy's traffic is measured the same way, gloo's own
collectives included. `PayloadMeter` counts what an algorithm itself hands to the transport.
`host_kernel_cpu` reads the CPU the host's kernel has spent, which moving those bytes costs.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import NamedTuple, Optional

# struct tcp_info (linux/tcp.h): __u64 tcpi_bytes_acked at offset 120, tcpi_bytes_received at 128
_TCPI_BYTES = struct.Struct("QQ")
_TCPI_OFFSET = 120
_TCPI_LEN = 136
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's unit


def host_kernel_cpu() -> Optional[float]:
    """Seconds all of this host's CPUs have spent in the kernel so far (system, irq and softirq time
    of /proc/stat), None without /proc/stat. An emulated link's work (TCP, veth, the bridge, tbf)
    runs there, much of it in softirq, which no process is charged for: the simulator's CPU per
    byte moved is calibrated from it (sim/calibrate.py)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()  # cpu user nice system idle iowait irq softirq ...
        return (int(fields[3]) + int(fields[6]) + int(fields[7])) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


class Bytes(NamedTuple):
    sent: int
    recv: int

    def __sub__(self, other: "Bytes") -> "Bytes":  # type: ignore[override]
        return Bytes(self.sent - other.sent, self.recv - other.recv)


class TcpCounters:
    """Totals over this process's TCP sockets. Sockets that close take their bytes with them, so
    `delta()` keeps a per-socket ledger and only ever adds."""

    def __init__(self) -> None:
        self._last: dict[int, Bytes] = {}
        self.total = Bytes(0, 0)
        self.available = True
        self.read()

    def _sockets(self) -> dict[int, Bytes]:
        found: dict[int, Bytes] = {}
        try:
            fds = os.listdir("/proc/self/fd")
        except OSError:
            self.available = False
            return found
        for name in fds:
            fd = int(name)
            try:
                if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    continue
                inode = os.fstat(fd).st_ino
                dup = os.dup(fd)
            except OSError:
                continue
            try:
                sock = socket.socket(fileno=dup)  # closing the duplicate leaves the socket open
            except OSError:
                os.close(dup)
                continue
            try:
                if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6):
                    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_LEN)
                    if len(info) >= _TCPI_LEN:
                        found[inode] = Bytes(*_TCPI_BYTES.unpack_from(info, _TCPI_OFFSET))
            except OSError:
                pass
            finally:
                sock.close()
        return found

    def read(self) -> Bytes:
        """Update and return the running total of bytes sent (acked) and received."""
        now = self._sockets()
        sent, recv = self.total
        for inode, b in now.items():
            prev = self._last.get(inode, Bytes(0, 0))
            sent += max(0, b.sent - prev.sent)
            recv += max(0, b.recv - prev.recv)
        self._last = now
        self.total = Bytes(sent, recv)
        return self.total


class PayloadMeter:
    """What an algorithm sends and receives, by exchange name (bytes of tensor payload)."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.recv: dict[str, int] = {}

    def add(self, name: str, sent: int = 0, recv: int = 0) -> None:
        self.sent[name] = self.sent.get(name, 0) + sent
        self.recv[name] = self.recv.get(name, 0) + recv

    def totals(self) -> Bytes:
        return Bytes(sum(self.sent.values()), sum(self.recv.values()))
