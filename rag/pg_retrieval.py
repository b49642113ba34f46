"""Retrieval on PostgreSQL: pgvector for the dense branch, full-text search with BM25 for the sparse one.

``rag.retrieval.search`` stays the one search: on a ``PgConnection`` it runs inside
``rag.pg.reader`` (one REPEATABLE READ transaction as ``rag_reader`` with the reader's access keys,
so row-level security applies to every statement) and its branch executors hand the connection to
the functions here. Fusion (RRF), the keyword-coverage filter and its IDF, the gate and the access
keys are the same code as on SQLite; only the SQL differs.

Dense: an exact scan of the visible vectors when they are few (``EXACT_SCAN_ROWS``), else the
per-dimension HNSW index with ``hnsw.iterative_scan = relaxed_order``, so a selective access filter
does not starve the top k (pgvector without it returned 3 of 10 rows at a 1 % filter), re-sorted
afterwards as pgvector's documentation advises. The access filter is in both queries.

Sparse: FTS5's own BM25 (k1 = 1.2, b = 0.75, column weights, IDF from the ``fts_terms``
statistics of every chunk), because PostgreSQL's ``ts_rank`` / ``ts_rank_cd`` have no IDF: a match
on a word in half the chunks counts like a match on a word in two. It is summed in SQL over the
posting lists of ``fts_postings`` (the same folded terms as FTS5's, ``rag.pg.term_counts``);
phrases ("vpn-403") are matched through ``chunks.fts`` (tsvector, GIN) and scored by
``bm25_scores``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from rag import pg, retrieval
from rag.pg import PgConnection

# Visible vectors up to which an exact scan is used instead of HNSW, measured with
# `rag bench --backend postgres` (README, "PostgreSQL"; 100k 384-d vectors, top 50, 2 cores): an
# exact scan of 5k visible vectors took 1.9 ms against 2.1 ms for HNSW with iterative scans, of
# 20k 10.3 against 6.4 ms (and HNSW kept only 0.93 of the exact top 50), of 100k 128 against 3.6.
EXACT_SCAN_ROWS = 10_000
# hnsw.ef_search, the candidates HNSW keeps per search (pgvector's default is 40, its maximum
# 1000): chosen as the smallest tried (40, 100, 200, 400, 800) whose top 50 kept at least what
# SQLite's fast path keeps of the exact top (0.98), on the handbook's golden queries at 100k
# chunks (2 cores): overlap with the exact top 50 was 0.905 / 0.923 / 0.964 / 0.974 / 0.996 and
# hybrid p50 9.3 / 8.2 / 8.7 / 9.5 / 11.5 ms; at 800 the one question of 56 that PostgreSQL
# missed at R@20 and SQLite found came back (README, "PostgreSQL").
HNSW_EF_SEARCH_MIN = 800
HNSW_EF_SEARCH_MAX = 1000  # pgvector refuses more
BM25_K1 = 1.2  # FTS5's bm25() constants (https://sqlite.org/fts5.html#the_bm25_function)
BM25_B = 0.75
FTS5_MIN_IDF = 1e-6  # FTS5 floors a non-positive IDF at this
_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


# ---------------------------------------------------------------------------------------------
# SQL (the dimension is an integer chosen in code; the access filter is a flag for the RLS tests)

# How many vectors the reader sees (vector_counts is kept by triggers): a sum over a few rows.
VISIBLE_ROWS_SQL = """
SELECT coalesce(sum(vectors), 0) FROM vector_counts
WHERE collection_id = %(collection)s AND dimension = %(dimension)s AND acl = ANY(%(access_keys)s)
"""

DENSE_EXACT_SQL = """
SELECT chunk_id, embedding <=> %(query)s::vector AS distance
FROM chunk_vectors
WHERE collection_id = %(collection)s AND dimension = {dim} {access}
ORDER BY distance, chunk_id
LIMIT %(k)s
"""

# The ORDER BY expression and the WHERE dimension = N predicate are the HNSW index's
# (rag.pg.ensure_vector_index); relaxed_order may return neighbours slightly out of order, so
# the outer query sorts them (https://github.com/pgvector/pgvector#iterative-index-scans).
DENSE_HNSW_SQL = """
WITH nearest AS MATERIALIZED (
  SELECT chunk_id, embedding::vector({dim}) <=> %(query)s::vector({dim}) AS distance
  FROM chunk_vectors
  WHERE collection_id = %(collection)s AND dimension = {dim} {access}
  ORDER BY distance
  LIMIT %(k)s)
SELECT chunk_id, distance FROM nearest ORDER BY distance, chunk_id
"""

# BM25 of the one-word keywords from their posting lists (fts_postings), plus the scores of the
# phrases computed beforehand (phrase_ids, phrase_scores), summed per chunk: FTS5's bm25(),
# best first as FTS5's negative values sort.
FTS_BM25_SQL = """
WITH query(term, idf) AS (SELECT * FROM unnest(%(terms)s::text[], %(idfs)s::float8[])),
parts(chunk_id, part) AS (
  SELECT p.chunk_id,
         q.idf * w.f * (%(k1)s + 1) / (w.f + %(k1)s * (1 - %(b)s + %(b)s * p.length / %(avg_length)s))
  FROM query q
  JOIN fts_postings p ON p.term = q.term
  CROSS JOIN LATERAL (SELECT %(weight_heading)s * p.tf_heading + %(weight_body)s * p.tf_body AS f) w
  WHERE p.collection_id = %(collection)s {access}
  UNION ALL
  SELECT * FROM unnest(%(phrase_ids)s::bigint[], %(phrase_scores)s::float8[]))
SELECT chunk_id, -sum(part) AS score FROM parts GROUP BY chunk_id ORDER BY score, chunk_id LIMIT %(k)s
"""

# The chunks matching a phrase ("vpn-403": vpn then 403), with the positions and weights of its
# terms, for phrase_counts() (posting lists hold no positions).
FTS_MATCHES_SQL = """
SELECT k.id, k.fts_length, t.lexeme, t.weights, t.positions
FROM chunks k, unnest(k.fts) AS t(lexeme, positions, weights)
WHERE k.fts @@ %(query)s::tsquery
  AND k.collection_id = %(collection)s {access}
  AND t.lexeme = ANY(%(terms)s)
"""

TERM_DOCS_SQL = "SELECT term, docs FROM fts_terms WHERE term = ANY(%(terms)s)"
TOTALS_SQL = "SELECT docs, tokens FROM fts_totals"
FTS_TEXT_SQL = "SELECT id, fts_heading || ' ' || fts_body FROM chunks WHERE id = ANY(%(ids)s)"
FOLDED_BODY_SQL = "SELECT id, fts_body FROM chunks WHERE id = ANY(%(ids)s)"
VECTOR_DISTANCE_SQL = """
SELECT chunk_id, embedding <=> %(query)s::vector FROM chunk_vectors WHERE chunk_id = ANY(%(ids)s)
"""

HIT_ROWS_SQL = """
SELECT k.id AS chunk_id, k.document_id, d.source, d.title, k.section, k.content,
       k.char_from, k.char_to, k.page
FROM chunks k
JOIN documents d ON d.id = k.document_id
WHERE k.id = ANY(%(ids)s)
  AND k.collection_id = %(collection)s
  AND k.access_key = ANY(%(access_keys)s)
"""


def dense_sql(dimension: int, *, exact: bool, app_filter: bool = True) -> str:
    """The dense statement: exact scan or HNSW, with or without the application's access filter."""
    access = "AND acl = ANY(%(access_keys)s)" if app_filter else ""
    return (DENSE_EXACT_SQL if exact else DENSE_HNSW_SQL).format(dim=int(dimension), access=access)


def fts_sql(*, app_filter: bool = True) -> str:
    """The BM25 statement over the posting lists, with or without the application's access filter."""
    return FTS_BM25_SQL.format(access="AND p.acl = ANY(%(access_keys)s)" if app_filter else "")


def phrase_sql(*, app_filter: bool = True) -> str:
    return FTS_MATCHES_SQL.format(access="AND k.access_key = ANY(%(access_keys)s)" if app_filter else "")


# ---------------------------------------------------------------------------------------------
# Pure functions


def match_keywords(match: str) -> list[str]:
    """The keywords of an FTS5 expression built by ``rag.text.build_fts_query`` (quoted, OR-joined)."""
    return [m.group(1).replace('""', '"') for m in _QUOTED.finditer(match)]


def phrases(keywords: Sequence[str]) -> list[list[str]]:
    """Each keyword as the FTS terms it is made of (``vpn-403`` is the phrase ``vpn 403``), as FTS5
    tokenizes a quoted string; keywords without a term are dropped, duplicates kept once."""
    found: dict[tuple[str, ...], None] = {}
    for keyword in keywords:
        terms = pg.fts_tokens(keyword)
        if terms:
            found[tuple(terms)] = None
    return [list(p) for p in found]


def tsquery_literal(query_phrases: Sequence[Sequence[str]]) -> str:
    """``'a' | 'vpn' <-> '403'``: any phrase, each one's terms adjacent (terms are letters/digits)."""
    return " | ".join("(" + " <-> ".join(f"'{t}'" for t in p) + ")" for p in query_phrases)


def phrase_counts(positions: dict[str, dict[int, str]], phrase: Sequence[str]) -> dict[str, int]:
    """Occurrences of a phrase per weight (column): starts p of its first term with term i at p + i."""
    first = positions.get(phrase[0], {})
    counts: dict[str, int] = {}
    for start, weight in first.items():
        if all(start + i in positions.get(term, {}) for i, term in enumerate(phrase[1:], start=1)):
            counts[weight] = counts.get(weight, 0) + 1
    return counts


def bm25_idf(total_docs: int, docs_with: int) -> float:
    """FTS5's IDF: ``ln((N - n + 0.5) / (n + 0.5))``, floored at 1e-6 (fts5_aux.c, fts5Bm25Function)."""
    idf = math.log((total_docs - docs_with + 0.5) / (docs_with + 0.5))
    return idf if idf > 0 else FTS5_MIN_IDF


def bm25_scores(
    matches: dict[int, tuple[int, dict[str, dict[int, str]]]], query_phrases: Sequence[Sequence[str]],
    idf: Sequence[float], weights: dict[str, float], avg_length: float,
) -> dict[int, float]:
    """FTS5's bm25() (negated: lower is better, as FTS5 returns it) for each matching chunk.

    ``score(D) = sum_i IDF(i) * f(i, D) * (k1 + 1) / (f(i, D) + k1 * (1 - b + b * |D| / avgdl))``
    with ``f(i, D)`` the phrase's occurrences in D, each column's weighted (Robertson & Zaragoza,
    "The Probabilistic Relevance Framework: BM25 and Beyond", 2009; FTS5's variant). ``matches``
    maps a chunk id to its length and, per term, its positions with their weight letter.
    """
    scores: dict[int, float] = {}
    for chunk_id, (length, positions) in matches.items():
        norm = BM25_K1 * (1 - BM25_B + BM25_B * length / avg_length) if avg_length > 0 else BM25_K1
        score = 0.0
        for phrase, phrase_idf in zip(query_phrases, idf, strict=True):
            counts = phrase_counts(positions, phrase)
            tf = sum(weights.get(w, 0.0) * n for w, n in counts.items())
            score += phrase_idf * tf * (BM25_K1 + 1) / (tf + norm)
        scores[chunk_id] = -score
    return scores


# ---------------------------------------------------------------------------------------------
# Executors (called by the rag.retrieval functions of the same name)


def _params(access_keys: Sequence[int], **more: Any) -> dict[str, Any]:
    return {"access_keys": [int(k) for k in access_keys], **more}


def search_vectors(
    conn: PgConnection, vector: np.ndarray, *, collection_id: int, dimension: int, access_keys: Sequence[int],
    k: int, exact: bool | None = None, app_filter: bool = True,
) -> list[tuple[int, float]]:
    """``(chunk_id, cosine distance)`` of the ``k`` nearest visible chunks, nearest first.

    ``exact=None`` chooses: an exact scan when at most ``EXACT_SCAN_ROWS`` vectors are visible,
    else HNSW with iterative scans. ``app_filter=False`` leaves the access filter to row-level
    security alone (the tests' way to show that the second net holds).
    """
    params = _params(access_keys, query=pg.vector_literal(vector), collection=collection_id, k=k)
    if exact is None:
        visible = conn.query(VISIBLE_ROWS_SQL, params | {"dimension": int(dimension)})[0][0]
        exact = visible <= EXACT_SCAN_ROWS
    if not exact:
        ef_search = min(HNSW_EF_SEARCH_MAX, max(HNSW_EF_SEARCH_MIN, k))
        conn.query("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), "
                   "set_config('hnsw.ef_search', %s, true)", (str(ef_search),))
    rows = conn.query(dense_sql(dimension, exact=exact, app_filter=app_filter), params)
    return [(int(r[0]), float(r[1])) for r in rows]


def _totals(conn: PgConnection) -> tuple[int, int]:
    docs, tokens = conn.query(TOTALS_SQL)[0]
    return int(docs), int(tokens)


def term_docs(conn: PgConnection, terms: Sequence[str]) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in conn.query(TERM_DOCS_SQL, {"terms": list(terms)})}


def phrase_docs(conn: PgConnection, phrase: Sequence[str]) -> int:
    """Chunks holding a phrase of several terms, over every chunk (FTS5's count for its IDF)."""
    return int(conn.query("SELECT rag_phrase_docs(%s::tsquery)", (tsquery_literal([phrase]),))[0][0])


def search_fts(
    conn: PgConnection, match: str, *, collection_id: int, access_keys: Sequence[int], k: int,
    weights: tuple[float, float] = (3.0, 1.0), app_filter: bool = True,
) -> list[tuple[int, float]]:
    """``(chunk_id, bm25)`` of the best ``k`` visible chunks for an FTS5 expression of quoted
    keywords (``rag.text.build_fts_query``); bm25 is FTS5's, lower is better.

    One-word keywords are scored in SQL from their posting lists; a keyword of several words is
    a phrase, whose occurrences need positions: its matches (few, phrases are rare) are read with
    their tsvector positions and scored here, then summed in with the rest.
    """
    query_phrases = phrases(match_keywords(match))
    if not query_phrases:
        return []
    total_docs, total_tokens = _totals(conn)
    avg_length = total_tokens / total_docs if total_docs else 1.0
    words = [p[0] for p in query_phrases if len(p) == 1]
    docs = term_docs(conn, words)
    multi = [p for p in query_phrases if len(p) > 1]
    phrase_scores: dict[int, float] = {}
    if multi:
        terms = sorted({t for p in multi for t in p})
        rows = conn.query(phrase_sql(app_filter=app_filter), _params(
            access_keys, query=tsquery_literal(multi), collection=collection_id, terms=terms))
        matches: dict[int, tuple[int, dict[str, dict[int, str]]]] = {}
        for chunk_id, length, lexeme, term_weights, positions in rows:
            entry = matches.setdefault(int(chunk_id), (int(length), {}))
            entry[1][lexeme] = dict(zip(positions, term_weights, strict=True))
        phrase_scores = bm25_scores(matches, multi, [bm25_idf(total_docs, phrase_docs(conn, p)) for p in multi],
                                    {"A": weights[0], "B": weights[1]}, avg_length)
    rows = conn.query(fts_sql(app_filter=app_filter), _params(
        access_keys, terms=words, idfs=[bm25_idf(total_docs, docs.get(w, 0)) for w in words], k1=BM25_K1, b=BM25_B,
        avg_length=avg_length, weight_heading=weights[0], weight_body=weights[1], collection=collection_id,
        phrase_ids=list(phrase_scores), phrase_scores=[-v for v in phrase_scores.values()], k=k))
    return [(int(r[0]), float(r[1])) for r in rows]


def query_idf(conn: PgConnection, keywords: Sequence[str]) -> dict[str, float]:
    """``rag.retrieval.keyword_idf`` from the ``fts_terms`` statistics (every chunk, as fts5vocab)."""
    words = sorted({w for kw in keywords for w in pg.fts_tokens(kw)})
    total_docs, _ = _totals(conn)
    return retrieval.keyword_idf(total_docs, term_docs(conn, words), keywords)


def fts_texts(conn: PgConnection, chunk_ids: Sequence[int]) -> dict[int, str]:
    return {int(r[0]): r[1] for r in conn.query(FTS_TEXT_SQL, {"ids": [int(i) for i in chunk_ids]})}


def folded_bodies(conn: PgConnection, chunk_ids: Sequence[int]) -> dict[int, str]:
    return {int(r[0]): r[1] for r in conn.query(FOLDED_BODY_SQL, {"ids": [int(i) for i in chunk_ids]})}


WINDOW_DISTANCE_SQL = """
SELECT chunk_id, min(embedding <=> %(query)s::vector) FROM window_vectors WHERE chunk_id = ANY(%(ids)s)
GROUP BY chunk_id
"""


def window_distances(conn: PgConnection, vector: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]:
    rows = conn.query(WINDOW_DISTANCE_SQL, {"query": pg.vector_literal(vector), "ids": [int(i) for i in chunk_ids]})
    return {int(r[0]): float(r[1]) for r in rows}


def vector_distances(conn: PgConnection, vector: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]:
    rows = conn.query(VECTOR_DISTANCE_SQL, {"query": pg.vector_literal(vector), "ids": [int(i) for i in chunk_ids]})
    return {int(r[0]): float(r[1]) for r in rows}


def hit_rows(conn: PgConnection, chunk_ids: Sequence[int], *, collection_id: int,
             access_keys: Sequence[int]) -> dict[int, Any]:
    rows = conn.query(HIT_ROWS_SQL, _params(access_keys, ids=[int(i) for i in chunk_ids], collection=collection_id))
    return {int(r["chunk_id"]): r for r in rows}
