"""The job's life in the cluster: requests, store, plan and dispatch, the chunk-completion
protocol, the final callback and its outputs, the sweeper, status, cancel and resume.
Imports only ``evalq.shared``; sends tasks by name."""
