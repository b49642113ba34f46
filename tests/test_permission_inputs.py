"""Permission inputs fail closed: a document whose permissions cannot be read is failed or
withheld, never public, and every ignored or unmatched permission input is reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag import store
from rag.cli import main
from rag.config import Settings
from rag.errors import RagError
from rag.ingest import document_statuses, ingest, load_acl
from rag.retrieval import search

from .fakes import FakeEmbedder


@pytest.fixture
def db_path(backend_db: Path | str) -> Path | str:
    """Every test here runs on SQLite and on PostgreSQL (tests/conftest.py), but the SQLITE_ONLY ones."""
    return backend_db

SECRET = "LAYOFFTOKEN"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def found_by(conn: store.Connection, settings: Settings, groups: tuple[str, ...]) -> list[str]:
    hits = search(conn, SECRET, embedder=FakeEmbedder(), settings=settings, groups=groups, stage="fts", k=10)
    return [h.source for h in hits]


def status_of(conn: store.Connection, settings: Settings, source: str) -> tuple[str, list[str], str | None]:
    doc = {d.source: d for d in document_statuses(conn, settings)}[source]
    return doc.status, list(doc.groups), doc.error


@pytest.mark.parametrize(
    ("front_matter", "reason"),
    [
        ("---\ngroups: [hr\n---\n", "not valid YAML"),  # the YAML typo of the report
        ("---\ngroups: [hr]\n", "never closed"),  # no closing ---
        ("---\ngroups: []\n---\n", "is empty"),
        ("---\ngroups:\n---\n", "is empty"),
        ("---\ngroups: {hr: true}\n---\n", "list of group names"),
        ("---\ngroup: hr\n---\n", "'groups:'"),
        ("---\nnhóm: [nhân-sự]\n---\n", "'groups:'"),  # "groups", written in Vietnamese
        ("---\nNhom: hr\n---\n", "'groups:'"),  # the same, typed without tones
        ("---\nquyền: hr\n---\n", "'groups:'"),  # "permissions"
        ("---\n- hr\n---\n", "key: value"),
        ("---\ngroups: [true]\n---\n", "true or false"),  # YAML's boolean, not a name
        ("---\ngroups: yes\n---\n", "true or false"),
    ],
)
def test_unreadable_front_matter_permissions_fail_the_document(
    conn: store.Connection, settings: Settings, tmp_path: Path, front_matter: str, reason: str
) -> None:
    root = tmp_path / "d"
    write(root, "a.md", front_matter + f"\n# P\n\n{SECRET} is planned for March.\n")
    report = ingest(conn, [root], settings=settings, embedder=FakeEmbedder())
    assert [r.status for r in report.results] == ["failed"]
    status, _groups, error = status_of(conn, settings, "a.md")
    assert status == "failed" and error is not None and reason in error
    assert found_by(conn, settings, ("all",)) == []
    assert found_by(conn, settings, ("hr",)) == []


def test_groups_key_is_read_case_insensitively(conn: store.Connection, settings: Settings, tmp_path: Path) -> None:
    root = tmp_path / "d"
    write(root, "a.md", f"---\nGroups: hr\n---\n\n# P\n\n{SECRET} is planned.\n")
    ingest(conn, [root], settings=settings, embedder=FakeEmbedder())
    assert status_of(conn, settings, "a.md")[:2] == ("ok", ["hr"])
    assert found_by(conn, settings, ("all",)) == [] and found_by(conn, settings, ("hr",)) == ["a.md"]


@pytest.mark.parametrize("front_matter", ["groups: hr, finance", "groups: [hr, finance]", "groups: ['hr,finance']"])
def test_groups_written_with_commas_are_several_groups(
    conn: store.Connection, settings: Settings, tmp_path: Path, front_matter: str
) -> None:
    # "groups: hr, finance" is one YAML string; stored as one group "hr, finance", no reader could hold it.
    root = tmp_path / "d"
    write(root, "a.md", f"---\n{front_matter}\n---\n\n# P\n\n{SECRET} is planned.\n")
    ingest(conn, [root], settings=settings, embedder=FakeEmbedder())
    assert status_of(conn, settings, "a.md")[:2] == ("ok", ["finance", "hr"])
    assert found_by(conn, settings, ("hr",)) == ["a.md"] and found_by(conn, settings, ("finance",)) == ["a.md"]
    assert found_by(conn, settings, ("all",)) == []


def test_a_thematic_break_on_line_one_is_not_front_matter(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    root = tmp_path / "d"
    write(root, "a.md", f"---\n\n# P\n\n{SECRET} is public news.\n")
    ingest(conn, [root], settings=settings, embedder=FakeEmbedder())
    assert status_of(conn, settings, "a.md")[:2] == ("ok", ["all"])


def test_tightened_acl_applies_even_when_the_changed_file_fails(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    root = tmp_path / "d"
    write(root, "plan.txt", f"Plan\n\n{SECRET} is planned for March.\n")
    acl = write(tmp_path, "acl.json", json.dumps({"plan.txt": ["all"]}))
    ingest(conn, [root], settings=settings, embedder=FakeEmbedder(), acl=load_acl(acl))
    assert found_by(conn, settings, ("all",)) == ["plan.txt"]
    acl.write_text(json.dumps({"plan.txt": ["hr"]}))
    (root / "plan.txt").write_bytes(b"\xc3\x28 broken utf-8 " + SECRET.encode())
    ingest(conn, [root], settings=settings, embedder=FakeEmbedder(), acl=load_acl(acl))
    status, groups, _ = status_of(conn, settings, "plan.txt")
    assert status == "failed" and groups == ["hr"]
    assert found_by(conn, settings, ("all",)) == []  # the old public chunks are hr-only now
    assert found_by(conn, settings, ("hr",)) == ["plan.txt"]  # and not lost


def test_old_version_is_withheld_when_new_permissions_cannot_be_read(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    root = tmp_path / "d"
    write(root, "a.md", f"# P\n\n{SECRET} is planned for March.\n")
    ingest(conn, [root], settings=settings, embedder=FakeEmbedder())
    assert found_by(conn, settings, ("all",)) == ["a.md"]
    write(root, "a.md", f"---\ngroups: [hr\n---\n\n# P\n\n{SECRET} is planned for March.\n")
    ingest(conn, [root], settings=settings, embedder=FakeEmbedder())
    status, groups, _ = status_of(conn, settings, "a.md")
    assert status == "failed" and groups == []
    assert found_by(conn, settings, ("all",)) == [] and found_by(conn, settings, ("hr",)) == []
    row = conn.execute("SELECT chunk_count, canonical_text FROM documents WHERE source = 'a.md'").fetchone()
    assert row["chunk_count"] > 0 and SECRET in row["canonical_text"]  # withheld, not lost
    # fixing the file brings it back with its declared groups
    write(root, "a.md", f"---\ngroups: [hr]\n---\n\n# P\n\n{SECRET} is planned for March.\n")
    ingest(conn, [root], settings=settings, embedder=FakeEmbedder())
    assert status_of(conn, settings, "a.md")[:2] == ("ok", ["hr"])
    assert found_by(conn, settings, ("all",)) == [] and found_by(conn, settings, ("hr",)) == ["a.md"]


def test_empty_acl_list_is_refused(tmp_path: Path) -> None:
    acl = write(tmp_path, "acl.json", json.dumps({"hr/salaries.md": []}))
    with pytest.raises(RagError, match=r"empty group list.*\[\"all\"\]"):
        load_acl(acl)


def test_acl_keys_are_normalised_and_unmatched_keys_reported(
    conn: store.Connection, settings: Settings, tmp_path: Path
) -> None:
    root = tmp_path / "d"
    write(root, "hr/salaries.md", f"# Salaries\n\n{SECRET} bands.\n")
    acl = write(tmp_path, "acl.json", json.dumps({"./hr/salaries.md": ["hr"], "hr/salary.md": ["hr"],
                                                   "eng/*.md": ["eng"]}))
    report = ingest(conn, [root], settings=settings, embedder=FakeEmbedder(), acl=load_acl(acl))
    assert status_of(conn, settings, "hr/salaries.md")[:2] == ("ok", ["hr"])
    assert found_by(conn, settings, ("all",)) == []
    assert len(report.warnings) == 2
    assert "'hr/salary.md'" in report.warnings[0] and "matches no file" in report.warnings[0]
    assert "'eng/*.md'" in report.warnings[1]


def test_cli_reports_unmatched_acl_keys_and_failed_permissions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rag.registry.load_embedder", lambda *a, **k: FakeEmbedder())
    root = tmp_path / "d"
    write(root, "a.md", f"---\ngroups: [hr\n---\n\n# P\n\n{SECRET}\n")
    acl = write(tmp_path, "acl.json", json.dumps({"missing.md": ["hr"]}))
    db = tmp_path / "t.db"
    code = main(["ingest", str(root), "--db", str(db), "--acl", str(acl), "--embedder", "minilm"])
    err = capsys.readouterr().err
    assert code == 0
    assert "FAILED a.md: the front matter is not valid YAML" in err
    assert "WARNING: the access map's key 'missing.md' matches no file" in err
    assert "Traceback" not in err
