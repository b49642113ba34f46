"""0004_chunk_vectors: a plain table of vectors for the fast dense path, backfilled from vec0.

``chunk_vectors`` holds, per chunk, the float32 vector (for rescoring and for the distance of
FTS-only hits: a rowid lookup here costs microseconds, a vec0 point lookup ~0.25 ms) and its 1-bit
sign code (``embedding_bit``, bit i of byte i // 8 set when component i > 0, the layout of
sqlite-vec's vec_quantize_binary). The covering index lets the code scan read ~60 bytes per
chunk instead of whole rows. ``vector_versions`` counts every change per collection (triggers), so
a process that keeps the codes in memory knows when to reload them. A ``.py`` migration because
the backfill reads the ``vec_chunks_<dim>`` tables that exist and computes the codes.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

STATEMENTS = [
    """CREATE TABLE chunk_vectors (
        chunk_id      INTEGER PRIMARY KEY REFERENCES chunks(id) ON DELETE CASCADE,
        collection_id INTEGER NOT NULL,
        acl           INTEGER NOT NULL,           -- the chunk's access key, as in vec0
        embedding     BLOB NOT NULL,              -- float32 little-endian, L2-normalised
        embedding_bit BLOB NOT NULL               -- sign bits, little bit order
    )""",
    "CREATE INDEX chunk_vectors_scan ON chunk_vectors (collection_id, acl, chunk_id, embedding_bit)",
    """CREATE TABLE vector_versions (
        collection_id INTEGER PRIMARY KEY,        -- no foreign key: a version never goes back
        version       INTEGER NOT NULL
    )""",
    """CREATE TRIGGER chunk_vectors_ai AFTER INSERT ON chunk_vectors BEGIN
        INSERT INTO vector_versions (collection_id, version) VALUES (new.collection_id, 1)
        ON CONFLICT (collection_id) DO UPDATE SET version = version + 1;
    END""",
    """CREATE TRIGGER chunk_vectors_ad AFTER DELETE ON chunk_vectors BEGIN
        INSERT INTO vector_versions (collection_id, version) VALUES (old.collection_id, 1)
        ON CONFLICT (collection_id) DO UPDATE SET version = version + 1;
    END""",
    """CREATE TRIGGER chunk_vectors_au AFTER UPDATE ON chunk_vectors BEGIN
        INSERT INTO vector_versions (collection_id, version) VALUES (old.collection_id, 1)
        ON CONFLICT (collection_id) DO UPDATE SET version = version + 1;
        INSERT INTO vector_versions (collection_id, version) VALUES (new.collection_id, 1)
        ON CONFLICT (collection_id) DO UPDATE SET version = version + 1;
    END""",
]


def sign_bits(blob: bytes) -> bytes:
    """The 1-bit code of a float32 vector (the same function as rag.store.sign_bits)."""
    return np.packbits(np.frombuffer(blob, dtype="<f4") > 0, bitorder="little").tobytes()


def migrate(conn: Any) -> None:
    for statement in STATEMENTS:
        conn.execute(statement)
    # A random id for this database file: with the version it keys in-memory code caches, so a
    # database deleted and rebuilt at the same path is never mistaken for the old one.
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('vector_index_id', ?)", (uuid.uuid4().hex,))
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB 'vec_chunks_[0-9]*' "
        "AND sql LIKE 'CREATE VIRTUAL TABLE%'"
    )]
    for table in tables:
        rows = conn.execute(
            f"SELECT v.chunk_id, v.collection_id, v.acl, v.embedding FROM {table} v JOIN chunks c ON c.id = v.chunk_id"
        ).fetchall()
        conn.executemany(
            "INSERT INTO chunk_vectors (chunk_id, collection_id, acl, embedding, embedding_bit) VALUES (?, ?, ?, ?, ?)",
            [(r[0], r[1], r[2], r[3], sign_bits(r[3])) for r in rows],
        )
