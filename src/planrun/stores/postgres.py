"""The PostgreSQL store: the same rows in a server several machines share.

Connections come from a psycopg 3 ``AsyncConnectionPool``; every call is one transaction
(a read of a whole run sees one snapshot); a limiter's take, give and defer are each one
statement on its own (autocommit).

A dropped connection is the pool's to replace; a call that fails with a connection error
(or a deadlock or serialization failure, a lock wait past ``lock_timeout``, a session cut off
by ``idle_in_transaction_session_timeout``) is run again, whole, a few times with backoff
(tenacity) before it becomes a :class:`~planrun.StoreError`. A retried write whose
first commit reached the server before the connection dropped stores its events once
(one event per ``(run, seq)``).

No writer waits for another to number its events
-------------------------------------------------
A store-made event (an ``effect`` from :meth:`PostgresStore.append_event` or
:meth:`PostgresStore.effect_done`) takes ``seq_base + nextval('planrun_event_seq')``: a
sequence hands out distinct, increasing numbers without a lock held to commit, so a writer
stopped inside its transaction (SIGSTOP, a long GC pause, a stalled VM) holds only the rows
it is changing. ``seq_base`` is kept past every seq a caller numbered itself (the
supervisor numbers its own ledger; a run has one driver at a time, see the owner lease), so
the two never meet. Store-made seqs are unique and increasing per run, not dense, and a
later one may commit first. A batch its caller numbered moves ``seq_base`` past its events,
so it holds the run's row until it commits: the run's next batch, or a process taking the
run over, waits for it (at most until the server cuts a stopped session off, below).

Every connection sets ``idle_in_transaction_session_timeout`` (default 10 s) and
``lock_timeout`` (default 5 s): the server cuts off a session that sits idle inside a
transaction, rolling it back and releasing its locks, so a stopped process cannot hold
anything for long, and a call waiting for a lock gives up (and is retried) rather than
wait behind it. Both are constructor arguments; ``None`` keeps the server's setting.

psycopg is imported only when a store is made, so planrun imports without the
``postgres`` extra; without it, :class:`PostgresStore` raises
:class:`~planrun.core.ConfigError`.
"""

from __future__ import annotations

from planrun.stores._postgres_shared import _PostgresShared

__all__ = ["PostgresStore"]


class PostgresStore(_PostgresShared):
    """A :class:`~planrun.stores.base.Store` in PostgreSQL.

    Args:
        url: a libpq URL, ``postgresql://user:password@host:port/db`` (``postgres://`` too);
            tables go to the first schema of the connection's ``search_path``, which an
            ``?options=-csearch_path%3Dname`` query can set.
        min_size, max_size: the connection pool's bounds.
        connect_timeout: seconds to wait for a connection when opening.
        pool_timeout: seconds a call waits for a free (or re-established) connection.
        attempts: tries of a call that fails with a connection error, before StoreError.
        application_name: how the connections appear in ``pg_stat_activity``.
        lock_timeout: seconds a statement waits for a lock before it fails (and the call is
            retried); ``None`` keeps the server's setting.
        idle_in_transaction_timeout: seconds after which the server cuts off one of these
            sessions sitting idle inside a transaction (its process stopped), rolling the
            transaction back; ``None`` keeps the server's setting.
    """

