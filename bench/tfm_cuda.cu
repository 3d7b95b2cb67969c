/* bench/tfm_cuda.cu - the implementation of transformer.h for bench/bench_gpu.c, with the CUDA kernels:
   the one file of the program that nvcc builds (bench_gpu.c stays C). Under TFM_CUDA_EMULATION it is
   built by g++ as C++ (-x c++ -DTFM_CUDA -DTFM_CUDA_EMULATION) against the CPU emulation of CUDA. */
#if defined(TFM_CUDA_EMULATION)
#include "../tests/cuda_emu.h"
#endif
#ifndef TFM_IMPLEMENTATION
#define TFM_IMPLEMENTATION
#endif
#ifndef TFM_CUDA
#define TFM_CUDA
#endif
#include "../transformer.h"

/* For bench_gpu.c (C): this thread's bf16 models with bf16 activations (on 1, the default) or with each
   product rounding its fp32 operands itself (0), the library's internal switch (tfm__bf16_acts_off). */
extern "C" void bench_gpu_bf16_acts(int on);
extern "C" void bench_gpu_bf16_acts(int on) { tfm__bf16_acts_off = !on; }

/* For bench_gpu.c: this thread's flash attention kernels with Hopper's warpgroup products where the build
   (sm_90a) and the heads (64 or 128 channels, padded) allow (on 1, the default), or by mma.sync everywhere
   (0), the library's internal switch (tfm__cu_wg_off). */
extern "C" void bench_gpu_wgmma(int on);
extern "C" void bench_gpu_wgmma(int on) { tfm__cu_wg_off = !on; }

/* For bench_gpu.c: decoding and training steps this thread has run by replaying their CUDA graph (the
   rest were captured, or ran launch by launch), the library's internal count (tfm__cu.replays). */
extern "C" unsigned long long bench_gpu_replays(void);
extern "C" unsigned long long bench_gpu_replays(void) { return tfm__cu.replays; }

/* For bench_gpu.c's --kernels: the hidden-layer gradient of a bf16 model's GELU (tanh) MLP, dx in bf16 (rows of
   the padded width) with db += its column sums, from the pre-activations x and the output gradient dy in bf16
   (rows of the padded width), as a training step runs it (tfm__op_act_bwd_bf16). */
extern "C" tfm_result bench_gpu_gelu_bwd_bf16(float *dx, float *db, const float *dy, const float *x, int64_t rows,
                                              int64_t cols);
extern "C" tfm_result bench_gpu_gelu_bwd_bf16(float *dx, float *db, const float *dy, const float *x, int64_t rows,
                                              int64_t cols) {
    tfm__op_act_bwd_bf16(TFM_DEVICE_CUDA, TFM_ACT_GELU_TANH, dx, db, dy, 1, x, rows, cols, 1);
    return tfm__cuda_check("bench_gpu_gelu_bwd_bf16");
}

/* For bench_gpu.c's --kernels: a bf16 model's GELU (tanh) activation y = act(x), x the pre-activations in bf16 as the
   MLP's first product writes them and y in bf16 (rows of the padded width), as a training step runs it
   (tfm__k_bias_act after tfm__linear_act_cuda's product) */
extern "C" tfm_result bench_gpu_gelu_fwd_bf16(float *y, const float *x, int64_t rows, int64_t cols);
extern "C" tfm_result bench_gpu_gelu_fwd_bf16(float *y, const float *x, int64_t rows, int64_t cols) {
    TFM__LAUNCH(tfm__k_bias_act, tfm__cu_grid2(rows, cols), tfm__cu_block2(cols), 0, (int)TFM_ACT_GELU_TANH, y, (float *)x,
                (const float *)NULL, rows, cols, tfm__bf16_ld(cols), tfm__bf16_ld(cols), 0);
    TFM__CU_LAUNCHED("tfm__k_bias_act");
    return tfm__cuda_check("bench_gpu_gelu_fwd_bf16");
}

/* For bench_gpu.c's --kernels set-up: rows x cols floats at src rounded to bf16 into dst (rows of the padded width,
   as a bf16 activation) */
extern "C" tfm_result bench_gpu_to_bf16(float *dst, const float *src, int64_t rows, int64_t cols);
extern "C" tfm_result bench_gpu_to_bf16(float *dst, const float *src, int64_t rows, int64_t cols) {
    tfm__op_to_bf16(TFM_DEVICE_CUDA, dst, tfm__bf16_ld(cols), 0, src, cols, rows, cols);
    return tfm__cuda_check("bench_gpu_to_bf16");
}

/* For bench_gpu.c's --kernels: a bf16 model's linear map with a bias, y = x w^T + b (x rows x in, w out x in),
   as a training step runs it: the bias added by cuBLASLt's epilogue (lt 1), or filled into y with the product
   added to it (lt 0: the thread's cuBLASLt switched off, as before the epilogue). */
extern "C" tfm_result bench_gpu_linear_bias(float *y, const float *x, const float *w, const float *b, int64_t rows,
                                            int64_t in, int64_t out, int lt);
extern "C" tfm_result bench_gpu_linear_bias(float *y, const float *x, const float *w, const float *b, int64_t rows,
                                            int64_t in, int64_t out, int lt) {
    int prec = tfm__model_prec, had = tfm__cu.has_lt, off = tfm__cu.lt_off;
    if (!lt) tfm__cu.has_lt = 0, tfm__cu.lt_off = 1;
    tfm__model_prec = TFM_PREC_BF16;
    tfm__op_linear(TFM_DEVICE_CUDA, y, out, x, in, w, b, rows, in, out, 0);
    tfm__model_prec = prec;
    if (!lt) tfm__cu.has_lt = had, tfm__cu.lt_off = off;
    return tfm__cuda_check("bench_gpu_linear_bias");
}

/* For bench_gpu.c's --kernels: a bf16 LM's logit gradients for a loss scale of 1, written in bf16 (rows of the
   padded width), as its training step takes them: with the loss in one launch from bf16 logits (fused 1:
   tfm_model_train_step's; x in bf16 rows of the padded width), or by the backward's own launch from fp32 logits
   and the forward's log-sum-exps (fused 0: tfm_model_backward's) */
extern "C" tfm_result bench_gpu_xent_bf16(float *dx, float *lse, const float *x, const int32_t *t, int64_t rows,
                                          int64_t cols, int fused);
extern "C" tfm_result bench_gpu_xent_bf16(float *dx, float *lse, const float *x, const int32_t *t, int64_t rows,
                                          int64_t cols, int fused) {
    int64_t counted;
    if (fused) (void)tfm__op_cross_entropy(TFM_DEVICE_CUDA, lse, x, 1, t, -100, 0.0f, rows, cols, &counted, dx);
    else tfm__op_cross_entropy_bwd(TFM_DEVICE_CUDA, dx, 1.0f, x, 0, lse, t, -100, 0.0f, rows, cols, 1);
    return tfm__cuda_check("bench_gpu_xent_bf16");
}
