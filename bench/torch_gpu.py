#!/usr/bin/env python3
"""PyTorch peer of bench/bench_gpu.c on the same GPU: eager fp32, the same three decoder-only LMs; with --amp
also PyTorch's fastest bf16 training (autocast, flash attention, torch.compile).

Usage:
    torch_gpu.py [--quick] [--device cuda|cpu] [--no-train] [--no-gen] [--no-tf32] [--amp] [--check]
                 [--budget SECONDS] [CONFIG...]
CONFIG defaults to $CONFIGS (names separated by spaces or commas), else char-gpt-tiny gpt-small
gpt2-124M-shape; gpt2-124M-b16 (16 x 1024) runs when named; gpu-emu-tiny is the smoke-test model of bench_gpu.c. QUICK=1 in the environment is
--quick (few steps). --device cpu runs the same code without a GPU (a smoke test of this script).
--check also compares the KV-cache generation with a full recomputation of every prefix (greedy, a few
tokens), as torch_ref.py's `check` does on the CPU. --amp (or AMP=1 in the environment; off by default)
adds the two bf16 train rows below after the fp32 and tf32 ones (decoder LMs only; --no-train drops them too).

The models are bench/torch_ref.py's DecoderLM (imported from it, not copied): torch.nn
TransformerEncoderLayer blocks, pre-LN, GELU (tanh), learned positions, tied output projection, dropout 0,
initialised from seed 1234 on the CPU and moved to the device; the batch is B rows of T random ids and
targets (seed 42); AdamW lr 1e-4, weight decay 0.01 on the matrices (torch_ref.make_adamw).
The bf16 rows use SdpaLM (below): the same GPT-2 style LM written with a fused qkv projection and
F.scaled_dot_product_attention(is_causal=True), which may pick flash attention (DecoderLM's float mask rules
that out); its parameters have DecoderLM's names and shapes and start from DecoderLM's seed-1234 weights,
so every row trains the same function from the same point on the same batch.

Measurements (each prints one RESULT line with the keys of bench_gpu.c's, impl=torch):
  train  zero_grad + forward with loss + backward + AdamW step, torch.cuda.synchronize() before each
         timer read; warm-up steps, then timed steps (up to the config's count, fewer when the time budget
         is spent, at least 3); step_ms is their median. TF32 off (tf32=0): matmuls in exact fp32, the
         peer to bench_gpu.c's default. Then the same with TF32 on (tf32=1), a second peer: what a torch
         user who allows TF32 gets (not the same arithmetic as ours at tf32=0).
  fwd    after the fp32 train row, the evaluation forward pass with the loss (model.eval() under
         torch.no_grad(), TF32 off) on the same batch, from the seed-1234 weights: 2 untimed calls, then up
         to twice the config's step count timed (half the budget); fwd_ms is their median.
  gen    greedy decoding of GEN_NEW tokens from 1-token prompts (seed 42) at batch 1, 8 and 32, TF32 off:
         an eager loop that keeps each layer's keys and values in preallocated (B,H,T,D) tensors on the
         device and runs the new row of every sequence through the layers, as a user would write it
         (torch_ref.py's generate_ids, with every tensor on the device and the chosen ids kept there).
         One untimed run, then up to 3 timed; tok_s = batch * new / median time.
  train, --amp (decoder LMs only), TF32 on for whatever stays in fp32 (tf32=1):
    prec=bf16          SdpaLM eager, forward and loss under torch.autocast(dtype=torch.bfloat16), fp32
                       master weights and plain AdamW (torch_ref.make_adamw): mixed precision as a torch
                       user writes it.
    prec=bf16-compile  the same with model = torch.compile(model) (default mode; forward and loss compiled,
                       AdamW eager). At least 2 warm-up steps, the first of which compiles (untimed);
                       compile_s = seconds of that first step (compilation of forward and backward included).
    Where a bf16 row raises (no scaled_dot_product_attention before torch 2.0, no torch.compile, a compiler
    error, out of memory) it prints FAIL impl=torch name=... prec=... reason="..." and the script goes on;
    such a FAIL does not change the exit status (a non-finite loss does).
    mfu = tflops / the GPU's dense bf16 peak (H100 SXM 989.4, H100 PCIe 756, H200 989.4, A100 312
    TFLOP/s, by device name); -1 where the device is not in that table or is the CPU.
Lines:
    INFO impl=torch torch=... device="..." cuda=... tf32_api=...
    RESULT impl=torch device=cuda mode=train name=... tf32=0|1 prec=fp32|tf32 params=... batch=... seq=...
           step_ms=... step_min_ms=... tok_s=... gflop_step=... tflops=... loss=... steps=... first_step_ms=...
           peak_mb=...
    RESULT impl=torch device=cuda mode=train name=... tf32=1 prec=bf16|bf16-compile params=... (the same keys)
           ... peak_mb=... mfu=... [compile_s=...]
    RESULT impl=torch device=cuda mode=fwd name=... tf32=0 prec=fp32 batch=... seq=... fwd_ms=... fwd_min_ms=... tok_s=...
           loss=... reps=...
    RESULT impl=torch device=cuda mode=gen name=... tf32=0 batch=... new=... tok_s=... ms_tok=... reps=...
tf32 is kept as it was (tools read it); the bf16 rows say tf32=1 too, so a reader keyed on tf32 alone would take
them for the tf32 row: prec says what a row is (fp32: exact fp32 matmuls). Table: prec bf16c = bf16-compile.
peak_mb: torch.cuda.max_memory_allocated of that measurement (-1 on the CPU).
"""

import importlib
import math
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_ref  # noqa: E402  (bench/torch_ref.py: the model code of the CPU benchmark)

GEN_NEW = torch_ref.GEN_NEW  # 127, fewer when 1 + new would not fit the model's length
DEFAULT = ["char-gpt-tiny", "gpt-small", "gpt2-124M-shape"]
# step counts on a GPU: the same as bench_gpu.c's
STEPS = {"warmup": 5, "steps": 30, "gen_reps": 3}
CONFIGS = {name: dict(torch_ref.CONFIGS[name], **STEPS) for name in DEFAULT}
CONFIGS["gpu-emu-tiny"] = dict(kind="lm", C=32, L=2, Ld=0, H=2, F=0, T=16, Tt=0, B=2, V=64, Vt=0, K=0,
                               warmup=1, steps=3, gen_reps=1)
# GPT-2 small at the batch its training used (by name only, as in bench_gpu.c)
CONFIGS["gpt2-124M-b16"] = dict(torch_ref.CONFIGS["gpt2-124M-shape"], T=1024, B=16, warmup=3, steps=10, gen_reps=1)
# train row precisions: the --amp rows after the fp32 and tf32 ones; the table's short names
AMP_PRECS = ("bf16", "bf16-compile")
PREC_SHORT = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "bf16-compile": "bf16c"}
# dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, by device name: (substrings all in the name, peak);
# the first match wins
BF16_PEAKS = [(("H100", "PCIE"), 756.0), (("H100", "NVL"), -1.0), (("H100",), 989.4), (("H200",), 989.4),
              (("A100",), 312.0)]


def bf16_peak_tflops(device):
    """The dense bf16 peak of the device from BF16_PEAKS; -1 for the CPU or a device not in it."""
    if device.type != "cuda":
        return -1.0
    name = torch.cuda.get_device_properties(device).name.upper()
    for parts, peak in BF16_PEAKS:
        if all(part in name for part in parts):
            return peak
    return -1.0


class SdpaAttention(nn.Module):
    """Causal self-attention: one fused (3C,C) qkv projection (a Linear(C,3C), kept as nn.MultiheadAttention's
    in_proj_weight/in_proj_bias so that the names match DecoderLM's), F.scaled_dot_product_attention with
    is_causal=True (no mask tensor: flash attention may run), out_proj Linear(C,C)."""

    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.in_proj_weight = nn.Parameter(torch.empty(3 * C, C))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * C))
        nn.init.xavier_uniform_(self.in_proj_weight)
        self.out_proj = nn.Linear(C, C)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x):
        B, T, C = x.shape
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias).view(B, T, 3, self.H, C // self.H)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B,H,T,D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


class SdpaBlock(nn.Module):
    """Pre-LN block: x + attn(norm1(x)), then x + linear2(gelu_tanh(linear1(norm2(x))))."""

    def __init__(self, c):
        super().__init__()
        C, Fd = c["C"], torch_ref.d_ff(c)
        self.self_attn = SdpaAttention(C, c["H"])
        self.norm1 = nn.LayerNorm(C)
        self.norm2 = nn.LayerNorm(C)
        self.linear1 = nn.Linear(C, Fd)
        self.linear2 = nn.Linear(Fd, C)

    def forward(self, x):
        x = x + self.self_attn(self.norm1(x))
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x)), approximate="tanh"))


class SdpaLM(nn.Module):
    """A GPT-2 style LM of config c for the bf16 rows: token and learned position embeddings (N(0,0.02)),
    L SdpaBlocks, a final LayerNorm, logits = x tok_emb^T (tied), cross-entropy over the targets. The same
    function, parameter names and shapes as torch_ref.DecoderLM (tok_emb, pos_emb, decoder.layers.N.*,
    decoder.norm), so DecoderLM's state_dict loads into it; forward returns the loss when given targets, so
    that torch.compile(model) compiles the loss too."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_emb = torch_ref.init_embedding(nn.Embedding(c["V"], c["C"]))
        self.pos_emb = torch_ref.init_embedding(nn.Embedding(c["T"], c["C"]))
        self.decoder = torch_ref.Stack([SdpaBlock(c) for _ in range(c["L"])], c["C"], True)

    def forward(self, tokens, targets=None):
        T = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb.weight[:T]
        for layer in self.decoder.layers:
            x = layer(x)
        logits = F.linear(self.decoder.norm(x), self.tok_emb.weight)  # tied output projection
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def loss(self, batch):
        return self(batch["tokens"], batch["targets"])


def _has(obj, name):
    """hasattr that survives torch's backends objects, whose __getattr__ raises AssertionError (1.13)."""
    try:
        getattr(obj, name)
        return True
    except Exception:  # noqa: BLE001
        return False


def set_tf32(on):
    """TF32 for float32 matmuls (and cuDNN) on or off: the fp32_precision settings where this torch has them
    (2.9 and later warn about the old flags, and refuse a mix of both), else allow_tf32. Returns which API
    it used."""
    mode = "tf32" if on else "ieee"
    matmul = torch.backends.cuda.matmul
    if _has(matmul, "fp32_precision"):
        try:
            matmul.fp32_precision = mode
            ok = matmul.fp32_precision == mode
        except Exception:  # noqa: BLE001
            ok = False
        if ok:
            for obj in (getattr(torch.backends.cudnn, "conv", None), getattr(torch.backends.cudnn, "rnn", None)):
                try:
                    obj.fp32_precision = mode
                except Exception:  # noqa: BLE001 (cuDNN does not run in these models)
                    pass
            return "fp32_precision"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = bool(on)
        torch.backends.cudnn.allow_tf32 = bool(on)
    return "allow_tf32"


def tf32_state():
    matmul = torch.backends.cuda.matmul
    if _has(matmul, "fp32_precision"):
        return "matmul.fp32_precision=%s" % matmul.fp32_precision
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return "matmul.allow_tf32=%s,cudnn.allow_tf32=%s" % (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


class Bench:
    def __init__(self, device, quick, budget):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.quick = quick
        self.budget = budget
        self.rows = []
        self.failed = False

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def build(self, c, sdpa=False):
        """torch_ref.build on config c, moved to the device: the model from seed 1234, the batch from 42.
        sdpa: an SdpaLM holding that DecoderLM's weights (load_state_dict, strict: every name and shape)."""
        torch.manual_seed(1234)
        model = torch_ref.DecoderLM(c)
        if sdpa:
            ref, model = model, SdpaLM(c)
            model.load_state_dict(ref.state_dict(), strict=True)
            del ref
        g = torch.Generator().manual_seed(42)
        tokens = torch.randint(0, c["V"], (c["B"], c["T"]), generator=g)
        targets = torch.randint(0, c["V"], (c["B"], c["T"]), generator=g)
        model.to(self.device)
        return model, {"tokens": tokens.to(self.device), "targets": targets.to(self.device)}

    def reset_peak(self):
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_mb(self):
        return torch.cuda.max_memory_allocated() / 1e6 if self.cuda else -1.0

    # ---- train -----------------------------------------------------------------------------------

    def train(self, name, c, prec):
        """One train row; prec: fp32 (TF32 off), tf32 (TF32 on), bf16 or bf16-compile (SdpaLM under autocast
        bf16, TF32 on for the rest; --amp)."""
        tf32 = 0 if prec == "fp32" else 1
        set_tf32(tf32)
        try:
            self.train_row(name, c, prec, tf32)
        finally:
            set_tf32(False)
            if prec == "bf16-compile":
                reset_dynamo()

    def train_row(self, name, c, prec, tf32):
        amp = prec in AMP_PRECS
        compiled = prec == "bf16-compile"
        if compiled and not hasattr(torch, "compile"):
            raise RuntimeError("torch %s has no torch.compile (torch 2.0 and later)" % torch.__version__)
        if amp and not hasattr(F, "scaled_dot_product_attention"):
            raise RuntimeError("torch %s has no F.scaled_dot_product_attention (torch 2.0 and later)" % torch.__version__)
        self.reset_peak()
        model, batch = self.build(c, sdpa=amp)
        model.train()
        opt = torch_ref.make_adamw(model)  # on the fp32 parameters (the master weights under autocast)
        params = torch_ref.n_params(model)
        if amp:
            fwd = torch.compile(model) if compiled else model  # compiles at its first call

            def loss_fn():
                with torch.autocast(self.device.type, dtype=torch.bfloat16):
                    return fwd(batch["tokens"], batch["targets"])
        else:
            def loss_fn():
                return model.loss(batch)

        def step():
            self.sync()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = loss_fn()
            loss.backward()
            opt.step()
            self.sync()
            return time.perf_counter() - t0, loss

        warmup = 1 if self.quick else c["warmup"]
        if compiled:
            warmup = max(warmup, 2)  # the compiling step and one more, untimed
        steps = 3 if self.quick else c["steps"]
        first, loss = step()
        for _ in range(warmup - 1):
            step()
        times, spent = [], 0.0
        while len(times) < steps and (len(times) < 3 or spent < self.budget):
            dt, loss = step()
            times.append(dt)
            spent += dt
        loss_v = float(loss.detach())
        if not math.isfinite(loss_v):
            print("torch_gpu: %s: the loss is not finite (%g)" % (name, loss_v), file=sys.stderr)
            print("FAIL impl=torch name=%s call=train prec=%s reason=loss_not_finite" % (name, prec), flush=True)
            self.failed = True
            return
        step_ms = 1e3 * torch_ref.median(times)
        flops = torch_ref.model_flops(c)
        tok_s = torch_ref.model_tokens(c) / (step_ms * 1e-3)
        tflops = flops * 1e-12 / (step_ms * 1e-3)
        extra, mfu = "", -1.0
        if amp:
            peak = bf16_peak_tflops(self.device)
            mfu = tflops / peak if peak > 0 else -1.0
            extra = " mfu=%s" % ("%.4f" % mfu if mfu >= 0 else "-1")
            if compiled:
                extra += " compile_s=%.1f" % first
        print("RESULT impl=torch device=%s mode=train name=%s tf32=%d prec=%s params=%d batch=%d seq=%d step_ms=%.3f "
              "step_min_ms=%.3f tok_s=%.1f gflop_step=%.4f tflops=%.3f loss=%.5f steps=%d first_step_ms=%.1f "
              "peak_mb=%.1f%s"
              % (self.device.type, name, tf32, prec, params, c["B"], c["T"], step_ms, 1e3 * min(times),
                 tok_s, flops * 1e-9, tflops, loss_v, len(times), 1e3 * first, self.peak_mb(), extra), flush=True)
        self.rows.append((name, "train", prec, c["B"], step_ms, tok_s, tflops, mfu))

    @torch.no_grad()
    def fwd(self, name, c):
        """The evaluation forward pass with the loss (model.eval(), torch.no_grad(), TF32 off) on the bench batch:
        2 untimed calls, then up to 2 * the config's steps timed (half the budget), the median."""
        model, batch = self.build(c)
        model.eval()
        times, spent, loss = [], 0.0, None
        steps = 3 if self.quick else 2 * c["steps"]
        for i in range(-2, 10**9):
            if i >= 0 and not (len(times) < steps and (len(times) < 3 or spent < self.budget / 2)):
                break
            self.sync()
            t0 = time.perf_counter()
            loss = model.loss(batch)
            self.sync()
            if i >= 0:
                times.append(time.perf_counter() - t0)
                spent += times[-1]
        ms = 1e3 * torch_ref.median(times)
        print("RESULT impl=torch device=%s mode=fwd name=%s tf32=0 prec=fp32 batch=%d seq=%d fwd_ms=%.3f fwd_min_ms=%.3f "
              "tok_s=%.1f loss=%.5f reps=%d"
              % (self.device.type, name, c["B"], c["T"], ms, 1e3 * min(times), c["B"] * c["T"] / (ms * 1e-3), float(loss),
                 len(times)), flush=True)

    def train_amp(self, name, c):
        """The --amp rows of config c, each on its own: a row that raises prints a FAIL line and the next runs."""
        if c["kind"] != "lm":
            print('SKIP impl=torch name=%s prec=%s reason="the bf16 rows are for the decoder LMs (kind=lm), not kind=%s"'
                  % (name, ",".join(AMP_PRECS), c["kind"]), flush=True)
            return
        for prec in AMP_PRECS:
            try:
                self.train(name, c, prec)
            except Exception as e:  # noqa: BLE001 (no SDPA or torch.compile, a compiler error, out of memory)
                msg = one_line(e)
                print("torch_gpu: %s prec=%s: %s" % (name, prec, msg), file=sys.stderr)
                print('FAIL impl=torch name=%s prec=%s reason="%s"' % (name, prec, msg.replace('"', "'")), flush=True)

    # ---- gen -------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, model, prompts, n_new):
        """Greedy decoding of n_new tokens after prompts (B,P) on the device: torch_ref.py's cache loop
        (generate_ids), the chosen ids kept on the device until the end. Returns (B, n_new) ids."""
        return model.generate_ids(prompts, n_new)

    def gen(self, name, c, check=False):
        set_tf32(False)
        self.reset_peak()
        model, _ = self.build(c)
        model.eval()
        n_new = min(GEN_NEW, c["T"] - 1)
        g = torch.Generator().manual_seed(42)
        prompts = torch.randint(0, c["V"], (32, 1), generator=g).to(self.device)
        if check:
            self.check_gen(name, model, prompts)
        reps = 1 if self.quick else c["gen_reps"]
        for B in (1, 8, 32):
            times, spent, r = [], 0.0, -1
            while r < reps and (r < 1 or spent < self.budget):  # one untimed run first
                self.sync()
                t0 = time.perf_counter()
                out = self.generate(model, prompts[:B], n_new)
                self.sync()
                if r >= 0:
                    times.append(time.perf_counter() - t0)
                    spent += times[-1]
                r += 1
                if tuple(out.shape) != (B, n_new) or int(out.min()) < 0 or int(out.max()) >= c["V"]:
                    print("FAIL impl=torch name=%s call=generate batch=%d reason=bad_output" % (name, B), flush=True)
                    self.failed = True
                    return
            ms_tok = 1e3 * torch_ref.median(times) / n_new
            tok_s = B * 1e3 / ms_tok
            print("RESULT impl=torch device=%s mode=gen name=%s tf32=0 batch=%d new=%d tok_s=%.1f ms_tok=%.4f reps=%d"
                  % (self.device.type, name, B, n_new, tok_s, ms_tok, len(times)), flush=True)
            self.rows.append((name, "gen", "fp32", B, ms_tok, tok_s, -1.0, -1.0))

    @torch.no_grad()
    def check_gen(self, name, model, prompts):
        """The cache loop against recomputing every prefix, greedy, batch 4, a few tokens."""
        n = min(8, model.c["T"] - 1)
        a = self.generate(model, prompts[:4], n)
        seq = prompts[:4].clone()
        for _ in range(n):
            logits = model(seq)
            seq = torch.cat([seq, torch.argmax(logits[:, -1], dim=-1, keepdim=True)], dim=1)
        ok = torch.equal(a, seq[:, 1:])
        print("CHECK impl=torch name=%s batch=4 new=%d kv_cache_matches_full_recompute=%s" % (name, n, "yes" if ok else "NO"),
              flush=True)
        if not ok:
            self.failed = True

    def table(self):
        if not self.rows:
            return
        amp = any(prec in AMP_PRECS for _, _, prec, _, _, _, _, _ in self.rows)
        print("\n== torch %s on %s (prec fp32: eager, exact fp32 matmuls; tf32: eager, TF32 tensor-core matmuls%s)"
              % (torch.__version__, self.device_name(),
                 "; bf16: SdpaLM eager under autocast bf16; bf16c: the same under torch.compile" if amp else ""))
        print("%-18s %-6s %5s %5s %12s %12s %8s%s" % ("config", "mode", "prec", "batch", "ms", "tokens/s", "TFLOP/s",
                                                     "      MFU" if amp else ""))
        for name, mode, prec, B, ms, tok_s, tflops, mfu in self.rows:
            print("%-18s %-6s %5s %5d %12.3f %12.0f %8s%s"
                  % (name, mode, PREC_SHORT[prec], B, ms, tok_s, "%.2f" % tflops if tflops >= 0 else "-",
                     (" %8s" % ("%.1f%%" % (100 * mfu) if mfu >= 0 else "-")) if amp else ""))
        print("ms: train = median step (zero_grad, forward, backward, AdamW); gen = ms per new token of the whole batch")
        if amp:
            peak = bf16_peak_tflops(self.device)
            print("MFU: TFLOP/s over the dense bf16 peak of the device (%s), bf16 rows only"
                  % ("%.1f TFLOP/s" % peak if peak > 0 else "not known here"))

    def device_name(self):
        if not self.cuda:
            return "cpu (%d threads)" % torch.get_num_threads()
        p = torch.cuda.get_device_properties(self.device)
        return "%s, %.1f GiB, sm_%d%d" % (p.name, p.total_memory / 2**30, p.major, p.minor)


def one_line(e):
    return " ".join(("%s: %s" % (type(e).__name__, e)).split())[:300]


def reset_dynamo():
    """Drop torch.compile's caches after a compiled row (the next config's model is a new module)."""
    try:
        importlib.import_module("torch._dynamo").reset()
    except Exception:  # noqa: BLE001 (torch 1.13: no dynamo, nothing to drop)
        pass


def main(argv):
    quick = os.environ.get("QUICK", "") not in ("", "0")
    amp = os.environ.get("AMP", "") not in ("", "0")
    device, budget, do_train, do_gen, do_tf32, check = "cuda", 8.0, True, True, True, False
    names = []
    if os.environ.get("BENCH_GPU_BUDGET"):
        budget = float(os.environ["BENCH_GPU_BUDGET"])
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--quick":
            quick = True
        elif a == "--device" and i + 1 < len(argv):
            device = argv[i + 1]
            i += 1
        elif a == "--budget" and i + 1 < len(argv):
            budget = float(argv[i + 1])
            i += 1
        elif a == "--no-train":
            do_train = False
        elif a == "--no-gen":
            do_gen = False
        elif a == "--no-tf32":
            do_tf32 = False
        elif a == "--amp":
            amp = True
        elif a == "--check":
            check = True
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        elif a in CONFIGS:
            names.append(a)
        else:
            print("torch_gpu: unknown argument %r (configs: %s)" % (a, " ".join(CONFIGS)), file=sys.stderr)
            return 2
        i += 1
    if not names and os.environ.get("CONFIGS"):
        names = os.environ["CONFIGS"].replace(",", " ").split()
        unknown = [n for n in names if n not in CONFIGS]
        if unknown:
            print("torch_gpu: unknown config %s in CONFIGS (known: %s)" % (unknown, " ".join(CONFIGS)), file=sys.stderr)
            return 2
    names = names or DEFAULT
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("torch_gpu: torch %s sees no CUDA device (use --device cpu for a smoke run)" % torch.__version__,
              file=sys.stderr)
        print("FAIL impl=torch call=torch.cuda.is_available", flush=True)
        return 3
    b = Bench(device, quick, budget)
    api = set_tf32(False)
    print('INFO impl=torch torch=%s device="%s" cuda=%s tf32_api=%s %s quick=%d budget_s=%.1f'
          % (torch.__version__, b.device_name(), torch.version.cuda, api, tf32_state(), quick, budget), flush=True)
    for name in names:
        c = CONFIGS[name]
        try:
            if do_train:
                b.train(name, c, "fp32")
                b.fwd(name, c)
                if do_tf32:
                    b.train(name, c, "tf32")
                if amp:
                    b.train_amp(name, c)
            if do_gen:
                b.gen(name, c, check)
        except Exception as e:  # noqa: BLE001 (one config's failure, e.g. out of memory, must not hide the others)
            msg = one_line(e)
            print("torch_gpu: %s: %s" % (name, msg), file=sys.stderr)
            print('FAIL impl=torch name=%s reason="%s"' % (name, msg.replace('"', "'")), flush=True)
            b.failed = True
            set_tf32(False)
    b.table()
    return 1 if b.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
