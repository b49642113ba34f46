#!/usr/bin/env python3
"""Materialise the held-out English corpus (Python 3.11 documentation, Debian python3-doc).

    python3 eval/python_docs/materialise.py DEST

Copies the HTML pages listed in SOURCES.txt byte for byte from the installed package into
DEST/<path> (for example DEST/library/json.html), after checking each file's size and sha256.
Standard library only.
"""
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from materialise_common import main  # noqa: E402

# Debian's rebuilds of python3.11-doc 3.11.2 (deb12u8, deb12u9, ...) differ only in this footer.
_BUILD_DATE = re.compile(rb"Last updated on [A-Z][a-z]+ \d{1,2}, \d{4}\.")


def normalise(data: bytes) -> bytes:
    """The page with its Sphinx build date blanked."""
    return _BUILD_DATE.sub(b"Last updated on (build date).", data)


ROOTS = [Path("/usr/share/doc/python3.11/html"), Path("/usr/share/doc/python3-doc/html")]

if __name__ == "__main__":
    main(name="python_docs", here=HERE, roots=ROOTS,
         install_hint="apt-get install python3-doc   (it pulls in python3.11-doc, which ships the HTML)",
         normalise=normalise)
