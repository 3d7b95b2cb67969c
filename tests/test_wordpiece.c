/* tests/test_wordpiece.c - examples/wordpiece.h, the WordPiece tokenizer of the examples, against
   Hugging Face's real tokenizer of all-MiniLM-L6-v2.

   1. Exactness: every string of tests/fixtures/wordpiece/minilm_cases.txt (written by
      tools/gen_wordpiece_fixture.py: KJV verses, SpamAssassin subjects and bodies, CMUdict words,
      hand-made edge cases, sweeps over every code point the normalizer treats specially) tokenizes
      to exactly the ids Hugging Face gave, with tests/fixtures/wordpiece/tokenizer.json (the model's
      own, Apache-2.0) and max_len 256. The first mismatches are shown: the string and both id lists.
      The same vocabulary written out as a vocab.txt loads and gives the same ids.
   2. Truncation at every max_len from 2 to 300 keeps a prefix of the pieces and ends with [SEP];
      batches are the single encodings, padded with [PAD] to the longest row.
   3. The UTF-8 decoder replaces invalid bytes exactly as Python's errors="replace" does; the
      Unicode tables answer the cases where Hugging Face departs from unicodedata as Hugging Face.
   4. Errors: a missing file, a directory, truncated, garbage and hostile JSON (deep nesting, huge
      or duplicate ids, bad escapes, invalid UTF-8, unsupported settings), vocabularies without
      [UNK], [CLS] or [SEP], bad arguments: each is the right code with a message naming the function,
      the file and what is wrong.
   5. Robustness: random bytes and every truncation of multi-byte text through wp_encode under
      every normalisation setting, and byte-mutated or truncated tokenizer.json files through
      wp_load_memory, never crash and keep the output's invariants (run it under make asan).

   Include it from tests/test_main.c (one translation unit). It defines WORDPIECE_IMPLEMENTATION
   unless something included before it did; wordpiece.h compiles its implementation once per
   translation unit however often it is included, so another suite may include it (with or without
   the define) before or after this one. Everything here is static and prefixed wpt_. Run from the
   repository root (or set TFM_FIXTURES to the fixture directory). */

#ifndef WORDPIECE_IMPLEMENTATION
#define WORDPIECE_IMPLEMENTATION
#endif
#include "../examples/wordpiece.h"
#include "fixture.h" /* fx_dir() */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WPT_MAX_LEN 256

/* a pointer that is not NULL, to see a failed load set *out to NULL */
static char wpt_dummy;
#define WPT_NOT_NULL ((wp_tokenizer *)(void *)&wpt_dummy)

/* expr returns WP_OK */
#define WPT_OK(expr)                                                      \
    do {                                                                  \
        wp_result wpt__r = (expr);                                        \
        if (wpt__r != WP_OK)                                              \
            TEST__FAIL("%s returned %d (%s): %s", #expr, (int)wpt__r,     \
                       wp_result_string(wpt__r), wp_last_error());        \
    } while (0)

/* expr returns `code` and wp_last_error() contains `substr` */
#define WPT_ERR(expr, code, substr)                                       \
    do {                                                                  \
        wp_result wpt__r;                                                 \
        wp_clear_error();                                                 \
        wpt__r = (expr);                                                  \
        if (wpt__r != (code))                                             \
            TEST__FAIL("%s returned %d, want %d (%s); message: %s", #expr, \
                       (int)wpt__r, (int)(code), #code, wp_last_error()); \
        else if (!strstr(wp_last_error(), (substr)))                      \
            TEST__FAIL("%s: message \"%s\" lacks \"%s\"", #expr,          \
                       wp_last_error(), (substr));                        \
    } while (0)

/* ---- helpers -------------------------------------------------------------------------------- */

/* The whole file in a new malloc'd buffer (*size bytes, plus a NUL), or NULL. */
static char *wpt_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    char *b = NULL;
    size_t cap = 0, n = 0;
    if (!f) return NULL;
    for (;;) {
        size_t got;
        if (cap - n < 2) {
            char *nb = (char *)realloc(b, cap ? cap * 2 : 1 << 16);
            if (!nb) {
                free(b);
                fclose(f);
                return NULL;
            }
            b = nb;
            cap = cap ? cap * 2 : 1 << 16;
        }
        got = fread(b + n, 1, cap - n - 1, f);
        n += got;
        if (!got) break;
    }
    fclose(f);
    b[n] = 0;
    *size = n;
    return b;
}

static const char *wpt_path(const char *file) {
    static char bufs[2][600];
    static int next;
    char *b = bufs[next++ & 1];
    snprintf(b, sizeof bufs[0], "%s/wordpiece/%s", fx_dir(), file);
    return b;
}

/* One fixture case: its source, its bytes, the ids Hugging Face gave. */
typedef struct wpt_case {
    char source[24];
    char *text;
    size_t len;
    int32_t *ids;
    int n_ids;
} wpt_case;

typedef struct wpt_fixture {
    wpt_case *cases;
    int n;
    char *mem; /* the file; case texts are decoded in place */
} wpt_fixture;

static void wpt_fixture_free(wpt_fixture *fx) {
    int i;
    for (i = 0; i < fx->n; i++) free(fx->cases[i].ids);
    free(fx->cases);
    free(fx->mem);
    memset(fx, 0, sizeof *fx);
}

static int wpt_hex(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Reads minilm_cases.txt (format: tools/gen_wordpiece_fixture.py). 0 and a FAIL on any problem. */
static int wpt_fixture_load(wpt_fixture *fx) {
    size_t size, cap = 0;
    char *p, *end;
    memset(fx, 0, sizeof *fx);
    fx->mem = wpt_read(wpt_path("minilm_cases.txt"), &size);
    if (!fx->mem) {
        TEST__FAIL("%s: cannot read (run from the repository root, or set TFM_FIXTURES; regenerate with "
                   "tools/gen_wordpiece_fixture.py)", wpt_path("minilm_cases.txt"));
        return 0;
    }
    p = fx->mem;
    end = fx->mem + size;
    while (p < end && *p == '#') p = strchr(p, '\n') ? strchr(p, '\n') + 1 : end;
    while (p < end) {
        char *tab = strchr(p, '\t'), *nl, *idl, *q, *w;
        wpt_case *c;
        int k = 0;
        nl = tab ? strchr(tab, '\n') : NULL;
        if (!tab || !nl || (size_t)(tab - p) >= sizeof c->source) {
            TEST__FAIL("minilm_cases.txt: malformed case line after %d cases", fx->n);
            return 0;
        }
        if ((size_t)fx->n == cap) {
            wpt_case *nc = (wpt_case *)realloc(fx->cases, (cap = cap ? 2 * cap : 1024) * sizeof *nc);
            if (!nc) return 0;
            fx->cases = nc;
        }
        c = &fx->cases[fx->n];
        memset(c, 0, sizeof *c);
        memcpy(c->source, p, (size_t)(tab - p));
        /* unescape in place: the decoded text is never longer */
        for (q = w = tab + 1; q < nl;) {
            if (*q == '\\' && q + 1 < nl && q[1] == '\\') {
                *w++ = '\\';
                q += 2;
            } else if (*q == '\\' && q + 3 < nl && q[1] == 'x' && wpt_hex(q[2]) >= 0 && wpt_hex(q[3]) >= 0) {
                *w++ = (char)(wpt_hex(q[2]) * 16 + wpt_hex(q[3]));
                q += 4;
            } else {
                *w++ = *q++;
            }
        }
        c->text = tab + 1;
        c->len = (size_t)(w - c->text);
        idl = nl + 1;
        nl = strchr(idl, '\n');
        if (!nl) {
            TEST__FAIL("minilm_cases.txt: case %d has no id line", fx->n);
            return 0;
        }
        c->ids = (int32_t *)malloc(WPT_MAX_LEN * sizeof(int32_t));
        if (!c->ids) return 0;
        for (q = idl; q < nl;) {
            char *e;
            long v = strtol(q, &e, 10);
            if (e == q || k == WPT_MAX_LEN) {
                TEST__FAIL("minilm_cases.txt: case %d: bad id line", fx->n);
                free(c->ids);
                return 0;
            }
            c->ids[k++] = (int32_t)v;
            q = e;
            while (q < nl && *q == ' ') q++;
        }
        c->n_ids = k;
        fx->n++;
        p = nl + 1;
    }
    return 1;
}

static wp_tokenizer *wpt_minilm(void) {
    wp_tokenizer *wp = NULL;
    wp_result r = wp_load(wpt_path("tokenizer.json"), &wp);
    if (r != WP_OK) TEST__FAIL("wp_load: %s", wp_last_error());
    return wp;
}

/* The string shown in a failure: escaped, at most 160 bytes. */
static const char *wpt_show(const char *s, size_t n) {
    static char buf[700];
    size_t i, k = 0;
    for (i = 0; i < n && k < sizeof buf - 8; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= 160) {
            k += (size_t)snprintf(buf + k, sizeof buf - k, "...");
            break;
        }
        if (c < 0x20 || c == 0x7F || c == '\\') k += (size_t)snprintf(buf + k, sizeof buf - k, "\\x%02X", c);
        else buf[k++] = (char)c;
    }
    buf[k] = 0;
    return buf;
}

static void wpt_print_ids(const char *what, const int32_t *ids, int n) {
    int i;
    printf("        %s (%d):", what, n);
    for (i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

/* Every case through wp_encode: how many agree; the first few that do not are shown. */
static int wpt_check_all(const wp_tokenizer *wp, const wpt_fixture *fx, const char *what) {
    int i, same = 0, shown = 0;
    int32_t ids[WPT_MAX_LEN];
    for (i = 0; i < fx->n; i++) {
        const wpt_case *c = &fx->cases[i];
        int n = -1;
        wp_result r = wp_encode(wp, c->text, c->len, WPT_MAX_LEN, ids, &n);
        if (r == WP_OK && n == c->n_ids && !memcmp(ids, c->ids, (size_t)n * sizeof *ids)) {
            same++;
            continue;
        }
        if (shown++ < 5) {
            TEST__FAIL("%s: case %d (%s) differs from Hugging Face: \"%s\"", what, i, c->source, wpt_show(c->text, c->len));
            wpt_print_ids("wordpiece.h ", ids, r == WP_OK ? n : 0);
            wpt_print_ids("Hugging Face", c->ids, c->n_ids);
        }
    }
    if (same != fx->n) TEST__FAIL("%s: %d of %d strings identical to Hugging Face", what, same, fx->n);
    return same;
}

/* ---- 1. exactness --------------------------------------------------------------------------- */

static void wpt_exact(void) {
    wpt_fixture fx;
    wp_tokenizer *wp = wpt_minilm();
    if (!wp) return;
    if (wpt_fixture_load(&fx)) {
        int same = wpt_check_all(wp, &fx, "tokenizer.json");
        CHECK_MSG(fx.n >= 2000, "the fixture has %d cases, fewer than 2000", fx.n);
        if (test__verbose) printf("     wordpiece: %d of %d fixture strings identical to Hugging Face\n", same, fx.n);
    }
    wpt_fixture_free(&fx);
    wp_free(wp);
}

/* The vocabulary written out as a vocab.txt (one token a line) loads with the same settings. */
static void wpt_vocab_txt(void) {
    wpt_fixture fx;
    wp_tokenizer *wp = wpt_minilm(), *wt = NULL;
    char *txt;
    size_t n = 0, cap;
    int i, v;
    if (!wp) return;
    v = wp_get_info(wp).vocab_size;
    cap = (size_t)v * 20 + 16;
    txt = (char *)malloc(cap);
    for (i = 0; txt && i < v; i++) {
        const char *t = wp_id_token(wp, i);
        size_t k = strlen(t);
        if (n + k + 2 > cap) break;
        memcpy(txt + n, t, k);
        n += k;
        if (i % 3 == 0) txt[n++] = '\r'; /* some lines end in CRLF: trimmed, as Hugging Face trims */
        txt[n++] = '\n';
    }
    CHECK(txt && i == v);
    WPT_OK(wp_load_memory(txt, n, "vocab.txt", &wt));
    if (wt) {
        wp_config a = wp_get_config(wp), b = wp_get_config(wt);
        wp_info ia = wp_get_info(wp), ib = wp_get_info(wt);
        CHECK(!memcmp(&a, &b, sizeof a));
        CHECK(!memcmp(&ia, &ib, sizeof ia));
        if (wpt_fixture_load(&fx)) wpt_check_all(wt, &fx, "vocab.txt");
        wpt_fixture_free(&fx);
    }
    wp_free(wt);
    free(txt);
    wp_free(wp);
}

/* ---- 2. truncation and batches -------------------------------------------------------------- */

/* At every max_len, the ids are [CLS], the first max_len - 2 pieces of the untruncated encoding, [SEP]. */
static void wpt_truncation(void) {
    static const char *const texts[] = {
        "Unbelievably, the antidisestablishmentarianism of Crème Brûlée was 日本語 [MASK] naïve!!! ",
        "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3 4 5 6 7 8 9",
        ""};
    wp_tokenizer *wp = wpt_minilm();
    int32_t full[1024], ids[1024];
    char *big;
    int t, k, n_full, n;
    if (!wp) return;
    big = (char *)malloc(64 * 1024);
    for (k = 0; big && k < 4000; k++) memcpy(big + 16 * k, k % 7 ? "unbelievable ok " : "supercalifragil ", 16);
    for (t = 0; t < 4 && big; t++) {
        const char *s = t < 3 ? texts[t] : big;
        size_t len = t < 3 ? strlen(s) : 64000;
        WPT_OK(wp_encode(wp, s, len, 1024, full, &n_full));
        CHECK(n_full >= 2 && full[0] == 101 && full[n_full - 1] == 102);
        for (k = 2; k <= 300; k++) {
            int want = n_full < k ? n_full : k;
            WPT_OK(wp_encode(wp, s, len, k, ids, &n));
            CHECK_MSG(n == want, "text %d, max_len %d: %d ids, want %d", t, k, n, want);
            if (n != want) break;
            CHECK_MSG(!memcmp(ids, full, (size_t)(n - 1) * sizeof *ids) && ids[n - 1] == 102,
                      "text %d, max_len %d: not a prefix ending in [SEP]", t, k);
        }
    }
    CHECK(t == 4);
    free(big);
    wp_free(wp);
}

static void wpt_batch(void) {
    static const char *const texts[5] = {"a first sentence", "", "A second, longer sentence with [MASK] in it.",
                                         "caf\xE9 (Latin-1)", "中文"};
    wp_tokenizer *wp = wpt_minilm();
    int32_t ids[5 * 64], lens[5], one[64];
    size_t tl[5];
    int i, k, w = -1, n, want_w = 0;
    if (!wp) return;
    WPT_OK(wp_encode_batch(wp, texts, NULL, 5, 64, ids, lens, &w));
    for (i = 0; i < 5; i++) {
        WPT_OK(wp_encode(wp, texts[i], strlen(texts[i]), 64, one, &n));
        if (n > want_w) want_w = n;
        CHECK(lens[i] == n);
        CHECK(!memcmp(ids + i * w, one, (size_t)n * sizeof *one));
        for (k = n; k < w; k++) CHECK(ids[i * w + k] == 0); /* [PAD] */
    }
    CHECK(w == want_w);
    /* explicit lengths: bytes past them are not read; a NULL text of length 0 is "" */
    for (i = 0; i < 5; i++) tl[i] = strlen(texts[i]) / 2;
    {
        const char *t2[5];
        memcpy(t2, texts, sizeof t2);
        t2[1] = NULL;
        tl[1] = 0;
        WPT_OK(wp_encode_batch(wp, t2, tl, 5, 64, ids, lens, &w));
        for (i = 0; i < 5; i++) {
            WPT_OK(wp_encode(wp, texts[i], tl[i], 64, one, &n));
            CHECK(lens[i] == n && !memcmp(ids + i * w, one, (size_t)n * sizeof *one));
        }
    }
    /* max_len 2: every row [CLS] [SEP]; max_len 4: width 4 */
    WPT_OK(wp_encode_batch(wp, texts, NULL, 5, 2, ids, lens, &w));
    CHECK(w == 2);
    for (i = 0; i < 5; i++) CHECK(lens[i] == 2 && ids[2 * i] == 101 && ids[2 * i + 1] == 102);
    WPT_OK(wp_encode_batch(wp, texts, NULL, 5, 4, ids, lens, &w));
    CHECK(w == 4 && lens[1] == 2 && ids[4 + 2] == 0 && ids[4 + 3] == 0 && lens[2] == 4 && ids[8 + 3] == 102);
    /* an empty batch */
    w = -1;
    WPT_OK(wp_encode_batch(wp, texts, NULL, 0, 64, ids, lens, &w));
    CHECK(w == 2);
    wp_free(wp);
}

/* ---- 3. the decoder and the tables ---------------------------------------------------------- */

/* wp__utf8 against what Python's bytes.decode("utf-8", errors="replace") gives for the same bytes. */
static void wpt_utf8(void) {
    static const struct {
        const char *bytes;
        int n;
        uint32_t want[6];
        int n_want;
    } cases[] = {
        {"\xe4\xb8" "a", 3, {0xFFFD, 0x61}, 2},
        {"\xed\xa0\x80", 3, {0xFFFD, 0xFFFD, 0xFFFD}, 3},
        {"\xf0\x9f\x98", 3, {0xFFFD}, 1},
        {"\xf0\x9f\x98" "a", 4, {0xFFFD, 0x61}, 2},
        {"\xf4\x90\x80\x80", 4, {0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD}, 4},
        {"\xc0\xaf", 2, {0xFFFD, 0xFFFD}, 2},
        {"\xe0\x80\xaf", 3, {0xFFFD, 0xFFFD, 0xFFFD}, 3},
        {"\xf8\x88\x80\x80\x80", 5, {0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD}, 5},
        {"\x80\xbf", 2, {0xFFFD, 0xFFFD}, 2},
        {"\xc3\xa9", 2, {0xE9}, 1},
        {"\xf0\x9f\x98\x80", 4, {0x1F600}, 1},
        {"\xe2\x82\xac\xe2\x82", 5, {0x20AC, 0xFFFD}, 2},
        {"\xf4\x8f\xbf\xbf", 4, {0x10FFFF}, 1},
        {"\xed\x9f\xbf", 3, {0xD7FF}, 1},
        {"\xef\xbf\xbd", 3, {0xFFFD}, 1},
        {"a\xc2 ", 3, {0x61, 0xFFFD, 0x20}, 3},
        {"\xe1\x80\xe1\x80\x80", 5, {0xFFFD, 0x1000}, 2},
        {"\xf1\x80\x80\xe1\x80\xc2", 6, {0xFFFD, 0xFFFD, 0xFFFD}, 3},
        {"\0", 1, {0}, 1},
    };
    size_t t;
    for (t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const unsigned char *s = (const unsigned char *)cases[t].bytes;
        size_t i = 0;
        int k = 0, ok = 1;
        while (i < (size_t)cases[t].n) {
            uint32_t cp;
            size_t m = wp__utf8(s + i, (size_t)cases[t].n - i, &cp);
            if (m < 1 || m > 4 || k >= cases[t].n_want || cp != cases[t].want[k]) ok = 0;
            k++;
            i += m;
        }
        CHECK_MSG(ok && k == cases[t].n_want && i == (size_t)cases[t].n, "case %d decodes unlike Python", (int)t);
    }
}

/* The tables on the cases that make BERT's rules surprising, and where Hugging Face's Unicode data
   differs from Python's (tools/gen_wordpiece_tables.py lists all of them). */
static void wpt_tables(void) {
    uint32_t o[3];
    CHECK(wp__class('$') == WP__PUNCT && wp__class('^') == WP__PUNCT && wp__class('`') == WP__PUNCT); /* ASCII, not P* */
    CHECK(wp__class(0x00BF) == WP__PUNCT && wp__class(0x3001) == WP__PUNCT && wp__class(0x00A7) == WP__PUNCT);
    CHECK(wp__class(0x00B0) == 0 && wp__class(0x20AC) == 0);          /* degree, euro: symbols, not punctuation */
    CHECK(wp__class(0x0B) == (WP__CTRL | WP__WS));                    /* removed before it could be a space */
    CHECK(wp__class(0x85) == (WP__CTRL | WP__WS));
    CHECK(wp__class('\t') == WP__WS && wp__class(0x3000) == WP__WS && wp__class(0x00A0) == WP__WS);
    CHECK(wp__class(0x1C) == WP__CTRL);                               /* Python's isspace, not White_Space */
    CHECK(wp__class(0x200B) == WP__CTRL && wp__class(0xFEFF) == WP__CTRL && wp__class(0x00AD) == WP__CTRL);
    CHECK(wp__class(0) == WP__CTRL && wp__class(0xFFFD) == WP__CTRL && wp__class(0xE000) == WP__CTRL);
    CHECK(wp__class(0xFFFF) == 0 && wp__class(0x10FFFF) == 0);        /* unassigned: kept */
    CHECK(wp__class(0x0301) == WP__MARK && wp__class(0xFE0F) == WP__MARK);
    CHECK(wp__class(0x07FD) == 0 && wp__class(0x0890) == 0);          /* newer than HF's data: kept */
    CHECK(wp__class(0x2E55) == 0 && wp__class(0x166D) == WP__PUNCT);  /* likewise for punctuation */
    CHECK(wp__strip(0xC0, 0, o) == 1 && o[0] == 'A');
    CHECK(wp__strip(0x212B, 0, o) == 1 && o[0] == 'A');               /* ANGSTROM SIGN */
    CHECK(wp__strip(0x0130, 0, o) == 1 && o[0] == 'I');
    CHECK(wp__strip(0xD55C, 0, o) == 3 && o[0] == 0x1112 && o[1] == 0x1161 && o[2] == 0x11AB); /* 한 */
    CHECK(wp__strip(0xAC00, 0, o) == 2 && o[0] == 0x1100 && o[1] == 0x1161);                   /* 가 */
    CHECK(wp__strip(0xFB01, 0, o) == 1 && o[0] == 0xFB01);            /* fi ligature: compatibility only */
    CHECK(wp__strip(0x1E9B, 0, o) == 1 && o[0] == 0x017F);            /* long s with dot */
    CHECK(wp__strip(0x0301, WP__MARK, o) == 0);
    CHECK(wp__lower(0x0130, o) == 2 && o[0] == 'i' && o[1] == 0x0307);
    CHECK(wp__lower(0x03A3, o) == 1 && o[0] == 0x03C3);               /* never final sigma */
    CHECK(wp__lower(0x1E9E, o) == 1 && o[0] == 0xDF);
    CHECK(wp__lower(0x212A, o) == 1 && o[0] == 'k');                  /* KELVIN SIGN */
    CHECK(wp__lower(0x1C89, o) == 1 && o[0] == 0x1C8A);               /* Unicode 16 in HF's Rust */
    CHECK(wp__lower(0x10570, o) == 1 && o[0] == 0x10597);
    CHECK(wp__lower(0x0100, o) == 1 && o[0] == 0x0101 && wp__lower(0x0101, o) == 1 && o[0] == 0x0101);
    CHECK(wp__is_cjk(0x2B820 - 1) && !wp__is_cjk(0x2B820) && !wp__is_cjk(0x2B91F) && wp__is_cjk(0x2B920));
}

/* Settings: a cased vocab.txt is read with lowercase and strip_accents off. */
static void wpt_config(void) {
    wp_tokenizer *wp = NULL;
    wp_config c;
    int32_t ids[16];
    int n;
    static const char vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nHello\n##é\ncaf\ncafé\n!\n##e\n";
    WPT_OK(wp_load_memory(vocab, sizeof vocab - 1, "cased.txt", &wp));
    if (!wp) return;
    WPT_OK(wp_encode(wp, "Hello hello café!", 18, 16, ids, &n));
    CHECK(n == 7 && ids[1] == 5 && ids[2] == 5 && ids[3] == 8 && ids[4] == 11 && ids[5] == 10); /* café -> caf ##e */
    c = wp_get_config(wp);
    c.lowercase = c.strip_accents = 0;
    WPT_OK(wp_set_config(wp, &c));
    WPT_OK(wp_encode(wp, "Hello hello café!", 18, 16, ids, &n));
    CHECK(n == 6 && ids[1] == 6 && ids[2] == 5 && ids[3] == 9 && ids[4] == 10);
    WPT_OK(wp_encode(wp, "cafe\xCC\x81", 6, 16, ids, &n)); /* e + combining acute: not composed */
    CHECK(n == 3 && ids[1] == 1);
    c.max_word_chars = 4;
    WPT_OK(wp_set_config(wp, &c));
    WPT_OK(wp_encode(wp, "hello caf", 9, 16, ids, &n));
    CHECK(n == 4 && ids[1] == 1 && ids[2] == 8);
    c.clean_text = 0; /* then a control is part of the word, and whitespace other than ' ' still splits */
    c.max_word_chars = 100;
    WPT_OK(wp_set_config(wp, &c));
    WPT_OK(wp_encode(wp, "hello\x01 hello\x0bhello", 18, 16, ids, &n));
    CHECK(n == 5 && ids[1] == 1 && ids[2] == 5 && ids[3] == 5);
    c.max_word_chars = 0;
    WPT_ERR(wp_set_config(wp, &c), WP_E_ARG, "wp_set_config: max_word_chars is 0");
    c.max_word_chars = WP_MAX_WORD_CHARS + 1;
    WPT_ERR(wp_set_config(wp, &c), WP_E_ARG, "max_word_chars");
    wp_free(wp);
}

/* ---- 4. errors ------------------------------------------------------------------------------ */

static void wpt_api_errors(void) {
    wp_tokenizer *wp = wpt_minilm(), *none = WPT_NOT_NULL;
    int32_t ids[8];
    int n, w;
    const char *t[1] = {NULL};
    wp_info info;
    if (!wp) return;
    info = wp_get_info(wp);
    CHECK(info.vocab_size == 30522 && info.unk == 100 && info.cls == 101 && info.sep == 102 && info.pad == 0 &&
          info.mask == 103 && info.max_token_bytes == 18);
    CHECK(wp_token_id(wp, "hello", (size_t)-1) == 7592 && wp_token_id(wp, "##s", 3) == 2015);
    CHECK(wp_token_id(wp, "hellox", 5) == 7592 && wp_token_id(wp, "Hello", (size_t)-1) == -1);
    CHECK(wp_token_id(wp, NULL, 0) == -1 && wp_token_id(NULL, "a", 1) == -1);
    CHECK(!strcmp(wp_id_token(wp, 7592), "hello") && !strcmp(wp_id_token(wp, 30521), "##～"));
    CHECK(wp_id_token(wp, -1) == NULL && wp_id_token(wp, 30522) == NULL && wp_id_token(NULL, 0) == NULL);
    WPT_ERR(wp_encode(NULL, "a", 1, 8, ids, &n), WP_E_ARG, "wp_encode: wp is NULL");
    WPT_ERR(wp_encode(wp, NULL, 1, 8, ids, &n), WP_E_ARG, "wp_encode: text is NULL");
    WPT_ERR(wp_encode(wp, "a", 1, 8, NULL, &n), WP_E_ARG, "wp_encode: ids is NULL");
    WPT_ERR(wp_encode(wp, "a", 1, 8, ids, NULL), WP_E_ARG, "wp_encode: n_ids is NULL");
    WPT_ERR(wp_encode(wp, "a", 1, 1, ids, &n), WP_E_ARG, "wp_encode: max_len is 1");
    WPT_OK(wp_encode(wp, NULL, 0, 8, ids, &n));
    CHECK(n == 2 && ids[0] == 101 && ids[1] == 102);
    WPT_ERR(wp_encode_batch(wp, t, NULL, 1, 8, ids, ids, &w), WP_E_ARG, "wp_encode_batch: texts[0] is NULL");
    WPT_ERR(wp_encode_batch(wp, t, NULL, -1, 8, ids, ids, &w), WP_E_ARG, "wp_encode_batch: batch is -1");
    WPT_ERR(wp_encode_batch(wp, t, NULL, 1, 0, ids, ids, &w), WP_E_ARG, "wp_encode_batch: max_len is 0");
    WPT_ERR(wp_encode_batch(NULL, t, NULL, 1, 8, ids, ids, &w), WP_E_ARG, "wp_encode_batch: wp is NULL");
    WPT_ERR(wp_set_config(wp, NULL), WP_E_ARG, "wp_set_config: cfg is NULL");
    WPT_ERR(wp_load(NULL, &none), WP_E_ARG, "wp_load: path is NULL");
    CHECK(none == NULL);
    WPT_ERR(wp_load("x", NULL), WP_E_ARG, "wp_load: out is NULL");
    WPT_ERR(wp_load_memory(NULL, 5, "m", &none), WP_E_ARG, "wp_load_memory: data is NULL");
    CHECK(!strcmp(wp_result_string(WP_E_FORMAT), "bad file format") && !strcmp(wp_result_string(WP_OK), "ok"));
    wp_clear_error();
    CHECK(wp_last_error()[0] == 0);
    wp_free(NULL);
    wp_free(wp);
}

/* A small valid tokenizer.json; each bad case below changes one thing in it. */
#define WPT_JSON_HEAD "{\n  \"version\": \"1.0\",\n  \"added_tokens\": [{\"id\": 4, \"content\": \"[MASK]\", \"special\": true}],\n"
#define WPT_NORM "  \"normalizer\": {\"type\": \"BertNormalizer\", \"lowercase\": true, \"strip_accents\": null},\n"
#define WPT_PRE "  \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},\n"
#define WPT_MODEL_HEAD "  \"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"max_input_chars_per_word\": 100,\n"
#define WPT_VOCAB "    \"vocab\": {\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3, \"[MASK]\": 4, \"a\": 5, \"##b\": 6, \"\\u00e9\\ud83d\\ude00\": 7}}\n"
#define WPT_GOOD WPT_JSON_HEAD WPT_NORM WPT_PRE WPT_MODEL_HEAD WPT_VOCAB "}\n"

static wp_result wpt_load_str(const char *s) {
    wp_tokenizer *wp = WPT_NOT_NULL;
    wp_result r = wp_load_memory(s, strlen(s), "t.json", &wp);
    if ((r == WP_OK) != (wp != NULL)) TEST__FAIL("wp_load_memory returned %d and %s tokenizer", (int)r, wp ? "a" : "no");
    wp_free(wp);
    return r;
}

static void wpt_load_errors(void) {
    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"", "wp_load: t.json: the file is empty"},
        {"[]", "line 1, column 1: expected '{'"},
        {"{\"model\": 5}", "\"model\" must be an object"},
        {"{}", "wp_load: t.json: \"model\" is missing"},
        {"{" WPT_PRE "\"model\": {\"type\": \"WordPiece\"}}", "\"model.vocab\" is missing"},
        {"{" WPT_PRE "\"model\": {\"vocab\": {\"a\": 0}}}", "\"model.type\" is missing"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", "\"model.type\" is \"BPE\": only WordPiece"},
        {"{" WPT_MODEL_HEAD WPT_VOCAB "}", "\"pre_tokenizer\" is missing"},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {}}}", "\"model.vocab\" is empty"},
        {"{" WPT_MODEL_HEAD "\"vocab\": []}}", "\"model.vocab\" must be an object"},
        {"{\"normalizer\": {\"type\": \"Lowercase\"}}", "\"normalizer.type\" is \"Lowercase\": only BertNormalizer"},
        {"{\"normalizer\": {\"lowercase\": 1}}", "\"normalizer.lowercase\" must be true or false"},
        {"{\"normalizer\": {\"lowercase\": true}}", "\"normalizer.type\" is missing"},
        {"{\"pre_tokenizer\": {\"type\": \"Whitespace\"}}", "only BertPreTokenizer"},
        {"{\"pre_tokenizer\": null}", "\"pre_tokenizer\" must be an object"},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1}}}", "the vocabulary has no \"[SEP]\""},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[SEP]\": 1}}}", "the vocabulary has no \"[CLS]\""},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[CLS]\": 0, \"[SEP]\": 1}}}", "no unknown token \"[UNK]\""},
        {"{" WPT_PRE "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"<unk>\", \"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 2}}}",
         "no unknown token \"<unk>\""},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 5}}}",
         "a token has id 5, but the vocabulary has 3 tokens (ids 0..2)"},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 2147483647}}}", "a token's id is 2147483647, not in 0.."},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 99999999999999999999999}}}", "a token's id is too large"},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": -1}}}", "a token's id is -1, not in 0.."},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 1.5}}}", "a token's id must be an integer"},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 1e3}}}", "a token's id must be an integer"},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": \"2\"}}}", "a token's id must be an integer"},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 1}}}", "two tokens have id 1"},
        {"{" WPT_PRE WPT_MODEL_HEAD "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 2, \"[\\u0055NK]\": 3}}}",
         "the token \"[UNK]\" appears twice (ids 0 and 3)"},
        {"{\"model\": {\"max_input_chars_per_word\": 1000000000}}", "\"model.max_input_chars_per_word\" is 1000000000, not in 1..512"},
        {"{\"model\": {\"max_input_chars_per_word\": 0}}", "not in 1..512"},
        {"{\"model\": {\"unk_token\": \"\"}}", "\"model.unk_token\" must have 1..64 bytes"},
        {"{\"model\": {\"continuing_subword_prefix\": 7}}", "must be a string"},
        {"{\"model\": {}, \"model\": {}}", "\"model\" appears twice"},
        {"{\"model\": {\"vocab\": {}, \"vocab\": {}}}", "\"model.vocab\" appears twice"},
        {"{\"added_tokens\": {}}", "\"added_tokens\" must be an array"},
        {"{\"added_tokens\": [{\"id\": 0, \"content\": \"[X]\", \"normalized\": true}]}", "\"added_tokens[].normalized\" is true"},
        {"{\"added_tokens\": [{\"id\": 0, \"content\": \"[X]\", \"lstrip\": true}]}", "\"added_tokens[].lstrip\" is true"},
        {"{\"added_tokens\": [{\"id\": 0}]}", "an added token without \"id\" or \"content\""},
        {"{" WPT_PRE "\"added_tokens\": [{\"id\": 9, \"content\": \"[X]\"}], " WPT_MODEL_HEAD
         "\"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 2}}}",
         "added token \"[X]\" has id 9, past the vocabulary (3 tokens)"},
        {"{\"model\" {}}", "line 1, column 10: expected ':' after an object key"},
        {"{\"model\": {},}", "line 1, column 14: expected a string"},
        {"{\n\n  \"a\": [1, 2,, 3]}", "line 3, column 14: expected a value"},
        {"{\"a\": tru}", "expected a value"},
        {"{\"a\": -}", "a malformed number"},
        {"{\"a\": \"x", "the file ends inside a string"},
        {"{\"a\": \"x\\qy\"}", "an unknown escape \\q"},
        {"{\"a\": \"\\u12G4\"}", "a \\u escape needs four hex digits"},
        {"{\"a\": \"\\ud800\"}", "a high surrogate \\uD800 without its low half"},
        {"{\"a\": \"\\ud800\\u0041\"}", "without its low half"},
        {"{\"a\": \"\\udc00\"}", "a lone low surrogate \\uDC00"},
        {"{\"a\": \"x\ty\"}", "a control character (0x09) inside a string"},
        {"{\"a\": \"caf\xe9\"}", "invalid UTF-8 inside a string"},
        {"{\"a\": \"\xed\xa0\x80\"}", "invalid UTF-8 inside a string"},
        {"{\"a\": 1} x", "something follows the top-level object"},
        {"{\"a\": 1", "expected ',' or '}' in an object"},
        {"{\"a\": [1 2]}", "expected ',' or ']' in an array"},
        {"{\"a\":", "the file ends where a value was expected"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0", "expected ',' or '}' in an object"},
    };
    size_t i;
    char *deep;
    wp_tokenizer *wp = WPT_NOT_NULL;
    WPT_OK(wpt_load_str(WPT_GOOD));
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        wp_result r;
        wp_clear_error();
        r = wpt_load_str(bad[i].json);
        CHECK_MSG(r == WP_E_FORMAT, "case %d: returned %d, want WP_E_FORMAT: %s", (int)i, (int)r, wp_last_error());
        CHECK_MSG(strstr(wp_last_error(), bad[i].msg) && !strncmp(wp_last_error(), "wp_load: t.json: ", 17),
                  "case %d: message \"%s\" lacks \"%s\"", (int)i, wp_last_error(), bad[i].msg);
    }
    /* nesting: 64 levels are read, deeper is refused, 100,000 levels do not overflow the stack */
    deep = (char *)malloc(200100);
    if (deep) {
        int d;
        for (d = 60; d <= 100000; d = d < 70 ? d + 1 : d * 10) {
            int k, n = 0;
            n += sprintf(deep + n, "{\"x\": ");
            for (k = 0; k < d; k++) deep[n++] = '[';
            for (k = 0; k < d; k++) deep[n++] = ']';
            n += sprintf(deep + n, ", " WPT_PRE WPT_MODEL_HEAD WPT_VOCAB "}");
            deep[n] = 0;
            wp_clear_error();
            if (d <= 63) WPT_OK(wpt_load_str(deep));
            else CHECK_MSG(wpt_load_str(deep) == WP_E_FORMAT && strstr(wp_last_error(), "nested deeper than 64"),
                           "depth %d: %s", d, wp_last_error());
        }
        free(deep);
    }
    /* files */
    WPT_ERR(wp_load("tests/fixtures/wordpiece/no-such-file.json", &wp), WP_E_IO,
            "wp_load: tests/fixtures/wordpiece/no-such-file.json: cannot open: ");
    CHECK(wp == NULL);
    WPT_ERR(wp_load(fx_dir(), &wp), WP_E_IO, "cannot read");
    /* vocab.txt */
    WPT_ERR(wp_load_memory("[UNK]\ncaf\xe9\n[CLS]\n[SEP]\n", 22, "v.txt", &wp), WP_E_FORMAT, "wp_load: v.txt: line 2 is not valid UTF-8");
    WPT_ERR(wp_load_memory("[UNK]\n[CLS]\n", 12, "v.txt", &wp), WP_E_FORMAT, "wp_load: v.txt: the vocabulary has no \"[SEP]\"");
    WPT_ERR(wp_load_memory("\n\n\n", 3, "v.txt", &wp), WP_E_FORMAT, "no unknown token \"[UNK]\"");
    WPT_ERR(wp_load_memory(" \n", 2, "v.txt", &wp), WP_E_FORMAT, "no unknown token");
    /* vocab.txt: trailing whitespace trimmed (U+3000 too), a repeated token takes its last line's id */
    {
        static const char v[] = "[UNK]\n[CLS] \t\r\n[SEP]\xe3\x80\x80\na\na\n";
        WPT_OK(wp_load_memory(v, sizeof v - 1, NULL, &wp));
    }
    if (wp) {
        CHECK(wp_token_id(wp, "[CLS]", (size_t)-1) == 1 && wp_token_id(wp, "[SEP]", (size_t)-1) == 2);
        CHECK(wp_token_id(wp, "a", 1) == 4 && !strcmp(wp_id_token(wp, 3), "a"));
        wp_free(wp);
    }
}

/* Every truncation of the real tokenizer.json fails cleanly; whole, it loads. */
static void wpt_truncated_file(void) {
    size_t size, k;
    char *json = wpt_read(wpt_path("tokenizer.json"), &size);
    int fails = 0;
    if (!json) {
        TEST__FAIL("%s: cannot read", wpt_path("tokenizer.json"));
        return;
    }
    for (k = 0; k < size; k += k < 4096 ? 1 : 997 + k / 64) { /* every byte of the head, then strides */
        wp_tokenizer *wp = NULL;
        wp_result r = wp_load_memory(json, k, "tokenizer.json", &wp);
        if (r != WP_E_FORMAT || wp || strncmp(wp_last_error(), "wp_load: tokenizer.json: ", 25)) {
            if (fails++ < 3) TEST__FAIL("%lu bytes: returned %d: %s", (unsigned long)k, (int)r, wp_last_error());
            wp_free(wp);
        }
    }
    free(json);
}

/* ---- 5. robustness -------------------------------------------------------------------------- */

static uint64_t wpt_rng = 0x9E3779B97F4A7C15ull;
static uint32_t wpt_rand(void) {
    wpt_rng ^= wpt_rng << 13;
    wpt_rng ^= wpt_rng >> 7;
    wpt_rng ^= wpt_rng << 17;
    return (uint32_t)(wpt_rng >> 16);
}

/* n ids that any encoding must satisfy: [CLS] first, [SEP] last, 2..max_len of them, all in range. */
static int wpt_sane(const int32_t *ids, int n, int max_len, int vocab) {
    int k;
    if (n < 2 || n > max_len || ids[0] != 101 || ids[n - 1] != 102) return 0;
    for (k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= vocab) return 0;
    return 1;
}

static void wpt_fuzz_encode(void) {
    static const char *const pieces[] = {"a", "é", "\xe4\xb8", "\xf0\x9f", "\x98\x80", "\xed\xa0", "\x80", "\xff",
                                         "[MASK]", "[MA", "SK]", " ", "\t", "\x00", "\xcc\x81", "中", "한", "!",
                                         "\xe2\x80\x8b", "##", "unbelievable", "\xc3", "\xf4\x90\x80\x80", "\xef\xbf\xbd"};
    wp_tokenizer *wp = wpt_minilm();
    unsigned char buf[2048];
    int32_t ids[300];
    int it, bad = 0, setting;
    if (!wp) return;
    for (setting = 0; setting < 16; setting++) { /* every on/off combination of the four steps */
        wp_config c = wp_get_config(wp);
        c.clean_text = setting & 1;
        c.chinese_chars = (setting >> 1) & 1;
        c.strip_accents = (setting >> 2) & 1;
        c.lowercase = (setting >> 3) & 1;
        c.max_word_chars = setting == 5 ? WP_MAX_WORD_CHARS : setting == 6 ? 1 : 100;
        WPT_OK(wp_set_config(wp, &c));
        for (it = 0; it < 300; it++) {
            size_t n = 0, want = wpt_rand() % sizeof buf;
            int max_len = 2 + (int)(wpt_rand() % 299), got = -1;
            if (it % 2) { /* raw random bytes */
                for (n = 0; n < want; n++) buf[n] = (unsigned char)wpt_rand();
            } else { /* pieces of text, invalid UTF-8 among them */
                while (n < want) {
                    const char *p = pieces[wpt_rand() % (sizeof pieces / sizeof pieces[0])];
                    size_t k = strlen(p) ? strlen(p) : 1;
                    if (n + k > sizeof buf) break;
                    memcpy(buf + n, p, k);
                    n += k;
                }
            }
            WPT_OK(wp_encode(wp, (const char *)buf, n, max_len, ids, &got));
            if (!wpt_sane(ids, got, max_len, 30522) && bad++ < 3)
                TEST__FAIL("setting %d, case %d: %d ids out of shape", setting, it, got);
        }
    }
    wp_free(wp);
}

/* Every prefix of multi-byte text (so every cut inside a character) encodes sanely, and a cut inside
   a character drops just that character (clean_text removes its U+FFFD). */
static void wpt_fuzz_prefixes(void) {
    static const char text[] = "Crème 中文 한국어 😀👍🏽 [MASK] \xcc\x81x naïve Ω";
    wp_tokenizer *wp = wpt_minilm();
    int32_t ids[64];
    size_t k;
    if (!wp) return;
    for (k = 0; k <= sizeof text - 1; k++) {
        int n;
        WPT_OK(wp_encode(wp, text, k, 64, ids, &n));
        CHECK_MSG(wpt_sane(ids, n, 64, 30522), "prefix of %d bytes", (int)k);
    }
    wp_free(wp);
}

/* tokenizer.json with bytes overwritten at random: loads or fails with a message, never crashes. */
static void wpt_fuzz_load(void) {
    size_t size, k;
    char *json = wpt_read(wpt_path("tokenizer.json"), &size), *copy;
    int it, loaded = 0;
    static const char junk[] = "{}[]\":,\\u0 1e-x\x80\xff\ttrue";
    if (!json) return;
    copy = (char *)malloc(size);
    /* mutate the settings and the first tokens (where structure is), not only the long vocabulary */
    for (it = 0; copy && it < 400; it++) {
        wp_tokenizer *wp = NULL;
        wp_result r;
        int m, muts = 1 + (int)(wpt_rand() % 4);
        memcpy(copy, json, size);
        for (m = 0; m < muts; m++) {
            size_t at = it % 4 ? wpt_rand() % 2048 : wpt_rand() % size;
            copy[at] = junk[wpt_rand() % (sizeof junk - 1)];
        }
        r = wp_load_memory(copy, size, "tokenizer.json", &wp);
        if (r == WP_OK) {
            int32_t ids[32];
            int n = 0;
            loaded++;
            WPT_OK(wp_encode(wp, "Hello, [MASK] world! 中文", 26, 32, ids, &n));
            CHECK(n >= 2 && n <= 32);
            wp_free(wp);
        } else {
            CHECK_MSG(r == WP_E_FORMAT && !strncmp(wp_last_error(), "wp_load: tokenizer.json: ", 25),
                      "mutation %d: returned %d: %s", it, (int)r, wp_last_error());
        }
    }
    CHECK(loaded > 0); /* some mutations land in strings and leave a loadable file */
    /* random bytes, and random JSON-ish text */
    for (it = 0; copy && it < 300; it++) {
        wp_tokenizer *wp = NULL;
        size_t n = 1 + wpt_rand() % 512;
        for (k = 0; k < n; k++) copy[k] = it % 2 ? (char)wpt_rand() : junk[wpt_rand() % (sizeof junk - 1)];
        if (wp_load_memory(copy, n, "r", &wp) == WP_OK) wp_free(wp);
    }
    free(copy);
    free(json);
}

static void suite_wordpiece(void) {
    RUN(wpt_exact);
    RUN(wpt_vocab_txt);
    RUN(wpt_truncation);
    RUN(wpt_batch);
    RUN(wpt_utf8);
    RUN(wpt_tables);
    RUN(wpt_config);
    RUN(wpt_api_errors);
    RUN(wpt_load_errors);
    RUN(wpt_truncated_file);
    RUN(wpt_fuzz_encode);
    RUN(wpt_fuzz_prefixes);
    RUN(wpt_fuzz_load);
}
