"""What recording a run in the history store adds to a job's final callback.

One real job (N instances, exact_match and f1_score: one field and three fields per
item) runs on an embedded cluster with history off. Then, on the same Redis records,
this process times in one run:

- writing the outputs (results.json, log.jsonl, run.json, report.html): what the final
  callback already did for the job;
- recording it in a fresh SQLite history store (reading the per-instance values the
  workers kept per chunk, and storing them) against a baseline run of the suite, so the
  paired regression test runs too. The baseline is the same job run before on a cluster of
  its own (another Redis), as the night before is: its chunks' values come back from Redis in
  another order than this run's.

    .venv/bin/python bench/bench_history.py [N]        # default 100000
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalq.cli.embedded import EmbeddedCluster  # noqa: E402
from evalq.cli.run import run_job  # noqa: E402
from evalq.shared.job.schema import parse_job  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    work = Path(tempfile.mkdtemp(prefix="bench-history-"))
    os.environ["EVALQ_HISTORY"] = "off"  # the job's own callback records nothing: timed below instead
    instances = [{"id": f"q{k}", "expected-output": [f"the answer to question {k % 97} is here"],
                  "actual-output": f"the answer to question {k % 89} is there"} for k in range(n)]
    job = parse_job({"instances": instances, "metrics": [{"id": "exact_match"}, {"id": "f1_score"}]},
                    source="bench-history.json")
    import redis

    from evalq.results.history import open_store
    from evalq.results.outputs import run_info, write_outputs
    from evalq.results.recording import entries_of, run_row
    from evalq.shared.cluster import keys
    from evalq.shared.job.stored import stored_job as stored_spec
    from evalq.shared.data.storage import Destination
    from evalq.shared.job.nightly import Regression

    store = open_store(f"sqlite:///{work / 'history.sqlite'}")
    settings = Regression().resolved()
    # the night before: the same job on a cluster of its own, recorded as the suite's baseline
    with EmbeddedCluster(job.queues, env={"EVALQ_HISTORY": "off"}) as cluster:
        run_job(job, work / "before", broker=cluster.broker_url, progress=False, stall_timeout=600)
        r = redis.Redis.from_url(cluster.broker_url)
        job_id = r.zrange(keys.JOBS, -1, -1)[0].decode()
        spec, summary = stored_spec(r, job_id), json.loads(r.get(keys.summary(job_id)))
        base = run_row(r, job_id, spec, "done", summary, None) | {"job_id": "baseline"}
        store.record(base, *entries_of(r, job_id, spec, summary), settings)
    with EmbeddedCluster(job.queues, env={"EVALQ_HISTORY": "off"}) as cluster:
        t0 = time.perf_counter()
        run_job(job, work / "out", broker=cluster.broker_url, progress=False, stall_timeout=600)
        job_wall = time.perf_counter() - t0
        r = redis.Redis.from_url(cluster.broker_url)
        job_id = r.zrange(keys.JOBS, -1, -1)[0].decode()
        spec, summary = stored_spec(r, job_id), json.loads(r.get(keys.summary(job_id)))

        t0 = time.perf_counter()
        write_outputs(r, spec, job_id, summary, run_info(spec, job_id, None), Destination(str(work / "again")))
        outputs = time.perf_counter() - t0

        t0 = time.perf_counter()
        rows, series = entries_of(r, job_id, spec, summary)
        read = time.perf_counter() - t0
        recorded = store.record(run_row(r, job_id, spec, "done", summary, None), rows, series, settings)
        record = time.perf_counter() - t0
    db = sum(p.stat().st_size for p in work.glob("history.sqlite*"))  # with its write-ahead log
    print(f"{n} instances x 2 entries (4 fields); the job itself took {job_wall:.1f} s end to end")
    print(f"  writing the outputs (existing callback work):  {outputs:7.2f} s")
    print(f"  recording in the history store:               {record:7.2f} s "
          f"({read:.2f} s reading the values the workers kept, {record - read:.2f} s storing and testing; "
          f"{len(recorded.regressions)} regressions)")
    print(f"  ratio recording / outputs: {record / outputs:.2f}; SQLite file after two runs: {db / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
