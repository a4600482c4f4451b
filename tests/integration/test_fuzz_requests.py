"""Property-based, for queue requests: mutated requests, with the job inline, in a local
file or on S3 (moto, gzipped or not), with numbers of more digits than Python converts
and nesting far past the limit, are either accepted or answered with located problems
(JobError), never another exception: a request the jobs worker cannot read is answered
``invalid``, not stranded. Bounded so CI stays fast."""

from __future__ import annotations

import gzip
import json
import os
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evalq.orchestrator.service import parse_request
from evalq.shared.core.errors import JobError
from tests.integration.test_datasets import AWS, start_moto
from tests.unit.test_fuzz import FUZZ, mutated

pytestmark = pytest.mark.integration

JOB = {"instances": [{"id": "a", "actual-output": "the cat", "expected-output": ["the cat"]},
                     {"id": 2, "actual-output": "dog", "expected-output": ["dog"]}],
       "metrics": [{"id": "bleu", "parameters": {"weights": [0.5, 0.5]}}, {"id": "exact_match"}]}
HUGE, DEEP = "__huge_number__", "__deep_nesting__"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A request root, moto, and the lists a cluster would have; restored afterwards."""
    import boto3

    root = tmp_path_factory.mktemp("fuzz-requests")
    proc, url = start_moto()
    client = boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    client.create_bucket(Bucket="jobs")
    env = {**AWS, "EVALQ_REQUEST_ROOTS": str(root), "EVALQ_S3_ENDPOINTS": url, "AWS_ENDPOINT_URL_S3": url,
           "EVALQ_S3_PREFIXES": "s3://jobs/in/,s3://jobs/out/", "EVALQ_MAX_JOB_BYTES": "200000"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield root, client
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    proc.terminate()
    proc.wait(10)


def as_text(doc) -> bytes:
    """The document as a job file: markers become a 5,000-digit number or 50,000-deep nesting."""
    text = json.dumps(doc)
    text = text.replace(f'"{HUGE}"', "9" * 5000).replace(f'"{DEEP}"', "[" * 50_000 + "]" * 50_000)
    return text.encode()


def as_value(doc):
    """The document as a decoded message carries it: nesting as deep as a JSON decoder allows."""
    if doc == DEEP:
        value: list = []
        for _ in range(500):
            value = [value]
        return value
    if isinstance(doc, dict):
        return {k: as_value(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [as_value(v) for v in doc]
    return 10 ** 300 if doc == HUGE else doc


MARKED = st.sampled_from([HUGE, DEEP])


@st.composite
def requests_(draw):
    job = draw(mutated(JOB))
    if draw(st.booleans()):  # plant a huge number or deep nesting somewhere
        where = draw(st.sampled_from(["instances", "metrics", "extra"]))
        if where == "extra" or not isinstance(job.get(where), list):
            job[where] = draw(MARKED)
        else:
            job[where].append(draw(MARKED))
    request = {"delivery": draw(st.sampled_from(["inline", "file", "file.gz", "s3", "s3.gz"])),
               "out": draw(st.sampled_from(["OUT", "s3://jobs/out/x/", "s3://elsewhere/", "/etc", None]))}
    if draw(st.booleans()):
        request["chunk_size"] = draw(st.one_of(st.integers(-5, 20_000), st.floats(), st.text(max_size=3)))
    return job, request


@FUZZ
@given(requests_())
def test_mutated_requests_are_accepted_or_answered_with_located_errors(world, case):
    root, client = world
    job, request = case
    delivery = request.pop("delivery")
    if request["out"] == "OUT":
        request["out"] = str(root / "out")
    elif request["out"] is None:
        del request["out"]
    name = f"{uuid.uuid4().hex}.json"
    data = as_text(job)
    if delivery.endswith(".gz"):
        data, name = gzip.compress(data), name + ".gz"
    if delivery == "inline":
        request["job"] = as_value(job)
        source = "request"
    elif delivery.startswith("file"):
        (root / name).write_bytes(data)
        request["job_uri"] = source = str(root / name)
    else:
        client.put_object(Bucket="jobs", Key=f"in/{name}", Body=data)
        request["job_uri"] = source = f"s3://jobs/in/{name}"
    try:
        parse_request(request)
    except JobError as exc:
        for line in exc.problems:
            assert line.startswith((source, "request", "output", "<job>")) and ": " in line, line
