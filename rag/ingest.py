"""Ingest: walk files -> extract -> chunk -> embed -> store, one transaction per document.

Idempotent: a document's ``content_hash`` covers its bytes, the embedding model id and the
pipeline version, so a second run over unchanged files embeds nothing. A file that cannot be
read is stored ``failed`` with its reason and every other file goes on.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from rag import chunking, registry, store
from rag.config import Settings
from rag.embedding import Embedder
from rag.errors import ExtractionError, RagError
from rag.extract import EXTRACTOR_VERSIONS, SUPPORTED_SUFFIXES, extract, extractor_for, holds_text
from rag.records import Chunk, Collection, DocumentInfo, Extracted
from rag.text import FOLD_VERSION, fold, nfc

log = logging.getLogger(__name__)

SKIPPED_NAMES = {".git", ".venv", "__pycache__", "node_modules", ".DS_Store"}


@dataclass(frozen=True, slots=True)
class FileResult:
    source: str
    status: str  # "ok" | "unchanged" | "groups" | "failed" | "pruned"
    chunks: int = 0
    truncated: int = 0
    error: str | None = None
    # "ok" for a file whose bytes did not change: an earlier chunker, extractor or embedding model
    # made the stored version (the document was stale, e.g. after an upgrade), so it was re-embedded.
    reprocessed: bool = False


@dataclass(frozen=True, slots=True)
class IngestReport:
    collection: str
    results: list[FileResult] = field(default_factory=list)
    seconds: float = 0.0
    embed_seconds: float = 0.0
    chunks_embedded: int = 0
    warnings: list[str] = field(default_factory=list)  # ignored or unmatched permission inputs
    skipped: dict[str, int] = field(default_factory=dict)  # files of no supported type, by extension

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def truncated(self) -> int:
        return sum(r.truncated for r in self.results)

    @property
    def failed(self) -> list[FileResult]:
        return [r for r in self.results if r.status == "failed"]

    def summary(self) -> str:
        rate = self.chunks_embedded / self.seconds if self.seconds else 0.0
        return (
            f"{len(self.results)} files: {self.count('ok')} indexed, {self.count('unchanged')} unchanged, "
            f"{self.count('groups')} permissions updated, {self.count('failed')} failed, "
            f"{self.count('pruned')} pruned; {self.chunks_embedded} chunks embedded "
            f"({self.truncated} truncated) in {self.seconds:.1f} s ({rate:.1f} chunks/s)"
            + self._why_reprocessed() + self._skipped()
        )

    def _skipped(self) -> str:
        """The files a folder holds that are no document type, so that "0 files" of a folder of
        .gz archives says why: "; 3 other files skipped (.gz 2, no extension 1)"."""
        if not self.skipped:
            return ""
        kinds = sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = ", ".join(f"{kind or 'no extension'} {n}" for kind, n in kinds[:4])
        more = ", …" if len(kinds) > 4 else ""
        return f"; {sum(self.skipped.values())} other files skipped ({shown}{more})"

    def _why_reprocessed(self) -> str:
        again = sum(r.reprocessed for r in self.results)
        if not again:
            return ""
        return (f"; {again} of the indexed files had not changed: an earlier chunker, extractor or embedding "
                "model made their stored passages (stale), so they were processed again")


ProgressFn = Callable[[int, int, int, str], None]  # (files done, files total, chunks embedded, source)


# ---------------------------------------------------------------------------------------------
# Versions


def chunk_budget(settings: Settings, embedder: Embedder) -> int:
    return settings.chunk_tokens or chunking.default_budget(embedder.max_tokens)


def pipeline_version(strategy: str, budget: int, windows: int = 0) -> str:
    """Everything after extraction that changes the stored chunks, their FTS text or their vectors
    (``windows``: ``settings.window_chars``; a document indexed without window vectors is stale)."""
    return f"chunker{chunking.CHUNKER_VERSION}/{strategy}/b{budget}/fold{FOLD_VERSION}" + (
        f"/w{windows}" if windows else "")


def is_stale(row: Any, current_pipeline: str) -> bool:
    """A committed document whose pipeline or extractor version is no longer current."""
    if row["status"] != "ok" or row["pipeline_version"] is None:
        return False
    current_extractor = EXTRACTOR_VERSIONS.get(row["extractor"] or "")
    return row["pipeline_version"] != current_pipeline or row["extractor_version"] != current_extractor


def content_hash(bytes_hash: str, embedder_id: str, pipeline: str, extractor: str) -> str:
    key = f"{bytes_hash}\n{embedder_id}\n{pipeline}\n{extractor}:{EXTRACTOR_VERSIONS.get(extractor, '?')}"
    return hashlib.sha256(key.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Access control rules


@dataclass(frozen=True, slots=True)
class AclRules:
    """``{"path, folder or glob": [groups]}``: an exact path wins, else the union of the folders
    and globs that match."""

    rules: dict[str, list[str]] = field(default_factory=dict)

    def groups_for(self, source: str) -> list[str] | None:
        if source in self.rules:
            return self.rules[source]
        matched: set[str] = set()
        for pattern, groups in self.rules.items():
            if _matches(pattern, source):
                matched.update(groups)
        return sorted(matched) or None

    def unmatched(self, sources: Iterable[str]) -> list[str]:
        """Keys that name no file of ``sources``: a typo there would leave a file public."""
        names = list(sources)
        return [key for key in self.rules if key not in names and not any(_matches(key, n) for n in names)]


def _matches(pattern: str, source: str) -> bool:
    """A glob matches as ``fnmatch`` or ``PurePosixPath.match`` does; any other key names a folder
    too ("hr" or "hr/": every file under it). Written for a folder, a key used to match nothing,
    and the folder's files were ingested public behind a warning."""
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(source, pattern) or PurePosixPath(source).match(pattern)
    folder = pattern.rstrip("/")
    return bool(folder) and source.startswith(folder + "/")


def _acl_key(key: str) -> str:
    """Source names are POSIX paths relative to the ingest root, in NFC: "./hr/a.md" and "hr\\a.md" mean "hr/a.md"."""
    key = nfc(key.strip().replace("\\", "/"))
    while key.startswith("./"):
        key = key[2:]
    return key


def load_acl(path: str | Path | None) -> AclRules:
    """Read an access map. Anything that could leave a document more public than meant is refused.

    Raises:
        RagError: unreadable file, not a JSON object of lists of group names, or an empty group
            list (write ``["all"]`` for a public document).
    """
    if path is None:
        return AclRules()
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RagError(f"cannot read the access map {path}: {e}") from e
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(g, str) for g in v) for k, v in raw.items()
    ):
        raise RagError(f"the access map {path} must be a JSON object {{\"path or glob\": [\"group\", ...]}}")
    rules: dict[str, list[str]] = {}
    for key, groups in raw.items():
        if not [g for g in groups if g.strip()]:
            raise RagError(f"the access map {path} gives {key!r} an empty group list: name its groups, "
                           'or write ["all"] to make it public')
        rules.setdefault(_acl_key(key), [])
        rules[_acl_key(key)] = store.normalize_groups([*rules[_acl_key(key)], *groups])
    return AclRules(rules)


# Front-matter keys that look like a misspelt ``groups:``; honouring none of them would make the
# document public, so they fail it with a hint instead. Compared folded (``fold``: no case, no
# tones), so the Vietnamese "nhóm" (groups) and "quyền" (permissions) count typed either way.
_GROUP_KEY_TYPOS = {"group", "acl", "access", "permissions", "allowed_groups", "nhom", "quyen", "quyen truy cap"}


def groups_for(source: str, acl: AclRules, metadata: dict[str, Any]) -> list[str]:
    """Groups from the access map, else front matter ``groups:``, else public.

    Raises:
        ExtractionError: front matter whose ``groups:`` is empty, not names, or misspelt.
    """
    from_acl = acl.groups_for(source)
    if from_acl:
        return store.normalize_groups(from_acl)
    keys = {str(k).lower(): k for k in metadata}
    if "groups" not in keys:
        typo = next((keys[k] for k in keys if fold(k) in _GROUP_KEY_TYPOS), None)
        if typo is not None:
            raise ExtractionError(f"the front matter has '{typo}:' but permissions are read from 'groups:'; "
                                  "rename it (e.g. 'groups: [hr]')")
        return [store.PUBLIC_GROUP]
    declared = metadata[keys["groups"]]
    if declared is None:
        declared = []
    if isinstance(declared, str | int):
        declared = [declared]
    if not isinstance(declared, list) or not all(isinstance(g, str | int) for g in declared):
        raise ExtractionError("the front matter's 'groups:' must be a list of group names (e.g. 'groups: [hr]')")
    if any(isinstance(g, bool) for g in declared):  # YAML reads yes/no/on/off/true/false as booleans
        raise ExtractionError("the front matter's 'groups:' holds true or false, not a group name "
                              "(YAML reads yes, no, on, off, true and false so): quote the name, "
                              "e.g. 'groups: [\"yes\"]'")
    # "groups: hr, finance" is one YAML string. A reader's groups are comma-separated (--groups,
    # citation links), so a name with a comma in it could never be held: split it as they are.
    names = [part.strip() for g in declared for part in str(g).split(",") if part.strip()]
    if not names:
        raise ExtractionError("the front matter's 'groups:' is empty: name the groups, or write 'groups: [all]' "
                              "to make the document public")
    return store.normalize_groups(names)


# ---------------------------------------------------------------------------------------------
# Discovery


@dataclass(frozen=True, slots=True)
class FoundFile:
    path: Path
    source: str  # relative to the ingest root, POSIX separators
    name_error: str | None = None  # why the file's name cannot be stored (it then fails alone)


def _printable(name: str) -> str:
    """A file name as text: bytes that are not UTF-8 (kept by Python as surrogates) become \\xNN."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _found(path: Path, source: str) -> FoundFile:
    shown = _printable(source)
    if shown == source:
        # Names are stored in NFC: macOS writes them decomposed (NFD), and the same notes copied
        # elsewhere, a name typed in `rag source` or an access-map key spell them composed.
        return FoundFile(path, nfc(source))
    return FoundFile(Path(_printable(str(path))), shown,
                     f"the file name {shown!r} is not valid UTF-8; rename the file (e.g. with `convmv`) and "
                     "ingest again")


def not_a_document(path: Path, shown: str) -> str | None:
    """Why ``path`` cannot be read as one document, or None for a regular file.

    Explicit paths only: a folder's walk skips what is not a regular file without a word.
    """
    if path.is_file():
        return None
    if path.is_dir():
        return f"{shown} is a folder"
    if not path.exists():
        return f"no such file: {shown}"
    mode = path.stat().st_mode
    kind = ("a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file")
    return f"{shown} is not a regular file ({kind})"


def check_roots(paths: Iterable[str | Path]) -> None:
    """Refuse a path to ingest that does not exist or is neither a file nor a folder; the CLI
    calls it before it creates the database, so a mistyped folder leaves no empty file behind.

    Raises:
        RagError: the first such path, with the reason.
    """
    for raw in paths:
        root = Path(raw).expanduser()
        if not root.exists():
            raise RagError(f"no such file or folder: {_printable(str(raw))}")
        if not root.is_file() and not root.is_dir():  # a named pipe, socket or device: its walk finds nothing
            raise RagError(f"{not_a_document(root, _printable(str(raw)))}: give a document or a folder of documents")


def discover(
    paths: Iterable[str | Path], unreadable: list[str] | None = None, skipped: Counter[str] | None = None
) -> list[FoundFile]:
    """Files under each path (a folder is walked; its supported files are taken).

    With one folder, a file's source name is its path relative to that folder. With several,
    it starts with the folder's own name (``rootA/index.md``, ``rootB/index.md``), so files of
    the same relative path in two folders are both kept.

    Args:
        unreadable: when given, gets one line per folder that could not be listed (no permission),
            whose files are then not found: ``ingest`` warns of them instead of saying nothing.
        skipped: when given, counts the files of a walked folder that are of no supported type, by
            their lower-cased extension ("" for none).

    Raises:
        RagError: a path does not exist or is neither a regular file nor a folder, or two paths would
            give two files the same source name.
    """
    paths = list(paths)
    check_roots(paths)
    roots = [Path(raw).expanduser() for raw in paths]
    several = len(roots) > 1
    found: dict[str, FoundFile] = {}
    for root in roots:
        if root.is_file():
            _add(found, _found(root.resolve(), root.name))
            continue
        prefix = f"{root.resolve().name}/" if several else ""
        for file in sorted(_walk(root, unreadable)):
            rel = file.relative_to(root)
            if file.is_file() and file.suffix.lower() in SUPPORTED_SUFFIXES:
                _add(found, _found(file.resolve(), prefix + rel.as_posix()))
            elif skipped is not None and file.is_file():
                skipped[file.suffix.lower()] += 1
    return sorted(found.values(), key=lambda f: f.source)


def _walk(root: Path, unreadable: list[str] | None) -> Iterator[Path]:
    """Every entry under ``root`` but hidden and ``SKIPPED_NAMES`` ones, as ``Path.rglob("*")``
    gives them (symlinked folders are listed, not entered); a folder that cannot be listed is
    reported to ``unreadable`` (``rglob`` passed over it without a word)."""

    def failed(error: OSError) -> None:
        if unreadable is not None:
            unreadable.append(f"{_printable(str(error.filename))} ({error.strerror or error})")

    for folder, folders, files in os.walk(root, onerror=failed):
        folders[:] = [name for name in folders if name not in SKIPPED_NAMES and not name.startswith(".")]
        for name in [*folders, *files]:
            if name not in SKIPPED_NAMES and not name.startswith("."):
                yield Path(folder) / name


def _add(found: dict[str, FoundFile], file: FoundFile) -> None:
    other = found.get(file.source)
    if other is not None and other.path != file.path and nfc(str(other.path)) == nfc(str(file.path)):
        raise RagError(f"two files in {file.path.parent} have the same name in two Unicode forms (composed, "
                       f"and decomposed as macOS writes it): {file.source!r}; delete or rename one of them")
    if other is not None and other.path != file.path:
        raise RagError(f"two files would both be stored as {file.source!r}: {other.path} and {file.path}; "
                       "ingest them in separate runs or collections (--collection), or rename one folder")
    found[file.source] = file


def save_uploads(files: Sequence[Any], folder: Path) -> tuple[list[Path], list[str]]:
    """Write uploaded files (objects with ``.name`` and ``.getvalue()``) into ``folder``, to ingest them.

    Returns the saved paths and one message per file that was refused (unsupported type, bad
    name). Names are reduced to their last component, so an upload cannot escape the folder, and
    composed (NFC), as document names are, so the same file uploaded from a Mac and from Windows
    is one file.
    """
    saved: list[Path] = []
    refused: list[str] = []
    for upload in files:
        name = nfc(Path(str(upload.name)).name)  # a Mac's browser sends it decomposed: one file per name
        if not name or name in {".", ".."}:
            refused.append(f"{upload.name!r}: not a usable file name")
            continue
        try:
            extractor_for(Path(name))
        except ExtractionError as e:
            refused.append(f"{name}: {e}")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_bytes(upload.getvalue())
        saved.append(path)
    return saved, refused


def ingest_roots(settings: Settings) -> list[Path]:
    """The folders the app may ingest from (``settings.ingest_roots``), resolved."""
    return [Path(part).expanduser().resolve() for part in settings.ingest_roots.split(os.pathsep) if part.strip()]


def check_ingest_root(raw: str, settings: Settings) -> Path:
    """``raw`` resolved, when it lies inside one of the allowed ingest roots (symlinks followed).

    Raises:
        RagError: folder ingest is off, or the path lies outside every allowed root.
    """
    roots = ingest_roots(settings)
    if not roots:
        raise RagError("ingesting a folder from the app is off (ingest_roots is empty): upload the files, or "
                       "set ingest_roots in rag.toml")
    path = Path(raw.strip()).expanduser().resolve()
    if not any(path == root or root in path.parents for root in roots):
        allowed = ", ".join(str(r) for r in roots)
        raise RagError(f"{path} is outside the folders the app may read ({allowed}); add its folder to "
                       "ingest_roots in rag.toml, or use `rag ingest` on the command line")
    return path


# ---------------------------------------------------------------------------------------------
# Processing one document


def prepare_chunks(
    doc: Extracted, strategy: str, budget: int, embedder: Embedder, batch: int = 32, window_chars: int = 0
) -> tuple[list[store.StoredChunk], float]:
    """Chunk and embed one extracted document (and, with ``window_chars``, the sentence windows of
    its longer chunks); returns the rows to store and embedding seconds."""
    chunks = chunking.chunk_document(
        doc, strategy=strategy, budget=budget, count_tokens=embedder.count_tokens, max_tokens=embedder.max_tokens
    )
    started = time.perf_counter()
    vectors = embed_chunks(embedder, chunks, batch)
    windows = embed_windows(embedder, chunks, window_chars, batch)
    elapsed = time.perf_counter() - started
    heading_prefix = doc.title
    rows = [
        store.StoredChunk(c, v, fold(c.section or heading_prefix), fold(c.content), w)
        for c, v, w in zip(chunks, vectors, windows, strict=True)
    ]
    return rows, elapsed


def embed_windows(
    embedder: Embedder, chunks: Sequence[Chunk], window_chars: int, batch: int = 32
) -> list[np.ndarray | None]:
    """Per chunk, the vectors of its sentence windows (``chunking.sentence_windows``), or None for a
    chunk that fits in one window; every window of the document is embedded in the same batches."""
    texts: list[str] = []
    counts: list[int] = []
    for chunk in chunks:
        spans = chunking.sentence_windows(chunk.content, window_chars)
        texts.extend(chunking.window_text(chunk, span) for span in spans)
        counts.append(len(spans))
    if not texts:
        return [None] * len(chunks)
    parts = [embedder.embed_passages(texts[i : i + batch]) for i in range(0, len(texts), batch)]
    vectors = np.vstack(parts).astype(np.float32)
    out: list[np.ndarray | None] = []
    at = 0
    for count in counts:
        out.append(vectors[at : at + count] if count else None)
        at += count
    return out


def embed_chunks(embedder: Embedder, chunks: Sequence[Chunk], batch: int = 32) -> np.ndarray:
    """Embed the chunks' ``text`` (header + content) in batches."""
    if not chunks:
        return np.zeros((0, embedder.dimension), dtype=np.float32)
    parts = [embedder.embed_passages([c.text for c in chunks[i : i + batch]]) for i in range(0, len(chunks), batch)]
    return np.vstack(parts).astype(np.float32)


def open_or_create_collection(
    conn: store.Connection, name: str, embedder: Embedder, strategy: str | None, default_strategy: str
) -> Collection:
    collection = store.get_collection(conn, name)
    if collection is None:  # stamped with its model's calibrated gate threshold (None: settings default)
        return store.create_collection(conn, name, embedder.model_id, embedder.dimension, strategy or default_strategy,
                                       max_distance=registry.calibrated_threshold(embedder.model_id))
    store.check_embedder(collection, embedder.model_id, embedder.dimension)
    if strategy and strategy != collection.strategy:
        conn.execute("UPDATE collections SET strategy = ? WHERE id = ?", (strategy, collection.id))
        collection = store.require_collection(conn, name)
    return collection


def ingest(
    conn: store.Connection,
    paths: Sequence[str | Path],
    *,
    settings: Settings,
    embedder: Embedder,
    collection: str | None = None,
    strategy: str | None = None,
    acl: AclRules | None = None,
    prune: bool = False,
    retry_failed: bool = False,
    on_progress: ProgressFn | None = None,
    writer: Sequence[str] | None = None,
    within: Sequence[Path] | None = None,
) -> IngestReport:
    """Bring a collection up to date with the files under ``paths``.

    Args:
        strategy: chunking strategy; ``None`` keeps the collection's own (``settings.strategy``
            for a new collection). Changing it re-processes every document.
        prune: delete documents whose files no longer exist.
        retry_failed: re-attempt documents that failed before even if their bytes are unchanged.
        writer: the groups of the person ingesting (team mode's editor on the Documents page);
            a file named like a stored document they may not read fails alone and leaves that
            document as it is, and prune spares such documents. None: the operator (every document).
        within: the folders files may be read from, links followed (the app's ``ingest_roots``): a
            file linked from inside a folder to a file outside them is not read, and is warned of.
            None: any (the command line).
    """
    if strategy is not None and strategy not in chunking.STRATEGIES:
        raise RagError(f"unknown strategy {strategy!r}; choose one of {', '.join(chunking.STRATEGIES)}")
    started = time.perf_counter()
    name = collection or settings.collection
    unreadable: list[str] = []
    skipped: Counter[str] = Counter()
    files = discover(paths, unreadable, skipped)
    outside: list[FoundFile] = []
    if within is not None:
        roots = [Path(root).resolve() for root in within]
        inside = [any(root == f.path or root in f.path.parents for root in roots) for f in files]
        outside = [f for f, ok in zip(files, inside, strict=True) if not ok]
        files = [f for f, ok in zip(files, inside, strict=True) if ok]
    coll = open_or_create_collection(conn, name, embedder, strategy, settings.strategy)
    stored = store.document_names(conn, coll.id)
    visible = None if writer is None else set(store.visible_access_keys(conn, writer))
    results, files = refuse_hidden(stored, files, visible)
    naming = name_warnings({source: path for source, (path, _key) in stored.items()}, files)
    found_results, embedded, embed_seconds = ingest_found(
        conn, coll, files, embedder=embedder, settings=settings, acl=acl or AclRules(), retry_failed=retry_failed,
        on_progress=on_progress,
    )
    results.extend(found_results)
    if prune:
        results.extend(prune_missing(conn, coll, writer))
    warnings = [f"the access map's key {key!r} matches no file under the ingested folders, so it applied "
                "to nothing (keys are paths relative to the folder, e.g. \"hr/salaries.md\", folders, e.g. \"hr/\", "
                "or globs)"
                for key in (acl or AclRules()).unmatched(f.source for f in files)]
    warnings += [f"the folder {folder} cannot be read, so no file in it was ingested (nor pruned): give read "
                 "access to it and ingest again" for folder in unreadable]
    warnings += [f"{f.source!r} links to {_printable(str(f.path))}, outside the folders the app may read "
                 "(ingest_roots), so it was not read" for f in outside]
    return IngestReport(name, results, time.perf_counter() - started, embed_seconds, embedded, naming + warnings,
                        dict(skipped))


def name_warnings(stored: Mapping[str, str], files: Sequence[FoundFile]) -> list[str]:
    """What a run does to documents stored from other files, said before it does it.

    A document is known by its name relative to the ingested folder (``discover``), so a second
    folder holding the same relative name replaces the first folder's document, and a folder
    ingested alone after it was ingested with others (``rootA/x.md``) stores its files again under
    their shorter names. Neither is refused: a moved folder (the old file gone) is the common case
    of the first, and keeping the old name would read the access map with the wrong keys.

    A file linked under a second name inside the folder (``alias.md -> a.md``) is read from one
    path under both names in every run: that is the folder's own layout, never warned about.

    Args:
        stored: the collection's documents, source name -> the path each was read from.
        files: this run's files.
    """
    names = {found.source for found in files}
    by_path: dict[str, str] = {}
    for source, path in sorted(stored.items()):
        if source not in names:  # stored under a name this run also gives: no second copy
            by_path.setdefault(path, source)
    warnings = []
    for found in files:
        path = str(found.path)
        old_path = stored.get(found.source)
        if old_path is not None and old_path != path and _is_file(old_path):
            warnings.append(f"{found.source!r} is now read from {path}; the document stored under that name came "
                            f"from {old_path}, which still exists and is no longer searched. To keep both, ingest "
                            "both folders in one run, or into separate collections (--collection)")
        other = by_path.get(path)
        if other is not None:
            warnings.append(f"{path} is already stored as {other!r} (ingested together with other folders) and is "
                            f"now stored as {found.source!r} too, so searches find it twice: ingest the same "
                            f"folders together again, or delete one (rag delete {other!r})")
    return warnings


def ingest_found(
    conn: store.Connection,
    coll: Collection,
    files: Sequence[FoundFile],
    *,
    embedder: Embedder,
    settings: Settings,
    acl: AclRules,
    retry_failed: bool,
    on_progress: ProgressFn | None = None,
) -> tuple[list[FileResult], int, float]:
    """Run ``ingest_file`` over ``files``: their results, chunks embedded and seconds spent embedding."""
    budget = chunk_budget(settings, embedder)
    pipeline = pipeline_version(coll.strategy, budget, settings.window_chars)
    results: list[FileResult] = []
    embedded = 0
    embed_seconds = 0.0
    if on_progress and files:  # the bar (and its clock) starts before the first file, however slow
        on_progress(0, len(files), 0, "")
    for index, found in enumerate(files):
        result, seconds = ingest_file(conn, coll, found, embedder, pipeline, budget, acl, retry_failed, settings)
        results.append(result)
        embedded += result.chunks if result.status == "ok" else 0
        embed_seconds += seconds
        if on_progress:
            on_progress(index + 1, len(files), embedded, found.source)
    return results, embedded, embed_seconds


def ingest_file(
    conn: store.Connection,
    coll: Collection,
    found: FoundFile,
    embedder: Embedder,
    pipeline: str,
    budget: int,
    acl: AclRules,
    retry_failed: bool,
    settings: Settings,
    data: bytes | None = None,
) -> tuple[FileResult, float]:
    """Process one file; never raises for a bad file (it is recorded as failed)."""
    source = found.source
    if found.name_error is not None:
        store.record_failure(conn, coll, source, str(found.path), None, "", "", found.name_error)
        return FileResult(source, "failed", error=found.name_error), 0.0
    # The permissions a failure can rely on: the access map's, else none (the old version, if
    # any, is then withheld from every reader until the file can be read again).
    known_groups = acl.groups_for(source)
    existing = store.find_document(conn, coll.id, source)
    # A new text file too long to index is refused before its bytes fill the memory; one indexed
    # before (under a higher limit, or none) is read, so that it stays as it is while unchanged.
    indexed = existing is not None and existing["status"] == "ok"
    too_long = None if data is not None or indexed else _too_long_to_read(found.path, settings.max_document_chars)
    if too_long is not None:
        store.record_failure(conn, coll, source, str(found.path), known_groups, "", "", too_long)
        return FileResult(source, "failed", error=too_long), 0.0
    try:
        data = found.path.read_bytes() if data is None else data
    except OSError as e:
        store.record_failure(conn, coll, source, str(found.path), known_groups, "", "",
                             f"cannot read the file: {e.strerror or e}")
        return FileResult(source, "failed", error=f"cannot read the file: {e.strerror or e}"), 0.0
    bytes_hash = hashlib.sha256(data).hexdigest()
    try:
        kind = extractor_for(found.path)
    except ExtractionError as e:
        return FileResult(source, "failed", error=str(e)), 0.0
    wanted_hash = content_hash(bytes_hash, embedder.model_id, pipeline, kind)
    if existing is not None and existing["content_hash"] == wanted_hash:
        if existing["status"] == "failed" and not retry_failed:
            return FileResult(source, "failed", error=existing["error"]), 0.0
        if existing["status"] == "ok" and not _junk(existing):
            if existing["path"] != str(found.path):  # same bytes from a moved folder: keep --prune honest
                store.set_document_path(conn, existing["id"], str(found.path))
            return _refresh_groups(conn, coll, existing, source, acl), 0.0
    try:
        doc = extract(found.path, data)
        if settings.max_document_chars and len(doc.text) > settings.max_document_chars:
            raise ExtractionError(f"the document holds {len(doc.text):,} characters, more than "
                                  f"max_document_chars = {settings.max_document_chars:,}: {_SPLIT_IT}")
        groups = groups_for(source, acl, doc.metadata)
        known_groups = groups
        rows, seconds = prepare_chunks(doc, coll.strategy, budget, embedder, settings.embed_batch,
                                       settings.window_chars)
        if not rows:
            raise ExtractionError("no text to index after front matter and markup")
    except Exception as e:  # one bad file must not stop the others; the reason is stored
        reason = str(e) if isinstance(e, ExtractionError) else f"{type(e).__name__}: {e}"
        if not isinstance(e, ExtractionError):
            log.exception("ingest of %s failed", source)
        if existing is not None and existing["status"] == "ok" and _junk(existing):
            store.delete_document(conn, existing["id"])  # its passages hold nothing: no old version to keep
        store.record_failure(conn, coll, source, str(found.path), known_groups, bytes_hash, wanted_hash, reason)
        return FileResult(source, "failed", error=reason), 0.0
    version = store.DocumentVersion(
        source=source, path=str(found.path), title=doc.title, groups=groups, content_hash=wanted_hash,
        bytes_hash=bytes_hash, canonical_text=doc.text, extractor=doc.extractor,
        extractor_version=doc.extractor_version, embedder=embedder.model_id, dimension=embedder.dimension,
        pipeline_version=pipeline,
    )
    store.replace_document(conn, coll, version, rows)
    again = existing is not None and existing["status"] == "ok" and existing["bytes_hash"] == bytes_hash
    return FileResult(source, "ok", len(rows), sum(r.chunk.truncated for r in rows), reprocessed=again), seconds


_SPLIT_IT = "split it, or raise the limit (max_document_chars in rag.toml, or RAG_MAX_DOCUMENT_CHARS)"


def _too_long_to_read(path: Path, limit: int) -> str | None:
    """Why a text file is refused unread: UTF-8 takes at most 4 bytes a character, so a Markdown, text
    or HTML file of more than 4 x ``limit`` bytes holds more than ``limit`` characters. Other formats
    (a PDF of scanned pages) can be large with little text: their text is measured once extracted."""
    if not limit or SUPPORTED_SUFFIXES.get(path.suffix.lower()) not in ("markdown", "text", "html"):
        return None
    try:
        size = path.stat().st_size
    except OSError:
        return None  # the read that follows says why
    if size <= 4 * limit:
        return None
    return f"the file is {size / 1e6:,.0f} MB of text, more than max_document_chars = {limit:,} allows: {_SPLIT_IT}"


def _junk(row: Any) -> bool:
    """A stored document whose text holds no letter or digit: indexed before ``holds_text`` refused
    such files (a zero-width space, a bare "# "). Its bytes are unchanged, so it is extracted again,
    fails with the reason, and its passages leave the index."""
    return row["canonical_text"] is not None and not holds_text(row["canonical_text"])


def _refresh_groups(conn: store.Connection, coll: Collection, row: Any, source: str, acl: AclRules) -> FileResult:
    """Unchanged bytes: only the permissions may have changed (no re-embedding needed)."""
    from rag.extract import split_front_matter

    metadata: dict[str, Any] = {}
    try:
        if row["extractor"] == "markdown" and row["canonical_text"]:
            metadata, _ = split_front_matter(row["canonical_text"])
        groups = groups_for(source, acl, metadata)
    except ExtractionError as e:  # stored before permissions were checked this strictly: fail closed
        store.record_failure(conn, coll, source, row["path"], acl.groups_for(source), row["bytes_hash"],
                             row["content_hash"], str(e))
        return FileResult(source, "failed", error=str(e))
    if groups != json.loads(row["groups"]):
        store.update_document_groups(conn, coll, row["id"], groups)
        return FileResult(source, "groups", row["chunk_count"])
    return FileResult(source, "unchanged", row["chunk_count"])


def refuse_hidden(
    stored: Mapping[str, tuple[str, int]], files: Sequence[FoundFile], visible: set[int] | None
) -> tuple[list[FileResult], list[FoundFile]]:
    """Split ``files`` into the failures of those named like a stored document the writer may not
    read (untouched: an editor's upload must not replace, nor make public, what hr alone may
    read) and the files to ingest. The reason says a document holds the name, not what it is.

    Args:
        stored: ``store.document_names`` of the collection.
        visible: the access keys the writer may read; None: the operator, who may write any.
    """
    if visible is None:
        return [], list(files)
    refused: list[FileResult] = []
    kept: list[FoundFile] = []
    for found in files:
        held = stored.get(found.source)
        if held is not None and held[1] not in visible:
            refused.append(FileResult(found.source, "failed", error=(
                "a document you may not read is stored under this name; rename the file, or ask an "
                "administrator")))
        else:
            kept.append(found)
    return refused, kept


def prune_missing(conn: store.Connection, coll: Collection, writer: Sequence[str] | None = None) -> list[FileResult]:
    """Delete the documents whose files no longer exist (with ``writer``, only those they may read)."""
    visible = None if writer is None else set(store.visible_access_keys(conn, writer))
    pruned = []
    for row in store.document_rows(conn, coll.name):
        if visible is not None and row["access_key"] not in visible:
            continue
        if _gone(row["path"]):
            store.delete_document(conn, row["id"])
            pruned.append(FileResult(row["source"], "pruned"))
    return pruned


def _gone(path: str | Path) -> bool:
    """Whether the file at ``path`` no longer exists. A file that cannot be looked at (a folder on
    its path is unreadable: ``Path.exists`` raises PermissionError) is not gone, so ``--prune``
    keeps its document; the ingest run that cannot read it fails it with the reason instead."""
    try:
        return not Path(path).exists()
    except OSError:
        return False


def _is_file(path: str | Path) -> bool:
    """``Path.is_file``, False for a file that cannot be looked at (see ``_gone``)."""
    try:
        return Path(path).is_file()
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# Status and reindex


def document_statuses(
    conn: store.Connection, settings: Settings, collection: str | None = None, groups: Sequence[str] | None = None,
) -> list[DocumentInfo]:
    """Every document with its status, error and stale flag; with ``groups``, only the documents a
    reader of those groups may see (None: every document, the operator's view)."""
    keys = None if groups is None else set(store.visible_access_keys(conn, groups))
    infos = []
    budgets: dict[str, str] = {}
    for row in store.document_rows(conn, collection):
        if keys is not None and row["access_key"] not in keys:
            continue
        name = row["collection"]
        if name not in budgets:
            coll = store.require_collection(conn, name)
            budgets[name] = _current_pipeline(settings, coll)
        infos.append(store.to_document_info(row, is_stale(row, budgets[name])))
    return infos


def retry_failed_documents(
    conn: store.Connection,
    *,
    settings: Settings,
    embedder: Embedder,
    collection: str,
    on_progress: ProgressFn | None = None,
    sources: Container[str] | None = None,
) -> IngestReport:
    """Re-attempt every failed document of a collection from its file, keeping its source name.

    ``rag ingest --retry-failed`` needs the original ingest root to rebuild source names; the
    page has only the stored rows, so this walks them (each file keeps its stored source and
    groups) through ``ingest_file``. ``sources``: only these documents (the ones a team-mode
    page lists to its user), so the report never names or counts the others.
    """
    started = time.perf_counter()
    coll = store.require_collection(conn, collection)
    store.check_embedder(coll, embedder.model_id, embedder.dimension)
    failed = [d for d in document_statuses(conn, settings, collection)
              if d.status == "failed" and (sources is None or d.source in sources)]
    results, embedded, seconds = ingest_found(
        conn, coll, [FoundFile(Path(d.path), d.source) for d in failed], embedder=embedder, settings=settings,
        acl=AclRules({d.source: d.groups for d in failed}), retry_failed=True, on_progress=on_progress,
    )
    return IngestReport(collection, results, time.perf_counter() - started, seconds, embedded)


def _current_pipeline(settings: Settings, coll: Collection) -> str:
    """The pipeline version new documents of this collection would get (no model load needed)."""
    budget = settings.chunk_tokens or chunking.default_budget(registry.encoder_window(coll.embedder))
    return pipeline_version(coll.strategy, budget, settings.window_chars)


def reindex(
    conn: store.Connection,
    *,
    settings: Settings,
    embedder: Embedder,
    collection: str | None = None,
    everything: bool = False,
    on_progress: ProgressFn | None = None,
    sources: Container[str] | None = None,
) -> IngestReport:
    """Re-process stale documents (or all, or every document under a new embedding model).

    With an embedder other than the collection's, every document is rebuilt from its stored
    canonical text into a fresh collection which then replaces the old one in one transaction.
    ``sources``: only these documents (the ones a team-mode page lists to its user), so the
    report never names or counts the others; not with another embedder (that rebuilds them all).
    """
    started = time.perf_counter()
    name = collection or settings.collection
    coll = store.require_collection(conn, name)
    switching = coll.embedder != embedder.model_id or coll.dimension != embedder.dimension
    if switching and sources is not None:
        raise ValueError("a reindex under another embedding model rebuilds every document: no sources")
    budget = chunk_budget(settings, embedder)
    pipeline = pipeline_version(coll.strategy, budget, settings.window_chars)
    target = coll
    if switching:
        staging = f"{name}__reindex"
        old_staging = store.get_collection(conn, staging)
        if old_staging is not None:
            _drop_collection(conn, old_staging)
        target = store.create_collection(conn, staging, embedder.model_id, embedder.dimension, coll.strategy,
                                         max_distance=registry.calibrated_threshold(embedder.model_id))
    rows = store.document_rows(conn, name)
    results: list[FileResult] = []
    embedded, embed_seconds = 0, 0.0
    if on_progress and rows:
        on_progress(0, len(rows), 0, "")
    for index, row in enumerate(rows):
        if not (everything or switching or is_stale(row, pipeline)) or (sources is not None
                                                                        and row["source"] not in sources):
            continue
        result, seconds = _reprocess(conn, target, row, embedder, pipeline, budget, settings)
        results.append(result)
        embedded += result.chunks if result.status == "ok" else 0
        embed_seconds += seconds
        if on_progress:
            on_progress(index + 1, len(rows), embedded, row["source"])
    if switching:
        with store.transaction(conn):
            _delete_collection_rows(conn, coll)
            conn.execute("DELETE FROM collections WHERE id = ?", (coll.id,))
            conn.execute("UPDATE collections SET name = ? WHERE id = ?", (name, target.id))
    return IngestReport(name, results, time.perf_counter() - started, embed_seconds, embedded)


def _reprocess(
    conn: store.Connection, coll: Collection, row: Any, embedder: Embedder, pipeline: str, budget: int,
    settings: Settings,
) -> tuple[FileResult, float]:
    path = Path(row["path"])
    extractor_current = row["extractor"] and row["extractor_version"] == EXTRACTOR_VERSIONS.get(row["extractor"])
    if row["status"] == "ok" and extractor_current and row["canonical_text"] is not None:
        from rag.extract import split_front_matter

        body_start = 0
        metadata: dict[str, Any] = {}
        if row["extractor"] == "markdown":
            try:
                metadata, body_start = split_front_matter(row["canonical_text"])
            except ExtractionError as e:  # stored before front matter was checked this strictly
                store.record_failure(conn, coll, row["source"], row["path"], None, row["bytes_hash"] or "",
                                     row["content_hash"] or "", str(e))
                return FileResult(row["source"], "failed", error=str(e)), 0.0
        pages = _stored_pages(conn, row) if row["extractor"] == "pdf" else ()
        doc = Extracted(row["canonical_text"], row["title"], row["extractor"], row["extractor_version"],
                        body_start, pages, metadata)
        try:
            rows, seconds = prepare_chunks(doc, coll.strategy, budget, embedder, settings.embed_batch,
                                           settings.window_chars)
        except Exception as e:
            log.exception("reindex of %s failed", row["source"])
            return FileResult(row["source"], "failed", error=f"{type(e).__name__}: {e}"), 0.0
        version = store.DocumentVersion(
            source=row["source"], path=row["path"], title=row["title"], groups=json.loads(row["groups"]),
            content_hash=content_hash(row["bytes_hash"], embedder.model_id, pipeline, row["extractor"]),
            bytes_hash=row["bytes_hash"], canonical_text=row["canonical_text"], extractor=row["extractor"],
            extractor_version=row["extractor_version"], embedder=embedder.model_id, dimension=embedder.dimension,
            pipeline_version=pipeline,
        )
        store.replace_document(conn, coll, version, rows)
        return FileResult(row["source"], "ok", len(rows), sum(r.chunk.truncated for r in rows)), seconds
    if _gone(path):
        reason = f"source file {path} is gone and the stored text cannot be re-extracted"
        store.record_failure(conn, coll, row["source"], row["path"], json.loads(row["groups"]) or None,
                             row["bytes_hash"] or "", row["content_hash"] or "", reason)
        return FileResult(row["source"], "failed", error=reason), 0.0
    found = FoundFile(path, row["source"])
    acl = AclRules({row["source"]: json.loads(row["groups"])})
    return ingest_file(conn, coll, found, embedder, pipeline, budget, acl, True, settings)


def _stored_pages(conn: store.Connection, row: Any) -> tuple[Any, ...]:
    """PDF page spans are recomputed by re-extraction; chunks keep their page numbers otherwise."""
    path = Path(row["path"])
    if not _gone(path):
        try:
            return extract(path).pages
        except ExtractionError:
            return ()
    return ()


def _drop_collection(conn: store.Connection, coll: Collection) -> None:
    with store.transaction(conn):
        _delete_collection_rows(conn, coll)
        conn.execute("DELETE FROM collections WHERE id = ?", (coll.id,))


def _delete_collection_rows(conn: store.Connection, coll: Collection) -> None:
    store.drop_collection_vectors(conn, coll)
    conn.execute("DELETE FROM documents WHERE collection_id = ?", (coll.id,))


def delete_documents(conn: store.Connection, document_ids: Sequence[int]) -> None:
    """Delete documents with their chunks, FTS rows and vectors (one transaction per document)."""
    for document_id in document_ids:
        store.delete_document(conn, document_id)


def delete_collection(conn: store.Connection, name: str) -> None:
    _drop_collection(conn, store.require_collection(conn, name))


def demo_is_current(conn: store.Connection, folder: Path, settings: Settings) -> bool:
    """True when every file under ``folder`` is indexed, ok, current and unchanged (no model needed)."""
    coll = store.get_collection(conn, settings.collection)
    if coll is None:
        return False
    pipeline = _current_pipeline(settings, coll)
    for found in discover([folder]):
        row = store.find_document(conn, coll.id, found.source)
        if row is None or row["status"] != "ok" or is_stale(row, pipeline):
            return False
        if row["bytes_hash"] != hashlib.sha256(found.path.read_bytes()).hexdigest():
            return False
    return True


@dataclass(frozen=True, slots=True)
class IndexHealth:
    documents: int
    chunks: int
    failed: int
    stale: int
    truncated: int
    collections: dict[str, str]  # name -> embedding model id


HEALTH_CHUNKS_SQL = """
SELECT chunks.access_key, count(*), coalesce(sum(chunks.truncated), 0) FROM chunks
JOIN collections ON collections.id = chunks.collection_id
WHERE :collection IS NULL OR collections.name = :collection
GROUP BY chunks.access_key
"""


def index_health(
    conn: store.Connection, settings: Settings, collection: str | None = None, groups: Sequence[str] | None = None,
) -> IndexHealth:
    """Counts for the dashboard frame: documents, chunks, failures, stale documents (of
    ``collection``, or of every collection when None), and every collection's model.

    ``groups``: count only what a reader of those groups may see (team mode's sidebar, so that the
    counts tell nobody how much is kept from them); None counts every document (the operator).
    """
    infos = document_statuses(conn, settings, collection, groups)
    keys = None if groups is None else set(store.visible_access_keys(conn, groups))
    per_key = [r for r in conn.execute(HEALTH_CHUNKS_SQL, {"collection": collection})
               if keys is None or r[0] in keys]
    return IndexHealth(
        documents=len(infos),
        chunks=sum(int(r[1]) for r in per_key),
        failed=sum(d.status == "failed" for d in infos),
        stale=sum(d.stale for d in infos),
        truncated=sum(int(r[2]) for r in per_key),
        collections={c.name: c.embedder for c in store.list_collections(conn)},
    )


# ---------------------------------------------------------------------------------------------
# Choosing the embedding model of a collection

# A mixed collection: this share of Vietnamese files makes "auto" pick the Vietnamese model even
# when the pooled letters stay under registry.AUTO_VIETNAMESE_SHARE (the demo guide: 3 Vietnamese
# pages of 15, 2.8 % of its letters).
VI_FILES_FOR_E5 = 0.1


@dataclass(frozen=True, slots=True)
class EmbedderChoice:
    embedder_id: str  # the registry id of the model to load (``rag.registry.load_embedder``)
    note: str | None  # a sentence for the user about the choice, if any


def _sample_texts(files: Sequence[FoundFile], limit_chars: int) -> list[str]:
    sample: list[str] = []
    size = 0
    for found in files:
        if size >= limit_chars:
            break
        try:
            text = extract(found.path).text
        except Exception:  # a file that cannot be read is left out of the sample; its own
            continue  # ingest then fails it alone, with the reason, and the run goes on
        sample.append(text[: limit_chars - size])
        size += len(sample[-1])
    return sample


def sample_vietnamese_share(files: Sequence[FoundFile], limit_chars: int = 200_000) -> float:
    """Share of distinctly Vietnamese letters over a sample of the files' text."""
    from rag.text import vietnamese_share

    return vietnamese_share("\n".join(_sample_texts(files, limit_chars)))


def sample_vietnamese_files(files: Sequence[FoundFile], limit_chars: int = 200_000) -> float:
    """Share of the sampled files that are Vietnamese (``registry.auto_language`` of their letters)."""
    from rag.text import vietnamese_share

    texts = _sample_texts(files, limit_chars)
    return sum(registry.auto_language(vietnamese_share(t)) == "vi" for t in texts) / len(texts) if texts else 0.0


def embedder_for_files(paths: Sequence[str | Path], requested: str) -> str:
    """The embedder id or name to build for ``paths`` outside any collection (strategy tables, the
    bench, the cut audit): ``auto`` picks by the files' language, anything else stays as asked."""
    if requested != "auto":
        return requested
    return registry.auto_embedder(sample_vietnamese_share(discover(paths))).id


def choose_embedder(
    conn: store.Connection, paths: Sequence[str | Path], *, requested: str | None, settings: Settings,
    collection: str | None = None,
) -> EmbedderChoice:
    """Which model to load for an ingest run.

    An existing collection keeps its own model (asking for another one is refused later, with a
    message naming `rag reindex`). A new collection takes ``requested`` (or ``settings.embedder``);
    ``auto`` picks by the files' language (``rag.registry.auto_embedder``: multilingual-e5-small
    for Vietnamese, all-MiniLM-L6-v2 otherwise; a mixed corpus, ``VI_FILES_FOR_E5`` of its files
    Vietnamese, counts as Vietnamese), and a model trained for English only gets a warning when
    the files look Vietnamese.

    Raises:
        ModelLoadError: an unknown model name (the message lists the valid ones).
    """
    existing = store.get_collection(conn, collection or settings.collection)
    if existing is not None and requested in (None, "auto"):
        return EmbedderChoice(existing.embedder, None)
    name = requested or settings.embedder
    info = None if name == "auto" else registry.resolve(registry.EMBEDDER, name)
    if info is not None and (existing is not None or not info.languages or info.covers("vi")):
        return EmbedderChoice(info.id, None)  # nothing to sample: no warning could follow
    found = discover(paths)
    share = sample_vietnamese_share(found)
    if info is None:
        files = sample_vietnamese_files(found) if registry.auto_language(share) != "vi" else 1.0
        if registry.auto_language(share) != "vi" and files >= VI_FILES_FOR_E5:
            picked = registry.embedder_for_language("vi")
            return EmbedderChoice(picked.id, f"embedder auto: {files:.0%} of the files are Vietnamese (a mixed "
                                             f"corpus; mixed from {VI_FILES_FOR_E5:.0%}), so the new collection "
                                             f"uses {picked.id}; it keeps this model")
        picked = registry.auto_embedder(share)
        language = "Vietnamese" if registry.auto_language(share) == "vi" else "not Vietnamese"
        return EmbedderChoice(picked.id, f"embedder auto: {share:.0%} of the letters are Vietnamese ({language}; "
                                         f"Vietnamese from {registry.AUTO_VIETNAMESE_SHARE:.0%}), so the new "
                                         f"collection uses {picked.id}; it keeps "
                                         "this model")
    if registry.auto_language(share) == "vi":
        trained = "an English model" if info.languages == ("en",) else f"a model for {', '.join(info.languages)}"
        return EmbedderChoice(info.id, f"these files look Vietnamese ({share:.0%} Vietnamese letters): "
                                       f"{info.name or info.id} is {trained}; consider --embedder "
                                       f"{registry.embedder_for_language('vi').label}")
    return EmbedderChoice(info.id, None)
