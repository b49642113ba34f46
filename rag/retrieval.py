"""Retrieval: a dense branch (sqlite-vec) and a sparse branch (FTS5 bm25), fused by a convex
combination of their scores (``fuse_convex``; ``fuse_rrf`` by setting).

Both branches filter INSIDE their query, never afterwards: the vec0 KNN scan carries the
collection partition (``collection_id = :collection``) and the access metadata filter
(``acl IN (...)``), and the FTS5 query joins ``chunks`` with the same two conditions. A reader
who may see 2 % of the chunks therefore still gets ``k`` results, and a chunk the reader may not
see never leaves SQLite (so it can reach neither the reranker nor the model).

Every hit carries one distance, the cosine distance ``1 - cos`` between the query vector and the
chunk's stored vector (``L2^2 / 2`` on unit vectors), also when only FTS5 found it, so the gate
judges every hit the same way.

SQL lives here as module-level constants with named parameters; a ``*_sql()`` builder returns
the statement (filling in only the vec0 table name, an identifier chosen in code) and a
``search_*()`` executor runs it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rag import ranker, spelling, store
from rag.config import Settings
from rag.embedding import Embedder
from rag.errors import QueryError
from rag.records import Collection, Hit
from rag.rerank import Reranker, rerank_hits, rerank_text
from rag.text import build_fts_query, detect_language, fold, keywords, query_language, quote_fts

if TYPE_CHECKING:  # rag.translate loads the prompt machinery of rag.generate
    from rag.translate import Translator

STAGES = ("dense", "fts", "hybrid", "rerank")
DENSE_MODES = ("exact", "binary", "hamming")
RRF_K = 60  # Cormack, Clarke & Büttcher (SIGIR 2009); settings.rrf_k defaults to it
VEC0_K_MAX = 4096  # sqlite-vec refuses a KNN `k` above this
MISSING_DISTANCE = 2.0  # the largest cosine distance: a chunk without a stored vector is "farthest"
# The passages that say which language a question is answered in (dense_share): the dense
# branch's first LANGUAGE_SAMPLE candidates, LANGUAGE_CHARS characters of each.
LANGUAGE_SAMPLE = 5
LANGUAGE_CHARS = 600
LANGUAGE_AGREEMENT = 0.8  # the share of them that must agree (4 of 5)


# ---------------------------------------------------------------------------------------------
# SQL

# Exact float KNN. `distance` is vec0's cosine distance (the table is declared
# distance_metric=cosine), the same function as vec_distance_cosine().
DENSE_EXACT_SQL = """
SELECT chunk_id, distance
FROM {table}
WHERE embedding MATCH :query
  AND k = :k
  AND collection_id = :collection
  AND acl IN (SELECT value FROM json_each(:access_keys))
ORDER BY distance
"""

# Binary-quantized prefilter, then exact float rescoring: the inner KNN over the 1-bit copy
# (Hamming distance) picks :k_coarse candidates, and the outer float KNN is restricted to them
# (vec0 pushes `chunk_id IN (...)` into its scan). Both scans carry the same filters.
DENSE_BINARY_SQL = """
SELECT chunk_id, distance
FROM {table}
WHERE embedding MATCH :query
  AND k = :k
  AND collection_id = :collection
  AND acl IN (SELECT value FROM json_each(:access_keys))
  AND chunk_id IN (
    SELECT chunk_id
    FROM {table}
    WHERE embedding_bit MATCH vec_quantize_binary(:query)
      AND k = :k_coarse
      AND collection_id = :collection
      AND acl IN (SELECT value FROM json_each(:access_keys))
  )
ORDER BY distance
"""

# "hamming" mode, step 1: the 1-bit codes of every visible chunk, read from the covering index of
# the plain chunk_vectors table (~60 bytes per chunk) and kept in memory by `hamming_codes`.
# A vec0 KNN costs time linear in its k (at 100k chunks, k = 400 on the bit column is as slow as the
# exact float scan), so the coarse scan runs in numpy instead: XOR + popcount over the codes.
HAMMING_CODES_SQL = """
SELECT chunk_id, embedding_bit
FROM chunk_vectors
WHERE collection_id = :collection
  AND acl IN (SELECT value FROM json_each(:access_keys))
"""

# What the in-memory codes depend on: the database file's random id and the collection's vector
# version (bumped by triggers on every insert, delete or access change of a vector).
HAMMING_STATE_SQL = """
SELECT (SELECT value FROM meta WHERE key = 'vector_index_id'),
       (SELECT version FROM vector_versions WHERE collection_id = :collection)
"""

# "hamming" mode, step 2: exact float rescoring of the Hamming candidates, by rowid lookups in
# chunk_vectors (CROSS JOIN keeps json_each as the outer loop). The access filter is repeated here.
HAMMING_RESCORE_SQL = """
SELECT chunk_id, vec_distance_cosine(embedding, :query) AS distance
FROM json_each(:ids) AS j
CROSS JOIN chunk_vectors ON chunk_id = j.value
WHERE collection_id = :collection
  AND acl IN (SELECT value FROM json_each(:access_keys))
ORDER BY distance, chunk_id
LIMIT :k
"""

# bm25() with one weight per FTS5 column, in declaration order (fts_heading, fts_body).
# bm25() is lower-is-better, so ascending order puts the best first. CROSS JOIN keeps the FTS5 scan
# as the outer loop (https://sqlite.org/optoverview.html#crossjoin): with a plain JOIN, SQLite 3.51
# walks the chunks of the collection first and re-runs the MATCH for each one (75 ms at 300 chunks).
FTS_SQL = """
SELECT k.id AS chunk_id, bm25(chunks_fts, :weight_heading, :weight_body) AS score
FROM chunks_fts
CROSS JOIN chunks k ON k.id = chunks_fts.rowid
WHERE chunks_fts MATCH :match
  AND k.collection_id = :collection
  AND k.access_key IN (SELECT value FROM json_each(:access_keys))
ORDER BY score, k.id
LIMIT :k
"""

# Documents containing a term (fts5vocab 'row'); terms are folded like the indexed text.
TERM_DOCS_SQL = """
SELECT term, doc FROM chunks_fts_vocab WHERE term IN (SELECT value FROM json_each(:terms))
"""

# BM25's N: the chunks of the database, as FTS5 and PostgreSQL's fts_totals count them (the highest
# chunk id, cheaper to read, stays above the count after a re-ingest or a delete and so weighed the
# keywords otherwise than PostgreSQL). Read once per state of the chunks (TermDocsCache).
CHUNK_COUNT_SQL = "SELECT count(*) FROM chunks"

# The folded indexed text of FTS hits, to see which query keywords each one holds.
FTS_TEXT_SQL = """
SELECT id, fts_heading || ' ' || fts_body FROM chunks WHERE id IN (SELECT value FROM json_each(:ids))
"""

# The folded content alone (fold(content), as ingest stored it for FTS5), for the learned order.
FOLDED_BODY_SQL = "SELECT id, fts_body FROM chunks WHERE id IN (SELECT value FROM json_each(:ids))"

# Cosine distance of stored vectors to the query, for hits the dense branch did not return: rowid
# lookups in the plain chunk_vectors table (a vec0 point lookup costs ~0.25 ms each). The same
# float32 bytes as in vec0, so the distance equals the dense branch's.
VECTOR_DISTANCE_SQL = """
SELECT v.chunk_id, vec_distance_cosine(v.embedding, :query) AS distance
FROM json_each(:ids) AS j
CROSS JOIN chunk_vectors AS v ON v.chunk_id = j.value
"""

# The nearest sentence window of each candidate chunk (window_vectors, migration 0007). Only chunk ids
# the access-filtered dense branch returned are looked up, so no filter is needed here.
WINDOW_DISTANCE_SQL = """
SELECT w.chunk_id, min(vec_distance_cosine(w.embedding, :query)) AS distance
FROM json_each(:ids) AS j
CROSS JOIN window_vectors AS w ON w.chunk_id = j.value
GROUP BY w.chunk_id
"""

# The hits' rows. The access filter is repeated here so that no code path can turn an id into
# text for a reader who may not see it.
HIT_ROWS_SQL = """
SELECT k.id AS chunk_id, k.document_id, d.source, d.title, k.section, k.content,
       k.char_from, k.char_to, k.page
FROM chunks k
JOIN documents d ON d.id = k.document_id
WHERE k.id IN (SELECT value FROM json_each(:ids))
  AND k.collection_id = :collection
  AND k.access_key IN (SELECT value FROM json_each(:access_keys))
"""


def dense_sql(dimension: int, mode: str = "exact") -> str:
    """The dense statement for vectors of ``dimension``: the vec0 KNN ("exact", or "binary" when the
    vec0 table has a bit column), or the float rescoring of the in-memory Hamming scan ("hamming")."""
    if mode == "hamming":
        return HAMMING_RESCORE_SQL
    if mode == "binary" and store.has_binary(dimension):
        return DENSE_BINARY_SQL.format(table=store.vector_table(dimension))
    if mode in ("exact", "binary"):
        return DENSE_EXACT_SQL.format(table=store.vector_table(dimension))
    raise ValueError(f"unknown dense mode {mode!r}; choose one of {', '.join(DENSE_MODES)}")


def fts_sql() -> str:
    return FTS_SQL


def distance_sql(dimension: int) -> str:
    """The statement for stored-vector distances (the plain table serves every dimension)."""
    return VECTOR_DISTANCE_SQL


# ---------------------------------------------------------------------------------------------
# Pure math


def fuse_rrf(rankings: list[list[int]], k: int = RRF_K, weights: Sequence[float] | None = None) -> dict[int, float]:
    """Reciprocal rank fusion: ``RRF(d) = sum over rankings i containing d of w_i / (k + rank_i(d))``.

    Ranks are 1-based positions in each list (best first); a list that lacks ``d`` adds
    nothing; every weight ``w_i`` is 1 unless ``weights`` says otherwise (weighted RRF, as
    ranx's ``fusion(method="wrrf")``). Cormack, Clarke & Büttcher, "Reciprocal Rank Fusion
    outperforms Condorcet and individual Rank Learning Methods", SIGIR 2009; k = 60 as in the
    paper (and ranx).
    """
    if k < 0:
        raise ValueError(f"the RRF constant k must be non-negative (got {k})")
    if weights is not None and len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    scores: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings), strict=True):
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    return scores


def fuse_convex(similarity: Mapping[int, float], bm25: Mapping[int, float], dense_share: float) -> dict[int, float]:
    """Convex combination of the branches' scores: ``share * D(c) + (1 - share) * S(c)``, higher is better.

    ``similarity`` is every candidate's cosine similarity to the question (both branches' candidates:
    the fts-only ones are looked up), ``bm25`` the keyword branch's scores (FTS5's ``bm25()``, lower
    is better; a candidate it lacks scores its theoretical minimum). ``D`` is the similarity min-max
    normalised over the candidates; ``S = -bm25 / max(-bm25)`` is normalised against BM25's
    theoretical minimum 0. Bruch, Gai & Ingber, "An Analysis of Fusion Functions for Hybrid
    Retrieval" (ACM TOIS 2023): a convex combination beats RRF in and out of domain, and RRF's
    rank-only view is what buries a passage first in one branch and absent from the other under
    passages both branches put near rank 20 (python_docs: dense rank 1, hybrid rank 10). The dense
    side is min-max over the candidates, not against cosine's theoretical -1: e5's similarities
    crowd into 0.75-0.9, and against -1 the dense branch barely moves the sum (golden_vi MRR@20
    0.700 at every share).
    """
    if not 0.0 <= dense_share <= 1.0:
        raise ValueError(f"the dense share must lie in [0, 1] (got {dense_share})")
    low = min(similarity.values(), default=0.0)
    span = max(similarity.values(), default=0.0) - low
    top = max((-score for score in bm25.values()), default=0.0)
    return {
        cid: dense_share * ((similarity[cid] - low) / span if span > 0 and cid in similarity else 0.0)
        + (1.0 - dense_share) * (-bm25[cid] / top if top > 0 and cid in bm25 else 0.0)
        for cid in {*similarity, *bm25}
    }


def dense_share(
    query_language: str, landed_language: str, *, toneless_dense_share: float, cross_language_dense_share: float,
    plain_dense_share: float = 0.5,
) -> float:
    """The dense branch's share of the fused score for a question, from how it is written and what it
    lands on: ``plain_dense_share``, except where one branch cannot read the question.

    ``query_language`` is ``rag.text.query_language`` of the question ("vi", "vi-toneless", "en");
    ``landed_language`` is the language of the passages the dense branch put first
    (``passage_language``: "vi", "en" or "mixed"):

    - Vietnamese typed without tones: ``toneless_dense_share``, whatever the passages. Neither
      bundled embedder reads toneless Vietnamese well (golden_vi: dense R@4 0.54 on those queries
      against 0.83 with tones), while the keyword branch folds tones on both sides (0.89); and an
      embedder that cannot read the question cannot say which passages it lands on either;
    - a question in another language than those passages (English asked over Vietnamese help,
      Vietnamese over an English manual): ``cross_language_dense_share``. Keywords match only the
      words both languages share (names, codes), while a multilingual embedder maps both languages
      into one space (golden_vi, English-asked: dense R@4 0.71 against keywords 0.47);
    - otherwise ``plain_dense_share``: 0.5 for RRF (``branch_weights``),
      ``settings.convex_dense_share`` for ``fuse_convex``.

    0 is keywords only, 1 vectors only.
    """
    if query_language == "vi-toneless":
        return toneless_dense_share
    if landed_language != "mixed" and query_language != landed_language:
        return cross_language_dense_share
    return plain_dense_share


def branch_weights(
    query_language: str, landed_language: str, *, toneless_dense_share: float, cross_language_dense_share: float
) -> tuple[float, float]:
    """The RRF weights (dense, sparse) for a question: the ``dense_share`` ``s`` of the total 2,
    ``(2s, 2(1 - s))``, with plain RRF's equal weights (share 0.5) for the plain case."""
    share = dense_share(query_language, landed_language, toneless_dense_share=toneless_dense_share,
                        cross_language_dense_share=cross_language_dense_share)
    return (2.0 * share, 2.0 * (1.0 - share))


@functools.lru_cache(maxsize=4096)
def _language_of_passage(text: str) -> str:
    """``detect_language`` of a passage's first ``LANGUAGE_CHARS`` characters, remembered: every
    question reads the language of its first dense passages twice (``passage_language``,
    ``translation_target``), and the same passages come back for many questions."""
    return detect_language(text[:LANGUAGE_CHARS])


def passage_language(texts: Sequence[str]) -> str:
    """"vi" or "en" when at least ``LANGUAGE_AGREEMENT`` of ``texts`` are written in it
    (``rag.text.detect_language`` of each, at most ``LANGUAGE_CHARS`` characters of it), else
    "mixed" (also for no text at all): a collection in two languages whose first passages disagree
    says nothing about which language the question lands in."""
    votes = [_language_of_passage(text) for text in texts]
    for language in ("vi", "en"):
        if votes and votes.count(language) >= LANGUAGE_AGREEMENT * len(votes):
            return language
    return "mixed"


def translation_target(asked: str, texts: Sequence[str]) -> str | None:
    """"vi" when an English question (``rag.text.query_language``) lands on a Vietnamese passage
    among ``texts`` (the dense branch's first passages): it is then searched in Vietnamese too.
    Else None.

    One passage is enough, not the 4 of 5 of ``branch_weights``: in a collection written in two
    languages (LibreOffice's Vietnamese help leaves many pages in English) an English question
    lands on the English pages, and the Vietnamese ones are exactly those it cannot match.

    Only this direction: Vietnamese questions translated into English (when they landed on an
    English passage) lost on libreoffice_vi, toned questions R@4 0.974 -> 0.868 (-4 of 38);
    e5 reads toned Vietnamese well, and no golden set asks Vietnamese over English documents.
    """
    if asked != "en":
        return None
    return "vi" if any(_language_of_passage(text) == "vi" for text in texts) else None


def fuse_wordings(
    first: Sequence[Hit], second: Sequence[Hit], rrf_k: int = RRF_K, distances: Mapping[int, float] | None = None
) -> list[Hit]:
    """Two rankings of one question (as asked, and translated) fused with plain RRF, best first.

    A hit keeps its record from ``first`` when both found it, and its fused ``rrf_score``. A hit
    only ``second`` found takes its distance from ``distances`` (the question's own, as asked)
    when given: the gate's threshold is set on the question's distances, and a translation into
    the passages' language lies nearer to all of them (golden_vi: the smaller of the two
    distances let 6 more of 24 must-refuse questions through at the shipped threshold). Plain
    RRF: the translated wording is worth as much as the question (libreoffice_vi English-asked,
    held out: R@4 0.355 -> 0.484 at 1:1, the same at 1:2; golden_vi flat at both).
    """
    rankings = [[hit.chunk_id for hit in first], [hit.chunk_id for hit in second]]
    scores = fuse_rrf(rankings, rrf_k)
    distances = distances or {}
    found: dict[int, Hit] = {hit.chunk_id: dataclasses.replace(hit, distance=distances.get(hit.chunk_id, hit.distance))
                             for hit in second}
    found.update((hit.chunk_id, hit) for hit in first)
    return [dataclasses.replace(found[cid], rrf_score=scores[cid]) for cid in order_fused(scores, rankings)]


def order_fused(scores: dict[int, float], rankings: list[list[int]]) -> list[int]:
    """Ids by RRF score, best first; ties go to the better single rank, then the lower id."""
    best: dict[int, int] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            best[item] = min(best.get(item, rank), rank)
    return sorted(scores, key=lambda item: (-scores[item], best.get(item, math.inf), item))


def window_rescore(
    dense: Sequence[tuple[int, float]], window_distances: dict[int, float], weight: float
) -> list[tuple[int, float]]:
    """The dense candidates reordered by their window vectors, each keeping its own distance.

    With chunk distance ``d`` and nearest-window distance ``w`` (cosine distances, so similarity is
    ``1 - d``), a chunk ranks by ``d - weight * max(0, d - w)``: its similarity raised by ``weight``
    times what its best window adds, never lowered (a window farther than its chunk changes
    nothing). Ties keep the dense order. The idea is max-pooling passage scores over a document's
    windows (Dai & Callan, "Deeper Text Understanding for IR with Contextual Neural Language
    Modeling", SIGIR 2019, MaxP), blended with the whole chunk so one stray sentence cannot win alone.
    """
    scored = [(windowed_distance(d, window_distances.get(cid), weight), position, cid, d)
              for position, (cid, d) in enumerate(dense)]
    return [(cid, d) for _, _, cid, d in sorted(scored)]


def windowed_distance(distance: float, window: float | None, weight: float) -> float:
    """A chunk's distance ``d`` lowered by ``weight`` times what its nearest window ``w`` adds:
    ``d - weight * max(0, d - w)`` (``d`` itself when it has no window; see ``window_rescore``)."""
    return distance if window is None else distance - weight * max(0.0, distance - window)


def hamming_distances(words: np.ndarray, query_words: np.ndarray) -> np.ndarray:
    """Hamming distance from the query code to every stored code: ``popcount(code XOR query)``.

    ``words`` is (words per code, n) uint64, one row per 64-bit word, so each XOR/popcount pass
    runs over contiguous memory (5x faster than popcounting row-major codes and summing across).
    """
    total = np.zeros(words.shape[1], dtype=np.uint16)
    for row, word in zip(words, query_words, strict=True):
        total += np.bitwise_count(row ^ word)
    return total


def nearest_by_distance(distances: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` smallest integer distances, and of every index tied with the n-th.

    Ties are kept rather than cut arbitrarily (up to 4n; beyond that an arbitrary cut at n), so
    the candidates do not depend on storage order. A counting selection: O(N), no sort.
    """
    if n >= len(distances):
        return np.arange(len(distances))
    below = np.cumsum(np.bincount(distances))
    threshold = int(np.searchsorted(below, n))  # the smallest d with count(distance <= d) >= n
    if below[threshold] > 4 * n:
        return np.argpartition(distances, n)[:n]
    return np.flatnonzero(distances <= threshold)


def query_code_words(vector: np.ndarray, words: int) -> np.ndarray:
    """The query's 1-bit code (``store.sign_bits``) as ``words`` uint64 words, zero-padded."""
    code = store.sign_bits(np.asarray(vector, dtype=np.float32))
    return np.frombuffer(code.ljust(words * 8, b"\0"), dtype="<u8")


# ---------------------------------------------------------------------------------------------
# Branches (executors)


@dataclass(frozen=True, slots=True)
class HammingCodes:
    """The 1-bit codes of the chunks one set of readers may see in one collection."""

    ids: np.ndarray  # (n,) int64 chunk ids
    words: np.ndarray  # (words per code, n) uint64, see hamming_distances


HAMMING_CACHE_ENTRIES = 8  # (collection, access-key set) pairs kept; 100k chunks of 384-d take 5.6 MB each


def read_hamming_codes(conn: store.Connection, collection_id: int, access_keys: Sequence[int]) -> HammingCodes:
    """Read the visible chunks' codes from SQLite (the access filter is in the query)."""
    rows = conn.execute(HAMMING_CODES_SQL, {"collection": collection_id, "access_keys": _keys_param(access_keys)})
    ids: list[int] = []
    codes: list[bytes] = []
    for chunk_id, code in rows:
        ids.append(chunk_id)
        codes.append(code)
    width = (max((len(c) for c in codes), default=8) + 7) // 8  # uint64 words per code
    packed = b"".join(c.ljust(width * 8, b"\0") for c in codes)
    words = np.frombuffer(packed, dtype="<u8").reshape(len(codes), width).T.copy()
    return HammingCodes(np.asarray(ids, dtype=np.int64), words)


def database_file(conn: store.Connection) -> str:
    """The file of the connection's main database ("" for an in-memory one): what the caches key on."""
    return next((r[2] for r in conn.execute("PRAGMA database_list") if r[1] == "main"), "")


class HammingCache:
    """The in-memory 1-bit codes of the "hamming" dense path, least recently used dropped first.

    Entries are keyed per database, collection, access keys and vector version. The version is
    bumped by triggers in the same transaction as any vector change, so another process's ingest
    is seen on the next search. An in-memory database is never cached. One cache is owned by each
    ``rag.resources.Resources``; thread-safe, because the app searches from several session threads.
    """

    def __init__(self, entries: int = HAMMING_CACHE_ENTRIES) -> None:
        self.entries = entries
        self._codes: OrderedDict[tuple[Any, ...], HammingCodes] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._codes)

    def codes(self, conn: store.Connection, collection_id: int, access_keys: Sequence[int]) -> HammingCodes:
        """``read_hamming_codes``, from memory while the collection's vectors are unchanged."""
        database = database_file(conn)
        if not database:
            return read_hamming_codes(conn, collection_id, access_keys)
        instance, version = conn.execute(HAMMING_STATE_SQL, {"collection": collection_id}).fetchone()
        key = (database, instance, collection_id, version, tuple(sorted(int(a) for a in access_keys)),
               HAMMING_CODES_SQL)
        with self._lock:
            found = self._codes.get(key)
            if found is not None:
                self._codes.move_to_end(key)
                return found
        codes = read_hamming_codes(conn, collection_id, access_keys)
        with self._lock:
            self._codes[key] = codes
            while len(self._codes) > self.entries:
                self._codes.popitem(last=False)
        return codes

    def clear(self) -> None:
        with self._lock:
            self._codes.clear()


# For callers that hold no Resources (rag.evaluate, rag.bench, the ask pipeline, library users):
# without it they would re-read every code on every search (the 100k-chunk fast path is ~6 ms
# with the codes in memory). Pass ``hamming_cache=resources.hamming_cache`` to use your own.
SHARED_HAMMING_CACHE = HammingCache()


def hamming_codes(
    conn: store.Connection, collection_id: int, access_keys: Sequence[int], cache: HammingCache | None = None
) -> HammingCodes:
    """The visible chunks' codes through ``cache`` (default ``SHARED_HAMMING_CACHE``)."""
    return (SHARED_HAMMING_CACHE if cache is None else cache).codes(conn, collection_id, access_keys)


def search_hamming(
    conn: store.Connection,
    vector: np.ndarray,
    *,
    collection_id: int,
    access_keys: Sequence[int],
    k: int,
    oversample: int = 8,
    cache: HammingCache | None = None,
) -> list[tuple[int, float]]:
    """Dense branch, "hamming" mode: the ``oversample * k`` visible chunks nearest by Hamming
    distance of their 1-bit codes (in memory, kept by ``cache``), ranked by exact float cosine
    distance in SQL."""
    codes = hamming_codes(conn, collection_id, access_keys, cache)
    if not len(codes.ids):
        return []
    distances = hamming_distances(codes.words, query_code_words(vector, codes.words.shape[0]))
    candidates = codes.ids[nearest_by_distance(distances, max(k, oversample * k))]
    params = {
        "query": store.serialize_vector(vector),
        "ids": json.dumps(candidates.tolist()),
        "collection": collection_id,
        "access_keys": _keys_param(access_keys),
        "k": k,
    }
    return [(int(r[0]), float(r[1])) for r in conn.execute(HAMMING_RESCORE_SQL, params)]


_WORD = re.compile(r"[^\W_]+")  # unicode61's token characters: letters and digits


def keyword_idf(n_docs: int, doc_freq: dict[str, int], keywords: Sequence[str]) -> dict[str, float]:
    """BM25's IDF per keyword: ``ln((N - df + 0.5) / (df + 0.5) + 1)`` (Robertson & Zaragoza 2009).

    A keyword of several words (``vpn-403``) takes the df of its rarest word, an upper bound on
    the phrase's own rarity. A keyword found in no chunk at all (a typo, an unknown word) is left
    out: no chunk can hold it, so it says nothing about which hit is better.
    """
    idf = {}
    for keyword in keywords:
        words = _WORD.findall(keyword) or [keyword]
        df = min(doc_freq.get(w, 0) for w in words)
        if df > 0:
            idf[keyword] = math.log((n_docs - df + 0.5) / (df + 0.5) + 1.0)
    return idf


def keyword_coverage(text: str, idf: dict[str, float]) -> float:
    """IDF-weighted share of the keywords that ``text`` (folded) holds as whole words or phrases.

    This is Lucene/Elasticsearch's ``minimum_should_match`` idea with IDF weights: a chunk that
    matches one common word of a six-word question is weak lexical evidence, however BM25 ranks it.
    """
    return keyword_coverages([text], idf)[0]


def keyword_coverages(texts: Sequence[str], idf: dict[str, float]) -> list[float]:
    """``keyword_coverage`` of each of ``texts``, the keywords' word sequences built once."""
    total = sum(idf.values())
    if total <= 0:
        return [0.0] * len(texts)
    needles = [(" " + " ".join(_WORD.findall(keyword)) + " ", w) for keyword, w in idf.items()]
    covered = []
    for text in texts:
        padded = " " + " ".join(_WORD.findall(text)) + " "
        covered.append(sum(w for needle, w in needles if needle in padded) / total)
    return covered


def query_idf(conn: store.Connection, keywords: Sequence[str]) -> dict[str, float]:
    """``keyword_idf`` of the query's keywords, from the fts5vocab document frequencies."""
    if store.is_postgres(conn):
        return _pg().query_idf(conn, keywords)
    doc_freq = term_docs(conn, sorted({w for k in keywords for w in _WORD.findall(k)}))
    return keyword_idf(SHARED_TERM_DOCS.chunk_count(conn), doc_freq, keywords)


def term_docs(conn: store.Connection, terms: Sequence[str]) -> dict[str, int]:
    """How many chunks of the database hold each folded term (absent: none); fts5vocab on SQLite,
    remembered while the database's chunks are unchanged (``TermDocsCache``)."""
    if store.is_postgres(conn):
        return _pg().term_docs(conn, terms)
    return SHARED_TERM_DOCS.term_docs(conn, terms)


def read_term_docs(conn: store.Connection, terms: Sequence[str]) -> dict[str, int]:
    """``term_docs`` read from fts5vocab (its 'row' table counts each term's documents)."""
    if not terms:
        return {}
    return {r[0]: int(r[1]) for r in conn.execute(TERM_DOCS_SQL, {"terms": json.dumps(list(terms))})}


# What the document frequencies depend on: the database file's random id and the sum of every
# collection's vector version. Each chunk is written and deleted with its vector, whose triggers bump
# that version, and a version row is never deleted, so the sum grows with every change of any chunk.
TERM_DOCS_STATE_SQL = """
SELECT (SELECT value FROM meta WHERE key = 'vector_index_id'),
       (SELECT coalesce(sum(version), 0) FROM vector_versions)
"""
TERM_DOCS_ENTRIES = 20_000  # terms remembered per database


class TermDocsCache:
    """fts5vocab document frequencies and the chunk count, remembered per database until its chunks change.

    A term's count costs a walk of its whole posting list (~0.5 ms for a common word at 100k
    chunks) and one search asks for the question's words up to three times (the spelling check,
    the keyword branch's IDF, the learned order), so the counts are kept in memory, least recently
    used dropped first, and dropped wholesale when the chunks change (``TERM_DOCS_STATE_SQL``, read
    on every call: another process's ingest is seen on the next search). An in-memory database is
    never cached. Thread-safe.
    """

    def __init__(self, entries: int = TERM_DOCS_ENTRIES) -> None:
        self.entries = entries
        self._state: dict[str, tuple[Any, ...]] = {}  # database file -> state of its counts below
        self._counts: dict[str, OrderedDict[str, int]] = {}  # database file -> term -> docs (0: none)
        self._chunks: dict[str, int] = {}  # database file -> its chunk count
        self._lock = threading.Lock()

    def _refresh(self, database: str, state: tuple[Any, ...]) -> None:
        """Forget a database's counts when its chunks changed (call with the lock held)."""
        if self._state.get(database) != state:
            self._state[database] = state
            self._counts[database] = OrderedDict()
            self._chunks.pop(database, None)

    def chunk_count(self, conn: store.Connection) -> int:
        """``CHUNK_COUNT_SQL``, from memory while the database's chunks are unchanged."""
        database = database_file(conn)
        if not database:
            return int(conn.execute(CHUNK_COUNT_SQL).fetchone()[0])
        state = tuple(conn.execute(TERM_DOCS_STATE_SQL).fetchone())
        with self._lock:
            self._refresh(database, state)
            if database in self._chunks:
                return self._chunks[database]
        count = int(conn.execute(CHUNK_COUNT_SQL).fetchone()[0])
        with self._lock:
            if self._state.get(database) == state:
                self._chunks[database] = count
        return count

    def term_docs(self, conn: store.Connection, terms: Sequence[str]) -> dict[str, int]:
        database = database_file(conn)
        if not database:
            return read_term_docs(conn, terms)
        state = tuple(conn.execute(TERM_DOCS_STATE_SQL).fetchone())
        with self._lock:
            self._refresh(database, state)
            counts = self._counts[database]
            missing = [t for t in dict.fromkeys(terms) if t not in counts]
        found = read_term_docs(conn, missing)
        with self._lock:
            if self._state.get(database) == state:
                for term in missing:
                    counts[term] = found.get(term, 0)
                for term in terms:
                    if term in counts:
                        counts.move_to_end(term)
                while len(counts) > self.entries:
                    counts.popitem(last=False)
            known = {t: counts.get(t, found.get(t, 0)) for t in terms}
        return {t: n for t, n in known.items() if n > 0}

    def clear(self) -> None:
        with self._lock:
            self._state.clear()
            self._counts.clear()
            self._chunks.clear()


SHARED_TERM_DOCS = TermDocsCache()


def question_spelling(
    conn: store.Connection, query: str, *, settings: Settings, groups: Sequence[str] = ("all",),
    collection: str | None = None,
) -> spelling.Spelling:
    """How ``search`` spells ``query`` for a reader holding ``groups`` (for ``rag search`` and the
    answer's trace to show it): ``mend_spelling`` when ``settings.spell_correct``, else as typed (also
    for a collection that does not exist: ``search`` itself says so)."""
    text = check_query(query)
    coll = store.get_collection(conn, collection or settings.collection)
    if not (settings.spell_correct or settings.decode_telex) or coll is None:
        return spelling.Spelling(text)
    return mend_spelling(conn, text, collection_id=coll.id, access_keys=store.visible_access_keys(conn, groups),
                         english=settings.spell_correct, telex=settings.decode_telex)


def mend_spelling(
    conn: store.Connection, text: str, *, collection_id: int, access_keys: Sequence[int], english: bool = True,
    telex: bool = True,
) -> spelling.Spelling:
    """``rag.spelling.mend_question`` over the database's vocabulary: a candidate is taken only when
    a chunk of this collection that the reader may see holds it (the vocabulary counts every chunk
    of every collection, so an unchecked correction could reveal a word of a restricted document).
    ``english`` mends misspelt English words (``spell_correct``), ``telex`` decodes a question typed
    in Telex or VNI (``decode_telex``)."""
    def visible(word: str) -> bool:
        return bool(search_fts(conn, quote_fts(fold(word)), collection_id=collection_id,
                               access_keys=access_keys, k=1))

    return spelling.mend_question(text, functools.partial(term_docs, conn), visible, english=english, telex=telex)


def rank_features(
    conn: store.Connection, text: str, hits: Sequence[Hit], idf: dict[str, float] | None = None
) -> np.ndarray:
    """``rag.ranker.rank_features`` of a fused list for ``text``: the keyword coverages come from the
    question's IDF weights (``query_idf``; pass ``idf`` when the search already read it), of each
    hit's content and of its title and section path."""
    if not hits:
        return ranker.rank_features([], [], [])
    idf = query_idf(conn, keywords(text)) if idf is None else idf
    ids = [h.chunk_id for h in hits]  # fold(content) as stored: folding 30 passages again costs ~3 ms
    bodies = (_pg().folded_bodies(conn, ids) if store.is_postgres(conn) else
              {int(r[0]): r[1] for r in conn.execute(FOLDED_BODY_SQL, {"ids": json.dumps(ids)})})
    coverage = keyword_coverages([bodies[h.chunk_id] if h.chunk_id in bodies else fold(h.content) for h in hits], idf)
    heading = keyword_coverages([_folded_heading(h.title, h.section) for h in hits], idf)
    return ranker.rank_features(hits, coverage, heading)


@functools.lru_cache(maxsize=4096)
def _folded_heading(title: str, section: str) -> str:
    """fold(title + section path): the hits of one question share a few documents, and so do questions."""
    return fold(f"{title} {section}")


def necessary_keywords(idf: dict[str, float], min_coverage: float) -> list[str]:
    """The keywords at least one of which a chunk must hold to reach ``min_coverage``.

    The most common keywords whose IDF weights together stay under ``min_coverage`` of the total
    cannot lift a chunk over the bar on their own, so a chunk holding none of the others fails
    the coverage filter whatever its bm25: the sparse branch need not match on them.
    """
    total = sum(idf.values())
    common = 0.0
    needed = []
    for keyword, weight in sorted(idf.items(), key=lambda kw: (kw[1], kw[0])):
        if common + weight < min_coverage * total:
            common += weight
        else:
            needed.append(keyword)
    return needed


def covered_fts_hits(
    conn: store.Connection, sparse: list[tuple[int, float]], keywords: Sequence[str], min_coverage: float,
    idf: dict[str, float] | None = None, floor_to_best: bool = False,
) -> list[tuple[int, float]]:
    """The FTS hits that hold at least ``min_coverage`` of the query's keyword weight, in order.

    ``floor_to_best``: when no hit holds that much, the bar drops to the best hit's coverage, so
    the best-covered hits still vote (``search`` sets it for Vietnamese typed without tones, whose
    one reliable reader is the keyword branch: a long toneless question whose best hit held 46 % of
    its keyword weight otherwise lost that hit, and the dense branch cannot read the question)."""
    if not sparse or min_coverage <= 0 or not keywords:
        return sparse
    idf = query_idf(conn, keywords) if idf is None else idf
    texts = (_pg().fts_texts(conn, [c for c, _ in sparse]) if store.is_postgres(conn) else
             {int(r[0]): r[1] for r in conn.execute(FTS_TEXT_SQL, {"ids": json.dumps([c for c, _ in sparse])})})
    coverage = dict(zip((cid for cid, _ in sparse), keyword_coverages([texts.get(cid, "") for cid, _ in sparse], idf),
                        strict=True))
    if floor_to_best:  # no hit reaches the bar: the best-covered ones still vote
        min_coverage = min(min_coverage, max(coverage.values()))
    return [(cid, score) for cid, score in sparse if coverage[cid] >= min_coverage]


def _pg() -> Any:
    """rag.pg_retrieval, the PostgreSQL executors (imported on a PostgreSQL connection only)."""
    from rag import pg_retrieval

    return pg_retrieval


def _keys_param(access_keys: Sequence[int]) -> str:
    return json.dumps([int(key) for key in access_keys])


def search_vectors(
    conn: store.Connection,
    vector: np.ndarray,
    *,
    collection_id: int,
    dimension: int,
    access_keys: Sequence[int],
    k: int,
    mode: str = "exact",
    oversample: int = 8,
    hamming_cache: HammingCache | None = None,
) -> list[tuple[int, float]]:
    """Dense branch: ``(chunk_id, cosine distance)`` for the ``k`` nearest visible chunks, nearest first.

    ``mode="binary"`` prefilters ``oversample * k`` candidates on vec0's 1-bit copy, then ranks them
    by exact float distance (the same distances as "exact", over a candidate subset);
    ``mode="hamming"`` does the same with the Hamming scan in memory (``search_hamming``), whose
    codes ``hamming_cache`` keeps (default ``SHARED_HAMMING_CACHE``).
    """
    if store.is_postgres(conn):  # pgvector: exact or HNSW by the visible share; `mode` is SQLite's
        return _pg().search_vectors(conn, vector, collection_id=collection_id, dimension=dimension,
                                    access_keys=access_keys, k=k)
    k = min(k, VEC0_K_MAX)
    if mode == "hamming":
        return search_hamming(conn, vector, collection_id=collection_id, access_keys=access_keys, k=k,
                              oversample=oversample, cache=hamming_cache)
    params = {
        "query": store.serialize_vector(vector),
        "k": k,
        "k_coarse": min(max(k, oversample * k), VEC0_K_MAX),
        "collection": collection_id,
        "access_keys": _keys_param(access_keys),
    }
    return [(int(r[0]), float(r[1])) for r in conn.execute(dense_sql(dimension, mode), params)]


def search_fts(
    conn: store.Connection,
    match: str,
    *,
    collection_id: int,
    access_keys: Sequence[int],
    k: int,
    weights: tuple[float, float] = (3.0, 1.0),
) -> list[tuple[int, float]]:
    """Sparse branch: ``(chunk_id, bm25)`` for the best ``k`` visible chunks (bm25 lower is better).

    ``match`` must come from ``build_fts_query`` (every token quoted); "" finds nothing.
    """
    if not match:
        return []
    if store.is_postgres(conn):
        return _pg().search_fts(conn, match, collection_id=collection_id, access_keys=access_keys, k=k,
                                weights=weights)
    params = {
        "match": match,
        "weight_heading": weights[0],
        "weight_body": weights[1],
        "collection": collection_id,
        "access_keys": _keys_param(access_keys),
        "k": k,
    }
    return [(int(r[0]), float(r[1])) for r in conn.execute(fts_sql(), params)]


def vector_distances(
    conn: store.Connection, vector: np.ndarray, dimension: int, chunk_ids: Sequence[int]
) -> dict[int, float]:
    """Cosine distance of each chunk's stored vector to ``vector`` (point lookups)."""
    if not chunk_ids:
        return {}
    if store.is_postgres(conn):
        return _pg().vector_distances(conn, vector, chunk_ids)
    params = {"query": store.serialize_vector(vector), "ids": json.dumps([int(i) for i in chunk_ids])}
    return {int(r[0]): float(r[1]) for r in conn.execute(distance_sql(dimension), params)}


def window_distances(conn: store.Connection, vector: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]:
    """Cosine distance of each chunk's nearest sentence window to ``vector`` (chunks without windows
    are left out)."""
    if not chunk_ids:
        return {}
    if store.is_postgres(conn):
        return _pg().window_distances(conn, vector, chunk_ids)
    params = {"query": store.serialize_vector(vector), "ids": json.dumps([int(i) for i in chunk_ids])}
    return {int(r[0]): float(r[1]) for r in conn.execute(WINDOW_DISTANCE_SQL, params)}


def rescore_by_windows(
    conn: store.Connection, vector: np.ndarray, dense: list[tuple[int, float]], weight: float
) -> tuple[list[tuple[int, float]], dict[int, float]]:
    """The dense branch's candidates reordered by ``window_rescore`` (unchanged when ``weight`` is 0
    or no candidate has windows), and the window distances it read (``window_distances``)."""
    if weight <= 0 or not dense:
        return dense, {}
    windows = window_distances(conn, vector, [cid for cid, _ in dense])
    return (window_rescore(dense, windows, weight) if windows else dense), windows


def hit_rows(
    conn: store.Connection, chunk_ids: Sequence[int], *, collection_id: int, access_keys: Sequence[int]
) -> dict[int, Any]:
    if not chunk_ids:
        return {}
    if store.is_postgres(conn):
        return _pg().hit_rows(conn, chunk_ids, collection_id=collection_id, access_keys=access_keys)
    params = {
        "ids": json.dumps([int(i) for i in chunk_ids]),
        "collection": collection_id,
        "access_keys": _keys_param(access_keys),
    }
    return {int(r["chunk_id"]): r for r in conn.execute(HIT_ROWS_SQL, params)}


# ---------------------------------------------------------------------------------------------
# Tones for a question typed without them


@dataclass(frozen=True, slots=True)
class ToneModel:
    """Word counts of toned text, for ``restore_tones``: a bigram model over written forms."""

    forms: dict[str, tuple[str, ...]]  # folded word -> its written forms (casefolded), most frequent first
    unigrams: dict[str, int]  # written form -> count
    bigrams: dict[tuple[str, str], int]  # (form, next form) -> count
    followed: dict[str, int]  # form -> count of bigrams it starts
    total: int  # word count


_LETTERS = re.compile(r"[^\W\d_]+")  # words for tones: letter runs (digits and codes are left alone)
TONE_FORMS = 8  # written forms kept per folded word (Vietnamese "ban": bạn, bản, bàn, bán, ...)


def tone_model(texts: Sequence[str]) -> ToneModel:
    """Count the words (NFC, casefolded) of ``texts`` and their adjacent pairs, and each folded word's forms."""
    unigrams: dict[str, int] = {}
    bigrams: dict[tuple[str, str], int] = {}
    by_key: dict[str, dict[str, int]] = {}
    for text in texts:
        previous = None
        for word in _LETTERS.findall(unicodedata.normalize("NFC", text).casefold()):
            unigrams[word] = unigrams.get(word, 0) + 1
            forms = by_key.setdefault(fold(word), {})
            forms[word] = forms.get(word, 0) + 1
            if previous is not None:
                bigrams[(previous, word)] = bigrams.get((previous, word), 0) + 1
            previous = word
    followed: dict[str, int] = {}
    for (first, _), n in bigrams.items():
        followed[first] = followed.get(first, 0) + n
    forms_by_key = {key: tuple(sorted(forms, key=lambda f: (-forms[f], f))[:TONE_FORMS])
                    for key, forms in by_key.items()}
    return ToneModel(forms_by_key, unigrams, bigrams, followed, sum(unigrams.values()))


def restore_tones(text: str, model: ToneModel) -> str:
    """``text`` with each word typed without diacritics replaced by its likeliest written form.

    The forms of a word are those its folded spelling has in the model's texts ("loi": lỗi, lời,
    lợi); the sequence chosen maximises the bigram probability (Viterbi), each bigram smoothed
    towards the unigram with a Dirichlet prior of mass 1: ``P(w | v) = (n(v, w) + P(w)) / (n(v) + 1)``,
    ``P(w) = (n(w) + 1/2) / (N + V/2)`` (MacKay & Peto, "A hierarchical Dirichlet language model",
    1995). Words with diacritics already, words the model does not know, digits and punctuation
    stay as typed; a restored word keeps the typed capitalisation of its first letter, or all caps.

    Written by hand: the packages that restore Vietnamese tones ship a language model of their own,
    while the words that matter here are the collection's (its names and terms), counted from it.
    """
    tokens = list(_LETTERS.finditer(text))
    if not tokens or not model.total:
        return text
    candidates = []
    for token in tokens:
        word = token.group(0).casefold()
        untoned = word == fold(word)
        candidates.append(model.forms.get(word, (word,)) if untoned else (word,))
    vocabulary = len(model.unigrams)

    def unigram(word: str) -> float:
        return (model.unigrams.get(word, 0) + 0.5) / (model.total + 0.5 * vocabulary)

    def bigram(previous: str, word: str) -> float:
        return (model.bigrams.get((previous, word), 0) + unigram(word)) / (model.followed.get(previous, 0) + 1.0)

    # Viterbi: per word, each form's best log-probability and the form before it on that best path
    layers: list[dict[str, tuple[float, str]]] = [{w: (math.log(unigram(w)), "") for w in candidates[0]}]
    for forms in candidates[1:]:
        last = layers[-1]
        layers.append({w: max((score + math.log(bigram(v, w)), v) for v, (score, _) in last.items()) for w in forms})
    path = [max(layers[-1], key=lambda w: (layers[-1][w][0], w))]
    for layer in reversed(layers[1:]):
        path.append(layer[path[-1]][1])
    path.reverse()
    out: list[str] = []
    end = 0
    for token, chosen in zip(tokens, path, strict=True):
        typed = token.group(0)
        if chosen != typed.casefold():
            chosen = chosen.upper() if typed.isupper() and len(typed) > 1 else (
                chosen[:1].upper() + chosen[1:] if typed[:1].isupper() else chosen)
        else:
            chosen = typed
        out += [text[end:token.start()], chosen]
        end = token.end()
    return "".join(out) + text[end:]


def toned_query(
    conn: store.Connection, text: str, *, collection_id: int, access_keys: Sequence[int], depth: int,
    weights: tuple[float, float] = (3.0, 1.0),
) -> str:
    """A question typed without tones, re-toned from the passages the keyword branch finds for it.

    The keyword branch folds tones on both sides, so it finds the passages of a toneless question
    (golden_vi: keywords R@4 0.89 on those queries) that the embedder misses (dense 0.68: it reads
    "loi" as no word at all). The text of its first ``depth`` visible hits gives each toneless word
    its forms in context (``tone_model``, ``restore_tones``); the dense branch embeds the result. The
    hits are read as the reader may see them, so no other document's words can shape the question.
    Unchanged when the keyword branch finds nothing.
    """
    found = search_fts(conn, build_fts_query(text), collection_id=collection_id, access_keys=access_keys, k=depth,
                       weights=weights)
    rows = hit_rows(conn, [cid for cid, _ in found], collection_id=collection_id, access_keys=access_keys)
    if not rows:
        return text
    return restore_tones(text, tone_model([rows[cid]["content"] for cid, _ in found if cid in rows]))


# ---------------------------------------------------------------------------------------------
# search()


# A question, not a document: past this the prompt cannot hold the question and its sources.
MAX_QUERY_CHARS = 4000
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_query(query: str) -> str:
    """The NFC, stripped question, or QueryError saying why it cannot be searched."""
    bad = _SURROGATE.search(query or "")
    if bad is not None:  # a lone surrogate: bytes that were not UTF-8 (a shell argument, a JSON "\ud800")
        raise QueryError(f"the question holds a character that is not valid text (at position {bad.start()}, "
                         "e.g. a byte that is not UTF-8): retype it or save the file as UTF-8")
    if len(query) > MAX_QUERY_CHARS:
        raise QueryError(f"the question is {len(query):,} characters long; ask in at most {MAX_QUERY_CHARS:,} "
                         "(to search a document's text, ingest the document instead)")
    text = unicodedata.normalize("NFC", query or "").strip()
    if not text:
        raise QueryError("the question is empty: type a few words to search for")
    if not keywords(text):
        raise QueryError(f"nothing to search for in {text[:80]!r}: the question needs at least one letter or digit")
    return text


def search(
    conn: store.Connection,
    query: str,
    *,
    embedder: Embedder,
    settings: Settings,
    groups: Sequence[str] = ("all",),
    collection: str | None = None,
    stage: str = "hybrid",
    k: int | None = None,
    reranker: Reranker | None = None,
    hamming_cache: HammingCache | None = None,
    translator: Translator | None = None,
) -> list[Hit]:
    """The best ``k`` chunks for ``query`` that a reader holding ``groups`` may see.

    Stages: "dense" (vectors only), "fts" (FTS5 bm25 only), "hybrid" (both, fused over each
    branch's top ``settings.candidates`` by ``settings.fusion``: ``fuse_convex`` or ``fuse_rrf``),
    "rerank" (hybrid, then ``reranker`` over the first ``settings.rerank_depth``; built from
    settings when None). ``hamming_cache`` keeps the 1-bit
    codes of the "hamming" dense mode (``Resources.hamming_cache``; default ``SHARED_HAMMING_CACHE``).
    Every hit keeps its ``dense_rank``/``sparse_rank`` (1-based, None when that branch did not
    return it), ``rrf_score`` (the fused score over the branches the stage used, convex or RRF; the
    name stays for the JSON of ``rag search``) and cosine ``distance``.

    An English question whose first dense passages include a Vietnamese one
    (``translation_target``) is also searched in Vietnamese when a ``translator`` is given and
    ``settings.translate_questions`` is on, in the same stage, and the two rankings are fused
    (``fuse_wordings``); the fts stage, which has no dense branch to tell the language, never is.

    Raises QueryError for an empty question or one without letters/digits, NotFoundError for
    an unknown collection, IndexMismatchError when ``embedder`` is not the collection's model.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)}")
    if store.is_postgres(conn) and not conn.reading:  # as the reader, under row-level security (rag.pg.reader)
        from rag import pg

        with pg.reader(conn, store.visible_access_keys(conn, groups)):
            return search(conn, query, embedder=embedder, settings=settings, groups=groups, collection=collection,
                          stage=stage, k=k, reranker=reranker, hamming_cache=hamming_cache, translator=translator)
    k = settings.top_k if k is None else k
    if k < 1:
        raise QueryError(f"k must be at least 1 (got {k})")
    text = check_query(query)
    coll = store.require_collection(conn, collection or settings.collection)
    store.check_embedder(coll, embedder.model_id, embedder.dimension)
    access_keys = store.visible_access_keys(conn, groups)
    if settings.spell_correct or settings.decode_telex:
        text = mend_spelling(conn, text, collection_id=coll.id, access_keys=access_keys,
                             english=settings.spell_correct, telex=settings.decode_telex).text
    wanted = max(k, settings.rerank_depth) if stage == "rerank" else k
    rank_model = ranker.load_rank_model(settings.rank_model) if stage in ("hybrid", "rerank") else None
    if rank_model is not None:  # the learned order reads its whole depth of fused hits
        wanted = max(wanted, rank_model.depth)
    wording = functools.partial(_search_wording, conn, coll=coll, access_keys=access_keys, embedder=embedder,
                                settings=settings, stage="hybrid" if stage == "rerank" else stage,
                                hamming_cache=hamming_cache)
    hits, target, vector, idf = wording(text, wanted=wanted)
    translated = None
    if target is not None and translator is not None and settings.translate_questions:
        translated = translator.translate(text, target)
    if translated is not None:  # both wordings to the depth of a branch, then fused
        depth = max(settings.candidates, wanted)
        first = wording(text, wanted=depth)[0] if depth > wanted else hits
        other = wording(translated, wanted=depth)[0]
        seen = {hit.chunk_id for hit in first}
        own = vector_distances(conn, vector, coll.dimension, [h.chunk_id for h in other if h.chunk_id not in seen])
        hits = fuse_wordings(first, other, settings.rrf_k, own)[:wanted]
    if rank_model is not None:
        depth = rank_model.depth
        features = rank_features(conn, text, hits[:depth], idf)
        hits = ranker.learned_order(hits[:depth], features, rank_model) + hits[depth:]
    if stage != "rerank":
        return hits[:k]
    return rerank_hits(text, hits, settings=settings, reranker=reranker, k=k)


def _search_wording(
    conn: store.Connection, text: str, *, coll: Collection, access_keys: Sequence[int], embedder: Embedder,
    settings: Settings, stage: str, wanted: int, hamming_cache: HammingCache | None,
) -> tuple[list[Hit], str | None, np.ndarray, dict[str, float] | None]:
    """One wording's first ``wanted`` hits (the body of ``search``), the language it should be
    searched in too (``translation_target``; None for the fts stage), its query vector and its
    keywords' IDF weights (None when the keyword branch did not need them)."""
    per_branch = max(settings.candidates, wanted)
    embedded = text
    asked = query_language(text)
    if settings.tone_restore_depth > 0 and asked == "vi-toneless":
        embedded = toned_query(conn, text, collection_id=coll.id, access_keys=access_keys,
                               depth=settings.tone_restore_depth, weights=(settings.weight_section,
                                                                            settings.weight_content))
    vector = np.asarray(embedder.embed_queries([embedded])[0], dtype=np.float32)

    dense: list[tuple[int, float]] = []
    sparse: list[tuple[int, float]] = []
    windows: dict[int, float] = {}
    idf: dict[str, float] | None = None
    if stage != "fts":
        dense = search_vectors(
            conn, vector, collection_id=coll.id, dimension=coll.dimension, access_keys=access_keys,
            k=per_branch, mode=settings.dense_mode,
            oversample=settings.hamming_oversample if settings.dense_mode == "hamming" else settings.binary_oversample,
            hamming_cache=hamming_cache,
        )
        dense, windows = rescore_by_windows(conn, vector, dense, settings.window_weight)
    if stage != "dense":
        match = build_fts_query(text)
        words = keywords(text)
        idf = query_idf(conn, words) if stage != "fts" and settings.fts_min_coverage > 0 else None
        if idf and settings.fts_necessary_only:
            match = " OR ".join(quote_fts(k) for k in necessary_keywords(idf, settings.fts_min_coverage)) or match
        sparse = search_fts(
            conn, match, collection_id=coll.id, access_keys=access_keys, k=per_branch,
            weights=(settings.weight_section, settings.weight_content),
        )
        if stage != "fts":  # in fusion, only hits holding most of the keyword weight may vote
            sparse = covered_fts_hits(conn, sparse, words, settings.fts_min_coverage, idf,
                                      floor_to_best=asked == "vi-toneless")
    rows: dict[int, Any] = {}
    weights = (1.0, 1.0)
    landed = asked
    if dense and asked != "vi-toneless":  # the language of the passages it lands on: the dense branch's first
        rows = hit_rows(conn, [cid for cid, _ in dense[:LANGUAGE_SAMPLE]], collection_id=coll.id,
                        access_keys=access_keys)
        landed = passage_language([row["content"] for row in rows.values()]) if rows else asked
    target = translation_target(asked, [row["content"] for row in rows.values()])
    shares = {"toneless_dense_share": settings.toneless_dense_share,
              "cross_language_dense_share": settings.cross_language_dense_share}
    convex = settings.fusion == "convex" and bool(dense) and bool(sparse)
    if dense and sparse and not convex:
        weights = branch_weights(asked, landed, **shares)
    weighted = [(branch, weight) for branch, weight in zip((dense, sparse), weights, strict=True) if branch]
    rankings = [[cid for cid, _ in branch] for branch, _ in weighted]
    distances = {cid: d for cid, d in dense}
    if convex:  # every candidate's similarity, its windows counted as in the dense branch's own order
        keyword_only = [cid for cid, _ in sparse if cid not in distances]
        distances.update(vector_distances(conn, vector, coll.dimension, keyword_only))
        if settings.window_weight > 0:
            windows.update(window_distances(conn, vector, keyword_only))
        similarity = {cid: 1.0 - windowed_distance(d, windows.get(cid), settings.window_weight)
                      for cid, d in distances.items()}
        scores = fuse_convex(similarity, dict(sparse),
                             dense_share(asked, landed, **shares, plain_dense_share=settings.convex_dense_share))
    else:
        scores = fuse_rrf(rankings, settings.rrf_k, [weight for _, weight in weighted])
    ordered = order_fused(scores, rankings)[:wanted]

    missing = [cid for cid in ordered if cid not in distances]
    distances.update(vector_distances(conn, vector, coll.dimension, missing))
    rows.update(hit_rows(conn, [cid for cid in ordered if cid not in rows], collection_id=coll.id,
                         access_keys=access_keys))
    dense_rank = {cid: rank for rank, (cid, _) in enumerate(dense, start=1)}
    sparse_rank = {cid: rank for rank, (cid, _) in enumerate(sparse, start=1)}
    bm25 = dict(sparse)
    hits = [
        Hit(
            chunk_id=cid,
            document_id=int(rows[cid]["document_id"]),
            source=rows[cid]["source"],
            title=rows[cid]["title"],
            section=rows[cid]["section"],
            content=rows[cid]["content"],
            char_from=int(rows[cid]["char_from"]),
            char_to=int(rows[cid]["char_to"]),
            page=rows[cid]["page"],
            distance=distances.get(cid, MISSING_DISTANCE),
            dense_rank=dense_rank.get(cid),
            sparse_rank=sparse_rank.get(cid),
            fts_score=bm25.get(cid),
            rrf_score=scores[cid],
        )
        for cid in ordered
        if cid in rows
    ]
    return hits, target, vector, idf


# ---------------------------------------------------------------------------------------------
# Channel audit: which text fields feed which ranking channel (seed 004: a field counted in three
# of four channels measures weight, not meaning).

AUDIT_FIELDS = ("title", "section path", "header", "content")
MAX_CHANNELS_PER_FIELD = 2
FEEDS_SHARE = 0.5  # a field feeds a channel when it is found there in at least half of the chunks

AUDIT_ROWS_SQL = """
SELECT k.id, k.section, k.text, k.content, k.fts_heading, k.fts_body, d.title
FROM chunks k
JOIN documents d ON d.id = k.document_id
WHERE k.collection_id = :collection
ORDER BY k.id
"""


@dataclass(frozen=True, slots=True)
class Channel:
    name: str
    description: str
    enabled: bool
    shares: dict[str, float] = field(default_factory=dict)  # field -> share of chunks it is found in
    fields: list[str] = field(default_factory=list)  # fields that feed it (share >= FEEDS_SHARE)


@dataclass(frozen=True, slots=True)
class ChannelAudit:
    collection: str
    chunks: int
    channels: list[Channel]
    feeds: dict[str, list[str]]  # field -> enabled channels it feeds
    flagged: list[str]  # fields feeding more than MAX_CHANNELS_PER_FIELD enabled channels


def _norm_audit(text: str) -> str:
    return " ".join(fold(text).split())


def chunk_fields(title: str, section: str, text: str, content: str) -> dict[str, str]:
    """The text fields of one chunk: title, section path (headings under the title), the
    contextual header (what the chunker put in ``text`` besides the content) and the content."""
    path = section
    for sep in (" > ", ">"):
        if title and section.startswith(title + sep):
            path = section[len(title) + len(sep) :]
            break
    else:
        if section == title:
            path = ""
    header = text.replace(content, "", 1).strip() if content and content in text else ""
    return {"title": title, "section path": path, "header": header, "content": content}


def fields_in(channel_text: str, fields: dict[str, str]) -> dict[str, bool]:
    """Which fields occur in a channel's text (folded, whitespace collapsed).

    The content is looked for first and removed, so that a title word that happens to occur in
    the body does not count as the title feeding a body channel.
    """
    haystack = _norm_audit(channel_text)
    content = _norm_audit(fields["content"])
    found = {"content": bool(content) and content in haystack}
    rest = haystack.replace(content, " ", 1) if found["content"] else haystack
    for name in AUDIT_FIELDS:
        if name != "content":
            value = _norm_audit(fields[name])
            found[name] = bool(value) and value in rest
    return found


def audit_channels(conn: store.Connection, settings: Settings, collection: str | None = None) -> ChannelAudit:
    """List every ranking channel and the text fields that feed it, measured on the stored chunks.

    Channels: the vector (``chunks.text`` is what was embedded), the two FTS5 columns (folded
    text), and the reranker input (counted when ``settings.rerank`` is not "none").
    """
    coll = store.require_collection(conn, collection or settings.collection)
    reranking = settings.rerank != "none"
    specs = [
        ("vector", "chunks.text, embedded by " + coll.embedder, True),
        ("fts_heading", f"FTS5 column 1, folded (bm25 weight {settings.weight_section:g})", True),
        ("fts_body", f"FTS5 column 2, folded (bm25 weight {settings.weight_content:g})", True),
        ("reranker input", f"rerank_text(hit) for the {settings.rerank!r} reranker", reranking),
    ]
    counts = {spec[0]: dict.fromkeys(AUDIT_FIELDS, 0) for spec in specs}
    present = dict.fromkeys(AUDIT_FIELDS, 0)
    total = 0
    for row in conn.execute(AUDIT_ROWS_SQL, {"collection": coll.id}):
        total += 1
        fields = chunk_fields(row["title"] or "", row["section"] or "", row["text"], row["content"])
        for name, value in fields.items():
            present[name] += bool(value.strip())
        hit_like = Hit(0, 0, "", row["title"] or "", row["section"] or "", row["content"], 0, 0, None, 0.0)
        texts = {
            "vector": row["text"],
            "fts_heading": row["fts_heading"],
            "fts_body": row["fts_body"],
            "reranker input": rerank_text(hit_like),
        }
        for channel, channel_text in texts.items():
            for name, found in fields_in(channel_text, fields).items():
                counts[channel][name] += found
    channels = []
    for name, description, enabled in specs:
        shares = {f: (counts[name][f] / present[f] if present[f] else 0.0) for f in AUDIT_FIELDS}
        fed = [f for f in AUDIT_FIELDS if present[f] and shares[f] >= FEEDS_SHARE]
        channels.append(Channel(name, description, enabled, shares, fed))
    feeds = {f: [c.name for c in channels if c.enabled and f in c.fields] for f in AUDIT_FIELDS}
    flagged = [f for f, names in feeds.items() if len(names) > MAX_CHANNELS_PER_FIELD]
    return ChannelAudit(coll.name, total, channels, feeds, flagged)
