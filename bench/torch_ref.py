#!/usr/bin/env python3
"""PyTorch side of the benchmark: the five models of bench/bench.c, the same math, the same timings.

Usage (bench/run.sh calls it; /usr/bin/python3 with torch 1.13):
    torch_ref.py model NAME THREADS   one model per process; prints MODEL and RESULT lines like build/bench
    torch_ref.py model NAME THREADS compile
                                      the same with the forward and loss under torch.compile (torch 2.x;
                                      AdamW stays eager): impl=torch-compile. Where torch.compile is missing
                                      or fails, prints a SKIP line saying why and exits 0
    torch_ref.py info                 torch version, threads, which BLAS library and OpenBLAS core it uses
    torch_ref.py params [NAME...]     parameter counts only
    torch_ref.py gen NAME THREADS     batched greedy generation (1, 8, 32 rows) with the KV cache loop
    torch_ref.py check [NAME...]      the hand-written KV-cache generation against full recomputation, and
                                      its batched form against one prompt at a time
    torch_ref.py verify FILE          the model in FILE (from `build/bench dump NAME FILE`: our weights,
                                      batch, logits, loss, gradient norm) through the torch model: the
                                      same function on both sides?
QUICK=1 in the environment: fewer repetitions. The same script runs under Debian's torch 1.13 and under
a pip torch 2.x (bench/run.sh: TORCH2=path/to/python).

The models are built from torch.nn layers (TransformerEncoderLayer / TransformerDecoderLayer, which
hold nn.MultiheadAttention with one fused (3C,C) in_proj_weight), batch_first, dropout 0, float32:
  LM          tok_emb (V,C) + learned pos_emb (T,C); L pre-LN encoder layers with GELU (tanh) and an
              additive causal mask; final LayerNorm; logits = x tok_emb^T (tied, no bias)
  classifier  tok_emb + pos_emb; L post-LN encoder layers with ReLU; mean over T; head Linear(C,K)
  enc-dec     src/tgt token and position embeddings; Le pre-LN encoder layers + LayerNorm;
              Ld pre-LN decoder layers (causal self-attention, cross-attention) + LayerNorm; ReLU;
              head Linear(C,Vt) without bias
Loss: F.cross_entropy (mean). Optimizer: torch.optim.AdamW(lr=1e-4, weight_decay=0.01) with weight
decay on the weight matrices only (biases, layernorms and embeddings undecayed), as transformer.h's
tfm_model_step does by default.

torch.set_num_threads(THREADS) sets torch's OpenMP pool. The BLAS torch calls for float32 matrix
products is the system libblas.so.3 (Debian: OpenBLAS, pthread build); torch does not pass its thread
count on to it, so this script sets OpenBLAS's thread count to THREADS itself (openblas_set_num_threads
through ctypes) and reports what it found.
"""

import ctypes
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

GEN_NEW = 127

# name: kind, C, L (encoder or LM layers), Ld, H, F (0 -> 4C), T (source), Tt, B, V, Vt, K,
#       warm-up, timed steps, forward reps, generation reps  (the same table as bench/bench.c)
CONFIGS = {
    "char-gpt-tiny":      dict(kind="lm",  C=128, L=4,  Ld=0, H=4,  F=0,    T=128, Tt=0,  B=16, V=96,
                               Vt=0,  K=0, warmup=3, steps=20, fwd_reps=20, gen_reps=3),
    "gpt-small":          dict(kind="lm",  C=384, L=6,  Ld=0, H=6,  F=0,    T=256, Tt=0,  B=8,  V=8192,
                               Vt=0,  K=0, warmup=3, steps=10, fwd_reps=5,  gen_reps=3),
    "gpt2-124M-shape":    dict(kind="lm",  C=768, L=12, Ld=0, H=12, F=0,    T=128, Tt=0,  B=2,  V=50257,
                               Vt=0,  K=0, warmup=2, steps=10, fwd_reps=5,  gen_reps=3),
    "encoder-classifier": dict(kind="cls", C=256, L=4,  Ld=0, H=8,  F=0,    T=256, Tt=0,  B=16, V=1024,
                               Vt=0,  K=2, warmup=3, steps=10, fwd_reps=10, gen_reps=0),
    "enc-dec":            dict(kind="s2s", C=256, L=3,  Ld=3, H=4,  F=1024, T=32,  Tt=32, B=64, V=64,
                               Vt=64, K=0, warmup=3, steps=10, fwd_reps=10, gen_reps=0),
    "char-gpt-4k":        dict(kind="lm",  C=128, L=4,  Ld=0, H=4,  F=0,    T=4096, Tt=0, B=2,  V=96,
                               Vt=0,  K=0, warmup=1, steps=3,  fwd_reps=3,  gen_reps=0),
}

DECAY_SUFFIXES = ("in_proj_weight", "out_proj.weight", "linear1.weight", "linear2.weight", "head.weight")


def quick_mode():
    q = os.environ.get("QUICK", "")
    return q not in ("", "0")


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def d_ff(c):
    return c["F"] or 4 * c["C"]


def model_flops(c):
    """FLOPs of one training step: the formula of bench/bench.c (see bench/README.md)."""
    B, C, Fd, L, T = c["B"], c["C"], d_ff(c), c["L"], c["T"]
    wenc = 4.0 * C * C + 2.0 * C * Fd
    if c["kind"] == "lm":
        return 6.0 * B * T * (L * wenc + c["V"] * C) + 12.0 * B * L * T * T * C
    if c["kind"] == "cls":
        return 6.0 * B * T * L * wenc + 6.0 * B * c["K"] * C + 12.0 * B * L * T * T * C
    Ld, Ts, Tt, Vt = c["Ld"], c["T"], c["Tt"], c["Vt"]
    wdec = 6.0 * C * C + 2.0 * C * Fd
    return (6.0 * B * Ts * (L * wenc + Ld * 2.0 * C * C) + 6.0 * B * Tt * (Ld * wdec + Vt * C)
            + 12.0 * B * C * (L * Ts * Ts + Ld * (Tt * Tt + Tt * Ts)))


def model_tokens(c):
    return c["B"] * (c["T"] + c["Tt"] if c["kind"] == "s2s" else c["T"])


def causal_mask(T):
    """(T,T) additive float mask: -inf above the diagonal (query i does not see key j > i)."""
    return torch.triu(torch.full((T, T), float("-inf")), diagonal=1)


def encoder_layer(c, act, norm_first):
    return nn.TransformerEncoderLayer(c["C"], c["H"], dim_feedforward=d_ff(c), dropout=0.0, activation=act,
                                      batch_first=True, norm_first=norm_first)


def init_embedding(emb):
    nn.init.normal_(emb.weight, 0.0, 0.02)
    return emb


class Stack(nn.Module):
    """`layers` and, for pre-LN, a final LayerNorm `norm`: the state_dict names of transformer.h's
    models (encoder.layers.N.*, decoder.norm.weight, ...)."""

    def __init__(self, layers, C, final_norm):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(C) if final_norm else None


class DecoderLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_emb = init_embedding(nn.Embedding(c["V"], c["C"]))
        self.pos_emb = init_embedding(nn.Embedding(c["T"], c["C"]))
        self.decoder = Stack([encoder_layer(c, gelu_tanh, True) for _ in range(c["L"])], c["C"], True)
        self.register_buffer("mask", causal_mask(c["T"]), persistent=False)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb.weight[:T]
        mask = self.mask[:T, :T]
        for layer in self.decoder.layers:
            x = layer(x, src_mask=mask)
        return F.linear(self.decoder.norm(x), self.tok_emb.weight)  # tied output projection

    def loss(self, batch):
        logits = self(batch["tokens"])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))

    @torch.no_grad()
    def generate(self, prompt, n_new):
        """Greedy batch-1 decoding with a per-layer key/value cache, written out by hand: each new
        token runs through the layers as one row; its key and value are appended to the cache and its
        query attends over the cache. Returns the n_new new ids."""
        C, H = self.c["C"], self.c["H"]
        D = C // H
        tmax = len(prompt) + n_new
        layers = self.decoder.layers
        kc = [torch.empty(H, tmax, D) for _ in layers]
        vc = [torch.empty(H, tmax, D) for _ in layers]
        scale = 1.0 / math.sqrt(D)
        out = []
        tok = prompt[0]
        for t in range(len(prompt) + n_new - 1):
            x = (self.tok_emb.weight[tok] + self.pos_emb.weight[t]).view(1, C)
            for i, layer in enumerate(layers):
                att = layer.self_attn
                h = layer.norm1(x)
                qkv = F.linear(h, att.in_proj_weight, att.in_proj_bias).view(3, H, D)
                kc[i][:, t] = qkv[1]
                vc[i][:, t] = qkv[2]
                s = torch.bmm(qkv[0].view(H, 1, D), kc[i][:, : t + 1].transpose(1, 2)) * scale  # (H,1,t+1)
                ctx = torch.bmm(torch.softmax(s, dim=-1), vc[i][:, : t + 1])  # (H,1,D)
                x = x + att.out_proj(ctx.view(1, C))
                x = x + layer.linear2(layer.activation(layer.linear1(layer.norm2(x))))
            if t + 1 < len(prompt):
                tok = prompt[t + 1]
                continue
            logits = F.linear(self.decoder.norm(x), self.tok_emb.weight)
            tok = int(torch.argmax(logits))
            out.append(tok)
        return out

    @torch.no_grad()
    def generate_batch(self, prompts, n_new):
        """generate() for B prompts of one length at once (generate_ids). Returns B lists of n_new ids."""
        return self.generate_ids(torch.tensor(prompts), n_new).tolist()

    @torch.no_grad()
    def generate_ids(self, prompts, n_new):
        """Greedy decoding after prompts (B,P), a tensor on the model's device: the cache holds (B,H,t,D) per
        layer, each step runs the B new rows through the layers together, and the chosen ids stay on the
        device (torch_gpu.py times it on a GPU). Returns (B, n_new) ids there."""
        C, H = self.c["C"], self.c["H"]
        D = C // H
        B, P = prompts.shape
        tmax = P + n_new
        dev = prompts.device
        layers = self.decoder.layers
        kc = [torch.empty(B, H, tmax, D, device=dev) for _ in layers]
        vc = [torch.empty(B, H, tmax, D, device=dev) for _ in layers]
        scale = 1.0 / math.sqrt(D)
        out = []
        tok = prompts[:, 0]
        for t in range(P + n_new - 1):
            x = self.tok_emb.weight[tok] + self.pos_emb.weight[t]  # (B,C)
            for i, layer in enumerate(layers):
                att = layer.self_attn
                h = layer.norm1(x)
                qkv = F.linear(h, att.in_proj_weight, att.in_proj_bias).view(B, 3, H, D)
                kc[i][:, :, t] = qkv[:, 1]
                vc[i][:, :, t] = qkv[:, 2]
                s = torch.matmul(qkv[:, 0].unsqueeze(2), kc[i][:, :, : t + 1].transpose(2, 3)) * scale  # (B,H,1,t+1)
                ctx = torch.matmul(torch.softmax(s, dim=-1), vc[i][:, :, : t + 1])  # (B,H,1,D)
                x = x + att.out_proj(ctx.reshape(B, C))
                x = x + layer.linear2(layer.activation(layer.linear1(layer.norm2(x))))
            if t + 1 < P:
                tok = prompts[:, t + 1]
                continue
            logits = F.linear(self.decoder.norm(x), self.tok_emb.weight)
            tok = torch.argmax(logits, dim=-1)
            out.append(tok)
        return torch.stack(out, dim=1)

    @torch.no_grad()
    def generate_full(self, prompt, n_new):
        """The same greedy decoding by recomputing the whole prefix each step (for `check`)."""
        seq = list(prompt)
        for _ in range(n_new):
            logits = self(torch.tensor([seq]))
            seq.append(int(torch.argmax(logits[0, -1])))
        return seq[len(prompt):]


class EncoderClassifier(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok_emb = init_embedding(nn.Embedding(c["V"], c["C"]))
        self.pos_emb = init_embedding(nn.Embedding(c["T"], c["C"]))
        self.encoder = Stack([encoder_layer(c, F.relu, False) for _ in range(c["L"])], c["C"], False)
        self.head = nn.Linear(c["C"], c["K"])

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb.weight[:T]
        for layer in self.encoder.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))

    def loss(self, batch):
        return F.cross_entropy(self(batch["tokens"]), batch["targets"])


class EncoderDecoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        C = c["C"]
        self.src_tok_emb = init_embedding(nn.Embedding(c["V"], C))
        self.tgt_tok_emb = init_embedding(nn.Embedding(c["Vt"], C))
        self.src_pos_emb = init_embedding(nn.Embedding(c["T"], C))
        self.tgt_pos_emb = init_embedding(nn.Embedding(c["Tt"], C))
        self.encoder = Stack([encoder_layer(c, F.relu, True) for _ in range(c["L"])], C, True)
        self.decoder = Stack([
            nn.TransformerDecoderLayer(C, c["H"], dim_feedforward=d_ff(c), dropout=0.0, activation=F.relu,
                                       batch_first=True, norm_first=True) for _ in range(c["Ld"])], C, True)
        self.head = nn.Linear(C, c["Vt"], bias=False)
        self.register_buffer("mask", causal_mask(c["Tt"]), persistent=False)

    def forward(self, src, tgt_in):
        Ts, Tt = src.shape[1], tgt_in.shape[1]
        x = self.src_tok_emb(src) + self.src_pos_emb.weight[:Ts]
        for layer in self.encoder.layers:
            x = layer(x)
        memory = self.encoder.norm(x)
        y = self.tgt_tok_emb(tgt_in) + self.tgt_pos_emb.weight[:Tt]
        mask = self.mask[:Tt, :Tt]
        for layer in self.decoder.layers:
            y = layer(y, memory, tgt_mask=mask)
        return self.head(self.decoder.norm(y))

    def loss(self, batch):
        logits = self(batch["tokens"], batch["tgt_in"])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))


def build(name):
    c = CONFIGS[name]
    torch.manual_seed(1234)
    model = {"lm": DecoderLM, "cls": EncoderClassifier, "s2s": EncoderDecoder}[c["kind"]](c)
    g = torch.Generator().manual_seed(42)
    batch = {"tokens": torch.randint(0, c["V"], (c["B"], c["T"]), generator=g)}
    if c["kind"] == "lm":
        batch["targets"] = torch.randint(0, c["V"], (c["B"], c["T"]), generator=g)
    elif c["kind"] == "cls":
        batch["targets"] = torch.randint(0, c["K"], (c["B"],), generator=g)
    else:
        batch["tgt_in"] = torch.randint(0, c["Vt"], (c["B"], c["Tt"]), generator=g)
        batch["targets"] = torch.randint(0, c["Vt"], (c["B"], c["Tt"]), generator=g)
    return c, model, batch


def n_params(model):
    return sum(p.numel() for p in model.parameters())  # a tied tensor is listed once


def make_adamw(model):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if name.endswith(DECAY_SUFFIXES) else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                              {"params": no_decay, "weight_decay": 0.0}], lr=1e-4, weight_decay=0.01)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: kilobytes


def median(v):
    s = sorted(v)
    n = len(s)
    if n == 0:
        return -1.0
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


# ---- the BLAS library torch loaded -------------------------------------------------------------

def loaded_blas():
    """(path, ctypes handle or None) of the OpenBLAS (or other BLAS) library mapped into this process."""
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and ("blas" in parts[5].lower()) and parts[5] not in paths:
                    paths.append(parts[5])
    except OSError:
        pass
    for p in paths:
        try:
            lib = ctypes.CDLL(p)
            lib.openblas_get_num_threads  # noqa: B018 (raises AttributeError if absent)
            return p, lib
        except (OSError, AttributeError):
            continue
    # none with OpenBLAS's API (pip's torch links MKL into libtorch_cpu; a numpy's own OpenBLAS may be mapped)
    return "libtorch:%s" % torch_blas(), None


def torch_blas():
    """The BLAS torch was built with, from its build configuration (BLAS_INFO=...)."""
    for part in torch.__config__.show().replace(",", " ").split():
        if part.startswith("BLAS_INFO="):
            return part[len("BLAS_INFO="):]
    return "?"


def blas_info(lib):
    if lib is None:
        return "?", -1
    lib.openblas_get_corename.restype = ctypes.c_char_p
    core = lib.openblas_get_corename()
    return (core.decode() if core else "?"), lib.openblas_get_num_threads()


def set_threads(threads):
    torch.set_num_threads(threads)
    path, lib = loaded_blas()
    before = blas_info(lib)[1]
    if lib is not None:
        lib.openblas_set_num_threads(threads)
    core, after = blas_info(lib)
    return dict(blas=path, blas_core=core, blas_threads_default=before, blas_threads=after,
                torch_threads=torch.get_num_threads())


# ---- modes -----------------------------------------------------------------------------------

def run_model(name, threads, compiled=False):
    quick = quick_mode()
    impl = "torch-compile" if compiled else "torch"
    base_mb = peak_rss_mb()  # the interpreter and libtorch, before any model exists
    ti = set_threads(threads)
    c, model, batch = build(name)
    opt = make_adamw(model)
    warmup = 1 if quick else c["warmup"]
    steps = 3 if quick else c["steps"]
    fwd_reps = 2 if quick else c["fwd_reps"]
    gen_reps = (1 if quick else c["gen_reps"]) if c["kind"] == "lm" and not compiled else 0
    loss_fn = model.loss
    if compiled:
        if not hasattr(torch, "compile"):
            print("SKIP impl=%s name=%s threads=%d torch=%s reason=\"torch.compile does not exist before torch 2.0\""
                  % (impl, name, threads, torch.__version__), flush=True)
            return 0
        loss_fn = torch.compile(model.loss)
    print("MODEL impl=%s name=%s threads=%d params=%d torch=%s torch_threads=%d blas=%s blas_core=%s "
          "blas_threads=%d blas_threads_default=%d omp_wait_policy=%s base_mb=%.1f"
          % (impl, name, threads, n_params(model), torch.__version__, ti["torch_threads"], ti["blas"], ti["blas_core"],
             ti["blas_threads"], ti["blas_threads_default"], os.environ.get("OMP_WAIT_POLICY", "-"), base_mb),
          flush=True)

    def step():
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(batch)
        loss.backward()
        opt.step()
        return time.perf_counter() - t0, loss

    model.train()
    t0 = time.perf_counter()
    try:
        step()  # compiles, when compiled
    except Exception as e:  # noqa: BLE001 (any failure of the compiler stack: say so, time nothing)
        if not compiled:
            raise
        msg = " ".join(("%s: %s" % (type(e).__name__, e)).split())[:300].replace('"', "'")
        print("SKIP impl=%s name=%s threads=%d torch=%s reason=\"torch.compile failed: %s\""
              % (impl, name, threads, torch.__version__, msg), flush=True)
        return 0
    first_ms = 1e3 * (time.perf_counter() - t0)
    for _ in range(warmup - 1):
        step()
    times = []
    loss = None
    for _ in range(steps):
        dt, loss = step()
        times.append(dt)
    step_ms = 1e3 * median(times)
    step_min_ms = 1e3 * min(times)
    loss_v = float(loss.detach())
    if not math.isfinite(loss_v):
        print("torch_ref: %s: the loss is not finite" % name, file=sys.stderr)
        return 1

    model.eval()
    with torch.no_grad():
        loss_fn(batch)  # compiled: compiles again for eval and no_grad
        times = []
        for _ in range(fwd_reps):
            t0 = time.perf_counter()
            loss = loss_fn(batch)
            times.append(time.perf_counter() - t0)
    fwd_ms = 1e3 * median(times)
    loss_v = float(loss)

    gen_ms_tok = -1.0
    if gen_reps:
        prompt = [int(batch["tokens"][0, 0])]
        times = []
        for _ in range(gen_reps):
            t0 = time.perf_counter()
            out = model.generate(prompt, GEN_NEW)
            times.append(time.perf_counter() - t0)
            assert len(out) == GEN_NEW
        gen_ms_tok = 1e3 * median(times) / GEN_NEW

    flops = model_flops(c)
    print("RESULT impl=%s name=%s threads=%d params=%d step_ms=%.3f step_min_ms=%.3f fwd_ms=%.3f tok_s=%.1f "
          "gflop_step=%.4f gflops=%.2f peak_mb=%.1f gen_ms_tok=%.4f loss=%.5f steps=%d first_step_ms=%.1f"
          % (impl, name, threads, n_params(model), step_ms, step_min_ms, fwd_ms, model_tokens(c) / (step_ms * 1e-3),
             flops * 1e-9, flops * 1e-9 / (step_ms * 1e-3), peak_rss_mb(), gen_ms_tok, loss_v, steps, first_ms),
          flush=True)
    return 0


def run_gen(name, threads):
    """Greedy generation of GEN_NEW tokens from 1-token prompts at batch 1, 8 and 32 (generate_batch,
    median of 3 runs after one untimed run), as `build/bench gen` times its own."""
    quick = quick_mode()
    set_threads(threads)
    c, model, batch = build(name)
    if c["kind"] != "lm":
        print("torch_ref: gen runs the decoder-only LMs only", file=sys.stderr)
        return 2
    model.eval()
    reps = 1 if quick else 3
    g = torch.Generator().manual_seed(42)
    prompts = [[int(t)] for t in torch.randint(0, c["V"], (32,), generator=g)]
    for B in (1, 8, 32):
        times = []
        for r in range(reps + 1):
            t0 = time.perf_counter()
            out = model.generate_batch(prompts[:B], GEN_NEW)
            if r:
                times.append(time.perf_counter() - t0)
            assert all(len(o) == GEN_NEW for o in out)
        ms_tok = 1e3 * median(times) / GEN_NEW
        print("GEN impl=torch name=%s threads=%d batch=%d tok_s=%.1f ms_tok=%.3f"
              % (name, threads, B, B * 1e3 / ms_tok, ms_tok), flush=True)
    return 0


def run_info():
    path, lib = loaded_blas()
    core, nthr = blas_info(lib)
    print("INFO torch=%s torch_threads=%d interop_threads=%d blas=%s blas_core=%s blas_threads=%d "
          "mkldnn=%s omp_wait_policy=%s"
          % (torch.__version__, torch.get_num_threads(), torch.get_num_interop_threads(), path, core, nthr,
             torch.backends.mkldnn.is_available(), os.environ.get("OMP_WAIT_POLICY", "-")))
    return 0


def run_params(names):
    for name in names:
        _, model, _ = build(name)
        print("PARAMS impl=torch name=%s params=%d" % (name, n_params(model)))
    return 0


def run_check(names):
    bad = 0
    for name in names:
        c, model, batch = build(name)
        if c["kind"] != "lm":
            continue
        model.eval()
        n = 24 if c["V"] > 10000 else 40
        for prompt in ([int(batch["tokens"][0, 0])], [int(t) for t in batch["tokens"][1, :5]]):
            a = model.generate(prompt, n)
            b = model.generate_full(prompt, n)
            ok = a == b
            bad += not ok
            print("CHECK name=%s prompt_len=%d new=%d kv_cache_matches_full_recompute=%s"
                  % (name, len(prompt), n, "yes" if ok else "NO"))
        prompts = [[int(t) for t in batch["tokens"][b % c["B"], b // c["B"]:b // c["B"] + 3]] for b in range(4)]
        ok = model.generate_batch(prompts, n) == [model.generate(p, n) for p in prompts]
        bad += not ok
        print("CHECK name=%s batch=4 prompt_len=3 new=%d batch_matches_one_by_one=%s" % (name, n, "yes" if ok else "NO"))
    return 1 if bad else 0


def read_dump(path):
    """The file `build/bench dump NAME FILE` writes: a header line, then "param NAME NDIM D0 D1.." /
    "ids NAME N" / "floats NAME N" lines each followed by raw data and a newline, then "scalars k=v ..."."""
    params, arrays, scalars = {}, {}, {}
    with open(path, "rb") as f:
        head = f.readline().decode().split()
        if len(head) != 3 or head[0] != "tfm-bench-dump":
            raise ValueError("%s: not a bench dump" % path)
        name = head[2]
        while True:
            line = f.readline()
            if not line:
                break
            parts = line.decode().split()
            if parts[0] == "param":
                shape = [int(x) for x in parts[3:3 + int(parts[2])]]
                n = math.prod(shape)
                params[parts[1]] = torch.frombuffer(bytearray(f.read(4 * n)), dtype=torch.float32).view(shape)
                f.read(1)
            elif parts[0] in ("ids", "floats"):
                n = int(parts[2])
                dt = torch.int32 if parts[0] == "ids" else torch.float32
                arrays[parts[1]] = torch.frombuffer(bytearray(f.read(4 * n)), dtype=dt)
                f.read(1)
            elif parts[0] == "scalars":
                scalars = {k: float(v) for k, v in (kv.split("=") for kv in parts[1:])}
    return name, params, arrays, scalars


def run_verify(path):
    """Load the C model's weights and batch into the torch model of the same name and compare the
    logits, the loss, the global gradient norm and the loss after one AdamW step."""
    torch.set_num_threads(1)
    name, params, arrays, ref = read_dump(path)
    c, model, _ = build(name)
    model.load_state_dict(params, strict=True)  # every name and shape must match, none missing
    B = c["B"]
    batch = {"tokens": arrays["tokens"].long().view(B, c["T"])}
    if c["kind"] == "s2s":
        batch["tgt_in"] = arrays["tgt_in"].long().view(B, c["Tt"])
        batch["targets"] = arrays["targets"].long().view(B, c["Tt"])
    elif c["kind"] == "lm":
        batch["targets"] = arrays["targets"].long().view(B, c["T"])
    else:
        batch["targets"] = arrays["targets"].long()
    model.train()
    opt = make_adamw(model)
    opt.zero_grad()
    if c["kind"] == "s2s":
        logits = model(batch["tokens"], batch["tgt_in"])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))
    else:
        logits = model(batch["tokens"])
        loss = (F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))
                if c["kind"] == "lm" else F.cross_entropy(logits, batch["targets"]))
    ref_logits = arrays["logits"].view(logits.shape)
    err = float((logits.detach() - ref_logits).abs().max())
    scale = float(ref_logits.abs().max())
    loss.backward()
    gnorm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None))
    opt.step()
    with torch.no_grad():
        loss1 = float(model.loss(batch))

    def rel(a, b):
        return abs(a - b) / max(abs(b), 1e-12)

    r_loss, r_g, r_l1 = rel(float(loss), ref["loss0"]), rel(gnorm, ref["grad_norm"]), rel(loss1, ref["loss1"])
    ok = err <= 1e-3 * max(scale, 1.0) and r_loss < 1e-4 and r_g < 1e-3 and r_l1 < 1e-4
    print("VERIFY name=%s torch=%s params=%d logits_max_abs_err=%.3g (max |logit| %.3g) loss ours=%.6f torch=%.6f "
          "grad_norm ours=%.6f torch=%.6f loss_after_step ours=%.6f torch=%.6f same_function=%s"
          % (name, torch.__version__, n_params(model), err, scale, ref["loss0"], float(loss), ref["grad_norm"], gnorm,
             ref["loss1"], loss1, "yes" if ok else "NO"))
    return 0 if ok else 1


def main(argv):
    if len(argv) in (4, 5) and argv[1] == "model" and argv[2] in CONFIGS and argv[4:] in ([], ["compile"]):
        return run_model(argv[2], int(argv[3]), compiled=len(argv) == 5)
    if len(argv) == 4 and argv[1] == "gen" and argv[2] in CONFIGS:
        return run_gen(argv[2], int(argv[3]))
    if len(argv) == 3 and argv[1] == "verify":
        return run_verify(argv[2])
    if len(argv) == 2 and argv[1] == "info":
        return run_info()
    if len(argv) >= 2 and argv[1] in ("params", "check"):
        names = argv[2:] or list(CONFIGS)
        unknown = [n for n in names if n not in CONFIGS]
        if unknown:
            print("torch_ref: unknown config %s" % unknown, file=sys.stderr)
            return 2
        return run_params(names) if argv[1] == "params" else run_check(names)
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    print("models: " + " ".join(CONFIGS), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
