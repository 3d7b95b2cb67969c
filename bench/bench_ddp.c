/* bench/bench_ddp.c - data-parallel training speed: P processes of T threads each on one global
   batch, against the same batch in fewer processes with more threads (bench/ddp.sh runs the pairs).
   Built with mpicc and TFM_MPI (make build/bench-ddp).

       mpirun -np P build/bench-ddp NAME THREADS [STEPS]

   NAME is one of bench.c's models of the same name, built the same way (dropout 0, AdamW lr 1e-4,
   weight decay 0.01, random tokens, full-length rows, the global batch B of bench.c): char-gpt-tiny
   (C 128, 4 layers, T 128, B 16, V 96) or gpt-small (C 384, 6 layers, T 256, B 8, V 8192). Each
   process takes B/P rows. A step is zero_grad + forward + backward + tfm_dist_allreduce_grads + AdamW,
   timed on rank 0 (median over STEPS after 2 warm-up steps); allreduce_ms is the median of the
   all-reduce inside those steps (it includes waiting for the slower rank), pure_ms the median of 5
   more all-reduces each after a barrier (the transfer alone). Prints one line:
       RESULT name=... procs=P threads=T step_ms=... tok_s=... allreduce_ms=... pure_ms=... grad_mb=... */
#define _POSIX_C_SOURCE 200809L
#define TFM_IMPLEMENTATION
#include "../transformer.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "bench-ddp"
#include "bench_util.h"

typedef struct bd_cfg { const char *name; int C, L, H, T, B, V; } bd_cfg;
static const bd_cfg BD_CONFIGS[] = {
    {"char-gpt-tiny", 128, 4, 4, 128, 16, 96},
    {"gpt-small", 384, 6, 6, 256, 8, 8192},
};

#define BD_TRY(x)                                                                                      \
    do {                                                                                               \
        tfm_result r_ = (x);                                                                           \
        if (r_ != TFM_OK) {                                                                            \
            fprintf(stderr, "bench-ddp: %s: %s\n", #x, tfm_last_error());                               \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                              \
        }                                                                                              \
    } while (0)

int main(int argc, char **argv) {
    const bd_cfg *bc = NULL;
    tfm_dist d;
    tfm_config cfg;
    tfm_model m;
    tfm_optim opt;
    tfm_batch b;
    tfm_rng rng;
    int32_t *tok, *tgt;
    int64_t r0, r1, i, n_grad = 0;
    int threads, steps, s, n_local;
    double *step_t, *ar_t, pure[5], t0, t1;
    MPI_Init(&argc, &argv);
    if (argc < 3) {
        fprintf(stderr, "usage: mpirun -np P bench-ddp NAME THREADS [STEPS]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (i = 0; i < (int64_t)(sizeof BD_CONFIGS / sizeof BD_CONFIGS[0]); i++)
        if (!strcmp(argv[1], BD_CONFIGS[i].name)) bc = &BD_CONFIGS[i];
    if (!bc) {
        fprintf(stderr, "bench-ddp: unknown model %s (char-gpt-tiny, gpt-small)\n", argv[1]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    threads = atoi(argv[2]);
    steps = argc > 3 ? atoi(argv[3]) : 10;
    if (steps < 1) steps = 1;
    tfm_set_num_threads(threads);
    BD_TRY(tfm_dist_init(&d, NULL, 0));
    BD_TRY(tfm_dist_shard(&d, bc->B, &r0, &r1));
    n_local = (int)(r1 - r0);

    memset(&cfg, 0, sizeof cfg);
    cfg.kind = TFM_MODEL_DECODER_LM;
    cfg.vocab_size = bc->V;
    cfg.d_model = bc->C;
    cfg.n_heads = bc->H;
    cfg.n_layers = bc->L;
    cfg.max_len = bc->T;
    cfg.max_batch = n_local;
    cfg.seed = 1;
    BD_TRY(tfm_model_init(&m, &cfg, NULL, 0));
    BD_TRY(tfm_dist_broadcast_model(&d, &m));
    BD_TRY(tfm_model_set_batch_offset(&m, r0));
    tfm_model_flat(&m, 1, &n_grad);
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-4f;
    opt.weight_decay = 0.01f;

    tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_local * (size_t)bc->T);
    tgt = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_local * (size_t)bc->T);
    step_t = (double *)malloc(sizeof(double) * (size_t)steps);
    ar_t = (double *)malloc(sizeof(double) * (size_t)steps);
    if (!tok || !tgt || !step_t || !ar_t) MPI_Abort(MPI_COMM_WORLD, 1);
    tfm_rng_seed(&rng, 7 + (uint64_t)d.rank);
    for (i = 0; i < (int64_t)n_local * bc->T; i++) {
        tok[i] = (int32_t)(tfm_rng_u64(&rng) % (uint64_t)bc->V);
        tgt[i] = (int32_t)(tfm_rng_u64(&rng) % (uint64_t)bc->V);
    }
    memset(&b, 0, sizeof b);
    b.batch = n_local;
    b.len = bc->T;
    b.tokens = tok;
    b.targets = tgt;

    MPI_Barrier(MPI_COMM_WORLD);
    for (s = -2; s < steps; s++) {
        float loss;
        double ta, tb;
        t0 = MPI_Wtime();
        tfm_model_zero_grad(&m);
        BD_TRY(tfm_model_forward(&m, &b, &loss, NULL));
        BD_TRY(tfm_model_backward(&m, 1.0f));
        ta = MPI_Wtime();
        BD_TRY(tfm_dist_allreduce_grads(&d, &m));
        tb = MPI_Wtime();
        BD_TRY(tfm_model_step(&m, &opt, NULL));
        t1 = MPI_Wtime();
        if (s >= 0) {
            step_t[s] = t1 - t0;
            ar_t[s] = tb - ta;
        }
    }
    for (s = 0; s < 5; s++) {
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        BD_TRY(tfm_dist_allreduce_grads(&d, &m));
        pure[s] = MPI_Wtime() - t0;
    }
    BD_TRY(tfm_dist_check_model(&d, &m, NULL));
    if (d.rank == 0) {
        double st = median(step_t, steps), ar = median(ar_t, steps), pu = median(pure, 5);
        printf("RESULT name=%s procs=%d threads=%d step_ms=%.1f tok_s=%.0f allreduce_ms=%.1f pure_ms=%.1f grad_mb=%.1f\n",
               bc->name, d.size, tfm_get_num_threads(), 1e3 * st, (double)bc->B * bc->T / st, 1e3 * ar, 1e3 * pu,
               (double)n_grad * 4.0 / 1048576.0);
    }
    free(tok);
    free(tgt);
    free(step_t);
    free(ar_t);
    tfm_model_free(&m);
    tfm_dist_free(&d);
    MPI_Finalize();
    return 0;
}
