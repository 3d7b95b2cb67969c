/* tests/test_compile2.c - compile check, second translation unit (make test-compile).
   It only includes the header, as every file of a program but one does, takes the address of every
   public function (so each declaration must have a definition somewhere in the program) and runs a
   small multi-head attention step. The implementation TU is test_compile.c (C) or test_compile.cpp
   (C++, which links this file compiled as C: the declarations must have C linkage). With TFM_STATIC
   there is no external definition to link against, so the implementation TU #includes this file.
   The code is valid C99 and C++11. */
#include "../transformer.h"

#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
int tc2_run(void);
extern int tc2_user_tag;
#ifdef __cplusplus
}
#endif
/* The model's allocator user pointer: &tc2_user_tag (test_compile.c's hooks count its calls). */
int tc2_user_tag;

/* A generic function pointer: casting any function pointer to it and back is allowed in C and C++
   (and void (*)(void) is the type GCC's -Wcast-function-type accepts for that). */
typedef void (*tc2_fn)(void);
#define TC2_FN(f) ((tc2_fn)(f))

/* Every function declared by transformer.h. */
static const tc2_fn tc2_functions[] = {
    TC2_FN(tfm_result_string), TC2_FN(tfm_last_error), TC2_FN(tfm_clear_error),
    TC2_FN(tfm_set_num_threads), TC2_FN(tfm_get_num_threads),
    TC2_FN(tfm_tensor1), TC2_FN(tfm_tensor2), TC2_FN(tfm_tensor3), TC2_FN(tfm_tensor4),
    TC2_FN(tfm_numel), TC2_FN(tfm_shape_str),
    TC2_FN(tfm_fill), TC2_FN(tfm_fill_normal), TC2_FN(tfm_fill_uniform), TC2_FN(tfm_tensor_copy),
    TC2_FN(tfm_arena_init), TC2_FN(tfm_arena_free), TC2_FN(tfm_arena_alloc), TC2_FN(tfm_arena_tensor),
    TC2_FN(tfm_mem_alloc), TC2_FN(tfm_mem_rewind), TC2_FN(tfm_mem_free), TC2_FN(tfm_mem_check),
    TC2_FN(tfm_mem_zero_grad),
    TC2_FN(tfm_rng_seed), TC2_FN(tfm_rng_u64), TC2_FN(tfm_rng_uniform), TC2_FN(tfm_rng_normal),
    TC2_FN(tfm_sgemm), TC2_FN(tfm_sgemm_batched), TC2_FN(tfm_scratch_release), TC2_FN(tfm_sgemm_release), TC2_FN(tfm_sgemm_backend),
    TC2_FN(tfm_sgemm_kernel), TC2_FN(tfm_sgemm_set_kernel),
    TC2_FN(tfm_matmul_forward), TC2_FN(tfm_matmul_backward),
    TC2_FN(tfm_linear_forward), TC2_FN(tfm_linear_backward),
    TC2_FN(tfm_softmax_forward), TC2_FN(tfm_softmax_backward),
    TC2_FN(tfm_log_softmax_forward), TC2_FN(tfm_log_softmax_backward),
    TC2_FN(tfm_cross_entropy_forward), TC2_FN(tfm_cross_entropy_backward),
    TC2_FN(tfm_layernorm_forward), TC2_FN(tfm_layernorm_backward),
    TC2_FN(tfm_rmsnorm_forward), TC2_FN(tfm_rmsnorm_backward),
    TC2_FN(tfm_rope_forward), TC2_FN(tfm_rope_backward),
    TC2_FN(tfm_gelu_forward), TC2_FN(tfm_gelu_backward),
    TC2_FN(tfm_relu_forward), TC2_FN(tfm_relu_backward),
    TC2_FN(tfm_dropout_forward), TC2_FN(tfm_dropout_backward),
    TC2_FN(tfm_embedding_forward), TC2_FN(tfm_embedding_backward),
    TC2_FN(tfm_pos_embedding_forward), TC2_FN(tfm_pos_embedding_backward),
    TC2_FN(tfm_sinusoidal_table), TC2_FN(tfm_sinusoidal_forward), TC2_FN(tfm_sinusoidal_backward),
    TC2_FN(tfm_add_forward), TC2_FN(tfm_add_backward),
    TC2_FN(tfm_mean_pool_forward), TC2_FN(tfm_mean_pool_backward),
    TC2_FN(tfm_cls_pool_forward), TC2_FN(tfm_cls_pool_backward),
    TC2_FN(tfm_attention_forward), TC2_FN(tfm_attention_backward),
    TC2_FN(tfm_mha_init), TC2_FN(tfm_mha_init_params), TC2_FN(tfm_mha_param), TC2_FN(tfm_mha_forward),
    TC2_FN(tfm_mha_backward),
    TC2_FN(tfm_linear_init), TC2_FN(tfm_linear_init_params), TC2_FN(tfm_linear_layer_forward),
    TC2_FN(tfm_linear_layer_backward), TC2_FN(tfm_layernorm_init), TC2_FN(tfm_rmsnorm_init), TC2_FN(tfm_layernorm_init_params),
    TC2_FN(tfm_layernorm_layer_forward), TC2_FN(tfm_layernorm_layer_backward),
    TC2_FN(tfm_block_init), TC2_FN(tfm_block_init_params), TC2_FN(tfm_block_param), TC2_FN(tfm_block_forward),
    TC2_FN(tfm_block_backward),
    TC2_FN(tfm_config_resolve), TC2_FN(tfm_model_memory_size), TC2_FN(tfm_model_init),
    TC2_FN(tfm_model_free), TC2_FN(tfm_model_train), TC2_FN(tfm_model_forward),
    TC2_FN(tfm_model_backward), TC2_FN(tfm_model_zero_grad), TC2_FN(tfm_model_step), TC2_FN(tfm_model_train_step),
    TC2_FN(tfm_optim_lr), TC2_FN(tfm_model_logits), TC2_FN(tfm_model_pooled), TC2_FN(tfm_model_param),
    TC2_FN(tfm_model_flat), TC2_FN(tfm_model_set_batch_offset), TC2_FN(tfm_adamw_step),
    TC2_FN(tfm_kv_cache_init), TC2_FN(tfm_kv_cache_free), TC2_FN(tfm_kv_cache_reset),
    TC2_FN(tfm_kv_cache_reorder), TC2_FN(tfm_model_generate), TC2_FN(tfm_model_generate_batch),
    TC2_FN(tfm_model_score), TC2_FN(tfm_model_beam_search),
#ifndef TFM_NO_STDIO
    TC2_FN(tfm_model_save),
    TC2_FN(tfm_config_load),
    TC2_FN(tfm_model_load),
    TC2_FN(tfm_model_load_mapped),
    TC2_FN(tfm_model_save_mapped),
    TC2_FN(tfm_llama_name_map),
    TC2_FN(tfm_checkpoint_meta),
    TC2_FN(tfm_dist_save), TC2_FN(tfm_dist_load),
#endif
    TC2_FN(tfm_cuda_available), TC2_FN(tfm_cuda_device_info), TC2_FN(tfm_cuda_malloc), TC2_FN(tfm_cuda_free),
    TC2_FN(tfm_cuda_synchronize), TC2_FN(tfm_cuda_set_tf32), TC2_FN(tfm_cuda_set_graphs), TC2_FN(tfm_model_to_device),
    TC2_FN(tfm_dist_init), TC2_FN(tfm_dist_free), TC2_FN(tfm_dist_broadcast_model), TC2_FN(tfm_dist_allreduce_grads), TC2_FN(tfm_dist_backward), TC2_FN(tfm_dist_step),
    TC2_FN(tfm_dist_allreduce), TC2_FN(tfm_dist_sum), TC2_FN(tfm_dist_reduce_loss), TC2_FN(tfm_dist_shard),
    TC2_FN(tfm_dist_check_model)
};

/* A two-layer character LM: one training step on a fixed batch, in memory allocated by the library. */
static int tc2_model(void) {
    static const int32_t tokens[2 * 5] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    static const int32_t targets[2 * 5] = {2, 3, 4, 5, 6, 7, 8, 9, 10, 0};
    tfm_config cfg;
    tfm_model m;
    tfm_batch b;
    tfm_optim opt;
    size_t bytes = 0;
    float loss = 0.0f, norm = 0.0f;
    tfm_result r;
    memset(&cfg, 0, sizeof cfg);
    memset(&b, 0, sizeof b);
    memset(&opt, 0, sizeof opt);
    cfg.kind = TFM_MODEL_DECODER_LM;
    cfg.vocab_size = 11;
    cfg.d_model = 16;
    cfg.n_heads = 2;
    cfg.max_len = 5;
    cfg.max_batch = 2;
    cfg.seed = 1;
    cfg.user = &tc2_user_tag;
    b.batch = 2;
    b.len = 5;
    b.tokens = tokens;
    b.targets = targets;
    opt.lr = 1e-3f;
    r = tfm_model_memory_size(&cfg, &bytes);
    if (r == TFM_OK) r = tfm_model_init(&m, &cfg, NULL, 0);
    if (r != TFM_OK) {
        printf("model: %s: %s\n", tfm_result_string(r), tfm_last_error());
        return 1;
    }
    tfm_model_zero_grad(&m);
    r = tfm_model_forward(&m, &b, &loss, NULL);
    if (r == TFM_OK) r = tfm_model_backward(&m, 1.0f);
    if (r == TFM_OK) r = tfm_model_step(&m, &opt, &norm);
    tfm_model_free(&m);
    if (r != TFM_OK || !(loss > 0.0f) || !(norm > 0.0f) || bytes == 0) {
        printf("model: %s: %s (loss %g, norm %g)\n", tfm_result_string(r), tfm_last_error(), loss, norm);
        return 1;
    }
    return 0;
}

#define TC2_B 2
#define TC2_T 3
#define TC2_C 8

/* 0 on success; prints what failed otherwise. */
int tc2_run(void) {
    size_t i, n_fn = sizeof tc2_functions / sizeof tc2_functions[0];
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {0, 0, 0, 0};
    static float x[TC2_B * TC2_T * TC2_C], y[TC2_B * TC2_T * TC2_C], dx[TC2_B * TC2_T * TC2_C];
    char buf[32];
    tfm_tensor t, tx, ty, tdx;
    tfm_mha_desc d;
    tfm_mem mem;
    tfm_mha att;
    tfm_attn_opts o;
    tfm_rng rng;
    tfm_result r;

    for (i = 0; i < n_fn; i++)
        if (!tc2_functions[i]) {
            printf("function %u has no address\n", (unsigned)i);
            return 1;
        }

    /* (2,2) product through the build's sgemm */
    if (tfm_sgemm(0, 0, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2) != TFM_OK || c[0] != 19 ||
        c[1] != 22 || c[2] != 43 || c[3] != 50) {
        printf("tfm_sgemm: got %g %g %g %g (%s)\n", c[0], c[1], c[2], c[3], tfm_last_error());
        return 1;
    }
    t = tfm_tensor2(c, 2, 2);
    if (strcmp(tfm_shape_str(&t, buf, sizeof buf), "(2,2)") != 0) {
        printf("tfm_shape_str: %s\n", buf);
        return 1;
    }

    /* self-attention, causal: count, allocate, carve, forward, backward, free */
    memset(&d, 0, sizeof d);
    memset(&mem, 0, sizeof mem);
    memset(&o, 0, sizeof o);
    d.d_model = TC2_C;
    d.n_heads = 2;
    d.max_batch = TC2_B;
    d.max_len = TC2_T;
    o.causal = 1;
    tfm_rng_seed(&rng, 1);
    tx = tfm_tensor3(x, TC2_B, TC2_T, TC2_C);
    ty = tfm_tensor3(y, TC2_B, TC2_T, TC2_C);
    tdx = tfm_tensor3(dx, TC2_B, TC2_T, TC2_C);
    r = tfm_mha_init(&att, &d, &mem);
    if (r == TFM_OK) r = tfm_mem_alloc(&mem);
    if (r == TFM_OK) r = tfm_mha_init(&att, &d, &mem);
    if (r == TFM_OK) {
        tfm_mha_init_params(&att, &rng);
        r = tfm_fill_normal(&tx, &rng, 0.0f, 1.0f);
    }
    if (r == TFM_OK) r = tfm_fill(&tdx, 0.0f);
    if (r == TFM_OK) r = tfm_mha_forward(&att, &ty, &tx, NULL, &o);
    if (r == TFM_OK) r = tfm_mha_backward(&att, &tdx, NULL, &ty);
    tfm_mem_free(&mem);
    if (r != TFM_OK) {
        printf("attention: %s: %s\n", tfm_result_string(r), tfm_last_error());
        return 1;
    }
    for (i = 0; i < TC2_B * TC2_T * TC2_C; i++)
        if (!(y[i] == y[i]) || !(dx[i] == dx[i])) {
            printf("attention: NaN at %u\n", (unsigned)i);
            return 1;
        }
    if (tc2_model() != 0) return 1;
    printf("%u functions, sgemm %s, cuda %s\n", (unsigned)n_fn, tfm_sgemm_backend(),
           tfm_result_string(tfm_cuda_available()));
    return 0;
}
