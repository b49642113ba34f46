-- 0006_chat: the Ask page's conversations (issue 18), kept across reloads. One row per answered
-- question of a chat; a chat belongs to one collection. `user_id` is NULL in desktop mode (one
-- person per database); team mode may later keep chats per signed-in user.
-- Times are UTC text in the format of every other table ('%Y-%m-%dT%H:%M:%fZ').

CREATE TABLE chat_turns (
    id         INTEGER PRIMARY KEY,
    collection TEXT NOT NULL,                -- the collection's name (a chat outlives a re-index)
    chat_id    TEXT NOT NULL,                -- rag.conversation.new_chat_id()
    user_id    INTEGER REFERENCES users(id) ON DELETE SET NULL,
    question   TEXT NOT NULL,                -- as the reader typed it
    searched   TEXT NOT NULL,                -- the standalone question that was searched (follow-ups rewritten)
    answer     TEXT NOT NULL,                -- the rag.models.Answer as JSON (rag.conversation.answer_to_json)
    groups     TEXT NOT NULL DEFAULT '["all"]',  -- JSON array: the reader's groups when it was asked
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX chat_turns_chat ON chat_turns (collection, user_id, chat_id, id);
