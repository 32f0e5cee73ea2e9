#!/usr/bin/env python3
"""Build the shipped calibration sets in calib_data/ from public sources.

Sources (fetched as Debian packages with `apt-get download` + `dpkg -x`, nothing is
installed system-wide):
  r-cran-janeaustenr  six Jane Austen novels (public domain), stored as R data
  jargon-text         the Jargon File 4.4.7 (public domain)
  python3.11-doc      reStructuredText sources of the Python 3.11 docs (PSF licence)
and the Python standard library of the interpreter running this script (PSF licence).

Needs the `rdata` package (pure Python reader for R data): `pip install rdata`.

Usage: python scripts/build_calib_data.py [--workdir DIR] [--out calib_data]
The output is deterministic for the same package versions and seed.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import random
import re
import subprocess
import sys
import sysconfig
import textwrap
import zlib
from pathlib import Path

PACKAGES = ["r-cran-janeaustenr", "jargon-text", "python3.11-doc"]
SEED = 20261129
STDLIB_MODULES = [
    "textwrap", "shlex", "fnmatch", "glob", "heapq", "bisect", "calendar", "difflib",
    "ipaddress", "statistics", "fractions", "string", "tokenize", "csv", "configparser",
    "argparse", "shutil", "tempfile", "json/encoder.py", "json/decoder.py", "pprint",
    "base64", "colorsys", "graphlib", "gettext", "netrc", "quopri", "zipfile",
]


def fetch_packages(workdir: Path) -> Path:
    debs = workdir / "debs"
    root = workdir / "root"
    debs.mkdir(parents=True, exist_ok=True)
    for pkg in PACKAGES:
        if not list(debs.glob(f"{pkg}_*.deb")):
            subprocess.run(["apt-get", "download", pkg], cwd=debs, check=True)
    versions = {}
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
        name, version, _ = deb.name.split("_", 2)
        versions[name] = version.replace("%3a", ":")
    (workdir / "versions.json").write_text(json.dumps(versions, indent=2))
    return root


def austen_novels(root: Path) -> dict[str, list[str]]:
    import rdata  # noqa: PLC0415  (builder-only dependency)

    data = root / "usr/lib/R/site-library/janeaustenr/data"
    index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress((data / "Rdata.rdx").read_bytes())))
    blob = (data / "Rdata.rdb").read_bytes()
    novels = {}
    for name, (offset, length) in index["variables"].items():
        chunk = blob[int(offset): int(offset) + int(length)]
        lines = rdata.conversion.convert(rdata.parser.parse_data(zlib.decompress(chunk[4:])))
        novels[str(name)] = [str(x) for x in lines]
    return novels


def paragraphs(lines: list[str]) -> list[str]:
    out, cur = [], []
    for line in lines + [""]:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            out.append(" ".join(cur))
            cur = []
    # drop headings and very short lines
    return [p for p in out if len(p) > 200 and not p.isupper()]


def prose_set(novels: dict[str, list[str]], rng: random.Random, n: int) -> list[dict]:
    rows = []
    for name, lines in sorted(novels.items()):
        paras = paragraphs(lines)
        # Merge neighbouring paragraphs into chunks of roughly 1,200-2,400 characters.
        chunk: list[str] = []
        for p in paras:
            chunk.append(p)
            if sum(map(len, chunk)) > 1200:
                rows.append({"text": "\n\n".join(chunk)[:2400], "source": f"austen/{name}"})
                chunk = []
    rng.shuffle(rows)
    return rows[:n]


def jargon_entries(root: Path) -> list[tuple[str, str]]:
    text = gzip.decompress((root / "usr/share/doc/jargon-text/jargon.txt.gz").read_bytes()).decode("utf-8")
    # Entries look like "   :term: n." then an indented body up to the next entry.
    entries = []
    for m in re.finditer(r"^   :([^:\n]{2,40}):[^\n]*\n\n(.+?)(?=^   :[^:\n]{2,40}:|\Z)", text, re.S | re.M):
        term = m.group(1).strip()
        body = " ".join(m.group(2).split("\n\n")[0].split())
        if 120 < len(body) < 1500:
            entries.append((term, body))
    return entries


def python_doc_intros(root: Path) -> list[tuple[str, str]]:
    src = root / "usr/share/doc/python3.11/html/_sources/library"
    out = []
    for f in sorted(src.glob("*.rst.txt")):
        text = f.read_text(encoding="utf-8", errors="replace")
        # first plain paragraph after the title block, without reST directives
        paras = [p.strip() for p in text.split("\n\n")]
        body = [p for p in paras if p and not p.startswith(("..", ":", "=", "-", "*", "**")) and len(p) > 150]
        if body:
            clean = re.sub(r":\w+:`~?([^`]+)`", r"\1", " ".join(body[0].split()))
            out.append((f.name.removesuffix(".rst.txt"), clean[:1200]))
    return out


def chat_set(novels, jargon, docs, rng: random.Random, n: int) -> list[dict]:
    rows = []
    for term, body in jargon:
        rows.append({"messages": [
            {"role": "user", "content": f"What does the hacker slang term '{term}' mean?"},
            {"role": "assistant", "content": body},
        ], "source": "jargon-file"})
    for module, intro in docs:
        rows.append({"messages": [
            {"role": "user", "content": f"In a few sentences, what is the Python module `{module}` for?"},
            {"role": "assistant", "content": intro},
        ], "source": "python-docs"})
    for name, lines in sorted(novels.items()):
        for p in paragraphs(lines)[::25]:
            cut = p.find(". ", len(p) // 3)
            if cut > 0:
                rows.append({"messages": [
                    {"role": "system", "content": "You are a helpful writing assistant."},
                    {"role": "user", "content": f"Continue this passage in the same style:\n\n{p[:cut + 1]}"},
                    {"role": "assistant", "content": p[cut + 2:]},
                ], "source": f"austen/{name}"})
    # Balanced mix: draw round-robin from each source family.
    families: dict[str, list[dict]] = {}
    for r in rows:
        families.setdefault(r["source"].split("/")[0], []).append(r)
    for fam in families.values():
        rng.shuffle(fam)
    mixed = []
    while len(mixed) < n and any(families.values()):
        for fam in families.values():
            if fam and len(mixed) < n:
                mixed.append(fam.pop())
    rng.shuffle(mixed)
    return mixed


def code_set(rng: random.Random, n: int) -> list[dict]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for mod in STDLIB_MODULES:
        path = stdlib / (mod if mod.endswith(".py") else f"{mod}.py")
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                seg = ast.get_source_segment(source, node)
                if seg and 300 < len(seg) < 3000:
                    rows.append({"text": textwrap.dedent(seg), "source": f"cpython/Lib/{path.relative_to(stdlib)}"})
    rng.shuffle(rows)
    return rows[:n]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{path}: {len(rows)} rows, {path.stat().st_size / 1e6:.2f} MB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("build/calib_sources"))
    ap.add_argument("--out", type=Path, default=Path("calib_data"))
    args = ap.parse_args()
    root = fetch_packages(args.workdir)
    novels = austen_novels(root)
    rng = random.Random(SEED)
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "prose.jsonl", prose_set(novels, rng, 512))
    write_jsonl(args.out / "chat.jsonl", chat_set(novels, jargon_entries(root), python_doc_intros(root), rng, 512))
    write_jsonl(args.out / "code.jsonl", code_set(rng, 384))
    versions = json.loads((args.workdir / "versions.json").read_text())
    versions["python"] = sys.version.split()[0]
    print("source versions:", json.dumps(versions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
