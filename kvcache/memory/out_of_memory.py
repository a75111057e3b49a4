"""Whether an exception is the device refusing memory (does not fit, exit 3) or something else (a bug).

torch raises `torch.cuda.OutOfMemoryError` on CUDA; its CPU allocator raises a plain
RuntimeError ("DefaultCPUAllocator: can't allocate memory" from posix_memalign, "... not enough
memory" elsewhere), a host mapping that the kernel refuses is an OSError with ENOMEM, and the CUDA
driver refusing a resizable pool's physical memory is a VmmOutOfMemoryError.
Any other RuntimeError (a kernel that will not launch, a bad view) is not out of memory.
"""

from __future__ import annotations

import errno
import sys

from kvcache.errors import VmmOutOfMemoryError

HOST_ALLOCATOR_REFUSALS = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """True only when a device or the host refused an allocation. torch's own error is looked up, not imported:
    torch raised it only if it is loaded, and a dry run's failure must not load it to say so."""
    torch = sys.modules.get("torch")
    device_refusal = (torch.cuda.OutOfMemoryError,) if torch is not None else ()
    if isinstance(exc, (*device_refusal, MemoryError, VmmOutOfMemoryError)):
        return True
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOMEM
    return isinstance(exc, RuntimeError) and any(refusal in str(exc) for refusal in HOST_ALLOCATOR_REFUSALS)
