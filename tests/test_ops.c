/* tests/test_ops.c - every op of >>api-ops: forward against a naive reference, backward against
   central finite differences.

   Method, the same for every op:
   - the inputs are float32 values; the reference forward is written from the math in double and
     evaluated on exactly those values (it does not follow the library's code);
   - the library's float32 forward is compared with it;
   - for L = sum_i y[i] r[i] with fixed random weights r (float values, passed as dy), the gradient
     of every input and parameter is taken by central differences of the double reference,
         dL/dx[j] ~ (L(x + h e_j) - L(x - h e_j)) / 2h,   h = 1e-6,
     and the library's backward (into zeroed buffers) is compared with it;
   - a second backward call must add the same gradient again (buffers hold 2x), since backward
     functions accumulate.
   Errors are reported as test_rel_err: max |got - want| / max |want|. Every op also runs on a tensor
   of a few thousand elements, so that its threaded loops are exercised; there the differences are
   taken row by row, or the exact gradient of a linear op is used (see OPS_FULL_FD_MAX).

   Tolerances, from float32 precision (unit roundoff u = 2^-24 ~ 6e-8):
   - OPS_TOL_FWD 1e-5. The forwards here are dot products and row reductions of at most 130 terms,
     plus exp/log/erf/tanh/sqrt that a float libm gets right to a few ulps. Summed in any order, such
     a reduction is off by at most ~n u ~ 8e-6 of the largest term (Higham 3.1), typically sqrt(n) u
     ~ 1e-6, so 1e-5 holds for any correct kernel. A wrong index or a missed term shows up at 1e-2
     or more.
   - OPS_TOL_GRAD 1e-4. A backward is a second reduction of the same length over quantities that
     partly cancel (softmax: y (dy - sum y dy); layernorm: three terms of similar size), which can
     cost a factor ~10 relative to the largest gradient. The finite-difference reference itself is
     good to ~h^2 |f'''| + 1e-16 |L| / h ~ 1e-10 relative, negligible next to that. The hardest
     case is log-softmax of logits near +-1000: its float output x - lse carries ulp(1000) ~ 6e-5 of
     absolute error, which backward meets through exp(y); that costs ~1e-5, still 10x inside.
   - OPS_TOL_ACC 1e-6. Two calls of the same backward on the same data add the same float values;
     a kernel that accumulates in place (beta = 1) may round the sum differently by an ulp or so. */

#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define OPS_TOL_FWD 1e-5
#define OPS_TOL_GRAD 1e-4
#define OPS_TOL_ACC 1e-6
#define OPS_FD_H 1e-6
#define OPS_PI 3.14159265358979323846

/* ---- helpers ---------------------------------------------------------------------------- */

/* splitmix64: the test's own random numbers, independent of the library's tfm_rng */
typedef struct ops_rng { uint64_t s; } ops_rng;

static uint64_t ops_next(ops_rng *g) {
    uint64_t z = (g->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [0, 1) */
static double ops_unif(ops_rng *g) { return (double)(ops_next(g) >> 11) * (1.0 / 9007199254740992.0); }

static float ops_normal(ops_rng *g) {
    double u1 = 1.0 - ops_unif(g), u2 = ops_unif(g);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * OPS_PI * u2));
}

static float *ops_falloc(int64_t n) { return (float *)calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }
static double *ops_dalloc(int64_t n) { return (double *)calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }
static int32_t *ops_ialloc(int64_t n) { return (int32_t *)calloc((size_t)(n > 0 ? n : 1), sizeof(int32_t)); }

/* x[i] = shift + scale * N(0,1) */
static void ops_fill_normal(float *x, int64_t n, ops_rng *g, double scale, double shift) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(shift + scale * (double)ops_normal(g));
}

/* |x[i]| uniform in [lo, hi), random sign: values kept away from 0 */
static void ops_fill_away0(float *x, int64_t n, ops_rng *g, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) {
        double v = lo + (hi - lo) * ops_unif(g);
        x[i] = (float)((ops_next(g) & 1) ? v : -v);
    }
}

/* outputs start as NaN: a forward must write every element without reading it */
static void ops_fill_nan(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
}

static double *ops_to_double(const float *x, int64_t n) {
    double *d = ops_dalloc(n);
    for (int64_t i = 0; i < n; i++) d[i] = (double)x[i];
    return d;
}

/* number of elements that are not equal (NaN counts as unequal) */
static int64_t ops_count_ne(const float *a, const float *b, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += !(a[i] == b[i]);
    return c;
}

static tfm_tensor ops_t(float *d, int nd, const int64_t *s) {
    switch (nd) {
    case 1: return tfm_tensor1(d, s[0]);
    case 2: return tfm_tensor2(d, s[0], s[1]);
    case 3: return tfm_tensor3(d, s[0], s[1], s[2]);
    default: return tfm_tensor4(d, s[0], s[1], s[2], s[3]);
    }
}

static int64_t ops_prod(int nd, const int64_t *s) {
    int64_t p = 1;
    for (int i = 0; i < nd; i++) p *= s[i];
    return p;
}

static const char *ops_w(char *buf, size_t n, const char *base, const char *part) {
    snprintf(buf, n, "%s: %s", base, part);
    return buf;
}
/* "<case name>: <part>", for check messages; needs `char nm[], wb[]` in scope */
#define OPS_W(part) ops_w(wb, sizeof wb, nm, (part))

/* A reference forward in double: reads the inputs in[0..], writes the outputs y. */
typedef void (*ops_ref_fn)(const void *ctx, double *const *in, double *y);

static double ops_dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* got (ny floats) against the reference forward */
static void ops_check_fwd(const char *what, const float *got, ops_ref_fn f, const void *ctx,
                          double *const *in, int64_t ny) {
    double *y = ops_dalloc(ny);
    f(ctx, in, y);
    CHECK_REL(what, test_rel_err(got, y, (size_t)ny), OPS_TOL_FWD);
    free(y);
}

/* got (nk floats) against dL/d in[k] by central differences, L = sum y r */
static void ops_check_grad(const char *what, const float *got, ops_ref_fn f, const void *ctx,
                           double *const *in, int k, int64_t nk, const double *r, int64_t ny) {
    double *y = ops_dalloc(ny), *fd = ops_dalloc(nk);
    for (int64_t j = 0; j < nk; j++) {
        double x0 = in[k][j], xp = x0 + OPS_FD_H, xm = x0 - OPS_FD_H, lp, lm;
        in[k][j] = xp;
        f(ctx, in, y);
        lp = ops_dot(y, r, ny);
        in[k][j] = xm;
        f(ctx, in, y);
        lm = ops_dot(y, r, ny);
        in[k][j] = x0;
        fd[j] = (lp - lm) / (xp - xm);
    }
    CHECK_REL(what, test_rel_err(got, fd, (size_t)nk), OPS_TOL_GRAD);
    free(y);
    free(fd);
}

/* The same for ops whose rows do not interact (softmax, layernorm's dx, element-wise ops): the
   finite differences of row n are taken on a one-row problem ctx1 whose inputs are the row's slices
   in[i] + n * istride[i] (istride 0: shared by all rows) and whose weights are r + n * ostride.
   Mathematically this is the same gradient as the whole-tensor difference, at 1/rows of the cost,
   which keeps tensors large enough for the threaded loops cheap to check. set_row (may be NULL)
   points ctx1 at row n's other data (targets). in[k] holds rows * istride[k] values. */
typedef void (*ops_row_fn)(void *ctx1, int64_t n);

static void ops_check_grad_rows(const char *what, const float *got, ops_ref_fn f, void *ctx1,
                                ops_row_fn set_row, double *const *in, int nin, const int64_t *istride,
                                int k, int64_t rows, const double *r, int64_t ostride, int64_t ny1) {
    int64_t nk = istride[k];
    double *y = ops_dalloc(ny1), *fd = ops_dalloc(rows * nk), *sub[4];
    for (int64_t n = 0; n < rows; n++) {
        const double *rn = r + n * ostride;
        for (int i = 0; i < nin; i++) sub[i] = in[i] + n * istride[i];
        if (set_row) set_row(ctx1, n);
        for (int64_t j = 0; j < nk; j++) {
            double x0 = sub[k][j], xp = x0 + OPS_FD_H, xm = x0 - OPS_FD_H, lp, lm;
            sub[k][j] = xp;
            f(ctx1, sub, y);
            lp = ops_dot(y, rn, ny1);
            sub[k][j] = xm;
            f(ctx1, sub, y);
            lm = ops_dot(y, rn, ny1);
            sub[k][j] = x0;
            fd[n * nk + j] = (lp - lm) / (xp - xm);
        }
    }
    CHECK_REL(what, test_rel_err(got, fd, (size_t)(rows * nk)), OPS_TOL_GRAD);
    free(y);
    free(fd);
}

/* Large tensors (a few thousand elements, where the library's loops run on threads) would make
   whole-tensor differences slow: above OPS_FULL_FD_MAX elements the row-wise ops are differenced row
   by row (above), and for the linear ops (linear, embeddings, pooling) above OPS_FD_WORK_MAX
   (inputs x outputs) the reference is their exact gradient, which is what the finite differences
   of a linear map return anyway. */
#define OPS_FULL_FD_MAX 4096
#define OPS_FD_WORK_MAX 4000000.0

static void ops_check_vs(const char *what, const float *got, const double *want, int64_t n) {
    CHECK_REL(what, test_rel_err(got, want, (size_t)n), OPS_TOL_GRAD);
}

/* after a second backward call the buffer must hold twice what the first call left */
static void ops_check_twice(const char *what, const float *twice, const float *once, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double w = 2.0 * (double)once[i], d = fabs((double)twice[i] - w);
        if (d != d) {
            num = INFINITY;
            break;
        }
        if (d > num) num = d;
        if (fabs(w) > den) den = fabs(w);
    }
    CHECK_REL(what, den > 0 ? num / den : num, OPS_TOL_ACC);
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* c[l] = op(a[l]) op(b[l]); a is (M,K), or (K,M) when ta; b is (K,N), or (N,K) when tb */
typedef struct ops_mm { int64_t L, M, K, N; int ta, tb; } ops_mm;

static double ops_mm_a(const ops_mm *c, const double *a, int64_t l, int64_t m, int64_t k) {
    return c->ta ? a[(l * c->K + k) * c->M + m] : a[(l * c->M + m) * c->K + k];
}
static double ops_mm_b(const ops_mm *c, const double *b, int64_t l, int64_t k, int64_t n) {
    return c->tb ? b[(l * c->N + n) * c->K + k] : b[(l * c->K + k) * c->N + n];
}

static void ops_mm_ref(const void *ctx, double *const *in, double *y) {
    const ops_mm *c = (const ops_mm *)ctx;
    for (int64_t l = 0; l < c->L; l++)
        for (int64_t m = 0; m < c->M; m++)
            for (int64_t n = 0; n < c->N; n++) {
                double s = 0;
                for (int64_t k = 0; k < c->K; k++)
                    s += ops_mm_a(c, in[0], l, m, k) * ops_mm_b(c, in[1], l, k, n);
                y[(l * c->M + m) * c->N + n] = s;
            }
}

/* batched: 3-D tensors (L,.,.); else 2-D (L must be 1) */
static void ops_matmul_case(int batched, int64_t L, int64_t M, int64_t K, int64_t N, int ta, int tb,
                            ops_rng *g) {
    ops_mm c;
    char nm[128], wb[192];
    int64_t na = L * M * K, nb = L * K * N, nc = L * M * N;
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    float *a = ops_falloc(na), *b = ops_falloc(nb), *y = ops_falloc(nc), *dy = ops_falloc(nc);
    float *da = ops_falloc(na), *db = ops_falloc(nb), *da1 = ops_falloc(na), *db1 = ops_falloc(nb);
    tfm_tensor tA, tB, tC, tdA, tdB, tdC;
    double *ad, *bd, *r, *in[2];

    c.L = L; c.M = M; c.K = K; c.N = N; c.ta = ta; c.tb = tb;
    snprintf(nm, sizeof nm, "matmul %s L=%d M=%d K=%d N=%d tA=%d tB=%d", batched ? "3-D" : "2-D",
             (int)L, (int)M, (int)K, (int)N, ta, tb);
    ops_fill_normal(a, na, g, 1, 0);
    ops_fill_normal(b, nb, g, 1, 0);
    ops_fill_normal(dy, nc, g, 1, 0);
    ops_fill_nan(y, nc);
    if (batched) {
        tA = tfm_tensor3(a, L, ar, ac); tdA = tfm_tensor3(da, L, ar, ac);
        tB = tfm_tensor3(b, L, br, bc); tdB = tfm_tensor3(db, L, br, bc);
        tC = tfm_tensor3(y, L, M, N); tdC = tfm_tensor3(dy, L, M, N);
    } else {
        tA = tfm_tensor2(a, ar, ac); tdA = tfm_tensor2(da, ar, ac);
        tB = tfm_tensor2(b, br, bc); tdB = tfm_tensor2(db, br, bc);
        tC = tfm_tensor2(y, M, N); tdC = tfm_tensor2(dy, M, N);
    }
    ad = ops_to_double(a, na);
    bd = ops_to_double(b, nb);
    r = ops_to_double(dy, nc);
    in[0] = ad;
    in[1] = bd;

    CHECK_OK(tfm_matmul_forward(&tC, &tA, &tB, ta, tb));
    ops_check_fwd(OPS_W("forward"), y, ops_mm_ref, &c, in, nc);

    CHECK_OK(tfm_matmul_backward(&tdA, &tdB, &tdC, &tA, &tB, ta, tb));
    ops_check_grad(OPS_W("da"), da, ops_mm_ref, &c, in, 0, na, r, nc);
    ops_check_grad(OPS_W("db"), db, ops_mm_ref, &c, in, 1, nb, r, nc);

    memcpy(da1, da, (size_t)na * sizeof(float));
    memcpy(db1, db, (size_t)nb * sizeof(float));
    CHECK_OK(tfm_matmul_backward(&tdA, &tdB, &tdC, &tA, &tB, ta, tb));
    ops_check_twice(OPS_W("da accumulates"), da, da1, na);
    ops_check_twice(OPS_W("db accumulates"), db, db1, nb);

    /* a NULL gradient is skipped; the other one is still computed */
    memset(da, 0, (size_t)na * sizeof(float));
    CHECK_OK(tfm_matmul_backward(&tdA, NULL, &tdC, &tA, &tB, ta, tb));
    CHECK_REL(OPS_W("da with db NULL"), test_rel_err_f(da, da1, (size_t)na), OPS_TOL_ACC);
    memset(db, 0, (size_t)nb * sizeof(float));
    CHECK_OK(tfm_matmul_backward(NULL, &tdB, &tdC, &tA, &tB, ta, tb));
    CHECK_REL(OPS_W("db with da NULL"), test_rel_err_f(db, db1, (size_t)nb), OPS_TOL_ACC);

    free(a); free(b); free(y); free(dy); free(da); free(db); free(da1); free(db1);
    free(ad); free(bd); free(r);
}

/* Products large enough for the sgemm's blocking and threads. L is bilinear in (a, b), so its exact
   gradient is da = dc op(b)^T, db = op(a)^T dc (laid out as a and b are stored); finite differences
   would return the same numbers at a thousand times the cost, so here the formula is the reference. */
static void ops_matmul_big_case(int batched, int64_t L, int64_t M, int64_t K, int64_t N, int ta, int tb,
                                ops_rng *g) {
    ops_mm c;
    char nm[128], wb[192];
    int64_t na = L * M * K, nb = L * K * N, nc = L * M * N;
    float *a = ops_falloc(na), *b = ops_falloc(nb), *y = ops_falloc(nc), *dy = ops_falloc(nc);
    float *da = ops_falloc(na), *db = ops_falloc(nb);
    double *ad, *bd, *r, *rda = ops_dalloc(na), *rdb = ops_dalloc(nb), *in[2];
    tfm_tensor tA, tB, tC, tdA, tdB, tdC;

    c.L = L; c.M = M; c.K = K; c.N = N; c.ta = ta; c.tb = tb;
    snprintf(nm, sizeof nm, "matmul %s L=%d M=%d K=%d N=%d tA=%d tB=%d", batched ? "3-D" : "2-D", (int)L,
             (int)M, (int)K, (int)N, ta, tb);
    ops_fill_normal(a, na, g, 1, 0);
    ops_fill_normal(b, nb, g, 1, 0);
    ops_fill_normal(dy, nc, g, 1, 0);
    ops_fill_nan(y, nc);
    if (batched) {
        tA = tfm_tensor3(a, L, ta ? K : M, ta ? M : K); tdA = tfm_tensor3(da, L, ta ? K : M, ta ? M : K);
        tB = tfm_tensor3(b, L, tb ? N : K, tb ? K : N); tdB = tfm_tensor3(db, L, tb ? N : K, tb ? K : N);
        tC = tfm_tensor3(y, L, M, N); tdC = tfm_tensor3(dy, L, M, N);
    } else {
        tA = tfm_tensor2(a, ta ? K : M, ta ? M : K); tdA = tfm_tensor2(da, ta ? K : M, ta ? M : K);
        tB = tfm_tensor2(b, tb ? N : K, tb ? K : N); tdB = tfm_tensor2(db, tb ? N : K, tb ? K : N);
        tC = tfm_tensor2(y, M, N); tdC = tfm_tensor2(dy, M, N);
    }
    ad = ops_to_double(a, na);
    bd = ops_to_double(b, nb);
    r = ops_to_double(dy, nc);
    in[0] = ad;
    in[1] = bd;

    for (int64_t l = 0; l < L; l++) {
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                double s = 0;
                for (int64_t n = 0; n < N; n++) s += r[(l * M + m) * N + n] * ops_mm_b(&c, bd, l, k, n);
                rda[ta ? (l * K + k) * M + m : (l * M + m) * K + k] = s;
            }
        for (int64_t k = 0; k < K; k++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0;
                for (int64_t m = 0; m < M; m++) s += ops_mm_a(&c, ad, l, m, k) * r[(l * M + m) * N + n];
                rdb[tb ? (l * N + n) * K + k : (l * K + k) * N + n] = s;
            }
    }

    CHECK_OK(tfm_matmul_forward(&tC, &tA, &tB, ta, tb));
    ops_check_fwd(OPS_W("forward"), y, ops_mm_ref, &c, in, nc);
    CHECK_OK(tfm_matmul_backward(&tdA, &tdB, &tdC, &tA, &tB, ta, tb));
    CHECK_REL(OPS_W("da"), test_rel_err(da, rda, (size_t)na), OPS_TOL_GRAD);
    CHECK_REL(OPS_W("db"), test_rel_err(db, rdb, (size_t)nb), OPS_TOL_GRAD);

    free(a); free(b); free(y); free(dy); free(da); free(db);
    free(ad); free(bd); free(r); free(rda); free(rdb);
}

static void ops_test_matmul(void) {
    /* {L, M, K, N}: L = 0 means 2-D */
    static const int shapes[][4] = {{0, 1, 1, 1},  {0, 3, 17, 5}, {0, 17, 3, 1}, {0, 1, 5, 17},
                                    {0, 17, 1, 3}, {1, 5, 3, 17}, {2, 3, 17, 5}, {3, 17, 1, 3}};
    ops_rng g = {101};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int L = shapes[s][0];
                ops_matmul_case(L > 0, L > 0 ? L : 1, shapes[s][1], shapes[s][2], shapes[s][3], ta, tb,
                                &g);
            }
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            ops_matmul_big_case(1, 2, 33, 65, 20, ta, tb, &g);
            ops_matmul_big_case(0, 1, 70, 65, 50, ta, tb, &g);
        }
}

/* ---- linear ----------------------------------------------------------------------------- */

/* y[n,o] = sum_i x[n,i] w[o,i] + b[o]; in = {x, w, b} */
typedef struct ops_lin { int64_t N, In, O; int has_b; } ops_lin;

static void ops_lin_ref(const void *ctx, double *const *in, double *y) {
    const ops_lin *c = (const ops_lin *)ctx;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++) {
            double s = c->has_b ? in[2][o] : 0.0;
            for (int64_t i = 0; i < c->In; i++) s += in[0][n * c->In + i] * in[1][o * c->In + i];
            y[n * c->O + o] = s;
        }
}

/* the exact gradients of L = sum r y: dx = r w, dw = r^T x, db = column sums of r */
static void ops_lin_grads(const ops_lin *c, double *const *in, const double *r, double *dx, double *dw,
                          double *db) {
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t i = 0; i < c->In; i++) {
            double s = 0;
            for (int64_t o = 0; o < c->O; o++) s += r[n * c->O + o] * in[1][o * c->In + i];
            dx[n * c->In + i] = s;
        }
    for (int64_t o = 0; o < c->O; o++) {
        double sb = 0;
        for (int64_t i = 0; i < c->In; i++) {
            double s = 0;
            for (int64_t n = 0; n < c->N; n++) s += r[n * c->O + o] * in[0][n * c->In + i];
            dw[o * c->In + i] = s;
        }
        for (int64_t n = 0; n < c->N; n++) sb += r[n * c->O + o];
        db[o] = sb;
    }
}

/* B > 0: x is (B,T,In); B == 0: x is (T,In) */
static void ops_linear_case(int64_t B, int64_t T, int64_t In, int64_t O, int has_b, ops_rng *g) {
    ops_lin c;
    char nm[128], wb[192];
    int64_t N = (B > 0 ? B : 1) * T, nx = N * In, nw = O * In, ny = N * O;
    float *x = ops_falloc(nx), *w = ops_falloc(nw), *b = ops_falloc(O), *y = ops_falloc(ny);
    float *dy = ops_falloc(ny), *dx = ops_falloc(nx), *dw = ops_falloc(nw), *db = ops_falloc(O);
    float *dx1 = ops_falloc(nx), *dw1 = ops_falloc(nw), *db1 = ops_falloc(O);
    double *in[3], *r;
    tfm_tensor tx, ty, tdx, tdy, tw, tdw, tb, tdb;

    c.N = N; c.In = In; c.O = O; c.has_b = has_b;
    snprintf(nm, sizeof nm, "linear x=(%d,%d,%d) O=%d bias=%d", (int)B, (int)T, (int)In, (int)O, has_b);
    ops_fill_normal(x, nx, g, 1, 0);
    ops_fill_normal(w, nw, g, 0.5, 0);
    ops_fill_normal(b, O, g, 1, 0);
    ops_fill_normal(dy, ny, g, 1, 0);
    ops_fill_nan(y, ny);
    if (B > 0) {
        tx = tfm_tensor3(x, B, T, In); tdx = tfm_tensor3(dx, B, T, In);
        ty = tfm_tensor3(y, B, T, O); tdy = tfm_tensor3(dy, B, T, O);
    } else {
        tx = tfm_tensor2(x, T, In); tdx = tfm_tensor2(dx, T, In);
        ty = tfm_tensor2(y, T, O); tdy = tfm_tensor2(dy, T, O);
    }
    tw = tfm_tensor2(w, O, In); tdw = tfm_tensor2(dw, O, In);
    tb = tfm_tensor1(b, O); tdb = tfm_tensor1(db, O);
    in[0] = ops_to_double(x, nx);
    in[1] = ops_to_double(w, nw);
    in[2] = ops_to_double(b, O);
    r = ops_to_double(dy, ny);

    CHECK_OK(tfm_linear_forward(&ty, &tx, &tw, has_b ? &tb : NULL));
    ops_check_fwd(OPS_W("forward"), y, ops_lin_ref, &c, in, ny);

    CHECK_OK(tfm_linear_backward(&tdx, &tdw, has_b ? &tdb : NULL, &tdy, &tx, &tw));
    if ((double)(nx + nw + O) * (double)ny <= OPS_FD_WORK_MAX) {
        ops_check_grad(OPS_W("dx"), dx, ops_lin_ref, &c, in, 0, nx, r, ny);
        ops_check_grad(OPS_W("dw"), dw, ops_lin_ref, &c, in, 1, nw, r, ny);
        if (has_b) ops_check_grad(OPS_W("db"), db, ops_lin_ref, &c, in, 2, O, r, ny);
    } else {
        double *gx = ops_dalloc(nx), *gw = ops_dalloc(nw), *gb = ops_dalloc(O);
        ops_lin_grads(&c, in, r, gx, gw, gb);
        ops_check_vs(OPS_W("dx"), dx, gx, nx);
        ops_check_vs(OPS_W("dw"), dw, gw, nw);
        if (has_b) ops_check_vs(OPS_W("db"), db, gb, O);
        free(gx); free(gw); free(gb);
    }

    memcpy(dx1, dx, (size_t)nx * sizeof(float));
    memcpy(dw1, dw, (size_t)nw * sizeof(float));
    memcpy(db1, db, (size_t)O * sizeof(float));
    CHECK_OK(tfm_linear_backward(&tdx, &tdw, has_b ? &tdb : NULL, &tdy, &tx, &tw));
    ops_check_twice(OPS_W("dx accumulates"), dx, dx1, nx);
    ops_check_twice(OPS_W("dw accumulates"), dw, dw1, nw);
    if (has_b) ops_check_twice(OPS_W("db accumulates"), db, db1, O);

    /* NULL gradients are skipped (dx NULL: the first layer of a network) */
    memset(dw, 0, (size_t)nw * sizeof(float));
    memset(db, 0, (size_t)O * sizeof(float));
    CHECK_OK(tfm_linear_backward(NULL, &tdw, has_b ? &tdb : NULL, &tdy, &tx, &tw));
    CHECK_REL(OPS_W("dw with dx NULL"), test_rel_err_f(dw, dw1, (size_t)nw), OPS_TOL_ACC);
    if (has_b) CHECK_REL(OPS_W("db with dx NULL"), test_rel_err_f(db, db1, (size_t)O), OPS_TOL_ACC);
    memset(dx, 0, (size_t)nx * sizeof(float));
    CHECK_OK(tfm_linear_backward(&tdx, NULL, NULL, &tdy, &tx, &tw));
    CHECK_REL(OPS_W("dx with dw, db NULL"), test_rel_err_f(dx, dx1, (size_t)nx), OPS_TOL_ACC);

    free(x); free(w); free(b); free(y); free(dy); free(dx); free(dw); free(db);
    free(dx1); free(dw1); free(db1);
    free(in[0]); free(in[1]); free(in[2]); free(r);
}

static void ops_test_linear(void) {
    /* {B, T, In, O}: B = 0 means a 2-D x */
    static const int shapes[][4] = {{0, 1, 1, 1},  {0, 3, 17, 5}, {0, 17, 3, 1},
                                    {0, 5, 1, 17}, {2, 3, 17, 3}, {1, 17, 3, 17}};
    ops_rng g = {202};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int has_b = 0; has_b < 2; has_b++)
            ops_linear_case(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], has_b, &g);
    /* y (2,40,70): large enough for threads, O > 64 columns for the bias-gradient sums */
    ops_linear_case(2, 40, 65, 70, 1, &g);
    ops_linear_case(2, 40, 65, 70, 0, &g);
}

/* ---- softmax, log-softmax --------------------------------------------------------------- */

typedef struct ops_rows { int64_t N, V; } ops_rows;

/* y = exp(x - max) / sum exp(x - max), row by row (subtracting the max does not change the math) */
static void ops_softmax_ref(const void *ctx, double *const *in, double *y) {
    const ops_rows *c = (const ops_rows *)ctx;
    for (int64_t n = 0; n < c->N; n++) {
        const double *x = in[0] + n * c->V;
        double mx = x[0], s = 0;
        for (int64_t v = 1; v < c->V; v++) mx = x[v] > mx ? x[v] : mx;
        for (int64_t v = 0; v < c->V; v++) s += exp(x[v] - mx);
        for (int64_t v = 0; v < c->V; v++) y[n * c->V + v] = exp(x[v] - mx) / s;
    }
}

/* y = x - max - log sum exp(x - max) */
static void ops_log_softmax_ref(const void *ctx, double *const *in, double *y) {
    const ops_rows *c = (const ops_rows *)ctx;
    for (int64_t n = 0; n < c->N; n++) {
        const double *x = in[0] + n * c->V;
        double mx = x[0], s = 0;
        for (int64_t v = 1; v < c->V; v++) mx = x[v] > mx ? x[v] : mx;
        for (int64_t v = 0; v < c->V; v++) s += exp(x[v] - mx);
        for (int64_t v = 0; v < c->V; v++) y[n * c->V + v] = x[v] - mx - log(s);
    }
}

/* shift is added to the first row: with 1000 it overflows expf unless the max is subtracted */
static void ops_softmax_case(int is_log, int nd, const int64_t *sh, double shift, ops_rng *g) {
    ops_rows c;
    char nm[128], wb[192];
    int64_t n = ops_prod(nd, sh);
    float *x = ops_falloc(n), *y = ops_falloc(n), *z = ops_falloc(n), *dy = ops_falloc(n);
    float *dx = ops_falloc(n), *dx1 = ops_falloc(n);
    tfm_tensor tx = ops_t(x, nd, sh), ty = ops_t(y, nd, sh), tz = ops_t(z, nd, sh);
    tfm_tensor tdy = ops_t(dy, nd, sh), tdx = ops_t(dx, nd, sh);
    ops_ref_fn f = is_log ? ops_log_softmax_ref : ops_softmax_ref;
    double *in[1], *r;

    c.V = sh[nd - 1];
    c.N = n / c.V;
    snprintf(nm, sizeof nm, "%s N=%d V=%d %dd shift=%g", is_log ? "log_softmax" : "softmax", (int)c.N,
             (int)c.V, nd, shift);
    ops_fill_normal(x, n, g, 3, 0);
    for (int64_t v = 0; v < c.V; v++) x[v] += (float)shift;
    ops_fill_normal(dy, n, g, 1, 0);
    ops_fill_nan(y, n);
    in[0] = ops_to_double(x, n);
    r = ops_to_double(dy, n);

    CHECK_OK(is_log ? tfm_log_softmax_forward(&ty, &tx) : tfm_softmax_forward(&ty, &tx));
    ops_check_fwd(OPS_W("forward"), y, f, &c, in, n);

    /* backward reads the forward's output */
    CHECK_OK(is_log ? tfm_log_softmax_backward(&tdx, &tdy, &ty) : tfm_softmax_backward(&tdx, &tdy, &ty));
    if (n <= OPS_FULL_FD_MAX) {
        ops_check_grad(OPS_W("dx"), dx, f, &c, in, 0, n, r, n);
    } else {
        ops_rows c1 = c;
        int64_t st[1];
        c1.N = 1;
        st[0] = c.V;
        ops_check_grad_rows(OPS_W("dx"), dx, f, &c1, NULL, in, 1, st, 0, c.N, r, c.V, c.V);
    }
    memcpy(dx1, dx, (size_t)n * sizeof(float));
    CHECK_OK(is_log ? tfm_log_softmax_backward(&tdx, &tdy, &ty) : tfm_softmax_backward(&tdx, &tdy, &ty));
    ops_check_twice(OPS_W("dx accumulates"), dx, dx1, n);

    /* in place: y aliases x */
    memcpy(z, x, (size_t)n * sizeof(float));
    CHECK_OK(is_log ? tfm_log_softmax_forward(&tz, &tz) : tfm_softmax_forward(&tz, &tz));
    ops_check_fwd(OPS_W("forward in place"), z, f, &c, in, n);

    free(x); free(y); free(z); free(dy); free(dx); free(dx1);
    free(in[0]); free(r);
}

static void ops_test_softmax_both(int is_log) {
    static const int64_t s11[2] = {1, 1}, s317[2] = {3, 17}, s173[2] = {17, 3}, s264[2] = {2, 64};
    static const int64_t s1[1] = {5}, s235[3] = {2, 3, 5}, s4d[4] = {2, 1, 3, 17};
    static const int64_t s40x130[2] = {40, 130}, s2x33x65[3] = {2, 33, 65};
    ops_rng g = {303 + (uint64_t)is_log};
    ops_softmax_case(is_log, 2, s11, 0, &g);
    ops_softmax_case(is_log, 2, s317, 0, &g);
    ops_softmax_case(is_log, 2, s173, 0, &g);
    ops_softmax_case(is_log, 2, s264, 0, &g);
    ops_softmax_case(is_log, 1, s1, 0, &g);
    ops_softmax_case(is_log, 3, s235, 0, &g);
    ops_softmax_case(is_log, 4, s4d, 0, &g);
    ops_softmax_case(is_log, 2, s317, 1000, &g);
    ops_softmax_case(is_log, 2, s173, -1000, &g);
    ops_softmax_case(is_log, 2, s40x130, 0, &g);
    ops_softmax_case(is_log, 3, s2x33x65, 1000, &g);
}

static void ops_test_softmax(void) { ops_test_softmax_both(0); }
static void ops_test_log_softmax(void) { ops_test_softmax_both(1); }

/* ---- cross-entropy ---------------------------------------------------------------------- */

/* loss = mean over kept rows of (1-s)(lse - x[t]) + s mean_v(lse - x[v]); 0 when no row is kept */
typedef struct ops_ce { int64_t N, V; const int32_t *tg, *tg0; int ign; double s; } ops_ce;

/* one-row problems: row n's target */
static void ops_ce_set_row(void *ctx1, int64_t n) {
    ops_ce *c = (ops_ce *)ctx1;
    c->tg = c->tg0 + n;
}

static double ops_lse(const double *x, int64_t V) {
    double mx = x[0], s = 0;
    for (int64_t v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
    for (int64_t v = 0; v < V; v++) s += exp(x[v] - mx);
    return mx + log(s);
}

static void ops_ce_ref(const void *ctx, double *const *in, double *y) {
    const ops_ce *c = (const ops_ce *)ctx;
    double tot = 0;
    int64_t cnt = 0;
    for (int64_t n = 0; n < c->N; n++) {
        const double *x = in[0] + n * c->V;
        double lse, mean = 0;
        if (c->tg[n] == c->ign) continue;
        cnt++;
        lse = ops_lse(x, c->V);
        for (int64_t v = 0; v < c->V; v++) mean += x[v];
        mean /= (double)c->V;
        tot += (1.0 - c->s) * (lse - x[c->tg[n]]) + c->s * (lse - mean);
    }
    y[0] = cnt ? tot / (double)cnt : 0.0;
}

/* every third row (n % 3 == 1) gets ignore_index */
static void ops_ce_case(int nd, const int64_t *sh, int ign, float s, ops_rng *g) {
    ops_ce c;
    char nm[128], wb[192];
    int64_t n = ops_prod(nd, sh), V = sh[nd - 1], N = n / V;
    float *x = ops_falloc(n), *lse = ops_falloc(N), *dx = ops_falloc(n), *dx1 = ops_falloc(n);
    int32_t *tg = ops_ialloc(N);
    double *in[1], *rlse = ops_dalloc(N), r[1];
    const float dloss = 0.7f;
    float loss = NAN, zero = 0;
    tfm_tensor tx = ops_t(x, nd, sh), tdx = ops_t(dx, nd, sh), tl = tfm_tensor1(lse, N);

    for (int64_t i = 0; i < N; i++) tg[i] = (int32_t)(ops_next(g) % (uint64_t)V);
    for (int64_t i = 1; i < N; i += 3) tg[i] = ign;
    c.N = N; c.V = V; c.tg = tg; c.tg0 = tg; c.ign = ign; c.s = (double)s;
    snprintf(nm, sizeof nm, "cross_entropy N=%d V=%d %dd ignore=%d smoothing=%g", (int)N, (int)V, nd,
             ign, (double)s);
    ops_fill_normal(x, n, g, 2, 0);
    ops_fill_nan(lse, N);
    in[0] = ops_to_double(x, n);
    r[0] = (double)dloss;
    for (int64_t i = 0; i < N; i++) rlse[i] = ops_lse(in[0] + i * V, V);

    CHECK_OK(tfm_cross_entropy_forward(&loss, &tl, &tx, tg, ign, s));
    ops_check_fwd(OPS_W("loss"), &loss, ops_ce_ref, &c, in, 1);
    /* the header: "lse (N) saves each row's log-sum-exp" (kept rows, then ignored rows) */
    {
        float *lk = ops_falloc(N), *li = ops_falloc(N);
        double *rk = ops_dalloc(N), *ri = ops_dalloc(N);
        int64_t nk = 0, ni = 0;
        for (int64_t i = 0; i < N; i++) {
            if (tg[i] != ign) {
                lk[nk] = lse[i];
                rk[nk++] = rlse[i];
            } else {
                li[ni] = lse[i];
                ri[ni++] = rlse[i];
            }
        }
        CHECK_REL(OPS_W("lse of kept rows"), test_rel_err(lk, rk, (size_t)nk), OPS_TOL_FWD);
        if (ni) CHECK_REL(OPS_W("lse of ignored rows"), test_rel_err(li, ri, (size_t)ni), OPS_TOL_FWD);
        free(lk); free(li); free(rk); free(ri);
    }

    CHECK_OK(tfm_cross_entropy_backward(&tdx, dloss, &tx, &tl, tg, ign, s));
    if (n <= OPS_FULL_FD_MAX) {
        ops_check_grad(OPS_W("dlogits"), dx, ops_ce_ref, &c, in, 0, n, r, 1);
    } else {
        /* row n alone has loss l_n, and L = dloss * sum over kept rows of l_n / kept */
        ops_ce c1 = c;
        int64_t st[1], kept = 0;
        double rr[1];
        for (int64_t i = 0; i < N; i++) kept += tg[i] != ign;
        c1.N = 1;
        st[0] = V;
        rr[0] = (double)dloss / (double)kept;
        ops_check_grad_rows(OPS_W("dlogits"), dx, ops_ce_ref, &c1, ops_ce_set_row, in, 1, st, 0, N, rr, 0, 1);
    }
    /* ignored rows get no gradient */
    for (int64_t i = 0; i < N; i++)
        if (tg[i] == ign)
            for (int64_t v = 0; v < V; v++) CHECK_MSG(dx[i * V + v] == 0, "%s: ignored row %d has gradient %g",
                                                      nm, (int)i, (double)dx[i * V + v]);
    memcpy(dx1, dx, (size_t)n * sizeof(float));
    CHECK_OK(tfm_cross_entropy_backward(&tdx, dloss, &tx, &tl, tg, ign, s));
    ops_check_twice(OPS_W("dlogits accumulates"), dx, dx1, n);
    /* dloss scales the gradient: dloss = 0 adds nothing */
    CHECK_OK(tfm_cross_entropy_backward(&tdx, zero, &tx, &tl, tg, ign, s));
    ops_check_twice(OPS_W("dloss = 0 adds nothing"), dx, dx1, n);

    free(x); free(lse); free(dx); free(dx1); free(tg); free(in[0]); free(rlse);
}

static void ops_test_cross_entropy(void) {
    static const int64_t s11[2] = {1, 1}, s317[2] = {3, 17}, s173[2] = {17, 3}, s850[2] = {8, 50};
    static const int64_t s237[3] = {2, 3, 7}, s13[2] = {1, 3}, s40x130[2] = {40, 130};
    ops_rng g = {404};
    for (int k = 0; k < 2; k++) {
        float s = k ? 0.1f : 0.0f;
        ops_ce_case(2, s11, -100, s, &g);
        ops_ce_case(2, s13, -100, s, &g);
        ops_ce_case(2, s317, -100, s, &g);
        ops_ce_case(2, s173, -100, s, &g);
        ops_ce_case(2, s850, -100, s, &g);
        ops_ce_case(3, s237, -100, s, &g);
        /* an ignore_index that is also a class id: rows with target 0 are ignored */
        ops_ce_case(2, s173, 0, s, &g);
        ops_ce_case(2, s40x130, -100, s, &g);
    }

    /* every row ignored: loss 0 and nothing added to the gradient (torch would give NaN) */
    for (int k = 0; k < 2; k++) {
        const int64_t N = 4, V = 5;
        float s = k ? 0.1f : 0.0f, loss = NAN;
        float x[20], lse[4], dx[20], dx0[20];
        int32_t tg[4] = {-100, -100, -100, -100};
        tfm_tensor tx = tfm_tensor2(x, N, V), tdx = tfm_tensor2(dx, N, V), tl = tfm_tensor1(lse, N);
        ops_fill_normal(x, N * V, &g, 2, 0);
        ops_fill_normal(dx0, N * V, &g, 1, 0);
        memcpy(dx, dx0, sizeof dx);
        CHECK_OK(tfm_cross_entropy_forward(&loss, &tl, &tx, tg, -100, s));
        CHECK_MSG(loss == 0, "cross_entropy all ignored, smoothing %g: loss %g, want 0", (double)s,
                  (double)loss);
        CHECK_OK(tfm_cross_entropy_backward(&tdx, 1.0f, &tx, &tl, tg, -100, s));
        CHECK_MSG(ops_count_ne(dx, dx0, N * V) == 0,
                  "cross_entropy all ignored, smoothing %g: %d gradient elements changed", (double)s,
                  (int)ops_count_ne(dx, dx0, N * V));
    }
}

/* ---- layernorm -------------------------------------------------------------------------- */

/* y = (x - mean) / sqrt(var + eps) * g + b, biased variance; in = {x, g, b} */
typedef struct ops_ln { int64_t N, C; double eps; } ops_ln;

static void ops_ln_stats(const double *x, int64_t C, double eps, double *mean, double *rstd) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < C; i++) m += x[i];
    m /= (double)C;
    for (int64_t i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    v /= (double)C;
    *mean = m;
    *rstd = 1.0 / sqrt(v + eps);
}

static void ops_ln_ref(const void *ctx, double *const *in, double *y) {
    const ops_ln *c = (const ops_ln *)ctx;
    for (int64_t n = 0; n < c->N; n++) {
        const double *x = in[0] + n * c->C;
        double m, rs;
        ops_ln_stats(x, c->C, c->eps, &m, &rs);
        for (int64_t i = 0; i < c->C; i++) y[n * c->C + i] = (x[i] - m) * rs * in[1][i] + in[2][i];
    }
}

/* x ~ N(0, xscale^2) + 0.4 xscale: with xscale 0.01 the variance (1e-4) is within a factor 10 of
   eps, so where eps goes (inside the sqrt) changes y by percents */
static void ops_layernorm_case(int nd, const int64_t *sh, double xscale, ops_rng *g) {
    ops_ln c;
    char nm[128], wb[192];
    const float eps = 1e-5f;
    int64_t n = ops_prod(nd, sh), C = sh[nd - 1], N = n / C;
    float *x = ops_falloc(n), *y = ops_falloc(n), *z = ops_falloc(n), *gm = ops_falloc(C);
    float *bt = ops_falloc(C), *mean = ops_falloc(N), *rstd = ops_falloc(N), *mean2 = ops_falloc(N);
    float *rstd2 = ops_falloc(N), *dy = ops_falloc(n), *dx = ops_falloc(n), *dg = ops_falloc(C);
    float *db = ops_falloc(C), *dx1 = ops_falloc(n), *dg1 = ops_falloc(C), *db1 = ops_falloc(C);
    double *in[3], *r, *rmean = ops_dalloc(N), *rrstd = ops_dalloc(N);
    tfm_tensor tx = ops_t(x, nd, sh), ty = ops_t(y, nd, sh), tz = ops_t(z, nd, sh);
    tfm_tensor tdy = ops_t(dy, nd, sh), tdx = ops_t(dx, nd, sh);
    tfm_tensor tg = tfm_tensor1(gm, C), tb = tfm_tensor1(bt, C), tdg = tfm_tensor1(dg, C);
    tfm_tensor tdb = tfm_tensor1(db, C), tm = tfm_tensor1(mean, N), tr = tfm_tensor1(rstd, N);
    tfm_tensor tm2 = tfm_tensor1(mean2, N), tr2 = tfm_tensor1(rstd2, N);

    c.N = N; c.C = C; c.eps = (double)eps;
    snprintf(nm, sizeof nm, "layernorm N=%d C=%d %dd x scale %g", (int)N, (int)C, nd, xscale);
    ops_fill_normal(x, n, g, xscale, 0.4 * xscale);
    ops_fill_normal(gm, C, g, 0.5, 1.0);
    ops_fill_normal(bt, C, g, 0.5, 0);
    ops_fill_normal(dy, n, g, 1, 0);
    ops_fill_nan(y, n);
    ops_fill_nan(mean, N);
    ops_fill_nan(rstd, N);
    in[0] = ops_to_double(x, n);
    in[1] = ops_to_double(gm, C);
    in[2] = ops_to_double(bt, C);
    r = ops_to_double(dy, n);
    for (int64_t i = 0; i < N; i++) ops_ln_stats(in[0] + i * C, C, c.eps, &rmean[i], &rrstd[i]);

    CHECK_OK(tfm_layernorm_forward(&ty, &tm, &tr, &tx, &tg, &tb, eps));
    ops_check_fwd(OPS_W("forward"), y, ops_ln_ref, &c, in, n);
    CHECK_REL(OPS_W("mean"), test_rel_err(mean, rmean, (size_t)N), OPS_TOL_FWD);
    CHECK_REL(OPS_W("rstd"), test_rel_err(rstd, rrstd, (size_t)N), OPS_TOL_FWD);

    CHECK_OK(tfm_layernorm_backward(&tdx, &tdg, &tdb, &tdy, &tx, &tg, &tm, &tr));
    if (n <= OPS_FULL_FD_MAX) {
        ops_check_grad(OPS_W("dx"), dx, ops_ln_ref, &c, in, 0, n, r, n);
    } else {
        ops_ln c1 = c;
        int64_t st[3];
        c1.N = 1;
        st[0] = C; st[1] = 0; st[2] = 0;
        ops_check_grad_rows(OPS_W("dx"), dx, ops_ln_ref, &c1, NULL, in, 3, st, 0, N, r, C, C);
    }
    ops_check_grad(OPS_W("dg"), dg, ops_ln_ref, &c, in, 1, C, r, n);
    ops_check_grad(OPS_W("db"), db, ops_ln_ref, &c, in, 2, C, r, n);

    memcpy(dx1, dx, (size_t)n * sizeof(float));
    memcpy(dg1, dg, (size_t)C * sizeof(float));
    memcpy(db1, db, (size_t)C * sizeof(float));
    CHECK_OK(tfm_layernorm_backward(&tdx, &tdg, &tdb, &tdy, &tx, &tg, &tm, &tr));
    ops_check_twice(OPS_W("dx accumulates"), dx, dx1, n);
    ops_check_twice(OPS_W("dg accumulates"), dg, dg1, C);
    ops_check_twice(OPS_W("db accumulates"), db, db1, C);

    /* NULL gradients are skipped */
    memset(dx, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_layernorm_backward(&tdx, NULL, NULL, &tdy, &tx, &tg, &tm, &tr));
    CHECK_REL(OPS_W("dx with dg, db NULL"), test_rel_err_f(dx, dx1, (size_t)n), OPS_TOL_ACC);
    memset(dg, 0, (size_t)C * sizeof(float));
    memset(db, 0, (size_t)C * sizeof(float));
    CHECK_OK(tfm_layernorm_backward(NULL, &tdg, &tdb, &tdy, &tx, &tg, &tm, &tr));
    CHECK_REL(OPS_W("dg with dx NULL"), test_rel_err_f(dg, dg1, (size_t)C), OPS_TOL_ACC);
    CHECK_REL(OPS_W("db with dx NULL"), test_rel_err_f(db, db1, (size_t)C), OPS_TOL_ACC);

    /* in place: y aliases x */
    memcpy(z, x, (size_t)n * sizeof(float));
    CHECK_OK(tfm_layernorm_forward(&tz, &tm2, &tr2, &tz, &tg, &tb, eps));
    ops_check_fwd(OPS_W("forward in place"), z, ops_ln_ref, &c, in, n);
    CHECK_REL(OPS_W("rstd in place"), test_rel_err(rstd2, rrstd, (size_t)N), OPS_TOL_FWD);

    free(x); free(y); free(z); free(gm); free(bt); free(mean); free(rstd); free(mean2); free(rstd2);
    free(dy); free(dx); free(dg); free(db); free(dx1); free(dg1); free(db1);
    free(in[0]); free(in[1]); free(in[2]); free(r); free(rmean); free(rrstd);
}

static void ops_test_layernorm(void) {
    /* C = 1: x - mean is 0, y = b whatever x is, and dx = 0 */
    static const int64_t s11[2] = {1, 1}, s31[2] = {3, 1}, s317[2] = {3, 17}, s173[2] = {17, 3};
    static const int64_t s464[2] = {4, 64}, s235[3] = {2, 3, 5}, s1[1] = {17};
    static const int64_t s40x130[2] = {40, 130}, s2x33x65[3] = {2, 33, 65};
    ops_rng g = {505};
    ops_layernorm_case(2, s11, 1.3, &g);
    ops_layernorm_case(2, s31, 1.3, &g);
    ops_layernorm_case(2, s317, 1.3, &g);
    ops_layernorm_case(2, s173, 1.3, &g);
    ops_layernorm_case(2, s464, 1.3, &g);
    ops_layernorm_case(3, s235, 1.3, &g);
    ops_layernorm_case(1, s1, 1.3, &g);
    ops_layernorm_case(2, s40x130, 1.3, &g);
    ops_layernorm_case(3, s2x33x65, 1.3, &g);
    ops_layernorm_case(2, s317, 0.01, &g);
    ops_layernorm_case(2, s464, 0.01, &g);
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */

/* y = x / sqrt(mean(x^2) + eps) * g; in = {x, g} */
static double ops_rms_rstd(const double *x, int64_t C, double eps) {
    double v = 0;
    for (int64_t i = 0; i < C; i++) v += x[i] * x[i];
    return 1.0 / sqrt(v / (double)C + eps);
}

static void ops_rms_ref(const void *ctx, double *const *in, double *y) {
    const ops_ln *c = (const ops_ln *)ctx;
    for (int64_t n = 0; n < c->N; n++) {
        const double *x = in[0] + n * c->C;
        double rs = ops_rms_rstd(x, c->C, c->eps);
        for (int64_t i = 0; i < c->C; i++) y[n * c->C + i] = x[i] * rs * in[1][i];
    }
}

/* x ~ N(0.4 xscale, xscale^2); with xscale 0.01 the mean square (~1.2e-4) is near eps = 1e-5 * 10, so where
   eps goes matters at the percent level */
static void ops_rmsnorm_case(int nd, const int64_t *sh, double xscale, float eps, ops_rng *g) {
    ops_ln c;
    char nm[128], wb[192];
    int64_t n = ops_prod(nd, sh), C = sh[nd - 1], N = n / C;
    float *x = ops_falloc(n), *y = ops_falloc(n), *z = ops_falloc(n), *gm = ops_falloc(C), *rstd = ops_falloc(N);
    float *dy = ops_falloc(n), *dx = ops_falloc(n), *dg = ops_falloc(C), *dx1 = ops_falloc(n), *dg1 = ops_falloc(C);
    double *in[2], *r, *rrstd = ops_dalloc(N);
    tfm_tensor tx = ops_t(x, nd, sh), ty = ops_t(y, nd, sh), tz = ops_t(z, nd, sh);
    tfm_tensor tdy = ops_t(dy, nd, sh), tdx = ops_t(dx, nd, sh);
    tfm_tensor tg = tfm_tensor1(gm, C), tdg = tfm_tensor1(dg, C), tr = tfm_tensor1(rstd, N);

    c.N = N; c.C = C; c.eps = (double)eps;
    snprintf(nm, sizeof nm, "rmsnorm N=%d C=%d %dd x scale %g eps %g", (int)N, (int)C, nd, xscale, (double)eps);
    ops_fill_normal(x, n, g, xscale, 0.4 * xscale);
    ops_fill_normal(gm, C, g, 0.5, 1.0);
    ops_fill_normal(dy, n, g, 1, 0);
    ops_fill_nan(y, n);
    ops_fill_nan(rstd, N);
    in[0] = ops_to_double(x, n);
    in[1] = ops_to_double(gm, C);
    r = ops_to_double(dy, n);
    for (int64_t i = 0; i < N; i++) rrstd[i] = ops_rms_rstd(in[0] + i * C, C, c.eps);

    CHECK_OK(tfm_rmsnorm_forward(&ty, &tr, &tx, &tg, eps));
    ops_check_fwd(OPS_W("forward"), y, ops_rms_ref, &c, in, n);
    CHECK_REL(OPS_W("rstd"), test_rel_err(rstd, rrstd, (size_t)N), OPS_TOL_FWD);

    CHECK_OK(tfm_rmsnorm_backward(&tdx, &tdg, &tdy, &tx, &tg, &tr));
    if (n <= OPS_FULL_FD_MAX) {
        ops_check_grad(OPS_W("dx"), dx, ops_rms_ref, &c, in, 0, n, r, n);
    } else {
        ops_ln c1 = c;
        int64_t st[2];
        c1.N = 1;
        st[0] = C; st[1] = 0;
        ops_check_grad_rows(OPS_W("dx"), dx, ops_rms_ref, &c1, NULL, in, 2, st, 0, N, r, C, C);
    }
    ops_check_grad(OPS_W("dg"), dg, ops_rms_ref, &c, in, 1, C, r, n);

    memcpy(dx1, dx, (size_t)n * sizeof(float));
    memcpy(dg1, dg, (size_t)C * sizeof(float));
    CHECK_OK(tfm_rmsnorm_backward(&tdx, &tdg, &tdy, &tx, &tg, &tr));
    ops_check_twice(OPS_W("dx accumulates"), dx, dx1, n);
    ops_check_twice(OPS_W("dg accumulates"), dg, dg1, C);
    memset(dx, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_rmsnorm_backward(&tdx, NULL, &tdy, &tx, &tg, &tr));
    CHECK_REL(OPS_W("dx with dg NULL"), test_rel_err_f(dx, dx1, (size_t)n), OPS_TOL_ACC);
    memset(dg, 0, (size_t)C * sizeof(float));
    CHECK_OK(tfm_rmsnorm_backward(NULL, &tdg, &tdy, &tx, &tg, &tr));
    CHECK_REL(OPS_W("dg with dx NULL"), test_rel_err_f(dg, dg1, (size_t)C), OPS_TOL_ACC);

    /* in place: y aliases x */
    memcpy(z, x, (size_t)n * sizeof(float));
    CHECK_OK(tfm_rmsnorm_forward(&tz, NULL, &tz, &tg, eps));
    ops_check_fwd(OPS_W("forward in place"), z, ops_rms_ref, &c, in, n);

    free(x); free(y); free(z); free(gm); free(rstd); free(dy); free(dx); free(dg); free(dx1); free(dg1);
    free(in[0]); free(in[1]); free(r); free(rrstd);
}

/* (C = 1 is left out: there dx = g dy eps / (x^2 + eps)^1.5 is the cancellation of two terms ~1e5 times
   larger, so float32 keeps few of its digits, as in torch) */
static void ops_test_rmsnorm(void) {
    static const int64_t s32[2] = {3, 2}, s317[2] = {3, 17}, s464[2] = {4, 64}, s235[3] = {2, 3, 5};
    static const int64_t s40x130[2] = {40, 130}, s2x33x65[3] = {2, 33, 65};
    ops_rng g = {606};
    ops_rmsnorm_case(2, s32, 1.3, 1e-5f, &g);
    ops_rmsnorm_case(2, s317, 1.3, 1e-5f, &g);
    ops_rmsnorm_case(2, s464, 1.3, 1e-6f, &g);
    ops_rmsnorm_case(3, s235, 1.3, 1e-5f, &g);
    ops_rmsnorm_case(2, s40x130, 1.3, 1e-5f, &g);
    ops_rmsnorm_case(3, s2x33x65, 1.3, 1e-5f, &g);
    ops_rmsnorm_case(2, s317, 0.01, 1e-4f, &g);
    ops_rmsnorm_case(2, s464, 0.01, 1e-4f, &g);
}

/* ---- SwiGLU (the feed-forward's gate: tfm__op_linear_act's CPU kernel, and tfm__op_swiglu_bwd) ---- */

typedef struct ops_sw { int64_t N, F; } ops_sw;

/* y[r,j] = silu(h[r,j]) h[r,F+j], silu(g) = g / (1 + e^-g); in = {h (N,2F)} */
static void ops_swiglu_ref(const void *ctx, double *const *in, double *y) {
    const ops_sw *c = (const ops_sw *)ctx;
    for (int64_t r = 0; r < c->N; r++)
        for (int64_t j = 0; j < c->F; j++) {
            double g = in[0][r * 2 * c->F + j], u = in[0][r * 2 * c->F + c->F + j];
            y[r * c->F + j] = g / (1.0 + exp(-g)) * u;
        }
}

static void ops_swiglu_case(int64_t N, int64_t F, ops_rng *g) {
    static const float special[] = {0.0f, 1e-3f, -1e-3f, 1.0f, -1.0f, 4.0f, -4.0f, 9.0f, -9.0f, 20.0f, -20.0f};
    ops_sw c;
    char nm[128], wb[192];
    int64_t nh = N * 2 * F, ny = N * F;
    float *h = ops_falloc(nh), *y = ops_falloc(ny), *dy = ops_falloc(ny), *dh = ops_falloc(nh);
    double *in[1], *r;
    c.N = N; c.F = F;
    snprintf(nm, sizeof nm, "swiglu N=%d F=%d", (int)N, (int)F);
    for (int64_t i = 0; i < nh; i++) h[i] = (float)(-5.0 + 10.0 * ops_unif(g));
    for (int64_t i = 0; i < F && i < (int64_t)(sizeof special / sizeof special[0]); i++) h[i] = special[i];
    ops_fill_normal(dy, ny, g, 1, 0);
    ops_fill_nan(y, ny);
    ops_fill_nan(dh, nh); /* backward writes every element */
    in[0] = ops_to_double(h, nh);
    r = ops_to_double(dy, ny);
    tfm__swiglu_forward_cpu(y, h, N, F);
    ops_check_fwd(OPS_W("forward"), y, ops_swiglu_ref, &c, in, ny);
    tfm__op_swiglu_bwd(TFM_DEVICE_CPU, dh, dy, 0, h, N, F, 0, 0);
    if (nh <= OPS_FULL_FD_MAX) {
        ops_check_grad(OPS_W("dh"), dh, ops_swiglu_ref, &c, in, 0, nh, r, ny);
    } else {
        ops_sw c1 = c;
        int64_t st[1];
        c1.N = 1;
        st[0] = 2 * F;
        ops_check_grad_rows(OPS_W("dh"), dh, ops_swiglu_ref, &c1, NULL, in, 1, st, 0, N, r, F, F);
    }
    free(h); free(y); free(dy); free(dh); free(in[0]); free(r);
}

static void ops_test_swiglu(void) {
    ops_rng g = {707};
    ops_swiglu_case(1, 1, &g);
    ops_swiglu_case(3, 11, &g);
    ops_swiglu_case(2, 64, &g);
    ops_swiglu_case(40, 96, &g);
}

/* ---- rotary position embedding ------------------------------------------------------------ */

typedef struct ops_rope { int64_t B, T; int H, D, rot; double base; const int32_t *pos0; } ops_rope;

/* y = R(p) x per head, in double (the angle p base^(-2j/rot) exactly as written); in = {x (B,T,H*D)} */
static void ops_rope_ref(const void *ctx, double *const *in, double *y) {
    const ops_rope *c = (const ops_rope *)ctx;
    int64_t C = (int64_t)c->H * c->D;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->T; t++) {
            const double *x = in[0] + (b * c->T + t) * C;
            double *yr = y + (b * c->T + t) * C, p = (double)t + (c->pos0 ? c->pos0[b] : 0);
            for (int h = 0; h < c->H; h++) {
                for (int j = 0; j < c->D; j++) yr[h * c->D + j] = x[h * c->D + j];
                for (int j = 0; j < c->rot / 2; j++) {
                    double a = p / pow(c->base, 2.0 * j / c->rot), u = x[h * c->D + j], v = x[h * c->D + j + c->rot / 2];
                    yr[h * c->D + j] = u * cos(a) - v * sin(a);
                    yr[h * c->D + j + c->rot / 2] = v * cos(a) + u * sin(a);
                }
            }
        }
}

static void ops_rope_case(int64_t B, int64_t T, int H, int D, int rot, float base, const int32_t *pos0, ops_rng *g) {
    ops_rope c;
    char nm[160], wb[256];
    int64_t n = B * T * H * D;
    int64_t sh[3] = {B, T, (int64_t)H * D};
    float *x = ops_falloc(n), *y = ops_falloc(n), *z = ops_falloc(n), *dy = ops_falloc(n), *dx = ops_falloc(n);
    float *dx1 = ops_falloc(n);
    tfm_tensor tx = ops_t(x, 3, sh), ty = ops_t(y, 3, sh), tz = ops_t(z, 3, sh), tdy = ops_t(dy, 3, sh), tdx = ops_t(dx, 3, sh);
    double *in[1], *r;
    c.B = B; c.T = T; c.H = H; c.D = D; c.rot = rot; c.base = (double)base; c.pos0 = pos0;
    snprintf(nm, sizeof nm, "rope B=%d T=%d H=%d D=%d rot=%d base %g pos0 %s", (int)B, (int)T, H, D, rot, (double)base,
             pos0 ? "given" : "none");
    ops_fill_normal(x, n, g, 1, 0);
    ops_fill_normal(dy, n, g, 1, 0);
    ops_fill_nan(y, n);
    in[0] = ops_to_double(x, n);
    r = ops_to_double(dy, n);
    CHECK_OK(tfm_rope_forward(&ty, &tx, H, rot, base, pos0));
    ops_check_fwd(OPS_W("forward"), y, ops_rope_ref, &c, in, n);
    memset(dx, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_rope_backward(&tdx, &tdy, H, rot, base, pos0));
    ops_check_grad(OPS_W("dx"), dx, ops_rope_ref, &c, in, 0, n, r, n);
    memcpy(dx1, dx, (size_t)n * sizeof(float));
    CHECK_OK(tfm_rope_backward(&tdx, &tdy, H, rot, base, pos0));
    ops_check_twice(OPS_W("dx accumulates"), dx, dx1, n);
    memcpy(z, x, (size_t)n * sizeof(float));
    CHECK_OK(tfm_rope_forward(&tz, &tz, H, rot, base, pos0));
    ops_check_fwd(OPS_W("forward in place"), z, ops_rope_ref, &c, in, n);
    free(x); free(y); free(z); free(dy); free(dx); free(dx1); free(in[0]); free(r);
}

static void ops_test_rope(void) {
    static const int32_t pos0[2] = {5, 4093}; /* a row far along: angles up to ~4e3 rad */
    ops_rng g = {808};
    float x[12], y[12];
    int64_t sh[3] = {1, 2, 6};
    tfm_tensor tx = ops_t(x, 3, sh), ty = ops_t(y, 3, sh);
    ops_rope_case(1, 1, 1, 2, 2, 10000.0f, NULL, &g);
    ops_rope_case(2, 5, 2, 8, 8, 10000.0f, NULL, &g);
    ops_rope_case(2, 4, 3, 8, 4, 10000.0f, pos0, &g);      /* a quarter of each head turns, the rest passes */
    ops_rope_case(2, 3, 2, 16, 16, 500000.0f, pos0, &g);   /* LLaMA 3's base */
    ops_rope_case(3, 4, 2, 80, 72, 10000.0f, NULL, &g);     /* 36 pairs: more than the CPU forms at a time */
    ops_rope_case(2, 2, 1, 70, 70, 10000.0f, pos0, &g);
    memset(x, 0, sizeof x);
    CHECK_ERR(tfm_rope_forward(&ty, &tx, 4, 2, 10000.0f, NULL), TFM_E_ARG, "n_heads 4");
    CHECK_ERR(tfm_rope_forward(&ty, &tx, 2, 3, 10000.0f, NULL), TFM_E_ARG, "rot_dims 3");
    CHECK_ERR(tfm_rope_forward(&ty, &tx, 2, 4, 10000.0f, NULL), TFM_E_ARG, "rot_dims 4");
    CHECK_ERR(tfm_rope_forward(&ty, &tx, 2, 2, 1.0f, NULL), TFM_E_ARG, "base 1");
    CHECK_ERR(tfm_rope_backward(&tx, &tx, 2, 2, 10000.0f, NULL), TFM_E_ARG, "alias");
}

/* ---- GELU, ReLU ------------------------------------------------------------------------- */

typedef struct ops_ew { int64_t n; int kind; } ops_ew;

static double ops_gelu(double x, int kind) {
    if (kind == TFM_GELU_TANH)
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / OPS_PI) * (x + 0.044715 * x * x * x)));
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); /* x Phi(x) */
}

static void ops_gelu_ref(const void *ctx, double *const *in, double *y) {
    const ops_ew *c = (const ops_ew *)ctx;
    for (int64_t i = 0; i < c->n; i++) y[i] = ops_gelu(in[0][i], c->kind);
}

static void ops_relu_ref(const void *ctx, double *const *in, double *y) {
    const ops_ew *c = (const ops_ew *)ctx;
    for (int64_t i = 0; i < c->n; i++) y[i] = in[0][i] > 0 ? in[0][i] : 0.0;
}

static void ops_gelu_case(int kind, int nd, const int64_t *sh, ops_rng *g) {
    static const float special[] = {0.0f, 1e-3f, -1e-3f, 1.0f, -1.0f, 3.0f, -3.0f, 5.5f, -5.5f, 9.0f, -9.0f};
    ops_ew c;
    char nm[128], wb[192];
    int64_t n = ops_prod(nd, sh);
    float *x = ops_falloc(n), *y = ops_falloc(n), *z = ops_falloc(n), *dy = ops_falloc(n);
    float *dx = ops_falloc(n), *dx1 = ops_falloc(n);
    tfm_tensor tx = ops_t(x, nd, sh), ty = ops_t(y, nd, sh), tz = ops_t(z, nd, sh);
    tfm_tensor tdy = ops_t(dy, nd, sh), tdx = ops_t(dx, nd, sh);
    double *in[1], *r;

    c.n = n;
    c.kind = kind;
    snprintf(nm, sizeof nm, "gelu %s n=%d %dd", kind == TFM_GELU_TANH ? "tanh" : "erf", (int)n, nd);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(-5.0 + 10.0 * ops_unif(g));
    for (int64_t i = 0; i < n && i < (int64_t)(sizeof special / sizeof special[0]); i++) x[i] = special[i];
    ops_fill_normal(dy, n, g, 1, 0);
    ops_fill_nan(y, n);
    in[0] = ops_to_double(x, n);
    r = ops_to_double(dy, n);

    CHECK_OK(tfm_gelu_forward(&ty, &tx, (tfm_gelu_kind)kind));
    ops_check_fwd(OPS_W("forward"), y, ops_gelu_ref, &c, in, n);
    CHECK_OK(tfm_gelu_backward(&tdx, &tdy, &tx, (tfm_gelu_kind)kind));
    if (n <= OPS_FULL_FD_MAX) {
        ops_check_grad(OPS_W("dx"), dx, ops_gelu_ref, &c, in, 0, n, r, n);
    } else {
        ops_ew c1 = c;
        int64_t st[1] = {1};
        c1.n = 1;
        ops_check_grad_rows(OPS_W("dx"), dx, ops_gelu_ref, &c1, NULL, in, 1, st, 0, n, r, 1, 1);
    }
    memcpy(dx1, dx, (size_t)n * sizeof(float));
    CHECK_OK(tfm_gelu_backward(&tdx, &tdy, &tx, (tfm_gelu_kind)kind));
    ops_check_twice(OPS_W("dx accumulates"), dx, dx1, n);

    memcpy(z, x, (size_t)n * sizeof(float));
    CHECK_OK(tfm_gelu_forward(&tz, &tz, (tfm_gelu_kind)kind));
    ops_check_fwd(OPS_W("forward in place"), z, ops_gelu_ref, &c, in, n);

    free(x); free(y); free(z); free(dy); free(dx); free(dx1); free(in[0]); free(r);
}

static void ops_test_gelu(void) {
    static const int64_t s1[1] = {1}, s317[2] = {3, 17}, s2317[3] = {2, 3, 17}, s257[1] = {257};
    static const int64_t s50x101[2] = {50, 101};
    ops_rng g = {606};
    for (int kind = 0; kind < 2; kind++) {
        ops_gelu_case(kind, 1, s1, &g);
        ops_gelu_case(kind, 2, s317, &g);
        ops_gelu_case(kind, 3, s2317, &g);
        ops_gelu_case(kind, 1, s257, &g);
        ops_gelu_case(kind, 2, s50x101, &g);
    }
    /* the two kinds differ by up to ~1e-3 (near |x| = 2), far above the tolerance: the kind is honoured */
    {
        float x[3] = {-2.2f, 2.2f, 0.7f}, ye[3], yt[3];
        tfm_tensor tx = tfm_tensor1(x, 3), te = tfm_tensor1(ye, 3), tt = tfm_tensor1(yt, 3);
        CHECK_OK(tfm_gelu_forward(&te, &tx, TFM_GELU_ERF));
        CHECK_OK(tfm_gelu_forward(&tt, &tx, TFM_GELU_TANH));
        CHECK(ops_count_ne(ye, yt, 3) > 0);
    }
}

static void ops_check_relu_grad(const char *what, const float *dx, const ops_ew *c, double *const *in,
                                const double *r) {
    if (c->n <= OPS_FULL_FD_MAX) {
        ops_check_grad(what, dx, ops_relu_ref, c, in, 0, c->n, r, c->n);
    } else {
        ops_ew c1 = *c;
        int64_t st[1] = {1};
        c1.n = 1;
        ops_check_grad_rows(what, dx, ops_relu_ref, &c1, NULL, in, 1, st, 0, c->n, r, 1, 1);
    }
}

static void ops_relu_case(int nd, const int64_t *sh, ops_rng *g) {
    ops_ew c;
    char nm[128], wb[192];
    int64_t n = ops_prod(nd, sh);
    float *x = ops_falloc(n), *y = ops_falloc(n), *dy = ops_falloc(n), *dx = ops_falloc(n);
    float *dx1 = ops_falloc(n);
    tfm_tensor tx = ops_t(x, nd, sh), ty = ops_t(y, nd, sh), tdy = ops_t(dy, nd, sh), tdx = ops_t(dx, nd, sh);
    double *in[1], *r;

    c.n = n;
    c.kind = 0;
    snprintf(nm, sizeof nm, "relu n=%d %dd", (int)n, nd);
    /* |x| >= 0.1 >> h: the finite differences never straddle the kink at 0 */
    ops_fill_away0(x, n, g, 0.1, 2.0);
    ops_fill_normal(dy, n, g, 1, 0);
    ops_fill_nan(y, n);
    in[0] = ops_to_double(x, n);
    r = ops_to_double(dy, n);

    CHECK_OK(tfm_relu_forward(&ty, &tx));
    ops_check_fwd(OPS_W("forward"), y, ops_relu_ref, &c, in, n);
    CHECK_OK(tfm_relu_backward(&tdx, &tdy, &tx));
    ops_check_relu_grad(OPS_W("dx from the input"), dx, &c, in, r);
    memcpy(dx1, dx, (size_t)n * sizeof(float));
    CHECK_OK(tfm_relu_backward(&tdx, &tdy, &tx));
    ops_check_twice(OPS_W("dx accumulates"), dx, dx1, n);
    /* backward may be given the forward's output instead (zeros where x < 0) */
    memset(dx, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_relu_backward(&tdx, &tdy, &ty));
    ops_check_relu_grad(OPS_W("dx from the output"), dx, &c, in, r);

    free(x); free(y); free(dy); free(dx); free(dx1); free(in[0]); free(r);
}

static void ops_test_relu(void) {
    static const int64_t s1[1] = {1}, s317[2] = {3, 17}, s2317[3] = {2, 3, 17}, s50x101[2] = {50, 101};
    ops_rng g = {707};
    ops_relu_case(1, s1, &g);
    ops_relu_case(2, s317, &g);
    ops_relu_case(3, s2317, &g);
    ops_relu_case(2, s50x101, &g);
}

/* ---- dropout ---------------------------------------------------------------------------- */

static void ops_test_dropout(void) {
    ops_rng g = {808};
    const int64_t n = 100003, half = n / 2;
    const float p = 0.3f;
    const uint64_t seed = 2024;
    const double scale = 1.0 / (1.0 - (double)p);
    float *x = ops_falloc(n), *y = ops_falloc(n), *y2 = ops_falloc(n), *dy = ops_falloc(n);
    float *dx = ops_falloc(n), *dx1 = ops_falloc(n), *dx2 = ops_falloc(n);
    tfm_tensor tx = tfm_tensor1(x, n), ty = tfm_tensor1(y, n), ty2 = tfm_tensor1(y2, n);
    tfm_tensor tdy = tfm_tensor1(dy, n), tdx = tfm_tensor1(dx, n), tdx2 = tfm_tensor1(dx2, n);
    int64_t kept = 0, kept_lo = 0, bad = 0, first_bad = -1, differ = 0;
    int nt0 = tfm_get_num_threads();

    /* x never 0, so y == 0 exactly when the element was dropped */
    ops_fill_away0(x, n, &g, 0.1, 2.0);
    ops_fill_normal(dy, n, &g, 1, 0);

    /* identity: p == 0 in training, and any p in eval */
    ops_fill_nan(y, n);
    CHECK_OK(tfm_dropout_forward(&ty, &tx, 0.0f, seed, 1));
    CHECK(ops_count_ne(y, x, n) == 0);
    ops_fill_nan(y, n);
    CHECK_OK(tfm_dropout_forward(&ty, &tx, p, seed, 0));
    CHECK(ops_count_ne(y, x, n) == 0);
    memset(dx, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_dropout_backward(&tdx, &tdy, 0.0f, seed, 1));
    CHECK(ops_count_ne(dx, dy, n) == 0);
    memset(dx, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_dropout_backward(&tdx, &tdy, p, seed, 0));
    CHECK(ops_count_ne(dx, dy, n) == 0);
    CHECK_OK(tfm_dropout_backward(&tdx, &tdy, p, seed, 0));
    ops_check_twice("dropout eval: dx accumulates", dx, dy, n);

    /* p = 0.3: kept elements are x / (1-p) (to a few float roundings of 1/(1-p)), the rest 0 */
    ops_fill_nan(y, n);
    CHECK_OK(tfm_dropout_forward(&ty, &tx, p, seed, 1));
    for (int64_t i = 0; i < n; i++) {
        double want = (double)x[i] * scale;
        if (y[i] == 0) continue;
        kept++;
        if (i < half) kept_lo++;
        if (!(fabs((double)y[i] - want) <= 4 * FLT_EPSILON * fabs(want)) && bad++ == 0) first_bad = i;
    }
    if (first_bad >= 0)
        TEST__FAIL("dropout p=0.3: %d elements neither 0 nor x/(1-p), e.g. x[%d] = %.9g -> %.9g, want %.9g",
                   (int)bad, (int)first_bad, (double)x[first_bad], (double)y[first_bad],
                   (double)x[first_bad] * scale);
    /* 1e5 Bernoulli(0.7) draws: standard deviation of the fraction ~0.0015, so +-0.01 is ~7 sigma;
       each half separately (~0.002) within +-0.015 */
    CHECK_MSG(fabs((double)kept / (double)n - 0.7) < 0.01, "dropout p=0.3: kept fraction %g",
              (double)kept / (double)n);
    CHECK_MSG(fabs((double)kept_lo / (double)half - 0.7) < 0.015, "dropout p=0.3: first half kept %g",
              (double)kept_lo / (double)half);
    CHECK_MSG(fabs((double)(kept - kept_lo) / (double)(n - half) - 0.7) < 0.015,
              "dropout p=0.3: second half kept %g", (double)(kept - kept_lo) / (double)(n - half));

    /* the same seed gives the same mask; another seed an independent one (disagree w.p. 2*0.7*0.3) */
    ops_fill_nan(y2, n);
    CHECK_OK(tfm_dropout_forward(&ty2, &tx, p, seed, 1));
    CHECK(ops_count_ne(y, y2, n) == 0);
    CHECK_OK(tfm_dropout_forward(&ty2, &tx, p, seed + 1, 1));
    for (int64_t i = 0; i < n; i++) differ += (y[i] == 0) != (y2[i] == 0);
    CHECK_MSG(fabs((double)differ / (double)n - 0.42) < 0.02, "dropout: seeds %d and %d disagree on %g",
              (int)seed, (int)seed + 1, (double)differ / (double)n);

    /* backward regenerates the forward's mask: dx = dy / (1-p) where kept, 0 where dropped */
    memset(dx, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_dropout_backward(&tdx, &tdy, p, seed, 1));
    bad = 0;
    first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        double want = y[i] == 0 ? 0.0 : (double)dy[i] * scale;
        if (!(fabs((double)dx[i] - want) <= 4 * FLT_EPSILON * fabs(want)) && bad++ == 0) first_bad = i;
    }
    if (first_bad >= 0)
        TEST__FAIL("dropout p=0.3 backward: %d elements do not follow the forward's mask, e.g. dx[%d] = "
                   "%.9g, dy %.9g, y %.9g", (int)bad, (int)first_bad, (double)dx[first_bad],
                   (double)dy[first_bad], (double)y[first_bad]);
    memcpy(dx1, dx, (size_t)n * sizeof(float));
    CHECK_OK(tfm_dropout_backward(&tdx, &tdy, p, seed, 1));
    ops_check_twice("dropout p=0.3: dx accumulates", dx, dx1, n);

    /* the mask does not depend on the thread count */
    tfm_set_num_threads(1);
    CHECK_OK(tfm_dropout_forward(&ty, &tx, p, seed, 1));
    memset(dx, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_dropout_backward(&tdx, &tdy, p, seed, 1));
    tfm_set_num_threads(2);
    CHECK_OK(tfm_dropout_forward(&ty2, &tx, p, seed, 1));
    memset(dx2, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_dropout_backward(&tdx2, &tdy, p, seed, 1));
    tfm_set_num_threads(nt0);
    CHECK_MSG(ops_count_ne(y, y2, n) == 0, "dropout forward: 1 and 2 threads differ in %d elements",
              (int)ops_count_ne(y, y2, n));
    CHECK_MSG(ops_count_ne(dx, dx2, n) == 0, "dropout backward: 1 and 2 threads differ in %d elements",
              (int)ops_count_ne(dx, dx2, n));

    /* p = 1 (allowed: p in [0, 1]) drops everything: zeros, not NaN from 0 * 1/0 */
    ops_fill_nan(y, n);
    CHECK_OK(tfm_dropout_forward(&ty, &tx, 1.0f, seed, 1));
    memset(y2, 0, (size_t)n * sizeof(float));
    CHECK_MSG(ops_count_ne(y, y2, n) == 0, "dropout p=1: %d elements not 0", (int)ops_count_ne(y, y2, n));
    memset(dx, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_dropout_backward(&tdx, &tdy, 1.0f, seed, 1));
    CHECK_MSG(ops_count_ne(dx, y2, n) == 0, "dropout p=1 backward: %d elements not 0",
              (int)ops_count_ne(dx, y2, n));

    /* a 3-D view of the same data drops the same elements (the mask follows the flat index) */
    {
        tfm_tensor t3x = tfm_tensor3(x, 1, 1, n), t3y = tfm_tensor3(y2, 1, 1, n);
        CHECK_OK(tfm_dropout_forward(&ty, &tx, p, seed, 1));
        CHECK_OK(tfm_dropout_forward(&t3y, &t3x, p, seed, 1));
        CHECK(ops_count_ne(y, y2, n) == 0);
    }

    free(x); free(y); free(y2); free(dy); free(dx); free(dx1); free(dx2);
}

/* ---- embeddings ------------------------------------------------------------------------- */

/* y[i,c] = w[ids[i],c] * scale; in = {w} */
typedef struct ops_emb { int64_t N, V, C; const int32_t *ids; double scale; } ops_emb;

static void ops_emb_ref(const void *ctx, double *const *in, double *y) {
    const ops_emb *c = (const ops_emb *)ctx;
    for (int64_t i = 0; i < c->N; i++)
        for (int64_t k = 0; k < c->C; k++) y[i * c->C + k] = in[0][c->ids[i] * c->C + k] * c->scale;
}

/* B > 0: y is (B,T,C); else (T,C). ids repeat (drawn from V with N > V in most cases) */
static void ops_embedding_case(int64_t B, int64_t T, int64_t V, int64_t C, float scale, ops_rng *g) {
    ops_emb c;
    char nm[128], wb[192];
    int64_t N = (B > 0 ? B : 1) * T, ny = N * C, nw = V * C;
    float *w = ops_falloc(nw), *y = ops_falloc(ny), *dy = ops_falloc(ny), *dw = ops_falloc(nw);
    float *dw1 = ops_falloc(nw);
    int32_t *ids = ops_ialloc(N);
    tfm_tensor tw = tfm_tensor2(w, V, C), tdw = tfm_tensor2(dw, V, C), ty, tdy;
    double *in[1], *r;

    for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)(ops_next(g) % (uint64_t)V);
    if (N > 2) ids[N - 1] = ids[0]; /* at least one repeat */
    c.N = N; c.V = V; c.C = C; c.ids = ids; c.scale = (double)scale;
    snprintf(nm, sizeof nm, "embedding y=(%d,%d,%d) V=%d scale=%g", (int)B, (int)T, (int)C, (int)V,
             (double)scale);
    ops_fill_normal(w, nw, g, 1, 0);
    ops_fill_normal(dy, ny, g, 1, 0);
    ops_fill_nan(y, ny);
    if (B > 0) {
        ty = tfm_tensor3(y, B, T, C);
        tdy = tfm_tensor3(dy, B, T, C);
    } else {
        ty = tfm_tensor2(y, T, C);
        tdy = tfm_tensor2(dy, T, C);
    }
    in[0] = ops_to_double(w, nw);
    r = ops_to_double(dy, ny);

    CHECK_OK(tfm_embedding_forward(&ty, ids, &tw, scale));
    ops_check_fwd(OPS_W("forward"), y, ops_emb_ref, &c, in, ny);
    /* repeated ids add their rows into the same dw row */
    CHECK_OK(tfm_embedding_backward(&tdw, &tdy, ids, scale));
    if ((double)nw * (double)ny <= OPS_FD_WORK_MAX) {
        ops_check_grad(OPS_W("dw"), dw, ops_emb_ref, &c, in, 0, nw, r, ny);
    } else {
        /* exact: dw[v] = scale * sum of r[i] over the rows i with ids[i] = v */
        double *gw = ops_dalloc(nw);
        for (int64_t i = 0; i < N; i++)
            for (int64_t k = 0; k < C; k++) gw[ids[i] * C + k] += c.scale * r[i * C + k];
        ops_check_vs(OPS_W("dw"), dw, gw, nw);
        free(gw);
    }
    memcpy(dw1, dw, (size_t)nw * sizeof(float));
    CHECK_OK(tfm_embedding_backward(&tdw, &tdy, ids, scale));
    ops_check_twice(OPS_W("dw accumulates"), dw, dw1, nw);

    free(w); free(y); free(dy); free(dw); free(dw1); free(ids); free(in[0]); free(r);
}

static void ops_test_embedding(void) {
    ops_rng g = {909};
    ops_embedding_case(0, 1, 1, 1, 1.0f, &g);
    ops_embedding_case(0, 17, 5, 3, 1.0f, &g);
    ops_embedding_case(0, 17, 5, 3, 2.5f, &g);
    ops_embedding_case(2, 3, 17, 17, 1.0f, &g);
    ops_embedding_case(3, 17, 3, 1, (float)sqrt(17.0), &g);
    ops_embedding_case(1, 3, 1, 17, 0.5f, &g);
    ops_embedding_case(2, 50, 30, 70, 1.5f, &g);
}

/* y[b,t,c] = x[b,t,c] + w[t,c]; in = {x, w} */
typedef struct ops_pe { int64_t B, T, C, P; } ops_pe;

static void ops_pos_ref(const void *ctx, double *const *in, double *y) {
    const ops_pe *c = (const ops_pe *)ctx;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->T; t++)
            for (int64_t k = 0; k < c->C; k++) {
                int64_t i = (b * c->T + t) * c->C + k;
                y[i] = in[0][i] + in[1][t * c->C + k];
            }
}

static void ops_pos_embedding_case(int64_t B, int64_t T, int64_t C, int64_t P, ops_rng *g) {
    ops_pe c;
    char nm[128], wb[192];
    int64_t n = B * T * C, nw = P * C;
    float *x = ops_falloc(n), *y = ops_falloc(n), *z = ops_falloc(n), *w = ops_falloc(nw);
    float *dy = ops_falloc(n), *dx = ops_falloc(n), *dw = ops_falloc(nw);
    float *dx1 = ops_falloc(n), *dw1 = ops_falloc(nw);
    tfm_tensor tx = tfm_tensor3(x, B, T, C), ty = tfm_tensor3(y, B, T, C), tz = tfm_tensor3(z, B, T, C);
    tfm_tensor tdy = tfm_tensor3(dy, B, T, C), tdx = tfm_tensor3(dx, B, T, C);
    tfm_tensor tw = tfm_tensor2(w, P, C), tdw = tfm_tensor2(dw, P, C);
    double *in[2], *r;

    c.B = B; c.T = T; c.C = C; c.P = P;
    snprintf(nm, sizeof nm, "pos_embedding x=(%d,%d,%d) P=%d", (int)B, (int)T, (int)C, (int)P);
    ops_fill_normal(x, n, g, 1, 0);
    ops_fill_normal(w, nw, g, 1, 0);
    ops_fill_normal(dy, n, g, 1, 0);
    ops_fill_nan(y, n);
    in[0] = ops_to_double(x, n);
    in[1] = ops_to_double(w, nw);
    r = ops_to_double(dy, n);

    CHECK_OK(tfm_pos_embedding_forward(&ty, &tx, &tw));
    ops_check_fwd(OPS_W("forward"), y, ops_pos_ref, &c, in, n);
    CHECK_OK(tfm_pos_embedding_backward(&tdx, &tdw, &tdy));
    /* rows t >= T of w are unused: their gradient is 0 */
    if ((double)(n + nw) * (double)n <= OPS_FD_WORK_MAX) {
        ops_check_grad(OPS_W("dx"), dx, ops_pos_ref, &c, in, 0, n, r, n);
        ops_check_grad(OPS_W("dw"), dw, ops_pos_ref, &c, in, 1, nw, r, n);
    } else {
        /* exact: dx = r, dw[t] = sum over b of r[b,t] */
        double *gw = ops_dalloc(nw);
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < T * C; i++) gw[i] += r[b * T * C + i];
        ops_check_vs(OPS_W("dx"), dx, r, n);
        ops_check_vs(OPS_W("dw"), dw, gw, nw);
        free(gw);
    }
    memcpy(dx1, dx, (size_t)n * sizeof(float));
    memcpy(dw1, dw, (size_t)nw * sizeof(float));
    CHECK_OK(tfm_pos_embedding_backward(&tdx, &tdw, &tdy));
    ops_check_twice(OPS_W("dx accumulates"), dx, dx1, n);
    ops_check_twice(OPS_W("dw accumulates"), dw, dw1, nw);

    memset(dx, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_pos_embedding_backward(&tdx, NULL, &tdy));
    CHECK_REL(OPS_W("dx with dw NULL"), test_rel_err_f(dx, dx1, (size_t)n), OPS_TOL_ACC);
    memset(dw, 0, (size_t)nw * sizeof(float));
    CHECK_OK(tfm_pos_embedding_backward(NULL, &tdw, &tdy));
    CHECK_REL(OPS_W("dw with dx NULL"), test_rel_err_f(dw, dw1, (size_t)nw), OPS_TOL_ACC);

    memcpy(z, x, (size_t)n * sizeof(float));
    CHECK_OK(tfm_pos_embedding_forward(&tz, &tz, &tw));
    ops_check_fwd(OPS_W("forward in place"), z, ops_pos_ref, &c, in, n);

    free(x); free(y); free(z); free(w); free(dy); free(dx); free(dw); free(dx1); free(dw1);
    free(in[0]); free(in[1]); free(r);
}

static void ops_test_pos_embedding(void) {
    ops_rng g = {1010};
    ops_pos_embedding_case(1, 1, 1, 1, &g);
    ops_pos_embedding_case(2, 3, 17, 5, &g);
    ops_pos_embedding_case(3, 17, 3, 17, &g);
    ops_pos_embedding_case(1, 5, 3, 9, &g);
    ops_pos_embedding_case(2, 40, 65, 50, &g);
}

/* ---- sinusoidal positions --------------------------------------------------------------- */

/* The angle of pe[t,j]: t / 10000^(2i/C) with 2i = j rounded down to even. */
static double ops_sin_angle(int64_t t, int64_t j, int64_t C) {
    return (double)t / pow(10000.0, (double)(j - j % 2) / (double)C);
}
static double ops_sin_ref(int64_t t, int64_t j, int64_t C) {
    double a = ops_sin_angle(t, j, C);
    return j % 2 == 0 ? sin(a) : cos(a);
}

/* How far a float32 table entry may be from the exact value. A float kernel computes the angle
   t * 10000^(-2i/C) with a relative error of a few ulps times ln(10000) ~ 9.2 (the rounded exponent
   is amplified by the power), i.e. up to ~16 ulps of the angle, and sin/cos add an ulp of the result.
   So the bound is 32 FLT_EPSILON (1 + angle): exact for small angles, growing with t as it must. */
static double ops_sin_tol(int64_t t, int64_t j, int64_t C) {
    return 32.0 * FLT_EPSILON * (1.0 + ops_sin_angle(t, j, C));
}

static void ops_sinusoidal_table_case(int64_t P, int64_t C) {
    float *pe = ops_falloc(P * C);
    tfm_tensor tpe = tfm_tensor2(pe, P, C);
    double worst = 0, wgot = 0, wwant = 0;
    int64_t wt = 0, wj = 0;
    ops_fill_nan(pe, P * C);
    CHECK_OK(tfm_sinusoidal_table(&tpe));
    for (int64_t t = 0; t < P; t++)
        for (int64_t j = 0; j < C; j++) {
            double want = ops_sin_ref(t, j, C), got = (double)pe[t * C + j];
            double e = fabs(got - want) / ops_sin_tol(t, j, C);
            if (e != e) e = INFINITY;
            if (e > worst) {
                worst = e; wgot = got; wwant = want; wt = t; wj = j;
            }
        }
    CHECK_MSG(worst <= 1.0, "sinusoidal_table P=%d C=%d: pe[%d,%d] = %.9g, want %.9g (%.3g of tolerance)",
              (int)P, (int)C, (int)wt, (int)wj, wgot, wwant, worst);
    free(pe);
}

/* y = x + pe[t]; in = {x}; pe (T,C) from ops_sin_ref */
typedef struct ops_sc { int64_t B, T, C; const double *pe; } ops_sc;

static void ops_sinus_ref(const void *ctx, double *const *in, double *y) {
    const ops_sc *c = (const ops_sc *)ctx;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < c->T * c->C; i++) y[b * c->T * c->C + i] = in[0][b * c->T * c->C + i] + c->pe[i];
}

/* y (B,T,C) against x + pe, elementwise within the table's bound plus the rounding of the add */
static double ops_sinus_err(const float *y, const float *x, int64_t B, int64_t T, int64_t C) {
    double worst = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < C; k++) {
                int64_t i = (b * T + t) * C + k;
                double want = (double)x[i] + ops_sin_ref(t, k, C);
                double e = fabs((double)y[i] - want) / (ops_sin_tol(t, k, C) + FLT_EPSILON * fabs(want));
                if (e != e) return INFINITY;
                if (e > worst) worst = e;
            }
    return worst;
}

static void ops_sinusoidal_case(int64_t B, int64_t T, int64_t C, ops_rng *g) {
    ops_sc c;
    char nm[128], wb[192];
    int64_t n = B * T * C;
    float *x = ops_falloc(n), *y = ops_falloc(n), *z = ops_falloc(n), *dy = ops_falloc(n);
    float *dx = ops_falloc(n), *dx1 = ops_falloc(n);
    tfm_tensor tx = tfm_tensor3(x, B, T, C), ty = tfm_tensor3(y, B, T, C), tz = tfm_tensor3(z, B, T, C);
    tfm_tensor tdy = tfm_tensor3(dy, B, T, C), tdx = tfm_tensor3(dx, B, T, C);
    double *in[1], *r, *pe = ops_dalloc(T * C);

    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < C; k++) pe[t * C + k] = ops_sin_ref(t, k, C);
    c.B = B; c.T = T; c.C = C; c.pe = pe;
    snprintf(nm, sizeof nm, "sinusoidal x=(%d,%d,%d)", (int)B, (int)T, (int)C);
    ops_fill_normal(x, n, g, 1, 0);
    ops_fill_normal(dy, n, g, 1, 0);
    ops_fill_nan(y, n);
    in[0] = ops_to_double(x, n);
    r = ops_to_double(dy, n);

    CHECK_OK(tfm_sinusoidal_forward(&ty, &tx));
    CHECK_MSG(ops_sinus_err(y, x, B, T, C) <= 1.0, "%s: forward off by %.3g of tolerance", nm,
              ops_sinus_err(y, x, B, T, C));
    CHECK_OK(tfm_sinusoidal_backward(&tdx, &tdy));
    if ((double)n * (double)n <= OPS_FD_WORK_MAX)
        ops_check_grad(OPS_W("dx"), dx, ops_sinus_ref, &c, in, 0, n, r, n);
    else
        ops_check_vs(OPS_W("dx"), dx, r, n); /* exact: dx = r */
    memcpy(dx1, dx, (size_t)n * sizeof(float));
    CHECK_OK(tfm_sinusoidal_backward(&tdx, &tdy));
    ops_check_twice(OPS_W("dx accumulates"), dx, dx1, n);

    memcpy(z, x, (size_t)n * sizeof(float));
    CHECK_OK(tfm_sinusoidal_forward(&tz, &tz));
    CHECK_MSG(ops_sinus_err(z, x, B, T, C) <= 1.0, "%s: forward in place off by %.3g of tolerance", nm,
              ops_sinus_err(z, x, B, T, C));

    free(x); free(y); free(z); free(dy); free(dx); free(dx1); free(in[0]); free(r); free(pe);
}

static void ops_test_sinusoidal(void) {
    ops_rng g = {1111};
    ops_sinusoidal_table_case(1, 1);
    ops_sinusoidal_table_case(1, 4);
    ops_sinusoidal_table_case(50, 1);
    ops_sinusoidal_table_case(50, 3);
    ops_sinusoidal_table_case(50, 16);
    ops_sinusoidal_table_case(37, 17);
    ops_sinusoidal_table_case(64, 64);
    /* spot values: pe[t,0] = sin t, pe[t,1] = cos t (exponent 0) */
    {
        float pe[3 * 4];
        tfm_tensor tpe = tfm_tensor2(pe, 3, 4);
        CHECK_OK(tfm_sinusoidal_table(&tpe));
        CHECK_NEAR(pe[0], 0.0, 1e-7);
        CHECK_NEAR(pe[1], 1.0, 1e-7);
        CHECK_NEAR(pe[4 + 0], sin(1.0), 1e-6);
        CHECK_NEAR(pe[4 + 1], cos(1.0), 1e-6);
        CHECK_NEAR(pe[8 + 2], sin(2.0 / 100.0), 1e-6); /* 10000^(2/4) = 100 */
        CHECK_NEAR(pe[8 + 3], cos(2.0 / 100.0), 1e-6);
    }
    ops_sinusoidal_case(1, 1, 1, &g);
    ops_sinusoidal_case(2, 5, 3, &g);
    ops_sinusoidal_case(1, 17, 17, &g);
    ops_sinusoidal_case(3, 1, 4, &g);
    ops_sinusoidal_case(2, 50, 16, &g);
    ops_sinusoidal_case(2, 50, 65, &g);
}

/* ---- add -------------------------------------------------------------------------------- */

typedef struct ops_n { int64_t n; } ops_n;

static void ops_add_ref(const void *ctx, double *const *in, double *y) {
    const ops_n *c = (const ops_n *)ctx;
    for (int64_t i = 0; i < c->n; i++) y[i] = in[0][i] + in[1][i];
}

static void ops_add_case(int nd, const int64_t *sh, ops_rng *g) {
    ops_n c;
    char nm[128], wb[192];
    int64_t n = ops_prod(nd, sh);
    float *a = ops_falloc(n), *b = ops_falloc(n), *y = ops_falloc(n), *z = ops_falloc(n);
    float *dy = ops_falloc(n), *da = ops_falloc(n), *db = ops_falloc(n), *da1 = ops_falloc(n);
    float *db1 = ops_falloc(n);
    tfm_tensor ta = ops_t(a, nd, sh), tb = ops_t(b, nd, sh), ty = ops_t(y, nd, sh), tz = ops_t(z, nd, sh);
    tfm_tensor tdy = ops_t(dy, nd, sh), tda = ops_t(da, nd, sh), tdb = ops_t(db, nd, sh);
    double *in[2], *r;

    c.n = n;
    snprintf(nm, sizeof nm, "add n=%d %dd", (int)n, nd);
    ops_fill_normal(a, n, g, 1, 0);
    ops_fill_normal(b, n, g, 1, 0);
    ops_fill_normal(dy, n, g, 1, 0);
    ops_fill_nan(y, n);
    in[0] = ops_to_double(a, n);
    in[1] = ops_to_double(b, n);
    r = ops_to_double(dy, n);

    CHECK_OK(tfm_add_forward(&ty, &ta, &tb));
    ops_check_fwd(OPS_W("forward"), y, ops_add_ref, &c, in, n);
    CHECK_OK(tfm_add_backward(&tda, &tdb, &tdy));
    if (n <= OPS_FULL_FD_MAX) {
        ops_check_grad(OPS_W("da"), da, ops_add_ref, &c, in, 0, n, r, n);
        ops_check_grad(OPS_W("db"), db, ops_add_ref, &c, in, 1, n, r, n);
    } else {
        ops_n c1;
        int64_t st[2] = {1, 1};
        c1.n = 1;
        ops_check_grad_rows(OPS_W("da"), da, ops_add_ref, &c1, NULL, in, 2, st, 0, n, r, 1, 1);
        ops_check_grad_rows(OPS_W("db"), db, ops_add_ref, &c1, NULL, in, 2, st, 1, n, r, 1, 1);
    }
    memcpy(da1, da, (size_t)n * sizeof(float));
    memcpy(db1, db, (size_t)n * sizeof(float));
    CHECK_OK(tfm_add_backward(&tda, &tdb, &tdy));
    ops_check_twice(OPS_W("da accumulates"), da, da1, n);
    ops_check_twice(OPS_W("db accumulates"), db, db1, n);
    memset(da, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_add_backward(&tda, NULL, &tdy));
    CHECK(ops_count_ne(da, dy, n) == 0);
    memset(db, 0, (size_t)n * sizeof(float));
    CHECK_OK(tfm_add_backward(NULL, &tdb, &tdy));
    CHECK(ops_count_ne(db, dy, n) == 0);

    /* in place: y aliases a, then b */
    memcpy(z, a, (size_t)n * sizeof(float));
    CHECK_OK(tfm_add_forward(&tz, &tz, &tb));
    ops_check_fwd(OPS_W("forward, y aliases a"), z, ops_add_ref, &c, in, n);
    memcpy(z, b, (size_t)n * sizeof(float));
    CHECK_OK(tfm_add_forward(&tz, &ta, &tz));
    ops_check_fwd(OPS_W("forward, y aliases b"), z, ops_add_ref, &c, in, n);

    free(a); free(b); free(y); free(z); free(dy); free(da); free(db); free(da1); free(db1);
    free(in[0]); free(in[1]); free(r);
}

static void ops_test_add(void) {
    static const int64_t s1[1] = {1}, s317[2] = {3, 17}, s235[3] = {2, 3, 5}, s4d[4] = {2, 1, 3, 17};
    static const int64_t s2x33x65[3] = {2, 33, 65};
    ops_rng g = {1212};
    ops_add_case(1, s1, &g);
    ops_add_case(2, s317, &g);
    ops_add_case(3, s235, &g);
    ops_add_case(4, s4d, &g);
    ops_add_case(3, s2x33x65, &g);
}

/* ---- pooling ---------------------------------------------------------------------------- */

/* y[b] = mean of x[b,0..len-1] (len = lens[b], or T when lens is NULL; 0 gives a zero row);
   cls: y[b] = x[b,0]. in = {x} */
typedef struct ops_pool { int64_t B, T, C; const int32_t *lens; int cls; } ops_pool;

static void ops_pool_ref(const void *ctx, double *const *in, double *y) {
    const ops_pool *c = (const ops_pool *)ctx;
    for (int64_t b = 0; b < c->B; b++) {
        int64_t len = c->cls ? 1 : (c->lens ? c->lens[b] : c->T);
        for (int64_t k = 0; k < c->C; k++) {
            double s = 0;
            for (int64_t t = 0; t < len; t++) s += in[0][(b * c->T + t) * c->C + k];
            y[b * c->C + k] = len > 0 ? s / (double)len : 0.0;
        }
    }
}

static void ops_pool_case(int cls, int64_t B, int64_t T, int64_t C, const int32_t *lens, ops_rng *g) {
    ops_pool c;
    char nm[128], wb[192];
    int64_t n = B * T * C, ny = B * C;
    float *x = ops_falloc(n), *y = ops_falloc(ny), *dy = ops_falloc(ny), *dx = ops_falloc(n);
    float *dx1 = ops_falloc(n);
    tfm_tensor tx = tfm_tensor3(x, B, T, C), tdx = tfm_tensor3(dx, B, T, C);
    tfm_tensor ty = tfm_tensor2(y, B, C), tdy = tfm_tensor2(dy, B, C);
    double *in[1], *r;

    c.B = B; c.T = T; c.C = C; c.lens = lens; c.cls = cls;
    snprintf(nm, sizeof nm, "%s x=(%d,%d,%d) lens %s", cls ? "cls_pool" : "mean_pool", (int)B, (int)T,
             (int)C, lens ? "given" : "NULL");
    ops_fill_normal(x, n, g, 1, 0);
    ops_fill_normal(dy, ny, g, 1, 0);
    ops_fill_nan(y, ny);
    in[0] = ops_to_double(x, n);
    r = ops_to_double(dy, ny);

    CHECK_OK(cls ? tfm_cls_pool_forward(&ty, &tx) : tfm_mean_pool_forward(&ty, &tx, lens));
    ops_check_fwd(OPS_W("forward"), y, ops_pool_ref, &c, in, ny);
    CHECK_OK(cls ? tfm_cls_pool_backward(&tdx, &tdy) : tfm_mean_pool_backward(&tdx, &tdy, lens));
    if ((double)n * (double)n <= OPS_FD_WORK_MAX) { /* each reference call reads all of x */
        ops_check_grad(OPS_W("dx"), dx, ops_pool_ref, &c, in, 0, n, r, ny);
    } else {
        /* exact: dx[b,t] = r[b] / len for t < len (len 1 for cls), else 0 */
        double *gx = ops_dalloc(n);
        for (int64_t b = 0; b < B; b++) {
            int64_t len = cls ? 1 : (lens ? lens[b] : T);
            for (int64_t t = 0; t < len; t++)
                for (int64_t k = 0; k < C; k++) gx[(b * T + t) * C + k] = r[b * C + k] / (double)len;
        }
        ops_check_vs(OPS_W("dx"), dx, gx, n);
        free(gx);
    }
    /* a zero-length sequence: exactly zero output and zero gradient */
    for (int64_t b = 0; lens && b < B; b++)
        if (lens[b] == 0) {
            for (int64_t k = 0; k < C; k++)
                CHECK_MSG(y[b * C + k] == 0, "%s: y[%d,%d] = %g with length 0", nm, (int)b, (int)k,
                          (double)y[b * C + k]);
            for (int64_t i = 0; i < T * C; i++)
                CHECK_MSG(dx[b * T * C + i] == 0, "%s: dx[%d] has %g with length 0", nm, (int)b,
                          (double)dx[b * T * C + i]);
        }
    memcpy(dx1, dx, (size_t)n * sizeof(float));
    CHECK_OK(cls ? tfm_cls_pool_backward(&tdx, &tdy) : tfm_mean_pool_backward(&tdx, &tdy, lens));
    ops_check_twice(OPS_W("dx accumulates"), dx, dx1, n);

    free(x); free(y); free(dy); free(dx); free(dx1); free(in[0]); free(r);
}

static void ops_test_mean_pool(void) {
    static const int32_t l3[3] = {5, 0, 2}, l4[4] = {1, 3, 0, 2}, l2[2] = {17, 1}, l3big[3] = {40, 0, 17};
    ops_rng g = {1313};
    ops_pool_case(0, 3, 5, 17, l3, &g);
    ops_pool_case(0, 4, 3, 1, l4, &g);
    ops_pool_case(0, 2, 17, 3, l2, &g);
    ops_pool_case(0, 1, 1, 1, NULL, &g);
    ops_pool_case(0, 2, 17, 3, NULL, &g);
    ops_pool_case(0, 3, 5, 17, NULL, &g);
    ops_pool_case(0, 3, 40, 65, l3big, &g);
    ops_pool_case(0, 3, 40, 65, NULL, &g);
}

static void ops_test_cls_pool(void) {
    ops_rng g = {1414};
    ops_pool_case(1, 1, 1, 1, NULL, &g);
    ops_pool_case(1, 3, 5, 17, NULL, &g);
    ops_pool_case(1, 2, 17, 3, NULL, &g);
    ops_pool_case(1, 3, 40, 65, NULL, &g);
}

/* tfm_fill_normal's moments, the pairing of Box-Muller outputs and independence from the thread
   count, on a tensor small enough for the direct stream and on one that is filled in chunks. The
   bounds are about five standard errors of each statistic for a true N(mean, std^2). */
static void ops_test_fill_normal_stats(void) {
    const int64_t sizes[2] = {20001, 600001};
    const double mu = 0.5, sd = 2.0;
    int saved = tfm_get_num_threads();
    for (int k = 0; k < 2; k++) {
        int64_t n = sizes[k];
        float *a = (float *)malloc((size_t)n * sizeof(float)), *b = (float *)malloc((size_t)n * sizeof(float));
        tfm_tensor ta = tfm_tensor1(a, n), tb = tfm_tensor1(b, n);
        tfm_rng ra, rb;
        double s1 = 0, s2 = 0, s3 = 0, s4 = 0, in1 = 0, c01 = 0, rn = (double)n;
        if (!a || !b) {
            TEST__FAIL("out of memory");
            free(a);
            free(b);
            return;
        }
        tfm_rng_seed(&ra, 77);
        tfm_rng_seed(&rb, 77);
        tfm_set_num_threads(1);
        CHECK_OK(tfm_fill_normal(&ta, &ra, (float)mu, (float)sd));
        tfm_set_num_threads(2);
        CHECK_OK(tfm_fill_normal(&tb, &rb, (float)mu, (float)sd));
        tfm_set_num_threads(saved);
        CHECK_MSG(memcmp(a, b, (size_t)n * sizeof(float)) == 0, "n=%lld: 1 and 2 threads fill differently", (long long)n);
        CHECK_MSG(tfm_rng_u64(&ra) == tfm_rng_u64(&rb), "n=%lld: the rng ends in different states", (long long)n);
        for (int64_t i = 0; i < n; i++) {
            double z = (a[i] - mu) / sd;
            s1 += z;
            s2 += z * z;
            s3 += z * z * z;
            s4 += z * z * z * z;
            in1 += fabs(z) < 1.0;
            if (i + 1 < n) c01 += z * ((a[i + 1] - mu) / sd); /* within and across Box-Muller pairs */
        }
        s1 /= rn;
        s2 /= rn;
        CHECK_MSG(fabs(s1) < 5.0 / sqrt(rn), "n=%lld: mean of z %.4g", (long long)n, s1);
        CHECK_MSG(fabs(s2 - 1.0) < 5.0 * sqrt(2.0 / rn), "n=%lld: variance of z %.4g", (long long)n, s2);
        CHECK_MSG(fabs(s3 / rn) < 5.0 * sqrt(15.0 / rn), "n=%lld: skewness %.4g", (long long)n, s3 / rn);
        CHECK_MSG(fabs(s4 / rn - 3.0) < 5.0 * sqrt(96.0 / rn), "n=%lld: kurtosis %.4g", (long long)n, s4 / rn);
        CHECK_MSG(fabs(in1 / rn - 0.682689) < 5.0 * sqrt(0.2166 / rn), "n=%lld: P(|z|<1) = %.4g", (long long)n, in1 / rn);
        CHECK_MSG(fabs(c01 / (rn - 1)) < 5.0 / sqrt(rn), "n=%lld: neighbour correlation %.4g", (long long)n, c01 / (rn - 1));
        free(a);
        free(b);
    }
}

static void suite_ops(void) {
    RUN(ops_test_matmul);
    RUN(ops_test_fill_normal_stats);
    RUN(ops_test_linear);
    RUN(ops_test_softmax);
    RUN(ops_test_log_softmax);
    RUN(ops_test_cross_entropy);
    RUN(ops_test_layernorm);
    RUN(ops_test_rmsnorm);
    RUN(ops_test_swiglu);
    RUN(ops_test_rope);
    RUN(ops_test_gelu);
    RUN(ops_test_relu);
    RUN(ops_test_dropout);
    RUN(ops_test_embedding);
    RUN(ops_test_pos_embedding);
    RUN(ops_test_sinusoidal);
    RUN(ops_test_add);
    RUN(ops_test_mean_pool);
    RUN(ops_test_cls_pool);
}
