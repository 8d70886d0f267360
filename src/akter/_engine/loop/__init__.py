"""The pass loop: when each lane looks for work (wakes, idle polls, the skew watch, backlog).

``wake_channel`` carries wakes (in-process after a local commit, ``NOTIFY`` from other runners),
``idle`` decides how long an idle runner sleeps, ``skew`` finds rows left ahead by a clock that
moved back, ``backlog`` gates admission on the outbox backlog, ``wakes`` tells who must hear of a
local commit.
"""
