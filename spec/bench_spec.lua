-- spec/bench_spec.lua -- the benchmark harnesses count what they say they count (bench/).
-- The benchmarks themselves are never run here (their figures depend on the machine); these
-- specs run tiny pieces of the harnesses against stand-ins.
local closed_port = require("spec.support.net").closed_port
local flavour = require("esx.core").flavour
local lua = flavour == "luajit" and "luajit" or "lua5.4"

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return out
end

-- a stand-in for the server process: burns CPU all the time, for at most `seconds`
local function burner(seconds)
  local pid = sh("lua5.4 -e 'local t = os.time() + " .. seconds .. " while os.time() < t do end'"
                 .. " >/dev/null 2>&1 & echo $!"):match("%d+")
  return assert(pid)
end

local function result_line(out)
  local line = out:match("(searches=[^\n]*)")
  assert(line, "no result line:\n" .. out)
  local r = {}
  for k, v in line:gmatch("([%w_]+)=([%d.]+)") do r[k] = tonumber(v) end
  return r
end

describe("bench/client search peers", function()
  -- 1 s of warm-up, then 0.5 s measured: the server's CPU must be that of the 0.5 s, not of
  -- the whole process (warm-up included), since searches= counts only the measured ones.
  local function check(cmd)
    local pid = burner(10)
    local ok, out = pcall(sh, "BENCH_SERVER_PID=" .. pid .. " BENCH_SERVER_HZ=$(getconf CLK_TCK) " .. cmd
                              .. " " .. closed_port() .. " 16 0.5 1 2>&1")
    os.execute("kill " .. pid .. " 2>/dev/null")
    assert(ok, out)
    local r = result_line(out)
    assert.is_not_nil(r.server_cpu, "no server_cpu in the result line:\n" .. out)
    assert.is_true(r.server_cpu > 0, out)
    -- a one-thread burner cannot use more CPU than the measured seconds (+ two clock ticks)
    assert.is_true(r.server_cpu <= r.seconds + 0.03, "server CPU beyond the measured window:\n" .. out)
  end

  it("search.lua charges the server's CPU of the measured seconds only, not the warm-up's", function()
    check("LUA_PATH='./lua/?.lua;./lua/?/init.lua;;' LUA_CPATH='./build/" .. flavour .. "/?.so;;' "
          .. lua .. " bench/client/search.lua")
  end)

  it("node_search.js charges the server's CPU of the measured seconds only, not the warm-up's", function()
    if not io.open("bench/client/node_modules/@elastic/elasticsearch/package.json") then
      return pending("needs `npm install` in bench/client")
    end
    check("node bench/client/node_search.js")
  end)
end)

describe("bench/collector/hey_phase.lua", function()
  local function write(text)
    local name = os.tmpname()
    local f = assert(io.open(name, "w"))
    f:write(text)
    f:close()
    return name
  end
  local GOOD = table.concat({
    "", "Summary:", "  Total:\t30.0123 secs", "  Requests/sec:\t5854.2646", "", "Latency distribution:",
    "  50% in 0.0018 secs", "  99% in 0.0167 secs", "", "Status code distribution:",
    "  [204]\t175600 responses", "  [503]\t100 responses", "", "Error distribution:",
    "  [3]\tPost \"http://127.0.0.1:1/collect\": EOF", "" }, "\n")
  local function row(text, rc)
    local name = write(text)
    local out = sh("lua5.4 bench/collector/hey_phase.lua " .. name .. " 6000 1 " .. (rc or 0) .. " 2>&1")
    local ok = sh("lua5.4 bench/collector/hey_phase.lua --ok " .. name .. " 2>&1")
    os.remove(name)
    return out, ok
  end

  it("counts the phase's answers and errors from hey's summary", function()
    local out, ok = row(GOOD)
    assert.equal("| 1 | 6000 | 5854 | 175703 | 175600 | 100 | 0 | 0 | 3 | 0.06 % | 1.8 | 16.7 |\n", out)
    assert.equal("175600\n", ok)
  end)

  it("reports a phase where hey failed or printed nothing as such, not as 0.00 % errors", function()
    local out = row("Error: flag provided but not defined: -x\n", 2)
    assert.matches("hey failed %(exit 2%)", out)
    assert.is_nil(out:find("0.00 %", 1, true), out)
    out = row("")
    assert.matches("no summary", out)
    assert.is_nil(out:find("0.00 %", 1, true), out)
    local _, ok = row("")
    assert.equal("0\n", ok)
  end)
end)

describe("bench/soak/check.lua", function()
  local function verdict(...)
    return sh("lua5.4 bench/soak/check.lua " .. table.concat({ ... }, " ") .. " 2>&1")
  end

  it("passes when every event accepted was answered 204 and indexed once", function()
    assert.matches("every accepted event indexed exactly once", verdict(352916, 176458, 2, 6, 352916, 352916, 0))
    -- a request in flight when wrk stopped: accepted, its answer not counted by wrk
    assert.matches("all but 2 answered 204", verdict(352918, 176458, 2, 6, 352918, 352918, 0))
  end)

  it("fails when wrk failed or its 204s do not account for the events accepted", function()
    assert.matches("MISMATCH.*wrk exited with status 1", verdict(352916, 0, 2, 6, 352916, 352916, 1))
    assert.matches("MISMATCH", verdict(352916, 176000, 2, 6, 352916, 352916, 0))
    assert.matches("MISMATCH", verdict(352916, 176500, 2, 6, 352916, 352916, 0))
    assert.matches("MISMATCH", verdict(0, 0, 2, 6, 0, 0, 0))
    assert.matches("MISMATCH", verdict(352916, 176458, 2, 6, 352916, 352915, 0))
  end)
end)
