"""Answer-level evaluation: outcomes, correctness by the relevance rule, figures, decision signals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rag import cli, store
from rag.config import Settings
from rag.errors import RagError
from rag.evaluate_answers import AnswerReport, drop_kind, dump, format_figures, load_rows, run_answers
from rag.golden import load_golden
from rag.ingest import ingest
from rag.replay import ReplayModel, answer_leads, recorded_replies, strip_lead
from rag.resources import Resources

from .fakes import FakeEmbedder, FakeLLM

PAGES = {
    "parking.md": "# Parking\n\n## Garage\n\nThe garage closes at 7 pm on weekdays. It is closed on public holidays.\n",
    "office.md": "# Office\n\n## Access\n\nThe office opens at 8 am. Visitors must sign in at the front desk.\n",
}
GOLDEN = [
    {"id": "A1", "kind": "answerable", "question": "When does the garage close on weekdays?", "paraphrases": [],
     "groups": ["all"], "evidence": [{"source": "parking.md", "quote": "The garage closes at 7 pm on weekdays."}]},
    {"id": "U1", "kind": "unanswerable", "question": "What is the boiling point of water on Everest?",
     "paraphrases": [], "groups": ["all"], "evidence": []},
]


@pytest.fixture
def setup(tmp_path: Path, conn: store.Connection, settings: Settings,
          monkeypatch: pytest.MonkeyPatch) -> tuple[store.Connection, Settings, Path]:
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in PAGES.items():
        (folder / name).write_text(text, encoding="utf-8")
    ingest(conn, [folder], settings=settings, embedder=FakeEmbedder())
    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps(GOLDEN), encoding="utf-8")
    monkeypatch.setattr("rag.registry.load_embedder", lambda *a, **k: FakeEmbedder())

    def language_model(self: Any, name: str | None = None) -> FakeLLM:
        model: FakeLLM = self._cached("language_model", "fake", lambda: FakeLLM(
            "1], the garage closes at 7 pm on weekdays. It is closed on public holidays [1]."), lambda _m: "fake")
        return model

    monkeypatch.setattr(Resources, "language_model", language_model)
    return conn, settings.replace(max_distance=0.9), golden


def test_outcomes_correctness_and_figures(setup: tuple[store.Connection, Settings, Path]) -> None:
    conn, settings, golden = setup
    with Resources(settings) as resources:
        report = run_answers(conn, load_golden(golden), resources=resources, settings=settings)
    rows = {r.id: r for r in report.rows}
    assert rows["A1/q"].status == "answered" and rows["A1/q"].correct and rows["A1/q"].model_sentences == 2
    assert rows["A1/q"].supported_sentences == 2 and rows["A1/q"].signals["verified"] == 1.0
    assert set(rows["A1/q"].signals) == {"distance", "gap", "coverage", "rare_coverage", "agreement",
                                         "lm_refused", "lm_logodds", "verified"}
    figures = report.figures()
    assert figures["answerable"] == 1 and figures["must_refuse"] == 1
    assert figures["answered_model_written"] == 1.0 and figures["answered_correct"] == 1.0
    unanswerable = rows["U1/q"]
    assert figures["bluffs"] == (0.0 if unanswerable.refused else 1.0)  # the same model answers everything
    examples = report.examples("toy")
    assert examples and examples[0].corpus == "toy"


def test_a_refused_answerable_query_is_lost_and_not_correct(setup: tuple[store.Connection, Settings, Path]) -> None:
    conn, settings, golden = setup
    strict = settings.replace(max_distance=0.01)
    with Resources(strict) as resources:
        report = run_answers(conn, load_golden(golden), resources=resources, settings=strict)
    figures = report.figures()
    assert figures["lost"] == 1.0 and figures["bluffs"] == 0.0 and figures["answered_correct"] == 0.0
    assert figures["refusal_recall"] == 1.0 and figures["refusal_precision"] == 0.5
    assert all(not r.signals for r in report.rows)  # the gate refused: no decision to make


def test_cli_eval_answers_prints_the_figures(
    setup: tuple[store.Connection, Settings, Path], db_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, golden = setup
    out = tmp_path / "answers.json"
    assert cli.main(["eval", "answers", "--db", str(db_path), "--golden", str(golden), "--no-generate",
                     "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "answered_correct" in printed and "bluffs" in printed
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["language_model"] == "none (extractive)" and len(saved["rows"]) == 2


@pytest.mark.parametrize("no_generate", [True, False])
def test_calibrating_stores_the_policy_of_the_way_the_answers_were_made(
    setup: tuple[store.Connection, Settings, Path], db_path: Path, capsys: pytest.CaptureFixture[str],
    no_generate: bool,
) -> None:
    from rag import decide

    conn, settings, golden = setup
    flag = ["--no-generate"] if no_generate else []
    assert cli.main(["eval", "answers", "--db", str(db_path), "--golden", str(golden), "--calibrate", *flag]) == 0
    assert ("without the language model" in capsys.readouterr().out) == no_generate
    quotes = store.get_meta(conn, decide.meta_key(settings.collection, "quotes"))
    model = store.get_meta(conn, decide.meta_key(settings.collection, "model"))
    stored, untouched = (quotes, model) if no_generate else (model, quotes)
    assert stored is not None and untouched is None
    policy = decide.Policy.from_json(stored)
    kind = "quotes" if no_generate else "model"  # the bundled rows of the same kind join the collection's own
    assert set(policy.before.fitted_on) == {"golden", *decide.bundled_policy(kind).before.fitted_on}


def test_cli_eval_answers_creates_the_report_folder_and_refuses_a_folder_before_asking(
    setup: tuple[store.Connection, Settings, Path], db_path: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, _, golden = setup
    out = tmp_path / "missing" / "dir" / "answers.json"
    assert cli.main(["eval", "answers", "--db", str(db_path), "--golden", str(golden), "--no-generate",
                     "--json", str(out)]) == 0
    assert len(json.loads(out.read_text(encoding="utf-8"))["rows"]) == 2  # as `rag eval --json`: folders made
    capsys.readouterr()

    def no_run(*_a: object, **_k: object) -> None:
        raise AssertionError("the report path is checked before any question is asked")

    monkeypatch.setattr("rag.evaluate_answers.run_answers", no_run)
    assert cli.main(["eval", "answers", "--db", str(db_path), "--golden", str(golden), "--no-generate",
                     "--json", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"error: cannot write the report to {tmp_path}: it is a folder; give a file "
                                       "name\n")


def test_unsupported_model_sentences_are_counted_from_the_trace(
    setup: tuple[store.Connection, Settings, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn, settings, golden = setup

    def wrong_model(self: Any, name: str | None = None) -> FakeLLM:
        model: FakeLLM = self._cached("language_model", "wrong", lambda: FakeLLM(
            "1], the moon is made of green cheese and opens at noon."), lambda _m: "wrong")
        return model

    monkeypatch.setattr(Resources, "language_model", wrong_model)
    with Resources(settings) as resources:
        report = run_answers(conn, load_golden(golden), resources=resources, settings=settings, limit=1)
    [row] = report.rows
    assert row.status == "extractive" and row.model_sentences == 1 and row.supported_sentences == 0
    assert report.figures()["support_rate"] == 0.0 and row.signals["verified"] == 0.0
    # the row says why the sentence went, and what the model wrote; the report counts the reasons
    assert row.dropped == ["overlap"]
    assert row.raw == "According to [1], the moon is made of green cheese and opens at noon."
    # and what the reader was shown (the quote that replaced it), for judging it offline
    query = load_golden(golden).items[0]
    assert row.question == query.question and row.shown and row.shown != row.raw and row.cited
    assert row.shown.startswith("“The garage closes at 7 pm") and "The garage closes at 7 pm" in row.cited
    assert report.drop_counts() == {"overlap": 1}
    assert "dropped by verification: overlap 1" in format_figures(report)


def test_recorded_replies_are_played_back_instead_of_decoded(
    setup: tuple[store.Connection, Settings, Path], monkeypatch: pytest.MonkeyPatch, db_path: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conn, settings, golden = setup
    with Resources(settings) as resources:
        recorded = run_answers(conn, load_golden(golden), resources=resources, settings=settings)
    saved = tmp_path / "recorded.json"
    saved.write_text(dump(recorded), encoding="utf-8")
    wrong = FakeLLM("1], the moon is made of green cheese and opens at noon.")

    def wrong_model(self: Any, name: str | None = None) -> FakeLLM:
        return wrong

    monkeypatch.setattr(Resources, "language_model", wrong_model)
    with Resources(settings) as resources:
        replayed = run_answers(conn, load_golden(golden), resources=resources, settings=settings,
                               replies=recorded_replies(str(saved)))
    # the same replies judged the same way, and the model decoded nothing (it still built the prompts)
    assert [(r.id, r.status, r.correct, r.raw, r.shown) for r in replayed.rows] == \
        [(r.id, r.status, r.correct, r.raw, r.shown) for r in recorded.rows]
    assert wrong.calls == [] and wrong.prompts
    assert replayed.language_model.endswith(f"(replayed: {len(recorded.rows)} of {len(recorded.rows)} answers)")
    # a query whose reply was not recorded is generated
    with Resources(settings) as resources:
        partial = run_answers(conn, load_golden(golden), resources=resources, settings=settings,
                              replies={"A1/q": [recorded.rows[0].raw]})
    assert {r.id: r.raw for r in partial.rows}["U1/q"].endswith("green cheese and opens at noon.")
    assert len(wrong.calls) == 1
    # the command line
    assert cli.main(["eval", "answers", "--db", str(db_path), "--golden", str(golden), "--replay", str(saved)]) == 0
    # (its own settings: the gate refuses the unanswerable query before any model is asked)
    assert "(replayed: 1 of 2 answers)" in capsys.readouterr().out and len(wrong.calls) == 1
    assert cli.main(["eval", "answers", "--db", str(db_path), "--golden", str(golden), "--replay", str(saved),
                     "--no-generate"]) != 0
    assert "cannot be combined with --no-generate" in capsys.readouterr().err


def test_a_replay_model_decodes_everything_but_the_answer() -> None:
    inner = FakeLLM("Khi nào nhà xe đóng cửa?")
    replay = ReplayModel(inner, answer_tokens=200, leads=("According to [", "Theo ["))
    replay.play(["According to [1], the garage closes at 7 pm [1]."])
    translated = "".join(d.text for d in replay.stream([1, 2], max_tokens=64, stop=[]))
    assert translated == "Khi nào nhà xe đóng cửa?" and len(inner.calls) == 1  # a translation is decoded
    answer = list(replay.stream([1, 2], max_tokens=200, stop=[]))
    assert [d.text for d in answer] == ["1], the garage closes at 7 pm [1]."] and len(inner.calls) == 1
    assert replay.replies == [] and replay.replayed == 1  # one recorded answer for this query
    assert "".join(d.text for d in replay.stream([1, 2], max_tokens=200, stop=[])) == "Khi nào nhà xe đóng cửa?"
    assert len(inner.calls) == 2  # a second answer stream with nothing recorded is decoded
    assert strip_lead("Theo [2], nhà xe", replay.leads) == "2], nhà xe"
    assert strip_lead("The garage", replay.leads) == "The garage"


def test_both_replies_of_a_second_attempt_are_recorded_and_played_back_in_order(tmp_path: Path) -> None:
    rows = {"golden": "toy", "rows": [
        {"id": "V1/q", "kind": "answerable", "status": "answered", "correct": True, "model_sentences": 1,
         "supported_sentences": 1, "first_text_ms": 1.0, "total_ms": 2.0, "raw": "Theo nguồn [1], hai.",
         "replies": ["Theo [3] Tiêu đề.", "Theo nguồn [1], hai."]},
        {"id": "V2/q", "kind": "answerable", "status": "answered", "correct": True, "model_sentences": 1,
         "supported_sentences": 1, "first_text_ms": 1.0, "total_ms": 2.0, "raw": "Theo [1], một."},
        {"id": "U1/q", "kind": "unanswerable", "status": "no_answer", "correct": False, "model_sentences": 0,
         "supported_sentences": 0, "first_text_ms": None, "total_ms": 2.0},
    ]}
    saved = tmp_path / "rows.json"
    saved.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    replies = recorded_replies(str(saved))
    assert replies == {"V1/q": ["Theo [3] Tiêu đề.", "Theo nguồn [1], hai."], "V2/q": ["Theo [1], một."]}
    replay = ReplayModel(FakeLLM("decoded"), answer_tokens=200, leads=answer_leads())
    replay.play(replies["V1/q"])
    first, second = ("".join(d.text for d in replay.stream([1], max_tokens=200, stop=[])) for _ in range(2))
    assert (first, second) == ("3] Tiêu đề.", "1], hai.")  # each without the lead it was primed with
    assert replay.replayed == 1 and "Theo nguồn [" in replay.leads
    report = AnswerReport("toy", "c", "m", tuple(load_rows(str(saved))))
    assert report.figures()["second_attempts"] == 0.5  # of the two replies the model wrote


def test_an_unreadable_recording_is_a_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "rows.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(RagError, match="cannot read recorded replies"):
        recorded_replies(str(broken))


def test_drop_kinds_lose_their_figures() -> None:
    assert drop_kind("overlap 0.07 < 0.50 with [1]") == "overlap"
    assert drop_kind("number 9 not in [2]") == "number"
    assert drop_kind("echoes the question: 1 word(s) of [1] beyond it") == "echoes the question"
    assert drop_kind("does not answer the question: 0.10 of its words") == "does not answer the question"
    assert drop_kind("adds a negation to [1]") == "adds a negation to"
    assert drop_kind("copies a source heading") == "copies a source heading"
