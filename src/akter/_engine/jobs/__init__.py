"""The jobs lane: a job row staged by a turn is claimed, run as an attempt, and settled.

``claims`` takes due rows under a lease (``rates`` hands out rate tokens first), ``attempt``
runs one attempt with its lease renewals, cancellation signal and progress (``progress``,
``progress_slot``), ``routes`` turns its result into the declared route, ``rules`` decides the
settle as pure functions (a routed command, a retry, a dead letter or an honest ``Unknown``), and
``settle`` performs that decision's guarded writes, first write wins. ``executor`` drives those
steps for one runner; ``watch`` finds due rows that no live runner's code serves.

Interface: ``JobExecutor(services, wake=)``; ``claim(Pass) -> Claimed`` (the pass loop's lane
protocol, ``akter._engine.lanes``) claims due rows into free slots (by key on a jobs-only pass)
and starts their attempts; ``start`` / ``stop``; ``cancel_signal(job_ids)``, ``running``,
``wait_idle()``, ``progress``.
"""
