/* tests/test_sgemm.c - tfm_sgemm and tfm_sgemm_batched against a naive triple loop in double.

   Every product is checked element by element against
       ref[i][j]   = alpha * sum_p op(A)[i][p] op(B)[p][j] + beta * C0[i][j]        (double)
       scale[i][j] = |alpha| * sum_p |op(A)[i][p] op(B)[p][j]| + |beta * C0[i][j]|
   and must satisfy |C[i][j] - ref[i][j]| <= sg_tol(K) * scale[i][j].

   Why that tolerance: the inputs are float32 and exact in double, so the reference is exact to
   ~1e-16 and what we measure is the float32 rounding of the kernel alone. A float32 dot product of
   length K, summed in ANY order (blocked, FMA, split over threads), satisfies
       |fl(sum) - sum| <= gamma_K * sum |a_p b_p|,   gamma_K = K u / (1 - K u),  u = 2^-24
   (Higham, Accuracy and Stability of Numerical Algorithms, 3.1). Scaling by alpha, rounding alpha*a
   if a kernel pre-scales, and adding beta*C cost a few more u, hence (K + 4) u. It is a worst-case
   bound, valid for every correct kernel; typical errors are ~sqrt(K) u. A wrong index, a skipped
   edge tile or a mishandled leading dimension gives errors of order 1, far above it. */

#include <stdint.h>
#include <stdlib.h>

static double sg_tol(int K) { return (double)(K + 4) * (1.0 / 16777216.0); }

/* The AMX kernel ("amx", tfm__sgemm_amx) splits each float into bf16 parts, x = hi + lo + e with
   |x - hi| <= 2^-8 |x| (hi has 8 significant bits) and |e| <= 2^-8 |x - hi| <= 2^-16 |x|, and sums the
   exact products hi*hi + lo*hi + hi*lo in fp32. What it drops from a*b, ah*eb + al*bl + al*eb + ea*b,
   is at most (1.004 + 1 + 2^-8 + 1) 2^-16 |ab| < 3.01 * 2^-16 |ab|; the fp32 sum of 3K such terms
   (whose magnitudes add up to at most 1.01 sum |ab|) and of beta*C costs (3K + 4) u * 1.01 more.
   Hence 3.02 * 2^-16 + (3K + 6) u. Plain bf16 (lo dropped) errs by up to 2^-7: far outside. */
static double sg_tol_amx(int K) { return 3.02 / 65536.0 + (double)(3 * K + 6) * (1.0 / 16777216.0); }
static int sg_amx_on; /* the blocking cases run on the AMX kernel */
static double sg_tol_builtin(int K) { return sg_amx_on ? sg_tol_amx(K) : sg_tol(K); }

static uint64_t sg_state = 0x9E3779B97F4A7C15ull;

/* uniform in [-1, 1), from a 64-bit xorshift* (independent of the library's rng) */
static float sg_uniform(void) {
    sg_state ^= sg_state >> 12;
    sg_state ^= sg_state << 25;
    sg_state ^= sg_state >> 27;
    uint64_t r = sg_state * 0x2545F4914F6CDD1Dull;
    return (float)((double)(r >> 40) / 8388608.0 - 1.0);
}

static void sg_fill(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = sg_uniform();
}

static float *sg_alloc(size_t n) { return (float *)malloc((n ? n : 1) * sizeof(float)); }

/* Reference in double (see the top of the file). With beta == 0, C0 is not read. */
static void sg_reference(int ta, int tb, int M, int N, int K, double alpha, const float *A, int lda,
                         const float *B, int ldb, double beta, const float *C0, int ldc,
                         double *ref, double *scale) {
    /* op(A)[i][p] = A[i * ai + p * ap], op(B)[p][j] = B[p * bp + j * bj] (the transposes decided once: under
       valgrind this loop is most of the blocking test's time) */
    const size_t ai = ta ? 1 : (size_t)lda, ap = ta ? (size_t)lda : 1, bp = tb ? 1 : (size_t)ldb, bj = tb ? (size_t)ldb : 1;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            const float *a = A + (size_t)i * ai, *b = B + (size_t)j * bj;
            double s = 0, sa = 0;
            for (int p = 0; p < K; p++, a += ap, b += bp) {
                double ab = (double)*a * (double)*b;
                s += ab;
                sa += fabs(ab);
            }
            double r = alpha * s, sc = fabs(alpha) * sa;
            if (beta != 0) {
                double c = C0[(size_t)i * ldc + j];
                r += beta * c;
                sc += fabs(beta * c);
            }
            ref[(size_t)i * N + j] = r;
            scale[(size_t)i * N + j] = sc;
        }
    }
}

/* The worst |C - ref| / scale over the (M,N) block; INFINITY for a NaN or an error where scale is 0. */
static double sg_err(const float *C, int ldc, const double *ref, const double *scale, int M, int N) {
    double worst = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double d = fabs((double)C[(size_t)i * ldc + j] - ref[(size_t)i * N + j]);
            double s = scale[(size_t)i * N + j];
            double e;
            if (d != d) return INFINITY;
            e = s > 0 ? d / s : (d > 0 ? INFINITY : 0);
            if (e > worst) worst = e;
        }
    }
    return worst;
}

/* The worst |X - Y| / scale between two results of the same product. */
static double sg_diff(const float *X, const float *Y, int ldc, const double *scale, int M, int N) {
    double worst = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double d = fabs((double)X[(size_t)i * ldc + j] - (double)Y[(size_t)i * ldc + j]);
            double s = scale[(size_t)i * N + j];
            double e;
            if (d != d) return INFINITY;
            e = s > 0 ? d / s : (d > 0 ? INFINITY : 0);
            if (e > worst) worst = e;
        }
    }
    return worst;
}

#define SG_SENTINEL 12345.5f

/* C (M rows of ldc): the (M,N) block gets NaN (beta == 0: must be overwritten, never read) or a copy
   of C0; the padding columns N..ldc-1 get a sentinel that must survive. */
static void sg_prepare_c(float *C, const float *C0, int M, int N, int ldc, int nan_block) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            size_t o = (size_t)i * ldc + j;
            C[o] = j >= N ? SG_SENTINEL : (nan_block ? NAN : C0[o]);
        }
}

static int sg_padding_intact(const float *C, int M, int N, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++)
            if (C[(size_t)i * ldc + j] != SG_SENTINEL) return 0;
    return 1;
}

typedef struct sg_dims { int M, N, K; } sg_dims;

static const sg_dims sg_cases[] = {
    {1, 1, 1},     {2, 2, 2},     {3, 3, 3},     {7, 7, 7},     {17, 17, 17},   {31, 31, 31},
    {33, 33, 33},  {64, 64, 64},  {65, 65, 65},  {2, 3, 1},     {3, 1, 2},      {7, 17, 3},
    {17, 31, 33},  {31, 33, 17},  {33, 64, 65},  {64, 65, 31},  {65, 7, 127},   {127, 65, 64},
    {257, 33, 17}, {17, 257, 65}, {33, 17, 257}, {127, 31, 257}, {257, 257, 7}, {1, 257, 257},
    {257, 1, 127}, {1, 300, 5},   {300, 1, 5},   {5, 1, 300},   {1, 1, 300},    {300, 2, 1},
    {2, 65, 1},
};

/* alpha != 1 mostly; beta in {0, 1, 0.5}; beta == 0 always runs on a NaN-filled C */
static const float sg_ab[][2] = {
    {1.0f, 0.0f}, {-0.75f, 0.0f}, {1.25f, 1.0f}, {0.5f, 0.5f}, {-2.0f, 0.5f},
};

/* how much wider than the minimum each leading dimension is, varied by case */
static int sg_pad(int which, int idx) {
    static const int pads[] = {0, 3, 16, 1, 0, 7};
    return pads[(idx + 2 * which) % 6];
}

/* One (M,N,K) case in all four (transA, transB) combinations and every (alpha, beta) of sg_ab.
   builtin: also run the built-in kernel (a build whose tfm_sgemm goes elsewhere). */
static void sg_run_case(int idx, const sg_dims *dm, int builtin) {
    const int M = dm->M, N = dm->N, K = dm->K;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            int rowsA = ta ? K : M, colsA = ta ? M : K;
            int rowsB = tb ? N : K, colsB = tb ? K : N;
            int lda = colsA + sg_pad(0, idx + ta), ldb = colsB + sg_pad(1, idx + tb);
            int ldc = N + sg_pad(2, idx + ta + tb);
            float *A = sg_alloc((size_t)rowsA * lda), *B = sg_alloc((size_t)rowsB * ldb);
            float *C0 = sg_alloc((size_t)M * ldc), *C = sg_alloc((size_t)M * ldc);
            float *C2 = sg_alloc((size_t)M * ldc);
            double *ref = (double *)malloc((size_t)M * N * sizeof(double));
            double *scale = (double *)malloc((size_t)M * N * sizeof(double));
            sg_fill(A, (size_t)rowsA * lda);
            sg_fill(B, (size_t)rowsB * ldb);
            sg_fill(C0, (size_t)M * ldc);
            for (size_t a = 0; a < sizeof sg_ab / sizeof sg_ab[0]; a++) {
                float alpha = sg_ab[a][0], beta = sg_ab[a][1];
                char what[160];
                snprintf(what, sizeof what, "sgemm ta=%d tb=%d M=%d N=%d K=%d lda=%d ldb=%d ldc=%d "
                         "alpha=%g beta=%g", ta, tb, M, N, K, lda, ldb, ldc, alpha, beta);
                sg_reference(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, ref, scale);

                sg_prepare_c(C, C0, M, N, ldc, beta == 0.0f);
                CHECK_OK(tfm_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
                CHECK_REL(what, sg_err(C, ldc, ref, scale, M, N), sg_tol(K));
                CHECK_MSG(sg_padding_intact(C, M, N, ldc), "%s: wrote past column N", what);

                if (builtin) {
                    sg_prepare_c(C2, C0, M, N, ldc, beta == 0.0f);
                    tfm__sgemm_builtin(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C2, ldc);
                    CHECK_REL(what, sg_err(C2, ldc, ref, scale, M, N), sg_tol(K));
                    CHECK_MSG(sg_padding_intact(C2, M, N, ldc), "%s (built-in): wrote past "
                              "column N", what);
                    /* both are within the bound of the exact result, so within twice it of each
                       other */
                    CHECK_REL(what, sg_diff(C, C2, ldc, scale, M, N), 2 * sg_tol(K));
                }
            }
            free(A); free(B); free(C0); free(C); free(C2); free(ref); free(scale);
        }
    }
}

static void sg_test_sgemm(void) {
    for (size_t i = 0; i < sizeof sg_cases / sizeof sg_cases[0]; i++) sg_run_case((int)i, &sg_cases[i], 0);
}

/* In a build whose tfm_sgemm is not the built-in kernel (BLAS, TFM_SGEMM), the built-in kernel is still
   compiled: check it, and check the two agree. */
static void sg_test_builtin_vs_backend(void) {
    if (!strcmp(tfm_sgemm_backend(), "built-in")) return;
    for (size_t i = 0; i < sizeof sg_cases / sizeof sg_cases[0]; i++) sg_run_case((int)i, &sg_cases[i], 1);
}

/* beta == 0 must ignore C even when it holds NaN or Inf in every element, and alpha == 0 with beta == 0
   gives exact zeros. */
static void sg_test_beta_zero_ignores_c(void) {
    const int M = 5, N = 9, K = 4;
    float A[5 * 4], B[4 * 9], C[5 * 9];
    sg_fill(A, 20);
    sg_fill(B, 36);
    for (int i = 0; i < M * N; i++) C[i] = (i & 1) ? NAN : INFINITY;
    CHECK_OK(tfm_sgemm(0, 0, M, N, K, 0.0f, A, K, B, N, 0.0f, C, N));
    for (int i = 0; i < M * N; i++) CHECK_MSG(C[i] == 0.0f, "C[%d] = %g, want 0", i, C[i]);
}

/* tfm_sgemm_batched against one tfm_sgemm per matrix: non-contiguous strides (gaps between the matrices
   that must be left alone), wider leading dimensions, and both thread counts. */
static void sg_batched_case(int ta, int tb, int M, int N, int K, int batch, float alpha, float beta) {
    int rowsA = ta ? K : M, colsA = ta ? M : K;
    int rowsB = tb ? N : K, colsB = tb ? K : N;
    int lda = colsA + 2, ldb = colsB + 1, ldc = N + 3;
    int64_t sA = (int64_t)rowsA * lda + 7, sB = (int64_t)rowsB * ldb + 3;
    int64_t sC = (int64_t)M * ldc + 5;
    size_t nA = (size_t)(sA * batch), nB = (size_t)(sB * batch), nC = (size_t)(sC * batch);
    float *A = sg_alloc(nA), *B = sg_alloc(nB), *C0 = sg_alloc(nC);
    float *Cb = sg_alloc(nC), *Cs = sg_alloc(nC), *Cb1 = sg_alloc(nC);
    double *ref = (double *)malloc((size_t)M * N * sizeof(double));
    double *scale = (double *)malloc((size_t)M * N * sizeof(double));
    int saved = tfm_get_num_threads();
    sg_fill(A, nA);
    sg_fill(B, nB);
    sg_fill(C0, nC);
    for (int nt = 1; nt <= 2; nt++) {
        char what[160];
        tfm_set_num_threads(nt);
        snprintf(what, sizeof what, "sgemm_batched ta=%d tb=%d M=%d N=%d K=%d batch=%d threads=%d "
                 "alpha=%g beta=%g", ta, tb, M, N, K, batch, nt, alpha, beta);
        /* everything outside the matrices (gaps and padding columns) holds the sentinel */
        for (size_t i = 0; i < nC; i++) Cb[i] = Cs[i] = SG_SENTINEL;
        for (int m = 0; m < batch; m++) {
            sg_prepare_c(Cb + m * sC, C0 + m * sC, M, N, ldc, beta == 0.0f);
            sg_prepare_c(Cs + m * sC, C0 + m * sC, M, N, ldc, beta == 0.0f);
        }
        CHECK_OK(tfm_sgemm_batched(ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, Cb, ldc,
                                   sC, batch));
        for (int m = 0; m < batch; m++)
            CHECK_OK(tfm_sgemm(ta, tb, M, N, K, alpha, A + m * sA, lda, B + m * sB, ldb, beta,
                               Cs + m * sC, ldc));
        for (int m = 0; m < batch; m++) {
            sg_reference(ta, tb, M, N, K, alpha, A + m * sA, lda, B + m * sB, ldb, beta,
                         C0 + m * sC, ldc, ref, scale);
            CHECK_REL(what, sg_err(Cb + m * sC, ldc, ref, scale, M, N), sg_tol(K));
            /* the same product through the same kernel: equal up to a different split over threads */
            CHECK_REL(what, sg_diff(Cb + m * sC, Cs + m * sC, ldc, scale, M, N), 2 * sg_tol(K));
        }
        {
            /* gaps between matrices and padding columns untouched */
            size_t bad = 0;
            for (int m = 0; m < batch; m++) {
                const float *c = Cb + m * sC;
                if (!sg_padding_intact(c, M, N, ldc)) bad++;
                for (int64_t g = (int64_t)M * ldc; g < sC; g++)
                    if (c[g] != SG_SENTINEL) bad++;
            }
            CHECK_MSG(bad == 0, "%s: wrote outside the matrices", what);
        }
        /* the built-in: the same bits at 1 and 2 threads, whether the batch or each product is split */
        if (nt == 1) memcpy(Cb1, Cb, nC * sizeof(float));
        else if (!strcmp(tfm_sgemm_backend(), "built-in"))
            CHECK_MSG(memcmp(Cb1, Cb, nC * sizeof(float)) == 0, "%s: differs from 1 thread", what);
    }
    tfm_set_num_threads(saved);
    free(A); free(B); free(C0); free(Cb); free(Cs); free(Cb1); free(ref); free(scale);
}

static void sg_test_batched(void) {
    static const sg_dims dims[] = {{7, 17, 33}, {33, 31, 5}, {1, 65, 17}, {17, 1, 3}, {48, 40, 56}};
    static const int batches[] = {1, 3, 16};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int bi = 0; bi < 3; bi++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    int ab = (int)(d + bi + ta + tb) % 2;
                    sg_batched_case(ta, tb, dims[d].M, dims[d].N, dims[d].K, batches[bi],
                                    ab ? -1.25f : 0.5f, ab ? 0.5f : 0.0f);
                }
}

/* One thread or two: both results within the bound of the exact product, and within twice it of each
   other (a kernel that splits only M and N over threads gives bitwise equal results). */
static void sg_test_threads(void) {
    const int M = 129, N = 77, K = 150;
    float *A = sg_alloc((size_t)M * K), *B = sg_alloc((size_t)K * N);
    float *C1 = sg_alloc((size_t)M * N), *C2 = sg_alloc((size_t)M * N);
    double *ref = (double *)malloc((size_t)M * N * sizeof(double));
    double *scale = (double *)malloc((size_t)M * N * sizeof(double));
    int saved = tfm_get_num_threads();
    sg_fill(A, (size_t)M * K);
    sg_fill(B, (size_t)K * N);
    sg_reference(0, 1, M, N, K, 1.5, A, K, B, K, 0.0, NULL, N, ref, scale);
    tfm_set_num_threads(1);
    CHECK_OK(tfm_sgemm(0, 1, M, N, K, 1.5f, A, K, B, K, 0.0f, C1, N));
    tfm_set_num_threads(2);
    CHECK_OK(tfm_sgemm(0, 1, M, N, K, 1.5f, A, K, B, K, 0.0f, C2, N));
    tfm_set_num_threads(saved);
    CHECK_REL("sgemm 1 thread", sg_err(C1, N, ref, scale, M, N), sg_tol(K));
    CHECK_REL("sgemm 2 threads", sg_err(C2, N, ref, scale, M, N), sg_tol(K));
    CHECK_REL("sgemm 1 vs 2 threads", sg_diff(C1, C2, N, scale, M, N), 2 * sg_tol(K));
    if (!strcmp(tfm_sgemm_backend(), "built-in"))
        CHECK_MSG(memcmp(C1, C2, (size_t)M * N * sizeof(float)) == 0, "built-in sgemm: 1 and 2 threads differ");
    free(A); free(B); free(C1); free(C2); free(ref); free(scale);
}

/* ---- the built-in sgemm's kernels and blocking ----------------------------------------------- */

/* One micro-kernel alone: a (kc x mr) and b (kc x nr) packed k-major, C (mr rows, ldc = nr + 5) against
   the double reference; beta == 0 runs on a NaN-filled C; the 5 padding columns must survive. Then the
   same operands read in place (A row-major with a wider row, B with a wider row): the same bits. */
typedef void (*sg_kernel_fn)(int, const float *, int, int, const float *, int, float *, int, float, float);

static void sg_kernel_case(const char *name, sg_kernel_fn kern, int mr, int nr, int kc, float alpha, float beta) {
    int ldc = nr + 5;
    float *a = sg_alloc((size_t)kc * mr), *b = sg_alloc((size_t)kc * nr);
    float *C0 = sg_alloc((size_t)mr * ldc), *C = sg_alloc((size_t)mr * ldc);
    double *ref = (double *)malloc((size_t)mr * nr * sizeof(double));
    double *scale = (double *)malloc((size_t)mr * nr * sizeof(double));
    char what[128];
    sg_fill(a, (size_t)kc * mr);
    sg_fill(b, (size_t)kc * nr);
    sg_fill(C0, (size_t)mr * ldc);
    /* a packed A sliver is op(A)^T stored k-major: A^T with lda = mr; B's sliver is B with ldb = nr */
    sg_reference(1, 0, mr, nr, kc, alpha, a, mr, b, nr, beta, C0, ldc, ref, scale);
    sg_prepare_c(C, C0, mr, nr, ldc, beta == 0.0f);
    kern(kc, a, 1, mr, b, nr, C, ldc, alpha, beta);
    snprintf(what, sizeof what, "kernel %s %dx%d kc=%d alpha=%g beta=%g", name, mr, nr, kc, alpha, beta);
    CHECK_REL(what, sg_err(C, ldc, ref, scale, mr, nr), sg_tol(kc));
    CHECK_MSG(sg_padding_intact(C, mr, nr, ldc), "%s: wrote past its tile", what);
    {
        int lda = kc + 3, ldb = nr + 7;
        float *a2 = sg_alloc((size_t)mr * lda), *b2 = sg_alloc((size_t)kc * ldb), *C2 = sg_alloc((size_t)mr * ldc);
        for (int i = 0; i < mr; i++)
            for (int p = 0; p < kc; p++) a2[(size_t)i * lda + p] = a[(size_t)p * mr + i];
        for (int p = 0; p < kc; p++)
            for (int j = 0; j < nr; j++) b2[(size_t)p * ldb + j] = b[(size_t)p * nr + j];
        sg_prepare_c(C2, C0, mr, nr, ldc, beta == 0.0f);
        kern(kc, a2, lda, 1, b2, ldb, C2, ldc, alpha, beta);
        CHECK_MSG(memcmp(C, C2, (size_t)mr * ldc * sizeof(float)) == 0, "%s: in place differs from packed", what);
        free(a2); free(b2); free(C2);
    }
    free(a); free(b); free(C0); free(C); free(ref); free(scale);
}

static void sg_kernel_all(const char *name, sg_kernel_fn kern, int mr, int nr) {
    static const int kcs[] = {1, 2, 3, 4, 5, 7, 8, 64, 257};
    for (size_t i = 0; i < sizeof kcs / sizeof kcs[0]; i++)
        for (size_t a = 0; a < sizeof sg_ab / sizeof sg_ab[0]; a++)
            sg_kernel_case(name, kern, mr, nr, kcs[i], sg_ab[a][0], sg_ab[a][1]);
}

/* Every micro-kernel this build compiles (the one it uses and the narrower ones the target can run). */
static void sg_test_kernels(void) {
#if defined(TFM__HAVE_KERNEL_AVX512)
    sg_kernel_all("avx512", tfm__kernel_avx512, TFM__MR_AVX512, TFM__NR_AVX512);
#endif
#if defined(TFM__HAVE_KERNEL_AVX2)
    sg_kernel_all("avx2", tfm__kernel_avx2, TFM__MR_AVX2, TFM__NR_AVX2);
#endif
    sg_kernel_all("portable", tfm__kernel_port, TFM__MR_PORT, TFM__NR_PORT);
}

/* The built-in sgemm on one shape in all four transposes, at 1 and 2 threads: each result within the bound
   of the exact product, padding columns untouched, and the two results bit-identical. */
static void sg_builtin_case(int M, int N, int K, int idx) {
    int saved = tfm_get_num_threads();
    float alpha = sg_ab[idx % 5][0], beta = sg_ab[idx % 5][1];
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int rowsA = ta ? K : M, colsA = ta ? M : K, rowsB = tb ? N : K, colsB = tb ? K : N;
            int lda = colsA + sg_pad(0, idx + ta), ldb = colsB + sg_pad(1, idx + tb);
            int ldc = N + sg_pad(2, idx + ta + tb);
            float *A = sg_alloc((size_t)rowsA * lda), *B = sg_alloc((size_t)rowsB * ldb);
            float *C0 = sg_alloc((size_t)M * ldc), *C1 = sg_alloc((size_t)M * ldc), *C2 = sg_alloc((size_t)M * ldc);
            double *ref = (double *)malloc((size_t)M * N * sizeof(double));
            double *scale = (double *)malloc((size_t)M * N * sizeof(double));
            char what[160];
            snprintf(what, sizeof what, "built-in ta=%d tb=%d M=%d N=%d K=%d lda=%d ldb=%d ldc=%d alpha=%g beta=%g",
                     ta, tb, M, N, K, lda, ldb, ldc, alpha, beta);
            sg_fill(A, (size_t)rowsA * lda);
            sg_fill(B, (size_t)rowsB * ldb);
            sg_fill(C0, (size_t)M * ldc);
            sg_reference(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, ref, scale);
            sg_prepare_c(C1, C0, M, N, ldc, beta == 0.0f);
            sg_prepare_c(C2, C0, M, N, ldc, beta == 0.0f);
            tfm_set_num_threads(1);
            tfm__sgemm_builtin(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C1, ldc);
            tfm_set_num_threads(2);
            tfm__sgemm_builtin(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C2, ldc);
            CHECK_REL(what, sg_err(C1, ldc, ref, scale, M, N), sg_tol_builtin(K));
            CHECK_MSG(sg_padding_intact(C1, M, N, ldc), "%s: wrote past column N", what);
            CHECK_MSG(memcmp(C1, C2, (size_t)M * ldc * sizeof(float)) == 0, "%s: 1 and 2 threads differ", what);
            /* with a bias (C starts as it in every row, its tiles written as the product goes): within the
               bound of the exact product plus the bias, C's old contents never read, and the same bits as
               the bias written into C first and the product added with beta 1, at 1 and 2 threads */
            if (idx % 2 == 0) {
                float *bias = sg_alloc((size_t)N), *Cb = sg_alloc((size_t)M * ldc);
                sg_fill(bias, (size_t)N);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < ldc; j++) Cb[(size_t)i * ldc + j] = j < N ? bias[j] : SG_SENTINEL;
                sg_reference(ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, Cb, ldc, ref, scale);
                tfm_set_num_threads(1);
                tfm__sgemm_builtin(ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, Cb, ldc);
                for (int th = 1; th <= 2; th++) {
                    sg_prepare_c(C1, C0, M, N, ldc, 1);
                    tfm_set_num_threads(th);
                    tfm__sgemm_builtin_bias(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C1, ldc, bias);
                    CHECK_REL(what, sg_err(C1, ldc, ref, scale, M, N), sg_tol_builtin(K));
                    CHECK_MSG(sg_padding_intact(C1, M, N, ldc), "%s, bias: wrote past column N", what);
                    CHECK_MSG(memcmp(C1, Cb, (size_t)M * ldc * sizeof(float)) == 0,
                              "%s, bias at %d threads: not the bits of the bias written first", what, th);
                }
                free(bias); free(Cb);
            }
            free(A); free(B); free(C0); free(C1); free(C2); free(ref); free(scale);
        }
    tfm_set_num_threads(saved);
}

/* Sizes around every blocking factor of kernel k: MR and NR (edge tiles in each direction), KC (one K
   block more or less), MC (row blocks, and how the threads split them), NC (column panels), TFM__WIDE
   (the tiles' order); K = 1; few rows and many columns (the threads then split the columns). */
static void sg_blocking_kernel(const tfm__gemm_kernel *k) {
    const int mr = k->mr, nr = k->nr, KC = k->kc, MC = k->mc, NC = k->nc;
    const int ms[] = {1, mr - 1, mr, mr + 1, 2 * mr + 1};
    const int ns[] = {1, nr - 1, nr, nr + 1, 2 * nr + 1};
    const int ks[] = {1, 2, 17};
    int idx = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++)
                if (ms[i] > 0 && ns[j] > 0) sg_builtin_case(ms[i], ns[j], ks[k], idx++);
    sg_builtin_case(mr + 1, nr + 1, KC - 1, idx++);
    sg_builtin_case(mr + 1, nr + 1, KC, idx++);
    sg_builtin_case(mr + 1, nr + 1, KC + 1, idx++);
    sg_builtin_case(mr - 1, nr - 1, 2 * KC + 1, idx++);
    sg_builtin_case(MC - 1, 2 * nr + 3, 33, idx++);
    sg_builtin_case(MC, 2 * nr + 3, 33, idx++);
    sg_builtin_case(MC + 1, 2 * nr + 3, 33, idx++);
    sg_builtin_case(2 * MC + mr + 1, nr + 2, 40, idx++);
    sg_builtin_case(mr + 2, NC - 1, 9, idx++);
    sg_builtin_case(mr + 2, NC, 9, idx++);
    sg_builtin_case(mr + 2, NC + 1, 9, idx++);
    sg_builtin_case(2 * mr + 1, TFM__WIDE, 33, idx++);     /* the widest product tiled by columns */
    sg_builtin_case(2 * mr + 1, TFM__WIDE + 1, 33, idx++); /* the narrowest tiled by rows */
    sg_builtin_case(MC + mr + 1, TFM__WIDE + nr + 3, KC + 3, idx++); /* by rows across row and K blocks */
    sg_builtin_case(13, 700, 40, idx++);  /* few rows: the threads split the columns (by rows at 1 thread,
                                             by columns at 2: the same bits) */
    sg_builtin_case(300, 100, 20, idx++); /* the threads split the rows */
    sg_builtin_case(MC + 5, NC + nr + 3, KC + 7, idx++); /* every block edge at once */
}

/* The blocking cases on every kernel of this build, each chosen as a user would (tfm_sgemm_set_kernel). */
static void sg_test_blocking(void) {
    const tfm__gemm_kernel *saved = tfm__gemm_kernel_get();
    for (int i = 0; i < TFM__N_KERNELS; i++) {
        const tfm__gemm_kernel *k = &tfm__gemm_kernels[i];
        if (!tfm__gemm_kernel_usable(k)) {
            printf("    skip: kernel %s (the OS refused this process the AMX tiles)\n", k->name);
            continue;
        }
        CHECK_OK(tfm_sgemm_set_kernel(k->key));
        CHECK_MSG(!strcmp(tfm_sgemm_kernel(), k->name), "set %s: tfm_sgemm_kernel() says %s", k->key, tfm_sgemm_kernel());
        /* the scratch and the edge tile hold any kernel's blocks (the AMX one packs two bf16 per float) */
        CHECK_MSG((size_t)k->kc * k->nc + (size_t)k->mc * k->kc + 32 <= TFM__PACK_FLOATS && (k->amx || k->mr * k->nr <= TFM__TILE_MAX),
                  "kernel %s: blocks larger than the packing space", k->name);
        sg_amx_on = k->amx;
        sg_blocking_kernel(k);
        sg_amx_on = 0;
    }
    tfm__gemm_kernel_chosen = saved;
}

/* The AMX kernel: an infinity or a NaN in op(A) makes its row of C NaN (fp32 gives +-inf for the
   infinities: hi * lo of the other operand is inf * 0 there), never a finite number, and the other rows
   stay finite; and once chosen it runs tfm_sgemm's products in every build, BLAS included: the bits of
   the built-in path on it. */
static void sg_test_amx(void) {
#if defined(TFM__HAVE_AMX)
    const tfm__gemm_kernel *saved = tfm__gemm_kernel_get(), *amx = tfm__gemm_kernel_by_key("amx");
    const int M = 40, N = 50, K = 70;
    float *A = sg_alloc((size_t)M * K), *B = sg_alloc((size_t)K * N), *C = sg_alloc((size_t)M * N);
    float *C2 = sg_alloc((size_t)M * N);
    if (!tfm__gemm_kernel_usable(amx)) {
        printf("    skip: the OS refused the AMX tiles\n");
        free(A); free(B); free(C); free(C2);
        return;
    }
    sg_fill(A, (size_t)M * K);
    for (int i = 0; i < K * N; i++) B[i] = 0.25f + 0.5f * (float)(i % 3); /* positive: no inf - inf */
    A[3 * K + 5] = INFINITY, A[7 * K + 69] = -INFINITY, A[11 * K] = NAN;
    CHECK_OK(tfm_sgemm_set_kernel("amx"));
    CHECK_OK(tfm_sgemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N));
    for (int j = 0; j < N; j++) {
        CHECK_MSG(isnan(C[3 * N + j]) && isnan(C[7 * N + j]) && isnan(C[11 * N + j]),
                  "amx: column %d: +inf, -inf, NaN rows give %g, %g, %g", j, C[3 * N + j], C[7 * N + j], C[11 * N + j]);
        CHECK_MSG(isfinite(C[j]) && isfinite(C[12 * N + j]), "amx: a finite row became %g, %g", C[j], C[12 * N + j]);
    }
    sg_fill(A, (size_t)M * K);
    CHECK_OK(tfm_sgemm(0, 1, M, N - 1, K, 0.5f, A, K, B, K, 0.0f, C, N));
    tfm__sgemm_builtin_k(amx, 0, 1, M, N - 1, K, 0.5f, A, K, B, K, 0.0f, C2, N, NULL);
    for (int i = 0; i < M; i++)
        CHECK_MSG(!memcmp(C + (size_t)i * N, C2 + (size_t)i * N, (size_t)(N - 1) * sizeof(float)),
                  "amx chosen: tfm_sgemm (%s) differs from the built-in path on it, row %d", tfm_sgemm_backend(), i);
    tfm__gemm_kernel_chosen = saved;
    free(A); free(B); free(C); free(C2);
#else
    printf("    skip: no AMX kernel in this build\n");
#endif
}

/* tfm_sgemm_set_kernel: an unknown name is an error naming the function and this build's kernels, and
   leaves the choice as it was; NULL is the widest kernel. */
static void sg_test_kernel_select(void) {
    const tfm__gemm_kernel *saved = tfm__gemm_kernel_get();
    const char *before = tfm_sgemm_kernel();
    CHECK_ERR(tfm_sgemm_set_kernel("avx1024"), TFM_E_ARG, "tfm_sgemm_set_kernel: 'avx1024' is not a kernel");
    CHECK_MSG(strstr(tfm_last_error(), "portable") != NULL, "the message lists the kernels: %s", tfm_last_error());
    CHECK_ERR(tfm_sgemm_set_kernel(""), TFM_E_ARG, "tfm_sgemm_set_kernel");
    CHECK_MSG(tfm_sgemm_kernel() == before, "a failed tfm_sgemm_set_kernel changed the kernel");
    CHECK_OK(tfm_sgemm_set_kernel("portable"));
    CHECK_MSG(!strncmp(tfm_sgemm_kernel(), "portable", 8), "portable: got %s", tfm_sgemm_kernel());
    CHECK_OK(tfm_sgemm_set_kernel(NULL));
    CHECK_MSG(!strcmp(tfm_sgemm_kernel(), tfm__gemm_kernels[0].name), "NULL: got %s", tfm_sgemm_kernel());
    tfm__gemm_kernel_chosen = saved;
}

/* Without its packing space (an allocation that failed) the built-in computes element by element: the
   same bits as the packed path at 1 and 2 threads, on shapes that cross every blocking factor, K blocks
   included, in all four transposes, with beta 0 on a NaN-filled C. One exception: GCC in GNU C mode
   (no -std=c99: make test-gnu) fuses multiply-adds across statements, and may fuse the portable
   kernel's alpha * acc + beta * C either way round, so there the portable kernel and the fallback each
   stay within the error bound of the exact product but need not agree bit for bit. The AMX kernel's
   fallback sums in fp32 (its bf16 splitting needs the packing space): both within their bounds. */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__STRICT_ANSI__)
#define SG_UNFUSED_BITWISE 0
#else
#define SG_UNFUSED_BITWISE 1
#endif
static void sg_nopack_kernel(const tfm__gemm_kernel *k) {
    const sg_dims dims[] = {{1, 1, 1}, {k->mr + 1, k->nr - 1, 1}, {k->mr - 1, 2 * k->nr + 1, 17},
                            {k->mc + 3, k->nr + 5, k->kc + 1}, {9, k->nc + 7, 2 * k->kc + 3}, {37, 45, 300},
                            /* a small B (K * N <= 4096) under many rows: read in place, not packed */
                            {64, 32, 32}, {100, 64, 64}};
    int saved = tfm_get_num_threads();
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                const int M = dims[d].M, N = dims[d].N, K = dims[d].K, idx = (int)d + ta + 2 * tb;
                float alpha = sg_ab[idx % 5][0], beta = sg_ab[idx % 5][1];
                int lda = (ta ? M : K) + sg_pad(0, idx), ldb = (tb ? K : N) + sg_pad(1, idx), ldc = N + sg_pad(2, idx);
                size_t nA = (size_t)(ta ? K : M) * lda, nB = (size_t)(tb ? N : K) * ldb, nC = (size_t)M * ldc;
                float *A = sg_alloc(nA), *B = sg_alloc(nB), *C0 = sg_alloc(nC), *Cp = sg_alloc(nC), *Cn = sg_alloc(nC);
                sg_fill(A, nA);
                sg_fill(B, nB);
                sg_fill(C0, nC);
                for (int nt = 1; nt <= 2; nt++) {
                    tfm_set_num_threads(nt);
                    sg_prepare_c(Cp, C0, M, N, ldc, beta == 0.0f);
                    sg_prepare_c(Cn, C0, M, N, ldc, beta == 0.0f);
                    tfm__sgemm_builtin(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cp, ldc);
                    tfm__sgemm_nopack(k, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cn, ldc);
                    if (!k->amx && (k->fused || SG_UNFUSED_BITWISE)) {
                        CHECK_MSG(memcmp(Cp, Cn, nC * sizeof(float)) == 0,
                                  "%s unpacked ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g threads=%d: differs from packed",
                                  k->name, ta, tb, M, N, K, alpha, beta, nt);
                    } else {
                        double *ref = (double *)malloc((size_t)M * N * sizeof(double));
                        double *scale = (double *)malloc((size_t)M * N * sizeof(double));
                        char what[160];
                        snprintf(what, sizeof what, "%s unpacked ta=%d tb=%d M=%d N=%d K=%d threads=%d", k->name, ta, tb,
                                 M, N, K, nt);
                        sg_reference(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, ref, scale);
                        CHECK_REL(what, sg_err(Cn, ldc, ref, scale, M, N), sg_tol(K));
                        CHECK_REL(what, sg_err(Cp, ldc, ref, scale, M, N), k->amx ? sg_tol_amx(K) : sg_tol(K));
                        free(ref);
                        free(scale);
                    }
                }
                free(A); free(B); free(C0); free(Cp); free(Cn);
            }
    tfm_set_num_threads(saved);
}

static void sg_test_nopack(void) {
    const tfm__gemm_kernel *saved = tfm__gemm_kernel_get();
    for (int i = 0; i < TFM__N_KERNELS; i++) {
        if (!tfm__gemm_kernel_usable(&tfm__gemm_kernels[i])) continue; /* AMX refused: sg_test_blocking says so */
        tfm__gemm_kernel_chosen = &tfm__gemm_kernels[i];
        sg_nopack_kernel(&tfm__gemm_kernels[i]);
    }
    tfm__gemm_kernel_chosen = saved;
}

/* tfm_scratch_release frees the packing space, and the next product allocates it again: same bits. */
static void sg_test_release(void) {
    const int M = 70, N = 90, K = 110;
    float *A = sg_alloc((size_t)M * K), *B = sg_alloc((size_t)K * N);
    float *C1 = sg_alloc((size_t)M * N), *C2 = sg_alloc((size_t)M * N);
    sg_fill(A, (size_t)M * K);
    sg_fill(B, (size_t)K * N);
    tfm__sgemm_builtin(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C1, N);
#if !defined(TFM__NO_THREAD_LOCAL)
    CHECK_MSG(tfm__scratchbuf != NULL, "no packing space after a product");
#endif
    tfm_scratch_release();
#if !defined(TFM__NO_THREAD_LOCAL)
    CHECK_MSG(tfm__scratchbuf == NULL, "tfm_scratch_release left the packing space");
#endif
    tfm__sgemm_builtin(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C2, N);
    CHECK_MSG(memcmp(C1, C2, (size_t)M * N * sizeof(float)) == 0, "a product after tfm_scratch_release differs");
#if !defined(TFM__NO_THREAD_LOCAL) && defined(_OPENMP)
    {
        /* a product on two threads, then the release at one thread: the second thread's buffer goes too */
        int saved = tfm_get_num_threads(), left = 0;
        tfm_set_num_threads(2);
        tfm__sgemm_builtin(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C2, N);
        tfm_set_num_threads(1);
        tfm_scratch_release();
#pragma omp parallel num_threads(2) reduction(+ : left)
        left += tfm__scratchbuf != NULL;
        CHECK_MSG(left == 0, "tfm_scratch_release left %d thread(s) with a packing space", left);
        tfm_set_num_threads(saved);
    }
#endif
    tfm_scratch_release();
    free(A); free(B); free(C1); free(C2);
}

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>

/* Runs fn(arg) on a new thread with a 64 KiB stack and waits for it; returns the stack size in KiB, or 0
   when no thread could be started. Where the C library cannot start one that small (glibc keeps the
   libraries' thread-local storage on the thread's stack, and OpenBLAS's alone is larger than 64 KiB),
   the smallest of 128 and 256 KiB it starts: all far below what the packing space (656 KiB) and the
   attention's block buffers (128 KiB in backward) once took from the stack. */
static int test_small_stack_run(void *(*fn)(void *), void *arg) {
    pthread_t th;
    int kib;
    for (kib = 64; kib <= 256; kib *= 2) {
        pthread_attr_t attr;
        int ok;
        if (pthread_attr_init(&attr) != 0) return 0;
        ok = pthread_attr_setstacksize(&attr, (size_t)kib * 1024) == 0 && pthread_create(&th, &attr, fn, arg) == 0;
        pthread_attr_destroy(&attr);
        if (ok) {
            pthread_join(th, NULL);
            return kib;
        }
    }
    return 0;
}

/* A product on a thread with a small stack (the built-in's packing space is on the heap). */
typedef struct sg_small_stack_job { int threads, M, N, K; const float *A, *B; float *C; } sg_small_stack_job;

static void *sg_small_stack_main(void *arg) {
    sg_small_stack_job *j = (sg_small_stack_job *)arg;
    tfm_set_num_threads(j->threads);
    tfm__sgemm_builtin(1, 1, j->M, j->N, j->K, 0.5f, j->A, j->M, j->B, j->K, 0.0f, j->C, j->N);
    tfm_scratch_release();
    return NULL;
}

static void sg_test_small_stack(void) {
    const int M = TFM__MC + 9, N = TFM__NC + 40, K = TFM__KC + 30; /* every blocking factor crossed */
    float *A = sg_alloc((size_t)K * M), *B = sg_alloc((size_t)N * K);
    float *Cmain = sg_alloc((size_t)M * N), *Cthr = sg_alloc((size_t)M * N);
    int saved = tfm_get_num_threads();
    sg_fill(A, (size_t)K * M);
    sg_fill(B, (size_t)N * K);
    tfm_set_num_threads(1);
    tfm__sgemm_builtin(1, 1, M, N, K, 0.5f, A, M, B, K, 0.0f, Cmain, N);
    tfm_set_num_threads(saved);
    for (int nt = 1; nt <= 2; nt++) {
        sg_small_stack_job job = {nt, M, N, K, A, B, Cthr};
        int kib = test_small_stack_run(sg_small_stack_main, &job);
        CHECK_MSG(kib > 0, "could not start a thread with a stack of 256 KiB or less");
        if (kib > 0)
            CHECK_MSG(memcmp(Cmain, Cthr, (size_t)M * N * sizeof(float)) == 0,
                      "the product on a %d KiB stack at %d thread(s) differs", kib, nt);
    }
    tfm_set_num_threads(saved);
    free(A); free(B); free(Cmain); free(Cthr);
}
#else
static void sg_test_small_stack(void) {}
#endif

/* In a BLIS build through <blis.h> (make BLAS=blis), tfm_set_num_threads sets BLIS's thread count. */
static void sg_test_blis_threads(void) {
#if defined(TFM_BLAS) && !defined(TFM_SGEMM) && defined(BLIS_H)
    int saved = tfm_get_num_threads();
    for (int nt = 1; nt <= 3; nt++) {
        tfm_set_num_threads(nt);
        CHECK_MSG(bli_thread_get_num_threads() == nt, "tfm_set_num_threads(%d): BLIS runs %d threads", nt,
                  (int)bli_thread_get_num_threads());
    }
    tfm_set_num_threads(saved);
#endif
}

static void suite_sgemm(void) {
    RUN(sg_test_sgemm);
    RUN(sg_test_builtin_vs_backend);
    RUN(sg_test_beta_zero_ignores_c);
    RUN(sg_test_batched);
    RUN(sg_test_threads);
    RUN(sg_test_kernels);
    RUN(sg_test_blocking);
    RUN(sg_test_kernel_select);
    RUN(sg_test_amx);
    RUN(sg_test_nopack);
    RUN(sg_test_release);
    RUN(sg_test_small_stack);
    RUN(sg_test_blis_threads);
}
