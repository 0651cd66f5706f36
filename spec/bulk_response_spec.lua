-- Per-item results of an Elasticsearch _bulk response (src/bulk_response.c via
-- core.bulk_response_parse): untrusted bytes, read with the strict JSON scanner.
local core = require "esx.core"

local function parse(body, n)
  return core.bulk_response_parse(body, n)
end

describe("core.bulk_response_parse", function()
  it("reads status, error type and reason of every item, in order", function()
    local body = [[{"took":30,"errors":true,"items":[
      {"index":{"_index":"events","_id":"a","_version":1,"result":"created","status":201}},
      {"create":{"_index":"events","_id":"b","status":429,"error":{"type":"es_rejected_execution_exception",
        "reason":"rejected execution of coordinating operation"}}},
      {"index":{"_id":"c","status":400,"error":{"type":"mapper_parsing_exception","reason":"failed to parse field [n]",
        "caused_by":{"type":"number_format_exception","reason":"For input string: \"x\""}}}},
      {"delete":{"_id":"d","status":404,"result":"not_found"}},
      {"update":{"_id":"e","status":503,"error":{"reason":"no type"}}}
    ]}]]
    assert.same({
      { status = 201 },
      { status = 429, type = "es_rejected_execution_exception", reason = "rejected execution of coordinating operation" },
      { status = 400, type = "mapper_parsing_exception", reason = "failed to parse field [n]" },
      { status = 404 },
      { status = 503, type = "error", reason = "no type" },
    }, parse(body, 5))
  end)

  it("accepts an empty item list for n = 0", function()
    assert.same({}, parse('{"took":0,"errors":false,"items":[]}', 0))
  end)

  it("takes an error given as a string", function()
    assert.same({ { status = 500, type = "error", reason = "boom" } },
      parse('{"items":[{"index":{"status":500,"error":"boom"}}]}', 1))
  end)

  it("gives status 0 when it is missing or not an integer from 0 to 999", function()
    local items = parse('{"items":[{"index":{}},{"index":{"status":"200"}},{"index":{"status":2.5}},'
      .. '{"index":{"status":1000}},{"index":{"status":-1}}]}', 5)
    for i = 1, 5 do assert.equal(0, items[i].status) end
  end)

  it("decodes escapes, turns control characters into spaces and cuts reasons at a UTF-8 boundary", function()
    local items = parse('{"items":[{"index":{"status":400,"error":{"type":"t\\u00e9","reason":"a\\nb\\u0000c\\"d"}}}]}', 1)
    assert.equal("té", items[1].type)
    assert.equal('a b c"d', items[1].reason)
    local long = ("é"):rep(100) -- 200 bytes
    items = parse('{"items":[{"index":{"status":400,"error":{"type":"x","reason":"' .. long .. '"}}}]}', 1)
    assert.equal(("é"):rep(79), items[1].reason) -- 158 bytes: 159 would split a character
  end)

  it("ignores members it does not know, wherever they are", function()
    local items = parse('{"items":[{"index":{"status":201,"extra":[1,{"status":500}],"error":null}}],"took":1,"x":{}}', 1)
    assert.same({ { status = 201 } }, items)
  end)

  local bad = {
    { "", 0, "invalid JSON at byte 0: unexpected end" },
    { "<html>502 Bad Gateway</html>", 0, "invalid JSON at byte 0: unexpected character" },
    { '{"items":[]} x', 0, "invalid JSON at byte 13: trailing bytes" },
    { '{"items":["\255"]}', 1, "invalid JSON: invalid UTF-8" },
    { '{"items":[{"index":{"status":201,"x":"\\ud800"}}]}', 1, "invalid JSON: invalid escape" },
    { "[]", 0, "not a bulk response: not an object" },
    { '{"took":1}', 0, 'not a bulk response: no "items" array' },
    { '{"items":{}}', 0, 'not a bulk response: no "items" array' },
    { '{"items":[],"items":[]}', 0, 'not a bulk response: two "items"' },
    { '{"items":[{"index":{"status":201}}]}', 2, "bulk response lists 1 items, expected 2" },
    { '{"items":[{"index":{"status":201}},{"index":{"status":201}}]}', 1, "bulk response lists 2 items, expected 1" },
    { '{"items":[1]}', 1, 'not a bulk response: item 0 is not {"<action>":{...}}' },
    { '{"items":[{}]}', 1, 'not a bulk response: item 0 is not {"<action>":{...}}' },
    { '{"items":[{"index":{},"create":{}}]}', 1, 'not a bulk response: item 0 is not {"<action>":{...}}' },
    { '{"items":[{"index":{}},{"index":5}]}', 2, 'not a bulk response: item 1 is not {"<action>":{...}}' },
    -- items are read and counted in one walk: a wrong count is still what is reported
    { '{"items":[{"index":{}},{"index":5},{"index":{}}]}', 2, "bulk response lists 3 items, expected 2" },
    { '{"items":[{"index":5},{"index":{}}]}', 3, "bulk response lists 2 items, expected 3" },
    { '{"items":[{"index":{}},{"index":5},{"x":1,"y":2}]}', 3, 'not a bulk response: item 1 is not {"<action>":{...}}' },
    { '{"error":{"type":"x"},"status":400}', 0, 'not a bulk response: no "items" array' },
  }
  for _, c in ipairs(bad) do
    it(("returns nil, err when given %q for n = %d"):format(c[1]:sub(1, 60), c[2]), function()
      local items, err = parse(c[1], c[2])
      assert.is_nil(items)
      assert.equal("decode", err.kind)
      assert.equal(c[3], err.message)
    end)
  end

  it("returns nil, err for a response nested deeper than 512", function()
    local items, err = parse('{"items":[{"index":{"status":400,"error":' .. ("["):rep(600) .. ("]"):rep(600) .. "}}]}", 1)
    assert.is_nil(items)
    assert.equal("decode", err.kind)
  end)

  it("reads 5000 items", function()
    local t = {}
    for i = 1, 5000 do
      t[i] = ('{"index":{"_id":"%d","status":%d}}'):format(i, i % 2 == 0 and 201 or 429)
    end
    local items = assert(parse('{"took":1,"errors":true,"items":[' .. table.concat(t, ",") .. "]}", 5000))
    assert.equal(5000, #items)
    assert.equal(429, items[1].status)
    assert.equal(201, items[5000].status)
  end)

  it("raises when n is not a non-negative integer", function()
    -- called by name, not through parse(): LuaJIT names a tail-called C function after the
    -- Lua function whose frame it took ('parse'), Lua 5.4 after the callee
    local msg = "bad argument #2 to 'bulk_response_parse' (n must be an integer from 0 to 10000000)"
    assert.has_error(function() core.bulk_response_parse("{}", -1) end, msg)
    assert.has_error(function() core.bulk_response_parse("{}", 1.5) end, msg)
    assert.has_error(function() core.bulk_response_parse("{}") end, msg)
    assert.has_error(function() core.bulk_response_parse("{}", 10000001) end, msg)
  end)
end)
