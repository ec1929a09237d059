"""A Django app that records feedback and, in the same transaction, an action to thank for it."""
