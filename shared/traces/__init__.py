"""OpenTelemetry traces: OTLP JSON spans read as plain values (``otlp``), GenAI spans of both
attribute dialects (OpenTelemetry's GenAI conventions, OpenInference) made into instances
(``genai``), and which spans a monitoring job scores (``select``: filters, a sample by trace id).
Files and S3 are read by ``evalq.shared.data.traces``.

May import: core. (``tests/unit/test_layers.py`` holds it to this list.)
"""
