"""Extraction: canonical text, titles, front matter, HTML, PDF pages and broken inputs."""

from __future__ import annotations

import io
import unicodedata
from pathlib import Path

import pytest

from rag.errors import ExtractionError
from rag.extract import extract


def make_pdf(pages: list[str], password: str | None = None) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        if text:
            pdf.multi_cell(0, 10, text)
    data = bytes(pdf.output())
    if password is None:
        return data
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    for page in PdfReader(io.BytesIO(data)).pages:
        writer.add_page(page)
    writer.encrypt(password)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_markdown_front_matter_title_and_body_start() -> None:
    raw = "---\ntitle: Leave policy\ngroups: [hr]\n---\n\n## Annual leave\r\n\r\nTwenty days.\r\n"
    doc = extract(Path("leave.md"), raw.encode())
    assert doc.title == "Leave policy"
    assert doc.metadata["groups"] == ["hr"]
    assert "\r" not in doc.text
    assert doc.text[doc.body_start :].lstrip().startswith("## Annual leave")


def test_markdown_title_falls_back_to_h1_then_file_name() -> None:
    assert extract(Path("x.md"), b"# Real title\n\nBody.").title == "Real title"
    assert extract(Path("my-notes_file.md"), b"Body only.").title == "My notes file"


def test_nfd_input_becomes_nfc() -> None:
    nfd = unicodedata.normalize("NFD", "Lỗi xử lý đường truyền")
    doc = extract(Path("vi.txt"), nfd.encode())
    assert doc.text == "Lỗi xử lý đường truyền" and unicodedata.is_normalized("NFC", doc.text)


def test_html_becomes_markdown_like_blocks() -> None:
    html = b"""<html><head><title>T</title><style>p{}</style></head><body>
    <h1>Top</h1><p>First <b>bold</b> para.</p><ul><li>one</li><li>two</li></ul>
    <h2>Sub</h2><pre>code line</pre><script>alert(1)</script></body></html>"""
    doc = extract(Path("p.html"), html)
    assert doc.title == "T"
    assert "# Top" in doc.text and "## Sub" in doc.text and "- one" in doc.text
    assert "First bold para." in doc.text and "alert" not in doc.text and "p{}" not in doc.text
    assert "```\ncode line\n```" in doc.text


def test_pdf_keeps_page_spans() -> None:
    doc = extract(Path("two.pdf"), make_pdf(["Alpha page text.", "Beta page text."]))
    assert [p.page for p in doc.pages] == [1, 2]
    assert "Alpha" in doc.text[doc.pages[0].char_from : doc.pages[0].char_to]
    assert "Beta" in doc.text[doc.pages[1].char_from : doc.pages[1].char_to]


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("empty.md", b"", "empty"),
        ("latin.txt", "café".encode("latin-1"), "not UTF-8"),
        ("junk.pdf", b"%PDF-1.7 garbage", "PDF"),
        ("scan.pdf", None, "no extractable text"),
        ("locked.pdf", "locked", "password"),
        ("image.png", b"\x89PNG", "unsupported file type"),
    ],
)
def test_broken_inputs_raise_a_clear_reason(name: str, data: bytes | str | None, reason: str) -> None:
    if data is None:
        data = make_pdf([""])
    elif data == "locked":
        data = make_pdf(["secret"], password="pw")
    assert isinstance(data, bytes)
    with pytest.raises(ExtractionError, match=reason):
        extract(Path(name), data)
