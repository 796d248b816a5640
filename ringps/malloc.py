"""glibc's allocator, told to keep freed memory for reuse (what every ringps worker does at start).

A training step frees and re-allocates the same large tensors (activations, gradient copies,
16-bit wire buffers) every step. glibc's defaults hand large blocks back to the OS when freed
(`M_TRIM_THRESHOLD`, `M_MMAP_THRESHOLD`, adjusted on the fly), so each step faults its pages
back in. How often it does so depends on which threads allocate and free: with ring-topk's hook,
whose communication thread allocates beside the backward pass, facenet on 4 CPU ranks took 1.6x
the page faults and system time per step of DDP's fp16 hook sending the same bytes, and every
phase of the step (forward, optimizer, evaluation too) ran 8-36% slower on 2 shared cores. With
freed memory kept, both hooks faulted about 5 thousand times per step, a fifth of fp16's
default, and stepped within 3% (benchmarks/malloc.py; docs/RESULTS.md).

PyTorch's CPU tuning guides reach for jemalloc or tcmalloc for the same reason; this needs no
preload. A user who runs the hooks in their own loop calls `keep_freed_memory()` at start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger("ringps")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MMAP_MAX = 32 << 20  # glibc's largest M_MMAP_THRESHOLD on 64 bits (HEAP_MAX_SIZE / 2)
ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def user_tuned() -> bool:
    """The user set glibc's allocator variables, or preloads another allocator (jemalloc, tcmalloc,
    mimalloc: their names all say malloc)."""
    return any(os.environ.get(v) for v in ENV) or "malloc" in os.environ.get("LD_PRELOAD", "")


def keep_freed_memory(keep_mb: int = 256) -> bool:
    """Keep up to `keep_mb` MB of freed memory for reuse and serve blocks up to 32 MB from it.
    Returns whether it applied: not off glibc, with keep_mb 0, or where the user tuned the
    allocator already (MALLOC_* variables or GLIBC_TUNABLES, a preloaded allocator), which it
    leaves alone."""
    if keep_mb <= 0 or not sys.platform.startswith("linux") or user_tuned():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, min(MMAP_MAX, keep_mb << 20)) == 1
    ok = mallopt(M_TRIM_THRESHOLD, keep_mb << 20) == 1 and ok
    if not ok:
        log.debug("ringps: mallopt refused the thresholds; glibc's defaults stay")
    return ok
