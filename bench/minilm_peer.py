#!/usr/bin/env python3
"""The peer of examples/search.c's embedding: sentence-transformers' SentenceTransformer.encode on the
same verses (written by `build/search --export PATH`), the same batch size, on the CPU.

    python bench/minilm_peer.py MODEL_DIR VERSES_TXT THREADS [BATCH]

Prints verses per second (encode() of all of them, after one warm-up batch). Run beside
`build/search --threads THREADS --emb <a new file>`, which prints its own rate (bench/RESULTS.md).
"""
import sys
import time

import torch
from sentence_transformers import SentenceTransformer

model_dir, path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
batch = int(sys.argv[4]) if len(sys.argv) > 4 else 32
torch.set_num_threads(threads)
with open(path, encoding="utf-8") as f:
    verses = [l.rstrip("\n") for l in f]
model = SentenceTransformer(model_dir, device="cpu")
model.encode(verses[:batch], batch_size=batch)
t0 = time.perf_counter()
model.encode(verses, batch_size=batch)
dt = time.perf_counter() - t0
print("sentence-transformers: %d verses in %.2f s: %.1f verses/s (%d threads, batch %d, torch %s)"
      % (len(verses), dt, len(verses) / dt, threads, batch, torch.__version__))
