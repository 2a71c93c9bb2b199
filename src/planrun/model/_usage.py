"""Tokens, money and budgets: what every model call spent, summed per key and per run.

One :class:`Usage` meter belongs to a run. Every HTTP attempt a :class:`~planrun.Model` makes
is recorded on it as a :class:`UsageRecord` (failed attempts too, with zero tokens, so that
retries show up in ``requests``). Records are summed for the run and for each key the record
carries; keys are plain strings chosen by the caller, by convention a task id, a worker name
and ``"decompose"``::

    usage = Usage(budget=Budget(max_cost=2.00))
    await model.complete(messages, meter=usage.scoped("decompose"))
    await model.complete(messages, meter=usage.scoped(task.id, worker.name))
    usage.total.cost_usd, usage["decompose"].total_tokens

Cost comes from a :class:`PriceTable` (USD per million tokens: input, cached input, output).
A model the table does not know costs 0 and is listed in :attr:`Usage.unpriced_models`, so a
money budget is never silently trusted for it.

A :class:`Budget` is checked *before* each request against what was spent, plus what calls
in flight have reserved, plus a conservative estimate of the next call
(:func:`estimate_tokens`); when it would be exceeded, :class:`~planrun.BudgetExceeded`
is raised and no request is made. With ``shared=`` (a :class:`~planrun.model.SharedBudget`)
the check is also made against the run's budget in its store, which every process of the
run draws on (:meth:`Usage.areserve`), and what was used is added there.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planrun.core import BudgetExceeded, UsageError
from planrun.model._budget import Budget, Tally

if TYPE_CHECKING:
    from planrun.model._limits import SharedBudget

__all__ = [
    "BATCH_PRICE",
    "DEFAULT_PRICES",
    "PRICED_TIERS",
    "Budget",
    "Price",
    "PriceTable",
    "Reservation",
    "Tally",
    "Usage",
    "UsageRecord",
    "estimate_tokens",
]

log = logging.getLogger("planrun.usage")

CHARS_PER_TOKEN = 3
"""Conservative: English text averages about 4 characters per token."""

MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens the chat format adds around each message."""


BATCH_PRICE = 0.5
"""The Batch API and the flex tier bill this fraction of the list price."""

PRICED_TIERS = ("batch", "flex", "default", "priority")
"""The tiers a usage record may name (see :mod:`planrun.core.scheduling`'s tiers)."""


@dataclass(frozen=True)
class Price:
    """USD per one million tokens; ``priority``: the same three figures at the priority
    tier, for a model sold at it (None: the model has no priority price)."""

    input: float
    cached_input: float
    output: float
    priority: tuple[float, float, float] | None = None

    def at(self, tier: str) -> Price | None:
        """The price at ``tier``: ``priority`` at its own figures (None when the model has
        none), ``flex`` and ``batch`` at the list figures (their discount is a fraction of
        them: :data:`BATCH_PRICE`), ``default`` as listed."""
        if tier == "priority":
            return None if self.priority is None else Price(*self.priority)
        return self

    def cost(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
        """Cost in USD; cached prompt tokens are billed at ``cached_input`` instead of ``input``."""
        uncached = max(0, prompt_tokens - cached_tokens)
        per_million = (
            uncached * self.input
            + cached_tokens * self.cached_input
            + completion_tokens * self.output
        )
        return per_million / 1_000_000


DEFAULT_PRICES: Mapping[str, Price] = {
    "gpt-4o-mini": Price(0.15, 0.075, 0.60, (0.25, 0.125, 1.00)),
    "gpt-4o": Price(2.50, 1.25, 10.00, (4.25, 2.125, 17.00)),
    "gpt-4.1": Price(2.00, 0.50, 8.00, (3.50, 0.875, 14.00)),
    "gpt-4.1-mini": Price(0.40, 0.10, 1.60, (0.70, 0.175, 2.80)),
    "gpt-4.1-nano": Price(0.10, 0.025, 0.40, (0.20, 0.05, 0.80)),
    "o4-mini": Price(1.10, 0.275, 4.40, (2.00, 0.50, 8.00)),
    "o3": Price(2.00, 0.50, 8.00, (3.50, 0.875, 14.00)),
    "gpt-5": Price(1.25, 0.125, 10.00, (2.50, 0.25, 20.00)),
    "gpt-5-mini": Price(0.25, 0.025, 2.00, (0.45, 0.045, 3.60)),
    "gpt-5-nano": Price(0.05, 0.005, 0.40),
    "test": Price(0.0, 0.0, 0.0),
}
"""Published list prices (USD per 1M tokens) of a few current models, with their priority
tier's where one is sold; override as needed. ``test`` is
:class:`planrun.testing.TestModel`, the offline model: it costs nothing."""


_SNAPSHOT = re.compile(r"(.+?)-(\d{4}-\d{2}-\d{2}|\d{4})")


class PriceTable:
    """Model name -> :class:`Price`, matching dated snapshots to their model.

    ``gpt-4o-mini-2024-07-18`` (and ``gpt-4-0613``) are priced as the name before the date.
    Other variants (``gpt-4o-audio-preview``) are priced only when listed: a model billed
    at another rate is better reported unpriced than priced wrong.
    """

    def __init__(
        self,
        prices: Mapping[str, Price | tuple[Any, ...]] | None = None,
        *,
        defaults: bool = True,
    ) -> None:
        table: dict[str, Price] = dict(DEFAULT_PRICES) if defaults else {}
        for name, price in (prices or {}).items():
            table[name] = price if isinstance(price, Price) else Price(*price)
        self._prices = table

    @classmethod
    def of(
        cls, prices: PriceTable | Mapping[str, Price | tuple[Any, ...]] | None
    ) -> PriceTable:
        """Normalise a table, a mapping of extra prices, or ``None`` (the defaults)."""
        return prices if isinstance(prices, PriceTable) else cls(prices)

    def lookup(self, model: str) -> Price | None:
        """The price of ``model``, or ``None`` when the table does not know it."""
        if model in self._prices:
            return self._prices[model]
        snapshot = _SNAPSHOT.fullmatch(model)
        return self._prices.get(snapshot.group(1)) if snapshot else None

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.lookup(model) is not None

    def cost(self, model: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
             *, tier: str = "default", price: float | None = None) -> float | None:
        """What one request of ``model`` served at ``tier`` costs (None: unpriced).

        ``price``: the fraction of the tier's figures billed (default: :data:`BATCH_PRICE`
        at ``flex`` and ``batch``, else 1). A request served at ``priority`` for a model
        without a priority price is priced at its list price (a run refuses the priority
        tier for such a model before it starts: :meth:`check_tier`)."""
        listed = self.lookup(model)
        if listed is None:
            return None
        at = listed.at(tier) or listed
        if price is None:
            price = BATCH_PRICE if tier in ("flex", "batch") else 1.0
        return at.cost(prompt_tokens, cached_tokens, completion_tokens) * price

    def check_tier(self, model: str, tier: str) -> None:
        """A :class:`~planrun.core.UsageError` in one line when ``model`` cannot be priced
        at ``tier`` (``priority`` for a model the table knows without a priority price)."""
        if tier not in PRICED_TIERS:
            raise UsageError(f"unknown tier {tier!r}: tiers are {', '.join(PRICED_TIERS)}")
        listed = self.lookup(model)
        if tier == "priority" and listed is not None and listed.priority is None:
            raise UsageError(f"model {model!r} has no priority price: give one in the price "
                             f"table (Price(..., priority=(input, cached, output))) or leave "
                             f"'priority' out of the tiers")


@dataclass(frozen=True)
class UsageRecord:
    """One HTTP request: what it used and cost, and what it was for."""

    model: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    priced: bool = True
    """False when the price table did not know the model (``cost_usd`` is then 0)."""
    keys: tuple[str, ...] = ()
    prompt_hash: str | None = None
    request_id: str | None = None
    error: str | None = None
    """Name of the error class when the request failed (tokens are then usually 0)."""
    reasoning_tokens: int = 0
    """Of ``completion_tokens``, those a reasoning model spent thinking (billed as output)."""
    tier: str = "default"
    """The tier that served the request (as its answer said; ``batch`` for a Batch API
    line), which priced it."""
    latency_s: float | None = None
    """Seconds from sending the request to its answer (None when not measured)."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def tally(self) -> Tally:
        """This record as a one-request :class:`Tally`."""
        return Tally(
            1, self.prompt_tokens, self.cached_tokens, self.completion_tokens, self.cost_usd
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (:meth:`from_dict` reads it back)."""
        return {**self.__dict__, "keys": list(self.keys)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UsageRecord:
        """A record from :meth:`to_dict` output (sent by another process)."""
        known = {f for f in cls.__dataclass_fields__ if f in data}
        return cls(**{**{k: data[k] for k in known}, "keys": tuple(data.get("keys") or ())})


def estimate_tokens(
    messages: Sequence[Mapping[str, Any]], *, extra_text: str = "", max_completion: int = 0
) -> int:
    """A deliberately high estimate of the tokens one request may use.

    Counts one token per :data:`CHARS_PER_TOKEN` characters of every message (and of
    ``extra_text``, such as a response schema), a per-message overhead, and the
    completion allowance ``max_completion``.
    """
    chars = len(extra_text)
    for message in messages:
        content = message.get("content")
        chars += len(content) if isinstance(content, str) else len(json.dumps(content, default=str))
    prompt = math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1)
    return prompt + max(0, max_completion)


@dataclass
class _Ledger:
    """State shared by a meter and all its scoped views."""

    prices: PriceTable
    budget: Budget | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    records: list[UsageRecord] = field(default_factory=list)
    total: Tally = field(default_factory=Tally)
    by_key: dict[str, Tally] = field(default_factory=dict)
    reserved_tokens: int = 0
    reserved_cost: float = 0.0
    unpriced: set[str] = field(default_factory=set)
    shared: SharedBudget | None = None
    listeners: list[Callable[[UsageRecord], None]] = field(default_factory=list)


class Reservation:
    """Tokens and money held back for one request in flight; release it when it ends.

    A reservation taken with :meth:`Usage.areserve` from a shared budget also holds them
    in the store: :meth:`used` notes what the request really used, and :meth:`aclose`
    gives the reservation back there and adds what was used.
    """

    def __init__(self, ledger: _Ledger, tokens: int, cost: float) -> None:
        self._ledger = ledger
        self.tokens = tokens
        self.cost = cost
        self._open = True
        self._shared: SharedBudget | None = None
        self._used = Tally()

    def release(self) -> None:
        """Give the reservation back in this process (idempotent)."""
        with self._ledger.lock:
            if self._open:
                self._ledger.reserved_tokens -= self.tokens
                self._ledger.reserved_cost -= self.cost
                self._open = False

    def used(self, record: UsageRecord) -> None:
        """Note a request this reservation covered (settled into the store by aclose)."""
        self._used = self._used + record.tally()

    async def aclose(self) -> None:
        """Release, and settle a shared reservation with what was used (idempotent)."""
        self.release()
        shared, self._shared = self._shared, None
        if shared is not None:
            await shared.settle(self.tokens, self.cost, self._used)


class Usage:
    """The usage meter of a run: records every request, sums per key, enforces a budget.

    Safe to share between the coroutines of one loop and between threads (one lock guards
    it). :meth:`scoped` returns a view that shares everything but adds keys to what it records.
    """

    def __init__(
        self,
        prices: PriceTable | Mapping[str, Price | tuple[Any, ...]] | None = None,
        budget: Budget | None = None,
        *,
        shared: SharedBudget | None = None,
    ) -> None:
        self._ledger = _Ledger(PriceTable.of(prices), budget, shared=shared)
        self._keys: tuple[str, ...] = ()

    def __repr__(self) -> str:
        t = self.total
        return (
            f"Usage(keys={self._keys!r}, requests={t.requests}, tokens={t.total_tokens}, "
            f"cost_usd={t.cost_usd:.6f})"
        )

    def scoped(self, *keys: str) -> Usage:
        """A view of this meter whose records also count under ``keys``."""
        view = Usage.__new__(Usage)
        view._ledger = self._ledger
        view._keys = (*self._keys, *(k for k in keys if k not in self._keys))
        return view

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys this view adds to every record."""
        return self._keys

    @property
    def budget(self) -> Budget | None:
        """The run's budget, if any."""
        return self._ledger.budget

    @property
    def shared(self) -> SharedBudget | None:
        """The run's budget in its store, shared with every process of the run, if any."""
        return self._ledger.shared

    @property
    def prices(self) -> PriceTable:
        """The price table used for cost."""
        return self._ledger.prices

    def record(
        self,
        model: str,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        cached_tokens: int = 0,
        prompt_hash: str | None = None,
        request_id: str | None = None,
        error: str | None = None,
        keys: Iterable[str] = (),
        reasoning_tokens: int = 0,
        price: float | None = None,
        tier: str = "default",
        latency_s: float | None = None,
    ) -> UsageRecord:
        """Record one request and return its :class:`UsageRecord` (with its cost).

        ``tier`` is the tier that served it (``default``, ``flex``, ``priority``, ``batch``),
        priced at it (:meth:`PriceTable.cost`); ``price`` the fraction of that tier's figures
        billed (default: half at ``flex`` and ``batch``). ``latency_s``: how long it took."""
        cost = self._ledger.prices.cost(model, prompt_tokens, cached_tokens, completion_tokens,
                                        tier=tier, price=price)
        listed = cost is not None
        all_keys = (*self._keys, *(k for k in keys if k not in self._keys))
        rec = UsageRecord(
            model,
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            cost or 0.0,
            listed,
            all_keys,
            prompt_hash,
            request_id,
            error,
            reasoning_tokens,
            tier,
            latency_s,
        )
        self._add(rec)
        return rec

    def add(self, rec: UsageRecord | Mapping[str, Any]) -> UsageRecord:
        """Add a record made elsewhere (a worker process's, or its :meth:`UsageRecord.to_dict`
        form), priced as it was there; this view's keys are added to its own. Returns the
        record as added."""
        if not isinstance(rec, UsageRecord):
            rec = UsageRecord.from_dict(rec)
        keys = (*rec.keys, *(k for k in self._keys if k not in rec.keys))
        added = dataclasses.replace(rec, keys=keys)
        self._add(added)
        return added

    def listen(self, listener: Callable[[UsageRecord], None]) -> Callable[[], None]:
        """Call ``listener`` with every record added from now on, to this meter or any of
        its views (on the thread that adds it); returns the call that stops it."""
        ledger = self._ledger
        with ledger.lock:
            ledger.listeners.append(listener)

        def stop() -> None:
            with ledger.lock:
                if listener in ledger.listeners:
                    ledger.listeners.remove(listener)

        return stop

    def _add(self, rec: UsageRecord) -> None:
        ledger = self._ledger
        tally = rec.tally()
        with ledger.lock:
            ledger.records.append(rec)
            ledger.total = ledger.total + tally
            for key in rec.keys:
                ledger.by_key[key] = ledger.by_key.get(key, Tally()) + tally
            first_unpriced = not rec.priced and rec.model not in ledger.unpriced
            if first_unpriced:
                ledger.unpriced.add(rec.model)
            listeners = list(ledger.listeners)
        if first_unpriced:
            log.warning("no price for model %r: its cost is counted as 0", rec.model)
        for listener in listeners:
            listener(rec)

    def estimate_cost(self, model: str, prompt_tokens: int, completion_tokens: int,
                      price: float | None = None, tier: str = "default") -> float:
        """Upper-bound cost of a request at ``tier`` (no cache discount); 0 for an unpriced
        model. ``price``: the fraction of the tier's figures billed (see :meth:`record`)."""
        cost = self._ledger.prices.cost(model, prompt_tokens, 0, completion_tokens, tier=tier,
                                        price=price)
        return cost or 0.0

    def reserve(self, model: str, prompt_tokens: int, completion_tokens: int,
                price: float | None = None, tier: str = "default") -> Reservation:
        """Check the budget for a request of this size and hold it back while it runs.

        Raises :class:`~planrun.BudgetExceeded` (and reserves nothing) when what was
        spent, plus what is reserved, plus this request could pass a limit.
        """
        return self._reserve(model, prompt_tokens, completion_tokens, check=True, price=price,
                             tier=tier)

    def _reserve(
        self, model: str, prompt_tokens: int, completion_tokens: int, *, check: bool,
        price: float | None = None, tier: str = "default",
    ) -> Reservation:
        tokens = prompt_tokens + completion_tokens
        cost = self.estimate_cost(model, prompt_tokens, completion_tokens, price, tier)
        ledger = self._ledger
        with ledger.lock:
            if check:
                self._check(tokens, cost)
            ledger.reserved_tokens += tokens
            ledger.reserved_cost += cost
        return Reservation(ledger, tokens, cost)

    async def areserve(self, model: str, prompt_tokens: int, completion_tokens: int,
                       price: float | None = None, tier: str = "default") -> Reservation:
        """:meth:`reserve`, or with a shared budget the same reservation taken there.

        The shared budget holds what every process of the run spent (this one's too), so
        it alone decides; a request that fits what is left waits there for calls in flight
        to settle. Raises :class:`~planrun.BudgetExceeded` (and holds nothing back)
        when the budget cannot afford the request. Close the reservation with
        :meth:`Reservation.aclose`.
        """
        shared = self._ledger.shared
        enforced = shared is not None and shared.enforce
        reservation = self._reserve(model, prompt_tokens, completion_tokens, check=not enforced,
                                    price=price, tier=tier)
        if shared is not None:
            try:
                await shared.reserve(reservation.tokens, reservation.cost)
            except BaseException:
                reservation.release()
                raise
            reservation._shared = shared
        return reservation

    def _check(self, tokens: int, cost: float) -> None:
        ledger, budget = self._ledger, self._ledger.budget
        if budget is None:
            return
        used_tokens, used_cost = ledger.total.total_tokens, ledger.total.cost_usd
        if budget.max_tokens is not None and (
            used_tokens + ledger.reserved_tokens + tokens > budget.max_tokens
        ):
            raise BudgetExceeded(
                f"token budget exceeded: the next call may use up to {tokens} tokens; "
                f"{used_tokens} used and {ledger.reserved_tokens} reserved "
                f"of {budget.max_tokens}"
            )
        if budget.max_cost is not None and (
            used_cost + ledger.reserved_cost + cost > budget.max_cost
        ):
            raise BudgetExceeded(
                f"cost budget exceeded: the next call may cost up to ${cost:.6f}; "
                f"${used_cost:.6f} spent and ${ledger.reserved_cost:.6f} reserved "
                f"of ${budget.max_cost:.6f}"
            )

    @property
    def total(self) -> Tally:
        """Sums over every record of the run (not only this view's)."""
        with self._ledger.lock:
            return self._ledger.total

    def by_tier(self) -> dict[str, Tally]:
        """Sums per tier that served the requests (``default``, ``flex``, ``priority``,
        ``batch``), cheapest first; a tier that served none is absent."""
        with self._ledger.lock:
            records = list(self._ledger.records)
        sums: dict[str, Tally] = {}
        for rec in records:
            sums[rec.tier] = sums.get(rec.tier, Tally()) + rec.tally()
        order = {t: i for i, t in enumerate(PRICED_TIERS)}
        return dict(sorted(sums.items(), key=lambda item: order.get(item[0], len(order))))

    def by_key(self) -> dict[str, Tally]:
        """Sums per key, for every key seen."""
        with self._ledger.lock:
            return dict(self._ledger.by_key)

    def __getitem__(self, key: str) -> Tally:
        """Sums for one key (an empty :class:`Tally` for a key never seen)."""
        with self._ledger.lock:
            return self._ledger.by_key.get(key, Tally())

    @property
    def records(self) -> tuple[UsageRecord, ...]:
        """Every record of the run, in order."""
        with self._ledger.lock:
            return tuple(self._ledger.records)

    @property
    def unpriced_models(self) -> frozenset[str]:
        """Models that were used but have no price: their cost was counted as 0."""
        with self._ledger.lock:
            return frozenset(self._ledger.unpriced)
