-- Live reads between runners (docs/guides/live.md): each its own autocommit statement, never in a turn.

-- listen_live --
-- hears other runners' live messages (watched actors' commits, broadcasts) on a dedicated connection
LISTEN {live_channel}

-- notify_live --
-- sends one live message (changed actors' versions, or one broadcast) to other runners, outside any transaction
SELECT pg_notify(%(channel)s, %(payload)s)
