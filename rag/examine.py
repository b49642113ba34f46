"""A second reader of the shown answer: does it give what the question asks? (issue 15, item 6)

Verification (``rag.verify``) checks that each sentence is *supported* by the passage it cites:
its words, numbers and negations are there. It cannot see a true sentence that does not answer
("According to [1], the port is a port on which the program is already in use" for "How do I
start the app on another port?"). Here an instruct model reads only the question and the
answer as shown (citation markers and the "According to [n]," lead removed) and gives the
log-odds of "yes" against "no" as its next token, ``log P(yes) - log P(no)``. The value is one of
the answer-or-refuse decision's signals (``rag.decide``, ``lm_logodds``); it decides nothing
alone.

No source goes in the prompt: the support check is verification's job, and a short prompt is
what keeps this affordable on a CPU (~80 tokens; `rag bench`: 2.5-2.8 s p50 with Qwen2.5-Coder-1.5B on 2 cores).
Measured on the labelled sentences of ``tests/data/verify_labelled.json`` (ROC AUC, right
against wrong): Qwen2.5-Coder-0.5B 0.60, 1.5B 0.75; giving the 0.5B the cited passage too: 0.61.
"""

from __future__ import annotations

import re

from rag.generate import NO, YES, load_prompt
from rag.llm import LanguageModel
from rag.rerank import yes_no_log_odds

_MARKERS = re.compile(r"(?:According to|Theo)\s*\[\d+\]\s*,?\s*|\s*\[\d+\]")  # removed, not replaced
ANSWER_CHARS = 1200  # a quoted passage is cut here: its opening is what answers, if anything does


def answer_for_examiner(text: str) -> str:
    """The shown answer without citation markers and their lead, at most ``ANSWER_CHARS``."""
    return " ".join(_MARKERS.sub("", text).split())[:ANSWER_CHARS]


def examine_answer(llm: LanguageModel, question: str, answer: str) -> float | None:
    """The model's yes/no log-odds that ``answer`` gives what ``question`` asks; None when the
    answer is empty or the model's vocabulary has neither word as a single token."""
    shown = answer_for_examiner(answer)
    if not shown:
        return None
    user = load_prompt("examine_user").strip().format(question=question.strip(), answer=shown)
    chat = llm.format_chat([
        {"role": "system", "content": load_prompt("examine_system").strip()},
        {"role": "user", "content": user},
    ])
    logprobs = llm.next_token_logprobs(chat.text, [*YES, *NO])
    yes = [v for k, v in logprobs.items() if k in YES]
    no = [v for k, v in logprobs.items() if k in NO]
    if not yes or not no:
        return None
    return yes_no_log_odds(yes, no)


__all__ = ["ANSWER_CHARS", "answer_for_examiner", "examine_answer"]
