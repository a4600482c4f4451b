"""The Celery application. JSON only, late acks, redelivery on worker loss.

The broker URL comes from ``EVALQ_BROKER_URL`` (workers) or ``configure()``
(the orchestrator, before it sends anything). The result backend is the same
Redis: the chord's join state lives there, item results do not (see
``shared.keys``).
"""

from __future__ import annotations

from celery import Celery

from shared.config import CONTROL_QUEUE, Settings


def _conf(settings: Settings, broker_url: str | None) -> dict:
    transport = {"visibility_timeout": settings.visibility_timeout}
    return dict(
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
    celery_app = Celery("evalq", include=["workers.tasks"])
    celery_app.conf.update(_conf(settings, broker_url or settings.broker_url))
    return celery_app


app = make_app()


def configure(broker_url: str) -> Celery:
    """Point the module-level app at a broker (orchestrator side, before sending)."""
    app.conf.update(broker_url=broker_url, result_backend=broker_url)
    return app
