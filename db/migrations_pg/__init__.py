"""Numbered schema migrations for a rag-desk PostgreSQL database (applied by ``rag.pg.migrate``)."""
