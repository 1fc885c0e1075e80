/*
 * alloc_count.c -- a counting allocator for the Python tests, loaded with LD_PRELOAD (libmxfp8_alloc_count.so in
 * the build directory; tests/python/test_torch_buffers.py runs a training loop under it).
 *
 * It interposes malloc, calloc, realloc, aligned_alloc, posix_memalign and memalign, forwards each to the next
 * definition (glibc's), and counts the calls made from code of a shared object whose file name contains
 * "libmxfp8" (the caller's return address, looked up with dladdr): the library's own allocations, not torch's,
 * Python's or the OpenMP runtime's. mxfp8_alloc_count() returns the count so far (ctypes reads it from the
 * process's global symbols). dlsym may allocate while the real functions are looked up: those first calls are
 * served from a small static arena.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static void (*real_free)(void *);

static atomic_llong g_count;
static _Thread_local int t_inside; /* dladdr itself may allocate: do not classify those calls */
static int g_resolving;

static _Alignas(64) unsigned char g_boot[1 << 16];
static size_t g_boot_used;

static void *boot_alloc(size_t n) {
    n = (n + 63) & ~(size_t)63;
    if (g_boot_used + n > sizeof g_boot) return NULL;
    void *p = g_boot + g_boot_used;
    g_boot_used += n;
    return p;
}

static int in_boot(const void *p) {
    return (const unsigned char *)p >= g_boot && (const unsigned char *)p < g_boot + sizeof g_boot;
}

static void resolve(void) {
    if (real_malloc || g_resolving) return;
    g_resolving = 1;
    real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    real_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
    real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    real_memalign = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "memalign");
    real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    g_resolving = 0;
}

static void classify(const void *caller) {
    if (t_inside) return;
    t_inside = 1;
    Dl_info info;
    if (dladdr(caller, &info) && info.dli_fname && strstr(info.dli_fname, "libmxfp8")) atomic_fetch_add(&g_count, 1);
    t_inside = 0;
}

long long mxfp8_alloc_count(void) { return atomic_load(&g_count); }

void *malloc(size_t n) {
    resolve();
    if (!real_malloc) return boot_alloc(n);
    classify(__builtin_return_address(0));
    return real_malloc(n);
}

void *calloc(size_t a, size_t b) {
    resolve();
    if (!real_calloc || g_resolving) {
        void *p = boot_alloc(a * b);
        return p; /* the static arena is zero */
    }
    classify(__builtin_return_address(0));
    return real_calloc(a, b);
}

void *realloc(void *q, size_t n) {
    resolve();
    classify(__builtin_return_address(0));
    if (in_boot(q)) { /* never happens in practice; copy out of the arena */
        void *p = real_malloc(n);
        if (p) memcpy(p, q, n < sizeof g_boot ? n : sizeof g_boot);
        return p;
    }
    return real_realloc(q, n);
}

void *aligned_alloc(size_t al, size_t n) {
    resolve();
    classify(__builtin_return_address(0));
    return real_aligned_alloc(al, n);
}

int posix_memalign(void **p, size_t al, size_t n) {
    resolve();
    classify(__builtin_return_address(0));
    return real_posix_memalign(p, al, n);
}

void *memalign(size_t al, size_t n) {
    resolve();
    classify(__builtin_return_address(0));
    return real_memalign(al, n);
}

void free(void *p) {
    if (!p || in_boot(p)) return;
    resolve();
    real_free(p);
}
