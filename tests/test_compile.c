/* tests/test_compile.c - compile check, implementation TU (make test-compile).
   Built with -std=c99 -Wall -Wextra -Werror -pedantic, with and without -fopenmp, TFM_BLAS,
   TFM_STATIC and (TC_HOOKS) user-supplied TFM_SGEMM, TFM_MALLOC/TFM_FREE and TFM_ASSERT. The header is
   included twice before TFM_IMPLEMENTATION (the include guard must hold) and twice after it (the
   implementation guard must hold), as happens when other headers of a program include it. */
#include "../transformer.h"
#include "../transformer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TC_HOOKS
/* The program's own allocator, assert and sgemm (a naive row-major one). The allocator counts the calls
   that carry the model's cfg.user (tc2_user_tag, set by test_compile2.c's model). */
extern int tc2_user_tag;
static long tc_live, tc_allocs, tc_sgemms, tc_assert_fails, tc_user_allocs, tc_user_frees;
static void *tc_malloc(size_t n, void *u) {
    void *p = malloc(n);
    if (p) tc_live++, tc_allocs++, tc_user_allocs += u == (void *)&tc2_user_tag;
    return p;
}
static void tc_free(void *p, void *u) {
    if (p) tc_live--, tc_user_frees += u == (void *)&tc2_user_tag;
    free(p);
}
static void tc_assert_fail(const char *what) {
    tc_assert_fails++;
    printf("TFM_ASSERT(%s) failed\n", what);
}
static void tc_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc) {
    int i, j, k;
    tc_sgemms++;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            float s = 0.0f;
            for (k = 0; k < K; k++)
                s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            C[i * ldc + j] = alpha * s + (beta == 0.0f ? 0.0f : beta * C[i * ldc + j]);
        }
}
#define TFM_MALLOC(sz, u) tc_malloc(sz, u)
#define TFM_FREE(p, u) tc_free(p, u)
#define TFM_ASSERT(x) ((x) ? (void)0 : tc_assert_fail(#x))
#define TFM_SGEMM(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) \
    tc_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
#endif

#define TFM_IMPLEMENTATION
#include "../transformer.h"
#include "../transformer.h"

#ifdef TFM_STATIC
/* The private copy has no external definitions: the second TU's code joins this one. */
#include "test_compile2.c"
#else
#ifdef __cplusplus /* nvcc compiles this file as the .cu implementation TU (make cuda) */
extern "C"
#endif
int tc2_run(void);
#endif

int main(void) {
    const char *want =
#if defined(TC_HOOKS)
        "TFM_SGEMM";
#elif defined(TFM_BLAS)
        "cblas";
#else
        "built-in";
#endif
    if (strcmp(tfm_sgemm_backend(), want) != 0) {
        printf("tfm_sgemm_backend() is \"%s\", want \"%s\"\n", tfm_sgemm_backend(), want);
        return 1;
    }
    if (tc2_run() != 0) return 1;
#ifdef TC_HOOKS
    (void)tc_assert_fail; /* referenced even if the implementation never asserts */
    tfm_scratch_release(); /* the threads' scratch (attention's buffers), kept between calls until this */
    if (tc_sgemms == 0 || tc_allocs == 0 || tc_live != 0 || tc_assert_fails != 0 || tc_user_allocs == 0 ||
        tc_user_frees != tc_user_allocs) {
        printf("hooks: %ld sgemm calls, %ld allocations, %ld not freed, %ld asserts failed, %ld allocations and %ld frees "
               "with cfg.user\n", tc_sgemms, tc_allocs, tc_live, tc_assert_fails, tc_user_allocs, tc_user_frees);
        return 1;
    }
#endif
    return 0;
}
