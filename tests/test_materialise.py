"""eval/materialise_common.py: the held-out corpora are copied only when they are the pinned text."""

import hashlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

EVAL = Path(__file__).resolve().parent.parent / "eval"
sys.path.insert(0, str(EVAL))
from materialise_common import MaterialiseError, materialise  # noqa: E402


def python_docs_normalise():
    spec = importlib.util.spec_from_file_location("python_docs_materialise", EVAL / "python_docs" / "materialise.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.normalise


PINNED = b"<p>json.dumps(obj)</p><footer>Last updated on October 21, 2026.</footer>"
REBUILT = b"<p>json.dumps(obj)</p><footer>Last updated on May 12, 2026.</footer>"
EDITED = b"<p>json.dump(obj)</p><footer>Last updated on May 12, 2026.</footer>"


def sources(tmp_path: Path, normalise=None) -> Path:
    sha = hashlib.sha256(PINNED).hexdigest()
    lines = ["Held-out corpus", f"{sha}  {len(PINNED)}  library/json.html"]
    if normalise:
        lines += ["", f"normalised  {hashlib.sha256(normalise(PINNED)).hexdigest()}  library/json.html"]
    path = tmp_path / "SOURCES.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def package(tmp_path: Path, data: bytes) -> Path:
    root = tmp_path / "pkg"
    (root / "library").mkdir(parents=True)
    (root / "library" / "json.html").write_bytes(data)
    return root


def test_the_pinned_file_is_copied_byte_for_byte(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    assert materialise(name="t", sources_txt=sources(tmp_path), roots=[package(tmp_path, PINNED)],
                       install_hint="apt-get install x", dest=dest) == 1
    assert (dest / "library" / "json.html").read_bytes() == PINNED


def test_another_build_passes_only_when_nothing_but_its_build_date_differs(tmp_path: Path) -> None:
    normalise = python_docs_normalise()
    assert normalise(PINNED) == normalise(REBUILT) != normalise(EDITED)
    table = sources(tmp_path, normalise)
    dest = tmp_path / "out"
    materialise(name="t", sources_txt=table, roots=[package(tmp_path, REBUILT)], install_hint="x", dest=dest,
                normalise=normalise)
    assert (dest / "library" / "json.html").read_bytes() == REBUILT  # copied as the package ships it
    for data, hook in ((EDITED, normalise), (REBUILT, None)):  # other text; or no normalising for this set
        root = tmp_path / f"pkg-{len(data)}-{hook is None}"
        (root / "library").mkdir(parents=True)
        (root / "library" / "json.html").write_bytes(data)
        with pytest.raises(MaterialiseError, match="differ from the pinned version"):
            materialise(name="t", sources_txt=table, roots=[root], install_hint="x", dest=tmp_path / "o2",
                        normalise=hook)


def test_python_docs_lists_a_normalised_hash_for_every_pinned_file() -> None:
    text = (EVAL / "python_docs" / "SOURCES.txt").read_text(encoding="utf-8")
    pinned = re.findall(r"^[0-9a-f]{64}\s+\d+\s+(\S+)\s*$", text, re.M)
    normalised = re.findall(r"^normalised\s+[0-9a-f]{64}\s+(\S+)\s*$", text, re.M)
    assert len(pinned) == 57 and sorted(normalised) == sorted(pinned)
