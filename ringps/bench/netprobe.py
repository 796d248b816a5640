"""Probes run inside emulated hosts by `ringps bench net`: a TCP sender/receiver pair and a gloo
all_reduce timing. Each prints one JSON line.

    python -m ringps.bench.netprobe tcp-recv ADDR PORT
    python -m ringps.bench.netprobe tcp-send ADDR PORT BYTES
    python -m ringps.bench.netprobe allreduce NUMEL ITERS      # under RANK/WORLD_SIZE/MASTER_*
"""

from __future__ import annotations

import json
import socket
import sys
import time


def tcp_recv(addr: str, port: int) -> dict:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        s.listen(1)
        s.settimeout(60)
        conn, _ = s.accept()
        conn.settimeout(60)
        buf = bytearray(1 << 20)
        got, t0, first = 0, None, None
        with conn:
            while True:
                n = conn.recv_into(buf)
                if not n:
                    break
                t0 = t0 or time.perf_counter()
                first = first or time.time()
                got += n
        dt = time.perf_counter() - (t0 or time.perf_counter())
    # first and last byte on the wall clock, which every emulated host shares: flows received at once
    # are timed together from them (benchmarks/server_link.py)
    return {"bytes": got, "seconds": dt, "bits_per_s": got * 8 / dt if dt > 0 else 0.0,
            "first": first, "last": time.time()}


def tcp_send(addr: str, port: int, nbytes: int) -> dict:
    deadline = time.monotonic() + 20
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    data = b"\0" * (1 << 20)
    with conn:
        conn.settimeout(60)
        sent = 0
        while sent < nbytes:
            conn.sendall(data)
            sent += len(data)
    return {"bytes": sent}


def allreduce(numel: int, iters: int) -> dict:
    import torch
    import torch.distributed as dist

    from ringps.comm.group import init_from_env

    torch.set_num_threads(1)
    init_from_env("gloo", 300.0)
    t = torch.ones(numel)
    dist.all_reduce(t)  # connect and warm up
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return {"times": times, "bytes": numel * 4, "world": int(__import__("os").environ["WORLD_SIZE"])}


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "tcp-recv":
        out = tcp_recv(args[0], int(args[1]))
    elif cmd == "tcp-send":
        out = tcp_send(args[0], int(args[1]), int(args[2]))
    elif cmd == "allreduce":
        out = allreduce(int(args[0]), int(args[1]))
    else:
        print(f"unknown probe {cmd}", file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
