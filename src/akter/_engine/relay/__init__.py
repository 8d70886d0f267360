"""The intent lane: intents and timers committed by turns are claimed and delivered as commands.

Interface: ``Relay(services, outbox=, deliver=, waker=, passes=, workflows=, declared_elsewhere=)``;
``claim(Pass) -> Claimed`` (the pass loop's lane protocol) claims due intents into free delivery
slots and starts one delivery task each; ``stop(deadline)`` releases what has not been delivered;
``in_flight``, ``delivered``, ``retried``, ``wait_idle()`` for drains and tests.

``intents`` claims due outbox rows under a lease, delivers each as an internal command with the
intent id as command id (the receiver's receipt makes a redelivery a replay), rewrites a schedule
tick into the next one, and settles the row with a statement guarded by its claim token. A
``$workflow.*`` intent goes to ``workflows`` (a protocol the runtime wires to the workflow
engine), not an actor.
"""
