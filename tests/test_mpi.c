/* tests/test_mpi.c - data-parallel training over MPI (make test-mpi runs it under mpirun -np 2).
   For each model kind (encoder classifier, decoder LM, encoder-decoder), with dropout on:
     - every rank starts from its own seed; tfm_dist_broadcast_model makes them rank 0's model;
     - 50 steps on a global batch of G = 8 rows split over the ranks (tfm_dist_shard, batch offsets,
       loss-weighted backward, tfm_dist_allreduce_grads, tfm_model_step) against a single-process
       reference inside rank 0 taking the same 50 steps on all 8 rows at once: the global loss
       (tfm_dist_reduce_loss) within 1e-5 relative of the reference's at every step, the parameters
       within 1e-5 of the reference's at the end, and the ranks' whole state bit-identical after
       every step (tfm_dist_check_model);
     - the LM also saves a checkpoint at step 25 (tfm_dist_save): its bytes equal rank 0's own
       tfm_model_save of the same state, a fresh model on every rank resumes from it (tfm_dist_load)
       and ends bit-identical to the uninterrupted run, and a single process loads it as is.
     - ZeRO-1 alongside: a model with its moments sharded over the ranks (cfg.moment_shards), its
       backward and all-reduce in one call (tfm_dist_backward: through NCCL the buckets go out while the
       backward runs, and some must), stepped with tfm_dist_step, must stay bit-identical to the
       unsharded run (the same all-reduce, the same norm, AdamW on each share, the shares' parameters
       sent from their ranks); its step-25 checkpoint resumes sharded to the same final bits, and one
       process reads it with the moments bit-identical to the unsharded checkpoint's; its memory size,
       and its refusals (tfm_model_step, save/load, a share that is not the rank's).
     - gradients averaged once: after tfm_dist_backward a rank's own change to them survives
       tfm_dist_allreduce_grads; a tfm_model_backward on top (accumulation) or tfm_model_zero_grad
       makes the next all-reduce average again.
   Rows have different lengths (padding), so ranks count different numbers of targets: that is what
   the loss-weighted backward is for. The all-reduce runs in buckets of an odd size (4099 floats), so
   every model's gradient crosses several buckets split unevenly over the ranks.
   Why 1e-5 and not bit-equality with the reference: one process sums a weight's gradient over all 8
   rows in one order; here each rank sums its own rows and the all-reduce adds the two partial sums, a
   different float rounding (about 1e-7 relative per gradient), which AdamW's normalised updates carry
   into the parameters (measured: about 1e-6 after 50 steps). A second single-process model adds the
   gradients of the same two halves (gradient accumulation, the same sum as the ranks' in another
   order) and its distance from the one-batch run is printed beside the ranks': the two are alike.
   The models use GELU: with ReLU a unit sitting at its kink switches on such a rounding difference and
   the runs part for good (that control then differs from the one-batch run by 1e-3 after 50 steps,
   one process alone), so no parameter tolerance would say anything about the all-reduce.
   Options: --kill-at S (rank 1 kills itself at step S: the others must stop with an error, not
   hang), --stall-at S (rank 1 stops responding at step S without dying: rank 0's next collective must
   time out with TFM_E_COMM), --timeout SECONDS (tfm_dist.timeout: the collectives' non-blocking forms
   with a deadline instead of the blocking ones), --steps N. TFM_TEST_MUTATE=allreduce|offset|broadcast|weight skips that part (the run
   must then fail: make test-mpi checks it). Ends with "N passed, N failed" on rank 0. */
#define _POSIX_C_SOURCE 200809L
#ifdef TFM_CUDA_EMULATION
#include "cuda_emu.h"
#endif
#define TFM_IMPLEMENTATION
#include "../transformer.h"

#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define G 8       /* global batch */
#define T 12      /* (source) length */
#define TT 10     /* enc-dec target length */
#define V 16

/* where the data-parallel models (and the one-process references beside them) live: a TFM_CUDA build
   trains them on the GPU (make test-mpi-cuda-emu: on the CPU emulation of CUDA, the ranks' all-reduce
   through the host, or with TFM_NCCL through NCCL on device buffers) */
#if defined(TFM_NCCL)
static const tfm_device dev_ = TFM_DEVICE_CUDA;
static const char *models_on = "CUDA models, gradients and ZeRO-1 shares through NCCL";
#elif defined(TFM_CUDA)
static const tfm_device dev_ = TFM_DEVICE_CUDA;
static const char *models_on = "CUDA models, gradients through the host";
#else
static const tfm_device dev_ = TFM_DEVICE_CPU;
static const char *models_on = "CPU models";
#endif
static int rank_, size_, n_pass, n_fail, kill_at = -1, stall_at = -1, n_steps = 50;
static double timeout_s = 0;
static const char *mutate = "";
static int64_t max_early; /* the most buckets a tfm_dist_backward sent while its backward ran */

/* Any failed call ends this rank with the message (the kill test greps for it). */
#define OK(x)                                                                                          \
    do {                                                                                               \
        tfm_result r_ = (x);                                                                           \
        if (r_ != TFM_OK) {                                                                            \
            fprintf(stderr, "rank %d: %s:%d: %s: %s (%s)\n", rank_, __FILE__, __LINE__, #x,            \
                    tfm_last_error(), tfm_result_string(r_));                                          \
            fflush(stderr);                                                                            \
            exit(2);                                                                                   \
        }                                                                                              \
    } while (0)

static void check(int ok, const char *what) {
    if (rank_ != 0) return;
    if (ok) n_pass++;
    else n_fail++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    fflush(stdout);
}

typedef struct data {
    int32_t tokens[G * T], lens[G], tgt_in[G * TT], targets[G * T];
} data;

/* The global batch of step s: the same on every rank (a generator seeded by kind and step). */
static void make_data(tfm_model_kind kind, int s, data *d) {
    tfm_rng r;
    int b, t;
    tfm_rng_seed(&r, (uint64_t)kind * 1000 + (uint64_t)s);
    memset(d, 0, sizeof *d);
    for (b = 0; b < G; b++) {
        d->lens[b] = T / 2 + (int)(tfm_rng_u64(&r) % (T / 2 + 1));
        for (t = 0; t < T; t++) d->tokens[b * T + t] = (int32_t)(tfm_rng_u64(&r) % V);
        if (kind == TFM_MODEL_ENCODER_CLASSIFIER) d->targets[b] = d->tokens[b * T] % 3;
        if (kind == TFM_MODEL_DECODER_LM)
            for (t = 0; t < T; t++) d->targets[b * T + t] = (d->tokens[b * T + t] * 5 + 3) % V;
        if (kind == TFM_MODEL_ENCODER_DECODER) {
            int n = 3 + (int)(tfm_rng_u64(&r) % (TT - 3));
            for (t = 0; t < TT; t++) {
                d->targets[b * TT + t] = t < n ? d->tokens[b * T + t] : -100;
                d->tgt_in[b * TT + t] = t == 0 ? 1 : t <= n ? d->tokens[b * T + t - 1] : 0;
            }
        }
    }
}

/* Rows [b0, b0 + B) of the global batch d. */
static tfm_batch rows(tfm_model_kind kind, const data *d, int b0, int B) {
    tfm_batch b;
    memset(&b, 0, sizeof b);
    b.batch = B;
    b.len = T;
    b.tokens = d->tokens + b0 * T;
    b.lens = d->lens + b0;
    if (kind == TFM_MODEL_ENCODER_CLASSIFIER) b.targets = d->targets + b0;
    if (kind == TFM_MODEL_DECODER_LM) b.targets = d->targets + b0 * T;
    if (kind == TFM_MODEL_ENCODER_DECODER) {
        b.tgt_len = TT;
        b.tgt_in = d->tgt_in + b0 * TT;
        b.targets = d->targets + b0 * TT;
    }
    return b;
}

static tfm_config config(tfm_model_kind kind, int max_batch, uint64_t seed) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.vocab_size = V;
    c.n_classes = 3;
    c.d_model = 32;
    c.n_heads = 4;
    c.n_layers = 2;
    c.max_len = T;
    c.max_tgt_len = TT;
    c.max_batch = max_batch;
    c.dropout = 0.1f;
    c.attn_dropout = 0.1f;
    c.act = TFM_ACT_GELU;
    c.seed = seed;
    c.device = dev_;
    return c;
}

static tfm_optim optim(void) {
    tfm_optim o;
    memset(&o, 0, sizeof o);
    o.lr = 1e-3f;
    o.warmup_steps = 5;
    o.clip_norm = 1.0f;
    o.weight_decay = 0.01f;
    return o;
}

/* One data-parallel step s on this rank; *loss: the global batch's loss (before the update). A model
   with sharded moments (ZeRO-1) steps with tfm_dist_step, the others as the manual shows step by step. */
static void ddp_step(tfm_dist *dist, tfm_model *m, tfm_model_kind kind, int s, float *loss) {
    data d;
    int64_t r0, r1, n = 0, gn = 0;
    float l = 0, scale;
    tfm_batch b;
    tfm_optim o = optim();
    make_data(kind, s, &d);
    OK(tfm_dist_shard(dist, G, &r0, &r1));
    b = rows(kind, &d, (int)r0, (int)(r1 - r0));
    if (strcmp(mutate, "offset")) OK(tfm_model_set_batch_offset(m, r0));
    tfm_model_zero_grad(m);
    OK(tfm_model_forward(m, &b, &l, &n));
    OK(tfm_dist_reduce_loss(dist, l, n, loss, &gn));
    /* ranks count different numbers of targets: weight each rank's gradient by its share */
    scale = strcmp(mutate, "weight") ? (float)((double)dist->size * (double)n / (double)gn) : 1.0f;
    if (m->cfg.moment_shards > 1) { /* the backward and the all-reduce in one call (overlapped through NCCL) */
        OK(tfm_dist_backward(dist, m, scale));
        if (dist->early > max_early) max_early = dist->early;
        OK(tfm_dist_step(dist, m, &o, NULL));
        return;
    }
    OK(tfm_model_backward(m, scale));
    if (strcmp(mutate, "allreduce")) OK(tfm_dist_allreduce_grads(dist, m));
    OK(tfm_model_step(m, &o, NULL));
}

/* The largest |a - b| over the n floats of two arrays, and how many differ at all. */
static double max_diff(const float *a, const float *b, int64_t n, int64_t *n_diff) {
    double mx = 0;
    int64_t i;
    *n_diff = 0;
    for (i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        *n_diff += a[i] != b[i];
        if (!(e <= mx)) mx = e;
    }
    return mx;
}

/* Model m's parameters (grads 0) or gradients (1) on the host, in a new array the caller frees (a CUDA
   model's copied back). */
static float *flat_host(tfm_model *m, int grads) {
    int64_t n = 0;
    const float *w = tfm_model_flat(m, grads, &n);
    float *h = (float *)malloc((size_t)n * sizeof(float));
    if (!h) {
        fprintf(stderr, "rank %d: out of memory\n", rank_);
        exit(2);
    }
#if defined(TFM_CUDA)
    if (m->cfg.device == TFM_DEVICE_CUDA) {
        if (cudaMemcpy(h, w, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
            fprintf(stderr, "rank %d: cudaMemcpy failed\n", rank_);
            exit(2);
        }
        return h;
    }
#endif
    memcpy(h, w, (size_t)n * sizeof(float));
    return h;
}

static float *params_host(tfm_model *m) { return flat_host(m, 0); }

/* Writes the host array h over model m's gradients. */
static void grads_set(tfm_model *m, const float *h) {
    int64_t n = 0;
    float *g = tfm_model_flat(m, 1, &n);
#if defined(TFM_CUDA)
    if (m->cfg.device == TFM_DEVICE_CUDA) {
        if (cudaMemcpy(g, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
            fprintf(stderr, "rank %d: cudaMemcpy failed\n", rank_);
            exit(2);
        }
        return;
    }
#endif
    memcpy(g, h, (size_t)n * sizeof(float));
}

/* The single-process reference step s on all G rows: in one batch (parts 1), or in `parts` batches
   whose gradients add up, each weighted by its share of the targets and drawing the dropout seed one
   forward would draw: the same sum as one batch in another order (what the ranks compute). */
static void ref_step(tfm_model *m, tfm_model_kind kind, int s, int parts, float *loss) {
    data d;
    tfm_batch b;
    tfm_optim o = optim();
    tfm_rng rng0 = *tfm__model_rng(m);
    int64_t n = 0, total = 0;
    float l = 0;
    int p, rows_per = G / parts;
    double sum = 0;
    make_data(kind, s, &d);
    for (p = 0; p < parts; p++) { /* count the targets first: each part's weight needs the total */
        b = rows(kind, &d, p * rows_per, rows_per);
        *tfm__model_rng(m) = rng0;
        OK(tfm_model_set_batch_offset(m, p * rows_per));
        OK(tfm_model_forward(m, &b, &l, &n));
        total += n;
    }
    tfm_model_zero_grad(m);
    for (p = 0; p < parts; p++) {
        b = rows(kind, &d, p * rows_per, rows_per);
        *tfm__model_rng(m) = rng0;
        OK(tfm_model_set_batch_offset(m, p * rows_per));
        OK(tfm_model_forward(m, &b, &l, &n));
        OK(tfm_model_backward(m, (float)((double)n / (double)total)));
        sum += (double)l * (double)n;
    }
    *loss = (float)(sum / (double)total);
    OK(tfm_model_step(m, &o, NULL));
}

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int ok = fa && fb, ca, cb;
    while (ok) {
        ca = fgetc(fa);
        cb = fgetc(fb);
        if (ca != cb) ok = 0;
        if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return ok;
}

/* A fresh model of config c on every rank resumes from the checkpoint at path (*step_at: the step it
   loaded) and trains to step n_steps; returns the ranks' common checksum at the end. */
static uint64_t resume(tfm_dist *dist, tfm_model_kind kind, const tfm_config *c, const char *path, int n_steps,
                       int64_t *step_at) {
    tfm_model m2;
    uint64_t sum = 0;
    int s;
    OK(tfm_model_init(&m2, c, NULL, 0));
    OK(tfm_dist_load(dist, &m2, path));
    *step_at = m2.step;
    for (s = (int)m2.step + 1; s <= n_steps; s++) {
        float loss;
        ddp_step(dist, &m2, kind, s, &loss);
    }
    OK(tfm_dist_check_model(dist, &m2, &sum));
    tfm_model_free(&m2);
    return sum;
}

/* Whether ok holds on every rank. */
static int all_ranks(int ok) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return ok;
}

/* The LM's forward over step s's rows on this rank; returns the loss scale of its backward (its share of
   the global batch's targets, as ddp_step weighs it). */
static float local_forward(tfm_dist *dist, tfm_model *m, int s) {
    data d;
    tfm_batch b;
    int64_t r0, r1, n = 0, gn = 0;
    float l = 0, gl = 0;
    make_data(TFM_MODEL_DECODER_LM, s, &d);
    OK(tfm_dist_shard(dist, G, &r0, &r1));
    b = rows(TFM_MODEL_DECODER_LM, &d, (int)r0, (int)(r1 - r0));
    OK(tfm_model_forward(m, &b, &l, &n));
    OK(tfm_dist_reduce_loss(dist, l, n, &gl, &gn));
    return (float)((double)dist->size * (double)n / (double)gn);
}

/* Gradients are averaged once, and only once: after tfm_dist_backward a rank's own change to them
   survives tfm_dist_allreduce_grads (which must not average the mean again); a backward adding this
   rank's gradients on top, or tfm_model_zero_grad, takes that mark away, and the next all-reduce
   averages again. No dropout: step B's backward must be the same in both orders. */
static void run_averaged(tfm_dist *dist) {
    tfm_config c = config(TFM_MODEL_DECODER_LM, G, 7);
    tfm_model m;
    int64_t n = 0, i;
    float *a, *h, *r, *bm, *lo, *hi;
    int same = 1, near = 1, mean = 1;
    double scale = 0;
    c.dropout = c.attn_dropout = 0.0f;
    OK(tfm_model_init(&m, &c, NULL, 0));
    tfm_model_flat(&m, 1, &n);
    /* step A's mean, then each rank adds its own offset: the all-reduce leaves it */
    tfm_model_zero_grad(&m);
    OK(tfm_dist_backward(dist, &m, local_forward(dist, &m, 1)));
    a = flat_host(&m, 1);
    h = (float *)malloc((size_t)n * sizeof(float));
    if (!h) exit(2);
    for (i = 0; i < n; i++) h[i] = a[i] + (float)(rank_ + 1);
    grads_set(&m, h);
    OK(tfm_dist_allreduce_grads(dist, &m));
    r = flat_host(&m, 1);
    for (i = 0; i < n; i++) same &= r[i] == h[i];
    check(all_ranks(same), "after tfm_dist_backward, tfm_dist_allreduce_grads leaves the averaged gradients as they are "
          "(each rank's own change to them kept)");
    free(r);
    /* step B's gradients added on top of A's mean: the backward takes the mark away */
    grads_set(&m, a);
    OK(tfm_model_backward(&m, local_forward(dist, &m, 2)));
    OK(tfm_dist_allreduce_grads(dist, &m));
    r = flat_host(&m, 1);
    tfm_model_zero_grad(&m);
    OK(tfm_model_backward(&m, local_forward(dist, &m, 2)));
    OK(tfm_dist_allreduce_grads(dist, &m));
    bm = flat_host(&m, 1); /* step B's mean alone */
    lo = (float *)malloc((size_t)n * sizeof(float));
    hi = (float *)malloc((size_t)n * sizeof(float));
    if (!lo || !hi) exit(2);
    memcpy(lo, r, (size_t)n * sizeof(float));
    memcpy(hi, r, (size_t)n * sizeof(float));
    MPI_Allreduce(MPI_IN_PLACE, lo, (int)n, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, hi, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    for (i = 0; i < n; i++) {
        double s = fabs((double)a[i]) + fabs((double)bm[i]);
        if (s > scale) scale = s;
    }
    /* the mean of (A's mean + B's share) is A's mean + B's mean, up to a few roundings of numbers of
       the gradients' size */
    for (same = 1, i = 0; i < n; i++) {
        same &= lo[i] == hi[i];
        near &= fabs((double)r[i] - ((double)a[i] + (double)bm[i])) <= 1e-6 * scale;
    }
    check(all_ranks(same && near), "a tfm_model_backward after tfm_dist_backward adds this rank's gradients: the next "
          "tfm_dist_allreduce_grads averages them again (the ranks agree to the bit, on A's mean + B's mean)");
    /* tfm_model_zero_grad takes the mark away too */
    OK(tfm_dist_backward(dist, &m, 1.0f));
    tfm_model_zero_grad(&m);
    for (i = 0; i < n; i++) h[i] = (float)(rank_ + 1);
    grads_set(&m, h);
    OK(tfm_dist_allreduce_grads(dist, &m));
    free(r);
    r = flat_host(&m, 1);
    for (i = 0; i < n; i++) mean &= fabs((double)r[i] - (size_ + 1) / 2.0) <= 1e-6;
    check(all_ranks(mean), "tfm_model_zero_grad after tfm_dist_backward: the next tfm_dist_allreduce_grads averages again");
    free(a), free(h), free(r), free(bm), free(lo), free(hi);
    tfm_model_free(&m);
}

static void run_kind(tfm_dist *dist, tfm_model_kind kind, const char *name) {
    char what[256];
    const char *ckpt = "build/mpi/test_mpi_ckpt.safetensors", *ckpt1 = "build/mpi/test_mpi_ckpt_single.safetensors";
    const char *ckptz = "build/mpi/test_mpi_ckpt_zero.safetensors";
    tfm_config cm = config(kind, G, 7 + (uint64_t)rank_), cr = config(kind, G, 7), cz = cm;
    tfm_model m, ref, acc, z;
    uint64_t sum_z = 0;
    int64_t nz_diff = 0;
    double max_z = 0;
    int identical_z = 1;
    uint64_t sum = 0, sum_end = 0;
    double max_rel = 0, max_dp = 0, max_acc = 0;
    int s, identical = 1, ckpt_step = n_steps / 2;
    tfm_result rc;
    OK(tfm_model_init(&m, &cm, NULL, 0));
    if (rank_ == 0) {
        int64_t n = 0;
        tfm_model_flat(&m, 0, &n);
        printf("     %s: %lld parameters, all-reduced in buckets of %lld (the last %lld)\n", name, (long long)n,
               (long long)dist->bucket, (long long)(n % dist->bucket));
    }
    if (rank_ == 0) OK(tfm_model_init(&ref, &cr, NULL, 0));
    if (rank_ == 0) OK(tfm_model_init(&acc, &cr, NULL, 0));
    if (strcmp(mutate, "broadcast")) OK(tfm_dist_broadcast_model(dist, &m));
    /* ZeRO-1: the same run with each rank keeping its share of the moments only */
    cz.moment_shards = size_;
    cz.moment_shard = rank_;
    OK(tfm_model_init(&z, &cz, NULL, 0));
    OK(tfm_dist_broadcast_model(dist, &z));
    for (s = 1; s <= n_steps; s++) {
        float loss = 0, lref = 0, loss_z = 0;
        if (s == kill_at && rank_ == 1) kill(getpid(), SIGKILL);
        if (s == stall_at && rank_ == 1)
            for (;;) pause();
        ddp_step(dist, &m, kind, s, &loss);
        rc = tfm_dist_check_model(dist, &m, &sum);
        if (rc == TFM_E_COMM && strstr(tfm_last_error(), "differs")) {
            if (identical && rank_ == 0) printf("     step %d: %s\n", s, tfm_last_error());
            identical = 0;
        } else OK(rc);
        ddp_step(dist, &z, kind, s, &loss_z);
        rc = tfm_dist_check_model(dist, &z, &sum_z);
        if (rc == TFM_E_COMM && strstr(tfm_last_error(), "differs")) identical_z = 0;
        else OK(rc);
        if (s < 3 || s == n_steps) { /* its parameters against the unsharded run's, on this rank */
            int64_t n = 0, nd = 0;
            float *a = params_host(&z), *b = params_host(&m);
            double e;
            tfm_model_flat(&z, 0, &n);
            e = max_diff(a, b, n, &nd);
            if (!(e <= max_z)) max_z = e;
            nz_diff += nd;
            free(a);
            free(b);
        }
        if (rank_ == 0) {
            double rel;
            float lacc;
            ref_step(&ref, kind, s, 1, &lref);
            ref_step(&acc, kind, s, 2, &lacc);
            rel = fabs((double)loss - (double)lref) / fabs((double)lref);
            if (!(rel <= max_rel)) max_rel = rel;
        }
        if (kind == TFM_MODEL_DECODER_LM && s == ckpt_step) {
            OK(tfm_dist_save(dist, &m, ckpt, TFM_SAVE_TRAINING_STATE, NULL, 0));
            OK(tfm_dist_save(dist, &z, ckptz, TFM_SAVE_TRAINING_STATE, NULL, 0));
            if (rank_ == 0) OK(tfm_model_save(&m, ckpt1, TFM_SAVE_TRAINING_STATE, NULL, 0));
        }
    }
    sum_end = sum;
    if (rank_ == 0) {
        int64_t n = 0, i;
        float *a = params_host(&m), *b = params_host(&ref), *c = params_host(&acc);
        tfm_model_flat(&m, 0, &n);
        for (i = 0; i < n; i++) {
            if (!(fabs((double)a[i] - (double)b[i]) <= max_dp)) max_dp = fabs((double)a[i] - (double)b[i]);
            if (!(fabs((double)c[i] - (double)b[i]) <= max_acc)) max_acc = fabs((double)c[i] - (double)b[i]);
        }
        free(a);
        free(b);
        free(c);
    }
    snprintf(what, sizeof what, "%s: %d steps, global batch %d over %d ranks: loss within 1e-5 of one process's at every "
             "step (max rel diff %.2g)", name, n_steps, G, dist->size, max_rel);
    check(max_rel <= 1e-5, what);
    snprintf(what, sizeof what, "%s: parameters within 1e-5 of one process's after %d steps (max abs diff %.2g; one "
             "process adding the gradients of the same two halves: %.2g)", name, n_steps, max_dp, max_acc);
    check(max_dp <= 1e-5, what);
    snprintf(what, sizeof what, "%s: every rank's state bit-identical after every step (checksum %016llx)", name,
             (unsigned long long)sum_end);
    check(identical, what);
    {
        double all[2];
        all[0] = max_z;
        all[1] = (double)nz_diff;
        OK(tfm_dist_sum(dist, all, 2));
        snprintf(what, sizeof what, "%s, ZeRO-1 (moments sharded over %d ranks, tfm_dist_step): parameters bit-identical "
                 "to the unsharded run's at steps 1, 2 and %d on every rank (%.0f differ, max abs diff %.2g)", name, size_,
                 n_steps, all[1], all[0]);
        check(all[1] == 0, what);
        snprintf(what, sizeof what, "%s, ZeRO-1: every rank's parameters, step and generator bit-identical after every "
                 "step", name);
        check(identical_z, what);
    }

    if (kind == TFM_MODEL_DECODER_LM) {
        /* resume from the step-25 checkpoint on every rank, from a model of another seed */
        tfm_config c2 = config(kind, G, 99 + (uint64_t)rank_);
        int64_t step_at = 0;
        sum = resume(dist, kind, &c2, ckpt, n_steps, &step_at);
        check(step_at == ckpt_step, "checkpoint: every rank resumes at the saved step");
        snprintf(what, sizeof what, "checkpoint: resumed at step %d on every rank, ends bit-identical to the "
                 "uninterrupted run (%016llx vs %016llx)", ckpt_step, (unsigned long long)sum, (unsigned long long)sum_end);
        check(sum == sum_end, what);
        if (rank_ == 0) {
            tfm_config c1 = config(kind, G, 5);
            tfm_model one;
            int64_t n = 0;
            c1.device = TFM_DEVICE_CPU; /* read on the host */
            check(same_file(ckpt, ckpt1), "checkpoint: rank 0's file has the bytes of a single-process save of the same state");
            /* a single process reads it as any checkpoint, into a model of the reference's batch */
            OK(tfm_model_init(&one, &c1, NULL, 0));
            OK(tfm_model_load(&one, ckpt));
            {
                tfm_model m25;
                tfm_config c3 = config(kind, G, 7);
                const float *a, *b;
                int64_t i, diff = 0;
                c3.device = TFM_DEVICE_CPU; /* read on the host */
                OK(tfm_model_init(&m25, &c3, NULL, 0));
                OK(tfm_model_load(&m25, ckpt1));
                a = tfm_model_flat(&one, 0, &n);
                b = tfm_model_flat(&m25, 0, NULL);
                for (i = 0; i < n; i++) diff += a[i] != b[i];
                check(one.step == ckpt_step && diff == 0, "checkpoint: a single process loads it as saved");
                tfm_model_free(&m25);
            }
            tfm_model_free(&one);
        }

        /* ZeRO-1: the sharded checkpoint resumes sharded, and a single process reads it as any */
        sum = resume(dist, kind, &cz, ckptz, n_steps, &step_at);
        snprintf(what, sizeof what, "ZeRO-1 checkpoint: resumed sharded at step %d, ends bit-identical to the "
                 "uninterrupted sharded run (%016llx vs %016llx)", ckpt_step, (unsigned long long)sum, (unsigned long long)sum_z);
        check(step_at == ckpt_step && sum == sum_z, what);
        if (rank_ == 0) {
            tfm_config c1 = config(kind, G, 5);
            tfm_model a1, b1;
            const tfm_param *p;
            int64_t n = 0, nd = 0, k;
            double e = 0;
            c1.device = TFM_DEVICE_CPU; /* read on the host */
            OK(tfm_model_init(&a1, &c1, NULL, 0));
            OK(tfm_model_init(&b1, &c1, NULL, 0));
            OK(tfm_model_load(&a1, ckptz));
            OK(tfm_model_load(&b1, ckpt));
            e = max_diff(tfm_model_flat(&a1, 0, &n), tfm_model_flat(&b1, 0, NULL), n, &nd);
            for (k = 0; k < a1.n_params; k++) { /* the moments, gathered whole, against the unsharded run's */
                int64_t d1 = 0, d2 = 0, cnt = tfm_numel(&a1.params[k].value);
                double e1, e2;
                p = &a1.params[k];
                e1 = max_diff(tfm__model_moment(&a1, p, 1), tfm__model_moment(&b1, &b1.params[k], 1), cnt, &d1);
                e2 = max_diff(tfm__model_moment(&a1, p, 2), tfm__model_moment(&b1, &b1.params[k], 2), cnt, &d2);
                if (e1 > e) e = e1;
                if (e2 > e) e = e2;
                nd += d1 + d2;
            }
            snprintf(what, sizeof what, "ZeRO-1 checkpoint: a single process loads it; step, parameters and whole "
                     "moments bit-identical to the unsharded run's checkpoint (%lld floats differ, max abs diff %.2g)",
                     (long long)nd, e);
            check(a1.step == ckpt_step && nd == 0, what);
            tfm_model_free(&a1);
            tfm_model_free(&b1);
        }
    }
    if (rank_ == 0) tfm_model_free(&ref);
    if (rank_ == 0) tfm_model_free(&acc);
    tfm_model_free(&z);
    tfm_model_free(&m);
}

/* ZeRO-1's memory and its refusals. */
static void run_zero_basics(tfm_dist *dist) {
    tfm_config c = config(TFM_MODEL_DECODER_LM, G, 7), cs;
    tfm_model z;
    tfm_optim o = optim();
    size_t whole = 0, shard = 0;
    int64_t n = 0;
    char what[256];
    c.device = TFM_DEVICE_CPU; /* the refusals on the host: the test writes gradients into its flat array */
    cs = c;
    cs.moment_shards = size_;
    cs.moment_shard = rank_;
    OK(tfm_model_memory_size(&c, &whole));
    OK(tfm_model_memory_size(&cs, &shard));
    OK(tfm_model_init(&z, &cs, NULL, 0));
    tfm_model_flat(&z, 0, &n);
    /* two moment arrays of n floats each, against two of this rank's share (at most n / size + 1 floats,
       each array rounded up to 64 bytes); the sharded model adds a list of its share's parts (a
       tfm_adamw_param per parameter at most) */
    snprintf(what, sizeof what, "ZeRO-1: tfm_model_memory_size is %zu bytes sharded against %zu whole: the moments of "
             "%lld floats at 1/%d", shard, whole, (long long)n, size_);
    check(whole - shard + (size_t)z.n_params * sizeof(tfm_adamw_param) + 64 >= (size_t)(2 * (n - (n / size_ + 1)) * 4) - 128 &&
              whole - shard <= (size_t)(2 * n * 4), what);
    check(tfm_model_step(&z, &o, NULL) == TFM_E_ARG && strstr(tfm_last_error(), "tfm_dist_step") != NULL,
          "ZeRO-1: tfm_model_step refuses a sharded model, pointing to tfm_dist_step");
    check(tfm_model_save(&z, "build/mpi/never.safetensors", TFM_SAVE_TRAINING_STATE, NULL, 0) == TFM_E_ARG &&
              tfm_model_load(&z, "build/mpi/never.safetensors") == TFM_E_ARG && strstr(tfm_last_error(), "tfm_dist_load"),
          "ZeRO-1: tfm_model_save (with the training state) and tfm_model_load refuse a sharded model");
    /* the parameters alone need no gathering: a sharded model saves them as any model does */
    OK(tfm_dist_save(dist, &z, "build/mpi/zero_params.safetensors", 0, NULL, 0));
    if (rank_ == 0) {
        tfm_model one;
        int64_t nd = 0;
        OK(tfm_model_init(&one, &c, NULL, 0));
        OK(tfm_model_load(&one, "build/mpi/zero_params.safetensors"));
        max_diff(tfm_model_flat(&one, 0, NULL), tfm_model_flat(&z, 0, NULL), n, &nd);
        check(nd == 0, "ZeRO-1: tfm_dist_save without the training state writes a sharded model's parameters as they are");
        tfm_model_free(&one);
    }
    { /* a refused opt leaves the gradients as they were: refused before the all-reduce, which would
         average the ranks' different values */
        tfm_optim bad = o;
        float *g = tfm_model_flat(&z, 1, NULL);
        int64_t i, kept = 0;
        bad.lr = 0.0f;
        for (i = 0; i < n; i++) g[i] = (float)(rank_ + 1);
        check(tfm_dist_step(dist, &z, &bad, NULL) == TFM_E_ARG && strstr(tfm_last_error(), "tfm_dist_step") != NULL,
              "ZeRO-1: tfm_dist_step refuses opt.lr 0");
        for (i = 0; i < n; i++) kept += g[i] == (float)(rank_ + 1);
        check(kept == n && z.step == 0, "ZeRO-1: the refused tfm_dist_step left this rank's gradients and step as they were");
    }
    tfm_model_free(&z);
    cs.moment_shard = (rank_ + 1) % size_;
    OK(tfm_model_init(&z, &cs, NULL, 0));
    check(tfm_dist_step(dist, &z, &o, NULL) == TFM_E_ARG && strstr(tfm_last_error(), "rank") != NULL,
          "ZeRO-1: tfm_dist_step refuses a model whose share is not this rank's");
    tfm_model_free(&z);
    cs.moment_shard = size_;
    check(tfm_model_init(&z, &cs, NULL, 0) == TFM_E_ARG && strstr(tfm_last_error(), "moment_shard") != NULL,
          "ZeRO-1: tfm_model_init refuses a share outside [0, moment_shards)");
    cs.moment_shard = 0;
    cs.inference_only = 1;
    check(tfm_model_init(&z, &cs, NULL, 0) == TFM_E_ARG, "ZeRO-1: an inference_only model has no moments to shard");
}

/* The collectives on plain arrays: sums of known integers (exact in float), odd buckets, shards. */
static void run_basics(void) {
    tfm_dist d;
    float x[23];
    double y[2];
    int64_t b0, b1, i, n = 23, total = 0;
    int ok = 1, r;
    OK(tfm_dist_init(&d, NULL, 5));
    for (i = 0; i < n; i++) x[i] = (float)(i * 10 + rank_ + 1);
    OK(tfm_dist_allreduce(&d, x, n, 0));
    for (i = 0; i < n; i++) ok &= x[i] == (float)(i * 10 * size_ + size_ * (size_ + 1) / 2);
    check(ok, "tfm_dist_allreduce: 23 floats in buckets of 5 sum over the ranks");
    y[0] = rank_ + 0.5;
    y[1] = 1;
    OK(tfm_dist_sum(&d, y, 2));
    check(y[0] == size_ * (size_ - 1) / 2.0 + size_ * 0.5 && y[1] == size_, "tfm_dist_sum adds doubles over the ranks");
    for (r = 0; r < size_; r++) {
        tfm_dist e = d;
        e.rank = r;
        OK(tfm_dist_shard(&e, 7, &b0, &b1));
        ok &= b0 == total && b1 >= b0;
        total = b1;
    }
    check(ok && total == 7, "tfm_dist_shard: the ranks' shares of 7 items are contiguous and cover them");
    check(tfm_dist_allreduce(&d, NULL, 3, 0) == TFM_E_ARG && strstr(tfm_last_error(), "tfm_dist_allreduce") != NULL,
          "tfm_dist_allreduce refuses a NULL buffer, naming itself");
    check(tfm_dist_init(&d, NULL, -1) == TFM_E_ARG, "tfm_dist_init refuses a negative bucket");
    tfm_dist_free(&d);
    check(tfm_dist_allreduce(&d, x, 1, 0) == TFM_E_ARG && strstr(tfm_last_error(), "not initialised") != NULL,
          "a freed group is refused");
}

int main(int argc, char **argv) {
    tfm_dist dist;
    int i;
    MPI_Init(&argc, &argv);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kill-at") && i + 1 < argc) kill_at = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) n_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stall-at") && i + 1 < argc) stall_at = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) timeout_s = atof(argv[++i]);
    }
    if (getenv("TFM_TEST_MUTATE")) mutate = getenv("TFM_TEST_MUTATE");
#if defined(TFM_CUDA_EMULATION)
    /* the emulation runs a non-blocking stream's work as late as a GPU may (a read that does not wait
       for it sees it undone); TFM_TEST_EAGER_STREAMS=1: as early (a collective that does not wait for
       the kernels writing its buffer sees them undone) */
    if (getenv("TFM_TEST_EAGER_STREAMS")) tfm_emu_set_streams_eager(atoi(getenv("TFM_TEST_EAGER_STREAMS")));
#endif
    tfm_set_num_threads(1);
#if defined(TFM_CUDA)
    { /* a GPU per rank, where there are several (NCCL refuses two ranks on one) */
        int n_dev = 0, r = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        if (cudaGetDeviceCount(&n_dev) == cudaSuccess && n_dev > 1) (void)cudaSetDevice(r % n_dev);
    }
#endif
    OK(tfm_dist_init(&dist, NULL, 4099));
    dist.timeout = timeout_s;
    rank_ = dist.rank;
    size_ = dist.size;
    if (rank_ == 0) {
        printf("test_mpi: %d ranks, sgemm %s, collectives %s, %s%s%s\n", size_, tfm_sgemm_backend(),
               timeout_s > 0 ? "non-blocking with a deadline" : "blocking", models_on, *mutate ? ", mutation: skip " : "",
               mutate);
        fflush(stdout);
    }
    run_basics();
    if (size_ > 1) run_zero_basics(&dist);
    run_averaged(&dist);
    run_kind(&dist, TFM_MODEL_ENCODER_CLASSIFIER, "encoder classifier");
    run_kind(&dist, TFM_MODEL_DECODER_LM, "decoder LM");
    run_kind(&dist, TFM_MODEL_ENCODER_DECODER, "encoder-decoder");
#if defined(TFM_NCCL)
    if (size_ > 1) {
        char what[160];
        snprintf(what, sizeof what, "tfm_dist_backward through NCCL: buckets sent while the backward ran (up to %lld a "
                 "call)", (long long)max_early);
        check(max_early > 0, what);
    }
#else
    check(max_early == 0, "tfm_dist_backward without NCCL: the backward, then the all-reduce");
#endif
    tfm_dist_free(&dist);
    if (rank_ == 0) printf("%d passed, %d failed\n", n_pass, n_fail);
    MPI_Finalize();
    return n_fail ? 1 : 0;
}
