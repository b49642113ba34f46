"""Ingest: idempotency, failure isolation, access maps, prune, retry, stale + reindex."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from rag import store
from rag.config import Settings
from rag.errors import IndexMismatchError, RagError
from rag.ingest import AclRules, document_statuses, ingest, load_acl, reindex, retry_failed_documents

from .conftest import vector_access_keys
from .fakes import FakeEmbedder


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py), but the SQLITE_ONLY ones."""
    return backend_db


def write(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    write(
        root,
        "guide.md",
        "---\ntitle: Guide\n---\n\n## Install\n\nRun make run to start.\n\n## Use\n\nAsk a question.\n",
    )
    write(root, "notes.txt", "Notes\n\nThe backup runs nightly at 02:00.\n")
    write(
        root,
        "sub/page.html",
        "<html><head><title>Page</title></head><body><h1>Page</h1><p>Hello html.</p></body></html>",
    )
    return root


def statuses(conn: store.Connection, settings: Settings) -> dict[str, str]:
    return {d.source: d.status for d in document_statuses(conn, settings)}


def test_ingest_is_idempotent_and_embeds_nothing_the_second_time(
    conn: store.Connection, settings: Settings, corpus: Path
) -> None:
    embedder = FakeEmbedder()
    first = ingest(conn, [corpus], settings=settings, embedder=embedder)
    assert first.count("ok") == 3 and first.chunks_embedded > 0
    calls = embedder.calls
    second = ingest(conn, [corpus], settings=settings, embedder=embedder)
    assert second.count("unchanged") == 3 and second.chunks_embedded == 0
    assert embedder.calls == calls
    assert statuses(conn, settings) == {"guide.md": "ok", "notes.txt": "ok", "sub/page.html": "ok"}
    # every stored chunk is an exact slice of the stored canonical text
    for row in store.document_rows(conn):
        for chunk in store.chunk_rows(conn, row["id"]):
            assert row["canonical_text"][chunk["char_from"] : chunk["char_to"]] == chunk["content"]
        assert row["chunk_count"] == len(store.chunk_rows(conn, row["id"]))


def test_changed_file_is_replaced_and_others_untouched(
    conn: store.Connection, settings: Settings, corpus: Path
) -> None:
    embedder = FakeEmbedder()
    ingest(conn, [corpus], settings=settings, embedder=embedder)
    write(corpus, "notes.txt", "Notes\n\nThe backup now runs at 03:00.\n")
    report = ingest(conn, [corpus], settings=settings, embedder=embedder)
    assert {r.source: r.status for r in report.results} == {
        "guide.md": "unchanged",
        "notes.txt": "ok",
        "sub/page.html": "unchanged",
    }
    text = conn.execute("SELECT canonical_text FROM documents WHERE source = 'notes.txt'").fetchone()[0]
    assert "03:00" in text


def test_a_broken_file_fails_alone_with_a_reason(conn: store.Connection, settings: Settings, corpus: Path) -> None:
    write(corpus, "latin1.txt", "caf\xe9 au lait".encode("latin-1"))
    write(corpus, "empty.md", "")
    write(corpus, "blank.md", "   \n\n  \n")
    write(corpus, "broken.pdf", b"%PDF-1.4\nthis is not really a pdf")
    report = ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    by_source = {r.source: r for r in report.results}
    assert by_source["guide.md"].status == "ok" and by_source["notes.txt"].status == "ok"
    assert "not UTF-8" in (by_source["latin1.txt"].error or "")
    assert "empty" in (by_source["empty.md"].error or "")
    assert "no text" in (by_source["blank.md"].error or "")
    assert "PDF" in (by_source["broken.pdf"].error or "")
    infos = {d.source: d for d in document_statuses(conn, settings)}
    assert infos["latin1.txt"].status == "failed" and infos["latin1.txt"].error
    assert infos["broken.pdf"].chunk_count == 0


def test_failed_documents_are_skipped_until_retry(conn: store.Connection, settings: Settings, corpus: Path) -> None:
    write(corpus, "bad.txt", b"\xff\xfe\xfa")  # BOM says UTF-16, bytes are not
    embedder = FakeEmbedder()
    ingest(conn, [corpus], settings=settings, embedder=embedder)
    again = ingest(conn, [corpus], settings=settings, embedder=embedder)
    assert {r.source: r.status for r in again.results}["bad.txt"] == "failed"
    write(corpus, "bad.txt", "now readable text")
    fixed = ingest(conn, [corpus], settings=settings, embedder=embedder)
    assert {r.source: r.status for r in fixed.results}["bad.txt"] == "ok"


def test_retry_failed_reattempts_unchanged_failures(
    conn: store.Connection, settings: Settings, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag import ingest as ingest_module

    real = ingest_module.prepare_chunks

    def flaky(doc, *args, **kwargs):  # type: ignore[no-untyped-def]
        if doc.title == "Notes":
            raise RuntimeError("embedding backend hiccup")
        return real(doc, *args, **kwargs)

    monkeypatch.setattr(ingest_module, "prepare_chunks", flaky)
    report = ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    assert "hiccup" in ({r.source: r.error for r in report.results}["notes.txt"] or "")
    monkeypatch.setattr(ingest_module, "prepare_chunks", real)
    assert {r.source: r.status for r in ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder()).results}[
        "notes.txt"
    ] == "failed"
    retried = ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder(), retry_failed=True)
    assert {r.source: r.status for r in retried.results}["notes.txt"] == "ok"


def test_retry_failed_documents_works_from_stored_rows_and_keeps_groups(
    conn: store.Connection, settings: Settings, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag import ingest as ingest_module

    write(corpus, "bad.txt", b"\xff\xfe\xfa")  # BOM says UTF-16, bytes are not
    acl = AclRules({"bad.txt": ["hr"]})
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder(), acl=acl)
    write(corpus, "bad.txt", "now readable text")
    # The page knows no ingest root: any discovery would be a bug here.
    monkeypatch.setattr(ingest_module, "discover", lambda *a, **k: pytest.fail("retry must not walk folders"))
    seen: list[tuple[int, int, str]] = []
    report = retry_failed_documents(
        conn, settings=settings, embedder=FakeEmbedder(), collection=settings.collection,
        on_progress=lambda done, total, _embedded, source: seen.append((done, total, source)),
    )
    assert [(r.source, r.status) for r in report.results] == [("bad.txt", "ok")]
    assert seen == [(0, 1, ""), (1, 1, "bad.txt")] and report.chunks_embedded > 0  # the bar opens before the file
    fixed = {d.source: d for d in document_statuses(conn, settings)}["bad.txt"]
    assert fixed.status == "ok" and list(fixed.groups) == ["hr"]


def test_a_failed_update_keeps_the_previous_version(conn: store.Connection, settings: Settings, corpus: Path) -> None:
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    write(corpus, "notes.txt", b"\xc3\x28 broken utf-8")
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    row = conn.execute("SELECT * FROM documents WHERE source = 'notes.txt'").fetchone()
    assert row["status"] == "failed" and "UTF-8" in row["error"]
    assert row["chunk_count"] > 0 and "02:00" in row["canonical_text"]  # nothing lost
    assert store.chunk_rows(conn, row["id"])


def test_acl_rules_exact_path_wins_and_globs_union() -> None:
    rules = AclRules({"hr/*.md": ["hr"], "hr/pay.md": ["payroll"], "**/secret*": ["admin"]})
    assert rules.groups_for("hr/pay.md") == ["payroll"]
    assert rules.groups_for("hr/leave.md") == ["hr"]
    assert rules.groups_for("x/secret-plan.md") == ["admin"]
    assert rules.groups_for("public.md") is None


def test_an_acl_key_naming_a_folder_covers_every_file_under_it() -> None:
    rules = AclRules({"hr": ["hr"], "legal/": ["legal"], "hr/pay.md": ["payroll"], "**/secret*": ["admin"]})
    assert rules.groups_for("hr/leave.md") == ["hr"] and rules.groups_for("hr/2024/bands.md") == ["hr"]
    assert rules.groups_for("legal/contract.pdf") == ["legal"]
    assert rules.groups_for("hr/pay.md") == ["payroll"]  # an exact path still wins
    assert rules.groups_for("hr/secret-plan.md") == ["admin", "hr"]  # the union with the globs
    assert rules.groups_for("hrx/a.md") is None and rules.groups_for("legal.md") is None  # a prefix is not a folder
    assert rules.unmatched(["hr/leave.md", "legal/contract.pdf"]) == ["hr/pay.md", "**/secret*"]


def test_load_acl_rejects_malformed_maps(tmp_path: Path) -> None:
    bad = write(tmp_path, "acl.json", json.dumps({"a.md": "hr"}))
    with pytest.raises(RagError, match="JSON object"):
        load_acl(bad)
    with pytest.raises(RagError, match="cannot read"):
        load_acl(tmp_path / "missing.json")


def test_groups_from_acl_file_and_front_matter(conn: store.Connection, settings: Settings, tmp_path: Path) -> None:
    root = tmp_path / "c"
    write(root, "public.md", "# Public\n\nEveryone reads this.\n")
    write(root, "admin.md", "---\ntitle: Admin\ngroups: [admin]\n---\n\nOnly admins.\n")
    write(root, "hr/pay.md", "# Pay\n\nSalary bands.\n")
    acl = write(tmp_path, "acl.json", json.dumps({"hr/*.md": ["hr"]}))
    ingest(conn, [root], settings=settings, embedder=FakeEmbedder(), acl=load_acl(acl))
    groups = {d.source: d.groups for d in document_statuses(conn, settings)}
    assert groups == {"public.md": ["all"], "admin.md": ["admin"], "hr/pay.md": ["hr"]}
    # a changed access map updates permissions without re-embedding
    acl.write_text(json.dumps({"hr/*.md": ["hr", "finance"]}))
    embedder = FakeEmbedder()
    report = ingest(conn, [root], settings=settings, embedder=embedder, acl=load_acl(acl))
    assert {r.source: r.status for r in report.results}["hr/pay.md"] == "groups"
    assert embedder.calls == 0
    assert {d.source: d.groups for d in document_statuses(conn, settings)}["hr/pay.md"] == ["finance", "hr"]


def test_a_file_name_in_nfd_and_its_nfc_twin_are_one_document_and_match_the_access_map(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    # macOS writes file names decomposed (NFD); a copy made elsewhere, or an access map typed on a
    # keyboard, spells the same name composed (NFC). Both must name one document.
    nfd = unicodedata.normalize("NFD", "Nhân sự/Nghỉ phép.md")
    nfc = unicodedata.normalize("NFC", nfd)
    root = tmp_path / "c"
    write(root, nfd, "# Nghỉ phép\n\nMỗi nhân viên được nghỉ phép năm 14 ngày.\n")
    acl = write(tmp_path, "acl.json", json.dumps({"Nhân sự/": ["hr"]}, ensure_ascii=False))  # typed: NFC
    first = ingest(conn, [root], settings=settings, embedder=FakeEmbedder(), acl=load_acl(acl))
    assert first.warnings == []  # the key names the folder
    assert {d.source: d.groups for d in document_statuses(conn, settings)} == {nfc: ["hr"]}
    (root / unicodedata.normalize("NFD", "Nhân sự")).rename(root / "Nhân sự")
    (root / "Nhân sự" / unicodedata.normalize("NFD", "Nghỉ phép.md")).rename(root / "Nhân sự" / "Nghỉ phép.md")
    embedder = FakeEmbedder()
    again = ingest(conn, [root], settings=settings, embedder=embedder, acl=load_acl(acl))
    assert [(r.source, r.status) for r in again.results] == [(nfc, "unchanged")] and embedder.calls == 0
    assert len(document_statuses(conn, settings)) == 1
    # both spellings side by side (possible on Linux): one name, so the run names the clash
    write(root, nfd, "# Nghỉ phép\n\nBản cũ.\n")
    with pytest.raises(RagError, match="the same name in two Unicode forms"):
        ingest(conn, [root], settings=settings, embedder=FakeEmbedder())


def test_prune_removes_documents_whose_files_are_gone(conn: store.Connection, settings: Settings, corpus: Path) -> None:
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    (corpus / "notes.txt").unlink()
    kept = ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    assert "notes.txt" in statuses(conn, settings) and kept.count("pruned") == 0
    pruned = ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder(), prune=True)
    assert pruned.count("pruned") == 1
    assert "notes.txt" not in statuses(conn, settings)
    assert (
        conn.execute(
            "SELECT count(*) FROM chunks k LEFT JOIN documents d ON d.id = k.document_id WHERE d.id IS NULL"
        ).fetchone()[0]
        == 0
    )


def test_another_embedding_model_is_refused_then_reindex_switches(
    conn: store.Connection, settings: Settings, corpus: Path
) -> None:
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    other = FakeEmbedder(model_id="fake/other", dimension=32)
    with pytest.raises(IndexMismatchError, match="rag reindex"):
        ingest(conn, [corpus], settings=settings, embedder=other)
    report = reindex(conn, settings=settings, embedder=other)
    assert report.count("ok") == 3
    coll = store.require_collection(conn, settings.collection)
    assert (coll.embedder, coll.dimension) == ("fake/other", 32)
    assert len(vector_access_keys(conn, 32)) == conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    assert vector_access_keys(conn, 64) == []
    assert [c.name for c in store.list_collections(conn)] == [settings.collection]
    # and now the new model is the one accepted
    assert ingest(conn, [corpus], settings=settings, embedder=other).count("unchanged") == 3


def test_pipeline_change_marks_documents_stale_and_reindex_refreshes(
    conn: store.Connection, settings: Settings, corpus: Path
) -> None:
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    assert not any(d.stale for d in document_statuses(conn, settings))
    changed = settings.replace(chunk_tokens=40)
    assert all(d.stale for d in document_statuses(conn, changed))
    (corpus / "notes.txt").unlink()  # re-chunking works from the stored canonical text
    report = reindex(conn, settings=changed, embedder=FakeEmbedder())
    assert report.count("ok") == 3
    assert not any(d.stale for d in document_statuses(conn, changed))


def test_an_ingest_that_reprocesses_unchanged_stale_files_says_why(
    conn: store.Connection, settings: Settings, corpus: Path
) -> None:
    # After an upgrade every file an earlier version chunked is processed again: the summary said
    # "3 indexed, 0 unchanged" as if every file had changed.
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    conn.execute("UPDATE documents SET pipeline_version = 'earlier', content_hash = 'earlier'")
    write(corpus, "notes.txt", "Notes\n\nThe backup runs nightly at 03:00.\n")  # this one did change
    report = ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    assert report.count("ok") == 3
    assert {r.source: r.reprocessed for r in report.results} == {
        "guide.md": True, "notes.txt": False, "sub/page.html": True}
    assert report.summary().endswith("; 2 of the indexed files had not changed: an earlier chunker, extractor "
                                     "or embedding model made their stored passages (stale), so they were "
                                     "processed again")
    again = ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    assert again.count("unchanged") == 3 and "processed again" not in again.summary()


def test_strategy_is_recorded_and_changing_it_reprocesses(
    conn: store.Connection, settings: Settings, corpus: Path
) -> None:
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    report = ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder(), strategy="C")
    assert report.count("ok") == 3
    assert store.require_collection(conn, settings.collection).strategy == "C"
    versions = {r["pipeline_version"] for r in store.document_rows(conn)}
    assert len(versions) == 1 and "/C/" in versions.pop()


def test_unknown_paths_and_strategies_are_clear_errors(conn: store.Connection, settings: Settings) -> None:
    with pytest.raises(RagError, match="no such file"):
        ingest(conn, ["/nonexistent/folder"], settings=settings, embedder=FakeEmbedder())
    with pytest.raises(RagError, match="strategy"):
        ingest(conn, [], settings=settings, embedder=FakeEmbedder(), strategy="Z")


def test_moved_folder_updates_paths_so_prune_keeps_its_documents(
    conn: store.Connection, settings: Settings, corpus: Path
) -> None:
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    moved = corpus.parent / "moved"
    corpus.rename(moved)
    report = ingest(conn, [moved], settings=settings, embedder=FakeEmbedder(), prune=True)
    assert report.count("pruned") == 0 and report.count("unchanged") == 3
    assert all(row["path"].startswith(str(moved.resolve())) for row in store.document_rows(conn))


def test_a_moved_folder_warns_of_nothing(conn: store.Connection, settings: Settings, corpus: Path) -> None:
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    moved = corpus.parent / "moved"
    corpus.rename(moved)
    assert ingest(conn, [moved], settings=settings, embedder=FakeEmbedder()).warnings == []


def test_a_second_folder_with_the_same_names_warns_that_it_replaces_the_first(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    write(tmp_path / "A", "x.md", "# A\n\nFolder A talks about giraffes.\n")
    write(tmp_path / "B", "x.md", "# B\n\nFolder B talks about zebras.\n")
    assert ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder()).warnings == []
    report = ingest(conn, [tmp_path / "B"], settings=settings, embedder=FakeEmbedder())
    [warning] = report.warnings
    assert warning.startswith("'x.md' is now read from ") and str((tmp_path / "A" / "x.md").resolve()) in warning
    assert "no longer searched" in warning
    # Ingested together, both are kept under their folders' names; ingesting one of them alone
    # afterwards stores its file a second time, under the shorter name: said too.
    together = ingest(conn, [tmp_path / "A", tmp_path / "B"], settings=settings, embedder=FakeEmbedder(),
                      collection="both")
    assert together.warnings == [] and together.count("ok") == 2
    [again] = ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder(), collection="both").warnings
    assert "already stored as 'A/x.md'" in again and "now stored as 'x.md' too" in again


def test_a_file_linked_under_a_second_name_in_the_folder_warns_of_nothing_on_a_rerun(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    # /usr/share/doc ships such links (libgtk-3-0/README.md -> ../libgtk-3-common/README.md): each
    # re-run warned that the file was "ingested together with other folders" and said to delete one.
    write(tmp_path / "A", "a.md", "# A\n\nFolder A talks about giraffes.\n")
    (tmp_path / "A" / "alias.md").symlink_to("a.md")
    first = ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder())
    assert first.count("ok") == 2 and first.warnings == []
    again = ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder())
    assert again.count("unchanged") == 2 and again.warnings == []


def test_a_pdf_the_reader_cannot_decode_fails_alone_in_a_new_auto_collection(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    from rag.ingest import choose_embedder

    from .test_extract import make_pdf

    write(tmp_path / "A", "odd.pdf", make_pdf(["Alpha page text."]).replace(b"/FlateDecode", b"/FooDecodeXY"))
    write(tmp_path / "A", "ok.md", "# Ok\n\nA readable page about backups.\n")
    # the language sample of a new collection ("auto") read the PDF first, and the run stopped there
    assert choose_embedder(conn, [tmp_path / "A"], requested="auto", settings=settings).embedder_id
    report = ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder())
    [failed] = report.failed
    assert failed.source == "odd.pdf" and report.count("ok") == 1
    assert (failed.error or "").startswith("the PDF uses a feature the PDF reader does not support")


def test_a_pdf_with_a_lone_surrogate_is_indexed_and_the_run_goes_on(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    from .test_extract import lone_surrogate_pdf

    write(tmp_path / "A", "glyph.pdf", lone_surrogate_pdf())
    write(tmp_path / "A", "ok.md", "# Ok\n\nA readable page about backups.\n")
    report = ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder())
    assert report.count("ok") == 2, report.failed
    [chunk] = [r for r in store.document_rows(conn) if r["source"] == "glyph.pdf"]
    assert chunk["canonical_text"].startswith("\ufffd backup policy")


@pytest.mark.parametrize("escape", ["\\ud800", "\\0"])
def test_a_front_matter_title_with_a_lone_surrogate_escape_does_not_stop_the_run(
    conn: store.Connection, settings: Settings, tmp_path: Path, escape: str
) -> None:
    # YAML reads "\ud800" as a lone surrogate; storing the title raised UnicodeEncodeError out of
    # ingest(), so this file and every file after it were never indexed, run after run. "\0" (NUL)
    # did the same on PostgreSQL.
    write(tmp_path / "A", "a.md", f'---\ntitle: "Bad {escape} title"\n---\n\n# Body\n\nSome text.\n')
    write(tmp_path / "A", "b.md", "# Later\n\nA later file.\n")
    report = ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder())
    assert report.count("ok") == 2
    assert {r["source"]: r["title"] for r in store.document_rows(conn)}["a.md"] == "Bad \ufffd title"


def test_prune_keeps_a_document_whose_folder_became_unreadable(
    conn: store.Connection, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # chmod 000 on a folder already ingested: Path.exists() of its files raises PermissionError
    # (not False), and `rag ingest --prune` stopped with a traceback. (Faked: root reads anything.)
    write(tmp_path / "A", "x.md", "# X\n\nReadable.\n")
    locked = write(tmp_path / "A", "locked/y.md", "# Y\n\nIn a folder that becomes unreadable.\n").resolve()
    ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder())
    exists = Path.exists

    def no_entry(path: Path) -> bool:
        if path == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return exists(path)

    monkeypatch.setattr(Path, "exists", no_entry)
    report = ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder(), prune=True)
    assert report.count("pruned") == 0
    assert sorted(d.source for d in document_statuses(conn, settings)) == ["locked/y.md", "x.md"]


def test_a_folder_that_cannot_be_listed_is_warned_of(
    conn: store.Connection, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # chmod 000 on a subfolder: its files were left out without a word (Path.rglob passes over a
    # folder it may not list). (Faked: root may list anything.)
    import os

    write(tmp_path / "A", "x.md", "# X\n\nReadable.\n")
    write(tmp_path / "A", "locked/y.md", "# Y\n\nIn a folder nobody may list.\n")
    locked = tmp_path / "A" / "locked"
    scandir = os.scandir

    def refuse(path: Any = ".") -> Any:
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refuse)
    report = ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder())
    assert [r.source for r in report.results] == ["x.md"]
    [warning] = report.warnings
    assert warning.startswith(f"the folder {locked} (Permission denied) cannot be read, so no file in it was ingested")


def test_a_pdf_glyph_read_as_a_nul_character_is_stored_on_either_backend(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    from .test_extract import lone_surrogate_pdf

    write(tmp_path / "A", "nul.pdf", lone_surrogate_pdf().replace(b"<41> <D800>", b"<41> <0000>"))
    write(tmp_path / "A", "ok.md", "# Ok\n\nA readable page about backups.\n")
    report = ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder())
    assert report.count("ok") == 2, report.failed
    texts = {r["source"]: r["canonical_text"] for r in store.document_rows(conn)}
    assert texts["nul.pdf"] == "\ufffd backup policy keeps seven copies"


def test_a_writer_cannot_replace_or_prune_a_document_they_may_not_read(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    write(tmp_path / "A", "pay.md", "---\ngroups: [hr]\n---\n# Pay\n\nSalary bands are secret.\n")
    write(tmp_path / "A", "gone.md", "---\ngroups: [hr]\n---\n# Gone\n\nAn hr page whose file goes.\n")
    ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder())
    (tmp_path / "A" / "gone.md").unlink()
    before = {r["source"]: r["content_hash"] for r in store.document_rows(conn)}
    write(tmp_path / "B", "pay.md", "# Pay\n\nEveryone may read this now.\n")
    write(tmp_path / "B", "new.md", "# New\n\nA new page.\n")
    report = ingest(conn, [tmp_path / "B"], settings=settings, embedder=FakeEmbedder(), writer=["eng"], prune=True)
    assert [(r.source, r.status) for r in report.results] == [("pay.md", "failed"), ("new.md", "ok")]
    assert "may not read" in (report.results[0].error or "")
    after = {r["source"]: r["content_hash"] for r in store.document_rows(conn)}
    assert after == {**before, "new.md": after["new.md"]}  # pay.md untouched, gone.md not pruned by eng
    hr = ingest(conn, [tmp_path / "B"], settings=settings, embedder=FakeEmbedder(), writer=["hr"], prune=True)
    assert ("pay.md", "ok") in [(r.source, r.status) for r in hr.results] and hr.count("pruned") == 1


def test_a_deleted_documents_id_is_never_given_again(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    # A citation link names its document by id: a new document that took a deleted one's id made
    # an old answer's [1] open an unrelated page.
    write(tmp_path / "A", "a.md", "# A\n\nFirst page.\n")
    write(tmp_path / "A", "z.md", "# Z\n\nThe zebra protocol listens on port 7777.\n")
    ingest(conn, [tmp_path / "A"], settings=settings, embedder=FakeEmbedder())
    ids = {r["source"]: r["id"] for r in store.document_rows(conn)}
    newest = max(ids.values())
    store.delete_document(conn, newest)
    write(tmp_path / "B", "soup.md", "# Soup\n\nA soup recipe.\n")
    write(tmp_path / "B", "broken.txt", b"\xc3\x28 not utf-8")  # a failed document takes an id too
    ingest(conn, [tmp_path / "B"], settings=settings, embedder=FakeEmbedder(), collection="second")
    added = {r["source"]: r["id"] for r in store.document_rows(conn, "second")}
    assert set(added) == {"soup.md", "broken.txt"} and min(added.values()) > newest
    assert len({*ids.values(), *added.values()}) == 4


def test_choose_embedder_auto_picks_e5_for_vietnamese_and_keeps_existing_models(
    conn: store.Connection, settings: Settings, tmp_path: Path, corpus: Path
) -> None:
    from rag.embedding import E5_ID, MINILM_INT8_ID
    from rag.ingest import choose_embedder

    vi = tmp_path / "vi"
    write(vi, "a.txt", "Lỗi VPN-403 xử lý sao\n\nKhi kết nối bị từ chối, hãy kiểm tra chứng chỉ của người dùng.\n")
    auto = choose_embedder(conn, [vi], requested="auto", settings=settings)
    assert auto.embedder_id == E5_ID and "Vietnamese" in (auto.note or "") and E5_ID in (auto.note or "")
    english = choose_embedder(conn, [corpus], requested="auto", settings=settings)
    assert english.embedder_id == MINILM_INT8_ID
    default = choose_embedder(conn, [vi], requested=None, settings=settings)  # auto is the default
    assert default.embedder_id == E5_ID and "embedder auto" in (default.note or "")
    warned = choose_embedder(conn, [vi], requested="minilm", settings=settings)
    assert warned.embedder_id == MINILM_INT8_ID and "--embedder e5" in (warned.note or "")
    ingest(conn, [corpus], settings=settings, embedder=FakeEmbedder())
    kept = choose_embedder(conn, [vi], requested="auto", settings=settings)
    assert kept == type(kept)(FakeEmbedder.model_id, None)


def test_choose_embedder_auto_picks_e5_for_a_mixed_collection(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    from rag.embedding import E5_ID, MINILM_INT8_ID
    from rag.ingest import choose_embedder

    mixed = tmp_path / "mixed"
    english = "The VPN gateway refuses a connection when the user's certificate has expired.\n" * 20
    for n in range(8):
        write(mixed, f"en{n}.md", f"# Page {n}\n\n{english}")
    write(mixed, "vi.md", "# Lỗi VPN\n\nKhi kết nối bị từ chối, hãy kiểm tra chứng chỉ của người dùng.\n")
    picked = choose_embedder(conn, [mixed], requested="auto", settings=settings)
    assert picked.embedder_id == E5_ID and "11% of the files are Vietnamese" in (picked.note or "")
    for n in range(8, 12):  # one Vietnamese file in thirteen is not a mixed collection
        write(mixed, f"en{n}.md", f"# Page {n}\n\n{english}")
    assert choose_embedder(conn, [mixed], requested="auto", settings=settings).embedder_id == MINILM_INT8_ID


def test_save_uploads_refuses_unsupported_types_and_path_tricks(tmp_path: Path) -> None:
    from rag.ingest import save_uploads

    class Upload:
        def __init__(self, name: str, data: bytes) -> None:
            self.name, self.data = name, data

        def getvalue(self) -> bytes:
            return self.data

    saved, refused = save_uploads(
        [Upload("notes.md", b"# Notes\n\nHello."), Upload("report.doc", b"\xd0\xcf\x11\xe0"),
         Upload("../../evil.md", b"x")],
        tmp_path / "uploads",
    )
    assert [p.name for p in saved] == ["notes.md", "evil.md"]
    assert all(p.parent == tmp_path / "uploads" for p in saved)
    assert len(refused) == 1 and "report.doc" in refused[0] and "unsupported file type" in refused[0]
    # A Mac's upload names the file decomposed (NFD), a Windows one composed: one file, not two.
    mac, windows = unicodedata.normalize("NFD", "Nghỉ phép.md"), "Nghỉ phép.md"
    first, _ = save_uploads([Upload(mac, b"# A\n\nold")], tmp_path / "uploads")
    second, _ = save_uploads([Upload(windows, b"# A\n\nnew")], tmp_path / "uploads")
    assert first == second and first[0].name == windows and first[0].read_bytes() == b"# A\n\nnew"
    assert sorted(p.name for p in (tmp_path / "uploads").iterdir()) == sorted(["evil.md", windows, "notes.md"])


def test_word_and_opendocument_files_are_ingested_with_their_headings(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    from .test_extract import make_docx, make_odt

    def word(document: Any) -> None:
        document.add_heading("Travel", 1)
        document.add_paragraph("Book trains at least a week ahead.")
        document.add_heading("Per diem", 2)
        document.add_paragraph("The daily allowance is 40 euros.")

    def writer(document: Any) -> None:
        from odf import text

        document.text.addElement(text.H(outlinelevel=1, text="Nghỉ phép"))
        document.text.addElement(text.P(text="Mỗi năm có 12 ngày nghỉ phép."))

    root = tmp_path / "office"
    write(root, "travel.docx", make_docx(word))
    write(root, "nghi-phep.odt", make_odt(writer))
    write(root, "old.doc", b"\xd0\xcf\x11\xe0 a Word 97 file")  # not a supported type: skipped by the walk
    embedder = FakeEmbedder()
    first = ingest(conn, [root], settings=settings, embedder=embedder)
    assert first.count("ok") == 2
    assert statuses(conn, settings) == {"travel.docx": "ok", "nghi-phep.odt": "ok"}
    sections = {}
    for row in store.document_rows(conn):
        for chunk in store.chunk_rows(conn, row["id"]):
            assert row["canonical_text"][chunk["char_from"] : chunk["char_to"]] == chunk["content"]
            sections[chunk["content"].strip().splitlines()[-1]] = chunk["section"]
    assert "Per diem" in sections["The daily allowance is 40 euros."]
    assert "Nghỉ phép" in sections["Mỗi năm có 12 ngày nghỉ phép."]
    assert ingest(conn, [root], settings=settings, embedder=embedder).count("unchanged") == 2


def test_a_document_longer_than_max_document_chars_fails_alone(
    conn: store.Connection, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "long"
    write(root, "short.md", "# Short\n\nA few words.\n")
    write(root, "long.md", "# Long\n\n" + "word " * 40 + "\n")  # 209 characters, 209 bytes
    write(root, "huge.txt", "x" * 1000)  # more than 4 x 100 bytes: refused before it is read
    read = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        assert path.name != "huge.txt", "a file too long to index was read"
        return read(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    report = ingest(conn, [root], settings=settings.replace(max_document_chars=100), embedder=FakeEmbedder())
    errors = {r.source: r.error for r in report.results}
    assert report.count("ok") == 1 and errors["short.md"] is None
    assert errors["long.md"] == ("the document holds 209 characters, more than max_document_chars = 100: split it, "
                                 "or raise the limit (max_document_chars in rag.toml, or RAG_MAX_DOCUMENT_CHARS)")
    assert (errors["huge.txt"] or "").startswith("the file is 0 MB of text, more than max_document_chars = 100")
    assert statuses(conn, settings) == {"short.md": "ok", "long.md": "failed", "huge.txt": "failed"}
    monkeypatch.setattr(Path, "read_bytes", read)
    unlimited = ingest(conn, [root], settings=settings.replace(max_document_chars=0), embedder=FakeEmbedder(),
                       retry_failed=True)
    assert unlimited.count("failed") == 0
    # indexed under a higher limit (or by a version without one), an unchanged document stays
    again = ingest(conn, [root], settings=settings.replace(max_document_chars=100), embedder=FakeEmbedder())
    assert again.count("unchanged") == 3 and set(statuses(conn, settings).values()) == {"ok"}


def test_a_file_linked_out_of_the_apps_ingest_roots_is_not_read(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    allowed, elsewhere = tmp_path / "allowed", tmp_path / "elsewhere"
    write(allowed, "notes.md", "# Notes\n\nPublic notes.\n")
    secret = write(elsewhere, "secret.md", "# Secret\n\nThe salary table.\n")
    (allowed / "leak.md").symlink_to(secret)
    (allowed / "again.md").symlink_to(allowed / "notes.md")  # a link that stays inside is read
    report = ingest(conn, [allowed], settings=settings, embedder=FakeEmbedder(), within=[allowed])
    assert statuses(conn, settings) == {"notes.md": "ok", "again.md": "ok"}
    assert any(w.startswith("'leak.md' links to") and "outside the folders the app may read" in w
               for w in report.warnings)
    # the command line reads what the folder links to, as before
    ingest(conn, [allowed], settings=settings, embedder=FakeEmbedder())
    assert statuses(conn, settings)["leak.md"] == "ok"


def test_the_summary_says_how_many_files_of_no_supported_type_were_skipped(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    root = tmp_path / "doc"
    write(root, "changelog.Debian.gz", b"\x1f\x8b compressed")
    write(root, "NEWS.gz", b"\x1f\x8b compressed")
    write(root, "copyright", "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n")
    write(root, "README.md", "# Readme\n\nHello.\n")
    report = ingest(conn, [root], settings=settings, embedder=FakeEmbedder())
    assert report.skipped == {".gz": 2, "": 1}
    assert report.summary().endswith("; 3 other files skipped (.gz 2, no extension 1)")
