#!/usr/bin/env python3
"""PyTorch peer of bench/bench_gpu.c on the same GPU: eager fp32, the same three decoder-only LMs.

Usage:
    torch_gpu.py [--quick] [--device cuda|cpu] [--no-train] [--no-gen] [--no-tf32] [--check]
                 [--budget SECONDS] [CONFIG...]
CONFIG defaults to $CONFIGS (names separated by spaces or commas), else char-gpt-tiny gpt-small
gpt2-124M-shape; gpt2-124M-b16 (16 x 1024) runs when named; gpu-emu-tiny is the smoke-test model of bench_gpu.c. QUICK=1 in the environment is
--quick (few steps). --device cpu runs the same code without a GPU (a smoke test of this script).
--check also compares the KV-cache generation with a full recomputation of every prefix (greedy, a few
tokens), as torch_ref.py's `check` does on the CPU.

The models are bench/torch_ref.py's DecoderLM (imported from it, not copied): torch.nn
TransformerEncoderLayer blocks, pre-LN, GELU (tanh), learned positions, tied output projection, dropout 0,
initialised from seed 1234 on the CPU and moved to the device; the batch is B rows of T random ids and
targets (seed 42); AdamW lr 1e-4, weight decay 0.01 on the matrices (torch_ref.make_adamw).

Measurements (each prints one RESULT line with the keys of bench_gpu.c's, impl=torch):
  train  zero_grad + forward with loss + backward + AdamW step, torch.cuda.synchronize() before each
         timer read; warm-up steps, then timed steps (up to the config's count, fewer when the time budget
         is spent, at least 3); step_ms is their median. TF32 off (tf32=0): matmuls in exact fp32, the
         peer to bench_gpu.c's default. Then the same with TF32 on (tf32=1), a second peer: what a torch
         user who allows TF32 gets (not the same arithmetic as ours at tf32=0).
  gen    greedy decoding of GEN_NEW tokens from 1-token prompts (seed 42) at batch 1, 8 and 32, TF32 off:
         an eager loop that keeps each layer's keys and values in preallocated (B,H,T,D) tensors on the
         device and runs the new row of every sequence through the layers, as a user would write it
         (torch_ref.py's generate_ids, with every tensor on the device and the chosen ids kept there).
         One untimed run, then up to 3 timed; tok_s = batch * new / median time.
Lines:
    INFO impl=torch torch=... device="..." cuda=... tf32_api=...
    RESULT impl=torch device=cuda mode=train name=... tf32=0|1 params=... batch=... seq=... step_ms=...
           step_min_ms=... tok_s=... gflop_step=... tflops=... loss=... steps=... first_step_ms=... peak_mb=...
    RESULT impl=torch device=cuda mode=gen name=... tf32=0 batch=... new=... tok_s=... ms_tok=... reps=...
peak_mb: torch.cuda.max_memory_allocated of that measurement (-1 on the CPU).
"""

import math
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

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

    def build(self, c):
        """torch_ref.build on config c, moved to the device: the model from seed 1234, the batch from 42."""
        torch.manual_seed(1234)
        model = torch_ref.DecoderLM(c)
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

    def train(self, name, c, tf32):
        set_tf32(tf32)
        self.reset_peak()
        model, batch = self.build(c)
        model.train()
        opt = torch_ref.make_adamw(model)

        def step():
            self.sync()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = model.loss(batch)
            loss.backward()
            opt.step()
            self.sync()
            return time.perf_counter() - t0, loss

        warmup = 1 if self.quick else c["warmup"]
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
            print("FAIL impl=torch name=%s call=train reason=loss_not_finite" % name, flush=True)
            self.failed = True
            return
        step_ms = 1e3 * torch_ref.median(times)
        flops = torch_ref.model_flops(c)
        tok_s = torch_ref.model_tokens(c) / (step_ms * 1e-3)
        tflops = flops * 1e-12 / (step_ms * 1e-3)
        print("RESULT impl=torch device=%s mode=train name=%s tf32=%d params=%d batch=%d seq=%d step_ms=%.3f "
              "step_min_ms=%.3f tok_s=%.1f gflop_step=%.4f tflops=%.3f loss=%.5f steps=%d first_step_ms=%.1f "
              "peak_mb=%.1f"
              % (self.device.type, name, tf32, torch_ref.n_params(model), c["B"], c["T"], step_ms, 1e3 * min(times),
                 tok_s, flops * 1e-9, tflops, loss_v, len(times), 1e3 * first, self.peak_mb()), flush=True)
        self.rows.append((name, "train", tf32, c["B"], step_ms, tok_s, tflops))
        set_tf32(False)

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
            self.rows.append((name, "gen", 0, B, ms_tok, tok_s, -1.0))

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
        print("\n== torch %s eager fp32 on %s (tf32=1: TF32 tensor-core matmuls)" % (torch.__version__, self.device_name()))
        print("%-18s %-6s %4s %5s %12s %12s %8s" % ("config", "mode", "tf32", "batch", "ms", "tokens/s", "TFLOP/s"))
        for name, mode, tf32, B, ms, tok_s, tflops in self.rows:
            print("%-18s %-6s %4d %5d %12.3f %12.0f %8s"
                  % (name, mode, tf32, B, ms, tok_s, "%.2f" % tflops if tflops >= 0 else "-"))
        print("ms: train = median step (zero_grad, forward, backward, AdamW); gen = ms per new token of the whole batch")

    def device_name(self):
        if not self.cuda:
            return "cpu (%d threads)" % torch.get_num_threads()
        p = torch.cuda.get_device_properties(self.device)
        return "%s, %.1f GiB, sm_%d%d" % (p.name, p.total_memory / 2**30, p.major, p.minor)


def main(argv):
    quick = os.environ.get("QUICK", "") not in ("", "0")
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
                b.train(name, c, 0)
                if do_tf32:
                    b.train(name, c, 1)
            if do_gen:
                b.gen(name, c, check)
        except Exception as e:  # noqa: BLE001 (one config's failure, e.g. out of memory, must not hide the others)
            msg = " ".join(("%s: %s" % (type(e).__name__, e)).split())[:300]
            print("torch_gpu: %s: %s" % (name, msg), file=sys.stderr)
            print('FAIL impl=torch name=%s reason="%s"' % (name, msg.replace('"', "'")), flush=True)
            b.failed = True
            set_tf32(False)
    b.table()
    return 1 if b.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
