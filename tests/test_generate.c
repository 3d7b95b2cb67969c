/* tests/test_generate.c - generation with the key/value cache: every cached step's logits equal a
   full forward over the whole sequence, greedy decoding picks their argmax, and bad requests fail. */

static void gen_config(tfm_config *c, tfm_model_kind kind, int norm_first, tfm_pos_kind pos) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->vocab_size = 13;
    c->tgt_vocab_size = kind == TFM_MODEL_ENCODER_DECODER ? 11 : 0;
    c->d_model = 16;
    c->n_heads = 4;
    c->n_layers = 2;
    c->d_ff = 24;
    c->max_len = 12;
    c->max_tgt_len = kind == TFM_MODEL_ENCODER_DECODER ? 10 : 0;
    c->max_batch = 2;
    c->norm_first = norm_first;
    c->pos = pos;
    c->act = norm_first ? TFM_ACT_GELU_TANH : TFM_ACT_RELU;
    c->scale_emb = pos == TFM_POS_SINUSOIDAL;
    c->init_std = 0.3f; /* large weights: logits far from uniform, so a wrong cache shows */
    c->seed = 7;
}

/* Full forwards over two sequences (batch 2), then the same through the cache: the prompts at once,
   then one token per call, each call's last-row logits against the full forward's row, both rows.
   Halfway, the cache's rows are reordered so that both rows continue sequence 1 (a duplicated row, as
   beam search makes): from then on both rows must match sequence 1's full forward.
   Tolerance 1e-5 relative (max abs err / max abs logit): the same float arithmetic in another order. */
static void gen_check_cache(tfm_model_kind kind, int norm_first, tfm_pos_kind pos) {
    tfm_config c;
    tfm_model m;
    tfm_batch b;
    tfm_kv_cache kc;
    int32_t src[18] = {1, 5, 2, 8, 3, 12, 4, 0, 7, /* row 2: */ 6, 6, 1, 9, 2, 11, 3, 3, 10};
    int32_t seq[20] = {2, 9, 4, 1, 10, 3, 6, 0, 5, 8, /* row 2: */ 7, 1, 1, 4, 9, 2, 0, 6, 3, 5};
    int encdec = kind == TFM_MODEL_ENCODER_DECODER, n_prompt = 3, n_total = 10, t, r, swap_at = 6;
    int64_t V;
    float *full;
    const float *memory = NULL;
    gen_config(&c, kind, norm_first, pos);
    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    if (!m.impl) return;
    tfm_model_train(&m, 0);
    V = encdec ? c.tgt_vocab_size : c.vocab_size;
    memset(&b, 0, sizeof b);
    b.batch = 2;
    if (encdec) {
        b.len = 9;
        b.tokens = src;
        b.tgt_len = n_total;
        b.tgt_in = seq;
    } else {
        b.len = n_total;
        b.tokens = seq;
    }
    CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
    full = (float *)malloc((size_t)(2 * n_total * V) * sizeof(float));
    memcpy(full, tfm_model_logits(&m).data, (size_t)(2 * n_total * V) * sizeof(float));
    CHECK_OK(tfm_kv_cache_init(&kc, &m, 2, 0));
    if (encdec) memory = tfm__encoder_fwd(&m, src, NULL, 2, 9, NULL);
    {
        int32_t prompt[6];
        memcpy(prompt, seq, 3 * sizeof(int32_t));
        memcpy(prompt + 3, seq + n_total, 3 * sizeof(int32_t));
        tfm__decode(&m, &kc, prompt, 2, n_prompt, memory, 9);
    }
    for (t = n_prompt;; t++) {
        int32_t tok[2];
        int swapped = t > swap_at;
        for (r = 0; r < 2; r++) {
            char what[96];
            int from = swapped ? 0 : r;
            snprintf(what, sizeof what, "kind %d pre-LN %d pos %d row %d position %d", (int)kind, norm_first, (int)pos, r, t - 1);
            CHECK_REL(what, test_rel_err_f(m.impl->logits + r * V, full + ((int64_t)from * n_total + t - 1) * V, (size_t)V), 1e-5);
        }
        if (t == n_total) break;
        if (t == swap_at) {
            int32_t to_first[2] = {0, 0};
            CHECK_OK(tfm_kv_cache_reorder(&kc, to_first, 2));
            CHECK(kc.slot[0] != kc.slot[1]);
        }
        tok[0] = seq[t];
        tok[1] = t >= swap_at ? seq[t] : seq[n_total + t];
        tfm__decode(&m, &kc, tok, 2, 1, memory, 9);
    }
    tfm_kv_cache_free(&kc);
    free(full);
    tfm_model_free(&m);
}

static void gen_test_cache_lm(void) {
    gen_check_cache(TFM_MODEL_DECODER_LM, 0, TFM_POS_LEARNED);
    gen_check_cache(TFM_MODEL_DECODER_LM, 1, TFM_POS_LEARNED);
    gen_check_cache(TFM_MODEL_DECODER_LM, 1, TFM_POS_SINUSOIDAL);
}

static void gen_test_cache_encdec(void) {
    gen_check_cache(TFM_MODEL_ENCODER_DECODER, 0, TFM_POS_LEARNED);
    gen_check_cache(TFM_MODEL_ENCODER_DECODER, 1, TFM_POS_SINUSOIDAL);
}

/* Greedy generation: each new token is the argmax of a full forward over everything before it. */
static void gen_test_greedy(void) {
    tfm_config c;
    tfm_model m;
    tfm_gen_opts o;
    tfm_batch b;
    int32_t seq[12] = {3, 1, 4}, out[9];
    int n = 0, i, t;
    gen_config(&c, TFM_MODEL_DECODER_LM, 1, TFM_POS_LEARNED);
    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    if (!m.impl) return;
    memset(&o, 0, sizeof o);
    o.max_new = 9;
    CHECK_OK(tfm_model_generate(&m, NULL, 0, seq, 3, &o, out, &n));
    CHECK(n == 9);
    for (i = 0; i < n; i++) seq[3 + i] = out[i];
    memset(&b, 0, sizeof b);
    b.batch = 1;
    b.len = 12;
    b.tokens = seq;
    tfm_model_train(&m, 0);
    CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
    for (t = 2; t < 11; t++) {
        const float *row = tfm_model_logits(&m).data + (int64_t)t * c.vocab_size;
        int best = 0, j;
        for (j = 1; j < c.vocab_size; j++)
            if (row[j] > row[best]) best = j;
        CHECK_MSG(best == seq[t + 1], "position %d: generated %d, argmax of the full forward %d", t + 1, seq[t + 1], best);
    }
    /* a stop token ends generation right after it is emitted */
    o.has_stop = 1;
    o.stop_token = out[2];
    CHECK_OK(tfm_model_generate(&m, NULL, 0, seq, 3, &o, out, &n));
    CHECK(n >= 1 && n <= 3 && out[n - 1] == o.stop_token);
    /* sampling is reproducible from its seed, and top_k 1 is greedy */
    {
        int32_t a[9], bb[9], g[9];
        int na, nb, ng;
        memset(&o, 0, sizeof o);
        o.max_new = 9;
        CHECK_OK(tfm_model_generate(&m, NULL, 0, seq, 3, &o, g, &ng));
        o.temperature = 1.0f;
        o.seed = 5;
        CHECK_OK(tfm_model_generate(&m, NULL, 0, seq, 3, &o, a, &na));
        CHECK_OK(tfm_model_generate(&m, NULL, 0, seq, 3, &o, bb, &nb));
        CHECK(na == nb && !memcmp(a, bb, sizeof a));
        o.top_k = 1;
        CHECK_OK(tfm_model_generate(&m, NULL, 0, seq, 3, &o, a, &na));
        CHECK(na == ng && !memcmp(a, g, sizeof a));
    }
    tfm_model_free(&m);
}

static void gen_test_errors(void) {
    tfm_config c;
    tfm_model m;
    tfm_gen_opts o;
    int32_t p[3] = {1, 2, 3}, out[16], bad[2] = {1, 99};
    gen_config(&c, TFM_MODEL_DECODER_LM, 0, TFM_POS_LEARNED);
    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    if (!m.impl) return;
    memset(&o, 0, sizeof o);
    o.max_new = 10; /* 3 + 10 > max_len 12 */
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_SHAPE, "max_len");
    o.max_new = 2;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 0, &o, out, NULL), TFM_E_SHAPE, "tfm_model_generate");
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, bad, 2, &o, out, NULL), TFM_E_ARG, "99");
    CHECK_ERR(tfm_model_generate(&m, p, 3, p, 3, &o, out, NULL), TFM_E_ARG, "src");
    o.temperature = -1.0f;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "temperature");
    o.temperature = 0.0f;
    o.has_stop = 1;
    o.stop_token = 13;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "stop_token");
    {
        tfm_kv_cache kc;
        int32_t from[2] = {0, 2};
        CHECK_ERR(tfm_kv_cache_init(&kc, &m, 3, 0), TFM_E_ARG, "tfm_kv_cache_init");
        CHECK_ERR(tfm_kv_cache_init(&kc, &m, 0, 13), TFM_E_ARG, "max_len");
        CHECK_OK(tfm_kv_cache_init(&kc, &m, 0, 0));
        CHECK_ERR(tfm_kv_cache_reorder(&kc, from, 2), TFM_E_ARG, "from[1]");
        CHECK_ERR(tfm_kv_cache_reorder(&kc, from, 3), TFM_E_ARG, "tfm_kv_cache_reorder");
        tfm_kv_cache_free(&kc);
    }
    /* backward after generate: the forward's saved state is gone, and it says so */
    o.has_stop = 0;
    {
        tfm_batch b;
        int32_t tg[3] = {2, 3, 4};
        memset(&b, 0, sizeof b);
        b.batch = 1;
        b.len = 3;
        b.tokens = p;
        b.targets = tg;
        CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
        CHECK_OK(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL));
        CHECK_ERR(tfm_model_backward(&m, 1.0f), TFM_E_ARG, "tfm_model_generate ran after");
        CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
        CHECK_OK(tfm_model_backward(&m, 1.0f));
    }
    tfm_model_free(&m);
}

static void suite_generate(void) {
    RUN(gen_test_cache_lm);
    RUN(gen_test_cache_encdec);
    RUN(gen_test_greedy);
    RUN(gen_test_errors);
}
