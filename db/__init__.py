"""Numbered schema migrations for the rag-desk SQLite file (applied by ``rag.store.migrate``)."""
