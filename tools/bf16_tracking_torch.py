#!/usr/bin/env python3
"""tools/bf16_tracking_torch.py - the peer of tools/bf16_tracking.cpp in PyTorch: does autocast bf16 track fp32?

The same small character LM (a pre-LN decoder: 2 layers, d_model 32, 4 heads, d_ff 96, GELU (tanh), learned
positions, biases, the output tied to the token embedding, N(0, 0.02) weights), the same batches (8 random
windows of 32 bytes of a text file, ids byte & 127, drawn by the same generator) and the same AdamW (lr 3e-3,
weight decay 0.01 on the matrices, clip 1, cosine from step 20 to 3e-4), trained STEPS steps twice from the
same weights: in fp32, and under torch.autocast with bf16 (the linear maps and attention's products in bf16,
as PyTorch users run mixed precision). Prints the 25-step means of both runs' losses and their relative
difference, and the worst single step, in bf16_tracking.cpp's format. Its weights are PyTorch's draw, not
ours, so compare the gap, not the losses.

    python3 tools/bf16_tracking_torch.py TEXT [STEPS [SEED [DEVICE]]]    DEVICE cpu (default) or cuda
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, V, C, H, FF, L = 8, 32, 128, 32, 4, 96, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc1, self.fc2 = nn.Linear(C, FF), nn.Linear(FF, C)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(F, "scaled_dot_product_attention") \
            else causal_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def causal_attention(q, k, v):  # torch before 2.0
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln = nn.LayerNorm(C)
        for p in self.parameters():  # matrices and embeddings N(0, 0.02), biases 0, norms' gains 1
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, ids, tgt):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln(x) @ self.tok.weight.t()
        return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))


def lr_at(s, steps):  # bf16_tracking.cpp's schedule: linear warmup, then cosine to min_lr
    warm, lr, lo = (20 if steps >= 200 else steps // 10), 3e-3, 3e-4
    if s < warm:
        return lr * (s + 1) / warm
    p = (s - warm) / max(1, steps - warm)
    return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * min(1.0, p)))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    text = open(sys.argv[1], "rb").read(1 << 23)
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    dev = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    torch.manual_seed(seed)
    models = [LM().to(dev), LM().to(dev)]
    models[1].load_state_dict(models[0].state_dict())
    opts = []
    for m in models:
        decay = [p for p in m.parameters() if p.dim() == 2]
        rest = [p for p in m.parameters() if p.dim() != 2]
        opts.append(torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                      lr=3e-3, betas=(0.9, 0.999), eps=1e-8))
    state = seed
    sums, worst, worst_mean = [0.0, 0.0], 0.0, 0.0
    for s in range(steps):
        ids = torch.empty(B, T, dtype=torch.long)
        tgt = torch.empty(B, T, dtype=torch.long)
        for b in range(B):
            state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            p = (state >> 11) % (len(text) - T - 1)
            ids[b] = torch.tensor([c & 127 for c in text[p:p + T]])
            tgt[b] = torch.tensor([c & 127 for c in text[p + 1:p + T + 1]])
        ids, tgt = ids.to(dev), tgt.to(dev)
        losses = []
        for k, (m, o) in enumerate(zip(models, opts)):
            for g in o.param_groups:
                g["lr"] = lr_at(s, steps)
            o.zero_grad()
            with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=k == 1):
                loss = m(ids, tgt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            o.step()
            losses.append(loss.item())
        worst = max(worst, abs(losses[1] - losses[0]) / losses[0])
        sums = [sums[0] + losses[0], sums[1] + losses[1]]
        if s % 25 == 24 or s == steps - 1:
            k = s % 25 + 1
            we = abs(sums[1] - sums[0]) / sums[0]
            worst_mean = max(worst_mean, we)
            print("steps %3d-%3d: fp32 %.4f, bf16 %.4f (%.2e); worst step so far %.2e"
                  % (s + 1 - k, s, sums[0] / k, sums[1] / k, we, worst), flush=True)
            sums = [0.0, 0.0]
    print("worst single step %.3e, worst 25-step mean %.3e" % (worst, worst_mean))


if __name__ == "__main__":
    main()
