#!/usr/bin/env python3
"""PyTorch reference models that mirror transformer.h layer by layer and parameter by parameter.

Importable (tools/gen_model_fixtures.py builds the model fixtures from it; checkpoint round trips
load and save through the same modules). Needs torch (tested with 1.13) and numpy.

What mirrors what
-----------------
  tfm_block (cross == 0)  torch.nn.TransformerEncoderLayer(batch_first=True); causal == 1 adds a
                          causal attention mask (a decoder-only LM layer); `lens` becomes
                          src_key_padding_mask (True where j >= lens[b]).
  tfm_block (cross == 1)  torch.nn.TransformerDecoderLayer(batch_first=True): causal self-attention
                          (tgt_mask), cross-attention over `memory` with memory_key_padding_mask from
                          the key lengths xkv_lens.
  TFM_MODEL_ENCODER_CLASSIFIER  EncoderClassifier
  TFM_MODEL_DECODER_LM          DecoderLM
  TFM_MODEL_ENCODER_DECODER     EncoderDecoder
  tfm_model_step          clip_grad_norm() then torch.optim.AdamW with the param groups of
                          param_groups() (make_adamw()).

Activations: 0 relu, 1 exact (erf) GELU, 2 GELU with the tanh approximation. norm_first selects
pre-LN; post-LN is torch's default. pos POS_ROPE (rotary positions, no table) replaces every layer's
self_attn by RopeSelfAttention: nn.MultiheadAttention's parameters and math with Hugging Face LLaMA's
rotate_half rotation of the projected queries and keys (cross-attention is left as it is). Dropout is a constructor argument (0 for reference values).

Parameter names (exactly the state_dict keys):
  classifier  tok_emb.weight (V,C); pos_emb.weight (max_len,C) with learned positions;
              encoder.layers.N.<TransformerEncoderLayer names>; encoder.norm.weight/bias (pre-LN
              only); head.weight (n_classes,C), head.bias (n_classes)
  LM          tok_emb.weight; pos_emb.weight (learned); decoder.layers.N.<encoder-layer names>;
              decoder.norm.* (pre-LN only); head.weight (V,C), no bias, absent when tie_output
              (the output projection is then tok_emb.weight)
  enc-dec     src_tok_emb.weight (Vs,C); tgt_tok_emb.weight (Vt,C), absent when share_emb (the
              decoder then embeds with src_tok_emb); src_pos_emb.weight (max_len,C) and
              tgt_pos_emb.weight (max_tgt_len,C) (learned); encoder.layers.N.*; encoder.norm.*
              (pre-LN only); decoder.layers.N.<TransformerDecoderLayer names>; decoder.norm.*
              (pre-LN only); head.weight (Vt,C), no bias, absent when tie_output (the output
              projection is then the target embedding: tgt_tok_emb, or src_tok_emb when shared)
  classifier and LM, BERT's layout: type_emb.weight (type_vocab_size,C) with type_vocab_size;
              emb_norm.weight/bias (C) with emb_norm
Sinusoidal position tables are non-persistent buffers: they are not in the state_dict.

Embedding input: x[b,t] = emb[tokens[b,t]] * (sqrt(C) if scale_emb else 1) + pos[t], where the
sinusoidal table is pe[t,2i] = sin(t / 10000^(2i/C)), pe[t,2i+1] = cos(t / 10000^(2i/C));
then + type_emb[types[b,t]] (type 0 without types) with type_vocab_size, and LayerNorm(eps ln_eps)
of the sum with emb_norm, before the dropout.
"""

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# enums of transformer.h, same values
ACT_RELU, ACT_GELU, ACT_GELU_TANH, ACT_SWIGLU = 0, 1, 2, 3
ENCODER_CLASSIFIER, DECODER_LM, ENCODER_DECODER = 1, 2, 3
POS_LEARNED, POS_SINUSOIDAL, POS_NONE, POS_ROPE = 0, 1, 2, 3
NORM_LAYER, NORM_RMS = 0, 1
POOL_MEAN, POOL_CLS = 0, 1

# parameters that AdamW decays (unless decay_all): the weight matrices of linear and attention maps
DECAY_SUFFIXES = ("in_proj_weight", "out_proj.weight", "linear1.weight", "linear2.weight",
                  "head.weight", "input_proj.weight")


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def swiglu(h):
    """SwiGLU over linear1's stacked outputs: silu(gate) * up, gate the first half of the last dim."""
    g, u = h.chunk(2, dim=-1)
    return F.silu(g) * u


def activation_fn(act):
    if act == ACT_RELU:
        return F.relu
    if act == ACT_GELU:
        return F.gelu
    if act == ACT_GELU_TANH:
        return gelu_tanh
    if act == ACT_SWIGLU:
        return swiglu
    raise ValueError("unknown activation %r" % (act,))


def causal_mask(T):
    """(T,T) bool, True above the diagonal: query i may not see key j > i."""
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)


def window_mask(T, window, sinks):
    """(T,T) bool, True where query i may not see key j: j > i, or j <= i - window unless j < sinks (a
    sliding window with attention sinks); plain causal_mask when window is 0."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    hidden = j > i
    if window:
        hidden |= (j <= i - window) & (j >= sinks)
    return hidden


def padding_mask(lens, T):
    """(B,T) bool, True where position j >= lens[b] (a padded key); None when lens is None."""
    if lens is None:
        return None
    lens = torch.as_tensor(np.asarray(lens, dtype=np.int64))
    return torch.arange(T)[None, :] >= lens[:, None]


def sinusoidal_table(P, C, dtype=torch.float64):
    """pe (P,C): pe[t,2i] = sin(t / 10000^(2i/C)), pe[t,2i+1] = cos(same)."""
    pe = torch.zeros(P, C, dtype=torch.float64)
    t = torch.arange(P, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, C, 2, dtype=torch.float64)[None, :]
    ang = t / torch.pow(torch.tensor(10000.0, dtype=torch.float64), two_i / C)
    pe[:, 0::2] = torch.sin(ang)
    pe[:, 1::2] = torch.cos(ang[:, : C // 2])
    return pe.to(dtype)


class RMSNorm(nn.Module):
    """RMSNorm as LLaMA's (torch 1.13 has none): x / sqrt(mean(x^2) + eps) * weight; no bias."""

    def __init__(self, d, eps, dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d, dtype=dtype))

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_cos_sin(T, rot, base, dtype, offset=0):
    """cos and sin (T,rot) of positions offset.. as Hugging Face's LLaMA forms them: inv_freq =
    base^(-arange(0, rot, 2) / rot), emb = cat(freqs, freqs)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = (torch.arange(T, dtype=torch.float64) + offset)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, rot, base):
    """x (B,H,T,D): its first rot channels turned by position (apply_rotary_pos_emb), the rest as they are."""
    cos, sin = rope_cos_sin(x.shape[2], rot, base, x.dtype)
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat([xr * cos + rotate_half(xr) * sin, xp], dim=-1)


def repeat_kv(x, n_rep):
    """Hugging Face LLaMA's repeat_kv: (B,Hkv,T,D) -> (B,Hkv*n_rep,T,D), each key/value head repeated for
    the n_rep consecutive query heads of its group."""
    B, Hkv, T, D = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, Hkv, n_rep, T, D).reshape(B, Hkv * n_rep, T, D)


class RopeSelfAttention(nn.Module):
    """Self-attention with nn.MultiheadAttention's parameters (in_proj_weight (3C,C) q|k|v rows,
    in_proj_bias, out_proj) and rotary positions on the projected queries and keys (rot 0: none); called
    as the layers call self_attn (query = key = value, bool attn_mask and key_padding_mask, True = hidden),
    or as they call multihead_attn (cross-attention: the queries from query, the keys and values from key
    and value, the encoder's output; rot 0 there). n_kv_heads < n_heads is grouped-query attention as
    LLaMA's: in_proj_weight is (C + 2 Ckv, C), Ckv = n_kv_heads * head size (q rows, k rows, v rows), and
    the key/value heads are repeated with repeat_kv.
    _qkv_same_embed_dim False keeps torch's encoder layer off its fused inference path."""

    def __init__(self, d_model, n_heads, rot, base, dropout, dtype, n_kv_heads=0):
        super().__init__()
        self.embed_dim, self.num_heads, self.rot, self.base, self.dropout = d_model, n_heads, rot, base, dropout
        self.n_kv_heads = n_kv_heads or n_heads
        kv_dim = d_model // n_heads * self.n_kv_heads
        self.batch_first, self._qkv_same_embed_dim = True, False
        self.in_proj_weight = nn.Parameter(torch.empty(d_model + 2 * kv_dim, d_model, dtype=dtype))
        self.in_proj_bias = nn.Parameter(torch.zeros(d_model + 2 * kv_dim, dtype=dtype))
        self.out_proj = nn.Linear(d_model, d_model, dtype=dtype)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None, need_weights=False, **kw):
        B, T, C = query.shape
        S, H, Hkv = key.shape[1], self.num_heads, self.n_kv_heads
        D = C // H
        if key is query and value is query:
            q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).split([C, Hkv * D, Hkv * D], dim=-1)
        else:  # cross-attention
            W, bW = self.in_proj_weight.split([C, Hkv * D, Hkv * D]), self.in_proj_bias.split([C, Hkv * D, Hkv * D])
            q, k, v = F.linear(query, W[0], bW[0]), F.linear(key, W[1], bW[1]), F.linear(value, W[2], bW[2])
        q = q.reshape(B, T, H, D).transpose(1, 2)
        k, v = (z.reshape(B, S, Hkv, D).transpose(1, 2) for z in (k, v))
        if self.rot:
            q, k = apply_rope(q, self.rot, self.base), apply_rope(k, self.rot, self.base)
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
        s = q @ k.transpose(-1, -2) / math.sqrt(C // H)
        if attn_mask is not None:
            s = s.masked_fill(attn_mask, float("-inf"))
        if key_padding_mask is not None:
            s = s.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        p = F.dropout(torch.softmax(s, dim=-1), self.dropout, self.training)
        o = (p @ v).transpose(1, 2).reshape(B, T, C)
        return self.out_proj(o), None


def make_norm(norm, d_model, eps, dtype):
    return RMSNorm(d_model, eps, dtype) if norm == NORM_RMS else nn.LayerNorm(d_model, eps=eps, dtype=dtype)


def make_layer(d_model, n_heads, d_ff=0, act=ACT_RELU, norm_first=False, cross=False, ln_eps=1e-5,
               dropout=0.0, dtype=torch.float64, norm=NORM_LAYER, rope_dims=0, rope_base=10000.0, n_kv_heads=0):
    """The torch layer a tfm_block with these settings mirrors (d_ff 0 -> 4 * d_model; ACT_SWIGLU: linear1
    is (2 d_ff, d_model), gate rows then up rows, and linear2 reads silu(gate) * up); norm NORM_RMS
    puts an RMSNorm at each of its norms (training mode only: torch's inference fast path assumes
    LayerNorm); rope_dims > 0 makes self_attn a RopeSelfAttention turning that many channels per head, and
    n_kv_heads (0: n_heads) one with that many key/value heads (and, in a decoder layer, a cross-attention
    multihead_attn with that many key/value heads, no rotation)."""
    d_ff = d_ff or 4 * d_model
    cls = nn.TransformerDecoderLayer if cross else nn.TransformerEncoderLayer
    layer = cls(d_model, n_heads, dim_feedforward=d_ff, dropout=dropout, activation=activation_fn(act),
                layer_norm_eps=ln_eps, batch_first=True, norm_first=bool(norm_first), dtype=dtype)
    if norm == NORM_RMS:
        for n in ("norm1", "norm2", "norm3") if cross else ("norm1", "norm2"):
            setattr(layer, n, RMSNorm(d_model, ln_eps, dtype))
    if act == ACT_SWIGLU:  # linear1 makes gate and up: (2 d_ff, d_model)
        layer.linear1 = nn.Linear(d_model, 2 * d_ff, dtype=dtype)
    if n_kv_heads and cross:
        layer.multihead_attn = RopeSelfAttention(d_model, n_heads, 0, rope_base, dropout, dtype, n_kv_heads)
    if rope_dims or n_kv_heads:
        layer.self_attn = RopeSelfAttention(d_model, n_heads, rope_dims, rope_base, dropout, dtype, n_kv_heads)
    return layer


def block_forward(layer, x, xkv=None, lens=None, xkv_lens=None, causal=False, window=0, sinks=0):
    """tfm_block_forward: x (B,T,C); cross layers attend over xkv (B,Tk,C) with key lengths xkv_lens
    and are always causal; lens masks the self-attention's keys; window > 0 (causal only) makes the
    self-attention a sliding window with `sinks` attention sinks (window_mask)."""
    T = x.shape[1]
    if isinstance(layer, nn.TransformerDecoderLayer):
        return layer(x, xkv, tgt_mask=window_mask(T, window, sinks), tgt_key_padding_mask=padding_mask(lens, T),
                     memory_key_padding_mask=padding_mask(xkv_lens, xkv.shape[1]))
    assert xkv is None, "an encoder layer has no second input"
    assert causal or not window, "a sliding window is causal"
    return layer(x, src_mask=window_mask(T, window, sinks) if causal else None,
                 src_key_padding_mask=padding_mask(lens, T))


class Stack(nn.Module):
    """`layers` (a ModuleList) and, for pre-LN, a final layernorm `norm` (post-LN has none). Not
    torch.nn.TransformerEncoder: this keeps the exact state_dict names and never takes torch's
    inference fast path (nested tensors)."""

    def __init__(self, n, cfg, cross, causal, dtype):
        super().__init__()
        self.cross, self.causal = cross, causal
        self.window, self.sinks = (cfg.attn_window, cfg.attn_sinks) if causal else (0, 0)
        rope = cfg.rope_dims if cfg.pos == POS_ROPE else 0
        self.layers = nn.ModuleList([
            make_layer(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.act, cfg.norm_first, cross, cfg.ln_eps,
                       cfg.dropout, dtype, cfg.norm, rope, cfg.rope_base, cfg.n_kv_heads) for _ in range(n)])
        if cfg.norm_first:
            self.norm = make_norm(cfg.norm, cfg.d_model, cfg.ln_eps, dtype)
        else:
            self.norm = None

    def forward(self, x, memory=None, lens=None, memory_lens=None):
        for layer in self.layers:
            if self.cross:
                x = block_forward(layer, x, memory, None, memory_lens, window=self.window, sinks=self.sinks)
            else:
                x = block_forward(layer, x, None, lens, None, self.causal, self.window, self.sinks)
        if self.norm is not None:
            x = self.norm(x)
        return x


class Config:
    """The fields of tfm_config (same names and meanings; zero means default)."""

    FIELDS = dict(kind=0, vocab_size=0, tgt_vocab_size=0, n_classes=0, d_model=0, n_heads=0,
                  n_layers=0, n_dec_layers=0, d_ff=0, max_len=0, max_tgt_len=0, max_batch=0,
                  act=0, norm_first=0, pos=0, scale_emb=0, pool=0, tie_output=0, share_emb=0,
                  no_bias=0, dropout=0.0, attn_dropout=0.0, ln_eps=0.0, label_smoothing=0.0,
                  ignore_index=0, has_ignore_index=0, input_dim=0, cls_token=0, type_vocab_size=0,
                  emb_norm=0, norm=0, rope_dims=0, rope_base=0.0, n_kv_heads=0, attn_window=0, attn_sinks=0)

    def __init__(self, **kw):
        for k, v in self.FIELDS.items():
            setattr(self, k, v)
        for k, v in kw.items():
            if k not in self.FIELDS:
                raise TypeError("unknown config field %r" % (k,))
            setattr(self, k, v)

    def resolved(self):
        """A copy with transformer.h's defaults applied (tfm_config_resolve)."""
        c = Config(**{k: getattr(self, k) for k in self.FIELDS})
        if c.kind not in (ENCODER_CLASSIFIER, DECODER_LM, ENCODER_DECODER):
            raise ValueError("kind is required")
        for req in ("vocab_size", "d_model", "n_heads", "max_len"):
            if getattr(c, req) <= 0 and not (req == "vocab_size" and c.input_dim and c.kind == ENCODER_CLASSIFIER):
                raise ValueError(req + " is required")
        if (c.type_vocab_size or c.emb_norm) and c.kind == ENCODER_DECODER:
            raise ValueError("token types and the embedding norm are for classifiers and LMs")
        if c.type_vocab_size and (c.input_dim or c.cls_token):
            raise ValueError("token types need token ids and no class vector")
        if (c.input_dim or c.cls_token) and c.kind != ENCODER_CLASSIFIER:
            raise NotImplementedError("continuous inputs and the class vector are mirrored for classifiers")
        if c.kind == ENCODER_CLASSIFIER and c.n_classes <= 0:
            raise ValueError("n_classes is required")
        if c.d_model % c.n_heads:
            raise ValueError("n_heads must divide d_model")
        if c.no_bias:
            raise NotImplementedError("no_bias is not mirrored here")
        if c.attn_dropout != c.dropout:
            raise NotImplementedError("torch layers have one dropout for attention and residuals")
        c.tgt_vocab_size = c.tgt_vocab_size or c.vocab_size
        c.n_layers = c.n_layers or 2
        c.n_dec_layers = c.n_dec_layers or c.n_layers
        c.d_ff = c.d_ff or 4 * c.d_model
        c.max_tgt_len = c.max_tgt_len or c.max_len
        c.max_batch = c.max_batch or 1
        c.ln_eps = c.ln_eps or 1e-5
        if c.pos == POS_ROPE:
            c.rope_dims = c.rope_dims or c.d_model // c.n_heads
            c.rope_base = c.rope_base or 10000.0
        elif c.rope_dims or c.rope_base:
            raise ValueError("rope_dims and rope_base are for pos POS_ROPE")
        if c.n_kv_heads < 0 or (c.n_kv_heads and c.n_heads % c.n_kv_heads):
            raise ValueError("n_kv_heads must divide n_heads")
        if c.n_kv_heads == c.n_heads:
            c.n_kv_heads = 0
        if c.attn_window < 0 or c.attn_sinks < 0 or (c.attn_sinks and not c.attn_window):
            raise ValueError("attn_window and attn_sinks must be >= 0, sinks only with a window")
        if c.attn_window and c.kind == ENCODER_CLASSIFIER:
            raise ValueError("a sliding window is for causal self-attention")
        if not c.has_ignore_index and c.ignore_index == 0:
            c.ignore_index = -100
        if c.share_emb and c.kind == ENCODER_DECODER and c.tgt_vocab_size != c.vocab_size:
            raise ValueError("share_emb needs equal vocabularies")
        return c


class _Model(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        self.cfg = cfg.resolved()
        self.dtype = dtype

    def _emb(self, n, c):
        return nn.Embedding(n, c, dtype=self.dtype)

    def _sinusoidal(self, name, P):
        if self.cfg.pos == POS_SINUSOIDAL:
            self.register_buffer(name, sinusoidal_table(P, self.cfg.d_model, self.dtype),
                                 persistent=False)

    def embed(self, tokens, emb, pos_emb, pe, types=None):
        """emb[tokens] * scale + positions (and types); tokens (B,T) int64."""
        c = self.cfg
        x = F.embedding(tokens, emb)
        if c.scale_emb:
            x = x * math.sqrt(c.d_model)
        return self.position(x, pos_emb, pe, types)

    def _bert_parts(self):
        """BERT's token-type table and embedding layernorm, when the config asks for them."""
        c = self.cfg
        if c.type_vocab_size:
            self.type_emb = self._emb(c.type_vocab_size, c.d_model)
        if c.emb_norm:
            self.emb_norm = make_norm(c.norm, c.d_model, c.ln_eps, self.dtype)

    def position(self, x, pos_emb, pe, types=None):
        """x (B,T,C) + positions (+ the rows of token types (B,T), None: type 0; the embedding
        layernorm), then dropout."""
        c = self.cfg
        B, T = x.shape[0], x.shape[1]
        if c.pos == POS_LEARNED:
            x = x + pos_emb[:T]
        elif c.pos == POS_SINUSOIDAL:
            x = x + pe[:T]
        if c.type_vocab_size:
            t = torch.zeros((B, T), dtype=torch.int64) if types is None else \
                torch.as_tensor(np.asarray(types, dtype=np.int64))
            x = x + F.embedding(t, self.type_emb.weight)
        if c.emb_norm:
            x = self.emb_norm(x)
        return F.dropout(x, c.dropout, self.training)

    def loss(self, logits, targets):
        c = self.cfg
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=c.ignore_index, label_smoothing=c.label_smoothing)


class EncoderClassifier(_Model):
    """TFM_MODEL_ENCODER_CLASSIFIER: embeddings (or input_proj of continuous inputs), the class vector
    cls_token first (cls_token: ViT's [CLS], lens then count one more position), encoder (key padding
    from lens), pooling, linear head."""

    def __init__(self, cfg, dtype=torch.float64):
        super().__init__(cfg, dtype)
        c = self.cfg
        Te = c.max_len + c.cls_token
        if c.input_dim:
            self.input_proj = nn.Linear(c.input_dim, c.d_model, dtype=dtype)
        else:
            self.tok_emb = self._emb(c.vocab_size, c.d_model)
        if c.cls_token:
            self.cls_token = nn.Parameter(torch.zeros(c.d_model, dtype=dtype))
        if c.pos == POS_LEARNED:
            self.pos_emb = self._emb(Te, c.d_model)
        self._sinusoidal("pe", Te)
        self._bert_parts()
        self.encoder = Stack(c.n_layers, c, cross=False, causal=False, dtype=dtype)
        self.head = nn.Linear(c.d_model, c.n_classes, dtype=dtype)

    def forward(self, tokens, lens=None, labels=None, inputs=None, types=None):
        c = self.cfg
        pos = self.pos_emb.weight if c.pos == POS_LEARNED else None
        if c.input_dim:
            x = self.input_proj(torch.as_tensor(np.asarray(inputs), dtype=self.dtype))
        else:
            x = F.embedding(torch.as_tensor(np.asarray(tokens, dtype=np.int64)), self.tok_emb.weight)
            if c.scale_emb:
                x = x * math.sqrt(c.d_model)
        if c.cls_token:
            x = torch.cat([self.cls_token.expand(x.shape[0], 1, c.d_model), x], dim=1)
            if lens is not None:
                lens = [int(n) + 1 for n in lens]
        x = self.position(x, pos, getattr(self, "pe", None), types)
        B, T = x.shape[0], x.shape[1]
        h = self.encoder(x, lens=lens)
        if c.pool == POOL_CLS:
            pooled = h[:, 0]
        else:
            n = torch.full((B,), T, dtype=torch.int64) if lens is None else \
                torch.as_tensor(np.asarray(lens, dtype=np.int64))
            valid = (torch.arange(T)[None, :] < n[:, None]).to(h.dtype)
            pooled = (h * valid[:, :, None]).sum(1) / n.clamp(min=1).to(h.dtype)[:, None]
        logits = self.head(pooled)
        loss = None
        if labels is not None:
            loss = self.loss(logits, torch.as_tensor(np.asarray(labels, dtype=np.int64)))
        return logits, loss


class DecoderLM(_Model):
    """TFM_MODEL_DECODER_LM: embeddings, causal encoder-style layers (no key padding), output projection
    without bias (the token embedding when tie_output)."""

    def __init__(self, cfg, dtype=torch.float64):
        super().__init__(cfg, dtype)
        c = self.cfg
        self.tok_emb = self._emb(c.vocab_size, c.d_model)
        if c.pos == POS_LEARNED:
            self.pos_emb = self._emb(c.max_len, c.d_model)
        self._sinusoidal("pe", c.max_len)
        self._bert_parts()
        self.decoder = Stack(c.n_layers, c, cross=False, causal=True, dtype=dtype)
        if not c.tie_output:
            self.head = nn.Linear(c.d_model, c.vocab_size, bias=False, dtype=dtype)

    def output_weight(self):
        return self.tok_emb.weight if self.cfg.tie_output else self.head.weight

    def forward(self, tokens, targets=None, types=None):
        c = self.cfg
        tokens = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        x = self.embed(tokens, self.tok_emb.weight,
                       self.pos_emb.weight if c.pos == POS_LEARNED else None, getattr(self, "pe", None), types)
        h = self.decoder(x)
        logits = F.linear(h, self.output_weight())
        loss = None
        if targets is not None:
            loss = self.loss(logits, torch.as_tensor(np.asarray(targets, dtype=np.int64)))
        return logits, loss


class EncoderDecoder(_Model):
    """TFM_MODEL_ENCODER_DECODER: encoder over the source (key padding from lens), decoder over the
    shifted target (causal; cross-attention masked by the source lens), output projection without
    bias (the target embedding when tie_output)."""

    def __init__(self, cfg, dtype=torch.float64):
        super().__init__(cfg, dtype)
        c = self.cfg
        self.src_tok_emb = self._emb(c.vocab_size, c.d_model)
        if not c.share_emb:
            self.tgt_tok_emb = self._emb(c.tgt_vocab_size, c.d_model)
        if c.pos == POS_LEARNED:
            self.src_pos_emb = self._emb(c.max_len, c.d_model)
            self.tgt_pos_emb = self._emb(c.max_tgt_len, c.d_model)
        self._sinusoidal("pe", max(c.max_len, c.max_tgt_len))
        self.encoder = Stack(c.n_layers, c, cross=False, causal=False, dtype=dtype)
        self.decoder = Stack(c.n_dec_layers, c, cross=True, causal=True, dtype=dtype)
        if not c.tie_output:
            self.head = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False, dtype=dtype)

    def target_embedding(self):
        return self.src_tok_emb.weight if self.cfg.share_emb else self.tgt_tok_emb.weight

    def output_weight(self):
        return self.target_embedding() if self.cfg.tie_output else self.head.weight

    def forward(self, tokens, lens, tgt_in, targets=None):
        c = self.cfg
        learned = c.pos == POS_LEARNED
        pe = getattr(self, "pe", None)
        tokens = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        tgt_in = torch.as_tensor(np.asarray(tgt_in, dtype=np.int64))
        xs = self.embed(tokens, self.src_tok_emb.weight, self.src_pos_emb.weight if learned else None, pe)
        memory = self.encoder(xs, lens=lens)
        xt = self.embed(tgt_in, self.target_embedding(), self.tgt_pos_emb.weight if learned else None, pe)
        h = self.decoder(xt, memory=memory, memory_lens=lens)
        logits = F.linear(h, self.output_weight())
        loss = None
        if targets is not None:
            loss = self.loss(logits, torch.as_tensor(np.asarray(targets, dtype=np.int64)))
        return logits, loss


def build_model(cfg, dtype=torch.float64):
    """The reference module for a Config (kind selects the class)."""
    kind = cfg.kind
    if kind == ENCODER_CLASSIFIER:
        return EncoderClassifier(cfg, dtype)
    if kind == DECODER_LM:
        return DecoderLM(cfg, dtype)
    if kind == ENCODER_DECODER:
        return EncoderDecoder(cfg, dtype)
    raise ValueError("unknown model kind %r" % (kind,))


def run_batch(model, batch):
    """Forward a batch given as a dict with the fields of tfm_batch (tokens, lens, tgt_in, targets,
    types for token_types; numpy or lists). Returns (logits, loss); loss is None without targets."""
    if isinstance(model, EncoderClassifier):
        return model(batch.get("tokens"), batch.get("lens"), batch.get("targets"), batch.get("inputs"),
                     batch.get("types"))
    if isinstance(model, DecoderLM):
        return model(batch["tokens"], batch.get("targets"), batch.get("types"))
    return model(batch["tokens"], batch.get("lens"), batch["tgt_in"], batch.get("targets"))


# ---- optimizer: what tfm_model_step does ----


def is_decayed(name):
    """Whether AdamW decays a parameter (decay_all == 0): linear and attention weight matrices;
    not biases, layernorms or embeddings (a tied output projection is an embedding)."""
    return name.endswith(DECAY_SUFFIXES)


def param_groups(model, weight_decay, decay_all=False):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if decay_all or is_decayed(name) else no_decay).append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


def make_adamw(model, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decay_all=False):
    return torch.optim.AdamW(param_groups(model, weight_decay, decay_all), lr=lr, betas=betas,
                             eps=eps)


def clip_grad_norm(model, clip_norm):
    """Global L2 norm of every gradient (returned, before clipping); when clip_norm > 0, every
    gradient is scaled by clip_norm / (norm + 1e-6) if that is below 1 (clip_grad_norm_)."""
    params = [p for p in model.parameters() if p.grad is not None]
    if clip_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, clip_norm))
    return float(torch.norm(torch.stack([torch.norm(p.grad.detach(), 2) for p in params]), 2))


# ---- state_dict helpers (checkpoint round trips) ----


def named_params(model):
    """{name: float32 numpy array} of every parameter, in state_dict order."""
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}


def load_named_params(model, arrays, strict=True):
    """Copy {name: array} into the model's parameters. strict: the names must be exactly the
    model's parameter names."""
    own = dict(model.named_parameters())
    if strict and set(own) != set(arrays):
        raise KeyError("parameter names differ: missing %s, unexpected %s" %
                       (sorted(set(own) - set(arrays)), sorted(set(arrays) - set(own))))
    with torch.no_grad():
        for k, v in arrays.items():
            if k not in own:
                continue
            t = torch.as_tensor(np.asarray(v))
            if tuple(t.shape) != tuple(own[k].shape):
                raise ValueError("%s: shape %s, model has %s" % (k, tuple(t.shape), tuple(own[k].shape)))
            own[k].copy_(t.to(own[k].dtype))
