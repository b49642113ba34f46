"""rag.golden: the relevance rule, golden-set validation and reading, and query expansion."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rag.chunking import destroyed_needles
from rag.errors import RagError
from rag.golden import Evidence, expand_queries, is_relevant, load_golden, parse_golden, parse_golden_bytes

from .evalkit import GOLDEN, NEEDLE


def test_relevance_rule_normalises_case_and_whitespace() -> None:
    evidence = [Evidence("leave.md", NEEDLE)]
    content = "Intro.\nBetween 3 and\n   15 YEARS of service:\u00a06 hours per pay period.\nMore."
    assert is_relevant("leave.md", content, evidence)
    assert not is_relevant("other.md", content, evidence)  # same words, wrong source
    assert not is_relevant("leave.md", "Between 3 and 15 years of service: 6 hours", evidence)  # half a needle
    assert not is_relevant("leave.md", content, [])
    assert is_relevant("b.md", "x " + NEEDLE, [Evidence("a.md", "nothing here"), Evidence("b.md", NEEDLE)])


def test_destroyed_needles() -> None:
    contents = {"a.md": ["first half of the needle", "second half"], "b.md": ["The Whole   needle here"]}
    needles = [("a.md", "half of the needle second half"), ("b.md", "whole needle"), ("c.md", "gone")]
    assert destroyed_needles(contents, needles) == [("a.md", "half of the needle second half"), ("c.md", "gone")]


def test_parse_golden_rejects_bad_items() -> None:
    good = {"id": "G1", "kind": "answerable", "question": "q?", "paraphrases": ["p"], "groups": ["all"],
            "evidence": [{"source": "a.md", "quote": "x"}]}
    assert parse_golden([good]).items[0].evidence == (Evidence("a.md", "x"),)
    with pytest.raises(RagError, match="duplicate id"):
        parse_golden([good, good])
    with pytest.raises(RagError, match="kind must be one of"):
        parse_golden([{**good, "kind": "maybe"}])
    with pytest.raises(RagError, match="needs evidence"):
        parse_golden([{**good, "evidence": []}])
    with pytest.raises(RagError, match="non-empty JSON list"):
        parse_golden({})


def test_expand_queries_every_wording_with_its_groups() -> None:
    golden = parse_golden(GOLDEN)
    queries = expand_queries(golden.items)
    assert [q.id for q in queries] == ["G1/q", "G1/p1", "G2/q", "G3/q", "G4/q", "G5/q"]
    assert queries[1].wording == "paraphrase 1" and queries[1].text == "how many hrs per paycheck after 5 yrs"
    assert queries[3].groups == ("hr",) and queries[3].kind == "answerable"
    public = expand_queries(golden.items, groups_as_golden=False)
    assert public[3].groups == ("all",) and public[3].kind == "forbidden"
    assert [q.kind for q in public if q.item.id != "G3"] == [q.kind for q in queries if q.item.id != "G3"]


def test_load_golden_names_and_hashes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "golden_test.json"
    data = json.dumps(GOLDEN).encode("utf-8")
    path.write_bytes(data)
    golden = load_golden(path)
    assert golden.name == "golden_test" and len(golden.items) == 5
    assert golden == parse_golden_bytes(data, "golden_test", str(path))
    assert golden.sha256 == hashlib.sha256(data).hexdigest()


def test_unreadable_golden_files_are_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(RagError, match=r"cannot read the golden set .*missing\.json"):
        load_golden(tmp_path / "missing.json")
    with pytest.raises(RagError, match=r"cannot read the golden set upload\.json"):
        parse_golden_bytes(b"[{", "upload", "upload.json")
    with pytest.raises(RagError, match=r"cannot read the golden set upload\.json"):
        parse_golden_bytes(b"\xff\xfe", "upload", "upload.json")


def test_parse_golden_checks_fields_before_duplicates() -> None:
    good = {"id": "G1", "kind": "answerable", "question": "q?", "evidence": [{"source": "a.md", "quote": "x"}]}
    with pytest.raises(RagError, match="item 2 lacks kind"):
        parse_golden([good, {"id": "G1", "question": "q?"}])
    with pytest.raises(RagError, match="item 1 is not an object"):
        parse_golden(["G1"])
    with pytest.raises(RagError, match="evidence entries need a source and a quote"):
        parse_golden([{**good, "evidence": [{"source": "a.md"}]}])
    with pytest.raises(RagError, match="paraphrases must be a list of strings"):
        parse_golden([{**good, "paraphrases": "p"}])
    assert parse_golden([{**good, "groups": ["hr", "all", "hr"]}]).items[0].groups == ("all", "hr")


def test_shared_handbook_golden_set_loads() -> None:
    from .conftest import shared_eval_or_skip

    golden = load_golden(shared_eval_or_skip() / "golden_handbook.json")
    queries = expand_queries(golden.items)
    assert len(golden.items) == 45 and len(queries) == 90
    assert sum(q.kind == "answerable" for q in queries) == 56
    assert len(golden.sha256) == 64
