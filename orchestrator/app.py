"""The cluster's Celery application: JSON only, late acks, redelivery on worker loss.

Its tasks are the orchestrator's (``evalq.orchestrator.tasks``) and the workers'
(``evalq.workers.tasks``), named in ``include``: the orchestrator sends tasks by name
and imports no worker code. Workers take the broker URL from ``EVALQ_BROKER_URL``;
clients send through ``client_app(url)``. Task results are not kept (job state lives
in Redis under ``evalq.shared.cluster.keys``), so the result backend only serves Flower.
"""

from __future__ import annotations

import redis
from celery import Celery
from celery.backends.redis import RedisBackend, SentinelBackend

from evalq.shared.core.config import (CONTROL_QUEUE, Settings, is_sentinel, redis_tls, sentinel_kwargs,
                                      sentinel_master)


class _SubmitOnly:
    """Result backend of the orchestrator's client app.

    The orchestrator polls job state in Redis and never joins on a task
    result, so it does not subscribe to result pub/sub for every task it
    sends (the stock backend does, and tears down noisily at exit).
    """

    def on_task_call(self, producer, task_id):
        pass

    def on_result_fulfilled(self, result):
        pass  # nothing was subscribed, so nothing to cancel


class SubmitOnlyRedisBackend(_SubmitOnly, RedisBackend):
    pass


class SubmitOnlySentinelBackend(_SubmitOnly, SentinelBackend):
    """The same over a Sentinel-managed Redis (``sentinel://``)."""


def _transport_options(settings: Settings, url: str | None = None) -> dict:
    vt = settings.visibility_timeout
    sentinel = {}
    if is_sentinel(url):  # the primary's name; and how the sentinels themselves are spoken to (TLS)
        tls = sentinel_kwargs(url)
        sentinel = {"master_name": sentinel_master(), **({"sentinel_kwargs": tls} if tls else {})}
    return {
        **sentinel,
        "visibility_timeout": vt,
        # kombu sweeps for messages of dead consumers every interval x
        # throttle seconds (100 s by default); keep that well under the
        # visibility timeout so a lost worker's tasks come back promptly.
        "unacked_restore_interval": max(1, min(10, vt // 4)),
        "unacked_restore_throttle": 1 if vt < 400 else 10,
        # the lock kombu holds while it restores them: a worker killed holding it (SIGKILL, OOM)
        # left it for kombu's 300 s, and nobody restored anything meanwhile (a chaos drill stalled
        # so); a restore takes well under a second, and one run twice only redelivers idempotent tasks
        "unacked_mutex_expire": max(10, min(300, vt)),
    }


def _conf(settings: Settings, broker_url: str | None) -> dict:
    transport = _transport_options(settings, broker_url)
    tls = redis_tls(broker_url)
    return dict(
        # rediss://: broker and result backend verify the server's certificate
        broker_use_ssl=tls,
        redis_backend_use_ssl=tls,
        broker_url=broker_url,
        result_backend=broker_url,
        # Never pickle: a broker that accepts pickle runs code for anyone who can write to it.
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        # A task is acknowledged after it ran; a worker killed mid-task gets it redelivered.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # Cancel running tasks when the broker connection drops: their messages
        # are redelivered, and running them on would duplicate the work.
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport,
        result_backend_transport_options=transport,
        broker_connection_retry_on_startup=True,
        result_expires=settings.result_ttl,
        task_default_queue=CONTROL_QUEUE,
        # Flower shows tasks as they are sent, start and finish.
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_track_started=True,
        worker_hijack_root_logger=False,
    )


def make_app(broker_url: str | None = None) -> Celery:
    settings = Settings.from_env()
    celery_app = Celery("evalq", include=["evalq.workers.tasks", "evalq.orchestrator.tasks"])
    celery_app.conf.update(_conf(settings, broker_url or settings.broker_url))
    return celery_app


app = make_app()

_clients: dict[str, Celery] = {}


def client_app(broker_url: str) -> Celery:
    """An app for sending to (and inspecting) one broker, cached per URL.

    The orchestrator never reconfigures ``app``: Celery caches connection
    pools on first use, so a reconfigured app would keep talking to the old
    broker. Tasks are sent by name, so this app needs no task modules.
    """
    if broker_url not in _clients:
        _clients[broker_url] = Celery("evalq", set_as_current=False)
        _clients[broker_url].conf.update(_conf(Settings.from_env(), broker_url))
        backend = "SubmitOnlySentinelBackend" if is_sentinel(broker_url) else "SubmitOnlyRedisBackend"
        _clients[broker_url].conf.result_backend = f"evalq.orchestrator.app:{backend}+{broker_url}"
    return _clients[broker_url]


_redis: dict[tuple[int, str], "redis.Redis"] = {}


MAX_CONNECTIONS = 1024  # a process's Redis connections at most (made as needed; the server allows 10,000)


def app_redis(celery_app) -> "redis.Redis":
    """The job state's Redis (the broker's) for tasks of ``celery_app``: one connection pool
    per process and URL, created after fork, never shared."""
    import os

    from evalq.shared.core.config import redis_client

    url = celery_app.conf.broker_url
    key = (os.getpid(), url)
    if key not in _redis:
        # a judge worker's threads (its chunks', their items', a panel's members') may each be in a
        # round trip at once: more than redis-py's default pool of 100 connections (issue 73)
        _redis[key] = redis_client(url, max_connections=MAX_CONNECTIONS)
    return _redis[key]


def drop_unreadable_messages() -> None:
    """Make a worker drop (and log) a message it cannot even parse, instead of stopping.

    kombu's Redis transport parses each popped message (JSON, then the base64 body)
    outside Celery's handling of bad messages, so one raw LPUSH of garbage onto a queue
    (anyone who can send a job request can do that) stopped the worker with
    "Unrecoverable error". The message has already left the list when this runs: it is
    not a task, and dropping it loses nothing a producer sent as one.
    """
    import logging

    from kombu.transport import redis as kombu_redis

    channel = kombu_redis.Channel
    if getattr(channel._brpop_read, "evalq_guarded", False):
        return
    read = channel._brpop_read
    log = logging.getLogger("evalq.worker")

    def guarded(self, **options):
        try:
            return read(self, **options)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            log.warning("dropped a message that is not a readable task (%s: %s)", type(exc).__name__,
                        str(exc)[:200])
            return True

    guarded.evalq_guarded = True
    channel._brpop_read = guarded


_stamping = False


def stamp_consumed_queue(on_refused=None) -> None:
    """Make a worker establish, for every message it takes, the queue it really took it from.

    A kombu message on Redis is a JSON document its sender writes whole, ``delivery_info``
    (exchange, routing key) and ``delivery_tag`` included, and kombu trusts them: Celery's
    ``request.delivery_info["routing_key"]`` is whatever the sender wrote, and a message put
    back after its worker died goes to the queue its routing key names. So a tenant that may
    write only ``evalq.jobs.ads`` could push a message there saying ``evalq.jobs.search`` and be
    taken for ``search``. Here the transport's own knowledge (the list BRPOP popped) replaces
    them before Celery or kombu's unacked bookkeeping reads the message: ``delivery_info`` says
    that queue (through the anonymous exchange, so a restore puts the message back exactly
    there), and the delivery tag is a fresh one (a sender's could name another message's entry
    in ``unacked``). A message whose properties are not an object is dropped with a warning.

    A message on a request queue (``evalq.jobs``, ``evalq.jobs.<tenant>``: a tenant may write its
    own) is rebuilt from its task, id and kwargs alone, or refused and answered where it can be
    (``evalq.orchestrator.intake``): nothing else it carries (a canvas, an eta, a stage callback or
    chunk in its place) reaches Celery, so the jobs worker never runs or publishes what it asked.
    ``on_refused(r, refused, queue)`` answers a refused one (``evalq.orchestrator.service``).
    """
    global _stamping
    import logging
    import uuid

    from kombu.transport import redis as kombu_redis

    from evalq.shared.core.config import is_request_queue

    transport = kombu_redis.Transport
    if getattr(transport._deliver, "evalq_stamped", False):
        _stamping = True
        return
    deliver = transport._deliver
    log = logging.getLogger("evalq.worker")

    def stamped(self, message, queue):
        props = message.get("properties") if isinstance(message, dict) else None
        headers = message.get("headers") if isinstance(message, dict) else None
        if not isinstance(props, dict) or (headers is not None and not isinstance(headers, dict)):
            log.warning("dropped a message on %s that is not a readable task (properties are not an object)", queue)
            return None
        if queue and is_request_queue(queue):
            from evalq.orchestrator import intake

            try:
                message = intake.rebuild(message, queue)
            except intake.Refused as refused:
                try:
                    if on_refused is not None:
                        on_refused(app_redis(app), refused, queue)
                    else:
                        log.warning("refused a message on request queue %s: %s", queue, refused.message)
                except Exception as exc:  # noqa: BLE001 - Redis away: the refusal is logged and counted
                    log.warning("could not answer a refused request on %s: %s", queue, exc)
                return None
            props = message["properties"]
        info = props.get("delivery_info")
        info = dict(info) if isinstance(info, dict) else {}
        info.update(exchange="", routing_key=queue)
        props["delivery_info"] = info
        props["delivery_tag"] = str(uuid.uuid4())
        return deliver(self, message, queue)

    stamped.evalq_stamped = True
    transport._deliver = stamped
    _stamping = True


def consumed_queue(request) -> str | None:
    """The queue a task's message was really taken from (``stamp_consumed_queue``), or None where
    this process does not establish it (then nothing may be concluded from the message's own)."""
    if not _stamping:
        return None
    return (request.delivery_info or {}).get("routing_key")
