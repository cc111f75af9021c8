"""The Borgmaster service: replicated cell state, the fenced checkpoint log, the scheduler loop."""
