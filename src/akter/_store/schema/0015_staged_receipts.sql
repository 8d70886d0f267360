-- 0015_staged_receipts: a staged command's outcome is found by its id alone (issue 41).
--
-- A command staged in the application's own transaction (akter.stage) returns its command id;
-- runtime.outcome(cid) reads the outcome without being told the actor. While the intent is
-- pending the outbox's id index finds it; once delivered only its receipt is left, whose key
-- leads with the actor. This partial index holds the receipts of '$transaction' callers
-- (System(source="transaction"), caller key '["System","transaction",...') by command id: no
-- other turn's receipt enters it, so the turns' writes pay nothing for it. A command staged
-- for a User caller is read through its actor (handle.outcome, GET .../commands/{cid}).
--
-- One statement (see 0010). Building it reads the receipts once.
CREATE INDEX receipts_staged ON {schema}.receipts (command_id)
    WHERE caller_key LIKE '["System","transaction",%';
