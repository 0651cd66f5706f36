-- core.json_decode: the response decoder.  Differential against lua-cjson on random
-- documents, and exact errors for everything RFC 8259 forbids.
local core = require "esx.core"
local cjson = require "cjson"

local decode = core.json_decode

local function same(x, y, path)
  path = path or "$"
  assert.equal(type(x), type(y), path)
  if type(x) == "table" then
    for k, v in pairs(x) do same(v, y[k], path .. "." .. tostring(k)) end
    for k in pairs(y) do assert.is_not_nil(x[k], path .. "." .. tostring(k)) end
  else
    assert.equal(x, y, path)
  end
end

-- a repeatable random source: rng(n) is 1..n
local function lcg(seed)
  return function(n)
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed % n + 1
  end
end

-- random JSON text with whitespace, escapes, unicode, numbers of every shape
local function gen(rng, depth)
  local r = rng(10)
  if depth > 5 or r <= 4 then
    local k = rng(8)
    if k == 1 then return "null" elseif k == 2 then return "true" elseif k == 3 then return "false"
    elseif k == 4 then return tostring(rng(2000000) - 1000000)
    elseif k == 5 then return string.format("%.6g", (rng(100000) - 50000) / 7)
    elseif k == 6 then return string.format("%de%d", rng(9), rng(20) - 10)
    elseif k == 7 then return '"plain text ' .. rng(1000) .. '"'
    else return '"esc \\" \\\\ \\/ \\b\\f\\n\\r\\t \\u00e9 \\ud83d\\ude00 \226\130\172"' end
  elseif r <= 7 then
    local parts = {}
    for i = 1, rng(5) - 1 do parts[i] = gen(rng, depth + 1) end
    return "[ " .. table.concat(parts, " ,\n") .. " ]"
  else
    local parts = {}
    for i = 1, rng(5) - 1 do parts[i] = '"k' .. i .. '" : ' .. gen(rng, depth + 1) end
    return "{\t" .. table.concat(parts, ",") .. "}"
  end
end

describe("core.json_decode", function()
  it("decodes what lua-cjson decodes, to the same values", function()
    local rng = lcg(12345)
    for _ = 1, 500 do
      local text = gen(rng, 0)
      same(cjson.decode(text), decode(text))
    end
  end)

  it("decodes a search response like the one the benchmark uses", function()
    local f = assert(io.open("bench/client/search_response.json"))
    local text = f:read("*a")
    f:close()
    same(cjson.decode(text), decode(text))
  end)

  it("decodes containers of every size side by side at one depth (each sized from the last)", function()
    local parts = {}
    for _, n in ipairs{ 20, 1, 0, 17, 3, 40, 2 } do
      local a, o = {}, {}
      for i = 1, n do a[i] = tostring(i) o[i] = '"k' .. i .. '":' .. i end
      parts[#parts + 1] = "[" .. table.concat(a, ",") .. "]"
      parts[#parts + 1] = "{" .. table.concat(o, ",") .. "}"
    end
    local text = "[" .. table.concat(parts, ",") .. "]"
    same(cjson.decode(text), decode(text))
    assert.equal(40, #decode(text)[11])
  end)

  it("gives every empty array esx.array_mt, so that it encodes back as [] (a _source sent back keeps \"tags\": [])", function()
    local A = core.array_mt
    local src = decode('{"name":"parka","tags":[],"sizes":[ ],"nested":{"a":[[],[1,[]]]},"meta":{}}')
    assert.equal(A, getmetatable(src.tags))
    assert.equal(A, getmetatable(src.sizes))
    assert.equal(A, getmetatable(src.nested.a[1]))
    assert.equal(A, getmetatable(src.nested.a[2][2]))
    assert.equal(0, #src.tags)
    assert.is_nil(next(src.tags))
    -- non-empty arrays and objects (empty or not) stay plain tables
    assert.is_nil(getmetatable(src.nested.a))
    assert.is_nil(getmetatable(src.nested.a[2]))
    assert.is_nil(getmetatable(src.meta))
    assert.is_nil(getmetatable(src))
    assert.equal(A, getmetatable(decode("[]")))
    -- the round trip: decoded, changed, encoded again
    src.name = "coat"
    local back = decode(core.json_encode(src))
    assert.equal(A, getmetatable(back.tags))
    assert.equal("[]", core.json_encode(src.tags))
    assert.equal("[[],[1,[]]]", core.json_encode(src.nested.a))
    assert.equal("{}", core.json_encode(src.meta))
    assert.truthy(core.json_encode(src):find('"tags":[]', 1, true))
  end)

  it("returns null as cjson.null", function()
    assert.equal(cjson.null, decode("null"))
    assert.equal(cjson.null, decode('{"a":null}').a)
  end)

  it("keeps integers exact up to 2^53, and 64-bit ones in Lua 5.4", function()
    assert.equal(9007199254740991, decode("9007199254740991"))
    assert.equal(-42, decode("-42"))
    assert.equal(0, decode("0"))
    if not jit then
      assert.equal(math.type(decode("12")), "integer")
      assert.equal(9223372036854775807, decode("9223372036854775807"))
      assert.equal(math.type(decode("1.5")), "float")
    end
    assert.equal(1.5e300, decode("1.5e300"))
  end)

  it("decodes decimals to the same double as strtod, on the fast path and off it", function()
    local rng = math.random
    math.randomseed(20261130)
    local cases = { "0.1", "-0.0", "0.30000000000000004", "123456789012345.6", "1.7976931348623157e308",
      "5e-324", "9007199254740993.0", "1e22", "1e23", "1.5e-22", "1.5e-23", "0.000001234",
      "12.5e+3", "-3.14159", "2.2250738585072014e-308", "1.00000000000000000001" }
    for _ = 1, 20000 do
      local digits = rng(1, 18)
      local m = tostring(rng(0, 10 ^ math.min(digits, 9))) .. tostring(rng(0, 10 ^ math.max(0, digits - 9)))
      local point = rng(1, #m)
      local int = m:sub(1, point):gsub("^0+", "")
      local text = (int ~= "" and int or "0") .. "." .. (m:sub(point + 1) ~= "" and m:sub(point + 1) or "0")
      if rng(3) == 1 then text = text .. "e" .. tostring(rng(-30, 30)) end
      if rng(2) == 1 then text = "-" .. text end
      cases[#cases + 1] = text
    end
    for _, text in ipairs(cases) do
      local v = decode(text)
      local want = tonumber(text)
      assert(v == want and 1 / v == 1 / want, ("%s: got %.17g, strtod %.17g"):format(text, v, want))
    end
  end)

  it("decodes -0 to the double -0.0, as lua-cjson does", function()
    assert.equal(-math.huge, 1 / decode("-0"))
    assert.equal(-math.huge, 1 / decode('{"x":-0}').x)
    if not jit then assert.equal("float", math.type(decode("-0"))) end
    assert.equal(math.huge, 1 / decode("0"))
  end)

  it("decodes escapes and surrogate pairs to UTF-8", function()
    assert.equal('"\\/\b\f\n\r\t', decode('"\\"\\\\\\/\\b\\f\\n\\r\\t"'))
    assert.equal("\195\169\240\159\152\128", decode('"\\u00e9\\ud83d\\ude00"'))
  end)

  local bad = {
    { "", "unexpected end" },
    { "   ", "unexpected end" },
    { "{", "expected a member name" },
    { "[1,", "unexpected end" },
    { "[1 2]", "expected ',' or ']'" },
    { '{"a" 1}', "expected ':'" },
    { '{"a":1 "b":2}', "expected ',' or '}'" },
    { "{a:1}", "expected a member name" },
    { "01", "trailing characters after the value" },
    { "1.", "bad number" },
    { "-", "bad number" },
    { "1e", "bad number" },
    { ".5", "unexpected character" },
    { "tru", "unexpected character" },
    { "nul", "unexpected character" },
    { '"abc', "unterminated string" },
    { '"a\nb"', "control character in a string" },
    { '"\\x"', "bad escape" },
    { '"\\u12"', "bad \\u escape" },
    { '"\\ud83d"', "unpaired surrogate in a \\u escape" },
    { '"\\ude00"', "unpaired surrogate in a \\u escape" },
    { "[1] [2]", "trailing characters after the value" },
    { "{} x", "trailing characters after the value" },
  }
  for _, case in ipairs(bad) do
    it(("returns nil, err with kind 'decode' for %q"):format(case[1]), function()
      local v, err = decode(case[1])
      assert.is_nil(v)
      assert.equal("decode", err.kind)
      assert.truthy(err.message:find(case[2], 1, true), err.message)
    end)
  end

  it("returns nil, err with kind 'decode' past 512 levels of nesting, without crashing", function()
    local v, err = decode(string.rep("[", 513) .. string.rep("]", 513))
    assert.is_nil(v)
    assert.equal("invalid JSON at byte 512: nested too deep", err.message)
    assert.is_table(decode(string.rep("[", 512) .. string.rep("]", 512)))
    local _, err2 = decode(string.rep("[", 100000))
    assert.equal("decode", err2.kind)
  end)

  it("raises when not given a string", function()
    assert.has_error(function() decode({}) end, "bad argument #1 to 'decode' (string expected, got table)")
  end)
end)

describe("core.json_encode", function()
  local encode = core.json_encode

  -- random Lua values of every kind cjson encodes: strings of any bytes, integers, short
  -- decimals, booleans, cjson.null, arrays with holes, objects with string and number keys
  local function value(rng, depth)
    local r = rng(10)
    if depth > 4 or r <= 5 then
      local k = rng(7)
      if k == 1 then return cjson.null elseif k == 2 then return rng(2) == 1
      elseif k == 3 then return rng(2000000000) - 1000000000
      elseif k == 4 then return (rng(2000000) - 1000000) / 8
      elseif k == 5 then
        local b = {}
        for i = 1, rng(12) - 1 do b[i] = string.char(rng(256) - 1) end
        return table.concat(b)
      elseif k == 6 then return 'q"uo\\te/slash\n\t\0 é'
      else return "" end
    elseif r <= 7 then
      local a = {}
      for i = 1, rng(6) - 1 do a[i] = value(rng, depth + 1) end
      if #a > 2 and rng(3) == 1 then a[2] = nil end -- a hole: null
      return a
    else
      local o = {}
      for i = 1, rng(5) - 1 do o["k" .. rng(100)] = value(rng, depth + 1) end
      if rng(4) == 1 then o[rng(5) + 0.5] = true end -- a number key, written as a string
      return o
    end
  end

  it("encodes what lua-cjson encodes, to the same JSON values", function()
    local rng = lcg(4242)
    for _ = 1, 1000 do
      local v = value(rng, 0)
      local text = assert(encode(v))
      same(cjson.decode(cjson.encode(v)), cjson.decode(text))
    end
  end)

  it("writes integers exactly, where cjson keeps 14 digits", function()
    assert.equal('{"user_id":281474976710655}', encode({ user_id = 281474976710655 }))
    assert.equal('[9007199254740992,-9007199254740991,0,10]', encode({ 2^53, -(2^53 - 1), 0, 10.0 }))
    if math.type then
      assert.equal("9223372036854775807", encode(math.maxinteger))
      assert.equal("-9223372036854775808", encode(math.mininteger))
    end
  end)

  it("writes other numbers in the fewest digits that read back as the same double", function()
    assert.equal("0.30000000000000004", encode(0.1 + 0.2))
    assert.equal("0.1", encode(0.1))
    assert.equal("1e+300", encode(1e300))
    local seed = 7
    for _ = 1, 2000 do
      seed = (seed * 1103515245 + 12345) % 2147483648
      local x = (seed / 2147483648 - 0.5) * 10 ^ (seed % 40 - 20)
      assert.equal(x, tonumber(encode(x)))
    end
  end)

  it("writes -0.0 as -0.0, which reads back as the same double (not 0)", function()
    local neg0 = -0.0
    assert.equal("-0.0", encode(neg0))
    assert.equal('{"x":-0.0}', encode({ x = neg0 }))
    assert.equal(-math.huge, 1 / tonumber(encode(neg0)))
    assert.equal(-math.huge, 1 / decode(encode(neg0)))
    assert.equal("0", encode(0.0))
  end)

  it("escapes quotes, backslashes and control characters, and nothing else", function()
    assert.equal([["a\"b\\c/d\n\r\t\b\f\u0001\u001fé"]], encode('a"b\\c/d\n\r\t\b\f\1\31é'))
    assert.equal('"\\u0000"', encode("\0"))
  end)

  it("writes nil and cjson.null as null, an empty table as {}, holes as null", function()
    assert.equal("null", encode(nil))
    assert.equal("null", encode(cjson.null))
    assert.equal("{}", encode({}))
    assert.equal("[1,null,3]", encode({ 1, nil, 3 }))
    assert.equal('{"1.5":true}', encode({ [1.5] = true }))
  end)

  local refused = {
    { "NaN", 0 / 0, "cannot encode NaN or infinity" },
    { "infinity", { n = math.huge }, "cannot encode NaN or infinity" },
    { "a function", { f = print }, "cannot encode a function" },
    { "a table key that is not a string or a number", { [true] = 1 },
      "cannot encode a table key that is not a string or a number" },
    { "an excessively sparse array", { [11] = 1 }, "cannot encode an excessively sparse array" },
  }
  for _, case in ipairs(refused) do
    it("returns nil, err when given " .. case[1], function()
      local s, err = encode(case[2])
      assert.is_nil(s)
      assert.equal(case[3], err)
    end)
  end

  it("returns nil, err when given a cycle or over 1000 levels, without crashing", function()
    local t = {}
    t.t = t
    local s, err = encode(t)
    assert.is_nil(s)
    assert.equal("nested too deep (over 1000 levels, or a cycle)", err)
    local deep = {}
    for _ = 1, 999 do deep = { deep } end
    assert.equal(string.rep("[", 999) .. "{}" .. string.rep("]", 999), encode(deep))
  end)

  it("keeps working after a failure and after a large value", function()
    local s, err = encode({ print })
    assert.is_nil(s)
    assert.equal("cannot encode a function", err)
    local big = string.rep("x", 200000)
    assert.equal(200002, #encode(big))
    assert.equal('["ok"]', encode({ "ok" }))
  end)

  it("raises when given no argument", function()
    assert.has_error(function() encode() end, "bad argument #1 to 'encode' (value expected)")
  end)
end)

describe("core.json_encode: the empty JSON arrays a Lua table cannot express", function()
  local esx = require "esx"
  local fork = require "spec.support.cjson_fork"
  local encode = core.json_encode
  local A, E = esx.array_mt, esx.empty_array
  local BAD_ESX = "cannot encode a table with esx.array_mt that has a key other than a positive integer"
  local BAD_CJSON = "cannot encode a table with cjson.array_mt that has a key other than a positive integer"

  it("exports esx.array_mt (a table) and esx.empty_array (a light userdata): the core's, kept when it is loaded again", function()
    assert.is_table(A)
    assert.equal("userdata", type(E))
    assert.equal(core.array_mt, A)
    assert.equal(core.empty_array, E)
    local saved = package.loaded["esx.core"]
    finally(function() package.loaded["esx.core"] = saved end)
    package.loaded["esx.core"] = nil
    local again = require "esx.core"
    assert.are_not.equal(saved, again) -- luaopen ran again
    assert.equal(A, again.array_mt)
    assert.equal(E, again.empty_array)
    assert.equal("[]", again.json_encode(setmetatable({}, A)))
    assert.equal("[]", encode(setmetatable({}, again.array_mt)))
  end)

  it("writes a table with esx.array_mt as an array: [] when empty, else its items 1..n, holes as null", function()
    assert.equal("[]", encode(setmetatable({}, A)))
    assert.equal('[1,"b",true]', encode(setmetatable({ 1, "b", true }, A)))
    assert.equal("[1,null,3]", encode(setmetatable({ 1, nil, 3 }, A)))
    assert.equal("{}", encode({})) -- without it, lua-cjson's rule: still an object
  end)

  it("writes esx.empty_array as []", function()
    assert.equal("[]", encode(E))
    assert.equal("[[],[]]", encode({ E, setmetatable({}, A) }))
  end)

  it("writes both nested inside objects and arrays, at any depth", function()
    assert.equal('{"query":{"bool":{"must_not":[]}}}', encode({ query = { bool = { must_not = E } } }))
    assert.equal('{"sort":[]}', encode({ sort = setmetatable({}, A) }))
    assert.equal('[{"a":[{"b":[]}]}]', encode({ { a = { { b = setmetatable({}, A) } } } }))
    local deep = E
    for _ = 1, 998 do deep = { deep } end
    assert.equal(string.rep("[", 999) .. string.rep("]", 999), encode(deep))
  end)

  it("returns nil, err for a table with esx.array_mt that has a key other than a positive integer", function()
    for _, t in ipairs{ { a = 1 }, { 1, 2, x = 3 }, { [0] = 1 }, { [-1] = 1 }, { [1.5] = 1 }, { [true] = 1 } } do
      local s, err = encode(setmetatable(t, A))
      assert.is_nil(s)
      assert.equal(BAD_ESX, err)
    end
    local s, err = encode({ query = { bool = { must = setmetatable({ term = {} }, A) } } })
    assert.is_nil(s)
    assert.equal(BAD_ESX, err)
    s, err = encode(setmetatable({ [11] = 1 }, A))
    assert.is_nil(s)
    assert.equal("cannot encode an excessively sparse array", err)
  end)

  it("leaves a table with any other metatable to lua-cjson's rule, and refuses any other light userdata", function()
    assert.equal("{}", encode(setmetatable({}, {})))
    assert.equal("[1,2]", encode(setmetatable({ 1, 2 }, { __index = function() return 0 end })))
    local cj = fork.new() -- not loaded: its markers are nothing to esx
    assert.equal("{}", encode(setmetatable({}, cj.array_mt)))
    local s, err = encode({ cj.empty_array })
    assert.is_nil(s)
    assert.equal("cannot encode a userdata", err)
  end)

  for _, name in ipairs{ "cjson", "cjson.safe" } do
    it("honours OpenResty lua-cjson's empty_array, array_mt and empty_array_mt when package.loaded['" ..
       name .. "'] has them", function()
      local cj, restore = fork.install(name)
      finally(restore)
      assert.equal("[]", encode(cj.empty_array))
      assert.equal("[]", encode(setmetatable({}, cj.array_mt)))
      assert.equal('[1,null,"c"]', encode(setmetatable({ 1, nil, "c" }, cj.array_mt)))
      assert.equal("[]", encode(setmetatable({}, cj.empty_array_mt)))
      assert.equal('{"k":1}', encode(setmetatable({ k = 1 }, cj.empty_array_mt)))
      assert.equal("[1,2]", encode(setmetatable({ 1, 2 }, cj.empty_array_mt)))
      assert.equal("null", encode(cj.null))
      local doc, text = fork.document(esx, cj)
      assert.equal(text, encode(doc))
      local s, err = encode({ q = setmetatable({ a = 1 }, cj.array_mt) })
      assert.is_nil(s)
      assert.equal(BAD_CJSON, err)
      restore() -- unloaded: looked up at each encoding, not remembered
      assert.equal("{}", encode(setmetatable({}, cj.array_mt)))
      s, err = encode(cj.empty_array)
      assert.is_nil(s)
      assert.equal("cannot encode a userdata", err)
    end)
  end
end)
