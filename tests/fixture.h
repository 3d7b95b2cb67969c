/* tests/fixture.h - read the reference fixtures that tools/gen_fixtures.py writes (.tfx files).

   FORMAT (little-endian throughout)
   ------
       magic   4 bytes   "TFX1"
       count   u32       number of arrays
       then `count` arrays, each:
         name_len  u32            bytes in the name (1..255), no terminating NUL
         name      name_len bytes ASCII, unique within the file
         dtype     u32            0 = f32, 1 = f64, 2 = i32
         ndim      u32            0..8 (0 is a scalar holding one element)
         dims      ndim x i64     each >= 0
         data      prod(dims) elements of dtype, row-major, no padding
   Nothing may follow the last array.

   Names: inputs and parameters use torch's names ("x", "in_proj_weight", "out_proj.weight"); forward
   references are "y" (and "att", "mean", ...); gradients are "grad.<name>". Inputs and parameters are
   f32 (exactly what the C code computes with); references are f64, computed by torch in float64.

   USE
   ---
       fx_file *fx = fx_open("mha_self");          tests/fixtures/mha_self.tfx, or $TFM_FIXTURES/...
       if (!fx) printf("%s\n", fx_error());        why it failed (missing file, bad format, ...)
       const fx_array *a = fx_get(fx, "y");        NULL when there is no such array
       ... a->f64, a->numel, a->dims ...
       fx_free(fx);

   Every length and offset read from a file is checked against the bytes that remain, so a truncated
   or garbled file gives an error, never a read out of bounds. Each array's data is decoded into its
   own allocation (aligned for its type, host byte order). C99 and C++; all functions are static. */
#ifndef TFM_TEST_FIXTURE_H
#define TFM_TEST_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FX_F32 0
#define FX_F64 1
#define FX_I32 2
#define FX_MAX_DIMS 8
#define FX_MAX_NAME 255
#define FX_MAX_ARRAYS 4096

typedef struct fx_array {
    char name[FX_MAX_NAME + 1];
    int dtype;                   /* FX_F32, FX_F64 or FX_I32 */
    int ndim;                    /* 0..FX_MAX_DIMS */
    int64_t dims[FX_MAX_DIMS];
    int64_t numel;               /* product of dims (1 for a scalar) */
    float *f32;                  /* the data, as dtype says; the other two pointers are NULL */
    double *f64;
    int32_t *i32;
} fx_array;

typedef struct fx_file {
    char path[512];
    int count;
    fx_array *arrays;
} fx_file;

static char fx__errbuf[768];

/* Why the last fx_load / fx_open failed. */
static inline const char *fx_error(void) { return fx__errbuf; }

/* A reading cursor over a byte buffer; every read checks the bytes that remain. */
typedef struct fx__cursor {
    const unsigned char *p;
    size_t left;
} fx__cursor;

static inline int fx__take(fx__cursor *c, size_t n, const unsigned char **out) {
    if (n > c->left) return 0;
    *out = c->p;
    c->p += n;
    c->left -= n;
    return 1;
}
static inline uint32_t fx__u32(const unsigned char *b) {
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
}
static inline uint64_t fx__u64(const unsigned char *b) {
    return (uint64_t)fx__u32(b) | ((uint64_t)fx__u32(b + 4) << 32);
}

static inline void fx_free(fx_file *fx) {
    if (!fx) return;
    if (fx->arrays) {
        for (int i = 0; i < fx->count; i++) {
            free(fx->arrays[i].f32);
            free(fx->arrays[i].f64);
            free(fx->arrays[i].i32);
        }
        free(fx->arrays);
    }
    free(fx);
}

/* Parse a whole .tfx image. NULL on a malformed image (fx_error says why). */
static inline fx_file *fx_parse(const unsigned char *buf, size_t size, const char *path) {
    fx__cursor c;
    const unsigned char *b;
    fx_file *fx = (fx_file *)calloc(1, sizeof(fx_file));
    c.p = buf;
    c.left = size;
    if (!fx) {
        snprintf(fx__errbuf, sizeof fx__errbuf, "%s: out of memory", path);
        return NULL;
    }
    snprintf(fx->path, sizeof fx->path, "%s", path);
#define FX__BAD(...)                                                       \
    do {                                                                   \
        int fx__n = snprintf(fx__errbuf, sizeof fx__errbuf, "%s: ", path); \
        if (fx__n < 0 || (size_t)fx__n >= sizeof fx__errbuf) fx__n = 0;    \
        snprintf(fx__errbuf + fx__n, sizeof fx__errbuf - (size_t)fx__n, __VA_ARGS__); \
        fx_free(fx);                                                       \
        return NULL;                                                       \
    } while (0)
    if (!fx__take(&c, 4, &b) || memcmp(b, "TFX1", 4) != 0) FX__BAD("bad magic (want \"TFX1\")");
    if (!fx__take(&c, 4, &b)) FX__BAD("truncated in the header");
    uint32_t count = fx__u32(b);
    if (count > FX_MAX_ARRAYS) FX__BAD("%u arrays (max %d)", (unsigned)count, FX_MAX_ARRAYS);
    if (count) {
        fx->arrays = (fx_array *)calloc(count, sizeof(fx_array));
        if (!fx->arrays) FX__BAD("out of memory");
    }
    for (uint32_t i = 0; i < count; i++) {
        fx_array *a = &fx->arrays[i];
        fx->count = (int)i + 1; /* so fx_free releases what this array gets */
        if (!fx__take(&c, 4, &b)) FX__BAD("array %u: truncated before its name", (unsigned)i);
        uint32_t nlen = fx__u32(b);
        if (nlen == 0 || nlen > FX_MAX_NAME) FX__BAD("array %u: name length %u", (unsigned)i, (unsigned)nlen);
        if (!fx__take(&c, nlen, &b)) FX__BAD("array %u: truncated in its name", (unsigned)i);
        memcpy(a->name, b, nlen);
        a->name[nlen] = '\0';
        if (strlen(a->name) != nlen) FX__BAD("array %u: name has a NUL byte", (unsigned)i);
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(fx->arrays[j].name, a->name)) FX__BAD("array \"%s\" appears twice", a->name);
        if (!fx__take(&c, 8, &b)) FX__BAD("\"%s\": truncated before its dtype", a->name);
        uint32_t dtype = fx__u32(b), ndim = fx__u32(b + 4);
        if (dtype > FX_I32) FX__BAD("\"%s\": unknown dtype %u", a->name, (unsigned)dtype);
        if (ndim > FX_MAX_DIMS) FX__BAD("\"%s\": ndim %u (max %d)", a->name, (unsigned)ndim, FX_MAX_DIMS);
        a->dtype = (int)dtype;
        a->ndim = (int)ndim;
        size_t esize = dtype == FX_F64 ? 8 : 4;
        uint64_t numel = 1;
        for (uint32_t d = 0; d < ndim; d++) {
            if (!fx__take(&c, 8, &b)) FX__BAD("\"%s\": truncated in its dims", a->name);
            uint64_t dim = fx__u64(b);
            if (dim > (uint64_t)INT64_MAX) FX__BAD("\"%s\": negative dim", a->name);
            a->dims[d] = (int64_t)dim;
            /* numel * esize must stay within the bytes left (which also rules out overflow) */
            if (dim != 0 && numel > (uint64_t)c.left / esize / dim)
                FX__BAD("\"%s\": dims need more than the %llu bytes left", a->name,
                        (unsigned long long)c.left);
            numel *= dim;
        }
        a->numel = (int64_t)numel;
        size_t nbytes = (size_t)numel * esize;
        if (!fx__take(&c, nbytes, &b))
            FX__BAD("\"%s\": truncated: needs %llu bytes of data, %llu left", a->name,
                    (unsigned long long)nbytes, (unsigned long long)c.left);
        void *mem = malloc(nbytes ? nbytes : 1);
        if (!mem) FX__BAD("\"%s\": out of memory", a->name);
        if (dtype == FX_F32) {
            a->f32 = (float *)mem;
            for (uint64_t k = 0; k < numel; k++) {
                uint32_t u = fx__u32(b + 4 * k);
                memcpy(&a->f32[k], &u, 4);
            }
        } else if (dtype == FX_F64) {
            a->f64 = (double *)mem;
            for (uint64_t k = 0; k < numel; k++) {
                uint64_t u = fx__u64(b + 8 * k);
                memcpy(&a->f64[k], &u, 8);
            }
        } else {
            a->i32 = (int32_t *)mem;
            for (uint64_t k = 0; k < numel; k++) {
                uint32_t u = fx__u32(b + 4 * k);
                memcpy(&a->i32[k], &u, 4);
            }
        }
    }
    if (c.left) FX__BAD("%llu stray bytes after the last array", (unsigned long long)c.left);
#undef FX__BAD
    fx->count = (int)count;
    return fx;
}

/* Read and parse a .tfx file. NULL when it cannot be read or is malformed (fx_error says why). */
static inline fx_file *fx_load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(fx__errbuf, sizeof fx__errbuf,
                 "%s: cannot open (run from the repository root, set TFM_FIXTURES to the fixture "
                 "directory, or regenerate with tools/gen_fixtures.py)", path);
        return NULL;
    }
    size_t cap = 1 << 16, size = 0;
    unsigned char *buf = (unsigned char *)malloc(cap);
    while (buf) {
        if (size == cap) {
            unsigned char *nb = cap > ((size_t)-1) / 2 ? NULL : (unsigned char *)realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + size, 1, cap - size, f);
        size += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        snprintf(fx__errbuf, sizeof fx__errbuf, "%s: %s", path, buf ? "read error" : "out of memory");
        return NULL;
    }
    fx_file *fx = fx_parse(buf, size, path);
    free(buf);
    return fx;
}

/* The fixture directory: $TFM_FIXTURES when set and not empty, else tests/fixtures (relative to the
   repository root, where `make test` runs the test binary). */
static inline const char *fx_dir(void) {
    const char *d = getenv("TFM_FIXTURES");
    return d && d[0] ? d : "tests/fixtures";
}

/* Load <fx_dir()>/<name>.tfx. */
static inline fx_file *fx_open(const char *name) {
    char path[512];
    int n = snprintf(path, sizeof path, "%s/%s.tfx", fx_dir(), name);
    if (n < 0 || (size_t)n >= sizeof path) {
        snprintf(fx__errbuf, sizeof fx__errbuf, "fixture path for \"%s\" is too long", name);
        return NULL;
    }
    return fx_load(path);
}

/* The array called name, or NULL. */
static inline const fx_array *fx_get(const fx_file *fx, const char *name) {
    if (!fx || !name) return NULL;
    for (int i = 0; i < fx->count; i++)
        if (!strcmp(fx->arrays[i].name, name)) return &fx->arrays[i];
    return NULL;
}

#endif
