"""What a job's scores become, in one room: the outputs (``outputs``: results.json, log.jsonl,
run.json, report.html), the report page (``report``, ``report_agents``, ``markup``), the run
history store and its migrations (``history``, ``recording``, ``migrations``), regressions and
alerts (``regressions``, ``alerts``), the history page (``history_page``) and the scores sent to the
backends teams look at (``sinks``: OpenTelemetry evaluation events, Phoenix span annotations,
MLflow assessments).

It stands between ``shared`` (which it imports) and the roles that use it: the orchestrator's
final callback writes and records a job's results through it, workers write what each chunk
contributes (its report view, its history values, its evaluation events), and the client reads
the history and renders pages. It imports no role.
"""
