"""Extract canonical text (NFC, LF) from Markdown, plain text, HTML, PDF, Word (.docx) and
OpenDocument (.odt) files.

Every chunk offset and citation locator refers to the canonical text this module returns,
which is stored in the database, so a citation can always be resolved to the exact passage.
"""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from rag.errors import ExtractionError
from rag.records import Extracted, PageSpan
from rag.text import nfc

SUPPORTED_SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".txt": "text", ".html": "html",
                      ".htm": "html", ".pdf": "pdf", ".docx": "docx", ".odt": "odt"}
EXTRACTOR_VERSIONS = {"markdown": "1", "text": "1", "html": "2", "pdf": "1", "docx": "2", "odt": "2"}
# Extractors whose text is Markdown (written, or converted to it: "#" headings, "- " items, pipe
# tables), so that chunking splits it by its Markdown blocks rather than as plain text.
MARKDOWN_EXTRACTORS = frozenset({"markdown", "html", "docx", "odt"})

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?\n)?(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)
# "---" on line 1 followed by YAML-looking "key:" lines and no closing "---": broken front matter.
_UNCLOSED_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(?:[ \t]*\n)*[A-Za-z_][\w-]*[ \t]*:")
_ATX_H1 = re.compile(r"^#[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


def extractor_for(path: Path) -> str:
    """The extractor name for a file, or ExtractionError naming the supported types."""
    kind = SUPPORTED_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ExtractionError(
            f"unsupported file type {path.suffix or '(no extension)'!r}; supported: "
            + ", ".join(sorted(SUPPORTED_SUFFIXES))
        )
    return kind


def decode_text(data: bytes) -> str:
    """UTF-8 (BOM allowed) or UTF-16 (with a BOM, or recognised by its NUL bytes); anything else
    fails with the exact position. Text that still holds NUL characters is refused: it would be
    stored as NUL-interleaved text that no search can ever find."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError as e:
            raise ExtractionError(f"invalid UTF-16 text at byte {e.start}") from e
        return _without_nul(text)
    bomless = _utf16_without_bom(data)
    if bomless is not None:
        return _without_nul(bomless)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ExtractionError(
            f"not UTF-8 text: invalid byte 0x{data[e.start]:02x} at offset {e.start}; re-save the file as UTF-8"
        ) from e
    return _without_nul(text)


def _utf16_without_bom(data: bytes) -> str | None:
    """UTF-16 text without a byte-order mark, told apart by its NUL bytes: Latin and Vietnamese
    text in UTF-16 has a zero in (nearly) every other byte, in the high byte of each unit."""
    sample = data[:4096]
    if len(sample) < 4 or len(sample) % 2:
        return None
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    units = len(sample) // 2
    for zeros, encoding in ((odd, "utf-16-le"), (even, "utf-16-be")):
        if zeros >= 0.3 * units and (odd if encoding == "utf-16-be" else even) <= 0.02 * units:
            try:
                return data.decode(encoding)
            except UnicodeDecodeError:
                return None
    return None


def _without_nul(text: str) -> str:
    position = text.find("\x00")
    if position >= 0:
        raise ExtractionError(f"the file holds NUL characters (first at character {position}): it is binary, or "
                              "text in an encoding other than UTF-8/UTF-16; re-save it as UTF-8")
    return text


# A UTF-16 surrogate alone, not a character: pypdf decodes a font's ToUnicode map with
# "surrogatepass", so one glyph mapped to <D800> put one in a page's text. No tokenizer takes it
# ("TextInputSequence must be str") and SQLite cannot store it, so the whole PDF failed. A glyph
# mapped to <0000> put a NUL there, which PostgreSQL refuses in text (the run stopped there) and
# no search finds (text files holding one are refused as binary: ``decode_text``). YAML reads the
# escapes "\ud800" and "\0" as either in a front-matter title.
_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")


def canonical(text: str) -> str:
    """NFC with LF line endings: the one form every offset refers to. A lone surrogate or a NUL
    becomes U+FFFD, the replacement character, as a decoder's ``errors="replace"`` would make it."""
    return nfc(_NOT_TEXT.sub("\ufffd", text.replace("\r\n", "\n").replace("\r", "\n")))


def holds_text(text: str) -> bool:
    """Whether ``text`` holds anything to index: at least one letter or digit (``str.isalnum``).

    Whitespace, zero-width and other format characters (U+200B, a byte-order mark U+FEFF read as
    text, joiners), punctuation and bare Markdown markup ("# ", "---") are none: indexed alone
    they become passages no question can find and no citation can show. "42" or one word is text.
    """
    return any(ch.isalnum() for ch in text)


def _require_text(text: str) -> None:
    if not holds_text(text):
        raise ExtractionError("the file holds no text (empty, or only whitespace, invisible characters or "
                              "markup without a letter or digit)")


def _title_from_stem(path: Path) -> str:
    """The file name made a title: "leave-policy.md" -> "Leave policy"; a newline or tab in the name
    is a space, as no title shows one."""
    return re.sub(r"[-_\s]+", " ", path.stem).strip().capitalize() or path.name


def split_front_matter(text: str) -> tuple[dict[str, Any], int]:
    """Parse YAML front matter; return (metadata, offset where the body starts).

    Front matter carries a document's permissions (``groups:``), so front matter that cannot be
    read is an error, never "no front matter": ignoring it would make a restricted document public.

    Raises:
        ExtractionError: the YAML is malformed, is not ``key: value`` pairs, or is never closed.
    """
    match = _FRONT_MATTER.match(text)
    if not match:
        if _UNCLOSED_FRONT_MATTER.match(text):
            raise ExtractionError(
                "the front matter opened by '---' on line 1 is never closed (add a '---' line after it); "
                "its permissions cannot be read"
            )
        return {}, 0
    try:
        loaded = yaml.safe_load(match.group(1) or "")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 2})" if mark is not None else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise ExtractionError(
            f"the front matter is not valid YAML{where}: {problem}; fix it — the document's permissions "
            "cannot be read, so it is not indexed"
        ) from e
    if loaded is None:
        return {}, match.end()
    if not isinstance(loaded, dict):
        raise ExtractionError("the front matter must be 'key: value' lines (e.g. 'groups: [hr]')")
    return loaded, match.end()


def extract_markdown(path: Path, data: bytes) -> Extracted:
    text = canonical(decode_text(data))
    _require_text(text)
    metadata, body_start = split_front_matter(text)
    _require_text(text[body_start:])
    # YAML reads the escape "\ud800" as a lone surrogate: such a title could not be stored, and
    # stopped the whole run ("surrogates not allowed")
    title = _NOT_TEXT.sub("\ufffd", str(metadata.get("title") or "")).strip()
    if not title:
        h1 = _ATX_H1.search(text, body_start)
        title = h1.group(1).strip() if h1 else _title_from_stem(path)
    return Extracted(text, nfc(title), "markdown", EXTRACTOR_VERSIONS["markdown"], body_start, (), metadata)


def extract_plain(path: Path, data: bytes) -> Extracted:
    text = canonical(decode_text(data))
    _require_text(text)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    title = first if len(first) <= 100 and not first.endswith((".", ":", ";")) else _title_from_stem(path)
    return Extracted(text, title, "text", EXTRACTOR_VERSIONS["text"])


_INLINE_TAGS = {"a", "abbr", "b", "bdi", "bdo", "cite", "code", "data", "dfn", "em", "i", "img", "kbd", "label",
                "mark", "q", "s", "samp", "small", "span", "strong", "sub", "sup", "time", "u", "var", "wbr"}


# Page chrome, not content: site navigation, search boxes, sidebars, page headers and footers
# (HTML5 sectioning elements and their ARIA roles), and Sphinx's "¶" heading anchors. Python's
# HTML docs put a table of contents listing every function of the page, "Previous topic" and
# "Navigation" around each page; LibreOffice's help a "LibreOffice 7.4 Help · Module · Contents ·
# Index" header and a "Help content debug info" footer: each became a chunk of its own that
# matched questions by its names. A <header> inside <main> or <article> holds the article's own
# title and is kept.
_CHROME_TAGS = ("nav", "aside", "footer", "form")
_CHROME_ROLES = ("navigation", "search", "banner", "contentinfo", "complementary")
_CHROME_CLASSES = ("headerlink",)


def _page_chrome(root: Any) -> list[Any]:
    """The elements under ``root`` that are page chrome (``_CHROME_*``), outermost only."""
    found = [*root.find_all(_CHROME_TAGS), *root.find_all(attrs={"role": list(_CHROME_ROLES)}),
             *root.find_all(class_=list(_CHROME_CLASSES))]
    found += [h for h in root.find_all("header") if h.find_parent(["main", "article"]) is None
              and h.find_parent(attrs={"role": "main"}) is None]
    unique = list({id(tag): tag for tag in found}.values())  # a <nav role="navigation"> is found twice
    ids = {id(tag) for tag in unique}
    return [tag for tag in unique if not any(id(parent) in ids for parent in tag.parents)]


def _html_text(data: bytes) -> str:
    """An HTML page's text: UTF-8 or UTF-16 as any text file, else the encoding the page declares
    (``<meta charset="iso-8859-1">``, or the http-equiv Content-Type), as a browser reads it. Old
    manuals are often Latin-1 or Windows-1258 and say so; only a page that declares nothing, or
    declares what its bytes are not, is refused."""
    from bs4.dammit import EncodingDetector

    try:
        return decode_text(data)
    except ExtractionError as error:
        declared = EncodingDetector.find_declared_encoding(data, is_html=True, search_entire_document=False)
        if not declared or declared.lower().replace("_", "-") in ("utf-8", "utf8"):
            raise
        try:
            return _without_nul(data.decode(declared))
        except (LookupError, UnicodeDecodeError):
            raise ExtractionError(f"{error}; the page declares {declared!r}, which does not decode it "
                                  "either") from error


def extract_html(path: Path, data: bytes) -> Extracted:
    """HTML -> Markdown-like text (headings as '#', list items as '- ', blocks split by blank lines).

    BeautifulSoup does the parsing; the result goes through the same block model as Markdown.
    Runs of inline content become one line; every other element is a block.
    """
    from bs4 import BeautifulSoup, Comment, Declaration, Doctype, NavigableString, ProcessingInstruction, Tag

    soup = BeautifulSoup(_html_text(data), "html.parser")
    title_tag = soup.find("title")
    title = title_tag.get_text(" ", strip=True) if title_tag else ""
    for dead in soup(["script", "style", "noscript", "template", "head"]):
        dead.decompose()
    root: Tag = soup
    main = soup.find("main") or soup.find(True, attrs={"role": "main"})
    if isinstance(main, Tag):  # the page says where its content is: only that
        root = main
    for chrome in _page_chrome(root):
        chrome.decompose()
    lines: list[str] = []

    def squash(text: str) -> str:
        return re.sub(r"\s+", " ", text).strip()

    def walk(node: Tag) -> None:
        run: list[str] = []

        def flush() -> None:
            text = squash(" ".join(run))
            if text:
                lines.append(text)
            run.clear()

        for child in node.children:
            if isinstance(child, (Comment, Declaration, Doctype, ProcessingInstruction)):
                continue  # markup about the page ("<!DOCTYPE html>" read as the text "html"), not text
            if isinstance(child, NavigableString):
                run.append(str(child))
                continue
            if not isinstance(child, Tag):
                continue
            name = child.name.lower()
            if name in _INLINE_TAGS:
                run.append(child.get_text(" "))
                continue
            flush()
            if re.fullmatch(r"h[1-6]", name):
                lines.extend(["", "#" * int(name[1]) + " " + squash(child.get_text(" ")), ""])
            elif name == "li":
                lines.append("- " + squash(child.get_text(" ")))
            elif name == "pre":
                lines.extend(["", "```", child.get_text().strip("\n"), "```", ""])
            elif name == "tr":
                cells = [squash(c.get_text(" ")) for c in child.find_all(["td", "th"], recursive=False)]
                lines.append("| " + " | ".join(cells) + " |")
                if child.find("th", recursive=False) is not None and not child.find("td", recursive=False):
                    lines.append("|" + " --- |" * len(cells))  # a header row: make it a Markdown table
            elif name == "br":
                continue
            else:
                lines.append("")
                walk(child)
                lines.append("")
        flush()

    walk(root)
    return _converted(path, lines, title, "html")


def _converted(path: Path, lines: list[str], title: str, extractor: str) -> Extracted:
    """A document converted to Markdown-like ``lines`` (blocks split by blank lines), as Extracted:
    its ``title``, else its first ``#`` heading, else the file name."""
    text = canonical(re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n")
    _require_text(text)
    if not title:
        h1 = _ATX_H1.search(text)
        title = h1.group(1).strip() if h1 else _title_from_stem(path)
    return Extracted(text, nfc(title), extractor, EXTRACTOR_VERSIONS[extractor])


def extract_pdf(path: Path, data: bytes) -> Extracted:
    """pypdf text per page, pages joined by a blank line; page spans kept for locators."""
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, PyPdfError

    # pypdf logs what it repairs or gives up on ("EOF marker not found", "invalid pdf header"):
    # printed under `rag ingest`'s progress bar without a file name, once per read (the language
    # sample of a new collection reads a file twice more). A file it cannot read fails with that
    # reason instead; what it could repair is read.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                unlocked = reader.decrypt("")
            except Exception as e:  # pypdf raises several types for unsupported crypto
                raise ExtractionError(f"encrypted PDF cannot be opened: {e}") from e
            if not unlocked:
                raise ExtractionError("encrypted PDF: a password is required; save an unencrypted copy")
        parts: list[str] = []
        pages: list[PageSpan] = []
        offset = 0
        for number, page in enumerate(reader.pages, start=1):
            page_text = canonical(page.extract_text() or "").strip("\n")
            if parts:
                parts.append("\n\n")
                offset += 2
            parts.append(page_text)
            pages.append(PageSpan(number, offset, offset + len(page_text)))
            offset += len(page_text)
        info_title = (reader.metadata.title if reader.metadata else None) or ""
    except ExtractionError:
        raise
    except DependencyError as e:  # e.g. JBIG2 images without the jbig2dec program
        raise ExtractionError(f"the PDF cannot be read without a program that is not installed: {e}") from e
    except NotImplementedError as e:  # pypdf: "Unsupported filter /...", a compression it does not know
        raise ExtractionError(f"the PDF uses a feature the PDF reader does not support: {e}; save it again "
                              "(e.g. print to PDF) and ingest the copy") from e
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, OSError) as e:  # PyPdfError: also
        # LimitReachedError (an object that refers to itself) beside PdfReadError
        raise ExtractionError(f"corrupt or unreadable PDF: {type(e).__name__}: {e}") from e
    text = "".join(parts)
    if not pages:
        raise ExtractionError("the PDF has no pages")
    if not holds_text(text):
        raise ExtractionError("the PDF has no extractable text (a scanned image?); run OCR on it first")
    title = nfc(_NOT_TEXT.sub("\ufffd", str(info_title)).strip()) or _title_from_stem(path)
    return Extracted(text, title, "pdf", EXTRACTOR_VERSIONS["pdf"], 0, tuple(pages))


def _squash_lines(text: str) -> str:
    """Each line's runs of spaces and tabs made one space; empty lines dropped (a soft line break
    inside a paragraph stays a line break)."""
    lines = (re.sub(r"[ \t\u00a0]+", " ", line).strip() for line in text.split("\n"))
    return "\n".join(line for line in lines if line)


def _table_row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _table_lines(rows: list[list[str]]) -> list[str]:
    """A table as a Markdown pipe table (its first row the header), so chunking keeps it whole."""
    rows = [row for row in rows if any(row)]
    if not rows:
        return []
    width = max(len(row) for row in rows)
    lines = [_table_row(rows[0] + [""] * (width - len(rows[0]))), "|" + " --- |" * width]
    lines.extend(_table_row(row + [""] * (width - len(row))) for row in rows[1:])
    return ["", *lines, ""]


# Paragraph styles that hold code or preformatted text (Word's "HTML Preformatted", "Plain Text",
# "Macro Text"; LibreOffice's "Preformatted Text"; pandoc's "Source Code"): one line each, spaces kept.
_CODE_STYLE = re.compile(r"preformatted|code|plain text|macro text|verbatim|listing")


class _Blocks:
    """The Markdown-like lines of a converted document. Consecutive code paragraphs become one
    fenced block, their indentation kept: as paragraphs, each line would be a block of its own,
    indentation lost, and a comment line such as "# or:" read as a heading."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._code: list[str] = []

    def code(self, line: str) -> None:
        self._code.append(line)

    def add(self, *lines: str) -> None:
        self.flush()
        self.lines.extend(lines)

    def flush(self) -> None:
        while self._code and not self._code[-1].strip():
            self._code.pop()
        first = next((i for i, line in enumerate(self._code) if line.strip()), len(self._code))
        body = self._code[first:]
        if body:
            fence = "````" if any("```" in line for line in body) else "```"
            self.lines.extend(["", fence, *body, fence, ""])
        self._code.clear()


def _raw_lines(text: str) -> str:
    """Code as written: each line's trailing spaces dropped, its indentation kept."""
    return "\n".join(line.replace("\u00a0", " ").rstrip() for line in text.split("\n"))


_CFB_MAGIC = b"\xd0\xcf\x11\xe0"  # an OLE compound file: Word 97-2003, or an encrypted OOXML/ODF package


# What an Office package may unpack to. Both readers hold every part in memory (python-docx reads
# them all, odfpy its XML) and parse the XML into a tree of ~10x its size, so a small file that
# unpacks to gigabytes (a "zip bomb", or a runaway generated document) would take the whole machine
# down with it instead of failing alone. 1 GiB of parts or 200 MiB of XML is far beyond a real
# document: the 58 LibreOffice help pages saved as .docx (README, "Word and OpenDocument files")
# hold 26-234 KB of XML each, median 45 KB.
MAX_UNPACKED = 1 << 30
MAX_UNPACKED_XML = 200 << 20


def _office_package(data: bytes, kind: str) -> None:
    """Refuse, with what to do, what is not an unencrypted Office Open XML / OpenDocument zip, or
    what would unpack to more than ``MAX_UNPACKED`` (``MAX_UNPACKED_XML`` of XML)."""
    import zipfile

    if data.startswith(_CFB_MAGIC):
        raise ExtractionError(f"not a {kind} package: a password-protected document, or an older binary format "
                              f"(Word 97-2003 .doc) renamed; save it as {kind} without a password")
    if not data.startswith(b"PK"):
        raise ExtractionError(f"not a {kind} file (it is not a zip package); save it as {kind} again")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as package:
            parts = package.infolist()
    except zipfile.BadZipFile as e:
        raise ExtractionError(f"corrupt or unreadable {kind} package: {e}") from e
    unpacked = sum(part.file_size for part in parts)
    xml = sum(part.file_size for part in parts if part.filename.endswith((".xml", ".rels")))
    if unpacked > MAX_UNPACKED or xml > MAX_UNPACKED_XML:
        raise ExtractionError(f"the {kind} package unpacks to {unpacked / 2**20:,.0f} MB ({xml / 2**20:,.0f} MB "
                              f"of XML) from {len(data) / 2**20:,.1f} MB: more than a document may take "
                              f"({MAX_UNPACKED >> 20:,} MB, {MAX_UNPACKED_XML >> 20} MB of XML)")


# python-docx reads the package (styles, parts); the body is walked here, not through
# ``Document.paragraphs``: that skips content controls (``w:sdt``, which templates wrap whole sections
# in) and the runs of tracked insertions, and a text box's fallback copy would be read twice.
def extract_docx(path: Path, data: bytes) -> Extracted:
    """Word .docx -> Markdown-like text: headings (by style, outline level) as '#', list paragraphs as
    '- ', tables as pipe tables. Headers, footers, footnotes, comments and tables of contents are
    page furniture and left out; deleted text of tracked changes too."""
    import zipfile

    from docx import Document
    from docx.enum.style import WD_STYLE_TYPE
    from docx.opc.exceptions import PackageNotFoundError
    from docx.oxml.ns import qn
    from lxml import etree

    _office_package(data, ".docx")
    try:
        document = Document(io.BytesIO(data))
    except KeyError as e:  # a part every .docx has is missing: another zip format renamed
        raise ExtractionError(f"not a Word .docx package ({e.args[0]}); is it another kind of file renamed?") from e
    except ValueError as e:  # python-docx: "file '...' is not a Word file, content type is '...'"
        raise ExtractionError(f"not a Word .docx document: {e}") from e
    except (zipfile.BadZipFile, PackageNotFoundError, etree.LxmlError) as e:
        raise ExtractionError(f"corrupt or unreadable Word document: {type(e).__name__}: {e}") from e
    body = document.element.body
    fallback = "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"
    for copy in list(body.iter(fallback)):
        copy.getparent().remove(copy)
    styles: dict[str | None, tuple[int | None, bool, bool, bool]] = {}

    def outline_level(element: Any) -> int | None:
        """The heading level a paragraph or a style sets by its outline level (0-8; 9 is body text)."""
        value = element.xpath("./w:pPr/w:outlineLvl/@w:val")
        return int(value[0]) + 1 if value and value[0].isdigit() and int(value[0]) < 9 else None

    def style_of(style_id: str | None) -> tuple[int | None, bool, bool, bool]:
        """(heading level, list style, table of contents, code) of a paragraph style, through its bases."""
        if style_id not in styles:
            level, listed, contents, code = None, False, False, False
            style: Any = document.part.get_style(style_id, WD_STYLE_TYPE.PARAGRAPH)
            while style is not None and level is None:
                name = (style.name or "").casefold()
                heading = re.fullmatch(r"heading\s*([1-9])", name)
                level = 1 if name == "title" else int(heading.group(1)) if heading else outline_level(style.element)
                code = code or bool(_CODE_STYLE.search(name))
                listed = listed or "list" in name
                contents = contents or name.startswith("toc")
                style = getattr(style, "base_style", None)  # a paragraph style's, through its bases
            styles[style_id] = (level, listed and not code, contents, code and level is None)
        return styles[style_id]

    def raw_text(element: Any) -> str:
        parts = []
        for node in element.iter(qn("w:t"), qn("w:tab"), qn("w:br"), qn("w:cr"), qn("w:p")):
            if node.tag == qn("w:t"):
                parts.append(node.text or "")
            elif node.tag == qn("w:tab"):
                parts.append("\t")
            elif node is not element:  # a break, or a paragraph of a text box inside this one
                parts.append("\n")
        return "".join(parts)

    def text_of(element: Any) -> str:
        return _squash_lines(raw_text(element))

    def cell_text(cell: Any) -> str:  # its paragraphs, and those of a table inside it, on one line
        return " ".join(text_of(cell).split("\n"))

    blocks = _Blocks()

    def walk(container: Any) -> None:
        for child in container.iterchildren():
            if child.tag == qn("w:sdt"):
                content = child.find(qn("w:sdtContent"))
                if content is not None:
                    walk(content)
            elif child.tag == qn("w:customXml"):  # paragraphs wrapped in a custom XML element
                walk(child)
            elif child.tag == qn("w:tbl"):
                rows = []
                for tr in child.iterchildren(qn("w:tr")):
                    row: list[str] = []
                    for tc in tr.iterchildren(qn("w:tc")):  # a merged cell keeps the columns after it
                        span = tc.xpath("./w:tcPr/w:gridSpan/@w:val")
                        row.extend([cell_text(tc)] + [""] * (int(span[0]) - 1 if span and span[0].isdigit() else 0))
                    rows.append(row)
                blocks.add(*_table_lines(rows))
            elif child.tag == qn("w:p"):
                level, listed, contents, code = style_of(child.style)
                if code and outline_level(child) is None:
                    blocks.code(_raw_lines(raw_text(child)))  # an empty line of code is a line too
                    continue
                text = text_of(child)
                if not text or contents:
                    continue
                level = outline_level(child) if level is None else level
                if level is not None:
                    blocks.add("", "#" * level + " " + text.replace("\n", " "), "")
                elif listed or child.xpath("./w:pPr/w:numPr"):
                    blocks.add("- " + text)
                else:
                    blocks.add("", text, "")

    walk(body)
    blocks.flush()
    return _converted(path, blocks.lines, (document.core_properties.title or "").strip(), "docx")


def extract_odt(path: Path, data: bytes) -> Extracted:
    """OpenDocument text (.odt, LibreOffice) -> Markdown-like text: headings by outline level as
    '#', list items as '- ', tables as pipe tables. Footnotes, comments, indexes (a table of
    contents) and tracked deletions are left out."""
    import zipfile
    from xml.sax import SAXException

    from odf import dc, teletype
    from odf.namespaces import OFFICENS, STYLENS, SVGNS, TABLENS, TEXTNS
    from odf.opendocument import load
    from odf.style import Style

    _office_package(data, ".odt")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as package:
            manifest = package.read("META-INF/manifest.xml") if "META-INF/manifest.xml" in package.namelist() else b""
        if b"encryption-data" in manifest:
            raise ExtractionError("the OpenDocument file is password-protected; save a copy without a password")
        document = load(io.BytesIO(data))
    except ExtractionError:
        raise
    except KeyError as e:  # a part every OpenDocument file has is missing: another zip format renamed
        raise ExtractionError(f"not an OpenDocument .odt package ({e.args[0]}); is it another kind of file "
                              "renamed?") from e
    except (zipfile.BadZipFile, ValueError, SAXException) as e:
        raise ExtractionError(f"corrupt or unreadable OpenDocument file: {type(e).__name__}: {e}") from e
    if not str(document.mimetype).startswith("application/vnd.oasis.opendocument.text"):
        raise ExtractionError(f"an OpenDocument file of type {document.mimetype!r}, not a text document: only "
                              ".odt text documents are read (save spreadsheets and slides as PDF)")
    skipped = {(TEXTNS, name) for name in ("note", "tracked-changes", "table-of-content", "alphabetical-index",
                                           "illustration-index", "table-index", "object-index", "user-index",
                                           "bibliography", "sequence-decls")}
    skipped |= {(OFFICENS, "annotation"), (SVGNS, "title"), (SVGNS, "desc")}  # comments; an image's alt text
    # style name -> (parent style, heading level it sets, code style)
    parents: dict[str, tuple[str, int | None, bool]] = {}
    for family in (document.styles, document.automaticstyles):
        for style in family.getElementsByType(Style):
            name = str(style.getAttrNS(STYLENS, "name") or "")
            shown = str(style.getAttrNS(STYLENS, "display-name") or name.replace("_20_", " ")).casefold()
            heading = re.fullmatch(r"heading\s*([1-9])", shown)
            outline = str(style.getAttrNS(STYLENS, "default-outline-level") or "")
            level = (int(outline) if outline.isdigit() else int(heading.group(1)) if heading
                     else 1 if shown == "title" else None)
            parents[name] = (str(style.getAttrNS(STYLENS, "parent-style-name") or ""), level,
                             bool(_CODE_STYLE.search(shown)))

    def style_of(name: str) -> tuple[int | None, bool]:
        """(heading level, code) of a paragraph style, through its parents: LibreOffice writes a heading
        converted from HTML or Word as a paragraph styled "Heading 1", not always as a text:h."""
        code = False
        for _ in range(len(parents)):  # a chain of parents, however (mis)formed, ends
            parent, level, coded = parents.get(name, ("", None, False))
            code = code or coded
            if level is not None or not parent:
                return level, code and level is None
            name = parent
        return None, code

    def text_of(element: Any, raw: bool = False) -> str:
        parts: list[str] = []

        def collect(node: Any) -> None:
            for child in node.childNodes:
                if child.nodeType == child.TEXT_NODE:
                    parts.append(str(child.data))
                elif child.nodeType != child.ELEMENT_NODE or child.qname in skipped:
                    continue
                elif child.qname == (TEXTNS, "s"):
                    parts.append(" " * int(child.getAttrNS(TEXTNS, "c") or 1))
                elif child.qname == (TEXTNS, "tab"):
                    parts.append("\t")
                elif child.qname == (TEXTNS, "line-break"):
                    parts.append("\n")
                else:
                    if child.qname in ((TEXTNS, "p"), (TEXTNS, "h")) and parts:
                        parts.append("\n")  # a paragraph of a frame or cell inside this one
                    collect(child)

        collect(element)
        return _raw_lines("".join(parts)) if raw else _squash_lines("".join(parts))

    blocks = _Blocks()

    def table_rows(node: Any) -> list[list[str]]:
        rows = []
        for child in node.childNodes:
            if child.nodeType != child.ELEMENT_NODE:
                continue
            if child.qname == (TABLENS, "table-row"):
                rows.append([text_of(cell).replace("\n", " ") for cell in child.childNodes
                             if cell.nodeType == cell.ELEMENT_NODE and cell.qname == (TABLENS, "table-cell")])
            elif child.qname[0] == TABLENS and child.qname[1] in ("table-header-rows", "table-rows", "table-row-group"):
                rows.extend(table_rows(child))
        return rows

    def walk(node: Any, in_list: bool = False) -> None:
        for child in node.childNodes:
            if child.nodeType != child.ELEMENT_NODE or child.qname in skipped:
                continue
            if child.qname in ((TEXTNS, "h"), (TEXTNS, "p")):
                level, code = style_of(str(child.getAttrNS(TEXTNS, "style-name") or ""))
                if child.qname == (TEXTNS, "h"):
                    level, code = int(child.getAttrNS(TEXTNS, "outline-level") or 1), False
                elif in_list:  # a list item styled as a heading is still a list item
                    level = None
                if code:
                    blocks.code(text_of(child, raw=True))  # an empty line of code is a line too
                    continue
                text = text_of(child)
                if text and level is not None:
                    blocks.add("", "#" * min(level, 6) + " " + text.replace("\n", " "), "")
                elif text:
                    blocks.add(*([f"- {text}"] if in_list else ["", text, ""]))
            elif child.qname == (TABLENS, "table"):
                blocks.add(*_table_lines(table_rows(child)))
            elif child.qname == (TEXTNS, "list"):
                walk(child, in_list=True)
            else:  # list items, sections, and other containers of paragraphs
                walk(child, in_list)

    walk(document.text)
    blocks.flush()
    titles = document.meta.getElementsByType(dc.Title)
    return _converted(path, blocks.lines, teletype.extractText(titles[0]).strip() if titles else "", "odt")


_EXTRACTORS = {"markdown": extract_markdown, "text": extract_plain, "html": extract_html, "pdf": extract_pdf,
               "docx": extract_docx, "odt": extract_odt}


def extract(path: Path, data: bytes | None = None) -> Extracted:
    """Extract one file. Raises ExtractionError with a reason a user can act on."""
    kind = extractor_for(path)
    if data is None:
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ExtractionError(f"cannot read the file: {e.strerror or e}") from e
    if not data:
        raise ExtractionError("the file is empty (0 bytes)")
    try:
        return _EXTRACTORS[kind](path, data)
    except RecursionError as e:  # e.g. HTML elements nested ~1,000 deep: the block walk recurses
        raise ExtractionError("the document is nested too deeply to read (elements inside elements, "
                              f"over {sys.getrecursionlimit()} levels); flatten or simplify it") from e
