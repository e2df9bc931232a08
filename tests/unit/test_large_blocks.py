"""The operator gives blocks of 128 KiB and more back to the system once freed
(``give_back_large_blocks``), blocks glibc otherwise takes from its heap once its mmap threshold
has risen, and the heap keeps; and a TLS read's block stays under that threshold, since a mapping
of its own for each read costs three times the CPU of reading (BENCHMARKS.md, fourteenth round).
Each case runs in a fresh interpreter, whose allocator state no other test has touched;
``mallinfo2`` (glibc 2.33+) says how many bytes are mapped blocks of their own (``hblkhd``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCKS = 16
PROBE = f"""
import ctypes, sys
BLOCKS = {BLOCKS}
from dispatch._kube.main import TLS_READ_SIZE, give_back_large_blocks

FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in FIELDS.split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
block = bytearray(4 << 20)
del block  # freed: glibc raises its threshold past 4 MiB (the dynamic threshold)
if sys.argv[1] == "given":
    give_back_large_blocks()
libc.malloc_trim(0)  # the heap's free top given back: the next block cannot come from it
before = libc.mallinfo2().hblkhd
size = TLS_READ_SIZE if sys.argv[2] == "read" else 256 * 1024
# What each TLS read allocates (ssl's read(n)), or a large block; several, since a free chunk
# left inside the heap by the imports (hash randomization varies them) may serve one.
blocks = [bytes(size) for _ in range(BLOCKS)]
print(libc.mallinfo2().hblkhd - before)
"""


def mapped(mode: str, block: str = "large") -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, block], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_large_block_is_mapped_by_itself_and_so_given_back() -> None:
    assert mapped("given") >= BLOCKS // 2 * 256 * 1024
    assert mapped("default") == 0  # without it, from the heap, which keeps it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_tls_read_comes_from_the_heap() -> None:
    assert mapped("given", "read") == 0
