#!/usr/bin/env python3
"""Choose an example's training recipe fast: train PyTorch copies of examples/fashion.c's and
examples/charlm.c's models (same architecture, initialisation, optimizer, schedule, augmentation and
scoring) for the compute the C example gets in its time budget, on a GPU, many settings at once.

The settings this ranks are then run for real with the C example; only those runs are reported as
results. The copies differ from the C programs in their random numbers (splits, windows, flips,
initial weights), so expect the two to agree within one run's noise, not to the digit.

    python3 tools/recipe_sweep.py prep DIR           # the data as DIR/data.npz, from Debian's
                                                     # dataset-fashion-mnist and bible-kjv-text
    python3 tools/recipe_sweep.py run DIR TASK K N   # on the GPU: settings K, K+N, K+2N, ... of TASK

TASK is fashion or charlm; each finished setting appends a JSON line (its scores and its curve) to
TASK.jsonl in $SWEEP_OUT (default DIR); SWEEP_ONLY=name,name runs those settings alone. Start N
processes (K = 0..N-1) to run settings side by side; on one GPU without MPS, sixteen at once ran
about 3.6 times slower each than four did. The copies use the layer of transformer.h's pre-LN block
(tfm_block, as torch.nn.TransformerEncoderLayer with norm_first) written with
scaled_dot_product_attention so that many small models run fast; tools/torch_models.py is the
layer-by-layer mirror the tests use.

Checked against the C example: charlm's defaults scored 1.625 bits per character on the test split
here against 1.616 in C (validation 1.699 against 1.692).
"""

import gzip
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- the settings to rank ------------------------------------------------------------------------
# speed: what the C example trains per second at two threads on the 2-core machine (30-second runs
# with the same options vary by +-20% there, so the settings' speeds relative to the defaults are
# their multiply-adds per token relative to the defaults', which the runs agree with); the budget in
# examples is speed x seconds.
FASHION_BUDGET_S = 1740
FASHION = [
    dict(name="default"),
    dict(name="default-seed2", seed=2),
    dict(name="lr2e-3", lr=2e-3),
    dict(name="lr5e-4", lr=5e-4),
    dict(name="wd0.1", wd=0.1),
    dict(name="smooth0.1", smoothing=0.1),
    dict(name="erase0.25", erase=0.25),
    dict(name="erase0.5", erase=0.5),
    dict(name="dropout0.1", dropout=0.1),
    dict(name="batch128-lr2e-3", batch=128, lr=2e-3),
    dict(name="dff512", d_ff=512, speed=520),
    dict(name="layers6", layers=6, speed=500),
    dict(name="d192-h6-ff384", d_model=192, heads=6, d_ff=384, speed=350),
    dict(name="heads8", heads=8, speed=700),
    dict(name="erase0.25-smooth0.1", erase=0.25, smoothing=0.1),
    dict(name="layers6-erase0.25", layers=6, erase=0.25, speed=500),
    dict(name="warmup10", warmup=0.10),
    dict(name="minlr0", min_lr=0.0),
    dict(name="beta2-0.99", beta2=0.99),
    dict(name="batch128", batch=128),
]
FASHION_DEFAULT = dict(seed=1, lr=1e-3, wd=0.05, smoothing=0.0, erase=0.0, dropout=0.0, batch=64, d_model=128,
                       heads=4, layers=4, d_ff=256, warmup=0.05, min_lr=None, beta2=0.999, speed=750)

CHARLM_BUDGET_S = 3600
CHARLM = [
    dict(name="default"),
    dict(name="default-seed2", seed=2),
    dict(name="lr2e-3", lr=2e-3),
    dict(name="lr3e-3", lr=3e-3),
    dict(name="dropout0.2", dropout=0.2),
    dict(name="dropout0.2-lr2e-3", dropout=0.2, lr=2e-3),
    dict(name="dropout0", dropout=0.0),
    dict(name="wd0.3", wd=0.3),
    dict(name="len256-b16", len=256, batch=16, speed=6750),
    dict(name="len256-b16-lr2e-3", len=256, batch=16, lr=2e-3, speed=6750),
    dict(name="batch64-lr2e-3", batch=64, lr=2e-3),
    dict(name="layers6", layers=6, speed=4850),
    dict(name="layers6-dropout0.2", layers=6, dropout=0.2, speed=4850),
    dict(name="d384-h6", d_model=384, heads=6, speed=3400),
    dict(name="d384-h6-dropout0.2", d_model=384, heads=6, dropout=0.2, speed=3400),
    dict(name="minlr-lr/100", min_lr_div=100),
    dict(name="beta2-0.999", beta2=0.999),
    dict(name="layers3", layers=3, speed=9700),
    dict(name="dropout0.05", dropout=0.05),
    dict(name="dropout0-layers6", dropout=0.0, layers=6, speed=4850),
    dict(name="dropout0-len256-b16", dropout=0.0, len=256, batch=16, speed=6750),
]
CHARLM_DEFAULT = dict(seed=1, lr=1e-3, wd=0.1, dropout=0.1, batch=32, len=128, d_model=256, heads=4, layers=4,
                      d_ff=0, beta2=0.99, min_lr_div=10, speed=7276)


# ---- the model: transformer.h's pre-LN block, as torch.nn.TransformerEncoderLayer(norm_first) ----

class Block(nn.Module):
    def __init__(self, C, H, Fd, p):
        super().__init__()
        self.H, self.p = H, p
        self.norm1, self.norm2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc1, self.fc2 = nn.Linear(C, Fd), nn.Linear(Fd, C)

    def forward(self, x, causal):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4)
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:  # torch 1.x
            s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            if causal:
                s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            a = s.softmax(-1) @ v
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(B, T, C)), self.p, self.training)
        h = F.dropout(F.gelu(self.fc1(self.norm2(x))), self.p, self.training)
        return x + F.dropout(self.fc2(h), self.p, self.training)


class Net(nn.Module):
    """fashion: input_proj of continuous tokens, mean pooling, head (Xavier, as cfg.init XAVIER);
    charlm: token embedding tied to the output (N(0, 0.02), the library's default init)."""

    def __init__(self, C, H, L, Fd, p, T, input_dim=0, vocab=0, n_classes=0, xavier=False):
        super().__init__()
        self.p = p
        self.inp = nn.Linear(input_dim, C) if input_dim else nn.Embedding(vocab, C)
        self.pos = nn.Parameter(torch.zeros(T, C))
        self.blocks = nn.ModuleList([Block(C, H, Fd, p) for _ in range(L)])
        self.norm = nn.LayerNorm(C)
        self.head = nn.Linear(C, n_classes) if n_classes else None
        emb_std = 1 / math.sqrt(C) if xavier else 0.02
        for name, w in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(w)
            elif "norm" in name:
                nn.init.ones_(w)
            elif name in ("pos", "inp.weight") and not (name == "inp.weight" and input_dim):
                nn.init.normal_(w, 0, emb_std)
            elif xavier:
                nn.init.xavier_uniform_(w)
            else:
                nn.init.normal_(w, 0, 0.02)

    def forward(self, x, causal=False):
        x = F.dropout(self.inp(x) + self.pos[: x.shape[1]], self.p, self.training)
        for b in self.blocks:
            x = b(x, causal)
        x = self.norm(x)
        if self.head is not None:
            return self.head(x.mean(1))
        return x @ self.inp.weight.t()


def adamw(model, lr, wd, beta2):
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and n not in ("pos", "inp.weight")
             or (n == "inp.weight" and isinstance(model.inp, nn.Linear))]
    ids = {id(p) for p in decay}
    rest = [p for p in model.parameters() if id(p) not in ids]
    return torch.optim.AdamW([dict(params=decay, weight_decay=wd), dict(params=rest, weight_decay=0.0)], lr=lr,
                             betas=(0.9, beta2), eps=1e-8,
                             **(dict(fused=True) if torch.cuda.is_available() else {}))


def cosine(step, lr, warmup, total, min_lr):
    """tfm__lr's cosine schedule; step counts from 1."""
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    p = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))


# ---- fashion -------------------------------------------------------------------------------------

def fashion_tokens(img):
    """img (B,28,28) scaled pixels -> (B,49,64): each 4x4 patch's token is the 8x8 pixels around it,
    black (scaled 0) beyond the edge, row by row."""
    black = (0 - 0.286) / 0.353
    x = F.pad(img[:, None], (2, 2, 2, 2), value=black)
    return F.unfold(x, 8, stride=4).transpose(1, 2)


def fashion_erase(img, share, gen):
    """Random erasing of a share of the images (2-40% of the area, aspect 0.3-3.3, uniform noise)."""
    B = img.shape[0]
    for i in torch.nonzero(torch.rand(B, generator=gen) < share).flatten().tolist():
        while True:
            area = (0.02 + 0.38 * torch.rand(1, generator=gen).item()) * 784
            aspect = math.exp(math.log(0.3) + (math.log(3.3) - math.log(0.3)) * torch.rand(1, generator=gen).item())
            h, w = int(math.sqrt(area * aspect) + 0.5), int(math.sqrt(area / aspect) + 0.5)
            if 1 <= h <= 28 and 1 <= w <= 28:
                break
        y0 = int(torch.randint(0, 28 - h + 1, (1,), generator=gen))
        x0 = int(torch.randint(0, 28 - w + 1, (1,), generator=gen))
        img[i, y0:y0 + h, x0:x0 + w] = (torch.rand(h, w, generator=gen, device="cpu").to(img.device) - 0.286) / 0.353
    return img


def fashion_score(model, pix, labels, dev):
    model.eval()
    right, nll = 0, 0.0
    with torch.no_grad():
        for s in range(0, len(pix), 1000):
            x = (torch.as_tensor(pix[s:s + 1000], device=dev).float() / 255 - 0.286) / 0.353
            pr = (F.softmax(model(fashion_tokens(x)), -1) + F.softmax(model(fashion_tokens(x.flip(2))), -1)) / 2
            y = torch.as_tensor(labels[s:s + 1000], device=dev).long()
            right += int((pr.argmax(1) == y).sum())
            nll += float(-torch.log(pr.gather(1, y[:, None]).clamp_min(1e-12)).sum())
    model.train()
    return right / len(pix), nll / len(pix)


def run_fashion(d, c, dev, log):
    g = np.random.default_rng(1)  # the split (the C example's differs: its own generator)
    order = g.permutation(60000)
    tr, va = order[:55000], order[55000:]
    trp = torch.as_tensor(d["f_train_x"][tr], device=dev)
    trl = torch.as_tensor(d["f_train_y"][tr], device=dev).long()
    torch.manual_seed(c["seed"])
    gen = torch.Generator().manual_seed(c["seed"])
    model = Net(c["d_model"], c["heads"], c["layers"], c["d_ff"], c["dropout"], 49, input_dim=64, n_classes=10,
                xavier=True).to(dev)
    opt = adamw(model, c["lr"], c["wd"], c["beta2"])
    images = c["speed"] * FASHION_BUDGET_S * 0.97  # the validations take about 3% of the budget
    total = int(images // c["batch"])
    warm = int(total * c["warmup"])
    min_lr = c["lr"] / 100 if c["min_lr"] is None else c["min_lr"]
    per_epoch = 55000 // c["batch"]
    t0, step, curve = time.time(), 0, []
    while step < total:
        perm = torch.randperm(55000, device=dev)
        for k in range(per_epoch):
            if step >= total:
                break
            step += 1
            idx = perm[k * c["batch"]:(k + 1) * c["batch"]]
            x = (trp[idx].float() / 255 - 0.286) / 0.353
            flip = torch.rand(len(idx), device=dev) < 0.5
            x = torch.where(flip[:, None, None], x.flip(2), x)
            if c["erase"] > 0:
                x = fashion_erase(x, c["erase"], gen)
            for grp in opt.param_groups:
                grp["lr"] = cosine(step, c["lr"], warm, total, min_lr)
            loss = F.cross_entropy(model(fashion_tokens(x)), trl[idx], label_smoothing=c["smoothing"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % 2000 == 0 or step == total:
                acc, nll = fashion_score(model, d["f_train_x"][va], d["f_train_y"][va], dev)
                curve.append((step, round(loss.item(), 4), round(acc, 4), round(nll, 4)))
                log("  %s step %d/%d loss %.4f val %.4f (%.4f) %.0fs" % (c["name"], step, total, loss.item(), acc,
                                                                        nll, time.time() - t0))
    va_acc, va_nll = fashion_score(model, d["f_train_x"][va], d["f_train_y"][va], dev)
    te_acc, te_nll = fashion_score(model, d["f_test_x"], d["f_test_y"], dev)
    return dict(epochs=round(total * c["batch"] / 55000, 2), val_acc=va_acc, val_nll=va_nll, test_acc=te_acc,
                test_nll=te_nll, curve=curve)


# ---- charlm --------------------------------------------------------------------------------------

def kjv_ids(text):
    """ids as examples/charlm.c's char_id, and its 90/5/5 cuts by verse."""
    b = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    ids = np.where(b == 10, 95, b - 32)
    nl = np.nonzero(b == 10)[0]
    nv = len(nl)
    cut_val = nl[nv * 90 // 100 - 1] + 1
    cut_test = nl[nv * 95 // 100 - 1] + 1
    return ids, int(cut_val), int(cut_test)


def bpc(model, ids, T, dev, batch=64):
    """Windows of T overlapping by half; the second half of each is scored (the first window: all)."""
    model.eval()
    n, half, start, nats, counted = len(ids), T // 2, 0, 0.0, 0
    ids_t = torch.as_tensor(ids, device=dev)
    with torch.no_grad():
        while start + 1 < n:
            toks, tgts = [], []
            while len(toks) < batch and start + 1 < n:
                tok = torch.zeros(T, dtype=torch.long, device=dev)
                tgt = torch.full((T,), -100, dtype=torch.long, device=dev)
                m = min(T, n - start)
                tok[:m] = ids_t[start:start + m]
                m1 = min(T, n - start - 1)
                tgt[:m1] = ids_t[start + 1:start + 1 + m1]
                if start:
                    tgt[:half] = -100
                toks.append(tok)
                tgts.append(tgt)
                if start + T >= n:
                    start = n
                    break
                start += half
            logits = model(torch.stack(toks), causal=True)
            tg = torch.stack(tgts)
            nats += float(F.cross_entropy(logits.reshape(-1, 96), tg.reshape(-1), ignore_index=-100,
                                          reduction="sum"))
            counted += int((tg != -100).sum())
    model.train()
    return nats / counted / math.log(2)


def run_charlm(d, c, dev, log):
    ids, cut_val, cut_test = kjv_ids(d["kjv"].tobytes())
    train = torch.as_tensor(ids[:cut_val], device=dev)
    torch.manual_seed(c["seed"])
    T, B = c["len"], c["batch"]
    model = Net(c["d_model"], c["heads"], c["layers"], c["d_ff"] or 4 * c["d_model"], c["dropout"], T,
                vocab=96).to(dev)
    opt = adamw(model, c["lr"], c["wd"], c["beta2"])
    total = int(c["speed"] * CHARLM_BUDGET_S * 0.97 // (B * T))
    min_lr = c["lr"] / c["min_lr_div"]
    ar = torch.arange(T + 1, device=dev)
    t0, curve = time.time(), []
    for step in range(1, total + 1):
        s = torch.randint(0, cut_val - T - 1, (B,), device=dev)
        w = train[s[:, None] + ar]
        for grp in opt.param_groups:
            grp["lr"] = cosine(step, c["lr"], 100, total, min_lr)
        logits = model(w[:, :-1], causal=True)
        loss = F.cross_entropy(logits.reshape(-1, 96), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 1000 == 0 or step == total:
            v = bpc(model, ids[cut_val:cut_val + 50000], T, dev)
            curve.append((step, round(loss.item() / math.log(2), 4), round(v, 4)))
            log("  %s step %d/%d train %.4f val50k %.4f %.0fs" % (c["name"], step, total, loss.item() / math.log(2),
                                                                   v, time.time() - t0))
    return dict(passes=round(total * B * T / cut_val, 2), val_bpc=bpc(model, ids[cut_val:cut_test], T, dev),
                test_bpc=bpc(model, ids[cut_test:], T, dev), curve=curve)


# ---- driver --------------------------------------------------------------------------------------

def kjv_text(path="/usr/lib/bible.data"):
    """The text examples/common.h's ex_kjv_read gives: bible.data's blocks are Unix compress (LZW)
    streams without their header (gzip -dc decodes them with it put back); the title line is dropped
    and each verse's reference tag ("Ge1:1 ") removed."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[0x58:0x5c], "big")
    offs = [int.from_bytes(raw[0x5c + 4 * i:0x60 + 4 * i], "big") for i in range(n + 1)]
    text = b"".join(subprocess.run(["gzip", "-dc"], input=b"\x1f\x9d\x90" + raw[a:b], capture_output=True).stdout
                    for a, b in zip(offs, offs[1:]))
    lines = text.split(b"\n")[1:]
    if lines and lines[-1] == b"":
        lines.pop()
    return b"".join((ln.split(b" ", 1)[1] if b" " in ln else b"") + b"\n" for ln in lines)


def prep(out):
    def idx(path):
        with gzip.open(path) as f:
            raw = f.read()
        dims = raw[3]
        shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
        return np.frombuffer(raw[4 + 4 * dims:], dtype=np.uint8).reshape(shape)
    fm = "/usr/share/datasets/fashion-mnist/"
    kjv = np.frombuffer(kjv_text(), dtype=np.uint8)
    np.savez_compressed(os.path.join(out, "data.npz"), f_train_x=idx(fm + "train-images-idx3-ubyte.gz"),
                        f_train_y=idx(fm + "train-labels-idx1-ubyte.gz"), f_test_x=idx(fm + "t10k-images-idx3-ubyte.gz"),
                        f_test_y=idx(fm + "t10k-labels-idx1-ubyte.gz"), kjv=kjv)


def main():
    if sys.argv[1] == "prep":
        return prep(sys.argv[2])
    out, task, k, n = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    scale = float(os.environ.get("SWEEP_SCALE", "1"))  # < 1: a quick trial of the script itself
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    d = dict(np.load(os.path.join(out, "data.npz")))
    table, base, fn = (FASHION, FASHION_DEFAULT, run_fashion) if task == "fashion" else \
        (CHARLM, CHARLM_DEFAULT, run_charlm)
    path = os.path.join(os.environ.get("SWEEP_OUT", out), "%s.jsonl" % task)

    def log(s):
        print(s, flush=True)
    only = os.environ.get("SWEEP_ONLY")  # names, comma-separated: these settings alone
    if only:
        table = [t for name in only.split(",") for t in table if t["name"] == name]
    for i in range(k, len(table), n):
        c = dict(base)
        c.update(table[i])
        c["speed"] = c["speed"] * scale
        t0 = time.time()
        r = fn(d, c, dev, log)
        r.update(config=c, seconds=round(time.time() - t0, 1))
        log("%s %s: %s" % (task, c["name"], json.dumps({k2: v for k2, v in r.items() if k2 != "curve"})))
        with open(path, "a") as f:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
