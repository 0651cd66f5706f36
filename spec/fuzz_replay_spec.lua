-- Replays the committed fuzz corpus (fuzz/corpus/<target>) through each libFuzzer target's
-- LLVMFuzzerTestOneInput, built by gcc with AddressSanitizer and UBSan when this gcc has them
-- (fuzz/replay.c; `make -C fuzz replay`).  The targets check the parsers' promises, so a
-- corpus input that once crashed or broke a promise fails here.  The build is Lua-independent,
-- so it runs under the first flavour only.
local flavour = os.getenv("ESX_TEST_FLAVOUR")
local TARGETS = { "event", "ndjson", "json", "gzip", "bulk_response", "retry_after", "hll", "h1", "rset" }

local run = require("spec.support.shell").run

describe("fuzz corpus replay", function()
  if flavour == "luajit" then
    it("runs under the first flavour only", function() end)
    return
  end

  local built, built_out
  setup(function()
    built, built_out = run("make -s -C fuzz replay")
  end)

  it("builds the replay drivers", function()
    assert.is_true(built, built_out)
  end)

  for _, t in ipairs(TARGETS) do
    it("replays fuzz/corpus/" .. t .. " without a sanitizer report or broken check", function()
      assert.is_true(built, built_out)
      local ok, out = run("ASAN_OPTIONS=detect_leaks=1 build/fuzz-replay/" .. t
        .. " fuzz/corpus/" .. t .. " 2>&1 >/dev/null")
      -- the driver names each input on stderr before running it; keep the rest
      assert.truthy(out:find("fuzz/corpus/" .. t .. "/", 1, true), "the driver's stderr was not read:\n" .. out)
      local last = out:match("([^\n]*)\n[^\n]*$") or ""
      out = out:gsub("fuzz/corpus/[^\n]*\n", "")
      if not ok then out = "last input: " .. last .. "\n" .. out end
      assert.is_true(ok, out)
      assert.is_nil(out:find("ERROR: ", 1, true), out)
      assert.is_nil(out:find("runtime error", 1, true), out)
      if t == "rset" then -- a corrupt set is refused without a word from CRoaring on stderr
        assert.equal("", out)
      end
    end)
  end
end)
