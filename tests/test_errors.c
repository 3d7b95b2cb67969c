/* tests/test_errors.c - bad input gives an error code and a message, never a crash or a write.
   Every public function that takes caller input is called with NULL pointers, mismatched shapes and
   out-of-range values. Each check wants the right tfm_result and a tfm_last_error() text that names
   the function and what is wrong (the shapes as tfm_shape_str prints them, the field, the bad id).
   Outputs are filled with a sentinel first: a refused call must leave them untouched.
   Included by test_main.c (one TU); everything here is static and prefixed err_. */

#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* tfm_last_error() contains s (after a CHECK_ERR on the same call) */
#define ERR_HAS(s)                                                                             \
    CHECK_MSG(strstr(tfm_last_error(), (s)) != NULL, "message \"%s\" lacks \"%s\"",            \
              tfm_last_error(), (s))

/* expr fails with c1 or c2 and the message contains substr */
#define ERR_CHECK_EITHER(expr, c1, c2, substr)                                                 \
    do {                                                                                       \
        tfm_result err__r;                                                                     \
        tfm_clear_error();                                                                     \
        err__r = (expr);                                                                       \
        if (err__r != (c1) && err__r != (c2))                                                  \
            TEST__FAIL("%s returned %d, want %s or %s; message: %s", #expr, (int)err__r, #c1,  \
                       #c2, tfm_last_error());                                                 \
        else if (!strstr(tfm_last_error(), (substr)))                                          \
            TEST__FAIL("%s: message \"%s\" lacks \"%s\"", #expr, tfm_last_error(), (substr));  \
    } while (0)

/* n floats at p all still equal the sentinel */
#define ERR_UNTOUCHED(p, n) CHECK_MSG(err_untouched((p), (n)), "%s was written by a failing call", #p)

#define ERR_SENTINEL 1234.5f
#define ERR_NBUF 8
#define ERR_BUFLEN (1 << 16)

/* Scratch buffers for the tests: small (every check is about shapes, not sizes). */
static float err_mem[ERR_NBUF][ERR_BUFLEN];

/* Buffer i, every element set to the sentinel. */
static float *err_buf(int i) {
    int j;
    for (j = 0; j < ERR_BUFLEN; j++) err_mem[i][j] = ERR_SENTINEL;
    return err_mem[i];
}
/* Buffer i filled with small well-behaved values (inputs). */
static float *err_in(int i) {
    int j;
    for (j = 0; j < ERR_BUFLEN; j++) err_mem[i][j] = 0.01f * (float)((j * 7) % 13) - 0.05f;
    return err_mem[i];
}
static int err_untouched(const float *p, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (p[i] != ERR_SENTINEL) return 0;
    return 1;
}

/* ---- result codes and the error text ----------------------------------------------------- */

static void err_result_strings(void) {
    static const tfm_result codes[] = {TFM_OK,    TFM_E_ARG,    TFM_E_SHAPE,   TFM_E_NOMEM,
                                       TFM_E_IO,  TFM_E_FORMAT, TFM_E_NO_CUDA, TFM_E_CUDA};
    const int n = (int)(sizeof codes / sizeof codes[0]);
    int i, j;
    for (i = 0; i < n; i++) {
        const char *s = tfm_result_string(codes[i]);
        CHECK_MSG(s != NULL && s[0] != 0, "tfm_result_string(%d) is empty", (int)codes[i]);
        if (!s) continue;
        for (j = 0; j < i; j++) {
            const char *t = tfm_result_string(codes[j]);
            CHECK_MSG(t == NULL || strcmp(s, t) != 0, "codes %d and %d share the text \"%s\"",
                      (int)codes[i], (int)codes[j], s);
        }
    }
    /* a value outside the enum still gets a text */
    CHECK(tfm_result_string((tfm_result)42) != NULL);
    CHECK(tfm_result_string((tfm_result)-42) != NULL);
}

static void err_last_error(void) {
    float *p = err_buf(0);
    tfm_tensor t = tfm_tensor2(p, 2, 3);
    tfm_clear_error();
    CHECK(tfm_last_error() != NULL && tfm_last_error()[0] == 0);
    /* a successful call leaves no message */
    CHECK_OK(tfm_fill(&t, 1.0f));
    CHECK(tfm_last_error()[0] == 0);
    /* a failing one leaves one naming the function, until cleared */
    CHECK_ERR(tfm_fill(NULL, 1.0f), TFM_E_ARG, "tfm_fill");
    CHECK(tfm_last_error()[0] != 0);
    tfm_clear_error();
    CHECK(tfm_last_error()[0] == 0);
}

/* ---- tensors, fills, arenas -------------------------------------------------------------- */

static void err_tensors(void) {
    float *p = err_buf(0);
    tfm_tensor t = tfm_tensor2(p, 2, 3), z;
    tfm_rng rng;
    char buf[16];
    tfm_rng_seed(&rng, 1);
    memset(&z, 0, sizeof z);

    CHECK(tfm_numel(NULL) == 0);
    CHECK(tfm_numel(&z) == 0);
    CHECK(tfm_numel(&t) == 6);

    /* tfm_shape_str truncates and always terminates */
    memset(buf, 'x', sizeof buf);
    t = tfm_tensor3(p, 2, 8, 64);
    tfm_shape_str(&t, buf, 4);
    CHECK(buf[3] == 0 && buf[4] == 'x');
    CHECK(strncmp(buf, "(2,", 3) == 0);
    memset(buf, 'x', sizeof buf);
    CHECK(tfm_shape_str(&t, buf, 0) == buf && buf[0] == 'x');
    CHECK(strcmp(tfm_shape_str(&t, buf, sizeof buf), "(2,8,64)") == 0);
    tfm_shape_str(NULL, buf, sizeof buf);
    CHECK(memchr(buf, 0, sizeof buf) != NULL);
    tfm_shape_str(&z, buf, sizeof buf);
    CHECK(memchr(buf, 0, sizeof buf) != NULL);

    t = tfm_tensor2(p, 2, 3);
    CHECK_ERR(tfm_fill(NULL, 0.0f), TFM_E_ARG, "tfm_fill");
    /* no data, no dims, too many dims */
    z = tfm_tensor2(NULL, 2, 3);
    CHECK_ERR(tfm_fill(&z, 0.0f), TFM_E_ARG, "tfm_fill");
    z = t;
    z.ndim = 0;
    CHECK_ERR(tfm_fill(&z, 0.0f), TFM_E_ARG, "tfm_fill");
    z.ndim = TFM_MAX_DIMS + 1;
    CHECK_ERR(tfm_fill(&z, 0.0f), TFM_E_ARG, "tfm_fill");
    /* a negative dim is not a shape */
    z = tfm_tensor2(p, 2, -3);
    tfm_clear_error();
    CHECK(tfm_fill(&z, 0.0f) != TFM_OK);
    CHECK(strstr(tfm_last_error(), "tfm_fill") != NULL);
    ERR_UNTOUCHED(p, 16);
    /* shapes whose element count does not fit in 64 bits: refused, not wrapped around */
    z = tfm_tensor4(p, (int64_t)1 << 20, (int64_t)1 << 20, (int64_t)1 << 20, (int64_t)1 << 20);
    CHECK_ERR(tfm_fill(&z, 0.0f), TFM_E_SHAPE, "tfm_fill");
    z = tfm_tensor2(p, ((int64_t)1 << 62) + 1, 4); /* (2^62+1)*4 wraps to 4 */
    CHECK_ERR(tfm_fill(&z, 0.0f), TFM_E_SHAPE, "tfm_fill");
    if (strstr(tfm_last_error(), "tfm_fill")) {
        /* the same wrap in a kernel that walks the leading dim (run only once the count is checked:
           with a wrapped count it writes far past y) */
        tfm_tensor x3 = tfm_tensor3(p, ((int64_t)1 << 62) + 1, 1, 4), y2 = tfm_tensor2(p + 8, ((int64_t)1 << 62) + 1, 4);
        CHECK_ERR(tfm_cls_pool_forward(&y2, &x3), TFM_E_SHAPE, "tfm_cls_pool_forward");
    }
    ERR_UNTOUCHED(p, 16);
    p = err_buf(0);

    CHECK_ERR(tfm_fill_normal(NULL, &rng, 0.0f, 1.0f), TFM_E_ARG, "tfm_fill_normal");
    CHECK_ERR(tfm_fill_normal(&t, NULL, 0.0f, 1.0f), TFM_E_ARG, "tfm_fill_normal");
    ERR_HAS("rng");
    CHECK_ERR(tfm_fill_normal(&t, &rng, 0.0f, -1.0f), TFM_E_ARG, "tfm_fill_normal");
    ERR_HAS("std");
    CHECK_ERR(tfm_fill_normal(&t, &rng, (float)NAN, 1.0f), TFM_E_ARG, "tfm_fill_normal");
    CHECK_ERR(tfm_fill_uniform(NULL, &rng, 0.0f, 1.0f), TFM_E_ARG, "tfm_fill_uniform");
    CHECK_ERR(tfm_fill_uniform(&t, NULL, 0.0f, 1.0f), TFM_E_ARG, "tfm_fill_uniform");
    CHECK_ERR(tfm_fill_uniform(&t, &rng, 1.0f, 0.0f), TFM_E_ARG, "tfm_fill_uniform");
    ERR_UNTOUCHED(p, 6);
}

static void err_arenas(void) {
    tfm_arena a;
    tfm_mem m;
    unsigned char small[80];
    /* more than any allocator gives (2^50 bytes: past the address space, but not so large that
       valgrind calls it a "fishy" size); volatile so the compiler does not see it and warn */
    volatile size_t err_huge = SIZE_MAX > 0xffffffffu ? SIZE_MAX >> 14 : SIZE_MAX / 2;
    memset(&m, 0, sizeof m);

    CHECK_ERR(tfm_arena_init(NULL, NULL, 64), TFM_E_ARG, "tfm_arena_init");
    /* sizes no allocator can give: the arena stays empty, nothing leaks */
    CHECK_ERR(tfm_arena_init(&a, NULL, SIZE_MAX), TFM_E_NOMEM, "tfm_arena_init");
    CHECK(a.base == NULL && a.size == 0);
    CHECK_ERR(tfm_arena_init(&a, NULL, err_huge), TFM_E_NOMEM, "tfm_arena_init");
    CHECK(a.base == NULL);
    /* a caller buffer too small to hold one aligned byte */
    {
        unsigned char *mis = small + ((64 - ((uintptr_t)small & 63)) & 63) + 1; /* 63 bytes short */
        CHECK_ERR(tfm_arena_init(&a, mis, 8), TFM_E_NOMEM, "tfm_arena_init");
    }
    /* a real arena that runs out: NULL, overflow set, and tfm_mem_check names the arena */
    CHECK_OK(tfm_arena_init(&m.acts, small, sizeof small));
    CHECK(tfm_arena_alloc(&m.acts, 4096) == NULL);
    CHECK(m.acts.overflow);
    CHECK_ERR(tfm_mem_check(&m), TFM_E_NOMEM, "tfm_mem_check");
    ERR_HAS("acts");
    CHECK_ERR(tfm_mem_check(NULL), TFM_E_ARG, "tfm_mem_check");
    tfm_arena_free(&m.acts);
    CHECK(tfm_arena_alloc(NULL, 16) == NULL);
    /* a request whose aligned size wraps around: NULL and overflow, in a counting arena too */
    memset(&a, 0, sizeof a);
    CHECK(tfm_arena_alloc(&a, SIZE_MAX - 8) == NULL);
    CHECK(a.overflow);
    {
        int64_t shape[2] = {2, 3};
        tfm_tensor t = tfm_arena_tensor(&m.acts, 0, shape);
        CHECK(t.data == NULL);
        t = tfm_arena_tensor(&m.acts, TFM_MAX_DIMS + 1, shape);
        CHECK(t.data == NULL);
        t = tfm_arena_tensor(&m.acts, 2, NULL);
        CHECK(t.data == NULL);
    }

    CHECK_ERR(tfm_mem_alloc(NULL), TFM_E_ARG, "tfm_mem_alloc");
    /* an allocation that cannot succeed frees what came before it */
    memset(&m, 0, sizeof m);
    m.params.peak = 4096;
    m.grads.peak = 4096;
    m.acts.peak = err_huge;
    CHECK_ERR(tfm_mem_alloc(&m), TFM_E_NOMEM, "tfm_mem_alloc");
    ERR_HAS("acts");
    CHECK(m.params.base == NULL && m.grads.base == NULL && m.acts.base == NULL);
    tfm_mem_free(&m);
    /* allocating twice is refused (and the first allocation stays usable) */
    memset(&m, 0, sizeof m);
    m.params.peak = 256;
    CHECK_OK(tfm_mem_alloc(&m));
    CHECK_ERR(tfm_mem_alloc(&m), TFM_E_ARG, "tfm_mem_alloc");
    CHECK(m.params.base != NULL);
    tfm_mem_free(&m);
    CHECK(m.params.base == NULL);
    tfm_mem_free(NULL);
    tfm_mem_rewind(NULL);
    tfm_arena_free(NULL);
}

/* ---- sgemm ------------------------------------------------------------------------------- */

static void err_sgemm(void) {
    float *A = err_in(0), *B = err_in(1), *C = err_buf(2);
    /* A (4,3), B (3,5), C (4,5) */
    CHECK_ERR(tfm_sgemm(0, 0, -1, 5, 3, 1.0f, A, 3, B, 5, 0.0f, C, 5), TFM_E_ARG, "tfm_sgemm");
    ERR_HAS("M=-1");
    CHECK_ERR(tfm_sgemm(0, 0, 4, -5, 3, 1.0f, A, 3, B, 5, 0.0f, C, 5), TFM_E_ARG, "tfm_sgemm");
    CHECK_ERR(tfm_sgemm(0, 0, 4, 5, -3, 1.0f, A, 3, B, 5, 0.0f, C, 5), TFM_E_ARG, "tfm_sgemm");
    /* leading dims smaller than the rows they step over */
    CHECK_ERR(tfm_sgemm(0, 0, 4, 5, 3, 1.0f, A, 2, B, 5, 0.0f, C, 5), TFM_E_ARG, "tfm_sgemm");
    ERR_HAS("lda");
    CHECK_ERR(tfm_sgemm(1, 0, 4, 5, 3, 1.0f, A, 3, B, 5, 0.0f, C, 5), TFM_E_ARG, "lda"); /* (3,4): lda >= 4 */
    CHECK_ERR(tfm_sgemm(0, 0, 4, 5, 3, 1.0f, A, 3, B, 4, 0.0f, C, 5), TFM_E_ARG, "ldb");
    CHECK_ERR(tfm_sgemm(0, 1, 4, 5, 3, 1.0f, A, 3, B, 2, 0.0f, C, 5), TFM_E_ARG, "ldb"); /* (5,3): ldb >= 3 */
    CHECK_ERR(tfm_sgemm(0, 0, 4, 5, 3, 1.0f, A, 3, B, 5, 0.0f, C, 4), TFM_E_ARG, "ldc");
    CHECK_ERR(tfm_sgemm(0, 0, 4, 5, 3, 1.0f, NULL, 3, B, 5, 0.0f, C, 5), TFM_E_ARG, "tfm_sgemm");
    CHECK_ERR(tfm_sgemm(0, 0, 4, 5, 3, 1.0f, A, 3, NULL, 5, 0.0f, C, 5), TFM_E_ARG, "tfm_sgemm");
    CHECK_ERR(tfm_sgemm(0, 0, 4, 5, 3, 1.0f, A, 3, B, 5, 0.0f, NULL, 5), TFM_E_ARG, "tfm_sgemm");
    ERR_UNTOUCHED(C, 4 * 5);
    /* empty products are fine, with or without pointers */
    CHECK_OK(tfm_sgemm(0, 0, 0, 0, 0, 1.0f, NULL, 1, NULL, 1, 0.0f, NULL, 1));

    CHECK_ERR(tfm_sgemm_batched(0, 0, 4, 5, 3, 1.0f, A, 3, 12, B, 5, 15, 0.0f, C, 5, 20, -1), TFM_E_ARG,
              "tfm_sgemm_batched");
    ERR_HAS("batch");
    CHECK_ERR(tfm_sgemm_batched(0, 0, -4, 5, 3, 1.0f, A, 3, 12, B, 5, 15, 0.0f, C, 5, 20, 2), TFM_E_ARG,
              "tfm_sgemm_batched");
    CHECK_ERR(tfm_sgemm_batched(0, 0, 4, 5, 3, 1.0f, A, 1, 12, B, 5, 15, 0.0f, C, 5, 20, 2), TFM_E_ARG,
              "lda");
    CHECK_ERR(tfm_sgemm_batched(0, 0, 4, 5, 3, 1.0f, A, 3, -12, B, 5, 15, 0.0f, C, 5, 20, 2), TFM_E_ARG,
              "tfm_sgemm_batched");
    /* output matrices that overlap would race */
    CHECK_ERR(tfm_sgemm_batched(0, 0, 4, 5, 3, 1.0f, A, 3, 12, B, 5, 15, 0.0f, C, 5, 10, 2), TFM_E_ARG,
              "strideC");
    CHECK_ERR(tfm_sgemm_batched(0, 0, 4, 5, 3, 1.0f, A, 3, 12, B, 5, 15, 0.0f, NULL, 5, 20, 2), TFM_E_ARG,
              "tfm_sgemm_batched");
    ERR_UNTOUCHED(C, 2 * 4 * 5);
}

/* ---- ops --------------------------------------------------------------------------------- */

static void err_matmul(void) {
    float *a = err_in(0), *b = err_in(1), *c = err_buf(2), *da = err_buf(3), *db = err_buf(4);
    tfm_tensor ta = tfm_tensor2(a, 2, 3), tb = tfm_tensor2(b, 4, 5), tc = tfm_tensor2(c, 2, 5);
    tfm_tensor tda, tdb, tdc;

    CHECK_ERR(tfm_matmul_forward(&tc, &ta, &tb, 0, 0), TFM_E_SHAPE, "tfm_matmul_forward");
    ERR_HAS("(2,3)");
    ERR_HAS("(4,5)");
    /* op(a) (2,3) x (3,5) -> (2,5); c given as (2,6) */
    tb = tfm_tensor2(b, 3, 5);
    tc = tfm_tensor2(c, 2, 6);
    CHECK_ERR(tfm_matmul_forward(&tc, &ta, &tb, 0, 0), TFM_E_SHAPE, "tfm_matmul_forward");
    ERR_HAS("(2,6)");
    tc = tfm_tensor2(c, 2, 5);
    /* transposes: a^T is (3,2), which does not fit b (3,5) */
    CHECK_ERR(tfm_matmul_forward(&tc, &ta, &tb, 1, 0), TFM_E_SHAPE, "tfm_matmul_forward");
    CHECK_ERR(tfm_matmul_forward(&tc, &ta, &tb, 0, 1), TFM_E_SHAPE, "tfm_matmul_forward");
    /* batched: batch sizes differ */
    {
        tfm_tensor a3 = tfm_tensor3(a, 2, 2, 3), b3 = tfm_tensor3(b, 3, 3, 5), c3 = tfm_tensor3(c, 2, 2, 5);
        CHECK_ERR(tfm_matmul_forward(&c3, &a3, &b3, 0, 0), TFM_E_SHAPE, "tfm_matmul_forward");
        ERR_HAS("(2,2,3)");
        ERR_HAS("(3,3,5)");
        /* 2-D with 3-D */
        CHECK_ERR(tfm_matmul_forward(&c3, &a3, &tb, 0, 0), TFM_E_SHAPE, "tfm_matmul_forward");
    }
    CHECK_ERR(tfm_matmul_forward(NULL, &ta, &tb, 0, 0), TFM_E_ARG, "tfm_matmul_forward");
    {
        /* c over a's memory: the product would read what it already wrote */
        tfm_tensor sq = tfm_tensor2(a, 3, 3), sb = tfm_tensor2(b, 3, 3);
        CHECK_ERR(tfm_matmul_forward(&sq, &sq, &sb, 0, 0), TFM_E_ARG, "tfm_matmul_forward");
        ERR_HAS("alias");
    }
    CHECK_ERR(tfm_matmul_forward(&tc, NULL, &tb, 0, 0), TFM_E_ARG, "tfm_matmul_forward");
    CHECK_ERR(tfm_matmul_forward(&tc, &ta, NULL, 0, 0), TFM_E_ARG, "tfm_matmul_forward");
    ERR_UNTOUCHED(c, 2 * 6);

    tda = tfm_tensor2(da, 2, 3);
    tdb = tfm_tensor2(db, 3, 5);
    tdc = tfm_tensor2(err_in(5), 2, 5);
    {
        tfm_tensor bad = tfm_tensor2(da, 3, 2);
        CHECK_ERR(tfm_matmul_backward(&bad, &tdb, &tdc, &ta, &tb, 0, 0), TFM_E_SHAPE, "tfm_matmul_backward");
        ERR_HAS("(3,2)");
        bad = tfm_tensor2(db, 5, 3);
        CHECK_ERR(tfm_matmul_backward(&tda, &bad, &tdc, &ta, &tb, 0, 0), TFM_E_SHAPE, "tfm_matmul_backward");
        ERR_HAS("(5,3)");
        bad = tfm_tensor2(err_in(5), 2, 4);
        CHECK_ERR(tfm_matmul_backward(&tda, &tdb, &bad, &ta, &tb, 0, 0), TFM_E_SHAPE, "tfm_matmul_backward");
        ERR_HAS("(2,4)");
    }
    CHECK_ERR(tfm_matmul_backward(&tda, &tdb, NULL, &ta, &tb, 0, 0), TFM_E_ARG, "tfm_matmul_backward");
    CHECK_ERR(tfm_matmul_backward(&tda, &tdb, &tdc, NULL, &tb, 0, 0), TFM_E_ARG, "tfm_matmul_backward");
    ERR_UNTOUCHED(da, 6);
    ERR_UNTOUCHED(db, 15);
}

static void err_linear(void) {
    float *x = err_in(0), *w = err_in(1), *b = err_in(2), *y = err_buf(3);
    float *dx = err_buf(4), *dw = err_buf(5), *db = err_buf(6);
    tfm_tensor tx = tfm_tensor2(x, 4, 384), tw = tfm_tensor2(w, 256, 256), tb = tfm_tensor1(b, 256);
    tfm_tensor ty = tfm_tensor2(y, 4, 256);
    tfm_tensor tdx, tdw, tdb, tdy;

    /* the documented example: x has 384 columns, weight expects 256 */
    CHECK_ERR(tfm_linear_forward(&ty, &tx, &tw, &tb), TFM_E_SHAPE, "tfm_linear_forward");
    ERR_HAS("(4,384)");
    ERR_HAS("(256,256)");
    tx = tfm_tensor2(x, 4, 256);
    {
        tfm_tensor bad = tfm_tensor1(b, 128);
        CHECK_ERR(tfm_linear_forward(&ty, &tx, &tw, &bad), TFM_E_SHAPE, "tfm_linear_forward");
        ERR_HAS("(128)");
        bad = tfm_tensor2(y, 4, 128);
        CHECK_ERR(tfm_linear_forward(&bad, &tx, &tw, &tb), TFM_E_SHAPE, "tfm_linear_forward");
        ERR_HAS("(4,128)");
        bad = tfm_tensor2(y, 5, 256);
        CHECK_ERR(tfm_linear_forward(&bad, &tx, &tw, &tb), TFM_E_SHAPE, "tfm_linear_forward");
        ERR_HAS("(5,256)");
        /* (B,T,C) flattens to (N,C): 2*2 rows fit y's 4, 2*3 do not */
        bad = tfm_tensor3(x, 2, 3, 256);
        CHECK_ERR(tfm_linear_forward(&ty, &bad, &tw, &tb), TFM_E_SHAPE, "tfm_linear_forward");
        ERR_HAS("(2,3,256)");
    }
    CHECK_ERR(tfm_linear_forward(NULL, &tx, &tw, &tb), TFM_E_ARG, "tfm_linear_forward");
    {
        tfm_tensor sq = tfm_tensor2(x, 4, 256);
        CHECK_ERR(tfm_linear_forward(&sq, &tx, &tw, &tb), TFM_E_ARG, "alias");
    }
    CHECK_ERR(tfm_linear_forward(&ty, NULL, &tw, &tb), TFM_E_ARG, "tfm_linear_forward");
    CHECK_ERR(tfm_linear_forward(&ty, &tx, NULL, &tb), TFM_E_ARG, "tfm_linear_forward");
    ERR_UNTOUCHED(y, 5 * 256);

    tdx = tfm_tensor2(dx, 4, 256);
    tdw = tfm_tensor2(dw, 256, 256);
    tdb = tfm_tensor1(db, 256);
    tdy = tfm_tensor2(err_in(7), 4, 256);
    {
        tfm_tensor bad = tfm_tensor2(dw, 256, 128);
        CHECK_ERR(tfm_linear_backward(&tdx, &bad, &tdb, &tdy, &tx, &tw), TFM_E_SHAPE, "tfm_linear_backward");
        ERR_HAS("(256,128)");
        bad = tfm_tensor2(dx, 4, 255);
        CHECK_ERR(tfm_linear_backward(&bad, &tdw, &tdb, &tdy, &tx, &tw), TFM_E_SHAPE, "tfm_linear_backward");
        ERR_HAS("(4,255)");
        bad = tfm_tensor1(db, 255);
        CHECK_ERR(tfm_linear_backward(&tdx, &tdw, &bad, &tdy, &tx, &tw), TFM_E_SHAPE, "tfm_linear_backward");
        ERR_HAS("(255)");
        bad = tfm_tensor2(err_in(7), 3, 256);
        CHECK_ERR(tfm_linear_backward(&tdx, &tdw, &tdb, &bad, &tx, &tw), TFM_E_SHAPE, "tfm_linear_backward");
        ERR_HAS("(3,256)");
    }
    CHECK_ERR(tfm_linear_backward(&tdx, &tdw, &tdb, NULL, &tx, &tw), TFM_E_ARG, "tfm_linear_backward");
    CHECK_ERR(tfm_linear_backward(&tdx, &tdw, &tdb, &tdy, NULL, &tw), TFM_E_ARG, "tfm_linear_backward");
    CHECK_ERR(tfm_linear_backward(&tdx, &tdw, &tdb, &tdy, &tx, NULL), TFM_E_ARG, "tfm_linear_backward");
    ERR_UNTOUCHED(dx, 4 * 256);
    ERR_UNTOUCHED(dw, 256 * 256);
    ERR_UNTOUCHED(db, 256);
}

/* Shared by the element-wise and row-wise ops whose y has x's shape: fn(y, x) and fn(dx, dy, z). */
typedef tfm_result (*err_fwd_fn)(tfm_tensor *, const tfm_tensor *);
typedef tfm_result (*err_bwd_fn)(tfm_tensor *, const tfm_tensor *, const tfm_tensor *);

static void err_same_shape_pair(err_fwd_fn fwd, const char *fwd_name, err_bwd_fn bwd, const char *bwd_name) {
    float *x = err_in(0), *y = err_buf(1), *dx = err_buf(2), *dy = err_in(3);
    tfm_tensor tx = tfm_tensor2(x, 2, 4), ty = tfm_tensor2(y, 2, 5);
    tfm_tensor tdx = tfm_tensor2(dx, 2, 4), tdy = tfm_tensor2(dy, 2, 5);
    tfm_result r;

    tfm_clear_error();
    r = fwd(&ty, &tx);
    CHECK_MSG(r == TFM_E_SHAPE, "%s: y (2,5) for x (2,4) returned %d", fwd_name, (int)r);
    CHECK_MSG(strstr(tfm_last_error(), fwd_name) && strstr(tfm_last_error(), "(2,4)") &&
                  strstr(tfm_last_error(), "(2,5)"),
              "%s: message \"%s\" lacks the name or the shapes", fwd_name, tfm_last_error());
    r = fwd(NULL, &tx);
    CHECK_MSG(r == TFM_E_ARG, "%s: NULL y returned %d", fwd_name, (int)r);
    r = fwd(&ty, NULL);
    CHECK_MSG(r == TFM_E_ARG, "%s: NULL x returned %d", fwd_name, (int)r);
    ERR_UNTOUCHED(y, 10);

    tfm_clear_error();
    ty = tfm_tensor2(y, 2, 4);
    r = bwd(&tdx, &tdy, &tx);
    CHECK_MSG(r == TFM_E_SHAPE, "%s: dy (2,5) for dx (2,4) returned %d", bwd_name, (int)r);
    CHECK_MSG(strstr(tfm_last_error(), bwd_name) && strstr(tfm_last_error(), "(2,5)"),
              "%s: message \"%s\" lacks the name or the shape", bwd_name, tfm_last_error());
    tdy = tfm_tensor2(dy, 2, 4);
    tx = tfm_tensor2(x, 4, 2);
    r = bwd(&tdx, &tdy, &tx);
    CHECK_MSG(r == TFM_E_SHAPE, "%s: saved (4,2) for dy (2,4) returned %d", bwd_name, (int)r);
    CHECK_MSG(strstr(tfm_last_error(), "(4,2)") != NULL, "%s: message \"%s\" lacks (4,2)", bwd_name,
              tfm_last_error());
    tx = tfm_tensor2(x, 2, 4);
    r = bwd(NULL, &tdy, &tx);
    CHECK_MSG(r == TFM_E_ARG || r == TFM_OK, "%s: NULL dx returned %d", bwd_name, (int)r);
    r = bwd(&tdx, NULL, &tx);
    CHECK_MSG(r == TFM_E_ARG, "%s: NULL dy returned %d", bwd_name, (int)r);
    r = bwd(&tdx, &tdy, NULL);
    CHECK_MSG(r == TFM_E_ARG, "%s: NULL saved tensor returned %d", bwd_name, (int)r);
    ERR_UNTOUCHED(dx, 8);
}

static void err_softmax(void) {
    err_same_shape_pair(tfm_softmax_forward, "tfm_softmax_forward", tfm_softmax_backward,
                        "tfm_softmax_backward");
    err_same_shape_pair(tfm_log_softmax_forward, "tfm_log_softmax_forward", tfm_log_softmax_backward,
                        "tfm_log_softmax_backward");
    err_same_shape_pair(tfm_relu_forward, "tfm_relu_forward", tfm_relu_backward, "tfm_relu_backward");
}

static void err_cross_entropy(void) {
    float *logits = err_in(0), *lse = err_buf(1), *dl = err_buf(2), loss = ERR_SENTINEL;
    tfm_tensor tl = tfm_tensor2(logits, 3, 5), tlse = tfm_tensor1(lse, 3), tdl = tfm_tensor2(dl, 3, 5);
    int32_t good[3] = {0, 4, 2}, high[3] = {0, 1, 7}, neg[3] = {0, -1, 2}, ign[3] = {0, -100, 2};

    /* an id outside [0,V) in the last row: refused before any row is written */
    CHECK_ERR(tfm_cross_entropy_forward(&loss, &tlse, &tl, high, -100, 0.0f), TFM_E_ARG,
              "tfm_cross_entropy_forward");
    ERR_HAS("7");
    CHECK_ERR(tfm_cross_entropy_forward(&loss, &tlse, &tl, neg, -100, 0.0f), TFM_E_ARG,
              "tfm_cross_entropy_forward");
    ERR_HAS("-1");
    CHECK(loss == ERR_SENTINEL);
    ERR_UNTOUCHED(lse, 3);
    /* ignore_index itself is fine */
    CHECK_OK(tfm_cross_entropy_forward(&loss, &tlse, &tl, ign, -100, 0.0f));
    loss = ERR_SENTINEL;
    err_buf(1);

    CHECK_ERR(tfm_cross_entropy_forward(NULL, &tlse, &tl, good, -100, 0.0f), TFM_E_ARG,
              "tfm_cross_entropy_forward");
    CHECK_ERR(tfm_cross_entropy_forward(&loss, &tlse, &tl, NULL, -100, 0.0f), TFM_E_ARG,
              "tfm_cross_entropy_forward");
    CHECK_ERR(tfm_cross_entropy_forward(&loss, &tlse, NULL, good, -100, 0.0f), TFM_E_ARG,
              "tfm_cross_entropy_forward");
    {
        tfm_tensor bad = tfm_tensor1(lse, 2);
        CHECK_ERR(tfm_cross_entropy_forward(&loss, &bad, &tl, good, -100, 0.0f), TFM_E_SHAPE,
                  "tfm_cross_entropy_forward");
        ERR_HAS("(2)");
        ERR_HAS("(3,5)");
    }
    CHECK_ERR(tfm_cross_entropy_forward(&loss, &tlse, &tl, good, -100, -0.1f), TFM_E_ARG,
              "tfm_cross_entropy_forward");
    ERR_HAS("label_smoothing");
    CHECK_ERR(tfm_cross_entropy_forward(&loss, &tlse, &tl, good, -100, 1.5f), TFM_E_ARG,
              "tfm_cross_entropy_forward");
    ERR_HAS("label_smoothing");
    CHECK(loss == ERR_SENTINEL);
    ERR_UNTOUCHED(lse, 3);

    /* backward: a real lse, then the same faults */
    {
        float l2;
        CHECK_OK(tfm_cross_entropy_forward(&l2, &tlse, &tl, good, -100, 0.0f));
    }
    CHECK_ERR(tfm_cross_entropy_backward(&tdl, 1.0f, &tl, &tlse, high, -100, 0.0f), TFM_E_ARG,
              "tfm_cross_entropy_backward");
    ERR_HAS("7");
    CHECK_ERR(tfm_cross_entropy_backward(&tdl, 1.0f, &tl, &tlse, NULL, -100, 0.0f), TFM_E_ARG,
              "tfm_cross_entropy_backward");
    /* a NULL gradient is skipped */
    CHECK_OK(tfm_cross_entropy_backward(NULL, 1.0f, &tl, &tlse, good, -100, 0.0f));
    CHECK_ERR(tfm_cross_entropy_backward(&tdl, (float)NAN, &tl, &tlse, good, -100, 0.0f), TFM_E_ARG,
              "dloss");
    CHECK_ERR(tfm_cross_entropy_backward(&tdl, 1.0f, &tl, NULL, good, -100, 0.0f), TFM_E_ARG,
              "tfm_cross_entropy_backward");
    {
        tfm_tensor bad = tfm_tensor2(dl, 3, 4);
        CHECK_ERR(tfm_cross_entropy_backward(&bad, 1.0f, &tl, &tlse, good, -100, 0.0f), TFM_E_SHAPE,
                  "tfm_cross_entropy_backward");
        ERR_HAS("(3,4)");
        bad = tfm_tensor1(lse, 4);
        CHECK_ERR(tfm_cross_entropy_backward(&tdl, 1.0f, &tl, &bad, good, -100, 0.0f), TFM_E_SHAPE,
                  "tfm_cross_entropy_backward");
        ERR_HAS("(4)");
    }
    CHECK_ERR(tfm_cross_entropy_backward(&tdl, 1.0f, &tl, &tlse, good, -100, 2.0f), TFM_E_ARG,
              "label_smoothing");
    ERR_UNTOUCHED(dl, 15);
}

static void err_layernorm(void) {
    float *x = err_in(0), *g = err_in(1), *b = err_in(2), *y = err_buf(3), *mean = err_buf(4);
    float *rstd = err_buf(5), *dx = err_buf(6), *dg = err_buf(7);
    tfm_tensor tx = tfm_tensor2(x, 4, 8), tg = tfm_tensor1(g, 8), tb = tfm_tensor1(b, 8);
    tfm_tensor ty = tfm_tensor2(y, 4, 8), tm = tfm_tensor1(mean, 4), tr = tfm_tensor1(rstd, 4);
    tfm_tensor tdx = tfm_tensor2(dx, 4, 8), tdg = tfm_tensor1(dg, 8), tdy = tfm_tensor2(err_in(2), 4, 8);
    tfm_tensor bad;

    bad = tfm_tensor1(g, 7);
    CHECK_ERR(tfm_layernorm_forward(&ty, &tm, &tr, &tx, &bad, &tb, 1e-5f), TFM_E_SHAPE, "tfm_layernorm_forward");
    ERR_HAS("(7)");
    ERR_HAS("(4,8)");
    bad = tfm_tensor1(b, 9);
    CHECK_ERR(tfm_layernorm_forward(&ty, &tm, &tr, &tx, &tg, &bad, 1e-5f), TFM_E_SHAPE, "tfm_layernorm_forward");
    ERR_HAS("(9)");
    bad = tfm_tensor1(mean, 3);
    CHECK_ERR(tfm_layernorm_forward(&ty, &bad, &tr, &tx, &tg, &tb, 1e-5f), TFM_E_SHAPE, "tfm_layernorm_forward");
    ERR_HAS("(3)");
    bad = tfm_tensor1(rstd, 5);
    CHECK_ERR(tfm_layernorm_forward(&ty, &tm, &bad, &tx, &tg, &tb, 1e-5f), TFM_E_SHAPE, "tfm_layernorm_forward");
    ERR_HAS("(5)");
    bad = tfm_tensor2(y, 8, 4);
    CHECK_ERR(tfm_layernorm_forward(&bad, &tm, &tr, &tx, &tg, &tb, 1e-5f), TFM_E_SHAPE, "tfm_layernorm_forward");
    ERR_HAS("(8,4)");
    CHECK_ERR(tfm_layernorm_forward(NULL, &tm, &tr, &tx, &tg, &tb, 1e-5f), TFM_E_ARG, "tfm_layernorm_forward");
    CHECK_ERR(tfm_layernorm_forward(&ty, &tm, &tr, &tx, &tg, &tb, -1e-5f), TFM_E_ARG, "tfm_layernorm_forward");
    ERR_HAS("eps");
    CHECK_ERR(tfm_layernorm_forward(&ty, &tm, &tr, &tx, &tg, &tb, (float)NAN), TFM_E_ARG, "eps");
    CHECK_ERR(tfm_layernorm_forward(&ty, &tm, &tr, NULL, &tg, &tb, 1e-5f), TFM_E_ARG, "tfm_layernorm_forward");
    ERR_UNTOUCHED(y, 32);
    ERR_UNTOUCHED(mean, 4);
    ERR_UNTOUCHED(rstd, 4);

    /* backward with a valid mean/rstd */
    CHECK_OK(tfm_layernorm_forward(&ty, &tm, &tr, &tx, &tg, &tb, 1e-5f));
    bad = tfm_tensor1(dg, 6);
    CHECK_ERR(tfm_layernorm_backward(&tdx, &bad, NULL, &tdy, &tx, &tg, &tm, &tr), TFM_E_SHAPE,
              "tfm_layernorm_backward");
    ERR_HAS("(6)");
    bad = tfm_tensor1(rstd, 3);
    CHECK_ERR(tfm_layernorm_backward(&tdx, &tdg, NULL, &tdy, &tx, &tg, &tm, &bad), TFM_E_SHAPE,
              "tfm_layernorm_backward");
    ERR_HAS("(3)");
    bad = tfm_tensor2(err_in(2), 4, 7);
    CHECK_ERR(tfm_layernorm_backward(&tdx, &tdg, NULL, &bad, &tx, &tg, &tm, &tr), TFM_E_SHAPE,
              "tfm_layernorm_backward");
    ERR_HAS("(4,7)");
    CHECK_ERR(tfm_layernorm_backward(&tdx, &tdg, NULL, &tdy, &tx, &tg, NULL, &tr), TFM_E_ARG,
              "tfm_layernorm_backward");
    CHECK_ERR(tfm_layernorm_backward(&tdx, &tdg, NULL, NULL, &tx, &tg, &tm, &tr), TFM_E_ARG,
              "tfm_layernorm_backward");
    ERR_UNTOUCHED(dx, 32);
    ERR_UNTOUCHED(dg, 8);
}

static void err_gelu(void) {
    float *x = err_in(0), *y = err_buf(1), *dx = err_buf(2), *dy = err_in(3);
    tfm_tensor tx = tfm_tensor2(x, 2, 4), ty = tfm_tensor2(y, 2, 4), tdx = tfm_tensor2(dx, 2, 4);
    tfm_tensor tdy = tfm_tensor2(dy, 2, 4), bad = tfm_tensor2(y, 4, 2);

    CHECK_ERR(tfm_gelu_forward(&ty, &tx, (tfm_gelu_kind)7), TFM_E_ARG, "tfm_gelu_forward");
    ERR_HAS("kind");
    CHECK_ERR(tfm_gelu_forward(&bad, &tx, TFM_GELU_ERF), TFM_E_SHAPE, "tfm_gelu_forward");
    ERR_HAS("(2,4)");
    ERR_HAS("(4,2)");
    CHECK_ERR(tfm_gelu_forward(&ty, NULL, TFM_GELU_ERF), TFM_E_ARG, "tfm_gelu_forward");
    CHECK_ERR(tfm_gelu_forward(NULL, &tx, TFM_GELU_TANH), TFM_E_ARG, "tfm_gelu_forward");
    ERR_UNTOUCHED(y, 8);
    CHECK_ERR(tfm_gelu_backward(&tdx, &tdy, &tx, (tfm_gelu_kind)-1), TFM_E_ARG, "tfm_gelu_backward");
    ERR_HAS("kind");
    bad = tfm_tensor2(dy, 1, 8);
    CHECK_ERR(tfm_gelu_backward(&tdx, &bad, &tx, TFM_GELU_ERF), TFM_E_SHAPE, "tfm_gelu_backward");
    ERR_HAS("(1,8)");
    CHECK_ERR(tfm_gelu_backward(&tdx, &tdy, NULL, TFM_GELU_ERF), TFM_E_ARG, "tfm_gelu_backward");
    ERR_UNTOUCHED(dx, 8);
}

static void err_dropout(void) {
    float *x = err_in(0), *y = err_buf(1), *dx = err_buf(2), *dy = err_in(3);
    tfm_tensor tx = tfm_tensor2(x, 2, 4), ty = tfm_tensor2(y, 2, 4), tdx = tfm_tensor2(dx, 2, 4);
    tfm_tensor tdy = tfm_tensor2(dy, 2, 4), bad = tfm_tensor2(y, 2, 3);

    CHECK_ERR(tfm_dropout_forward(&ty, &tx, -0.1f, 1, 1), TFM_E_ARG, "tfm_dropout_forward");
    ERR_HAS("-0.1");
    CHECK_ERR(tfm_dropout_forward(&ty, &tx, 1.5f, 1, 1), TFM_E_ARG, "tfm_dropout_forward");
    ERR_HAS("1.5");
    CHECK_ERR(tfm_dropout_forward(&ty, &tx, (float)NAN, 1, 1), TFM_E_ARG, "tfm_dropout_forward");
    CHECK_ERR(tfm_dropout_forward(&bad, &tx, 0.5f, 1, 1), TFM_E_SHAPE, "tfm_dropout_forward");
    ERR_HAS("(2,3)");
    CHECK_ERR(tfm_dropout_forward(&ty, NULL, 0.5f, 1, 1), TFM_E_ARG, "tfm_dropout_forward");
    ERR_UNTOUCHED(y, 8);
    CHECK_ERR(tfm_dropout_backward(&tdx, &tdy, -0.5f, 1, 1), TFM_E_ARG, "tfm_dropout_backward");
    CHECK_ERR(tfm_dropout_backward(&tdx, &tdy, 2.0f, 1, 1), TFM_E_ARG, "tfm_dropout_backward");
    bad = tfm_tensor2(dy, 4, 2);
    CHECK_ERR(tfm_dropout_backward(&tdx, &bad, 0.5f, 1, 1), TFM_E_SHAPE, "tfm_dropout_backward");
    ERR_HAS("(4,2)");
    CHECK_ERR(tfm_dropout_backward(&tdx, NULL, 0.5f, 1, 1), TFM_E_ARG, "tfm_dropout_backward");
    ERR_UNTOUCHED(dx, 8);
}

static void err_embedding(void) {
    float *w = err_in(0), *y = err_buf(1), *dw = err_buf(2), *dy = err_in(3);
    tfm_tensor tw = tfm_tensor2(w, 10, 4), ty = tfm_tensor2(y, 3, 4), tdw = tfm_tensor2(dw, 10, 4);
    tfm_tensor tdy = tfm_tensor2(dy, 3, 4), bad;
    int32_t good[3] = {0, 9, 3}, high[3] = {1, 2, 10}, neg[3] = {1, -1, 2};

    /* the bad id is the last one: nothing may be written before it is found */
    CHECK_ERR(tfm_embedding_forward(&ty, high, &tw, 1.0f), TFM_E_ARG, "tfm_embedding_forward");
    ERR_HAS("10");
    CHECK_ERR(tfm_embedding_forward(&ty, neg, &tw, 1.0f), TFM_E_ARG, "tfm_embedding_forward");
    ERR_HAS("-1");
    CHECK_ERR(tfm_embedding_forward(&ty, NULL, &tw, 1.0f), TFM_E_ARG, "tfm_embedding_forward");
    CHECK_ERR(tfm_embedding_forward(&ty, good, NULL, 1.0f), TFM_E_ARG, "tfm_embedding_forward");
    CHECK_ERR(tfm_embedding_forward(NULL, good, &tw, 1.0f), TFM_E_ARG, "tfm_embedding_forward");
    CHECK_ERR(tfm_embedding_forward(&ty, good, &tw, (float)INFINITY), TFM_E_ARG, "scale");
    bad = tfm_tensor2(y, 3, 5);
    CHECK_ERR(tfm_embedding_forward(&bad, good, &tw, 1.0f), TFM_E_SHAPE, "tfm_embedding_forward");
    ERR_HAS("(3,5)");
    ERR_HAS("(10,4)");
    ERR_UNTOUCHED(y, 15);
    /* (B,T,C) output */
    ty = tfm_tensor3(y, 1, 3, 4);
    CHECK_OK(tfm_embedding_forward(&ty, good, &tw, 1.0f));

    CHECK_ERR(tfm_embedding_backward(&tdw, &tdy, high, 1.0f), TFM_E_ARG, "tfm_embedding_backward");
    ERR_HAS("10");
    CHECK_ERR(tfm_embedding_backward(&tdw, &tdy, neg, 1.0f), TFM_E_ARG, "tfm_embedding_backward");
    ERR_HAS("-1");
    CHECK_ERR(tfm_embedding_backward(&tdw, &tdy, NULL, 1.0f), TFM_E_ARG, "tfm_embedding_backward");
    CHECK_ERR(tfm_embedding_backward(&tdw, NULL, good, 1.0f), TFM_E_ARG, "tfm_embedding_backward");
    bad = tfm_tensor2(dy, 3, 5);
    CHECK_ERR(tfm_embedding_backward(&tdw, &bad, good, 1.0f), TFM_E_SHAPE, "tfm_embedding_backward");
    ERR_HAS("(3,5)");
    ERR_UNTOUCHED(dw, 40);
}

static void err_positions(void) {
    float *x = err_in(0), *w = err_in(1), *y = err_buf(2), *dx = err_buf(3), *dw = err_buf(4);
    float *dy = err_in(5), *pe = err_buf(6);
    tfm_tensor tx = tfm_tensor3(x, 2, 5, 4), tw = tfm_tensor2(w, 8, 4), ty = tfm_tensor3(y, 2, 5, 4);
    tfm_tensor tdx = tfm_tensor3(dx, 2, 5, 4), tdw = tfm_tensor2(dw, 8, 4), tdy = tfm_tensor3(dy, 2, 5, 4);
    tfm_tensor bad;

    /* fewer positions than steps */
    bad = tfm_tensor2(w, 3, 4);
    CHECK_ERR(tfm_pos_embedding_forward(&ty, &tx, &bad), TFM_E_SHAPE, "tfm_pos_embedding_forward");
    ERR_HAS("(3,4)");
    ERR_HAS("(2,5,4)");
    bad = tfm_tensor2(w, 8, 3);
    CHECK_ERR(tfm_pos_embedding_forward(&ty, &tx, &bad), TFM_E_SHAPE, "tfm_pos_embedding_forward");
    ERR_HAS("(8,3)");
    bad = tfm_tensor3(y, 2, 4, 4);
    CHECK_ERR(tfm_pos_embedding_forward(&bad, &tx, &tw), TFM_E_SHAPE, "tfm_pos_embedding_forward");
    ERR_HAS("(2,4,4)");
    CHECK_ERR(tfm_pos_embedding_forward(&ty, &tx, NULL), TFM_E_ARG, "tfm_pos_embedding_forward");
    CHECK_ERR(tfm_pos_embedding_forward(&ty, NULL, &tw), TFM_E_ARG, "tfm_pos_embedding_forward");
    ERR_UNTOUCHED(y, 40);

    bad = tfm_tensor2(dw, 4, 4);
    CHECK_ERR(tfm_pos_embedding_backward(&tdx, &bad, &tdy), TFM_E_SHAPE, "tfm_pos_embedding_backward");
    ERR_HAS("(4,4)");
    bad = tfm_tensor3(dx, 2, 5, 3);
    CHECK_ERR(tfm_pos_embedding_backward(&bad, &tdw, &tdy), TFM_E_SHAPE, "tfm_pos_embedding_backward");
    ERR_HAS("(2,5,3)");
    CHECK_ERR(tfm_pos_embedding_backward(&tdx, &tdw, NULL), TFM_E_ARG, "tfm_pos_embedding_backward");
    ERR_UNTOUCHED(dx, 40);
    ERR_UNTOUCHED(dw, 32);

    CHECK_ERR(tfm_sinusoidal_table(NULL), TFM_E_ARG, "tfm_sinusoidal_table");
    bad = tfm_tensor2(NULL, 8, 4);
    CHECK_ERR(tfm_sinusoidal_table(&bad), TFM_E_ARG, "tfm_sinusoidal_table");
    bad = tfm_tensor3(pe, 2, 8, 4);
    ERR_CHECK_EITHER(tfm_sinusoidal_table(&bad), TFM_E_SHAPE, TFM_E_ARG, "tfm_sinusoidal_table");
    ERR_UNTOUCHED(pe, 64);
    bad = tfm_tensor3(y, 2, 5, 3);
    CHECK_ERR(tfm_sinusoidal_forward(&bad, &tx), TFM_E_SHAPE, "tfm_sinusoidal_forward");
    ERR_HAS("(2,5,3)");
    ERR_HAS("(2,5,4)");
    CHECK_ERR(tfm_sinusoidal_forward(&ty, NULL), TFM_E_ARG, "tfm_sinusoidal_forward");
    ERR_UNTOUCHED(y, 40);
    bad = tfm_tensor3(dy, 2, 4, 4);
    CHECK_ERR(tfm_sinusoidal_backward(&tdx, &bad), TFM_E_SHAPE, "tfm_sinusoidal_backward");
    ERR_HAS("(2,4,4)");
    CHECK_ERR(tfm_sinusoidal_backward(&tdx, NULL), TFM_E_ARG, "tfm_sinusoidal_backward");
    ERR_UNTOUCHED(dx, 40);
}

static void err_add(void) {
    float *a = err_in(0), *b = err_in(1), *y = err_buf(2), *da = err_buf(3), *db = err_buf(4);
    tfm_tensor ta = tfm_tensor2(a, 2, 3), tb = tfm_tensor2(b, 3, 2), ty = tfm_tensor2(y, 2, 3);
    tfm_tensor tda = tfm_tensor2(da, 2, 3), tdb = tfm_tensor2(db, 2, 3), tdy = tfm_tensor2(err_in(5), 2, 3);
    tfm_tensor bad;

    CHECK_ERR(tfm_add_forward(&ty, &ta, &tb), TFM_E_SHAPE, "tfm_add_forward");
    ERR_HAS("(2,3)");
    ERR_HAS("(3,2)");
    tb = tfm_tensor2(b, 2, 3);
    bad = tfm_tensor1(y, 6);
    CHECK_ERR(tfm_add_forward(&bad, &ta, &tb), TFM_E_SHAPE, "tfm_add_forward");
    ERR_HAS("(6)");
    CHECK_ERR(tfm_add_forward(&ty, &ta, NULL), TFM_E_ARG, "tfm_add_forward");
    CHECK_ERR(tfm_add_forward(NULL, &ta, &tb), TFM_E_ARG, "tfm_add_forward");
    ERR_UNTOUCHED(y, 6);
    bad = tfm_tensor2(da, 3, 2);
    CHECK_ERR(tfm_add_backward(&bad, &tdb, &tdy), TFM_E_SHAPE, "tfm_add_backward");
    ERR_HAS("(3,2)");
    bad = tfm_tensor3(db, 1, 2, 3);
    CHECK_ERR(tfm_add_backward(&tda, &bad, &tdy), TFM_E_SHAPE, "tfm_add_backward");
    ERR_HAS("(1,2,3)");
    CHECK_ERR(tfm_add_backward(&tda, &tdb, NULL), TFM_E_ARG, "tfm_add_backward");
    ERR_UNTOUCHED(da, 6);
    ERR_UNTOUCHED(db, 6);
}

static void err_pooling(void) {
    float *x = err_in(0), *y = err_buf(1), *dx = err_buf(2), *dy = err_in(3);
    tfm_tensor tx = tfm_tensor3(x, 2, 3, 4), ty = tfm_tensor2(y, 2, 4), tdx = tfm_tensor3(dx, 2, 3, 4);
    tfm_tensor tdy = tfm_tensor2(dy, 2, 4), bad;
    int32_t good[2] = {3, 0}, high[2] = {1, 4}, neg[2] = {-1, 2};

    CHECK_OK(tfm_mean_pool_forward(&ty, &tx, good));
    err_buf(1);
    CHECK_ERR(tfm_mean_pool_forward(&ty, &tx, high), TFM_E_ARG, "tfm_mean_pool_forward");
    ERR_HAS("4");
    CHECK_ERR(tfm_mean_pool_forward(&ty, &tx, neg), TFM_E_ARG, "tfm_mean_pool_forward");
    ERR_HAS("-1");
    bad = tfm_tensor2(y, 2, 5);
    CHECK_ERR(tfm_mean_pool_forward(&bad, &tx, NULL), TFM_E_SHAPE, "tfm_mean_pool_forward");
    ERR_HAS("(2,5)");
    ERR_HAS("(2,3,4)");
    bad = tfm_tensor2(y, 3, 4);
    CHECK_ERR(tfm_mean_pool_forward(&bad, &tx, NULL), TFM_E_SHAPE, "tfm_mean_pool_forward");
    ERR_HAS("(3,4)");
    bad = tfm_tensor2(x, 6, 4);
    ERR_CHECK_EITHER(tfm_mean_pool_forward(&ty, &bad, NULL), TFM_E_SHAPE, TFM_E_ARG, "tfm_mean_pool_forward");
    CHECK_ERR(tfm_mean_pool_forward(&ty, NULL, NULL), TFM_E_ARG, "tfm_mean_pool_forward");
    ERR_UNTOUCHED(y, 10);

    CHECK_ERR(tfm_mean_pool_backward(&tdx, &tdy, high), TFM_E_ARG, "tfm_mean_pool_backward");
    ERR_HAS("4");
    bad = tfm_tensor2(dy, 2, 3);
    CHECK_ERR(tfm_mean_pool_backward(&tdx, &bad, NULL), TFM_E_SHAPE, "tfm_mean_pool_backward");
    ERR_HAS("(2,3)");
    CHECK_ERR(tfm_mean_pool_backward(&tdx, NULL, NULL), TFM_E_ARG, "tfm_mean_pool_backward");
    ERR_UNTOUCHED(dx, 24);

    bad = tfm_tensor2(y, 2, 3);
    CHECK_ERR(tfm_cls_pool_forward(&bad, &tx), TFM_E_SHAPE, "tfm_cls_pool_forward");
    ERR_HAS("(2,3)");
    ERR_HAS("(2,3,4)");
    bad = tfm_tensor2(x, 6, 4);
    ERR_CHECK_EITHER(tfm_cls_pool_forward(&ty, &bad), TFM_E_SHAPE, TFM_E_ARG, "tfm_cls_pool_forward");
    CHECK_ERR(tfm_cls_pool_forward(&ty, NULL), TFM_E_ARG, "tfm_cls_pool_forward");
    ERR_UNTOUCHED(y, 8);
    bad = tfm_tensor2(dy, 1, 4);
    CHECK_ERR(tfm_cls_pool_backward(&tdx, &bad), TFM_E_SHAPE, "tfm_cls_pool_backward");
    ERR_HAS("(1,4)");
    {
        /* the only gradient left out: skipped, or refused as a NULL argument */
        tfm_result r = tfm_cls_pool_backward(NULL, &tdy);
        CHECK_MSG(r == TFM_OK || r == TFM_E_ARG, "tfm_cls_pool_backward(NULL, dy) returned %d", (int)r);
        r = tfm_mean_pool_backward(NULL, &tdy, NULL);
        CHECK_MSG(r == TFM_OK || r == TFM_E_ARG, "tfm_mean_pool_backward(NULL, dy) returned %d", (int)r);
    }
    CHECK_ERR(tfm_cls_pool_backward(&tdx, NULL), TFM_E_ARG, "tfm_cls_pool_backward");
    ERR_UNTOUCHED(dx, 24);
}

/* ---- attention --------------------------------------------------------------------------- */

static void err_attention(void) {
    /* B 2, Tq 3, Tk 5, C 8, H 2 */
    float *q = err_in(0), *k = err_in(1), *v = err_in(2), *out = err_buf(3), *lse = err_buf(4);
    float *dq = err_buf(6), *dk = err_buf(7);
    tfm_tensor tq = tfm_tensor3(q, 2, 3, 8), tk = tfm_tensor3(k, 2, 5, 8), tv = tfm_tensor3(v, 2, 5, 8);
    tfm_tensor tout = tfm_tensor3(out, 2, 3, 8), tlse = tfm_tensor3(lse, 2, 2, 3);
    tfm_tensor tdq = tfm_tensor3(dq, 2, 3, 8), tdk = tfm_tensor3(dk, 2, 5, 8);
    tfm_tensor bad;
    tfm_attn_opts o;
    int32_t lens_high[2] = {5, 6}, lens_neg[2] = {-1, 5};
    memset(&o, 0, sizeof o);

    CHECK_ERR(tfm_attention_forward(&tout, &tlse, &tq, &tk, &tv, 3, &o), TFM_E_ARG, "tfm_attention_forward");
    ERR_HAS("n_heads");
    CHECK_ERR(tfm_attention_forward(&tout, &tlse, &tq, &tk, &tv, 0, &o), TFM_E_ARG, "tfm_attention_forward");
    ERR_HAS("n_heads");
    bad = tfm_tensor3(k, 2, 5, 6);
    CHECK_ERR(tfm_attention_forward(&tout, &tlse, &tq, &bad, &tv, 2, &o), TFM_E_SHAPE, "tfm_attention_forward");
    ERR_HAS("(2,3,8)");
    ERR_HAS("(2,5,6)");
    bad = tfm_tensor3(v, 2, 4, 8);
    CHECK_ERR(tfm_attention_forward(&tout, &tlse, &tq, &tk, &bad, 2, &o), TFM_E_SHAPE, "tfm_attention_forward");
    ERR_HAS("(2,4,8)");
    bad = tfm_tensor3(k, 3, 5, 8);
    CHECK_ERR(tfm_attention_forward(&tout, &tlse, &tq, &bad, &tv, 2, &o), TFM_E_SHAPE, "tfm_attention_forward");
    ERR_HAS("(3,5,8)");
    bad = tfm_tensor3(lse, 2, 2, 4);
    CHECK_ERR(tfm_attention_forward(&tout, &bad, &tq, &tk, &tv, 2, &o), TFM_E_SHAPE, "tfm_attention_forward");
    ERR_HAS("(2,2,4)");
    bad = tfm_tensor4(lse, 2, 2, 3, 5);
    CHECK_ERR(tfm_attention_forward(&tout, &bad, &tq, &tk, &tv, 2, &o), TFM_E_SHAPE, "tfm_attention_forward");
    ERR_HAS("(2,2,3,5)");
    bad = tfm_tensor3(out, 2, 5, 8);
    CHECK_ERR(tfm_attention_forward(&bad, &tlse, &tq, &tk, &tv, 2, &o), TFM_E_SHAPE, "tfm_attention_forward");
    ERR_HAS("(2,5,8)");
    CHECK_ERR(tfm_attention_forward(&tout, NULL, &tq, &tk, &tv, 2, &o), TFM_E_ARG, "tfm_attention_forward");
    CHECK_ERR(tfm_attention_forward(&tout, &tlse, NULL, &tk, &tv, 2, &o), TFM_E_ARG, "tfm_attention_forward");
    /* key lengths outside [0,Tk] */
    o.key_lens = lens_high;
    CHECK_ERR(tfm_attention_forward(&tout, &tlse, &tq, &tk, &tv, 2, &o), TFM_E_ARG, "tfm_attention_forward");
    ERR_HAS("6");
    o.key_lens = lens_neg;
    CHECK_ERR(tfm_attention_forward(&tout, &tlse, &tq, &tk, &tv, 2, &o), TFM_E_ARG, "tfm_attention_forward");
    ERR_HAS("-1");
    o.key_lens = NULL;
    /* dropout: p outside [0,1] */
    o.dropout = 1.5f;
    CHECK_ERR(tfm_attention_forward(&tout, &tlse, &tq, &tk, &tv, 2, &o), TFM_E_ARG, "tfm_attention_forward");
    ERR_HAS("dropout");
    o.dropout = -0.5f;
    CHECK_ERR(tfm_attention_forward(&tout, &tlse, &tq, &tk, &tv, 2, &o), TFM_E_ARG, "tfm_attention_forward");
    ERR_HAS("dropout");
    o.dropout = 0.0f;
    o.scale = (float)NAN;
    CHECK_ERR(tfm_attention_forward(&tout, &tlse, &tq, &tk, &tv, 2, &o), TFM_E_ARG, "tfm_attention_forward");
    ERR_HAS("scale");
    o.scale = 0.0f;
    ERR_UNTOUCHED(out, 48);
    ERR_UNTOUCHED(lse, 12);

    /* backward after a real forward */
    CHECK_OK(tfm_attention_forward(&tout, &tlse, &tq, &tk, &tv, 2, &o));
    bad = tfm_tensor3(dq, 2, 3, 4);
    CHECK_ERR(tfm_attention_backward(&bad, &tdk, NULL, &tout, &tq, &tk, &tv, &tout, &tlse, 2, &o), TFM_E_SHAPE,
              "tfm_attention_backward");
    ERR_HAS("(2,3,4)");
    bad = tfm_tensor3(out, 2, 3, 6);
    CHECK_ERR(tfm_attention_backward(&tdq, &tdk, NULL, &bad, &tq, &tk, &tv, &tout, &tlse, 2, &o), TFM_E_SHAPE,
              "tfm_attention_backward");
    ERR_HAS("(2,3,6)");
    CHECK_ERR(tfm_attention_backward(&tdq, &tdk, NULL, &tout, &tq, &tk, &tv, &bad, &tlse, 2, &o), TFM_E_SHAPE,
              "tfm_attention_backward");
    ERR_HAS("(2,3,6)");
    bad = tfm_tensor3(lse, 2, 3, 2);
    CHECK_ERR(tfm_attention_backward(&tdq, &tdk, NULL, &tout, &tq, &tk, &tv, &tout, &bad, 2, &o), TFM_E_SHAPE,
              "tfm_attention_backward");
    ERR_HAS("(2,3,2)");
    o.key_lens = lens_high;
    CHECK_ERR(tfm_attention_backward(&tdq, &tdk, NULL, &tout, &tq, &tk, &tv, &tout, &tlse, 2, &o), TFM_E_ARG,
              "tfm_attention_backward");
    ERR_HAS("6");
    o.key_lens = NULL;
    CHECK_ERR(tfm_attention_backward(&tdq, &tdk, NULL, NULL, &tq, &tk, &tv, &tout, &tlse, 2, &o), TFM_E_ARG,
              "tfm_attention_backward");
    CHECK_ERR(tfm_attention_backward(&tdq, &tdk, NULL, &tout, &tq, &tk, &tv, NULL, &tlse, 2, &o), TFM_E_ARG,
              "tfm_attention_backward");
    CHECK_ERR(tfm_attention_backward(&tdq, &tdk, NULL, &tout, &tq, &tk, &tv, &tout, NULL, 2, &o), TFM_E_ARG,
              "tfm_attention_backward");
    CHECK_ERR(tfm_attention_backward(&tdq, &tdk, NULL, &tout, &tq, &tk, &tv, &tout, &tlse, 3, &o), TFM_E_ARG,
              "n_heads");
    ERR_UNTOUCHED(dq, 48);
    ERR_UNTOUCHED(dk, 80);
}

/* A zeroed desc with the required fields set. */
static tfm_mha_desc err_desc(int C, int H, int maxB, int maxT) {
    tfm_mha_desc d;
    memset(&d, 0, sizeof d);
    d.d_model = C;
    d.n_heads = H;
    d.max_batch = maxB;
    d.max_len = maxT;
    return d;
}

static void err_mha_init(void) {
    tfm_mha m;
    tfm_mem mem;
    tfm_mha_desc d = err_desc(8, 2, 2, 4);
    memset(&mem, 0, sizeof mem);

    CHECK_ERR(tfm_mha_init(NULL, &d, &mem), TFM_E_ARG, "tfm_mha_init");
    CHECK_ERR(tfm_mha_init(&m, NULL, &mem), TFM_E_ARG, "tfm_mha_init");
    CHECK_ERR(tfm_mha_init(&m, &d, NULL), TFM_E_ARG, "tfm_mha_init");
    d = err_desc(0, 2, 2, 4);
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "tfm_mha_init");
    ERR_HAS("d_model");
    d = err_desc(-8, 2, 2, 4);
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "d_model");
    d = err_desc(8, 0, 2, 4);
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "tfm_mha_init");
    ERR_HAS("n_heads");
    d = err_desc(10, 4, 2, 4);
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "tfm_mha_init");
    ERR_HAS("n_heads");
    ERR_HAS("10");
    d = err_desc(8, -2, 2, 4);
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "n_heads");
    d = err_desc(8, 2, 2, 0);
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "tfm_mha_init");
    ERR_HAS("max_len");
    d = err_desc(8, 2, -1, 4);
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "max_batch");
    d = err_desc(8, 2, 2, 4);
    d.max_kv_len = -3;
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "max_kv_len");
    d = err_desc(8, 2, 2, 4);
    d.max_kv_len = 6; /* self-attention: keys are the queries */
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "max_kv_len");
    d = err_desc(40000, 1, 1, 1); /* in_proj alone would be 4.8e9 floats */
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "tfm_mha_init");
    ERR_HAS("40000");
    /* NULL layer or rng: nothing to do, and no crash */
    {
        tfm_rng rng;
        tfm_rng_seed(&rng, 1);
        tfm_mha_init_params(NULL, &rng);
        memset(&m, 0, sizeof m);
        tfm_mha_init_params(&m, NULL);
        tfm_mha_init_params(&m, &rng); /* a layer with no memory */
        tfm_block_init_params(NULL, &rng);
    }
    /* a refused desc has counted nothing */
    CHECK(mem.params.peak == 0 && mem.acts.peak == 0 && mem.scratch.peak == 0);
    /* a real tfm_mem smaller than the layer needs: TFM_E_NOMEM, not a write past the end */
    {
        static unsigned char small[256];
        tfm_mem tiny;
        memset(&tiny, 0, sizeof tiny);
        d = err_desc(8, 2, 2, 4);
        CHECK_OK(tfm_arena_init(&tiny.params, small, sizeof small));
        CHECK_ERR(tfm_mha_init(&m, &d, &tiny), TFM_E_NOMEM, "tfm_mha_init");
    }
}

/* A self- or cross-attention layer for the forward/backward checks (C 8, H 2, max B 2, max T 4). */
static tfm_result err_mha_make(tfm_mha *m, tfm_mem *mem, int cross, int no_grad) {
    tfm_mha_desc d = err_desc(8, 2, 2, 4);
    tfm_rng rng;
    tfm_result r;
    d.cross = cross;
    d.max_kv_len = cross ? 6 : 0;
    memset(mem, 0, sizeof *mem);
    mem->no_grad = no_grad;
    r = tfm_mha_init(m, &d, mem);
    if (r == TFM_OK) r = tfm_mem_alloc(mem);
    if (r == TFM_OK) r = tfm_mha_init(m, &d, mem);
    if (r != TFM_OK) return r;
    tfm_rng_seed(&rng, 3);
    tfm_mha_init_params(m, &rng);
    return TFM_OK;
}

static void err_mha_forward(void) {
    tfm_mha m, c;
    tfm_mem mem, cmem;
    float *x = err_in(0), *kv = err_in(1), *y = err_buf(2);
    tfm_tensor tx = tfm_tensor3(x, 2, 4, 8), ty = tfm_tensor3(y, 2, 4, 8), tkv = tfm_tensor3(kv, 2, 6, 8);
    tfm_tensor bad, bady;
    tfm_attn_opts o;
    int32_t lens_high[2] = {4, 5}, lens_neg[2] = {2, -1};
    memset(&o, 0, sizeof o);

    memset(&mem, 0, sizeof mem);
    memset(&cmem, 0, sizeof cmem);
    if (err_mha_make(&m, &mem, 0, 0) != TFM_OK || err_mha_make(&c, &cmem, 1, 0) != TFM_OK) {
        TEST__FAIL("could not make the layers: %s", tfm_last_error());
        tfm_mem_free(&mem);
        tfm_mem_free(&cmem);
        return;
    }

    /* a layer with no memory behind it */
    {
        tfm_mha z;
        tfm_mem count;
        tfm_mha_desc d = err_desc(8, 2, 2, 4);
        memset(&z, 0, sizeof z);
        CHECK_ERR(tfm_mha_forward(&z, &ty, &tx, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
        memset(&count, 0, sizeof count);
        CHECK_OK(tfm_mha_init(&z, &d, &count)); /* counting only */
        CHECK_ERR(tfm_mha_forward(&z, &ty, &tx, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
        CHECK_ERR(tfm_mha_backward(&z, &ty, NULL, &tx), TFM_E_ARG, "tfm_mha_backward");
    }

    /* batch and length beyond what the layer was sized for */
    bad = tfm_tensor3(x, 3, 4, 8);
    bady = tfm_tensor3(y, 3, 4, 8);
    CHECK_ERR(tfm_mha_forward(&m, &bady, &bad, NULL, &o), TFM_E_SHAPE, "tfm_mha_forward");
    ERR_HAS("(3,4,8)");
    ERR_HAS("batch 2");
    bad = tfm_tensor3(x, 2, 5, 8);
    bady = tfm_tensor3(y, 2, 5, 8);
    CHECK_ERR(tfm_mha_forward(&m, &bady, &bad, NULL, &o), TFM_E_SHAPE, "tfm_mha_forward");
    ERR_HAS("(2,5,8)");
    ERR_HAS("length 4");
    /* channels other than d_model */
    bad = tfm_tensor3(x, 2, 4, 6);
    bady = tfm_tensor3(y, 2, 4, 6);
    CHECK_ERR(tfm_mha_forward(&m, &bady, &bad, NULL, &o), TFM_E_SHAPE, "tfm_mha_forward");
    ERR_HAS("(2,4,6)");
    /* y not x's shape */
    bady = tfm_tensor3(y, 2, 3, 8);
    CHECK_ERR(tfm_mha_forward(&m, &bady, &tx, NULL, &o), TFM_E_SHAPE, "tfm_mha_forward");
    ERR_HAS("(2,3,8)");
    ERR_HAS("(2,4,8)");
    /* y must not alias x */
    bady = tfm_tensor3(x, 2, 4, 8);
    CHECK_ERR(tfm_mha_forward(&m, &bady, &tx, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
    CHECK_ERR(tfm_mha_forward(NULL, &ty, &tx, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
    CHECK_ERR(tfm_mha_forward(&m, NULL, &tx, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
    CHECK_ERR(tfm_mha_forward(&m, &ty, NULL, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
    /* self-attention given a second input */
    CHECK_ERR(tfm_mha_forward(&m, &ty, &tx, &tkv, &o), TFM_E_ARG, "tfm_mha_forward");
    ERR_HAS("xkv");
    /* key lengths outside [0,T] */
    o.key_lens = lens_high;
    CHECK_ERR(tfm_mha_forward(&m, &ty, &tx, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
    ERR_HAS("5");
    o.key_lens = lens_neg;
    CHECK_ERR(tfm_mha_forward(&m, &ty, &tx, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
    ERR_HAS("-1");
    o.key_lens = NULL;
    o.dropout = 1.5f;
    CHECK_ERR(tfm_mha_forward(&m, &ty, &tx, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
    ERR_HAS("dropout");
    o.dropout = -0.1f;
    CHECK_ERR(tfm_mha_forward(&m, &ty, &tx, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
    ERR_HAS("dropout");
    o.dropout = 0.0f;
    ERR_UNTOUCHED(y, 3 * 5 * 8);

    /* cross-attention: xkv required, Tk up to max_kv_len, batch and channels must match x */
    CHECK_ERR(tfm_mha_forward(&c, &ty, &tx, NULL, &o), TFM_E_ARG, "tfm_mha_forward");
    ERR_HAS("xkv");
    bad = tfm_tensor3(kv, 2, 7, 8);
    CHECK_ERR(tfm_mha_forward(&c, &ty, &tx, &bad, &o), TFM_E_SHAPE, "tfm_mha_forward");
    ERR_HAS("(2,7,8)");
    ERR_HAS("key length 6");
    bad = tfm_tensor3(kv, 1, 6, 8);
    CHECK_ERR(tfm_mha_forward(&c, &ty, &tx, &bad, &o), TFM_E_SHAPE, "tfm_mha_forward");
    ERR_HAS("(1,6,8)");
    bad = tfm_tensor3(kv, 2, 6, 4);
    CHECK_ERR(tfm_mha_forward(&c, &ty, &tx, &bad, &o), TFM_E_SHAPE, "tfm_mha_forward");
    ERR_HAS("(2,6,4)");
    o.key_lens = lens_high; /* 5 <= Tk = 6 is fine for cross */
    CHECK_OK(tfm_mha_forward(&c, &ty, &tx, &tkv, &o));
    o.key_lens = NULL;

    tfm_mem_free(&mem);
    tfm_mem_free(&cmem);
}

static void err_mha_backward(void) {
    tfm_mha m, c, ng;
    tfm_mem mem, cmem, ngmem;
    float *x = err_in(0), *kv = err_in(1), *y = err_buf(2), *dx = err_buf(3), *dkv = err_buf(4);
    tfm_tensor tx = tfm_tensor3(x, 2, 4, 8), ty = tfm_tensor3(y, 2, 4, 8), tkv = tfm_tensor3(kv, 2, 6, 8);
    tfm_tensor tdx = tfm_tensor3(dx, 2, 4, 8), tdkv = tfm_tensor3(dkv, 2, 6, 8), bad;
    tfm_attn_opts o;
    float dw_before[3 * 8 * 8];
    memset(&o, 0, sizeof o);

    memset(&mem, 0, sizeof mem);
    memset(&cmem, 0, sizeof cmem);
    memset(&ngmem, 0, sizeof ngmem);
    if (err_mha_make(&m, &mem, 0, 0) != TFM_OK || err_mha_make(&c, &cmem, 1, 0) != TFM_OK ||
        err_mha_make(&ng, &ngmem, 0, 1) != TFM_OK) {
        TEST__FAIL("could not make the layers: %s", tfm_last_error());
        tfm_mem_free(&mem);
        tfm_mem_free(&cmem);
        tfm_mem_free(&ngmem);
        return;
    }

    /* nothing to go back through yet */
    CHECK_ERR(tfm_mha_backward(&m, &tdx, NULL, &ty), TFM_E_ARG, "tfm_mha_backward");
    ERR_HAS("forward");

    CHECK_OK(tfm_mha_forward(&m, &ty, &tx, NULL, &o));
    err_buf(3);
    CHECK_OK(tfm_fill(&m.d_in_proj_weight, 0.0f));
    memcpy(dw_before, m.d_in_proj_weight.data, sizeof dw_before);
    /* dy and dx must have the forward's shape */
    bad = tfm_tensor3(y, 2, 3, 8);
    CHECK_ERR(tfm_mha_backward(&m, &tdx, NULL, &bad), TFM_E_SHAPE, "tfm_mha_backward");
    ERR_HAS("(2,3,8)");
    bad = tfm_tensor3(dx, 1, 4, 8);
    CHECK_ERR(tfm_mha_backward(&m, &bad, NULL, &ty), TFM_E_SHAPE, "tfm_mha_backward");
    ERR_HAS("(1,4,8)");
    CHECK_ERR(tfm_mha_backward(&m, &tdx, NULL, NULL), TFM_E_ARG, "tfm_mha_backward");
    CHECK_ERR(tfm_mha_backward(NULL, &tdx, NULL, &ty), TFM_E_ARG, "tfm_mha_backward");
    ERR_UNTOUCHED(dx, 64);
    CHECK_MSG(memcmp(dw_before, m.d_in_proj_weight.data, sizeof dw_before) == 0,
              "d_in_proj_weight was written by a failing call");

    /* a layer whose tfm_mem had no_grad has nothing to add gradients into */
    CHECK_OK(tfm_mha_forward(&ng, &ty, &tx, NULL, &o));
    CHECK_ERR(tfm_mha_backward(&ng, &tdx, NULL, &ty), TFM_E_ARG, "tfm_mha_backward");
    ERR_HAS("no_grad");

    /* cross: dxkv must be xkv's shape */
    CHECK_OK(tfm_mha_forward(&c, &ty, &tx, &tkv, &o));
    bad = tfm_tensor3(dkv, 2, 5, 8);
    CHECK_ERR(tfm_mha_backward(&c, &tdx, &bad, &ty), TFM_E_SHAPE, "tfm_mha_backward");
    ERR_HAS("(2,5,8)");
    ERR_UNTOUCHED(dx, 64);
    ERR_UNTOUCHED(dkv, 96);
    /* and a self-attention layer has no xkv gradient to give */
    CHECK_OK(tfm_mha_forward(&m, &ty, &tx, NULL, &o));
    CHECK_ERR(tfm_mha_backward(&m, &tdx, &tdkv, &ty), TFM_E_ARG, "tfm_mha_backward");
    ERR_HAS("dxkv");

    tfm_mem_free(&mem);
    tfm_mem_free(&cmem);
    tfm_mem_free(&ngmem);
}

/* ---- transformer layers ------------------------------------------------------------------ */

static tfm_block_desc err_block_desc(int cross) {
    tfm_block_desc d;
    memset(&d, 0, sizeof d);
    d.d_model = 8;
    d.n_heads = 2;
    d.d_ff = 16;
    d.max_batch = 2;
    d.max_len = 4;
    d.cross = cross;
    d.max_kv_len = cross ? 6 : 0;
    return d;
}

static void err_block_init(void) {
    tfm_block b;
    tfm_mem mem;
    tfm_block_desc d = err_block_desc(0);
    memset(&mem, 0, sizeof mem);

    CHECK_ERR(tfm_block_init(NULL, &d, &mem), TFM_E_ARG, "tfm_block_init");
    CHECK_ERR(tfm_block_init(&b, NULL, &mem), TFM_E_ARG, "tfm_block_init");
    CHECK_ERR(tfm_block_init(&b, &d, NULL), TFM_E_ARG, "tfm_block_init");
    d.d_model = 0;
    CHECK_ERR(tfm_block_init(&b, &d, &mem), TFM_E_ARG, "tfm_block_init");
    ERR_HAS("d_model");
    d = err_block_desc(0);
    d.n_heads = 3;
    CHECK_ERR(tfm_block_init(&b, &d, &mem), TFM_E_ARG, "tfm_block_init");
    ERR_HAS("n_heads");
    d = err_block_desc(0);
    d.n_heads = 0;
    CHECK_ERR(tfm_block_init(&b, &d, &mem), TFM_E_ARG, "n_heads");
    d = err_block_desc(0);
    d.max_len = 0;
    CHECK_ERR(tfm_block_init(&b, &d, &mem), TFM_E_ARG, "tfm_block_init");
    ERR_HAS("max_len");
    d = err_block_desc(0);
    d.d_ff = -1;
    CHECK_ERR(tfm_block_init(&b, &d, &mem), TFM_E_ARG, "d_ff");
    d = err_block_desc(0);
    d.max_batch = -1;
    CHECK_ERR(tfm_block_init(&b, &d, &mem), TFM_E_ARG, "max_batch");
    d = err_block_desc(0);
    d.act = (tfm_activation)9;
    CHECK_ERR(tfm_block_init(&b, &d, &mem), TFM_E_ARG, "act");
    d = err_block_desc(0);
    d.dropout = 1.0f;
    CHECK_ERR(tfm_block_init(&b, &d, &mem), TFM_E_ARG, "dropout");
    d = err_block_desc(0);
    d.attn_dropout = -0.5f;
    CHECK_ERR(tfm_block_init(&b, &d, &mem), TFM_E_ARG, "attn_dropout");
    d = err_block_desc(0);
    d.ln_eps = -1e-5f;
    CHECK_ERR(tfm_block_init(&b, &d, &mem), TFM_E_ARG, "ln_eps");
    CHECK(mem.params.peak == 0 && mem.acts.peak == 0 && mem.scratch.peak == 0);
}

static tfm_result err_block_make(tfm_block *b, tfm_mem *mem, int cross, int no_grad) {
    tfm_block_desc d = err_block_desc(cross);
    tfm_rng rng;
    tfm_result r;
    memset(mem, 0, sizeof *mem);
    mem->no_grad = no_grad;
    r = tfm_block_init(b, &d, mem);
    if (r == TFM_OK) r = tfm_mem_alloc(mem);
    if (r == TFM_OK) r = tfm_block_init(b, &d, mem);
    if (r != TFM_OK) return r;
    tfm_rng_seed(&rng, 5);
    tfm_block_init_params(b, &rng);
    return TFM_OK;
}

/* Block options with the given self-attention and cross-attention lengths (a static: one at a time). */
static const tfm_attn_opts *err_bopts(const int32_t *lens, const int32_t *kv_lens) {
    static tfm_attn_opts o;
    memset(&o, 0, sizeof o);
    o.key_lens = lens;
    o.kv_lens = kv_lens;
    return &o;
}

static void err_block(void) {
    tfm_block b, c, ng;
    tfm_mem mem, cmem, ngmem;
    float *x = err_in(0), *kv = err_in(1), *y = err_buf(2), *dx = err_buf(3), *dkv = err_buf(4);
    tfm_tensor tx = tfm_tensor3(x, 2, 4, 8), ty = tfm_tensor3(y, 2, 4, 8), tkv = tfm_tensor3(kv, 2, 6, 8);
    tfm_tensor tdx = tfm_tensor3(dx, 2, 4, 8), tdkv = tfm_tensor3(dkv, 2, 6, 8), bad, bady;
    int32_t lens_high[2] = {4, 5}, lens_neg[2] = {-2, 1}, kv_high[2] = {7, 1};

    memset(&mem, 0, sizeof mem);
    memset(&cmem, 0, sizeof cmem);
    memset(&ngmem, 0, sizeof ngmem);
    if (err_block_make(&b, &mem, 0, 0) != TFM_OK || err_block_make(&c, &cmem, 1, 0) != TFM_OK ||
        err_block_make(&ng, &ngmem, 0, 1) != TFM_OK) {
        TEST__FAIL("could not make the blocks: %s", tfm_last_error());
        tfm_mem_free(&mem);
        tfm_mem_free(&cmem);
        tfm_mem_free(&ngmem);
        return;
    }
    {
        tfm_block z;
        memset(&z, 0, sizeof z);
        CHECK_ERR(tfm_block_forward(&z, &ty, &tx, NULL, NULL), TFM_E_ARG, "tfm_block_forward");
        CHECK_ERR(tfm_block_backward(&z, &tdx, NULL, &ty), TFM_E_ARG, "tfm_block_backward");
    }
    CHECK_ERR(tfm_block_forward(NULL, &ty, &tx, NULL, NULL), TFM_E_ARG, "tfm_block_forward");
    CHECK_ERR(tfm_block_forward(&b, NULL, &tx, NULL, NULL), TFM_E_ARG, "tfm_block_forward");
    CHECK_ERR(tfm_block_forward(&b, &ty, NULL, NULL, NULL), TFM_E_ARG, "tfm_block_forward");
    bad = tfm_tensor3(x, 3, 4, 8);
    bady = tfm_tensor3(y, 3, 4, 8);
    CHECK_ERR(tfm_block_forward(&b, &bady, &bad, NULL, NULL), TFM_E_SHAPE, "tfm_block_forward");
    ERR_HAS("(3,4,8)");
    ERR_HAS("batch 2");
    bad = tfm_tensor3(x, 2, 5, 8);
    bady = tfm_tensor3(y, 2, 5, 8);
    CHECK_ERR(tfm_block_forward(&b, &bady, &bad, NULL, NULL), TFM_E_SHAPE, "tfm_block_forward");
    ERR_HAS("(2,5,8)");
    ERR_HAS("length 4");
    bad = tfm_tensor3(x, 2, 4, 6);
    bady = tfm_tensor3(y, 2, 4, 6);
    CHECK_ERR(tfm_block_forward(&b, &bady, &bad, NULL, NULL), TFM_E_SHAPE, "tfm_block_forward");
    ERR_HAS("(2,4,6)");
    bady = tfm_tensor3(y, 2, 3, 8);
    CHECK_ERR(tfm_block_forward(&b, &bady, &tx, NULL, NULL), TFM_E_SHAPE, "tfm_block_forward");
    ERR_HAS("(2,3,8)");
    bady = tfm_tensor3(x, 2, 4, 8);
    CHECK_ERR(tfm_block_forward(&b, &bady, &tx, NULL, NULL), TFM_E_ARG, "tfm_block_forward");
    CHECK_ERR(tfm_block_forward(&b, &ty, &tx, &tkv, NULL), TFM_E_ARG, "tfm_block_forward");
    ERR_HAS("xkv");
    CHECK_ERR(tfm_block_forward(&b, &ty, &tx, NULL, err_bopts(lens_high, NULL)), TFM_E_ARG, "tfm_block_forward");
    ERR_HAS("lens");
    ERR_HAS("5");
    CHECK_ERR(tfm_block_forward(&b, &ty, &tx, NULL, err_bopts(lens_neg, NULL)), TFM_E_ARG, "tfm_block_forward");
    ERR_HAS("-2");
    ERR_UNTOUCHED(y, 3 * 5 * 8);

    CHECK_ERR(tfm_block_forward(&c, &ty, &tx, NULL, NULL), TFM_E_ARG, "tfm_block_forward");
    ERR_HAS("xkv");
    bad = tfm_tensor3(kv, 2, 7, 8);
    CHECK_ERR(tfm_block_forward(&c, &ty, &tx, &bad, NULL), TFM_E_SHAPE, "tfm_block_forward");
    ERR_HAS("(2,7,8)");
    bad = tfm_tensor3(kv, 1, 6, 8);
    CHECK_ERR(tfm_block_forward(&c, &ty, &tx, &bad, NULL), TFM_E_SHAPE, "tfm_block_forward");
    ERR_HAS("(1,6,8)");
    CHECK_ERR(tfm_block_forward(&c, &ty, &tx, &tkv, err_bopts(NULL, kv_high)), TFM_E_ARG, "tfm_block_forward");
    ERR_HAS("opts.kv_lens");
    ERR_HAS("7");
    ERR_UNTOUCHED(y, 3 * 5 * 8);
    {
        /* cross lengths to a block without cross-attention; attention-level options; a NaN in the mask */
        tfm_attn_opts o;
        float mask[4 * 4];
        int i;
        CHECK_ERR(tfm_block_forward(&b, &ty, &tx, NULL, err_bopts(NULL, kv_high)), TFM_E_ARG, "kv_lens");
        memset(&o, 0, sizeof o);
        o.dropout = 0.1f;
        CHECK_ERR(tfm_block_forward(&b, &ty, &tx, NULL, &o), TFM_E_ARG, "opts.dropout");
        memset(&o, 0, sizeof o);
        for (i = 0; i < 16; i++) mask[i] = i == 7 ? NAN : 0.0f;
        o.mask = mask;
        CHECK_ERR(tfm_block_forward(&b, &ty, &tx, NULL, &o), TFM_E_ARG, "opts.mask[7]");
        mask[7] = INFINITY;
        CHECK_ERR(tfm_block_forward(&b, &ty, &tx, NULL, &o), TFM_E_ARG, "opts.mask[7]");
    }

    /* backward */
    CHECK_ERR(tfm_block_backward(&b, &tdx, NULL, &ty), TFM_E_ARG, "tfm_block_backward");
    ERR_HAS("forward");
    CHECK_OK(tfm_block_forward(&b, &ty, &tx, NULL, NULL));
    err_buf(3);
    bad = tfm_tensor3(y, 2, 3, 8);
    CHECK_ERR(tfm_block_backward(&b, &tdx, NULL, &bad), TFM_E_SHAPE, "tfm_block_backward");
    ERR_HAS("(2,3,8)");
    bad = tfm_tensor3(dx, 2, 4, 7);
    CHECK_ERR(tfm_block_backward(&b, &bad, NULL, &ty), TFM_E_SHAPE, "tfm_block_backward");
    ERR_HAS("(2,4,7)");
    CHECK_ERR(tfm_block_backward(&b, &tdx, &tdkv, &ty), TFM_E_ARG, "tfm_block_backward");
    ERR_HAS("dxkv");
    CHECK_ERR(tfm_block_backward(&b, &tdx, NULL, NULL), TFM_E_ARG, "tfm_block_backward");
    CHECK_ERR(tfm_block_backward(NULL, &tdx, NULL, &ty), TFM_E_ARG, "tfm_block_backward");
    CHECK_OK(tfm_block_forward(&c, &ty, &tx, &tkv, NULL));
    bad = tfm_tensor3(dkv, 2, 5, 8);
    CHECK_ERR(tfm_block_backward(&c, &tdx, &bad, &ty), TFM_E_SHAPE, "tfm_block_backward");
    ERR_HAS("(2,5,8)");
    CHECK_OK(tfm_block_forward(&ng, &ty, &tx, NULL, NULL));
    CHECK_ERR(tfm_block_backward(&ng, &tdx, NULL, &ty), TFM_E_ARG, "tfm_block_backward");
    ERR_UNTOUCHED(dx, 64);
    ERR_UNTOUCHED(dkv, 96);

    tfm_mem_free(&mem);
    tfm_mem_free(&cmem);
    tfm_mem_free(&ngmem);
}

/* ---- models ------------------------------------------------------------------------------ */

/* A small valid config of each kind: V 11, C 8, H 2, one layer, max (2, 4). */
static tfm_config err_cfg(tfm_model_kind kind) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.vocab_size = 11;
    c.n_classes = kind == TFM_MODEL_ENCODER_CLASSIFIER ? 3 : 0;
    c.d_model = 8;
    c.n_heads = 2;
    c.n_layers = 1;
    c.d_ff = 16;
    c.max_len = 4;
    c.max_batch = 2;
    c.seed = 1;
    return c;
}

/* cfg with one field broken must fail in resolve, memory_size and init, naming the field */
#define ERR_CFG(field_stmt, name)                                                               \
    do {                                                                                        \
        tfm_config err__c = err_cfg(TFM_MODEL_DECODER_LM), err__o;                                    \
        size_t err__n = 0;                                                                      \
        tfm_model err__m;                                                                       \
        field_stmt;                                                                             \
        CHECK_ERR(tfm_config_resolve(&err__c, &err__o), TFM_E_ARG, name);                       \
        CHECK_ERR(tfm_model_memory_size(&err__c, &err__n), TFM_E_ARG, name);                    \
        CHECK_ERR(tfm_model_init(&err__m, &err__c, NULL, 0), TFM_E_ARG, name);                  \
    } while (0)

static void err_config(void) {
    tfm_config c = err_cfg(TFM_MODEL_DECODER_LM), out;
    tfm_model m;
    size_t n;

    CHECK_ERR(tfm_config_resolve(NULL, &out), TFM_E_ARG, "tfm_config_resolve");
    CHECK_ERR(tfm_config_resolve(&c, NULL), TFM_E_ARG, "tfm_config_resolve");
    CHECK_ERR(tfm_model_memory_size(NULL, &n), TFM_E_ARG, "tfm_model_memory_size");
    CHECK_ERR(tfm_model_memory_size(&c, NULL), TFM_E_ARG, "tfm_model_memory_size");
    CHECK_ERR(tfm_model_init(NULL, &c, NULL, 0), TFM_E_ARG, "tfm_model_init");
    CHECK_ERR(tfm_model_init(&m, NULL, NULL, 0), TFM_E_ARG, "tfm_model_init");

    ERR_CFG(err__c.kind = TFM_MODEL_NONE, "kind");
    ERR_CFG(err__c.kind = (tfm_model_kind)9, "kind");
    ERR_CFG(err__c.vocab_size = 0, "vocab_size");
    ERR_CFG(err__c.d_model = 0, "d_model");
    ERR_CFG(err__c.n_heads = 0, "n_heads");
    ERR_CFG(err__c.n_heads = 3, "n_heads");
    ERR_CFG(err__c.max_len = 0, "max_len");
    ERR_CFG(err__c.kind = TFM_MODEL_ENCODER_CLASSIFIER; err__c.n_classes = 0, "n_classes");
    ERR_CFG(err__c.n_layers = -1, "n_layers");
    ERR_CFG(err__c.max_batch = -2, "max_batch");
    ERR_CFG(err__c.d_ff = -16, "d_ff");
    ERR_CFG(err__c.act = (tfm_activation)7, "act");
    ERR_CFG(err__c.pos = (tfm_pos_kind)7, "pos");
    ERR_CFG(err__c.pool = (tfm_pool_kind)7, "pool");
    ERR_CFG(err__c.init = (tfm_init_kind)7, "init");
    ERR_CFG(err__c.dropout = 1.0f, "dropout");
    ERR_CFG(err__c.attn_dropout = -0.1f, "attn_dropout");
    ERR_CFG(err__c.label_smoothing = 1.5f, "label_smoothing");
    ERR_CFG(err__c.ln_eps = -1.0f, "ln_eps");
    ERR_CFG(err__c.init_std = (float)NAN, "init_std");
    ERR_CFG(err__c.kind = TFM_MODEL_ENCODER_CLASSIFIER; err__c.n_classes = 3; err__c.tie_output = 1, "tie_output");
    ERR_CFG(err__c.share_emb = 1, "share_emb");
    ERR_CFG(err__c.kind = TFM_MODEL_ENCODER_DECODER; err__c.share_emb = 1; err__c.tgt_vocab_size = 12, "share_emb");
    ERR_CFG(err__c.vocab_size = 1 << 30, "vocab");

    /* the message names the function the caller called */
    c.vocab_size = 0;
    CHECK_ERR(tfm_model_init(&m, &c, NULL, 0), TFM_E_ARG, "tfm_model_init");
    CHECK_ERR(tfm_model_memory_size(&c, &n), TFM_E_ARG, "tfm_model_memory_size");

    /* caller memory smaller than tfm_model_memory_size */
    c = err_cfg(TFM_MODEL_DECODER_LM);
    CHECK_OK(tfm_model_memory_size(&c, &n));
    {
        void *mem = malloc(n);
        CHECK_ERR(tfm_model_init(&m, &c, mem, n / 2), TFM_E_NOMEM, "tfm_model_init");
        CHECK_OK(tfm_model_init(&m, &c, mem, n));
        tfm_model_free(&m);
        free(mem);
    }
}

/* An int32 buffer of n copies of v. */
static void err_ids(int32_t *p, int n, int32_t v) {
    int i;
    for (i = 0; i < n; i++) p[i] = v;
}

static void err_model(void) {
    tfm_config c = err_cfg(TFM_MODEL_DECODER_LM);
    tfm_model m, cl, ed, inf;
    tfm_batch b;
    tfm_optim o;
    int32_t tok[3 * 5], tgt[3 * 5], lens[2];
    float loss = ERR_SENTINEL, norm = ERR_SENTINEL, w0;
    const tfm_param *p;

    memset(&m, 0, sizeof m);
    memset(&cl, 0, sizeof cl);
    memset(&ed, 0, sizeof ed);
    memset(&inf, 0, sizeof inf);
    memset(&o, 0, sizeof o);
    if (tfm_model_init(&m, &c, NULL, 0) != TFM_OK) {
        TEST__FAIL("tfm_model_init: %s", tfm_last_error());
        return;
    }
    c = err_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    CHECK_OK(tfm_model_init(&cl, &c, NULL, 0));
    c = err_cfg(TFM_MODEL_ENCODER_DECODER);
    c.max_tgt_len = 3;
    CHECK_OK(tfm_model_init(&ed, &c, NULL, 0));
    c = err_cfg(TFM_MODEL_DECODER_LM);
    c.inference_only = 1;
    CHECK_OK(tfm_model_init(&inf, &c, NULL, 0));

    /* calls on a model that does not exist (yet, or any more) */
    {
        tfm_model z;
        memset(&z, 0, sizeof z);
        memset(&b, 0, sizeof b);
        CHECK_ERR(tfm_model_forward(NULL, &b, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
        CHECK_ERR(tfm_model_forward(&z, &b, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
        CHECK_ERR(tfm_model_backward(NULL, 1.0f), TFM_E_ARG, "tfm_model_backward");
        CHECK_ERR(tfm_model_backward(&z, 1.0f), TFM_E_ARG, "tfm_model_backward");
        o.lr = 1e-3f;
        CHECK_ERR(tfm_model_step(NULL, &o, NULL), TFM_E_ARG, "tfm_model_step");
        CHECK_ERR(tfm_model_step(&z, &o, NULL), TFM_E_ARG, "tfm_model_step");
        CHECK(tfm_model_param(NULL, "head.weight") == NULL);
        CHECK(tfm_model_param(&z, "head.weight") == NULL);
        CHECK(tfm_model_logits(NULL).data == NULL);
        CHECK(tfm_model_logits(&z).data == NULL);
        tfm_model_train(NULL, 1);
        tfm_model_zero_grad(NULL);
        tfm_model_zero_grad(&z);
        tfm_model_free(NULL);
        {
            float lr;
            CHECK_ERR(tfm_optim_lr(NULL, 1, &lr), TFM_E_ARG, "tfm_optim_lr");
        }
    }
    CHECK(tfm_model_param(&m, NULL) == NULL);
    CHECK(tfm_model_param(&m, "no.such.parameter") == NULL);
    CHECK(tfm_model_logits(&m).data == NULL); /* no forward yet */

    /* batches that do not fit: LM, B 2, T 4, V 11 */
    err_ids(tok, 15, 1);
    err_ids(tgt, 15, 2);
    memset(&b, 0, sizeof b);
    b.batch = 2;
    b.len = 4;
    b.tokens = tok;
    b.targets = tgt;
    CHECK_ERR(tfm_model_forward(&m, NULL, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
    b.batch = 3;
    CHECK_ERR(tfm_model_forward(&m, &b, &loss, NULL), TFM_E_SHAPE, "tfm_model_forward");
    ERR_HAS("3");
    ERR_HAS("max_batch");
    b.batch = 0;
    CHECK_ERR(tfm_model_forward(&m, &b, &loss, NULL), TFM_E_SHAPE, "tfm_model_forward");
    b.batch = 2;
    b.len = 5;
    CHECK_ERR(tfm_model_forward(&m, &b, &loss, NULL), TFM_E_SHAPE, "tfm_model_forward");
    ERR_HAS("5");
    ERR_HAS("max_len");
    b.len = 4;
    b.tokens = NULL;
    CHECK_ERR(tfm_model_forward(&m, &b, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
    b.tokens = tok;
    tok[7] = 11;
    CHECK_ERR(tfm_model_forward(&m, &b, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
    ERR_HAS("11");
    tok[7] = -3;
    CHECK_ERR(tfm_model_forward(&m, &b, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
    ERR_HAS("-3");
    tok[7] = 1;
    tgt[7] = 11;
    CHECK_ERR(tfm_model_forward(&m, &b, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
    ERR_HAS("11");
    tgt[7] = -100; /* ignore_index defaults to -100 */
    lens[0] = 4;
    lens[1] = 5;
    b.lens = lens;
    CHECK_ERR(tfm_model_forward(&m, &b, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
    ERR_HAS("lens");
    b.lens = NULL;
    CHECK(loss == ERR_SENTINEL);
    CHECK(tfm_model_logits(&m).data == NULL); /* the refused batches left no forward behind */

    /* backward needs a forward with targets; step needs a valid optimizer */
    CHECK_ERR(tfm_model_backward(&m, 1.0f), TFM_E_ARG, "tfm_model_backward");
    ERR_HAS("forward");
    b.targets = NULL;
    CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
    CHECK_ERR(tfm_model_backward(&m, 1.0f), TFM_E_ARG, "tfm_model_backward");
    ERR_HAS("targets");
    b.targets = tgt;
    CHECK_OK(tfm_model_forward(&m, &b, &loss, NULL));
    CHECK_ERR(tfm_model_backward(&m, (float)NAN), TFM_E_ARG, "tfm_model_backward");
    ERR_HAS("loss_scale");
    tfm_model_zero_grad(&m);
    CHECK_OK(tfm_model_backward(&m, 1.0f));
    p = tfm_model_param(&m, "tok_emb.weight");
    CHECK(p != NULL);
    w0 = p ? p->value.data[0] : 0.0f;
    CHECK_ERR(tfm_model_step(&m, NULL, &norm), TFM_E_ARG, "tfm_model_step");
    memset(&o, 0, sizeof o);
    CHECK_ERR(tfm_model_step(&m, &o, &norm), TFM_E_ARG, "tfm_model_step");
    ERR_HAS("lr");
    o.lr = (float)INFINITY;
    CHECK_ERR(tfm_model_step(&m, &o, &norm), TFM_E_ARG, "lr");
    o.lr = 1e-3f;
    o.beta1 = 1.5f;
    CHECK_ERR(tfm_model_step(&m, &o, &norm), TFM_E_ARG, "beta1");
    o.beta1 = 0.0f;
    o.beta2 = -0.5f;
    CHECK_ERR(tfm_model_step(&m, &o, &norm), TFM_E_ARG, "beta2");
    o.beta2 = 0.0f;
    o.eps = -1.0f;
    CHECK_ERR(tfm_model_step(&m, &o, &norm), TFM_E_ARG, "eps");
    o.eps = 0.0f;
    o.weight_decay = -0.1f;
    CHECK_ERR(tfm_model_step(&m, &o, &norm), TFM_E_ARG, "weight_decay");
    o.weight_decay = 0.0f;
    o.clip_norm = -1.0f;
    CHECK_ERR(tfm_model_step(&m, &o, &norm), TFM_E_ARG, "clip_norm");
    o.clip_norm = 0.0f;
    o.schedule = (tfm_schedule)9;
    CHECK_ERR(tfm_model_step(&m, &o, &norm), TFM_E_ARG, "schedule");
    o.schedule = TFM_SCHED_COSINE;
    o.warmup_steps = 10;
    o.total_steps = 10;
    CHECK_ERR(tfm_model_step(&m, &o, &norm), TFM_E_ARG, "total_steps");
    o.schedule = TFM_SCHED_CONSTANT;
    o.warmup_steps = -1;
    CHECK_ERR(tfm_model_step(&m, &o, &norm), TFM_E_ARG, "warmup_steps");
    o.warmup_steps = 0;
    /* none of the refused steps moved a weight or counted */
    CHECK(p == NULL || p->value.data[0] == w0);
    CHECK(m.step == 0);
    CHECK_OK(tfm_model_step(&m, &o, &norm));
    CHECK(m.step == 1);

    /* inference-only: no backward, no step */
    CHECK_OK(tfm_model_forward(&inf, &b, &loss, NULL));
    CHECK_ERR(tfm_model_backward(&inf, 1.0f), TFM_E_ARG, "tfm_model_backward");
    ERR_HAS("inference_only");
    CHECK_ERR(tfm_model_step(&inf, &o, NULL), TFM_E_ARG, "tfm_model_step");
    ERR_HAS("inference_only");

    /* classifier: one label per sequence, in [0,n_classes) */
    err_ids(tgt, 15, 0);
    tgt[1] = 3;
    CHECK_ERR(tfm_model_forward(&cl, &b, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
    ERR_HAS("3");
    tgt[1] = 2;
    CHECK_OK(tfm_model_forward(&cl, &b, &loss, NULL));

    /* encoder-decoder: decoder inputs required, target length up to max_tgt_len */
    memset(&b, 0, sizeof b);
    b.batch = 2;
    b.len = 4;
    b.tokens = tok;
    b.tgt_len = 3;
    b.targets = tgt;
    err_ids(tgt, 15, 1);
    CHECK_ERR(tfm_model_forward(&ed, &b, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
    ERR_HAS("tgt_in");
    b.tgt_in = tok;
    b.tgt_len = 4;
    CHECK_ERR(tfm_model_forward(&ed, &b, &loss, NULL), TFM_E_SHAPE, "tfm_model_forward");
    ERR_HAS("max_tgt_len");
    b.tgt_len = 0;
    CHECK_ERR(tfm_model_forward(&ed, &b, &loss, NULL), TFM_E_SHAPE, "tfm_model_forward");
    b.tgt_len = 3;
    tok[5] = 11; /* in the decoder inputs and the source */
    CHECK_ERR(tfm_model_forward(&ed, &b, &loss, NULL), TFM_E_ARG, "tfm_model_forward");
    ERR_HAS("11");
    tok[5] = 1;
    CHECK_OK(tfm_model_forward(&ed, &b, &loss, NULL));

    /* generation */
    {
        int32_t prompt[4] = {1, 2, 3, 4}, src[4] = {1, 2, 3, 4}, out[8];
        int n_out = -1, i;
        tfm_gen_opts g;
        memset(&g, 0, sizeof g);
        g.max_new = 2;
        for (i = 0; i < 8; i++) out[i] = -7;
        CHECK_ERR(tfm_model_generate(NULL, NULL, 0, prompt, 2, &g, out, &n_out), TFM_E_ARG, "tfm_model_generate");
        CHECK_ERR(tfm_model_generate(&m, NULL, 0, NULL, 2, &g, out, &n_out), TFM_E_ARG, "tfm_model_generate");
        CHECK_ERR(tfm_model_generate(&m, NULL, 0, prompt, 2, NULL, out, &n_out), TFM_E_ARG, "tfm_model_generate");
        CHECK_ERR(tfm_model_generate(&m, NULL, 0, prompt, 2, &g, NULL, &n_out), TFM_E_ARG, "tfm_model_generate");
        CHECK_ERR(tfm_model_generate(&cl, NULL, 0, prompt, 2, &g, out, &n_out), TFM_E_ARG, "tfm_model_generate");
        ERR_HAS("classifier");
        /* prompt + new tokens beyond max_len (4) */
        g.max_new = 3;
        CHECK_ERR(tfm_model_generate(&m, NULL, 0, prompt, 2, &g, out, &n_out), TFM_E_ARG, "tfm_model_generate");
        ERR_HAS("max_len");
        g.max_new = 2;
        CHECK_ERR(tfm_model_generate(&m, NULL, 0, prompt, 0, &g, out, &n_out), TFM_E_ARG, "tfm_model_generate");
        /* a required field left at 0 */
        g.max_new = 0;
        CHECK_ERR(tfm_model_generate(&m, NULL, 0, prompt, 2, &g, out, &n_out), TFM_E_ARG, "max_new");
        g.max_new = -1;
        ERR_CHECK_EITHER(tfm_model_generate(&m, NULL, 0, prompt, 2, &g, out, &n_out), TFM_E_ARG, TFM_E_SHAPE,
                         "max_new");
        g.max_new = 2;
        g.temperature = -1.0f;
        CHECK_ERR(tfm_model_generate(&m, NULL, 0, prompt, 2, &g, out, &n_out), TFM_E_ARG, "temperature");
        g.temperature = 1.0f;
        g.top_k = -1;
        CHECK_ERR(tfm_model_generate(&m, NULL, 0, prompt, 2, &g, out, &n_out), TFM_E_ARG, "top_k");
        g.top_k = 0;
        g.has_stop = 1;
        g.stop_token = 11;
        CHECK_ERR(tfm_model_generate(&m, NULL, 0, prompt, 2, &g, out, &n_out), TFM_E_ARG, "stop_token");
        g.has_stop = 0;
        CHECK_ERR(tfm_model_generate(&m, src, 4, prompt, 2, &g, out, &n_out), TFM_E_ARG, "src");
        CHECK_ERR(tfm_model_generate(&ed, NULL, 0, prompt, 1, &g, out, &n_out), TFM_E_ARG, "src");
        /* ids out of range in the prompt or the source: named by the call the user made */
        prompt[1] = 11;
        CHECK_ERR(tfm_model_generate(&m, NULL, 0, prompt, 2, &g, out, &n_out), TFM_E_ARG, "tfm_model_generate");
        ERR_HAS("11");
        prompt[1] = 2;
        src[3] = -1;
        CHECK_ERR(tfm_model_generate(&ed, src, 4, prompt, 1, &g, out, &n_out), TFM_E_ARG, "tfm_model_generate");
        ERR_HAS("-1");
        src[3] = 4;
        CHECK_ERR(tfm_model_generate(&ed, src, 5, prompt, 1, &g, out, &n_out), TFM_E_ARG, "tfm_model_generate");
        for (i = 0; i < 8; i++) CHECK_MSG(out[i] == -7, "out[%d] was written by a failing call", i);
        CHECK_OK(tfm_model_generate(&m, NULL, 0, prompt, 2, &g, out, &n_out));
        CHECK(n_out == 2 && out[0] >= 0 && out[0] < 11 && out[1] >= 0 && out[1] < 11 && out[2] == -7);
        CHECK_OK(tfm_model_generate(&ed, src, 4, prompt, 1, &g, out, &n_out));
        CHECK(n_out == 2);
    }

    tfm_model_free(&m);
    tfm_model_free(&cl);
    tfm_model_free(&ed);
    tfm_model_free(&inf);
    CHECK(m.impl == NULL);
}

/* ---- CUDA in a CPU build ----------------------------------------------------------------- */

static void err_cuda(void) {
    float *x = err_in(0), *y = err_buf(1), *w = err_in(2);
    tfm_tensor tx = tfm_tensor2(x, 2, 4), ty = tfm_tensor2(y, 2, 4), tw = tfm_tensor2(w, 4, 4);
    tfm_tensor gx = tx, gy = ty;
    gx.device = TFM_DEVICE_CUDA;
    gy.device = TFM_DEVICE_CUDA;

    CHECK(tfm_cuda_available() == TFM_E_NO_CUDA);
    CHECK_ERR(tfm_cuda_set_tf32(1), TFM_E_NO_CUDA, "tfm_cuda_set_tf32");
    CHECK_ERR(tfm_cuda_set_graphs(1), TFM_E_NO_CUDA, "tfm_cuda_set_graphs");
    ERR_CHECK_EITHER(tfm_fill(&gy, 0.0f), TFM_E_NO_CUDA, TFM_E_ARG, "tfm_fill");
    ERR_CHECK_EITHER(tfm_softmax_forward(&ty, &gx), TFM_E_NO_CUDA, TFM_E_ARG, "tfm_softmax_forward");
    ERR_CHECK_EITHER(tfm_softmax_forward(&gy, &tx), TFM_E_NO_CUDA, TFM_E_ARG, "tfm_softmax_forward");
    ERR_CHECK_EITHER(tfm_linear_forward(&ty, &gx, &tw, NULL), TFM_E_NO_CUDA, TFM_E_ARG, "tfm_linear_forward");
    ERR_CHECK_EITHER(tfm_gelu_forward(&gy, &tx, TFM_GELU_ERF), TFM_E_NO_CUDA, TFM_E_ARG, "tfm_gelu_forward");
    ERR_UNTOUCHED(y, 8);
    {
        tfm_mha m;
        tfm_mem mem;
        float *xx = err_in(3), *yy = err_buf(4);
        tfm_tensor x3 = tfm_tensor3(xx, 2, 4, 8), y3 = tfm_tensor3(yy, 2, 4, 8);
        if (err_mha_make(&m, &mem, 0, 0) != TFM_OK) {
            TEST__FAIL("could not make the layer: %s", tfm_last_error());
            tfm_mem_free(&mem);
            return;
        }
        x3.device = TFM_DEVICE_CUDA;
        ERR_CHECK_EITHER(tfm_mha_forward(&m, &y3, &x3, NULL, NULL), TFM_E_NO_CUDA, TFM_E_ARG, "tfm_mha_forward");
        ERR_UNTOUCHED(yy, 64);
        tfm_mem_free(&mem);
    }
}

static void suite_errors(void) {
    RUN(err_result_strings);
    RUN(err_last_error);
    RUN(err_tensors);
    RUN(err_arenas);
    RUN(err_sgemm);
    RUN(err_matmul);
    RUN(err_linear);
    RUN(err_softmax);
    RUN(err_cross_entropy);
    RUN(err_layernorm);
    RUN(err_gelu);
    RUN(err_dropout);
    RUN(err_embedding);
    RUN(err_positions);
    RUN(err_add);
    RUN(err_pooling);
    RUN(err_attention);
    RUN(err_mha_init);
    RUN(err_mha_forward);
    RUN(err_mha_backward);
    RUN(err_block_init);
    RUN(err_block);
    RUN(err_config);
    RUN(err_model);
    RUN(err_cuda);
}
