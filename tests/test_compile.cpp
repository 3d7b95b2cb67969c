// tests/test_compile.cpp - compile check, the implementation TU as C++ (make test-compile).
// Built with -std=c++11 -Wall -Wextra -Werror -pedantic, with and without TFM_BLAS, TFM_STATIC and
// (TC_HOOKS) user-supplied TFM_SGEMM, TFM_MALLOC/TFM_FREE and TFM_ASSERT. Standard C++ headers come
// first (the header must not break them or be broken by them). The second TU, test_compile2.c, is
// compiled as C and linked in, so the declarations must have C linkage; with TFM_STATIC it is
// #included instead.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../transformer.h"
#include "../transformer.h"

#ifdef TC_HOOKS
namespace {
long tc_live = 0, tc_allocs = 0, tc_sgemms = 0, tc_assert_fails = 0;
void *tc_malloc(std::size_t n) {
    void *p = std::malloc(n);
    if (p) ++tc_live, ++tc_allocs;
    return p;
}
void tc_free(void *p) {
    if (p) --tc_live;
    std::free(p);
}
void tc_assert_fail(const char *what) {
    ++tc_assert_fails;
    std::printf("TFM_ASSERT(%s) failed\n", what);
}
void tc_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    ++tc_sgemms;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            C[i * ldc + j] = alpha * s + (beta == 0.0f ? 0.0f : beta * C[i * ldc + j]);
        }
}
} // namespace
#define TFM_MALLOC(sz, u) ((void)(u), tc_malloc(sz))
#define TFM_FREE(p, u) ((void)(u), tc_free(p))
#define TFM_ASSERT(x) ((x) ? (void)0 : tc_assert_fail(#x))
#define TFM_SGEMM(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) \
    tc_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
#endif

#define TFM_IMPLEMENTATION
#include "../transformer.h"
#include "../transformer.h"

#ifdef TFM_STATIC
#include "test_compile2.c"
#else
extern "C" int tc2_run(void);
#endif

// A cross-attention step written the way a C++ caller would.
static int cpp_cross_attention() {
    const int B = 2, Tq = 3, Tk = 5, C = 8;
    tfm_mha_desc d = {};
    d.d_model = C;
    d.n_heads = 4;
    d.cross = 1;
    d.max_batch = B;
    d.max_len = Tq;
    d.max_kv_len = Tk;
    tfm_mem mem = {};
    tfm_mha att;
    tfm_rng rng;
    tfm_rng_seed(&rng, 7);
    std::vector<float> x(B * Tq * C), kv(B * Tk * C), y(B * Tq * C), dx(B * Tq * C), dkv(B * Tk * C);
    for (std::size_t i = 0; i < x.size(); i++) x[i] = std::sin(0.1f * static_cast<float>(i));
    for (std::size_t i = 0; i < kv.size(); i++) kv[i] = std::cos(0.2f * static_cast<float>(i));
    tfm_tensor tx = tfm_tensor3(x.data(), B, Tq, C), tkv = tfm_tensor3(kv.data(), B, Tk, C);
    tfm_tensor ty = tfm_tensor3(y.data(), B, Tq, C), tdx = tfm_tensor3(dx.data(), B, Tq, C);
    tfm_tensor tdkv = tfm_tensor3(dkv.data(), B, Tk, C);
    const int32_t lens[B] = {5, 2};
    tfm_attn_opts o = {};
    o.key_lens = lens;

    tfm_result r = tfm_mha_init(&att, &d, &mem);
    if (r == TFM_OK) r = tfm_mem_alloc(&mem);
    if (r == TFM_OK) r = tfm_mha_init(&att, &d, &mem);
    if (r == TFM_OK) {
        tfm_mha_init_params(&att, &rng);
        r = tfm_mha_forward(&att, &ty, &tx, &tkv, &o);
    }
    if (r == TFM_OK) r = tfm_mha_backward(&att, &tdx, &tdkv, &ty);
    // a mismatched input must be refused with a shape error, not crash
    tfm_tensor bad = tfm_tensor3(x.data(), B, Tq, C / 2);
    tfm_result rbad = r == TFM_OK ? tfm_mha_forward(&att, &ty, &bad, &tkv, &o) : TFM_E_SHAPE;
    tfm_mem_free(&mem);
    if (r != TFM_OK) {
        std::printf("cross attention: %s: %s\n", tfm_result_string(r), tfm_last_error());
        return 1;
    }
    if (rbad != TFM_E_SHAPE) {
        std::printf("cross attention with C/2 channels returned %d, want TFM_E_SHAPE\n", int(rbad));
        return 1;
    }
    bool finite = std::all_of(y.begin(), y.end(), [](float v) { return std::isfinite(v); }) &&
                  std::all_of(dkv.begin(), dkv.end(), [](float v) { return std::isfinite(v); });
    if (!finite) {
        std::printf("cross attention: non-finite output or gradient\n");
        return 1;
    }
    return 0;
}

int main() {
#if defined(TC_HOOKS)
    const char *want = "TFM_SGEMM";
#elif defined(TFM_BLAS)
    const char *want = "cblas";
#else
    const char *want = "built-in";
#endif
    if (std::strcmp(tfm_sgemm_backend(), want) != 0) {
        std::printf("tfm_sgemm_backend() is \"%s\", want \"%s\"\n", tfm_sgemm_backend(), want);
        return 1;
    }
    if (cpp_cross_attention() != 0) return 1;
    if (tc2_run() != 0) return 1;
#ifdef TC_HOOKS
    (void)tc_assert_fail;
    tfm_scratch_release(); // the threads' scratch (attention's buffers), kept between calls until this
    if (tc_sgemms == 0 || tc_allocs == 0 || tc_live != 0 || tc_assert_fails != 0) {
        std::printf("hooks: %ld sgemm calls, %ld allocations, %ld not freed, %ld asserts failed\n",
                    tc_sgemms, tc_allocs, tc_live, tc_assert_fails);
        return 1;
    }
#endif
    return 0;
}
