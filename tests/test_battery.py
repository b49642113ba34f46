"""The battery: bad queries, bad files, bad permission inputs, bad configuration and storage.

Each case runs the real CLI (``rag.cli.main``) as a user would and asserts the exact outcome —
a one-line error naming the problem with exit code 1 (2 for argparse usage errors), a failed
document with its reason, or a sane result — and that no Python traceback reaches stdout or
stderr. Models are the deterministic fakes; everything else (SQLite, sqlite-vec, FTS5,
extraction, chunking) is real.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path

import pytest

from rag import cli, store

from .fakes import FakeEmbedder


@pytest.fixture(autouse=True)
def fake_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's model loaders give the fake embedder; generation stays off (--no-generate)."""
    monkeypatch.setattr("rag.registry.load_embedder", lambda *a, **k: FakeEmbedder())


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "vpn.md").write_text("# VPN\n\nError VPN-403 means the token expired: sign in again.\n", "utf-8")
    (root / "backup.txt").write_text("Backups\n\nThe backup runs nightly at 02:00 and keeps 30 days.\n", "utf-8")
    (root / "lỗi.md").write_text("# Lỗi VPN\n\nLỗi VPN-403 xử lý sao: đăng nhập lại.\n", "utf-8")
    return root


@pytest.fixture
def db(tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "t.db"
    assert cli.main(["ingest", str(corpus), "--db", str(path), "--embedder", "minilm"]) == 0
    capsys.readouterr()
    return path


def run(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, *argv: str) -> tuple[int, str, str]:
    """Run the CLI; assert that nothing printed or logged carries a traceback."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse usage errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    logged = "\n".join(r.getMessage() + (str(r.exc_info) if r.exc_info else "") for r in caplog.records)
    for text in (out, err, logged):
        assert "Traceback" not in text, text
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.ERROR), logged
    return code, out, err


def one_error_line(err: str) -> str:
    """The one ``error:`` line of stderr (progress bars and notices may stand beside it)."""
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Bad queries: a message (exit 1), or a sane result; one bad line of a batch costs one line


BAD_QUERIES = [
    ("", "the question is empty"),
    ("   \t ", "the question is empty"),
    ("???", "nothing to search for"),
    ("caf\udce9 password", "not valid text"),  # a non-UTF-8 byte from the shell (surrogateescape)
    ("\ud800", "not valid text"),
    ("x" * 100_000, "at most 4,000"),
    ("?" * 5000, "at most 4,000"),
]


@pytest.mark.parametrize(("query", "message"), BAD_QUERIES, ids=[f"search-{i}" for i in range(len(BAD_QUERIES))])
def test_bad_query_to_search_is_a_message(
    db: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, query: str, message: str
) -> None:
    code, _out, err = run(capsys, caplog, "search", query, "--db", str(db))
    assert code == 1 and message in one_error_line(err)


@pytest.mark.parametrize(("query", "message"), BAD_QUERIES, ids=[f"ask-{i}" for i in range(len(BAD_QUERIES))])
def test_bad_query_to_ask_is_a_message(
    db: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, query: str, message: str
) -> None:
    code, _out, err = run(capsys, caplog, "ask", query, "--db", str(db), "--no-generate")
    assert code == 1 and message in one_error_line(err)


ODD_BUT_FINE = [
    'NOT OR AND "',  # FTS5 syntax
    "'; DROP TABLE chunks; --",  # SQL injection
    "VPN-403 NEAR(backup) *",
    "lỗi VPN-403 xử lý sao",
    "loi VPN-403 xu ly sao",  # toneless
    "🙂 VPN 🙂",
    "a\u0301 VPN",  # a combining accent (NFC)
    "\u202eVPN-403",  # a right-to-left override
    "VPN" * 1300,  # one long word, under the length limit
]


@pytest.mark.parametrize("query", ODD_BUT_FINE, ids=[f"odd-{i}" for i in range(len(ODD_BUT_FINE))])
def test_odd_queries_search_normally(
    db: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, query: str
) -> None:
    code, out, _err = run(capsys, caplog, "search", query, "--db", str(db), "--json")
    assert code == 0 and isinstance(json.loads(out), list)
    assert store.open_db(db).execute("SELECT count(*) FROM chunks").fetchone()[0] == 3  # nothing dropped


@pytest.mark.parametrize("command", ["search", "ask"])
def test_a_bad_line_in_a_batch_costs_one_line(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, command: str
) -> None:
    queries = tmp_path / "q.jsonl"
    lines = [{"id": 1, "query": "VPN-403"}, {"id": 2, "query": "\ud800 broken"}, {"id": 3, "query": "???"},
             {"id": 4, "query": "backup nightly"}]
    queries.write_text("\n".join(json.dumps(q) for q in lines) + "\n", "utf-8")  # json escapes "\ud800"
    extra = ["--no-generate"] if command == "ask" else []
    code, out, _err = run(capsys, caplog, command, "--queries", str(queries), "--db", str(db), *extra)
    assert code == 0
    results = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in results] == [1, 2, 3, 4]
    assert "not valid text" in results[1]["error"] and "nothing to search for" in results[2]["error"]
    assert "error" not in results[0] and "error" not in results[3]


@pytest.mark.parametrize("command", ["search", "ask"])
def test_a_malformed_line_of_a_queries_file_gets_its_own_error_and_the_others_are_answered(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, command: str
) -> None:
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "a", "query": "VPN-403"}\nnot json\n{"id": "b", "query": "x", "groups": 5}\n'
                       '[1]\n{"id": "c"}\n\n{"query": "backup nightly"}\n', "utf-8")
    extra = ["--no-generate"] if command == "ask" else []
    code, out, _err = run(capsys, caplog, command, "--queries", str(queries), "--db", str(db), *extra)
    assert code == 0
    results = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in results] == ["a", 2, "b", 4, "c", 7]  # in file order; no id: the line number
    expected = '{"id": ..., "query": "...", "groups": [...]}'
    errors = {r["id"]: r["error"] for r in results if "error" in r}
    assert errors == {
        2: "line 2 is not JSON: Expecting value: line 1 column 1 (char 0)",
        "b": "line 3: groups must be a list of strings",
        4: f"line 4: expected {expected}",
        "c": f"line 5: expected {expected}",
    }
    failed = [r for r in results if "error" in r]
    if command == "search":
        assert all(r == {"id": r["id"], "hits": [], "error": r["error"]} for r in failed)
        assert results[0]["hits"][0]["source"] == "vpn.md" and results[5]["hits"][0]["source"] == "backup.txt"
    else:
        assert all(r == {"id": r["id"], "status": "error", "error": r["error"]} for r in failed)
        assert results[0]["question"] == "VPN-403" and results[5]["question"] == "backup nightly"


def test_an_unreadable_queries_file_is_refused_before_any_search(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    queries = tmp_path / "q.jsonl"
    queries.write_bytes(b"\xff\xfe\x00garbage")
    code, out, err = run(capsys, caplog, "search", "--queries", str(queries), "--db", str(db))
    assert code == 1 and out == "" and "cannot read the queries file" in one_error_line(err)


def test_question_and_queries_together_is_a_usage_message(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    code, _out, err = run(capsys, caplog, "search", "x", "--queries", str(tmp_path / "q"), "--db", str(db))
    assert code == 1 and "not both" in one_error_line(err)


def test_unknown_stage_is_a_usage_error(
    db: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    code, _out, err = run(capsys, caplog, "search", "VPN", "--db", str(db), "--stage", "magic")
    assert code in (1, 2) and "magic" in err


COUNTS = [
    (("bench", "--repeats", "-2", "--quick", "--no-generation"), "--repeats: must be 1 or more (got -2)"),
    (("bench", "--repeats", "0"), "--repeats: must be 1 or more (got 0)"),
    (("migrate", "{db}", "{tmp}/copy.db", "--sample", "-1"), "--sample: must be 0 or more (got -1)"),
    (("eval", "answers", "--db", "{db}", "--limit", "0"), "--limit: must be 1 or more (got 0)"),
    (("eval", "answers", "--db", "{db}", "--sample", "-2"), "--sample: must be 1 or more (got -2)"),
    (("eval", "history", "--db", "{db}", "-k", "0"), "-k: must be 1 or more (got 0)"),
    (("eval", "history", "--db", "{db}", "--limit", "x"), "--limit: 'x' is not a whole number"),
    (("serve", "--port", "70000"), "--port: must be from 1 to 65535 (got 70000)"),
]


@pytest.mark.parametrize(("argv", "message"), COUNTS, ids=[" ".join(a[:2]) + " " + a[-1] for a, _ in COUNTS])
def test_a_count_out_of_range_is_a_usage_error_before_anything_runs(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    argv: tuple[str, ...], message: str,
) -> None:
    code, out, err = run(capsys, caplog, *(a.format(db=db, tmp=tmp_path) for a in argv))
    assert code == 2 and out == "" and message in err
    assert not (tmp_path / "copy.db").exists()  # the migration never started


# ---------------------------------------------------------------------------------------------
# Bad files: each fails alone with its reason; nothing else is lost


def ingest_one(tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
               name: str | bytes, data: bytes) -> tuple[dict[str, dict[str, object]], Path]:
    root = tmp_path / "files"
    root.mkdir(exist_ok=True)
    (root / "good.md").write_text("# Good\n\nThe good file stays searchable.\n", "utf-8")
    target = os.path.join(os.fsencode(root), name) if isinstance(name, bytes) else str(root / name)
    with open(target, "wb") as handle:
        handle.write(data)
    path = tmp_path / "f.db"
    code, out, _err = run(capsys, caplog, "ingest", str(root), "--db", str(path), "--json")
    assert code == 0
    return {r["source"]: r for r in json.loads(out)["results"]}, path


NESTED = b"<html><body>" + b"<div>" * 5000 + b"deep text" + b"</div>" * 5000 + b"</body></html>"
BAD_FILES = [
    ("empty.md", b"", "the file is empty"),
    ("blank.txt", b"  \n\t\n", "holds no text"),
    ("latin1.txt", "Café crème, ça va.".encode("cp1252"), "not UTF-8 text: invalid byte 0xe9"),
    ("binary.txt", bytes(range(256)) * 4, "not UTF-8 text"),
    ("nul.txt", b"text\x00with\x00nuls", "NUL characters"),
    ("nested.html", NESTED, "nested too deeply"),
    ("broken.pdf", b"%PDF-1.4\n garbage", "corrupt or unreadable PDF"),
    ("fake.pdf", b"just text, not a pdf", "PDF"),
    ("front.md", b"---\ngroups: [hr\n---\n\n# X\n\nBody.\n", "not valid YAML"),
    ("onlyfront.md", b"---\ntitle: T\n---\n", "no text"),
    ("zwsp.txt", "\u200b\n".encode(), "holds no text"),
    ("doublebom.txt", b"\xef\xbb\xbf\xef\xbb\xbf\n", "holds no text"),
    ("emptyheading.md", b"# \n\n", "holds no text"),
    ("nbsp.html", b"<p>&nbsp;&#8203;</p>", "holds no text"),
    ("bad16.txt", b"\xff\xfe" + b"\x00\xd8" * 3, "invalid UTF-16"),
]


@pytest.mark.parametrize(("name", "data", "reason"), BAD_FILES, ids=[f[0] for f in BAD_FILES])
def test_a_bad_file_fails_alone_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    name: str, data: bytes, reason: str,
) -> None:
    results, _ = ingest_one(tmp_path, capsys, caplog, name, data)
    assert results["good.md"]["status"] == "ok"
    assert results[name]["status"] == "failed" and reason in str(results[name]["error"])


def test_a_file_with_no_text_indexed_by_an_older_version_leaves_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before holds_text, a zero-width space or a bare "# " was indexed as a passage of its own.
    importlib.import_module("rag.ingest")  # bound to the real holds_text before the old rule is put in place
    with monkeypatch.context() as old_version:
        old_version.setattr(importlib.import_module("rag.extract"), "holds_text", lambda text: True)
        results, path = ingest_one(tmp_path, capsys, caplog, "zwsp.md", "# \u200b\n".encode())
    assert results["zwsp.md"]["status"] == "ok"
    conn = store.open_db(path)
    junk_id = conn.execute("SELECT id FROM documents WHERE source = 'zwsp.md'").fetchone()[0]
    assert conn.execute("SELECT count(*) FROM chunks WHERE document_id = ?", (junk_id,)).fetchone()[0] >= 1
    conn.close()
    # The same bytes again, with today's rules: the document fails with the reason, its passages go.
    code, out, _ = run(capsys, caplog, "ingest", str(tmp_path / "files"), "--db", str(path), "--json")
    again = {r["source"]: r for r in json.loads(out)["results"]}
    assert code == 0 and again["good.md"]["status"] == "unchanged"
    assert again["zwsp.md"]["status"] == "failed" and "holds no text" in str(again["zwsp.md"]["error"])
    conn = store.open_db(path)
    assert conn.execute("SELECT count(*) FROM chunks WHERE document_id = ?", (junk_id,)).fetchone()[0] == 0
    assert [r[0] for r in conn.execute("SELECT DISTINCT d.source FROM chunks k JOIN documents d "
                                       "ON d.id = k.document_id")] == ["good.md"]
    conn.close()
    code, out, _ = run(capsys, caplog, "status", "--db", str(path))
    assert code == 0 and "failed      0 chunks  default/zwsp.md  the file holds no text" in out
    # and a third run leaves it failed, as any failed file with unchanged bytes
    code, out, _ = run(capsys, caplog, "ingest", str(tmp_path / "files"), "--db", str(path), "--json")
    assert {r["source"]: r["status"] for r in json.loads(out)["results"]} == {"good.md": "unchanged",
                                                                              "zwsp.md": "failed"}


def test_utf16_without_bom_is_read_and_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    text = "Wide notes\n\nThe printer code is PRN-7731.\n"
    for encoding in ("utf-16-le", "utf-16-be"):
        results, path = ingest_one(tmp_path, capsys, caplog, f"wide-{encoding}.txt", text.encode(encoding))
        assert results[f"wide-{encoding}.txt"]["status"] == "ok"
    code, out, _ = run(capsys, caplog, "search", "PRN-7731", "--db", str(path), "--stage", "fts", "--json")
    assert code == 0 and len(json.loads(out)) == 2
    assert all("\x00" not in hit["content"] for hit in json.loads(out))


def test_a_non_utf8_file_name_fails_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    results, path = ingest_one(tmp_path, capsys, caplog, b"caf\xe9.md", b"# Cafe\n\nMenu.\n")
    assert results["good.md"]["status"] == "ok"
    assert results["caf\\xe9.md"]["status"] == "failed" and "not valid UTF-8" in str(results["caf\\xe9.md"]["error"])
    code, out, _ = run(capsys, caplog, "status", "--db", str(path))
    assert code == 0 and "caf\\xe9.md" in out


def test_a_huge_file_without_spaces_is_cut_into_bounded_chunks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    results, path = ingest_one(tmp_path, capsys, caplog, "blob.txt", b"Blob\n\n" + b"x" * 200_000 + b"\n")
    assert results["blob.txt"]["status"] == "ok" and int(results["blob.txt"]["chunks"]) > 10  # type: ignore[call-overload]
    conn = store.open_db(path)
    longest = conn.execute("SELECT max(length(content)) FROM chunks").fetchone()[0]
    assert longest < 20_000


def test_two_folders_with_the_same_file_name_keep_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    for name, word in (("rootA", "ALPHATOKEN"), ("rootB", "BETATOKEN")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "index.md").write_text(f"# Index\n\n{word} lives here.\n", "utf-8")
    path = tmp_path / "two.db"
    code, out, _ = run(capsys, caplog, "ingest", str(tmp_path / "rootA"), str(tmp_path / "rootB"), "--db", str(path),
                       "--json")
    assert code == 0
    assert sorted(r["source"] for r in json.loads(out)["results"]) == ["rootA/index.md", "rootB/index.md"]


def test_two_folders_of_the_same_name_are_refused_before_indexing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    for parent in ("a", "b"):
        (tmp_path / parent / "docs").mkdir(parents=True)
        (tmp_path / parent / "docs" / "index.md").write_text("# Index\n\nText.\n", "utf-8")
    path = tmp_path / "same.db"
    code, _, err = run(capsys, caplog, "ingest", str(tmp_path / "a" / "docs"), str(tmp_path / "b" / "docs"),
                       "--db", str(path))
    assert code == 1 and "would both be stored as 'docs/index.md'" in one_error_line(err)


def test_a_missing_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    code, _, err = run(capsys, caplog, "ingest", str(tmp_path / "nope"), "--db", str(tmp_path / "x.db"))
    assert code == 1 and "no such file or folder" in one_error_line(err)
    assert not (tmp_path / "x.db").exists()  # refused before the database is created


def test_an_unknown_embedder_is_refused_before_the_database_is_created(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run(capsys, caplog, "ingest", str(corpus), "--db", str(tmp_path / "x.db"), "--embedder", "mini")
    assert code == 1 and "unknown embedder 'mini'" in one_error_line(err)
    monkeypatch.setenv("RAG_EMBEDDER", "bogus")  # the same from the settings
    code, _, err = run(capsys, caplog, "ingest", str(corpus), "--db", str(tmp_path / "x.db"))
    assert code == 1 and "unknown embedder 'bogus'" in one_error_line(err)
    assert not (tmp_path / "x.db").exists()


def test_a_named_pipe_given_explicitly_is_refused_with_its_reason(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    pipe = tmp_path / "pipe.md"
    os.mkfifo(pipe)
    for argv in ([str(pipe)], [str(corpus), str(pipe)]):
        code, out, err = run(capsys, caplog, "ingest", *argv, "--db", str(tmp_path / "x.db"))
        assert code == 1 and out == ""  # not "0 files" with no reason
        assert one_error_line(err) == (f"error: {pipe} is not a regular file (a named pipe): give a document or a "
                                       "folder of documents")
        assert not (tmp_path / "x.db").exists()


# ---------------------------------------------------------------------------------------------
# Bad permission inputs: refused, reported, or failed closed — never silently public


ACL_FILES = [
    ("not json", "cannot read the access map"),
    ('["hr"]', "must be a JSON object"),
    ('{"vpn.md": "hr"}', "must be a JSON object"),
    ('{"vpn.md": [1]}', "must be a JSON object"),
    ('{"vpn.md": []}', "empty group list"),
    ('{"vpn.md": ["  "]}', "empty group list"),
]


@pytest.mark.parametrize(("content", "message"), ACL_FILES, ids=[f"acl-{i}" for i in range(len(ACL_FILES))])
def test_a_bad_access_map_is_refused_before_indexing(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    content: str, message: str,
) -> None:
    acl = tmp_path / "acl.json"
    acl.write_text(content, "utf-8")
    path = tmp_path / "acl.db"
    code, _, err = run(capsys, caplog, "ingest", str(corpus), "--db", str(path), "--acl", str(acl))
    assert code == 1 and message in one_error_line(err)
    assert not path.exists() or store.open_db(path).execute("SELECT count(*) FROM documents").fetchone()[0] == 0


def test_a_missing_or_non_utf8_access_map_is_refused(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    code, _, err = run(capsys, caplog, "ingest", str(corpus), "--db", str(tmp_path / "a.db"), "--acl",
                       str(tmp_path / "missing.json"))
    assert code == 1 and "cannot read the access map" in one_error_line(err)
    bad = tmp_path / "latin.json"
    bad.write_bytes('{"caf\xe9.md": ["hr"]}'.encode("cp1252"))
    code, _, err = run(capsys, caplog, "ingest", str(corpus), "--db", str(tmp_path / "b.db"), "--acl", str(bad))
    assert code == 1 and "cannot read the access map" in one_error_line(err)


def test_restricted_by_acl_is_hidden_from_all_and_unmatched_keys_warn(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"./vpn.md": ["it"], "vpn.markdown": ["it"]}), "utf-8")
    path = tmp_path / "p.db"
    code, _, err = run(capsys, caplog, "ingest", str(corpus), "--db", str(path), "--acl", str(acl))
    assert code == 0 and "WARNING: the access map's key 'vpn.markdown' matches no file" in err
    _, out, _ = run(capsys, caplog, "search", "token expired", "--db", str(path), "--stage", "fts", "--json")
    assert all(h["source"] != "vpn.md" for h in json.loads(out))
    _, out, _ = run(capsys, caplog, "search", "token expired", "--db", str(path), "--stage", "fts", "--json",
                    "--groups", "it")
    assert any(h["source"] == "vpn.md" for h in json.loads(out))


@pytest.mark.parametrize(
    "front_matter",
    ["---\ngroups: [hr\n---\n", "---\ngroups: []\n---\n", "---\ngroups: [hr]\n", "---\ngroup: hr\n---\n"],
    ids=["yaml-typo", "empty-list", "unclosed", "misspelt-key"],
)
def test_broken_front_matter_is_never_public(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, front_matter: str
) -> None:
    results, path = ingest_one(tmp_path, capsys, caplog, "secret.md",
                               (front_matter + "\n# P\n\nLAYOFFTOKEN planned.\n").encode())
    assert results["secret.md"]["status"] == "failed"
    for groups in ("all", "hr"):
        _, out, _ = run(capsys, caplog, "search", "LAYOFFTOKEN", "--db", str(path), "--stage", "fts", "--json",
                        "--groups", groups)
        assert json.loads(out) == []


# ---------------------------------------------------------------------------------------------
# Bad configuration: one line naming the setting, where it came from, and what it must be


BAD_ENV = [
    ("RAG_MAX_DISTANCE", "abc", "max_distance must be a number (got 'abc' from RAG_MAX_DISTANCE)"),
    ("RAG_TOP_K", "twenty", "top_k must be a whole number (got 'twenty' from RAG_TOP_K)"),
    ("RAG_TOP_K", "0", "top_k must be at least 1"),
    ("RAG_MAX_DISTANCE", "5", "max_distance must lie in [0, 2]"),
    ("RAG_STRATEGY", "Z", "strategy must be one of"),
    ("RAG_SHOW_UNSUPPORTED", "maybe", "show_unsupported must be true or false"),
    ("RAG_DENSE_MODE", "fast", "dense_mode must be"),
    ("RAG_RERANK", "magic", "rerank must be"),
    ("RAG_CHUNK_TOKENS", "-1", "chunk_tokens must be 0 (the embedder's default budget) or more (got -1)"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD_ENV, ids=[f"{n}={v}" for n, v, _ in BAD_ENV])
def test_a_bad_environment_setting_is_one_line(
    db: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
    name: str, value: str, message: str,
) -> None:
    monkeypatch.setenv(name, value)
    code, _, err = run(capsys, caplog, "search", "VPN", "--db", str(db))
    assert code == 1 and message in one_error_line(err)


def test_a_negative_chunk_budget_stops_ingest_before_any_file(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAG_CHUNK_TOKENS", "-1")
    path = tmp_path / "budget.db"
    code, out, err = run(capsys, caplog, "ingest", str(corpus), "--db", str(path))
    assert code == 1 and out == "" and not path.exists()  # not every file marked failed: nothing started
    assert one_error_line(err) == "error: chunk_tokens must be 0 (the embedder's default budget) or more (got -1)"


BAD_TOML = [
    (b'top_k = "twenty"\n', "top_k must be a whole number (got 'twenty' from"),
    (b"top_k = 2.5\n", "top_k must be a whole number"),
    (b"max_distance = true\n", "max_distance must be a number"),
    (b"top_k = \n", "cannot read settings file"),
    (b"colour = 'blue'\n", "unknown setting 'colour'"),
    ("# réglages\ntop_k = 5\n".encode("cp1252"), "not UTF-8 text"),
]


@pytest.mark.parametrize(("content", "message"), BAD_TOML, ids=[f"toml-{i}" for i in range(len(BAD_TOML))])
def test_a_bad_settings_file_is_one_line(
    db: Path, data_dir: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    content: bytes, message: str,
) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "rag.toml").write_bytes(content)
    code, _, err = run(capsys, caplog, "search", "VPN", "--db", str(db))
    assert code == 1 and message in one_error_line(err)


def test_data_dir_that_is_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    file = tmp_path / "not-a-folder"
    file.write_text("x", "utf-8")
    monkeypatch.setenv("RAG_DATA_DIR", str(file))
    code, _, err = run(capsys, caplog, "status")
    assert code == 1 and "is a file, not a folder" in one_error_line(err)


# ---------------------------------------------------------------------------------------------
# Bad storage: one line naming the file and the fix; read-only commands create nothing


def test_read_only_commands_never_create_a_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    typo = tmp_path / "no-such-folder" / "typo.db"
    for argv in (["status"], ["search", "VPN"], ["ask", "VPN", "--no-generate"], ["chunks", "--document", "a.md"]):
        code, _, err = run(capsys, caplog, *argv, "--db", str(typo))
        assert code == 1 and "no database at" in one_error_line(err), argv
    assert not typo.parent.exists()


FOLDER_DB_COMMANDS = [["status"], ["chunks"], ["source", "1"], ["search", "VPN"], ["ask", "VPN", "--no-generate"],
                      ["eval", "--golden", "g.json"], ["eval", "history"], ["audit", "channels"]]


@pytest.mark.parametrize("argv", FOLDER_DB_COMMANDS, ids=[" ".join(a[:2]) for a in FOLDER_DB_COMMANDS])
def test_database_path_that_is_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch, argv: list[str],
) -> None:
    monkeypatch.setenv("RAG_DB", str(tmp_path))
    code, _, err = run(capsys, caplog, *argv)
    assert code == 1
    assert one_error_line(err) == f"error: the database path {tmp_path} is a folder; give a file such as " \
                                  f"{tmp_path / 'rag.db'}"


@pytest.mark.parametrize("content", [b"this is not sqlite at all" * 100, b"SQLite format 3\x00" + b"\x07" * 2000])
def test_a_file_that_is_not_a_database(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    content: bytes,
) -> None:
    bad = tmp_path / "notes.db"
    bad.write_bytes(content)
    for argv in (["status"], ["ingest", str(corpus)]):
        code, _, err = run(capsys, caplog, *argv, "--db", str(bad))
        assert code == 1 and "is not a rag-desk database" in one_error_line(err)
    assert bad.read_bytes() == content  # nothing written into it


def test_a_database_that_cannot_be_opened_writable_falls_back_to_reading(
    db: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a read-only medium does (the WAL -shm file cannot be created), simulated so that it
    # also holds for root, who may write any file.
    real_connect = store.connect

    def refusing(path: str | Path, *, uri: bool = False) -> store.Connection:
        if not uri:
            raise store.sqlite.OperationalError("attempt to write a readonly database")
        return real_connect(path, uri=uri)

    monkeypatch.setattr(store, "connect", refusing)
    code, out, _ = run(capsys, caplog, "search", "VPN-403", "--db", str(db), "--json")
    assert code == 0 and json.loads(out)
    code, out, _ = run(capsys, caplog, "status", "--db", str(db))
    assert code == 0 and "3 documents: 3 ok" in out


def test_a_full_disk_during_ingest_is_one_line_and_keeps_what_was_committed(
    db: Path, corpus: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_connect = store.connect
    pages = store.open_db(db).execute("PRAGMA page_count").fetchone()[0]

    def small(path: str | Path, *, uri: bool = False) -> store.Connection:
        conn = real_connect(path, uri=uri)
        conn.execute(f"PRAGMA max_page_count = {pages + 2}")  # the "disk" holds two more pages
        return conn

    monkeypatch.setattr(store, "connect", small)
    (corpus / "big.md").write_text("# Big\n\n" + "\n\n".join(f"Paragraph {i} " + "word " * 80 for i in range(80)),
                                   "utf-8")
    code, _, err = run(capsys, caplog, "ingest", str(corpus), "--db", str(db))
    assert code == 1 and "is full" in one_error_line(err)
    monkeypatch.setattr(store, "connect", real_connect)
    conn = store.open_db(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert {r["source"] for r in store.document_rows(conn)} >= {"vpn.md", "backup.txt"}
