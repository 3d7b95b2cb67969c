/* tests/test_models.c - whole models end to end through the public tfm_model_* API:
   1. each model kind learns a small synthetic task to a low loss: the classifier names the last
      valid token of a variable-length sequence whose padding holds random tokens (so only
      batch.lens tells where a sequence ends), with mean and with [CLS] pooling; the LM continues a
      random period-3 pattern (tied output, pre-LN, GELU); the encoder-decoder copies a
      variable-length source (padded targets are ignore_index), with separate embeddings and with
      shared + tied ones;
   2. gradient accumulation: k micro-batches with loss_scale 1/k give the gradients of one batch of
      k times the size;
   3. determinism: the same seed gives bit-identical losses and parameters with dropout on, for 1
      and for 2 threads; another seed gives other losses (1 vs 2 threads is only reported);
   4. training and evaluation modes, and masking: padding and later positions do not change logits;
   5. config, batch and call errors; 6. caller memory and inference_only models; 7. learning-rate
      schedules; 8. parameter names, shapes and decay flags.
   Every model is tiny (d_model <= 32, <= 2 layers, T <= 12, B <= 16) so the suite stays fast under
   valgrind. Run with -v to print the measured losses and errors. */

#include <stdlib.h>

/* ---- data ---- */

#define MD_MAXB 16
#define MD_MAXT 12

/* One batch and the arrays it points into. */
typedef struct md_data {
    int32_t tokens[MD_MAXB * MD_MAXT], lens[MD_MAXB], tgt_in[MD_MAXB * MD_MAXT], targets[MD_MAXB * MD_MAXT];
    tfm_batch b;
} md_data;

static int md_randint(tfm_rng *r, int n) { return (int)(tfm_rng_u64(r) % (uint64_t)n); }

static void md_data_reset(md_data *d, int B, int T) {
    memset(d, 0, sizeof *d);
    d->b.batch = B;
    d->b.len = T;
    d->b.tokens = d->tokens;
    d->b.targets = d->targets;
}

/* Classifier: data tokens 0/1, label = the last valid token. The positions past lens[b] hold random
   0/1 tokens too, so the label is learnable only if padding is masked. cls: position 0 holds the
   [CLS] token 3 (vocabulary 4; token 2 is unused). */
#define MD_CLS_T 8
#define MD_CLS_V 4
static void md_gen_cls(tfm_rng *r, md_data *d, int B, int cls) {
    int T = MD_CLS_T;
    md_data_reset(d, B, T);
    d->b.lens = d->lens;
    for (int b = 0; b < B; b++) {
        int first = cls ? 1 : 0, len = first + 2 + md_randint(r, T - first - 1); /* first+2 .. T */
        d->lens[b] = len;
        for (int t = 0; t < T; t++) d->tokens[b * T + t] = md_randint(r, 2);
        if (cls) d->tokens[b * T] = 3;
        d->targets[b] = d->tokens[b * T + len - 1];
    }
}

/* LM: the first 3 tokens are random (of 8), then they repeat: x[t] = x[t-3]. The targets of the first
   two positions (the unpredictable x[1], x[2]) are ignore_index, so every row has T-2 targets. */
#define MD_LM_T 12
#define MD_LM_V 8
static void md_gen_lm(tfm_rng *r, md_data *d, int B) {
    int T = MD_LM_T;
    md_data_reset(d, B, T);
    for (int b = 0; b < B; b++) {
        int32_t seq[MD_LM_T + 1];
        for (int t = 0; t <= T; t++) seq[t] = t < 3 ? md_randint(r, MD_LM_V) : seq[t - 3];
        for (int t = 0; t < T; t++) {
            d->tokens[b * T + t] = seq[t];
            d->targets[b * T + t] = t < 2 ? -100 : seq[t + 1];
        }
    }
}

/* Encoder-decoder: a source of 3..8 tokens from 3..V-1 (PAD 0 after), target = the source, then
   EOS 2; decoder input = BOS 1, then the target shifted right; target positions past EOS are
   ignore_index (-100) and their decoder inputs PAD 0. */
#define MD_ED_T 8
#define MD_ED_V 10
static void md_gen_ed(tfm_rng *r, md_data *d, int B) {
    int T = MD_ED_T, Tt = MD_ED_T + 1;
    md_data_reset(d, B, T);
    d->b.lens = d->lens;
    d->b.tgt_len = Tt;
    d->b.tgt_in = d->tgt_in;
    for (int b = 0; b < B; b++) {
        int len = 3 + md_randint(r, T - 2);
        d->lens[b] = len;
        for (int t = 0; t < T; t++) d->tokens[b * T + t] = t < len ? 3 + md_randint(r, MD_ED_V - 3) : 0;
        for (int t = 0; t < Tt; t++) {
            int32_t tgt = t < len ? d->tokens[b * T + t] : t == len ? 2 : -100;
            d->targets[b * Tt + t] = tgt;
            d->tgt_in[b * Tt + t] = t == 0 ? 1 : t <= len ? d->targets[b * Tt + t - 1] : 0;
        }
    }
}

typedef enum md_task { MD_TASK_CLS, MD_TASK_CLS_CLS, MD_TASK_LM, MD_TASK_ED } md_task;

static void md_gen(md_task task, tfm_rng *r, md_data *d, int B) {
    switch (task) {
    case MD_TASK_CLS: md_gen_cls(r, d, B, 0); break;
    case MD_TASK_CLS_CLS: md_gen_cls(r, d, B, 1); break;
    case MD_TASK_LM: md_gen_lm(r, d, B); break;
    default: md_gen_ed(r, d, B); break;
    }
}

static md_task md_task_of(const tfm_config *c) {
    if (c->kind == TFM_MODEL_ENCODER_CLASSIFIER) return c->pool == TFM_POOL_CLS ? MD_TASK_CLS_CLS : MD_TASK_CLS;
    return c->kind == TFM_MODEL_DECODER_LM ? MD_TASK_LM : MD_TASK_ED;
}

/* ---- configs and helpers ---- */

static tfm_config md_cfg(tfm_model_kind kind) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.d_model = 32;
    c.n_heads = 4;
    c.n_layers = 2;
    c.d_ff = 64;
    c.max_batch = MD_MAXB;
    c.seed = 1234;
    if (kind == TFM_MODEL_ENCODER_CLASSIFIER) {
        c.vocab_size = MD_CLS_V;
        c.n_classes = 2;
        c.max_len = MD_CLS_T;
    } else if (kind == TFM_MODEL_DECODER_LM) {
        c.vocab_size = MD_LM_V;
        c.max_len = MD_LM_T;
    } else {
        c.vocab_size = MD_ED_V;
        c.max_len = MD_ED_T;
        c.max_tgt_len = MD_ED_T + 1;
    }
    return c;
}

static tfm_optim md_opt(float lr, int warmup) {
    tfm_optim o;
    memset(&o, 0, sizeof o);
    o.lr = lr;
    o.warmup_steps = warmup;
    return o;
}

/* tfm_model_init(m, c, NULL, 0); on failure a test failure naming `what`, and 0. */
static int md_init(tfm_model *m, const tfm_config *c, const char *what) {
    tfm_result r = tfm_model_init(m, c, NULL, 0);
    if (r != TFM_OK) {
        TEST__FAIL("%s: tfm_model_init returned %d: %s", what, (int)r, tfm_last_error());
        return 0;
    }
    return 1;
}

/* One training step (zero_grad, forward, backward, AdamW step); 0 and a failure on an error. */
static int md_step(tfm_model *m, const tfm_batch *b, const tfm_optim *o, float *loss) {
    tfm_model_zero_grad(m);
    if (tfm_model_forward(m, b, loss, NULL) != TFM_OK || tfm_model_backward(m, 1.0f) != TFM_OK ||
        tfm_model_step(m, o, NULL) != TFM_OK) {
        TEST__FAIL("training step: %s", tfm_last_error());
        return 0;
    }
    return 1;
}

/* Train `steps` steps on fresh batches of size B from data_seed, writing each loss to losses (may be
   NULL). Returns 0 on an error. */
static int md_train(tfm_model *m, md_task task, const tfm_optim *o, int steps, int B, uint64_t data_seed,
                    float *losses) {
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    int ok = 1;
    if (!d) {
        TEST__FAIL("out of memory");
        return 0;
    }
    tfm_rng_seed(&r, data_seed);
    for (int s = 0; s < steps && ok; s++) {
        float loss = 0.0f;
        md_gen(task, &r, d, B);
        ok = md_step(m, &d->b, o, &loss);
        if (losses) losses[s] = loss;
    }
    free(d);
    return ok;
}

/* Mean loss over n fresh batches from data_seed, in evaluation mode (the mode is restored). */
static float md_eval(tfm_model *m, md_task task, int n, int B, uint64_t data_seed) {
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    int was_training = m->impl->training;
    double acc = 0.0;
    if (!d) return -1.0f;
    tfm_rng_seed(&r, data_seed);
    tfm_model_train(m, 0);
    for (int i = 0; i < n; i++) {
        float loss = -1.0f;
        md_gen(task, &r, d, B);
        CHECK_OK(tfm_model_forward(m, &d->b, &loss, NULL));
        acc += loss;
    }
    tfm_model_train(m, was_training);
    free(d);
    return (float)(acc / n);
}

/* A copy of every gradient (or value) of m, in registry order, into one malloc'ed array. */
static float *md_snapshot(const tfm_model *m, int grads, size_t *n_out) {
    size_t n = 0, off = 0;
    float *out;
    for (int i = 0; i < m->n_params; i++) n += (size_t)tfm_numel(&m->params[i].value);
    out = (float *)malloc((n ? n : 1) * sizeof(float));
    if (!out) return NULL;
    for (int i = 0; i < m->n_params; i++) {
        const tfm_tensor *t = grads ? &m->params[i].grad : &m->params[i].value;
        size_t k = (size_t)tfm_numel(&m->params[i].value);
        memcpy(out + off, t->data, k * sizeof(float));
        off += k;
    }
    *n_out = n;
    return out;
}

/* ---- 1. learning ---- */

/* The learning runs use d_model 16, 2 heads, d_ff 32, batches of 8 and init_std 0.1 (at d_model 16
   the default 0.02 learns much more slowly). Each task reached these final losses for six model
   seeds (-O3, one thread): classifier mean/pre-LN <= 0.0042, CLS/post-LN <= 0.0039, LM <= 0.0073,
   encoder-decoder pre-LN <= 0.0051, shared + tied post-LN <= 0.0132; the threshold is 0.05. */
static void md_small(tfm_config *c) {
    c->d_model = 16;
    c->n_heads = 2;
    c->d_ff = 32;
    c->init_std = 0.1f;
}

static void md_learn_case(const char *what, const tfm_config *c, int steps) {
    tfm_model m;
    tfm_optim o = md_opt(5e-3f, 20);
    md_task task = md_task_of(c);
    float *losses = (float *)malloc((size_t)steps * sizeof(float));
    float first = 0.0f, last;
    if (!losses || !md_init(&m, c, what)) {
        free(losses);
        return;
    }
    if (md_train(&m, task, &o, steps, 8, 99, losses)) {
        for (int s = 0; s < 10; s++) first += losses[s] / 10.0f;
        last = md_eval(&m, task, 4, MD_MAXB, 7);
        if (test__verbose) printf("    %s: loss %.4f (first 10 steps) -> %.5f (eval, after %d steps)\n", what, first, last, steps);
        CHECK_MSG(last >= 0.0f && last < 0.05f, "%s: final loss %g, want < 0.05 (first steps %g)", what, last, first);
        CHECK_MSG(last * 10.0f < first, "%s: the loss fell only from %g to %g", what, first, last);
    }
    free(losses);
    tfm_model_free(&m);
}

static void md_learn_classifier_mean(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    md_small(&c);
    c.norm_first = 1;
    md_learn_case("classifier, mean pooling, pre-LN", &c, 300);
}

static void md_learn_classifier_cls(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    md_small(&c);
    c.pool = TFM_POOL_CLS;
    md_learn_case("classifier, CLS pooling, post-LN", &c, 300);
}

static void md_learn_lm(void) {
    tfm_config c = md_cfg(TFM_MODEL_DECODER_LM);
    md_small(&c);
    c.tie_output = 1;
    c.norm_first = 1;
    c.act = TFM_ACT_GELU;
    md_learn_case("LM, tied, pre-LN, GELU", &c, 300);
}

static void md_learn_encdec(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    md_small(&c);
    c.n_layers = 1;
    c.norm_first = 1;
    md_learn_case("encoder-decoder, 1+1 layers, pre-LN", &c, 300);
}

static void md_learn_encdec_shared(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    md_small(&c);
    c.n_layers = 1;
    c.share_emb = 1;
    c.tie_output = 1;
    c.init_std = 0.2f;
    md_learn_case("encoder-decoder, shared + tied, 1+1 layers, post-LN", &c, 300);
}

/* ---- 2. gradient accumulation ---- */

/* k micro-batches of b rows with loss_scale 1/k, then one batch of k*b rows with loss_scale 1, on the
   same model: equal gradients and mean losses. */
static void md_accum_case(const char *what, tfm_config c) {
    enum { K = 4, BM = 4 };
    tfm_model m;
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    md_task task = md_task_of(&c);
    float *acc = NULL, *full = NULL;
    size_t n = 0, n2 = 0;
    double micro_loss = 0.0;
    float full_loss = 0.0f;
    c.max_batch = K * BM;
    if (!d || !md_init(&m, &c, what)) {
        free(d);
        return;
    }
    tfm_rng_seed(&r, 5);
    md_gen(task, &r, d, K * BM);
    tfm_model_zero_grad(&m);
    for (int k = 0; k < K; k++) {
        tfm_batch mb = d->b;
        int T = d->b.len;
        float loss = 0.0f;
        mb.batch = BM;
        mb.tokens = d->tokens + k * BM * T;
        if (d->b.lens) mb.lens = d->lens + k * BM;
        mb.targets = d->targets + (c.kind == TFM_MODEL_ENCODER_CLASSIFIER ? k * BM : k * BM * T);
        CHECK_OK(tfm_model_forward(&m, &mb, &loss, NULL));
        CHECK_OK(tfm_model_backward(&m, 1.0f / K));
        micro_loss += loss / K;
    }
    acc = md_snapshot(&m, 1, &n);
    tfm_model_zero_grad(&m);
    CHECK_OK(tfm_model_forward(&m, &d->b, &full_loss, NULL));
    CHECK_OK(tfm_model_backward(&m, 1.0f));
    full = md_snapshot(&m, 1, &n2);
    if (acc && full && n == n2) {
        double worst = 0.0, all = test_rel_err_f(acc, full, n);
        const char *worst_name = "";
        size_t off = 0;
        for (int i = 0; i < m.n_params; i++) {
            size_t k = (size_t)tfm_numel(&m.params[i].value);
            double e = test_rel_err_f(acc + off, full + off, k);
            if (e > worst) {
                worst = e;
                worst_name = m.params[i].name;
            }
            off += k;
        }
        if (test__verbose)
            printf("    %s: accumulated vs full batch: all gradients %.3g, worst parameter %.3g (%s), loss %.3g\n", what, all,
                   worst, worst_name, fabs(micro_loss - full_loss));
        CHECK_REL(what, all, 1e-5);
        CHECK_MSG(worst <= 1e-5, "%s: gradient of %s: relative error %.3g > 1e-5", what, worst_name, worst);
        CHECK_NEAR(micro_loss, full_loss, 1e-5 * fabs(full_loss) + 1e-7);
    } else {
        TEST__FAIL("%s: snapshots failed", what);
    }
    free(acc);
    free(full);
    free(d);
    tfm_model_free(&m);
}

static void md_accum_lm(void) {
    tfm_config c = md_cfg(TFM_MODEL_DECODER_LM);
    c.tie_output = 1;
    c.norm_first = 1;
    md_accum_case("LM", c);
}

static void md_accum_classifier(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    md_accum_case("classifier (variable lengths)", c);
}

/* ---- 3. determinism ---- */

#define MD_DET_STEPS 20

/* Train a fresh model `steps` steps on batches of B: losses, and a copy of the final parameters (*params, n). */
static int md_det_run(const tfm_config *c, int B, int steps, float *losses, float **params, size_t *n) {
    tfm_model m;
    tfm_optim o = md_opt(3e-3f, 0);
    int ok;
    *params = NULL;
    if (!md_init(&m, c, "determinism")) return 0;
    ok = md_train(&m, md_task_of(c), &o, steps, B, 11, losses);
    if (ok) *params = md_snapshot(&m, 0, n);
    tfm_model_free(&m);
    return ok && *params;
}

/* Same seed twice: bit-identical losses and parameters (dropout and attention dropout on, training
   mode); another seed: other losses. */
static void md_det_case(const char *what, tfm_config c) {
    float l1[MD_DET_STEPS], l2[MD_DET_STEPS], l3[MD_DET_STEPS];
    float *p1 = NULL, *p2 = NULL, *p3 = NULL;
    size_t n1 = 0, n2 = 0, n3 = 0;
    c.dropout = 0.2f;
    c.attn_dropout = 0.2f;
    if (md_det_run(&c, 8, MD_DET_STEPS, l1, &p1, &n1) && md_det_run(&c, 8, MD_DET_STEPS, l2, &p2, &n2)) {
        CHECK_MSG(memcmp(l1, l2, sizeof l1) == 0, "%s: the same seed gave different losses", what);
        CHECK_MSG(n1 == n2 && memcmp(p1, p2, n1 * sizeof(float)) == 0, "%s: the same seed gave different parameters", what);
        c.seed += 1;
        if (md_det_run(&c, 8, MD_DET_STEPS, l3, &p3, &n3)) {
            int differ = 0;
            for (int s = 0; s < MD_DET_STEPS; s++) differ += l3[s] != l1[s];
            CHECK_MSG(differ > MD_DET_STEPS / 2, "%s: another seed changed only %d of %d losses", what, differ,
                      MD_DET_STEPS);
        }
    }
    free(p1);
    free(p2);
    free(p3);
}

static void md_determinism_lm(void) {
    tfm_config c = md_cfg(TFM_MODEL_DECODER_LM);
    c.norm_first = 1;
    md_det_case("LM", c);
}

static void md_determinism_encdec(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    c.n_layers = 1;
    md_det_case("encoder-decoder", c);
}

static void md_determinism_classifier(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    c.pool = TFM_POOL_CLS;
    md_det_case("classifier", c);
}

/* tfm_model_train_step is the four calls of md_step, bit for bit: losses, counts and gradient norms,
   then the parameters, gradients, moments, step and generator (dropout on, clipping that bites, cosine
   schedule). Its errors change nothing: a batch without targets or with a bad length, a bad opt, an
   inference_only model; and a gradient norm that is not finite leaves the parameters, moments and step
   as they were. */
static void md_train_step_case(const char *what, tfm_config c) {
    tfm_model m[2];
    tfm_optim o = md_opt(3e-3f, 2);
    md_data *d = (md_data *)malloc(sizeof(md_data));
    tfm_rng r;
    int s, k;
    c.dropout = 0.2f;
    c.attn_dropout = 0.1f;
    o.clip_norm = 0.5f;
    o.weight_decay = 0.01f;
    o.schedule = TFM_SCHED_COSINE;
    o.total_steps = 50;
    if (!d || !md_init(&m[0], &c, what) || !md_init(&m[1], &c, what)) {
        TEST__FAIL("%s: setup", what);
        free(d);
        return;
    }
    tfm_rng_seed(&r, 77);
    for (s = 0; s < 6; s++) {
        float loss[2] = {0, 0}, norm[2] = {0, 0};
        int64_t cnt[2] = {0, 0};
        md_gen(md_task_of(&c), &r, d, 8);
        tfm_model_zero_grad(&m[0]);
        CHECK_OK(tfm_model_forward(&m[0], &d->b, &loss[0], &cnt[0]));
        CHECK_OK(tfm_model_backward(&m[0], 1.0f));
        CHECK_OK(tfm_model_step(&m[0], &o, &norm[0]));
        CHECK_OK(tfm_model_train_step(&m[1], &d->b, &o, &loss[1], &cnt[1], &norm[1]));
        CHECK_MSG(!memcmp(&loss[0], &loss[1], sizeof(float)) && cnt[0] == cnt[1] && !memcmp(&norm[0], &norm[1], sizeof(float)),
                  "%s step %d: loss %.9g / %.9g, counted %lld / %lld, norm %.9g / %.9g (the four calls / tfm_model_train_step)",
                  what, s, loss[0], loss[1], (long long)cnt[0], (long long)cnt[1], norm[0], norm[1]);
        CHECK_MSG(s != 0 || norm[0] > o.clip_norm, "%s: the first norm %g does not reach clip_norm", what, norm[0]);
    }
    {
        size_t n[4];
        float *a = md_snapshot(&m[0], 0, &n[0]), *b = md_snapshot(&m[1], 0, &n[1]);
        float *ga = md_snapshot(&m[0], 1, &n[2]), *gb = md_snapshot(&m[1], 1, &n[3]);
        int64_t nm = m[0].impl->mom_hi - m[0].impl->mom_lo;
        CHECK_MSG(a && b && n[0] == n[1] && !memcmp(a, b, n[0] * sizeof(float)), "%s: the parameters differ", what);
        CHECK_MSG(ga && gb && n[2] == n[3] && !memcmp(ga, gb, n[2] * sizeof(float)), "%s: the gradients differ", what);
        CHECK_MSG(!memcmp(m[0].impl->mom_m, m[1].impl->mom_m, (size_t)nm * sizeof(float)) &&
                      !memcmp(m[0].impl->mom_v, m[1].impl->mom_v, (size_t)nm * sizeof(float)),
                  "%s: the moments differ", what);
        CHECK(m[0].step == 6 && m[1].step == 6);
        CHECK_MSG(!memcmp(&m[0].impl->rng, &m[1].impl->rng, sizeof(tfm_rng)), "%s: the generators differ", what);
        free(a);
        free(b);
        free(ga);
        free(gb);
    }
    { /* errors: nothing changes */
        size_t n0, n1;
        float *before = md_snapshot(&m[1], 0, &n0), *after, loss = 1.0f, norm = 1.0f;
        tfm_rng rng0 = m[1].impl->rng;
        const int32_t *t = d->b.targets;
        tfm_optim bad = o;
        tfm_model inf;
        tfm_config ci = c;
        int64_t cnt = 5;
        d->b.targets = NULL;
        CHECK_ERR(tfm_model_train_step(&m[1], &d->b, &o, &loss, &cnt, &norm), TFM_E_ARG, "tfm_model_train_step");
        ERR_HAS("targets");
        CHECK(loss == 0.0f && cnt == 0 && norm == 0.0f);
        d->b.targets = t;
        d->b.len = 0;
        CHECK_ERR(tfm_model_train_step(&m[1], &d->b, &o, NULL, NULL, NULL), TFM_E_SHAPE, "tfm_model_train_step");
        d->b.len = c.max_len;
        CHECK_ERR(tfm_model_train_step(&m[1], &d->b, NULL, NULL, NULL, NULL), TFM_E_ARG, "tfm_model_train_step");
        bad.beta1 = 2.0f;
        CHECK_ERR(tfm_model_train_step(&m[1], &d->b, &bad, NULL, NULL, NULL), TFM_E_ARG, "beta1");
        bad = o;
        bad.total_steps = 6; /* step 7 is past the cosine's end */
        CHECK_ERR(tfm_model_train_step(&m[1], &d->b, &bad, NULL, NULL, NULL), TFM_E_ARG, "total_steps");
        CHECK_ERR(tfm_model_train_step(NULL, &d->b, &o, NULL, NULL, NULL), TFM_E_ARG, "tfm_model_train_step");
        ci.inference_only = 1;
        if (md_init(&inf, &ci, what)) {
            CHECK_ERR(tfm_model_train_step(&inf, &d->b, &o, NULL, NULL, NULL), TFM_E_ARG, "inference_only");
            tfm_model_free(&inf);
        }
        after = md_snapshot(&m[1], 0, &n1);
        CHECK_MSG(before && after && n0 == n1 && !memcmp(before, after, n0 * sizeof(float)), "%s: an error changed the parameters", what);
        CHECK(m[1].step == 6 && !memcmp(&rng0, &m[1].impl->rng, sizeof rng0));
        free(after);
        /* a NaN weight: the norm is not finite; parameters, moments and step as they were */
        m[1].params[1].value.data[0] = NAN;
        free(before);
        before = md_snapshot(&m[1], 0, &n0);
        {
            int64_t nm = m[1].impl->mom_hi - m[1].impl->mom_lo;
            float *mom = (float *)malloc((size_t)nm * sizeof(float));
            if (mom) memcpy(mom, m[1].impl->mom_m, (size_t)nm * sizeof(float));
            CHECK_ERR(tfm_model_train_step(&m[1], &d->b, &o, &loss, NULL, &norm), TFM_E_ARG, "not finite");
            CHECK(!isfinite(norm));
            after = md_snapshot(&m[1], 0, &n1);
            CHECK_MSG(before && after && n0 == n1 && !memcmp(before, after, n0 * sizeof(float)),
                      "%s: a NaN norm changed the parameters", what);
            CHECK_MSG(mom && !memcmp(mom, m[1].impl->mom_m, (size_t)nm * sizeof(float)), "%s: a NaN norm changed the moments", what);
            CHECK(m[1].step == 6);
            free(mom);
            free(after);
        }
        free(before);
    }
    for (k = 0; k < 2; k++) tfm_model_free(&m[k]);
    free(d);
}

static void md_train_step(void) {
    tfm_config c = md_cfg(TFM_MODEL_DECODER_LM);
    c.norm_first = 1;
    md_train_step_case("LM", c);
    c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    c.n_layers = 1;
    md_train_step_case("encoder-decoder", c);
    c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    md_train_step_case("classifier", c);
}

/* Determinism is promised for a given thread count: 1 thread twice and 2 threads twice must agree
   bit for bit. Whether 1 and 2 threads agree with each other is only reported (with -v). Batches
   of 16, so that the element-wise loops (B*T*C = 4608 elements) split over threads too. The thread count is restored afterwards. */
#define MD_THR_STEPS 4
static void md_determinism_threads(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    float l[4][MD_THR_STEPS];
    float *p[4] = {NULL, NULL, NULL, NULL};
    size_t n[4] = {0, 0, 0, 0};
    int saved = tfm_get_num_threads(), ok = 1;
    c.n_layers = 1;
    c.dropout = 0.2f;
    c.attn_dropout = 0.2f;
    for (int i = 0; i < 4 && ok; i++) {
        tfm_set_num_threads(i < 2 ? 1 : 2);
        ok = md_det_run(&c, MD_MAXB, MD_THR_STEPS, l[i], &p[i], &n[i]);
    }
    tfm_set_num_threads(saved);
    CHECK(tfm_get_num_threads() == saved);
    if (ok) {
        double dl = 0.0;
        int same;
        CHECK_MSG(memcmp(l[0], l[1], sizeof l[0]) == 0 && n[0] == n[1] && memcmp(p[0], p[1], n[0] * sizeof(float)) == 0,
                  "1 thread: the same seed gave different results");
        CHECK_MSG(memcmp(l[2], l[3], sizeof l[2]) == 0 && n[2] == n[3] && memcmp(p[2], p[3], n[2] * sizeof(float)) == 0,
                  "2 threads: the same seed gave different results");
        same = memcmp(l[0], l[2], sizeof l[0]) == 0 && n[0] == n[2] && memcmp(p[0], p[2], n[0] * sizeof(float)) == 0;
        for (int s = 0; s < MD_THR_STEPS; s++)
            if (fabs((double)l[0][s] - l[2][s]) > dl) dl = fabs((double)l[0][s] - l[2][s]);
        if (test__verbose)
            printf("    1 vs 2 threads: %s (max loss difference %.3g, parameters %.3g)\n", same ? "bit-identical" : "different",
                   dl, n[0] == n[2] ? test_rel_err_f(p[2], p[0], n[0]) : -1.0);
    }
    for (int i = 0; i < 4; i++) free(p[i]);
}

/* ---- 4. training and evaluation modes ---- */

static void md_train_eval_case(const char *what, tfm_config c) {
    tfm_model m;
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    float *a, *b;
    int64_t n;
    c.dropout = 0.3f;
    c.attn_dropout = 0.3f;
    if (!d || !md_init(&m, &c, what)) {
        free(d);
        return;
    }
    tfm_rng_seed(&r, 3);
    md_gen(md_task_of(&c), &r, d, 8);
    CHECK(m.impl->training == 1); /* a new model trains */
    CHECK_OK(tfm_model_forward(&m, &d->b, NULL, NULL));
    {
        tfm_tensor t = tfm_model_logits(&m);
        n = tfm_numel(&t);
        a = (float *)malloc((size_t)n * sizeof(float));
        b = (float *)malloc((size_t)n * sizeof(float));
        if (a && n > 0) memcpy(a, t.data, (size_t)n * sizeof(float));
    }
    CHECK_OK(tfm_model_forward(&m, &d->b, NULL, NULL));
    if (a && b) {
        memcpy(b, tfm_model_logits(&m).data, (size_t)n * sizeof(float));
        CHECK_MSG(memcmp(a, b, (size_t)n * sizeof(float)) != 0, "%s: two training forwards gave equal logits", what);
        tfm_model_train(&m, 0);
        CHECK_OK(tfm_model_forward(&m, &d->b, NULL, NULL));
        memcpy(a, tfm_model_logits(&m).data, (size_t)n * sizeof(float));
        CHECK_OK(tfm_model_forward(&m, &d->b, NULL, NULL));
        CHECK_MSG(memcmp(a, tfm_model_logits(&m).data, (size_t)n * sizeof(float)) == 0,
                  "%s: two evaluation forwards gave different logits", what);
        tfm_model_train(&m, 1);
        CHECK_OK(tfm_model_forward(&m, &d->b, NULL, NULL));
        CHECK_MSG(memcmp(a, tfm_model_logits(&m).data, (size_t)n * sizeof(float)) != 0,
                  "%s: back in training mode, a forward gave the evaluation logits", what);
    } else {
        TEST__FAIL("%s: out of memory", what);
    }
    free(a);
    free(b);
    free(d);
    tfm_model_free(&m);
}

static void md_train_eval(void) {
    md_train_eval_case("classifier", md_cfg(TFM_MODEL_ENCODER_CLASSIFIER));
    md_train_eval_case("LM", md_cfg(TFM_MODEL_DECODER_LM));
    md_train_eval_case("encoder-decoder", md_cfg(TFM_MODEL_ENCODER_DECODER));
}

/* What a model must not see: tokens past a sequence's length (classifier, encoder-decoder source),
   later positions (LM and decoder are causal). Changing them leaves the other logits bit-identical
   (evaluation mode). An LM's targets past lens[b] do not count in the loss. */

/* Logits of one forward in evaluation mode, copied (n floats). */
/* A copy of the last forward's logits (*n floats). */
static float *md_copy_logits(const tfm_model *m, int64_t *n) {
    tfm_tensor t = tfm_model_logits(m);
    float *out;
    *n = tfm_numel(&t);
    out = (float *)malloc((size_t)(*n > 0 ? *n : 1) * sizeof(float));
    if (out && *n > 0) memcpy(out, t.data, (size_t)*n * sizeof(float));
    return out;
}

static float *md_logits_of(tfm_model *m, const tfm_batch *b, float *loss, int64_t *n) {
    *n = 0;
    if (tfm_model_forward(m, b, loss, NULL) != TFM_OK) {
        TEST__FAIL("forward: %s", tfm_last_error());
        return NULL;
    }
    return md_copy_logits(m, n);
}

static void md_masking(void) {
    tfm_model m;
    tfm_config c;
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    float *a = NULL, *b = NULL, la = 0.0f, lb = 0.0f;
    int64_t na = 0, nb = 0;
    const int T = MD_LM_T, V = MD_LM_V;
    if (!d) return;
    tfm_rng_seed(&r, 4);

    /* classifier, mean and CLS pooling: padding tokens do not matter */
    for (int pool = 0; pool < 2; pool++) {
        c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
        c.pool = (tfm_pool_kind)pool;
        c.dropout = 0.1f;
        if (!md_init(&m, &c, "classifier")) break;
        tfm_model_train(&m, 0);
        md_gen_cls(&r, d, 8, pool);
        d->lens[0] = 2;
        a = md_logits_of(&m, &d->b, NULL, &na);
        for (int i = 0; i < 8; i++)
            for (int t = d->lens[i]; t < MD_CLS_T; t++) d->tokens[i * MD_CLS_T + t] ^= 1;
        b = md_logits_of(&m, &d->b, NULL, &nb);
        CHECK_MSG(a && b && na == nb && na == 16 && memcmp(a, b, (size_t)na * sizeof(float)) == 0,
                  "classifier (pool %d): the logits depend on tokens past lens", pool);
        /* ... while a valid token does matter */
        d->tokens[1 * MD_CLS_T + d->lens[1] - 1] ^= 1;
        free(b);
        b = md_logits_of(&m, &d->b, NULL, &nb);
        CHECK_MSG(a && b && na == nb && memcmp(a + 2, b + 2, 2 * sizeof(float)) != 0,
                  "classifier (pool %d): the logits ignore the last valid token", pool);
        free(a);
        free(b);
        a = b = NULL;
        tfm_model_free(&m);
    }

    /* LM: causal, and lens drops the later targets from the loss */
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.norm_first = 1;
    if (md_init(&m, &c, "LM")) {
        tfm_model_train(&m, 0);
        md_gen_lm(&r, d, 4);
        a = md_logits_of(&m, &d->b, NULL, &na);
        for (int i = 0; i < 4; i++) d->tokens[i * T + 7] = (d->tokens[i * T + 7] + 1) % V;
        b = md_logits_of(&m, &d->b, NULL, &nb);
        if (a && b && na == nb && na == 4 * T * V) {
            for (int i = 0; i < 4; i++) {
                CHECK_MSG(memcmp(a + i * T * V, b + i * T * V, 7 * V * sizeof(float)) == 0,
                          "LM: row %d: a change at position 7 moved earlier logits", i);
                CHECK_MSG(memcmp(a + (i * T + 7) * V, b + (i * T + 7) * V, V * sizeof(float)) != 0,
                          "LM: row %d: a change at position 7 did not move its logits", i);
            }
        } else {
            TEST__FAIL("LM: logits");
        }
        free(a);
        free(b);
        a = b = NULL;
        /* lens: the loss over positions < lens[b] equals the loss with the later targets ignored */
        d->b.lens = d->lens;
        d->lens[0] = 5;
        d->lens[1] = T;
        d->lens[2] = 3;
        d->lens[3] = 9;
        CHECK_OK(tfm_model_forward(&m, &d->b, &la, NULL));
        d->b.lens = NULL;
        for (int i = 0; i < 4; i++)
            for (int t = d->lens[i]; t < T; t++) d->targets[i * T + t] = -100;
        CHECK_OK(tfm_model_forward(&m, &d->b, &lb, NULL));
        CHECK_MSG(la == lb, "LM: loss with lens %.9g, with those targets ignored %.9g", la, lb);
        tfm_model_free(&m);
    }

    /* encoder-decoder: source padding does not matter; the decoder is causal */
    c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    c.n_layers = 1;
    if (md_init(&m, &c, "encoder-decoder")) {
        const int Tt = MD_ED_T + 1, Vt = MD_ED_V;
        tfm_model_train(&m, 0);
        md_gen_ed(&r, d, 4);
        d->lens[2] = 3;
        a = md_logits_of(&m, &d->b, &la, &na);
        for (int i = 0; i < 4; i++)
            for (int t = d->lens[i]; t < MD_ED_T; t++) d->tokens[i * MD_ED_T + t] = 3 + (t % 5);
        b = md_logits_of(&m, &d->b, &lb, &nb);
        CHECK_MSG(a && b && na == nb && na == 4 * Tt * Vt && memcmp(a, b, (size_t)na * sizeof(float)) == 0,
                  "encoder-decoder: the logits depend on source tokens past lens");
        free(b);
        b = NULL;
        for (int i = 0; i < 4; i++) d->tgt_in[i * Tt + 2] = (d->tgt_in[i * Tt + 2] + 1) % Vt;
        b = md_logits_of(&m, &d->b, NULL, &nb);
        if (a && b && na == nb) {
            for (int i = 0; i < 4; i++) {
                CHECK_MSG(memcmp(a + i * Tt * Vt, b + i * Tt * Vt, 2 * Vt * sizeof(float)) == 0,
                          "encoder-decoder: row %d: a change of tgt_in at position 2 moved earlier logits", i);
                CHECK_MSG(memcmp(a + (i * Tt + 2) * Vt, b + (i * Tt + 2) * Vt, Vt * sizeof(float)) != 0,
                          "encoder-decoder: row %d: a change of tgt_in at position 2 did not move its logits", i);
            }
        }
        free(a);
        free(b);
        a = b = NULL;
        tfm_model_free(&m);
    }
    free(d);
}

/* ---- 5. errors ---- */

/* tfm_model_init(c) must fail with `code` and a message containing substr (tfm_config_resolve and
   tfm_model_memory_size too when code is TFM_E_ARG). */
static void md_init_err(const char *what, const tfm_config *c, tfm_result code, const char *substr) {
    tfm_model m;
    tfm_config out;
    size_t bytes = 0;
    tfm_result r;
    memset(&m, 0, sizeof m);
    tfm_clear_error();
    r = tfm_model_init(&m, c, NULL, 0);
    if (r != code)
        TEST__FAIL("%s: tfm_model_init returned %d, want %d; message: %s", what, (int)r, (int)code, tfm_last_error());
    else if (!strstr(tfm_last_error(), substr))
        TEST__FAIL("%s: tfm_model_init: message \"%s\" lacks \"%s\"", what, tfm_last_error(), substr);
    if (r == TFM_OK) tfm_model_free(&m);
    if (code == TFM_E_ARG) {
        CHECK_ERR(tfm_config_resolve(c, &out), TFM_E_ARG, substr);
        CHECK_ERR(tfm_model_memory_size(c, &bytes), TFM_E_ARG, substr);
    }
}

static void md_errors_config(void) {
    tfm_config c;
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.n_heads = 3;
    md_init_err("n_heads 3, d_model 32", &c, TFM_E_ARG, "n_heads");
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.n_heads = 0;
    md_init_err("n_heads 0", &c, TFM_E_ARG, "n_heads");
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.vocab_size = 0;
    md_init_err("vocab_size 0", &c, TFM_E_ARG, "vocab_size");
    c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    c.d_model = 0;
    md_init_err("d_model 0", &c, TFM_E_ARG, "d_model");
    c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    c.max_len = 0;
    md_init_err("max_len 0", &c, TFM_E_ARG, "max_len");
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.kind = TFM_MODEL_NONE;
    md_init_err("kind 0", &c, TFM_E_ARG, "kind");
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.kind = (tfm_model_kind)7;
    md_init_err("kind 7", &c, TFM_E_ARG, "kind");
    c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    c.n_classes = 0;
    md_init_err("classifier, n_classes 0", &c, TFM_E_ARG, "n_classes");
    c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    c.share_emb = 1;
    c.tgt_vocab_size = MD_ED_V + 1;
    md_init_err("share_emb, vocabularies 10 and 11", &c, TFM_E_ARG, "share_emb");
    c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    c.tie_output = 1;
    md_init_err("tie_output on a classifier", &c, TFM_E_ARG, "tie_output");
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.share_emb = 1;
    md_init_err("share_emb on an LM", &c, TFM_E_ARG, "share_emb");
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.dropout = 1.5f;
    md_init_err("dropout 1.5", &c, TFM_E_ARG, "dropout");
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.dropout = -0.1f;
    md_init_err("dropout -0.1", &c, TFM_E_ARG, "dropout");
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.attn_dropout = 1.0f;
    md_init_err("attn_dropout 1", &c, TFM_E_ARG, "attn_dropout");
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.max_batch = -1;
    md_init_err("max_batch -1", &c, TFM_E_ARG, "max_batch");
    CHECK_ERR(tfm_model_init(NULL, &c, NULL, 0), TFM_E_ARG, "NULL");
    {
        tfm_model m;
        memset(&m, 0, sizeof m);
        CHECK_ERR(tfm_model_init(&m, NULL, NULL, 0), TFM_E_ARG, "NULL");
    }
}

/* A batch error: forward returns `code` naming substr. */
#define MD_FWD_ERR(m, b, code, substr) CHECK_ERR(tfm_model_forward((m), (b), NULL, NULL), (code), (substr))

static void md_errors_batch(void) {
    tfm_model lm, cls, ed;
    tfm_config c;
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    tfm_batch b;
    tfm_optim o;
    float loss;
    int ok;
    if (!d) return;
    tfm_rng_seed(&r, 1);
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.max_batch = 4;
    ok = md_init(&lm, &c, "LM");
    c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    c.max_batch = 4;
    ok = md_init(&cls, &c, "classifier") && ok;
    c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    c.max_batch = 4;
    ok = md_init(&ed, &c, "encoder-decoder") && ok;
    if (!ok) {
        free(d);
        return;
    }

    /* LM: shapes beyond the arena, ids and targets out of range */
    md_gen_lm(&r, d, 4);
    b = d->b;
    CHECK_OK(tfm_model_forward(&lm, &b, &loss, NULL));
    b.batch = 5;
    MD_FWD_ERR(&lm, &b, TFM_E_SHAPE, "batch.batch");
    b.batch = 0;
    MD_FWD_ERR(&lm, &b, TFM_E_SHAPE, "batch.batch");
    b = d->b;
    b.batch = 1; /* one row of MD_LM_T + 1 tokens from the buffer */
    b.len = MD_LM_T + 1;
    MD_FWD_ERR(&lm, &b, TFM_E_SHAPE, "batch.len");
    b = d->b;
    d->tokens[5] = MD_LM_V + 91; /* 99 */
    MD_FWD_ERR(&lm, &b, TFM_E_ARG, "99");
    d->tokens[5] = -3;
    MD_FWD_ERR(&lm, &b, TFM_E_ARG, "-3");
    d->tokens[5] = 1;
    d->targets[7] = 88;
    MD_FWD_ERR(&lm, &b, TFM_E_ARG, "88");
    d->targets[7] = 1;
    CHECK_OK(tfm_model_forward(&lm, &b, &loss, NULL));

    /* backward needs a forward with targets, on a model with gradients */
    b.targets = NULL;
    CHECK_OK(tfm_model_forward(&lm, &b, NULL, NULL));
    CHECK_ERR(tfm_model_backward(&lm, 1.0f), TFM_E_ARG, "target");
    CHECK_ERR(tfm_model_backward(&cls, 1.0f), TFM_E_ARG, "forward"); /* no forward yet */
    b.targets = d->targets;
    CHECK_OK(tfm_model_forward(&lm, &b, &loss, NULL));
    CHECK_OK(tfm_model_backward(&lm, 1.0f));

    /* step: lr is required */
    o = md_opt(0.0f, 0);
    CHECK_ERR(tfm_model_step(&lm, &o, NULL), TFM_E_ARG, "lr");
    o.lr = -1e-3f;
    CHECK_ERR(tfm_model_step(&lm, &o, NULL), TFM_E_ARG, "lr");
    CHECK(lm.step == 0);
    o.lr = 1e-3f;
    o.schedule = TFM_SCHED_COSINE; /* total_steps required */
    CHECK_ERR(tfm_model_step(&lm, &o, NULL), TFM_E_ARG, "total_steps");
    CHECK_ERR(tfm_model_step(&lm, NULL, NULL), TFM_E_ARG, "opt");
    o.schedule = TFM_SCHED_CONSTANT;
    CHECK_OK(tfm_model_step(&lm, &o, NULL));
    CHECK(lm.step == 1);

    /* classifier labels */
    md_gen_cls(&r, d, 4, 0);
    b = d->b;
    d->targets[2] = 77;
    MD_FWD_ERR(&cls, &b, TFM_E_ARG, "77");
    d->targets[2] = 2; /* n_classes is 2 */
    MD_FWD_ERR(&cls, &b, TFM_E_ARG, "targets");
    d->targets[2] = -1;
    MD_FWD_ERR(&cls, &b, TFM_E_ARG, "-1");
    d->targets[2] = -100; /* ignore_index is allowed */
    CHECK_OK(tfm_model_forward(&cls, &b, &loss, NULL));
    d->lens[1] = MD_CLS_T + 1;
    MD_FWD_ERR(&cls, &b, TFM_E_ARG, "lens");
    d->lens[1] = 3;
    d->tokens[3] = 1234;
    MD_FWD_ERR(&cls, &b, TFM_E_ARG, "1234");
    d->tokens[3] = 0;
    b.batch = 5;
    MD_FWD_ERR(&cls, &b, TFM_E_SHAPE, "batch.batch");

    /* encoder-decoder: target length, decoder ids */
    md_gen_ed(&r, d, 4);
    b = d->b;
    CHECK_OK(tfm_model_forward(&ed, &b, &loss, NULL));
    b.tgt_len = MD_ED_T + 2;
    MD_FWD_ERR(&ed, &b, TFM_E_SHAPE, "tgt_len");
    b.tgt_len = 0;
    MD_FWD_ERR(&ed, &b, TFM_E_SHAPE, "tgt_len");
    b = d->b;
    b.len = MD_ED_T + 1;
    MD_FWD_ERR(&ed, &b, TFM_E_SHAPE, "batch.len");
    b = d->b;
    b.tgt_in = NULL;
    MD_FWD_ERR(&ed, &b, TFM_E_ARG, "tgt_in");
    b = d->b;
    d->tgt_in[4] = 55;
    MD_FWD_ERR(&ed, &b, TFM_E_ARG, "55");
    d->tgt_in[4] = 1;
    d->targets[6] = 66;
    MD_FWD_ERR(&ed, &b, TFM_E_ARG, "66");
    d->targets[6] = MD_ED_V; /* one past the target vocabulary */
    MD_FWD_ERR(&ed, &b, TFM_E_ARG, "targets");
    d->targets[6] = 3;
    CHECK_OK(tfm_model_forward(&ed, &b, &loss, NULL));
    CHECK_OK(tfm_model_backward(&ed, 1.0f));
    CHECK_ERR(tfm_model_forward(&ed, NULL, NULL, NULL), TFM_E_ARG, "NULL");

    free(d);
    tfm_model_free(&lm);
    tfm_model_free(&cls);
    tfm_model_free(&ed);
}

/* ---- 6. memory ---- */

/* Five training steps of a model built in (mem, size) (mem NULL: memory allocated by the library). */
static int md_mem_run(const tfm_config *c, void *mem, size_t size, float *losses) {
    tfm_model m;
    tfm_optim o = md_opt(3e-3f, 0);
    tfm_result r = tfm_model_init(&m, c, mem, size);
    int ok;
    if (r != TFM_OK) {
        TEST__FAIL("tfm_model_init(%zu bytes at %p) returned %d: %s", size, mem, (int)r, tfm_last_error());
        return 0;
    }
    CHECK(m.impl->owned == NULL || mem == NULL);
    ok = md_train(&m, md_task_of(c), &o, 5, 8, 21, losses);
    tfm_model_free(&m);
    return ok;
}

static void md_memory_case(const char *what, tfm_config c) {
    size_t size = 0;
    float ref[5], got[5];
    unsigned char *buf;
    tfm_model m;
    c.dropout = 0.1f;
    CHECK_OK(tfm_model_memory_size(&c, &size));
    if (!size || !md_mem_run(&c, NULL, 0, ref)) return;
    /* exactly `size` bytes from malloc: ASan sees any write past the end */
    buf = (unsigned char *)malloc(size);
    if (buf && md_mem_run(&c, buf, size, got))
        CHECK_MSG(memcmp(ref, got, sizeof ref) == 0, "%s: a caller buffer gave other losses", what);
    free(buf);
    /* misaligned by 4, with guard bytes around it that must stay untouched */
    buf = (unsigned char *)malloc(size + 64);
    if (buf) {
        int guard_ok = 1;
        memset(buf, 0xA5, size + 64);
        if (md_mem_run(&c, buf + 4, size, got))
            CHECK_MSG(memcmp(ref, got, sizeof ref) == 0, "%s: a misaligned caller buffer gave other losses", what);
        for (size_t i = 0; i < 4; i++) guard_ok &= buf[i] == 0xA5;
        for (size_t i = size + 4; i < size + 64; i++) guard_ok &= buf[i] == 0xA5;
        CHECK_MSG(guard_ok, "%s: the model wrote outside its caller buffer", what);
        /* one byte short */
        memset(&m, 0, sizeof m);
        CHECK_ERR(tfm_model_init(&m, &c, buf + 4, size - 1), TFM_E_NOMEM, "bytes");
        CHECK_ERR(tfm_model_init(&m, &c, buf, 64), TFM_E_NOMEM, "bytes");
    }
    free(buf);
}

static void md_memory_caller_buffer(void) {
    tfm_config c = md_cfg(TFM_MODEL_DECODER_LM);
    md_memory_case("LM", c);
    c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    c.n_layers = 1;
    c.share_emb = 1;
    c.tie_output = 1;
    c.norm_first = 1;
    md_memory_case("encoder-decoder", c);
    c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    md_memory_case("classifier", c);
}

/* An inference_only model: smaller, forward without targets, the logits of a training model with the
   same seed in evaluation mode, no backward or step. */
static void md_inference_case(const char *what, tfm_config c) {
    tfm_model tm, im;
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    size_t train_bytes = 0, inf_bytes = 0;
    tfm_optim o = md_opt(1e-3f, 0);
    float loss_t = 0.0f, loss_i = 0.0f;
    c.dropout = 0.3f;
    c.attn_dropout = 0.3f;
    if (!d || !md_init(&tm, &c, what)) {
        free(d);
        return;
    }
    CHECK_OK(tfm_model_memory_size(&c, &train_bytes));
    c.inference_only = 1;
    CHECK_OK(tfm_model_memory_size(&c, &inf_bytes));
    CHECK_MSG(inf_bytes < train_bytes, "%s: inference_only needs %zu bytes, training %zu", what, inf_bytes, train_bytes);
    if (!md_init(&im, &c, what)) {
        tfm_model_free(&tm);
        free(d);
        return;
    }
    CHECK(im.impl->training == 0);
    for (int i = 0; i < im.n_params; i++) CHECK(im.params[i].grad.data == NULL);
    tfm_rng_seed(&r, 8);
    md_gen(md_task_of(&c), &r, d, 8);
    tfm_model_train(&tm, 0);
    tfm_model_train(&im, 1); /* no effect: an inference_only model never trains */
    CHECK(im.impl->training == 0);
    CHECK_OK(tfm_model_forward(&tm, &d->b, &loss_t, NULL));
    {
        tfm_batch nb = d->b;
        tfm_tensor lt = tfm_model_logits(&tm), li;
        nb.targets = NULL;
        CHECK_OK(tfm_model_forward(&im, &nb, NULL, NULL));
        li = tfm_model_logits(&im);
        CHECK(tfm_numel(&li) == tfm_numel(&lt) && tfm_numel(&lt) > 0);
        if (tfm_numel(&li) == tfm_numel(&lt))
            CHECK_MSG(memcmp(li.data, lt.data, (size_t)tfm_numel(&lt) * sizeof(float)) == 0,
                      "%s: inference_only logits differ from the training model's in evaluation mode", what);
    }
    CHECK_OK(tfm_model_forward(&im, &d->b, &loss_i, NULL)); /* a loss is still available */
    CHECK(loss_i == loss_t);
    CHECK_ERR(tfm_model_backward(&im, 1.0f), TFM_E_ARG, "inference_only");
    CHECK_ERR(tfm_model_step(&im, &o, NULL), TFM_E_ARG, "inference_only");
    tfm_model_zero_grad(&im); /* harmless */
    tfm_model_free(&tm);
    tfm_model_free(&im);
    free(d);
}

static void md_memory_inference_only(void) {
    tfm_config c = md_cfg(TFM_MODEL_DECODER_LM);
    c.tie_output = 1;
    md_inference_case("LM", c);
    c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    c.pool = TFM_POOL_CLS;
    c.norm_first = 1;
    md_inference_case("classifier", c);
    c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    c.n_layers = 1;
    md_inference_case("encoder-decoder", c);
}

/* ---- 7. schedules ---- */

/* The schedules as the header's comments state them. */
static double md_lr_ref(const tfm_optim *o, int64_t s) {
    double lr = o->lr, w = o->warmup_steps;
    switch (o->schedule) {
    case TFM_SCHED_COSINE: {
        double p;
        if (w > 0 && s <= w) return lr * (double)s / w;
        p = ((double)s - w) / ((double)o->total_steps - w);
        if (p > 1.0) p = 1.0;
        return o->min_lr + 0.5 * (lr - o->min_lr) * (1.0 + cos(3.14159265358979323846 * p));
    }
    case TFM_SCHED_INV_SQRT: {
        double ww = w > 0 ? w : 1.0, a = pow((double)s, -0.5), b = (double)s * pow(ww, -1.5);
        return lr * (a < b ? a : b) * sqrt(ww);
    }
    default:
        return w > 0 && s < w ? lr * (double)s / w : lr;
    }
}

/* The rate tfm_optim_lr gives for step s (-1 if it refuses). */
static double md_lr(const tfm_optim *o, int64_t s) {
    float lr = -1.0f;
    CHECK_OK(tfm_optim_lr(o, s, &lr));
    return lr;
}

static void md_sched_check(const char *what, const tfm_optim *o, int64_t last) {
    double worst = 0.0;
    int64_t at = 0;
    for (int64_t s = 1; s <= last; s++) {
        double want = md_lr_ref(o, s), got = md_lr(o, s), e = fabs(got - want) / o->lr;
        if (!(e <= worst)) {
            worst = e;
            at = s;
        }
    }
    CHECK_MSG(worst <= 1e-6, "%s: tfm_optim_lr off by %.3g (relative to lr) at step %lld: %.9g, want %.9g", what, worst,
              (long long)at, md_lr(o, at), md_lr_ref(o, at));
}

static void md_schedules(void) {
    tfm_optim o = md_opt(1e-3f, 10);
    /* constant with warmup: linear to lr at step 10, then flat */
    md_sched_check("constant, warmup 10", &o, 50);
    CHECK_NEAR(md_lr(&o, 5), 0.5e-3, 1e-9);
    CHECK_NEAR(md_lr(&o, 10), 1e-3, 1e-9);
    CHECK_NEAR(md_lr(&o, 1000), 1e-3, 1e-9);
    o.warmup_steps = 0;
    md_sched_check("constant", &o, 20);
    CHECK_NEAR(md_lr(&o, 1), 1e-3, 1e-9);
    /* cosine: warmup 10, then lr -> min_lr at step 110, then min_lr */
    o = md_opt(2e-3f, 10);
    o.schedule = TFM_SCHED_COSINE;
    o.total_steps = 110;
    o.min_lr = 1e-4f;
    md_sched_check("cosine, warmup 10, total 110", &o, 110);
    CHECK_NEAR(md_lr(&o, 10), 2e-3, 1e-9);
    CHECK_NEAR(md_lr(&o, 60), 0.5 * (2e-3 + 1e-4), 1e-9);
    CHECK_NEAR(md_lr(&o, 110), 1e-4, 1e-9);
    {
        /* past the end the schedule refuses rather than train on at min_lr; raising total_steps goes on,
           on the longer curve */
        float lr;
        CHECK_ERR(tfm_optim_lr(&o, 111, &lr), TFM_E_ARG, "past opt.total_steps 110");
        o.total_steps = 210;
        CHECK_NEAR(md_lr(&o, 111), 1e-4 + 0.5 * (2e-3 - 1e-4) * (1.0 + cos(3.14159265358979323846 * 101.0 / 200.0)), 1e-9);
        o.total_steps = 110;
        o.min_lr = 3e-3f;
        CHECK_ERR(tfm_optim_lr(&o, 5, &lr), TFM_E_ARG, "min_lr");
        o.min_lr = 1e-4f;
        CHECK_ERR(tfm_optim_lr(&o, 0, &lr), TFM_E_ARG, "from 1");
        o.total_steps = 10;
        CHECK_ERR(tfm_optim_lr(&o, 5, &lr), TFM_E_ARG, "must exceed");
        o.total_steps = 110;
    }
    o.warmup_steps = 0;
    o.min_lr = 0.0f;
    md_sched_check("cosine, no warmup", &o, 110);
    CHECK(md_lr(&o, 1) > 0.999 * 2e-3);
    /* inverse square root: peak lr at warmup_steps, lr/2 at 4 * warmup_steps */
    o = md_opt(1e-3f, 16);
    o.schedule = TFM_SCHED_INV_SQRT;
    md_sched_check("inverse sqrt, warmup 16", &o, 200);
    CHECK_NEAR(md_lr(&o, 16), 1e-3, 1e-9);
    CHECK_NEAR(md_lr(&o, 8), 0.5e-3, 1e-9);
    CHECK_NEAR(md_lr(&o, 64), 0.5e-3, 1e-9);
    for (int64_t s = 1; s < 200; s++) CHECK(md_lr(&o, s) <= 1e-3f * (1.0f + 1e-6f));
}

/* tfm_model_step uses the scheduled rate of the step it takes: AdamW's first update moves every
   weight with a clearly non-zero gradient by lr(1) (m_hat / sqrt(v_hat) = sign(g)). */
static void md_schedule_in_step(void) {
    tfm_config c = md_cfg(TFM_MODEL_DECODER_LM);
    tfm_model m;
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    tfm_optim o = md_opt(1e-2f, 8); /* step 1: 1e-2 / 8 */
    float *before, *grads, *after;
    size_t n = 0, n2 = 0, n3 = 0, counted = 0;
    double worst = 0.0, want = 1e-2 / 8;
    if (!d || !md_init(&m, &c, "LM")) {
        free(d);
        return;
    }
    tfm_rng_seed(&r, 2);
    md_gen_lm(&r, d, 8);
    tfm_model_zero_grad(&m);
    CHECK_OK(tfm_model_forward(&m, &d->b, NULL, NULL));
    CHECK_OK(tfm_model_backward(&m, 1.0f));
    before = md_snapshot(&m, 0, &n);
    grads = md_snapshot(&m, 1, &n2);
    CHECK_OK(tfm_model_step(&m, &o, NULL));
    after = md_snapshot(&m, 0, &n3);
    if (before && grads && after && n == n2 && n == n3) {
        for (size_t i = 0; i < n; i++) {
            if (fabs(grads[i]) < 1e-5) continue; /* eps 1e-8 is negligible against these */
            double e = fabs(fabs((double)after[i] - before[i]) - want) / want;
            if (e > worst) worst = e;
            counted++;
        }
        CHECK(counted > n / 4);
        CHECK_MSG(worst < 1e-2, "first AdamW step: |update| differs from lr(1) = %g by %.3g (relative)", want, worst);
    } else {
        TEST__FAIL("snapshots failed");
    }
    CHECK(m.step == 1);
    free(before);
    free(grads);
    free(after);
    free(d);
    tfm_model_free(&m);
}

/* tfm_model_step against AdamW written out here in double precision, for three steps with weight
   decay and global-norm clipping in force. The shapes put parameters past the optimizer's span of 2048
   and past the 4096 elements that start a parallel loop, with tails that are not a multiple of 8, so
   the vector body, the scalar tail and the span split are all compared. */
static void md_adamw_reference(void) {
    tfm_config c = md_cfg(TFM_MODEL_DECODER_LM);
    tfm_model m;
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    tfm_optim o;
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    double *w = NULL, *mm = NULL, *vv = NULL, norm = 0.0, worst = 0.0, worst_norm = 0.0;
    float *g = NULL, *now = NULL;
    size_t n = 0, n2 = 0, n3 = 0, big = 0;
    c.d_model = 36; /* heads of 9 */
    c.d_ff = 147;   /* linear1.weight: 147 x 36 = 5292 = 2 spans + 1196 (149 x 8 + 4) */
    c.vocab_size = 61; /* embedding 61 x 36 = 2196 = 2048 + 148 (18 x 8 + 4) */
    memset(&o, 0, sizeof o);
    o.lr = (float)lr;
    o.beta1 = (float)b1;
    o.beta2 = (float)b2;
    o.eps = (float)eps;
    o.weight_decay = (float)wd;
    if (!d || !md_init(&m, &c, "LM")) {
        free(d);
        return;
    }
    for (int i = 0; i < m.n_params; i++)
        if (tfm_numel(&m.params[i].value) > 4096 && tfm_numel(&m.params[i].value) % 8) big++;
    tfm_rng_seed(&r, 5);
    md_gen_lm(&r, d, 8);
    tfm_model_zero_grad(&m);
    CHECK_OK(tfm_model_forward(&m, &d->b, NULL, NULL));
    CHECK_OK(tfm_model_backward(&m, 1.0f));
    {
        float *w0 = md_snapshot(&m, 0, &n);
        g = md_snapshot(&m, 1, &n2);
        w = (double *)calloc(n ? n : 1, sizeof(double));
        mm = (double *)calloc(n ? n : 1, sizeof(double));
        vv = (double *)calloc(n ? n : 1, sizeof(double));
        if (!w0 || !g || !w || !mm || !vv || n != n2) {
            TEST__FAIL("snapshots failed");
            free(w0);
            goto done;
        }
        for (size_t i = 0; i < n; i++) w[i] = w0[i];
        free(w0);
    }
    for (size_t i = 0; i < n; i++) norm += (double)g[i] * g[i];
    norm = sqrt(norm);
    o.clip_norm = (float)(0.5 * norm); /* clipping halves every gradient */
    for (int s = 1; s <= 3; s++) {
        float got_norm = 0.0f;
        double scale = o.clip_norm / (norm + 1e-6), bc1 = 1.0 - pow(b1, s), bc2 = 1.0 - pow(b2, s);
        size_t off = 0;
        CHECK_OK(tfm_model_step(&m, &o, &got_norm)); /* the gradients stay as they are between steps */
        if (fabs(got_norm - norm) > 1e-6 * norm) worst_norm = fabs(got_norm - norm) / norm;
        for (int i = 0; i < m.n_params; i++) {
            size_t k = (size_t)tfm_numel(&m.params[i].value);
            double decay = m.params[i].decay ? 1.0 - lr * wd : 1.0;
            for (size_t j = off; j < off + k; j++) {
                double gj = g[j] * scale;
                mm[j] = b1 * mm[j] + (1.0 - b1) * gj;
                vv[j] = b2 * vv[j] + (1.0 - b2) * gj * gj;
                w[j] = w[j] * decay - (lr / bc1) * mm[j] / (sqrt(vv[j]) / sqrt(bc2) + eps);
            }
            off += k;
        }
        now = md_snapshot(&m, 0, &n3);
        if (!now || n3 != n) {
            TEST__FAIL("snapshot failed");
            goto done;
        }
        for (size_t j = 0; j < n; j++) {
            double e = fabs(now[j] - w[j]);
            if (e > worst) worst = e;
        }
        free(now);
        now = NULL;
    }
    CHECK_MSG(big >= 1, "the test model has no parameter over 4096 elements with a ragged tail");
    CHECK_MSG(worst_norm == 0.0, "gradient norm off by %.3g (relative)", worst_norm);
    /* each step moves a weight by up to lr = 1e-2; float rounding leaves about 2e-7 after three */
    CHECK_MSG(worst < 1e-6, "after 3 AdamW steps a weight differs from the double reference by %.3g", worst);
    CHECK(m.step == 3);
done:
    free(g);
    free(w);
    free(mm);
    free(vv);
    free(d);
    tfm_model_free(&m);
}

/* ---- 8. parameter names and decay flags ---- */

static int md_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Append the names of a torch layer "<prefix>.layers.<i>." to names[*n]. */
static void md_layer_names(char (*names)[64], int *n, const char *prefix, int i, int cross, int bias) {
    static const char *attn[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
    char pre[32];
    snprintf(pre, sizeof pre, "%s.layers.%d.", prefix, i);
    for (int a = 0; a < (cross ? 2 : 1); a++)
        for (int k = 0; k < 4; k++)
            if (bias || k % 2 == 0) snprintf(names[(*n)++], 64, "%s%s.%s", pre, a ? "multihead_attn" : "self_attn", attn[k]);
    snprintf(names[(*n)++], 64, "%slinear1.weight", pre);
    if (bias) snprintf(names[(*n)++], 64, "%slinear1.bias", pre);
    snprintf(names[(*n)++], 64, "%slinear2.weight", pre);
    if (bias) snprintf(names[(*n)++], 64, "%slinear2.bias", pre);
    for (int k = 1; k <= (cross ? 3 : 2); k++) {
        snprintf(names[(*n)++], 64, "%snorm%d.weight", pre, k);
        if (bias) snprintf(names[(*n)++], 64, "%snorm%d.bias", pre, k);
    }
}

/* The torch state_dict names a config should have (2 layers per stack). */
static int md_expected_names(const tfm_config *c, char (*names)[64]) {
    int n = 0, bias = !c->no_bias, ed = c->kind == TFM_MODEL_ENCODER_DECODER;
    int learned = c->pos == TFM_POS_LEARNED;
    snprintf(names[n++], 64, ed ? "src_tok_emb.weight" : "tok_emb.weight");
    if (ed && !c->share_emb) snprintf(names[n++], 64, "tgt_tok_emb.weight");
    if (learned) snprintf(names[n++], 64, ed ? "src_pos_emb.weight" : "pos_emb.weight");
    if (learned && ed) snprintf(names[n++], 64, "tgt_pos_emb.weight");
    if (c->kind != TFM_MODEL_DECODER_LM) {
        for (int i = 0; i < 2; i++) md_layer_names(names, &n, "encoder", i, 0, bias);
        if (c->norm_first) {
            snprintf(names[n++], 64, "encoder.norm.weight");
            if (bias) snprintf(names[n++], 64, "encoder.norm.bias");
        }
    }
    if (c->kind != TFM_MODEL_ENCODER_CLASSIFIER) {
        for (int i = 0; i < 2; i++) md_layer_names(names, &n, "decoder", i, ed, bias);
        if (c->norm_first) {
            snprintf(names[n++], 64, "decoder.norm.weight");
            if (bias) snprintf(names[n++], 64, "decoder.norm.bias");
        }
    }
    if (!c->tie_output) snprintf(names[n++], 64, "head.weight");
    if (c->kind == TFM_MODEL_ENCODER_CLASSIFIER && bias) snprintf(names[n++], 64, "head.bias");
    return n;
}

static void md_names_case(const char *what, tfm_config c) {
    char (*names)[64] = (char (*)[64])malloc(256 * 64);
    tfm_model m;
    int n;
    int64_t weights = 0;
    int64_t C = c.d_model;
    if (!names || !md_init(&m, &c, what)) {
        free(names);
        return;
    }
    n = md_expected_names(&c, names);
    CHECK_MSG(m.n_params == n, "%s: %d parameters, want %d", what, m.n_params, n);
    for (int i = 0; i < n; i++) {
        const tfm_param *p = tfm_model_param(&m, names[i]);
        int count = 0;
        for (int j = 0; j < m.n_params; j++) count += !strcmp(m.params[j].name, names[i]);
        CHECK_MSG(p && count == 1, "%s: parameter %s found %d times", what, names[i], count);
    }
    for (int j = 0; j < m.n_params; j++) {
        const tfm_param *p = &m.params[j];
        const char *nm = p->name;
        int want_decay = md_ends_with(nm, "in_proj_weight") || md_ends_with(nm, "out_proj.weight") ||
                         md_ends_with(nm, "linear1.weight") || md_ends_with(nm, "linear2.weight") ||
                         !strcmp(nm, "head.weight");
        int found = 0;
        for (int i = 0; i < n; i++) found |= !strcmp(names[i], nm);
        CHECK_MSG(found, "%s: unexpected parameter %s", what, nm);
        CHECK_MSG(p->decay == want_decay, "%s: %s has decay %d, want %d", what, nm, p->decay, want_decay);
        CHECK_MSG(tfm_model_param(&m, nm) == p, "%s: tfm_model_param(\"%s\") is not params[%d]", what, nm, j);
        CHECK_MSG(p->grad.data != NULL && p->grad.ndim == p->value.ndim && tfm_numel(&p->grad) == tfm_numel(&p->value),
                  "%s: %s has no gradient of its shape", what, nm);
        weights += tfm_numel(&p->value);
        /* shapes of a few kinds */
        if (md_ends_with(nm, "in_proj_weight"))
            CHECK_MSG(p->value.ndim == 2 && p->value.shape[0] == 3 * C && p->value.shape[1] == C, "%s: %s shape", what, nm);
        if (md_ends_with(nm, "linear1.weight"))
            CHECK_MSG(p->value.ndim == 2 && p->value.shape[0] == c.d_ff && p->value.shape[1] == C, "%s: %s shape", what, nm);
        if (md_ends_with(nm, "norm.weight") || md_ends_with(nm, "norm1.weight"))
            CHECK_MSG(p->value.ndim == 1 && p->value.shape[0] == C, "%s: %s shape", what, nm);
        if (!strcmp(nm, "head.weight")) {
            int64_t rows = c.kind == TFM_MODEL_ENCODER_CLASSIFIER ? c.n_classes
                           : c.kind == TFM_MODEL_DECODER_LM      ? c.vocab_size
                                                           : (c.tgt_vocab_size ? c.tgt_vocab_size : c.vocab_size);
            CHECK_MSG(p->value.ndim == 2 && p->value.shape[0] == rows && p->value.shape[1] == C, "%s: %s shape", what, nm);
        }
        if (!strcmp(nm, "pos_emb.weight") || !strcmp(nm, "src_pos_emb.weight"))
            CHECK_MSG(p->value.ndim == 2 && p->value.shape[0] == c.max_len && p->value.shape[1] == C, "%s: %s shape",
                      what, nm);
        if (!strcmp(nm, "tgt_pos_emb.weight"))
            CHECK_MSG(p->value.ndim == 2 && p->value.shape[0] == c.max_tgt_len && p->value.shape[1] == C, "%s: %s shape",
                      what, nm);
    }
    CHECK_MSG(m.n_weights == weights, "%s: n_weights %lld, the parameters hold %lld", what, (long long)m.n_weights,
              (long long)weights);
    CHECK(tfm_model_param(&m, "no.such.weight") == NULL);
    CHECK(tfm_model_param(&m, "") == NULL);
    free(names);
    tfm_model_free(&m);
}

static void md_param_names(void) {
    tfm_config c;
    c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    md_names_case("classifier, post-LN", c);
    c.norm_first = 1;
    c.pool = TFM_POOL_CLS;
    md_names_case("classifier, pre-LN", c);
    c.no_bias = 1;
    c.pos = TFM_POS_SINUSOIDAL;
    md_names_case("classifier, pre-LN, no bias, sinusoidal", c);
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.tie_output = 1;
    c.norm_first = 1;
    md_names_case("LM, tied, pre-LN", c);
    c.tie_output = 0;
    c.norm_first = 0;
    md_names_case("LM, untied, post-LN", c);
    c.pos = TFM_POS_NONE;
    md_names_case("LM, untied, no positions", c);
    c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    c.tgt_vocab_size = 12;
    md_names_case("encoder-decoder, separate, post-LN", c);
    c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    c.share_emb = 1;
    c.tie_output = 1;
    c.norm_first = 1;
    md_names_case("encoder-decoder, shared + tied, pre-LN", c);
    c.share_emb = 0;
    md_names_case("encoder-decoder, tied only, pre-LN", c);
}

/* The suite runs on one thread (md_determinism_threads sets its own counts): its models are so small
   that a parallel region costs more than its work, and on a busy machine two threads made these
   tests 10-100 times slower. Threads are covered by md_determinism_threads and the other suites. */
/* A batch in buffers of a larger row stride gives bit-identical logits, loss and gradients to the
   packed batch; the count of targets forward reports equals the count made here; and forward keeps
   its own copy of what backward needs (the caller's buffers are scribbled over in between). */
static void md_stride_case(const char *what, tfm_config c) {
    tfm_model m;
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    const int B = 4, LS = MD_MAXT + 3, TS = MD_MAXT + 2; /* strides: tokens and LM targets, tgt_in and targets */
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * B * LS), *tgi = (int32_t *)malloc(sizeof(int32_t) * B * TS);
    int32_t *tgt = (int32_t *)malloc(sizeof(int32_t) * B * (LS > TS ? LS : TS));
    float *la, *lb, *ga, *gb, loss_a = 0.0f, loss_b = 0.0f;
    int64_t na = 0, nb = 0, cnt_a = -1, cnt_b = -1, want = 0;
    size_t ng = 0, ng2 = 0;
    tfm_batch sb;
    int encdec = c.kind == TFM_MODEL_ENCODER_DECODER, lm = c.kind == TFM_MODEL_DECODER_LM, T, Tt, i, t;
    c.dropout = 0.1f; /* one training forward each: the same pass seed, so the same masks */
    if (!d || !tok || !tgi || !tgt || !md_init(&m, &c, what)) goto done;
    tfm_rng_seed(&r, 99);
    md_gen(md_task_of(&c), &r, d, B);
    if (lm) d->lens[1] = 7, d->lens[3] = 4, d->lens[0] = d->lens[2] = MD_LM_T, d->b.lens = d->lens;
    T = d->b.len;
    Tt = d->b.tgt_len;
    /* the targets that count, independently: not ignore_index and (LM) not past the row's length */
    if (c.kind == TFM_MODEL_ENCODER_CLASSIFIER) want = B;
    for (i = 0; c.kind != TFM_MODEL_ENCODER_CLASSIFIER && i < B; i++)
        for (t = 0; t < (encdec ? Tt : T); t++)
            want += d->targets[i * (encdec ? Tt : T) + t] != -100 && !(lm && d->b.lens && t >= d->lens[i]);
    /* packed: one training forward and backward, then the generator is put back for the strided one */
    {
        tfm_rng keep = m.impl->rng;
        tfm_model_zero_grad(&m);
        if (tfm_model_forward(&m, &d->b, &loss_a, &cnt_a) != TFM_OK) {
            TEST__FAIL("%s: %s", what, tfm_last_error());
            goto done;
        }
        la = md_copy_logits(&m, &na);
        CHECK_OK(tfm_model_backward(&m, 1.0f));
        ga = md_snapshot(&m, 1, &ng);
        m.impl->rng = keep;
    }
    /* strided, with out-of-range ids in the gaps */
    for (i = 0; i < B * LS; i++) tok[i] = 1000 + i;
    for (i = 0; i < B * TS; i++) tgi[i] = -7;
    for (i = 0; i < B * (LS > TS ? LS : TS); i++) tgt[i] = 5000;
    for (i = 0; i < B; i++) {
        memcpy(tok + i * LS, d->tokens + i * T, sizeof(int32_t) * (size_t)T);
        if (encdec) {
            memcpy(tgi + i * TS, d->tgt_in + i * Tt, sizeof(int32_t) * (size_t)Tt);
            memcpy(tgt + i * TS, d->targets + i * Tt, sizeof(int32_t) * (size_t)Tt);
        } else if (lm) {
            memcpy(tgt + i * LS, d->targets + i * T, sizeof(int32_t) * (size_t)T);
        }
    }
    if (c.kind == TFM_MODEL_ENCODER_CLASSIFIER) memcpy(tgt, d->targets, sizeof(int32_t) * B);
    sb = d->b;
    sb.stride = LS;
    sb.tokens = tok;
    sb.targets = tgt;
    if (encdec) sb.tgt_stride = TS, sb.tgt_in = tgi;
    tfm_model_zero_grad(&m);
    if (tfm_model_forward(&m, &sb, &loss_b, &cnt_b) != TFM_OK) {
        TEST__FAIL("%s: %s", what, tfm_last_error());
        goto done;
    }
    lb = md_copy_logits(&m, &nb);
    for (i = 0; i < B * LS; i++) tok[i] = -1; /* the caller reuses its buffers before backward */
    for (i = 0; i < B * TS; i++) tgi[i] = -1;
    CHECK_OK(tfm_model_backward(&m, 1.0f));
    gb = md_snapshot(&m, 1, &ng2);
    CHECK_MSG(la && lb && na == nb && !memcmp(la, lb, sizeof(float) * (size_t)na), "%s: strided logits differ", what);
    CHECK_MSG(loss_a == loss_b, "%s: loss %.9g strided, %.9g packed", what, (double)loss_b, (double)loss_a);
    CHECK_MSG(cnt_a == want && cnt_b == want, "%s: counted %lld and %lld targets, want %lld", what, (long long)cnt_a,
              (long long)cnt_b, (long long)want);
    CHECK_MSG(ga && gb && ng == ng2 && !memcmp(ga, gb, sizeof(float) * ng), "%s: strided gradients differ", what);
    /* a stride shorter than the length is refused */
    sb.stride = T - 1;
    CHECK_ERR(tfm_model_forward(&m, &sb, NULL, NULL), TFM_E_ARG, "batch.stride");
    free(ga);
    free(gb);
    free(la);
    free(lb);
    tfm_model_free(&m);
done:
    free(d);
    free(tok);
    free(tgi);
    free(tgt);
}

static void md_stride_counted(void) {
    md_stride_case("classifier", md_cfg(TFM_MODEL_ENCODER_CLASSIFIER));
    md_stride_case("lm", md_cfg(TFM_MODEL_DECODER_LM));
    md_stride_case("encdec", md_cfg(TFM_MODEL_ENCODER_DECODER));
}

/* tfm_model_flat: parameter i and its gradient at params[i].offset of two arrays of one layout, zeros
   in the gaps; zero_grad clears the flat gradients. */
static void md_flat(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_DECODER);
    tfm_model m;
    int64_t n = 0, ng = 0, covered = 0, i, j;
    float *w, *g;
    unsigned char *used;
    if (!md_init(&m, &c, "flat")) return;
    w = tfm_model_flat(&m, 0, &n);
    g = tfm_model_flat(&m, 1, &ng);
    CHECK(w && g && n == ng && n > 0);
    used = (unsigned char *)calloc((size_t)(n > 0 ? n : 1), 1);
    for (i = 0; w && g && used && i < m.n_params; i++) {
        const tfm_param *p = &m.params[i];
        int64_t k = tfm_numel(&p->value);
        CHECK_MSG(p->value.data == w + p->offset && p->grad.data == g + p->offset && p->offset + k <= n,
                  "%s: not at offset %lld of the flat arrays", p->name, (long long)p->offset);
        for (j = 0; j < k && p->offset + j < n; j++) used[p->offset + j]++;
        covered += k;
        p->grad.data[0] = 1.0f;
    }
    for (i = 0; used && i < n; i++) CHECK_MSG(used[i] == 1 ? 1 : (used[i] == 0 && w[i] == 0.0f), "flat[%lld]", (long long)i);
    CHECK(covered == m.n_weights);
    tfm_model_zero_grad(&m);
    for (i = 0; g && i < ng; i++) CHECK_MSG(g[i] == 0.0f, "flat gradient %lld not cleared", (long long)i);
    {
        tfm_config ci = c;
        tfm_model mi;
        ci.inference_only = 1;
        if (md_init(&mi, &ci, "flat inference")) {
            CHECK(tfm_model_flat(&mi, 0, &n) != NULL && tfm_model_flat(&mi, 1, &ng) == NULL && ng == 0);
            tfm_model_free(&mi);
        }
    }
    free(used);
    tfm_model_free(&m);
}

/* Two processes of a data-parallel run, each with half the rows and its batch offset, draw the dropout
   masks one process draws for the whole batch: their logits equal its rows (1e-6: the products run
   on fewer rows). Without the offset the second half differs, which shows the masks are in play. */
static void md_offset_case(const char *what, tfm_config c) {
    tfm_model g, r;
    tfm_rng rng;
    md_data *d = (md_data *)malloc(sizeof(md_data)), *h = (md_data *)malloc(sizeof(md_data));
    float *full = NULL, *part = NULL;
    int64_t nf = 0, np = 0;
    int k, T, Tt, half = 2;
    c.dropout = 0.3f;
    c.attn_dropout = 0.3f;
    if (!d || !h || !md_init(&g, &c, what)) goto out;
    if (!md_init(&r, &c, what)) {
        tfm_model_free(&g);
        goto out;
    }
    tfm_rng_seed(&rng, 5);
    md_gen(md_task_of(&c), &rng, d, 2 * half);
    T = d->b.len;
    Tt = d->b.tgt_len;
    full = md_logits_of(&g, &d->b, NULL, &nf);
    for (k = 0; k < 2 && full; k++) {
        tfm_rng keep = r.impl->rng;
        *h = *d;
        h->b.batch = half;
        h->b.tokens = d->tokens + k * half * T;
        h->b.targets = NULL;
        if (d->b.lens) h->b.lens = d->lens + k * half;
        if (d->b.tgt_in) h->b.tgt_in = d->tgt_in + k * half * Tt;
        CHECK_OK(tfm_model_set_batch_offset(&r, k * half));
        part = md_logits_of(&r, &h->b, NULL, &np);
        CHECK_MSG(part && np * 2 == nf && test_rel_err_f(part, full + k * (nf / 2), (size_t)np) <= 1e-6,
                  "%s: rank %d's logits differ from the global batch's rows", what, k);
        free(part);
        if (k == 1) { /* the same rows without the offset: other masks */
            r.impl->rng = keep;
            CHECK_OK(tfm_model_set_batch_offset(&r, 0));
            part = md_logits_of(&r, &h->b, NULL, &np);
            CHECK_MSG(part && test_rel_err_f(part, full + nf / 2, (size_t)np) > 1e-3, "%s: dropout masks had no effect", what);
            free(part);
        }
        r.impl->rng = keep;
    }
    CHECK_ERR(tfm_model_set_batch_offset(&r, -1), TFM_E_ARG, "row0");
    free(full);
    tfm_model_free(&g);
    tfm_model_free(&r);
out:
    free(d);
    free(h);
}

static void md_batch_offset(void) {
    md_offset_case("lm", md_cfg(TFM_MODEL_DECODER_LM));
    md_offset_case("encdec", md_cfg(TFM_MODEL_ENCODER_DECODER));
}

/* Continuous inputs: what the config and the batch refuse, with the field named. */
static void md_continuous_errors(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER), ok;
    tfm_model m;
    tfm_batch b;
    float in[2 * 3 * 4];
    int32_t tok[6] = {0}, lab[2] = {0, 1};
    int i;
    c.vocab_size = 0;
    c.input_dim = 4;
    c.cls_token = 1;
    c.pool = TFM_POOL_CLS;
    CHECK_OK(tfm_config_resolve(&c, &ok));
    c.input_dim = -1;
    md_init_err("negative input_dim", &c, TFM_E_ARG, "cfg.input_dim");
    c.input_dim = 0;
    md_init_err("no vocabulary, no inputs", &c, TFM_E_ARG, "cfg.vocab_size");
    c = md_cfg(TFM_MODEL_DECODER_LM);
    c.cls_token = 1;
    md_init_err("cls_token on an LM", &c, TFM_E_ARG, "cfg.cls_token");
    c.cls_token = 0;
    c.input_dim = 3;
    c.tie_output = 1;
    md_init_err("tied LM of inputs", &c, TFM_E_ARG, "cfg.input_dim");
    if (!md_init(&m, &ok, "continuous")) return;
    for (i = 0; i < 24; i++) in[i] = 0.1f * (float)i;
    memset(&b, 0, sizeof b);
    b.batch = 2;
    b.len = 3;
    b.targets = lab;
    CHECK_ERR(tfm_model_forward(&m, &b, NULL, NULL), TFM_E_ARG, "batch.inputs is NULL");
    b.inputs = in;
    b.tokens = tok;
    CHECK_ERR(tfm_model_forward(&m, &b, NULL, NULL), TFM_E_ARG, "batch.tokens");
    b.tokens = NULL;
    in[17] = NAN;
    CHECK_ERR(tfm_model_forward(&m, &b, NULL, NULL), TFM_E_ARG, "batch.inputs of row 1");
    in[17] = 1.0f;
    CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
    CHECK(tfm_model_param(&m, "cls_token") && tfm_model_param(&m, "input_proj.weight") && !tfm_model_param(&m, "tok_emb.weight"));
    CHECK(tfm_model_param(&m, "pos_emb.weight")->value.shape[0] == ok.max_len + 1);
    tfm_model_free(&m);
    ok = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    if (!md_init(&m, &ok, "tokens")) return;
    b.tokens = tok;
    CHECK_ERR(tfm_model_forward(&m, &b, NULL, NULL), TFM_E_ARG, "batch.inputs given");
    tfm_model_free(&m);
}

/* A ViT-style classifier (continuous inputs, class vector) saved and loaded: the config comes back
   with input_dim and cls_token, and the loaded model computes the same logits. */
static void md_continuous_checkpoint(void) {
    tfm_config c = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER), back;
    tfm_model a, b;
    tfm_batch bt;
    float in[2 * 3 * 4], *la = NULL, *lb = NULL;
    int64_t na = 0, nb = 0;
    const char *path = "build/test_vit.safetensors";
    int i;
    c.vocab_size = 0;
    c.input_dim = 4;
    c.cls_token = 1;
    c.pool = TFM_POOL_CLS;
    if (!md_init(&a, &c, "vit")) return;
    for (i = 0; i < 24; i++) in[i] = (float)((i * 7) % 11) * 0.1f - 0.5f;
    memset(&bt, 0, sizeof bt);
    bt.batch = 2;
    bt.len = 3;
    bt.inputs = in;
    tfm_model_train(&a, 0);
    la = md_logits_of(&a, &bt, NULL, &na);
    CHECK_OK(tfm_model_save(&a, path, 0, NULL, 0));
    CHECK_OK(tfm_config_load(path, &back));
    CHECK(back.input_dim == 4 && back.cls_token == 1 && back.vocab_size == 0);
    if (md_init(&b, &back, "vit loaded")) {
        CHECK_OK(tfm_model_load(&b, path));
        tfm_model_train(&b, 0);
        lb = md_logits_of(&b, &bt, NULL, &nb);
        CHECK(la && lb && na == nb && !memcmp(la, lb, sizeof(float) * (size_t)na));
        tfm_model_free(&b);
    }
    free(la);
    free(lb);
    remove(path);
    tfm_model_free(&a);
}

/* ---- the per-thread scratch ---- */

/* Training steps of a decoder LM (dropout on) on one thread, at `threads` threads. */
typedef struct md_stack_job { tfm_config c; int threads, ok; float losses[MD_THR_STEPS], *params; size_t n; } md_stack_job;

static void *md_stack_main(void *arg) {
    md_stack_job *j = (md_stack_job *)arg;
    tfm_set_num_threads(j->threads);
    j->ok = md_det_run(&j->c, 8, MD_THR_STEPS, j->losses, &j->params, &j->n);
    tfm_scratch_release();
    return NULL;
}

#if defined(__unix__) || defined(__APPLE__)
/* Whole training steps (forward, backward, AdamW) on a thread with a small stack
   (test_small_stack_run, in test_sgemm.c) give the bits they give on this thread, at 1 and 2 threads. */
static void md_small_stack(void) {
    int saved = tfm_get_num_threads();
    for (int nt = 1; nt <= 2; nt++) {
        md_stack_job ref, j;
        int kib;
        memset(&ref, 0, sizeof ref);
        ref.c = md_cfg(TFM_MODEL_DECODER_LM);
        ref.c.dropout = ref.c.attn_dropout = 0.1f;
        ref.threads = nt;
        j = ref;
        md_stack_main(&ref);
        tfm_set_num_threads(saved);
        kib = test_small_stack_run(md_stack_main, &j);
        CHECK_MSG(kib > 0, "could not start a thread with a stack of 256 KiB or less");
        if (kib > 0 && ref.ok)
            CHECK_MSG(j.ok && memcmp(j.losses, ref.losses, sizeof j.losses) == 0 && j.n == ref.n &&
                          memcmp(j.params, ref.params, j.n * sizeof(float)) == 0,
                      "training on a %d KiB stack at %d thread(s) differs", kib, nt);
        free(ref.params);
        free(j.params);
    }
}
#else
static void md_small_stack(void) {}
#endif

/* A model call whose threads cannot allocate their scratch fails with TFM_E_NOMEM naming it, before it
   changes anything: the gradients stay as they were, and the next calls run as if nothing happened. */
static void md_scratch_nomem(void) {
    tfm_config c = md_cfg(TFM_MODEL_DECODER_LM);
    tfm_model m;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    tfm_rng r;
    float loss = 0.0f, loss2 = 0.0f, *g1 = NULL, *g2 = NULL;
    size_t n1 = 0, n2 = 0;
    int saved = tfm_get_num_threads();
    if (!d || !md_init(&m, &c, "scratch")) {
        free(d);
        return;
    }
    tfm_rng_seed(&r, 5);
    md_gen(MD_TASK_LM, &r, d, 4);
    for (int nt = 1; nt <= 2; nt++) {
        tfm_set_num_threads(nt);
        tfm_model_zero_grad(&m);
        CHECK_OK(tfm_model_forward(&m, &d->b, &loss, NULL));
        CHECK_OK(tfm_model_backward(&m, 1.0f));
        g1 = md_snapshot(&m, 1, &n1);
        tfm_model_zero_grad(&m);
        tfm_scratch_release();
        tfm__scratch_refuse = 1;
        CHECK_ERR(tfm_model_forward(&m, &d->b, &loss2, NULL), TFM_E_NOMEM, "tfm_model_forward");
        tfm__scratch_refuse = 0;
        CHECK_OK(tfm_model_forward(&m, &d->b, &loss2, NULL));
        CHECK_MSG(loss2 == loss, "%d thread(s): the loss after a refused forward is %g, was %g", nt, loss2, loss);
        tfm_scratch_release();
        tfm__scratch_refuse = 1;
        CHECK_ERR(tfm_model_backward(&m, 1.0f), TFM_E_NOMEM, "tfm_model_backward");
        tfm__scratch_refuse = 0;
        g2 = md_snapshot(&m, 1, &n2);
        for (size_t i = 0; g2 && i < n2; i++)
            if (g2[i] != 0.0f) {
                TEST__FAIL("%d thread(s): a refused backward changed gradient %zu", nt, i);
                break;
            }
        free(g2);
        CHECK_OK(tfm_model_backward(&m, 1.0f));
        g2 = md_snapshot(&m, 1, &n2);
        CHECK_MSG(g1 && g2 && n1 == n2 && memcmp(g1, g2, n1 * sizeof(float)) == 0,
                  "%d thread(s): the gradients after a refused backward differ", nt);
        free(g1);
        free(g2);
    }
    { /* with dropout: a refused forward leaves the random stream as it was (the next forward draws the
         masks a twin model's first forward draws) and no state for backward */
        tfm_model m2;
        tfm_config c2 = c;
        c2.dropout = 0.2f;
        tfm_model_free(&m);
        if (md_init(&m, &c2, "scratch dropout") && md_init(&m2, &c2, "scratch dropout twin")) {
            tfm_model_train(&m, 1);
            tfm_model_train(&m2, 1);
            CHECK_OK(tfm_model_forward(&m2, &d->b, &loss, NULL));
            tfm_scratch_release();
            tfm__scratch_refuse = 1;
            CHECK_ERR(tfm_model_forward(&m, &d->b, &loss2, NULL), TFM_E_NOMEM, "tfm_model_forward");
            tfm__scratch_refuse = 0;
            CHECK_ERR(tfm_model_backward(&m, 1.0f), TFM_E_ARG, "no loss");
            CHECK_OK(tfm_model_forward(&m, &d->b, &loss2, NULL));
            CHECK_MSG(loss2 == loss, "the loss after a refused forward with dropout is %g, its twin's %g", loss2, loss);
            tfm_model_free(&m2);
        }
    }
    tfm_set_num_threads(saved);
    tfm_model_free(&m);
    free(d);
}

/* cfg.last_logits: an inference_only model holding one position's logits per row. Its memory is smaller
   by the other positions' logits (and their log-sum-exp and target slots), up to the 64-byte alignment of
   those three buffers; its forward gives the logits of each row's last position (lens[b] - 1) that the
   full model gives (1e-5 of the largest: one row through the product's one-row path against the
   batch's product, which may sum the C = 32 terms in another order); generation and beam search give
   the same tokens, scoring the same log-probabilities (1e-5: the head's rows taken 2 at a time);
   a forward with targets and the configs it does not serve are refused. */
static void md_last_logits(void) {
    tfm_config c = md_cfg(TFM_MODEL_DECODER_LM), cl;
    tfm_model fm, lm;
    tfm_rng r;
    md_data *d = (md_data *)malloc(sizeof(md_data));
    size_t fb = 0, lb = 0, want;
    const int B = 4, T = MD_LM_T, V = MD_LM_V;
    static const int32_t prompt[] = {1, 2, 3}, target[] = {1, 2, 3, 1, 2, 3, 4};
    c.inference_only = 1;
    c.max_batch = 2 * B; /* B rows in the forward, and B + 2 beams with max_batch 2 below */
    cl = c;
    cl.last_logits = 1;
    CHECK_OK(tfm_model_memory_size(&c, &fb));
    CHECK_OK(tfm_model_memory_size(&cl, &lb));
    want = (size_t)4 * (size_t)(c.max_batch * T - c.max_batch) * (V + 2);
    CHECK_MSG(fb > lb && fb - lb + 3 * 64 >= want && fb - lb <= want + 3 * 64,
              "last_logits saves %zu bytes, want %zu (3 buffers' alignment aside)", fb - lb, want);
    if (!d || !md_init(&fm, &c, "full logits")) {
        free(d);
        return;
    }
    if (!md_init(&lm, &cl, "last logits")) {
        tfm_model_free(&fm);
        free(d);
        return;
    }
    tfm_rng_seed(&r, 3);
    md_gen(MD_TASK_LM, &r, d, B);
    for (int b = 0; b < B; b++) d->lens[b] = T - 3 * b; /* rows of different lengths */
    d->b.lens = d->lens;
    CHECK_ERR(tfm_model_forward(&lm, &d->b, NULL, NULL), TFM_E_ARG, "last_logits");
    d->b.targets = NULL;
    CHECK_OK(tfm_model_forward(&fm, &d->b, NULL, NULL));
    CHECK_OK(tfm_model_forward(&lm, &d->b, NULL, NULL));
    {
        tfm_tensor lf = tfm_model_logits(&fm), ll = tfm_model_logits(&lm);
        double big = 0.0, err = 0.0;
        CHECK(ll.ndim == 3 && ll.shape[0] == B && ll.shape[1] == 1 && ll.shape[2] == V);
        for (int b = 0; b < B; b++)
            for (int v = 0; v < V; v++) {
                double want_v = lf.data[((int64_t)b * T + d->lens[b] - 1) * V + v], got = ll.data[(int64_t)b * V + v];
                big = fmax(big, fabs(want_v));
                err = fmax(err, fabs(got - want_v));
            }
        CHECK_MSG(big > 0.0 && err <= 1e-5 * big, "last_logits: the last positions' logits are off by %g (largest %g)", err, big);
    }
    {
        tfm_gen_opts g;
        int32_t of[8], ol[8], bf[6 * 8], bl[6 * 8];
        int nf = 0, nl = 0, lf[6] = {0}, ll[6] = {0};
        float sf[6] = {0}, sl[6] = {0}, pf[7], pl[7], tf = 0.0f, tl = 0.0f;
        memset(&g, 0, sizeof g);
        g.max_new = 8;
        CHECK_OK(tfm_model_generate(&fm, NULL, 0, prompt, 3, &g, of, &nf));
        CHECK_OK(tfm_model_generate(&lm, NULL, 0, prompt, 3, &g, ol, &nl));
        CHECK_MSG(nf == nl && memcmp(of, ol, (size_t)nf * sizeof(int32_t)) == 0, "last_logits: generation differs");
        g.beam_width = B + 2;
        CHECK_OK(tfm_model_beam_search(&fm, NULL, 0, prompt, 3, &g, 6, bf, 8, lf, sf, NULL));
        CHECK_OK(tfm_model_beam_search(&lm, NULL, 0, prompt, 3, &g, 6, bl, 8, ll, sl, NULL));
        CHECK_MSG(memcmp(lf, ll, sizeof lf) == 0 && memcmp(sf, sl, sizeof sf) == 0, "last_logits: beam search differs");
        tfm_model_free(&lm);
        cl.max_batch = 2; /* scoring 7 targets 2 rows at a time */
        if (md_init(&lm, &cl, "last logits, batch 2")) {
            CHECK_OK(tfm_model_score(&fm, NULL, 0, prompt, 3, target, 7, pf, &tf));
            CHECK_OK(tfm_model_score(&lm, NULL, 0, prompt, 3, target, 7, pl, &tl));
            for (int i = 0; i < 7; i++) CHECK_NEAR(pl[i], pf[i], 1e-5);
            CHECK_NEAR(tl, tf, 1e-5 * 7);
            tfm_model_free(&lm);
        }
    }
    cl = c;
    cl.last_logits = 1;
    cl.inference_only = 0;
    CHECK_ERR(tfm_model_memory_size(&cl, &lb), TFM_E_ARG, "last_logits");
    cl = md_cfg(TFM_MODEL_ENCODER_CLASSIFIER);
    cl.inference_only = cl.last_logits = 1;
    CHECK_ERR(tfm_model_memory_size(&cl, &lb), TFM_E_ARG, "last_logits");
    tfm_model_free(&fm);
    free(d);
}

/* The gradients of 6 random entries of each of the named parameters of m on batch b against central
   differences of the float loss (h = 2e-3, the bound of test_layers.c: rounding ~1e-7 / h and
   truncation ~h^2 stay below it; a missing term does not). Without b->token_types only type 0's row
   of type_emb.weight is used, so its entries are taken from there. Returns how many were compared. */
static int md_bert_fd(tfm_model *m, const tfm_batch *b, const char *const *names, int n_names, tfm_rng *r,
                      const char *what) {
    int i, k, checked = 0;
    tfm_model_zero_grad(m);
    CHECK_OK(tfm_model_forward(m, b, NULL, NULL));
    CHECK_OK(tfm_model_backward(m, 1.0f));
    for (i = 0; i < n_names; i++) {
        const tfm_param *p = tfm_model_param(m, names[i]);
        CHECK_MSG(p != NULL, "%s: no parameter %s", what, names[i]);
        if (!p) continue;
        for (k = 0; k < 6; k++) {
            int64_t j = (int64_t)(tfm_rng_u64(r) % (uint64_t)tfm_numel(&p->value));
            float keep, h = 2e-3f, lp = 0.0f, lm = 0.0f;
            double fd, an, err;
            if (!b->token_types && strcmp(names[i], "type_emb.weight") == 0) j = k; /* type 0's row */
            keep = p->value.data[j];
            an = p->grad.data[j];
            p->value.data[j] = keep + h;
            CHECK_OK(tfm_model_forward(m, b, &lp, NULL));
            p->value.data[j] = keep - h;
            CHECK_OK(tfm_model_forward(m, b, &lm, NULL));
            p->value.data[j] = keep;
            fd = ((double)lp - (double)lm) / (2.0 * h);
            err = fabs(fd - an) / (2e-3 + 2e-2 * fabs(an));
            CHECK_MSG(err <= 1.0, "%s (types %s): %s[%lld]: backward %.6g, finite differences %.6g", what,
                      b->token_types ? "given" : "NULL", names[i], (long long)j, an, fd);
            checked++;
        }
    }
    return checked;
}

/* BERT's layout (token types, the embedding layernorm, eps 1e-12, exact GELU, post-LN): the gradients
   of the embedding parts against central differences (md_bert_fd), with and without
   batch.token_types; then the errors of the new fields and a checkpoint that records them. */
/* The setup md_bert_layout and md_bert_layout_rms share: a 1-layer BERT-layout classifier (token types,
   emb_norm, exact GELU, eps 1e-12) with layernorms (rms 0) or RMSNorms (rms 1), its norm weights moved off
   1 and 0 so their gradients mean something, and a padded batch with types, in inference mode (no
   dropout). 0 when the model could not be built (already reported). */
static int md_bert_setup(tfm_model *m, tfm_config *c, tfm_batch *b, int32_t *tokens, int32_t *types,
                         const int32_t *lens, const int32_t *labels, int B, int T, int rms, tfm_rng *r,
                         const char *what) {
    int i, k;
    memset(c, 0, sizeof *c);
    c->kind = TFM_MODEL_ENCODER_CLASSIFIER;
    c->vocab_size = 7;
    c->n_classes = 2;
    c->d_model = 8;
    c->n_heads = 2;
    c->n_layers = 1;
    c->d_ff = 16;
    c->max_len = T;
    c->max_batch = B;
    c->act = TFM_ACT_GELU;
    c->norm = rms ? TFM_NORM_RMS : TFM_NORM_LAYER;
    c->type_vocab_size = 3;
    c->emb_norm = 1;
    c->ln_eps = 1e-12f;
    c->init_std = 0.5f;
    c->seed = 5 + (uint64_t)rms;
    if (!md_init(m, c, what)) return 0;
    tfm_rng_seed(r, 8 + (uint64_t)rms);
    for (i = 0; i < B * T; i++) tokens[i] = md_randint(r, 7), types[i] = md_randint(r, 3);
    for (i = 0; i < m->n_params; i++)
        if (strstr(m->params[i].name, "norm"))
            for (k = 0; k < tfm_numel(&m->params[i].value); k++)
                m->params[i].value.data[k] += 0.3f * ((float)md_randint(r, 1000) / 1000.0f - 0.5f);
    memset(b, 0, sizeof *b);
    b->batch = B;
    b->len = T;
    b->tokens = tokens;
    b->lens = lens;
    b->targets = labels;
    tfm_model_train(m, 0);
    return 1;
}

static void md_bert_layout(void) {
    enum { B = 3, T = 5 };
    tfm_config c;
    tfm_model m;
    tfm_batch b;
    int32_t tokens[B * T], types[B * T], lens[B] = {5, 2, 4}, labels[B] = {0, 1, 1};
    const char *names[5] = {"tok_emb.weight", "pos_emb.weight", "type_emb.weight", "emb_norm.weight", "emb_norm.bias"};
    tfm_rng r;
    int i, k, pass, checked = 0;
    if (!md_bert_setup(&m, &c, &b, tokens, types, lens, labels, B, T, 0, &r, "bert layout")) return;
    for (pass = 0; pass < 2; pass++) {
        b.token_types = pass ? NULL : types;
        checked += md_bert_fd(&m, &b, names, 5, &r, "bert layout");
        if (pass) { /* without types, rows 1 and 2 of the type table get no gradient */
            const tfm_param *p = tfm_model_param(&m, "type_emb.weight");
            double sum = 0.0;
            for (k = 8; p && k < 24; k++) sum += fabs(p->grad.data[k]);
            CHECK_MSG(p && sum == 0.0, "bert layout: type rows 1-2 have gradient %g without types", sum);
        }
    }
    CHECK(checked == 60);
    { /* tfm_model_pooled: what the head read (logits = pooled W^T + b, recomputed here) */
        tfm_tensor pl = tfm_model_pooled(&m), lg = tfm_model_logits(&m);
        const tfm_param *w = tfm_model_param(&m, "head.weight"), *hb = tfm_model_param(&m, "head.bias");
        double worst = 0.0;
        CHECK(pl.data && pl.ndim == 2 && pl.shape[0] == B && pl.shape[1] == 8 && w && hb);
        for (i = 0; pl.data && w && hb && i < B * 2; i++) {
            double acc = hb->value.data[i % 2];
            for (k = 0; k < 8; k++) acc += (double)pl.data[(i / 2) * 8 + k] * w->value.data[(i % 2) * 8 + k];
            worst = fmax(worst, fabs(acc - lg.data[i]));
        }
        CHECK_MSG(worst < 1e-5, "pooled W^T + b differs from the logits by %g", worst);
    }
    /* errors */
    types[4] = 3;
    b.token_types = types;
    CHECK_ERR(tfm_model_forward(&m, &b, NULL, NULL), TFM_E_ARG, "batch.token_types");
    types[4] = 0;
    {
        tfm_model m2;
        tfm_config c2 = c;
        c2.type_vocab_size = 0;
        CHECK_OK(tfm_model_init(&m2, &c2, NULL, 0));
        CHECK_ERR(tfm_model_forward(&m2, &b, NULL, NULL), TFM_E_ARG, "cfg.type_vocab_size 0");
        tfm_model_free(&m2);
        c2 = c;
        c2.cls_token = 1;
        md_init_err("types with cls_token", &c2, TFM_E_ARG, "cfg.type_vocab_size");
        c2 = md_cfg(TFM_MODEL_ENCODER_DECODER);
        c2.emb_norm = 1;
        md_init_err("emb_norm in an encoder-decoder", &c2, TFM_E_ARG, "cfg.emb_norm");
        c2 = md_cfg(TFM_MODEL_ENCODER_DECODER);
        c2.type_vocab_size = 2;
        md_init_err("types in an encoder-decoder", &c2, TFM_E_ARG, "cfg.type_vocab_size");
        c2 = c;
        c2.type_vocab_size = -1;
        md_init_err("negative type_vocab_size", &c2, TFM_E_ARG, "cfg.type_vocab_size -1");
    }
#ifndef TFM_NO_STDIO
    { /* a checkpoint records both fields: the loaded config has them, a model without them refuses it */
        const char *path = "build/test_bert_layout.safetensors";
        tfm_config lc;
        tfm_model m2;
        tfm_config c2 = c;
        CHECK_OK(tfm_model_save(&m, path, 0, NULL, 0));
        CHECK_OK(tfm_config_load(path, &lc));
        CHECK(lc.type_vocab_size == 3 && lc.emb_norm == 1);
        c2.emb_norm = 0;
        CHECK_OK(tfm_model_init(&m2, &c2, NULL, 0));
        CHECK_ERR(tfm_model_load(&m2, path), TFM_E_FORMAT, "emb_norm");
        tfm_model_free(&m2);
        remove(path);
    }
#endif
    tfm_model_free(&m);
}

/* BERT's embedding layout in an RMS model (cfg.norm = TFM_NORM_RMS: emb_norm is an RMSNorm, weight
   only, like the blocks' norms): every gradient of the embedding tables, emb_norm and the block's two
   norms against central differences (md_bert_fd), with and without types. The forward is an RMSNorm's,
   not a layernorm's: scaling the three tables by 2 scales the embedding sum, which both norms undo
   (logits as before), while adding 0.5 to every token vector shifts the sum, which only a layernorm
   would undo (logits move). */
static void md_bert_layout_rms(void) {
    enum { B = 3, T = 5 };
    tfm_config c;
    tfm_model m;
    tfm_batch b;
    int32_t tokens[B * T], types[B * T], lens[B] = {5, 2, 4}, labels[B] = {0, 1, 1};
    const char *names[6] = {"tok_emb.weight", "pos_emb.weight", "type_emb.weight", "emb_norm.weight",
                            "encoder.layers.0.norm1.weight", "encoder.layers.0.norm2.weight"};
    const char *tables[3] = {"tok_emb.weight", "pos_emb.weight", "type_emb.weight"};
    float base[B * 2];
    tfm_rng r;
    int i, k, pass, checked = 0;
    if (!md_bert_setup(&m, &c, &b, tokens, types, lens, labels, B, T, 1, &r, "bert layout rms")) return;
    CHECK_MSG(tfm_model_param(&m, "emb_norm.bias") == NULL, "an RMS emb_norm has no bias");
    for (pass = 0; pass < 2; pass++) {
        b.token_types = pass ? NULL : types;
        checked += md_bert_fd(&m, &b, names, 6, &r, "bert layout rms");
    }
    CHECK(checked == 72);
    b.token_types = types;
    CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
    memcpy(base, tfm_model_logits(&m).data, sizeof base);
    for (pass = 0; pass < 2; pass++) { /* 0: the tables x2; 1: back, then +0.5 on every token vector */
        tfm_tensor lg;
        double moved = 0.0;
        for (i = 0; i < 3; i++) {
            tfm_param *p = (tfm_param *)tfm_model_param(&m, tables[i]);
            for (k = 0; p && k < tfm_numel(&p->value); k++) {
                if (pass == 0) p->value.data[k] *= 2.0f;
                else p->value.data[k] = p->value.data[k] * 0.5f + (i == 0 ? 0.5f : 0.0f);
            }
        }
        CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
        lg = tfm_model_logits(&m);
        for (i = 0; i < B * 2; i++) moved = fmax(moved, fabs((double)lg.data[i] - base[i]));
        if (pass == 0) CHECK_MSG(moved < 1e-5, "rms emb_norm: tables x2 moved the logits by %g", moved);
        else CHECK_MSG(moved > 1e-2, "rms emb_norm: a shift of the embedding sum moved the logits by only %g", moved);
    }
    tfm_model_free(&m);
}

/* A block's and a layer's desc of d_model 8, n_heads heads and max_len 4, every other field 0: the
   layers' refusal tests change one field each. */
static void md_layer_descs(tfm_block_desc *d, tfm_mha_desc *md, int n_heads) {
    memset(d, 0, sizeof *d);
    d->d_model = 8;
    d->n_heads = n_heads;
    d->max_len = 4;
    memset(md, 0, sizeof *md);
    md->d_model = 8;
    md->n_heads = n_heads;
    md->max_len = 4;
}

/* Rotary positions: the gradients of the query and key rows of every in_proj (they reach the loss only
   through the rotation and its backward) and of the token embedding against central finite differences of
   the loss, in a causal LM turning 4 of 6 channels and in a classifier over padded rows turning all of them;
   the config's rotary fields are checked. */
static void md_rope(void) {
    enum { B = 3, T = 6 };
    int32_t tokens[B * T], targets[B * T], lens[B] = {6, 2, 5}, labels[B] = {0, 2, 1};
    tfm_rng r;
    int kind, i, k, checked = 0;
    tfm_rng_seed(&r, 12);
    for (i = 0; i < B * T; i++) tokens[i] = md_randint(&r, 9), targets[i] = md_randint(&r, 9);
    for (kind = 0; kind < 2; kind++) {
        tfm_config c;
        tfm_model m;
        tfm_batch b;
        char what[64];
        memset(&c, 0, sizeof c);
        c.kind = kind ? TFM_MODEL_ENCODER_CLASSIFIER : TFM_MODEL_DECODER_LM;
        c.vocab_size = 9;
        c.n_classes = kind ? 3 : 0;
        c.d_model = 12;
        c.n_heads = 2;
        c.n_layers = 2;
        c.d_ff = 16;
        c.max_len = T;
        c.max_batch = B;
        c.norm_first = kind;
        c.act = TFM_ACT_GELU;
        c.pos = TFM_POS_ROPE;
        c.rope_dims = kind ? 0 : 4;
        c.rope_base = kind ? 0.0f : 100.0f;
        c.init_std = 0.4f;
        c.seed = 9;
        snprintf(what, sizeof what, "rope %s", kind ? "classifier" : "LM");
        if (!md_init(&m, &c, what)) return;
        CHECK(m.cfg.rope_dims == (kind ? 6 : 4) && m.cfg.rope_base == (kind ? 10000.0f : 100.0f));
        CHECK(tfm_model_param(&m, "pos_emb.weight") == NULL);
        memset(&b, 0, sizeof b);
        b.batch = B;
        b.len = T;
        b.tokens = tokens;
        b.lens = kind ? lens : NULL;
        b.targets = kind ? labels : targets;
        tfm_model_train(&m, 0);
        tfm_model_zero_grad(&m);
        CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
        CHECK_OK(tfm_model_backward(&m, 1.0f));
        for (i = 0; i < m.n_params; i++) {
            tfm_param *p = &m.params[i];
            int qk = strstr(p->name, "in_proj") != NULL, n = qk ? 8 : 4;
            if (!qk && strcmp(p->name, "tok_emb.weight")) continue;
            for (k = 0; k < n; k++) {
                /* in_proj: an element of the query or key rows (the first 2C of 3C) */
                int64_t span = qk ? tfm_numel(&p->value) * 2 / 3 : tfm_numel(&p->value);
                int64_t j = (int64_t)(tfm_rng_u64(&r) % (uint64_t)span);
                float keep = p->value.data[j], h = 2e-3f, lp = 0.0f, lm = 0.0f;
                double fd, an = p->grad.data[j], err;
                p->value.data[j] = keep + h;
                CHECK_OK(tfm_model_forward(&m, &b, &lp, NULL));
                p->value.data[j] = keep - h;
                CHECK_OK(tfm_model_forward(&m, &b, &lm, NULL));
                p->value.data[j] = keep;
                fd = ((double)lp - (double)lm) / (2.0 * h);
                err = fabs(fd - an) / (2e-3 + 2e-2 * fabs(an));
                CHECK_MSG(err <= 1.0, "%s: %s[%lld]: backward %.6g, finite differences %.6g", what, p->name, (long long)j, an, fd);
                checked++;
            }
        }
        tfm_model_free(&m);
    }
    CHECK(checked == 2 * (4 + 4 * 8));
    { /* the config's fields */
        tfm_config c = md_cfg(TFM_MODEL_DECODER_LM), c2; /* d_model 32, n_heads 4: heads of 8 */
        c2 = c;
        c2.rope_dims = 4;
        md_init_err("rope_dims without rotary positions", &c2, TFM_E_ARG, "cfg.rope_dims 4 and cfg.rope_base 0 are for cfg.pos");
        c2 = c;
        c2.rope_base = 100.0f;
        md_init_err("rope_base without rotary positions", &c2, TFM_E_ARG, "are for cfg.pos TFM_POS_ROPE");
        c.pos = TFM_POS_ROPE;
        c2 = c;
        c2.rope_dims = 3;
        md_init_err("odd rope_dims", &c2, TFM_E_ARG, "cfg.rope_dims 3 must be even, >= 2 and at most the head size 8");
        c2.rope_dims = 10;
        md_init_err("rope_dims past the head", &c2, TFM_E_ARG, "cfg.rope_dims 10 must be even");
        c2.rope_dims = -2;
        md_init_err("negative rope_dims", &c2, TFM_E_ARG, "cfg.rope_dims -2 must be >= 0");
        c2 = c;
        c2.rope_base = 1.0f;
        md_init_err("rope_base 1", &c2, TFM_E_ARG, "cfg.rope_base 1 must be finite and > 1");
        c2.rope_base = INFINITY;
        md_init_err("rope_base inf", &c2, TFM_E_ARG, "cfg.rope_base inf must be finite");
        c2 = c;
        c2.pos = (tfm_pos_kind)4;
        md_init_err("pos 4", &c2, TFM_E_ARG, "cfg.pos 4 is not a tfm_pos_kind");
        c2 = c; /* reduced precision is the GPU's: the CPU refuses it */
        c2.precision = TFM_PREC_BF16;
        md_init_err("bf16 on the CPU", &c2, TFM_E_ARG, "cfg.precision TFM_PREC_BF16 runs on the GPU only");
        c2.precision = TFM_PREC_TF32;
        md_init_err("tf32 on the CPU", &c2, TFM_E_ARG, "cfg.precision TFM_PREC_TF32 runs on the GPU only");
        c2.precision = (tfm_precision)-1;
        md_init_err("precision -1", &c2, TFM_E_ARG, "cfg.precision -1 is not a tfm_precision");
    }
    { /* the layers': a block's desc, and cross-attention refuses rotation */
        tfm_block_desc d;
        tfm_mha_desc md;
        tfm_block blk;
        tfm_mha a;
        tfm_mem mem;
        md_layer_descs(&d, &md, 2);
        d.rope_dims = 6;
        memset(&mem, 0, sizeof mem); /* counting */
        CHECK_ERR(tfm_block_init(&blk, &d, &mem), TFM_E_ARG, "tfm_block_init: desc.rope_dims 6 must be even, >= 2 and at most the head size 4");
        md.cross = 1;
        md.rope_dims = 2;
        CHECK_ERR(tfm_mha_init(&a, &md, &mem), TFM_E_ARG, "tfm_mha_init: desc.rope_dims 2: rotary positions are for self-attention");
        md.cross = 0;
        md.rope_base = -3.0f;
        CHECK_ERR(tfm_mha_init(&a, &md, &mem), TFM_E_ARG, "desc.rope_base -3 must be finite and > 1");
    }
}

/* Grouped-query attention: the gradients of the key and value rows of every in_proj (C + 2E rows: queries,
   then E key rows, then E value rows) against central finite differences of the loss, in a causal LM with
   rotary positions (4 query heads over 2 key/value heads) and in an encoder-decoder with one key/value head
   (multi-query self- and cross-attention over a padded source); in_proj's shape, the config's field and its
   refusals, a block's and a layer's desc. */
static void md_gqa(void) {
    enum { B = 3, T = 6 };
    int32_t tokens[B * T], targets[B * T], tgt_in[B * T], lens[B] = {6, 2, 5};
    tfm_rng r;
    int kind, i, k, checked = 0;
    tfm_rng_seed(&r, 21);
    for (i = 0; i < B * T; i++)
        tokens[i] = md_randint(&r, 9), targets[i] = md_randint(&r, 9), tgt_in[i] = md_randint(&r, 9);
    for (kind = 0; kind < 2; kind++) {
        tfm_config c;
        tfm_model m;
        tfm_batch b;
        char what[64];
        int E;
        memset(&c, 0, sizeof c);
        c.kind = kind ? TFM_MODEL_ENCODER_DECODER : TFM_MODEL_DECODER_LM;
        c.vocab_size = 9;
        c.d_model = 16;
        c.n_heads = 4;
        c.n_kv_heads = kind ? 1 : 2;
        c.n_layers = kind ? 1 : 2;
        c.d_ff = 16;
        c.max_len = T;
        c.max_batch = B;
        c.norm_first = 1;
        c.act = kind ? TFM_ACT_GELU : TFM_ACT_SWIGLU;
        c.norm = kind ? TFM_NORM_LAYER : TFM_NORM_RMS;
        c.pos = kind ? TFM_POS_LEARNED : TFM_POS_ROPE;
        c.init_std = 0.4f;
        c.seed = 5;
        E = 16 / 4 * c.n_kv_heads;
        snprintf(what, sizeof what, "gqa %s", kind ? "encoder-decoder" : "LM");
        if (!md_init(&m, &c, what)) return;
        CHECK(m.cfg.n_kv_heads == c.n_kv_heads);
        memset(&b, 0, sizeof b);
        b.batch = B;
        b.len = T;
        b.tokens = tokens;
        b.lens = kind ? lens : NULL;
        b.tgt_len = kind ? T : 0;
        b.tgt_in = kind ? tgt_in : NULL;
        b.targets = targets;
        tfm_model_train(&m, 0);
        tfm_model_zero_grad(&m);
        CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
        CHECK_OK(tfm_model_backward(&m, 1.0f));
        for (i = 0; i < m.n_params; i++) {
            tfm_param *p = &m.params[i];
            if (!strstr(p->name, "in_proj")) continue;
            if (strstr(p->name, "in_proj_weight"))
                CHECK_MSG(p->value.ndim == 2 && p->value.shape[0] == 16 + 2 * E && p->value.shape[1] == 16,
                          "%s: %s is %s", what, p->name, tfm__shp(&p->value));
            for (k = 0; k < 8; k++) {
                /* an element of the key or value rows: the last 2E of C + 2E */
                int64_t per = tfm_numel(&p->value) / (16 + 2 * E), span = per * 2 * E;
                int64_t j = per * 16 + (int64_t)(tfm_rng_u64(&r) % (uint64_t)span);
                float keep = p->value.data[j], h = 2e-3f, lp = 0.0f, lm = 0.0f;
                double fd, an = p->grad.data[j], err;
                p->value.data[j] = keep + h;
                CHECK_OK(tfm_model_forward(&m, &b, &lp, NULL));
                p->value.data[j] = keep - h;
                CHECK_OK(tfm_model_forward(&m, &b, &lm, NULL));
                p->value.data[j] = keep;
                fd = ((double)lp - (double)lm) / (2.0 * h);
                err = fabs(fd - an) / (2e-3 + 2e-2 * fabs(an));
                CHECK_MSG(err <= 1.0, "%s: %s[%lld]: backward %.6g, finite differences %.6g", what, p->name, (long long)j, an, fd);
                checked++;
            }
        }
        tfm_model_free(&m);
    }
    /* LM: 2 layers x (weight, bias); encoder-decoder: encoder self, decoder self and cross x (weight, bias) */
    CHECK(checked == 8 * (4 + 6));
    { /* the config's field */
        tfm_config c = md_cfg(TFM_MODEL_DECODER_LM), c2; /* n_heads 4 */
        tfm_model m;
        c2 = c;
        c2.n_kv_heads = 3;
        md_init_err("n_kv_heads 3 of 4", &c2, TFM_E_ARG, "cfg.n_kv_heads 3 must be 0 or divide cfg.n_heads 4");
        c2.n_kv_heads = -1;
        md_init_err("negative n_kv_heads", &c2, TFM_E_ARG, "cfg.n_kv_heads -1 must be 0 or divide cfg.n_heads 4");
        c2.n_kv_heads = 8;
        md_init_err("n_kv_heads past n_heads", &c2, TFM_E_ARG, "cfg.n_kv_heads 8 must be 0 or divide");
        c2.n_kv_heads = 4; /* one per query head: the plain model, kept as 0 */
        if (md_init(&m, &c2, "n_kv_heads = n_heads")) {
            CHECK(m.cfg.n_kv_heads == 0);
            CHECK(tfm_model_param(&m, "decoder.layers.0.self_attn.in_proj_weight")->value.shape[0] == 3 * 32);
            tfm_model_free(&m);
        }
    }
    { /* the layers' */
        tfm_block_desc d;
        tfm_mha_desc md;
        tfm_block blk;
        tfm_mha a;
        tfm_mem mem;
        md_layer_descs(&d, &md, 4);
        d.n_kv_heads = 3;
        memset(&mem, 0, sizeof mem); /* counting */
        CHECK_ERR(tfm_block_init(&blk, &d, &mem), TFM_E_ARG, "tfm_block_init: desc.n_kv_heads 3 must be 0 or divide desc.n_heads 4");
        md.n_kv_heads = -4;
        CHECK_ERR(tfm_mha_init(&a, &md, &mem), TFM_E_ARG, "tfm_mha_init: desc.n_kv_heads -4 must be 0 or divide desc.n_heads 4");
        md.n_kv_heads = 2;
        md.cross = 1;
        CHECK_OK(tfm_mha_init(&a, &md, &mem));
        CHECK(a.desc.n_kv_heads == 2 && a.in_proj_weight.shape[0] == 8 + 2 * 4);
        /* a layer's calls take its desc's key/value heads and refuse another count in opts */
        if (tfm_mem_alloc(&mem) == TFM_OK && tfm_mha_init(&a, &md, &mem) == TFM_OK) {
            float x[2 * 8], y[2 * 8];
            tfm_tensor tx = tfm_tensor3(x, 1, 2, 8), ty = tfm_tensor3(y, 1, 2, 8);
            tfm_attn_opts o;
            tfm_rng rr;
            tfm_rng_seed(&rr, 3);
            CHECK_OK(tfm_mha_init_params(&a, &rr));
            for (i = 0; i < 16; i++) x[i] = (float)i / 16.0f;
            memset(&o, 0, sizeof o);
            o.n_kv_heads = 2;
            CHECK_OK(tfm_mha_forward(&a, &ty, &tx, &tx, &o));
            o.n_kv_heads = 4;
            CHECK_ERR(tfm_mha_forward(&a, &ty, &tx, &tx, &o), TFM_E_ARG,
                      "tfm_mha_forward: opts.n_kv_heads 4 differs from the layer's desc.n_kv_heads 2");
        }
        tfm_mem_free(&mem);
    }
}

static void suite_models(void) {
    int threads = tfm_get_num_threads();
    tfm_set_num_threads(1);
    RUN(md_learn_classifier_mean);
    RUN(md_learn_classifier_cls);
    RUN(md_learn_lm);
    RUN(md_learn_encdec);
    RUN(md_learn_encdec_shared);
    RUN(md_accum_lm);
    RUN(md_accum_classifier);
    RUN(md_determinism_lm);
    RUN(md_determinism_encdec);
    RUN(md_determinism_classifier);
    RUN(md_determinism_threads);
    RUN(md_train_step);
    RUN(md_small_stack);
    RUN(md_scratch_nomem);
    RUN(md_train_eval);
    RUN(md_masking);
    RUN(md_errors_config);
    RUN(md_errors_batch);
    RUN(md_memory_caller_buffer);
    RUN(md_memory_inference_only);
    RUN(md_last_logits);
    RUN(md_schedules);
    RUN(md_schedule_in_step);
    RUN(md_adamw_reference);
    RUN(md_param_names);
    RUN(md_stride_counted);
    RUN(md_flat);
    RUN(md_batch_offset);
    RUN(md_continuous_errors);
    RUN(md_continuous_checkpoint);
    RUN(md_bert_layout);
    RUN(md_bert_layout_rms);
    RUN(md_rope);
    RUN(md_gqa);
    tfm_set_num_threads(threads);
}
