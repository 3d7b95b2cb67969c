/* The benchmarks' small shared helpers: a monotonic clock, the median of a sample, and an allocation
   that ends the program when memory runs out. Included by bench.c, bench_gpu.c and bench_ddp.c after
   their system headers (clock_gettime needs _POSIX_C_SOURCE, which each defines first). BENCH_NAME
   names the program in messages. */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef BENCH_NAME
#define BENCH_NAME "bench"
#endif

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

/* Median of v[0..n) (sorts v); -1 for an empty sample. */
static inline double median(double *v, int n) {
    if (n <= 0) return -1.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, BENCH_NAME ": out of memory (%lu bytes)\n", (unsigned long)n);
        exit(1);
    }
    return p;
}

#endif
