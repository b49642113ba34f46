"""The answer examiner (rag.examine): a second model's yes/no log-odds on the shown answer, and
how ask feeds it to the decision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag import decide, store
from rag.ask import ask
from rag.config import Settings
from rag.evaluate_answers import BUNDLED_ROWS, bundled_rows
from rag.examine import ANSWER_CHARS, answer_for_examiner, examine_answer
from rag.ingest import ingest
from rag.resources import Resources

from .fakes import FailingLLM, FakeEmbedder, FakeLLM
from .test_answer_decision import CHATML, PAGES


def examiner_llm(says_yes_when: str) -> FakeLLM:
    """A chat model whose log-odds are +3 when the prompt holds ``says_yes_when``, else -3."""
    return FakeLLM(metadata={"tokenizer.chat_template": CHATML},
                   judge=lambda prompt: 3.0 if says_yes_when in prompt else -3.0)


def test_the_examiner_reads_the_answer_without_its_citation_markers() -> None:
    assert answer_for_examiner("According to [1], the port is 8502 [2]. Theo [3], còn lại 4 dòng.") == (
        "the port is 8502. còn lại 4 dòng.")
    assert len(answer_for_examiner("word " * 1000)) == ANSWER_CHARS


def test_the_examiner_gives_the_models_log_odds_of_yes() -> None:
    llm = examiner_llm("8502")
    assert examine_answer(llm, "Which port?", "According to [1], run make run PORT=8502 [1].") == pytest.approx(3.0)
    assert examine_answer(llm, "Which port?", "According to [1], the port is in use.") == pytest.approx(-3.0)
    prompt = llm.scored[-1]
    assert "Which port?" in prompt and "the port is in use." in prompt and "[1]" not in prompt
    assert examine_answer(llm, "Which port?", " [1] ") is None  # nothing left to read: no call
    assert len(llm.scored) == 2
    split = FakeLLM(metadata={"tokenizer.chat_template": CHATML}, split_yes=True)
    assert examine_answer(split, "Which port?", "It is 8502.") is None  # "yes" is no single token


def logodds_policy() -> decide.Policy:
    """``after`` says sigmoid(lm_logodds); ``before`` lets everything through."""
    n = len(decide.FEATURES)
    weights = tuple(1.0 if name == "lm_logodds" else 0.0 for name in decide.FEATURES)
    after = decide.DecisionModel(weights, 0.0, (0.0,) * n, (1.0,) * n, 0.5)
    before = decide.DecisionModel((0.0,) * n, 5.0, (0.0,) * n, (1.0,) * n, 0.5)
    return decide.Policy(before, after, source="test")


class ExaminerResources(Resources):
    def __init__(self, settings: Settings, examiner: FakeLLM) -> None:
        super().__init__(settings)
        self.examiner = examiner
        self.asked: list[str | None] = []

    def language_model(self, name: str | None = None) -> Any:
        self.asked.append(name)
        return self.examiner


@pytest.fixture
def indexed(conn: store.Connection, settings: Settings, tmp_path: Path, fake_embedder: FakeEmbedder):
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in PAGES.items():
        (folder / name).write_text(text, encoding="utf-8")
    ingest(conn, [folder], settings=settings, embedder=fake_embedder)
    settings = settings.replace(decision="auto", answer_examiner="qwen-1.5b")
    store.set_meta(conn, decide.META_KEY + settings.collection, logodds_policy().to_json())
    return conn, settings


def test_ask_shows_what_the_examiner_accepts_and_refuses_what_it_rejects(indexed) -> None:
    conn, settings = indexed
    reply = "1], the garage closes at 7 pm on weekdays."
    for says_yes_when, status in (("7 pm", "answered"), ("midnight", "no_answer")):
        resources = ExaminerResources(settings, examiner_llm(says_yes_when))
        answer = ask("When does the garage close?", conn=conn, settings=settings, embedder=FakeEmbedder(),
                     llm=FakeLLM(reply), resources=resources)
        assert resources.asked == ["qwen-1.5b"]  # the examiner is the model the setting names
        assert answer.status == status, answer.trace
        assert answer.trace["lm_logodds"] == pytest.approx(3.0 if status == "answered" else -3.0)
        assert "examine" in answer.timings_ms and list(answer.timings_ms)[-2:] == ["examine", "total"]


def test_without_an_examiner_no_second_model_is_asked_and_with_the_decision_off_it_only_informs(indexed) -> None:
    conn, settings = indexed
    reply = "1], the garage closes at 7 pm on weekdays."
    resources = ExaminerResources(settings.replace(answer_examiner="off"), FailingLLM())
    answer = ask("When does the garage close?", conn=conn, settings=resources.settings, embedder=FakeEmbedder(),
                 llm=FakeLLM(reply), resources=resources)
    assert resources.asked == [] and "lm_logodds" not in answer.trace
    # decision off: the examiner still runs (calibration rows need its signal) but refuses nothing
    off = settings.replace(decision="off")
    resources = ExaminerResources(off, examiner_llm("midnight"))
    answer = ask("When does the garage close?", conn=conn, settings=off, embedder=FakeEmbedder(),
                 llm=FakeLLM(reply), resources=resources)
    assert answer.status == "answered" and answer.trace["lm_logodds"] == pytest.approx(-3.0)


def test_the_examiner_setting_picks_the_bundled_policy_and_rows_fitted_with_it() -> None:
    assert decide.BUNDLED_POLICIES["examined"] != decide.BUNDLED_POLICIES["model"]
    assert BUNDLED_ROWS["examined"] != BUNDLED_ROWS["model"]
    assert decide.policy_kind(generate=True, examined=True) == "examined"
    policy, rows = decide.bundled_policy("examined"), bundled_rows("examined")
    assert policy is not None and len(policy.after.fitted_on) >= 2 and set(policy.report["corpora"]) == set(
        policy.after.fitted_on)
    # fitted on rows that carry the examiner's log-odds, and a "yes" raises the probability to answer
    assert {r.corpus for r in rows} == set(policy.after.fitted_on)
    assert sum(r.signals.get("lm_logodds", 0.0) != 0.0 for r in rows) > len(rows) / 2
    assert policy.after.weights[decide.FEATURES.index("lm_logodds")] > 0
    with pytest.raises(Exception, match="answer_examiner"):
        Settings().replace(answer_examiner="")


@pytest.mark.slow
def test_the_default_model_examines_a_direct_answer_above_a_non_answer(real_default_llm: Any) -> None:
    question = "What time does the garage close on weekdays?"
    direct = examine_answer(real_default_llm, question, "According to [1], the garage closes at 7 pm on weekdays.")
    other = examine_answer(real_default_llm, question, "According to [1], bananas are yellow when they are ripe.")
    assert direct is not None and other is not None
    assert direct > other
    again = examine_answer(real_default_llm, question, "According to [1], the garage closes at 7 pm on weekdays.")
    assert again == pytest.approx(direct, abs=1e-6)  # greedy and from an empty context: reproducible
