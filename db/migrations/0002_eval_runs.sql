-- 0002_eval_runs: evaluation history (rag.evaluate), read by the Evaluation page.
-- One row per `rag eval` run with the configuration it measured, and one row per query and
-- stage, so a page can chart a metric over time and list the queries that flipped since the
-- previous run. `collection` is a name, not a foreign key: history outlives a rebuilt collection.

CREATE TABLE eval_runs (
    id                    INTEGER PRIMARY KEY,
    created_at            TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    collection            TEXT NOT NULL,
    embedder              TEXT NOT NULL,     -- embedding model id stamped on the collection
    strategy              TEXT NOT NULL,     -- chunking strategy of the collection (A-F, R)
    stages                TEXT NOT NULL,     -- JSON list, e.g. ["dense", "fts", "hybrid"]
    ks                    TEXT NOT NULL,     -- JSON list of cut-offs, e.g. [1, 4, 8, 20]
    gate_stage            TEXT NOT NULL,     -- the stage whose hits the gate sweep used
    threshold             REAL NOT NULL,     -- gate threshold in force during the run
    recommended_threshold REAL NOT NULL,     -- the sweep's recommendation
    max_sources           INTEGER NOT NULL,
    git_commit            TEXT,              -- NULL outside a git checkout
    golden_name           TEXT NOT NULL,     -- golden set file stem
    golden_hash           TEXT NOT NULL,     -- sha256 of the golden set file
    queries               INTEGER NOT NULL,
    leaks                 INTEGER NOT NULL,  -- must be 0
    destroyed             INTEGER NOT NULL,  -- answerable queries whose needle no chunk holds whole
    settings              TEXT NOT NULL,     -- JSON of the Settings used
    summary               TEXT NOT NULL      -- JSON report without per_query (docs/eval-json-schema.md)
);
CREATE INDEX eval_runs_golden ON eval_runs (golden_name, collection, id);

CREATE TABLE eval_results (
    run_id       INTEGER NOT NULL REFERENCES eval_runs(id) ON DELETE CASCADE,
    query_id     TEXT NOT NULL,              -- "H01/q" (question), "H01/p1" (first paraphrase)
    item_id      TEXT NOT NULL,
    kind         TEXT NOT NULL,              -- answerable | unanswerable | forbidden (for this asker)
    wording      TEXT NOT NULL,              -- "question" | "paraphrase 1" | ...
    query        TEXT NOT NULL,
    groups       TEXT NOT NULL,              -- JSON list: the groups the query was asked as
    stage        TEXT NOT NULL,
    rank         INTEGER,                    -- first relevant hit (1-based); NULL = none retrieved
    min_distance REAL,                       -- smallest cosine distance among the retrieved hits
    destroyed    INTEGER NOT NULL DEFAULT 0,
    leak         INTEGER NOT NULL DEFAULT 0,
    gate         TEXT,                       -- ok | bluff | lost at the current threshold (gate stage only)
    PRIMARY KEY (run_id, query_id, stage)
);
