"""``outbox demo``: the outbox end to end on embedded defaults (or on real servers)."""
