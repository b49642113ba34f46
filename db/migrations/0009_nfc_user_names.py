"""0009_nfc_user_names: team mode's user names (``users.name``) are stored in NFC.

Sign-in, ``rag users`` and the audit filter compose the name typed (``rag.auth.typed_name``), as
document names are (0008): "Ánh" pasted from a macOS file name (decomposed, NFD) and typed on a
keyboard are one user. A name stored decomposed before would then never match again, so it is
composed here, unless its composed form is already another user's (compared as the column does,
NOCASE: A-Z case folded); that user is left as it is and keeps signing in as stored before.
A ``.py`` migration because SQLite has no Unicode normalisation function.
"""

from __future__ import annotations

import unicodedata
from typing import Any


def migrate(conn: Any) -> None:
    rows = conn.execute("SELECT id, name FROM users").fetchall()
    ascii_lower = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
    taken = {name.translate(ascii_lower) for _, name in rows}
    for user_id, name in rows:
        composed = unicodedata.normalize("NFC", name)
        if composed != name and composed.translate(ascii_lower) not in taken:
            conn.execute("UPDATE users SET name = ? WHERE id = ?", (composed, user_id))
            taken.add(composed.translate(ascii_lower))
