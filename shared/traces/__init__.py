"""OpenTelemetry traces: OTLP JSON spans read as plain values (``otlp``), GenAI spans of both
attribute dialects (OpenTelemetry's GenAI conventions, OpenInference) made into instances
(``genai``), which spans a monitoring job scores (``select``: filters, a sample by trace id), and
an item's result as GenAI evaluation events (``events``).
Files and S3 are read by ``evalq.shared.data.traces``.

May import: core, scores, agents. (``tests/unit/test_layers.py`` holds it to this list.) A span's
chat message is read as an agent record's (``evalq.shared.agents.messages``).
"""
