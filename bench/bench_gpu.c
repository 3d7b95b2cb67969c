/* bench/bench_gpu.c - transformer.h on an NVIDIA GPU: training step and batched generation of the
   decoder-only LMs of bench/bench.c, next to PyTorch on the same GPU (bench/torch_gpu.py).

   This file is plain C99 and includes transformer.h without its implementation: the implementation
   is bench/tfm_cuda.cu, the one .cu file of the program, built by nvcc with TFM_CUDA. That is what a
   user's program looks like (tools/gpu_check.sh builds it so):
       nvcc -O2 -arch=sm_90a -Xcompiler -fopenmp -c bench/tfm_cuda.cu -o build/tfm_cuda.o
       cc -std=c99 -O2 -c bench/bench_gpu.c -o build/bench_gpu.o
       nvcc -arch=sm_90a -Xcompiler -fopenmp -o build/bench_gpu build/bench_gpu.o build/tfm_cuda.o -lcublas -lcublasLt -lm
   Under the CPU emulation of CUDA (no GPU; a smoke run of this program with gpu-emu-tiny):
       g++ -std=c++17 -O1 -x c++ -DTFM_CUDA -DTFM_CUDA_EMULATION -fopenmp -c bench/tfm_cuda.cu -o build/tfm_cuda_emu.o
       cc -std=c99 -O2 -c bench/bench_gpu.c -o build/bench_gpu.o
       g++ -fopenmp -o build/bench_gpu_emu build/bench_gpu.o build/tfm_cuda_emu.o -lm
       build/bench_gpu_emu --quick gpu-emu-tiny

   Usage: bench_gpu [--quick] [--tf32] [--bf16] [--no-fp32] [--no-train] [--no-gen] [--no-check]
                    [--budget SECONDS] [--gen-batch 1|8|32] [--kernels] [CONFIG...]
          bench_gpu --list
   CONFIG defaults to $CONFIGS (names separated by spaces or commas), else char-gpt-tiny gpt-small
   gpt2-124M-shape; gpt2-124M-b16 (GPT-2 small at 16 x 1024, the GPU targets' shape) runs when named. QUICK=1 in the environment is --quick: few steps, numbers not meant to be read.
   --no-fp32 leaves out the fp32 training rows and the forward pass after them (with --bf16: a profile of
   the bf16 steps alone).
   --kernels times the memory-bound ops (kernel, below) first; configs then run only when named on the
   command line (not $CONFIGS's, not the defaults), after the ops. bench_gpu_emu --quick --kernels is its
   smoke run under the emulation (small sizes, one rep).

   For each config, on the GPU (cfg.device = TFM_DEVICE_CUDA), TF32 off unless said otherwise:
     check  the same weights on both devices: an inference_only model built on the CPU gives its loss on
            the benchmark batch there, then moves to the GPU (tfm_model_to_device) and gives it again.
     train  tfm_model_train_step: zero_grad + forward with loss + backward + AdamW step (lr 1e-4, weight
            decay 0.01) on a random batch (ids from seed 42, model from seed 1234, dropout 0: bench.c's
            conventions); warm-up steps, then timed steps twice: as CUDA graphs (the default: impl=ours
            graphs=1), then launch by launch (tfm_cuda_set_graphs(0): impl=ours-launches graphs=0), each
            up to half the config's count, or fewer when half the time budget of the measurement is spent
            (at least 3), tfm_cuda_synchronize before each timer read. The median is step_ms. With --tf32, the same again with cfg.precision TFM_PREC_TF32: prec=tf32,
            tf32=1; with --bf16, with cfg.precision TFM_PREC_BF16 (bf16 operands, fp32 sums): prec=bf16,
            and mfu = TFLOP/s over the device's dense bf16 peak (H100/H200 SXM 989.4, H100 PCIe 756,
            A100 312; -1 for another device); bf16 a third time, as graphs without bf16 activations (each
            product rounds its fp32 operands, as before them: impl=ours-bf16-rounding bf16_acts=0), and a
            fourth with the flash attention's products by mma.sync where a build for sm_90a runs Hopper's
            wgmma (heads of 64 or 128 channels: impl=ours-mma-sync wgmma=0; the others wgmma=1).
     fwd    after the fp32 training rows, the evaluation forward pass of that model (tfm_model_forward with
            targets after tfm_model_train(m, 0): the loss, no backward) on the same batch, as CUDA graphs
            (impl=ours graphs=1), then launch by launch (impl=ours-launches graphs=0): 2 untimed calls,
            then up to the config's step count timed (half the budget each); fwd_ms = the median.
     gen    greedy tfm_model_generate_batch of GEN_NEW new tokens from 1-token prompts (ids from seed
            42) at batch 1, 8 and 32, on an inference_only model with max_batch 32: one untimed run,
            then up to gen_reps timed runs (half the budget); tok_s = batch * GEN_NEW / median time.
            Each batch twice: decoding steps as CUDA graphs (the default: impl=ours graphs=1), then
            launch by launch (tfm_cuda_set_graphs(0): impl=ours-launches graphs=0), whose ids must be
            the same (else FAIL ... reason=graphs_differ). With --bf16, batch 1 again with cfg.precision
            TFM_PREC_BF16 (prec=bf16), graphs on: with the weights rounded once a call (impl=ours), then
            with each product rounding its weight (impl=ours-bf16-rounding), whose ids must be the same
            (else FAIL ... reason=rounding_differs).
     kernel (--kernels) each memory-bound op of KOPS (layernorm and RMSNorm forward, layernorm backward,
            softmax forward and backward, GELU forward and backward, the residual add, cross-entropy
            forward and backward, AdamW with the gradient-norm pass) through its public call on device
            tensors (tfm_cuda_malloc'ed, .device = TFM_DEVICE_CUDA) of a GPU-sized shape: 2 untimed calls,
            then reps of back-to-back calls between two tfm_cuda_synchronize (about 2 ms a rep, until the
            budget, default 1 s, or 50 reps; at least 3); us = the median rep's time per call. gbs = the
            bytes the op must move at least (kernel_bytes: each tensor read counts once, each written once)
            over us; copy_gbs = the same for tfm_tensor_copy between two device tensors of 256 MB (bytes =
            2 x size), measured first in the same run: the device's copy bandwidth; share = gbs / copy_gbs,
            whose target is >= 0.70. -1 for what failed.
   Lines (one per measurement; a script reads the key=value pairs):
       INFO impl=ours device="..." transformer.h=X.Y.Z
       RESULT impl=ours device=cuda mode=check name=... loss_cpu=... loss_gpu=... rel_err=... ok=yes|NO
       RESULT impl=ours|ours-launches|ours-bf16-rounding|ours-mma-sync device=cuda mode=train name=... prec=fp32|tf32|bf16 tf32=0|1 params=... batch=... seq=... step_ms=...
              step_min_ms=... tok_s=... gflop_step=... tflops=... loss0=... loss=... steps=... first_step_ms=...
              model_mb=...   (loss0: the first step's loss, the check's loss_cpu when the GPU model starts from
              the same weights; loss: the last step's; model_mb: tfm_model_memory_size, the model's one block,
              which the GPU holds a twin of; bf16 rows add mfu=... bf16_acts=1|0 wgmma=1|0; graphs=1|0; replayed: the share
              of the timed steps that replayed the last step's graph instead of capturing one)
       RESULT impl=ours|ours-launches device=cuda mode=fwd name=... prec=fp32 tf32=0 batch=... seq=... fwd_ms=...
              fwd_min_ms=... tok_s=... loss=... reps=... graphs=1|0 replayed=...
       RESULT impl=ours|ours-launches|ours-bf16-rounding device=cuda mode=gen name=... prec=fp32|bf16 tf32=0 batch=...
              new=... tok_s=... ms_tok=... reps=... graphs=1|0 replayed=...   (replayed: the share of the decoding
              steps after each call's first that replayed the last step's graph instead of capturing one)
       RESULT impl=ours device=cuda mode=kernel name=OP rows=... cols=... bytes=... us=... gbs=... copy_gbs=...
              share=... reps=... calls=...   (calls: back-to-back calls per rep; name=copy is the peer)
   then a table of the same numbers. tokens per step: batch * seq. FLOPs per step: bench.c's model_flops
   for an LM (bench/README.md): 6*B*T*(L*(4C^2 + 2CF) + V*C) + 12*B*L*T^2*C. Exit status 0 when every
   measurement ran and every check agreed, 1 otherwise, 2 for bad arguments, 3 without a CUDA device. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c99 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../transformer.h"
#define BENCH_NAME "bench_gpu"
#include "bench_util.h"

/* The three LM rows of bench/bench.c's CONFIGS (same shapes; keep them in sync by hand), with step
   counts for a GPU, and gpu-emu-tiny: a model small enough for the CPU emulation of CUDA, for a smoke
   run only (never part of the default list). */
typedef struct gpu_cfg {
    const char *name;
    int d_model, n_layers, n_heads, T, B, V; /* d_ff = 4 * d_model */
    int warmup, steps, gen_reps;
    int is_default; /* 1: run when no config is named; 0: the emulation's smoke test; 2: by name only */
} gpu_cfg;

static const gpu_cfg CONFIGS[] = {
    /* name              C    L   H   T    B   V      warm-up steps gen_reps default */
    {"char-gpt-tiny",    128, 4,  4,  128, 16, 96,    5,      30,   3,       1},
    {"gpt-small",        384, 6,  6,  256, 8,  8192,  5,      30,   3,       1},
    {"gpt2-124M-shape",  768, 12, 12, 128, 2,  50257, 5,      30,   3,       1},
    {"gpu-emu-tiny",     32,  2,  2,  16,  2,  64,    1,      3,    1,       0},
    /* GPT-2 small at the batch its training used (16 x 1024): the shape the GPU targets are set at */
    {"gpt2-124M-b16",    768, 12, 12, 1024, 16, 50257, 3,     10,   1,       2},
};
#define N_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))
#define GEN_NEW 127 /* as bench.c; fewer when the model's length is shorter (1 + new <= T) */
#define MAX_STEPS 1000

static int g_quick = 0;
static int g_gen_batch = 0; /* --gen-batch N: only that batch in gen (0: 1, 8 and 32) */
static double g_budget = 8.0; /* seconds of timed runs per measurement (training, one generation batch) */
static int g_failed = 0;
static char g_device[256] = "?";

/* Report a failed call; the caller skips the rest of that measurement. */
static int fail(const char *name, const char *what, tfm_result r) {
    fprintf(stderr, "bench_gpu: %s: %s failed: %s: %s\n", name, what, tfm_result_string(r), tfm_last_error());
    printf("FAIL impl=ours name=%s call=%s result=%d\n", name, what, (int)r);
    fflush(stdout);
    g_failed = 1;
    return 1;
}

/* Wait for the GPU; a failure here is a failure of the work queued before it. */
static int sync_gpu(const char *name) {
    tfm_result r = tfm_cuda_synchronize();
    return r == TFM_OK ? 0 : fail(name, "tfm_cuda_synchronize", r);
}

static const gpu_cfg *find_config(const char *name) {
    int i;
    for (i = 0; i < N_CONFIGS; i++)
        if (strcmp(CONFIGS[i].name, name) == 0) return &CONFIGS[i];
    return NULL;
}

/* bench.c's model_flops for a decoder-only LM. */
static double model_flops(const gpu_cfg *b) {
    double B = b->B, C = b->d_model, F = 4.0 * b->d_model, L = b->n_layers, T = b->T;
    double Wenc = 4.0 * C * C + 2.0 * C * F;
    return 6.0 * B * T * (L * Wenc + (double)b->V * C) + 12.0 * B * L * T * T * C;
}

/* bench.c's make_config for an LM: pre-LN, GELU (tanh), learned positions, tied output, dropout 0. */
static tfm_config make_config(const gpu_cfg *b, tfm_device dev) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = TFM_MODEL_DECODER_LM;
    c.vocab_size = b->V;
    c.d_model = b->d_model;
    c.n_heads = b->n_heads;
    c.n_layers = b->n_layers;
    c.max_len = b->T;
    c.max_batch = b->B;
    c.pos = TFM_POS_LEARNED;
    c.seed = 1234;
    c.norm_first = 1;
    c.act = TFM_ACT_GELU_TANH;
    c.tie_output = 1;
    c.device = dev;
    return c;
}

/* The benchmark batch: B full rows of T random ids and targets, from seed 42 (bench.c's data_make). */
typedef struct gpu_data {
    int32_t *tokens, *targets;
    tfm_batch batch;
    tfm_optim opt;
} gpu_data;

static void data_make(const gpu_cfg *b, gpu_data *d) {
    size_t n = (size_t)b->B * (size_t)b->T, i;
    tfm_rng rng;
    memset(d, 0, sizeof *d);
    tfm_rng_seed(&rng, 42);
    d->tokens = (int32_t *)xmalloc(n * sizeof(int32_t));
    d->targets = (int32_t *)xmalloc(n * sizeof(int32_t));
    for (i = 0; i < n; i++) d->tokens[i] = (int32_t)(tfm_rng_u64(&rng) % (uint64_t)b->V);
    for (i = 0; i < n; i++) d->targets[i] = (int32_t)(tfm_rng_u64(&rng) % (uint64_t)b->V);
    d->batch.batch = b->B;
    d->batch.len = b->T;
    d->batch.tokens = d->tokens;
    d->batch.targets = d->targets;
    d->opt.lr = 1e-4f;
    d->opt.weight_decay = 0.01f;
}

static void data_free(gpu_data *d) {
    free(d->tokens);
    free(d->targets);
}

/* ---- check: the same weights give the same loss on the CPU and on the GPU ------------------------ */

static void run_check(const gpu_cfg *b, const gpu_data *d) {
    tfm_config cfg = make_config(b, TFM_DEVICE_CPU);
    tfm_model m;
    tfm_result r;
    float loss_cpu = 0.0f, loss_gpu = 0.0f;
    double rel;
    int ok;
    cfg.inference_only = 1;
    if ((r = tfm_model_init(&m, &cfg, NULL, 0)) != TFM_OK) {
        fail(b->name, "tfm_model_init (check, CPU)", r);
        return;
    }
    if ((r = tfm_model_forward(&m, &d->batch, &loss_cpu, NULL)) != TFM_OK) {
        fail(b->name, "tfm_model_forward (check, CPU)", r);
    } else if ((r = tfm_model_to_device(&m, TFM_DEVICE_CUDA)) != TFM_OK) {
        fail(b->name, "tfm_model_to_device (check)", r);
    } else if ((r = tfm_model_forward(&m, &d->batch, &loss_gpu, NULL)) != TFM_OK) {
        fail(b->name, "tfm_model_forward (check, GPU)", r);
    } else {
        rel = fabs((double)loss_gpu - (double)loss_cpu) / fmax(fabs((double)loss_cpu), 1e-12);
        ok = isfinite(loss_gpu) && rel < 1e-4;
        if (!ok) g_failed = 1;
        printf("RESULT impl=ours device=cuda mode=check name=%s loss_cpu=%.6f loss_gpu=%.6f rel_err=%.3g ok=%s\n",
               b->name, (double)loss_cpu, (double)loss_gpu, rel, ok ? "yes" : "NO");
        fflush(stdout);
    }
    tfm_model_free(&m);
}

/* ---- train --------------------------------------------------------------------------------------- */

/* One timed training step (tfm_model_train_step): seconds from a synchronized start to a synchronized
   end; < 0 on failure. */
static double train_step(tfm_model *m, const gpu_data *d, float *loss, const char *name) {
    double t0;
    tfm_result r;
    if (sync_gpu(name)) return -1.0;
    t0 = now_s();
    if ((r = tfm_model_train_step(m, &d->batch, &d->opt, loss, NULL, NULL)) != TFM_OK) {
        fail(name, "tfm_model_train_step", r);
        return -1.0;
    }
    if (sync_gpu(name)) return -1.0;
    return now_s() - t0;
}

static const char *const PREC_NAMES[3] = {"fp32", "tf32", "bf16"};

/* The device's dense bf16 tensor-core peak in TFLOP/s, from its name (0: not in the table). */
static double bf16_peak(void) {
    if (strstr(g_device, "H100") && strstr(g_device, "PCIe")) return 756.0;
    if (strstr(g_device, "H100") || strstr(g_device, "H200")) return 989.4;
    if (strstr(g_device, "A100")) return 312.0;
    return 0.0;
}

typedef struct row {
    char name[32];
    int mode; /* 0 train, 1 gen */
    int prec, batch; /* prec: a tfm_precision */
    double ms, tok_s, tflops;
} row;

static row g_rows[64];
static int g_nrows = 0;

static void add_row(const char *name, int mode, int prec, int batch, double ms, double tok_s, double tflops) {
    row *r;
    if (g_nrows >= (int)(sizeof g_rows / sizeof g_rows[0])) return;
    r = &g_rows[g_nrows++];
    strncpy(r->name, name, sizeof r->name - 1);
    r->name[sizeof r->name - 1] = '\0';
    r->mode = mode, r->prec = prec, r->batch = batch, r->ms = ms, r->tok_s = tok_s, r->tflops = tflops;
}

void bench_gpu_bf16_acts(int on);        /* bench/tfm_cuda.cu */
void bench_gpu_wgmma(int on);
unsigned long long bench_gpu_replays(void);
tfm_result bench_gpu_gelu_bwd_bf16(float *dx, float *db, const float *dy, const float *x, int64_t rows, int64_t cols);
tfm_result bench_gpu_gelu_fwd_bf16(float *y, const float *x, int64_t rows, int64_t cols);
tfm_result bench_gpu_to_bf16(float *dst, const float *src, int64_t rows, int64_t cols);
tfm_result bench_gpu_xent_bf16(float *dx, float *lse, const float *x, const int32_t *t, int64_t rows, int64_t cols,
                               int fused);
tfm_result bench_gpu_linear_bias(float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t in,
                                 int64_t out, int lt);

/* The evaluation forward pass (tfm_model_forward with targets, the model in evaluation mode) of the
   trained model m: as CUDA graphs (impl=ours graphs=1), then launch by launch (impl=ours-launches
   graphs=0), each after 2 untimed calls, then up to 2 * steps timed (half the budget each); fwd_ms the
   median. 1 when it failed. */
static int run_fwd(tfm_model *m, const gpu_cfg *b, const gpu_data *d, int steps) {
    static const char *const impl[2] = {"ours", "ours-launches"};
    double times[MAX_STEPS];
    int graphs, i, n;
    float loss = 0.0f;
    tfm_result r;
    tfm_model_train(m, 0);
    if (2 * steps < MAX_STEPS) steps *= 2;
    for (graphs = 1; graphs >= 0; graphs--) {
        double spent = 0.0, t0, med;
        unsigned long long rep0 = 0;
        if ((r = tfm_cuda_set_graphs(graphs)) != TFM_OK) return fail(b->name, "tfm_cuda_set_graphs", r);
        for (i = -2, n = 0; i < 0 || (n < steps && (n < 3 || spent < g_budget / 2)); i++) {
            if (sync_gpu(b->name)) return 1;
            if (!i) rep0 = bench_gpu_replays();
            t0 = now_s();
            if ((r = tfm_model_forward(m, &d->batch, &loss, NULL)) != TFM_OK) return fail(b->name, "tfm_model_forward", r);
            if (sync_gpu(b->name)) return 1;
            if (i >= 0) times[n++] = now_s() - t0, spent += times[n - 1];
        }
        med = median(times, n); /* sorted now */
        printf("RESULT impl=%s device=cuda mode=fwd name=%s prec=fp32 tf32=0 batch=%d seq=%d fwd_ms=%.3f fwd_min_ms=%.3f "
               "tok_s=%.1f loss=%.5f reps=%d graphs=%d replayed=%.3f\n",
               impl[1 - graphs], b->name, b->B, b->T, 1e3 * med, 1e3 * times[0], (double)b->B * b->T / med, (double)loss, n,
               graphs, (double)(bench_gpu_replays() - rep0) / n);
        fflush(stdout);
    }
    return 0;
}

/* Each precision twice: whole steps as CUDA graphs (the default: impl=ours graphs=1), then launch by
   launch (tfm_cuda_set_graphs(0): impl=ours-launches graphs=0), each with half the steps and budget;
   bf16 a third time, as graphs without bf16 activations (impl=ours-bf16-rounding), and a fourth with the
   flash attention by mma.sync only (impl=ours-mma-sync). */
static void run_train(const gpu_cfg *b, const gpu_data *d, int prec) {
    static const char *const impl[4] = {"ours", "ours-launches", "ours-bf16-rounding", "ours-mma-sync"};
    tfm_config cfg = make_config(b, TFM_DEVICE_CUDA);
    tfm_model m;
    tfm_result r;
    double times[MAX_STEPS], first, step_ms, step_min_ms, flops = model_flops(b), t0;
    int warmup = g_quick ? 1 : b->warmup, steps = g_quick ? 3 : b->steps, i, graphs, pass;
    float loss = 0.0f, loss0 = 0.0f;
    size_t bytes = 0;
    char mfu[32] = "";
    cfg.precision = (tfm_precision)prec;
    if ((r = tfm_model_memory_size(&cfg, &bytes)) != TFM_OK) {
        fail(b->name, "tfm_model_memory_size", r);
        return;
    }
    t0 = now_s();
    if ((r = tfm_model_init(&m, &cfg, NULL, 0)) != TFM_OK) {
        fail(b->name, "tfm_model_init (train)", r);
        return;
    }
    if (sync_gpu(b->name)) goto done;
    printf("MODEL impl=ours device=cuda name=%s prec=%s params=%lld init_ms=%.1f\n", b->name, PREC_NAMES[prec],
           (long long)m.n_weights, 1e3 * (now_s() - t0));
    fflush(stdout);
    tfm_model_train(&m, 1);
    if ((first = train_step(&m, d, &loss, b->name)) < 0) goto done;
    loss0 = loss;
    for (i = 1; i < warmup; i++)
        if (train_step(&m, d, &loss, b->name) < 0) goto done;
    if (steps > MAX_STEPS) steps = MAX_STEPS;
    if (!g_quick) steps = steps / 2 > 3 ? steps / 2 : 3;
    for (pass = 0; pass < (prec == TFM_PREC_BF16 ? 4 : 2); pass++) {
        double spent = 0.0;
        int n = 0;
        unsigned long long rep0;
        graphs = pass != 1;
        bench_gpu_bf16_acts(pass != 2);
        bench_gpu_wgmma(pass != 3);
        if ((r = tfm_cuda_set_graphs(graphs)) != TFM_OK) {
            fail(b->name, "tfm_cuda_set_graphs", r);
            goto done;
        }
        /* untimed: without bf16 activations the products' bf16 space must grow, which that step's capture
           cannot (it runs again launch by launch and grows it); the next is captured anew (the last graph
           had bf16 activations, or the other attention kernels); the timed steps replay */
        for (i = 0; i < (pass >= 2 ? 2 : 0); i++)
            if (train_step(&m, d, &loss, b->name) < 0) goto done;
        rep0 = bench_gpu_replays(); /* the timed steps' replays only */
        while (n < steps && (n < 3 || spent < g_budget / 2)) {
            double dt = train_step(&m, d, &loss, b->name);
            if (dt < 0) goto done;
            times[n++] = dt;
            spent += dt;
        }
        if (!isfinite(loss)) {
            fprintf(stderr, "bench_gpu: %s: the loss is not finite (%g)\n", b->name, (double)loss);
            printf("FAIL impl=ours name=%s call=train reason=loss_not_finite\n", b->name);
            g_failed = 1;
            goto done;
        }
        step_ms = 1e3 * median(times, n); /* sorted now */
        step_min_ms = 1e3 * times[0];
        if (prec == TFM_PREC_BF16)
            sprintf(mfu, " mfu=%.4f bf16_acts=%d wgmma=%d", bf16_peak() > 0 ? flops * 1e-12 / (step_ms * 1e-3) / bf16_peak() : -1.0,
                    pass != 2, pass != 3);
        printf("RESULT impl=%s device=cuda mode=train name=%s prec=%s tf32=%d params=%lld batch=%d seq=%d step_ms=%.3f "
               "step_min_ms=%.3f tok_s=%.1f gflop_step=%.4f tflops=%.3f loss0=%.6f loss=%.5f steps=%d first_step_ms=%.1f "
               "model_mb=%.1f%s graphs=%d replayed=%.3f\n",
               impl[pass], b->name, PREC_NAMES[prec], prec == TFM_PREC_TF32, (long long)m.n_weights,
               b->B, b->T, step_ms, step_min_ms, (double)b->B * b->T / (step_ms * 1e-3), flops * 1e-9,
               flops * 1e-12 / (step_ms * 1e-3), (double)loss0, (double)loss, n, 1e3 * first, bytes / 1e6, mfu, graphs,
               (double)(bench_gpu_replays() - rep0) / n);
        fflush(stdout);
        if (pass == 0)
            add_row(b->name, 0, prec, b->B, step_ms, (double)b->B * b->T / (step_ms * 1e-3), flops * 1e-12 / (step_ms * 1e-3));
    }
    if (prec == TFM_PREC_FP32) (void)run_fwd(&m, b, d, steps);
done:
    bench_gpu_bf16_acts(1);
    bench_gpu_wgmma(1);
    (void)tfm_cuda_set_graphs(1);
    tfm_model_free(&m);
}

/* ---- gen ----------------------------------------------------------------------------------------- */

static void run_gen(const gpu_cfg *b, int bf16) {
    static const int batches[3] = {1, 8, 32};
    tfm_config cfg = make_config(b, TFM_DEVICE_CUDA);
    tfm_model m;
    tfm_result r;
    int32_t prompts[32], *out, *out_graphs;
    const int32_t *pp[32];
    int n_prompts[32], n_out[32], n_new = GEN_NEW < b->T - 1 ? GEN_NEW : b->T - 1;
    int reps = g_quick ? 1 : b->gen_reps, bi, i;
    double t[16];
    tfm_rng rng;
    cfg.max_batch = 32;
    cfg.inference_only = 1;
    if (bf16) cfg.precision = TFM_PREC_BF16;
    if ((r = tfm_model_init(&m, &cfg, NULL, 0)) != TFM_OK) {
        fail(b->name, "tfm_model_init (gen)", r);
        return;
    }
    out = (int32_t *)xmalloc((size_t)32 * (size_t)n_new * sizeof(int32_t));
    out_graphs = (int32_t *)xmalloc((size_t)32 * (size_t)n_new * sizeof(int32_t));
    tfm_rng_seed(&rng, 42);
    for (i = 0; i < 32; i++) {
        prompts[i] = (int32_t)(tfm_rng_u64(&rng) % (uint64_t)b->V);
        pp[i] = &prompts[i];
        n_prompts[i] = 1;
    }
    if (reps > 16) reps = 16;
    for (bi = 0; bi < 6; bi++) {
        int B = batches[bi / 2], graphs = bf16 || !(bi & 1), n = 0, calls = 0, k;
        unsigned long long rep0 = bench_gpu_replays();
        const char *impl = bf16 ? (bi & 1 ? "ours-bf16-rounding" : "ours") : graphs ? "ours" : "ours-launches";
        double spent = 0.0, ms_tok;
        tfm_gen_opts go;
        if ((g_gen_batch && B != g_gen_batch) || (bf16 && B != 1)) continue;
        bench_gpu_bf16_acts(!(bf16 && (bi & 1))); /* bf16: the weights' twin, then each product rounding its own */
        memset(&go, 0, sizeof go);
        go.max_new = n_new;
        if ((r = tfm_cuda_set_graphs(graphs)) != TFM_OK) {
            fail(b->name, "tfm_cuda_set_graphs", r);
            goto done;
        }
        for (k = -1; k < reps && (k < 1 || spent < g_budget / 2); k++) { /* one untimed run first */
            double t0;
            if (sync_gpu(b->name)) goto done;
            t0 = now_s();
            if ((r = tfm_model_generate_batch(&m, B, NULL, NULL, pp, n_prompts, &go, out, n_new, n_out)) != TFM_OK) {
                fail(b->name, "tfm_model_generate_batch", r);
                goto done;
            }
            if (sync_gpu(b->name)) goto done;
            calls++;
            if (k >= 0) {
                t[n++] = now_s() - t0;
                spent += t[n - 1];
            }
            for (i = 0; i < B; i++)
                if (n_out[i] != n_new || out[(size_t)i * n_new] < 0 || out[(size_t)i * n_new] >= b->V) {
                    fprintf(stderr, "bench_gpu: %s: batch %d row %d gave %d tokens (want %d), first id %d\n", b->name,
                            B, i, n_out[i], n_new, (int)out[(size_t)i * n_new]);
                    printf("FAIL impl=ours name=%s call=generate batch=%d reason=bad_output\n", b->name, B);
                    g_failed = 1;
                    goto done;
                }
        }
        /* launch by launch (bf16: each product rounding its weight), the ids must be those of the first pass */
        if (!(bi & 1)) memcpy(out_graphs, out, (size_t)B * (size_t)n_new * sizeof(int32_t));
        else if (memcmp(out_graphs, out, (size_t)B * (size_t)n_new * sizeof(int32_t)) != 0) {
            printf("FAIL impl=ours name=%s call=generate batch=%d reason=%s\n", b->name, B, bf16 ? "rounding_differs" : "graphs_differ");
            g_failed = 1;
        }
        ms_tok = 1e3 * median(t, n) / n_new;
        printf("RESULT impl=%s device=cuda mode=gen name=%s prec=%s tf32=0 batch=%d new=%d tok_s=%.1f ms_tok=%.4f reps=%d "
               "graphs=%d replayed=%.3f\n", impl, b->name, bf16 ? "bf16" : "fp32", B, n_new, B * 1e3 / ms_tok, ms_tok, n, graphs,
               n_new > 2 ? (double)(bench_gpu_replays() - rep0) / ((double)calls * (n_new - 2)) : 0.0);
        fflush(stdout);
        if (!(bi & 1)) add_row(b->name, 1, bf16 ? 2 : 0, B, ms_tok, B * 1e3 / ms_tok, -1.0);
    }
done:
    bench_gpu_bf16_acts(1);
    (void)tfm_cuda_set_graphs(1);
    free(out);
    free(out_graphs);
    tfm_model_free(&m);
}

/* ---- kernels: the memory-bound ops against the device's copy bandwidth --------------------------- */

/* One op of --kernels: its tensors (layout: one letter per device tensor, X rows*cols floats, N rows, C
   cols; all filled from seed 42 with values in [-1, 1), then set up per op), at the full and the --quick
   size. Bytes are the least the op must move: each tensor it reads counts once and each it writes once
   (a gradient that a backward adds into is read and written: twice; host memory, such as the targets,
   counts at its size), whatever the kernels really move:
     copy               read src; write dst (tfm_tensor_copy on the device): the peer  2X
     layernorm_fwd      read x, g, b; write y, mean, rstd                     2X + 2N + 2C
     layernorm_bwd      read dy, x, mean, rstd, g; dx, dg, db added into     4X + 2N + 5C
     rmsnorm_fwd        read x, g; write y, rstd                              2X + N + C
     softmax_fwd        read x; write y                                       2X
     softmax_bwd        read dy, y; dx added into                             4X
     gelu_fwd (tanh)    read x; write y                                       2X
     gelu_bwd (tanh)    read dy, x; dx added into                             4X
     gelu_fwd_bf16      a bf16 model's MLP activation: read x in bf16 (the      X
                        product's output); write y in bf16
     gelu_bwd_bf16      a bf16 model's MLP: read dy, x in bf16; write dx in    1.5X + 2C
                        bf16; db added into (its column sums, in the same pass)
     add_fwd            read a, b; write y                                    3X
     rope_fwd           rotary positions over 12 heads, every channel turned,    2X
                        sequences of 1,024: read x; write y (the angles' table, T x 32 pairs, is
                        recomputed each call and not counted)
     cross_entropy_fwd  read logits, targets; write lse (+ the loss)          X + 2N
                        (its time includes copying the row losses back and their sum on the host)
     cross_entropy_bwd  read logits, lse, targets; dlogits added into         3X + 2N
     xent_bwd_bf16      a bf16 LM's backward: read logits, lse, targets;       1.5X + 2N
                        write dlogits in bf16
     xent_fused_bf16    a bf16 LM's training step: its logits in bf16, the      X + 2N
                        loss's launch writing dlogits in bf16 too: read logits, targets; write lse,
                        dlogits (against cross_entropy_fwd plus xent_bwd_bf16 on fp32 logits: an A/B of
                        the step's loss before and after; compare us)
     adamw              tfm_adamw_step over one parameter of rows*cols floats with clip_norm 1: the norm
                        pass reads grad; the update reads value, grad, m, v and writes value, m, v   8X
     linear_bias_lt     a bf16 model's linear map with a bias, y = x w^T + b (x rows x cols/3, w cols x
                        cols/3: GPT-2 small's q|k|v map at 16,384 x 768 -> 2,304), its epilogue adding
                        the bias (cuBLASLt, as the library runs it): read x, w, b; write y   X + 4(rows + cols) cols/3 + C
     linear_bias_fill   the same with the bias filled into y and the product added to it (the thread's
                        cuBLASLt off, as before it); the same bytes: an A/B of the epilogue (compare us;
                        share is not a target for a product)
   GELU runs at GPT-2 small's MLP width (16,384 x 3,072: where the model runs it), layernorm, RMSNorm and
   the residual add at its model width (768), softmax over rows of 1,024 (attention at T = 1024), the
   cross-entropy at its vocabulary (8,192 rows of 50,257: 1.6 GB of logits; fewer rows, halving, while
   the device is short of memory, as for every op). */
enum {
    K_COPY, K_LN_FWD, K_LN_BWD, K_RMS_FWD, K_SOFTMAX_FWD, K_SOFTMAX_BWD, K_GELU_FWD, K_GELU_BWD, K_GELU_FWD_BF16, K_GELU_BWD_BF16,
    K_ADD_FWD, K_ROPE_FWD, K_XENT_FWD, K_XENT_BWD, K_XENT_BWD_BF16, K_XENT_FUSED, K_ADAMW, K_LIN_LT, K_LIN_FILL, K_N
};
typedef struct kop {
    const char *name, *layout;
    int64_t rows, cols, q_rows, q_cols; /* q_: --quick */
} kop;
static const kop KOPS[K_N] = {
    /* name               layout      rows   cols   quick: rows cols */
    {"copy",              "XX",       65536, 1024,  256,  1024},
    {"layernorm_fwd",     "XXNNCC",   16384, 768,   64,   96},   /* x y mean rstd g b */
    {"layernorm_bwd",     "XXXNNCCC", 16384, 768,   64,   96},   /* x dy dx mean rstd g dg db */
    {"rmsnorm_fwd",       "XXNC",     16384, 768,   64,   96},   /* x y rstd g */
    {"softmax_fwd",       "XX",       65536, 1024,  64,   128},  /* x y */
    {"softmax_bwd",       "XXX",      65536, 1024,  64,   128},  /* y dy dx */
    {"gelu_fwd",          "XX",       16384, 3072,  64,   384},  /* x y */
    {"gelu_bwd",          "XXX",      16384, 3072,  64,   384},  /* x dy dx */
    {"gelu_fwd_bf16",     "XXX",      16384, 3072,  64,   384},  /* x y (set-up space) */
    {"gelu_bwd_bf16",     "XXXC",     16384, 3072,  64,   384},  /* x dy dx db */
    {"add_fwd",           "XXX",      16384, 768,   64,   96},   /* a b y */
    {"rope_fwd",          "XX",       16384, 768,   64,   96},   /* x y */
    {"cross_entropy_fwd", "XN",       8192,  50257, 16,   1000}, /* logits lse */
    {"cross_entropy_bwd", "XNX",      8192,  50257, 16,   1000}, /* logits lse dlogits */
    {"xent_bwd_bf16",     "XNX",      8192,  50257, 16,   1000}, /* logits lse dlogits */
    {"xent_fused_bf16",   "XNX",      8192,  50257, 16,   1000}, /* logits lse dlogits */
    {"adamw",             "XXXX",     65536, 1024,  16,   4096}, /* value grad m v */
    {"linear_bias_lt",    "XXXC",     16384, 2304,  64,   96},   /* x (rows x cols/3 of it) w (cols x cols/3) y b */
    {"linear_bias_fill",  "XXXC",     16384, 2304,  64,   96},
};
#define K_MAX_T 8

static double kernel_bytes(int op, int64_t rows, int64_t cols) {
    double X = 4.0 * (double)rows * (double)cols, N = 4.0 * (double)rows, C = 4.0 * (double)cols;
    switch (op) {
    case K_COPY: return 2 * X;
    case K_LN_FWD: return 2 * X + 2 * N + 2 * C;
    case K_LN_BWD: return 4 * X + 2 * N + 5 * C;
    case K_RMS_FWD: return 2 * X + N + C;
    case K_SOFTMAX_FWD: return 2 * X;
    case K_SOFTMAX_BWD: return 4 * X;
    case K_GELU_FWD: return 2 * X;
    case K_GELU_BWD: return 4 * X;
    case K_GELU_FWD_BF16: return X;
    case K_GELU_BWD_BF16: return 1.5 * X + 2 * C;
    case K_ADD_FWD: return 3 * X;
    case K_ROPE_FWD: return 2 * X;
    case K_XENT_FWD: return X + 2 * N;
    case K_XENT_BWD: return 3 * X + 2 * N;
    case K_XENT_BWD_BF16: return 1.5 * X + 2 * N;
    case K_XENT_FUSED: return X + 2 * N;
    case K_ADAMW: return 8 * X;
    case K_LIN_LT:
    case K_LIN_FILL: return X + 4.0 * ((double)rows + (double)cols) * (double)(cols / 3) + C;
    default: return -1.0;
    }
}

typedef struct kbench {
    int op, n_t;
    int64_t rows, cols;
    tfm_tensor t[K_MAX_T]; /* device tensors, in the op's layout order */
    int32_t *targets;      /* the cross-entropy's, host memory */
    tfm_optim opt;         /* AdamW's */
    int64_t step;
} kbench;

/* One call of the op; *what names the call for a failure. */
static tfm_result kernel_call(kbench *k, const char **what) {
    tfm_tensor *t = k->t;
    float loss = 0.0f, norm = 0.0f;
    tfm_adamw_param p;
    switch (k->op) {
    case K_COPY: *what = "tfm_tensor_copy"; return tfm_tensor_copy(&t[1], &t[0]);
    case K_LN_FWD:
        *what = "tfm_layernorm_forward";
        return tfm_layernorm_forward(&t[1], &t[2], &t[3], &t[0], &t[4], &t[5], 1e-5f);
    case K_LN_BWD:
        *what = "tfm_layernorm_backward";
        return tfm_layernorm_backward(&t[2], &t[6], &t[7], &t[1], &t[0], &t[5], &t[3], &t[4]);
    case K_RMS_FWD: *what = "tfm_rmsnorm_forward"; return tfm_rmsnorm_forward(&t[1], &t[2], &t[0], &t[3], 1e-5f);
    case K_SOFTMAX_FWD: *what = "tfm_softmax_forward"; return tfm_softmax_forward(&t[1], &t[0]);
    case K_SOFTMAX_BWD: *what = "tfm_softmax_backward"; return tfm_softmax_backward(&t[2], &t[1], &t[0]);
    case K_GELU_FWD: *what = "tfm_gelu_forward"; return tfm_gelu_forward(&t[1], &t[0], TFM_GELU_TANH);
    case K_GELU_BWD: *what = "tfm_gelu_backward"; return tfm_gelu_backward(&t[2], &t[1], &t[0], TFM_GELU_TANH);
    case K_GELU_FWD_BF16:
        *what = "bench_gpu_gelu_fwd_bf16";
        return bench_gpu_gelu_fwd_bf16(t[1].data, t[0].data, k->rows, k->cols);
    case K_GELU_BWD_BF16:
        *what = "bench_gpu_gelu_bwd_bf16";
        return bench_gpu_gelu_bwd_bf16(t[2].data, t[3].data, t[1].data, t[0].data, k->rows, k->cols);
    case K_ADD_FWD: *what = "tfm_add_forward"; return tfm_add_forward(&t[2], &t[0], &t[1]);
    case K_ROPE_FWD: { /* sequences of up to 1,024 positions, 12 heads, every channel turned */
        int64_t T = k->rows % 1024 == 0 ? 1024 : k->rows;
        tfm_tensor x3 = tfm_tensor3(t[0].data, k->rows / T, T, k->cols), y3 = tfm_tensor3(t[1].data, k->rows / T, T, k->cols);
        x3.device = y3.device = TFM_DEVICE_CUDA;
        *what = "tfm_rope_forward";
        return tfm_rope_forward(&y3, &x3, 12, (int)(k->cols / 12), 10000.0f, NULL);
    }
    case K_XENT_FWD:
        *what = "tfm_cross_entropy_forward";
        return tfm_cross_entropy_forward(&loss, &t[1], &t[0], k->targets, -100, 0.0f);
    case K_XENT_BWD:
        *what = "tfm_cross_entropy_backward";
        return tfm_cross_entropy_backward(&t[2], 1.0f, &t[0], &t[1], k->targets, -100, 0.0f);
    case K_XENT_BWD_BF16:
    case K_XENT_FUSED:
        *what = "bench_gpu_xent_bf16";
        return bench_gpu_xent_bf16(t[2].data, t[1].data, t[0].data, k->targets, k->rows, k->cols, k->op == K_XENT_FUSED);
    case K_ADAMW:
        *what = "tfm_adamw_step";
        p.value = t[0], p.grad = t[1], p.m = t[2], p.v = t[3], p.decay = 1;
        return tfm_adamw_step(&p, 1, &k->opt, ++k->step, &norm);
    case K_LIN_LT:
    case K_LIN_FILL:
        *what = "bench_gpu_linear_bias";
        return bench_gpu_linear_bias(t[2].data, t[0].data, t[1].data, t[3].data, k->rows, k->cols / 3, k->cols,
                                     k->op == K_LIN_LT);
    default: *what = "?"; return TFM_E_ARG;
    }
}

/* n floats of device memory at p, uniform in [lo, hi): a host block of up to 2^20 values copied over and over
   (the values repeat; only their range matters here). */
static tfm_result dev_fill(float *p, int64_t n, float lo, float hi, float *host, tfm_rng *rng) {
    int64_t blk = n < (1 << 20) ? n : (1 << 20), off, i;
    tfm_result r = TFM_OK;
    for (i = 0; i < blk; i++) host[i] = lo + (hi - lo) * tfm_rng_uniform(rng);
    for (off = 0; off < n && r == TFM_OK; off += blk) {
        int64_t len = n - off < blk ? n - off : blk;
        tfm_tensor src = tfm_tensor1(host, len), dst = tfm_tensor1(p + off, len);
        dst.device = TFM_DEVICE_CUDA;
        r = tfm_tensor_copy(&dst, &src);
    }
    return r;
}

static void kernel_free(kbench *k) {
    int i;
    for (i = 0; i < k->n_t; i++) tfm_cuda_free(k->t[i].data);
    free(k->targets);
    k->n_t = 0;
    k->targets = NULL;
}

/* Device memory for the op's tensors at k->rows (halved while the device is short of memory), filled and set
   up; 0 on success, else 1 (reported). */
static int kernel_setup(kbench *k, float *host) {
    const kop *o = &KOPS[k->op];
    const char *what = "tfm_cuda_malloc";
    tfm_result r = TFM_OK;
    tfm_rng rng;
    int i, n = (int)strlen(o->layout);
    for (;;) {
        for (i = 0; i < n && r == TFM_OK; i++) {
            int64_t e = o->layout[i] == 'X' ? k->rows * k->cols : o->layout[i] == 'N' ? k->rows : k->cols;
            void *p = NULL;
            r = tfm_cuda_malloc(&p, (size_t)e * sizeof(float));
            if (r != TFM_OK) break;
            k->t[i] = o->layout[i] == 'X' ? tfm_tensor2((float *)p, k->rows, k->cols) : tfm_tensor1((float *)p, e);
            k->t[i].device = TFM_DEVICE_CUDA;
            k->n_t = i + 1;
        }
        if (r != TFM_E_NOMEM || k->rows < 2) break;
        kernel_free(k);
        k->rows /= 2;
        r = TFM_OK;
        fprintf(stderr, "bench_gpu: %s: out of device memory; trying %lld rows\n", o->name, (long long)k->rows);
    }
    if (r != TFM_OK) return fail(o->name, what, r);
    tfm_rng_seed(&rng, 42);
    what = "tfm_tensor_copy (fill)";
    for (i = 0; i < n && r == TFM_OK; i++) r = dev_fill(k->t[i].data, tfm_numel(&k->t[i]), -1.0f, 1.0f, host, &rng);
    if (r == TFM_OK && (k->op == K_XENT_FWD || k->op == K_XENT_BWD || k->op == K_XENT_BWD_BF16 || k->op == K_XENT_FUSED)) {
        k->targets = (int32_t *)xmalloc((size_t)k->rows * sizeof(int32_t));
        for (i = 0; i < (int)k->rows; i++) k->targets[i] = (int32_t)(tfm_rng_u64(&rng) % (uint64_t)k->cols);
    }
    if (r == TFM_OK) switch (k->op) { /* the saved statistics a backward reads, from its forward */
        case K_LN_BWD:
            what = "tfm_layernorm_forward (setup)";
            r = tfm_layernorm_forward(&k->t[2], &k->t[3], &k->t[4], &k->t[0], &k->t[5], NULL, 1e-5f);
            break;
        case K_GELU_FWD_BF16: /* the pre-activations x in bf16, as a bf16 product writes them */
        case K_GELU_BWD_BF16: /* the pre-activations x and dy in bf16, as the training step holds them (through dx) */
        case K_XENT_FUSED:    /* the logits in bf16, likewise */
            what = "bench_gpu_to_bf16 (setup)";
            r = bench_gpu_to_bf16(k->t[2].data, k->t[0].data, k->rows, k->cols);
            if (r == TFM_OK) r = tfm_tensor_copy(&k->t[0], &k->t[2]);
            if (r == TFM_OK && k->op == K_GELU_BWD_BF16) { /* and its output gradient dy */
                r = bench_gpu_to_bf16(k->t[2].data, k->t[1].data, k->rows, k->cols);
                if (r == TFM_OK) r = tfm_tensor_copy(&k->t[1], &k->t[2]);
            }
            break;
        case K_SOFTMAX_BWD:
            what = "tfm_softmax_forward (setup)";
            r = tfm_softmax_forward(&k->t[0], &k->t[0]);
            break;
        case K_XENT_BWD:
        case K_XENT_BWD_BF16: {
            float loss;
            what = "tfm_cross_entropy_forward (setup)";
            r = tfm_cross_entropy_forward(&loss, &k->t[1], &k->t[0], k->targets, -100, 0.0f);
            break;
        }
        case K_ADAMW: /* zeroed moments, as before a first step */
            what = "tfm_tensor_copy (fill)";
            r = dev_fill(k->t[2].data, tfm_numel(&k->t[2]), 0.0f, 0.0f, host, &rng);
            if (r == TFM_OK) r = dev_fill(k->t[3].data, tfm_numel(&k->t[3]), 0.0f, 0.0f, host, &rng);
            memset(&k->opt, 0, sizeof k->opt);
            k->opt.lr = 1e-4f;
            k->opt.weight_decay = 0.01f;
            k->opt.clip_norm = 1.0f; /* the norm pass runs whatever clip_norm; clipping then scales */
            k->step = 0;
            break;
        default: break;
        }
    if (r != TFM_OK) return fail(o->name, what, r);
    return sync_gpu(o->name);
}

/* Seconds per call: 2 untimed calls, a third timed alone to size a rep (calls back to back, about 2 ms of them,
   so that the launch and the synchronisation cost nothing to speak of; 1 with --quick), then reps of that
   many calls, each between two tfm_cuda_synchronize, until about the budget is spent or 50 reps (at least
   3; 1 with --quick); the median rep over its calls. < 0 on failure (reported). */
static double kernel_time(kbench *k, double budget, int *reps, int *calls) {
    const char *name = KOPS[k->op].name, *what = "?";
    double times[50], spent = 0.0, t0 = 0.0, t1;
    int max_reps = g_quick ? 1 : 50, min_reps = g_quick ? 1 : 3, inner, n = 0, i;
    tfm_result r;
    *reps = *calls = 0;
    for (i = 0; i < 3; i++) { /* the third alone, timed */
        if (i == 2) {
            if (sync_gpu(name)) return -1.0;
            t0 = now_s();
        }
        if ((r = kernel_call(k, &what)) != TFM_OK) {
            fail(name, what, r);
            return -1.0;
        }
    }
    if (sync_gpu(name)) return -1.0;
    t1 = now_s() - t0;
    inner = g_quick ? 1 : t1 < 2e-5 ? 100 : (int)ceil(2e-3 / t1);
    if (inner > 100) inner = 100;
    if (inner < 1) inner = 1;
    while (n < max_reps && (n < min_reps || spent < budget)) {
        if (sync_gpu(name)) return -1.0;
        t0 = now_s();
        for (i = 0; i < inner; i++)
            if ((r = kernel_call(k, &what)) != TFM_OK) {
                fail(name, what, r);
                return -1.0;
            }
        if (sync_gpu(name)) return -1.0;
        t1 = now_s() - t0;
        spent += t1;
        times[n++] = t1 / inner;
    }
    *reps = n;
    *calls = inner;
    return median(times, n);
}

typedef struct krow {
    const char *name;
    int64_t rows, cols;
    double us, gbs, share;
} krow;
static krow g_krows[K_N];
static int g_nkrows = 0;

/* "-1" for a failed value, else v in fmt */
static const char *kfmt(char *buf, double v, const char *fmt) {
    if (v < 0) strcpy(buf, "-1");
    else sprintf(buf, fmt, v);
    return buf;
}

static void run_kernels(double budget) {
    double copy_gbs = -1.0;
    float *host = (float *)xmalloc((size_t)(1 << 20) * sizeof(float));
    int op;
    for (op = 0; op < K_N; op++) {
        kbench k;
        double s = -1.0, us = -1.0, gbs = -1.0, share = -1.0, bytes;
        int reps = 0, calls = 0;
        char b1[32], b2[32], b3[32], b4[32];
        memset(&k, 0, sizeof k);
        k.op = op;
        k.rows = g_quick ? KOPS[op].q_rows : KOPS[op].rows;
        k.cols = g_quick ? KOPS[op].q_cols : KOPS[op].cols;
        if (kernel_setup(&k, host) == 0) s = kernel_time(&k, budget, &reps, &calls);
        kernel_free(&k);
        bytes = kernel_bytes(op, k.rows, k.cols);
        if (s > 0) {
            us = 1e6 * s;
            gbs = bytes / s * 1e-9;
        }
        if (op == K_COPY) copy_gbs = gbs;
        if (gbs > 0 && copy_gbs > 0) share = gbs / copy_gbs;
        printf("RESULT impl=ours device=cuda mode=kernel name=%s rows=%lld cols=%lld bytes=%.0f us=%s gbs=%s copy_gbs=%s "
               "share=%s reps=%d calls=%d\n",
               KOPS[op].name, (long long)k.rows, (long long)k.cols, bytes, kfmt(b1, us, "%.2f"), kfmt(b2, gbs, "%.1f"),
               kfmt(b3, copy_gbs, "%.1f"), kfmt(b4, share, "%.4f"), reps, calls);
        fflush(stdout);
        if (g_nkrows < K_N) {
            krow *r = &g_krows[g_nkrows++];
            r->name = KOPS[op].name, r->rows = k.rows, r->cols = k.cols, r->us = us, r->gbs = gbs, r->share = share;
        }
    }
    free(host);
}

static void print_kernel_table(void) {
    int i;
    char b1[32], b2[32], b3[32];
    if (!g_nkrows) return;
    printf("\n== memory-bound ops on %s: share of the device's copy bandwidth (target >= 0.70)\n", g_device);
    printf("%-18s %8s %6s %10s %9s %7s\n", "op", "rows", "cols", "us", "GB/s", "share");
    for (i = 0; i < g_nkrows; i++) {
        const krow *r = &g_krows[i];
        printf("%-18s %8lld %6lld %10s %9s %7s\n", r->name, (long long)r->rows, (long long)r->cols,
               kfmt(b1, r->us, "%.2f"), kfmt(b2, r->gbs, "%.1f"), kfmt(b3, r->share, "%.3f"));
    }
    printf("us: median time per call; GB/s: the bytes the op must move at least (bench_gpu.c's KOPS) over that;\n"
           "share: over copy's GB/s (tfm_tensor_copy between two device tensors of rows x cols floats, 2 x moved)\n");
}

/* ---- main ---------------------------------------------------------------------------------------- */

static void print_table(void) {
    int i;
    if (!g_nrows) return;
    printf("\n== transformer.h on %s (prec: the products' precision)\n", g_device);
    printf("%-18s %-6s %4s %5s %12s %12s %8s\n", "config", "mode", "prec", "batch", "ms", "tokens/s", "TFLOP/s");
    for (i = 0; i < g_nrows; i++) {
        const row *r = &g_rows[i];
        char tf[16] = "-";
        if (r->tflops >= 0) sprintf(tf, "%.2f", r->tflops);
        printf("%-18s %-6s %4s %5d %12.3f %12.0f %8s\n", r->name, r->mode ? "gen" : "train", PREC_NAMES[r->prec], r->batch,
               r->ms, r->tok_s, tf);
    }
    printf("ms: train = median step (zero_grad, forward, backward, AdamW); gen = ms per new token of the whole batch\n");
}

static void usage(FILE *f) {
    int i;
    fprintf(f, "usage: bench_gpu [--quick] [--tf32] [--bf16] [--no-fp32] [--no-train] [--no-gen] [--no-check]\n"
               "                 [--budget SECONDS] [--gen-batch 1|8|32] [--kernels] [CONFIG...]\n"
               "       bench_gpu --list\n"
               "CONFIG defaults to $CONFIGS, else the default configs. QUICK=1: --quick. --kernels: the memory-bound\n"
               "ops (layernorm, softmax, GELU, add, cross-entropy, AdamW) against the device's copy bandwidth, then\n"
               "only the configs named here (--budget: seconds per op, default 1). configs:");
    for (i = 0; i < N_CONFIGS; i++)
        fprintf(f, " %s%s", CONFIGS[i].name,
                CONFIGS[i].is_default == 1 ? "" : CONFIGS[i].is_default == 2 ? "(by name)" : "(smoke)");
    fprintf(f, "\n");
}

int main(int argc, char **argv) {
    const gpu_cfg *sel[64];
    int n_sel = 0, do_train = 1, do_fp32 = 1, do_gen = 1, do_check = 1, do_tf32 = 0, do_bf16 = 0, do_kernels = 0, i;
    double k_budget = 1.0; /* --kernels: seconds of timed calls per op, unless a budget is given */
    const char *q = getenv("QUICK"), *env_cfgs = getenv("CONFIGS"), *bud = getenv("BENCH_GPU_BUDGET");
    char cfgbuf[1024];
    tfm_result r;
    g_quick = q && *q && strcmp(q, "0") != 0;
    if (bud && *bud) g_budget = k_budget = atof(bud);
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--quick") == 0) g_quick = 1;
        else if (strcmp(a, "--tf32") == 0) do_tf32 = 1;
        else if (strcmp(a, "--bf16") == 0) do_bf16 = 1;
        else if (strcmp(a, "--no-fp32") == 0) do_fp32 = 0;
        else if (strcmp(a, "--no-train") == 0) do_train = 0;
        else if (strcmp(a, "--no-gen") == 0) do_gen = 0;
        else if (strcmp(a, "--no-check") == 0) do_check = 0;
        else if (strcmp(a, "--budget") == 0 && i + 1 < argc) g_budget = k_budget = atof(argv[++i]);
        else if (strcmp(a, "--kernels") == 0) do_kernels = 1;
        else if (strcmp(a, "--gen-batch") == 0 && i + 1 < argc) {
            g_gen_batch = atoi(argv[++i]);
            if (g_gen_batch != 1 && g_gen_batch != 8 && g_gen_batch != 32) {
                fprintf(stderr, "bench_gpu: --gen-batch takes 1, 8 or 32\n");
                return 2;
            }
        } else if (strcmp(a, "--list") == 0) {
            for (i = 0; i < N_CONFIGS; i++) printf("%s\n", CONFIGS[i].name);
            return 0;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (a[0] == '-') {
            fprintf(stderr, "bench_gpu: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!find_config(a)) {
            fprintf(stderr, "bench_gpu: unknown config '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (n_sel < 64) {
            sel[n_sel++] = find_config(a);
        }
    }
    if (!(g_budget > 0)) g_budget = 8.0;
    if (!(k_budget > 0)) k_budget = 1.0;
    if (!n_sel && !do_kernels && env_cfgs && *env_cfgs) {
        char *tok;
        strncpy(cfgbuf, env_cfgs, sizeof cfgbuf - 1);
        cfgbuf[sizeof cfgbuf - 1] = '\0';
        for (tok = strtok(cfgbuf, " ,\t\n"); tok; tok = strtok(NULL, " ,\t\n")) {
            if (!find_config(tok)) {
                fprintf(stderr, "bench_gpu: unknown config '%s' in CONFIGS\n", tok);
                usage(stderr);
                return 2;
            }
            if (n_sel < 64) sel[n_sel++] = find_config(tok);
        }
    }
    if (!n_sel && !do_kernels)
        for (i = 0; i < N_CONFIGS; i++)
            if (CONFIGS[i].is_default == 1) sel[n_sel++] = &CONFIGS[i];

    if ((r = tfm_cuda_available()) != TFM_OK) {
        fprintf(stderr, "bench_gpu: no CUDA device: %s: %s\n", tfm_result_string(r), tfm_last_error());
        printf("FAIL impl=ours call=tfm_cuda_available result=%d\n", (int)r);
        return 3;
    }
    if (tfm_cuda_device_info(g_device, sizeof g_device) != TFM_OK) strcpy(g_device, "?");
    for (i = 0; g_device[i]; i++)
        if (g_device[i] == '"' || g_device[i] == '\n') g_device[i] = '\'';
    printf("INFO impl=ours device=\"%s\" transformer.h=%d.%d.%d quick=%d budget_s=%.1f\n", g_device, TFM_VERSION_MAJOR,
           TFM_VERSION_MINOR, TFM_VERSION_PATCH, g_quick, g_budget);
    fflush(stdout);
    if ((r = tfm_cuda_set_tf32(0)) != TFM_OK) fail("-", "tfm_cuda_set_tf32(0)", r);
    if (do_kernels) run_kernels(k_budget);

    for (i = 0; i < n_sel; i++) {
        const gpu_cfg *b = sel[i];
        gpu_data d;
        data_make(b, &d);
        if (do_check) run_check(b, &d);
        if (do_train && do_fp32) run_train(b, &d, 0);
        if (do_train && do_tf32) run_train(b, &d, 1);
        if (do_train && do_bf16) run_train(b, &d, 2);
        if (do_gen) run_gen(b, 0);
        if (do_gen && do_bf16) run_gen(b, 1);
        data_free(&d);
    }
    print_table();
    print_kernel_table();
    return g_failed ? 1 : 0;
}
