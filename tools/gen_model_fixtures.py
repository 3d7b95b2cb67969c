#!/usr/bin/env python3
"""Generate the PyTorch reference fixtures for transformer.h's layers (tfm_block), models
(tfm_model_*) and optimizer step (tfm_model_step), checked by tests/test_models_torch.c.

Usage (from the repository root; needs torch, tested with 1.13):

    python3 tools/gen_model_fixtures.py [output_dir]      # default output_dir: tests/fixtures

Writes blk_*.tfx, model_*.tfx and adamw_step.tfx in the TFX1 format of tools/gen_fixtures.py
(described there and in tests/fixture.h), with its writer. The reference modules are those of
tools/torch_models.py, run in float64 on float32-representable parameters and inputs (stored as
f32); references are stored as f64. Every case has its own fixed seed: rerunning rewrites
identical files. Each forward is also checked here against an explicit re-implementation of the
same math (attention from the masks, layernorm, activation formulas), so the fixtures pin down the
semantics, not just torch's modules.

Block fixtures (blk_*)
----------------------
    config     i32[10]  d_model, n_heads, d_ff, cross, causal, norm_first, act, B, T, Tk
                        (act: 0 relu, 1 gelu (erf), 2 gelu (tanh); Tk == T when cross == 0;
                        causal is 1 whenever cross is: TransformerDecoderLayer's self-attention
                        gets the causal tgt_mask)
    ln_eps     f32 scalar
    lens       i32[B]   optional: self-attention key lengths (src_key_padding_mask)
    xkv_lens   i32[B]   optional (cross): key lengths of xkv (memory_key_padding_mask)
    x          f32 (B,T,C)   xkv f32 (B,Tk,C) (cross)   dy f32 (B,T,C)
    <param>    f32, torch names: self_attn.in_proj_weight, self_attn.in_proj_bias,
               self_attn.out_proj.weight, self_attn.out_proj.bias, multihead_attn.* (cross),
               linear1.weight, linear1.bias, linear2.weight, linear2.bias, norm1.*, norm2.*,
               norm3.* (cross)
    y          f64 (B,T,C) forward output (dropout 0)
    grad.x, grad.xkv (cross), grad.<param>   f64: gradients of sum(y * dy)

Model fixtures (model_*)
------------------------
    config     i32[23]  0 kind (1 classifier, 2 LM, 3 enc-dec), 1 vocab_size, 2 tgt_vocab_size,
                        3 n_classes, 4 d_model, 5 n_heads, 6 n_layers, 7 n_dec_layers, 8 d_ff,
                        9 max_len, 10 max_tgt_len, 11 max_batch, 12 act, 13 norm_first,
                        14 pos (0 learned, 1 sinusoidal, 3 rotary), 15 scale_emb, 16 pool (0 mean, 1 first),
                        17 tie_output, 18 share_emb, 19 B, 20 T, 21 Tt (0 unless enc-dec),
                        22 ignore_index (-100)
                        (every field as in tfm_config; each is given explicitly, no zero defaults)
    bert       i32[2]   optional: type_vocab_size, emb_norm (BERT's layout; absent: both 0)
    norm       i32[1]   optional: the norm kind (absent: layernorm)
    rope       i32[1]   with pos 3 (rotary): rope_dims;  rope_base f32 scalar
    window     i32[2]   optional: attn_window, attn_sinks (a sliding window; absent: none)
    label_smoothing, ln_eps   f32 scalars
    tokens     i32 (B,T)     lens i32 (B) (classifier, enc-dec; absent for the LM: no key padding)
    types      i32 (B,T)     optional: token types (batch.token_types; absent: type 0 everywhere)
    tgt_in     i32 (B,Tt)    enc-dec decoder inputs
    labels     i32 (B)       classifier targets    targets i32 (B,T) LM / (B,Tt) enc-dec
    <param>    f32, every parameter by its state_dict name (tools/torch_models.py lists them)
    logits     f64 (B,n_classes) / (B,T,V) / (B,Tt,Vt)
    loss       f64 (1)       mean cross-entropy (ignore_index -100, label smoothing)
    grad.<param>  f64        gradient of loss (dloss = 1)
    The parameter set is exactly {p : "grad.<p>" is in the file}.

AdamW fixture (adamw_step)
--------------------------
    config, label_smoothing, ln_eps   as for a model (an LM)
    optim      f32[6]   lr, beta1, beta2, eps, weight_decay, clip_norm (constant schedule)
    tokens, targets     the first batch;  tokens2, targets2   the second
    <param>    f32      parameters before the first step
    grad.<param>, grad2.<param>     f64 gradients of the two batches' losses, before clipping
    after1.<param>, after2.<param>  f64 parameters after the first and the second step
    loss, grad_norm     f64 (2): each step's loss and global gradient norm before clipping
    Each step: zero gradients, forward, backward, clip_grad_norm_(clip_norm), AdamW step; the second
    forward runs on the parameters the first step left.
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import Case, attention_math, leaf, visible_mask  # noqa: E402
import torch_models as tm  # noqa: E402

LN_EPS = float(np.float32(1e-5))  # the C side's 1e-5f, exactly


def f32(v):
    """v rounded to the nearest float32, as a Python float."""
    return float(np.float32(v))


# ---------------------------------------------------------------------------------------------
# parameters: float32 draws with scales that keep every activation O(1)


def fill_params(cs, module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 2 and "emb" in name:
                v = cs.randn(*p.shape, std=0.5)
            elif name.endswith("in_proj_weight"):
                v = cs.randn(*p.shape, std=1.2 / math.sqrt(p.shape[1]))
            elif p.dim() == 2:
                v = cs.randn(*p.shape, std=1.0 / math.sqrt(p.shape[1]))
            elif "norm" in name and name.endswith("weight"):
                v = cs.randn(*p.shape, std=0.2, mean=1.0)
            else:
                v = cs.randn(*p.shape, std=0.3)
            p.copy_(v.to(torch.float32).to(p.dtype))


def store_params(cs, module, prefix=""):
    for name, p in module.named_parameters():
        cs.f32(prefix + name, p)


def store_grads(cs, module, prefix="grad."):
    for name, p in module.named_parameters():
        cs.f64(prefix + name, p.grad)


# ---------------------------------------------------------------------------------------------
# explicit math: an independent check of the torch modules and masks


def act_explicit(act, x):
    if act == tm.ACT_RELU:
        return torch.where(x > 0, x, torch.zeros_like(x))
    if act == tm.ACT_GELU:
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if act == tm.ACT_SWIGLU:  # gate half, up half
        g, u = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return g / (1.0 + torch.exp(-g)) * u
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * x ** 3)))


def layernorm_explicit(x, w, b, eps):
    """LayerNorm; with b None, RMSNorm (no centering, no bias)."""
    if b is None:
        return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * w
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rope_explicit(x, H, rot, base):
    """x (B,T,C): in each head, channel pair (j, j + rot/2) as the complex number a + ib times
    exp(i t base^(-2j/rot)) at position t."""
    B, T, C = x.shape
    D, half = C // H, rot // 2
    xh = x.reshape(B, T, H, D)
    z = torch.complex(xh[..., :half], xh[..., half:rot])
    ang = torch.tensor([[t * base ** (-2.0 * j / rot) for j in range(half)] for t in range(T)], dtype=torch.float64)
    z = z * torch.polar(torch.ones_like(ang), ang)[None, :, None, :]
    return torch.cat([z.real, z.imag, xh[..., rot:]], dim=-1).reshape(B, T, C)


def mha_explicit(mha, x, src, vis):
    C = x.shape[-1]
    W, bW = mha.in_proj_weight, mha.in_proj_bias
    E = (W.shape[0] - C) // 2  # the key/value channels: C, or fewer with grouped-query attention
    q = x @ W[:C].T + bW[:C]
    k = src @ W[C:C + E].T + bW[C:C + E]
    v = src @ W[C + E:].T + bW[C + E:]
    if isinstance(mha, tm.RopeSelfAttention) and mha.rot:
        Hkv = E // (C // mha.num_heads)
        q, k = rope_explicit(q, mha.num_heads, mha.rot, mha.base), rope_explicit(k, Hkv, mha.rot, mha.base)
    if E != C:  # query head h reads key/value head h // (H / Hkv): gather its channels for every query head
        D = C // mha.num_heads
        grp = mha.num_heads // (E // D)
        idx = torch.tensor([(h // grp) * D + d for h in range(mha.num_heads) for d in range(D)])
        k, v = k[..., idx], v[..., idx]
    o, _ = attention_math(q, k, v, mha.num_heads, vis, 1.0 / math.sqrt(C // mha.num_heads))
    return o @ mha.out_proj.weight.T + mha.out_proj.bias


def block_explicit(layer, act, norm_first, x, xkv=None, lens=None, xkv_lens=None, causal=False, window=0, sinks=0):
    B, T, C = x.shape
    cross = isinstance(layer, nn.TransformerDecoderLayer)
    vis_self = visible_mask(B, T, T, causal or cross, lens)
    for i in range(T if window else 0):  # the sliding window: key j in (i - window, i], or a sink j < sinks
        for j in range(T):
            if not (i - window < j or j < sinks):
                vis_self[:, i, j] = False
    subs = [lambda h: mha_explicit(layer.self_attn, h, h, vis_self)]
    norms = [layer.norm1, layer.norm2]
    if cross:
        vis_x = visible_mask(B, T, xkv.shape[1], False, xkv_lens)
        subs.append(lambda h: mha_explicit(layer.multihead_attn, h, xkv, vis_x))
        norms.append(layer.norm3)
    l1, l2 = layer.linear1, layer.linear2
    subs.append(lambda h: act_explicit(act, h @ l1.weight.T + l1.bias) @ l2.weight.T + l2.bias)
    for f, n in zip(subs, norms):
        ln = lambda z, n=n: layernorm_explicit(z, n.weight, getattr(n, "bias", None), n.eps)  # noqa: E731
        x = x + f(ln(x)) if norm_first else ln(x + f(x))
    return x


def sinusoidal_explicit(P, C):
    pe = np.zeros((P, C))
    for t in range(P):
        for i in range(0, C, 2):
            a = t / 10000.0 ** (i / C)
            pe[t, i] = math.sin(a)
            pe[t, i + 1] = math.cos(a)
    return torch.tensor(pe)


def model_explicit(model, batch):
    """The logits of tools/torch_models.py's model, recomputed from its parameters by hand."""
    c = model.cfg
    P = dict(model.named_parameters())
    scale = math.sqrt(c.d_model) if c.scale_emb else 1.0

    def bert(x):  # token types (type 0 without types) and the embedding layernorm
        if c.type_vocab_size:
            types = batch.get("types")
            types = np.zeros(x.shape[:2], np.int64) if types is None else np.asarray(types)
            x = x + torch.stack([torch.stack([P["type_emb.weight"][int(i)] for i in row]) for row in types])
        if c.emb_norm:
            x = layernorm_explicit(x, P["emb_norm.weight"], P["emb_norm.bias"], c.ln_eps)
        return x

    def embed(tok, emb, pos):
        tok = np.asarray(tok)
        T = tok.shape[1]
        x = torch.stack([torch.stack([emb[int(i)] for i in row]) for row in tok]) * scale
        if c.pos == tm.POS_LEARNED:
            x = x + pos[:T]
        elif c.pos == tm.POS_SINUSOIDAL:
            x = x + sinusoidal_explicit(T, c.d_model)
        return bert(x)

    def stack(prefix, layers, x, memory=None, lens=None, mlens=None, causal=False):
        dec = prefix == "decoder"  # the causal self-attention: the window's place
        for layer in layers:
            x = block_explicit(layer, c.act, c.norm_first, x, memory, lens, mlens, causal,
                               c.attn_window if dec else 0, c.attn_sinks if dec else 0)
        if c.norm_first:
            x = layernorm_explicit(x, P[prefix + ".norm.weight"], P.get(prefix + ".norm.bias"), c.ln_eps)
        return x

    if c.kind == tm.ENCODER_CLASSIFIER:
        lens = batch.get("lens")
        if c.input_dim:  # x[b,t] = W inputs[b,t] + bias, by hand
            u = torch.as_tensor(batch["inputs"], dtype=torch.float64)
            x = torch.einsum("bti,ci->btc", u, P["input_proj.weight"]) + P["input_proj.bias"]
        else:
            x = torch.stack([torch.stack([P["tok_emb.weight"][int(i)] for i in row]) for row in batch["tokens"]]) * scale
        if c.cls_token:
            x = torch.cat([P["cls_token"][None, None, :].expand(x.shape[0], 1, -1), x], 1)
            lens = None if lens is None else [int(n) + 1 for n in lens]
        Te = x.shape[1]
        if c.pos == tm.POS_LEARNED:
            x = x + P["pos_emb.weight"][:Te]
        elif c.pos == tm.POS_SINUSOIDAL:
            x = x + sinusoidal_explicit(Te, c.d_model)
        h = stack("encoder", model.encoder.layers, bert(x), lens=lens)
        if c.pool == tm.POOL_CLS:
            pooled = h[:, 0]
        else:
            lens = lens if lens is not None else [Te] * h.shape[0]
            pooled = torch.stack([h[b, :n].mean(0) for b, n in enumerate(lens)])
        return pooled @ P["head.weight"].T + P["head.bias"]
    if c.kind == tm.DECODER_LM:
        x = embed(batch["tokens"], P["tok_emb.weight"], P.get("pos_emb.weight"))
        h = stack("decoder", model.decoder.layers, x, causal=True)
        W = P["tok_emb.weight"] if c.tie_output else P["head.weight"]
        return h @ W.T
    lens = batch["lens"]
    src_emb = P["src_tok_emb.weight"]
    tgt_emb = src_emb if c.share_emb else P["tgt_tok_emb.weight"]
    mem = stack("encoder", model.encoder.layers,
                embed(batch["tokens"], src_emb, P.get("src_pos_emb.weight")), lens=lens)
    h = stack("decoder", model.decoder.layers,
              embed(batch["tgt_in"], tgt_emb, P.get("tgt_pos_emb.weight")), mem, None, lens)
    W = tgt_emb if c.tie_output else P["head.weight"]
    return h @ W.T


# ---------------------------------------------------------------------------------------------
# blocks


def block_case(name, B, T, C, H, d_ff, act, norm_first, cross=False, causal=False, Tk=None,
               lens=None, xkv_lens=None):
    cs = Case(name)
    Tk = Tk if cross else T
    layer = tm.make_layer(C, H, d_ff, act, norm_first, cross, LN_EPS)
    layer.train()  # dropout is 0; training mode keeps torch off its inference fast path
    fill_params(cs, layer)
    x = leaf(cs.randn(B, T, C))
    xkv = leaf(cs.randn(B, Tk, C)) if cross else None
    dy = cs.randn(B, T, C)
    y = tm.block_forward(layer, x, xkv, lens, xkv_lens, causal)
    (y * dy).sum().backward()
    with torch.no_grad():
        y2 = block_explicit(layer, act, norm_first, x, xkv, lens, xkv_lens, causal)
        assert torch.allclose(y, y2, rtol=0, atol=1e-12), name + ": torch layer != explicit math"

    # causal describes the reference's self-attention: a decoder layer's (cross) always is
    cs.i32("config", [C, H, d_ff, int(cross), int(causal or cross), int(norm_first), act, B, T, Tk])
    cs.f32("ln_eps", torch.tensor(LN_EPS, dtype=torch.float64))
    if lens is not None:
        cs.i32("lens", lens)
    if xkv_lens is not None:
        cs.i32("xkv_lens", xkv_lens)
    cs.f32("x", x)
    if cross:
        cs.f32("xkv", xkv)
    store_params(cs, layer)
    cs.f32("dy", dy)
    cs.f64("y", y)
    cs.f64("grad.x", x.grad)
    if cross:
        cs.f64("grad.xkv", xkv.grad)
    store_grads(cs, layer)
    return cs


# ---------------------------------------------------------------------------------------------
# models


def config_array(c, B, T, Tt):
    return [c.kind, c.vocab_size, c.tgt_vocab_size, c.n_classes, c.d_model, c.n_heads, c.n_layers,
            c.n_dec_layers, c.d_ff, c.max_len, c.max_tgt_len, c.max_batch, c.act,
            int(c.norm_first), c.pos, int(c.scale_emb), c.pool, int(c.tie_output),
            int(c.share_emb), B, T, Tt, c.ignore_index]


def rand_ids(cs, shape, n):
    return torch.randint(0, n, shape, generator=cs.gen).numpy().astype(np.int32)


def store_batch(cs, c, batch, suffix=""):
    if c.input_dim:
        cs.i32("input" + suffix, [c.input_dim, c.cls_token])
        cs.f32("inputs" + suffix, torch.as_tensor(batch["inputs"], dtype=torch.float64))
    else:
        cs.i32("tokens" + suffix, batch["tokens"])
    if batch.get("lens") is not None:
        cs.i32("lens" + suffix, batch["lens"])
    if batch.get("types") is not None:
        cs.i32("types" + suffix, batch["types"])
    if batch.get("tgt_in") is not None:
        cs.i32("tgt_in" + suffix, batch["tgt_in"])
    cs.i32(("labels" if c.kind == tm.ENCODER_CLASSIFIER else "targets") + suffix, batch["targets"])


def make_batch(cs, c, B, T, Tt=0, lens=None, ignore=(), types=False):
    """Random ids; `ignore` lists (row, first column) from which targets are ignore_index
    (classifier: rows whose label is ignored). Padded source positions hold token 0."""
    V = c.vocab_size
    tokens = rand_ids(cs, (B, T), V) if V else None
    if lens is not None and tokens is not None:
        for b, n in enumerate(lens):
            tokens[b, n:] = 0
    batch = dict(tokens=tokens, lens=None if lens is None else np.asarray(lens, np.int32))
    if c.input_dim:  # continuous inputs instead of tokens (float32 values)
        batch = dict(inputs=cs.randn(B, T, c.input_dim).numpy(), lens=batch["lens"])
    if types:  # token types (drawn after the rest, so the other cases' draws are unchanged)
        batch["types"] = rand_ids(cs, (B, T), c.type_vocab_size)
    if c.kind == tm.ENCODER_CLASSIFIER:
        labels = rand_ids(cs, (B,), c.n_classes)
        for b, _ in ignore:
            labels[b] = c.ignore_index
        batch["targets"] = labels
    elif c.kind == tm.DECODER_LM:
        tg = np.concatenate([tokens[:, 1:], rand_ids(cs, (B, 1), V)], axis=1)
        for b, j in ignore:
            tg[b, j:] = c.ignore_index
        batch["targets"] = tg
    else:
        Vt = c.tgt_vocab_size
        tg = rand_ids(cs, (B, Tt), Vt)
        tgt_in = np.concatenate([np.ones((B, 1), np.int32), tg[:, :-1]], axis=1)  # start token 1
        for b, j in ignore:
            tg[b, j:] = c.ignore_index
        batch["tgt_in"] = tgt_in
        batch["targets"] = tg
    return batch


def model_case(name, cfg, B, T, Tt=0, lens=None, ignore=(), types=False):
    cs = Case(name)
    model = tm.build_model(cfg)
    model.train()  # dropout 0
    c = model.cfg
    fill_params(cs, model)
    batch = make_batch(cs, c, B, T, Tt, lens, ignore, types)
    logits, loss = tm.run_batch(model, batch)
    loss.backward()
    with torch.no_grad():
        l2 = model_explicit(model, batch)
        assert torch.allclose(logits, l2, rtol=0, atol=1e-11), name + ": model != explicit math"
        # the torch module's parameter set is the one documented in tools/torch_models.py
        names = set(n for n, _ in model.named_parameters())
        assert names == set(model.state_dict().keys()), name + ": buffers in the state_dict"
    for n, p in model.named_parameters():
        assert p.grad is not None, name + ": no gradient for " + n

    cs.i32("config", config_array(c, B, T, Tt))
    if c.type_vocab_size or c.emb_norm:
        cs.i32("bert", [c.type_vocab_size, int(c.emb_norm)])
    cs.f32("label_smoothing", torch.tensor(c.label_smoothing, dtype=torch.float64))
    cs.f32("ln_eps", torch.tensor(c.ln_eps, dtype=torch.float64))
    if c.norm:
        cs.i32("norm", [c.norm])
    if c.pos == tm.POS_ROPE:
        cs.i32("rope", [c.rope_dims])
        cs.f32("rope_base", torch.tensor(c.rope_base, dtype=torch.float64))
    if c.n_kv_heads:
        cs.i32("n_kv_heads", [c.n_kv_heads])
    if c.attn_window:
        cs.i32("window", [c.attn_window, c.attn_sinks])
    store_batch(cs, c, batch)
    store_params(cs, model)
    cs.f64("logits", logits)
    cs.f64("loss", loss.reshape(1))
    store_grads(cs, model)
    return cs


# ---------------------------------------------------------------------------------------------
# AdamW


def adamw_explicit(p0, grads, lr, b1, b2, eps, wd, clip, decayed):
    """Two steps of clipping + AdamW by hand, on dicts of float64 numpy arrays."""
    p = {k: v.astype(np.float64).copy() for k, v in p0.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    out = []
    for s, g in enumerate(grads, 1):
        norm = math.sqrt(sum(float((x ** 2).sum()) for x in g.values()))
        scale = min(1.0, clip / (norm + 1e-6))
        for k in p:
            gk = g[k] * scale
            if decayed[k]:
                p[k] *= 1 - lr * wd
            m[k] = b1 * m[k] + (1 - b1) * gk
            v2[k] = b2 * v2[k] + (1 - b2) * gk * gk
            mhat = m[k] / (1 - b1 ** s)
            vhat = v2[k] / (1 - b2 ** s)
            p[k] -= lr * mhat / (np.sqrt(vhat) + eps)
        out.append({k: x.copy() for k, x in p.items()})
    return out


def adamw_case(name):
    cs = Case(name)
    cfg = tm.Config(kind=tm.DECODER_LM, vocab_size=11, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                    max_len=6, max_batch=2, act=tm.ACT_RELU, norm_first=1, pos=tm.POS_LEARNED,
                    tie_output=0, ln_eps=LN_EPS)
    model = tm.build_model(cfg)
    model.train()
    c = model.cfg
    fill_params(cs, model)
    B, T = 2, 5
    batches = [make_batch(cs, c, B, T, ignore=[(1, 4)]), make_batch(cs, c, B, T, ignore=[(0, 3)])]
    # float32 hyperparameters, exactly what the C side uses. The clip norm is tiny on purpose: it
    # scales every gradient to a few times eps, where g / (sqrt(v) + eps) depends smoothly on g.
    # With O(1) gradients the first Adam steps are ~lr * sign(g), and a gradient that is zero in
    # exact arithmetic (the key bias of attention: softmax ignores a per-query constant) would take
    # a full step of lr in either direction from float32 rounding alone.
    lr, b1, b2, eps, wd, clip = f32(1e-2), f32(0.9), f32(0.98), f32(1e-8), f32(0.1), f32(3e-6)
    opt = tm.make_adamw(model, lr, (b1, b2), eps, wd)
    decayed = {n: tm.is_decayed(n) for n, _ in model.named_parameters()}
    p0 = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    store_params(cs, model)
    losses, norms, grads, afters = [], [], [], []
    for s, batch in enumerate(batches):
        opt.zero_grad(set_to_none=False)
        _, loss = tm.run_batch(model, batch)
        loss.backward()
        grads.append({n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()})
        norm = tm.clip_grad_norm(model, clip)
        assert norm > 10 * clip, "the clip norm must be active"
        opt.step()
        losses.append(float(loss))
        norms.append(norm)
        afters.append({n: p.detach().numpy().copy() for n, p in model.named_parameters()})

    # torch's optimizer against the update written out by hand
    ref = adamw_explicit(p0, grads, lr, b1, b2, eps, wd, clip, decayed)
    for s in range(2):
        for n in p0:
            assert np.allclose(ref[s][n], afters[s][n], rtol=0, atol=1e-13), "%s: AdamW != explicit" % n
    # conditioning: gradients off by 1e-6 of each tensor's largest entry (what float32 gives) move
    # the parameters after both steps by well under the tests' 1e-5 relative tolerance
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(20):
        pert = []
        for g in grads:
            pg = {}
            for n, x in g.items():
                noise = rng.uniform(-1e-6, 1e-6, x.shape) * np.abs(x).max()
                pg[n] = x + np.where(x != 0, noise, 0.0)
            pert.append(pg)
        out = adamw_explicit(p0, pert, lr, b1, b2, eps, wd, clip, decayed)
        for s in range(2):
            for n in p0:
                worst = max(worst, np.abs(out[s][n] - ref[s][n]).max() / np.abs(ref[s][n]).max())
    assert worst < 1e-6, "AdamW fixture ill-conditioned: %.3g" % worst
    print("  adamw: relative change of the result under 1e-6 gradient noise: %.2e" % worst)

    cs.i32("config", config_array(c, B, T, 0))
    cs.f32("label_smoothing", torch.tensor(c.label_smoothing, dtype=torch.float64))
    cs.f32("ln_eps", torch.tensor(c.ln_eps, dtype=torch.float64))
    cs.f32("optim", torch.tensor([lr, b1, b2, eps, wd, clip], dtype=torch.float64))
    store_batch(cs, c, batches[0])
    store_batch(cs, c, batches[1], "2")
    for n in p0:
        cs.f64("grad." + n, grads[0][n])
    for n in p0:
        cs.f64("grad2." + n, grads[1][n])
    for s in range(2):
        for n in p0:
            cs.f64("after%d.%s" % (s + 1, n), afters[s][n])
    cs.f64("loss", np.array(losses))
    cs.f64("grad_norm", np.array(norms))
    return cs


# ---------------------------------------------------------------------------------------------


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join("tests", "fixtures")
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)  # bit-for-bit the same files on every run
    R, G, GT = tm.ACT_RELU, tm.ACT_GELU, tm.ACT_GELU_TANH
    C = tm.Config
    cases = [
        block_case("blk_enc_post", B=2, T=6, C=12, H=2, d_ff=24, act=R, norm_first=0, lens=[6, 3]),
        block_case("blk_enc_pre", B=2, T=5, C=16, H=2, d_ff=32, act=G, norm_first=1),
        block_case("blk_lm_pre", B=2, T=7, C=8, H=2, d_ff=16, act=GT, norm_first=1, causal=True),
        block_case("blk_dec_post", B=2, T=5, C=12, H=2, d_ff=24, act=R, norm_first=0, cross=True,
                   Tk=5, xkv_lens=[5, 2]),
        block_case("blk_dec_pre", B=3, T=5, C=16, H=2, d_ff=32, act=G, norm_first=1, cross=True,
                   Tk=7, xkv_lens=[7, 4, 1]),
        model_case("model_cls_post_mean",
                   C(kind=tm.ENCODER_CLASSIFIER, vocab_size=11, n_classes=3, d_model=12, n_heads=2,
                     n_layers=2, d_ff=24, max_len=8, max_batch=4, act=R, norm_first=0,
                     pos=tm.POS_LEARNED, pool=tm.POOL_MEAN, ln_eps=LN_EPS),
                   B=3, T=6, lens=[6, 4, 1]),
        model_case("model_cls_pre_cls",
                   C(kind=tm.ENCODER_CLASSIFIER, vocab_size=13, n_classes=4, d_model=16, n_heads=2,
                     n_layers=2, d_ff=32, max_len=6, max_batch=3, act=G, norm_first=1,
                     pos=tm.POS_SINUSOIDAL, scale_emb=1, pool=tm.POOL_CLS, ln_eps=LN_EPS),
                   B=3, T=6, lens=[6, 3, 5], ignore=[(1, 0)]),
        model_case("model_lm_pre_tied",
                   C(kind=tm.DECODER_LM, vocab_size=13, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                     max_len=7, max_batch=2, act=GT, norm_first=1, pos=tm.POS_LEARNED,
                     tie_output=1, ln_eps=LN_EPS),
                   B=2, T=7, ignore=[(1, 4)]),
        model_case("model_lm_post_untied",
                   C(kind=tm.DECODER_LM, vocab_size=11, d_model=8, n_heads=2, n_layers=2, d_ff=16,
                     max_len=6, max_batch=3, act=R, norm_first=0, pos=tm.POS_LEARNED,
                     tie_output=0, ln_eps=LN_EPS),
                   B=3, T=5, ignore=[(2, 3)]),
        model_case("model_encdec_pre_shared",
                   C(kind=tm.ENCODER_DECODER, vocab_size=12, tgt_vocab_size=12, d_model=16,
                     n_heads=2, n_layers=2, n_dec_layers=1, d_ff=32, max_len=6, max_tgt_len=5,
                     max_batch=2, act=G, norm_first=1, pos=tm.POS_SINUSOIDAL, scale_emb=1,
                     tie_output=1, share_emb=1, label_smoothing=f32(0.1), ln_eps=LN_EPS),
                   B=2, T=6, Tt=5, lens=[6, 3], ignore=[(1, 3)]),
        model_case("model_encdec_post_separate",
                   C(kind=tm.ENCODER_DECODER, vocab_size=11, tgt_vocab_size=13, d_model=12,
                     n_heads=2, n_layers=2, n_dec_layers=2, d_ff=24, max_len=6, max_tgt_len=7,
                     max_batch=3, act=R, norm_first=0, pos=tm.POS_LEARNED, ln_eps=LN_EPS),
                   B=3, T=5, Tt=6, lens=[5, 2, 4], ignore=[(1, 4), (2, 5)]),
        model_case("model_vit_pre_cls",
                   C(kind=tm.ENCODER_CLASSIFIER, n_classes=4, d_model=16, n_heads=2, n_layers=2,
                     d_ff=32, max_len=6, max_batch=3, act=G, norm_first=1, pos=tm.POS_LEARNED,
                     pool=tm.POOL_CLS, input_dim=5, cls_token=1, ln_eps=LN_EPS),
                   B=3, T=6, lens=[6, 4, 2]),
        model_case("model_vit_post_mean",
                   C(kind=tm.ENCODER_CLASSIFIER, n_classes=3, d_model=12, n_heads=3, n_layers=1,
                     d_ff=24, max_len=5, max_batch=2, act=R, norm_first=0, pos=tm.POS_SINUSOIDAL,
                     pool=tm.POOL_MEAN, input_dim=7, ln_eps=LN_EPS),
                   B=2, T=5),
        model_case("model_lm_pre_rms",
                   C(kind=tm.DECODER_LM, vocab_size=13, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                     max_len=7, max_batch=2, act=G, norm_first=1, pos=tm.POS_LEARNED,
                     norm=tm.NORM_RMS, ln_eps=f32(1e-6)),
                   B=2, T=7, ignore=[(1, 5)]),
        model_case("model_lm_llama_norm_mlp",
                   C(kind=tm.DECODER_LM, vocab_size=13, d_model=16, n_heads=2, n_layers=2, d_ff=24,
                     max_len=7, max_batch=2, act=tm.ACT_SWIGLU, norm_first=1, pos=tm.POS_LEARNED,
                     norm=tm.NORM_RMS, ln_eps=f32(1e-6)),
                   B=2, T=7),
        model_case("model_encdec_post_swiglu",
                   C(kind=tm.ENCODER_DECODER, vocab_size=11, tgt_vocab_size=13, d_model=12,
                     n_heads=2, n_layers=1, n_dec_layers=1, d_ff=20, max_len=6, max_tgt_len=5,
                     max_batch=2, act=tm.ACT_SWIGLU, norm_first=0, pos=tm.POS_SINUSOIDAL,
                     ln_eps=LN_EPS),
                   B=2, T=6, Tt=5, lens=[6, 3]),
        model_case("model_encdec_post_rms",
                   C(kind=tm.ENCODER_DECODER, vocab_size=11, tgt_vocab_size=13, d_model=12,
                     n_heads=2, n_layers=1, n_dec_layers=2, d_ff=24, max_len=6, max_tgt_len=5,
                     max_batch=2, act=R, norm_first=0, pos=tm.POS_SINUSOIDAL, norm=tm.NORM_RMS,
                     ln_eps=LN_EPS),
                   B=2, T=6, Tt=5, lens=[6, 2]),
        # BERT's layout: token types, the embedding layernorm, exact GELU, post-LN, eps 1e-12 (the
        # classifier with a types tensor, the LM without: type 0 everywhere)
        model_case("model_bert_cls_post_mean",
                   C(kind=tm.ENCODER_CLASSIFIER, vocab_size=13, n_classes=3, d_model=12, n_heads=3,
                     n_layers=2, d_ff=24, max_len=7, max_batch=3, act=G, norm_first=0,
                     pos=tm.POS_LEARNED, pool=tm.POOL_MEAN, type_vocab_size=2, emb_norm=1,
                     ln_eps=float(np.float32(1e-12))),
                   B=3, T=6, lens=[6, 2, 4], types=True),
        model_case("model_bert_lm_pre",
                   C(kind=tm.DECODER_LM, vocab_size=11, d_model=8, n_heads=2, n_layers=2, d_ff=16,
                     max_len=6, max_batch=2, act=G, norm_first=1, pos=tm.POS_SINUSOIDAL,
                     type_vocab_size=3, emb_norm=1, ln_eps=LN_EPS),
                   B=2, T=5, ignore=[(0, 4)]),
        # rotary positions: LLaMA's block (RMSNorm, SwiGLU, every channel turned, base 10000) in an LM;
        # a post-LN LM turning 4 of 6 channels at base 100; an encoder-decoder (encoder and decoder
        # self-attention turn, padded source) and a classifier over padded rows
        model_case("model_lm_rope_llama",
                   C(kind=tm.DECODER_LM, vocab_size=13, d_model=16, n_heads=2, n_layers=2, d_ff=24,
                     max_len=9, max_batch=2, act=tm.ACT_SWIGLU, norm_first=1, pos=tm.POS_ROPE,
                     norm=tm.NORM_RMS, ln_eps=f32(1e-6)),
                   B=2, T=9, ignore=[(1, 6)]),
        # grouped-query attention in the LLaMA-style LM: 4 query heads over 2 key/value heads, and
        # multi-query (1 key/value head) with half the channels turned
        model_case("model_lm_gqa_llama",
                   C(kind=tm.DECODER_LM, vocab_size=13, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2,
                     d_ff=24, max_len=9, max_batch=2, act=tm.ACT_SWIGLU, norm_first=1, pos=tm.POS_ROPE,
                     norm=tm.NORM_RMS, ln_eps=f32(1e-6)),
                   B=2, T=9, ignore=[(1, 6)]),
        model_case("model_lm_mqa_llama",
                   C(kind=tm.DECODER_LM, vocab_size=11, d_model=12, n_heads=3, n_kv_heads=1, n_layers=2,
                     d_ff=20, max_len=8, max_batch=3, act=tm.ACT_SWIGLU, norm_first=1, pos=tm.POS_ROPE,
                     rope_dims=2, norm=tm.NORM_RMS, ln_eps=f32(1e-6)),
                   B=3, T=8),
        model_case("model_lm_rope_partial",
                   C(kind=tm.DECODER_LM, vocab_size=11, d_model=12, n_heads=2, n_layers=2, d_ff=24,
                     max_len=8, max_batch=3, act=G, norm_first=0, pos=tm.POS_ROPE, rope_dims=4,
                     rope_base=100.0, ln_eps=LN_EPS),
                   B=3, T=8),
        # grouped-query attention in an encoder-decoder: 4 query heads over 2 key/value heads in the encoder's
        # and the decoder's self-attention and in the cross-attention over a padded source
        model_case("model_encdec_gqa",
                   C(kind=tm.ENCODER_DECODER, vocab_size=11, tgt_vocab_size=13, d_model=16,
                     n_heads=4, n_kv_heads=2, n_layers=1, n_dec_layers=2, d_ff=32, max_len=7, max_tgt_len=6,
                     max_batch=2, act=G, norm_first=1, pos=tm.POS_LEARNED, ln_eps=LN_EPS),
                   B=2, T=7, Tt=6, lens=[7, 3]),
        model_case("model_encdec_rope",
                   C(kind=tm.ENCODER_DECODER, vocab_size=11, tgt_vocab_size=13, d_model=16,
                     n_heads=2, n_layers=1, n_dec_layers=2, d_ff=32, max_len=7, max_tgt_len=6,
                     max_batch=2, act=R, norm_first=1, pos=tm.POS_ROPE, rope_base=500.0,
                     ln_eps=LN_EPS),
                   B=2, T=7, Tt=6, lens=[7, 3]),
        model_case("model_cls_rope",
                   C(kind=tm.ENCODER_CLASSIFIER, vocab_size=11, n_classes=3, d_model=12, n_heads=3,
                     n_layers=2, d_ff=24, max_len=6, max_batch=3, act=G, norm_first=1,
                     pos=tm.POS_ROPE, rope_dims=2, pool=tm.POOL_MEAN, ln_eps=LN_EPS),
                   B=3, T=6, lens=[6, 2, 5]),
        # a sliding window: LLaMA's block over rotary positions, a window of 3 with 1 sink over 10
        # positions (so queries lose keys between the sink and the window); an encoder-decoder whose
        # decoder self-attention has a window of 2 without sinks, learned positions
        model_case("model_lm_window_llama",
                   C(kind=tm.DECODER_LM, vocab_size=13, d_model=16, n_heads=2, n_layers=2, d_ff=24,
                     max_len=10, max_batch=2, act=tm.ACT_SWIGLU, norm_first=1, pos=tm.POS_ROPE,
                     norm=tm.NORM_RMS, ln_eps=f32(1e-6), attn_window=3, attn_sinks=1),
                   B=2, T=10, ignore=[(1, 7)]),
        model_case("model_encdec_window",
                   C(kind=tm.ENCODER_DECODER, vocab_size=11, tgt_vocab_size=13, d_model=12,
                     n_heads=2, n_layers=1, n_dec_layers=2, d_ff=24, max_len=6, max_tgt_len=7,
                     max_batch=2, act=R, norm_first=0, pos=tm.POS_LEARNED, ln_eps=LN_EPS,
                     attn_window=2),
                   B=2, T=6, Tt=7, lens=[6, 4]),
        adamw_case("adamw_step"),
    ]
    total = sum(c.save(outdir) for c in cases)
    print("%d files, %d bytes in %s" % (len(cases), total, outdir))


if __name__ == "__main__":
    main()
