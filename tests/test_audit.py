"""Seed 004's cut-position audit and the `rag audit cuts` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag.audit import audit_cuts, cut_positions, describe_cut, valid_boundaries
from rag.chunking import chunk_document, document_segments
from rag.cli import main
from rag.extract import extract
from rag.records import Extracted, PageSpan

from .conftest import shared_eval_or_skip

PROSE = "\n\n".join(
    " ".join(f"Paragraph {p} sentence {s} talks about chunk cuts and where they fall." for s in range(4))
    for p in range(8)
)


def doc_of(text: str, extractor: str = "text") -> Extracted:
    return Extracted(text, "Cuts", extractor, "1")


def test_valid_boundaries_are_block_and_sentence_ends() -> None:
    text = "Title line\n\nOne sentence. Two sentences here.\n\n- item one\n- item two\n"
    ends = valid_boundaries(text, document_segments(doc_of(text)))
    assert {text.index("line") + 4, text.index("sentence.") + 9, text.index("here.") + 5,
            text.index("one\n") + 3, text.index("two") + 3} <= ends
    assert text.index("One ") + 3 not in ends  # mid-sentence


def test_cut_positions_skip_the_last_chunk_of_each_page() -> None:
    doc = Extracted("aaa bbb\n\nccc ddd", "T", "pdf", "1", 0, (PageSpan(1, 0, 7), PageSpan(2, 9, 16)))
    chunks = chunk_document(doc, strategy="A", budget=10, count_tokens=len, max_tokens=100, size=4)
    assert [c.page for c in chunks] == [1, 1, 2, 2]
    assert cut_positions(chunks) == [chunks[0].char_to, chunks[2].char_to]


def test_blind_cuts_fall_mid_sentence_and_boundary_cuts_do_not() -> None:
    doc = doc_of(PROSE)
    blind = audit_cuts(doc, "A", size=200)
    assert blind.cuts >= 10 and blind.outside_pct > 80
    assert blind.outside == len(blind.outside_at)
    for strategy in "CDEF":
        result = audit_cuts(doc, strategy, size=200)
        assert result.cuts >= 7 and result.outside == 0 and result.outside_pct == 0.0
    tokens = audit_cuts(doc, "E", budget=60, count_tokens=lambda s: len(s.split()) + 2)
    assert tokens.budget == 60 and tokens.size is None and tokens.outside == 0 and tokens.cuts > 5


def test_audit_needs_a_size_or_a_tokenizer_for_boundary_strategies() -> None:
    with pytest.raises(ValueError, match="token budget"):
        audit_cuts(doc_of(PROSE), "E")
    with pytest.raises(ValueError, match="choose one of"):
        audit_cuts(doc_of(PROSE), "X", size=100)


def test_describe_cut() -> None:
    assert describe_cut("hello world\nagain", 5, width=5) == "…hello| worl…"
    assert describe_cut("ab\ncd", 3, width=5) == "…ab⏎|cd…"


def test_cli_audit_cuts_json_and_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "doc.txt"
    path.write_text(PROSE, encoding="utf-8")
    assert main(["audit", "cuts", str(path), "--strategy", "A", "--size", "300", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["file"] == str(path) and report["strategy"] == "A" and report["size"] == 300
    assert report["cuts"] == len(PROSE) // 300 and report["outside"] == len(report["outside_at"])
    assert main(["audit", "cuts", str(path), "--strategy", "C", "--size", "300", "--show", "2"]) == 0
    out = capsys.readouterr().out
    assert "strategy C (300-character target)" in out and "0 outside" in out and "(0.0 %)" in out


def test_cli_audit_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "cuts", str(tmp_path / "missing.txt"), "--size", "100"]) == 1
    assert capsys.readouterr().err == f"error: no such file: {tmp_path / 'missing.txt'}\n"
    assert main(["audit", "cuts", str(tmp_path), "--size", "100"]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path} is a folder: `rag audit cuts` reads one document\n"
    with pytest.raises(SystemExit):
        main(["audit", "nope"])  # an unknown audit name
    # A bare `rag audit` shows the team-mode audit log (tests/test_cli_users.py): here no database exists.
    assert main(["audit"]) == 1
    assert "no database" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--size", "0"], "error: --size must be at least 2 characters (got 0)\n"),
        (["--size", "-5"], "error: --size must be at least 2 characters (got -5)\n"),
        (["--strategy", "A", "--size", "1"], "error: --size must be at least 2 characters (got 1)\n"),
        (["--strategy", "R", "--size", "0"], "error: --size must be at least 2 characters (got 0)\n"),
        (["--budget", "-1"], "error: --budget must be 0 (the embedder's default budget) or a number of tokens "
                             "(got -1)\n"),
    ],
    ids=["size-0", "size-negative", "A-size-1", "R-size-0", "budget-negative"],
)
def test_cli_audit_cuts_refuses_a_size_or_budget_it_cannot_cut_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str],
    message: str,
) -> None:
    def no_model(*_a: object, **_k: object) -> None:
        raise AssertionError("the options are checked before a model loads")

    monkeypatch.setattr("rag.registry.load_embedder", no_model)
    path = tmp_path / "doc.txt"
    path.write_text(PROSE, encoding="utf-8")
    assert main(["audit", "cuts", str(path), *argv]) == 1
    assert capsys.readouterr().err == message


def test_cli_audit_cuts_budget_zero_is_the_embedders_default_as_chunk_tokens_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from .fakes import FakeEmbedder

    monkeypatch.setattr("rag.registry.load_embedder", lambda *a, **k: FakeEmbedder())  # window 256: default 204
    monkeypatch.setenv("RAG_CHUNK_TOKENS", "60")
    path = tmp_path / "doc.txt"
    path.write_text(PROSE, encoding="utf-8")
    assert main(["audit", "cuts", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget"] == 60  # no --budget: the setting
    assert main(["audit", "cuts", str(path), "--budget", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget"] == 204  # 0: the embedder's default, not the setting
    assert main(["audit", "cuts", str(path), "--budget", "30", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget"] == 30


# ---------------------------------------------------------------------------------------------
# Seed 004 on RFC 9562


def test_rfc9562_blind_cuts_mostly_mid_sentence_and_boundary_cuts_never() -> None:
    doc = extract(shared_eval_or_skip() / "rfc9562" / "rfc9562.txt")
    blind = audit_cuts(doc, "A", size=1000)
    assert blind.cuts >= 100 and blind.outside_pct >= 90  # seed 004: 98 %
    for strategy in "CE":
        result = audit_cuts(doc, strategy, size=1000)
        assert result.cuts >= 100 and result.outside == 0  # seed 004: 0 %
    recursive = audit_cuts(doc, "R", size=1000)
    assert 0 < recursive.outside_pct < blind.outside_pct  # newline cuts in hard-wrapped text


@pytest.mark.slow
def test_rfc9562_strategy_e_at_the_default_budget(real_embedder) -> None:  # type: ignore[no-untyped-def]
    doc = extract(shared_eval_or_skip() / "rfc9562" / "rfc9562.txt")
    result = audit_cuts(doc, "E", budget=204, count_tokens=real_embedder.count_tokens, max_tokens=256)
    assert result.cuts >= 100 and result.outside == 0


def test_a_stored_document_is_audited_from_its_canonical_text(tmp_path: Path) -> None:
    """The Chunks page audits the stored text: front matter found again, same cuts as the file."""
    from rag import store
    from rag.audit import audit_document, audit_table, stored_extracted
    from rag.config import load_settings
    from rag.errors import RagError
    from rag.ingest import ingest

    from .fakes import FakeEmbedder

    source = tmp_path / "cuts.md"
    source.write_text("---\ntitle: Cuts\ngroups: [admin]\n---\n\n# Cuts\n\n" + PROSE + "\n", encoding="utf-8")
    settings = load_settings(db_path=tmp_path / "t.db")
    conn = store.open_db(settings.db_path)
    try:
        model = FakeEmbedder()
        ingest(conn, [source], settings=settings, embedder=model)
        row = store.get_document(conn, next(r["id"] for r in store.document_rows(conn)))
    finally:
        conn.close()
    stored = stored_extracted(row)
    from_file = extract(source)
    assert (stored.text, stored.body_start, stored.metadata["groups"]) == (
        from_file.text, from_file.body_start, ["admin"])
    blind = audit_document(row, "A", model, settings)
    assert blind.outside == len(audit_table(stored.text, blind)) > 0  # 512-character windows cut sentences
    assert audit_document(row, "E", model, settings).outside == 0
    with pytest.raises(RagError, match="strateg"):
        audit_document(row, "Z", model, settings)
