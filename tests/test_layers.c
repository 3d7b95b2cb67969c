/* tests/test_layers.c - a model built from layers, not from tfm_config: an input projection, one
   pre-LN encoder block, a layernorm, mean pooling and a linear head, trained with tfm_adamw_step.
   Every parameter's gradient is checked against central finite differences of the loss the layers
   compute, and training on a learnable rule must bring the loss down. */

#define LY_B 3
#define LY_T 4
#define LY_I 5
#define LY_C 8
#define LY_F 16
#define LY_K 3

typedef struct ly_model {
    tfm_mem mem;
    tfm_linear inp, head;
    tfm_block blk;
    tfm_layernorm ln;
    /* activations and their gradients */
    float x[LY_B * LY_T * LY_I], h1[LY_B * LY_T * LY_C], h2[LY_B * LY_T * LY_C], h3[LY_B * LY_T * LY_C];
    float pooled[LY_B * LY_C], logits[LY_B * LY_K], lse[LY_B];
    float d1[LY_B * LY_T * LY_C], d2[LY_B * LY_T * LY_C], d3[LY_B * LY_T * LY_C], dp[LY_B * LY_C], dl[LY_B * LY_K];
    int32_t lens[LY_B], targets[LY_B];
} ly_model;

/* Count, allocate, carve, initialise: the tfm_mem recipe for layers of your own. */
static int ly_build(ly_model *m, uint64_t seed) {
    tfm_block_desc d;
    tfm_rng rng;
    int pass;
    memset(&d, 0, sizeof d);
    d.d_model = LY_C;
    d.n_heads = 2;
    d.d_ff = LY_F;
    d.norm_first = 1;
    d.act = TFM_ACT_GELU;
    d.max_batch = LY_B;
    d.max_len = LY_T;
    memset(&m->mem, 0, sizeof m->mem);
    for (pass = 0; pass < 2; pass++) {
        if (pass) {
            CHECK_OK(tfm_mem_alloc(&m->mem));
            tfm_mem_rewind(&m->mem);
        }
        if (tfm_linear_init(&m->inp, LY_I, LY_C, 0, &m->mem) != TFM_OK || tfm_block_init(&m->blk, &d, &m->mem) != TFM_OK ||
            tfm_layernorm_init(&m->ln, LY_C, 0, 0.0f, LY_B * LY_T, &m->mem) != TFM_OK ||
            tfm_linear_init(&m->head, LY_C, LY_K, 0, &m->mem) != TFM_OK) {
            TEST__FAIL("building the layers: %s", tfm_last_error());
            return 0;
        }
    }
    tfm_rng_seed(&rng, seed);
    CHECK_OK(tfm_linear_init_params(&m->inp, &rng));
    CHECK_OK(tfm_block_init_params(&m->blk, &rng));
    CHECK_OK(tfm_layernorm_init_params(&m->ln));
    CHECK_OK(tfm_linear_init_params(&m->head, &rng));
    return test__failed_checks == 0;
}

static float ly_forward(ly_model *m) {
    tfm_tensor x = tfm_tensor3(m->x, LY_B, LY_T, LY_I), h1 = tfm_tensor3(m->h1, LY_B, LY_T, LY_C);
    tfm_tensor h2 = tfm_tensor3(m->h2, LY_B, LY_T, LY_C), h3 = tfm_tensor3(m->h3, LY_B, LY_T, LY_C);
    tfm_tensor pooled = tfm_tensor2(m->pooled, LY_B, LY_C), logits = tfm_tensor2(m->logits, LY_B, LY_K);
    tfm_tensor lse = tfm_tensor1(m->lse, LY_B);
    tfm_attn_opts o;
    float loss = NAN;
    memset(&o, 0, sizeof o);
    o.key_lens = m->lens;
    if (tfm_linear_layer_forward(&m->inp, &h1, &x) != TFM_OK || tfm_block_forward(&m->blk, &h2, &h1, NULL, &o) != TFM_OK ||
        tfm_layernorm_layer_forward(&m->ln, &h3, &h2) != TFM_OK || tfm_mean_pool_forward(&pooled, &h3, m->lens) != TFM_OK ||
        tfm_linear_layer_forward(&m->head, &logits, &pooled) != TFM_OK ||
        tfm_cross_entropy_forward(&loss, &lse, &logits, m->targets, -100, 0.0f) != TFM_OK)
        TEST__FAIL("forward: %s", tfm_last_error());
    return loss;
}

/* Gradients of the last forward's loss, into the layers' gradients (zeroed first). */
static void ly_backward(ly_model *m) {
    tfm_tensor x = tfm_tensor3(m->x, LY_B, LY_T, LY_I);
    tfm_tensor h2 = tfm_tensor3(m->h2, LY_B, LY_T, LY_C), pooled = tfm_tensor2(m->pooled, LY_B, LY_C);
    tfm_tensor logits = tfm_tensor2(m->logits, LY_B, LY_K), lse = tfm_tensor1(m->lse, LY_B);
    tfm_tensor d1 = tfm_tensor3(m->d1, LY_B, LY_T, LY_C), d2 = tfm_tensor3(m->d2, LY_B, LY_T, LY_C);
    tfm_tensor d3 = tfm_tensor3(m->d3, LY_B, LY_T, LY_C), dp = tfm_tensor2(m->dp, LY_B, LY_C);
    tfm_tensor dl = tfm_tensor2(m->dl, LY_B, LY_K);
    tfm_mem_zero_grad(&m->mem);
    memset(m->d1, 0, sizeof m->d1);
    memset(m->d2, 0, sizeof m->d2);
    memset(m->d3, 0, sizeof m->d3);
    memset(m->dp, 0, sizeof m->dp);
    memset(m->dl, 0, sizeof m->dl);
    if (tfm_cross_entropy_backward(&dl, 1.0f, &logits, &lse, m->targets, -100, 0.0f) != TFM_OK ||
        tfm_linear_layer_backward(&m->head, &dp, &dl, &pooled) != TFM_OK ||
        tfm_mean_pool_backward(&d3, &dp, m->lens) != TFM_OK || tfm_layernorm_layer_backward(&m->ln, &d2, &d3, &h2) != TFM_OK ||
        tfm_block_backward(&m->blk, &d1, NULL, &d2) != TFM_OK || tfm_linear_layer_backward(&m->inp, NULL, &d1, &x) != TFM_OK)
        TEST__FAIL("backward: %s", tfm_last_error());
}

/* Every parameter of the model: value, gradient, decayed or not (as a user would list them). */
static int ly_params(ly_model *m, tfm_adamw_param *out) {
    static const char *const names[12] = {"self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                                          "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                                          "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"};
    tfm_linear *lin[2];
    int n = 0, i;
    lin[0] = &m->inp;
    lin[1] = &m->head;
    for (i = 0; i < 2; i++) {
        out[n].value = lin[i]->weight, out[n].grad = lin[i]->d_weight, out[n++].decay = 1;
        out[n].value = lin[i]->bias, out[n].grad = lin[i]->d_bias, out[n++].decay = 0;
    }
    out[n].value = m->ln.weight, out[n].grad = m->ln.d_weight, out[n++].decay = 0;
    out[n].value = m->ln.bias, out[n].grad = m->ln.d_bias, out[n++].decay = 0;
    for (i = 0; i < 12; i++) {
        CHECK_OK(tfm_block_param(&m->blk, names[i], &out[n].value, &out[n].grad));
        out[n++].decay = strstr(names[i], "weight") && !strstr(names[i], "norm");
    }
    return n;
}

/* A batch: inputs N(0,1); the label counts which of the first two features sum above zero over the
   first lens[b] positions (0, 1 or 2): a rule the model can learn from what it pools. */
static void ly_batch(ly_model *m, tfm_rng *r) {
    int b, t, i;
    for (i = 0; i < LY_B * LY_T * LY_I; i++) m->x[i] = tfm_rng_normal(r);
    for (b = 0; b < LY_B; b++) {
        float s0 = 0.0f, s1 = 0.0f;
        m->lens[b] = 3 + (int)(tfm_rng_u64(r) % 2);
        for (t = 0; t < m->lens[b]; t++) {
            s0 += m->x[(b * LY_T + t) * LY_I];
            s1 += m->x[(b * LY_T + t) * LY_I + 1];
        }
        m->targets[b] = (s0 > 0.0f) + (s1 > 0.0f);
    }
}

static void ly_gradients(void) {
    ly_model *m = (ly_model *)calloc(1, sizeof(ly_model));
    tfm_adamw_param ps[32];
    tfm_rng r;
    int n, i, k, checked = 0;
    double worst = 0.0;
    if (!m || !ly_build(m, 11)) goto out;
    tfm_rng_seed(&r, 3);
    ly_batch(m, &r);
    ly_forward(m);
    ly_backward(m);
    n = ly_params(m, ps);
    CHECK(n == 18);
    /* central differences of the float loss, h = 2e-3: rounding ~1e-7 / h and truncation ~h^2 stay
       below the bound; a gradient that misses a term is off by far more */
    for (i = 0; i < n; i++) {
        int64_t len = tfm_numel(&ps[i].value);
        for (k = 0; k < 5; k++) {
            int64_t j = (int64_t)(tfm_rng_u64(&r) % (uint64_t)len);
            float keep = ps[i].value.data[j], h = 2e-3f, lp, lm;
            double fd, an = ps[i].grad.data[j], err;
            ps[i].value.data[j] = keep + h;
            lp = ly_forward(m);
            ps[i].value.data[j] = keep - h;
            lm = ly_forward(m);
            ps[i].value.data[j] = keep;
            fd = ((double)lp - (double)lm) / (2.0 * h);
            err = fabs(fd - an) / (2e-3 + 2e-2 * fabs(an));
            if (err > worst) worst = err;
            CHECK_MSG(err <= 1.0, "parameter %d element %lld: backward %.6g, finite differences %.6g", i, (long long)j, an, fd);
            checked++;
        }
    }
    CHECK(checked == 5 * n);
    /* the input projection's gradient is not zero: the check saw real values */
    CHECK(fabs(ps[0].grad.data[0]) + fabs(ps[0].grad.data[1]) + fabs(ps[0].grad.data[2]) > 0.0);
    /* lookups by a name the layer does not have fail, naming it */
    CHECK_ERR(tfm_block_param(&m->blk, "multihead_attn.in_proj_weight", NULL, NULL), TFM_E_ARG, "multihead_attn");
    CHECK_ERR(tfm_block_param(&m->blk, "linear3.weight", NULL, NULL), TFM_E_ARG, "linear3.weight");
    {
        tfm_tensor v;
        CHECK_OK(tfm_mha_param(&m->blk.self_attn, "out_proj.bias", &v, NULL));
        CHECK(v.data == m->blk.self_attn.out_proj_bias.data);
    }
    tfm_mem_free(&m->mem);
out:
    free(m);
}

static void ly_training(void) {
    ly_model *m = (ly_model *)calloc(1, sizeof(ly_model));
    tfm_adamw_param ps[32];
    tfm_optim o;
    tfm_rng r;
    float first = 0.0f, last = 0.0f, norm = 0.0f;
    int n, i, step;
    if (!m || !ly_build(m, 5)) goto out;
    n = ly_params(m, ps);
    for (i = 0; i < n; i++) { /* the moments: zeroed, of each parameter's size, kept between steps */
        int64_t len = tfm_numel(&ps[i].value);
        ps[i].m = tfm_tensor1((float *)calloc((size_t)len, sizeof(float)), len);
        ps[i].v = tfm_tensor1((float *)calloc((size_t)len, sizeof(float)), len);
    }
    memset(&o, 0, sizeof o);
    o.lr = 1e-2f;
    o.weight_decay = 1e-2f;
    o.clip_norm = 1.0f;
    tfm_rng_seed(&r, 8);
    for (step = 1; step <= 300; step++) {
        float loss;
        ly_batch(m, &r);
        loss = ly_forward(m);
        ly_backward(m);
        if (tfm_adamw_step(ps, n, &o, step, &norm) != TFM_OK) {
            TEST__FAIL("step %d: %s", step, tfm_last_error());
            break;
        }
        if (step <= 50) first += loss / 50.0f;
        if (step > 250) last += loss / 50.0f;
    }
    CHECK_MSG(last < 0.6f * first, "loss %.3f over the first 50 steps, %.3f over the last 50", (double)first, (double)last);
    CHECK(norm > 0.0f);
    /* bad lists are refused */
    CHECK_ERR(tfm_adamw_step(ps, 0, &o, 1, NULL), TFM_E_ARG, "tfm_adamw_step");
    {
        tfm_tensor keep = ps[3].v;
        ps[3].v = tfm_tensor1(keep.data, 1);
        CHECK_ERR(tfm_adamw_step(ps, n, &o, 1, NULL), TFM_E_SHAPE, "parameter 3");
        ps[3].v = keep;
    }
    for (i = 0; i < n; i++) {
        free(ps[i].m.data);
        free(ps[i].v.data);
    }
    tfm_mem_free(&m->mem);
out:
    free(m);
}

/* An RMSNorm layer (tfm_rmsnorm_init): no bias, and its layer calls give what the RMSNorm ops give. */
static void ly_rmsnorm_layer(void) {
    enum { N = 5, C = 7 };
    tfm_mem mem;
    tfm_layernorm ln;
    float x[N * C], y[N * C], y2[N * C], dy[N * C], dx[N * C], dx2[N * C], g[C], dg[C], rstd[N];
    tfm_tensor tx = tfm_tensor2(x, N, C), ty = tfm_tensor2(y, N, C), ty2 = tfm_tensor2(y2, N, C);
    tfm_tensor tdy = tfm_tensor2(dy, N, C), tdx = tfm_tensor2(dx, N, C), tdx2 = tfm_tensor2(dx2, N, C);
    tfm_tensor tg = tfm_tensor1(g, C), tdg = tfm_tensor1(dg, C), tr = tfm_tensor1(rstd, N);
    int pass, i;
    memset(&mem, 0, sizeof mem);
    for (pass = 0; pass < 2; pass++) {
        if (pass) {
            CHECK_OK(tfm_mem_alloc(&mem));
            tfm_mem_rewind(&mem);
        }
        CHECK_OK(tfm_rmsnorm_init(&ln, C, 1e-6f, N, &mem));
    }
    CHECK_OK(tfm_layernorm_init_params(&ln));
    CHECK(ln.rms && ln.bias.data == NULL && ln.d_bias.data == NULL && ln.mean == NULL && ln.eps == 1e-6f);
    for (i = 0; i < N * C; i++) {
        x[i] = (float)((i * 37) % 23) / 7.0f - 1.5f;
        dy[i] = (float)((i * 11) % 13) / 6.0f - 1.0f;
    }
    for (i = 0; i < C; i++) ln.weight.data[i] = g[i] = 0.5f + 0.1f * (float)i;
    memset(dx, 0, sizeof dx);
    memset(dx2, 0, sizeof dx2);
    memset(dg, 0, sizeof dg);
    tfm_mem_zero_grad(&mem);
    CHECK_OK(tfm_layernorm_layer_forward(&ln, &ty, &tx));
    CHECK_OK(tfm_layernorm_layer_backward(&ln, &tdx, &tdy, &tx));
    CHECK_OK(tfm_rmsnorm_forward(&ty2, &tr, &tx, &tg, 1e-6f));
    CHECK_OK(tfm_rmsnorm_backward(&tdx2, &tdg, &tdy, &tx, &tg, &tr));
    CHECK(!memcmp(y, y2, sizeof y) && !memcmp(dx, dx2, sizeof dx) && !memcmp(ln.d_weight.data, dg, sizeof dg));
    CHECK_ERR(tfm_rmsnorm_init(&ln, 0, 0.0f, N, &mem), TFM_E_ARG, "tfm_rmsnorm_init");
    tfm_mem_free(&mem);
}

static void suite_layers(void) {
    RUN(ly_gradients);
    RUN(ly_training);
    RUN(ly_rmsnorm_layer);
}
