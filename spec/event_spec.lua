-- Beacon events from untrusted bodies (src/event.c, src/json.c via core.events_parse and
-- core.event_from_query).  Reject indexes are 0-based, as in the collector's HTTP answer
-- {"accepted":n,"rejected":[{"index":i,"error":"..."}]}.
local core = require "esx.core"
local cjson = require "cjson.safe"

local NOW = 1700000000123

local function parse(body, max)
  return core.events_parse(body, NOW, max)
end

-- the error of the one reject of a parse (docs, rejects) that accepted nothing
local function only_reject(docs, rejects)
  assert(docs, rejects and tostring(rejects))
  assert.equal(0, #docs)
  assert.equal(1, #rejects)
  assert.equal(0, rejects[1].index)
  return rejects[1].error
end

-- the one reject of a one-event body
local function reason(body)
  return only_reject(parse(body))
end

local function accepted(body)
  local docs, rejects = parse(body)
  assert(docs, rejects and tostring(rejects))
  assert.same({}, rejects)
  assert.equal(1, #docs)
  return docs[1]
end

local function ev(extra)
  return '{"site_id":"s1","type":"view"' .. (extra or "") .. "}"
end

describe("core.events_parse", function()
  it("adds received_at and a 20-character event_id to one object, minified, members in order", function()
    local d = accepted(' {\n "site_id" : "s1",\t"type":"view" , "x" : [ 1 , { "y" : "a b" } ] }\r\n')
    assert.truthy(d.event_id:match("^[A-Za-z0-9_%-]+$"))
    assert.equal(20, #d.event_id)
    assert.equal('{"site_id":"s1","type":"view","x":[1,{"y":"a b"}],"received_at":' .. NOW
      .. ',"event_id":"' .. d.event_id .. '"}', d.doc)
    assert.equal("s1", d.site_id)
    assert.equal("view", d.type)
    assert.is_nil(d.block_id)
    assert.is_nil(d.variant)
    assert.is_nil(d.user_id)
  end)

  it("returns the schema fields of each event", function()
    local d = accepted(ev(',"block_id":"b-1","variant":"A.2","user_id":"u 1","ts":17'))
    assert.same({ "s1", "view", "b-1", "A.2", "u 1" }, { d.site_id, d.type, d.block_id, d.variant, d.user_id })
  end)

  it("keeps a client event_id where it was and adds none", function()
    local d = accepted('{"event_id":"abc:1.2_3-4","site_id":"s","type":"t"}')
    assert.equal("abc:1.2_3-4", d.event_id)
    assert.equal('{"event_id":"abc:1.2_3-4","site_id":"s","type":"t","received_at":' .. NOW .. "}", d.doc)
  end)

  it("generates distinct ids", function()
    local seen = {}
    for _ = 1, 2000 do
      local d = accepted(ev())
      assert.is_nil(seen[d.event_id])
      seen[d.event_id] = true
    end
  end)

  it("replaces a client received_at", function()
    local d = accepted('{"received_at":1,"site_id":"s","type":"t"}')
    assert.equal('{"site_id":"s","type":"t","received_at":' .. NOW .. ',"event_id":"' .. d.event_id .. '"}', d.doc)
  end)

  it("keeps numbers byte-exact, however big or precise", function()
    local nums = { "123456789012345678901234567890", "-0", "1E+2", "1.5e300000", "-1.0e-400",
                   "0.10000000000000000000001", "9007199254740993" }
    for _, n in ipairs(nums) do
      local d = accepted(ev(',"n":' .. n))
      assert.truthy(d.doc:find('"n":' .. n .. ',', 1, true), n)
    end
  end)

  it("keeps newlines, quotes and other escapes inside one line", function()
    local d = accepted(ev(',"m":"a\\nb\\r\\"c\\\\d\\u2028\\u0000\\t"'))
    assert.is_nil(d.doc:find("\n", 1, true))
    assert.is_nil(d.doc:find("\r", 1, true))
    local t = assert(cjson.decode(d.doc))
    assert.equal('a\nb\r"c\\d\226\128\168\0\t', t.m)
  end)

  it("accepts valid UTF-8 raw and escaped (pairs)", function()
    local d = accepted(ev(',"m":"é € 😀 \\ud83d\\ude00 \\u00e9"'))
    assert.equal("é € 😀 😀 é", assert(cjson.decode(d.doc)).m)
  end)

  describe("schema", function()
    local cases = {
      { '{"type":"t"}', "missing site_id" },
      { '{"site_id":"s"}', "missing type" },
      { '{"site_id":1,"type":"t"}', "site_id: not a string" },
      { '{"site_id":null,"type":"t"}', "site_id: not a string" },
      { '{"site_id":"","type":"t"}', "site_id: invalid length" },
      { '{"site_id":"' .. ("a"):rep(65) .. '","type":"t"}', "site_id: invalid length" },
      { '{"site_id":"a b","type":"t"}', "site_id: invalid characters" },
      { '{"site_id":"a:b","type":"t"}', "site_id: invalid characters" },
      { '{"site_id":"é","type":"t"}', "site_id: invalid characters" },
      { '{"site_id":"s","type":["t"]}', "type: not a string" },
      { '{"site_id":"s","type":"' .. ("a"):rep(33) .. '"}', "type: invalid length" },
      { '{"site_id":"s","type":"a/b"}', "type: invalid characters" },
      { ev(',"block_id":2'), "block_id: not a string" },
      { ev(',"block_id":""'), "block_id: invalid length" },
      { ev(',"block_id":"' .. ("b"):rep(65) .. '"'), "block_id: invalid length" },
      { ev(',"block_id":"b\\n"'), "block_id: invalid characters" },
      { ev(',"variant":true'), "variant: not a string" },
      { ev(',"variant":"' .. ("v"):rep(65) .. '"'), "variant: invalid length" },
      { ev(',"variant":"v?"'), "variant: invalid characters" },
      { ev(',"user_id":1.5'), "user_id: not a string or integer" },
      { ev(',"user_id":1e3'), "user_id: not a string or integer" },
      { ev(',"user_id":{}'), "user_id: not a string or integer" },
      { ev(',"user_id":""'), "user_id: invalid length" },
      { ev(',"user_id":"' .. ("u"):rep(129) .. '"'), "user_id: invalid length" },
      { ev(',"user_id":"a\\u0000b"'), "user_id: invalid characters" },
      { ev(',"event_id":5'), "event_id: not a string" },
      { ev(',"event_id":""'), "event_id: invalid length" },
      { ev(',"event_id":"' .. ("e"):rep(65) .. '"'), "event_id: invalid length" },
      { ev(',"event_id":"e/1"'), "event_id: invalid characters" },
      { ev(',"ts":"1"'), "ts: not a number" },
      -- ts is a date of format epoch_millis in the day's index: what that parser refuses
      -- would be dead-lettered after its 2xx
      { ev(',"ts":1.7e12'), "ts: exponent form (Elasticsearch's epoch_millis takes digits only)" },
      { ev(',"ts":1700000000000E0'), "ts: exponent form (Elasticsearch's epoch_millis takes digits only)" },
      { ev(',"ts":-1.5e3'), "ts: exponent form (Elasticsearch's epoch_millis takes digits only)" },
      { ev(',"ts":-1'), "ts: negative (before 1970)" },
      { ev(',"ts":-0'), "ts: negative (before 1970)" },
      { ev(',"ts":9223372036854775808'), "ts: out of range (more than 2^63-1 ms)" },
      { ev(',"ts":10000000000000000000.5'), "ts: out of range (more than 2^63-1 ms)" },
      { ev(',"ts":1700000000000.1234567'), "ts: more than 6 decimal places" },
      { ev(',"":1'), "empty member name" },
      -- names Elasticsearch's document parser refuses at any level (split at dots into
      -- object levels): accepted, such an event would get its 2xx and then be dead-lettered
      { ev(',"o":{"":1}'), "empty member name" },
      { ev(',"o":[1,[{"a":{"\\u0000":1,"":2}}]]'), "empty member name" },
      { ev(',"..":1'), "member name of dots only" },
      { ev(',"o":{".":1}'), "member name of dots only" },
      { ev(',".a":1'), "member name with an empty part (a leading dot or two dots in a row)" },
      { ev(',"a..b":1'), "member name with an empty part (a leading dot or two dots in a row)" },
      { ev(',"o":{"a\\u002e.b":1}'), "member name with an empty part (a leading dot or two dots in a row)" },
      { ev(',"o":{"a.' .. ("x"):rep(300) .. '..\\u0062":1}'),
        "member name with an empty part (a leading dot or two dots in a row)" },
      { ev(',"  ":1'), "member name (or a part of it between dots) of whitespace only" },
      { ev(',"a. .b":1'), "member name (or a part of it between dots) of whitespace only" },
      { ev(',"o":{"\\t\\u3000\\u2028\\u001f":1}'), "member name (or a part of it between dots) of whitespace only" },
      { ev(',"o":{"a.\u{2009}":1}'), "member name (or a part of it between dots) of whitespace only" },
      -- a dotted top-level name under a field of esx's mappings (a date or a keyword there)
      { ev(',"ts.x":1'), "member name with a dot after a field of the schema (site_id, ts, ...)" },
      { ev(',"site_id.a":"b"'), "member name with a dot after a field of the schema (site_id, ts, ...)" },
      { ev(',"received_at.x":1'), "member name with a dot after a field of the schema (site_id, ts, ...)" },
      { ev(',"us\\u0065r_id.":"u"'), "member name with a dot after a field of the schema (site_id, ts, ...)" },
      { ev(',"_id":"x"'), "reserved field _id" },
      { ev(',"_index":"other"'), "reserved field _index" },
      { ev(',"\\u005fsource":{}'), "reserved field _source" },
      { ev(',"_a\\nb":1'), "reserved field _a?b" },
      { ev(',"_' .. ("x"):rep(80) .. '":1'), "reserved field _" .. ("x"):rep(63) .. "..." },
      { "[1]", nil },
    }
    for _, c in ipairs(cases) do
      if c[2] then
        it("rejects " .. c[1]:sub(1, 70) .. " with '" .. c[2] .. "'", function()
          assert.equal(c[2], reason(c[1]))
        end)
      end
    end

    it("accepts the limits of every field", function()
      local d = accepted('{"site_id":"' .. ("a"):rep(64) .. '","type":"' .. ("Z"):rep(32)
        .. '","block_id":"' .. ("0"):rep(64) .. '","variant":"._-","event_id":"' .. ("e"):rep(64)
        .. '","user_id":"' .. ("ü"):rep(64) .. '","ts":9223372036854775807.123456}')
      assert.equal(("a"):rep(64), d.site_id)
      assert.equal(("ü"):rep(64), d.user_id)
      assert.equal(("e"):rep(64), d.event_id)
      assert.truthy(d.doc:find('"ts":9223372036854775807.123456,', 1, true))
    end)

    it("accepts a ts Elasticsearch's epoch_millis parser reads: 0, integers, up to 6 decimals", function()
      for _, ts in ipairs{ "0", "0.5", "1700000000000", "1700000000000.123456", "9223372036854775807" } do
        assert.truthy(accepted(ev(',"ts":' .. ts)).doc:find('"ts":' .. ts .. ",", 1, true), ts)
      end
    end)

    it("takes an integer user_id as its decimal text", function()
      assert.equal("12345678901234567890", accepted(ev(',"user_id":12345678901234567890')).user_id)
      assert.equal("-7", accepted(ev(',"user_id":-7')).user_id)
    end)

    it("ships an integer user_id as a string of its digits, as a pixel's user_id is", function()
      -- a number would have Elasticsearch map user_id as long for the day's index, and then
      -- refuse every event with a string user_id (the common form, and every pixel's)
      local d = accepted(ev(',"user_id":12345678901234567890,"n":-7'))
      assert.equal('{"site_id":"s1","type":"view","user_id":"12345678901234567890","n":-7,'
        .. '"received_at":1700000000123,"event_id":"' .. d.event_id .. '"}', d.doc)
      assert.truthy(accepted(ev(',"user_id":-0')).doc:find(',"user_id":"-0",', 1, true))
      local q = assert(core.event_from_query("site_id=s1&type=view&user_id=42", NOW))[1]
      assert.truthy(q.doc:find(',"user_id":"42",', 1, true))
    end)

    it("matches schema names after decoding escapes", function()
      local d = accepted('{"site\\u005fid":"s","\\u0074ype":"t"}')
      assert.equal("s", d.site_id)
      assert.equal("t", d.type)
    end)

    it("accepts the names Elasticsearch splits at dots: a trailing dot, no-break spaces", function()
      -- Java's split drops trailing empty parts ("a." is "a"); String.isBlank does not take
      -- U+00A0, U+2007 or U+202F for whitespace
      for _, name in ipairs{ "a.", "a.b.", "o.\\u00a0", "\u{2007}", "\u{202F}.x", " a .b", "tsx.y", "x.ts" } do
        assert.truthy(accepted(ev(',"o":{"' .. name .. '":1},"' .. name .. '":2')), name)
      end
    end)

    it("keeps '_' names below the top level and any other member", function()
      local d = accepted(ev(',"meta":{"_id":1,"_x":[]},"x_":2'))
      assert.truthy(d.doc:find('"meta":{"_id":1,"_x":[]},"x_":2,', 1, true))
    end)
  end)

  describe("duplicate member names", function()
    it("are rejected at the top level", function()
      assert.equal("duplicate member name", reason(ev(',"site_id":"s2"')))
      assert.equal("duplicate member name", reason(ev(',"a":1,"a":2')))
    end)

    it("are rejected when escapes decode to the same name", function()
      assert.equal("duplicate member name", reason(ev(',"a":1,"\\u0061":2')))
      assert.equal("duplicate member name", reason(ev(',"😀":1,"\\ud83d\\ude00":2')))
    end)

    it("are rejected inside nested objects, small and large", function()
      assert.equal("duplicate member name", reason(ev(',"o":{"x":1,"y":{"x":2,"x":3}}')))
      local many = {}
      for i = 1, 200 do many[#many + 1] = '"k' .. i .. '":' .. i end
      assert.truthy(accepted(ev(',"o":{' .. table.concat(many, ",") .. '}')))
      many[#many + 1] = '"k\\u0031\\u00300":0' -- k10 again
      assert.equal("duplicate member name", reason(ev(',"o":{' .. table.concat(many, ",") .. '}')))
    end)

    it("are fine in different objects", function()
      assert.truthy(accepted(ev(',"a":{"x":1},"b":{"x":1},"c":[{"x":1},{"x":1}]')))
    end)

    -- the check runs within the pass that writes the document: a member rejected for
    -- another reason before the duplicate is reached still gives "duplicate member name"
    it("are reported before any other reason, wherever they are", function()
      assert.equal("duplicate member name", reason('{"site_id":"bad id","type":"t","a":1,"a":2}'))
      assert.equal("duplicate member name", reason('{"_x":1,"site_id":"s","type":"t","o":{"k":1,"k":2}}'))
      assert.equal("duplicate member name", reason('{"":1,"site_id":"s","type":"t","\\u0074ype":"u"}'))
      assert.equal("duplicate member name", reason('{"type":"t","a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"a":9}'))
      assert.equal("duplicate member name", reason('{"user_id":[],"site_id":"s","type":"t","site_id":"s"}'))
      -- and without a duplicate the member's own reason is given
      assert.equal("site_id: invalid characters", reason('{"site_id":"bad id","type":"t","a":1,"b":2}'))
      assert.equal("reserved field _x", reason('{"_x":1,"site_id":"s","type":"t","o":{"k":1,"j":2}}'))
    end)

    it("are told apart from names that only look alike", function()
      -- escaped quotes and backslashes in names and values, nested containers as values
      local d = accepted(ev(',"a\\"":1,"a\\\\":2,"a":"x\\"}","o":{"q":"]\\\\","r":[{"s":"{"}]},"n":-1.5e3,"t":true,"f":false,"z":null'))
      assert.truthy(d.doc:find('"a\\"":1,"a\\\\":2,"a":"x\\"}","o":{"q":"]\\\\","r":[{"s":"{"}]},"n":-1.5e3,"t":true,"f":false,"z":null,', 1, true))
    end)

    it("find the end of strings and containers whatever their offset in an 8-byte word", function()
      -- the scans read eight bytes at a time and step to the first quote, backslash or
      -- bracket of a word: shift every special byte through all eight positions, in an
      -- array of events (skipped once validated) and in nested values
      local tricky = 'x\\"}]\\\\{[\\"y'
      for pad = 0, 16 do
        local p = ("p"):rep(pad)
        -- (a name of the pad, but never "": Elasticsearch refuses an empty name at any level;
        -- pad 0's offsets are pad 1's, and 17 pads go round the word twice)
        local value = '{"' .. (pad == 0 and "p" or p) .. '":"' .. p .. tricky .. '","l":["' .. tricky .. p .. '",{"' .. p .. '}":"]"}]}'
        local one = '{"site_id":"s","type":"t","' .. p .. 'k":' .. value .. '}'
        local docs, rejects = parse("[" .. one .. "," .. one .. ', {"site_id":"s2","type":"t2"}]')
        assert(docs, rejects and tostring(rejects))
        assert.same({}, rejects)
        assert.equal(3, #docs)
        for i = 1, 2 do
          assert.equal("s", docs[i].site_id)
          assert.truthy(docs[i].doc:find('"' .. p .. 'k":' .. value .. ',"received_at":', 1, true), pad)
        end
        assert.equal("s2", docs[3].site_id)
        assert.equal("t2", docs[3].type)
      end
    end)
  end)

  describe("nesting", function()
    local function nested(n)
      return ev(',"d":' .. ("["):rep(n - 1) .. ("]"):rep(n - 1))
    end

    it("accepts 32 levels counting the event object", function()
      assert.truthy(accepted(nested(32)))
    end)

    it("rejects 33 levels with 'nesting deeper than 32'", function()
      assert.equal("nesting deeper than 32", reason(nested(33)))
    end)

    -- an event whose objects go down to level n (the event itself is level 1), the last one
    -- holding leaf
    local function objects(n, leaf)
      return ev(',"o":' .. ('{"o":'):rep(n - 1) .. (leaf or "1") .. ("}"):rep(n - 1))
    end
    local TOO_DEEP = "objects nested deeper than 20 (Elasticsearch's index.mapping.depth.limit)"

    it("accepts objects 20 levels deep, arrays and dotted names counted as Elasticsearch does", function()
      assert.truthy(accepted(objects(20)))
      assert.truthy(accepted(objects(20, "[[[1,[]]]]")))       -- arrays are no level
      assert.truthy(accepted(objects(19, '{"a.":1}')))         -- "a." is "a", a leaf
      assert.truthy(accepted(ev(',"' .. ("a."):rep(19) .. 'a":1')))  -- objects at 2..20
      assert.truthy(accepted(objects(17, '{"x.y":{}}')))        -- x at 19, x.y at 20
      assert.truthy(accepted(ev(',"a.b":' .. ('{"o":'):rep(18) .. "1" .. ("}"):rep(18))))
    end)

    it("rejects objects deeper than Elasticsearch's mappings go (21 levels), dotted names' too", function()
      -- index.mapping.depth.limit (20 by default): such an event would get its 2xx and then be
      -- refused by Elasticsearch (dead-lettered)
      assert.equal(TOO_DEEP, reason(objects(21)))
      assert.equal(TOO_DEEP, reason(objects(20, "[{}]")))
      assert.equal(TOO_DEEP, reason(ev(',"' .. ("a."):rep(20) .. 'a":1')))
      assert.equal(TOO_DEEP, reason(objects(18, '{"x.y":{}}')))
      assert.equal(TOO_DEEP, reason(objects(18, '{"x.y.z":1}')))
      assert.equal(TOO_DEEP, reason(ev(',"a.b":' .. ('{"o":'):rep(19) .. "1" .. ("}"):rep(19))))
    end)

    it("rejects a deep element of an array on its own", function()
      local docs, rejects = parse("[" .. ev() .. "," .. nested(100) .. "]")
      assert.equal(1, #docs)
      assert.same({ { index = 1, error = "nesting deeper than 32" } }, rejects)
    end)

    it("returns nil, err when a body nests deeper than 512", function()
      local docs, err = parse(("["):rep(5000) .. ("]"):rep(5000))
      assert.is_nil(docs)
      assert.equal("not_json", err.kind)
      assert.equal("invalid JSON at byte 512: nesting too deep", err.message)
    end)

    it("rejects an NDJSON line nested deeper than 512 as invalid JSON", function()
      local docs, rejects = parse(ev() .. "\n" .. ev(',"d":' .. ("{\"a\":"):rep(600) .. "1" .. ("}"):rep(600)))
      assert.equal(1, #docs)
      assert.same({ { index = 1, error = "invalid JSON" } }, rejects)
    end)
  end)

  describe("invalid UTF-8 and escapes", function()
    local cases = {
      { "\192\175", "invalid UTF-8" },            -- overlong '/'
      { "\224\128\175", "invalid UTF-8" },        -- overlong 3-byte
      { "\240\128\128\175", "invalid UTF-8" },    -- overlong 4-byte
      { "\237\160\128", "invalid UTF-8" },        -- U+D800 encoded in UTF-8
      { "\237\191\191", "invalid UTF-8" },        -- U+DFFF
      { "\244\144\128\128", "invalid UTF-8" },    -- U+110000
      { "\255", "invalid UTF-8" },
      { "\195", "invalid UTF-8" },                -- truncated
      { "\226\130", "invalid UTF-8" },
      { "\128", "invalid UTF-8" },                -- lone continuation
      { "\\ud800", "invalid escape" },            -- lone high surrogate
      { "\\udc00\\ud800", "invalid escape" },     -- reversed pair
      { "\\ud800\\u0041", "invalid escape" },
      { "\\u12", "invalid escape" },
      { "\\x", "invalid escape" },
      { "\\'", "invalid escape" },
      { "a\tb", "control character in string" },
      { "a\nb", "control character in string" },
      { "\0", "control character in string" },
    }
    for _, c in ipairs(cases) do
      it(("rejects %q with '%s'"):format(c[1], c[2]), function()
        assert.equal(c[2], reason(ev(',"m":"' .. c[1] .. '"')))
      end)
    end

    it("checks member names too", function()
      assert.equal("invalid UTF-8", reason(ev(',"\192\175":1')))
    end)

    it("accepts the largest code points of each length", function()
      assert.truthy(accepted(ev(',"m":"\127 \223\191 \239\191\191 \244\143\191\191 \237\159\191 \238\128\128"')))
    end)
  end)

  describe("arrays", function()
    it("accepts valid events and rejects the others by 0-based index", function()
      local docs, rejects = parse("[" .. ev() .. ', 3, {"site_id":"x"}, ' .. ev(',"n":1') .. ",[]]")
      assert.equal(2, #docs)
      assert.same({ { index = 1, error = "not an object" }, { index = 2, error = "missing type" },
                    { index = 4, error = "not an object" } }, rejects)
    end)

    it("rejects only the elements with a flaw of their own (escapes, UTF-8, control bytes)", function()
      local docs, rejects = parse("[" .. ev(',"m":"\\x"') .. "," .. ev(',"m":"a\\"b"') .. ","
        .. ev(',"m":"\255"') .. "," .. ev(',"m":{"n":["\\\\",1]}') .. "," .. ev(',"m":"a\tb"') .. "]")
      assert.equal(2, #docs)
      assert.same({ { index = 0, error = "invalid escape" }, { index = 2, error = "invalid UTF-8" },
                    { index = 4, error = "control character in string" } }, rejects)
      assert.truthy(docs[1].doc:find('"m":"a\\"b"', 1, true))
      assert.truthy(docs[2].doc:find('"m":{"n":["\\\\",1]}', 1, true))
    end)

    it("returns empty lists for []", function()
      local docs, rejects = parse(" [ ] ")
      assert.same({}, docs)
      assert.same({}, rejects)
    end)
  end)

  describe("NDJSON", function()
    it("skips blank lines and rejects bad lines by index", function()
      local body = ev() .. "\r\n\n   \n{bad\n" .. ev(',"n":2') .. "\n[1]\n" .. '{"site_id":"s"}' .. "\n\n"
      local docs, rejects = parse(body)
      assert.equal(2, #docs)
      assert.truthy(docs[2].doc:find('"n":2', 1, true))
      assert.same({ { index = 1, error = "invalid JSON" }, { index = 3, error = "not an object" },
                    { index = 4, error = "missing type" } }, rejects)
    end)

    it("handles a last line without newline", function()
      local docs = parse(ev() .. "\n" .. ev())
      assert.equal(2, #docs)
    end)

    it("reads the lines after a first line that is not an object (a scalar, an array, garbage)", function()
      -- the same lines with an object first were read one by one; this first line refused
      -- the whole body as not JSON, valid events included
      for _, first in ipairs{ { "null", "not an object" }, { "123", "not an object" },
                              { "[1]", "not an object" }, { "[" .. ev() .. "]", "not an object" },
                              { "garbage", "invalid JSON" }, { "\239\187\191null", "not an object" } } do
        local docs, rejects = parse(first[1] .. "\n" .. ev() .. "\n\n" .. ev(',"n":2') .. "\n")
        assert(docs, rejects and tostring(rejects))
        assert.equal(2, #docs)
        assert.truthy(docs[2].doc:find('"n":2', 1, true))
        assert.same({ { index = 0, error = first[2] } }, rejects)
      end
      -- still not JSON: one line, a pretty-printed array that is broken, or no line that is JSON
      for _, body in ipairs{ "null", "[1] x\n" .. ev(), "[\n" .. ev() .. ",\n" .. ev() .. "\n", "hello\nworld" } do
        local docs, err = parse(body)
        assert.is_nil(docs)
        assert.equal("not_json", err.kind)
      end
      local docs, err = parse("null\n" .. ev() .. "\n" .. ev(), 2)
      assert.is_nil(docs)
      assert.equal("too_many", err.kind)
    end)
  end)

  describe("max_events", function()
    it("defaults to 100", function()
      local lines = {}
      for i = 1, 100 do lines[i] = ev() end
      assert.equal(100, #parse(table.concat(lines, "\n")))
      lines[101] = ev()
      local docs, err = parse(table.concat(lines, "\n"))
      assert.is_nil(docs)
      assert.equal("too_many", err.kind)
    end)

    it("returns nil, err when an array has more events than max_events", function()
      local docs, err = parse("[" .. ev() .. "," .. ev() .. ",1]", 2)
      assert.is_nil(docs)
      assert.equal("too_many", err.kind)
      assert.equal("too_many: too many events", tostring(err))
      assert.equal(2, #parse("[" .. ev() .. "," .. ev() .. ",1]", 3))
    end)

    it("returns nil, err when NDJSON has more non-blank lines than max_events", function()
      local docs, err = parse(ev() .. "\n\n" .. ev() .. "\nbad", 2)
      assert.is_nil(docs)
      assert.equal("too_many", err.kind)
    end)

    it("raises for a max_events out of range", function()
      -- by name, not through the tail-calling parse(): LuaJIT would name 'parse', Lua 5.4 the callee
      local msg = "bad argument #3 to 'events_parse' (max_events must be an integer from 1 to 100000)"
      assert.has_error(function() core.events_parse(ev(), NOW, 0) end, msg)
      assert.has_error(function() core.events_parse(ev(), NOW, 1.5) end, msg)
      assert.has_error(function() core.events_parse(ev(), NOW, 100001) end, msg)
    end)
  end)

  it("skips a UTF-8 byte-order mark at the start of the body (RFC 8259 8.1)", function()
    local bom = "\239\187\191"
    local d = accepted(bom .. ev())
    assert.equal('{"site_id":"s1","type":"view","received_at":' .. NOW .. ',"event_id":"'
      .. d.event_id .. '"}', d.doc)
    local docs, rejects = parse(bom .. "[" .. ev() .. "," .. ev() .. "]")
    assert.same({}, rejects)
    assert.equal(2, #docs)
    docs, rejects = parse(bom .. ev() .. "\n" .. ev() .. "\n")
    assert.same({}, rejects)
    assert.equal(2, #docs)
    docs, rejects = parse(bom .. "\n" .. ev() .. "\nx\n" .. ev())
    assert.same({ { index = 1, error = "invalid JSON" } }, rejects)
    assert.equal(2, #docs)
  end)

  describe("returns nil, err with kind not_json", function()
    local cases = {
      { "", "empty body" },
      { " \n\t ", "empty body" },
      { "hello", "not a JSON object, array or NDJSON" },
      { '"str"', "not a JSON object, array or NDJSON" },
      { "123", "not a JSON object, array or NDJSON" },
      { "null", "not a JSON object, array or NDJSON" },
      { "[1,", "invalid JSON at byte 3: unexpected end" },
      { "[1] x", "trailing bytes after the JSON array" },
      { "[1 2]", "invalid JSON at byte 3: expected ',' or ']'" },
      { '{"a":', "invalid JSON at byte 5: unexpected end" },
      { '{"a" 1}', "invalid JSON at byte 5: expected ':'" },
      { "{a:1}", "invalid JSON at byte 1: expected a member name" },
      { '{"a":1,}', "invalid JSON at byte 7: expected a member name" },
      { '{"a":tru}', "invalid JSON at byte 5: invalid literal" },
      { '{"a":"x}', "invalid JSON at byte 8: unterminated string" },
      { "{} {}", "trailing bytes after the JSON object" },
      { "\239\187\191", "empty body" }, -- a BOM alone
      { "\239\187\191[1,", "invalid JSON at byte 6: unexpected end" }, -- offsets count the BOM
      { " \239\187\191{}", "not a JSON object, array or NDJSON" }, -- a BOM not at the start
      { "\239\187\191\239\187\191{}", "not a JSON object, array or NDJSON" }, -- two
    }
    for _, c in ipairs(cases) do
      it(("for %q"):format(c[1]), function()
        local docs, err = parse(c[1])
        assert.is_nil(docs)
        assert.equal("not_json", err.kind)
        assert.equal(c[2], err.message)
      end)
    end

    for _, n in ipairs({ "01", "1.", ".5", "+1", "1e", "1e+", "-", "--1", "0x10", "NaN", "Infinity", "1.e5", "-01" }) do
      it("for the number " .. n, function()
        local docs, err = parse(ev(',"n":' .. n))
        assert.is_nil(docs)
        assert.equal("not_json", err.kind)
      end)
    end
  end)

  -- RFC 8259 corner cases in the style of JSONTestSuite: inside an array, a valid value that
  -- is not an object is a reject ("not an object"), a flawed one a reject with its flaw, and
  -- bad grammar makes the whole body not JSON.
  describe("JSON grammar", function()
    local valid = { "0", "-0", "-0.0e-0", "1E400", "[]", "[[]]", '""', '"\\u0000"', '"\\/"', '"\\u00e9"',
                    '"\\uD83D\\uDE00"', '"\\uDBFF\\uDFFF"', '"\\u2028"', '"\127"', "true", "null", "[1,[2,[3]]]",
                    ' [ 1 ] ', '{"a":{}}' }
    for _, v in ipairs(valid) do
      it("takes " .. v .. " as a value", function()
        local docs, rejects = parse("[" .. v .. "]")
        assert(docs, rejects and tostring(rejects))
        assert.equal(1, #rejects)
        local want = v == '{"a":{}}' and "missing site_id" or "not an object"
        assert.equal(want, rejects[1].error)
      end)
    end
    local flawed = { { '"\\uD800\\uDBFF"', "invalid escape" }, { '"\\uDFFF"', "invalid escape" },
                     { '"\\u00G0"', "invalid escape" }, { '"\\U0041"', "invalid escape" },
                     { '"\\a"', "invalid escape" }, { '"\\\\\\"', "unterminated" },
                     { '"\\u00"', "invalid escape" }, { '"\\31"', "invalid escape" },
                     { '"\\u0041\\"', "unterminated" } }
    for _, c in ipairs(flawed) do
      it("flags " .. c[1], function()
        local docs, rejects = parse('[{"site_id":"s","type":"t","x":' .. c[1] .. "}]")
        if c[2] == "unterminated" then
          assert.is_nil(docs)
          assert.equal("not_json", rejects.kind)
        else
          assert.same({ { index = 0, error = c[2] } }, rejects)
        end
      end)
    end
    local invalid = { "[1,]", "[,1]", "[1,,2]", "[1 2]", "[01]", "[1.]", "[.1]", "[1e]", "[1e+]", "[-]", "[--1]",
                      "[+1]", "[0x1]", "[1.0e1.0]", "[Infinity]", "[NaN]", "[True]", "[nul]", "['a']",
                      '["a"', "[", "]", "[}", '[{"a" 1}]', '[{"a":1,}]', "[{1:2}]", '[{"a"}]', "[1]\0",
                      "[1]]", '["\\"]', "[\f1]", "[\2261]", "[1]\240\159\152\128" }
    for _, v in ipairs(invalid) do
      it(("returns nil, err for %q"):format(v), function()
        local docs, err = parse(v)
        assert.is_nil(docs)
        assert.equal("not_json", err.kind)
      end)
    end
  end)

  it("raises when received_at is not an integer", function()
    local msg = "bad argument #2 to 'events_parse' (integer milliseconds expected)"
    assert.has_error(function() core.events_parse(ev(), 1.5) end, msg)
    assert.has_error(function() core.events_parse(ev()) end, msg)
  end)

  -- Property: for random lists of events (valid and invalid, with awkward content), sent as
  -- an array and as NDJSON, the documents out are exactly the valid events in, in order, and
  -- each decodes with cjson and carries received_at and event_id.
  it("turns random event lists into exactly the valid events' documents", function()
    math.randomseed(20261130)
    local awkward = { "plain", 'q"uote', "back\\slash", "new\nline", "tab\t", "é😀", "\0", "</script>", "\r\n" }
    local function jstr(s)
      return '"' .. s:gsub('[%c"\\]', function(c)
        if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
        return ("\\u%04x"):format(c:byte())
      end) .. '"'
    end
    for _ = 1, 200 do
      local n = math.random(0, 20)
      local items, valid = {}, {}
      for i = 1, n do
        local good = math.random() < 0.7
        local fields = {}
        local site = "s" .. math.random(1, 5)
        if good or math.random() < 0.5 then fields[#fields + 1] = '"site_id":' .. jstr(site) end
        if good or math.random() < 0.5 then fields[#fields + 1] = '"type":"t' .. i .. '"' end
        if not good and #fields == 2 then fields[#fields + 1] = '"_bad":1' end
        fields[#fields + 1] = '"k":' .. jstr(awkward[math.random(#awkward)])
        fields[#fields + 1] = '"n":' .. tostring(math.random(-1e9, 1e9)) .. ".5e" .. math.random(-5, 5)
        -- shuffle
        for j = #fields, 2, -1 do
          local k = math.random(j)
          fields[j], fields[k] = fields[k], fields[j]
        end
        items[i] = "{" .. table.concat(fields, math.random() < 0.5 and "," or " ,\t") .. "}"
        if good then valid[#valid + 1] = { i = i - 1, site = site, type = "t" .. i } end
      end
      for _, body in ipairs({ "[" .. table.concat(items, ",\n") .. "]", table.concat(items, "\n") }) do
        if body ~= "" then
          local docs, rejects = parse(body)
          assert(docs, rejects and tostring(rejects))
          assert.equal(#valid, #docs)
          assert.equal(n, #docs + #rejects)
          for j, d in ipairs(docs) do
            assert.is_nil(d.doc:find("\n", 1, true))
            local t = assert(cjson.decode(d.doc))
            assert.equal(valid[j].site, t.site_id)
            assert.equal(valid[j].type, t.type)
            assert.equal(NOW, t.received_at)
            assert.equal(d.event_id, t.event_id)
            assert.is_string(t.k)
          end
        end
      end
    end
  end)
end)

describe("core.event_from_query", function()
  local function q(s)
    return core.event_from_query(s, NOW)
  end

  local function qreason(s)
    return only_reject(q(s))
  end

  it("builds one event: values as strings, ts as a number, received_at and event_id added", function()
    local docs, rejects = q("site_id=s1&type=view&ts=1700000000000&block_id=b&variant=A&user_id=42")
    assert.same({}, rejects)
    local d = docs[1]
    assert.equal('{"site_id":"s1","type":"view","ts":1700000000000,"block_id":"b","variant":"A","user_id":"42",'
      .. '"received_at":' .. NOW .. ',"event_id":"' .. d.event_id .. '"}', d.doc)
    assert.equal("42", d.user_id)
  end)

  it("percent- and plus-decodes, and escapes what JSON needs", function()
    local d = q("site_id=s&type=t&m=a+b%0A%22%5C%2B%e2%82%ac&%6Eame=x&flag")[1]
    local t = assert(cjson.decode(d.doc))
    assert.equal('a b\n"\\+€', t.m)
    assert.equal("x", t.name)
    assert.equal("", t.flag)
    assert.is_nil(d.doc:find("\n", 1, true))
  end)

  it("skips empty pairs and drops received_at", function()
    local d = q("&site_id=s&&type=t&received_at=5&")[1]
    assert.equal('{"site_id":"s","type":"t","received_at":' .. NOW .. ',"event_id":"' .. d.event_id .. '"}', d.doc)
  end)

  it("drops the cache-buster `_` (jQuery's cache: false, pixel tags), however often given", function()
    local d = q("_=1701234567&site_id=s&type=t&%5F=2&_")[1]
    assert.equal('{"site_id":"s","type":"t","received_at":' .. NOW .. ',"event_id":"' .. d.event_id .. '"}', d.doc)
    assert.equal("missing site_id", qreason("_=1"))
  end)

  it("keeps a client event_id", function()
    assert.equal("e:1", q("site_id=s&type=t&event_id=e%3A1")[1].event_id)
  end)

  local cases = {
    { "type=t", "missing site_id" },
    { "", "missing site_id" },
    { "site_id=s", "missing type" },
    { "site_id=s%20x&type=t", "site_id: invalid characters" },
    { "site_id=&type=t", "site_id: invalid length" },
    { "site_id=s&type=t&ts=1.5", "ts: not an integer" },
    { "site_id=s&type=t&ts=", "ts: not an integer" },
    { "site_id=s&type=t&ts=01", "ts: not an integer" },
    { "site_id=s&type=t&x=%zz", "invalid percent-encoding" },
    { "site_id=s&type=t&x=%4", "invalid percent-encoding" },
    { "site_id=s&type=t&x=%C0%AF", "invalid UTF-8" },
    { "site_id=s&type=t&x=%ED%A0%80", "invalid UTF-8" },
    { "site_id=s&type=t&site_id=u", "duplicate member name" },
    { "site_id=s&type=t&_id=123", "reserved field _id" },
    { "site_id=s&type=t&__=123", "reserved field __" },
    { "site_id=s&type=t&=1", "empty member name" },
    { "site_id=s&type=t&user_id=", "user_id: invalid length" },
  }
  for _, c in ipairs(cases) do
    it(("rejects %q with '%s'"):format(c[1], c[2]), function()
      assert.equal(c[2], qreason(c[1]))
    end)
  end

  it("rejects a ts Elasticsearch's epoch_millis parser refuses, as a body's", function()
    assert.equal("ts: negative (before 1970)", qreason("site_id=s&type=t&ts=-5"))
    assert.equal("ts: out of range (more than 2^63-1 ms)", qreason("site_id=s&type=t&ts=99999999999999999999"))
    assert.truthy(q("site_id=s&type=t&ts=0")[1].doc:find('"ts":0,', 1, true))
  end)

  it("raises when received_at is not an integer", function()
    assert.has_error(function() core.event_from_query("site_id=s&type=t", "x") end,
      "bad argument #2 to 'event_from_query' (integer milliseconds expected)")
  end)
end)
