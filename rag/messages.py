"""Every string of the Ask page, in English and Vietnamese: the page speaks the question's language.

``say(language, key, **values)`` fills ``{name}`` placeholders with ``str.format``; a language
without a table (anything but "vi") gets English. Both tables hold the same keys and the same
placeholders (tests/test_messages.py checks it), so a string cannot be missing in one language.
"""

from __future__ import annotations

MESSAGES: dict[str, dict[str, str]] = {
    "en": {
        "title": "Ask",
        "caption": "Answers come only from the documents of “{collection}” that **{groups}** may read "
        "(change *viewing as* in the sidebar). Click a [n] to open the passage it cites.",
        "caption_team": "Answers come only from the documents of “{collection}” that you (**{groups}**) may read. "
        "Click a [n] to open the passage it cites.",
        "nothing_indexed": "Nothing is indexed yet: add documents on the Documents page, or run `rag demo`.",
        "indexed": "**{documents}** documents in “{collection}” · {chunks} passages · searched with {model}",
        "examples": "Try one of these:",
        "placeholder": "Ask a question about your documents",
        "new_chat": "New chat",
        "stop": "Stop",
        "stopped": "Stopped before the answer was finished.",
        "regenerate": "Ask again",
        "copy": "Copy",
        "copy_help": "The answer as plain text: use the copy button at the top right of the box.",
        "searched_for": "Searched for: {question}",
        "searching": "Searching your documents…",
        "writing": "Reading {count} passage(s) and writing the answer…",
        "no_answer": "I couldn't find this in your documents.",
        "closest": "Closest passages — not an answer",
        "sources": "Sources",
        "open_passage": "Open the passage",
        "extractive": "A quote from your documents: the model's own sentences could not be checked against "
        "them, so this is the passage closest to the question.",
        "unsupported_note": "Some sentences are not supported by their sources (shown struck through).",
        "details": "Details",
        "hidden": "This answer was given to a reader holding {groups}: switch *viewing as* to see it.",
        "hidden_team": "This answer was given to a reader holding {groups}; you may not see it.",
        "page": "page {page}",
        "source_line": "{source}{page} · characters {start}–{end}",
        "hit_line": "distance {distance} · rank {dense} in meaning search · rank {sparse} in keyword search",
        "gate_line": "A passage is used when its distance to the question is below {threshold}; the closest one "
        "here is at {best}. The language model was not asked.",
        "status_line": "{status} · {sources} source(s) · {grounded}",
        "grounded": "every sentence is supported by the source it cites",
        "not_grounded": "some sentences are not supported by their sources",
        "status_answered": "written by the model, checked against the sources",
        "status_extractive": "quoted from the best source",
        "status_no_answer": "not answered",
        "all_hits": "All passages found ({kept} used, {dropped} not used)",
        "spelling_line": "Searched with the spelling mended: {pairs}",
        "rewrite_line": "Follow-up rewritten ({method}, {ms} ms)",
        "error": "Something went wrong: {error}",
        # timings, in pipeline order
        "t_retrieve": "searching",
        "t_rerank": "reranking",
        "t_gate": "relevance check",
        "t_first_token": "first word written",
        "t_first_text": "first sentence shown",
        "t_generate": "writing",
        "t_verify": "checking",
        "t_total": "total",
    },
    "vi": {
        "title": "Hỏi",
        "caption": "Câu trả lời chỉ lấy từ các tài liệu của “{collection}” mà **{groups}** được đọc "
        "(đổi *xem với tư cách* ở thanh bên). Bấm vào [n] để mở đoạn được trích dẫn.",
        "caption_team": "Câu trả lời chỉ lấy từ các tài liệu của “{collection}” mà bạn (**{groups}**) được đọc. "
        "Bấm vào [n] để mở đoạn được trích dẫn.",
        "nothing_indexed": "Chưa có gì được lập chỉ mục: hãy thêm tài liệu ở trang Documents, hoặc chạy `rag demo`.",
        "indexed": "**{documents}** tài liệu trong “{collection}” · {chunks} đoạn · tìm kiếm bằng {model}",
        "examples": "Thử một trong các câu hỏi sau:",
        "placeholder": "Đặt câu hỏi về tài liệu của bạn",
        "new_chat": "Cuộc trò chuyện mới",
        "stop": "Dừng",
        "stopped": "Đã dừng trước khi câu trả lời viết xong.",
        "regenerate": "Hỏi lại",
        "copy": "Sao chép",
        "copy_help": "Câu trả lời dạng văn bản thuần: dùng nút sao chép ở góc trên bên phải của khung.",
        "searched_for": "Đã tìm: {question}",
        "searching": "Đang tìm trong tài liệu của bạn…",
        "writing": "Đang đọc {count} đoạn và viết câu trả lời…",
        "no_answer": "Tôi không tìm thấy điều này trong tài liệu của bạn.",
        "closest": "Những đoạn gần nhất — không phải câu trả lời",
        "sources": "Nguồn",
        "open_passage": "Mở đoạn trích",
        "extractive": "Trích nguyên văn từ tài liệu của bạn: không kiểm chứng được các câu do mô hình viết, "
        "nên đây là đoạn gần với câu hỏi nhất.",
        "unsupported_note": "Một số câu không được nguồn của chúng xác nhận (hiển thị gạch ngang).",
        "details": "Chi tiết",
        "hidden": "Câu trả lời này dành cho người đọc thuộc nhóm {groups}: đổi *xem với tư cách* để xem.",
        "hidden_team": "Câu trả lời này dành cho người đọc thuộc nhóm {groups}; bạn không được xem.",
        "page": "trang {page}",
        "source_line": "{source}{page} · ký tự {start}–{end}",
        "hit_line": "khoảng cách {distance} · hạng {dense} khi tìm theo nghĩa · hạng {sparse} khi tìm theo từ khóa",
        "gate_line": "Một đoạn chỉ được dùng khi khoảng cách tới câu hỏi nhỏ hơn {threshold}; đoạn gần nhất ở đây "
        "có khoảng cách {best}. Mô hình ngôn ngữ không được hỏi.",
        "status_line": "{status} · {sources} nguồn · {grounded}",
        "grounded": "mọi câu đều được nguồn trích dẫn xác nhận",
        "not_grounded": "một số câu không được nguồn của chúng xác nhận",
        "status_answered": "do mô hình viết, đã đối chiếu với nguồn",
        "status_extractive": "trích từ nguồn phù hợp nhất",
        "status_no_answer": "không có câu trả lời",
        "all_hits": "Tất cả các đoạn tìm được ({kept} được dùng, {dropped} không được dùng)",
        "spelling_line": "Đã tìm với chính tả được sửa: {pairs}",
        "rewrite_line": "Câu hỏi nối tiếp đã được viết lại ({method}, {ms} ms)",
        "error": "Đã xảy ra lỗi: {error}",
        "t_retrieve": "tìm kiếm",
        "t_rerank": "xếp hạng lại",
        "t_gate": "kiểm tra độ liên quan",
        "t_first_token": "từ đầu tiên",
        "t_first_text": "câu đầu tiên hiển thị",
        "t_generate": "viết",
        "t_verify": "kiểm chứng",
        "t_total": "tổng",
    },
}

LANGUAGES = tuple(MESSAGES)


def say(language: str, key: str, **values: object) -> str:
    """The string ``key`` in ``language`` (English when there is no table for it), filled in.

    Raises:
        KeyError: no such key.
    """
    table = MESSAGES.get(language, MESSAGES["en"])
    return table[key].format(**values) if values else table[key]


__all__ = ["LANGUAGES", "MESSAGES", "say"]
