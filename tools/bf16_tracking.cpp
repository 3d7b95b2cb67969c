/* tools/bf16_tracking.cpp - does a bf16 (or TF32) training run track the fp32 one? A small character LM
   (2 layers, d_model 32, 4 heads, bytes of text as ids) trained STEPS steps on random windows of a text
   file, from the same weights and batches, in fp32 on the CPU and with cfg.precision PREC on the GPU, each
   step a tfm_model_train_step (as a user's loop runs it: on the GPU a CUDA graph, and in bf16 the loss from
   bf16 logits, with its gradients in the same launch); prints the 25-step means of both runs' losses and their relative difference, and the worst single step.
   Built against the CPU emulation of CUDA (tests/cuda_emu.h: bf16 products widened exactly, fp32 sums),
   or with nvcc for a GPU:
       g++ -std=c++17 -O1 -fopenmp -x c++ -DTFM_CUDA -DTFM_CUDA_EMULATION -o build/bf16_tracking tools/bf16_tracking.cpp -lm
       nvcc -O3 -arch=sm_90 -Xcompiler -fopenmp -x cu -DTFM_CUDA -o build/bf16_tracking tools/bf16_tracking.cpp -lcublas -lcublasLt -lm
       build/bf16_tracking TEXT [STEPS [PREC [SEED]]]    PREC 2: bf16 (default), 1: TF32; STEPS default 300
   TEXT: any text, e.g. the KJV as the examples read it (examples/common.h's ex_kjv_read of
   /usr/lib/bible.data). SEED (default 1) picks the weights (cfg.seed 6 + SEED) and the windows: runs part
   ways by chance (a loss plateau left some steps apart), so compare several. About 2 to 12 minutes for 300
   steps under the emulation on one core, depending on the machine. */
#ifdef TFM_CUDA_EMULATION
#include "../tests/cuda_emu.h"
#endif
#define TFM_IMPLEMENTATION
#include "../transformer.h"
#include <stdio.h>
#include <stdlib.h>
#define B 8
#define T 32

static uint64_t rng_state = 1;
static uint64_t rnd64(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return rng_state >> 11;
}

static void check(tfm_result r, const char *what) {
    if (r == TFM_OK) return;
    fprintf(stderr, "bf16_tracking: %s: %s\n", what, tfm_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    int steps = argc > 2 ? atoi(argv[2]) : 300, prec = argc > 3 ? atoi(argv[3]) : TFM_PREC_BF16, seed = argc > 4 ? atoi(argv[4]) : 1;
    int s, b, t;
    FILE *f = argc > 1 ? fopen(argv[1], "rb") : NULL;
    unsigned char *text = (unsigned char *)malloc(1 << 23);
    size_t n = f ? fread(text, 1, 1 << 23, f) : 0;
    double sc = 0, sg = 0, worst = 0, worst_mean = 0;
    int32_t tok[B * T], tgt[B * T];
    tfm_config c, g;
    tfm_model mc, mg;
    tfm_optim o;
    tfm_batch bt;
    if (f) fclose(f);
    if (n < 2 * T || steps < 1 || (prec != TFM_PREC_TF32 && prec != TFM_PREC_BF16) || seed < 1) {
        fprintf(stderr, "usage: bf16_tracking TEXT [STEPS [PREC [SEED]]] (TEXT readable and over %d bytes, PREC 1 or 2, "
                "SEED >= 1)\n", 2 * T);
        return 2;
    }
    rng_state = (uint64_t)seed;
    memset(&c, 0, sizeof c);
    c.kind = TFM_MODEL_DECODER_LM;
    c.vocab_size = 128;
    c.max_len = T;
    c.norm_first = 1;
    c.act = TFM_ACT_GELU_TANH;
    c.tie_output = 1;
    c.d_model = 32;
    c.n_heads = 4;
    c.d_ff = 96;
    c.n_layers = 2;
    c.max_batch = B;
    c.seed = 6 + (uint64_t)seed;
    g = c;
    g.device = TFM_DEVICE_CUDA;
    g.precision = (tfm_precision)prec;
    check(tfm_model_init(&mc, &c, NULL, 0), "tfm_model_init (CPU)");
    check(tfm_model_init(&mg, &g, NULL, 0), "tfm_model_init (GPU)");
    memset(&o, 0, sizeof o);
    o.lr = 3e-3f;
    o.weight_decay = 0.01f;
    o.clip_norm = 1.0f;
    o.schedule = TFM_SCHED_COSINE;
    o.warmup_steps = steps >= 200 ? 20 : steps / 10;
    o.total_steps = steps;
    o.min_lr = 3e-4f;
    memset(&bt, 0, sizeof bt);
    bt.batch = B;
    bt.len = T;
    bt.tokens = tok;
    bt.targets = tgt;
    for (s = 0; s < steps; s++) {
        float lc, lg;
        double e;
        for (b = 0; b < B; b++) {
            size_t p = rnd64() % (n - T - 1);
            for (t = 0; t < T; t++) {
                tok[b * T + t] = text[p + t] & 127;
                tgt[b * T + t] = text[p + t + 1] & 127;
            }
        }
        check(tfm_model_train_step(&mc, &bt, &o, &lc, NULL, NULL), "tfm_model_train_step (CPU)");
        check(tfm_model_train_step(&mg, &bt, &o, &lg, NULL, NULL), "tfm_model_train_step (GPU)");
        e = fabs((double)lg - lc) / lc;
        if (e > worst) worst = e;
        sc += lc;
        sg += lg;
        if (s % 25 == 24 || s == steps - 1) {
            int k = s % 25 + 1;
            double we = fabs(sg - sc) / sc;
            if (we > worst_mean) worst_mean = we;
            printf("steps %3d-%3d: fp32 %.4f, %s %.4f (%.2e); worst step so far %.2e\n", s + 1 - k, s, sc / k,
                   prec == TFM_PREC_BF16 ? "bf16" : "tf32", sg / k, we, worst);
            fflush(stdout);
            sc = sg = 0;
        }
    }
    printf("worst single step %.3e, worst 25-step mean %.3e\n", worst, worst_mean);
    tfm_model_free(&mc);
    tfm_model_free(&mg);
    free(text);
    return 0;
}
