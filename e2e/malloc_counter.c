/*
 * malloc_counter.c: counts a process's heap allocations, for e2e/allocation_test.py (issue 31,
 * in the style of swift-nio's allocation-counter tests).
 *
 * Built by the test with `cc -O2 -shared -fPIC` and loaded into the release server with LD_PRELOAD.
 * It defines malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign, valloc, pvalloc
 * and free; each passes the call on to glibc's own entry points (__libc_malloc and friends,
 * exported by glibc for exactly this), so no dlsym is needed and nothing allocates before the
 * counter exists. free is passed on and not counted.
 *
 * The counter is shared with the test through a file: at load time the constructor maps
 * $FORGE_MALLOC_COUNTER (created and sized by the constructor) as one page of 64-bit words:
 *
 *   word 0  allocations: every call of the functions above but free (realloc included, whether
 *           it grows in place or moves; realloc(NULL, n) is a malloc and counted once)
 *   word 1  bytes asked for by those calls
 *   word 2  trace switch, written by the test: while it is non-zero, each counted allocation also
 *           writes a backtrace (glibc's backtrace_symbols_fd) to standard error, to find where a
 *           path allocates when the budget is exceeded
 *
 * The words are updated with relaxed atomic adds; the test reads them between its requests, when
 * the process is quiet. Allocations before the constructor ran (the dynamic loader's) are not
 * counted. Without $FORGE_MALLOC_COUNTER the shim counts nothing and only passes calls on.
 */
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern void __libc_free(void *);

static _Atomic uint64_t *words; /* NULL until the constructor maps the file */
static __thread int tracing;    /* a backtrace's own allocations are not traced again */

__attribute__((constructor)) static void map_counter(void) {
    const char *path = getenv("FORGE_MALLOC_COUNTER");
    if (path == NULL || *path == 0) return;
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return;
    if (ftruncate(fd, 4096) == 0) {
        void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (page != MAP_FAILED) words = page;
    }
    close(fd);
}

static void count(size_t bytes) {
    _Atomic uint64_t *w = words;
    if (w == NULL) return;
    atomic_fetch_add_explicit(&w[0], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&w[1], bytes, memory_order_relaxed);
    if (atomic_load_explicit(&w[2], memory_order_relaxed) != 0 && !tracing) {
        tracing = 1;
        void *frames[24];
        int depth = backtrace(frames, 24);
        static const char mark[] = "malloc_counter: allocation at\n";
        (void)!write(2, mark, sizeof mark - 1);
        backtrace_symbols_fd(frames, depth, 2);
        tracing = 0;
    }
}

void *malloc(size_t size) {
    count(size);
    return __libc_malloc(size);
}

void *calloc(size_t n, size_t size) {
    count(n * size);
    return __libc_calloc(n, size);
}

void *realloc(void *old, size_t size) {
    count(size);
    return __libc_realloc(old, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0) return 22; /* EINVAL */
    count(size);
    void *p = __libc_memalign(alignment, size);
    if (p == NULL) return 12; /* ENOMEM */
    *out = p;
    return 0;
}

void *aligned_alloc(size_t alignment, size_t size) {
    count(size);
    return __libc_memalign(alignment, size);
}

void *memalign(size_t alignment, size_t size) {
    count(size);
    return __libc_memalign(alignment, size);
}

void *valloc(size_t size) {
    count(size);
    return __libc_valloc(size);
}

void *pvalloc(size_t size) {
    count(size);
    return __libc_pvalloc(size);
}

void free(void *p) { __libc_free(p); }
