/* wordpiece.h - BERT's WordPiece tokenizer, giving the ids Hugging Face's `tokenizers` gives, for the
   examples of transformer.h. One header, C99 and C++, libc only. MIT license, as transformer.h.

   QUICK START
   -----------
   In exactly one C file of your program:

       #define WORDPIECE_IMPLEMENTATION
       #include "wordpiece.h"

   Every other file just includes "wordpiece.h". Then:

       wp_tokenizer *wp;
       if (wp_load("all-MiniLM-L6-v2/tokenizer.json", &wp) != WP_OK) {     or a BERT vocab.txt
           fprintf(stderr, "%s\n", wp_last_error());                        names the file and the field
           return 1;
       }
       int32_t ids[256];
       int n;
       wp_encode(wp, text, strlen(text), 256, ids, &n);    [CLS] pieces... [SEP], at most 256 ids

       const char *texts[3] = {"first sentence", "a second, longer sentence", ""};
       int32_t batch[3 * 256], lens[3];
       int width;
       wp_encode_batch(wp, texts, NULL, 3, 256, batch, lens, &width);
                          batch is now (3, width) row-major: row i is lens[i] ids, then [PAD] ids up to
                          width, the longest row; a tfm_batch takes it as it is (tokens, lens, len = width)
       wp_free(wp);

   Including the implementation twice in one translation unit is harmless (the second copy is skipped),
   so several files that are #included into one test program may each define WORDPIECE_IMPLEMENTATION.
   Two translation units that both define it make duplicate symbols, unless WP_STATIC is defined too.

   CONFIG MACROS (before the include that has WORDPIECE_IMPLEMENTATION)
   -------------
   WP_STATIC            every function static: a private copy in one translation unit.
   WPDEF                storage class of every public function (default extern).
   WP_MALLOC(sz) / WP_REALLOC(p,sz) / WP_FREE(p)   allocator, all three or none (default libc).
   WP_MAX_FILE_BYTES    the largest file wp_load reads (default 64 MiB; a BERT tokenizer.json is ~0.5 MB).
   WP_MAX_TOKENS        the largest vocabulary (default 4,194,304).
   WP_MAX_WORD_CHARS    the largest max_input_chars_per_word accepted (default 512; BERT's is 100):
                        wp_encode keeps one word on the stack, 14 bytes per character (7 KB).

   WHAT IT DOES (BERT's tokenization as Hugging Face's tokenizers runs it: BertNormalizer,
   BertPreTokenizer, WordPiece, the [CLS] $A [SEP] template, truncation)
   ------------
   1. UTF-8 in. Each maximal invalid subsequence of bytes (a stray continuation byte, a truncated
      sequence, an overlong form, a surrogate, a code point past U+10FFFF) becomes one U+FFFD, exactly
      as Python's bytes.decode("utf-8", errors="replace") does. clean_text then removes U+FFFD, so
      invalid bytes simply vanish: "ab\xFFcd" is the one word "abcd", as Hugging Face gives for the
      same bytes decoded by Python with errors="replace".
   2. Special tokens ([PAD] [UNK] [CLS] [SEP] [MASK]: tokenizer.json's "added_tokens", or those five
      for a vocab.txt) are matched in the raw text first, case-sensitively, longest first: "a [MASK] b"
      holds id 103; "[mask]" is just the pieces "[", "mask", "]".
   3. Normalisation (each step as tokenizer.json's "normalizer" says; a vocab.txt gets all four):
      clean_text     U+0000, U+FFFD and "other" characters (Cc, Cf, Co: controls, zero-width and
                     bidi marks, soft hyphen, private use; not \t \n \r) removed; whitespace to ' '.
      chinese_chars  a space before and after each CJK ideograph (BERT's ranges).
      strip_accents  NFD, then nonspacing marks (Mn) dropped: "Crème Brûlée" -> "Creme Brulee"; Hangul
                     syllables become their jamo. In tokenizer.json, null means "as lowercase".
      lowercase      each character's full lowercase mapping, character by character.
   4. Pre-tokenisation: words are split at whitespace; each punctuation character (ASCII
      punctuation, which includes $ + < = > ^ ` | ~, and Unicode categories P*) is a word of its own.
   5. WordPiece: each word, greedily longest-match-first: the longest prefix that is in the
      vocabulary, then the longest "##"-prefixed piece of the rest, and so on. A word with a piece that
      cannot be matched, or longer than max_input_chars_per_word (100) characters, is one [UNK].
   6. [CLS] first and [SEP] last (BERT's template; tokenizer.json's "post_processor" is not read).
      Truncation to max_len keeps the first max_len - 2 pieces (a word may be cut) and still ends
      with [SEP]. The text past what fits is not even read: a long text costs no more than a short
      one (the 31,102 KJV verses take 0.1 s on one core). sentence-transformers uses max_len 256 for
      all-MiniLM-L6-v2; tokenizer.json's own "truncation" and "padding" sections (128 there) are
      ignored: the caller chooses. sentence-transformers also strips leading and trailing whitespace
      first, which never changes the ids.
   With clean_text off, U+FFFD is a character like any other (one per invalid subsequence, as in
   Python) and controls belong to their word.

   The Unicode tables (>>wp-tables below) are generated by tools/gen_wordpiece_tables.py from Python's
   unicodedata and checked at every code point against Hugging Face's normalizer and pre-tokenizer.
   Hugging Face's categories and decompositions are older than Python's (marks, format characters
   and punctuation added to Unicode in recent versions are kept as plain letters there) and its
   lowercasing newer (Unicode 16): the tables follow Hugging Face, 560 code points in all.
   Not done: the canonical reordering of combining marks that NFD includes. It could only change the
   order of marks that strip_accents keeps (spacing marks with a combining class, marks newer than
   Hugging Face's data), and all-MiniLM-L6-v2's vocabulary (bert-base-uncased's) has no such mark in
   any token, so a word holding one is [UNK] in any order (tools/gen_wordpiece_fixture.py checks the
   vocabulary for it). Without strip_accents there is no NFD at all, in Hugging Face as here.

   ERRORS
   ------
   Functions that can fail return wp_result (WP_OK is 0); wp_last_error() gives a thread-local
   message that names the function, the file and what was wrong:
       wp_load: vocab/tokenizer.json: line 12, column 5: expected ':' after an object key
       wp_load: tokenizer.json: "model.vocab" is missing
       wp_load: tokenizer.json: the vocabulary has no "[CLS]"
   A file that does not parse is WP_E_FORMAT; one that cannot be read WP_E_IO. Nothing here exits,
   aborts or prints; no input, however hostile, makes it read out of bounds or allocate more than
   the file's size allows (the nesting of JSON values is limited to 64).

   MEMORY AND THREADS
   ------------------
   wp_load makes one allocation (the tokenizer: vocabulary, hash table, strings), freed by wp_free;
   while reading it also holds the file's bytes. wp_encode and wp_encode_batch allocate nothing (the
   word being split lives on the stack) and only read the tokenizer, so any number of threads may
   encode with one tokenizer at once. wp_set_config must not run while another thread encodes.

   CONTENTS (grep tags)
   --------
   >>api   >>impl-util   >>wp-tables   >>impl-json   >>impl-load   >>impl-encode
*/
#ifndef WP_INCLUDE_WORDPIECE_H
#define WP_INCLUDE_WORDPIECE_H

#include <stddef.h>
#include <stdint.h>

#ifndef WPDEF
#ifdef WP_STATIC
#define WPDEF static
#else
#define WPDEF extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ==== >>api ==== */

typedef enum wp_result {
    WP_OK = 0,
    WP_E_ARG = -1,    /* a bad argument (NULL, max_len < 2, ...) */
    WP_E_NOMEM = -3,  /* an allocation failed */
    WP_E_IO = -4,     /* the file could not be opened or read */
    WP_E_FORMAT = -5  /* the file is not a WordPiece vocabulary this reads (message says why) */
} wp_result;

/* The tokenizer: opaque; made by wp_load, freed by wp_free. */
typedef struct wp_tokenizer wp_tokenizer;

/* How text is normalised (tokenizer.json's "normalizer" and "model" sections). 1 on, 0 off. */
typedef struct wp_config {
    int clean_text;     /* remove controls, U+0000, U+FFFD; whitespace to ' ' */
    int chinese_chars;  /* spaces around CJK ideographs */
    int strip_accents;  /* NFD, then drop nonspacing marks */
    int lowercase;      /* full lowercase mapping */
    int max_word_chars; /* longer words (in characters, after normalisation) are [UNK]; 1..WP_MAX_WORD_CHARS */
} wp_config;

/* What the vocabulary holds. Ids are 0..vocab_size-1; an absent special token is -1. */
typedef struct wp_info {
    int vocab_size;
    int32_t unk, cls, sep, pad, mask; /* unk, cls, sep always exist; pad falls back to 0 when absent */
    int max_token_bytes;              /* the longest token, in bytes */
} wp_info;

/* "ok", "bad argument", ... */
WPDEF const char *wp_result_string(wp_result r);
/* The message of the calling thread's last failure ("" after wp_clear_error). */
WPDEF const char *wp_last_error(void);
WPDEF void wp_clear_error(void);

/* Reads a Hugging Face tokenizer.json (a "model" of type "WordPiece", a "BertNormalizer" or none, a
   "BertPreTokenizer", special "added_tokens"; its post_processor, truncation, padding and decoder
   sections are not read: see WHAT IT DOES) or a plain vocab.txt (one token a line, the id its line number,
   trailing whitespace trimmed; a token seen twice gets its last line's id, as Hugging Face does; the
   uncased-BERT settings: every wp_config flag on, 100 characters). A name ending in .json is JSON, in
   .txt a vocab.txt; otherwise a file whose first non-blank byte is '{' is JSON. The vocabulary must
   hold [UNK] (or the "unk_token"), [CLS] and [SEP]. *out is NULL on failure. WP_E_IO, WP_E_FORMAT,
   WP_E_NOMEM. */
WPDEF wp_result wp_load(const char *path, wp_tokenizer **out);
/* The same from n bytes in memory; `name` (may be NULL) is what messages call them, and its ending
   picks the format as a path's does. */
WPDEF wp_result wp_load_memory(const void *data, size_t n, const char *name, wp_tokenizer **out);
/* Frees the tokenizer (NULL is fine). */
WPDEF void wp_free(wp_tokenizer *wp);

WPDEF wp_info wp_get_info(const wp_tokenizer *wp);
WPDEF wp_config wp_get_config(const wp_tokenizer *wp);
/* Changes the normalisation (for a cased vocab.txt, say: lowercase = strip_accents = 0). */
WPDEF wp_result wp_set_config(wp_tokenizer *wp, const wp_config *cfg);
/* The id of a token (n bytes; n == (size_t)-1: NUL-terminated), or -1. */
WPDEF int32_t wp_token_id(const wp_tokenizer *wp, const char *token, size_t n);
/* The token of an id (NUL-terminated), or NULL when id is out of range. */
WPDEF const char *wp_id_token(const wp_tokenizer *wp, int32_t id);

/* Tokenizes n bytes of UTF-8 (any bytes: see WHAT IT DOES) into ids: [CLS], the pieces, [SEP];
   at most max_len ids (max_len >= 2; ids holds max_len). *n_ids gets the count (2 for an empty or
   blank text). Allocates nothing. WP_E_ARG on a NULL pointer (text may be NULL when n is 0). */
WPDEF wp_result wp_encode(const wp_tokenizer *wp, const char *text, size_t n, int max_len, int32_t *ids,
                          int *n_ids);
/* Tokenizes texts[0..batch) (text_lens[i] bytes each, or NUL-terminated when text_lens is NULL) into
   ids as a (batch, *width) row-major matrix: row i is lengths[i] ids ([CLS] ... [SEP]) and then the
   [PAD] id up to *width, the longest row (at most max_len). ids must hold batch * max_len. */
WPDEF wp_result wp_encode_batch(const wp_tokenizer *wp, const char *const *texts, const size_t *text_lens,
                                int batch, int max_len, int32_t *ids, int32_t *lengths, int *width);

#ifdef __cplusplus
}
#endif

#endif /* WP_INCLUDE_WORDPIECE_H */

#if defined(WORDPIECE_IMPLEMENTATION) && !defined(WP__IMPL_DONE)
#define WP__IMPL_DONE

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== >>impl-util ==== */

#if defined(WP_MALLOC) && defined(WP_REALLOC) && defined(WP_FREE)
#elif !defined(WP_MALLOC) && !defined(WP_REALLOC) && !defined(WP_FREE)
#define WP_MALLOC(sz) malloc(sz)
#define WP_REALLOC(p, sz) realloc(p, sz)
#define WP_FREE(p) free(p)
#else
#error "wordpiece.h: define all of WP_MALLOC, WP_REALLOC and WP_FREE, or none"
#endif

#ifndef WP_MAX_FILE_BYTES
#define WP_MAX_FILE_BYTES ((size_t)64 << 20)
#endif
#ifndef WP_MAX_TOKENS
#define WP_MAX_TOKENS (1 << 22)
#endif
#ifndef WP_MAX_WORD_CHARS
#define WP_MAX_WORD_CHARS 512
#endif
#define WP__MAX_DEPTH 64    /* JSON nesting */
#define WP__MAX_ADDED 64    /* added (special) tokens */
#define WP__MAX_ADDED_LEN 64
#define WP__MAX_PREFIX 32   /* continuing_subword_prefix, bytes */

#if defined(__cplusplus) && __cplusplus >= 201103L
#define WP__THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define WP__THREAD_LOCAL _Thread_local
#elif defined(__GNUC__)
#define WP__THREAD_LOCAL __thread
#elif defined(_MSC_VER)
#define WP__THREAD_LOCAL __declspec(thread)
#else
#define WP__THREAD_LOCAL
#endif

#if defined(WP_STATIC) && defined(__GNUC__)
#define WP__UNUSED __attribute__((unused))
#else
#define WP__UNUSED
#endif

static WP__THREAD_LOCAL char wp__errbuf[512];

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static wp_result wp__fail(wp_result r, const char *fmt, ...) {
    char msg[sizeof wp__errbuf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(wp__errbuf, msg, sizeof msg);
    return r;
}

WP__UNUSED WPDEF const char *wp_result_string(wp_result r) {
    switch (r) {
    case WP_OK: return "ok";
    case WP_E_ARG: return "bad argument";
    case WP_E_NOMEM: return "out of memory";
    case WP_E_IO: return "i/o error";
    case WP_E_FORMAT: return "bad file format";
    }
    return "unknown result code";
}
WP__UNUSED WPDEF const char *wp_last_error(void) { return wp__errbuf; }
WP__UNUSED WPDEF void wp_clear_error(void) { wp__errbuf[0] = 0; }

/* One code point from s[0..n) (n >= 1) into *cp; returns the bytes used (1..4). An invalid sequence
   gives U+FFFD for its maximal subpart (Unicode's "best practice", which Python's errors="replace"
   follows): the bytes up to the first that cannot continue it, at least one. */
static size_t wp__utf8(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t need, i;
    uint32_t v;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xC2 || c > 0xF4) {
        *cp = 0xFFFD;
        return 1;
    }
    if (c < 0xE0) {
        need = 1;
        v = c & 0x1F;
    } else if (c < 0xF0) {
        need = 2;
        v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else {
        need = 3;
        v = c & 0x07;
        if (c == 0xF0) lo = 0x90; /* overlong */
        if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
    }
    for (i = 1; i <= need; i++) {
        unsigned b;
        if (i >= n) break;
        b = s[i];
        if (b < lo || b > hi) break;
        lo = 0x80;
        hi = 0xBF;
        v = (v << 6) | (b & 0x3F);
    }
    if (i <= need) {
        *cp = 0xFFFD;
        return i;
    }
    *cp = v;
    return need + 1;
}

/* Writes cp as UTF-8 into out (room for 4); returns the bytes. */
static size_t wp__put_utf8(uint32_t cp, unsigned char *out) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Character classes (the tables below give each code point's bits). */
#define WP__CTRL 1u  /* removed by clean_text: U+0000, U+FFFD, Cc Cf Co (not \t \n \r) */
#define WP__WS 2u    /* whitespace: a space after clean_text, a word boundary */
#define WP__MARK 4u  /* a nonspacing mark: dropped by strip_accents */
#define WP__PUNCT 8u /* punctuation: a word of its own */
static unsigned wp__class(uint32_t c);

/* ==== >>impl-json ==== */

/* A reader over a JSON text in memory. Every function returns 1 on success, 0 on failure with
   j->err set (the first failure wins) and j->p left where it happened. */
typedef struct wp__json {
    const unsigned char *beg, *p, *end;
    char err[200];
} wp__json;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int wp__jfail(wp__json *j, const char *fmt, ...) {
    if (!j->err[0]) {
        const unsigned char *q;
        long line = 1, col = 1;
        int k;
        va_list ap;
        for (q = j->beg; q < j->p && q < j->end; q++) {
            if (*q == '\n') {
                line++;
                col = 1;
            } else if ((*q & 0xC0) != 0x80) {
                col++;
            }
        }
        k = snprintf(j->err, sizeof j->err, "line %ld, column %ld: ", line, col);
        if (k < 0 || k >= (int)sizeof j->err) k = 0;
        va_start(ap, fmt);
        vsnprintf(j->err + k, sizeof j->err - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return 0;
}

static void wp__jws(wp__json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

/* The next byte after whitespace, or -1 at the end. */
static int wp__jpeek(wp__json *j) {
    wp__jws(j);
    return j->p < j->end ? *j->p : -1;
}

static int wp__jexpect(wp__json *j, int c, const char *what) {
    if (wp__jpeek(j) != c) {
        if (j->p >= j->end) return wp__jfail(j, "the file ends where %s was expected", what);
        return wp__jfail(j, "expected %s", what);
    }
    j->p++;
    return 1;
}

static int wp__jhex4(wp__json *j, uint32_t *v) {
    int k;
    *v = 0;
    if (j->end - j->p < 4) return wp__jfail(j, "a \\u escape needs four hex digits");
    for (k = 0; k < 4; k++) {
        int c = j->p[k], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return wp__jfail(j, "a \\u escape needs four hex digits");
        *v = *v * 16 + (uint32_t)d;
    }
    j->p += 4;
    return 1;
}

/* A string at j->p (after whitespace), decoded. out may be NULL (only the length); otherwise it gets
   the first min(len, cap) bytes. *len gets the decoded length. Raw bytes must be valid UTF-8 and
   escapes valid (a \u surrogate must pair), as JSON requires. */
static int wp__jstr(wp__json *j, unsigned char *out, size_t cap, size_t *len) {
    size_t n = 0;
    if (!wp__jexpect(j, '"', "a string")) return 0;
    for (;;) {
        uint32_t cp;
        unsigned char buf[4];
        size_t k, m;
        if (j->p >= j->end) return wp__jfail(j, "the file ends inside a string");
        if (*j->p == '"') {
            j->p++;
            break;
        }
        if (*j->p < 0x20) return wp__jfail(j, "a control character (0x%02X) inside a string", *j->p);
        if (*j->p == '\\') {
            if (j->end - j->p < 2) return wp__jfail(j, "the file ends inside a string");
            j->p += 2;
            switch (j->p[-1]) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = 8; break;
            case 'f': cp = 12; break;
            case 'n': cp = 10; break;
            case 'r': cp = 13; break;
            case 't': cp = 9; break;
            case 'u':
                if (!wp__jhex4(j, &cp)) return 0;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return wp__jfail(j, "a lone low surrogate \\u%04X", (unsigned)cp);
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
                        return wp__jfail(j, "a high surrogate \\u%04X without its low half", (unsigned)cp);
                    j->p += 2;
                    if (!wp__jhex4(j, &lo)) return 0;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return wp__jfail(j, "a high surrogate \\u%04X without its low half", (unsigned)cp);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                break;
            default:
                j->p--;
                return wp__jfail(j, "an unknown escape \\%c", (*j->p >= 0x20 && *j->p < 0x7F) ? *j->p : '?');
            }
            m = wp__put_utf8(cp, buf);
            for (k = 0; k < m; k++, n++)
                if (out && n < cap) out[n] = buf[k];
            continue;
        }
        m = wp__utf8(j->p, (size_t)(j->end - j->p), &cp);
        if (cp == 0xFFFD && !(m == 3 && j->p[0] == 0xEF && j->p[1] == 0xBF && j->p[2] == 0xBD))
            return wp__jfail(j, "invalid UTF-8 inside a string");
        for (k = 0; k < m; k++, n++)
            if (out && n < cap) out[n] = j->p[k];
        j->p += m;
    }
    *len = n;
    return 1;
}

/* A string that is one of a few short values (a key, a type name), decoded into out (cap bytes,
   NUL-terminated). One too long for out, or holding a NUL, reads as "": it matches no name. */
static int wp__jname(wp__json *j, char *out, size_t cap) {
    size_t n;
    if (!wp__jstr(j, (unsigned char *)out, cap - 1, &n)) return 0;
    if (n > cap - 1 || memchr(out, 0, n)) n = 0;
    out[n] = 0;
    return 1;
}

/* An integer (JSON number without fraction or exponent) in [lo, hi]. `what` names it for messages. */
static int wp__jint(wp__json *j, long long lo, long long hi, long long *v, const char *what) {
    int neg = 0, digits = 0;
    unsigned long long x = 0;
    const unsigned char *start;
    wp__jws(j);
    start = j->p;
    if (j->p < j->end && *j->p == '-') {
        neg = 1;
        j->p++;
    }
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (x > 1000000000000000000ull) {
            j->p = start;
            return wp__jfail(j, "%s is too large", what);
        }
        x = x * 10 + (unsigned)(*j->p - '0');
        j->p++;
        digits++;
    }
    if (!digits) {
        j->p = start;
        return wp__jfail(j, "%s must be an integer", what);
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')) {
        j->p = start;
        return wp__jfail(j, "%s must be an integer", what);
    }
    *v = neg ? -(long long)x : (long long)x;
    if (*v < lo || *v > hi) {
        j->p = start;
        return wp__jfail(j, "%s is %lld, not in %lld..%lld", what, *v, lo, hi);
    }
    return 1;
}

static int wp__jlit(wp__json *j, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0) return 0;
    j->p += n;
    return 1;
}

/* true or false (null too when null_ok: *v = -1). */
static int wp__jbool(wp__json *j, int *v, int null_ok, const char *what) {
    wp__jws(j);
    if (wp__jlit(j, "true")) *v = 1;
    else if (wp__jlit(j, "false")) *v = 0;
    else if (null_ok && wp__jlit(j, "null")) *v = -1;
    else return wp__jfail(j, "%s must be true or false%s", what, null_ok ? " or null" : "");
    return 1;
}

/* Skips any value (checking its syntax), nested at most WP__MAX_DEPTH deep. */
static int wp__jskip(wp__json *j, int depth) {
    int c = wp__jpeek(j);
    size_t n;
    if (depth > WP__MAX_DEPTH) return wp__jfail(j, "values nested deeper than %d", WP__MAX_DEPTH);
    if (c == '"') return wp__jstr(j, NULL, 0, &n);
    if (c == '{' || c == '[') {
        int close = c == '{' ? '}' : ']';
        j->p++;
        if (wp__jpeek(j) == close) {
            j->p++;
            return 1;
        }
        for (;;) {
            if (c == '{') {
                if (!wp__jstr(j, NULL, 0, &n)) return 0;
                if (!wp__jexpect(j, ':', "':' after an object key")) return 0;
            }
            if (!wp__jskip(j, depth + 1)) return 0;
            c = wp__jpeek(j);
            if (c == ',') {
                j->p++;
                c = close == '}' ? '{' : '[';
                continue;
            }
            if (c == close) {
                j->p++;
                return 1;
            }
            return wp__jfail(j, close == '}' ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        int digits = 0;
        if (*j->p == '-') j->p++;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
        if (j->p < j->end && *j->p == '.') {
            j->p++;
            while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
        }
        if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
            j->p++;
            if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
            while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
        }
        return digits ? 1 : wp__jfail(j, "a malformed number");
    }
    if (wp__jlit(j, "true") || wp__jlit(j, "false") || wp__jlit(j, "null")) return 1;
    if (c < 0) return wp__jfail(j, "the file ends where a value was expected");
    return wp__jfail(j, "expected a value");
}

/* Object iteration: call with *first = 1 after the '{'... returns 1 with the next key in key (see
   wp__jname) and j->p at its value, 2 at the closing '}', 0 on an error. */
static int wp__jkey(wp__json *j, int *first, char *key, size_t cap) {
    int c = wp__jpeek(j);
    if (*first) {
        *first = 0;
        if (c == '}') {
            j->p++;
            return 2;
        }
    } else {
        if (c == '}') {
            j->p++;
            return 2;
        }
        if (c != ',') return wp__jfail(j, "expected ',' or '}' in an object");
        j->p++;
    }
    if (!wp__jname(j, key, cap)) return 0;
    if (!wp__jexpect(j, ':', "':' after an object key")) return 0;
    return 1;
}

/* ==== >>impl-load ==== */

typedef struct wp__added {
    int32_t id;
    uint32_t len;
    unsigned char text[WP__MAX_ADDED_LEN];
} wp__added;

struct wp_tokenizer {
    wp_config cfg;
    wp_info info;
    uint32_t hash_mask;  /* the hash table has hash_mask + 1 slots */
    int32_t *slots;      /* token id or -1 */
    uint32_t *off;       /* (vocab_size + 1) offsets of each token in pool; token i is pool[off[i]..off[i+1]-1) */
    char *pool;          /* the tokens, each followed by a NUL */
    int n_added;
    wp__added added[WP__MAX_ADDED]; /* special tokens matched in raw text, longest first */
    unsigned char added_first[32];  /* bit set of the added tokens' first bytes */
    unsigned char ascii_class[128];
    unsigned char prefix[WP__MAX_PREFIX];
    int prefix_len;
};

static uint32_t wp__hash(const unsigned char *s, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

static int32_t wp__lookup(const wp_tokenizer *wp, const unsigned char *s, size_t n) {
    uint32_t h = wp__hash(s, n) & wp->hash_mask;
    for (;; h = (h + 1) & wp->hash_mask) {
        int32_t id = wp->slots[h];
        if (id < 0) return -1;
        if (wp->off[id + 1] - wp->off[id] - 1 == n && memcmp(wp->pool + wp->off[id], s, n) == 0) return id;
    }
}

/* Puts token `id` (already in the pool) into the hash table; a token already there gets the new id
   (*dup = its old one) — vocab.txt's last-line-wins rule. */
static void wp__insert(wp_tokenizer *wp, int32_t id, int32_t *dup) {
    const unsigned char *s = (const unsigned char *)wp->pool + wp->off[id];
    size_t n = wp->off[id + 1] - wp->off[id] - 1;
    uint32_t h = wp__hash(s, n) & wp->hash_mask;
    *dup = -1;
    for (;; h = (h + 1) & wp->hash_mask) {
        int32_t old = wp->slots[h];
        if (old < 0) break;
        if (wp->off[old + 1] - wp->off[old] - 1 == n && memcmp(wp->pool + wp->off[old], s, n) == 0) {
            *dup = old;
            break;
        }
    }
    wp->slots[h] = id;
}

/* The one allocation: the struct, the hash table, the offsets, the pool (pool_bytes, NULs included). */
static wp_tokenizer *wp__alloc(size_t n_tokens, size_t pool_bytes) {
    size_t cap = 16, bytes;
    wp_tokenizer *wp;
    size_t k;
    while (cap < 2 * n_tokens) cap *= 2;
    bytes = sizeof(wp_tokenizer) + cap * sizeof(int32_t) + (n_tokens + 1) * sizeof(uint32_t) + pool_bytes;
    wp = (wp_tokenizer *)WP_MALLOC(bytes);
    if (!wp) return NULL;
    memset(wp, 0, sizeof *wp);
    wp->hash_mask = (uint32_t)(cap - 1);
    wp->slots = (int32_t *)(void *)(wp + 1);
    wp->off = (uint32_t *)(void *)(wp->slots + cap);
    wp->pool = (char *)(wp->off + n_tokens + 1);
    for (k = 0; k < cap; k++) wp->slots[k] = -1;
    wp->info.vocab_size = (int)n_tokens;
    return wp;
}

typedef struct wp__settings {
    wp_config cfg;
    unsigned char unk[WP__MAX_ADDED_LEN];
    size_t unk_len;
    unsigned char prefix[WP__MAX_PREFIX];
    size_t prefix_len;
    int n_added;
    wp__added added[WP__MAX_ADDED];
} wp__settings;

static void wp__default_settings(wp__settings *s) {
    memset(s, 0, sizeof *s);
    s->cfg.clean_text = s->cfg.chinese_chars = s->cfg.strip_accents = s->cfg.lowercase = 1;
    s->cfg.max_word_chars = 100;
    memcpy(s->unk, "[UNK]", 5);
    s->unk_len = 5;
    memcpy(s->prefix, "##", 2);
    s->prefix_len = 2;
}

/* Finishes a tokenizer whose tokens are in place: special ids, added tokens, tables. */
static wp_result wp__finish(wp_tokenizer *wp, const wp__settings *s, const char *name, int vocab_txt) {
    static const char *const specials[5] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    int i, k;
    uint32_t c;
    wp->cfg = s->cfg;
    memcpy(wp->prefix, s->prefix, s->prefix_len);
    wp->prefix_len = (int)s->prefix_len;
    wp->info.unk = wp__lookup(wp, s->unk, s->unk_len);
    wp->info.cls = wp__lookup(wp, (const unsigned char *)"[CLS]", 5);
    wp->info.sep = wp__lookup(wp, (const unsigned char *)"[SEP]", 5);
    wp->info.pad = wp__lookup(wp, (const unsigned char *)"[PAD]", 5);
    wp->info.mask = wp__lookup(wp, (const unsigned char *)"[MASK]", 6);
    if (wp->info.unk < 0)
        return wp__fail(WP_E_FORMAT, "wp_load: %s: the vocabulary has no unknown token \"%.*s\"", name,
                        (int)s->unk_len, (const char *)s->unk);
    if (wp->info.cls < 0) return wp__fail(WP_E_FORMAT, "wp_load: %s: the vocabulary has no \"[CLS]\"", name);
    if (wp->info.sep < 0) return wp__fail(WP_E_FORMAT, "wp_load: %s: the vocabulary has no \"[SEP]\"", name);
    if (wp->info.pad < 0) wp->info.pad = 0;
    wp->info.max_token_bytes = 0;
    for (i = 0; i < wp->info.vocab_size; i++) {
        int len = (int)(wp->off[i + 1] - wp->off[i] - 1);
        if (len > wp->info.max_token_bytes) wp->info.max_token_bytes = len;
    }
    if (vocab_txt) { /* Hugging Face's BertTokenizer makes these five special: matched in raw text */
        for (k = 0; k < 5; k++) {
            int32_t id = wp__lookup(wp, (const unsigned char *)specials[k], strlen(specials[k]));
            if (id < 0) continue;
            wp->added[wp->n_added].id = id;
            wp->added[wp->n_added].len = (uint32_t)strlen(specials[k]);
            memcpy(wp->added[wp->n_added].text, specials[k], strlen(specials[k]));
            wp->n_added++;
        }
    } else {
        for (k = 0; k < s->n_added; k++) {
            if (s->added[k].id >= wp->info.vocab_size)
                return wp__fail(WP_E_FORMAT, "wp_load: %s: added token \"%.*s\" has id %ld, past the vocabulary (%d tokens)",
                                name, (int)s->added[k].len, (const char *)s->added[k].text, (long)s->added[k].id,
                                wp->info.vocab_size);
            wp->added[wp->n_added++] = s->added[k];
        }
    }
    /* longest first (a stable insertion sort), so the first that matches is the longest */
    for (i = 1; i < wp->n_added; i++) {
        wp__added t = wp->added[i];
        for (k = i; k > 0 && wp->added[k - 1].len < t.len; k--) wp->added[k] = wp->added[k - 1];
        wp->added[k] = t;
    }
    for (i = 0; i < wp->n_added; i++) wp->added_first[wp->added[i].text[0] >> 3] |= (unsigned char)(1u << (wp->added[i].text[0] & 7));
    for (c = 0; c < 128; c++) wp->ascii_class[c] = (unsigned char)wp__class(c);
    return WP_OK;
}

/* ---- vocab.txt ---- */

/* The length of line[0..n) without trailing whitespace (ASCII and Unicode White_Space). */
static size_t wp__trim_end(const unsigned char *s, size_t n) {
    while (n > 0) {
        size_t k;
        int trimmed = 0;
        if (s[n - 1] == ' ' || (s[n - 1] >= 9 && s[n - 1] <= 13)) {
            n--;
            continue;
        }
        for (k = 2; k <= 3 && k <= n; k++) {
            uint32_t cp;
            if (wp__utf8(s + n - k, k, &cp) == k && cp != 0xFFFD && (wp__class(cp) & WP__WS)) {
                n -= k;
                trimmed = 1;
                break;
            }
        }
        if (!trimmed) break;
    }
    return n;
}

static wp_result wp__load_txt(const unsigned char *data, size_t n, const char *name, wp_tokenizer **out) {
    size_t lines = 0, pool = 0, i, start;
    wp_tokenizer *wp;
    wp__settings s;
    wp_result r;
    /* pass 1: count lines (a last line without '\n' counts; an empty file has none) and bytes */
    for (start = 0; start < n;) {
        const unsigned char *nl = (const unsigned char *)memchr(data + start, '\n', n - start);
        size_t end = nl ? (size_t)(nl - data) : n, len = wp__trim_end(data + start, end - start), k;
        uint32_t cp;
        for (k = 0; k < len;) {
            size_t m = wp__utf8(data + start + k, len - k, &cp);
            if (cp == 0xFFFD && !(m == 3 && data[start + k] == 0xEF))
                return wp__fail(WP_E_FORMAT, "wp_load: %s: line %lu is not valid UTF-8", name, (unsigned long)lines + 1);
            k += m;
        }
        if (++lines > (size_t)WP_MAX_TOKENS)
            return wp__fail(WP_E_FORMAT, "wp_load: %s: more than %d lines (WP_MAX_TOKENS)", name, (int)WP_MAX_TOKENS);
        pool += len + 1;
        start = end + 1;
    }
    if (lines == 0) return wp__fail(WP_E_FORMAT, "wp_load: %s: the vocabulary is empty", name);
    wp = wp__alloc(lines, pool);
    if (!wp) return wp__fail(WP_E_NOMEM, "wp_load: %s: cannot allocate %lu tokens", name, (unsigned long)lines);
    /* pass 2: copy and index */
    pool = 0;
    for (i = 0, start = 0; i < lines; i++) {
        const unsigned char *nl = (const unsigned char *)memchr(data + start, '\n', n - start);
        size_t end = nl ? (size_t)(nl - data) : n, len = wp__trim_end(data + start, end - start);
        int32_t dup;
        wp->off[i] = (uint32_t)pool;
        memcpy(wp->pool + pool, data + start, len);
        wp->pool[pool + len] = 0;
        pool += len + 1;
        wp->off[i + 1] = (uint32_t)pool;
        wp__insert(wp, (int32_t)i, &dup);
        start = end + 1;
    }
    wp__default_settings(&s);
    r = wp__finish(wp, &s, name, 1);
    if (r != WP_OK) {
        WP_FREE(wp);
        return r;
    }
    *out = wp;
    return WP_OK;
}

/* ---- tokenizer.json ---- */

typedef struct wp__jdoc {
    const unsigned char *vocab;   /* where "model.vocab"'s object starts, or NULL */
    int have_type;
} wp__jdoc;

/* Reads the "model" object: type, vocab (its position only), unk_token, prefix, max chars. */
static int wp__json_model(wp__json *j, wp__settings *s, wp__jdoc *d) {
    char key[40], val[40];
    int first = 1, got;
    if (wp__jpeek(j) != '{') return wp__jfail(j, "\"model\" must be an object");
    j->p++;
    while ((got = wp__jkey(j, &first, key, sizeof key)) == 1) {
        if (!strcmp(key, "type")) {
            if (wp__jpeek(j) != '"') return wp__jfail(j, "\"model.type\" must be a string");
            if (!wp__jname(j, val, sizeof val)) return 0;
            if (strcmp(val, "WordPiece") != 0)
                return wp__jfail(j, "\"model.type\" is \"%s\": only WordPiece models are read", val);
            d->have_type = 1;
        } else if (!strcmp(key, "vocab")) {
            if (wp__jpeek(j) != '{') return wp__jfail(j, "\"model.vocab\" must be an object (token: id)");
            if (d->vocab) return wp__jfail(j, "\"model.vocab\" appears twice");
            d->vocab = j->p;
            if (!wp__jskip(j, 3)) return 0;
        } else if (!strcmp(key, "unk_token")) {
            size_t n;
            if (wp__jpeek(j) != '"') return wp__jfail(j, "\"model.unk_token\" must be a string");
            if (!wp__jstr(j, s->unk, sizeof s->unk, &n)) return 0;
            if (n == 0 || n > sizeof s->unk) return wp__jfail(j, "\"model.unk_token\" must have 1..%d bytes", (int)sizeof s->unk);
            s->unk_len = n;
        } else if (!strcmp(key, "continuing_subword_prefix")) {
            size_t n;
            if (wp__jpeek(j) == 'n' && wp__jlit(j, "null")) {
                s->prefix_len = 0;
                continue;
            }
            if (wp__jpeek(j) != '"') return wp__jfail(j, "\"model.continuing_subword_prefix\" must be a string");
            if (!wp__jstr(j, s->prefix, sizeof s->prefix, &n)) return 0;
            if (n > sizeof s->prefix)
                return wp__jfail(j, "\"model.continuing_subword_prefix\" is longer than %d bytes", (int)sizeof s->prefix);
            s->prefix_len = n;
        } else if (!strcmp(key, "max_input_chars_per_word")) {
            long long v;
            if (!wp__jint(j, 1, WP_MAX_WORD_CHARS, &v, "\"model.max_input_chars_per_word\"")) return 0;
            s->cfg.max_word_chars = (int)v;
        } else if (!wp__jskip(j, 3)) {
            return 0;
        }
    }
    return got == 2;
}

static int wp__json_normalizer(wp__json *j, wp__settings *s) {
    char key[40], val[40];
    int first = 1, got, strip = -1, is_bert = 0;
    if (wp__jpeek(j) == 'n' && wp__jlit(j, "null")) { /* no normalizer: text as it is */
        s->cfg.clean_text = s->cfg.chinese_chars = s->cfg.strip_accents = s->cfg.lowercase = 0;
        return 1;
    }
    if (wp__jpeek(j) != '{') return wp__jfail(j, "\"normalizer\" must be an object or null");
    j->p++;
    /* BertNormalizer's defaults, for fields left out */
    s->cfg.clean_text = s->cfg.chinese_chars = s->cfg.lowercase = 1;
    while ((got = wp__jkey(j, &first, key, sizeof key)) == 1) {
        if (!strcmp(key, "type")) {
            if (wp__jpeek(j) != '"') return wp__jfail(j, "\"normalizer.type\" must be a string");
            if (!wp__jname(j, val, sizeof val)) return 0;
            if (strcmp(val, "BertNormalizer") != 0)
                return wp__jfail(j, "\"normalizer.type\" is \"%s\": only BertNormalizer (or none) is supported", val);
            is_bert = 1;
        } else if (!strcmp(key, "clean_text")) {
            if (!wp__jbool(j, &s->cfg.clean_text, 0, "\"normalizer.clean_text\"")) return 0;
        } else if (!strcmp(key, "handle_chinese_chars")) {
            if (!wp__jbool(j, &s->cfg.chinese_chars, 0, "\"normalizer.handle_chinese_chars\"")) return 0;
        } else if (!strcmp(key, "strip_accents")) {
            if (!wp__jbool(j, &strip, 1, "\"normalizer.strip_accents\"")) return 0;
        } else if (!strcmp(key, "lowercase")) {
            if (!wp__jbool(j, &s->cfg.lowercase, 0, "\"normalizer.lowercase\"")) return 0;
        } else if (!wp__jskip(j, 3)) {
            return 0;
        }
    }
    if (got != 2) return 0;
    if (!is_bert) return wp__jfail(j, "\"normalizer.type\" is missing");
    s->cfg.strip_accents = strip < 0 ? s->cfg.lowercase : strip; /* null: as lowercase */
    return 1;
}

static int wp__json_pretok(wp__json *j) {
    char key[40], val[40];
    int first = 1, got, is_bert = 0;
    if (wp__jpeek(j) != '{') return wp__jfail(j, "\"pre_tokenizer\" must be an object of type BertPreTokenizer");
    j->p++;
    while ((got = wp__jkey(j, &first, key, sizeof key)) == 1) {
        if (!strcmp(key, "type")) {
            if (wp__jpeek(j) != '"') return wp__jfail(j, "\"pre_tokenizer.type\" must be a string");
            if (!wp__jname(j, val, sizeof val)) return 0;
            if (strcmp(val, "BertPreTokenizer") != 0)
                return wp__jfail(j, "\"pre_tokenizer.type\" is \"%s\": only BertPreTokenizer is supported", val);
            is_bert = 1;
        } else if (!wp__jskip(j, 3)) {
            return 0;
        }
    }
    if (got != 2) return 0;
    return is_bert ? 1 : wp__jfail(j, "\"pre_tokenizer.type\" is missing");
}

static int wp__json_added(wp__json *j, wp__settings *s) {
    if (wp__jpeek(j) == 'n' && wp__jlit(j, "null")) return 1;
    if (!wp__jexpect(j, '[', "'[': \"added_tokens\" must be an array")) return 0;
    if (wp__jpeek(j) == ']') {
        j->p++;
        return 1;
    }
    for (;;) {
        char key[40];
        int first = 1, got, have_id = 0, have_content = 0, flag;
        wp__added a;
        memset(&a, 0, sizeof a);
        if (wp__jpeek(j) != '{') return wp__jfail(j, "each of \"added_tokens\" must be an object");
        j->p++;
        while ((got = wp__jkey(j, &first, key, sizeof key)) == 1) {
            if (!strcmp(key, "id")) {
                long long v;
                if (!wp__jint(j, 0, WP_MAX_TOKENS - 1, &v, "\"added_tokens[].id\"")) return 0;
                a.id = (int32_t)v;
                have_id = 1;
            } else if (!strcmp(key, "content")) {
                size_t n;
                if (wp__jpeek(j) != '"') return wp__jfail(j, "\"added_tokens[].content\" must be a string");
                if (!wp__jstr(j, a.text, sizeof a.text, &n)) return 0;
                if (n == 0 || n > sizeof a.text)
                    return wp__jfail(j, "\"added_tokens[].content\" must have 1..%d bytes", (int)sizeof a.text);
                a.len = (uint32_t)n;
                have_content = 1;
            } else if (!strcmp(key, "single_word") || !strcmp(key, "lstrip") || !strcmp(key, "rstrip") ||
                       !strcmp(key, "normalized")) {
                char what[64];
                snprintf(what, sizeof what, "\"added_tokens[].%s\"", key);
                if (!wp__jbool(j, &flag, 0, what)) return 0;
                if (flag)
                    return wp__jfail(j, "%s is true: only special tokens matched as they are (false) are supported", what);
            } else if (!wp__jskip(j, 4)) {
                return 0;
            }
        }
        if (got != 2) return 0;
        if (!have_id || !have_content) return wp__jfail(j, "an added token without \"id\" or \"content\"");
        if (s->n_added >= WP__MAX_ADDED) return wp__jfail(j, "more than %d added tokens", WP__MAX_ADDED);
        s->added[s->n_added++] = a;
        if (wp__jpeek(j) == ',') {
            j->p++;
            continue;
        }
        return wp__jexpect(j, ']', "',' or ']' in \"added_tokens\"");
    }
}

/* The next "token": id entry of the vocabulary object (j->p after its '{' or after an entry, which the
   first reading checked): 1 with the entry's start, its string's decoded length and the id; 0 at the
   closing '}'; -1 (j->err set) when the entry does not parse. */
static int wp__vocab_next(wp__json *j, int *first, const unsigned char **start, size_t *len, long long *id) {
    if (wp__jpeek(j) == '}') return 0;
    if (!*first) j->p++; /* the ',' */
    *first = 0;
    *start = j->p;
    if (!wp__jstr(j, NULL, 0, len) || !wp__jexpect(j, ':', "':'") ||
        !wp__jint(j, 0, WP_MAX_TOKENS - 1, id, "a token's id"))
        return -1;
    return 1;
}

static wp_result wp__load_json(const unsigned char *data, size_t n, const char *name, wp_tokenizer **out) {
    wp__json j;
    wp__settings s;
    wp__jdoc d;
    char key[40];
    int first = 1, got, seen_model = 0, seen_norm = 0, seen_pre = 0, seen_added = 0;
    size_t count = 0, pool = 0, i, len;
    long long id;
    const unsigned char *start;
    wp_tokenizer *wp;
    wp_result r;
    memset(&j, 0, sizeof j);
    memset(&d, 0, sizeof d);
    wp__default_settings(&s);
    j.beg = j.p = data;
    j.end = data + n;
    if (n >= 3 && data[0] == 0xEF && data[1] == 0xBB && data[2] == 0xBF) j.p += 3; /* a BOM */
    if (!wp__jexpect(&j, '{', "'{': a tokenizer.json is one object")) goto bad;
    while ((got = wp__jkey(&j, &first, key, sizeof key)) == 1) {
        int *seen = !strcmp(key, "model") ? &seen_model : !strcmp(key, "normalizer") ? &seen_norm
                  : !strcmp(key, "pre_tokenizer") ? &seen_pre : !strcmp(key, "added_tokens") ? &seen_added : NULL;
        if (seen && *seen) {
            wp__jfail(&j, "\"%s\" appears twice", key);
            goto bad;
        }
        if (seen) *seen = 1;
        if (seen == &seen_model) {
            if (!wp__json_model(&j, &s, &d)) goto bad;
        } else if (seen == &seen_norm) {
            if (!wp__json_normalizer(&j, &s)) goto bad;
        } else if (seen == &seen_pre) {
            if (!wp__json_pretok(&j)) goto bad;
        } else if (seen == &seen_added) {
            if (!wp__json_added(&j, &s)) goto bad;
        } else if (!wp__jskip(&j, 2)) { /* the top-level object is level 1 */
            goto bad;
        }
    }
    if (got != 2) goto bad;
    if (wp__jpeek(&j) >= 0) {
        wp__jfail(&j, "something follows the top-level object");
        goto bad;
    }
    if (!seen_model) return wp__fail(WP_E_FORMAT, "wp_load: %s: \"model\" is missing", name);
    if (!d.have_type) return wp__fail(WP_E_FORMAT, "wp_load: %s: \"model.type\" is missing", name);
    if (!d.vocab) return wp__fail(WP_E_FORMAT, "wp_load: %s: \"model.vocab\" is missing", name);
    if (!seen_pre) return wp__fail(WP_E_FORMAT, "wp_load: %s: \"pre_tokenizer\" is missing", name);
    if (!seen_norm) s.cfg.clean_text = s.cfg.chinese_chars = s.cfg.strip_accents = s.cfg.lowercase = 0; /* as null */

    /* the vocabulary, pass 1: count the tokens and their bytes */
    j.p = d.vocab + 1;
    first = 1;
    while ((got = wp__vocab_next(&j, &first, &start, &len, &id)) > 0) {
        count++;
        pool += len + 1;
    }
    if (got < 0) goto bad;
    if (count == 0) return wp__fail(WP_E_FORMAT, "wp_load: %s: \"model.vocab\" is empty", name);
    if (pool > 0xFFFFFFF0u) return wp__fail(WP_E_FORMAT, "wp_load: %s: \"model.vocab\" is too large", name);
    wp = wp__alloc(count, pool);
    if (!wp) return wp__fail(WP_E_NOMEM, "wp_load: %s: cannot allocate %lu tokens", name, (unsigned long)count);
    /* pass 2: token strings go to the pool in id order; ids must be 0..count-1, each once */
    {
        /* first the lengths by id (in off[id + 1]), then the offsets, then the strings */
        for (i = 0; i <= count; i++) wp->off[i] = 0xFFFFFFFFu;
        j.p = d.vocab + 1;
        first = 1;
        while ((got = wp__vocab_next(&j, &first, &start, &len, &id)) > 0) {
            if ((size_t)id >= count) {
                j.p = start;
                wp__jfail(&j, "a token has id %lld, but the vocabulary has %lu tokens (ids 0..%lu)", id,
                          (unsigned long)count, (unsigned long)count - 1);
                WP_FREE(wp);
                goto bad;
            }
            if (wp->off[id + 1] != 0xFFFFFFFFu) {
                j.p = start;
                wp__jfail(&j, "two tokens have id %lld", id);
                WP_FREE(wp);
                goto bad;
            }
            wp->off[id + 1] = (uint32_t)len + 1;
        }
        if (got < 0) {
            WP_FREE(wp);
            goto bad;
        }
        wp->off[0] = 0;
        for (i = 0; i < count; i++) wp->off[i + 1] += wp->off[i];
        j.p = d.vocab + 1;
        first = 1;
        /* the id follows the string: read it first, then decode the string into its place */
        while ((got = wp__vocab_next(&j, &first, &start, &len, &id)) > 0) {
            {
                const unsigned char *after = j.p;
                int32_t dup;
                j.p = start;
                wp__jstr(&j, (unsigned char *)wp->pool + wp->off[id], len, &len);
                wp->pool[wp->off[id] + len] = 0;
                j.p = after;
                wp__insert(wp, (int32_t)id, &dup);
                if (dup >= 0) {
                    j.p = start;
                    wp__jfail(&j, "the token \"%.*s\" appears twice (ids %ld and %lld)", (int)(len < 40 ? len : 40),
                              wp->pool + wp->off[id], (long)dup, id);
                    WP_FREE(wp);
                    goto bad;
                }
            }
        }
        if (got < 0) {
            WP_FREE(wp);
            goto bad;
        }
    }
    r = wp__finish(wp, &s, name, 0);
    if (r != WP_OK) {
        WP_FREE(wp);
        return r;
    }
    *out = wp;
    return WP_OK;
bad:
    return wp__fail(WP_E_FORMAT, "wp_load: %s: %s", name, j.err[0] ? j.err : "not a tokenizer.json");
}

static int wp__ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static wp_result wp__load(const unsigned char *data, size_t n, const char *name, int kind, wp_tokenizer **out) {
    size_t i = 0;
    if (kind == 0) { /* sniff: JSON when the first non-blank byte is '{' */
        if (n >= 3 && data[0] == 0xEF && data[1] == 0xBB && data[2] == 0xBF) i = 3;
        while (i < n && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r')) i++;
        kind = (i < n && data[i] == '{') ? 1 : 2;
    }
    if (n == 0) return wp__fail(WP_E_FORMAT, "wp_load: %s: the file is empty", name);
    return kind == 1 ? wp__load_json(data, n, name, out) : wp__load_txt(data, n, name, out);
}

WP__UNUSED WPDEF wp_result wp_load_memory(const void *data, size_t n, const char *name, wp_tokenizer **out) {
    if (out) *out = NULL;
    if (!out || (!data && n)) return wp__fail(WP_E_ARG, "wp_load_memory: %s is NULL", out ? "data" : "out");
    if (!name) name = "(memory)";
    return wp__load((const unsigned char *)data, n, name, wp__ends_with(name, ".json") ? 1 : wp__ends_with(name, ".txt") ? 2 : 0,
                    out);
}

WP__UNUSED WPDEF wp_result wp_load(const char *path, wp_tokenizer **out) {
    FILE *f;
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0;
    wp_result r;
    if (out) *out = NULL;
    if (!out || !path) return wp__fail(WP_E_ARG, "wp_load: %s is NULL", out ? "path" : "out");
    f = fopen(path, "rb");
    if (!f) return wp__fail(WP_E_IO, "wp_load: %s: cannot open: %s", path, strerror(errno));
    for (;;) { /* read it all, growing the buffer, never past WP_MAX_FILE_BYTES */
        size_t got;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : ((size_t)1 << 16);
            unsigned char *nb;
            if (cap > WP_MAX_FILE_BYTES) {
                fclose(f);
                WP_FREE(buf);
                return wp__fail(WP_E_FORMAT, "wp_load: %s: larger than %lu bytes (WP_MAX_FILE_BYTES)", path,
                                (unsigned long)WP_MAX_FILE_BYTES);
            }
            if (ncap > WP_MAX_FILE_BYTES + 1) ncap = WP_MAX_FILE_BYTES + 1;
            nb = (unsigned char *)WP_REALLOC(buf, ncap);
            if (!nb) {
                fclose(f);
                WP_FREE(buf);
                return wp__fail(WP_E_NOMEM, "wp_load: %s: cannot allocate %lu bytes", path, (unsigned long)ncap);
            }
            buf = nb;
            cap = ncap;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n > WP_MAX_FILE_BYTES) {
            fclose(f);
            WP_FREE(buf);
            return wp__fail(WP_E_FORMAT, "wp_load: %s: larger than %lu bytes (WP_MAX_FILE_BYTES)", path,
                            (unsigned long)WP_MAX_FILE_BYTES);
        }
        if (got == 0) break;
    }
    if (ferror(f)) {
        int e = errno;
        fclose(f);
        WP_FREE(buf);
        return wp__fail(WP_E_IO, "wp_load: %s: cannot read: %s", path, strerror(e));
    }
    fclose(f);
    r = wp__load(buf, n, path, wp__ends_with(path, ".json") ? 1 : wp__ends_with(path, ".txt") ? 2 : 0, out);
    WP_FREE(buf);
    return r;
}

WP__UNUSED WPDEF void wp_free(wp_tokenizer *wp) {
    if (wp) WP_FREE(wp);
}

WP__UNUSED WPDEF wp_info wp_get_info(const wp_tokenizer *wp) {
    wp_info none;
    if (wp) return wp->info;
    memset(&none, 0, sizeof none);
    none.unk = none.cls = none.sep = none.pad = none.mask = -1;
    return none;
}

WP__UNUSED WPDEF wp_config wp_get_config(const wp_tokenizer *wp) {
    wp_config none;
    if (wp) return wp->cfg;
    memset(&none, 0, sizeof none);
    return none;
}

WP__UNUSED WPDEF wp_result wp_set_config(wp_tokenizer *wp, const wp_config *cfg) {
    if (!wp || !cfg) return wp__fail(WP_E_ARG, "wp_set_config: %s is NULL", wp ? "cfg" : "wp");
    if (cfg->max_word_chars < 1 || cfg->max_word_chars > WP_MAX_WORD_CHARS)
        return wp__fail(WP_E_ARG, "wp_set_config: max_word_chars is %d, not in 1..%d (WP_MAX_WORD_CHARS)",
                        cfg->max_word_chars, WP_MAX_WORD_CHARS);
    wp->cfg = *cfg;
    wp->cfg.clean_text = !!cfg->clean_text;
    wp->cfg.chinese_chars = !!cfg->chinese_chars;
    wp->cfg.strip_accents = !!cfg->strip_accents;
    wp->cfg.lowercase = !!cfg->lowercase;
    return WP_OK;
}

WP__UNUSED WPDEF int32_t wp_token_id(const wp_tokenizer *wp, const char *token, size_t n) {
    if (!wp || !token) return -1;
    if (n == (size_t)-1) n = strlen(token);
    return wp__lookup(wp, (const unsigned char *)token, n);
}

WP__UNUSED WPDEF const char *wp_id_token(const wp_tokenizer *wp, int32_t id) {
    if (!wp || id < 0 || id >= wp->info.vocab_size) return NULL;
    return wp->pool + wp->off[id];
}

/* ==== the Unicode tables ==== */

/* >>wp-tables (generated by tools/gen_wordpiece_tables.py: do not edit by hand)
   Rules from Python 3.11.7's unicodedata (Unicode 14.0.0).
   Checked against Hugging Face tokenizers 0.23.3 at every code point: 560 differ,
   where HF's older category and decomposition data, or its newer lowercasing, wins.
*/
/* {first, last, class bits (WP__CTRL 1, WP__WS 2, WP__MARK 4, WP__PUNCT 8)}: sorted, disjoint;
   a code point in none has no class */
static const uint32_t wp__class_ranges[459][3] = {
    {0x0,0x8,1}, {0x9,0xA,2}, {0xB,0xC,3}, {0xD,0xD,2}, {0xE,0x1F,1}, {0x20,0x20,2}, {0x21,0x2F,8},
    {0x3A,0x40,8}, {0x5B,0x60,8}, {0x7B,0x7E,8}, {0x7F,0x84,1}, {0x85,0x85,3}, {0x86,0x9F,1},
    {0xA0,0xA0,2}, {0xA1,0xA1,8}, {0xA7,0xA7,8}, {0xAB,0xAB,8}, {0xAD,0xAD,1}, {0xB6,0xB7,8},
    {0xBB,0xBB,8}, {0xBF,0xBF,8}, {0x300,0x36F,4}, {0x37E,0x37E,8}, {0x387,0x387,8},
    {0x483,0x487,4}, {0x55A,0x55F,8}, {0x589,0x58A,8}, {0x591,0x5BD,4}, {0x5BE,0x5BE,8},
    {0x5BF,0x5BF,4}, {0x5C0,0x5C0,8}, {0x5C1,0x5C2,4}, {0x5C3,0x5C3,8}, {0x5C4,0x5C5,4},
    {0x5C6,0x5C6,8}, {0x5C7,0x5C7,4}, {0x5F3,0x5F4,8}, {0x600,0x605,1}, {0x609,0x60A,8},
    {0x60C,0x60D,8}, {0x610,0x61A,4}, {0x61B,0x61B,8}, {0x61C,0x61C,1}, {0x61E,0x61F,8},
    {0x64B,0x65F,4}, {0x66A,0x66D,8}, {0x670,0x670,4}, {0x6D4,0x6D4,8}, {0x6D6,0x6DC,4},
    {0x6DD,0x6DD,1}, {0x6DF,0x6E4,4}, {0x6E7,0x6E8,4}, {0x6EA,0x6ED,4}, {0x700,0x70D,8},
    {0x70F,0x70F,1}, {0x711,0x711,4}, {0x730,0x74A,4}, {0x7A6,0x7B0,4}, {0x7EB,0x7F3,4},
    {0x7F7,0x7F9,8}, {0x816,0x819,4}, {0x81B,0x823,4}, {0x825,0x827,4}, {0x829,0x82D,4},
    {0x830,0x83E,8}, {0x859,0x85B,4}, {0x85E,0x85E,8}, {0x8E3,0x902,4}, {0x93A,0x93A,4},
    {0x93C,0x93C,4}, {0x941,0x948,4}, {0x94D,0x94D,4}, {0x951,0x957,4}, {0x962,0x963,4},
    {0x964,0x965,8}, {0x970,0x970,8}, {0x981,0x981,4}, {0x9BC,0x9BC,4}, {0x9C1,0x9C4,4},
    {0x9CD,0x9CD,4}, {0x9E2,0x9E3,4}, {0xA01,0xA02,4}, {0xA3C,0xA3C,4}, {0xA41,0xA42,4},
    {0xA47,0xA48,4}, {0xA4B,0xA4D,4}, {0xA51,0xA51,4}, {0xA70,0xA71,4}, {0xA75,0xA75,4},
    {0xA81,0xA82,4}, {0xABC,0xABC,4}, {0xAC1,0xAC5,4}, {0xAC7,0xAC8,4}, {0xACD,0xACD,4},
    {0xAE2,0xAE3,4}, {0xAF0,0xAF0,8}, {0xB01,0xB01,4}, {0xB3C,0xB3C,4}, {0xB3F,0xB3F,4},
    {0xB41,0xB44,4}, {0xB4D,0xB4D,4}, {0xB56,0xB56,4}, {0xB62,0xB63,4}, {0xB82,0xB82,4},
    {0xBC0,0xBC0,4}, {0xBCD,0xBCD,4}, {0xC00,0xC00,4}, {0xC3E,0xC40,4}, {0xC46,0xC48,4},
    {0xC4A,0xC4D,4}, {0xC55,0xC56,4}, {0xC62,0xC63,4}, {0xC81,0xC81,4}, {0xCBC,0xCBC,4},
    {0xCBF,0xCBF,4}, {0xCC6,0xCC6,4}, {0xCCC,0xCCD,4}, {0xCE2,0xCE3,4}, {0xD01,0xD01,4},
    {0xD41,0xD44,4}, {0xD4D,0xD4D,4}, {0xD62,0xD63,4}, {0xDCA,0xDCA,4}, {0xDD2,0xDD4,4},
    {0xDD6,0xDD6,4}, {0xDF4,0xDF4,8}, {0xE31,0xE31,4}, {0xE34,0xE3A,4}, {0xE47,0xE4E,4},
    {0xE4F,0xE4F,8}, {0xE5A,0xE5B,8}, {0xEB1,0xEB1,4}, {0xEB4,0xEB9,4}, {0xEBB,0xEBC,4},
    {0xEC8,0xECD,4}, {0xF04,0xF12,8}, {0xF14,0xF14,8}, {0xF18,0xF19,4}, {0xF35,0xF35,4},
    {0xF37,0xF37,4}, {0xF39,0xF39,4}, {0xF3A,0xF3D,8}, {0xF71,0xF7E,4}, {0xF80,0xF84,4},
    {0xF85,0xF85,8}, {0xF86,0xF87,4}, {0xF8D,0xF97,4}, {0xF99,0xFBC,4}, {0xFC6,0xFC6,4},
    {0xFD0,0xFD4,8}, {0xFD9,0xFDA,8}, {0x102D,0x1030,4}, {0x1032,0x1037,4}, {0x1039,0x103A,4},
    {0x103D,0x103E,4}, {0x104A,0x104F,8}, {0x1058,0x1059,4}, {0x105E,0x1060,4}, {0x1071,0x1074,4},
    {0x1082,0x1082,4}, {0x1085,0x1086,4}, {0x108D,0x108D,4}, {0x109D,0x109D,4}, {0x10FB,0x10FB,8},
    {0x135D,0x135F,4}, {0x1360,0x1368,8}, {0x1400,0x1400,8}, {0x166D,0x166E,8}, {0x1680,0x1680,2},
    {0x169B,0x169C,8}, {0x16EB,0x16ED,8}, {0x1712,0x1714,4}, {0x1732,0x1734,4}, {0x1735,0x1736,8},
    {0x1752,0x1753,4}, {0x1772,0x1773,4}, {0x17B4,0x17B5,4}, {0x17B7,0x17BD,4}, {0x17C6,0x17C6,4},
    {0x17C9,0x17D3,4}, {0x17D4,0x17D6,8}, {0x17D8,0x17DA,8}, {0x17DD,0x17DD,4}, {0x1800,0x180A,8},
    {0x180B,0x180D,4}, {0x180E,0x180E,1}, {0x18A9,0x18A9,4}, {0x1920,0x1922,4}, {0x1927,0x1928,4},
    {0x1932,0x1932,4}, {0x1939,0x193B,4}, {0x1944,0x1945,8}, {0x1A17,0x1A18,4}, {0x1A1B,0x1A1B,4},
    {0x1A1E,0x1A1F,8}, {0x1A56,0x1A56,4}, {0x1A58,0x1A5E,4}, {0x1A60,0x1A60,4}, {0x1A62,0x1A62,4},
    {0x1A65,0x1A6C,4}, {0x1A73,0x1A7C,4}, {0x1A7F,0x1A7F,4}, {0x1AA0,0x1AA6,8}, {0x1AA8,0x1AAD,8},
    {0x1AB0,0x1ABD,4}, {0x1B00,0x1B03,4}, {0x1B34,0x1B34,4}, {0x1B36,0x1B3A,4}, {0x1B3C,0x1B3C,4},
    {0x1B42,0x1B42,4}, {0x1B5A,0x1B60,8}, {0x1B6B,0x1B73,4}, {0x1B80,0x1B81,4}, {0x1BA2,0x1BA5,4},
    {0x1BA8,0x1BA9,4}, {0x1BAB,0x1BAD,4}, {0x1BE6,0x1BE6,4}, {0x1BE8,0x1BE9,4}, {0x1BED,0x1BED,4},
    {0x1BEF,0x1BF1,4}, {0x1BFC,0x1BFF,8}, {0x1C2C,0x1C33,4}, {0x1C36,0x1C37,4}, {0x1C3B,0x1C3F,8},
    {0x1C7E,0x1C7F,8}, {0x1CC0,0x1CC7,8}, {0x1CD0,0x1CD2,4}, {0x1CD3,0x1CD3,8}, {0x1CD4,0x1CE0,4},
    {0x1CE2,0x1CE8,4}, {0x1CED,0x1CED,4}, {0x1CF4,0x1CF4,4}, {0x1CF8,0x1CF9,4}, {0x1DC0,0x1DF5,4},
    {0x1DFC,0x1DFF,4}, {0x2000,0x200A,2}, {0x200B,0x200F,1}, {0x2010,0x2027,8}, {0x2028,0x2029,2},
    {0x202A,0x202E,1}, {0x202F,0x202F,2}, {0x2030,0x2043,8}, {0x2045,0x2051,8}, {0x2053,0x205E,8},
    {0x205F,0x205F,2}, {0x2060,0x2064,1}, {0x2066,0x206F,1}, {0x207D,0x207E,8}, {0x208D,0x208E,8},
    {0x20D0,0x20DC,4}, {0x20E1,0x20E1,4}, {0x20E5,0x20F0,4}, {0x2308,0x230B,8}, {0x2329,0x232A,8},
    {0x2768,0x2775,8}, {0x27C5,0x27C6,8}, {0x27E6,0x27EF,8}, {0x2983,0x2998,8}, {0x29D8,0x29DB,8},
    {0x29FC,0x29FD,8}, {0x2CEF,0x2CF1,4}, {0x2CF9,0x2CFC,8}, {0x2CFE,0x2CFF,8}, {0x2D70,0x2D70,8},
    {0x2D7F,0x2D7F,4}, {0x2DE0,0x2DFF,4}, {0x2E00,0x2E2E,8}, {0x2E30,0x2E42,8}, {0x3000,0x3000,2},
    {0x3001,0x3003,8}, {0x3008,0x3011,8}, {0x3014,0x301F,8}, {0x302A,0x302D,4}, {0x3030,0x3030,8},
    {0x303D,0x303D,8}, {0x3099,0x309A,4}, {0x30A0,0x30A0,8}, {0x30FB,0x30FB,8}, {0xA4FE,0xA4FF,8},
    {0xA60D,0xA60F,8}, {0xA66F,0xA66F,4}, {0xA673,0xA673,8}, {0xA674,0xA67D,4}, {0xA67E,0xA67E,8},
    {0xA69E,0xA69F,4}, {0xA6F0,0xA6F1,4}, {0xA6F2,0xA6F7,8}, {0xA802,0xA802,4}, {0xA806,0xA806,4},
    {0xA80B,0xA80B,4}, {0xA825,0xA826,4}, {0xA874,0xA877,8}, {0xA8C4,0xA8C4,4}, {0xA8CE,0xA8CF,8},
    {0xA8E0,0xA8F1,4}, {0xA8F8,0xA8FA,8}, {0xA8FC,0xA8FC,8}, {0xA926,0xA92D,4}, {0xA92E,0xA92F,8},
    {0xA947,0xA951,4}, {0xA95F,0xA95F,8}, {0xA980,0xA982,4}, {0xA9B3,0xA9B3,4}, {0xA9B6,0xA9B9,4},
    {0xA9BC,0xA9BC,4}, {0xA9C1,0xA9CD,8}, {0xA9DE,0xA9DF,8}, {0xA9E5,0xA9E5,4}, {0xAA29,0xAA2E,4},
    {0xAA31,0xAA32,4}, {0xAA35,0xAA36,4}, {0xAA43,0xAA43,4}, {0xAA4C,0xAA4C,4}, {0xAA5C,0xAA5F,8},
    {0xAA7C,0xAA7C,4}, {0xAAB0,0xAAB0,4}, {0xAAB2,0xAAB4,4}, {0xAAB7,0xAAB8,4}, {0xAABE,0xAABF,4},
    {0xAAC1,0xAAC1,4}, {0xAADE,0xAADF,8}, {0xAAEC,0xAAED,4}, {0xAAF0,0xAAF1,8}, {0xAAF6,0xAAF6,4},
    {0xABE5,0xABE5,4}, {0xABE8,0xABE8,4}, {0xABEB,0xABEB,8}, {0xABED,0xABED,4}, {0xE000,0xF8FF,1},
    {0xFB1E,0xFB1E,4}, {0xFD3E,0xFD3F,8}, {0xFE00,0xFE0F,4}, {0xFE10,0xFE19,8}, {0xFE20,0xFE2F,4},
    {0xFE30,0xFE52,8}, {0xFE54,0xFE61,8}, {0xFE63,0xFE63,8}, {0xFE68,0xFE68,8}, {0xFE6A,0xFE6B,8},
    {0xFEFF,0xFEFF,1}, {0xFF01,0xFF03,8}, {0xFF05,0xFF0A,8}, {0xFF0C,0xFF0F,8}, {0xFF1A,0xFF1B,8},
    {0xFF1F,0xFF20,8}, {0xFF3B,0xFF3D,8}, {0xFF3F,0xFF3F,8}, {0xFF5B,0xFF5B,8}, {0xFF5D,0xFF5D,8},
    {0xFF5F,0xFF65,8}, {0xFFF9,0xFFFB,1}, {0xFFFD,0xFFFD,1}, {0x10100,0x10102,8},
    {0x101FD,0x101FD,4}, {0x102E0,0x102E0,4}, {0x10376,0x1037A,4}, {0x1039F,0x1039F,8},
    {0x103D0,0x103D0,8}, {0x1056F,0x1056F,8}, {0x10857,0x10857,8}, {0x1091F,0x1091F,8},
    {0x1093F,0x1093F,8}, {0x10A01,0x10A03,4}, {0x10A05,0x10A06,4}, {0x10A0C,0x10A0F,4},
    {0x10A38,0x10A3A,4}, {0x10A3F,0x10A3F,4}, {0x10A50,0x10A58,8}, {0x10A7F,0x10A7F,8},
    {0x10AE5,0x10AE6,4}, {0x10AF0,0x10AF6,8}, {0x10B39,0x10B3F,8}, {0x10B99,0x10B9C,8},
    {0x11001,0x11001,4}, {0x11038,0x11046,4}, {0x11047,0x1104D,8}, {0x1107F,0x11081,4},
    {0x110B3,0x110B6,4}, {0x110B9,0x110BA,4}, {0x110BB,0x110BC,8}, {0x110BD,0x110BD,1},
    {0x110BE,0x110C1,8}, {0x11100,0x11102,4}, {0x11127,0x1112B,4}, {0x1112D,0x11134,4},
    {0x11140,0x11143,8}, {0x11173,0x11173,4}, {0x11174,0x11175,8}, {0x11180,0x11181,4},
    {0x111B6,0x111BE,4}, {0x111C5,0x111C9,8}, {0x111CA,0x111CC,4}, {0x111CD,0x111CD,8},
    {0x111DB,0x111DB,8}, {0x111DD,0x111DF,8}, {0x1122F,0x11231,4}, {0x11234,0x11234,4},
    {0x11236,0x11237,4}, {0x11238,0x1123D,8}, {0x112A9,0x112A9,8}, {0x112DF,0x112DF,4},
    {0x112E3,0x112EA,4}, {0x11300,0x11301,4}, {0x1133C,0x1133C,4}, {0x11340,0x11340,4},
    {0x11366,0x1136C,4}, {0x11370,0x11374,4}, {0x114B3,0x114B8,4}, {0x114BA,0x114BA,4},
    {0x114BF,0x114C0,4}, {0x114C2,0x114C3,4}, {0x114C6,0x114C6,8}, {0x115B2,0x115B5,4},
    {0x115BC,0x115BD,4}, {0x115BF,0x115C0,4}, {0x115C1,0x115D7,8}, {0x115DC,0x115DD,4},
    {0x11633,0x1163A,4}, {0x1163D,0x1163D,4}, {0x1163F,0x11640,4}, {0x11641,0x11643,8},
    {0x116AB,0x116AB,4}, {0x116AD,0x116AD,4}, {0x116B0,0x116B5,4}, {0x116B7,0x116B7,4},
    {0x1171D,0x1171F,4}, {0x11722,0x11725,4}, {0x11727,0x1172B,4}, {0x1173C,0x1173E,8},
    {0x12470,0x12474,8}, {0x16A6E,0x16A6F,8}, {0x16AF0,0x16AF4,4}, {0x16AF5,0x16AF5,8},
    {0x16B30,0x16B36,4}, {0x16B37,0x16B3B,8}, {0x16B44,0x16B44,8}, {0x16F8F,0x16F92,4},
    {0x1BC9D,0x1BC9E,4}, {0x1BC9F,0x1BC9F,8}, {0x1BCA0,0x1BCA3,1}, {0x1D167,0x1D169,4},
    {0x1D173,0x1D17A,1}, {0x1D17B,0x1D182,4}, {0x1D185,0x1D18B,4}, {0x1D1AA,0x1D1AD,4},
    {0x1D242,0x1D244,4}, {0x1DA00,0x1DA36,4}, {0x1DA3B,0x1DA6C,4}, {0x1DA75,0x1DA75,4},
    {0x1DA84,0x1DA84,4}, {0x1DA87,0x1DA8B,8}, {0x1DA9B,0x1DA9F,4}, {0x1DAA1,0x1DAAF,4},
    {0x1E8D0,0x1E8D6,4}, {0xE0001,0xE0001,1}, {0xE0020,0xE007F,1}, {0xE0100,0xE01EF,4},
    {0xF0000,0xFFFFD,1}, {0x100000,0x10FFFD,1},
};
/* strip_accents, one character: {c, NFD(c) without its nonspacing marks}, sorted by c */
static const uint32_t wp__strip1[2000][2] = {
    {0xC0,0x41}, {0xC1,0x41}, {0xC2,0x41}, {0xC3,0x41}, {0xC4,0x41}, {0xC5,0x41}, {0xC7,0x43},
    {0xC8,0x45}, {0xC9,0x45}, {0xCA,0x45}, {0xCB,0x45}, {0xCC,0x49}, {0xCD,0x49}, {0xCE,0x49},
    {0xCF,0x49}, {0xD1,0x4E}, {0xD2,0x4F}, {0xD3,0x4F}, {0xD4,0x4F}, {0xD5,0x4F}, {0xD6,0x4F},
    {0xD9,0x55}, {0xDA,0x55}, {0xDB,0x55}, {0xDC,0x55}, {0xDD,0x59}, {0xE0,0x61}, {0xE1,0x61},
    {0xE2,0x61}, {0xE3,0x61}, {0xE4,0x61}, {0xE5,0x61}, {0xE7,0x63}, {0xE8,0x65}, {0xE9,0x65},
    {0xEA,0x65}, {0xEB,0x65}, {0xEC,0x69}, {0xED,0x69}, {0xEE,0x69}, {0xEF,0x69}, {0xF1,0x6E},
    {0xF2,0x6F}, {0xF3,0x6F}, {0xF4,0x6F}, {0xF5,0x6F}, {0xF6,0x6F}, {0xF9,0x75}, {0xFA,0x75},
    {0xFB,0x75}, {0xFC,0x75}, {0xFD,0x79}, {0xFF,0x79}, {0x100,0x41}, {0x101,0x61}, {0x102,0x41},
    {0x103,0x61}, {0x104,0x41}, {0x105,0x61}, {0x106,0x43}, {0x107,0x63}, {0x108,0x43},
    {0x109,0x63}, {0x10A,0x43}, {0x10B,0x63}, {0x10C,0x43}, {0x10D,0x63}, {0x10E,0x44},
    {0x10F,0x64}, {0x112,0x45}, {0x113,0x65}, {0x114,0x45}, {0x115,0x65}, {0x116,0x45},
    {0x117,0x65}, {0x118,0x45}, {0x119,0x65}, {0x11A,0x45}, {0x11B,0x65}, {0x11C,0x47},
    {0x11D,0x67}, {0x11E,0x47}, {0x11F,0x67}, {0x120,0x47}, {0x121,0x67}, {0x122,0x47},
    {0x123,0x67}, {0x124,0x48}, {0x125,0x68}, {0x128,0x49}, {0x129,0x69}, {0x12A,0x49},
    {0x12B,0x69}, {0x12C,0x49}, {0x12D,0x69}, {0x12E,0x49}, {0x12F,0x69}, {0x130,0x49},
    {0x134,0x4A}, {0x135,0x6A}, {0x136,0x4B}, {0x137,0x6B}, {0x139,0x4C}, {0x13A,0x6C},
    {0x13B,0x4C}, {0x13C,0x6C}, {0x13D,0x4C}, {0x13E,0x6C}, {0x143,0x4E}, {0x144,0x6E},
    {0x145,0x4E}, {0x146,0x6E}, {0x147,0x4E}, {0x148,0x6E}, {0x14C,0x4F}, {0x14D,0x6F},
    {0x14E,0x4F}, {0x14F,0x6F}, {0x150,0x4F}, {0x151,0x6F}, {0x154,0x52}, {0x155,0x72},
    {0x156,0x52}, {0x157,0x72}, {0x158,0x52}, {0x159,0x72}, {0x15A,0x53}, {0x15B,0x73},
    {0x15C,0x53}, {0x15D,0x73}, {0x15E,0x53}, {0x15F,0x73}, {0x160,0x53}, {0x161,0x73},
    {0x162,0x54}, {0x163,0x74}, {0x164,0x54}, {0x165,0x74}, {0x168,0x55}, {0x169,0x75},
    {0x16A,0x55}, {0x16B,0x75}, {0x16C,0x55}, {0x16D,0x75}, {0x16E,0x55}, {0x16F,0x75},
    {0x170,0x55}, {0x171,0x75}, {0x172,0x55}, {0x173,0x75}, {0x174,0x57}, {0x175,0x77},
    {0x176,0x59}, {0x177,0x79}, {0x178,0x59}, {0x179,0x5A}, {0x17A,0x7A}, {0x17B,0x5A},
    {0x17C,0x7A}, {0x17D,0x5A}, {0x17E,0x7A}, {0x1A0,0x4F}, {0x1A1,0x6F}, {0x1AF,0x55},
    {0x1B0,0x75}, {0x1CD,0x41}, {0x1CE,0x61}, {0x1CF,0x49}, {0x1D0,0x69}, {0x1D1,0x4F},
    {0x1D2,0x6F}, {0x1D3,0x55}, {0x1D4,0x75}, {0x1D5,0x55}, {0x1D6,0x75}, {0x1D7,0x55},
    {0x1D8,0x75}, {0x1D9,0x55}, {0x1DA,0x75}, {0x1DB,0x55}, {0x1DC,0x75}, {0x1DE,0x41},
    {0x1DF,0x61}, {0x1E0,0x41}, {0x1E1,0x61}, {0x1E2,0xC6}, {0x1E3,0xE6}, {0x1E6,0x47},
    {0x1E7,0x67}, {0x1E8,0x4B}, {0x1E9,0x6B}, {0x1EA,0x4F}, {0x1EB,0x6F}, {0x1EC,0x4F},
    {0x1ED,0x6F}, {0x1EE,0x1B7}, {0x1EF,0x292}, {0x1F0,0x6A}, {0x1F4,0x47}, {0x1F5,0x67},
    {0x1F8,0x4E}, {0x1F9,0x6E}, {0x1FA,0x41}, {0x1FB,0x61}, {0x1FC,0xC6}, {0x1FD,0xE6},
    {0x1FE,0xD8}, {0x1FF,0xF8}, {0x200,0x41}, {0x201,0x61}, {0x202,0x41}, {0x203,0x61},
    {0x204,0x45}, {0x205,0x65}, {0x206,0x45}, {0x207,0x65}, {0x208,0x49}, {0x209,0x69},
    {0x20A,0x49}, {0x20B,0x69}, {0x20C,0x4F}, {0x20D,0x6F}, {0x20E,0x4F}, {0x20F,0x6F},
    {0x210,0x52}, {0x211,0x72}, {0x212,0x52}, {0x213,0x72}, {0x214,0x55}, {0x215,0x75},
    {0x216,0x55}, {0x217,0x75}, {0x218,0x53}, {0x219,0x73}, {0x21A,0x54}, {0x21B,0x74},
    {0x21E,0x48}, {0x21F,0x68}, {0x226,0x41}, {0x227,0x61}, {0x228,0x45}, {0x229,0x65},
    {0x22A,0x4F}, {0x22B,0x6F}, {0x22C,0x4F}, {0x22D,0x6F}, {0x22E,0x4F}, {0x22F,0x6F},
    {0x230,0x4F}, {0x231,0x6F}, {0x232,0x59}, {0x233,0x79}, {0x374,0x2B9}, {0x37E,0x3B},
    {0x385,0xA8}, {0x386,0x391}, {0x387,0xB7}, {0x388,0x395}, {0x389,0x397}, {0x38A,0x399},
    {0x38C,0x39F}, {0x38E,0x3A5}, {0x38F,0x3A9}, {0x390,0x3B9}, {0x3AA,0x399}, {0x3AB,0x3A5},
    {0x3AC,0x3B1}, {0x3AD,0x3B5}, {0x3AE,0x3B7}, {0x3AF,0x3B9}, {0x3B0,0x3C5}, {0x3CA,0x3B9},
    {0x3CB,0x3C5}, {0x3CC,0x3BF}, {0x3CD,0x3C5}, {0x3CE,0x3C9}, {0x3D3,0x3D2}, {0x3D4,0x3D2},
    {0x400,0x415}, {0x401,0x415}, {0x403,0x413}, {0x407,0x406}, {0x40C,0x41A}, {0x40D,0x418},
    {0x40E,0x423}, {0x419,0x418}, {0x439,0x438}, {0x450,0x435}, {0x451,0x435}, {0x453,0x433},
    {0x457,0x456}, {0x45C,0x43A}, {0x45D,0x438}, {0x45E,0x443}, {0x476,0x474}, {0x477,0x475},
    {0x4C1,0x416}, {0x4C2,0x436}, {0x4D0,0x410}, {0x4D1,0x430}, {0x4D2,0x410}, {0x4D3,0x430},
    {0x4D6,0x415}, {0x4D7,0x435}, {0x4DA,0x4D8}, {0x4DB,0x4D9}, {0x4DC,0x416}, {0x4DD,0x436},
    {0x4DE,0x417}, {0x4DF,0x437}, {0x4E2,0x418}, {0x4E3,0x438}, {0x4E4,0x418}, {0x4E5,0x438},
    {0x4E6,0x41E}, {0x4E7,0x43E}, {0x4EA,0x4E8}, {0x4EB,0x4E9}, {0x4EC,0x42D}, {0x4ED,0x44D},
    {0x4EE,0x423}, {0x4EF,0x443}, {0x4F0,0x423}, {0x4F1,0x443}, {0x4F2,0x423}, {0x4F3,0x443},
    {0x4F4,0x427}, {0x4F5,0x447}, {0x4F8,0x42B}, {0x4F9,0x44B}, {0x622,0x627}, {0x623,0x627},
    {0x624,0x648}, {0x625,0x627}, {0x626,0x64A}, {0x6C0,0x6D5}, {0x6C2,0x6C1}, {0x6D3,0x6D2},
    {0x929,0x928}, {0x931,0x930}, {0x934,0x933}, {0x958,0x915}, {0x959,0x916}, {0x95A,0x917},
    {0x95B,0x91C}, {0x95C,0x921}, {0x95D,0x922}, {0x95E,0x92B}, {0x95F,0x92F}, {0x9DC,0x9A1},
    {0x9DD,0x9A2}, {0x9DF,0x9AF}, {0xA33,0xA32}, {0xA36,0xA38}, {0xA59,0xA16}, {0xA5A,0xA17},
    {0xA5B,0xA1C}, {0xA5E,0xA2B}, {0xB48,0xB47}, {0xB5C,0xB21}, {0xB5D,0xB22}, {0xCC0,0xCD5},
    {0xCC7,0xCD5}, {0xCC8,0xCD6}, {0xCCA,0xCC2}, {0xDDA,0xDD9}, {0xF43,0xF42}, {0xF4D,0xF4C},
    {0xF52,0xF51}, {0xF57,0xF56}, {0xF5C,0xF5B}, {0xF69,0xF40}, {0x1026,0x1025}, {0x1B3B,0x1B35},
    {0x1B3D,0x1B35}, {0x1B43,0x1B35}, {0x1E00,0x41}, {0x1E01,0x61}, {0x1E02,0x42}, {0x1E03,0x62},
    {0x1E04,0x42}, {0x1E05,0x62}, {0x1E06,0x42}, {0x1E07,0x62}, {0x1E08,0x43}, {0x1E09,0x63},
    {0x1E0A,0x44}, {0x1E0B,0x64}, {0x1E0C,0x44}, {0x1E0D,0x64}, {0x1E0E,0x44}, {0x1E0F,0x64},
    {0x1E10,0x44}, {0x1E11,0x64}, {0x1E12,0x44}, {0x1E13,0x64}, {0x1E14,0x45}, {0x1E15,0x65},
    {0x1E16,0x45}, {0x1E17,0x65}, {0x1E18,0x45}, {0x1E19,0x65}, {0x1E1A,0x45}, {0x1E1B,0x65},
    {0x1E1C,0x45}, {0x1E1D,0x65}, {0x1E1E,0x46}, {0x1E1F,0x66}, {0x1E20,0x47}, {0x1E21,0x67},
    {0x1E22,0x48}, {0x1E23,0x68}, {0x1E24,0x48}, {0x1E25,0x68}, {0x1E26,0x48}, {0x1E27,0x68},
    {0x1E28,0x48}, {0x1E29,0x68}, {0x1E2A,0x48}, {0x1E2B,0x68}, {0x1E2C,0x49}, {0x1E2D,0x69},
    {0x1E2E,0x49}, {0x1E2F,0x69}, {0x1E30,0x4B}, {0x1E31,0x6B}, {0x1E32,0x4B}, {0x1E33,0x6B},
    {0x1E34,0x4B}, {0x1E35,0x6B}, {0x1E36,0x4C}, {0x1E37,0x6C}, {0x1E38,0x4C}, {0x1E39,0x6C},
    {0x1E3A,0x4C}, {0x1E3B,0x6C}, {0x1E3C,0x4C}, {0x1E3D,0x6C}, {0x1E3E,0x4D}, {0x1E3F,0x6D},
    {0x1E40,0x4D}, {0x1E41,0x6D}, {0x1E42,0x4D}, {0x1E43,0x6D}, {0x1E44,0x4E}, {0x1E45,0x6E},
    {0x1E46,0x4E}, {0x1E47,0x6E}, {0x1E48,0x4E}, {0x1E49,0x6E}, {0x1E4A,0x4E}, {0x1E4B,0x6E},
    {0x1E4C,0x4F}, {0x1E4D,0x6F}, {0x1E4E,0x4F}, {0x1E4F,0x6F}, {0x1E50,0x4F}, {0x1E51,0x6F},
    {0x1E52,0x4F}, {0x1E53,0x6F}, {0x1E54,0x50}, {0x1E55,0x70}, {0x1E56,0x50}, {0x1E57,0x70},
    {0x1E58,0x52}, {0x1E59,0x72}, {0x1E5A,0x52}, {0x1E5B,0x72}, {0x1E5C,0x52}, {0x1E5D,0x72},
    {0x1E5E,0x52}, {0x1E5F,0x72}, {0x1E60,0x53}, {0x1E61,0x73}, {0x1E62,0x53}, {0x1E63,0x73},
    {0x1E64,0x53}, {0x1E65,0x73}, {0x1E66,0x53}, {0x1E67,0x73}, {0x1E68,0x53}, {0x1E69,0x73},
    {0x1E6A,0x54}, {0x1E6B,0x74}, {0x1E6C,0x54}, {0x1E6D,0x74}, {0x1E6E,0x54}, {0x1E6F,0x74},
    {0x1E70,0x54}, {0x1E71,0x74}, {0x1E72,0x55}, {0x1E73,0x75}, {0x1E74,0x55}, {0x1E75,0x75},
    {0x1E76,0x55}, {0x1E77,0x75}, {0x1E78,0x55}, {0x1E79,0x75}, {0x1E7A,0x55}, {0x1E7B,0x75},
    {0x1E7C,0x56}, {0x1E7D,0x76}, {0x1E7E,0x56}, {0x1E7F,0x76}, {0x1E80,0x57}, {0x1E81,0x77},
    {0x1E82,0x57}, {0x1E83,0x77}, {0x1E84,0x57}, {0x1E85,0x77}, {0x1E86,0x57}, {0x1E87,0x77},
    {0x1E88,0x57}, {0x1E89,0x77}, {0x1E8A,0x58}, {0x1E8B,0x78}, {0x1E8C,0x58}, {0x1E8D,0x78},
    {0x1E8E,0x59}, {0x1E8F,0x79}, {0x1E90,0x5A}, {0x1E91,0x7A}, {0x1E92,0x5A}, {0x1E93,0x7A},
    {0x1E94,0x5A}, {0x1E95,0x7A}, {0x1E96,0x68}, {0x1E97,0x74}, {0x1E98,0x77}, {0x1E99,0x79},
    {0x1E9B,0x17F}, {0x1EA0,0x41}, {0x1EA1,0x61}, {0x1EA2,0x41}, {0x1EA3,0x61}, {0x1EA4,0x41},
    {0x1EA5,0x61}, {0x1EA6,0x41}, {0x1EA7,0x61}, {0x1EA8,0x41}, {0x1EA9,0x61}, {0x1EAA,0x41},
    {0x1EAB,0x61}, {0x1EAC,0x41}, {0x1EAD,0x61}, {0x1EAE,0x41}, {0x1EAF,0x61}, {0x1EB0,0x41},
    {0x1EB1,0x61}, {0x1EB2,0x41}, {0x1EB3,0x61}, {0x1EB4,0x41}, {0x1EB5,0x61}, {0x1EB6,0x41},
    {0x1EB7,0x61}, {0x1EB8,0x45}, {0x1EB9,0x65}, {0x1EBA,0x45}, {0x1EBB,0x65}, {0x1EBC,0x45},
    {0x1EBD,0x65}, {0x1EBE,0x45}, {0x1EBF,0x65}, {0x1EC0,0x45}, {0x1EC1,0x65}, {0x1EC2,0x45},
    {0x1EC3,0x65}, {0x1EC4,0x45}, {0x1EC5,0x65}, {0x1EC6,0x45}, {0x1EC7,0x65}, {0x1EC8,0x49},
    {0x1EC9,0x69}, {0x1ECA,0x49}, {0x1ECB,0x69}, {0x1ECC,0x4F}, {0x1ECD,0x6F}, {0x1ECE,0x4F},
    {0x1ECF,0x6F}, {0x1ED0,0x4F}, {0x1ED1,0x6F}, {0x1ED2,0x4F}, {0x1ED3,0x6F}, {0x1ED4,0x4F},
    {0x1ED5,0x6F}, {0x1ED6,0x4F}, {0x1ED7,0x6F}, {0x1ED8,0x4F}, {0x1ED9,0x6F}, {0x1EDA,0x4F},
    {0x1EDB,0x6F}, {0x1EDC,0x4F}, {0x1EDD,0x6F}, {0x1EDE,0x4F}, {0x1EDF,0x6F}, {0x1EE0,0x4F},
    {0x1EE1,0x6F}, {0x1EE2,0x4F}, {0x1EE3,0x6F}, {0x1EE4,0x55}, {0x1EE5,0x75}, {0x1EE6,0x55},
    {0x1EE7,0x75}, {0x1EE8,0x55}, {0x1EE9,0x75}, {0x1EEA,0x55}, {0x1EEB,0x75}, {0x1EEC,0x55},
    {0x1EED,0x75}, {0x1EEE,0x55}, {0x1EEF,0x75}, {0x1EF0,0x55}, {0x1EF1,0x75}, {0x1EF2,0x59},
    {0x1EF3,0x79}, {0x1EF4,0x59}, {0x1EF5,0x79}, {0x1EF6,0x59}, {0x1EF7,0x79}, {0x1EF8,0x59},
    {0x1EF9,0x79}, {0x1F00,0x3B1}, {0x1F01,0x3B1}, {0x1F02,0x3B1}, {0x1F03,0x3B1}, {0x1F04,0x3B1},
    {0x1F05,0x3B1}, {0x1F06,0x3B1}, {0x1F07,0x3B1}, {0x1F08,0x391}, {0x1F09,0x391}, {0x1F0A,0x391},
    {0x1F0B,0x391}, {0x1F0C,0x391}, {0x1F0D,0x391}, {0x1F0E,0x391}, {0x1F0F,0x391}, {0x1F10,0x3B5},
    {0x1F11,0x3B5}, {0x1F12,0x3B5}, {0x1F13,0x3B5}, {0x1F14,0x3B5}, {0x1F15,0x3B5}, {0x1F18,0x395},
    {0x1F19,0x395}, {0x1F1A,0x395}, {0x1F1B,0x395}, {0x1F1C,0x395}, {0x1F1D,0x395}, {0x1F20,0x3B7},
    {0x1F21,0x3B7}, {0x1F22,0x3B7}, {0x1F23,0x3B7}, {0x1F24,0x3B7}, {0x1F25,0x3B7}, {0x1F26,0x3B7},
    {0x1F27,0x3B7}, {0x1F28,0x397}, {0x1F29,0x397}, {0x1F2A,0x397}, {0x1F2B,0x397}, {0x1F2C,0x397},
    {0x1F2D,0x397}, {0x1F2E,0x397}, {0x1F2F,0x397}, {0x1F30,0x3B9}, {0x1F31,0x3B9}, {0x1F32,0x3B9},
    {0x1F33,0x3B9}, {0x1F34,0x3B9}, {0x1F35,0x3B9}, {0x1F36,0x3B9}, {0x1F37,0x3B9}, {0x1F38,0x399},
    {0x1F39,0x399}, {0x1F3A,0x399}, {0x1F3B,0x399}, {0x1F3C,0x399}, {0x1F3D,0x399}, {0x1F3E,0x399},
    {0x1F3F,0x399}, {0x1F40,0x3BF}, {0x1F41,0x3BF}, {0x1F42,0x3BF}, {0x1F43,0x3BF}, {0x1F44,0x3BF},
    {0x1F45,0x3BF}, {0x1F48,0x39F}, {0x1F49,0x39F}, {0x1F4A,0x39F}, {0x1F4B,0x39F}, {0x1F4C,0x39F},
    {0x1F4D,0x39F}, {0x1F50,0x3C5}, {0x1F51,0x3C5}, {0x1F52,0x3C5}, {0x1F53,0x3C5}, {0x1F54,0x3C5},
    {0x1F55,0x3C5}, {0x1F56,0x3C5}, {0x1F57,0x3C5}, {0x1F59,0x3A5}, {0x1F5B,0x3A5}, {0x1F5D,0x3A5},
    {0x1F5F,0x3A5}, {0x1F60,0x3C9}, {0x1F61,0x3C9}, {0x1F62,0x3C9}, {0x1F63,0x3C9}, {0x1F64,0x3C9},
    {0x1F65,0x3C9}, {0x1F66,0x3C9}, {0x1F67,0x3C9}, {0x1F68,0x3A9}, {0x1F69,0x3A9}, {0x1F6A,0x3A9},
    {0x1F6B,0x3A9}, {0x1F6C,0x3A9}, {0x1F6D,0x3A9}, {0x1F6E,0x3A9}, {0x1F6F,0x3A9}, {0x1F70,0x3B1},
    {0x1F71,0x3B1}, {0x1F72,0x3B5}, {0x1F73,0x3B5}, {0x1F74,0x3B7}, {0x1F75,0x3B7}, {0x1F76,0x3B9},
    {0x1F77,0x3B9}, {0x1F78,0x3BF}, {0x1F79,0x3BF}, {0x1F7A,0x3C5}, {0x1F7B,0x3C5}, {0x1F7C,0x3C9},
    {0x1F7D,0x3C9}, {0x1F80,0x3B1}, {0x1F81,0x3B1}, {0x1F82,0x3B1}, {0x1F83,0x3B1}, {0x1F84,0x3B1},
    {0x1F85,0x3B1}, {0x1F86,0x3B1}, {0x1F87,0x3B1}, {0x1F88,0x391}, {0x1F89,0x391}, {0x1F8A,0x391},
    {0x1F8B,0x391}, {0x1F8C,0x391}, {0x1F8D,0x391}, {0x1F8E,0x391}, {0x1F8F,0x391}, {0x1F90,0x3B7},
    {0x1F91,0x3B7}, {0x1F92,0x3B7}, {0x1F93,0x3B7}, {0x1F94,0x3B7}, {0x1F95,0x3B7}, {0x1F96,0x3B7},
    {0x1F97,0x3B7}, {0x1F98,0x397}, {0x1F99,0x397}, {0x1F9A,0x397}, {0x1F9B,0x397}, {0x1F9C,0x397},
    {0x1F9D,0x397}, {0x1F9E,0x397}, {0x1F9F,0x397}, {0x1FA0,0x3C9}, {0x1FA1,0x3C9}, {0x1FA2,0x3C9},
    {0x1FA3,0x3C9}, {0x1FA4,0x3C9}, {0x1FA5,0x3C9}, {0x1FA6,0x3C9}, {0x1FA7,0x3C9}, {0x1FA8,0x3A9},
    {0x1FA9,0x3A9}, {0x1FAA,0x3A9}, {0x1FAB,0x3A9}, {0x1FAC,0x3A9}, {0x1FAD,0x3A9}, {0x1FAE,0x3A9},
    {0x1FAF,0x3A9}, {0x1FB0,0x3B1}, {0x1FB1,0x3B1}, {0x1FB2,0x3B1}, {0x1FB3,0x3B1}, {0x1FB4,0x3B1},
    {0x1FB6,0x3B1}, {0x1FB7,0x3B1}, {0x1FB8,0x391}, {0x1FB9,0x391}, {0x1FBA,0x391}, {0x1FBB,0x391},
    {0x1FBC,0x391}, {0x1FBE,0x3B9}, {0x1FC1,0xA8}, {0x1FC2,0x3B7}, {0x1FC3,0x3B7}, {0x1FC4,0x3B7},
    {0x1FC6,0x3B7}, {0x1FC7,0x3B7}, {0x1FC8,0x395}, {0x1FC9,0x395}, {0x1FCA,0x397}, {0x1FCB,0x397},
    {0x1FCC,0x397}, {0x1FCD,0x1FBF}, {0x1FCE,0x1FBF}, {0x1FCF,0x1FBF}, {0x1FD0,0x3B9},
    {0x1FD1,0x3B9}, {0x1FD2,0x3B9}, {0x1FD3,0x3B9}, {0x1FD6,0x3B9}, {0x1FD7,0x3B9}, {0x1FD8,0x399},
    {0x1FD9,0x399}, {0x1FDA,0x399}, {0x1FDB,0x399}, {0x1FDD,0x1FFE}, {0x1FDE,0x1FFE},
    {0x1FDF,0x1FFE}, {0x1FE0,0x3C5}, {0x1FE1,0x3C5}, {0x1FE2,0x3C5}, {0x1FE3,0x3C5}, {0x1FE4,0x3C1},
    {0x1FE5,0x3C1}, {0x1FE6,0x3C5}, {0x1FE7,0x3C5}, {0x1FE8,0x3A5}, {0x1FE9,0x3A5}, {0x1FEA,0x3A5},
    {0x1FEB,0x3A5}, {0x1FEC,0x3A1}, {0x1FED,0xA8}, {0x1FEE,0xA8}, {0x1FEF,0x60}, {0x1FF2,0x3C9},
    {0x1FF3,0x3C9}, {0x1FF4,0x3C9}, {0x1FF6,0x3C9}, {0x1FF7,0x3C9}, {0x1FF8,0x39F}, {0x1FF9,0x39F},
    {0x1FFA,0x3A9}, {0x1FFB,0x3A9}, {0x1FFC,0x3A9}, {0x1FFD,0xB4}, {0x2000,0x2002}, {0x2001,0x2003},
    {0x2126,0x3A9}, {0x212A,0x4B}, {0x212B,0x41}, {0x219A,0x2190}, {0x219B,0x2192}, {0x21AE,0x2194},
    {0x21CD,0x21D0}, {0x21CE,0x21D4}, {0x21CF,0x21D2}, {0x2204,0x2203}, {0x2209,0x2208},
    {0x220C,0x220B}, {0x2224,0x2223}, {0x2226,0x2225}, {0x2241,0x223C}, {0x2244,0x2243},
    {0x2247,0x2245}, {0x2249,0x2248}, {0x2260,0x3D}, {0x2262,0x2261}, {0x226D,0x224D},
    {0x226E,0x3C}, {0x226F,0x3E}, {0x2270,0x2264}, {0x2271,0x2265}, {0x2274,0x2272},
    {0x2275,0x2273}, {0x2278,0x2276}, {0x2279,0x2277}, {0x2280,0x227A}, {0x2281,0x227B},
    {0x2284,0x2282}, {0x2285,0x2283}, {0x2288,0x2286}, {0x2289,0x2287}, {0x22AC,0x22A2},
    {0x22AD,0x22A8}, {0x22AE,0x22A9}, {0x22AF,0x22AB}, {0x22E0,0x227C}, {0x22E1,0x227D},
    {0x22E2,0x2291}, {0x22E3,0x2292}, {0x22EA,0x22B2}, {0x22EB,0x22B3}, {0x22EC,0x22B4},
    {0x22ED,0x22B5}, {0x2329,0x3008}, {0x232A,0x3009}, {0x2ADC,0x2ADD}, {0x304C,0x304B},
    {0x304E,0x304D}, {0x3050,0x304F}, {0x3052,0x3051}, {0x3054,0x3053}, {0x3056,0x3055},
    {0x3058,0x3057}, {0x305A,0x3059}, {0x305C,0x305B}, {0x305E,0x305D}, {0x3060,0x305F},
    {0x3062,0x3061}, {0x3065,0x3064}, {0x3067,0x3066}, {0x3069,0x3068}, {0x3070,0x306F},
    {0x3071,0x306F}, {0x3073,0x3072}, {0x3074,0x3072}, {0x3076,0x3075}, {0x3077,0x3075},
    {0x3079,0x3078}, {0x307A,0x3078}, {0x307C,0x307B}, {0x307D,0x307B}, {0x3094,0x3046},
    {0x309E,0x309D}, {0x30AC,0x30AB}, {0x30AE,0x30AD}, {0x30B0,0x30AF}, {0x30B2,0x30B1},
    {0x30B4,0x30B3}, {0x30B6,0x30B5}, {0x30B8,0x30B7}, {0x30BA,0x30B9}, {0x30BC,0x30BB},
    {0x30BE,0x30BD}, {0x30C0,0x30BF}, {0x30C2,0x30C1}, {0x30C5,0x30C4}, {0x30C7,0x30C6},
    {0x30C9,0x30C8}, {0x30D0,0x30CF}, {0x30D1,0x30CF}, {0x30D3,0x30D2}, {0x30D4,0x30D2},
    {0x30D6,0x30D5}, {0x30D7,0x30D5}, {0x30D9,0x30D8}, {0x30DA,0x30D8}, {0x30DC,0x30DB},
    {0x30DD,0x30DB}, {0x30F4,0x30A6}, {0x30F7,0x30EF}, {0x30F8,0x30F0}, {0x30F9,0x30F1},
    {0x30FA,0x30F2}, {0x30FE,0x30FD}, {0xF900,0x8C48}, {0xF901,0x66F4}, {0xF902,0x8ECA},
    {0xF903,0x8CC8}, {0xF904,0x6ED1}, {0xF905,0x4E32}, {0xF906,0x53E5}, {0xF907,0x9F9C},
    {0xF908,0x9F9C}, {0xF909,0x5951}, {0xF90A,0x91D1}, {0xF90B,0x5587}, {0xF90C,0x5948},
    {0xF90D,0x61F6}, {0xF90E,0x7669}, {0xF90F,0x7F85}, {0xF910,0x863F}, {0xF911,0x87BA},
    {0xF912,0x88F8}, {0xF913,0x908F}, {0xF914,0x6A02}, {0xF915,0x6D1B}, {0xF916,0x70D9},
    {0xF917,0x73DE}, {0xF918,0x843D}, {0xF919,0x916A}, {0xF91A,0x99F1}, {0xF91B,0x4E82},
    {0xF91C,0x5375}, {0xF91D,0x6B04}, {0xF91E,0x721B}, {0xF91F,0x862D}, {0xF920,0x9E1E},
    {0xF921,0x5D50}, {0xF922,0x6FEB}, {0xF923,0x85CD}, {0xF924,0x8964}, {0xF925,0x62C9},
    {0xF926,0x81D8}, {0xF927,0x881F}, {0xF928,0x5ECA}, {0xF929,0x6717}, {0xF92A,0x6D6A},
    {0xF92B,0x72FC}, {0xF92C,0x90CE}, {0xF92D,0x4F86}, {0xF92E,0x51B7}, {0xF92F,0x52DE},
    {0xF930,0x64C4}, {0xF931,0x6AD3}, {0xF932,0x7210}, {0xF933,0x76E7}, {0xF934,0x8001},
    {0xF935,0x8606}, {0xF936,0x865C}, {0xF937,0x8DEF}, {0xF938,0x9732}, {0xF939,0x9B6F},
    {0xF93A,0x9DFA}, {0xF93B,0x788C}, {0xF93C,0x797F}, {0xF93D,0x7DA0}, {0xF93E,0x83C9},
    {0xF93F,0x9304}, {0xF940,0x9E7F}, {0xF941,0x8AD6}, {0xF942,0x58DF}, {0xF943,0x5F04},
    {0xF944,0x7C60}, {0xF945,0x807E}, {0xF946,0x7262}, {0xF947,0x78CA}, {0xF948,0x8CC2},
    {0xF949,0x96F7}, {0xF94A,0x58D8}, {0xF94B,0x5C62}, {0xF94C,0x6A13}, {0xF94D,0x6DDA},
    {0xF94E,0x6F0F}, {0xF94F,0x7D2F}, {0xF950,0x7E37}, {0xF951,0x964B}, {0xF952,0x52D2},
    {0xF953,0x808B}, {0xF954,0x51DC}, {0xF955,0x51CC}, {0xF956,0x7A1C}, {0xF957,0x7DBE},
    {0xF958,0x83F1}, {0xF959,0x9675}, {0xF95A,0x8B80}, {0xF95B,0x62CF}, {0xF95C,0x6A02},
    {0xF95D,0x8AFE}, {0xF95E,0x4E39}, {0xF95F,0x5BE7}, {0xF960,0x6012}, {0xF961,0x7387},
    {0xF962,0x7570}, {0xF963,0x5317}, {0xF964,0x78FB}, {0xF965,0x4FBF}, {0xF966,0x5FA9},
    {0xF967,0x4E0D}, {0xF968,0x6CCC}, {0xF969,0x6578}, {0xF96A,0x7D22}, {0xF96B,0x53C3},
    {0xF96C,0x585E}, {0xF96D,0x7701}, {0xF96E,0x8449}, {0xF96F,0x8AAA}, {0xF970,0x6BBA},
    {0xF971,0x8FB0}, {0xF972,0x6C88}, {0xF973,0x62FE}, {0xF974,0x82E5}, {0xF975,0x63A0},
    {0xF976,0x7565}, {0xF977,0x4EAE}, {0xF978,0x5169}, {0xF979,0x51C9}, {0xF97A,0x6881},
    {0xF97B,0x7CE7}, {0xF97C,0x826F}, {0xF97D,0x8AD2}, {0xF97E,0x91CF}, {0xF97F,0x52F5},
    {0xF980,0x5442}, {0xF981,0x5973}, {0xF982,0x5EEC}, {0xF983,0x65C5}, {0xF984,0x6FFE},
    {0xF985,0x792A}, {0xF986,0x95AD}, {0xF987,0x9A6A}, {0xF988,0x9E97}, {0xF989,0x9ECE},
    {0xF98A,0x529B}, {0xF98B,0x66C6}, {0xF98C,0x6B77}, {0xF98D,0x8F62}, {0xF98E,0x5E74},
    {0xF98F,0x6190}, {0xF990,0x6200}, {0xF991,0x649A}, {0xF992,0x6F23}, {0xF993,0x7149},
    {0xF994,0x7489}, {0xF995,0x79CA}, {0xF996,0x7DF4}, {0xF997,0x806F}, {0xF998,0x8F26},
    {0xF999,0x84EE}, {0xF99A,0x9023}, {0xF99B,0x934A}, {0xF99C,0x5217}, {0xF99D,0x52A3},
    {0xF99E,0x54BD}, {0xF99F,0x70C8}, {0xF9A0,0x88C2}, {0xF9A1,0x8AAA}, {0xF9A2,0x5EC9},
    {0xF9A3,0x5FF5}, {0xF9A4,0x637B}, {0xF9A5,0x6BAE}, {0xF9A6,0x7C3E}, {0xF9A7,0x7375},
    {0xF9A8,0x4EE4}, {0xF9A9,0x56F9}, {0xF9AA,0x5BE7}, {0xF9AB,0x5DBA}, {0xF9AC,0x601C},
    {0xF9AD,0x73B2}, {0xF9AE,0x7469}, {0xF9AF,0x7F9A}, {0xF9B0,0x8046}, {0xF9B1,0x9234},
    {0xF9B2,0x96F6}, {0xF9B3,0x9748}, {0xF9B4,0x9818}, {0xF9B5,0x4F8B}, {0xF9B6,0x79AE},
    {0xF9B7,0x91B4}, {0xF9B8,0x96B8}, {0xF9B9,0x60E1}, {0xF9BA,0x4E86}, {0xF9BB,0x50DA},
    {0xF9BC,0x5BEE}, {0xF9BD,0x5C3F}, {0xF9BE,0x6599}, {0xF9BF,0x6A02}, {0xF9C0,0x71CE},
    {0xF9C1,0x7642}, {0xF9C2,0x84FC}, {0xF9C3,0x907C}, {0xF9C4,0x9F8D}, {0xF9C5,0x6688},
    {0xF9C6,0x962E}, {0xF9C7,0x5289}, {0xF9C8,0x677B}, {0xF9C9,0x67F3}, {0xF9CA,0x6D41},
    {0xF9CB,0x6E9C}, {0xF9CC,0x7409}, {0xF9CD,0x7559}, {0xF9CE,0x786B}, {0xF9CF,0x7D10},
    {0xF9D0,0x985E}, {0xF9D1,0x516D}, {0xF9D2,0x622E}, {0xF9D3,0x9678}, {0xF9D4,0x502B},
    {0xF9D5,0x5D19}, {0xF9D6,0x6DEA}, {0xF9D7,0x8F2A}, {0xF9D8,0x5F8B}, {0xF9D9,0x6144},
    {0xF9DA,0x6817}, {0xF9DB,0x7387}, {0xF9DC,0x9686}, {0xF9DD,0x5229}, {0xF9DE,0x540F},
    {0xF9DF,0x5C65}, {0xF9E0,0x6613}, {0xF9E1,0x674E}, {0xF9E2,0x68A8}, {0xF9E3,0x6CE5},
    {0xF9E4,0x7406}, {0xF9E5,0x75E2}, {0xF9E6,0x7F79}, {0xF9E7,0x88CF}, {0xF9E8,0x88E1},
    {0xF9E9,0x91CC}, {0xF9EA,0x96E2}, {0xF9EB,0x533F}, {0xF9EC,0x6EBA}, {0xF9ED,0x541D},
    {0xF9EE,0x71D0}, {0xF9EF,0x7498}, {0xF9F0,0x85FA}, {0xF9F1,0x96A3}, {0xF9F2,0x9C57},
    {0xF9F3,0x9E9F}, {0xF9F4,0x6797}, {0xF9F5,0x6DCB}, {0xF9F6,0x81E8}, {0xF9F7,0x7ACB},
    {0xF9F8,0x7B20}, {0xF9F9,0x7C92}, {0xF9FA,0x72C0}, {0xF9FB,0x7099}, {0xF9FC,0x8B58},
    {0xF9FD,0x4EC0}, {0xF9FE,0x8336}, {0xF9FF,0x523A}, {0xFA00,0x5207}, {0xFA01,0x5EA6},
    {0xFA02,0x62D3}, {0xFA03,0x7CD6}, {0xFA04,0x5B85}, {0xFA05,0x6D1E}, {0xFA06,0x66B4},
    {0xFA07,0x8F3B}, {0xFA08,0x884C}, {0xFA09,0x964D}, {0xFA0A,0x898B}, {0xFA0B,0x5ED3},
    {0xFA0C,0x5140}, {0xFA0D,0x55C0}, {0xFA10,0x585A}, {0xFA12,0x6674}, {0xFA15,0x51DE},
    {0xFA16,0x732A}, {0xFA17,0x76CA}, {0xFA18,0x793C}, {0xFA19,0x795E}, {0xFA1A,0x7965},
    {0xFA1B,0x798F}, {0xFA1C,0x9756}, {0xFA1D,0x7CBE}, {0xFA1E,0x7FBD}, {0xFA20,0x8612},
    {0xFA22,0x8AF8}, {0xFA25,0x9038}, {0xFA26,0x90FD}, {0xFA2A,0x98EF}, {0xFA2B,0x98FC},
    {0xFA2C,0x9928}, {0xFA2D,0x9DB4}, {0xFA2E,0x90DE}, {0xFA2F,0x96B7}, {0xFA30,0x4FAE},
    {0xFA31,0x50E7}, {0xFA32,0x514D}, {0xFA33,0x52C9}, {0xFA34,0x52E4}, {0xFA35,0x5351},
    {0xFA36,0x559D}, {0xFA37,0x5606}, {0xFA38,0x5668}, {0xFA39,0x5840}, {0xFA3A,0x58A8},
    {0xFA3B,0x5C64}, {0xFA3C,0x5C6E}, {0xFA3D,0x6094}, {0xFA3E,0x6168}, {0xFA3F,0x618E},
    {0xFA40,0x61F2}, {0xFA41,0x654F}, {0xFA42,0x65E2}, {0xFA43,0x6691}, {0xFA44,0x6885},
    {0xFA45,0x6D77}, {0xFA46,0x6E1A}, {0xFA47,0x6F22}, {0xFA48,0x716E}, {0xFA49,0x722B},
    {0xFA4A,0x7422}, {0xFA4B,0x7891}, {0xFA4C,0x793E}, {0xFA4D,0x7949}, {0xFA4E,0x7948},
    {0xFA4F,0x7950}, {0xFA50,0x7956}, {0xFA51,0x795D}, {0xFA52,0x798D}, {0xFA53,0x798E},
    {0xFA54,0x7A40}, {0xFA55,0x7A81}, {0xFA56,0x7BC0}, {0xFA57,0x7DF4}, {0xFA58,0x7E09},
    {0xFA59,0x7E41}, {0xFA5A,0x7F72}, {0xFA5B,0x8005}, {0xFA5C,0x81ED}, {0xFA5D,0x8279},
    {0xFA5E,0x8279}, {0xFA5F,0x8457}, {0xFA60,0x8910}, {0xFA61,0x8996}, {0xFA62,0x8B01},
    {0xFA63,0x8B39}, {0xFA64,0x8CD3}, {0xFA65,0x8D08}, {0xFA66,0x8FB6}, {0xFA67,0x9038},
    {0xFA68,0x96E3}, {0xFA69,0x97FF}, {0xFA6A,0x983B}, {0xFA6B,0x6075}, {0xFA6C,0x242EE},
    {0xFA6D,0x8218}, {0xFA70,0x4E26}, {0xFA71,0x51B5}, {0xFA72,0x5168}, {0xFA73,0x4F80},
    {0xFA74,0x5145}, {0xFA75,0x5180}, {0xFA76,0x52C7}, {0xFA77,0x52FA}, {0xFA78,0x559D},
    {0xFA79,0x5555}, {0xFA7A,0x5599}, {0xFA7B,0x55E2}, {0xFA7C,0x585A}, {0xFA7D,0x58B3},
    {0xFA7E,0x5944}, {0xFA7F,0x5954}, {0xFA80,0x5A62}, {0xFA81,0x5B28}, {0xFA82,0x5ED2},
    {0xFA83,0x5ED9}, {0xFA84,0x5F69}, {0xFA85,0x5FAD}, {0xFA86,0x60D8}, {0xFA87,0x614E},
    {0xFA88,0x6108}, {0xFA89,0x618E}, {0xFA8A,0x6160}, {0xFA8B,0x61F2}, {0xFA8C,0x6234},
    {0xFA8D,0x63C4}, {0xFA8E,0x641C}, {0xFA8F,0x6452}, {0xFA90,0x6556}, {0xFA91,0x6674},
    {0xFA92,0x6717}, {0xFA93,0x671B}, {0xFA94,0x6756}, {0xFA95,0x6B79}, {0xFA96,0x6BBA},
    {0xFA97,0x6D41}, {0xFA98,0x6EDB}, {0xFA99,0x6ECB}, {0xFA9A,0x6F22}, {0xFA9B,0x701E},
    {0xFA9C,0x716E}, {0xFA9D,0x77A7}, {0xFA9E,0x7235}, {0xFA9F,0x72AF}, {0xFAA0,0x732A},
    {0xFAA1,0x7471}, {0xFAA2,0x7506}, {0xFAA3,0x753B}, {0xFAA4,0x761D}, {0xFAA5,0x761F},
    {0xFAA6,0x76CA}, {0xFAA7,0x76DB}, {0xFAA8,0x76F4}, {0xFAA9,0x774A}, {0xFAAA,0x7740},
    {0xFAAB,0x78CC}, {0xFAAC,0x7AB1}, {0xFAAD,0x7BC0}, {0xFAAE,0x7C7B}, {0xFAAF,0x7D5B},
    {0xFAB0,0x7DF4}, {0xFAB1,0x7F3E}, {0xFAB2,0x8005}, {0xFAB3,0x8352}, {0xFAB4,0x83EF},
    {0xFAB5,0x8779}, {0xFAB6,0x8941}, {0xFAB7,0x8986}, {0xFAB8,0x8996}, {0xFAB9,0x8ABF},
    {0xFABA,0x8AF8}, {0xFABB,0x8ACB}, {0xFABC,0x8B01}, {0xFABD,0x8AFE}, {0xFABE,0x8AED},
    {0xFABF,0x8B39}, {0xFAC0,0x8B8A}, {0xFAC1,0x8D08}, {0xFAC2,0x8F38}, {0xFAC3,0x9072},
    {0xFAC4,0x9199}, {0xFAC5,0x9276}, {0xFAC6,0x967C}, {0xFAC7,0x96E3}, {0xFAC8,0x9756},
    {0xFAC9,0x97DB}, {0xFACA,0x97FF}, {0xFACB,0x980B}, {0xFACC,0x983B}, {0xFACD,0x9B12},
    {0xFACE,0x9F9C}, {0xFACF,0x2284A}, {0xFAD0,0x22844}, {0xFAD1,0x233D5}, {0xFAD2,0x3B9D},
    {0xFAD3,0x4018}, {0xFAD4,0x4039}, {0xFAD5,0x25249}, {0xFAD6,0x25CD0}, {0xFAD7,0x27ED3},
    {0xFAD8,0x9F43}, {0xFAD9,0x9F8E}, {0xFB1D,0x5D9}, {0xFB1F,0x5F2}, {0xFB2A,0x5E9},
    {0xFB2B,0x5E9}, {0xFB2C,0x5E9}, {0xFB2D,0x5E9}, {0xFB2E,0x5D0}, {0xFB2F,0x5D0}, {0xFB30,0x5D0},
    {0xFB31,0x5D1}, {0xFB32,0x5D2}, {0xFB33,0x5D3}, {0xFB34,0x5D4}, {0xFB35,0x5D5}, {0xFB36,0x5D6},
    {0xFB38,0x5D8}, {0xFB39,0x5D9}, {0xFB3A,0x5DA}, {0xFB3B,0x5DB}, {0xFB3C,0x5DC}, {0xFB3E,0x5DE},
    {0xFB40,0x5E0}, {0xFB41,0x5E1}, {0xFB43,0x5E3}, {0xFB44,0x5E4}, {0xFB46,0x5E6}, {0xFB47,0x5E7},
    {0xFB48,0x5E8}, {0xFB49,0x5E9}, {0xFB4A,0x5EA}, {0xFB4B,0x5D5}, {0xFB4C,0x5D1}, {0xFB4D,0x5DB},
    {0xFB4E,0x5E4}, {0x1109A,0x11099}, {0x1109C,0x1109B}, {0x110AB,0x110A5}, {0x114BB,0x114B9},
    {0x2F800,0x4E3D}, {0x2F801,0x4E38}, {0x2F802,0x4E41}, {0x2F803,0x20122}, {0x2F804,0x4F60},
    {0x2F805,0x4FAE}, {0x2F806,0x4FBB}, {0x2F807,0x5002}, {0x2F808,0x507A}, {0x2F809,0x5099},
    {0x2F80A,0x50E7}, {0x2F80B,0x50CF}, {0x2F80C,0x349E}, {0x2F80D,0x2063A}, {0x2F80E,0x514D},
    {0x2F80F,0x5154}, {0x2F810,0x5164}, {0x2F811,0x5177}, {0x2F812,0x2051C}, {0x2F813,0x34B9},
    {0x2F814,0x5167}, {0x2F815,0x518D}, {0x2F816,0x2054B}, {0x2F817,0x5197}, {0x2F818,0x51A4},
    {0x2F819,0x4ECC}, {0x2F81A,0x51AC}, {0x2F81B,0x51B5}, {0x2F81C,0x291DF}, {0x2F81D,0x51F5},
    {0x2F81E,0x5203}, {0x2F81F,0x34DF}, {0x2F820,0x523B}, {0x2F821,0x5246}, {0x2F822,0x5272},
    {0x2F823,0x5277}, {0x2F824,0x3515}, {0x2F825,0x52C7}, {0x2F826,0x52C9}, {0x2F827,0x52E4},
    {0x2F828,0x52FA}, {0x2F829,0x5305}, {0x2F82A,0x5306}, {0x2F82B,0x5317}, {0x2F82C,0x5349},
    {0x2F82D,0x5351}, {0x2F82E,0x535A}, {0x2F82F,0x5373}, {0x2F830,0x537D}, {0x2F831,0x537F},
    {0x2F832,0x537F}, {0x2F833,0x537F}, {0x2F834,0x20A2C}, {0x2F835,0x7070}, {0x2F836,0x53CA},
    {0x2F837,0x53DF}, {0x2F838,0x20B63}, {0x2F839,0x53EB}, {0x2F83A,0x53F1}, {0x2F83B,0x5406},
    {0x2F83C,0x549E}, {0x2F83D,0x5438}, {0x2F83E,0x5448}, {0x2F83F,0x5468}, {0x2F840,0x54A2},
    {0x2F841,0x54F6}, {0x2F842,0x5510}, {0x2F843,0x5553}, {0x2F844,0x5563}, {0x2F845,0x5584},
    {0x2F846,0x5584}, {0x2F847,0x5599}, {0x2F848,0x55AB}, {0x2F849,0x55B3}, {0x2F84A,0x55C2},
    {0x2F84B,0x5716}, {0x2F84C,0x5606}, {0x2F84D,0x5717}, {0x2F84E,0x5651}, {0x2F84F,0x5674},
    {0x2F850,0x5207}, {0x2F851,0x58EE}, {0x2F852,0x57CE}, {0x2F853,0x57F4}, {0x2F854,0x580D},
    {0x2F855,0x578B}, {0x2F856,0x5832}, {0x2F857,0x5831}, {0x2F858,0x58AC}, {0x2F859,0x214E4},
    {0x2F85A,0x58F2}, {0x2F85B,0x58F7}, {0x2F85C,0x5906}, {0x2F85D,0x591A}, {0x2F85E,0x5922},
    {0x2F85F,0x5962}, {0x2F860,0x216A8}, {0x2F861,0x216EA}, {0x2F862,0x59EC}, {0x2F863,0x5A1B},
    {0x2F864,0x5A27}, {0x2F865,0x59D8}, {0x2F866,0x5A66}, {0x2F867,0x36EE}, {0x2F868,0x36FC},
    {0x2F869,0x5B08}, {0x2F86A,0x5B3E}, {0x2F86B,0x5B3E}, {0x2F86C,0x219C8}, {0x2F86D,0x5BC3},
    {0x2F86E,0x5BD8}, {0x2F86F,0x5BE7}, {0x2F870,0x5BF3}, {0x2F871,0x21B18}, {0x2F872,0x5BFF},
    {0x2F873,0x5C06}, {0x2F874,0x5F53}, {0x2F875,0x5C22}, {0x2F876,0x3781}, {0x2F877,0x5C60},
    {0x2F878,0x5C6E}, {0x2F879,0x5CC0}, {0x2F87A,0x5C8D}, {0x2F87B,0x21DE4}, {0x2F87C,0x5D43},
    {0x2F87D,0x21DE6}, {0x2F87E,0x5D6E}, {0x2F87F,0x5D6B}, {0x2F880,0x5D7C}, {0x2F881,0x5DE1},
    {0x2F882,0x5DE2}, {0x2F883,0x382F}, {0x2F884,0x5DFD}, {0x2F885,0x5E28}, {0x2F886,0x5E3D},
    {0x2F887,0x5E69}, {0x2F888,0x3862}, {0x2F889,0x22183}, {0x2F88A,0x387C}, {0x2F88B,0x5EB0},
    {0x2F88C,0x5EB3}, {0x2F88D,0x5EB6}, {0x2F88E,0x5ECA}, {0x2F88F,0x2A392}, {0x2F890,0x5EFE},
    {0x2F891,0x22331}, {0x2F892,0x22331}, {0x2F893,0x8201}, {0x2F894,0x5F22}, {0x2F895,0x5F22},
    {0x2F896,0x38C7}, {0x2F897,0x232B8}, {0x2F898,0x261DA}, {0x2F899,0x5F62}, {0x2F89A,0x5F6B},
    {0x2F89B,0x38E3}, {0x2F89C,0x5F9A}, {0x2F89D,0x5FCD}, {0x2F89E,0x5FD7}, {0x2F89F,0x5FF9},
    {0x2F8A0,0x6081}, {0x2F8A1,0x393A}, {0x2F8A2,0x391C}, {0x2F8A3,0x6094}, {0x2F8A4,0x226D4},
    {0x2F8A5,0x60C7}, {0x2F8A6,0x6148}, {0x2F8A7,0x614C}, {0x2F8A8,0x614E}, {0x2F8A9,0x614C},
    {0x2F8AA,0x617A}, {0x2F8AB,0x618E}, {0x2F8AC,0x61B2}, {0x2F8AD,0x61A4}, {0x2F8AE,0x61AF},
    {0x2F8AF,0x61DE}, {0x2F8B0,0x61F2}, {0x2F8B1,0x61F6}, {0x2F8B2,0x6210}, {0x2F8B3,0x621B},
    {0x2F8B4,0x625D}, {0x2F8B5,0x62B1}, {0x2F8B6,0x62D4}, {0x2F8B7,0x6350}, {0x2F8B8,0x22B0C},
    {0x2F8B9,0x633D}, {0x2F8BA,0x62FC}, {0x2F8BB,0x6368}, {0x2F8BC,0x6383}, {0x2F8BD,0x63E4},
    {0x2F8BE,0x22BF1}, {0x2F8BF,0x6422}, {0x2F8C0,0x63C5}, {0x2F8C1,0x63A9}, {0x2F8C2,0x3A2E},
    {0x2F8C3,0x6469}, {0x2F8C4,0x647E}, {0x2F8C5,0x649D}, {0x2F8C6,0x6477}, {0x2F8C7,0x3A6C},
    {0x2F8C8,0x654F}, {0x2F8C9,0x656C}, {0x2F8CA,0x2300A}, {0x2F8CB,0x65E3}, {0x2F8CC,0x66F8},
    {0x2F8CD,0x6649}, {0x2F8CE,0x3B19}, {0x2F8CF,0x6691}, {0x2F8D0,0x3B08}, {0x2F8D1,0x3AE4},
    {0x2F8D2,0x5192}, {0x2F8D3,0x5195}, {0x2F8D4,0x6700}, {0x2F8D5,0x669C}, {0x2F8D6,0x80AD},
    {0x2F8D7,0x43D9}, {0x2F8D8,0x6717}, {0x2F8D9,0x671B}, {0x2F8DA,0x6721}, {0x2F8DB,0x675E},
    {0x2F8DC,0x6753}, {0x2F8DD,0x233C3}, {0x2F8DE,0x3B49}, {0x2F8DF,0x67FA}, {0x2F8E0,0x6785},
    {0x2F8E1,0x6852}, {0x2F8E2,0x6885}, {0x2F8E3,0x2346D}, {0x2F8E4,0x688E}, {0x2F8E5,0x681F},
    {0x2F8E6,0x6914}, {0x2F8E7,0x3B9D}, {0x2F8E8,0x6942}, {0x2F8E9,0x69A3}, {0x2F8EA,0x69EA},
    {0x2F8EB,0x6AA8}, {0x2F8EC,0x236A3}, {0x2F8ED,0x6ADB}, {0x2F8EE,0x3C18}, {0x2F8EF,0x6B21},
    {0x2F8F0,0x238A7}, {0x2F8F1,0x6B54}, {0x2F8F2,0x3C4E}, {0x2F8F3,0x6B72}, {0x2F8F4,0x6B9F},
    {0x2F8F5,0x6BBA}, {0x2F8F6,0x6BBB}, {0x2F8F7,0x23A8D}, {0x2F8F8,0x21D0B}, {0x2F8F9,0x23AFA},
    {0x2F8FA,0x6C4E}, {0x2F8FB,0x23CBC}, {0x2F8FC,0x6CBF}, {0x2F8FD,0x6CCD}, {0x2F8FE,0x6C67},
    {0x2F8FF,0x6D16}, {0x2F900,0x6D3E}, {0x2F901,0x6D77}, {0x2F902,0x6D41}, {0x2F903,0x6D69},
    {0x2F904,0x6D78}, {0x2F905,0x6D85}, {0x2F906,0x23D1E}, {0x2F907,0x6D34}, {0x2F908,0x6E2F},
    {0x2F909,0x6E6E}, {0x2F90A,0x3D33}, {0x2F90B,0x6ECB}, {0x2F90C,0x6EC7}, {0x2F90D,0x23ED1},
    {0x2F90E,0x6DF9}, {0x2F90F,0x6F6E}, {0x2F910,0x23F5E}, {0x2F911,0x23F8E}, {0x2F912,0x6FC6},
    {0x2F913,0x7039}, {0x2F914,0x701E}, {0x2F915,0x701B}, {0x2F916,0x3D96}, {0x2F917,0x704A},
    {0x2F918,0x707D}, {0x2F919,0x7077}, {0x2F91A,0x70AD}, {0x2F91B,0x20525}, {0x2F91C,0x7145},
    {0x2F91D,0x24263}, {0x2F91E,0x719C}, {0x2F91F,0x243AB}, {0x2F920,0x7228}, {0x2F921,0x7235},
    {0x2F922,0x7250}, {0x2F923,0x24608}, {0x2F924,0x7280}, {0x2F925,0x7295}, {0x2F926,0x24735},
    {0x2F927,0x24814}, {0x2F928,0x737A}, {0x2F929,0x738B}, {0x2F92A,0x3EAC}, {0x2F92B,0x73A5},
    {0x2F92C,0x3EB8}, {0x2F92D,0x3EB8}, {0x2F92E,0x7447}, {0x2F92F,0x745C}, {0x2F930,0x7471},
    {0x2F931,0x7485}, {0x2F932,0x74CA}, {0x2F933,0x3F1B}, {0x2F934,0x7524}, {0x2F935,0x24C36},
    {0x2F936,0x753E}, {0x2F937,0x24C92}, {0x2F938,0x7570}, {0x2F939,0x2219F}, {0x2F93A,0x7610},
    {0x2F93B,0x24FA1}, {0x2F93C,0x24FB8}, {0x2F93D,0x25044}, {0x2F93E,0x3FFC}, {0x2F93F,0x4008},
    {0x2F940,0x76F4}, {0x2F941,0x250F3}, {0x2F942,0x250F2}, {0x2F943,0x25119}, {0x2F944,0x25133},
    {0x2F945,0x771E}, {0x2F946,0x771F}, {0x2F947,0x771F}, {0x2F948,0x774A}, {0x2F949,0x4039},
    {0x2F94A,0x778B}, {0x2F94B,0x4046}, {0x2F94C,0x4096}, {0x2F94D,0x2541D}, {0x2F94E,0x784E},
    {0x2F94F,0x788C}, {0x2F950,0x78CC}, {0x2F951,0x40E3}, {0x2F952,0x25626}, {0x2F953,0x7956},
    {0x2F954,0x2569A}, {0x2F955,0x256C5}, {0x2F956,0x798F}, {0x2F957,0x79EB}, {0x2F958,0x412F},
    {0x2F959,0x7A40}, {0x2F95A,0x7A4A}, {0x2F95B,0x7A4F}, {0x2F95C,0x2597C}, {0x2F95D,0x25AA7},
    {0x2F95E,0x25AA7}, {0x2F95F,0x7AEE}, {0x2F960,0x4202}, {0x2F961,0x25BAB}, {0x2F962,0x7BC6},
    {0x2F963,0x7BC9}, {0x2F964,0x4227}, {0x2F965,0x25C80}, {0x2F966,0x7CD2}, {0x2F967,0x42A0},
    {0x2F968,0x7CE8}, {0x2F969,0x7CE3}, {0x2F96A,0x7D00}, {0x2F96B,0x25F86}, {0x2F96C,0x7D63},
    {0x2F96D,0x4301}, {0x2F96E,0x7DC7}, {0x2F96F,0x7E02}, {0x2F970,0x7E45}, {0x2F971,0x4334},
    {0x2F972,0x26228}, {0x2F973,0x26247}, {0x2F974,0x4359}, {0x2F975,0x262D9}, {0x2F976,0x7F7A},
    {0x2F977,0x2633E}, {0x2F978,0x7F95}, {0x2F979,0x7FFA}, {0x2F97A,0x8005}, {0x2F97B,0x264DA},
    {0x2F97C,0x26523}, {0x2F97D,0x8060}, {0x2F97E,0x265A8}, {0x2F97F,0x8070}, {0x2F980,0x2335F},
    {0x2F981,0x43D5}, {0x2F982,0x80B2}, {0x2F983,0x8103}, {0x2F984,0x440B}, {0x2F985,0x813E},
    {0x2F986,0x5AB5}, {0x2F987,0x267A7}, {0x2F988,0x267B5}, {0x2F989,0x23393}, {0x2F98A,0x2339C},
    {0x2F98B,0x8201}, {0x2F98C,0x8204}, {0x2F98D,0x8F9E}, {0x2F98E,0x446B}, {0x2F98F,0x8291},
    {0x2F990,0x828B}, {0x2F991,0x829D}, {0x2F992,0x52B3}, {0x2F993,0x82B1}, {0x2F994,0x82B3},
    {0x2F995,0x82BD}, {0x2F996,0x82E6}, {0x2F997,0x26B3C}, {0x2F998,0x82E5}, {0x2F999,0x831D},
    {0x2F99A,0x8363}, {0x2F99B,0x83AD}, {0x2F99C,0x8323}, {0x2F99D,0x83BD}, {0x2F99E,0x83E7},
    {0x2F99F,0x8457}, {0x2F9A0,0x8353}, {0x2F9A1,0x83CA}, {0x2F9A2,0x83CC}, {0x2F9A3,0x83DC},
    {0x2F9A4,0x26C36}, {0x2F9A5,0x26D6B}, {0x2F9A6,0x26CD5}, {0x2F9A7,0x452B}, {0x2F9A8,0x84F1},
    {0x2F9A9,0x84F3}, {0x2F9AA,0x8516}, {0x2F9AB,0x273CA}, {0x2F9AC,0x8564}, {0x2F9AD,0x26F2C},
    {0x2F9AE,0x455D}, {0x2F9AF,0x4561}, {0x2F9B0,0x26FB1}, {0x2F9B1,0x270D2}, {0x2F9B2,0x456B},
    {0x2F9B3,0x8650}, {0x2F9B4,0x865C}, {0x2F9B5,0x8667}, {0x2F9B6,0x8669}, {0x2F9B7,0x86A9},
    {0x2F9B8,0x8688}, {0x2F9B9,0x870E}, {0x2F9BA,0x86E2}, {0x2F9BB,0x8779}, {0x2F9BC,0x8728},
    {0x2F9BD,0x876B}, {0x2F9BE,0x8786}, {0x2F9BF,0x45D7}, {0x2F9C0,0x87E1}, {0x2F9C1,0x8801},
    {0x2F9C2,0x45F9}, {0x2F9C3,0x8860}, {0x2F9C4,0x8863}, {0x2F9C5,0x27667}, {0x2F9C6,0x88D7},
    {0x2F9C7,0x88DE}, {0x2F9C8,0x4635}, {0x2F9C9,0x88FA}, {0x2F9CA,0x34BB}, {0x2F9CB,0x278AE},
    {0x2F9CC,0x27966}, {0x2F9CD,0x46BE}, {0x2F9CE,0x46C7}, {0x2F9CF,0x8AA0}, {0x2F9D0,0x8AED},
    {0x2F9D1,0x8B8A}, {0x2F9D2,0x8C55}, {0x2F9D3,0x27CA8}, {0x2F9D4,0x8CAB}, {0x2F9D5,0x8CC1},
    {0x2F9D6,0x8D1B}, {0x2F9D7,0x8D77}, {0x2F9D8,0x27F2F}, {0x2F9D9,0x20804}, {0x2F9DA,0x8DCB},
    {0x2F9DB,0x8DBC}, {0x2F9DC,0x8DF0}, {0x2F9DD,0x208DE}, {0x2F9DE,0x8ED4}, {0x2F9DF,0x8F38},
    {0x2F9E0,0x285D2}, {0x2F9E1,0x285ED}, {0x2F9E2,0x9094}, {0x2F9E3,0x90F1}, {0x2F9E4,0x9111},
    {0x2F9E5,0x2872E}, {0x2F9E6,0x911B}, {0x2F9E7,0x9238}, {0x2F9E8,0x92D7}, {0x2F9E9,0x92D8},
    {0x2F9EA,0x927C}, {0x2F9EB,0x93F9}, {0x2F9EC,0x9415}, {0x2F9ED,0x28BFA}, {0x2F9EE,0x958B},
    {0x2F9EF,0x4995}, {0x2F9F0,0x95B7}, {0x2F9F1,0x28D77}, {0x2F9F2,0x49E6}, {0x2F9F3,0x96C3},
    {0x2F9F4,0x5DB2}, {0x2F9F5,0x9723}, {0x2F9F6,0x29145}, {0x2F9F7,0x2921A}, {0x2F9F8,0x4A6E},
    {0x2F9F9,0x4A76}, {0x2F9FA,0x97E0}, {0x2F9FB,0x2940A}, {0x2F9FC,0x4AB2}, {0x2F9FD,0x29496},
    {0x2F9FE,0x980B}, {0x2F9FF,0x980B}, {0x2FA00,0x9829}, {0x2FA01,0x295B6}, {0x2FA02,0x98E2},
    {0x2FA03,0x4B33}, {0x2FA04,0x9929}, {0x2FA05,0x99A7}, {0x2FA06,0x99C2}, {0x2FA07,0x99FE},
    {0x2FA08,0x4BCE}, {0x2FA09,0x29B30}, {0x2FA0A,0x9B12}, {0x2FA0B,0x9C40}, {0x2FA0C,0x9CFD},
    {0x2FA0D,0x4CCE}, {0x2FA0E,0x4CED}, {0x2FA0F,0x9D67}, {0x2FA10,0x2A0CE}, {0x2FA11,0x4CF8},
    {0x2FA12,0x2A105}, {0x2FA13,0x2A20E}, {0x2FA14,0x2A291}, {0x2FA15,0x9EBB}, {0x2FA16,0x4D56},
    {0x2FA17,0x9EF9}, {0x2FA18,0x9EFE}, {0x2FA19,0x9F05}, {0x2FA1A,0x9F0F}, {0x2FA1B,0x9F16},
    {0x2FA1C,0x9F3B}, {0x2FA1D,0x2A600},
};
/* strip_accents, two or three characters: {c, out...} (0: none); Hangul syllables are computed */
static const uint32_t wp__stripn[42][4] = {
    {0x9CB,0x9C7,0x9BE,0x0}, {0x9CC,0x9C7,0x9D7,0x0}, {0xB4B,0xB47,0xB3E,0x0},
    {0xB4C,0xB47,0xB57,0x0}, {0xB94,0xB92,0xBD7,0x0}, {0xBCA,0xBC6,0xBBE,0x0},
    {0xBCB,0xBC7,0xBBE,0x0}, {0xBCC,0xBC6,0xBD7,0x0}, {0xCCB,0xCC2,0xCD5,0x0},
    {0xD4A,0xD46,0xD3E,0x0}, {0xD4B,0xD47,0xD3E,0x0}, {0xD4C,0xD46,0xD57,0x0},
    {0xDDC,0xDD9,0xDCF,0x0}, {0xDDD,0xDD9,0xDCF,0x0}, {0xDDE,0xDD9,0xDDF,0x0},
    {0x1B06,0x1B05,0x1B35,0x0}, {0x1B08,0x1B07,0x1B35,0x0}, {0x1B0A,0x1B09,0x1B35,0x0},
    {0x1B0C,0x1B0B,0x1B35,0x0}, {0x1B0E,0x1B0D,0x1B35,0x0}, {0x1B12,0x1B11,0x1B35,0x0},
    {0x1B40,0x1B3E,0x1B35,0x0}, {0x1B41,0x1B3F,0x1B35,0x0}, {0x1134B,0x11347,0x1133E,0x0},
    {0x1134C,0x11347,0x11357,0x0}, {0x114BC,0x114B9,0x114B0,0x0}, {0x114BE,0x114B9,0x114BD,0x0},
    {0x115BA,0x115B8,0x115AF,0x0}, {0x115BB,0x115B9,0x115AF,0x0}, {0x1D15E,0x1D157,0x1D165,0x0},
    {0x1D15F,0x1D158,0x1D165,0x0}, {0x1D160,0x1D158,0x1D165,0x1D16E},
    {0x1D161,0x1D158,0x1D165,0x1D16F}, {0x1D162,0x1D158,0x1D165,0x1D170},
    {0x1D163,0x1D158,0x1D165,0x1D171}, {0x1D164,0x1D158,0x1D165,0x1D172},
    {0x1D1BB,0x1D1B9,0x1D165,0x0}, {0x1D1BC,0x1D1BA,0x1D165,0x0}, {0x1D1BD,0x1D1B9,0x1D165,0x1D16E},
    {0x1D1BE,0x1D1BA,0x1D165,0x1D16E}, {0x1D1BF,0x1D1B9,0x1D165,0x1D16F},
    {0x1D1C0,0x1D1BA,0x1D165,0x1D16F},
};
/* lowercase: {first, last, step, delta}: c in first..last, (c - first) %% step == 0 -> c + delta */
static const int32_t wp__lower1[185][4] = {
    {0x41,0x5A,1,32}, {0xC0,0xD6,1,32}, {0xD8,0xDE,1,32}, {0x100,0x12E,2,1}, {0x132,0x136,2,1},
    {0x139,0x147,2,1}, {0x14A,0x176,2,1}, {0x178,0x178,1,-121}, {0x179,0x17D,2,1},
    {0x181,0x181,1,210}, {0x182,0x184,2,1}, {0x186,0x186,1,206}, {0x187,0x187,1,1},
    {0x189,0x18A,1,205}, {0x18B,0x18B,1,1}, {0x18E,0x18E,1,79}, {0x18F,0x18F,1,202},
    {0x190,0x190,1,203}, {0x191,0x191,1,1}, {0x193,0x193,1,205}, {0x194,0x194,1,207},
    {0x196,0x196,1,211}, {0x197,0x197,1,209}, {0x198,0x198,1,1}, {0x19C,0x19C,1,211},
    {0x19D,0x19D,1,213}, {0x19F,0x19F,1,214}, {0x1A0,0x1A4,2,1}, {0x1A6,0x1A6,1,218},
    {0x1A7,0x1A7,1,1}, {0x1A9,0x1A9,1,218}, {0x1AC,0x1AC,1,1}, {0x1AE,0x1AE,1,218},
    {0x1AF,0x1AF,1,1}, {0x1B1,0x1B2,1,217}, {0x1B3,0x1B5,2,1}, {0x1B7,0x1B7,1,219},
    {0x1B8,0x1B8,1,1}, {0x1BC,0x1BC,1,1}, {0x1C4,0x1C4,1,2}, {0x1C5,0x1C5,1,1}, {0x1C7,0x1C7,1,2},
    {0x1C8,0x1C8,1,1}, {0x1CA,0x1CA,1,2}, {0x1CB,0x1DB,2,1}, {0x1DE,0x1EE,2,1}, {0x1F1,0x1F1,1,2},
    {0x1F2,0x1F4,2,1}, {0x1F6,0x1F6,1,-97}, {0x1F7,0x1F7,1,-56}, {0x1F8,0x21E,2,1},
    {0x220,0x220,1,-130}, {0x222,0x232,2,1}, {0x23A,0x23A,1,10795}, {0x23B,0x23B,1,1},
    {0x23D,0x23D,1,-163}, {0x23E,0x23E,1,10792}, {0x241,0x241,1,1}, {0x243,0x243,1,-195},
    {0x244,0x244,1,69}, {0x245,0x245,1,71}, {0x246,0x24E,2,1}, {0x370,0x372,2,1}, {0x376,0x376,1,1},
    {0x37F,0x37F,1,116}, {0x386,0x386,1,38}, {0x388,0x38A,1,37}, {0x38C,0x38C,1,64},
    {0x38E,0x38F,1,63}, {0x391,0x3A1,1,32}, {0x3A3,0x3AB,1,32}, {0x3CF,0x3CF,1,8},
    {0x3D8,0x3EE,2,1}, {0x3F4,0x3F4,1,-60}, {0x3F7,0x3F7,1,1}, {0x3F9,0x3F9,1,-7},
    {0x3FA,0x3FA,1,1}, {0x3FD,0x3FF,1,-130}, {0x400,0x40F,1,80}, {0x410,0x42F,1,32},
    {0x460,0x480,2,1}, {0x48A,0x4BE,2,1}, {0x4C0,0x4C0,1,15}, {0x4C1,0x4CD,2,1}, {0x4D0,0x52E,2,1},
    {0x531,0x556,1,48}, {0x10A0,0x10C5,1,7264}, {0x10C7,0x10C7,1,7264}, {0x10CD,0x10CD,1,7264},
    {0x13A0,0x13EF,1,38864}, {0x13F0,0x13F5,1,8}, {0x1C89,0x1C89,1,1}, {0x1C90,0x1CBA,1,-3008},
    {0x1CBD,0x1CBF,1,-3008}, {0x1E00,0x1E94,2,1}, {0x1E9E,0x1E9E,1,-7615}, {0x1EA0,0x1EFE,2,1},
    {0x1F08,0x1F0F,1,-8}, {0x1F18,0x1F1D,1,-8}, {0x1F28,0x1F2F,1,-8}, {0x1F38,0x1F3F,1,-8},
    {0x1F48,0x1F4D,1,-8}, {0x1F59,0x1F5F,2,-8}, {0x1F68,0x1F6F,1,-8}, {0x1F88,0x1F8F,1,-8},
    {0x1F98,0x1F9F,1,-8}, {0x1FA8,0x1FAF,1,-8}, {0x1FB8,0x1FB9,1,-8}, {0x1FBA,0x1FBB,1,-74},
    {0x1FBC,0x1FBC,1,-9}, {0x1FC8,0x1FCB,1,-86}, {0x1FCC,0x1FCC,1,-9}, {0x1FD8,0x1FD9,1,-8},
    {0x1FDA,0x1FDB,1,-100}, {0x1FE8,0x1FE9,1,-8}, {0x1FEA,0x1FEB,1,-112}, {0x1FEC,0x1FEC,1,-7},
    {0x1FF8,0x1FF9,1,-128}, {0x1FFA,0x1FFB,1,-126}, {0x1FFC,0x1FFC,1,-9}, {0x2126,0x2126,1,-7517},
    {0x212A,0x212A,1,-8383}, {0x212B,0x212B,1,-8262}, {0x2132,0x2132,1,28}, {0x2160,0x216F,1,16},
    {0x2183,0x2183,1,1}, {0x24B6,0x24CF,1,26}, {0x2C00,0x2C2F,1,48}, {0x2C60,0x2C60,1,1},
    {0x2C62,0x2C62,1,-10743}, {0x2C63,0x2C63,1,-3814}, {0x2C64,0x2C64,1,-10727},
    {0x2C67,0x2C6B,2,1}, {0x2C6D,0x2C6D,1,-10780}, {0x2C6E,0x2C6E,1,-10749},
    {0x2C6F,0x2C6F,1,-10783}, {0x2C70,0x2C70,1,-10782}, {0x2C72,0x2C72,1,1}, {0x2C75,0x2C75,1,1},
    {0x2C7E,0x2C7F,1,-10815}, {0x2C80,0x2CE2,2,1}, {0x2CEB,0x2CED,2,1}, {0x2CF2,0x2CF2,1,1},
    {0xA640,0xA66C,2,1}, {0xA680,0xA69A,2,1}, {0xA722,0xA72E,2,1}, {0xA732,0xA76E,2,1},
    {0xA779,0xA77B,2,1}, {0xA77D,0xA77D,1,-35332}, {0xA77E,0xA786,2,1}, {0xA78B,0xA78B,1,1},
    {0xA78D,0xA78D,1,-42280}, {0xA790,0xA792,2,1}, {0xA796,0xA7A8,2,1}, {0xA7AA,0xA7AA,1,-42308},
    {0xA7AB,0xA7AB,1,-42319}, {0xA7AC,0xA7AC,1,-42315}, {0xA7AD,0xA7AD,1,-42305},
    {0xA7AE,0xA7AE,1,-42308}, {0xA7B0,0xA7B0,1,-42258}, {0xA7B1,0xA7B1,1,-42282},
    {0xA7B2,0xA7B2,1,-42261}, {0xA7B3,0xA7B3,1,928}, {0xA7B4,0xA7C2,2,1}, {0xA7C4,0xA7C4,1,-48},
    {0xA7C5,0xA7C5,1,-42307}, {0xA7C6,0xA7C6,1,-35384}, {0xA7C7,0xA7C9,2,1},
    {0xA7CB,0xA7CB,1,-42343}, {0xA7CC,0xA7DA,2,1}, {0xA7DC,0xA7DC,1,-42561}, {0xA7F5,0xA7F5,1,1},
    {0xFF21,0xFF3A,1,32}, {0x10400,0x10427,1,40}, {0x104B0,0x104D3,1,40}, {0x10570,0x1057A,1,39},
    {0x1057C,0x1058A,1,39}, {0x1058C,0x10592,1,39}, {0x10594,0x10595,1,39}, {0x10C80,0x10CB2,1,64},
    {0x10D50,0x10D65,1,32}, {0x118A0,0x118BF,1,32}, {0x16E40,0x16E5F,1,32}, {0x16EA0,0x16EB8,1,27},
    {0x1E900,0x1E921,1,34},
};
/* lowercase to several characters: {c, out...} (0: none) */
static const uint32_t wp__lowern[1][4] = {
    {0x130,0x69,0x307,0x0},
};
/* <<wp-tables */

#define WP__COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The class bits of c (WP__CTRL, WP__WS, WP__MARK, WP__PUNCT), by binary search. */
static unsigned wp__class(uint32_t c) {
    size_t lo = 0, hi = WP__COUNT(wp__class_ranges);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c < wp__class_ranges[mid][0]) hi = mid;
        else if (c > wp__class_ranges[mid][1]) lo = mid + 1;
        else return wp__class_ranges[mid][2];
    }
    return 0;
}

/* BERT's "Chinese characters" (the CJK Unified Ideographs blocks and their compatibility forms), with
   Hugging Face's bounds: its sixth range starts at U+2B920 (Google's BERT: U+2B820). */
static int wp__is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Index of c in a table whose rows start with a sorted code point, or -1. */
#define WP__FIND(table, c, out)                                         \
    do {                                                               \
        size_t wp__lo = 0, wp__hi = WP__COUNT(table);                  \
        (out) = -1;                                                    \
        while (wp__lo < wp__hi) {                                      \
            size_t wp__mid = wp__lo + (wp__hi - wp__lo) / 2;           \
            if ((uint32_t)(table)[wp__mid][0] < (c)) wp__lo = wp__mid + 1; \
            else if ((uint32_t)(table)[wp__mid][0] > (c)) wp__hi = wp__mid; \
            else {                                                     \
                (out) = (long)wp__mid;                                 \
                break;                                                 \
            }                                                          \
        }                                                              \
    } while (0)

/* strip_accents of c (NFD without nonspacing marks) into out (room for 3); returns the count (0..3).
   cls is wp__class(c). */
static int wp__strip(uint32_t c, unsigned cls, uint32_t *out) {
    long i;
    if (c < 0xC0) { /* nothing below U+00C0 decomposes; marks start at U+0300 */
        out[0] = c;
        return 1;
    }
    if (c >= 0xAC00 && c < 0xAC00 + 11172) { /* Hangul syllable: leading consonant, vowel, trailing */
        uint32_t s = c - 0xAC00;
        out[0] = 0x1100 + s / 588;
        out[1] = 0x1161 + (s % 588) / 28;
        if (s % 28 == 0) return 2;
        out[2] = 0x11A7 + s % 28;
        return 3;
    }
    if (cls & WP__MARK) return 0;
    WP__FIND(wp__strip1, c, i);
    if (i >= 0) {
        out[0] = wp__strip1[i][1];
        return 1;
    }
    WP__FIND(wp__stripn, c, i);
    if (i >= 0) {
        int k = 0;
        while (k < 3 && wp__stripn[i][k + 1]) {
            out[k] = wp__stripn[i][k + 1];
            k++;
        }
        return k;
    }
    out[0] = c;
    return 1;
}

/* The lowercase of c into out (room for 3); returns the count (1..3). */
static int wp__lower(uint32_t c, uint32_t *out) {
    size_t lo = 0, hi = WP__COUNT(wp__lower1);
    long i;
    if (c < 0x80) {
        out[0] = (c >= 'A' && c <= 'Z') ? c + 32 : c;
        return 1;
    }
    WP__FIND(wp__lowern, c, i);
    if (i >= 0) {
        int k = 0;
        while (k < 3 && wp__lowern[i][k + 1]) {
            out[k] = wp__lowern[i][k + 1];
            k++;
        }
        return k;
    }
    /* the last run that starts at or before c */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uint32_t)wp__lower1[mid][0] <= c) lo = mid + 1;
        else hi = mid;
    }
    out[0] = c;
    if (lo > 0) {
        const int32_t *r = wp__lower1[lo - 1];
        if (c <= (uint32_t)r[1] && (c - (uint32_t)r[0]) % (uint32_t)r[2] == 0) out[0] = (uint32_t)((int32_t)c + r[3]);
    }
    return 1;
}

/* ==== >>impl-encode ==== */

/* One text being encoded: the output so far and the word being gathered (its normalised characters
   as UTF-8, with the byte offset of each character). */
typedef struct wp__enc {
    const wp_tokenizer *wp;
    int32_t *ids;
    int n, cap;  /* ids written; room for pieces (max_len - 1: [SEP] comes after) */
    int nchars;  /* characters in the word (counted past max_word_chars, stored up to it) */
    uint16_t pos[WP_MAX_WORD_CHARS + 1];
    unsigned char word[4 * WP_MAX_WORD_CHARS];
    unsigned char cand[WP__MAX_PREFIX + 4 * WP_MAX_WORD_CHARS];
    int32_t pieces[WP_MAX_WORD_CHARS];
} wp__enc;

static void wp__emit(wp__enc *e, int32_t id) {
    if (e->n < e->cap) e->ids[e->n++] = id;
}

/* WordPiece on the gathered word, then an empty word. */
static void wp__flush(wp__enc *e) {
    const wp_tokenizer *wp = e->wp;
    int nc = e->nchars, start = 0, np = 0, k;
    if (nc == 0) return;
    e->nchars = 0;
    if (nc > wp->cfg.max_word_chars) {
        wp__emit(e, wp->info.unk);
        return;
    }
    while (start < nc) {
        size_t plen = start ? (size_t)wp->prefix_len : 0, base = e->pos[start];
        int end = nc;
        int32_t id = -1;
        memcpy(e->cand, wp->prefix, plen);
        memcpy(e->cand + plen, e->word + base, e->pos[nc] - base);
        while (end > start && plen + (e->pos[end] - base) > (size_t)wp->info.max_token_bytes) end--;
        for (; end > start; end--) {
            id = wp__lookup(wp, e->cand, plen + (e->pos[end] - base));
            if (id >= 0) break;
        }
        if (id < 0) {
            wp__emit(e, wp->info.unk);
            return;
        }
        e->pieces[np++] = id;
        start = end;
    }
    for (k = 0; k < np; k++) wp__emit(e, e->pieces[k]);
}

/* One normalised character into the word (or a word boundary). */
static void wp__push(wp__enc *e, uint32_t c) {
    const wp_tokenizer *wp = e->wp;
    unsigned cls = c < 128 ? wp->ascii_class[c] : wp__class(c);
    if (cls & WP__WS) {
        wp__flush(e);
        return;
    }
    if (cls & WP__PUNCT) {
        wp__flush(e);
        e->pos[0] = 0;
        e->pos[1] = (uint16_t)wp__put_utf8(c, e->word);
        e->nchars = 1;
        wp__flush(e);
        return;
    }
    if (e->nchars < wp->cfg.max_word_chars) {
        if (e->nchars == 0) e->pos[0] = 0;
        e->pos[e->nchars + 1] = (uint16_t)(e->pos[e->nchars] + wp__put_utf8(c, e->word + e->pos[e->nchars]));
    }
    if (e->nchars <= wp->cfg.max_word_chars) e->nchars++; /* one past the limit marks a word too long */
}

/* Normalises one input character (clean_text, chinese_chars, strip_accents, lowercase) and pushes
   what it becomes. */
static void wp__char(wp__enc *e, uint32_t c) {
    const wp_tokenizer *wp = e->wp;
    unsigned cls = c < 128 ? wp->ascii_class[c] : wp__class(c);
    uint32_t s[3], l[3];
    int ns, nl, a, b, cjk = 0;
    if (wp->cfg.clean_text) {
        if (cls & WP__CTRL) return;
        if (cls & WP__WS) {
            wp__flush(e);
            return;
        }
    }
    if (wp->cfg.chinese_chars && c >= 0x3400 && wp__is_cjk(c)) {
        cjk = 1;
        wp__flush(e);
    }
    if (wp->cfg.strip_accents) {
        ns = wp__strip(c, cls, s);
    } else {
        s[0] = c;
        ns = 1;
    }
    for (a = 0; a < ns; a++) {
        if (wp->cfg.lowercase) {
            nl = wp__lower(s[a], l);
        } else {
            l[0] = s[a];
            nl = 1;
        }
        for (b = 0; b < nl; b++) wp__push(e, l[b]);
    }
    if (cjk) wp__flush(e);
}

/* The length of the added token that starts at s[0..n), and its id, or 0. */
static size_t wp__added_at(const wp_tokenizer *wp, const unsigned char *s, size_t n, int32_t *id) {
    int k;
    if (!(wp->added_first[s[0] >> 3] & (1u << (s[0] & 7)))) return 0;
    for (k = 0; k < wp->n_added; k++) {
        const wp__added *a = &wp->added[k];
        if (a->len <= n && memcmp(s, a->text, a->len) == 0) {
            *id = a->id;
            return a->len;
        }
    }
    return 0;
}

static void wp__encode(const wp_tokenizer *wp, const unsigned char *s, size_t n, int max_len, int32_t *ids, int *n_ids) {
    wp__enc e;
    size_t i = 0;
    e.wp = wp;
    e.ids = ids;
    e.cap = max_len - 1;
    e.n = 0;
    e.nchars = 0;
    e.pos[0] = 0;
    wp__emit(&e, wp->info.cls);
    while (i < n && e.n < e.cap) {
        uint32_t c;
        int32_t id;
        size_t m = wp->n_added ? wp__added_at(wp, s + i, n - i, &id) : 0;
        if (m) {
            wp__flush(&e);
            wp__emit(&e, id);
            i += m;
            continue;
        }
        i += wp__utf8(s + i, n - i, &c);
        wp__char(&e, c);
    }
    wp__flush(&e);
    ids[e.n++] = wp->info.sep;
    *n_ids = e.n;
}

WP__UNUSED WPDEF wp_result wp_encode(const wp_tokenizer *wp, const char *text, size_t n, int max_len, int32_t *ids,
                                     int *n_ids) {
    if (!wp || (!text && n) || !ids || !n_ids)
        return wp__fail(WP_E_ARG, "wp_encode: %s is NULL", !wp ? "wp" : !ids ? "ids" : !n_ids ? "n_ids" : "text");
    if (max_len < 2) return wp__fail(WP_E_ARG, "wp_encode: max_len is %d: [CLS] and [SEP] need 2", max_len);
    wp__encode(wp, (const unsigned char *)text, n, max_len, ids, n_ids);
    return WP_OK;
}

WP__UNUSED WPDEF wp_result wp_encode_batch(const wp_tokenizer *wp, const char *const *texts, const size_t *text_lens,
                                           int batch, int max_len, int32_t *ids, int32_t *lengths, int *width) {
    int i, w = 2;
    if (!wp || !texts || !ids || !lengths || !width)
        return wp__fail(WP_E_ARG, "wp_encode_batch: %s is NULL",
                        !wp ? "wp" : !texts ? "texts" : !ids ? "ids" : !lengths ? "lengths" : "width");
    if (batch < 0) return wp__fail(WP_E_ARG, "wp_encode_batch: batch is %d", batch);
    if (max_len < 2) return wp__fail(WP_E_ARG, "wp_encode_batch: max_len is %d: [CLS] and [SEP] need 2", max_len);
    for (i = 0; i < batch; i++)
        if (!texts[i] && (!text_lens || text_lens[i]))
            return wp__fail(WP_E_ARG, "wp_encode_batch: texts[%d] is NULL", i);
    for (i = 0; i < batch; i++) {
        int n;
        const char *t = texts[i] ? texts[i] : "";
        wp__encode(wp, (const unsigned char *)t, text_lens ? text_lens[i] : strlen(t), max_len,
                   ids + (size_t)i * (size_t)max_len, &n);
        lengths[i] = n;
        if (n > w) w = n;
    }
    /* rows from stride max_len to stride w (w <= max_len: each row moves toward the front), then [PAD] */
    for (i = 0; i < batch; i++) {
        int k;
        int32_t *row = ids + (size_t)i * (size_t)w;
        if (w != max_len) memmove(row, ids + (size_t)i * (size_t)max_len, (size_t)lengths[i] * sizeof(int32_t));
        for (k = lengths[i]; k < w; k++) row[k] = wp->info.pad;
    }
    *width = w;
    return WP_OK;
}

#endif /* WORDPIECE_IMPLEMENTATION */

/* >>license: MIT, as transformer.h (see LICENSE at the root of its repository). */
