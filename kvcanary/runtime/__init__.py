"""The runtime an engine integrates: the planner, the :class:`~kvcanary.KVCanary` object, host staging,
health (counters and watchdog) and violation reports."""
