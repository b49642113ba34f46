"""Golden sets: parsing and validation, the relevance rule, and the queries a set expands to.

The format is the one of ``../shared/eval/README.md``: a JSON list of items ``{id, kind
answerable|unanswerable|forbidden, question, paraphrases, groups, evidence [{source, quote}]}``.
Relevance: a hit is relevant when its source is the evidence source and its own ``content``
contains the whole quote, both under ``relevance_norm`` (NFC, casefold, whitespace collapsed,
stripped). Evidence is a quote, never a chunk id, so a golden set survives any change of chunker.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag import store
from rag.errors import RagError
from rag.text import nfc, relevance_norm

KINDS = ("answerable", "unanswerable", "forbidden")


@dataclass(frozen=True, slots=True)
class Evidence:
    source: str  # relative to the corpus folder, as stored in documents.source (NFC)
    quote: str  # the needle: a verbatim sentence of that file


@dataclass(frozen=True, slots=True)
class GoldenItem:
    id: str
    kind: str  # "answerable" | "unanswerable" | "forbidden"
    question: str
    paraphrases: tuple[str, ...]
    groups: tuple[str, ...]  # the asker's groups
    evidence: tuple[Evidence, ...]


@dataclass(frozen=True, slots=True)
class Golden:
    name: str  # file stem, e.g. "golden_handbook"
    sha256: str  # of the file bytes: runs on different versions of a set are not comparable
    items: tuple[GoldenItem, ...]


@dataclass(frozen=True, slots=True)
class Query:
    """One wording of one golden item, asked as one reader."""

    id: str  # "H01/q" for the question, "H01/p1" for the first paraphrase
    item: GoldenItem
    wording: str  # "question" | "paraphrase 1" | ...
    text: str
    groups: tuple[str, ...]
    kind: str  # the item's kind for this asker (a restricted answer asked as "all" is forbidden)


def is_relevant(source: str, content: str, evidence: Sequence[Evidence]) -> bool:
    """The golden-set relevance rule: same source, and the chunk's own content holds a whole quote."""
    if not evidence:
        return False
    text = relevance_norm(content)
    return any(source == e.source and relevance_norm(e.quote) in text for e in evidence)


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RagError(f"{where} must be a list of strings")
    return tuple(value)


def _evidence(entry: dict[str, Any], where: str) -> tuple[Evidence, ...]:
    evidence = []
    for e in entry.get("evidence") or []:
        if not isinstance(e, dict) or not isinstance(e.get("source"), str) or not isinstance(e.get("quote"), str):
            raise RagError(f"{where}: evidence entries need a source and a quote")
        evidence.append(Evidence(nfc(e["source"]), e["quote"]))  # a name copied from macOS is NFD
    return tuple(evidence)


def _parse_item(entry: Any, where: str, seen: set[str]) -> GoldenItem:
    """One item of a golden set, checked (``seen``: the ids before it); ``where`` names it in errors."""
    if not isinstance(entry, dict):
        raise RagError(f"{where} is not an object")
    missing = [f for f in ("id", "kind", "question") if not isinstance(entry.get(f), str) or not entry[f]]
    if missing:
        raise RagError(f"{where} lacks {', '.join(missing)}")
    item_id = entry["id"]
    if item_id in seen:
        raise RagError(f"{where}: duplicate id {item_id!r}")
    if entry["kind"] not in KINDS:
        raise RagError(f"{where} ({item_id}): kind must be one of {', '.join(KINDS)}")
    evidence = _evidence(entry, f"{where} ({item_id})")
    if entry["kind"] == "answerable" and not evidence:
        raise RagError(f"{where} ({item_id}): an answerable item needs evidence")
    return GoldenItem(
        id=item_id,
        kind=entry["kind"],
        question=entry["question"],
        paraphrases=_str_list(entry.get("paraphrases", []), f"{where} ({item_id}) paraphrases"),
        groups=tuple(store.normalize_groups(_str_list(entry.get("groups", ["all"]), f"{where} groups"))),
        evidence=evidence,
    )


def parse_golden(raw: Any, name: str = "golden", sha256: str = "") -> Golden:
    """Validate a golden set in the ``../shared/eval/README.md`` format.

    Raises:
        RagError: not a non-empty list, an item without id, kind or question, an unknown kind, a
            duplicate id, malformed evidence, or an answerable item without evidence.
    """
    if not isinstance(raw, list) or not raw:
        raise RagError(f"golden set {name!r} must be a non-empty JSON list of items")
    items: list[GoldenItem] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        item = _parse_item(entry, f"golden set {name!r}, item {index + 1}", seen)
        seen.add(item.id)
        items.append(item)
    return Golden(name, sha256, tuple(items))


def parse_golden_bytes(data: bytes, name: str, where: str) -> Golden:
    """A golden set from a file's bytes (UTF-8 JSON), named ``name`` and hashed (sha256).

    ``where`` (the path or upload name) goes into the error message of an unreadable file.
    """
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RagError(f"cannot read the golden set {where}: {e}") from e
    return parse_golden(raw, name, hashlib.sha256(data).hexdigest())


def load_golden(path: str | Path) -> Golden:
    """The golden set in the JSON file ``path``, named after its stem."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RagError(f"cannot read the golden set {path}: {e}") from e
    return parse_golden_bytes(data, path.stem, str(path))


def expand_queries(items: Sequence[GoldenItem], groups_as_golden: bool = True) -> list[Query]:
    """Every question and every paraphrase as a query.

    With ``groups_as_golden`` each query is asked as its item's groups. Without it every query is
    asked as a public reader (``["all"]``), and an answerable item whose evidence needs other
    groups becomes "forbidden" for that reader: it must be refused and must not leak.
    """
    queries: list[Query] = []
    for item in items:
        groups = item.groups if groups_as_golden else (store.PUBLIC_GROUP,)
        kind = item.kind
        if not groups_as_golden and kind == "answerable" and item.groups != (store.PUBLIC_GROUP,):
            kind = "forbidden"
        wordings = [("q", "question", item.question)] + [
            (f"p{i}", f"paraphrase {i}", text) for i, text in enumerate(item.paraphrases, start=1)
        ]
        queries.extend(Query(f"{item.id}/{tag}", item, label, text, groups, kind) for tag, label, text in wordings)
    return queries
