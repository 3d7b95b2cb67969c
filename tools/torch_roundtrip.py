#!/usr/bin/env python3
"""Move transformer.h checkpoints between PyTorch and C, and check that both compute the same thing.

Usage (from the repository root; needs torch, tested with 1.13, and numpy; the `safetensors`
package is not needed: files are read and written here with struct, json and numpy):

    python3 tools/torch_roundtrip.py export [OUTDIR]   # default OUTDIR: tests/fixtures
    python3 tools/torch_roundtrip.py check DIR         # e.g. build/io_export, after `make unit`

export
    For each model kind (classifier, lm, encdec) builds the reference module of
    tools/torch_models.py, fills every parameter with float32 random values from a fixed seed (so
    layernorms, biases and attention projections are all non-trivial), and writes
      torch_export_<kind>.safetensors   the parameters under their torch names, with the config in
                                        __metadata__ exactly as tfm_model_save writes it: "format"
                                        = "transformer.h", then "tfm.<field>" for every field of
                                        the resolved tfm_config (integers as %d, floats as %.9g of
                                        the float32 value, the seed as an unsigned integer), in the
                                        same order, with the tensors in the model's registry order
                                        (torch's state_dict order) and the header padded with spaces
                                        to a multiple of 8 bytes, as the C writer does;
      torch_export_<kind>.tfx           a batch (tokens, lens where the kind takes them, tgt_in for
                                        the encoder-decoder, targets) and torch's float64 logits
                                        and loss of that batch (TFX1: tools/gen_fixtures.py).
    tests/test_io.c loads each file with tfm_config_load + tfm_model_init + tfm_model_load and
    compares its logits and loss (1e-5 relative), and checks that tfm_model_save of the loaded model
    writes this file again byte for byte. Deterministic: running it again rewrites the same bytes.

check DIR
    For each <kind>.safetensors in DIR (written by tests/test_io.c with tfm_model_save): reads the
    config from the metadata, builds the torch reference model (dropout off), loads the parameters
    ("optim.*" tensors, the AdamW state, are skipped), runs the batch of <kind>.tfx and compares the
    logits (and the loss) the C code stored there: max |c - torch| / max |torch| <= 1e-5. Prints one
    line per checkpoint; exits 1 when one differs or cannot be read, 2 when DIR has none.
"""

import json
import os
import struct
import sys
import zlib

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_models as tm  # noqa: E402
from gen_fixtures import write_tfx  # noqa: E402

TOL = 1e-5
KINDS = {"classifier": tm.ENCODER_CLASSIFIER, "lm": tm.DECODER_LM, "encdec": tm.ENCODER_DECODER}

# tfm_model_save's metadata, in its order: TFM__CFG_INT_FIELDS, then TFM__CFG_FLOAT_FIELDS, then
# the seed (and, with the training state, tfm.step and tfm.rng).
INT_FIELDS = ("kind", "vocab_size", "tgt_vocab_size", "n_classes", "d_model", "n_heads", "n_layers",
              "n_dec_layers", "d_ff", "max_len", "max_tgt_len", "max_batch", "act", "norm_first",
              "pos", "scale_emb", "pool", "tie_output", "share_emb", "no_bias", "ignore_index", "init",
              "input_dim", "cls_token", "type_vocab_size", "emb_norm")
FLOAT_FIELDS = ("dropout", "attn_dropout", "ln_eps", "label_smoothing", "init_std")


def f32(v):
    return float(np.float32(v))


# ---------------------------------------------------------------------------------------------
# safetensors, by hand


def read_safetensors(path):
    """(metadata dict, list of (name, numpy float32 array) in data order). Checks what it relies on:
    the header length, F32 only, shapes against offsets, offsets inside the data buffer."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: %d bytes, shorter than the header length" % (path, len(raw)))
    (hlen,) = struct.unpack("<Q", raw[:8])
    if hlen > len(raw) - 8:
        raise ValueError("%s: header length %d but only %d bytes follow" % (path, hlen, len(raw) - 8))
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    data = raw[8 + hlen:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = []
    for name, e in header.items():
        if e.get("dtype") != "F32":
            raise ValueError("%s: tensor %s has dtype %r (want F32)" % (path, name, e.get("dtype")))
        shape = tuple(int(d) for d in e["shape"])
        begin, end = (int(x) for x in e["data_offsets"])
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= begin <= end <= len(data)) or end - begin != 4 * n:
            raise ValueError("%s: tensor %s: offsets [%d,%d) do not fit shape %s in %d data bytes" %
                             (path, name, begin, end, shape, len(data)))
        arr = np.frombuffer(data[begin:end], dtype="<f4").astype(np.float32).reshape(shape)
        tensors.append((name, begin, arr))
    tensors.sort(key=lambda t: t[1])
    return meta, [(name, arr) for name, _, arr in tensors]


def safetensors_bytes(meta, tensors):
    """The file tfm__st_save writes: metadata first, tensors in the order given, contiguous, compact
    JSON padded with spaces to a multiple of 8 bytes. meta: list of (key, value) strings."""
    obj = {}
    if meta:
        obj["__metadata__"] = dict(meta)
    data = bytearray()
    for name, arr in tensors:
        a = np.ascontiguousarray(arr, dtype="<f4")
        obj[name] = {"dtype": "F32", "shape": list(a.shape),
                     "data_offsets": [len(data), len(data) + a.nbytes]}
        data += a.tobytes()
    h = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(data)


# ---------------------------------------------------------------------------------------------
# TFX1, read by hand (the format of tests/fixture.h)


def read_tfx(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:4] != b"TFX1":
        raise ValueError("%s: not a TFX1 file" % path)
    (count,) = struct.unpack_from("<I", raw, 4)
    at, out = 8, {}
    for _ in range(count):
        (nlen,) = struct.unpack_from("<I", raw, at)
        name = raw[at + 4:at + 4 + nlen].decode("ascii")
        at += 4 + nlen
        dtype, ndim = struct.unpack_from("<II", raw, at)
        at += 8
        dims = struct.unpack_from("<%dq" % ndim, raw, at)
        at += 8 * ndim
        dt = {0: "<f4", 1: "<f8", 2: "<i4"}[dtype]
        n = int(np.prod(dims, dtype=np.int64)) if ndim else 1
        nbytes = n * np.dtype(dt).itemsize
        if at + nbytes > len(raw):
            raise ValueError("%s: array %s is truncated" % (path, name))
        out[name] = np.frombuffer(raw[at:at + nbytes], dtype=dt).reshape(dims).copy()
        at += nbytes
    if at != len(raw):
        raise ValueError("%s: %d stray bytes at the end" % (path, len(raw) - at))
    return out


# ---------------------------------------------------------------------------------------------
# configs: transformer.h's resolution and metadata


def c_resolved(fields):
    """The tfm_config tfm_config_resolve makes of `fields` (a dict of tfm_config fields; missing
    ones are 0): what tfm_model_save records."""
    c = dict((k, 0) for k in INT_FIELDS)
    c.update((k, 0.0) for k in FLOAT_FIELDS)
    c["seed"] = 0
    c.update(fields)
    kind = c["kind"]
    c["n_layers"] = c["n_layers"] or 2
    c["n_dec_layers"] = c["n_dec_layers"] or c["n_layers"]
    c["d_ff"] = c["d_ff"] or 4 * c["d_model"]
    c["max_batch"] = c["max_batch"] or 1
    c["ln_eps"] = f32(c["ln_eps"] or 1e-5)
    c["init_std"] = f32(c["init_std"] or 0.02)
    if not fields.get("has_ignore_index"):
        c["ignore_index"] = -100
    c.pop("has_ignore_index", None)
    if kind == tm.ENCODER_DECODER:
        c["tgt_vocab_size"] = c["tgt_vocab_size"] or c["vocab_size"]
        c["max_tgt_len"] = c["max_tgt_len"] or c["max_len"]
    else:
        c["tgt_vocab_size"] = 0
        c["max_tgt_len"] = 0
        c["n_dec_layers"] = c["n_layers"] if kind == tm.DECODER_LM else 0
    if kind != tm.ENCODER_CLASSIFIER:
        c["n_classes"] = 0
    for k in FLOAT_FIELDS:
        c[k] = f32(c[k])
    return c


def metadata(c):
    """tfm_model_save's __metadata__ (weights only) for a resolved config, as (key, value) pairs."""
    meta = [("format", "transformer.h")]
    meta += [("tfm." + k, "%d" % int(c[k])) for k in INT_FIELDS]
    meta += [("tfm." + k, "%.9g" % f32(c[k])) for k in FLOAT_FIELDS]
    meta.append(("tfm.seed", "%d" % int(c["seed"])))
    return meta


def torch_config(meta, path):
    """The tools/torch_models.py Config of a checkpoint's metadata, dropout off."""
    if "tfm.kind" not in meta:
        raise ValueError("%s has no transformer.h config (no tfm.kind in its metadata)" % path)
    kw = {}
    for k in INT_FIELDS:
        if "tfm." + k in meta and k in tm.Config.FIELDS:
            kw[k] = int(meta["tfm." + k])
    for k in FLOAT_FIELDS:
        if "tfm." + k in meta and k in tm.Config.FIELDS:
            kw[k] = f32(float(meta["tfm." + k]))
    kw["has_ignore_index"] = 1  # the file holds the resolved ignore_index
    kw["dropout"] = kw["attn_dropout"] = 0.0  # reference values: eval
    return tm.Config(**kw)


# ---------------------------------------------------------------------------------------------
# export


def fill_params(model, gen):
    """float32 draws for every parameter, scaled to keep activations O(1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            fan_in = p.shape[1] if p.dim() == 2 else p.shape[0]
            if "emb" in name:
                std, mean = 0.5, 0.0
            elif name.endswith("in_proj_weight"):
                std, mean = 1.2 / fan_in ** 0.5, 0.0
            elif p.dim() == 2:
                std, mean = 1.0 / fan_in ** 0.5, 0.0
            elif "norm" in name and name.endswith("weight"):
                std, mean = 0.2, 1.0
            else:
                std, mean = 0.3, 0.0
            v = torch.randn(*p.shape, generator=gen, dtype=torch.float32) * std + mean
            p.copy_(v.to(torch.float32).to(p.dtype))


def ids(gen, shape, n):
    return torch.randint(0, n, shape, generator=gen).numpy().astype(np.int32)


# one case per kind: tfm_config fields (C's names; unset ones are 0 and resolve as in C), B, T, Tt,
# lens, and where targets are ignored
EXPORTS = [
    ("classifier", dict(kind=tm.ENCODER_CLASSIFIER, vocab_size=11, n_classes=3, d_model=12, n_heads=3,
                        n_layers=2, d_ff=20, max_len=8, max_batch=3, act=tm.ACT_GELU_TANH,
                        norm_first=0, pos=tm.POS_LEARNED, scale_emb=1, pool=tm.POOL_MEAN, seed=31),
     3, 7, 0, [7, 5, 2]),
    ("lm", dict(kind=tm.DECODER_LM, vocab_size=13, d_model=16, n_heads=4, n_layers=2, d_ff=24,
                max_len=8, max_batch=2, act=tm.ACT_GELU, norm_first=1, pos=tm.POS_SINUSOIDAL,
                tie_output=1, seed=32),
     2, 8, 0, None),
    ("encdec", dict(kind=tm.ENCODER_DECODER, vocab_size=12, tgt_vocab_size=10, d_model=16, n_heads=2,
                    n_layers=1, n_dec_layers=2, d_ff=32, max_len=7, max_tgt_len=6, max_batch=2,
                    act=tm.ACT_RELU, norm_first=0, pos=tm.POS_LEARNED, label_smoothing=0.1, seed=33),
     2, 6, 5, [6, 3]),
]


def export_case(outdir, kind_name, fields, B, T, Tt, lens):
    gen = torch.Generator().manual_seed(zlib.crc32(("torch_export_" + kind_name).encode()) & 0x7FFFFFFF)
    c = c_resolved(fields)
    cfg = tm.Config(**dict((k, c[k]) for k in tm.Config.FIELDS if k in c and k != "has_ignore_index"),
                    has_ignore_index=1)
    model = tm.build_model(cfg)
    model.train()  # dropout is 0; training mode keeps torch off its inference fast path
    fill_params(model, gen)

    kind = c["kind"]
    tokens = ids(gen, (B, T), c["vocab_size"] - 1) + 1
    batch = dict(tokens=tokens)
    if lens is not None:
        for b, n in enumerate(lens):
            tokens[b, n:] = 0
        batch["lens"] = np.asarray(lens, np.int32)
    if kind == tm.ENCODER_CLASSIFIER:
        batch["targets"] = ids(gen, (B,), c["n_classes"])
    elif kind == tm.DECODER_LM:
        tg = np.concatenate([tokens[:, 1:], ids(gen, (B, 1), c["vocab_size"])], axis=1)
        tg[1, 5:] = c["ignore_index"]
        batch["targets"] = tg
    else:
        tg = ids(gen, (B, Tt), c["tgt_vocab_size"])
        batch["tgt_in"] = np.concatenate([np.ones((B, 1), np.int32), tg[:, :-1]], axis=1)
        tg[1, 3:] = c["ignore_index"]
        batch["targets"] = tg
    with torch.no_grad():
        logits, loss = tm.run_batch(model, batch)

    tensors = list(tm.named_params(model).items())
    blob = safetensors_bytes(metadata(c), tensors)
    st_path = os.path.join(outdir, "torch_export_%s.safetensors" % kind_name)
    with open(st_path, "wb") as f:
        f.write(blob)

    # the file reads back as written, and the model loaded from it gives the same logits
    meta, back = read_safetensors(st_path)
    assert [n for n, _ in back] == [n for n, _ in tensors], kind_name + ": tensor order"
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(back, tensors)), kind_name + ": data"
    logits2, _ = run_checkpoint(st_path, batch)
    assert torch.equal(logits, logits2), kind_name + ": logits after reloading"

    arrays = [("tokens", batch["tokens"])]
    if "lens" in batch:
        arrays.append(("lens", batch["lens"]))
    if "tgt_in" in batch:
        arrays.append(("tgt_in", batch["tgt_in"].astype(np.int32)))
    arrays.append(("targets", batch["targets"].astype(np.int32)))
    arrays.append(("logits", logits.detach().numpy().astype(np.float64)))
    arrays.append(("loss", np.asarray([float(loss)], np.float64)))
    tfx_path = os.path.join(outdir, "torch_export_%s.tfx" % kind_name)
    n = write_tfx(tfx_path, arrays)
    print("%-34s %7d bytes  %d tensors; %-34s %6d bytes  logits %s, loss %.6f" % (
        os.path.basename(st_path), len(blob), len(tensors), os.path.basename(tfx_path), n,
        tuple(logits.shape), float(loss)))
    return len(blob) + n


def export(outdir):
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)  # bit-for-bit the same files on every run
    total = sum(export_case(outdir, *case) for case in EXPORTS)
    print("%d bytes in %s" % (total, outdir))
    return 0


# ---------------------------------------------------------------------------------------------
# check


def run_checkpoint(path, batch):
    """Build the reference model a checkpoint describes, load its parameters (skipping optim.*),
    and run the batch: (logits, loss), float64."""
    meta, tensors = read_safetensors(path)
    cfg = torch_config(meta, path)
    model = tm.build_model(cfg)
    model.train()  # dropout is 0 (see torch_config)
    params = dict((n, a) for n, a in tensors if not n.startswith("optim."))
    tm.load_named_params(model, params, strict=True)
    with torch.no_grad():
        return tm.run_batch(model, batch)


def rel_err(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    num = np.abs(got - want).max() if got.size else 0.0
    den = np.abs(want).max() if want.size else 0.0
    if not np.isfinite(num):
        return float("inf")
    return float(num / den) if den > 0 else float(num)


def check_one(st_path, tfx_path):
    """One line about a checkpoint; True when it matches."""
    name = os.path.basename(st_path)
    if not os.path.exists(tfx_path):
        print("%-28s FAIL: %s is missing" % (name, tfx_path))
        return False
    try:
        arrays = read_tfx(tfx_path)
        batch = dict((k, arrays[k]) for k in ("tokens", "lens", "tgt_in", "targets") if k in arrays)
        meta, tensors = read_safetensors(st_path)
        n_optim = sum(1 for n, _ in tensors if n.startswith("optim."))
        logits, loss = run_checkpoint(st_path, batch)
    except Exception as e:  # report it as this checkpoint's failure and go on with the others
        print("%-28s FAIL: %s: %s" % (name, type(e).__name__, e))
        return False
    t = logits.detach().numpy()
    c = arrays["logits"]
    e = rel_err(c, t)
    ok = e <= TOL
    msg = "kind %s, %d tensors (%d optim.* skipped), logits %s rel err %.2e" % (
        meta.get("tfm.kind"), len(tensors) - n_optim, n_optim, tuple(t.shape), e)
    if "loss" in arrays and loss is not None:
        el = rel_err(np.asarray(arrays["loss"]).reshape(-1)[:1], np.asarray([float(loss)]))
        ok = ok and el <= TOL
        msg += ", loss %.6f rel err %.2e" % (float(loss), el)
    print("%-28s %s  %s" % (name, "ok  " if ok else "FAIL", msg))
    return ok


def check(d):
    torch.set_num_threads(1)
    names = sorted(f for f in os.listdir(d) if f.endswith(".safetensors")) if os.path.isdir(d) else []
    if not names:
        print("no .safetensors files in %s (run the unit tests first: they write build/io_export)" % d)
        return 2
    bad = 0
    for f in names:
        st = os.path.join(d, f)
        if not check_one(st, st[: -len(".safetensors")] + ".tfx"):
            bad += 1
    print("%d checkpoint%s, %d mismatch%s (tolerance %.0e relative)" % (
        len(names), "" if len(names) == 1 else "s", bad, "" if bad == 1 else "es", TOL))
    return 1 if bad else 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "export" and len(argv) <= 3:
        return export(argv[2] if len(argv) == 3 else os.path.join("tests", "fixtures"))
    if len(argv) == 3 and argv[1] == "check":
        return check(argv[2])
    sys.stderr.write("usage: %s export [OUTDIR] | check DIR\n" % argv[0])
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
