"""Jobs from a Node.js pipeline: celery-node 0.5.9 (npm; `make test` installs it in .node/) sends
``evalq.submit_job`` as the jobs how-to shows, with its defaults (Celery protocol 2) and with
``TASK_PROTOCOL: 1`` (the task and its kwargs in the body), on the shared queue and, as a tenant's
Redis ACL user, on that tenant's own queue; it waits on its reply list with ioredis. Before: a
protocol 1 request was dropped ("task None; a request queue carries only evalq.submit_job") and
the pipeline waited for ever. Real Redis, a real jobs worker, a real Node.js process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from tests.conftest import ROOT
from tests.integration.test_tenant_attacks import cluster  # noqa: F401  (tenants, ACL users, a jobs worker)

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("node") is None or not (ROOT / ".node/node_modules/celery-node").is_dir(),
                                 reason="Node.js and celery-node are needed (make test installs celery-node with npm)")]

JOB = {"instances": [{"id": "a", "actual-output": "Paris", "expected-output": ["Paris"]},
                     {"id": "b", "actual-output": "Lyon", "expected-output": ["Paris"]}],
       "metrics": [{"id": "exact_match"}]}

# what a Node.js pipeline writes: the client, the task by name, its kwargs; then a blocking pop
PIPELINE = r"""
const celery = require("celery-node");
const Redis = require("ioredis");
const [url, queue, protocol, request] = process.argv.slice(2);
const client = celery.createClient(url, url, queue);
if (protocol !== "default") client.conf.TASK_PROTOCOL = Number(protocol);
const kwargs = JSON.parse(request);
client.sendTask("evalq.submit_job", [], kwargs);
const replies = new Redis(url);
replies.blpop(kwargs.reply_to, 120).then((got) => {
  console.log(got ? got[1] : "no reply");
  process.exit(0);
}, (err) => { console.error(String(err)); process.exit(1); });
"""


def run_pipeline(cluster, tmp_path, url: str, queue: str, protocol: str, tenant: str) -> dict:
    """The pipeline run by Node.js against ``cluster`` (test_tenant_attacks': tenants with ACL users,
    a jobs worker), its request answered ``done``; the reply document."""
    script = tmp_path / "pipeline.js"
    script.write_text(PIPELINE)
    out = cluster["roots"] / tenant / uuid.uuid4().hex
    request = {"job": JOB, "out": str(out), "reply_to": f"replies:{tenant}:{uuid.uuid4().hex}",
               "suite": f"{tenant}-node"}
    proc = subprocess.run(["node", str(script), url, queue, protocol, json.dumps(request)],
                          env={**os.environ, "NODE_PATH": str(ROOT / ".node" / "node_modules")},
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["status"] == "done", doc
    assert (out / "results.json").exists()
    return doc


@pytest.mark.parametrize("protocol", ["default", "1", "2"])
def test_a_nodejs_pipeline_is_answered_on_the_shared_queue(cluster, tmp_path, protocol):
    doc = run_pipeline(cluster, tmp_path, cluster["url"], "evalq.jobs", protocol, "default")
    assert doc["results"][0]["metric"] == "exact_match" and doc["results"][0]["score"] == 0.5


@pytest.mark.parametrize("protocol", ["default", "1"])
def test_a_nodejs_pipeline_is_answered_as_its_tenant(cluster, tmp_path, protocol):
    """With the tenant's own Redis ACL user (`evalq tenants acl`): its queue, its reply lists."""
    url = cluster["url"].replace("redis://", "redis://ads:ads-secret@")
    doc = run_pipeline(cluster, tmp_path, url, "evalq.jobs.ads", protocol, "ads")
    spec = json.loads(cluster["r"].get(f"evalq:{{{doc['job_id']}}}:spec"))
    assert spec["scheduling"]["tenant"] == "ads"
