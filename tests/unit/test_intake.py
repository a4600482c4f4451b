"""A request queue's message is rebuilt from its task, id and kwargs alone, or refused
(``evalq.orchestrator.intake``): the messages here are written as a sender could write them, in
Celery's protocol 2 (as Celery's own ``send_task`` makes them) and protocol 1 (celery-node's
``TASK_PROTOCOL: 1``), and Celery's own reading of the rebuilt message is what is checked."""

from __future__ import annotations

import base64
import json
import uuid

import pytest

from evalq.orchestrator import intake

QUEUE = "evalq.jobs.ads"
KWARGS = {"job": {"instances": [], "metrics": []}, "out": "/data/ads/out", "reply_to": "replies:ads:r1"}
SIGNATURE = {"task": "evalq.submit_job", "args": [], "kwargs": {"job": {}, "out": "/data/search/x"},
             "options": {"queue": "evalq.jobs.search"}, "subtask_type": None, "immutable": False}


def message(body, headers: dict | None = None, encode: bool = True, **props) -> dict:
    text = json.dumps(body)
    return {"body": base64.b64encode(text.encode()).decode() if encode else text, "content-encoding": "utf-8",
            "content-type": "application/json", "headers": headers if headers is not None else {},
            "properties": {"body_encoding": "base64" if encode else None, "delivery_mode": 2,
                           "delivery_info": {"exchange": "", "routing_key": QUEUE},
                           "delivery_tag": str(uuid.uuid4()), **props}}


def protocol2(kwargs=KWARGS, embed=None, args=(), task="evalq.submit_job", **headers) -> dict:
    tid = str(uuid.uuid4())
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None} if embed is None else embed
    return message([list(args), kwargs, embed], {"lang": "py", "task": task, "id": tid, "root_id": tid,
                                                 "parent_id": None, "group": None, **headers})


def protocol1(kwargs=KWARGS, task="evalq.submit_job", **fields) -> dict:
    return message({"task": task, "id": str(uuid.uuid4()), "args": [], "kwargs": kwargs, **fields},
                   correlationId="x", replyTo="")


def as_celery_reads_it(rebuilt: dict) -> tuple[dict, list, dict, dict]:
    """(headers, args, kwargs, embed) as the worker's strategy reads the rebuilt message."""
    body = json.loads(base64.b64decode(rebuilt["body"]))
    return rebuilt["headers"], *body


def test_a_plain_protocol_2_request_keeps_its_id_and_kwargs():
    sent = protocol2()
    headers, args, kwargs, embed = as_celery_reads_it(intake.rebuild(sent, QUEUE))
    assert headers["task"] == "evalq.submit_job" and headers["id"] == sent["headers"]["id"]
    assert args == [] and kwargs == KWARGS
    assert embed == {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def test_a_protocol_1_request_is_read_from_its_body():
    """celery-node's TASK_PROTOCOL 1 (and Celery 3's): no task header; task, id and kwargs in the body."""
    sent = protocol1()
    headers, args, kwargs, embed = as_celery_reads_it(intake.rebuild(sent, QUEUE))
    assert headers["task"] == "evalq.submit_job" and headers["id"] == json.loads(base64.b64decode(sent["body"]))["id"]
    assert kwargs == KWARGS and args == [] and not any(embed.values())


def test_a_body_that_is_not_base64_encoded_is_read_as_it_is():
    sent = message([[], KWARGS, {}], {"task": "evalq.submit_job", "id": "r-1"}, encode=False)
    _, _, kwargs, _ = as_celery_reads_it(intake.rebuild(sent, QUEUE))
    assert kwargs == KWARGS


@pytest.mark.parametrize("form", ["chain", "callbacks", "errbacks", "chord"])
def test_every_canvas_form_of_protocol_2_is_refused(form):
    value = SIGNATURE if form == "chord" else [SIGNATURE]
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None, form: value}
    with pytest.raises(intake.Refused) as refused:
        intake.rebuild(protocol2(embed=embed), QUEUE)
    assert refused.value.reason == "canvas" and form in refused.value.message
    assert refused.value.kwargs["reply_to"] == "replies:ads:r1"  # it can still be answered


@pytest.mark.parametrize("field,value", [("callbacks", [SIGNATURE]), ("errbacks", [SIGNATURE]),
                                         ("chord", SIGNATURE), ("taskset", "group-id")])
def test_every_canvas_form_of_protocol_1_is_refused(field, value):
    with pytest.raises(intake.Refused) as refused:
        intake.rebuild(protocol1(**{field: value}), QUEUE)
    assert refused.value.reason == "canvas"


def test_an_embed_that_is_not_an_object_is_refused():
    with pytest.raises(intake.Refused) as refused:
        intake.rebuild(protocol2(embed=[SIGNATURE]), QUEUE)
    assert refused.value.reason == "canvas"


def test_everything_else_a_sender_sets_is_ignored():
    """eta, countdown, expires, retries, time limits, shadow, stamps, parents, a reply_to property:
    none survives; the rebuilt headers are evalq's own."""
    sent = protocol2(eta="2030-01-01T00:00:00", expires="2020-01-01T00:00:00", retries=7, timelimit=[1, 2],
                     shadow="evalq.finalize", stamps={"x": 1}, stamped_headers=["x"], parent_id="p", group="g",
                     origin="search@cluster", argsrepr="('forged',)", kwargsrepr="{'forged': 1}",
                     replaced_task_nesting=3)
    sent["properties"].update(reply_to="celery-reply", priority=9, correlation_id="other")
    rebuilt = intake.rebuild(sent, QUEUE)
    headers = rebuilt["headers"]
    assert headers["eta"] is None and headers["expires"] is None and headers["retries"] == 0
    assert headers["timelimit"] == [None, None] and headers["shadow"] is None and headers["group"] is None
    assert headers["parent_id"] is None and headers["root_id"] == headers["id"]
    assert "stamps" not in headers and "stamped_headers" not in headers and "replaced_task_nesting" not in headers
    assert headers["origin"] == f"queue {QUEUE}" and "forged" not in headers["argsrepr"] + headers["kwargsrepr"]
    assert rebuilt["properties"]["reply_to"] == "" and rebuilt["properties"]["priority"] == 0
    assert rebuilt["properties"]["correlation_id"] == headers["id"]


@pytest.mark.parametrize("task", ["evalq.finalize", "evalq.score_chunk", "celery.chord_unlock", None])
def test_another_task_is_refused_and_its_kwargs_kept_for_the_answer(task):
    with pytest.raises(intake.Refused) as refused:
        intake.rebuild(protocol2(task=task) if task else protocol1(task=None), QUEUE)
    assert refused.value.reason == "not_a_request"
    assert refused.value.kwargs.get("reply_to") == "replies:ads:r1"


def test_positional_arguments_are_refused():
    with pytest.raises(intake.Refused) as refused:
        intake.rebuild(protocol2(args=["job.json"]), QUEUE)
    assert refused.value.reason == "arguments"


@pytest.mark.parametrize("sent", [
    {"body": "not base64 !!", "content-type": "application/json", "headers": {"task": "evalq.submit_job"},
     "properties": {"body_encoding": "base64"}},
    {"body": base64.b64encode(b"{not json").decode(), "content-type": "application/json",
     "headers": {"task": "evalq.submit_job"}, "properties": {"body_encoding": "base64"}},
    {"body": base64.b64encode(b"[1, 2]").decode(), "content-type": "application/json",
     "headers": {"task": "evalq.submit_job"}, "properties": {"body_encoding": "base64"}},
    {"body": base64.b64encode(b"\x80\x03").decode(), "content-type": "application/x-python-serialize",
     "headers": {"task": "evalq.submit_job"}, "properties": {"body_encoding": "base64"}},
    {"body": base64.b64encode(b'[[], ["a"], {}]').decode(), "content-type": "application/json",
     "headers": {"task": "evalq.submit_job"}, "properties": {"body_encoding": "base64"}},
    {"body": 5, "headers": {}, "properties": {}},
], ids=["not-base64", "not-json", "short-body", "pickle", "kwargs-not-object", "body-not-string"])
def test_an_unreadable_message_is_refused(sent):
    with pytest.raises(intake.Refused) as refused:
        intake.rebuild(sent, QUEUE)
    assert refused.value.reason == "unreadable"


def test_a_message_without_an_id_gets_one_its_redelivered_copy_shares():
    sent = message([[], KWARGS, {}], {"task": "evalq.submit_job"})
    first, again = intake.rebuild(sent, QUEUE), intake.rebuild(json.loads(json.dumps(sent)), QUEUE)
    assert first["headers"]["id"] == again["headers"]["id"]
    assert first["headers"]["id"] != intake.rebuild(message([[], {**KWARGS, "out": "/o"}, {}],
                                                            {"task": "evalq.submit_job"}), QUEUE)["headers"]["id"]
