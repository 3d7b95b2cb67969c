/* tests/test_attention.c - scaled dot-product attention (tfm_attention_*) and the multi-head attention
   layer (tfm_mha_*) against a naive reference in double: forward values, and every gradient against
   central finite differences of L = sum(y * r) computed on the double reference.

   Tolerances. The inputs are float32 and exact in double; the reference and its finite differences
   run in double (step 1e-5: truncation ~h^2 |L'''| ~ 1e-10, rounding ~1e-16 |L| / h ~ 1e-10), so the
   error measured is the library's float32 rounding alone (u = 2^-24 ~ 6e-8). Errors are reported as
   max |got - want| / max |want| (test_rel_err).
   - Forward: a softmax (an exp and a sum over Tk <= 17 terms per row) and a sum over Tk products,
     plus for the layer the projections (sums over C <= 15 terms) on both sides, all on O(1) data.
     Each stage costs at most ~(terms) u relative to its inputs' magnitudes, about 50-100 u for the
     whole chain: ATT_TOL_FWD = 2e-5 (~300 u).
   - Backward: about twice the chain (dP = dO v^T, the row sum of P dP, dS = P (dP - rowsum),
     dq = scale dS k, dk = scale dS^T q, dv = P^T dO, and for the layer the projection backward and the
     weight gradients summed over B*T rows), and the subtraction dP - rowsum cancels: ATT_TOL_GRAD =
     1e-4.
   A wrong index, mask or scale gives errors of order 1, orders above both. */

#include <stdint.h>
#include <stdlib.h>

#define ATT_TOL_FWD 2e-5
#define ATT_TOL_GRAD 1e-4
#define ATT_FD_STEP 1e-5
#define ATT_MAX_T 64

static uint64_t att_state = 0xD1B54A32D192ED03ull;

/* uniform in [lo, hi), from a 64-bit xorshift* (independent of the library's rng) */
static float att_uniform(float lo, float hi) {
    att_state ^= att_state >> 12;
    att_state ^= att_state << 25;
    att_state ^= att_state >> 27;
    uint64_t r = att_state * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * (float)((double)(r >> 40) / 16777216.0);
}

static void att_fill(float *p, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) p[i] = att_uniform(lo, hi);
}

static float *att_falloc(size_t n) { return (float *)calloc(n ? n : 1, sizeof(float)); }
static double *att_dalloc(size_t n) { return (double *)calloc(n ? n : 1, sizeof(double)); }

static double *att_to_double(const float *p, size_t n) {
    double *d = att_dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = p[i];
    return d;
}

static void att_fill_nan(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

static size_t att_count_nonfinite(const float *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (!(p[i] == p[i]) || fabsf(p[i]) == INFINITY) c++;
    return c;
}

/* ---- reference ---- */

/* Scaled dot-product attention in double. Layout (B,T,C), head h owns channels h*D..h*D+D-1. */
typedef struct att_ref {
    int B, H, D, Tq, Tk;
    int causal;               /* query i sees keys j <= i */
    int window, sinks;        /* causal: and only keys j > i - window, or j < sinks (window 0: all) */
    const int32_t *key_lens;  /* keys j >= key_lens[b] are masked; NULL: none */
    double scale;
    const double *drop;       /* (B,H,Tq,Tk) factors applied to the probabilities, or NULL */
} att_ref;

static int att_visible(const att_ref *r, int b, int i, int j) {
    if (r->causal && j > i) return 0;
    if (r->causal && r->window && j <= i - r->window && j >= r->sinks) return 0;
    if (r->key_lens && j >= r->key_lens[b]) return 0;
    return 1;
}

static int att_n_visible(const att_ref *r, int b, int i) {
    int n = 0;
    for (int j = 0; j < r->Tk; j++) n += att_visible(r, b, i, j);
    return n;
}

/* out (B,Tq,C) = softmax(scale q k^T + mask) [* drop] v; a row with no visible key is zero.
   L (B,H,Tq) receives each row's log-sum-exp of its visible scores (-inf: none) when not NULL. */
static void att_ref_sdpa(const att_ref *r, const double *q, const double *k, const double *v,
                         double *out, double *L) {
    const int C = r->H * r->D, D = r->D;
    double s[ATT_MAX_T];
    for (int b = 0; b < r->B; b++)
        for (int h = 0; h < r->H; h++)
            for (int i = 0; i < r->Tq; i++) {
                const double *qi = q + ((size_t)b * r->Tq + i) * C + h * D;
                double *oi = out + ((size_t)b * r->Tq + i) * C + h * D;
                size_t prow = (((size_t)b * r->H + h) * r->Tq + i) * r->Tk;
                double mx = -INFINITY, sum = 0;
                int any = 0;
                for (int d = 0; d < D; d++) oi[d] = 0;
                for (int j = 0; j < r->Tk; j++) {
                    const double *kj = k + ((size_t)b * r->Tk + j) * C + h * D;
                    double dot = 0;
                    if (!att_visible(r, b, i, j)) continue;
                    for (int d = 0; d < D; d++) dot += qi[d] * kj[d];
                    s[j] = r->scale * dot;
                    if (s[j] > mx) mx = s[j];
                    any = 1;
                }
                for (int j = 0; j < r->Tk; j++)
                    if (any && att_visible(r, b, i, j)) {
                        s[j] = exp(s[j] - mx);
                        sum += s[j];
                    }
                for (int j = 0; j < r->Tk; j++) {
                    double p = (any && att_visible(r, b, i, j)) ? s[j] / sum : 0;
                    const double *vj = v + ((size_t)b * r->Tk + j) * C + h * D;
                    double f = r->drop ? r->drop[prow + j] : 1.0;
                    for (int d = 0; d < D; d++) oi[d] += p * f * vj[d];
                }
                if (L) L[prow / r->Tk] = any ? mx + log(sum) : -INFINITY;
            }
}

/* y (N,n_out) = x (N,n_in) w^T (w is (n_out,n_in)) + b (n_out, or NULL). (No single-letter I: complex.h,
   which some cblas.h pull in, defines it.) */
static void att_ref_linear(double *y, const double *x, const double *w, const double *b, int N, int n_in,
                           int n_out) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < n_out; o++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < n_in; i++) s += x[(size_t)n * n_in + i] * w[(size_t)o * n_in + i];
            y[(size_t)n * n_out + o] = s;
        }
}

/* Multi-head attention as torch.nn.MultiheadAttention (batch_first), in double. */
typedef struct att_mha_ref {
    att_ref sd;                /* B, H, D, Tq, Tk, masks */
    int cross;
    double *x, *xkv;           /* (B,Tq,C), (B,Tk,C) (cross) */
    double *win, *bin;         /* (3C,C), (3C) or NULL */
    double *wout, *bout;       /* (C,C), (C) or NULL */
    double *r;                 /* (B,Tq,C): L = sum(y * r) */
    double *q, *k, *v, *ctx, *y; /* work */
} att_mha_ref;

static void att_ref_mha(att_mha_ref *m) {
    const int C = m->sd.H * m->sd.D, Nq = m->sd.B * m->sd.Tq, Nk = m->sd.B * m->sd.Tk;
    const double *src = m->cross ? m->xkv : m->x;
    att_ref_linear(m->q, m->x, m->win, m->bin, Nq, C, C);
    att_ref_linear(m->k, src, m->win + (size_t)C * C, m->bin ? m->bin + C : NULL, Nk, C, C);
    att_ref_linear(m->v, src, m->win + (size_t)2 * C * C, m->bin ? m->bin + 2 * C : NULL, Nk, C, C);
    att_ref_sdpa(&m->sd, m->q, m->k, m->v, m->ctx, NULL);
    att_ref_linear(m->y, m->ctx, m->wout, m->bout, Nq, C, C);
}

static double att_mha_loss(void *p) {
    att_mha_ref *m = (att_mha_ref *)p;
    size_t n = (size_t)m->sd.B * m->sd.Tq * m->sd.H * m->sd.D;
    double L = 0;
    att_ref_mha(m);
    for (size_t i = 0; i < n; i++) L += m->y[i] * m->r[i];
    return L;
}

typedef struct att_op_ref {
    att_ref sd;
    double *q, *k, *v, *r, *out;
} att_op_ref;

static double att_op_loss(void *p) {
    att_op_ref *o = (att_op_ref *)p;
    size_t n = (size_t)o->sd.B * o->sd.Tq * o->sd.H * o->sd.D;
    double L = 0;
    att_ref_sdpa(&o->sd, o->q, o->k, o->v, o->out, NULL);
    for (size_t i = 0; i < n; i++) L += o->out[i] * o->r[i];
    return L;
}

/* grad[i] = (L(x + h e_i) - L(x - h e_i)) / 2h for the n entries of x (which loss reads through ctx) */
static void att_fd(double (*loss)(void *), void *ctx, double *x, size_t n, double *grad) {
    for (size_t i = 0; i < n; i++) {
        double save = x[i], lp, lm;
        x[i] = save + ATT_FD_STEP;
        lp = loss(ctx);
        x[i] = save - ATT_FD_STEP;
        lm = loss(ctx);
        x[i] = save;
        grad[i] = (lp - lm) / (2 * ATT_FD_STEP);
    }
}

/* ---- the op: tfm_attention_forward / tfm_attention_backward ---- */

typedef struct att_case {
    const char *name;
    int B, H, D, Tq, Tk;
    int causal;
    int window, sinks;
    const int32_t *key_lens;
    float scale;      /* 0: default 1/sqrt(D) */
    float dropout;
    uint64_t seed;
} att_case;

static void att_opts_of(tfm_attn_opts *o, const att_case *c) {
    memset(o, 0, sizeof *o);
    o->causal = c->causal;
    o->window = c->window;
    o->sinks = c->sinks;
    o->key_lens = c->key_lens;
    o->scale = c->scale;
    o->dropout = c->dropout;
    o->dropout_seed = c->seed;
}

static void att_ref_of(att_ref *r, const att_case *c) {
    r->B = c->B; r->H = c->H; r->D = c->D; r->Tq = c->Tq; r->Tk = c->Tk;
    r->causal = c->causal;
    r->window = c->window;
    r->sinks = c->sinks;
    r->key_lens = c->key_lens;
    r->scale = c->scale != 0 ? (double)c->scale : 1.0 / sqrt((double)c->D);
    r->drop = NULL;
}

/* The dropout factors the library applies for this case's shape, masks and seed, read back through
   the forward: with q = k = 0 every visible key of row i gets probability 1/n_i, and with v = 1 on key
   j0 and 0 elsewhere, out[b,i,h*D] = f[b,h,i,j0] / n_i. Each factor must be 0 or 1/(1-p). The mask is a
   hash of the seed and the element index, independent of q, k and v, so these are the factors of any
   forward with this seed. Returns (B,H,Tq,Tk) factors (0 where masked), or NULL on failure. */
static double *att_dropout_factors(const att_case *c) {
    const int C = c->H * c->D;
    size_t nq = (size_t)c->B * c->Tq * C, nk = (size_t)c->B * c->Tk * C;
    size_t na = (size_t)c->B * c->H * c->Tq * c->Tk;
    float *q = att_falloc(nq), *k = att_falloc(nk), *v = att_falloc(nk), *out = att_falloc(nq);
    float *lse = att_falloc((size_t)c->B * c->H * c->Tq);
    double *f = att_dalloc(na);
    const double keep = 1.0 / (1.0 - (double)c->dropout);
    tfm_tensor tq = tfm_tensor3(q, c->B, c->Tq, C), tk = tfm_tensor3(k, c->B, c->Tk, C);
    tfm_tensor tv = tfm_tensor3(v, c->B, c->Tk, C), to = tfm_tensor3(out, c->B, c->Tq, C);
    tfm_tensor tl = tfm_tensor3(lse, c->B, c->H, c->Tq);
    tfm_attn_opts o;
    att_ref r;
    size_t n_vis = 0, n_drop = 0, n_bad = 0;
    int ok = 1;
    att_opts_of(&o, c);
    att_ref_of(&r, c);
    for (int j0 = 0; j0 < c->Tk && ok; j0++) {
        for (int b = 0; b < c->B; b++)
            for (int j = 0; j < c->Tk; j++)
                for (int ch = 0; ch < C; ch++) v[((size_t)b * c->Tk + j) * C + ch] = j == j0 ? 1.0f : 0.0f;
        tfm_result res = tfm_attention_forward(&to, &tl, &tq, &tk, &tv, c->H, &o);
        CHECK_OK(res);
        if (res != TFM_OK) ok = 0;
        for (int b = 0; b < c->B && ok; b++)
            for (int h = 0; h < c->H; h++)
                for (int i = 0; i < c->Tq; i++) {
                    size_t idx = (((size_t)b * c->H + h) * c->Tq + i) * c->Tk + j0;
                    double val;
                    if (!att_visible(&r, b, i, j0)) continue;
                    val = (double)out[((size_t)b * c->Tq + i) * C + h * c->D] * att_n_visible(&r, b, i);
                    n_vis++;
                    if (fabs(val - keep) < 1e-4 * keep) f[idx] = keep;
                    else if (fabs(val) < 1e-4) { f[idx] = 0; n_drop++; }
                    else n_bad++;
                }
    }
    CHECK_MSG(n_bad == 0, "%s: %zu of %zu dropout factors are neither 0 nor 1/(1-p)", c->name, n_bad,
              n_vis);
    if (ok && n_vis >= 400) {
        /* the dropped fraction is p give or take sampling noise (sd sqrt(p(1-p)/n) < 0.02 here) */
        double frac = (double)n_drop / (double)n_vis;
        CHECK_MSG(fabs(frac - c->dropout) < 0.08, "%s: dropped %.3f of the weights, want about %.2f",
                  c->name, frac, c->dropout);
    }
    free(q); free(k); free(v); free(out); free(lse);
    if (!ok || n_bad) {
        free(f);
        return NULL;
    }
    return f;
}

/* One case of the op: forward against the reference (outputs and log-sum-exps), backward against
   finite differences (dq, dk, dv from zero, then once more onto non-zero buffers to check they
   accumulate), and the fully-masked rows: zero output, zero gradient, no NaN anywhere. */
static void att_run_op_case(const att_case *c) {
    const int C = c->H * c->D;
    const size_t nq = (size_t)c->B * c->Tq * C, nk = (size_t)c->B * c->Tk * C;
    const size_t nl = (size_t)c->B * c->H * c->Tq;
    float *q = att_falloc(nq), *k = att_falloc(nk), *v = att_falloc(nk), *dout = att_falloc(nq);
    float *out = att_falloc(nq), *lse = att_falloc(nl);
    float *dq = att_falloc(nq), *dk = att_falloc(nk), *dv = att_falloc(nk);
    float *g0q = att_falloc(nq), *g0k = att_falloc(nk), *g0v = att_falloc(nk);
    float *diff = att_falloc(nq > nk ? nq : nk);
    double *outd = att_dalloc(nq), *Ld = att_dalloc(nl), *drop = NULL;
    double *gq = att_dalloc(nq), *gk = att_dalloc(nk), *gv = att_dalloc(nk);
    tfm_tensor tq = tfm_tensor3(q, c->B, c->Tq, C), tk = tfm_tensor3(k, c->B, c->Tk, C);
    tfm_tensor tv = tfm_tensor3(v, c->B, c->Tk, C), to = tfm_tensor3(out, c->B, c->Tq, C);
    tfm_tensor tdo = tfm_tensor3(dout, c->B, c->Tq, C);
    tfm_tensor tdq = tfm_tensor3(dq, c->B, c->Tq, C), tdk = tfm_tensor3(dk, c->B, c->Tk, C);
    tfm_tensor tdv = tfm_tensor3(dv, c->B, c->Tk, C);
    tfm_tensor tl = tfm_tensor3(lse, c->B, c->H, c->Tq);
    tfm_attn_opts o;
    att_op_ref ref;
    char what[200];
    tfm_result res;

    if (c->Tk > ATT_MAX_T) {
        CHECK_MSG(0, "%s: Tk %d exceeds the reference's %d", c->name, c->Tk, ATT_MAX_T);
        goto done;
    }
    att_opts_of(&o, c);
    att_ref_of(&ref.sd, c);
    if (c->dropout > 0) {
        drop = att_dropout_factors(c);
        if (!drop) goto done;
        ref.sd.drop = drop;
    }
    att_fill(q, nq, -1.5f, 1.5f);
    att_fill(k, nk, -1.5f, 1.5f);
    att_fill(v, nk, -1, 1);
    att_fill(dout, nq, -1, 1);
    ref.q = att_to_double(q, nq);
    ref.k = att_to_double(k, nk);
    ref.v = att_to_double(v, nk);
    ref.r = att_to_double(dout, nq);
    ref.out = outd;

    /* forward: the outputs are written, never read (NaN-filled first) */
    att_fill_nan(out, nq);
    att_fill_nan(lse, nl);
    res = tfm_attention_forward(&to, &tl, &tq, &tk, &tv, c->H, &o);
    CHECK_OK(res);
    if (res != TFM_OK) goto free_ref;
    att_ref_sdpa(&ref.sd, ref.q, ref.k, ref.v, outd, Ld);
    snprintf(what, sizeof what, "%s: out", c->name);
    CHECK_REL(what, test_rel_err(out, outd, nq), ATT_TOL_FWD);
    {
        /* lse: -inf exactly where the row sees no key, else the reference's log-sum-exp */
        size_t n_inf = 0;
        double err = 0, big = 0;
        for (size_t i = 0; i < nl; i++) {
            if (isinf(Ld[i]) || isinf(lse[i])) {
                n_inf += !(isinf(Ld[i]) && isinf(lse[i]) && lse[i] < 0);
                continue;
            }
            err = fmax(err, fabs((double)lse[i] - Ld[i]));
            big = fmax(big, fabs(Ld[i]));
        }
        CHECK_MSG(n_inf == 0, "%s: %zu rows disagree on whether lse is -inf", c->name, n_inf);
        snprintf(what, sizeof what, "%s: lse", c->name);
        CHECK_REL(what, err / fmax(big, 1.0), ATT_TOL_FWD);
    }

    /* backward from zero */
    att_fd(att_op_loss, &ref, ref.q, nq, gq);
    att_fd(att_op_loss, &ref, ref.k, nk, gk);
    att_fd(att_op_loss, &ref, ref.v, nk, gv);
    res = tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, c->H, &o);
    CHECK_OK(res);
    if (res != TFM_OK) goto free_ref;
    snprintf(what, sizeof what, "%s: dq", c->name);
    CHECK_REL(what, test_rel_err(dq, gq, nq), ATT_TOL_GRAD);
    snprintf(what, sizeof what, "%s: dk", c->name);
    CHECK_REL(what, test_rel_err(dk, gk, nk), ATT_TOL_GRAD);
    snprintf(what, sizeof what, "%s: dv", c->name);
    CHECK_REL(what, test_rel_err(dv, gv, nk), ATT_TOL_GRAD);

    /* nothing non-finite anywhere, and rows that see no key are exactly zero */
    CHECK_MSG(att_count_nonfinite(out, nq) + att_count_nonfinite(dq, nq) + att_count_nonfinite(dk, nk) +
                  att_count_nonfinite(dv, nk) == 0,
              "%s: NaN or Inf in out or a gradient", c->name);
    for (int b = 0; b < c->B; b++)
        for (int i = 0; i < c->Tq; i++) {
            size_t zo = 0, zq = 0;
            if (att_n_visible(&ref.sd, b, i) > 0) continue;
            for (int ch = 0; ch < C; ch++) {
                zo += out[((size_t)b * c->Tq + i) * C + ch] != 0.0f;
                zq += dq[((size_t)b * c->Tq + i) * C + ch] != 0.0f;
            }
            CHECK_MSG(zo + zq == 0, "%s: b=%d query %d sees no key but has %zu non-zero outputs, "
                      "%zu non-zero dq", c->name, b, i, zo, zq);
        }
    if (c->key_lens)
        for (int b = 0; b < c->B; b++) {
            size_t nz = 0;
            if (c->key_lens[b] != 0) continue;
            for (size_t e = (size_t)b * c->Tk * C; e < (size_t)(b + 1) * c->Tk * C; e++)
                nz += (dk[e] != 0.0f) + (dv[e] != 0.0f);
            CHECK_MSG(nz == 0, "%s: b=%d has key_lens 0 but %zu non-zero dk/dv", c->name, b, nz);
        }

    /* backward again onto non-zero gradients: it must add (forward first, so that nothing the first
       backward may have used as scratch matters) */
    att_fill(g0q, nq, -0.5f, 0.5f);
    att_fill(g0k, nk, -0.5f, 0.5f);
    att_fill(g0v, nk, -0.5f, 0.5f);
    memcpy(dq, g0q, nq * sizeof(float));
    memcpy(dk, g0k, nk * sizeof(float));
    memcpy(dv, g0v, nk * sizeof(float));
    CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, c->H, &o));
    CHECK_OK(tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, c->H, &o));
    /* dq - g0 has one extra rounding of u |g0| <= 3e-8, far below the tolerance */
    for (size_t i = 0; i < nq; i++) diff[i] = (float)((double)dq[i] - (double)g0q[i]);
    snprintf(what, sizeof what, "%s: dq accumulated", c->name);
    CHECK_REL(what, test_rel_err(diff, gq, nq), ATT_TOL_GRAD);
    for (size_t i = 0; i < nk; i++) diff[i] = (float)((double)dk[i] - (double)g0k[i]);
    snprintf(what, sizeof what, "%s: dk accumulated", c->name);
    CHECK_REL(what, test_rel_err(diff, gk, nk), ATT_TOL_GRAD);
    for (size_t i = 0; i < nk; i++) diff[i] = (float)((double)dv[i] - (double)g0v[i]);
    snprintf(what, sizeof what, "%s: dv accumulated", c->name);
    CHECK_REL(what, test_rel_err(diff, gv, nk), ATT_TOL_GRAD);

free_ref:
    free(ref.q); free(ref.k); free(ref.v); free(ref.r);
done:
    free(q); free(k); free(v); free(dout); free(out); free(lse);
    free(dq); free(dk); free(dv); free(g0q); free(g0k); free(g0v); free(diff);
    free(outd); free(Ld); free(drop); free(gq); free(gk); free(gv);
}

static att_case att_case_make(const char *name, int B, int H, int D, int Tq, int Tk) {
    att_case c;
    memset(&c, 0, sizeof c);
    c.name = name;
    c.B = B; c.H = H; c.D = D; c.Tq = Tq; c.Tk = Tk;
    return c;
}

static void att_test_op_nomask(void) {
    att_case c = att_case_make("op none B2 H3 D5 T3", 2, 3, 5, 3, 3);
    att_run_op_case(&c);
    c = att_case_make("op none B1 H1 D1 T1", 1, 1, 1, 1, 1);
    att_run_op_case(&c);
    c = att_case_make("op none B2 H1 D5 T17", 2, 1, 5, 17, 17);
    att_run_op_case(&c);
    c = att_case_make("op none B1 H3 D1 T17 scale 0.3", 1, 3, 1, 17, 17);
    c.scale = 0.3f;
    att_run_op_case(&c);
}

static void att_test_op_causal(void) {
    att_case c = att_case_make("op causal B2 H3 D5 T17", 2, 3, 5, 17, 17);
    c.causal = 1;
    att_run_op_case(&c);
    c = att_case_make("op causal B1 H1 D1 T3", 1, 1, 1, 3, 3);
    c.causal = 1;
    att_run_op_case(&c);
    c = att_case_make("op causal B3 H3 D1 T1", 3, 3, 1, 1, 1);
    c.causal = 1;
    att_run_op_case(&c);
}

static void att_test_op_padding(void) {
    static const int32_t lens3[] = {3, 1, 2};
    static const int32_t lens17[] = {17, 5, 1};
    att_case c = att_case_make("op key_lens B3 H3 D5 T3", 3, 3, 5, 3, 3);
    c.key_lens = lens3;
    att_run_op_case(&c);
    c = att_case_make("op key_lens B3 H1 D1 T17", 3, 1, 1, 17, 17);
    c.key_lens = lens17;
    att_run_op_case(&c);
}

/* causal and padding together; with top-left causal alignment every query sees key 0 unless the
   batch element has no key at all, so the rows that see no key are those of key_lens 0 */
static void att_test_op_causal_padding(void) {
    static const int32_t lens_a[] = {0, 2, 3};
    static const int32_t lens_b[] = {9, 0};
    att_case c = att_case_make("op causal+key_lens B3 H3 D5 T3", 3, 3, 5, 3, 3);
    c.causal = 1;
    c.key_lens = lens_a;
    att_run_op_case(&c);
    c = att_case_make("op causal+key_lens B2 H1 D1 T17", 2, 1, 1, 17, 17);
    c.causal = 1;
    c.key_lens = lens_b;
    att_run_op_case(&c);
}

/* every key masked for one batch element (and for the whole batch) */
static void att_test_op_fully_masked(void) {
    static const int32_t lens_a[] = {0, 3};
    static const int32_t lens_b[] = {0, 0};
    att_case c = att_case_make("op key_lens 0 B2 H3 D5 T3", 2, 3, 5, 3, 3);
    c.key_lens = lens_a;
    att_run_op_case(&c);
    c = att_case_make("op all key_lens 0 B2 H3 D1 Tq3 Tk17", 2, 3, 1, 3, 17);
    c.key_lens = lens_b;
    att_run_op_case(&c);
}

/* cross-attention shapes, Tq != Tk, with and without masks; causal with Tq != Tk is top-left
   aligned: query i sees keys j <= i (all of them once i >= Tk - 1) */
static void att_test_op_cross(void) {
    static const int32_t lens_a[] = {17, 4};
    static const int32_t lens_b[] = {2, 3};
    att_case c = att_case_make("op cross B2 H3 D5 Tq3 Tk17", 2, 3, 5, 3, 17);
    att_run_op_case(&c);
    c = att_case_make("op cross B2 H1 D5 Tq17 Tk3", 2, 1, 5, 17, 3);
    att_run_op_case(&c);
    c = att_case_make("op cross key_lens B2 H3 D1 Tq3 Tk17", 2, 3, 1, 3, 17);
    c.key_lens = lens_a;
    att_run_op_case(&c);
    c = att_case_make("op cross causal B2 H3 D5 Tq3 Tk17", 2, 3, 5, 3, 17);
    c.causal = 1;
    att_run_op_case(&c);
    c = att_case_make("op cross causal B2 H1 D1 Tq17 Tk3", 2, 1, 1, 17, 3);
    c.causal = 1;
    att_run_op_case(&c);
    c = att_case_make("op cross causal+key_lens B2 H3 D5 Tq1 Tk3", 2, 3, 5, 1, 3);
    c.causal = 1;
    c.key_lens = lens_b;
    att_run_op_case(&c);
}

/* dropout on the attention weights: the mask depends on the seed only, so with the seed fixed the
   function is smooth in q, k, v and finite differences apply */
static void att_test_op_dropout_grad(void) {
    static const int32_t lens[] = {7, 3};
    att_case c = att_case_make("op dropout B2 H3 D5 T17", 2, 3, 5, 17, 17);
    c.dropout = 0.2f;
    c.seed = 1234;
    att_run_op_case(&c);
    c = att_case_make("op dropout causal+key_lens B2 H3 D1 Tq5 Tk7", 2, 3, 1, 5, 7);
    c.dropout = 0.2f;
    c.seed = 99;
    c.causal = 1;
    c.key_lens = lens;
    att_run_op_case(&c);
}

/* dropout is deterministic: the same seed gives the same output twice and on 1 or 2 threads (forward
   and backward); another seed gives another output */
static void att_test_op_dropout_determinism(void) {
    const int B = 3, H = 2, D = 8, T = 24, C = H * D;
    const size_t n = (size_t)B * T * C, nl = (size_t)B * H * T;
    float *q = att_falloc(n), *k = att_falloc(n), *v = att_falloc(n), *dout = att_falloc(n);
    float *out1 = att_falloc(n), *out2 = att_falloc(n), *out3 = att_falloc(n), *out4 = att_falloc(n);
    float *lse = att_falloc(nl);
    float *dq1 = att_falloc(n), *dk1 = att_falloc(n), *dv1 = att_falloc(n);
    float *dq2 = att_falloc(n), *dk2 = att_falloc(n), *dv2 = att_falloc(n);
    tfm_tensor tq = tfm_tensor3(q, B, T, C), tk = tfm_tensor3(k, B, T, C), tv = tfm_tensor3(v, B, T, C);
    tfm_tensor tdo = tfm_tensor3(dout, B, T, C);
    tfm_tensor tl = tfm_tensor3(lse, B, H, T);
    tfm_tensor to1 = tfm_tensor3(out1, B, T, C), to2 = tfm_tensor3(out2, B, T, C);
    tfm_tensor to3 = tfm_tensor3(out3, B, T, C), to4 = tfm_tensor3(out4, B, T, C);
    tfm_tensor tdq1 = tfm_tensor3(dq1, B, T, C), tdk1 = tfm_tensor3(dk1, B, T, C);
    tfm_tensor tdv1 = tfm_tensor3(dv1, B, T, C), tdq2 = tfm_tensor3(dq2, B, T, C);
    tfm_tensor tdk2 = tfm_tensor3(dk2, B, T, C), tdv2 = tfm_tensor3(dv2, B, T, C);
    static const int32_t lens[] = {24, 11, 0};
    tfm_attn_opts o;
    int saved = tfm_get_num_threads();
    memset(&o, 0, sizeof o);
    o.causal = 1;
    o.key_lens = lens;
    o.dropout = 0.2f;
    o.dropout_seed = 777;
    att_fill(q, n, -1, 1);
    att_fill(k, n, -1, 1);
    att_fill(v, n, -1, 1);
    att_fill(dout, n, -1, 1);

    tfm_set_num_threads(1);
    CHECK_OK(tfm_attention_forward(&to1, &tl, &tq, &tk, &tv, H, &o));
    CHECK_OK(tfm_attention_backward(&tdq1, &tdk1, &tdv1, &tdo, &tq, &tk, &tv, &to1, &tl, H, &o));
    CHECK_OK(tfm_attention_forward(&to2, &tl, &tq, &tk, &tv, H, &o));
    CHECK_MSG(!memcmp(out1, out2, n * sizeof(float)), "dropout: same seed, different outputs");

    tfm_set_num_threads(2);
    CHECK_OK(tfm_attention_forward(&to3, &tl, &tq, &tk, &tv, H, &o));
    CHECK_OK(tfm_attention_backward(&tdq2, &tdk2, &tdv2, &tdo, &tq, &tk, &tv, &to3, &tl, H, &o));
    CHECK_REL("dropout out, 1 vs 2 threads", test_rel_err_f(out3, out1, n), 1e-6);
    CHECK_REL("dropout dq, 1 vs 2 threads", test_rel_err_f(dq2, dq1, n), 1e-6);
    CHECK_REL("dropout dk, 1 vs 2 threads", test_rel_err_f(dk2, dk1, n), 1e-6);
    CHECK_REL("dropout dv, 1 vs 2 threads", test_rel_err_f(dv2, dv1, n), 1e-6);

    o.dropout_seed = 778;
    CHECK_OK(tfm_attention_forward(&to4, &tl, &tq, &tk, &tv, H, &o));
    CHECK_MSG(memcmp(out1, out4, n * sizeof(float)) != 0, "dropout: seeds 777 and 778 give the same "
              "output");
    CHECK_MSG(att_count_nonfinite(out1, n) + att_count_nonfinite(dq1, n) + att_count_nonfinite(dk1, n) +
                  att_count_nonfinite(dv1, n) == 0, "dropout: NaN or Inf");
    tfm_set_num_threads(saved);
    free(q); free(k); free(v); free(dout); free(out1); free(out2); free(out3); free(out4);
    free(lse); free(dq1); free(dk1); free(dv1); free(dq2); free(dk2); free(dv2);
}

/* ---- the fused kernels against the unfused attention ----
   What the library computed before its attention was fused, kept here as the reference: the whole
   (B,H,Tq,Tk) matrix of probabilities, a softmax per row over the visible keys (plus the additive mask;
   a row it hides entirely, or one with no visible key, is zero), dropout of element (b,h,i,j) by the hash
   of (seed, batch_offset*H*Tq*Tk + ((b*H + h)*Tq + i)*Tk + j), and backward dS = P (dP - rowsum(P dP)).
   Plain loops, double accumulators. The shapes cross the fused kernel's query blocks (64 rows) and key
   blocks (256 keys) and end inside them; outputs and gradients must agree to 1e-5 relative. */

#define ATT_TOL_FUSED 1e-5

typedef struct att_unf {
    int B, H, D, Tq, Tk;
    tfm_attn_opts o;
} att_unf;

static int att_unf_visible(const att_unf *u, int b, int i, int j) {
    return !(u->o.causal && j > i) && !(u->o.key_lens && j >= u->o.key_lens[b]);
}

/* out (B,Tq,C); P (B,H,Tq,Tk) the probabilities and F the dropout factors, both kept for backward */
static void att_unf_forward(const att_unf *u, const float *q, const float *k, const float *v, double *out,
                            double *P, double *F) {
    const int C = u->H * u->D, D = u->D;
    const double scale = u->o.scale != 0 ? (double)u->o.scale : 1.0 / sqrt((double)D);
    const uint32_t thr = tfm__drop_threshold(u->o.dropout);
    for (int b = 0; b < u->B; b++)
        for (int h = 0; h < u->H; h++)
            for (int i = 0; i < u->Tq; i++) {
                size_t row = (((size_t)b * u->H + h) * u->Tq + i) * u->Tk;
                double *p = P + row, mx = -INFINITY, sum = 0;
                double *oi = out + ((size_t)b * u->Tq + i) * C + h * D;
                for (int j = 0; j < u->Tk; j++) {
                    double dot = 0;
                    p[j] = -INFINITY;
                    if (!att_unf_visible(u, b, i, j)) continue;
                    for (int d = 0; d < D; d++)
                        dot += (double)q[((size_t)b * u->Tq + i) * C + h * D + d] * k[((size_t)b * u->Tk + j) * C + h * D + d];
                    p[j] = scale * dot;
                    if (u->o.mask)
                        p[j] += u->o.mask[((size_t)(u->o.mask_per_batch ? b : 0) * u->Tq + i) * u->Tk + j];
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j < u->Tk; j++) {
                    p[j] = mx == -INFINITY ? 0 : exp(p[j] - mx);
                    sum += p[j];
                }
                for (int d = 0; d < D; d++) oi[d] = 0;
                for (int j = 0; j < u->Tk; j++) {
                    uint64_t e = (uint64_t)(u->o.batch_offset * u->H * u->Tq * u->Tk) + row + (uint64_t)j;
                    p[j] = sum > 0 ? p[j] / sum : 0;
                    F[row + j] = u->o.dropout == 0 ? 1.0
                                 : tfm__hash24(u->o.dropout_seed, e) >= thr ? 1.0 / (1.0 - u->o.dropout) : 0.0;
                    for (int d = 0; d < D; d++) oi[d] += p[j] * F[row + j] * v[((size_t)b * u->Tk + j) * C + h * D + d];
                }
            }
}

static void att_unf_backward(const att_unf *u, const float *q, const float *k, const float *v, const float *dout,
                             const double *P, const double *F, double *dq, double *dk, double *dv) {
    const int C = u->H * u->D, D = u->D;
    const double scale = u->o.scale != 0 ? (double)u->o.scale : 1.0 / sqrt((double)D);
    double *dS = att_dalloc((size_t)u->Tk);
    for (int b = 0; b < u->B; b++)
        for (int h = 0; h < u->H; h++)
            for (int i = 0; i < u->Tq; i++) {
                size_t row = (((size_t)b * u->H + h) * u->Tq + i) * u->Tk;
                const float *go = dout + ((size_t)b * u->Tq + i) * C + h * D;
                double r = 0;
                for (int j = 0; j < u->Tk; j++) {
                    const float *vj = v + ((size_t)b * u->Tk + j) * C + h * D;
                    double dp = 0;
                    for (int d = 0; d < D; d++) {
                        dp += (double)go[d] * vj[d];
                        dv[((size_t)b * u->Tk + j) * C + h * D + d] += P[row + j] * F[row + j] * go[d];
                    }
                    dS[j] = dp * F[row + j];
                    r += P[row + j] * dS[j];
                }
                for (int j = 0; j < u->Tk; j++) {
                    double g = P[row + j] * (dS[j] - r) * scale;
                    for (int d = 0; d < D; d++) {
                        dq[((size_t)b * u->Tq + i) * C + h * D + d] += g * k[((size_t)b * u->Tk + j) * C + h * D + d];
                        dk[((size_t)b * u->Tk + j) * C + h * D + d] += g * q[((size_t)b * u->Tq + i) * C + h * D + d];
                    }
                }
            }
    free(dS);
}

static void att_fused_case(const char *name, int B, int H, int D, int Tq, int Tk, const tfm_attn_opts *o) {
    const int C = H * D;
    const size_t nq = (size_t)B * Tq * C, nk = (size_t)B * Tk * C, na = (size_t)B * H * Tq * Tk;
    float *q = att_falloc(nq), *k = att_falloc(nk), *v = att_falloc(nk), *dout = att_falloc(nq);
    float *out = att_falloc(nq), *lse = att_falloc((size_t)B * H * Tq);
    float *dq = att_falloc(nq), *dk = att_falloc(nk), *dv = att_falloc(nk);
    double *outd = att_dalloc(nq), *P = att_dalloc(na), *F = att_dalloc(na);
    double *gq = att_dalloc(nq), *gk = att_dalloc(nk), *gv = att_dalloc(nk);
    tfm_tensor tq = tfm_tensor3(q, B, Tq, C), tk = tfm_tensor3(k, B, Tk, C), tv = tfm_tensor3(v, B, Tk, C);
    tfm_tensor to = tfm_tensor3(out, B, Tq, C), tdo = tfm_tensor3(dout, B, Tq, C), tl = tfm_tensor3(lse, B, H, Tq);
    tfm_tensor tdq = tfm_tensor3(dq, B, Tq, C), tdk = tfm_tensor3(dk, B, Tk, C), tdv = tfm_tensor3(dv, B, Tk, C);
    att_unf u;
    char what[200];
    u.B = B; u.H = H; u.D = D; u.Tq = Tq; u.Tk = Tk;
    u.o = *o;
    att_fill(q, nq, -1.5f, 1.5f);
    att_fill(k, nk, -1.5f, 1.5f);
    att_fill(v, nk, -1, 1);
    att_fill(dout, nq, -1, 1);
    att_unf_forward(&u, q, k, v, outd, P, F);
    att_unf_backward(&u, q, k, v, dout, P, F, gq, gk, gv);
    CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, H, o));
    CHECK_OK(tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, H, o));
    snprintf(what, sizeof what, "fused %s: out", name);
    CHECK_REL(what, test_rel_err(out, outd, nq), ATT_TOL_FUSED);
    snprintf(what, sizeof what, "fused %s: dq", name);
    CHECK_REL(what, test_rel_err(dq, gq, nq), ATT_TOL_FUSED);
    snprintf(what, sizeof what, "fused %s: dk", name);
    CHECK_REL(what, test_rel_err(dk, gk, nk), ATT_TOL_FUSED);
    snprintf(what, sizeof what, "fused %s: dv", name);
    CHECK_REL(what, test_rel_err(dv, gv, nk), ATT_TOL_FUSED);
    CHECK_MSG(att_count_nonfinite(out, nq) + att_count_nonfinite(dq, nq) + att_count_nonfinite(dk, nk) +
                  att_count_nonfinite(dv, nk) == 0, "fused %s: NaN or Inf", name);
    free(q); free(k); free(v); free(dout); free(out); free(lse); free(dq); free(dk); free(dv);
    free(outd); free(P); free(F); free(gq); free(gk); free(gv);
}

static void att_test_fused_masks(void) {
    static const int32_t lens_a[] = {300, 131}, lens_b[] = {0, 257}, lens_c[] = {520, 257}, lens_d[] = {1, 513};
    tfm_attn_opts o;
    memset(&o, 0, sizeof o);
    att_fused_case("none B2 H2 D8 T300", 2, 2, 8, 300, 300, &o);
    att_fused_case("none B1 H1 D4 T1", 1, 1, 4, 1, 1, &o);
    att_fused_case("none B1 H2 D8 Tq1 Tk513", 1, 2, 8, 1, 513, &o);
    att_fused_case("none B1 H2 D8 Tq257 Tk1", 1, 2, 8, 257, 1, &o);
    o.scale = 0.3f;
    att_fused_case("scale 0.3 B2 H1 D16 Tq65 Tk257", 2, 1, 16, 65, 257, &o);
    o.scale = 0.0f;
    o.causal = 1;
    att_fused_case("causal B2 H2 D8 T300", 2, 2, 8, 300, 300, &o);
    att_fused_case("causal B1 H1 D8 Tq70 Tk520", 1, 1, 8, 70, 520, &o);
    att_fused_case("causal B1 H1 D8 Tq520 Tk70", 1, 1, 8, 520, 70, &o);
    o.key_lens = lens_a;
    att_fused_case("causal+key_lens B2 H2 D8 T300", 2, 2, 8, 300, 300, &o);
    o.key_lens = lens_b;
    att_fused_case("causal+key_lens (one 0) B2 H1 D8 T300", 2, 1, 8, 300, 300, &o);
    o.causal = 0;
    att_fused_case("key_lens (one 0) B2 H1 D8 T300", 2, 1, 8, 300, 300, &o);
    o.key_lens = lens_c;
    att_fused_case("cross key_lens B2 H2 D8 Tq70 Tk520", 2, 2, 8, 70, 520, &o);
    o.key_lens = lens_d;
    att_fused_case("cross key_lens B2 H2 D8 Tq1 Tk513", 2, 2, 8, 1, 513, &o);
}

/* the additive mask: scattered -inf, rows it hides entirely, and rows whose whole first key block it
   hides (their running maximum starts at the second block) */
static void att_test_fused_additive(void) {
    const int Tq = 130, Tk = 300, B = 2;
    static const int32_t lens[] = {300, 280};
    float *mask = att_falloc((size_t)B * Tq * Tk);
    tfm_attn_opts o;
    memset(&o, 0, sizeof o);
    att_fill(mask, (size_t)B * Tq * Tk, -2, 2);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tq; i++)
            for (int j = 0; j < Tk; j++) {
                float *m = mask + ((size_t)b * Tq + i) * Tk + j;
                if ((i * 7 + j) % 11 == 0 || i % 50 == 3 || (i % 50 == 5 + b && j < 256)) *m = -INFINITY;
            }
    o.mask = mask;
    att_fused_case("mask (Tq,Tk) B2 H2 D8 Tq130 Tk300", 2, 2, 8, Tq, Tk, &o);
    o.key_lens = lens;
    att_fused_case("mask (Tq,Tk)+key_lens B2 H2 D8 Tq130 Tk300", 2, 2, 8, Tq, Tk, &o);
    o.key_lens = NULL;
    o.mask_per_batch = 1;
    att_fused_case("mask (B,Tq,Tk) B2 H2 D8 Tq130 Tk300", 2, 2, 8, Tq, Tk, &o);
    o.causal = 1;
    att_fused_case("mask (B,Tq,Tk)+causal B2 H1 D8 Tq130 Tk300", 2, 1, 8, Tq, Tk, &o);
    free(mask);
}

/* A query that sees exactly one key has a one-hot softmax row, whose gradient with respect to the scores
   is exactly zero: nothing may reach dq from that row, nor dk from it (torch's math path gives exact
   zeros). The sources of one visible key: a one-key source (Tk = 1), a key length of 1, the first
   query of causal attention, and an additive mask that leaves one key (here in the second key block).
   Head dimension 64, so that differently rounded dot products would show; dropout too. */
static void att_one_key_case(const char *name, int B, int H, int D, int Tq, int Tk, const tfm_attn_opts *o,
                             int zero_dk, int row_i) {
    const int C = H * D;
    const size_t nq = (size_t)B * Tq * C, nk = (size_t)B * Tk * C;
    float *q = att_falloc(nq), *k = att_falloc(nk), *v = att_falloc(nk), *dout = att_falloc(nq);
    float *out = att_falloc(nq), *lse = att_falloc((size_t)B * H * Tq);
    float *dq = att_falloc(nq), *dk = att_falloc(nk), *dv = att_falloc(nk);
    tfm_tensor tq = tfm_tensor3(q, B, Tq, C), tk = tfm_tensor3(k, B, Tk, C), tv = tfm_tensor3(v, B, Tk, C);
    tfm_tensor to = tfm_tensor3(out, B, Tq, C), tdo = tfm_tensor3(dout, B, Tq, C), tl = tfm_tensor3(lse, B, H, Tq);
    tfm_tensor tdq = tfm_tensor3(dq, B, Tq, C), tdk = tfm_tensor3(dk, B, Tk, C), tdv = tfm_tensor3(dv, B, Tk, C);
    size_t nz = 0, ndv = 0, n;
    att_fill(q, nq, -1.5f, 1.5f);
    att_fill(k, nk, -1.5f, 1.5f);
    att_fill(v, nk, -1, 1);
    att_fill(dout, nq, -1, 1);
    CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, H, o));
    CHECK_OK(tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, H, o));
    if (row_i < 0) { /* every query sees one key: all of dq, and all of dk when zero_dk */
        for (n = 0; n < nq; n++) nz += dq[n] != 0.0f;
        if (zero_dk)
            for (n = 0; n < nk; n++) nz += dk[n] != 0.0f;
    } else { /* query row_i of every batch */
        for (int b = 0; b < B; b++)
            for (int c = 0; c < C; c++) nz += dq[((size_t)b * Tq + row_i) * C + c] != 0.0f;
    }
    for (n = 0; n < nk; n++) ndv += dv[n] != 0.0f;
    CHECK_MSG(nz == 0, "one key %s: %zu score-gradient entries not exactly zero", name, nz);
    CHECK_MSG(ndv > 0, "one key %s: dv is all zero", name);
    free(q); free(k); free(v); free(dout); free(out); free(lse); free(dq); free(dk); free(dv);
}

static void att_test_fused_one_key(void) {
    static const int32_t lens1[] = {1, 1};
    const int B = 2, Tq = 70, Tk = 300;
    float *mask = att_falloc((size_t)Tq * Tk);
    tfm_attn_opts o;
    memset(&o, 0, sizeof o);
    att_one_key_case("Tk 1", B, 2, 64, Tq, 1, &o, 1, -1);
    o.key_lens = lens1;
    att_one_key_case("key_lens 1", B, 2, 64, Tq, Tk, &o, 1, -1);
    o.key_lens = NULL;
    o.causal = 1;
    att_one_key_case("causal, first query", B, 2, 64, Tq, Tq, &o, 0, 0);
    o.causal = 0;
    for (int i = 0; i < Tq * Tk; i++) mask[i] = (i / Tk == 5 && i % Tk != 260) ? -INFINITY : 0.0f;
    o.mask = mask;
    att_one_key_case("mask leaves key 260", B, 2, 64, Tq, Tk, &o, 0, 5);
    o.mask = NULL;
    o.dropout = 0.3f;
    o.dropout_seed = 77;
    att_one_key_case("Tk 1, dropout", B, 2, 64, Tq, 1, &o, 1, -1);
    free(mask);
}

/* With the AMX sgemm kernel chosen (two bf16 per float, not fp32's rounding), the fused attention's own
   block products stay on an fp32 kernel: the forward and backward give the bits they give without it,
   and one-hot rows still get exact-zero gradients. */
static void att_test_amx_kernel(void) {
#if defined(TFM__HAVE_AMX)
    const tfm__gemm_kernel *saved = tfm__gemm_kernel_get();
    const int B = 2, H = 2, D = 64, T = 150, C = H * D;
    const size_t n = (size_t)B * T * C;
    float *x[2][4], *lse[2];
    tfm_attn_opts o;
    if (!tfm__gemm_kernel_usable(tfm__gemm_kernel_by_key("amx"))) {
        printf("    skip: the OS refused the AMX tiles\n");
        return;
    }
    memset(&o, 0, sizeof o);
    o.causal = 1;
    float *q = att_falloc(n), *k = att_falloc(n), *v = att_falloc(n), *dout = att_falloc(n);
    tfm_tensor tq = tfm_tensor3(q, B, T, C), tk = tfm_tensor3(k, B, T, C), tv = tfm_tensor3(v, B, T, C);
    tfm_tensor tdo = tfm_tensor3(dout, B, T, C), to, tl, tdq, tdk, tdv;
    att_fill(q, n, -1.5f, 1.5f), att_fill(k, n, -1.5f, 1.5f), att_fill(v, n, -1, 1), att_fill(dout, n, -1, 1);
    for (int pass = 0; pass < 2; pass++) { /* x: out, dq, dk, dv */
        for (int t = 0; t < 4; t++) x[pass][t] = att_falloc(n);
        lse[pass] = att_falloc((size_t)B * H * T);
        to = tfm_tensor3(x[pass][0], B, T, C), tl = tfm_tensor3(lse[pass], B, H, T);
        tdq = tfm_tensor3(x[pass][1], B, T, C), tdk = tfm_tensor3(x[pass][2], B, T, C);
        tdv = tfm_tensor3(x[pass][3], B, T, C);
        CHECK_OK(tfm_sgemm_set_kernel(pass ? "amx" : NULL));
        CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, H, &o));
        CHECK_OK(tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, H, &o));
    }
    free(q); free(k); free(v); free(dout);
    for (int t = 0; t < 4; t++)
        CHECK_MSG(!memcmp(x[0][t], x[1][t], n * sizeof(float)), "amx chosen: the attention's %s changed",
                  (const char *[]){"out", "dq", "dk", "dv"}[t]);
    CHECK_MSG(!memcmp(lse[0], lse[1], (size_t)B * H * T * sizeof(float)), "amx chosen: lse changed");
    att_test_fused_one_key(); /* on the AMX kernel still chosen */
    for (int pass = 0; pass < 2; pass++) {
        for (int t = 0; t < 4; t++) free(x[pass][t]);
        free(lse[pass]);
    }
    tfm__gemm_kernel_chosen = saved;
#else
    printf("    skip: no AMX kernel in this build\n");
#endif
}

/* A key that an additive mask hides from every query (-inf in its whole column) takes no part: its dk
   and dv are exactly zero, as torch's (e^-inf is 0, not the smallest float). Two such keys, in two key
   blocks, with and without dropout. */
static void att_test_masked_key(void) {
    const int B = 2, H = 2, D = 64, Tq = 70, Tk = 300, C = H * D, hidden[2] = {37, 290};
    const size_t nq = (size_t)B * Tq * C, nk = (size_t)B * Tk * C;
    float *q = att_falloc(nq), *k = att_falloc(nk), *v = att_falloc(nk), *dout = att_falloc(nq);
    float *out = att_falloc(nq), *lse = att_falloc((size_t)B * H * Tq), *mask = att_falloc((size_t)Tq * Tk);
    float *dq = att_falloc(nq), *dk = att_falloc(nk), *dv = att_falloc(nk);
    tfm_tensor tq = tfm_tensor3(q, B, Tq, C), tk = tfm_tensor3(k, B, Tk, C), tv = tfm_tensor3(v, B, Tk, C);
    tfm_tensor to = tfm_tensor3(out, B, Tq, C), tdo = tfm_tensor3(dout, B, Tq, C), tl = tfm_tensor3(lse, B, H, Tq);
    tfm_tensor tdq = tfm_tensor3(dq, B, Tq, C), tdk = tfm_tensor3(dk, B, Tk, C), tdv = tfm_tensor3(dv, B, Tk, C);
    tfm_attn_opts o;
    att_fill(q, nq, -1.5f, 1.5f);
    att_fill(k, nk, -1.5f, 1.5f);
    att_fill(v, nk, -1, 1);
    att_fill(dout, nq, -1, 1);
    att_fill(mask, (size_t)Tq * Tk, -1, 1);
    for (int i = 0; i < Tq; i++) mask[(size_t)i * Tk + hidden[0]] = mask[(size_t)i * Tk + hidden[1]] = -INFINITY;
    memset(&o, 0, sizeof o);
    o.mask = mask;
    for (int pass = 0; pass < 2; pass++) {
        size_t nz = 0, other = 0;
        o.dropout = pass ? 0.2f : 0.0f;
        o.dropout_seed = 5;
        memset(dq, 0, nq * sizeof(float));
        memset(dk, 0, nk * sizeof(float));
        memset(dv, 0, nk * sizeof(float));
        CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, H, &o));
        CHECK_OK(tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, H, &o));
        for (int b = 0; b < B; b++)
            for (int j = 0; j < Tk; j++)
                for (int c = 0; c < C; c++) {
                    size_t x = ((size_t)b * Tk + j) * C + c;
                    if (j == hidden[0] || j == hidden[1]) nz += (dk[x] != 0.0f) + (dv[x] != 0.0f);
                    else other += dv[x] != 0.0f;
                }
        CHECK_MSG(nz == 0, "masked key%s: %zu entries of the hidden keys' dk and dv not exactly zero",
                  pass ? ", dropout" : "", nz);
        CHECK_MSG(other > 0, "masked key%s: every dv is zero", pass ? ", dropout" : "");
    }
    free(q); free(k); free(v); free(dout); free(out); free(lse); free(mask); free(dq); free(dk); free(dv);
}

/* tests/blas_spy.c: counts of the products that went through the BLAS library */
int blas_spy_on(void);
void blas_spy_take(long n[3]);

/* One batch-head: the attention's parallel region is then inactive (one task), and the products inside
   it must stay on the calling thread. They once opened nested teams, whose threads libgomp starts afresh
   each time; each left its scratch behind (4.5 MB), which LeakSanitizer reports under make asan. Through
   an OpenMP BLAS, which sees no active region, they would start a team too, and OpenBLAS's bits can
   depend on its size: run at two threads, blas_spy.c must see products inside the region and no team
   (where the spy is on; on the portable kernel, which leaves the attention's products to the BLAS where the
   AVX2 one would take them). The results must equal, bit for bit, batch 0 of a call over two batches (the
   active region's path) whose batch 1 is a copy: a result does not depend on how the work was threaded.
   Then the route: with the AVX2 kernel chosen in a BLAS build, no product of the attention reaches the BLAS. */
static void att_test_one_head(void) {
    const int T = 300, D = 64;
    const size_t n = (size_t)T * D;
    float *q = att_falloc(2 * n), *k = att_falloc(2 * n), *v = att_falloc(2 * n), *dout = att_falloc(2 * n);
    float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
    tfm_attn_opts o;
    size_t bad = 0, x;
    int b, threads = tfm_get_num_threads();
    long spy[3];
    const tfm__gemm_kernel *saved = tfm__gemm_kernel_get();
    tfm_set_num_threads(2);
    if (blas_spy_on()) CHECK_OK(tfm_sgemm_set_kernel("portable"));
    blas_spy_take(spy);
    att_fill(q, n, -1, 1);
    att_fill(k, n, -1, 1);
    att_fill(v, n, -1, 1);
    att_fill(dout, n, -1, 1);
    memcpy(q + n, q, n * sizeof(float));
    memcpy(k + n, k, n * sizeof(float));
    memcpy(v + n, v, n * sizeof(float));
    memcpy(dout + n, dout, n * sizeof(float));
    memset(&o, 0, sizeof o);
    o.causal = 1;
    for (b = 0; b < 2; b++) { /* b = 0: one batch-head; b = 1: two */
        int B = b + 1;
        tfm_tensor tq = tfm_tensor3(q, B, T, D), tk = tfm_tensor3(k, B, T, D), tv = tfm_tensor3(v, B, T, D);
        tfm_tensor to, tdo = tfm_tensor3(dout, B, T, D), tl, tdq, tdk, tdv;
        out[b] = att_falloc((size_t)B * n), lse[b] = att_falloc((size_t)B * T);
        dq[b] = att_falloc((size_t)B * n), dk[b] = att_falloc((size_t)B * n), dv[b] = att_falloc((size_t)B * n);
        to = tfm_tensor3(out[b], B, T, D), tl = tfm_tensor3(lse[b], B, 1, T);
        tdq = tfm_tensor3(dq[b], B, T, D), tdk = tfm_tensor3(dk[b], B, T, D), tdv = tfm_tensor3(dv[b], B, T, D);
        CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, 1, &o));
        CHECK_OK(tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, 1, &o));
        if (b == 0) {
            blas_spy_take(spy);
#ifdef _OPENMP /* without OpenMP there are no regions */
            if (blas_spy_on()) {
                CHECK_MSG(spy[1] > 0, "one batch-head: none of its %ld BLAS products inside a region", spy[0]);
                CHECK_MSG(spy[2] == 0, "one batch-head: %ld of %ld BLAS products in a region would start a team",
                          spy[2], spy[1]);
            }
#endif
        }
    }
    tfm__gemm_kernel_chosen = saved;
    tfm_set_num_threads(threads);
    for (x = 0; x < n; x++) {
        bad += !isfinite(dq[0][x]) || !isfinite(dk[0][x]) || !isfinite(dv[0][x]);
        bad += memcmp(&out[0][x], &out[1][x], sizeof(float)) || memcmp(&dq[0][x], &dq[1][x], sizeof(float)) ||
               memcmp(&dk[0][x], &dk[1][x], sizeof(float)) || memcmp(&dv[0][x], &dv[1][x], sizeof(float));
    }
    CHECK_MSG(bad == 0, "one batch-head: %zu values not finite or not the two-batch call's bits", bad);
    CHECK_MSG(memcmp(lse[0], lse[1], (size_t)T * sizeof(float)) == 0, "one batch-head: lse differs from the two-batch call's");
#if defined(TFM__HAVE_KERNEL_AVX2)
    if (blas_spy_on() && tfm__gemm_kernel_get()->fn == tfm__kernel_avx2) {
        tfm_tensor tq = tfm_tensor3(q, 2, T, D), tk = tfm_tensor3(k, 2, T, D), tv = tfm_tensor3(v, 2, T, D);
        tfm_tensor to = tfm_tensor3(out[1], 2, T, D), tl = tfm_tensor3(lse[1], 2, 1, T), tdo = tfm_tensor3(dout, 2, T, D);
        tfm_tensor tdq = tfm_tensor3(dq[1], 2, T, D), tdk = tfm_tensor3(dk[1], 2, T, D), tdv = tfm_tensor3(dv[1], 2, T, D);
        blas_spy_take(spy); /* (the two-batch call's, on the portable kernel, counted before) */
        CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, 1, &o));
        CHECK_OK(tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, 1, &o));
        blas_spy_take(spy);
        CHECK_MSG(spy[0] == 0, "AVX2 kernel chosen: %ld of the attention's products went through the BLAS", spy[0]);
    }
#endif
    free(q); free(k); free(v); free(dout);
    for (b = 0; b < 2; b++) {
        free(out[b]); free(lse[b]); free(dq[b]); free(dk[b]); free(dv[b]);
    }
}

/* A sliding window (with sinks, key lengths and dropout) against the double reference and central finite
   differences, at the tolerances above; the windows leave gaps inside one key block. */
static void att_test_op_window(void) {
    static const int32_t lens[] = {23, 9, 30};
    att_case c = att_case_make("op window 4 B2 H2 D3 T30", 2, 2, 3, 30, 30);
    c.causal = 1;
    c.window = 4;
    att_run_op_case(&c);
    c = att_case_make("op window 6 sinks 2, key_lens B3 H2 D4 T30", 3, 2, 4, 30, 30);
    c.causal = 1;
    c.window = 6;
    c.sinks = 2;
    c.key_lens = lens;
    att_run_op_case(&c);
    c = att_case_make("op window 1 sinks 3 B1 H1 D5 T12", 1, 1, 5, 12, 12);
    c.causal = 1;
    c.window = 1;
    c.sinks = 3;
    att_run_op_case(&c);
    c = att_case_make("op window 5 sinks 1, dropout B2 H2 D3 T25", 2, 2, 3, 25, 25);
    c.causal = 1;
    c.window = 5;
    c.sinks = 1;
    c.dropout = 0.2f;
    c.seed = 99;
    att_run_op_case(&c);
}

/* The window against the same attention through the additive mask (-inf outside the window, 0 inside,
   plus a random finite part on both sides) and key lengths, on sequences of several query and key
   blocks (QB 64, KB 256), where the window's kernel skips whole blocks and starts others mid-way: the
   same keys in other blocks, so the sums differ by float rounding alone (online-softmax rescalings at
   other places, dq and dk summed over other partitions): ATT_TOL_FWD and ATT_TOL_GRAD. */
static void att_window_vs_mask(int T, int W, int S, int with_lens) {
    const int B = 2, H = 2, D = 16, C = H * D;
    const size_t nq = (size_t)B * T * C, nl = (size_t)B * H * T;
    static const int32_t lens[] = {600, 411};
    float *q = att_falloc(nq), *k = att_falloc(nq), *v = att_falloc(nq), *dout = att_falloc(nq);
    float *mask = att_falloc((size_t)T * T), *mwin = att_falloc((size_t)T * T);
    float *out[2], *lse[2], *g[2][3];
    tfm_tensor tq = tfm_tensor3(q, B, T, C), tk = tfm_tensor3(k, B, T, C), tv = tfm_tensor3(v, B, T, C);
    tfm_tensor tdo = tfm_tensor3(dout, B, T, C);
    tfm_attn_opts o[2];
    char what[160];
    int r, i, j, x;
    att_fill(q, nq, -1.5f, 1.5f);
    att_fill(k, nq, -1.5f, 1.5f);
    att_fill(v, nq, -1, 1);
    att_fill(dout, nq, -1, 1);
    att_fill(mask, (size_t)T * T, -1, 1);
    for (i = 0; i < T; i++)
        for (j = 0; j < T; j++) mwin[(size_t)i * T + j] = j <= i - W && j >= S ? -INFINITY : mask[(size_t)i * T + j];
    for (r = 0; r < 2; r++) { /* 0: the window; 1: the mask */
        memset(&o[r], 0, sizeof o[r]);
        o[r].causal = 1;
        o[r].key_lens = with_lens ? lens : NULL;
        o[r].window = r ? 0 : W;
        o[r].sinks = r ? 0 : S;
        o[r].mask = r ? mwin : mask;
        out[r] = att_falloc(nq);
        lse[r] = att_falloc(nl);
        for (x = 0; x < 3; x++) g[r][x] = att_falloc(nq);
        {
            tfm_tensor to = tfm_tensor3(out[r], B, T, C), tl = tfm_tensor3(lse[r], B, H, T);
            tfm_tensor t0 = tfm_tensor3(g[r][0], B, T, C), t1 = tfm_tensor3(g[r][1], B, T, C), t2 = tfm_tensor3(g[r][2], B, T, C);
            CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, H, &o[r]));
            CHECK_OK(tfm_attention_backward(&t0, &t1, &t2, &tdo, &tq, &tk, &tv, &to, &tl, H, &o[r]));
        }
    }
    {
        double *want = att_to_double(out[1], nq);
        snprintf(what, sizeof what, "window %d sinks %d T %d lens %d: out", W, S, T, with_lens);
        CHECK_REL(what, test_rel_err(out[0], want, nq), ATT_TOL_FWD);
        free(want);
        want = att_to_double(lse[1], nl);
        for (i = 0; i < (int)nl; i++) { /* rows of no key (past a key length of 0): -inf in both */
            CHECK(isinf(want[i]) == isinf(lse[0][i]));
            if (isinf(want[i])) want[i] = lse[0][i] = 0.0f;
        }
        snprintf(what, sizeof what, "window %d sinks %d T %d lens %d: lse", W, S, T, with_lens);
        CHECK_REL(what, test_rel_err(lse[0], want, nl), ATT_TOL_FWD);
        free(want);
        for (x = 0; x < 3; x++) {
            want = att_to_double(g[1][x], nq);
            snprintf(what, sizeof what, "window %d sinks %d T %d lens %d: d%c", W, S, T, with_lens, "qkv"[x]);
            CHECK_REL(what, test_rel_err(g[0][x], want, nq), ATT_TOL_GRAD);
            free(want);
        }
    }
    for (r = 0; r < 2; r++) {
        free(out[r]);
        free(lse[r]);
        for (x = 0; x < 3; x++) free(g[r][x]);
    }
    free(q); free(k); free(v); free(dout); free(mask); free(mwin);
}

static void att_test_fused_window(void) {
    att_window_vs_mask(600, 256, 0, 0);
    att_window_vs_mask(600, 70, 4, 1);
    att_window_vs_mask(600, 300, 260, 1); /* sinks past a key block */
    att_window_vs_mask(130, 1000, 0, 0);  /* a window wider than the sequence: full causal */
}

/* A window of 1 key: every query sees itself only, so its softmax is one-hot and dq is exactly zero. */
static void att_test_window_one_key(void) {
    tfm_attn_opts o;
    memset(&o, 0, sizeof o);
    o.causal = 1;
    o.window = 1;
    att_one_key_case("window 1", 2, 2, 16, 300, 300, &o, 0, -1);
}

/* A whole block with its own window (tfm_block_desc.attn_window, attn_sinks; LLaMA's RMSNorm, SwiGLU and
   rotary positions) against the same block without one, called with the window as an additive mask
   (-inf outside it) through the self-attention's mask path: the same parameters (the same seed), y, dx
   and every parameter gradient, over three query blocks. Tolerances ATT_TOL_FWD and ATT_TOL_GRAD: the
   same sums, blocked from other starting keys. */
static void att_test_block_window_vs_mask(void) {
    enum { B = 2, T = 150, C = 16, W = 20, S = 2 };
    tfm_block_desc d;
    tfm_block blk[2];
    tfm_mem mem[2];
    tfm_rng rng;
    tfm_attn_opts o[2];
    float *x = att_falloc((size_t)B * T * C), *dy = att_falloc((size_t)B * T * C), *mask = att_falloc((size_t)T * T);
    float *y[2], *dx[2];
    char what[96];
    int r, i, j, ok = 1;
    att_fill(x, (size_t)B * T * C, -1, 1);
    att_fill(dy, (size_t)B * T * C, -1, 1);
    for (i = 0; i < T; i++)
        for (j = 0; j < T; j++) mask[(size_t)i * T + j] = j <= i - W && j >= S ? -INFINITY : 0.0f;
    for (r = 0; r < 2; r++) { /* 0: the block's window; 1: the mask */
        memset(&d, 0, sizeof d);
        d.d_model = C;
        d.n_heads = 2;
        d.d_ff = 24;
        d.norm_first = 1;
        d.act = TFM_ACT_SWIGLU;
        d.norm = TFM_NORM_RMS;
        d.rope_dims = 8;
        d.max_batch = B;
        d.max_len = T;
        d.attn_window = r ? 0 : W;
        d.attn_sinks = r ? 0 : S;
        memset(&mem[r], 0, sizeof mem[r]);
        memset(&o[r], 0, sizeof o[r]);
        o[r].causal = 1;
        o[r].mask = r ? mask : NULL;
        y[r] = att_falloc((size_t)B * T * C);
        dx[r] = att_falloc((size_t)B * T * C);
        CHECK_OK(tfm_block_init(&blk[r], &d, &mem[r]));
        CHECK_OK(tfm_mem_alloc(&mem[r]));
        CHECK_OK(tfm_block_init(&blk[r], &d, &mem[r]));
        ok &= mem[r].params.base != NULL;
        if (!ok) continue;
        tfm_rng_seed(&rng, 31);
        CHECK_OK(tfm_block_init_params(&blk[r], &rng));
        tfm_mem_zero_grad(&mem[r]);
        {
            tfm_tensor tx = tfm_tensor3(x, B, T, C), ty = tfm_tensor3(y[r], B, T, C);
            tfm_tensor tdy = tfm_tensor3(dy, B, T, C), tdx = tfm_tensor3(dx[r], B, T, C);
            CHECK_OK(tfm_block_forward(&blk[r], &ty, &tx, NULL, &o[r]));
            CHECK_OK(tfm_block_backward(&blk[r], &tdx, NULL, &tdy));
        }
    }
    if (ok && mem[0].params.used == mem[1].params.used && mem[0].grads.used == mem[1].grads.used) {
        double *want;
        CHECK(!memcmp(mem[0].params.base, mem[1].params.base, mem[0].params.used));
        want = att_to_double(y[1], (size_t)B * T * C);
        CHECK_REL("block window vs mask: y", test_rel_err(y[0], want, (size_t)B * T * C), ATT_TOL_FWD);
        free(want);
        want = att_to_double(dx[1], (size_t)B * T * C);
        CHECK_REL("block window vs mask: dx", test_rel_err(dx[0], want, (size_t)B * T * C), ATT_TOL_GRAD);
        free(want);
        {
            size_t n = mem[0].grads.used / sizeof(float);
            want = att_to_double((const float *)(const void *)mem[1].grads.base, n);
            snprintf(what, sizeof what, "block window vs mask: the %zu parameter gradients", n);
            CHECK_REL(what, test_rel_err((const float *)(const void *)mem[0].grads.base, want, n), ATT_TOL_GRAD);
            free(want);
        }
    } else {
        CHECK_MSG(0, "block window vs mask: the two blocks were not built alike");
    }
    for (r = 0; r < 2; r++) {
        tfm_mem_free(&mem[r]);
        free(y[r]);
        free(dx[r]);
    }
    free(x); free(dy); free(mask);
}

/* The window's refusals: negative sizes, sinks without a window, a window on a call that is not causal,
   on cross-attention, on a classifier; a layer's own window against a call of another or no causal. */
static void att_test_window_errors(void) {
    const int B = 1, T = 4, C = 4;
    float q[16] = {0}, out[16], lse[8];
    tfm_tensor tq = tfm_tensor3(q, B, T, C), to = tfm_tensor3(out, B, T, C), tl = tfm_tensor3(lse, B, 2, T);
    tfm_attn_opts o;
    tfm_mha_desc d;
    tfm_mha m;
    tfm_mem mem;
    tfm_config c;
    tfm_model model;
    memset(&o, 0, sizeof o);
    o.window = 2;
    CHECK_ERR(tfm_attention_forward(&to, &tl, &tq, &tq, &tq, 2, &o), TFM_E_ARG, "opts.causal");
    o.causal = 1;
    o.window = -1;
    CHECK_ERR(tfm_attention_forward(&to, &tl, &tq, &tq, &tq, 2, &o), TFM_E_ARG, "opts.window -1");
    o.window = 0;
    o.sinks = 1;
    CHECK_ERR(tfm_attention_forward(&to, &tl, &tq, &tq, &tq, 2, &o), TFM_E_ARG, "opts.sinks only with opts.window");
    memset(&d, 0, sizeof d);
    memset(&mem, 0, sizeof mem);
    d.d_model = C;
    d.n_heads = 2;
    d.max_len = T;
    d.cross = 1;
    d.attn_window = 2;
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "not cross");
    d.cross = 0;
    d.attn_sinks = -1;
    CHECK_ERR(tfm_mha_init(&m, &d, &mem), TFM_E_ARG, "desc.attn_sinks -1");
    d.attn_sinks = 1;
    CHECK_OK(tfm_mha_init(&m, &d, &mem));
    CHECK_OK(tfm_mem_alloc(&mem));
    CHECK_OK(tfm_mha_init(&m, &d, &mem));
    if (m.in_proj_weight.data) {
        tfm_tensor tx = tfm_tensor3(q, B, T, C), ty = tfm_tensor3(out, B, T, C);
        tfm_rng rng;
        tfm_rng_seed(&rng, 3);
        CHECK_OK(tfm_mha_init_params(&m, &rng)); /* the accepted call below reads them */
        memset(&o, 0, sizeof o);
        CHECK_ERR(tfm_mha_forward(&m, &ty, &tx, NULL, &o), TFM_E_ARG, "needs causal calls");
        CHECK_ERR(tfm_mha_forward(&m, &ty, &tx, NULL, NULL), TFM_E_ARG, "needs causal calls");
        o.causal = 1;
        o.window = 3;
        CHECK_ERR(tfm_mha_forward(&m, &ty, &tx, NULL, &o), TFM_E_ARG, "differs");
        o.window = 2; /* the layer's window with other sinks than its own */
        CHECK_ERR(tfm_mha_forward(&m, &ty, &tx, NULL, &o), TFM_E_ARG, "opts.sinks 0 differs from the layer's desc.attn_sinks 1");
        o.sinks = 1;
        CHECK_OK(tfm_mha_forward(&m, &ty, &tx, NULL, &o));
        o.window = o.sinks = 0;
        CHECK_OK(tfm_mha_forward(&m, &ty, &tx, NULL, &o));
    }
    tfm_mem_free(&mem);
    memset(&c, 0, sizeof c);
    c.kind = TFM_MODEL_ENCODER_CLASSIFIER;
    c.vocab_size = 5;
    c.n_classes = 2;
    c.d_model = 4;
    c.n_heads = 2;
    c.max_len = 6;
    c.attn_window = 2;
    CHECK_ERR(tfm_model_init(&model, &c, NULL, 0), TFM_E_ARG, "classifier");
    c.kind = TFM_MODEL_DECODER_LM;
    c.n_classes = 0;
    c.attn_window = 0;
    c.attn_sinks = 2;
    CHECK_ERR(tfm_model_init(&model, &c, NULL, 0), TFM_E_ARG, "cfg.attn_sinks only with cfg.attn_window");
}

/* dropout: the same hashed masks as the unfused attention, batch offset included */
static void att_test_fused_dropout(void) {
    static const int32_t lens[] = {300, 199};
    tfm_attn_opts o;
    memset(&o, 0, sizeof o);
    o.dropout = 0.2f;
    o.dropout_seed = 4242;
    att_fused_case("dropout B2 H2 D8 T300", 2, 2, 8, 300, 300, &o);
    o.causal = 1;
    o.key_lens = lens;
    o.batch_offset = 3;
    att_fused_case("dropout causal+key_lens offset 3 B2 H2 D8 T300", 2, 2, 8, 300, 300, &o);
    o.causal = 0;
    o.key_lens = NULL;
    att_fused_case("dropout cross B1 H2 D8 Tq65 Tk520", 1, 2, 8, 65, 520, &o);
}

/* decoding against the key/value cache past the key block boundary (256): a 250-token prompt, a chunk
   of 5 more at once (queries at positions 250.., causal over the cache), then one token per call up to
   300; each call's last-row logits against a full forward over the whole sequence (1e-5 relative:
   the same arithmetic in other blocks and orders) */
static void att_test_fused_decode(void) {
    enum { N = 300, V = 13 };
    tfm_config c;
    tfm_model m;
    tfm_batch b;
    tfm_kv_cache kc;
    int32_t seq[N];
    float *full;
    int t;
    memset(&c, 0, sizeof c);
    c.kind = TFM_MODEL_DECODER_LM;
    c.vocab_size = V;
    c.d_model = 16;
    c.n_heads = 4;
    c.n_layers = 2;
    c.max_len = N;
    c.max_batch = 1;
    c.norm_first = 1;
    c.init_std = 0.3f;
    c.seed = 11;
    for (t = 0; t < N; t++) seq[t] = (int32_t)((t * 7 + t / 5) % V);
    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    if (!m.impl) return;
    tfm_model_train(&m, 0);
    memset(&b, 0, sizeof b);
    b.batch = 1;
    b.len = N;
    b.tokens = seq;
    CHECK_OK(tfm_model_forward(&m, &b, NULL, NULL));
    full = (float *)malloc((size_t)N * V * sizeof(float));
    memcpy(full, tfm_model_logits(&m).data, (size_t)N * V * sizeof(float));
    CHECK_OK(tfm_kv_cache_init(&kc, &m, 1, 0));
    tfm__decode_into(&m, &kc, seq, 1, 250, NULL, NULL, 0, m.impl->logits);
    CHECK_REL("decode: prompt of 250", test_rel_err_f(m.impl->logits, full + (int64_t)249 * V, V), 1e-5);
    tfm__decode_into(&m, &kc, seq + 250, 1, 5, NULL, NULL, 0, m.impl->logits);
    CHECK_REL("decode: chunk 250..254", test_rel_err_f(m.impl->logits, full + (int64_t)254 * V, V), 1e-5);
    for (t = 255; t < N; t++) {
        char what[64];
        tfm__decode_into(&m, &kc, seq + t, 1, 1, NULL, NULL, 0, m.impl->logits);
        snprintf(what, sizeof what, "decode: position %d", t);
        CHECK_REL(what, test_rel_err_f(m.impl->logits, full + (int64_t)t * V, V), 1e-5);
    }
    tfm_kv_cache_free(&kc);
    free(full);
    tfm_model_free(&m);
}

/* ---- the layer: tfm_mha_* ---- */

typedef struct att_mha_case {
    const char *name;
    int B, H, D, Tq, Tk;  /* Tk: cross only */
    int cross, no_bias, causal;
    const int32_t *key_lens;
} att_mha_case;

/* Build a layer sized a little above the case (forward on smaller shapes than the maximum), with
   random parameters of our own (non-zero biases so that their gradients mean something). */
static int att_mha_build(tfm_mha *m, tfm_mem *mem, const att_mha_case *c, int B_max, int Tq_max,
                         int Tk_max) {
    const int C = c->H * c->D;
    tfm_mha_desc d;
    tfm_rng rng;
    tfm_result r;
    memset(&d, 0, sizeof d);
    memset(mem, 0, sizeof *mem);
    d.d_model = C;
    d.n_heads = c->H;
    d.cross = c->cross;
    d.no_bias = c->no_bias;
    d.max_batch = B_max;
    d.max_len = Tq_max;
    d.max_kv_len = c->cross ? Tk_max : 0;
    r = tfm_mha_init(m, &d, mem);
    CHECK_OK(r);
    if (r != TFM_OK) return 0;
    r = tfm_mem_alloc(mem);
    CHECK_OK(r);
    if (r != TFM_OK) return 0;
    r = tfm_mha_init(m, &d, mem);
    CHECK_OK(r);
    if (r != TFM_OK) return 0;
    CHECK_OK(tfm_mem_check(mem));
    tfm_rng_seed(&rng, 5);
    tfm_mha_init_params(m, &rng);
    {
        /* torch's initialisation: xavier_uniform (3C,C): bound sqrt(6 / (C + 3C)); out_proj
           U(+-1/sqrt(C)); zero biases */
        double bw = sqrt(6.0 / (4.0 * C)), bo = 1.0 / sqrt((double)C);
        size_t bad = 0;
        for (int64_t i = 0; i < 3 * C * C; i++) bad += fabs(m->in_proj_weight.data[i]) > bw;
        for (int64_t i = 0; i < C * C; i++) bad += fabs(m->out_proj_weight.data[i]) > bo;
        if (!c->no_bias) {
            for (int64_t i = 0; i < 3 * C; i++) bad += m->in_proj_bias.data[i] != 0.0f;
            for (int64_t i = 0; i < C; i++) bad += m->out_proj_bias.data[i] != 0.0f;
        } else {
            CHECK(m->in_proj_bias.data == NULL && m->out_proj_bias.data == NULL);
        }
        CHECK_MSG(bad == 0, "%s: %zu parameters outside torch's initialisation", c->name, bad);
    }
    {
        float ws = 1.5f / sqrtf((float)C);
        att_fill(m->in_proj_weight.data, (size_t)3 * C * C, -ws, ws);
        att_fill(m->out_proj_weight.data, (size_t)C * C, -ws, ws);
        if (!c->no_bias) {
            att_fill(m->in_proj_bias.data, (size_t)3 * C, -0.5f, 0.5f);
            att_fill(m->out_proj_bias.data, (size_t)C, -0.5f, 0.5f);
        }
    }
    return 1;
}

static void att_mha_zero_grads(tfm_mha *m) {
    const size_t C = (size_t)m->desc.d_model;
    memset(m->d_in_proj_weight.data, 0, 3 * C * C * sizeof(float));
    memset(m->d_out_proj_weight.data, 0, C * C * sizeof(float));
    if (m->d_in_proj_bias.data) memset(m->d_in_proj_bias.data, 0, 3 * C * sizeof(float));
    if (m->d_out_proj_bias.data) memset(m->d_out_proj_bias.data, 0, C * sizeof(float));
}

static void att_check_grad_scaled(const char *name, const char *what, const float *got,
                                  const double *want, size_t n, double factor) {
    double *w = att_dalloc(n);
    char label[200];
    for (size_t i = 0; i < n; i++) w[i] = factor * want[i];
    snprintf(label, sizeof label, "%s: %s%s", name, what, factor != 1.0 ? " (accumulated twice)" : "");
    CHECK_REL(label, test_rel_err(got, w, n), ATT_TOL_GRAD);
    free(w);
}

/* One layer case: forward against the reference, backward against finite differences with respect to
   x, xkv and the four parameters, a second forward+backward without clearing (gradients double), and
   the fully-masked batch elements (y is the output bias, dx and dxkv zero, no NaN). */
static void att_run_mha_case(const att_mha_case *c) {
    const int C = c->H * c->D, Tk = c->cross ? c->Tk : c->Tq;
    const size_t nx = (size_t)c->B * c->Tq * C, nkv = (size_t)c->B * Tk * C;
    const size_t nwin = (size_t)3 * C * C, nbin = (size_t)3 * C, nwo = (size_t)C * C, nbo = C;
    tfm_mha m;
    tfm_mem mem;
    float *x = att_falloc(nx), *xkv = att_falloc(nkv), *y = att_falloc(nx), *dy = att_falloc(nx);
    float *dx = att_falloc(nx), *dxkv = att_falloc(nkv);
    double *gx = att_dalloc(nx), *gxkv = att_dalloc(nkv), *gwin = att_dalloc(nwin);
    double *gbin = att_dalloc(nbin), *gwo = att_dalloc(nwo), *gbo = att_dalloc(nbo);
    att_mha_ref ref;
    tfm_attn_opts o;
    tfm_tensor tx = tfm_tensor3(x, c->B, c->Tq, C), txkv = tfm_tensor3(xkv, c->B, Tk, C);
    tfm_tensor ty = tfm_tensor3(y, c->B, c->Tq, C), tdy = tfm_tensor3(dy, c->B, c->Tq, C);
    tfm_tensor tdx = tfm_tensor3(dx, c->B, c->Tq, C), tdxkv = tfm_tensor3(dxkv, c->B, Tk, C);
    tfm_result res;
    char what[200];

    memset(&ref, 0, sizeof ref);
    if (!att_mha_build(&m, &mem, c, c->B + 1, c->Tq + 2, Tk + 3)) goto done;
    memset(&o, 0, sizeof o);
    o.causal = c->causal;
    o.key_lens = c->key_lens;
    att_fill(x, nx, -1, 1);
    att_fill(xkv, nkv, -1, 1);
    att_fill(dy, nx, -1, 1);

    ref.sd.B = c->B; ref.sd.H = c->H; ref.sd.D = c->D; ref.sd.Tq = c->Tq; ref.sd.Tk = Tk;
    ref.sd.causal = c->causal;
    ref.sd.key_lens = c->key_lens;
    ref.sd.scale = 1.0 / sqrt((double)c->D);
    ref.sd.drop = NULL;
    ref.cross = c->cross;
    ref.x = att_to_double(x, nx);
    ref.xkv = c->cross ? att_to_double(xkv, nkv) : NULL;
    ref.win = att_to_double(m.in_proj_weight.data, nwin);
    ref.bin = c->no_bias ? NULL : att_to_double(m.in_proj_bias.data, nbin);
    ref.wout = att_to_double(m.out_proj_weight.data, nwo);
    ref.bout = c->no_bias ? NULL : att_to_double(m.out_proj_bias.data, nbo);
    ref.r = att_to_double(dy, nx);
    ref.q = att_dalloc(nx);
    ref.k = att_dalloc(nkv);
    ref.v = att_dalloc(nkv);
    ref.ctx = att_dalloc(nx);
    ref.y = att_dalloc(nx);

    att_fill_nan(y, nx);
    res = tfm_mha_forward(&m, &ty, &tx, c->cross ? &txkv : NULL, &o);
    CHECK_OK(res);
    if (res != TFM_OK) goto done;
    att_ref_mha(&ref);
    snprintf(what, sizeof what, "%s: y", c->name);
    CHECK_REL(what, test_rel_err(y, ref.y, nx), ATT_TOL_FWD);

    att_fd(att_mha_loss, &ref, ref.x, nx, gx);
    if (c->cross) att_fd(att_mha_loss, &ref, ref.xkv, nkv, gxkv);
    att_fd(att_mha_loss, &ref, ref.win, nwin, gwin);
    att_fd(att_mha_loss, &ref, ref.wout, nwo, gwo);
    if (!c->no_bias) {
        att_fd(att_mha_loss, &ref, ref.bin, nbin, gbin);
        att_fd(att_mha_loss, &ref, ref.bout, nbo, gbo);
    }

    for (int pass = 1; pass <= 2; pass++) {
        /* pass 1 from zero; pass 2 forward and backward again onto the same buffers: twice the
           gradient */
        if (pass == 1) att_mha_zero_grads(&m);
        else CHECK_OK(tfm_mha_forward(&m, &ty, &tx, c->cross ? &txkv : NULL, &o));
        res = tfm_mha_backward(&m, &tdx, c->cross ? &tdxkv : NULL, &tdy);
        CHECK_OK(res);
        if (res != TFM_OK) goto done;
        att_check_grad_scaled(c->name, "dx", dx, gx, nx, pass);
        if (c->cross) att_check_grad_scaled(c->name, "dxkv", dxkv, gxkv, nkv, pass);
        att_check_grad_scaled(c->name, "d_in_proj_weight", m.d_in_proj_weight.data, gwin, nwin, pass);
        att_check_grad_scaled(c->name, "d_out_proj_weight", m.d_out_proj_weight.data, gwo, nwo, pass);
        if (!c->no_bias) {
            att_check_grad_scaled(c->name, "d_in_proj_bias", m.d_in_proj_bias.data, gbin, nbin, pass);
            att_check_grad_scaled(c->name, "d_out_proj_bias", m.d_out_proj_bias.data, gbo, nbo, pass);
        }
    }

    {
        size_t bad = att_count_nonfinite(y, nx) + att_count_nonfinite(dx, nx) +
                     att_count_nonfinite(m.d_in_proj_weight.data, nwin) +
                     att_count_nonfinite(m.d_out_proj_weight.data, nwo);
        if (c->cross) bad += att_count_nonfinite(dxkv, nkv);
        if (!c->no_bias)
            bad += att_count_nonfinite(m.d_in_proj_bias.data, nbin) +
                   att_count_nonfinite(m.d_out_proj_bias.data, nbo);
        CHECK_MSG(bad == 0, "%s: %zu NaN or Inf in y or a gradient", c->name, bad);
    }
    if (c->key_lens)
        for (int b = 0; b < c->B; b++) {
            size_t nz = 0, ybad = 0;
            if (c->key_lens[b] != 0) continue;
            /* no key: ctx rows are zero, so y rows are the output bias exactly and nothing flows back
               to this element's inputs */
            for (int i = 0; i < c->Tq; i++)
                for (int ch = 0; ch < C; ch++) {
                    size_t e = ((size_t)b * c->Tq + i) * C + ch;
                    float want = c->no_bias ? 0.0f : m.out_proj_bias.data[ch];
                    ybad += fabsf(y[e] - want) > 1e-6f * (1 + fabsf(want));
                    nz += dx[e] != 0.0f;
                }
            if (c->cross)
                for (size_t e = (size_t)b * Tk * C; e < (size_t)(b + 1) * Tk * C; e++) nz += dxkv[e] != 0.0f;
            CHECK_MSG(ybad == 0 && nz == 0, "%s: b=%d has key_lens 0 but %zu rows of y differ from the "
                      "output bias and %zu input gradients are non-zero", c->name, b, ybad, nz);
        }

done:
    tfm_mem_free(&mem);
    free(x); free(xkv); free(y); free(dy); free(dx); free(dxkv);
    free(gx); free(gxkv); free(gwin); free(gbin); free(gwo); free(gbo);
    free(ref.x); free(ref.xkv); free(ref.win); free(ref.bin); free(ref.wout); free(ref.bout);
    free(ref.r); free(ref.q); free(ref.k); free(ref.v); free(ref.ctx); free(ref.y);
}

static att_mha_case att_mha_make(const char *name, int B, int H, int D, int Tq, int Tk, int cross) {
    att_mha_case c;
    memset(&c, 0, sizeof c);
    c.name = name;
    c.B = B; c.H = H; c.D = D; c.Tq = Tq; c.Tk = Tk; c.cross = cross;
    return c;
}

static void att_test_mha_self(void) {
    att_mha_case c = att_mha_make("mha self B2 H3 D1 T3", 2, 3, 1, 3, 0, 0);
    att_run_mha_case(&c);
    c = att_mha_make("mha self B1 H3 D5 T3", 1, 3, 5, 3, 0, 0);
    att_run_mha_case(&c);
    c = att_mha_make("mha self no_bias B2 H3 D5 T1", 2, 3, 5, 1, 0, 0);
    c.no_bias = 1;
    att_run_mha_case(&c);
}

static void att_test_mha_causal(void) {
    att_mha_case c = att_mha_make("mha self causal B2 H1 D5 T17", 2, 1, 5, 17, 0, 0);
    c.causal = 1;
    att_run_mha_case(&c);
    c = att_mha_make("mha self causal no_bias B1 H3 D1 T3", 1, 3, 1, 3, 0, 0);
    c.causal = 1;
    c.no_bias = 1;
    att_run_mha_case(&c);
}

static void att_test_mha_padding(void) {
    static const int32_t lens_a[] = {3, 1};
    static const int32_t lens_b[] = {0, 2, 3};
    att_mha_case c = att_mha_make("mha self key_lens B2 H3 D1 T3", 2, 3, 1, 3, 0, 0);
    c.key_lens = lens_a;
    att_run_mha_case(&c);
    /* causal + padding, with one batch element that sees no key at all */
    c = att_mha_make("mha self causal+key_lens(0) B3 H3 D5 T3", 3, 3, 5, 3, 0, 0);
    c.causal = 1;
    c.key_lens = lens_b;
    att_run_mha_case(&c);
}

static void att_test_mha_cross(void) {
    static const int32_t lens_a[] = {5, 2};
    static const int32_t lens_b[] = {0, 7};
    att_mha_case c = att_mha_make("mha cross B2 H3 D1 Tq3 Tk7", 2, 3, 1, 3, 7, 1);
    att_run_mha_case(&c);
    c = att_mha_make("mha cross key_lens B2 H3 D1 Tq3 Tk7", 2, 3, 1, 3, 7, 1);
    c.key_lens = lens_a;
    att_run_mha_case(&c);
    c = att_mha_make("mha cross causal B2 H1 D5 Tq5 Tk3", 2, 1, 5, 5, 3, 1);
    c.causal = 1;
    att_run_mha_case(&c);
    c = att_mha_make("mha cross causal B2 H1 D5 Tq3 Tk5", 2, 1, 5, 3, 5, 1);
    c.causal = 1;
    att_run_mha_case(&c);
    c = att_mha_make("mha cross key_lens(0) B2 H3 D5 Tq1 Tk7", 2, 3, 5, 1, 7, 1);
    c.key_lens = lens_b;
    att_run_mha_case(&c);
    c = att_mha_make("mha cross no_bias causal B1 H3 D1 Tq17 Tk3", 1, 3, 1, 17, 3, 1);
    c.no_bias = 1;
    c.causal = 1;
    att_run_mha_case(&c);
}

/* The layer's outputs and gradients do not depend on the thread count (1 vs 2), with masks, cross
   and dropout. */
static void att_mha_threads_case(const att_mha_case *c, float dropout) {
    const int C = c->H * c->D, Tk = c->cross ? c->Tk : c->Tq;
    const size_t nx = (size_t)c->B * c->Tq * C, nkv = (size_t)c->B * Tk * C;
    const size_t nwin = (size_t)3 * C * C, nwo = (size_t)C * C;
    tfm_mha m;
    tfm_mem mem;
    float *x = att_falloc(nx), *xkv = att_falloc(nkv), *dy = att_falloc(nx);
    float *y[2], *dx[2], *dxkv[2], *gw[2], *gb[2], *go[2], *gob[2];
    tfm_attn_opts o;
    int saved = tfm_get_num_threads();
    char what[200];
    for (int t = 0; t < 2; t++) {
        y[t] = att_falloc(nx); dx[t] = att_falloc(nx); dxkv[t] = att_falloc(nkv);
        gw[t] = att_falloc(nwin); gb[t] = att_falloc(3 * (size_t)C); go[t] = att_falloc(nwo);
        gob[t] = att_falloc(C);
    }
    if (!att_mha_build(&m, &mem, c, c->B, c->Tq, Tk)) goto done;
    memset(&o, 0, sizeof o);
    o.causal = c->causal;
    o.key_lens = c->key_lens;
    o.dropout = dropout;
    o.dropout_seed = 4242;
    att_fill(x, nx, -1, 1);
    att_fill(xkv, nkv, -1, 1);
    att_fill(dy, nx, -1, 1);
    for (int t = 0; t < 2; t++) {
        tfm_tensor tx = tfm_tensor3(x, c->B, c->Tq, C), txkv = tfm_tensor3(xkv, c->B, Tk, C);
        tfm_tensor ty = tfm_tensor3(y[t], c->B, c->Tq, C), tdy = tfm_tensor3(dy, c->B, c->Tq, C);
        tfm_tensor tdx = tfm_tensor3(dx[t], c->B, c->Tq, C);
        tfm_tensor tdxkv = tfm_tensor3(dxkv[t], c->B, Tk, C);
        tfm_set_num_threads(t + 1);
        att_mha_zero_grads(&m);
        CHECK_OK(tfm_mha_forward(&m, &ty, &tx, c->cross ? &txkv : NULL, &o));
        CHECK_OK(tfm_mha_backward(&m, &tdx, c->cross ? &tdxkv : NULL, &tdy));
        memcpy(gw[t], m.d_in_proj_weight.data, nwin * sizeof(float));
        memcpy(go[t], m.d_out_proj_weight.data, nwo * sizeof(float));
        memcpy(gb[t], m.d_in_proj_bias.data, 3 * (size_t)C * sizeof(float));
        memcpy(gob[t], m.d_out_proj_bias.data, (size_t)C * sizeof(float));
    }
    tfm_set_num_threads(saved);
    snprintf(what, sizeof what, "%s: y, 1 vs 2 threads", c->name);
    CHECK_REL(what, test_rel_err_f(y[1], y[0], nx), 1e-6);
    snprintf(what, sizeof what, "%s: dx, 1 vs 2 threads", c->name);
    CHECK_REL(what, test_rel_err_f(dx[1], dx[0], nx), 1e-6);
    if (c->cross) {
        snprintf(what, sizeof what, "%s: dxkv, 1 vs 2 threads", c->name);
        CHECK_REL(what, test_rel_err_f(dxkv[1], dxkv[0], nkv), 1e-6);
    }
    snprintf(what, sizeof what, "%s: d_in_proj_weight, 1 vs 2 threads", c->name);
    CHECK_REL(what, test_rel_err_f(gw[1], gw[0], nwin), 1e-6);
    snprintf(what, sizeof what, "%s: d_in_proj_bias, 1 vs 2 threads", c->name);
    CHECK_REL(what, test_rel_err_f(gb[1], gb[0], 3 * (size_t)C), 1e-6);
    snprintf(what, sizeof what, "%s: d_out_proj_weight, 1 vs 2 threads", c->name);
    CHECK_REL(what, test_rel_err_f(go[1], go[0], nwo), 1e-6);
    snprintf(what, sizeof what, "%s: d_out_proj_bias, 1 vs 2 threads", c->name);
    CHECK_REL(what, test_rel_err_f(gob[1], gob[0], (size_t)C), 1e-6);
    CHECK_MSG(att_count_nonfinite(y[0], nx) + att_count_nonfinite(dx[0], nx) == 0, "%s: NaN or Inf",
              c->name);
done:
    tfm_mem_free(&mem);
    free(x); free(xkv); free(dy);
    for (int t = 0; t < 2; t++) {
        free(y[t]); free(dx[t]); free(dxkv[t]); free(gw[t]); free(gb[t]); free(go[t]); free(gob[t]);
    }
}

static void att_test_mha_threads(void) {
    static const int32_t lens[] = {33, 20, 0, 1};
    static const int32_t lens_kv[] = {9, 40, 1, 0};
    att_mha_case c = att_mha_make("mha threads self causal+key_lens B4 H4 D8 T33", 4, 4, 8, 33, 0, 0);
    c.causal = 1;
    c.key_lens = lens;
    att_mha_threads_case(&c, 0.0f);
    c = att_mha_make("mha threads cross key_lens dropout B4 H4 D8 Tq21 Tk40", 4, 4, 8, 21, 40, 1);
    c.key_lens = lens_kv;
    att_mha_threads_case(&c, 0.1f);
}

/* ---- the block buffers live in each thread's scratch, not on its stack ---- */

/* One attention forward and backward over blocks of both sizes (Tq crosses TFM__ATT_QB, Tk TFM__ATT_KB),
   causal with padding, on buffers the job owns. */
typedef struct att_stack_job {
    int B, H, D, Tq, Tk, threads;
    const float *q, *k, *v, *dout;
    float *out, *lse, *dq, *dk, *dv;
    tfm_result r_fwd, r_bwd;
} att_stack_job;

static void att_stack_tensors(att_stack_job *j, tfm_tensor t[9], tfm_attn_opts *o) {
    static const int32_t lens[] = {300, 131};
    const int C = j->H * j->D;
    t[0] = tfm_tensor3((float *)j->q, j->B, j->Tq, C);
    t[1] = tfm_tensor3((float *)j->k, j->B, j->Tk, C);
    t[2] = tfm_tensor3((float *)j->v, j->B, j->Tk, C);
    t[3] = tfm_tensor3((float *)j->dout, j->B, j->Tq, C);
    t[4] = tfm_tensor3(j->out, j->B, j->Tq, C);
    t[5] = tfm_tensor3(j->lse, j->B, j->H, j->Tq);
    t[6] = tfm_tensor3(j->dq, j->B, j->Tq, C);
    t[7] = tfm_tensor3(j->dk, j->B, j->Tk, C);
    t[8] = tfm_tensor3(j->dv, j->B, j->Tk, C);
    memset(o, 0, sizeof *o);
    o->causal = 1;
    o->key_lens = lens;
}

static void att_stack_fwd(att_stack_job *j) {
    tfm_tensor t[9];
    tfm_attn_opts o;
    att_stack_tensors(j, t, &o);
    j->r_fwd = tfm_attention_forward(&t[4], &t[5], &t[0], &t[1], &t[2], j->H, &o);
}

static void att_stack_bwd(att_stack_job *j) {
    tfm_tensor t[9];
    tfm_attn_opts o;
    att_stack_tensors(j, t, &o);
    j->r_bwd = tfm_attention_backward(&t[6], &t[7], &t[8], &t[3], &t[0], &t[1], &t[2], &t[4], &t[5], j->H, &o);
}

static void att_stack_run(att_stack_job *j) {
    att_stack_fwd(j);
    if (j->r_fwd == TFM_OK) att_stack_bwd(j);
}

static void *att_stack_main(void *arg) {
    att_stack_job *j = (att_stack_job *)arg;
    tfm_set_num_threads(j->threads);
    att_stack_run(j);
    tfm_scratch_release();
    return NULL;
}

/* A job of its own buffers (outputs and gradients zeroed), sharing the inputs of `like` (NULL: new ones). */
static att_stack_job att_stack_make(const att_stack_job *like) {
    att_stack_job j;
    const size_t nq = (size_t)2 * 300 * 32, nk = (size_t)2 * 300 * 32;
    memset(&j, 0, sizeof j);
    j.B = 2; j.H = 4; j.D = 8; j.Tq = 130; j.Tk = 300; j.threads = 1;
    if (like) {
        j.q = like->q; j.k = like->k; j.v = like->v; j.dout = like->dout;
    } else {
        float *q = att_falloc(nq), *k = att_falloc(nk), *v = att_falloc(nk), *dout = att_falloc(nq);
        att_fill(q, nq, -1.5f, 1.5f);
        att_fill(k, nk, -1.5f, 1.5f);
        att_fill(v, nk, -1, 1);
        att_fill(dout, nq, -1, 1);
        j.q = q; j.k = k; j.v = v; j.dout = dout;
    }
    j.out = att_falloc(nq); j.lse = att_falloc((size_t)2 * 4 * 300);
    j.dq = att_falloc(nq); j.dk = att_falloc(nk); j.dv = att_falloc(nk);
    return j;
}

static void att_stack_free(att_stack_job *j, int inputs) {
    if (inputs) {
        free((void *)j->q); free((void *)j->k); free((void *)j->v); free((void *)j->dout);
    }
    free(j->out); free(j->lse); free(j->dq); free(j->dk); free(j->dv);
}

/* 0 when a's outputs and gradients equal b's bit for bit. */
static int att_stack_differ(const att_stack_job *a, const att_stack_job *b) {
    const size_t nq = (size_t)a->B * a->Tq * a->H * a->D, nk = (size_t)a->B * a->Tk * a->H * a->D;
    return memcmp(a->out, b->out, nq * sizeof(float)) || memcmp(a->lse, b->lse, (size_t)a->B * a->H * a->Tq * sizeof(float)) ||
           memcmp(a->dq, b->dq, nq * sizeof(float)) || memcmp(a->dk, b->dk, nk * sizeof(float)) ||
           memcmp(a->dv, b->dv, nk * sizeof(float));
}

static int att_all_zero(const float *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0.0f) return 0;
    return 1;
}

#if defined(__unix__) || defined(__APPLE__)
/* Forward and backward on a thread with a small stack (test_small_stack_run, in test_sgemm.c) give the
   bits they give on this thread, at 1 and 2 threads. */
static void att_test_small_stack(void) {
    int saved = tfm_get_num_threads();
    att_stack_job in = att_stack_make(NULL);
    for (int nt = 1; nt <= 2; nt++) {
        att_stack_job ref = att_stack_make(&in), j = att_stack_make(&in);
        int kib;
        tfm_set_num_threads(nt);
        att_stack_run(&ref);
        tfm_set_num_threads(saved);
        CHECK_OK(ref.r_fwd);
        CHECK_OK(ref.r_bwd);
        j.threads = nt;
        kib = test_small_stack_run(att_stack_main, &j);
        CHECK_MSG(kib > 0, "could not start a thread with a stack of 256 KiB or less");
        if (test__verbose) printf("    %d thread(s): a stack of %d KiB\n", nt, kib);
        if (kib > 0) {
            CHECK_MSG(j.r_fwd == TFM_OK && j.r_bwd == TFM_OK, "on a %d KiB stack: %d %d", kib, (int)j.r_fwd, (int)j.r_bwd);
            CHECK_MSG(!att_stack_differ(&j, &ref), "attention on a %d KiB stack at %d thread(s) differs", kib, nt);
        }
        att_stack_free(&ref, 0);
        att_stack_free(&j, 0);
    }
    att_stack_free(&in, 1);
}
#else
static void att_test_small_stack(void) {}
#endif

/* Frees every scratch; with `mine`, gives this thread its scratch again (a forward at one thread on
   buffers of its own), so that at two threads the other thread has none. */
static void att_scratch_reset(const att_stack_job *in, int mine) {
    tfm_scratch_release();
    if (mine) {
        att_stack_job p = att_stack_make(in);
        tfm_set_num_threads(1);
        att_stack_fwd(&p);
        CHECK_OK(p.r_fwd);
        att_stack_free(&p, 0);
    }
}

/* A thread that cannot allocate its scratch: TFM_E_NOMEM naming the function, and nothing written; at 2
   threads, the calling thread has its scratch and the other has none: neither runs a task. Then the same
   calls succeed and give the bits they give without the failures. */
static void att_test_scratch_nomem(void) {
    int saved = tfm_get_num_threads(), max_nt;
    att_stack_job in = att_stack_make(NULL);
    const size_t nq = (size_t)2 * 130 * 32, nk = (size_t)2 * 300 * 32;
    tfm_set_num_threads(2);
    max_nt = tfm_get_num_threads(); /* 1 in a build without OpenMP: there is no second thread to lack it */
    for (int nt = 1; nt <= max_nt && nt <= 2; nt++) {
        att_stack_job ref = att_stack_make(&in), j = att_stack_make(&in);
        tfm_set_num_threads(nt);
        att_stack_run(&ref);
        CHECK_OK(ref.r_bwd);
        att_scratch_reset(&in, nt == 2);
        tfm_set_num_threads(nt);
        tfm__scratch_refuse = 1;
        tfm_clear_error();
        att_stack_fwd(&j);
        tfm__scratch_refuse = 0;
        CHECK_MSG(j.r_fwd == TFM_E_NOMEM && strstr(tfm_last_error(), "tfm_attention_forward"),
                  "%d thread(s): forward without scratch returned %d: %s", nt, (int)j.r_fwd, tfm_last_error());
        CHECK_MSG(att_all_zero(j.out, nq), "%d thread(s): forward without scratch wrote its output", nt);
        att_stack_fwd(&j);
        CHECK_OK(j.r_fwd);
        att_scratch_reset(&in, nt == 2);
        tfm_set_num_threads(nt);
        tfm__scratch_refuse = 1;
        tfm_clear_error();
        att_stack_bwd(&j);
        tfm__scratch_refuse = 0;
        CHECK_MSG(j.r_bwd == TFM_E_NOMEM && strstr(tfm_last_error(), "tfm_attention_backward"),
                  "%d thread(s): backward without scratch returned %d: %s", nt, (int)j.r_bwd, tfm_last_error());
        CHECK_MSG(att_all_zero(j.dq, nq) && att_all_zero(j.dk, nk) && att_all_zero(j.dv, nk),
                  "%d thread(s): backward without scratch added into the gradients", nt);
        att_stack_bwd(&j);
        CHECK_OK(j.r_bwd);
        CHECK_MSG(!att_stack_differ(&j, &ref), "%d thread(s): attention after a refused scratch differs", nt);
        att_stack_free(&ref, 0);
        att_stack_free(&j, 0);
    }
    tfm_set_num_threads(saved);
    att_stack_free(&in, 1);
}

/* Grouped-query attention in tfm_attention_forward/_backward (opts.n_kv_heads): against the same call with
   every key/value head repeated for its group of query heads (LLaMA's repeat_kv, written out here), whose dk
   and dv summed over each group are the grouped call's; causal with key lengths and attention dropout, 2 and 1
   key/value heads (multi-query). At 1 and 2 threads the grouped call gives the same bits (one task per batch
   and key/value head). Bad n_kv_heads and k of the wrong width are refused. */
static void att_test_gqa(void) {
    enum { B = 2, H = 4, D = 8, C = H * D, T = 70 };
    int32_t lens[B] = {70, 33};
    int saved = tfm_get_num_threads();
    for (int Hkv = 2; Hkv >= 1; Hkv--) {
        const int G = H / Hkv, E = Hkv * D;
        const size_t nq = (size_t)B * T * C, nkv = (size_t)B * T * E, nl = (size_t)B * H * T;
        float *q = att_falloc(nq), *k = att_falloc(nkv), *v = att_falloc(nkv), *dout = att_falloc(nq);
        float *kf = att_falloc(nq), *vf = att_falloc(nq), *of = att_falloc(nq), *lf = att_falloc(nl);
        float *dqf = att_falloc(nq), *dkf = att_falloc(nq), *dvf = att_falloc(nq);
        float *dkr = att_falloc(nkv), *dvr = att_falloc(nkv);
        float *o[2], *l[2], *dq[2], *dk[2], *dv[2];
        tfm_attn_opts opts;
        char what[96];
        memset(&opts, 0, sizeof opts);
        opts.causal = 1;
        opts.key_lens = lens;
        opts.dropout = 0.1f;
        opts.dropout_seed = 77;
        att_fill(q, nq, -1, 1);
        att_fill(k, nkv, -1, 1);
        att_fill(v, nkv, -1, 1);
        att_fill(dout, nq, -1, 1);
        for (size_t r = 0; r < (size_t)B * T; r++) /* repeat_kv: query head h's copy of key/value head h / G */
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    kf[r * C + h * D + d] = k[r * E + (h / G) * D + d];
                    vf[r * C + h * D + d] = v[r * E + (h / G) * D + d];
                }
        {
            tfm_tensor tq = tfm_tensor3(q, B, T, C), tk = tfm_tensor3(kf, B, T, C), tv = tfm_tensor3(vf, B, T, C);
            tfm_tensor to = tfm_tensor3(of, B, T, C), tl = tfm_tensor3(lf, B, H, T), tdo = tfm_tensor3(dout, B, T, C);
            tfm_tensor tdq = tfm_tensor3(dqf, B, T, C), tdk = tfm_tensor3(dkf, B, T, C), tdv = tfm_tensor3(dvf, B, T, C);
            CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, H, &opts));
            CHECK_OK(tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, H, &opts));
        }
        for (size_t r = 0; r < (size_t)B * T; r++) /* each key/value head's gradient: its group's sum */
            for (int g = 0; g < Hkv; g++)
                for (int d = 0; d < D; d++) {
                    double sk = 0.0, sv = 0.0;
                    for (int h = g * G; h < g * G + G; h++) sk += dkf[r * C + h * D + d], sv += dvf[r * C + h * D + d];
                    dkr[r * E + g * D + d] = (float)sk;
                    dvr[r * E + g * D + d] = (float)sv;
                }
        opts.n_kv_heads = Hkv;
        for (int t = 0; t < 2; t++) {
            o[t] = att_falloc(nq); l[t] = att_falloc(nl); dq[t] = att_falloc(nq); dk[t] = att_falloc(nkv); dv[t] = att_falloc(nkv);
            tfm_tensor tq = tfm_tensor3(q, B, T, C), tk = tfm_tensor3(k, B, T, E), tv = tfm_tensor3(v, B, T, E);
            tfm_tensor to = tfm_tensor3(o[t], B, T, C), tl = tfm_tensor3(l[t], B, H, T), tdo = tfm_tensor3(dout, B, T, C);
            tfm_tensor tdq = tfm_tensor3(dq[t], B, T, C), tdk = tfm_tensor3(dk[t], B, T, E), tdv = tfm_tensor3(dv[t], B, T, E);
            tfm_set_num_threads(t + 1);
            CHECK_OK(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, H, &opts));
            CHECK_OK(tfm_attention_backward(&tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, H, &opts));
            tfm_set_num_threads(saved);
        }
        snprintf(what, sizeof what, "gqa %d kv heads: out", Hkv);
        CHECK_REL(what, test_rel_err_f(o[0], of, nq), 1e-6);
        snprintf(what, sizeof what, "gqa %d kv heads: lse", Hkv);
        CHECK_REL(what, test_rel_err_f(l[0], lf, nl), 1e-6);
        snprintf(what, sizeof what, "gqa %d kv heads: dq", Hkv);
        CHECK_REL(what, test_rel_err_f(dq[0], dqf, nq), 1e-6);
        snprintf(what, sizeof what, "gqa %d kv heads: dk", Hkv);
        CHECK_REL(what, test_rel_err_f(dk[0], dkr, nkv), 1e-5);
        snprintf(what, sizeof what, "gqa %d kv heads: dv", Hkv);
        CHECK_REL(what, test_rel_err_f(dv[0], dvr, nkv), 1e-5);
        CHECK_MSG(memcmp(o[0], o[1], nq * sizeof(float)) == 0 && memcmp(l[0], l[1], nl * sizeof(float)) == 0 &&
                      memcmp(dq[0], dq[1], nq * sizeof(float)) == 0 && memcmp(dk[0], dk[1], nkv * sizeof(float)) == 0 &&
                      memcmp(dv[0], dv[1], nkv * sizeof(float)) == 0,
                  "gqa %d kv heads: 1 and 2 threads differ", Hkv);
        if (Hkv == 2) { /* refusals */
            tfm_tensor tq = tfm_tensor3(q, B, T, C), tk = tfm_tensor3(k, B, T, E), tv = tfm_tensor3(v, B, T, E);
            tfm_tensor to = tfm_tensor3(o[0], B, T, C), tl = tfm_tensor3(l[0], B, H, T), tdo = tfm_tensor3(dout, B, T, C);
            tfm_tensor tkw = tfm_tensor3(kf, B, T, C);
            opts.n_kv_heads = 3;
            CHECK_ERR(tfm_attention_forward(&to, &tl, &tq, &tk, &tv, H, &opts), TFM_E_ARG,
                      "tfm_attention_forward: opts.n_kv_heads 3 must be 0 or divide n_heads 4");
            opts.n_kv_heads = -2;
            CHECK_ERR(tfm_attention_backward(NULL, NULL, NULL, &tdo, &tq, &tk, &tv, &to, &tl, H, &opts), TFM_E_ARG,
                      "tfm_attention_backward: opts.n_kv_heads -2 must be 0 or divide n_heads 4");
            opts.n_kv_heads = 2;
            CHECK_ERR(tfm_attention_forward(&to, &tl, &tq, &tkw, &tv, H, &opts), TFM_E_SHAPE,
                      "want (2,Tk,16) for 2 key/value heads");
        }
        for (int t = 0; t < 2; t++) free(o[t]), free(l[t]), free(dq[t]), free(dk[t]), free(dv[t]);
        free(q), free(k), free(v), free(dout), free(kf), free(vf), free(of), free(lf);
        free(dqf), free(dkf), free(dvf), free(dkr), free(dvr);
    }
}

static void suite_attention(void) {
    RUN(att_test_op_nomask);
    RUN(att_test_op_causal);
    RUN(att_test_op_padding);
    RUN(att_test_op_causal_padding);
    RUN(att_test_op_fully_masked);
    RUN(att_test_op_cross);
    RUN(att_test_op_dropout_grad);
    RUN(att_test_op_dropout_determinism);
    RUN(att_test_fused_masks);
    RUN(att_test_fused_additive);
    RUN(att_test_fused_dropout);
    RUN(att_test_fused_one_key);
    RUN(att_test_amx_kernel);
    RUN(att_test_masked_key);
    RUN(att_test_one_head);
    RUN(att_test_fused_decode);
    RUN(att_test_op_window);
    RUN(att_test_fused_window);
    RUN(att_test_window_one_key);
    RUN(att_test_window_errors);
    RUN(att_test_block_window_vs_mask);
    RUN(att_test_mha_self);
    RUN(att_test_mha_causal);
    RUN(att_test_mha_padding);
    RUN(att_test_mha_cross);
    RUN(att_test_mha_threads);
    RUN(att_test_gqa);
    RUN(att_test_small_stack);
    RUN(att_test_scratch_nomem);
}
