"""A Python CUDA program (ctypes on libcuda.so.1) for the interposer tests.

Run under LD_PRELOAD with the fake driver on LD_LIBRARY_PATH and a memory cap; argv[1] is the cap in
MiB. It resolves the allocation entry points both directly (ctypes' dlsym on libcuda) and through
cuGetProcAddress_v2, allocates up to and past the cap both ways, and prints one JSON object with
what it saw. It asserts nothing itself: the test reads the JSON.
"""

from __future__ import annotations

import ctypes
import json
import sys

MIB = 1 << 20

# The driver's types as ctypes sees them: CUresult an int, CUdeviceptr an unsigned long long, as declared
# in node_agent/sharing/interposer/lp_cuda_types.h (the header the interposer, the fake driver and the
# C probes all compile against); keep the two in step.
CUresult = ctypes.c_int
ALLOC = ctypes.CFUNCTYPE(CUresult, ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t)
FREE = ctypes.CFUNCTYPE(CUresult, ctypes.c_ulonglong)
INFO = ctypes.CFUNCTYPE(CUresult, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))


def address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def main() -> None:
    cap = int(sys.argv[1]) * MIB
    lib = ctypes.CDLL("libcuda.so.1")
    lib.fake_cuda_lookup.restype = ctypes.c_void_p
    lib.fake_cuda_lookup.argtypes = [ctypes.c_char_p]
    out: dict[str, object] = {}

    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    out["init"] = [
        lib.cuInit(0),
        lib.cuDeviceGet(ctypes.byref(dev), 0),
        lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev),
    ]

    direct_alloc = ALLOC(address(lib.cuMemAlloc_v2))
    direct_free = FREE(address(lib.cuMemFree_v2))
    direct_info = INFO(address(lib.cuMemGetInfo_v2))
    real = lib.fake_cuda_lookup(b"cuMemAlloc_v2")
    exported = ctypes.cast(ctypes.CDLL(None).cuMemAlloc_v2, ctypes.c_void_p).value
    out["direct_is_wrapper"] = address(lib.cuMemAlloc_v2) == exported and exported != real

    gpa = lib.cuGetProcAddress_v2
    gpa.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_int),
    ]

    def proc(name: str, version: int = 12000) -> int:
        p, status = ctypes.c_void_p(), ctypes.c_int()
        rc = gpa(name.encode(), ctypes.byref(p), version, 0, ctypes.byref(status))
        return (p.value or 0) if rc == 0 else 0

    out["proc_is_wrapper"] = proc("cuMemAlloc") == exported
    proc_alloc, proc_free, proc_info = (
        ALLOC(proc("cuMemAlloc")),
        FREE(proc("cuMemFree")),
        INFO(proc("cuMemGetInfo")),
    )

    half = cap // 2
    a, b, c = ctypes.c_ulonglong(), ctypes.c_ulonglong(), ctypes.c_ulonglong()
    out["alloc_half_direct"] = direct_alloc(ctypes.byref(a), half)
    out["alloc_half_proc"] = proc_alloc(ctypes.byref(b), half)
    out["past_cap_direct"] = direct_alloc(ctypes.byref(c), MIB)
    out["past_cap_proc"] = proc_alloc(ctypes.byref(c), MIB)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    out["info_full_direct"] = [direct_info(ctypes.byref(free), ctypes.byref(total)), free.value, total.value]
    out["info_full_proc"] = [proc_info(ctypes.byref(free), ctypes.byref(total)), free.value, total.value]
    out["free_proc"] = proc_free(b)
    out["info_after_free"] = [direct_info(ctypes.byref(free), ctypes.byref(total)), free.value, total.value]
    out["free_direct"] = direct_free(a)
    out["info_empty"] = [proc_info(ctypes.byref(free), ctypes.byref(total)), free.value, total.value]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
