"""0010_document_id_high_water: the highest document id an earlier version gave, as a chat remembers it.

A new SQLite document takes an id above ``meta['documents:last_id']`` (``store._new_document_id``),
so a citation link (``?document=ID``) to a deleted document never opens a newer one. Versions
before that mark deleted documents without keeping their ids anywhere but in the answers of the
chats they were cited in: after an upgrade, the first new document took the id of the newest one
deleted before it, and an old answer's link opened it. This sets the mark from the ids those
answers hold (every ``document_id`` in ``chat_turns.answer``) when they exceed the documents'.
PostgreSQL needs no such step: its identity column never gives a number twice. A ``.py``
migration because the ids are read out of JSON written by several versions of ``Answer``.
"""

from __future__ import annotations

import json
from typing import Any

KEY = "documents:last_id"  # rag.store._LAST_DOCUMENT_ID


def document_ids(value: Any) -> list[int]:
    """Every integer under a ``document_id`` key, at any depth (hits, dropped hits, ...)."""
    if isinstance(value, dict):
        found = [v for k, v in value.items() if k == "document_id" and isinstance(v, int) and not isinstance(v, bool)]
        return found + [i for v in value.values() for i in document_ids(v)]
    if isinstance(value, list):
        return [i for v in value for i in document_ids(v)]
    return []


def migrate(conn: Any) -> None:
    mark = int(conn.execute("SELECT coalesce(max(id), 0) FROM documents").fetchone()[0])
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (KEY,)).fetchone()
    if row is not None:
        mark = max(mark, int(row[0]))
    for (answer,) in conn.execute("SELECT answer FROM chat_turns"):
        try:
            mark = max([mark, *document_ids(json.loads(answer))])
        except ValueError:  # not JSON: it names no document
            continue
    if mark > 0:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (KEY, str(mark)))
