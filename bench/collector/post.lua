-- bench/collector/post.lua -- wrk script: POST the same beacon body (two events, as
-- navigator.sendBeacon sends it: text/plain) to every peer, and print one RESULT line.
local f = assert(io.open(os.getenv("BENCH_BODY") or "bench/collector/body.json"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "text/plain;charset=UTF-8"

function done(summary, latency)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d non2xx=%d sockerr=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
