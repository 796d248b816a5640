"""ringps.malloc: freed memory is kept for reuse where asked, and left alone where the user tuned
the allocator already. Each case runs in a fresh interpreter (mallopt changes the process)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")

# allocate and free 24 MB (above glibc's default mmap threshold): returned to the OS at once by
# default; kept (resident) once freed memory is kept for reuse
PROBE = textwrap.dedent("""
    import ctypes, os, sys
    from ringps.malloc import keep_freed_memory
    applied = keep_freed_memory(int(sys.argv[1]))
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    def resident_mb():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    n = 24 << 20
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)  # touch every page
    touched = resident_mb()
    libc.free(p)
    print(applied, round(touched - resident_mb(), 1))
""")


def probe(keep_mb: int, **env: str) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(keep_mb)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env}, check=True).stdout.split()
    return out[0] == "True", float(out[1])


def test_freed_memory_is_kept_for_reuse():
    applied, given_back = probe(256)
    assert applied
    assert given_back < 4  # MB: the 24 MB stayed resident for the next step's tensors


def test_glibcs_defaults_give_a_large_block_back():
    applied, given_back = probe(0)  # 0: leave glibc alone (--malloc-keep-mb 0)
    assert not applied
    assert given_back > 20  # the reason for the module: the pages go, and fault back next time


def test_a_user_tuned_allocator_is_left_alone():
    applied, given_back = probe(256, MALLOC_MMAP_THRESHOLD_="131072")
    assert not applied
    assert given_back > 20  # the user's threshold holds
    applied, _ = probe(256, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072")
    assert not applied


def test_a_preload_that_is_no_allocator_does_not_count(monkeypatch):
    from ringps.malloc import ENV, user_tuned

    for v in ENV:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/faketime/libfaketime.so.1")
    assert not user_tuned()
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert user_tuned()
