#!/usr/bin/env python3
"""Generate the Unicode tables of examples/wordpiece.h (the block between its >>wp-tables and
<<wp-tables lines) from Python's unicodedata, checked code point by code point against Hugging Face's
own BERT normalizer and pre-tokenizer.

Usage (from the repository root):

    python3 tools/gen_wordpiece_tables.py            rewrite the block in examples/wordpiece.h
    python3 tools/gen_wordpiece_tables.py --check    exit 1 if the block is not what this would write
    python3 tools/gen_wordpiece_tables.py --ucd-only  unicodedata alone (no `tokenizers` needed; NOT
                                                      exact against Hugging Face, see below)

The tables answer, for every code point c, what BERT's tokenization (as Hugging Face's `tokenizers`
implements BertNormalizer and BertPreTokenizer) does with it:

    clean_text        c is removed (U+0000, U+FFFD, and "other" characters: Cc, Cf, Co, except
                      \\t \\n \\r), or becomes a space (White_Space);
    strip_accents     c becomes NFD(c) without its nonspacing marks (Mn): one character (e -> e),
                      several (Hangul syllables -> jamo, some Indic vowel signs), or none (a mark);
    lowercase         c becomes its full lowercase mapping, character by character (no final-sigma
                      rule: HF lowercases each char alone);
    pre-tokenizer     c splits words as whitespace (removed) or as punctuation (a word of its own:
                      ASCII punctuation, which includes $ + < = > ^ ` | ~, and Unicode categories P*).

The Chinese-character ranges (spaces around each CJK ideograph) are fixed in wordpiece.h itself; this
script checks them too.

Why a check against `tokenizers`: the rules come from Python's unicodedata (Unicode 14.0 in Python 3.11),
but Hugging Face's Rust code takes its categories and decompositions from crates of older Unicode
versions (so marks and format characters added since are neither stripped nor removed there) and its
lowercasing from a newer Rust standard library (Unicode 16 letters lowercase there). Where the two
disagree, Hugging Face wins, since the tokenizer must give its ids; the script prints every such group
of code points with its reason, and the generated block says how many there were. With --ucd-only the
block is what unicodedata alone gives.

Needs: Python 3 (for --ucd-only nothing else); `pip install tokenizers` for the check (written against
tokenizers 0.23.3).
"""

import argparse
import os
import sys
import unicodedata as ud

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "wordpiece.h")
BEGIN = "/* >>wp-tables"
END = "/* <<wp-tables */"

CTRL, WS, MARK, PUNCT = 1, 2, 4, 8
MAX_CP = 0x110000
HANGUL_S, HANGUL_N = 0xAC00, 11172

# BERT's "Chinese character" ranges as Hugging Face writes them (Google's BERT starts the sixth range at
# 0x2B820; Hugging Face at 0x2B920). wordpiece.h has the same list; --check verifies it is right.
CJK = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
       (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]


def is_cjk(c):
    return any(lo <= c <= hi for lo, hi in CJK)


def codepoints():
    return [c for c in range(MAX_CP) if not 0xD800 <= c <= 0xDFFF]


# ---- the rules, from unicodedata ----------------------------------------------------------------

def ucd_tables():
    """Per code point: clean (None: kept, '': removed, ' ': space), strip (string), lower (string),
    pretok ('w' word char, 's' whitespace, 'p' punctuation)."""
    clean, strip, lower, pretok = {}, {}, {}, {}
    for c in codepoints():
        ch = chr(c)
        cat = ud.category(ch)
        white = ch.isspace() and not 0x1C <= c <= 0x1F  # White_Space (Python's isspace adds 1C..1F)
        if c in (0, 0xFFFD) or (cat in ("Cc", "Cf", "Co", "Cs") and c not in (9, 10, 13)):
            clean[c] = ""
        elif white:
            clean[c] = " "
        strip[c] = "".join(x for x in ud.normalize("NFD", ch) if ud.category(x) != "Mn")
        lower[c] = ch.lower()
        ascii_punct = 33 <= c <= 47 or 58 <= c <= 64 or 91 <= c <= 96 or 123 <= c <= 126
        pretok[c] = "s" if white else "p" if (ascii_punct or cat.startswith("P")) else "w"
    return clean, strip, lower, pretok


# ---- what Hugging Face does -----------------------------------------------------------------------

def hf_tables():
    from tokenizers import normalizers, pre_tokenizers
    import tokenizers
    BN = normalizers.BertNormalizer
    n_clean = BN(clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    n_strip = BN(clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=False)
    n_lower = BN(clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=True)
    n_cjk = BN(clean_text=False, handle_chinese_chars=True, strip_accents=False, lowercase=False)
    pt = pre_tokenizers.BertPreTokenizer()
    clean, strip, lower, pretok, cjk = {}, {}, {}, {}, {}
    for c in codepoints():
        ch = chr(c)
        r = n_clean.normalize_str(ch)
        if r != ch or ch == " ":  # as ucd_tables: a space "becomes" a space
            clean[c] = r
        strip[c] = n_strip.normalize_str(ch)
        lower[c] = n_lower.normalize_str(ch)
        cjk[c] = n_cjk.normalize_str(ch) == " " + ch + " "
        words = [w for w, _ in pt.pre_tokenize_str("a" + ch + "b")]
        if words == ["a", "b"]:
            pretok[c] = "s"
        elif words == ["a", ch, "b"]:
            pretok[c] = "p"
        elif words == ["a" + ch + "b"]:
            pretok[c] = "w"
        else:
            sys.exit("gen_wordpiece_tables: U+%04X: unexpected pre-tokenization %r" % (c, words))
    return clean, strip, lower, pretok, cjk, tokenizers.__version__


def compare(name, ucd, hf, describe):
    """Print the code points where unicodedata's rule and Hugging Face disagree, grouped."""
    diff = [c for c in codepoints() if ucd.get(c) != hf.get(c)]
    groups = {}
    for c in diff:
        key = (ud.category(chr(c)), describe(ucd.get(c), hf.get(c), c))
        groups.setdefault(key, []).append(c)
    for (cat, what), cs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        ex = " ".join("U+%04X" % c for c in cs[:6]) + (" ..." if len(cs) > 6 else "")
        print("  %-7s %5d  %-3s %s: %s" % (name, len(cs), cat, what, ex))
    return len(diff)


def describe_map(u, h, c):
    ch = chr(c)
    u = ch if u is None else u
    h = ch if h is None else h
    if h == ch:
        return "kept as is by HF (its tables predate this character's data)"
    if u == ch:
        return "changed by HF only (newer data there)"
    if h == "":
        return "removed by HF only"
    if u == "":
        return "removed by unicodedata only"
    return "mapped differently"


# ---- the C tables -------------------------------------------------------------------------------

def build(clean, strip, lower, pretok):
    mask = {}
    for c in codepoints():
        m = 0
        if clean.get(c) == "":
            m |= CTRL
        if pretok[c] == "s":
            m |= WS
        if strip[c] == "":
            m |= MARK
        if pretok[c] == "p":
            m |= PUNCT
        if m:
            mask[c] = m
    # a character kept by clean_text but turned into a space must be whitespace, and vice versa
    for c in codepoints():
        if clean.get(c) == " " and mask.get(c) != WS:
            sys.exit("gen_wordpiece_tables: U+%04X becomes a space but is not plain whitespace" % c)
        if mask.get(c, 0) & WS and not mask.get(c, 0) & CTRL and clean.get(c) != " ":
            sys.exit("gen_wordpiece_tables: U+%04X is whitespace but clean_text keeps it" % c)
    ranges = []
    for c in sorted(mask):
        if ranges and ranges[-1][1] == c - 1 and ranges[-1][2] == mask[c]:
            ranges[-1][1] = c
        else:
            ranges.append([c, c, mask[c]])
    strip1, stripn = [], []
    for c in codepoints():
        s = strip[c]
        if s == chr(c) or s == "":
            continue
        if HANGUL_S <= c < HANGUL_S + HANGUL_N:
            if s != hangul(c):
                sys.exit("gen_wordpiece_tables: Hangul U+%04X is not decomposed algorithmically" % c)
            continue
        if len(s) == 1:
            strip1.append((c, ord(s)))
        else:
            stripn.append((c, [ord(x) for x in s]))
    if any(c < 0xC0 for c, _ in strip1 + stripn) or any(c < 0xC0 and m & MARK for c, m in mask.items()):
        sys.exit("gen_wordpiece_tables: wordpiece.h assumes nothing below U+00C0 is stripped")
    if max(len(v) for _, v in stripn) > 3:
        sys.exit("gen_wordpiece_tables: a stripped decomposition longer than 3")
    low1 = {c: ord(lower[c]) for c in codepoints() if lower[c] != chr(c) and len(lower[c]) == 1}
    lown = [(c, [ord(x) for x in lower[c]]) for c in codepoints() if len(lower[c]) > 1]
    if any(len(v) > 3 for _, v in lown) or any(lower[c] == "" for c in codepoints()):
        sys.exit("gen_wordpiece_tables: a lowercase mapping of length 0 or over 3")
    # lowercase runs: lo..hi step `stride`, each c -> c + delta
    runs, left = [], dict(low1)
    for c in sorted(low1):
        if c not in left:
            continue
        d = left[c] - c
        best = (1, 1)
        for stride in (1, 2):
            # runs must not interleave (the lookup takes the last run starting at or before c): a
            # stride-2 run skips only code points that keep their case
            n = 1
            while left.get(c + n * stride) == c + n * stride + d and \
                    (stride == 1 or c + n * stride - 1 not in low1):
                n += 1
            if n > best[0]:
                best = (n, stride)
        n, stride = best
        for k in range(n):
            del left[c + k * stride]
        runs.append((c, c + (n - 1) * stride, stride, d))
    return ranges, strip1, stripn, runs, lown


def hangul(c):
    s = c - HANGUL_S
    out = chr(0x1100 + s // 588) + chr(0x1161 + (s % 588) // 28)
    return out + (chr(0x11A7 + s % 28) if s % 28 else "")


def emulate(ranges, strip1, stripn, runs, lown):
    """The C lookups (wp__class, wp__strip, wp__lower), in Python, for every code point."""
    import bisect
    starts = [r[0] for r in ranges]
    s1 = dict(strip1)
    sn = dict(stripn)
    ln = dict(lown)
    rstarts = [r[0] for r in runs]

    def cls(c):
        i = bisect.bisect_right(starts, c) - 1
        return ranges[i][2] if i >= 0 and c <= ranges[i][1] else 0

    def strip(c):
        if HANGUL_S <= c < HANGUL_S + HANGUL_N:
            return hangul(c)
        if c in s1:
            return chr(s1[c])
        if c in sn:
            return "".join(map(chr, sn[c]))
        return "" if cls(c) & MARK else chr(c)

    def lower(c):
        if c in ln:
            return "".join(map(chr, ln[c]))
        i = bisect.bisect_right(rstarts, c) - 1
        if i >= 0:
            lo, hi, stride, d = runs[i]
            if c <= hi and (c - lo) % stride == 0:
                return chr(c + d)
        return chr(c)
    return cls, strip, lower


def c_block(ranges, strip1, stripn, runs, lown, note):
    out = []
    w = out.append
    w(BEGIN + " (generated by tools/gen_wordpiece_tables.py: do not edit by hand)")
    for line in note:
        w("   " + line)
    w("*/")
    w("/* {first, last, class bits (WP__CTRL 1, WP__WS 2, WP__MARK 4, WP__PUNCT 8)}: sorted, disjoint;")
    w("   a code point in none has no class */")
    w("static const uint32_t wp__class_ranges[%d][3] = {" % len(ranges))
    w(wrap(["{0x%X,0x%X,%d}" % tuple(r) for r in ranges]))
    w("};")
    w("/* strip_accents, one character: {c, NFD(c) without its nonspacing marks}, sorted by c */")
    w("static const uint32_t wp__strip1[%d][2] = {" % len(strip1))
    w(wrap(["{0x%X,0x%X}" % p for p in strip1]))
    w("};")
    w("/* strip_accents, two or three characters: {c, out...} (0: none); Hangul syllables are computed */")
    w("static const uint32_t wp__stripn[%d][4] = {" % len(stripn))
    w(wrap(["{0x%X,%s}" % (c, ",".join("0x%X" % x for x in (v + [0] * 3)[:3])) for c, v in stripn]))
    w("};")
    w("/* lowercase: {first, last, step, delta}: c in first..last, (c - first) %% step == 0 -> c + delta */")
    w("static const int32_t wp__lower1[%d][4] = {" % len(runs))
    w(wrap(["{0x%X,0x%X,%d,%d}" % r for r in runs]))
    w("};")
    w("/* lowercase to several characters: {c, out...} (0: none) */")
    w("static const uint32_t wp__lowern[%d][4] = {" % len(lown))
    w(wrap(["{0x%X,%s}" % (c, ",".join("0x%X" % x for x in (v + [0] * 3)[:3])) for c, v in lown]))
    w("};")
    w(END)
    return "\n".join(out) + "\n"


def wrap(items, width=100):
    lines, cur = [], "   "
    for it in items:
        if len(cur) + 1 + len(it) + 1 > width:
            lines.append(cur)
            cur = "   "
        cur += " " + it + ","
    lines.append(cur)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if the header's block is out of date")
    ap.add_argument("--ucd-only", action="store_true", help="unicodedata alone, no check against HF")
    ap.add_argument("--header", default=HEADER)
    a = ap.parse_args()

    clean, strip, lower, pretok = ucd_tables()
    note = ["Rules from Python %s's unicodedata (Unicode %s)." % (sys.version.split()[0], ud.unidata_version)]
    if not a.ucd_only:
        try:
            h_clean, h_strip, h_lower, h_pretok, h_cjk, ver = hf_tables()
        except ImportError:
            sys.exit("gen_wordpiece_tables: needs `pip install tokenizers` (or --ucd-only)")
        print("unicodedata %s against tokenizers %s, where they differ (Hugging Face wins):"
              % (ud.unidata_version, ver))
        n = compare("clean", clean, h_clean, describe_map)
        n += compare("strip", strip, h_strip, describe_map)
        n += compare("lower", lower, h_lower, describe_map)
        n += compare("pretok", pretok, h_pretok, lambda u, h, c: "%s in unicodedata, %s in HF" % (u, h))
        bad = [c for c in codepoints() if h_cjk[c] != is_cjk(c)]
        if bad:
            sys.exit("gen_wordpiece_tables: the CJK ranges disagree with HF at U+%04X" % bad[0])
        print("  %d code points in all; CJK ranges agree" % n)
        clean, strip, lower, pretok = h_clean, h_strip, h_lower, h_pretok
        note.append("Checked against Hugging Face tokenizers %s at every code point: %d differ," % (ver, n))
        note.append("where HF's older category and decomposition data, or its newer lowercasing, wins.")
    else:
        note.append("NOT checked against Hugging Face (--ucd-only): not exact for every code point.")

    tables = build(clean, strip, lower, pretok)
    cls, st, lo = emulate(*tables)
    for c in codepoints():
        m = cls(c)
        want = clean.get(c)
        got = "" if m & CTRL else " " if m & WS else None
        if got != want or st(c) != strip[c] or lo(c) != lower[c] or \
                ("s" if m & WS else "p" if m & PUNCT else "w") != pretok[c]:
            sys.exit("gen_wordpiece_tables: the tables are wrong at U+%04X" % c)
    ranges, strip1, stripn, runs, lown = tables
    print("tables: %d class ranges, %d + %d stripped decompositions, %d lowercase runs, %d multi"
          % (len(ranges), len(strip1), len(stripn), len(runs), len(lown)))
    block = c_block(*tables, note=note)

    text = open(a.header, encoding="utf-8").read()
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        sys.exit("gen_wordpiece_tables: %s has no %s ... %s block" % (a.header, BEGIN, END))
    new = text[:i] + block + text[j + len(END) + 1:]
    if a.check:
        if new != text:
            sys.exit("gen_wordpiece_tables: %s's tables are out of date: run tools/gen_wordpiece_tables.py"
                     % a.header)
        print("%s: tables up to date" % a.header)
        return
    if new != text:
        with open(a.header, "w", encoding="utf-8") as f:
            f.write(new)
        print("wrote %s" % a.header)
    else:
        print("%s: unchanged" % a.header)


if __name__ == "__main__":
    main()
