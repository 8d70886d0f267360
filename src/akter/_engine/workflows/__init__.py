"""The workflows lane: a run is claimed, replayed through its journal to its next step, and parked.

``engine`` claims runnable runs and takes the ``$workflow.*`` intents; ``run`` replays one run
against its journal and records each new step (a command, a job, a wait, a sleep, a child) in the
transaction that performs it: ``journal`` sequences and writes the records, ``call_steps`` and
``job_steps`` are the command, query and job steps; ``control`` holds the suspensions a run
raises; ``ops`` is the operators' view of runs by id (status, steps, signals, cancel, retry).

Interface: ``WorkflowEngine(services, calls=, make_handle=, wake=, runner_id=, cancel_jobs=)``;
``claim(Pass) -> Claimed`` (the pass loop's lane protocol, ``akter._engine.lanes``) claims
runnable runs into free slots and starts one attempt each; ``deliver(...)`` takes a
``$workflow.*`` intent the relay claimed; ``stop``; ``running``, ``wait_idle()``; ``ops``.
"""
