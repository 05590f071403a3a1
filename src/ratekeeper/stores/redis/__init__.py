"""The Redis / Valkey store (standalone, Sentinel, Cluster): one Lua script call per decision.

- ``url``: the URLs and options; ``sansio``: what to send for a list of ops and how to read
  the replies, and redis-py's errors translated to ours (no I/O);
- ``script`` and ``lua/``: the Lua, one file per algorithm, loaded once as a Functions library
  and called by ``FCALL`` (by ``EVALSHA`` where the server has no Functions);
- ``calls_async`` (the source) and ``calls`` (generated from it): the calls themselves;
- ``store`` (threads) and ``store_async`` (asyncio): the shells, which only add how each
  waits its turn (``ratekeeper.stores.coalescing``).

redis-py is imported only when a store is opened (the ``redis`` extra).
"""
