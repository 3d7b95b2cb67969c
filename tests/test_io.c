/* tests/test_io.c - model checkpoints: tfm_model_save, tfm_config_load, tfm_model_load, tfm_checkpoint_meta.

   1. Round trips, each model kind: a model trained for a few steps is saved (weights only, then
      with TFM_SAVE_TRAINING_STATE); tfm_config_load gives back its whole config; a fresh model built
      from that config (with another seed) and loaded has every parameter bit-identical and the same
      logits, bit for bit; the training state brings the step, the random generator and the AdamW
      moments along.
   2. Resume: 8 steps straight (dropout and attention dropout on) against 4 steps, a save with the
      training state, a load into a fresh model with another seed, and 4 more steps: the losses and
      the final parameters are bit-identical, with a constant and with a cosine-with-warmup schedule.
      Controls show the comparison can fail: resuming from the weights alone, or with the step count
      forced back to 0, ends elsewhere.
   3. Interrupted saves: with a failure injected (tfm__st_write_hook) at each stage of the save of a
      new checkpoint over an old one, tfm_model_save returns TFM_E_IO, the old file is byte-identical
      and loads the old weights, and no temporary file is left. A failed directory sync (after the
      rename) reports TFM_E_IO with the new file in place.
   4. Load errors: architecture mismatches name the field; a missing file is TFM_E_IO naming the
      path; truncated files, missing, extra and reshaped tensors, bad metadata values and config-less
      files are TFM_E_FORMAT naming what is wrong; metadata with the architecture alone gives the
      defaults for the rest; an inference_only model skips the optimizer tensors; NULL arguments
      are TFM_E_ARG. A failed load, whatever failed (a hostile file or a read error half-way through
      the data), leaves every parameter, moment, the step and the generator bit-identical.
   4c. User metadata: hostile values (every byte 1..127, UTF-8, 64 KB) come back byte for byte, their
      JSON escaping is the format's, bad keys and values are refused, hostile files are TFM_E_FORMAT.
   5. PyTorch to C: tests/fixtures/torch_export_<kind>.safetensors were written by
      tools/torch_roundtrip.py from the reference modules of tools/torch_models.py (random weights,
      fixed seed), with the batch and torch's float64 logits and loss in torch_export_<kind>.tfx.
      tfm_config_load + tfm_model_init + tfm_model_load + an eval forward reproduce them within 1e-5
      relative (max |got - want| / max |want|); saving the loaded model again gives the exporter's
      file byte for byte (same metadata strings, same tensor order, same layout).
   6. C to PyTorch: each kind is trained a few steps and saved to build/io_export/<kind>.safetensors,
      with a batch and the C logits and loss in build/io_export/<kind>.tfx (TFX1, written here).
      Those files stay: `tools/torch_roundtrip.py check build/io_export` runs them in torch.
   7. Other names: tfm_model_load_mapped (Hugging Face's BERT names; parts of unequal rows) and
      tfm_model_save_mapped; Hugging Face's LLaMA names (tfm_llama_name_map) against the fixtures of
      tools/torch_llama.py: logits within 1e-5, saved back byte for byte, trained copies left in
      build/io_export/llama for `tools/torch_llama.py check`; non-LLaMA models, bad maps and hostile
      files refused naming what is wrong.

   Scratch files go to build/io_test.<pid>/ (removed at the end). Run from the repository root.
   Included by test_main.c (one TU); everything here is static and prefixed io_. */

#include "fixture.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__unix) || (defined(__APPLE__) && defined(__MACH__))
#include <unistd.h>
#if defined(_POSIX_VERSION)
#define IO_POSIX 1
#include <dirent.h>
#include <sys/stat.h>
#include <sys/types.h>
#endif
#endif

#define IO_TOL 1e-5
#define IO_MAXB 4
#define IO_MAXT 8
#define IO_EXPORT_DIR "build/io_export"

static const char *const io_kind_name[3] = {"classifier", "lm", "encdec"};
static const tfm_model_kind io_kinds[3] = {TFM_MODEL_ENCODER_CLASSIFIER, TFM_MODEL_DECODER_LM, TFM_MODEL_ENCODER_DECODER};

/* ---- files ---------------------------------------------------------------------------------- */

static char io_dir[256]; /* scratch directory ("" until set up; "." without POSIX) */

/* Names handed out by io_path, removed by io_cleanup (for the "." fallback). */
#define IO_MAX_NAMES 64
static char io_names[IO_MAX_NAMES][64];
static int io_n_names;

static int io_mkdir(const char *path) {
#if defined(IO_POSIX)
    return mkdir(path, 0777) == 0 || errno == EEXIST;
#else
    (void)path;
    return 0;
#endif
}

static void io_setup_dir(void) {
    if (io_dir[0]) return;
#if defined(IO_POSIX)
    if (io_mkdir("build")) {
        snprintf(io_dir, sizeof io_dir, "build/io_test.%ld", (long)getpid());
        if (mkdir(io_dir, 0700) == 0 || errno == EEXIST) return;
    }
#endif
    snprintf(io_dir, sizeof io_dir, ".");
}

/* io_dir/name (the name is prefixed "io_test_" in the "." fallback), in rotating buffers. */
static const char *io_path(const char *name) {
    static char bufs[8][512];
    static int next;
    char *b = bufs[next++ & 7];
    int i, known = 0;
    io_setup_dir();
    for (i = 0; i < io_n_names; i++)
        if (!strcmp(io_names[i], name)) known = 1;
    if (!known && io_n_names < IO_MAX_NAMES) snprintf(io_names[io_n_names++], 64, "%s", name);
    snprintf(b, sizeof bufs[0], "%s/%s%s", io_dir, strcmp(io_dir, ".") ? "" : "io_test_", name);
    return b;
}

/* The whole file in a new malloc'd buffer (*size bytes), or NULL. */
static unsigned char *io_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    unsigned char *b = NULL;
    size_t cap = 0, n = 0;
    *size = 0;
    if (!f) return NULL;
    for (;;) {
        size_t got;
        if (n == cap) {
            unsigned char *nb = (unsigned char *)realloc(b, cap ? cap * 2 : 65536);
            if (!nb) {
                free(b);
                fclose(f);
                return NULL;
            }
            b = nb;
            cap = cap ? cap * 2 : 65536;
        }
        got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    *size = n;
    return b;
}

static int io_write(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    int ok;
    if (!f) return 0;
    ok = n == 0 || fwrite(p, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    return ok;
}

/* The file at path holds exactly the n bytes at p. */
static int io_same_file(const char *path, const unsigned char *p, size_t n) {
    size_t m;
    unsigned char *b = io_read(path, &m);
    int same = b && m == n && (n == 0 || memcmp(b, p, n) == 0);
    free(b);
    return same;
}

/* Temporary files (".tmp." in the name) in the scratch directory; -1 where it cannot be listed. */
static int io_count_tmp(void) {
#if defined(IO_POSIX)
    DIR *d = opendir(io_dir);
    struct dirent *e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
#else
    return -1;
#endif
}

static void io_cleanup(void) {
    int i;
    if (!io_dir[0]) return;
    for (i = 0; i < io_n_names; i++) remove(io_path(io_names[i]));
#if defined(IO_POSIX)
    if (strcmp(io_dir, ".") != 0) {
        /* the directory is this process's own: whatever is left in it goes too */
        DIR *d = opendir(io_dir);
        struct dirent *e;
        char p[600];
        if (d) {
            while ((e = readdir(d)) != NULL) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
                snprintf(p, sizeof p, "%s/%s", io_dir, e->d_name);
                remove(p);
            }
            closedir(d);
        }
        rmdir(io_dir);
    }
#endif
    io_dir[0] = 0;
    io_n_names = 0;
}

/* ---- models and batches --------------------------------------------------------------------- */

/* Tiny configs, one per kind (k: 0 classifier, 1 LM, 2 encoder-decoder). */
static tfm_config io_cfg(int k) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = io_kinds[k];
    c.d_model = 8;
    c.n_heads = 2;
    c.d_ff = 16;
    c.max_len = 6;
    c.max_batch = 3;
    if (k == 0) {
        c.vocab_size = 11;
        c.n_classes = 3;
        c.n_layers = 2;
        c.act = TFM_ACT_GELU;
        c.pool = TFM_POOL_MEAN;
        c.seed = 101;
    } else if (k == 1) {
        c.vocab_size = 13;
        c.n_layers = 2;
        c.norm_first = 1;
        c.tie_output = 1;
        c.seed = 102;
    } else {
        c.vocab_size = 12;
        c.tgt_vocab_size = 10;
        c.n_layers = 1;
        c.n_dec_layers = 2;
        c.max_tgt_len = 5;
        c.act = TFM_ACT_GELU_TANH;
        c.pos = TFM_POS_SINUSOIDAL;
        c.scale_emb = 1;
        c.label_smoothing = 0.1f;
        c.seed = 103;
    }
    return c;
}

/* The configs of the checkpoints handed to PyTorch (other options than io_cfg's). */
static tfm_config io_export_cfg(int k) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = io_kinds[k];
    c.dropout = 0.1f;
    c.attn_dropout = 0.1f;
    if (k == 0) {
        c.vocab_size = 10;
        c.n_classes = 4;
        c.d_model = 12;
        c.n_heads = 3;
        c.d_ff = 20;
        c.n_layers = 2;
        c.max_len = 7;
        c.max_batch = 3;
        c.norm_first = 1;
        c.pos = TFM_POS_SINUSOIDAL;
        c.scale_emb = 1;
        c.pool = TFM_POOL_CLS;
        c.seed = 201;
    } else if (k == 1) {
        c.vocab_size = 11;
        c.d_model = 12;
        c.n_heads = 2;
        c.d_ff = 24;
        c.n_layers = 2;
        c.max_len = 7;
        c.max_batch = 2;
        c.act = TFM_ACT_GELU;
        c.seed = 202;
    } else {
        c.vocab_size = 9;
        c.d_model = 8;
        c.n_heads = 2;
        c.d_ff = 16;
        c.n_layers = 2;
        c.n_dec_layers = 1;
        c.max_len = 6;
        c.max_batch = 2;
        c.act = TFM_ACT_GELU_TANH;
        c.norm_first = 1;
        c.share_emb = 1;
        c.tie_output = 1;
        c.label_smoothing = 0.05f;
        c.seed = 203;
    }
    return c;
}

static tfm_optim io_opt(int cosine) {
    tfm_optim o;
    memset(&o, 0, sizeof o);
    o.lr = 3e-3f;
    o.weight_decay = 0.01f;
    o.clip_norm = 1.0f;
    if (cosine) {
        o.schedule = TFM_SCHED_COSINE;
        o.warmup_steps = 3;
        o.total_steps = 8;
        o.min_lr = 1e-4f;
    }
    return o;
}

/* A batch whose contents depend only on the config and `step`. */
typedef struct io_batch {
    int32_t tokens[IO_MAXB * IO_MAXT], lens[IO_MAXB], tgt_in[IO_MAXB * IO_MAXT],
        targets[IO_MAXB * IO_MAXT];
    int B, T, Tt;
    tfm_batch b;
} io_batch;

static int io_rand(tfm_rng *r, int n) { return (int)(tfm_rng_u64(r) % (uint64_t)n); }

/* c must be resolved (a model's cfg): ignore_index is used as it is. */
static void io_make_batch(io_batch *d, const tfm_config *c, uint64_t step) {
    tfm_rng r;
    int b, t, B = c->max_batch, T = c->max_len;
    int ed = c->kind == TFM_MODEL_ENCODER_DECODER, lm = c->kind == TFM_MODEL_DECODER_LM;
    int Tt = ed ? c->max_tgt_len : 0;
    memset(d, 0, sizeof *d);
    tfm_rng_seed(&r, 0x10AD5EEDull + step * 7919u);
    if (B > IO_MAXB) B = IO_MAXB;
    if (T > IO_MAXT) T = IO_MAXT;
    if (Tt > IO_MAXT) Tt = IO_MAXT;
    for (b = 0; b < B; b++) {
        d->lens[b] = lm ? T : T - (int)((step + (uint64_t)b) % 3u);
        if (d->lens[b] < 1) d->lens[b] = 1;
        for (t = 0; t < T; t++)
            d->tokens[b * T + t] = t < d->lens[b] ? 1 + io_rand(&r, c->vocab_size - 1) : 0;
    }
    if (c->kind == TFM_MODEL_ENCODER_CLASSIFIER) {
        for (b = 0; b < B; b++) d->targets[b] = io_rand(&r, c->n_classes);
    } else if (lm) {
        for (b = 0; b < B; b++)
            for (t = 0; t < T; t++)
                d->targets[b * T + t] = t + 1 < T ? d->tokens[b * T + t + 1] : io_rand(&r, c->vocab_size);
        if (step % 2 == 0) d->targets[B * T - 1] = c->ignore_index;
    } else {
        for (b = 0; b < B; b++)
            for (t = 0; t < Tt; t++) {
                d->targets[b * Tt + t] = io_rand(&r, c->tgt_vocab_size);
                d->tgt_in[b * Tt + t] = t == 0 ? 1 : d->targets[b * Tt + t - 1];
            }
        d->targets[B * Tt - 1] = c->ignore_index;
    }
    d->B = B;
    d->T = T;
    d->Tt = Tt;
    d->b.batch = B;
    d->b.len = T;
    d->b.tokens = d->tokens;
    d->b.lens = lm ? NULL : d->lens;
    d->b.tgt_len = Tt;
    d->b.tgt_in = ed ? d->tgt_in : NULL;
    d->b.targets = d->targets;
}

static int io_init(tfm_model *m, const tfm_config *c, const char *what) {
    tfm_result r = tfm_model_init(m, c, NULL, 0);
    if (r != TFM_OK) {
        TEST__FAIL("%s: tfm_model_init: %s", what, tfm_last_error());
        memset(m, 0, sizeof *m);
        return 0;
    }
    return 1;
}

/* One training step on the batch of `step`: zero_grad, forward, backward, AdamW. */
static int io_step(tfm_model *m, const tfm_optim *o, uint64_t step, float *loss) {
    io_batch d;
    float l = 0.0f;
    io_make_batch(&d, &m->cfg, step);
    tfm_model_zero_grad(m);
    if (tfm_model_forward(m, &d.b, &l, NULL) != TFM_OK || tfm_model_backward(m, 1.0f) != TFM_OK ||
        tfm_model_step(m, o, NULL) != TFM_OK) {
        TEST__FAIL("training step %d: %s", (int)step, tfm_last_error());
        return 0;
    }
    if (loss) *loss = l;
    return 1;
}

static int io_train(tfm_model *m, const tfm_optim *o, uint64_t first, int n, float *losses) {
    int i;
    for (i = 0; i < n; i++)
        if (!io_step(m, o, first + (uint64_t)i, losses ? &losses[i] : NULL)) return 0;
    return 1;
}

/* Eval-mode logits of the batch of `step` (a new malloc'd copy, *n floats; NULL and a failure if
   forward fails). The model's training mode is restored afterwards. */
static float *io_logits(tfm_model *m, uint64_t step, int64_t *n, float *loss) {
    io_batch d;
    tfm_tensor t;
    float *out;
    int training = m->impl->training;
    tfm_result r;
    io_make_batch(&d, &m->cfg, step);
    tfm_model_train(m, 0);
    r = tfm_model_forward(m, &d.b, loss, NULL);
    tfm_model_train(m, training);
    *n = 0;
    if (r != TFM_OK) {
        TEST__FAIL("forward: %s", tfm_last_error());
        return NULL;
    }
    t = tfm_model_logits(m);
    *n = tfm_numel(&t);
    out = (float *)malloc((size_t)(*n > 0 ? *n : 1) * sizeof(float));
    if (out && *n) memcpy(out, t.data, (size_t)*n * sizeof(float));
    return out;
}

/* Both models' eval logits on the batch of `step` are bit-identical. */
static int io_same_logits(tfm_model *a, tfm_model *b, uint64_t step) {
    int64_t na, nb;
    float la = 0, lb = 0;
    float *ga = io_logits(a, step, &na, &la), *gb = io_logits(b, step, &nb, &lb);
    int same = ga && gb && na == nb && na > 0 && !memcmp(ga, gb, (size_t)na * sizeof(float)) &&
               !memcmp(&la, &lb, sizeof la);
    free(ga);
    free(gb);
    return same;
}

/* The name of the first parameter whose bytes differ between a and b, or NULL when all agree. */
static const char *io_params_diff(const tfm_model *a, const tfm_model *b) {
    int i;
    if (a->n_params != b->n_params) return "(the parameter count)";
    for (i = 0; i < a->n_params; i++) {
        const tfm_param *p = &a->params[i];
        const tfm_param *q = tfm_model_param(b, p->name);
        int64_t n = tfm_numel(&p->value);
        if (!q || tfm_numel(&q->value) != n || q->value.ndim != p->value.ndim ||
            memcmp(p->value.data, q->value.data, (size_t)n * sizeof(float)))
            return p->name;
    }
    return NULL;
}

/* The AdamW moments of p (kind 1: exp_avg, 2: exp_avg_sq). */
static const float *io_moment(const tfm_model *m, const tfm_param *p, int kind) {
    return tfm__model_moment(m, p, kind);
}

/* First parameter whose moments differ (or NULL). */
static const char *io_moments_diff(const tfm_model *a, const tfm_model *b) {
    int i, kind;
    if (a->n_params != b->n_params || !tfm__model_trains(a) || !tfm__model_trains(b)) return "(the models)";
    for (i = 0; i < a->n_params; i++) {
        const tfm_param *p = &a->params[i];
        const tfm_param *q = tfm_model_param(b, p->name);
        size_t bytes = (size_t)tfm_numel(&p->value) * sizeof(float);
        if (!q) return p->name;
        for (kind = 1; kind <= 2; kind++)
            if (memcmp(io_moment(a, p, kind), io_moment(b, q, kind), bytes)) return p->name;
    }
    return NULL;
}

/* Every moment of m is zero. */
static int io_moments_zero(const tfm_model *m) {
    int i, kind;
    int64_t j;
    for (i = 0; i < m->n_params; i++)
        for (kind = 1; kind <= 2; kind++) {
            const float *v = io_moment(m, &m->params[i], kind);
            for (j = 0; j < tfm_numel(&m->params[i].value); j++)
                if (v[j] != 0.0f) return 0;
        }
    return 1;
}

/* All parameters, concatenated in registry order (malloc'd). */
static float *io_snapshot(const tfm_model *m) {
    int64_t total = 0, at = 0;
    int i;
    float *s;
    for (i = 0; i < m->n_params; i++) total += tfm_numel(&m->params[i].value);
    s = (float *)malloc((size_t)(total > 0 ? total : 1) * sizeof(float));
    if (!s) return NULL;
    for (i = 0; i < m->n_params; i++) {
        int64_t n = tfm_numel(&m->params[i].value);
        memcpy(s + at, m->params[i].value.data, (size_t)n * sizeof(float));
        at += n;
    }
    return s;
}

/* First parameter of m that differs from the snapshot (or NULL). */
static const char *io_snapshot_diff(const tfm_model *m, const float *s) {
    int64_t at = 0;
    int i;
    if (!s) return "(no snapshot)";
    for (i = 0; i < m->n_params; i++) {
        int64_t n = tfm_numel(&m->params[i].value);
        if (memcmp(s + at, m->params[i].value.data, (size_t)n * sizeof(float))) return m->params[i].name;
        at += n;
    }
    return NULL;
}

/* The first config field that differs (exact comparison), or NULL. */
#define IO_CFG_FIELDS(X)                                                                           \
    X(kind) X(vocab_size) X(tgt_vocab_size) X(n_classes) X(d_model) X(n_heads) X(n_layers)          \
    X(n_dec_layers) X(d_ff) X(max_len) X(max_tgt_len) X(max_batch) X(act) X(norm_first) X(pos)  \
    X(scale_emb) X(pool) X(tie_output) X(share_emb) X(no_bias) X(dropout) X(attn_dropout) X(ln_eps) \
    X(label_smoothing) X(ignore_index) X(has_ignore_index) X(init) X(init_std) X(seed)               \
    X(inference_only) X(last_logits) X(norm)
static const char *io_cfg_diff(const tfm_config *a, const tfm_config *b) {
#define IO_CMP(f) \
    if (a->f != b->f) return #f;
    IO_CFG_FIELDS(IO_CMP)
#undef IO_CMP
    return NULL;
}

/* The header of the checkpoint at path (free it with tfm__st_header_free). */
static tfm_result io_read_header(const char *path, tfm__st_header *h) { return tfm__st_load(path, NULL, 0, NULL, 0, 1, h); }

/* Tensors in a checkpoint whose names start with "optim." (-1 if the header cannot be read). */
static int io_count_optim(const char *path, int *n_tensors) {
    tfm__st_header h;
    int i, n = 0;
    if (io_read_header(path, &h) != TFM_OK) return -1;
    for (i = 0; i < h.n; i++)
        if (!strncmp(h.entries[i].name, "optim.", 6)) n++;
    if (n_tensors) *n_tensors = h.n;
    tfm__st_header_free(&h);
    return n;
}

/* ---- 1. round trips ------------------------------------------------------------------------- */

static void io_roundtrip_case(int k, int flags) {
    char what[96], name[64];
    const char *path, *d;
    tfm_model m, m2;
    tfm_config lc, c = io_cfg(k);
    tfm_optim o = io_opt(0);
    int n_tensors = 0;
    snprintf(what, sizeof what, "%s, %s", io_kind_name[k], flags ? "training state" : "weights only");
    snprintf(name, sizeof name, "rt_%s_%d.safetensors", io_kind_name[k], flags);
    path = io_path(name);
    c.dropout = 0.1f;
    if (!io_init(&m, &c, what)) return;
    if (!io_train(&m, &o, 0, 3, NULL)) {
        tfm_model_free(&m);
        return;
    }
    CHECK_OK(tfm_model_save(&m, path, flags, NULL, 0));
    /* the file: one tensor per parameter, plus the two moments of each with the training state */
    CHECK_MSG(io_count_optim(path, &n_tensors) == (flags ? 2 * m.n_params : 0) &&
                  n_tensors == (flags ? 3 : 1) * m.n_params,
              "%s: %d tensors, %d parameters", what, n_tensors, m.n_params);
    /* the config comes back whole */
    memset(&lc, 0xA5, sizeof lc);
    CHECK_OK(tfm_config_load(path, &lc));
    d = io_cfg_diff(&lc, &m.cfg);
    CHECK_MSG(d == NULL, "%s: tfm_config_load gives a different %s", what, d);
    /* a fresh model from it, initialised differently, takes the file's weights */
    lc.seed += 1000;
    if (!io_init(&m2, &lc, what)) {
        tfm_model_free(&m);
        return;
    }
    CHECK_MSG(io_params_diff(&m, &m2) != NULL, "%s: the fresh model already has the weights", what);
    CHECK_OK(tfm_model_load(&m2, path));
    d = io_params_diff(&m, &m2);
    CHECK_MSG(d == NULL, "%s: parameter %s differs after loading", what, d);
    CHECK_MSG(io_same_logits(&m, &m2, 77), "%s: logits differ after loading", what);
    if (flags) {
        /* the step and the generator's four words are in the metadata */
        tfm__st_header h;
        if (io_read_header(path, &h) == TFM_OK) {
            const char *st = tfm__st_meta_get(&h, "tfm.step"), *rs = tfm__st_meta_get(&h, "tfm.rng");
            char want[80];
            snprintf(want, sizeof want, "%016llx%016llx%016llx%016llx", (unsigned long long)tfm__model_rng(&m)->s[0],
                     (unsigned long long)tfm__model_rng(&m)->s[1], (unsigned long long)tfm__model_rng(&m)->s[2],
                     (unsigned long long)tfm__model_rng(&m)->s[3]);
            CHECK_MSG(st && !strcmp(st, "3"), "%s: tfm.step is %s, want 3", what, st ? st : "absent");
            CHECK_MSG(rs && !strcmp(rs, want), "%s: tfm.rng is \"%s\" (%d characters), want \"%s\"", what,
                      rs ? rs : "", rs ? (int)strlen(rs) : 0, want);
            tfm__st_header_free(&h);
        } else {
            TEST__FAIL("%s: %s", what, tfm_last_error());
        }
        CHECK_MSG(m2.step == 3, "%s: step %lld, want 3", what, (long long)m2.step);
        CHECK_MSG(!memcmp(tfm__model_rng(&m2)->s, tfm__model_rng(&m)->s, sizeof(uint64_t[4])), "%s: the random generator differs", what);
        d = io_moments_diff(&m, &m2);
        CHECK_MSG(d == NULL, "%s: the moments of %s differ", what, d);
    } else {
        CHECK_MSG(m2.step == 0, "%s: step %lld after a weights-only load", what, (long long)m2.step);
        CHECK_MSG(io_moments_zero(&m2), "%s: a weights-only load set moments", what);
    }
    tfm_model_free(&m2);
    tfm_model_free(&m);
    remove(path);
}

static void io_roundtrip(void) {
    int k;
    for (k = 0; k < 3; k++) {
        io_roundtrip_case(k, 0);
        io_roundtrip_case(k, TFM_SAVE_TRAINING_STATE);
    }
}

/* ---- 2. resume ------------------------------------------------------------------------------ */

#define IO_N 8

static void io_resume_case(int k, int cosine) {
    char what[96], name[64], name_w[64];
    const char *path, *path_w, *d;
    tfm_model a, b, r;
    tfm_config c = io_cfg(k), c2;
    tfm_optim o = io_opt(cosine);
    float la[IO_N], lb[IO_N];
    snprintf(what, sizeof what, "%s, %s schedule", io_kind_name[k], cosine ? "cosine" : "constant");
    snprintf(name, sizeof name, "resume_%s_%d.safetensors", io_kind_name[k], cosine);
    snprintf(name_w, sizeof name_w, "resume_w_%s_%d.safetensors", io_kind_name[k], cosine);
    path = io_path(name);
    path_w = io_path(name_w);
    c.dropout = 0.1f;
    c.attn_dropout = 0.15f;
    c2 = c;
    c2.seed = c.seed + 99; /* the resumed model starts from other weights and another generator */
    memset(la, 0, sizeof la);
    memset(lb, 0, sizeof lb);

    /* straight through */
    if (!io_init(&a, &c, what)) return;
    if (!io_train(&a, &o, 0, IO_N, la)) {
        tfm_model_free(&a);
        return;
    }
    /* half, saved with the training state (and weights only, for the control) */
    if (!io_init(&b, &c, what)) {
        tfm_model_free(&a);
        return;
    }
    if (io_train(&b, &o, 0, IO_N / 2, lb)) {
        CHECK_OK(tfm_model_save(&b, path, TFM_SAVE_TRAINING_STATE, NULL, 0));
        CHECK_OK(tfm_model_save(&b, path_w, 0, NULL, 0));
    }
    tfm_model_free(&b);
    CHECK_MSG(!memcmp(la, lb, sizeof(float) * (IO_N / 2)), "%s: the first half differs", what);

    /* resumed in a fresh model */
    if (io_init(&r, &c2, what)) {
        CHECK_OK(tfm_model_load(&r, path));
        CHECK_MSG(r.step == IO_N / 2, "%s: step %lld after loading, want %d", what, (long long)r.step, IO_N / 2);
        if (io_train(&r, &o, IO_N / 2, IO_N / 2, lb + IO_N / 2)) {
            int s;
            for (s = IO_N / 2; s < IO_N; s++)
                CHECK_MSG(!memcmp(&la[s], &lb[s], sizeof(float)), "%s: loss of step %d is %.9g, want %.9g",
                          what, s, (double)lb[s], (double)la[s]);
            d = io_params_diff(&a, &r);
            CHECK_MSG(d == NULL, "%s: final parameter %s differs", what, d);
            CHECK_MSG(r.step == IO_N, "%s: final step %lld", what, (long long)r.step);
        }
        tfm_model_free(&r);
    }

    /* controls: the comparison above can fail */
    if (io_init(&r, &c2, what)) { /* weights only: no moments, no step, another generator */
        CHECK_OK(tfm_model_load(&r, path_w));
        if (io_train(&r, &o, IO_N / 2, IO_N / 2, NULL))
            CHECK_MSG(io_params_diff(&a, &r) != NULL, "%s: resuming from the weights alone ends the same", what);
        tfm_model_free(&r);
    }
    if (cosine && io_init(&r, &c2, what)) { /* everything but the step count */
        CHECK_OK(tfm_model_load(&r, path));
        r.step = 0;
        if (io_train(&r, &o, IO_N / 2, IO_N / 2, NULL))
            CHECK_MSG(io_params_diff(&a, &r) != NULL, "%s: the schedule ignores the step count", what);
        tfm_model_free(&r);
    }
    tfm_model_free(&a);
    remove(path);
    remove(path_w);
}

static void io_resume(void) {
    int k;
    for (k = 0; k < 3; k++) {
        io_resume_case(k, 0);
        io_resume_case(k, 1);
    }
}

/* ---- 3. interrupted saves ------------------------------------------------------------------- */

static int io_hook_stage = -1, io_hook_nth = 0, io_hook_errno = 0;
static int io_hook_seen[TFM__ST_STAGE_COUNT];

static int io_hook(int stage) {
    int k;
    if (stage < 0 || stage >= TFM__ST_STAGE_COUNT) return EINVAL;
    k = io_hook_seen[stage]++;
    return stage == io_hook_stage && k == io_hook_nth ? io_hook_errno : 0;
}

static void io_hook_arm(int stage, int nth, int err) {
    memset(io_hook_seen, 0, sizeof io_hook_seen);
    io_hook_stage = stage;
    io_hook_nth = nth;
    io_hook_errno = err;
    tfm__st_write_hook = io_hook;
}

static void io_interrupted(void) {
    static const char *const stage_names[TFM__ST_STAGE_COUNT] = {"open", "write", "flush", "sync",
                                                                 "close", "rename", "syncdir"};
    const char *path = io_path("ckpt.safetensors"), *d;
    tfm_config c = io_cfg(2);
    tfm_optim o = io_opt(0);
    tfm_model m, l;
    unsigned char *old;
    size_t old_size;
    float *snap_a = NULL;
    int n_writes, i, cases[12][2], n_cases = 0;
    if (!io_init(&m, &c, "interrupted")) return;
    if (!io_train(&m, &o, 0, 2, NULL)) {
        tfm_model_free(&m);
        return;
    }
    /* checkpoint A */
    CHECK_OK(tfm_model_save(&m, path, TFM_SAVE_TRAINING_STATE, NULL, 0));
    old = io_read(path, &old_size);
    snap_a = io_snapshot(&m);
    /* the model moves on to B */
    io_train(&m, &o, 2, 2, NULL);
    CHECK(io_snapshot_diff(&m, snap_a) != NULL);
    /* how often a save of B visits each stage */
    io_hook_arm(-1, 0, 0);
    CHECK_OK(tfm_model_save(&m, io_path("count.safetensors"), TFM_SAVE_TRAINING_STATE, NULL, 0));
    tfm__st_write_hook = NULL;
    remove(io_path("count.safetensors"));
    n_writes = io_hook_seen[TFM__ST_STAGE_WRITE];
    CHECK_MSG(n_writes == 2 + 3 * m.n_params, "%d writes for %d parameters", n_writes, m.n_params);
    CHECK(io_hook_seen[TFM__ST_STAGE_OPEN] == 1 && io_hook_seen[TFM__ST_STAGE_RENAME] == 1);
    if (!old || !snap_a || n_writes < 6) {
        TEST__FAIL("interrupted: setup failed");
        free(old);
        free(snap_a);
        tfm_model_free(&m);
        return;
    }
    /* stage, occurrence */
    cases[n_cases][0] = TFM__ST_STAGE_OPEN, cases[n_cases++][1] = 0;
    cases[n_cases][0] = TFM__ST_STAGE_WRITE, cases[n_cases++][1] = 0;            /* header length */
    cases[n_cases][0] = TFM__ST_STAGE_WRITE, cases[n_cases++][1] = 1;            /* header */
    cases[n_cases][0] = TFM__ST_STAGE_WRITE, cases[n_cases++][1] = 2;            /* first tensor */
    cases[n_cases][0] = TFM__ST_STAGE_WRITE, cases[n_cases++][1] = n_writes / 2; /* a later one */
    cases[n_cases][0] = TFM__ST_STAGE_WRITE, cases[n_cases++][1] = n_writes - 1; /* the last */
    cases[n_cases][0] = TFM__ST_STAGE_FLUSH, cases[n_cases++][1] = 0;
    cases[n_cases][0] = TFM__ST_STAGE_SYNC, cases[n_cases++][1] = 0;
    cases[n_cases][0] = TFM__ST_STAGE_CLOSE, cases[n_cases++][1] = 0;
    cases[n_cases][0] = TFM__ST_STAGE_RENAME, cases[n_cases++][1] = 0;
    for (i = 0; i < n_cases; i++) {
        int stage = cases[i][0], nth = cases[i][1], err = i % 2 ? EIO : ENOSPC;
        tfm_result r;
        io_hook_arm(stage, nth, err);
        tfm_clear_error();
        r = tfm_model_save(&m, path, TFM_SAVE_TRAINING_STATE, NULL, 0);
        tfm__st_write_hook = NULL;
        CHECK_MSG(io_hook_seen[stage] > nth, "%s #%d: the stage was not reached", stage_names[stage], nth);
        CHECK_MSG(r == TFM_E_IO, "%s #%d: got %d (%s)", stage_names[stage], nth, (int)r, tfm_last_error());
        CHECK_MSG(!strncmp(tfm_last_error(), "tfm_model_save: ", 16) && strstr(tfm_last_error(), path) &&
                      strstr(tfm_last_error(), strerror(err)) && strstr(tfm_last_error(), "is unchanged"),
                  "%s #%d: message: %s", stage_names[stage], nth, tfm_last_error());
        CHECK_MSG(io_same_file(path, old, old_size), "%s #%d: checkpoint A changed", stage_names[stage], nth);
        CHECK_MSG(io_count_tmp() <= 0, "%s #%d: a temporary file was left", stage_names[stage], nth);
        if (io_init(&l, &c, "interrupted")) {
            CHECK_OK(tfm_model_load(&l, path));
            d = io_snapshot_diff(&l, snap_a);
            CHECK_MSG(d == NULL, "%s #%d: %s is not A's", stage_names[stage], nth, d);
            CHECK_MSG(l.step == 2, "%s #%d: step %lld, want A's 2", stage_names[stage], nth, (long long)l.step);
            tfm_model_free(&l);
        }
    }
    /* the directory sync comes after the rename: B is in place, and the caller is told */
    io_hook_arm(TFM__ST_STAGE_SYNCDIR, 0, EIO);
    CHECK_ERR(tfm_model_save(&m, path, TFM_SAVE_TRAINING_STATE, NULL, 0), TFM_E_IO, "the file was replaced");
    tfm__st_write_hook = NULL;
    CHECK(io_count_tmp() <= 0);
    if (io_init(&l, &c, "interrupted")) {
        CHECK_OK(tfm_model_load(&l, path));
        d = io_params_diff(&m, &l);
        CHECK_MSG(d == NULL, "syncdir: %s is not B's", d);
        tfm_model_free(&l);
    }
    /* and with nothing injected, B replaces A */
    CHECK_OK(tfm_model_save(&m, path, 0, NULL, 0));
    CHECK(!io_same_file(path, old, old_size));
    tfm__st_write_hook = NULL;
    free(old);
    free(snap_a);
    tfm_model_free(&m);
    remove(path);
}

/* ---- 4. load errors ------------------------------------------------------------------------- */

/* Metadata as an editable list of key/value pairs (values copied; keys are literals or point into
   a header that outlives the list). */
#define IO_MAX_META 64
typedef struct io_meta {
    const char *kv[2 * IO_MAX_META];
    char val[IO_MAX_META][96];
    int n;
} io_meta;

/* Take the metadata of the checkpoint at path; *h keeps its strings (free it afterwards). */
static int io_meta_from(io_meta *mt, const char *path, tfm__st_header *h) {
    int i;
    memset(mt, 0, sizeof *mt);
    if (io_read_header(path, h) != TFM_OK) {
        TEST__FAIL("reading the header of %s: %s", path, tfm_last_error());
        return 0;
    }
    for (i = 0; i < h->n_meta && i < IO_MAX_META; i++) {
        snprintf(mt->val[i], sizeof mt->val[i], "%s", h->meta_kv[2 * i + 1]);
        mt->kv[2 * i] = h->meta_kv[2 * i];
        mt->kv[2 * i + 1] = mt->val[i];
    }
    mt->n = i;
    return 1;
}

/* Set key to value (NULL: remove the key). */
static void io_meta_set(io_meta *mt, const char *key, const char *value) {
    int i, j;
    for (i = 0; i < mt->n; i++)
        if (!strcmp(mt->kv[2 * i], key)) break;
    if (!value) {
        if (i == mt->n) return;
        for (j = i; j + 1 < mt->n; j++) {
            mt->kv[2 * j] = mt->kv[2 * j + 2];
            memcpy(mt->val[j], mt->val[j + 1], sizeof mt->val[j]);
            mt->kv[2 * j + 1] = mt->val[j];
        }
        mt->n--;
        return;
    }
    if (i == mt->n) {
        if (mt->n == IO_MAX_META) return;
        mt->kv[2 * i] = key;
        mt->n++;
    }
    snprintf(mt->val[i], sizeof mt->val[i], "%s", value);
    mt->kv[2 * i + 1] = mt->val[i];
}

/* Write m's parameters (and with `state` its moments) with tfm__st_save, as tfm_model_save lays
   them out, but with the tensor `omit` left out, a 1-D tensor `extra` of 3 floats added at the end,
   and the 2-D tensor `reshape` stored transposed; mt may be NULL (no metadata). */
static tfm_result io_save_custom(const char *path, const tfm_model *m, int state, const io_meta *mt,
                                 const char *omit, const char *extra, const char *reshape) {
    static float three[3] = {1.0f, 2.0f, 3.0f};
    int n = m->n_params * (state ? 3 : 1) + 1, i, kind, k = 0;
    tfm__st_tensor *items = (tfm__st_tensor *)calloc((size_t)n, sizeof *items);
    char *names = (char *)calloc((size_t)n, 96);
    tfm_result r;
    if (!items || !names) {
        free(items);
        free(names);
        return TFM_E_NOMEM;
    }
    for (i = 0; i < m->n_params; i++) {
        const tfm_param *p = &m->params[i];
        for (kind = 0; kind < (state ? 3 : 1); kind++) {
            tfm__st_tensor *it = &items[k];
            char *nm = names + (size_t)k * 96;
            int d;
            snprintf(nm, 96, "%s%s", kind == 0 ? "" : kind == 1 ? "optim.exp_avg." : "optim.exp_avg_sq.", p->name);
            if (omit && !strcmp(nm, omit)) continue;
            it->name = nm;
            it->ndim = p->value.ndim;
            for (d = 0; d < p->value.ndim; d++) it->shape[d] = p->value.shape[d];
            if (reshape && !strcmp(nm, reshape) && it->ndim == 2) {
                it->shape[0] = p->value.shape[1];
                it->shape[1] = p->value.shape[0];
            }
            it->data = kind == 0 ? p->value.data : tfm__model_moment(m, p, kind);
            k++;
        }
    }
    if (extra) {
        items[k].name = extra;
        items[k].ndim = 1;
        items[k].shape[0] = 3;
        items[k].data = three;
        k++;
    }
    r = tfm__st_save(path, items, k, mt ? mt->kv : NULL, mt ? mt->n : 0);
    free(items);
    free(names);
    return r;
}

/* Architecture mismatches name the field; other config differences are allowed. */
static void io_errors_arch(void) {
    const char *path = io_path("arch.safetensors");
    tfm_config c, c2;
    tfm_model m, m2;
    struct {
        const char *field;
        int change;
    } cases[7];
    int i, n = 0;
    c = io_cfg(1);
    c.d_model = 16;
    if (!io_init(&m, &c, "arch")) return;
    CHECK_OK(tfm_model_save(&m, path, 0, NULL, 0));
    cases[n].field = "d_model 16 but the model has 32", cases[n++].change = 0;
    cases[n].field = "n_layers 2 but the model has 1", cases[n++].change = 1;
    cases[n].field = "act 0 but the model has 1", cases[n++].change = 2;
    cases[n].field = "norm_first 1 but the model has 0", cases[n++].change = 3;
    cases[n].field = "tie_output 1 but the model has 0", cases[n++].change = 4;
    cases[n].field = "vocab_size 13 but the model has 14", cases[n++].change = 5;
    cases[n].field = "norm 0 but the model has 1", cases[n++].change = 6;
    for (i = 0; i < n; i++) {
        c2 = c;
        switch (cases[i].change) {
        case 0: c2.d_model = 32; break;
        case 1: c2.n_layers = 1; break;
        case 2: c2.act = TFM_ACT_GELU; break;
        case 3: c2.norm_first = 0; break;
        case 4: c2.tie_output = 0; break;
        case 5: c2.vocab_size = 14; break;
        default: c2.norm = TFM_NORM_RMS; break;
        }
        if (!io_init(&m2, &c2, cases[i].field)) continue;
        CHECK_ERR(tfm_model_load(&m2, path), TFM_E_FORMAT, cases[i].field);
        CHECK(strstr(tfm_last_error(), path) != NULL);
        tfm_model_free(&m2);
    }
    /* an RMSNorm model: its config loads with the norm, and its weights load into a model built from it */
    c2 = c;
    c2.norm = TFM_NORM_RMS;
    if (io_init(&m2, &c2, "rmsnorm")) {
        const char *rpath = io_path("arch_rms.safetensors");
        tfm_config lc;
        tfm_model m3;
        CHECK_OK(tfm_model_save(&m2, rpath, 0, NULL, 0));
        CHECK_OK(tfm_config_load(rpath, &lc));
        CHECK(lc.norm == TFM_NORM_RMS);
        lc.seed += 1;
        if (io_init(&m3, &lc, "rmsnorm from its config")) {
            CHECK_OK(tfm_model_load(&m3, rpath));
            tfm_model_free(&m3);
        }
        CHECK_ERR(tfm_model_load(&m, rpath), TFM_E_FORMAT, "norm 1 but the model has 0");
        tfm_model_free(&m2);
    }
    /* rotary positions: a model without them writes no tfm.rope_* key (its file is what it was); a rotary
       model's config loads with both fields and builds a model its weights load into; each field is
       architecture */
    {
        io_meta mt;
        tfm__st_header h;
        int k, named = 0;
        if (io_meta_from(&mt, path, &h)) {
            for (k = 0; k < mt.n; k++) named |= !strncmp(mt.kv[2 * k], "tfm.rope", 8);
            tfm__st_header_free(&h);
        }
        CHECK_MSG(!named, "a model without rotary positions saved a tfm.rope_* key");
    }
    c2 = c;
    c2.pos = TFM_POS_ROPE;
    c2.rope_dims = 2;
    c2.rope_base = 500.0f;
    if (io_init(&m2, &c2, "rope")) {
        const char *rpath = io_path("arch_rope.safetensors");
        tfm_config lc;
        tfm_model m3;
        CHECK_OK(tfm_model_save(&m2, rpath, 0, NULL, 0));
        CHECK_OK(tfm_config_load(rpath, &lc));
        CHECK(lc.pos == TFM_POS_ROPE && lc.rope_dims == 2 && lc.rope_base == 500.0f);
        lc.seed += 1;
        if (io_init(&m3, &lc, "rope from its config")) {
            CHECK_OK(tfm_model_load(&m3, rpath));
            CHECK(io_params_diff(&m2, &m3) == NULL);
            tfm_model_free(&m3);
        }
        lc.rope_base = 10000.0f;
        if (io_init(&m3, &lc, "rope, another base")) {
            CHECK_ERR(tfm_model_load(&m3, rpath), TFM_E_FORMAT, "rope_base 500 but the model has 10000");
            tfm_model_free(&m3);
        }
        lc.rope_base = 500.0f;
        lc.rope_dims = 0; /* the head size, 8 */
        if (io_init(&m3, &lc, "rope, all channels")) {
            CHECK_ERR(tfm_model_load(&m3, rpath), TFM_E_FORMAT, "rope_dims 2 but the model has 8");
            tfm_model_free(&m3);
        }
        CHECK_ERR(tfm_model_load(&m, rpath), TFM_E_FORMAT, "pos 3 but the model has 0");
        tfm_model_free(&m2);
        remove(rpath);
    }
    /* grouped-query attention: no tfm.n_kv_heads key without it; a multi-query model's config loads with the
       field and builds a model its weights load into; the field is architecture */
    {
        io_meta mt;
        tfm__st_header h;
        int k, named = 0;
        if (io_meta_from(&mt, path, &h)) {
            for (k = 0; k < mt.n; k++) named |= !strcmp(mt.kv[2 * k], "tfm.n_kv_heads");
            tfm__st_header_free(&h);
        }
        CHECK_MSG(!named, "a model without grouped-query attention saved tfm.n_kv_heads");
    }
    c2 = c;
    c2.n_kv_heads = 1;
    if (io_init(&m2, &c2, "multi-query")) {
        const char *gpath = io_path("arch_gqa.safetensors");
        tfm_config lc;
        tfm_model m3;
        CHECK_OK(tfm_model_save(&m2, gpath, 0, NULL, 0));
        CHECK_OK(tfm_config_load(gpath, &lc));
        CHECK(lc.n_kv_heads == 1);
        lc.seed += 1;
        if (io_init(&m3, &lc, "multi-query from its config")) {
            CHECK_OK(tfm_model_load(&m3, gpath));
            CHECK(io_params_diff(&m2, &m3) == NULL);
            tfm_model_free(&m3);
        }
        CHECK_ERR(tfm_model_load(&m, gpath), TFM_E_FORMAT, "n_kv_heads 1 but the model has 0");
        tfm_model_free(&m2);
        remove(gpath);
    }
    /* a sliding window: no tfm.attn_window or attn_sinks key without one; with one, both fields load and are architecture */
    {
        io_meta mt;
        tfm__st_header h;
        int k, named = 0;
        if (io_meta_from(&mt, path, &h)) {
            for (k = 0; k < mt.n; k++)
                named |= !strcmp(mt.kv[2 * k], "tfm.attn_window") || !strcmp(mt.kv[2 * k], "tfm.attn_sinks");
            tfm__st_header_free(&h);
        }
        CHECK_MSG(!named, "a model without a window saved tfm.attn_window or tfm.attn_sinks");
    }
    c2 = c; /* an LM */
    c2.attn_window = 3;
    c2.attn_sinks = 1;
    if (io_init(&m2, &c2, "window")) {
        const char *wpath = io_path("arch_window.safetensors");
        tfm_config lc;
        tfm_model m3;
        CHECK_OK(tfm_model_save(&m2, wpath, 0, NULL, 0));
        CHECK_OK(tfm_config_load(wpath, &lc));
        CHECK(lc.attn_window == 3 && lc.attn_sinks == 1);
        lc.seed += 1;
        if (io_init(&m3, &lc, "window from its config")) {
            CHECK_OK(tfm_model_load(&m3, wpath));
            CHECK(io_params_diff(&m2, &m3) == NULL);
            tfm_model_free(&m3);
        }
        lc.attn_sinks = 0;
        if (io_init(&m3, &lc, "window, no sinks")) {
            CHECK_ERR(tfm_model_load(&m3, wpath), TFM_E_FORMAT, "attn_sinks 1 but the model has 0");
            tfm_model_free(&m3);
        }
        lc.attn_window = lc.attn_sinks = 0;
        if (io_init(&m3, &lc, "no window")) {
            CHECK_ERR(tfm_model_load(&m3, wpath), TFM_E_FORMAT, "attn_window 3 but the model has 0");
            tfm_model_free(&m3);
        }
        tfm_model_free(&m2);
        remove(wpath);
    }
    /* another kind */
    c2 = io_cfg(0);
    c2.vocab_size = c.vocab_size;
    c2.d_model = c.d_model;
    if (io_init(&m2, &c2, "kind")) {
        CHECK_ERR(tfm_model_load(&m2, path), TFM_E_FORMAT, "kind 2 but the model has 1");
        tfm_model_free(&m2);
    }
    /* max_len is not compared as such, but learned positions have one row per position */
    c2 = c;
    c2.max_len = 4;
    if (io_init(&m2, &c2, "max_len")) {
        CHECK_ERR(tfm_model_load(&m2, path), TFM_E_FORMAT, "'pos_emb.weight' is (6,16) in the file but (4,16)");
        tfm_model_free(&m2);
    }
    /* the batch size, dropout, smoothing and the seed are the caller's choice */
    c2 = c;
    c2.max_batch = 1;
    c2.dropout = 0.3f;
    c2.label_smoothing = 0.2f;
    c2.seed = 5;
    if (io_init(&m2, &c2, "non-architecture fields")) {
        CHECK_OK(tfm_model_load(&m2, path));
        CHECK(io_params_diff(&m, &m2) == NULL);
        tfm_model_free(&m2);
    }
    tfm_model_free(&m);
    remove(path);
}

/* Missing files, truncated files, config-less files, bad metadata values. */
static void io_errors_file(void) {
    const char *path = io_path("good.safetensors"), *cut = io_path("cut.safetensors");
    const char *none = io_path("no_such_file.safetensors");
    tfm_config c = io_cfg(0), lc;
    tfm_optim o = io_opt(0);
    tfm_model m, m2;
    unsigned char *bytes;
    size_t size, hlen, cuts[12];
    int i, n_cuts = 0;
    io_meta mt;
    tfm__st_header h;
    if (!io_init(&m, &c, "file errors")) return;
    io_train(&m, &o, 0, 1, NULL);
    CHECK_OK(tfm_model_save(&m, path, TFM_SAVE_TRAINING_STATE, NULL, 0));
    if (!io_init(&m2, &c, "file errors")) {
        tfm_model_free(&m);
        return;
    }
    /* no file */
    remove(none);
    CHECK_ERR(tfm_model_load(&m2, none), TFM_E_IO, none);
    CHECK_ERR(tfm_config_load(none, &lc), TFM_E_IO, none);
    CHECK(strstr(tfm_last_error(), strerror(ENOENT)) != NULL);
    /* a directory */
#if defined(IO_POSIX)
    CHECK_ERR(tfm_model_load(&m2, io_dir), TFM_E_IO, io_dir);
#endif

    /* truncated copies */
    bytes = io_read(path, &size);
    CHECK(bytes != NULL && size > 64);
    if (bytes && size > 64) {
        for (hlen = 0, i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i]; /* the header length */
        cuts[n_cuts++] = 0;
        cuts[n_cuts++] = 1;
        cuts[n_cuts++] = 7;
        cuts[n_cuts++] = 8;                    /* the length alone */
        cuts[n_cuts++] = 8 + hlen / 2;         /* inside the JSON */
        cuts[n_cuts++] = 8 + hlen - 1;         /* one byte short of the header */
        cuts[n_cuts++] = 8 + hlen;             /* the header, no data */
        cuts[n_cuts++] = 8 + hlen + 2;         /* inside the first float */
        cuts[n_cuts++] = 8 + hlen + (size - 8 - hlen) / 2;
        cuts[n_cuts++] = size - 4;             /* one float short */
        cuts[n_cuts++] = size - 1;
        for (i = 0; i < n_cuts; i++) {
            char at[64];
            tfm_result r;
            CHECK(io_write(cut, bytes, cuts[i]));
            snprintf(at, sizeof at, "cut at %lu of %lu", (unsigned long)cuts[i], (unsigned long)size);
            tfm_clear_error();
            r = tfm_model_load(&m2, cut);
            CHECK_MSG(r == TFM_E_FORMAT, "%s: tfm_model_load gives %d: %s", at, (int)r, tfm_last_error());
            CHECK_MSG(strstr(tfm_last_error(), cut) != NULL, "%s: message lacks the path: %s", at, tfm_last_error());
            r = tfm_config_load(cut, &lc);
            CHECK_MSG(r == TFM_E_FORMAT, "%s: tfm_config_load gives %d: %s", at, (int)r, tfm_last_error());
        }
        /* the untruncated copy loads */
        CHECK(io_write(cut, bytes, size));
        CHECK_OK(tfm_model_load(&m2, cut));
        CHECK(io_params_diff(&m, &m2) == NULL);
    }
    free(bytes);

    /* no config in the metadata: tfm_config_load refuses, tfm_model_load goes by names and shapes */
    CHECK_OK(io_save_custom(cut, &m, 0, NULL, NULL, NULL, NULL));
    CHECK_ERR(tfm_config_load(cut, &lc), TFM_E_FORMAT, "tfm.kind");
    if (io_meta_from(&mt, path, &h)) {
        io_meta_set(&mt, "tfm.kind", NULL);
        CHECK_OK(io_save_custom(cut, &m, 0, &mt, NULL, NULL, NULL));
        CHECK_ERR(tfm_config_load(cut, &lc), TFM_E_FORMAT, "tfm.kind");
        tfm__st_header_free(&h);
    }
    {
        tfm_model m3;
        if (io_init(&m3, &c, "plain")) {
            CHECK_OK(io_save_custom(cut, &m, 0, NULL, NULL, NULL, NULL));
            CHECK_OK(tfm_model_load(&m3, cut));
            CHECK(io_params_diff(&m, &m3) == NULL);
            tfm_model_free(&m3);
        }
    }

    /* metadata values that are not what they should be */
    if (io_meta_from(&mt, path, &h)) {
        struct {
            const char *key, *value, *msg;
            int state;
        } bad[16];
        int nb = 0;
        bad[nb].key = "tfm.d_model", bad[nb].value = "abc", bad[nb].msg = "tfm.d_model", bad[nb++].state = 0;
        bad[nb].key = "tfm.d_model", bad[nb].value = "8.5", bad[nb].msg = "want an integer", bad[nb++].state = 0;
        bad[nb].key = "tfm.n_heads", bad[nb].value = "3", bad[nb].msg = "stored config is invalid", bad[nb++].state = 0;
        bad[nb].key = "tfm.ln_eps", bad[nb].value = "inf", bad[nb].msg = "tfm.ln_eps", bad[nb++].state = 0;
        /* key/value heads that do not divide the 2 query heads */
        bad[nb].key = "tfm.n_kv_heads", bad[nb].value = "3", bad[nb].msg = "n_kv_heads 3 must be 0 or divide", bad[nb++].state = 0;
        bad[nb].key = "tfm.n_kv_heads", bad[nb].value = "-2", bad[nb].msg = "n_kv_heads -2 must be 0 or divide", bad[nb++].state = 0;
        bad[nb].key = "tfm.n_kv_heads", bad[nb].value = "2147483647", bad[nb].msg = "stored config is invalid", bad[nb++].state = 0;
        bad[nb].key = "tfm.step", bad[nb].value = NULL, bad[nb].msg = "tfm.step", bad[nb++].state = 1;
        bad[nb].key = "tfm.rng", bad[nb].value = "0123", bad[nb].msg = "tfm.rng", bad[nb++].state = 1;
        bad[nb].key = "tfm.step", bad[nb].value = "-1", bad[nb].msg = "tfm.step", bad[nb++].state = 1;
        bad[nb].key = "tfm.attn_window", bad[nb].value = "-3", bad[nb].msg = "stored config is invalid", bad[nb++].state = 0;
        bad[nb].key = "tfm.attn_sinks", bad[nb].value = "2", bad[nb].msg = "stored config is invalid", bad[nb++].state = 0;
        bad[nb].key = "tfm.attn_window", bad[nb].value = "1e12", bad[nb].msg = "want an integer", bad[nb++].state = 0;
        for (i = 0; i < nb; i++) {
            io_meta e = mt;
            int j;
            for (j = 0; j < e.n; j++) e.kv[2 * j + 1] = e.val[j]; /* point into the copy */
            io_meta_set(&e, bad[i].key, bad[i].value);
            CHECK_OK(io_save_custom(cut, &m, bad[i].state, &e, NULL, NULL, NULL));
            CHECK_ERR(tfm_model_load(&m2, cut), TFM_E_FORMAT, bad[i].msg);
            if (!bad[i].state) CHECK_ERR(tfm_config_load(cut, &lc), TFM_E_FORMAT, bad[i].msg);
        }
        tfm__st_header_free(&h);
    }
    tfm_model_free(&m2);
    tfm_model_free(&m);
    remove(path);
    remove(cut);
}

/* A checkpoint from another writer may record only the architecture: tfm_config_load then gives
   the defaults for everything else, as a tfm_config with those fields alone would (in particular
   ignore_index -100, not 0: a config with ignore_index 0 would drop every target of class 0). */
static void io_config_minimal(void) {
    static const char *const keys[] = {"tfm.kind", "tfm.vocab_size", "tfm.d_model", "tfm.n_heads",
                                       "tfm.n_layers", "tfm.d_ff", "tfm.max_len", "tfm.norm_first",
                                       "tfm.tie_output"};
    const char *full = io_path("min_full.safetensors"), *path = io_path("min.safetensors"), *d;
    tfm_config c = io_cfg(1), lc, rc;
    tfm_model m, m2;
    io_meta all, mt;
    tfm__st_header h;
    size_t i;
    c.max_batch = 0; /* fields left at their defaults */
    c.seed = 0;
    if (!io_init(&m, &c, "minimal")) return;
    CHECK_OK(tfm_model_save(&m, full, 0, NULL, 0));
    if (io_meta_from(&all, full, &h)) {
        memset(&mt, 0, sizeof mt);
        for (i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            int j;
            for (j = 0; j < all.n; j++)
                if (!strcmp(all.kv[2 * j], keys[i])) io_meta_set(&mt, keys[i], all.val[j]);
        }
        CHECK(mt.n == (int)(sizeof keys / sizeof keys[0]));
        CHECK_OK(io_save_custom(path, &m, 0, &mt, NULL, NULL, NULL));
        CHECK_OK(tfm_config_load(path, &lc));
        CHECK_OK(tfm_config_resolve(&lc, &rc));
        d = io_cfg_diff(&rc, &m.cfg);
        CHECK_MSG(d == NULL, "architecture-only metadata: the config differs in %s", d);
        CHECK_MSG(rc.ignore_index == -100, "architecture-only metadata: ignore_index %d, want the default -100",
                  rc.ignore_index);
        if (io_init(&m2, &lc, "minimal")) {
            CHECK_OK(tfm_model_load(&m2, path));
            CHECK(io_params_diff(&m, &m2) == NULL);
            tfm_model_free(&m2);
        }
        tfm__st_header_free(&h);
    }
    tfm_model_free(&m);
    remove(full);
    remove(path);
}

/* A file with a tensor too many, too few or of another shape: TFM_E_FORMAT naming it. */
static void io_errors_tensors(void) {
    const char *good = io_path("tensors_good.safetensors"), *path = io_path("tensors.safetensors");
    tfm_config c = io_cfg(2);
    tfm_optim o = io_opt(0);
    tfm_model m, m2;
    io_meta mt;
    tfm__st_header h;
    int with_meta;
    if (!io_init(&m, &c, "tensors")) return;
    io_train(&m, &o, 0, 1, NULL);
    CHECK_OK(tfm_model_save(&m, good, TFM_SAVE_TRAINING_STATE, NULL, 0));
    if (!io_meta_from(&mt, good, &h)) {
        tfm_model_free(&m);
        return;
    }
    if (!io_init(&m2, &c, "tensors")) {
        tfm__st_header_free(&h);
        tfm_model_free(&m);
        return;
    }
    for (with_meta = 0; with_meta < 2; with_meta++) {
        const io_meta *pm = with_meta ? &mt : NULL;
        CHECK_OK(io_save_custom(path, &m, 0, pm, "decoder.layers.1.linear1.bias", NULL, NULL));
        CHECK_ERR(tfm_model_load(&m2, path), TFM_E_FORMAT, "'decoder.layers.1.linear1.bias' not found");
        CHECK_OK(io_save_custom(path, &m, 0, pm, NULL, "extra.bias", NULL));
        CHECK_ERR(tfm_model_load(&m2, path), TFM_E_FORMAT, "unexpected tensor 'extra.bias'");
        CHECK_OK(io_save_custom(path, &m, 0, pm, NULL, NULL, "encoder.layers.0.linear2.weight"));
        CHECK_ERR(tfm_model_load(&m2, path), TFM_E_FORMAT, "'encoder.layers.0.linear2.weight' is (16,8) in the file but (8,16)");
        CHECK(strstr(tfm_last_error(), path) != NULL);
    }
    /* with the training state: a moment missing, or one too many */
    CHECK_OK(io_save_custom(path, &m, 1, &mt, "optim.exp_avg_sq.head.weight", NULL, NULL));
    CHECK_ERR(tfm_model_load(&m2, path), TFM_E_FORMAT, "'optim.exp_avg_sq.head.weight' not found");
    CHECK_OK(io_save_custom(path, &m, 1, &mt, NULL, "optim.exp_avg.nothing", NULL));
    CHECK_ERR(tfm_model_load(&m2, path), TFM_E_FORMAT, "unexpected tensor 'optim.exp_avg.nothing'");
    /* what io_save_custom writes when nothing is changed loads (so each failure above is the
       change's) */
    CHECK_OK(io_save_custom(path, &m, 1, &mt, NULL, NULL, NULL));
    CHECK_OK(tfm_model_load(&m2, path));
    CHECK(io_params_diff(&m, &m2) == NULL);
    CHECK(m2.step == 1);
    tfm__st_header_free(&h);
    tfm_model_free(&m2);
    tfm_model_free(&m);
    remove(good);
    remove(path);
}

/* A training-state checkpoint into an inference_only model; a weights-only one into a training
   model. */
static void io_inference(void) {
    int k;
    for (k = 0; k < 3; k++) {
        char nm[64];
        const char *path, *path_w;
        tfm_config c = io_cfg(k), lc;
        tfm_optim o = io_opt(0);
        tfm_model m, inf, fresh, ref;
        snprintf(nm, sizeof nm, "inf_%s.safetensors", io_kind_name[k]);
        path = io_path(nm);
        snprintf(nm, sizeof nm, "inf_w_%s.safetensors", io_kind_name[k]);
        path_w = io_path(nm);
        if (!io_init(&m, &c, io_kind_name[k])) continue;
        io_train(&m, &o, 0, 2, NULL);
        CHECK_OK(tfm_model_save(&m, path, TFM_SAVE_TRAINING_STATE, NULL, 0));
        CHECK_OK(tfm_model_save(&m, path_w, 0, NULL, 0));
        CHECK_OK(tfm_config_load(path, &lc));
        lc.inference_only = 1;
        if (io_init(&inf, &lc, io_kind_name[k])) {
            CHECK_OK(tfm_model_load(&inf, path));
            CHECK_MSG(io_params_diff(&m, &inf) == NULL, "%s: inference model's weights differ", io_kind_name[k]);
            CHECK_MSG(io_same_logits(&m, &inf, 5), "%s: inference model's logits differ", io_kind_name[k]);
            CHECK(inf.step == 0);
            CHECK_ERR(tfm_model_save(&inf, io_path("inf_out.safetensors"), TFM_SAVE_TRAINING_STATE, NULL, 0), TFM_E_ARG,
                      "inference_only");
            /* its weights-only save is the trained model's */
            CHECK_OK(tfm_model_save(&inf, io_path("inf_out.safetensors"), 0, NULL, 0));
            CHECK_OK(tfm_model_load(&inf, io_path("inf_out.safetensors")));
            CHECK(io_params_diff(&m, &inf) == NULL);
            remove(io_path("inf_out.safetensors"));
            tfm_model_free(&inf);
        }
        /* weights only into a training model: the step stays 0, the moments zero, the generator is
           the model's own */
        if (io_init(&fresh, &c, io_kind_name[k]) && io_init(&ref, &c, io_kind_name[k])) {
            CHECK_OK(tfm_model_load(&fresh, path_w));
            CHECK(fresh.step == 0);
            CHECK(io_moments_zero(&fresh));
            CHECK(!memcmp(tfm__model_rng(&fresh)->s, tfm__model_rng(&ref)->s, sizeof(uint64_t[4])));
            CHECK(io_params_diff(&m, &fresh) == NULL);
            tfm_model_free(&ref);
        }
        tfm_model_free(&fresh);
        tfm_model_free(&m);
        remove(path);
        remove(path_w);
    }
}

/* ---- 4b. a failed load leaves the model exactly as it was ----------------------------------- */

/* Everything tfm_model_load may write into m, as bytes (malloc'd, *n of them): every parameter, both
   moments (zeros for a model without them), the step and the generator's state. */
static unsigned char *io_state(tfm_model *m, size_t *n) {
    size_t total = sizeof m->step + sizeof tfm__model_rng(m)->s, at = 0;
    unsigned char *b;
    int i, kind;
    for (i = 0; i < m->n_params; i++) total += 3 * (size_t)tfm_numel(&m->params[i].value) * sizeof(float);
    if (!(b = (unsigned char *)malloc(total))) return NULL;
    for (i = 0; i < m->n_params; i++)
        for (kind = 0; kind < 3; kind++) {
            size_t bytes = (size_t)tfm_numel(&m->params[i].value) * sizeof(float);
            const float *src = kind ? tfm__model_moment(m, &m->params[i], kind) : m->params[i].value.data;
            if (src) memcpy(b + at, src, bytes);
            else memset(b + at, 0, bytes);
            at += bytes;
        }
    memcpy(b + at, &m->step, sizeof m->step);
    at += sizeof m->step;
    memcpy(b + at, tfm__model_rng(m)->s, sizeof tfm__model_rng(m)->s);
    *n = at + sizeof tfm__model_rng(m)->s;
    return b;
}

/* Load path into m: it must fail (with code, when code is not TFM_OK) and leave m's state as it was. */
static void io_load_fails_cleanly(tfm_model *m, const char *path, tfm_result code, const char *what) {
    size_t n0 = 0, n1 = 0;
    unsigned char *before = io_state(m, &n0), *after;
    tfm_result r;
    tfm_clear_error();
    r = tfm_model_load(m, path);
    after = io_state(m, &n1);
    CHECK_MSG(r != TFM_OK && (code == TFM_OK || r == code), "%s: tfm_model_load gave %d: %s", what, (int)r, tfm_last_error());
    CHECK_MSG(!strncmp(tfm_last_error(), "tfm_model_load: ", 16), "%s: message: %s", what, tfm_last_error());
    CHECK_MSG(before && after && n0 == n1 && !memcmp(before, after, n0), "%s: the failed load changed the model", what);
    free(before);
    free(after);
}

/* A checkpoint of state A, made hostile in many ways, loaded into a model in state B (another step count,
   other weights, moments and generator state); and a read error half-way through the data. */
static void io_failed_load(void) {
    const char *good = io_path("untouched_good.safetensors"), *bad = io_path("untouched_bad.safetensors");
    tfm_config c = io_cfg(2), ci;
    tfm_optim o = io_opt(0);
    tfm_model a, m, inf;
    unsigned char *file = NULL, *sa = NULL, *sm = NULL;
    size_t size = 0, hlen = 0, na = 0, nm = 0, cuts[6];
    io_meta mt;
    tfm__st_header h;
    int i, n_reads;
    if (!io_init(&a, &c, "untouched")) return;
    if (!io_init(&m, &c, "untouched")) {
        tfm_model_free(&a);
        return;
    }
    io_train(&a, &o, 0, 2, NULL);
    io_train(&m, &o, 10, 3, NULL);
    CHECK_OK(tfm_model_save(&a, good, TFM_SAVE_TRAINING_STATE, NULL, 0));
    file = io_read(good, &size);
    if (!file || size < 64 || !io_meta_from(&mt, good, &h)) {
        TEST__FAIL("untouched: setup failed");
        goto done;
    }
    for (i = 7; i >= 0; i--) hlen = (hlen << 8) | file[i];
    /* truncated anywhere: in the header, in the data, one byte short */
    cuts[0] = 5, cuts[1] = 8 + hlen / 2, cuts[2] = 8 + hlen, cuts[3] = 8 + hlen + (size - 8 - hlen) / 2;
    cuts[4] = size - 4, cuts[5] = size - 1;
    for (i = 0; i < 6; i++) {
        char what[64];
        snprintf(what, sizeof what, "cut at %lu of %lu", (unsigned long)cuts[i], (unsigned long)size);
        CHECK(io_write(bad, file, cuts[i]));
        io_load_fails_cleanly(&m, bad, TFM_E_FORMAT, what);
    }
    /* four bytes too many */
    {
        unsigned char *more = (unsigned char *)malloc(size + 4);
        if (more) {
            memcpy(more, file, size);
            memset(more + size, 0, 4);
            CHECK(io_write(bad, more, size + 4));
            io_load_fails_cleanly(&m, bad, TFM_E_FORMAT, "4 bytes more");
            free(more);
        }
    }
    /* the last tensor in the header becomes F16 (same length: every offset still fits) */
    for (i = (int)(8 + hlen) - 5; i > 8; i--)
        if (!memcmp(file + i, "\"F32\"", 5)) break;
    CHECK(i > 8);
    if (i > 8) {
        memcpy(file + i, "\"F16\"", 5);
        CHECK(io_write(bad, file, size));
        io_load_fails_cleanly(&m, bad, TFM_E_FORMAT, "an F16 tensor");
        memcpy(file + i, "\"F32\"", 5);
    }
    /* a tensor missing, one too many, one of another shape; bad training state; another architecture */
    CHECK_OK(io_save_custom(bad, &a, 1, &mt, "optim.exp_avg_sq.head.weight", NULL, NULL));
    io_load_fails_cleanly(&m, bad, TFM_E_FORMAT, "a moment missing");
    CHECK_OK(io_save_custom(bad, &a, 1, &mt, NULL, "zz.extra", NULL));
    io_load_fails_cleanly(&m, bad, TFM_E_FORMAT, "an extra tensor (last in the file)");
    CHECK_OK(io_save_custom(bad, &a, 1, &mt, NULL, NULL, "encoder.layers.0.linear2.weight"));
    io_load_fails_cleanly(&m, bad, TFM_E_FORMAT, "a transposed weight");
    {
        io_meta e = mt;
        int j;
        for (j = 0; j < e.n; j++) e.kv[2 * j + 1] = e.val[j];
        io_meta_set(&e, "tfm.rng", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeX");
        CHECK_OK(io_save_custom(bad, &a, 1, &e, NULL, NULL, NULL));
        io_load_fails_cleanly(&m, bad, TFM_E_FORMAT, "a bad generator state");
        e = mt;
        for (j = 0; j < e.n; j++) e.kv[2 * j + 1] = e.val[j];
        io_meta_set(&e, "tfm.d_ff", "32");
        CHECK_OK(io_save_custom(bad, &a, 1, &e, NULL, NULL, NULL));
        io_load_fails_cleanly(&m, bad, TFM_E_FORMAT, "another d_ff");
    }
    /* the good file, with a read error injected half-way through its data: TFM_E_IO, nothing changed */
    n_reads = 2 + 3 * a.n_params;
    io_hook_arm(TFM__ST_STAGE_READ, n_reads / 2, EIO);
    io_load_fails_cleanly(&m, good, TFM_E_IO, "a read error half-way");
    tfm__st_write_hook = NULL;
    CHECK_MSG(io_hook_seen[TFM__ST_STAGE_READ] > n_reads / 2, "the read error was not reached (%d reads)",
              io_hook_seen[TFM__ST_STAGE_READ]);
    /* an inference model is left alone too */
    ci = c;
    ci.inference_only = 1;
    if (io_init(&inf, &ci, "untouched inference")) {
        CHECK(io_write(bad, file, size - 1));
        io_load_fails_cleanly(&inf, bad, TFM_E_FORMAT, "inference model, cut");
        io_hook_arm(TFM__ST_STAGE_READ, 2, EIO);
        io_load_fails_cleanly(&inf, good, TFM_E_IO, "inference model, read error");
        tfm__st_write_hook = NULL;
        tfm_model_free(&inf);
    }
    /* control: the good file does load, and makes B into A exactly */
    CHECK_OK(tfm_model_load(&m, good));
    sa = io_state(&a, &na);
    sm = io_state(&m, &nm);
    CHECK_MSG(sa && sm && na == nm && !memcmp(sa, sm, na), "the good file does not give A's state");
    tfm__st_header_free(&h);
done:
    free(file);
    free(sa);
    free(sm);
    tfm_model_free(&m);
    tfm_model_free(&a);
    remove(good);
    remove(bad);
}

/* ---- 4c. user metadata ---------------------------------------------------------------------- */

/* The value of key in the checkpoint at path through a size query and an exact-size buffer (malloc'd), or NULL. */
static char *io_user_value(const char *path, const char *key) {
    size_t len = 12345, len2 = 0;
    char *b;
    if (tfm_checkpoint_meta(path, key, NULL, 0, &len) != TFM_OK || !(b = (char *)malloc(len + 1))) return NULL;
    memset(b, 'x', len + 1);
    if (tfm_checkpoint_meta(path, key, b, len + 1, &len2) != TFM_OK || len2 != len || b[len] != 0) {
        free(b);
        return NULL;
    }
    return b;
}

static void io_user_meta(void) {
    static const char *const escaped = "\"user.q\":\"a\\\"b\\\\c/\\n\\t\\u0001\\u001f\x7f\xc3\xa9\"";
    const char *path = io_path("user.safetensors"), *other = io_path("user_other.safetensors");
    char vocab[200], longkey[TFM__IO_MAX_KEY + 2], buf[64], *big = (char *)malloc(65537), *v;
    unsigned char *before, *after;
    size_t len, n0, n1, k;
    tfm_config c = io_cfg(1), lc;
    tfm_model m, m2;
    tfm_kv kv[6];
    int i;
    if (!big || !io_init(&m, &c, "user metadata")) {
        free(big);
        return;
    }
    /* every byte 1..127 (controls, quotes, backslash, DEL), then UTF-8 of 2, 3 and 4 bytes */
    for (i = 1; i < 128; i++) vocab[i - 1] = (char)i;
    strcpy(vocab + 127, "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf");
    for (k = 0; k < 65536; k++) big[k] = "ab\"\\\n \xc3\xa9"[k % 8]; /* 8-byte cycle: whole UTF-8 sequences */
    big[65536] = 0;
    kv[0].key = "vocab", kv[0].value = vocab;
    kv[1].key = "empty", kv[1].value = "";
    kv[2].key = "big", kv[2].value = big;
    kv[3].key = "cl\xc3\xa9 \xe2\x9c\x93", kv[3].value = "na\xc3\xafve";
    kv[4].key = "tfm.kind", kv[4].value = "a user key, not the config";
    CHECK_OK(tfm_model_save(&m, path, TFM_SAVE_TRAINING_STATE, kv, 5));
    for (i = 0; i < 5; i++) {
        v = io_user_value(path, kv[i].key);
        CHECK_MSG(v && !strcmp(v, kv[i].value), "user metadata %d (%s) does not come back: %s", i, kv[i].key,
                  v ? "another value" : tfm_last_error());
        free(v);
    }
    /* a buffer one byte short: TFM_E_ARG, nothing written, the length given */
    memset(buf, 'x', sizeof buf);
    len = 0;
    CHECK_ERR(tfm_checkpoint_meta(path, kv[3].key, buf, strlen(kv[3].value), &len), TFM_E_ARG, "needs 7 bytes");
    CHECK(len == strlen(kv[3].value) && buf[0] == 'x');
    CHECK_OK(tfm_checkpoint_meta(path, kv[3].key, buf, strlen(kv[3].value) + 1, NULL));
    CHECK(!strcmp(buf, kv[3].value));
    /* an absent key is told apart from a bad file: TFM_E_ARG naming it; the config is not user metadata */
    len = 99;
    CHECK_ERR(tfm_checkpoint_meta(path, "nope", buf, sizeof buf, &len), TFM_E_ARG, "has no user metadata key 'nope'");
    CHECK(len == 0);
    CHECK_ERR(tfm_checkpoint_meta(path, "format", buf, sizeof buf, &len), TFM_E_ARG, "no user metadata key 'format'");
    /* the model, its training state and its config load as ever: the user's "tfm.kind" is not the config's */
    CHECK_OK(tfm_config_load(path, &lc));
    CHECK(lc.kind == c.kind && lc.vocab_size == c.vocab_size);
    if (io_init(&m2, &lc, "user metadata")) {
        CHECK_OK(tfm_model_load(&m2, path));
        CHECK(io_params_diff(&m, &m2) == NULL);
        tfm_model_free(&m2);
    }
    /* the JSON in the file, escaped as the format asks (spelled out here by hand) */
    kv[5].key = "q", kv[5].value = "a\"b\\c/\n\t\x01\x1f\x7f\xc3\xa9";
    CHECK_OK(tfm_model_save(&m, other, 0, &kv[5], 1));
    {
        unsigned char *f = io_read(other, &n0);
        CHECK_MSG(f && n0 > 8 && strstr((const char *)f + 8, escaped) != NULL, "the header lacks %s", escaped);
        free(f);
    }
    v = io_user_value(other, "q");
    CHECK(v && !strcmp(v, kv[5].value));
    free(v);
    /* refused, and the file on disk stays as it was */
    before = io_read(path, &n0);
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0; /* TFM__IO_MAX_KEY + 1 bytes */
    kv[5].value = "v";
    for (i = 0; i < 8; i++) {
        tfm_kv two[2];
        two[0].key = "a", two[0].value = "1";
        two[1].key = i == 0 ? NULL : i == 1 ? "" : i == 2 ? longkey : i == 3 ? "bad \xff key" : i == 7 ? "a" : "b";
        two[1].value = i == 4 ? NULL : i == 5 ? "bad \xc0\x80 value" : "2";
        if (i == 6) {
            CHECK_ERR(tfm_model_save(&m, path, 0, NULL, 1), TFM_E_ARG, "tfm_model_save: ");
            CHECK_ERR(tfm_model_save(&m, path, 0, two, -1), TFM_E_ARG, "tfm_model_save: ");
            CHECK_ERR(tfm_model_save(&m, path, 0, two, 1000000), TFM_E_ARG, "at most"); /* a file nobody could load */
            continue;
        }
        CHECK_ERR(tfm_model_save(&m, path, 0, two, 2), TFM_E_ARG, i == 7 ? "'user.a' appears twice" : "tfm_model_save: ");
    }
    after = io_read(path, &n1);
    CHECK_MSG(before && after && n0 == n1 && !memcmp(before, after, n0), "a refused save changed the file");
    free(before);
    free(after);
    longkey[TFM__IO_MAX_KEY] = 0; /* the longest key there may be */
    kv[5].key = longkey;
    CHECK_OK(tfm_model_save(&m, other, 0, &kv[5], 1));
    v = io_user_value(other, longkey);
    CHECK(v && !strcmp(v, "v"));
    free(v);
    /* arguments and hostile files */
    CHECK_ERR(tfm_checkpoint_meta(NULL, "k", buf, sizeof buf, NULL), TFM_E_ARG, "tfm_checkpoint_meta");
    CHECK_ERR(tfm_checkpoint_meta(path, NULL, buf, sizeof buf, NULL), TFM_E_ARG, "tfm_checkpoint_meta");
    CHECK_ERR(tfm_checkpoint_meta(io_path("no_such.safetensors"), "k", buf, sizeof buf, NULL), TFM_E_IO,
              "tfm_checkpoint_meta: ");
    {
        static const char *const hostile[3] = {"{\"__metadata__\":{\"user.k\":\"a\\u0000b\"}}",
                                               "{\"__metadata__\":{\"user.k\":7}}", "{\"__metadata__\":{\"user.k\":\"v\"}"};
        static const char *const why[3] = {"contains a NUL", "expected a string", "expected ',' or '}'"};
        for (i = 0; i < 3; i++) {
            unsigned char f[96];
            size_t hl = strlen(hostile[i]);
            for (k = 0; k < 8; k++) f[k] = (unsigned char)(hl >> (8 * k));
            memcpy(f + 8, hostile[i], hl);
            CHECK(io_write(other, f, 8 + hl));
            CHECK_ERR(tfm_checkpoint_meta(other, "k", buf, sizeof buf, &len), TFM_E_FORMAT, why[i]);
            CHECK(!strncmp(tfm_last_error(), "tfm_checkpoint_meta: ", 21));
        }
        before = io_read(path, &n0); /* and a truncated checkpoint */
        CHECK(before && io_write(other, before, n0 - 3));
        CHECK_ERR(tfm_checkpoint_meta(other, "vocab", buf, sizeof buf, &len), TFM_E_FORMAT, "truncated");
        free(before);
    }
    free(big);
    tfm_model_free(&m);
    remove(path);
    remove(other);
}

static void io_args(void) {
    const char *path = io_path("args.safetensors");
    tfm_config c = io_cfg(1), lc;
    tfm_model m, zero;
    memset(&zero, 0, sizeof zero);
    if (!io_init(&m, &c, "args")) return;
    CHECK_OK(tfm_model_save(&m, path, 0, NULL, 0));
    CHECK_ERR(tfm_model_save(NULL, path, 0, NULL, 0), TFM_E_ARG, "tfm_model_save");
    CHECK_ERR(tfm_model_save(&m, NULL, 0, NULL, 0), TFM_E_ARG, "tfm_model_save");
    CHECK_ERR(tfm_model_save(&zero, path, 0, NULL, 0), TFM_E_ARG, "tfm_model_save");
    CHECK_ERR(tfm_model_save(&m, path, 2, NULL, 0), TFM_E_ARG, "flags");
    CHECK_ERR(tfm_model_save(&m, "", 0, NULL, 0), TFM_E_ARG, "path");
    CHECK_ERR(tfm_config_load(NULL, &lc), TFM_E_ARG, "tfm_config_load");
    CHECK_ERR(tfm_config_load(path, NULL), TFM_E_ARG, "tfm_config_load");
    CHECK_ERR(tfm_model_load(NULL, path), TFM_E_ARG, "tfm_model_load");
    CHECK_ERR(tfm_model_load(&m, NULL), TFM_E_ARG, "tfm_model_load");
    CHECK_ERR(tfm_model_load(&zero, path), TFM_E_ARG, "tfm_model_load");
    tfm_model_free(&m);
    remove(path);
}

/* ---- 5. checkpoints exported from PyTorch --------------------------------------------------- */

static void io_torch_case(int k) {
    char name[64], st[600], what[96];
    const char *resave;
    tfm_config c;
    tfm_model m;
    tfm_batch b;
    tfm_tensor lg;
    const fx_array *tok, *lens, *tgt, *targets, *logits, *loss;
    fx_file *fx;
    float l = 0;
    int d;
    snprintf(name, sizeof name, "torch_export_%s", io_kind_name[k]);
    snprintf(st, sizeof st, "%s/%s.safetensors", fx_dir(), name);
    snprintf(what, sizeof what, "%s", name);
    fx = fx_open(name);
    if (!fx) {
        TEST__FAIL("%s: %s (tools/torch_roundtrip.py export writes it)", what, fx_error());
        return;
    }
    tok = fx_get(fx, "tokens");
    lens = fx_get(fx, "lens");
    tgt = fx_get(fx, "tgt_in");
    targets = fx_get(fx, "targets");
    logits = fx_get(fx, "logits");
    loss = fx_get(fx, "loss");
    if (!tok || tok->dtype != FX_I32 || tok->ndim != 2 || !targets || targets->dtype != FX_I32 || !logits ||
        logits->dtype != FX_F64 || !loss || loss->dtype != FX_F64 || loss->numel != 1 ||
        (lens && (lens->dtype != FX_I32 || lens->numel != tok->dims[0])) ||
        (k == 2 && (!tgt || tgt->dtype != FX_I32 || tgt->ndim != 2))) {
        TEST__FAIL("%s: the .tfx lacks an array or has one of the wrong type", what);
        fx_free(fx);
        return;
    }
    CHECK_OK(tfm_config_load(st, &c));
    CHECK_MSG(c.kind == io_kinds[k], "%s: kind %d", what, (int)c.kind);
    if (c.kind != io_kinds[k] || !io_init(&m, &c, what)) {
        fx_free(fx);
        return;
    }
    CHECK_OK(tfm_model_load(&m, st));
    tfm_model_train(&m, 0);
    memset(&b, 0, sizeof b);
    b.batch = (int)tok->dims[0];
    b.len = (int)tok->dims[1];
    b.tokens = tok->i32;
    b.lens = lens ? lens->i32 : NULL;
    if (tgt) {
        b.tgt_len = (int)tgt->dims[1];
        b.tgt_in = tgt->i32;
    }
    b.targets = targets->i32;
    CHECK_OK(tfm_model_forward(&m, &b, &l, NULL));
    lg = tfm_model_logits(&m);
    CHECK_MSG(lg.ndim == logits->ndim, "%s: logits have %d dims, torch's %d", what, lg.ndim, logits->ndim);
    for (d = 0; d < lg.ndim && d < logits->ndim; d++)
        CHECK_MSG(lg.shape[d] == logits->dims[d], "%s: logits dim %d is %lld, torch's %lld", what, d,
                  (long long)lg.shape[d], (long long)logits->dims[d]);
    if (lg.data && tfm_numel(&lg) == logits->numel) {
        double e = test_rel_err(lg.data, logits->f64, (size_t)logits->numel), el = test_rel_err(&l, loss->f64, 1);
        char w2[128];
        if (test__verbose) printf("      %-28s logits rel err %.2e, loss rel err %.2e\n", name, e, el);
        snprintf(w2, sizeof w2, "%s: logits", what);
        CHECK_REL(w2, e, IO_TOL);
        snprintf(w2, sizeof w2, "%s: loss", what);
        CHECK_REL(w2, el, IO_TOL);
    }
    /* saved again by the C writer: the exporter's file, byte for byte */
    snprintf(name, sizeof name, "resave_%s.safetensors", io_kind_name[k]);
    resave = io_path(name);
    CHECK_OK(tfm_model_save(&m, resave, 0, NULL, 0));
    {
        size_t n1 = 0, n2 = 0;
        unsigned char *a = io_read(st, &n1), *bb = io_read(resave, &n2);
        CHECK_MSG(a && bb && n1 == n2 && !memcmp(a, bb, n1),
                  "%s: saving the loaded model does not reproduce the exported file (%lu vs %lu bytes)", what,
                  (unsigned long)n1, (unsigned long)n2);
        free(a);
        free(bb);
    }
    remove(resave);
    tfm_model_free(&m);
    fx_free(fx);
}

static void io_torch_fixtures(void) {
    int k;
    for (k = 0; k < 3; k++) io_torch_case(k);
}

/* ---- 6. checkpoints for PyTorch ------------------------------------------------------------- */

/* A TFX1 writer (the format of tests/fixture.h), little-endian whatever the host. */
typedef struct io_tfx {
    unsigned char *p;
    size_t n, cap;
    uint32_t count;
    int ok;
} io_tfx;

static void io_tfx_put(io_tfx *t, const void *src, size_t n) {
    if (!t->ok) return;
    if (t->n + n > t->cap) {
        size_t nc = t->cap ? t->cap : 4096;
        unsigned char *np;
        while (nc < t->n + n) nc *= 2;
        np = (unsigned char *)realloc(t->p, nc);
        if (!np) {
            t->ok = 0;
            return;
        }
        t->p = np;
        t->cap = nc;
    }
    memcpy(t->p + t->n, src, n);
    t->n += n;
}

static void io_tfx_u32(io_tfx *t, uint32_t v) {
    unsigned char b[4];
    int i;
    for (i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
    io_tfx_put(t, b, 4);
}

static void io_tfx_u64(io_tfx *t, uint64_t v) {
    unsigned char b[8];
    int i;
    for (i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    io_tfx_put(t, b, 8);
}

/* An array of dtype FX_F32 or FX_I32 (4-byte elements) or FX_F64. */
static void io_tfx_array(io_tfx *t, const char *name, int dtype, int ndim, const int64_t *dims, const void *data) {
    int64_t i, numel = 1;
    int d;
    io_tfx_u32(t, (uint32_t)strlen(name));
    io_tfx_put(t, name, strlen(name));
    io_tfx_u32(t, (uint32_t)dtype);
    io_tfx_u32(t, (uint32_t)ndim);
    for (d = 0; d < ndim; d++) {
        io_tfx_u64(t, (uint64_t)dims[d]);
        numel *= dims[d];
    }
    for (i = 0; i < numel; i++) {
        if (dtype == FX_F64) {
            uint64_t u;
            memcpy(&u, (const double *)data + i, 8);
            io_tfx_u64(t, u);
        } else {
            uint32_t u;
            memcpy(&u, (const unsigned char *)data + 4 * i, 4);
            io_tfx_u32(t, u);
        }
    }
    t->count++;
}

static int io_tfx_save(io_tfx *t, const char *path) {
    io_tfx f;
    int ok;
    memset(&f, 0, sizeof f);
    f.ok = 1;
    io_tfx_put(&f, "TFX1", 4);
    io_tfx_u32(&f, t->count);
    io_tfx_put(&f, t->p, t->n);
    ok = f.ok && t->ok && io_write(path, f.p, f.n);
    free(f.p);
    return ok;
}

static void io_export_case(int k) {
    char st[256], tx[256];
    tfm_config c = io_export_cfg(k), lc;
    tfm_optim o = io_opt(0);
    tfm_model m, m2;
    io_batch d;
    io_tfx t;
    tfm_tensor lg;
    float loss = 0;
    int64_t dims[3];
    int flags = k == 1 ? 0 : TFM_SAVE_TRAINING_STATE, i;
    snprintf(st, sizeof st, "%s/%s.safetensors", IO_EXPORT_DIR, io_kind_name[k]);
    snprintf(tx, sizeof tx, "%s/%s.tfx", IO_EXPORT_DIR, io_kind_name[k]);
    if (!io_init(&m, &c, io_kind_name[k])) return;
    if (!io_train(&m, &o, 0, 4, NULL)) {
        tfm_model_free(&m);
        return;
    }
    CHECK_OK(tfm_model_save(&m, st, flags, NULL, 0));
    /* the batch and the eval-mode logits */
    io_make_batch(&d, &m.cfg, 1000 + (uint64_t)k);
    tfm_model_train(&m, 0);
    CHECK_OK(tfm_model_forward(&m, &d.b, &loss, NULL));
    lg = tfm_model_logits(&m);
    memset(&t, 0, sizeof t);
    t.ok = 1;
    dims[0] = d.B;
    dims[1] = d.T;
    io_tfx_array(&t, "tokens", FX_I32, 2, dims, d.tokens);
    if (d.b.lens) io_tfx_array(&t, "lens", FX_I32, 1, dims, d.lens);
    if (k == 2) {
        dims[1] = d.Tt;
        io_tfx_array(&t, "tgt_in", FX_I32, 2, dims, d.tgt_in);
    }
    io_tfx_array(&t, "targets", FX_I32, k == 0 ? 1 : 2, dims, d.targets);
    io_tfx_array(&t, "logits", FX_F32, lg.ndim, lg.shape, lg.data);
    dims[0] = 1;
    io_tfx_array(&t, "loss", FX_F32, 1, dims, &loss);
    CHECK_MSG(io_tfx_save(&t, tx), "cannot write %s", tx);
    free(t.p);
    /* what was written reads back: the .tfx through fixture.h, the checkpoint into a model built
       from its own config, which gives the same logits */
    {
        fx_file *fx = fx_load(tx);
        const fx_array *a = fx ? fx_get(fx, "logits") : NULL;
        CHECK_MSG(fx != NULL, "%s: %s", tx, fx_error());
        CHECK(a && a->dtype == FX_F32 && a->numel == tfm_numel(&lg) &&
              !memcmp(a->f32, lg.data, (size_t)a->numel * sizeof(float)));
        a = fx ? fx_get(fx, "tokens") : NULL;
        CHECK(a && a->numel == (int64_t)d.B * d.T && !memcmp(a->i32, d.tokens, (size_t)a->numel * 4));
        fx_free(fx);
    }
    CHECK_OK(tfm_config_load(st, &lc));
    lc.seed += 1;
    if (io_init(&m2, &lc, io_kind_name[k])) {
        CHECK_OK(tfm_model_load(&m2, st));
        CHECK(io_same_logits(&m, &m2, 1000 + (uint64_t)k));
        tfm_model_free(&m2);
    }
    /* torch_models.py mirrors every option used here (and not no_bias) */
    CHECK(!m.cfg.no_bias);
    for (i = 0; i < m.n_params; i++) CHECK(m.params[i].value.data != NULL);
    tfm_model_free(&m);
}

static void io_export(void) {
    int k;
    if (!io_mkdir("build") || !io_mkdir(IO_EXPORT_DIR)) {
#if defined(IO_POSIX)
        TEST__FAIL("cannot create %s: %s", IO_EXPORT_DIR, strerror(errno));
#endif
        return;
    }
    for (k = 0; k < 3; k++) io_export_case(k);
}

/* One thread, as suite_models: for models this small a parallel region costs far more than its
   work (bit-identity is checked within a thread count; the results do not depend on it anyway). */
/* A checkpoint written before cfg.max_seq_len became cfg.max_len records "tfm.max_seq_len" (and neither
   input_dim nor cls_token, which came later): its config loads with max_len read from the old key, the
   model loads bit for bit, the new key wins where a file has both, and a malformed old value is named. */
static void io_config_old_key(void) {
    const char *full = io_path("old_full.safetensors"), *path = io_path("old.safetensors"), *d;
    tfm_config c = io_cfg(1), lc, rc;
    tfm_model m, m2;
    io_meta mt;
    tfm__st_header h;
    char len[32];
    int j;
    if (!io_init(&m, &c, "old key")) return;
    CHECK_OK(tfm_model_save(&m, full, 0, NULL, 0));
    if (io_meta_from(&mt, full, &h)) {
        for (j = 0; j < mt.n && strcmp(mt.kv[2 * j], "tfm.max_len"); j++) {}
        CHECK(j < mt.n);
        snprintf(len, sizeof len, "%s", j < mt.n ? mt.val[j] : "0");
        CHECK(atoi(len) == m.cfg.max_len);
        io_meta_set(&mt, "tfm.max_len", NULL);
        io_meta_set(&mt, "tfm.input_dim", NULL);
        io_meta_set(&mt, "tfm.cls_token", NULL);
        io_meta_set(&mt, "tfm.max_seq_len", len);
        CHECK_OK(io_save_custom(path, &m, 0, &mt, NULL, NULL, NULL));
        CHECK_OK(tfm_config_load(path, &lc));
        CHECK_MSG(lc.max_len == m.cfg.max_len, "old key: max_len %d, want %d", lc.max_len, m.cfg.max_len);
        CHECK_OK(tfm_config_resolve(&lc, &rc));
        d = io_cfg_diff(&rc, &m.cfg);
        CHECK_MSG(d == NULL, "old key: the config differs in %s", d);
        if (io_init(&m2, &lc, "old key")) {
            CHECK_OK(tfm_model_load(&m2, path));
            CHECK(io_params_diff(&m, &m2) == NULL);
            tfm_model_free(&m2);
        }
        CHECK_OK(tfm_model_load(&m, path));
        /* both keys: the new one counts */
        io_meta_set(&mt, "tfm.max_len", len);
        io_meta_set(&mt, "tfm.max_seq_len", "3");
        CHECK_OK(io_save_custom(path, &m, 0, &mt, NULL, NULL, NULL));
        CHECK_OK(tfm_config_load(path, &lc));
        CHECK_MSG(lc.max_len == m.cfg.max_len, "both keys: max_len %d, want %d", lc.max_len, m.cfg.max_len);
        /* a malformed old value */
        io_meta_set(&mt, "tfm.max_len", NULL);
        io_meta_set(&mt, "tfm.max_seq_len", "12.5");
        CHECK_OK(io_save_custom(path, &m, 0, &mt, NULL, NULL, NULL));
        CHECK_ERR(tfm_config_load(path, &lc), TFM_E_FORMAT, "tfm.max_seq_len");
        CHECK_ERR(tfm_model_load(&m, path), TFM_E_FORMAT, "tfm.max_seq_len");
        tfm__st_header_free(&h);
    }
    tfm_model_free(&m);
    remove(full);
    remove(path);
}

/* ---- checkpoints named another way: tfm_model_load_mapped ---- */

/* A safetensors file of n tensors by hand (names, dtypes, shapes of up to 2 dims, data bytes), as other
   writers make them: an I64 tensor among F32 ones, in the order given. 0 on an I/O failure. */
typedef struct io_ht {
    const char *name, *dtype;
    int ndim;
    int64_t shape[2];
    const void *data;
    size_t bytes;
} io_ht;
static int io_write_foreign(const char *path, const io_ht *t, int n) {
    char hdr[8192];
    size_t len = 0, off = 0;
    unsigned char len8[8];
    FILE *f;
    int i, k;
    len += (size_t)snprintf(hdr + len, sizeof hdr - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (i = 0; i < n; off += t[i].bytes, i++) {
        len += (size_t)snprintf(hdr + len, sizeof hdr - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
        for (k = 0; k < t[i].ndim; k++) len += (size_t)snprintf(hdr + len, sizeof hdr - len, "%s%lld", k ? "," : "", (long long)t[i].shape[k]);
        len += (size_t)snprintf(hdr + len, sizeof hdr - len, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].bytes);
    }
    len += (size_t)snprintf(hdr + len, sizeof hdr - len, "}");
    for (k = 0; k < 8; k++) len8[k] = (unsigned char)(len >> (8 * k));
    if (!(f = fopen(path, "wb"))) return 0;
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, len, f);
    for (i = 0; i < n; i++) fwrite(t[i].data, 1, t[i].bytes, f);
    return fclose(f) == 0;
}

/* A BERT-layout classifier from a file in Hugging Face's names: q, k and v into in_proj_* as parts 0-2,
   the head kept, the I64 position_ids and the pooler skipped; the loaded values land where the map says
   (the query rows first), and each defect (an unskipped I64, an unskipped tensor, one the map names that
   the file lacks, a misshapen one, an uncovered parameter, a part mapped twice) fails naming it, with the
   model untouched. */
static void io_mapped(void) {
    enum { V = 7, C = 8, F = 16, P = 5 };
    static const char *hf[16] = {
        "embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias",
        "encoder.layer.0.attention.self.query.weight", "encoder.layer.0.attention.self.key.weight",
        "encoder.layer.0.attention.self.value.weight", "encoder.layer.0.attention.self.query.bias",
        "encoder.layer.0.attention.self.key.bias", "encoder.layer.0.attention.self.value.bias",
        "encoder.layer.0.attention.output.dense.weight", "encoder.layer.0.attention.output.dense.bias",
        "encoder.layer.0.attention.output.LayerNorm.weight", "encoder.layer.0.attention.output.LayerNorm.bias",
        "encoder.layer.0.intermediate.dense.weight"};
    static const char *rest[6] = {"encoder.layer.0.intermediate.dense.bias", "encoder.layer.0.output.dense.weight",
                                  "encoder.layer.0.output.dense.bias", "encoder.layer.0.output.LayerNorm.weight",
                                  "encoder.layer.0.output.LayerNorm.bias", "pooler.dense.weight"};
    tfm_name_map map[24] = {
        {"embeddings.word_embeddings.weight", "tok_emb.weight", 0, 0, 0, 0},
        {"embeddings.position_embeddings.weight", "pos_emb.weight", 0, 0, P + 3, 0}, /* 3 rows more than max_len */
        {"embeddings.token_type_embeddings.weight", "type_emb.weight", 0, 0, 0, 0},
        {"embeddings.LayerNorm.weight", "emb_norm.weight", 0, 0, 0, 0},
        {"embeddings.LayerNorm.bias", "emb_norm.bias", 0, 0, 0, 0},
        {"encoder.layer.0.attention.self.query.weight", "encoder.layers.0.self_attn.in_proj_weight", 0, 3, 0, 0},
        {"encoder.layer.0.attention.self.key.weight", "encoder.layers.0.self_attn.in_proj_weight", 1, 3, 0, 0},
        {"encoder.layer.0.attention.self.value.weight", "encoder.layers.0.self_attn.in_proj_weight", 2, 3, 0, 0},
        {"encoder.layer.0.attention.self.query.bias", "encoder.layers.0.self_attn.in_proj_bias", 0, 3, 0, 0},
        {"encoder.layer.0.attention.self.key.bias", "encoder.layers.0.self_attn.in_proj_bias", 1, 3, 0, 0},
        {"encoder.layer.0.attention.self.value.bias", "encoder.layers.0.self_attn.in_proj_bias", 2, 3, 0, 0},
        {"encoder.layer.0.attention.output.dense.weight", "encoder.layers.0.self_attn.out_proj.weight", 0, 0, 0, 0},
        {"encoder.layer.0.attention.output.dense.bias", "encoder.layers.0.self_attn.out_proj.bias", 0, 0, 0, 0},
        {"encoder.layer.0.attention.output.LayerNorm.weight", "encoder.layers.0.norm1.weight", 0, 0, 0, 0},
        {"encoder.layer.0.attention.output.LayerNorm.bias", "encoder.layers.0.norm1.bias", 0, 0, 0, 0},
        {"encoder.layer.0.intermediate.dense.weight", "encoder.layers.0.linear1.weight", 0, 0, 0, 0},
        {"encoder.layer.0.intermediate.dense.bias", "encoder.layers.0.linear1.bias", 0, 0, 0, 0},
        {"encoder.layer.0.output.dense.weight", "encoder.layers.0.linear2.weight", 0, 0, 0, 0},
        {"encoder.layer.0.output.dense.bias", "encoder.layers.0.linear2.bias", 0, 0, 0, 0},
        {"encoder.layer.0.output.LayerNorm.weight", "encoder.layers.0.norm2.weight", 0, 0, 0, 0},
        {"encoder.layer.0.output.LayerNorm.bias", "encoder.layers.0.norm2.bias", 0, 0, 0, 0},
        {NULL, "head.weight", 0, 0, 0, 0},
        {NULL, "head.bias", 0, 0, 0, 0},
        {NULL, NULL, 0, 0, 0, 0}};
    const char *skip[2] = {"embeddings.position_ids", "pooler.dense.weight"};
    io_ht t[24];
    int64_t pos_ids[P];
    float *data, *snap, *at;
    const tfm_param *p;
    tfm_config c;
    tfm_model m;
    int i, n = 0;
    const char *path = io_path("mapped.safetensors"), *bad = io_path("mapped_bad.safetensors");
    memset(&c, 0, sizeof c);
    c.kind = TFM_MODEL_ENCODER_CLASSIFIER;
    c.vocab_size = V;
    c.n_classes = 2;
    c.d_model = C;
    c.n_heads = 2;
    c.n_layers = 1;
    c.d_ff = F;
    c.max_len = P;
    c.act = TFM_ACT_GELU;
    c.type_vocab_size = 2;
    c.emb_norm = 1;
    c.ln_eps = 1e-12f;
    c.seed = 3;
    if (tfm_model_init(&m, &c, NULL, 0) != TFM_OK) {
        TEST__FAIL("io_mapped: %s", tfm_last_error());
        return;
    }
    data = (float *)malloc(20000 * sizeof(float));
    for (i = 0; i < 20000; i++) data[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (i = 0; i < P; i++) pos_ids[i] = i;
    /* the tensors in the file: position_ids first, as Hugging Face writes it */
    t[n++] = (io_ht){"embeddings.position_ids", "I64", 2, {1, P}, pos_ids, sizeof pos_ids};
    for (i = 0, at = data; i < 21; i++) {
        const tfm_param *q = tfm_model_param(&m, map[i].model);
        int np = map[i].n_parts ? map[i].n_parts : 1;
        io_ht e;
        memset(&e, 0, sizeof e);
        e.name = i < 16 ? hf[i] : rest[i - 16];
        e.dtype = "F32";
        e.ndim = q->value.ndim;
        e.shape[0] = map[i].file_rows ? map[i].file_rows : q->value.shape[0] / np;
        e.shape[1] = q->value.ndim > 1 ? q->value.shape[1] : 0;
        e.data = at;
        e.bytes = (size_t)(e.shape[0] * (e.ndim > 1 ? e.shape[1] : 1)) * sizeof(float);
        at += e.bytes / sizeof(float);
        t[n++] = e;
    }
    t[n++] = (io_ht){rest[5], "F32", 2, {C, C}, at, (size_t)C * C * sizeof(float)};
    CHECK(io_write_foreign(path, t, n));
    snap = io_snapshot(&m);
    CHECK_OK(tfm_model_load_mapped(&m, path, map, 23, skip, 2));
    p = tfm_model_param(&m, "encoder.layers.0.self_attn.in_proj_weight");
    CHECK(p && !memcmp(p->value.data, t[6].data, t[6].bytes) && !memcmp(p->value.data + C * C, t[7].data, t[7].bytes) &&
          !memcmp(p->value.data + 2 * C * C, t[8].data, t[8].bytes));
    p = tfm_model_param(&m, "encoder.layers.0.self_attn.in_proj_bias");
    CHECK(p && !memcmp(p->value.data + C, t[10].data, t[10].bytes));
    p = tfm_model_param(&m, "tok_emb.weight");
    CHECK(p && !memcmp(p->value.data, t[1].data, t[1].bytes));
    p = tfm_model_param(&m, "pos_emb.weight"); /* the first P of the file's P + 3 rows */
    CHECK(p && t[2].bytes == (P + 3) * C * sizeof(float) && !memcmp(p->value.data, t[2].data, (size_t)P * C * sizeof(float)));
    p = tfm_model_param(&m, "head.weight");
    {
        int64_t off = 0;
        for (i = 0; &m.params[i] != p; i++) off += tfm_numel(&m.params[i].value);
        CHECK_MSG(!memcmp(p->value.data, snap + off, (size_t)tfm_numel(&p->value) * sizeof(float)), "the kept head changed");
    }
    free(snap);
    /* defects, each naming what is wrong, the model untouched */
    snap = io_snapshot(&m);
    CHECK_ERR(tfm_model_load_mapped(&m, path, map, 23, skip + 1, 1), TFM_E_FORMAT, "dtype 'I64' is not supported");
    CHECK_ERR(tfm_model_load_mapped(&m, path, map, 23, skip, 1), TFM_E_FORMAT, "unexpected tensor 'pooler.dense.weight'");
    CHECK_ERR(tfm_model_load_mapped(&m, path, map, 22, skip, 2), TFM_E_ARG, "head.bias is not covered");
    {
        tfm_name_map m2[23];
        memcpy(m2, map, sizeof m2);
        m2[22] = (tfm_name_map){"embeddings.extra", "head.bias", 0, 0, 0, 0};
        CHECK_ERR(tfm_model_load_mapped(&m, path, m2, 23, skip, 2), TFM_E_FORMAT, "tensor 'embeddings.extra' not found");
        memcpy(m2, map, sizeof m2);
        m2[22] = (tfm_name_map){NULL, "head.bias", 0, 0, 0, 0};
        m2[7].part = 1; /* value into the key's rows: key twice, value's rows uncovered */
        CHECK_ERR(tfm_model_load_mapped(&m, path, m2, 23, skip, 2), TFM_E_ARG, "in_proj_weight part 1 is mapped twice");
        memcpy(m2, map, sizeof m2);
        m2[22] = (tfm_name_map){NULL, "head.bias", 0, 0, 0, 0};
        m2[1].file_rows = 0;
        CHECK_ERR(tfm_model_load_mapped(&m, path, m2, 23, skip, 2), TFM_E_FORMAT,
                  "tensor 'embeddings.position_embeddings.weight' is (8,8) in the file but (5,8) is wanted");
        m2[1].file_rows = P - 1;
        CHECK_ERR(tfm_model_load_mapped(&m, path, m2, 23, skip, 2), TFM_E_ARG, "file_rows 4");
    }
    t[5].dtype = "F16"; /* a parameter in another dtype: refused even when skipped elsewhere */
    t[5].bytes /= 2;
    CHECK(io_write_foreign(bad, t, n));
    CHECK_ERR(tfm_model_load_mapped(&m, bad, map, 23, skip, 2), TFM_E_FORMAT, "dtype 'F16' is not supported");
    CHECK_ERR(tfm_model_load_mapped(&m, path, map, 23, NULL, 2), TFM_E_ARG, "tfm_model_load_mapped");
    CHECK_ERR(tfm_model_load(&m, path), TFM_E_FORMAT, "dtype 'I64' is not supported");
    CHECK_MSG(io_snapshot_diff(&m, snap) == NULL, "a failed mapped load changed %s", io_snapshot_diff(&m, snap));
    free(snap);
    free(data);
    tfm_model_free(&m);
}

/* ---- Hugging Face LLaMA names: tfm_llama_name_map, tfm_model_save_mapped ---- */

/* The LLaMA-shaped LM of a tools/torch_llama.py fixture ("cfg": vocab, d_model, n_heads, n_kv_heads,
   n_layers, d_ff, tied; "eps_theta": rms_norm_eps, rope_theta), for batches of B rows of T. */
static tfm_config io_llama_cfg(const fx_array *cfg, const fx_array *et, int B, int T) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = TFM_MODEL_DECODER_LM;
    c.vocab_size = cfg->i32[0];
    c.d_model = cfg->i32[1];
    c.n_heads = cfg->i32[2];
    c.n_kv_heads = cfg->i32[3];
    c.n_layers = cfg->i32[4];
    c.d_ff = cfg->i32[5];
    c.tie_output = cfg->i32[6];
    c.ln_eps = (float)et->f64[0];
    c.rope_base = (float)et->f64[1];
    c.max_len = T;
    c.max_batch = B;
    c.act = TFM_ACT_SWIGLU;
    c.norm = TFM_NORM_RMS;
    c.norm_first = 1;
    c.no_bias = 1;
    c.pos = TFM_POS_ROPE;
    c.seed = 77;
    return c;
}

/* The model's LLaMA map in new malloc'd memory (map, then the names), *n entries; NULL on failure. */
static tfm_name_map *io_llama_map(const tfm_model *m, int *n) {
    tfm_name_map *map;
    *n = 0;
    if (tfm_llama_name_map(m, NULL, NULL, 0, n) != TFM_OK || *n <= 0) {
        TEST__FAIL("tfm_llama_name_map: %s", tfm_last_error());
        return NULL;
    }
    map = (tfm_name_map *)malloc((size_t)*n * (sizeof *map + 64));
    if (map && tfm_llama_name_map(m, map, (char(*)[64])(void *)(map + *n), *n, n) != TFM_OK) {
        TEST__FAIL("tfm_llama_name_map: %s", tfm_last_error());
        free(map);
        map = NULL;
    }
    return map;
}

/* The entry of map (n) for file tensor `file`, or NULL. */
static const tfm_name_map *io_map_find(const tfm_name_map *map, int n, const char *file) {
    int i;
    for (i = 0; i < n; i++)
        if (map[i].file && !strcmp(map[i].file, file)) return &map[i];
    return NULL;
}

/* A fixture of tools/torch_llama.py: loaded through the LLaMA map, the model gives torch's float64
   logits within 1e-5 relative (float32 weights, a float32 forward through 1-2 layers: the C error is a
   few float32 roundings of values of order 1, ~1e-6); saved back through the map it is the
   exporter's file byte for byte (names, order, shapes, metadata, layout), so the bytes PyTorch wrote
   and loads are the bytes the C writes. Then a few training steps and a save to build/io_export/llama
   with the C logits, for `tools/torch_llama.py check build/io_export/llama` (make torch-check). */
static void io_llama_case(const char *name) {
    char st[600], out[256], tx[256];
    const fx_array *cfg, *et, *tok, *logits;
    fx_file *fx = fx_open(name);
    tfm_config c;
    tfm_model m;
    tfm_batch b;
    tfm_tensor lg;
    tfm_name_map *map = NULL;
    const tfm_name_map *e;
    unsigned char *orig = NULL;
    size_t orig_size = 0;
    int32_t targets[64];
    int n = 0, i, B, T;
    if (!fx) {
        TEST__FAIL("%s: %s (tools/torch_llama.py export writes it)", name, fx_error());
        return;
    }
    cfg = fx_get(fx, "cfg");
    et = fx_get(fx, "eps_theta");
    tok = fx_get(fx, "tokens");
    logits = fx_get(fx, "logits");
    if (!cfg || cfg->dtype != FX_I32 || cfg->numel != 7 || !et || et->dtype != FX_F64 || et->numel != 2 || !tok ||
        tok->dtype != FX_I32 || tok->ndim != 2 || tok->numel > 64 || !logits || logits->dtype != FX_F64) {
        TEST__FAIL("%s: the .tfx lacks an array or has one of the wrong type", name);
        fx_free(fx);
        return;
    }
    B = (int)tok->dims[0];
    T = (int)tok->dims[1];
    c = io_llama_cfg(cfg, et, B, T);
    if (!io_init(&m, &c, name)) {
        fx_free(fx);
        return;
    }
    snprintf(st, sizeof st, "%s/%s.safetensors", fx_dir(), name);
    map = io_llama_map(&m, &n);
    CHECK(map && n == 2 + 9 * c.n_layers + !c.tie_output);
    /* the entries the names promise: SwiGLU's gate is linear1's first rows, the query in_proj's first */
    e = map ? io_map_find(map, n, "model.layers.0.mlp.gate_proj.weight") : NULL;
    CHECK(e && !strcmp(e->model, "decoder.layers.0.linear1.weight") && e->part == 0 && e->n_parts == 2);
    /* rows: the query C, the key and the value C / n_heads * n_kv_heads each (k_proj, v_proj (Ckv, C)) */
    e = map ? io_map_find(map, n, "model.layers.0.self_attn.q_proj.weight") : NULL;
    CHECK(e && !strcmp(e->model, "decoder.layers.0.self_attn.in_proj_weight") && e->part == 0 && e->n_parts == 3 &&
          e->rows == c.d_model);
    e = map ? io_map_find(map, n, "model.layers.0.self_attn.v_proj.weight") : NULL;
    CHECK(e && !strcmp(e->model, "decoder.layers.0.self_attn.in_proj_weight") && e->part == 2 && e->n_parts == 3 &&
          e->rows == c.d_model / c.n_heads * cfg->i32[3]);
    CHECK((map && io_map_find(map, n, "lm_head.weight") != NULL) == !c.tie_output);
    if (!map) goto done;
    CHECK_OK(tfm_model_load_mapped(&m, st, map, n, NULL, 0));
    memset(&b, 0, sizeof b);
    for (i = 0; i < B * T; i++) targets[i] = i % T + 1 < T ? tok->i32[i + 1] : 0;
    b.batch = B;
    b.len = T;
    b.tokens = tok->i32;
    b.targets = targets;
    tfm_model_train(&m, 0);
    CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
    lg = tfm_model_logits(&m);
    CHECK(tfm_numel(&lg) == logits->numel);
    if (tfm_numel(&lg) == logits->numel) {
        double err = test_rel_err(lg.data, logits->f64, (size_t)logits->numel);
        char what[96];
        if (test__verbose) printf("      %-28s logits rel err %.2e\n", name, err);
        snprintf(what, sizeof what, "%s: logits", name);
        CHECK_REL(what, err, IO_TOL);
    }
    /* saved back: the exporter's bytes */
    orig = io_read(st, &orig_size);
    snprintf(out, sizeof out, "%s.safetensors", name);
    CHECK_OK(tfm_model_save_mapped(&m, io_path(out), map, n, NULL, 0));
    CHECK_MSG(orig && io_same_file(io_path(out), orig, orig_size), "%s: saved through the map, not the exporter's bytes", name);
    /* trained, saved for PyTorch to check */
    tfm_model_train(&m, 1);
    {
        tfm_optim o = io_opt(0);
        io_tfx t;
        for (i = 0; i < 3; i++) {
            tfm_model_zero_grad(&m);
            CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
            CHECK_OK(tfm_model_backward(&m, 1.0f));
            CHECK_OK(tfm_model_step(&m, &o, NULL));
        }
        tfm_model_train(&m, 0);
        CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
        lg = tfm_model_logits(&m);
        if (!io_mkdir("build") || !io_mkdir(IO_EXPORT_DIR) || !io_mkdir(IO_EXPORT_DIR "/llama")) {
            TEST__FAIL("cannot create %s/llama", IO_EXPORT_DIR);
            goto done;
        }
        snprintf(out, sizeof out, "%s/llama/%s.safetensors", IO_EXPORT_DIR, name);
        snprintf(tx, sizeof tx, "%s/llama/%s.tfx", IO_EXPORT_DIR, name);
        CHECK_OK(tfm_model_save_mapped(&m, out, map, n, NULL, 0));
        CHECK_MSG(!io_same_file(out, orig, orig_size), "%s: training changed nothing", name);
        memset(&t, 0, sizeof t);
        t.ok = 1;
        io_tfx_array(&t, "cfg", FX_I32, 1, cfg->dims, cfg->i32);
        io_tfx_array(&t, "eps_theta", FX_F64, 1, et->dims, et->f64);
        io_tfx_array(&t, "tokens", FX_I32, 2, tok->dims, tok->i32);
        io_tfx_array(&t, "logits", FX_F32, lg.ndim, lg.shape, lg.data);
        CHECK_MSG(io_tfx_save(&t, tx), "cannot write %s", tx);
        free(t.p);
    }
done:
    free(orig);
    free(map);
    tfm_model_free(&m);
    fx_free(fx);
}

static void io_llama(void) {
    io_llama_case("llama_hf_untied");
    io_llama_case("llama_hf_tied");
    io_llama_case("llama_hf_gqa"); /* 4 query heads over 2 key/value heads */
}

/* tfm_llama_name_map refuses models Hugging Face's LLaMA cannot hold, naming the field, and checks its
   arguments; hostile files stay TFM_E_FORMAT naming the tensor, with the model untouched;
   tfm_model_save_mapped validates the map and its arguments, keeps user metadata, and a failed save
   leaves the old file as it was. */
static void io_llama_errors(void) {
    static const int32_t cfgv[7] = {11, 8, 2, 2, 1, 12, 0};
    static const double etv[2] = {1e-5, 10000.0};
    fx_array cfg, et;
    tfm_config c, bad;
    tfm_model m, m2;
    tfm_name_map *map = NULL, *m3 = NULL, one;
    char names[4][64];
    float *snap = NULL;
    unsigned char *old = NULL;
    size_t old_size = 0;
    int n = 0, k, tmp0;
    const char *path = io_path("llama.safetensors"), *other = io_path("llama_other.safetensors");
    tfm_kv kv;
    char got[32];
    float keep;
    memset(&cfg, 0, sizeof cfg);
    memset(&et, 0, sizeof et);
    cfg.i32 = (int32_t *)cfgv;
    et.f64 = (double *)etv;
    c = io_llama_cfg(&cfg, &et, 2, 5);
    /* not LLaMA-shaped: each refused, naming what */
    for (k = 0; k < 9; k++) {
        static const char *const want[9] = {"not a decoder LM", "post-norm", "layernorms", "not SwiGLU", "has biases",
                                            "not rotary", "part of each head", "scales its embeddings",
                                            "sliding window"};
        bad = c;
        if (k == 0) bad.kind = TFM_MODEL_ENCODER_CLASSIFIER, bad.n_classes = 2;
        if (k == 1) bad.norm_first = 0;
        if (k == 2) bad.norm = TFM_NORM_LAYER;
        if (k == 3) bad.act = TFM_ACT_GELU;
        if (k == 4) bad.no_bias = 0;
        if (k == 5) bad.pos = TFM_POS_LEARNED, bad.rope_base = 0;
        if (k == 6) bad.rope_dims = 2;
        if (k == 7) bad.scale_emb = 1;
        if (k == 8) bad.attn_window = 3;
        if (!io_init(&m, &bad, want[k])) continue;
        CHECK_ERR(tfm_llama_name_map(&m, NULL, NULL, 0, &n), TFM_E_ARG, want[k]);
        tfm_model_free(&m);
    }
    if (!io_init(&m, &c, "llama errors")) return;
    CHECK_ERR(tfm_llama_name_map(&m, NULL, NULL, 0, NULL), TFM_E_ARG, "tfm_llama_name_map");
    CHECK_ERR(tfm_llama_name_map(&m, NULL, NULL, 3, &n), TFM_E_ARG, "tfm_llama_name_map");
    CHECK_ERR(tfm_llama_name_map(NULL, NULL, NULL, 0, &n), TFM_E_ARG, "tfm_llama_name_map");
    {
        tfm_name_map small[4];
        n = -5;
        CHECK_ERR(tfm_llama_name_map(&m, small, names, 4, &n), TFM_E_ARG, "has 12 entries, cap is 4");
        CHECK(n == -5);
    }
    map = io_llama_map(&m, &n);
    if (!map) goto done;
    m3 = (tfm_name_map *)malloc((size_t)(n + 1) * sizeof *m3);
    /* save: arguments and map checked */
    CHECK_ERR(tfm_model_save_mapped(&m, NULL, map, n, NULL, 0), TFM_E_ARG, "tfm_model_save_mapped");
    CHECK_ERR(tfm_model_save_mapped(&m, path, map, 0, NULL, 0), TFM_E_ARG, "tfm_model_save_mapped");
    CHECK_ERR(tfm_model_save_mapped(&m, path, map, n - 1, NULL, 0), TFM_E_ARG, "head.weight is not covered");
    memcpy(m3, map, (size_t)n * sizeof *m3);
    m3[2].file = m3[1].file; /* k_proj written under q_proj's name */
    CHECK_ERR(tfm_model_save_mapped(&m, path, m3, n, NULL, 0), TFM_E_ARG, "two tensors are named 'model.layers.0.self_attn.q_proj.weight'");
    memcpy(m3, map, (size_t)n * sizeof *m3);
    m3[0].file_rows = 20;
    CHECK_ERR(tfm_model_save_mapped(&m, path, m3, n, NULL, 0), TFM_E_ARG, "file_rows 20");
    kv.key = "";
    kv.value = "x";
    CHECK_ERR(tfm_model_save_mapped(&m, path, map, n, &kv, 1), TFM_E_ARG, "user metadata");
    CHECK(!io_read(path, &old_size)); /* nothing written by a failed save */
    kv.key = "tokenizer";
    kv.value = "bytes";
    CHECK_OK(tfm_model_save_mapped(&m, path, map, n, &kv, 1));
    CHECK_OK(tfm_checkpoint_meta(path, "tokenizer", got, sizeof got, NULL));
    CHECK(!strcmp(got, "bytes"));
    /* a save that fails half-way leaves the old file */
    old = io_read(path, &old_size);
    snap = io_snapshot(&m);
    keep = m.params[0].value.data[0];
    m.params[0].value.data[0] += 1.0f;
    tmp0 = io_count_tmp();
    io_hook_arm(TFM__ST_STAGE_WRITE, 4, EIO);
    CHECK_ERR(tfm_model_save_mapped(&m, path, map, n, NULL, 0), TFM_E_IO, "tfm_model_save_mapped");
    tfm__st_write_hook = NULL;
    CHECK(old && io_same_file(path, old, old_size) && io_count_tmp() == tmp0);
    m.params[0].value.data[0] = keep;
    /* hostile files: misshapen (another d_ff), a tensor missing and one unexpected; the model untouched */
    bad = c;
    bad.d_ff = 16;
    if (io_init(&m2, &bad, "llama d_ff 16")) {
        int n2 = 0;
        tfm_name_map *map2 = io_llama_map(&m2, &n2);
        if (map2) CHECK_OK(tfm_model_save_mapped(&m2, other, map2, n2, NULL, 0));
        CHECK_ERR(tfm_model_load_mapped(&m, other, map, n, NULL, 0), TFM_E_FORMAT,
                  "tensor 'model.layers.0.mlp.gate_proj.weight' is (16,8) in the file but (12,8) is wanted");
        free(map2);
        tfm_model_free(&m2);
    }
    memcpy(m3, map, (size_t)n * sizeof *m3);
    m3[4].file = "model.layers.0.self_attn.out_proj.weight";
    CHECK_OK(tfm_model_save_mapped(&m, other, m3, n, NULL, 0));
    CHECK_ERR(tfm_model_load_mapped(&m, other, map, n, NULL, 0), TFM_E_FORMAT, "o_proj.weight' not found");
    memcpy(m3, map, (size_t)n * sizeof *m3);
    m3[n] = map[n - 1]; /* a second copy of lm_head.weight's entry */
    m3[n].file = "model.layers.0.self_attn.rotary_emb.inv_freq";
    CHECK_ERR(tfm_model_load_mapped(&m, path, m3, n + 1, NULL, 0), TFM_E_ARG, "head.weight part 0 is mapped twice");
    CHECK(io_snapshot_diff(&m, snap) == NULL);
    /* an entry that names no parameter */
    memset(&one, 0, sizeof one);
    CHECK_ERR(tfm_model_load_mapped(&m, path, &one, 1, NULL, 0), TFM_E_ARG, "which the model does not have");
done:
    free(old);
    free(snap);
    free(m3);
    free(map);
    tfm_model_free(&m);
}

/* Parts of unequal rows (what grouped-query attention's q|k|v needs): a (2,C) and a (1,C) tensor make
   one (3,C) parameter, each part starting where the part before it (in part order, not file order)
   ends; saving writes them back as they came; rows that do not add up, or a file tensor of other rows,
   are refused naming them. */
static void io_mapped_unequal(void) {
    enum { C = 4 };
    float a[2 * C], bv[C], *snap;
    io_ht t[2];
    tfm_config c;
    tfm_model m;
    tfm_name_map *map;
    const tfm_param *p;
    unsigned char *f;
    size_t fs = 0;
    int i, n;
    const char *path = io_path("unequal.safetensors"), *back = io_path("unequal_back.safetensors");
    memset(&c, 0, sizeof c);
    c.kind = TFM_MODEL_DECODER_LM;
    c.vocab_size = 3;
    c.d_model = C;
    c.n_heads = 2;
    c.n_layers = 1;
    c.max_len = 4;
    c.seed = 5;
    if (!io_init(&m, &c, "unequal")) return;
    for (i = 0; i < 2 * C; i++) a[i] = 10.0f + (float)i;
    for (i = 0; i < C; i++) bv[i] = -1.0f - (float)i;
    t[0] = (io_ht){"b", "F32", 2, {1, C}, bv, sizeof bv}; /* the second part first in the file */
    t[1] = (io_ht){"a", "F32", 2, {2, C}, a, sizeof a};
    CHECK(io_write_foreign(path, t, 2));
    map = (tfm_name_map *)calloc((size_t)m.n_params + 1, sizeof *map);
    for (i = n = 0; i < m.n_params; i++)
        if (strcmp(m.params[i].name, "tok_emb.weight")) map[n++].model = m.params[i].name; /* kept */
    map[n++] = (tfm_name_map){"a", "tok_emb.weight", 0, 2, 0, 2};
    map[n++] = (tfm_name_map){"b", "tok_emb.weight", 1, 2, 0, 1};
    snap = io_snapshot(&m);
    CHECK_OK(tfm_model_load_mapped(&m, path, map, n, NULL, 0));
    p = tfm_model_param(&m, "tok_emb.weight");
    CHECK(p && !memcmp(p->value.data, a, sizeof a) && !memcmp(p->value.data + 2 * C, bv, sizeof bv));
    CHECK_OK(tfm_model_save_mapped(&m, back, map, n, NULL, 0));
    f = io_read(back, &fs); /* a then b, in map order, the last 3C floats */
    CHECK(f && fs > sizeof a + sizeof bv && !memcmp(f + fs - sizeof a - sizeof bv, a, sizeof a) &&
          !memcmp(f + fs - sizeof bv, bv, sizeof bv) && strstr((const char *)f + 8, "\"a\":{\"dtype\":\"F32\",\"shape\":[2,4]") &&
          strstr((const char *)f + 8, "\"b\":{\"dtype\":\"F32\",\"shape\":[1,4]"));
    free(f);
    free(snap);
    snap = io_snapshot(&m);
    map[n - 1].rows = 2;
    CHECK_ERR(tfm_model_load_mapped(&m, path, map, n, NULL, 0), TFM_E_ARG, "the 2 parts of tok_emb.weight have 4 rows in all, the parameter has 3");
    CHECK_ERR(tfm_model_save_mapped(&m, back, map, n, NULL, 0), TFM_E_ARG, "have 4 rows in all");
    map[n - 1].rows = 0;
    map[n - 2].rows = 0;
    CHECK_ERR(tfm_model_load_mapped(&m, path, map, n, NULL, 0), TFM_E_ARG, "n_parts dividing the parameter's rows");
    map[n - 2].rows = 1;
    map[n - 1].rows = 2;
    CHECK_ERR(tfm_model_load_mapped(&m, path, map, n, NULL, 0), TFM_E_FORMAT,
              "tensor 'a' is (2,4) in the file but (1,4) is wanted");
    map[n - 2].rows = 4;
    CHECK_ERR(tfm_model_load_mapped(&m, path, map, n, NULL, 0), TFM_E_ARG, "rows 4");
    CHECK(io_snapshot_diff(&m, snap) == NULL);
    free(snap);
    free(map);
    tfm_model_free(&m);
}

static void suite_io(void) {
    int threads = tfm_get_num_threads();
    tfm_set_num_threads(1);
    RUN(io_roundtrip);
    RUN(io_resume);
    RUN(io_interrupted);
    RUN(io_errors_arch);
    RUN(io_errors_file);
    RUN(io_config_minimal);
    RUN(io_config_old_key);
    RUN(io_errors_tensors);
    RUN(io_inference);
    RUN(io_failed_load);
    RUN(io_user_meta);
    RUN(io_args);
    RUN(io_torch_fixtures);
    RUN(io_mapped);
    RUN(io_mapped_unequal);
    RUN(io_llama);
    RUN(io_llama_errors);
    RUN(io_export);
    tfm__st_write_hook = NULL;
    io_cleanup();
    tfm_set_num_threads(threads);
}
