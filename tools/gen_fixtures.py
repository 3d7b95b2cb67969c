#!/usr/bin/env python3
"""Generate the PyTorch reference fixtures that tests/test_torch.c checks transformer.h against.

Usage (from the repository root; needs torch, tested with 1.13):

    python3 tools/gen_fixtures.py [output_dir]        # default output_dir: tests/fixtures

Every case is deterministic (each has its own fixed seed), so running the script again rewrites
identical files. Inputs and parameters are drawn as float32 and stored as f32: they are exactly the
values the C code computes with. References are computed by torch in float64 from those values
(upcast) and stored as f64. Each case has an upstream gradient dy (random) and stores every gradient
of loss = sum(y * dy) with respect to every input and every parameter.

File format (.tfx, little-endian throughout; documented also at the top of tests/fixture.h):

    magic   4 bytes  "TFX1"
    count   u32      number of arrays
    then `count` arrays, each:
      name_len  u32           bytes in the name (1..255), no terminating NUL
      name      name_len bytes ASCII, unique within the file
      dtype     u32           0 = f32, 1 = f64, 2 = i32
      ndim      u32           0..8 (0 is a scalar holding one element)
      dims      ndim x i64    each >= 0
      data      prod(dims) elements of dtype, row-major, no padding

Names: inputs and parameters use torch's names ("x", "in_proj_weight", "out_proj.weight");
forward references are "y" (and "att", "mean", ...); gradients are "grad.<name>" ("grad.x",
"grad.in_proj_weight"). Options are i32/f32 scalars ("n_heads", "causal", "scale", ...).
"""

import math
import os
import struct
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F

MAGIC = b"TFX1"
DT_F32, DT_F64, DT_I32 = 0, 1, 2


# ---------------------------------------------------------------------------------------------
# writer


def write_tfx(path, arrays):
    """arrays: list of (name, numpy array) with dtype float32, float64 or int32."""
    names = [n for n, _ in arrays]
    assert len(names) == len(set(names)), "duplicate array names in " + path
    out = bytearray(MAGIC)
    out += struct.pack("<I", len(arrays))
    for name, a in arrays:
        a = np.asarray(a)
        if a.dtype == np.float32:
            dt = DT_F32
        elif a.dtype == np.float64:
            dt = DT_F64
        elif a.dtype == np.int32:
            dt = DT_I32
        else:
            raise TypeError("%s: unsupported dtype %s" % (name, a.dtype))
        nb = name.encode("ascii")
        assert 0 < len(nb) < 256 and a.ndim <= 8
        out += struct.pack("<I", len(nb)) + nb
        out += struct.pack("<II", dt, a.ndim)
        out += struct.pack("<%dq" % a.ndim, *a.shape)
        out += np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
    with open(path, "wb") as f:
        f.write(bytes(out))
    return len(out)


# ---------------------------------------------------------------------------------------------
# helpers


class Case:
    """Collects the arrays of one fixture file, with a generator seeded from the case name."""

    def __init__(self, name):
        self.name = name
        self.arrays = []
        self.gen = torch.Generator().manual_seed(zlib.crc32(name.encode()) & 0x7FFFFFFF)

    # random float32 values, returned as a float64 leaf tensor holding exactly those values
    def randn(self, *shape, std=1.0, mean=0.0):
        t = torch.randn(*shape, generator=self.gen, dtype=torch.float32) * std + mean
        return t.to(torch.float32).to(torch.float64)

    def uniform(self, *shape, lo=-1.0, hi=1.0):
        t = torch.rand(*shape, generator=self.gen, dtype=torch.float32) * (hi - lo) + lo
        return t.to(torch.float32).to(torch.float64)

    def f32(self, name, t):
        a = t.detach().cpu().numpy()
        a32 = a.astype(np.float32)
        assert np.array_equal(a32.astype(np.float64), a), name + " is not exactly float32"
        self.arrays.append((name, a32))

    def f64(self, name, t):
        a = t.detach().cpu().numpy().astype(np.float64) if torch.is_tensor(t) else np.asarray(t, np.float64)
        assert np.all(np.isfinite(a)), name + " has a non-finite value"
        self.arrays.append((name, a))

    def i32(self, name, v):
        self.arrays.append((name, np.asarray(v, dtype=np.int32)))

    def save(self, outdir):
        path = os.path.join(outdir, self.name + ".tfx")
        n = write_tfx(path, self.arrays)
        print("%-24s %7d bytes  %s" % (self.name + ".tfx", n, ", ".join(a for a, _ in self.arrays)))
        return n


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def visible_mask(B, Tq, Tk, causal, key_lens):
    """(B,Tq,Tk) bool: True where query i may attend to key j."""
    vis = torch.ones(B, Tq, Tk, dtype=torch.bool)
    if causal:
        vis &= ~torch.triu(torch.ones(Tq, Tk, dtype=torch.bool), diagonal=1)
    if key_lens is not None:
        for b, n in enumerate(key_lens):
            vis[b, :, n:] = False
    assert bool(vis.any(-1).all()), "a query row has no visible key (torch would give NaN)"
    return vis


def attention_math(q, k, v, H, vis, scale, amask=None):
    """softmax(scale q k^T + amask, masked by vis) v per head; q (B,Tq,C), k, v (B,Tk,C); head h owns
    channels h*D..h*D+D-1; amask additive, (Tq,Tk) or (B,Tq,Tk). Returns out (B,Tq,C) and the
    probabilities (B,H,Tq,Tk)."""
    B, Tq, C = q.shape
    Tk = k.shape[1]
    D = C // H
    qh = q.view(B, Tq, H, D).transpose(1, 2)
    kh = k.view(B, Tk, H, D).transpose(1, 2)
    vh = v.view(B, Tk, H, D).transpose(1, 2)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    if amask is not None:
        s = s + (amask[None, None] if amask.dim() == 2 else amask[:, None])
    s = s.masked_fill(~vis[:, None, :, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.matmul(p, vh).transpose(1, 2).reshape(B, Tq, C)
    return o, p


# ---------------------------------------------------------------------------------------------
# multi-head attention: torch.nn.MultiheadAttention(batch_first=True), float64


def additive_mask(cs, shape, vis):
    """A float mask of the given shape, (Tq,Tk) or (B,Tq,Tk): values in [-2,2], about a quarter of them
    -inf, but never hiding every key a query sees under the other masks (vis, (B,Tq,Tk))."""
    m = cs.uniform(*shape, lo=-2.0, hi=2.0)
    want = cs.uniform(*shape, lo=0.0, hi=1.0) < 0.25
    hide = torch.zeros(shape, dtype=torch.bool)
    for idx in torch.nonzero(want):
        trial = hide.clone()
        trial[tuple(idx)] = True
        keep = vis & ~(trial if len(shape) == 3 else trial[None])
        if bool(keep.any(-1).all()):
            hide = trial
    return m.masked_fill(hide, float("-inf"))


def mha_case(name, B, Tq, C, H, causal=False, key_lens=None, cross=False, Tk=None, bias=True, amask=None):
    cs = Case(name)
    Tk = Tk if cross else Tq
    mha = torch.nn.MultiheadAttention(C, H, bias=bias, batch_first=True, dtype=torch.float64)
    # parameters: float32 draws, scaled so the attention logits are O(1) and the softmax is far
    # from uniform; biases nonzero so every bias path is exercised
    with torch.no_grad():
        mha.in_proj_weight.copy_(cs.randn(3 * C, C, std=1.2 / math.sqrt(C)))
        mha.out_proj.weight.copy_(cs.randn(C, C, std=1.0 / math.sqrt(C)))
        if bias:
            mha.in_proj_bias.copy_(cs.randn(3 * C, std=0.3))
            mha.out_proj.bias.copy_(cs.randn(C, std=0.3))
    x = leaf(cs.randn(B, Tq, C))
    xkv = leaf(cs.randn(B, Tk, C)) if cross else None
    dy = cs.randn(B, Tq, C)

    attn_mask = torch.triu(torch.ones(Tq, Tk, dtype=torch.bool), diagonal=1) if causal else None
    kpm = None
    if key_lens is not None:
        kpm = torch.arange(Tk)[None, :] >= torch.tensor(key_lens)[:, None]  # True = masked
    vis = visible_mask(B, Tq, Tk, causal, key_lens)
    am = None
    if amask is not None:  # an additive float mask: torch takes (Tq,Tk) or one per batch and head
        am = additive_mask(cs, (Tq, Tk) if amask == "shared" else (B, Tq, Tk), vis)
        fm = am if amask == "shared" else am.repeat_interleave(H, dim=0)
        if attn_mask is not None:
            fm = fm.masked_fill(attn_mask, float("-inf"))
        attn_mask = fm

    mha.zero_grad()
    src = xkv if cross else x
    y, _ = mha(x, src, src, key_padding_mask=kpm, need_weights=False, attn_mask=attn_mask)
    (y * dy).sum().backward()

    # independent check of torch's module against the explicit math
    with torch.no_grad():
        W, bW = mha.in_proj_weight, mha.in_proj_bias
        q = F.linear(x, W[:C], bW[:C] if bias else None)
        k = F.linear(src, W[C:2 * C], bW[C:2 * C] if bias else None)
        v = F.linear(src, W[2 * C:], bW[2 * C:] if bias else None)
        o, _ = attention_math(q, k, v, H, vis, 1.0 / math.sqrt(C // H), am)
        y2 = F.linear(o, mha.out_proj.weight, mha.out_proj.bias)
        assert torch.allclose(y, y2, rtol=0, atol=1e-12), name + ": torch module != explicit math"

    cs.i32("n_heads", H)
    cs.i32("causal", int(causal))
    cs.i32("cross", int(cross))
    cs.i32("bias", int(bias))
    if key_lens is not None:
        cs.i32("key_lens", key_lens)
    if am is not None:
        cs.f32("attn_mask", am)
    cs.f32("x", x)
    if cross:
        cs.f32("xkv", xkv)
    cs.f32("in_proj_weight", mha.in_proj_weight)
    cs.f32("out_proj.weight", mha.out_proj.weight)
    if bias:
        cs.f32("in_proj_bias", mha.in_proj_bias)
        cs.f32("out_proj.bias", mha.out_proj.bias)
    cs.f32("dy", dy)
    cs.f64("y", y)
    cs.f64("grad.x", x.grad)
    if cross:
        cs.f64("grad.xkv", xkv.grad)
    cs.f64("grad.in_proj_weight", mha.in_proj_weight.grad)
    cs.f64("grad.out_proj.weight", mha.out_proj.weight.grad)
    if bias:
        cs.f64("grad.in_proj_bias", mha.in_proj_bias.grad)
        cs.f64("grad.out_proj.bias", mha.out_proj.bias.grad)
    return cs


# ---------------------------------------------------------------------------------------------
# scaled dot-product attention alone (tfm_attention_forward/backward), explicit torch math


def attn_case(name, B, Tq, Tk, C, H, causal=False, key_lens=None, scale=0.0):
    cs = Case(name)
    q = leaf(cs.randn(B, Tq, C, std=1.5))
    k = leaf(cs.randn(B, Tk, C, std=1.5))
    v = leaf(cs.randn(B, Tk, C))
    dout = cs.randn(B, Tq, C)
    vis = visible_mask(B, Tq, Tk, causal, key_lens)
    eff_scale = scale if scale != 0.0 else 1.0 / math.sqrt(C // H)
    if scale != 0.0:
        assert float(np.float32(scale)) == scale, "scale must be exactly a float32"
    out, p = attention_math(q, k, v, H, vis, eff_scale)
    (out * dout).sum().backward()
    cs.i32("n_heads", H)
    cs.i32("causal", int(causal))
    if key_lens is not None:
        cs.i32("key_lens", key_lens)
    cs.f32("scale", torch.tensor(scale, dtype=torch.float64))
    cs.f32("q", q)
    cs.f32("k", k)
    cs.f32("v", v)
    cs.f32("dy", dout)
    cs.f64("y", out)
    cs.f64("att", p)  # masked entries are exactly 0
    cs.f64("grad.q", q.grad)
    cs.f64("grad.k", k.grad)
    cs.f64("grad.v", v.grad)
    return cs


# ---------------------------------------------------------------------------------------------
# single ops


def linear_case(name, xshape, O, bias):
    cs = Case(name)
    I = xshape[-1]
    x = leaf(cs.randn(*xshape))
    w = leaf(cs.randn(O, I, std=1.0 / math.sqrt(I)))
    b = leaf(cs.randn(O, std=0.5)) if bias else None
    y = F.linear(x, w, b)
    dy = cs.randn(*y.shape)
    (y * dy).sum().backward()
    cs.f32("x", x)
    cs.f32("weight", w)
    if bias:
        cs.f32("bias", b)
    cs.f32("dy", dy)
    cs.f64("y", y)
    cs.f64("grad.x", x.grad)
    cs.f64("grad.weight", w.grad)
    if bias:
        cs.f64("grad.bias", b.grad)
    return cs


def layernorm_case(name, shape, eps=1e-5):
    cs = Case(name)
    C = shape[-1]
    # rows with different offsets and spreads
    x = cs.randn(*shape) * cs.uniform(*shape[:-1], 1, lo=0.5, hi=3.0) + cs.randn(*shape[:-1], 1, std=2.0)
    x = leaf(x.to(torch.float32).to(torch.float64))
    g = leaf(cs.randn(C, std=0.5, mean=1.0))
    b = leaf(cs.randn(C, std=0.5))
    y = F.layer_norm(x, (C,), g, b, eps)
    dy = cs.randn(*shape)
    (y * dy).sum().backward()
    with torch.no_grad():
        var, mean = torch.var_mean(x, dim=-1, unbiased=False)
        rstd = 1.0 / torch.sqrt(var + eps)
    cs.f32("x", x)
    cs.f32("weight", g)
    cs.f32("bias", b)
    cs.f32("eps", torch.tensor(eps, dtype=torch.float32).to(torch.float64))
    cs.f32("dy", dy)
    cs.f64("y", y)
    cs.f64("mean", mean.reshape(-1))
    cs.f64("rstd", rstd.reshape(-1))
    cs.f64("grad.x", x.grad)
    cs.f64("grad.weight", g.grad)
    cs.f64("grad.bias", b.grad)
    return cs


def rope_case(name, B, T, H, D, rot, base, pos0):
    """Rotary embedding as Hugging Face's LLaMA writes it (inv_freq, cat(freqs, freqs), rotate_half), on
    the first rot channels of each head, in float64."""
    cs = Case(name)
    x = leaf(cs.randn(B, T, H * D).to(torch.float32).to(torch.float64))
    dy = cs.randn(B, T, H * D)
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    pos = torch.arange(T, dtype=torch.float64)[None, :] + torch.tensor(pos0, dtype=torch.float64)[:, None]
    emb = torch.cat([pos[..., None] * inv_freq, pos[..., None] * inv_freq], dim=-1)  # (B,T,rot)
    cos, sin = emb.cos()[:, :, None, :], emb.sin()[:, :, None, :]
    xh = x.view(B, T, H, D)
    xr, xp = xh[..., :rot], xh[..., rot:]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
    rotated = xr * cos + torch.cat([-x2, x1], dim=-1) * sin
    y = torch.cat([rotated, xp], dim=-1).reshape(B, T, H * D)
    (y * dy).sum().backward()
    cs.i32("shape", [H, rot])
    cs.f32("base", torch.tensor(base, dtype=torch.float64))
    cs.i32("pos0", pos0)
    cs.f32("x", x)
    cs.f32("dy", dy.to(torch.float32).to(torch.float64))
    cs.f64("y", y)
    cs.f64("grad.x", x.grad)
    return cs


def gelu_case(name, approximate):
    cs = Case(name)
    # a spread of values, including the tails and a few exact points
    x = torch.cat([cs.randn(4, 30, std=2.0).reshape(-1),
                   torch.tensor([0.0, -0.5, 0.5, -6.0, 6.0, -9.0, 9.0, 1e-3, -1e-3, 3.0])])
    x = leaf(x.reshape(5, 26))
    y = F.gelu(x, approximate=approximate)
    dy = cs.randn(*y.shape)
    (y * dy).sum().backward()
    cs.f32("x", x)
    cs.f32("dy", dy)
    cs.f64("y", y)
    cs.f64("grad.x", x.grad)
    return cs


def softmax_case(name, log):
    cs = Case(name)
    x = cs.randn(2, 3, 11, std=2.5)
    x[1, 2] += 40.0  # a shifted row: needs the max subtraction
    x = leaf(x.to(torch.float32).to(torch.float64))
    y = F.log_softmax(x, -1) if log else F.softmax(x, -1)
    dy = cs.randn(*y.shape)
    (y * dy).sum().backward()
    cs.f32("x", x)
    cs.f32("dy", dy)
    cs.f64("y", y)
    cs.f64("grad.x", x.grad)
    return cs


def cross_entropy_case(name, smoothing, N=9, V=13, ignore_index=-100):
    cs = Case(name)
    logits = leaf(cs.randn(N, V, std=2.0))
    tgt = torch.randint(0, V, (N,), generator=cs.gen)
    tgt[2] = ignore_index
    tgt[6] = ignore_index
    tgt[7] = tgt[8]  # a repeated class
    dloss = float(np.float32(0.75))
    loss = F.cross_entropy(logits, tgt, ignore_index=ignore_index, label_smoothing=smoothing,
                           reduction="mean")
    (loss * dloss).backward()
    cs.i32("targets", tgt.numpy().astype(np.int32))
    cs.i32("ignore_index", ignore_index)
    cs.f32("label_smoothing", torch.tensor(smoothing, dtype=torch.float32).to(torch.float64))
    cs.f32("dloss", torch.tensor(dloss, dtype=torch.float64))
    cs.f32("logits", logits)
    cs.f64("loss", loss)
    cs.f64("lse", torch.logsumexp(logits.detach(), dim=-1))
    cs.f64("grad.logits", logits.grad)
    return cs


def embedding_case(name):
    cs = Case(name)
    V, C = 7, 5
    ids = torch.tensor([[3, 1, 3, 0, 6, 3], [1, 1, 5, 2, 0, 3]], dtype=torch.int64)  # repeats
    w = leaf(cs.randn(V, C))
    y = F.embedding(ids, w)
    dy = cs.randn(*y.shape)
    (y * dy).sum().backward()
    cs.i32("ids", ids.numpy().astype(np.int32))
    cs.f32("weight", w)
    cs.f32("dy", dy)
    cs.f64("y", y)
    cs.f64("grad.weight", w.grad)
    return cs


# ---------------------------------------------------------------------------------------------


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join("tests", "fixtures")
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)  # bit-for-bit the same files on every run
    cases = [
        mha_case("mha_self", B=2, Tq=5, C=16, H=4),
        mha_case("mha_causal", B=2, Tq=7, C=12, H=3, causal=True),
        mha_case("mha_padded", B=3, Tq=6, C=16, H=2, key_lens=[6, 3, 1]),
        mha_case("mha_causal_padded", B=2, Tq=5, C=8, H=2, causal=True, key_lens=[5, 2]),
        mha_case("mha_cross", B=2, Tq=4, C=16, H=4, cross=True, Tk=7, key_lens=[7, 3]),
        mha_case("mha_cross_nobias", B=1, Tq=3, C=8, H=1, cross=True, Tk=5, bias=False),
        mha_case("mha_odd_tiny", B=1, Tq=1, C=3, H=1),
        mha_case("mha_odd", B=3, Tq=17, C=6, H=3, causal=True, key_lens=[17, 9, 4]),
        mha_case("mha_mask", B=2, Tq=6, C=8, H=2, amask="shared"),
        mha_case("mha_mask_batch", B=3, Tq=7, C=12, H=3, causal=True, key_lens=[7, 5, 3], amask="batch"),
        attn_case("attn_causal_padded", B=2, Tq=6, Tk=6, C=8, H=2, causal=True, key_lens=[6, 4]),
        attn_case("attn_cross_padded", B=2, Tq=3, Tk=5, C=12, H=3, key_lens=[5, 2], scale=0.3125),
        attn_case("attn_causal_rect", B=2, Tq=4, Tk=6, C=6, H=2, causal=True, key_lens=[6, 3]),
        linear_case("linear", (2, 3, 5), 4, bias=True),
        linear_case("linear_nobias", (7, 6), 3, bias=False),
        layernorm_case("layernorm", (2, 4, 10)),
        rope_case("rope", B=2, T=5, H=2, D=12, rot=8, base=10000.0, pos0=[0, 2041]),
        gelu_case("gelu_erf", "none"),
        gelu_case("gelu_tanh", "tanh"),
        softmax_case("softmax", log=False),
        softmax_case("log_softmax", log=True),
        cross_entropy_case("cross_entropy", 0.0),
        cross_entropy_case("cross_entropy_smooth", 0.1),
        embedding_case("embedding"),
    ]
    total = sum(c.save(outdir) for c in cases)
    print("%d files, %d bytes in %s" % (len(cases), total, outdir))


if __name__ == "__main__":
    main()
