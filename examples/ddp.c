/* ddp.c - a character language model trained data-parallel: every process holds the whole model,
   takes its share of each global batch, and the gradients are averaged across processes before every
   step (transformer.h's tfm_dist_* calls). Built with mpicc and TFM_MPI it runs under mpirun; built
   without (make examples: build/ddp) it is the same program in one process.

       make build/ddp-mpi
       mpirun -np 2 build/ddp-mpi --threads 1            two processes of one thread on this machine
       mpirun -np 4 --hostfile hosts --mca btl tcp,self --mca btl_tcp_if_include eth0 build/ddp-mpi
                                                         four processes over several machines (README)

   Data: the KJV text (Debian's bible-kjv-text), bytes as tokens; the first 90% trains, the next 5%
   validates, the last 5% tests. Each step's global batch is --batch windows of --len bytes at offsets
   drawn from a generator every process seeds alike (from --seed and the step), so the global batch
   does not depend on the number of processes; process r takes rows [r0, r1) of it (tfm_dist_shard)
   and tells the model so (tfm_model_set_batch_offset), so its dropout masks are those one process
   would draw for the whole batch. The printed loss is the global batch's. Validation and test split
   their windows (consecutive, every byte predicted) across the processes and add up the sums
   (tfm_dist_sum). At each validation the processes' models are compared (tfm_dist_check_model:
   bit-identical) and process 0 saves the model (tfm_dist_save); --resume continues from it on every
   process (tfm_dist_load reads the file on process 0 only). With --time, process 0's estimate of the
   steps left is the one every process uses.

   With --zero (ZeRO-1) each process keeps the AdamW moments of its own share of the parameters only
   (cfg.moment_shards, cfg.moment_shard) and steps with tfm_dist_step: the same model, bit for bit,
   with less memory per process; the checkpoint is the same file either way, so a run may resume with
   or without --zero.

   Options: the common ones (--help), plus --len N (the window, default 64), --zero, and --smoke (a tiny
   model for 20 steps). */
#define TFM_IMPLEMENTATION
#include "common.h"

#ifdef TFM_MPI
#include <mpi.h>
#endif

typedef struct ddp_opts {
    ex_train_opts t;  /* --data, --model, --batch (global), --lr, --time, ... (common.h) */
    int len, smoke;   /* --len: the window in bytes */
    int zero;         /* --zero: the moments sharded across the processes (ZeRO-1) */
} ddp_opts;

static void ddp_args(int argc, char **argv, ddp_opts *o) {
    ddp_opts d;
    int i;
    memset(o, 0, sizeof *o);
    o->t.data = "/usr/lib/bible.data";
    o->t.model = "runs/ddp.safetensors";
    o->t.csv = "runs/ddp.csv";
    o->t.batch = 16;
    o->t.epochs = 1;
    o->t.d_model = 128;
    o->t.n_heads = 4;
    o->t.n_layers = 4;
    o->t.lr = 1e-3f;
    o->t.dropout = 0.1f;
    o->t.weight_decay = 0.01f;
    o->t.min_lr_frac = 0.1f;
    o->t.eval_every = 200;
    o->t.seed = 1;
    o->t.threads = 1;
    o->len = 64;
    d = *o;
    for (i = 1; i < argc; i++) /* the preset first, so that other options can change it */
        if (ex_is(argv[i], "--smoke")) {
            o->smoke = 1;
            o->len = 32; o->t.batch = 8; o->t.d_model = 32; o->t.n_heads = 2; o->t.n_layers = 2; o->t.eval_every = 10;
            o->t.model = "runs/ddp-smoke.safetensors";
            o->t.csv = "runs/ddp-smoke.csv";
        }
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (ex_is(a, "--smoke")) continue;
        else if (ex_train_opt(&o->t, argc, argv, &i)) continue;
        else if (ex_is(a, "--len")) o->len = ex_int(argc, argv, &i);
        else if (ex_is(a, "--zero")) o->zero = 1;
        else if (ex_is(a, "-h") || ex_is(a, "--help")) {
            printf("usage: [mpirun -np N] ddp [options]\n"
                   "  --len N           the window in bytes (default %d)\n"
                   "  --zero            each process keeps the optimizer moments of its share of the parameters only\n"
                   "  --smoke           a tiny model for 20 steps (seconds)\n"
                   "  (--batch is the global batch: the processes share its rows; --threads is per process, default 1)\n",
                   d.len);
            ex_train_usage(&d.t);
            exit(0);
        } else ex_die("unknown option %s (--help lists them)", a);
    }
    if (o->len < 2) ex_die("--len: at least 2");
    ex_train_opts_apply(&o->t);
}

/* Rows [r0, r1) of a global batch of windows starting at off[]: tokens and next-byte targets. */
static void ddp_fill(const unsigned char *text, const int64_t *off, int64_t r0, int64_t r1, int T, int32_t *tok,
                     int32_t *tgt) {
    int64_t b;
    int t;
    for (b = r0; b < r1; b++)
        for (t = 0; t < T; t++) {
            tok[(b - r0) * T + t] = text[off[b] + t];
            tgt[(b - r0) * T + t] = text[off[b] + t + 1];
        }
}

/* Mean loss over the windows of text[lo, hi) (consecutive, every byte predicted), this process's share
   of them, summed over the processes: nats per byte. */
static double ddp_eval(tfm_dist *dist, tfm_model *m, const unsigned char *text, int64_t lo, int64_t hi, int len,
                       int max_rows, int64_t *off, int32_t *tok, int32_t *tgt) {
    int64_t w0, w1, k, j, n_windows = (hi - lo - 1) / len;
    double sums[2] = {0, 0};
    tfm_batch b;
    memset(&b, 0, sizeof b);
    b.len = len;
    b.tokens = tok;
    b.targets = tgt;
    tfm_model_train(m, 0);
    ex_check(tfm_dist_shard(dist, n_windows, &w0, &w1), "tfm_dist_shard");
    for (k = w0; k < w1; k += max_rows) {
        int64_t n = 0, kn = w1 - k < max_rows ? w1 - k : max_rows;
        float loss = 0;
        for (j = 0; j < kn; j++) off[j] = lo + (k + j) * len;
        ddp_fill(text, off, 0, kn, len, tok, tgt);
        b.batch = (int)kn;
        ex_check(tfm_model_forward(m, &b, &loss, &n), "tfm_model_forward");
        sums[0] += (double)loss * (double)n;
        sums[1] += (double)n;
    }
    tfm_model_train(m, 1);
    ex_check(tfm_dist_sum(dist, sums, 2), "tfm_dist_sum");
    return sums[1] > 0 ? sums[0] / sums[1] : 0;
}

int main(int argc, char **argv) {
    ddp_opts o;
    tfm_dist dist;
    tfm_config cfg;
    tfm_model m;
    tfm_optim opt;
    tfm_batch b;
    ex_buf text;
    ex_log lg;
    int64_t n_verses = 0, cut_val, cut_test, r0, r1, *off, step, total_steps, steps_per_epoch, n_eval;
    int32_t *tok, *tgt;
    int local_max, i;
    double t0, t_reduce = 0, nats, v[1];
    uint64_t sum = 0;
    size_t bytes = 0;
    float loss = 0, gloss = 0;
#ifdef TFM_MPI
    MPI_Init(&argc, &argv);
#endif
    ddp_args(argc, argv, &o);
    ex_check(tfm_dist_init(&dist, NULL, 0), "tfm_dist_init");
    if (dist.rank != 0 && !freopen("/dev/null", "w", stdout)) ex_die("cannot open /dev/null"); /* one process prints */

    text = ex_kjv_read(o.t.data, &n_verses);
    cut_val = (int64_t)text.len * 90 / 100;
    cut_test = (int64_t)text.len * 95 / 100;
    n_eval = o.smoke ? 2000 : 50000; /* bytes of validation (and test) evaluated */
    ex_check(tfm_dist_shard(&dist, o.t.batch, &r0, &r1), "tfm_dist_shard");
    local_max = (o.t.batch + dist.size - 1) / dist.size;

    memset(&cfg, 0, sizeof cfg);
    cfg.kind = TFM_MODEL_DECODER_LM;
    cfg.vocab_size = 256;
    cfg.d_model = o.t.d_model;
    cfg.n_heads = o.t.n_heads;
    cfg.n_layers = o.t.n_layers;
    cfg.d_ff = o.t.d_ff;
    cfg.max_len = o.len;
    cfg.max_batch = local_max;
    cfg.act = TFM_ACT_GELU;
    cfg.norm_first = 1;
    cfg.tie_output = 1;
    cfg.dropout = o.t.dropout;
    cfg.seed = o.t.seed;
    if (o.zero) { /* ZeRO-1: this process's share of the moments only */
        cfg.moment_shards = dist.size;
        cfg.moment_shard = dist.rank;
    }
    ex_check(tfm_model_memory_size(&cfg, &bytes), "tfm_model_memory_size");
    ex_check(tfm_model_init(&m, &cfg, NULL, 0), "tfm_model_init");
    if (o.t.resume) ex_check(tfm_dist_load(&dist, &m, o.t.model), o.t.model);
    else ex_check(tfm_dist_broadcast_model(&dist, &m), "tfm_dist_broadcast_model");
    ex_check(tfm_model_set_batch_offset(&m, r0), "tfm_model_set_batch_offset");
    printf("ddp: %d process%s x %d thread%s, global batch %d x %d bytes (process 0: rows %lld..%lld), "
           "%.2f M parameters, %.1f MB of model memory per process%s, sgemm %s\n", dist.size, dist.size > 1 ? "es" : "",
           tfm_get_num_threads(), tfm_get_num_threads() > 1 ? "s" : "", o.t.batch, o.len, (long long)r0,
           (long long)r1 - 1, (double)m.n_weights / 1e6, (double)bytes / 1e6,
           o.zero ? " (moments sharded)" : "", ex_sgemm());

    steps_per_epoch = cut_val / ((int64_t)o.t.batch * o.len);
    total_steps = o.smoke ? m.step + 20 : steps_per_epoch * o.t.epochs;
    memset(&opt, 0, sizeof opt);
    opt.lr = o.t.lr;
    opt.weight_decay = o.t.weight_decay;
    opt.clip_norm = 1.0f;
    opt.schedule = TFM_SCHED_COSINE;
    opt.warmup_steps = (int)(total_steps / 50);
    opt.total_steps = (int)total_steps;
    opt.min_lr = o.t.lr * o.t.min_lr_frac;
    off = (int64_t *)ex_malloc(sizeof(int64_t) * (size_t)(o.t.batch > local_max ? o.t.batch : local_max));
    tok = (int32_t *)ex_malloc(sizeof(int32_t) * (size_t)local_max * (size_t)o.len);
    tgt = (int32_t *)ex_malloc(sizeof(int32_t) * (size_t)local_max * (size_t)o.len);
    memset(&b, 0, sizeof b);
    b.batch = (int)(r1 - r0);
    b.len = o.len;
    b.tokens = tok;
    b.targets = tgt;
    if (dist.rank != 0) o.t.csv = ""; /* process 0 writes the loss curve */
    ex_log_start(&lg, &o.t, "step,epoch,train_bpc,val_bpc", 1, "bytes", (double)o.t.batch * o.len, m.step, total_steps,
                 (double)steps_per_epoch);
    lg.csv_scale = 1 / log(2.0); /* bits */
    t0 = ex_now();
    for (step = m.step; step < total_steps; step++) {
        int64_t n = 0, gn = 0;
        double t;
        tfm_rng rng;
        tfm_rng_seed(&rng, o.t.seed * 1000003u + (uint64_t)step); /* the same windows on every process */
        for (i = 0; i < o.t.batch; i++) off[i] = (int64_t)(tfm_rng_u64(&rng) % (uint64_t)(cut_val - o.len - 1));
        ddp_fill(text.data, off, r0, r1, o.len, tok, tgt);
        tfm_model_zero_grad(&m);
        ex_check(tfm_model_forward(&m, &b, &loss, &n), "tfm_model_forward");
        ex_check(tfm_dist_reduce_loss(&dist, loss, n, &gloss, &gn), "tfm_dist_reduce_loss");
        ex_check(tfm_model_backward(&m, (float)((double)dist.size * (double)n / (double)gn)), "tfm_model_backward");
        t = ex_now();
        if (o.zero) { /* the all-reduce, AdamW on this process's share, the new parameters to every process */
            ex_check(tfm_dist_step(&dist, &m, &opt, NULL), "tfm_dist_step");
        } else {
            ex_check(tfm_dist_allreduce_grads(&dist, &m), "tfm_dist_allreduce_grads");
            ex_check(tfm_model_step(&m, &opt, NULL), "tfm_model_step");
        }
        t_reduce += ex_now() - t;
        total_steps = ex_log_step(&lg, step, gloss, &opt); /* progress line, loss curve, --time */
        if (lg.budget.seconds > 0 && (step + 1 - lg.budget.first_step) % 25 == 0) {
            double x[1]; /* the budget was refitted: process 0's length for all */
            x[0] = dist.rank == 0 ? (double)total_steps : 0;
            ex_check(tfm_dist_sum(&dist, x, 1), "tfm_dist_sum");
            total_steps = lg.total = (int64_t)x[0];
            opt.total_steps = (int)total_steps;
        }
        if ((step + 1) % o.t.eval_every == 0 || step + 1 == total_steps) {
            nats = ddp_eval(&dist, &m, text.data, cut_val, cut_val + n_eval, o.len, local_max, off, tok, tgt);
            v[0] = nats / log(2.0); /* bits */
            ex_log_val(&lg, step + 1, v);
            ex_check(tfm_dist_check_model(&dist, &m, &sum), "tfm_dist_check_model");
            printf("step %lld: validation %.4f bits per byte; gradient exchange and update %.1f%% of the time; every "
                   "process holds the same model (checksum %016llx)\n", (long long)(step + 1), nats / log(2.0),
                   100.0 * t_reduce / (ex_now() - t0), (unsigned long long)sum);
            ex_check(tfm_dist_save(&dist, &m, o.t.model, TFM_SAVE_TRAINING_STATE, NULL, 0), o.t.model);
        }
    }
    ex_log_end(&lg, step, &opt); /* the last progress line, in full */
    printf("training took %.1f min\n", (ex_now() - t0) / 60);
    nats = ddp_eval(&dist, &m, text.data, cut_test, cut_test + n_eval, o.len, local_max, off, tok, tgt);
    printf("test: %.4f bits per byte (the first %lld bytes of the last 5%%)\n", nats / log(2.0), (long long)n_eval);

    free(off);
    free(tok);
    free(tgt);
    ex_buf_free(&text);
    tfm_model_free(&m);
    tfm_dist_free(&dist);
#ifdef TFM_MPI
    MPI_Finalize();
#endif
    return 0;
}
