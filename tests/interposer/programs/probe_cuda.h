/* The driver API as the test programs and the fake driver see it (no CUDA headers on the test
 * machines): the interposer's own types and entry-point lists (lp_cuda_types.h and lp_hooks.h in
 * node_agent/sharing/interposer, on the include path), and the entry points the tests use besides. */
#ifndef PROBE_CUDA_H
#define PROBE_CUDA_H
#include <stddef.h>
#include <stdint.h>

#include "lp_cuda_types.h"
#include "lp_hooks.h"

#define PROBE_DECLARE(name, args) CUresult name args;
#define PROBE_DECLARE_HOOKED(name, family, since, per_thread, args) PROBE_DECLARE(name, args)
LP_HOOKED_FUNCS(PROBE_DECLARE_HOOKED)
LP_HELPER_FUNCS(PROBE_DECLARE)
#undef PROBE_DECLARE_HOOKED
#undef PROBE_DECLARE

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamSynchronize_ptsz(CUstream);
CUresult cuEventSynchronize(CUevent);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);

/* the fake driver's own, for the tests (fake_cuda/fake_libcuda.c) */
void *fake_cuda_lookup(const char *exact);
void fake_cuda_stats(uint64_t *alloc_calls, uint64_t *launches, uint64_t *busy_ns);
#endif
