"""Freed memory kept in the process for reuse (glibc's malloc): what `vaswani-translate` and `training/run.py` do
at start, and what a program of yours can do with `vaswani_hf.keep_freed_memory()` (or, without code, the
environment `MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824`).

On the CPU, torch allocates every tensor from the C library. glibc's malloc serves blocks above a threshold (128
KiB, raised as such blocks are freed, up to 32 MiB) by mapping fresh pages, and gives freed memory at the top of
its heap back to the system; the next block of that size is faulted in again page by page. A decoding step frees
and allocates several (beams x vocabulary) blocks — 9.5 MB each at transformer-base size, beam 4, 16 sentences —
and a training step larger ones: at base size a beam-4 `generate()` of 16 sentences takes over 200,000 page
faults, and without them the part of the call outside the model takes half the time (README, Speed). Kept, the
freed blocks are reused with their pages in place: the process keeps its peak memory, as torch's caching allocator
does on GPUs.
"""

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
KEEP_BYTES = 1 << 30


def keep_freed_memory(limit: int = KEEP_BYTES) -> bool:
    """Blocks up to `limit` bytes come from the process's heap, and freed memory stays there for reuse (up to
    `limit` bytes free at its top). Applies to the whole process and cannot be undone; returns False (and changes
    nothing) where the C library is not glibc."""
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc only: other C libraries' mallopt differs or does nothing
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, limit)) and bool(libc.mallopt(M_TRIM_THRESHOLD, limit))
