"""``rag`` command line: each command opens the database, calls one library function, prints.

Known errors (``RagError``) become a one-line message and exit status 1; anything else is a bug
and propagates with its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from rag.config import Settings, load_settings
from rag.errors import RagError

Handler = Callable[[argparse.Namespace, Settings], int]


def _json_default(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def print_json(value: Any, out: Any = None) -> None:
    """Pretty JSON (UTF-8, not ASCII-escaped) on stdout."""
    print(json.dumps(value, default=_json_default, ensure_ascii=False, indent=2), file=out or sys.stdout)


def print_json_line(value: Any) -> None:
    print(json.dumps(value, default=_json_default, ensure_ascii=False), flush=True)


def _groups(raw: str | None) -> list[str]:
    return [g.strip() for g in (raw or "all").split(",") if g.strip()]


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        db_path=getattr(args, "db", None),
        collection=getattr(args, "collection", None),
        embedder=getattr(args, "embedder", None),
    )


def _open(settings: Settings) -> Any:
    from rag import store

    return store.open_db(settings.db_path)


def _common(parser: argparse.ArgumentParser, collection: bool = True) -> None:
    parser.add_argument("--db", help="database file (default: RAG_DB or <data dir>/rag.db)")
    if collection:
        parser.add_argument("--collection", help="collection name (default: 'default')")


# ---------------------------------------------------------------------------------------------
# ingest / status / reindex / delete / chunks


def _progress_bar(total_hint: str) -> tuple[Callable[[int, int, int, str], None], Callable[[], None]]:
    from tqdm import tqdm

    bar: dict[str, Any] = {}

    def update(done: int, total: int, chunks: int, source: str) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, unit="doc", desc=total_hint, file=sys.stderr, dynamic_ncols=True)
        b = bar["bar"]
        b.update(done - b.n)
        elapsed = b.format_dict.get("elapsed") or 0.0
        b.set_postfix_str(f"{chunks} chunks, {chunks / elapsed if elapsed else 0:.1f} chunks/s, {source[-40:]}")

    def close() -> None:
        if "bar" in bar:
            bar["bar"].close()

    return update, close


def cmd_ingest(args: argparse.Namespace, settings: Settings) -> int:
    from rag.embedding import load_embedder
    from rag.ingest import ingest, load_acl

    conn = _open(settings)
    embedder = load_embedder(settings.embedder, settings.threads)
    update, close = _progress_bar("ingest")
    try:
        report = ingest(
            conn, args.paths, settings=settings, embedder=embedder, collection=settings.collection,
            strategy=args.strategy, acl=load_acl(args.acl), prune=args.prune, retry_failed=args.retry_failed,
            on_progress=None if args.json else update,
        )
    finally:
        close()
    if args.json:
        print_json(report)
    else:
        for failed in report.failed:
            print(f"FAILED {failed.source}: {failed.error}", file=sys.stderr)
        print(report.summary())
    return 0


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from rag.ingest import document_statuses

    conn = _open(settings)
    infos = document_statuses(conn, settings, args.collection)
    if args.json:
        print_json(infos)
        return 0
    if not infos:
        print("no documents: run `rag ingest PATH` first")
        return 0
    for d in infos:
        flags = " stale" if d.stale else ""
        error = f"  {d.error}" if d.error else ""
        print(f"{d.status:7} {d.chunk_count:5} chunks  {d.collection}/{d.source}{flags}{error}")
    counts = {s: sum(d.status == s for d in infos) for s in ("ok", "failed", "pending")}
    stale = sum(d.stale for d in infos)
    print(f"{len(infos)} documents: {counts['ok']} ok, {counts['failed']} failed, {counts['pending']} pending, "
          f"{stale} stale")
    return 0


def cmd_reindex(args: argparse.Namespace, settings: Settings) -> int:
    from rag import store
    from rag.embedding import load_embedder
    from rag.ingest import reindex

    conn = _open(settings)
    coll = store.require_collection(conn, settings.collection)
    embedder = load_embedder(args.embedder or _embedder_spec(coll.embedder), settings.threads)
    update, close = _progress_bar("reindex")
    try:
        report = reindex(conn, settings=settings, embedder=embedder, collection=settings.collection,
                         everything=args.all, on_progress=update)
    finally:
        close()
    print(report.summary())
    return 0


def _embedder_spec(model_id: str) -> str:
    """Turn a stamped model id back into something load_embedder accepts."""
    return model_id[5:] if model_id.startswith("path:") else model_id


def cmd_delete(args: argparse.Namespace, settings: Settings) -> int:
    from rag import store

    conn = _open(settings)
    coll = store.require_collection(conn, settings.collection)
    row = store.find_document(conn, coll.id, args.source)
    if row is None:
        raise RagError(f"no document {args.source!r} in collection {coll.name!r}")
    store.delete_document(conn, row["id"])
    print(f"deleted {coll.name}/{args.source}")
    return 0


def cmd_chunks(args: argparse.Namespace, settings: Settings) -> int:
    from rag import store

    conn = _open(settings)
    document_id = None
    if args.document:
        coll = store.require_collection(conn, settings.collection)
        row = store.find_document(conn, coll.id, args.document)
        if row is None:
            raise RagError(f"no document {args.document!r} in collection {coll.name!r}")
        document_id = row["id"]
    rows = store.chunk_rows(conn, document_id, settings.collection if not document_id else None)
    out = [
        {"id": r["id"], "source": r["source"], "section": r["section"], "from": r["char_from"], "to": r["char_to"],
         "page": r["page"], "token_count": r["token_count"], "truncated": bool(r["truncated"]),
         "content": r["content"], "text": r["text"]}
        for r in rows
    ]
    if args.json:
        print_json(out)
    else:
        for c in out:
            flag = " TRUNCATED" if c["truncated"] else ""
            print(f"#{c['id']} {c['source']} [{c['from']}:{c['to']}] {c['token_count']} tok{flag}  {c['section']}")
    return 0


def demo_corpus() -> Path:
    """The bundled demo corpus: the app's own user guide (docs/guide in the repository)."""
    return Path(__file__).resolve().parent.parent / "docs" / "guide"


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from rag.ingest import demo_is_current

    folder = demo_corpus()
    if not folder.is_dir():
        raise RagError(f"the demo corpus is missing ({folder}); run from a clone of the repository")
    conn = _open(settings)
    if demo_is_current(conn, folder, settings):
        print(f"demo corpus already indexed in {settings.db_path} (collection {settings.collection!r})")
        return 0
    args.paths, args.acl, args.strategy, args.json = [folder], None, None, False
    args.prune = args.retry_failed = True
    return cmd_ingest(args, settings)


# ---------------------------------------------------------------------------------------------
# parser


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    parser = argparse.ArgumentParser(prog="rag", description="Offline ask-your-documents desk.")
    sub = parser.add_subparsers(dest="command", required=True)
    handlers: dict[str, Handler] = {}

    p = sub.add_parser("ingest", help="index files and folders")
    p.add_argument("paths", nargs="+", help="files or folders (.md .markdown .txt .html .pdf)")
    _common(p)
    p.add_argument("--acl", help='access map JSON {"path or glob": ["group", ...]}')
    p.add_argument("--prune", action="store_true", help="remove documents whose files are gone")
    p.add_argument("--retry-failed", action="store_true", help="retry documents that failed before")
    p.add_argument("--strategy", choices=list("ABCDEFR"), help="chunking strategy (default: the collection's, E)")
    p.add_argument("--embedder", help="minilm | e5 | auto | PATH of a sentence-transformers model (new collections)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    handlers["ingest"] = cmd_ingest

    p = sub.add_parser("status", help="list documents with status, chunks, errors, stale flags")
    _common(p)
    p.add_argument("--json", action="store_true")
    handlers["status"] = cmd_status

    p = sub.add_parser("reindex", help="re-process stale documents, or rebuild under another embedder")
    _common(p)
    p.add_argument("--embedder", help="rebuild the collection with this embedding model")
    p.add_argument("--all", action="store_true", help="re-process every document, stale or not")
    handlers["reindex"] = cmd_reindex

    p = sub.add_parser("delete", help="delete one document")
    p.add_argument("source", help="the document's source path as shown by `rag status`")
    _common(p)
    handlers["delete"] = cmd_delete

    p = sub.add_parser("chunks", help="export chunks")
    _common(p)
    p.add_argument("--document", help="only this document (source path)")
    p.add_argument("--json", action="store_true")
    handlers["chunks"] = cmd_chunks

    p = sub.add_parser("demo", help="index the bundled user guide into the default database if needed")
    _common(p)
    handlers["demo"] = cmd_demo

    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = _settings(args)
        return handlers[args.command](args, settings)
    except RagError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
