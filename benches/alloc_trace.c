/* An LD_PRELOAD shim for benches/alloc_trace.py: records the allocations made between
 * fxc_trace_on() and fxc_trace_off(path), with the RSS after each large one and where it came
 * from, so that a call's peak memory can be taken apart block by block.
 *
 * Every malloc, calloc, realloc, posix_memalign, aligned_alloc and free is passed on to glibc;
 * while tracing, each is noted in a fixed array (nothing is allocated while noting). Events of
 * FXC_TRACE_MIN bytes or more (default 2000) also note the anonymous RSS (/proc/self/statm,
 * read with plain system calls) and a backtrace of up to DEPTH return addresses. fxc_trace_off writes one
 * line per event: `op size new_size ptr result rss_pages addr...`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EVENTS 200000
#define TRACED 4000
#define DEPTH 10

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

struct event {
    char op;
    size_t size, new_size;
    void *ptr, *result;
    long rss;
    int trace;
};

static struct event events[EVENTS];
static void *traces[TRACED][DEPTH];
static int depths[TRACED];
static int n_events, n_traces, on;
static size_t min_size = 2000;
static __thread int inside;

static long rss_pages(void) {
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    /* size resident shared ...: anonymous pages are resident - shared (the unwinder reads
     * the libraries' unwind tables, file pages that would otherwise count). */
    char *p;
    strtol(buf, &p, 10);
    long resident = strtol(p, &p, 10);
    return resident - strtol(p, NULL, 10);
}

/* Threads allocate concurrently (the core's helper and emitter threads): slots are claimed
 * atomically, so each record is written by one thread. */
static void note(char op, size_t size, size_t new_size, void *ptr, void *result) {
    if (!on || inside) return;
    int i = __atomic_fetch_add(&n_events, 1, __ATOMIC_RELAXED);
    if (i >= EVENTS) return;
    inside = 1;
    struct event *e = &events[i];
    e->op = op;
    e->size = size;
    e->new_size = new_size;
    e->ptr = ptr;
    e->result = result;
    e->rss = -1;
    e->trace = -1;
    if (size >= min_size || new_size >= min_size) {
        int t = __atomic_fetch_add(&n_traces, 1, __ATOMIC_RELAXED);
        if (t < TRACED) {
            e->rss = rss_pages();
            depths[t] = backtrace(traces[t], DEPTH);
            e->trace = t;
        }
    }
    inside = 0;
}

void *malloc(size_t s) {
    void *r = __libc_malloc(s);
    note('m', s, 0, NULL, r);
    return r;
}

void *calloc(size_t a, size_t b) {
    void *r = __libc_calloc(a, b);
    note('c', a * b, 0, NULL, r);
    return r;
}

void *realloc(void *p, size_t s) {
    size_t old = p ? malloc_usable_size(p) : 0;
    void *r = __libc_realloc(p, s);
    note('r', old, s, p, r);
    return r;
}

int posix_memalign(void **out, size_t align, size_t s) {
    void *r = __libc_memalign(align, s);
    if (!r) return ENOMEM;
    *out = r;
    note('m', s, 0, NULL, r);
    return 0;
}

void *aligned_alloc(size_t align, size_t s) {
    void *r = __libc_memalign(align, s);
    note('m', s, 0, NULL, r);
    return r;
}

void free(void *p) {
    if (p) note('f', malloc_usable_size(p), 0, p, NULL);
    __libc_free(p);
}

void fxc_trace_on(void) {
    const char *m = getenv("FXC_TRACE_MIN");
    if (m) min_size = strtoul(m, NULL, 10);
    inside = 1;
    void *warm[2];
    backtrace(warm, 2); /* loads libgcc's unwinder now, not while tracing */
    inside = 0;
    /* The records' pages, resident before the caller reads its RSS: not counted as the call's. */
    memset(events, 0, sizeof events);
    memset(traces, 0, sizeof traces);
    n_events = n_traces = 0;
    on = 1;
}

int fxc_trace_off(const char *path) {
    on = 0;
    int n = n_events < EVENTS ? n_events : EVENTS;
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int i = 0; i < n; i++) {
        struct event *e = &events[i];
        fprintf(f, "%c %zu %zu %p %p %ld", e->op, e->size, e->new_size, e->ptr, e->result, e->rss);
        if (e->trace >= 0)
            for (int k = 1; k < depths[e->trace]; k++) fprintf(f, " %p", traces[e->trace][k]);
        fputc('\n', f);
    }
    fclose(f);
    return n;
}
