/* tests/test_safetensors.c - the safetensors layer (tfm__st_*): writer, strict reader, loader.

   - round trips: save then load gives the same bits and the metadata back;
   - the C writer's bytes equal a file written by tools/gen_st_corpus.py (Python's struct and json
     only), and the loader reads that writer's files: the format is checked against an
     independent implementation, not just against itself;
   - interrupted saves (a failure injected at every stage through tfm__st_write_hook, and a real
     "file too large" under RLIMIT_FSIZE in a child process) return TFM_E_IO, leave the previous
     file byte-identical and loadable, and leave no temporary file behind;
   - every file of tests/st_corpus/ gives the code and message its row in stt_corpus_table wants
     (both from the file and from memory), and every prefix of a good file is refused as
     truncated.
   Files are written to a fresh directory under $TMPDIR (or /tmp). The corpus is found under
   $TFM_FIXTURES_ROOT/tests/st_corpus when that is set, else under tests/st_corpus (run from the
   repository root). Included by test_main.c (one TU); everything here is static and prefixed stt_. */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__unix) || (defined(__APPLE__) && defined(__MACH__))
#include <unistd.h>
#if defined(_POSIX_VERSION)
#define STT_POSIX 1
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#endif
#endif

/* ---- helpers -------------------------------------------------------------------------------- */

static char stt_dir[512]; /* scratch directory for written files ("" until set up) */

/* dir/name in one of a few rotating buffers */
static const char *stt_path(const char *name) {
    static char bufs[4][640];
    static int next;
    char *b = bufs[next++ & 3];
    snprintf(b, sizeof bufs[0], "%s/%s", stt_dir, name);
    return b;
}

static const char *stt_corpus(const char *file) {
    static char bufs[2][640];
    static int next;
    char *b = bufs[next++ & 1];
    const char *root = getenv("TFM_FIXTURES_ROOT");
    if (!root || !root[0]) root = ".";
    snprintf(b, sizeof bufs[0], "%s/tests/st_corpus%s%s", root, file ? "/" : "", file ? file : "");
    return b;
}

static void stt_setup_dir(void) {
    if (stt_dir[0]) return;
#if defined(STT_POSIX)
    {
        const char *t = getenv("TMPDIR");
        int k;
        if (!t || !t[0]) t = "/tmp";
        for (k = 0; k < 100; k++) {
            snprintf(stt_dir, sizeof stt_dir, "%s/tfm_stt_%ld_%d", t, (long)getpid(), k);
            if (mkdir(stt_dir, 0700) == 0) return;
        }
        stt_dir[0] = 0;
    }
#endif
    snprintf(stt_dir, sizeof stt_dir, "."); /* no POSIX: the current directory */
}

/* The whole file in a new malloc'd buffer (*size bytes), or NULL. */
static unsigned char *stt_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    unsigned char *b = NULL;
    size_t cap = 0, n = 0;
    *size = 0;
    if (!f) return NULL;
    for (;;) {
        size_t got;
        if (n == cap) {
            unsigned char *nb = (unsigned char *)realloc(b, cap ? cap * 2 : 4096);
            if (!nb) {
                free(b);
                fclose(f);
                return NULL;
            }
            b = nb;
            cap = cap ? cap * 2 : 4096;
        }
        got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    *size = n;
    return b;
}

static int stt_write(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    int ok;
    if (!f) return 0;
    ok = fwrite(p, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    return ok;
}

/* The file at path holds exactly n bytes p. */
static int stt_same(const char *path, const unsigned char *p, size_t n) {
    size_t m;
    unsigned char *b = stt_read(path, &m);
    int same = b && m == n && (n == 0 || memcmp(b, p, n) == 0);
    free(b);
    return same;
}

/* Files in the scratch directory whose names contain ".tmp." (-1 where that cannot be listed). */
static int stt_count_tmp(void) {
#if defined(STT_POSIX)
    DIR *d = opendir(stt_dir);
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

static void stt_remove(const char *name) { remove(stt_path(name)); }

/* The message of the last error minus a leading "prefix: " (or the whole message). */
static const char *stt_msg_after(const char *prefix) {
    const char *m = tfm_last_error();
    size_t n = strlen(prefix);
    if (!strncmp(m, prefix, n) && m[n] == ':' && m[n + 1] == ' ') return m + n + 2;
    return m;
}

/* The loader's entry points, as these tests use them. */
static tfm_result stt_load(const char *path, const tfm__st_tensor *w, int n, tfm__st_header *h) {
    return tfm__st_load(path, NULL, 0, w, n, 0, h);
}
static tfm_result stt_load_mem(const unsigned char *data, size_t size, const tfm__st_tensor *w, int n,
                               tfm__st_header *h) {
    return tfm__st_load(NULL, data, size, w, n, 0, h);
}
static tfm_result stt_read_header(const char *path, tfm__st_header *h) {
    return tfm__st_load(path, NULL, 0, NULL, 0, 1, h);
}
static tfm_result stt_read_header_mem(const unsigned char *data, size_t size, tfm__st_header *h) {
    return tfm__st_load(NULL, data, size, NULL, 0, 1, h);
}
static const tfm__st_entry *stt_find(const tfm__st_header *h, const char *name) {
    int i;
    for (i = 0; i < h->n; i++)
        if (!strcmp(h->entries[i].name, name)) return &h->entries[i];
    return NULL;
}

/* The little-endian u64 at b (a header length). */
static uint64_t stt_u64le(const unsigned char *b) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

/* i * scale + shift: exact in float32 for the small i used here */
static void stt_fill(float *p, int n, float scale, float shift) {
    int i;
    for (i = 0; i < n; i++) p[i] = (float)i * scale + shift;
}

static tfm__st_tensor stt_item(const char *name, const float *data, int ndim, int64_t d0, int64_t d1,
                             int64_t d2, int64_t d3) {
    tfm__st_tensor it;
    memset(&it, 0, sizeof it);
    it.name = name;
    it.data = (float *)data; /* only read by a save */
    it.ndim = ndim;
    it.shape[0] = d0;
    it.shape[1] = d1;
    it.shape[2] = d2;
    it.shape[3] = d3;
    return it;
}

static tfm__st_tensor stt_want(const char *name, float *dest, int ndim, int64_t d0, int64_t d1,
                             int64_t d2, int64_t d3) {
    tfm__st_tensor w;
    memset(&w, 0, sizeof w);
    w.name = name;
    w.data = dest;
    w.ndim = ndim;
    w.shape[0] = d0;
    w.shape[1] = d1;
    w.shape[2] = d2;
    w.shape[3] = d3;
    return w;
}

/* Wants for every tensor of a header, each with its own malloc'd dest (free with stt_free_wants). */
static tfm__st_tensor *stt_wants_for(const tfm__st_header *h) {
    tfm__st_tensor *w = (tfm__st_tensor *)calloc((size_t)(h->n ? h->n : 1), sizeof *w);
    int i;
    for (i = 0; w && i < h->n; i++) {
        const tfm__st_entry *e = &h->entries[i];
        size_t bytes = (size_t)(e->end - e->begin);
        w[i].name = e->name;
        w[i].ndim = e->ndim;
        memcpy(w[i].shape, e->shape, sizeof w[i].shape);
        w[i].data = (float *)malloc(bytes ? bytes : 1);
    }
    return w;
}
static void stt_free_wants(tfm__st_tensor *w, int n) {
    int i;
    for (i = 0; w && i < n; i++) free(w[i].data);
    free(w);
}

/* ok_basic's tensors and metadata, as tools/gen_st_corpus.py writes them */
static float stt_a[6], stt_b[4], stt_c[4];
static const char *const stt_basic_meta[] = {
    "format", "pt", "note", "quote \" backslash \\ newline \n tab \t ctl \x01 end"};
static int stt_basic_items(tfm__st_tensor *it) {
    stt_fill(stt_a, 6, 0.25f, -1.0f);
    stt_fill(stt_b, 4, 0.5f, 3.0f);
    stt_fill(stt_c, 4, -0.125f, 0.0f);
    it[0] = stt_item("a", stt_a, 2, 2, 3, 0, 0);
    it[1] = stt_item("b.weight", stt_b, 1, 4, 0, 0, 0);
    it[2] = stt_item("c", stt_c, 4, 1, 2, 1, 2);
    return 3;
}

/* Load the three basic tensors from path and compare with stt_a/b/c. */
static int stt_load_basic(const char *path) {
    float a[6], b[4], c[4];
    tfm__st_tensor w[3];
    w[0] = stt_want("c", c, 4, 1, 2, 1, 2); /* any order */
    w[1] = stt_want("a", a, 2, 2, 3, 0, 0);
    w[2] = stt_want("b.weight", b, 1, 4, 0, 0, 0);
    if (stt_load(path, w, 3, NULL) != TFM_OK) return 0;
    return !memcmp(a, stt_a, sizeof a) && !memcmp(b, stt_b, sizeof b) && !memcmp(c, stt_c, sizeof c);
}

/* ---- round trips ---------------------------------------------------------------------------- */

static void stt_roundtrip(void) {
    float x[2 * 3 * 4 * 5], y[7], s[1], big[3000];
    float gx[2 * 3 * 4 * 5], gy[7], gs[1], gbig[3000];
    uint32_t bits[7] = {0x7FC00001u, 0xFFC12345u, 0x80000000u, 0x7F800000u,
                        0xFF800000u, 0x00000001u, 0x3F800000u}; /* NaNs, -0, infs, denormal, 1 */
    tfm__st_tensor it[5];
    tfm__st_tensor w[5];
    tfm__st_header h;
    const char *meta[] = {"name", "caf\xc3\xa9 \xf0\x9f\x98\x80", "ctl", "\x01\x1f\"\\/",
                          "empty", ""};
    const char *path;
    unsigned char *file;
    size_t size;
    uint64_t hlen;
    int i;
    stt_setup_dir();
    path = stt_path("rt.safetensors");
    stt_fill(x, 120, 0.001f, -0.06f);
    memcpy(y, bits, sizeof y);
    s[0] = 42.0f;
    stt_fill(big, 3000, 1e-3f, 1e4f);
    it[0] = stt_item("layers.0.weight", x, 4, 2, 3, 4, 5);
    it[1] = stt_item("special", y, 1, 7, 0, 0, 0);
    it[2] = stt_item("scalar", s, 0, 0, 0, 0, 0);
    it[3] = stt_item("empty", NULL, 2, 0, 5, 0, 0);
    it[4] = stt_item("big \"quoted\" \xc3\xa9", big, 2, 1000, 3, 0, 0);
    CHECK_OK(tfm__st_save(path, it, 5, meta, 3));
    CHECK(stt_count_tmp() <= 0);

    /* the bytes: header length a multiple of 8, then the tensors contiguous in the given order */
    file = stt_read(path, &size);
    CHECK(file != NULL);
    if (!file) return;
    hlen = stt_u64le(file);
    CHECK(hlen % 8 == 0);
    CHECK(size == 8 + hlen + sizeof x + sizeof y + sizeof s + sizeof big);
    if (size == 8 + hlen + sizeof x + sizeof y + sizeof s + sizeof big && tfm__st_little_endian()) {
        const unsigned char *d = file + 8 + hlen;
        CHECK(!memcmp(d, x, sizeof x));
        CHECK(!memcmp(d + sizeof x, y, sizeof y));
        CHECK(!memcmp(d + sizeof x + sizeof y, s, sizeof s));
        CHECK(!memcmp(d + sizeof x + sizeof y + sizeof s, big, sizeof big));
        CHECK(file[8 + hlen - 1] == ' ' || file[8 + hlen - 1] == '}');
    }

    /* load: the same bits, the metadata in order */
    w[0] = stt_want("special", gy, 1, 7, 0, 0, 0);
    w[1] = stt_want("empty", NULL, 2, 0, 5, 0, 0);
    w[2] = stt_want("big \"quoted\" \xc3\xa9", gbig, 2, 1000, 3, 0, 0);
    w[3] = stt_want("scalar", gs, 0, 0, 0, 0, 0);
    w[4] = stt_want("layers.0.weight", gx, 4, 2, 3, 4, 5);
    CHECK_OK(stt_load(path, w, 5, &h));
    CHECK(!memcmp(gx, x, sizeof x));
    CHECK(!memcmp(gy, y, sizeof y));
    CHECK(!memcmp(gs, s, sizeof s));
    CHECK(!memcmp(gbig, big, sizeof big));
    CHECK(h.n == 5 && h.n_meta == 3);
    for (i = 0; i < h.n_meta && i < 3; i++) {
        CHECK_MSG(!strcmp(h.meta_kv[2 * i], meta[2 * i]), "meta key %d", i);
        CHECK_MSG(!strcmp(h.meta_kv[2 * i + 1], meta[2 * i + 1]), "meta value %d", i);
    }
    CHECK(tfm__st_meta_get(&h, "name") && !strcmp(tfm__st_meta_get(&h, "name"), meta[1]));
    CHECK(tfm__st_meta_get(&h, "nope") == NULL);
    CHECK(stt_find(&h, "scalar") && stt_find(&h, "scalar")->ndim == 0);
    /* entries in data order, which is the order saved */
    for (i = 0; i < h.n && i < 5; i++) CHECK_MSG(!strcmp(h.entries[i].name, it[i].name), "entry %d", i);
    tfm__st_header_free(&h);
    CHECK(h.entries == NULL && h.n == 0);
    tfm__st_header_free(&h); /* twice is fine */

    /* the same bytes through the memory loader */
    memset(gx, 0, sizeof gx);
    CHECK_OK(stt_load_mem(file, size, w, 5, NULL));
    CHECK(!memcmp(gx, x, sizeof x));

    /* saving again over the file replaces it */
    CHECK_OK(tfm__st_save(path, it, 2, NULL, 0));
    CHECK_ERR(stt_load(path, w, 1, NULL), TFM_E_FORMAT, "unexpected tensor 'layers.0.weight'");
    w[1] = stt_want("layers.0.weight", gx, 4, 2, 3, 4, 5);
    CHECK_OK(stt_load(path, w, 2, NULL));
    /* no tensors at all */
    CHECK_OK(tfm__st_save(path, NULL, 0, NULL, 0));
    CHECK_OK(stt_load(path, NULL, 0, NULL));
    CHECK(stt_count_tmp() <= 0);
    free(file);
    stt_remove("rt.safetensors");
}

/* The C writer against the Python writer: same tensors, same metadata, same bytes. */
static void stt_python_bytes(void) {
    tfm__st_tensor it[3];
    int n = stt_basic_items(it);
    const char *ref = stt_corpus("ok_basic.safetensors"), *mine;
    unsigned char *want;
    size_t size;
    stt_setup_dir();
    mine = stt_path("basic.safetensors");
    want = stt_read(ref, &size);
    CHECK_MSG(want != NULL, "cannot read %s (run from the repository root, or set TFM_FIXTURES_ROOT)",
              ref);
    if (!want) return;
    CHECK_OK(tfm__st_save(mine, it, n, stt_basic_meta, 2));
    CHECK_MSG(stt_same(mine, want, size), "%s differs from %s", mine, ref);
    CHECK_MSG(stt_load_basic(ref), "loading %s: %s", ref, tfm_last_error());
    CHECK_MSG(stt_load_basic(mine), "loading %s: %s", mine, tfm_last_error());
    free(want);
    stt_remove("basic.safetensors");
}

/* The header writer's escaping survives the parser, for every control character and more. */
static void stt_escapes(void) {
    char names[4][48];
    const char *meta[2];
    tfm__st_tensor it[4];
    tfm__st_header h;
    char *json = NULL;
    size_t len = 0;
    int i;
    for (i = 1; i < 32; i++) names[0][i - 1] = (char)i;
    names[0][31] = 0;
    strcpy(names[1], "\"\\/\x7f");
    strcpy(names[2], "\xf4\x8f\xbf\xbf \xe2\x82\xac \xc2\x80 \xed\x9f\xbf"); /* U+10FFFF ... */
    strcpy(names[3], "");
    for (i = 0; i < 4; i++) it[i] = stt_item(names[i], NULL, 1, 0, 0, 0, 0);
    meta[0] = names[0];
    meta[1] = names[1];
    CHECK_OK(tfm__st_header_json(it, 4, meta, 1, &json, &len));
    if (!json) return;
    CHECK(len % 8 == 0);
    CHECK_OK(tfm__st_parse((const unsigned char *)json, len, 8 + len, &h));
    CHECK(h.n == 4 && h.n_meta == 1);
    for (i = 0; i < 4 && i < h.n; i++)
        CHECK_MSG(stt_find(&h, names[i]) != NULL, "name %d lost in the round trip", i);
    if (h.n_meta == 1) {
        CHECK(!strcmp(h.meta_kv[0], names[0]));
        CHECK(!strcmp(h.meta_kv[1], names[1]));
    }
    tfm__st_header_free(&h);
    TFM_FREE(json, NULL);
}

/* ---- valid files from the independent writer ------------------------------------------------ */

static void stt_ok_corpus(void) {
    static const char *const files[] = {"ok_basic", "ok_unicode", "ok_empty", "ok_meta_only",
                                        "ok_zero_size", "ok_unknown_key", "ok_depth_limit"};
    int f, i;
    for (f = 0; f < (int)(sizeof files / sizeof files[0]); f++) {
        char name[64];
        tfm__st_header h, h2;
        tfm__st_tensor *w;
        const char *path;
        snprintf(name, sizeof name, "%s.safetensors", files[f]);
        path = stt_corpus(name);
        if (stt_read_header(path, &h) != TFM_OK) {
            TEST__FAIL("%s: %s", path, tfm_last_error());
            continue;
        }
        w = stt_wants_for(&h);
        CHECK_MSG(stt_load(path, w, h.n, &h2) == TFM_OK, "%s: %s", path, tfm_last_error());
        CHECK(h2.n == h.n && h2.n_meta == h.n_meta);
        if (!strcmp(files[f], "ok_unicode")) {
            const tfm__st_entry *e = stt_find(&h, "\xc3\xa9t\xc3\xa9.\xf0\x9f\x98\x80");
            const char *v = tfm__st_meta_get(&h, "k\xc3\xa9y");
            CHECK(e && e->ndim == 1 && e->shape[0] == 2 && e->begin == 12);
            CHECK(v && !strcmp(v, "v/\xc3\xa9\xf0\x9f\x98\x80" "A"));
            CHECK(h.n == 2 && !strcmp(h.entries[0].name, "plain")); /* data order */
            for (i = 0; i < h.n; i++)
                if (e && w[i].name == e->name) CHECK(w[i].data[0] == 10.0f && w[i].data[1] == 11.0f);
        }
        if (!strcmp(files[f], "ok_zero_size")) {
            const tfm__st_entry *s = stt_find(&h, "s"), *z = stt_find(&h, "z");
            CHECK(s && s->ndim == 0 && z && z->ndim == 2 && z->shape[0] == 0 && z->shape[1] == 3);
            for (i = 0; i < h.n; i++)
                if (s && w[i].name == s->name) CHECK(w[i].data[0] == 7.5f);
        }
        if (!strcmp(files[f], "ok_meta_only")) {
            CHECK(h.n == 0 && h.n_meta == 1 && !strcmp(h.meta_kv[1], "empty model"));
        }
        stt_free_wants(w, h.n);
        tfm__st_header_free(&h);
        tfm__st_header_free(&h2);
    }
}

/* ---- malformed files ------------------------------------------------------------------------ */

/* Each file of tests/st_corpus/ and what loading it must give. */
typedef struct stt_case {
    const char *file;
    tfm_result code;
    const char *substr;
} stt_case;

static const stt_case stt_corpus_table[] = {
    {"ok_basic", TFM_OK, ""},
    {"ok_depth_limit", TFM_OK, ""},
    {"ok_empty", TFM_OK, ""},
    {"ok_meta_only", TFM_OK, ""},
    {"ok_unicode", TFM_OK, ""},
    {"ok_unknown_key", TFM_OK, ""},
    {"ok_zero_size", TFM_OK, ""},
    /* truncated: inside the length, the header, the data */
    {"fmt_trunc_len_0", TFM_E_FORMAT, "truncated: the file has 0 bytes"},
    {"fmt_trunc_len_3", TFM_E_FORMAT, "truncated: the file has 3 bytes"},
    {"fmt_trunc_len_7", TFM_E_FORMAT, "truncated: the file has 7 bytes"},
    {"fmt_trunc_header_0", TFM_E_FORMAT, "truncated: the header length is 88 bytes but only 0"},
    {"fmt_trunc_header_1", TFM_E_FORMAT, "truncated: the header length is 88 bytes but only 1"},
    {"fmt_trunc_header_half", TFM_E_FORMAT, "but only 44 bytes follow"},
    {"fmt_trunc_header_last", TFM_E_FORMAT, "but only 87 bytes follow"},
    {"fmt_trunc_data_0", TFM_E_FORMAT, "[0, 16] go past the end of the data buffer (0 bytes): truncated"},
    {"fmt_trunc_data_half", TFM_E_FORMAT, "(8 bytes): truncated"},
    {"fmt_trunc_data_last", TFM_E_FORMAT, "(15 bytes): truncated"},
    /* the header length */
    {"fmt_hlen_huge", TFM_E_FORMAT, "header length 18446744073709551615 is over the 104857600-byte limit"},
    {"fmt_hlen_over_limit", TFM_E_FORMAT, "header length 104857601 is over"},
    {"fmt_hlen_past_eof", TFM_E_FORMAT, "header length is 9 bytes but only 8 bytes follow"},
    {"fmt_hlen_zero", TFM_E_FORMAT, "the header is empty"},
    {"fmt_hlen_zero_with_data", TFM_E_FORMAT, "the header is empty"},
    /* JSON syntax */
    {"fmt_json_trailing_garbage", TFM_E_FORMAT, "expected only spaces after the header's closing '}' but found 'x'"},
    {"fmt_json_two_roots", TFM_E_FORMAT, "after the header's closing '}' but found '{'"},
    {"fmt_json_trailing_comma", TFM_E_FORMAT, "expected a string but found '}'"},
    {"fmt_json_trailing_comma_array", TFM_E_FORMAT, "shape: expected a non-negative integer but found ']'"},
    {"fmt_json_unterminated_string", TFM_E_FORMAT, "unterminated string"},
    {"fmt_json_unterminated_object", TFM_E_FORMAT, "expected ',' or '}' but found the end of the header"},
    {"fmt_json_missing_colon", TFM_E_FORMAT, "expected ':' but found '{'"},
    {"fmt_json_missing_value", TFM_E_FORMAT, "expected an object"},
    {"fmt_json_single_quotes", TFM_E_FORMAT, "expected a string but found '''"},
    {"fmt_json_unquoted_key", TFM_E_FORMAT, "expected a string but found 't'"},
    {"fmt_json_comment", TFM_E_FORMAT, "expected a string but found '/'"},
    {"fmt_json_bad_escape", TFM_E_FORMAT, "invalid escape: a backslash followed by 'x'"},
    {"fmt_json_bad_unicode_escape", TFM_E_FORMAT, "\\u must be followed by 4 hex digits"},
    {"fmt_json_short_unicode_escape", TFM_E_FORMAT, "\\u must be followed by 4 hex digits"},
    {"fmt_json_lone_high_surrogate", TFM_E_FORMAT, "high surrogate \\uD800 is not followed by a low surrogate"},
    {"fmt_json_lone_low_surrogate", TFM_E_FORMAT, "\\uDC00 is a low surrogate"},
    {"fmt_json_high_then_bmp", TFM_E_FORMAT, "high surrogate \\uD800 is not followed"},
    {"fmt_json_control_char", TFM_E_FORMAT, "control character 0x0a inside a string"},
    {"fmt_json_tab_in_string", TFM_E_FORMAT, "control character 0x09 inside a string"},
    {"fmt_json_nul_in_name", TFM_E_FORMAT, "tensor name 't\\x00x' contains a NUL"},
    {"fmt_json_nul_in_meta", TFM_E_FORMAT, "__metadata__ value 'v\\x00' contains a NUL"},
    {"fmt_json_invalid_utf8", TFM_E_FORMAT, "invalid UTF-8 (byte 0xff)"},
    {"fmt_json_overlong_utf8", TFM_E_FORMAT, "invalid UTF-8 (byte 0xc0)"},
    {"fmt_json_surrogate_utf8", TFM_E_FORMAT, "invalid UTF-8 (byte 0xed)"},
    {"fmt_json_truncated_utf8", TFM_E_FORMAT, "invalid UTF-8 (byte 0xe2)"},
    {"fmt_json_above_max_utf8", TFM_E_FORMAT, "invalid UTF-8 (byte 0xf4)"},
    {"fmt_json_bom", TFM_E_FORMAT, "expected a JSON object but found byte 0xef"},
    {"fmt_json_root_array", TFM_E_FORMAT, "expected a JSON object but found '['"},
    {"fmt_json_root_string", TFM_E_FORMAT, "expected a JSON object but found '\"'"},
    {"fmt_json_root_number", TFM_E_FORMAT, "expected a JSON object but found '1'"},
    {"fmt_json_root_null", TFM_E_FORMAT, "expected a JSON object but found 'n'"},
    {"fmt_json_only_spaces", TFM_E_FORMAT, "expected a JSON object but found the end of the header"},
    {"fmt_json_bad_literal", TFM_E_FORMAT, "expected a value but found 't'"},
    {"fmt_json_nan", TFM_E_FORMAT, "expected a value but found 'N'"},
    {"fmt_json_leading_zero", TFM_E_FORMAT, "number with a leading zero"},
    {"fmt_json_bad_fraction", TFM_E_FORMAT, "expected a digit after '.'"},
    {"fmt_json_bad_exponent", TFM_E_FORMAT, "expected a digit in the exponent"},
    {"fmt_json_lone_minus", TFM_E_FORMAT, "expected a digit but found '}'"},
    {"fmt_json_deep_arrays", TFM_E_FORMAT, "nested more than 16 levels deep"},
    {"fmt_json_deep_objects", TFM_E_FORMAT, "nested more than 16 levels deep"},
    {"fmt_json_depth_limit_plus_one", TFM_E_FORMAT, "nested more than 16 levels deep"},
    /* the schema */
    {"fmt_dtype_f16", TFM_E_FORMAT, "tensor 't': dtype 'F16' is not supported (only F32 is)"},
    {"fmt_dtype_bf16", TFM_E_FORMAT, "dtype 'BF16' is not supported"},
    {"fmt_dtype_f64", TFM_E_FORMAT, "dtype 'F64' is not supported"},
    {"fmt_dtype_i64", TFM_E_FORMAT, "dtype 'I64' is not supported"},
    {"fmt_dtype_lowercase", TFM_E_FORMAT, "dtype 'f32' is not supported"},
    {"fmt_dtype_not_string", TFM_E_FORMAT, "tensor 't': dtype: expected a string but found '3'"},
    {"fmt_dtype_missing", TFM_E_FORMAT, "tensor 't': no \"dtype\""},
    {"fmt_dtype_twice", TFM_E_FORMAT, "\"dtype\" appears twice"},
    {"fmt_shape_missing", TFM_E_FORMAT, "tensor 't': no \"shape\""},
    {"fmt_shape_not_array", TFM_E_FORMAT, "tensor 't': shape: expected an array of integers but found '2'"},
    {"fmt_shape_5d", TFM_E_FORMAT, "shape has more than 4 dims"},
    {"fmt_shape_negative", TFM_E_FORMAT, "shape: expected a non-negative integer but found '-2'"},
    {"fmt_shape_float", TFM_E_FORMAT, "shape: expected a non-negative integer but found '2.0'"},
    {"fmt_shape_exponent", TFM_E_FORMAT, "shape: expected a non-negative integer but found '2e0'"},
    {"fmt_shape_string", TFM_E_FORMAT, "shape: expected a non-negative integer but found '\"'"},
    {"fmt_shape_dim_over_u64", TFM_E_FORMAT, "'18446744073709551616' does not fit in 64 bits"},
    {"fmt_shape_dim_over_i64", TFM_E_FORMAT, "shape dim 0 is 9223372036854775808, more than 2^63 - 1"},
    {"fmt_shape_product_overflow", TFM_E_FORMAT, "shape (4294967296,4294967296,4294967296) F32 needs more than 2^64 - 1 bytes"},
    {"fmt_shape_bytes_overflow", TFM_E_FORMAT, "shape (4611686018427387904) F32 needs more than 2^64 - 1 bytes"},
    {"fmt_shape_huge_wrapping", TFM_E_FORMAT, "shape (4294967296,1073741824) F32 needs more than 2^64 - 1 bytes"},
    {"fmt_offsets_missing", TFM_E_FORMAT, "tensor 't': no \"data_offsets\""},
    {"fmt_offsets_one", TFM_E_FORMAT, "data_offsets must be [begin, end] but has 1 number"},
    {"fmt_offsets_three", TFM_E_FORMAT, "data_offsets must be [begin, end] but has more than 2 numbers"},
    {"fmt_offsets_reversed", TFM_E_FORMAT, "data_offsets [8, 0]: begin is after end"},
    {"fmt_offsets_negative", TFM_E_FORMAT, "data_offsets: expected a non-negative integer but found '-8'"},
    {"fmt_offsets_huge", TFM_E_FORMAT, "data_offsets [18446744073709551608, 18446744073709551615] but shape (2) F32 needs 8 bytes"},
    {"fmt_offsets_size_mismatch", TFM_E_FORMAT, "tensor 'x': data_offsets [0, 100] but shape (5,6) F32 needs 120 bytes"},
    {"fmt_offsets_out_of_bounds", TFM_E_FORMAT, "data_offsets [8, 16] go past the end of the data buffer (8 bytes)"},
    {"fmt_offsets_overlap", TFM_E_FORMAT, "tensors 'a' [0, 8] and 'b' [4, 12] overlap"},
    {"fmt_offsets_same_range", TFM_E_FORMAT, "tensors 'a' [0, 8] and 'b' [0, 8] overlap"},
    {"fmt_offsets_hole", TFM_E_FORMAT, "a 4-byte hole: data bytes [4, 8) belong to no tensor (tensor 'b' starts at 8)"},
    {"fmt_offsets_hole_at_start", TFM_E_FORMAT, "a 4-byte hole: data bytes [0, 4) belong to no tensor (tensor 'a' starts at 4)"},
    {"fmt_offsets_hole_at_end", TFM_E_FORMAT, "the tensors end at data byte 4 but the data buffer has 8 bytes"},
    {"fmt_offsets_no_tensors_but_data", TFM_E_FORMAT, "the tensors end at data byte 0 but the data buffer has 8 bytes"},
    {"fmt_entry_not_object", TFM_E_FORMAT, "tensor 't': expected an object {\"dtype\", \"shape\", \"data_offsets\"} but found '['"},
    {"fmt_entry_string", TFM_E_FORMAT, "tensor 't': expected an object"},
    {"fmt_duplicate_tensor", TFM_E_FORMAT, "tensor 't' appears twice in the header"},
    {"fmt_duplicate_tensor_escaped", TFM_E_FORMAT, "tensor 't' appears twice in the header"},
    {"fmt_meta_not_object", TFM_E_FORMAT, "\"__metadata__\": expected an object of strings but found '['"},
    {"fmt_meta_value_number", TFM_E_FORMAT, "__metadata__ value for 'a': expected a string but found '1'"},
    {"fmt_meta_value_object", TFM_E_FORMAT, "__metadata__ value for 'a': expected a string but found '{'"},
    {"fmt_meta_twice", TFM_E_FORMAT, "\"__metadata__\" appears twice"},
    {"fmt_meta_duplicate_key", TFM_E_FORMAT, "__metadata__ key 'a' appears twice"},
};

/* Load one corpus file fully (header, then every tensor it lists) from disk and from memory:
   the same code both ways, and the same message after the "name: " prefix. */
static void stt_check_case(const stt_case *c) {
    char name[96];
    const char *path;
    unsigned char *bytes;
    size_t size;
    tfm__st_header h;
    tfm_result r, rm;
    char msg[512];
    snprintf(name, sizeof name, "%s.safetensors", c->file);
    path = stt_corpus(name);
    bytes = stt_read(path, &size);
    if (!bytes && c->code != TFM_E_IO) {
        TEST__FAIL("%s: cannot read it", path);
        return;
    }
    tfm_clear_error();
    r = stt_read_header(path, &h);
    if (r == TFM_OK) { /* then the full load, with every tensor wanted */
        tfm__st_tensor *w = stt_wants_for(&h); /* names point into h */
        r = stt_load(path, w, h.n, NULL);
        stt_free_wants(w, h.n);
        tfm__st_header_free(&h);
    }
    CHECK_MSG(r == c->code, "%s: got %d (%s), want %d; message: %s", c->file, (int)r,
              tfm_result_string(r), (int)c->code, tfm_last_error());
    if (c->code != TFM_OK) {
        CHECK_MSG(strstr(tfm_last_error(), c->substr) != NULL, "%s: message \"%s\" lacks \"%s\"",
                  c->file, tfm_last_error(), c->substr);
        CHECK_MSG(!strncmp(tfm_last_error(), path, strlen(path)),
                  "%s: message \"%s\" does not name the file", c->file, tfm_last_error());
    }
    snprintf(msg, sizeof msg, "%s", stt_msg_after(path));
    if (bytes) {
        tfm_clear_error();
        rm = stt_read_header_mem(bytes, size, &h);
        tfm__st_header_free(&h);
        CHECK_MSG(rm == r, "%s: from memory got %d, from the file %d", c->file, (int)rm, (int)r);
        if (rm != TFM_OK)
            CHECK_MSG(!strcmp(stt_msg_after("<memory>"), msg),
                      "%s: from memory \"%s\", from the file \"%s\"", c->file,
                      stt_msg_after("<memory>"), msg);
    }
    free(bytes);
}

static void stt_bad_corpus(void) {
    int i, n = (int)(sizeof stt_corpus_table / sizeof stt_corpus_table[0]);
    for (i = 0; i < n; i++) stt_check_case(&stt_corpus_table[i]);
#if defined(STT_POSIX)
    /* every file of the corpus has a row above */
    {
        DIR *d = opendir(stt_corpus(NULL));
        struct dirent *e;
        int files = 0;
        CHECK_MSG(d != NULL, "cannot list %s", stt_corpus(NULL));
        while (d && (e = readdir(d)) != NULL) {
            size_t len = strlen(e->d_name);
            int found = 0;
            if (e->d_name[0] == '.') continue;
            files++;
            for (i = 0; i < n && !found; i++)
                found = len == strlen(stt_corpus_table[i].file) + 12 &&
                        !strncmp(e->d_name, stt_corpus_table[i].file, len - 12) &&
                        !strcmp(e->d_name + len - 12, ".safetensors");
            CHECK_MSG(found, "%s/%s has no row in stt_corpus_table", stt_corpus(NULL), e->d_name);
        }
        if (d) closedir(d);
        CHECK_MSG(files == n, "%d files in the corpus, %d rows in the table", files, n);
    }
#endif
    /* not there, and not a file */
    CHECK_ERR(stt_load(stt_corpus("no_such_file.safetensors"), NULL, 0, NULL), TFM_E_IO,
              "no_such_file.safetensors: cannot open: ");
    CHECK(strstr(tfm_last_error(), strerror(ENOENT)) != NULL);
    {
        tfm__st_header h;
        tfm_result r = stt_read_header(stt_corpus(NULL), &h);
        CHECK_MSG(r == TFM_E_IO || r == TFM_E_FORMAT, "a directory: %d (%s)", (int)r,
                  tfm_last_error());
        CHECK(h.n == 0 && h.entries == NULL);
    }
}

/* Every prefix of a good file, and the file with a byte more, are refused as malformed. */
static void stt_truncations(void) {
    size_t size, len;
    unsigned char *file = stt_read(stt_corpus("ok_basic.safetensors"), &size), *more;
    float a[6], b[4], c[4];
    tfm__st_tensor w[3];
    int bad = 0;
    CHECK(file != NULL);
    if (!file) return;
    stt_setup_dir();
    w[0] = stt_want("a", a, 2, 2, 3, 0, 0);
    w[1] = stt_want("b.weight", b, 1, 4, 0, 0, 0);
    w[2] = stt_want("c", c, 4, 1, 2, 1, 2);
    CHECK_OK(stt_load_mem(file, size, w, 3, NULL));
    for (len = 0; len < size; len++) {
        tfm_result r;
        tfm_clear_error();
        r = stt_load_mem(file, len, w, 3, NULL);
        if (r != TFM_E_FORMAT || !strstr(tfm_last_error(), "truncated")) {
            if (bad++ < 5)
                TEST__FAIL("%zu of %zu bytes: got %d: %s", len, size, (int)r, tfm_last_error());
        }
        /* and from disk, at every region boundary and a few points between */
        if (len < 12 || len % 37 == 0 || len + 3 > size) {
            const char *p = stt_path("trunc.safetensors");
            CHECK(stt_write(p, file, len));
            r = stt_load(p, w, 3, NULL);
            if (r != TFM_E_FORMAT || !strstr(tfm_last_error(), "truncated"))
                if (bad++ < 5)
                    TEST__FAIL("file of %zu bytes: got %d: %s", len, (int)r, tfm_last_error());
        }
    }
    more = (unsigned char *)malloc(size + 1);
    if (more) {
        memcpy(more, file, size);
        more[size] = 0;
        CHECK_ERR(stt_load_mem(more, size + 1, w, 3, NULL), TFM_E_FORMAT,
                  "1 bytes at its end belong to no tensor");
        free(more);
    }
    free(file);
    stt_remove("trunc.safetensors");
}

/* tfm__st_parse directly: syntax the corpus does not spell out. */
static void stt_parse(void) {
    static const struct {
        const char *json;
        uint64_t data;
        tfm_result code;
        const char *substr;
    } cases[] = {
        {" \t\r\n{ \t\r\n} \t\r\n", 0, TFM_OK, ""},
        {"{\"t\" : { \"dtype\" : \"F32\" , \"shape\" : [ 1 , 2 ] , \"data_offsets\" : [ 0 , 8 ] } }", 8, TFM_OK, ""},
        {"{\"t\":{\"dtype\":\"\\u0046\\u0033\\u0032\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, TFM_OK, ""},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":[-0,0.5e-3,1E+2,-1.25,true,false,null,\"\\b\\f\\n\\r\\t\\/\\\\\\\"\"]}}", 4, TFM_OK, ""},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":{}}}", 4, TFM_OK, ""},
        {"{\"__metadata__\":{}}", 0, TFM_OK, ""},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},\"u\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, TFM_OK, ""},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"u\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 4, TFM_OK, ""},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"u\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, TFM_E_FORMAT, "overlap"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":\"\\u00\"}}", 4, TFM_E_FORMAT, "4 hex digits"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":\"\\ud83d\\u0041\"}}", 4, TFM_E_FORMAT, "high surrogate"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":01}}", 4, TFM_E_FORMAT, "leading zero"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":+1}}", 4, TFM_E_FORMAT, "expected a value but found '+'"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":.5}}", 4, TFM_E_FORMAT, "expected a value but found '.'"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":[1 2]}}", 4, TFM_E_FORMAT, "expected ',' or ']' but found '2'"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":{\"a\" 1}}}", 4, TFM_E_FORMAT, "expected ':' but found '1'"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]} \"u\":1}", 4, TFM_E_FORMAT, "expected ',' or '}' but found '\"'"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],}}", 4, TFM_E_FORMAT, "expected a string but found '}'"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}\x00", 4, TFM_E_FORMAT, "but found byte 0x00"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1],\"data_offsets\":[0,4]}}", 4, TFM_OK, ""},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, TFM_E_FORMAT, "more than 4 dims"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[0,18446744073709551615],\"data_offsets\":[0,0]}}", 0, TFM_E_FORMAT, "more than 2^63 - 1"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[0,9223372036854775807],\"data_offsets\":[0,0]}}", 0, TFM_OK, ""},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, TFM_E_FORMAT, "go past the end of the data buffer (4 bytes)"},
    };
    int i, n = (int)(sizeof cases / sizeof cases[0]);
    for (i = 0; i < n; i++) {
        tfm__st_header h;
        size_t len = strlen(cases[i].json);
        tfm_result r;
        if (strstr(cases[i].substr, "byte 0x00")) len++; /* that one ends in a NUL byte */
        tfm_clear_error();
        r = tfm__st_parse((const unsigned char *)cases[i].json, len, 8 + len + cases[i].data, &h);
        CHECK_MSG(r == cases[i].code, "case %d: got %d, want %d: %s", i, (int)r,
                  (int)cases[i].code, tfm_last_error());
        if (r != TFM_OK)
            CHECK_MSG(strstr(tfm_last_error(), cases[i].substr) != NULL,
                      "case %d: message \"%s\" lacks \"%s\"", i, tfm_last_error(),
                      cases[i].substr);
        if (r != TFM_OK) CHECK(h.entries == NULL && h.strings == NULL && h.n == 0);
        tfm__st_header_free(&h);
    }
    /* (the header length against the limit and the file's size is the reader's check, before it
       reads the header: fmt_hlen_* in the corpus) */
}

/* More tensors than the cap: refused, with memory bounded by the header's size. */
static void stt_too_many(void) {
    const int n = TFM__ST_MAX_ITEMS + 1;
    size_t cap = (size_t)n * 64 + 16, len = 0;
    char *json = (char *)malloc(cap);
    tfm__st_header h;
    int i;
    if (!json) return;
    json[len++] = '{';
    for (i = 0; i < n; i++)
        len += (size_t)snprintf(json + len, cap - len,
                                "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                                i ? "," : "", i);
    json[len++] = '}';
    CHECK_ERR(tfm__st_parse((const unsigned char *)json, len, 8 + len, &h), TFM_E_FORMAT,
              "more than 100000 tensors");
    /* the same many metadata entries */
    len = 0;
    len += (size_t)snprintf(json, cap, "{\"__metadata__\":{");
    for (i = 0; i < n; i++)
        len += (size_t)snprintf(json + len, cap - len, "%s\"k%d\":\"\"", i ? "," : "", i);
    len += (size_t)snprintf(json + len, cap - len, "}}");
    CHECK_ERR(tfm__st_parse((const unsigned char *)json, len, 8 + len, &h), TFM_E_FORMAT,
              "__metadata__ has more than 100000 entries");
    free(json);
}

/* ---- the loader's checks of what is wanted -------------------------------------------------- */

static void stt_load_errors(void) {
    const char *path = stt_corpus("ok_basic.safetensors");
    float a[6], b[4], c[4], extra[2];
    tfm__st_tensor w[4];
    tfm__st_header h;
    int i;
    w[0] = stt_want("a", a, 2, 2, 3, 0, 0);
    w[1] = stt_want("b.weight", b, 1, 4, 0, 0, 0);
    w[2] = stt_want("c", c, 4, 1, 2, 1, 2);
    w[3] = stt_want("missing", extra, 1, 2, 0, 0, 0);
    for (i = 0; i < 6; i++) a[i] = 1234.5f;
    /* a wanted tensor that is not there; nothing written, header zeroed */
    h.n = 99;
    CHECK_ERR(stt_load(path, w, 4, &h), TFM_E_FORMAT,
              "tensor 'missing' not found (the file has 3 tensors)");
    CHECK(h.n == 0 && h.entries == NULL);
    CHECK(a[0] == 1234.5f && a[5] == 1234.5f);
    /* a tensor in the file that is not wanted */
    CHECK_ERR(stt_load(path, w, 2, NULL), TFM_E_FORMAT,
              "unexpected tensor 'c' in the file (it has 3 tensors, 2 are wanted)");
    CHECK(a[0] == 1234.5f);
    /* shape mismatch: both shapes named */
    w[0] = stt_want("a", a, 2, 3, 2, 0, 0);
    CHECK_ERR(stt_load(path, w, 3, NULL), TFM_E_FORMAT,
              "tensor 'a' is (2,3) in the file but (3,2) is wanted");
    w[0] = stt_want("a", a, 1, 6, 0, 0, 0);
    CHECK_ERR(stt_load(path, w, 3, NULL), TFM_E_FORMAT, "is (2,3) in the file but (6) is wanted");
    CHECK(a[0] == 1234.5f);
    w[0] = stt_want("a", a, 2, 2, 3, 0, 0);
    /* (the wants themselves are the caller's to get right: tfm_model_load builds them from the model) */
    /* all good after all that */
    CHECK_OK(stt_load(path, w, 3, &h));
    CHECK(h.n == 3);
    tfm__st_header_free(&h);
    CHECK(a[0] == -1.0f && a[5] == 0.25f);
    CHECK_ERR(stt_load_mem(NULL, 0, NULL, 0, NULL), TFM_E_FORMAT, "<memory>: truncated");
}

/* ---- saving: bad arguments ------------------------------------------------------------------ */

static void stt_save_args(void) {
    float d[4] = {1, 2, 3, 4};
    tfm__st_tensor it[2];
    const char *meta[4] = {"k", "v", "k", "w"};
    const char *path;
    stt_setup_dir();
    path = stt_path("args.safetensors");
    remove(path);
    it[0] = stt_item("x", d, 1, 4, 0, 0, 0);
    it[1] = stt_item("x", d, 1, 4, 0, 0, 0);
    CHECK_ERR(tfm__st_save(path, it, 2, NULL, 0), TFM_E_ARG, "two tensors are named 'x'");
    CHECK_ERR(tfm__st_save(path, it, 1, meta, 2), TFM_E_ARG, "metadata key 'k' appears twice");
    it[1] = stt_item("__metadata__", d, 1, 4, 0, 0, 0);
    CHECK_ERR(tfm__st_save(path, it, 2, NULL, 0), TFM_E_ARG, "is reserved or not valid UTF-8");
    it[1] = stt_item("bad \xff utf8", d, 1, 4, 0, 0, 0);
    CHECK_ERR(tfm__st_save(path, it, 2, NULL, 0), TFM_E_ARG, "is reserved or not valid UTF-8");
    /* (the shapes and data pointers are the caller's to get right: tfm_model_save takes them from the
       model; what comes from users, the metadata, is checked) */
    meta[1] = "\xc0\x80";
    CHECK_ERR(tfm__st_save(path, it, 1, meta, 1), TFM_E_ARG, "metadata value '\xc0\x80' is not valid UTF-8");
    CHECK_ERR(tfm__st_save(NULL, it, 1, NULL, 0), TFM_E_ARG, "path is NULL");
    CHECK_ERR(tfm__st_save("", it, 1, NULL, 0), TFM_E_ARG, "path is NULL or empty");
    {
        size_t m;
        unsigned char *b = stt_read(path, &m);
        CHECK_MSG(b == NULL, "a refused save created %s", path);
        free(b);
    }
    /* zero-size tensors need no data */
    it[1] = stt_item("y", NULL, 2, 3, 0, 0, 0);
    CHECK_OK(tfm__st_save(path, it, 2, NULL, 0));
    stt_remove("args.safetensors");
}

/* ---- saving: interrupted at every stage ----------------------------------------------------- */

static int stt_hook_stage = -1, stt_hook_nth = 0, stt_hook_errno = 0;
static int stt_hook_seen[TFM__ST_STAGE_COUNT];

static int stt_hook(int stage) {
    int k;
    if (stage < 0 || stage >= TFM__ST_STAGE_COUNT) return EINVAL;
    k = stt_hook_seen[stage]++;
    return stage == stt_hook_stage && k == stt_hook_nth ? stt_hook_errno : 0;
}

static void stt_hook_arm(int stage, int nth, int err) {
    memset(stt_hook_seen, 0, sizeof stt_hook_seen);
    stt_hook_stage = stage;
    stt_hook_nth = nth;
    stt_hook_errno = err;
    tfm__st_write_hook = stt_hook;
}

static void stt_interrupted(void) {
    static const char *const stage_names[] = {"creating", "writing", "flushing", "syncing",
                                              "closing", "renaming", "directory"};
    static float big[5000], small[10];
    tfm__st_tensor old_items[3], new_items[3];
    const char *meta[2] = {"version", "new"};
    const char *path;
    unsigned char *old;
    size_t old_size;
    int stage, nth, expect[TFM__ST_STAGE_COUNT], errs[2] = {ENOSPC, EIO}, k;
    stt_setup_dir();
    path = stt_path("atomic.safetensors");
    stt_basic_items(old_items);
    stt_fill(big, 5000, 0.5f, 1.0f);
    stt_fill(small, 10, 2.0f, -3.0f);
    new_items[0] = stt_item("big", big, 2, 50, 100, 0, 0);
    new_items[1] = stt_item("small", small, 1, 10, 0, 0, 0);
    new_items[2] = stt_item("none", NULL, 1, 0, 0, 0, 0);

    /* a normal save visits each stage this often */
    stt_hook_arm(-1, 0, 0);
    CHECK_OK(tfm__st_save(path, new_items, 3, meta, 1));
    expect[TFM__ST_STAGE_OPEN] = 1;
    expect[TFM__ST_STAGE_WRITE] = 2 + 3; /* length, header, one per tensor */
    expect[TFM__ST_STAGE_FLUSH] = 1;
    expect[TFM__ST_STAGE_SYNC] = 1;
    expect[TFM__ST_STAGE_CLOSE] = 1;
    expect[TFM__ST_STAGE_RENAME] = 1;
    expect[TFM__ST_STAGE_SYNCDIR] = 1;
    expect[TFM__ST_STAGE_READ] = 0; /* a save reads nothing */
    for (stage = 0; stage < TFM__ST_STAGE_COUNT; stage++)
        CHECK_MSG(stt_hook_seen[stage] == expect[stage], "stage %d seen %d times, want %d", stage,
                  stt_hook_seen[stage], expect[stage]);

    for (stage = 0; stage < TFM__ST_STAGE_COUNT; stage++) {
        for (nth = 0; nth < expect[stage]; nth++) {
            int err = errs[(stage + nth) % 2];
            tfm_result r;
            tfm__st_write_hook = NULL;
            CHECK_OK(tfm__st_save(path, old_items, 3, stt_basic_meta, 2));
            old = stt_read(path, &old_size);
            CHECK(old != NULL);
            if (!old) continue;
            stt_hook_arm(stage, nth, err);
            tfm_clear_error();
            r = tfm__st_save(path, new_items, 3, meta, 1);
            tfm__st_write_hook = NULL;
            CHECK_MSG(r == TFM_E_IO, "stage %d #%d: got %d: %s", stage, nth, (int)r,
                      tfm_last_error());
            CHECK_MSG(strstr(tfm_last_error(), path) == tfm_last_error(),
                      "stage %d #%d: message does not start with the path: %s", stage, nth,
                      tfm_last_error());
            CHECK_MSG(strstr(tfm_last_error(), strerror(err)) != NULL,
                      "stage %d #%d: message lacks \"%s\": %s", stage, nth, strerror(err),
                      tfm_last_error());
            CHECK_MSG(strstr(tfm_last_error(), stage_names[stage]) != NULL,
                      "stage %d #%d: message does not name the step (%s): %s", stage, nth,
                      stage_names[stage], tfm_last_error());
            CHECK_MSG(stt_count_tmp() <= 0, "stage %d #%d: a temporary file was left", stage, nth);
            if (stage != TFM__ST_STAGE_SYNCDIR) {
                CHECK_MSG(strstr(tfm_last_error(), "is unchanged") != NULL,
                          "stage %d #%d: %s", stage, nth, tfm_last_error());
                CHECK_MSG(stt_same(path, old, old_size), "stage %d #%d: the old file changed",
                          stage, nth);
                CHECK_MSG(stt_load_basic(path), "stage %d #%d: the old file does not load: %s",
                          stage, nth, tfm_last_error());
            } else { /* only the durability of the rename is in doubt: the new file is there */
                float gbig[5000], gsmall[10];
                tfm__st_tensor w[3];
                w[0] = stt_want("big", gbig, 2, 50, 100, 0, 0);
                w[1] = stt_want("small", gsmall, 1, 10, 0, 0, 0);
                w[2] = stt_want("none", NULL, 1, 0, 0, 0, 0);
                CHECK(strstr(tfm_last_error(), "the file was replaced") != NULL);
                CHECK_OK(stt_load(path, w, 3, NULL));
                CHECK(!memcmp(gbig, big, sizeof big) && !memcmp(gsmall, small, sizeof small));
            }
            free(old);
        }
    }
    /* with no previous file, a failed save leaves none */
    for (k = TFM__ST_STAGE_OPEN; k <= TFM__ST_STAGE_RENAME; k++) {
        size_t m;
        unsigned char *b;
        remove(path);
        stt_hook_arm(k, 0, EIO);
        CHECK(tfm__st_save(path, new_items, 3, meta, 1) == TFM_E_IO);
        tfm__st_write_hook = NULL;
        b = stt_read(path, &m);
        CHECK_MSG(b == NULL, "stage %d: a failed save created the file", k);
        free(b);
        CHECK(stt_count_tmp() <= 0);
    }
    tfm__st_write_hook = NULL;
    stt_remove("atomic.safetensors");
}

/* Real failures from the system, not injected ones. */
static void stt_real_failures(void) {
#if defined(STT_POSIX)
    float d[2] = {1, 2};
    tfm__st_tensor it[1];
    const char *dirpath;
    char nodir[700];
    stt_setup_dir();
    it[0] = stt_item("x", d, 1, 2, 0, 0, 0);
    /* the directory does not exist */
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.safetensors", stt_dir);
    CHECK_ERR(tfm__st_save(nodir, it, 1, NULL, 0), TFM_E_IO, "cannot save: creating the temporary");
    CHECK(strstr(tfm_last_error(), strerror(ENOENT)) != NULL);
    /* the target is a directory: the rename fails, the directory stays, no temporary remains */
    dirpath = stt_path("a_directory");
    CHECK(mkdir(dirpath, 0700) == 0);
    CHECK_ERR(tfm__st_save(dirpath, it, 1, NULL, 0), TFM_E_IO, "cannot save: renaming");
    {
        struct stat st;
        CHECK(stat(dirpath, &st) == 0 && S_ISDIR(st.st_mode));
    }
    CHECK(stt_count_tmp() == 0);
    CHECK_ERR(stt_load(dirpath, NULL, 0, NULL), TFM_E_IO, dirpath);
    rmdir(dirpath);
    /* a relative path with no directory part */
    {
        char cwd_file[64];
        snprintf(cwd_file, sizeof cwd_file, "tfm_stt_%ld.safetensors", (long)getpid());
        CHECK_OK(tfm__st_save(cwd_file, it, 1, NULL, 0));
        CHECK_ERR(stt_load(cwd_file, NULL, 0, NULL), TFM_E_FORMAT, "unexpected tensor 'x'");
        remove(cwd_file);
    }
#endif
}

/* A full disk for real: RLIMIT_FSIZE in a child process makes write(2) fail with EFBIG (SIGXFSZ
   ignored). The child reports through its exit status; the parent checks the files again. */
static void stt_rlimit(void) {
#if defined(STT_POSIX) && defined(RLIMIT_FSIZE) && defined(SIGXFSZ)
    static float big[64 * 1024];
    tfm__st_tensor old_items[3], new_items[1];
    const char *path;
    unsigned char *old;
    size_t old_size;
    int limit_i;
    const long limits[2] = {64 * 1024, 40}; /* inside the data; inside the header */
    stt_setup_dir();
    path = stt_path("fsize.safetensors");
    stt_basic_items(old_items);
    stt_fill(big, 64 * 1024, 1.0f, 0.0f);
    new_items[0] = stt_item("big", big, 2, 256, 256, 0, 0);
    CHECK_OK(tfm__st_save(path, old_items, 3, stt_basic_meta, 2));
    old = stt_read(path, &old_size);
    CHECK(old != NULL);
    if (!old) return;
    fflush(stdout);
    fflush(stderr);
    tfm_scratch_release(); /* the OpenMP threads' scratch would have no owner in the child */
    for (limit_i = 0; limit_i < 2; limit_i++) {
        int status = 0;
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid < 0) break;
        if (pid == 0) {
            struct rlimit rl;
            tfm_result r;
            int code = 0;
            signal(SIGXFSZ, SIG_IGN);
            rl.rlim_cur = rl.rlim_max = (rlim_t)limits[limit_i];
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(10);
            r = tfm__st_save(path, new_items, 1, NULL, 0);
            if (r != TFM_E_IO) code = 11;
            else if (!strstr(tfm_last_error(), strerror(EFBIG))) code = 12;
            else if (!strstr(tfm_last_error(), "writing")) code = 13;
            else if (!stt_same(path, old, old_size)) code = 14;
            else if (stt_count_tmp() != 0) code = 15;
            else if (!stt_load_basic(path)) code = 16;
            free(old); /* _exit skips the parent's cleanup: leak checkers look at the child too */
            _exit(code);
        }
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "limit %ld: the child failed (status %d, exit %d; 11: not TFM_E_IO, 12: no "
                  "EFBIG text, 13: no step, 14: old file changed, 15: temp left, 16: old file "
                  "does not load)",
                  limits[limit_i], status, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        CHECK(stt_same(path, old, old_size));
        CHECK(stt_count_tmp() == 0);
        CHECK(stt_load_basic(path));
    }
    free(old);
    stt_remove("fsize.safetensors");
#endif
}

static void stt_byteswap(void) {
    unsigned char b[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    tfm__st_bswap32(b, 2);
    CHECK(b[0] == 4 && b[1] == 3 && b[2] == 2 && b[3] == 1 && b[4] == 8 && b[7] == 5);
}

static void stt_cleanup(void) {
#if defined(STT_POSIX)
    if (stt_dir[0] && strcmp(stt_dir, ".") != 0) rmdir(stt_dir);
#endif
}

static void suite_safetensors(void) {
    RUN(stt_byteswap);
    RUN(stt_roundtrip);
    RUN(stt_python_bytes);
    RUN(stt_escapes);
    RUN(stt_ok_corpus);
    RUN(stt_bad_corpus);
    RUN(stt_truncations);
    RUN(stt_parse);
    RUN(stt_too_many);
    RUN(stt_load_errors);
    RUN(stt_save_args);
    RUN(stt_interrupted);
    RUN(stt_real_failures);
    RUN(stt_rlimit);
    stt_cleanup();
}
