/* tests/test_models_torch.c - transformer.h's layers (tfm_block), models (tfm_model_*) and AdamW step
   against PyTorch, from the reference fixtures blk_*.tfx, model_*.tfx and adamw_step.tfx in
   tests/fixtures/ (written by tools/gen_model_fixtures.py from the modules of tools/torch_models.py;
   the file format is described in fixture.h, the arrays of each kind of fixture in the generator).

   Blocks mirror torch.nn.TransformerEncoderLayer / TransformerDecoderLayer (batch_first, dropout 0):
   the fixture's parameters are copied into the layer's tensors, then forward (training 0) and
   backward of sum(y * dy) are compared: y, grad.x, grad.xkv and every parameter gradient.

   Models: the tfm_config comes from the fixture's "config" array; the model must have exactly the
   fixture's parameter set (same count, every name found by tfm_model_param, equal shapes, and the
   AdamW decay flag of each); the fixture's values are copied in, then the loss, the logits and the
   gradient of every parameter are compared.

   AdamW: two rounds of zero_grad, forward, backward, tfm_model_step on two batches; the gradients,
   the gradient norm and the parameters after each step are compared.

   Tolerance: every comparison is max |got - want| / max |want| <= 1e-5 (MT_TOL, test_rel_err). The
   references are float64; the C code computes in float32 through a few layers of sums of at most a
   few dozen terms, so its error is ~1e-7..1e-6 of the largest reference value. 1e-5 leaves room for
   that and no more. (The AdamW fixture is built so that gradient errors of that size move the
   updated parameters by less than 1e-6; see tools/gen_model_fixtures.py.)

   A missing or unreadable fixture is a failure, not a skip. Run with -v to print every error. */
#include "fixture.h"

#define MT_TOL 1e-5

/* ---- per-test bookkeeping: every buffer a test allocates is released by mt_end ---- */

#define MT_MAX_BUFS 16
static void *mt__bufs[MT_MAX_BUFS];
static int mt__nbufs = 0;
static const char *mt__case = "";

/* n floats, zeroed (fill_nan: all NaN, so an output left unwritten shows). */
static float *mt_buf(int64_t n, int fill_nan) {
    float *p = (float *)calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p || mt__nbufs == MT_MAX_BUFS) {
        free(p);
        TEST__FAIL("%s: out of memory (or too many buffers)", mt__case);
        return NULL;
    }
    if (fill_nan)
        for (int64_t i = 0; i < n; i++) p[i] = (float)NAN;
    mt__bufs[mt__nbufs++] = p;
    return p;
}

static fx_file *mt_begin(const char *name) {
    mt__case = name;
    mt__nbufs = 0;
    fx_file *fx = fx_open(name);
    if (!fx) TEST__FAIL("fixture %s missing or unreadable: %s", name, fx_error());
    return fx;
}

static void mt_end(fx_file *fx) {
    for (int i = 0; i < mt__nbufs; i++) free(mt__bufs[i]);
    mt__nbufs = 0;
    fx_free(fx);
}

/* The array `name` of dtype `dtype` with `ndim` dims (ndim < 0: any); a failure naming it if absent
   or different. */
static const fx_array *mt_need(const fx_file *fx, const char *name, int dtype, int ndim) {
    static const char *dtn[3] = {"f32", "f64", "i32"};
    const fx_array *a = fx_get(fx, name);
    if (!a) {
        TEST__FAIL("%s: fixture %s has no array \"%s\"", mt__case, fx->path, name);
        return NULL;
    }
    if (a->dtype != dtype || (ndim >= 0 && a->ndim != ndim)) {
        TEST__FAIL("%s: fixture array \"%s\" is %s with %d dims, want %s with %d", mt__case, name,
                   dtn[a->dtype], a->ndim, dtn[dtype], ndim);
        return NULL;
    }
    return a;
}

/* An i32 array of exactly n values (NULL and a failure otherwise). */
static const fx_array *mt_need_i32(const fx_file *fx, const char *name, int64_t n) {
    const fx_array *a = mt_need(fx, name, FX_I32, -1);
    if (a && a->numel != n) {
        TEST__FAIL("%s: \"%s\" has %lld values, want %lld", mt__case, name, (long long)a->numel,
                   (long long)n);
        return NULL;
    }
    return a;
}

static float mt_float(const fx_file *fx, const char *name, int *ok) {
    const fx_array *a = mt_need(fx, name, FX_F32, -1);
    if (!a || a->numel != 1) {
        if (a) TEST__FAIL("%s: \"%s\" is not a scalar", mt__case, name);
        *ok = 0;
        return 0;
    }
    return a->f32[0];
}

/* Compare n floats at got with values [off, off+n) of the f64 reference `name` (whole: n must be
   all of it): rel err <= MT_TOL. */
static void mt_cmp_part(const fx_file *fx, const char *name, int64_t off, const float *got, int64_t n,
                        int whole) {
    const fx_array *ref = mt_need(fx, name, FX_F64, -1);
    char what[320];
    if (!ref) return;
    snprintf(what, sizeof what, "%s: %s", mt__case, name);
    if (!got) {
        TEST__FAIL("%s: no data to compare", what);
        return;
    }
    if (off < 0 || off + n > ref->numel || (whole && n != ref->numel)) {
        TEST__FAIL("%s: %lld values, reference has %lld", what, (long long)n, (long long)ref->numel);
        return;
    }
    double e = test_rel_err(got, ref->f64 + off, (size_t)n);
    if (test__verbose) printf("      %-28s %-46s rel err %.2e\n", mt__case, name, e);
    CHECK_REL(what, e, MT_TOL);
}
static void mt_cmp(const fx_file *fx, const char *name, const float *got, int64_t n) {
    mt_cmp_part(fx, name, 0, got, n, 1);
}
/* Value i of the reference `name` against one float. */
static void mt_cmp_at(const fx_file *fx, const char *name, int64_t i, const float *got) {
    mt_cmp_part(fx, name, i, got, 1, 0);
}

/* A CPU tensor view of data with the given shape. */
static tfm_tensor mt_view(float *data, int ndim, const int64_t *dims) {
    tfm_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.ndim = ndim;
    for (int i = 0; i < ndim && i < TFM_MAX_DIMS; i++) t.shape[i] = dims[i];
    t.device = TFM_DEVICE_CPU;
    return t;
}

/* Whether the tensor t has exactly the shape of the fixture array a. */
static int mt_same_shape(const tfm_tensor *t, const fx_array *a) {
    if (t->ndim != a->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (t->shape[i] != a->dims[i]) return 0;
    return 1;
}

static const char *mt_dims_str(const fx_array *a, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    k += (size_t)snprintf(buf + k, n - k, "(");
    for (int i = 0; i < a->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)a->dims[i]);
    if (k < n) snprintf(buf + k, n - k, ")");
    return buf;
}

/* Copy the f32 fixture array `name` into t: equal shapes, t has data. 0 on a failure. */
static int mt_set(const fx_file *fx, const char *name, tfm_tensor *t) {
    const fx_array *a = mt_need(fx, name, FX_F32, -1);
    if (!a) return 0;
    if (!t || !t->data || !mt_same_shape(t, a)) {
        char s1[64], s2[64];
        TEST__FAIL("%s: parameter %s is %s (data %p), fixture has %s", mt__case, name,
                   t ? tfm_shape_str(t, s1, sizeof s1) : "missing", t ? (void *)t->data : NULL,
                   mt_dims_str(a, s2, sizeof s2));
        return 0;
    }
    memcpy(t->data, a->f32, (size_t)a->numel * sizeof(float));
    return 1;
}

/* Number of fixture arrays named "grad.<something>", leaving out the names in `except`. */
static int mt_count_grads(const fx_file *fx, const char *const *except, int n_except) {
    int n = 0;
    for (int i = 0; i < fx->count; i++) {
        const char *nm = fx->arrays[i].name;
        if (strncmp(nm, "grad.", 5) != 0) continue;
        int skip = 0;
        for (int j = 0; j < n_except; j++)
            if (!strcmp(nm, except[j])) skip = 1;
        n += !skip;
    }
    return n;
}

/* ---- blocks vs torch.nn.TransformerEncoderLayer / TransformerDecoderLayer ---- */

typedef struct mt_ptensor {
    char name[64];
    tfm_tensor *value, *grad;
} mt_ptensor;

#define MT_BLOCK_MAX_PARAMS 20

static void mt_add(mt_ptensor *p, int *n, const char *prefix, const char *name, tfm_tensor *value,
                   tfm_tensor *grad) {
    snprintf(p[*n].name, sizeof p[*n].name, "%s%s", prefix, name);
    p[*n].value = value;
    p[*n].grad = grad;
    (*n)++;
}

static void mt_add_mha(mt_ptensor *p, int *n, const char *prefix, tfm_mha *a) {
    mt_add(p, n, prefix, "in_proj_weight", &a->in_proj_weight, &a->d_in_proj_weight);
    mt_add(p, n, prefix, "in_proj_bias", &a->in_proj_bias, &a->d_in_proj_bias);
    mt_add(p, n, prefix, "out_proj.weight", &a->out_proj_weight, &a->d_out_proj_weight);
    mt_add(p, n, prefix, "out_proj.bias", &a->out_proj_bias, &a->d_out_proj_bias);
}

/* The layer's parameters under torch's names, with their gradients. */
static int mt_block_params(tfm_block *b, int cross, mt_ptensor *p) {
    static const char *norms[3] = {"norm1.", "norm2.", "norm3."};
    int n = 0;
    mt_add_mha(p, &n, "self_attn.", &b->self_attn);
    if (cross) mt_add_mha(p, &n, "multihead_attn.", &b->cross_attn);
    mt_add(p, &n, "linear1.", "weight", &b->linear1.weight, &b->linear1.d_weight);
    mt_add(p, &n, "linear1.", "bias", &b->linear1.bias, &b->linear1.d_bias);
    mt_add(p, &n, "linear2.", "weight", &b->linear2.weight, &b->linear2.d_weight);
    mt_add(p, &n, "linear2.", "bias", &b->linear2.bias, &b->linear2.d_bias);
    for (int i = 0; i < (cross ? 3 : 2); i++) {
        mt_add(p, &n, norms[i], "weight", &b->norm[i].weight, &b->norm[i].d_weight);
        mt_add(p, &n, norms[i], "bias", &b->norm[i].bias, &b->norm[i].d_bias);
    }
    return n;
}

/* slack > 0 sizes the layer for a larger batch and longer sequences than the fixture's. */
static void mt_block_case(const char *name, int slack) {
    fx_file *fx = mt_begin(name);
    if (!fx) return;
    tfm_mem mem;
    tfm_block blk;
    memset(&mem, 0, sizeof mem);
    memset(&blk, 0, sizeof blk);
    int ok = 1;
    /* config: d_model, n_heads, d_ff, cross, causal, norm_first, act, B, T, Tk */
    const fx_array *cfg = mt_need_i32(fx, "config", 10);
    float eps = mt_float(fx, "ln_eps", &ok);
    if (!cfg || !ok) goto done;
    {
        const int32_t *c = cfg->i32;
        int C = c[0], cross = c[3], B = c[7], T = c[8], Tk = c[9];
        int64_t xd[3], kd[3];
        xd[0] = B; xd[1] = T; xd[2] = C;
        kd[0] = B; kd[1] = Tk; kd[2] = C;
        const fx_array *x = mt_need(fx, "x", FX_F32, 3);
        const fx_array *dy = mt_need(fx, "dy", FX_F32, 3);
        const fx_array *xkv = cross ? mt_need(fx, "xkv", FX_F32, 3) : NULL;
        const fx_array *lens = fx_get(fx, "lens") ? mt_need_i32(fx, "lens", B) : NULL;
        const fx_array *xkv_lens = fx_get(fx, "xkv_lens") ? mt_need_i32(fx, "xkv_lens", B) : NULL;
        if (!x || !dy || (cross && !xkv) || (fx_get(fx, "lens") && !lens) ||
            (fx_get(fx, "xkv_lens") && !xkv_lens))
            goto done;
        if (x->numel != (int64_t)B * T * C || dy->numel != x->numel ||
            (cross && xkv->numel != (int64_t)B * Tk * C)) {
            TEST__FAIL("%s: x, dy or xkv do not match the config", name);
            goto done;
        }

        tfm_block_desc d;
        memset(&d, 0, sizeof d);
        d.d_model = C;
        d.n_heads = c[1];
        d.d_ff = c[2];
        d.cross = cross;
        d.norm_first = c[5];
        d.act = (tfm_activation)c[6];
        d.ln_eps = eps;
        d.max_batch = B + slack;
        d.max_len = T + slack;
        d.max_kv_len = cross ? Tk + slack : 0;

        tfm_result r = tfm_block_init(&blk, &d, &mem); /* counting pass */
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        r = tfm_mem_alloc(&mem);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        r = tfm_block_init(&blk, &d, &mem);
        CHECK_OK(r);
        CHECK_OK(tfm_mem_check(&mem));
        if (r != TFM_OK) goto done;

        mt_ptensor ps[MT_BLOCK_MAX_PARAMS];
        int np = mt_block_params(&blk, cross, ps);
        static const char *const inputs[2] = {"grad.x", "grad.xkv"};
        int nfx = mt_count_grads(fx, inputs, 2);
        CHECK_MSG(nfx == np, "%s: the fixture has %d parameter gradients, the layer %d parameters",
                  name, nfx, np);
        for (int i = 0; i < np; i++) {
            mt_set(fx, ps[i].name, ps[i].value);
            if (!ps[i].grad->data || tfm_numel(ps[i].grad) != tfm_numel(ps[i].value)) {
                TEST__FAIL("%s: %s has no gradient of its size", name, ps[i].name);
                continue;
            }
            memset(ps[i].grad->data, 0, (size_t)tfm_numel(ps[i].grad) * sizeof(float));
        }
        if (test__failed_checks) goto done;

        float *ybuf = mt_buf((int64_t)B * T * C, 1);
        float *dxbuf = mt_buf((int64_t)B * T * C, 0);
        float *dxkvbuf = mt_buf((int64_t)B * Tk * C, 0);
        if (!ybuf || !dxbuf || !dxkvbuf) goto done;
        tfm_tensor xt = mt_view(x->f32, 3, xd), dyt = mt_view(dy->f32, 3, xd);
        tfm_tensor xkvt = mt_view(cross ? xkv->f32 : NULL, 3, kd);
        tfm_tensor yt = mt_view(ybuf, 3, xd), dxt = mt_view(dxbuf, 3, xd);
        tfm_tensor dxkvt = mt_view(dxkvbuf, 3, kd);

        tfm_attn_opts bo;
        memset(&bo, 0, sizeof bo);
        bo.causal = c[4];
        bo.key_lens = lens ? lens->i32 : NULL;
        bo.kv_lens = xkv_lens ? xkv_lens->i32 : NULL;
        r = tfm_block_forward(&blk, &yt, &xt, cross ? &xkvt : NULL, &bo);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        mt_cmp(fx, "y", ybuf, (int64_t)B * T * C);
        r = tfm_block_backward(&blk, &dxt, cross ? &dxkvt : NULL, &dyt);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        mt_cmp(fx, "grad.x", dxbuf, (int64_t)B * T * C);
        if (cross) mt_cmp(fx, "grad.xkv", dxkvbuf, (int64_t)B * Tk * C);
        for (int i = 0; i < np; i++) {
            char gname[80];
            snprintf(gname, sizeof gname, "grad.%.63s", ps[i].name);
            mt_cmp(fx, gname, ps[i].grad->data, tfm_numel(ps[i].grad));
        }
    }
done:
    tfm_mem_free(&mem);
    mt_end(fx);
}

static void mt_blk_enc_post(void) { mt_block_case("blk_enc_post", 1); }
static void mt_blk_enc_pre(void) { mt_block_case("blk_enc_pre", 0); }
static void mt_blk_lm_pre(void) { mt_block_case("blk_lm_pre", 0); }
static void mt_blk_dec_post(void) { mt_block_case("blk_dec_post", 0); }
static void mt_blk_dec_pre(void) { mt_block_case("blk_dec_pre", 2); }

/* ---- models ---- */

/* config (i32[23]): kind, vocab_size, tgt_vocab_size, n_classes, d_model, n_heads, n_layers,
   n_dec_layers, d_ff, max_len, max_tgt_len, max_batch, act, norm_first, pos, scale_emb, pool,
   tie_output, share_emb, B, T, Tt, ignore_index */
enum {
    MT_KIND, MT_VOCAB, MT_TGT_VOCAB, MT_CLASSES, MT_DMODEL, MT_HEADS, MT_LAYERS, MT_DEC_LAYERS,
    MT_DFF, MT_MAX_SEQ, MT_MAX_TGT, MT_MAX_BATCH, MT_ACT, MT_NORM_FIRST, MT_POS, MT_SCALE_EMB,
    MT_POOL, MT_TIE, MT_SHARE, MT_B, MT_T, MT_TT, MT_IGNORE, MT_CONFIG_LEN
};

/* The tfm_config a fixture describes; 0 (and a failure) if it lacks one. */
static int mt_config(const fx_file *fx, tfm_config *cfg, const int32_t **c_out) {
    int ok = 1;
    const fx_array *a = mt_need_i32(fx, "config", MT_CONFIG_LEN);
    float ls = mt_float(fx, "label_smoothing", &ok);
    float eps = mt_float(fx, "ln_eps", &ok);
    if (!a || !ok) return 0;
    const int32_t *c = a->i32;
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = (tfm_model_kind)c[MT_KIND];
    cfg->vocab_size = c[MT_VOCAB];
    cfg->tgt_vocab_size = c[MT_TGT_VOCAB];
    cfg->n_classes = c[MT_CLASSES];
    cfg->d_model = c[MT_DMODEL];
    cfg->n_heads = c[MT_HEADS];
    cfg->n_layers = c[MT_LAYERS];
    cfg->n_dec_layers = c[MT_DEC_LAYERS];
    cfg->d_ff = c[MT_DFF];
    cfg->max_len = c[MT_MAX_SEQ];
    cfg->max_tgt_len = c[MT_MAX_TGT];
    cfg->max_batch = c[MT_MAX_BATCH];
    cfg->act = (tfm_activation)c[MT_ACT];
    cfg->norm_first = c[MT_NORM_FIRST];
    cfg->pos = (tfm_pos_kind)c[MT_POS];
    cfg->scale_emb = c[MT_SCALE_EMB];
    cfg->pool = (tfm_pool_kind)c[MT_POOL];
    cfg->tie_output = c[MT_TIE];
    cfg->share_emb = c[MT_SHARE];
    cfg->ignore_index = c[MT_IGNORE];
    cfg->has_ignore_index = 1;
    cfg->label_smoothing = ls;
    cfg->ln_eps = eps;
    cfg->seed = 1;
    if (fx_get(fx, "input")) { /* continuous inputs: input_dim, cls_token */
        const fx_array *in = mt_need_i32(fx, "input", 2);
        if (!in) return 0;
        cfg->input_dim = in->i32[0];
        cfg->cls_token = in->i32[1];
    }
    if (fx_get(fx, "norm")) { /* the norm kind, where not layernorm */
        const fx_array *nk = mt_need_i32(fx, "norm", 1);
        if (!nk) return 0;
        cfg->norm = (tfm_norm_kind)nk->i32[0];
    }
    if (fx_get(fx, "rope")) { /* rotary positions: rope_dims, and the base */
        const fx_array *rd = mt_need_i32(fx, "rope", 1);
        cfg->rope_base = mt_float(fx, "rope_base", &ok);
        if (!rd || !ok) return 0;
        cfg->rope_dims = rd->i32[0];
    }
    if (fx_get(fx, "n_kv_heads")) { /* grouped-query attention */
        const fx_array *kv = mt_need_i32(fx, "n_kv_heads", 1);
        if (!kv) return 0;
        cfg->n_kv_heads = kv->i32[0];
    }
    if (fx_get(fx, "window")) { /* a sliding window: attn_window, attn_sinks */
        const fx_array *w = mt_need_i32(fx, "window", 2);
        if (!w) return 0;
        cfg->attn_window = w->i32[0];
        cfg->attn_sinks = w->i32[1];
    }
    if (fx_get(fx, "bert")) { /* BERT's layout: type_vocab_size, emb_norm */
        const fx_array *bt = mt_need_i32(fx, "bert", 2);
        if (!bt) return 0;
        cfg->type_vocab_size = bt->i32[0];
        cfg->emb_norm = bt->i32[1];
    }
    *c_out = c;
    return 1;
}

/* The batch a fixture holds (suffix "" or "2": tokens2, targets2, ...). 0 on a failure. */
static int mt_batch(const fx_file *fx, const int32_t *c, const char *suffix, tfm_batch *b) {
    char nm[32];
    int kind = c[MT_KIND], B = c[MT_B], T = c[MT_T], Tt = c[MT_TT];
    memset(b, 0, sizeof *b);
    b->batch = B;
    b->len = T;
    snprintf(nm, sizeof nm, "inputs%s", suffix);
    if (fx_get(fx, nm)) { /* continuous inputs (B,T,input_dim) */
        const fx_array *in = mt_need(fx, nm, FX_F32, 3);
        if (!in || in->dims[0] != B || in->dims[1] != T) return 0;
        b->inputs = in->f32;
    } else {
        snprintf(nm, sizeof nm, "tokens%s", suffix);
        const fx_array *tok = mt_need_i32(fx, nm, (int64_t)B * T);
        if (!tok) return 0;
        b->tokens = tok->i32;
    }
    snprintf(nm, sizeof nm, "lens%s", suffix);
    if (fx_get(fx, nm)) {
        const fx_array *lens = mt_need_i32(fx, nm, B);
        if (!lens) return 0;
        b->lens = lens->i32;
    }
    snprintf(nm, sizeof nm, "types%s", suffix);
    if (fx_get(fx, nm)) { /* token types (B,T) */
        const fx_array *ty = mt_need_i32(fx, nm, (int64_t)B * T);
        if (!ty) return 0;
        b->token_types = ty->i32;
    }
    if (kind == TFM_MODEL_ENCODER_DECODER) {
        snprintf(nm, sizeof nm, "tgt_in%s", suffix);
        const fx_array *ti = mt_need_i32(fx, nm, (int64_t)B * Tt);
        if (!ti) return 0;
        b->tgt_len = Tt;
        b->tgt_in = ti->i32;
    }
    snprintf(nm, sizeof nm, "%s%s", kind == TFM_MODEL_ENCODER_CLASSIFIER ? "labels" : "targets", suffix);
    const fx_array *tg = mt_need_i32(fx, nm, kind == TFM_MODEL_ENCODER_CLASSIFIER ? B
                                            : (int64_t)B * (kind == TFM_MODEL_ENCODER_DECODER ? Tt : T));
    if (!tg) return 0;
    b->targets = tg->i32;
    return 1;
}

/* Whether AdamW decays the parameter `name` (decay_all == 0): the weight matrices of linear and
   attention maps; not biases, layernorms or embeddings (a tied output is an embedding). */
static int mt_is_decayed(const char *name) {
    static const char *suffixes[6] = {"in_proj_weight", "out_proj.weight", "linear1.weight",
                                      "linear2.weight", "head.weight", "input_proj.weight"};
    size_t n = strlen(name);
    for (int i = 0; i < 6; i++) {
        size_t k = strlen(suffixes[i]);
        if (n >= k && !strcmp(name + n - k, suffixes[i])) return 1;
    }
    return 0;
}

/* The model must hold exactly the fixture's parameters ({p : "grad.<p>" in the file}): same count,
   every name found, equal shapes, and the decay flag of each as AdamW's groups want. Copies the
   fixture's values in. 0 on a failure. */
static int mt_load_params(const fx_file *fx, tfm_model *m) {
    int before = test__failed_checks;
    int nfx = mt_count_grads(fx, NULL, 0);
    CHECK_MSG(m->n_params == nfx, "%s: the model has %d parameters, the fixture %d", mt__case,
              m->n_params, nfx);
    for (int i = 0; i < fx->count; i++) {
        const char *gname = fx->arrays[i].name;
        if (strncmp(gname, "grad.", 5) != 0) continue;
        const char *pname = gname + 5;
        const tfm_param *p = tfm_model_param(m, pname);
        if (!p) {
            TEST__FAIL("%s: the model has no parameter \"%s\"", mt__case, pname);
            continue;
        }
        tfm_tensor value = p->value; /* a view: writing through its data fills the model's */
        if (!p->grad.data || tfm_numel(&p->grad) != tfm_numel(&p->value)) {
            TEST__FAIL("%s: parameter %s has no gradient of its size", mt__case, pname);
            continue;
        }
        mt_set(fx, pname, &value);
        CHECK_MSG(p->decay == mt_is_decayed(pname), "%s: %s has decay %d, want %d", mt__case,
                  pname, p->decay, mt_is_decayed(pname));
    }
    for (int i = 0; i < m->n_params; i++) {
        char gname[96];
        snprintf(gname, sizeof gname, "grad.%s", m->params[i].name);
        CHECK_MSG(fx_get(fx, gname) != NULL, "%s: the model has parameter \"%s\", torch's has not",
                  mt__case, m->params[i].name);
    }
    return test__failed_checks == before;
}

/* Compare every parameter's gradient (prefix "grad.") or value (prefix "after1." ...) with the
   fixture's f64 reference of the same name. */
static void mt_cmp_params(const fx_file *fx, tfm_model *m, const char *prefix, int grads) {
    for (int i = 0; i < m->n_params; i++) {
        char nm[96];
        const tfm_param *p = &m->params[i];
        const tfm_tensor *t = grads ? &p->grad : &p->value;
        snprintf(nm, sizeof nm, "%s%s", prefix, p->name);
        mt_cmp(fx, nm, t->data, tfm_numel(t));
    }
}

static void mt_cmp_logits(const fx_file *fx, const tfm_model *m) {
    const fx_array *ref = mt_need(fx, "logits", FX_F64, -1);
    tfm_tensor lg = tfm_model_logits(m);
    if (!ref) return;
    if (!lg.data || !mt_same_shape(&lg, ref)) {
        char s1[64], s2[64];
        TEST__FAIL("%s: logits are %s (data %p), torch's %s", mt__case,
                   tfm_shape_str(&lg, s1, sizeof s1), (void *)lg.data, mt_dims_str(ref, s2, sizeof s2));
        return;
    }
    mt_cmp(fx, "logits", lg.data, tfm_numel(&lg));
}

static void mt_model_case(const char *name) {
    fx_file *fx = mt_begin(name);
    if (!fx) return;
    tfm_config cfg;
    tfm_model m;
    tfm_batch batch;
    const int32_t *c = NULL;
    int inited = 0;
    memset(&m, 0, sizeof m);
    if (!mt_config(fx, &cfg, &c) || !mt_batch(fx, c, "", &batch)) goto done;
    {
        tfm_result r = tfm_model_init(&m, &cfg, NULL, 0);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        inited = 1;
        if (!mt_load_params(fx, &m)) goto done;
        tfm_model_train(&m, 0);
        tfm_model_zero_grad(&m);
        float loss = NAN;
        r = tfm_model_forward(&m, &batch, &loss, NULL);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        mt_cmp(fx, "loss", &loss, 1);
        mt_cmp_logits(fx, &m);
        r = tfm_model_backward(&m, 1.0f);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        mt_cmp_params(fx, &m, "grad.", 1);
    }
done:
    if (inited) tfm_model_free(&m);
    mt_end(fx);
}

static void mt_model_cls_post_mean(void) { mt_model_case("model_cls_post_mean"); }
static void mt_model_cls_pre_cls(void) { mt_model_case("model_cls_pre_cls"); }
static void mt_model_lm_pre_tied(void) { mt_model_case("model_lm_pre_tied"); }
static void mt_model_lm_post_untied(void) { mt_model_case("model_lm_post_untied"); }
static void mt_model_bert_cls_post_mean(void) { mt_model_case("model_bert_cls_post_mean"); }
static void mt_model_bert_lm_pre(void) { mt_model_case("model_bert_lm_pre"); }
static void mt_model_encdec_pre_shared(void) { mt_model_case("model_encdec_pre_shared"); }
static void mt_model_encdec_post_separate(void) { mt_model_case("model_encdec_post_separate"); }
static void mt_model_vit_pre_cls(void) { mt_model_case("model_vit_pre_cls"); }
static void mt_model_vit_post_mean(void) { mt_model_case("model_vit_post_mean"); }
/* RMSNorm at every norm: pre-norm LM (final norm too, eps 1e-6), post-norm encoder-decoder */
static void mt_model_lm_pre_rms(void) { mt_model_case("model_lm_pre_rms"); }
static void mt_model_encdec_post_rms(void) { mt_model_case("model_encdec_post_rms"); }
/* SwiGLU feed-forward (linear1 (2F,C): gate rows, up rows): with RMSNorm in a pre-norm LM, and alone in a
   post-norm encoder-decoder */
static void mt_model_lm_llama_norm_mlp(void) { mt_model_case("model_lm_llama_norm_mlp"); }
static void mt_model_encdec_post_swiglu(void) { mt_model_case("model_encdec_post_swiglu"); }
/* Rotary positions (torch: RopeSelfAttention, Hugging Face LLaMA's rotate_half): LLaMA's block in an LM (every
   channel, base 10000), a post-LN LM turning 4 of 6 channels at base 100, an encoder-decoder (base 500) over a
   padded source, a classifier over padded rows turning 2 of 4 channels */
static void mt_model_lm_rope_llama(void) { mt_model_case("model_lm_rope_llama"); }
static void mt_model_lm_rope_partial(void) { mt_model_case("model_lm_rope_partial"); }
static void mt_model_encdec_rope(void) { mt_model_case("model_encdec_rope"); }
static void mt_model_encdec_gqa(void) { mt_model_case("model_encdec_gqa"); }
static void mt_model_cls_rope(void) { mt_model_case("model_cls_rope"); }
/* Grouped-query attention (torch: RopeSelfAttention with LLaMA's repeat_kv) in LLaMA's block: 4 query heads over
   2 key/value heads, and multi-query (3 query heads over 1, half of each head turned) */
static void mt_model_lm_gqa_llama(void) { mt_model_case("model_lm_gqa_llama"); }
static void mt_model_lm_mqa_llama(void) { mt_model_case("model_lm_mqa_llama"); }
static void mt_model_lm_window_llama(void) { mt_model_case("model_lm_window_llama"); }
static void mt_model_encdec_window(void) { mt_model_case("model_encdec_window"); }

/* ---- AdamW: clip_grad_norm_ then torch.optim.AdamW (no decay on biases, norms, embeddings) ---- */
static void mt_adamw_step(void) {
    fx_file *fx = mt_begin("adamw_step");
    if (!fx) return;
    tfm_config cfg;
    tfm_model m;
    tfm_batch batch[2];
    const int32_t *c = NULL;
    int inited = 0;
    memset(&m, 0, sizeof m);
    /* optim: lr, beta1, beta2, eps, weight_decay, clip_norm */
    const fx_array *o = mt_need(fx, "optim", FX_F32, 1);
    const fx_array *losses = mt_need(fx, "loss", FX_F64, 1);
    const fx_array *norms = mt_need(fx, "grad_norm", FX_F64, 1);
    if (!o || !losses || !norms) goto done;
    if (o->numel != 6 || losses->numel != 2 || norms->numel != 2) {
        TEST__FAIL("adamw_step: optim, loss or grad_norm has the wrong length");
        goto done;
    }
    if (!mt_config(fx, &cfg, &c) || !mt_batch(fx, c, "", &batch[0]) || !mt_batch(fx, c, "2", &batch[1]))
        goto done;
    {
        tfm_optim opt;
        memset(&opt, 0, sizeof opt);
        opt.lr = o->f32[0];
        opt.beta1 = o->f32[1];
        opt.beta2 = o->f32[2];
        opt.eps = o->f32[3];
        opt.weight_decay = o->f32[4];
        opt.clip_norm = o->f32[5];
        opt.schedule = TFM_SCHED_CONSTANT;

        tfm_result r = tfm_model_init(&m, &cfg, NULL, 0);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        inited = 1;
        if (!mt_load_params(fx, &m)) goto done;
        tfm_model_train(&m, 0);
        for (int s = 0; s < 2; s++) {
            float loss = NAN, gnorm = NAN;
            tfm_model_zero_grad(&m);
            r = tfm_model_forward(&m, &batch[s], &loss, NULL);
            CHECK_OK(r);
            if (r != TFM_OK) goto done;
            mt_cmp_at(fx, "loss", s, &loss);
            r = tfm_model_backward(&m, 1.0f);
            CHECK_OK(r);
            if (r != TFM_OK) goto done;
            mt_cmp_params(fx, &m, s == 0 ? "grad." : "grad2.", 1);
            r = tfm_model_step(&m, &opt, &gnorm);
            CHECK_OK(r);
            if (r != TFM_OK) goto done;
            mt_cmp_at(fx, "grad_norm", s, &gnorm);
            mt_cmp_params(fx, &m, s == 0 ? "after1." : "after2.", 0);
        }
        CHECK_MSG(m.step == 2, "adamw_step: model step is %lld after two steps", (long long)m.step);
    }
done:
    if (inited) tfm_model_free(&m);
    mt_end(fx);
}

static void suite_models_torch(void) {
    RUN(mt_blk_enc_post);
    RUN(mt_blk_enc_pre);
    RUN(mt_blk_lm_pre);
    RUN(mt_blk_dec_post);
    RUN(mt_blk_dec_pre);
    RUN(mt_model_cls_post_mean);
    RUN(mt_model_bert_cls_post_mean);
    RUN(mt_model_bert_lm_pre);
    RUN(mt_model_cls_pre_cls);
    RUN(mt_model_lm_pre_tied);
    RUN(mt_model_lm_post_untied);
    RUN(mt_model_encdec_pre_shared);
    RUN(mt_model_encdec_post_separate);
    RUN(mt_model_vit_pre_cls);
    RUN(mt_model_vit_post_mean);
    RUN(mt_model_lm_pre_rms);
    RUN(mt_model_encdec_post_rms);
    RUN(mt_model_lm_llama_norm_mlp);
    RUN(mt_model_encdec_post_swiglu);
    RUN(mt_model_lm_rope_llama);
    RUN(mt_model_lm_rope_partial);
    RUN(mt_model_lm_gqa_llama);
    RUN(mt_model_lm_mqa_llama);
    RUN(mt_model_encdec_rope);
    RUN(mt_model_encdec_gqa);
    RUN(mt_model_cls_rope);
    RUN(mt_model_lm_window_llama);
    RUN(mt_model_encdec_window);
    RUN(mt_adamw_step);
}
