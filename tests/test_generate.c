/* tests/test_generate.c - generation with the key/value cache: every cached step's logits equal a
   full forward over the whole sequence, greedy decoding picks their argmax, and bad requests fail. */

/* Key/value heads of gen_config's models (of 4 query heads); 0: one per query head. The grouped-query tests
   set it around the checks they reuse. */
static int gen_kv_heads = 0;
static int gen_window = 0, gen_sinks = 0; /* the sliding window of gen_config's models (cfg.attn_window) */

static void gen_config(tfm_config *c, tfm_model_kind kind, int norm_first, tfm_pos_kind pos) {
    memset(c, 0, sizeof *c);
    c->n_kv_heads = gen_kv_heads;
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
    c->rope_base = pos == TFM_POS_ROPE ? 100.0f : 0.0f; /* rotary: every pair turns visibly over a few positions */
    c->init_std = 0.3f; /* large weights: logits far from uniform, so a wrong cache shows */
    c->seed = 7;
    c->attn_window = gen_window;
    c->attn_sinks = gen_sinks;
}

/* Two sequences for the cache tests (n_total ids each; an encoder-decoder's targets, with src[0..9) and
   src[9..18) their sources), and the model's logits over them from one full forward: returns them,
   (2, n_total, V), or NULL when the model could not be made. */
static const int32_t gen_src[18] = {1, 5, 2, 8, 3, 12, 4, 0, 7, /* row 2: */ 6, 6, 1, 9, 2, 11, 3, 3, 10};
static const int32_t gen_seq[20] = {2, 9, 4, 1, 10, 3, 6, 0, 5, 8, /* row 2: */ 7, 1, 1, 4, 9, 2, 0, 6, 3, 5};
static float *gen_full_logits(tfm_model *m, tfm_model_kind kind, int norm_first, tfm_pos_kind pos, int n_total) {
    tfm_config c;
    tfm_batch b;
    int64_t V;
    float *full;
    gen_config(&c, kind, norm_first, pos);
    CHECK_OK(tfm_model_init(m, &c, NULL, 0));
    if (!m->impl) return NULL;
    tfm_model_train(m, 0);
    V = kind == TFM_MODEL_ENCODER_DECODER ? c.tgt_vocab_size : c.vocab_size;
    memset(&b, 0, sizeof b);
    b.batch = 2;
    if (kind == TFM_MODEL_ENCODER_DECODER) {
        b.len = 9;
        b.tokens = gen_src;
        b.tgt_len = n_total;
        b.tgt_in = gen_seq;
    } else {
        b.len = n_total;
        b.tokens = gen_seq;
    }
    CHECK_OK(tfm_model_forward(m, &b, NULL, NULL));
    full = (float *)malloc((size_t)(2 * n_total * V) * sizeof(float));
    memcpy(full, tfm_model_logits(m).data, (size_t)(2 * n_total * V) * sizeof(float));
    return full;
}

/* Full forwards over two sequences (batch 2), then the same through the cache: the prompts at once,
   then one token per call, each call's last-row logits against the full forward's row, both rows.
   Halfway, the cache's rows are reordered so that both rows continue sequence 1 (a duplicated row, as
   beam search makes): from then on both rows must match sequence 1's full forward.
   Tolerance 1e-5 relative (max abs err / max abs logit): the same float arithmetic in another order. */
static void gen_check_cache(tfm_model_kind kind, int norm_first, tfm_pos_kind pos) {
    tfm_model m;
    tfm_kv_cache kc;
    const int32_t *seq = gen_seq;
    int encdec = kind == TFM_MODEL_ENCODER_DECODER, n_prompt = 3, n_total = 10, t, r, swap_at = 6;
    int64_t V;
    float *full = gen_full_logits(&m, kind, norm_first, pos, n_total);
    const float *memory = NULL;
    if (!full) return;
    V = encdec ? m.cfg.tgt_vocab_size : m.cfg.vocab_size;
    CHECK_OK(tfm_kv_cache_init(&kc, &m, 2, 0));
    if (encdec) memory = tfm__encoder_fwd(&m, gen_src, NULL, NULL, 2, 9, NULL);
    {
        int32_t prompt[6];
        memcpy(prompt, seq, 3 * sizeof(int32_t));
        memcpy(prompt + 3, seq + n_total, 3 * sizeof(int32_t));
        tfm__decode_into(&m, &kc, prompt, 2, n_prompt, NULL, memory, 9, m.impl->logits);
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
        tfm__decode_into(&m, &kc, tok, 2, 1, NULL, memory, 9, m.impl->logits);
    }
    tfm_kv_cache_free(&kc);
    free(full);
    tfm_model_free(&m);
}

/* Rows at different positions, as uneven prompts leave them: prompts of 3 and 7 ids read in one call
   (the first padded), then one token per row and call, each row at its own position, every row's
   logits against the full forward's at that position (1e-5 relative, as above). After two steps the
   rows swap places; when sequence 1 is done, the row of sequence 0 (the shorter) is copied over it, so
   the copy's slot still holds sequence 1's later keys, which it must not see. */
static void gen_check_cache_uneven(tfm_model_kind kind, tfm_pos_kind pos) {
    tfm_model m;
    tfm_kv_cache kc;
    int encdec = kind == TFM_MODEL_ENCODER_DECODER, n_total = 10, n_ids[2] = {3, 7}, sq[2] = {0, 1}, at[2], step, r;
    int64_t V;
    float *full = gen_full_logits(&m, kind, 1, pos, n_total);
    const float *memory = NULL;
    int32_t ids[14];
    if (!full) return;
    V = encdec ? m.cfg.tgt_vocab_size : m.cfg.vocab_size;
    CHECK_OK(tfm_kv_cache_init(&kc, &m, 2, 0));
    if (encdec) memory = tfm__encoder_fwd(&m, gen_src, NULL, NULL, 2, 9, NULL);
    for (r = 0; r < 7; r++) {
        ids[r] = r < 3 ? gen_seq[r] : 0; /* padding */
        ids[7 + r] = gen_seq[n_total + r];
    }
    tfm__decode_into(&m, &kc, ids, 2, 7, n_ids, memory, 9, m.impl->logits);
    at[0] = 3;
    at[1] = 7;
    for (step = 0;; step++) {
        int32_t tok[2];
        for (r = 0; r < 2; r++) {
            char what[96];
            snprintf(what, sizeof what, "kind %d pos %d uneven: step %d row %d (sequence %d) position %d", (int)kind, (int)pos,
                     step, r, sq[r], at[r] - 1);
            CHECK(kc.lens[r] == at[r]);
            CHECK_REL(what, test_rel_err_f(m.impl->logits + r * V, full + ((int64_t)sq[r] * n_total + at[r] - 1) * V, (size_t)V),
                      1e-5);
        }
        if (at[0] == n_total && at[1] == n_total) break;
        if (step == 2) { /* swap the rows */
            int32_t swap[2] = {1, 0}, t;
            CHECK_OK(tfm_kv_cache_reorder(&kc, swap, 2));
            t = sq[0], sq[0] = sq[1], sq[1] = t;
            t = at[0], at[0] = at[1], at[1] = t;
        }
        if (sq[0] != sq[1] && (at[0] == n_total || at[1] == n_total)) { /* sequence 1 is done: copy sequence 0 over it */
            int keep = at[0] == n_total ? 1 : 0;
            int32_t from[2];
            from[0] = from[1] = keep;
            CHECK_OK(tfm_kv_cache_reorder(&kc, from, 2));
            sq[0] = sq[1] = sq[keep];
            at[0] = at[1] = at[keep];
        }
        for (r = 0; r < 2; r++) tok[r] = gen_seq[sq[r] * n_total + at[r]];
        tfm__decode_into(&m, &kc, tok, 2, 1, NULL, memory, 9, m.impl->logits);
        at[0]++;
        at[1]++;
    }
    CHECK(sq[0] == 0 && sq[1] == 0);
    tfm_kv_cache_free(&kc);
    free(full);
    tfm_model_free(&m);
}

static void gen_test_cache_lm(void) {
    gen_check_cache(TFM_MODEL_DECODER_LM, 0, TFM_POS_LEARNED);
    gen_check_cache(TFM_MODEL_DECODER_LM, 1, TFM_POS_LEARNED);
    gen_check_cache(TFM_MODEL_DECODER_LM, 1, TFM_POS_SINUSOIDAL);
    gen_check_cache(TFM_MODEL_DECODER_LM, 0, TFM_POS_ROPE); /* cached keys turned at their positions */
    gen_check_cache(TFM_MODEL_DECODER_LM, 1, TFM_POS_ROPE);
}

static void gen_test_cache_encdec(void) {
    gen_check_cache(TFM_MODEL_ENCODER_DECODER, 0, TFM_POS_LEARNED);
    gen_check_cache(TFM_MODEL_ENCODER_DECODER, 1, TFM_POS_SINUSOIDAL);
    gen_check_cache(TFM_MODEL_ENCODER_DECODER, 0, TFM_POS_ROPE);
}

static void gen_test_cache_uneven(void) {
    gen_check_cache_uneven(TFM_MODEL_DECODER_LM, TFM_POS_LEARNED);
    gen_check_cache_uneven(TFM_MODEL_ENCODER_DECODER, TFM_POS_LEARNED);
    gen_check_cache_uneven(TFM_MODEL_DECODER_LM, TFM_POS_ROPE); /* each row turned at its own positions */
    gen_check_cache_uneven(TFM_MODEL_ENCODER_DECODER, TFM_POS_ROPE);
}

/* A sliding window: the rolling cache (sinks + window rows, in ring order) against the full windowed
   forward, the checks above unchanged (1e-5 relative: the ring only reorders the same sums). A window of
   3 and 1 sink keep 4 rows, so the prompts of 3 and 7 ids and the 7 steps after them wrap the ring,
   through a beam reorder, a copied row, rows at uneven positions and a prompt longer than the ring. */
static void gen_test_window_cache(void) {
    static const int wins[2][2] = {{3, 1}, {2, 0}};
    int w;
    for (w = 0; w < 2; w++) {
        tfm_config c;
        tfm_model m;
        tfm_kv_cache kc;
        gen_window = wins[w][0];
        gen_sinks = wins[w][1];
        gen_config(&c, TFM_MODEL_DECODER_LM, 1, TFM_POS_ROPE);
        CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
        if (m.impl) {
            CHECK_OK(tfm_kv_cache_init(&kc, &m, 2, 0));
            CHECK(kc.max_len == gen_window + gen_sinks && kc.window == gen_window && kc.sinks == gen_sinks);
            tfm_kv_cache_free(&kc);
            tfm_model_free(&m);
        }
        gen_check_cache(TFM_MODEL_DECODER_LM, 1, TFM_POS_ROPE);
        gen_check_cache(TFM_MODEL_DECODER_LM, 0, TFM_POS_LEARNED);
        gen_check_cache(TFM_MODEL_ENCODER_DECODER, 1, TFM_POS_SINUSOIDAL);
        gen_check_cache(TFM_MODEL_ENCODER_DECODER, 0, TFM_POS_ROPE);
        gen_check_cache_uneven(TFM_MODEL_DECODER_LM, TFM_POS_ROPE);
        gen_check_cache_uneven(TFM_MODEL_DECODER_LM, TFM_POS_LEARNED);
        gen_check_cache_uneven(TFM_MODEL_ENCODER_DECODER, TFM_POS_ROPE);
    }
    gen_window = gen_sinks = 0;
}

/* Generation past max_len: a rotary windowed model of max_len 12 decodes 60 positions through its cache
   of 4 rows, every step's logits against the full windowed forward of the same parameters in a model of
   max_len 64 (1e-5 relative, as above); greedy generation, a batch of uneven rows and beam search past
   max_len against that model's full forwards and scores; a learned position table is refused. */
static void gen_test_window_past_max_len(void) {
    enum { N = 60 };
    tfm_config cs, cb;
    tfm_model ms, mb;
    tfm_kv_cache kc;
    tfm_batch b;
    tfm_gen_opts o;
    int32_t seq[N], out[3 * N], prompts[2][7] = {{4, 2, 9}, {1, 7, 7, 3, 12, 0, 5}};
    const int32_t *pp[2] = {prompts[0], prompts[1]};
    int n_prompts[2] = {3, 7}, n_out[2], t, i, ok = 1;
    int64_t ns = 0, nb = 0, V;
    float *full;
    gen_window = 3;
    gen_sinks = 1;
    gen_config(&cs, TFM_MODEL_DECODER_LM, 1, TFM_POS_ROPE);
    gen_window = gen_sinks = 0;
    cs.max_batch = 3;
    cb = cs;
    cb.max_len = 64;
    CHECK_OK(tfm_model_init(&ms, &cs, NULL, 0));
    if (!ms.impl) return;
    CHECK_OK(tfm_model_init(&mb, &cb, NULL, 0));
    if (!mb.impl) {
        tfm_model_free(&ms);
        return;
    }
    V = cs.vocab_size;
    {
        float *ps = tfm_model_flat(&ms, 0, &ns), *pb = tfm_model_flat(&mb, 0, &nb);
        CHECK(ns == nb && ns > 0);
        if (ns == nb) memcpy(pb, ps, (size_t)ns * sizeof(float));
    }
    tfm_model_train(&ms, 0);
    tfm_model_train(&mb, 0);
    for (t = 0; t < N; t++) seq[t] = (int32_t)((t * 7 + t / 5) % V);
    memset(&b, 0, sizeof b);
    b.batch = 1;
    b.len = N;
    b.tokens = seq;
    CHECK_OK(tfm_model_forward(&mb, &b, NULL, NULL));
    full = (float *)malloc((size_t)N * V * sizeof(float));
    memcpy(full, tfm_model_logits(&mb).data, (size_t)N * V * sizeof(float));
    /* the cache: 4 rows whatever length is asked for */
    CHECK_OK(tfm_kv_cache_init(&kc, &ms, 1, 100000));
    CHECK(kc.max_len == 4);
    tfm__decode_into(&ms, &kc, seq, 1, 3, NULL, NULL, 0, ms.impl->logits);
    for (t = 3; ok; t++) {
        char what[64];
        snprintf(what, sizeof what, "past max_len: position %d", t - 1);
        CHECK_REL(what, test_rel_err_f(ms.impl->logits, full + (int64_t)(t - 1) * V, (size_t)V), 1e-5);
        ok = test_rel_err_f(ms.impl->logits, full + (int64_t)(t - 1) * V, (size_t)V) <= 1e-5;
        if (t == N) break;
        tfm__decode_into(&ms, &kc, seq + t, 1, 1, NULL, NULL, 0, ms.impl->logits);
    }
    CHECK(kc.lens[0] == N && kc.max_len == 4);
    tfm_kv_cache_free(&kc);
    /* greedy generation of 50 ids after 3: each the argmax of the big model's full forward */
    memset(&o, 0, sizeof o);
    o.max_new = 50;
    CHECK_OK(tfm_model_generate(&ms, NULL, 0, seq, 3, &o, out, &n_out[0]));
    CHECK(n_out[0] == 50);
    memcpy(seq + 3, out, 50 * sizeof(int32_t));
    b.len = 53;
    CHECK_OK(tfm_model_forward(&mb, &b, NULL, NULL));
    for (t = 2; t < 52; t++) {
        const float *row = tfm_model_logits(&mb).data + (int64_t)t * V;
        int best = 0;
        for (i = 1; i < V; i++)
            if (row[i] > row[best]) best = i;
        CHECK_MSG(best == seq[t + 1], "past max_len: position %d generated %d, argmax of the full forward %d", t + 1, seq[t + 1],
                  best);
    }
    /* a batch of uneven rows (a prompt longer than the ring) equals each row alone */
    o.max_new = 40;
    CHECK_OK(tfm_model_generate_batch(&ms, 2, NULL, NULL, pp, n_prompts, &o, out, N, n_out));
    for (i = 0; i < 2; i++) {
        int32_t one[N];
        int n1 = 0;
        CHECK_OK(tfm_model_generate(&ms, NULL, 0, prompts[i], n_prompts[i], &o, one, &n1));
        CHECK_MSG(n1 == n_out[i] && !memcmp(one, out + i * N, (size_t)n1 * sizeof(int32_t)),
                  "past max_len: batch row %d differs from its generation alone", i);
    }
    /* beam search past max_len: each hypothesis's score is the big model's full score of it */
    {
        int lens[3], found = 0;
        float scores[3], total;
        o.max_new = 30;
        o.beam_width = 3;
        CHECK_OK(tfm_model_beam_search(&ms, NULL, 0, prompts[1], 7, &o, 3, out, N, lens, scores, &found));
        CHECK(found == 3);
        for (i = 0; i < found; i++) {
            CHECK_OK(tfm_model_score(&mb, NULL, 0, prompts[1], 7, out + i * N, lens[i], NULL, &total));
            CHECK_NEAR(scores[i], total, 1e-4);
        }
        /* scoring is a full forward: it stays within max_len */
        CHECK_ERR(tfm_model_score(&ms, NULL, 0, prompts[1], 7, out, 30, NULL, &total), TFM_E_ARG, "max_len");
    }
    free(full);
    tfm_model_free(&ms);
    tfm_model_free(&mb);
    /* a learned position table ends at max_len, window or not; so does a model without a window */
    memset(&o, 0, sizeof o);
    o.max_new = 20;
    for (i = 0; i < 2; i++) {
        cs.pos = i ? TFM_POS_ROPE : TFM_POS_LEARNED;
        cs.rope_base = i ? 100.0f : 0.0f;
        cs.attn_window = i ? 0 : 3;
        cs.attn_sinks = 0;
        CHECK_OK(tfm_model_init(&ms, &cs, NULL, 0));
        if (!ms.impl) continue;
        CHECK_ERR(tfm_model_generate(&ms, NULL, 0, seq, 3, &o, out, &n_out[0]), TFM_E_ARG, i ? "max_len" : "TFM_POS_ROPE");
        CHECK_ERR(tfm_kv_cache_init(&kc, &ms, 1, 13), TFM_E_ARG, "max_len");
        tfm_model_free(&ms);
    }
}

/* Greedy generation: each new token is the argmax of a full forward over everything before it. */
static void gen_check_greedy(tfm_pos_kind pos) {
    tfm_config c;
    tfm_model m;
    tfm_gen_opts o;
    tfm_batch b;
    int32_t seq[12] = {3, 1, 4}, out[9];
    int n = 0, i, t;
    gen_config(&c, TFM_MODEL_DECODER_LM, 1, pos);
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
        CHECK_MSG(best == seq[t + 1], "pos %d position %d: generated %d, argmax of the full forward %d", (int)pos, t + 1,
                  seq[t + 1], best);
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
static void gen_test_greedy(void) {
    gen_check_greedy(TFM_POS_LEARNED);
    gen_check_greedy(TFM_POS_ROPE);
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
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "max_len");
    o.max_new = 2;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 0, &o, out, NULL), TFM_E_ARG, "tfm_model_generate");
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
        CHECK_ERR(tfm_kv_cache_init(&kc, &m, -1, 0), TFM_E_ARG, "tfm_kv_cache_init");
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

/* ---- reference decoding: full forwards (no cache) and a sampler written apart from the library's ---- */

/* Logits of the position after seq (n ids) under a full forward of batch 1: an LM over seq, an
   encoder-decoder over src (src_len ids) with decoder inputs seq. out: V floats. */
static void gen_ref_logits(tfm_model *m, const int32_t *src, int src_len, const int32_t *seq, int n, float *out) {
    tfm_batch b;
    int64_t V = m->cfg.kind == TFM_MODEL_ENCODER_DECODER ? m->cfg.tgt_vocab_size : m->cfg.vocab_size;
    memset(&b, 0, sizeof b);
    b.batch = 1;
    if (src) {
        b.len = src_len;
        b.tokens = src;
        b.tgt_len = n;
        b.tgt_in = seq;
    } else {
        b.len = n;
        b.tokens = seq;
    }
    CHECK_OK(tfm_model_forward(m, &b, NULL, NULL));
    memcpy(out, tfm_model_logits(m).data + (int64_t)(n - 1) * V, (size_t)V * sizeof(float));
}

/* The sampler as tfm_gen_opts documents it, computed another way: a token survives top_k when fewer than k
   tokens are strictly likelier; top_p when the mass of the kept tokens ranked before it (likelier, or as
   likely with a lower id) is below top_p of the kept mass. hist: the n_hist ids seen so far. */
static int32_t gen_ref_pick(const float *logits, int V, const tfm_gen_opts *o, tfm_rng *rng, const int32_t *hist,
                            int n_hist) {
    double l[64] = {0}, q[64], mx, tot = 0.0, r, cum = 0.0;
    int keep[64], j, i, best = 0;
    for (j = 0; j < V; j++) {
        int seen = 0;
        for (i = 0; i < n_hist; i++) seen |= hist[i] == j;
        l[j] = logits[j];
        if (seen && o->repetition_penalty > 0.0f && o->repetition_penalty != 1.0f)
            l[j] = logits[j] > 0.0f ? (double)(logits[j] / o->repetition_penalty) : (double)(logits[j] * o->repetition_penalty);
    }
    for (j = 0; j < V; j++)
        if (l[j] > l[best]) best = j;
    if (o->temperature <= 0.0f) return best;
    mx = l[best];
    for (j = 0; j < V; j++) {
        q[j] = exp((l[j] - mx) / (double)o->temperature);
        keep[j] = 1;
    }
    if (o->top_k > 0)
        for (j = 0; j < V; j++) {
            int above = 0;
            for (i = 0; i < V; i++) above += q[i] > q[j];
            if (above >= o->top_k) keep[j] = 0;
        }
    if (o->top_p > 0.0f && o->top_p < 1.0f) {
        int kept_k[64];
        double mass = 0.0;
        for (j = 0; j < V; j++) {
            kept_k[j] = keep[j];
            if (keep[j]) mass += q[j];
        }
        for (j = 0; j < V; j++) {
            double before = 0.0;
            if (!kept_k[j]) continue;
            for (i = 0; i < V; i++)
                if (kept_k[i] && (q[i] > q[j] || (q[i] == q[j] && i < j))) before += q[i];
            if (!(before < (double)o->top_p * mass)) keep[j] = 0;
        }
    }
    for (j = 0; j < V; j++) {
        if (o->min_p > 0.0f && q[j] < (double)o->min_p) keep[j] = 0;
        if (keep[j]) tot += q[j];
    }
    r = (double)tfm_rng_uniform(rng) * tot;
    for (j = 0; j < V; j++) {
        if (!keep[j]) continue;
        cum += q[j];
        if (cum > r) return j;
    }
    return -1;
}

static int gen_is_stop(const tfm_gen_opts *o, int32_t t) {
    int i;
    if (o->has_stop && o->stop_token == t) return 1;
    for (i = 0; i < o->n_stop; i++)
        if (o->stop_tokens[i] == t) return 1;
    return 0;
}

/* What generation must give for one row, decoded with full forwards and the reference sampler from the
   stream of `seed`: out (n ids, returned). */
static int gen_ref_generate(tfm_model *m, const int32_t *src, int src_len, const int32_t *prompt, int n_prompt,
                            const tfm_gen_opts *o, uint64_t seed, int32_t *out) {
    int32_t seq[64];
    float lg[64];
    tfm_rng rng;
    int n = 0, V = (int)(m->cfg.kind == TFM_MODEL_ENCODER_DECODER ? m->cfg.tgt_vocab_size : m->cfg.vocab_size);
    tfm_rng_seed(&rng, seed);
    memcpy(seq, prompt, (size_t)n_prompt * sizeof(int32_t));
    while (n < o->max_new) {
        int32_t t;
        gen_ref_logits(m, src, src_len, seq, n_prompt + n, lg);
        t = gen_ref_pick(lg, V, o, &rng, seq, n_prompt + n);
        seq[n_prompt + n] = t;
        out[n++] = t;
        if (gen_is_stop(o, t)) break;
    }
    return n;
}

static void gen_sampling_opts(tfm_gen_opts *o, int which) {
    memset(o, 0, sizeof *o);
    o->max_new = 7;
    o->seed = 11 + (uint64_t)which;
    switch (which) {
    case 0: o->temperature = 0.7f; o->top_k = 4; break;
    case 1: o->temperature = 1.3f; o->top_p = 0.8f; break;
    case 2: o->temperature = 1.0f; o->min_p = 0.1f; break;
    case 3: o->temperature = 0.9f; o->top_k = 6; o->top_p = 0.9f; o->min_p = 0.05f; o->repetition_penalty = 1.3f; break;
    case 4: o->repetition_penalty = 1.8f; break; /* greedy with a penalty */
    default: o->temperature = 2.0f; o->repetition_penalty = 0.7f; break;
    }
}

/* The sampler alone against the reference, on many logit vectors with tied values (quantised to
   quarters), option sets drawn at random and the same random stream: every pick must agree. */
static void gen_test_pick(void) {
    tfm_rng data, r1, r2;
    float lg[24], work_lg[24];
    double p[24];
    tfm__cand cand[24];
    int32_t hist[3];
    unsigned char seen[24];
    int trial, j, V = 24, bad = 0, sampled_low = 0;
    tfm_rng_seed(&data, 3);
    for (trial = 0; trial < 3000; trial++) {
        tfm_gen_opts o;
        int32_t a, b;
        memset(&o, 0, sizeof o);
        for (j = 0; j < V; j++) lg[j] = (float)(int)(tfm_rng_normal(&data) * 6.0f) * 0.25f;
        o.temperature = trial % 7 == 0 ? 0.0f : 0.3f + 2.0f * tfm_rng_uniform(&data);
        if (trial % 2) o.top_k = 1 + (int)(tfm_rng_uniform(&data) * V);
        if (trial % 3) o.top_p = tfm_rng_uniform(&data);
        if (trial % 5 < 2) o.min_p = 0.5f * tfm_rng_uniform(&data);
        if (trial % 4 == 1) o.repetition_penalty = 0.5f + 2.0f * tfm_rng_uniform(&data);
        memset(seen, 0, sizeof seen);
        for (j = 0; j < 3; j++) {
            hist[j] = (int32_t)(tfm_rng_uniform(&data) * V);
            seen[hist[j]] = 1;
        }
        tfm_rng_seed(&r1, (uint64_t)trial);
        tfm_rng_seed(&r2, (uint64_t)trial);
        memcpy(work_lg, lg, sizeof lg);
        a = tfm__pick(work_lg, V, &o, &r1, seen, p, cand);
        b = gen_ref_pick(lg, V, &o, &r2, hist, 3);
        if (a != b && bad++ < 5)
            printf("    trial %d: picked %d, reference %d (T %g k %d p %g min_p %g rp %g)\n", trial, a, b,
                   (double)o.temperature, o.top_k, (double)o.top_p, (double)o.min_p, (double)o.repetition_penalty);
        for (j = 0; j < V; j++) /* a pick below the likeliest logit: sampling, not argmax */
            if (lg[j] > lg[a]) {
                sampled_low++;
                break;
            }
    }
    CHECK_MSG(bad == 0, "%d of 3000 picks differ from the reference", bad);
    CHECK_MSG(sampled_low > 1000, "only %d picks were not the argmax", sampled_low);
}

/* Sampling: every combination against the reference sampler on the same random stream, for an LM and an
   encoder-decoder; the same seed at 1 and 2 threads gives the same ids; several stop tokens. */
static void gen_test_sampling(void) {
    int kind, which, i;
    for (kind = 0; kind < 2; kind++) {
        tfm_config c;
        tfm_model m;
        tfm_gen_opts o;
        int32_t src[5] = {4, 9, 1, 12, 3}, prompt[3] = {2, 7, 5}, out[16], want[16];
        int encdec = kind == 1, n, nw, saved = tfm_get_num_threads();
        const int32_t *s = encdec ? src : NULL;
        gen_config(&c, encdec ? TFM_MODEL_ENCODER_DECODER : TFM_MODEL_DECODER_LM, kind, TFM_POS_LEARNED);
        c.init_std = 0.15f; /* logits spread, but not so far that sampling is always the argmax */
        CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
        if (!m.impl) return;
        tfm_model_train(&m, 0);
        for (which = 0; which < 6; which++) {
            gen_sampling_opts(&o, which);
            CHECK_OK(tfm_model_generate(&m, s, 5, prompt, encdec ? 1 : 3, &o, out, &n));
            nw = gen_ref_generate(&m, s, 5, prompt, encdec ? 1 : 3, &o, o.seed, want);
            CHECK_MSG(n == nw && !memcmp(out, want, (size_t)n * sizeof(int32_t)),
                      "kind %d options %d: %d ids, reference %d (first %d vs %d)", kind, which, n, nw, out[0], want[0]);
            /* the same seed at another thread count */
            tfm_set_num_threads(which % 2 ? 1 : 2);
            CHECK_OK(tfm_model_generate(&m, s, 5, prompt, encdec ? 1 : 3, &o, want, &nw));
            tfm_set_num_threads(saved);
            CHECK(n == nw && !memcmp(out, want, (size_t)n * sizeof(int32_t)));
        }
        /* several stop tokens: generation ends at the first of them */
        gen_sampling_opts(&o, 4);
        o.max_new = 8;
        CHECK_OK(tfm_model_generate(&m, s, 5, prompt, 1, &o, want, &nw));
        CHECK(nw == 8);
        {
            int32_t stops[2];
            stops[0] = want[5];
            stops[1] = want[3];
            o.stop_tokens = stops;
            o.n_stop = 2;
            for (i = 0; i < 8 && want[i] != stops[0] && want[i] != stops[1]; i++) {}
            CHECK_OK(tfm_model_generate(&m, s, 5, prompt, 1, &o, out, &n));
            CHECK_MSG(n == i + 1 && !memcmp(out, want, (size_t)n * sizeof(int32_t)), "stopped after %d ids, want %d", n, i + 1);
        }
        tfm_model_free(&m);
    }
}

/* Streaming: tokens in the order they are chosen, with their row; a non-zero return stops that row only. */
typedef struct gen_stream { int n, row[64], stop_row, stop_at, seen_of_stop_row; int32_t tok[64]; } gen_stream;
static int gen_on_token(void *user, int row, int32_t token) {
    gen_stream *s = (gen_stream *)user;
    if (s->n < 64) {
        s->row[s->n] = row;
        s->tok[s->n++] = token;
    }
    return row == s->stop_row && ++s->seen_of_stop_row == s->stop_at;
}

/* Batched decoding: rows of different prompt (and source) lengths, ending at different times, each
   equal to decoding it alone with the seed + row; greedy and sampled; and streaming. */
static void gen_check_batch(tfm_model_kind kind) {
    tfm_config c;
    tfm_model m;
    tfm_gen_opts o;
    int32_t srcs[4][12] = {{3, 1, 4, 1, 5}, {9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2}, {3, 8}, {4, 6, 2, 6, 4, 3, 3}};
    int32_t prompts[4][6] = {{2, 7, 1, 8, 2, 8}, {1}, {4, 1, 4}, {3, 9}};
    int src_lens[4] = {5, 12, 2, 7}, n_prompts[4] = {6, 1, 1, 2}, n_out[4], b, which, i;
    const int32_t *sp[4], *pp[4];
    int32_t out[4 * 9], alone[9];
    int encdec = kind == TFM_MODEL_ENCODER_DECODER;
    gen_config(&c, kind, 1, TFM_POS_LEARNED);
    c.max_batch = 4;
    c.init_std = 0.15f;
    /* the prompts of 1, 1 and 2 ids are read together and the longest alone (padding the others to it
       would cost more than their ids); an encoder-decoder's 1, 1, 1 and 4 (4 + 6 new fit max_tgt_len 10)
       as well */
    if (encdec) {
        n_prompts[0] = 4;
        n_prompts[3] = 1;
    }
    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    if (!m.impl) return;
    tfm_model_train(&m, 0);
    for (b = 0; b < 4; b++) {
        sp[b] = srcs[b];
        pp[b] = prompts[b];
    }
    for (which = 0; which < 4; which++) {
        int32_t stops[1];
        gen_sampling_opts(&o, which == 0 ? 4 : which == 1 ? 0 : 3);
        o.max_new = 6;
        if (which == 2) { /* a stop token that ends some rows early */
            int nw;
            CHECK_OK(tfm_model_generate(&m, encdec ? sp[1] : NULL, src_lens[1], pp[1], n_prompts[1], &o, alone, &nw));
            stops[0] = alone[1];
            o.stop_tokens = stops;
            o.n_stop = 1;
        }
        if (which == 3) o.temperature = 0.0f; /* plain greedy */
        CHECK_OK(tfm_model_generate_batch(&m, 4, encdec ? sp : NULL, encdec ? src_lens : NULL, pp, n_prompts, &o, out, 9, n_out));
        for (b = 0; b < 4; b++) {
            int na;
            tfm_gen_opts ob = o;
            ob.seed = o.seed + (uint64_t)b;
            CHECK_OK(tfm_model_generate(&m, encdec ? sp[b] : NULL, src_lens[b], pp[b], n_prompts[b], &ob, alone, &na));
            CHECK_MSG(n_out[b] == na && !memcmp(out + b * 9, alone, (size_t)na * sizeof(int32_t)),
                      "kind %d options %d row %d: batched %d ids, alone %d", (int)kind, which, b, n_out[b], na);
        }
    }
    /* streaming: every chosen token, in order per row; row 2 stops itself after its third */
    {
        gen_stream st;
        int count[4] = {0, 0, 0, 0};
        memset(&st, 0, sizeof st);
        st.stop_row = 2;
        st.stop_at = 3;
        gen_sampling_opts(&o, 0);
        o.max_new = 5;
        o.on_token = gen_on_token;
        o.on_token_user = &st;
        CHECK_OK(tfm_model_generate_batch(&m, 4, encdec ? sp : NULL, encdec ? src_lens : NULL, pp, n_prompts, &o, out, 9, n_out));
        CHECK(n_out[0] == 5 && n_out[1] == 5 && n_out[2] == 3 && n_out[3] == 5);
        CHECK(st.n == 18);
        for (i = 0; i < st.n; i++) {
            b = st.row[i];
            CHECK_MSG(b >= 0 && b < 4 && count[b] < n_out[b] && out[b * 9 + count[b]] == st.tok[i], "streamed token %d", i);
            if (b >= 0 && b < 4) count[b]++;
        }
        /* rows are streamed step by step: the prompts are read first, so every row, whatever its
           prompt's length, chose its first token in the first step */
        CHECK(st.n >= 4 && (1 << st.row[0] | 1 << st.row[1] | 1 << st.row[2] | 1 << st.row[3]) == 15);
    }
    tfm_model_free(&m);
}

static void gen_test_batch(void) {
    gen_check_batch(TFM_MODEL_DECODER_LM);
    gen_check_batch(TFM_MODEL_ENCODER_DECODER);
}

/* A batch wider than 256 rows (the cache's reorder once kept its scratch on the stack, 256 rows):
   rows end at different times, and sampled rows still equal decoding them alone. */
static void gen_test_batch_wide(void) {
    tfm_config c;
    tfm_model m;
    tfm_gen_opts o;
    enum { NB = 300 };
    static int32_t prompts[NB][4], out[NB * 6];
    static const int32_t *pp[NB];
    static int np[NB], n_out[NB];
    int32_t alone[6], stops[1] = {3};
    int b, checked[4] = {0, 17, 256, NB - 1}, i, ended_early = 0;
    gen_config(&c, TFM_MODEL_DECODER_LM, 1, TFM_POS_LEARNED);
    c.max_batch = NB;
    c.init_std = 0.15f;
    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    if (!m.impl) return;
    for (b = 0; b < NB; b++) {
        np[b] = 1 + b % 4;
        for (i = 0; i < 4; i++) prompts[b][i] = (int32_t)((b * 7 + i * 3) % 13);
        pp[b] = prompts[b];
    }
    gen_sampling_opts(&o, 1);
    o.max_new = 6;
    o.stop_tokens = stops;
    o.n_stop = 1;
    CHECK_OK(tfm_model_generate_batch(&m, NB, NULL, NULL, pp, np, &o, out, 6, n_out));
    for (b = 0; b < NB; b++) ended_early += n_out[b] < 6;
    CHECK(ended_early > 10);
    for (i = 0; i < 4; i++) {
        int na;
        tfm_gen_opts ob = o;
        b = checked[i];
        ob.seed = o.seed + (uint64_t)b;
        CHECK_OK(tfm_model_generate(&m, NULL, 0, pp[b], np[b], &ob, alone, &na));
        CHECK_MSG(n_out[b] == na && !memcmp(out + b * 6, alone, (size_t)na * sizeof(int32_t)), "row %d", b);
    }
    tfm_model_free(&m);
}

/* tfm_model_score against the log-softmax of a full forward's logits over prompt + target. */
static void gen_test_score(void) {
    int kind;
    for (kind = 0; kind < 2; kind++) {
        tfm_config c;
        tfm_model m;
        int32_t src[6] = {5, 3, 11, 0, 2, 8}, seq[10] = {1, 6, 3, 9, 0, 4, 7, 2, 5, 8};
        int encdec = kind == 1, n_prompt = encdec ? 1 : 3, n_target = 6, t, V, j;
        float logp[8], total, lg[16];
        double sum = 0.0;
        gen_config(&c, encdec ? TFM_MODEL_ENCODER_DECODER : TFM_MODEL_DECODER_LM, 1 - kind, TFM_POS_SINUSOIDAL);
        CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
        if (!m.impl) return;
        V = encdec ? c.tgt_vocab_size : c.vocab_size;
        CHECK_OK(tfm_model_score(&m, encdec ? src : NULL, 6, seq, n_prompt, seq + n_prompt, n_target, logp, &total));
        tfm_model_train(&m, 0);
        for (t = 0; t < n_target; t++) {
            double mx = -1e30, z = 0.0, want;
            gen_ref_logits(&m, encdec ? src : NULL, 6, seq, n_prompt + t, lg);
            for (j = 0; j < V; j++) mx = lg[j] > mx ? lg[j] : mx;
            for (j = 0; j < V; j++) z += exp(lg[j] - mx);
            want = lg[seq[n_prompt + t]] - mx - log(z);
            sum += want;
            CHECK_NEAR(logp[t], want, 1e-5 * (1.0 + fabs(want)));
        }
        CHECK_NEAR(total, sum, 1e-5 * (1.0 + fabs(sum)));
        tfm_model_free(&m);
    }
}

/* Beam width 1 is greedy decoding, with and without a stop token, for both kinds. */
static void gen_test_beam_greedy(void) {
    int kind, stop;
    for (kind = 0; kind < 2; kind++) {
        tfm_config c;
        tfm_model m;
        tfm_gen_opts o;
        int32_t src[5] = {4, 9, 1, 12, 3}, prompt[3] = {2, 7, 5}, out[8], g[8];
        int encdec = kind == 1, n, ng, len, found;
        float score, total;
        gen_config(&c, encdec ? TFM_MODEL_ENCODER_DECODER : TFM_MODEL_DECODER_LM, kind, TFM_POS_LEARNED);
        CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
        if (!m.impl) return;
        for (stop = 0; stop < 2; stop++) {
            memset(&o, 0, sizeof o);
            o.max_new = 7;
            CHECK_OK(tfm_model_generate(&m, encdec ? src : NULL, 5, prompt, encdec ? 1 : 3, &o, g, &ng));
            if (stop) {
                o.has_stop = 1;
                o.stop_token = g[3];
                CHECK_OK(tfm_model_generate(&m, encdec ? src : NULL, 5, prompt, encdec ? 1 : 3, &o, g, &ng));
            }
            o.beam_width = 1;
            CHECK_OK(tfm_model_beam_search(&m, encdec ? src : NULL, 5, prompt, encdec ? 1 : 3, &o, 1, out, 8, &len, &score,
                                           &found));
            n = len;
            CHECK(found == 1 && n == ng && !memcmp(out, g, (size_t)n * sizeof(int32_t)));
            CHECK_OK(tfm_model_score(&m, encdec ? src : NULL, 5, prompt, encdec ? 1 : 3, g, ng, NULL, &total));
            CHECK_NEAR(score, total, 1e-4);
        }
        tfm_model_free(&m);
    }
}

/* On a model of 5 tokens, beam width 5 over 2 new tokens with a stop token: the n-best list equals an
   exhaustive search (every sequence scored by full forwards), with and without a length penalty. The
   model runs max_batch rows at once: fewer than the beams, they are decoded in chunks. */
static void gen_check_beam_exhaustive(int encdec, float alpha, int max_batch, tfm_pos_kind pos) {
    tfm_config c;
    tfm_model m;
    tfm_gen_opts o;
    int32_t src[4] = {2, 0, 3, 1}, prompt[2] = {3, 4}, seq[4], out[5 * 2];
    int n_prompt = encdec ? 1 : 2, V = 5, a, x, n_all = 0, i, j, lens[5], found, stop = 1;
    int32_t all_tok[30][2];
    int all_len[30];
    double all_score[30], all_norm[30];
    float scores[5], lg[8];
    gen_config(&c, encdec ? TFM_MODEL_ENCODER_DECODER : TFM_MODEL_DECODER_LM, 1, pos);
    c.vocab_size = V;
    c.tgt_vocab_size = encdec ? V : 0;
    c.max_batch = max_batch;
    c.init_std = 0.1f;
    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    if (!m.impl) return;
    tfm_model_train(&m, 0);
    memcpy(seq, prompt, (size_t)n_prompt * sizeof(int32_t));
    /* every output: [stop], or [a, x] with a not the stop token */
    for (a = 0; a < V; a++) {
        double mx = -1e30, z = 0.0, la;
        int k;
        gen_ref_logits(&m, encdec ? src : NULL, 4, seq, n_prompt, lg);
        for (k = 0; k < V; k++) mx = lg[k] > mx ? lg[k] : mx;
        for (k = 0; k < V; k++) z += exp(lg[k] - mx);
        la = lg[a] - mx - log(z);
        if (a == stop) {
            all_tok[n_all][0] = a;
            all_len[n_all] = 1;
            all_score[n_all++] = la;
            continue;
        }
        seq[n_prompt] = a;
        gen_ref_logits(&m, encdec ? src : NULL, 4, seq, n_prompt + 1, lg);
        mx = -1e30;
        z = 0.0;
        for (k = 0; k < V; k++) mx = lg[k] > mx ? lg[k] : mx;
        for (k = 0; k < V; k++) z += exp(lg[k] - mx);
        for (x = 0; x < V; x++) {
            all_tok[n_all][0] = a;
            all_tok[n_all][1] = x;
            all_len[n_all] = 2;
            all_score[n_all++] = la + lg[x] - mx - log(z);
        }
    }
    for (i = 0; i < n_all; i++) all_norm[i] = all_score[i] / pow((5.0 + all_len[i]) / 6.0, (double)alpha);
    memset(&o, 0, sizeof o);
    o.max_new = 2;
    o.beam_width = 5;
    o.length_penalty = alpha;
    o.has_stop = 1;
    o.stop_token = stop;
    CHECK_OK(tfm_model_beam_search(&m, encdec ? src : NULL, 4, prompt, n_prompt, &o, 5, out, 2, lens, scores, &found));
    CHECK(found == 5);
    for (i = 0; i < 5 && i < found; i++) {
        int best = -1;
        for (j = 0; j < n_all; j++) /* the i-th best of the exhaustive list */
            if (all_len[j] > 0 && (best < 0 || all_norm[j] > all_norm[best])) best = j;
        CHECK_MSG(lens[i] == all_len[best] && out[i * 2] == all_tok[best][0] && (lens[i] == 1 || out[i * 2 + 1] == all_tok[best][1]),
                  "encdec %d alpha %g pos %d: hypothesis %d is (%d,%d) of length %d, exhaustive (%d,%d) of length %d", encdec,
                  (double)alpha, (int)pos, i, out[i * 2], lens[i] > 1 ? out[i * 2 + 1] : -1, lens[i], all_tok[best][0],
                  all_len[best] > 1 ? all_tok[best][1] : -1, all_len[best]);
        CHECK_NEAR(scores[i], all_score[best], 1e-5 * (1.0 + fabs(all_score[best])));
        all_len[best] = 0; /* taken */
    }
    tfm_model_free(&m);
}

static void gen_test_beam_exhaustive(void) {
    gen_check_beam_exhaustive(0, 0.0f, 5, TFM_POS_LEARNED);
    gen_check_beam_exhaustive(0, 1.0f, 5, TFM_POS_LEARNED);
    gen_check_beam_exhaustive(1, 0.0f, 5, TFM_POS_LEARNED);
    gen_check_beam_exhaustive(1, 2.0f, 5, TFM_POS_LEARNED);
    /* five beams on models that run two rows, or one, at once */
    gen_check_beam_exhaustive(0, 1.0f, 2, TFM_POS_LEARNED);
    gen_check_beam_exhaustive(1, 2.0f, 2, TFM_POS_LEARNED);
    gen_check_beam_exhaustive(0, 0.0f, 1, TFM_POS_LEARNED);
    gen_check_beam_exhaustive(1, 0.0f, 1, TFM_POS_LEARNED);
    /* rotary positions: beams reordered in the cache keep keys turned at their positions */
    gen_check_beam_exhaustive(0, 1.0f, 2, TFM_POS_ROPE);
    gen_check_beam_exhaustive(1, 0.0f, 5, TFM_POS_ROPE);
}

/* A wider beam over longer outputs: every hypothesis's score is its log-probability under
   tfm_model_score, the list is ordered by the length-penalised score, and it is at least as likely as
   greedy decoding's output. The model runs max_batch rows at once (fewer than the beams: in chunks). */
static void gen_check_beam_scores(int max_batch) {
    tfm_config c;
    tfm_model m;
    tfm_gen_opts o;
    int32_t prompt[2] = {5, 1}, out[4 * 8], g[8];
    int lens[4], found, i, ng;
    float scores[4], total, gscore;
    double prev = 1e30;
    gen_config(&c, TFM_MODEL_DECODER_LM, 0, TFM_POS_LEARNED);
    c.max_batch = max_batch;
    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    if (!m.impl) return;
    memset(&o, 0, sizeof o);
    o.max_new = 8;
    CHECK_OK(tfm_model_generate(&m, NULL, 0, prompt, 2, &o, g, &ng));
    o.has_stop = 1;
    o.stop_token = g[2]; /* greedy's third token: some hypotheses end early */
    CHECK_OK(tfm_model_generate(&m, NULL, 0, prompt, 2, &o, g, &ng));
    CHECK_OK(tfm_model_score(&m, NULL, 0, prompt, 2, g, ng, NULL, &gscore));
    o.beam_width = 4;
    o.length_penalty = 0.6f;
    CHECK_OK(tfm_model_beam_search(&m, NULL, 0, prompt, 2, &o, 4, out, 8, lens, scores, &found));
    CHECK(found == 4);
    for (i = 0; i < found; i++) {
        double norm = scores[i] / pow((5.0 + lens[i]) / 6.0, 0.6);
        CHECK(lens[i] >= 1 && lens[i] <= 8);
        CHECK(lens[i] == 8 || out[i * 8 + lens[i] - 1] == o.stop_token);
        CHECK_OK(tfm_model_score(&m, NULL, 0, prompt, 2, out + i * 8, lens[i], NULL, &total));
        CHECK_NEAR(scores[i], total, 1e-4);
        CHECK(norm <= prev + 1e-6);
        prev = norm;
    }
    CHECK(scores[0] / pow((5.0 + lens[0]) / 6.0, 0.6) >= gscore / pow((5.0 + ng) / 6.0, 0.6) - 1e-5);
    tfm_model_free(&m);
}

static void gen_test_beam_scores(void) {
    gen_check_beam_scores(4);
    gen_check_beam_scores(3);
    gen_check_beam_scores(1);
}

/* Bad requests to the new calls fail with TFM_E_ARG (TFM_E_SHAPE for a batch beyond cfg.max_batch) and name the call. */
static void gen_test_errors_new(void) {
    tfm_config c;
    tfm_model m;
    tfm_gen_opts o;
    int32_t p[3] = {1, 2, 3}, bad[2] = {1, 13}, out[4 * 16], stops[1] = {20};
    const int32_t *pp[3];
    int np[3] = {3, 3, 3}, n_out[3];
    float lp[4];
    gen_config(&c, TFM_MODEL_DECODER_LM, 0, TFM_POS_LEARNED);
    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    if (!m.impl) return;
    pp[0] = pp[1] = pp[2] = p;
    memset(&o, 0, sizeof o);
    o.max_new = 2;
    o.temperature = 1.0f;
    o.top_k = 14;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "tfm_model_generate: opts.top_k");
    o.top_k = -1;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "top_k");
    o.top_k = 0;
    o.top_p = 1.5f;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "top_p");
    o.top_p = 0.0f;
    o.min_p = -0.1f;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "min_p");
    o.min_p = 0.0f;
    o.repetition_penalty = -1.0f;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "repetition_penalty");
    o.repetition_penalty = 0.0f;
    o.n_stop = 1;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "n_stop");
    o.stop_tokens = stops;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "stop_tokens[0]");
    o.n_stop = 0;
    /* batches */
    CHECK_ERR(tfm_model_generate_batch(&m, 3, NULL, NULL, pp, np, &o, out, 16, n_out), TFM_E_SHAPE, "max_batch");
    CHECK_ERR(tfm_model_generate_batch(&m, 0, NULL, NULL, pp, np, &o, out, 16, n_out), TFM_E_ARG, "tfm_model_generate_batch");
    CHECK_ERR(tfm_model_generate_batch(&m, 2, NULL, NULL, pp, np, &o, out, 1, n_out), TFM_E_ARG, "out_stride");
    np[1] = 11;
    CHECK_ERR(tfm_model_generate_batch(&m, 2, NULL, NULL, pp, np, &o, out, 16, n_out), TFM_E_ARG, "row 1");
    np[1] = 2;
    pp[1] = bad;
    CHECK_ERR(tfm_model_generate_batch(&m, 2, NULL, NULL, pp, np, &o, out, 16, n_out), TFM_E_ARG, "13");
    pp[1] = p;
    CHECK_ERR(tfm_model_generate_batch(&m, 2, pp, np, pp, np, &o, out, 16, n_out), TFM_E_ARG, "src");
    /* scores */
    CHECK_ERR(tfm_model_score(&m, NULL, 0, p, 3, bad, 2, lp, NULL), TFM_E_ARG, "tfm_model_score: target");
    CHECK_ERR(tfm_model_score(&m, NULL, 0, p, 3, p, 0, lp, NULL), TFM_E_ARG, "n_target");
    CHECK_ERR(tfm_model_score(&m, NULL, 0, p, 3, out, 11, NULL, NULL), TFM_E_ARG, "max_len");
    CHECK_ERR(tfm_model_score(&m, NULL, 0, NULL, 3, p, 3, NULL, NULL), TFM_E_ARG, "prompt");
    /* beams */
    o.temperature = 0.0f;
    o.beam_width = 14;
    CHECK_ERR(tfm_model_beam_search(&m, NULL, 0, p, 3, &o, 1, out, 16, NULL, NULL, NULL), TFM_E_ARG, "vocabulary");
    o.beam_width = 2;
    CHECK_ERR(tfm_model_beam_search(&m, NULL, 0, p, 3, &o, 3, out, 16, NULL, NULL, NULL), TFM_E_ARG, "n_best");
    CHECK_ERR(tfm_model_beam_search(&m, NULL, 0, p, 3, &o, 1, out, 1, NULL, NULL, NULL), TFM_E_ARG, "out_stride");
    CHECK_ERR(tfm_model_beam_search(&m, NULL, 0, bad, 2, &o, 1, out, 16, NULL, NULL, NULL), TFM_E_ARG,
              "tfm_model_beam_search: prompt");
    o.max_new = 10;
    CHECK_ERR(tfm_model_beam_search(&m, NULL, 0, p, 3, &o, 1, out, 16, NULL, NULL, NULL), TFM_E_ARG, "max_len");
    o.max_new = 2;
    o.length_penalty = INFINITY;
    CHECK_ERR(tfm_model_beam_search(&m, NULL, 0, p, 3, &o, 1, out, 16, NULL, NULL, NULL), TFM_E_ARG, "length_penalty");
    o.length_penalty = 0.0f;
    o.top_p = NAN;
    CHECK_ERR(tfm_model_beam_search(&m, NULL, 0, p, 3, &o, 1, out, 16, NULL, NULL, NULL), TFM_E_ARG, "top_p");
    o.top_p = 0.0f;
    o.min_p = 1.5f;
    CHECK_ERR(tfm_model_generate(&m, NULL, 0, p, 3, &o, out, NULL), TFM_E_ARG, "min_p");
    o.min_p = 0.0f;
    tfm_model_free(&m);
    /* an encoder-decoder: sources too long or with ids out of range, in every call that takes one */
    gen_config(&c, TFM_MODEL_ENCODER_DECODER, 1, TFM_POS_LEARNED);
    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    if (!m.impl) return;
    {
        int32_t src[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1}, bsrc[2] = {1, 13};
        const int32_t *ss[2];
        int sl[2] = {13, 2}, npr[2] = {1, 1};
        ss[0] = src;
        ss[1] = bsrc;
        pp[0] = pp[1] = p;
        CHECK_ERR(tfm_model_generate(&m, src, 13, p, 1, &o, out, NULL), TFM_E_ARG, "src_len 13");
        CHECK_ERR(tfm_model_beam_search(&m, src, 13, p, 1, &o, 1, out, 16, NULL, NULL, NULL), TFM_E_ARG,
                  "tfm_model_beam_search: row 0: src_len 13");
        CHECK_ERR(tfm_model_score(&m, src, 13, p, 1, p, 2, NULL, NULL), TFM_E_ARG, "tfm_model_score: row 0: src_len");
        CHECK_ERR(tfm_model_generate_batch(&m, 2, ss, sl, pp, npr, &o, out, 16, n_out), TFM_E_ARG, "row 0: src_len 13");
        sl[0] = 12;
        CHECK_ERR(tfm_model_generate_batch(&m, 2, ss, sl, pp, npr, &o, out, 16, n_out), TFM_E_ARG, "13");
        CHECK_ERR(tfm_model_beam_search(&m, bsrc, 2, p, 1, &o, 1, out, 16, NULL, NULL, NULL), TFM_E_ARG,
                  "tfm_model_beam_search: src");
        npr[0] = 11; /* beyond max_tgt_len 10 */
        sl[1] = 1;
        CHECK_ERR(tfm_model_generate_batch(&m, 2, ss, sl, pp, npr, &o, out, 16, n_out), TFM_E_ARG, "max_tgt_len");
    }
    tfm_model_free(&m);
}

/* Serving: a checkpoint of a model built for training (dropout on) loaded into an inference_only model
   (batch 2, the prompts' length) gives, for greedy and sampled rows, beams and scores, the same tokens
   as the training model and as the full-forward reference decoder running on the loaded model. */
static void gen_check_serving(tfm_model_kind kind) {
    tfm_config c, ic;
    tfm_model tm, im;
    tfm_gen_opts o;
    int32_t src[5] = {4, 9, 1, 12, 3}, p0[3] = {2, 7, 5}, p1[2] = {6, 1}, out_t[3 * 8], out_i[3 * 8], ref[8];
    const int32_t *srcs[2], *prompts[2];
    int encdec = kind == TFM_MODEL_ENCODER_DECODER, sl[2] = {5, 3}, np[2], nt[2], ni[2], b, w, i, lt[3], li[3];
    float st[3], si[3], tot_t, tot_i;
    char path[96];
    gen_config(&c, kind, 1, TFM_POS_LEARNED);
    c.dropout = 0.2f;
    c.attn_dropout = 0.2f;
    c.n_layers = 3;
    snprintf(path, sizeof path, "gen_serve_%lx.safetensors", (unsigned long)((uintptr_t)&c >> 4) ^ (unsigned long)time(NULL));
    CHECK_OK(tfm_model_init(&tm, &c, NULL, 0));
    if (!tm.impl) return;
    CHECK_OK(tfm_model_save(&tm, path, 0, NULL, 0));
    CHECK_OK(tfm_config_load(path, &ic));
    ic.inference_only = 1;
    CHECK_OK(tfm_model_init(&im, &ic, NULL, 0));
    if (!im.impl) {
        tfm_model_free(&tm);
        remove(path);
        return;
    }
    CHECK_OK(tfm_model_load(&im, path));
    remove(path);
    tfm_model_train(&tm, 1); /* generation turns dropout off by itself */
    srcs[0] = src;
    srcs[1] = src + 2;
    prompts[0] = p0;
    prompts[1] = p1;
    np[0] = encdec ? 1 : 3;
    np[1] = encdec ? 1 : 2;
    for (w = 0; w < 3; w++) {
        if (w == 0) {
            memset(&o, 0, sizeof o);
            o.max_new = 6;
        } else {
            gen_sampling_opts(&o, w == 1 ? 1 : 3);
            o.max_new = 6;
        }
        CHECK_OK(tfm_model_generate_batch(&tm, 2, encdec ? srcs : NULL, encdec ? sl : NULL, prompts, np, &o, out_t, 8, nt));
        CHECK_OK(tfm_model_generate_batch(&im, 2, encdec ? srcs : NULL, encdec ? sl : NULL, prompts, np, &o, out_i, 8, ni));
        for (b = 0; b < 2; b++) {
            int nr = gen_ref_generate(&im, encdec ? srcs[b] : NULL, sl[b], prompts[b], np[b], &o, o.seed + (uint64_t)b, ref);
            CHECK_MSG(ni[b] == nt[b] && !memcmp(out_i + b * 8, out_t + b * 8, (size_t)nt[b] * sizeof(int32_t)),
                      "kind %d, options %d, row %d: the inference_only model's tokens differ from the training model's",
                      (int)kind, w, b);
            CHECK_MSG(ni[b] == nr && !memcmp(out_i + b * 8, ref, (size_t)nr * sizeof(int32_t)),
                      "kind %d, options %d, row %d: the inference_only model's tokens differ from full forwards", (int)kind,
                      w, b);
        }
    }
    memset(&o, 0, sizeof o);
    o.max_new = 6;
    o.beam_width = 3; /* wider than the inference model's batch of 2 */
    CHECK_OK(tfm_model_beam_search(&tm, encdec ? src : NULL, 5, p0, np[0], &o, 3, out_t, 8, lt, st, NULL));
    CHECK_OK(tfm_model_beam_search(&im, encdec ? src : NULL, 5, p0, np[0], &o, 3, out_i, 8, li, si, NULL));
    for (i = 0; i < 3; i++) {
        CHECK(lt[i] == li[i] && !memcmp(out_t + i * 8, out_i + i * 8, (size_t)lt[i] * sizeof(int32_t)));
        CHECK_NEAR(si[i], st[i], 1e-5 * (1.0 + fabs(st[i])));
    }
    CHECK_OK(tfm_model_score(&tm, encdec ? src : NULL, 5, p0, np[0], out_t, lt[0], NULL, &tot_t));
    CHECK_OK(tfm_model_score(&im, encdec ? src : NULL, 5, p0, np[0], out_t, lt[0], NULL, &tot_i));
    CHECK_NEAR(tot_i, tot_t, 1e-5 * (1.0 + fabs(tot_t)));
    tfm_model_free(&tm);
    tfm_model_free(&im);
}

/* An inference_only model's activations are one layer's, whatever the depth: going from 2 to 8 layers
   adds the parameters and the layers' bookkeeping (under one (B,T,C) activation here), where a
   training model adds at least 6 layers' saved activations. */
static void gen_check_serving_memory(tfm_model_kind kind) {
    tfm_config c, r;
    size_t s2[4], s8[4], t2[4], t8[4], btc;
    int n;
    gen_config(&c, kind, 1, TFM_POS_LEARNED);
    c.d_model = 64;
    c.n_heads = 4;
    c.max_len = 128;
    c.max_tgt_len = kind == TFM_MODEL_ENCODER_DECODER ? 128 : 0;
    c.max_batch = 4;
    btc = (size_t)4 * 128 * 64 * sizeof(float);
    c.n_layers = 2;
    CHECK_OK(tfm__config_resolve("test", &c, &r));
    CHECK_OK(tfm__model_layout(&r, t2, &n));
    r.inference_only = 1;
    CHECK_OK(tfm__model_layout(&r, s2, &n));
    c.n_layers = 8;
    CHECK_OK(tfm__config_resolve("test", &c, &r));
    CHECK_OK(tfm__model_layout(&r, t8, &n));
    r.inference_only = 1;
    CHECK_OK(tfm__model_layout(&r, s8, &n));
    CHECK_MSG(s8[2] - s2[2] < btc, "kind %d: inference_only activations grow by %zu bytes from 2 to 8 layers", (int)kind,
              s8[2] - s2[2]);
    CHECK_MSG(t8[2] - t2[2] > 6 * 4 * btc, "kind %d: training activations grow by only %zu bytes", (int)kind, t8[2] - t2[2]);
    CHECK(s8[0] == t8[0] && s8[0] > s2[0]); /* the same parameters either way */
}

static void gen_test_serving(void) {
    gen_check_serving(TFM_MODEL_DECODER_LM);
    gen_check_serving(TFM_MODEL_ENCODER_DECODER);
    gen_check_serving_memory(TFM_MODEL_DECODER_LM);
    gen_check_serving_memory(TFM_MODEL_ENCODER_DECODER);
}

/* Grouped-query attention (2 key/value heads of 4, and multi-query): the cache holds only the key/value heads
   (kv_dim, and a smaller allocation by the factor); cached decoding equals full recomputation with rotary
   positions across beam reorders and uneven rows, greedy generation, beam search against an exhaustive
   search, batched generation, scoring. */
static void gen_test_gqa(void) {
    int kv;
    for (kv = 2; kv >= 1; kv--) {
        tfm_config c;
        tfm_model m, full;
        tfm_kv_cache kc, kf;
        gen_kv_heads = kv;
        gen_config(&c, TFM_MODEL_ENCODER_DECODER, 1, TFM_POS_ROPE);
        CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
        c.n_kv_heads = 0;
        CHECK_OK(tfm_model_init(&full, &c, NULL, 0));
        if (m.impl && full.impl) {
            CHECK_OK(tfm_kv_cache_init(&kc, &m, 2, 0));
            CHECK_OK(tfm_kv_cache_init(&kf, &full, 2, 0));
            CHECK(kc.kv_dim == 16 / 4 * kv && kf.kv_dim == 16);
            /* self and cross floats, one block after the other: the grouped cache's end is the factor nearer */
            CHECK((kc.cross_kv - kc.self_kv) * (4 / kv) == kf.cross_kv - kf.self_kv);
            CHECK((int64_t)kc.n_layers * kc.max_batch * (kc.max_len + kc.max_src_len) * 2 * kc.kv_dim * (4 / kv) ==
                  (int64_t)kf.n_layers * kf.max_batch * (kf.max_len + kf.max_src_len) * 2 * kf.kv_dim);
            tfm_kv_cache_free(&kc);
            tfm_kv_cache_free(&kf);
        }
        if (m.impl) tfm_model_free(&m);
        if (full.impl) tfm_model_free(&full);
        gen_check_cache(TFM_MODEL_DECODER_LM, 1, TFM_POS_ROPE);
        gen_check_cache(TFM_MODEL_DECODER_LM, 0, TFM_POS_LEARNED);
        gen_check_cache(TFM_MODEL_ENCODER_DECODER, 0, TFM_POS_ROPE);
        gen_check_cache_uneven(TFM_MODEL_DECODER_LM, TFM_POS_ROPE);
        gen_check_cache_uneven(TFM_MODEL_ENCODER_DECODER, TFM_POS_ROPE);
        gen_check_greedy(TFM_POS_ROPE);
        gen_check_beam_exhaustive(0, 1.0f, 2, TFM_POS_ROPE);
        gen_check_beam_exhaustive(1, 0.0f, 5, TFM_POS_ROPE);
        gen_check_batch(TFM_MODEL_DECODER_LM);
        gen_check_batch(TFM_MODEL_ENCODER_DECODER);
        gen_test_score();
    }
    gen_kv_heads = 0;
}

static void suite_generate(void) {
    RUN(gen_test_cache_lm);
    RUN(gen_test_cache_encdec);
    RUN(gen_test_cache_uneven);
    RUN(gen_test_window_cache);
    RUN(gen_test_window_past_max_len);
    RUN(gen_test_greedy);
    RUN(gen_test_errors);
    RUN(gen_test_pick);
    RUN(gen_test_sampling);
    RUN(gen_test_batch);
    RUN(gen_test_batch_wide);
    RUN(gen_test_score);
    RUN(gen_test_beam_greedy);
    RUN(gen_test_beam_exhaustive);
    RUN(gen_test_beam_scores);
    RUN(gen_test_errors_new);
    RUN(gen_test_serving);
    RUN(gen_test_gqa);
}
