#!/usr/bin/env python3
"""Checks that every needle of a held-out golden set is verbatim in the text the project's
extractor produces (``rag.extract.extract``), besides being byte-exact in the raw file.

    .venv/bin/python eval/check_extracted.py CORPUS_DIR GOLDEN_JSON

It only extracts text; it does not index, embed or retrieve anything, so it is safe to run on
a held-out set.  Exit status 0 = every needle found, 1 = problems (all listed).
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rag.extract import extract  # noqa: E402


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root, golden = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text(encoding="utf-8"))
    cache: dict[str, tuple[str, str]] = {}
    problems, n = [], 0
    for item in golden:
        for ev in item["evidence"]:
            src, quote = ev["source"], ev["quote"]
            if src not in cache:
                p = root / src
                data = p.read_bytes()
                cache[src] = (data.decode("utf-8"), extract(p, data).text)
            raw, text = cache[src]
            n += 1
            if quote not in raw:
                problems.append(f"{item['id']}: not byte-exact in {src}")
            if quote not in text:
                problems.append(f"{item['id']}: not verbatim in the extracted text of {src}")
            elif any(line.startswith("#") and quote in line for line in text.split("\n")):
                problems.append(f"{item['id']}: on an extracted heading line in {src}")
    print(f"{n} needles in {len(cache)} files checked against rag.extract output")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("PASS: every needle is verbatim in the extracted text")


if __name__ == "__main__":
    main()
