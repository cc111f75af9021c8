"""The Borglet's pure logic (Borg §3.3): what it knows about a task (plans and live records), how
one machine converges on the master's desired task set, the machine's fence and unacknowledged
events, and one step of event time for every hosted task on the world model (:mod:`cellpilot.world`).

The service (``services/borglet``) is the shell around it: the gRPC API, the conversion of its
messages, real processes, cgroups, the event clock and the sample publisher.
"""
