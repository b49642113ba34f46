#!/usr/bin/env python3
"""Materialise the held-out Vietnamese corpus (LibreOffice 7.4 help, Debian libreoffice-help-vi).

    python3 eval/libreoffice_vi/materialise.py DEST

The Debian package ships the help already built as HTML (one .html page per help topic under
/usr/share/libreoffice/help/vi/text/), which the project's extractor reads directly, so the
pages listed in SOURCES.txt are copied byte for byte into DEST/<path> (for example
DEST/scalc/guide/cell_protect.html) after checking each file's size and sha256.  No .xhp
conversion is needed for this package version.  Standard library only.
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from materialise_common import main  # noqa: E402

ROOTS = [Path("/usr/share/libreoffice/help/vi/text")]

if __name__ == "__main__":
    main(name="libreoffice_vi", here=HERE, roots=ROOTS,
         install_hint="apt-get install libreoffice-help-vi")
