"""One chaos run: the whole system under ``cellpilot run``, the demo workload, and faults in turn.

``python -m cellpilot.chaos`` (``make chaos``) starts ``cellpilot run --detach`` in a fresh data
directory on ports of its own, submits the demo workload, and while it runs injects one fault
after the other (:mod:`~cellpilot.chaos.plan`): SIGKILL of the Borgmaster master, an
aggregator, a recommender worker, the Autopilot master and the actuator (the supervisor
restarts them); PostgreSQL, Redis and the broker killed and restarted; a poison job (refused at
admission, or accepted and failing on its Borglet) and a crash-looping job. A reader of its own
follows the Kafka streams throughout (:mod:`~cellpilot.chaos.stream_ledger`). At the end it
reads what the stores hold (:mod:`~cellpilot.chaos.evidence`), checks the invariants
(:mod:`~cellpilot.chaos.invariants`) and prints one ``CHAOS <name> <value> <unit>`` line per
figure, also written to a JSON file (:mod:`~cellpilot.chaos.report`). ``--short`` runs the
subset the test suite runs (tests/integration/chaos).
"""
