"""Agent metrics: trajectories of tool calls scored without a judge (``trajectory``)."""
