-- bench/soak/check.lua -- the soak's verdict line (bench/soak/run).
--
--   lua5.4 bench/soak/check.lua ACCEPTED OK204 EVENTS_PER_REQUEST CONNECTIONS INDEXED DISTINCT WRK_EXIT_STATUS
--
-- Every accepted event must be indexed exactly once, and the events accepted must be the ones
-- wrk was answered 204 for -- give or take the requests in flight when wrk stopped (at most
-- one per connection: the collector accepted them, wrk did not count their answers).  A wrk
-- that failed, or answers the collectors did not count, fail the soak instead of letting it
-- pass on the collectors' own count.
local accepted, ok204, per, conns, indexed, distinct, rc = tonumber(arg[1]), tonumber(arg[2]),
  tonumber(arg[3]), tonumber(arg[4]), tonumber(arg[5]), tonumber(arg[6]), tonumber(arg[7] or "0")
local answered = (ok204 or 0) * (per or 0)
local unanswered = accepted and accepted - answered
if rc == 0 and accepted and accepted > 0 and unanswered >= 0 and unanswered <= (conns or 0) * (per or 0)
   and indexed == distinct and accepted == distinct then
  print(string.format("- **Accepted = indexed = distinct: every accepted event indexed exactly once; %s.**",
    unanswered == 0 and "every one answered 204"
      or string.format("all but %d answered 204 to wrk (requests in flight when it stopped)", unanswered)))
else
  print(string.format("- **MISMATCH: accepted %s, answered 204 %d x %s = %d, indexed %s, distinct %s%s.**",
    tostring(accepted), ok204 or 0, tostring(per), answered, tostring(indexed), tostring(distinct),
    rc ~= 0 and string.format("; wrk exited with status %s", tostring(rc)) or ""))
end
