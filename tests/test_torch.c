/* tests/test_torch.c - transformer.h against PyTorch: forward outputs and every gradient of
   multi-head attention, attention alone and single ops, from the reference fixtures in
   tests/fixtures/ (written by tools/gen_fixtures.py; the format is described in fixture.h).

   Each fixture holds float32 inputs and parameters, an upstream gradient dy, and torch's float64
   results for y and for every gradient of sum(y * dy). A test builds the layer or op through the
   public API, copies the fixture's parameters in, zeroes the gradients (they accumulate), runs
   forward and backward and compares.

   Tolerance: every comparison is max |got - want| / max |want| <= 1e-5 (TORCH_TOL). The C code
   computes in float32 (relative precision 6e-8) over sums of at most a few dozen terms, so its
   error is ~1e-7 of the largest reference value; 1e-5 leaves room for that and no more.

   A missing or unreadable fixture is a failure, not a skip. Run with -v to print every error. */
#include "fixture.h"

#define TORCH_TOL 1e-5

/* ---- per-test bookkeeping: every buffer a test allocates is released by torch_end ---- */

#define TORCH_MAX_BUFS 32
static void *torch__bufs[TORCH_MAX_BUFS];
static int torch__nbufs = 0;
static const char *torch__case = "";

/* n floats, zeroed (fill_nan: every bit pattern a quiet NaN, so an output left unwritten shows). */
static float *torch_buf(int64_t n, int fill_nan) {
    float *p = (float *)calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p || torch__nbufs == TORCH_MAX_BUFS) {
        free(p);
        TEST__FAIL("%s: out of memory (or too many buffers)", torch__case);
        return NULL;
    }
    if (fill_nan)
        for (int64_t i = 0; i < n; i++) p[i] = (float)NAN;
    torch__bufs[torch__nbufs++] = p;
    return p;
}

static fx_file *torch_begin(const char *name) {
    torch__case = name;
    torch__nbufs = 0;
    fx_file *fx = fx_open(name);
    if (!fx) TEST__FAIL("fixture %s missing or unreadable: %s", name, fx_error());
    return fx;
}

static void torch_end(fx_file *fx) {
    for (int i = 0; i < torch__nbufs; i++) free(torch__bufs[i]);
    torch__nbufs = 0;
    fx_free(fx);
}

/* The array `name` of dtype `dtype` with `ndim` dims (ndim < 0: any); a failure naming it if absent
   or different. */
static const fx_array *torch_need(const fx_file *fx, const char *name, int dtype, int ndim) {
    static const char *dtn[3] = {"f32", "f64", "i32"};
    const fx_array *a = fx_get(fx, name);
    if (!a) {
        TEST__FAIL("%s: fixture %s has no array \"%s\"", torch__case, fx->path, name);
        return NULL;
    }
    if (a->dtype != dtype || (ndim >= 0 && a->ndim != ndim)) {
        TEST__FAIL("%s: fixture array \"%s\" is %s with %d dims, want %s with %d", torch__case, name,
                   dtn[a->dtype], a->ndim, dtn[dtype], ndim);
        return NULL;
    }
    return a;
}

/* An i32 or f32 scalar option from the fixture. */
static int torch_int(const fx_file *fx, const char *name, int *ok) {
    const fx_array *a = torch_need(fx, name, FX_I32, -1);
    if (!a || a->numel != 1) {
        if (a) TEST__FAIL("%s: \"%s\" is not a scalar", torch__case, name);
        *ok = 0;
        return 0;
    }
    return (int)a->i32[0];
}
static float torch_float(const fx_file *fx, const char *name, int *ok) {
    const fx_array *a = torch_need(fx, name, FX_F32, -1);
    if (!a || a->numel != 1) {
        if (a) TEST__FAIL("%s: \"%s\" is not a scalar", torch__case, name);
        *ok = 0;
        return 0;
    }
    return a->f32[0];
}

/* A CPU tensor view of data with the given shape (ndim 1..TFM_MAX_DIMS). */
static tfm_tensor torch_view(float *data, int ndim, const int64_t *dims) {
    tfm_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.ndim = ndim;
    for (int i = 0; i < ndim && i < TFM_MAX_DIMS; i++) t.shape[i] = dims[i];
    t.device = TFM_DEVICE_CPU;
    return t;
}

/* A view of an f32 fixture array, with its own shape. */
static tfm_tensor torch_in(const fx_array *a) { return torch_view(a->f32, a->ndim, a->dims); }

/* Compare n floats at got with the f64 reference `name`: same element count, rel err <= TORCH_TOL. */
static void torch_cmp(const fx_file *fx, const char *name, const float *got, int64_t n) {
    const fx_array *ref = torch_need(fx, name, FX_F64, -1);
    char what[320];
    if (!ref || !got) return;
    snprintf(what, sizeof what, "%s: %s", torch__case, name);
    if (ref->numel != n) {
        TEST__FAIL("%s: %lld values, reference has %lld", what, (long long)n, (long long)ref->numel);
        return;
    }
    double e = test_rel_err(got, ref->f64, (size_t)n);
    if (test__verbose) printf("      %-22s %-22s rel err %.2e\n", torch__case, name, e);
    CHECK_REL(what, e, TORCH_TOL);
}

/* Copy the f32 fixture array `name` into the layer's parameter t (same element count). */
static void torch_set_param(const fx_file *fx, const char *name, tfm_tensor *t) {
    const fx_array *a = torch_need(fx, name, FX_F32, -1);
    if (!a) return;
    if (!t->data || tfm_numel(t) != a->numel) {
        char s[64];
        TEST__FAIL("%s: parameter %s is %s (data %p), fixture has %lld values", torch__case, name,
                   tfm_shape_str(t, s, sizeof s), (void *)t->data, (long long)a->numel);
        return;
    }
    memcpy(t->data, a->f32, (size_t)a->numel * sizeof(float));
}

static void torch_zero(tfm_tensor *t) {
    if (t->data) memset(t->data, 0, (size_t)tfm_numel(t) * sizeof(float));
}

/* ---- multi-head attention vs torch.nn.MultiheadAttention(batch_first=True) ----
   slack > 0 sizes the layer for a larger batch and longer sequences than the fixture's, so the
   strides of a partly used layer are checked too. */
static void torch_mha_case(const char *name, int slack) {
    fx_file *fx = torch_begin(name);
    if (!fx) return;
    tfm_mem mem;
    tfm_mha m;
    memset(&mem, 0, sizeof mem);
    memset(&m, 0, sizeof m);
    int ok = 1;
    int H = torch_int(fx, "n_heads", &ok);
    int causal = torch_int(fx, "causal", &ok);
    int cross = torch_int(fx, "cross", &ok);
    int bias = torch_int(fx, "bias", &ok);
    const fx_array *x = torch_need(fx, "x", FX_F32, 3);
    const fx_array *dy = torch_need(fx, "dy", FX_F32, 3);
    const fx_array *xkv = cross ? torch_need(fx, "xkv", FX_F32, 3) : NULL;
    const fx_array *lens = fx_get(fx, "key_lens");
    const fx_array *amask = fx_get(fx, "attn_mask"); /* additive, (Tq,Tk) or (B,Tq,Tk) */
    if (!ok || !x || !dy || (cross && !xkv)) goto done;
    {
        int64_t B = x->dims[0], Tq = x->dims[1], C = x->dims[2];
        int64_t Tk = cross ? xkv->dims[1] : Tq;
        if (lens && (lens->dtype != FX_I32 || lens->numel != B)) {
            TEST__FAIL("%s: key_lens is not %lld i32 values", name, (long long)B);
            goto done;
        }
        tfm_mha_desc d;
        memset(&d, 0, sizeof d);
        d.d_model = (int)C;
        d.n_heads = H;
        d.cross = cross;
        d.no_bias = !bias;
        d.max_batch = (int)B + slack;
        d.max_len = (int)Tq + slack;
        d.max_kv_len = cross ? (int)Tk + slack : 0;

        tfm_result r = tfm_mha_init(&m, &d, &mem); /* counting pass */
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        r = tfm_mem_alloc(&mem);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        r = tfm_mha_init(&m, &d, &mem);
        CHECK_OK(r);
        CHECK_OK(tfm_mem_check(&mem));
        if (r != TFM_OK) goto done;

        torch_set_param(fx, "in_proj_weight", &m.in_proj_weight);
        torch_set_param(fx, "out_proj.weight", &m.out_proj_weight);
        if (bias) {
            torch_set_param(fx, "in_proj_bias", &m.in_proj_bias);
            torch_set_param(fx, "out_proj.bias", &m.out_proj_bias);
        } else {
            CHECK_MSG(!m.in_proj_bias.data && !m.out_proj_bias.data,
                      "%s: no_bias layer has bias tensors", name);
        }
        torch_zero(&m.d_in_proj_weight);
        torch_zero(&m.d_in_proj_bias);
        torch_zero(&m.d_out_proj_weight);
        torch_zero(&m.d_out_proj_bias);
        CHECK_MSG(m.d_in_proj_weight.data && m.d_out_proj_weight.data,
                  "%s: layer has no weight gradients", name);
        if (test__failed_checks) goto done;

        float *ybuf = torch_buf(B * Tq * C, 1);
        float *dxbuf = torch_buf(B * Tq * C, 0);
        float *dxkvbuf = torch_buf(B * Tk * C, 0);
        if (!ybuf || !dxbuf || !dxkvbuf) goto done;
        tfm_tensor xt = torch_in(x), dyt = torch_in(dy);
        tfm_tensor xkvt;
        memset(&xkvt, 0, sizeof xkvt);
        if (cross) xkvt = torch_in(xkv);
        tfm_tensor yt = torch_view(ybuf, 3, x->dims), dxt = torch_view(dxbuf, 3, x->dims);
        int64_t kvdims[3];
        kvdims[0] = B;
        kvdims[1] = Tk;
        kvdims[2] = C;
        tfm_tensor dxkvt = torch_view(dxkvbuf, 3, kvdims);

        tfm_attn_opts o;
        memset(&o, 0, sizeof o);
        o.causal = causal;
        o.key_lens = lens ? lens->i32 : NULL;
        if (amask) {
            if (amask->dtype != FX_F32 || amask->numel != (amask->ndim == 3 ? B : 1) * Tq * Tk) {
                TEST__FAIL("%s: attn_mask is not (Tq,Tk) or (B,Tq,Tk) f32", name);
                goto done;
            }
            o.mask = amask->f32;
            o.mask_per_batch = amask->ndim == 3;
        }

        r = tfm_mha_forward(&m, &yt, &xt, cross ? &xkvt : NULL, &o);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "y", ybuf, B * Tq * C);
        r = tfm_mha_backward(&m, &dxt, cross ? &dxkvt : NULL, &dyt);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "grad.x", dxbuf, B * Tq * C);
        if (cross) torch_cmp(fx, "grad.xkv", dxkvbuf, B * Tk * C);
        torch_cmp(fx, "grad.in_proj_weight", m.d_in_proj_weight.data, 3 * C * C);
        torch_cmp(fx, "grad.out_proj.weight", m.d_out_proj_weight.data, C * C);
        if (bias) {
            torch_cmp(fx, "grad.in_proj_bias", m.d_in_proj_bias.data, 3 * C);
            torch_cmp(fx, "grad.out_proj.bias", m.d_out_proj_bias.data, C);
        }
    }
done:
    tfm_mem_free(&mem);
    torch_end(fx);
}

static void torch_mha_self(void) { torch_mha_case("mha_self", 0); }
static void torch_mha_causal(void) { torch_mha_case("mha_causal", 2); }
static void torch_mha_padded(void) { torch_mha_case("mha_padded", 1); }
static void torch_mha_causal_padded(void) { torch_mha_case("mha_causal_padded", 0); }
static void torch_mha_cross(void) { torch_mha_case("mha_cross", 2); }
static void torch_mha_cross_nobias(void) { torch_mha_case("mha_cross_nobias", 0); }
static void torch_mha_odd_tiny(void) { torch_mha_case("mha_odd_tiny", 3); }
static void torch_mha_odd(void) { torch_mha_case("mha_odd", 0); }
static void torch_mha_mask(void) { torch_mha_case("mha_mask", 1); }
static void torch_mha_mask_batch(void) { torch_mha_case("mha_mask_batch", 0); }

/* ---- scaled dot-product attention alone: q, k, v already projected, (B,T,C) with H heads ---- */
static void torch_attn_case(const char *name) {
    fx_file *fx = torch_begin(name);
    if (!fx) return;
    int ok = 1;
    int H = torch_int(fx, "n_heads", &ok);
    int causal = torch_int(fx, "causal", &ok);
    float scale = torch_float(fx, "scale", &ok);
    const fx_array *q = torch_need(fx, "q", FX_F32, 3);
    const fx_array *k = torch_need(fx, "k", FX_F32, 3);
    const fx_array *v = torch_need(fx, "v", FX_F32, 3);
    const fx_array *dy = torch_need(fx, "dy", FX_F32, 3);
    const fx_array *lens = fx_get(fx, "key_lens");
    if (!ok || !q || !k || !v || !dy) goto done;
    {
        int64_t B = q->dims[0], Tq = q->dims[1], C = q->dims[2], Tk = k->dims[1];
        if (lens && (lens->dtype != FX_I32 || lens->numel != B)) {
            TEST__FAIL("%s: key_lens is not %lld i32 values", name, (long long)B);
            goto done;
        }
        int64_t adims[4];
        adims[0] = B;
        adims[1] = H;
        adims[2] = Tq;
        adims[3] = Tk;
        int64_t na = B * H * Tq * Tk, D = C / H;
        float *ybuf = torch_buf(B * Tq * C, 1), *lbuf = torch_buf(B * H * Tq, 1), *abuf = torch_buf(na, 1);
        float *dq = torch_buf(B * Tq * C, 0), *dk = torch_buf(B * Tk * C, 0),
              *dv = torch_buf(B * Tk * C, 0);
        if (!ybuf || !lbuf || !abuf || !dq || !dk || !dv) goto done;
        tfm_tensor qt = torch_in(q), kt = torch_in(k), vt = torch_in(v), dyt = torch_in(dy);
        tfm_tensor yt = torch_view(ybuf, 3, q->dims), lt = torch_view(lbuf, 3, adims);
        tfm_tensor dqt = torch_view(dq, 3, q->dims), dkt = torch_view(dk, 3, k->dims),
                   dvt = torch_view(dv, 3, v->dims);
        tfm_attn_opts o;
        memset(&o, 0, sizeof o);
        o.causal = causal;
        o.key_lens = lens ? lens->i32 : NULL;
        o.scale = scale;
        tfm_result r = tfm_attention_forward(&yt, &lt, &qt, &kt, &vt, H, &o);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "y", ybuf, B * Tq * C);
        /* the probabilities torch saw, from the log-sum-exps: P = exp(scale q.k - lse) on the visible keys */
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Tq; i++)
                    for (int64_t j = 0; j < Tk; j++) {
                        const float *qi = q->f32 + (b * Tq + i) * C + h * D, *kj = k->f32 + (b * Tk + j) * C + h * D;
                        double L = lbuf[(b * H + h) * Tq + i], dot = 0;
                        int vis = (!causal || j <= i) && (!lens || j < lens->i32[b]) && !isinf(L);
                        for (int64_t d = 0; d < D; d++) dot += (double)qi[d] * kj[d];
                        abuf[((b * H + h) * Tq + i) * Tk + j] =
                            vis ? (float)exp((scale != 0 ? scale : 1.0 / sqrt((double)D)) * dot - L) : 0.0f;
                    }
        torch_cmp(fx, "att", abuf, na);
        r = tfm_attention_backward(&dqt, &dkt, &dvt, &dyt, &qt, &kt, &vt, &yt, &lt, H, &o);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "grad.q", dq, B * Tq * C);
        torch_cmp(fx, "grad.k", dk, B * Tk * C);
        torch_cmp(fx, "grad.v", dv, B * Tk * C);
    }
done:
    torch_end(fx);
}

static void torch_attn_causal_padded(void) { torch_attn_case("attn_causal_padded"); }
static void torch_attn_cross_padded(void) { torch_attn_case("attn_cross_padded"); }
static void torch_attn_causal_rect(void) { torch_attn_case("attn_causal_rect"); }

/* ---- linear: y = x w^T + b, x (..., Ci), w (Co,Ci) ----
   (No variable is named I: <complex.h> defines it, and cblas.h includes that under TFM_BLAS.) */
static void torch_linear_case(const char *name) {
    fx_file *fx = torch_begin(name);
    if (!fx) return;
    const fx_array *x = torch_need(fx, "x", FX_F32, -1);
    const fx_array *w = torch_need(fx, "weight", FX_F32, 2);
    const fx_array *dy = torch_need(fx, "dy", FX_F32, -1);
    const fx_array *b = fx_get(fx, "bias");
    if (!x || !w || !dy || (b && !torch_need(fx, "bias", FX_F32, 1))) goto done;
    {
        int64_t Co = w->dims[0], Ci = w->dims[1], N = x->numel / Ci;
        float *ybuf = torch_buf(N * Co, 1), *dx = torch_buf(N * Ci, 0), *dw = torch_buf(Co * Ci, 0),
              *db = torch_buf(Co, 0);
        if (!ybuf || !dx || !dw || !db) goto done;
        tfm_tensor xt = torch_in(x), wt = torch_in(w), dyt = torch_in(dy), bt;
        memset(&bt, 0, sizeof bt);
        if (b) bt = torch_in(b);
        tfm_tensor yt = torch_view(ybuf, dy->ndim, dy->dims), dxt = torch_view(dx, x->ndim, x->dims);
        tfm_tensor dwt = torch_view(dw, 2, w->dims), dbt = torch_view(db, 1, &Co);
        tfm_result r = tfm_linear_forward(&yt, &xt, &wt, b ? &bt : NULL);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "y", ybuf, N * Co);
        r = tfm_linear_backward(&dxt, &dwt, b ? &dbt : NULL, &dyt, &xt, &wt);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "grad.x", dx, N * Ci);
        torch_cmp(fx, "grad.weight", dw, Co * Ci);
        if (b) torch_cmp(fx, "grad.bias", db, Co);
    }
done:
    torch_end(fx);
}

static void torch_linear(void) { torch_linear_case("linear"); }
static void torch_linear_nobias(void) { torch_linear_case("linear_nobias"); }

/* ---- layernorm over the last dim ---- */
static void torch_layernorm(void) {
    fx_file *fx = torch_begin("layernorm");
    if (!fx) return;
    int ok = 1;
    float eps = torch_float(fx, "eps", &ok);
    const fx_array *x = torch_need(fx, "x", FX_F32, -1);
    const fx_array *g = torch_need(fx, "weight", FX_F32, 1);
    const fx_array *b = torch_need(fx, "bias", FX_F32, 1);
    const fx_array *dy = torch_need(fx, "dy", FX_F32, -1);
    if (!ok || !x || !g || !b || !dy) goto done;
    {
        int64_t C = g->dims[0], N = x->numel / C;
        float *ybuf = torch_buf(N * C, 1), *mean = torch_buf(N, 1), *rstd = torch_buf(N, 1);
        float *dx = torch_buf(N * C, 0), *dg = torch_buf(C, 0), *db = torch_buf(C, 0);
        if (!ybuf || !mean || !rstd || !dx || !dg || !db) goto done;
        tfm_tensor xt = torch_in(x), gt = torch_in(g), bt = torch_in(b), dyt = torch_in(dy);
        tfm_tensor yt = torch_view(ybuf, x->ndim, x->dims), mt = torch_view(mean, 1, &N),
                   rt = torch_view(rstd, 1, &N);
        tfm_tensor dxt = torch_view(dx, x->ndim, x->dims), dgt = torch_view(dg, 1, &C),
                   dbt = torch_view(db, 1, &C);
        tfm_result r = tfm_layernorm_forward(&yt, &mt, &rt, &xt, &gt, &bt, eps);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "y", ybuf, N * C);
        torch_cmp(fx, "mean", mean, N);
        torch_cmp(fx, "rstd", rstd, N);
        r = tfm_layernorm_backward(&dxt, &dgt, &dbt, &dyt, &xt, &gt, &mt, &rt);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "grad.x", dx, N * C);
        torch_cmp(fx, "grad.weight", dg, C);
        torch_cmp(fx, "grad.bias", db, C);
    }
done:
    torch_end(fx);
}

/* ---- rotary embedding, against Hugging Face LLaMA's formulation (rotate_half), rows at offsets ---- */
static void torch_rope(void) {
    fx_file *fx = torch_begin("rope");
    if (!fx) return;
    int ok = 1;
    float base = torch_float(fx, "base", &ok);
    const fx_array *shape = torch_need(fx, "shape", FX_I32, 1), *pos0 = torch_need(fx, "pos0", FX_I32, 1);
    const fx_array *x = torch_need(fx, "x", FX_F32, 3), *dy = torch_need(fx, "dy", FX_F32, 3);
    if (!ok || !shape || !pos0 || !x || !dy || shape->numel != 2 || pos0->numel != x->dims[0]) goto done;
    {
        int64_t n = x->numel;
        float *ybuf = torch_buf(n, 1), *dx = torch_buf(n, 0);
        if (!ybuf || !dx) goto done;
        tfm_tensor xt = torch_in(x), dyt = torch_in(dy);
        tfm_tensor yt = torch_view(ybuf, 3, x->dims), dxt = torch_view(dx, 3, x->dims);
        tfm_result r = tfm_rope_forward(&yt, &xt, shape->i32[0], shape->i32[1], base, pos0->i32);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "y", ybuf, n);
        r = tfm_rope_backward(&dxt, &dyt, shape->i32[0], shape->i32[1], base, pos0->i32);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "grad.x", dx, n);
    }
done:
    torch_end(fx);
}

/* ---- element-wise and row-wise ops: y = f(x), dx from dy ---- */
enum { TORCH_GELU_ERF, TORCH_GELU_TANH, TORCH_SOFTMAX, TORCH_LOG_SOFTMAX };

static void torch_unary_case(const char *name, int op) {
    fx_file *fx = torch_begin(name);
    if (!fx) return;
    const fx_array *x = torch_need(fx, "x", FX_F32, -1);
    const fx_array *dy = torch_need(fx, "dy", FX_F32, -1);
    if (!x || !dy) goto done;
    {
        int64_t n = x->numel;
        float *ybuf = torch_buf(n, 1), *dx = torch_buf(n, 0);
        if (!ybuf || !dx) goto done;
        tfm_tensor xt = torch_in(x), dyt = torch_in(dy);
        tfm_tensor yt = torch_view(ybuf, x->ndim, x->dims), dxt = torch_view(dx, x->ndim, x->dims);
        tfm_result r;
        if (op == TORCH_GELU_ERF || op == TORCH_GELU_TANH) {
            tfm_gelu_kind kind = op == TORCH_GELU_ERF ? TFM_GELU_ERF : TFM_GELU_TANH;
            r = tfm_gelu_forward(&yt, &xt, kind);
            CHECK_OK(r);
            if (r != TFM_OK) goto done;
            torch_cmp(fx, "y", ybuf, n);
            r = tfm_gelu_backward(&dxt, &dyt, &xt, kind);
        } else if (op == TORCH_SOFTMAX) {
            r = tfm_softmax_forward(&yt, &xt);
            CHECK_OK(r);
            if (r != TFM_OK) goto done;
            torch_cmp(fx, "y", ybuf, n);
            r = tfm_softmax_backward(&dxt, &dyt, &yt);
        } else {
            r = tfm_log_softmax_forward(&yt, &xt);
            CHECK_OK(r);
            if (r != TFM_OK) goto done;
            torch_cmp(fx, "y", ybuf, n);
            r = tfm_log_softmax_backward(&dxt, &dyt, &yt);
        }
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "grad.x", dx, n);
    }
done:
    torch_end(fx);
}

static void torch_gelu_erf(void) { torch_unary_case("gelu_erf", TORCH_GELU_ERF); }
static void torch_gelu_tanh(void) { torch_unary_case("gelu_tanh", TORCH_GELU_TANH); }
static void torch_softmax(void) { torch_unary_case("softmax", TORCH_SOFTMAX); }
static void torch_log_softmax(void) { torch_unary_case("log_softmax", TORCH_LOG_SOFTMAX); }

/* ---- cross-entropy (mean over rows not ignored), with label smoothing ---- */
/* lse against torch.logsumexp, the rows with a target first, then the ignored rows on their own:
   the header documents lse as every row's log-sum-exp, ignored rows included, and a failure there
   says so by name rather than as one large relative error. */
static void torch_cmp_lse(const fx_file *fx, const float *lse, const int32_t *tg, int64_t N,
                          int ignore) {
    const fx_array *ref = torch_need(fx, "lse", FX_F64, 1);
    if (!ref) return;
    if (ref->numel != N) {
        TEST__FAIL("%s: lse has %lld values, reference has %lld", torch__case, (long long)N,
                   (long long)ref->numel);
        return;
    }
    float *got = torch_buf(N, 0);
    double *want = (double *)calloc((size_t)N, sizeof(double)), den = 0;
    int64_t n = 0;
    if (got && want) {
        for (int64_t i = 0; i < N; i++) {
            if (fabs(ref->f64[i]) > den) den = fabs(ref->f64[i]);
            if (tg[i] == ignore) continue;
            got[n] = lse[i];
            want[n++] = ref->f64[i];
        }
        char what[320];
        snprintf(what, sizeof what, "%s: lse (rows with a target)", torch__case);
        double e = test_rel_err(got, want, (size_t)n);
        if (test__verbose) printf("      %-22s %-22s rel err %.2e\n", torch__case, "lse", e);
        CHECK_REL(what, e, TORCH_TOL);
        for (int64_t i = 0; i < N; i++)
            if (tg[i] == ignore)
                CHECK_MSG(fabs((double)lse[i] - ref->f64[i]) <= TORCH_TOL * den,
                          "%s: lse[%lld] of an ignored row is %.9g, torch's log-sum-exp is %.9g "
                          "(the header documents lse as each row's log-sum-exp)",
                          torch__case, (long long)i, (double)lse[i], ref->f64[i]);
    }
    free(want);
}

static void torch_cross_entropy_case(const char *name) {
    fx_file *fx = torch_begin(name);
    if (!fx) return;
    int ok = 1;
    int ignore = torch_int(fx, "ignore_index", &ok);
    float smoothing = torch_float(fx, "label_smoothing", &ok);
    float dloss = torch_float(fx, "dloss", &ok);
    const fx_array *logits = torch_need(fx, "logits", FX_F32, 2);
    const fx_array *tg = torch_need(fx, "targets", FX_I32, 1);
    if (!ok || !logits || !tg) goto done;
    {
        int64_t N = logits->dims[0], V = logits->dims[1];
        if (tg->numel != N) {
            TEST__FAIL("%s: %lld targets for %lld rows", name, (long long)tg->numel, (long long)N);
            goto done;
        }
        float loss = NAN;
        float *lse = torch_buf(N, 1), *dl = torch_buf(N * V, 0);
        if (!lse || !dl) goto done;
        tfm_tensor lt = torch_in(logits), lset = torch_view(lse, 1, &N),
                   dlt = torch_view(dl, 2, logits->dims);
        tfm_result r = tfm_cross_entropy_forward(&loss, &lset, &lt, tg->i32, ignore, smoothing);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "loss", &loss, 1);
        torch_cmp_lse(fx, lse, tg->i32, N, ignore);
        r = tfm_cross_entropy_backward(&dlt, dloss, &lt, &lset, tg->i32, ignore, smoothing);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "grad.logits", dl, N * V);
    }
done:
    torch_end(fx);
}

static void torch_cross_entropy(void) { torch_cross_entropy_case("cross_entropy"); }
static void torch_cross_entropy_smooth(void) { torch_cross_entropy_case("cross_entropy_smooth"); }

/* ---- embedding lookup; repeated ids sum their gradients into one weight row ---- */
static void torch_embedding(void) {
    fx_file *fx = torch_begin("embedding");
    if (!fx) return;
    const fx_array *ids = torch_need(fx, "ids", FX_I32, -1);
    const fx_array *w = torch_need(fx, "weight", FX_F32, 2);
    const fx_array *dy = torch_need(fx, "dy", FX_F32, -1);
    if (!ids || !w || !dy) goto done;
    {
        int64_t C = w->dims[1];
        if (dy->numel != ids->numel * C) {
            TEST__FAIL("embedding: dy has %lld values, want %lld", (long long)dy->numel,
                       (long long)(ids->numel * C));
            goto done;
        }
        float *ybuf = torch_buf(dy->numel, 1), *dw = torch_buf(w->numel, 0);
        if (!ybuf || !dw) goto done;
        tfm_tensor wt = torch_in(w), dyt = torch_in(dy);
        tfm_tensor yt = torch_view(ybuf, dy->ndim, dy->dims), dwt = torch_view(dw, 2, w->dims);
        tfm_result r = tfm_embedding_forward(&yt, ids->i32, &wt, 1.0f);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "y", ybuf, dy->numel);
        r = tfm_embedding_backward(&dwt, &dyt, ids->i32, 1.0f);
        CHECK_OK(r);
        if (r != TFM_OK) goto done;
        torch_cmp(fx, "grad.weight", dw, w->numel);
    }
done:
    torch_end(fx);
}

/* ---- the reader itself: every truncation and a few corruptions of a real file are rejected ---- */
static void torch_fixture_reader(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.tfx", fx_dir(), "mha_odd_tiny");
    FILE *f = fopen(path, "rb");
    if (!f) {
        TEST__FAIL("fixture %s missing or unreadable", path);
        return;
    }
    unsigned char *buf = (unsigned char *)malloc(1 << 16);
    size_t n = buf ? fread(buf, 1, 1 << 16, f) : 0;
    fclose(f);
    if (!buf || n == 0 || n == (1 << 16)) {
        TEST__FAIL("%s: could not read it whole", path);
        free(buf);
        return;
    }
    fx_file *fx = fx_parse(buf, n, path);
    CHECK_MSG(fx != NULL, "%s", fx_error());
    if (fx) {
        const fx_array *a = fx_get(fx, "x");
        CHECK(a && a->dtype == FX_F32 && a->ndim == 3 && a->numel == 3);
        CHECK(fx_get(fx, "no such array") == NULL);
        fx_free(fx);
    }
    for (size_t len = 0; len < n; len++) { /* every proper prefix is malformed */
        fx = fx_parse(buf, len, path);
        CHECK_MSG(fx == NULL, "a %u-byte prefix of a %u-byte file parsed", (unsigned)len, (unsigned)n);
        fx_free(fx);
    }
    unsigned char *big = (unsigned char *)malloc(n + 1);
    if (big) { /* a stray trailing byte */
        memcpy(big, buf, n);
        big[n] = 0;
        fx = fx_parse(big, n + 1, path);
        CHECK(fx == NULL);
        fx_free(fx);
        free(big);
    }
    buf[8] = 0xFF; /* the first name length becomes 65535 (max 255) */
    buf[9] = 0xFF;
    fx = fx_parse(buf, n, path);
    CHECK(fx == NULL);
    fx_free(fx);
    buf[0] = 'X'; /* magic */
    fx = fx_parse(buf, n, path);
    CHECK(fx == NULL && strstr(fx_error(), "magic"));
    fx_free(fx);
    free(buf);
    fx = fx_load("tests/fixtures/does_not_exist.tfx");
    CHECK(fx == NULL && strstr(fx_error(), "cannot open"));
    fx_free(fx);
}

static void suite_torch(void) {
    RUN(torch_fixture_reader);
    RUN(torch_mha_self);
    RUN(torch_mha_causal);
    RUN(torch_mha_padded);
    RUN(torch_mha_causal_padded);
    RUN(torch_mha_cross);
    RUN(torch_mha_cross_nobias);
    RUN(torch_mha_odd_tiny);
    RUN(torch_mha_odd);
    RUN(torch_mha_mask);
    RUN(torch_mha_mask_batch);
    RUN(torch_attn_causal_padded);
    RUN(torch_attn_cross_padded);
    RUN(torch_attn_causal_rect);
    RUN(torch_linear);
    RUN(torch_linear_nobias);
    RUN(torch_layernorm);
    RUN(torch_rope);
    RUN(torch_gelu_erf);
    RUN(torch_gelu_tanh);
    RUN(torch_softmax);
    RUN(torch_log_softmax);
    RUN(torch_cross_entropy);
    RUN(torch_cross_entropy_smooth);
    RUN(torch_embedding);
}
