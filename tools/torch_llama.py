#!/usr/bin/env python3
"""Hugging Face LLaMA checkpoints between PyTorch and transformer.h (tfm_llama_name_map).

Usage (from the repository root; needs torch, tested with 1.13, and numpy; files are read and
written with tools/torch_roundtrip.py's own safetensors code, and also read with the `safetensors`
package when it is installed; with `transformers` installed (tested with 4.36.2) every file is also
run in its LlamaForCausalLM):

    python3 tools/torch_llama.py export [OUTDIR]   # default OUTDIR: tests/fixtures
    python3 tools/torch_llama.py check DIR         # e.g. build/io_export/llama, after `make unit`

The model (LlamaRef below) is Hugging Face's LlamaForCausalLM written again in plain PyTorch, with
its module names, so that its state_dict keys are the checkpoint's names, and its math:
    x = embed_tokens[ids]
    per layer:  h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))), n1 = input_layernorm(x)
                x = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)), n2 = post_attention_layernorm(h)
    logits = lm_head(norm(x))   (lm_head is embed_tokens when tied: tie_word_embeddings)
RMSNorm(x) = weight * x / sqrt(mean(x^2) + eps); rope: rotate_half over the whole head,
inv_freq = 1 / theta^(2i/D), q * cos + rotate_half(q) * sin; causal softmax(q k^T / sqrt(D)); key
and value heads (n_kv_heads of them) each serve n_heads / n_kv_heads consecutive query heads
(Hugging Face's repeat_kv). No biases. Computed in float64 from float32 weights.

export
    For each case (llama_hf_untied: 2 layers, lm_head of its own; llama_hf_tied: 1 layer, tied;
    llama_hf_gqa: 2 layers, 4 query heads over 2 key/value heads, k_proj and v_proj (16, 32))
    draws float32 weights from a fixed seed (norm weights around 1, so every norm is non-trivial)
    and writes
      <case>.safetensors   the state_dict (lm_head.weight left out when tied, as save_pretrained
                           does), tensors in state_dict order, "__metadata__" {"format": "pt"},
                           compact JSON padded with spaces to 8 bytes: the bytes
                           tfm_model_save_mapped writes for the same weights;
      <case>.tfx           "cfg" (i32: vocab, d_model, n_heads, n_kv_heads, n_layers, d_ff, tied),
                           "eps_theta" (f64: rms_norm_eps, rope_theta), "tokens" (i32 (B,T)) and
                           "logits" (f64 (B,T,V)).
    tests/test_io.c loads each file through tfm_llama_name_map + tfm_model_load_mapped, matches the
    logits (1e-5 relative) and saves it back with tfm_model_save_mapped: the same bytes.

check DIR
    For each <case>.safetensors in DIR (tests/test_io.c writes them with tfm_model_save_mapped after
    a few training steps, with the batch and the C logits in <case>.tfx): loads the file into
    LlamaRef with load_state_dict(strict=True) (so the names must be exactly Hugging Face's), runs
    the tokens and compares the C logits: max |c - torch| / max |torch| <= 1e-5. Exits 1 when one
    differs or cannot be read, 2 when DIR has none.
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_fixtures import write_tfx  # noqa: E402
from torch_roundtrip import read_safetensors, read_tfx, safetensors_bytes  # noqa: E402

TOL = 1e-5
# name: vocab, d_model, n_heads, n_kv_heads, n_layers, d_ff, tied, rms_norm_eps, rope_theta, seed
CASES = {
    "llama_hf_untied": (19, 24, 3, 3, 2, 40, 0, 1e-6, 500.0, 2801),
    "llama_hf_tied": (17, 16, 2, 2, 1, 24, 1, 1e-5, 10000.0, 2802),
    "llama_hf_gqa": (21, 32, 4, 2, 2, 40, 0, 1e-5, 10000.0, 2803),
}
B, T = 2, 9


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d, dtype=torch.float64))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, d, n_heads, n_kv_heads, theta):
        super().__init__()
        self.h, self.kv, self.dh, self.theta = n_heads, n_kv_heads, d // n_heads, theta
        self.q_proj = nn.Linear(d, n_heads * self.dh, bias=False, dtype=torch.float64)
        self.k_proj = nn.Linear(d, n_kv_heads * self.dh, bias=False, dtype=torch.float64)
        self.v_proj = nn.Linear(d, n_kv_heads * self.dh, bias=False, dtype=torch.float64)
        self.o_proj = nn.Linear(n_heads * self.dh, d, bias=False, dtype=torch.float64)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.dh).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.dh).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.dh).transpose(1, 2)
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.dh, 2, dtype=torch.float64) / self.dh))
        freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.h // self.kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, t, self.h * self.dh)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.gate_proj = nn.Linear(d, f, bias=False, dtype=torch.float64)
        self.up_proj = nn.Linear(d, f, bias=False, dtype=torch.float64)
        self.down_proj = nn.Linear(f, d, bias=False, dtype=torch.float64)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, d, n_heads, n_kv_heads, f, eps, theta):
        super().__init__()
        self.self_attn = Attention(d, n_heads, n_kv_heads, theta)
        self.mlp = MLP(d, f)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


class Inner(nn.Module):
    def __init__(self, v, d, n_heads, n_kv_heads, n_layers, f, eps, theta):
        super().__init__()
        self.embed_tokens = nn.Embedding(v, d, dtype=torch.float64)
        self.layers = nn.ModuleList(DecoderLayer(d, n_heads, n_kv_heads, f, eps, theta) for _ in range(n_layers))
        self.norm = RMSNorm(d, eps)


class LlamaRef(nn.Module):
    def __init__(self, v, d, n_heads, n_kv_heads, n_layers, f, tied, eps, theta):
        super().__init__()
        self.tied = tied
        self.model = Inner(v, d, n_heads, n_kv_heads, n_layers, f, eps, theta)
        if not tied:
            self.lm_head = nn.Linear(d, v, bias=False, dtype=torch.float64)

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        x = self.model.norm(x)
        return x @ (self.model.embed_tokens.weight if self.tied else self.lm_head.weight).T


def build(cfg, eps_theta):
    v, d, h, kv, n_layers, f, tied = (int(x) for x in cfg)
    return LlamaRef(v, d, h, kv, n_layers, f, bool(tied), float(eps_theta[0]), float(eps_theta[1]))


def export(outdir):
    for name, (v, d, h, kv, n_layers, f, tied, eps, theta, seed) in CASES.items():
        model = build((v, d, h, kv, n_layers, f, tied), (eps, theta))
        g = torch.Generator().manual_seed(seed)
        tensors = []
        with torch.no_grad():
            for pname, p in model.state_dict().items():
                if p.dim() == 1:  # RMSNorm weights: around 1
                    w = 1.0 + 0.3 * torch.randn(p.shape, generator=g)
                else:
                    w = torch.randn(p.shape, generator=g) * (0.8 if "embed" in pname else 1.0 / math.sqrt(p.shape[1]))
                w = w.to(torch.float32)
                p.copy_(w.to(torch.float64))
                tensors.append((pname, w.numpy()))
        ids = torch.randint(0, v, (B, T), generator=g, dtype=torch.int64)
        with torch.no_grad():
            logits = model(ids).numpy()
        st = os.path.join(outdir, name + ".safetensors")
        with open(st, "wb") as fp:
            fp.write(safetensors_bytes([("format", "pt")], tensors))
        write_tfx(os.path.join(outdir, name + ".tfx"), [
            ("cfg", np.array([v, d, h, kv, n_layers, f, tied], dtype=np.int32)),
            ("eps_theta", np.array([eps, theta], dtype=np.float64)),
            ("tokens", ids.numpy().astype(np.int32)),
            ("logits", logits.astype(np.float64)),
        ])
        print("%s: %d tensors, logits max |%.3g|" % (st, len(tensors), float(np.abs(logits).max())))
        check_file(st, os.path.join(outdir, name + ".tfx"))


def load_state(path):
    """The file's tensors as float64 torch tensors: read here, and by the safetensors package when it
    is installed (both must agree)."""
    meta, tensors = read_safetensors(path)
    if meta.get("format") != "pt":
        raise ValueError("%s: __metadata__ format is %r, want 'pt'" % (path, meta.get("format")))
    state = dict((k, torch.from_numpy(a.copy()).to(torch.float64)) for k, a in tensors)
    try:
        from safetensors.torch import load_file
    except ImportError:
        return state, "read by hand (the safetensors package is not installed)"
    other = load_file(path)
    if sorted(other) != sorted(state) or any(not torch.equal(other[k].to(torch.float64), state[k]) for k in state):
        raise ValueError("%s: safetensors.torch.load_file reads other tensors than the reader here" % path)
    return state, "read by hand and by safetensors.torch.load_file"


def rel_err(got, ref, what):
    if got.shape != ref.shape:
        raise ValueError("%s: logits are %s, the reference's %s" % (what, got.shape, ref.shape))
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def hf_logits(arrays, state, tokens):
    """The logits of transformers' own LlamaForCausalLM (float32) with these weights, or None when
    transformers is not installed (tested with 4.36.2 on torch 1.13)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    v, d, h, kv, n_layers, f, tied = (int(x) for x in arrays["cfg"])
    cfg = LlamaConfig(vocab_size=v, hidden_size=d, intermediate_size=f, num_hidden_layers=n_layers,
                      num_attention_heads=h, num_key_value_heads=kv, rms_norm_eps=float(arrays["eps_theta"][0]),
                      rope_theta=float(arrays["eps_theta"][1]), tie_word_embeddings=bool(tied),
                      max_position_embeddings=max(64, tokens.shape[1]))
    model = LlamaForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict(dict((k, t.float()) for k, t in state.items()), strict=False)
    if unexpected or missing != (["lm_head.weight"] if tied else []):  # tied: lm_head is embed_tokens
        raise ValueError("LlamaForCausalLM: missing %s, unexpected %s" % (missing, unexpected))
    with torch.no_grad():
        return model(tokens).logits.double().numpy()


def check_file(st, tfx):
    """max |c - torch| / max |torch| of the logits in tfx against LlamaRef loaded from st (and
    against transformers' LlamaForCausalLM when it is installed: the larger of the two)."""
    arrays = read_tfx(tfx)
    model = build(arrays["cfg"], arrays["eps_theta"])
    state, how = load_state(st)
    model.load_state_dict(state, strict=True)
    tokens = torch.from_numpy(arrays["tokens"].astype(np.int64))
    with torch.no_grad():
        ref = model(tokens).numpy()
    got = arrays["logits"].astype(np.float64)
    err = rel_err(got, ref, tfx)
    print("  %s: loaded with strict names (%s); logits rel err %.2e" % (st, how, err))
    hf = hf_logits(arrays, state, tokens)
    if hf is not None:
        e2 = rel_err(got, hf, tfx)
        print("  %s: transformers' LlamaForCausalLM (float32): logits rel err %.2e" % (st, e2))
        err = max(err, e2)
    return err


def check(d):
    names = sorted(n[:-len(".safetensors")] for n in os.listdir(d) if n.startswith("llama_") and n.endswith(".safetensors"))
    if not names:
        print("%s: no llama_*.safetensors" % d)
        return 2
    bad = 0
    for n in names:
        try:
            err = check_file(os.path.join(d, n + ".safetensors"), os.path.join(d, n + ".tfx"))
        except Exception as e:  # a file that cannot be read or loaded is a failure, reported
            print("  %s: FAILED: %s" % (n, e))
            bad += 1
            continue
        if not err <= TOL:
            print("  %s: FAILED: rel err %.2e > %.0e" % (n, err, TOL))
            bad += 1
    print("%d of %d LLaMA checkpoints match PyTorch" % (len(names) - bad, len(names)))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "export":
        export(sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "tests", "fixtures"))
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2]))
    else:
        print(__doc__)
        sys.exit(2)
