"""Reads and validates jobs, submits their work to Celery, waits, writes outputs."""
