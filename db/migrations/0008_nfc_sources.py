"""0008_nfc_sources: document names (``documents.source``) are stored in NFC.

A name is the file's path relative to the ingested folder. macOS writes file names decomposed
(NFD: "ệ" as e + circumflex + dot below), so a folder ingested there stored names that an NFC
spelling of the same name (typed on a keyboard, or the same notes copied elsewhere) did not
match: a second ingest stored every such file twice, and ``rag source``, ``rag delete`` and the
access map's keys missed it. Ingest now composes names (``rag.ingest.discover``); this renames the
ones stored before. A name whose NFC form is already taken (the same document stored twice) is
left as it is: renaming it would merge two documents, and ``rag delete`` removes the extra one.
A ``.py`` migration because SQLite has no Unicode normalisation function.
"""

from __future__ import annotations

import unicodedata
from typing import Any


def migrate(conn: Any) -> None:
    rows = conn.execute("SELECT id, collection_id, source FROM documents").fetchall()
    taken = {(r[1], r[2]) for r in rows}
    for document_id, collection_id, source in rows:
        composed = unicodedata.normalize("NFC", source)
        if composed != source and (collection_id, composed) not in taken:
            conn.execute("UPDATE documents SET source = ? WHERE id = ?", (composed, document_id))
            taken.add((collection_id, composed))
