#ifdef TFM_CUDA_EMULATION
#include "cuda_emu.h"
#endif
#define TFM_IMPLEMENTATION
#define TFM__TESTING
#define TFM__CU_ATT_BF_BYTES ((size_t)1 << 14) /* the bf16 attention in chunks of a few rows, so tests cross them */
#ifndef TFM_CUDA /* also given on the command line */
#define TFM_CUDA
#endif
#include "../transformer.h"
#include "test.h"

/* tests/test_cuda.cu - the CUDA backend against the CPU: every dispatch entry (tfm__op_*), every public op
   on device tensors, layers on a CUDA tfm_mem, whole models trained, decoded, saved, loaded and moved, and
   the error paths.

   One source, two builds:
     nvcc -O3 -std=c++14 -arch=sm_90 -Xcompiler -fopenmp -DTFM_CUDA -o build/test_cuda tests/test_cuda.cu -lcublas -lcublasLt -lm
         on a GPU ("no CUDA device: skipped", exit 0, on a machine without one);
     g++ -std=c++17 -x c++ -DTFM_CUDA -DTFM_CUDA_EMULATION -fopenmp -O1 -g -o build/test_cuda_emu tests/test_cuda.cu -lm
         the same CUDA source on the CPU through tests/cuda_emu.h (CI has no GPU), also under
         -fsanitize=address,undefined; the emulation also serves the error tests that need a machine without
         a device or a CUDA call that fails (tfm_emu_*), which a GPU build skips.
   Arguments: -v (each test, its time and the worst relative error it measured), --small (short shape lists
   and 20 training steps, for compute-sanitizer: every kernel path still runs; the emulation's default, as
   it runs each GPU thread as a fiber), --full (the full lists, the GPU's default), --shard K/N (every Nth
   test from the Kth, counted after the filter: N processes at once cover them all), and a filter (the tests
   whose name holds it). Output: one line per suite, then "N passed, N failed"; exit status 1 on a failure.

   Method. Every input is made once on the host and copied to the device, so both devices read the same
   bits; the op runs on each, and the device's output, copied back, is compared with the CPU's: test_rel_err_f,
   max |gpu - cpu| / max |cpu|, over the finite elements, while non-finite ones (NaN-prefilled gaps a kernel
   must not touch, -inf log-sum-exps of fully masked rows) must be the same on both. Outputs start as NaN,
   so an element a kernel forgets shows; gradients start from random values, so a backward that overwrites
   instead of adding shows. TF32 is off (the default), so the device's products are fp32.

   Tolerances, from fp32's unit roundoff u = 2^-24 ~ 6e-8:
   - CU_TOL 1e-5 for one op. Both devices compute the same formula; the order of the sums differs (a block
     tree on the GPU, 16 strided lanes on the CPU), and the GPU fuses multiply-adds. A sum of n terms in two
     orders differs by about sqrt(n) u of its terms' magnitude, ~1.4e-5 at n = 50257 in a worst case that is
     not met (a softmax's terms are positive: the bound is relative to the sum, ~1e-6). A wrong index, a
     missing term or a race shows at 1e-3 or more. Where an output cancels to ~0 from larger terms (a
     layernorm's input gradient), the error is taken relative to those terms (cu_check_scaled).
   - CU_TOL_LAYER 1e-4 for a whole block or model call: a chain of a dozen ops (two layernorms whose
     1/sigma amplifies what came before, products of up to 64 terms, a softmax), each adding its 1e-6.
   - CU_TOL_LOSS: the losses of the training runs within 1e-4 * max(1, |loss|) at every one of the 200
     forwards (the brief's bound); CU_TOL_TRAINED 5e-3 for what 100 AdamW steps leave (parameters, gradient
     norms, an evaluation's logits): AdamW divides each gradient by its own running size, so a component that
     hovers at zero turns a rounding-level difference into one of up to lr per step (3e-3 here) on parameters
     of size ~0.1-1. Measured on an H100: 4.6e-4. A wrong gradient moves them by O(lr * steps) ~ 0.3.
   - Where both devices run the very same float operations on the same inputs, equality is bitwise: dropout
     masks (the same hash), copies, zeroing, adds, CLS pooling, initialisation, checkpoints, moves. */

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CU_TOL 1e-5
#define CU_TOL_LAYER 1e-4
#define CU_TOL_LOSS 1e-4
#define CU_TOL_TRAINED 5e-3
#define CU_VOCAB 50257

/* ---- harness ------------------------------------------------------------------------------------ */

/* --small: short shape lists and 20 training steps instead of 100. The emulation's default: it runs
   every GPU thread as a fiber, with a switch at each barrier or shuffle, so the full lists take about 3.5
   minutes on one core there (1.5 small); --full asks for them (make test-cuda-emu's plain run). */
#ifdef TFM_CUDA_EMULATION
static int cu_small = 1;
#else
static int cu_small = 0;
#endif
static double cu_worst = 0;  /* the largest relative error the running test measured */

static double cu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* test.h's runner: each test's time and the largest relative error it measured, under -v */
static double cu_t0;
static void cu_begin(void) {
    cu_worst = 0.0;
    cu_t0 = cu_now();
}
static void cu_note(void) { printf(" %6.2f s, worst relative error %.2g", cu_now() - cu_t0, cu_worst); }

/* Runs a suite and prints its line (nothing when the filter left none of its tests). */
static void cu_suite(const char *name, void (*fn)(void)) {
    int p0 = test__passed, f0 = test__failed;
    double t0 = cu_now();
    fn();
    if (test__passed + test__failed > p0 + f0)
        printf("%-10s %3d passed, %d failed (%.1f s)\n", name, test__passed - p0, test__failed - f0, cu_now() - t0);
    fflush(stdout);
}

/* A name for a check message, in one of 8 rotating buffers. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static const char *cu_fmt(const char *fmt, ...) {
    static char bufs[8][256];
    static int next;
    char *b = bufs[next++ & 7];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof bufs[0], fmt, ap);
    va_end(ap);
    return b;
}

/* The test harness itself could not get memory: nothing sensible can follow. */
static void cu_fatal(const char *what) {
    printf("FATAL %s: %s\n", what, tfm_last_error());
    exit(2);
}

/* ---- random numbers (splitmix64: the test's own, independent of tfm_rng) ----------------------- */

typedef struct cu_rng { uint64_t s; } cu_rng;

static uint64_t cu_next(cu_rng *g) {
    uint64_t z = (g->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double cu_unif(cu_rng *g) { return (double)(cu_next(g) >> 11) * (1.0 / 9007199254740992.0); }
static int cu_int(cu_rng *g, int n) { return (int)(cu_next(g) % (uint64_t)n); }
static float cu_gauss(cu_rng *g) {
    double u1 = 1.0 - cu_unif(g), u2 = cu_unif(g);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- buffers on both devices -------------------------------------------------------------------- */

/* n floats held twice: h for the CPU's kernels, d (device memory) for the GPU's, with equal values until
   the ops run. */
typedef struct cu_buf {
    float *h, *d;
    int64_t n;
} cu_buf;

static tfm_tensor cu_vec(float *p, int64_t n, tfm_device dev) {
    tfm_tensor t = tfm_tensor1(p, n);
    t.device = dev;
    return t;
}

/* n floats between host and device memory, through tfm_tensor_copy */
static void cu_copy(float *dst, tfm_device ddev, const float *src, tfm_device sdev, int64_t n) {
    tfm_tensor d = cu_vec(dst, n, ddev), s = cu_vec((float *)src, n, sdev);
    if (n > 0 && tfm_tensor_copy(&d, &s) != TFM_OK) cu_fatal("tfm_tensor_copy");
}

static float *cu_host(int64_t n) {
    float *p = (float *)calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p) cu_fatal("calloc");
    return p;
}
static float *cu_dev(int64_t n) {
    void *p = NULL;
    if (tfm_cuda_malloc(&p, (size_t)(n > 0 ? n : 1) * sizeof(float)) != TFM_OK) cu_fatal("tfm_cuda_malloc");
    return (float *)p;
}

/* A host copy (malloc'ed) of n floats at p on dev. A CUDA failure of a dispatch entry called before (the
   entries return nothing; the public calls report it) fails the running test here. */
static float *cu_fetch(const float *p, int64_t n, tfm_device dev) {
    float *h = cu_host(n);
    CHECK_MSG(tfm__cuda_check("an earlier dispatch entry") == TFM_OK, "%s", tfm_last_error());
    cu_copy(h, TFM_DEVICE_CPU, p, dev, n);
    return h;
}

/* the device copy takes the host copy's values (after the test changed them) */
static void cu_push(cu_buf *b) { cu_copy(b->d, TFM_DEVICE_CUDA, b->h, TFM_DEVICE_CPU, b->n); }

/* both copies allocated, the host one zeroed, the device one not yet written */
static cu_buf cu_alloc(int64_t n) {
    cu_buf b;
    b.n = n;
    b.h = cu_host(n);
    b.d = cu_dev(n);
    return b;
}
static cu_buf cu_zeros(int64_t n) {
    cu_buf b = cu_alloc(n);
    cu_push(&b);
    return b;
}
/* N(0, scale^2) + shift, the same on both */
static cu_buf cu_normal(int64_t n, cu_rng *g, double scale, double shift) {
    cu_buf b = cu_alloc(n);
    for (int64_t i = 0; i < n; i++) b.h[i] = (float)(shift + scale * cu_gauss(g));
    cu_push(&b);
    return b;
}
/* cu_nan's filler: a quiet NaN whose two 16-bit halves are each a bf16 NaN (0x7fc0), so that a bf16 element
   a kernel forgets shows as well (NAN's low half, 0x0000, reads as a bf16 zero) */
static float cu_nan_float(void) {
    uint32_t u = 0x7fc07fc0u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* NaN on both: an output every element of which a kernel must write (or a gap it must leave alone) */
static cu_buf cu_nan(int64_t n) {
    cu_buf b = cu_alloc(n);
    for (int64_t i = 0; i < n; i++) b.h[i] = cu_nan_float();
    cu_push(&b);
    return b;
}
static void cu_free(cu_buf *b) {
    free(b->h);
    tfm_cuda_free(b->d);
    b->h = NULL;
    b->d = NULL;
}
/* cu_free of every buffer listed, up to CU_END */
#define CU_END ((cu_buf *)0)
static void cu_release(cu_buf *b, ...) {
    va_list ap;
    va_start(ap, b);
    for (; b; b = va_arg(ap, cu_buf *)) cu_free(b);
    va_end(ap);
}

/* Tensors over a buffer: the host copy (dv 0) or the device copy (dv 1); dims <= 0 are left out. */
static tfm_tensor cu_t(const cu_buf *b, int dv, int64_t d0, int64_t d1, int64_t d2) {
    float *p = dv ? b->d : b->h;
    tfm_tensor t = d2 > 0 ? tfm_tensor3(p, d0, d1, d2) : d1 > 0 ? tfm_tensor2(p, d0, d1) : tfm_tensor1(p, d0);
    t.device = dv ? TFM_DEVICE_CUDA : TFM_DEVICE_CPU;
    return t;
}

/* ---- comparison --------------------------------------------------------------------------------- */

static int cu_same_class(float a, float b) {
    if (a != a || b != b) return a != a && b != b; /* NaN and NaN */
    return a == b;                                 /* +-inf only equal themselves */
}

/* test_rel_err_f of got against want over the pairs where both are finite, with a floor under its
   denominator: max |got - want| / max(max |want|, scale) (scale 0: test_rel_err_f itself). The floor is
   for outputs that cancel to (nearly) zero from terms of size `scale` (a layernorm's input gradient over
   a single column is exactly 0 from terms of size rstd |dy|). INFINITY when a non-finite element differs;
   *at (may be NULL) receives the element of the largest difference. */
static double cu_rel(const float *got, const float *want, int64_t n, double scale, int64_t *at) {
    float *g = cu_host(n), *w = cu_host(n);
    int64_t m = 0, worst = -1;
    double e, big = -1.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(got[i]) && isfinite(want[i])) {
            double d = fabs((double)got[i] - (double)want[i]);
            if (d > big) {
                big = d;
                worst = i;
            }
            if (fabs((double)want[i]) > den) den = fabs((double)want[i]);
            g[m] = got[i];
            w[m++] = want[i];
        } else if (!cu_same_class(got[i], want[i])) {
            free(g);
            free(w);
            if (at) *at = i;
            return INFINITY;
        }
    }
    e = test_rel_err_f(g, w, (size_t)m);
    if (scale > den) e = (den > 0 ? e * den : e) / scale;
    free(g);
    free(w);
    if (at) *at = worst;
    return e;
}

/* got (host) against want (host), n floats, to tol (relative, with the floor scale as cu_rel's) */
static void cu_check_scaled_arrays(const char *what, const float *got, const float *want, int64_t n, double tol, double scale) {
    int64_t at = -1;
    double e = cu_rel(got, want, n, scale, &at);
    if (e == e && e > cu_worst && e != INFINITY) cu_worst = e;
    if (!(e <= tol)) {
        if (at >= 0)
            TEST__FAIL("%s: relative error %.3g > %.3g (element %lld of %lld: device %.9g, CPU %.9g)", what, e, tol,
                       (long long)at, (long long)n, (double)got[at], (double)want[at]);
        else
            TEST__FAIL("%s: relative error %.3g > %.3g", what, e, tol);
    }
}
static void cu_check_arrays(const char *what, const float *got, const float *want, int64_t n, double tol) {
    cu_check_scaled_arrays(what, got, want, n, tol, 0.0);
}

/* the device copy of b against its host copy */
static void cu_check(const char *what, const cu_buf *b, double tol) {
    float *got = cu_fetch(b->d, b->n, TFM_DEVICE_CUDA);
    cu_check_arrays(what, got, b->h, b->n, tol);
    free(got);
}
static void cu_check_scaled(const char *what, const cu_buf *b, double tol, double scale) {
    float *got = cu_fetch(b->d, b->n, TFM_DEVICE_CUDA);
    cu_check_scaled_arrays(what, got, b->h, b->n, tol, scale);
    free(got);
}

/* bit for bit (NaN payloads included) */
static int64_t cu_count_ne_bits(const float *a, const float *b, int64_t n, int64_t *first) {
    int64_t c = 0;
    *first = -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float)) != 0) {
            if (!c) *first = i;
            c++;
        }
    return c;
}
static void cu_check_bits_arrays(const char *what, const float *got, const float *want, int64_t n) {
    int64_t first, c = cu_count_ne_bits(got, want, n, &first);
    if (c)
        TEST__FAIL("%s: %lld of %lld elements differ bitwise (first %lld: device %.9g, CPU %.9g)", what, (long long)c,
                   (long long)n, (long long)first, (double)got[first], (double)want[first]);
}
static void cu_check_bits(const char *what, const cu_buf *b) {
    float *got = cu_fetch(b->d, b->n, TFM_DEVICE_CUDA);
    cu_check_bits_arrays(what, got, b->h, b->n);
    free(got);
}

/* No NaN or inf in the device copy of b (fully masked attention rows are zeros, never NaN). */
static void cu_check_finite(const char *what, const cu_buf *b) {
    float *got = cu_fetch(b->d, b->n, TFM_DEVICE_CUDA);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < b->n; i++)
        if (!isfinite(got[i])) {
            if (!bad) first = i;
            bad++;
        }
    CHECK_MSG(!bad, "%s: %lld non-finite elements (first %lld: %g)", what, (long long)bad, (long long)first,
              bad ? (double)got[first] : 0.0);
    free(got);
}

/* a scalar pair: |got - want| <= tol * max(|want|, floor) */
static void cu_check_scalar(const char *what, double got, double want, double tol, double floor_) {
    double den = fabs(want) > floor_ ? fabs(want) : floor_, e = fabs(got - want) / den;
    if (e == e && e > cu_worst) cu_worst = e;
    CHECK_MSG(e <= tol, "%s: device %.9g, CPU %.9g: relative error %.3g > %.3g", what, got, want, e, tol);
}

/* ---- shapes ------------------------------------------------------------------------------------- */

/* Rows and columns on both sides of every power-of-two edge a kernel may tile by (a warp of 32, blocks of
   128, 256 and 1024 threads, 4 floats per vector load). */
static const int64_t cu_rows_full[] = {1, 2, 31, 32, 33, 255, 256, 257, 1000};
static const int64_t cu_cols_full[] = {1, 3, 31, 32, 33, 127, 128, 129, 1024, 1025, 4097};
static const int64_t cu_rows_small[] = {1, 2, 33};
static const int64_t cu_cols_small[] = {1, 3, 32, 33, 129, 1025};
#define CU_LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct cu_nc { int64_t N, C; } cu_nc;

static int cu_add_shape(cu_nc *s, int n, int64_t N, int64_t C) {
    for (int i = 0; i < n; i++)
        if (s[i].N == N && s[i].C == C) return n;
    s[n].N = N;
    s[n].C = C;
    return n + 1;
}

/* (rows, columns) pairs: every row count with a few column counts, every column count with a few row
   counts, and the largest of both; --small: a handful, with one row of 4097 columns (the looping paths). */
static int cu_shapes(cu_nc *s) {
    int n = 0, i, j;
    if (cu_small) {
        for (i = 0; i < CU_LEN(cu_rows_small); i++)
            for (j = 0; j < CU_LEN(cu_cols_small); j++) n = cu_add_shape(s, n, cu_rows_small[i], cu_cols_small[j]);
        return cu_add_shape(s, n, 2, 4097);
    }
    {
        static const int64_t some_cols[] = {3, 33, 129, 1025}, some_rows[] = {1, 2, 33, 257};
        for (i = 0; i < CU_LEN(cu_rows_full); i++)
            for (j = 0; j < CU_LEN(some_cols); j++) n = cu_add_shape(s, n, cu_rows_full[i], some_cols[j]);
        for (i = 0; i < CU_LEN(cu_cols_full); i++)
            for (j = 0; j < CU_LEN(some_rows); j++) n = cu_add_shape(s, n, some_rows[j], cu_cols_full[i]);
        n = cu_add_shape(s, n, 4099, 3); /* more rows than the row kernels' grid: its y comes round again */
        return cu_add_shape(s, n, 1000, 4097);
    }
}
#define CU_MAX_SHAPES 128

/* Element counts for element-wise ops. */
static int cu_counts(int64_t *c) {
    /* (the last two: past the grid's 4096 blocks of 256 threads at one item a thread, and at TFM__CU_U (up to
       8) a thread, so that a thread's loop comes round again) */
    static const int64_t full[] = {1, 3, 31, 32, 33, 127, 128, 129, 1024, 1025, 4097, 65536 + 3, 1000 * 1025 + 7,
                                   4096 * 256 * 8 + 5};
    static const int64_t small[] = {1, 33, 1025, 4097};
    int n = cu_small ? CU_LEN(small) : CU_LEN(full);
    memcpy(c, cu_small ? small : full, (size_t)n * sizeof(int64_t));
    return n;
}

/* (M, N, K) of the products: each of M, N and K crosses the edges of 32, 128 and 1024. */
typedef struct cu_mnk { int M, N, K; } cu_mnk;
static int cu_products(cu_mnk *p) {
    static const cu_mnk full[] = {{1, 1, 1},      {1, 3, 31},      {2, 32, 33},    {31, 33, 32},  {33, 31, 129},
                                  {32, 128, 127}, {255, 129, 33},  {256, 1, 1024}, {257, 1025, 3}, {1000, 33, 128},
                                  {3, 4097, 33},  {33, 3, 1025},   {128, 256, 257}};
    static const cu_mnk small[] = {{1, 1, 1}, {2, 3, 33}, {33, 31, 129}, {3, 129, 1025}};
    int n = cu_small ? CU_LEN(small) : CU_LEN(full);
    memcpy(p, cu_small ? small : full, (size_t)n * sizeof(cu_mnk));
    return n;
}

/* The loop over both devices: dv 0 runs the CPU's kernel on the host copies, dv 1 the GPU's on the device
   copies, with the same arguments otherwise. */
#define CU_DEVS for (int dv = 0; dv < 2; dv++)
#define CU_DEV (dv ? TFM_DEVICE_CUDA : TFM_DEVICE_CPU)
#define CU_P(b) (dv ? (b).d : (b).h)

/* ==== 1. dispatch entries (tfm__op_*), each against the CPU's ======================================== */

/* zero, copy, copy_rows (strided rows: the gaps between rows must stay as they were; lds 0: one row to every
   row; on the GPU one side may be host memory, as a batch's inputs are), add_rows, and transfer between any
   two devices. */
static void cu_op_copy(void) {
    static const int pads[4][2] = {{0, 0}, {1, 3}, {33, 0}, {0, 32}};
    cu_rng g = {11};
    int64_t counts[16];
    cu_nc sh[CU_MAX_SHAPES];
    int nc = cu_counts(counts), ns = cu_shapes(sh), i, p, k;
    for (i = 0; i < nc; i++) {
        int64_t n = counts[i];
        cu_buf x = cu_normal(n + 2, &g, 1, 0), y = cu_normal(n, &g, 1, 0);
        float *h = cu_host(n), *d = cu_dev(n);
        CU_DEVS tfm__op_zero(CU_DEV, CU_P(x), 0); /* nothing */
        CU_DEVS tfm__op_zero(CU_DEV, CU_P(x), n); /* the last two stay */
        cu_check_bits(cu_fmt("zero n=%lld", (long long)n), &x);
        CU_DEVS tfm__op_copy(CU_DEV, CU_P(x), CU_P(y), n);
        cu_check_bits(cu_fmt("copy n=%lld", (long long)n), &x);
        for (k = 0; k < 4; k++) { /* transfer: host to host, host to device, device to device, device to host */
            tfm_device sd = k >= 2 ? TFM_DEVICE_CUDA : TFM_DEVICE_CPU, dd = (k == 1 || k == 2) ? TFM_DEVICE_CUDA : TFM_DEVICE_CPU;
            float *dst = dd == TFM_DEVICE_CUDA ? d : h, *got;
            memset(h, 0, (size_t)n * sizeof(float));
            tfm__op_zero(TFM_DEVICE_CUDA, d, n);
            tfm__op_transfer(dd, dst, sd, sd == TFM_DEVICE_CUDA ? y.d : y.h, n);
            got = cu_fetch(dst, n, dd);
            cu_check_bits_arrays(cu_fmt("transfer n=%lld from device %d to device %d", (long long)n, (int)sd, (int)dd), got, y.h, n);
            free(got);
        }
        cu_release(&x, &y, CU_END);
        free(h);
        tfm_cuda_free(d);
    }
    for (i = 0; i < ns; i++)
        for (p = 0; p < 4; p++) {
            int64_t N = sh[i].N, C = sh[i].C, ldd = C + pads[p][0], lds = C + pads[p][1];
            char name[120];
            cu_buf src = cu_normal(N * lds, &g, 1, 0), dst = cu_normal(N * ldd, &g, 1, 0), row = cu_normal(C, &g, 1, 0);
            float *hd;
            snprintf(name, sizeof name, "N=%lld C=%lld ldd=%lld lds=%lld", (long long)N, (long long)C, (long long)ldd, (long long)lds);
            CU_DEVS tfm__op_copy_rows(CU_DEV, CU_P(dst), ldd, CU_P(src), lds, N, C);
            cu_check_bits(cu_fmt("copy_rows %s", name), &dst);
            CU_DEVS tfm__op_add_rows(CU_DEV, CU_P(dst), ldd, CU_P(src), lds, N, C);
            cu_check_bits(cu_fmt("add_rows %s", name), &dst);
            CU_DEVS tfm__op_copy_rows(CU_DEV, CU_P(dst), ldd, CU_P(row), 0, N, C);
            cu_check_bits(cu_fmt("copy_rows %s, one row to all (lds 0)", name), &dst);
            /* the GPU's copy with host memory on one side: from the host copy of src, then into a host buffer */
            tfm__op_copy_rows(TFM_DEVICE_CPU, dst.h, ldd, src.h, lds, N, C);
            tfm__op_copy_rows(TFM_DEVICE_CUDA, dst.d, ldd, src.h, lds, N, C);
            cu_check_bits(cu_fmt("copy_rows %s, host to device", name), &dst);
            hd = cu_host(N * ldd); /* dst's host copy with its rows cleared: copy_rows fills them, keeps the gaps */
            memcpy(hd, dst.h, (size_t)(N * ldd) * sizeof(float));
            for (k = 0; k < N; k++) memset(hd + k * ldd, 0, (size_t)C * sizeof(float));
            tfm__op_copy_rows(TFM_DEVICE_CUDA, hd, ldd, src.d, lds, N, C);
            cu_check_bits_arrays(cu_fmt("copy_rows %s, device to host", name), hd, dst.h, N * ldd);
            free(hd);
            cu_release(&src, &dst, &row, CU_END);
        }
}

/* scatter_rows (a decoding step's cache store: B groups of n rows, each to its own place, in one launch on
   the GPU): the groups at places in a shuffled order with free rows between them (which must stay as they
   were), padded source rows; the CPU's result against the rows placed one by one here. */
static void cu_op_scatter_rows(void) {
    static const int64_t groups[] = {1, 2, 5, 64}, ns[] = {1, 3}, Cs[] = {1, 33, 130};
    cu_rng g = {17};
    for (int gi = 0; gi < CU_LEN(groups); gi++)
        for (int ni = 0; ni < CU_LEN(ns); ni++)
            for (int ci = 0; ci < CU_LEN(Cs); ci++) {
                int64_t B = groups[gi], n = ns[ni], C = Cs[ci], ldd = C + 2, lds = C + (ci & 1), R = 2 * B * n + 1;
                int64_t *drow = (int64_t *)calloc((size_t)B, sizeof(int64_t)), b, r;
                cu_buf src = cu_normal(B * n * lds, &g, 1, 0), dst = cu_normal(R * ldd, &g, 1, 0);
                float *want = cu_host(R * ldd);
                const char *name = cu_fmt("scatter_rows B=%lld n=%lld C=%lld", (long long)B, (long long)n, (long long)C);
                if (!drow) cu_fatal("calloc");
                for (b = 0; b < B; b++) drow[b] = 2 * b * n + 1; /* every other stretch of n rows, row 0 free */
                for (b = B - 1; b > 0; b--) { /* shuffled */
                    int64_t j = cu_int(&g, (int)b + 1), t = drow[b];
                    drow[b] = drow[j];
                    drow[j] = t;
                }
                memcpy(want, dst.h, (size_t)(R * ldd) * sizeof(float));
                for (b = 0; b < B; b++)
                    for (r = 0; r < n; r++)
                        memcpy(want + (drow[b] + r) * ldd, src.h + (b * n + r) * lds, (size_t)C * sizeof(float));
                CU_DEVS tfm__op_scatter_rows(CU_DEV, CU_P(dst), ldd, drow, CU_P(src), lds, B, n, C);
                cu_check_bits_arrays(cu_fmt("%s, CPU", name), dst.h, want, R * ldd);
                cu_check_bits(name, &dst);
                cu_release(&src, &dst, CU_END);
                free(want);
                free(drow);
            }
}

/* gemm_batched: every transpose, padded leading dimensions, gaps between the matrices of a batch (which
   must stay untouched), alpha and beta; with beta 0, C starts as NaN and must not be read. */
static void cu_op_gemm(void) {
    cu_mnk pr[16];
    cu_rng g = {12};
    int np = cu_products(pr), i, t, v;
    for (i = 0; i < np; i++)
        for (t = 0; t < 4; t++)
            for (v = 0; v < 2; v++) {
                int M = pr[i].M, N = pr[i].N, K = pr[i].K, ta = t & 1, tb = t >> 1, batch = v ? 3 : 1;
                int lda = (ta ? M : K) + (v ? 5 : 0), ldb = (tb ? K : N) + (v ? 0 : 2), ldc = N + (v ? 3 : 0);
                int64_t sA = (int64_t)(ta ? K : M) * lda + 7, sB = (int64_t)(tb ? N : K) * ldb + (v ? 1 : 0);
                int64_t sC = (int64_t)M * ldc + 5;
                float alpha = v ? 0.75f : 1.0f, beta = v ? 1.25f : 0.0f;
                cu_buf A = cu_normal(sA * batch, &g, 1, 0), B = cu_normal(sB * batch, &g, 1, 0);
                cu_buf Cm = beta == 0.0f ? cu_nan(sC * batch) : cu_normal(sC * batch, &g, 1, 0);
                CU_DEVS tfm__op_gemm_batched(CU_DEV, ta, tb, M, N, K, alpha, CU_P(A), lda, sA, CU_P(B), ldb, sB, beta, CU_P(Cm), ldc,
                                             sC, batch);
                cu_check(cu_fmt("gemm_batched ta=%d tb=%d M=%d N=%d K=%d batch=%d beta=%g", ta, tb, M, N, K, batch, (double)beta),
                         &Cm, CU_TOL);
                cu_free(&A);
                cu_free(&B);
                cu_free(&Cm);
            }
}

/* linear and linear_bwd: bias or none, row strides (ldx, ldy: a sub-matrix of a wider buffer), dx_beta 0
   (dx NaN: written, not read), 1 and 0.5, and dx, dw or db left out. */
static void cu_op_linear(void) {
    static const float betas[4] = {0.0f, 1.0f, 0.5f, 1.0f};
    cu_mnk pr[16];
    cu_rng g = {13};
    int np = cu_products(pr), i, v;
    for (i = 0; i < np; i++)
        for (v = 0; v < 4; v++) {
            int64_t N = pr[i].M, I = pr[i].K, O = pr[i].N, pad = v >> 1;
            int64_t ldx = I + 3 * pad, ldy = O + 2 * pad;
            int bias = v & 1, with_dx = v != 3, with_dw = v != 1;
            float beta = betas[v];
            char name[200];
            cu_buf x = cu_normal(N * ldx, &g, 1, 0), w = cu_normal(O * I, &g, 1.0 / sqrt((double)I), 0);
            cu_buf b = cu_normal(O, &g, 1, 0), y = cu_nan(N * ldy);
            cu_buf dy = cu_normal(N * ldy, &g, 1, 0), dx = beta == 0.0f ? cu_nan(N * ldx) : cu_normal(N * ldx, &g, 1, 0);
            cu_buf dw = cu_normal(O * I, &g, 1, 0), db = cu_normal(O, &g, 1, 0);
            snprintf(name, sizeof name, "linear N=%lld I=%lld O=%lld bias=%d ldx=%lld ldy=%lld", (long long)N, (long long)I, (long long)O, bias, (long long)ldx, (long long)ldy);
            CU_DEVS tfm__op_linear(CU_DEV, CU_P(y), ldy, CU_P(x), ldx, CU_P(w), bias ? CU_P(b) : NULL, N, I, O, 0);
            cu_check(cu_fmt("%s: y", name), &y, CU_TOL);
            CU_DEVS tfm__op_linear_bwd(CU_DEV, with_dx ? CU_P(dx) : NULL, ldx, beta, with_dw ? CU_P(dw) : NULL, bias ? CU_P(db) : NULL,
                                       CU_P(dy), ldy, CU_P(x), ldx, CU_P(w), N, I, O, 0);
            cu_check(cu_fmt("%s: dx (dx_beta %g)", name, (double)beta), &dx, CU_TOL);
            cu_check(cu_fmt("%s: dw", name), &dw, CU_TOL);
            /* db adds N unit normals to each column: terms of size sqrt(N) that may cancel to a small total
               (one output column shows it), so the error is taken relative to them */
            cu_check_scaled(cu_fmt("%s: db", name), &db, CU_TOL, sqrt((double)N));
            cu_release(&x, &w, &b, &y, &dy, &dx, &dw, &db, CU_END);
        }
}

/* A linear map with a bias as one cuBLASLt product whose epilogue adds the bias (tfm__gemm_bias_lt) against
   the same map with the bias filled in and added to (the thread's cuBLASLt switched off): fp32, TF32 and
   bf16 (x in fp32, or a bf16 activation), one row and several, and every pointer 4 bytes past an aligned
   one with rows of odd strides (cuBLASLt is then told their alignment). Under the emulation the same bits,
   gaps between rows left alone (its epilogue adds as the fallback does; it checks the layouts, the
   transposes and the bias against cuBLASLt's documented meaning, and aborts on a pointer less aligned than
   the algorithm was picked for), and each map with a bias ran through cuBLASLt; on a GPU within the
   rounding of fp32 sums. An MLP's first map likewise (GELU and SwiGLU, fp32 and bf16): its bias by the
   epilogue or by the activation's kernel, the same pre-activations and activations. Then a heuristic that
   offers no algorithm: the fallback, and the answer kept. */
static void cu_lt_bias(void) {
    static const int shapes[][3] = {{1, 16, 8}, {37, 24, 19}, {64, 48, 96}};
    cu_rng g = {57};
    for (int p = 0; p < 3; p++)
        for (int s = 0; s < CU_LEN(shapes); s++)
            for (int off = 0; off < 2; off++) {
                int prec = p == 0 ? 0 : p == 1 ? TFM_PREC_TF32 : TFM_PREC_BF16, xbf = p == 2 && off, had = tfm__cu.has_lt;
                int64_t N = shapes[s][0], I = shapes[s][1], O = shapes[s][2], ldy = O + 3 * off;
                int64_t ldx = xbf ? tfm__bf16_ld(I) : I + off;
                cu_buf x = cu_normal(N * ldx + 1, &g, 1, 0), w = cu_normal(O * I + 1, &g, 1.0 / sqrt((double)I), 0);
                cu_buf b = cu_normal(O + 1, &g, 1, 0), y[2] = {cu_nan(N * ldy + 1), cu_nan(N * ldy + 1)};
                const float *xin = x.d + off;
                float *got[2];
                char name[160];
                snprintf(name, sizeof name, "linear with a bias through cuBLASLt: precision %d N=%lld I=%lld O=%lld ldx=%lld "
                         "ldy=%lld%s", prec, (long long)N, (long long)I, (long long)O, (long long)ldx, (long long)ldy,
                         xbf ? " (x a bf16 activation)" : off ? " (pointers 4 bytes off)" : "");
                if (xbf) /* x's rows as a bf16 activation, in x's buffer from its start */
                    (void)tfm__bf16_operand_cuda((uint16_t *)(void *)x.d, ldx, x.d, ldx, 0, N, I, 1), xin = x.d;
#ifdef TFM_CUDA_EMULATION
                unsigned long long n0 = tfm_emu_lt_bias_calls();
#endif
                for (int k = 0; k < 2; k++) { /* k 1: cuBLASLt off for the thread */
                    tfm__cu.has_lt = k ? 0 : had, tfm__cu.lt_off = k;
                    tfm__model_prec = prec;
                    tfm__op_linear(TFM_DEVICE_CUDA, y[k].d + off, ldy, xin, ldx, w.d + off, b.d + off, N, I, O, xbf);
                    tfm__model_prec = 0;
                    tfm__cu.has_lt = had || tfm__cu.has_lt, tfm__cu.lt_off = 0;
                    had = tfm__cu.has_lt;
                    got[k] = cu_fetch(y[k].d, y[k].n, TFM_DEVICE_CUDA);
#ifdef TFM_CUDA_EMULATION
                    CHECK_MSG(tfm_emu_lt_bias_calls() - n0 == 1, "%s: %llu cuBLASLt products with a bias after %d maps",
                              name, tfm_emu_lt_bias_calls() - n0, k + 1);
#endif
                }
#ifdef TFM_CUDA_EMULATION
                cu_check_bits_arrays(name, got[0], got[1], y[0].n);
#else
                cu_check_scaled_arrays(name, got[0], got[1], y[0].n, CU_TOL, sqrt((double)I));
#endif
                free(got[0]), free(got[1]);
                cu_release(&x, &w, &b, &y[0], &y[1], CU_END);
            }
    for (int v = 0; v < 4; v++) { /* an MLP's first map: its bias by the epilogue, or by the activation's kernel */
        int act = v & 1 ? TFM_ACT_SWIGLU : TFM_ACT_GELU_TANH, prec = v & 2 ? TFM_PREC_BF16 : 0, had = tfm__cu.has_lt;
        int64_t N = 37, C = 24, F = 40, F1 = v & 1 ? 2 * F : F;
        cu_buf x = cu_normal(N * C, &g, 1, 0), w = cu_normal(F1 * C, &g, 0.3, 0), b = cu_normal(F1, &g, 1, 0);
        cu_buf y[2] = {cu_nan(N * F), cu_nan(N * F)}, pre[2] = {cu_nan(N * F1), cu_nan(N * F1)};
        char name[120];
        snprintf(name, sizeof name, "an MLP's first map with a bias through cuBLASLt: %s, precision %d",
                 v & 1 ? "SwiGLU" : "GELU", prec);
#ifdef TFM_CUDA_EMULATION
        unsigned long long n0 = tfm_emu_lt_bias_calls();
#endif
        for (int k = 0; k < 2; k++) {
            tfm__cu.has_lt = k ? 0 : had, tfm__cu.lt_off = k;
            tfm__model_prec = prec;
            tfm__op_linear_act(TFM_DEVICE_CUDA, act, y[k].d, pre[k].d, x.d, w.d, b.d, N, C, F, 0, 0);
            tfm__model_prec = 0;
            tfm__cu.has_lt = had = had || tfm__cu.has_lt, tfm__cu.lt_off = 0;
#ifdef TFM_CUDA_EMULATION
            CHECK_MSG(tfm_emu_lt_bias_calls() - n0 == 1, "%s: %llu cuBLASLt products with a bias after %d maps", name,
                      tfm_emu_lt_bias_calls() - n0, k + 1);
#endif
        }
        for (int o = 0; o < 2; o++) {
            cu_buf *q = o ? pre : y;
            float *a0 = cu_fetch(q[0].d, q[0].n, TFM_DEVICE_CUDA), *a1 = cu_fetch(q[1].d, q[1].n, TFM_DEVICE_CUDA);
#ifdef TFM_CUDA_EMULATION
            cu_check_bits_arrays(cu_fmt("%s: %s", name, o ? "pre-activation" : "activation"), a0, a1, q[0].n);
#else
            cu_check_scaled_arrays(cu_fmt("%s: %s", name, o ? "pre-activation" : "activation"), a0, a1, q[0].n, CU_TOL,
                                   sqrt((double)C));
#endif
            free(a0), free(a1);
        }
        cu_release(&x, &w, &b, &y[0], &y[1], &pre[0], &pre[1], CU_END);
    }
#ifdef TFM_CUDA_EMULATION
    { /* no algorithm for a new shape: the bias filled in and added to, and no second question for it */
        int64_t N = 5, I = 8, O = 12;
        cu_buf x = cu_normal(N * I, &g, 1, 0), w = cu_normal(O * I, &g, 0.3, 0), b = cu_normal(O, &g, 1, 0), y = cu_nan(N * O);
        unsigned long long n0 = tfm_emu_lt_bias_calls();
        tfm_emu_fail_next("cublasLtMatmulAlgoGetHeuristic", (int)CUBLAS_STATUS_NOT_SUPPORTED, 0);
        for (int k = 0; k < 2; k++) {
            CU_DEVS tfm__op_linear(CU_DEV, CU_P(y), O, CU_P(x), I, CU_P(w), CU_P(b), N, I, O, 0);
            cu_check("linear with a bias, no cuBLASLt algorithm", &y, CU_TOL);
        }
        CHECK_MSG(tfm_emu_lt_bias_calls() == n0 && !tfm_emu_fail_pending(), "no algorithm: %llu cuBLASLt products, a fault %s",
                  tfm_emu_lt_bias_calls() - n0, tfm_emu_fail_pending() ? "left" : "taken");
        cu_release(&x, &w, &b, &y, CU_END);
    }
#endif
}

/* The row shapes plus rows of a GPT-2 vocabulary (softmax, cross-entropy). */
static int cu_vocab_shapes(cu_nc *s) {
    int n = cu_shapes(s);
    n = cu_add_shape(s, n, 1, CU_VOCAB);
    if (!cu_small) {
        n = cu_add_shape(s, n, 3, CU_VOCAB);
        n = cu_add_shape(s, n, 33, CU_VOCAB);
    }
    return n;
}

/* softmax and log-softmax, forward and backward: logits of spread 3, one row shifted by +80 (exp
   overflows without the max subtracted); the backward reads the CPU's forward output on both devices.
   And once per kind in place (y == x). */
static void cu_op_softmax(void) {
    cu_nc sh[CU_MAX_SHAPES];
    cu_rng g = {14};
    int ns = cu_vocab_shapes(sh), i, lg;
    for (i = 0; i < ns; i++)
        for (lg = 0; lg < 2; lg++) {
            int64_t N = sh[i].N, C = sh[i].C, j;
            cu_buf x = cu_normal(N * C, &g, 3, 0), y = cu_nan(N * C), dy = cu_normal(N * C, &g, 1, 0), dx = cu_normal(N * C, &g, 1, 0);
            if (N > 1) {
                for (j = 0; j < C; j++) x.h[C + j] += 80.0f;
                cu_push(&x);
            }
            CU_DEVS tfm__op_softmax(CU_DEV, CU_P(y), CU_P(x), N, C, lg);
            cu_check(cu_fmt("%s N=%lld C=%lld: y", lg ? "log_softmax" : "softmax", (long long)N, (long long)C), &y, CU_TOL);
            cu_push(&y); /* backward from the CPU's y on both */
            CU_DEVS tfm__op_softmax_bwd(CU_DEV, CU_P(dx), CU_P(dy), CU_P(y), N, C, lg);
            cu_check(cu_fmt("%s N=%lld C=%lld: dx", lg ? "log_softmax" : "softmax", (long long)N, (long long)C), &dx, CU_TOL);
            if (i == 2) {
                CU_DEVS tfm__op_softmax(CU_DEV, CU_P(x), CU_P(x), N, C, lg);
                cu_check(cu_fmt("%s N=%lld C=%lld in place", lg ? "log_softmax" : "softmax", (long long)N, (long long)C), &x, CU_TOL);
            }
            cu_release(&x, &y, &dy, &dx, CU_END);
        }
}

/* cross_entropy and its backward: targets with ignore_index rows (-100), an ignore_index that is a real
   class (1), label smoothing 0 and 0.1, and a batch whose every row is ignored (loss 0, no gradient). */
static void cu_op_cross_entropy(void) {
    cu_nc sh[CU_MAX_SHAPES];
    cu_rng g = {15};
    int ns = cu_vocab_shapes(sh), i, v;
    for (i = 0; i < ns; i++)
        for (v = 0; v < 3; v++) {
            int64_t N = sh[i].N, V = sh[i].C, cnt[2] = {-1, -2}, r;
            int ignore = v == 1 ? 1 : -100;
            float s = v == 1 ? 0.1f : v == 2 ? 0.2f : 0.0f, loss[2];
            int32_t *t;
            char name[160];
            cu_buf x, lse, dx;
            if (v == 2 && N * V > 200000) continue; /* the all-ignored batch: small ones suffice */
            t = (int32_t *)malloc((size_t)N * sizeof(int32_t));
            x = cu_normal(N * V, &g, 2, 0);
            lse = cu_nan(N);
            dx = cu_normal(N * V, &g, 1, 0);
            for (r = 0; r < N; r++) t[r] = v == 2 ? -100 : (v == 0 && r % 3 == 2) ? -100 : (int32_t)cu_int(&g, (int)V);
            if (v == 0 && V >= 4) { /* -inf logits (a masked id) add nothing: the first of row 0, one in its middle */
                x.h[0] = x.h[V / 2] = -INFINITY;
                if (t[0] == 0 || t[0] == V / 2) t[0] = (int32_t)(V - 1);
                cu_push(&x);
            }
            snprintf(name, sizeof name, "cross_entropy N=%lld V=%lld ignore=%d smoothing=%g", (long long)N, (long long)V, ignore, (double)s);
            CU_DEVS loss[dv] = tfm__op_cross_entropy(CU_DEV, CU_P(lse), CU_P(x), 0, t, ignore, s, N, V, &cnt[dv], NULL);
            CHECK_MSG(cnt[0] == cnt[1], "%s: %lld rows counted on the device, %lld on the CPU", name, (long long)cnt[1], (long long)cnt[0]);
            cu_check_scalar(cu_fmt("%s: loss", name), loss[1], loss[0], CU_TOL, 1e-30);
            cu_check(cu_fmt("%s: lse", name), &lse, CU_TOL);
            cu_push(&lse);
            CU_DEVS tfm__op_cross_entropy_bwd(CU_DEV, CU_P(dx), 0.7f, CU_P(x), 0, CU_P(lse), t, ignore, s, N, V, 0);
            cu_check(cu_fmt("%s: dlogits", name), &dx, CU_TOL);
            cu_release(&x, &lse, &dx, CU_END);
            free(t);
        }
}

/* argmax (greedy decoding's pick) of rows across the block's width, each of a kind whose answer is known
   without the code under test: random values (the CPU's loop decides), the maximum planted twice (the
   first index wins), NaN at index 0 (0), NaN elsewhere (skipped), all -inf (0), all NaN (0) */
static void cu_op_argmax(void) {
    static const int64_t Vs[] = {1, 2, 31, 32, 33, 511, 513, 5000};
    cu_rng g = {23};
    int vi, r;
    for (vi = 0; vi < (int)(sizeof Vs / sizeof Vs[0]); vi++) {
        int64_t V = Vs[vi], j, N = 6, lo = V / 7, hi = V - 1 - V / 5;
        int32_t ids[2][6], want[6];
        cu_buf x = cu_normal(N * V, &g, 1, 0);
        float *h = x.h;
        want[0] = -1; /* random: the CPU loop's answer, checked below to be the row's maximum */
        h[V + lo] = h[V + hi] = 9.0f, want[1] = (int32_t)lo; /* a tie: the first index */
        h[2 * V] = NAN, want[2] = 0;
        for (j = 1; j < V; j += 3) h[3 * V + j] = NAN; /* NaN among the values: the greatest other value */
        h[3 * V + hi] = 8.0f, want[3] = (int32_t)hi;
        for (j = 0; j < V; j++) h[4 * V + j] = -INFINITY, h[5 * V + j] = NAN;
        want[4] = want[5] = 0;
        cu_push(&x);
        CU_DEVS tfm__op_argmax(CU_DEV, ids[dv], CU_P(x), N, V);
        for (j = 1; j < V; j++) CHECK_MSG(h[ids[0][0]] >= h[j], "argmax V=%lld: row 0 holds %g at %lld above the pick %d", (long long)V, (double)h[j], (long long)j, ids[0][0]);
        for (r = 0; r < (int)N; r++) {
            if (want[r] >= 0) CHECK_MSG(ids[0][r] == want[r], "argmax V=%lld row %d: CPU %d, want %d", (long long)V, r, ids[0][r], want[r]);
            CHECK_MSG(ids[1][r] == ids[0][r], "argmax V=%lld row %d: device %d, CPU %d", (long long)V, r, ids[1][r], ids[0][r]);
        }
        cu_release(&x, CU_END);
    }
}

/* The largest mean |a + b| over N rows of C floats (b may be NULL): the size of the terms each row's mean
   sums, which its rounding error scales with; the mean itself may cancel to far less (a row of 1024
   normals of sd 2 whose mean came out 5.6e-4, 1e-8 apart on the two devices: 2e-5 of the mean, 7e-9 of
   the terms). */
static double cu_mean_abs(const float *a, const float *b, int64_t N, int64_t C) {
    double mx = 0.0;
    for (int64_t i = 0; i < N; i++) {
        double s = 0.0;
        for (int64_t j = 0; j < C; j++) s += fabs((double)a[i * C + j] + (b ? (double)b[i * C + j] : 0.0));
        mx = fmax(mx, s / (double)C);
    }
    return mx;
}

/* layernorm forward (with and without gain, bias and saved statistics; rows with a mean of 10, where
   the variance cancels; after a residual add, fused on the GPU) and backward, with the residual NULL (dx written), dx itself (accumulate), a
   separate buffer, and dx left out; dg and db accumulate, or are left out. The same for RMSNorm (rms: no
   mean, no bias). The saved mean is compared relative to the size of its terms (cu_mean_abs). */
static void cu_op_layernorm(void) {
    cu_nc sh[CU_MAX_SHAPES];
    cu_rng g = {16};
    int ns = cu_shapes(sh), i, v, rms;
    for (rms = 0; rms < 2; rms++)
        for (i = 0; i < ns; i++)
            for (v = 0; v < 4; v++) {
                int64_t N = sh[i].N, C = sh[i].C;
                int has_g = v != 2, has_b = !rms && (v == 0 || v == 3), has_dg = v != 2;
                char name[160];
                /* rows of mean 10 (odd variants) only when C >= 32: with fewer samples a row's spread may be tiny, and
                   then 1/sigma amplifies the one-ulp difference the two devices' sums give the mean (the problem's
                   conditioning |mean|/sigma, not a kernel's error) */
                cu_buf x = cu_normal(N * C, &g, 2, C >= 32 ? 10.0 * (v & 1) : 0.0), gn = cu_normal(C, &g, 0.5, 1), bb = cu_normal(C, &g, 0.5, 0);
                cu_buf y = cu_nan(N * C), mean = cu_nan(N), rstd = cu_nan(N), dy = cu_normal(N * C, &g, 1, 0);
                cu_buf dx = v == 0 ? cu_nan(N * C) : cu_normal(N * C, &g, 1, 0), res = cu_normal(N * C, &g, 1, 0);
                cu_buf dg = cu_normal(C, &g, 1, 0), db = cu_normal(C, &g, 1, 0);
                snprintf(name, sizeof name, "%s N=%lld C=%lld gain=%d bias=%d", rms ? "rmsnorm" : "layernorm", (long long)N,
                         (long long)C, has_g, has_b);
                CU_DEVS tfm__op_layernorm(CU_DEV, CU_P(y), rms ? NULL : CU_P(mean), CU_P(rstd), CU_P(x), has_g ? CU_P(gn) : NULL,
                                          has_b ? CU_P(bb) : NULL, 1e-5f, N, C, rms, 0);
                cu_check(cu_fmt("%s: y", name), &y, CU_TOL);
                if (!rms) cu_check_scaled(cu_fmt("%s: mean", name), &mean, CU_TOL, cu_mean_abs(x.h, NULL, N, C));
                cu_check(cu_fmt("%s: rstd", name), &rstd, CU_TOL);
                if (v == 3) { /* without the statistics */
                    cu_buf y2 = cu_nan(N * C);
                    CU_DEVS tfm__op_layernorm(CU_DEV, CU_P(y2), NULL, NULL, CU_P(x), CU_P(gn), has_b ? CU_P(bb) : NULL, 1e-5f, N, C, rms, 0);
                    cu_check(cu_fmt("%s: y without statistics", name), &y2, CU_TOL);
                    cu_free(&y2);
                }
                { /* with the residual add before it (one kernel on the GPU): s = x + r written, then the norm of s */
                    cu_buf r = cu_normal(N * C, &g, 1, 0), sum = cu_nan(N * C), y3 = cu_nan(N * C), m3 = cu_nan(N), r3 = cu_nan(N);
                    CU_DEVS tfm__op_add_layernorm(CU_DEV, CU_P(sum), CU_P(y3), rms ? NULL : CU_P(m3), CU_P(r3), CU_P(x), CU_P(r), 0,
                                                  has_g ? CU_P(gn) : NULL, has_b ? CU_P(bb) : NULL, 1e-5f, N, C, rms, 0);
                    cu_check(cu_fmt("%s after an add: the sum", name), &sum, CU_TOL);
                    cu_check(cu_fmt("%s after an add: y", name), &y3, CU_TOL);
                    if (!rms) cu_check_scaled(cu_fmt("%s after an add: mean", name), &m3, CU_TOL, cu_mean_abs(x.h, r.h, N, C));
                    cu_check(cu_fmt("%s after an add: rstd", name), &r3, CU_TOL);
                    cu_release(&r, &sum, &y3, &m3, &r3, CU_END);
                }
                if (!rms) cu_push(&mean); /* backward from the CPU's statistics on both */
                cu_push(&rstd);
                CU_DEVS {
                    float *pdx = v == 3 ? NULL : CU_P(dx);
                    const float *pres = v == 0 ? NULL : v == 1 ? CU_P(dx) : CU_P(res);
                    tfm__op_layernorm_bwd(CU_DEV, pdx, pres, has_dg ? CU_P(dg) : NULL, has_b ? CU_P(db) : NULL, CU_P(dy), CU_P(x),
                                          has_g ? CU_P(gn) : NULL, rms ? NULL : CU_P(mean), CU_P(rstd), N, C, rms);
                }
                {
                    /* dx = rstd (dn - mean(dn) - xhat mean(dn xhat)) cancels (exactly, over one column) from terms of size
                       rstd |dy g|: that size floors the relative error (a fused multiply-add leaves a rounding residue) */
                    double scale = 0.0, mdy = 0.0, mg = 1.0;
                    int64_t j;
                    for (j = 0; j < N; j++) scale = fmax(scale, (double)rstd.h[j]);
                    for (j = 0; j < N * C; j++) mdy = fmax(mdy, fabs((double)dy.h[j]));
                    for (j = 0; has_g && j < C; j++) mg = fmax(mg, fabs((double)gn.h[j]));
                    cu_check_scaled(cu_fmt("%s: dx (residual %s)", name, v == 0 ? "none" : v == 1 ? "dx" : v == 2 ? "separate" : "-, no dx"), &dx,
                                    CU_TOL, scale * mdy * mg);
                }
                cu_check(cu_fmt("%s: dgain", name), &dg, CU_TOL);
                cu_check(cu_fmt("%s: dbias", name), &db, CU_TOL);
                cu_release(&x, &gn, &bb, &y, &mean, &rstd, &dy, &dx, &res, &dg, &db, CU_END);
            }
}

/* ReLU, GELU and tanh-GELU forward and backward (dx overwritten with acc 0, accumulated with acc 1), on
   values of spread 3 with an exact 0 and +-30 (the clamps of exp and tanh). */
static void cu_op_act(void) {
    static const int acts[3] = {TFM_ACT_RELU, TFM_ACT_GELU, TFM_ACT_GELU_TANH};
    static const char *const names[3] = {"relu", "gelu", "gelu_tanh"};
    cu_rng g = {17};
    int64_t counts[16];
    int nc = cu_counts(counts), i, a, acc;
    for (i = 0; i < nc; i++)
        for (a = 0; a < 3; a++) {
            int64_t n = counts[i];
            cu_buf x = cu_normal(n, &g, 3, 0), y = cu_nan(n), dy = cu_normal(n, &g, 1, 0);
            x.h[0] = 0.0f;
            if (n > 4) {
                x.h[1] = 30.0f;
                x.h[2] = -30.0f;
                x.h[3] = 9.5f;
            }
            cu_push(&x);
            CU_DEVS tfm__op_act(CU_DEV, acts[a], CU_P(y), CU_P(x), n);
            cu_check(cu_fmt("%s n=%lld: y", names[a], (long long)n), &y, CU_TOL);
            for (acc = 0; acc < 2; acc++) {
                cu_buf dx = acc ? cu_normal(n, &g, 1, 0) : cu_nan(n);
                CU_DEVS tfm__op_act_bwd(CU_DEV, acts[a], CU_P(dx), CU_P(dy), CU_P(x), n, (float)acc);
                cu_check(cu_fmt("%s n=%lld: dx (acc %d)", names[a], (long long)n, acc), &dx, CU_TOL);
                cu_free(&dx);
            }
            cu_release(&x, &y, &dy, CU_END);
        }
}

/* An MLP's first linear map with its activation (the product, then bias and activation in one pass on the
   GPU): pre and y for ReLU, GELU (erf, tanh) and SwiGLU (rows of 2F: gate, up), with a bias or none; then
   SwiGLU's backward (dh written whole), with gates of 0 and +-30 */
static void cu_op_linear_act(void) {
    static const int acts[4] = {TFM_ACT_RELU, TFM_ACT_GELU, TFM_ACT_GELU_TANH, TFM_ACT_SWIGLU};
    static const char *const names[4] = {"relu", "gelu", "gelu_tanh", "swiglu"};
    cu_mnk pr[16];
    cu_rng g = {18};
    int np = cu_products(pr), i, a;
    for (i = 0; i < np; i++)
        for (a = 0; a < 4; a++) {
            int64_t N = pr[i].M, C = pr[i].K, F = pr[i].N, F1 = acts[a] == TFM_ACT_SWIGLU ? 2 * F : F;
            int bias = (i + a) % 3 != 0;
            cu_buf x = cu_normal(N * C, &g, 1, 0), w = cu_normal(F1 * C, &g, 2.0 / sqrt((double)C), 0), b = cu_normal(F1, &g, 1, 0);
            cu_buf pre = cu_nan(N * F1), y = cu_nan(N * F);
            char name[160];
            snprintf(name, sizeof name, "linear_act %s N=%lld C=%lld F=%lld bias=%d", names[a], (long long)N, (long long)C,
                     (long long)F, bias);
            CU_DEVS tfm__op_linear_act(CU_DEV, acts[a], CU_P(y), CU_P(pre), CU_P(x), CU_P(w), bias ? CU_P(b) : NULL, N, C, F, 0, 0);
            cu_check(cu_fmt("%s: pre", name), &pre, CU_TOL);
            cu_check(cu_fmt("%s: y", name), &y, CU_TOL);
            if (acts[a] == TFM_ACT_SWIGLU) {
                cu_buf h = cu_normal(N * 2 * F, &g, 3, 0), dy = cu_normal(N * F, &g, 1, 0), dh = cu_nan(N * 2 * F);
                h.h[0] = 0.0f;
                if (F > 3) {
                    h.h[1] = 30.0f;
                    h.h[2] = -30.0f;
                }
                cu_push(&h);
                CU_DEVS tfm__op_swiglu_bwd(CU_DEV, CU_P(dh), CU_P(dy), 0, CU_P(h), N, F, 0, 0);
                cu_check(cu_fmt("swiglu N=%lld F=%lld: dh", (long long)N, (long long)F), &dh, CU_TOL);
                cu_release(&h, &dy, &dh, CU_END);
            }
            cu_release(&x, &w, &b, &pre, &y, CU_END);
        }
}

/* rotary embedding: forward written, backward (the transpose) added, rows at offsets (host integers), part
   of each head turned; angles up to ~1e4 rad, where float angles would drift. And the forward written in
   bf16 (acc 2, a bf16 model's q and k) against the rounding of the fp32 one: the same bits, the rest of the
   buffer untouched (NaN) */
static void cu_op_rope(void) {
    /* T, H, D, rot (12 heads of 48 turned pairs and 32 kept channels: 960 a row, in all TFM__CU_U slots of
       a block's 256 threads; 4,200 rows, more than the grid's 4,096, so that its y comes round again) */
    static const int shapes[7][4] = {{1, 2, 2, 2},  {3, 2, 16, 16},  {5, 3, 24, 8},   {33, 4, 64, 64},
                                     {6, 2, 80, 72}, {3, 12, 128, 96}, {2100, 1, 4, 2}};
    static const int32_t pos0[2] = {0, 9000};
    cu_rng g = {19};
    int i, off;
    for (i = 0; i < CU_LEN(shapes); i++)
        for (off = 0; off < 2; off++) {
            int T = shapes[i][0], H = shapes[i][1], D = shapes[i][2], rot = shapes[i][3];
            int64_t n = (int64_t)2 * T * H * D;
            cu_buf x = cu_normal(n, &g, 1, 0), y = cu_nan(n), dx = cu_normal(n, &g, 1, 0);
            const int32_t *p0 = off ? pos0 : NULL;
            CU_DEVS tfm__op_rope(CU_DEV, CU_P(y), CU_P(x), (int64_t)H * D, 2, T, H, D, rot, 10000.0f, p0, 0, 0);
            cu_check(cu_fmt("rope T=%d H=%d D=%d rot=%d offsets %d: y", T, H, D, rot, off), &y, CU_TOL);
            CU_DEVS tfm__op_rope(CU_DEV, CU_P(dx), CU_P(y), (int64_t)H * D, 2, T, H, D, rot, 10000.0f, p0, 1, 1);
            cu_check(cu_fmt("rope T=%d H=%d D=%d rot=%d offsets %d: dx", T, H, D, rot, off), &dx, CU_TOL);
            { /* acc 2: y in bf16, each the rounding of the fp32 rotation's (a bf16 model's q and k) */
                cu_buf yb = cu_nan(n), yr = cu_nan(n);
                float *a, *b;
                tfm__op_rope(TFM_DEVICE_CUDA, yb.d, x.d, (int64_t)H * D, 2, T, H, D, rot, 10000.0f, p0, 0, 2);
                tfm__op_rope(TFM_DEVICE_CUDA, y.d, x.d, (int64_t)H * D, 2, T, H, D, rot, 10000.0f, p0, 0, 0);
                tfm__op_to_bf16(TFM_DEVICE_CUDA, yr.d, (int64_t)H * D, 0, y.d, (int64_t)H * D, (int64_t)2 * T, (int64_t)H * D);
                a = cu_fetch(yb.d, n, TFM_DEVICE_CUDA), b = cu_fetch(yr.d, n, TFM_DEVICE_CUDA);
                cu_check_bits_arrays(cu_fmt("rope T=%d H=%d D=%d rot=%d offsets %d: y in bf16", T, H, D, rot, off), a, b, n);
                free(a), free(b);
                cu_release(&yb, &yr, CU_END);
            }
            cu_release(&x, &y, &dx, CU_END);
        }
}

/* dropout: the mask is a hash of (seed, i0 + i) on both devices, so outputs are equal bit for bit, with
   i0 past 2^32 too, written (acc 0) or added (acc 1). */
static void cu_op_dropout(void) {
    static const float ps[3] = {0.0f, 0.1f, 0.5f};
    static const uint64_t seeds[2] = {1, 0xDEADBEEF12345ull}, i0s[2] = {0, ((uint64_t)1 << 33) + 5};
    cu_rng g = {18};
    int64_t counts[16];
    int nc = cu_counts(counts), i, p, k, acc;
    for (i = 0; i < nc; i++)
        for (p = 0; p < 3; p++)
            for (k = 0; k < 2; k++)
                for (acc = 0; acc < 2; acc++) {
                    int64_t n = counts[i];
                    cu_buf x = cu_normal(n, &g, 1, 0), y = acc ? cu_normal(n, &g, 1, 0) : cu_nan(n);
                    CU_DEVS tfm__op_dropout(CU_DEV, CU_P(y), CU_P(x), n, ps[p], seeds[k], i0s[k], acc);
                    cu_check_bits(cu_fmt("dropout n=%lld p=%g i0=%llu acc=%d", (long long)n, (double)ps[p], (unsigned long long)i0s[k], acc), &y);
                    cu_release(&x, &y, CU_END);
                }
}

/* embedding lookups and their gradient: ids into a vocabulary of 7 (every id repeated: colliding adds)
   and into a large one, scale 1 and sqrt(C). */
static void cu_op_embedding(void) {
    cu_nc sh[CU_MAX_SHAPES];
    cu_rng g = {19};
    int ns = cu_shapes(sh), i, v;
    for (i = 0; i < ns; i++)
        for (v = 0; v < 2; v++) {
            int64_t N = sh[i].N, C = sh[i].C, V = v ? 7 : C <= 129 ? CU_VOCAB : 1000, r;
            float scale = v ? sqrtf((float)C) : 1.0f;
            int32_t *ids = (int32_t *)malloc((size_t)N * sizeof(int32_t));
            char name[160];
            cu_buf w = cu_normal(V * C, &g, 1, 0), y = cu_nan(N * C), dy = cu_normal(N * C, &g, 1, 0), dw = cu_normal(V * C, &g, 1, 0);
            snprintf(name, sizeof name, "embedding N=%lld C=%lld V=%lld", (long long)N, (long long)C, (long long)V);
            for (r = 0; r < N; r++) ids[r] = (int32_t)cu_int(&g, (int)V);
            ids[0] = (int32_t)(V - 1);
            CU_DEVS tfm__op_embedding(CU_DEV, CU_P(y), ids, CU_P(w), scale, N, C);
            cu_check(cu_fmt("%s: y", name), &y, CU_TOL);
            CU_DEVS tfm__op_embedding_bwd(CU_DEV, CU_P(dw), CU_P(dy), ids, scale, N, C);
            cu_check(cu_fmt("%s: dw", name), &dw, CU_TOL);
            cu_release(&w, &y, &dy, &dw, CU_END);
            free(ids);
        }
}

/* The small staged arrays the GPU keeps (tfm__cuda_kept; positions, as a decoding step's for every layer):
   11 arrays of row offsets, more than it keeps, staged in turn three times over (each new one takes the
   place of the one asked for least recently), every result against the CPU's; then the same array twice
   in a row: the second time nothing is copied (counted by the emulation). */
static void cu_op_kept(void) {
    enum { NP = 11, B = 6, T = 2, C = 5, P = 40 };
    cu_rng g = {23};
    int32_t p0[NP][B];
    cu_buf w = cu_normal(P * C, &g, 1, 0), x = cu_normal(B * T * C, &g, 1, 0), y = cu_nan(B * T * C);
    int p, r, i;
    for (p = 0; p < NP; p++)
        for (i = 0; i < B; i++) p0[p][i] = (int32_t)cu_int(&g, P - T + 1);
    for (r = 0; r < 3; r++)
        for (p = 0; p < NP; p++) {
            CU_DEVS tfm__op_pos_add(CU_DEV, CU_P(y), CU_P(x), CU_P(w), p0[p], B, T, C);
            cu_check_bits(cu_fmt("kept arrays: round %d, array %d", r, p), &y);
        }
#ifdef TFM_CUDA_EMULATION
    {
        unsigned long long c0;
        tfm__op_pos_add(TFM_DEVICE_CUDA, y.d, x.d, w.d, p0[0], B, T, C);
        c0 = tfm_emu_copies();
        tfm__op_pos_add(TFM_DEVICE_CUDA, y.d, x.d, w.d, p0[0], B, T, C);
        CHECK_MSG(tfm_emu_copies() == c0, "the same positions staged twice: %llu copies the second time", tfm_emu_copies() - c0);
    }
#endif
    cu_release(&w, &x, &y, CU_END);
}

/* (B, T, C) of the position and pooling ops (5 x 1000 rows: more than the row kernels' grid, whose y comes
   round again) */
typedef struct cu_btc { int64_t B, T, C; } cu_btc;
static int cu_btcs(cu_btc *s) {
    static const cu_btc full[] = {{1, 1, 1}, {2, 31, 33}, {3, 33, 129}, {2, 257, 32}, {5, 1000, 3}, {1, 2, 4097}, {2, 64, 1025}};
    static const cu_btc small[] = {{1, 1, 1}, {2, 33, 33}, {1, 2, 4097}, {2, 1000, 3}};
    int n = cu_small ? CU_LEN(small) : CU_LEN(full);
    memcpy(s, cu_small ? small : full, (size_t)n * sizeof(cu_btc));
    return n;
}

/* learned positions (y = x + w[t], in place too; dw[t] += sum over b of dy[b,t]) and sinusoidal ones (the
   table alone, and added), up to position 999 (where a float argument of sin would be off by 6e-5). */
static void cu_op_positions(void) {
    cu_btc s[16];
    cu_rng g = {20};
    int n = cu_btcs(s), i;
    for (i = 0; i < n; i++) {
        int64_t B = s[i].B, T = s[i].T, C = s[i].C, P = T + 3;
        char name[160];
        cu_buf x = cu_normal(B * T * C, &g, 1, 0), w = cu_normal(P * C, &g, 1, 0), y = cu_nan(B * T * C);
        cu_buf dy = cu_normal(B * T * C, &g, 1, 0), dw = cu_normal(P * C, &g, 1, 0), pe = cu_nan(T * C);
        snprintf(name, sizeof name, "positions B=%lld T=%lld C=%lld", (long long)B, (long long)T, (long long)C);
        CU_DEVS tfm__op_pos_add(CU_DEV, CU_P(y), CU_P(x), CU_P(w), NULL, B, T, C);
        cu_check(cu_fmt("%s: pos_add", name), &y, CU_TOL);
        CU_DEVS tfm__op_pos_bwd(CU_DEV, CU_P(dw), CU_P(dy), B, T, C);
        cu_check(cu_fmt("%s: pos_bwd", name), &dw, CU_TOL);
        CU_DEVS tfm__op_sinusoid_add(CU_DEV, CU_P(pe), NULL, 1, T, C);
        cu_check(cu_fmt("%s: sinusoid table", name), &pe, CU_TOL);
        CU_DEVS tfm__op_sinusoid_add(CU_DEV, CU_P(y), CU_P(x), B, T, C);
        cu_check(cu_fmt("%s: sinusoid_add", name), &y, CU_TOL);
        CU_DEVS tfm__op_pos_add(CU_DEV, CU_P(x), CU_P(x), CU_P(w), NULL, B, T, C);
        cu_check(cu_fmt("%s: pos_add in place", name), &x, CU_TOL);
        { /* each row from its own position (decoding): 0..3 of the table's T + 3 rows */
            int32_t *p0 = (int32_t *)malloc((size_t)B * sizeof(int32_t));
            int64_t b;
            for (b = 0; b < B; b++) p0[b] = (int32_t)((b * 5 + 2) % 4);
            CU_DEVS tfm__op_pos_add(CU_DEV, CU_P(y), CU_P(x), CU_P(w), p0, B, T, C);
            cu_check(cu_fmt("%s: pos_add from per-row positions", name), &y, CU_TOL);
            free(p0);
        }
        cu_release(&x, &w, &y, &dy, &dw, &pe, CU_END);
    }
}

/* y = a + b, also with y aliasing a or b: one float add each, bit for bit. */
static void cu_op_add(void) {
    cu_rng g = {21};
    int64_t counts[16];
    int nc = cu_counts(counts), i;
    for (i = 0; i < nc; i++) {
        int64_t n = counts[i];
        cu_buf a = cu_normal(n, &g, 1, 0), b = cu_normal(n, &g, 1, 0), y = cu_nan(n);
        CU_DEVS tfm__op_add(CU_DEV, CU_P(y), CU_P(a), CU_P(b), n);
        cu_check_bits(cu_fmt("add n=%lld", (long long)n), &y);
        CU_DEVS tfm__op_add(CU_DEV, CU_P(a), CU_P(a), CU_P(b), n);
        cu_check_bits(cu_fmt("add n=%lld, y = a", (long long)n), &a);
        CU_DEVS tfm__op_add(CU_DEV, CU_P(b), CU_P(a), CU_P(b), n);
        cu_check_bits(cu_fmt("add n=%lld, y = b", (long long)n), &b);
        cu_release(&a, &b, &y, CU_END);
    }
}

/* mean pooling over lens[b] positions (lengths 0, 1, T and between; or all T) and first-token pooling,
   forward and backward (which adds into dx, leaving the other positions as they were). */
static void cu_op_pool(void) {
    cu_btc s[16];
    cu_rng g = {22};
    int n = cu_btcs(s), i, lm;
    for (i = 0; i < n; i++)
        for (lm = 0; lm < 2; lm++) {
            int64_t B = s[i].B, T = s[i].T, C = s[i].C, b;
            int32_t lens[8];
            char name[160];
            cu_buf x = cu_normal(B * T * C, &g, 1, 0), y = cu_nan(B * C), dy = cu_normal(B * C, &g, 1, 0), dx = cu_normal(B * T * C, &g, 1, 0);
            snprintf(name, sizeof name, "pool B=%lld T=%lld C=%lld lens=%d", (long long)B, (long long)T, (long long)C, lm);
            for (b = 0; b < B; b++) lens[b] = (int32_t)(b % 4 == 0 ? T : b % 4 == 1 ? 0 : b % 4 == 2 ? 1 : T / 2 + 1);
            CU_DEVS tfm__op_pool(CU_DEV, TFM_POOL_MEAN, CU_P(y), CU_P(x), lm ? lens : NULL, B, T, C);
            cu_check(cu_fmt("%s: mean", name), &y, CU_TOL);
            CU_DEVS tfm__op_pool_bwd(CU_DEV, TFM_POOL_MEAN, CU_P(dx), CU_P(dy), lm ? lens : NULL, B, T, C);
            cu_check(cu_fmt("%s: mean backward", name), &dx, CU_TOL);
            if (!lm) { /* fresh outputs: the mean pooling's may differ in their last bits */
                cu_buf yc = cu_nan(B * C), dxc = cu_normal(B * T * C, &g, 1, 0);
                CU_DEVS tfm__op_pool(CU_DEV, TFM_POOL_CLS, CU_P(yc), CU_P(x), NULL, B, T, C);
                cu_check_bits(cu_fmt("%s: cls", name), &yc);
                CU_DEVS tfm__op_pool_bwd(CU_DEV, TFM_POOL_CLS, CU_P(dxc), CU_P(dy), NULL, B, T, C);
                cu_check_bits(cu_fmt("%s: cls backward", name), &dxc);
                cu_release(&yc, &dxc, CU_END);
            }
            cu_release(&x, &y, &dy, &dx, CU_END);
        }
}

/* AdamW's element update (across the CPU's spans of 2048) and the sum of squares behind clipping. */
/* AdamW and the gradient norm (tfm__op_sumsq, tfm__op_adamw): the GPU's AdamW reads the squared norm
   that the last tfm__op_sumsq left on the device and clips with it as the CPU does with the host's */
static void cu_op_adamw(void) {
    static const int64_t full[] = {1, 7, 2047, 2048, 2049, 3 * 4097 + 5, 1000 * 1025};
    static const int64_t small[] = {1, 2049, 4097};
    const int64_t *ns = cu_small ? small : full;
    int nn = cu_small ? CU_LEN(small) : CU_LEN(full), i, k;
    cu_rng g = {23};
    for (i = 0; i < nn; i++) {
        int64_t n = ns[i], j;
        cu_buf w = cu_normal(n, &g, 1, 0), gr = cu_normal(n, &g, 0.1, 0), m = cu_normal(n, &g, 0.01, 0), v = cu_normal(n, &g, 0.001, 0);
        double ss[2];
        for (j = 0; j < n; j++) v.h[j] = fabsf(v.h[j]);
        cu_push(&v);
        for (k = 1; k <= 3; k++) { /* steps 1..3: bias corrections, clipping (a factor of about 0.37, none in
                                      step 2), decay */
            double lr = 1e-3, bc1 = 1.0 - pow(0.9, k), bc2 = 1.0 - pow(0.999, k);
            float decay = k == 3 ? 1.0f : (float)(1.0 - lr * 0.01);
            CU_DEVS {
                tfm_adamw_param p;
                double sumsq;
                p.value = cu_t(&w, dv, n, 0, 0), p.grad = cu_t(&gr, dv, n, 0, 0), p.m = cu_t(&m, dv, n, 0, 0);
                p.v = cu_t(&v, dv, n, 0, 0), p.decay = k != 2; /* step 2: decay_all does it */
                sumsq = tfm__op_sumsq(CU_DEV, &p, 1);
                tfm__op_adamw(CU_DEV, &p, 1, k == 2 ? 0.0f : (float)(0.37 * sqrt(sumsq)), sumsq, 0.9f, 0.999f, 1e-8f,
                              (float)(lr / bc1), (float)sqrt(bc2), decay, k == 2);
            }
        }
        cu_check(cu_fmt("adamw n=%lld: w", (long long)n), &w, CU_TOL);
        cu_check(cu_fmt("adamw n=%lld: m", (long long)n), &m, CU_TOL);
        cu_check(cu_fmt("adamw n=%lld: v", (long long)n), &v, CU_TOL);
        CU_DEVS {
            tfm_adamw_param p;
            memset(&p, 0, sizeof p);
            p.grad = cu_t(&gr, dv, n, 0, 0);
            ss[dv] = tfm__op_sumsq(CU_DEV, &p, 1);
        }
        cu_check_scalar(cu_fmt("sumsq n=%lld", (long long)n), ss[1], ss[0], CU_TOL, 1e-30);
        cu_release(&w, &gr, &m, &v, CU_END);
    }
    { /* the sum of squares of a list of gradients of every count against the CPU's, and, on each device,
         exactly the sum in list order of each parameter's alone; then 300 parameters (two launches of
         256 and 44 on the GPU), likewise */
        int64_t counts[300];
        int nc = cu_counts(counts), pass;
        cu_buf x[300];
        tfm_adamw_param ps[2][300];
        double ss[2], alone[2][300], inorder;
        memset(ps, 0, sizeof ps);
        for (pass = 0; pass < 2; pass++) {
            if (pass) {
                nc = 300;
                for (i = 0; i < nc; i++) counts[i] = 1 + (i * 7919) % (cu_small ? 700 : 5000);
            }
            for (i = 0; i < nc; i++) x[i] = cu_normal(counts[i], &g, 1, 0);
            CU_DEVS {
                for (i = 0; i < nc; i++) ps[dv][i].grad = cu_t(&x[i], dv, counts[i], 0, 0);
                ss[dv] = tfm__op_sumsq(CU_DEV, ps[dv], nc);
                inorder = 0.0;
                for (i = 0; i < nc; i++) inorder += alone[dv][i] = tfm__op_sumsq(CU_DEV, &ps[dv][i], 1);
                CHECK_MSG(inorder == ss[dv], "device %d: sumsq of %d parameters %.17g, their own added in order %.17g", dv, nc,
                          ss[dv], inorder);
            }
            cu_check_scalar(cu_fmt("sumsq of a list of %d", nc), ss[1], ss[0], CU_TOL, 1e-30);
            for (i = 0; i < nc; i++)
                cu_check_scalar(cu_fmt("sumsq n=%lld (a list of %d)", (long long)counts[i], nc), alone[1][i], alone[0][i], CU_TOL,
                                1e-30);
            if (!pass)
                for (i = 0; i < nc; i++) cu_free(&x[i]);
        }
        /* AdamW over the 300 in one call (two launches on the GPU), every other parameter decayed, clipped
           by their norm to a factor of about 0.5: each parameter against the CPU's update of it; then a
           gradient made NaN: nothing changes on either device */
        {
            static cu_buf wm[3][300];
            int t, bad;
            for (i = 0; i < nc; i++)
                for (t = 0; t < 3; t++) wm[t][i] = cu_normal(counts[i], &g, t == 0 ? 1.0 : 0.01, 0);
            for (i = 0; i < nc; i++) {
                int64_t j;
                for (j = 0; j < counts[i]; j++) wm[2][i].h[j] = fabsf(wm[2][i].h[j]);
                cu_push(&wm[2][i]);
            }
            for (bad = 0; bad < 2; bad++) {
                if (bad) { /* the last parameter's gradient NaN at one place */
                    x[nc - 1].h[counts[nc - 1] / 2] = NAN;
                    cu_push(&x[nc - 1]);
                    for (i = 0; i < nc; i++) /* both devices from the CPU's values */
                        for (t = 0; t < 3; t++) cu_push(&wm[t][i]);
                }
                CU_DEVS {
                    double sumsq;
                    for (i = 0; i < nc; i++) {
                        ps[dv][i].value = cu_t(&wm[0][i], dv, counts[i], 0, 0);
                        ps[dv][i].m = cu_t(&wm[1][i], dv, counts[i], 0, 0);
                        ps[dv][i].v = cu_t(&wm[2][i], dv, counts[i], 0, 0);
                        ps[dv][i].decay = i % 2;
                    }
                    sumsq = tfm__op_sumsq(CU_DEV, ps[dv], nc);
                    CHECK_MSG(bad == !isfinite(sumsq), "device %d: sumsq %g with%s a NaN", dv, sumsq, bad ? "" : "out");
                    if (dv || !bad) /* the CPU's caller refuses a NaN norm (tfm__adamw_apply); the GPU's kernels too */
                        tfm__op_adamw(CU_DEV, ps[dv], nc, bad ? 1.0f : (float)(0.5 * sqrt(sumsq)), sumsq, 0.9f, 0.999f,
                                      1e-8f, 1e-3f, 0.03f, 0.99f, 0);
                }
                for (i = 0; i < nc; i++)
                    for (t = 0; t < 3; t++) {
                        const char *nm = t == 0 ? "w" : t == 1 ? "m" : "v";
                        if (bad) cu_check_bits(cu_fmt("adamw with a NaN gradient, n=%lld: %s unchanged", (long long)counts[i], nm), &wm[t][i]);
                        else cu_check(cu_fmt("adamw n=%lld (a list of %d): %s", (long long)counts[i], nc, nm), &wm[t][i], CU_TOL);
                    }
            }
            for (i = 0; i < nc; i++)
                for (t = 0; t < 3; t++) cu_free(&wm[t][i]);
        }
        for (i = 0; i < nc; i++) cu_free(&x[i]);
    }
}

/* ---- attention entries ---- */

/* One case of the fused attention, forward and backward on both devices. */
typedef struct cu_att {
    int B, H, D, Tq, Tk;
    int causal;
    int lens;      /* 1: key lengths Tk, 0, 1, Tk/2+1 (repeating over the batch rows); 0: none */
    int mask;      /* 1: one additive (Tq,Tk) mask; 2: one per batch row; 0: none. -inf entries, and one
                      query row hidden entirely */
    float dropout;
    int fused;     /* q|k|v in one (B,T,3C) buffer and their gradients likewise (a self-attention layer's) */
    int grads;     /* which gradients backward gets: bit 0 dq, 1 dk, 2 dv */
    int one_key;   /* every query sees one key: backward adds exactly nothing to dq and dk on either device */
    int window, sinks; /* causal: a sliding window and its sinks (tfm_attn_opts.window, .sinks) */
} cu_att;

static cu_att cu_att_make(int B, int H, int D, int Tq, int Tk, int causal) {
    cu_att c;
    memset(&c, 0, sizeof c);
    c.B = B;
    c.H = H;
    c.D = D;
    c.Tq = Tq;
    c.Tk = Tk;
    c.causal = causal;
    c.grads = 7;
    return c;
}

static void cu_att_run(const cu_att *c) {
    int B = c->B, H = c->H, D = c->D, Tq = c->Tq, Tk = c->Tk, C = H * D, ld = c->fused ? 3 * C : C, b;
    int64_t nmask = (int64_t)(c->mask == 2 ? B : 1) * Tq * Tk, j;
    int32_t lens[64];
    char name[200];
    cu_rng g = {(uint64_t)(1000 + B * 7 + H * 13 + D * 17 + Tq * 19 + Tk * 23 + c->causal * 29 + c->lens * 31 + c->mask * 37)};
    float *mask = cu_host(nmask); /* host memory for both devices, as the integer arrays */
    cu_buf q, k, v, gq, gk, gv, out, lse, dout;
    tfm__attn_args a[2];
    snprintf(name, sizeof name, "attention B=%d H=%d D=%d Tq=%d Tk=%d causal=%d lens=%d mask=%d dropout=%g fused=%d grads=%d window=%d sinks=%d",
             B, H, D, Tq, Tk, c->causal, c->lens, c->mask, (double)c->dropout, c->fused, c->grads, c->window, c->sinks);
    if (c->fused) { /* q, k, v and their gradients inside one (B,T,3C) buffer each */
        q = cu_normal((int64_t)B * Tq * 3 * C, &g, 1, 0);
        gq = cu_normal((int64_t)B * Tq * 3 * C, &g, 1, 0);
        k = v = gk = gv = q;
        k.n = v.n = gk.n = gv.n = 0;
    } else {
        q = cu_normal((int64_t)B * Tq * C, &g, 1, 0);
        k = cu_normal((int64_t)B * Tk * C, &g, 1, 0);
        v = cu_normal((int64_t)B * Tk * C, &g, 1, 0);
        gq = cu_normal((int64_t)B * Tq * C, &g, 1, 0);
        gk = cu_normal((int64_t)B * Tk * C, &g, 1, 0);
        gv = cu_normal((int64_t)B * Tk * C, &g, 1, 0);
    }
    for (b = 0; b < B; b++) lens[b] = b % 4 == 0 ? Tk : b % 4 == 1 ? 0 : b % 4 == 2 ? 1 : Tk / 2 + 1;
    for (j = 0; j < nmask; j++) mask[j] = j % 5 == 3 ? -INFINITY : cu_gauss(&g);
    for (j = 0; j < Tk; j++) mask[(int64_t)(Tq / 2) * Tk + j] = -INFINITY; /* query Tq/2 (of batch row 0) sees no key */
    out = cu_nan((int64_t)B * Tq * C);
    lse = cu_nan((int64_t)B * H * Tq);
    dout = cu_normal((int64_t)B * Tq * C, &g, 1, 0);
    CU_DEVS {
        tfm__attn_args *A = &a[dv];
        memset(A, 0, sizeof *A);
        A->B = B;
        A->H = H;
        A->Tq = Tq;
        A->Tk = Tk;
        A->D = D;
        A->q = CU_P(q);
        A->k = c->fused ? CU_P(q) + C : CU_P(k);
        A->v = c->fused ? CU_P(q) + 2 * C : CU_P(v);
        A->ldq = A->ldk = A->ldv = ld;
        A->out = CU_P(out);
        A->ldo = C;
        A->lse = CU_P(lse);
        A->causal = c->causal;
        A->window = c->window;
        A->sinks = c->sinks;
        A->lens = c->lens ? lens : NULL;
        A->dropout = c->dropout;
        A->scale = 1.0f / sqrtf((float)D);
        A->seed = 4321;
        A->mask = c->mask ? mask : NULL;
        A->mask_bs = c->mask == 2 ? (int64_t)Tq * Tk : 0;
        A->drop_i0 = c->dropout > 0.0f ? 777 : 0;
        CHECK_MSG(tfm__op_attention(CU_DEV, A), "%s: forward on device %d returned 0", name, dv);
    }
    cu_check(cu_fmt("%s: out", name), &out, CU_TOL);
    cu_check(cu_fmt("%s: lse", name), &lse, CU_TOL);
    cu_check_finite(cu_fmt("%s: out", name), &out);
    /* backward from the CPU's out and lse on both */
    cu_push(&out);
    cu_push(&lse);
    float *gq0 = c->one_key ? cu_fetch(gq.h, gq.n, TFM_DEVICE_CPU) : NULL, *gk0 = c->one_key ? cu_fetch(gk.h, gk.n, TFM_DEVICE_CPU) : NULL;
    CU_DEVS {
        float *pq = CU_P(gq), *pk = c->fused ? CU_P(gq) + C : CU_P(gk), *pv = c->fused ? CU_P(gq) + 2 * C : CU_P(gv);
        CHECK_MSG(tfm__op_attention_bwd(CU_DEV, &a[dv], (c->grads & 1) ? pq : NULL, ld, (c->grads & 2) ? pk : NULL, ld,
                                        (c->grads & 4) ? pv : NULL, ld, CU_P(dout), C),
                  "%s: backward on device %d returned 0", name, dv);
    }
    if (c->one_key) { /* dq and dk as they were, bit for bit */
        CU_DEVS {
            float *hq = cu_fetch(CU_P(gq), gq.n, CU_DEV), *hk = cu_fetch(CU_P(gk), gk.n, CU_DEV);
            CHECK_MSG(!memcmp(hq, gq0, (size_t)gq.n * sizeof(float)) && !memcmp(hk, gk0, (size_t)gk.n * sizeof(float)),
                      "%s: backward added to dq or dk on device %d", name, dv);
            free(hq);
            free(hk);
        }
        free(gq0);
        free(gk0);
    }
    cu_check(cu_fmt("%s: dq%s", name, c->fused ? "|dk|dv" : ""), &gq, CU_TOL);
    cu_check_finite(cu_fmt("%s: dq", name), &gq);
    if (!c->fused) {
        cu_check(cu_fmt("%s: dk", name), &gk, CU_TOL);
        cu_check(cu_fmt("%s: dv", name), &gv, CU_TOL);
        cu_check_finite(cu_fmt("%s: dk", name), &gk);
        cu_check_finite(cu_fmt("%s: dv", name), &gv);
        cu_release(&k, &v, &gk, &gv, CU_END);
    }
    cu_release(&q, &gq, &out, &lse, &dout, CU_END);
    free(mask);
}

/* Head dims 1..160 and lengths 1..300 (query and key blocks, their edges, several key tiles with the online
   softmax's rescaling, and Tq != Tk: cross-attention, top-left aligned when causal). */
static void cu_op_attention_sizes(void) {
    static const int Ds_full[] = {1, 8, 32, 64, 96, 128, 160}, Ds_small[] = {1, 8, 96, 160};
    static const int Ts_full[] = {1, 2, 31, 33, 64, 65, 130, 300}, Ts_small[] = {1, 2, 33, 130};
    const int *Ds = cu_small ? Ds_small : Ds_full, *Ts = cu_small ? Ts_small : Ts_full;
    int nD = cu_small ? CU_LEN(Ds_small) : CU_LEN(Ds_full), nT = cu_small ? CU_LEN(Ts_small) : CU_LEN(Ts_full), i, causal;
    for (i = 0; i < nD; i++)
        for (causal = 0; causal < 2; causal++) {
            cu_att c = cu_att_make(2, 2, Ds[i], 33, 33, causal);
            cu_att_run(&c);
        }
    for (i = 0; i < nT; i++)
        for (causal = 0; causal < 2; causal++) {
            cu_att self = cu_att_make(2, 2, cu_small ? 8 : 32, Ts[i], Ts[i], causal);
            cu_att cross = cu_att_make(2, 3, 16, Ts[i], Ts[(i + 3) % nT], causal);
            cu_att_run(&self);
            cu_att_run(&cross);
        }
}

/* Queries that see one key (a one-key source, with dropout too; every key length 1): their softmax rows are
   one-hot, so dq and dk get exactly nothing, on the CPU and the device alike. */
static void cu_op_attention_one_key(void) {
    int drop;
    for (drop = 0; drop < 2; drop++) {
        cu_att c = cu_att_make(2, 2, 64, 40, 1, 0);
        c.one_key = 1;
        c.dropout = drop ? 0.3f : 0.0f;
        cu_att_run(&c);
    }
    {
        cu_att c = cu_att_make(2, 2, 64, 40, 1, 1); /* causal over one key */
        c.one_key = 1;
        cu_att_run(&c);
    }
}

/* Key lengths (0: a row sees nothing; full), additive masks (shared and per batch row, -inf entries, a
   query with every key hidden), the causal mask over all of them, the fused layout, dropout, and
   backward with only some gradients. */
static void cu_op_attention_masks(void) {
    int T = cu_small ? 33 : 65, causal, lens, mask, fused;
    for (causal = 0; causal < 2; causal++)
        for (lens = 0; lens < 2; lens++)
            for (mask = 0; mask < 3; mask++)
                for (fused = 0; fused < 2; fused++) {
                    cu_att c = cu_att_make(4, 2, 16, T, T, causal);
                    c.lens = lens;
                    c.mask = mask;
                    c.fused = fused;
                    cu_att_run(&c);
                }
    { /* sliding windows (with sinks, and the masks, lengths and dropout with them) across key tiles */
        static const int wins[4][2] = {{5, 0}, {20, 3}, {1, 0}, {150, 2}};
        int w;
        for (w = 0; w < 4; w++)
            for (mask = 0; mask < 2; mask++) {
                cu_att c = cu_att_make(2, 2, 8, cu_small ? 140 : 300, cu_small ? 140 : 300, 1);
                c.window = wins[w][0];
                c.sinks = wins[w][1];
                c.lens = mask;
                c.mask = mask;
                c.fused = !mask;
                c.dropout = mask ? 0.1f : 0.0f;
                cu_att_run(&c);
            }
    }
    for (mask = 0; mask < 3; mask++) { /* cross with masks and lengths */
        cu_att c = cu_att_make(4, 2, 8, 17, 40, 0);
        c.lens = 1;
        c.mask = mask;
        cu_att_run(&c);
    }
    for (causal = 0; causal < 2; causal++) { /* dropout on the attention weights */
        cu_att c = cu_att_make(4, 2, 16, T, T, causal), x = cu_att_make(3, 2, 32, 20, 70, 0);
        c.dropout = 0.1f;
        c.lens = 1;
        c.mask = causal ? 2 : 0;
        x.dropout = 0.2f;
        x.lens = causal;
        cu_att_run(&c);
        cu_att_run(&x);
    }
    {
        static const int subsets[4] = {1, 2, 4, 6}; /* dq alone, dk, dv, dk and dv */
        int s;
        for (s = 0; s < 4; s++) {
            cu_att c = cu_att_make(2, 2, 16, 33, 40, 0);
            c.grads = subsets[s];
            c.lens = 1;
            c.dropout = 0.1f;
            cu_att_run(&c);
        }
    }
}

/* Decoding against a cache: the keys and values of batch row b at k + kv_rows[b] * bsk (slots out of
   order), rows of a fused (k|v) cache layout (ld 2C); self-attention with each row's queries at its own
   offset (q_off, causal), cross-attention over cached sources of uneven lengths. Forward only, as the
   library decodes. */
static void cu_op_attention_decode(void) {
    /* Tq, H, D: heads of 160 channels take the batched products */
    static const int shapes[5][3] = {{1, 2, 8}, {4, 2, 64}, {3, 4, 32}, {1, 1, 128}, {2, 1, 160}};
    int s, cross;
    for (s = 0; s < 5; s++)
        for (cross = 0; cross < 2; cross++) {
            int Tq = shapes[s][0], H = shapes[s][1], D = shapes[s][2], C = H * D, B = 3, MB = 4, L = 40, b;
            int32_t slot[3] = {2, 0, 3}, cached[3] = {5, 0, 17}, src_lens[3] = {13, 4, 9};
            int ldq = cross ? C : 3 * C;
            char name[160];
            cu_rng g = {(uint64_t)(77 + s * 2 + cross)};
            cu_buf cache = cu_normal((int64_t)MB * L * 2 * C, &g, 1, 0), q = cu_normal((int64_t)B * Tq * ldq, &g, 1, 0);
            cu_buf out = cu_nan((int64_t)B * Tq * C), lse = cu_nan((int64_t)B * H * Tq);
            int longest = 0;
            for (b = 0; b < B; b++) longest = cached[b] > longest ? cached[b] : longest;
            snprintf(name, sizeof name, "attention decode %s Tq=%d H=%d D=%d", cross ? "cross" : "self", Tq, H, D);
            CU_DEVS {
                tfm__attn_args a;
                memset(&a, 0, sizeof a);
                a.B = B;
                a.H = H;
                a.Tq = Tq;
                a.D = D;
                a.Tk = cross ? 13 : longest + Tq;
                a.q = CU_P(q);
                a.ldq = ldq;
                a.k = CU_P(cache);
                a.v = CU_P(cache) + C;
                a.ldk = a.ldv = 2 * C;
                a.bsk = (int64_t)L * 2 * C;
                a.kv_rows = slot;
                a.q_off = cross ? NULL : cached;
                a.causal = !cross;
                a.lens = cross ? src_lens : NULL;
                a.out = CU_P(out);
                a.ldo = C;
                a.lse = CU_P(lse);
                a.scale = 1.0f / sqrtf((float)D);
                CHECK_MSG(tfm__op_attention(CU_DEV, &a), "%s: returned 0 on device %d", name, dv);
            }
            cu_check(cu_fmt("%s: out", name), &out, CU_TOL);
            cu_check(cu_fmt("%s: lse", name), &lse, CU_TOL);
            cu_release(&cache, &q, &out, &lse, CU_END);
        }
}

/* The attention's dropout mask, bit for bit: with D = Tk and v the identity in each head, out[b,i,h*D+j]
   is p_ij * keep_ij / (1-p), zero exactly where element (b,h,i,j) was dropped (or is not visible). The
   zeros must be the same on both devices and where the hash says (drop_i0 0 and past 2^32). */
static void cu_op_attention_dropout_mask(void) {
    int causal, k;
    for (causal = 0; causal < 2; causal++)
        for (k = 0; k < 2; k++) {
            int B = 2, H = 2, T = 33, D = 33, C = H * D, b, h, i, j;
            uint64_t i0 = k ? ((uint64_t)1 << 32) + 12345 : 0, seed = 99;
            float p = 0.3f;
            int64_t bad_dev = 0, bad_cpu = 0, dropped = 0;
            uint32_t thr = tfm__drop_threshold(p);
            cu_rng g = {(uint64_t)(5 + causal * 2 + k)};
            cu_buf q = cu_normal((int64_t)B * T * C, &g, 0.5, 0), kk = cu_normal((int64_t)B * T * C, &g, 0.5, 0);
            cu_buf v = cu_zeros((int64_t)B * T * C), out = cu_nan((int64_t)B * T * C), lse = cu_nan((int64_t)B * H * T);
            float *got;
            for (b = 0; b < B; b++)
                for (j = 0; j < T; j++)
                    for (h = 0; h < H; h++) v.h[((int64_t)b * T + j) * C + h * D + j] = 1.0f;
            cu_push(&v);
            CU_DEVS {
                tfm__attn_args a;
                memset(&a, 0, sizeof a);
                a.B = B;
                a.H = H;
                a.Tq = T;
                a.Tk = T;
                a.D = D;
                a.q = CU_P(q);
                a.k = CU_P(kk);
                a.v = CU_P(v);
                a.ldq = a.ldk = a.ldv = C;
                a.out = CU_P(out);
                a.ldo = C;
                a.lse = CU_P(lse);
                a.causal = causal;
                a.dropout = p;
                a.seed = seed;
                a.drop_i0 = i0;
                a.scale = 1.0f / sqrtf((float)D);
                CHECK(tfm__op_attention(CU_DEV, &a));
            }
            got = cu_fetch(out.d, out.n, TFM_DEVICE_CUDA);
            for (b = 0; b < B; b++)
                for (h = 0; h < H; h++)
                    for (i = 0; i < T; i++)
                        for (j = 0; j < T; j++) {
                            int64_t at = ((int64_t)b * T + i) * C + h * D + j;
                            uint64_t idx = i0 + ((uint64_t)(b * H + h) * T + (uint64_t)i) * T + (uint64_t)j;
                            int zero = (causal && j > i) || tfm__hash24(seed, idx) < thr;
                            dropped += zero;
                            bad_cpu += (out.h[at] == 0.0f) != zero;
                            bad_dev += (got[at] == 0.0f) != zero;
                        }
            CHECK_MSG(bad_dev == 0, "attention dropout mask causal=%d i0=%llu: %lld of %d weights dropped where the hash keeps them or kept where it drops them on the device",
                      causal, (unsigned long long)i0, (long long)bad_dev, B * H * T * T);
            CHECK_MSG(bad_cpu == 0, "attention dropout mask causal=%d: %lld weights differ from the hash on the CPU", causal, (long long)bad_cpu);
            CHECK(dropped > 0);
            cu_check(cu_fmt("attention dropout mask causal=%d i0=%llu: out", causal, (unsigned long long)i0), &out, CU_TOL);
            free(got);
            cu_release(&q, &kk, &v, &out, &lse, CU_END);
        }
}

/* ==== 2. public ops on device tensors (validation, dispatch, copies of host masks and ids) ============= */

/* a 2-D tensor, or 3-D with a leading L when three */
static tfm_tensor cu_t23(const cu_buf *b, int dv, int three, int64_t L, int64_t r, int64_t c) {
    return three ? cu_t(b, dv, L, r, c) : cu_t(b, dv, r, c, 0);
}

static void cu_pub_matmul(void) {
    cu_rng g = {31};
    int ta, tb, three;
    for (three = 0; three < 2; three++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                int64_t L = three ? 3 : 1, M = 33, N = 31, K = 65;
                int64_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
                char name[100];
                cu_buf A = cu_normal(L * ra * ca, &g, 1, 0), Bm = cu_normal(L * rb * cb, &g, 1, 0), Cm = cu_nan(L * M * N);
                cu_buf dA = cu_normal(L * ra * ca, &g, 1, 0), dB = cu_normal(L * rb * cb, &g, 1, 0), dC = cu_normal(L * M * N, &g, 1, 0);
                snprintf(name, sizeof name, "tfm_matmul %s ta=%d tb=%d", three ? "3-D" : "2-D", ta, tb);
                CU_DEVS {
                    tfm_tensor a = cu_t23(&A, dv, three, L, ra, ca), b = cu_t23(&Bm, dv, three, L, rb, cb), c = cu_t23(&Cm, dv, three, L, M, N);
                    tfm_tensor da = cu_t23(&dA, dv, three, L, ra, ca), db = cu_t23(&dB, dv, three, L, rb, cb), dc = cu_t23(&dC, dv, three, L, M, N);
                    CHECK_OK(tfm_matmul_forward(&c, &a, &b, ta, tb));
                    CHECK_OK(tfm_matmul_backward(&da, &db, &dc, &a, &b, ta, tb));
                }
                cu_check(cu_fmt("%s: c", name), &Cm, CU_TOL);
                cu_check(cu_fmt("%s: da", name), &dA, CU_TOL);
                cu_check(cu_fmt("%s: db", name), &dB, CU_TOL);
                cu_release(&A, &Bm, &Cm, &dA, &dB, &dC, CU_END);
            }
}

static void cu_pub_linear(void) {
    cu_rng g = {32};
    int bias;
    for (bias = 0; bias < 2; bias++) {
        int64_t B = 2, T = 33, I = 65, O = 31;
        cu_buf x = cu_normal(B * T * I, &g, 1, 0), w = cu_normal(O * I, &g, 0.1, 0), b = cu_normal(O, &g, 1, 0), y = cu_nan(B * T * O);
        cu_buf dx = cu_normal(B * T * I, &g, 1, 0), dw = cu_normal(O * I, &g, 1, 0), db = cu_normal(O, &g, 1, 0), dy = cu_normal(B * T * O, &g, 1, 0);
        CU_DEVS {
            tfm_tensor tx = cu_t(&x, dv, B, T, I), tw = cu_t(&w, dv, O, I, 0), tb = cu_t(&b, dv, O, 0, 0), ty = cu_t(&y, dv, B, T, O);
            tfm_tensor tdx = cu_t(&dx, dv, B, T, I), tdw = cu_t(&dw, dv, O, I, 0), tdb = cu_t(&db, dv, O, 0, 0), tdy = cu_t(&dy, dv, B, T, O);
            CHECK_OK(tfm_linear_forward(&ty, &tx, &tw, bias ? &tb : NULL));
            CHECK_OK(tfm_linear_backward(&tdx, &tdw, bias ? &tdb : NULL, &tdy, &tx, &tw));
        }
        cu_check(cu_fmt("tfm_linear bias=%d: y", bias), &y, CU_TOL);
        cu_check(cu_fmt("tfm_linear bias=%d: dx", bias), &dx, CU_TOL);
        cu_check(cu_fmt("tfm_linear bias=%d: dw", bias), &dw, CU_TOL);
        cu_check(cu_fmt("tfm_linear bias=%d: db", bias), &db, CU_TOL);
        cu_release(&x, &w, &b, &y, &dx, &dw, &db, &dy, CU_END);
    }
}

/* softmax, log-softmax (y separate and in place) and the fused cross-entropy, through the public calls */
static void cu_pub_softmax(void) {
    cu_rng g = {33};
    int lg;
    for (lg = 0; lg < 2; lg++) {
        int64_t B = 2, T = 17, C = 1025;
        cu_buf x = cu_normal(B * T * C, &g, 3, 0), y = cu_nan(B * T * C), dy = cu_normal(B * T * C, &g, 1, 0), dx = cu_normal(B * T * C, &g, 1, 0);
        cu_buf x2 = cu_zeros(B * T * C);
        memcpy(x2.h, x.h, (size_t)(B * T * C) * sizeof(float));
        cu_push(&x2);
        CU_DEVS {
            tfm_tensor tx = cu_t(&x, dv, B, T, C), ty = cu_t(&y, dv, B, T, C), tx2 = cu_t(&x2, dv, B, T, C);
            CHECK_OK(lg ? tfm_log_softmax_forward(&ty, &tx) : tfm_softmax_forward(&ty, &tx));
            CHECK_OK(lg ? tfm_log_softmax_forward(&tx2, &tx2) : tfm_softmax_forward(&tx2, &tx2));
        }
        cu_check(cu_fmt("tfm_%ssoftmax_forward", lg ? "log_" : ""), &y, CU_TOL);
        cu_check(cu_fmt("tfm_%ssoftmax_forward in place", lg ? "log_" : ""), &x2, CU_TOL);
        cu_push(&y);
        CU_DEVS {
            tfm_tensor ty = cu_t(&y, dv, B, T, C), tdy = cu_t(&dy, dv, B, T, C), tdx = cu_t(&dx, dv, B, T, C);
            CHECK_OK(lg ? tfm_log_softmax_backward(&tdx, &tdy, &ty) : tfm_softmax_backward(&tdx, &tdy, &ty));
        }
        cu_check(cu_fmt("tfm_%ssoftmax_backward", lg ? "log_" : ""), &dx, CU_TOL);
        cu_release(&x, &y, &dy, &dx, &x2, CU_END);
    }
    {
        int64_t N = 37, V = 1031, r;
        int32_t t[37];
        float loss[2];
        cu_rng g2 = {34};
        cu_buf x = cu_normal(N * V, &g2, 2, 0), lse = cu_nan(N), dx = cu_normal(N * V, &g2, 1, 0);
        for (r = 0; r < N; r++) t[r] = r % 5 == 4 ? -100 : (int32_t)cu_int(&g2, (int)V);
        CU_DEVS {
            tfm_tensor tx = cu_t(&x, dv, N, V, 0), tl = cu_t(&lse, dv, N, 0, 0);
            CHECK_OK(tfm_cross_entropy_forward(&loss[dv], &tl, &tx, t, -100, 0.1f));
        }
        cu_check_scalar("tfm_cross_entropy_forward: loss", loss[1], loss[0], CU_TOL, 1e-30);
        cu_check("tfm_cross_entropy_forward: lse", &lse, CU_TOL);
        cu_push(&lse);
        CU_DEVS {
            tfm_tensor tx = cu_t(&x, dv, N, V, 0), tl = cu_t(&lse, dv, N, 0, 0), tdx = cu_t(&dx, dv, N, V, 0);
            CHECK_OK(tfm_cross_entropy_backward(&tdx, 1.5f, &tx, &tl, t, -100, 0.1f));
        }
        cu_check("tfm_cross_entropy_backward", &dx, CU_TOL);
        cu_release(&x, &lse, &dx, CU_END);
    }
}

static void cu_pub_layernorm(void) {
    int64_t B = 3, T = 33, C = 129, N = B * T;
    cu_rng g = {35};
    cu_buf x = cu_normal(N * C, &g, 2, 3), gn = cu_normal(C, &g, 0.5, 1), bb = cu_normal(C, &g, 0.5, 0), y = cu_nan(N * C);
    cu_buf mean = cu_nan(N), rstd = cu_nan(N), dy = cu_normal(N * C, &g, 1, 0), dx = cu_normal(N * C, &g, 1, 0);
    cu_buf dg = cu_normal(C, &g, 1, 0), db = cu_normal(C, &g, 1, 0);
    CU_DEVS {
        tfm_tensor tx = cu_t(&x, dv, B, T, C), tg = cu_t(&gn, dv, C, 0, 0), tb = cu_t(&bb, dv, C, 0, 0), ty = cu_t(&y, dv, B, T, C);
        tfm_tensor tm = cu_t(&mean, dv, N, 0, 0), tr = cu_t(&rstd, dv, N, 0, 0);
        CHECK_OK(tfm_layernorm_forward(&ty, &tm, &tr, &tx, &tg, &tb, 1e-5f));
    }
    cu_check("tfm_layernorm_forward: y", &y, CU_TOL);
    cu_check("tfm_layernorm_forward: mean", &mean, CU_TOL);
    cu_check("tfm_layernorm_forward: rstd", &rstd, CU_TOL);
    cu_push(&mean);
    cu_push(&rstd);
    CU_DEVS {
        tfm_tensor tx = cu_t(&x, dv, B, T, C), tg = cu_t(&gn, dv, C, 0, 0), tm = cu_t(&mean, dv, N, 0, 0), tr = cu_t(&rstd, dv, N, 0, 0);
        tfm_tensor tdx = cu_t(&dx, dv, B, T, C), tdg = cu_t(&dg, dv, C, 0, 0), tdb = cu_t(&db, dv, C, 0, 0), tdy = cu_t(&dy, dv, B, T, C);
        CHECK_OK(tfm_layernorm_backward(&tdx, &tdg, &tdb, &tdy, &tx, &tg, &tm, &tr));
    }
    cu_check("tfm_layernorm_backward: dx", &dx, CU_TOL);
    cu_check("tfm_layernorm_backward: dg", &dg, CU_TOL);
    cu_check("tfm_layernorm_backward: db", &db, CU_TOL);
    cu_release(&x, &gn, &bb, &y, &mean, &rstd, &dy, &dx, &dg, &db, CU_END);
}

/* GELU (both kinds), ReLU and dropout through the public calls */
static void cu_pub_elementwise(void) {
    int64_t R = 3, C = 1025, n = R * C;
    cu_rng g = {36};
    int kind;
    for (kind = 0; kind < 3; kind++) {
        cu_buf x = cu_normal(n, &g, 3, 0), y = cu_nan(n), dy = cu_normal(n, &g, 1, 0), dx = cu_normal(n, &g, 1, 0);
        const char *nm = kind == 2 ? "relu" : kind ? "gelu tanh" : "gelu erf";
        CU_DEVS {
            tfm_tensor tx = cu_t(&x, dv, R, C, 0), ty = cu_t(&y, dv, R, C, 0), tdy = cu_t(&dy, dv, R, C, 0), tdx = cu_t(&dx, dv, R, C, 0);
            if (kind == 2) {
                CHECK_OK(tfm_relu_forward(&ty, &tx));
                CHECK_OK(tfm_relu_backward(&tdx, &tdy, &tx));
            } else {
                CHECK_OK(tfm_gelu_forward(&ty, &tx, kind ? TFM_GELU_TANH : TFM_GELU_ERF));
                CHECK_OK(tfm_gelu_backward(&tdx, &tdy, &tx, kind ? TFM_GELU_TANH : TFM_GELU_ERF));
            }
        }
        cu_check(cu_fmt("public %s: y", nm), &y, CU_TOL);
        cu_check(cu_fmt("public %s: dx", nm), &dx, CU_TOL);
        cu_release(&x, &y, &dy, &dx, CU_END);
    }
    for (kind = 0; kind < 3; kind++) { /* dropout: training with p 0.1, p 0, and not training */
        float p = kind == 1 ? 0.0f : 0.1f;
        int training = kind != 2;
        cu_buf x = cu_normal(n, &g, 1, 0), y = cu_nan(n), dy = cu_normal(n, &g, 1, 0), dx = cu_normal(n, &g, 1, 0);
        CU_DEVS {
            tfm_tensor tx = cu_t(&x, dv, R, C, 0), ty = cu_t(&y, dv, R, C, 0), tdy = cu_t(&dy, dv, R, C, 0), tdx = cu_t(&dx, dv, R, C, 0);
            CHECK_OK(tfm_dropout_forward(&ty, &tx, p, 1234, training));
            CHECK_OK(tfm_dropout_backward(&tdx, &tdy, p, 1234, training));
        }
        cu_check_bits(cu_fmt("tfm_dropout_forward p=%g training=%d", (double)p, training), &y);
        cu_check_bits(cu_fmt("tfm_dropout_backward p=%g training=%d", (double)p, training), &dx);
        cu_release(&x, &y, &dy, &dx, CU_END);
    }
}

/* embeddings (host ids), learned and sinusoidal positions */
static void cu_pub_embedding(void) {
    int64_t B = 3, T = 20, C = 33, V = 50, P = 24, i;
    int32_t ids[60];
    cu_rng g = {37};
    cu_buf w = cu_normal(V * C, &g, 1, 0), y = cu_nan(B * T * C), dy = cu_normal(B * T * C, &g, 1, 0), dw = cu_normal(V * C, &g, 1, 0);
    cu_buf pw = cu_normal(P * C, &g, 1, 0), y2 = cu_nan(B * T * C), dx = cu_normal(B * T * C, &g, 1, 0), dpw = cu_normal(P * C, &g, 1, 0);
    cu_buf pe = cu_nan(P * C), y3 = cu_nan(B * T * C), dx3 = cu_normal(B * T * C, &g, 1, 0);
    for (i = 0; i < B * T; i++) ids[i] = (int32_t)cu_int(&g, (int)V);
    CU_DEVS {
        tfm_tensor tw = cu_t(&w, dv, V, C, 0), ty = cu_t(&y, dv, B, T, C), tdy = cu_t(&dy, dv, B, T, C), tdw = cu_t(&dw, dv, V, C, 0);
        tfm_tensor tpw = cu_t(&pw, dv, P, C, 0), ty2 = cu_t(&y2, dv, B, T, C), tdx = cu_t(&dx, dv, B, T, C), tdpw = cu_t(&dpw, dv, P, C, 0);
        tfm_tensor tpe = cu_t(&pe, dv, P, C, 0), ty3 = cu_t(&y3, dv, B, T, C), tdx3 = cu_t(&dx3, dv, B, T, C);
        CHECK_OK(tfm_embedding_forward(&ty, ids, &tw, 2.5f));
        CHECK_OK(tfm_embedding_backward(&tdw, &tdy, ids, 2.5f));
        CHECK_OK(tfm_pos_embedding_forward(&ty2, &ty, &tpw));
        CHECK_OK(tfm_pos_embedding_backward(&tdx, &tdpw, &tdy));
        CHECK_OK(tfm_sinusoidal_table(&tpe));
        CHECK_OK(tfm_sinusoidal_forward(&ty3, &ty));
        CHECK_OK(tfm_sinusoidal_backward(&tdx3, &tdy));
    }
    cu_check("tfm_embedding_forward", &y, CU_TOL);
    cu_check("tfm_embedding_backward", &dw, CU_TOL);
    cu_check("tfm_pos_embedding_forward", &y2, CU_TOL);
    cu_check("tfm_pos_embedding_backward: dx", &dx, CU_TOL);
    cu_check("tfm_pos_embedding_backward: dw", &dpw, CU_TOL);
    cu_check("tfm_sinusoidal_table", &pe, CU_TOL);
    cu_check("tfm_sinusoidal_forward", &y3, CU_TOL);
    cu_check("tfm_sinusoidal_backward", &dx3, CU_TOL);
    cu_release(&w, &y, &dy, &dw, &pw, &y2, &dx, &dpw, &pe, &y3, &dx3, CU_END);
}

/* residual adds and both poolings (host lengths, one of them 0) */
static void cu_pub_add_pool(void) {
    int64_t B = 4, T = 9, C = 129;
    int32_t lens[4] = {9, 0, 3, 1};
    cu_rng g = {38};
    cu_buf a = cu_normal(B * T * C, &g, 1, 0), b = cu_normal(B * T * C, &g, 1, 0), y = cu_nan(B * T * C), dy = cu_normal(B * T * C, &g, 1, 0);
    cu_buf da = cu_normal(B * T * C, &g, 1, 0), db = cu_normal(B * T * C, &g, 1, 0);
    cu_buf pm = cu_nan(B * C), pc = cu_nan(B * C), dp = cu_normal(B * C, &g, 1, 0), dxm = cu_normal(B * T * C, &g, 1, 0), dxc = cu_normal(B * T * C, &g, 1, 0);
    CU_DEVS {
        tfm_tensor ta = cu_t(&a, dv, B, T, C), tb = cu_t(&b, dv, B, T, C), ty = cu_t(&y, dv, B, T, C), tdy = cu_t(&dy, dv, B, T, C);
        tfm_tensor tda = cu_t(&da, dv, B, T, C), tdb = cu_t(&db, dv, B, T, C);
        tfm_tensor tpm = cu_t(&pm, dv, B, C, 0), tpc = cu_t(&pc, dv, B, C, 0), tdp = cu_t(&dp, dv, B, C, 0);
        tfm_tensor tdxm = cu_t(&dxm, dv, B, T, C), tdxc = cu_t(&dxc, dv, B, T, C);
        CHECK_OK(tfm_add_forward(&ty, &ta, &tb));
        CHECK_OK(tfm_add_backward(&tda, &tdb, &tdy));
        CHECK_OK(tfm_mean_pool_forward(&tpm, &ta, lens));
        CHECK_OK(tfm_mean_pool_backward(&tdxm, &tdp, lens));
        CHECK_OK(tfm_cls_pool_forward(&tpc, &ta));
        CHECK_OK(tfm_cls_pool_backward(&tdxc, &tdp));
    }
    cu_check_bits("tfm_add_forward", &y);
    cu_check_bits("tfm_add_backward: da", &da);
    cu_check_bits("tfm_add_backward: db", &db);
    cu_check("tfm_mean_pool_forward", &pm, CU_TOL);
    cu_check("tfm_mean_pool_backward", &dxm, CU_TOL);
    cu_check_bits("tfm_cls_pool_forward", &pc);
    cu_check_bits("tfm_cls_pool_backward", &dxc);
    cu_release(&a, &b, &y, &dy, &da, &db, &pm, &pc, &dp, &dxm, &dxc, CU_END);
}

/* tfm_attention_*: opts' key lengths and additive masks are host memory (the library copies them); cases 2
   and 3 are grouped-query (opts.n_kv_heads 2 and 1 of 4 heads: k and v of fewer channels) */
static void cu_pub_attention(void) {
    int which;
    for (which = 0; which < 4; which++) {
        int per_batch = which & 1;
        int64_t B = 3, Tq = 33, Tk = 40, C = 64, H = 4, j, nm = (per_batch ? B : 1) * Tq * Tk;
        int64_t Hkv = which == 2 ? 2 : which == 3 ? 1 : H, E = C / H * Hkv;
        int32_t lens[3] = {40, 0, 17};
        float *mask = (float *)malloc((size_t)nm * sizeof(float));
        tfm_attn_opts o;
        cu_rng g = {(uint64_t)(39 + which)};
        cu_buf q = cu_normal(B * Tq * C, &g, 1, 0), k = cu_normal(B * Tk * E, &g, 1, 0), v = cu_normal(B * Tk * E, &g, 1, 0);
        cu_buf out = cu_nan(B * Tq * C), lse = cu_nan(B * H * Tq), dout = cu_normal(B * Tq * C, &g, 1, 0);
        cu_buf dq = cu_normal(B * Tq * C, &g, 1, 0), dk = cu_normal(B * Tk * E, &g, 1, 0), dvv = cu_normal(B * Tk * E, &g, 1, 0);
        for (j = 0; j < nm; j++) mask[j] = j % 7 == 2 ? -INFINITY : cu_gauss(&g);
        for (j = 0; j < Tk; j++) mask[5 * Tk + j] = -INFINITY;
        memset(&o, 0, sizeof o);
        o.causal = 1;
        o.key_lens = lens;
        o.mask = mask;
        o.mask_per_batch = per_batch;
        o.dropout = 0.1f;
        o.dropout_seed = 8;
        o.n_kv_heads = which >= 2 ? (int)Hkv : 0;
        CU_DEVS {
            tfm_tensor tq = cu_t(&q, dv, B, Tq, C), tk = cu_t(&k, dv, B, Tk, E), tv = cu_t(&v, dv, B, Tk, E);
            tfm_tensor to = cu_t(&out, dv, B, Tq, C), tl = cu_t(&lse, dv, B, H, Tq);
            CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, (int)H, &o));
        }
        cu_check(cu_fmt("tfm_attention_forward case %d: out", which), &out, CU_TOL);
        cu_check(cu_fmt("tfm_attention_forward case %d: lse", which), &lse, CU_TOL);
        cu_check_finite("tfm_attention_forward: out", &out);
        cu_push(&out);
        cu_push(&lse);
        CU_DEVS {
            tfm_tensor tq = cu_t(&q, dv, B, Tq, C), tk = cu_t(&k, dv, B, Tk, E), tv = cu_t(&v, dv, B, Tk, E);
            tfm_tensor to = cu_t(&out, dv, B, Tq, C), tl = cu_t(&lse, dv, B, H, Tq), tdo = cu_t(&dout, dv, B, Tq, C);
            tfm_tensor tdq = cu_t(&dq, dv, B, Tq, C), tdk = cu_t(&dk, dv, B, Tk, E), tdv = cu_t(&dvv, dv, B, Tk, E);
            CHECK_OK(tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, (int)H, &o));
        }
        cu_check(cu_fmt("tfm_attention_backward case %d: dq", which), &dq, CU_TOL);
        cu_check(cu_fmt("tfm_attention_backward case %d: dk", which), &dk, CU_TOL);
        cu_check(cu_fmt("tfm_attention_backward case %d: dv", which), &dvv, CU_TOL);
        free(mask);
        cu_release(&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dvv, CU_END);
    }
}

/* tfm_adamw_step over parameters in device memory: the global norm (a reduction over every parameter),
   clipping, decay on some, three steps */
static void cu_pub_adamw(void) {
    static const int64_t sizes[3] = {33 * 65, 65, 1025};
    cu_buf w[3], gr[3], m[3], v[3];
    tfm_adamw_param ps[2][3];
    tfm_optim o;
    cu_rng g = {41};
    int i, step;
    memset(&o, 0, sizeof o);
    o.lr = 1e-2f;
    o.weight_decay = 0.1f;
    o.clip_norm = 0.5f;
    for (i = 0; i < 3; i++) {
        w[i] = cu_normal(sizes[i], &g, 1, 0);
        gr[i] = cu_zeros(sizes[i]);
        m[i] = cu_zeros(sizes[i]);
        v[i] = cu_zeros(sizes[i]);
        CU_DEVS {
            ps[dv][i].value = cu_t(&w[i], dv, sizes[i], 0, 0);
            ps[dv][i].grad = cu_t(&gr[i], dv, sizes[i], 0, 0);
            ps[dv][i].m = cu_t(&m[i], dv, sizes[i], 0, 0);
            ps[dv][i].v = cu_t(&v[i], dv, sizes[i], 0, 0);
            ps[dv][i].decay = i != 1;
        }
    }
    for (step = 1; step <= 3; step++) {
        float norm[2];
        for (i = 0; i < 3; i++) {
            int64_t j;
            for (j = 0; j < sizes[i]; j++) gr[i].h[j] = 0.1f * cu_gauss(&g);
            cu_push(&gr[i]);
        }
        CU_DEVS CHECK_OK(tfm_adamw_step(ps[dv], 3, &o, step, &norm[dv]));
        cu_check_scalar(cu_fmt("tfm_adamw_step %d: gradient norm", step), norm[1], norm[0], CU_TOL, 1e-30);
    }
    for (i = 0; i < 3; i++) {
        cu_check(cu_fmt("tfm_adamw_step: parameter %d", i), &w[i], CU_TOL);
        cu_check(cu_fmt("tfm_adamw_step: m of %d", i), &m[i], CU_TOL);
        cu_check(cu_fmt("tfm_adamw_step: v of %d", i), &v[i], CU_TOL);
        cu_release(&w[i], &gr[i], &m[i], &v[i], CU_END);
    }
}

/* tfm_fill*, on the device the same values as on the host (drawn on the host, the generator advanced
   alike), and tfm_tensor_copy between every pair of devices. */
static void cu_pub_fill_copy(void) {
    static const int64_t sizes[2] = {1000, 200003}; /* tfm_fill_normal's direct and chunked paths */
    int s, kind;
    for (s = 0; s < 2; s++)
        for (kind = 0; kind < 3; kind++) {
            int64_t n = sizes[s];
            cu_buf x = cu_zeros(n);
            tfm_rng r[2];
            CU_DEVS {
                tfm_tensor t = cu_t(&x, dv, n, 0, 0);
                tfm_rng_seed(&r[dv], 5);
                if (kind == 0) CHECK_OK(tfm_fill(&t, 0.25f));
                else if (kind == 1) CHECK_OK(tfm_fill_normal(&t, &r[dv], 0.5f, 2.0f));
                else CHECK_OK(tfm_fill_uniform(&t, &r[dv], -1.0f, 3.0f));
            }
            cu_check_bits(cu_fmt("%s n=%lld", kind == 0 ? "tfm_fill" : kind == 1 ? "tfm_fill_normal" : "tfm_fill_uniform", (long long)n), &x);
            CHECK_MSG(tfm_rng_u64(&r[0]) == tfm_rng_u64(&r[1]), "fill kind %d n=%lld: the generator advanced differently", kind, (long long)n);
            cu_free(&x);
        }
    {
        /* host -> device -> device (another shape, same count) -> host */
        float src[6] = {1, -2, 3.5f, NAN, -INFINITY, 6}, back[6] = {0, 0, 0, 0, 0, 0};
        float *d1 = cu_dev(6), *d2 = cu_dev(6);
        tfm_tensor hs = tfm_tensor1(src, 6), hb = tfm_tensor2(back, 3, 2), t1 = tfm_tensor2(d1, 2, 3), t2 = tfm_tensor3(d2, 1, 6, 1);
        tfm_tensor t7 = tfm_tensor1(d2, 7), h5 = tfm_tensor1(back, 5);
        t1.device = t2.device = t7.device = TFM_DEVICE_CUDA;
        CHECK_OK(tfm_tensor_copy(&t1, &hs));
        CHECK_OK(tfm_tensor_copy(&t2, &t1));
        CHECK_OK(tfm_tensor_copy(&hb, &t2));
        cu_check_bits_arrays("tfm_tensor_copy host -> device -> device -> host", back, src, 6);
        CHECK_OK(tfm_tensor_copy(&hb, &hs)); /* host to host */
        cu_check_bits_arrays("tfm_tensor_copy host -> host", back, src, 6);
        /* element counts that differ are refused */
        CHECK(tfm_tensor_copy(&t7, &hs) != TFM_OK);
        CHECK(tfm_tensor_copy(&h5, &t1) != TFM_OK);
        CHECK(tfm_tensor_copy(&t1, NULL) != TFM_OK);
        tfm_cuda_free(d1);
        tfm_cuda_free(d2);
        tfm_cuda_free(NULL); /* nothing */
    }
}

/* ==== 3. layers: a transformer block on a CUDA tfm_mem against the same block on the CPU ================ */

static const char *const cu_block_names[20] = {
    "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
    "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight",
    "norm2.bias", "multihead_attn.in_proj_weight", "multihead_attn.in_proj_bias", "multihead_attn.out_proj.weight",
    "multihead_attn.out_proj.bias", "norm3.weight", "norm3.bias"};
#define CU_BLOCK_NAMES(cross) ((cross) ? 18 : 12)

/* Count, allocate, carve (the tfm_mem recipe) on device dev. */
static int cu_block_build(tfm_block *blk, tfm_mem *mem, const tfm_block_desc *d, tfm_device dev) {
    memset(mem, 0, sizeof *mem);
    mem->device = dev;
    if (tfm_block_init(blk, d, mem) != TFM_OK || tfm_mem_alloc(mem) != TFM_OK) {
        TEST__FAIL("building a block on device %d: %s", (int)dev, tfm_last_error());
        tfm_mem_free(mem);
        return 0;
    }
    tfm_mem_rewind(mem);
    if (tfm_block_init(blk, d, mem) != TFM_OK) {
        TEST__FAIL("carving a block on device %d: %s", (int)dev, tfm_last_error());
        tfm_mem_free(mem);
        return 0;
    }
    return 1;
}

/* A parameter or gradient of a block, copied to the host (malloc'ed); *n its length. */
static float *cu_block_get(tfm_block *blk, const char *name, int grad, int64_t *n) {
    tfm_tensor v, g;
    if (tfm_block_param(blk, name, &v, &g) != TFM_OK) cu_fatal(name);
    *n = tfm_numel(grad ? &g : &v);
    return cu_fetch((grad ? g : v).data, *n, (grad ? g : v).device);
}

/* self-attention or cross-attention block, post-LN or pre-LN, each activation: the same parameters
   (initialised from one seed on both: bitwise equal), forward with every mask and dropout, backward into
   dx, dxkv and every parameter's gradient. */
static void cu_block_case(int cross, int norm_first, tfm_activation act) {
    tfm_block_desc d;
    tfm_block blk[2];
    tfm_mem mem[2];
    tfm_attn_opts o;
    int B = 3, T = 17, Tk = 23, C = 32, i, built = 0;
    int32_t lens[3] = {17, 9, 1}, kv_lens[3] = {23, 5, 12};
    float mask[17 * 17];
    char name[100];
    cu_rng g = {(uint64_t)(51 + cross * 4 + norm_first * 2 + (int)act)};
    cu_buf x, xkv, y, dy, dx, dxkv;
    snprintf(name, sizeof name, "block cross=%d norm_first=%d act=%d", cross, norm_first, (int)act);
    memset(&d, 0, sizeof d);
    d.d_model = C;
    d.n_heads = 4;
    d.d_ff = 48;
    d.cross = cross;
    d.norm_first = norm_first;
    d.act = act;
    d.dropout = 0.1f;
    d.attn_dropout = 0.1f;
    d.max_batch = B;
    d.max_len = 20;
    d.max_kv_len = cross ? 24 : 0;
    CU_DEVS built += cu_block_build(&blk[dv], &mem[dv], &d, CU_DEV);
    if (built < 2) {
        if (built) tfm_mem_free(&mem[0]);
        return;
    }
    CHECK(blk[1].self_attn.in_proj_weight.device == TFM_DEVICE_CUDA);
    CU_DEVS {
        tfm_rng r;
        tfm_rng_seed(&r, 2024);
        CHECK_OK(tfm_block_init_params(&blk[dv], &r));
    }
    for (i = 0; i < CU_BLOCK_NAMES(cross); i++) {
        int64_t n0, n1;
        float *p0 = cu_block_get(&blk[0], cu_block_names[i], 0, &n0), *p1 = cu_block_get(&blk[1], cu_block_names[i], 0, &n1);
        CHECK(n0 == n1);
        cu_check_bits_arrays(cu_fmt("%s: tfm_block_init_params %s", name, cu_block_names[i]), p1, p0, n0);
        free(p0);
        free(p1);
    }
    x = cu_normal((int64_t)B * T * C, &g, 1, 0);
    xkv = cu_normal((int64_t)B * Tk * C, &g, 1, 0);
    y = cu_nan((int64_t)B * T * C);
    dy = cu_normal((int64_t)B * T * C, &g, 1, 0);
    dx = cu_normal((int64_t)B * T * C, &g, 1, 0);
    dxkv = cu_normal((int64_t)B * Tk * C, &g, 1, 0);
    for (i = 0; i < T * T; i++) mask[i] = i % 7 == 3 ? -INFINITY : 0.5f * cu_gauss(&g);
    memset(&o, 0, sizeof o);
    o.causal = 1;
    o.key_lens = lens;
    o.kv_lens = cross ? kv_lens : NULL;
    o.mask = mask;
    o.training = 1;
    o.seed = 777;
    CU_DEVS {
        tfm_tensor tx = cu_t(&x, dv, B, T, C), txkv = cu_t(&xkv, dv, B, Tk, C), ty = cu_t(&y, dv, B, T, C);
        CHECK_OK(tfm_block_forward(&blk[dv], &ty, &tx, cross ? &txkv : NULL, &o));
    }
    cu_check(cu_fmt("%s: y", name), &y, CU_TOL_LAYER);
    CU_DEVS {
        tfm_tensor tdy = cu_t(&dy, dv, B, T, C), tdx = cu_t(&dx, dv, B, T, C), tdxkv = cu_t(&dxkv, dv, B, Tk, C);
        tfm_mem_zero_grad(&mem[dv]);
        CHECK_OK(tfm_block_backward(&blk[dv], &tdx, cross ? &tdxkv : NULL, &tdy));
    }
    cu_check(cu_fmt("%s: dx", name), &dx, CU_TOL_LAYER);
    if (cross) cu_check(cu_fmt("%s: dxkv", name), &dxkv, CU_TOL_LAYER);
    for (i = 0; i < CU_BLOCK_NAMES(cross); i++) {
        int64_t n0, n1;
        float *g0 = cu_block_get(&blk[0], cu_block_names[i], 1, &n0), *g1 = cu_block_get(&blk[1], cu_block_names[i], 1, &n1);
        cu_check_arrays(cu_fmt("%s: gradient of %s", name, cu_block_names[i]), g1, g0, n0, CU_TOL_LAYER);
        free(g0);
        free(g1);
    }
    cu_release(&x, &xkv, &y, &dy, &dx, &dxkv, CU_END);
    CU_DEVS tfm_mem_free(&mem[dv]);
}

static void cu_block_self(void) {
    cu_block_case(0, 0, TFM_ACT_RELU);
    cu_block_case(0, 1, TFM_ACT_GELU);
}
static void cu_block_cross(void) {
    cu_block_case(1, 0, TFM_ACT_GELU_TANH);
    cu_block_case(1, 1, TFM_ACT_RELU);
}

/* The smaller layers on a CUDA tfm_mem against the CPU's: a cross-attention layer (tfm_mha, with key
   lengths of both sequences and attention dropout), a linear map and a layernorm, forward and backward
   (into every gradient), from the same initialisation. */
typedef struct cu_small_layers {
    tfm_mem mem;
    tfm_mha mha;
    tfm_linear lin;
    tfm_layernorm ln;
} cu_small_layers;

static int cu_small_layers_build(cu_small_layers *l, const tfm_mha_desc *d, tfm_device dev) {
    int pass;
    memset(l, 0, sizeof *l);
    l->mem.device = dev;
    for (pass = 0; pass < 2; pass++) {
        if (pass) {
            CHECK_OK(tfm_mem_alloc(&l->mem));
            tfm_mem_rewind(&l->mem);
        }
        if (tfm_mha_init(&l->mha, d, &l->mem) != TFM_OK || tfm_linear_init(&l->lin, d->d_model, 24, 0, &l->mem) != TFM_OK ||
            tfm_layernorm_init(&l->ln, 24, 0, 0.0f, 64, &l->mem) != TFM_OK) {
            TEST__FAIL("building the layers on device %d: %s", (int)dev, tfm_last_error());
            tfm_mem_free(&l->mem);
            return 0;
        }
    }
    return 1;
}

static void cu_layers_small(void) {
    static const char *const names[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
    cu_small_layers *l = (cu_small_layers *)calloc(2, sizeof(cu_small_layers));
    tfm_mha_desc d;
    tfm_attn_opts o;
    int B = 2, Tq = 9, Tk = 13, C = 32, built = 0, i;
    int32_t kv_lens[2] = {13, 6};
    cu_rng g = {57};
    cu_buf x, xkv, y, dy, dx, dxkv, h, dh, z, dz;
    memset(&d, 0, sizeof d);
    d.d_model = C;
    d.n_heads = 4;
    d.cross = 1;
    d.max_batch = B;
    d.max_len = Tq;
    d.max_kv_len = Tk;
    CU_DEVS built += cu_small_layers_build(&l[dv], &d, CU_DEV);
    if (built < 2) {
        if (built) tfm_mem_free(&l[0].mem);
        free(l);
        return;
    }
    CU_DEVS {
        tfm_rng r;
        tfm_rng_seed(&r, 31);
        CHECK_OK(tfm_mha_init_params(&l[dv].mha, &r));
        CHECK_OK(tfm_linear_init_params(&l[dv].lin, &r));
        CHECK_OK(tfm_layernorm_init_params(&l[dv].ln));
    }
    x = cu_normal((int64_t)B * Tq * C, &g, 1, 0);
    xkv = cu_normal((int64_t)B * Tk * C, &g, 1, 0);
    y = cu_nan((int64_t)B * Tq * C);
    h = cu_nan((int64_t)B * Tq * 24);
    z = cu_nan((int64_t)B * Tq * 24);
    dz = cu_normal((int64_t)B * Tq * 24, &g, 1, 0);
    dh = cu_normal((int64_t)B * Tq * 24, &g, 1, 0);
    dy = cu_normal((int64_t)B * Tq * C, &g, 1, 0);
    dx = cu_normal((int64_t)B * Tq * C, &g, 1, 0);
    dxkv = cu_normal((int64_t)B * Tk * C, &g, 1, 0);
    memset(&o, 0, sizeof o);
    o.key_lens = kv_lens; /* an attention layer's key_lens are the keys' (xkv's) lengths */
    o.dropout = 0.1f;
    o.dropout_seed = 21;
    CU_DEVS {
        tfm_tensor tx = cu_t(&x, dv, B, Tq, C), txkv = cu_t(&xkv, dv, B, Tk, C), ty = cu_t(&y, dv, B, Tq, C);
        tfm_tensor th = cu_t(&h, dv, B, Tq, 24), tz = cu_t(&z, dv, B, Tq, 24);
        CHECK_OK(tfm_mha_forward(&l[dv].mha, &ty, &tx, &txkv, &o));
        CHECK_OK(tfm_linear_layer_forward(&l[dv].lin, &th, &ty));
        CHECK_OK(tfm_layernorm_layer_forward(&l[dv].ln, &tz, &th));
    }
    cu_check("tfm_mha_forward (cross)", &y, CU_TOL_LAYER);
    cu_check("tfm_linear_layer_forward", &h, CU_TOL_LAYER);
    cu_check("tfm_layernorm_layer_forward", &z, CU_TOL_LAYER);
    CU_DEVS {
        tfm_tensor tdz = cu_t(&dz, dv, B, Tq, 24), tdh = cu_t(&dh, dv, B, Tq, 24), th = cu_t(&h, dv, B, Tq, 24);
        tfm_tensor ty = cu_t(&y, dv, B, Tq, C), tdy = cu_t(&dy, dv, B, Tq, C), tdx = cu_t(&dx, dv, B, Tq, C);
        tfm_tensor tdxkv = cu_t(&dxkv, dv, B, Tk, C);
        tfm_mem_zero_grad(&l[dv].mem);
        CHECK_OK(tfm_layernorm_layer_backward(&l[dv].ln, &tdh, &tdz, &th));
        CHECK_OK(tfm_linear_layer_backward(&l[dv].lin, &tdy, &tdh, &ty));
        CHECK_OK(tfm_mha_backward(&l[dv].mha, &tdx, &tdxkv, &tdy));
    }
    cu_check("tfm_layernorm_layer_backward: dx", &dh, CU_TOL_LAYER);
    cu_check("tfm_linear_layer_backward: dx", &dy, CU_TOL_LAYER);
    cu_check("tfm_mha_backward: dx", &dx, CU_TOL_LAYER);
    cu_check("tfm_mha_backward: dxkv", &dxkv, CU_TOL_LAYER);
    for (i = 0; i < 8; i++) { /* the parameters' gradients */
        tfm_tensor t[2];
        float *p[2];
        const char *what;
        CU_DEVS {
            if (i < 4) CHECK_OK(tfm_mha_param(&l[dv].mha, names[i], NULL, &t[dv]));
            else if (i < 6) t[dv] = i == 4 ? l[dv].lin.d_weight : l[dv].lin.d_bias;
            else t[dv] = i == 6 ? l[dv].ln.d_weight : l[dv].ln.d_bias;
            p[dv] = cu_fetch(t[dv].data, tfm_numel(&t[dv]), t[dv].device);
        }
        what = i < 4 ? names[i] : i == 4 ? "linear weight" : i == 5 ? "linear bias" : i == 6 ? "layernorm weight" : "layernorm bias";
        cu_check_arrays(cu_fmt("small layers: gradient of %s", what), p[1], p[0], tfm_numel(&t[0]), CU_TOL_LAYER);
        free(p[0]);
        free(p[1]);
    }
    cu_release(&x, &xkv, &y, &dy, &dx, &dxkv, &h, &dh, &z, &dz, CU_END);
    CU_DEVS tfm_mem_free(&l[dv].mem);
    free(l);
}

/* ==== 4. models: trained on both devices from the same config and the same batches ====================== */

#define CU_B 2  /* batch rows */
#define CU_T 8  /* longest sequence */
#define CU_IN 6
#define CU_N_MODELS 9

typedef struct cu_data {
    int32_t tokens[CU_B * CU_T], lens[CU_B], tgt_in[CU_B * CU_T], targets[CU_B * CU_T], types[CU_B * CU_T];
    float inputs[CU_B * CU_T * CU_IN];
    tfm_batch b;
} cu_data;

static const char *const cu_model_names[CU_N_MODELS] = {"classifier", "classifier cls_token input_dim", "lm", "encdec",
                                                        "encdec shared", "bert classifier", "lm rope", "encdec gqa",
                                                        "lm rope window"};

/* Six tiny models that cover the configuration's switches between them: post-LN and pre-LN, ReLU, GELU
   and tanh-GELU, learned and sinusoidal positions, mean and [CLS] pooling, token and continuous inputs,
   tied and shared embeddings, biases or none, label smoothing, ignore_index (-100 and 0) with padded rows,
   dropout 0.1 on the residual branches and the attention weights, BERT's token types and embedding
   layernorm. */
static tfm_config cu_model_cfg(int which, tfm_device dev) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.d_model = 16;
    c.n_heads = 2;
    c.n_layers = 2;
    c.d_ff = 32;
    c.max_batch = CU_B;
    c.dropout = 0.1f;
    c.attn_dropout = 0.1f;
    c.seed = (uint64_t)(500 + which);
    c.device = dev;
    switch (which) {
    case 0:
        c.kind = TFM_MODEL_ENCODER_CLASSIFIER;
        c.vocab_size = 11;
        c.n_classes = 3;
        c.max_len = 8;
        c.d_model = 24;
        break;
    case 1:
        c.kind = TFM_MODEL_ENCODER_CLASSIFIER;
        c.input_dim = CU_IN;
        c.cls_token = 1;
        c.pool = TFM_POOL_CLS;
        c.n_classes = 4;
        c.max_len = 7;
        c.norm_first = 1;
        c.act = TFM_ACT_GELU;
        c.pos = TFM_POS_SINUSOIDAL;
        break;
    case 2:
        c.kind = TFM_MODEL_DECODER_LM;
        c.vocab_size = 13;
        c.max_len = CU_T;
        c.norm_first = 1;
        c.act = TFM_ACT_GELU_TANH;
        c.tie_output = 1;
        c.label_smoothing = 0.1f;
        c.scale_emb = 1;
        c.d_model = 32;
        c.n_heads = 4;
        c.d_ff = 48;
        break;
    case 3:
        c.kind = TFM_MODEL_ENCODER_DECODER;
        c.vocab_size = 12;
        c.tgt_vocab_size = 10;
        c.n_dec_layers = 1;
        c.max_len = 7;
        c.max_tgt_len = 8;
        c.pos = TFM_POS_SINUSOIDAL;
        c.label_smoothing = 0.1f;
        c.has_ignore_index = 1;
        c.ignore_index = 0;
        c.tie_output = 1;
        break;
    case 5:
        c.kind = TFM_MODEL_ENCODER_CLASSIFIER;
        c.vocab_size = 11;
        c.n_classes = 2;
        c.max_len = CU_T;
        c.act = TFM_ACT_GELU;
        c.type_vocab_size = 2;
        c.emb_norm = 1;
        c.ln_eps = 1e-12f;
        break;
    case 6: /* LLaMA's block with rotary positions (base 100): 6 of 8 channels rotated */
    case 8: /* the same with every channel rotated and a sliding window of 3 positions and 1 sink */
        c.kind = TFM_MODEL_DECODER_LM;
        c.vocab_size = 13;
        c.max_len = CU_T;
        c.norm_first = 1;
        c.act = TFM_ACT_SWIGLU;
        c.norm = TFM_NORM_RMS;
        c.pos = TFM_POS_ROPE;
        c.rope_base = 100.0f;
        if (which == 6) {
            c.rope_dims = 6;
        } else {
            c.attn_window = 3;
            c.attn_sinks = 1;
        }
        break;
    case 7: /* grouped-query attention: 4 query heads over 2 key/value heads, rotary positions, cross-attention too */
        c.kind = TFM_MODEL_ENCODER_DECODER;
        c.vocab_size = 12;
        c.max_len = CU_T;
        c.max_tgt_len = CU_T - 1;
        c.n_heads = 4;
        c.n_kv_heads = 2;
        c.norm_first = 1;
        c.pos = TFM_POS_ROPE;
        break;
    default:
        c.kind = TFM_MODEL_ENCODER_DECODER;
        c.vocab_size = 12;
        c.share_emb = 1;
        c.tie_output = 1;
        c.norm_first = 1;
        c.act = TFM_ACT_SWIGLU;
        c.init = TFM_INIT_XAVIER;
        c.no_bias = 1;
        c.norm = TFM_NORM_RMS;
        c.max_len = 6;
        c.max_tgt_len = 7;
        break;
    }
    return c;
}

/* AdamW with weight decay, clipping, warmup and cosine decay over 100 steps */
static tfm_optim cu_optim(void) {
    tfm_optim o;
    memset(&o, 0, sizeof o);
    o.lr = 3e-3f;
    o.weight_decay = 0.01f;
    o.clip_norm = 0.5f;
    o.schedule = TFM_SCHED_COSINE;
    o.warmup_steps = 10;
    o.total_steps = 100;
    o.min_lr = 1e-4f;
    return o;
}

/* Batch number `seed` for config c: random ids (or inputs), lengths and labels, some targets ignored,
   rows padded past their lengths. */
static void cu_batch(cu_data *d, const tfm_config *c, uint64_t seed) {
    cu_rng g = {seed * 7919 + 17};
    int B = CU_B, T = c->max_len, ign = c->has_ignore_index ? c->ignore_index : -100, b, t, i;
    int Vt = c->tgt_vocab_size ? c->tgt_vocab_size : c->vocab_size;
    memset(d, 0, sizeof *d);
    d->b.batch = B;
    d->b.len = T;
    d->b.lens = d->lens;
    d->b.targets = d->targets;
    if (c->input_dim) {
        d->b.inputs = d->inputs;
        for (i = 0; i < B * T * c->input_dim; i++) d->inputs[i] = cu_gauss(&g);
    } else {
        d->b.tokens = d->tokens;
        for (i = 0; i < B * T; i++) d->tokens[i] = cu_int(&g, c->vocab_size);
    }
    for (b = 0; b < B; b++) d->lens[b] = (int32_t)(b == 0 ? T : 1 + cu_int(&g, T));
    if (c->type_vocab_size) { /* token types: every other batch has none (type 0 everywhere) */
        d->b.token_types = seed % 2 ? NULL : d->types;
        for (i = 0; i < B * T; i++) d->types[i] = cu_int(&g, c->type_vocab_size);
    }
    if (c->kind == TFM_MODEL_ENCODER_CLASSIFIER) {
        for (b = 0; b < B; b++) d->targets[b] = cu_int(&g, c->n_classes);
    } else if (c->kind == TFM_MODEL_DECODER_LM) {
        for (b = 0; b < B; b++)
            for (t = 0; t < T; t++) d->targets[b * T + t] = t >= d->lens[b] || cu_int(&g, 5) == 0 ? ign : cu_int(&g, c->vocab_size);
    } else {
        int Tt = c->max_tgt_len;
        d->b.tgt_len = Tt;
        d->b.tgt_in = d->tgt_in;
        for (b = 0; b < B; b++) {
            int n = b == 0 ? Tt : 1 + cu_int(&g, Tt);
            for (t = 0; t < Tt; t++) {
                d->tgt_in[b * Tt + t] = t < n ? cu_int(&g, Vt) : 0;
                d->targets[b * Tt + t] = t < n ? cu_int(&g, Vt) : ign;
            }
        }
    }
}

/* tfm_model_init; on failure a test failure and 0 */
static int cu_init(tfm_model *m, const tfm_config *c, const char *what) {
    tfm_result r = tfm_model_init(m, c, NULL, 0);
    if (r != TFM_OK) {
        TEST__FAIL("%s: tfm_model_init on device %d returned %d: %s", what, (int)c->device, (int)r, tfm_last_error());
        return 0;
    }
    return 1;
}

/* Steps first .. first+steps-1: zero the gradients, two micro-batches (batches 2s and 2s+1) each with
   loss_scale 0.5, one AdamW step. losses[2i + k] and norms[i] (either may be NULL). 0 on an error. */
static int cu_train(tfm_model *m, const tfm_optim *o, int first, int steps, float *losses, float *norms) {
    cu_data *d = (cu_data *)malloc(sizeof(cu_data));
    int i, k, ok = 1;
    for (i = 0; i < steps && ok; i++) {
        float norm = 0.0f;
        tfm_model_zero_grad(m);
        for (k = 0; k < 2 && ok; k++) {
            float loss = 0.0f;
            cu_batch(d, &m->cfg, (uint64_t)(2 * (first + i) + k));
            if (tfm_model_forward(m, &d->b, &loss, NULL) != TFM_OK || tfm_model_backward(m, 0.5f) != TFM_OK) ok = 0;
            if (losses) losses[2 * i + k] = loss;
        }
        if (ok && tfm_model_step(m, o, &norm) != TFM_OK) ok = 0;
        if (norms) norms[i] = norm;
        if (!ok) TEST__FAIL("training step %d on device %d: %s", first + i, (int)m->params[0].value.device, tfm_last_error());
    }
    free(d);
    return ok;
}

/* losses of two runs: |got - want| <= CU_TOL_LOSS * max(1, |want|) at each */
static void cu_check_losses(const char *what, const float *got, const float *want, int n) {
    int bad = 0, first = -1, i;
    double worst = 0.0;
    for (i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]) / fmax(1.0, fabs((double)want[i]));
        if (!(e <= CU_TOL_LOSS)) {
            if (!bad) first = i;
            bad++;
        }
        if (e > worst || e != e) worst = e;
    }
    if (worst == worst && worst > cu_worst) cu_worst = worst;
    CHECK_MSG(!bad, "%s: %d of %d losses differ by more than %g relative (first: forward %d, device %.8g, CPU %.8g); worst %.3g", what, bad,
              n, CU_TOL_LOSS, first, bad ? (double)got[first] : 0.0, bad ? (double)want[first] : 0.0, worst);
}

/* The flat parameters (grads 0) or gradients (1) of m, copied to the host (malloc'ed); *n their count. */
static float *cu_model_flat(tfm_model *m, int grads, int64_t *n) {
    float *p = tfm_model_flat(m, grads, n);
    if (!p) cu_fatal("tfm_model_flat");
    return cu_fetch(p, *n, m->params[0].value.device);
}

/* AdamW's first (which 0) or second moments of m, on the host (malloc'ed); *n their count. */
static float *cu_model_moments(tfm_model *m, int which, int64_t *n) {
    *n = m->impl->mom_hi - m->impl->mom_lo;
    return cu_fetch(which ? m->impl->mom_v : m->impl->mom_m, *n, m->params[0].value.device);
}

/* every parameter of m in two flat copies: to tol (0: bit for bit), naming the parameter at fault */
static void cu_check_params(const char *what_, const tfm_model *m, const float *got, const float *want, double tol) {
    char what[200];
    snprintf(what, sizeof what, "%s", what_); /* cu_fmt's buffers rotate */
    for (int i = 0; i < m->n_params; i++) {
        const tfm_param *p = &m->params[i];
        int64_t n = tfm_numel(&p->value);
        if (tol == 0.0) cu_check_bits_arrays(cu_fmt("%s: %s", what, p->name), got + p->offset, want + p->offset, n);
        else cu_check_arrays(cu_fmt("%s: %s", what, p->name), got + p->offset, want + p->offset, n, tol);
    }
}

/* Both models' whole state the same, bit for bit: parameters, gradients, moments, step, generator. */
static void cu_check_state(const char *what_, tfm_model *a, tfm_model *b, int grads) {
    char what[200];
    int64_t na, nb;
    float *pa, *pb;
    int k;
    snprintf(what, sizeof what, "%s", what_);
    pa = cu_model_flat(a, 0, &na);
    pb = cu_model_flat(b, 0, &nb);
    CHECK(na == nb);
    cu_check_params(cu_fmt("%s: parameter", what), a, pa, pb, 0.0);
    free(pa);
    free(pb);
    if (grads) {
        pa = cu_model_flat(a, 1, &na);
        pb = cu_model_flat(b, 1, &nb);
        cu_check_params(cu_fmt("%s: gradient", what), a, pa, pb, 0.0);
        free(pa);
        free(pb);
    }
    for (k = 0; k < 2; k++) {
        pa = cu_model_moments(a, k, &na);
        pb = cu_model_moments(b, k, &nb);
        CHECK(na == nb);
        cu_check_bits_arrays(cu_fmt("%s: %s moments", what, k ? "second" : "first"), pa, pb, na);
        free(pa);
        free(pb);
    }
    CHECK_MSG(a->step == b->step, "%s: step %lld against %lld", what, (long long)a->step, (long long)b->step);
    CHECK_MSG(!memcmp(&a->impl->rng, &b->impl->rng, sizeof(tfm_rng)), "%s: the generators differ", what);
    CHECK_MSG(a->impl->training == b->impl->training, "%s: training mode %d against %d", what, a->impl->training, b->impl->training);
}

/* Model `which`, built on both devices from one config (bitwise the same parameters), trained 100 steps
   (--small: 20) on the same batches: every loss within CU_TOL_LOSS, the gradient norms and the final
   parameters close, and an evaluation forward's logits too. */
static void cu_model_case(int which) {
    tfm_config cc = cu_model_cfg(which, TFM_DEVICE_CPU), cg = cu_model_cfg(which, TFM_DEVICE_CUDA);
    tfm_model mc, mg;
    tfm_optim o = cu_optim();
    int steps = cu_small ? 20 : 100, i;
    const char *nm = cu_model_names[which];
    float *lc = (float *)calloc((size_t)(4 * steps), sizeof(float)), *lg = lc + 2 * steps;
    float *nc = (float *)calloc((size_t)(2 * steps), sizeof(float)), *ng = nc + steps;
    int64_t n0, n1;
    float *p0, *p1;
    if (!cu_init(&mc, &cc, nm)) goto out;
    if (!cu_init(&mg, &cg, nm)) {
        tfm_model_free(&mc);
        goto out;
    }
    CHECK(mg.params[0].value.device == TFM_DEVICE_CUDA && mc.params[0].value.device == TFM_DEVICE_CPU);
    CHECK(tfm_model_param(&mg, mg.params[0].name)->value.device == TFM_DEVICE_CUDA);
    p0 = cu_model_flat(&mc, 0, &n0);
    p1 = cu_model_flat(&mg, 0, &n1);
    CHECK(n0 == n1);
    cu_check_params(cu_fmt("%s: initial", nm), &mc, p1, p0, 0.0);
    free(p0);
    free(p1);
    if (cu_train(&mc, &o, 0, steps, lc, nc) && cu_train(&mg, &o, 0, steps, lg, ng)) {
        cu_check_losses(cu_fmt("%s: training losses", nm), lg, lc, 2 * steps);
        for (i = 0; i < steps; i++) cu_check_scalar(cu_fmt("%s: gradient norm of step %d", nm, i), ng[i], nc[i], CU_TOL_TRAINED, 1e-6);
        if (test__verbose)
            printf("    %s: loss %.4f -> %.4f (CPU), %.4f -> %.4f (GPU)\n", nm, lc[0], lc[2 * steps - 1], lg[0], lg[2 * steps - 1]);
        p0 = cu_model_flat(&mc, 0, &n0);
        p1 = cu_model_flat(&mg, 0, &n1);
        cu_check_params(cu_fmt("%s: trained", nm), &mc, p1, p0, CU_TOL_TRAINED);
        free(p0);
        free(p1);
        { /* an evaluation forward: the loss and the logits */
            cu_data *d = (cu_data *)malloc(sizeof(cu_data));
            float loss[2];
            tfm_tensor lt[2];
            float *l0, *l1;
            tfm_model_train(&mc, 0);
            tfm_model_train(&mg, 0);
            cu_batch(d, &cc, 99999);
            CHECK_OK(tfm_model_forward(&mc, &d->b, &loss[0], NULL));
            CHECK_OK(tfm_model_forward(&mg, &d->b, &loss[1], NULL));
            cu_check_scalar(cu_fmt("%s: evaluation loss", nm), loss[1], loss[0], CU_TOL_TRAINED, 1.0);
            lt[0] = tfm_model_logits(&mc);
            lt[1] = tfm_model_logits(&mg);
            CHECK(lt[1].device == TFM_DEVICE_CUDA && tfm_numel(&lt[0]) == tfm_numel(&lt[1]));
            l0 = cu_fetch(lt[0].data, tfm_numel(&lt[0]), lt[0].device);
            l1 = cu_fetch(lt[1].data, tfm_numel(&lt[1]), lt[1].device);
            cu_check_arrays(cu_fmt("%s: evaluation logits", nm), l1, l0, tfm_numel(&lt[0]), CU_TOL_TRAINED);
            free(l0);
            free(l1);
            free(d);
        }
    }
    tfm_model_free(&mc);
    tfm_model_free(&mg);
out:
    free(lc);
    free(nc);
}

static void cu_model_classifier(void) { cu_model_case(0); }
static void cu_model_classifier_cls(void) { cu_model_case(1); }
static void cu_model_lm(void) { cu_model_case(2); }
static void cu_model_encdec(void) { cu_model_case(3); }
static void cu_model_encdec_shared(void) { cu_model_case(4); }
static void cu_model_bert(void) { cu_model_case(5); }
static void cu_model_rope(void) { cu_model_case(6); }
static void cu_model_gqa(void) { cu_model_case(7); }
static void cu_model_window(void) { cu_model_case(8); }

/* Whole training steps (tfm_model_train_step) of each model, on the CPU and on the GPU with graphs off
   and on: with graphs, the GPU's state after every step (parameters, gradients, moments, step, generator),
   its losses, counts and gradient norms are the same bits as without, and within the training tolerances
   of the CPU's. Under the emulation every step after the first is one graph launch (a model with
   input_dim too: its inputs pass through the staging ring). Then, for the LM: the capture of a step made to
   fail (broken, its update refused, its update and instantiation refused) leaves that step and the next 2
   launch by launch with the same bits, and one whose work space must grow inside it that step only; a
   failing graph launch
   is the call's TFM_E_CUDA; and a gradient norm that is not finite, found once the graph has run, is
   TFM_E_ARG with the parameters, moments and step as they were, as without graphs. */
static void cu_train_step_models(tfm_model *m, int which) {
    int k;
    for (k = 0; k < 3; k++) {
        tfm_config c = cu_model_cfg(which, k ? TFM_DEVICE_CUDA : TFM_DEVICE_CPU);
        if (!cu_init(&m[k], &c, cu_model_names[which])) cu_fatal("tfm_model_init");
    }
}

/* the thread's device work space given up: the next call that needs it must allocate it anew */
static void cu_free_ws(void) {
    cudaFree(tfm__cu.ws);
    tfm__cu.ws = NULL;
    tfm__cu.ws_size = 0;
}

/* 1: cu_train_step_pair forgets the training graph's record before m[2]'s step, which is then captured,
   not replayed (the capture's failures below) */
static int cu_no_train_replay;

/* one step of m[1] (graphs off) and m[2] (graphs on) on batch seed, `before` (may be NULL) called just
   before m[2]'s: the same results, bit for bit; the graph launches of m[2]'s (emulation; else 0). r: what
   both returned. */
static unsigned long long cu_train_step_pair(tfm_model *m, const tfm_optim *o, cu_data *d, uint64_t seed, const char *what,
                                             tfm_result *r, void (*before)(void)) {
    float loss[2], norm[2];
    int64_t cnt[2];
    tfm_result rr[2];
    unsigned long long g0 = 0, g1 = 0;
    int k;
    cu_batch(d, &m[1].cfg, seed);
    for (k = 0; k < 2; k++) {
        CHECK_OK(tfm_cuda_set_graphs(k));
        if (k && cu_no_train_replay) /* (every model's slot) */
            for (int i = TFM__CU_GRAPH_TRAIN; i < TFM__CU_GRAPH_FORWARD; i++) tfm__cu.rec_n[1 + i] = 0;
        if (k && before) before();
#ifdef TFM_CUDA_EMULATION
        if (k) g0 = tfm_emu_graph_launches();
#endif
        rr[k] = tfm_model_train_step(&m[1 + k], &d->b, o, &loss[k], &cnt[k], &norm[k]);
#ifdef TFM_CUDA_EMULATION
        if (k) g1 = tfm_emu_graph_launches();
#endif
    }
    CHECK_OK(tfm_cuda_set_graphs(1));
    CHECK_MSG(rr[0] == rr[1], "%s: graphs off returned %d, on %d (%s)", what, (int)rr[0], (int)rr[1], tfm_last_error());
    CHECK_MSG(!memcmp(&loss[0], &loss[1], sizeof(float)) && cnt[0] == cnt[1] && !memcmp(&norm[0], &norm[1], sizeof(float)),
              "%s: loss %.9g / %.9g, counted %lld / %lld, norm %.9g / %.9g with graphs off / on", what, loss[0], loss[1],
              (long long)cnt[0], (long long)cnt[1], norm[0], norm[1]);
    *r = rr[1];
    return g1 - g0;
}

static void cu_train_graphs(void) {
    int steps = cu_small ? 4 : 8, which, s;
    tfm_optim o = cu_optim();
    cu_data *d = (cu_data *)malloc(sizeof(cu_data));
    for (which = 0; which < CU_N_MODELS; which++) {
        tfm_model m[3];
        const char *nm = cu_model_names[which];
        unsigned long long launches = 0;
        cu_train_step_models(m, which);
        for (s = 0; s < steps; s++) {
            float loss = 0.0f, norm = 0.0f;
            int64_t cnt = 0;
            tfm_result r;
            cu_batch(d, &m[0].cfg, (uint64_t)(1000 + s));
            CHECK_OK(tfm_model_train_step(&m[0], &d->b, &o, &loss, &cnt, &norm));
            launches += cu_train_step_pair(m, &o, d, (uint64_t)(1000 + s), cu_fmt("%s step %d", nm, s), &r, NULL);
            CHECK_OK(r);
            {   /* against the CPU's step (the GPU's results are the same with graphs and without) */
                float l1 = m[1].impl->last_loss;
                cu_check_scalar(cu_fmt("%s step %d: loss", nm, s), l1, loss, CU_TOL_LOSS, 1.0);
            }
        }
#ifdef TFM_CUDA_EMULATION
        {
            unsigned long long want = (unsigned long long)(steps - 1);
            CHECK_MSG(launches == want, "%s: %llu graph launches in %d steps, %llu expected", nm, launches, steps, want);
        }
#endif
        cu_check_state(cu_fmt("%s: %d steps with graphs against without", nm, steps), &m[2], &m[1], 1);
        {
            int64_t n0, n1;
            float *p0 = cu_model_flat(&m[0], 0, &n0), *p1 = cu_model_flat(&m[2], 0, &n1);
            cu_check_params(cu_fmt("%s: %d steps on the GPU against the CPU", nm, steps), &m[0], p1, p0, CU_TOL_TRAINED);
            free(p0);
            free(p1);
        }
        for (s = 0; s < 3; s++) tfm_model_free(&m[s]);
    }
#ifdef TFM_CUDA_EMULATION
    { /* the LM: failures of a capture (each step captured, none replayed) */
        static const char *const apis[3][2] = {{"cudaStreamEndCapture", NULL},
                                               {"cudaGraphExecUpdate", NULL},
                                               {"cudaGraphExecUpdate", "cudaGraphInstantiate"}};
        static const int codes[3] = {cudaErrorStreamCaptureInvalidated, cudaErrorGraphExecUpdateFailure, cudaErrorInvalidValue};
        int f;
        cu_no_train_replay = 1;
        for (f = 0; f < 6; f++) {
            tfm_model m[3];
            unsigned long long launched = 0, want;
            tfm_result r;
            cu_train_step_models(m, 2);
            tfm_model_free(&m[0]);
            for (s = 0; s < 7; s++) {
                const char *what = cu_fmt("lm, failure %d, step %d", f, s);
                if (s == 2) { /* the second step captured */
                    tfm_emu_fail_clear();
                    if (f < 3) tfm_emu_fail_next(apis[f][0], codes[f], 0);
                    if (f == 2) tfm_emu_fail_next(apis[f][1], cudaErrorInvalidValue, 0);
                    if (f == 3) tfm_emu_fail_next("cudaGraphLaunch", cudaErrorInvalidValue, 0);
                    if (f == 5) { /* a NaN weight on both: the norm is not finite */
                        int k;
                        for (k = 1; k < 3; k++) {
                            float nan = NAN;
                            CHECK(cudaMemcpy(m[k].params[1].value.data, &nan, sizeof nan, cudaMemcpyHostToDevice) == cudaSuccess);
                        }
                    }
                }
                if (f == 3 && s == 2) { /* only m[2] launches a graph */
                    float loss, norm;
                    CHECK_OK(tfm_cuda_set_graphs(1));
                    cu_batch(d, &m[2].cfg, (uint64_t)(2000 + s));
                    r = tfm_model_train_step(&m[2], &d->b, &o, &loss, NULL, &norm);
                    CHECK_MSG(r == TFM_E_CUDA && strstr(tfm_last_error(), "tfm_model_train_step") &&
                                  strstr(tfm_last_error(), "cudaGraphLaunch"),
                              "lm: a failing graph launch gave %d (%s)", (int)r, tfm_last_error());
                    CHECK(m[2].step == 2);
                    tfm_emu_reset();
                    break;
                }
                if (f == 5 && s == 2) {
                    int64_t n[4];
                    float *before[2], *after[2];
                    int k;
                    for (k = 0; k < 2; k++) before[k] = cu_model_flat(&m[1 + k], 0, &n[k]);
                    launched += cu_train_step_pair(m, &o, d, (uint64_t)(2000 + s), what, &r, NULL);
                    CHECK_MSG(r == TFM_E_ARG && strstr(tfm_last_error(), "tfm_model_train_step") &&
                                  strstr(tfm_last_error(), "not finite"),
                              "lm: a NaN gradient norm gave %d (%s)", (int)r, tfm_last_error());
                    for (k = 0; k < 2; k++) {
                        after[k] = cu_model_flat(&m[1 + k], 0, &n[2 + k]);
                        cu_check_params(cu_fmt("lm, graphs %s: parameters after a NaN norm", k ? "on" : "off"), &m[1], after[k],
                                        before[k], 0.0);
                        CHECK(m[1 + k].step == 2);
                        free(before[k]);
                        free(after[k]);
                    }
                    CHECK_MSG(launched == 2, "lm: the step with a NaN norm ran without a graph (%llu launches)", launched);
                    cu_check_state("lm: after a NaN norm, graphs on against off", &m[2], &m[1], 1);
                    break;
                }
                /* 4: the work space must grow inside the capture */
                launched += cu_train_step_pair(m, &o, d, (uint64_t)(2000 + s), what, &r, f == 4 && s == 2 ? cu_free_ws : NULL);
                CHECK_MSG(r == TFM_OK, "%s: %s", what, tfm_last_error());
            }
            if (f != 3 && f != 5) {
                CHECK_MSG(tfm_emu_fail_pending() == 0, "lm: the failure %d armed was not reached", f);
                /* 7 steps, the first without; the failed one and 2 after (a space to grow: the failed one) */
                want = (unsigned long long)(7 - 1) - (f == 1 ? 0 : f == 4 ? 1 : 3);
                CHECK_MSG(launched == want, "lm: capture failure %d: %llu graph launches, %llu expected", f, launched, want);
                cu_check_state(cu_fmt("lm: capture failure %d, graphs on against off", f), &m[2], &m[1], 1);
            }
            tfm_emu_fail_clear();
            tfm_emu_reset();
            for (s = 1; s < 3; s++) tfm_model_free(&m[s]);
        }
        cu_no_train_replay = 0;
        CHECK_OK(tfm_cuda_set_graphs(1));
    }
#endif
    free(d);
}

/* Training steps that replay their graph (tfm__cuda_capture_end's dry run). Each model of cu_model_cfg,
   with its dropout and without, the LM in bf16 and the LM with heads of 160 channels (the attention's
   batched products): steps on new batches, under a schedule whose rate
   changes every step, give the same bits with graphs as without (states, losses, norms), and every step
   after the first captured one replays (the batch's arrays, AdamW's scalars and the dropout masks' seeds
   are staged, not kernel arguments). BERT with token types in every other batch replays no step, and
   its dry runs back off after two misses in a row. Two LMs trained taking turns each replay their own
   graph; five (more than a thread keeps graphs for) none, with the same bits. Under the emulation, for the
   LM: a replay's graph launch that fails
   is the call's TFM_E_CUDA; a dry run that fails leaves the step captured, with the same bits. Then a
   classifier of continuous inputs whose step stages more than the first staging holds
   (TFM__CU_STEP_BYTES): its first capture fails without backing off, the next has more, and the steps
   after it replay, with the same bits as without graphs; one whose step stages more than the staging may
   grow to (TFM__CU_STEP_MAX) runs launch by launch, with the same bits, and the staging stays as it was. */
static void cu_train_replay(void) {
    int steps = cu_small ? 5 : 8, which, s, k;
    tfm_optim o = cu_optim();
    cu_data *d = (cu_data *)malloc(sizeof(cu_data));
    for (which = 0; which < 2 * (CU_N_MODELS + 2); which++) {
        tfm_model m[3];
        int w = which / 2, drop = which % 2;
        tfm_config c = cu_model_cfg(w < CU_N_MODELS ? w : 2, TFM_DEVICE_CUDA);
        unsigned long long launches = 0, r0;
        char nm[96];
        snprintf(nm, sizeof nm, "%s%s", w < CU_N_MODELS ? cu_model_names[w] : w == CU_N_MODELS ? "lm bf16" : "lm heads of 160",
                 drop ? ", dropout" : ", no dropout");
        if (!drop) c.dropout = c.attn_dropout = 0.0f;
        if (w == CU_N_MODELS) c.precision = TFM_PREC_BF16;
        if (w == CU_N_MODELS + 1) c.d_model = 320, c.n_heads = 2, c.n_layers = 1;
        memset(m, 0, sizeof m);
        tfm_scratch_release(); /* no graph, no record, no backing off */
        if (cu_init(&m[1], &c, nm) && cu_init(&m[2], &c, nm)) {
            r0 = tfm__cu.replays;
            for (s = 0; s < steps; s++) {
                tfm_result r;
                launches += cu_train_step_pair(m, &o, d, (uint64_t)(3000 + 2 * s), cu_fmt("%s, step %d", nm, s), &r,
                                               NULL); /* (even: BERT's token types in every batch) */
                CHECK_MSG(r == TFM_OK, "%s step %d: %s", nm, s, tfm_last_error());
            }
#ifdef TFM_CUDA_EMULATION
            CHECK_MSG(launches == (unsigned long long)(steps - 1), "%s: %llu graph launches in %d steps", nm, launches, steps);
#endif
            CHECK_MSG(tfm__cu.replays - r0 == (unsigned long long)(steps - 2), "%s: %llu of %d steps replayed, %d expected", nm,
                      tfm__cu.replays - r0, steps, steps - 2);
            cu_check_state(cu_fmt("%s: %d steps with graphs against without", nm, steps), &m[2], &m[1], 1);
        }
        for (k = 1; k < 3; k++) tfm_model_free(&m[k]);
    }
    { /* BERT with token types in every other batch: no step replays, and after two misses in a row the
         dry runs back off */
        tfm_model m[3];
        tfm_config c = cu_model_cfg(5, TFM_DEVICE_CUDA);
        unsigned long long r0;
        memset(m, 0, sizeof m);
        tfm_scratch_release();
        if (cu_init(&m[1], &c, "bert") && cu_init(&m[2], &c, "bert")) {
            r0 = tfm__cu.replays;
            for (s = 0; s < 5; s++) {
                tfm_result r;
                (void)cu_train_step_pair(m, &o, d, (uint64_t)(3000 + s), cu_fmt("bert, token types or none, step %d", s), &r,
                                         NULL);
                CHECK_MSG(r == TFM_OK, "bert step %d: %s", s, tfm_last_error());
            }
            CHECK_MSG(tfm__cu.replays == r0, "bert, token types or none: %llu steps replayed", tfm__cu.replays - r0);
            CHECK_MSG(tfm__cu.dry_fails[TFM__CU_GRAPH_TRAIN] == 2 && tfm__cu.dry_skip[TFM__CU_GRAPH_TRAIN] == 1,
                      "bert, token types or none: %d dry runs missed in a row, the next %d skipped (2 and 1 expected)",
                      tfm__cu.dry_fails[TFM__CU_GRAPH_TRAIN], tfm__cu.dry_skip[TFM__CU_GRAPH_TRAIN]);
            cu_check_state("bert, token types or none: 5 steps with graphs against without", &m[2], &m[1], 1);
        }
        for (s = 1; s < 3; s++) tfm_model_free(&m[s]);
    }
    { /* the LM whose work space must grow inside step 3's dry run and capture (given up before it; the
         steps with graphs run first, as those without would grow it): neither counts as a miss nor backs
         off, step 4 is captured (or replays, when the space came back at the same address), 5 to 7 replay */
        tfm_model m[2];
        tfm_config c = cu_model_cfg(2, TFM_DEVICE_CUDA);
        int rep[8];
        memset(m, 0, sizeof m);
        tfm_scratch_release();
        if (cu_init(&m[0], &c, "lm") && cu_init(&m[1], &c, "lm")) {
            for (s = 0; s < 8; s++) {
                float loss[2], norm[2];
                tfm_result r[2];
                unsigned long long r0 = tfm__cu.replays;
                cu_batch(d, &c, (uint64_t)(5000 + 2 * s));
                if (s == 3) cu_free_ws();
                for (k = 0; k < 2; k++) { /* with graphs first */
                    CHECK_OK(tfm_cuda_set_graphs(!k));
                    r[k] = tfm_model_train_step(&m[k], &d->b, &o, &loss[k], NULL, &norm[k]);
                    if (!k) rep[s] = (int)(tfm__cu.replays - r0);
                }
                CHECK_MSG(r[0] == TFM_OK && r[1] == TFM_OK, "lm, a growing space, step %d: %s", s, tfm_last_error());
                CHECK_MSG(!memcmp(&loss[0], &loss[1], sizeof(float)) && !memcmp(&norm[0], &norm[1], sizeof(float)),
                          "lm, a growing space, step %d: loss %.9g / %.9g, norm %.9g / %.9g with graphs on / off", s,
                          loss[0], loss[1], norm[0], norm[1]);
                if (s == 3)
                    CHECK_MSG(tfm__cu.ws && !tfm__cu.graph_skip[TFM__CU_GRAPH_TRAIN] && !tfm__cu.dry_fails[TFM__CU_GRAPH_TRAIN],
                              "lm, a growing space: after step 3 the work space is %p, %d captures and %d dry runs skipped, %d "
                              "dry runs missed", (void *)tfm__cu.ws, tfm__cu.graph_skip[TFM__CU_GRAPH_TRAIN],
                              tfm__cu.dry_skip[TFM__CU_GRAPH_TRAIN], tfm__cu.dry_fails[TFM__CU_GRAPH_TRAIN]);
            }
            CHECK_OK(tfm_cuda_set_graphs(1));
            CHECK_MSG(!rep[0] && !rep[1] && rep[2] && !rep[3] && rep[5] && rep[6] && rep[7],
                      "lm, a growing space: steps replayed %d%d%d%d%d%d%d%d, want 0010?111", rep[0], rep[1], rep[2], rep[3],
                      rep[4], rep[5], rep[6], rep[7]);
            cu_check_state("lm, a growing space: 8 steps with graphs against without", &m[1], &m[0], 1);
        }
        for (k = 0; k < 2; k++) tfm_model_free(&m[k]);
    }
    for (k = 0; k < 2; k++) { /* models that take turns, each with its twin without graphs: 2 LMs (from other
                                 seeds), each of whose steps after its first captured one replays its own
                                 graph; 5 (more than a thread keeps graphs for), none of which replays */
        enum { NM = 5, ROUNDS = 5 };
        tfm_model m[NM][3];
        int n = k ? NM : 2, i, ok = 1;
        unsigned long long r0;
        memset(m, 0, sizeof m);
        tfm_scratch_release();
        for (i = 0; i < n; i++) {
            tfm_config c = cu_model_cfg(2, TFM_DEVICE_CUDA);
            c.seed = (uint64_t)(700 + i);
            c.dropout = c.attn_dropout = 0.0f;
            ok = ok && cu_init(&m[i][1], &c, "lm, taking turns") && cu_init(&m[i][2], &c, "lm, taking turns");
        }
        r0 = tfm__cu.replays;
        for (s = 0; ok && s < ROUNDS; s++)
            for (i = 0; i < n; i++) {
                tfm_result r;
                const char *what = cu_fmt("%d lms taking turns, lm %d, round %d", n, i, s);
                (void)cu_train_step_pair(m[i], &o, d, (uint64_t)(6000 + 2 * s), what, &r, NULL);
                CHECK_MSG(r == TFM_OK, "%d lms taking turns, lm %d, round %d: %s", n, i, s, tfm_last_error());
            }
        if (ok) {
            /* each: its first step launch by launch, its second captured, the others replayed */
            unsigned long long want = k ? 0u : (unsigned long long)n * (ROUNDS - 2);
            CHECK_MSG(tfm__cu.replays - r0 == want, "%d lms taking turns: %llu steps replayed, %llu expected", n,
                      tfm__cu.replays - r0, want);
            for (i = 0; i < n; i++)
                cu_check_state(cu_fmt("%d lms taking turns, lm %d: graphs against without", n, i), &m[i][2], &m[i][1], 1);
        }
        for (i = 0; i < n; i++)
            for (s = 1; s < 3; s++) tfm_model_free(&m[i][s]);
    }
#ifdef TFM_CUDA_EMULATION
    for (k = 0; k < 2; k++) { /* the LM with dropout: step 3's dry run fails (0) or its replay's launch (1) */
        tfm_model m[3];
        tfm_config c = cu_model_cfg(2, TFM_DEVICE_CUDA);
        unsigned long long launches = 0, r0;
        memset(m, 0, sizeof m);
        tfm_scratch_release();
        if (cu_init(&m[1], &c, "lm") && cu_init(&m[2], &c, "lm")) {
            r0 = tfm__cu.replays;
            for (s = 0; s < 5; s++) {
                const char *what = cu_fmt("lm, a failing %s, step %d", k ? "replay" : "dry run", s);
                tfm_result r;
                if (s == 3) {
                    tfm_emu_fail_clear();
                    tfm_emu_fail_next(k ? "cudaGraphLaunch" : "cudaStreamEndCapture",
                                      k ? cudaErrorInvalidValue : cudaErrorStreamCaptureInvalidated, 0);
                }
                if (k && s == 3) {
                    float loss, norm;
                    CHECK_OK(tfm_cuda_set_graphs(1));
                    cu_batch(d, &m[2].cfg, (uint64_t)(3000 + 2 * s));
                    r = tfm_model_train_step(&m[2], &d->b, &o, &loss, NULL, &norm);
                    CHECK_MSG(r == TFM_E_CUDA && strstr(tfm_last_error(), "tfm_model_train_step") &&
                                  strstr(tfm_last_error(), "cudaGraphLaunch"),
                              "lm: a failing replay gave %d (%s)", (int)r, tfm_last_error());
                    CHECK_MSG(tfm__cu.replays - r0 == 2, "lm: %llu replays before the failing one", tfm__cu.replays - r0);
                    tfm_emu_reset();
                    break;
                }
                launches += cu_train_step_pair(m, &o, d, (uint64_t)(3000 + 2 * s), what, &r, NULL);
                CHECK_MSG(r == TFM_OK, "%s: %s", what, tfm_last_error());
            }
            if (!k) { /* step 3 captured after its dry run failed (one miss: no backing off); step 4 replays */
                CHECK_MSG(tfm_emu_fail_pending() == 0, "lm: the failing dry run was not reached");
                CHECK_MSG(launches == 4 && tfm__cu.replays - r0 == 2, "lm, a failing dry run: %llu graph launches, %llu replays",
                          launches, tfm__cu.replays - r0);
                cu_check_state("lm, a failing dry run: 5 steps with graphs against without", &m[2], &m[1], 1);
            }
        }
        tfm_emu_fail_clear();
        for (s = 1; s < 3; s++) tfm_model_free(&m[s]);
    }
    CHECK_OK(tfm_cuda_set_graphs(1));
#endif
    for (k = 0; k < 2; k++) { /* a classifier of continuous inputs that stages 8 x 16 x IN floats a step: 80 KiB
                                 (IN 160), and 17 MB (IN 34,000: more than the staging may grow to) */
        enum { B = 8, T = 16 };
        int IN = k ? 34000 : 160, big = k, i, j;
        tfm_config c = cu_model_cfg(1, TFM_DEVICE_CUDA);
        tfm_model m[2];
        float *x = (float *)malloc((size_t)B * T * IN * sizeof(float));
        int32_t lens[B], labels[B];
        tfm_batch b;
        unsigned long long r0;
#ifdef TFM_CUDA_EMULATION
        unsigned long long g0 = 0, launches = 0;
#endif
        cu_rng g = {99};
        char nm[64];
        snprintf(nm, sizeof nm, "inputs 8 x 16 x %d", IN);
        c.dropout = c.attn_dropout = 0.0f;
        c.max_batch = B;
        c.max_len = T;
        c.input_dim = IN;
        memset(m, 0, sizeof m);
        memset(&b, 0, sizeof b);
        b.batch = B;
        b.len = T;
        b.inputs = x;
        b.targets = labels;
        b.lens = lens;
        tfm_scratch_release();
        if (cu_init(&m[0], &c, nm) && cu_init(&m[1], &c, nm)) {
            r0 = tfm__cu.replays;
            for (s = 0; s < 5; s++) {
                float loss[2], norm[2];
                tfm_result r[2];
                for (i = 0; i < B * T * IN; i++) x[i] = cu_gauss(&g);
                for (i = 0; i < B; i++) lens[i] = 1 + cu_int(&g, T), labels[i] = cu_int(&g, c.n_classes);
                for (j = 0; j < 2; j++) {
                    CHECK_OK(tfm_cuda_set_graphs(j));
#ifdef TFM_CUDA_EMULATION
                    if (j) g0 = tfm_emu_graph_launches();
#endif
                    r[j] = tfm_model_train_step(&m[j], &b, &o, &loss[j], NULL, &norm[j]);
#ifdef TFM_CUDA_EMULATION
                    if (j) launches += tfm_emu_graph_launches() - g0;
#endif
                }
                CHECK_MSG(r[0] == TFM_OK && r[1] == TFM_OK, "%s, step %d: %d, %d (%s)", nm, s, (int)r[0], (int)r[1],
                          tfm_last_error());
                CHECK_MSG(!memcmp(&loss[0], &loss[1], sizeof(float)) && !memcmp(&norm[0], &norm[1], sizeof(float)),
                          "%s, step %d: loss %.9g / %.9g, norm %.9g / %.9g with graphs off / on", nm, s, loss[0], loss[1],
                          norm[0], norm[1]);
            }
            CHECK_OK(tfm_cuda_set_graphs(1));
            /* 80 KiB: step 0 warms up, step 1's capture runs out of staging, 2 is captured with more, 3 and 4
               replay; 17 MB: step 1's capture runs out, the staging does not grow, 2 and 3 back off, 4 fails */
#ifdef TFM_CUDA_EMULATION
            CHECK_MSG(launches == (big ? 0u : 3u), "%s: %llu graph launches in 5 steps", nm, launches);
#endif
            CHECK_MSG(tfm__cu.replays - r0 == (big ? 0u : 2u), "%s: %llu steps replayed", nm, tfm__cu.replays - r0);
            CHECK_MSG(big ? tfm__cu.step_size == TFM__CU_STEP_BYTES : tfm__cu.step_size > TFM__CU_STEP_BYTES,
                      "%s: the staging holds %zu bytes", nm, tfm__cu.step_size);
            cu_check_state(cu_fmt("%s: 5 steps with graphs against without", nm), &m[1], &m[0], 1);
        }
        for (j = 0; j < 2; j++) tfm_model_free(&m[j]);
        free(x);
    }
    free(d);
}

/* tfm_model_forward as a CUDA graph (tfm__model_graph): each model of cu_model_cfg, and the LM in bf16,
   in training mode (dropout; then backward and tfm_model_step on the forward's results) and in evaluation
   mode (with targets, and without), on new batches: the same losses, counts and logits to the bit with
   graphs as without, and after the training steps the same parameters, gradients and moments; every
   forward after the first captured one replays; two LMs' forwards taking turns each replay their own
   graph. Under the emulation: a forward's graph launch that fails
   is its TFM_E_CUDA, and there is then no forward for backward; the next forward works. */
static void cu_forward_graphs(void) {
    int steps = cu_small ? 5 : 8, which, s, k, mode;
    tfm_optim o = cu_optim();
    cu_data *d = (cu_data *)malloc(sizeof(cu_data));
    for (which = 0; which <= CU_N_MODELS; which++) {
        tfm_config c = cu_model_cfg(which < CU_N_MODELS ? which : 2, TFM_DEVICE_CUDA);
        const char *nm = which < CU_N_MODELS ? cu_model_names[which] : "lm bf16";
        if (which == CU_N_MODELS) c.precision = TFM_PREC_BF16;
        for (mode = 0; mode < 3; mode++) { /* training; evaluation with targets; evaluation without */
            tfm_model m[2];
            unsigned long long r0;
#ifdef TFM_CUDA_EMULATION
            unsigned long long g0 = 0, launches = 0;
#endif
            const char *mn = mode == 0 ? "training" : mode == 1 ? "evaluation" : "evaluation, no targets";
            memset(m, 0, sizeof m);
            tfm_scratch_release(); /* no graph, no record, no backing off */
            if (!cu_init(&m[0], &c, nm) || !cu_init(&m[1], &c, nm)) {
                for (k = 0; k < 2; k++) tfm_model_free(&m[k]);
                continue;
            }
            for (k = 0; k < 2; k++) tfm_model_train(&m[k], mode == 0);
            r0 = tfm__cu.replays;
            for (s = 0; s < steps; s++) {
                float loss[2], *lg[2];
                int64_t cnt[2];
                tfm_result r[2];
                tfm_tensor t[2];
                cu_batch(d, &c, (uint64_t)(4000 + 2 * s)); /* (even: BERT's token types in every batch) */
                if (mode == 2) d->b.targets = NULL;
                for (k = 0; k < 2; k++) {
                    CHECK_OK(tfm_cuda_set_graphs(k));
#ifdef TFM_CUDA_EMULATION
                    if (k) g0 = tfm_emu_graph_launches();
#endif
                    r[k] = tfm_model_forward(&m[k], &d->b, &loss[k], &cnt[k]);
#ifdef TFM_CUDA_EMULATION
                    if (k) launches += tfm_emu_graph_launches() - g0;
#endif
                    t[k] = tfm_model_logits(&m[k]);
                    lg[k] = cu_fetch(t[k].data, tfm_numel(&t[k]), t[k].device);
                }
                CHECK_OK(tfm_cuda_set_graphs(1));
                CHECK_MSG(r[0] == TFM_OK && r[1] == TFM_OK, "%s, %s, step %d: %d, %d (%s)", nm, mn, s, (int)r[0], (int)r[1],
                          tfm_last_error());
                CHECK_MSG(!memcmp(&loss[0], &loss[1], sizeof(float)) && cnt[0] == cnt[1],
                          "%s, %s, step %d: loss %.9g / %.9g, counted %lld / %lld with graphs off / on", nm, mn, s, loss[0],
                          loss[1], (long long)cnt[0], (long long)cnt[1]);
                cu_check_bits_arrays(cu_fmt("%s, %s, step %d: logits with graphs against without", nm, mn, s), lg[1], lg[0],
                                     tfm_numel(&t[0]));
                free(lg[0]);
                free(lg[1]);
                if (mode == 0)
                    for (k = 0; k < 2; k++) {
                        tfm_model_zero_grad(&m[k]);
                        CHECK_OK(tfm_model_backward(&m[k], 1.0f));
                        CHECK_OK(tfm_model_step(&m[k], &o, NULL));
                    }
            }
#ifdef TFM_CUDA_EMULATION
            CHECK_MSG(launches == (unsigned long long)(steps - 1), "%s, %s: %llu graph launches in %d forwards", nm, mn, launches,
                      steps);
#endif
            CHECK_MSG(tfm__cu.replays - r0 == (unsigned long long)(steps - 2), "%s, %s: %llu of %d forwards replayed", nm, mn,
                      tfm__cu.replays - r0, steps);
            if (mode == 0) cu_check_state(cu_fmt("%s: %d training steps, forwards with graphs against without", nm, steps), &m[1],
                                          &m[0], 1);
            for (k = 0; k < 2; k++) tfm_model_free(&m[k]);
        }
    }
    { /* two LMs (from other seeds) in evaluation, their forwards taking turns: each replays its own graph
         after its first captured one, with the same losses as their twins without graphs */
        tfm_model m[2][2];
        int i, ok = 1;
        unsigned long long r0;
        memset(m, 0, sizeof m);
        tfm_scratch_release();
        for (i = 0; i < 2; i++) {
            tfm_config c = cu_model_cfg(2, TFM_DEVICE_CUDA);
            c.seed = (uint64_t)(800 + i);
            ok = ok && cu_init(&m[i][0], &c, "lm, taking turns") && cu_init(&m[i][1], &c, "lm, taking turns");
            for (k = 0; ok && k < 2; k++) tfm_model_train(&m[i][k], 0);
        }
        r0 = tfm__cu.replays;
        for (s = 0; ok && s < 5; s++)
            for (i = 0; i < 2; i++) {
                float loss[2];
                tfm_result r[2];
                cu_batch(d, &m[i][0].cfg, (uint64_t)(4100 + 2 * s));
                for (k = 0; k < 2; k++) {
                    CHECK_OK(tfm_cuda_set_graphs(k));
                    r[k] = tfm_model_forward(&m[i][k], &d->b, &loss[k], NULL);
                }
                CHECK_OK(tfm_cuda_set_graphs(1));
                CHECK_MSG(r[0] == TFM_OK && r[1] == TFM_OK && !memcmp(&loss[0], &loss[1], sizeof(float)),
                          "lms taking turns, lm %d, forward %d: %d, %d, loss %.9g / %.9g with graphs off / on (%s)", i, s,
                          (int)r[0], (int)r[1], loss[0], loss[1], tfm_last_error());
            }
        if (ok)
            CHECK_MSG(tfm__cu.replays - r0 == 6u, "lms taking turns: %llu forwards replayed, 6 expected", tfm__cu.replays - r0);
        for (i = 0; i < 2; i++)
            for (k = 0; k < 2; k++) tfm_model_free(&m[i][k]);
    }
#ifdef TFM_CUDA_EMULATION
    { /* the LM: a failing replay */
        tfm_model m;
        tfm_config c = cu_model_cfg(2, TFM_DEVICE_CUDA);
        float loss;
        tfm_result r;
        tfm_scratch_release();
        if (cu_init(&m, &c, "lm")) {
            cu_batch(d, &c, 4000);
            for (s = 0; s < 3; s++) CHECK_OK(tfm_model_forward(&m, &d->b, &loss, NULL));
            tfm_emu_fail_clear();
            tfm_emu_fail_next("cudaGraphLaunch", cudaErrorInvalidValue, 0);
            r = tfm_model_forward(&m, &d->b, &loss, NULL);
            CHECK_MSG(r == TFM_E_CUDA && strstr(tfm_last_error(), "tfm_model_forward") && strstr(tfm_last_error(), "cudaGraphLaunch"),
                      "lm: a failing forward replay gave %d (%s)", (int)r, tfm_last_error());
            tfm_emu_fail_clear();
            tfm_emu_reset();
            r = tfm_model_backward(&m, 1.0f);
            CHECK_MSG(r == TFM_E_ARG, "lm: backward after a failed forward gave %d (%s)", (int)r, tfm_last_error());
            CHECK_OK(tfm_model_forward(&m, &d->b, &loss, NULL));
            CHECK_OK(tfm_model_backward(&m, 1.0f));
            tfm_model_free(&m);
        }
    }
#endif
    free(d);
}

/* NaN weights (element 0 of every parameter) in each model, fp32 and bf16: a training step (a CUDA graph
   after a good first step) gives TFM_E_ARG for its norm, an evaluation forward and greedy decoding
   (LMs, encoder-decoders) run to their end. Under the emulation a warp whose lanes part at a shuffle or a
   barrier aborts the run: NaN must not make a kernel's threads disagree on where to go (on a GPU that
   hangs or reads garbage). */
static void cu_nan_weights(void) {
    tfm_optim o = cu_optim();
    cu_data *d = (cu_data *)malloc(sizeof(cu_data));
    int which, bf;
    for (bf = 0; bf < 2; bf++)
        for (which = 0; which < CU_N_MODELS; which++) {
            tfm_config c = cu_model_cfg(which, TFM_DEVICE_CUDA);
            tfm_model m;
            float loss, nan = NAN;
            tfm_result r;
            int i;
            if (bf) c.precision = TFM_PREC_BF16;
            if (!cu_init(&m, &c, cu_model_names[which])) break;
            cu_batch(d, &c, 7);
            CHECK_OK(tfm_model_train_step(&m, &d->b, &o, &loss, NULL, NULL));
            for (i = 0; i < m.n_params; i++)
                CHECK(cudaMemcpy(m.params[i].value.data, &nan, sizeof nan, cudaMemcpyHostToDevice) == cudaSuccess);
            r = tfm_model_train_step(&m, &d->b, &o, &loss, NULL, NULL);
            CHECK_MSG(r == TFM_E_ARG && strstr(tfm_last_error(), "not finite"), "%s%s: a NaN step gave %d (%s)",
                      cu_model_names[which], bf ? " bf16" : "", (int)r, tfm_last_error());
            tfm_model_train(&m, 0);
            CHECK_OK(tfm_model_forward(&m, &d->b, &loss, NULL));
            CHECK_MSG(!isfinite(loss), "%s: loss %g with NaN weights", cu_model_names[which], loss);
            if (c.kind != TFM_MODEL_ENCODER_CLASSIFIER) {
                tfm_gen_opts g;
                int32_t src[3] = {1, 2, 3}, prompt[2] = {1, 2}, out[4];
                int n_out = 0, encdec = c.kind == TFM_MODEL_ENCODER_DECODER;
                memset(&g, 0, sizeof g);
                g.max_new = 4;
                CHECK_OK(tfm_model_generate(&m, encdec ? src : NULL, encdec ? 3 : 0, prompt, encdec ? 1 : 2, &g, out, &n_out));
                g.beam_width = 2;
                {
                    int lens[1], found = 0;
                    float score;
                    CHECK_OK(tfm_model_beam_search(&m, encdec ? src : NULL, encdec ? 3 : 0, prompt, encdec ? 1 : 2, &g, 1, out, 4,
                                                   lens, &score, &found));
                }
            }
            tfm_model_free(&m);
        }
    free(d);
}

/* ==== 5. generation: the same tokens and scores as on the CPU ========================================== */

/* which: 0 an LM, 1 an encoder-decoder, 2 an LM with rotary positions (the cache's keys turned at their positions),
   3 that LM with grouped-query attention (4 query heads over 1 key/value head: the cache holds that one) */
static void cu_gen_cfg(tfm_config *c, int which, int max_batch, tfm_device dev) {
    int encdec = which == 1;
    memset(c, 0, sizeof *c);
    c->kind = encdec ? TFM_MODEL_ENCODER_DECODER : TFM_MODEL_DECODER_LM;
    c->vocab_size = 13;
    c->tgt_vocab_size = encdec ? 11 : 0;
    c->d_model = 16;
    c->n_heads = 4;
    c->n_layers = 2;
    c->d_ff = 24;
    c->max_len = 12;
    c->max_tgt_len = encdec ? 10 : 0;
    c->max_batch = max_batch;
    c->norm_first = !encdec;
    c->act = encdec ? TFM_ACT_RELU : TFM_ACT_GELU_TANH;
    c->pos = encdec ? TFM_POS_SINUSOIDAL : which >= 2 ? TFM_POS_ROPE : TFM_POS_LEARNED;
    c->rope_base = which >= 2 ? 100.0f : 0.0f;
    c->n_kv_heads = which == 3 ? 1 : 0;
    c->attn_window = which == 4 ? 3 : 0; /* a rolling cache of 4 rows: generation wraps its ring */
    c->attn_sinks = which == 4;
    c->init_std = 0.3f; /* logits far from uniform: no near-ties for the argmax */
    c->seed = 7;
    c->device = dev;
}

/* the CPU model and its GPU twin; 0 (and nothing left) on failure */
static int cu_gen_pair(tfm_model *m, int which, int max_batch) {
    tfm_config c[2];
    CU_DEVS cu_gen_cfg(&c[dv], which, max_batch, CU_DEV);
    if (!cu_init(&m[0], &c[0], "generation")) return 0;
    if (!cu_init(&m[1], &c[1], "generation")) {
        tfm_model_free(&m[0]);
        return 0;
    }
    return 1;
}

static void cu_check_ids(const char *what, const int32_t *got, int ngot, const int32_t *want, int nwant) {
    CHECK_MSG(ngot == nwant && !memcmp(got, want, (size_t)(nwant > 0 ? nwant : 0) * sizeof(int32_t)),
              "%s: the device made %d ids, the CPU %d (first ids %d %d / %d %d)", what, ngot, nwant, ngot > 0 ? got[0] : -1,
              ngot > 1 ? got[1] : -1, nwant > 0 ? want[0] : -1, nwant > 1 ? want[1] : -1);
}

/* greedy decoding, a batch of uneven prompts (and sources) with a stop token, beam search (width 3,
   n_best 2), scoring and sampling, for each model of cu_gen_cfg */
static void cu_gen_case(int which) {
    tfm_model m[2];
    tfm_gen_opts o;
    int32_t src[6] = {4, 9, 1, 12, 3, 7}, prompt[3] = {2, 7, 5};
    int32_t srcs[3][8] = {{3, 1, 4, 1, 5}, {9, 2, 6, 5, 3, 5, 8, 9}, {3, 8}}, prompts[3][4] = {{2, 7, 1, 8}, {1}, {4, 1}};
    int encdec = which == 1, src_lens[3] = {5, 8, 2}, n_prompts[3] = {4, 1, 2}, n_prompt = encdec ? 1 : 3, max_new = encdec ? 8 : 9, b, k;
    const int32_t *sp[3], *pp[3];
    int32_t out[2][3 * 9], stop;
    int n_out[2][3], lens[2][2], found[2];
    float scores[2][2], logp[2][12], total[2];
    const char *kind = encdec ? "encdec" : which == 3 ? "lm gqa" : which == 4 ? "lm rope window" : which ? "lm rope" : "lm";
    if (!cu_gen_pair(m, which, 3)) return;
    for (b = 0; b < 3; b++) sp[b] = srcs[b], pp[b] = prompts[b];
    if (encdec) n_prompts[0] = 2;
    CU_DEVS tfm_model_train(&m[dv], 0);
    /* greedy */
    memset(&o, 0, sizeof o);
    o.max_new = max_new;
    CU_DEVS CHECK_OK(tfm_model_generate(&m[dv], encdec ? src : NULL, 6, prompt, n_prompt, &o, out[dv], &n_out[dv][0]));
    cu_check_ids(cu_fmt("%s: tfm_model_generate", kind), out[1], n_out[1][0], out[0], n_out[0][0]);
    if (test__verbose) printf("    %s greedy: %d ids, first %d %d %d\n", kind, n_out[0][0], out[0][0], out[0][1], out[0][2]);
    /* the score of the greedy continuation */
    CU_DEVS CHECK_OK(tfm_model_score(&m[dv], encdec ? src : NULL, 6, prompt, n_prompt, out[0], n_out[0][0], logp[dv], &total[dv]));
    for (k = 0; k < n_out[0][0]; k++) cu_check_scalar(cu_fmt("%s: tfm_model_score logp[%d]", kind, k), logp[1][k], logp[0][k], 1e-4, 1.0);
    cu_check_scalar(cu_fmt("%s: tfm_model_score total", kind), total[1], total[0], 1e-4, 1.0);
    /* a batch of uneven rows ending at a stop token (the CPU's third greedy id: it ends the first row early) */
    stop = out[0][2];
    o.max_new = 6;
    o.has_stop = 1;
    o.stop_token = stop;
    CU_DEVS CHECK_OK(tfm_model_generate_batch(&m[dv], 3, encdec ? sp : NULL, encdec ? src_lens : NULL, pp, n_prompts, &o, out[dv], 9,
                                              n_out[dv]));
    for (b = 0; b < 3; b++)
        cu_check_ids(cu_fmt("%s: tfm_model_generate_batch row %d", kind, b), out[1] + 9 * b, n_out[1][b], out[0] + 9 * b, n_out[0][b]);
    /* beam search */
    o.beam_width = 3;
    CU_DEVS CHECK_OK(tfm_model_beam_search(&m[dv], encdec ? src : NULL, 6, prompt, n_prompt, &o, 2, out[dv], 9, lens[dv], scores[dv],
                                           &found[dv]));
    CHECK_MSG(found[0] == found[1], "%s: beam search found %d on the device, %d on the CPU", kind, found[1], found[0]);
    for (k = 0; k < found[0] && k < 2; k++) {
        cu_check_ids(cu_fmt("%s: tfm_model_beam_search hypothesis %d", kind, k), out[1] + 9 * k, lens[1][k], out[0] + 9 * k, lens[0][k]);
        cu_check_scalar(cu_fmt("%s: tfm_model_beam_search score %d", kind, k), scores[1][k], scores[0][k], 1e-4, 1.0);
    }
    /* sampling (the same batch): every filter, the rows' own seeds; the host draws from the same logits on
       both devices, so the ids agree unless a draw falls within the logits' ~1e-6 of a boundary */
    memset(&o, 0, sizeof o);
    o.max_new = 6;
    o.temperature = 0.9f;
    o.top_k = 8;
    o.top_p = 0.95f;
    o.min_p = 0.01f;
    o.repetition_penalty = 1.2f;
    o.seed = 11;
    CU_DEVS CHECK_OK(tfm_model_generate_batch(&m[dv], 3, encdec ? sp : NULL, encdec ? src_lens : NULL, pp, n_prompts, &o, out[dv], 9,
                                              n_out[dv]));
    for (b = 0; b < 3; b++)
        cu_check_ids(cu_fmt("%s: sampled tfm_model_generate_batch row %d", kind, b), out[1] + 9 * b, n_out[1][b], out[0] + 9 * b,
                     n_out[0][b]);
    { /* a key/value cache of the GPU model lives on the GPU; reorder and reset run there */
        tfm_kv_cache kc;
        int32_t from[2] = {1, 1};
        CHECK_OK(tfm_kv_cache_init(&kc, &m[1], 2, 0));
        CHECK(kc.device == TFM_DEVICE_CUDA);
        CHECK_OK(tfm_kv_cache_reorder(&kc, from, 2));
        tfm_kv_cache_reset(&kc);
        tfm_kv_cache_free(&kc);
    }
    CU_DEVS tfm_model_free(&m[dv]);
}

static void cu_gen_lm(void) { cu_gen_case(0); }
static void cu_gen_encdec(void) { cu_gen_case(1); }
static void cu_gen_rope(void) { cu_gen_case(2); }
static void cu_gen_gqa(void) { cu_gen_case(3); }
static void cu_gen_window(void) { cu_gen_case(4); }

/* beam_width 5 over a model of max_batch 2: the beams run two rows at a time */
static void cu_gen_wide_beam(void) {
    int encdec;
    for (encdec = 0; encdec < 2; encdec++) {
        tfm_model m[2];
        tfm_gen_opts o;
        int32_t src[4] = {2, 0, 3, 1}, prompt[2] = {3, 4}, out[2][3 * 8];
        int lens[2][3], found[2], k;
        float scores[2][3];
        if (!cu_gen_pair(m, encdec, 2)) return;
        memset(&o, 0, sizeof o);
        o.max_new = 7;
        o.beam_width = 5;
        o.length_penalty = 0.6f;
        CU_DEVS CHECK_OK(tfm_model_beam_search(&m[dv], encdec ? src : NULL, 4, prompt, encdec ? 1 : 2, &o, 3, out[dv], 8, lens[dv],
                                               scores[dv], &found[dv]));
        CHECK(found[0] == found[1]);
        for (k = 0; k < found[0] && k < 3; k++) {
            cu_check_ids(cu_fmt("wide beam encdec=%d hypothesis %d", encdec, k), out[1] + 8 * k, lens[1][k], out[0] + 8 * k, lens[0][k]);
            cu_check_scalar(cu_fmt("wide beam encdec=%d score %d", encdec, k), scores[1][k], scores[0][k], 1e-4, 1.0);
        }
        CU_DEVS tfm_model_free(&m[dv]);
    }
}

/* Decoding steps as CUDA graphs (tfm_cuda_set_graphs): for each model of cu_gen_cfg, greedy decoding
   and beam search give the same ids and scores with graphs as without and as the CPU. Under the
   emulation, each step is one graph launch, and every step of a call after its first replays the graph
   of the step before (tfm__cuda_capture_end's dry run): the graphs hold the lengths, slots and ids of
   their own step only through their copies, so a stale one would give other ids. With every step
   captured (the record forgotten before each), a capture made to fail (broken, its update refused, then
   its instantiation too) leaves that step to run launch by launch with the same ids and no error, the
   next 2 steps too (backing off); when a step's work space must grow while it is captured, that step
   only (run again, it grows the space); a failing graph launch is the call's error, as a kernel's. With
   replays: a dry run that fails (its capture broken) leaves the step to be captured, with no back-off; a
   failing replay is the call's error; a space to grow, that step only.
   A bf16 model too: the same ids with graphs as without. */
#ifdef TFM_CUDA_EMULATION
typedef struct cu_gen_hook_t {
    int ids, no_replay, drop_ws, fail_dry, fail_launch; /* ids seen; what to do before the third step */
} cu_gen_hook_t;
/* on_token: before every step, forget the decoding graph's record (no_replay: each step is captured);
   at the third id, give up the thread's device work space, so that the next step must grow it (and
   cannot while it is captured), or make the next step's dry run or graph launch fail */
static int cu_gen_hook(void *user, int row, int32_t token) {
    cu_gen_hook_t *h = (cu_gen_hook_t *)user;
    (void)row;
    (void)token;
    if (h->no_replay) tfm__cu.rec_n[1 + TFM__CU_GRAPH_DECODE] = 0;
    if (++h->ids != 3) return 0;
    if (h->drop_ws) cu_free_ws();
    if (h->fail_dry) tfm_emu_fail_next("cudaStreamEndCapture", cudaErrorStreamCaptureInvalidated, 0);
    if (h->fail_launch) tfm_emu_fail_next("cudaGraphLaunch", cudaErrorInvalidValue, 0);
    return 0;
}

#endif

/* A dry run (tfm__cuda_capture_begin with dry 1) replays the decoding graph only when its operations are
   all the recorded ones, the same, and nothing else was queued: a record of one noted operation (a
   memset) replays with it, not with another argument, nor without it, nor with an operation queued
   besides that the record has not seen. */
static void cu_graph_replay_rules(void) {
    static const char *const what = "an operation";
    unsigned long long r0;
    float *x = NULL;
    int k, ok;
    tfm_scratch_release();
    CHECK_OK(tfm_cuda_set_graphs(1));
    CHECK(cudaMalloc((void **)&x, sizeof(float)) == cudaSuccess);
    CHECK(!tfm__cuda_capture_begin(TFM__CU_GRAPH_DECODE, 1)); /* no record yet */
    CHECK(tfm__cuda_capture_begin(TFM__CU_GRAPH_DECODE, 0));
    ok = tfm__cu_op(what, 7, x); /* captured: queued */
    CHECK(ok);
    if (ok) (void)tfm__cuda_ok(cudaMemsetAsync(x, 0, sizeof(float), tfm__cu.stream), "cudaMemsetAsync");
    CHECK(tfm__cuda_capture_end(TFM__CU_GRAPH_DECODE));
    r0 = tfm__cu.replays;
    for (k = 0; k < 5; k++) {
        CHECK(tfm__cuda_capture_begin(TFM__CU_GRAPH_DECODE, 1));
        if (k != 3) CHECK(!tfm__cu_op(what, k == 1 ? 8 : 7, x)); /* dry: checked, not queued */
        if (k == 2) (void)tfm__cuda_ok(cudaMemsetAsync(x, 0, sizeof(float), tfm__cu.stream), "cudaMemsetAsync");
        if (k == 4) CHECK(!tfm__cu_op(what, 7, x));
        ok = tfm__cuda_capture_end(TFM__CU_GRAPH_DECODE);
        CHECK_MSG(ok == (k == 0), "dry run %d: replayed %d", k, ok);
    }
    CHECK_MSG(tfm__cu.replays - r0 == 1, "%llu replays, 1 expected", tfm__cu.replays - r0);
    CHECK_OK(tfm__cuda_check("cu_graph_replay_rules"));
    cudaFree(x);
    tfm_scratch_release();
}

/* A generation call's cache on a GPU is the thread's kept space: two greedy calls in a row, the second's
   every step replayed (its first too: the cache is where the first call's was, though the first call's
   device memory is taken meanwhile); a call from an on_token callback (of another model) makes a cache of
   its own: both calls give the ids they give alone, and the space is free again after both. A
   tfm_scratch_release from the callback keeps what the running call holds (its cache's space; a bf16
   model's weights rounded for the call): the same ids (under AddressSanitizer, no use after free). */
typedef struct cu_nest_t {
    tfm_model *inner; /* NULL: tfm_scratch_release instead */
    int32_t ids[9];
    int n, calls;
    tfm_result r;
} cu_nest_t;
static int cu_nest_hook(void *user, int row, int32_t token) {
    cu_nest_t *h = (cu_nest_t *)user;
    int32_t prompt[2] = {3, 1};
    tfm_gen_opts o;
    (void)row;
    (void)token;
    if (h->calls++ != 2) return 0;
    if (!h->inner) {
        tfm_scratch_release();
        return 0;
    }
    memset(&o, 0, sizeof o);
    o.max_new = 9;
    h->r = tfm_model_generate(h->inner, NULL, 0, prompt, 2, &o, h->ids, &h->n);
    return 0;
}
static void cu_gen_kept_cache(void) {
    tfm_model a[2], b[2];
    tfm_gen_opts o;
    int32_t prompt[3] = {2, 7, 5}, p2[2] = {3, 1}, want[9], got[9], want2[9];
    int n_want, n_got, n_want2, k;
    void *taken = NULL;
    cu_nest_t h;
    if (!cu_gen_pair(a, 0, 3)) return;
    if (!cu_gen_pair(b, 2, 3)) {
        CU_DEVS tfm_model_free(&a[dv]);
        return;
    }
    CU_DEVS tfm_model_train(&a[dv], 0);
    CU_DEVS tfm_model_train(&b[dv], 0);
    memset(&o, 0, sizeof o);
    o.max_new = 9;
    CHECK_OK(tfm_model_generate(&a[0], NULL, 0, prompt, 3, &o, want, &n_want));
    CHECK_OK(tfm_model_generate(&b[0], NULL, 0, p2, 2, &o, want2, &n_want2));
    tfm_scratch_release();
    CHECK_OK(tfm_cuda_set_graphs(1));
    for (k = 0; k < 2; k++) {
        unsigned long long r0 = tfm__cu.replays;
        CHECK_OK(tfm_model_generate(&a[1], NULL, 0, prompt, 3, &o, got, &n_got));
        cu_check_ids(cu_fmt("kept cache, call %d", k), got, n_got, want, n_want);
        CHECK_MSG(tfm__cu.kv && !tfm__cu.kv_busy, "kept cache, call %d: the space is %p, busy %d", k, tfm__cu.kv,
                  tfm__cu.kv_busy);
        if (k)
            CHECK_MSG(tfm__cu.replays - r0 == (unsigned long long)(n_got - 1),
                      "kept cache: the second call replayed %llu of %d steps", tfm__cu.replays - r0, n_got - 1);
        /* the memory a cache freed by the first call would have left: taken until after the second */
        if (!k) CHECK(cudaMalloc(&taken, tfm__cu.kv_size ? tfm__cu.kv_size : 1) == cudaSuccess);
    }
    cudaFree(taken);
    { /* beam search: its cache and its logits in the kept space; a second call allocates nothing */
        int32_t bo[2][2 * 9];
        int bl[2][2], nf[2];
        float sc[2][2];
        memset(bo, 0, sizeof bo);
        for (k = 0; k < 2; k++) {
            unsigned long long r0 = tfm__cu.replays;
            size_t pend = 1; /* (the fault armed and not taken; on a GPU, not counted) */
#ifdef TFM_CUDA_EMULATION
            if (k) tfm_emu_fail_next("cudaMalloc", (int)cudaErrorMemoryAllocation, 0);
#endif
            CHECK_OK(tfm_model_beam_search(&a[1], NULL, 0, prompt, 3, &o, 2, bo[k], 9, bl[k], sc[k], &nf[k]));
#ifdef TFM_CUDA_EMULATION
            pend = tfm_emu_fail_pending();
            tfm_emu_fail_clear();
#endif
            CHECK_MSG(!k || (pend == 1 && tfm__cu.replays > r0), "kept cache: the second beam search %s device memory, "
                      "replayed %llu steps", pend == 1 ? "allocated no" : "allocated", tfm__cu.replays - r0);
        }
        CHECK_MSG(nf[0] == nf[1] && !memcmp(bo[0], bo[1], sizeof bo[0]) && !memcmp(bl[0], bl[1], sizeof bl[0]) &&
                      !memcmp(sc[0], sc[1], sizeof sc[0]), "kept cache: two beam searches differ");
    }
    memset(&h, 0, sizeof h);
    h.inner = &b[1];
    o.on_token = cu_nest_hook;
    o.on_token_user = &h;
    CHECK_OK(tfm_model_generate(&a[1], NULL, 0, prompt, 3, &o, got, &n_got));
    CHECK_MSG(h.calls > 2 && h.r == TFM_OK, "kept cache: the nested call ran %d, returned %d (%s)", h.calls, (int)h.r,
              tfm_last_error());
    cu_check_ids("kept cache: the outer call", got, n_got, want, n_want);
    cu_check_ids("kept cache: the call from its on_token", h.ids, h.n, want2, n_want2);
    CHECK_MSG(!tfm__cu.kv_busy, "kept cache: the space is still busy after both calls");
    memset(&h, 0, sizeof h); /* a release from the callback */
    CHECK_OK(tfm_model_generate(&a[1], NULL, 0, prompt, 3, &o, got, &n_got));
    CHECK_MSG(h.calls > 2, "kept cache: the callback ran %d times", h.calls);
    cu_check_ids("kept cache: a release from the callback", got, n_got, want, n_want);
    CHECK_MSG(!tfm__cu.kv_busy && tfm__cu.kv, "kept cache: after a release from the callback the space is %p, busy %d",
              tfm__cu.kv, tfm__cu.kv_busy);
    { /* the same in bf16 (the weights rounded once a call): the ids of a call without the release */
        tfm_config c;
        tfm_model mb;
        int32_t ids[2][9];
        int n[2];
        cu_gen_cfg(&c, 0, 3, TFM_DEVICE_CUDA);
        c.precision = TFM_PREC_BF16;
        if (cu_init(&mb, &c, "kept cache, bf16")) {
            tfm_model_train(&mb, 0);
            for (k = 0; k < 2; k++) {
                memset(&h, 0, sizeof h);
                o.on_token = k ? cu_nest_hook : NULL;
                CHECK_OK(tfm_model_generate(&mb, NULL, 0, prompt, 3, &o, ids[k], &n[k]));
            }
            CHECK_MSG(h.calls > 2, "kept cache, bf16: the callback ran %d times", h.calls);
            cu_check_ids("kept cache, bf16: a release from the callback", ids[1], n[1], ids[0], n[0]);
            tfm_model_free(&mb);
        }
    }
    CU_DEVS tfm_model_free(&a[dv]);
    CU_DEVS tfm_model_free(&b[dv]);
}

static void cu_gen_graphs(void) {
    int which;
    for (which = 0; which < 5; which++) {
        tfm_model m[2];
        tfm_gen_opts o;
        int32_t src[6] = {4, 9, 1, 12, 3, 7}, prompt[3] = {2, 7, 5}, want[9], got[9], bwant[2 * 9], bgot[2 * 9];
        int encdec = which == 1, n_prompt = encdec ? 1 : 3, n_want, n_got, on, k, lw[2], lg[2], fw, fg;
        float sw[2], sg[2];
        const char *kind = encdec ? "encdec" : which == 3 ? "lm gqa" : which == 4 ? "lm rope window" : which ? "lm rope" : "lm";
        if (!cu_gen_pair(m, which, 3)) return;
        CU_DEVS tfm_model_train(&m[dv], 0);
        memset(&o, 0, sizeof o);
        o.max_new = encdec ? 8 : 9;
        CHECK_OK(tfm_model_generate(&m[0], encdec ? src : NULL, 6, prompt, n_prompt, &o, want, &n_want));
        o.beam_width = 3;
        CHECK_OK(tfm_model_beam_search(&m[0], encdec ? src : NULL, 6, prompt, n_prompt, &o, 2, bwant, 9, lw, sw, &fw));
        for (on = 0; on < 2; on++) {
#ifdef TFM_CUDA_EMULATION
            unsigned long long g0 = tfm_emu_graph_launches(), launched;
#endif
            unsigned long long r0 = tfm__cu.replays;
            CHECK_OK(tfm_cuda_set_graphs(on));
            o.beam_width = 0;
            CHECK_OK(tfm_model_generate(&m[1], encdec ? src : NULL, 6, prompt, n_prompt, &o, got, &n_got));
            cu_check_ids(cu_fmt("%s, graphs %s: tfm_model_generate", kind, on ? "on" : "off"), got, n_got, want, n_want);
#ifdef TFM_CUDA_EMULATION
            launched = tfm_emu_graph_launches() - g0;
            CHECK_MSG(launched == (unsigned long long)(on ? n_got - 1 : 0), "%s, graphs %s: %llu graph launches for %d steps",
                      kind, on ? "on" : "off", launched, n_got - 1);
#endif
            CHECK_MSG((long long)(tfm__cu.replays - r0) >= (on ? n_got - 2 : 0),
                      "%s, graphs %s: %llu of %d steps replayed", kind, on ? "on" : "off", tfm__cu.replays - r0, n_got - 1);
            r0 = tfm__cu.replays;
            o.beam_width = 3;
            CHECK_OK(tfm_model_beam_search(&m[1], encdec ? src : NULL, 6, prompt, n_prompt, &o, 2, bgot, 9, lg, sg, &fg));
            CHECK_MSG(fg == fw, "%s, graphs %s: beam search found %d, the CPU %d", kind, on ? "on" : "off", fg, fw);
            CHECK_MSG((long long)(tfm__cu.replays - r0) >= (on ? lg[0] - n_prompt - 2 : 0),
                      "%s, graphs %s: beam search replayed %llu steps for %d ids", kind, on ? "on" : "off",
                      tfm__cu.replays - r0, lg[0] - n_prompt);
            for (k = 0; k < fw && k < 2; k++) {
                cu_check_ids(cu_fmt("%s, graphs %s: beam hypothesis %d", kind, on ? "on" : "off", k), bgot + 9 * k, lg[k],
                             bwant + 9 * k, lw[k]);
                cu_check_scalar(cu_fmt("%s, graphs %s: beam score %d", kind, on ? "on" : "off", k), sg[k], sw[k], 1e-4, 1.0);
            }
        }
#ifdef TFM_CUDA_EMULATION
        {
            /* f < 5, every step captured: the third step's capture fails at each place in turn, or its
               graph launch, or its work space must grow; f >= 5, with replays: the third step's dry run
               fails, or its replay, or its work space must grow */
            static const char *const apis[3][2] = {{"cudaStreamEndCapture", NULL},
                                                   {"cudaGraphExecUpdate", NULL},
                                                   {"cudaGraphExecUpdate", "cudaGraphInstantiate"}};
            static const int codes[3] = {cudaErrorStreamCaptureInvalidated, cudaErrorGraphExecUpdateFailure, cudaErrorInvalidValue};
            int f;
            o.beam_width = 0;
            for (f = 0; f < 8; f++) {
                unsigned long long g0, launched, expect;
                tfm_result r;
                cu_gen_hook_t hook = {0, f < 5, f == 4 || f == 7, f == 5, f == 6};
                CHECK_OK(tfm_cuda_set_graphs(1));
                tfm_emu_fail_clear();
                if (f < 4)
                    tfm_emu_fail_next(f < 3 ? apis[f][0] : "cudaGraphLaunch", f < 3 ? codes[f] : cudaErrorInvalidValue, 2);
                if (f == 2) tfm_emu_fail_next(apis[f][1], cudaErrorInvalidValue, 0);
                o.on_token = cu_gen_hook;
                o.on_token_user = &hook;
                g0 = tfm_emu_graph_launches();
                r = tfm_model_generate(&m[1], encdec ? src : NULL, 6, prompt, n_prompt, &o, got, &n_got);
                o.on_token = NULL;
                CHECK_MSG(tfm_emu_fail_pending() == 0, "%s: the failure %d armed was not reached", kind, f);
                tfm_emu_fail_clear();
                tfm_emu_reset();
                launched = tfm_emu_graph_launches() - g0;
                if (f == 3 || f == 6) { /* the launch's failure is the call's */
                    CHECK_MSG(r == TFM_E_CUDA && strstr(tfm_last_error(), "tfm_model_generate") &&
                                  strstr(tfm_last_error(), "cudaGraphLaunch"),
                              "%s: failure %d: a failing graph launch gave %d (%s)", kind, f, (int)r, tfm_last_error());
                    continue;
                }
                CHECK_MSG(r == TFM_OK, "%s: failure %d: %s", kind, f, tfm_last_error());
                cu_check_ids(cu_fmt("%s: capture failure %d", kind, f), got, n_got, want, n_want);
                /* the failed step and the 2 after it run launch by launch; not after a refused update (the
                   graph is made anew) or a failed dry run (the step is captured), and only the failed one when
                   its work space had to grow (the step run again grows it) */
                expect = (unsigned long long)(n_got - 1) - (f == 1 || f == 5 ? 0 : f == 4 || f == 7 ? 1 : 3);
                CHECK_MSG(launched == expect, "%s: capture failure %d: %llu graph launches, %llu expected", kind, f, launched, expect);
            }
            CHECK_OK(tfm_cuda_set_graphs(1));
        }
#endif
        CU_DEVS tfm_model_free(&m[dv]);
    }
    { /* a bf16 model (bf16 products in the steps): the same ids with graphs as without */
        tfm_config c;
        tfm_model m;
        tfm_gen_opts o;
        int32_t prompt[3] = {2, 7, 5}, ids[2][9];
        int n[2], on;
        cu_gen_cfg(&c, 2, 3, TFM_DEVICE_CUDA);
        c.precision = TFM_PREC_BF16;
        if (!cu_init(&m, &c, "bf16 generation")) return;
        tfm_model_train(&m, 0);
        memset(&o, 0, sizeof o);
        o.max_new = 9;
        for (on = 0; on < 2; on++) {
#ifdef TFM_CUDA_EMULATION
            unsigned long long g0 = tfm_emu_graph_launches();
#endif
            CHECK_OK(tfm_cuda_set_graphs(on));
            CHECK_OK(tfm_model_generate(&m, NULL, 0, prompt, 3, &o, ids[on], &n[on]));
#ifdef TFM_CUDA_EMULATION
            CHECK_MSG(tfm_emu_graph_launches() - g0 == (unsigned long long)(on ? n[on] - 1 : 0),
                      "bf16, graphs %d: %llu graph launches for %d steps", on, tfm_emu_graph_launches() - g0, n[on] - 1);
#endif
        }
        cu_check_ids("bf16 lm rope: graphs on against off", ids[1], n[1], ids[0], n[0]);
        tfm_model_free(&m);
        CHECK_OK(tfm_cuda_set_graphs(1));
    }
}

#ifdef TFM_CUDA_EMULATION
/* Decoding steps queue as many GPU operations (kernels, copies) for 32 rows as for 2: nothing in them
   runs once per row, such as the cache's store (one launch a layer for every row). Counted by the
   emulation: the operations of 5 greedy steps less those of 2, the same prompt on every row and no stop
   token, so that the prompt and the first steps cancel out. */
static void cu_gen_step_ops(void) {
    static const int batches[2] = {2, 32};
    unsigned long long steps3[2];
    int32_t prompt[2] = {3, 5}, out[32 * 5];
    const int32_t *pp[32];
    int n_prompts[32], n_out[32], i, k;
    tfm_config c;
    tfm_model m;
    tfm_gen_opts o;
    cu_gen_cfg(&c, 0, 32, TFM_DEVICE_CUDA);
    if (!cu_init(&m, &c, "generation")) return;
    tfm_model_train(&m, 0);
    for (i = 0; i < 32; i++) pp[i] = prompt, n_prompts[i] = 2;
    memset(&o, 0, sizeof o);
    for (k = 0; k < 2; k++) {
        unsigned long long ops[2];
        for (i = 0; i < 2; i++) {
            unsigned long long n0 = tfm_emu_launches() + tfm_emu_copies();
            o.max_new = i ? 5 : 2;
            CHECK_OK(tfm_model_generate_batch(&m, batches[k], NULL, NULL, pp, n_prompts, &o, out, 5, n_out));
            ops[i] = tfm_emu_launches() + tfm_emu_copies() - n0;
        }
        steps3[k] = ops[1] - ops[0];
        if (test__verbose) printf("    batch %d: %llu GPU operations in 3 decoding steps\n", batches[k], steps3[k]);
    }
    CHECK_MSG(steps3[0] == steps3[1], "3 decoding steps queue %llu GPU operations for %d rows, %llu for %d", steps3[1],
              batches[1], steps3[0], batches[0]);
    tfm_model_free(&m);
}
#endif

/* ==== 6. checkpoints and moves between devices ========================================================= */

static char cu_dir[256]; /* this process's scratch directory under build/ */

static const char *cu_path(const char *name) {
    static char bufs[4][512];
    static int next;
    char *b = bufs[next++ & 3];
    if (!cu_dir[0]) {
        snprintf(cu_dir, sizeof cu_dir, "build/test_cuda.%ld", (long)getpid());
        if ((mkdir("build", 0777) != 0 && errno != EEXIST) || (mkdir(cu_dir, 0700) != 0 && errno != EEXIST))
            snprintf(cu_dir, sizeof cu_dir, ".");
    }
    snprintf(b, sizeof bufs[0], "%s/test_cuda_%s", cu_dir, name);
    return b;
}

static void cu_cleanup_files(void) {
    static const char *const names[3] = {"gpu.safetensors", "cpu.safetensors", "dist.safetensors"};
    int i;
    if (!cu_dir[0]) return;
    for (i = 0; i < 3; i++) remove(cu_path(names[i]));
    if (strcmp(cu_dir, ".")) rmdir(cu_dir);
    cu_dir[0] = 0;
}

/* A GPU model trained 3 steps and saved with its training state, loaded into a CPU model and into a GPU
   model: the same state bit for bit; 5 more steps on all three agree. */
static void cu_io_gpu_checkpoint(void) {
    tfm_config cg = cu_model_cfg(2, TFM_DEVICE_CUDA), cc = cu_model_cfg(2, TFM_DEVICE_CPU);
    tfm_model g, c2, g2;
    tfm_optim o = cu_optim();
    float l[3][10];
    const char *path = cu_path("gpu.safetensors");
    cc.seed = cg.seed = 99; /* other initial values than the models that load: the load replaces them */
    if (!cu_init(&g, &cg, "checkpoint")) return;
    cg.seed = cc.seed = 1;
    if (cu_train(&g, &o, 0, 3, NULL, NULL) && cu_init(&c2, &cc, "checkpoint")) {
        if (cu_init(&g2, &cg, "checkpoint")) {
            CHECK_OK(tfm_model_save(&g, path, TFM_SAVE_TRAINING_STATE, NULL, 0));
            CHECK_OK(tfm_model_load(&c2, path));
            CHECK_OK(tfm_model_load(&g2, path));
            cu_check_state("GPU checkpoint loaded on the CPU", &c2, &g, 0);
            cu_check_state("GPU checkpoint loaded on the GPU", &g2, &g, 0);
            if (cu_train(&g, &o, 3, 5, l[0], NULL) && cu_train(&c2, &o, 3, 5, l[1], NULL) && cu_train(&g2, &o, 3, 5, l[2], NULL)) {
                cu_check_losses("resumed from a GPU checkpoint on the GPU", l[2], l[0], 10);
                cu_check_losses("resumed from a GPU checkpoint on the CPU", l[0], l[1], 10);
            }
            tfm_model_free(&g2);
        }
        tfm_model_free(&c2);
    }
    tfm_model_free(&g);
}

/* A CPU checkpoint loaded on the GPU: the same state; training goes on alike. */
/* tfm_model_load_mapped on a GPU model: a CPU model's file under its own names through a map that keeps
   the head (the file's head skipped): every mapped parameter arrives, and the kept head still has the GPU
   model's values. tfm_model_save_mapped of the GPU model writes the device's values. */
static void cu_io_mapped(void) {
    tfm_config cc = cu_model_cfg(5, TFM_DEVICE_CPU), cg = cu_model_cfg(5, TFM_DEVICE_CUDA);
    tfm_model c, g;
    tfm_name_map *map;
    const char *path = cu_path("mapped.safetensors");
    int i, n = 0;
    int64_t nc, ng;
    float *pc, *pg, *before;
    if (!cu_init(&c, &cc, "mapped")) return;
    cg.seed = 77;
    if (!cu_init(&g, &cg, "mapped")) {
        tfm_model_free(&c);
        return;
    }
    map = (tfm_name_map *)calloc((size_t)c.n_params + 2, sizeof *map);
    for (i = 0; i < c.n_params; i++) {
        const char *nm = c.params[i].name;
        map[n].file = strncmp(nm, "head.", 5) ? nm : NULL;
        map[n++].model = nm;
    }
    CHECK_OK(tfm_model_save(&c, path, 0, NULL, 0));
    {
        tfm_optim o = cu_optim(); /* a step on the GPU first: its head then differs from the host's staging copy */
        cu_train(&g, &o, 0, 1, NULL, NULL);
    }
    before = cu_model_flat(&g, 0, &ng);
    {
        const char *skip[2] = {"head.weight", "head.bias"}; /* in the file, not read */
        CHECK_OK(tfm_model_load_mapped(&g, path, map, n, skip, 2));
    }
    pc = cu_model_flat(&c, 0, &nc);
    pg = cu_model_flat(&g, 0, &ng);
    CHECK(nc == ng);
    for (i = 0; i < c.n_params; i++) {
        const tfm_param *p = &c.params[i];
        int head = !strncmp(p->name, "head.", 5);
        const float *want = (head ? before : pc) + p->offset;
        CHECK_MSG(!memcmp(pg + p->offset, want, (size_t)tfm_numel(&p->value) * sizeof(float)), "mapped load on the GPU: %s is "
                  "not %s", p->name, head ? "the GPU model's own" : "the file's");
    }
    free(pc);
    free(pg);
    /* tfm_model_save_mapped of a GPU model (after a step there): the device's values, not stale host copies */
    {
        tfm_optim o = cu_optim();
        cu_train(&g, &o, 1, 1, NULL, NULL);
        for (i = 0; i < n; i++) map[i].file = map[i].model;
        CHECK_OK(tfm_model_save_mapped(&g, path, map, n, NULL, 0));
        CHECK_OK(tfm_model_load_mapped(&c, path, map, n, NULL, 0));
        pc = cu_model_flat(&c, 0, &nc);
        pg = cu_model_flat(&g, 0, &ng);
        CHECK_MSG(pc && pg && nc == ng && !memcmp(pc, pg, (size_t)nc * sizeof(float)), "a GPU model saved through a map "
                  "is not the model");
        free(pc);
        free(pg);
    }
    free(before);
    free(map);
    tfm_model_free(&g);
    tfm_model_free(&c);
}

static void cu_io_cpu_checkpoint(void) {
    tfm_config cc = cu_model_cfg(3, TFM_DEVICE_CPU), cg = cu_model_cfg(3, TFM_DEVICE_CUDA);
    tfm_model c, g;
    tfm_optim o = cu_optim();
    float l[2][10];
    const char *path = cu_path("cpu.safetensors");
    if (!cu_init(&c, &cc, "checkpoint")) return;
    cg.seed = 3;
    if (cu_train(&c, &o, 0, 3, NULL, NULL) && cu_init(&g, &cg, "checkpoint")) {
        CHECK_OK(tfm_model_save(&c, path, TFM_SAVE_TRAINING_STATE, NULL, 0));
        CHECK_OK(tfm_model_load(&g, path));
        cu_check_state("CPU checkpoint loaded on the GPU", &g, &c, 0);
        if (cu_train(&c, &o, 3, 5, l[0], NULL) && cu_train(&g, &o, 3, 5, l[1], NULL))
            cu_check_losses("resumed from a CPU checkpoint on the GPU", l[1], l[0], 10);
        tfm_model_free(&g);
    }
    tfm_model_free(&c);
}

/* tfm_model_to_device there and back: the whole state bit for bit each way (gradients too, and the
   training mode); back on the CPU the model trains exactly as its twin that never moved; trained on the GPU
   meanwhile, it stays close to the twin trained on the CPU. */
static void cu_io_to_device(void) {
    int which;
    for (which = 0; which < CU_N_MODELS; which += 2) {
        tfm_config cc = cu_model_cfg(which, TFM_DEVICE_CPU);
        tfm_model m, twin;
        tfm_optim o = cu_optim();
        float l[2][6];
        cu_data *d = (cu_data *)malloc(sizeof(cu_data));
        const char *nm = cu_model_names[which];
        if (!cu_init(&m, &cc, nm)) {
            free(d);
            return;
        }
        if (!cu_init(&twin, &cc, nm)) {
            tfm_model_free(&m);
            free(d);
            return;
        }
        if (cu_train(&m, &o, 0, 3, NULL, NULL) && cu_train(&twin, &o, 0, 3, NULL, NULL)) {
            /* gradients of one more batch, not yet applied, and evaluation mode: all of it moves */
            cu_batch(d, &cc, 1000);
            CU_DEVS {
                tfm_model *p = dv ? &twin : &m;
                tfm_model_zero_grad(p);
                CHECK_OK(tfm_model_forward(p, &d->b, NULL, NULL));
                CHECK_OK(tfm_model_backward(p, 1.0f));
                tfm_model_train(p, 0);
            }
            CHECK_OK(tfm_model_to_device(&m, TFM_DEVICE_CUDA));
            CHECK(m.params[0].value.device == TFM_DEVICE_CUDA && tfm_model_param(&m, m.params[1].name)->value.device == TFM_DEVICE_CUDA);
            cu_check_state(cu_fmt("%s moved to the GPU", nm), &m, &twin, 1);
            CHECK_OK(tfm_model_to_device(&m, TFM_DEVICE_CUDA)); /* already there: nothing changes */
            CHECK_OK(tfm_model_to_device(&m, TFM_DEVICE_CPU));
            CHECK(m.params[0].value.device == TFM_DEVICE_CPU);
            cu_check_state(cu_fmt("%s moved to the GPU and back", nm), &m, &twin, 1);
            tfm_model_train(&m, 1);
            tfm_model_train(&twin, 1);
            CHECK_OK(tfm_model_step(&m, &o, NULL));
            CHECK_OK(tfm_model_step(&twin, &o, NULL));
            if (cu_train(&m, &o, 4, 3, l[0], NULL) && cu_train(&twin, &o, 4, 3, l[1], NULL)) {
                cu_check_bits_arrays(cu_fmt("%s: losses after the round trip", nm), l[0], l[1], 6);
                cu_check_state(cu_fmt("%s: trained after the round trip", nm), &m, &twin, 0);
            }
            /* on the GPU for 3 steps, against the twin on the CPU */
            CHECK_OK(tfm_model_to_device(&m, TFM_DEVICE_CUDA));
            if (cu_train(&m, &o, 7, 3, l[0], NULL) && cu_train(&twin, &o, 7, 3, l[1], NULL))
                cu_check_losses(cu_fmt("%s: trained on the GPU after the move", nm), l[0], l[1], 6);
        }
        tfm_model_free(&m);
        tfm_model_free(&twin);
        free(d);
    }
}

/* The data-parallel calls with a GPU model in a group of one: tfm_dist_step on both devices alike,
   the model checksum, broadcast, and dist save/load. */
static void cu_dist(void) {
    tfm_dist dd;
    tfm_model m[2], g2;
    tfm_optim o = cu_optim();
    cu_data *d = (cu_data *)malloc(sizeof(cu_data));
    float loss[2][3], norm[2];
    uint64_t sum = 0;
    int s;
    tfm_config c[2];
    CU_DEVS c[dv] = cu_model_cfg(0, CU_DEV);
    CHECK_OK(tfm_dist_init(&dd, NULL, 0));
    if (!cu_init(&m[0], &c[0], "dist")) goto out;
    if (!cu_init(&m[1], &c[1], "dist")) {
        tfm_model_free(&m[0]);
        goto out;
    }
    for (s = 0; s < 3; s++) {
        cu_batch(d, &c[0], (uint64_t)(300 + s));
        CU_DEVS {
            tfm_model_zero_grad(&m[dv]);
            CHECK_OK(tfm_model_forward(&m[dv], &d->b, &loss[dv][s], NULL));
            CHECK_OK(tfm_model_backward(&m[dv], 1.0f));
            CHECK_OK(tfm_dist_step(&dd, &m[dv], &o, &norm[dv]));
        }
        cu_check_scalar(cu_fmt("tfm_dist_step %d: gradient norm", s), norm[1], norm[0], CU_TOL_LAYER, 1e-6);
    }
    cu_check_losses("tfm_dist_step", loss[1], loss[0], 3);
    CHECK_OK(tfm_dist_allreduce_grads(&dd, &m[1]));
    CHECK_OK(tfm_dist_broadcast_model(&dd, &m[1]));
    CHECK_OK(tfm_dist_check_model(&dd, &m[1], &sum));
    CHECK_OK(tfm_dist_save(&dd, &m[1], cu_path("dist.safetensors"), TFM_SAVE_TRAINING_STATE, NULL, 0));
    if (cu_init(&g2, &c[1], "dist")) {
        CHECK_OK(tfm_dist_load(&dd, &g2, cu_path("dist.safetensors")));
        cu_check_state("tfm_dist_load on the GPU", &g2, &m[1], 0);
        tfm_model_free(&g2);
    }
    CU_DEVS tfm_model_free(&m[dv]);
out:
    tfm_dist_free(&dd);
    free(d);
}

/* ==== 7. errors ======================================================================================== */

/* Tensors of one call on two devices are refused (TFM_E_ARG naming the call), and nothing is written. */
static void cu_err_mixed(void) {
    cu_rng g = {61};
    cu_buf a = cu_normal(12, &g, 1, 0), b = cu_normal(12, &g, 1, 0), y = cu_zeros(12), w = cu_normal(12, &g, 1, 0);
    cu_buf lse = cu_zeros(3), gr = cu_zeros(12), mm = cu_zeros(12), vv = cu_zeros(12);
    int32_t t[3] = {0, 1, 2};
    float loss = 0.0f;
    tfm_tensor ah = cu_t(&a, 0, 12, 0, 0), ad = cu_t(&a, 1, 12, 0, 0), bd = cu_t(&b, 1, 12, 0, 0), yh = cu_t(&y, 0, 12, 0, 0);
    tfm_tensor yd = cu_t(&y, 1, 12, 0, 0), x34 = cu_t(&a, 1, 3, 4, 0), w34h = cu_t(&w, 0, 3, 4, 0), y33 = cu_t(&y, 1, 3, 3, 0);
    tfm_tensor lseh = cu_t(&lse, 0, 3, 0, 0), q = cu_t(&a, 1, 1, 3, 4), kh = cu_t(&b, 0, 1, 3, 4), vd = cu_t(&b, 1, 1, 3, 4);
    tfm_tensor od = cu_t(&y, 1, 1, 3, 4), ld = cu_t(&lse, 1, 1, 1, 3), w4h = cu_t(&w, 0, 4, 0, 0);
    tfm_adamw_param p;
    tfm_optim o;
    CHECK_ERR(tfm_add_forward(&yh, &ad, &bd), TFM_E_ARG, "tfm_add_forward");
    CHECK_ERR(tfm_add_forward(&yd, &ah, &bd), TFM_E_ARG, "tfm_add_forward");
    CHECK_ERR(tfm_softmax_forward(&yh, &ad), TFM_E_ARG, "tfm_softmax_forward");
    CHECK_ERR(tfm_linear_forward(&y33, &x34, &w34h, NULL), TFM_E_ARG, "tfm_linear_forward");
    CHECK_ERR(tfm_matmul_forward(&y33, &x34, &w34h, 0, 1), TFM_E_ARG, "tfm_matmul_forward");
    CHECK_ERR(tfm_cross_entropy_forward(&loss, &lseh, &x34, t, -100, 0.0f), TFM_E_ARG, "tfm_cross_entropy_forward");
    CHECK_ERR(tfm_layernorm_forward(&x34, NULL, NULL, &x34, &w4h, NULL, 1e-5f), TFM_E_ARG, "tfm_layernorm_forward");
    CHECK_ERR(tfm_attention_forward(&od, &ld, &q, &kh, &vd, 1, NULL), TFM_E_ARG, "tfm_attention_forward");
    memset(&p, 0, sizeof p);
    p.value = ad;
    p.grad = cu_t(&gr, 0, 12, 0, 0);
    p.m = cu_t(&mm, 1, 12, 0, 0);
    p.v = cu_t(&vv, 1, 12, 0, 0);
    memset(&o, 0, sizeof o);
    o.lr = 0.1f;
    CHECK_ERR(tfm_adamw_step(&p, 1, &o, 1, NULL), TFM_E_ARG, "tfm_adamw_step");
    cu_check_bits("mixed devices: y unchanged", &y);
    cu_check_bits("mixed devices: a unchanged", &a);
    {
        /* a layer on a CUDA tfm_mem refuses host tensors */
        tfm_mem mem;
        tfm_linear l;
        float xh[8] = {0}, yh2[6] = {0};
        tfm_tensor tx = tfm_tensor2(xh, 2, 4), ty = tfm_tensor2(yh2, 2, 3);
        memset(&mem, 0, sizeof mem);
        mem.device = TFM_DEVICE_CUDA;
        CHECK_OK(tfm_linear_init(&l, 4, 3, 0, &mem));
        CHECK_OK(tfm_mem_alloc(&mem));
        tfm_mem_rewind(&mem);
        CHECK_OK(tfm_linear_init(&l, 4, 3, 0, &mem));
        CHECK(l.weight.device == TFM_DEVICE_CUDA);
        CHECK_ERR(tfm_linear_layer_forward(&l, &ty, &tx), TFM_E_ARG, "tfm_linear");
        tfm_mem_free(&mem);
    }
    cu_release(&a, &b, &y, &w, &lse, &gr, &mm, &vv, CU_END);
}

#ifdef TFM_CUDA_EMULATION

/* A machine without a GPU: every entry point says so (TFM_E_NO_CUDA), a CPU model is untouched by a
   refused move and trains on. */
static void cu_err_no_cuda(void) {
    tfm_config cg = cu_model_cfg(0, TFM_DEVICE_CUDA), cc = cu_model_cfg(0, TFM_DEVICE_CPU);
    tfm_model m;
    tfm_mem mem;
    tfm_linear l;
    void *p = NULL;
    char info[128];
    size_t before = tfm_emu_bytes_in_use();
    tfm_optim o = cu_optim();
    int ok = cu_init(&m, &cc, "no device");
    tfm_emu_set_device_count(0);
    CHECK_ERR(tfm_cuda_available(), TFM_E_NO_CUDA, "tfm_cuda_available");
    if (test__verbose) printf("    tfm_cuda_available: %s\n", tfm_last_error());
    CHECK_ERR(tfm_cuda_device_info(info, sizeof info), TFM_E_NO_CUDA, "CUDA");
    CHECK_ERR(tfm_cuda_malloc(&p, 1024), TFM_E_NO_CUDA, "tfm_cuda_malloc");
    CHECK(p == NULL);
    {
        tfm_model g;
        CHECK_ERR(tfm_model_init(&g, &cg, NULL, 0), TFM_E_NO_CUDA, "tfm_model_init");
        if (test__verbose) printf("    tfm_model_init: %s\n", tfm_last_error());
    }
    memset(&mem, 0, sizeof mem);
    mem.device = TFM_DEVICE_CUDA;
    CHECK_OK(tfm_linear_init(&l, 4, 3, 0, &mem));
    CHECK_ERR(tfm_mem_alloc(&mem), TFM_E_NO_CUDA, "CUDA");
    tfm_mem_free(&mem);
    if (ok) {
        int64_t n0, n1;
        float *before_move = cu_model_flat(&m, 0, &n0), *after;
        CHECK_ERR(tfm_model_to_device(&m, TFM_DEVICE_CUDA), TFM_E_NO_CUDA, "tfm_model_to_device");
        after = cu_model_flat(&m, 0, &n1);
        CHECK(m.params[0].value.device == TFM_DEVICE_CPU && n0 == n1);
        cu_check_bits_arrays("model after a refused move", after, before_move, n0);
        free(before_move);
        free(after);
        cu_train(&m, &o, 0, 1, NULL, NULL);
    }
    CHECK(tfm_emu_bytes_in_use() == before);
    tfm_emu_set_device_count(1);
    tfm_emu_reset();
    CHECK_OK(tfm_cuda_available());
    if (ok) tfm_model_free(&m);
}

/* The small staged arrays the GPU keeps are forgotten, so that the next call copies its own again (and an
   armed copy failure is reached). */
static void cu_unkeep(void) { memset(tfm__cu.kept_n, 0, sizeof tfm__cu.kept_n); }

/* Arm a failure of the (skip+1)-th next call of api (a runtime function, "launch" or a cuBLAS function). */
static void cu_arm(const char *api, int code, int skip) {
    cu_unkeep();
    /* a CUDA error no public call has reported yet would be blamed on the next one */
    CHECK_MSG(!tfm__cu.failed, "before arming %s: a CUDA failure of an earlier call is still pending, unreported: %s", api, tfm__cu.err);
    tfm__cu.failed = 0;
    tfm_emu_fail_clear();
    tfm_emu_reset();
    tfm_emu_fail_next(api, code, skip);
    tfm_clear_error();
}

/* The call that ran armed returned r: TFM_E_CUDA, with a message naming fn and holding CUDA's text. Then
   the fault and any sticky error are cleared (a real GPU would need a new process after a sticky one). */
static void cu_expect_cuda(const char *what, tfm_result r, const char *fn, const char *text) {
    int armed_left = !tfm_emu__g.faults.empty();
    tfm_emu_fail_clear();
    tfm_emu_reset();
    CHECK_MSG(!armed_left, "%s: the armed fault was never reached (the call made fewer such calls)", what);
    CHECK_MSG(r == TFM_E_CUDA, "%s: returned %d (%s), want TFM_E_CUDA; message: %s", what, (int)r, tfm_result_string(r), tfm_last_error());
    CHECK_MSG(strstr(tfm_last_error(), fn) != NULL, "%s: message \"%s\" does not name %s", what, tfm_last_error(), fn);
    CHECK_MSG(strstr(tfm_last_error(), text) != NULL, "%s: message \"%s\" lacks CUDA's text \"%s\"", what, tfm_last_error(), text);
    if (test__verbose) printf("    %s: %s\n", what, tfm_last_error());
}

/* Injected CUDA failures (a kernel launch, a copy, a cuBLAS product) inside public calls: TFM_E_CUDA naming
   the call, with CUDA's text; afterwards the same calls work and agree with the CPU again. */
static void cu_err_injected(void) {
    const char *launch = cudaGetErrorString(cudaErrorLaunchOutOfResources), *sticky = cudaGetErrorString(cudaErrorLaunchFailure);
    const char *inval = cudaGetErrorString(cudaErrorInvalidValue);
    const char *blas = cublasGetStatusString(CUBLAS_STATUS_EXECUTION_FAILED);
    cu_rng g = {71};
    int64_t N = 5, C = 33;
    int32_t t[5] = {1, 2, 3, 4, 5};
    float loss[2];
    cu_buf x = cu_normal(N * C, &g, 1, 0), y = cu_nan(N * C), lse = cu_nan(N), wq = cu_normal(C * C, &g, 1, 0);
    tfm_tensor xd = cu_t(&x, 1, N, C, 0), yd = cu_t(&y, 1, N, C, 0), ld = cu_t(&lse, 1, N, 0, 0), wd = cu_t(&wq, 1, C, C, 0);
    tfm_result r;
    /* ops */
    cu_arm("launch", cudaErrorLaunchOutOfResources, 0);
    r = tfm_softmax_forward(&yd, &xd);
    cu_expect_cuda("tfm_softmax_forward, launch failing", r, "tfm_softmax_forward", launch);
    CU_DEVS {
        tfm_tensor tx = cu_t(&x, dv, N, C, 0), ty = cu_t(&y, dv, N, C, 0);
        CHECK_OK(tfm_softmax_forward(&ty, &tx));
    }
    cu_check("tfm_softmax_forward after the failure", &y, CU_TOL);
    cu_arm("cudaMemcpy", cudaErrorInvalidValue, 0);
    r = tfm_cross_entropy_forward(&loss[1], &ld, &xd, t, -100, 0.0f);
    cu_expect_cuda("tfm_cross_entropy_forward, cudaMemcpy failing", r, "tfm_cross_entropy_forward", inval);
    CU_DEVS {
        tfm_tensor tx = cu_t(&x, dv, N, C, 0), tl = cu_t(&lse, dv, N, 0, 0);
        CHECK_OK(tfm_cross_entropy_forward(&loss[dv], &tl, &tx, t, -100, 0.0f));
    }
    cu_check_scalar("tfm_cross_entropy_forward after the failure", loss[1], loss[0], CU_TOL, 1e-30);
    cu_arm("cublasSgemm", CUBLAS_STATUS_EXECUTION_FAILED, 0);
    r = tfm_matmul_forward(&yd, &xd, &wd, 0, 0);
    cu_expect_cuda("tfm_matmul_forward, cublasSgemm failing", r, "tfm_matmul_forward", blas);
    cu_arm("cublasSgemm", CUBLAS_STATUS_EXECUTION_FAILED, 0);
    r = tfm_linear_forward(&yd, &xd, &wd, NULL);
    cu_expect_cuda("tfm_linear_forward, cublasSgemm failing", r, "tfm_linear_forward", blas);
    cu_arm("cudaMemcpyAsync", cudaErrorInvalidValue, 0);
    {
        tfm_attn_opts o;
        int32_t lens[1] = {3};
        tfm_tensor q = cu_t(&x, 1, 1, N, C), out = cu_t(&y, 1, 1, N, C), l = cu_t(&lse, 1, 1, 1, N);
        memset(&o, 0, sizeof o);
        o.key_lens = lens;
        r = tfm_attention_forward(&out, &l, &q, &q, &q, 1, &o);
        cu_expect_cuda("tfm_attention_forward, cudaMemcpyAsync failing", r, "tfm_attention_forward", inval);
    }
    cu_release(&x, &y, &lse, &wq, CU_END);
    /* a model: forward, backward, step, generation, saving */
    {
        tfm_config cc = cu_model_cfg(2, TFM_DEVICE_CPU), cg = cu_model_cfg(2, TFM_DEVICE_CUDA);
        tfm_model mc, mg;
        tfm_optim o = cu_optim();
        cu_data *d = (cu_data *)malloc(sizeof(cu_data));
        float l[2];
        int32_t prompt[2] = {1, 2}, out[4];
        int n_out = 0;
        if (cu_init(&mc, &cc, "injected") && cu_init(&mg, &cg, "injected")) {
            /* evaluation mode: no dropout, so the failed forwards (which drew their dropout seeds) leave the
               next forward's result as it would have been */
            tfm_model_train(&mc, 0);
            tfm_model_train(&mg, 0);
            cu_batch(d, &cg, 5);
            cu_arm("launch", cudaErrorLaunchFailure, 3); /* sticky: every later call fails too */
            r = tfm_model_forward(&mg, &d->b, &l[1], NULL);
            cu_expect_cuda("tfm_model_forward, a sticky launch failure", r, "tfm_model_forward", sticky);
            cu_arm("cudaMemcpy", cudaErrorInvalidValue, 0);
            r = tfm_model_forward(&mg, &d->b, &l[1], NULL);
            cu_expect_cuda("tfm_model_forward, cudaMemcpy failing", r, "tfm_model_forward", inval);
            cu_arm("cudaMemcpyAsync", cudaErrorInvalidValue, 0);
            r = tfm_model_forward(&mg, &d->b, &l[1], NULL);
            cu_expect_cuda("tfm_model_forward, cudaMemcpyAsync failing", r, "tfm_model_forward", inval);
            cu_arm("cublasSgemm", CUBLAS_STATUS_EXECUTION_FAILED, 0); /* (the head: no bias) */
            r = tfm_model_forward(&mg, &d->b, &l[1], NULL);
            cu_expect_cuda("tfm_model_forward, cublasSgemm failing", r, "tfm_model_forward", blas);
            cu_arm("cublasLtMatmul", CUBLAS_STATUS_EXECUTION_FAILED, 2); /* (a map with a bias) */
            r = tfm_model_forward(&mg, &d->b, &l[1], NULL);
            cu_expect_cuda("tfm_model_forward, cublasLtMatmul failing", r, "tfm_model_forward", blas);
            /* after the failures: the same losses as the CPU */
            CHECK_OK(tfm_model_forward(&mc, &d->b, &l[0], NULL));
            CHECK_OK(tfm_model_forward(&mg, &d->b, &l[1], NULL));
            cu_check_scalar("tfm_model_forward after the failures", l[1], l[0], CU_TOL_LAYER, 1.0);
            cu_arm("launch", cudaErrorLaunchOutOfResources, 4);
            r = tfm_model_backward(&mg, 1.0f);
            cu_expect_cuda("tfm_model_backward, launch failing", r, "tfm_model_backward", launch);
            CHECK_OK(tfm_model_backward(&mg, 1.0f));
            cu_arm("launch", cudaErrorLaunchOutOfResources, 1);
            r = tfm_model_step(&mg, &o, NULL);
            cu_expect_cuda("tfm_model_step, launch failing", r, "tfm_model_step", launch);
            {
                tfm_gen_opts go;
                memset(&go, 0, sizeof go);
                go.max_new = 4;
                cu_arm("launch", cudaErrorLaunchOutOfResources, 6);
                r = tfm_model_generate(&mg, NULL, 0, prompt, 2, &go, out, &n_out);
                cu_expect_cuda("tfm_model_generate, launch failing", r, "tfm_model_generate", launch);
            }
            cu_arm("cudaMemcpy", cudaErrorInvalidValue, 0);
            r = tfm_model_save(&mg, cu_path("gpu.safetensors"), TFM_SAVE_TRAINING_STATE, NULL, 0);
            cu_expect_cuda("tfm_model_save, cudaMemcpy failing", r, "tfm_model_save", inval);
            tfm_model_free(&mg);
        }
        if (mc.impl) tfm_model_free(&mc);
        free(d);
    }
    {
        void *p = NULL;
        cu_arm("cudaMalloc", cudaErrorMemoryAllocation, 0);
        CHECK_ERR(tfm_cuda_malloc(&p, 256), TFM_E_NOMEM, "tfm_cuda_malloc");
        tfm_emu_fail_clear();
        CHECK(p == NULL);
    }
}


/* ---- every public call against every CUDA call it makes, failing ----
   Each public call that runs on the device is made once cleanly (counting its kernel launches), then again
   with each runtime or cuBLAS function failing in turn: the first launch, the last launch, the first copy of
   each kind, the first product. A call that makes the failing CUDA call must return TFM_E_CUDA (TFM_E_NOMEM
   for a failed cudaMalloc) naming itself, and leave no error behind for the next call; a call that never
   makes it is left alone. */

#define SW_N 4   /* rows */
#define SW_C 32  /* columns (and the vocabulary of the embeddings) */

typedef struct cu_sweep {
    tfm_model m;
    tfm_dist dist;
    tfm_optim o;
    cu_data data;
    tfm_mem mem;
    tfm_block blk;
    tfm_kv_cache kc;
    cu_buf a, b, c, da, db, dc, g, gb, lse, mean, rstd, pm, pv;
    int32_t ids[SW_N], lens[1];
    tfm_rng rng;
} cu_sweep;

static const char *const cu_sweep_names[] = {
    "tfm_fill", "tfm_fill_normal", "tfm_fill_uniform", "tfm_tensor_copy", "tfm_matmul_forward", "tfm_matmul_backward",
    "tfm_linear_forward", "tfm_linear_backward", "tfm_softmax_forward", "tfm_softmax_backward", "tfm_log_softmax_forward",
    "tfm_log_softmax_backward", "tfm_cross_entropy_forward", "tfm_cross_entropy_backward", "tfm_layernorm_forward",
    "tfm_layernorm_backward", "tfm_gelu_forward", "tfm_gelu_backward", "tfm_relu_forward", "tfm_relu_backward",
    "tfm_dropout_forward", "tfm_dropout_backward", "tfm_embedding_forward", "tfm_embedding_backward",
    "tfm_pos_embedding_forward", "tfm_pos_embedding_backward", "tfm_sinusoidal_table", "tfm_sinusoidal_forward",
    "tfm_sinusoidal_backward", "tfm_add_forward", "tfm_add_backward", "tfm_mean_pool_forward", "tfm_mean_pool_backward",
    "tfm_cls_pool_forward", "tfm_cls_pool_backward", "tfm_attention_forward", "tfm_attention_backward", "tfm_adamw_step",
    "tfm_block_init_params", "tfm_block_forward", "tfm_block_backward", "tfm_model_forward", "tfm_model_backward",
    "tfm_model_step", "tfm_dist_step", "tfm_dist_allreduce_grads", "tfm_dist_broadcast_model", "tfm_dist_check_model",
    "tfm_model_generate", "tfm_model_generate_batch", "tfm_model_beam_search", "tfm_model_score", "tfm_kv_cache_init",
    "tfm_kv_cache_reorder", "tfm_model_save", "tfm_model_load", "tfm_dist_save", "tfm_dist_load", "tfm_model_to_device",
    "tfm_model_train_step", "tfm_cuda_synchronize"};
#define CU_SWEEP_CALLS ((int)(sizeof cu_sweep_names / sizeof cu_sweep_names[0]))

static tfm_result cu_sweep_call(cu_sweep *s, int i) {
    tfm_tensor A = cu_t(&s->a, 1, SW_N, SW_C, 0), B = cu_t(&s->b, 1, SW_C, SW_C, 0), C = cu_t(&s->c, 1, SW_N, SW_C, 0);
    tfm_tensor dA = cu_t(&s->da, 1, SW_N, SW_C, 0), dB = cu_t(&s->db, 1, SW_C, SW_C, 0), dC = cu_t(&s->dc, 1, SW_N, SW_C, 0);
    tfm_tensor A3 = cu_t(&s->a, 1, 1, SW_N, SW_C), C3 = cu_t(&s->c, 1, 1, SW_N, SW_C), dA3 = cu_t(&s->da, 1, 1, SW_N, SW_C);
    tfm_tensor dC3 = cu_t(&s->dc, 1, 1, SW_N, SW_C), G = cu_t(&s->g, 1, SW_C, 0, 0), Gb = cu_t(&s->gb, 1, SW_C, 0, 0);
    tfm_tensor G2 = cu_t(&s->g, 1, 1, SW_C, 0), Gb2 = cu_t(&s->gb, 1, 1, SW_C, 0), L = cu_t(&s->lse, 1, SW_N, 0, 0);
    tfm_tensor L3 = cu_t(&s->lse, 1, 1, 2, SW_N), Mn = cu_t(&s->mean, 1, SW_N, 0, 0);
    tfm_tensor Rs = cu_t(&s->rstd, 1, SW_N, 0, 0), Ah = cu_t(&s->a, 0, SW_N, SW_C, 0);
    tfm_attn_opts ao;
    tfm_adamw_param p;
    tfm_gen_opts go;
    int32_t prompt[2] = {1, 2}, out[12], from[2] = {1, 1};
    const int32_t *pp[2];
    int np[2] = {2, 1}, n_out[2], lens[2];
    float f = 0.0f, scores[2], logp[4];
    uint64_t sum = 0;
    memset(&ao, 0, sizeof ao);
    ao.causal = 1;
    ao.key_lens = s->lens;
    memset(&p, 0, sizeof p);
    p.value = B;
    p.grad = dB;
    p.m = cu_t(&s->pm, 1, SW_C, SW_C, 0);
    p.v = cu_t(&s->pv, 1, SW_C, SW_C, 0);
    memset(&go, 0, sizeof go);
    go.max_new = 3;
    go.beam_width = 2;
    pp[0] = prompt;
    pp[1] = prompt + 1;
    switch (i) {
    case 0: return tfm_fill(&C, 0.5f);
    case 1: return tfm_fill_normal(&C, &s->rng, 0.0f, 1.0f);
    case 2: return tfm_fill_uniform(&C, &s->rng, -1.0f, 1.0f);
    case 3: return tfm_tensor_copy(&C, &Ah);
    case 4: return tfm_matmul_forward(&C, &A, &B, 0, 1);
    case 5: return tfm_matmul_backward(&dA, &dB, &dC, &A, &B, 0, 1);
    case 6: return tfm_linear_forward(&C, &A, &B, &G);
    case 7: return tfm_linear_backward(&dA, &dB, &Gb, &dC, &A, &B);
    case 8: return tfm_softmax_forward(&C, &A);
    case 9: return tfm_softmax_backward(&dA, &dC, &C);
    case 10: return tfm_log_softmax_forward(&C, &A);
    case 11: return tfm_log_softmax_backward(&dA, &dC, &C);
    case 12: return tfm_cross_entropy_forward(&f, &L, &A, s->ids, -100, 0.1f);
    case 13: return tfm_cross_entropy_backward(&dA, 1.0f, &A, &L, s->ids, -100, 0.1f);
    case 14: return tfm_layernorm_forward(&C, &Mn, &Rs, &A, &G, &Gb, 1e-5f);
    case 15: return tfm_layernorm_backward(&dA, &G, &Gb, &dC, &A, &G, &Mn, &Rs);
    case 16: return tfm_gelu_forward(&C, &A, TFM_GELU_ERF);
    case 17: return tfm_gelu_backward(&dA, &dC, &A, TFM_GELU_TANH);
    case 18: return tfm_relu_forward(&C, &A);
    case 19: return tfm_relu_backward(&dA, &dC, &A);
    case 20: return tfm_dropout_forward(&C, &A, 0.1f, 3, 1);
    case 21: return tfm_dropout_backward(&dA, &dC, 0.1f, 3, 1);
    case 22: return tfm_embedding_forward(&C, s->ids, &B, 1.0f);
    case 23: return tfm_embedding_backward(&dB, &dC, s->ids, 1.0f);
    case 24: return tfm_pos_embedding_forward(&C3, &A3, &B);
    case 25: return tfm_pos_embedding_backward(&dA3, &dB, &dC3);
    case 26: return tfm_sinusoidal_table(&B);
    case 27: return tfm_sinusoidal_forward(&C3, &A3);
    case 28: return tfm_sinusoidal_backward(&dA3, &dC3);
    case 29: return tfm_add_forward(&C, &A, &dA);
    case 30: return tfm_add_backward(&dA, &C, &dC);
    case 31: return tfm_mean_pool_forward(&G2, &A3, s->lens);
    case 32: return tfm_mean_pool_backward(&dA3, &Gb2, s->lens);
    case 33: return tfm_cls_pool_forward(&G2, &A3);
    case 34: return tfm_cls_pool_backward(&dA3, &Gb2);
    case 35: return tfm_attention_forward(&C3, &L3, &A3, &A3, &A3, 2, &ao);
    case 36: return tfm_attention_backward(&dA3, NULL, NULL, &dC3, &A3, &A3, &A3, &C3, &L3, 2, &ao);
    case 37: return tfm_adamw_step(&p, 1, &s->o, 1, NULL);
    case 38: return tfm_block_init_params(&s->blk, &s->rng);
    case 39: return tfm_block_forward(&s->blk, &C3, &A3, NULL, &ao);
    case 40: return tfm_block_backward(&s->blk, &dA3, NULL, &dC3);
    case 41: { /* launch by launch (as case 59's step; the graph's own failures: cu_forward_graphs) */
        tfm_result r;
        (void)tfm_cuda_set_graphs(0);
        r = tfm_model_forward(&s->m, &s->data.b, &f, NULL);
        (void)tfm_cuda_set_graphs(1);
        return r;
    }
    case 42: return tfm_model_backward(&s->m, 1.0f);
    case 43: return tfm_model_step(&s->m, &s->o, NULL);
    case 44: return tfm_dist_step(&s->dist, &s->m, &s->o, NULL);
    case 45: return tfm_dist_allreduce_grads(&s->dist, &s->m);
    case 46: return tfm_dist_broadcast_model(&s->dist, &s->m);
    case 47: return tfm_dist_check_model(&s->dist, &s->m, &sum);
    case 48: return tfm_model_generate(&s->m, NULL, 0, prompt, 2, &go, out, n_out);
    case 49: return tfm_model_generate_batch(&s->m, 2, NULL, NULL, pp, np, &go, out, 4, n_out);
    case 50: return tfm_model_beam_search(&s->m, NULL, 0, prompt, 2, &go, 2, out, 4, lens, scores, NULL);
    case 51: return tfm_model_score(&s->m, NULL, 0, prompt, 1, prompt + 1, 1, logp, &f);
    case 52: {
        tfm_kv_cache kc;
        tfm_result r = tfm_kv_cache_init(&kc, &s->m, 2, 0);
        if (r == TFM_OK) tfm_kv_cache_free(&kc);
        return r;
    }
    case 53: return tfm_kv_cache_reorder(&s->kc, from, 2);
    case 54: return tfm_model_save(&s->m, cu_path("gpu.safetensors"), TFM_SAVE_TRAINING_STATE, NULL, 0);
    case 55: return tfm_model_load(&s->m, cu_path("gpu.safetensors"));
    case 56: return tfm_dist_save(&s->dist, &s->m, cu_path("dist.safetensors"), TFM_SAVE_TRAINING_STATE, NULL, 0);
    case 57: return tfm_dist_load(&s->dist, &s->m, cu_path("dist.safetensors"));
    case 58: { /* there and back: the model ends where it started */
        tfm_result r = tfm_model_to_device(&s->m, TFM_DEVICE_CPU);
        if (r == TFM_OK) r = tfm_model_to_device(&s->m, TFM_DEVICE_CUDA);
        return r;
    }
    case 59: { /* launch by launch: a CUDA call that fails inside a captured step makes it run again so
                  (cu_train_graphs), where the failure would not repeat */
        tfm_result r;
        (void)tfm_cuda_set_graphs(0);
        r = tfm_model_train_step(&s->m, &s->data.b, &s->o, &f, NULL, NULL);
        (void)tfm_cuda_set_graphs(1);
        return r;
    }
    default: return tfm_cuda_synchronize();
    }
}

/* The code a failing `api` returns in the sweep: out of memory for cudaMalloc, a cuBLAS execution failure,
   a launch that asks too much (not sticky), an invalid argument for the other runtime calls. */
static int cu_fail_code(const char *api) {
    if (!strcmp(api, "launch")) return (int)cudaErrorLaunchOutOfResources;
    if (!strncmp(api, "cublas", 6)) return (int)CUBLAS_STATUS_EXECUTION_FAILED;
    if (!strcmp(api, "cudaMalloc")) return (int)cudaErrorMemoryAllocation;
    return (int)cudaErrorInvalidValue;
}

static void cu_err_sweep(void) {
    static const char *const apis[] = {"cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemsetAsync", "cudaMalloc",
                                       "cudaMallocHost", "cudaDeviceSynchronize", "cublasLtMatmul", "cublasSgemm",
                                       "cublasSgemmStridedBatched"};
    cu_sweep *s = (cu_sweep *)calloc(1, sizeof(cu_sweep));
    tfm_config cg = cu_model_cfg(2, TFM_DEVICE_CUDA);
    tfm_block_desc bd;
    cu_rng g = {91};
    int i, k, defects = 0;
    memset(&bd, 0, sizeof bd);
    bd.d_model = SW_C;
    bd.n_heads = 2;
    bd.max_batch = 1;
    bd.max_len = SW_N;
    cg.max_len = 8;
    if (!cu_block_build(&s->blk, &s->mem, &bd, TFM_DEVICE_CUDA)) {
        free(s);
        return;
    }
    if (!cu_init(&s->m, &cg, "sweep")) {
        tfm_mem_free(&s->mem);
        free(s);
        return;
    }
    CHECK_OK(tfm_dist_init(&s->dist, NULL, 0));
    CHECK_OK(tfm_kv_cache_init(&s->kc, &s->m, 2, 0));
    s->o = cu_optim();
    s->o.schedule = TFM_SCHED_CONSTANT; /* as many steps as the sweep takes */
    cu_batch(&s->data, &cg, 1);
    s->a = cu_normal(SW_N * SW_C, &g, 1, 0);
    s->b = cu_normal(SW_C * SW_C, &g, 0.2, 0);
    s->c = cu_normal(SW_N * SW_C, &g, 1, 0);
    s->da = cu_zeros(SW_N * SW_C);
    s->db = cu_zeros(SW_C * SW_C);
    s->dc = cu_normal(SW_N * SW_C, &g, 1, 0);
    s->g = cu_normal(SW_C, &g, 1, 1);
    s->gb = cu_normal(SW_C, &g, 1, 0);
    s->lse = cu_zeros(2 * SW_N); /* (N) for the cross-entropy, (1,2,N) for the attention */
    s->mean = cu_zeros(SW_N);
    s->rstd = cu_zeros(SW_N);
    s->pm = cu_zeros(SW_C * SW_C);
    s->pv = cu_zeros(SW_C * SW_C);
    for (i = 0; i < SW_N; i++) s->ids[i] = i * 5 % SW_C;
    s->lens[0] = SW_N - 1;
    tfm_rng_seed(&s->rng, 4);
    for (i = 0; i < CU_SWEEP_CALLS; i++) {
        const char *fn = cu_sweep_names[i];
        unsigned long long n0 = tfm_emu_launches(), n;
        tfm_result r = cu_sweep_call(s, i);
        n = tfm_emu_launches() - n0;
        CHECK_MSG(r == TFM_OK, "sweep: %s failed without a fault: %s", fn, tfm_last_error());
        CHECK_MSG(!tfm__cu.failed, "sweep: %s left a CUDA error pending: %s", fn, tfm__cu.err);
        tfm__cu.failed = 0;
        for (k = -2; k < (int)(sizeof apis / sizeof apis[0]); k++) {
            const char *api = k < 0 ? "launch" : apis[k];
            int skip = k == -1 ? (int)n - 1 : 0, code = cu_fail_code(api);
            int reached, ok;
            if (k < 0 && (n == 0 || (k == -1 && n == 1))) continue;
            tfm_emu_fail_clear();
            tfm_emu_reset();
            cu_unkeep();
            tfm_emu_fail_next(api, code, skip);
            tfm_clear_error();
            r = cu_sweep_call(s, i);
            reached = tfm_emu__g.faults.empty();
            tfm_emu_fail_clear();
            tfm_emu_reset();
            if (!reached) {
                CHECK_MSG(r == TFM_OK, "sweep: %s failed with %s armed but not reached: %s", fn, api, tfm_last_error());
                continue;
            }
            /* the dist calls that run tfm_model_save/_load on rank 0 return its message */
            ok = (r == TFM_E_CUDA || (r == TFM_E_NOMEM && !strcmp(api, "cudaMalloc"))) &&
                 (strstr(tfm_last_error(), fn) != NULL ||
                  (!strcmp(fn, "tfm_dist_save") && strstr(tfm_last_error(), "tfm_model_save")) ||
                  (!strcmp(fn, "tfm_dist_load") && strstr(tfm_last_error(), "tfm_model_load")));
            if (!ok) defects++;
            CHECK_MSG(ok, "sweep: %s with %s failing (%s): returned %d (%s), message \"%s\"%s%s", fn, api,
                      k == -1 ? cu_fmt("the last of %llu launches", n) : k == -2 ? "the first launch" : "its first call", (int)r,
                      tfm_result_string(r), tfm_last_error(),
                      tfm__cu.failed ? "; the error was left pending: " : "", tfm__cu.failed ? tfm__cu.err : "");
            if (test__verbose && ok) printf("    %s, %s failing: %s\n", fn, api, tfm_last_error());
            tfm__cu.failed = 0;
        }
    }
    if (defects) printf("    sweep: %d (public call, failing CUDA call) pairs not reported as they should be\n", defects);
    tfm_kv_cache_free(&s->kc);
    tfm_dist_free(&s->dist);
    tfm_model_free(&s->m);
    tfm_mem_free(&s->mem);
    cu_release(&s->a, &s->b, &s->c, &s->da, &s->db, &s->dc, &s->g, &s->gb, &s->lse, &s->mean, &s->rstd, &s->pm, &s->pv, CU_END);
    free(s);
}

#endif /* TFM_CUDA_EMULATION */

/* Device memory too small: tfm_model_init is TFM_E_NOMEM and leaves nothing allocated on the device; a
   move of a CPU model the same, and the model stays usable on the CPU; layers' memories and caches too.
   The emulation shrinks its device; a GPU gets a config far larger than itself for init, and ballast
   (most of its free memory, held by the test) for the others. */
#ifndef TFM_CUDA_EMULATION
/* Device memory held until at most `leave` bytes stay free: one large block, then ever smaller ones (a
   GPU does not hand out all of its free memory in one block). The number of blocks put in b. */
static int cu_ballast(void **b, int max, size_t leave) {
    size_t fr = 0, tot = 0, chunk;
    int n = 0;
    cudaMemGetInfo(&fr, &tot);
    chunk = fr > ((size_t)1 << 30) ? fr - ((size_t)1 << 30) : fr / 2;
    while (n < max) {
        cudaMemGetInfo(&fr, &tot);
        if (fr <= leave) break;
        if (chunk > fr - leave) chunk = fr - leave;
        if (chunk < ((size_t)1 << 20)) break;
        if (tfm_cuda_malloc(&b[n], chunk) == TFM_OK) n++;
        else chunk /= 2;
    }
    return n;
}
#endif

static void cu_err_nomem(void) {
    tfm_config cc = cu_model_cfg(2, TFM_DEVICE_CPU), cg = cu_model_cfg(2, TFM_DEVICE_CUDA);
    tfm_model m, g;
    tfm_optim o = cu_optim();
    size_t need = 0, used0, used1;
#ifndef TFM_CUDA_EMULATION
    void *ballast[64];
    int n_ballast = 0, i;
#endif
    cc.max_batch = cg.max_batch = 512; /* about 25 MB: far more than what the GPU's ballast leaves free */
    CHECK_OK(tfm_model_memory_size(&cg, &need));
#ifdef TFM_CUDA_EMULATION
    used0 = tfm_emu_bytes_in_use();
    tfm_emu_set_device_memory(used0 + need / 2);
    CHECK_ERR(tfm_model_init(&g, &cg, NULL, 0), TFM_E_NOMEM, "tfm_model_init");
    used1 = tfm_emu_bytes_in_use();
    CHECK_MSG(used1 == used0, "a failed tfm_model_init left %lld bytes of device memory allocated", (long long)(used1 - used0));
#else
    {
        /* a config far larger than the device (2.4 TB, most of it parameters: 48 layers of d_model 16384): the
           device twin is asked for first, so nothing is allocated on the host either */
        tfm_config big = cg;
        size_t free0 = 0, free1 = 0, total = 0, bytes = 0;
        big.max_batch = 1;
        big.max_len = 8;
        big.d_model = 16384;
        big.n_heads = 16;
        big.n_layers = 48;
        big.d_ff = 0;
        CHECK_OK(tfm_model_memory_size(&big, &bytes));
        cudaMemGetInfo(&free0, &total);
        CHECK_MSG(bytes > 2 * total, "the big config needs %zu bytes, the device has %zu", bytes, total);
        CHECK_ERR(tfm_model_init(&g, &big, NULL, 0), TFM_E_NOMEM, "tfm_model_init");
        cudaMemGetInfo(&free1, &total);
        CHECK_MSG(free1 + ((size_t)4 << 20) >= free0, "a failed tfm_model_init left %lld bytes of device memory in use",
                  (long long)free0 - (long long)free1);
        /* ballast: all but a quarter of the model's need stays free */
        n_ballast = cu_ballast(ballast, 64, need / 4);
        cudaMemGetInfo(&free0, &total);
        if (free0 > need / 2) {
            printf("    (%zu bytes stay free after the ballast: the move and layer checks are skipped)\n", free0);
            for (i = 0; i < n_ballast; i++) tfm_cuda_free(ballast[i]);
            return;
        }
        used0 = total - free0;
    }
#endif
    if (cu_init(&m, &cc, "nomem")) {
        int64_t n0, n1;
        float *p0 = cu_model_flat(&m, 0, &n0), *p1;
        CHECK_ERR(tfm_model_to_device(&m, TFM_DEVICE_CUDA), TFM_E_NOMEM, "tfm_model_to_device");
        CHECK(m.params[0].value.device == TFM_DEVICE_CPU);
        p1 = cu_model_flat(&m, 0, &n1);
        cu_check_bits_arrays("a CPU model after a failed move", p1, p0, n0);
        free(p0);
        free(p1);
        cu_train(&m, &o, 0, 1, NULL, NULL); /* still usable */
        tfm_model_free(&m);
    }
    {
        /* a layer's device memory */
        tfm_mem mem;
        tfm_block blk;
        tfm_block_desc d;
        memset(&d, 0, sizeof d);
        d.d_model = 64;
        d.n_heads = 4;
        d.max_batch = 64;
        d.max_len = 512;
        memset(&mem, 0, sizeof mem);
        mem.device = TFM_DEVICE_CUDA;
        CHECK_OK(tfm_block_init(&blk, &d, &mem));
        CHECK_ERR(tfm_mem_alloc(&mem), TFM_E_NOMEM, "tfm_mem_alloc");
        tfm_mem_free(&mem);
    }
    {
        void *p = NULL;
        CHECK_ERR(tfm_cuda_malloc(&p, (size_t)1 << 50), TFM_E_NOMEM, "tfm_cuda_malloc");
        CHECK(p == NULL);
    }
#ifdef TFM_CUDA_EMULATION
    used1 = tfm_emu_bytes_in_use();
    tfm_emu_set_device_memory((size_t)16 << 30);
#else
    {
        size_t free1 = 0, total = 0;
        cudaMemGetInfo(&free1, &total);
        used1 = total - free1;
        for (i = 0; i < n_ballast; i++) tfm_cuda_free(ballast[i]);
    }
#endif
    CHECK_MSG(used1 <= used0 + ((size_t)4 << 20) && used1 + ((size_t)4 << 20) >= used0,
              "the failed allocations changed the device memory in use from %zu to %zu bytes", used0, used1);
}

/* ==== the device, TF32, synchronisation ================================================================ */

static void cu_device(void) {
    char info[256];
    cu_rng g = {81};
    int M = 64, N = 64, K = 1024;
    cu_buf A = cu_normal((int64_t)M * K, &g, 1, 0), B = cu_normal((int64_t)K * N, &g, 1, 0), Cm = cu_nan((int64_t)M * N);
    CHECK_OK(tfm_cuda_available());
    CHECK_OK(tfm_cuda_device_info(info, sizeof info));
    CHECK(strlen(info) > 0);
    CHECK_ERR(tfm_cuda_device_info(NULL, 10), TFM_E_ARG, "tfm_cuda_device_info");
    CHECK_OK(tfm_cuda_synchronize());
    /* TF32 on: the products round their inputs to 10-bit mantissas (about 1e-3 relative), off again: fp32 */
    CHECK_OK(tfm_cuda_set_tf32(1));
    CU_DEVS tfm__op_gemm_batched(CU_DEV, 0, 0, M, N, K, 1.0f, CU_P(A), K, 0, CU_P(B), N, 0, 0.0f, CU_P(Cm), N, 0, 1);
    cu_check("gemm with TF32 on", &Cm, 1e-2);
    CHECK_OK(tfm_cuda_set_tf32(0));
    CU_DEVS tfm__op_gemm_batched(CU_DEV, 0, 0, M, N, K, 1.0f, CU_P(A), K, 0, CU_P(B), N, 0, 0.0f, CU_P(Cm), N, 0, 1);
    cu_check("gemm with TF32 off", &Cm, CU_TOL);
    CHECK_OK(tfm_cuda_synchronize());
    cu_release(&A, &B, &Cm, CU_END);
}

/* ==== mixed precision: bf16 products (cfg.precision TFM_PREC_BF16) ===================================== */

/* x rounded to bf16 the long way, in double: 8 significant bits (ulp 2^(e-7) for 2^e <= |x| < 2^(e+1), the
   subnormal range's 2^-133 below 2^-126), rint's ties to even, overflow past the largest bf16 to infinity. */
static double cu_bf16_ref(float x) {
    double a = fabs((double)x), ulp, r;
    int e;
    if (isnan(x) || isinf(x) || a == 0.0) return x;
    (void)frexp(a, &e); /* a = f 2^e, f in [0.5, 1): the leading bit is 2^(e-1) */
    ulp = ldexp(1.0, e - 1 < -126 ? -133 : e - 8);
    r = rint(a / ulp) * ulp;
    if (r >= ldexp(2.0 - 1.0 / 256.0, 127) + ldexp(1.0, 119)) r = INFINITY; /* past the halfway point above the max */
    return x < 0 ? -r : r;
}
static float cu_bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* tfm__bf16 against cu_bf16_ref: ties both ways, the subnormals, the largest values, infinities, NaNs and
   random bit patterns. */
static void cu_bf16_round(void) {
    static const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x00008000u, 0x00018000u, 0x00007fffu,
                                    0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x7f7fffffu, 0x7f7f7fffu,
                                    0x7f7f8000u, 0xff7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                    0xffffffffu, 0x007fffffu, 0x00800000u, 0x3effffffu};
    cu_rng g = {2024};
    int i, bad = 0;
    for (i = 0; i < 200000 + CU_LEN(edge); i++) {
        uint32_t u = i < CU_LEN(edge) ? edge[i] : (uint32_t)cu_next(&g);
        float x, got;
        double want;
        memcpy(&x, &u, 4);
        got = cu_bf16_value(tfm__bf16(x));
        want = cu_bf16_ref(x);
        if (isnan(x) ? !isnan(got) : (double)got != want || signbit(got) != signbit(x)) {
            if (bad++ < 5) TEST__FAIL("tfm__bf16(%a = 0x%08x) is %a, want %a", (double)x, u, (double)got, want);
        }
    }
    CHECK_MSG(!bad, "%d of %d roundings to bf16 wrong", bad, 200000 + CU_LEN(edge));
}

/* One warp: D = A B + C through tfm__cu_mma16816, A 16 x 16, B 16 x 16 (two tiles of 8 columns), C and D 16 x 16,
   row-major in device memory. Columns 0-7 take A's and B's registers loaded by each lane by the layout the
   helpers document; columns 8-15 take them by ldmatrix (tfm__cu_ldsm) from shared memory at the flash
   tiles' padded stride of 24: A by tfm__cu_mma_a, B by tfm__cu_mma_b_cols (stored as it is). bad[lane] has
   a bit set for each helper whose registers differ from that lane's own loads: 1 tfm__cu_mma_a, 2
   tfm__cu_mma_b_cols, 4 tfm__cu_mma_b_rows (from B stored transposed: its columns as rows). */
static __global__ void cu_k_mma16816(const uint16_t *A, const uint16_t *B, const float *C, float *D, int *bad) {
    TFM__SHARED_DYN(uint16_t, sa);
    uint16_t *sb = sa + 16 * 24, *sbt = sb + 16 * 24;
    int lane = (int)threadIdx.x, g = lane >> 2, t = lane & 3, h, x;
    uint32_t a[4] = {0u, 0u, 0u, 0u}, b0[2] = {0u, 0u}, b1[2] = {0u, 0u}, la[4], l0[2], l1[2], m0[2], m1[2];
    float d0[4], d1[4];
    for (x = lane; x < 256; x += 32) {
        sa[x / 16 * 24 + x % 16] = A[x];
        sb[x / 16 * 24 + x % 16] = B[x];
        sbt[x % 16 * 24 + x / 16] = B[x];
    }
    __syncthreads();
    for (h = 0; h < 2; h++) {
        a[0] |= (uint32_t)A[g * 16 + 2 * t + h] << 16 * h;
        a[1] |= (uint32_t)A[(g + 8) * 16 + 2 * t + h] << 16 * h;
        a[2] |= (uint32_t)A[g * 16 + 2 * t + 8 + h] << 16 * h;
        a[3] |= (uint32_t)A[(g + 8) * 16 + 2 * t + 8 + h] << 16 * h;
        b0[0] |= (uint32_t)B[(2 * t + h) * 16 + g] << 16 * h;
        b0[1] |= (uint32_t)B[(2 * t + 8 + h) * 16 + g] << 16 * h;
        b1[0] |= (uint32_t)B[(2 * t + h) * 16 + 8 + g] << 16 * h;
        b1[1] |= (uint32_t)B[(2 * t + 8 + h) * 16 + 8 + g] << 16 * h;
    }
    tfm__cu_mma_a(la, sa, 24);
    tfm__cu_mma_b_cols(l0, l1, sb, 24);
    tfm__cu_mma_b_rows(m0, m1, sbt, 24);
    bad[lane] = (la[0] != a[0] || la[1] != a[1] || la[2] != a[2] || la[3] != a[3]) | 2 * (l0[0] != b0[0] || l0[1] != b0[1] || l1[0] != b1[0] || l1[1] != b1[1]) |
                4 * (m0[0] != b0[0] || m0[1] != b0[1] || m1[0] != b1[0] || m1[1] != b1[1]);
    for (h = 0; h < 2; h++) {
        d0[2 * h] = C[(g + 8 * h) * 16 + 2 * t], d0[2 * h + 1] = C[(g + 8 * h) * 16 + 2 * t + 1];
        d1[2 * h] = C[(g + 8 * h) * 16 + 8 + 2 * t], d1[2 * h + 1] = C[(g + 8 * h) * 16 + 8 + 2 * t + 1];
    }
    tfm__cu_mma16816(d0, a, b0);
    tfm__cu_mma16816(d1, la, l1);
    for (h = 0; h < 2; h++) {
        D[(g + 8 * h) * 16 + 2 * t] = d0[2 * h], D[(g + 8 * h) * 16 + 2 * t + 1] = d0[2 * h + 1];
        D[(g + 8 * h) * 16 + 8 + 2 * t] = d1[2 * h], D[(g + 8 * h) * 16 + 8 + 2 * t + 1] = d1[2 * h + 1];
    }
}

/* The register-level tensor-core product and the matrix load that the flash kernels run on, against the
   product on the host: small integers (exact in bf16, every sum exact in fp32, so any order of summing
   gives the same bits), each element distinct, so that an element in the wrong register or lane shows. On a
   GPU this checks the PTX ISA's layouts as the helpers read them; under the emulation, the emulation's. */
static void cu_mma16816(void) {
    uint16_t hA[256], hB[256], *dA = NULL, *dB = NULL;
    float hC[256], hD[256], *dC = NULL, *dD = NULL;
    int hbits[32], *dbits = NULL, i, j, k, bad = 0;
    if (!tfm__cu_flash_ok(16)) {
        printf("    (no bf16 tensor cores here: skipped)\n");
        return;
    }
    for (i = 0; i < 256; i++) {
        hA[i] = tfm__bf16((float)((i * 7) % 23 - 11));
        hB[i] = tfm__bf16((float)((i * 5) % 19 - 9));
        hC[i] = (float)(i * 3 - 300);
    }
    CHECK(cudaMalloc((void **)&dA, sizeof hA) == cudaSuccess && cudaMalloc((void **)&dB, sizeof hB) == cudaSuccess &&
          cudaMalloc((void **)&dC, sizeof hC) == cudaSuccess && cudaMalloc((void **)&dD, sizeof hD) == cudaSuccess &&
          cudaMalloc((void **)&dbits, sizeof hbits) == cudaSuccess);
    if (dA && dB && dC && dD && dbits) {
        CHECK(cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(dC, hC, sizeof hC, cudaMemcpyHostToDevice) == cudaSuccess);
        TFM__LAUNCH(cu_k_mma16816, 1, 32, 3 * 16 * 24 * sizeof(uint16_t), dA, dB, dC, dD, dbits);
        CHECK(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess);
        CHECK(cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost) == cudaSuccess &&
              cudaMemcpy(hbits, dbits, sizeof hbits, cudaMemcpyDeviceToHost) == cudaSuccess);
        for (i = 0; i < 16; i++)
            for (j = 0; j < 16; j++) {
                double want = hC[i * 16 + j];
                for (k = 0; k < 16; k++) want += (double)cu_bf16_value(hA[i * 16 + k]) * cu_bf16_value(hB[k * 16 + j]);
                if ((double)hD[i * 16 + j] != want && bad++ < 5)
                    TEST__FAIL("mma16816: D[%d][%d] = %g, want %g (%s)", i, j, (double)hD[i * 16 + j], want,
                               j < 8 ? "registers loaded by each lane" : "registers by ldmatrix");
            }
        CHECK_MSG(!bad, "%d of 256 elements of D wrong", bad);
        for (k = 0; k < 3; k++) {
            static const char *const helper[3] = {"tfm__cu_mma_a", "tfm__cu_mma_b_cols (.trans)", "tfm__cu_mma_b_rows"};
            for (i = 0, bad = 0; i < 32; i++) bad += (hbits[i] >> k) & 1;
            CHECK_MSG(!bad, "ldmatrix by %s gave %d lanes other registers than the layout", helper[k], bad);
        }
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD), cudaFree(dbits);
}

/* One warpgroup: D = A B + C through tfm__cu_wgmma64, A 64 x 16 (each lane's registers loaded by the layout
   tfm__cu_mma16816 documents, warp w's rows 16 w ..), B 16 x 64 in shared memory in the flash kernels'
   core-matrix tiles of 64 channels (tfm__cu_tile_at's cm): as keys (B's columns as the tile's rows, K-major:
   TRANS 0) for D0 and as values (B's rows as the tile's rows, N-major: TRANS 1) for D1, through the
   descriptors the kernels make (tfm__cu_wg_desc); D2 by tfm__cu_wgmma64_ss, A from such a tile too (its rows
   as the tile's rows: K-major), B as for D0; C and the Ds 64 x 64, row-major. on[0] says whether the build
   runs wgmma (TFM__CU_WG). */
static __global__ void cu_k_wgmma(const uint16_t *A, const uint16_t *B, const float *C, float *D0, float *D1, float *D2,
                                  int *on) {
    TFM__SHARED_DYN(unsigned char, raw);
    uint16_t *sk = (uint16_t *)(void *)tfm__cu_flash_base(raw), *sv = sk + 64 * 64, *sa = sv + 64 * 64;
    int tid = (int)threadIdx.x, lane = tid & 31, r = 16 * (tid >> 5) + (lane >> 2), t = lane & 3, x, h, n;
    uint32_t a[4] = {0u, 0u, 0u, 0u};
    float d0[8][4], d1[8][4], d2[8][4];
    if (tid == 0) on[0] = TFM__CU_WG;
    if (TFM__CU_WG) {
        for (x = tid; x < 16 * 64; x += 128) {
            int k = x / 64, c = x % 64;
            sk[tfm__cu_tile_at(c, k, 0, 64, 1)] = B[x];
            sv[tfm__cu_tile_at(k, c, 0, 64, 1)] = B[x];
            sa[tfm__cu_tile_at(c, k, 0, 64, 1)] = A[c * 16 + k]; /* A's row c, column k */
        }
        tfm__cu_wg_proxy();
        __syncthreads();
        for (h = 0; h < 2; h++) {
            a[0] |= (uint32_t)A[r * 16 + 2 * t + h] << 16 * h;
            a[1] |= (uint32_t)A[(r + 8) * 16 + 2 * t + h] << 16 * h;
            a[2] |= (uint32_t)A[r * 16 + 2 * t + 8 + h] << 16 * h;
            a[3] |= (uint32_t)A[(r + 8) * 16 + 2 * t + 8 + h] << 16 * h;
        }
        for (n = 0; n < 8; n++)
            for (h = 0; h < 4; h++) d0[n][h] = d1[n][h] = d2[n][h] = C[(r + 8 * (h >> 1)) * 64 + 8 * n + 2 * t + (h & 1)];
        tfm__cu_wg_fence();
        tfm__cu_wgmma64<0>(d0, a, tfm__cu_wg_desc(sk, 128u, 16u * 64));
        tfm__cu_wgmma64<1>(d1, a, tfm__cu_wg_desc(sv, 16u * 64, 128u));
        tfm__cu_wgmma64_ss<0>(d2, tfm__cu_wg_desc(sa, 128u, 16u * 64), tfm__cu_wg_desc(sk, 128u, 16u * 64));
        tfm__cu_wg_done(d0, 8);
        tfm__cu_wg_hold(d1, 8);
        tfm__cu_wg_hold(d2, 8);
        for (n = 0; n < 8; n++)
            for (h = 0; h < 4; h++) {
                int e = (r + 8 * (h >> 1)) * 64 + 8 * n + 2 * t + (h & 1);
                D0[e] = d0[n][h], D1[e] = d1[n][h], D2[e] = d2[n][h];
            }
    }
}

/* Hopper's warpgroup product as the flash forward runs it (built for sm_90a), against the product on the host:
   small integers, every sum exact (as in cu_mma16816), each element distinct, so that an element read from
   the wrong place in shared memory (a descriptor's offsets or the core matrices' layout misread) or left in
   the wrong register shows. On a GPU this checks the PTX ISA's layouts as the header reads them; under the
   emulation, the emulation's. Skipped where the build has no wgmma. */
static void cu_wgmma(void) {
    uint16_t hA[64 * 16], hB[16 * 64], *dA = NULL, *dB = NULL;
    float hC[64 * 64], hD[3][64 * 64], *dC = NULL, *dD0 = NULL, *dD1 = NULL, *dD2 = NULL;
    int on = 0, *don = NULL, i, j, k, f;
    if (!tfm__cu_flash_ok(16)) {
        printf("    (no bf16 tensor cores here: skipped)\n");
        return;
    }
    for (i = 0; i < 64 * 16; i++) {
        hA[i] = tfm__bf16((float)((i * 7) % 23 - 11));
        hB[i] = tfm__bf16((float)((i * 5) % 19 - 9));
    }
    for (i = 0; i < 64 * 64; i++) hC[i] = (float)(i * 3 - 6000);
    CHECK(cudaMalloc((void **)&dA, sizeof hA) == cudaSuccess && cudaMalloc((void **)&dB, sizeof hB) == cudaSuccess &&
          cudaMalloc((void **)&dC, sizeof hC) == cudaSuccess && cudaMalloc((void **)&dD0, sizeof hD[0]) == cudaSuccess &&
          cudaMalloc((void **)&dD1, sizeof hD[1]) == cudaSuccess && cudaMalloc((void **)&dD2, sizeof hD[2]) == cudaSuccess &&
          cudaMalloc((void **)&don, sizeof on) == cudaSuccess);
    if (dA && dB && dC && dD0 && dD1 && dD2 && don) {
        CHECK(cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(dC, hC, sizeof hC, cudaMemcpyHostToDevice) == cudaSuccess);
        TFM__LAUNCH(cu_k_wgmma, 1, 128, 128 + 3 * 64 * 64 * sizeof(uint16_t), dA, dB, dC, dD0, dD1, dD2, don);
        CHECK(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess);
        CHECK(cudaMemcpy(&on, don, sizeof on, cudaMemcpyDeviceToHost) == cudaSuccess);
#ifdef TFM_CUDA_EMULATION
        CHECK_MSG(on, "the emulation has wgmma");
#endif
        if (!on) printf("    (built without wgmma, for another target than sm_90a: skipped)\n");
        else {
            CHECK(cudaMemcpy(hD[0], dD0, sizeof hD[0], cudaMemcpyDeviceToHost) == cudaSuccess &&
                  cudaMemcpy(hD[1], dD1, sizeof hD[1], cudaMemcpyDeviceToHost) == cudaSuccess &&
                  cudaMemcpy(hD[2], dD2, sizeof hD[2], cudaMemcpyDeviceToHost) == cudaSuccess);
            for (f = 0; f < 3; f++) {
                static const char *const form[3] = {"B K-major (keys: TRANS 0)", "B N-major (values: TRANS 1)",
                                                    "A and B K-major from shared memory (tfm__cu_wgmma64_ss)"};
                int bad = 0;
                for (i = 0; i < 64; i++)
                    for (j = 0; j < 64; j++) {
                        double want = hC[i * 64 + j];
                        for (k = 0; k < 16; k++) want += (double)cu_bf16_value(hA[i * 16 + k]) * cu_bf16_value(hB[k * 64 + j]);
                        if ((double)hD[f][i * 64 + j] != want && bad++ < 3)
                            TEST__FAIL("wgmma, %s: D[%d][%d] = %g, want %g", form[f], i, j, (double)hD[f][i * 64 + j], want);
                    }
                CHECK_MSG(!bad, "wgmma, %s: %d of 4096 elements of D wrong", form[f], bad);
            }
        }
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD0), cudaFree(dD1), cudaFree(dD2), cudaFree(don);
}

/* y[i] = tfm__cu_fexp(x[i]) */
static __global__ void cu_k_fexp(const float *x, float *y, int n) {
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) y[i] = tfm__cu_fexp(x[i]);
}

/* The flash kernels' exponential (ex2.approx.ftz on a GPU) over the scores' range, [-90, 0] in 2^20 steps
   and at its edges, against exp in double: within the bound its comment gives from the CUDA guide's for
   __expf, (2 + 1.173 |x|) units in the last place, a result under FLT_MIN 0 or that close, e^-inf exactly
   0. The bf16 attention's bounds (cu_bf16_attention) take this error as negligible: under 2^-16 relative,
   against P's 2^-8. */
static void cu_fexp(void) {
    int n = (1 << 20) + 4, i, bad = 0;
    float *x = cu_host(n), *y = NULL, *dx = NULL, *dy = NULL;
    for (i = 0; i < n - 4; i++) x[i] = -90.0f * (float)i / (float)(n - 5);
    x[n - 4] = -INFINITY, x[n - 3] = -0.0f, x[n - 2] = -1e-30f, x[n - 1] = -87.3f;
    CHECK(cudaMalloc((void **)&dx, (size_t)n * sizeof(float)) == cudaSuccess &&
          cudaMalloc((void **)&dy, (size_t)n * sizeof(float)) == cudaSuccess);
    if (dx && dy) {
        CHECK(cudaMemcpy(dx, x, (size_t)n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
        TFM__LAUNCH(cu_k_fexp, (n + 255) / 256, 256, 0, (const float *)dx, dy, n);
        CHECK(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess);
        y = cu_fetch(dy, n, TFM_DEVICE_CUDA);
        for (i = 0; i < n; i++) {
            double want = exp((double)x[i]), err = fabs((double)y[i] - want);
            double ulp = want >= 1.17549435e-38 ? ldexp(1.0, ilogb(want) - 23) : 1.17549435e-38;
            double bound = (2.0 + 1.173 * fabs((double)x[i])) * ulp;
            if (x[i] == -INFINITY ? y[i] != 0.0f : !(err <= bound)) {
                if (bad++ < 5) TEST__FAIL("fexp(%.9g) = %.9g, want %.9g (bound %.3g)", (double)x[i], (double)y[i], want, bound);
            }
            if (want >= 1.17549435e-38 && err / want > cu_worst) cu_worst = err / want;
        }
        CHECK_MSG(!bad, "%d of %d exponentials outside the bound", bad, n);
    }
    free(x), free(y);
    cudaFree(dx), cudaFree(dy);
}

/* Products in a bf16 model call (tfm__model_prec TFM_PREC_BF16) across the shapes, transposes, strides
   (0: one B for the whole batch) and beta of cu_op_gemm, against two references in double on the host:
   - the product of the operands rounded to bf16 (cu_bf16_ref): what the GPU must compute but for its fp32
     sums, K terms each rounded once either way (tensor cores may truncate): |error| <= (K + 2) 2^-23 times
     the sum of the terms' magnitudes (|alpha| sum |a b| + |beta c|);
   - the fp32 product: each operand carries a relative error of at most 2^-8, a product of two 2^-7 + 2^-16,
     so |bf16 - fp32| <= (2^-7 + 2^-16 + (K + 2) 2^-23) times the same sum: the tolerance bf16 products
     get against the CPU. It must also differ somewhere (else the products did not run in bf16). */
static void cu_bf16_gemm(void) {
    cu_mnk pr[17];
    cu_rng g = {77};
    int np = cu_products(pr), i, t, v;
#ifdef TFM_CUDA_EMULATION
    unsigned long long calls0 = tfm_emu_gemm_bf16_calls();
#endif
    pr[np].M = 24, pr[np].N = 40, pr[np++].K = 64; /* rows of a multiple of 8: operands converted without gaps */
    for (i = 0; i < np; i++)
        for (t = 0; t < 4; t++)
            for (v = 0; v < 3; v++) {
                int M = pr[i].M, N = pr[i].N, K = pr[i].K, ta = t & 1, tb = t >> 1, batch = v ? 3 : 1;
                int lda = (ta ? M : K) + (v ? 5 : 0), ldb = (tb ? K : N) + (v ? 0 : 2), ldc = N + (v ? 3 : 0);
                int64_t sA = v ? (int64_t)(ta ? K : M) * lda + 7 : 0, sB = v == 1 ? (int64_t)(tb ? N : K) * ldb + 1 : 0;
                int64_t sC = (int64_t)M * ldc + 5, nA = v ? sA * batch : (int64_t)(ta ? K : M) * lda;
                int64_t nB = v == 1 ? sB * batch : (int64_t)(tb ? N : K) * ldb, bad = 0, bad32 = 0, differ = 0, at = -1;
                float alpha = v ? 0.75f : 1.0f, beta = v ? 1.25f : 0.0f;
                cu_buf A = cu_normal(nA, &g, 1, 0), B = cu_normal(nB, &g, 1, 0);
                cu_buf Cm = beta == 0.0f ? cu_nan(sC * batch) : cu_normal(sC * batch, &g, 1, 0);
                float *c0 = (float *)malloc((size_t)(sC * batch) * sizeof(float)), *got;
                double worst = 0.0;
                memcpy(c0, Cm.h, (size_t)(sC * batch) * sizeof(float));
                tfm__op_gemm_batched(TFM_DEVICE_CPU, ta, tb, M, N, K, alpha, A.h, lda, sA, B.h, ldb, sB, beta, Cm.h, ldc, sC,
                                     batch); /* fp32, on the CPU */
                tfm__model_prec = TFM_PREC_BF16;
                tfm__op_gemm_batched(TFM_DEVICE_CUDA, ta, tb, M, N, K, alpha, A.d, lda, sA, B.d, ldb, sB, beta, Cm.d, ldc,
                                     sC, batch);
                tfm__model_prec = 0;
                got = cu_fetch(Cm.d, sC * batch, TFM_DEVICE_CUDA);
                for (int b = 0; b < batch; b++)
                    for (int r = 0; r < M; r++)
                        for (int c = 0; c < N; c++) {
                            int64_t ic = b * sC + (int64_t)r * ldc + c;
                            double ref = 0.0, mag = 0.0, e;
                            for (int k = 0; k < K; k++) {
                                float a = A.h[b * sA + (ta ? (int64_t)k * lda + r : (int64_t)r * lda + k)];
                                float bb = B.h[b * sB + (tb ? (int64_t)c * ldb + k : (int64_t)k * ldb + c)];
                                double p = cu_bf16_ref(a) * cu_bf16_ref(bb);
                                ref += p;
                                mag += fabs(p);
                            }
                            ref *= alpha;
                            mag = fabs((double)alpha) * mag;
                            if (beta != 0.0f) {
                                ref += (double)beta * c0[ic];
                                mag += fabs((double)beta * c0[ic]);
                            }
                            e = fabs((double)got[ic] - ref);
                            if (!(e <= (K + 2) * ldexp(1.0, -23) * mag + 1e-30)) {
                                if (!bad++) at = ic;
                            }
                            if (!(fabs((double)got[ic] - Cm.h[ic]) <= (ldexp(1.0, -7) + ldexp(1.0, -16) + (K + 2) * ldexp(1.0, -23)) * mag + 1e-30))
                                bad32++;
                            if (got[ic] != Cm.h[ic]) differ++;
                            if (mag > 0 && e / mag > worst) worst = e / mag;
                        }
                CHECK_MSG(!bad && !bad32, "bf16 gemm ta=%d tb=%d M=%d N=%d K=%d batch=%d sB=%lld beta=%g: %lld outside the bound "
                          "of the bf16 operands' exact product (first at %lld: %.9g), %lld outside bf16's bound against fp32; "
                          "worst %.3g of the terms' magnitude", ta, tb, M, N, K, batch, (long long)sB, (double)beta, (long long)bad,
                          (long long)at, at >= 0 ? (double)got[at] : 0.0, (long long)bad32, worst);
                if (K > 1)
                    CHECK_MSG(differ > 0, "bf16 gemm M=%d N=%d K=%d: every element equals the fp32 product: bf16 did not run", M, N, K);
                free(got);
                free(c0);
                cu_release(&A, &B, &Cm, CU_END);
            }
#ifdef TFM_CUDA_EMULATION
    CHECK_MSG(tfm_emu_gemm_bf16_calls() > calls0, "no cublasGemmEx call on bf16 operands");
#endif
    /* outside a bf16 model call the products are fp32 again */
    {
        cu_buf A = cu_normal(64 * 64, &g, 1, 0), B = cu_normal(64 * 64, &g, 1, 0), Cm = cu_nan(64 * 64);
        CU_DEVS tfm__op_gemm_batched(CU_DEV, 0, 0, 64, 64, 64, 1.0f, CU_P(A), 64, 0, CU_P(B), 64, 0, 0.0f, CU_P(Cm), 64, 0, 1);
        cu_check("gemm after the bf16 ones: fp32", &Cm, CU_TOL);
        cu_release(&A, &B, &Cm, CU_END);
    }
}

/* A bf16 activation (device, a buffer of N * cols floats first filled by cu_nan) against the fp32 values
   it stands for (device, N rows of cols): its rows of tfm__bf16_ld(cols) hold tfm__bf16 of each value, bit
   for bit, and the rows' padding and the rest of the buffer are cu_nan's bytes as they were. */
static void cu_check_bf16_rows(const char *what_, const float *f32, const float *bf, int64_t N, int64_t cols) {
    int64_t n = N * cols, ldb = tfm__bf16_ld(cols), i, bad = 0, first = -1;
    float *nan = cu_host(n), *a = cu_fetch(f32, n, TFM_DEVICE_CUDA), *bh = cu_fetch(bf, n, TFM_DEVICE_CUDA);
    const uint16_t *h16 = (const uint16_t *)(const void *)bh, *was = (const uint16_t *)(const void *)nan;
    char what[200];
    snprintf(what, sizeof what, "%s", what_);
    for (i = 0; i < n; i++) nan[i] = cu_nan_float();
    for (i = 0; i < 2 * n; i++) {
        int data = i < N * ldb && i % ldb < cols;
        uint16_t want = data ? tfm__bf16(a[i / ldb * cols + i % ldb]) : was[i];
        if (h16[i] != want && !bad++) first = i;
    }
    CHECK_MSG(!bad, "%s: %lld of %lld bf16 halves wrong (first %lld: 0x%04x)", what, (long long)bad, (long long)(2 * n),
              (long long)first, bad ? h16[first] : 0);
    free(nan);
    free(a);
    free(bh);
}

/* The bf16 attention (a bf16 model's: tfm__model_prec) forward and backward against a reference in double
   on the host from the same bf16-rounded q, k, v and dout (cu_bf16_ref), written here from the definitions
   (visibility: key lengths, causal, window and sinks, the additive mask; the dropout mask's hash). What the
   GPU adds to that reference, and the bound each element is held to:
   - scores: fp32 sums of exact products, relative errors of about D 2^-24: negligible below;
   - P's exponential: the flash kernels' tfm__cu_fexp, under 2^-16 relative (cu_fexp checks its bound):
     negligible against P's rounding to bf16 below;
   - out = sum_j bf16(P_ij keep) v_j: P rounded to bf16 (2^-8 relative), so |error| <= 2^-8 sum_j P keep |v|
     (times 1.01 for the fp32 sums);
   - dv_j = sum_i bf16(P keep) dout_i: 2^-8 sum_i P keep |dout|;
   - dS_ij = P (keep dP - D_i), rounded to bf16: 2^-8 |dS|, plus D_i's error (from out's, at most 2^-8 of
     the magnitude m_ij = P (keep sum|dout||v| + sum_d |dout_d| sum_j P keep |v_d|) of the terms, and 2^-9
     more from out rounded to bf16 for D, as a bf16 model's calls take it), bounded with room by 2^-7 m_ij; dq_i = scale sum_j dS k_j and dk_j = scale sum_i dS q_i then carry those
     bounds times |k| and |q|.
   A wrong index, a missed chunk or a lost mask breaks these by far more. A systematic error can hide
   inside them, so each output's errors must also not lean along its reference: rounding to nearest is
   unbiased, so with independent errors of mean 0 and |err_x| <= e_x, z = sum(err_x ref_x) / sqrt(sum(e_x^2
   ref_x^2)) has a variance of at most 1, and |z| <= 6 (Chebyshev: a false alarm under 3%, far less in
   practice: |z| <= 2 over every case here). The bf16 paths once rounded P times dropout's 1/(1-p): where
   P = 1 (a flash row's running maximum, a query that sees one key) that is 1.111 rounded to bf16, 0.16%
   low every time, and the outputs leaned by z = -10 to -15. (A 1% error on the dq kernel's dS gives z of
   2-5 there: within the bound, and within the element bounds.) */
/* The dropout factor of (batch-head bh, query i, key j): the mask's definition (a hash of the seed and the
   element's place in (B,H,Tq,Tk)), 1/(1-p) where kept */
static double cu_keep(const tfm__attn_args *a, int bh, int i, int j) {
    uint64_t x = a->drop_i0 + ((uint64_t)bh * a->Tq + i) * a->Tk + j;
    if (!(a->dropout > 0.0f)) return 1.0;
    return tfm__hash24(a->seed, x) >= tfm__drop_threshold(a->dropout) ? 1.0 / (1.0 - a->dropout) : 0.0;
}

typedef struct cu_bfatt { int B, H, Hkv, D, Tq, Tk, causal, lens, mask, window, sinks, fused; float dropout; } cu_bfatt;
static void cu_bf16_attention_case(const cu_bfatt *c) {
    int B = c->B, H = c->H, Hkv = c->Hkv, D = c->D, Tq = c->Tq, Tk = c->Tk, G = H / Hkv, C = H * D, E = Hkv * D;
    int ldq = c->fused ? C + 2 * E : C, ldk = c->fused ? ldq : E, b, h, i, j, d;
    int64_t nq = (int64_t)B * Tq * ldq, nk = c->fused ? 0 : (int64_t)B * Tk * E, bad = 0;
    float scale = 1.0f / sqrtf((float)D);
    cu_rng g = {(uint64_t)(77 + B * 3 + H * 5 + D * 7 + Tq * 11 + Tk * 13 + c->causal + c->lens * 17 + c->mask * 19)};
    cu_buf q = cu_normal(nq, &g, 1, 0), k = cu_normal(c->fused ? 1 : nk, &g, 1, 0), v = cu_normal(c->fused ? 1 : nk, &g, 1, 0);
    cu_buf out = cu_nan((int64_t)B * Tq * C), lse = cu_nan((int64_t)B * H * Tq), dout = cu_normal((int64_t)B * Tq * C, &g, 1, 0);
    cu_buf dq = cu_zeros(nq), dk = cu_zeros(c->fused ? 1 : nk), dv = cu_zeros(c->fused ? 1 : nk);
    int32_t lens[8];
    float *mask = cu_host((int64_t)(c->mask == 2 ? B : 1) * Tq * Tk);
    const float *hq = q.h, *hk = c->fused ? q.h + C : k.h, *hv = c->fused ? q.h + C + E : v.h;
    double *P = (double *)calloc((size_t)Tk, sizeof(double)), *ref = (double *)calloc((size_t)(2 * (nq + nk + nk) + 2 * B * Tq * C), sizeof(double));
    double *rq = ref, *eq = rq + nq, *rk = eq + nq, *ek = rk + nk, *rv = ek + nk, *ev = rv + nk, *ro = ev + nk, *eo = ro + (int64_t)B * Tq * C;
    tfm__attn_args a;
    char name[200];
    snprintf(name, sizeof name, "bf16 attention B=%d H=%d Hkv=%d D=%d Tq=%d Tk=%d causal=%d lens=%d mask=%d window=%d sinks=%d fused=%d dropout=%g",
             B, H, Hkv, D, Tq, Tk, c->causal, c->lens, c->mask, c->window, c->sinks, c->fused, (double)c->dropout);
    for (b = 0; b < B; b++) lens[b] = b % 3 == 0 ? Tk : b % 3 == 1 ? Tk / 2 + 1 : 1;
    for (j = 0; j < (c->mask == 2 ? B : 1) * Tq * Tk; j++) mask[j] = j % 7 == 3 ? -INFINITY : 0.5f * cu_gauss(&g);
    memset(&a, 0, sizeof a);
    a.B = B, a.H = H, a.Hkv = Hkv == H ? 0 : Hkv, a.Tq = Tq, a.Tk = Tk, a.D = D;
    a.q = q.d, a.k = c->fused ? q.d + C : k.d, a.v = c->fused ? q.d + C + E : v.d, a.ldq = ldq, a.ldk = a.ldv = ldk;
    a.out = out.d, a.ldo = C, a.lse = lse.d, a.causal = c->causal, a.window = c->window, a.sinks = c->sinks;
    a.lens = c->lens ? lens : NULL, a.dropout = c->dropout, a.scale = scale, a.seed = 99, a.drop_i0 = 5;
    a.mask = c->mask ? mask : NULL, a.mask_bs = c->mask == 2 ? (int64_t)Tq * Tk : 0;
    tfm__model_prec = TFM_PREC_BF16;
#ifdef TFM_CUDA_EMULATION
    CHECK(tfm__cu_flash_ok(128)); /* the emulation's sm_90, with 227 KiB of shared memory by opt-in */
#endif
    CHECK_MSG(tfm__attn_path(&a) == (D <= 128 && tfm__cu_flash_ok(D) ? 3 : 2), "%s: takes path %d", name, tfm__attn_path(&a));
#ifdef TFM_CUDA_EMULATION
    { /* heads of 49-64 and 113-128 channels: the flash kernels' products on the warpgroup (wgmma), as a GPU
         built for sm_90a runs them, and by mma.sync (tfm__cu_wg_off), as elsewhere: the same sums in the same
         order here, so the same outputs, log-sum-exps and gradients, bit for bit (on a GPU the bounds below
         hold the build's own) */
        unsigned long long n0 = tfm_emu_wgmma_calls(), n1;
        int wg = tfm__attn_path(&a) == 3 && ((D + 15) / 16 == 4 || (D + 15) / 16 == 8);
        cu_buf o2 = cu_nan((int64_t)B * Tq * C), l2 = cu_nan((int64_t)B * H * Tq);
        cu_buf q2 = cu_zeros(nq), k2 = cu_zeros(c->fused ? 1 : nk), v2 = cu_zeros(c->fused ? 1 : nk);
        tfm__attn_args a2 = a;
        a2.out = o2.d, a2.lse = l2.d;
        tfm__cu_wg_off = 1;
        CHECK(tfm__op_attention(TFM_DEVICE_CUDA, &a2));
        CHECK(tfm__op_attention_bwd(TFM_DEVICE_CUDA, &a2, q2.d, ldq, c->fused ? q2.d + C : k2.d, ldk, c->fused ? q2.d + C + E : v2.d,
                                    ldk, dout.d, C));
        tfm__cu_wg_off = 0;
        n1 = tfm_emu_wgmma_calls();
        CHECK(tfm__op_attention(TFM_DEVICE_CUDA, &a));
        CHECK(tfm__op_attention_bwd(TFM_DEVICE_CUDA, &a, dq.d, ldq, c->fused ? dq.d + C : dk.d, ldk, c->fused ? dq.d + C + E : dv.d,
                                    ldk, dout.d, C));
        CHECK_MSG(n1 == n0 && (tfm_emu_wgmma_calls() > n1) == wg, "%s: %llu wgmma products switched off, %llu on", name,
                  n1 - n0, tfm_emu_wgmma_calls() - n1);
        if (wg) {
            cu_buf *x2[5] = {&o2, &l2, &q2, &k2, &v2}, *x1[5] = {&out, &lse, &dq, &dk, &dv};
            static const char *const what[5] = {"out", "lse", "dq", "dk", "dv"};
            for (int o = 0; o < (c->fused ? 3 : 5); o++) {
                float *x = cu_fetch(x2[o]->d, x2[o]->n, TFM_DEVICE_CUDA), *y = cu_fetch(x1[o]->d, x1[o]->n, TFM_DEVICE_CUDA);
                cu_check_bits_arrays(cu_fmt("%s: %s by wgmma and by mma.sync", name, c->fused && o == 2 ? "dq|dk|dv" : what[o]),
                                     y, x, x1[o]->n);
                free(x), free(y);
            }
        }
        cu_release(&o2, &l2, &q2, &k2, &v2, CU_END);
    }
#else
    CHECK(tfm__op_attention(TFM_DEVICE_CUDA, &a));
    CHECK(tfm__op_attention_bwd(TFM_DEVICE_CUDA, &a, dq.d, ldq, c->fused ? dq.d + C : dk.d, ldk, c->fused ? dq.d + C + E : dv.d,
                                ldk, dout.d, C));
#endif
    /* the flash kernels write every element of dq, dk and dv: with a.overwrite, into NaN, the bits added
       into zeros above (the batched products add: no overwrite) */
    CHECK_MSG(tfm__op_attention_flash(TFM_DEVICE_CUDA, &a) == (tfm__attn_path(&a) == 3) &&
                  !tfm__op_attention_flash(TFM_DEVICE_CPU, &a), "%s: which backward writes", name);
    if (tfm__op_attention_flash(TFM_DEVICE_CUDA, &a)) {
        cu_buf wq = cu_nan(nq), wk = cu_nan(c->fused ? 1 : nk), wv = cu_nan(c->fused ? 1 : nk);
        cu_buf *got[3] = {&wq, &wk, &wv}, *want[3] = {&dq, &dk, &dv};
        tfm__attn_args ao = a;
        ao.overwrite = 1;
        CHECK(tfm__op_attention_bwd(TFM_DEVICE_CUDA, &ao, wq.d, ldq, c->fused ? wq.d + C : wk.d, ldk,
                                    c->fused ? wq.d + C + E : wv.d, ldk, dout.d, C));
        for (int o = 0; o < (c->fused ? 1 : 3); o++) {
            float *x = cu_fetch(got[o]->d, got[o]->n, TFM_DEVICE_CUDA), *y = cu_fetch(want[o]->d, want[o]->n, TFM_DEVICE_CUDA);
            char what[260];
            snprintf(what, sizeof what, "%s: %s overwritten", name, c->fused ? "dq|dk|dv" : o == 0 ? "dq" : o == 1 ? "dk" : "dv");
            cu_check_bits_arrays(what, x, y, got[o]->n);
            free(x), free(y);
        }
        cu_release(&wq, &wk, &wv, CU_END);
        for (int mode = 1; mode <= 2; mode++) {
            /* the gradients rounded to bf16 as written (a.d_bf 1: as floats; cu_bf16_ref) and written in bf16 (2: rows of
               tfm__bf16_ld, as a bf16 model's self-attention hands them to its in-projection): the rounding of the
               fp32 ones, bit for bit */
            cu_buf rq = cu_nan(nq), rk = cu_nan(c->fused ? 1 : nk), rv = cu_nan(c->fused ? 1 : nk);
            cu_buf *got[3] = {&rq, &rk, &rv}, *want[3] = {&dq, &dk, &dv};
            tfm__attn_args ar = a;
            int lq = mode == 2 ? (int)tfm__bf16_ld(ldq) : ldq, lk = mode == 2 ? (int)tfm__bf16_ld(ldk) : ldk;
            uint16_t *q16 = (uint16_t *)(void *)rq.d;
            float *pk = c->fused ? (mode == 2 ? (float *)(void *)(q16 + C) : rq.d + C) : rk.d;
            float *pv = c->fused ? (mode == 2 ? (float *)(void *)(q16 + C + E) : rq.d + C + E) : rv.d;
            ar.overwrite = 1, ar.d_bf = mode;
            CHECK(tfm__op_attention_bwd(TFM_DEVICE_CUDA, &ar, rq.d, lq, pk, lk, pv, lk, dout.d, C));
            for (int o = 0; o < (c->fused ? 1 : 3); o++) {
                const char *nm = c->fused ? "dq|dk|dv" : o == 0 ? "dq" : o == 1 ? "dk" : "dv";
                int64_t rows = o == 0 ? (int64_t)B * Tq : (int64_t)B * Tk, cols = o == 0 ? ldq : ldk;
                if (mode == 2) {
                    cu_check_bf16_rows(cu_fmt("%s: %s written in bf16", name, nm), want[o]->d, got[o]->d, rows, cols);
                } else {
                    float *x = cu_fetch(got[o]->d, got[o]->n, TFM_DEVICE_CUDA), *y = cu_fetch(want[o]->d, want[o]->n, TFM_DEVICE_CUDA);
                    for (int64_t e = 0; e < rows * cols; e++) y[e] = (float)cu_bf16_ref(y[e]);
                    cu_check_bits_arrays(cu_fmt("%s: %s rounded to bf16 as written", name, nm), x, y, rows * cols);
                    free(x), free(y);
                }
            }
            cu_release(&rq, &rk, &rv, CU_END);
        }
        { /* dout rounded in D too (a.dout_bf 1) and given in bf16 (2: rows of tfm__bf16_ld(C), as a bf16 model's output
             projection's backward writes it): the gradients from dout rounded on the host (cu_bf16_ref), bit for bit */
            cu_buf dr = cu_alloc(dout.n), d16 = cu_nan(dout.n), gr[3][3];
            for (int64_t e = 0; e < dout.n; e++) dr.h[e] = (float)cu_bf16_ref(dout.h[e]);
            cu_push(&dr);
            tfm__op_to_bf16(TFM_DEVICE_CUDA, d16.d, tfm__bf16_ld(C), 0, dout.d, C, (int64_t)B * Tq, C);
            for (int k = 0; k < 3; k++) {
                tfm__attn_args ar = a;
                gr[k][0] = cu_nan(nq), gr[k][1] = cu_nan(c->fused ? 1 : nk), gr[k][2] = cu_nan(c->fused ? 1 : nk);
                ar.overwrite = 1, ar.dout_bf = k;
                CHECK(tfm__op_attention_bwd(TFM_DEVICE_CUDA, &ar, gr[k][0].d, ldq, c->fused ? gr[k][0].d + C : gr[k][1].d, ldk,
                                            c->fused ? gr[k][0].d + C + E : gr[k][2].d, ldk, k == 0 ? dr.d : k == 1 ? dout.d : d16.d,
                                            k == 2 ? (int)tfm__bf16_ld(C) : C));
            }
            for (int k = 1; k < 3; k++)
                for (int o = 0; o < (c->fused ? 1 : 3); o++) {
                    float *x = cu_fetch(gr[k][o].d, gr[k][o].n, TFM_DEVICE_CUDA), *y = cu_fetch(gr[0][o].d, gr[0][o].n, TFM_DEVICE_CUDA);
                    cu_check_bits_arrays(cu_fmt("%s: %s from dout %s", name, c->fused ? "dq|dk|dv" : o == 0 ? "dq" : o == 1 ? "dk" : "dv",
                                                k == 1 ? "rounded in D" : "in bf16"), x, y, gr[k][o].n);
                    free(x), free(y);
                }
            for (int k = 0; k < 3; k++) cu_release(&gr[k][0], &gr[k][1], &gr[k][2], CU_END);
            cu_release(&dr, &d16, CU_END);
        }
        { /* q, k and v given in bf16 (their rounding, as a bf16 model's q|k|v product writes them): the same
             output, log-sum-exps and gradients, bit for bit */
            cu_buf bq = cu_nan(nq), bk = cu_nan(c->fused ? 1 : nk), bv = cu_nan(c->fused ? 1 : nk);
            cu_buf o2 = cu_nan(out.n), l2 = cu_nan(lse.n), g2 = cu_zeros(nq), gk2 = cu_zeros(c->fused ? 1 : nk);
            cu_buf gv2 = cu_zeros(c->fused ? 1 : nk);
            cu_buf *pairs[][2] = {{&o2, &out}, {&l2, &lse}, {&g2, &dq}, {&gk2, &dk}, {&gv2, &dv}};
            tfm__attn_args ab = a;
            const uint16_t *q16 = (const uint16_t *)(const void *)bq.d;
            (void)tfm__bf16_operand_cuda((uint16_t *)(void *)bq.d, ldq, q.d, ldq, 0, (int64_t)B * Tq, ldq, 1);
            if (!c->fused) {
                (void)tfm__bf16_operand_cuda((uint16_t *)(void *)bk.d, ldk, k.d, ldk, 0, (int64_t)B * Tk, ldk, 1);
                (void)tfm__bf16_operand_cuda((uint16_t *)(void *)bv.d, ldk, v.d, ldk, 0, (int64_t)B * Tk, ldk, 1);
            }
            ab.qkv_bf = 1, ab.out = o2.d, ab.lse = l2.d, ab.q = bq.d;
            ab.k = c->fused ? (const float *)(const void *)(q16 + C) : bk.d;
            ab.v = c->fused ? (const float *)(const void *)(q16 + C + E) : bv.d;
            CHECK(tfm__op_attention(TFM_DEVICE_CUDA, &ab));
            ab.out = out.d, ab.lse = lse.d; /* the backward reads the first forward's (the same bits, checked) */
            CHECK(tfm__op_attention_bwd(TFM_DEVICE_CUDA, &ab, g2.d, ldq, c->fused ? g2.d + C : gk2.d, ldk,
                                        c->fused ? g2.d + C + E : gv2.d, ldk, dout.d, C));
            for (int o = 0; o < (c->fused ? 3 : 5); o++) {
                float *x = cu_fetch(pairs[o][0]->d, pairs[o][0]->n, TFM_DEVICE_CUDA);
                float *y = cu_fetch(pairs[o][1]->d, pairs[o][1]->n, TFM_DEVICE_CUDA);
                cu_check_bits_arrays(cu_fmt("%s: from bf16 q, k, v: %s", name, o == 0 ? "out" : o == 1 ? "lse" : o == 2 ? "dq" : o == 3 ? "dk" : "dv"),
                                     x, y, pairs[o][0]->n);
                free(x), free(y);
            }
            cu_release(&bq, &bk, &bv, &o2, &l2, &g2, &gk2, &gv2, CU_END);
        }
        { /* the output written in bf16 (a.out_bf: as a bf16 model's layer holds it for its next product): the
             rounding of the fp32 output; the backward from it the same gradients bit for bit (D from the
             output rounded either way) */
            cu_buf ob = cu_nan(out.n), l3 = cu_nan(lse.n), g3 = cu_zeros(nq), gk3 = cu_zeros(c->fused ? 1 : nk);
            cu_buf gv3 = cu_zeros(c->fused ? 1 : nk);
            cu_buf *pairs[][2] = {{&l3, &lse}, {&g3, &dq}, {&gk3, &dk}, {&gv3, &dv}};
            tfm__attn_args ab = a;
            ab.out = ob.d, ab.ldo = (int)tfm__bf16_ld(C), ab.out_bf = 1, ab.lse = l3.d;
            CHECK(tfm__op_attention(TFM_DEVICE_CUDA, &ab));
            cu_check_bf16_rows(cu_fmt("%s: the output in bf16", name), out.d, ob.d, (int64_t)B * Tq, C);
            CHECK(tfm__op_attention_bwd(TFM_DEVICE_CUDA, &ab, g3.d, ldq, c->fused ? g3.d + C : gk3.d, ldk,
                                        c->fused ? g3.d + C + E : gv3.d, ldk, dout.d, C));
            for (int o = 0; o < (c->fused ? 2 : 4); o++) {
                float *x = cu_fetch(pairs[o][0]->d, pairs[o][0]->n, TFM_DEVICE_CUDA);
                float *y = cu_fetch(pairs[o][1]->d, pairs[o][1]->n, TFM_DEVICE_CUDA);
                cu_check_bits_arrays(cu_fmt("%s: with the output in bf16: %s", name, o == 0 ? "lse" : o == 1 ? "dq" : o == 2 ? "dk" : "dv"),
                                     x, y, pairs[o][0]->n);
                free(x), free(y);
            }
            cu_release(&ob, &l3, &g3, &gk3, &gv3, CU_END);
        }
    }
    tfm__model_prec = 0;
    for (b = 0; b < B; b++)
        for (h = 0; h < H; h++)
            for (i = 0; i < Tq; i++) {
                int kh = h / G, bh = b * H + h, n = c->lens ? lens[b] : Tk;
                const float *qi = hq + ((int64_t)b * Tq + i) * ldq + h * D, *doi = dout.h + ((int64_t)b * Tq + i) * C + h * D;
                double mx = -INFINITY, sum = 0.0, L, Di = 0.0, Dmag = 0.0;
                if (c->causal && i + 1 < n) n = i + 1;
                for (j = 0; j < Tk; j++) { /* scores; P holds them, -inf where hidden */
                    const float *kj = hk + ((int64_t)b * Tk + j) * ldk + kh * D;
                    double sc = 0.0;
                    int seen = j < n && (!c->window || j < c->sinks || j > i - c->window);
                    for (d = 0; d < D; d++) sc += cu_bf16_ref(qi[d]) * cu_bf16_ref(kj[d]);
                    sc = sc * scale + (c->mask ? mask[(c->mask == 2 ? (int64_t)b * Tq * Tk : 0) + (int64_t)i * Tk + j] : 0.0);
                    P[j] = seen ? sc : -INFINITY;
                    if (P[j] > mx) mx = P[j];
                }
                for (j = 0; j < Tk; j++) sum += P[j] == -INFINITY ? 0.0 : exp(P[j] - mx);
                L = sum > 0.0 ? mx + log(sum) : -INFINITY;
                for (j = 0; j < Tk; j++) P[j] = L == -INFINITY || P[j] == -INFINITY ? 0.0 : exp(P[j] - L);
                lse.h[(int64_t)bh * Tq + i] = (float)L; /* the reference lse, compared below */
                for (d = 0; d < D; d++) {
                    double o = 0.0, mag = 0.0;
                    for (j = 0; j < Tk; j++) {
                        double kp = P[j] * (double)cu_keep(&a, bh, i, j);
                        double vv = cu_bf16_ref(hv[((int64_t)b * Tk + j) * ldk + kh * D + d]);
                        o += kp * vv;
                        mag += fabs(kp * vv);
                    }
                    ro[((int64_t)b * Tq + i) * C + h * D + d] = o;
                    eo[((int64_t)b * Tq + i) * C + h * D + d] = ldexp(1.01, -8) * mag + 1e-6;
                    Di += (double)doi[d] * o;
                    Dmag += fabs((double)doi[d]) * mag;
                }
                for (j = 0; j < Tk; j++) {
                    const float *kj = hk + ((int64_t)b * Tk + j) * ldk + kh * D, *vj = hv + ((int64_t)b * Tk + j) * ldk + kh * D;
                    double keep = cu_keep(&a, bh, i, j), dp = 0.0, dpm = 0.0, ds, eds;
                    if (P[j] == 0.0) continue;
                    for (d = 0; d < D; d++) {
                        dp += cu_bf16_ref(doi[d]) * cu_bf16_ref(vj[d]);
                        dpm += fabs(cu_bf16_ref(doi[d]) * cu_bf16_ref(vj[d]));
                    }
                    ds = P[j] * (keep * dp - Di);
                    eds = ldexp(1.0, -8) * fabs(ds) + ldexp(1.0, -7) * P[j] * (keep * dpm + Dmag) + 1e-7;
                    for (d = 0; d < D; d++) {
                        int64_t xq = ((int64_t)b * Tq + i) * ldq + h * D + d, xk = ((int64_t)b * Tk + j) * (c->fused ? ldq : E) + kh * D + d;
                        double pk = P[j] * keep * cu_bf16_ref(doi[d]);
                        rq[xq] += scale * ds * cu_bf16_ref(kj[d]);
                        eq[xq] += scale * eds * fabs(cu_bf16_ref(kj[d]));
                        if (c->fused) xk += C;
                        (c->fused ? rq : rk)[xk] += scale * ds * cu_bf16_ref(qi[d]);
                        (c->fused ? eq : ek)[xk] += scale * eds * fabs(cu_bf16_ref(qi[d]));
                        (c->fused ? rq : rv)[xk + (c->fused ? E : 0)] += pk;
                        (c->fused ? eq : ev)[xk + (c->fused ? E : 0)] += ldexp(1.01, -8) * fabs(pk) + 1e-7;
                    }
                }
            }
    { /* the reference above against the CPU's attention in fp32 (checked against PyTorch and finite
         differences by the unit tests) on the bf16-rounded inputs, within the same bounds: the formulas
         written here from the definitions are the gradients the library means (a wrong sign, scale or
         mask would be far outside; the bounds cover D, which the reference takes from the unrounded dout
         as the GPU does, and the CPU from the rounded one) */
        int64_t no = (int64_t)B * Tq * C, nkv = c->fused ? 0 : nk, x, nbad = 0, at = -1;
        float *hq2 = cu_host(nq), *hk2 = cu_host(nkv), *hv2 = cu_host(nkv), *hdo = cu_host(no), *co = cu_host(no);
        float *cl = cu_host((int64_t)B * H * Tq), *cdq = cu_host(nq), *cdk = cu_host(nkv), *cdv = cu_host(nkv);
        tfm__attn_args ac = a;
        const float *got[4] = {co, cdq, cdk, cdv};
        const double *r[4] = {ro, rq, rk, rv}, *e[4] = {eo, eq, ek, ev};
        const int64_t n[4] = {no, nq, nkv, nkv};
        for (x = 0; x < nq; x++) hq2[x] = (float)cu_bf16_ref(q.h[x]);
        for (x = 0; x < nkv; x++) hk2[x] = (float)cu_bf16_ref(k.h[x]), hv2[x] = (float)cu_bf16_ref(v.h[x]);
        for (x = 0; x < no; x++) hdo[x] = (float)cu_bf16_ref(dout.h[x]);
        ac.q = hq2, ac.k = c->fused ? hq2 + C : hk2, ac.v = c->fused ? hq2 + C + E : hv2, ac.out = co, ac.lse = cl;
        CHECK(tfm__op_attention(TFM_DEVICE_CPU, &ac));
        CHECK(tfm__op_attention_bwd(TFM_DEVICE_CPU, &ac, cdq, ldq, c->fused ? cdq + C : cdk, ldk, c->fused ? cdq + C + E : cdv,
                                    ldk, hdo, C));
        for (int o = 0; o < 4; o++)
            for (x = 0; x < n[o]; x++)
                if (!(fabs(got[o][x] - r[o][x]) <= e[o][x]) && !nbad++) at = (int64_t)o << 40 | x;
        CHECK_MSG(!nbad, "%s: the reference differs from the CPU's fp32 attention in %lld elements (first: output %d, element "
                  "%lld)", name, (long long)nbad, (int)(at >> 40), (long long)(at & (((int64_t)1 << 40) - 1)));
        free(hq2), free(hk2), free(hv2), free(hdo), free(co), free(cl), free(cdq), free(cdk), free(cdv);
    }
    {
        struct { const char *what; cu_buf *x; const double *r, *e; int64_t n; } outs[4] = {
            {"out", &out, ro, eo, (int64_t)B * Tq * C}, {c->fused ? "dq|dk|dv" : "dq", &dq, rq, eq, nq},
            {"dk", &dk, rk, ek, nk}, {"dv", &dv, rv, ev, nk}};
        float *glse = cu_fetch(lse.d, lse.n, TFM_DEVICE_CUDA);
        for (int o = 0; o < (c->fused ? 2 : 4); o++) {
            float *got = cu_fetch(outs[o].x->d, outs[o].n, TFM_DEVICE_CUDA);
            int64_t nbad = 0, at = -1;
            double gr = 0.0, rr = 0.0;
            for (int64_t x = 0; x < outs[o].n; x++) {
                if (!(fabs(got[x] - outs[o].r[x]) <= outs[o].e[x]) && !nbad++) at = x;
                gr += (got[x] - outs[o].r[x]) * outs[o].r[x];
                rr += outs[o].e[x] * outs[o].r[x] * outs[o].e[x] * outs[o].r[x];
            }
            rr = sqrt(rr);
            CHECK_MSG(!nbad, "%s: %s: %lld of %lld elements outside their bound (first %lld: %.8g, reference %.8g, bound %.3g)",
                      name, outs[o].what, (long long)nbad, (long long)outs[o].n, (long long)at, at >= 0 ? (double)got[at] : 0.0,
                      at >= 0 ? outs[o].r[at] : 0.0, at >= 0 ? outs[o].e[at] : 0.0);
            CHECK_MSG(fabs(gr) <= 6.0 * rr, "%s: %s: the errors lean along the reference (z = %.3g): a systematic error",
                      name, outs[o].what, gr / rr);
            if (test__verbose) printf("    z %+.3f over %lld: %s: %s\n", gr / rr, (long long)outs[o].n, name, outs[o].what);
            bad += nbad;
            free(got);
        }
        for (int64_t x = 0; x < lse.n; x++)
            if (!(glse[x] == lse.h[x] || fabs((double)glse[x] - lse.h[x]) <= 1e-5 * fmax(1.0, fabs((double)lse.h[x])))) bad++;
        CHECK_MSG(!bad, "%s: %lld elements (or log-sum-exps) outside their bounds", name, (long long)bad);
        free(glse);
    }
    free(P);
    free(ref);
    free(mask);
    cu_release(&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv, CU_END);
}

static void cu_bf16_attention(void) {
#ifdef TFM_CUDA_EMULATION
    unsigned long long calls0 = tfm_emu_gemm_bf16_calls();
#endif
    /* heads of up to 128 channels take the flash kernels (tiles of 64 queries and keys, channels padded to a
       multiple of 16), wider ones the batched products in chunks of a few query rows */
    static const cu_bfatt cases[] = {
        {2, 2, 2, 8, 40, 40, 1, 0, 0, 0, 0, 0, 0.0f},      /* causal */
        {3, 4, 2, 16, 33, 33, 1, 1, 0, 0, 0, 0, 0.1f},     /* grouped-query, key lengths, dropout */
        {2, 2, 2, 8, 17, 29, 0, 1, 2, 0, 0, 0, 0.0f},      /* cross-attention: Tq != Tk, a mask per batch row */
        {1, 2, 2, 8, 50, 50, 1, 0, 0, 7, 2, 0, 0.0f},      /* a sliding window of 7 with 2 sinks */
        {2, 2, 1, 8, 24, 24, 1, 0, 1, 0, 0, 1, 0.0f},      /* q|k|v in one buffer (multi-query), a shared mask */
        {2, 2, 2, 64, 150, 150, 1, 1, 0, 0, 0, 0, 0.1f},   /* several tiles of queries and keys, lengths, dropout */
        {1, 2, 2, 32, 200, 200, 1, 0, 0, 40, 3, 0, 0.0f},  /* a window that skips whole key tiles, sinks */
        {2, 2, 2, 40, 70, 130, 0, 1, 2, 0, 0, 0, 0.0f},    /* cross, 40 channels padded to 48, a mask per row */
        {1, 4, 1, 128, 70, 70, 1, 0, 1, 0, 0, 1, 0.1f},    /* 128 channels, a group of 4 heads, fused, mask */
        {2, 3, 3, 12, 45, 45, 1, 1, 0, 0, 0, 0, 0.0f},     /* 12 channels: fp32 rows in 16-byte loads, bf16 ones not */
        {1, 2, 2, 6, 20, 20, 0, 0, 0, 0, 0, 1, 0.0f},      /* 6 channels, fused (rows of 18): one element at a time */
        {2, 2, 1, 144, 30, 30, 1, 1, 0, 0, 0, 0, 0.1f},    /* wider heads: the batched products, in chunks */
        {1, 2, 2, 160, 21, 34, 0, 0, 2, 0, 0, 0, 0.0f},    /* wider, cross-attention with a mask per row */
    };
    for (int i = 0; i < CU_LEN(cases); i++) cu_bf16_attention_case(&cases[i]);
#ifdef TFM_CUDA_EMULATION
    CHECK_MSG(tfm_emu_gemm_bf16_calls() > calls0, "the attention ran no bf16 product");
#endif
}

/* Batch `seed` of a learnable sequence for cu_bf16_model: each row counts up from a random id x by a step of
   1 + x % 3, modulo the vocabulary; the targets are the next ids. */
static void cu_count_batch(cu_data *d, const tfm_config *c, uint64_t seed) {
    cu_rng g = {seed * 131 + 7};
    int B = CU_B, T = c->max_len, b, t;
    memset(d, 0, sizeof *d);
    d->b.batch = B;
    d->b.len = T;
    d->b.tokens = d->tokens;
    d->b.targets = d->targets;
    for (b = 0; b < B; b++) {
        int x = cu_int(&g, c->vocab_size), step = 1 + x % 3;
        for (t = 0; t < T; t++) {
            d->tokens[b * T + t] = x;
            x = (x + step) % c->vocab_size;
            d->targets[b * T + t] = x;
        }
    }
}

/* cfg.precision: an LM of cu_model_cfg's shape learns a counting task with bf16 products on the GPU and in
   fp32 on the CPU from the same weights, 100 steps: every loss of the bf16 run within 1% of the fp32 run's
   (bf16 differs by at most 0.6% here; a loss that falls to a third or less shows the training is real),
   some loss not bit-equal (bf16 ran); TF32 the same way. Not 300 steps (tools/bf16_tracking.cpp runs those, on text): on this task, batches of 16
   tokens, the runs part ways in the fast learning after step 100 whatever the precision (the means of
   25 steps differ by up to 7% with TF32, 19% with bf16, and the losses end at 0.145 and 0.127 against
   fp32's 0.124), so the check would measure the task's chaos, not the products. The thread's products are fp32
   again after each model call; the CPU refuses either precision, and tfm_model_to_device refuses to move
   a bf16 model there, leaving it as it was. */
static void cu_bf16_model(void) {
    tfm_config cc = cu_model_cfg(2, TFM_DEVICE_CPU), cg;
    tfm_model mc, mg;
    tfm_optim o = cu_optim();
    int steps = 100, i, p;
    cu_data *d = (cu_data *)malloc(sizeof(cu_data));
    float *lc = (float *)calloc((size_t)(3 * steps), sizeof(float));
    cc.dropout = cc.attn_dropout = 0.0f;
    cc.label_smoothing = 0.0f;
    o.total_steps = steps;
    o.lr = 1e-2f;
    if (!cu_init(&mc, &cc, "fp32")) {
        free(lc);
        free(d);
        return;
    }
    for (p = 1; p <= 2; p++) {
        const char *nm = p == TFM_PREC_BF16 ? "bf16" : "tf32";
        float *lg = lc + steps * p, worst = 0.0f;
        int bad = 0, first = -1, differ = 0, ok = 1;
        cg = cc;
        cg.device = TFM_DEVICE_CUDA;
        cg.precision = (tfm_precision)p;
        if (!cu_init(&mg, &cg, nm)) break;
        for (i = 0; i < steps && ok; i++) {
            float loss;
            cu_count_batch(d, &cc, (uint64_t)i);
            if (p == 1) {
                tfm_model_zero_grad(&mc);
                ok = tfm_model_forward(&mc, &d->b, &lc[i], NULL) == TFM_OK && tfm_model_backward(&mc, 1.0f) == TFM_OK &&
                     tfm_model_step(&mc, &o, NULL) == TFM_OK;
            }
            tfm_model_zero_grad(&mg);
            ok = ok && tfm_model_forward(&mg, &d->b, &loss, NULL) == TFM_OK;
            CHECK(tfm__model_prec == 0);
            ok = ok && tfm_model_backward(&mg, 1.0f) == TFM_OK && tfm_model_step(&mg, &o, NULL) == TFM_OK;
            lg[i] = loss;
            if (!ok) TEST__FAIL("%s training step %d: %s", nm, i, tfm_last_error());
        }
        for (i = 0; ok && i < steps; i++) {
            float e = fabsf(lg[i] - lc[i]) / lc[i];
            if (!(e <= 0.01f) && !bad++) first = i;
            if (e > worst) worst = e;
            differ += lg[i] != lc[i];
        }
        if (ok) {
            CHECK_MSG(!bad, "%s: %d of %d losses differ from fp32's by more than 1%% (first: step %d, %.6g against %.6g); worst %.3g",
                      nm, bad, steps, first, bad ? (double)lg[first] : 0.0, bad ? (double)lc[first] : 0.0, (double)worst);
            CHECK_MSG(differ > 0, "%s: every loss equals fp32's bit for bit: the precision did not apply", nm);
            CHECK_MSG(lc[steps - 1] < lc[0] / 3, "fp32 loss %.4f -> %.4f: the task was not learned", (double)lc[0],
                      (double)lc[steps - 1]);
            if (test__verbose)
                printf("    %s: loss %.4f -> %.4f (fp32 CPU %.4f -> %.4f), worst relative difference %.2e\n", nm, lg[0],
                       lg[steps - 1], lc[0], lc[steps - 1], (double)worst);
        }
        if (p == TFM_PREC_BF16) { /* the CPU refuses it; moving the model there too, which stays as it was */
            tfm_model m2;
            float before, after;
            cu_count_batch(d, &cc, 12345);
            CHECK_OK(tfm_model_forward(&mg, &d->b, &before, NULL));
            CHECK_ERR(tfm_model_to_device(&mg, TFM_DEVICE_CPU), TFM_E_ARG, "cfg.precision TFM_PREC_BF16 runs on the GPU only");
            CHECK(mg.params[0].value.device == TFM_DEVICE_CUDA && mg.cfg.precision == TFM_PREC_BF16);
            CHECK_OK(tfm_model_forward(&mg, &d->b, &after, NULL));
            CHECK(before == after);
            cg.device = TFM_DEVICE_CPU;
            CHECK_ERR(tfm_model_init(&m2, &cg, NULL, 0), TFM_E_ARG, "cfg.precision TFM_PREC_BF16 runs on the GPU only");
            cg.precision = (tfm_precision)3;
            CHECK_ERR(tfm_model_init(&m2, &cg, NULL, 0), TFM_E_ARG, "cfg.precision 3 is not a tfm_precision");
            /* its checkpoint (fp32) loads into an fp32 model on the CPU, bit for bit */
            CHECK_OK(tfm_model_save(&mg, cu_path("bf16.safetensors"), 0, NULL, 0));
            if (cu_init(&m2, &cc, "fp32 from a bf16 model's checkpoint")) {
                int64_t n1, n2;
                float *pg, *pc;
                CHECK_OK(tfm_model_load(&m2, cu_path("bf16.safetensors")));
                pg = cu_model_flat(&mg, 0, &n1);
                pc = cu_model_flat(&m2, 0, &n2);
                CHECK(n1 == n2);
                cu_check_params("a bf16 model's checkpoint on the CPU", &m2, pc, pg, 0.0);
                free(pg);
                free(pc);
                tfm_model_free(&m2);
            }
#ifdef TFM_CUDA_EMULATION
            { /* a failing bf16 product (a linear map's) or flash attention launch fails the call that ran it, and the
                 model works again after */
                const char *blas = cublasGetStatusString(CUBLAS_STATUS_EXECUTION_FAILED);
                float l2;
                CHECK_OK(tfm_cuda_set_graphs(0)); /* (a failure inside a captured forward makes it run again so) */
                cu_arm("cublasGemmEx", CUBLAS_STATUS_EXECUTION_FAILED, 0);
                cu_expect_cuda("bf16 forward, cublasGemmEx failing", tfm_model_forward(&mg, &d->b, &l2, NULL), "tfm_model_forward", blas);
                tfm__cu_optin[0] = 0; /* the flash kernel's shared-memory opt-in is asked for again, and fails */
                cu_arm("cudaFuncSetAttribute", cudaErrorInvalidValue, 0);
                cu_expect_cuda("bf16 forward, the flash attention's opt-in failing", tfm_model_forward(&mg, &d->b, &l2, NULL),
                               "tfm_model_forward", "flash attention's shared memory");
                CHECK_OK(tfm_cuda_set_graphs(1));
                CHECK_OK(tfm_model_forward(&mg, &d->b, &l2, NULL));
                CHECK(l2 == before);
            }
#endif
            { /* decoding (fp32 attention against the cache, bf16 products) and scoring run, and leave the thread fp32 */
                tfm_gen_opts go;
                int32_t prompt[2] = {1, 2}, out[8];
                int n_out = 0, t;
                float total = 0.0f;
                memset(&go, 0, sizeof go);
                go.max_new = 5;
                tfm_model_train(&mg, 0);
                CHECK_OK(tfm_model_generate(&mg, NULL, 0, prompt, 2, &go, out, &n_out));
                CHECK(n_out == 5);
                for (t = 0; t < n_out; t++) CHECK(out[t] >= 0 && out[t] < cc.vocab_size);
                CHECK_OK(tfm_model_score(&mg, NULL, 0, prompt, 2, out, n_out, NULL, &total));
                CHECK(isfinite(total) && total <= 0.0f);
                CHECK(tfm__model_prec == 0);
            }
        }
        tfm_model_free(&mg);
        if (!ok) break;
    }
    tfm_model_free(&mc);
    free(lc);
    free(d);
}


/* bf16 activations (tfm__bf16_store): in a bf16 model call the layernorm, the residual add and layernorm,
   and the MLP's bias and activation write each value rounded to bf16, in rows of tfm__bf16_ld(C) elements:
   bit for bit tfm__bf16 of what they write in fp32 (the statistics, sums and pre-activations the same
   bits too), the rows' padding untouched; and a linear map that takes such an operand as it is gives the
   same bits, forward and backward, as one that rounds the fp32 operand itself. The hidden layer's gradient
   (tfm__op_act_bwd_bf16): tfm__bf16 of the fp32 backward's, with or without the bias sums, and the MLP's first
   map's gradients from it (the bias's summed in the same pass) the same bits as from the fp32 one; SwiGLU's
   too (tfm__op_swiglu_bwd's bf16 form, no bias). C = 5
   and 12 pad their rows (to 8 and 16), 37 too (to 40). Then an LM head's logit gradients: the cross-entropy's backward writes
   them in bf16 (ignored rows zero, a batch of only ignored rows all zero): tfm__bf16 of what it adds into
   zeros in fp32; and the head's backward gives the same bits three ways: each product rounding its
   operands (tfm__bf16_acts_off), the logit gradients rounded once for both products, and taken in bf16
   as they are. */
static void cu_bf16_act_ops(void) {
    static const int Cs[] = {5, 12, 16, 37}, acts[] = {TFM_ACT_GELU, TFM_ACT_RELU, TFM_ACT_GELU_TANH, TFM_ACT_SWIGLU};
    cu_rng g = {31};
    int64_t N = 7, O = 9;
    for (int ci = 0; ci < CU_LEN(Cs); ci++)
        for (int v = 0; v < 4; v++) {
            int64_t C = Cs[ci], ld = tfm__bf16_ld(C), F = C + 3, F1 = acts[v] == TFM_ACT_SWIGLU ? 2 * F : F;
            int rms = v == 1;
            char name[120];
            cu_buf x = cu_normal(N * C, &g, 2, 1), r = cu_normal(N * C, &g, 1, 0), gn = cu_normal(C, &g, 0.5, 1),
                   bb = cu_normal(C, &g, 0.5, 0), w = cu_normal(F1 * C, &g, 0.3, 0), b1 = cu_normal(F1, &g, 0.3, 0),
                   w2 = cu_normal(O * C, &g, 0.3, 0), b2 = cu_normal(O, &g, 0.3, 0), dy = cu_normal(N * O, &g, 1, 0);
            cu_buf y32 = cu_nan(N * C), yb = cu_nan(N * C), m[2] = {cu_nan(N), cu_nan(N)}, rs[2] = {cu_nan(N), cu_nan(N)},
                   s[2] = {cu_nan(N * C), cu_nan(N * C)}, h32 = cu_nan(N * F), hb = cu_nan(N * F),
                   pre[2] = {cu_nan(N * F1), cu_nan(N * F1)}, pre32 = cu_nan(N * F1), out[2] = {cu_nan(N * O), cu_nan(N * O)},
                   dw[2] = {cu_zeros(O * C), cu_zeros(O * C)}, dx[2] = {cu_nan(N * C), cu_nan(N * C)};
            float *a, *bh;
            snprintf(name, sizeof name, "bf16 activations C=%lld %s act %d", (long long)C, rms ? "rmsnorm" : "layernorm", acts[v]);
            CHECK(tfm__bf16_store(TFM_DEVICE_CUDA, C) == 0); /* outside a bf16 model call: fp32 */
            tfm__model_prec = TFM_PREC_BF16;
            CHECK(tfm__bf16_store(TFM_DEVICE_CUDA, C) && !tfm__bf16_store(TFM_DEVICE_CPU, C) && !tfm__bf16_store(TFM_DEVICE_CUDA, 3));
            if (v & 2) { /* the residual add's kernel; else the layernorm's */
                tfm__op_add_layernorm(TFM_DEVICE_CUDA, s[0].d, y32.d, m[0].d, rs[0].d, x.d, r.d, 0, gn.d, bb.d, 1e-5f, N, C, rms, 0);
                tfm__op_add_layernorm(TFM_DEVICE_CUDA, s[1].d, yb.d, m[1].d, rs[1].d, x.d, r.d, 0, gn.d, bb.d, 1e-5f, N, C, rms, 1);
                { /* the added sub-layer output r rounded to bf16 (a bf16 model call's): read as bf16 rows (1) and rounded as
                     read (2), the same sums, norms and statistics to the bit as from r rounded on the host (cu_bf16_ref) */
                    cu_buf rr = cu_alloc(N * C), rb = cu_nan(N * C), o[3][4];
                    for (int64_t i = 0; i < N * C; i++) rr.h[i] = (float)cu_bf16_ref(r.h[i]);
                    cu_push(&rr);
                    tfm__op_to_bf16(TFM_DEVICE_CUDA, rb.d, ld, 0, r.d, C, N, C);
                    for (int k = 0; k < 3; k++) {
                        for (int q = 0; q < 4; q++) o[k][q] = cu_nan(q < 2 ? N * C : N);
                        tfm__op_add_layernorm(TFM_DEVICE_CUDA, o[k][0].d, o[k][1].d, o[k][2].d, o[k][3].d, x.d,
                                              k == 0 ? rr.d : k == 1 ? rb.d : r.d, k, gn.d, bb.d, 1e-5f, N, C, rms, 0);
                    }
                    for (int k = 1; k < 3; k++)
                        for (int q = 0; q < 4; q++) {
                            float *want = cu_fetch(o[0][q].d, o[0][q].n, TFM_DEVICE_CUDA), *got = cu_fetch(o[k][q].d, o[k][q].n, TFM_DEVICE_CUDA);
                            static const char *const what[] = {"sum", "norm", "mean", "rstd"};
                            if (!(q == 2 && rms))
                                cu_check_bits_arrays(cu_fmt("%s: the residual add's %s, the added output %s", name, what[q],
                                                            k == 1 ? "in bf16" : "rounded as read"), got, want, o[0][q].n);
                            free(want);
                            free(got);
                        }
                    for (int k = 0; k < 3; k++) cu_release(&o[k][0], &o[k][1], &o[k][2], &o[k][3], CU_END);
                    cu_release(&rr, &rb, CU_END);
                }
            } else {
                tfm__op_layernorm(TFM_DEVICE_CUDA, y32.d, m[0].d, rs[0].d, x.d, gn.d, v ? NULL : bb.d, 1e-5f, N, C, rms, 0);
                tfm__op_layernorm(TFM_DEVICE_CUDA, yb.d, m[1].d, rs[1].d, x.d, gn.d, v ? NULL : bb.d, 1e-5f, N, C, rms, 1);
            }
            /* the MLP's first map from either form of y: the same pre-activations, rounded to bf16 (pre[0] fp32,
               pre[1] bf16 where cuBLASLt writes it: pb); h in fp32 and in bf16 */
            int pb0 = tfm__op_linear_act(TFM_DEVICE_CUDA, acts[v], h32.d, pre[0].d, y32.d, w.d, b1.d, N, C, F, 0, 0);
            int pb = tfm__op_linear_act(TFM_DEVICE_CUDA, acts[v], hb.d, pre[1].d, yb.d, w.d, b1.d, N, C, F, 1, 1);
            tfm__op_linear(TFM_DEVICE_CUDA, pre32.d, F1, y32.d, C, w.d, b1.d, N, C, F1, 0); /* the map alone, fp32 */
            CHECK_MSG(!pb0, "%s: the fp32 hidden layer's pre-activations in bf16", name);
#ifdef TFM_CUDA_EMULATION
            CHECK_MSG(pb, "%s: the pre-activations not written in bf16 for the bf16 hidden layer", name);
#endif
            /* a linear map of y, forward and its weight's and input's gradients */
            for (int k = 0; k < 2; k++) {
                const float *xin = k ? yb.d : y32.d;
                int64_t ldx = k ? ld : C;
                tfm__op_linear(TFM_DEVICE_CUDA, out[k].d, O, xin, ldx, w2.d, b2.d, N, C, O, k);
                tfm__op_linear_bwd(TFM_DEVICE_CUDA, dx[k].d, C, 0.0f, dw[k].d, NULL, dy.d, O, xin, ldx, w2.d, N, C, O, k);
            }
            tfm__model_prec = 0;
            {
                cu_buf *pairs[][2] = {{&m[0], &m[1]}, {&rs[0], &rs[1]}, {&s[0], &s[1]}, {&out[0], &out[1]}, {&dw[0], &dw[1]},
                                      {&dx[0], &dx[1]}};
                static const char *const what[] = {"mean", "rstd", "sum", "linear map", "weight gradient", "input gradient"};
                for (int q = 0; q < CU_LEN(what); q++) {
                    int64_t n = pairs[q][0]->n;
                    if ((q == 0 && rms) || (q == 2 && !(v & 2))) continue;
                    a = cu_fetch(pairs[q][0]->d, n, TFM_DEVICE_CUDA);
                    bh = cu_fetch(pairs[q][1]->d, n, TFM_DEVICE_CUDA);
                    cu_check_bits_arrays(cu_fmt("%s: %s from the bf16 activation", name, what[q]), bh, a, n);
                    free(a);
                    free(bh);
                }
            }
            { /* the pre-activations: the map's fp32 output rounded (cu_bf16_ref), in fp32 (pre[0]) and in bf16 (pre[1]) */
                float *p32 = cu_fetch(pre32.d, N * F1, TFM_DEVICE_CUDA), *p0 = cu_fetch(pre[0].d, N * F1, TFM_DEVICE_CUDA);
                for (int64_t i = 0; i < N * F1; i++) p32[i] = (float)cu_bf16_ref(p32[i]);
                cu_check_bits_arrays(cu_fmt("%s: the pre-activations rounded in fp32", name), p0, p32, N * F1);
                free(p32);
                free(p0);
                p0 = NULL;
                if (pb) cu_check_bf16_rows(cu_fmt("%s: the pre-activations in bf16", name), pre32.d, pre[1].d, N, F1);
                else {
                    float *p1 = cu_fetch(pre[1].d, N * F1, TFM_DEVICE_CUDA);
                    p0 = cu_fetch(pre[0].d, N * F1, TFM_DEVICE_CUDA);
                    cu_check_bits_arrays(cu_fmt("%s: the pre-activations from the bf16 activation", name), p1, p0, N * F1);
                    free(p1);
                    free(p0);
                }
            }
            cu_check_bf16_rows(cu_fmt("%s: the norm's output", name), y32.d, yb.d, N, C);
            cu_check_bf16_rows(cu_fmt("%s: the hidden layer", name), h32.d, hb.d, N, F);
            { /* the hidden layer's backward: fp32; in bf16 with the bias sums (SwiGLU's without a bias); without */
                int sw = acts[v] == TFM_ACT_SWIGLU;
                cu_buf dh = cu_normal(N * F, &g, 1, 0), d[3] = {cu_nan(N * F1), cu_nan(N * F1), cu_nan(N * F1)},
                       gx[2] = {cu_nan(N * C), cu_nan(N * C)}, gw[2] = {cu_normal(F1 * C, &g, 1, 0), cu_zeros(F1 * C)},
                       gb[2] = {cu_normal(F1, &g, 1, 0), cu_zeros(F1)};
                memcpy(gw[1].h, gw[0].h, (size_t)(F1 * C) * sizeof(float)); /* gradients to add into, the same on both */
                memcpy(gb[1].h, gb[0].h, (size_t)F1 * sizeof(float));
                cu_push(&gw[1]);
                cu_push(&gb[1]);
                tfm__model_prec = TFM_PREC_BF16;
                if (sw) {
                    tfm__op_swiglu_bwd(TFM_DEVICE_CUDA, d[0].d, dh.d, 0, pre[0].d, N, F, 0, 0);
                    tfm__op_swiglu_bwd(TFM_DEVICE_CUDA, d[1].d, dh.d, 0, pre[1].d, N, F, 1, pb);
                } else {
                    tfm__op_act_bwd(TFM_DEVICE_CUDA, acts[v], d[0].d, dh.d, pre[0].d, N * F, 0.0f);
                    tfm__op_act_bwd_bf16(TFM_DEVICE_CUDA, acts[v], d[1].d, gb[1].d, dh.d, 0, pre[1].d, N, F, pb);
                    tfm__op_act_bwd_bf16(TFM_DEVICE_CUDA, acts[v], d[2].d, NULL, dh.d, 0, pre[1].d, N, F, pb);
                }
                tfm__op_linear_bwd(TFM_DEVICE_CUDA, gx[0].d, C, 0.0f, gw[0].d, sw ? NULL : gb[0].d, d[0].d, F1, yb.d, ld, w.d, N,
                                   C, F1, 1);
                tfm__op_linear_bwd(TFM_DEVICE_CUDA, gx[1].d, C, 0.0f, gw[1].d, NULL, d[1].d, tfm__bf16_ld(F1), yb.d, ld, w.d, N,
                                   C, F1, 3);
                tfm__model_prec = 0;
                cu_check_bf16_rows(cu_fmt("%s: the hidden layer's gradient", name), d[0].d, d[1].d, N, F1);
                if (!sw) cu_check_bf16_rows(cu_fmt("%s: the hidden layer's gradient, no bias", name), d[0].d, d[2].d, N, F1);
                {
                    cu_buf *pairs[][2] = {{&gx[0], &gx[1]}, {&gw[0], &gw[1]}, {&gb[0], &gb[1]}};
                    static const char *const what[] = {"input gradient", "weight gradient", "bias gradient"};
                    for (int q = 0; q < CU_LEN(what); q++) {
                        int64_t n = pairs[q][0]->n;
                        a = cu_fetch(pairs[q][0]->d, n, TFM_DEVICE_CUDA);
                        bh = cu_fetch(pairs[q][1]->d, n, TFM_DEVICE_CUDA);
                        cu_check_bits_arrays(cu_fmt("%s: the MLP's first map, %s from the bf16 hidden gradient", name, what[q]),
                                             bh, a, n);
                        free(a);
                        free(bh);
                    }
                }
                cu_release(&dh, &d[0], &d[1], &d[2], &gx[0], &gx[1], &gw[0], &gw[1], &gb[0], &gb[1], CU_END);
            }
            { /* the hidden layer's output gradient in bf16 (rows of tfm__bf16_ld(F), as the second map's backward writes
                 it): the same gradient (and bias sums) as from it rounded on the host (cu_bf16_ref), bit for bit */
                int sw = acts[v] == TFM_ACT_SWIGLU;
                cu_buf dh = cu_normal(N * F, &g, 1, 0), dr = cu_alloc(N * F), d16 = cu_nan(N * F), e[2] = {cu_nan(N * F1), cu_nan(N * F1)},
                       eb[2] = {cu_zeros(F1), cu_zeros(F1)};
                for (int64_t i = 0; i < N * F; i++) dr.h[i] = (float)cu_bf16_ref(dh.h[i]);
                cu_push(&dr);
                tfm__op_to_bf16(TFM_DEVICE_CUDA, d16.d, tfm__bf16_ld(F), 0, dh.d, F, N, F);
                tfm__model_prec = TFM_PREC_BF16;
                for (int k = 0; k < 2; k++) {
                    if (sw) tfm__op_swiglu_bwd(TFM_DEVICE_CUDA, e[k].d, k ? d16.d : dr.d, k, pre[1].d, N, F, 1, pb);
                    else tfm__op_act_bwd_bf16(TFM_DEVICE_CUDA, acts[v], e[k].d, eb[k].d, k ? d16.d : dr.d, k, pre[1].d, N, F, pb);
                }
                tfm__model_prec = 0;
                for (int q = 0; q < (sw ? 1 : 2); q++) {
                    cu_buf *p = q ? eb : e;
                    a = cu_fetch(p[0].d, p[0].n, TFM_DEVICE_CUDA);
                    bh = cu_fetch(p[1].d, p[1].n, TFM_DEVICE_CUDA);
                    cu_check_bits_arrays(cu_fmt("%s: the hidden layer's %s from its output gradient in bf16", name,
                                                q ? "bias sums" : "gradient"), bh, a, p[0].n);
                    free(a);
                    free(bh);
                }
                cu_release(&dh, &dr, &d16, &e[0], &e[1], &eb[0], &eb[1], CU_END);
            }
            cu_release(&x, &r, &gn, &bb, &w, &b1, &w2, &b2, &dy, &y32, &yb, &pre32, &m[0], &m[1], &rs[0], &rs[1], &s[0], &s[1], &h32,
                       &hb, &pre[0], &pre[1], &out[0], &out[1], &dw[0], &dw[1], &dx[0], &dx[1], CU_END);
        }
    for (int all_ignored = 0; all_ignored < 2; all_ignored++) {
        int64_t N2 = 6, V = 13, C2 = 12, cnt;
        int32_t t[6] = {1, -100, 12, 0, 5, -100};
        const char *name = all_ignored ? "logit gradients, every row ignored" : "logit gradients";
        cu_buf x = cu_normal(N2 * V, &g, 2, 0), lse = cu_nan(N2), d32 = cu_zeros(N2 * V), db = cu_nan(N2 * V),
               top = cu_normal(N2 * C2, &g, 1, 0), w = cu_normal(V * C2, &g, 0.3, 0), dx[3], dw[3];
        if (all_ignored)
            for (int i = 0; i < (int)N2; i++) t[i] = -100;
        float loss = tfm__op_cross_entropy(TFM_DEVICE_CUDA, lse.d, x.d, 0, t, -100, 0.1f, N2, V, &cnt, NULL);
        tfm__model_prec = TFM_PREC_BF16;
        tfm__op_cross_entropy_bwd(TFM_DEVICE_CUDA, d32.d, 0.7f, x.d, 0, lse.d, t, -100, 0.1f, N2, V, 0);
        tfm__op_cross_entropy_bwd(TFM_DEVICE_CUDA, db.d, 0.7f, x.d, 0, lse.d, t, -100, 0.1f, N2, V, 1);
        { /* the loss's pass writing the gradient for a loss scale of 1 too: the loss, log-sum-exps and gradient
             of the two passes to the bit */
            int64_t cnt1 = -1;
            cu_buf lse1 = cu_nan(N2), g1 = cu_nan(N2 * V), g2 = cu_nan(N2 * V);
            float loss1 = tfm__op_cross_entropy(TFM_DEVICE_CUDA, lse1.d, x.d, 0, t, -100, 0.1f, N2, V, &cnt1, g2.d);
            float *want, *got;
            tfm__op_cross_entropy_bwd(TFM_DEVICE_CUDA, g1.d, 1.0f, x.d, 0, lse.d, t, -100, 0.1f, N2, V, 1);
            CHECK_MSG(!memcmp(&loss, &loss1, sizeof loss) && cnt1 == cnt, "%s: the loss %.9g over %lld rows, with the gradient "
                      "in its pass %.9g over %lld", name, (double)loss, (long long)cnt, (double)loss1, (long long)cnt1);
            want = cu_fetch(lse.d, N2, TFM_DEVICE_CUDA);
            got = cu_fetch(lse1.d, N2, TFM_DEVICE_CUDA);
            cu_check_bits_arrays(cu_fmt("%s: log-sum-exps with the gradient in the loss's pass", name), got, want, N2);
            free(want);
            free(got);
            want = cu_fetch(g1.d, N2 * V, TFM_DEVICE_CUDA);
            got = cu_fetch(g2.d, N2 * V, TFM_DEVICE_CUDA);
            cu_check_bits_arrays(cu_fmt("%s: the bf16 gradient in the loss's pass", name), got, want, N2 * V);
            free(want);
            free(got);
            cu_release(&lse1, &g1, &g2, CU_END);
        }
        { /* the logits in bf16 (a bf16 training step's): rounded in place as cu_bf16_ref rounds them; read as bf16 rows,
             the loss, log-sum-exps and gradients (the loss's pass and the backward's) are those read from the rounded
             floats, to the bit, and the bf16 rows widened are those floats */
            int64_t ld = tfm__bf16_ld(V), cnt1 = -1, cnt2 = -1, off = 0;
            cu_buf xr = cu_nan(N2 * V), xb = cu_nan(N2 * V), xw = cu_nan(N2 * V), l[2] = {cu_nan(N2), cu_nan(N2)},
                   gl[2] = {cu_nan(N2 * V), cu_nan(N2 * V)}, gb[2] = {cu_nan(N2 * V), cu_nan(N2 * V)};
            float loss1, loss2, *got, *want;
            tfm__op_copy(TFM_DEVICE_CUDA, xr.d, x.d, N2 * V);
            tfm__op_bf16_rows(TFM_DEVICE_CUDA, xr.d, V, xr.d, 0, N2, V);
            tfm__op_to_bf16(TFM_DEVICE_CUDA, xb.d, ld, 0, x.d, V, N2, V);
            tfm__op_bf16_rows(TFM_DEVICE_CUDA, xw.d, V, xb.d, ld, N2, V);
            loss1 = tfm__op_cross_entropy(TFM_DEVICE_CUDA, l[0].d, xr.d, 0, t, -100, 0.1f, N2, V, &cnt1, gl[0].d);
            loss2 = tfm__op_cross_entropy(TFM_DEVICE_CUDA, l[1].d, xb.d, 1, t, -100, 0.1f, N2, V, &cnt2, gl[1].d);
            for (int k = 0; k < 2; k++)
                tfm__op_cross_entropy_bwd(TFM_DEVICE_CUDA, gb[k].d, 0.7f, k ? xb.d : xr.d, k, l[k].d, t, -100, 0.1f, N2, V, 1);
            got = cu_fetch(xr.d, N2 * V, TFM_DEVICE_CUDA);
            for (int64_t i = 0; i < N2 * V; i++) {
                float r = (float)cu_bf16_ref(x.h[i]);
                off += memcmp(&got[i], &r, sizeof r) != 0;
            }
            CHECK_MSG(!off, "%s: %lld of %lld logits rounded in place not as cu_bf16_ref rounds them", name, (long long)off,
                      (long long)(N2 * V));
            want = cu_fetch(xw.d, N2 * V, TFM_DEVICE_CUDA);
            cu_check_bits_arrays(cu_fmt("%s: bf16 logits widened", name), want, got, N2 * V);
            free(want);
            free(got);
            CHECK_MSG(!memcmp(&loss1, &loss2, sizeof loss1) && cnt1 == cnt && cnt2 == cnt, "%s: the loss %.9g from the "
                      "rounded logits, %.9g from them in bf16", name, (double)loss1, (double)loss2);
            for (int k = 0; k < 3; k++) {
                cu_buf *p = k == 0 ? l : k == 1 ? gl : gb;
                int64_t n = k ? N2 * V : N2;
                want = cu_fetch(p[0].d, n, TFM_DEVICE_CUDA);
                got = cu_fetch(p[1].d, n, TFM_DEVICE_CUDA);
                cu_check_bits_arrays(cu_fmt("%s: from bf16 logits, %s", name, k == 0 ? "the log-sum-exps" : k == 1 ?
                                            "the gradient in the loss's pass" : "the backward's gradient"), got, want, n);
                free(want);
                free(got);
            }
            cu_release(&xr, &xb, &xw, &l[0], &l[1], &gl[0], &gl[1], &gb[0], &gb[1], CU_END);
        }
        for (int k = 0; k < 3; k++) { /* k 0: each product rounds dy; 1: dy rounded once; 2: dy in bf16 */
            dx[k] = cu_nan(N2 * C2);
            dw[k] = cu_zeros(V * C2);
            tfm__bf16_acts_off = k == 0;
            tfm__op_linear_bwd(TFM_DEVICE_CUDA, dx[k].d, C2, 0.0f, dw[k].d, NULL, k == 2 ? db.d : d32.d, k == 2 ? tfm__bf16_ld(V) : V,
                               top.d, C2, w.d, N2, C2, V, k == 2 ? 2 : 0);
            tfm__bf16_acts_off = 0;
        }
        tfm__model_prec = 0;
        cu_check_bf16_rows(name, d32.d, db.d, N2, V);
        for (int k = 1; k < 3; k++) {
            float *a0 = cu_fetch(dx[0].d, N2 * C2, TFM_DEVICE_CUDA), *ak = cu_fetch(dx[k].d, N2 * C2, TFM_DEVICE_CUDA);
            cu_check_bits_arrays(cu_fmt("%s: the head's input gradient, %s", name, k == 1 ? "dy rounded once" : "dy in bf16"), ak, a0, N2 * C2);
            free(a0);
            free(ak);
            a0 = cu_fetch(dw[0].d, V * C2, TFM_DEVICE_CUDA);
            ak = cu_fetch(dw[k].d, V * C2, TFM_DEVICE_CUDA);
            cu_check_bits_arrays(cu_fmt("%s: the head's weight gradient, %s", name, k == 1 ? "dy rounded once" : "dy in bf16"), ak, a0, V * C2);
            free(a0);
            free(ak);
        }
        cu_release(&x, &lse, &d32, &db, &top, &w, &dx[0], &dx[1], &dx[2], &dw[0], &dw[1], &dw[2], CU_END);
    }
}

/* A bf16 model's training with bf16 activations against the rounding before each product
   (tfm__bf16_acts_off): each of the nine models, and an LM whose widths pad the bf16 rows (d_model 12,
   d_ff 20) or leave its hidden layer in fp32 (d_ff 3: 8 bf16 would not fit in 3 floats), trained 3 steps
   (--small: 2) from the same weights on the same batches, launch by launch, then as CUDA graphs: the same bits
   (losses, norms, parameters, gradients, moments), and an evaluation forward's logits the same bits. Under
   the emulation a step launches fewer kernels with them (the rounding passes gone). Under AddressSanitizer
   (a run for memory errors, which the plain run has done all eleven without) four of them: the pre-LN
   classifier with continuous inputs, the LM, the encoder-decoder with grouped-query heads, the LM whose
   hidden layer stays fp32. */
static void cu_bf16_acts(void) {
    int steps = cu_small ? 2 : 3;
    tfm_optim o = cu_optim();
    cu_data *d = (cu_data *)malloc(sizeof(cu_data));
    for (int which = 0; which < CU_N_MODELS + 2; which++) {
#if defined(__SANITIZE_ADDRESS__)
        if (which != 1 && which != 2 && which != 7 && which != CU_N_MODELS + 1) continue;
#endif
        tfm_config c = cu_model_cfg(which < CU_N_MODELS ? which : 2, TFM_DEVICE_CUDA);
        tfm_model m[2];
        const char *nm = which < CU_N_MODELS ? cu_model_names[which] : which == CU_N_MODELS ? "lm d_model 12 d_ff 20" : "lm d_model 12 d_ff 3";
#ifdef TFM_CUDA_EMULATION
        unsigned long long launches[2] = {0, 0}, qkv_bf[2] = {0, 0};
#endif
        c.precision = TFM_PREC_BF16;
        if (which % 2) c.dropout = 0.0f; /* (the sub-layers' outputs are bf16 only without dropout on them) */
        if (which >= CU_N_MODELS) {
            c.d_model = 12;
            c.n_heads = 2;
            c.d_ff = which == CU_N_MODELS ? 20 : 3;
        }
        if (!cu_init(&m[0], &c, nm)) break;
        if (!cu_init(&m[1], &c, nm)) {
            tfm_model_free(&m[0]);
            break;
        }
        for (int step = 0; step < steps; step++) {
            float loss[2], norm[2];
            int64_t cnt[2];
            cu_batch(d, &c, (uint64_t)(40 + step));
            for (int k = 0; k < 2; k++) { /* k 0: rounding before each product; 1: bf16 activations */
#ifdef TFM_CUDA_EMULATION
                unsigned long long l0 = tfm_emu_launches(), q0 = tfm_emu_lt_bf16_out_calls();
#endif
                CHECK_OK(tfm_cuda_set_graphs(step == steps - 1));
                tfm__bf16_acts_off = !k;
                CHECK_OK(tfm_model_train_step(&m[k], &d->b, &o, &loss[k], &cnt[k], &norm[k]));
                tfm__bf16_acts_off = 0;
#ifdef TFM_CUDA_EMULATION
                if (step < steps - 1) launches[k] += tfm_emu_launches() - l0;
                qkv_bf[k] += tfm_emu_lt_bf16_out_calls() - q0;
#endif
            }
            CHECK_OK(tfm_cuda_set_graphs(1));
            CHECK_MSG(!memcmp(&loss[0], &loss[1], sizeof(float)) && cnt[0] == cnt[1] && !memcmp(&norm[0], &norm[1], sizeof(float)),
                      "%s step %d: loss %.9g / %.9g, norm %.9g / %.9g with the rounding before each product / bf16 activations",
                      nm, step, loss[0], loss[1], norm[0], norm[1]);
            cu_check_state(cu_fmt("%s step %d, bf16 activations", nm, step), &m[1], &m[0], 1);
            { /* the step's logits: an LM's or encoder-decoder's rounded to bf16 (each value's low 16 bits zero), kept
                 in bf16 with bf16 activations and widened when asked; the same bits both ways */
                int head = c.kind != TFM_MODEL_ENCODER_CLASSIFIER;
                int64_t odd = 0;
                float *lg[2];
                tfm_tensor t[2];
                CHECK_MSG(m[1].impl->logits_bf == head && !m[0].impl->logits_bf, "%s step %d: the step's logits %s bf16", nm,
                          step, m[1].impl->logits_bf ? "in" : "not in");
                for (int k = 0; k < 2; k++) {
                    t[k] = tfm_model_logits(&m[k]);
                    lg[k] = cu_fetch(t[k].data, tfm_numel(&t[k]), t[k].device);
                }
                CHECK(!m[1].impl->logits_bf && t[1].data == m[1].impl->logits);
                cu_check_bits_arrays(cu_fmt("%s step %d: the step's logits with bf16 activations", nm, step), lg[1], lg[0],
                                     tfm_numel(&t[0]));
                for (int64_t i = 0; head && i < tfm_numel(&t[0]); i++) {
                    uint32_t u;
                    memcpy(&u, &lg[0][i], sizeof u);
                    odd += (u & 0xffffu) != 0;
                }
                CHECK_MSG(!odd, "%s step %d: %lld of the step's logits not bf16 values", nm, step, (long long)odd);
                free(lg[0]);
                free(lg[1]);
            }
        }
#ifdef TFM_CUDA_EMULATION
        CHECK_MSG(launches[1] < launches[0], "%s: %llu launches in %d steps with bf16 activations, %llu without", nm,
                  launches[1], steps - 1, launches[0]);
        {
            /* q|k|v written in bf16 by self-attention's product where the flash kernels read them: without rotary
               positions (every self-attention layer then, a product a layer and step); with rotary positions by the
               rotation, from the product in the backward's scratch. The MLP's pre-activations written in bf16 by
               its first product where its hidden layer is bf16, and the hidden layer's output gradient by the
               second map's backward (two products a layer and step). An LM's or
               encoder-decoder's logits written in bf16 by the head's product (a product a step). Without dropout,
               each sub-layer's output by its last product (a product a sub-layer and step). Each attention's
               output gradient for the flash backward by its output projection's backward (a product an
               attention and step). */
            tfm_block *top = m[1].impl->n_dec ? &m[1].impl->dec[m[1].impl->n_dec - 1] : &m[1].impl->enc[m[1].impl->n_enc - 1];
            int bf_h = tfm__bf16_ld(c.d_ff) <= 2 * c.d_ff, head = c.kind != TFM_MODEL_ENCODER_CLASSIFIER;
            unsigned long long layers = (unsigned long long)(m[1].impl->n_enc + m[1].impl->n_dec), subs = 0, attn = 0;
            for (int l = 0; l < m[1].impl->n_enc + m[1].impl->n_dec; l++) {
                const tfm_block *bl = l < m[1].impl->n_enc ? &m[1].impl->enc[l] : &m[1].impl->dec[l - m[1].impl->n_enc];
                if (c.dropout == 0.0f) subs += (unsigned long long)bl->n_sub;
                attn += 1 + (bl->desc.cross != 0);
            }
            unsigned long long want = (unsigned long long)steps * (layers * ((c.pos != TFM_POS_ROPE) + 2 * bf_h) + head + subs + attn);
            CHECK_MSG(!qkv_bf[0] && qkv_bf[1] == want, "%s: %llu products wrote bf16 with bf16 activations (want %llu), "
                      "%llu without", nm, qkv_bf[1], want, qkv_bf[0]);
            CHECK_MSG(top->self_attn.qbf, "%s: the last self-attention's q|k|v not in bf16", nm);
            CHECK_MSG(top->bf_pre == bf_h, "%s: the last MLP's pre-activations %s bf16", nm, top->bf_pre ? "in" : "not in");
            CHECK_MSG(top->self_attn.obf, "%s: the last self-attention's output not in bf16", nm);
        }
        if (test__verbose)
            printf("    %s: %llu launches in %d steps, %llu without bf16 activations\n", nm, launches[1], steps - 1, launches[0]);
#endif
        { /* an evaluation forward */
            float l[2], *lg[2];
            tfm_tensor t[2];
            for (int k = 0; k < 2; k++) {
                tfm_model_train(&m[k], 0);
                tfm__bf16_acts_off = !k;
                CHECK_OK(tfm_model_forward(&m[k], &d->b, &l[k], NULL));
                tfm__bf16_acts_off = 0;
                t[k] = tfm_model_logits(&m[k]);
                lg[k] = cu_fetch(t[k].data, tfm_numel(&t[k]), t[k].device);
            }
            CHECK(!memcmp(&l[0], &l[1], sizeof(float)));
            cu_check_bits_arrays(cu_fmt("%s: evaluation logits with bf16 activations", nm), lg[1], lg[0], tfm_numel(&t[0]));
            free(lg[0]);
            free(lg[1]);
        }
        tfm_model_free(&m[0]);
        tfm_model_free(&m[1]);
    }
    free(d);
}

/* A bf16 model's generation calls round its weights once, at their start, into a bf16 twin that their
   products take (tfm__bf16_w), where each product rounded its weight itself: for the five models of
   cu_gen_cfg and one whose widths (12, 20) leave some weights' rows off the 16-byte alignment the twin
   needs (those round as before), greedy decoding and beam search give the same ids and beam scores to
   the bit with the twin as without (tfm__bf16_acts_off), also after a training step has changed the
   weights (a twin kept from the call before would not have them); under the emulation with fewer
   kernels, and without device space for the twin the same ids and no error; and no twin is left after
   the call. */
static void cu_bf16_gen_weights(void) {
    cu_data *d = (cu_data *)malloc(sizeof(cu_data));
    tfm_optim opt = cu_optim();
    for (int which = 0; which < 6; which++) {
        tfm_config c;
        tfm_model m;
        tfm_gen_opts o;
        int32_t src[6] = {4, 9, 1, 12, 3, 7}, prompt[3] = {2, 7, 5}, ids[2][9], beams[2][2 * 9];
        int encdec = which == 1, n_prompt = encdec ? 1 : 3, n[2], lens[2][2], found[2];
        float scores[2][2];
        const char *nm = which == 5 ? "lm d_model 12 d_ff 20" : encdec ? "encdec" : which == 3 ? "lm gqa" : which == 4 ? "lm rope window"
                                                                                                       : which ? "lm rope" : "lm";
        cu_gen_cfg(&c, which == 5 ? 0 : which, 3, TFM_DEVICE_CUDA);
        c.precision = TFM_PREC_BF16;
        if (which == 5) {
            c.d_model = 12;
            c.n_heads = 2;
            c.d_ff = 20;
        }
        if (!cu_init(&m, &c, nm)) break;
        memset(&o, 0, sizeof o);
        o.max_new = encdec ? 8 : 9;
        for (int round = 0; round < 2; round++) {
#ifdef TFM_CUDA_EMULATION
            unsigned long long launches[2];
#endif
            if (round) { /* the weights change */
                tfm_config cb = c; /* a batch of cu_data's sizes */
                cb.max_len = CU_T;
                cb.max_tgt_len = encdec ? CU_T : 0;
                tfm_model_train(&m, 1);
                cu_batch(d, &cb, 5);
                CHECK_OK(tfm_model_train_step(&m, &d->b, &opt, NULL, NULL, NULL));
            }
            tfm_model_train(&m, 0);
            for (int k = 0; k < 2; k++) { /* k 0: each product rounds its weight; 1: the twin */
#ifdef TFM_CUDA_EMULATION
                unsigned long long l0 = tfm_emu_launches();
#endif
                tfm__bf16_acts_off = !k;
                o.beam_width = 0;
                CHECK_OK(tfm_model_generate(&m, encdec ? src : NULL, 6, prompt, n_prompt, &o, ids[k], &n[k]));
                o.beam_width = 3;
                CHECK_OK(tfm_model_beam_search(&m, encdec ? src : NULL, 6, prompt, n_prompt, &o, 2, beams[k], 9, lens[k],
                                               scores[k], &found[k]));
                tfm__bf16_acts_off = 0;
                CHECK_MSG(!tfm__bf16_w.bf, "%s: a bf16 twin is left after the calls", nm);
#ifdef TFM_CUDA_EMULATION
                launches[k] = tfm_emu_launches() - l0;
#endif
            }
            cu_check_ids(cu_fmt("%s, round %d: greedy ids with the bf16 twin", nm, round), ids[1], n[1], ids[0], n[0]);
            CHECK_MSG(found[0] == found[1], "%s, round %d: beam search found %d with the twin, %d without", nm, round, found[1],
                      found[0]);
            for (int b = 0; b < found[0] && b < 2; b++) {
                cu_check_ids(cu_fmt("%s, round %d: beam %d with the bf16 twin", nm, round, b), beams[1] + 9 * b, lens[1][b],
                             beams[0] + 9 * b, lens[0][b]);
                CHECK_MSG(!memcmp(&scores[0][b], &scores[1][b], sizeof(float)), "%s, round %d: beam %d scores %.9g with the twin, %.9g without",
                          nm, round, b, scores[1][b], scores[0][b]);
            }
#ifdef TFM_CUDA_EMULATION
            if (which == 0 && round == 1) { /* no device space for the twin: the products round, no error */
                int32_t ids2[9];
                int n2 = 0;
                tfm_scratch_release();
                tfm_emu_fail_clear();
                tfm_emu_fail_next("cudaMalloc", cudaErrorMemoryAllocation, 0);
                o.beam_width = 0;
                CHECK_OK(tfm_model_generate(&m, NULL, 6, prompt, n_prompt, &o, ids2, &n2));
                CHECK_MSG(tfm_emu_fail_pending() == 0 && tfm__cu.wbf == NULL, "%s: the twin's allocation was not refused", nm);
                tfm_emu_fail_clear();
                cu_check_ids(cu_fmt("%s: greedy ids without space for the twin", nm), ids2, n2, ids[0], n[0]);
            }
            CHECK_MSG(launches[1] < launches[0], "%s, round %d: %llu kernels with the bf16 twin, %llu without", nm, round,
                      launches[1], launches[0]);
            if (test__verbose) printf("    %s: %llu kernels with the bf16 twin, %llu without\n", nm, launches[1], launches[0]);
#endif
        }
        tfm_model_free(&m);
    }
    free(d);
}

/* ==== main ============================================================================================== */

static void suite_device(void) { RUN(cu_device); }

static void suite_precision(void) {
    RUN(cu_bf16_round);
    RUN(cu_mma16816);
    RUN(cu_wgmma);
    RUN(cu_fexp);
    RUN(cu_bf16_gemm);
    RUN(cu_bf16_attention);
    RUN(cu_bf16_model);
    RUN(cu_bf16_act_ops);
    RUN(cu_bf16_acts);
    RUN(cu_bf16_gen_weights);
}

static void suite_ops(void) {
    RUN(cu_op_copy);
    RUN(cu_op_scatter_rows);
    RUN(cu_op_gemm);
    RUN(cu_op_linear);
    RUN(cu_lt_bias);
    RUN(cu_op_softmax);
    RUN(cu_op_cross_entropy);
    RUN(cu_op_argmax);
    RUN(cu_op_layernorm);
    RUN(cu_op_act);
    RUN(cu_op_linear_act);
    RUN(cu_op_rope);
    RUN(cu_op_dropout);
    RUN(cu_op_embedding);
    RUN(cu_op_kept);
    RUN(cu_op_positions);
    RUN(cu_op_add);
    RUN(cu_op_pool);
    RUN(cu_op_adamw);
}

static void suite_attention(void) {
    RUN(cu_op_attention_sizes);
    RUN(cu_op_attention_masks);
    RUN(cu_op_attention_one_key);
    RUN(cu_op_attention_decode);
    RUN(cu_op_attention_dropout_mask);
}

static void suite_public(void) {
    RUN(cu_pub_matmul);
    RUN(cu_pub_linear);
    RUN(cu_pub_softmax);
    RUN(cu_pub_layernorm);
    RUN(cu_pub_elementwise);
    RUN(cu_pub_embedding);
    RUN(cu_pub_add_pool);
    RUN(cu_pub_attention);
    RUN(cu_pub_adamw);
    RUN(cu_pub_fill_copy);
}

static void suite_layers(void) {
    RUN(cu_block_self);
    RUN(cu_block_cross);
    RUN(cu_layers_small);
}

static void suite_models(void) {
    RUN(cu_model_classifier);
    RUN(cu_model_classifier_cls);
    RUN(cu_model_lm);
    RUN(cu_model_encdec);
    RUN(cu_model_encdec_shared);
    RUN(cu_model_bert);
    RUN(cu_model_rope);
    RUN(cu_model_gqa);
    RUN(cu_model_window);
    RUN(cu_train_graphs);
    RUN(cu_train_replay);
    RUN(cu_forward_graphs);
    RUN(cu_nan_weights);
}

static void suite_generate(void) {
    RUN(cu_gen_lm);
    RUN(cu_gen_encdec);
    RUN(cu_gen_rope);
    RUN(cu_gen_gqa);
    RUN(cu_gen_window);
    RUN(cu_gen_wide_beam);
    RUN(cu_gen_graphs);
    RUN(cu_gen_kept_cache);
    RUN(cu_graph_replay_rules);
#ifdef TFM_CUDA_EMULATION
    RUN(cu_gen_step_ops);
#endif
}

static void suite_io(void) {
    RUN(cu_io_gpu_checkpoint);
    RUN(cu_io_cpu_checkpoint);
    RUN(cu_io_mapped);
    RUN(cu_io_to_device);
    RUN(cu_dist);
}

static void suite_errors(void) {
    RUN(cu_err_mixed);
#ifdef TFM_CUDA_EMULATION
    RUN(cu_err_no_cuda);
    RUN(cu_err_injected);
    RUN(cu_err_sweep);
#endif
    RUN(cu_err_nomem);
}

int main(int argc, char **argv) {
    char info[256];
    int i;
    test__begin = cu_begin;
    test__note = cu_note;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) test__verbose = 1;
        else if (!strcmp(argv[i], "--small")) cu_small = 1;
        else if (!strcmp(argv[i], "--full")) cu_small = 0;
        else if (!strcmp(argv[i], "--shard") && i + 1 < argc) {
            if (!test_shard_arg(argv[++i])) return 2;
        } else test__filter = argv[i];
    }
    if (tfm_cuda_available() != TFM_OK) {
#ifdef TFM_CUDA_EMULATION
        printf("the emulated device is not available: %s\n", tfm_last_error());
        return 1;
#else
        printf("no CUDA device: skipped (%s)\n", tfm_last_error());
        return 0;
#endif
    }
    if (tfm_cuda_device_info(info, sizeof info) != TFM_OK) {
        printf("tfm_cuda_device_info failed: %s\n", tfm_last_error());
        info[0] = 0;
    }
#ifdef TFM_CUDA_EMULATION
    printf("transformer.h CUDA tests on the CPU emulation (tests/cuda_emu.h): %s%s\n", info, cu_small ? ", small shapes" : "");
#else
    printf("transformer.h CUDA tests on %s%s\n", info, cu_small ? ", small shapes" : "");
#endif
    cu_suite("device", suite_device);
    cu_suite("ops", suite_ops);
    cu_suite("attention", suite_attention);
    cu_suite("public", suite_public);
    cu_suite("layers", suite_layers);
    cu_suite("models", suite_models);
    cu_suite("precision", suite_precision);
    cu_suite("generate", suite_generate);
    cu_suite("io", suite_io);
    cu_suite("errors", suite_errors);
    cu_cleanup_files();
#ifndef TFM_CUDA_EMULATION
    printf("(errors: the no-device and injected-failure tests need the emulation, skipped on a GPU)\n");
#endif
    tfm_scratch_release();
    printf("%d passed, %d failed\n", test__passed, test__failed);
    return test__failed ? 1 : 0;
}
