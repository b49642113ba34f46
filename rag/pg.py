"""The PostgreSQL + pgvector backend: connection, migrations, the writes and reads SQLite does
differently, and the reader transaction that row-level security checks.

``rag.store`` stays the one storage API: ``store.open_db("postgresql://user@host:5432/desk")``
returns a ``PgConnection`` and each store function whose SQL differs between the backends hands
it to the function of the same name here. Statements both backends understand are shared: a
``PgConnection`` takes SQLite's placeholders (``?`` and ``:name``) and rows readable by index and
by name, like ``sqlite3.Row``; nothing else in the SQL is rewritten. PostgreSQL's own statements
are written here in its own syntax (``%(name)s``) and run with ``PgConnection.query``.

Invariants are the SQLite file's: ONE transaction per document version (``replace_document``),
the same stamps and statuses, and readers never see half a document (their searches run in one
REPEATABLE READ transaction, ``reader``). Row-level security is the second net under the
application's access filter: a reader's transaction does ``SET LOCAL ROLE rag_reader`` and sets
``rag.access_keys``, and the policies of ``db/migrations_pg/0002_row_level_security.sql`` show
rag_reader only the documents, chunks and vectors of those keys.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql as pgsql

from rag.errors import StorageError

if TYPE_CHECKING:
    from rag.records import Collection
    from rag.store import DocumentVersion, StoredChunk

MIGRATIONS_TABLE = "_migrations"
MIGRATION_LOCK = 0x7261_6764  # pg_advisory_xact_lock key: one process migrates at a time ("ragd")
READER_ROLE = "rag_reader"  # created by 0002_row_level_security
_WORD = re.compile(r"[^\W_]+")  # FTS5 unicode61's token characters, as rag.retrieval._WORD


# ---------------------------------------------------------------------------------------------
# Rows and the shared-SQL connection


class Row(tuple[Any, ...]):
    """A result row readable by position and by column name, as ``sqlite3.Row``."""

    _names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor: Any) -> Any:
    names = {d.name: i for i, d in enumerate(cursor.description or [])}

    def make(values: Sequence[Any]) -> Row:
        row = Row(values)
        row._names = names
        return row

    return make


# A quoted literal or identifier is copied (its % doubled); :: is a cast; ? and :name are SQLite
# placeholders; a bare % must be doubled for psycopg.
_TOKENS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|::|\?|(?<![\w:]):[A-Za-z_]\w*|%")
# Tables whose INSERTs callers read ``lastrowid`` from (sqlite3's cursor has it, psycopg's not).
_ID_TABLES = ("documents", "collections", "eval_runs", "chat_turns", "access_keys", "audit_log")
_INSERT = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)", re.IGNORECASE)


def translate(statement: str) -> str:
    """SQLite's ``?`` / ``:name`` placeholders as psycopg's ``%s`` / ``%(name)s``."""

    def swap(match: re.Match[str]) -> str:
        token = match.group(0)
        if token[0] in "'\"":
            return token.replace("%", "%%")
        if token == "?":
            return "%s"
        if token == "%":
            return "%%"
        if token == "::":
            return token
        return f"%({token[1:]})s"

    return _TOKENS.sub(swap, statement)


class Result:
    """What ``PgConnection.execute`` returns: a cursor's rows, ``rowcount`` and ``lastrowid``."""

    def __init__(self, cursor: Any, lastrowid: int | None) -> None:
        self._cursor = cursor
        self.lastrowid = lastrowid
        self.rowcount = cursor.rowcount

    def fetchone(self) -> Any:
        return self._cursor.fetchone() if self._cursor.description else None

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall() if self._cursor.description else []

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class PgConnection:
    """One psycopg connection (autocommit; transactions are explicit, as with ``rag.store``).

    ``execute`` runs a statement written for both backends; ``query`` runs PostgreSQL's own.
    """

    backend = "postgres"

    def __init__(self, raw: psycopg.Connection[Any], location: str) -> None:
        self.raw = raw
        self.location = location
        self.reading = False  # inside ``reader()``: the searches' role and access keys are set
        self.vector_types = False  # pgvector's dumpers registered (``_vector_types``)

    def execute(self, statement: str, params: Sequence[Any] | dict[str, Any] = ()) -> Result:
        text = translate(statement)
        lastrowid_wanted = False
        found = _INSERT.match(text)
        if found and found.group(1).lower() in _ID_TABLES and "RETURNING" not in text.upper():
            text += " RETURNING id"
            lastrowid_wanted = True
        # Client-side binding: values become literals, so `:x IS NULL` with None needs no type.
        cursor = psycopg.ClientCursor(self.raw, row_factory=_row_factory)
        cursor.execute(text, params)
        lastrowid = None
        if lastrowid_wanted:
            row = cursor.fetchone()
            lastrowid = None if row is None else int(row[0])
        return Result(cursor, lastrowid)

    def query(self, statement: str | pgsql.Composed, params: dict[str, Any] | Sequence[Any] | None = None) -> list[Row]:
        """Rows of a statement in PostgreSQL's own syntax (server-side parameters)."""
        cursor = self.raw.cursor(row_factory=_row_factory)
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> PgConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_postgres(conn: Any) -> bool:
    return getattr(conn, "backend", None) == "postgres"


def redact(url: str) -> str:
    """The URL without its password (in the authority or as ``?password=``), for messages."""
    parts = urlsplit(url)
    query = re.sub(r"(?i)(^|&)password=[^&]*", r"\1password=***", parts.query)
    netloc = parts.netloc
    if parts.password is not None:
        host = netloc.rsplit("@", 1)[-1]
        netloc = f"{parts.username or ''}:***@{host}"
    return urlunsplit(parts._replace(netloc=netloc, query=query))


# ---------------------------------------------------------------------------------------------
# Connection and migrations


def connect(url: str) -> PgConnection:
    """Open a connection (autocommit), or StorageError saying what is wrong with the server."""
    try:
        raw = psycopg.connect(url, autocommit=True, connect_timeout=15)
    except psycopg.Error as e:
        raise StorageError(f"cannot connect to the PostgreSQL database {redact(url)}: {str(e).strip()}") from e
    return PgConnection(raw, url)


def open_db(url: str) -> PgConnection:
    """connect() + migrate(): what every entry point uses for a ``postgresql://`` database."""
    conn = connect(url)
    try:
        migrate(conn)
    except StorageError:
        conn.close()
        raise
    except psycopg.Error as e:
        conn.close()
        raise StorageError(f"cannot prepare the PostgreSQL database {redact(url)}: {str(e).strip()} "
                           "(the first run needs the vector extension and the right to create the "
                           "rag_reader role: see docs/architecture.md, PostgreSQL)") from e
    return conn


@dataclass(frozen=True, slots=True)
class Migration:
    name: str
    sql: str
    path: Path


def all_migrations() -> list[Migration]:
    folder = Path(str(resources.files("db"))) / "migrations_pg"
    return [Migration(p.stem, p.read_text(encoding="utf-8"), p) for p in sorted(folder.glob("[0-9]*.sql"))]


def applied_migrations(conn: PgConnection) -> list[str]:
    conn.query(f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (name text PRIMARY KEY, "
               "applied_at timestamptz NOT NULL DEFAULT now())")
    return [r[0] for r in conn.query(f"SELECT name FROM {MIGRATIONS_TABLE} ORDER BY name")]


def pending_migrations(conn: PgConnection) -> list[Migration]:
    """The migrations still to apply; StorageError when a newer version has migrated the database."""
    from rag.store import refuse_newer_schema

    known = all_migrations()
    done = set(applied_migrations(conn))
    refuse_newer_schema(done, [m.name for m in known])
    return [m for m in known if m.name not in done]


def migrate(conn: PgConnection, stop_before: str | None = None) -> list[str]:
    """Apply pending migrations in order, each in one transaction; return the names applied.

    An advisory lock serialises processes that open a new database at once (the app's workers).
    """
    applied: list[str] = []
    if not pending_migrations(conn):
        return applied
    for migration in all_migrations():
        if stop_before is not None and migration.name == stop_before:
            break
        with conn.raw.transaction():
            conn.query("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            if conn.query(f"SELECT 1 FROM {MIGRATIONS_TABLE} WHERE name = %s", (migration.name,)):
                continue
            conn.raw.execute(migration.sql.encode())  # no parameters: several statements in one go
            conn.query(f"INSERT INTO {MIGRATIONS_TABLE} (name) VALUES (%s)", (migration.name,))
        applied.append(migration.name)
    return applied


@contextmanager
def transaction(conn: PgConnection) -> Iterator[PgConnection]:
    """One transaction (a savepoint when nested), rolled back on any exception."""
    with conn.raw.transaction():
        yield conn


@contextmanager
def reader(conn: PgConnection, access_keys: Sequence[int]) -> Iterator[PgConnection]:
    """A reader's searches: one REPEATABLE READ, READ ONLY transaction as ``rag_reader`` with the
    reader's access keys set locally, so the row-level security policies apply to every statement
    in it and every statement sees the same committed documents (never half of one)."""
    if conn.reading:
        raise RuntimeError("reader transactions do not nest")
    with conn.raw.transaction():
        conn.query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.query(f"SET LOCAL ROLE {READER_ROLE}")
        conn.query("SELECT set_config('rag.access_keys', %s, true)", (keys_literal(access_keys),))
        conn.reading = True
        try:
            yield conn
        finally:
            conn.reading = False


def keys_literal(access_keys: Sequence[int]) -> str:
    """An int array literal (``{1,3}``) for ``rag.access_keys``."""
    return "{" + ",".join(str(int(k)) for k in access_keys) + "}"


# ---------------------------------------------------------------------------------------------
# Vectors and FTS terms


def vector_literal(vector: np.ndarray | Sequence[float]) -> str:
    """pgvector's text form of a float32 vector. ``repr`` of each float32 (as a float64) is exact,
    so the server stores the same float32 bits as SQLite's BLOB."""
    values = np.asarray(vector, dtype=np.float32).astype(np.float64)
    return "[" + ",".join(repr(v) for v in values.tolist()) + "]"


def parse_vector(text: str) -> np.ndarray:
    """pgvector's text output (shortest round-trip decimals) as float32."""
    return np.array(text.strip("[]").split(","), dtype=np.float32)


def index_name(dimension: int) -> str:
    return f"chunk_vectors_hnsw_{int(dimension)}"


def ensure_vector_index(conn: PgConnection, dimension: int) -> str:
    """The HNSW index (cosine) over the vectors of one dimension, created if needed.

    One partial expression index per dimension (pgvector's way of indexing a column of mixed
    dimensions); the searches use the same expression and predicate (``rag.pg_retrieval``).
    """
    name = index_name(dimension)
    dim = int(dimension)
    conn.query(
        f"CREATE INDEX IF NOT EXISTS {name} ON chunk_vectors USING hnsw "
        f"((embedding::vector({dim})) vector_cosine_ops) WHERE dimension = {dim}"
    )
    return name


# The indexes a bulk load builds once at the end instead of row by row, as pg_restore creates
# indexes after the data and pgvector's documentation advises ("add an index after loading your
# initial data"): the HNSW index of the loaded dimension (ensure_vector_index), the GIN index of
# the phrase queries and the term-ordered posting index, whose every insert lands on a random
# page. Each statement is its definition in db/migrations_pg/0001_initial.sql (tests/test_pg.py
# compares them). Constraints and the append-mostly indexes (ids, access keys) stay: the load's
# own statements need them (the document lookup, ON CONFLICT, the cascades).
BULK_INDEXES = {
    "chunks_fts": "CREATE INDEX IF NOT EXISTS chunks_fts ON chunks USING gin (fts)",
    "fts_postings_scan": "CREATE INDEX IF NOT EXISTS fts_postings_scan ON fts_postings (term) "
                         "INCLUDE (collection_id, acl, chunk_id, tf_heading, tf_body, length)",
}
# Memory for those builds (this session's maintenance_work_mem, never below the server's own):
# pgvector builds HNSW fastest while the whole graph fits in it ("hnsw graph no longer fits into
# maintenance_work_mem" otherwise), about 4 bytes per dimension plus 1 KB per vector (the 100k
# index of 384-d vectors takes 195 MB); capped so that a bulk load never asks a shared server
# for more than this.
HNSW_BUILD_BYTES_PER_VECTOR = (4, 1024)  # (per dimension, per vector)
BULK_MAINTENANCE_WORK_MEM_MAX_MB = 4096


def build_memory_mb(conn: PgConnection, dimensions: Iterable[int]) -> int:
    """maintenance_work_mem for the builds: what the largest HNSW graph needs, between the server's
    own setting and BULK_MAINTENANCE_WORK_MEM_MAX_MB."""
    per_dimension, per_vector = HNSW_BUILD_BYTES_PER_VECTOR
    needed = 0
    for dim in {int(d) for d in dimensions}:
        vectors = int(conn.query("SELECT coalesce(sum(vectors), 0) FROM vector_counts WHERE dimension = %s",
                                 (dim,))[0][0])
        needed = max(needed, vectors * (per_dimension * dim + per_vector))
    current = int(conn.query("SELECT pg_size_bytes(current_setting('maintenance_work_mem'))")[0][0])
    return max(current, min(needed, BULK_MAINTENANCE_WORK_MEM_MAX_MB << 20)) >> 20


def bulk_index_names(dimensions: Iterable[int]) -> list[str]:
    return [*BULK_INDEXES, *(index_name(d) for d in sorted({int(d) for d in dimensions}))]


def missing_bulk_indexes(conn: PgConnection, dimensions: Iterable[int]) -> list[str]:
    """The bulk-load indexes absent from the database (a bulk load that did not finish)."""
    wanted = bulk_index_names(dimensions)
    present = {r[0] for r in conn.query("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                                        "AND indexname = ANY(%s)", (wanted,))}
    return [name for name in wanted if name not in present]


def drop_bulk_indexes(conn: PgConnection, dimensions: Iterable[int]) -> None:
    for name in bulk_index_names(dimensions):
        conn.query(f"DROP INDEX IF EXISTS {name}")


def build_indexes(conn: PgConnection, dimensions: Iterable[int]) -> dict[str, float]:
    """Create the missing bulk-load indexes (with ``build_memory_mb``), then VACUUM ANALYZE the
    tables (the posting lists are read by index-only scans, which need the visibility map).
    Returns seconds per index built."""
    dims = {index_name(d): int(d) for d in dimensions}
    missing = missing_bulk_indexes(conn, dims.values())
    if not missing:
        return {}
    seconds: dict[str, float] = {}
    previous = conn.query("SHOW maintenance_work_mem")[0][0]
    conn.query(f"SET maintenance_work_mem = '{build_memory_mb(conn, dims.values())}MB'")
    try:
        for name in missing:
            clock = time.perf_counter()
            if name in BULK_INDEXES:
                conn.query(BULK_INDEXES[name])
            else:
                ensure_vector_index(conn, dims[name])
            seconds[name] = time.perf_counter() - clock
    finally:
        conn.query("SELECT set_config('maintenance_work_mem', %s, false)", (previous,))
    clock = time.perf_counter()
    for table in ("chunks", "fts_postings", "chunk_vectors", "window_vectors", "fts_terms"):
        conn.query(f"VACUUM ANALYZE {table}")
    seconds["vacuum analyze"] = time.perf_counter() - clock
    return seconds


@contextmanager
def bulk_load(conn: PgConnection, dimensions: Iterable[int]) -> Iterator[dict[str, float]]:
    """Many documents at once (``rag migrate`` into an empty database, the benchmark): the bulk
    indexes are dropped for the load and built once at the end, also after an error, so the
    database is left whole (a killed load is finished by ``build_indexes``, which ``rag migrate``
    runs when it resumes). Every document is still written in its own transaction, and searches
    during the load stay correct, only slower (sequential scans). Yields a dict that receives
    the seconds of each index build.
    """
    dims = sorted({int(d) for d in dimensions})
    drop_bulk_indexes(conn, dims)
    built: dict[str, float] = {}
    try:
        yield built
    finally:
        built.update(build_indexes(conn, dims))


def fts_tokens(text: str) -> list[str]:
    """The FTS terms of folded text: runs of letters and digits, as FTS5's unicode61 splits it
    (PostgreSQL's own parser keeps "vpn-403" or "/etc/hosts" whole, so the application splits)."""
    return _WORD.findall(text.casefold())


def term_counts(heading: str, body: str) -> dict[str, tuple[int, int]]:
    """Each FTS term's occurrences in the heading and in the body (the rows of ``fts_postings``)."""
    counts: dict[str, list[int]] = {}
    for column, text in enumerate((heading, body)):
        for term in fts_tokens(text):
            counts.setdefault(term, [0, 0])[column] += 1
    return {term: (min(a, 32767), min(b, 32767)) for term, (a, b) in counts.items()}


def tsvector_literal(heading: str, body: str) -> tuple[str, int]:
    """A tsvector in text form with the heading's terms at weight A and the body's at B, and the
    token count (BM25's document length, both columns, as FTS5 counts it).

    Positions number the tokens (heading first, one gap between columns so that a phrase never
    spans them, as in FTS5); PostgreSQL keeps positions up to 16383 and 256 per term.
    """
    head, words = fts_tokens(heading), fts_tokens(body)
    positions: dict[str, list[str]] = {}
    for i, term in enumerate(head, start=1):
        positions.setdefault(term, []).append(f"{min(i, 16383)}A")
    for i, term in enumerate(words, start=len(head) + 2):
        positions.setdefault(term, []).append(f"{min(i, 16383)}B")
    # Terms are letters and digits only; quoting is for the grammar's sake.
    literal = " ".join(f"'{term}':{','.join(p[:256])}" for term, p in positions.items())
    return literal, len(head) + len(words)


# ---------------------------------------------------------------------------------------------
# Writes (each store function of the same name hands PostgreSQL to these)


def access_key(conn: PgConnection, groups_json: str) -> int:
    conn.query("INSERT INTO access_keys (groups) VALUES (%s) ON CONFLICT (groups) DO NOTHING", (groups_json,))
    return int(conn.query("SELECT id FROM access_keys WHERE groups = %s", (groups_json,))[0][0])


INSERT_DOCUMENT = """
INSERT INTO documents (collection_id, source, path, title, groups, access_key, content_hash, bytes_hash,
    canonical_text, extractor, extractor_version, status, embedder, dimension, pipeline_version)
VALUES (%(collection_id)s, %(source)s, %(path)s, %(title)s, %(groups)s, %(key)s, %(content_hash)s,
    %(bytes_hash)s, %(text)s, %(extractor)s, %(extractor_version)s, 'pending', %(embedder)s, %(dimension)s,
    %(pipeline_version)s)
RETURNING id
"""

UPDATE_DOCUMENT = """
UPDATE documents SET path = %(path)s, title = %(title)s, groups = %(groups)s, access_key = %(key)s,
    content_hash = %(content_hash)s, bytes_hash = %(bytes_hash)s, canonical_text = %(text)s,
    extractor = %(extractor)s, extractor_version = %(extractor_version)s, status = 'pending', error = NULL,
    chunk_count = 0, embedder = %(embedder)s, dimension = %(dimension)s,
    pipeline_version = %(pipeline_version)s, updated_at = rag_now()
WHERE id = %(id)s
"""

# All chunks of a document in one statement (the FTS statistics trigger then runs once per document).
INSERT_CHUNKS = """
INSERT INTO chunks (document_id, collection_id, access_key, ordinal, section, text, content, char_from, char_to,
    page, token_count, truncated, kind, fts_heading, fts_body, fts, fts_length)
SELECT %(document_id)s, %(collection_id)s, %(key)s, c.*
FROM unnest(%(ordinal)s::int[], %(section)s::text[], %(text)s::text[], %(content)s::text[], %(char_from)s::int[],
    %(char_to)s::int[], %(page)s::int[], %(token_count)s::int[], %(truncated)s::int[], %(kind)s::text[],
    %(fts_heading)s::text[], %(fts_body)s::text[], %(fts)s::tsvector[], %(fts_length)s::int[]) AS c
RETURNING id, ordinal
"""

# The rows of postings and vectors (a hundred per chunk, and a vector each) go by COPY in binary:
# no SQL text or array literal to build and parse, the vectors as pgvector's binary form (the
# pgvector package's dumper). The column types are the tables' own: binary COPY carries no types.
COPY_POSTINGS = ("COPY fts_postings (term, chunk_id, collection_id, acl, tf_heading, tf_body, length) "
                 "FROM STDIN (FORMAT BINARY)")
POSTING_TYPES = ("text", "int8", "int4", "int4", "int2", "int2", "int4")
COPY_VECTORS = "COPY chunk_vectors (chunk_id, collection_id, acl, dimension, embedding) FROM STDIN (FORMAT BINARY)"
VECTOR_TYPES = ("int8", "int8", "int8", "int4", "vector")
COPY_WINDOWS = "COPY window_vectors (chunk_id, ordinal, acl, embedding) FROM STDIN (FORMAT BINARY)"
WINDOW_TYPES = ("int8", "int4", "int8", "vector")


def _vector_types(conn: PgConnection) -> None:
    """Register pgvector's numpy dumpers on the connection, once (the extension exists by now)."""
    if not conn.vector_types:
        register_vector(conn.raw)
        conn.vector_types = True


def _copy_rows(conn: PgConnection, statement: str, types: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with conn.raw.cursor() as cursor, cursor.copy(statement) as copy:
        copy.set_types(list(types))
        for row in rows:
            copy.write_row(row)


def replace_document(
    conn: PgConnection, collection: Collection, version: DocumentVersion, chunks: Sequence[StoredChunk],
    key: int, params: dict[str, Any],
) -> int:
    """``store.replace_document`` on PostgreSQL: the document, its chunks (with their tsvector)
    and vectors in ONE transaction, the old chunks and vectors deleted in it (cascade)."""
    old = conn.query("SELECT id FROM documents WHERE collection_id = %s AND source = %s FOR UPDATE",
                     (collection.id, version.source))
    if old:
        document_id = int(old[0][0])
        conn.query("DELETE FROM chunks WHERE document_id = %s", (document_id,))  # vectors cascade
        conn.query(UPDATE_DOCUMENT, params | {"id": document_id})
    else:
        document_id = int(conn.query(INSERT_DOCUMENT, params | {"collection_id": collection.id,
                                                                "source": version.source})[0][0])
    if chunks:
        columns: dict[str, list[Any]] = {name: [] for name in (
            "ordinal", "section", "text", "content", "char_from", "char_to", "page", "token_count", "truncated",
            "kind", "fts_heading", "fts_body", "fts", "fts_length")}
        for stored in chunks:
            c = stored.chunk
            vector, length = tsvector_literal(stored.fts_heading, stored.fts_body)
            for name, value in (("ordinal", c.ordinal), ("section", c.section), ("text", c.text),
                                ("content", c.content), ("char_from", c.char_from), ("char_to", c.char_to),
                                ("page", c.page), ("token_count", c.token_count), ("truncated", int(c.truncated)),
                                ("kind", c.kind), ("fts_heading", stored.fts_heading),
                                ("fts_body", stored.fts_body), ("fts", vector), ("fts_length", length)):
                columns[name].append(value)
        ids = {int(r[1]): int(r[0]) for r in conn.query(
            INSERT_CHUNKS, columns | {"document_id": document_id, "collection_id": collection.id, "key": key})}
        _vector_types(conn)
        _copy_rows(conn, COPY_POSTINGS, POSTING_TYPES, (
            (term, ids[stored.chunk.ordinal], collection.id, key, heading, body, length)
            for stored, length in zip(chunks, columns["fts_length"], strict=True)
            for term, (heading, body) in term_counts(stored.fts_heading, stored.fts_body).items()))
        _copy_rows(conn, COPY_VECTORS, VECTOR_TYPES, (
            (ids[s.chunk.ordinal], collection.id, key, collection.dimension, np.asarray(s.vector, dtype=np.float32))
            for s in chunks))
        windows = [(ids[s.chunk.ordinal], i, key, np.asarray(v, dtype=np.float32))
                   for s in chunks if s.windows is not None for i, v in enumerate(np.asarray(s.windows))]
        if windows:
            _copy_rows(conn, COPY_WINDOWS, WINDOW_TYPES, windows)
    conn.query("UPDATE documents SET status = 'ok', chunk_count = %(n)s WHERE id = %(id)s",
               {"n": len(chunks), "id": document_id})
    return document_id


def chunk_vectors(conn: PgConnection, chunk_ids: Sequence[int]) -> dict[int, np.ndarray]:
    rows = conn.query("SELECT chunk_id, embedding::text FROM chunk_vectors WHERE chunk_id = ANY(%s)",
                      ([int(i) for i in chunk_ids],))
    return {int(r[0]): parse_vector(r[1]) for r in rows}


def set_vector_access(conn: PgConnection, document_id: int, key: int) -> None:
    """The new access key on a document's vectors and postings (its chunks are done by the caller)."""
    for table in ("chunk_vectors", "fts_postings", "window_vectors"):
        conn.query(f"UPDATE {table} SET acl = %s WHERE chunk_id IN (SELECT id FROM chunks WHERE document_id = %s)",
                   (key, document_id))


def drop_collection_vectors(conn: PgConnection, collection_id: int) -> None:
    conn.query("DELETE FROM chunk_vectors WHERE collection_id = %s", (collection_id,))
    conn.query("DELETE FROM window_vectors WHERE chunk_id IN (SELECT id FROM chunks WHERE collection_id = %s)",
               (collection_id,))


def database_size(conn: PgConnection) -> int:
    """Bytes the database takes on the server (tables, indexes, TOAST)."""
    return int(conn.query("SELECT pg_database_size(current_database())")[0][0])


def groups_json(groups: Sequence[str]) -> str:
    return json.dumps(list(groups))
