"""The job's life in the cluster: requests, store, plan and dispatch, the chunk-completion
protocol, the final callback and its outputs, the sweeper, status, cancel and resume.
Imports ``evalq.results`` (what a job's scores become) and ``evalq.shared``, the rooms below it;
sends tasks by name."""
