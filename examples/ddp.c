/* ddp.c - a character language model trained data-parallel: every process holds the whole model,
   takes its share of each global batch, and the gradients are averaged across processes before every
   step (transformer.h's tfm_dist_* calls). Built with mpicc and TFM_MPI it runs under mpirun; built
   without (make examples: build/ddp) it is the same program in one process.

       make build/ddp-mpi
       mpirun -np 2 build/ddp-mpi --threads 1            two processes of one thread on this machine
       mpirun -np 4 --hostfile hosts --mca btl tcp,self --mca btl_tcp_if_include eth0 build/ddp-mpi
                                                         four processes over several machines (README)

   Data: the KJV text (Debian's bible-kjv-text), bytes as tokens; the first 90% trains, the last 10%
   validates. Each step's global batch is --batch windows of --len bytes at offsets drawn from a
   generator every process seeds alike, so the global batch does not depend on the number of
   processes; process r takes rows [r0, r1) of it (tfm_dist_shard) and tells the model so
   (tfm_model_set_batch_offset), so its dropout masks are those one process would draw for the whole
   batch. The printed loss is the global batch's. At the end the validation windows are shared out the
   same way, the loss sums added across processes (tfm_dist_sum), the processes' models compared
   (tfm_dist_check_model: bit-identical) and the model saved by process 0 (tfm_dist_save); --resume
   continues from it on every process (tfm_dist_load reads the file on process 0 only).

   Options: --steps N (300)  --batch G (16, global)  --len T (64)  --d D (128)  --layers L (4)
            --lr X (1e-3)  --threads N (per process; 0: all cores)  --data PATH  --save PATH
            (runs/ddp.safetensors)  --resume  --bucket FLOATS (the all-reduce's, 0: default)
            --smoke (a tiny model for 20 steps) */
#define TFM_IMPLEMENTATION
#include "common.h"

#ifdef TFM_MPI
#include <mpi.h>
#endif

typedef struct ddp_opts {
    int steps, batch, len, d, layers, threads, resume, smoke;
    int64_t bucket;
    float lr;
    const char *data, *save;
} ddp_opts;

static void ddp_args(int argc, char **argv, ddp_opts *o) {
    int i;
    memset(o, 0, sizeof *o);
    o->steps = 300;
    o->batch = 16;
    o->len = 64;
    o->d = 128;
    o->layers = 4;
    o->threads = 1;
    o->lr = 1e-3f;
    o->data = "/usr/lib/bible.data";
    o->save = "runs/ddp.safetensors";
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (ex_is(a, "--steps")) o->steps = ex_int(argc, argv, &i);
        else if (ex_is(a, "--batch")) o->batch = ex_int(argc, argv, &i);
        else if (ex_is(a, "--len")) o->len = ex_int(argc, argv, &i);
        else if (ex_is(a, "--d")) o->d = ex_int(argc, argv, &i);
        else if (ex_is(a, "--layers")) o->layers = ex_int(argc, argv, &i);
        else if (ex_is(a, "--lr")) o->lr = ex_float(argc, argv, &i);
        else if (ex_is(a, "--threads")) o->threads = ex_int(argc, argv, &i);
        else if (ex_is(a, "--bucket")) o->bucket = ex_int(argc, argv, &i);
        else if (ex_is(a, "--data")) o->data = ex_value(argc, argv, &i);
        else if (ex_is(a, "--save")) o->save = ex_value(argc, argv, &i);
        else if (ex_is(a, "--resume")) o->resume = 1;
        else if (ex_is(a, "--smoke")) o->smoke = 1;
        else ex_die("unknown option %s (see the comment at the top of examples/ddp.c)", a);
    }
    if (o->smoke) {
        o->steps = 20;
        o->batch = 8;
        o->len = 32;
        o->d = 32;
        o->layers = 2;
        o->save = "runs/ddp-smoke.safetensors";
    }
    if (o->steps < 1 || o->batch < 1 || o->len < 2 || o->d < 8 || o->d % 4 || o->layers < 1)
        ex_die("want --steps >= 1, --batch >= 1, --len >= 2, --d a multiple of 4 and >= 8, --layers >= 1");
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

int main(int argc, char **argv) {
    ddp_opts o;
    tfm_dist dist;
    tfm_config cfg;
    tfm_model m;
    tfm_optim opt;
    tfm_batch b;
    tfm_rng rng;
    ex_buf text;
    int64_t n_verses = 0, n_train, r0, r1, *off, step, first;
    int32_t *tok, *tgt;
    int local_max, i;
    double t0, t_reduce = 0, sums[2];
    uint64_t sum = 0;
    float loss = 0, gloss = 0;
#ifdef TFM_MPI
    MPI_Init(&argc, &argv);
#endif
    ddp_args(argc, argv, &o);
    tfm_set_num_threads(o.threads);
    ex_check(tfm_dist_init(&dist, NULL, o.bucket), "tfm_dist_init");
    if (dist.rank != 0 && !freopen("/dev/null", "w", stdout)) ex_die("cannot open /dev/null"); /* one process prints */

    text = ex_kjv_read(o.data, &n_verses);
    n_train = (int64_t)text.len * 9 / 10;
    ex_check(tfm_dist_shard(&dist, o.batch, &r0, &r1), "tfm_dist_shard");
    local_max = (o.batch + dist.size - 1) / dist.size;

    memset(&cfg, 0, sizeof cfg);
    cfg.kind = TFM_MODEL_DECODER_LM;
    cfg.vocab_size = 256;
    cfg.d_model = o.d;
    cfg.n_heads = o.d / 32 > 0 ? o.d / 32 : 1;
    cfg.n_layers = o.layers;
    cfg.max_len = o.len;
    cfg.max_batch = local_max;
    cfg.act = TFM_ACT_GELU;
    cfg.norm_first = 1;
    cfg.tie_output = 1;
    cfg.dropout = 0.1f;
    cfg.seed = 1;
    ex_check(tfm_model_init(&m, &cfg, NULL, 0), "tfm_model_init");
    if (o.resume) ex_check(tfm_dist_load(&dist, &m, o.save), o.save);
    else ex_check(tfm_dist_broadcast_model(&dist, &m), "tfm_dist_broadcast_model");
    ex_check(tfm_model_set_batch_offset(&m, r0), "tfm_model_set_batch_offset");
    printf("ddp: %d process%s x %d thread%s, global batch %d x %d bytes (this process: rows %lld..%lld), "
           "%.2f M parameters, sgemm %s\n", dist.size, dist.size > 1 ? "es" : "", tfm_get_num_threads(),
           tfm_get_num_threads() > 1 ? "s" : "", o.batch, o.len, (long long)r0, (long long)r1 - 1,
           (double)m.n_weights / 1e6, tfm_sgemm_backend());

    memset(&opt, 0, sizeof opt);
    opt.lr = o.lr;
    opt.warmup_steps = o.steps / 10;
    opt.clip_norm = 1.0f;
    opt.weight_decay = 0.01f;
    off = (int64_t *)ex_malloc(sizeof(int64_t) * (size_t)o.batch);
    tok = (int32_t *)ex_malloc(sizeof(int32_t) * (size_t)local_max * (size_t)o.len);
    tgt = (int32_t *)ex_malloc(sizeof(int32_t) * (size_t)local_max * (size_t)o.len);
    memset(&b, 0, sizeof b);
    b.batch = (int)(r1 - r0);
    b.len = o.len;
    b.tokens = tok;
    b.targets = tgt;

    first = m.step;
    t0 = ex_now();
    for (step = first + 1; step <= first + o.steps; step++) {
        int64_t n = 0, gn = 0;
        double t;
        tfm_rng_seed(&rng, 1000003u * (uint64_t)step); /* the same windows on every process */
        for (i = 0; i < o.batch; i++) off[i] = (int64_t)(tfm_rng_u64(&rng) % (uint64_t)(n_train - o.len - 1));
        ddp_fill(text.data, off, r0, r1, o.len, tok, tgt);
        tfm_model_zero_grad(&m);
        ex_check(tfm_model_forward(&m, &b, &loss, &n), "tfm_model_forward");
        ex_check(tfm_dist_reduce_loss(&dist, loss, n, &gloss, &gn), "tfm_dist_reduce_loss");
        ex_check(tfm_model_backward(&m, (float)((double)dist.size * (double)n / (double)gn)), "tfm_model_backward");
        t = ex_now();
        ex_check(tfm_dist_allreduce_grads(&dist, &m), "tfm_dist_allreduce_grads");
        t_reduce += ex_now() - t;
        ex_check(tfm_model_step(&m, &opt, NULL), "tfm_model_step");
        if (step % 10 == 0 || step == first + o.steps) {
            double el = ex_now() - t0;
            printf("step %lld  loss %.4f  %.0f tokens/s  all-reduce %.1f%% of the time\n", (long long)step, gloss,
                   (double)(step - first) * o.batch * o.len / el, 100.0 * t_reduce / el);
            fflush(stdout);
        }
    }

    /* validation: 64 windows of the last 10%, shared out across the processes */
    tfm_model_train(&m, 0);
    sums[0] = sums[1] = 0;
    {
        int64_t v0, v1, k;
        ex_check(tfm_dist_shard(&dist, 64, &v0, &v1), "tfm_dist_shard");
        for (k = v0; k < v1; k += local_max) {
            int64_t n = 0, kn = v1 - k < local_max ? v1 - k : local_max, j;
            for (j = 0; j < kn; j++) off[j] = n_train + ((k + j) * 997) % ((int64_t)text.len - n_train - o.len - 1);
            ddp_fill(text.data, off, 0, kn, o.len, tok, tgt);
            b.batch = (int)kn;
            ex_check(tfm_model_forward(&m, &b, &loss, &n), "tfm_model_forward");
            sums[0] += (double)loss * (double)n;
            sums[1] += (double)n;
        }
    }
    ex_check(tfm_dist_sum(&dist, sums, 2), "tfm_dist_sum");
    printf("validation: %.4f nats per byte (%.3f bits) over %.0f bytes\n", sums[0] / sums[1],
           sums[0] / sums[1] / log(2.0), sums[1]);
    ex_check(tfm_dist_check_model(&dist, &m, &sum), "tfm_dist_check_model");
    printf("every process holds the same model (checksum %016llx)\n", (unsigned long long)sum);
    ex_mkdir_for(o.save);
    ex_check(tfm_dist_save(&dist, &m, o.save, TFM_SAVE_TRAINING_STATE, NULL, 0), o.save);
    printf("saved %s at step %lld\n", o.save, (long long)m.step);

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
