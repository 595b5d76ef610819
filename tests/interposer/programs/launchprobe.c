/* A CUDA program that launches fixed-length kernels on the fake driver, for the compute tests.
 *
 *   launchprobe SECONDS KERNEL_US [API] [VIA] [SYNC_EVERY] [GAP_US]
 *     API: launch (cuLaunchKernel), ptsz (cuLaunchKernel_ptsz on the per-thread default stream),
 *          ex (cuLaunchKernelEx), coop (cuLaunchCooperativeKernel), graph (cuGraphLaunch)
 *     VIA: direct (linked calls) or proc (cuGetProcAddress_v2, as the CUDA runtime resolves them)
 *     SYNC_EVERY: every N launches, wait for the previous N to finish (one batch stays queued, so a
 *             late wake-up of this process does not leave the GPU idle); 0: only at the end
 *     GAP_US: instead, wait for the stream to drain every SYNC_EVERY launches (default 1) and then
 *             idle the CPU this long (a program that is not busy all the time)
 * It launches for SECONDS of wall time, then waits for the GPU. Output lines (CLOCK_MONOTONIC ns):
 *   start T0 / s T COMPLETED (at each wait: launches finished by T) / end T1 LAUNCHES
 * The GPU time it got is LAUNCHES * KERNEL_US over T1 - T0.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe_cuda.h"

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void **, void **);
typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void **);
typedef CUresult (*graph_t)(CUgraphExec, CUstream);
typedef CUresult (*sync_t)(CUstream);

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: launchprobe SECONDS KERNEL_US [API] [VIA] [SYNC_EVERY] [GAP_US]\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    unsigned long long us = strtoull(argv[2], NULL, 10);
    const char *api = argc > 3 ? argv[3] : "launch";
    const char *via = argc > 4 ? argv[4] : "direct";
    long gap_us = argc > 6 ? atol(argv[6]) : 0;
    long sync_every = argc > 5 ? atol(argv[5]) : 0;
    if (gap_us && !sync_every)
        sync_every = 1;
    int ptsz = !strcmp(api, "ptsz");

    CUdevice dev;
    CUcontext ctx;
    CUstream stream = NULL;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev)) {
        printf("error init\n");
        return 1;
    }
    if (!ptsz && cuStreamCreate(&stream, 0)) {
        printf("error stream\n");
        return 1;
    }
    launch_t launch = cuLaunchKernel;
    launch_ex_t launch_ex = cuLaunchKernelEx;
    coop_t coop = cuLaunchCooperativeKernel;
    graph_t graph = cuGraphLaunch;
    sync_t sync = ptsz ? cuStreamSynchronize_ptsz : cuStreamSynchronize;
    if (!strcmp(via, "proc") || ptsz) {
        uint64_t flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
        int st;
        if (cuGetProcAddress_v2("cuLaunchKernel", (void **)&launch, 12000, flags, &st) ||
            cuGetProcAddress_v2("cuLaunchKernelEx", (void **)&launch_ex, 12000, flags, &st) ||
            cuGetProcAddress_v2("cuLaunchCooperativeKernel", (void **)&coop, 12000, flags, &st) ||
            cuGetProcAddress_v2("cuGraphLaunch", (void **)&graph, 12000, flags, &st) ||
            cuGetProcAddress_v2("cuStreamSynchronize", (void **)&sync, 12000, flags, &st)) {
            printf("error cuGetProcAddress\n");
            return 1;
        }
    }
    CUfunction f = (CUfunction)(uintptr_t)us; /* the fake's kernels last their handle in microseconds */
    CUlaunchConfig cfg = {1, 1, 1, 1, 1, 1, 0, stream, NULL, 0};

    CUevent batch[2] = {NULL, NULL};
    if (sync_every && !gap_us && (cuEventCreate(&batch[0], 0) || cuEventCreate(&batch[1], 0))) {
        printf("error events\n");
        return 1;
    }
    CUstream ev_stream = ptsz ? (CUstream)0x2 : stream; /* the per-thread default stream's handle */
    unsigned long long t0 = now_ns(), end_at = t0 + (unsigned long long)(seconds * 1e9), launches = 0, batches = 0;
    printf("start %llu\n", t0);
    while (now_ns() < end_at) {
        CUresult rc;
        if (!strcmp(api, "ex"))
            rc = launch_ex(&cfg, f, NULL, NULL);
        else if (!strcmp(api, "coop"))
            rc = coop(f, 1, 1, 1, 1, 1, 1, 0, stream, NULL);
        else if (!strcmp(api, "graph"))
            rc = graph((CUgraphExec)(uintptr_t)us, stream);
        else
            rc = launch(f, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
        if (rc != CUDA_SUCCESS) {
            printf("error launch %d\n", rc);
            return 1;
        }
        launches++;
        if (sync_every && launches % (unsigned long long)sync_every == 0) {
            if (gap_us) {
                sync(stream);
                printf("s %llu %llu\n", now_ns(), launches);
                struct timespec ts = {gap_us / 1000000, (gap_us % 1000000) * 1000};
                nanosleep(&ts, NULL);
            } else {
                cuEventRecord(batch[batches % 2], ev_stream);
                if (batches++) {
                    cuEventSynchronize(batch[batches % 2]);
                    printf("s %llu %llu\n", now_ns(), launches - (unsigned long long)sync_every);
                }
            }
        }
    }
    sync(stream);
    printf("end %llu %llu\n", now_ns(), launches);
    return 0;
}
