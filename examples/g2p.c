/* g2p.c - a pronouncer: an encoder-decoder transformer turns a word's spelling into its phonemes
   (grapheme to phoneme), "transformer" -> T R AE N S F AO R M ER.

   Data: the CMU Pronouncing Dictionary. By default version 0.4 from Debian's festlex-cmu package
   (105,901 entries); --data takes 0.7b (cmudict-0.7b.txt, plain, .gz or .xz), the version papers
   use. Stress marks are dropped (the model predicts phones only, and scoring ignores stress).
   Words are lower-cased letters plus ' . - ; other entries are skipped.

   Split: by word, so all the pronunciations of a word land in the same split: the distinct words are
   shuffled with --split-seed (default 1) and cut 90/5/5 into train, validation and test. Training
   uses every pronunciation of every training word. Validation loss and word error rate (on the
   first --val-words validation words) are measured during training; the test split is scored once,
   at the end. A word counts as correct when the output equals any of its dictionary
   pronunciations; the phoneme error rate is the edit distance to the closest one over its length.

   Model: the original transformer (post-LN encoder and decoder, cross-attention over the encoder's
   output, sinusoidal positions), letters in, phones out, label smoothing 0.1. Decoding uses the
   key/value cache: greedy (tfm_model_generate) during training, and beam search
   (tfm_model_beam_search, --beam N, default 4) for the test split and for words on the command
   line; the test split is scored both ways, so the two can be compared.

       build/g2p                                train (defaults: 20 epochs, about 45 min on 2 cores), then test
       build/g2p --time 2700                    train for 45 minutes instead, whatever the epochs
       build/g2p --data cmudict-0.7b.txt.xz     the same on CMUdict 0.7b
       build/g2p --resume                       continue from the saved checkpoint
       build/g2p hello transformer              pronounce words with the saved model
       build/g2p --n-best 3 read                the 3 likeliest pronunciations, with probabilities
       build/g2p --demo                         `make demo`: a small model for 2 minutes
       build/g2p --smoke                        a few steps on a tiny model (seconds), for CI

   Writes runs/g2p.safetensors (the model, with its optimizer state for --resume) and runs/g2p.csv
   (train and validation loss per step). */
#define TFM_IMPLEMENTATION
#include "common.h"

/* Vocabularies. Source: 0 padding, 1..26 a-z, 27 ', 28 ., 29 -. Target: 0 padding, 1 start, 2 end,
   then the phones of ex_phones. Both are fixed, so a checkpoint needs nothing else to be used. */
enum { SRC_VOCAB = 30, BOS = 1, EOS = 2, PHONE0 = 3, TGT_VOCAB = PHONE0 + EX_N_PHONES };
enum { MAX_SRC = EX_MAX_WORD, MAX_TGT = EX_MAX_PRON + 1 }; /* + the start or end token */

static int letter_id(char c) {
    if (c >= 'a' && c <= 'z') return 1 + (c - 'a');
    if (c >= 'A' && c <= 'Z') return 1 + (c - 'A');
    return c == '\'' ? 27 : c == '.' ? 28 : c == '-' ? 29 : -1;
}

/* A word as source ids; the number of ids, or -1 if a character has no id. */
static int encode_word(const char *w, int32_t *ids) {
    int n = 0;
    for (; *w; w++) {
        int id = letter_id(*w);
        if (id < 0 || n == MAX_SRC) return -1;
        ids[n++] = id;
    }
    return n;
}

/* The two vocabularies as text, saved in each checkpoint (user metadata) and checked on load. */
static const char *const LETTERS = "abcdefghijklmnopqrstuvwxyz'.-";
static const char *phone_list(void) {
    static char v[EX_N_PHONES * 3 + 1];
    int i;
    v[0] = 0;
    for (i = 0; i < EX_N_PHONES; i++) {
        if (i) strcat(v, " ");
        strcat(v, ex_phones[i]);
    }
    return v;
}

static void check_vocab(const char *path) {
    ex_check_meta(path, "letters", LETTERS);
    ex_check_meta(path, "phones", phone_list());
}

typedef struct options {
    ex_train_opts t;      /* --model, --batch, --lr, --time, ... (common.h) */
    int val_words, smoke, demo;
    int beam, n_best;     /* beam width (0: greedy) and how many pronunciations to print per word */
    uint64_t split_seed;
} options;

/* A word and the range of its pronunciations in the sorted dictionary. */
typedef struct word { int32_t first, count; } word;

typedef struct dataset {
    ex_pron *prons;
    int64_t n_prons;
    word *words;
    int64_t n_words;
    int32_t *train, *val, *test;   /* word indices */
    int64_t n_train, n_val, n_test;
    int32_t *train_prons;          /* pronunciation indices of the training words */
    int64_t n_train_prons;
} dataset;

static void dataset_load(dataset *d, const options *o) {
    int64_t i, k;
    int32_t *perm;
    memset(d, 0, sizeof *d);
    d->prons = ex_cmudict_read(o->t.data, &d->n_prons);
    d->words = (word *)ex_malloc((size_t)d->n_prons * sizeof(word));
    for (i = 0; i < d->n_prons; i++) { /* group: the dictionary is sorted by word */
        if (d->n_words > 0 && strcmp(d->prons[d->words[d->n_words - 1].first].word, d->prons[i].word) == 0) {
            d->words[d->n_words - 1].count++;
        } else {
            d->words[d->n_words].first = (int32_t)i;
            d->words[d->n_words].count = 1;
            d->n_words++;
        }
    }
    perm = ex_permutation(d->n_words, o->split_seed);
    d->n_test = d->n_words / 20;
    d->n_val = d->n_words / 20;
    d->n_train = d->n_words - d->n_val - d->n_test;
    d->train = perm;
    d->val = perm + d->n_train;
    d->test = perm + d->n_train + d->n_val;
    d->train_prons = (int32_t *)ex_malloc((size_t)d->n_prons * sizeof(int32_t));
    for (i = 0; i < d->n_train; i++)
        for (k = 0; k < d->words[d->train[i]].count; k++)
            d->train_prons[d->n_train_prons++] = d->words[d->train[i]].first + (int32_t)k;
}

static void dataset_free(dataset *d) {
    free(d->prons);
    free(d->words);
    free(d->train);
    free(d->train_prons);
}

/* A batch of pronunciations, padded to its longest word and pronunciation:
   tokens (B,T) letters; tgt_in (B,Tt) start token then the phones; targets (B,Tt) the phones then
   the end token, -100 after it (not counted). */
typedef struct batch_buf { int32_t tokens[MAX_SRC * 512], lens[512], tgt_in[MAX_TGT * 512], targets[MAX_TGT * 512]; } batch_buf;

static tfm_batch make_batch(batch_buf *bb, const ex_pron *prons, const int32_t *idx, int b) {
    tfm_batch bt = {0};
    int i, t, T = 1, Tt = 1;
    for (i = 0; i < b; i++) {
        int n = (int)strlen(prons[idx[i]].word);
        if (n > T) T = n;
        if (prons[idx[i]].n_phones + 1 > Tt) Tt = prons[idx[i]].n_phones + 1;
    }
    for (i = 0; i < b; i++) {
        const ex_pron *p = &prons[idx[i]];
        int32_t ids[MAX_SRC];
        int n = encode_word(p->word, ids);
        for (t = 0; t < T; t++) bb->tokens[i * T + t] = t < n ? ids[t] : 0;
        bb->lens[i] = n;
        for (t = 0; t < Tt; t++) {
            bb->tgt_in[i * Tt + t] = t == 0 ? BOS : t <= p->n_phones ? PHONE0 + p->phones[t - 1] : 0;
            bb->targets[i * Tt + t] = t < p->n_phones ? PHONE0 + p->phones[t] : t == p->n_phones ? EOS : -100;
        }
    }
    bt.batch = b;
    bt.len = T;
    bt.tokens = bb->tokens;
    bt.lens = bb->lens;
    bt.tgt_len = Tt;
    bt.tgt_in = bb->tgt_in;
    bt.targets = bb->targets;
    return bt;
}

enum { MAX_BEST = 8 }; /* most pronunciations asked of one word */

/* Up to n_best pronunciations of a word, likeliest first: hypothesis k's phones (indices of
   ex_phones) in out[k], their number in n_ph[k], its log-probability in logp[k] (may be NULL).
   beam 0 decodes greedily (tfm_model_generate, one hypothesis); beam >= 1 keeps that many
   hypotheses per step (tfm_model_beam_search). Returns how many were found, -1 if the word has a
   character without an id. */
static int pronounce(tfm_model *m, const char *w, int beam, int n_best, int8_t (*out)[MAX_TGT], int *n_ph,
                     float *logp) {
    int32_t src[MAX_SRC], bos = BOS, gen[MAX_BEST * MAX_TGT];
    int n_src = encode_word(w, src), lens[MAX_BEST], n_found = 0, i, k;
    float scores[MAX_BEST];
    tfm_gen_opts g = {0};
    if (n_src <= 0) return -1;
    g.max_new = MAX_TGT - 1;
    g.has_stop = 1;
    g.stop_token = EOS;
    if (beam == 0) {
        ex_check(tfm_model_generate(m, src, n_src, &bos, 1, &g, gen, &lens[0]), "tfm_model_generate");
        n_found = 1;
        scores[0] = 0; /* not computed */
    } else {
        g.beam_width = beam;
        ex_check(tfm_model_beam_search(m, src, n_src, &bos, 1, &g, n_best < beam ? n_best : beam, gen, MAX_TGT, lens,
                                       scores, &n_found), "tfm_model_beam_search");
    }
    for (k = 0; k < n_found; k++) {
        n_ph[k] = 0;
        for (i = 0; i < lens[k] && gen[k * MAX_TGT + i] != EOS; i++)
            if (gen[k * MAX_TGT + i] >= PHONE0) out[k][n_ph[k]++] = (int8_t)(gen[k * MAX_TGT + i] - PHONE0);
        if (logp) logp[k] = scores[k];
    }
    return n_found;
}

/* Phones as upper-case ARPAbet, "T R AE N S", into buf. */
static const char *phones_str(const int8_t *ph, int n, char *buf, size_t size) {
    size_t k = 0;
    int i, j;
    buf[0] = 0;
    for (i = 0; i < n && k + 4 < size; i++) {
        if (i) buf[k++] = ' ';
        for (j = 0; ex_phones[ph[i]][j]; j++) buf[k++] = (char)toupper((unsigned char)ex_phones[ph[i]][j]);
    }
    buf[k] = 0;
    return buf;
}

/* Word and phoneme error rates on words[0..n), decoding with beam (0: greedy). show > 0 prints that many. */
static void score(tfm_model *m, const dataset *d, const int32_t *words, int64_t n, int beam, double *wer, double *per,
                  int show) {
    int64_t i, wrong = 0, dist = 0, len = 0;
    for (i = 0; i < n; i++) {
        const word *w = &d->words[words[i]];
        int8_t out[1][MAX_TGT];
        int32_t a[MAX_TGT], b[MAX_TGT];
        int n_out = 0, k, j, best = 1 << 30, best_len = 1;
        if (pronounce(m, d->prons[w->first].word, beam, 1, out, &n_out, NULL) < 1) n_out = 0;
        for (j = 0; j < n_out; j++) a[j] = out[0][j];
        for (k = 0; k < w->count; k++) { /* the closest of the word's pronunciations */
            const ex_pron *p = &d->prons[w->first + k];
            int e;
            for (j = 0; j < p->n_phones; j++) b[j] = p->phones[j];
            e = ex_edit_distance(a, n_out, b, p->n_phones);
            if (e < best) { best = e; best_len = p->n_phones; }
        }
        wrong += best > 0;
        dist += best;
        len += best_len;
        if (i < show) {
            char got[128], want[128];
            printf("  %-16s %-30s %s", d->prons[w->first].word, phones_str(out[0], n_out, got, sizeof got),
                   best == 0 ? "ok\n" : "wrong, dictionary: ");
            if (best > 0) printf("%s\n", phones_str(d->prons[w->first].phones, d->prons[w->first].n_phones, want, sizeof want));
        }
    }
    *wer = n ? (double)wrong / (double)n : 0;
    *per = len ? (double)dist / (double)len : 0;
}

/* Mean cross-entropy per phone over the pronunciations of words[0..n) (teacher forcing). */
static double val_loss(tfm_model *m, const dataset *d, const int32_t *words, int64_t n, int batch, batch_buf *bb) {
    int32_t *idx = (int32_t *)ex_malloc((size_t)batch * sizeof(int32_t));
    double total = 0, count = 0;
    int64_t i = 0, k;
    tfm_model_train(m, 0);
    while (i < n) {
        int b = 0;
        tfm_batch bt;
        float loss;
        int64_t counted;
        while (i < n && b + d->words[words[i]].count <= batch) {
            for (k = 0; k < d->words[words[i]].count; k++) idx[b++] = d->words[words[i]].first + (int32_t)k;
            i++;
        }
        if (b == 0) ex_die("val_loss: a word has more pronunciations than the batch size");
        bt = make_batch(bb, d->prons, idx, b);
        ex_check(tfm_model_forward(m, &bt, &loss, &counted), "validation forward");
        total += (double)loss * (double)counted; /* counted: the phones and end tokens of the batch */
        count += (double)counted;
    }
    tfm_model_train(m, 1);
    free(idx);
    return total / count;
}

static void train(const options *o) {
    dataset d;
    tfm_config cfg = {0};
    tfm_optim opt = {0};
    tfm_model m;
    batch_buf *bb = (batch_buf *)ex_malloc(sizeof(batch_buf));
    int32_t *order, *len_key;
    int64_t steps_per_epoch, total_steps, step, n_val_words, i;
    ex_log lg;
    double t0, wer, per, v[2];
    float loss = 0;

    /* 1. data */
    dataset_load(&d, o);
    printf("%s: %lld pronunciations of %lld words; split by word: %lld train (%lld pronunciations), "
           "%lld validation, %lld test\n", o->t.data, (long long)d.n_prons, (long long)d.n_words,
           (long long)d.n_train, (long long)d.n_train_prons, (long long)d.n_val, (long long)d.n_test);
    n_val_words = d.n_val < o->val_words ? d.n_val : o->val_words;

    /* 2. the model */
    cfg.kind = TFM_MODEL_ENCODER_DECODER;
    cfg.vocab_size = SRC_VOCAB;
    cfg.tgt_vocab_size = TGT_VOCAB;
    cfg.d_model = o->t.d_model;
    cfg.n_heads = o->t.n_heads;
    cfg.n_layers = o->t.n_layers;
    cfg.n_dec_layers = o->t.n_layers;
    cfg.d_ff = o->t.d_ff;
    cfg.max_len = MAX_SRC;
    cfg.max_tgt_len = MAX_TGT;
    cfg.max_batch = o->t.batch;
    cfg.pos = TFM_POS_SINUSOIDAL;
    cfg.scale_emb = 1;
    cfg.tie_output = 1;
    cfg.dropout = o->t.dropout;
    cfg.label_smoothing = 0.1f;
    cfg.init = TFM_INIT_XAVIER;
    cfg.seed = o->t.seed;
    if (o->t.resume && ex_file_exists(o->t.model)) {
        check_vocab(o->t.model);
        ex_check(tfm_config_load(o->t.model, &cfg), o->t.model);
        cfg.max_batch = o->t.batch;
        ex_check(tfm_model_init(&m, &cfg, NULL, 0), "tfm_model_init");
        ex_check(tfm_model_load(&m, o->t.model), o->t.model);
        printf("resumed from %s at step %lld\n", o->t.model, (long long)m.step);
    } else {
        ex_check(tfm_model_init(&m, &cfg, NULL, 0), "tfm_model_init");
    }
    printf("model: %d+%d layers, d_model %d, %d heads, d_ff %d, %lld parameters; sgemm: %s\n", cfg.n_layers,
           cfg.n_dec_layers, cfg.d_model, cfg.n_heads, cfg.d_ff, (long long)m.n_weights, ex_sgemm());

    steps_per_epoch = d.n_train_prons / o->t.batch;
    total_steps = o->smoke ? 6 : steps_per_epoch * o->t.epochs;
    opt.lr = o->t.lr;
    opt.beta2 = 0.98f;
    opt.weight_decay = o->t.weight_decay;
    opt.clip_norm = 1.0f;
    opt.schedule = TFM_SCHED_COSINE;
    opt.warmup_steps = (int)(total_steps > 200 ? 100 : total_steps / 25);
    opt.total_steps = (int)total_steps;
    opt.min_lr = o->t.lr * o->t.min_lr_frac;

    order = (int32_t *)ex_malloc((size_t)d.n_train_prons * sizeof(int32_t));
    len_key = (int32_t *)ex_malloc((size_t)d.n_prons * sizeof(int32_t)); /* what a pronunciation pads to */
    for (i = 0; i < d.n_prons; i++) len_key[i] = (int32_t)strlen(d.prons[i].word) * MAX_TGT + d.prons[i].n_phones;
    ex_log_start(&lg, &o->t, "step,epoch,train_loss,val_loss,val_wer", 2, "words", o->t.batch, m.step,
                 total_steps, (double)steps_per_epoch);

    /* 3. training */
    t0 = ex_now();
    for (step = m.step; step < total_steps; step++) {
        int64_t epoch = step / steps_per_epoch, k = step % steps_per_epoch;
        tfm_batch bt;
        if (k == 0 || step == m.step) { /* the epoch's order, in buckets of similar lengths: less padding */
            tfm_rng r;
            ex_epoch_order(order, d.train_prons, d.n_train_prons, o->t.seed, epoch);
            tfm_rng_seed(&r, o->t.seed * 7919u + (uint64_t)epoch);
            ex_bucket(order, d.n_train_prons, o->t.batch, 50, len_key, &r);
        }
        bt = make_batch(bb, d.prons, order + k * o->t.batch, o->t.batch);
        tfm_model_zero_grad(&m);
        ex_check(tfm_model_forward(&m, &bt, &loss, NULL), "forward");
        ex_check(tfm_model_backward(&m, 1.0f), "backward");
        ex_check(tfm_model_step(&m, &opt, NULL), "step");
        total_steps = ex_log_step(&lg, step, loss, &opt); /* progress line, loss curve, --time (the demo) */
        if ((step + 1) % o->t.eval_every == 0 || step + 1 == total_steps) {
            v[0] = val_loss(&m, &d, d.val, o->smoke ? 20 : d.n_val, o->t.batch, bb);
            score(&m, &d, d.val, o->smoke ? 5 : n_val_words, 0, &wer, &per, 0); /* greedy: quick */
            v[1] = wer;
            ex_log_val(&lg, step + 1, v);
            printf("step %lld: validation loss %.4f; on %lld validation words WER %.2f%%, PER %.2f%%\n",
                   (long long)(step + 1), v[0], (long long)(o->smoke ? 5 : n_val_words), 100 * wer, 100 * per);
            {
                tfm_kv meta[2];
                meta[0].key = "letters";
                meta[0].value = LETTERS;
                meta[1].key = "phones";
                meta[1].value = phone_list();
                ex_check(tfm_model_save(&m, o->t.model, TFM_SAVE_TRAINING_STATE, meta, 2), o->t.model); /* atomic */
            }
        }
    }
    ex_log_end(&lg, step, &opt); /* the last progress line, in full */
    printf("training took %.1f min\n", (ex_now() - t0) / 60);

    /* 4. the test split, once, with the final model, greedy and with the beam (the demo scores 1,000
       test words, to be quick) */
    {
        int64_t n_test = o->smoke ? 10 : o->demo && d.n_test > 1000 ? 1000 : d.n_test;
        int show = o->demo ? 16 : o->smoke ? 3 : 0, pass;
        for (pass = 0; pass < 2; pass++) {
            int beam = pass == 0 ? 0 : o->beam;
            int shown = pass == 1 || o->beam == 0 ? show : 0; /* the words of the last pass */
            double t1 = ex_now();
            char how[32];
            if (pass == 1 && beam == 0) break;
            if (shown) printf("words from the test split, never seen in training:\n");
            score(&m, &d, d.test, n_test, beam, &wer, &per, shown);
            if (beam) snprintf(how, sizeof how, "beam search, width %d", beam);
            else snprintf(how, sizeof how, "greedy decoding");
            printf("test: %lld words, word error rate %.2f%%, phoneme error rate %.2f%% (%s, %.0f words/s)\n",
                   (long long)n_test, 100 * wer, 100 * per, how, (double)n_test / (ex_now() - t1));
        }
    }
    printf("model saved to %s; pronounce words with: g2p --model %s WORD...\n", o->t.model, o->t.model);

    free(order);
    free(len_key);
    free(bb);
    tfm_model_free(&m);
    dataset_free(&d);
}

/* Inference: the saved model without training state, batch rows for the beam; each word on the
   command line, with its --n-best likeliest pronunciations. */
static void pronounce_words(const options *o, int n, char **words) {
    tfm_config cfg;
    tfm_model m;
    int i, k;
    check_vocab(o->t.model);
    ex_check(tfm_config_load(o->t.model, &cfg), o->t.model);
    cfg.max_batch = o->beam > 1 ? o->beam : 1; /* the beam's hypotheses decode as batch rows */
    cfg.inference_only = 1;
    ex_check(tfm_model_init(&m, &cfg, NULL, 0), "tfm_model_init");
    ex_check(tfm_model_load(&m, o->t.model), o->t.model);
    for (i = 0; i < n; i++) {
        int8_t ph[MAX_BEST][MAX_TGT];
        int n_ph[MAX_BEST];
        float logp[MAX_BEST];
        int found = pronounce(&m, words[i], o->beam, o->n_best, ph, n_ph, logp);
        if (found < 0) {
            printf("%-16s (only letters and ' . - can be pronounced)\n", words[i]);
            continue;
        }
        for (k = 0; k < found; k++) {
            char buf[128];
            printf("%-16s ", k == 0 ? words[i] : "");
            if (o->beam && o->n_best > 1) printf("%-30s p = %.3f\n", phones_str(ph[k], n_ph[k], buf, sizeof buf), exp((double)logp[k]));
            else printf("%s\n", phones_str(ph[k], n_ph[k], buf, sizeof buf));
        }
    }
    tfm_model_free(&m);
}

static void usage(const options *d) {
    printf("usage: g2p [options]            train, validate, test\n"
           "       g2p [options] WORD...    pronounce words with the saved model\n"
           "  --beam N          beam width for the test split and for words (default %d; 0: greedy)\n"
           "  --n-best N        words: print the N likeliest pronunciations (default %d, at most the beam)\n"
           "  --val-words N     validation words decoded at each validation (default %d)\n"
           "  --split-seed N    the shuffle of the words before the 90/5/5 split (default %llu)\n"
           "  --demo            the `make demo` settings: CMUdict 0.7b shipped in examples/data, a small\n"
           "                    model, 2 minutes of training\n"
           "  --smoke           a tiny model for a few steps (seconds)\n",
           d->beam, d->n_best, d->val_words, (unsigned long long)d->split_seed);
    ex_train_usage(&d->t); /* data: CMUdict 0.4 or 0.7b, plain, .gz or .xz */
}

int main(int argc, char **argv) {
    options o, defaults;
    int i, first_word = 0;
    memset(&o, 0, sizeof o);
    o.t.data = "/usr/share/festival/dicts/cmu/cmudict-0.4.out";
    o.t.model = "runs/g2p.safetensors";
    o.t.csv = "runs/g2p.csv";
    o.t.batch = 64;
    o.t.epochs = 20;      /* what a 45-minute budget reached at two threads on a 2-core AVX-512 machine */
    o.t.d_model = 192;
    o.t.n_heads = 4;
    o.t.n_layers = 3;
    o.t.d_ff = 768;
    o.t.lr = 1e-3f;
    o.t.dropout = 0.1f;
    o.t.weight_decay = 0.01f;
    o.t.min_lr_frac = 0.02f;
    o.t.eval_every = 1000;
    o.val_words = 1000;
    o.t.seed = 1;
    o.split_seed = 1;
    o.beam = 4;
    o.n_best = 1;
    defaults = o;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (ex_is(a, "--demo")) { /* presets first, so that other options can change them */
            o.demo = 1;
            o.t.data = "examples/data/cmudict-0.7b.txt.gz";
            o.t.model = "runs/demo-g2p.safetensors";
            o.t.csv = "runs/demo-g2p.csv";
            o.t.d_model = 128; o.t.n_layers = 2; o.t.d_ff = 512; o.t.batch = 64; o.t.epochs = 100;
            o.t.time_budget = 120; o.t.eval_every = 1 << 30; o.val_words = 300;
        }
        if (ex_is(a, "--smoke")) {
            o.smoke = 1;
            o.t.d_model = 32; o.t.n_layers = 1; o.t.d_ff = 64; o.t.n_heads = 2; o.t.batch = 16; o.t.eval_every = 3;
            o.t.model = "runs/g2p-smoke.safetensors";
            o.t.csv = "runs/g2p-smoke.csv";
        }
    }
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (ex_is(a, "--demo") || ex_is(a, "--smoke")) continue; /* presets, read above */
        else if (ex_train_opt(&o.t, argc, argv, &i)) continue; /* --model, --batch, ... */
        else if (ex_is(a, "--val-words")) o.val_words = ex_int(argc, argv, &i);
        else if (ex_is(a, "--split-seed")) o.split_seed = (uint64_t)ex_int(argc, argv, &i);
        else if (ex_is(a, "--beam")) o.beam = ex_int(argc, argv, &i);
        else if (ex_is(a, "--n-best")) o.n_best = ex_int(argc, argv, &i);
        else if (ex_is(a, "-h") || ex_is(a, "--help")) { usage(&defaults); return 0; }
        else if (a[0] == '-' && a[1] == '-') { usage(&defaults); ex_die("unknown option %s", a); }
        else { first_word = i; break; }
    }
    if (o.t.batch > 512) ex_die("--batch: at most 512");
    if (o.beam < 0 || o.beam >= TGT_VOCAB) ex_die("--beam: from 0 (greedy) to %d", TGT_VOCAB - 1);
    if (o.n_best < 1 || o.n_best > MAX_BEST || (o.n_best > 1 && o.n_best > o.beam))
        ex_die("--n-best: from 1 to the beam width (at most %d)", MAX_BEST);
    ex_train_opts_apply(&o.t);
    if (first_word) pronounce_words(&o, argc - first_word, argv + first_word);
    else train(&o);
    return 0;
}
