/* tests/fuzz_safetensors.c - libFuzzer target for the safetensors reader (tfm__st_*).

   Each input is taken as a whole safetensors file image and goes through tfm__st_load from memory
   (header only, then every tensor): the same checks a file load makes (only the byte source differs). Beyond "no
   crash, no sanitizer report", it checks what a valid header promises:
     - a refused input gives TFM_E_FORMAT (or TFM_E_NOMEM), a message, and an empty header;
     - an accepted one lists tensors that are F32-sized, contiguous from data byte 0 and cover the
       data buffer exactly, with well-formed UTF-8 names;
     - loading every listed tensor succeeds and copies exactly the bytes of the data buffer;
       leaving one out, or asking for another shape, is refused;
     - the writer's header for the same tensors and metadata parses back to the same listing.
   A broken promise aborts, which libFuzzer reports as a crash.

   Build and run: tools/fuzz.sh [seconds] (clang -g -O1 -fsanitize=fuzzer,address,undefined;
   seeds in tests/st_corpus). */
#define TFM_IMPLEMENTATION
#include "../transformer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_CHECK(c)                                                                         \
    do {                                                                                    \
        if (!(c)) {                                                                         \
            fprintf(stderr, "fuzz_safetensors: %s:%d: broken promise: %s (last error: %s)\n", \
                    __FILE__, __LINE__, #c, tfm_last_error());                              \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The listing of h2 equals that of h: names, shapes, offsets, metadata, in the same order. */
static void fz_same_listing(const tfm__st_header *h, const tfm__st_header *h2) {
    int i, k;
    FZ_CHECK(h2->n == h->n && h2->n_meta == h->n_meta && h2->data_size == h->data_size);
    for (i = 0; i < h->n; i++) {
        const tfm__st_entry *a = &h->entries[i], *b = &h2->entries[i];
        FZ_CHECK(!strcmp(a->name, b->name) && a->ndim == b->ndim);
        FZ_CHECK(a->begin == b->begin && a->end == b->end);
        for (k = 0; k < a->ndim; k++) FZ_CHECK(a->shape[k] == b->shape[k]);
    }
    for (i = 0; i < 2 * h->n_meta; i++) FZ_CHECK(!strcmp(h->meta_kv[i], h2->meta_kv[i]));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tfm__st_header h, h2;
    tfm__st_tensor *w;
    tfm__st_tensor *items;
    unsigned char *buf;
    char *json = NULL;
    size_t json_len = 0;
    uint64_t at = 0;
    tfm_result r;
    int i, k;

    tfm_clear_error();
    r = tfm__st_load(NULL, data, size, NULL, 0, 1, &h);
    if (r != TFM_OK) {
        FZ_CHECK(r == TFM_E_FORMAT || r == TFM_E_NOMEM);
        FZ_CHECK(tfm_last_error()[0] != 0);
        FZ_CHECK(h.n == 0 && h.entries == NULL && h.meta_kv == NULL && h.strings == NULL);
        /* the loader refuses it the same way */
        FZ_CHECK(tfm__st_load(NULL, data, size, NULL, 0, 0, NULL) == r);
        return 0;
    }

    /* what an accepted header promises */
    FZ_CHECK(h.data_start >= 8 && h.data_start + h.data_size == (uint64_t)size);
    FZ_CHECK(h.n >= 0 && h.n <= TFM__ST_MAX_ITEMS && h.n_meta >= 0);
    for (i = 0; i < h.n; i++) {
        const tfm__st_entry *e = &h.entries[i];
        uint64_t bytes = 0;
        FZ_CHECK(e->name && tfm__st_utf8_valid(e->name) && strcmp(e->name, "__metadata__") != 0);
        FZ_CHECK(e->ndim >= 0 && e->ndim <= TFM_MAX_DIMS);
        for (k = 0; k < e->ndim; k++) FZ_CHECK(e->shape[k] >= 0);
        FZ_CHECK(tfm__st_nbytes(e->ndim, e->shape, 4, &bytes) == 0);
        FZ_CHECK(e->begin == at && e->end - e->begin == bytes);
        at = e->end;
        for (k = 0; k < i && h.n <= 2000; k++) FZ_CHECK(strcmp(h.entries[k].name, e->name) != 0);
    }
    FZ_CHECK(at == h.data_size);
    for (i = 0; i < 2 * h.n_meta; i++) FZ_CHECK(h.meta_kv[i] && tfm__st_utf8_valid(h.meta_kv[i]));

    /* load every tensor: the data buffer, byte for byte (one buffer, carved per tensor) */
    w = (tfm__st_tensor *)calloc((size_t)h.n + 1, sizeof *w);
    items = (tfm__st_tensor *)calloc((size_t)h.n + 1, sizeof *items);
    buf = (unsigned char *)malloc((size_t)h.data_size + 4);
    FZ_CHECK(w && items && buf);
    for (i = 0; i < h.n; i++) {
        const tfm__st_entry *e = &h.entries[i];
        w[i].name = e->name;
        w[i].ndim = e->ndim;
        memcpy(w[i].shape, e->shape, sizeof w[i].shape);
        w[i].data = (float *)(void *)(buf + e->begin); /* floats at 4-byte multiples */
        items[i].name = e->name;
        items[i].ndim = e->ndim;
        memcpy(items[i].shape, e->shape, sizeof items[i].shape);
        items[i].data = w[i].data;
    }
    r = tfm__st_load(NULL, data, size, w, h.n, 0, &h2);
    FZ_CHECK(r == TFM_OK);
    fz_same_listing(&h, &h2);
    tfm__st_header_free(&h2);
    if (tfm__st_little_endian() && h.data_size)
        FZ_CHECK(!memcmp(buf, data + h.data_start, (size_t)h.data_size));

    /* strict: one tensor left out, or another shape asked for, is refused */
    if (h.n > 0) {
        FZ_CHECK(tfm__st_load(NULL, data, size, w + 1, h.n - 1, 0, NULL) == TFM_E_FORMAT);
        if (w[0].ndim < TFM_MAX_DIMS) {
            w[0].shape[w[0].ndim] = 1;
            w[0].ndim++;
            FZ_CHECK(tfm__st_load(NULL, data, size, w, h.n, 0, NULL) == TFM_E_FORMAT);
            w[0].ndim--;
        }
    }

    /* the writer's header for the same tensors parses back to the same listing */
    FZ_CHECK(tfm__st_header_json(items, h.n, (const char *const *)h.meta_kv, h.n_meta, &json,
                                 &json_len) == TFM_OK);
    FZ_CHECK(json_len % 8 == 0);
    r = tfm__st_parse((const unsigned char *)json, json_len, 8 + json_len + h.data_size, &h2);
    FZ_CHECK(r == TFM_OK);
    fz_same_listing(&h, &h2);
    tfm__st_header_free(&h2);
    TFM_FREE(json, NULL);

    free(buf);
    free(items);
    free(w);
    tfm__st_header_free(&h);
    return 0;
}
