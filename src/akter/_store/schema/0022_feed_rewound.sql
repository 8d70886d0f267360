-- 0022_feed_rewound: a follow that commits during a running round of its source's feed is not
-- lost (docs/spec/subscriptions.md, S2).
--
-- A round reads the feed's followers once, delivers, then settles the feed's done to the last
-- event it read. A follow committed after that read lowered done to its start, and the settle
-- moved done past it: the new follower never got the events between its start and the round's
-- last. The follow now also sets rewound while a claim is held; the claim clears it, and a
-- settle of a rewound feed leaves done where the follow put it.
-- One statement (every migration after 0009); Citus propagates it to the shards.
ALTER TABLE {schema}.subscription_feeds ADD COLUMN rewound boolean NOT NULL DEFAULT false;
