/* fashion.c - an image classifier: a small vision transformer (ViT) reads a Fashion-MNIST image as
   49 patches of 4x4 pixels, each seen with the pixels around it, and says which of 10 kinds of
   clothing it shows.

   Data: Fashion-MNIST from Debian's dataset-fashion-mnist package
   (/usr/share/datasets/fashion-mnist/, the four *-ubyte.gz files): 60,000 training and 10,000 test images of 28x28
   grey pixels, 10 balanced classes. The images are read with common.h's IDX reader (through gzip).

   Split: the 60,000 training images are shuffled with --split-seed (default 1); the last 5,000 are
   the validation split, the other 55,000 train. The 10,000 test images are scored once, at the end.

   Model: continuous inputs (cfg.input_dim = 64: each 4x4 patch's token is the 8x8 pixels around
   it, which go through a learned linear projection instead of a token embedding; --overlap 0 gives
   the 16 pixels of the patch alone, --patch 7 gives 16 patches of 7x7), learned positions,
   a pre-LN encoder with GELU, Xavier-initialised, the mean of the patches' outputs (TFM_POOL_MEAN;
   with --cls, a learned class vector prepended to the patches, cfg.cls_token, and TFM_POOL_CLS)
   into a linear head over the 10 classes. Training flips images left-right at random (clothes stay
   clothes; --shift N also moves them by up to N pixels, --erase P covers a random rectangle with noise
   in a share P of them); validation, test and classification take the
   mean of the probabilities for an image and for its mirror image.

       build/fashion                           train (defaults: 20 epochs, about 29 minutes on 2 cores), then test
       build/fashion --time 1740               train for 29 minutes instead, whatever the epochs
       build/fashion --resume                  continue from the saved checkpoint
       build/fashion --index 0 --index 17      classify test images by index, with probabilities
       build/fashion --classify shirt.pgm      classify a 28x28 greyscale PGM (P5) image
       build/fashion --smoke                   a few steps on a tiny model (seconds), for CI

   Writes runs/fashion.safetensors (the model, with its optimizer state for --resume) and
   runs/fashion.csv (train and validation loss per step). */
#define TFM_IMPLEMENTATION
#include "common.h"

#define DIR "/usr/share/datasets/fashion-mnist/"
enum { SIDE = 28, PIXELS = SIDE * SIDE, N_CLASS = 10 };

#define CLASSES "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"
static const char *const class_names[N_CLASS] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                  "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

typedef struct options {
    ex_train_opts t;      /* --data (the directory), --model, --batch, ... (common.h) */
    int smoke, augment;   /* augment: random left-right flips of the training images... */
    int shift;            /* ...and shifts by up to this many pixels */
    float erase;          /* ...and, with this probability, a rectangle of random pixels over the image */
    float smoothing;      /* cross-entropy label smoothing */
    int patch, overlap;   /* the side of a patch in pixels; how many pixels of each neighbour its token also sees */
    int cls;              /* pool a class vector instead of the mean */
    uint64_t split_seed;
} options;

typedef struct images { unsigned char *pix; unsigned char *labels; int n; } images;

static images load(const options *o, const char *which) {
    char ip[1024], lp[1024];
    int di[3], dl[3];
    images s;
    snprintf(ip, sizeof ip, "%s/%s-images-idx3-ubyte.gz", o->t.data, which);
    snprintf(lp, sizeof lp, "%s/%s-labels-idx1-ubyte.gz", o->t.data, which);
    ex_need_file(ip, "Fashion-MNIST comes with Debian's dataset-fashion-mnist package: apt-get install dataset-fashion-mnist");
    ex_need_file(lp, "Fashion-MNIST comes with Debian's dataset-fashion-mnist package: apt-get install dataset-fashion-mnist");
    s.pix = ex_idx_read(ip, 3, di);
    s.labels = ex_idx_read(lp, 1, dl);
    if (di[1] != SIDE || di[2] != SIDE) ex_die("%s: images are %dx%d, want 28x28", ip, di[1], di[2]);
    if (di[0] != dl[0]) ex_die("%s has %d images but %s %d labels", ip, di[0], lp, dl[0]);
    s.n = di[0];
    return s;
}

/* A pixel's value from its brightness in [0, 1], scaled to about zero mean and unit variance over
   the data set. */
static float pixel(float v) { return (v - 0.286f) / 0.353f; }

/* One image as SIDE x SIDE scaled pixels, row by row. flip, dx, dy: the augmentation (0 for none);
   what moves in from outside the image is black. */
static void image(const unsigned char *img, float *out, int flip, int dx, int dy) {
    int y, x;
    for (y = 0; y < SIDE; y++)
        for (x = 0; x < SIDE; x++) {
            int sy = y - dy, sx = x - dx, v = 0;
            if (flip) sx = SIDE - 1 - sx;
            if (sy >= 0 && sy < SIDE && sx >= 0 && sx < SIDE) v = img[sy * SIDE + sx];
            out[y * SIDE + x] = pixel((float)v / 255.0f);
        }
}

/* Random erasing (Zhong et al., 2017): a rectangle of 2-40% of the image, of aspect ratio 0.3 to 3.3,
   at a random place, filled with random pixels. The model has to tell the clothes from what is left
   of them. */
static void erase(float *img, tfm_rng *r) {
    int h, w, y0, x0, y, x;
    for (;;) { /* draw until the rectangle fits, as the paper does */
        float area = (0.02f + 0.38f * tfm_rng_uniform(r)) * PIXELS;
        float aspect = expf(logf(0.3f) + (logf(3.3f) - logf(0.3f)) * tfm_rng_uniform(r));
        h = (int)(sqrtf(area * aspect) + 0.5f);
        w = (int)(sqrtf(area / aspect) + 0.5f);
        if (h >= 1 && w >= 1 && h <= SIDE && w <= SIDE) break;
    }
    y0 = (int)(tfm_rng_u64(r) % (uint64_t)(SIDE - h + 1));
    x0 = (int)(tfm_rng_u64(r) % (uint64_t)(SIDE - w + 1));
    for (y = y0; y < y0 + h; y++)
        for (x = x0; x < x0 + w; x++) img[y * SIDE + x] = pixel(tfm_rng_uniform(r));
}

/* The tokens of an image: the image is cut into patches of p x p pixels, row by row, and patch k's
   token is the w x w pixels (w >= p, w - p even) centred on it, row by row: with w = p the patch
   itself, with w > p a window that also sees (w - p) / 2 pixels of each neighbour (black outside the
   image), as a convolution of stride p would. */
static int n_patches(int p) { return (SIDE / p) * (SIDE / p); }
static void tokens(const float *img, int p, int w, float *out) {
    int k, u, v, m = (w - p) / 2;
    for (k = 0; k < n_patches(p); k++) {
        int y0 = (k / (SIDE / p)) * p - m, x0 = (k % (SIDE / p)) * p - m;
        for (u = 0; u < w; u++)
            for (v = 0; v < w; v++) {
                int y = y0 + u, x = x0 + v;
                *out++ = y >= 0 && y < SIDE && x >= 0 && x < SIDE ? img[y * SIDE + x] : pixel(0);
            }
    }
}

/* A model's patch side p (from its number of tokens) and window w (from its input width, w * w). */
static void geometry(const tfm_config *cfg, int *p, int *w) {
    int n = 1;
    while ((n + 1) * (n + 1) <= cfg->max_len) n++;
    *w = 1;
    while ((*w + 1) * (*w + 1) <= cfg->input_dim) ++*w;
    *p = SIDE / n;
    if (n * n != cfg->max_len || SIDE % n || *w * *w != cfg->input_dim || *w < *p || *w > 3 * *p || (*w - *p) % 2)
        ex_die("a model of %d tokens of %d inputs: not patches of this example", cfg->max_len, cfg->input_dim);
}
static int64_t token_floats(const tfm_config *cfg) { return (int64_t)cfg->max_len * cfg->input_dim; }

/* The model's config for training (resuming and inference read it from the checkpoint). */
static void make_config(const options *o, tfm_config *cfg) {
    int w = o->patch + 2 * o->overlap; /* each token is a patch's window of w x w pixels, projected to d_model */
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = TFM_MODEL_ENCODER_CLASSIFIER;
    cfg->input_dim = w * w;
    cfg->cls_token = o->cls;      /* with --cls, a learned [CLS] vector before the patches... */
    cfg->pool = o->cls ? TFM_POOL_CLS : TFM_POOL_MEAN; /* ...whose output the head reads; else the mean */
    cfg->init = TFM_INIT_XAVIER;  /* ViT's: it learns faster here than N(0, 0.02) */
    cfg->n_classes = N_CLASS;
    cfg->d_model = o->t.d_model;
    cfg->n_heads = o->t.n_heads;
    cfg->n_layers = o->t.n_layers;
    cfg->d_ff = o->t.d_ff;
    cfg->max_len = n_patches(o->patch);
    cfg->norm_first = 1;
    cfg->act = TFM_ACT_GELU;
    cfg->dropout = o->t.dropout;
    cfg->label_smoothing = o->smoothing;
    cfg->seed = o->t.seed;
}

/* Class probabilities (b, N_CLASS) of b images, image k at pix + rows[k] * PIXELS (rows NULL: k): the
   mean of the model's softmax over the image and over its left-right mirror. Training flips images, so
   the model knows both, and their mean is right more often than either alone (on the validation and
   the test images of every model measured). in: space for b images' tokens (token_floats each). */
static void predict(tfm_model *m, const unsigned char *pix, const int32_t *rows, int b, float *in, float *prob) {
    int k, c, flip, p, w;
    float img[PIXELS];
    geometry(&m->cfg, &p, &w);
    for (k = 0; k < b * N_CLASS; k++) prob[k] = 0;
    for (flip = 0; flip < 2; flip++) {
        tfm_batch bt = {0};
        const float *z;
        for (k = 0; k < b; k++) {
            image(pix + (int64_t)(rows ? rows[k] : k) * PIXELS, img, flip, 0, 0);
            tokens(img, p, w, in + k * token_floats(&m->cfg));
        }
        bt.batch = b;
        bt.len = m->cfg.max_len;
        bt.inputs = in;
        ex_check(tfm_model_forward(m, &bt, NULL, NULL), "predict");
        z = tfm_model_logits(m).data; /* (b, 10) */
        for (k = 0; k < b; k++) {
            float mx = z[k * N_CLASS], sum = 0, e[N_CLASS];
            for (c = 1; c < N_CLASS; c++) mx = z[k * N_CLASS + c] > mx ? z[k * N_CLASS + c] : mx;
            for (c = 0; c < N_CLASS; c++) sum += e[c] = expf(z[k * N_CLASS + c] - mx);
            for (c = 0; c < N_CLASS; c++) prob[k * N_CLASS + c] += 0.5f * e[c] / sum;
        }
    }
}

/* Loss (the cross-entropy of predict's probabilities) and accuracy on rows idx[0..n) of a set (idx
   NULL: the first n), in evaluation mode. prob: space for batch rows of probabilities. */
static double evaluate(tfm_model *m, const images *s, const int32_t *idx, int n, int batch, float *in, int32_t *rows,
                       float *prob, double *acc) {
    int i, k, c, correct = 0;
    double total = 0;
    tfm_model_train(m, 0);
    for (i = 0; i < n; i += batch) {
        int b = n - i < batch ? n - i : batch;
        for (k = 0; k < b; k++) rows[k] = idx ? idx[i + k] : i + k;
        predict(m, s->pix, rows, b, in, prob);
        for (k = 0; k < b; k++) {
            const float *pk = prob + k * N_CLASS;
            int best = 0, y = s->labels[rows[k]];
            for (c = 1; c < N_CLASS; c++)
                if (pk[c] > pk[best]) best = c;
            correct += best == y;
            total -= log(pk[y] > 1e-30f ? pk[y] : 1e-30f);
        }
    }
    tfm_model_train(m, 1);
    *acc = (double)correct / n;
    return total / n;
}

static void train(const options *o) {
    images tr = load(o, "train"), te = load(o, "t10k");
    int32_t *perm = ex_permutation(tr.n, o->split_seed), *order, *lab;
    int n_train = tr.n - 5000, n_val = 5000, n_test = te.n, k;
    tfm_config cfg = {0};
    tfm_optim opt = {0};
    tfm_model m;
    float *in, *prob, loss = 0;
    int64_t steps_per_epoch, total_steps, step;
    ex_log lg;
    int p, w;
    double t0, v[2];

    if (o->smoke) { n_train = 512; n_val = 128; n_test = 128; }
    printf("Fashion-MNIST: %d train, %d validation (from the training images, seed %llu), %d test\n", n_train,
           n_val, (unsigned long long)o->split_seed, n_test);

    make_config(o, &cfg);
    if (o->t.resume && ex_file_exists(o->t.model)) ex_check(tfm_config_load(o->t.model, &cfg), o->t.model);
    geometry(&cfg, &p, &w); /* a checkpoint to resume: a model of this example? */
    cfg.max_batch = o->t.batch;
    ex_check(tfm_model_init(&m, &cfg, NULL, 0), "tfm_model_init");
    if (o->t.resume && ex_file_exists(o->t.model)) {
        ex_check(tfm_model_load(&m, o->t.model), o->t.model);
        printf("resumed from %s at step %lld\n", o->t.model, (long long)m.step);
    }
    printf("model: %d patches of %dx%d pixels (each token sees %dx%d), %d layers, d_model %d, %d heads, %lld parameters; "
           "sgemm: %s\n", n_patches(p), p, p, w, w, cfg.n_layers, cfg.d_model, cfg.n_heads, (long long)m.n_weights,
           ex_sgemm());

    steps_per_epoch = n_train / o->t.batch;
    total_steps = o->smoke ? 6 : steps_per_epoch * o->t.epochs;
    opt.lr = o->t.lr;
    opt.weight_decay = o->t.weight_decay;
    opt.clip_norm = 1.0f;
    opt.schedule = TFM_SCHED_COSINE;
    /* warmup: 5% of the length, at most 0.6 epochs (5% of 12), the same whether the length is set in
       epochs or refitted to --time */
    opt.warmup_steps = (int)((total_steps < steps_per_epoch * 12 ? total_steps : steps_per_epoch * 12) / 20);
    opt.total_steps = (int)total_steps;
    opt.min_lr = o->t.lr * o->t.min_lr_frac;

    order = (int32_t *)ex_malloc((size_t)n_train * sizeof(int32_t));
    in = (float *)ex_malloc((size_t)(o->t.batch * token_floats(&cfg)) * sizeof(float));
    lab = (int32_t *)ex_malloc((size_t)o->t.batch * sizeof(int32_t));
    prob = (float *)ex_malloc((size_t)o->t.batch * N_CLASS * sizeof(float));
    ex_log_start(&lg, &o->t, "step,epoch,train_loss,val_loss,val_accuracy", 2, "images", o->t.batch, m.step,
                 total_steps, (double)steps_per_epoch);
    t0 = ex_now();
    for (step = m.step; step < total_steps; step++) {
        int64_t epoch = step / steps_per_epoch, j = step % steps_per_epoch;
        tfm_rng r;
        tfm_batch bt = {0};
        if (j == 0 || step == m.step) ex_epoch_order(order, perm, n_train, o->t.seed, epoch);
        tfm_rng_seed(&r, o->t.seed * 7919u + (uint64_t)step); /* this step's augmentation */
        for (k = 0; k < o->t.batch; k++) {
            int row = order[j * o->t.batch + k];
            uint64_t u = tfm_rng_u64(&r);
            int flip = o->augment ? (int)(u & 1) : 0, s = o->augment ? o->shift : 0;
            int dx = (int)((u >> 8) % (uint64_t)(2 * s + 1)) - s, dy = (int)((u >> 16) % (uint64_t)(2 * s + 1)) - s;
            float img[PIXELS];
            image(tr.pix + (int64_t)row * PIXELS, img, flip, dx, dy);
            if (o->augment && o->erase > 0 && tfm_rng_uniform(&r) < o->erase) erase(img, &r);
            tokens(img, p, w, in + k * token_floats(&cfg));
            lab[k] = tr.labels[row];
        }
        bt.batch = o->t.batch;
        bt.len = cfg.max_len;
        bt.inputs = in;
        bt.targets = lab;
        tfm_model_zero_grad(&m);
        ex_check(tfm_model_forward(&m, &bt, &loss, NULL), "forward");
        ex_check(tfm_model_backward(&m, 1.0f), "backward");
        ex_check(tfm_model_step(&m, &opt, NULL), "step");
        total_steps = ex_log_step(&lg, step, loss, &opt); /* progress line, loss curve, --time */
        if ((step + 1) % o->t.eval_every == 0 || step + 1 == total_steps) {
            v[0] = evaluate(&m, &tr, perm + tr.n - 5000, n_val, o->t.batch, in, lab, prob, &v[1]);
            ex_log_val(&lg, step + 1, v);
            printf("step %lld: validation loss %.4f, accuracy %.2f%%\n", (long long)(step + 1), v[0], 100 * v[1]);
            {
                tfm_kv meta[1];
                meta[0].key = "classes";
                meta[0].value = CLASSES;
                ex_check(tfm_model_save(&m, o->t.model, TFM_SAVE_TRAINING_STATE, meta, 1), o->t.model); /* atomic */
            }
        }
    }
    ex_log_end(&lg, step, &opt); /* the last progress line, in full */
    printf("training took %.1f min\n", (ex_now() - t0) / 60);

    v[0] = evaluate(&m, &te, NULL, n_test, o->t.batch, in, lab, prob, &v[1]);
    printf("test: %d images, loss %.4f, accuracy %.2f%%\n", n_test, v[0], 100 * v[1]);
    printf("model saved to %s; classify test images with: fashion --model %s --index 0\n", o->t.model, o->t.model);

    free(order);
    free(in);
    free(lab);
    free(prob);
    free(perm);
    free(tr.pix);
    free(tr.labels);
    free(te.pix);
    free(te.labels);
    tfm_model_free(&m);
}

/* A binary PGM (P5) of 28x28 pixels with maxval 255, white clothes on black as in Fashion-MNIST. */
static void read_pgm(const char *path, unsigned char *img) {
    ex_buf b = ex_read_file(path);
    int w, h, maxv, used = 0;
    if (sscanf((const char *)b.data, "P5 %d %d %d%n", &w, &h, &maxv, &used) != 3 || used == 0)
        ex_die("%s: not a binary PGM (P5) file", path);
    if (w != SIDE || h != SIDE || maxv != 255) ex_die("%s: %dx%d with maxval %d; want 28x28, 255", path, w, h, maxv);
    used++; /* the one whitespace byte after maxval */
    if (b.len < (size_t)used + PIXELS) ex_die("%s: truncated", path);
    memcpy(img, b.data + used, PIXELS);
    ex_buf_free(&b);
}

/* Inference: the saved model, batch 1; each image's class probabilities. */
static void classify(const options *o, int n, char **what, const int *is_index) {
    tfm_config cfg;
    tfm_model m;
    images te = {0};
    float *in, p[N_CLASS];
    int i, c, side, window;
    ex_check_meta(o->t.model, "classes", CLASSES);
    ex_check(tfm_config_load(o->t.model, &cfg), o->t.model);
    geometry(&cfg, &side, &window); /* a model of this example? */
    cfg.max_batch = 1;
    cfg.inference_only = 1;
    ex_check(tfm_model_init(&m, &cfg, NULL, 0), "tfm_model_init");
    ex_check(tfm_model_load(&m, o->t.model), o->t.model);
    in = (float *)ex_malloc((size_t)token_floats(&cfg) * sizeof(float));
    for (i = 0; i < n; i++) {
        unsigned char img[PIXELS];
        int best = 0, truth = -1;
        if (is_index[i]) {
            int k = atoi(what[i]);
            if (!te.pix) te = load(o, "t10k");
            if (k < 0 || k >= te.n) ex_die("--index: %d is not in [0,%d)", k, te.n);
            memcpy(img, te.pix + (int64_t)k * PIXELS, PIXELS);
            truth = te.labels[k];
        } else {
            read_pgm(what[i], img);
        }
        predict(&m, img, NULL, 1, in, p);
        for (c = 1; c < N_CLASS; c++)
            if (p[c] > p[best]) best = c;
        printf("%s%s: %s (%.1f%%)", is_index[i] ? "test image " : "", what[i], class_names[best], 100 * p[best]);
        if (truth >= 0) printf(", labelled %s", class_names[truth]);
        printf("\n   ");
        for (c = 0; c < N_CLASS; c++) printf(" %s %.3f", class_names[c], p[c]);
        printf("\n");
    }
    free(in);
    free(te.pix);
    free(te.labels);
    tfm_model_free(&m);
}

static void usage(const options *d) {
    printf("usage: fashion [options]                      train, validate, test\n"
           "       fashion [options] --index N --classify F.pgm ...   classify with the saved model\n"
           "  --patch N         patches of NxN pixels: 2, 4, 7 or 14 (default %d)\n"
           "  --overlap N       each patch's token also holds N pixels of each neighbour (default %d; 0: the patch alone)\n"
           "  --cls             classify a learned class vector's output instead of the patches' mean\n"
           "  --shift N         shift training images by up to N pixels at random (default %d)\n"
           "  --erase P         with probability P, cover a random rectangle of a training image with noise (default %g)\n"
           "  --no-augment      no flips, shifts or erasing\n"
           "  --smoothing X     label smoothing of the loss, in [0,1) (default %g)\n"
           "  --split-seed N    the shuffle before the validation images are set apart (default %llu)\n"
           "  --smoke           a tiny model for a few steps (seconds)\n",
           d->patch, d->overlap, d->shift, (double)d->erase, (double)d->smoothing, (unsigned long long)d->split_seed);
    ex_train_usage(&d->t); /* data: the Fashion-MNIST directory; the seed also draws the augmentation */
}

int main(int argc, char **argv) {
    options o, defaults;
    int i, n_cls = 0, *is_index = (int *)ex_malloc((size_t)argc * sizeof(int));
    char **what = (char **)ex_malloc((size_t)argc * sizeof(char *));
    memset(&o, 0, sizeof o);
    o.t.data = DIR;
    o.t.model = "runs/fashion.safetensors";
    o.t.csv = "runs/fashion.csv";
    o.t.batch = 64;
    o.t.epochs = 20;          /* what a 29-minute budget reached at two threads on a 2-core AVX-512 machine */
    o.t.d_model = 128;
    o.t.n_heads = 4;
    o.t.n_layers = 4;
    o.t.d_ff = 256;
    o.t.lr = 1e-3f;
    o.t.dropout = 0;
    o.t.weight_decay = 0.05f;
    o.t.min_lr_frac = 0.01f;
    o.t.eval_every = 1000;
    o.augment = 1;
    o.patch = 4;
    o.overlap = 2;        /* each 4x4 patch's token sees the 8x8 pixels around it */
    o.shift = 0;
    o.t.seed = 1;
    o.split_seed = 1;
    defaults = o;
    for (i = 1; i < argc; i++)
        if (ex_is(argv[i], "--smoke")) {
            o.smoke = 1;
            o.t.batch = 16; o.t.d_model = 32; o.t.n_layers = 1; o.t.n_heads = 2; o.t.d_ff = 64; o.t.eval_every = 3;
            o.t.time_budget = 0;
            o.t.model = "runs/fashion-smoke.safetensors";
            o.t.csv = "runs/fashion-smoke.csv";
        }
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (ex_is(a, "--smoke")) continue;
        else if (ex_train_opt(&o.t, argc, argv, &i)) continue; /* --model, --batch, ... */
        else if (ex_is(a, "--no-augment")) o.augment = 0;
        else if (ex_is(a, "--patch")) o.patch = ex_int(argc, argv, &i);
        else if (ex_is(a, "--overlap")) o.overlap = ex_int(argc, argv, &i);
        else if (ex_is(a, "--cls")) o.cls = 1;
        else if (ex_is(a, "--shift")) o.shift = ex_int(argc, argv, &i);
        else if (ex_is(a, "--erase")) o.erase = ex_float(argc, argv, &i);
        else if (ex_is(a, "--smoothing")) o.smoothing = ex_float(argc, argv, &i);
        else if (ex_is(a, "--split-seed")) o.split_seed = (uint64_t)ex_int(argc, argv, &i);
        else if (ex_is(a, "--index")) { is_index[n_cls] = 1; what[n_cls++] = (char *)ex_value(argc, argv, &i); }
        else if (ex_is(a, "--classify")) { is_index[n_cls] = 0; what[n_cls++] = (char *)ex_value(argc, argv, &i); }
        else if (ex_is(a, "-h") || ex_is(a, "--help")) { usage(&defaults); return 0; }
        else { usage(&defaults); ex_die("unknown option %s", a); }
    }
    if (o.shift < 0 || o.shift >= SIDE) ex_die("--shift: from 0 to %d pixels", SIDE - 1);
    if (!(o.erase >= 0 && o.erase <= 1)) ex_die("--erase: a probability from 0 to 1");
    if (!(o.smoothing >= 0 && o.smoothing < 1)) ex_die("--smoothing: from 0 to less than 1");
    if (o.patch < 2 || o.patch > 14 || SIDE % o.patch) ex_die("--patch: 2, 4, 7 or 14 (it must divide %d)", SIDE);
    if (o.overlap < 0 || o.overlap > o.patch) ex_die("--overlap: from 0 to the patch's side (%d) pixels", o.patch);
    ex_train_opts_apply(&o.t);
    if (n_cls) classify(&o, n_cls, what, is_index);
    else train(&o);
    free(is_index);
    free(what);
    return 0;
}
