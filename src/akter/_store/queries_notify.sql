-- Wakeups between runners (semantics §3.5): each its own autocommit statement, never in a turn.

-- listen_wake --
-- follows other runners' wakes (relay passes, event feeds) on a dedicated connection
LISTEN {wake_channel}

-- notify_wake --
-- wakes other runners' relays and event feeds; sent strictly after a commit, outside any transaction
NOTIFY {wake_channel}

-- listen_progress --
-- hears other runners' job progress messages on a dedicated connection
LISTEN {progress_channel}

-- notify_progress --
-- sends one job progress message to other runners' hubs, outside any transaction
SELECT pg_notify(%(channel)s, %(payload)s)
