"""The pass loop: when this runner's lanes look for work, and one pass over all of them.

Interface: ``PassLoop(services, outbox=, heard=, runner_id=)`` is built first and handed to each
lane as its waker (``wake``, ``wake_jobs``, ``wake_everywhere``, ``poke_others``, ``announce``);
``drive(*lanes)`` names the lanes (``akter._engine.lanes.Lane``: ``claim(Pass) -> Claimed``);
``start`` / ``listen`` / ``stop``; ``run_pass(drain=)`` runs one pass (tests, drains).

Pieces: ``passes`` (the loop), ``wake_channel`` (in-process wakes, ``NOTIFY`` to and from other
runners), ``idle`` (how long an idle runner sleeps), ``skew`` (rows left ahead by a clock that
moved back), ``backlog`` (admission gated on the outbox backlog), ``vacuum`` (the outbox
vacuumed when its dead tuples pile up), ``wakes`` (who must hear of a local commit). The loop
imports no lane.
"""
