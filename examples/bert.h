/* bert.h - pretrained BERT-family encoders in Hugging Face's layout (config.json, model.safetensors,
   tokenizer.json), run and fine-tuned with transformer.h, for its examples. C99, libc only.

       #define BERT_IMPLEMENTATION     in one C file that also has TFM_IMPLEMENTATION (it defines
       #include "bert.h"               WORDPIECE_IMPLEMENTATION and includes wordpiece.h itself)

       bert_encoder e;
       if (bert_open(&e, "all-MiniLM-L6-v2", 256, 32, 0, 1) != 0) {   dir, max_len, max_batch,
           fprintf(stderr, "%s\n", bert_last_error());                  n_classes (0: embeddings only),
           return 1;                                                     inference_only
       }
       float emb[2 * 384];
       const char *texts[2] = {"In the beginning", "God created"};
       bert_embed(&e, texts, NULL, 2, emb);     sentence-transformers' embeddings: mean over the tokens, L2 norm
       bert_close(&e);

   What it does. config.json (a small reader: model_type "bert", hidden_act "gelu", absolute positions)
   gives the sizes; the model is a transformer.h classifier in BERT's layout: token, position and
   token-type embeddings summed and normalised (cfg.emb_norm, cfg.type_vocab_size), post-LN blocks with
   exact GELU, layer_norm_eps, mean pooling. model.safetensors loads as shipped through
   tfm_model_load_mapped and the name map bert_name_map builds: Hugging Face's names to the library's,
   query, key and value into the rows of in_proj_weight / in_proj_bias, the position table's first
   max_len rows; embeddings.position_ids (I64) and the pooler are skipped; the classifier head is kept
   as initialised (a fresh head to fine-tune). tokenizer.json goes to wordpiece.h.
   Errors name the file and the field ("bert_open: x/config.json: "model_type" is "gpt2", want
   "bert""); nothing exits or prints. */

#ifndef BERT_H
#define BERT_H

#include "wordpiece.h"

typedef struct bert_config {
    int vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size;
    int max_position_embeddings, type_vocab_size;
    float layer_norm_eps, hidden_dropout_prob, attention_probs_dropout_prob;
} bert_config;

typedef struct bert_encoder {
    bert_config bc;
    tfm_model m;
    wp_tokenizer *wp;
    int max_len, max_batch;
    int32_t *ids, *lens; /* (max_batch, max_len), (max_batch) */
} bert_encoder;

/* The message of the last failure (names the function, the file and the field). */
const char *bert_last_error(void);
/* config.json at path into *bc: 0, or -1 with bert_last_error. */
int bert_read_config(const char *path, bert_config *bc);
/* The name map for n_layers layers into map (5 + 16 n_layers + 2 entries), its names into names (as
   many 96-byte strings); max_pos: the file's position rows. Returns the count. */
int bert_name_map(int n_layers, int max_pos, tfm_name_map *map, char (*names)[96]);
/* The tfm_config of a BERT classifier (n_classes > 0) or encoder (n_classes 0: a 1-class head, unused). */
tfm_config bert_tfm_config(const bert_config *bc, int max_len, int max_batch, int n_classes, int inference_only);
/* Model, tokenizer and weights from dir: 0, or -1 with bert_last_error (nothing to close then). */
int bert_open(bert_encoder *e, const char *dir, int max_len, int max_batch, int n_classes, int inference_only);
/* Tokenize texts[0..n) (n <= max_batch; text_lens[i] bytes each, or NUL-terminated when text_lens is
   NULL) into e->ids / e->lens and a batch *b over them (len: the longest row). */
int bert_batch(bert_encoder *e, const char *const *texts, const size_t *text_lens, int n, tfm_batch *b);
/* The L2-normalised mean-pooled embeddings of texts[0..n) into out (n, hidden_size), any n. */
int bert_embed(bert_encoder *e, const char *const *texts, const size_t *text_lens, int n, float *out);
void bert_close(bert_encoder *e);

#endif /* BERT_H */

#ifdef BERT_IMPLEMENTATION
#ifndef BERT_IMPLEMENTED
#define BERT_IMPLEMENTED
#ifndef WORDPIECE_IMPLEMENTATION
#define WORDPIECE_IMPLEMENTATION
#endif
#include "wordpiece.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char bert__err[600];

const char *bert_last_error(void) { return bert__err; }

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static int bert__fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(bert__err, sizeof bert__err, fmt, ap);
    va_end(ap);
    return -1;
}

/* A JSON number at j->p (checked by wp__jskip) into *v. */
static int bert__jnum(wp__json *j, double *v) {
    char buf[64], *end;
    const unsigned char *st;
    wp__jws(j);
    st = j->p;
    if (!wp__jskip(j, 0)) return 0;
    if ((size_t)(j->p - st) >= sizeof buf || !(*st == '-' || (*st >= '0' && *st <= '9'))) return 0;
    memcpy(buf, st, (size_t)(j->p - st));
    buf[j->p - st] = 0;
    *v = strtod(buf, &end);
    return *end == 0;
}

int bert_read_config(const char *path, bert_config *bc) {
    static const char *const ints[7] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                        "intermediate_size", "max_position_embeddings", "type_vocab_size"};
    int *dst[7];
    int have[7] = {0, 0, 0, 0, 0, 0, 0}, have_eps = 0, have_type = 0, first = 1, got, k;
    char key[64], sval[64], *data;
    size_t len;
    FILE *fp;
    wp__json j;
    double v;
    memset(bc, 0, sizeof *bc);
    dst[0] = &bc->vocab_size, dst[1] = &bc->hidden_size, dst[2] = &bc->num_hidden_layers;
    dst[3] = &bc->num_attention_heads, dst[4] = &bc->intermediate_size, dst[5] = &bc->max_position_embeddings;
    dst[6] = &bc->type_vocab_size;
    if (!(fp = fopen(path, "rb"))) return bert__fail("bert_read_config: %s: cannot open the file", path);
    data = (char *)malloc(1 << 20); /* a config is a few hundred bytes: at most 1 MiB is read */
    len = data ? fread(data, 1, 1 << 20, fp) : 0;
    if (!data || ferror(fp) || len == 1 << 20) {
        fclose(fp);
        free(data);
        return bert__fail("bert_read_config: %s: %s", path, !data ? "out of memory" : len == 1 << 20 ? "over 1 MiB" : "cannot read it");
    }
    fclose(fp);
    memset(&j, 0, sizeof j);
    j.beg = j.p = (const unsigned char *)data;
    j.end = j.p + len;
    if (!wp__jexpect(&j, '{', "'{' (a JSON object)")) got = 0;
    else
        while ((got = wp__jkey(&j, &first, key, sizeof key)) == 1) {
            for (k = 0; k < 7 && strcmp(key, ints[k]); k++) {}
            if (k < 7) {
                long long x;
                if (!wp__jint(&j, 1, 1 << 24, &x, ints[k])) break;
                *dst[k] = (int)x, have[k] = 1;
            } else if (!strcmp(key, "layer_norm_eps") || !strcmp(key, "hidden_dropout_prob") ||
                       !strcmp(key, "attention_probs_dropout_prob")) {
                if (!bert__jnum(&j, &v) || !(v >= 0.0 && v < 1.0)) {
                    free(data);
                    return bert__fail("bert_read_config: %s: \"%s\" must be a number in [0,1)", path, key);
                }
                if (key[0] == 'l') bc->layer_norm_eps = (float)v, have_eps = 1;
                else if (key[0] == 'h') bc->hidden_dropout_prob = (float)v;
                else bc->attention_probs_dropout_prob = (float)v;
            } else if (!strcmp(key, "model_type") || !strcmp(key, "hidden_act") || !strcmp(key, "position_embedding_type")) {
                const char *want = key[0] == 'm' ? "bert" : key[0] == 'h' ? "gelu" : "absolute";
                if (wp__jpeek(&j) != '"' || !wp__jname(&j, sval, sizeof sval)) {
                    free(data);
                    return bert__fail("bert_read_config: %s: \"%s\" must be a string (\"%s\")", path, key, want);
                }
                if (strcmp(sval, want)) {
                    free(data);
                    return bert__fail("bert_read_config: %s: \"%s\" is \"%s\", want \"%s\" (a BERT encoder)", path, key, sval,
                                      want);
                }
                have_type |= key[0] == 'm';
            } else if (!wp__jskip(&j, 1)) {
                break;
            }
        }
    if (got != 2) {
        free(data);
        return bert__fail("bert_read_config: %s: %s", path, j.err[0] ? j.err : "not a JSON object");
    }
    free(data);
    if (!have_type) return bert__fail("bert_read_config: %s: \"model_type\" is missing (want \"bert\")", path);
    for (k = 0; k < 7; k++)
        if (!have[k]) return bert__fail("bert_read_config: %s: \"%s\" is missing", path, ints[k]);
    if (!have_eps) return bert__fail("bert_read_config: %s: \"layer_norm_eps\" is missing", path);
    if (bc->hidden_size % bc->num_attention_heads)
        return bert__fail("bert_read_config: %s: \"num_attention_heads\" %d does not divide \"hidden_size\" %d", path,
                          bc->num_attention_heads, bc->hidden_size);
    return 0;
}

int bert_name_map(int n_layers, int max_pos, tfm_name_map *map, char (*names)[96]) {
    static const char *const emb[5][2] = {{"word_embeddings.weight", "tok_emb.weight"},
                                          {"position_embeddings.weight", "pos_emb.weight"},
                                          {"token_type_embeddings.weight", "type_emb.weight"},
                                          {"LayerNorm.weight", "emb_norm.weight"},
                                          {"LayerNorm.bias", "emb_norm.bias"}};
    /* per layer: Hugging Face's name, the library's, the part of three (-1: all of it) */
    static const char *const lay[16][2] = {
        {"attention.self.query.weight", "self_attn.in_proj_weight"}, {"attention.self.key.weight", "self_attn.in_proj_weight"},
        {"attention.self.value.weight", "self_attn.in_proj_weight"}, {"attention.self.query.bias", "self_attn.in_proj_bias"},
        {"attention.self.key.bias", "self_attn.in_proj_bias"},       {"attention.self.value.bias", "self_attn.in_proj_bias"},
        {"attention.output.dense.weight", "self_attn.out_proj.weight"}, {"attention.output.dense.bias", "self_attn.out_proj.bias"},
        {"attention.output.LayerNorm.weight", "norm1.weight"},       {"attention.output.LayerNorm.bias", "norm1.bias"},
        {"intermediate.dense.weight", "linear1.weight"},             {"intermediate.dense.bias", "linear1.bias"},
        {"output.dense.weight", "linear2.weight"},                   {"output.dense.bias", "linear2.bias"},
        {"output.LayerNorm.weight", "norm2.weight"},                 {"output.LayerNorm.bias", "norm2.bias"}};
    int n = 0, l, k;
    for (k = 0; k < 5; k++, n++) {
        snprintf(names[2 * n], 96, "embeddings.%s", emb[k][0]);
        memset(&map[n], 0, sizeof map[n]);
        map[n].file = names[2 * n];
        map[n].model = emb[k][1];
        map[n].file_rows = k == 1 ? max_pos : 0;
    }
    for (l = 0; l < n_layers; l++)
        for (k = 0; k < 16; k++, n++) {
            snprintf(names[2 * n], 96, "encoder.layer.%d.%s", l, lay[k][0]);
            snprintf(names[2 * n + 1], 96, "encoder.layers.%d.%s", l, lay[k][1]);
            memset(&map[n], 0, sizeof map[n]);
            map[n].file = names[2 * n];
            map[n].model = names[2 * n + 1];
            if (k < 6) map[n].part = k % 3, map[n].n_parts = 3;
        }
    memset(&map[n], 0, 2 * sizeof map[n]);
    map[n++].model = "head.weight"; /* kept: a fresh head */
    map[n++].model = "head.bias";
    return n;
}

tfm_config bert_tfm_config(const bert_config *bc, int max_len, int max_batch, int n_classes, int inference_only) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = TFM_MODEL_ENCODER_CLASSIFIER;
    c.vocab_size = bc->vocab_size;
    c.type_vocab_size = bc->type_vocab_size;
    c.emb_norm = 1;
    c.n_classes = n_classes > 0 ? n_classes : 1;
    c.d_model = bc->hidden_size;
    c.n_heads = bc->num_attention_heads;
    c.n_layers = bc->num_hidden_layers;
    c.d_ff = bc->intermediate_size;
    c.max_len = max_len;
    c.max_batch = max_batch;
    c.act = TFM_ACT_GELU;
    c.norm_first = 0;
    c.pos = TFM_POS_LEARNED;
    c.pool = TFM_POOL_MEAN;
    c.ln_eps = bc->layer_norm_eps;
    c.dropout = bc->hidden_dropout_prob;
    c.attn_dropout = bc->attention_probs_dropout_prob;
    c.inference_only = inference_only;
    c.seed = 1;
    return c;
}

int bert_open(bert_encoder *e, const char *dir, int max_len, int max_batch, int n_classes, int inference_only) {
    char path[1024];
    tfm_name_map *map;
    char(*names)[96];
    const char *skip[3] = {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"};
    tfm_config c;
    int n;
    tfm_result r;
    memset(e, 0, sizeof *e);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (bert_read_config(path, &e->bc)) return -1;
    if (max_len < 2 || max_len > e->bc.max_position_embeddings || max_batch < 1)
        return bert__fail("bert_open: max_len %d must be in [2, %d] (%s: max_position_embeddings), max_batch %d >= 1", max_len,
                          e->bc.max_position_embeddings, path, max_batch);
    c = bert_tfm_config(&e->bc, max_len, max_batch, n_classes, inference_only);
    if (tfm_model_init(&e->m, &c, NULL, 0) != TFM_OK) return bert__fail("bert_open: %s", tfm_last_error());
    n = 5 + 16 * e->bc.num_hidden_layers + 2;
    map = (tfm_name_map *)malloc((size_t)n * sizeof *map);
    names = (char(*)[96])malloc((size_t)n * 2 * 96);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!map || !names) r = TFM_E_NOMEM;
    else r = tfm_model_load_mapped(&e->m, path, map, bert_name_map(e->bc.num_hidden_layers, e->bc.max_position_embeddings, map, names), skip, 3);
    free(map);
    free(names);
    if (r != TFM_OK) {
        bert__fail("bert_open: %s", r == TFM_E_NOMEM && !tfm_last_error()[0] ? "out of memory" : tfm_last_error());
        tfm_model_free(&e->m);
        return -1;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (wp_load(path, &e->wp) != WP_OK) {
        bert__fail("bert_open: %s", wp_last_error());
        tfm_model_free(&e->m);
        return -1;
    }
    e->max_len = max_len;
    e->max_batch = max_batch;
    e->ids = (int32_t *)malloc((size_t)max_batch * (size_t)(max_len + 1) * sizeof(int32_t));
    if (!e->ids) {
        bert_close(e);
        return bert__fail("bert_open: out of memory");
    }
    e->lens = e->ids + (size_t)max_batch * (size_t)max_len;
    return 0;
}

int bert_batch(bert_encoder *e, const char *const *texts, const size_t *text_lens, int n, tfm_batch *b) {
    int width = 0;
    if (n < 1 || n > e->max_batch) return bert__fail("bert_batch: %d texts, want 1..%d", n, e->max_batch);
    if (wp_encode_batch(e->wp, texts, text_lens, n, e->max_len, e->ids, e->lens, &width) != WP_OK)
        return bert__fail("bert_batch: %s", wp_last_error());
    memset(b, 0, sizeof *b);
    b->batch = n;
    b->len = width;
    b->tokens = e->ids;
    b->lens = e->lens;
    return 0;
}

int bert_embed(bert_encoder *e, const char *const *texts, const size_t *text_lens, int n, float *out) {
    int i, k, C = e->bc.hidden_size, r0, nb;
    tfm_batch b;
    for (r0 = 0; r0 < n; r0 += nb) {
        tfm_tensor p;
        nb = n - r0 < e->max_batch ? n - r0 : e->max_batch;
        if (bert_batch(e, texts + r0, text_lens ? text_lens + r0 : NULL, nb, &b)) return -1;
        if (tfm_model_forward(&e->m, &b, NULL, NULL) != TFM_OK) return bert__fail("bert_embed: %s", tfm_last_error());
        p = tfm_model_pooled(&e->m); /* the mean over each row's tokens, [CLS] and [SEP] included */
        {
            tfm_tensor host = tfm_tensor2(out + (size_t)r0 * C, nb, C);
            if (tfm_tensor_copy(&host, &p) != TFM_OK) return bert__fail("bert_embed: %s", tfm_last_error());
        }
        for (i = r0; i < r0 + nb; i++) { /* sentence-transformers' Normalize: x / max(|x|, 1e-12) */
            double s = 0.0;
            float *v = out + (size_t)i * C;
            for (k = 0; k < C; k++) s += (double)v[k] * v[k];
            s = sqrt(s);
            if (s < 1e-12) s = 1e-12;
            for (k = 0; k < C; k++) v[k] = (float)(v[k] / s);
        }
    }
    return 0;
}

void bert_close(bert_encoder *e) {
    if (e->wp) wp_free(e->wp);
    tfm_model_free(&e->m);
    free(e->ids);
    memset(e, 0, sizeof *e);
}

#endif /* BERT_IMPLEMENTED */
#endif /* BERT_IMPLEMENTATION */
