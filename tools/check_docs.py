#!/usr/bin/env python3
"""check_docs.py - check the links and commands of the project's documentation (python3 stdlib only).

    python3 tools/check_docs.py [FILE.md ...]      (default: README.md, docs/*.md, examples/README.md,
                                                    bench/README.md, bench/RESULTS.md)

For each Markdown file:
  - every relative link or image, [text](path#anchor), names a file or folder that exists, and its
    anchor (in this file or in another .md file) is the GitHub slug of one of that file's headings;
  - every fenced ```sh block's commands: `make [VAR=value ...] TARGET...` names targets the Makefile
    has (`make -qp` lists them), and every argument that names a file of the repository
    (examples/..., tools/..., bench/..., tests/..., docs/..., build/NAME, ./build/NAME) refers to one
    that exists, that the Makefile builds or (build/...) that the tests write; a bare file name
    (quickstart.c) to one that exists or that the page itself gives as a program (a fenced block whose
    first line is `/* quickstart.c ...`); paths outside the repository (/usr/..., ../shared/...) and
    outputs (runs/...) are not checked;
  - every fenced ```c block with a main() compiles (cc -std=c99 -fsyntax-only -Wall -Werror, the
    header from the repository root), so the programs the reader copies build.
Prints one line per finding (FILE:LINE: what) and exits 1 if there is any, 0 otherwise.
Run from anywhere; `make check-docs` runs it. """
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = ["README.md", "docs/*.md", "examples/README.md", "bench/README.md", "bench/RESULTS.md"]
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([A-Za-z0-9_+-]*)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
PATHLIKE = re.compile(r"^(?:\./)?(?:examples|tools|bench|tests|docs|build|\.ci)/[A-Za-z0-9_./+-]*$|"
                      r"^[A-Za-z0-9_-]+\.(?:md|c|h|py|sh|cu)$")

findings = []


def finding(path, line, what):
    findings.append("%s:%d: %s" % (os.path.relpath(path, ROOT), line, what))


def blocks(lines):
    """Yield (kind, lang, start_line, text_lines): kind 'text' lines outside fences, 'code' fenced."""
    i, n = 0, len(lines)
    while i < n:
        m = FENCE.match(lines[i])
        if m:
            fence, lang, start = m.group(1), m.group(2).lower(), i + 1
            body = []
            i += 1
            while i < n and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            yield "code", lang, start, body
            i += 1
        else:
            yield "text", "", i + 1, [lines[i]]
            i += 1


def slug(heading):
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)   # links keep their text
    s = re.sub(r"[^\w\- ]", "", s, flags=re.UNICODE)  # backticks, dots, colons, slashes...
    return s.replace(" ", "-")


anchor_cache = {}


def anchors(path):
    if path not in anchor_cache:
        seen, out = {}, set()
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for kind, _, _, body in blocks(lines):
            if kind != "text":
                continue
            m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", body[0])
            if not m:
                continue
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else "%s-%d" % (base, k))
        anchor_cache[path] = out
    return anchor_cache[path]


def check_link(path, line, target):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
        return
    file_part, _, anchor = target.partition("#")
    dest = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
    if not os.path.exists(dest):
        finding(path, line, "link to %s: no such file" % target)
        return
    if anchor and dest.endswith(".md") and anchor.lower() not in anchors(dest):
        finding(path, line, "link to %s: %s has no heading with the anchor #%s" %
                (target, os.path.relpath(dest, ROOT), anchor))


def make_targets():
    try:
        out = subprocess.run(["make", "-qp"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True).stdout
    except OSError:
        return None
    out = out[out.find("# Make data base"):]  # what the Makefile prints while it is read is no target
    return set(m.group(1) for m in re.finditer(r"^([A-Za-z0-9_./+-]+):", out, re.M))


def declared_files(lines):
    """The file names a page gives as programs of its own: fenced blocks opening with /* NAME."""
    out = set()
    for kind, _, _, body in blocks(lines):
        if kind == "code" and body:
            m = re.match(r"^\s*/\*\s*([A-Za-z0-9_.-]+\.[a-z]+)\b", body[0])
            if m:
                out.add(m.group(1))
    return out


test_sources = None


def written_by_tests(p):
    global test_sources
    if test_sources is None:
        test_sources = ""
        for f in glob.glob(os.path.join(ROOT, "tests", "*.c")):
            with open(f, encoding="utf-8", errors="replace") as fh:
                test_sources += fh.read()
    return ('"%s' % p) in test_sources


def check_sh(path, start, body, targets, declared):
    text, first = "", start + 1
    heredoc = None
    for k, raw in enumerate(body):
        ln = start + 1 + k
        if heredoc is not None:  # a here-document's lines are data
            if raw.strip() == heredoc:
                heredoc = None
            continue
        line = raw.split(" #")[0] if not raw.lstrip().startswith("#") else ""
        m = re.search(r"<<-?\s*'?\"?([A-Za-z_]+)", line)
        if m:
            heredoc = m.group(1)
        if not text:
            first = ln
        if line.rstrip().endswith("\\"):
            text += line.rstrip()[:-1] + " "
            continue
        text += line
        check_command(path, first, text, targets, declared)
        text = ""
    if text:
        check_command(path, first, text, targets, declared)


def check_command(path, line, text, targets, declared):
    text = text.strip()
    if not text or text.startswith("$ "):
        text = text[2:] if text.startswith("$ ") else text
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        finding(path, line, "cannot parse the command: %s" % text)
        return
    for cmd in re.split(r"\s*(?:&&|\|\||;|\|)\s*", " ".join(shlex.quote(w) for w in words)):
        w = shlex.split(cmd) if cmd else []
        while w and re.match(r"^[A-Z_][A-Z0-9_]*=", w[0]):  # VAR=value before a command
            w = w[1:]
        if not w:
            continue
        if w[0] == "make" and targets is not None:
            for a in w[1:]:
                if a.startswith("-") or "=" in a:
                    continue
                if a not in targets:
                    finding(path, line, "make %s: the Makefile has no such target" % a)
        for a in w:
            if a.startswith("-") and "=" in a:
                a = a.split("=", 1)[1]
            if not PATHLIKE.match(a):
                continue
            p = a[2:] if a.startswith("./") else a
            if os.path.exists(os.path.join(ROOT, p)):
                continue
            if targets is not None and p.startswith("build/") and p in targets:
                continue
            if p.startswith("build/") and written_by_tests(p):
                continue
            if "/" not in p and p in declared:
                continue
            finding(path, line, "%s: no such file in the repository (nor a make target)" % a)


def check_c(path, start, body):
    src = "\n".join(body)
    if "main(" not in src:
        return
    cc = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "doc.c")
        with open(f, "w", encoding="utf-8") as fh:
            fh.write(src + "\n")
        try:
            r = subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I", ROOT, f],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        except OSError:
            return
        if r.returncode != 0:
            errs = [l for l in r.stdout.split("\n") if "error" in l] or r.stdout.strip().split("\n")
            first = re.sub(r"^.*?doc\.c:", "line ", errs[0]) if errs else ""
            finding(path, start, "this C program does not compile (%s -std=c99 -Werror): %s" % (cc, first))


def main(argv):
    files = argv[1:] or [f for pat in DEFAULT for f in sorted(glob.glob(os.path.join(ROOT, pat)))]
    targets = make_targets()
    for path in files:
        path = os.path.abspath(path)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        declared = declared_files(lines)
        for kind, lang, start, body in blocks(lines):
            if kind == "text":
                for m in LINK.finditer(re.sub(r"`[^`]*`", "", body[0])):
                    check_link(path, start, m.group(1))
            elif lang in ("sh", "bash", "shell"):
                check_sh(path, start, body, targets, declared)
            elif lang == "c":
                check_c(path, start, body)
    for f in findings:
        print(f)
    print("check_docs: %d file(s), %d finding(s)" % (len(files), len(findings)))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
