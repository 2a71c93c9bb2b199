"""One client for chat models, over the ``openai`` SDK: structured output, retries, limits, usage.

:class:`Model` is the only place planrun talks to a model API. One call of
:meth:`Model.complete` is::

    budget check ─► rate limiter ─► HTTP request ─► record usage ─► refusal? ─► parse + validate
         ▲                                  │
         └──── transient error: backoff ◄───┘   (tenacity; Retry-After honoured)

* **Structured output.** Given a pydantic model (or a raw JSON Schema), the request asks for
  ``response_format={"type": "json_schema", "strict": True, ...}`` (Responses API:
  ``text.format``) with a schema made strict-compatible by :func:`strict_schema`
  (``schema="portable"`` also leaves out :data:`VALIDATION_KEYWORDS`); the reply is decoded
  and validated locally against the *original* model/schema, so constraints that strict
  mode cannot express are still enforced. When a server rejects the schema
  (:func:`rejects_schema` knows OpenAI's, vLLM's, Ollama's, llama.cpp's and
  llama-cpp-python's refusals), ``structured="auto"`` falls back *for that schema* to JSON
  mode (``{"type": "json_object", "schema": ...}`` plus the schema in a system message), and
  to the prompt alone if even that is refused; it logs a warning and flags
  ``Completion.fell_back``. ``structured="strict"`` never falls back, ``"json_object"``
  starts in JSON mode.
* **Errors.** :func:`translate_error` is the one map from SDK exceptions to planrun's:
  timeouts, connection errors, 408, 409, 429 and 5xx are transient (retried with exponential
  backoff and jitter, never sooner than the server's ``Retry-After``/``retry-after-ms``);
  400, 401, 403, 404, 422, ``context_length_exceeded``, ``insufficient_quota`` and a
  schema rejection are permanent (one request, then fail). A broken connection beneath the
  SDK is transient; a 200 whose body is not a completion is permanent; nothing foreign
  leaves. The SDK's own retries are off (``max_retries=0``).
* **Loops.** One SDK client (one connection pool) per event loop, closed when the loop shuts
  down, so one ``Model`` serves any number of sync calls, async calls and threads.
* **Waiting** is ``asyncio.sleep`` on the running loop, so under
  :class:`planrun.runtime.VirtualClock` backoffs and rate limits take no real time.
* **Batch mode.** :meth:`Model.batched` makes a twin whose calls go to the Batch API through a
  :class:`Batcher` (gathered, uploaded, polled, matched back by ``custom_id``), reserved and
  counted at :data:`BATCH_PRICE`; a call the deadline cannot wait for goes live as above.
* **Secrets.** The API key is never in ``repr()``, log lines or error messages
  (:func:`planrun.core.redact`).

The model layer: ``_schema.py`` (strict and portable schemas), ``_errors.py`` (translation
and schema-rejection recognition), ``_client.py`` (:class:`Model`, :class:`Completion`),
``_batch.py`` (batch mode), ``_decompose.py`` (the decomposer and its repair loop),
``_prompts.py`` (prompt templates), ``_workers.py`` (:class:`ModelWorker`), ``_limiter.py``
and ``_limits.py`` (rate limits and budgets, in one process and shared through a store),
``_usage.py`` (usage, prices, cost); this module says what is public. The model layer
decides what a call costs and when it may go; what a task means and when it runs is the
scheduling core's.
"""

from __future__ import annotations

from planrun.core.scheduling import RetryPolicy
from planrun.model._batch import Batcher, Batching, BatchJournal
from planrun.model._client import (
    DEFAULT_COMPLETION_ESTIMATE,
    DEFAULT_MODEL,
    DEFAULT_TIMEOUT,
    PROMPT_HEADER,
    Api,
    Completion,
    Messages,
    Mode,
    Model,
    SchemaMode,
    Structured,
)
from planrun.model._decompose import (
    REPAIR_MODES,
    RepairMode,
    adecompose,
    check_repair,
    decompose,
    plan_bound,
    replanner,
)
from planrun.model._errors import (
    OutputTruncated,
    rejects_schema,
    retry_after_seconds,
    translate_error,
)
from planrun.model._estimate import Estimate, TierCost, estimate_plan, provider_tokens
from planrun.model._limiter import ProviderLimits, RateLimiter
from planrun.model._limits import Limiter, RunLimits, SharedBudget, SharedRateLimiter, limit_key
from planrun.model._prompts import PromptLibrary, RenderedPrompt, default_prompt_dir, describe_kinds
from planrun.model._schema import (
    VALIDATION_KEYWORDS,
    StrictSchema,
    expected_output,
    output_bound,
    portable_schema,
    strict_schema,
)
from planrun.model._tiers import FLEX_REFUSED_CODE, FlexRefused
from planrun.model._usage import (
    BATCH_PRICE,
    Budget,
    Price,
    PriceTable,
    Tally,
    Usage,
    UsageRecord,
)
from planrun.model._workers import ModelWorker

__all__ = [
    "BATCH_PRICE",
    "DEFAULT_COMPLETION_ESTIMATE",
    "DEFAULT_MODEL",
    "DEFAULT_TIMEOUT",
    "FLEX_REFUSED_CODE",
    "PROMPT_HEADER",
    "REPAIR_MODES",
    "VALIDATION_KEYWORDS",
    "Api",
    "BatchJournal",
    "Batcher",
    "Batching",
    "Budget",
    "Completion",
    "Estimate",
    "FlexRefused",
    "Limiter",
    "Messages",
    "Mode",
    "Model",
    "ModelWorker",
    "OutputTruncated",
    "Price",
    "PriceTable",
    "PromptLibrary",
    "ProviderLimits",
    "RateLimiter",
    "RenderedPrompt",
    "RepairMode",
    "RetryPolicy",
    "RunLimits",
    "SchemaMode",
    "SharedBudget",
    "SharedRateLimiter",
    "StrictSchema",
    "Structured",
    "Tally",
    "TierCost",
    "Usage",
    "UsageRecord",
    "adecompose",
    "check_repair",
    "decompose",
    "default_prompt_dir",
    "describe_kinds",
    "estimate_plan",
    "expected_output",
    "limit_key",
    "output_bound",
    "plan_bound",
    "portable_schema",
    "provider_tokens",
    "rejects_schema",
    "replanner",
    "retry_after_seconds",
    "strict_schema",
    "translate_error",
]
