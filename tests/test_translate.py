"""Question translation for retrieval across languages (rag.translate)."""

from __future__ import annotations

import pytest

from rag.errors import ModelLoadError
from rag.translate import ModelTranslator, clean_translation, translate_messages

from .fakes import FakeLLM

QUESTION = "How do I insert a picture into a document?"
VIETNAMESE = "Làm thế nào để chèn hình ảnh vào tài liệu?"


class InstructLLM(FakeLLM):
    prompt_style = "instruct"


def test_clean_translation_takes_the_first_line_unquoted() -> None:
    assert clean_translation(f'"{VIETNAMESE}"\nGiải thích: ...', QUESTION, "vi") == VIETNAMESE
    assert clean_translation(f"\n  {VIETNAMESE}  ", QUESTION, "vi") == VIETNAMESE


@pytest.mark.parametrize("raw", [
    "",  # nothing
    "   \n  ",
    QUESTION,  # the question itself
    QUESTION.lower().rstrip("?"),
    "To insert a picture, open the Insert menu and choose Image.",  # an answer, in the wrong language
    "Để chèn hình ảnh, " + "bạn mở trình đơn Chèn và chọn Hình ảnh rồi chọn tệp. " * 4,  # far too long
])
def test_clean_translation_refuses_what_is_not_a_translation(raw: str) -> None:
    assert clean_translation(raw, QUESTION, "vi") is None


def test_clean_translation_into_english() -> None:
    assert clean_translation("How do I insert a picture?", VIETNAMESE, "en") == "How do I insert a picture?"
    assert clean_translation("Chèn hình ảnh thế nào?", VIETNAMESE, "en") is None


def test_translate_messages_show_the_direction_asked_for() -> None:
    into_vi = translate_messages(QUESTION, "vi")
    assert into_vi[0]["role"] == "system" and "Vietnamese" in into_vi[0]["content"]
    assert "{language}" not in into_vi[0]["content"]
    assert [m["role"] for m in into_vi] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert into_vi[-1]["content"] == QUESTION
    assert into_vi[1]["content"].startswith("How") and "mật khẩu" in into_vi[2]["content"]
    into_en = translate_messages(VIETNAMESE, "en")
    assert "English" in into_en[0]["content"]
    assert into_en[1]["content"] == into_vi[2]["content"] and into_en[2]["content"] == into_vi[1]["content"]
    with pytest.raises(ValueError, match="no translation into 'fr'"):
        translate_messages(QUESTION, "fr")


def test_model_translator_asks_once_per_question_and_direction() -> None:
    llm = InstructLLM(VIETNAMESE)
    translator = ModelTranslator(lambda: llm)
    assert translator.translated(QUESTION) is None
    assert translator.translate(QUESTION, "vi") == VIETNAMESE
    assert translator.translate(QUESTION, "vi") == VIETNAMESE
    assert len(llm.calls) == 1  # cached
    assert llm.calls[0]["temperature"] == 0.0 and "\n" in llm.calls[0]["stop"]
    assert QUESTION in llm.prompts[-1]
    assert translator.translated(QUESTION) == VIETNAMESE


def test_model_translator_keeps_a_refusal_too() -> None:
    llm = InstructLLM("Insert > Image opens the file dialog.")  # an English answer, not a translation
    translator = ModelTranslator(lambda: llm)
    assert translator.translate(QUESTION, "vi") is None
    assert translator.translate(QUESTION, "vi") is None
    assert len(llm.calls) == 1
    assert translator.translated(QUESTION) is None


def test_a_base_model_or_no_model_translates_nothing() -> None:
    base = FakeLLM(VIETNAMESE)  # prompt_style "example": cannot follow the instruction
    assert ModelTranslator(lambda: base).translate(QUESTION, "vi") is None
    assert base.calls == []

    def missing() -> FakeLLM:
        raise ModelLoadError("no GGUF at /nowhere.gguf")

    assert ModelTranslator(missing).translate(QUESTION, "vi") is None
    assert ModelTranslator(lambda: InstructLLM(VIETNAMESE)).translate(QUESTION, "fr") is None
