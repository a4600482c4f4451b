"""The backlog of each queue over HTTP, for autoscaling: with windows a queue's broker list no
longer shows the work waiting, so KEDA scales on what this serves (a ``metrics-api``
trigger per queue, see deploy/k8s/base/scaling.yaml).

The ``evalq.jobs`` role serves it on ``EVALQ_BACKLOG_PORT`` (default 9808; 0: off):

    GET /backlog/<queue>   {"queue": "<queue>", "backlog": <chunks planned and not finished>}
    GET /backlog           {"queues": {"<queue>": <backlog>, ...}}

Read-only, no job data: counts of chunks per queue name. The numbers are what every refill
and sweep keeps in ``evalq:backlog:<queue>`` (``evalq.orchestrator.dispatch``)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import redis

from evalq.shared.cluster import keys

log = logging.getLogger("evalq.backlog")
PATH = "/backlog"


def backlogs(r: redis.Redis) -> dict[str, int]:
    queues = sorted(q.decode() for q in r.smembers(keys.SCHED_QUEUES))
    values = r.mget([keys.backlog(q) for q in queues]) if queues else []
    return {q: int(v or 0) for q, v in zip(queues, values)}


class BacklogServer(threading.Thread):
    def __init__(self, r: redis.Redis, host: str, port: int):
        super().__init__(name="evalq-backlog", daemon=True)
        r_ = r

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0].rstrip("/")
                try:
                    if path == PATH:
                        body = {"queues": backlogs(r_)}
                    elif path.startswith(PATH + "/") and len(path) > len(PATH) + 1:
                        queue = path[len(PATH) + 1:]
                        body = {"queue": queue, "backlog": int(r_.get(keys.backlog(queue)) or 0)}
                    else:
                        self.send_error(404)
                        return
                except redis.RedisError:
                    self.send_error(503, "Redis unreachable")
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:  # scrapes every few seconds: not worth a log line each
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def run(self) -> None:
        log.info("backlog: serving %s on port %d", PATH, self.port)
        self.server.serve_forever()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
