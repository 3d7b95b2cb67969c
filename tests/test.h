/* tests/test.h - a tiny test harness: no dependencies.
   A test is a function; it passes when none of its checks failed. test_main.c runs every suite and
   ends with the line "N passed, N failed". */
#ifndef TFM_TEST_H
#define TFM_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

extern int test__failed_checks; /* failures in the test now running */
extern int test__verbose;

#define TEST__FAIL(...)                                                  \
    do {                                                                 \
        test__failed_checks++;                                           \
        printf("    FAIL %s:%d: ", __FILE__, __LINE__);                  \
        printf(__VA_ARGS__);                                             \
        printf("\n");                                                    \
    } while (0)

#define CHECK(cond)                                                      \
    do {                                                                 \
        if (!(cond)) TEST__FAIL("%s", #cond);                            \
    } while (0)

#define CHECK_MSG(cond, ...)                                             \
    do {                                                                 \
        if (!(cond)) TEST__FAIL(__VA_ARGS__);                            \
    } while (0)

/* |a - b| <= tol */
#define CHECK_NEAR(a, b, tol)                                            \
    do {                                                                 \
        double test__a = (double)(a), test__b = (double)(b);             \
        if (!(fabs(test__a - test__b) <= (double)(tol)))                 \
            TEST__FAIL("%s = %.9g, %s = %.9g, diff %.3g > %.3g", #a,      \
                       test__a, #b, test__b, fabs(test__a - test__b),    \
                       (double)(tol));                                   \
    } while (0)

/* expr returns TFM_OK */
#define CHECK_OK(expr)                                                   \
    do {                                                                 \
        tfm_result test__r = (expr);                                     \
        if (test__r != TFM_OK)                                           \
            TEST__FAIL("%s returned %d (%s): %s", #expr, (int)test__r,   \
                       tfm_result_string(test__r), tfm_last_error());    \
    } while (0)

/* expr returns `code` and tfm_last_error() contains `substr` */
#define CHECK_ERR(expr, code, substr)                                    \
    do {                                                                 \
        tfm_clear_error();                                               \
        tfm_result test__r = (expr);                                     \
        if (test__r != (code))                                           \
            TEST__FAIL("%s returned %d, want %d (%s); message: %s",      \
                       #expr, (int)test__r, (int)(code), #code,          \
                       tfm_last_error());                                \
        else if (!strstr(tfm_last_error(), (substr)))                    \
            TEST__FAIL("%s: message \"%s\" lacks \"%s\"", #expr,         \
                       tfm_last_error(), (substr));                      \
    } while (0)

/* --shard K/N, for both test programs (test_main.c, test_cuda.cu): run every Nth test from the Kth, counted
   after the name filter, so that N processes at once cover them all. test_shard_arg takes the "K/N" (0, with
   a message, when it is not one); test_shard_skip says whether the next test is another shard's. */
static int test__shard = 0, test__shards = 1, test__seen = 0;
static inline int test_shard_arg(const char *s) {
    if (sscanf(s, "%d/%d", &test__shard, &test__shards) != 2 || test__shards < 1 || test__shard < 0 ||
        test__shard >= test__shards) {
        fprintf(stderr, "--shard takes K/N with 0 <= K < N, not \"%s\"\n", s);
        return 0;
    }
    return 1;
}
static inline int test_shard_skip(void) { return test__seen++ % test__shards != test__shard; }

/* Relative error as the tests report it: max |got - want| / max |want| (want all zero: max |got|). */
static inline double test_rel_err(const float *got, const double *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d != d) return INFINITY; /* NaN */
        if (d > num) num = d;
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return den > 0 ? num / den : num;
}
static inline double test_rel_err_f(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (d != d) return INFINITY;
        if (d > num) num = d;
        if (fabs((double)want[i]) > den) den = fabs((double)want[i]);
    }
    return den > 0 ? num / den : num;
}

/* Check a relative error (as above) against tol and name it. */
#define CHECK_REL(what, err, tol)                                        \
    do {                                                                 \
        double test__e = (err);                                          \
        if (!(test__e <= (double)(tol)))                                 \
            TEST__FAIL("%s: relative error %.3g > %.3g", (what),         \
                       test__e, (double)(tol));                          \
    } while (0)

/* The runner of both test programs (test_main.c, test_cuda.cu; each includes this once): a test runs when
   test__filter (NULL: every name) is part of its name and --shard gives it to this process, starts with
   no failed checks and no error, and counts as passed or failed (FAIL and its name). test__begin (may be
   NULL) runs before each; with -v a passing test prints "ok" and its name, then test__note's words (a
   program's own: time, errors measured). */
typedef void (*test_fn)(void);
int test__failed_checks = 0;
int test__verbose = 0;
static int test__passed = 0, test__failed = 0;
static const char *test__filter = NULL;
static void (*test__begin)(void) = NULL;
static void (*test__note)(void) = NULL;
void test__run(const char *name, test_fn fn) {
    if (test__filter && !strstr(name, test__filter)) return;
    if (test_shard_skip()) return;
    test__failed_checks = 0;
    tfm_clear_error();
    if (test__begin) test__begin();
    fn();
    if (test__failed_checks) {
        test__failed++;
        printf("FAIL %s\n", name);
    } else {
        test__passed++;
        if (test__verbose) {
            printf("ok   %-28s", name);
            if (test__note) test__note();
            printf("\n");
        }
    }
    fflush(stdout);
}
#define RUN(fn) test__run(#fn, fn)

#endif
