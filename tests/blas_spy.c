/* tests/blas_spy.c - a second translation unit of the test binary: a cblas_sgemm that stands in front of
   OpenBLAS's (dlsym(RTLD_NEXT) finds the real one), notes the OpenMP state of every call, then makes the
   product. The library's promise it checks: a product made inside a parallel region, active or not, runs
   on the calling thread. An OpenMP BLAS starts a team of omp_get_max_threads() threads when
   omp_in_parallel() is false, which a region whose `if` came out false leaves false; and OpenBLAS's bits
   can depend on its team's size (they do on a Zen 3), so such a team made one batch-head's attention
   differ from the same head in a larger call. The spy sees that state on any machine, whatever its
   BLAS's bits do. On (BLAS_SPY) in OpenBLAS builds on Linux (TFM_BLAS with the default <cblas.h>, whose
   OPENBLAS_CONST names OpenBLAS's); elsewhere blas_spy_on() is 0 and att_test_one_head checks the bits
   alone. */
#if defined(TFM_BLAS) && !defined(TFM_BLAS_HEADER) && defined(__linux__)
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef OPENBLAS_CONST
#define BLAS_SPY 1
#endif
#endif

/* blas_spy_take(n) reads the counts since the last take and sets them to zero: n[0] products seen; n[1] of
   those made inside a parallel region (omp_get_level() > 0); n[2] of those where an OpenMP BLAS would start
   a team of more than one thread. */
int blas_spy_on(void);
void blas_spy_take(long n[3]);

#ifdef BLAS_SPY
typedef void (*blas_spy_sgemm_fn)(OPENBLAS_CONST enum CBLAS_ORDER, OPENBLAS_CONST enum CBLAS_TRANSPOSE,
                                  OPENBLAS_CONST enum CBLAS_TRANSPOSE, OPENBLAS_CONST blasint, OPENBLAS_CONST blasint,
                                  OPENBLAS_CONST blasint, OPENBLAS_CONST float, OPENBLAS_CONST float *,
                                  OPENBLAS_CONST blasint, OPENBLAS_CONST float *, OPENBLAS_CONST blasint,
                                  OPENBLAS_CONST float, float *, OPENBLAS_CONST blasint);
static long blas_spy__n[3];

static blas_spy_sgemm_fn blas_spy__real(void) {
    static blas_spy_sgemm_fn f;
    void *p;
    if (f) return f;
    p = dlsym(RTLD_NEXT, "cblas_sgemm");
    memcpy(&f, &p, sizeof f); /* ISO C has no cast from an object pointer to a function pointer */
    return f;
}

int blas_spy_on(void) { return blas_spy__real() != 0; }

void blas_spy_take(long n[3]) {
    memcpy(n, blas_spy__n, sizeof blas_spy__n);
    memset(blas_spy__n, 0, sizeof blas_spy__n);
}

void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER order, OPENBLAS_CONST enum CBLAS_TRANSPOSE ta,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE tb, OPENBLAS_CONST blasint M, OPENBLAS_CONST blasint N,
                 OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha, OPENBLAS_CONST float *A, OPENBLAS_CONST blasint lda,
                 OPENBLAS_CONST float *B, OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta, float *C,
                 OPENBLAS_CONST blasint ldc) {
    blas_spy_sgemm_fn real = blas_spy__real();
    int in_region = 0, team = 0;
#ifdef _OPENMP
    in_region = omp_get_level() > 0;
    team = in_region && !omp_in_parallel() && omp_get_max_threads() > 1;
#pragma omp critical(blas_spy)
#endif
    {
        blas_spy__n[0]++;
        blas_spy__n[1] += in_region;
        blas_spy__n[2] += team;
    }
    if (!real) abort(); /* no BLAS behind this one: nothing can make the product */
    real(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#else
int blas_spy_on(void) { return 0; }
void blas_spy_take(long n[3]) { n[0] = n[1] = n[2] = 0; }
#endif
