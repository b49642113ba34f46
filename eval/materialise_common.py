"""Shared helper for the held-out corpora's ``materialise.py`` scripts.  Standard library only.

Each set folder holds a ``SOURCES.txt`` whose file table has one line per selected file:

    <sha256 hex>  <size in bytes>  <path relative to the package's document root>

``materialise()`` reads that table, finds every file under the installed package's root,
checks its size and sha256, and writes it to ``DEST/<same relative path>``.  It is
deterministic: the same package files always give the same corpus, byte for byte, in the
same order.  Nothing is fetched from the network; a missing file names the package to install.

A package rebuilt from the same sources can differ in a build stamp only (Sphinx writes "Last
updated on <date>." into every page).  A set whose script passes ``normalise`` (bytes -> bytes,
the stamp blanked) may also list, in its SOURCES.txt, one line per file

    normalised  <sha256 of the normalised bytes>  <path>

and a file whose raw hash differs is then accepted when its normalised hash matches: the text
the golden set was written on is the same, only the stamp moved.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path

_ROW = re.compile(r"^([0-9a-f]{64})\s+(\d+)\s+(\S+)\s*$")
_NORMALISED_ROW = re.compile(r"^normalised\s+([0-9a-f]{64})\s+(\S+)\s*$")


class MaterialiseError(Exception):
    pass


def read_file_table(sources_txt: Path) -> list[tuple[str, int, str]]:
    """The (sha256, size, relpath) rows of a SOURCES.txt, in file order."""
    rows = []
    for n, line in enumerate(sources_txt.read_text(encoding="utf-8").splitlines(), 1):
        m = _ROW.match(line)
        if m:
            rel = m.group(3)
            if rel.startswith("/") or ".." in rel.split("/"):
                raise MaterialiseError(f"{sources_txt}:{n}: unsafe path {rel!r}")
            rows.append((m.group(1), int(m.group(2)), rel))
    if not rows:
        raise MaterialiseError(f"{sources_txt}: no file rows ('<sha256>  <size>  <path>')")
    rels = [r[2] for r in rows]
    if len(set(rels)) != len(rels):
        raise MaterialiseError(f"{sources_txt}: duplicate paths in the file table")
    return rows


def read_normalised_table(sources_txt: Path) -> dict[str, str]:
    """relpath -> sha256 of the normalised file, from the ``normalised`` lines of a SOURCES.txt."""
    table = {}
    for line in sources_txt.read_text(encoding="utf-8").splitlines():
        m = _NORMALISED_ROW.match(line)
        if m:
            table[m.group(2)] = m.group(1)
    return table


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def materialise(*, name: str, sources_txt: Path, roots: list[Path], install_hint: str,
                dest: Path, allow_extra: bool = False, convert=None, normalise=None) -> int:
    """Copy (or convert) every listed file from the first root that has it into dest.

    ``convert`` (optional) maps (relpath, source bytes) -> (output relpath, output bytes); it is
    for packages that ship a format the project's extractor cannot read.  The sha256 in the table
    is always the hash of the *source* file.  ``normalise`` (optional) blanks a build stamp: a
    file whose raw hash differs passes when ``normalise(data)`` has the hash of its ``normalised``
    line.  Returns the number of files written.
    """
    rows = read_file_table(sources_txt)
    normalised = read_normalised_table(sources_txt) if normalise else {}
    rebuilt = 0
    root = next((r for r in roots if r.is_dir()), None)
    if root is None:
        raise MaterialiseError(
            f"{name}: the source files are not installed (looked in: {', '.join(map(str, roots))}).\n"
            f"Install them with:  {install_hint}")
    missing = [rel for _sha, _size, rel in rows if not (root / rel).is_file()]
    if missing:
        raise MaterialiseError(
            f"{name}: {len(missing)} of {len(rows)} listed files are missing under {root} "
            f"(first: {missing[0]}).\nInstall or reinstall the package:  {install_hint}")
    outputs = []
    bad = []
    for sha, size, rel in rows:
        data = (root / rel).read_bytes()
        found = sha256_of(data)
        if len(data) == size and found == sha:
            pass
        elif rel in normalised and sha256_of(normalise(data)) == normalised[rel]:
            rebuilt += 1
        else:
            bad.append(f"{rel}: expected {size} bytes sha256 {sha[:12]}…, found {len(data)} bytes "
                       f"sha256 {found[:12]}…")
            continue
        out_rel, out = convert(rel, data) if convert else (rel, data)
        outputs.append((out_rel, out))
    if bad:
        raise MaterialiseError(
            f"{name}: {len(bad)} file(s) differ from the pinned version in {sources_txt.name} "
            f"(a different package version?):\n  " + "\n  ".join(bad)
            + f"\nThe golden set is only valid for the pinned files; install that version ({install_hint}).")
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {rel for rel, _ in outputs}
    extra = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")
                   if p.is_file() and p.relative_to(dest).as_posix() not in wanted)
    if extra and not allow_extra:
        raise MaterialiseError(
            f"{name}: {dest} already holds {len(extra)} file(s) that are not in the selection "
            f"(first: {extra[0]}); they would become part of the corpus. Use an empty folder "
            f"(or --allow-extra).")
    total = 0
    for rel, out in outputs:
        _write_atomic(dest / rel, out)
        total += len(out)
        print(f"wrote {rel}  ({len(out)} bytes, sha256 {sha256_of(out)[:12]})")
    if rebuilt:
        print(f"{name}: {rebuilt} file(s) are another build of the pinned version (only the build "
              f"stamp differs; their text matches the normalised hashes in {sources_txt.name})")
    print(f"{name}: {len(outputs)} files, {total} bytes from {root} -> {dest}")
    return len(outputs)


def main(*, name: str, here: Path, roots: list[Path], install_hint: str, convert=None, normalise=None) -> None:
    ap = argparse.ArgumentParser(description=f"Materialise the held-out corpus '{name}' into DEST.")
    ap.add_argument("dest", type=Path, help="output folder (created; should be empty)")
    ap.add_argument("--src", type=Path, default=None,
                    help="document root to read instead of the installed package's (e.g. an unpacked .deb)")
    ap.add_argument("--allow-extra", action="store_true",
                    help="do not fail when DEST already holds files outside the selection")
    a = ap.parse_args()
    try:
        materialise(name=name, sources_txt=here / "SOURCES.txt",
                    roots=[a.src] if a.src else roots, install_hint=install_hint,
                    dest=a.dest, allow_extra=a.allow_extra, convert=convert, normalise=normalise)
    except MaterialiseError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
