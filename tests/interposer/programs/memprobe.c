/* A CUDA program driven line by line on stdin, for the interposer's memory tests.
 *
 * It is linked against libcuda.so.1 (calls bind to the interposer under LD_PRELOAD) and can also
 * reach every allocation entry point through dlsym on a dlopen'ed libcuda and through
 * cuGetProcAddress, as the CUDA runtime does. Commands (one answer line each):
 *   init                                -> ok
 *   alloc KIND BYTES [direct|dlsym|proc] -> ok ID | err CODE    KIND: mem pitch managed async pool vmm
 *                                                                     array array3d mipmap
 *   free ID                             -> ok | err CODE
 *   info [VIA]                          -> info FREE TOTAL      (cuMemGetInfo_v2)
 *   total [VIA]                         -> total BYTES          (cuDeviceTotalMem_v2)
 *   fill KIND CHUNK [VIA]               -> filled N             (allocates until refused)
 *   churn CHUNK                         -> churning, then allocates and frees until killed
 *   calls                               -> calls N              (allocation calls that reached the driver)
 *   sym NAME                            -> sym wrapper|real|other   (dlsym(libcuda, NAME))
 *   proc NAME VERSION FLAGS EXACT [v1]  -> proc RC wrapper|real|other  (cuGetProcAddress(_v2); EXACT is the
 *                                          exported name the answer should stand for)
 *   quit
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe_cuda.h"

typedef CUresult (*gpa2_t)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*gpa1_t)(const char *, void **, int, uint64_t);

struct api {
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*mfree)(CUdeviceptr);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*array)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*array3d)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*array_destroy)(CUarray);
    CUresult (*mipmap)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
    CUresult (*mipmap_destroy)(CUmipmappedArray);
    CUresult (*info)(size_t *, size_t *);
    CUresult (*total)(size_t *, CUdevice);
};

static struct api direct, viadlsym, viaproc;
static void *libcuda;
static gpa2_t gpa2;
static gpa1_t gpa1;
static CUmemoryPool pool;
static CUstream stream;

struct held {
    int used;
    int kind;
    struct api *api;
    unsigned long long handle;
};
static struct held held[4096];

static __typeof__(&fake_cuda_lookup) fake_lookup; /* looked up: a real driver has neither */
static __typeof__(&fake_cuda_stats) fake_stats;

static void setup_apis(void) {
    direct = (struct api){cuMemAlloc_v2,
                          cuMemAllocPitch_v2,
                          cuMemAllocManaged,
                          cuMemAllocAsync,
                          cuMemAllocFromPoolAsync,
                          cuMemFree_v2,
                          cuMemFreeAsync,
                          cuMemCreate,
                          cuMemRelease,
                          cuArrayCreate_v2,
                          cuArray3DCreate_v2,
                          cuArrayDestroy,
                          cuMipmappedArrayCreate,
                          cuMipmappedArrayDestroy,
                          cuMemGetInfo_v2,
                          cuDeviceTotalMem_v2};
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!libcuda) {
        printf("error dlopen %s\n", dlerror());
        exit(1);
    }
#define D(field, name) *(void **)&viadlsym.field = dlsym(libcuda, name)
    D(alloc, "cuMemAlloc_v2");
    D(pitch, "cuMemAllocPitch_v2");
    D(managed, "cuMemAllocManaged");
    D(async, "cuMemAllocAsync");
    D(pool, "cuMemAllocFromPoolAsync");
    D(mfree, "cuMemFree_v2");
    D(free_async, "cuMemFreeAsync");
    D(create, "cuMemCreate");
    D(release, "cuMemRelease");
    D(array, "cuArrayCreate_v2");
    D(array3d, "cuArray3DCreate_v2");
    D(array_destroy, "cuArrayDestroy");
    D(mipmap, "cuMipmappedArrayCreate");
    D(mipmap_destroy, "cuMipmappedArrayDestroy");
    D(info, "cuMemGetInfo_v2");
    D(total, "cuDeviceTotalMem_v2");
#undef D
    /* as the CUDA 12 runtime does: cuGetProcAddress from dlsym, then its _v2 from itself */
    *(void **)&gpa1 = dlsym(libcuda, "cuGetProcAddress");
    void *p = NULL;
    if (!gpa1 || gpa1("cuGetProcAddress", &p, 12000, 0) != CUDA_SUCCESS || !p) {
        printf("error no cuGetProcAddress_v2\n");
        exit(1);
    }
    gpa2 = (gpa2_t)p;
    int st;
#define P(field, name, ver) gpa2(name, (void **)&viaproc.field, ver, 0, &st)
    P(alloc, "cuMemAlloc", 12000);
    P(pitch, "cuMemAllocPitch", 12000);
    P(managed, "cuMemAllocManaged", 12000);
    P(async, "cuMemAllocAsync", 12000);
    P(pool, "cuMemAllocFromPoolAsync", 12000);
    P(mfree, "cuMemFree", 12000);
    P(free_async, "cuMemFreeAsync", 12000);
    P(create, "cuMemCreate", 12000);
    P(release, "cuMemRelease", 12000);
    P(array, "cuArrayCreate", 12000);
    P(array3d, "cuArray3DCreate", 12000);
    P(array_destroy, "cuArrayDestroy", 12000);
    P(mipmap, "cuMipmappedArrayCreate", 12000);
    P(mipmap_destroy, "cuMipmappedArrayDestroy", 12000);
    P(info, "cuMemGetInfo", 12000);
    P(total, "cuDeviceTotalMem", 12000);
#undef P
    *(void **)&fake_lookup = dlsym(libcuda, "fake_cuda_lookup");
    *(void **)&fake_stats = dlsym(libcuda, "fake_cuda_stats");
}

static struct api *pick(const char *via) {
    if (!via || !strcmp(via, "direct"))
        return &direct;
    if (!strcmp(via, "dlsym"))
        return &viadlsym;
    return &viaproc;
}

enum { K_MEM, K_PITCH, K_MANAGED, K_ASYNC, K_POOL, K_VMM, K_ARRAY, K_ARRAY3D, K_MIPMAP };
static const char *const kinds[] = {"mem", "pitch", "managed", "async",  "pool",
                                    "vmm", "array", "array3d", "mipmap", NULL};

/* Sizes are chosen so that the interposer's estimate is exact for multiples of 1 MiB. */
static CUresult do_alloc(struct api *a, int kind, unsigned long long bytes, unsigned long long *handle) {
    CUdeviceptr p = 0;
    CUresult rc;
    switch (kind) {
    case K_MEM:
        rc = a->alloc(&p, bytes);
        break;
    case K_PITCH: {
        size_t pitch = 0;
        rc = a->pitch(&p, &pitch, bytes / 16, 16, 4);
        break;
    }
    case K_MANAGED:
        rc = a->managed(&p, bytes, 1);
        break;
    case K_ASYNC:
        rc = a->async(&p, bytes, stream);
        break;
    case K_POOL:
        rc = a->pool(&p, bytes, pool, stream);
        break;
    case K_VMM: {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        prop.location.type = 1;
        prop.location.id = 0;
        CUmemGenericAllocationHandle h = 0;
        rc = a->create(&h, bytes, &prop, 0);
        p = h;
        break;
    }
    case K_ARRAY: {
        CUDA_ARRAY_DESCRIPTOR d = {bytes / (4 * 256), 256, CU_AD_FORMAT_FLOAT, 1};
        CUarray arr = NULL;
        rc = a->array(&arr, &d);
        p = (CUdeviceptr)(uintptr_t)arr;
        break;
    }
    case K_ARRAY3D:
    case K_MIPMAP: {
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes / (4 * 64 * 4), 64, 4, CU_AD_FORMAT_FLOAT, 1, 0};
        if (kind == K_ARRAY3D) {
            CUarray arr = NULL;
            rc = a->array3d(&arr, &d);
            p = (CUdeviceptr)(uintptr_t)arr;
        } else {
            CUmipmappedArray m = NULL;
            rc = a->mipmap(&m, &d, 1);
            p = (CUdeviceptr)(uintptr_t)m;
        }
        break;
    }
    default:
        return 1;
    }
    *handle = p;
    return rc;
}

static CUresult do_free(struct held *h) {
    struct api *a = h->api;
    switch (h->kind) {
    case K_ASYNC:
    case K_POOL:
        return a->free_async(h->handle, stream);
    case K_VMM:
        return a->release(h->handle);
    case K_ARRAY:
    case K_ARRAY3D:
        return a->array_destroy((CUarray)(uintptr_t)h->handle);
    case K_MIPMAP:
        return a->mipmap_destroy((CUmipmappedArray)(uintptr_t)h->handle);
    default:
        return a->mfree(h->handle);
    }
}

static int kind_of(const char *name) {
    for (int i = 0; kinds[i]; i++)
        if (!strcmp(kinds[i], name))
            return i;
    return -1;
}

static int keep(int kind, struct api *a, unsigned long long handle) {
    for (int i = 0; i < (int)(sizeof held / sizeof held[0]); i++) {
        if (!held[i].used) {
            held[i] = (struct held){1, kind, a, handle};
            return i;
        }
    }
    return -1;
}

static const char *classify(void *got, const char *exact) {
    void *real = fake_lookup ? fake_lookup(exact) : NULL;
    void *exported = dlsym(RTLD_DEFAULT, exact); /* the interposer's export when it is preloaded */
    if (got && got == real)
        return "real";
    if (got && got == exported)
        return "wrapper";
    return "other";
}

int main(void) {
    char line[512];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32] = "", a1[128] = "", a2[128] = "", a3[128] = "", a4[128] = "", a5[16] = "";
        int n = sscanf(line, "%31s %127s %127s %127s %127s %15s", cmd, a1, a2, a3, a4, a5);
        if (n <= 0)
            continue;
        if (!strcmp(cmd, "init")) {
            CUdevice dev;
            CUcontext ctx;
            if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev) || cuStreamCreate(&stream, 0)) {
                printf("err init\n");
                continue;
            }
            setup_apis();
            cuDeviceGetDefaultMemPool(&pool, dev);
            printf("ok\n");
        } else if (!strcmp(cmd, "alloc")) {
            int k = kind_of(a1);
            struct api *a = pick(n > 3 ? a3 : NULL);
            unsigned long long h = 0;
            CUresult rc = do_alloc(a, k, strtoull(a2, NULL, 10), &h);
            if (rc == CUDA_SUCCESS)
                printf("ok %d\n", keep(k, a, h));
            else
                printf("err %d\n", rc);
        } else if (!strcmp(cmd, "free")) {
            int id = atoi(a1);
            if (id < 0 || id >= (int)(sizeof held / sizeof held[0]) || !held[id].used) {
                printf("err bad id\n");
                continue;
            }
            CUresult rc = do_free(&held[id]);
            held[id].used = 0;
            if (rc == CUDA_SUCCESS)
                printf("ok\n");
            else
                printf("err %d\n", rc);
        } else if (!strcmp(cmd, "info")) {
            size_t f = 0, t = 0;
            CUresult rc = pick(n > 1 ? a1 : NULL)->info(&f, &t);
            if (rc)
                printf("err %d\n", rc);
            else
                printf("info %zu %zu\n", f, t);
        } else if (!strcmp(cmd, "total")) {
            size_t t = 0;
            CUresult rc = pick(n > 1 ? a1 : NULL)->total(&t, 0);
            if (rc)
                printf("err %d\n", rc);
            else
                printf("total %zu\n", t);
        } else if (!strcmp(cmd, "fill")) {
            int k = kind_of(a1), count = 0;
            struct api *a = pick(n > 3 ? a3 : NULL);
            unsigned long long h;
            while (do_alloc(a, k, strtoull(a2, NULL, 10), &h) == CUDA_SUCCESS && keep(k, a, h) >= 0)
                count++;
            printf("filled %d\n", count);
        } else if (!strcmp(cmd, "churn")) {
            unsigned long long chunk = strtoull(a1, NULL, 10), h;
            printf("churning\n");
            for (;;) { /* fill up, give half back, again: always mid-allocation */
                int ids[4096], count = 0;
                while (count < 4096 && do_alloc(&direct, K_MEM, chunk, &h) == CUDA_SUCCESS)
                    ids[count++] = keep(K_MEM, &direct, h);
                for (int i = 0; i < count / 2; i++) {
                    do_free(&held[ids[i]]);
                    held[ids[i]].used = 0;
                }
            }
        } else if (!strcmp(cmd, "calls")) {
            uint64_t c = 0;
            if (fake_stats)
                fake_stats(&c, NULL, NULL);
            printf("calls %llu\n", (unsigned long long)c);
        } else if (!strcmp(cmd, "sym")) {
            printf("sym %s\n", classify(dlsym(libcuda, a1), a1));
        } else if (!strcmp(cmd, "proc")) {
            void *p = NULL;
            int st = -1;
            int version = atoi(a2);
            uint64_t flags = strtoull(a3, NULL, 10);
            CUresult rc = n > 5 && !strcmp(a5, "v1") ? gpa1(a1, &p, version, flags) : gpa2(a1, &p, version, flags, &st);
            printf("proc %d %s\n", rc, classify(p, a4));
        } else if (!strcmp(cmd, "quit")) {
            return 0;
        } else {
            printf("err unknown command\n");
        }
    }
    return 0;
}
