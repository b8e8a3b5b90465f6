#!/usr/bin/env python3
"""make lint: the project's source rules, in the spirit of curl's checksrc.

Fails (exit 1) on:
  - a banned function (sprintf, vsprintf, strcpy, strcat, strtok, atoi, gets) in the
    product's C/CUDA sources: snprintf, memcpy, strtol/strtoll and strtok_r-free parsing
    serve instead;
  - an include that reaches up a layer (DESIGN.md section 2: server > api > jobs >
    compress > storage > engine, with cuda/ beside engine, and llamacpp/, the llama.cpp
    helper program, beside it too: it may use engine/ only);
  - a source file over 1,000 lines or a function over 150 lines;
  - a product source file that docs/layers.md does not list (the map a newcomer reads).
Prints the largest files and functions either way, so their growth is seen.
"""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LAYERS = ["server", "api", "jobs", "compress", "storage", "engine", "cuda", "llamacpp"]
RANK = {"server": 7, "api": 6, "jobs": 5, "compress": 4, "storage": 3, "engine": 2, "cuda": 2, "llamacpp": 2}
BANNED = re.compile(r"(?<![A-Za-z0-9_])(sprintf|vsprintf|strcpy|strcat|strtok|atoi|gets)\s*\(")
MAX_FILE_LINES = 1000
MAX_FUNC_LINES = 150


def sources():
    for d in LAYERS:
        base = os.path.join(ROOT, d)
        for dirpath, _, files in os.walk(base):
            if "/emu" in dirpath[len(ROOT):]:   # cuda/emu: the kernels' CPU emulator for tests
                continue
            for f in sorted(files):
                if f.endswith((".c", ".h", ".cu", ".cuh")):
                    yield os.path.relpath(os.path.join(dirpath, f), ROOT)


def strip_comments_and_strings(text):
    """Blank out comments and string/char literals, keeping line structure."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(lines):
    """(name, first line, length) of each function defined at column 0: a signature line
    followed by '{' alone, ended by '}' alone (the project's layout)."""
    out = []
    for i in range(1, len(lines)):
        if lines[i] != "{":
            continue
        j = i - 1
        while j > 0 and lines[j].startswith((" ", "\t")) and not lines[j].strip().endswith(";"):
            j -= 1   # a signature wrapped over several lines
        m = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", lines[j])
        if not m or lines[j].startswith(("#", "struct", "typedef", "enum", "union")) or "=" in lines[j].split("(")[0]:
            continue
        k = i + 1
        while k < len(lines) and lines[k] != "}":
            k += 1
        out.append((m.group(1), j + 1, k - j + 1))
    return out


def main():
    faults, sizes, funcs = [], [], []
    docs = ""
    try:
        with open(os.path.join(ROOT, "docs", "layers.md")) as f:
            docs = f.read()
    except OSError:
        faults.append("docs/layers.md is missing (the layer map: one line per source file)")
    for rel in sources():
        with open(os.path.join(ROOT, rel), errors="replace") as f:
            text = f.read()
        lines = text.split("\n")
        code = strip_comments_and_strings(text).split("\n")
        layer = rel.split("/")[0]
        for no, line in enumerate(code, 1):
            m = BANNED.search(line)
            if m:
                faults.append("%s:%d: banned function %s" % (rel, no, m.group(1)))
            inc = re.match(r'\s*#\s*include\s+"([a-z_]+)/', lines[no - 1])
            if inc and inc.group(1) in RANK and RANK[inc.group(1)] > RANK[layer]:
                faults.append("%s:%d: %s includes %s (a higher layer)" % (rel, no, layer, inc.group(1)))
        n = len(lines) - (1 if lines and lines[-1] == "" else 0)
        sizes.append((n, rel))
        if n > MAX_FILE_LINES:
            faults.append("%s: %d lines (at most %d)" % (rel, n, MAX_FILE_LINES))
        for name, first, length in functions(lines):
            funcs.append((length, "%s:%d %s" % (rel, first, name)))
            if length > MAX_FUNC_LINES:
                faults.append("%s:%d: function %s has %d lines (at most %d)" % (rel, first, name, length,
                                                                                MAX_FUNC_LINES))
        if rel.endswith((".c", ".cu")) and docs and rel not in docs:
            faults.append("%s: not listed in docs/layers.md" % rel)
    print("largest files:    " + ", ".join("%s %d" % (r, n) for n, r in sorted(sizes, reverse=True)[:6]))
    print("largest functions: " + ", ".join("%s (%d)" % (w, n) for n, w in sorted(funcs, reverse=True)[:6]))
    for f in faults:
        print("lint: " + f)
    print("lint: %d files, %d functions, %d faults" % (len(sizes), len(funcs), len(faults)))
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
