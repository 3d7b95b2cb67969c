/* common.h - the boring code the examples share: timing, a progress line, CSV logs, a training
   loop's bookkeeping, data-set readers (KJV Bible, CMUdict, SpamAssassin, IDX), shuffling and
   splits, metrics.

   It is not part of the library: transformer.h is the library, this file is what any program that
   trains a model needs around it. Each example includes it once, after defining TFM_IMPLEMENTATION:

       #define TFM_IMPLEMENTATION
       #include "common.h"

   Everything here is static, so the file can be read top to bottom like a program. Errors in a
   program may end it: ex_die prints a message and exits with status 1. */
#ifndef EX_COMMON_H
#define EX_COMMON_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* popen, isatty, fileno, clock_gettime */
#endif

#include "../transformer.h"

/* Every helper is static; an example uses only some of them, so they are marked unused. */
#if defined(__GNUC__) || defined(__clang__)
#define EX_FN static __attribute__((unused))
#else
#define EX_FN static
#endif

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ==== errors, memory ==== */

EX_FN void ex_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* Every library call returns a tfm_result; a program stops on the first failure and says why. */
EX_FN void ex_check(tfm_result r, const char *what) {
    if (r != TFM_OK) ex_die("%s: %s: %s", what, tfm_result_string(r), tfm_last_error());
}

/* A checkpoint's user metadata `key` (saved with tfm_model_save) must equal `want`, the value this
   program uses (a vocabulary, say): a model trained with another one is refused, with both shown. */
EX_FN void ex_check_meta(const char *path, const char *key, const char *want) {
    size_t len = 0;
    char *buf;
    ex_check(tfm_checkpoint_meta(path, key, NULL, 0, &len), path); /* the size first */
    buf = (char *)malloc(len + 1);
    if (!buf) ex_die("out of memory");
    ex_check(tfm_checkpoint_meta(path, key, buf, len + 1, NULL), path);
    if (strcmp(buf, want) != 0) ex_die("%s: the model's %s is \"%s\", but this program's is \"%s\"", path, key, buf, want);
    free(buf);
}

/* The learning rate the schedule gives at step s (for the progress line and logs). */
EX_FN float ex_lr(const tfm_optim *opt, int64_t s) {
    float lr = 0;
    ex_check(tfm_optim_lr(opt, s, &lr), "tfm_optim_lr");
    return lr;
}

/* Which sgemm runs the products, for a model line: "cblas", or "built-in" with the kernel when the
   built-in runs them (its own build, or the AMX kernel chosen by TFM_SGEMM_KERNEL=amx). */
EX_FN const char *ex_sgemm(void) {
    static char name[96];
    const char *kernel = tfm_sgemm_kernel();
    if (strcmp(tfm_sgemm_backend(), "built-in") && strncmp(kernel, "amx", 3)) return tfm_sgemm_backend();
    snprintf(name, sizeof name, "built-in, %s", kernel);
    return name;
}

EX_FN void *ex_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) ex_die("out of memory (%zu bytes)", n);
    return p;
}

EX_FN void *ex_realloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) ex_die("out of memory (%zu bytes)", n);
    return p;
}

EX_FN char *ex_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    return (char *)memcpy(ex_malloc(n), s, n);
}

EX_FN int ex_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Create the directory that will hold path (one level: "runs/x.csv" makes "runs"). */
EX_FN void ex_mkdir_for(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t n;
    if (!slash || slash == path) return;
    n = (size_t)(slash - path);
    if (n >= sizeof dir) ex_die("path too long: %s", path);
    memcpy(dir, path, n);
    dir[n] = 0;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) ex_die("cannot create %s: %s", dir, strerror(errno));
}

/* A missing data set: name the file, how to get it, and stop. */
EX_FN void ex_need_file(const char *path, const char *how) {
    if (!ex_file_exists(path)) ex_die("data not found: %s\n%s", path, how);
}

/* ==== reading whole files and command output ==== */

typedef struct ex_buf { unsigned char *data; size_t len, cap; } ex_buf;

EX_FN void ex_buf_put(ex_buf *b, const void *p, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->data = (unsigned char *)ex_realloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0; /* always NUL-terminated, for text */
}

EX_FN void ex_buf_free(ex_buf *b) { free(b->data); memset(b, 0, sizeof *b); }

EX_FN void ex_read_stream(FILE *f, ex_buf *b) {
    unsigned char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) ex_buf_put(b, chunk, n);
    if (!b->data) ex_buf_put(b, "", 0);
}

EX_FN ex_buf ex_read_file(const char *path) {
    ex_buf b = {0};
    FILE *f = fopen(path, "rb");
    if (!f) ex_die("%s: %s", path, strerror(errno));
    ex_read_stream(f, &b);
    fclose(f);
    return b;
}

/* Shell-quote a path for popen: 'a'\''b'. */
EX_FN void ex_quote(char *out, size_t size, const char *s) {
    size_t n = 0;
    if (size < 3) ex_die("ex_quote: buffer too small");
    out[n++] = '\'';
    for (; *s && n + 6 < size; s++) {
        if (*s == '\'') { memcpy(out + n, "'\\''", 4); n += 4; }
        else out[n++] = *s;
    }
    if (*s) ex_die("path too long: %s", s);
    out[n++] = '\'';
    out[n] = 0;
}

/* Output of `tool -dc path` (gzip, xz): the readers use the system's decompressors rather than
   linking a library. tool_pkg names the Debian package to install when the tool is missing. */
EX_FN ex_buf ex_decompress(const char *tool, const char *tool_pkg, const char *path) {
    char q[4096], cmd[4200];
    ex_buf b = {0};
    FILE *p;
    int st;
    ex_quote(q, sizeof q, path);
    snprintf(cmd, sizeof cmd, "%s -dc %s", tool, q);
    p = popen(cmd, "r");
    if (!p) ex_die("cannot run %s: %s", cmd, strerror(errno));
    ex_read_stream(p, &b);
    st = pclose(p);
    if (st != 0) ex_die("`%s` failed (status %d): is %s installed (Debian package %s) and is the file intact?",
                        cmd, st, tool, tool_pkg);
    return b;
}

/* A file that may be compressed: .gz through gzip, .xz through xz, anything else read as is. */
EX_FN ex_buf ex_read_maybe_compressed(const char *path) {
    size_t n = strlen(path);
    if (n > 3 && strcmp(path + n - 3, ".gz") == 0) return ex_decompress("gzip", "gzip", path);
    if (n > 3 && strcmp(path + n - 3, ".xz") == 0) return ex_decompress("xz", "xz-utils", path);
    return ex_read_file(path);
}

/* ==== time, progress line, CSV ==== */

EX_FN double ex_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

EX_FN const char *ex_hms(double s, char *buf, size_t n) {
    long t = s < 0 ? 0 : (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

/* The training progress line. On a terminal it redraws in place (\r) a few times a second; when
   output goes to a file or pipe it prints a plain line every `every_s` seconds instead. */
typedef struct ex_progress {
    double t0, last;
    int64_t first_step;  /* the step this run started from (a resumed run starts later) */
    int tty;
    double every_s;      /* plain-line interval when not a terminal */
    const char *unit;    /* "tokens", "emails", "words"... per second */
} ex_progress;

EX_FN void ex_progress_start(ex_progress *p, const char *unit, int64_t first_step) {
    memset(p, 0, sizeof *p);
    p->t0 = p->last = ex_now();
    p->first_step = first_step;
    p->tty = isatty(fileno(stdout));
    p->every_s = 15.0;
    p->unit = unit;
}

/* step of total (steps taken so far), epoch as a fraction, the last loss, the learning rate, units
   (tokens, examples) per step for the rate. force: draw now, whatever the time since the last. */
EX_FN void ex_progress_show(ex_progress *p, int64_t step, int64_t total, double epoch, float loss, float lr,
                            double units_per_step, int force) {
    double now = ex_now(), el = now - p->t0, done = (double)(step - p->first_step), rate, left;
    char e[32], r[32];
    if (!force && now - p->last < (p->tty ? 0.25 : p->every_s)) return;
    p->last = now;
    rate = el > 0 ? done * units_per_step / el : 0;
    left = done > 0 ? el / done * (double)(total - step) : 0;
    printf("%sstep %lld/%lld  epoch %.2f  loss %.4f  lr %.2e  %.0f %s/s  %s elapsed  %s left%s",
           p->tty ? "\r" : "", (long long)step, (long long)total, epoch, loss, lr, rate, p->unit,
           ex_hms(el, e, sizeof e), ex_hms(left, r, sizeof r), p->tty ? "\033[K" : "\n");
    fflush(stdout);
}

/* End the redrawn line before printing something else. */
EX_FN void ex_progress_break(ex_progress *p) {
    if (p->tty) { printf("\n"); fflush(stdout); }
}

/* Loss curves as CSV: one header line, then rows. A value that was not measured at a step is NaN
   (gnuplot skips it). */
EX_FN FILE *ex_csv_open(const char *path, const char *header, int append) {
    FILE *f;
    int exists = append && ex_file_exists(path);
    if (!path || !*path) return NULL;
    f = fopen(path, exists ? "a" : "w");
    if (!f) ex_die("%s: %s", path, strerror(errno));
    if (!exists) fprintf(f, "%s\n", header);
    fflush(f);
    return f;
}

EX_FN void ex_csv_row(FILE *f, const char *fmt, ...) {
    va_list ap;
    if (!f) return;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fflush(f);
}

/* ==== command-line options ==== */

/* --name value options: ex_opt_* return the value after argv[i] when argv[i] is the option. */
EX_FN int ex_is(const char *arg, const char *name) { return strcmp(arg, name) == 0; }

EX_FN const char *ex_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) ex_die("%s needs a value", argv[*i]);
    return argv[++*i];
}

EX_FN int ex_int(int argc, char **argv, int *i) {
    const char *s = ex_value(argc, argv, i);
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || end == s) ex_die("%s: not an integer: %s", argv[*i - 1], s);
    return (int)v;
}

EX_FN float ex_float(int argc, char **argv, int *i) {
    const char *s = ex_value(argc, argv, i);
    char *end;
    float v = strtof(s, &end);
    if (*end || end == s) ex_die("%s: not a number: %s", argv[*i - 1], s);
    return v;
}

/* The options every example's training takes, read by one parser. An example keeps an
   ex_train_opts in its own options, sets its defaults, and passes each argument to ex_train_opt
   before looking at its own. */
typedef struct ex_train_opts {
    const char *data, *model, *csv;  /* --data, --model (checkpoint), --csv (loss curve) */
    int resume;                      /* --resume: continue from --model */
    int batch, epochs, eval_every, threads;
    int d_model, n_heads, n_layers, d_ff;  /* d_ff 0: 4 * d_model */
    float lr, dropout, weight_decay; /* AdamW's decoupled weight decay (tfm_optim.weight_decay) */
    float min_lr_frac;               /* the cosine schedule ends at lr * min_lr_frac (tfm_optim.min_lr) */
    double time_budget;              /* --time S: train for S seconds, whatever the epochs say (0: --epochs) */
    uint64_t seed;                   /* initialisation and batch order */
} ex_train_opts;

/* If argv[*i] is one of the options of ex_train_opts, read it (and its value) and return 1. */
EX_FN int ex_train_opt(ex_train_opts *t, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (ex_is(a, "--data")) t->data = ex_value(argc, argv, i);
    else if (ex_is(a, "--model")) t->model = ex_value(argc, argv, i);
    else if (ex_is(a, "--csv")) t->csv = ex_value(argc, argv, i);
    else if (ex_is(a, "--resume")) t->resume = 1;
    else if (ex_is(a, "--batch")) t->batch = ex_int(argc, argv, i);
    else if (ex_is(a, "--epochs")) {
        t->epochs = ex_int(argc, argv, i);
        t->time_budget = 0; /* of --epochs and --time, the last one given counts */
    } else if (ex_is(a, "--eval-every")) t->eval_every = ex_int(argc, argv, i);
    else if (ex_is(a, "--threads")) t->threads = ex_int(argc, argv, i);
    else if (ex_is(a, "--d-model")) t->d_model = ex_int(argc, argv, i);
    else if (ex_is(a, "--heads")) t->n_heads = ex_int(argc, argv, i);
    else if (ex_is(a, "--layers")) t->n_layers = ex_int(argc, argv, i);
    else if (ex_is(a, "--d-ff")) t->d_ff = ex_int(argc, argv, i);
    else if (ex_is(a, "--lr")) t->lr = ex_float(argc, argv, i);
    else if (ex_is(a, "--dropout")) t->dropout = ex_float(argc, argv, i);
    else if (ex_is(a, "--weight-decay")) t->weight_decay = ex_float(argc, argv, i);
    else if (ex_is(a, "--min-lr-frac")) t->min_lr_frac = ex_float(argc, argv, i);
    else if (ex_is(a, "--time")) t->time_budget = ex_float(argc, argv, i);
    else if (ex_is(a, "--seed")) t->seed = (uint64_t)ex_int(argc, argv, i);
    else return 0;
    return 1;
}

/* After parsing: the checks every example needs, the thread count, the output directories. */
EX_FN void ex_train_opts_apply(const ex_train_opts *t) {
    if (t->batch < 1) ex_die("--batch: at least 1");
    if (t->epochs < 1) ex_die("--epochs: at least 1");
    if (t->eval_every < 1) ex_die("--eval-every: at least 1");
    if (t->d_ff < 0) ex_die("--d-ff: 0 (4 x d-model) or more");
    if (t->time_budget < 0) ex_die("--time: seconds, 0 for none");
    if (t->threads > 0) tfm_set_num_threads(t->threads);
    ex_mkdir_for(t->model);
    ex_mkdir_for(t->csv);
}

/* Their lines of a usage message, with the example's defaults d. */
EX_FN void ex_train_usage(const ex_train_opts *d) {
    char epochs[64], budget[64] = "default: none";
    snprintf(epochs, sizeof epochs, "default %d", d->epochs);
    if (d->time_budget > 0) {
        snprintf(epochs, sizeof epochs, "default: the time budget below");
        snprintf(budget, sizeof budget, "default %g s", d->time_budget);
    }
    printf("  --data PATH       the data set (default %s)\n"
           "  --model PATH      checkpoint to write, or to read for inference (default %s)\n"
           "  --csv PATH        loss curve, train and validation (default %s)\n"
           "  --resume          continue training from --model\n"
           "  --batch N         examples per step (default %d)\n"
           "  --epochs N        passes over the training split (%s)\n"
           "  --time S          train for S seconds instead: the schedule's length is refitted as it goes\n"
           "                    (%s; the last of --epochs and --time counts)\n"
           "  --lr X            peak learning rate (default %g); --dropout X (default %g)\n"
           "  --weight-decay X  AdamW's weight decay (default %g)\n"
           "  --min-lr-frac X   the cosine schedule ends at X times --lr (default %g)\n"
           "  --d-model N --heads N --layers N --d-ff N\n"
           "                    the model (default %d, %d, %d, %d; d-ff 0: 4 x d-model)\n"
           "  --eval-every N    validate every N steps (default %d)\n"
           "  --seed N          initialisation and batch order (default %llu)\n"
           "  --threads N       threads (default: OpenMP's)\n",
           d->data, d->model, d->csv, d->batch, epochs, budget, (double)d->lr, (double)d->dropout,
           (double)d->weight_decay, (double)d->min_lr_frac, d->d_model, d->n_heads, d->n_layers, d->d_ff,
           d->eval_every, (unsigned long long)d->seed);
}

/* ==== a time budget ==== */

/* Training for a number of seconds rather than of epochs (--time): every 25 steps, the schedule's
   length is fitted to the time left at the speed of the last 25 steps, since the machine may be
   busier or quieter than at the start. */
typedef struct ex_budget {
    double seconds, t0;  /* seconds: 0 for no budget */
    int64_t first_step;
} ex_budget;

EX_FN void ex_budget_start(ex_budget *b, double seconds, int64_t first_step) {
    b->seconds = seconds;
    b->t0 = ex_now();
    b->first_step = first_step;
}

/* After step `step` (counted from 0) has run: the number of steps to train in all (total without a
   budget), also written to opt->total_steps. The speed is the mean since the start, evaluations and
   checkpoints included, so that the schedule does not jump when one of them makes a step slow. */
EX_FN int64_t ex_budget_fit(ex_budget *b, int64_t step, int64_t total, tfm_optim *opt) {
    double now, left;
    int64_t done = step + 1 - b->first_step;
    if (b->seconds <= 0 || done % 25 != 0) return total;
    now = ex_now();
    left = b->seconds - (now - b->t0);
    total = step + 1 + (left > 0 ? (int64_t)(left / ((now - b->t0) / (double)done)) : 0);
    if (total <= opt->warmup_steps) total = opt->warmup_steps + 1;
    if (total <= step + 1) total = step + 1; /* out of time: this was the last step */
    opt->total_steps = (int)total;
    return total;
}

/* ==== a training loop's bookkeeping ==== */

/* What a training loop keeps beside the model: the progress line, the --time budget and the loss
   curve. The CSV's columns are step, epoch, the training loss, then n_val validation values; every
   `every` steps a row gives the mean training loss since the last one (times csv_scale: 1 / ln 2
   for bits), and ex_log_val adds a row per validation. */
typedef struct ex_log {
    ex_progress prog;
    ex_budget budget;
    FILE *csv;                /* NULL: no loss curve */
    int64_t total;            /* steps to train in all, refitted as it goes under --time */
    double steps_per_epoch, units_per_step, csv_scale, sum;
    int n_val, every, n;      /* n: training losses in sum */
    float loss;               /* the last step's */
} ex_log;

/* Opens t->csv with header (appending when the run resumes at first_step > 0) and starts the clock.
   unit: what the speed counts ("images"), units_per_step of them a step. */
EX_FN void ex_log_start(ex_log *l, const ex_train_opts *t, const char *header, int n_val, const char *unit,
                        double units_per_step, int64_t first_step, int64_t total, double steps_per_epoch) {
    memset(l, 0, sizeof *l);
    l->csv = ex_csv_open(t->csv, header, first_step > 0);
    l->n_val = n_val;
    l->units_per_step = units_per_step;
    l->total = total;
    l->steps_per_epoch = steps_per_epoch;
    l->csv_scale = 1.0;
    l->every = 20;
    ex_progress_start(&l->prog, unit, first_step);
    ex_budget_start(&l->budget, t->time_budget, first_step);
}

/* A CSV row at `done` steps: the training loss (NaN for none), then the n_val validation values
   (val NULL: NaN). */
EX_FN void ex_log_row(ex_log *l, int64_t done, double train, const double *val) {
    int i;
    if (!l->csv) return;
    fprintf(l->csv, "%lld,%.4f", (long long)done, (double)done / l->steps_per_epoch);
    if (!isnan(train)) fprintf(l->csv, ",%.5f", train);
    else fprintf(l->csv, ",NaN");
    for (i = 0; i < l->n_val; i++)
        if (val) fprintf(l->csv, ",%.5f", val[i]);
        else fprintf(l->csv, ",NaN");
    fputc('\n', l->csv);
    fflush(l->csv);
}

/* After step `step` (counted from 0) with its loss: the budget refitted (and opt->total_steps with
   it), the progress line, the CSV. Returns the number of steps to train in all. */
EX_FN int64_t ex_log_step(ex_log *l, int64_t step, float loss, tfm_optim *opt) {
    int64_t done = step + 1;
    l->loss = loss;
    l->sum += loss;
    l->n++;
    l->total = ex_budget_fit(&l->budget, step, l->total, opt);
    ex_progress_show(&l->prog, done, l->total, (double)done / l->steps_per_epoch, loss, ex_lr(opt, done),
                     l->units_per_step, 0);
    if (done % l->every == 0) {
        ex_log_row(l, done, l->sum / l->n * l->csv_scale, NULL);
        l->sum = 0;
        l->n = 0;
    }
    return l->total;
}

/* A validation at `done` steps: ends the progress line (print the result after this) and writes
   the row of its n_val values. */
EX_FN void ex_log_val(ex_log *l, int64_t done, const double *val) {
    ex_progress_break(&l->prog);
    ex_log_row(l, done, NAN, val);
}

/* The end of training at `step` steps: the last progress line, in full; the CSV closed. */
EX_FN void ex_log_end(ex_log *l, int64_t step, const tfm_optim *opt) {
    if (step > l->prog.first_step) {
        ex_progress_show(&l->prog, step, l->total, (double)step / l->steps_per_epoch, l->loss, ex_lr(opt, step),
                         l->units_per_step, 1);
        ex_progress_break(&l->prog);
    }
    if (l->csv) fclose(l->csv);
    l->csv = NULL;
}

/* ==== shuffling ==== */

/* Fisher-Yates with the library's seeded generator: the same seed gives the same order everywhere. */
EX_FN void ex_shuffle(int32_t *a, int64_t n, tfm_rng *rng) {
    int64_t i;
    for (i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(tfm_rng_u64(rng) % (uint64_t)(i + 1));
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* 0, 1, ..., n-1 in an order fixed by seed. */
EX_FN int32_t *ex_permutation(int64_t n, uint64_t seed) {
    int32_t *a = (int32_t *)ex_malloc((size_t)n * sizeof *a);
    int64_t i;
    tfm_rng rng;
    for (i = 0; i < n; i++) a[i] = (int32_t)i;
    tfm_rng_seed(&rng, seed);
    ex_shuffle(a, n, &rng);
    return a;
}

/* An epoch's order of the rows base[0..n): the same for a given seed and epoch, so a resumed run sees
   the batches an unbroken one would. */
EX_FN void ex_epoch_order(int32_t *order, const int32_t *base, int64_t n, uint64_t seed, int64_t epoch) {
    tfm_rng r;
    int64_t i;
    for (i = 0; i < n; i++) order[i] = base ? base[i] : (int32_t)i;
    tfm_rng_seed(&r, seed * 1000003u + (uint64_t)epoch);
    ex_shuffle(order, n, &r);
}

/* Length buckets, for rows padded to the longest of their batch: in each run of `span` batches of an
   epoch's order (n rows), the rows sorted by key[row] (their length), so that a batch pads little;
   then the run's whole batches in an order shuffled with rng, so that lengths still change from step
   to step. Which rows meet in a batch still changes with the epoch's order. */
static int ex__cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}
EX_FN void ex_bucket(int32_t *order, int64_t n, int batch, int span, const int32_t *key, tfm_rng *rng) {
    int64_t c0, run = (int64_t)batch * span, i;
    int64_t *k = (int64_t *)ex_malloc((size_t)run * sizeof *k);
    int32_t *tmp = (int32_t *)ex_malloc((size_t)run * sizeof *tmp);
    for (c0 = 0; c0 < n; c0 += run) {
        int64_t len = n - c0 < run ? n - c0 : run, nb = len / batch, b;
        for (i = 0; i < len; i++) k[i] = (int64_t)key[order[c0 + i]] << 32 | (uint32_t)order[c0 + i];
        qsort(k, (size_t)len, sizeof *k, ex__cmp_i64);
        for (i = 0; i < len; i++) tmp[i] = (int32_t)(k[i] & 0xffffffff);
        for (b = nb - 1; b > 0; b--) { /* Fisher-Yates over whole batches */
            int64_t j = (int64_t)(tfm_rng_u64(rng) % (uint64_t)(b + 1));
            for (i = 0; i < batch; i++) {
                int32_t t = tmp[b * batch + i];
                tmp[b * batch + i] = tmp[j * batch + i];
                tmp[j * batch + i] = t;
            }
        }
        memcpy(order + c0, tmp, (size_t)len * sizeof *tmp);
    }
    free(k);
    free(tmp);
}

/* ==== metrics ==== */

/* Levenshtein distance between two id sequences (for phoneme and character error rates). */
EX_FN int ex_edit_distance(const int32_t *a, int na, const int32_t *b, int nb) {
    int *row = (int *)ex_malloc((size_t)(nb + 1) * sizeof *row), i, j, d;
    for (j = 0; j <= nb; j++) row[j] = j;
    for (i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = i;
        for (j = 1; j <= nb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    d = row[nb];
    free(row);
    return d;
}

/* Binary classification counts, positive class = 1. */
typedef struct ex_binary { int64_t tp, fp, tn, fn; } ex_binary;

EX_FN void ex_binary_add(ex_binary *c, int truth, int pred) {
    if (truth && pred) c->tp++;
    else if (!truth && pred) c->fp++;
    else if (!truth && !pred) c->tn++;
    else c->fn++;
}

EX_FN double ex_accuracy(const ex_binary *c) {
    int64_t n = c->tp + c->fp + c->tn + c->fn;
    return n ? (double)(c->tp + c->tn) / (double)n : 0;
}

EX_FN double ex_f1(const ex_binary *c) {
    double d = (double)(2 * c->tp + c->fp + c->fn);
    return d > 0 ? 2.0 * (double)c->tp / d : 0;
}

/* ==== the KJV Bible (Debian's bible-kjv-text: /usr/lib/bible.data) ==== */

/* bible.data holds the text in 64 KiB blocks, each compressed by Unix `compress` (LZW, up to 16-bit
   codes, "block mode" with a clear code) without compress's 3-byte header. This decodes one block:
   codes are read least significant bit first, starting at 9 bits; the code width grows when the
   table fills its current range, and at each width change (and after a clear) the reader skips to
   the end of the current group of 8 codes (n_bits bytes), counted from the last width change, as
   compress writes them. */
EX_FN int64_t ex_lzw_align(int64_t pos, int64_t *base, int n_bits) {
    int64_t g = (int64_t)n_bits * 8, rel = pos - *base;
    pos = *base + (rel + g - 1) / g * g;
    *base = pos;
    return pos;
}

EX_FN void ex_lzw_block(const unsigned char *in, size_t n_in, ex_buf *out) {
    enum { MAXBITS = 16, CLEAR = 256, FIRST = 257 };
    static uint16_t prefix[1 << MAXBITS];
    static unsigned char suffix[1 << MAXBITS], stack[1 << MAXBITS];
    int64_t pos = 0, end = (int64_t)n_in * 8, base = 0;
    int n_bits = 9, free_ent = FIRST, oldcode = -1, finchar = 0, c;
    int maxcode = (1 << n_bits) - 1;
    for (c = 0; c < 256; c++) { prefix[c] = 0; suffix[c] = (unsigned char)c; }
    for (;;) {
        int code, incode, sp = 0;
        int64_t byte;
        uint32_t v;
        if (free_ent > maxcode) { /* widen: skip to the next group boundary */
            pos = ex_lzw_align(pos, &base, n_bits);
            n_bits++;
            maxcode = n_bits == MAXBITS ? (1 << MAXBITS) : (1 << n_bits) - 1;
        }
        if (pos + n_bits > end) break;
        byte = pos >> 3;
        v = in[byte] | ((size_t)byte + 1 < n_in ? (uint32_t)in[byte + 1] << 8 : 0) |
            ((size_t)byte + 2 < n_in ? (uint32_t)in[byte + 2] << 16 : 0);
        code = (int)((v >> (pos & 7)) & ((1u << n_bits) - 1));
        pos += n_bits;
        if (oldcode == -1) {
            if (code >= 256) ex_die("bible.data: corrupt LZW block");
            finchar = oldcode = code;
            ex_buf_put(out, &suffix[code], 1);
            continue;
        }
        if (code == CLEAR) {
            pos = ex_lzw_align(pos, &base, n_bits);
            free_ent = FIRST - 1;
            n_bits = 9;
            maxcode = (1 << n_bits) - 1;
            continue;
        }
        incode = code;
        if (code >= free_ent) { /* the KwKwK case: the code being defined right now */
            if (code > free_ent) ex_die("bible.data: corrupt LZW block");
            stack[sp++] = (unsigned char)finchar;
            code = oldcode;
        }
        while (code >= 256) { stack[sp++] = suffix[code]; code = prefix[code]; }
        finchar = suffix[code];
        stack[sp++] = (unsigned char)finchar;
        while (sp > 0) ex_buf_put(out, &stack[--sp], 1);
        if (free_ent < (1 << MAXBITS)) {
            prefix[free_ent] = (uint16_t)oldcode;
            suffix[free_ent] = (unsigned char)finchar;
            free_ent++;
        }
        oldcode = incode;
    }
}

EX_FN uint32_t ex_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The whole Bible as text, one verse per line, with the reference tags ("Ge1:1 ") and the title
   line removed. *n_verses receives the number of lines; refs (may be NULL) the tags, one per line. */
EX_FN ex_buf ex_kjv_read_refs(const char *path, int64_t *n_verses, ex_buf *refs) {
    ex_buf raw, text = {0}, clean = {0};
    uint32_t i, n_blocks;
    size_t k;
    ex_need_file(path, "The KJV Bible comes with Debian's bible-kjv-text package: apt-get install bible-kjv-text");
    raw = ex_read_file(path);
    if (raw.len < 0x5c + 8) ex_die("%s: too short for bible.data", path);
    n_blocks = ex_be32(raw.data + 0x58);
    if (n_blocks == 0 || 0x5c + 4 * ((size_t)n_blocks + 1) > raw.len) ex_die("%s: bad block table", path);
    for (i = 0; i < n_blocks; i++) {
        uint32_t a = ex_be32(raw.data + 0x5c + 4 * i), b = ex_be32(raw.data + 0x5c + 4 * (i + 1));
        if (a > b || b > raw.len) ex_die("%s: block %u out of bounds", path, i);
        ex_lzw_block(raw.data + a, b - a, &text);
    }
    ex_buf_free(&raw);
    /* strip: skip the first line (a title), then drop each line's "Book1:2 " tag */
    *n_verses = 0;
    k = 0;
    while (k < text.len && text.data[k] != '\n') k++;
    while (k < text.len) {
        size_t start, e;
        k++; /* past '\n' */
        if (k >= text.len) break;
        start = k;
        while (k < text.len && text.data[k] != '\n') k++;
        e = start;
        while (e < k && text.data[e] != ' ') e++;  /* the tag ends at the first space */
        if (refs) ex_buf_put(refs, text.data + start, e - start);
        if (refs) ex_buf_put(refs, "\n", 1);
        if (e < k) e++;
        ex_buf_put(&clean, text.data + e, k - e);
        ex_buf_put(&clean, "\n", 1);
        ++*n_verses;
    }
    ex_buf_free(&text);
    return clean;
}

EX_FN ex_buf ex_kjv_read(const char *path, int64_t *n_verses) { return ex_kjv_read_refs(path, n_verses, NULL); }

/* ==== CMUdict (0.4 from Debian's festlex-cmu, 0.7b as distributed by CMU) ==== */

/* Phones without stress: the 39 ARPAbet phones of CMUdict 0.7b plus 0.4's schwa "ax". */
EX_FN const char *const ex_phones[] = {
    "aa", "ae", "ah", "ao", "aw", "ax", "ay", "b", "ch", "d", "dh", "eh", "er", "ey", "f", "g",
    "hh", "ih", "iy", "jh", "k", "l", "m", "n", "ng", "ow", "oy", "p", "r", "s", "sh", "t",
    "th", "uh", "uw", "v", "w", "y", "z", "zh"};
#define EX_N_PHONES ((int)(sizeof ex_phones / sizeof ex_phones[0]))

/* A phone name (any case, stress digit ignored) to its index in ex_phones, or -1. */
EX_FN int ex_phone_id(const char *s, size_t n) {
    char low[8];
    int i;
    while (n > 0 && isdigit((unsigned char)s[n - 1])) n--;
    if (n == 0 || n >= sizeof low) return -1;
    for (i = 0; i < (int)n; i++) low[i] = (char)tolower((unsigned char)s[i]);
    low[n] = 0;
    for (i = 0; i < EX_N_PHONES; i++)
        if (strcmp(low, ex_phones[i]) == 0) return i;
    return -1;
}

#define EX_MAX_WORD 32
#define EX_MAX_PRON 32

/* One pronunciation of a word. Words are lower case a-z and ' . - only. */
typedef struct ex_pron {
    char word[EX_MAX_WORD + 1];
    int8_t phones[EX_MAX_PRON];
    int n_phones;
} ex_pron;

EX_FN int ex_word_ok(const char *w, size_t n) {
    size_t i;
    if (n == 0 || n > EX_MAX_WORD || !isalpha((unsigned char)w[0])) return 0;
    for (i = 0; i < n; i++)
        if (!isalpha((unsigned char)w[i]) && w[i] != '\'' && w[i] != '.' && w[i] != '-') return 0;
    return 1;
}

EX_FN int ex_pron_cmp(const void *a, const void *b) {
    int c = strcmp(((const ex_pron *)a)->word, ((const ex_pron *)b)->word);
    if (c) return c;
    return memcmp(((const ex_pron *)a)->phones, ((const ex_pron *)b)->phones, EX_MAX_PRON);
}

/* Read CMUdict 0.4 (lines like `("abandon" nil (((ax) 0) ((b ae n) 1)))`) or 0.7b (`ABANDON  AH0 B
   AE1 N D AH0 N`, `WORD(1)` for variants, `;;;` comments); the format is recognised per line. The
   file may be .xz. Entries whose word has characters other than letters and ' . - (0.7b's
   punctuation entries), or a phone outside ex_phones, are skipped. The result is sorted by word, so
   the pronunciations of one word are adjacent; duplicates are dropped. */
EX_FN ex_pron *ex_cmudict_read(const char *path, int64_t *n_out) {
    ex_buf b;
    ex_pron *v = NULL;
    int64_t n = 0, cap = 0, skipped = 0, i, j;
    char *line, *save = NULL;
    ex_need_file(path, "CMUdict 0.4 comes with Debian's festlex-cmu package (apt-get install festlex-cmu);\n"
                       "0.7b is cmudict-0.7b from https://github.com/cmusphinx/cmudict (or ../shared/data).");
    b = ex_read_maybe_compressed(path);
    for (line = strtok_r((char *)b.data, "\r\n", &save); line; line = strtok_r(NULL, "\r\n", &save)) {
        ex_pron p;
        const char *s = line, *w, *we;
        memset(&p, 0, sizeof p);
        if (line[0] == ';' || line[0] == 0) continue;
        if (line[0] == '(') { /* 0.4: ("word" pos (((ph ph) stress) ...)) */
            w = strchr(s, '"');
            if (!w) continue;
            w++;
            we = strchr(w, '"');
            if (!we) continue;
            s = we + 1;
            while (*s == ' ') s++;
            while (*s && *s != ' ' && *s != '(') s++; /* the part-of-speech tag */
        } else {              /* 0.7b: WORD(1)  PH PH */
            w = s;
            we = w;
            while (*we && *we != ' ' && *we != '(') we++;
            s = we;
            if (*s == '(') while (*s && *s != ' ') s++;
        }
        if (!ex_word_ok(w, (size_t)(we - w))) { skipped++; continue; }
        for (i = 0; i < we - w; i++) p.word[i] = (char)tolower((unsigned char)w[i]);
        while (*s) {
            const char *t;
            int id;
            while (*s && !isalpha((unsigned char)*s)) s++;
            if (!*s) break;
            t = s;
            while (isalnum((unsigned char)*s)) s++;
            id = ex_phone_id(t, (size_t)(s - t));
            if (id < 0 || p.n_phones == EX_MAX_PRON) { p.n_phones = -1; break; }
            p.phones[p.n_phones++] = (int8_t)id;
        }
        if (p.n_phones <= 0) { skipped++; continue; }
        if (n == cap) { cap = cap ? 2 * cap : 4096; v = (ex_pron *)ex_realloc(v, (size_t)cap * sizeof *v); }
        v[n++] = p;
    }
    ex_buf_free(&b);
    if (n == 0) ex_die("%s: no CMUdict entries found (is it cmudict 0.4 or 0.7b?)", path);
    qsort(v, (size_t)n, sizeof *v, ex_pron_cmp);
    for (i = j = 0; i < n; i++) /* drop exact duplicates (0.4 repeats a pronunciation per tag) */
        if (j == 0 || ex_pron_cmp(&v[j - 1], &v[i]) != 0) v[j++] = v[i];
    *n_out = j;
    (void)skipped;
    return v;
}

/* ==== SpamAssassin public corpus (a .tar.xz of folders of raw emails) ==== */

typedef struct ex_email {
    char *text;   /* Subject, a newline, then the body; whitespace runs collapsed to one space */
    int len;
    int spam;     /* 1: from a spam-* folder */
    int hard;     /* 1: from a hard-ham-* folder (ham that looks like spam: newsletters, offers) */
} ex_email;

/* Append s[0..n) to out, collapsing runs of whitespace into one space. */
EX_FN void ex_put_collapsed(ex_buf *out, const char *s, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            if (out->len > 0 && out->data[out->len - 1] != ' ') ex_buf_put(out, " ", 1);
        } else {
            ex_buf_put(out, &c, 1);
        }
    }
}

/* An email's Subject (with its continuation lines) and its body: the headers end at the first
   empty line; MIME parts and HTML are kept as they are (bytes are what the model reads). */
EX_FN ex_email ex_email_parse(const char *m, size_t n, int max_len) {
    ex_email e;
    ex_buf out = {0};
    size_t i = 0, body = n;
    memset(&e, 0, sizeof e);
    while (i < n) { /* header lines */
        size_t eol = i;
        while (eol < n && m[eol] != '\n') eol++;
        if (eol == i || (eol == i + 1 && m[i] == '\r')) { body = eol + 1; break; }
        if (eol - i >= 8 && strncasecmp(m + i, "subject:", 8) == 0) {
            size_t e2 = eol;
            while (e2 + 1 < n && (m[e2 + 1] == ' ' || m[e2 + 1] == '\t')) { /* folded header */
                e2++;
                while (e2 < n && m[e2] != '\n') e2++;
            }
            ex_put_collapsed(&out, m + i + 8, e2 - i - 8);
        }
        i = eol + 1;
    }
    ex_buf_put(&out, "\n", 1);
    if (body < n) ex_put_collapsed(&out, m + body, n - body);
    e.len = (int)(out.len < (size_t)max_len ? out.len : (size_t)max_len);
    e.text = (char *)ex_malloc((size_t)e.len + 1);
    memcpy(e.text, out.data, (size_t)e.len);
    e.text[e.len] = 0;
    ex_buf_free(&out);
    return e;
}

/* Every email in the corpus archive, in archive order, each truncated to max_len bytes. The
   archive is read through `xz -dc` and walked as a tar stream (512-byte headers). */
EX_FN ex_email *ex_spamassassin_read(const char *path, int max_len, int64_t *n_out) {
    ex_buf tar;
    ex_email *v = NULL;
    int64_t n = 0, cap = 0;
    size_t off = 0;
    ex_need_file(path, "spamassassin.tar.xz is the SpamAssassin public corpus (easy-ham-1, easy-ham-2,\n"
                       "hard-ham-1, spam-1, spam-2): see ../shared/data/README.md, or build it from\n"
                       "https://spamassassin.apache.org/old/publiccorpus/.");
    tar = ex_read_maybe_compressed(path);
    while (off + 512 <= tar.len) {
        const char *h = (const char *)tar.data + off;
        char name[101], sizef[13];
        size_t size;
        if (h[0] == 0) break; /* end-of-archive blocks */
        memcpy(name, h, 100);
        name[100] = 0;
        memcpy(sizef, h + 124, 12);
        sizef[12] = 0;
        size = (size_t)strtoull(sizef, NULL, 8);
        off += 512;
        if (off + size > tar.len) ex_die("%s: truncated archive at %s", path, name);
        if ((h[156] == '0' || h[156] == 0) && size > 0) {
            if (n == cap) { cap = cap ? 2 * cap : 1024; v = (ex_email *)ex_realloc(v, (size_t)cap * sizeof *v); }
            v[n] = ex_email_parse((const char *)tar.data + off, size, max_len);
            v[n].spam = strncmp(name, "spam", 4) == 0 || strstr(name, "/spam") != NULL;
            v[n].hard = strncmp(name, "hard", 4) == 0 || strstr(name, "/hard") != NULL;
            n++;
        }
        off += (size + 511) / 512 * 512;
    }
    ex_buf_free(&tar);
    if (n == 0) ex_die("%s: no emails found in the archive", path);
    *n_out = n;
    return v;
}

/* ==== IDX (MNIST, Fashion-MNIST), optionally gzipped ==== */

/* Read an IDX file of unsigned bytes: magic 0x00000800 | ndim, ndim big-endian u32 sizes, the data.
   dims receives up to 3 sizes; returns the data (count = product of dims). */
EX_FN unsigned char *ex_idx_read(const char *path, int want_ndim, int dims[3]) {
    ex_buf b = ex_read_maybe_compressed(path);
    uint32_t magic;
    size_t need = 1;
    int i;
    unsigned char *data;
    if (b.len < 4) ex_die("%s: not an IDX file", path);
    magic = ex_be32(b.data);
    if ((magic & 0xffffff00u) != 0x800u || (int)(magic & 0xff) != want_ndim)
        ex_die("%s: IDX magic 0x%08x, want 0x%08x", path, magic, 0x800u | (unsigned)want_ndim);
    if (b.len < 4 + 4 * (size_t)want_ndim) ex_die("%s: truncated IDX header", path);
    for (i = 0; i < want_ndim; i++) {
        dims[i] = (int)ex_be32(b.data + 4 + 4 * i);
        need *= (size_t)dims[i];
    }
    if (b.len - 4 - 4 * (size_t)want_ndim != need) ex_die("%s: IDX data has %zu bytes, header says %zu", path,
                                                          b.len - 4 - 4 * (size_t)want_ndim, need);
    data = (unsigned char *)ex_malloc(need);
    memcpy(data, b.data + 4 + 4 * want_ndim, need);
    ex_buf_free(&b);
    return data;
}

#endif /* EX_COMMON_H */
