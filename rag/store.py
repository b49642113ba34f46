"""The one SQLite file: connection, migrations, and every write and plain read.

Retrieval queries live in ``rag.retrieval``; this module owns the schema and its invariants:
a document's rows (document, chunks, FTS5 rows through triggers, vec0 rows, ``chunk_vectors``
rows) are always replaced in ONE transaction, so a crash leaves each document at its old or its new version.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import sqlite_vec

from rag.config import is_database_url
from rag.errors import ExtensionLoadError, IndexMismatchError, NotFoundError, RagError, StorageError
from rag.records import Chunk, Collection, DocumentInfo
from rag.text import nfc

# PostgreSQL (rag.pg) is the second backend: open_db() picks it for a postgresql:// URL, and the
# functions below whose SQL differs hand such a connection to rag.pg (imported only then).


def is_postgres(conn: Any) -> bool:
    """Whether ``conn`` is a ``rag.pg.PgConnection`` (without importing psycopg for SQLite users)."""
    return getattr(conn, "backend", None) == "postgres"

PUBLIC_GROUP = "all"  # every reader holds it implicitly; documents default to it
METRIC = "cosine"  # the one distance used everywhere: 1 - cos (= L2^2 / 2 on unit vectors)


def choose_sqlite(candidates: Sequence[ModuleType | None]) -> ModuleType:
    """Pick the first sqlite3-compatible module that can load extensions.

    The standard ``sqlite3`` of some Python builds (python.org macOS installers, some pyenv
    builds) lacks ``enable_load_extension``; ``pysqlite3`` (``pip install pysqlite3-binary``)
    ships its own SQLite with extension loading and FTS5.
    """
    for module in candidates:
        if module is not None and hasattr(module.Connection, "enable_load_extension"):
            return module
    raise ExtensionLoadError(
        "This Python's sqlite3 module cannot load extensions, so sqlite-vec cannot be used. "
        "Install the bundled SQLite build with `pip install pysqlite3-binary` (Linux), or use a "
        "Python built with loadable SQLite extensions (e.g. from python.org or Homebrew with "
        "--enable-loadable-sqlite-extensions)."
    )


def _import_optional(name: str) -> ModuleType | None:
    try:
        __import__(name)
    except ImportError:
        return None
    return sys.modules[name]


def _sqlite_module() -> ModuleType:
    import sqlite3 as standard

    return choose_sqlite([standard, _import_optional("pysqlite3.dbapi2")])


MMAP_BYTES = 1 << 30  # PRAGMA mmap_size: map up to 1 GiB of the database file
sqlite: ModuleType = _sqlite_module()  # the sqlite3-compatible module in use: catch sqlite.Error
Connection = Any  # sqlite.Connection of whichever module was chosen


def connect(path: str | Path, *, uri: bool = False) -> Connection:
    """Open (creating if needed) a database with sqlite-vec loaded, WAL and foreign keys on.

    The connection is in autocommit mode; group writes with ``transaction(conn)``. With ``uri``
    the path is an SQLite URI (``file:...?immutable=1``) and nothing is created.
    """
    if is_database_url(path):  # a PostgreSQL URL: its connection, not a file of that name
        from rag import pg

        return pg.connect(str(path))
    if str(path) != ":memory:" and not uri:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite.connect(str(path), isolation_level=None, timeout=30.0, uri=uri)
    conn.row_factory = sqlite.Row
    try:
        conn.enable_load_extension(True)
        sqlite_vec.load(conn)
        conn.enable_load_extension(False)
    except (AttributeError, sqlite.Error) as e:
        conn.close()
        raise ExtensionLoadError(
            f"could not load sqlite-vec into SQLite {sqlite.sqlite_version}: {e}. "
            "Reinstall it with `pip install sqlite-vec==0.1.9`."
        ) from e
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA busy_timeout = 30000")
    if uri:  # read-only (immutable): no journal mode change, no writes
        conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
        return conn
    # WAL: readers (the app) never block the writer (an ingest run) and a killed writer
    # leaves the last committed state (https://sqlite.org/wal.html). NORMAL is crash-safe in WAL.
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    # Read pages through a memory map instead of read() calls (https://sqlite.org/mmap.html): the
    # FTS5 join touches one chunks row per match, and at 100k chunks (650 MB) that took the sparse
    # branch from 73 to 51 ms p50 (rag bench, 2 cores). Only address space: pages stay in the OS cache.
    conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
    return conn


@contextmanager
def transaction(conn: Connection) -> Iterator[Connection]:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""
    if is_postgres(conn):
        from rag import pg

        with pg.transaction(conn):
            yield conn
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        # SQLite rolls back by itself on some errors (a full disk: https://sqlite.org/lang_transaction.html);
        # a second ROLLBACK would then hide the real error behind "no transaction is active".
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# ---------------------------------------------------------------------------------------------
# Migrations: a small copy of sqlite_utils.Migrations' logic (a table of applied names, each
# migration in its own transaction). sqlite-utils itself is not a dependency of this project.

MIGRATIONS_TABLE = "_migrations"


@dataclass(frozen=True, slots=True)
class Migration:
    name: str  # e.g. "0001_initial"
    sql: str | None  # .sql migrations
    path: Path


def _migration_dir() -> Path:
    return Path(str(resources.files("db"))) / "migrations"


def all_migrations() -> list[Migration]:
    """Every migration on disk, in name order (.sql files, or .py files defining migrate(conn))."""
    found = []
    for path in sorted(_migration_dir().iterdir()):
        if path.suffix == ".sql":
            found.append(Migration(path.stem, path.read_text(encoding="utf-8"), path))
        elif path.suffix == ".py" and path.stem[:4].isdigit():
            found.append(Migration(path.stem, None, path))
    return found


def applied_migrations(conn: Connection) -> list[str]:
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} "
        "(name TEXT PRIMARY KEY, applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))"
    )
    return [r[0] for r in conn.execute(f"SELECT name FROM {MIGRATIONS_TABLE} ORDER BY name")]


def pending_migrations(conn: Connection) -> list[Migration]:
    """The migrations still to apply; StorageError when a newer version has migrated the database."""
    known = all_migrations()
    done = set(applied_migrations(conn))
    refuse_newer_schema(done, [m.name for m in known])
    return [m for m in known if m.name not in done]


def refuse_newer_schema(applied: Iterable[str], known: Iterable[str]) -> None:
    """StorageError when ``applied`` names a migration this version does not have.

    A user who goes back to an older version after an upgrade would otherwise write rows that
    the newer schema's tables (vectors, logs, ...) do not get, and the newer version would read
    them back wrong. Nothing has been written when this is raised.
    """
    unknown = sorted(set(applied) - set(known))
    if unknown:
        raise StorageError(
            f"the database was upgraded by a newer version of rag-desk (its migration {unknown[-1]} is unknown "
            "to this version): run that version again, or open a copy of the database made before the "
            "upgrade; nothing was changed")


def migrate(conn: Connection, stop_before: str | None = None) -> list[str]:
    """Apply pending migrations in order, each in one transaction; return the names applied."""
    if is_postgres(conn):
        from rag import pg

        return pg.migrate(conn, stop_before)
    applied = []
    for migration in pending_migrations(conn):
        if stop_before is not None and migration.name == stop_before:
            break
        with transaction(conn):
            # Another process (the app and a command opening an older database at once) may have
            # applied it while this one waited for the write lock: it was pending when listed.
            if conn.execute(f"SELECT 1 FROM {MIGRATIONS_TABLE} WHERE name = ?", (migration.name,)).fetchone():
                continue
            if migration.sql is not None:
                for statement in _split_sql(migration.sql):
                    conn.execute(statement)
            else:
                namespace: dict[str, Any] = {}
                exec(compile(migration.path.read_text(encoding="utf-8"), str(migration.path), "exec"), namespace)
                namespace["migrate"](conn)
            conn.execute(f"INSERT INTO {MIGRATIONS_TABLE} (name) VALUES (?)", (migration.name,))
        applied.append(migration.name)
    return applied


def _split_sql(script: str) -> list[str]:
    """Split a script into complete statements with SQLite's own parser (complete_statement).

    ``executescript`` would COMMIT our transaction, so statements are run one by one.
    """
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite.complete_statement(current):
            if current.strip():
                statements.append(current.strip())
            current = ""
    if current.strip() and not current.strip().startswith("--"):
        statements.append(current.strip())
    return [s for s in statements if any(ln.strip() and not ln.strip().startswith("--") for ln in s.splitlines())]


def open_db(path: str | Path, *, create: bool = True) -> Connection:
    """connect() + migrate(): what every entry point uses.

    Every way the file can be wrong becomes a ``StorageError`` that names the file and the fix:
    a folder, a file that is not SQLite, a missing file when ``create`` is False (read-only
    commands never create a database or its folder), a read-only file or folder (opened
    read-only, so it can still be searched), a full disk. A ``postgresql://`` URL opens that
    database (``rag.pg.open_db``; the database itself must exist, so ``create`` does not apply).
    """
    if is_database_url(path):
        from rag import pg

        return pg.open_db(str(path))
    if str(path) == ":memory:":
        conn = connect(path)
        migrate(conn)
        return conn
    file = Path(path)
    if file.is_dir():
        raise StorageError(_folder_problem(file))
    if not file.exists():
        if not create:
            raise StorageError(f"no database at {file}: check the path (rag ingest creates one)")
        if file.parent.exists() and not file.parent.is_dir():
            raise StorageError(f"cannot create the database {file}: {file.parent} is a file, not a folder")
    try:
        conn = _connect_writable_or_read_only(file)
    except sqlite.DatabaseError as e:
        raise StorageError(_storage_problem(file, e)) from e
    except OSError as e:
        raise StorageError(f"cannot create the database {file}: {e.strerror or e}") from e
    return conn


def _connect_writable_or_read_only(file: Path) -> Connection:
    conn = None
    try:
        conn = connect(file)
        migrate(conn)
        return conn
    except StorageError:
        if conn is not None:
            conn.close()
        raise
    except sqlite.OperationalError as e:
        if conn is not None:
            conn.close()
        if not file.exists() or not _read_only_problem(e):
            raise
    # A read-only file or folder (backup media): WAL needs its -shm file, so open the file as
    # immutable (https://sqlite.org/uri.html#uriimmutable) for reading; writes fail with a message.
    conn = connect(f"file:{file.resolve()}?immutable=1", uri=True)
    try:
        pending = pending_migrations(conn)
    except StorageError:  # migrated by a newer version
        conn.close()
        raise
    if pending:
        conn.close()
        raise StorageError(f"the database {file} is read-only and needs an upgrade: open it once where it can be "
                           "written")
    return conn


def _read_only_problem(error: Exception) -> bool:
    text = str(error).lower()
    return "readonly" in text or "read-only" in text or "unable to open" in text


def database_errors() -> tuple[type[Exception], ...]:
    """The drivers' base error classes (for an ``except``): sqlite's, and psycopg's once loaded."""
    errors: list[type[Exception]] = [sqlite.Error]
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None:
        errors.append(psycopg.Error)
    return tuple(errors)


def describe_storage_error(file: str | Path, error: Exception) -> str:
    """One line for a user: what is wrong with the database file and what to do."""
    if is_database_url(file):
        from rag import pg

        return f"the PostgreSQL database {pg.redact(str(file))} answered: {str(error).strip().splitlines()[0]}"
    return _storage_problem(Path(file), error)


def _storage_problem(file: Path, error: Exception) -> str:
    text = str(error).lower()
    if "not a database" in text or "malformed" in text or "file is encrypted" in text:
        return f"{file} is not a rag-desk database (not SQLite, or damaged): point --db / RAG_DB at another file"
    if "disk is full" in text or "database or disk is full" in text:
        return f"the disk holding {file} is full: free some space and run again (nothing was half-written)"
    if _read_only_problem(error):
        return (f"the database {file} is read-only here ({error}): searching works, but indexing needs a "
                "writable copy")
    if "locked" in text or "busy" in text:
        return f"the database {file} is busy (another process holds a write lock): try again when it finishes"
    return f"cannot open the database {file}: {error}"


# ---------------------------------------------------------------------------------------------
# Vectors


def serialize_vector(vector: np.ndarray | Sequence[float]) -> bytes:
    """float32 little-endian bytes, the layout vec0 expects (the one helper used everywhere)."""
    return np.asarray(vector, dtype="<f4").tobytes()


def deserialize_vector(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4")


def sign_bits(vector: np.ndarray | bytes) -> bytes:
    """The 1-bit code of a vector: bit i (little bit order) set when component i > 0.

    The layout of sqlite-vec's ``vec_quantize_binary``, for any dimension (the last byte is
    zero-padded). Stored in ``chunk_vectors.embedding_bit`` for the in-memory Hamming scan.
    """
    values = np.frombuffer(vector, dtype="<f4") if isinstance(vector, bytes) else np.asarray(vector, dtype=np.float32)
    return np.packbits(values > 0, bitorder="little").tobytes()


def vector_table(dimension: int) -> str:
    """Name of the vec0 table holding vectors of this dimension (an identifier chosen in code)."""
    return f"vec_chunks_{int(dimension)}"


def ensure_vector_table(conn: Connection, dimension: int) -> str:
    """Create the vec0 table for ``dimension`` if needed.

    The collection is the partition key and ``acl`` (the access key) a metadata column, so
    both filters run INSIDE the KNN scan (no post-filtering). ``embedding_bit`` holds the
    binary-quantized copy used as a fast prefilter before float rescoring.
    """
    if is_postgres(conn):
        from rag import pg

        return pg.ensure_vector_index(conn, dimension)
    name = vector_table(dimension)
    bit_column = f", embedding_bit BIT[{int(dimension)}]" if has_binary(dimension) else ""
    conn.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {name} USING vec0("
        "chunk_id INTEGER PRIMARY KEY, "
        "collection_id INTEGER PARTITION KEY, "
        "acl INTEGER, "
        f"embedding FLOAT[{int(dimension)}] distance_metric={METRIC}"
        f"{bit_column})"
    )
    return name


def has_binary(dimension: int) -> bool:
    """sqlite-vec's vec_quantize_binary needs a dimension divisible by 8."""
    return dimension % 8 == 0


# ---------------------------------------------------------------------------------------------
# Collections


def _collection(row: Any) -> Collection:
    return Collection(
        id=row["id"],
        name=row["name"],
        embedder=row["embedder"],
        dimension=row["dimension"],
        metric=row["metric"],
        strategy=row["strategy"],
        max_distance=row["max_distance"],
    )


def get_collection(conn: Connection, name: str) -> Collection | None:
    row = conn.execute("SELECT * FROM collections WHERE name = ?", (name,)).fetchone()
    return _collection(row) if row else None


def require_collection(conn: Connection, name: str) -> Collection:
    found = get_collection(conn, name)
    if found is None:
        names = [c.name for c in list_collections(conn)]
        hint = f" Collections here: {', '.join(names)}." if names else " The database is empty: run `rag ingest` first."
        raise NotFoundError(f"no collection named {name!r}.{hint}")
    return found


def list_collections(conn: Connection) -> list[Collection]:
    return [_collection(r) for r in conn.execute("SELECT * FROM collections ORDER BY name")]


def create_collection(
    conn: Connection, name: str, embedder: str, dimension: int, strategy: str = "E", metric: str = METRIC,
    max_distance: float | None = None,
) -> Collection:
    """A new, empty collection stamped with its model; ``max_distance`` is its gate threshold
    (None: the settings default applies)."""
    with transaction(conn):
        conn.execute(
            "INSERT INTO collections (name, embedder, dimension, metric, strategy, max_distance) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (name, embedder, dimension, metric, strategy, max_distance),
        )
        ensure_vector_table(conn, dimension)
    return require_collection(conn, name)


def check_embedder(collection: Collection, embedder: str, dimension: int) -> None:
    """Refuse to mix embedding models in one collection."""
    if collection.embedder != embedder or collection.dimension != dimension or collection.metric != METRIC:
        raise IndexMismatchError(
            f"collection {collection.name!r} was built with embedding model {collection.embedder!r} "
            f"({collection.dimension}-d, {collection.metric}) but {embedder!r} ({dimension}-d) was asked for. "
            f"Vectors from different models cannot be mixed: use the collection's own model, or rebuild "
            f"it with `rag reindex --collection {collection.name} --embedder NEW_MODEL`."
        )


def set_collection_threshold(conn: Connection, name: str, max_distance: float | None) -> None:
    conn.execute("UPDATE collections SET max_distance = ? WHERE name = ?", (max_distance, name))


def set_collection_embedder(conn: Connection, collection_id: int, embedder: str, dimension: int) -> None:
    """Restamp a collection (inside the caller's transaction, after its vectors are gone)."""
    conn.execute(
        "UPDATE collections SET embedder = ?, dimension = ?, max_distance = NULL WHERE id = ?",
        (embedder, dimension, collection_id),
    )
    ensure_vector_table(conn, dimension)


# ---------------------------------------------------------------------------------------------
# Access control


def normalize_groups(groups: Iterable[str] | None) -> list[str]:
    """Sorted, deduplicated, stripped group names in NFC; empty means public (``["all"]``).

    NFC: "nhân-sự" copied from a macOS folder name (NFD) and typed on a keyboard are one group.
    """
    cleaned = sorted({nfc(g.strip()) for g in (groups or []) if g and g.strip()})
    return cleaned or [PUBLIC_GROUP]


def access_key(conn: Connection, groups: Iterable[str]) -> int:
    """The id of this exact group set, created on first use."""
    key = json.dumps(normalize_groups(groups))
    if is_postgres(conn):
        from rag import pg

        return pg.access_key(conn, key)
    conn.execute("INSERT OR IGNORE INTO access_keys (groups) VALUES (?)", (key,))
    return int(conn.execute("SELECT id FROM access_keys WHERE groups = ?", (key,)).fetchone()[0])


# The group set of a withheld document: empty, which no reader's groups can meet (normalize_groups
# never yields it, so no reader holds it and visible_access_keys never returns its key).
WITHHELD_GROUPS = "[]"


def withheld_access_key(conn: Connection) -> int:
    """The access key no reader may see: a failed document whose permissions are unknown."""
    if is_postgres(conn):
        from rag import pg

        return pg.access_key(conn, WITHHELD_GROUPS)
    conn.execute("INSERT OR IGNORE INTO access_keys (groups) VALUES (?)", (WITHHELD_GROUPS,))
    return int(conn.execute("SELECT id FROM access_keys WHERE groups = ?", (WITHHELD_GROUPS,)).fetchone()[0])


def visible_access_keys(conn: Connection, groups: Iterable[str]) -> list[int]:
    """Access keys a reader may see: those whose groups meet the reader's groups.

    Every reader implicitly holds ``all``, so public documents are visible to everyone.
    """
    mine = set(normalize_groups(groups)) | {PUBLIC_GROUP}
    return [
        int(row["id"])
        for row in conn.execute("SELECT id, groups FROM access_keys ORDER BY id")
        if mine & {nfc(g) for g in json.loads(row["groups"])}  # a key stored before names were NFC
    ]


# ---------------------------------------------------------------------------------------------
# Documents


@dataclass(frozen=True, slots=True)
class DocumentVersion:
    """Everything that describes one processed version of a document."""

    source: str
    path: str
    title: str
    groups: list[str]
    content_hash: str
    bytes_hash: str
    canonical_text: str
    extractor: str
    extractor_version: str
    embedder: str
    dimension: int
    pipeline_version: str


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """A chunk with its vector and folded FTS texts, ready to be written."""

    chunk: Chunk
    vector: np.ndarray
    fts_heading: str
    fts_body: str
    windows: np.ndarray | None = None  # (n, dimension) vectors of its sentence windows, or None


def document_names(conn: Connection, collection_id: int) -> dict[str, tuple[str, int]]:
    """Each stored document's source name -> (the absolute path it was last read from, its access
    key): what an ingest run checks its files against, without reading any document's text."""
    rows = conn.execute("SELECT source, path, access_key FROM documents WHERE collection_id = ?", (collection_id,))
    return {row["source"]: (row["path"], int(row["access_key"])) for row in rows}


def find_document(conn: Connection, collection_id: int, source: str) -> Any | None:
    return conn.execute(
        "SELECT * FROM documents WHERE collection_id = ? AND source = ?", (collection_id, source)
    ).fetchone()


def find_named_document(conn: Connection, collection_id: int, name: str) -> Any | None:
    """The document a person names (``rag source``, ``rag delete``): its source exactly as given,
    else in NFC, the form names are stored in, so a name pasted from macOS (NFD) finds it too."""
    found = find_document(conn, collection_id, name)
    return found if found is not None or nfc(name) == name else find_document(conn, collection_id, nfc(name))


def _delete_vectors(conn: Connection, dimension: int, document_id: int) -> None:
    if is_postgres(conn):
        return  # PostgreSQL: chunk_vectors rows go with their chunks (ON DELETE CASCADE)
    table = vector_table(dimension)
    conn.execute(
        f"DELETE FROM {table} WHERE chunk_id IN (SELECT id FROM chunks WHERE document_id = ?)", (document_id,)
    )
    conn.execute("DELETE FROM chunk_vectors WHERE chunk_id IN (SELECT id FROM chunks WHERE document_id = ?)",
                 (document_id,))


def replace_document(
    conn: Connection, collection: Collection, version: DocumentVersion, chunks: Sequence[StoredChunk]
) -> int:
    """Write one document version and all its chunks, vectors and FTS rows in ONE transaction.

    Returns the document id. Old chunks, FTS rows (through triggers) and vectors go in the
    same transaction, so readers and crashes see either the old version or the new one.
    """
    check_embedder(collection, version.embedder, version.dimension)
    table = vector_table(collection.dimension)
    binary = has_binary(collection.dimension)
    insert_vector = (
        f"INSERT INTO {table} (chunk_id, collection_id, acl, embedding, embedding_bit) "
        "VALUES (?, ?, ?, ?, vec_quantize_binary(?))"
        if binary
        else f"INSERT INTO {table} (chunk_id, collection_id, acl, embedding) VALUES (?, ?, ?, ?)"
    )
    with transaction(conn):
        key = access_key(conn, version.groups)
        if is_postgres(conn):
            from rag import pg

            return pg.replace_document(conn, collection, version, chunks, key, _version_params(version, key))
        old = find_document(conn, collection.id, version.source)
        if old is not None:
            _delete_vectors(conn, collection.dimension, old["id"])
            conn.execute("DELETE FROM chunks WHERE document_id = ?", (old["id"],))
            conn.execute(
                """UPDATE documents SET path = :path, title = :title, groups = :groups, access_key = :key,
                   content_hash = :content_hash, bytes_hash = :bytes_hash, canonical_text = :text,
                   extractor = :extractor, extractor_version = :extractor_version, status = 'pending',
                   error = NULL, chunk_count = 0, embedder = :embedder, dimension = :dimension,
                   pipeline_version = :pipeline_version,
                   updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = :id""",
                _version_params(version, key) | {"id": old["id"]},
            )
            document_id = int(old["id"])
        else:
            document_id = _new_document_id(conn)
            conn.execute(
                """INSERT INTO documents (id, collection_id, source, path, title, groups, access_key, content_hash,
                   bytes_hash, canonical_text, extractor, extractor_version, status, embedder, dimension,
                   pipeline_version)
                   VALUES (:id, :collection_id, :source, :path, :title, :groups, :key, :content_hash, :bytes_hash,
                   :text, :extractor, :extractor_version, 'pending', :embedder, :dimension, :pipeline_version)""",
                _version_params(version, key) | {"id": document_id, "collection_id": collection.id,
                                                 "source": version.source},
            )
        for stored in chunks:
            c = stored.chunk
            cursor = conn.execute(
                """INSERT INTO chunks (document_id, collection_id, access_key, ordinal, section, text, content,
                   char_from, char_to, page, token_count, truncated, kind, fts_heading, fts_body)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (
                    document_id, collection.id, key, c.ordinal, c.section, c.text, c.content, c.char_from,
                    c.char_to, c.page, c.token_count, int(c.truncated), c.kind, stored.fts_heading, stored.fts_body,
                ),
            )
            blob = serialize_vector(stored.vector)
            conn.execute(insert_vector, (cursor.lastrowid, collection.id, key, blob, blob)[: 5 if binary else 4])
            conn.execute(INSERT_PLAIN_VECTOR, (cursor.lastrowid, collection.id, key, blob, sign_bits(blob)))
            if stored.windows is not None:
                insert_window_vectors(conn, int(cursor.lastrowid), stored.windows)
        # chunk_count is written by the server when the document commits.
        conn.execute(
            "UPDATE documents SET status = 'ok', chunk_count = "
            "(SELECT count(*) FROM chunks WHERE document_id = :id) WHERE id = :id",
            {"id": document_id},
        )
    return document_id


INSERT_PLAIN_VECTOR = (
    "INSERT INTO chunk_vectors (chunk_id, collection_id, acl, embedding, embedding_bit) VALUES (?, ?, ?, ?, ?)"
)


INSERT_WINDOW_VECTOR = "INSERT INTO window_vectors (chunk_id, ordinal, embedding) VALUES (?, ?, ?)"


def insert_window_vectors(conn: Connection, chunk_id: int, vectors: np.ndarray) -> None:
    """The sentence-window vectors of one chunk (inside the caller's transaction)."""
    conn.executemany(INSERT_WINDOW_VECTOR,
                     [(chunk_id, i, serialize_vector(v)) for i, v in enumerate(np.asarray(vectors))])


def _version_params(version: DocumentVersion, key: int) -> dict[str, Any]:
    return {
        "path": version.path,
        "title": version.title,
        "groups": json.dumps(normalize_groups(version.groups)),
        "key": key,
        "content_hash": version.content_hash,
        "bytes_hash": version.bytes_hash,
        "text": version.canonical_text,
        "extractor": version.extractor,
        "extractor_version": version.extractor_version,
        "embedder": version.embedder,
        "dimension": version.dimension,
        "pipeline_version": version.pipeline_version,
    }


def record_failure(
    conn: Connection, collection: Collection, source: str, path: str, groups: Sequence[str] | None,
    bytes_hash: str, content_hash: str, error: str,
) -> int:
    """Mark a document failed with its reason, failing closed on permissions.

    A document that was fine before keeps its previous chunks (nothing is lost), but never with
    looser permissions than the newest ones known: ``groups`` (from the access map) are applied to
    the old version at once, and ``None`` (the new permissions could not be read) withholds the
    old version from every reader until a readable file replaces it.
    """
    with transaction(conn):
        key = access_key(conn, groups) if groups is not None else withheld_access_key(conn)
        shown = json.dumps(normalize_groups(groups)) if groups is not None else WITHHELD_GROUPS
        old = find_document(conn, collection.id, source)
        if old is not None:
            conn.execute(
                "UPDATE documents SET status = 'failed', error = ?, content_hash = CASE WHEN chunk_count = 0 "
                "THEN ? ELSE content_hash END, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ?",
                (error, content_hash, old["id"]),
            )
            if old["access_key"] != key:
                _set_document_access(conn, collection, int(old["id"]), shown, key)
            return int(old["id"])
        values = (collection.id, source, path, shown, key, content_hash, bytes_hash, error)
        if is_postgres(conn):  # an identity column: it never gives a number twice
            cursor = conn.execute(
                """INSERT INTO documents (collection_id, source, path, groups, access_key, content_hash, bytes_hash,
                   status, error) VALUES (?, ?, ?, ?, ?, ?, ?, 'failed', ?)""", values)
            return int(cursor.lastrowid)
        document_id = _new_document_id(conn)
        conn.execute(
            """INSERT INTO documents (id, collection_id, source, path, groups, access_key, content_hash, bytes_hash,
               status, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'failed', ?)""",
            (document_id, *values),
        )
        return document_id


_LAST_DOCUMENT_ID = "documents:last_id"  # the meta key of the highest document id ever given (SQLite)


def _new_document_id(conn: Connection) -> int:
    """The id of a new SQLite document: above every id given before, deleted ones included.

    A rowid table without AUTOINCREMENT gives a new row the largest id + 1, so a document added
    after the newest one was deleted took its id, and a citation link to the deleted document
    (``?document=ID``) opened the new one. Rebuilding the table with AUTOINCREMENT would rewrite
    every database; a high-water mark in ``meta`` does the same (PostgreSQL's identity column
    never reuses a number). Call it inside the insert's transaction.
    """
    top = int(conn.execute("SELECT coalesce(max(id), 0) FROM documents").fetchone()[0])
    document_id = max(top, int(get_meta(conn, _LAST_DOCUMENT_ID) or 0)) + 1
    set_meta(conn, _LAST_DOCUMENT_ID, str(document_id))
    return document_id


def update_document_groups(conn: Connection, collection: Collection, document_id: int, groups: Sequence[str]) -> None:
    """Change who may read a document without re-embedding it (documents, chunks and vec0 rows)."""
    with transaction(conn):
        key = access_key(conn, groups)
        _set_document_access(conn, collection, document_id, json.dumps(normalize_groups(groups)), key)


def _set_document_access(conn: Connection, collection: Collection, document_id: int, groups_json: str,
                         key: int) -> None:
    table = vector_table(collection.dimension)
    conn.execute(
        "UPDATE documents SET groups = ?, access_key = ?, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
        "WHERE id = ?",
        (groups_json, key, document_id),
    )
    conn.execute("UPDATE chunks SET access_key = ? WHERE document_id = ?", (key, document_id))
    if is_postgres(conn):
        from rag import pg

        pg.set_vector_access(conn, document_id, key)
        return
    # One row at a time: sqlite-vec 0.1.9 rejects a multi-row UPDATE here as if it touched the
    # partition key ("UPDATE on partition key columns are not supported yet").
    chunk_ids = [r[0] for r in conn.execute("SELECT id FROM chunks WHERE document_id = ?", (document_id,))]
    for chunk_id in chunk_ids:
        conn.execute(f"UPDATE {table} SET acl = ? WHERE chunk_id = ?", (key, chunk_id))
    conn.execute("UPDATE chunk_vectors SET acl = ? WHERE chunk_id IN (SELECT id FROM chunks WHERE document_id = ?)",
                 (key, document_id))


def set_document_path(conn: Connection, document_id: int, path: str) -> None:
    """Record where an unchanged document's file lives now (a moved ingest root)."""
    conn.execute("UPDATE documents SET path = ? WHERE id = ?", (path, document_id))


def delete_document(conn: Connection, document_id: int) -> None:
    row = conn.execute(
        "SELECT d.id, c.dimension FROM documents d JOIN collections c ON c.id = d.collection_id WHERE d.id = ?",
        (document_id,),
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no document with id {document_id}")
    with transaction(conn):
        _delete_vectors(conn, row["dimension"], document_id)
        conn.execute("DELETE FROM documents WHERE id = ?", (document_id,))  # chunks cascade; FTS via trigger


def drop_collection_vectors(conn: Connection, collection: Collection) -> None:
    """Delete every vector of a collection (inside the caller's transaction)."""
    if is_postgres(conn):
        from rag import pg

        pg.drop_collection_vectors(conn, collection.id)
        return
    conn.execute(f"DELETE FROM {vector_table(collection.dimension)} WHERE collection_id = ?", (collection.id,))
    conn.execute("DELETE FROM chunk_vectors WHERE collection_id = ?", (collection.id,))
    conn.execute("DELETE FROM window_vectors WHERE chunk_id IN (SELECT id FROM chunks WHERE collection_id = ?)",
                 (collection.id,))


# ---------------------------------------------------------------------------------------------
# Reads


def document_rows(conn: Connection, collection: str | None = None) -> list[Any]:
    sql = (
        "SELECT d.*, c.name AS collection FROM documents d JOIN collections c ON c.id = d.collection_id"
        + (" WHERE c.name = ?" if collection else "")
        + " ORDER BY c.name, d.source"
    )
    return list(conn.execute(sql, (collection,) if collection else ()))


def to_document_info(row: Any, stale: bool) -> DocumentInfo:
    return DocumentInfo(
        id=row["id"],
        collection=row["collection"],
        source=row["source"],
        path=row["path"],
        title=row["title"],
        groups=json.loads(row["groups"]),
        status=row["status"],
        error=row["error"],
        chunk_count=row["chunk_count"],
        embedder=row["embedder"],
        pipeline_version=row["pipeline_version"],
        extractor=row["extractor"],
        extractor_version=row["extractor_version"],
        stale=stale,
        updated_at=row["updated_at"],
    )


def get_document(conn: Connection, document_id: int) -> Any:
    row = conn.execute(
        "SELECT d.*, c.name AS collection FROM documents d JOIN collections c ON c.id = d.collection_id "
        "WHERE d.id = ?",
        (document_id,),
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no document with id {document_id}")
    return row


def get_chunk(conn: Connection, chunk_id: int) -> Any | None:
    """One chunk with its document's source and title (None when there is no such chunk)."""
    return conn.execute(
        "SELECT k.*, d.source, d.title FROM chunks k JOIN documents d ON d.id = k.document_id WHERE k.id = ?",
        (chunk_id,),
    ).fetchone()


def chunk_rows(conn: Connection, document_id: int | None = None, collection: str | None = None) -> list[Any]:
    """Chunks with their document's source and title, in document order."""
    where: list[str] = []
    params: list[Any] = []
    if document_id is not None:
        where.append("k.document_id = ?")
        params.append(document_id)
    if collection is not None:
        where.append("c.name = ?")
        params.append(collection)
    sql = (
        "SELECT k.*, d.source, d.title FROM chunks k JOIN documents d ON d.id = k.document_id "
        "JOIN collections c ON c.id = k.collection_id"
        + (" WHERE " + " AND ".join(where) if where else "")
        + " ORDER BY d.source, k.ordinal"
    )
    return list(conn.execute(sql, params))


def window_vectors(conn: Connection, chunk_ids: Sequence[int]) -> dict[int, np.ndarray]:
    """The sentence-window vectors of each chunk that has them, as (n, dimension) arrays in order."""
    if not chunk_ids:
        return {}
    ids = [int(i) for i in chunk_ids]
    if is_postgres(conn):
        from rag import pg

        rows = [(int(r[0]), pg.parse_vector(r[1])) for r in conn.query(
            "SELECT chunk_id, embedding::text FROM window_vectors WHERE chunk_id = ANY(%s) ORDER BY chunk_id, ordinal",
            (ids,))]
    else:
        marks = ",".join("?" * len(ids))
        rows = [(int(r[0]), deserialize_vector(r[1])) for r in conn.execute(
            f"SELECT chunk_id, embedding FROM window_vectors WHERE chunk_id IN ({marks}) ORDER BY chunk_id, ordinal",
            ids)]
    grouped: dict[int, list[np.ndarray]] = {}
    for chunk_id, vector in rows:
        grouped.setdefault(chunk_id, []).append(vector)
    return {chunk_id: np.stack(vectors) for chunk_id, vectors in grouped.items()}


def chunk_vectors(conn: Connection, dimension: int, chunk_ids: Sequence[int]) -> dict[int, np.ndarray]:
    """Stored float vectors by chunk id (point lookups on the vec0 table)."""
    if not chunk_ids:
        return {}
    if is_postgres(conn):
        from rag import pg

        return pg.chunk_vectors(conn, chunk_ids)
    marks = ",".join("?" * len(chunk_ids))
    rows = conn.execute(
        f"SELECT chunk_id, embedding FROM {vector_table(dimension)} WHERE chunk_id IN ({marks})", list(chunk_ids)
    )
    return {int(r[0]): deserialize_vector(r[1]) for r in rows}


def get_meta(conn: Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_meta(conn: Connection, key: str, value: str) -> None:
    conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                 (key, value))


def display_location(location: str | Path) -> str:
    """The database as shown to people: a file path, or a PostgreSQL URL without its password."""
    if is_database_url(location):
        from rag import pg

        return pg.redact(str(location))
    return str(location)


def database_exists(location: str | Path) -> bool:
    """Whether there is a database to read at ``location``: an SQLite file, or any PostgreSQL URL
    (the server says whether it exists when it is opened)."""
    return is_database_url(location) or Path(location).is_file()


def require_database(location: str | Path, hint: str = "build one with `rag ingest DIR --db FILE` first") -> None:
    """Refuse, before a model loads, a database that is not there, with the words ``open_db`` uses.

    Raises:
        StorageError: ``location`` is a folder, or no file (``hint`` says what to do).
    """
    if database_exists(location):
        return
    file = Path(location)
    if file.is_dir():
        raise StorageError(_folder_problem(file))
    raise StorageError(f"no database at {file}: {hint}")


def _folder_problem(file: Path) -> str:
    return f"the database path {file} is a folder; give a file such as {file / 'rag.db'}"


def ensure_writable(path: str | Path) -> None:
    """Fail early, with a clear message, when the database directory cannot be written."""
    if is_database_url(path):
        return
    parent = Path(path).expanduser().resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RagError(f"cannot create the database directory {parent}: {e}") from e
