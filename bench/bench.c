/* bench/bench.c - training and inference speed of transformer.h on five reference models.

   Usage:
       build/bench info                  backend, OpenBLAS core and version, OpenMP threads
       build/bench sgemm THREADS         the sgemm ceiling: square 2048 and the products each model uses,
                                         built-in, OpenBLAS and BLIS side by side, with the FMA peak
       build/bench kernel                the built-in micro-kernels alone on packed data, against the peak
       build/bench model NAME THREADS    one model (run one per process, so peak RSS is that model's)
       build/bench train NAME THREADS    its training steps only: what to run under perf or callgrind
       build/bench list                  the model names
       build/bench gen NAME THREADS      an LM's greedy generation at batch 1, 8 and 32 (inference_only,
                                         max_batch 32), its memory against the README's formula, and the
                                         machine's read bandwidth (a 1 GiB buffer summed with vector loads)
       build/bench gqa THREADS           batch-32 generation of a LLaMA-style LM with grouped-query attention
                                         (n_kv_heads = n_heads / 4) against the same model with full heads
       build/bench window THREADS        sliding-window training at T 4096 against full causal attention, and
                                         generation of 10,000 ids past max_len (cache bytes, peak RSS)
       build/bench llama THREADS         the LLaMA-style block's training step against GPT's, and RMSNorm,
                                         SwiGLU and rotary positions timed alone as a share of it
       build/bench dump NAME FILE        weights, batch, logits, loss and gradient norm of one model, for
                                         `bench/torch_ref.py verify NAME FILE` (same function on both sides)

   bench/run.sh runs all of them next to the PyTorch reference (bench/torch_ref.py) and prints a table.
   QUICK=1 in the environment: fewer repetitions (a smoke run; the numbers are not meant to be read).

   Each `model` run prints one line
       RESULT impl=ours name=... threads=... params=... step_ms=... step_min_ms=... fwd_ms=...
              tok_s=... gflop_step=... gflops=... peak_mb=... gen_ms_tok=... loss=... attn_ms=...
   step_ms is the median of the timed training steps (zero_grad + forward with loss + backward +
   AdamW step); fwd_ms the median eval-mode forward with loss; gen_ms_tok the median over runs of
   (time of a greedy batch-1 generation of 127 new tokens from a 1-token prompt) / 127 (LMs only,
   else -1); peak_mb is getrusage's ru_maxrss of the whole process; attn_ms the attention kernel's
   forward and backward at the model's attention shapes, timed apart (attention_ms below).

   FLOPs per training step (counted by model_flops below; bench/README.md has the same formula):
   6 FLOPs per weight of every matrix product per row it is applied to (2 forward, 2 for the input
   gradient, 2 for the weight gradient), plus 12*B*Tq*Tk*C per attention (Q K^T and P V, 2*B*Tq*Tk*C
   FLOPs each forward, twice that backward), the full Tq x Tk square even when causal. Embedding
   lookups, biases, layernorms, softmax, activations and the optimizer are not counted.
       per-layer weights   Wenc = 4C^2 + 2CF   (in_proj 3C^2, out_proj C^2, linear1 and linear2 CF)
                           Wdec = 6C^2 + 2CF   (enc-dec decoder layer on target rows: self-attention
                                                4C^2, cross-attention query and out_proj 2C^2, FF 2CF)
                                  + 2C^2 on source rows (the cross-attention key/value projection)
       LM          6*B*T*(L*Wenc + V*C)            + 12*B*L*T^2*C
       classifier  6*B*T*L*Wenc + 6*B*K*C          + 12*B*L*T^2*C
       enc-dec     6*B*Ts*(Le*Wenc + Ld*2C^2) + 6*B*Tt*(Ld*Wdec + Vt*C)
                                                   + 12*B*C*(Le*Ts^2 + Ld*(Tt^2 + Tt*Ts))
   Tokens per step: B*T (LM, classifier) and B*(Ts+Tt) (enc-dec). */
#define _GNU_SOURCE /* RTLD_DEEPBIND */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define TFM_IMPLEMENTATION
#include "../transformer.h"
#include "bench_util.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct bench_cfg {
    const char *name;
    tfm_model_kind kind;
    int d_model, n_layers, n_dec_layers, n_heads, d_ff; /* d_ff 0 -> 4*d_model */
    int T, Tt, B, V, Vt, n_classes;                      /* T: sequence (enc-dec: source) length */
    int warmup, steps, fwd_reps, gen_reps;
} bench_cfg;

/* Every model: dropout 0, AdamW lr 1e-4, weight decay 0.01, random tokens, full-length rows. */
static const bench_cfg CONFIGS[] = {
    /* name                 kind                    C  L  Ld  H  F     T   Tt  B   V      Vt  K  wu st fw gen */
    {"char-gpt-tiny",      TFM_MODEL_DECODER_LM,         128, 4, 0, 4, 0,    128, 0, 16, 96,    0,  0, 3, 20, 20, 3},
    {"gpt-small",          TFM_MODEL_DECODER_LM,         384, 6, 0, 6, 0,    256, 0, 8,  8192,  0,  0, 3, 10, 5,  3},
    {"gpt2-124M-shape",    TFM_MODEL_DECODER_LM,         768, 12, 0, 12, 0,  128, 0, 2,  50257, 0,  0, 2, 10, 5,  3},
    {"encoder-classifier", TFM_MODEL_ENCODER_CLASSIFIER, 256, 4, 0, 8, 0,    256, 0, 16, 1024,  0,  2, 3, 10, 10, 0},
    {"enc-dec",            TFM_MODEL_ENCODER_DECODER,    256, 3, 3, 4, 1024, 32, 32, 64, 64,    64, 0, 3, 10, 10, 0},
    /* char-gpt-tiny at T = 4096: trains because attention stores O(T) per head, not T x T */
    {"char-gpt-4k",        TFM_MODEL_DECODER_LM,         128, 4, 0, 4, 0,    4096, 0, 2, 96,    0,  0, 1, 3,  3,  0},
};
#define N_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))
#define GEN_NEW 127

static int quick_mode(void) {
    const char *q = getenv("QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1.0;
    return (double)ru.ru_maxrss / 1024.0; /* Linux: kilobytes */
}

static const bench_cfg *find_config(const char *name) {
    int i;
    for (i = 0; i < N_CONFIGS; i++)
        if (strcmp(CONFIGS[i].name, name) == 0) return &CONFIGS[i];
    return NULL;
}

static int cfg_dff(const bench_cfg *b) { return b->d_ff ? b->d_ff : 4 * b->d_model; }

/* FLOPs of one training step, by the formula in the comment at the top. */
static double model_flops(const bench_cfg *b) {
    double B = b->B, C = b->d_model, F = cfg_dff(b), L = b->n_layers, T = b->T;
    double Wenc = 4.0 * C * C + 2.0 * C * F;
    if (b->kind == TFM_MODEL_DECODER_LM)
        return 6.0 * B * T * (L * Wenc + (double)b->V * C) + 12.0 * B * L * T * T * C;
    if (b->kind == TFM_MODEL_ENCODER_CLASSIFIER)
        return 6.0 * B * T * L * Wenc + 6.0 * B * (double)b->n_classes * C + 12.0 * B * L * T * T * C;
    {
        double Ld = b->n_dec_layers, Ts = b->T, Tt = b->Tt, Vt = b->Vt;
        double Wdec = 6.0 * C * C + 2.0 * C * F;
        return 6.0 * B * Ts * (L * Wenc + Ld * 2.0 * C * C) + 6.0 * B * Tt * (Ld * Wdec + Vt * C) +
               12.0 * B * C * (L * Ts * Ts + Ld * (Tt * Tt + Tt * Ts));
    }
}

static double model_tokens(const bench_cfg *b) {
    return (double)b->B * (double)(b->kind == TFM_MODEL_ENCODER_DECODER ? b->T + b->Tt : b->T);
}

static tfm_config make_config(const bench_cfg *b) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = b->kind;
    c.vocab_size = b->V;
    c.d_model = b->d_model;
    c.n_heads = b->n_heads;
    c.n_layers = b->n_layers;
    c.d_ff = b->d_ff;
    c.max_len = b->T;
    c.max_batch = b->B;
    c.dropout = 0.0f;
    c.attn_dropout = 0.0f;
    c.pos = TFM_POS_LEARNED;
    c.seed = 1234;
    switch (b->kind) {
    case TFM_MODEL_DECODER_LM:
        c.norm_first = 1;
        c.act = TFM_ACT_GELU_TANH;
        c.tie_output = 1;
        break;
    case TFM_MODEL_ENCODER_CLASSIFIER:
        c.norm_first = 0;
        c.act = TFM_ACT_RELU;
        c.pool = TFM_POOL_MEAN;
        c.n_classes = b->n_classes;
        break;
    default: /* encoder-decoder: pre-LN, ReLU (torch's default), separate embeddings and head */
        c.norm_first = 1;
        c.act = TFM_ACT_RELU;
        c.n_dec_layers = b->n_dec_layers;
        c.max_tgt_len = b->Tt;
        c.tgt_vocab_size = b->Vt;
        break;
    }
    return c;
}

static void fill_ids(int32_t *ids, size_t n, int range, tfm_rng *rng) {
    size_t i;
    for (i = 0; i < n; i++) ids[i] = (int32_t)(tfm_rng_u64(rng) % (uint64_t)range);
}

/* A model's random batch (full-length rows, no padding, ids from a fixed seed) and the optimizer every
   model uses: AdamW, lr 1e-4, weight decay 0.01. */
typedef struct bench_data {
    int32_t *src, *tgt_in, *targets;
    tfm_batch batch;
    tfm_optim opt;
} bench_data;

static void data_make(const bench_cfg *bc, tfm_rng *rng, bench_data *d) {
    int encdec = bc->kind == TFM_MODEL_ENCODER_DECODER, lm = bc->kind == TFM_MODEL_DECODER_LM;
    size_t n_src = (size_t)bc->B * bc->T, n_tgt = (size_t)bc->B * (encdec ? bc->Tt : bc->T);
    memset(d, 0, sizeof *d);
    d->src = (int32_t *)xmalloc(n_src * sizeof(int32_t));
    d->tgt_in = (int32_t *)xmalloc(n_tgt * sizeof(int32_t));
    d->targets = (int32_t *)xmalloc(n_tgt * sizeof(int32_t));
    fill_ids(d->src, n_src, bc->V, rng);
    if (encdec) {
        fill_ids(d->tgt_in, n_tgt, bc->Vt, rng);
        fill_ids(d->targets, n_tgt, bc->Vt, rng);
    } else if (lm) {
        fill_ids(d->targets, n_tgt, bc->V, rng);
    } else {
        fill_ids(d->targets, (size_t)bc->B, bc->n_classes, rng);
    }
    d->batch.batch = bc->B;
    d->batch.len = bc->T;
    d->batch.tokens = d->src;
    d->batch.targets = d->targets;
    if (encdec) {
        d->batch.tgt_len = bc->Tt;
        d->batch.tgt_in = d->tgt_in;
    }
    d->opt.lr = 1e-4f;
    d->opt.weight_decay = 0.01f;
}

/* How many target ids the batch holds: one per position, or one per row for a classifier. */
static size_t data_n_targets(const bench_cfg *bc) {
    if (bc->kind == TFM_MODEL_ENCODER_CLASSIFIER) return (size_t)bc->B;
    return (size_t)bc->B * (bc->kind == TFM_MODEL_ENCODER_DECODER ? bc->Tt : bc->T);
}

static void data_free(bench_data *d) {
    free(d->src);
    free(d->tgt_in);
    free(d->targets);
}

static void die_tfm(const char *what, tfm_result r) {
    fprintf(stderr, "bench: %s failed: %s: %s\n", what, tfm_result_string(r), tfm_last_error());
    exit(1);
}

/* ---- model ------------------------------------------------------------------------------------ */

/* `train` under `perf record -D -1 --control fifo:PATH` (bench/profile.sh): with BENCH_PERF_CTL=PATH,
   sampling is switched on for the training steps only, so model initialisation (seconds of random
   draws and page faults for the large models) stays out of the profile. */
static void perf_control(const char *cmd) {
    const char *path = getenv("BENCH_PERF_CTL");
    FILE *f;
    if (!path || !*path) return;
    f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench: cannot open BENCH_PERF_CTL=%s; the profile covers the whole run\n", path);
        return;
    }
    fprintf(f, "%s\n", cmd);
    fclose(f);
}

static double train_step(tfm_model *m, const tfm_batch *batch, const tfm_optim *opt, float *loss) {
    double t0 = now_s();
    tfm_result r;
    tfm_model_zero_grad(m);
    if ((r = tfm_model_forward(m, batch, loss, NULL)) != TFM_OK) die_tfm("tfm_model_forward", r);
    if ((r = tfm_model_backward(m, 1.0f)) != TFM_OK) die_tfm("tfm_model_backward", r);
    if ((r = tfm_model_step(m, opt, NULL)) != TFM_OK) die_tfm("tfm_model_step", r);
    return now_s() - t0;
}

static void fill_small(float *p, size_t n, tfm_rng *rng);

/* Attention's own work in a training step, timed apart from the model: tfm_attention_forward and
   tfm_attention_backward (the fused kernel: scores, softmax, weighted values; no projections) at each
   attention layer's shape on random q, k, v, times the number of such layers. Median over `reps`
   repetitions of the whole set, after one untimed one. */
static double attention_ms(const bench_cfg *bc, int reps) {
    struct { int Tq, Tk, causal, count; } kinds[3];
    int nk = 0, i, r, B = bc->B, C = bc->d_model, H = bc->n_heads, Tmax = bc->T > bc->Tt ? bc->T : bc->Tt;
    size_t n = (size_t)B * (size_t)Tmax * (size_t)C;
    float *buf = (float *)xmalloc(8 * n * sizeof(float) + (size_t)B * H * Tmax * sizeof(float));
    float *q = buf, *k = q + n, *v = k + n, *o = v + n, *dout = o + n, *dq = dout + n, *dk = dq + n, *dv = dk + n;
    float *lse = dv + n;
    double *times = (double *)xmalloc((size_t)(reps + 1) * sizeof(double)), ms;
    tfm_rng rng;
    tfm_result res;
    if (bc->kind == TFM_MODEL_ENCODER_DECODER) {
        kinds[nk].Tq = bc->T, kinds[nk].Tk = bc->T, kinds[nk].causal = 0, kinds[nk++].count = bc->n_layers;
        kinds[nk].Tq = bc->Tt, kinds[nk].Tk = bc->Tt, kinds[nk].causal = 1, kinds[nk++].count = bc->n_dec_layers;
        kinds[nk].Tq = bc->Tt, kinds[nk].Tk = bc->T, kinds[nk].causal = 0, kinds[nk++].count = bc->n_dec_layers;
    } else {
        kinds[nk].Tq = bc->T, kinds[nk].Tk = bc->T, kinds[nk].causal = bc->kind == TFM_MODEL_DECODER_LM;
        kinds[nk++].count = bc->n_layers;
    }
    tfm_rng_seed(&rng, 7);
    fill_small(buf, 8 * n, &rng);
    for (r = 0; r <= reps; r++) {
        double total = 0.0;
        for (i = 0; i < nk; i++) {
            tfm_tensor tq = tfm_tensor3(q, B, kinds[i].Tq, C), tk = tfm_tensor3(k, B, kinds[i].Tk, C);
            tfm_tensor tv = tfm_tensor3(v, B, kinds[i].Tk, C), to = tfm_tensor3(o, B, kinds[i].Tq, C);
            tfm_tensor tdo = tfm_tensor3(dout, B, kinds[i].Tq, C), tdq = tfm_tensor3(dq, B, kinds[i].Tq, C);
            tfm_tensor tdk = tfm_tensor3(dk, B, kinds[i].Tk, C), tdv = tfm_tensor3(dv, B, kinds[i].Tk, C);
            tfm_tensor tl = tfm_tensor3(lse, B, H, kinds[i].Tq);
            tfm_attn_opts ao;
            double t0 = now_s();
            memset(&ao, 0, sizeof ao);
            ao.causal = kinds[i].causal;
            if ((res = tfm_attention_forward(&to, &tl, &tq, &tk, &tv, H, &ao)) != TFM_OK)
                die_tfm("tfm_attention_forward", res);
            if ((res = tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, H, &ao)) != TFM_OK)
                die_tfm("tfm_attention_backward", res);
            total += (now_s() - t0) * kinds[i].count;
        }
        if (r) times[r - 1] = total;
    }
    ms = 1e3 * median(times, reps);
    free(times);
    free(buf);
    return ms;
}

static int run_model(const bench_cfg *bc, int threads, int train_only) {
    tfm_config cfg = make_config(bc);
    tfm_model *m = (tfm_model *)xmalloc(sizeof *m);
    bench_data d;
    tfm_rng rng;
    tfm_result r;
    int quick = quick_mode();
    int warmup = quick ? 1 : bc->warmup, steps = quick ? 3 : bc->steps;
    int fwd_reps = quick ? 2 : bc->fwd_reps, gen_reps = quick ? 1 : bc->gen_reps;
    int lm = bc->kind == TFM_MODEL_DECODER_LM, rc = 0;
    double *times = (double *)xmalloc((size_t)(steps + fwd_reps + gen_reps + 1) * sizeof(double));
    double step_ms, step_min_ms, fwd_ms = -1.0, gen_ms_tok = -1.0, attn_ms, flops = model_flops(bc), t0;
    float loss = 0.0f;
    int i;

    tfm_set_num_threads(threads);
    tfm_rng_seed(&rng, 42);
    data_make(bc, &rng, &d);

    if ((r = tfm_model_init(m, &cfg, NULL, 0)) != TFM_OK) die_tfm("tfm_model_init", r);
    printf("MODEL impl=ours name=%s threads=%d params=%lld omp_threads=%d sgemm=%s\n", bc->name, threads,
           (long long)m->n_weights, tfm_get_num_threads(), tfm_sgemm_backend());
    fflush(stdout);

    /* training: warm-up, then timed steps */
    tfm_model_train(m, 1);
    if (train_only) perf_control("enable");
    for (i = 0; i < warmup; i++) train_step(m, &d.batch, &d.opt, &loss);
    for (i = 0; i < steps; i++) times[i] = train_step(m, &d.batch, &d.opt, &loss);
    if (train_only) perf_control("disable");
    step_ms = 1e3 * median(times, steps); /* sorted now */
    step_min_ms = 1e3 * times[0];
    if (!isfinite(loss)) {
        fprintf(stderr, "bench: %s: the loss is not finite (%g)\n", bc->name, (double)loss);
        rc = 1;
        goto done;
    }

    if (train_only) {
        printf("RESULT impl=ours name=%s threads=%d train_only=1 step_ms=%.3f step_min_ms=%.3f loss=%.5f steps=%d\n",
               bc->name, threads, step_ms, step_min_ms, (double)loss, steps);
        goto done;
    }

    /* forward only, eval mode, with the loss */
    tfm_model_train(m, 0);
    if ((r = tfm_model_forward(m, &d.batch, &loss, NULL)) != TFM_OK) die_tfm("tfm_model_forward (eval)", r);
    for (i = 0; i < fwd_reps; i++) {
        t0 = now_s();
        if ((r = tfm_model_forward(m, &d.batch, &loss, NULL)) != TFM_OK) die_tfm("tfm_model_forward (eval)", r);
        times[i] = now_s() - t0;
    }
    fwd_ms = 1e3 * median(times, fwd_reps);
    attn_ms = attention_ms(bc, quick ? 1 : 3);

    /* greedy batch-1 generation of GEN_NEW tokens from a 1-token prompt (LMs) */
    if (lm && gen_reps > 0) {
        int32_t prompt[1], out[GEN_NEW];
        tfm_gen_opts go;
        int n_out = 0;
        prompt[0] = d.src[0];
        memset(&go, 0, sizeof go);
        go.max_new = GEN_NEW;
        for (i = 0; i < gen_reps; i++) {
            t0 = now_s();
            if ((r = tfm_model_generate(m, NULL, 0, prompt, 1, &go, out, &n_out)) != TFM_OK)
                die_tfm("tfm_model_generate", r);
            times[i] = now_s() - t0;
            if (n_out != GEN_NEW) {
                fprintf(stderr, "bench: generate gave %d tokens, not %d\n", n_out, GEN_NEW);
                rc = 1;
                goto done;
            }
        }
        gen_ms_tok = 1e3 * median(times, gen_reps) / GEN_NEW;
    }

    printf("RESULT impl=ours name=%s threads=%d params=%lld step_ms=%.3f step_min_ms=%.3f fwd_ms=%.3f "
           "tok_s=%.1f gflop_step=%.4f gflops=%.2f peak_mb=%.1f gen_ms_tok=%.4f loss=%.5f steps=%d attn_ms=%.3f\n",
           bc->name, threads, (long long)m->n_weights, step_ms, step_min_ms, fwd_ms,
           model_tokens(bc) / (step_ms * 1e-3), flops * 1e-9, flops * 1e-9 / (step_ms * 1e-3), peak_rss_mb(),
           gen_ms_tok, (double)loss, steps, attn_ms);
done:
    fflush(stdout);
    tfm_model_free(m);
    free(m);
    data_free(&d);
    free(times);
    return rc;
}

/* ---- dump: weights, data and results for torch_ref.py's `verify` ------------------------------ */

/* Writes a file torch_ref.py reads back into its model of the same name, to check that both compute
   the same function: lines of text, each "param"/"ids"/"floats" line followed by its raw little-endian
   data. The model is initialised with Xavier matrices and perturbed vectors (biases, layernorms) so
   that activations are O(1) and every parameter matters. Recorded: the training-mode forward's loss
   and logits, the global gradient norm of that loss, and the loss after one AdamW step. */
static void dump_floats(FILE *f, const char *tag, const char *name, const float *p, int64_t n) {
    fprintf(f, "%s %s %lld\n", tag, name, (long long)n);
    fwrite(p, sizeof(float), (size_t)n, f);
    fprintf(f, "\n");
}

static void dump_ids(FILE *f, const char *name, const int32_t *p, int64_t n) {
    fprintf(f, "ids %s %lld\n", name, (long long)n);
    fwrite(p, sizeof(int32_t), (size_t)n, f);
    fprintf(f, "\n");
}

static int run_dump(const bench_cfg *bc, const char *path) {
    tfm_config cfg = make_config(bc);
    tfm_model *m = (tfm_model *)xmalloc(sizeof *m);
    bench_data d;
    tfm_rng rng;
    tfm_result r;
    tfm_tensor lg;
    int i, k;
    float loss0 = 0.0f, loss1 = 0.0f, gnorm = 0.0f;
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "bench: cannot write %s\n", path);
        free(m);
        return 1;
    }
    tfm_rng_seed(&rng, 42);
    data_make(bc, &rng, &d);
    cfg.init = TFM_INIT_XAVIER;
    if ((r = tfm_model_init(m, &cfg, NULL, 0)) != TFM_OK) die_tfm("tfm_model_init", r);
    fprintf(f, "tfm-bench-dump 1 %s\n", bc->name);
    for (i = 0; i < m->n_params; i++) {
        tfm_param *p = &m->params[i];
        int64_t j, n = tfm_numel(&p->value);
        if (p->value.ndim == 1)
            for (j = 0; j < n; j++) p->value.data[j] += 0.1f * tfm_rng_normal(&rng);
        fprintf(f, "param %s %d", p->name, p->value.ndim);
        for (k = 0; k < p->value.ndim; k++) fprintf(f, " %lld", (long long)p->value.shape[k]);
        fprintf(f, "\n");
        fwrite(p->value.data, sizeof(float), (size_t)n, f);
        fprintf(f, "\n");
    }
    dump_ids(f, "tokens", d.src, (int64_t)bc->B * bc->T);
    if (bc->kind == TFM_MODEL_ENCODER_DECODER) dump_ids(f, "tgt_in", d.tgt_in, (int64_t)bc->B * bc->Tt);
    dump_ids(f, "targets", d.targets, (int64_t)data_n_targets(bc));
    tfm_model_train(m, 1);
    tfm_model_zero_grad(m);
    if ((r = tfm_model_forward(m, &d.batch, &loss0, NULL)) != TFM_OK) die_tfm("tfm_model_forward", r);
    lg = tfm_model_logits(m);
    dump_floats(f, "floats", "logits", lg.data, tfm_numel(&lg));
    if ((r = tfm_model_backward(m, 1.0f)) != TFM_OK) die_tfm("tfm_model_backward", r);
    if ((r = tfm_model_step(m, &d.opt, &gnorm)) != TFM_OK) die_tfm("tfm_model_step", r);
    if ((r = tfm_model_forward(m, &d.batch, &loss1, NULL)) != TFM_OK) die_tfm("tfm_model_forward", r);
    fprintf(f, "scalars loss0=%.9g grad_norm=%.9g loss1=%.9g\n", (double)loss0, (double)gnorm, (double)loss1);
    fclose(f);
    printf("DUMP name=%s file=%s params=%lld loss0=%.6f grad_norm=%.6f loss1=%.6f\n", bc->name, path,
           (long long)m->n_weights, (double)loss0, (double)gnorm, (double)loss1);
    tfm_model_free(m);
    free(m);
    data_free(&d);
    return 0;
}

/* ---- sgemm ------------------------------------------------------------------------------------ */

/* Three sgemm engines side by side in one process: the header's built-in sgemm (compiled into every
   build), OpenBLAS and BLIS. The two libraries are opened at run time (dlopen, each binding its own
   symbols first), so one binary compares all three whatever BLAS the rest of the bench was built with.
   BENCH_OPENBLAS and BENCH_BLIS in the environment name other library files ("" leaves one out). */

#ifndef BENCH_OPENBLAS_SO
#define BENCH_OPENBLAS_SO "libopenblas.so.0"
#endif
#ifndef BENCH_BLIS_SO
#define BENCH_BLIS_SO "libblis.so.4"
#endif
#ifndef BENCH_CBLAS_NAME /* the engine behind tfm_sgemm in a TFM_BLAS build */
#define BENCH_CBLAS_NAME "OpenBLAS"
#endif

/* cblas_sgemm with the CBLAS enums as int (CblasRowMajor 101, CblasNoTrans 111, CblasTrans 112) */
typedef void (*cblas_sgemm_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                              float *, int);
static cblas_sgemm_t openblas_sgemm_p, blis_sgemm_p;
static void (*openblas_threads_p)(int);
static void (*blis_threads_p)(int64_t); /* bli_thread_set_num_threads(dim_t) */
static const char *(*openblas_core_p)(void);
static const char *(*blis_arch_string_p)(int);
static int (*blis_arch_query_p)(void);

static void eng_openblas(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                         int ldb, float beta, float *C, int ldc) {
    openblas_sgemm_p(101, ta ? 112 : 111, tb ? 112 : 111, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void eng_blis(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
    blis_sgemm_p(101, ta ? 112 : 111, tb ? 112 : 111, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

typedef struct engine {
    const char *name;
    tfm__sgemm_fn fn;
} engine;

static void *open_lib(const char *env, const char *dflt) {
    const char *path = getenv(env);
    void *h;
    if (!path) path = dflt;
    if (!*path) return NULL;
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h) fprintf(stderr, "bench: %s: %s (that column stays empty)\n", path, dlerror());
    return h;
}

/* Fills e[] with the engines found; returns how many. */
static int load_engines(engine *e) {
    static void *hob, *hbl;
    static int done;
    int n = 0;
    if (!done) {
        done = 1;
        if ((hob = open_lib("BENCH_OPENBLAS", BENCH_OPENBLAS_SO)) != NULL) {
            *(void **)&openblas_sgemm_p = dlsym(hob, "cblas_sgemm");
            *(void **)&openblas_threads_p = dlsym(hob, "openblas_set_num_threads");
            *(void **)&openblas_core_p = dlsym(hob, "openblas_get_corename");
        }
        if ((hbl = open_lib("BENCH_BLIS", BENCH_BLIS_SO)) != NULL) {
            *(void **)&blis_sgemm_p = dlsym(hbl, "cblas_sgemm");
            *(void **)&blis_threads_p = dlsym(hbl, "bli_thread_set_num_threads");
            *(void **)&blis_arch_string_p = dlsym(hbl, "bli_arch_string");
            *(void **)&blis_arch_query_p = dlsym(hbl, "bli_arch_query_id");
        }
    }
    e[n].name = "built-in";
    e[n++].fn = tfm__sgemm_builtin;
    if (openblas_sgemm_p) {
        e[n].name = "OpenBLAS";
        e[n++].fn = eng_openblas;
    }
    if (blis_sgemm_p) {
        e[n].name = "BLIS";
        e[n++].fn = eng_blis;
    }
    return n;
}

static void engines_threads(int threads) {
    tfm_set_num_threads(threads);
    if (openblas_threads_p) openblas_threads_p(threads);
    if (blis_threads_p) blis_threads_p((int64_t)threads);
}

static void engines_info(void) {
    engine e[3];
    load_engines(e);
    if (openblas_core_p) printf(" openblas_dl_core=%s", openblas_core_p());
    if (blis_arch_string_p && blis_arch_query_p) printf(" blis_dl_arch=%s", blis_arch_string_p(blis_arch_query_p()));
    printf(" builtin_kernel=\"%s\"", tfm_sgemm_kernel());
}

/* The FMA peak of `threads` cores, measured now: each thread runs 12 independent chains of vector
   fused multiply-adds (enough to cover the latency of two FMA pipes); the best of 256 and 512 bits
   where both exist. Without FMA instructions it is the peak of separate multiplies and adds. */
#if defined(__AVX512F__)
static double fma_chains512(long iters) {
    volatile float seed = 1.0f;
    __m512 m = _mm512_set1_ps(seed * 0.999999f), a = _mm512_set1_ps(seed * 1e-7f), s;
    /* distinct starting values, or the compiler merges the chains into one */
    __m512 x0 = _mm512_set1_ps(seed), x1 = _mm512_set1_ps(seed + 1), x2 = _mm512_set1_ps(seed + 2);
    __m512 x3 = _mm512_set1_ps(seed + 3), x4 = _mm512_set1_ps(seed + 4), x5 = _mm512_set1_ps(seed + 5);
    __m512 x6 = _mm512_set1_ps(seed + 6), x7 = _mm512_set1_ps(seed + 7), x8 = _mm512_set1_ps(seed + 8);
    __m512 x9 = _mm512_set1_ps(seed + 9), x10 = _mm512_set1_ps(seed + 10), x11 = _mm512_set1_ps(seed + 11);
    long i;
    for (i = 0; i < iters; i++) {
        x0 = _mm512_fmadd_ps(x0, m, a); x1 = _mm512_fmadd_ps(x1, m, a); x2 = _mm512_fmadd_ps(x2, m, a);
        x3 = _mm512_fmadd_ps(x3, m, a); x4 = _mm512_fmadd_ps(x4, m, a); x5 = _mm512_fmadd_ps(x5, m, a);
        x6 = _mm512_fmadd_ps(x6, m, a); x7 = _mm512_fmadd_ps(x7, m, a); x8 = _mm512_fmadd_ps(x8, m, a);
        x9 = _mm512_fmadd_ps(x9, m, a); x10 = _mm512_fmadd_ps(x10, m, a); x11 = _mm512_fmadd_ps(x11, m, a);
    }
    s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x0, x1), _mm512_add_ps(x2, x3)),
                      _mm512_add_ps(_mm512_add_ps(x4, x5), _mm512_add_ps(x6, x7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(x8, x9), _mm512_add_ps(x10, x11)));
    seed = _mm512_reduce_add_ps(s);
    return 12.0 * 16 * 2 * (double)iters;
}
#endif
#if defined(__FMA__)
static double fma_chains256(long iters) {
    volatile float seed = 1.0f;
    __m256 m = _mm256_set1_ps(seed * 0.999999f), a = _mm256_set1_ps(seed * 1e-7f), s;
    /* distinct starting values, or the compiler merges the chains into one */
    __m256 x0 = _mm256_set1_ps(seed), x1 = _mm256_set1_ps(seed + 1), x2 = _mm256_set1_ps(seed + 2);
    __m256 x3 = _mm256_set1_ps(seed + 3), x4 = _mm256_set1_ps(seed + 4), x5 = _mm256_set1_ps(seed + 5);
    __m256 x6 = _mm256_set1_ps(seed + 6), x7 = _mm256_set1_ps(seed + 7), x8 = _mm256_set1_ps(seed + 8);
    __m256 x9 = _mm256_set1_ps(seed + 9), x10 = _mm256_set1_ps(seed + 10), x11 = _mm256_set1_ps(seed + 11);
    float out[8];
    long i;
    for (i = 0; i < iters; i++) {
        x0 = _mm256_fmadd_ps(x0, m, a); x1 = _mm256_fmadd_ps(x1, m, a); x2 = _mm256_fmadd_ps(x2, m, a);
        x3 = _mm256_fmadd_ps(x3, m, a); x4 = _mm256_fmadd_ps(x4, m, a); x5 = _mm256_fmadd_ps(x5, m, a);
        x6 = _mm256_fmadd_ps(x6, m, a); x7 = _mm256_fmadd_ps(x7, m, a); x8 = _mm256_fmadd_ps(x8, m, a);
        x9 = _mm256_fmadd_ps(x9, m, a); x10 = _mm256_fmadd_ps(x10, m, a); x11 = _mm256_fmadd_ps(x11, m, a);
    }
    s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)),
                      _mm256_add_ps(_mm256_add_ps(x4, x5), _mm256_add_ps(x6, x7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(x8, x9), _mm256_add_ps(x10, x11)));
    _mm256_storeu_ps(out, s);
    seed = out[0];
    return 12.0 * 8 * 2 * (double)iters;
}
#endif
static double mul_add_chains(long iters) { /* no FMA: a multiply and an add per element and step */
    volatile float seed = 1.0f;
    float m = seed * 0.999999f, a = seed * 1e-7f, x[64];
    long i;
    int j;
    for (j = 0; j < 64; j++) x[j] = seed + (float)j;
    for (i = 0; i < iters; i++)
        for (j = 0; j < 64; j++) x[j] = x[j] * m + a;
    seed = x[0] + x[63];
    return 64.0 * 2 * (double)iters;
}

/* GFLOP/s of `threads` threads running `chains` at once, best of 5 runs of ~50 ms. */
static double fma_peak_of(double (*chains)(long), int threads) {
    double best = 0.0;
    long iters = 1000000;
    int r;
    (void)threads; /* (without OpenMP: one thread) */
    for (r = 0; r < 5; r++) {
        double t0 = now_s(), flop = 0.0, dt;
        TFM__OMP(omp parallel num_threads(threads) reduction(+ : flop))
        flop += chains(iters);
        dt = now_s() - t0;
        if (flop / dt * 1e-9 > best) best = flop / dt * 1e-9;
        if (dt < 0.03) iters *= 2;
    }
    return best;
}

/* The peak that kernel `key` can reach: a 256-bit kernel (avx2) is held to the 256-bit peak, which is half
   the 512-bit one on a CPU with two full-width AVX-512 pipes (Intel Xeon) and the same on Zen 4. */
static double fma_peak(int threads, const char *key) {
    double p = fma_peak_of(mul_add_chains, threads), q;
#if defined(__FMA__)
    q = fma_peak_of(fma_chains256, threads);
    if (q > p) p = q;
#endif
#if defined(__AVX512F__)
    if (strcmp(key, "avx2") != 0) {
        q = fma_peak_of(fma_chains512, threads);
        if (q > p) p = q;
    }
#endif
    (void)q;
    (void)key;
    return p;
}

typedef struct gemm_shape {
    char label[64];
    int ta, tb, M, N, K, batch; /* batch > 1: batched over contiguous matrices */
} gemm_shape;

static int add_shape(gemm_shape *s, int n, const char *cfg, const char *what, int ta, int tb, int M, int N, int K,
                     int batch) {
    snprintf(s[n].label, sizeof s[n].label, "%s%s%s", cfg, *cfg ? ":" : "", what);
    s[n].ta = ta;
    s[n].tb = tb;
    s[n].M = M;
    s[n].N = N;
    s[n].K = K;
    s[n].batch = batch;
    return n + 1;
}

/* The products a linear map y = x W^T (W is (O,I), x is (R,I)) costs in a training step: forward NT,
   input gradient NN (dy W), weight gradient TN (dy^T x); and the per-head attention products. */
static int config_shapes(gemm_shape *s, int n, const bench_cfg *b) {
    int C = b->d_model, F = cfg_dff(b), R = b->B * b->T, D = b->d_model / b->n_heads;
    int BH = b->B * b->n_heads, T = b->T;
    n = add_shape(s, n, b->name, "qkv.fwd", 0, 1, R, 3 * C, C, 1);
    n = add_shape(s, n, b->name, "qkv.dx", 0, 0, R, C, 3 * C, 1);
    n = add_shape(s, n, b->name, "qkv.dw", 1, 0, 3 * C, C, R, 1);
    n = add_shape(s, n, b->name, "out_proj.fwd", 0, 1, R, C, C, 1);
    n = add_shape(s, n, b->name, "ff1.fwd", 0, 1, R, F, C, 1);
    n = add_shape(s, n, b->name, "ff1.dx", 0, 0, R, C, F, 1);
    n = add_shape(s, n, b->name, "ff1.dw", 1, 0, F, C, R, 1);
    n = add_shape(s, n, b->name, "ff2.fwd", 0, 1, R, C, F, 1);
    n = add_shape(s, n, b->name, "ff2.dx", 0, 0, R, F, C, 1);
    n = add_shape(s, n, b->name, "ff2.dw", 1, 0, C, F, R, 1);
    if (b->kind != TFM_MODEL_ENCODER_CLASSIFIER) {
        int V = b->kind == TFM_MODEL_ENCODER_DECODER ? b->Vt : b->V;
        int Rh = b->kind == TFM_MODEL_ENCODER_DECODER ? b->B * b->Tt : R;
        n = add_shape(s, n, b->name, "head.fwd", 0, 1, Rh, V, C, 1);
        n = add_shape(s, n, b->name, "head.dx", 0, 0, Rh, C, V, 1);
        n = add_shape(s, n, b->name, "head.dw", 1, 0, V, C, Rh, 1);
    }
    n = add_shape(s, n, b->name, "attn.qk^T(batched)", 0, 1, T, T, D, BH);
    n = add_shape(s, n, b->name, "attn.pv(batched)", 0, 0, T, D, T, BH);
    return n;
}

static void fill_small(float *p, size_t n, tfm_rng *rng) {
    size_t i;
    for (i = 0; i < n; i++) p[i] = tfm_rng_uniform(rng) - 0.5f;
}

/* One product (or batch) of shape g through engine fn; batches spread over threads as the header does. */
static void do_gemm(tfm__sgemm_fn fn, const gemm_shape *g, const float *A, const float *B, float *C) {
    int lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
    tfm__sgemm_batched_with(fn, g->ta, g->tb, g->M, g->N, g->K, 1.0f, A, lda, (int64_t)g->M * g->K, B, ldb,
                            (int64_t)g->K * g->N, 0.0f, C, g->N, (int64_t)g->M * g->N, g->batch);
}

/* Median GFLOP/s of each engine on shape g: `reps` rounds, each timing every engine in turn for at least
   ~20 ms of back-to-back calls, so load from elsewhere hits all engines alike. */
static void time_engines(const gemm_shape *g, const engine *e, int ne, int reps, double *out) {
    size_t na = (size_t)g->M * g->K * g->batch, nb = (size_t)g->K * g->N * g->batch, nc = (size_t)g->M * g->N * g->batch;
    float *A = (float *)xmalloc(na * sizeof(float)), *B = (float *)xmalloc(nb * sizeof(float));
    float *C = (float *)xmalloc(nc * sizeof(float));
    double flop = 2.0 * g->M * g->N * (double)g->K * g->batch, t0, t1;
    double *gf = (double *)xmalloc((size_t)(reps * ne) * sizeof(double));
    int inner[3], i, j, k;
    tfm_rng rng;
    tfm_rng_seed(&rng, 7);
    fill_small(A, na, &rng);
    fill_small(B, nb, &rng);
    memset(C, 0, nc * sizeof(float));
    for (k = 0; k < ne; k++) {
        do_gemm(e[k].fn, g, A, B, C); /* warm-up (pages, thread pools) */
        t1 = 1e30;
        for (i = 0; i < 3; i++) { /* the fastest of three single calls sets the inner count */
            t0 = now_s();
            do_gemm(e[k].fn, g, A, B, C);
            t0 = now_s() - t0;
            if (t0 < t1) t1 = t0;
        }
        inner[k] = t1 < 0.02 ? (int)(0.02 / (t1 > 1e-7 ? t1 : 1e-7)) + 1 : 1;
    }
    for (i = 0; i < reps; i++)
        for (k = 0; k < ne; k++) {
            t0 = now_s();
            for (j = 0; j < inner[k]; j++) do_gemm(e[k].fn, g, A, B, C);
            gf[k * reps + i] = flop * inner[k] / (now_s() - t0) * 1e-9;
        }
    for (k = 0; k < ne; k++) out[k] = median(gf + k * reps, reps);
    free(gf);
    free(A);
    free(B);
    free(C);
}

static const char *op_name(int ta, int tb) { return ta ? (tb ? "TT" : "TN") : (tb ? "NT" : "NN"); }

/* Which engine the build's own tfm_sgemm is (the model rows' "sgemm ceiling"). */
static int own_engine(const engine *e, int ne) {
    const char *want = strcmp(tfm_sgemm_backend(), "built-in") == 0 ? "built-in" : BENCH_CBLAS_NAME;
    int k;
    for (k = 0; k < ne; k++)
        if (strcmp(e[k].name, want) == 0) return k;
    return 0;
}

/* Every engine on square 2048 (first and again last: the better of the two medians counts, so a burst of
   load elsewhere at one moment does not set it) and on each model's products; the FMA peak of this many
   cores before and after (the better counts). Prints one SGEMM line per shape, then a table. */
static int run_sgemm(int threads, const char *only) {
    gemm_shape *s = (gemm_shape *)xmalloc(16 * (size_t)(N_CONFIGS + 2) * sizeof(gemm_shape));
    engine e[3];
    int ne = load_engines(e), n = 0, i, k, quick = quick_mode(), reps = quick ? 3 : 5, sq_reps = quick ? 3 : 7;
    int own = own_engine(e, ne);
    double *gf = (double *)xmalloc(16 * (size_t)(N_CONFIGS + 2) * 3 * sizeof(double));
    double peak, peak2, sq[3], worst = 1e30;
    const char *worst_shape = "";
    engines_threads(threads);
    peak = fma_peak(threads, tfm__gemm_kernel_get()->key);
    printf("PEAK threads=%d fma_gflops=%.2f builtin_kernel=\"%s\"\n", threads, peak, tfm_sgemm_kernel());
    fflush(stdout);
    n = add_shape(s, n, "", "square2048", 0, 0, 2048, 2048, 2048, 1);
    for (i = 0; i < N_CONFIGS; i++)
        if (!only || strcmp(only, CONFIGS[i].name) == 0) n = config_shapes(s, n, &CONFIGS[i]);
    n = add_shape(s, n, "", "square2048(again)", 0, 0, 2048, 2048, 2048, 1);
    for (i = 0; i < n; i++) {
        double *g = gf + 3 * i;
        time_engines(&s[i], e, ne, i == 0 || i == n - 1 ? sq_reps : reps, g);
        printf("SGEMM threads=%d shape=%s op=%s M=%d N=%d K=%d batch=%d", threads, s[i].label,
               op_name(s[i].ta, s[i].tb), s[i].M, s[i].N, s[i].K, s[i].batch);
        for (k = 0; k < ne; k++) printf(" %s=%.2f", e[k].name, g[k]);
        if (ne > 1) printf(" builtin/openblas=%.3f", g[0] / g[1]);
        printf("\n");
        fflush(stdout);
        if (ne > 1 && g[0] / g[1] < worst) {
            worst = g[0] / g[1];
            worst_shape = s[i].label;
        }
    }
    peak2 = fma_peak(threads, tfm__gemm_kernel_get()->key);
    if (peak2 > peak) peak = peak2;
    for (k = 0; k < ne; k++) sq[k] = TFM__MAX(gf[k], gf[3 * (n - 1) + k]);

    printf("\n== sgemm, %d thread%s: GFLOP/s (median of %d rounds, the engines interleaved); FMA peak %.1f "
           "GFLOP/s measured in this run; built-in kernel %s\n",
           threads, threads > 1 ? "s" : "", reps, peak, tfm_sgemm_kernel());
    printf("%-38s %2s %5s %5s %5s %4s", "shape", "op", "M", "N", "K", "bat");
    for (k = 0; k < ne; k++) printf(" %9s", e[k].name);
    printf(" %8s\n", ne > 1 ? "b-in/OB" : "");
    for (i = 0; i < n; i++) {
        printf("%-38s %2s %5d %5d %5d %4d", s[i].label, op_name(s[i].ta, s[i].tb), s[i].M, s[i].N, s[i].K,
               s[i].batch);
        for (k = 0; k < ne; k++) printf(" %9.1f", gf[3 * i + k]);
        if (ne > 1) printf(" %7.0f%%", 100.0 * gf[3 * i] / gf[3 * i + 1]);
        printf("\n");
    }
    printf("square 2048:");
    for (k = 0; k < ne; k++) printf(" %s %.1f (%.0f%% of peak)", e[k].name, sq[k], 100.0 * sq[k] / peak);
    printf("\n");
    if (ne > 1) printf("built-in / OpenBLAS: lowest %.0f%% (%s)\n", 100.0 * worst, worst_shape);
    printf("RESULT impl=ours sgemm threads=%d square2048_gflops=%.2f first=%.2f last=%.2f engine=%s fma_peak=%.2f",
           threads, sq[own], gf[own], gf[3 * (n - 1) + own], e[own].name, peak);
    for (k = 0; k < ne; k++) printf(" sq_%s=%.2f", k == 0 ? "builtin" : k == 1 ? "openblas" : "blis", sq[k]);
    printf("\n");
    free(gf);
    free(s);
    return 0;
}

/* The built-in micro-kernels alone, on packed slivers that stay in L1 (kc 64 and 128) or L2 (256, 512):
   C tile += A sliver x B sliver, again and again. A kernel far from the FMA peak here cannot make the
   GEMM fast. */
static double time_kernel(void (*kern)(int, const float *, int, int, const float *, int, float *, int, float, float),
                          int mr, int nr, int kc) {
    float *a = (float *)xmalloc((size_t)kc * mr * sizeof(float) + 64), *b = (float *)xmalloc((size_t)kc * nr * sizeof(float) + 64);
    float c[32 * 32];
    double best = 0.0;
    long calls = 1000, i;
    int r;
    tfm_rng rng;
    tfm_rng_seed(&rng, 3);
    fill_small(a, (size_t)kc * mr, &rng);
    fill_small(b, (size_t)kc * nr, &rng);
    memset(c, 0, sizeof c);
    for (r = 0; r < 7; r++) {
        double t0 = now_s(), dt;
        for (i = 0; i < calls; i++) kern(kc, a, 1, mr, b, nr, c, nr, 1.0f, 1.0f);
        dt = now_s() - t0;
        if (2.0 * mr * nr * kc * calls / dt * 1e-9 > best) best = 2.0 * mr * nr * kc * calls / dt * 1e-9;
        if (dt < 0.05) calls *= 2;
    }
    if (c[0] != c[0]) printf("(nan)\n");
    free(a);
    free(b);
    return best;
}

/* The AMX kernel (fn NULL) has no micro-kernel on packed fp32 slivers: TFM_SGEMM_KERNEL=amx with the sgemm
   rows times it. */
static int run_kernel(void) {
    static const int kcs[] = {64, 128, 256, 512};
    double peak[TFM__N_KERNELS];
    int i;
    for (i = 0; i < TFM__N_KERNELS; i++) {
        if (!tfm__gemm_kernels[i].fn) continue;
        peak[i] = fma_peak(1, tfm__gemm_kernels[i].key);
        printf("KERNEL name=%s fma_peak_1thread=%.2f (GFLOP/s, measured now)\n", tfm__gemm_kernels[i].key, peak[i]);
    }
    for (i = 0; i < 4; i++) {
        int kc = kcs[i];
        int k;
        for (k = 0; k < TFM__N_KERNELS; k++) {
            const tfm__gemm_kernel *gk = &tfm__gemm_kernels[k];
            double g;
            if (!gk->fn) continue;
            g = time_kernel(gk->fn, gk->mr, gk->nr, kc);
            printf("KERNEL name=%s mr=%d nr=%d kc=%d gflops=%.2f pct_peak=%.1f\n", gk->key, gk->mr, gk->nr, kc, g,
                   100.0 * g / peak[k]);
        }
        fflush(stdout);
    }
    return 0;
}

/* ---- info ------------------------------------------------------------------------------------- */

static int run_info(void) {
    printf("INFO transformer.h=%d.%d.%d built=\"%s %s\" sgemm_backend=%s", TFM_VERSION_MAJOR, TFM_VERSION_MINOR,
           TFM_VERSION_PATCH, __DATE__, __TIME__, tfm_sgemm_backend());
#if defined(TFM_BLAS) && defined(OPENBLAS_VERSION)
    {
        const char *core = openblas_get_corename(), *conf = openblas_get_config();
        printf(" openblas_core=%s openblas_threads=%d openblas_config=\"%s\"", core ? core : "?",
               openblas_get_num_threads(), conf ? conf : "?");
    }
#endif
#ifdef _OPENMP
    printf(" omp_max_threads=%d omp_procs=%d", omp_get_max_threads(), omp_get_num_procs());
#endif
    engines_info();
    printf("\n");
    return 0;
}

/* ---- gen: batched generation, serving memory and the machine's read bandwidth ---------------- */

/* One thread's sum of p[0..n) with vector loads (4 independent accumulators): what reading the
   weights once costs, with as little arithmetic as possible per byte. */
static float read_sum(const float *p, size_t n) {
    size_t i = 0;
    float s = 0.0f;
#if defined(__AVX__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    float out[8];
    int j;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
    }
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (j = 0; j < 8; j++) s += out[j];
#endif
    for (; i < n; i++) s += p[i];
    return s;
}

/* Seconds for `threads` threads to read p[0..n) once (each thread its contiguous part, with
   read_sum): the median of `passes` passes (at most 7) after one untimed pass. */
static double read_seconds(const float *p, size_t n, int threads, int passes) {
    double t[7];
    volatile float sink = 0.0f;
    int r;
    for (r = -1; r < passes; r++) {
        double t0 = now_s();
        float tot = 0.0f;
        TFM__OMP(omp parallel num_threads(threads) reduction(+ : tot))
        {
            int k = 0, nt = 1;
#ifdef _OPENMP
            k = omp_get_thread_num();
            nt = omp_get_num_threads();
#endif
            size_t lo = n / (size_t)nt * (size_t)k, hi = k == nt - 1 ? n : n / (size_t)nt * (size_t)(k + 1);
            tot += read_sum(p + lo, hi - lo);
        }
        sink = tot;
        if (r >= 0) t[r] = now_s() - t0;
    }
    (void)sink;
    return median(t, passes);
}

/* GB/s of `threads` threads streaming through a 1 GiB buffer, the median of 7 passes. */
static double read_bandwidth(int threads) {
    size_t n = ((size_t)1 << 30) / sizeof(float), i;
    float *buf = (float *)xmalloc(n * sizeof(float));
    double s;
    for (i = 0; i < n; i++) buf[i] = (float)(i & 1023) * 1e-3f;
    s = read_seconds(buf, n, threads, 7);
    free(buf);
    return (double)n * sizeof(float) / s * 1e-9;
}

/* Milliseconds to read every parameter of m once (the flat array of tfm_model_flat), the median of
   3 passes: the floor of a batch-1 decoding step, on the memory the step reads. run_gen times it
   right after each batch-1 generation: on a virtual machine the rate of memory changes by more than
   half from minute to minute and between allocations, so only neighbours in time and in memory
   compare. */
static double read_weights_ms(tfm_model *m, int threads) {
    int64_t n = 0;
    const float *w = tfm_model_flat(m, 0, &n);
    return 1e3 * read_seconds(w, (size_t)n, threads, 3);
}

/* The serving formula of the README for an inference_only decoder-only LM (pre-LN), in bytes. */
static double lm_serving_bytes(const tfm_config *c, int64_t n_weights) {
    double B = c->max_batch, T = c->max_len, C = c->d_model, F = c->d_ff ? c->d_ff : 4.0 * c->d_model;
    return 4.0 * ((double)n_weights + B * T * (12.0 * C + 2.0 * F + c->vocab_size + c->n_heads + 7.0));
}

/* Greedy generation of GEN_NEW tokens from 1-token prompts at batch 1, 8 and 32 on an inference_only
   model of config bc (max_batch 32), the model's memory against the README's formula, then the read
   bandwidth at `threads` threads. Lines:
       GEN impl=ours name=... threads=... batch=... tok_s=... ms_tok=...
       MEM name=... model_mb=... formula_mb=... params_mb=... peak_mb=...   (peak RSS before the bandwidth buffer)
       UNEVEN name=... threads=... prompts=A..B new=... ms=... even_ms=... ratio=...
       BW threads=... gb_s=...
       RATIO name=... threads=... ms_tok=... read_ms=... ratio=... weights_ms=... ratio_bw=...
   ms_tok is the median time of a whole generation over the tokens of one row (GEN_NEW): at batch B one
   step for all B rows. read_ms: reading the model's weights once (read_weights_ms), the median of its
   times right after each timed batch-1 generation; ratio = batch 1's ms_tok / read_ms. weights_ms = the parameters' bytes / gb_s, the same estimated from the
   1 GiB buffer's rate, and ratio_bw = ms_tok / weights_ms. UNEVEN: batch 8 with prompts of k*T/16 ids
   (k = 1..8, T = max_len) and T/4 new tokens each, against 8 prompts of their mean length (as many ids
   in all); ms and even_ms the medians of whole generations, ratio = ms / even_ms. */
static int run_gen(const bench_cfg *bc, int threads) {
    static const int batches[3] = {1, 8, 32};
    tfm_config cfg = make_config(bc);
    tfm_model *m = (tfm_model *)xmalloc(sizeof *m);
    int32_t *out = (int32_t *)xmalloc((size_t)32 * GEN_NEW * sizeof(int32_t)), prompts[32];
    const int32_t *pp[32];
    int n_prompts[32], n_out[32], quick = quick_mode(), reps = quick ? 1 : 3, bi, i, r;
    size_t bytes = 0;
    double bw, t[3], rt[3], ms_tok1 = 0.0, wms, rms = 0.0;
    tfm_rng rng;
    tfm_result rc;
    if (bc->kind != TFM_MODEL_DECODER_LM) {
        fprintf(stderr, "bench: gen runs the decoder-only LMs only\n");
        return 2;
    }
    tfm_set_num_threads(threads);
    cfg.max_batch = 32;
    cfg.inference_only = 1;
    if ((rc = tfm_model_memory_size(&cfg, &bytes)) != TFM_OK) die_tfm("tfm_model_memory_size", rc);
    if ((rc = tfm_model_init(m, &cfg, NULL, 0)) != TFM_OK) die_tfm("tfm_model_init", rc);
    tfm_rng_seed(&rng, 42);
    for (i = 0; i < 32; i++) {
        prompts[i] = (int32_t)(tfm_rng_u64(&rng) % (uint64_t)bc->V);
        pp[i] = &prompts[i];
        n_prompts[i] = 1;
    }
    for (bi = 0; bi < 3; bi++) {
        int B = batches[bi];
        tfm_gen_opts go;
        double ms_tok;
        memset(&go, 0, sizeof go);
        go.max_new = GEN_NEW;
        for (r = -1; r < reps; r++) { /* one untimed run first */
            double t0 = now_s();
            if ((rc = tfm_model_generate_batch(m, B, NULL, NULL, pp, n_prompts, &go, out, GEN_NEW, n_out)) != TFM_OK)
                die_tfm("tfm_model_generate_batch", rc);
            if (r >= 0) t[r] = now_s() - t0;
            if (r >= 0 && B == 1) rt[r] = read_weights_ms(m, threads);
            for (i = 0; i < B; i++)
                if (n_out[i] != GEN_NEW) {
                    fprintf(stderr, "bench: row %d gave %d tokens, not %d\n", i, n_out[i], GEN_NEW);
                    return 1;
                }
        }
        ms_tok = 1e3 * median(t, reps) / GEN_NEW;
        if (B == 1) {
            ms_tok1 = ms_tok;
            rms = median(rt, reps);
        }
        printf("GEN impl=ours name=%s threads=%d batch=%d tok_s=%.1f ms_tok=%.3f\n", bc->name, threads, B,
               B * 1e3 / ms_tok, ms_tok);
        fflush(stdout);
    }
    if (cfg.max_len >= 16) { /* uneven prompts against even ones of the same total */
        int unit = cfg.max_len / 16, n_ids[2][8], e, j;
        int32_t *ids = (int32_t *)xmalloc((size_t)8 * unit * 8 * sizeof(int32_t));
        const int32_t *rows[8];
        double te[2][3];
        tfm_gen_opts go;
        memset(&go, 0, sizeof go);
        go.max_new = cfg.max_len / 4;
        for (i = 0; i < 8; i++) {
            rows[i] = ids + (size_t)i * unit * 8;
            n_ids[0][i] = unit * (i + 1);
            n_ids[1][i] = unit * 9 / 2;
            for (j = 0; j < unit * 8; j++) ids[(size_t)i * unit * 8 + j] = (int32_t)(tfm_rng_u64(&rng) % (uint64_t)bc->V);
        }
        for (r = -1; r < reps; r++)
            for (e = 0; e < 2; e++) {
                double t0 = now_s();
                if ((rc = tfm_model_generate_batch(m, 8, NULL, NULL, rows, n_ids[e], &go, out, go.max_new, n_out)) != TFM_OK)
                    die_tfm("tfm_model_generate_batch", rc);
                if (r >= 0) te[e][r] = now_s() - t0;
            }
        printf("UNEVEN name=%s threads=%d prompts=%d..%d new=%d ms=%.1f even_ms=%.1f ratio=%.3f\n", bc->name, threads,
               unit, 8 * unit, go.max_new, 1e3 * median(te[0], reps), 1e3 * median(te[1], reps), median(te[0], reps) / median(te[1], reps));
        fflush(stdout);
        free(ids);
    }
    printf("MEM name=%s max_batch=%d max_len=%d model_mb=%.1f formula_mb=%.1f params_mb=%.1f peak_mb=%.1f\n", bc->name,
           cfg.max_batch, cfg.max_len, bytes / 1e6, lm_serving_bytes(&cfg, m->n_weights) / 1e6,
           4.0 * (double)m->n_weights / 1e6, peak_rss_mb());
    bw = read_bandwidth(threads);
    wms = 4.0 * (double)m->n_weights / (bw * 1e9) * 1e3;
    printf("BW threads=%d gb_s=%.2f\n", threads, bw);
    printf("RATIO name=%s threads=%d ms_tok=%.3f read_ms=%.3f ratio=%.3f weights_ms=%.3f ratio_bw=%.3f\n", bc->name,
           threads, ms_tok1, rms, ms_tok1 / rms, wms, ms_tok1 / wms);
    tfm_model_free(m);
    free(m);
    free(out);
    return 0;
}

/* ---- gqa: batch-32 generation with grouped-query attention against full heads ------------------ */

/* A LLaMA-style LM (C 384, 6 layers, 8 heads of 48, RMSNorm, SwiGLU of 1024, rotary positions, no biases,
   V 8192, max_len 512), inference_only at max_batch 32, with n_kv_heads key/value heads (0: 8). */
static tfm_config gqa_config(int n_kv_heads) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = TFM_MODEL_DECODER_LM;
    c.vocab_size = 8192;
    c.d_model = 384;
    c.n_heads = 8;
    c.n_kv_heads = n_kv_heads;
    c.n_layers = 6;
    c.d_ff = 1024;
    c.max_len = 512;
    c.max_batch = 32;
    c.norm_first = 1;
    c.norm = TFM_NORM_RMS;
    c.act = TFM_ACT_SWIGLU;
    c.pos = TFM_POS_ROPE;
    c.no_bias = 1;
    c.inference_only = 1;
    c.seed = 1234;
    return c;
}

/* Greedy generation of 511 tokens from 1-token prompts, 32 rows in one batch (the cache fills to 512
   positions, 256 on average), once for the model with 2 key/value heads and once for the same model with
   8, in the same process, alternating, each after one untimed run of 64 tokens. Lines:
       GQA impl=ours threads=... n_kv_heads=... batch=32 new=511 ms=... tok_s=... cache_mb=... params_mb=...
       GQA_RATIO threads=... tok_s_gqa=... tok_s_full=... ratio=...
   tok_s counts every row's tokens (32 x 511 / seconds); cache_mb is the KV cache the generation holds
   (n_layers x 32 rows x 512 positions x 2 kv_dim floats). */
static int run_gqa(int threads) {
    enum { B = 32, NEW = 511 };
    static const int kv[2] = {2, 0};
    tfm_model *m = (tfm_model *)xmalloc(2 * sizeof *m);
    int32_t *out = (int32_t *)xmalloc((size_t)B * NEW * sizeof(int32_t)), prompts[B];
    const int32_t *pp[B];
    int n_prompts[B], n_out[B], i, k;
    double tok_s[2];
    tfm_rng rng;
    tfm_result rc;
    tfm_set_num_threads(threads);
    for (k = 0; k < 2; k++) {
        tfm_config c = gqa_config(kv[k]);
        if ((rc = tfm_model_init(&m[k], &c, NULL, 0)) != TFM_OK) die_tfm("tfm_model_init", rc);
    }
    tfm_rng_seed(&rng, 42);
    for (i = 0; i < B; i++) {
        prompts[i] = (int32_t)(tfm_rng_u64(&rng) % 8192u);
        pp[i] = &prompts[i];
        n_prompts[i] = 1;
    }
    for (k = 0; k < 2; k++) { /* untimed */
        tfm_gen_opts go;
        memset(&go, 0, sizeof go);
        go.max_new = 64;
        if ((rc = tfm_model_generate_batch(&m[k], B, NULL, NULL, pp, n_prompts, &go, out, NEW, n_out)) != TFM_OK)
            die_tfm("tfm_model_generate_batch", rc);
    }
    for (k = 0; k < 2; k++) {
        tfm_gen_opts go;
        double t0, ms;
        int64_t kv_dim = (int64_t)m[k].cfg.d_model / m[k].cfg.n_heads * (m[k].cfg.n_kv_heads ? m[k].cfg.n_kv_heads : m[k].cfg.n_heads);
        memset(&go, 0, sizeof go);
        go.max_new = NEW;
        t0 = now_s();
        if ((rc = tfm_model_generate_batch(&m[k], B, NULL, NULL, pp, n_prompts, &go, out, NEW, n_out)) != TFM_OK)
            die_tfm("tfm_model_generate_batch", rc);
        ms = 1e3 * (now_s() - t0);
        for (i = 0; i < B; i++)
            if (n_out[i] != NEW) {
                fprintf(stderr, "bench: row %d gave %d tokens, not %d\n", i, n_out[i], NEW);
                return 1;
            }
        tok_s[k] = (double)B * NEW * 1e3 / ms;
        printf("GQA impl=ours threads=%d n_kv_heads=%d batch=%d new=%d ms=%.1f tok_s=%.1f cache_mb=%.1f params_mb=%.1f\n", threads,
               m[k].cfg.n_kv_heads ? m[k].cfg.n_kv_heads : m[k].cfg.n_heads, B, NEW, ms, tok_s[k],
               4.0 * m[k].cfg.n_layers * B * m[k].cfg.max_len * 2.0 * (double)kv_dim / 1e6, 4.0 * (double)m[k].n_weights / 1e6);
        fflush(stdout);
    }
    printf("GQA_RATIO threads=%d tok_s_gqa=%.1f tok_s_full=%.1f ratio=%.3f\n", threads, tok_s[0], tok_s[1], tok_s[0] / tok_s[1]);
    for (k = 0; k < 2; k++) tfm_model_free(&m[k]);
    free(m);
    free(out);
    return 0;
}

/* ---- llama: the LLaMA-style block's new pieces as a share of a training step ------------------- */

/* gpt-small's shape (C 384, 6 layers, T 256, B 8, V 8192, its random batch) trained with the LLaMA-style
   block of `gqa` (8 heads over 2 key/value heads, RMSNorm, SwiGLU of 1024, rotary positions, no biases)
   and with gpt-small's GPT block, in one process, 2 warm-up and 10 timed steps each (median). Then the
   new pieces alone at that model's shapes, forward and backward, as many as a step runs (median of 10):
   RMSNorm over B*T rows of C (2 a layer and the final one), SwiGLU over B*T rows of 2 x 1024, rotary
   positions on the queries' 8 heads and the keys' 2 heads of every layer (one pass, as the layer's). The products' FLOPs of the step
   (6 per weight per row, attention's 12*B*T^2*C) over the step time, against the sgemm rate at 2048^2
   measured in the same run. Lines:
       LLAMA step block=llama|gpt threads=... step_ms=... gflop=... gflops=... sgemm_gflops=... share_of_sgemm=...
       LLAMA piece name=rmsnorm|swiglu|rope count=... ms=... share_of_step=... */
static int run_llama(int threads) {
    const bench_cfg *bc = find_config("gpt-small");
    enum { STEPS = 10 };
    int B = bc->B, T = bc->T, C = bc->d_model, L = bc->n_layers, F = 1024, H = 8, Hkv = 2, D = C / H, i, k, r;
    tfm_model *m = (tfm_model *)xmalloc(sizeof *m);
    double t[STEPS], step_ms[2], sgemm_gflops = 0.0, gflop[2];
    size_t rows = (size_t)B * T, big = rows * 2 * F;
    float *x = (float *)xmalloc(big * sizeof(float)), *y = (float *)xmalloc(big * sizeof(float));
    float *dy = (float *)xmalloc(big * sizeof(float)), *dx = (float *)xmalloc(big * sizeof(float));
    float *g = (float *)xmalloc((size_t)C * sizeof(float)), *dg = (float *)xmalloc((size_t)C * sizeof(float));
    float *rstd = (float *)xmalloc(rows * sizeof(float));
    float loss = 0.0f;
    bench_data d;
    tfm_rng rng;
    tfm_result rc;
    tfm_set_num_threads(threads);
    tfm_rng_seed(&rng, 42);
    data_make(bc, &rng, &d);
    for (k = 0; k < 2; k++) {
        tfm_config c = k == 0 ? gqa_config(Hkv) : make_config(bc);
        if (k == 0) {
            c.max_len = T;
            c.max_batch = B;
            c.inference_only = 0;
        }
        if ((rc = tfm_model_init(m, &c, NULL, 0)) != TFM_OK) die_tfm("tfm_model_init", rc);
        for (i = 0; i < 2; i++) train_step(m, &d.batch, &d.opt, &loss);
        for (i = 0; i < STEPS; i++) t[i] = train_step(m, &d.batch, &d.opt, &loss);
        step_ms[k] = 1e3 * median(t, STEPS);
        /* the products: 6 FLOPs per weight per row (q, k|v, o, the feed-forward, the tied head) and attention's */
        gflop[k] = 1e-9 * (6.0 * rows * (L * (k == 0 ? 2.0 * C * C + 2.0 * C * Hkv * D + 3.0 * C * F
                                                     : 4.0 * C * C + 2.0 * C * cfg_dff(bc)) + (double)bc->V * C) +
                           12.0 * B * L * (double)T * T * C);
        tfm_model_free(m);
    }
    fill_small(x, big, &rng);
    fill_small(dy, big, &rng);
    for (i = 0; i < C; i++) g[i] = 1.0f + 0.01f * (float)(i % 7);
    for (r = 0; r < 3; r++) { /* the sgemm rate: 2048^2, best of 3 (x, dy and dx hold 2048^2 floats) */
        double t0 = now_s(), dt;
        tfm__sgemm(0, 0, 2048, 2048, 2048, 1.0f, x, 2048, dy, 2048, 0.0f, dx, 2048);
        dt = now_s() - t0;
        if (2.0 * 2048 * 2048 * 2048 / dt * 1e-9 > sgemm_gflops) sgemm_gflops = 2.0 * 2048 * 2048 * 2048 / dt * 1e-9;
    }
    for (k = 0; k < 2; k++)
        printf("LLAMA step block=%s threads=%d step_ms=%.1f gflop=%.2f gflops=%.1f sgemm_gflops=%.1f share_of_sgemm=%.2f\n",
               k == 0 ? "llama" : "gpt", threads, step_ms[k], gflop[k], gflop[k] / step_ms[k] * 1e3, sgemm_gflops,
               gflop[k] / step_ms[k] * 1e3 / sgemm_gflops);
    for (k = 0; k < 3; k++) {
        static const char *names[3] = {"rmsnorm", "swiglu", "rope"};
        int count = k == 0 ? 2 * L + 1 : L;
        for (r = 0; r <= STEPS; r++) {
            double t0 = now_s();
            for (i = 0; i < count; i++) {
                if (k == 0) {
                    tfm_tensor tx = tfm_tensor2(x, (int64_t)rows, C), ty = tfm_tensor2(y, (int64_t)rows, C);
                    tfm_tensor tdy = tfm_tensor2(dy, (int64_t)rows, C), tdx = tfm_tensor2(dx, (int64_t)rows, C);
                    tfm_tensor tg = tfm_tensor1(g, C), tdg = tfm_tensor1(dg, C), tr = tfm_tensor1(rstd, (int64_t)rows);
                    if ((rc = tfm_rmsnorm_forward(&ty, &tr, &tx, &tg, 1e-5f)) != TFM_OK) die_tfm("tfm_rmsnorm_forward", rc);
                    if ((rc = tfm_rmsnorm_backward(&tdx, &tdg, &tdy, &tx, &tg, &tr)) != TFM_OK)
                        die_tfm("tfm_rmsnorm_backward", rc);
                } else if (k == 1) {
                    tfm__swiglu_forward_cpu(y, x, (int64_t)rows, F);
                    tfm__swiglu_backward_cpu(dx, dy, x, (int64_t)rows, F);
                } else { /* the queries' H heads and the keys' Hkv heads in one pass, as the layer does */
                    tfm_tensor tq = tfm_tensor3(x, B, T, (int64_t)(H + Hkv) * D), ty = tfm_tensor3(y, B, T, (int64_t)(H + Hkv) * D);
                    tfm_tensor tdq = tfm_tensor3(dx, B, T, (int64_t)(H + Hkv) * D), tdy = tfm_tensor3(dy, B, T, (int64_t)(H + Hkv) * D);
                    if ((rc = tfm_rope_forward(&ty, &tq, H + Hkv, D, 10000.0f, NULL)) != TFM_OK) die_tfm("tfm_rope_forward", rc);
                    if ((rc = tfm_rope_backward(&tdq, &tdy, H + Hkv, D, 10000.0f, NULL)) != TFM_OK)
                        die_tfm("tfm_rope_backward", rc);
                }
            }
            if (r) t[r - 1] = now_s() - t0;
        }
        printf("LLAMA piece name=%s count=%d ms=%.2f share_of_step=%.3f\n", names[k], count, 1e3 * median(t, STEPS),
               1e3 * median(t, STEPS) / step_ms[0]);
    }
    data_free(&d);
    free(m), free(x), free(y), free(dy), free(dx), free(g), free(dg), free(rstd);
    return 0;
}

/* Sliding-window attention (cfg.attn_window). Training: char-gpt-4k (T 4096, B 2) with full causal
   attention and with a window of 256, the same data, 1 warm-up and 3 timed steps each (median): tokens/s
   and their ratio. Generation: char-gpt-tiny's shape with rotary positions, max_len 256, a window of 256
   and 4 sinks, generating greedily from one id to 10,000 positions past max_len (batch 1): tokens/s,
   the rolling cache's bytes (layers x (sinks + window) rows x 2C floats) against a full cache's for as
   many positions, and the peak RSS after 1,000 and after 10,256 new ids (constant memory: equal; the
   generation runs first, so nothing larger has set the peak before it). */
static int run_window(int threads) {
    const bench_cfg *bc = find_config("char-gpt-4k");
    tfm_model *m = (tfm_model *)xmalloc(sizeof *m);
    int steps = quick_mode() ? 1 : 3, w, s, n_gen = 10000 + 256, n_out = 0;
    double tok_s[2], t[3], rss1, rss2, tg;
    int32_t *out = (int32_t *)xmalloc((size_t)n_gen * sizeof(int32_t)), prompt = 7;
    tfm_rng rng;
    bench_data d;
    tfm_result rc;
    tfm_gen_opts go;
    tfm_config cfg;
    tfm_kv_cache kc;
    tfm_set_num_threads(threads);
    tfm_rng_seed(&rng, 4242);
    data_make(bc, &rng, &d);
    cfg = make_config(find_config("char-gpt-tiny"));
    cfg.max_len = 256;
    cfg.max_batch = 1;
    cfg.pos = TFM_POS_ROPE;
    cfg.attn_window = 256;
    cfg.attn_sinks = 4;
    cfg.inference_only = 1;
    if ((rc = tfm_model_init(m, &cfg, NULL, 0)) != TFM_OK) die_tfm("tfm_model_init", rc);
    if ((rc = tfm_kv_cache_init(&kc, m, 1, n_gen + 1)) != TFM_OK) die_tfm("tfm_kv_cache_init", rc);
    memset(&go, 0, sizeof go);
    go.max_new = 1000;
    if ((rc = tfm_model_generate(m, NULL, 0, &prompt, 1, &go, out, &n_out)) != TFM_OK) die_tfm("tfm_model_generate", rc);
    rss1 = peak_rss_mb();
    go.max_new = n_gen;
    tg = now_s();
    if ((rc = tfm_model_generate(m, NULL, 0, &prompt, 1, &go, out, &n_out)) != TFM_OK) die_tfm("tfm_model_generate", rc);
    tg = now_s() - tg;
    rss2 = peak_rss_mb();
    printf("WINDOW gen max_len=%d window=%d sinks=%d threads=%d new=%d past_max_len=%d tok_s=%.1f cache_rows=%d "
           "cache_bytes=%.0f full_cache_bytes=%.0f peak_mb_1000=%.1f peak_mb_%d=%.1f\n",
           cfg.max_len, cfg.attn_window, cfg.attn_sinks, threads, n_out, 1 + n_out - cfg.max_len, n_out / tg, kc.max_len,
           4.0 * kc.n_layers * kc.max_len * 2 * kc.d_model, 4.0 * kc.n_layers * (double)(1 + n_gen) * 2 * kc.d_model, rss1,
           n_gen, rss2);
    fflush(stdout);
    tfm_kv_cache_free(&kc);
    tfm_model_free(m);
    for (w = 0; w < 2; w++) {
        float loss = 0.0f;
        cfg = make_config(bc);
        cfg.attn_window = w ? 256 : 0;
        if ((rc = tfm_model_init(m, &cfg, NULL, 0)) != TFM_OK) die_tfm("tfm_model_init", rc);
        train_step(m, &d.batch, &d.opt, &loss);
        for (s = 0; s < steps; s++) t[s] = train_step(m, &d.batch, &d.opt, &loss);
        tok_s[w] = (double)bc->B * bc->T / median(t, steps);
        printf("WINDOW train name=%s T=%d B=%d window=%d threads=%d step_ms=%.1f tok_s=%.1f loss=%.4f\n", bc->name, bc->T,
               bc->B, cfg.attn_window, threads, 1e3 * median(t, steps), tok_s[w], (double)loss);
        fflush(stdout);
        tfm_model_free(m);
    }
    printf("WINDOW train ratio=%.2f (window 256 over full causal, tokens/s)\n", tok_s[1] / tok_s[0]);
    data_free(&d);
    free(m);
    free(out);
    return 0;
}

static void usage(FILE *f) {
    int i;
    fprintf(f,
            "usage: build/bench info\n"
            "       build/bench sgemm THREADS [CONFIG]  built-in, OpenBLAS and BLIS side by side\n"
            "       build/bench kernel              the built-in micro-kernels alone, against the FMA peak\n"
            "       build/bench model NAME THREADS\n"
            "       build/bench train NAME THREADS   training steps only (warm-up + timed), for profilers\n"
            "       build/bench list\n"
            "       build/bench dump NAME FILE      weights, data and results for bench/torch_ref.py verify\n"
            "       build/bench gen NAME THREADS    batched generation (1, 8, 32 rows), serving memory, read bandwidth\n"
            "       build/bench gqa THREADS         batch-32 generation, grouped-query attention against full heads\n"
            "       build/bench window THREADS      sliding-window attention: training at T 4096 against full causal,\n"
            "                                       generation of 10,000 ids past max_len (cache bytes, peak RSS)\n"
            "       build/bench llama THREADS       the LLaMA-style block's training step against GPT's, and its new\n"
            "                                       pieces (RMSNorm, SwiGLU, rotary positions) as a share of it\n"
            "QUICK=1: fewer repetitions. bench/run.sh runs everything next to PyTorch and prints the table.\n"
            "models:");
    for (i = 0; i < N_CONFIGS; i++) fprintf(f, " %s", CONFIGS[i].name);
    fprintf(f, "\n");
}

static int parse_threads(const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 1 || v > 1024) {
        fprintf(stderr, "bench: THREADS must be a positive integer (got '%s')\n", s);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv) {
    /* TFM_SGEMM_KERNEL=avx2 (etc.) chooses the built-in kernel; a name this build lacks stops here */
    const char *kern = getenv("TFM_SGEMM_KERNEL");
    if (kern && *kern && tfm_sgemm_set_kernel(kern) != TFM_OK) {
        fprintf(stderr, "bench: TFM_SGEMM_KERNEL: %s\n", tfm_last_error());
        return 2;
    }
    if (argc >= 2 && strcmp(argv[1], "info") == 0) return run_info();
    if (argc >= 2 && strcmp(argv[1], "list") == 0) {
        int i;
        for (i = 0; i < N_CONFIGS; i++) printf("%s\n", CONFIGS[i].name);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "kernel") == 0) return run_kernel();
    if (argc >= 3 && argc <= 4 && strcmp(argv[1], "sgemm") == 0) {
        if (argc == 4 && !find_config(argv[3])) {
            fprintf(stderr, "bench: unknown config '%s'\n", argv[3]);
            return 2;
        }
        return run_sgemm(parse_threads(argv[2]), argc == 4 ? argv[3] : NULL);
    }
    if (argc == 4 && strcmp(argv[1], "dump") == 0) {
        const bench_cfg *b = find_config(argv[2]);
        if (!b) {
            fprintf(stderr, "bench: unknown config '%s'\n", argv[2]);
            return 2;
        }
        return run_dump(b, argv[3]);
    }
    if (argc == 3 && strcmp(argv[1], "gqa") == 0) return run_gqa(parse_threads(argv[2]));
    if (argc == 3 && strcmp(argv[1], "window") == 0) return run_window(parse_threads(argv[2]));
    if (argc == 3 && strcmp(argv[1], "llama") == 0) return run_llama(parse_threads(argv[2]));
    if (argc == 4 && strcmp(argv[1], "gen") == 0) {
        const bench_cfg *b = find_config(argv[2]);
        if (!b) {
            fprintf(stderr, "bench: unknown config '%s'\n", argv[2]);
            return 2;
        }
        return run_gen(b, parse_threads(argv[3]));
    }
    if (argc == 4 && (strcmp(argv[1], "model") == 0 || strcmp(argv[1], "train") == 0)) {
        const bench_cfg *b = find_config(argv[2]);
        if (!b) {
            fprintf(stderr, "bench: unknown config '%s'\n", argv[2]);
            usage(stderr);
            return 2;
        }
        return run_model(b, parse_threads(argv[3]), strcmp(argv[1], "train") == 0);
    }
    usage(argc == 1 ? stdout : stderr);
    return argc == 1 ? 0 : 2;
}
