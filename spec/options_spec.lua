-- esx.options: the shared constructor option checker.
local options = require "esx.options"

local schema = {
  timeout = { type = "integer", default = 1000, min = 0 },
  ratio = { type = "number", default = 0.5, min = 0, max = 1 },
  gzip = { type = "boolean", default = false },
  name = { type = "string", nonempty = true },
  hosts = { type = "any", default = function() return { "a" } end,
            check = function(v)
              if type(v) == "string" then return { v } end
              if type(v) == "table" then return v end
              return nil, "string or table expected, got " .. type(v)
            end },
  sink = { type = "table", required = false },
}

local function check(opts) return options.check("esx.thing", schema, opts, 2) end

describe("options.check", function()
  it("fills in defaults, calling function defaults for fresh tables", function()
    local a, b = check(), check({})
    assert.equal(1000, a.timeout)
    assert.equal(0.5, a.ratio)
    assert.is_false(a.gzip)
    assert.same({ "a" }, a.hosts)
    assert.are_not.equal(a.hosts, b.hosts)
  end)

  it("keeps given values and normalizes through check", function()
    local o = check({ timeout = 5, hosts = "x", gzip = true })
    assert.equal(5, o.timeout)
    assert.same({ "x" }, o.hosts)
    assert.is_true(o.gzip)
  end)

  it("raises naming an unknown option", function()
    assert.has_error(function() check({ timeuot = 1 }) end,
      "esx.thing: bad option 'timeuot' (unknown option)")
  end)

  it("raises on a non-string option name", function()
    assert.has_error(function() check({ 1 }) end, "esx.thing: bad option '1' (unknown option)")
  end)

  it("raises naming an option of the wrong type", function()
    assert.has_error(function() check({ timeout = "1" }) end,
      "esx.thing: bad option 'timeout' (integer expected, got string)")
    assert.has_error(function() check({ timeout = 1.5 }) end,
      "esx.thing: bad option 'timeout' (integer expected, got non-integer number)")
    assert.has_error(function() check({ gzip = 1 }) end,
      "esx.thing: bad option 'gzip' (boolean expected, got number)")
  end)

  it("raises naming an option out of range", function()
    assert.has_error(function() check({ timeout = -1 }) end,
      "esx.thing: bad option 'timeout' (must be >= 0)")
    assert.has_error(function() check({ ratio = 2 }) end,
      "esx.thing: bad option 'ratio' (must be <= 1)")
    assert.has_error(function() check({ ratio = 0 / 0 }) end,
      "esx.thing: bad option 'ratio' (number expected, got NaN)")
  end)

  it("raises with the reason a custom check gives", function()
    assert.has_error(function() check({ hosts = true }) end,
      "esx.thing: bad option 'hosts' (string or table expected, got boolean)")
  end)

  it("raises on an empty string where one is not allowed", function()
    assert.has_error(function() check({ name = "" }) end,
      "esx.thing: bad option 'name' (must not be empty)")
  end)

  it("raises when the options are not a table", function()
    assert.has_error(function() check("x") end,
      "bad argument #1 to esx.thing (table expected, got string)")
  end)

  it("raises when a required option is missing", function()
    local s = { sink = { type = "table", required = true } }
    assert.has_error(function() options.check("esx.c", s, {}, 1) end,
      "esx.c: bad option 'sink' (required)")
  end)

  it("names, of several missing required options, the first in byte order, every run", function()
    -- pairs() order: it named 'load_page' in one run of esx.cache() and 'load_readers' in the
    -- next (string hashes are seeded at random), and differed between Lua 5.4 and LuaJIT
    local s = {}
    for _, name in ipairs{ "zeta", "beta", "alpha", "gamma", "delta", "epsilon", "eta" } do
      s[name] = { type = "table", required = true }
    end
    for _ = 1, 20 do
      assert.has_error(function() options.check("esx.c", s, {}, 1) end, "esx.c: bad option 'alpha' (required)")
      assert.has_error(function() options.check("esx.c", s, { alpha = {} }, 1) end,
        "esx.c: bad option 'beta' (required)")
    end
  end)

  it("names, of several bad options, the first in byte order, before any missing one", function()
    local bad = { timeuot = 1, gzip = 1, ratio = 2, name = "", zz = 1, aa = 1 }
    for _ = 1, 20 do
      assert.has_error(function() check(bad) end, "esx.thing: bad option 'aa' (unknown option)")
      assert.has_error(function() check({ timeout = "1", ratio = 2, gzip = 1 }) end,
        "esx.thing: bad option 'gzip' (boolean expected, got number)")
    end
    local s = { sink = { type = "table", required = true }, a = { type = "integer" } }
    assert.has_error(function() options.check("esx.c", s, { a = "x" }, 1) end,
      "esx.c: bad option 'a' (integer expected, got string)")
  end)

  it("points the error at the caller's line", function()
    local ok, err = pcall(function() options.check("esx.thing", schema, { bad = 1 }, 2) end)
    assert.is_false(ok)
    assert.truthy(err:match("^spec/options_spec%.lua:%d+: esx%.thing"), err)
  end)
end)
