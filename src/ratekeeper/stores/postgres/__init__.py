"""The PostgreSQL store: one statement (one PL/pgSQL function call) per decision.

- ``sansio``: the URL and options, the schema and its migration, what to send for a list
  of ops and how to read the reply, psycopg's errors translated to ours (no I/O);
- ``sql/``: the schema and one file of functions per algorithm, shipped as package data;
- ``calls_async`` (the source) and ``calls`` (generated from it): the statements;
- ``store`` (threads) and ``store_async`` (asyncio): the shells (the pool, the deadline,
  and how each waits its turn, ``ratekeeper.stores.coalescing``).

psycopg is imported only when a store is opened (the ``postgres`` extra).
"""
