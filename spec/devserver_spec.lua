-- Specs for the esxd development server (devserver/): every endpoint, every fault, the
-- control API and the esxd command. Run from the repository root:
--   lua5.4 /usr/bin/busted spec/devserver_spec.lua
--   busted --lua=luajit spec/devserver_spec.lua
package.path = "./?.lua;" .. package.path
local ds = require "spec.support.devserver"
local cjson = require "cjson"
local socket = require "socket"

local JSON = { ["Content-Type"] = "application/json" }
local NDJSON = { ["Content-Type"] = "application/x-ndjson" }
local statuses = {}   -- every status seen, for the "no 500" spec

local srv

local function req(method, path, body, headers, opts)
  if type(body) == "table" then body = cjson.encode(body) end
  if body and not headers then headers = JSON end
  local st, h, b, err = srv:request(method, path, body, headers, opts)
  statuses[#statuses + 1] = { st, method, path }
  return st, h, b, err
end

local function jreq(method, path, body, headers, opts)
  local st, h, b, err = req(method, path, body, headers, opts)
  local ok, v = pcall(cjson.decode, b or "")
  return st, ok and v or b, h, err
end

local function put_doc(index, id, doc, refresh)
  local st, b = jreq("PUT", "/" .. index .. "/_doc/" .. id .. (refresh == false and "" or "?refresh=true"), doc)
  assert.is_true(st == 200 or st == 201, "put_doc failed: " .. tostring(st))
  return b
end

local function ids(res)
  local out = {}
  for _, h in ipairs(res.hits.hits) do out[#out + 1] = h._id end
  return out
end

local function es_error(status, etype, reason, extra)
  local e = { type = etype, reason = reason }
  for k, v in pairs(extra or {}) do e[k] = v end
  local top = { root_cause = { e }, type = etype, reason = reason }
  for k, v in pairs(extra or {}) do top[k] = v end
  return { error = top, status = status }
end

-- ES's answer to a query a shard cannot build: SearchExecutionContext.toQuery wraps the field
-- type's exception (ctype: reason) in a query_shard_exception naming the index, under
-- search_phase_execution_exception; the root cause is rendered without its caused_by.
local function query_shard_failure(b, index, ctype, reason)
  assert.equal(400, b.status)
  assert.equal("search_phase_execution_exception", b.error.type)
  local uuid = b.error.root_cause[1].index_uuid
  assert.equal("string", type(uuid))
  local want = { type = "query_shard_exception", reason = "failed to create query: " .. reason, index_uuid = uuid, index = index }
  assert.same({ want }, b.error.root_cause)
  want.caused_by = { type = ctype, reason = reason }
  assert.same(want, b.error.failed_shards[1].reason)
  assert.same(want, b.error.caused_by)
end

local function not_found(name)
  return es_error(404, "index_not_found_exception", "no such index [" .. name .. "]",
    { ["resource.type"] = "index_or_alias", ["resource.id"] = name, index_uuid = "_na_", index = name })
end

describe("esxd", function()
  setup(function()
    srv = ds.start()
  end)
  teardown(function()
    if srv then srv:stop() end
  end)
  before_each(function()
    srv:reset()
  end)

  describe("GET / and HEAD /", function()
    it("returns the cluster info", function()
      local st, b, h = jreq("GET", "/")
      assert.equal(200, st)
      assert.equal("Elasticsearch", h["x-elastic-product"])
      assert.equal("application/json", h["content-type"])
      assert.equal("esxd-node", b.name)
      assert.equal("esxd", b.cluster_name)
      assert.equal("string", type(b.cluster_uuid))
      assert.matches("^8%.%d+%.%d+$", b.version.number)
      assert.equal("You Know, for Search", b.tagline)
    end)
    it("HEAD / is 200 without a body", function()
      local st, h, b = req("HEAD", "/")
      assert.equal(200, st)
      assert.equal("", b)
      assert.equal("Elasticsearch", h["x-elastic-product"])
    end)
  end)

  describe("GET /_cluster/health", function()
    it("is green with one node", function()
      local st, b = jreq("GET", "/_cluster/health")
      assert.equal(200, st)
      assert.equal("green", b.status)
      assert.equal(1, b.number_of_nodes)
      assert.equal(1, b.number_of_data_nodes)
      assert.equal(false, b.timed_out)
      assert.equal(100, b.active_shards_percent_as_number)
    end)
    it("accepts an index and 404s a missing one", function()
      assert.equal(200, (jreq("PUT", "/h1")))
      local st, b = jreq("GET", "/_cluster/health/h1")
      assert.equal(200, st)
      assert.equal(1, b.active_primary_shards)
      st, b = jreq("GET", "/_cluster/health/nope")
      assert.equal(404, st)
      assert.same(not_found("nope"), b)
    end)
    it("is yellow while an index has replicas, which one node cannot assign", function()
      assert.equal(200, (jreq("PUT", "/hy", { settings = { number_of_shards = 2 } }))) -- 1 replica
      assert.equal(200, (jreq("PUT", "/hg", { settings = { number_of_replicas = 0 } })))
      local st, b = jreq("GET", "/_cluster/health/hy,hg?human")
      assert.equal(200, st)
      assert.equal("yellow", b.status)
      assert.equal(3, b.active_primary_shards)
      assert.equal(3, b.active_shards)
      assert.equal(2, b.unassigned_shards)
      assert.equal(60, b.active_shards_percent_as_number)
      assert.equal("60.0%", b.active_shards_percent)
      st, b = jreq("GET", "/_cluster/health/hg")
      assert.equal("green", b.status)
      assert.equal(100, b.active_shards_percent_as_number)
      -- waiting for yellow is met at once; for green, it times out: 408 with the status
      assert.equal(200, (jreq("GET", "/_cluster/health/hy?wait_for_status=yellow&timeout=1s")))
      local t0 = socket.gettime()
      st, b = jreq("GET", "/_cluster/health/hy?wait_for_status=green&timeout=300ms")
      assert.equal(408, st)
      assert.is_true(b.timed_out)
      assert.equal("yellow", b.status)
      assert.is_true(socket.gettime() - t0 >= 0.29)
      st, b = jreq("GET", "/_cluster/health?wait_for_status=blue")
      assert.equal(400, st)
      -- RestClusterHealthAction: ClusterHealthStatus.valueOf(upper case)
      assert.equal("No enum constant org.elasticsearch.cluster.health.ClusterHealthStatus.BLUE", b.error.reason)
      assert.equal(200, (jreq("DELETE", "/hy,hg")))
    end)
    it("level=indices and level=shards add each index's and each shard's health, as ES does", function()
      assert.equal(200, (jreq("PUT", "/hy", { settings = { number_of_shards = 2 } }))) -- 1 replica
      assert.equal(200, (jreq("PUT", "/hg", { settings = { number_of_replicas = 0 } })))
      local function index(status, shards, replicas)
        return { status = status, number_of_shards = shards, number_of_replicas = replicas,
          active_primary_shards = shards, active_shards = shards, relocating_shards = 0,
          initializing_shards = 0, unassigned_shards = shards * replicas }
      end
      local st, b = jreq("GET", "/_cluster/health?level=indices")
      assert.equal(200, st)
      assert.equal("yellow", b.status)
      assert.same({ hy = index("yellow", 2, 1), hg = index("green", 1, 0) }, b.indices)
      -- the ClusterIndexHealth fields come last, after the cluster's
      local _, _, raw = req("GET", "/_cluster/health/hg?level=indices")
      assert.truthy(raw:find('"active_shards_percent_as_number":100.0,"indices":{"hg":{"status":"green",' ..
        '"number_of_shards":1,"number_of_replicas":0,', 1, true), raw)
      st, b = jreq("GET", "/_cluster/health/hy?level=SHARDS")
      assert.equal(200, st)
      local shard = { status = "yellow", primary_active = true, active_shards = 1, relocating_shards = 0,
        initializing_shards = 0, unassigned_shards = 1 }
      local want = index("yellow", 2, 1)
      want.shards = { ["0"] = shard, ["1"] = shard }
      assert.same({ hy = want }, b.indices)
      -- no index: an empty object; level=cluster: no "indices"
      _, _, raw = req("GET", "/_cluster/health/nomatch-*?level=indices")
      assert.truthy(raw:find('"indices":{}}', 1, true), raw)
      st, b = jreq("GET", "/_cluster/health?level=cluster")
      assert.is_nil(b.indices)
      -- ClusterStatsLevel.of's message for any other value
      st, b = jreq("GET", "/_cluster/health?level=index")
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception",
        "level parameter must be one of [cluster] or [indices] or [shards] but was [index]"), b)
      assert.equal(200, (jreq("DELETE", "/hy,hg")))
    end)
  end)

  describe("indices", function()
    it("creates with settings and mappings", function()
      local st, b = jreq("PUT", "/idx1", { settings = { number_of_shards = 1 }, mappings = { properties = { n = { type = "long" } } } })
      assert.equal(200, st)
      assert.same({ acknowledged = true, shards_acknowledged = true, index = "idx1" }, b)
    end)
    it("refuses a mapping with a field type ES does not know", function()
      local st, b = jreq("PUT", "/idxm", { mappings = { properties = { a = { type = "long" },
        o = { properties = { x = { type = "strnig" } } } } } })
      assert.equal(400, st)
      local msg = "No handler for type [strnig] declared on field [x]"
      assert.same({ error = { root_cause = { { type = "mapper_parsing_exception", reason = msg } },
        type = "mapper_parsing_exception", reason = "Failed to parse mapping: " .. msg,
        caused_by = { type = "mapper_parsing_exception", reason = msg } }, status = 400 }, b)
      assert.equal(404, (req("HEAD", "/idxm")))
    end)
    it("refuses mapping parameters ES does not know, as ES's mapper_parsing_exception", function()
      local function refused(mappings, msg)
        local st, b = jreq("PUT", "/idxp", { mappings = mappings })
        assert.equal(400, st, msg)
        assert.same({ error = { root_cause = { { type = "mapper_parsing_exception", reason = msg } },
          type = "mapper_parsing_exception", reason = "Failed to parse mapping: " .. msg,
          caused_by = { type = "mapper_parsing_exception", reason = msg } }, status = 400 }, b)
        assert.equal(404, (req("HEAD", "/idxp")))
      end
      -- FieldMapper.Builder.parse
      refused({ properties = { a = { type = "keyword", bogus = 1 } } },
        "unknown parameter [bogus] on mapper [a] of type [keyword]")
      refused({ properties = { o = { properties = { n = { type = "long", format = "x" } } } } },
        "unknown parameter [format] on mapper [n] of type [long]")
      refused({ properties = { t = { type = "text", fields = { raw = { type = "keyword", analyzer = "standard" } } } } },
        "unknown parameter [analyzer] on mapper [raw] of type [keyword]")
      refused({ properties = { k = { type = "keyword", boost = 2 } } }, "Unknown parameter [boost] on mapper [k]")
      -- a date format esxd's parser does not read: refused in ES's shape rather than read as
      -- the default format (ES would take "01.02.2024" there and refuse "2024-02-01")
      local reads = "its date parser reads strict_date_optional_time, date_optional_time, " ..
        "strict_date_optional_time_nanos, yyyy/MM/dd, yyyy/MM/dd HH:mm:ss, epoch_millis and epoch_second " ..
        "(joined with ||) only"
      refused({ properties = { d = { type = "date", format = "dd.MM.yyyy" } } },
        "esxd does not implement the date format [dd.MM.yyyy] of field [d]: " .. reads)
      refused({ properties = { o = { properties = { d = { type = "date_nanos", format = "yyyy-MM-dd||epoch_millis" } } } } },
        "esxd does not implement the date format [yyyy-MM-dd||epoch_millis] of field [d]: " .. reads)
      refused({ properties = { k = { type = "keyword", fields = { d = { type = "date", format = "basic_date" } } } } },
        "esxd does not implement the date format [basic_date] of field [d]: " .. reads)
      refused({ properties = { d = { type = "date", format = "" } } },
        "esxd does not implement the date format [] of field [d]: " .. reads)
      -- so in a dynamic template that maps dates (a date type, or none / "{dynamic_type}" where
      -- dates match); ES would map new fields with that format
      refused({ dynamic_templates = { { dm = { match = "d*", mapping = { type = "date", format = "dd.MM.yyyy" } } } } },
        "esxd does not implement the date format [dd.MM.yyyy] of dynamic template [dm]: " .. reads)
      refused({ dynamic_templates = { { any = { mapping = { type = "{dynamic_type}", format = "MM/yy" } } } } },
        "esxd does not implement the date format [MM/yy] of dynamic template [any]: " .. reads)
      refused({ dynamic_templates = { { s = { match_mapping_type = "string",
        mapping = { type = "keyword", fields = { d = { type = "date_nanos", format = "basic_date" } } } } } } },
        "esxd does not implement the date format [basic_date] of dynamic template [s]: " .. reads)
      assert.equal(200, (req("PUT", "/idxt", { mappings = { dynamic_templates = {
        { dm = { match = "d*", mapping = { type = "date", format = "yyyy/MM/dd||epoch_millis" } } } } } })))
      req("PUT", "/idxf")
      local st, b = jreq("PUT", "/idxf/_mapping", { properties = { d = { type = "date", format = "dd.MM.yyyy" } } })
      assert.equal(400, st)
      assert.equal("Failed to parse mapping: esxd does not implement the date format [dd.MM.yyyy] of field [d]: " .. reads,
        b.error.reason)
      assert.equal(200, (req("PUT", "/idxf2", { mappings = { properties = {
        d = { type = "date", format = "yyyy/MM/dd HH:mm:ss||yyyy/MM/dd||epoch_millis" },
        e = { type = "date", format = "strict_date_optional_time||epoch_second" } } } })))
      -- MappingParser.checkNoRemainingFields (objects and the root)
      refused({ properties = { o = { type = "object", bogus = "x", properties = {} } } },
        "Mapping definition for [o] has unsupported parameters:  [bogus : x]")
      refused({ properties = { a = { type = "keyword" } }, bogus = { x = 1 } },
        "Root mapping definition has unsupported parameters:  [bogus : {x=1}]")
      -- what ES takes
      local st = jreq("PUT", "/idxok", { mappings = { dynamic = "strict", date_detection = false, _source = { enabled = true },
        properties = { k = { type = "keyword", ignore_above = 10, doc_values = true, fields = { t = { type = "text" } } },
          t = { type = "text", analyzer = "standard", copy_to = "all" }, all = { type = "text" },
          d = { type = "date", format = "epoch_millis", ignore_malformed = true }, n = { type = "long", coerce = false },
          b = { type = "boolean", null_value = false }, ip = { type = "ip" }, bin = { type = "binary" },
          nested = { type = "nested", include_in_parent = true, properties = { x = { type = "integer", index = false } } },
          o = { dynamic = false, enabled = true, properties = { y = { type = "scaled_float", scaling_factor = 100 } } },
          g = { type = "geo_point", ignore_z_value = true } } } })
      assert.equal(200, st)
    end)
    it("number_of_shards / number_of_replicas shape the _shards numbers as in a one-node ES", function()
      assert.equal(200, (jreq("PUT", "/sh1", { settings = { number_of_shards = 2, number_of_replicas = 0 } })))
      assert.equal(200, (jreq("PUT", "/sh2", { settings = { index = { number_of_replicas = "2" } } })))
      local _, b = jreq("PUT", "/sh1/_doc/1", { a = 1 })
      assert.same({ total = 1, successful = 1, failed = 0 }, b._shards)
      _, b = jreq("PUT", "/sh2/_doc/1", { a = 1 })
      assert.same({ total = 3, successful = 1, failed = 0 }, b._shards)
      _, b = jreq("DELETE", "/sh1/_doc/1")
      assert.same({ total = 1, successful = 1, failed = 0 }, b._shards)
      _, b = jreq("POST", "/sh1,sh2/_refresh")
      assert.same({ total = 2 + 3, successful = 3, failed = 0 }, b._shards)
      _, b = jreq("GET", "/sh1,sh2/_search")
      assert.same({ total = 3, successful = 3, skipped = 0, failed = 0 }, b._shards)
      _, b = jreq("GET", "/sh1/_count")
      assert.same({ total = 2, successful = 2, skipped = 0, failed = 0 }, b._shards)
      _, b = jreq("GET", "/sh1")
      assert.equal("2", b.sh1.settings.index.number_of_shards)
      assert.equal("0", b.sh1.settings.index.number_of_replicas)
      _, b = jreq("GET", "/_cluster/health/sh1")
      assert.equal(2, b.active_primary_shards)
    end)
    it("refuses shard and replica counts ES refuses", function()
      local cases = {
        { { number_of_shards = 0 }, "Failed to parse value [0] for setting [index.number_of_shards] must be >= 1" },
        { { index = { number_of_shards = 2000 } }, "Failed to parse value [2000] for setting [index.number_of_shards] must be <= 1024" },
        { { ["index.number_of_replicas"] = -1 }, "Failed to parse value [-1] for setting [index.number_of_replicas] must be >= 0" },
      }
      for _, c in ipairs(cases) do
        local st, b = jreq("PUT", "/shx", { settings = c[1] })
        assert.equal(400, st, c[2])
        assert.same(es_error(400, "illegal_argument_exception", c[2]), b)
      end
      local st, b = jreq("PUT", "/shx", { settings = { number_of_shards = "two" } })
      assert.equal(400, st)
      assert.same({ error = { root_cause = { { type = "illegal_argument_exception",
        reason = "Failed to parse value [two] for setting [index.number_of_shards]" } },
        type = "illegal_argument_exception", reason = "Failed to parse value [two] for setting [index.number_of_shards]",
        caused_by = { type = "number_format_exception", reason = 'For input string: "two"' } }, status = 400 }, b)
      assert.equal(404, (req("HEAD", "/shx")))
      assert.equal(200, (jreq("PUT", "/shx", { settings = { number_of_shards = "3", number_of_replicas = 0 } })))
      _, b = jreq("GET", "/shx")
      assert.equal("3", b.shx.settings.index.number_of_shards)
    end)
    it("returns illegal_argument_exception for an index setting ES does not know", function()
      local tail = " please check that any required plugins are installed, or check the breaking changes documentation for removed settings"
      local cases = {
        { { bogus = 1 }, "unknown setting [index.bogus]" .. tail },
        { { ["index.bogus"] = 1 }, "unknown setting [index.bogus]" .. tail },
        { { index = { foo = { bar = { baz = 5 } } } }, "unknown setting [index.foo.bar.baz]" .. tail },
        { { index = { mapping = { bogus = { limit = 5 } } } },
          "unknown setting [index.mapping.bogus.limit] did you mean [index.mapping.depth.limit]?" },
        { { number_of_shard = 1 }, "unknown setting [index.number_of_shard] did you mean [index.number_of_shards]?" },
        { { index = { refresh_intervall = "1s" } }, "unknown setting [index.refresh_intervall] did you mean [index.refresh_interval]?" },
      }
      for _, c in ipairs(cases) do
        local st, b = jreq("PUT", "/setx", { settings = c[1] })
        assert.equal(400, st, cjson.encode(c[1]))
        assert.same(es_error(400, "illegal_argument_exception", c[2]), b)
        assert.equal(404, (req("HEAD", "/setx")))
      end
      local st, b = jreq("PUT", "/setx", { settings = { ["index.mapping.total_fields.ignore_dynamic_beyond_limit"] = true } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "esxd does not implement " ..
        "[index.mapping.total_fields.ignore_dynamic_beyond_limit]: new fields beyond the limit fail the document"), b)
      -- known ones, in the three spellings; analysis and other groups take any sub-key
      assert.equal(200, (jreq("PUT", "/setx", { settings = { refresh_interval = "5s", ["index.max_result_window"] = 20000,
        index = { mapping = { total_fields = { limit = 2000 }, depth = { limit = 5 } }, codec = "best_compression" },
        analysis = { analyzer = { a = { type = "standard" } } }, ["index.routing.allocation.include._tier_preference"] = "data_hot" } })))
      -- GET /{index} shows them nested, as strings, as ES does
      local _, g = jreq("GET", "/setx")
      local ix = g.setx.settings.index
      assert.equal("5s", ix.refresh_interval)
      assert.equal("20000", ix.max_result_window)
      assert.same({ total_fields = { limit = "2000" }, depth = { limit = "5" } }, ix.mapping)
      assert.equal("best_compression", ix.codec)
      assert.same({ analyzer = { a = { type = "standard" } } }, ix.analysis)
      assert.same({ allocation = { include = { _tier_preference = "data_hot" } } }, ix.routing)
      assert.equal("1", ix.number_of_shards)
    end)
    it("creates without a body", function()
      local st, b = jreq("PUT", "/idx2")
      assert.equal(200, st)
      assert.same({ acknowledged = true, shards_acknowledged = true, index = "idx2" }, b)
    end)
    it("refuses to create an existing index", function()
      jreq("PUT", "/dup")
      local st, b = jreq("PUT", "/dup")
      assert.equal(400, st)
      assert.equal("resource_already_exists_exception", b.error.type)
      assert.matches("^index %[dup/[%w_-]+%] already exists$", b.error.reason)
      assert.equal("dup", b.error.index)
      assert.equal(400, b.status)
      assert.equal("resource_already_exists_exception", b.error.root_cause[1].type)
    end)
    it("validates index names", function()
      local cases = {
        { "Upper", "must be lowercase" },
        { "_under", "must not start with '_', '-', or '+'" },
        { "-dash", "must not start with '_', '-', or '+'" },
        { "%2Bplus", "must not start with '_', '-', or '+'", "+plus" },
        { "a%23b", "must not contain '#'", "a#b" },
        { "a%20b", [==[must not contain the following characters [ , ", *, \, <, |, ,, >, /, ?]]==], "a b" },
        { "a%3Fb", [==[must not contain the following characters [ , ", *, \, <, |, ,, >, /, ?]]==], "a?b" },
        { ".", "must not be '.' or '..'" },
        { string.rep("a", 256), "index name is too long, (256 > 255)" },
      }
      for _, c in ipairs(cases) do
        local name = c[3] or c[1]
        local st, b = jreq("PUT", "/" .. c[1])
        assert.equal(400, st, c[1])
        assert.same(es_error(400, "invalid_index_name_exception", "Invalid index name [" .. name .. "], " .. c[2],
          { index_uuid = "_na_", index = name }), b)
      end
    end)
    it("rejects unknown keys in the create body", function()
      local st, b = jreq("PUT", "/badbody", { foo = {} })
      assert.equal(400, st)
      -- CreateIndexRequest.source throws ElasticsearchParseException: parse_exception
      assert.same(es_error(400, "parse_exception", "unknown key [foo] for create index"), b)
    end)
    it("HEAD reports existence without a body", function()
      jreq("PUT", "/there")
      local st, _, body = req("HEAD", "/there")
      assert.equal(200, st); assert.equal("", body)
      st, _, body = req("HEAD", "/missing")
      assert.equal(404, st); assert.equal("", body)
    end)
    it("deletes, then 404s", function()
      jreq("PUT", "/gone")
      local st, b = jreq("DELETE", "/gone")
      assert.equal(200, st)
      assert.same({ acknowledged = true }, b)
      st, b = jreq("DELETE", "/gone")
      assert.equal(404, st)
      assert.same(not_found("gone"), b)
    end)
    it("refuses wildcard and _all deletes", function()
      jreq("PUT", "/w1")
      for _, p in ipairs({ "/w*", "/_all" }) do
        local st, b = jreq("DELETE", p)
        assert.equal(400, st)
        assert.same(es_error(400, "illegal_argument_exception", "Wildcard expressions or all indices are not allowed"), b)
      end
      jreq("PUT", "/w2")
      local st = jreq("DELETE", "/w1,w2")
      assert.equal(200, st)
      assert.equal(404, (req("HEAD", "/w1")))
    end)
    it("GET /{index} describes the index", function()
      put_doc("desc", "1", { n = 1, s = "x" })
      local st, b = jreq("GET", "/desc")
      assert.equal(200, st)
      assert.same({ type = "long" }, b.desc.mappings.properties.n)
      -- ES's dynamic mapping of a string: text with a keyword sub-field
      assert.same({ type = "text", fields = { keyword = { type = "keyword", ignore_above = 256 } } },
        b.desc.mappings.properties.s)
    end)
    it("GET /{index} shows objects, dynamic and explicit fields like ES", function()
      req("PUT", "/desc2", { mappings = { properties = { k = { type = "keyword" },
        t = { type = "text", fields = { raw = { type = "keyword" } } } } } })
      put_doc("desc2", "1", { k = "a", t = "b", user = { name = "ann", age = 3, geo = { ok = true } },
        ts = "2024-01-01T00:00:00Z", f = 1.5 })
      local st, b = jreq("GET", "/desc2")
      assert.equal(200, st)
      assert.same({ properties = {
        k = { type = "keyword" },
        t = { type = "text", fields = { raw = { type = "keyword" } } },
        user = { properties = {
          name = { type = "text", fields = { keyword = { type = "keyword", ignore_above = 256 } } },
          age = { type = "long" },
          geo = { properties = { ok = { type = "boolean" } } } } },
        ts = { type = "date" },
        f = { type = "float" } } }, b.desc2.mappings)
      req("PUT", "/desc3")
      local _, _, body = req("GET", "/desc3")
      assert.matches('"mappings":{}', body, 1, true)
      -- an empty object maps an object field, an empty array nothing
      req("PUT", "/desc4/_doc/1", '{"o":{},"a":[]}', JSON)
      st, b = jreq("GET", "/desc4/_mapping")
      assert.same({ o = { type = "object" } }, b.desc4.mappings.properties)
      -- under "dynamic": "strict" a new empty object is refused, a new empty array is not
      req("PUT", "/desc5", { mappings = { dynamic = "strict", properties = { k = { type = "keyword" } } } })
      assert.equal(201, (req("PUT", "/desc5/_doc/1", '{"k":"x","a":[]}', JSON)))
      st, b = jreq("PUT", "/desc5/_doc/2", '{"o":{}}', JSON)
      assert.equal(400, st)
      assert.equal("strict_dynamic_mapping_exception", b.error.type)
    end)
    it("takes mappings wrapped in the _doc type name, as ES 8 does", function()
      assert.equal(200, (jreq("PUT", "/wrapped", { mappings = { _doc = { properties = { n = { type = "long" } } } } })))
      local st, b = jreq("GET", "/wrapped/_mapping")
      assert.equal(200, st)
      assert.same({ wrapped = { mappings = { properties = { n = { type = "long" } } } } }, b)
      -- the mapping applies: a string in the long field is refused
      st, b = jreq("PUT", "/wrapped/_doc/1", { n = "abc" })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
      st, b = jreq("PUT", "/wrapped2", { mappings = { _doc = { properties = { k = { type = "keyword", bogus = 1 } } } } })
      assert.equal(400, st)
      assert.equal("Failed to parse mapping: unknown parameter [bogus] on mapper [k] of type [keyword]", b.error.reason)
    end)
    it("GET /{index}/_mapping and GET /_mapping show the mappings of each index, like ES", function()
      -- with no index at all, _all (like "*") matches nothing without an error, as in ES
      assert.equal(200, (req("DELETE", "/_esx/data")))
      for _, p in ipairs({ "/_mapping", "/_all/_mapping", "/*/_mapping", "/_all", "/*" }) do
        local st, _, body = req("GET", p)
        assert.equal(200, st, p)
        assert.equal("{}", body, p)
      end
      local st, _, body = req("GET", "/_mapping/field/x")
      assert.equal(404, st); assert.equal("{}", body)
      req("PUT", "/gm1", { mappings = { properties = { k = { type = "keyword" } } } })
      put_doc("gm1", "1", { k = "a", s = "x" })
      req("PUT", "/gm2")
      local st, b = jreq("GET", "/gm1/_mapping")
      assert.equal(200, st)
      assert.same({ gm1 = { mappings = { properties = { k = { type = "keyword" },
        s = { type = "text", fields = { keyword = { type = "keyword", ignore_above = 256 } } } } } } }, b)
      local _, _, body = req("GET", "/gm2/_mapping")
      assert.equal('{"gm2":{"mappings":{}}}', body)
      for _, p in ipairs({ "/_mapping", "/_all/_mapping", "/gm*/_mapping", "/gm1,gm2/_mapping" }) do
        st, b = jreq("GET", p)
        assert.equal(200, st, p)
        assert.same({ "gm1", "gm2" }, (function() local n = {} for k in pairs(b) do n[#n + 1] = k end table.sort(n) return n end)(), p)
        assert.equal("keyword", b.gm1.mappings.properties.k.type, p)
      end
      -- es-spec indices.get_mapping/30_missing_index.yml
      st, b = jreq("GET", "/nope/_mapping")
      assert.equal(404, st)
      assert.same(not_found("nope"), b)
      st, _, body = req("GET", "/nope/_mapping?ignore_unavailable=true")
      assert.equal(200, st); assert.equal("{}", body)
      assert.equal(404, (req("GET", "/nope/_mapping?ignore_unavailable=true&allow_no_indices=false")))
      st, b = jreq("GET", "/gm1/_mapping?bogus=1")
      assert.equal(400, st)
      assert.equal("request [/gm1/_mapping] contains unrecognized parameter: [bogus]", b.error.reason)
      -- PUT /_mapping (no index) is not an ES route: GET only
      st, b = jreq("PUT", "/_mapping", "{}")
      assert.equal(405, st)
      assert.equal("Incorrect HTTP method for uri [/_mapping] and method [PUT], allowed: [GET]", b.error)
    end)
    it("PUT /{index}/_mapping adds fields and refuses changes as ES does", function()
      -- es-spec indices.put_mapping/10_basic.yml "Test Create and update mapping"
      req("PUT", "/pm1")
      local st, b = jreq("PUT", "/pm1/_mapping", { properties = { text1 = { type = "text", analyzer = "whitespace" },
        subfield = { properties = { text3 = { type = "text" } } } } })
      assert.equal(200, st)
      assert.same({ acknowledged = true }, b)
      st, b = jreq("POST", "/pm1/_mapping", { properties = { text1 = { type = "text", analyzer = "whitespace",
        fields = { text_raw = { type = "keyword" } } } } })
      assert.equal(200, st)
      st, b = jreq("GET", "/pm1/_mapping")
      assert.same({ pm1 = { mappings = { properties = {
        text1 = { type = "text", analyzer = "whitespace", fields = { text_raw = { type = "keyword" } } },
        subfield = { properties = { text3 = { type = "text" } } } } } } }, b)
      -- the new fields are used: a later document's values are searched with their types
      put_doc("pm1", "1", { text1 = "Hello World", subfield = { text3 = "x" } })
      st, b = jreq("POST", "/pm1/_search", { query = { term = { ["text1.text_raw"] = "Hello World" } } })
      assert.same({ "1" }, ids(b))
      -- a field keeps its type (dynamic ones too); objects, nested and fields do not mix
      req("PUT", "/pm2", { mappings = { properties = { k = { type = "keyword", ignore_above = 3 }, d = { type = "date" },
        o = { properties = { x = { type = "long" } } }, n = { type = "nested" } } } })
      put_doc("pm2", "1", { dyn = 5, s = "abcdef" })
      local conflicts = {
        { { k = { type = "text" } }, "mapper [k] cannot be changed from type [keyword] to [text]" },
        { { dyn = { type = "keyword" } }, "mapper [dyn] cannot be changed from type [long] to [keyword]" },
        { { o = { type = "keyword" } }, "can't merge a non object mapping [o] with an object mapping" },
        { { k = { properties = { a = { type = "long" } } } }, "can't merge a non object mapping [k] with an object mapping" },
        { { o = { type = "nested" } }, "can't merge a non-nested mapping [o] with a nested mapping" },
        { { n = { type = "object" } }, "can't merge a non-nested mapping [n] with a nested mapping" },
        { { o = { properties = { x = { type = "double" } } } }, "mapper [o.x] cannot be changed from type [long] to [double]" },
        -- parameters a mapper cannot update, with the defaults ES compares against
        { { d = { type = "date", format = "epoch_millis" } }, "Mapper for [d] conflicts with existing mapper:\n\t" ..
          "Cannot update parameter [format] from [strict_date_optional_time||epoch_millis] to [epoch_millis]" },
        { { k = { type = "keyword", index = false, doc_values = false } }, "Mapper for [k] conflicts with existing mapper:\n\t" ..
          "Cannot update parameter [index] from [true] to [false]\n\tCannot update parameter [doc_values] from [true] to [false]" },
      }
      for _, c in ipairs(conflicts) do
        st, b = jreq("PUT", "/pm2/_mapping", { properties = c[1] })
        assert.equal(400, st, c[2])
        assert.same(es_error(400, "illegal_argument_exception", c[2]), b)
      end
      -- refused updates change nothing, on any of the indices named
      st, b = jreq("PUT", "/pm1,pm2/_mapping", { properties = { k = { type = "long" } } })
      assert.equal(400, st)
      assert.is_nil(select(2, jreq("GET", "/pm1/_mapping")).pm1.mappings.properties.k)
      -- updateable parameters take the update's value (left out: the default again, as in ES)
      st = req("PUT", "/pm2/_mapping", { properties = { k = { type = "keyword" },
        s = { type = "text", fields = { raw = { type = "keyword" } } } } })
      assert.equal(200, st)
      put_doc("pm2", "2", { k = "abcdef" })
      st, b = jreq("POST", "/pm2/_search", { query = { term = { k = "abcdef" } } })
      assert.same({ "2" }, ids(b))
      st, b = jreq("GET", "/pm2/_mapping")
      assert.same({ type = "keyword" }, b.pm2.mappings.properties.k)
      assert.same({ type = "text", fields = { keyword = { type = "keyword", ignore_above = 256 }, raw = { type = "keyword" } } },
        b.pm2.mappings.properties.s)
      -- the root's dynamic setting
      assert.equal(200, (req("PUT", "/pm2/_mapping", { dynamic = "strict" })))
      st, b = jreq("PUT", "/pm2/_doc/3", { fresh = 1 })
      assert.equal(400, st)
      assert.equal("strict_dynamic_mapping_exception", b.error.type)
      -- every index the expression names (wildcards, _all)
      assert.equal(200, (req("PUT", "/pm*/_mapping", { properties = { added = { type = "ip" } } })))
      for _, i in ipairs({ "pm1", "pm2" }) do
        assert.same({ type = "ip" }, select(2, jreq("GET", "/" .. i .. "/_mapping"))[i].mappings.properties.added)
      end
      -- 10_basic.yml "Put mappings with explicit _doc type"
      st, b = jreq("PUT", "/pm1/_mapping", { _doc = { properties = { field = { type = "keyword" } } } })
      assert.same(es_error(400, "illegal_argument_exception", "Types cannot be provided in put mapping requests"), b)
      -- the mapping parser's errors, as at index creation
      st, b = jreq("PUT", "/pm1/_mapping", { properties = { f = { type = "nope" } } })
      assert.equal(400, st)
      assert.equal("Failed to parse mapping: No handler for type [nope] declared on field [f]", b.error.reason)
      st, b = jreq("PUT", "/pm1/_mapping")
      assert.same(es_error(400, "parse_exception", "request body is required"), b)
      st, b = jreq("PUT", "/nope/_mapping", {})
      assert.same(not_found("nope"), b)
      st, b = jreq("PUT", "/nope*/_mapping", {})
      assert.same(not_found("nope*"), b)
      st, b = jreq("PUT", "/pm1/_mapping?bogus=1", {})
      assert.equal("request [/pm1/_mapping] contains unrecognized parameter: [bogus]", b.error.reason)
      -- over the index's mapping limits: ES's MappingLookup check, nothing added
      req("PUT", "/pm3", { settings = { ["index.mapping.total_fields.limit"] = 2 } })
      st, b = jreq("PUT", "/pm3/_mapping", { properties = { a = { type = "long" }, b = { type = "long" }, c = { type = "long" } } })
      assert.same(es_error(400, "illegal_argument_exception", "Limit of total fields [2] has been exceeded"), b)
      _, _, b = req("GET", "/pm3/_mapping")
      assert.equal('{"pm3":{"mappings":{}}}', b)
    end)
    it("GET /{index}/_mapping/field/{fields} shows field mappings, like ES", function()
      req("PUT", "/fm1", { mappings = { properties = { t1 = { type = "text" }, t2 = { type = "keyword" },
        obj = { properties = { t1 = { type = "text" }, i_t1 = { type = "long" } } } } } })
      req("PUT", "/fm2", { mappings = { properties = { t1 = { type = "text" } } } })
      put_doc("fm2", "1", { s = "x" })
      local st, b = jreq("GET", "/fm1/_mapping/field/t1")
      assert.equal(200, st)
      assert.same({ fm1 = { mappings = { t1 = { full_name = "t1", mapping = { t1 = { type = "text" } } } } } }, b)
      -- es-spec indices.get_field_mapping/50_field_wildcards.yml: full names, leaf-keyed mappings
      st, b = jreq("GET", "/fm1/_mapping/field/*t1")
      assert.same({ "obj.i_t1", "obj.t1", "t1" }, (function() local n = {} for k in pairs(b.fm1.mappings) do n[#n + 1] = k end table.sort(n) return n end)())
      assert.same({ full_name = "obj.i_t1", mapping = { i_t1 = { type = "long" } } }, b.fm1.mappings["obj.i_t1"])
      st, b = jreq("GET", "/_mapping/field/t1,s.keyword")
      assert.equal(200, st)
      assert.same({ type = "text" }, b.fm1.mappings.t1.mapping.t1)
      assert.same({ full_name = "s.keyword", mapping = { keyword = { type = "keyword", ignore_above = 256 } } },
        b.fm2.mappings["s.keyword"])
      -- 20_missing_field.yml: the index with no such field has empty mappings
      local _, _, body = req("GET", "/fm1/_mapping/field/nope")
      assert.equal('{"fm1":{"mappings":{}}}', body)
      st, b = jreq("GET", "/nope/_mapping/field/t1")
      assert.equal(404, st)
      assert.same(not_found("nope"), b)
      st, _, body = req("GET", "/none*/_mapping/field/t1")
      assert.equal(404, st); assert.equal("{}", body)
    end)
    it("takes a date with a 'T' only, as strict_date_optional_time does: a space is not a date", function()
      -- "2024-01-02 10:00:00" fails a date field in ES, and dynamic mapping makes it text
      put_doc("spdate", "1", { d = "2024-01-02T10:00:00Z" })
      local st, b = jreq("PUT", "/spdate/_doc/2", { d = "2024-01-02 10:00:00" })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
      assert.matches("failed to parse field %[d%] of type %[date%]", b.error.reason)
      put_doc("spdate", "3", { e = "2024-01-02 10:00:00" })
      _, b = jreq("GET", "/spdate/_mapping")
      assert.equal("date", b.spdate.mappings.properties.d.type)
      assert.equal("text", b.spdate.mappings.properties.e.type)
      st, b = jreq("POST", "/spdate/_search", { query = { range = { d = { gte = "2024-01-02 00:00:00" } } } })
      assert.equal(400, st)
      assert.equal("search_phase_execution_exception", b.error.type)
    end)
    it("refuses a day its month does not have, as java.time's strict resolver does", function()
      put_doc("baddays", "1", { d = "2024-02-29" })
      for _, v in ipairs({ "2024-02-30", "2023-02-29", "2024-04-31T10:00:00Z" }) do
        local st, b = jreq("PUT", "/baddays/_doc/2", { d = v })
        assert.equal(400, st, v)
        assert.matches("failed to parse field %[d%] of type %[date%]", b.error.reason)
      end
      local st, b = jreq("POST", "/baddays/_search", { query = { range = { d = { lt = "2024-02-30" } } } })
      assert.equal(400, st)
      assert.equal("search_phase_execution_exception", b.error.type)
    end)
    it("maps date-looking strings as text under \"date_detection\": false", function()
      assert.equal(200, (req("PUT", "/nodates", { mappings = { date_detection = false } })))
      put_doc("nodates", "1", { site_id = "2024-01-01" })
      local st, b = jreq("PUT", "/nodates/_doc/2", { site_id = "shop" })
      assert.equal(201, st, require("cjson").encode(b))
      st, b = jreq("GET", "/nodates")
      assert.equal(200, st)
      assert.is_false(b.nodates.mappings.date_detection)
      assert.equal("text", b.nodates.mappings.properties.site_id.type)
      -- and with it on (ES's default) the first such string makes a date field
      put_doc("dates", "1", { site_id = "2024-01-01" })
      st, b = jreq("PUT", "/dates/_doc/2", { site_id = "shop" })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
    end)
    it("maps numeric strings as long / float under \"numeric_detection\": true, as ES does", function()
      assert.equal(200, (req("PUT", "/numdet", { mappings = { numeric_detection = true } })))
      put_doc("numdet", "1", { l = "42", f = "1.5", e = "1e3", t = "x1", d = "2024-01-01", big = "99999999999999999999" })
      put_doc("numdet", "2", { l = "7", f = "-0.25", e = "5" })
      local st, b = jreq("GET", "/numdet/_mapping")
      assert.equal(200, st)
      local m = b.numdet.mappings
      assert.is_true(m.numeric_detection)
      assert.same({ type = "long" }, m.properties.l)
      assert.same({ type = "float" }, m.properties.f)
      assert.same({ type = "float" }, m.properties.e)
      assert.same({ type = "float" }, m.properties.big)
      assert.equal("text", m.properties.t.type)
      assert.equal("date", m.properties.d.type)   -- date detection comes first
      st, b = jreq("POST", "/numdet/_search", { query = { range = { l = { gte = 10 } } }, sort = { { f = "asc" } } })
      assert.equal(200, st)
      assert.same({ "1" }, ids(b))
      -- off (the default): text
      put_doc("numoff", "1", { l = "42" })
      _, b = jreq("GET", "/numoff/_mapping")
      assert.equal("text", b.numoff.mappings.properties.l.type)
    end)
    it("detects yyyy/MM/dd dates as ES's default dynamic_date_formats do, with that format", function()
      local SLASH = "yyyy/MM/dd HH:mm:ss||yyyy/MM/dd||epoch_millis"
      put_doc("slashd", "1", { d = "2015/09/02", t = "2015/09/02 10:00:00", x = "2015/9/2", n = "42" })
      put_doc("slashd", "2", { d = "2015/09/03", t = "2015/09/02 11:30:00" })
      local st, b = jreq("GET", "/slashd/_mapping")
      assert.equal(200, st)
      local props = b.slashd.mappings.properties
      assert.same({ type = "date", format = SLASH }, props.d)
      assert.same({ type = "date", format = SLASH }, props.t)
      assert.equal("text", props.x.type)   -- MM and dd take two digits
      assert.equal("text", props.n.type)   -- nor is any digit string a date
      local function hits(q, sort)
        local st2, r = jreq("POST", "/slashd/_search", { query = q, sort = { { [sort or "d"] = "asc" } } })
        assert.equal(200, st2, cjson.encode(r))
        return ids(r), r
      end
      local got, r = hits({ match_all = {} })
      assert.same({ "1", "2" }, got)
      assert.same({ 1441152000000 }, r.hits.hits[1].sort)
      assert.same({ "1" }, (hits({ range = { d = { lte = "2015/09/02" } } })))
      assert.same({ "2" }, (hits({ term = { d = "2015/09/03" } })))
      assert.same({ "2" }, (hits({ range = { t = { gt = "2015/09/02 10:00:00" } } }, "t")))
      -- a field of the default format (strict_date_optional_time||epoch_millis) refuses them
      put_doc("isod", "1", { d = "2015-09-02" })
      st, b = jreq("PUT", "/isod/_doc/2", { d = "2015/09/02" })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
    end)
    it("applies dynamic_date_formats, and returns 400 when a format is epoch_ or one esxd cannot read", function()
      -- it was accepted and ignored: ES's default formats detected the dates
      local st, b = jreq("PUT", "/ddf", { mappings = { dynamic_date_formats = { "yyyy/MM/dd" } } })
      assert.equal(200, st)
      put_doc("ddf", "1", { a = "2015/09/02", b = "2015-09-02", c = "2015/09/02 10:00:00", n = "2015" })
      _, b = jreq("GET", "/ddf/_mapping")
      local props = b.ddf.mappings.properties
      assert.same({ type = "date", format = "yyyy/MM/dd" }, props.a)
      assert.equal("text", props.b.type)
      assert.equal("text", props.c.type)
      assert.equal("text", props.n.type)                      -- numbers are never dynamic dates
      assert.same({ "yyyy/MM/dd" }, b.ddf.mappings.dynamic_date_formats)
      st, b = jreq("PUT", "/ddf/_doc/2", { a = "2015-09-03" })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
      -- "none" (also under the old name date_formats): no date detection; the default
      -- format itself is not shown on the field
      assert.equal(200, (jreq("PUT", "/ddfn", { mappings = { dynamic_date_formats = "none" } })))
      assert.equal(200, (jreq("PUT", "/ddfo", { mappings = { date_formats = "none" } })))
      assert.equal(200, (jreq("PUT", "/ddfd", { mappings = { dynamic_date_formats = {
        "strict_date_optional_time||epoch_millis", "yyyy/MM/dd HH:mm:ss" } } })))
      for _, i in ipairs({ "ddfn", "ddfo", "ddfd" }) do
        put_doc(i, "1", { a = "2015-09-02", c = "2015/09/02 10:00:00", s = "2015/09/02" })
      end
      _, b = jreq("GET", "/ddfn,ddfo,ddfd/_mapping")
      assert.equal("text", b.ddfn.mappings.properties.a.type)
      assert.equal("text", b.ddfo.mappings.properties.a.type)
      assert.same({ type = "date" }, b.ddfd.mappings.properties.a)
      assert.same({ type = "date", format = "yyyy/MM/dd HH:mm:ss" }, b.ddfd.mappings.properties.c)
      assert.equal("text", b.ddfd.mappings.properties.s.type)
      -- RootObjectMapper refuses epoch formats; esxd refuses the patterns its parser cannot read
      st, b = jreq("PUT", "/ddfe", { mappings = { dynamic_date_formats = { "yyyy/MM/dd", "epoch_millis" } } })
      assert.equal(400, st)
      assert.same({ error = { root_cause = { { type = "mapper_parsing_exception",
        reason = "Epoch [epoch_millis] is not supported as dynamic date format" } }, type = "mapper_parsing_exception",
        reason = "Failed to parse mapping: Epoch [epoch_millis] is not supported as dynamic date format",
        caused_by = { type = "mapper_parsing_exception", reason = "Epoch [epoch_millis] is not supported as dynamic date format" } },
        status = 400 }, b)
      for _, f in ipairs({ { "dd.MM.yyyy" }, "dd.MM.yyyy", { "yyyy/MM/dd", "yyyy/MM/dd||dd.MM.yyyy" } }) do
        st, b = jreq("PUT", "/ddfx", { mappings = { dynamic_date_formats = f } })
        assert.equal(400, st)
        local bad = type(f) == "table" and f[#f] or f
        assert.same(es_error(400, "illegal_argument_exception", "esxd does not implement the date format [" .. bad ..
          "] in [dynamic_date_formats]: its date parser reads strict_date_optional_time, date_optional_time, " ..
          "yyyy/MM/dd, yyyy/MM/dd HH:mm:ss, epoch_millis and epoch_second (joined with ||) only"), b)
      end
      assert.equal(404, (req("HEAD", "/ddfe")))
      assert.equal(404, (req("HEAD", "/ddfx")))
    end)
    it("a dynamic template for dates keeps the detected date format when its mapping has none", function()
      -- ES parses the template's mapping with the detected formatter as the default format;
      -- esxd gave the field the default format, which then refused the next yyyy/MM/dd date
      local SLASH = "yyyy/MM/dd HH:mm:ss||yyyy/MM/dd||epoch_millis"
      assert.equal(200, (jreq("PUT", "/dtf", { mappings = { dynamic_templates = {
        { d = { match_mapping_type = "date", mapping = { type = "date", meta = { k = "v" } } } } } } })))
      assert.equal(200, (jreq("PUT", "/dtfc", { mappings = { dynamic_date_formats = { "yyyy/MM/dd" },
        dynamic_templates = { { d = { match_mapping_type = "date", mapping = { type = "{dynamic_type}" } } } } } })))
      put_doc("dtf", "1", { s = "2015/09/02", i = "2015-09-02" })
      put_doc("dtf", "2", { s = "2015/09/03", i = "2015-09-03" })
      put_doc("dtfc", "1", { s = "2015/09/02" })
      put_doc("dtfc", "2", { s = "2015/09/03" })
      local _, b = jreq("GET", "/dtf,dtfc/_mapping")
      assert.same({ type = "date", format = SLASH, meta = { k = "v" } }, b.dtf.mappings.properties.s)
      assert.same({ type = "date", meta = { k = "v" } }, b.dtf.mappings.properties.i)
      assert.same({ type = "date", format = "yyyy/MM/dd" }, b.dtfc.mappings.properties.s)
      local st, r = jreq("POST", "/dtf/_search", { query = { range = { s = { gte = "2015/09/03" } } } })
      assert.equal(200, st)
      assert.same({ "2" }, ids(r))
    end)
    it("returns 400 when an ISO date goes to a field whose format has only the yyyy/MM/dd parsers", function()
      -- the slash format has no ISO parser: ES refuses "2015-09-03" there (esxd took it)
      local SLASH = "yyyy/MM/dd HH:mm:ss||yyyy/MM/dd||epoch_millis"
      put_doc("slashi", "1", { d = "2015/09/02" })             -- dynamic: the slash format
      assert.equal(200, (jreq("PUT", "/slashx", { mappings = { properties = { d = { type = "date", format = SLASH },
        o = { type = "date", format = "yyyy/MM/dd" } } } })))
      for _, c in ipairs({ { "slashi", "d", "2015-09-03" }, { "slashx", "d", "2015-09-03T10:00:00Z" },
          { "slashx", "o", "2015/09/03 10:00:00" }, { "slashx", "o", "2015-09-03" } }) do
        local st, b = jreq("PUT", "/" .. c[1] .. "/_doc/2", { [c[2]] = c[3] })
        assert.equal(400, st, c[3])
        assert.equal("document_parsing_exception", b.error.type, c[3])
        assert.equal("failed to parse field [" .. c[2] .. "] of type [date] in document with id '2'. " ..
          "Preview of field's value: '" .. c[3] .. "'", b.error.reason:match("^%[[%d:]+%] (.*)$"), c[3])
      end
      put_doc("slashx", "1", { d = "2015/09/02 10:00:00", o = "2015/09/02" })
      put_doc("slashx", "2", { d = "1441238400000" })
      local st, b = jreq("POST", "/slashx/_search", { query = { range = { d = { gte = "2015-09-01" } } } })
      assert.equal(400, st)
      query_shard_failure(b, "slashx", "parse_exception",
        "failed to parse date field [2015-09-01] with format [" .. SLASH .. "]")
      st, b = jreq("POST", "/slashx/_search", { query = { range = { d = { gte = "2015/09/03" } } } })
      assert.equal(200, st)
      assert.same({ "2" }, ids(b))
    end)
  end)

  describe("documents", function()
    it("PUT /{index}/_doc/{id} creates (201) then updates (200), auto-creating the index", function()
      local st, b = jreq("PUT", "/docs/_doc/1", { title = "one" })
      assert.equal(201, st)
      assert.same({ _index = "docs", _id = "1", _version = 1, result = "created",
        _shards = { total = 2, successful = 1, failed = 0 }, _seq_no = 0, _primary_term = 1 }, b)
      st, b = jreq("POST", "/docs/_doc/1", { title = "uno" })
      assert.equal(200, st)
      assert.same({ _index = "docs", _id = "1", _version = 2, result = "updated",
        _shards = { total = 2, successful = 1, failed = 0 }, _seq_no = 1, _primary_term = 1 }, b)
    end)
    it("201 Created answers carry ES's Location header", function()
      local st, h = req("PUT", "/loc/_doc/a%20b%2Fc", { a = 1 })
      assert.equal(201, st)
      assert.equal("/loc/_doc/a+b%2Fc", h["location"])
      st, h = req("PUT", "/loc/_doc/a%20b%2Fc", { a = 2 })
      assert.equal(200, st)
      assert.is_nil(h["location"])
      local body
      st, h, body = req("POST", "/loc/_doc?routing=r1", { a = 1 })
      assert.equal("/loc/_doc/" .. cjson.decode(body)._id .. "?routing=r1", h["location"])
      st, h = req("PUT", "/loc/_create/c1", { a = 1 })
      assert.equal("/loc/_doc/c1", h["location"])
      st, h = req("POST", "/loc/_update/u1", { doc = { a = 1 }, doc_as_upsert = true })
      assert.equal(201, st)
      assert.equal("/loc/_doc/u1", h["location"])
    end)
    it("refresh=true adds forced_refresh", function()
      local st, b = jreq("PUT", "/docs/_doc/r?refresh=true", { a = 1 })
      assert.equal(201, st)
      assert.is_true(b.forced_refresh)
      st, b = jreq("PUT", "/docs/_doc/w?refresh=wait_for", { a = 1 })
      assert.equal(201, st)
      assert.is_nil(b.forced_refresh)
    end)
    it("keeps integers beyond 2^53 exact in filtered sources and updates, as ES does", function()
      -- ES keeps a source's longs and big integers as parsed: filtering and _update's merge
      -- serialise them again with every digit
      req("PUT", "/big", { mappings = { properties = { n = { type = "unsigned_long" } } } })
      local st = req("PUT", "/big/_doc/1?refresh=true", '{"n":12345678901234567891,"m":9007199254740993,' ..
        '"o":{"k":-9007199254740995,"l":[9007199254740997]},"s":"12345678901234567891"}')
      assert.equal(201, st)
      local body
      st, _, body = req("GET", "/big/_doc/1?_source_includes=n,o")
      assert.equal(200, st)
      assert.matches('"_source":{"n":12345678901234567891,"o":{"k":-9007199254740995,"l":[9007199254740997]}}', body, 1, true)
      _, _, body = req("GET", "/big/_source/1?_source_excludes=o,s")
      assert.matches('"m":9007199254740993', body, 1, true)
      assert.matches('"n":12345678901234567891', body, 1, true)
      _, _, body = req("POST", "/big/_search", { _source = { "m" }, query = { match_all = {} } })
      assert.matches('"_source":{"m":9007199254740993}', body, 1, true)
      -- an update merges exact values: a partial doc keeps the others' digits, and 2^53 is
      -- not the same value as 2^53 + 1 (no noop)
      st, _, body = req("POST", "/big/_update/1?_source=m", '{"doc":{"z":9007199254740999}}')
      assert.equal(200, st)
      assert.matches('"_source":{"m":9007199254740993}', body, 1, true)
      _, _, body = req("GET", "/big/_doc/1")
      assert.matches('"m":9007199254740993', body, 1, true)
      assert.matches('"n":12345678901234567891', body, 1, true)
      assert.matches('"z":9007199254740999', body, 1, true)
      assert.matches('"l":[9007199254740997]', body, 1, true)
      local b
      st, b = jreq("POST", "/big/_update/1", '{"doc":{"m":9007199254740992}}')
      assert.equal("updated", b.result)
      st, b = jreq("POST", "/big/_update/1", '{"doc":{"m":9007199254740992}}')
      assert.equal("noop", b.result)
      -- an upsert's source and a _bulk update too
      _, _, body = req("POST", "/big/_update/2?_source=true", '{"doc":{"m":9007199254740993},"doc_as_upsert":true}')
      assert.matches('"_source":{"m":9007199254740993}', body, 1, true)
      _, _, body = req("POST", "/_bulk", '{"update":{"_index":"big","_id":"2"}}\n{"doc":{"q":-9007199254740993}}\n', NDJSON)
      _, _, body = req("GET", "/big/_doc/2")
      assert.matches('"m":9007199254740993', body, 1, true)
      assert.matches('"q":-9007199254740993', body, 1, true)
    end)
    it("refresh=wait_for answers after the next refresh, not before, as in ES", function()
      -- a request sent on its own connection, its answer read later
      local function send(method, path, body, ctype)
        local sock = socket.tcp()
        sock:settimeout(5)
        assert(sock:connect("127.0.0.1", srv.port))
        assert(sock:send(method .. " " .. path .. " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: " ..
          (ctype or "application/json") .. "\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body))
        return sock
      end
      local function answer(sock, timeout)
        sock:settimeout(timeout)
        local status, err = sock:receive("*l")
        if not status then return nil, err end
        sock:settimeout(5)
        local len
        repeat
          local line = sock:receive("*l")
          len = len or tonumber(line:match("^[Cc]ontent%-[Ll]ength:%s*(%d+)"))
        until line == ""
        local text = sock:receive(len)
        sock:close()
        return tonumber(status:match("^HTTP/1%.1 (%d+)")), cjson.decode(text)
      end
      local function count(index) return select(2, jreq("GET", "/" .. index .. "/_count")).count end
      -- no automatic refresh: the write waits until something else refreshes the index
      req("PUT", "/wf", { settings = { refresh_interval = "-1" } })
      for _, w in ipairs({
        { "PUT", "/wf/_doc/1?refresh=wait_for", '{"a":1}' },
        { "POST", "/wf/_update/1?refresh=wait_for", '{"doc":{"a":2}}' },
        { "DELETE", "/wf/_doc/1?refresh=wait_for", "" },
        { "POST", "/_bulk?refresh=wait_for", '{"index":{"_index":"wf","_id":"2"}}\n{"a":1}\n', "application/x-ndjson" },
      }) do
        local before = count("wf")
        local sock = send(w[1], w[2], w[3], w[4])
        local st, err = answer(sock, 0.4)
        assert.is_nil(st, w[2])
        assert.equal("timeout", err, w[2])
        assert.equal(before, count("wf"), w[2])          -- not visible, not refreshed
        assert.equal(200, (req("POST", "/wf/_refresh")))
        local b
        st, b = answer(sock, 5)
        assert.is_true(st == 200 or st == 201, w[2])
        local r = b.items and b.items[1].index or b
        assert.is_nil(r.forced_refresh, w[2])
      end
      assert.equal(1, count("wf"))
      -- a noop update wrote nothing: it does not wait
      local st, b = jreq("POST", "/wf/_update/2?refresh=wait_for", { doc = { a = 1 } })
      assert.equal("noop", b.result)
      -- the automatic refresh (index.refresh_interval) ends the wait too
      req("PUT", "/wf1", { settings = { refresh_interval = "1s" } })
      st, b = jreq("PUT", "/wf1/_doc/1?refresh=wait_for", { a = 1 })
      assert.equal(201, st)
      assert.is_nil(b.forced_refresh)
      assert.equal(1, count("wf1"))
      -- index.max_refresh_listeners requests already waiting (here 0): the request refreshes
      -- the index itself and says forced_refresh, as ES does
      req("PUT", "/wf0", { settings = { refresh_interval = "-1", max_refresh_listeners = 0 } })
      st, b = jreq("PUT", "/wf0/_doc/1?refresh=wait_for", { a = 1 })
      assert.equal(201, st)
      assert.is_true(b.forced_refresh)
      assert.equal(1, count("wf0"))
      st, b = jreq("POST", "/_bulk?refresh=wait_for", '{"index":{"_index":"wf0","_id":"2"}}\n{"a":1}\n', NDJSON)
      assert.is_true(b.items[1].index.forced_refresh)
      assert.equal(2, count("wf0"))
    end)
    it("POST /{index}/_doc generates a 20 character id", function()
      local st, b = jreq("POST", "/docs/_doc", { a = 1 })
      assert.equal(201, st)
      assert.equal("created", b.result)
      assert.matches("^[%w_-]+$", b._id)
      assert.equal(20, #b._id)
      local st2, b2 = jreq("POST", "/docs/_doc", { a = 2 })
      assert.equal(201, st2)
      assert.are_not.equal(b._id, b2._id)
    end)
    it("GET returns found / not found", function()
      put_doc("docs", "g1", { x = "y", nested = { a = 1 } })
      local st, b = jreq("GET", "/docs/_doc/g1")
      assert.equal(200, st)
      assert.same({ _index = "docs", _id = "g1", _version = 1, _seq_no = 0, _primary_term = 1, found = true,
        _source = { x = "y", nested = { a = 1 } } }, b)
      st, b = jreq("GET", "/docs/_doc/nope")
      assert.equal(404, st)
      assert.same({ _index = "docs", _id = "nope", found = false }, b)
      st, b = jreq("GET", "/nodocs/_doc/1")
      assert.equal(404, st)
      assert.same(not_found("nodocs"), b)
    end)
    it("GET is real time (no refresh needed) and supports _source filtering", function()
      jreq("PUT", "/rt/_doc/1", { a = 1, b = { c = 2, d = 3 } })
      local st, b = jreq("GET", "/rt/_doc/1?_source_includes=b.c")
      assert.equal(200, st)
      assert.same({ b = { c = 2 } }, b._source)
      st, b = jreq("GET", "/rt/_doc/1?_source=false")
      assert.is_nil(b._source)
    end)
    it("GET honours realtime, refresh, version and stored_fields", function()
      -- no automatic refresh: realtime=false must see the last explicit refresh only
      assert.equal(200, (jreq("PUT", "/gp", { settings = { refresh_interval = "-1" } })))
      put_doc("gp", "1", { a = 1 })
      jreq("PUT", "/gp/_doc/1", { a = 2 })                       -- not refreshed yet
      local st, b = jreq("GET", "/gp/_doc/1?realtime=false")
      assert.equal(200, st)
      assert.same({ a = 1 }, b._source)
      assert.equal(1, b._version)
      jreq("PUT", "/gp/_doc/2", { a = 3 })
      st, b = jreq("GET", "/gp/_doc/2?realtime=false")
      assert.equal(404, st)
      assert.same({ _index = "gp", _id = "2", found = false }, b)
      assert.equal(404, (req("HEAD", "/gp/_doc/2?realtime=false")))
      st, b = jreq("GET", "/gp/_doc/2?refresh=true&realtime=false")
      assert.equal(200, st)
      assert.same({ a = 3 }, b._source)
      st, b = jreq("GET", "/gp/_doc/1?version=1")
      assert.equal(409, st)
      assert.same(es_error(409, "version_conflict_engine_exception",
        "[1]: version conflict, current version [2] is different than the one provided [1]",
        { index_uuid = b.error.index_uuid, shard = "0", index = "gp" }), b)
      assert.equal(409, (req("HEAD", "/gp/_doc/1?version=1")))
      assert.equal(409, (jreq("GET", "/gp/_source/1?version=7&version_type=external")))
      assert.equal(200, (jreq("GET", "/gp/_doc/1?version=2")))
      st, b = jreq("GET", "/gp/_doc/1?stored_fields=a")
      assert.equal(200, st)
      assert.same({ _index = "gp", _id = "1", _version = 2, _seq_no = 1, _primary_term = 1, found = true }, b)
      st, b = jreq("GET", "/gp/_doc/1?stored_fields=_source")
      assert.same({ a = 2 }, b._source)
    end)
    it("GET with stored_fields returns the stored fields' values in fields, exact names only", function()
      assert.equal(200, (jreq("PUT", "/gs", { settings = { refresh_interval = "-1" }, mappings = { properties = {
        code = { type = "keyword", store = true }, n = { type = "long", store = true },
        d = { type = "date", store = true, format = "yyyy/MM/dd||epoch_millis" },
        s = { type = "text", fields = { raw = { type = "keyword", store = true } } }, plain = { type = "keyword" } } } })))
      assert.equal(201, (jreq("PUT", "/gs/_doc/1?routing=r", { code = { "x", "y" }, n = "5", d = "2024/05/01", s = "Hi", plain = "p" })))
      -- real time: not refreshed yet; _routing stays top-level; unstored, unknown and pattern
      -- names give nothing
      local st, b = jreq("GET", "/gs/_doc/1?routing=r&stored_fields=code,n,d,s.raw,plain,nope,c*,_routing")
      assert.equal(200, st)
      assert.same({ _index = "gs", _id = "1", _version = 1, _seq_no = 0, _primary_term = 1, _routing = "r", found = true,
        fields = { code = { "x", "y" }, n = { 5 }, d = { "2024/05/01" }, ["s.raw"] = { "Hi" } } }, b)
      -- with _source listed, both (fields after _source, as ES writes them)
      local raw
      st, _, raw = req("GET", "/gs/_doc/1?stored_fields=n,_source")
      assert.equal(200, st)
      assert.truthy(raw:find('"_source":{.*},"fields":{"n":%[5%]}}$'), raw)
      -- none of them has a value: no "fields"
      st, b = jreq("GET", "/gs/_doc/1?stored_fields=plain,nope")
      assert.same({ _index = "gs", _id = "1", _version = 1, _seq_no = 0, _primary_term = 1, _routing = "r", found = true }, b)
    end)
    it("returns 400 action_request_validation_exception when GET /{index}/_source/{id} has _source=false", function()
      put_doc("gsrc", "1", { a = 1 })
      -- RestGetSourceAction, before the lookup (a missing index or document too), GET and HEAD
      local want = es_error(400, "action_request_validation_exception", "Validation Failed: 1: fetching source can not be disabled;")
      for _, p in ipairs({ "/gsrc/_source/1?_source=false", "/gsrc/_source/1?_source=false&_source_includes=a",
          "/nope/_source/1?_source=false", "/gsrc/_source/2?_source=false" }) do
        local st, b = jreq("GET", p)
        assert.equal(400, st, p)
        assert.same(want, b, p)
        assert.equal(400, (req("HEAD", p)), p)
      end
      -- HEAD is the same API as GET: its parameters, not get's (stored_fields is unknown there)
      local st, b = jreq("GET", "/gsrc/_source/1?stored_fields=a")
      assert.equal(400, st)
      assert.equal(400, (req("HEAD", "/gsrc/_source/1?stored_fields=a")))
      assert.equal(200, (req("HEAD", "/gsrc/_source/1?_source_includes=a")))
      assert.equal(404, (req("HEAD", "/gsrc/_source/2")))
      st, b = jreq("GET", "/gsrc/_source/1?_source=")
      assert.equal(200, st)
      assert.same({ a = 1 }, b)
    end)

    it("returns 400 when an index is created with aliases, which esxd does not implement", function()
      -- ES would resolve the alias in searches, counts, terms lookups and writes; esxd ignored
      -- it, so every later use of the name was a 404 (or auto-created an index of that name)
      local st, b = jreq("PUT", "/withalias", '{"aliases":{"wa-read":{},"wa-all":{"is_write_index":true}}}', JSON)
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "esxd does not implement aliases: index [withalias] " ..
        "cannot be created with aliases [wa-read], [wa-all]; create it without them and use the index name"), b)
      assert.equal(404, (req("HEAD", "/withalias")))
      -- an empty aliases object (what GET /{index} shows) is fine
      st = jreq("PUT", "/withalias", { aliases = {}, mappings = { properties = { a = { type = "long" } } } })
      assert.equal(200, st)
      local _, g = jreq("GET", "/withalias")
      assert.same({}, g.withalias.aliases)
    end)
    it("require_alias=true fails single-document writes (esxd has no aliases)", function()
      put_doc("ra", "1", { a = 1 })
      for _, r in ipairs({ { "PUT", "/ra/_doc/2" }, { "POST", "/ra/_doc" }, { "PUT", "/ra/_create/3" },
          { "POST", "/ranew/_doc" } }) do
        local name = r[2]:match("^/([^/]+)")
        local st, b = jreq(r[1], r[2] .. "?require_alias=true", { a = 2 })
        assert.equal(404, st, r[2])
        assert.same(es_error(404, "index_not_found_exception",
          "no such index [" .. name .. "] and [require_alias] request flag is [true] and [" .. name .. "] is not an alias",
          { index_uuid = "_na_", index = name }), b, r[2])
      end
      assert.equal(404, (jreq("POST", "/ra/_update/1?require_alias=true", { doc = { a = 5 } })))
      local _, b = jreq("GET", "/ra/_doc/1")
      assert.same({ a = 1 }, b._source)
      assert.equal(404, (req("HEAD", "/ranew")))
      assert.equal(201, (jreq("PUT", "/ra/_doc/2?require_alias=false", { a = 2 })))
    end)
    it("returns the stored _source bytes verbatim", function()
      req("PUT", "/raw/_doc/1", '{"z":1,"a":[],"m":{}}')
      local _, _, body = req("GET", "/raw/_doc/1")
      assert.matches('"_source":{"z":1,"a":%[%],"m":{}}', body)
    end)
    it("HEAD on a document", function()
      put_doc("docs", "h", { a = 1 })
      assert.equal(200, (req("HEAD", "/docs/_doc/h")))
      assert.equal(404, (req("HEAD", "/docs/_doc/nope")))
    end)
    it("DELETE returns deleted, then not_found with 404", function()
      put_doc("docs", "d", { a = 1 })
      local st, b = jreq("DELETE", "/docs/_doc/d")
      assert.equal(200, st)
      assert.same({ _index = "docs", _id = "d", _version = 2, result = "deleted",
        _shards = { total = 2, successful = 1, failed = 0 }, _seq_no = 1, _primary_term = 1 }, b)
      st, b = jreq("DELETE", "/docs/_doc/d")
      assert.equal(404, st)
      assert.equal("not_found", b.result)
      assert.equal(3, b._version)
      st, b = jreq("DELETE", "/nodocs/_doc/d")
      assert.equal(404, st)
      assert.same(not_found("nodocs"), b)
    end)
    it("_create conflicts with 409 when the document exists", function()
      local st, b = jreq("PUT", "/docs/_create/c", { a = 1 })
      assert.equal(201, st)
      assert.equal("created", b.result)
      st, b = jreq("POST", "/docs/_create/c", { a = 2 })
      assert.equal(409, st)
      assert.equal("version_conflict_engine_exception", b.error.type)
      assert.equal("[c]: version conflict, document already exists (current version [1])", b.error.reason)
      assert.equal("docs", b.error.index)
      assert.equal("0", b.error.shard)
      assert.equal(409, b.status)
    end)
    it("op_type=create behaves like _create", function()
      put_doc("docs", "o", { a = 1 })
      local st, b = jreq("PUT", "/docs/_doc/o?op_type=create", { a = 2 })
      assert.equal(409, st)
      assert.equal("version_conflict_engine_exception", b.error.type)
    end)
    it("op_type: case-insensitive; _create takes op_type=create only", function()
      local st = jreq("PUT", "/opt/_doc/1?op_type=CREATE", { a = 1 })
      assert.equal(201, st)
      st = jreq("PUT", "/opt/_doc/1?op_type=Create", { a = 1 })
      assert.equal(409, st)
      assert.equal(201, (jreq("PUT", "/opt/_create/2?op_type=create", { a = 1 })))
      local b
      st, b = jreq("PUT", "/opt/_create/3?op_type=index", { a = 1 })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "opType must be 'create', found: [index]"), b)
    end)
    it("if_seq_no / if_primary_term compare-and-set", function()
      local r = put_doc("docs", "cas", { a = 1 })
      local st, b = jreq("PUT", "/docs/_doc/cas?if_seq_no=99&if_primary_term=1", { a = 2 })
      assert.equal(409, st)
      assert.equal("[cas]: version conflict, required seqNo [99], primary term [1]. current document has seqNo [" .. string.format("%d", r._seq_no) .. "] and primary term [1]", b.error.reason)
      st = jreq("PUT", "/docs/_doc/cas?if_seq_no=" .. string.format("%d", r._seq_no) .. "&if_primary_term=1", { a = 2 })
      assert.equal(200, st)
    end)
    it("if_primary_term without if_seq_no is ES's validation error", function()
      local st, b = jreq("PUT", "/cas2/_doc/1?if_primary_term=1", { a = 1 })
      assert.equal(400, st)
      assert.same(es_error(400, "action_request_validation_exception",
        "Validation Failed: 1: ifSeqNo is unassigned, but primary term is [1];"), b)
      st, b = jreq("PUT", "/cas2/_doc/1?if_seq_no=0", { a = 1 })
      assert.same(es_error(400, "action_request_validation_exception",
        "Validation Failed: 1: ifSeqNo is set, but primary term is [0];"), b)
    end)
    it("external versioning: version_type=external and external_gte", function()
      local st, b = jreq("PUT", "/docs/_doc/ext?version=5&version_type=external_gte", { n = 5 })
      assert.equal(201, st)
      assert.equal(5, b._version)
      st, b = jreq("PUT", "/docs/_doc/ext?version=5&version_type=external_gte", { n = 5 })
      assert.equal(200, st) -- gte: the same version again is accepted
      assert.equal(5, b._version)
      st, b = jreq("PUT", "/docs/_doc/ext?version=3&version_type=external_gte", { n = 3 })
      assert.equal(409, st)
      assert.equal("version_conflict_engine_exception", b.error.type)
      assert.equal("[ext]: version conflict, current version [5] is higher than the one provided [3]", b.error.reason)
      st, b = jreq("PUT", "/docs/_doc/ext?version=5&version_type=external", { n = 5 })
      assert.equal(409, st)
      assert.equal("[ext]: version conflict, current version [5] is higher or equal to the one provided [5]", b.error.reason)
      st, b = jreq("PUT", "/docs/_doc/ext?version=9&version_type=external&refresh=true", { n = 9 })
      assert.equal(200, st)
      assert.equal(9, b._version)
      st, b = jreq("GET", "/docs/_doc/ext")
      assert.equal(9, b._source.n)
      assert.equal(9, b._version)
      st, b = jreq("PUT", "/docs/_doc/ext2?version=2", { n = 1 })
      assert.equal(400, st)
      assert.equal("action_request_validation_exception", b.error.type)
      st, b = jreq("PUT", "/docs/_create/ext3?version=2&version_type=external", { n = 1 })
      assert.equal(400, st)
      assert.equal("Validation Failed: 1: create operations only support internal versioning. use index instead;", b.error.reason)
      -- in a bulk: a stale row is refused per item, a newer one applied
      st, b = jreq("POST", "/_bulk", table.concat({
        '{"index":{"_index":"docs","_id":"ext","version":7,"version_type":"external_gte"}}', '{"n":7}',
        '{"index":{"_index":"docs","_id":"ext","version":12,"version_type":"external_gte"}}', '{"n":12}', "" }, "\n"),
        NDJSON)
      assert.equal(200, st)
      assert.is_true(b.errors)
      assert.equal(409, b.items[1].index.status)
      assert.equal(200, b.items[2].index.status)
      assert.equal(12, b.items[2].index._version)
    end)
    it("write validation collects ES's messages (versioning, compare-and-set, create, id length)", function()
      local function verr(list)
        local parts = {}
        for i, m in ipairs(list) do parts[i] = i .. ": " .. m .. ";" end
        return es_error(400, "action_request_validation_exception", "Validation Failed: " .. table.concat(parts))
      end
      local _, b = jreq("PUT", "/wv/_doc/1?version=2&if_seq_no=0&if_primary_term=1", { a = 1 })
      assert.same(verr({ "internal versioning can not be used for optimistic concurrency control. " ..
        "Please use `if_seq_no` and `if_primary_term` instead", "compare and write operations can not use versioning" }), b)
      _, b = jreq("PUT", "/wv/_doc/1?version=3&version_type=external&if_seq_no=0&if_primary_term=1", { a = 1 })
      assert.same(verr({ "compare and write operations can not use versioning" }), b)
      _, b = jreq("PUT", "/wv/_create/1?version=3", { a = 1 })
      assert.same(verr({ "create operations do not support explicit versions. use index instead" }), b)
      _, b = jreq("PUT", "/wv/_create/1?if_seq_no=0&if_primary_term=1", { a = 1 })
      assert.same(verr({ "create operations do not support compare and set. use index instead" }), b)
      local long = string.rep("x", 513)
      _, b = jreq("PUT", "/wv/_doc/" .. long, { a = 1 })
      assert.same(verr({ "id [" .. long .. "] is too long, must be no longer than 512 bytes but was: 513" }), b)
      _, b = jreq("DELETE", "/wv/_doc/1?version=-5&version_type=external")
      assert.same(verr({ "illegal version value [-5] for version type [EXTERNAL]" }), b)
      -- in _bulk every item is validated first and any failure fails the whole request
      local st
      st, b = jreq("POST", "/_bulk", table.concat({
        '{"index":{"_index":"wv","_id":"ok"}}', '{}',
        '{"create":{"_index":"wv","_id":"c","version":4}}', '{}',
        '{"delete":{"_index":"wv","_id":"d","if_seq_no":1}}', "" }, "\n"), NDJSON)
      assert.equal(400, st)
      assert.same(verr({ "create operations do not support explicit versions. use index instead",
        "ifSeqNo is set, but primary term is [0]" }), b)
      assert.equal(404, (jreq("GET", "/wv/_doc/ok")))
    end)
    it("DELETE honours version / version_type (external versioning), also in _bulk", function()
      put_doc("docs", "dv", { a = 1 }, false)
      local st, b = jreq("DELETE", "/docs/_doc/dv?version=1&version_type=external")
      assert.equal(409, st)
      assert.same(es_error(409, "version_conflict_engine_exception",
        "[dv]: version conflict, current version [1] is higher or equal to the one provided [1]",
        { index_uuid = b.error.index_uuid, shard = "0", index = "docs" }), b)
      assert.equal(200, (jreq("GET", "/docs/_doc/dv")))            -- still there
      st, b = jreq("DELETE", "/docs/_doc/dv?version=5&version_type=external")
      assert.equal(200, st)
      assert.equal("deleted", b.result)
      assert.equal(5, b._version)
      -- the tombstone keeps the external version
      st, b = jreq("PUT", "/docs/_doc/dv?version=5&version_type=external", { a = 2 })
      assert.equal(409, st)
      assert.equal("[dv]: version conflict, current version [5] is higher or equal to the one provided [5]", b.error.reason)
      st, b = jreq("DELETE", "/docs/_doc/never?version=3&version_type=external_gte")
      assert.equal(404, st)
      assert.equal("not_found", b.result)
      assert.equal(3, b._version)
      st, b = jreq("DELETE", "/docs/_doc/dv?version=2")
      assert.equal(400, st)
      assert.equal("action_request_validation_exception", b.error.type)
      -- with external versioning a delete auto-creates a missing index (ES's TransportBulkAction)
      st, b = jreq("DELETE", "/dvnew/_doc/1?version=2&version_type=external")
      assert.equal(404, st)
      assert.equal("not_found", b.result)
      assert.equal(200, (req("HEAD", "/dvnew")))
      put_doc("docs", "dvb", { a = 1 }, false)
      st, b = jreq("POST", "/_bulk", table.concat({
        '{"delete":{"_index":"docs","_id":"dvb","version":1,"version_type":"external"}}',
        '{"delete":{"_index":"docs","_id":"dvb","version":8,"version_type":"external"}}', "" }, "\n"), NDJSON)
      assert.equal(409, b.items[1].delete.status)
      assert.equal(200, b.items[2].delete.status)
      assert.equal(8, b.items[2].delete._version)
    end)
    it("requires a body and valid JSON", function()
      local st, b = jreq("PUT", "/docs/_doc/nb", nil, JSON)
      assert.equal(400, st)
      assert.same(es_error(400, "parse_exception", "request body is required"), b)
      st, b = jreq("PUT", "/docs/_doc/bad", "{bad", JSON)
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
      st, b = jreq("PUT", "/docs/_doc/arr", "[1,2]", JSON)
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
    end)
    it("rejects values that do not fit the field type", function()
      put_doc("typed", "1", { n = 5 })
      local st, b = jreq("PUT", "/typed/_doc/2", { n = "abc" })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
      assert.matches("failed to parse field %[n%] of type %[long%]", b.error.reason)
    end)
    it("a date field with format epoch_millis takes epoch numbers only, as ES's epoch parser does", function()
      -- the collector's daily indices map ts / received_at as {"type":"date","format":"epoch_millis"};
      -- ES refuses an ISO-8601 string there: "failed to parse field [ts] of type [date] ..."
      assert.equal(200, (req("PUT", "/epochs", { mappings = { date_detection = false, properties = {
        ts = { type = "date", format = "epoch_millis" }, at = { type = "date" },
        s = { type = "date", format = "epoch_second||epoch_millis" } } } })))
      assert.equal(201, (req("PUT", "/epochs/_doc/1", { ts = 1700000000000, at = "2024-01-01T00:00:00Z" })))
      assert.equal(201, (req("PUT", "/epochs/_doc/2", { ts = "1700000000000", s = 1700000000 })))
      local st, b = jreq("PUT", "/epochs/_doc/3", { ts = "2024-01-01T00:00:00Z" })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
      assert.matches("failed to parse field %[ts%] of type %[date%] in document with id '3'%. " ..
        "Preview of field's value: '2024%-01%-01T00:00:00Z'", b.error.reason)
      st, b = jreq("PUT", "/epochs/_doc/4", { s = "2024-01-01" })
      assert.equal(400, st)
      assert.matches("failed to parse field %[s%] of type %[date%]", b.error.reason)
      st, b = jreq("POST", "/_bulk", '{"index":{"_index":"epochs","_id":"5"}}\n{"ts":"2024-01-01"}\n', NDJSON)
      assert.equal(200, st)
      assert.is_true(b.errors)
      assert.equal(400, b.items[1].index.status)
      assert.equal("document_parsing_exception", b.items[1].index.error.type)
    end)
    it("a date field reads a number from its text, as ES does: no exponent, 19 digits, 6 decimals", function()
      -- ES's epoch_millis parser (EpochTime) takes 1-19 digits within Long.MAX_VALUE and up
      -- to 6 decimals from the number's text; 1.7e12 is refused (ES #48472), whatever the
      -- format, so the collector's events with such a ts were dead-lettered after their 2xx
      assert.equal(200, (req("PUT", "/epochtext", { mappings = { date_detection = false, properties = {
        ts = { type = "date", format = "epoch_millis" }, at = { type = "date" },
        s = { type = "date", format = "epoch_second" }, n = { type = "double" },
        o = { properties = { ts = { type = "date", format = "epoch_millis" } } } } } })))
      local ok_docs = { '{"ts":1700000000000}', '{"ts":1700000000000.123456}', '{"ts":9223372036854775807}',
        '{"ts":-5}', '{"at":1700000000000.5}', '{"s":1700000000.123456789}', '{"n":1.7e12,"ts":1}',
        '{"x":{"ts":1.7e12},"ts":[1,2.5]}', '{"ts":1,"k":"1.7e12 \\" \\u0074s"}' }
      for i, doc in ipairs(ok_docs) do
        assert.equal(201, (req("PUT", "/epochtext/_doc/ok" .. i, doc)), doc)
      end
      local bad_docs = {
        { '{"ts":1.7e12}', "ts", "1.7e12" },
        { '{"ts":1700000000000E0}', "ts", "1700000000000E0" },
        { '{"at":1.7E+12}', "at", "1.7E+12" },
        { '{"ts":9223372036854775808}', "ts", "9223372036854775808" },
        { '{"ts":1700000000000.1234567}', "ts", "1700000000000.1234567" },
        { '{"ts":[1,1.7e12]}', "ts", "1.7e12" },
        { '{"o":[{"ts":1},{"ts":2e3}]}', "o.ts", "2e3" },
        { '{"\\u0074s":1.7e12}', "ts", "1.7e12" },
      }
      for i, c in ipairs(bad_docs) do
        local st, b = jreq("PUT", "/epochtext/_doc/bad" .. i, c[1])
        assert.equal(400, st, c[1])
        assert.equal("document_parsing_exception", b.error.type)
        assert.equal(("[1:1] failed to parse field [%s] of type [date] in document with id 'bad%d'. " ..
          "Preview of field's value: '%s'"):format(c[2], i, c[3]), b.error.reason)
      end
      local st, b = jreq("POST", "/_bulk", '{"create":{"_index":"epochtext","_id":"b1"}}\n{"ts":1.7e12}\n' ..
        '{"create":{"_index":"epochtext","_id":"b2"}}\n{"ts":1700000000000}\n', NDJSON)
      assert.equal(200, st)
      assert.is_true(b.errors)
      assert.equal(400, b.items[1].create.status)
      assert.equal("document_parsing_exception", b.items[1].create.error.type)
      assert.equal(201, b.items[2].create.status)
    end)
    it("_update keeps empty arrays and objects in _source as they were sent", function()
      put_doc("ea", "1", { n = 1 })
      -- cjson would decode [] and {} alike: compare the raw text
      assert.equal(200, (req("PUT", "/ea/_doc/1", '{"tags":[],"o":{},"l":[[],1]}', JSON)))
      assert.equal(200, (req("POST", "/ea/_update/1", '{"doc":{"x":1}}', JSON)))
      local _, _, body = req("GET", "/ea/_source/1")
      assert.same({ '"tags":[]', '"o":{}', '"l":[[],1]', '"x":1' }, {
        body:match('"tags":%[%]'), body:match('"o":{}'), body:match('"l":%[%[%],1%]'), body:match('"x":1') })
      assert.equal(201, (req("POST", "/ea/_update/2", '{"doc":{"tags":[]},"doc_as_upsert":true}', JSON)))
      _, _, body = req("GET", "/ea/_source/2")
      assert.equal('{"tags":[]}', body)
      assert.equal(201, (req("POST", "/ea/_update/3", '{"doc":{"a":1},"upsert":{"tags":[],"o":{}}}', JSON)))
      _, _, body = req("GET", "/ea/_source/3")
      assert.matches('"tags":[]', body, 1, true)
      -- a field that is an empty array takes a partial object by replacement, as ES does
      assert.equal(200, (req("POST", "/ea/_update/2", '{"doc":{"tags":{"k":"v"}}}', JSON)))
      _, _, body = req("GET", "/ea/_source/2")
      assert.equal('{"tags":{"k":"v"}}', body)
      -- and the same in _bulk
      local st = req("POST", "/_bulk", '{"update":{"_index":"ea","_id":"4"}}\n{"doc":{"e":[]},"doc_as_upsert":true}\n', NDJSON)
      assert.equal(200, st)
      _, _, body = req("GET", "/ea/_source/4")
      assert.equal('{"e":[]}', body)
      -- a doc that is an array is ES's parse error
      local b
      st, b = jreq("POST", "/ea/_update/1", '{"doc":[]}', JSON)
      assert.equal(400, st)
      assert.equal("[1:8] [UpdateRequest] doc doesn't support values of type: START_ARRAY", b.error.reason)
      st, b = jreq("POST", "/ea/_update/1", '{"doc":null}', JSON)
      assert.equal(400, st)
      assert.equal("[1:8] [UpdateRequest] doc doesn't support values of type: VALUE_NULL", b.error.reason)
    end)
    it("_update merges an empty object into an object as no change, as ES's XContentHelper.update", function()
      put_doc("em", "1", { o = { a = 1 }, p = "x" })
      local st, b = jreq("POST", "/em/_update/1", '{"doc":{"o":{}}}', JSON)
      assert.equal(200, st)
      assert.equal("noop", b.result)
      local _, _, body = req("GET", "/em/_source/1")
      assert.same({ o = { a = 1 }, p = "x" }, cjson.decode(body))
      -- [] is not {}: changing one into the other is an update, not a noop
      req("PUT", "/em/_doc/2", '{"o":{}}', JSON)
      st, b = jreq("POST", "/em/_update/2", '{"doc":{"o":[]}}', JSON)
      assert.equal("updated", b.result)
      _, _, body = req("GET", "/em/_source/2")
      assert.equal('{"o":[]}', body)
      -- an empty object still replaces what is not an object
      st, b = jreq("POST", "/em/_update/1", '{"doc":{"p":{}}}', JSON)
      assert.equal("updated", b.result)
      _, _, body = req("GET", "/em/_source/1")
      assert.matches('"p":{}', body, 1, true)
    end)
    it("an empty array is no value: exists does not match it, value_count does not count it", function()
      req("PUT", "/ev/_doc/1", '{"tags":[],"k":"a"}', JSON)
      req("PUT", "/ev/_doc/2", '{"tags":["x"],"k":"b"}', JSON)
      req("PUT", "/ev/_doc/3?refresh=true", '{"tags":[[],null],"k":"c"}', JSON)
      local _, b = jreq("POST", "/ev/_search", { query = { exists = { field = "tags" } } })
      assert.same({ "2" }, ids(b))
      _, b = jreq("POST", "/ev/_search", { query = { bool = { must_not = { exists = { field = "tags" } } } } })
      assert.same({ "1", "3" }, ids(b))
      _, b = jreq("POST", "/ev/_search", { size = 0, aggs = { c = { value_count = { field = "tags.keyword" } } } })
      assert.equal(1, b.aggregations.c.value)
    end)
    it("copy_to makes the target field index the source fields' values, as ES does", function()
      assert.equal(200, (jreq("PUT", "/ct", { mappings = { properties = {
        first = { type = "text", copy_to = "full" }, last = { type = "text", copy_to = { "full", "names" } },
        full = { type = "text" }, names = { type = "keyword" } } } })))
      put_doc("ct", "1", { first = "John", last = "Smith" })
      put_doc("ct", "2", { first = "Alice", last = "Jones" })
      local _, b = jreq("POST", "/ct/_search", { query = { match = { full = { query = "john smith", operator = "and" } } } })
      assert.same({ "1" }, ids(b))
      -- _source is what was sent
      assert.same({ first = "John", last = "Smith" }, b.hits.hits[1]._source)
      _, b = jreq("POST", "/ct/_search", { query = { term = { names = "Jones" } } })
      assert.same({ "2" }, ids(b))
      _, b = jreq("POST", "/ct/_search", { size = 0, aggs = { n = { terms = { field = "names" } } } })
      assert.equal(2, #b.aggregations.n.buckets)
    end)
    it("null_value is what a null indexes, as in ES", function()
      assert.equal(200, (jreq("PUT", "/nv", { mappings = { properties = {
        status = { type = "keyword", null_value = "NULL" }, n = { type = "long", null_value = 0 }, k = { type = "keyword" } } } })))
      req("PUT", "/nv/_doc/1", '{"status":null,"n":null,"k":null}', JSON)
      req("PUT", "/nv/_doc/2", '{"status":[null,"a"]}', JSON)
      req("PUT", "/nv/_doc/3", '{"status":[],"n":5}', JSON)
      req("PUT", "/nv/_doc/4?refresh=true", '{"other":1}', JSON)
      local _, b = jreq("POST", "/nv/_search", { query = { term = { status = "NULL" } } })
      assert.same({ "1", "2" }, ids(b))
      _, b = jreq("POST", "/nv/_search", { query = { exists = { field = "status" } } })
      assert.same({ "1", "2" }, ids(b))
      _, b = jreq("POST", "/nv/_search", { query = { range = { n = { lte = 0 } } } })
      assert.same({ "1" }, ids(b))
      -- without null_value a null is no value
      _, b = jreq("POST", "/nv/_search", { query = { exists = { field = "k" } } })
      assert.same({}, ids(b))
      _, b = jreq("POST", "/nv/_search", { size = 0, aggs = { s = { terms = { field = "status" } } } })
      assert.same({ { key = "NULL", doc_count = 2 }, { key = "a", doc_count = 1 } }, b.aggregations.s.buckets)
      _, b = jreq("GET", "/nv/_doc/1")
      assert.equal(cjson.null, b._source.status)
    end)
    it("sorts on the doc values the mapping makes: null_value, ignore_malformed, ignore_above, copy_to", function()
      -- ES sorts on doc values, which hold what the mapping indexed: a null's null_value, no
      -- malformed value that was ignored, no string over ignore_above, the copy_to values
      assert.equal(200, (jreq("PUT", "/srtmap", { mappings = { properties = {
        n = { type = "long", null_value = 3 }, m = { type = "long", ignore_malformed = true },
        k = { type = "keyword", ignore_above = 3 }, a = { type = "long", copy_to = "c" }, c = { type = "long" } } } })))
      req("PUT", "/srtmap/_doc/1", '{"n":null,"m":"x","k":"zzzz","a":1}', JSON)
      req("PUT", "/srtmap/_doc/2", '{"n":5,"m":2,"k":"b","a":9}', JSON)
      req("PUT", "/srtmap/_doc/3?refresh=true", '{"n":1,"m":1,"k":"c","c":5}', JSON)
      local function sorted(field, order)
        local st, b = jreq("POST", "/srtmap/_search", { sort = { { [field] = order or "asc" } } })
        assert.equal(200, st, cjson.encode(b))
        local out = {}
        for i, h in ipairs(b.hits.hits) do
          local v = h.sort[1]
          out[i] = h._id .. "=" .. (type(v) == "number" and string.format("%.0f", v) or v == cjson.null and "null" or tostring(v))
        end
        return table.concat(out, " ")
      end
      assert.equal("3=1 1=3 2=5", sorted("n"))
      -- (a missing value sorts last)
      assert.matches("^3=1 2=2 1=", sorted("m"))
      assert.equal("2=b 3=c 1=null", sorted("k"))
      assert.equal("2=9 3=5 1=1", sorted("c", "desc"))
    end)
    it("sort: a missing value sorts by \"missing\" (a custom value too) and shows ES's sort value", function()
      -- ES's sort values for a document without the field are the extremes its numeric sort
      -- type used (Long.MAX_VALUE / MIN_VALUE, +/-Infinity), null for a keyword; a custom
      -- "missing" value sorts the document as if it had that value
      assert.equal(200, (jreq("PUT", "/srtmiss", { mappings = { properties = {
        n = { type = "integer" }, d = { type = "double" }, k = { type = "keyword" }, t = { type = "date" } } } })))
      req("PUT", "/srtmiss/_doc/1", '{"n":5,"d":1.5,"k":"b","t":"2024-01-02"}', JSON)
      req("PUT", "/srtmiss/_doc/2", '{"n":1,"d":0.5,"k":"a","t":"2024-01-01"}', JSON)
      req("PUT", "/srtmiss/_doc/3?refresh=true", '{}', JSON)
      local function sorted(spec)
        -- the raw text: a decoder (or filter_path) would make 2^63 - 1 a double
        local st, _, raw = req("POST", "/srtmiss/_search", cjson.encode({ sort = { spec } }), JSON)
        assert.equal(200, st, raw)
        local out = {}
        for id, sv in raw:gmatch('"_id":"(%d+)".-"sort":(%b[])') do
          out[#out + 1] = '{"_id":"' .. id .. '","sort":' .. sv .. '}'
        end
        return '{"hits":{"hits":[' .. table.concat(out, ",") .. ']}}'
      end
      assert.equal('{"hits":{"hits":[{"_id":"2","sort":[1]},{"_id":"1","sort":[5]},' ..
        '{"_id":"3","sort":[9223372036854775807]}]}}', sorted({ n = "asc" }))
      assert.equal('{"hits":{"hits":[{"_id":"1","sort":[5]},{"_id":"2","sort":[1]},' ..
        '{"_id":"3","sort":[-9223372036854775808]}]}}', sorted({ n = "desc" }))
      assert.equal('{"hits":{"hits":[{"_id":"3","sort":[-9223372036854775808]},{"_id":"2","sort":[1]},' ..
        '{"_id":"1","sort":[5]}]}}', sorted({ n = { order = "asc", missing = "_first" } }))
      assert.equal('{"hits":{"hits":[{"_id":"2","sort":[0.5]},{"_id":"1","sort":[1.5]},' ..
        '{"_id":"3","sort":["Infinity"]}]}}', sorted({ d = "asc" }))
      assert.equal('{"hits":{"hits":[{"_id":"2","sort":["a"]},{"_id":"1","sort":["b"]},' ..
        '{"_id":"3","sort":[null]}]}}', sorted({ k = "asc" }))
      assert.equal('{"hits":{"hits":[{"_id":"2","sort":[1704067200000]},{"_id":"1","sort":[1704153600000]},' ..
        '{"_id":"3","sort":[9223372036854775807]}]}}', sorted({ t = "asc" }))
      -- a custom missing value
      assert.equal('{"hits":{"hits":[{"_id":"2","sort":[1]},{"_id":"3","sort":[3]},' ..
        '{"_id":"1","sort":[5]}]}}', sorted({ n = { order = "asc", missing = 3 } }))
      assert.equal('{"hits":{"hits":[{"_id":"3","sort":["0"]},{"_id":"2","sort":["a"]},' ..
        '{"_id":"1","sort":["b"]}]}}', sorted({ k = { order = "asc", missing = "0" } }))
    end)
    it("a multi-field of any name indexes its parent's values, as in ES", function()
      assert.equal(200, (jreq("PUT", "/mfx", { mappings = { properties = {
        t = { type = "text", fields = { raw = { type = "keyword" } } },
        k = { type = "keyword", fields = { txt = { type = "text" } } } } } })))
      put_doc("mfx", "1", { t = "Hello World", k = "Big Dog" })
      put_doc("mfx", "2", { t = "Another one", k = "Ant" })
      local _, b = jreq("POST", "/mfx/_search", { query = { term = { ["t.raw"] = "Hello World" } } })
      assert.same({ "1" }, ids(b))
      _, b = jreq("POST", "/mfx/_search", { query = { match = { ["k.txt"] = "dog" } } })
      assert.same({ "1" }, ids(b))
      _, b = jreq("POST", "/mfx/_search", { query = { exists = { field = "t.raw" } } })
      assert.same({ "1", "2" }, ids(b))
      _, b = jreq("POST", "/mfx/_search", { sort = { { ["t.raw"] = "asc" } } })
      assert.same({ "2", "1" }, ids(b))
      _, b = jreq("POST", "/mfx/_search", { size = 0, aggs = { r = { terms = { field = "t.raw" } } } })
      assert.same({ { key = "Another one", doc_count = 1 }, { key = "Hello World", doc_count = 1 } }, b.aggregations.r.buckets)
    end)
    it("ignore_above keeps longer strings out of a keyword field, 256 on dynamic .keyword, as in ES", function()
      assert.equal(200, (jreq("PUT", "/ia", { mappings = { properties = {
        k = { type = "keyword", ignore_above = 5 },
        t = { type = "text", fields = { raw = { type = "keyword", ignore_above = 3 } } } } } })))
      put_doc("ia", "1", { k = "short", t = "abc", d = "x" })
      put_doc("ia", "2", { k = "toolong", t = "abcd", d = string.rep("y", 257) })
      put_doc("ia", "3", { k = { "ok", "toolong" }, d = string.rep("é", 256) })
      local function search(q) local _, b = jreq("POST", "/ia/_search", { query = q }) return ids(b) end
      assert.same({ "1" }, search({ term = { k = "short" } }))
      assert.same({}, search({ term = { k = "toolong" } }))
      assert.same({ "3" }, search({ term = { k = "ok" } }))
      assert.same({ "1", "3" }, search({ exists = { field = "k" } }))
      assert.same({ "1" }, search({ exists = { field = "t.raw" } }))
      assert.same({ "2" }, search({ match = { t = "abcd" } })) -- the text field itself has no limit
      -- dynamic strings: keyword sub-field with ignore_above 256 (characters, not bytes)
      assert.same({}, search({ term = { ["d.keyword"] = string.rep("y", 257) } }))
      assert.same({ "3" }, search({ term = { ["d.keyword"] = string.rep("é", 256) } }))
      local _, b = jreq("POST", "/ia/_search", { size = 0, aggs = { k = { terms = { field = "k" } } } })
      assert.same({ { key = "ok", doc_count = 1 }, { key = "short", doc_count = 1 } }, b.aggregations.k.buckets)
      -- _source keeps everything
      _, b = jreq("GET", "/ia/_doc/2")
      assert.equal("toolong", b._source.k)
    end)
    it("dynamic_templates map new fields, as in ES", function()
      assert.equal(200, (jreq("PUT", "/dt", { mappings = { dynamic_templates = {
        { ids = { match = "*_id", mapping = { type = "keyword" } } },
        { longs_as_int = { match_mapping_type = "long", unmatch = "big_*", mapping = { type = "integer" } } },
        { meta = { path_match = "meta.*", match_mapping_type = "string", mapping = { type = "keyword", ignore_above = 3 } } },
        { strings = { match_mapping_type = "string", mapping = { type = "text", fields = { raw = { type = "keyword" } } } } },
      } } })))
      put_doc("dt", "1", { user_id = "Ab 1", n = 5, big_n = 7, title = "Hello World", meta = { src = "web", long = "abcdef" },
        ts = "2024-01-01T00:00:00Z" })
      local _, b = jreq("GET", "/dt/_mapping")
      local props = b.dt.mappings.properties
      assert.same({ type = "keyword" }, props.user_id)
      assert.same({ type = "integer" }, props.n)
      assert.same({ type = "long" }, props.big_n)
      assert.same({ type = "text", fields = { raw = { type = "keyword" } } }, props.title)
      assert.same({ type = "keyword", ignore_above = 3 }, props.meta.properties.src)
      assert.same({ type = "date" }, props.ts) -- a date-looking string is a date, not a "string"
      local function search(q) local _, r = jreq("POST", "/dt/_search", { query = q }) return ids(r) end
      assert.same({ "1" }, search({ term = { user_id = "Ab 1" } }))
      assert.same({ "1" }, search({ term = { ["title.raw"] = "Hello World" } }))
      assert.same({}, search({ term = { ["title.keyword"] = "Hello World" } }))
      assert.same({}, search({ term = { ["meta.long"] = "abcdef" } })) -- ignore_above 3 from the template
      assert.same({ "1" }, search({ term = { ["meta.src"] = "web" } }))
      -- the mapping applies to later documents: user_id is a keyword, n an integer
      local st = jreq("PUT", "/dt/_doc/2", { n = "x" })
      assert.equal(400, st)
    end)
    it("_search tells an empty array from an object in the body, as ES's parser does", function()
      jreq("PUT", "/sa")
      local cases = {
        -- SearchSourceBuilder.parseXContent's messages
        { "[]", "Expected [START_OBJECT] but found [START_ARRAY]" },
        { "[1]", "Expected [START_OBJECT] but found [START_ARRAY]" },
        { '{"query":[]}', "Unknown key for a START_ARRAY in [query]." },
        { '{"query":"x"}', "Unknown key for a VALUE_STRING in [query]." },
        { '{"aggs":[]}', "Unknown key for a START_ARRAY in [aggs]." },
        { '{"aggregations":5}', "Unknown key for a VALUE_NUMBER in [aggregations]." },
      }
      for _, c in ipairs(cases) do
        local st, b = jreq("POST", "/sa/_search", c[1], JSON)
        assert.equal(400, st, c[1])
        assert.same(es_error(400, "parsing_exception", c[2]), b, c[1])
      end
      -- an empty clause list is no clause
      put_doc("sa", "1", { a = 1 })
      local st, b = jreq("POST", "/sa/_search", '{"query":{"bool":{"must":[],"filter":[]}}}', JSON)
      assert.equal(200, st)
      assert.same({ "1" }, ids(b))
    end)
    it("maps a new number by its JSON text and refuses a new long out of range, as ES's parser does", function()
      -- 1.0 and 1e2 are floating point tokens (a float field), 7 and a big integer integer ones (long)
      local st = req("PUT", "/nt/_doc/1?refresh=true", '{"a":1.0,"b":1e2,"c":7,"o":[{"x":2.0},{"x":2.5}],"l":[3, 4]}')
      assert.equal(201, st)
      local _, b = jreq("GET", "/nt/_mapping")
      assert.same({ a = { type = "float" }, b = { type = "float" }, c = { type = "long" },
        o = { properties = { x = { type = "float" } } }, l = { type = "long" } }, b.nt.mappings.properties)
      -- a float field keeps fractions for queries (a long one would take 1.5 as 1)
      put_doc("nt", "2", { a = 1.5 })
      _, b = jreq("POST", "/nt/_search", { query = { range = { a = { gt = 1.2 } } } })
      assert.same({ "2" }, ids(b))
      -- a big integer maps a long, which cannot hold it: the first document fails as the next would
      local want = "[1:1] failed to parse field [n] of type [long] in document with id '3'. " ..
        "Preview of field's value: '99999999999999999999'"
      for _ = 1, 2 do
        st, _, b = req("PUT", "/nt/_doc/3", '{"n":99999999999999999999}')
        assert.equal(400, st)
        b = cjson.decode(b)
        assert.equal("document_parsing_exception", b.error.type)
        assert.equal(want, b.error.reason)
      end
      _, b = jreq("GET", "/nt/_mapping")
      assert.is_nil(b.nt.mappings.properties.n)
      assert.equal(404, (jreq("GET", "/nt/_doc/3")))
      -- a new field mapped by a template takes its value as the template's type parses it
      assert.equal(200, (jreq("PUT", "/ntt", { mappings = { dynamic_templates = {
        { s = { match = "s_*", mapping = { type = "integer" } } } } } })))
      st, b = jreq("PUT", "/ntt/_doc/1", { s_n = "x" })
      assert.equal(400, st)
      assert.equal("[1:1] failed to parse field [s_n] of type [integer] in document with id '1'. " ..
        "Preview of field's value: 'x'", b.error.reason)
      assert.equal(201, (jreq("PUT", "/ntt/_doc/2", { s_n = "12" })))
    end)
    it("refuses a field named \"\" in mappings and documents, as ES does", function()
      local msg = "field name cannot be an empty string"
      -- ObjectMapper.TypeParser's IllegalArgumentException, wrapped by MapperService
      local want = { error = { root_cause = { { type = "mapper_parsing_exception", reason = "Failed to parse mapping: " .. msg } },
        type = "mapper_parsing_exception", reason = "Failed to parse mapping: " .. msg,
        caused_by = { type = "illegal_argument_exception", reason = msg } }, status = 400 }
      local st, b = jreq("PUT", "/en", { mappings = { properties = { [""] = { type = "keyword" } } } })
      assert.equal(400, st)
      assert.same(want, b)
      assert.equal(404, (req("HEAD", "/en")))
      st, b = jreq("PUT", "/en", { mappings = { properties = { o = { properties = { [""] = { type = "long" } } } } } })
      assert.same(want, b)
      assert.equal(200, (jreq("PUT", "/en", { mappings = { properties = { off = { type = "object", enabled = false },
        quiet = { type = "object", dynamic = false } } } })))
      st, b = jreq("PUT", "/en/_mapping", { properties = { [""] = { type = "long" } } })
      assert.equal(400, st)
      assert.same(want, b)
      -- the document parser's: a document_parsing_exception, nothing indexed nor mapped
      local doc_err = es_error(400, "document_parsing_exception", "[1:1] failed to parse: " .. msg)
      doc_err.error.caused_by = { type = "illegal_argument_exception", reason = msg }
      for _, doc in ipairs({ { [""] = 1 }, { a = { b = { [""] = "x" } } }, { l = { 1, { [""] = 2 } } } }) do
        st, b = jreq("PUT", "/en/_doc/1", doc)
        assert.equal(400, st, cjson.encode(doc))
        assert.same(doc_err, b)
      end
      assert.equal(404, (jreq("GET", "/en/_doc/1")))
      _, b = jreq("GET", "/en/_mapping")
      assert.is_nil(b.en.mappings.properties.a)
      -- ES skips what a disabled object, or an unmapped object under "dynamic": false, holds unread
      put_doc("en", "2", { off = { [""] = 1 }, quiet = { o = { [""] = 1 } } })
    end)
    it("reads a dotted field name in a document as an object path, as ES's parser expands it", function()
      -- {"a.b": 1} is {"a": {"b": 1}}: a is an object, a.b a long; _source stays as sent
      local doc = '{"a.b":1,"c":{"d.e":"x"},"p.q.r":[{"s.t":true}]}'
      assert.equal(201, (req("PUT", "/dot/_doc/1?refresh=true", doc, JSON)))
      local _, b = jreq("GET", "/dot/_mapping")
      local props = b.dot.mappings.properties
      assert.same({ properties = { b = { type = "long" } } }, props.a)
      assert.equal("text", props.c.properties.d.properties.e.type)
      assert.same({ t = { type = "boolean" } }, props.p.properties.q.properties.r.properties.s.properties)
      local _, _, body = req("GET", "/dot/_source/1")
      assert.equal(doc, body)
      for _, q in ipairs({ { term = { ["a.b"] = 1 } }, { term = { ["p.q.r.s.t"] = true } }, { match = { ["c.d.e"] = "x" } },
          { exists = { field = "a" } }, { exists = { field = "c.d" } }, { exists = { field = "p.q" } } }) do
        _, b = jreq("POST", "/dot/_search", { query = q })
        assert.same({ "1" }, ids(b), cjson.encode(q))
      end
      -- the expanded object meets the mapping: a strict root refuses the new object a, a keyword
      -- field refuses the object c.d would hold
      assert.equal(200, (jreq("PUT", "/dots", { mappings = { dynamic = "strict", properties = {
        c = { properties = { d = { type = "keyword" } } } } } })))
      local st
      st, b = jreq("PUT", "/dots/_doc/1", '{"a.b":1}')
      assert.equal(400, st)
      assert.same(es_error(400, "strict_dynamic_mapping_exception",
        "[1:1] mapping set to strict, dynamic introduction of [a] within [_doc] is not allowed"), b)
      st, b = jreq("PUT", "/dots/_doc/1", '{"c.d.e":"x"}')
      assert.equal(400, st)
      assert.equal("[1:1] failed to parse field [c.d] of type [keyword] in document with id '1'. Preview of field's value: '{...}'",
        b.error.reason)
      -- names DotExpandingXContentParser cannot split (an IllegalArgumentException)
      for _, c in ipairs({ { ".foo", "field name cannot contain only whitespace: ['.foo']" },
          { "a..b", "field name cannot contain only whitespace: ['a..b']" },
          { "a. ", "field name starting or ending with a [.] makes object resolution ambiguous: [a. ]" },
          { "..", "field name cannot contain only dots" } }) do
        st, b = jreq("PUT", "/dot/_doc/2", cjson.encode({ [c[1]] = 1 }))
        assert.equal(400, st, c[1])
        local want = es_error(400, "document_parsing_exception", "[1:1] failed to parse: " .. c[2])
        want.error.caused_by = { type = "illegal_argument_exception", reason = c[2] }
        assert.same(want, b)
      end
    end)
    it("reads a dotted field name in mappings as an object path, as ES's mapping parser does", function()
      assert.equal(200, (jreq("PUT", "/dotm", { mappings = { properties = { ["a.b"] = { type = "long" },
        a = { properties = { c = { type = "keyword" } } }, ["x.y.z"] = { type = "keyword" } } } })))
      local _, b = jreq("GET", "/dotm/_mapping")
      assert.same({ a = { properties = { b = { type = "long" }, c = { type = "keyword" } } },
        x = { properties = { y = { properties = { z = { type = "keyword" } } } } } }, b.dotm.mappings.properties)
      put_doc("dotm", "1", { x = { y = { z = "k" } }, a = { b = 1 } })
      for _, q in ipairs({ { exists = { field = "x.y" } }, { term = { ["x.y.z"] = "k" } }, { term = { ["a.b"] = 1 } } }) do
        _, b = jreq("POST", "/dotm/_search", { query = q })
        assert.same({ "1" }, ids(b), cjson.encode(q))
      end
    end)
    it("PUT _mapping reads a dotted field name as an object path: a conflict is ES's 400", function()
      assert.equal(200, (jreq("PUT", "/dotu", { mappings = { properties = { a = { properties = { c = { type = "keyword" } } } } } })))
      assert.equal(200, (jreq("PUT", "/dotu/_mapping", { properties = { ["a.d"] = { type = "long" } } })))
      local st, b = jreq("PUT", "/dotu/_mapping", { properties = { ["a.c"] = { type = "long" } } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "mapper [a.c] cannot be changed from type [keyword] to [long]"), b)
      _, b = jreq("GET", "/dotu/_mapping")
      assert.same({ a = { properties = { c = { type = "keyword" }, d = { type = "long" } } } }, b.dotu.mappings.properties)
    end)
    it("refuses a blank field name in mappings and documents, as ES does", function()
      -- ObjectMapper.TypeParser (indices created on 8.6+): an IllegalArgumentException, wrapped
      local msg = "field name cannot contain only whitespaces"
      local want = { error = { root_cause = { { type = "mapper_parsing_exception", reason = "Failed to parse mapping: " .. msg } },
        type = "mapper_parsing_exception", reason = "Failed to parse mapping: " .. msg,
        caused_by = { type = "illegal_argument_exception", reason = msg } }, status = 400 }
      for _, props in ipairs({ { ["  "] = { type = "keyword" } }, { o = { properties = { ["\t"] = { type = "long" } } } },
        { ["\227\128\128"] = { type = "long" } } }) do   -- U+3000, a Unicode space separator
        local st, b = jreq("PUT", "/bn", { mappings = { properties = props } })
        assert.equal(400, st)
        assert.same(want, b)
      end
      assert.equal(404, (req("HEAD", "/bn")))
      assert.equal(200, (jreq("PUT", "/bn", { mappings = { properties = { off = { type = "object", enabled = false } } } })))
      local st, b = jreq("PUT", "/bn/_mapping", { properties = { [" "] = { type = "long" } } })
      assert.equal(400, st)
      assert.same(want, b)
      -- DocumentParser.innerParseObject: a document_parsing_exception naming the field's path
      for _, c in ipairs({ { '{"  ":1}', "  " }, { '{"a":{"b":{"\\t":"x"}}}', "a.b.\t" },
        { '{"l":[1,{" ":2}]}', "l. " } }) do
        st, b = jreq("PUT", "/bn/_doc/1", c[1])
        assert.equal(400, st, c[1])
        assert.same(es_error(400, "document_parsing_exception", "[1:1] Field name cannot contain only whitespace: [" .. c[2] .. "]"), b)
      end
      assert.equal(404, (jreq("GET", "/bn/_doc/1")))
      _, b = jreq("GET", "/bn/_mapping")
      assert.is_nil(b.bn.mappings.properties.a)
      -- a no-break space is no whitespace to Java, and a disabled object is skipped unread
      put_doc("bn", "2", { ["\194\160"] = 1, off = { [" "] = 1 } })
    end)
    it("maps a new field from an array's first value and parses the later ones with it, as ES does", function()
      -- [1, "x"]: the first value maps a long, whose parser then fails on "x"; nothing is
      -- indexed or mapped
      local st, b = jreq("PUT", "/mix/_doc/1", '{"a":[1,"x"]}')
      assert.equal(400, st)
      local want = es_error(400, "document_parsing_exception",
        "[1:1] failed to parse field [a] of type [long] in document with id '1'. Preview of field's value: 'x'")
      want.error.caused_by = { type = "illegal_argument_exception", reason = 'For input string: "x"' }
      assert.same(want, b)
      st, b = jreq("PUT", "/mix/_doc/1", '{"o":[{"t":"2024-01-02"},{"t":"nope"}]}')
      assert.equal(400, st)
      assert.equal("[1:1] failed to parse field [o.t] of type [date] in document with id '1'. Preview of field's value: 'nope'",
        b.error.reason)
      assert.equal(404, (jreq("GET", "/mix/_doc/1")))
      _, b = jreq("GET", "/mix/_mapping")
      assert.same({}, b.mix.mappings)
      -- what the first value's mapper reads is taken: ["x", 1] is text, [1, 2.5, "3"] a long
      put_doc("mix", "2", cjson.decode('{"s":["x",1],"n":[1,2.5,"3"]}'))
      _, b = jreq("GET", "/mix/_mapping")
      assert.equal("text", b.mix.mappings.properties.s.type)
      assert.equal("long", b.mix.mappings.properties.n.type)
    end)
    it("refuses a document whose array gives a new field both a value and an object, as ES does", function()
      -- ES maps each element on its own and cannot merge a long (or text) mapper with an
      -- object one into the mapping update: 400 illegal_argument_exception, nothing mapped
      local st, b = jreq("PUT", "/mix/_doc/1", { l = { 1, { q = 1 } } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "mapper [l] cannot be changed from type [long] to [object]"), b)
      st, b = jreq("PUT", "/mix/_doc/1", { o = { a = { { q = 1 }, "x" } } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "can't merge a non object mapping [o.a] with an object mapping"), b)
      assert.equal(404, (jreq("GET", "/mix/_doc/1")))
      _, b = jreq("GET", "/mix/_mapping")
      assert.same({}, b.mix.mappings)
      -- in _bulk the item fails on its own
      st, b = jreq("POST", "/_bulk", '{"index":{"_index":"mix","_id":"2"}}\n{"l":[{"q":1},2]}\n' ..
        '{"index":{"_index":"mix","_id":"3"}}\n{"l":[{"q":1},{"r":2}],"n":[1,2,null]}\n', NDJSON)
      assert.equal(200, st)
      assert.equal(400, b.items[1].index.status)
      assert.same({ type = "illegal_argument_exception", reason = "can't merge a non object mapping [l] with an object mapping" },
        b.items[1].index.error)
      assert.equal(201, b.items[2].index.status)
      -- once mapped, a value where the object is (or the reverse) is the parse error ES gives
      st, b = jreq("PUT", "/mix/_doc/4", { l = { 1, { q = 1 } } })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
    end)
    it("returns document_parsing_exception when new fields exceed index.mapping.total_fields.limit", function()
      local function limit_error(msg)
        local e = es_error(400, "document_parsing_exception", "[1:1] failed to parse: " .. msg)
        e.error.caused_by = { type = "illegal_argument_exception", reason = msg }
        return e
      end
      assert.equal(200, (jreq("PUT", "/tf", { settings = { index = { mapping = { total_fields = { limit = 5 } } } } })))
      put_doc("tf", "1", { a = "x", b = "y" })            -- a, a.keyword, b, b.keyword
      local st, b = jreq("PUT", "/tf/_doc/2", { c = "x" }) -- c and c.keyword: 6 > 5
      assert.equal(400, st)
      assert.same(limit_error("Limit of total fields [5] has been exceeded while adding new fields [2]"), b)
      assert.equal(404, (jreq("GET", "/tf/_doc/2")))
      _, b = jreq("GET", "/tf/_mapping")
      assert.is_nil(b.tf.mappings.properties.c)
      put_doc("tf", "3", { c = 5 })                       -- a long is one field: 5
      put_doc("tf", "4", { a = "more", c = 6 })           -- nothing new
      -- in _bulk each item is refused on its own
      st, b = jreq("POST", "/_bulk", '{"index":{"_index":"tf","_id":"5"}}\n{"d":1}\n{"index":{"_index":"tf","_id":"6"}}\n{"a":"y"}\n', NDJSON)
      assert.equal(200, st)
      assert.is_true(b.errors)
      assert.equal(400, b.items[1].index.status)
      local item_error = limit_error("Limit of total fields [5] has been exceeded while adding new fields [1]").error
      item_error.root_cause = nil
      assert.same(item_error, b.items[1].index.error)
      assert.equal(201, b.items[2].index.status)
      -- the default 1000: 600 dynamic strings under an object are 1 + 1200 fields
      local attrs = {}
      for i = 1, 600 do attrs[("k%03d"):format(i)] = "yes" end
      st, b = jreq("PUT", "/tfd/_doc/1", { attributes = attrs })
      assert.equal(400, st)
      assert.same(limit_error("Limit of total fields [1000] has been exceeded while adding new fields [1001]"), b)
      -- explicit mappings over the limit fail the index creation
      st, b = jreq("PUT", "/tfx", { settings = { ["index.mapping.total_fields.limit"] = 1 },
        mappings = { properties = { a = { type = "long" }, b = { type = "long" } } } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "Limit of total fields [1] has been exceeded"), b)
      st, b = jreq("PUT", "/tfx", { settings = { ["index.mapping.total_fields.limit"] = "x" } })
      assert.equal(400, st)
      assert.equal("Failed to parse value [x] for setting [index.mapping.total_fields.limit]", b.error.reason)
    end)
    it("returns document_parsing_exception when a new object exceeds index.mapping.depth.limit", function()
      local function nest(n)
        local d = 1
        for _ = 1, n do d = { a = d } end
        return d
      end
      put_doc("dl", "1", nest(20))                        -- 19 objects: depth 20
      local st, b = jreq("PUT", "/dl1/_doc/1", nest(21))  -- the 20th object is at depth 21
      assert.equal(400, st)
      local path = ("a."):rep(19) .. "a"
      local msg = "Limit of mapping depth [20] has been exceeded due to object field [" .. path .. "]"
      local want = es_error(400, "document_parsing_exception", "[1:1] failed to parse: " .. msg)
      want.error.caused_by = { type = "illegal_argument_exception", reason = msg }
      assert.same(want, b)
      assert.equal(200, (jreq("PUT", "/dl2", { settings = { ["index.mapping.depth.limit"] = 2 } })))
      put_doc("dl2", "1", { x = { y = 1 } })
      st, b = jreq("PUT", "/dl2/_doc/2", { x = { z = { w = 1 } } })
      assert.equal(400, st)
      assert.equal("Limit of mapping depth [2] has been exceeded due to object field [x.z]", b.error.caused_by.reason)
      st, b = jreq("PUT", "/dl3", { settings = { ["index.mapping.depth.limit"] = 2 },
        mappings = { properties = { x = { properties = { y = { properties = { z = { type = "long" } } } } } } } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "Limit of mapping depth [2] has been exceeded due to object field [x.y]"), b)
    end)
    it("returns illegal_argument_exception for explicit mappings over index.mapping.nested_fields.limit", function()
      local props = {}
      for i = 1, 51 do props["n" .. i] = { type = "nested" } end
      local st, b = jreq("PUT", "/nl", { mappings = { properties = props } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "Limit of nested fields [50] has been exceeded"), b)
      props.n51 = nil
      assert.equal(200, (jreq("PUT", "/nl", { mappings = { properties = props } })))
      st, b = jreq("PUT", "/nl2", { settings = { ["index.mapping.nested_fields.limit"] = 1 },
        mappings = { properties = { a = { type = "nested" }, b = { type = "nested" } } } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "Limit of nested fields [1] has been exceeded"), b)
    end)
    it("refuses a value where an object is mapped, as ES's document parser does", function()
      put_doc("ov", "1", { a = { b = 1 } })
      local msg = "[1:1] object mapping for [a] tried to parse field [a] as object, but found a concrete value"
      for _, doc in ipairs({ '{"a":5}', '{"a":"x"}', '{"a":[1]}', '{"a":true}' }) do
        local st, b = jreq("PUT", "/ov/_doc/2", doc, JSON)
        assert.equal(400, st, doc)
        assert.same(es_error(400, "document_parsing_exception", msg), b, doc)
      end
      assert.equal(201, (req("PUT", "/ov/_doc/3", '{"a":null}', JSON)))
      -- explicit objects and nested ones too, in _bulk as well; not an "enabled": false object
      assert.equal(200, (jreq("PUT", "/ov2", { mappings = { properties = {
        o = { properties = { x = { type = "keyword" } } }, n = { type = "nested" }, off = { type = "object", enabled = false } } } })))
      local _, b = jreq("POST", "/_bulk?refresh=true", '{"index":{"_index":"ov2","_id":"1"}}\n{"o":{"x":{"y":1}}}\n' ..
        '{"index":{"_index":"ov2","_id":"2"}}\n{"n":"v"}\n{"index":{"_index":"ov2","_id":"3"}}\n{"off":"anything"}\n', NDJSON)
      assert.equal("document_parsing_exception", b.items[1].index.error.type)
      assert.equal("[1:1] object mapping for [n] tried to parse field [n] as object, but found a concrete value",
        b.items[2].index.error.reason)
      assert.equal(201, b.items[3].index.status)
      -- arrays of arrays are flattened, as in ES: [[], 1] holds one long, not an object
      assert.equal(201, (req("PUT", "/ov3/_doc/1", '{"l":[[],[1,[2]]]}', JSON)))
      _, b = jreq("GET", "/ov3/_mapping")
      assert.same({ type = "long" }, b.ov3.mappings.properties.l)
    end)
    it("refuses numbers out of an integer type's range, as ES does", function()
      assert.equal(200, (jreq("PUT", "/rng", { mappings = { properties = { b = { type = "byte" }, s = { type = "short" },
        i = { type = "integer" }, l = { type = "long" }, u = { type = "unsigned_long" } } } })))
      for _, c in ipairs({ { "b", 128 }, { "b", -129 }, { "s", 32768 }, { "i", 2147483648 }, { "i", "30000000000" },
        { "l", 1e19 }, { "u", -1 } }) do
        local st, b = jreq("PUT", "/rng/_doc/1", { [c[1]] = c[2] })
        assert.equal(400, st, c[1] .. " " .. tostring(c[2]))
        assert.equal("document_parsing_exception", b.error.type)
      end
      for _, c in ipairs({ { "b", 127 }, { "b", -128 }, { "b", 127.9 }, { "s", 32767 }, { "i", -2147483648 },
        { "l", 9007199254740992 }, { "u", 1e19 } }) do
        local st = jreq("PUT", "/rng/_doc/1", { [c[1]] = c[2] })
        assert.is_true(st == 200 or st == 201, c[1] .. " " .. tostring(c[2]))
      end
    end)
    it("a string that is no number (or boolean) gives ES's caused_by: the long parser's, Double.parseDouble's", function()
      assert.equal(200, (jreq("PUT", "/nfe", { mappings = { properties = { l = { type = "long" }, i = { type = "integer" },
        b = { type = "byte" }, d = { type = "double" }, f = { type = "float" } } } })))
      -- Numbers.toLong: an IllegalArgumentException; XContentParser's int / double readers:
      -- Double.parseDouble's NumberFormatException (on the trimmed string), then the range check
      for _, c in ipairs({
        { "l", "abc", "illegal_argument_exception", 'For input string: "abc"' },
        { "l", "0x10", "illegal_argument_exception", 'For input string: "0x10"' },
        { "l", "1e30", "illegal_argument_exception", "Value [1e30] is out of range for a long" },
        { "i", "abc", "number_format_exception", 'For input string: "abc"' },
        { "i", "1e20", "illegal_argument_exception", "Value [1e20] is out of range for an integer" },
        { "b", "300", "illegal_argument_exception", "Value [300] is out of range for a byte" },
        { "d", " x1 ", "number_format_exception", 'For input string: "x1"' },
        { "d", "  ", "number_format_exception", "empty String" },
        { "f", "1,5", "number_format_exception", 'For input string: "1,5"' } }) do
        local st, b = jreq("PUT", "/nfe/_doc/1", { [c[1]] = c[2] })
        assert.equal(400, st, c[1] .. " " .. c[2])
        local ty = ({ l = "long", i = "integer", b = "byte", d = "double", f = "float" })[c[1]]
        local want = es_error(400, "document_parsing_exception", "[1:1] failed to parse field [" .. c[1] .. "] of type [" ..
          ty .. "] in document with id '1'. Preview of field's value: '" .. c[2] .. "'")
        want.error.caused_by = { type = c[3], reason = c[4] }
        assert.same(want, b)
      end
      -- a boolean field's string: Booleans.parseBoolean's IllegalArgumentException
      assert.equal(200, (jreq("PUT", "/nfe/_mapping", { properties = { t = { type = "boolean" } } })))
      local st, b = jreq("PUT", "/nfe/_doc/1", { t = "yes" })
      assert.equal(400, st)
      local want = es_error(400, "document_parsing_exception",
        "[1:1] failed to parse field [t] of type [boolean] in document with id '1'. Preview of field's value: 'yes'")
      want.error.caused_by = { type = "illegal_argument_exception", reason = "Failed to parse value [yes] as only [true] or [false] are allowed." }
      assert.same(want, b)
      assert.equal(404, (jreq("GET", "/nfe/_doc/1")))
      for i, d in ipairs({ { l = "12" }, { l = "-1.5e3" }, { i = " 42 " }, { d = "1.5" }, { f = ".5" } }) do
        assert.equal(201, (jreq("PUT", "/nfe/_doc/" .. i, d)), cjson.encode(d))
      end
    end)
    it("a number field reads \"\" as a null unless coerce is false, as ES's NumberFieldMapper does", function()
      assert.equal(200, (jreq("PUT", "/nes", { mappings = { properties = { n = { type = "long" },
        m = { type = "integer", null_value = 7 }, d = { type = "double" }, s = { type = "long", coerce = false } } } })))
      assert.equal(201, (jreq("PUT", "/nes/_doc/1?refresh=true", { n = "", m = "", d = { "", 1.5 } })))
      put_doc("nes", "2", { n = 5 })
      local _, b = jreq("GET", "/nes/_doc/1")
      assert.same({ n = "", m = "", d = { "", 1.5 } }, b._source)
      -- no value for n (exists, value_count), m indexes its null_value
      _, b = jreq("POST", "/nes/_search", { query = { exists = { field = "n" } } })
      assert.same({ "2" }, ids(b))
      _, b = jreq("POST", "/nes/_search", { query = { term = { m = 7 } } })
      assert.same({ "1" }, ids(b))
      _, b = jreq("POST", "/nes/_search", { size = 0, aggs = { c = { value_count = { field = "n" } },
        dc = { value_count = { field = "d" } } } })
      assert.equal(1, b.aggregations.c.value)
      assert.equal(1, b.aggregations.dc.value)
      -- coerce false: XContentParser refuses the string
      local st
      st, b = jreq("PUT", "/nes/_doc/3", { s = "" })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
    end)
    it("returns document_parsing_exception for a value an ip or date_nanos field cannot hold", function()
      assert.equal(200, (jreq("PUT", "/ipx", { mappings = { properties = { ip = { type = "ip" }, dn = { type = "date_nanos" },
        ipm = { type = "ip", ignore_malformed = true } } } })))
      local st, b = jreq("PUT", "/ipx/_doc/1", { ip = "x" })
      assert.equal(400, st)
      local reason = "[1:1] failed to parse field [ip] of type [ip] in document with id '1'. Preview of field's value: 'x'"
      local want = es_error(400, "document_parsing_exception", reason)
      want.error.caused_by = { type = "illegal_argument_exception", reason = "'x' is not an IP string literal." }
      assert.same(want, b)
      for _, v in ipairs({ "1.2.3", "01.2.3.4", "256.0.0.1", "1::2::3", "1:2:3:4:5:6:7", "10.0.0.0/8", 5, true }) do
        st, b = jreq("PUT", "/ipx/_doc/1", { ip = v })
        assert.equal(400, st, tostring(v))
        assert.equal("document_parsing_exception", b.error.type)
      end
      for _, v in ipairs({ "1969-12-31T23:59:59Z", "2262-04-12T00:00:00Z", "not a date" }) do
        st, b = jreq("PUT", "/ipx/_doc/1", { dn = v })
        assert.equal(400, st, v)
        assert.equal("failed to parse field [dn] of type [date_nanos] in document with id '1'. Preview of field's value: '" .. v .. "'",
          b.error.reason:gsub("^%[1:1%] ", ""))
      end
      assert.equal(404, (jreq("GET", "/ipx/_doc/1")))
      for i, d in ipairs({ { ip = "192.168.0.1" }, { ip = "::1" }, { ip = "2001:db8::ff00:42:8329" }, { ip = "::ffff:10.0.0.1" },
        { ip = { "10.0.0.1", "fe80::1%eth0" } }, { dn = "2024-01-01T00:00:00.123456789Z" }, { dn = 1704067200000 },
        { ipm = "x" } }) do
        st = jreq("PUT", "/ipx/_doc/" .. i, d)
        assert.equal(201, st, cjson.encode(d))
      end
    end)
    it("honours the index, doc_values, fielddata and coerce mapping parameters, as ES does", function()
      assert.equal(200, (jreq("PUT", "/mp", { mappings = { properties = {
        k = { type = "keyword", index = false }, kn = { type = "keyword", index = false, doc_values = false },
        kd = { type = "keyword", doc_values = false }, t = { type = "text", index = false },
        tf = { type = "text", fielddata = true }, n = { type = "long", coerce = false },
        ni = { type = "integer", coerce = false }, nm = { type = "long", coerce = false, ignore_malformed = true },
        ks = { type = "keyword", index = false, doc_values = false, store = true },
        nn = { type = "long", index = false, doc_values = false } } } })))
      put_doc("mp", "1", { k = "a", kn = "b", kd = "c", t = "hello world", tf = "Quick brown fox", n = 5, ni = 3,
        ks = "d", nn = 7 })
      local function shard_failure(index, reason)
        local st, b = jreq("POST", "/mp/_search", index)
        assert.equal(400, st, cjson.encode(index))
        assert.equal("search_phase_execution_exception", b.error.type)
        assert.same({ { type = "illegal_argument_exception", reason = reason } }, b.error.root_cause)
      end
      local function unsearchable(query, field)
        local _, b = jreq("POST", "/mp/_search", { query = query })
        query_shard_failure(b, "mp", "illegal_argument_exception",
          "Cannot search on field [" .. field .. "] since it is not indexed nor has doc values.")
      end
      -- index: false leaves keyword (and numeric, date, ...) fields searchable through doc values
      local st, b = jreq("POST", "/mp/_search", { query = { term = { k = "a" } } })
      assert.equal(200, st)
      assert.same({ "1" }, ids(b))
      unsearchable({ term = { kn = "b" } }, "kn")
      unsearchable({ match = { t = "hello" } }, "t")
      -- exists reads doc values, else _field_names, which records such a field only when it is
      -- stored: ES finds no document for the others (no error)
      for f, want in pairs({ k = { "1" }, kd = { "1" }, kn = {}, t = {}, nn = {}, ks = { "1" } }) do
        st, b = jreq("POST", "/mp/_search", { query = { exists = { field = f } } })
        assert.equal(200, st, f)
        assert.same(want, ids(b), f)
      end
      -- doc_values: false: searchable, but no sorting or aggregations
      _, b = jreq("POST", "/mp/_search", { query = { term = { kd = "c" } } })
      assert.same({ "1" }, ids(b))
      local no_fd = "Can't load fielddata on [kd] because fielddata is unsupported on fields of type [keyword]. Use doc values instead."
      shard_failure({ sort = { "kd" } }, no_fd)
      shard_failure({ size = 0, aggs = { a = { terms = { field = "kd" } } } }, no_fd)
      -- fielddata: true: a text field sorts and aggregates on its tokens
      _, b = jreq("POST", "/mp/_search", { size = 0, aggs = { a = { terms = { field = "tf" } } } })
      assert.same({ { key = "brown", doc_count = 1 }, { key = "fox", doc_count = 1 }, { key = "quick", doc_count = 1 } },
        b.aggregations.a.buckets)
      _, b = jreq("POST", "/mp/_search", { sort = { { tf = "desc" } } })
      assert.same({ "quick" }, b.hits.hits[1].sort)
      -- coerce: false refuses a string and a fraction for a number
      local function refused(doc, field, ty, preview, cause)
        st, b = jreq("PUT", "/mp/_doc/2", doc)
        assert.equal(400, st)
        local want = es_error(400, "document_parsing_exception", ("[1:1] failed to parse field [%s] of type [%s] in document " ..
          "with id '2'. Preview of field's value: '%s'"):format(field, ty, preview))
        want.error.caused_by = { type = "illegal_argument_exception", reason = cause }
        assert.same(want, b)
      end
      refused({ n = "5" }, "n", "long", "5", "Long value passed as String")
      -- (checkCoerceString comes first: a string that is no number, or "", is refused the same way)
      refused({ n = "abc" }, "n", "long", "abc", "Long value passed as String")
      refused({ n = "" }, "n", "long", "", "Long value passed as String")
      refused({ ni = 5.5 }, "ni", "integer", "5.5", "5.5 cannot be converted to Integer without data loss")
      assert.equal(201, (jreq("PUT", "/mp/_doc/3", { nm = "5" })))   -- ignore_malformed keeps it in _source only
      assert.equal(200, (jreq("PUT", "/mpc", { settings = { index = { mapping = { coerce = false } } },
        mappings = { properties = { n = { type = "long" }, m = { type = "long", coerce = true } } } })))
      st = jreq("PUT", "/mpc/_doc/1", { n = "5" })
      assert.equal(400, st)
      assert.equal(201, (jreq("PUT", "/mpc/_doc/2", { m = "5" })))
    end)
    it("queries, sorts and aggregates date_nanos fields as instants, as ES does", function()
      assert.equal(200, (jreq("PUT", "/dn", { mappings = { properties = { d = { type = "date_nanos" } } } })))
      put_doc("dn", "1", { d = "2024-01-01T10:00:00+02:00" })   -- 08:00Z
      put_doc("dn", "2", { d = 1704100000000 })                 -- 09:06:40Z
      put_doc("dn", "3", { d = "2024-01-01T07:30:00.5Z" })
      local _, b = jreq("POST", "/dn/_search", { query = { range = { d = { gte = "2024-01-01T08:00:00Z", lte = "1704096000000" } } } })
      assert.same({ "1" }, ids(b))
      -- a number among the bounds makes ES parse both as epoch_millis
      _, b = jreq("POST", "/dn/_search", { query = { range = { d = { gte = "2024-01-01T08:00:00Z", lte = 1704096000000 } } } })
      query_shard_failure(b, "dn", "parse_exception", "failed to parse date field [2024-01-01T08:00:00Z] with format [epoch_millis]")
      _, b = jreq("POST", "/dn/_search", { query = { term = { d = "2024-01-01T08:00:00Z" } } })
      assert.same({ "1" }, ids(b))
      -- sort values are nanoseconds since the epoch
      local st, _, body = req("POST", "/dn/_search", { sort = { { d = "desc" } }, _source = false })
      assert.equal(200, st)
      assert.truthy(body:find('"sort":[1704100000000000000]', 1, true), body)
      assert.truthy(body:find('"sort":[1704096000000000000]', 1, true), body)
      _, b = jreq("POST", "/dn/_search", { size = 0, aggs = { m = { min = { field = "d" } } } })
      assert.equal("2024-01-01T07:30:00.500Z", b.aggregations.m.value_as_string)
      st, b = jreq("POST", "/dn/_search", { query = { term = { d = "x" } } })
      assert.equal(400, st)
      query_shard_failure(b, "dn", "parse_exception",
        "failed to parse date field [x] with format [strict_date_optional_time_nanos||epoch_millis]")
    end)
    it("term, terms and range on an ip field compare addresses (CIDR included), as ES does", function()
      assert.equal(200, (jreq("PUT", "/ipq", { mappings = { properties = { ip = { type = "ip" } } } })))
      put_doc("ipq", "1", { ip = "10.1.2.3" })
      put_doc("ipq", "2", { ip = "192.168.200.1" })
      put_doc("ipq", "3", { ip = "2001:DB8::1" })
      local function hits(q)
        local st, b = jreq("POST", "/ipq/_search", { query = q })
        assert.equal(200, st, cjson.encode(q))
        local out = ids(b)
        table.sort(out)
        return out
      end
      assert.same({ "1" }, hits({ term = { ip = "::ffff:10.1.2.3" } }))
      assert.same({ "3" }, hits({ term = { ip = "2001:db8:0:0:0:0:0:1" } }))
      assert.same({ "1" }, hits({ term = { ip = "10.0.0.0/8" } }))
      assert.same({ "2" }, hits({ term = { ip = "192.168.128.0/17" } }))
      assert.same({ "3" }, hits({ terms = { ip = { "2001:db8::/32", "11.0.0.0/8" } } }))
      assert.same({ "1", "2" }, hits({ range = { ip = { gte = "10.0.0.0", lt = "192.168.255.255" } } }))
      assert.same({ "2" }, hits({ range = { ip = { gt = "10.1.2.3", lte = "255.255.255.255" } } }))
      local st, b = jreq("POST", "/ipq/_search", { query = { term = { ip = "x" } } })
      assert.equal(400, st)
      query_shard_failure(b, "ipq", "illegal_argument_exception", "'x' is not an IP string literal.")
      st, b = jreq("POST", "/ipq/_search", { query = { term = { ip = "10.0.0.0/33" } } })
      assert.equal(400, st)
      query_shard_failure(b, "ipq", "illegal_argument_exception",
        "Illegal prefix length [33] in [10.0.0.0/33]. Must be 0-32 for IPv4 ranges, 0-128 for IPv6 ranges")
    end)
    it("terms and sort on an ip field: one bucket per address, keyed by its canonical form, in byte order", function()
      -- ES's doc values hold an address's 16 bytes and DocValueFormat.IP prints them with
      -- NetworkAddress.format (RFC 5952; an IPv4-mapped address as a dotted quad)
      assert.equal(200, (jreq("PUT", "/ipa", { mappings = { properties = { ip = { type = "ip" } } } })))
      for i, ip in ipairs({ "::1", "0:0:0:0:0:0:0:1", "2001:DB8:0:0:1::1", "::ffff:10.0.0.1", "10.0.0.1", "10.0.0.2" }) do
        put_doc("ipa", tostring(i), { ip = ip }, false)
      end
      assert.equal(200, (req("POST", "/ipa/_refresh")))
      local st, b = jreq("POST", "/ipa/_search", { size = 0, aggs = { t = { terms = { field = "ip" } },
        k = { terms = { field = "ip", order = { _key = "asc" } } }, c = { cardinality = { field = "ip" } } } })
      assert.equal(200, st)
      assert.same({ { key = "::1", doc_count = 2 }, { key = "10.0.0.1", doc_count = 2 },
        { key = "10.0.0.2", doc_count = 1 }, { key = "2001:db8::1:0:0:1", doc_count = 1 } }, b.aggregations.t.buckets)
      assert.same({ "::1", "10.0.0.1", "10.0.0.2", "2001:db8::1:0:0:1" },
        { b.aggregations.k.buckets[1].key, b.aggregations.k.buckets[2].key, b.aggregations.k.buckets[3].key,
          b.aggregations.k.buckets[4].key })
      assert.same({ value = 4 }, b.aggregations.c)
      -- sorting too: by the bytes, sort values printed canonically
      st, b = jreq("POST", "/ipa/_search", { sort = { { ip = "asc" }, { _doc = "asc" } }, _source = false })
      assert.equal(200, st)
      local sv = {}
      for _, h in ipairs(b.hits.hits) do sv[#sv + 1] = h.sort[1] end
      assert.same({ "::1", "::1", "10.0.0.1", "10.0.0.1", "10.0.0.2", "2001:db8::1:0:0:1" }, sv)
    end)
    it("filter_path keeps empty arrays as arrays", function()
      jreq("PUT", "/fpe")
      local _, _, body = req("GET", "/fpe/_search?filter_path=-took")
      assert.matches('"hits":[]', body, 1, true)
      _, _, body = req("GET", "/fpe/_search?filter_path=hits.hits")
      assert.equal('{"hits":{"hits":[]}}', body)
      -- a path below an empty array matches nothing in it
      _, _, body = req("GET", "/fpe/_search?filter_path=hits.hits._id")
      assert.equal("{}", body)
    end)
    it("filter_path keeps numbers exactly as the response has them", function()
      jreq("PUT", "/fpn", { mappings = { properties = { n = { type = "long" }, f = { type = "double" } } } })
      req("POST", "/_bulk?refresh=true", '{"index":{"_index":"fpn","_id":"1"}}\n{"b":9007199254740993,"f":1.0,"n":9007199254740991,"s":"-12 e5"}\n' ..
        '{"index":{"_index":"fpn","_id":"2"}}\n{"x":1}\n', NDJSON)
      local _, _, body = req("GET", "/fpn/_search?sort=n:asc&filter_path=hits.hits.sort,hits.hits._source")
      assert.equal('{"hits":{"hits":[{"_source":{"b":9007199254740993,"f":1.0,"n":9007199254740991,"s":"-12 e5"},"sort":[9007199254740991]},' ..
        '{"_source":{"x":1},"sort":[9223372036854775807]}]}}', body)
      _, _, body = req("GET", "/fpn/_search?sort=n:desc&filter_path=hits.hits.sort")
      assert.equal('{"hits":{"hits":[{"sort":[9007199254740991]},{"sort":[-9223372036854775808]}]}}', body)
      _, _, body = req("GET", "/fpn/_search?size=0&filter_path=hits.max_score,-hits.total")
      assert.equal('{"hits":{"max_score":null}}', body)
    end)
    it("\"ignore_malformed\" keeps a malformed value in _source only, as ES does", function()
      assert.equal(200, (jreq("PUT", "/imal", { mappings = { properties = {
        n = { type = "long", ignore_malformed = true }, d = { type = "date", ignore_malformed = true },
        strict_n = { type = "long" } } } })))
      local st, b = jreq("PUT", "/imal/_doc/1?refresh=true", { n = "abc", d = "not a date", t = "x" })
      assert.equal(201, st, cjson.encode(b))
      put_doc("imal", "2", { n = 5, d = "2024-01-01" })
      _, b = jreq("GET", "/imal/_doc/1")
      assert.same({ n = "abc", d = "not a date", t = "x" }, b._source)
      -- the malformed values are not indexed: no query or aggregation sees them
      _, b = jreq("POST", "/imal/_search", { query = { exists = { field = "n" } } })
      assert.same({ "2" }, ids(b))
      _, b = jreq("POST", "/imal/_search", { query = { exists = { field = "d" } } })
      assert.same({ "2" }, ids(b))
      _, b = jreq("POST", "/imal/_search", { query = { term = { t = "x" } } })
      assert.same({ "1" }, ids(b))
      _, b = jreq("POST", "/imal/_search", { size = 0, aggs = { s = { sum = { field = "n" } } } })
      assert.equal(5, b.aggregations.s.value)
      _, b = jreq("POST", "/imal/_search", { size = 0, aggs = { t = { terms = { field = "n" } } } })
      assert.same({ { key = 5, doc_count = 1 } }, b.aggregations.t.buckets)
      -- a field without it still refuses the document
      st, b = jreq("PUT", "/imal/_doc/3", { strict_n = "abc" })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
      -- index.mapping.ignore_malformed: every field that takes it, dynamic ones included
      assert.equal(200, (jreq("PUT", "/imal2", { settings = { index = { mapping = { ignore_malformed = true } } },
        mappings = { properties = { n = { type = "integer" }, off = { type = "long", ignore_malformed = false } } } })))
      put_doc("imal2", "1", { c = 1 })
      st = jreq("PUT", "/imal2/_doc/2", { n = "x", c = "y" })
      assert.equal(201, st)
      st = jreq("PUT", "/imal2/_doc/3", { off = "x" })
      assert.equal(400, st)
    end)
    it("\"dynamic\": \"strict\" refuses unmapped fields with ES's strict_dynamic_mapping_exception", function()
      -- ES: StrictDynamicMappingException "mapping set to strict, dynamic introduction of [f]
      -- within [path] is not allowed" (400), for index, _update and _bulk items alike; an
      -- object's own "dynamic" (or "enabled": false) overrides the root's
      assert.equal(200, (req("PUT", "/strict", { mappings = { dynamic = "strict", properties = {
        a = { type = "keyword" }, o = { properties = { x = { type = "long" } } },
        free = { type = "object", dynamic = true }, off = { type = "object", enabled = false } } } })))
      local function strict_error(field, within)
        return es_error(400, "strict_dynamic_mapping_exception",
          "[1:1] mapping set to strict, dynamic introduction of [" .. field .. "] within [" .. within .. "] is not allowed")
      end
      local st, b = jreq("PUT", "/strict/_doc/1", { a = "x", b = 1 })
      assert.equal(400, st)
      assert.same(strict_error("b", "_doc"), b)
      st, b = jreq("PUT", "/strict/_doc/1", { a = "x", o = { x = 1, y = 2 } })
      assert.equal(400, st)
      assert.same(strict_error("y", "o"), b)
      assert.equal(201, (req("PUT", "/strict/_doc/1", { a = { "x", "y" }, o = { { x = 1 } },
        free = { q = { r = 1 } }, off = { z = 1 } })))
      st, b = jreq("POST", "/strict/_update/1", { doc = { nn = 1 } })
      assert.equal(400, st)
      assert.same(strict_error("nn", "_doc"), b)
      st, b = jreq("POST", "/_bulk", '{"index":{"_index":"strict","_id":"2"}}\n{"zz":1}\n', NDJSON)
      assert.equal(200, st)
      assert.is_true(b.errors)
      assert.equal(400, b.items[1].index.status)
      assert.same(strict_error("zz", "_doc").error.root_cause[1], b.items[1].index.error)
      st, b = jreq("GET", "/strict/_doc/2")
      assert.equal(404, st)
    end)
    it("\"dynamic\": false and \"enabled\": false keep new fields in _source only: unsearchable, unmapped", function()
      -- ES: with "dynamic": false a new field is not added to the mapping and is not indexed
      -- (a query on it matches nothing, an aggregation sees no value); an object "enabled":
      -- false is not parsed at all; an object's own "dynamic": true maps under it again
      assert.equal(200, (req("PUT", "/quiet", { mappings = { dynamic = false, properties = {
        a = { type = "keyword" }, free = { type = "object", dynamic = true },
        off = { type = "object", enabled = false } } } })))
      assert.equal(201, (req("PUT", "/quiet/_doc/1?refresh=true", { a = "x", b = "y", n = 5,
        o = { p = 1 }, free = { q = "z" }, off = { r = 1 } })))
      local function hits(query)
        local st, b = jreq("POST", "/quiet/_search", { query = query })
        assert.equal(200, st)
        return b.hits.total.value
      end
      assert.equal(1, hits({ term = { a = "x" } }))
      assert.equal(1, hits({ match = { ["free.q"] = "z" } }))
      assert.equal(0, hits({ term = { b = "y" } }))
      assert.equal(0, hits({ match = { b = "y" } }))
      assert.equal(0, hits({ exists = { field = "b" } }))
      assert.equal(0, hits({ range = { n = { gte = 1 } } }))
      assert.equal(0, hits({ term = { ["o.p"] = 1 } }))
      assert.equal(0, hits({ term = { ["off.r"] = 1 } }))
      local _, b = jreq("POST", "/quiet/_search", { size = 0, aggs = {
        bs = { terms = { field = "b.keyword" } }, mx = { max = { field = "n" } } } })
      assert.same({}, b.aggregations.bs.buckets)
      assert.equal(cjson.null, b.aggregations.mx.value)
      local _, g = jreq("GET", "/quiet/_doc/1")
      assert.same({ a = "x", b = "y", n = 5, o = { p = 1 }, free = { q = "z" }, off = { r = 1 } }, g._source)
      local _, m = jreq("GET", "/quiet")
      local props = m.quiet.mappings.properties
      assert.is_nil(props.b)
      assert.is_nil(props.n)
      assert.is_nil(props.o)
      assert.same({ type = "text", fields = { keyword = { type = "keyword", ignore_above = 256 } } },
        props.free.properties.q)
      assert.is_nil(props.off.properties)
    end)
    it("rejects invalid index names on write", function()
      local st, b = jreq("PUT", "/BAD/_doc/1", { a = 1 })
      assert.equal(400, st)
      assert.equal("invalid_index_name_exception", b.error.type)
    end)
    it("_update merges doc, detects noop, upserts", function()
      put_doc("up", "1", { a = 1, o = { x = 1 } })
      local st, b = jreq("POST", "/up/_update/1", { doc = { b = 2, o = { y = 2 } } })
      assert.equal(200, st)
      assert.same({ _index = "up", _id = "1", _version = 2, result = "updated",
        _shards = { total = 2, successful = 1, failed = 0 }, _seq_no = 1, _primary_term = 1 }, b)
      local _, g = jreq("GET", "/up/_doc/1")
      assert.same({ a = 1, b = 2, o = { x = 1, y = 2 } }, g._source)
      st, b = jreq("POST", "/up/_update/1", { doc = { b = 2 } })
      assert.equal(200, st)
      assert.equal("noop", b.result)
      assert.equal(2, b._version)
      assert.same({ total = 0, successful = 0, failed = 0 }, b._shards)
      st, b = jreq("POST", "/up/_update/2", { doc = { a = 1 } })
      assert.equal(404, st)
      assert.equal("document_missing_exception", b.error.type)
      assert.equal("[2]: document missing", b.error.reason)
      st, b = jreq("POST", "/up/_update/2", { doc = { a = 1 }, doc_as_upsert = true })
      assert.equal(201, st)
      assert.equal("created", b.result)
      st, b = jreq("POST", "/up/_update/3", { doc = { a = 1 }, upsert = { a = 0 } })
      assert.equal(201, st)
      _, g = jreq("GET", "/up/_doc/3")
      assert.same({ a = 0 }, g._source)
      st, b = jreq("POST", "/up/_update/3", { nodoc = true })
      assert.equal(400, st)
      assert.equal("x_content_parse_exception", b.error.type)
      st, b = jreq("POST", "/up/_update/3", {})
      assert.equal(400, st)
      assert.same(es_error(400, "action_request_validation_exception", "Validation Failed: 1: script or doc is missing;"), b)
    end)
    it("_update refuses version / version_type with ES's validation error", function()
      put_doc("uv", "1", { a = 1 })
      for _, q in ipairs({ "version=1", "version_type=external&version=2" }) do
        local st, b = jreq("POST", "/uv/_update/1?" .. q, { doc = { a = 2 } })
        assert.equal(400, st, q)
        assert.same(es_error(400, "action_request_validation_exception", "Validation Failed: 1: internal versioning " ..
          "can not be used for optimistic concurrency control. Please use `if_seq_no` and `if_primary_term` instead;"), b, q)
      end
    end)
    it("_update returns the updated source in get when _source asks for it (API and _bulk)", function()
      put_doc("ug", "1", { a = 1, b = { c = 2, d = 3 } })
      local st, b = jreq("POST", "/ug/_update/1?_source=true", { doc = { a = 2 } })
      assert.equal(200, st)
      assert.same({ _index = "ug", _id = "1", _version = 2, result = "updated",
        _shards = { total = 2, successful = 1, failed = 0 }, _seq_no = 1, _primary_term = 1,
        get = { _seq_no = 1, _primary_term = 1, found = true, _source = { a = 2, b = { c = 2, d = 3 } } } }, b)
      st, b = jreq("POST", "/ug/_update/1?_source_includes=b.c", { doc = { a = 2 } })
      assert.equal("noop", b.result)
      assert.same({ _seq_no = 1, _primary_term = 1, found = true, _source = { b = { c = 2 } } }, b.get)
      st, b = jreq("POST", "/ug/_update/1", { doc = { a = 3 }, _source = { "a" } })
      assert.same({ a = 3 }, b.get._source)
      st, b = jreq("POST", "/ug/_update/9?_source", { doc = { z = 1 }, doc_as_upsert = true })
      assert.equal(201, st)
      assert.same({ z = 1 }, b.get._source)
      st, b = jreq("POST", "/ug/_update/1?_source=false", { doc = { a = 4 } })
      assert.is_nil(b.get)
      st, b = jreq("POST", "/ug/_update/1", { doc = { a = 5 } })
      assert.is_nil(b.get)
      st, b = jreq("POST", "/_bulk?_source=a", table.concat({
        '{"update":{"_index":"ug","_id":"1"}}', '{"doc":{"a":6}}',
        '{"update":{"_index":"ug","_id":"1","_source":true}}', '{"doc":{"a":7}}',
        '{"update":{"_index":"ug","_id":"1","_source":false}}', '{"doc":{"a":8}}', "" }, "\n"), NDJSON)
      assert.equal(200, st)
      assert.same({ a = 6 }, b.items[1].update.get._source)
      assert.same({ a = 7, b = { c = 2, d = 3 } }, b.items[2].update.get._source)
      assert.is_nil(b.items[3].update.get)
    end)
    it("routing is kept with the document and shown as _routing, as ES does", function()
      local st = jreq("PUT", "/rt1/_doc/1?routing=u1&refresh=true", { a = 1 })
      assert.equal(201, st)
      local b
      st, b = jreq("GET", "/rt1/_doc/1")
      assert.same({ _index = "rt1", _id = "1", _version = 1, _seq_no = 0, _primary_term = 1, _routing = "u1",
        found = true, _source = { a = 1 } }, b)
      jreq("POST", "/rt1/_update/1?refresh=true", { doc = { a = 2 } })
      st, b = jreq("GET", "/rt1/_search")
      assert.equal("u1", b.hits.hits[1]._routing)
      assert.same({ a = 2 }, b.hits.hits[1]._source)
      st, b = jreq("POST", "/_bulk?routing=d", '{"index":{"_index":"rt1","_id":"2"}}\n{}\n' ..
        '{"index":{"_index":"rt1","_id":"3","routing":"m"}}\n{}\n{"index":{"_index":"rt1","_id":"4"}}\n{}\n', NDJSON)
      assert.equal(200, st)
      assert.equal("d", select(2, jreq("GET", "/rt1/_doc/2"))._routing)
      assert.equal("m", select(2, jreq("GET", "/rt1/_doc/3"))._routing)
      jreq("PUT", "/rt1/_doc/5", { a = 1 })
      assert.is_nil(select(2, jreq("GET", "/rt1/_doc/5"))._routing)
    end)
    it("_update of a missing document in a missing index creates the index, then 404s the document", function()
      local st, b = jreq("POST", "/upnew/_update/1", { doc = { a = 1 } })
      assert.equal(404, st)
      assert.equal("document_missing_exception", b.error.type)
      assert.equal("[1]: document missing", b.error.reason)
      assert.equal("upnew", b.error.index)
      assert.equal(200, (req("HEAD", "/upnew")))
    end)
    it("version_type=external without a version reports ES's MATCH_ANY (-3)", function()
      local st, b = jreq("PUT", "/vx/_doc/1?version_type=external", { a = 1 })
      assert.equal(400, st)
      assert.same(es_error(400, "action_request_validation_exception",
        "Validation Failed: 1: illegal version value [-3] for version type [EXTERNAL];"), b)
    end)
    it("decodes URL-encoded ids", function()
      local st, b = jreq("PUT", "/docs/_doc/a%2Fb%20c", { a = 1 })
      assert.equal(201, st)
      assert.equal("a/b c", b._id)
      st, b = jreq("GET", "/docs/_doc/a%2Fb%20c")
      assert.equal(200, st)
      assert.equal("a/b c", b._id)
    end)
  end)

  describe("near-real-time visibility", function()
    it("documents are searchable after a refresh", function()
      assert.equal(200, (jreq("PUT", "/nrt", { settings = { refresh_interval = "-1" } })))
      jreq("PUT", "/nrt/_doc/1", { a = 1 })
      local _, b = jreq("GET", "/nrt/_count")
      assert.equal(0, b.count)
      local st, r = jreq("POST", "/nrt/_refresh")
      assert.equal(200, st)
      assert.same({ _shards = { total = 2, successful = 1, failed = 0 } }, r)
      _, b = jreq("GET", "/nrt/_count")
      assert.equal(1, b.count)
    end)
    it("search sees the state as of the last refresh (updates and deletes too)", function()
      assert.equal(200, (jreq("PUT", "/snap", { settings = { refresh_interval = "-1" } })))
      for i = 1, 3 do jreq("PUT", "/snap/_doc/" .. i, { v = "old" }) end
      jreq("POST", "/snap/_refresh")
      jreq("PUT", "/snap/_doc/1", { v = "new" })
      jreq("DELETE", "/snap/_doc/2")
      local _, b = jreq("POST", "/snap/_search", { sort = { "_doc" } })
      assert.same({ "1", "2", "3" }, ids(b))
      assert.equal("old", b.hits.hits[1]._source.v)
      jreq("POST", "/snap/_refresh")
      _, b = jreq("POST", "/snap/_search", { sort = { "_doc" } })
      assert.same({ "3", "1" }, ids(b))
      assert.equal("new", b.hits.hits[2]._source.v)
      local _, c = jreq("GET", "/snap/_count")
      assert.equal(2, c.count)
    end)
    it("POST /_refresh refreshes everything", function()
      jreq("PUT", "/nrt1/_doc/1", { a = 1 })
      jreq("PUT", "/nrt2/_doc/1", { a = 1 })
      local st, r = jreq("POST", "/_refresh")
      assert.equal(200, st)
      assert.same({ _shards = { total = 4, successful = 2, failed = 0 } }, r)
      local _, b = jreq("GET", "/nrt1,nrt2/_count")
      assert.equal(2, b.count)
    end)
    it("refreshes automatically within about a second", function()
      jreq("PUT", "/auto/_doc/1", { a = 1 })
      local n = 0
      for _ = 1, 30 do
        local _, b = jreq("GET", "/auto/_count")
        n = b.count
        if n == 1 then break end
        socket.sleep(0.1)
      end
      assert.equal(1, n)
    end)
    it("honours index.refresh_interval: -1 turns the automatic refresh off, a bad value is ES's 400", function()
      -- it was accepted and ignored: every index was refreshed each second, so a test that
      -- needs a write to stay invisible could not have one
      assert.equal(200, (jreq("PUT", "/noauto", { settings = { index = { refresh_interval = -1 } } })))
      assert.equal(200, (jreq("PUT", "/slow", { settings = { refresh_interval = "1h" } })))
      jreq("PUT", "/noauto/_doc/1", { a = 1 })
      jreq("PUT", "/slow/_doc/1", { a = 1 })
      jreq("PUT", "/auto2/_doc/1", { a = 1 })
      local n = 0
      for _ = 1, 30 do
        local _, b = jreq("GET", "/auto2/_count")
        n = b.count
        if n == 1 then break end
        socket.sleep(0.1)
      end
      assert.equal(1, n)                                       -- the default 1s did run
      socket.sleep(1.2)
      local _, b = jreq("GET", "/noauto,slow/_count")
      assert.equal(0, b.count)
      assert.equal(200, (jreq("POST", "/noauto/_refresh")))
      _, b = jreq("GET", "/noauto/_count")
      assert.equal(1, b.count)
      local st
      st, b = jreq("PUT", "/badri", { settings = { refresh_interval = "5x" } })
      assert.equal(400, st)
      assert.same({ error = { root_cause = { { type = "illegal_argument_exception",
        reason = "failed to parse setting [index.refresh_interval] with value [5x] as a time value: unit is missing or unrecognized" } },
        type = "illegal_argument_exception",
        reason = "failed to parse setting [index.refresh_interval] with value [5x] as a time value: unit is missing or unrecognized",
        caused_by = { type = "parse_exception",
          reason = "failed to parse setting [index.refresh_interval] with value [5x] as a time value: unit is missing or unrecognized" } },
        status = 400 }, b)
      assert.equal(404, (req("HEAD", "/badri")))
    end)
    it("_refresh of a missing index is 404", function()
      local st, b = jreq("POST", "/nosuch/_refresh")
      assert.equal(404, st)
      assert.same(not_found("nosuch"), b)
    end)
  end)

  describe("_bulk", function()
    local function bulk(body, path, headers)
      return jreq("POST", path or "/_bulk", body, headers or NDJSON)
    end

    it("indexes, creates, updates and deletes with per-item results", function()
      local body = table.concat({
        '{"index":{"_index":"b1","_id":"1"}}', '{"f":1}',
        '{"create":{"_index":"b1","_id":"2"}}', '{"f":2}',
        '{"index":{"_index":"b1"}}', '{"f":3}',
        '{"update":{"_index":"b1","_id":"1"}}', '{"doc":{"g":1}}',
        '{"delete":{"_index":"b1","_id":"2"}}',
        '{"delete":{"_index":"b1","_id":"zzz"}}',
      }, "\n") .. "\n"
      local st, b, h = bulk(body, "/_bulk?refresh=true")
      assert.equal(200, st)
      assert.equal("application/json", h["content-type"])
      assert.equal("Elasticsearch", h["x-elastic-product"])
      assert.is_false(b.errors)
      assert.equal("number", type(b.took))
      assert.equal(6, #b.items)
      local shards = { total = 2, successful = 1, failed = 0 }
      assert.same({ index = { _index = "b1", _id = "1", _version = 1, result = "created", forced_refresh = true,
        _shards = shards, _seq_no = 0, _primary_term = 1, status = 201 } }, b.items[1])
      assert.same({ create = { _index = "b1", _id = "2", _version = 1, result = "created", forced_refresh = true,
        _shards = shards, _seq_no = 1, _primary_term = 1, status = 201 } }, b.items[2])
      assert.equal(20, #b.items[3].index._id)
      assert.equal(201, b.items[3].index.status)
      assert.same({ update = { _index = "b1", _id = "1", _version = 2, result = "updated", forced_refresh = true,
        _shards = shards, _seq_no = 3, _primary_term = 1, status = 200 } }, b.items[4])
      assert.same({ delete = { _index = "b1", _id = "2", _version = 2, result = "deleted", forced_refresh = true,
        _shards = shards, _seq_no = 4, _primary_term = 1, status = 200 } }, b.items[5])
      assert.equal("not_found", b.items[6].delete.result)
      assert.equal(404, b.items[6].delete.status)
      local _, c = jreq("GET", "/b1/_count")
      assert.equal(2, c.count)
    end)
    it("uses the index from the path", function()
      local st, b = bulk('{"index":{"_id":"1"}}\n{"f":1}\n', "/b2/_bulk")
      assert.equal(200, st)
      assert.equal("b2", b.items[1].index._index)
    end)
    it("reports per-item errors (empty _id, create conflict, missing update, CAS)", function()
      bulk('{"index":{"_index":"b3","_id":"x"}}\n{"f":1}\n')
      local body = table.concat({
        '{"index":{"_index":"b3","_id":""}}', '{"f":1}',
        '{"create":{"_index":"b3","_id":"x"}}', '{"f":1}',
        '{"update":{"_index":"b3","_id":"nope"}}', '{"doc":{"f":1}}',
        '{"index":{"_index":"b3","_id":"x","if_seq_no":10000,"if_primary_term":1}}', '{"f":2}',
        '{"index":{"_index":"b3","_id":"ok"}}', '{"f":3}',
      }, "\n") .. "\n"
      local st, b = bulk(body)
      assert.equal(200, st)
      assert.is_true(b.errors)
      assert.same({ index = { _index = "b3", _id = "", status = 400, error = {
        type = "illegal_argument_exception", reason = "if _id is specified it must not be empty" } } }, b.items[1])
      local c = b.items[2].create
      assert.equal(409, c.status)
      assert.equal("version_conflict_engine_exception", c.error.type)
      assert.equal("[x]: version conflict, document already exists (current version [1])", c.error.reason)
      assert.equal("b3", c.error.index)
      assert.equal("0", c.error.shard)
      assert.equal("string", type(c.error.index_uuid))
      assert.equal(404, b.items[3].update.status)
      assert.equal("document_missing_exception", b.items[3].update.error.type)
      assert.equal(409, b.items[4].index.status)
      assert.equal("version_conflict_engine_exception", b.items[4].index.error.type)
      assert.equal(201, b.items[5].index.status)
    end)
    it("update noop", function()
      bulk('{"create":{"_index":"b4","_id":"1"}}\n{"foo":"bar"}\n')
      local _, b = bulk('{"update":{"_index":"b4","_id":"1"}}\n{"doc":{"foo":"bar"}}\n')
      assert.same({ update = { _index = "b4", _id = "1", _version = 1, result = "noop",
        _shards = { total = 0, successful = 0, failed = 0 }, _seq_no = 0, _primary_term = 1, status = 200 } }, b.items[1])
    end)
    it("require_alias fails items for indices that do not exist", function()
      local _, b = bulk('{"index":{"_index":"newidx","require_alias":true}}\n{"f":1}\n')
      assert.equal(404, b.items[1].index.status)
      assert.equal("index_not_found_exception", b.items[1].index.error.type)
      assert.equal("no such index [newidx] and [require_alias] request flag is [true] and [newidx] is not an alias",
        b.items[1].index.error.reason)
      -- an existing concrete index is not an alias either
      req("PUT", "/oldidx")
      _, b = bulk('{"index":{"_index":"oldidx"}}\n{"f":1}\n', "/_bulk?require_alias=true")
      assert.equal(404, b.items[1].index.status)
      assert.equal("no such index [oldidx] and [require_alias] request flag is [true] and [oldidx] is not an alias",
        b.items[1].index.error.reason)
    end)
    it("requires a terminating newline", function()
      local st, b = bulk('{"index":{"_index":"b5"}}\n{"f":1}')
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "The bulk request must be terminated by a newline [\\n]"), b)
    end)
    it("rejects malformed action lines like ES", function()
      local cases = {
        { '{"index": {"_index": "t", "_id": "1"}}\n{"f1": "v1"}\n{}\n', "Malformed action/metadata line [3], expected FIELD_NAME but found [END_OBJECT]" },
        { '"index"\n{}\n', "Malformed action/metadata line [1], expected START_OBJECT but found [VALUE_STRING]" },
        { '{"foo":{"_index":"t"}}\n{}\n', "Malformed action/metadata line [1], expected one of [create, delete, index, update] but found [foo]" },
        { '{"index":"t"}\n{}\n', "Malformed action/metadata line [1], expected START_OBJECT but found [VALUE_STRING]" },
        { '{"index":{"_index":"t","bogus":1}}\n{}\n', "Action/metadata line [1] contains an unknown parameter [bogus]" },
        { '{"index":{"_index":"t","x":{"a":1}}}\n{}\n', "Malformed action/metadata line [1], expected a simple value for field [x] but found [START_OBJECT]" },
        -- empty arrays are arrays, not objects
        { '[]\n{}\n', "Malformed action/metadata line [1], expected START_OBJECT but found [START_ARRAY]" },
        { '{"index":[]}\n{}\n', "Malformed action/metadata line [1], expected START_OBJECT but found [START_ARRAY]" },
        { '{"index":{"_index":"t","x":[]}}\n{}\n', "Malformed action/metadata line [1], expected a simple value for field [x] but found [START_ARRAY]" },
      }
      for _, c in ipairs(cases) do
        local st, b = bulk(c[1])
        assert.equal(400, st, c[1])
        assert.same(es_error(400, "illegal_argument_exception", c[2]), b)
      end
    end)
    it("rejects invalid JSON in an action line", function()
      local st, b = bulk('{"index":\n{}\n')
      assert.equal(400, st)
      assert.equal("x_content_parse_exception", b.error.type)
    end)
    it("requires an index", function()
      local st, b = bulk('{"index":{"_id":"1"}}\n{"f":1}\n{"index":{}}\n{"f":2}\n')
      assert.equal(400, st)
      assert.same(es_error(400, "action_request_validation_exception",
        "Validation Failed: 1: index is missing;2: index is missing;"), b)
    end)
    it("rejects an empty body", function()
      local st, b = jreq("POST", "/_bulk", "", NDJSON)
      assert.equal(400, st)
      -- RestBulkAction reads request.requiredContent()
      assert.same(es_error(400, "parse_exception", "request body is required"), b)
    end)
    it("requires a JSON or NDJSON content type", function()
      local st, b = bulk('{"index":{"_index":"t"}}\n{}\n', nil, { ["Content-Type"] = "text/plain" })
      assert.equal(406, st)
      assert.same({ error = "Content-Type header [text/plain] is not supported", status = 406 }, b)
      st, b = bulk('{"index":{"_index":"t"}}\n{}\n', nil, { ["Content-Type"] = "application/json; charset=UTF-8" })
      assert.equal(200, st)
    end)
    it("a body without any Content-Type is ES's 406 'Content-Type header is missing'", function()
      local sock = socket.tcp()
      sock:settimeout(2)
      assert(sock:connect("127.0.0.1", srv.port))
      local body = '{"index":{"_index":"t"}}\n{}\n'
      assert(sock:send("POST /_bulk HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " .. #body ..
        "\r\n\r\n" .. body))
      local status = sock:receive("*l")
      local len
      repeat
        local line = sock:receive("*l")
        len = len or tonumber(line:match("^[Cc]ontent%-[Ll]ength:%s*(%d+)"))
      until line == ""
      local text = sock:receive(len)
      sock:close()
      assert.equal("HTTP/1.1 406 Not Acceptable", status)
      assert.same({ error = "Content-Type header is missing", status = 406 }, cjson.decode(text))
    end)
    it("item-level document errors", function()
      local _, b = bulk('{"index":{"_index":"b6","_id":"1"}}\n{bad json}\n{"index":{"_index":"BAD"}}\n{"a":1}\n')
      assert.is_true(b.errors)
      assert.equal(400, b.items[1].index.status)
      assert.equal("document_parsing_exception", b.items[1].index.error.type)
      assert.equal(400, b.items[2].index.status)
      assert.equal("invalid_index_name_exception", b.items[2].index.error.type)
    end)
    it("GET is not allowed", function()
      local st, b, h = jreq("GET", "/_bulk")
      assert.equal(405, st)
      assert.same({ error = "Incorrect HTTP method for uri [/_bulk] and method [GET], allowed: [POST, PUT]", status = 405 }, b)
      assert.equal("POST,PUT", h["allow"])
    end)
  end)

  describe("_search", function()
    before_each(function()
      local lines = {}
      local docs = {
        { "1", { title = "The quick brown fox", tag = "animal", n = 1, price = 10.5, ts = "2024-01-01T00:00:10Z", user = { name = "ann" } } },
        { "2", { title = "Lazy brown dog", tag = "animal", n = 2, price = 20, ts = "2024-01-01T00:01:30Z", user = { name = "bob" } } },
        { "3", { title = "Quick silver", tag = "metal", n = 3, price = 30, ts = "2024-01-01T00:02:00Z" } },
        { "4", { title = "red fox", tag = "animal", n = 4, ts = "2024-01-01T01:00:00Z", extra = true } },
      }
      for _, d in ipairs(docs) do
        lines[#lines + 1] = cjson.encode({ index = { _index = "events-a", _id = d[1] } })
        lines[#lines + 1] = cjson.encode(d[2])
      end
      lines[#lines + 1] = '{"index":{"_index":"events-b","_id":"5"}}'
      lines[#lines + 1] = '{"title":"blue whale","tag":"animal","n":5,"ts":1704070800000}'
      req("PUT", "/events-b", { mappings = { properties = { ts = { type = "date" } } } })
      local st = req("POST", "/_bulk?refresh=true", table.concat(lines, "\n") .. "\n", NDJSON)
      assert.equal(200, st)
    end)

    local function search(path, body, headers)
      return jreq("POST", path, body, headers)
    end

    it("match_all over one index, with the ES response shape", function()
      local st, b = search("/events-a/_search", { query = { match_all = {} } })
      assert.equal(200, st)
      assert.equal(false, b.timed_out)
      assert.same({ total = 1, successful = 1, skipped = 0, failed = 0 }, b._shards)
      assert.same({ value = 4, relation = "eq" }, b.hits.total)
      assert.equal(1, b.hits.max_score)
      assert.same({ "1", "2", "3", "4" }, ids(b))
      assert.same({ _index = "events-a", _id = "2", _score = 1,
        _source = { title = "Lazy brown dog", tag = "animal", n = 2, price = 20, ts = "2024-01-01T00:01:30Z", user = { name = "bob" } } },
        b.hits.hits[2])
    end)
    it("GET without a body, wildcard, comma list, _all and no index", function()
      local _, b = jreq("GET", "/events-*/_search")
      assert.equal(5, b.hits.total.value)
      assert.equal(2, b._shards.total)
      _, b = jreq("GET", "/events-a,events-b/_search")
      assert.equal(5, b.hits.total.value)
      _, b = jreq("GET", "/_all/_search")
      assert.equal(5, b.hits.total.value)
      _, b = jreq("GET", "/_search")
      assert.equal(5, b.hits.total.value)
      _, b = jreq("GET", "/nomatch-*/_search")
      assert.same({ value = 0, relation = "eq" }, b.hits.total)
      assert.equal(cjson.null, b.hits.max_score)
    end)
    it("takes _all only alone: in a list it is a name starting with '_', refused as in ES", function()
      -- IndexNameExpressionResolver.validateResourceExpression checks every expression of a
      -- list (excluded ones too, and whatever ignore_unavailable says)
      local function invalid(name)
        return es_error(400, "invalid_index_name_exception", "Invalid index name [" .. name .. "], must not start with '_'.",
          { index_uuid = "_na_", index = name })
      end
      for _, p in ipairs({ "/events-a,_all/_search", "/_all,events-a/_search", "/_all,events-a/_count",
        "/events-*,-_all/_search", "/events-a,_foo/_search?ignore_unavailable=true", "/events-a,_all/_mapping",
        "/events-a,_all/_refresh" }) do
        local st, b = jreq(p:find("_refresh") and "POST" or "GET", p)
        assert.equal(400, st, p)
        assert.same(invalid(p:find("_foo") and "_foo" or "_all"), b, p)
      end
      local st, b = jreq("POST", "/_msearch", '{"index":"events-a,_all"}\n{}\n', NDJSON)
      assert.equal(200, st)
      assert.same(invalid("_all").error, b.responses[1].error)
      -- deleting: DestructiveOperations looks at each expression first
      st, b = jreq("DELETE", "/events-a,_all")
      assert.same(es_error(400, "illegal_argument_exception", "Wildcard expressions or all indices are not allowed"), b)
      assert.equal(200, (req("HEAD", "/events-a")))
    end)
    it("404s a missing index unless ignore_unavailable", function()
      local st, b = jreq("GET", "/missing/_search")
      assert.equal(404, st)
      assert.same(not_found("missing"), b)
      st, b = jreq("GET", "/events-a,missing/_search")
      assert.equal(404, st)
      st, b = jreq("GET", "/events-a,missing/_search?ignore_unavailable=true")
      assert.equal(200, st)
      assert.equal(4, b.hits.total.value)
    end)
    it("excludes -x only after a wildcard, as ES does; otherwise -x is an index name", function()
      -- esxd excluded -x after any expression, so "events-a,-events-a" searched nothing where
      -- ES answers 404 for the index "-events-a"
      local _, b = jreq("GET", "/events-*,-events-a/_search")
      assert.equal(1, b.hits.total.value)
      _, b = jreq("GET", "/*,-events-b/_count")
      assert.equal(4, b.count)
      local st
      st, b = jreq("GET", "/events-a,-events-a/_search")
      assert.equal(404, st)
      assert.same(es_error(404, "index_not_found_exception", "no such index [-events-a] and if you intended to exclude " ..
        "this index, ensure that you use wildcards that include it before explicitly excluding it",
        { ["resource.type"] = "index_or_alias", ["resource.id"] = "-events-a", index_uuid = "_na_", index = "-events-a" }), b)
      st, b = jreq("GET", "/events-a,-events-b/_search?ignore_unavailable=true")
      assert.equal(200, st)
      assert.equal(4, b.hits.total.value)
    end)
    it("match_phrase finds the query's tokens in a row within one value, as ES does", function()
      put_doc("mp1", "1", { t = { "quick brown fox", "jumps" }, k = "brown fox", n = 5 })
      put_doc("mp1", "2", { t = "the Brown-Fox is lazy", k = "x", n = 6 })
      local function hits(q)
        local st, b = jreq("POST", "/mp1/_search", { query = { match_phrase = q } })
        assert.equal(200, st, cjson.encode(q))
        table.sort(b.hits.hits, function(x, y) return x._id < y._id end)
        return ids(b), b
      end
      local got, b = hits({ t = "brown fox" })
      assert.same({ "1", "2" }, got)
      assert.equal(2, b.hits.hits[1]._score)
      assert.same({}, (hits({ t = "fox brown" })))
      assert.same({}, (hits({ t = "fox jumps" })))   -- not across two values of an array
      assert.same({ "2" }, (hits({ t = { query = "BROWN fox is" } })))
      assert.same({ "1" }, (hits({ ["k.keyword"] = "brown fox" })))   -- a keyword: its term query
      assert.same({ "2" }, (hits({ n = 6 })))
      assert.same({}, (hits({ t = "!!" })))   -- no tokens: zero_terms_query none
      -- options esxd does not implement are refused, not ignored
      local st
      st, b = jreq("POST", "/mp1/_search", { query = { match_phrase = { t = { query = "brown fox", slop = 2 } } } })
      assert.equal(400, st)
      assert.same(es_error(400, "parsing_exception", "[match_phrase] query does not support [slop]"), b)
    end)
    it("multi_match runs match on each field: best_fields, most_fields, phrase", function()
      put_doc("mm", "1", { title = "quick brown fox", body = "lazy dog", n = 5 })
      put_doc("mm", "2", { title = "dog days", body = "the quick fox", n = 6 })
      local function hits(mm)
        local st, b = jreq("POST", "/mm/_search", { query = { multi_match = mm } })
        assert.equal(200, st, cjson.encode(b))
        local out = {}
        for _, h in ipairs(b.hits.hits) do out[h._id] = h._score end
        return out
      end
      assert.same({ ["1"] = 2, ["2"] = 2 }, hits({ query = "quick fox", fields = { "title", "body" } }))
      assert.same({ ["1"] = 3 }, hits({ query = "quick fox brown", fields = { "title", "body" }, operator = "and" }))
      -- best_fields: the best field's score plus tie_breaker times the others'; most_fields: the sum
      assert.same({ ["1"] = 1.5, ["2"] = 2.5 }, hits({ query = "quick dog days", fields = { "title^3", "body" }, tie_breaker = 0.5 }))
      assert.same({ ["1"] = 1, ["2"] = 2 }, hits({ query = "quick dog days", fields = { "title", "body" } }))
      assert.same({ ["1"] = 2, ["2"] = 3 }, hits({ query = "quick dog days", fields = { "title", "body" }, type = "most_fields" }))
      assert.same({ ["1"] = 2 }, hits({ query = "brown fox", fields = { "t*" }, type = "phrase" }))
      -- no fields: every field (index.query.default_field "*"), leniently
      assert.same({ ["1"] = 1, ["2"] = 1 }, hits({ query = "dog" }))
      -- a named number field is not lenient: its parse failure fails the search, as for match
      local st, b = jreq("POST", "/mm/_search", { query = { multi_match = { query = "dog", fields = { "title", "n" } } } })
      assert.equal(400, st)
      assert.equal("search_phase_execution_exception", b.error.type)
      st, b = jreq("POST", "/mm/_search", { query = { multi_match = { fields = { "title" } } } })
      assert.equal(400, st)
      assert.same(es_error(400, "parsing_exception", "No text specified for multi_match query"), b)
      st, b = jreq("POST", "/mm/_search", { query = { multi_match = { query = "x", type = "cross_fields" } } })
      assert.equal(400, st)
      assert.same(es_error(400, "parsing_exception", "[multi_match] query does not support [type]"), b)
    end)
    it("term, terms, ids, exists, prefix, range", function()
      local function q(query) local _, b = search("/events-*/_search", { query = query, sort = { "n" } }); return ids(b) end
      assert.same({ "1", "2", "4", "5" }, q({ term = { tag = "animal" } }))
      assert.same({ "3" }, q({ term = { ["tag.keyword"] = { value = "metal" } } }))
      assert.same({ "1", "3" }, q({ term = { title = "quick" } }))
      assert.same({}, q({ term = { title = "Quick" } }))
      assert.same({ "1", "3" }, q({ term = { title = { value = "Quick", case_insensitive = true } } }))
      assert.same({ "2" }, q({ term = { n = 2 } }))
      assert.same({ "2", "3" }, q({ terms = { n = { 2, 3 } } }))
      assert.same({ "1", "5" }, q({ ids = { values = { "1", "5" } } }))
      assert.same({ "1", "2" }, q({ exists = { field = "user.name" } }))
      assert.same({ "4" }, q({ exists = { field = "extra" } }))
      assert.same({ "2" }, q({ prefix = { ["user.name"] = "bo" } }))
      assert.same({ "2", "3", "4" }, q({ range = { n = { gt = 1, lte = 4 } } }))
      assert.same({ "3", "4", "5" }, q({ range = { n = { gte = 3 } } }))
      assert.same({ "1", "2" }, q({ range = { price = { lt = 30 } } }))
      assert.same({ "2", "3" }, q({ range = { ts = { gte = "2024-01-01T00:01:00Z", lt = "2024-01-01T01:00:00Z" } } }))
      assert.same({ "4", "5" }, q({ range = { ts = { gte = 1704070800000 } } }))
      assert.same({}, q({ match_none = {} }))
    end)
    it("range refuses time_zone and format esxd cannot apply", function()
      local st, b = search("/events-*/_search", { query = { range = { ts = { gte = "2024-01-01", time_zone = "Europe/Paris" } } } })
      assert.equal(400, st)
      assert.same(es_error(400, "parsing_exception", "[range] query does not support [time_zone]"), b)
      st, b = search("/events-*/_search", { query = { range = { ts = { gte = "01/01/2024", format = "dd/MM/yyyy" } } } })
      assert.same(es_error(400, "parsing_exception", "[range] query does not support [format]"), b)
      st = search("/events-*/_search", { query = { range = { ts = { gte = "2024-01-01", time_zone = "UTC",
        format = "strict_date_optional_time||epoch_millis" } } } })
      assert.equal(200, st)
    end)
    it("range reads its bounds with format epoch_second, numbers and strings alike, as ES does", function()
      local function hits(range)
        local st, b = search("/events-*/_search", { query = { range = { ts = range } }, sort = { "_doc" } })
        assert.equal(200, st, cjson.encode(b))
        return ids(b)
      end
      -- 1704070800 s is 2024-01-01T01:00:00Z
      assert.same({ "4", "5" }, hits({ gte = 1704070800, format = "epoch_second" }))
      assert.same({ "4", "5" }, hits({ gte = "1704070800", format = "epoch_second" }))
      assert.same({ "1", "2", "3" }, hits({ lt = 1704070800, format = "epoch_second" }))
      assert.same({ "1" }, hits({ lt = "1704067230", format = "strict_date_optional_time||epoch_second" }))
      assert.same({ "1" }, hits({ lt = "2024-01-01T00:00:30Z", format = "strict_date_optional_time||epoch_second" }))
      -- without a format a number stays epoch millis
      assert.same({ "1", "2", "3", "4", "5" }, hits({ gte = 1704070800 }))
    end)
    it("range applies a time_zone that is a UTC offset to dates without one and to rounding", function()
      -- RangeQueryBuilder's time_zone (ZoneId.of): dates without their own offset are local times
      -- there, date math rounds there, epoch millis and dates with an offset are instants
      assert.equal(200, (req("PUT", "/tzq", { mappings = { properties = { ts = { type = "date" } } } })))
      for i, ts in ipairs({ "2024-02-28T22:30:00Z", "2024-02-28T23:30:00Z", "2024-02-29T23:30:00Z", "2024-03-01T05:00:00Z" }) do
        put_doc("tzq", tostring(i), { ts = ts }, false)
      end
      assert.equal(200, (req("POST", "/tzq/_refresh")))
      local function hits(r)
        local st, b = search("/tzq/_search", { query = { range = { ts = r } } })
        assert.equal(200, st, cjson.encode(b))
        local out = ids(b)
        table.sort(out)
        return table.concat(out, ",")
      end
      assert.equal("3", hits({ gte = "2024-02-29", lte = "2024-02-29" }))
      assert.equal("2", hits({ gte = "2024-02-29", lte = "2024-02-29", time_zone = "+01:00" }))
      assert.equal("2", hits({ gte = "2024-02-29T00:00", lt = "2024-02-29T01:00||+1d/d", time_zone = "+0100" }))
      assert.equal("3", hits({ gte = "2024-02-29T00:00:00Z", lt = "2024-03-01T00:00:00+00:00", time_zone = "+01:00" }))
      assert.equal("2,3,4", hits({ gte = "2024-02-29T00:30:00Z||/d", time_zone = "+01:00" }))
      assert.equal("4", hits({ gte = 1709251200000, time_zone = "-05:00" }))
      assert.equal("4", hits({ gte = "2024-03-01", time_zone = "UTC-05:00" }))
      assert.equal("2,3,4", hits({ gte = "2024-02-28T23:00" }))
      assert.equal("1,2,3,4", hits({ gte = "2024-02-28T23:00", time_zone = "+1" }))
      assert.equal("1", hits({ lt = "2024-02-29", time_zone = "+01" }))
    end)
    it("range takes only objects under its name: a value there is ES's parsing_exception", function()
      -- RangeQueryBuilder.fromXContent: "[range] query does not support [f]" for any value,
      -- boost and _name included (they belong in the field's object)
      for _, c in ipairs({ { { n = 5 }, "n" }, { { n = "x" }, "n" }, { { n = { gte = 1 }, boost = 2 }, "boost" },
          { { n = { 1, 2 } }, "n" } }) do
        local st, b = search("/events-*/_search", { query = { range = c[1] } })
        assert.equal(400, st)
        assert.same(es_error(400, "parsing_exception", "[range] query does not support [" .. c[2] .. "]"), b)
      end
    end)
    it("exists and constant_score refuse keys and tokens they do not know, as their ES parsers do", function()
      local function perr(q, reason)
        local st, b = search("/events-*/_search", { query = q })
        assert.equal(400, st, reason)
        assert.same(es_error(400, "parsing_exception", reason), b)
      end
      perr({ exists = { field = "n", x = 1 } }, "[exists] query does not support [x]")
      perr({ exists = { field = { "n" } } }, "[exists] unknown token [START_ARRAY] after [field]")
      perr({ exists = { field = { a = 1 } } }, "[exists] unknown token [START_OBJECT] after [field]")
      perr({ exists = { boost = 2 } }, "[exists] must be provided with a [field]")
      perr({ exists = "n" }, "[exists] query malformed, no start_object after query name")
      perr({ constant_score = { filter = { match_all = {} }, x = 1 } }, "[constant_score] query does not support [x]")
      perr({ constant_score = { filter = { match_all = {} }, q = { match_all = {} } } }, "[constant_score] query does not support [q]")
      perr({ constant_score = { filter = { { match_all = {} } } } }, "unexpected token [START_ARRAY]")
      perr({ constant_score = { boost = 2 } }, "[constant_score] requires a 'filter' element")
      local st = search("/events-*/_search", { query = { constant_score = { filter = { exists = { field = "n", boost = 1 } },
        boost = 2, _name = "c" } } })
      assert.equal(200, st)
    end)
    it("range keeps the last of gt / gte / from (and lt / lte / to) given in the body, as ES's parser does", function()
      -- RangeQueryBuilder.fromXContent reads the keys in order, each bound key replacing the
      -- bound and its inclusion; cjson's tables lose that order, so the raw body decides
      for i = 1, 5 do put_doc("rorder", tostring(i), { n = i }, false) end
      assert.equal(200, (req("POST", "/rorder/_refresh")))
      local function hits(range)
        local st, b = jreq("POST", "/rorder/_search",
          '{"sort":["n"],"query":{"range":{"n":' .. range .. '}}}', JSON)
        assert.equal(200, st, cjson.encode(b))
        return table.concat(ids(b), ",")
      end
      assert.equal("2,3,4,5", hits('{"gt": 3, "gte": 2}'))
      assert.equal("4,5", hits('{"gte": 2, "gt": 3}'))
      assert.equal("1,2", hits('{"lte": 4, "lt": 3}'))
      assert.equal("1,2,3,4", hits('{"lt": 3, "lte": 4}'))
      assert.equal("2,3,4,5", hits('{"gt": 2, "include_lower": true}'))
      assert.equal("3,4,5", hits('{"include_lower": true, "gt": 2}'))
      assert.equal("3,4", hits('{"gte": 2, "include_lower": false, "to": 4}'))
      assert.equal("2,3", hits('{"include_upper": false, "lte": 3, "from": 2}'))
      -- a bound replaced before it is used is never parsed (ES builds the query from the last)
      local st = jreq("POST", "/rorder/_search", '{"query":{"range":{"n":{"gt": "x", "gte": 4}}}}', JSON)
      assert.equal(200, st)
      -- _msearch bodies and _count too
      local _, b = jreq("POST", "/rorder/_count", '{"query":{"range":{"n":{"gt": 3, "gte": 2}}}}', JSON)
      assert.equal(4, b.count)
      st, b = jreq("POST", "/_msearch", '{"index":"rorder"}\n{"query":{"range":{"n":{"lt": 1, "lte": 2}}}}\n', NDJSON)
      assert.equal(200, st)
      assert.equal(2, b.responses[1].hits.total.value)
    end)
    it("range on a date field parses its bounds with the field's mapping format (epoch_millis: numbers only)", function()
      -- ES's DateFieldType.rangeQuery parses with the field's format unless the query gives one:
      -- an ISO date against {"format":"epoch_millis"} fails the shard with a parse_exception
      -- (wrapped in query_shard_exception)
      assert.equal(200, (req("PUT", "/epochq", { mappings = { properties = { ts = { type = "date", format = "epoch_millis" } } } })))
      put_doc("epochq", "1", { ts = 1704070800000 })
      local st, b = search("/epochq/_search", { query = { range = { ts = { gte = "2024-01-01" } } } })
      assert.equal(400, st)
      query_shard_failure(b, "epochq", "parse_exception", "failed to parse date field [2024-01-01] with format [epoch_millis]")
      st, b = search("/epochq/_search", { query = { range = { ts = { gte = 1704067200000, lt = "now" } } } })
      assert.equal(200, st)
      assert.same({ "1" }, ids(b))
      st, b = search("/epochq/_search", { query = { range = { ts = { gte = "2024-01-01",
        format = "strict_date_optional_time||epoch_millis" } } } })
      assert.equal(200, st)
      assert.same({ "1" }, ids(b))
    end)
    it("range on a date field takes ES's date math and rounds gt / lte bounds up", function()
      -- JavaDateMathParser: "now" or "date||" then +n / -n / "/" with y M w d h H m s; "/unit"
      -- rounds down for gte / lt and up to the unit's last millisecond for gt / lte, and a date
      -- without math has its missing components filled as 23:59:59.999 for gt / lte
      assert.equal(200, (req("PUT", "/dm", { mappings = { properties = { ts = { type = "date" } } } })))
      local docs = { "2024-01-31T12:00:00Z", "2024-02-29T00:00:00Z", "2024-02-29T23:59:59.999Z",
        "2024-03-01T00:00:00Z", "2024-03-15T10:30:00Z", os.date("!%Y-%m-%dT%H:%M:%SZ", os.time() - 7200) }
      for i, ts in ipairs(docs) do put_doc("dm", tostring(i), { ts = ts }, false) end
      assert.equal(200, (req("POST", "/dm/_refresh")))
      local function hits(r)
        local st, b = search("/dm/_search", { size = 20, query = { range = { ts = r } } })
        assert.equal(200, st, cjson.encode(b))
        local out = ids(b)
        table.sort(out)
        return table.concat(out, ",")
      end
      assert.equal("2,3,4,5,6", hits({ gte = "2024-01-31||+1M" })) -- Feb 29: the day clamped
      assert.equal("2,3", hits({ gte = "2024-02-10||/M", lte = "2024-02-10||/M" }))
      assert.equal("4,5,6", hits({ gt = "2024-02-10||/M" }))
      assert.equal("1", hits({ lt = "2024-02-10||/M" }))
      assert.equal("1,2,3", hits({ lte = "2024-02-29" }))
      assert.equal("1,2", hits({ lte = "2024-02-29||" }))
      assert.equal("4,5,6", hits({ gt = "2024-02-29" }))
      assert.equal("1", hits({ lt = "2024-02-29" }))
      assert.equal("1,2,3", hits({ to = "2024-02-29T23" }))
      assert.equal("1,2", hits({ to = "2024-02-29T23", include_upper = false }))
      assert.equal("2,3,4,5,6", hits({ gte = "2024-03-01||-1d/d" }))
      assert.equal("5", hits({ gte = "2024-03-15T10:59:00Z||/h", lte = "2024-03-15T10:00:00Z||/H" }))
      assert.equal("2,3,4", hits({ gte = "2024-03-01||/w", lt = "2024-03-01||+1w/w" })) -- Mon Feb 26 .. Mon Mar 4
      assert.equal("1,2,3,4,5", hits({ gte = "2024-07-01||/y", lte = "2024-07-01||/y" }))
      assert.equal("1", hits({ gte = "2024-01-31T12:00:00Z||+1m-60s", lte = "2024-01-31T12:00:00.5Z||/s" }))
      assert.equal("6", hits({ gte = "now-1d", lte = "now" }))
      assert.equal("6", hits({ gte = "now-1d/d", lt = "now+1d/d" }))
      assert.equal("1,2,3,4,5", hits({ lt = "now-1y/y" }))
      -- the errors: JavaDateMathParser's ElasticsearchParseException, on the shard
      local function fails(r, ctype, reason)
        local st, b = search("/dm/_search", { query = { range = { ts = r } } })
        assert.equal(400, st)
        query_shard_failure(b, "dm", ctype, reason)
      end
      fails({ gte = "now-1x" }, "parse_exception", "unit [x] not supported for date math [-1x]")
      fails({ gte = "now+1" }, "parse_exception", "truncated date math [+1]")
      fails({ lte = "now-" }, "parse_exception", "truncated date math [-]")
      fails({ gte = "now/2d" }, "parse_exception", "rounding `/` can only be used on single unit types [/2d]")
      fails({ gte = "now*1d" }, "parse_exception", "operator not supported for date math [*1d]")
      fails({ gte = "abc||+1d" }, "parse_exception",
        "failed to parse date field [abc] with format [strict_date_optional_time||epoch_millis]")
      fails({ gte = "" }, "parse_exception", "cannot parse empty datetime")
      fails({ gte = "now-99999999999d" }, "number_format_exception", 'For input string: "99999999999"')
      -- a number among the bounds makes ES parse all of them as epoch_millis (now included)
      fails({ gte = 1704067200000, lte = "2024-12-31" }, "parse_exception",
        "failed to parse date field [2024-12-31] with format [epoch_millis]")
      assert.equal("1,2,3,4,5", hits({ gte = 1704067200000, lt = "now-1y" }))
      assert.equal("1,2,3,4,5", hits({ gte = 1704067200000, lte = "2024-12-31", format = "strict_date_optional_time" }))
    end)
    it("term / terms / match on a date field match the value's whole range, with date math", function()
      -- DateFieldType.termQuery is rangeQuery(v, v, true, true): from v rounded down to v rounded
      -- up, so a day matches the whole day, "now/d" today, and date math is taken
      assert.equal(200, (req("PUT", "/dterm", { mappings = { properties = { ts = { type = "date" } } } })))
      local docs = { "2024-02-29T00:00:00Z", "2024-02-29T23:59:59.999Z", "2024-03-01T00:00:00Z",
        os.date("!%Y-%m-%dT%H:%M:%SZ", os.time()) }
      for i, ts in ipairs(docs) do put_doc("dterm", tostring(i), { ts = ts }, false) end
      assert.equal(200, (req("POST", "/dterm/_refresh")))
      local function hits(q)
        local st, b = search("/dterm/_search", { query = q })
        assert.equal(200, st, cjson.encode(b))
        local out = ids(b)
        table.sort(out)
        return table.concat(out, ",")
      end
      assert.equal("1,2", hits({ term = { ts = "2024-02-29" } }))
      assert.equal("1", hits({ term = { ts = "2024-02-29T00:00:00Z" } }))
      assert.equal("1,2", hits({ term = { ts = { value = "2024-03-01||-1d/d" } } }))
      assert.equal("1", hits({ term = { ts = 1709164800000 } }))
      assert.equal("4", hits({ term = { ts = "now/d" } }))
      assert.equal("2,3", hits({ terms = { ts = { "2024-02-29T23", "2024-03" } } }))
      assert.equal("3", hits({ match = { ts = "2024-03-01" } }))
      assert.equal("", hits({ match = { ts = { query = "now-1x", lenient = true } } }))
      local st, b = search("/dterm/_search", { query = { term = { ts = "now-1x" } } })
      assert.equal(400, st)
      query_shard_failure(b, "dterm", "parse_exception", "unit [x] not supported for date math [-1x]")
    end)
    it("a date string of four digits is a year, as strict_date_optional_time reads it before epoch_millis", function()
      -- ES's default format tries strict_date_optional_time first: "2024" is 2024-01-01, not 2024 ms
      -- after the epoch; on a field whose format is only epoch_millis it stays epoch millis
      assert.equal(200, (req("PUT", "/dyear", { mappings = { properties = { ts = { type = "date" },
        em = { type = "date", format = "epoch_millis" } } } })))
      put_doc("dyear", "1", { ts = "2024", em = "2024" }, false)
      put_doc("dyear", "2", { ts = "2023-12-31T23:59:59Z", em = 5000 }, false)
      assert.equal(200, (req("POST", "/dyear/_refresh")))
      local function hits(q, extra)
        local body = { query = q, sort = { "_doc" } }
        for k, v in pairs(extra or {}) do body[k] = v end
        local st, b = search("/dyear/_search", body)
        assert.equal(200, st, cjson.encode(b))
        return table.concat(ids(b), ","), b
      end
      assert.equal("1", (hits({ range = { ts = { gte = "2024", lt = "2024-01-01T00:00:01Z" } } })))
      -- (a term is the value rounded down to rounded up; ES rounds up a missing month and day to
      -- 1, so "2024" is the day 2024-01-01)
      assert.equal("1", (hits({ term = { ts = "2024" } })))
      assert.equal("", (hits({ range = { ts = { lt = "1971" } } })))
      assert.equal("1", (hits({ range = { ts = { gte = "2024", format = "strict_date_optional_time" } } })))
      -- epoch_millis only: "2024" is 2024 ms, in documents and in queries
      assert.equal("1", (hits({ range = { em = { lt = "2025" } } })))
      assert.equal("1,2", (hits({ range = { em = { lte = "5000" } } })))
      local _, b = hits({ match_all = {} }, { aggs = { m = { min = { field = "ts" } } } })
      assert.equal("2023-12-31T23:59:59.000Z", b.aggregations.m.value_as_string)
      _, b = hits({ match_all = {} }, { aggs = { m = { max = { field = "ts" } } } })
      assert.equal("2024-01-01T00:00:00.000Z", b.aggregations.m.value_as_string)
    end)
    it("fractions of a second beyond milliseconds are truncated, not rounded", function()
      -- java.time parses nanoseconds; a date field keeps milliseconds by truncation, so
      -- ".9999" is 999 ms of the same second and ".0005" is 0 ms
      put_doc("dfrac", "1", { ts = "2024-05-01T10:20:30.9999Z" }, false)
      put_doc("dfrac", "2", { ts = "2024-05-01T10:20:30.0005Z" }, false)
      assert.equal(200, (req("POST", "/dfrac/_refresh")))
      local st, b = search("/dfrac/_search", { sort = { { ts = "asc" } } })
      assert.equal(200, st)
      assert.same({ "2", "1" }, ids(b))
      assert.equal(1714558830000, b.hits.hits[1].sort[1])
      assert.equal(1714558830999, b.hits.hits[2].sort[1])
      st, b = search("/dfrac/_search", { query = { range = { ts = { lt = "2024-05-01T10:20:31Z" } } } })
      assert.equal(200, st)
      assert.equal(2, b.hits.total.value)
      st, b = search("/dfrac/_search", { query = { term = { ts = "2024-05-01T10:20:30.0009Z" } } })
      assert.equal(200, st)
      assert.same({ "2" }, ids(b))
      -- nine digits at most (nanoseconds): a tenth is not a date
      assert.equal(201, (req("PUT", "/dfrac/_doc/3", { ts = "2024-05-01T10:20:30.123456789Z" })))
      st, b = jreq("PUT", "/dfrac/_doc/4", { ts = "2024-05-01T10:20:30.1234567891Z" })
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
    end)
    it("query_string combines AND, OR, NOT, +, - as Lucene's classic query parser does", function()
      -- QueryParserBase.addClause: AND makes both sides required, OR both optional under
      -- default_operator AND, NOT / ! / - prohibit; a purely negative query matches the rest
      put_doc("qsb", "1", { a = "x", b = "y" }, false)
      put_doc("qsb", "2", { a = "x", b = "z" }, false)
      put_doc("qsb", "3", { a = "w", b = "y" }, false)
      assert.equal(200, (req("POST", "/qsb/_refresh")))
      local function hits(q, op)
        local st, b = search("/qsb/_search", { query = { query_string = { query = q, default_operator = op } } })
        assert.equal(200, st, cjson.encode(b))
        local out = ids(b)
        table.sort(out)
        return table.concat(out, ",")
      end
      assert.equal("1", hits("a:x AND b:y"))
      assert.equal("1", hits("a:x && b:y"))
      assert.equal("1,2,3", hits("a:x OR b:y"))
      assert.equal("1,2,3", hits("a:x OR b:y", "AND"))
      assert.equal("1,2,3", hits("a:x || b:y", "AND"))
      assert.equal("1", hits("a:x b:y", "AND"))
      assert.equal("2", hits("a:x AND NOT b:y"))
      assert.equal("2", hits("a:x AND !b:y"))
      assert.equal("2", hits("a:x -b:y"))
      -- no precedence: AND makes the clause before it required, so this is "a:w +b:z +a:x"
      assert.equal("2", hits("a:w OR b:z AND a:x"))
      assert.equal("2", hits("NOT b:y"))
      assert.equal("2", hits("-b:y"))
      local st, b = jreq("GET", "/qsb/_search?q=a:x%20AND%20b:y")
      assert.equal(200, st)
      assert.same({ "1" }, ids(b))
    end)
    it("query_string reads a quoted value as a phrase: its tokens in a row, as ES does", function()
      put_doc("qsp", "1", { t = "quick brown fox", k = "brown fox" }, false)
      put_doc("qsp", "2", { t = "fox brown quick", k = "fox" }, false)
      assert.equal(200, (req("POST", "/qsp/_refresh")))
      local function hits(q)
        local st, b = search("/qsp/_search", { query = { query_string = { query = q } } })
        assert.equal(200, st, cjson.encode(b))
        local out = ids(b)
        table.sort(out)
        return table.concat(out, ",")
      end
      assert.equal("1", hits('t:"brown fox"'))
      assert.equal("2", hits('t:"fox brown"'))
      assert.equal("1,2", hits("t:brown t:fox"))
      -- the default field (every field): the phrase in one value
      assert.equal("2", hits('"fox brown"'))
      assert.equal("1", hits('"brown fox"'))
    end)
    it("query_string on a date field takes date math, as the field's term query does", function()
      -- QueryStringQueryParser builds DateFieldType.termQuery for field:value: "now-1d" and
      -- "2024-01-01||+1d" are date math (an instant: no rounding without "/unit")
      assert.equal(200, (req("PUT", "/qsd", { mappings = { properties = { ts = { type = "date" } } } })))
      put_doc("qsd", "1", { ts = os.date("!%Y-%m-%dT%H:%M:%SZ", os.time() - 86400) }, false)
      put_doc("qsd", "2", { ts = "2024-01-02T00:00:00Z" }, false)
      assert.equal(200, (req("POST", "/qsd/_refresh")))
      local function hits(q, lenient)
        local st, b = search("/qsd/_search", { query = { query_string = { query = q, lenient = lenient } } })
        assert.equal(200, st, cjson.encode(b))
        return table.concat(ids(b), ",")
      end
      assert.equal("2", hits("ts:2024-01-01||+1d"))
      assert.equal("2", hits("ts:2024-01-02"))
      local st, b = jreq("GET", "/qsd/_search?q=ts:2024-01-01%7C%7C%2B1d")
      assert.equal(200, st)
      assert.same({ "2" }, ids(b))
      -- now-1d is this very millisecond a day ago: no document there, but no error either
      assert.equal("", hits("ts:now-1d"))
      assert.equal("", hits("ts:now-1x", true))
      st, b = search("/qsd/_search", { query = { query_string = { query = "ts:now-1x" } } })
      assert.equal(400, st)
      query_shard_failure(b, "qsd", "parse_exception", "unit [x] not supported for date math [-1x]")
    end)
    it("a date field whose format reads epoch_second first holds seconds, and queries numbers as millis", function()
      -- ES parses a document's number with the field's format: under epoch_second 1700000000 is
      -- 2023-11-14T22:13:20Z (sort value 1700000000000); a query's number is epoch millis
      -- whatever the format (DateFieldType forces EPOCH_MILLIS), a query's string the format's
      assert.equal(200, (req("PUT", "/esec", { mappings = { properties = {
        s = { type = "date", format = "epoch_second" }, m = { type = "date", format = "epoch_second||epoch_millis" } } } })))
      put_doc("esec", "1", { s = 1700000000, m = "1700000000" }, false)
      put_doc("esec", "2", { s = "1600000000", m = 1600000000 }, false)
      assert.equal(200, (req("POST", "/esec/_refresh")))
      local function hits(q, sort)
        local st, b = search("/esec/_search", { query = q, sort = { { [sort or "s"] = "desc" } } })
        assert.equal(200, st, cjson.encode(b))
        return table.concat(ids(b), ","), b
      end
      local all, b = hits({ match_all = {} })
      assert.equal("1,2", all)
      assert.same({ 1700000000000 }, b.hits.hits[1].sort)
      assert.same({ 1600000000000 }, b.hits.hits[2].sort)
      assert.equal("1", (hits({ range = { s = { gte = 1699999999000 } } })))
      assert.equal("1", (hits({ range = { s = { gte = "1699999999" } } })))
      assert.equal("1", (hits({ range = { s = { gte = "2023-11-14", format = "strict_date_optional_time" } } })))
      assert.equal("2", (hits({ term = { m = "1600000000" } }, "m")))
      assert.equal("2", (hits({ term = { m = 1600000000000 } }, "m")))
      _, b = hits({ match_all = {} }, "m")
      assert.same({ 1700000000000 }, b.hits.hits[1].sort)
    end)
    it("term and terms on _id match the documents of those ids, as the ids query does", function()
      put_doc("idq", "a1", { n = 1 }, false)
      put_doc("idq", "7", { n = 2 }, false)
      put_doc("idq", "b2", { n = 3 })
      local function hits(q)
        local st, b = search("/idq/_search", { query = q, sort = { "n" } })
        assert.equal(200, st, cjson.encode(b))
        return table.concat(ids(b), ",")
      end
      assert.equal("a1", hits({ term = { _id = "a1" } }))
      assert.equal("a1", hits({ term = { _id = { value = "a1" } } }))
      assert.equal("7", hits({ term = { _id = 7 } }))
      assert.equal("a1,b2", hits({ terms = { _id = { "b2", "a1", "zz" } } }))
      assert.equal("a1,7,b2", hits({ bool = { filter = { { terms = { _id = { "a1", "7", "b2" } } } } } }))
      assert.equal("", hits({ term = { _id = "A1" } }))
    end)
    it("term / terms values a date or numeric field cannot parse fail the shard, as in ES", function()
      -- ES's field types parse a term query's value like the field's own values (DateFieldType
      -- and NumberFieldType.termQuery): "abc" against a long or date field is not 0 hits but 400,
      -- a query_shard_exception "failed to create query: ..." caused by the parse failure
      put_doc("tv", "1", { d = "2024-01-01T00:00:00Z", n = 5 })
      local function fails(q, ctype, reason, body)
        local st, b = search("/tv/_search", body or { query = q })
        assert.equal(400, st)
        query_shard_failure(b, "tv", ctype, reason)
      end
      fails({ term = { n = "abc" } }, "number_format_exception", 'For input string: "abc"')
      fails({ terms = { n = { 5, "x" } } }, "number_format_exception", 'For input string: "x"')
      fails({ term = { d = "abc" } }, "parse_exception",
        "failed to parse date field [abc] with format [strict_date_optional_time||epoch_millis]")
      fails({ range = { n = { gte = "abc" } } }, "number_format_exception", 'For input string: "abc"')
      -- the post_filter is built on the shard the same way
      fails(nil, "number_format_exception", 'For input string: "abc"', { post_filter = { term = { n = "abc" } } })
      -- match on a field that is not text is that field's term query (MatchQueryParser.termQuery):
      -- the same failures unless lenient
      fails({ match = { n = "abc" } }, "number_format_exception", 'For input string: "abc"')
      fails({ match = { d = { query = "abc" } } }, "parse_exception",
        "failed to parse date field [abc] with format [strict_date_optional_time||epoch_millis]")
      local st, b = search("/tv/_search", { query = { match = { n = { query = "abc", lenient = true } } } })
      assert.equal(200, st)
      assert.same({}, ids(b))
      -- BooleanFieldType takes true and false only
      put_doc("tv", "2", { f = true })
      fails({ term = { f = "maybe" } }, "illegal_argument_exception", "Can't parse boolean value [maybe], expected [true] or [false]")
      fails({ match = { f = "yes" } }, "illegal_argument_exception", "Can't parse boolean value [yes], expected [true] or [false]")
      fails({ terms = { f = { true, 1 } } }, "illegal_argument_exception", "Can't parse boolean value [1], expected [true] or [false]")
      st, b = search("/tv/_search", { query = { term = { f = "true" } } })
      assert.equal(200, st)
      assert.same({ "2" }, ids(b))
      -- prefix and wildcard exist for string fields only: MappedFieldType's QueryShardException,
      -- which toQuery passes on as it is
      for _, c in ipairs({ { "prefix", "n", "long" }, { "wildcard", "d", "date" }, { "prefix", "f", "boolean" } }) do
        st, b = search("/tv/_search", { query = { [c[1]] = { [c[2]] = "1" } } })
        assert.equal(400, st)
        local uuid = b.error.root_cause[1].index_uuid
        local want = { type = "query_shard_exception", reason = "Can only use " .. c[1] ..
          " queries on keyword, text and wildcard fields - not on [" .. c[2] .. "] which is of type [" .. c[3] .. "]",
          index_uuid = uuid, index = "tv" }
        assert.equal("string", type(uuid))
        assert.same({ want }, b.error.root_cause)
        assert.same(want, b.error.failed_shards[1].reason)
        assert.same(want, b.error.caused_by)
      end
      -- query_string builds the same prefix query for "1*"; lenient: no match
      st, b = search("/tv/_search", { query = { query_string = { query = "n:1*" } } })
      assert.equal(400, st)
      assert.equal("Can only use prefix queries on keyword, text and wildcard fields - not on [n] which is of type [long]",
        b.error.root_cause[1].reason)
      assert.equal("query_shard_exception", b.error.root_cause[1].type)
      st, b = search("/tv/_search", { query = { query_string = { query = "n:1*", lenient = true } } })
      assert.equal(200, st)
      assert.same({}, ids(b))
      -- "1?" and "1*2" are wildcard queries (getWildcardQuerySingle: the field type's
      -- normalizedWildcardQuery), not a number that does not parse; lenient: no match
      for _, c in ipairs({ { "n:1?", "n", "long" }, { "n:1*5", "n", "long" }, { "d:2024?", "d", "date" }, { "f:tru?", "f", "boolean" } }) do
        st, b = search("/tv/_search", { query = { query_string = { query = c[1] } } })
        assert.equal(400, st)
        assert.equal("search_phase_execution_exception", b.error.type)
        assert.equal("query_shard_exception", b.error.root_cause[1].type)
        assert.equal("Can only use wildcard queries on keyword, text and wildcard fields - not on [" .. c[2] ..
          "] which is of type [" .. c[3] .. "]", b.error.root_cause[1].reason)
        st, b = search("/tv/_search", { query = { query_string = { query = c[1], lenient = true } } })
        assert.equal(200, st)
        assert.same({}, ids(b))
      end
      st, b = jreq("GET", "/tv/_search?q=n:5%3F")
      assert.equal(400, st)
      assert.equal("Can only use wildcard queries on keyword, text and wildcard fields - not on [n] which is of type [long]",
        b.error.root_cause[1].reason)
      for _, q in ipairs({ { term = { n = "5" } }, { terms = { n = { 5 } } }, { term = { d = 1704067200000 } },
        { term = { d = "2024-01-01T00:00:00.000Z" } } }) do
        local st, b = search("/tv/_search", { query = q })
        assert.equal(200, st)
        assert.same({ "1" }, ids(b))
      end
    end)
    it("terms with more values than index.max_terms_count (default 65536) fails the shard, as in ES", function()
      -- TermsQueryBuilder.doToQuery: an IllegalArgumentException, so ES's query_shard_exception
      local reason = function(n, max)
        return "The number of terms [" .. n .. "] used in the Terms Query request has exceeded the allowed maximum of [" ..
          max .. "]. This maximum can be set by changing the [index.max_terms_count] index level setting."
      end
      assert.equal(200, (req("PUT", "/mtc", { settings = { index = { max_terms_count = 3 } },
        mappings = { properties = { k = { type = "keyword" } } } })))
      put_doc("mtc", "1", { k = "a" })
      put_doc("mtc", "2", { list = { "a", "b", "c", "d" } })
      local st, b = search("/mtc/_search", { query = { terms = { k = { "a", "b", "c", "d" } } } })
      assert.equal(400, st)
      query_shard_failure(b, "mtc", "illegal_argument_exception", reason(4, 3))
      st, b = search("/mtc/_search", { query = { terms = { k = { index = "mtc", id = "2", path = "list" } } } })
      assert.equal(400, st)
      query_shard_failure(b, "mtc", "illegal_argument_exception", reason(4, 3))
      st, b = search("/mtc/_search", { query = { terms = { k = { "a", "b", "c" } } } })
      assert.equal(200, st)
      assert.same({ "1" }, ids(b))
      -- a field that is not mapped is rewritten to match_none first
      st, b = search("/mtc/_search", { query = { terms = { nope = { "a", "b", "c", "d" } } } })
      assert.equal(200, st)
      -- the default
      put_doc("mtd", "1", { k = "a" })
      local many = {}
      for i = 1, 65537 do many[i] = "v" .. i end
      st, b = search("/mtd/_search", { query = { terms = { ["k.keyword"] = many } } })
      assert.equal(400, st)
      query_shard_failure(b, "mtd", "illegal_argument_exception", reason(65537, 65536))
      many[65537] = nil
      many[1] = "a"
      st, b = search("/mtd/_search", { query = { terms = { ["k.keyword"] = many } } })
      assert.equal(200, st)
      assert.same({ "1" }, ids(b))
      st, b = jreq("PUT", "/mte", { settings = { max_terms_count = 0 } })
      assert.equal(400, st)
      assert.equal("Failed to parse value [0] for setting [index.max_terms_count] must be >= 1", b.error.reason)
    end)
    it("terms with an object is a terms lookup: index, id and path are required, as ES's parser says", function()
      -- TermsLookup's ConstructingObjectParser: IllegalArgumentException "Required [...]", a
      -- request-level 400 (the body is parsed before the indices are resolved)
      for _, c in ipairs({ { {}, "Required [index, id, path]" }, { { index = "x" }, "Required [id, path]" },
          { { id = "1", path = "p" }, "Required [index]" } }) do
        for _, path in ipairs({ "/tv/_search", "/missing/_search", "/tv/_count" }) do
          local st, b = search(path, { query = { terms = { n = c[1] } } })
          assert.equal(400, st)
          assert.same(es_error(400, "illegal_argument_exception", c[2]), b)
        end
      end
      local st, b = search("/tv/_search", { query = { terms = { n = "5" } } })
      assert.equal(400, st)
      assert.same(es_error(400, "parsing_exception", "[terms] query does not support [n]"), b)
    end)
    it("terms lookup: the values at path of the looked-up document (real time), as ES's TermsQueryBuilder fetches them", function()
      -- search/170_terms_query and 150_rewrite_on_coordinator: the get is real time, arrays and
      -- objects in arrays are flattened (XContentMapValues.extractRawValues)
      for _, u in ipairs({ "u1", "u2", "u3", "u4" }) do put_doc("tl-users", u, { user = u }) end
      put_doc("tl-lookup", "a", { followers = { "u2", "u3" }, nested = { { id = "u1" }, { id = { "u4" } } },
        ["dotted.key"] = "u3", n = "u1", empty = {} }, false)
      local function q(spec)
        local st, b = search("/tl-users/_search", { query = { terms = { user = spec } }, sort = { "user.keyword" } })
        assert.equal(200, st)
        return ids(b)
      end
      assert.same({ "u2", "u3" }, q({ index = "tl-lookup", id = "a", path = "followers" }))
      assert.same({ "u1", "u4" }, q({ index = "tl-lookup", id = "a", path = "nested.id" }))
      assert.same({ "u3" }, q({ index = "tl-lookup", id = "a", path = "dotted.key" }))
      -- a value met before the path ends is taken as it is
      assert.same({ "u1" }, q({ index = "tl-lookup", id = "a", path = "n.x" }))
      -- a missing document, path or an empty array: no terms, no hits
      assert.same({}, q({ index = "tl-lookup", id = "nope", path = "followers" }))
      assert.same({}, q({ index = "tl-lookup", id = "a", path = "nothing" }))
      assert.same({}, q({ index = "tl-lookup", id = "a", path = "empty" }))
      -- inside bool, with routing, and in _count
      assert.same({ "u2", "u3" }, q({ index = "tl-lookup", id = "a", path = "followers", routing = "r" }))
      local st, b = search("/tl-users/_count", { query = { bool = { filter = { { terms = { user = {
        index = "tl-lookup", id = "a", path = "followers" } } } } } } })
      assert.equal(200, st)
      assert.equal(2, b.count)
      -- a missing lookup index fails the whole search (404, before the searched index is resolved)
      for _, path in ipairs({ "/tl-users/_search", "/missing/_search" }) do
        st, b = search(path, { query = { terms = { user = { index = "tl-none", id = "a", path = "followers" } } } })
        assert.equal(404, st)
        assert.equal("index_not_found_exception", b.error.type)
        assert.equal("no such index [tl-none]", b.error.reason)
      end
      -- the fetched values are the field's terms query values: a long field parses them
      put_doc("tl-nums", "1", { n = 5 })
      st, b = search("/tl-nums/_search", { query = { terms = { n = { index = "tl-lookup", id = "a", path = "followers" } } } })
      assert.equal(400, st)
      query_shard_failure(b, "tl-nums", "number_format_exception", 'For input string: "u2"')
      -- unknown lookup keys are the parser's error
      st, b = search("/tl-users/_search", { query = { terms = { user = { index = "tl-lookup", id = "a", path = "p", x = 1 } } } })
      assert.equal(400, st)
      assert.equal("x_content_parse_exception", b.error.type)
      assert.equal("[terms_lookup] unknown field [x]", b.error.reason)
    end)
    it("leaf query options: unknown or unimplemented ones are ES's parsing_exception; wildcard case_insensitive", function()
      local function q(query) local _, b = search("/events-*/_search", { query = query, sort = { "n" } }); return ids(b) end
      assert.same({ "3" }, q({ wildcard = { ["tag.keyword"] = { value = "M*L", case_insensitive = true } } }))
      assert.same({}, q({ wildcard = { ["tag.keyword"] = { value = "M*L" } } }))
      for _, c in ipairs({
        { "term", { term = { tag = { value = "x", foo = 1 } } } },
        { "prefix", { prefix = { tag = { value = "x", fuzziness = 1 } } } },
        { "wildcard", { wildcard = { tag = { value = "x", bogus = true } } } },
        { "match", { match = { title = { query = "quik", fuzziness = "AUTO" } } } },
        { "match", { match = { title = { query = "fox", analyzer = "whitespace" } } } },
        { "match", { match = { title = { query = "the", zero_terms_query = "all" } } } },
        { "match", { match = { title = { query = "fox", typo = 1 } } } },
        { "query_string", { query_string = { query = "fox", fields = { "title" } } } },
        { "query_string", { query_string = { query = "fox~", fuzziness = 2 } } } }) do
        local st, b = search("/events-*/_search", { query = c[2] })
        assert.equal(400, st, cjson.encode(c[2]))
        assert.equal("parsing_exception", b.error.type)
        assert.matches("^%[" .. c[1] .. "%] query does not support %[", b.error.reason)
      end
      assert.same({ "1", "4" }, q({ match = { title = { query = "fox", fuzziness = 0, analyzer = "standard",
        zero_terms_query = "none", lenient = true, _name = "n", boost = 2 } } }))
    end)
    it("match (OR by default, operator and) scores by matched tokens", function()
      local _, b = search("/events-a/_search", { query = { match = { title = "quick fox" } } })
      assert.same({ "1", "3", "4" }, ids(b))
      assert.equal(2, b.hits.hits[1]._score)
      assert.equal(2, b.hits.max_score)
      _, b = search("/events-a/_search", { query = { match = { title = { query = "QUICK fox", operator = "and" } } } })
      assert.same({ "1" }, ids(b))
    end)
    it("bool with must, filter, should, must_not and minimum_should_match", function()
      local _, b = search("/events-*/_search", { sort = { "n" }, query = { bool = {
        filter = { { term = { tag = "animal" } } },
        must_not = { { term = { n = 4 } } } } } })
      assert.same({ "1", "2", "5" }, ids(b))
      _, b = search("/events-*/_search", { query = { bool = { filter = { term = { tag = "metal" } } } } })
      assert.equal(0, b.hits.hits[1]._score)
      _, b = search("/events-*/_search", { sort = { "n" }, query = { bool = {
        should = { { term = { n = 1 } }, { term = { n = 3 } }, { term = { tag = "animal" } } },
        minimum_should_match = 2 } } })
      assert.same({ "1" }, ids(b))
      _, b = search("/events-*/_search", { sort = { "n" }, query = { bool = {
        must = { match = { title = "fox" } }, should = { { term = { n = 4 } } } } } })
      assert.same({ "1", "4" }, ids(b))
    end)
    it("unknown queries are a parsing_exception", function()
      local st, b = search("/events-a/_search", { query = { fuzzy_thing = { a = 1 } } })
      assert.equal(400, st)
      assert.equal("parsing_exception", b.error.type)
      assert.equal("unknown query [fuzzy_thing] did you mean [query_string]?", b.error.reason)
      assert.equal("parsing_exception", b.error.root_cause[1].type)
      st, b = search("/events-a/_search", { bogus = 1 })
      assert.equal(400, st)
      assert.same(es_error(400, "parsing_exception", "Unknown key for a VALUE_NUMBER in [bogus]."), b)
      -- ES's suggestions among the query names it knows
      st, b = search("/events-a/_search", { query = { matc = { title = "fox" } } })
      assert.equal(400, st)
      assert.equal("unknown query [matc] did you mean [match]?", b.error.reason)
      _, b = search("/events-a/_search", { query = { trems = { tag = { "animal" } } } })
      assert.equal("unknown query [trems] did you mean [terms]?", b.error.reason)
      _, b = search("/events-a/_search", { query = { regexp = { tag = "an.*" } } })   -- ES's, not esxd's
      assert.equal("unknown query [regexp]", b.error.reason)
    end)
    it("returns a parsing_exception for a malformed query before the indices are resolved", function()
      -- RestSearchAction parses the body first: no index matching, or a missing one, changes nothing
      local want = es_error(400, "parsing_exception", "[term] query malformed, no start_object after query name")
      for _, path in ipairs({ "/nomatch-*/_search", "/missing/_search", "/missing/_count", "/nomatch-*/_count" }) do
        local st, b = jreq("POST", path, '{"query":{"term":[]}}')
        assert.equal(400, st, path)
        assert.same(want, b, path)
      end
      local st, b = jreq("POST", "/nomatch-*/_search", '{"post_filter":{"bool":{"must":[[]]}}}')
      assert.equal(400, st)
      assert.same(es_error(400, "parsing_exception", "[_na] query malformed, must start with start_object"), b)
      st, b = jreq("POST", "/nomatch-*/_search", '{"query":{"fuzzy_thing":{}}}')
      assert.equal(400, st)
      assert.equal("unknown query [fuzzy_thing] did you mean [query_string]?", b.error.reason)
      -- a value a field cannot parse is still a shard failure of an existing index only
      st = jreq("POST", "/nomatch-*/_search", '{"query":{"range":{"ts":{"gte":"not a date"}}}}')
      assert.equal(200, st)
    end)
    it("returns illegal_argument_exception for an empty query clause ({}), as ES 6+ does", function()
      local want = es_error(400, "illegal_argument_exception", "query malformed, empty clause found")
      for _, body in ipairs({ '{"query":{}}', '{"query":{"bool":{"must":{}}}}', '{"query":{"bool":{"filter":[{}]}}}',
        '{"query":{"constant_score":{"filter":{}}}}', '{"post_filter":{}}' }) do
        local st, b = jreq("POST", "/events-a/_search", body)
        assert.equal(400, st, body)
        assert.same(want, b, body)
      end
      local st, b = jreq("POST", "/events-a/_count", '{"query":{}}')
      assert.equal(400, st)
      assert.same(want, b)
      st, b = jreq("POST", "/events-a/_search", '{"query":{"bool":{"must":[5]}}}')
      assert.same(es_error(400, "parsing_exception", "[_na] query malformed, must start with start_object"), b)
      assert.equal(200, (jreq("POST", "/events-a/_search", '{"query":{"match_all":{}}}')))
    end)
    it("malformed request bodies are ES 400s, never 500s", function()
      local bodies = { '{"query":"x"}', '{"query":{"term":"x"}}', '{"query":{"bool":{"must":"x"}}}', '{"sort":5}',
        '{"sort":[5]}', '{"sort":{"n":{"order":"up"}}}', '{"size":"abc"}', '{"from":-1}', '{"size":-1}',
        '{"track_total_hits":"x"}', '{"aggs":5}', '{"aggs":{"a":{}}}', '{"aggs":{"a":{"terms":{"field":5}}}}',
        '{"aggs":{"a":{"terms":{"field":"n","order":"x"}}}}', '{"aggs":{"a":{"terms":{"field":"n","size":"x"}}}}',
        '{"aggs":{"a":{"sum":{"field":"n"},"aggs":{"b":{"sum":{"field":"n"}}}}}}',
        '{"aggs":{"a":{"date_histogram":{"field":"ts","calendar_interval":5}}}}',
        '{"aggs":{"a":{"date_histogram":{"field":"ts"}}}}', '{"aggs":{"a":{"histogram":{"field":"n","interval":"x"}}}}',
        '{"query":{"range":{"n":5}}}', '{"query":{"range":{"n":{"bogus":1}}}}', '{"query":{"terms":{"f":"x"}}}',
        '{"query":{"ids":{"values":"x"}}}', '{"query":{"exists":5}}', '{"query":{"match":{}}}',
        '{"query":{"match":{"t":{}}}}', '{"query":{"term":{"t":[1]}}}', '{"query":{"bool":{"must":[5]}}}',
        '{"query":{"bool":{"minimum_should_match":"abc","should":[]}}}', '{"query":{"constant_score":5}}',
        '{"query":{"term":{"a":1},"match":{"b":1}}}', '"x"', 'null', '[1]' }
      for _, body in ipairs(bodies) do
        local st, b = jreq("POST", "/events-a/_search", body, JSON)
        assert.equal(400, st, body)
        assert.equal("string", type(b.error.type), body)
        assert.equal(400, b.status, body)
      end
    end)
    it("takes ?size=-1 as no size parameter, as RestSearchAction does", function()
      put_doc("szm", "1", { a = 1 }, false)
      put_doc("szm", "2", { a = 2 })
      local st, b = jreq("GET", "/szm/_search?size=-1")
      assert.equal(200, st)
      assert.equal(2, #b.hits.hits)
      st, b = jreq("POST", "/szm/_search?size=-1", { size = 1 })
      assert.equal(200, st)
      assert.equal(1, #b.hits.hits)
      st, b = jreq("GET", "/szm/_search?size=-2")
      assert.same(es_error(400, "illegal_argument_exception", "[size] parameter cannot be negative, found [-2]"), b)
      st, b = jreq("GET", "/szm/_search?from=-1")
      assert.same(es_error(400, "illegal_argument_exception", "[from] parameter cannot be negative but was [-1]"), b)
    end)
    it("malformed JSON body is a 400", function()
      local st, b = jreq("POST", "/events-a/_search", "{nope", JSON)
      assert.equal(400, st)
      assert.equal("x_content_parse_exception", b.error.type)
    end)
    it("returns the [line:col] of a JSON syntax error in its reason, as ES's XContentParseException does", function()
      local st, b = jreq("POST", "/events-a/_search", '{"query":\n  {"match_all":{}},\n  "size": }', JSON)
      assert.equal(400, st)
      local cause = b.error.caused_by
      assert.equal("json_parse_exception", cause.type)
      assert.equal("x_content_parse_exception", b.error.type)
      assert.equal("[3:11] " .. cause.reason, b.error.reason)
      assert.same({ { type = "x_content_parse_exception", reason = b.error.reason } }, b.error.root_cause)
      st, b = jreq("POST", "/events-a/_count", "{nope", JSON)
      assert.equal(400, st)
      assert.equal("[1:2] " .. b.error.caused_by.reason, b.error.reason)
      -- a document body too (document_parsing_exception "[l:c] failed to parse: ...")
      st, b = jreq("PUT", "/events-a/_doc/badjson", '{"a": 1,\n"b": tru}', JSON)
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
      assert.equal("[2:6] failed to parse: " .. b.error.caused_by.reason, b.error.reason)
    end)
    it("returns 400 when a body names a field twice in one object, as ES's strict duplicate detection does", function()
      -- ES's JSON parser runs with STRICT_DUPLICATE_DETECTION: a search, a document, a bulk
      -- source line with a name given twice are refused (cjson keeps the last one)
      local st, b = jreq("POST", "/events-a/_search", '{"size":1,\n "size":2}', JSON)
      assert.equal(400, st)
      assert.equal("x_content_parse_exception", b.error.type)
      assert.equal("json_parse_exception", b.error.caused_by.type)
      assert.matches("^Duplicate field 'size'", b.error.caused_by.reason)
      assert.equal("[2:8] " .. b.error.caused_by.reason, b.error.reason)
      st, b = jreq("POST", "/events-a/_search", '{"query":{"bool":{"filter":[{"term":{"a":1,"a":2}}]}}}', JSON)
      assert.equal(400, st)
      assert.matches("^%[1:47%] Duplicate field 'a'", b.error.reason)
      -- the same name in different objects is fine
      st = jreq("POST", "/events-a/_search", '{"query":{"bool":{"must":[{"term":{"a":1}},{"term":{"a":2}}]}}}', JSON)
      assert.equal(200, st)
      st, b = jreq("PUT", "/dupdoc/_doc/1", '{"a":1,"b":{"c":1,"c":2}}', JSON)
      assert.equal(400, st)
      assert.equal("document_parsing_exception", b.error.type)
      assert.matches("^%[1:22%] failed to parse: Duplicate field 'c'", b.error.reason)
      assert.equal(404, (req("GET", "/dupdoc/_doc/1")))
      st, b = jreq("POST", "/_bulk", '{"index":{"_index":"dupdoc","_id":"2"}}\n{"x":1,"x":1}\n' ..
        '{"index":{"_index":"dupdoc","_id":"3"}}\n{"x":1}\n', NDJSON)
      assert.equal(200, st)
      assert.is_true(b.errors)
      assert.equal(400, b.items[1].index.status)
      assert.equal("document_parsing_exception", b.items[1].index.error.type)
      assert.matches("^%[1:11%] failed to parse: Duplicate field 'x'", b.items[1].index.error.reason)
      assert.equal(201, b.items[2].index.status)
    end)
    it("sorts by field asc/desc, _score, _doc, string and object forms, missing last", function()
      -- (events-b does not map price: unmapped_type sorts it there as a long without values)
      local _, b = search("/events-*/_search", { sort = { { price = { order = "desc", unmapped_type = "long" } } } })
      assert.same({ "3", "2", "1", "4", "5" }, ids(b))
      assert.same({ 30 }, b.hits.hits[1].sort)
      assert.equal(cjson.null, b.hits.hits[1]._score)
      assert.equal(cjson.null, b.hits.max_score)
      _, b = search("/events-*/_search", { sort = { { price = { order = "asc", unmapped_type = "long" } } } })
      assert.same({ "1", "2", "3", "4", "5" }, ids(b))
      _, b = search("/events-*/_search", { sort = { { price = { order = "asc", missing = "_first", unmapped_type = "long" } }, "n" } })
      assert.same({ "4", "5", "1", "2", "3" }, ids(b))
      _, b = search("/events-*/_search", { sort = { { ts = "desc" } } })
      assert.same({ "4", "5", "3", "2", "1" }, ids(b))
      assert.same({ 1704070800000 }, b.hits.hits[1].sort)
      _, b = search("/events-*/_search", { sort = "tag.keyword", size = 2 })
      assert.same({ "1", "2" }, ids(b))
      _, b = jreq("GET", "/events-a/_search?sort=n:desc")
      assert.same({ "4", "3", "2", "1" }, ids(b))
      _, b = search("/events-a/_search", { query = { match = { title = "quick fox" } }, sort = { "_score", { n = "desc" } } })
      assert.same({ "1", "4", "3" }, ids(b))
      _, b = search("/events-a/_search", { sort = { "_doc" } })
      assert.same({ "1", "2", "3", "4" }, ids(b))
    end)
    it("fails the shards of an index that does not map a sort field, unless unmapped_type; _id has no field data", function()
      -- FieldSortBuilder.build: "No mapping found for [f] in order to sort on" on each shard of
      -- such an index (documents or not); the other indices answer, with _shards.failures
      local _, b = search("/events-*/_search", { sort = { { price = "desc" } } })
      assert.same({ "3", "2", "1", "4" }, ids(b))
      assert.equal(1, b._shards.failed)
      assert.equal("events-b", b._shards.failures[1].index)
      assert.same({ type = "query_shard_exception", reason = "No mapping found for [price] in order to sort on",
        index_uuid = b._shards.failures[1].reason.index_uuid, index = "events-b" }, b._shards.failures[1].reason)
      assert.equal(200, (req("PUT", "/sort-empty")))
      local st
      st, b = search("/sort-empty/_search", { sort = { "price" } })
      assert.equal(400, st)
      assert.equal("search_phase_execution_exception", b.error.type)
      assert.equal("No mapping found for [price] in order to sort on", b.error.root_cause[1].reason)
      st, b = search("/sort-empty/_search", { sort = { { price = { unmapped_type = "long" } } } })
      assert.equal(200, st)
      -- _index sorts by the index name; _id cannot be sorted on in ES 8
      _, b = search("/events-*/_search", { sort = { { _index = "desc" }, "n" } })
      assert.same({ "5", "1", "2", "3", "4" }, ids(b))
      assert.same({ "events-b", 5 }, b.hits.hits[1].sort)
      st, b = search("/events-a/_search", { sort = { "_id" } })
      assert.equal(400, st)
      assert.equal("Fielddata access on the _id field is disallowed, you can re-enable it by updating the dynamic " ..
        "cluster setting: indices.id_field_data.enabled", b.error.root_cause[1].reason)
    end)
    it("sort takes mode min / max on multi-valued fields and refuses options it does not know or implement", function()
      put_doc("smode", "1", { v = { 1, 10 } }, false)
      put_doc("smode", "2", { v = { 5 } })
      local _, b = search("/smode/_search", { sort = { { v = "asc" } } })
      assert.same({ "1", "2" }, ids(b))                        -- asc: each document's min (1, 5)
      _, b = search("/smode/_search", { sort = { { v = { order = "asc", mode = "max" } } } })
      assert.same({ "2", "1" }, ids(b))                        -- max: 5, 10
      assert.same({ 5 }, b.hits.hits[1].sort)
      _, b = search("/smode/_search", { sort = { { v = { order = "desc", mode = "min" } } } })
      assert.same({ "2", "1" }, ids(b))
      for _, o in ipairs({ { bogus = 1 }, { mode = "avg" }, { nested = { path = "x" } }, { format = "x" } }) do
        local st, e = search("/smode/_search", { sort = { { v = o } } })
        assert.equal(400, st)
        assert.same(es_error(400, "x_content_parse_exception", "[field_sort] unknown field [" .. next(o) .. "]"), e)
      end
    end)
    it("refuses to sort on a text field", function()
      local st, b = search("/events-a/_search", { sort = { "title" } })
      assert.equal(400, st)
      assert.equal("search_phase_execution_exception", b.error.type)
      assert.equal("all shards failed", b.error.reason)
      assert.equal("illegal_argument_exception", b.error.root_cause[1].type)
      assert.matches("^Fielddata is disabled on %[title%]", b.error.root_cause[1].reason)
    end)
    it("a shard failure in some of the searched indices: 200 with partial results and _shards.failures, as ES", function()
      -- AbstractSearchAsyncAction: the search fails only when every shard failed; otherwise the
      -- response has the other shards' hits and the failures (ExceptionsHelper.groupBy: one per
      -- index), as RestActions.buildBroadcastShardsHeader writes them
      assert.equal(200, (jreq("PUT", "/pf-num", { settings = { number_of_shards = 2 }, mappings = { properties = { n = { type = "long" } } } })))
      assert.equal(200, (jreq("PUT", "/pf-kw", { mappings = { properties = { n = { type = "keyword" } } } })))
      put_doc("pf-num", "1", { n = 1 })
      put_doc("pf-kw", "2", { n = "abc" })
      for _, path in ipairs({ "/pf-num,pf-kw/_search", "/pf-*/_search" }) do
        local st, b = search(path, { query = { term = { n = "abc" } } })
        assert.equal(200, st)
        assert.same({ "2" }, ids(b))
        assert.equal(1, b.hits.total.value)
        assert.equal(3, b._shards.total)
        assert.equal(1, b._shards.successful)
        assert.equal(2, b._shards.failed)
        assert.equal(0, b._shards.skipped)
        assert.equal(1, #b._shards.failures)
        local f = b._shards.failures[1]
        assert.equal(0, f.shard)
        assert.equal("pf-num", f.index)
        assert.equal("string", type(f.node))
        assert.equal("query_shard_exception", f.reason.type)
        assert.equal('failed to create query: For input string: "abc"', f.reason.reason)
        assert.equal("pf-num", f.reason.index)
        assert.same({ type = "number_format_exception", reason = 'For input string: "abc"' }, f.reason.caused_by)
      end
      -- _count and an aggregation failing on one index only, the sort's field data likewise
      local st, b = search("/pf-*/_count", { query = { term = { n = "abc" } } })
      assert.equal(200, st)
      assert.equal(1, b.count)
      assert.same({ 3, 1, 2, "pf-num" }, { b._shards.total, b._shards.successful, b._shards.failed, b._shards.failures[1].index })
      st, b = search("/pf-*/_search", { size = 0, aggs = { s = { sum = { field = "n" } } } })
      assert.equal(200, st)
      assert.equal(1, b.aggregations.s.value)
      assert.equal("pf-kw", b._shards.failures[1].index)
      assert.equal("Field [n] of type [keyword] is not supported for aggregation [sum]", b._shards.failures[1].reason.reason)
      -- allow_partial_search_results=false: any failure fails the search ("Partial shards failure")
      st, b = search("/pf-*/_search?allow_partial_search_results=false", { query = { term = { n = "abc" } } })
      assert.equal(400, st)
      assert.equal("search_phase_execution_exception", b.error.type)
      assert.equal("Partial shards failure", b.error.reason)
      assert.equal("pf-num", b.error.failed_shards[1].index)
      assert.is_nil(b.error.caused_by)
      -- every index failing: "all shards failed", one root cause and failed_shards entry per index
      st, b = search("/pf-*/_search", { query = { prefix = { n = { value = "1" } } }, aggs = { s = { sum = { field = "n" } } } })
      assert.equal(400, st)
      assert.equal("all shards failed", b.error.reason)
      assert.equal(2, #b.error.root_cause)
      assert.equal(2, #b.error.failed_shards)
      local failed = { b.error.failed_shards[1].index, b.error.failed_shards[2].index }
      table.sort(failed)
      assert.same({ "pf-kw", "pf-num" }, failed)
      assert.equal(b.error.failed_shards[1].reason.type, b.error.caused_by.type)
    end)
    it("from / size paging and the result window", function()
      local _, b = search("/events-*/_search", { sort = { "n" }, from = 1, size = 2 })
      assert.same({ "2", "3" }, ids(b))
      assert.equal(5, b.hits.total.value)
      _, b = jreq("GET", "/events-*/_search?sort=n&from=3&size=10")
      assert.same({ "4", "5" }, ids(b))
      _, b = search("/events-*/_search", { size = 0 })
      assert.same({}, b.hits.hits)
      assert.equal(5, b.hits.total.value)
      local st
      st, b = search("/events-*/_search", { from = 9995, size = 10 })
      assert.equal(400, st)
      assert.equal("search_phase_execution_exception", b.error.type)
      assert.equal("Result window is too large, from + size must be less than or equal to: [10000] but was [10005]. See the scroll api for a more efficient way to request large data sets. This limit can be set by changing the [index.max_result_window] index level setting.",
        b.error.root_cause[1].reason)
      -- index.max_result_window is the index's own bound
      assert.equal(200, (jreq("PUT", "/events-w", { settings = { index = { max_result_window = 20000 } } })))
      put_doc("events-w", "1", { n = 1 })
      st, b = search("/events-w/_search", { from = 15000, size = 10 })
      assert.equal(200, st)
      assert.same({}, b.hits.hits)
      st, b = search("/events-w/_search", { from = 19995, size = 10 })
      assert.equal(400, st)
      assert.matches("^Result window is too large, from %+ size must be less than or equal to: %[20000%] but was %[20005%]",
        b.error.root_cause[1].reason)
      assert.equal(200, (jreq("PUT", "/events-v", { settings = { ["index.max_result_window"] = 5 } })))
      st, b = search("/events-v/_search", { size = 6 })
      assert.equal(400, st)
      assert.equal("events-v", b.error.failed_shards[1].index)
    end)
    it("_source filtering takes a dotted key under an included or excluded path, as ES's filter does", function()
      put_doc("sfd", "1", cjson.decode('{"a.b":1,"a":{"c":2},"x":{"y.z":3},"ab":4}'))
      local function src(spec)
        local st, b = jreq("POST", "/sfd/_search", { _source = spec })
        assert.equal(200, st)
        return b.hits.hits[1]._source
      end
      assert.same({ ["a.b"] = 1, a = { c = 2 } }, src({ "a" }))
      assert.same({ x = { ["y.z"] = 3 } }, src({ "x.y" }))
      assert.same({ ab = 4, x = { ["y.z"] = 3 } }, src({ excludes = { "a" } }))
      local _, _, body = req("GET", "/sfd/_source/1?_source_includes=a")
      assert.same({ ["a.b"] = 1, a = { c = 2 } }, cjson.decode(body))
    end)
    it("_source: false, list, includes/excludes with wildcards", function()
      local function src(spec)
        local _, b = search("/events-a/_search", { _source = spec, query = { ids = { values = { "1" } } } })
        return b.hits.hits[1]._source
      end
      assert.is_nil(src(false))
      assert.same({ tag = "animal", n = 1 }, src({ "tag", "n" }))
      assert.same({ user = { name = "ann" } }, src("user.*"))
      assert.same({ title = "The quick brown fox", tag = "animal" }, src({ includes = { "t*" }, excludes = { "ts" } }))
      assert.same({ title = "The quick brown fox", tag = "animal", n = 1, price = 10.5, ts = "2024-01-01T00:00:10Z" },
        src({ excludes = { "user" } }))
    end)
    it("track_total_hits and rest_total_hits_as_int", function()
      local _, b = search("/events-*/_search", { track_total_hits = false })
      assert.is_nil(b.hits.total)
      _, b = search("/events-*/_search", { track_total_hits = 3 })
      assert.same({ value = 3, relation = "gte" }, b.hits.total)
      _, b = search("/events-*/_search", { track_total_hits = 5, size = 0 })
      assert.same({ value = 5, relation = "eq" }, b.hits.total)
      _, b = search("/events-*/_search", { track_total_hits = true })
      assert.same({ value = 5, relation = "eq" }, b.hits.total)
      _, b = jreq("GET", "/events-*/_search?rest_total_hits_as_int=true")
      assert.equal(5, b.hits.total)
      _, b = jreq("GET", "/events-*/_search?rest_total_hits_as_int=true&track_total_hits=false")
      assert.equal(-1, b.hits.total)
      local st
      st, b = jreq("GET", "/events-*/_search?rest_total_hits_as_int=true&track_total_hits=100")
      assert.equal(400, st)
      assert.equal("[rest_total_hits_as_int] cannot be used if the tracking of total hits is not accurate, got 100", b.error.reason)
      st, b = jreq("GET", "/events-*/_search?track_total_hits=-2")
      assert.equal(400, st)
      assert.equal("[track_total_hits] parameter must be positive or equals to -1, got -2", b.error.reason)
    end)
    it("filter_path includes, wildcards and exclusions", function()
      local _, b = jreq("GET", "/events-a/_search?sort=n&size=2&filter_path=hits.total,hits.hits._id")
      assert.same({ hits = { total = { value = 4, relation = "eq" }, hits = { { _id = "1" }, { _id = "2" } } } }, b)
      _, b = jreq("GET", "/events-a/_search?size=1&filter_path=**.name")
      assert.same({ hits = { hits = { { _source = { user = { name = "ann" } } } } } }, b)
      _, b = jreq("GET", "/events-a/_search?size=0&filter_path=-hits,-_shards,-took")
      assert.same({ timed_out = false }, b)
      _, b = jreq("POST", "/_bulk?filter_path=errors,items.*.error", '{"index":{"_index":"events-a","_id":"9"}}\n{"n":"x"}\n', NDJSON)
      assert.is_true(b.errors)
      assert.equal("document_parsing_exception", b.items[1].index.error.type)
      assert.is_nil(b.items[1].index.status)
    end)
    it("search body features esxd lacks are refused, not ignored", function()
      for _, k in ipairs({ "collapse", "highlight", "pit",
          "terminate_after", "rescore", "indices_boost", "script_fields", "runtime_mappings", "suggest" }) do
        local v = (k == "search_after" or k == "indices_boost")
          and { "x" } or (k == "terminate_after" and 1 or { x = {} })
        local st, b = search("/events-a/_search", { [k] = v })
        assert.equal(400, st, k)
        assert.same(es_error(400, "parsing_exception", "Unknown key for a " ..
          (type(v) == "number" and "VALUE_NUMBER" or (v[1] and "START_ARRAY" or "START_OBJECT")) .. " in [" .. k .. "]."), b, k)
      end
      local st, b = search("/events-a/_search", { explain = true })
      assert.equal(400, st)
      assert.same(es_error(400, "parsing_exception", "Unknown key for a VALUE_BOOLEAN in [explain]."), b)
      assert.equal(200, (search("/events-a/_search", { explain = false, profile = false, timeout = "1s" })))
    end)
    it("search_after pages past the result window with the last hit's sort values", function()
      -- 25 documents, n in 1..25 with every fifth one missing n, k a tie-breaker
      local lines = {}
      for i = 1, 25 do
        lines[#lines + 1] = cjson.encode({ index = { _index = "sa", _id = tostring(i) } })
        lines[#lines + 1] = i % 5 == 0 and ('{"k":' .. i .. ',"g":"x"}') or
          ('{"n":' .. (i % 3) .. ',"i":' .. (i % 3) .. ',"f":' .. (i % 3) .. ',"k":' .. i .. ',"g":"x"}')
      end
      req("PUT", "/sa", { settings = { index = { max_result_window = 10 } },
        mappings = { properties = { n = { type = "long" }, k = { type = "long" }, g = { type = "keyword" },
          i = { type = "integer" }, f = { type = "double" } } } })
      assert.equal(200, (req("POST", "/_bulk?refresh=true", table.concat(lines, "\n") .. "\n", NDJSON)))
      for _, case in ipairs({ { "n", "asc" }, { "n", "desc" }, { "i", "asc" }, { "f", "desc" }, { "f", "asc" } }) do
        local field, dir = case[1], case[2]
        local seen, after, pages = {}, nil, 0
        repeat
          -- the last hit's sort values sent back as they came (cjson would round Long.MAX)
          local st, _, raw = req("POST", "/sa/_search", '{"size":7,"sort":[{"' .. field .. '":"' .. dir .. '"},{"k":"' .. dir .. '"}]' ..
            (after and (',"search_after":' .. after) or "") .. "}")
          assert.equal(200, st)
          local b = cjson.decode(raw)
          assert.same({ value = 25, relation = "eq" }, b.hits.total)   -- every match counts
          for _, h in ipairs(b.hits.hits) do seen[#seen + 1] = tonumber(h._id) end
          after = nil
          for sv in raw:gmatch('"sort":(%[[^%]]*%])') do after = sv end
          pages = pages + 1
        until after == nil or pages > 6
        assert.equal(5, pages, field .. " " .. dir)
        assert.equal(25, #seen)
        local set = {}
        for _, id in ipairs(seen) do assert.is_nil(set[id], field .. " " .. dir .. " " .. id); set[id] = true end
        -- the documents without the field come last in both orders (missing _last), their sort
        -- value Long.MAX/MIN (+/-Infinity for a double)
        for i = 21, 25 do assert.equal(0, seen[i] % 5, field .. " " .. dir) end
      end
      -- a tie is not after: equal values are left out, so a sort needs a tie-breaker
      local _, b = search("/sa/_search", { sort = { { g = "asc" } }, search_after = { "x" } })
      assert.same({}, b.hits.hits)
      assert.equal(25, b.hits.total.value)
      _, b = search("/sa/_search", { size = 3, sort = { { k = "desc" } }, search_after = { "20" } })
      assert.same({ "19", "18", "17" }, ids(b))
      _, b = search("/sa/_search", { size = 2, sort = { "_doc" }, search_after = { 23 } })
      assert.same({ "24", "25" }, ids(b))
    end)
    it("long sort values past 2^53 are JSON integers, as ES writes a long", function()
      req("PUT", "/bigl", { mappings = { properties = { id = { type = "long" } } } })
      req("POST", "/_bulk?refresh=true", '{"index":{"_index":"bigl","_id":"1"}}\n{"id":100000000000000000}\n' ..
        '{"index":{"_index":"bigl","_id":"2"}}\n{"id":-100000000000000000}\n', NDJSON)
      local st, _, raw = req("GET", "/bigl/_search?sort=id:desc&filter_path=hits.hits.sort")
      assert.equal(200, st)
      assert.equal('{"hits":{"hits":[{"sort":[100000000000000000]},{"sort":[-100000000000000000]}]}}', raw)
      local b
      st, _, raw = req("POST", "/bigl/_search", '{"sort":[{"id":"desc"}],"search_after":[100000000000000000]}')
      b = cjson.decode(raw)
      assert.same({ "2" }, ids(b))
      assert.truthy(raw:find('"sort":[-100000000000000000]', 1, true), raw)
    end)
    it("returns ES's errors for a wrong search_after", function()
      local function shard_error(b, status, etype, reason, extra)
        assert.equal(status, b.status)
        assert.equal("search_phase_execution_exception", b.error.type)
        local want = { type = etype, reason = reason }
        for k, v in pairs(extra or {}) do want[k] = v end
        assert.same({ { type = etype, reason = reason } }, b.error.root_cause)
        assert.same(want, b.error.failed_shards[1].reason)
      end
      local st, b = search("/events-a/_search", { search_after = { 1 } })
      assert.equal(400, st)
      shard_error(b, 400, "illegal_argument_exception", "Sort must contain at least one field.")
      st, b = search("/events-a/_search", { sort = { { _score = "desc" } }, search_after = { 1 } })
      shard_error(b, 400, "illegal_argument_exception", "Sort must contain at least one field.")
      st, b = search("/events-a/_search", { sort = { "n" }, search_after = { 1, "2" } })
      assert.equal(400, st)
      shard_error(b, 400, "illegal_argument_exception", "search_after has 2 value(s) but sort has 1.")
      st, b = search("/events-a/_search", { sort = { "n" }, search_after = { "x" } })
      shard_error(b, 400, "illegal_argument_exception", "Failed to parse search_after value for field [n].",
        { caused_by = { type = "number_format_exception", reason = 'For input string: "x"' } })
      st, b = jreq("POST", "/events-a/_search", '{"search_after":[]}')
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "Values must contains at least one value."), b)
      st, b = search("/events-a/_search", { search_after = "x" })
      assert.same(es_error(400, "parsing_exception", "Unknown key for a VALUE_STRING in [search_after]."), b)
      st, b = search("/events-a/_search", { search_after = { { a = 1 } } })
      assert.same(es_error(400, "parsing_exception",
        "Expected [VALUE_STRING] or [VALUE_NUMBER] or [VALUE_BOOLEAN] or [VALUE_NULL] but found [START_OBJECT] inside search_after."), b)
      -- ES answers this one with 500 (an unboxed null): sent around req() so that the
      -- "no 500" spec keeps watching everything else
      local _, _, raw = srv:request("POST", "/events-a/_search", '{"sort":["n"],"search_after":[null]}', JSON)
      b = cjson.decode(raw)
      shard_error(b, 500, "null_pointer_exception", 'Cannot invoke "java.lang.Long.longValue()" because "value" is null')
      -- a keyword takes null (a document without the field) and a date a date string
      st, b = search("/events-a/_search", { sort = { { ["tag.keyword"] = "asc" }, { ts = "asc" } }, search_after = { "animal", "2024-01-01T00:01:30Z" } })
      assert.equal(200, st)
      assert.same({ "4", "3" }, ids(b))
    end)
    it("returns 400 action_request_validation_exception for from > 0 with search_after, before the shards", function()
      -- ES 8.13+ (#105150): SearchRequest.validate on the coordinating node, not a shard's
      -- 500 search_exception; with the other validation messages, in ES's order
      local want = es_error(400, "action_request_validation_exception",
        "Validation Failed: 1: [from] parameter must be set to 0 when [search_after] is used;")
      local st, b = search("/events-a/_search", { from = 1, sort = { "n" }, search_after = { 1 } })
      assert.equal(400, st)
      assert.same(want, b)
      -- the URL's from counts too, and a missing index is not looked up before the check
      st, b = search("/nope/_search?from=2", { sort = { "n" }, search_after = { 1 } })
      assert.same(want, b)
      st, b = search("/events-a/_search", { from = 1, sort = { "n" }, search_after = { 1 },
        stored_fields = "_none_", _source = true })
      assert.same(es_error(400, "action_request_validation_exception",
        "Validation Failed: 1: [from] parameter must be set to 0 when [search_after] is used;" ..
        "2: [stored_fields] cannot be disabled if [_source] is requested;"), b)
      st, b = search("/events-a/_search", { from = 0, size = 1, sort = { "n" }, search_after = { 0 } })
      assert.equal(200, st)
    end)
    it("term and terms on _index compare with the index name, as ES's IndexFieldType does", function()
      local function total(q, path)
        local st, b = search(path or "/events-*/_search", { query = q })
        assert.equal(200, st)
        return b.hits.total.value
      end
      assert.equal(4, total({ term = { _index = "events-a" } }))
      assert.equal(1, total({ term = { _index = { value = "events-b" } } }))
      assert.equal(0, total({ term = { _index = "EVENTS-B" } }))
      assert.equal(1, total({ term = { _index = { value = "EVENTS-B", case_insensitive = true } } }))
      assert.equal(5, total({ term = { _index = "events-*" } }))
      assert.equal(1, total({ terms = { _index = { "nope", "events-b" } } }))
      assert.equal(0, total({ terms = { _index = { "nope" } } }))
      assert.equal(1, total({ bool = { must_not = { { term = { _index = "events-a" } } } } }))
      local _, b = jreq("POST", "/events-*/_count", { query = { term = { _index = "events-b" } } })
      assert.equal(1, b.count)
    end)
    it("prefix, wildcard and match on _index compare with the index name too", function()
      local function total(q)
        local st, b = search("/events-*/_search", { query = q })
        assert.equal(200, st)
        return b.hits.total.value
      end
      assert.equal(5, total({ prefix = { _index = "events-" } }))
      assert.equal(1, total({ prefix = { _index = "events-b" } }))
      assert.equal(1, total({ prefix = { _index = { value = "EVENTS-B", case_insensitive = true } } }))
      assert.equal(4, total({ wildcard = { _index = "*-a" } }))
      assert.equal(5, total({ wildcard = { _index = "events-?" } }))
      assert.equal(1, total({ match = { _index = "events-b" } }))
      assert.equal(0, total({ match = { _index = "events" } }))
    end)
    it("max_score is null with size=0 (ES collects no top hits)", function()
      local _, b = search("/events-a/_search", { size = 0, query = { match = { title = "fox" } } })
      assert.equal(2, b.hits.total.value)
      assert.equal(cjson.null, b.hits.max_score)
      _, b = jreq("GET", "/events-a/_search?size=0")
      assert.equal(cjson.null, b.hits.max_score)
    end)
    it("expand_wildcards=none expands wildcards to nothing; bad values are ES's 400", function()
      local _, b = jreq("GET", "/events-*/_search?expand_wildcards=none")
      assert.equal(0, b.hits.total.value)
      assert.equal(0, b._shards.total)
      _, b = jreq("GET", "/events-a,events-*/_search?expand_wildcards=none")
      assert.equal(4, b.hits.total.value)
      _, b = jreq("GET", "/events-*/_search?expand_wildcards=open,hidden")
      assert.equal(5, b.hits.total.value)
      _, b = jreq("GET", "/events-*/_count?expand_wildcards=none")
      assert.equal(0, b.count)
      local st
      st, b = jreq("GET", "/events-*/_search?expand_wildcards=opn")
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "No valid expand wildcard value [opn]"), b)
    end)
    it("?q= replaces the body's query; df and friends need q", function()
      local _, b = search("/events-a/_search?q=title:whale", { query = { match_all = {} } })
      assert.equal(0, b.hits.total.value)
      _, b = search("/events-*/_search?q=title:whale", { query = { match_all = {} } })
      assert.same({ "5" }, ids(b))
      local st
      st, b = jreq("GET", "/events-a/_search?df=title&default_operator=and")
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception",
        "request [/events-a/_search] contains parameters [df, default_operator] but query string parameter 'q' is absent"), b)
      st, b = jreq("GET", "/events-a/_count?lenient=true")
      assert.same(es_error(400, "illegal_argument_exception",
        "request [/events-a/_count] contains parameters [lenient] but query string parameter 'q' is absent"), b)
      -- _count reads either the body or q: with a body, q is an unrecognized parameter
      st, b = jreq("POST", "/events-a/_count?q=title:fox", { query = { match_all = {} } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception",
        "request [/events-a/_count] contains unrecognized parameter: [q]"), b)
    end)
    it("_count honours min_score", function()
      local _, b = jreq("POST", "/events-a/_count?min_score=2", { query = { match = { title = "quick fox" } } })
      assert.equal(1, b.count)
      local st
      st, b = jreq("GET", "/events-a/_count?min_score=x")
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "Failed to parse float parameter [min_score] with value [x]"), b)
    end)
    it("?q= simple queries", function()
      local _, b = jreq("GET", "/events-*/_search?q=tag:metal")
      assert.same({ "3" }, ids(b))
      _, b = jreq("GET", "/events-*/_search?q=whale")
      assert.same({ "5" }, ids(b))
    end)
  end)

  describe("search fields and docvalue_fields", function()
    local null = cjson.null
    local function setup_ff()
      local st = jreq("PUT", "/ff", { mappings = { dynamic = false, properties = {
        brand = { properties = { name = { type = "text", fields = { keyword = { type = "keyword" } } }, code = { type = "keyword" } } },
        price = { type = "double" }, qty = { type = "integer" }, ok = { type = "boolean" }, ip = { type = "ip" },
        when = { type = "date" }, day = { type = "date", format = "yyyy/MM/dd||epoch_millis" },
        tag = { type = "keyword", ignore_above = 5 }, nv = { type = "keyword", null_value = "NONE" },
        t = { type = "text" }, copy = { type = "keyword", copy_to = "all" }, all = { type = "keyword" } } } })
      assert.equal(200, st)
      put_doc("ff", "1", { brand = { name = "Acme Corp", code = "A1" }, price = 5, qty = "7.9", ok = "true",
        ip = "::ffff:10.0.0.1", when = "2024-05-01T10:20:30Z", day = "2024/05/01", tag = { "short", "toolong" },
        nv = null, t = "Hello World", free = { x = 1, y = { "a", "b" } }, copy = "c" })
    end
    local function hit_of(body)
      local st, b = jreq("POST", "/ff/_search?filter_path=hits.hits", body)
      assert.equal(200, st, cjson.encode(b))
      return b.hits.hits[1], b
    end

    it("fields: names, patterns and multi-fields, values as the mappings make them, every value an array", function()
      setup_ff()
      local h = hit_of({ _source = false, fields = { "brand.*", "price", "qty", "ok", "ip", "when", "day", "tag",
        "nv", "t", "copy", "all", "free.x", "nope", "brand" } })
      -- unmapped (free.x), unknown (nope), objects (brand) and copy_to targets (all) are left out
      assert.same({ _index = "ff", _id = "1", _score = 1, fields = {
        ["brand.name"] = { "Acme Corp" }, ["brand.name.keyword"] = { "Acme Corp" }, ["brand.code"] = { "A1" },
        price = { 5 }, qty = { 7 }, ok = { true }, ip = { "10.0.0.1" }, when = { "2024-05-01T10:20:30.000Z" },
        day = { "2024/05/01" }, tag = { "short" }, nv = { "NONE" }, t = { "Hello World" }, copy = { "c" } } }, h)
      local _, _, raw = req("POST", "/ff/_search", { _source = false, fields = { "price" } })
      assert.truthy(raw:find('"fields":{"price":[5.0]}', 1, true), raw)
      -- without _source false, both; a hit without any of the fields has no "fields"
      h = hit_of({ fields = { "brand.code" } })
      assert.same({ "A1" }, h.fields["brand.code"])
      assert.equal("Acme Corp", h._source.brand.name)
      h = hit_of({ fields = { "nope*", "free.x" } })
      assert.same({ _index = "ff", _id = "1", _score = 1, _source = h._source }, h)
    end)

    it("fields: returns _id, _index, _version and _routing when named, as ES 8's metadata value fetchers do", function()
      setup_ff()
      assert.equal(201, (jreq("PUT", "/ff/_doc/2?routing=r&refresh=true", { qty = 1 })))
      jreq("PUT", "/ff/_doc/2?routing=r&refresh=true", { qty = 2 })
      local st, b = jreq("POST", "/ff/_search?filter_path=hits.hits", { _source = false, sort = { "_doc" },
        fields = { "_id", "_index", "_version", "_routing", "_ignored", "qty" } })
      assert.equal(200, st, cjson.encode(b))
      assert.same({ _id = { "1" }, _index = { "ff" }, _version = { 1 }, qty = { 7 } }, b.hits.hits[1].fields)
      assert.same({ _id = { "2" }, _index = { "ff" }, _version = { 2 }, _routing = { "r" }, qty = { 2 } }, b.hits.hits[2].fields)
      -- patterns never match metadata fields
      st, b = jreq("POST", "/ff/_search?filter_path=hits.hits", { _source = false, fields = { "_*", "*" }, query = { ids = { values = { "2" } } } })
      assert.same({ qty = { 2 } }, b.hits.hits[1].fields)
      -- those without a value fetcher fail the shard: 500 unsupported_operation_exception
      -- (through srv:request: ES's 500 is meant, not one of esxd's, which the robustness spec
      -- looks for)
      for _, name in ipairs({ "_source", "_seq_no", "_field_names" }) do
        local raw
        st, _, raw = srv:request("POST", "/ff/_search", cjson.encode({ fields = { name } }), JSON)
        b = cjson.decode(raw)
        assert.equal(500, st, name)
        assert.equal("search_phase_execution_exception", b.error.type)
        local want = { type = "unsupported_operation_exception", reason = "Cannot fetch values for internal field [" .. name .. "]." }
        assert.same({ want }, b.error.root_cause)
        assert.same(want, b.error.failed_shards[1].reason)
      end
    end)

    it("fields: include_unmapped returns _source values of unmapped fields", function()
      setup_ff()
      local h = hit_of({ _source = false, fields = { { field = "free.*", include_unmapped = true }, { field = "qty" } } })
      assert.same({ ["free.x"] = { 1 }, ["free.y"] = { "a", "b" }, qty = { 7 } }, h.fields)
    end)

    it("fields and docvalue_fields: a date format in the object form; other formats refused as ES does", function()
      setup_ff()
      local h = hit_of({ _source = false, fields = { { field = "when", format = "epoch_millis" },
        { field = "day", format = "yyyy-MM-dd'T'HH:mm" } },
        docvalue_fields = { { field = "when", format = "epoch_second" } } })
      assert.same({ when = { "1714558830000" }, day = { "2024-05-01T00:00" } }, h.fields)
      h = hit_of({ _source = false, docvalue_fields = { { field = "when", format = "strict_date||epoch_millis" } } })
      assert.same({ when = { "2024-05-01" } }, h.fields)
      local function fails(body, reason)
        local st, b = jreq("POST", "/ff/_search", body)
        assert.equal(400, st)
        assert.equal("search_phase_execution_exception", b.error.type)
        assert.equal("all shards failed", b.error.reason)
        assert.same({ { type = "illegal_argument_exception", reason = reason } }, b.error.root_cause)
        assert.same({ type = "illegal_argument_exception", reason = reason }, b.error.failed_shards[1].reason)
        assert.equal("ff", b.error.failed_shards[1].index)
      end
      fails({ fields = { { field = "when", format = "foo" } } }, "Invalid format: [foo]: Unknown pattern letter: f")
      fails({ docvalue_fields = { { field = "when", format = "yyyy'x" } } },
        "Invalid format: [yyyy'x]: Pattern ends with an incomplete string literal: yyyy'x")
      fails({ fields = { { field = "brand.code", format = "x" } } }, "Field [brand.code] of type [keyword] doesn't support formats.")
      fails({ fields = { { field = "qty", format = "0.0" } } }, "Field [qty] of type [integer] doesn't support formats.")
      -- no hits: no fetch phase, no failure
      local st, b = jreq("POST", "/ff/_search", { query = { term = { ["brand.code"] = "zz" } },
        fields = { { field = "when", format = "foo" } } })
      assert.equal(200, st)
      assert.equal(0, b.hits.total.value)
    end)

    it("docvalue_fields: a number format is a DecimalFormat pattern, its values strings, as ES's DocValueFormat.Decimal", function()
      setup_ff()
      put_doc("ff", "2", { price = { -1234.5, 0.125 }, qty = { 3, 12 } })
      local h = hit_of({ _source = false, query = { ids = { values = { "1" } } }, docvalue_fields = {
        { field = "price", format = "#.00" }, { field = "qty", format = "0000" } } })
      assert.same({ price = { "5.00" }, qty = { "0007" } }, h.fields)
      h = hit_of({ _source = false, query = { ids = { values = { "2" } } }, docvalue_fields = {
        { field = "price", format = "#,##0.00;(#,##0.00)" }, { field = "qty", format = "#%" } } })
      assert.same({ price = { "(1,234.50)", "0.13" }, qty = { "300%", "1200%" } }, h.fields)
      -- 8.x has no "use_field_mapping": it is a pattern like any other (all prefix, for a number;
      -- a letter java.time does not know, for a date)
      h = hit_of({ _source = false, query = { ids = { values = { "1" } } }, docvalue_fields = {
        { field = "qty", format = "use_field_mapping" } } })
      assert.same({ qty = { "use_field_mapping7" } }, h.fields)
      local function fails(body, reason)
        local st, b = jreq("POST", "/ff/_search", body)
        assert.equal(400, st)
        assert.equal("search_phase_execution_exception", b.error.type)
        assert.same({ { type = "illegal_argument_exception", reason = reason } }, b.error.root_cause)
      end
      fails({ docvalue_fields = { { field = "when", format = "use_field_mapping" } } },
        "Invalid format: [use_field_mapping]: Unknown pattern letter: f")
      fails({ docvalue_fields = { { field = "price", format = "#," } } }, 'Malformed pattern "#,"')
      fails({ docvalue_fields = { { field = "price", format = "0.0.0" } } }, 'Multiple decimal separators in pattern "0.0.0"')
      fails({ docvalue_fields = { { field = "ok", format = "0" } } }, "Field [ok] of type [boolean] doesn't support formats.")
    end)

    it("docvalue_fields: doc values (sorted, keywords once, copy_to included); text without fielddata refused", function()
      setup_ff()
      put_doc("ff", "2", { tag = { "b", "a", "b" }, qty = { 3, 1, 3 }, ok = { true, false }, copy = "z",
        brand = { name = "Zed Zed" } })
      local st, b = jreq("POST", "/ff/_search?filter_path=hits.hits", { _source = false, query = { ids = { values = { "2" } } },
        docvalue_fields = { "tag", "qty", "ok", "all", "brand.name.keyword", "nope", { field = "when" } } })
      assert.equal(200, st)
      assert.same({ { _index = "ff", _id = "2", _score = 1, fields = { tag = { "a", "b" }, qty = { 1, 3, 3 },
        ok = { false, true }, all = { "z" }, ["brand.name.keyword"] = { "Zed Zed" } } } }, b.hits.hits)
      local _, h = hit_of({ _source = false, query = { ids = { values = { "1" } } }, docvalue_fields = { "when", "price", "ip" } })
      assert.same({ when = { "2024-05-01T10:20:30.000Z" }, price = { 5 }, ip = { "10.0.0.1" } }, h.hits.hits[1].fields)
      -- ?docvalue_fields= adds to the body's
      st, b = jreq("POST", "/ff/_search?filter_path=hits.hits.fields&docvalue_fields=qty,tag", { query = { ids = { values = { "2" } } },
        docvalue_fields = { "all" } })
      assert.equal(200, st)
      assert.same({ { fields = { qty = { 1, 3, 3 }, tag = { "a", "b" }, all = { "z" } } } }, b.hits.hits)
      local reason = "Fielddata is disabled on [brand.name] in [ff]. Text fields are not optimised for operations that require per-document field data like aggregations and sorting, so these operations are disabled by default. Please use a keyword field instead. Alternatively, set fielddata=true on [brand.name] in order to load field data by uninverting the inverted index. Note that this can use significant memory."
      assert.equal(200, (jreq("PUT", "/ff2", { settings = { index = { max_docvalue_fields_search = 1 } } })))
      put_doc("ff2", "1", { a = "x" })
      st, b = jreq("POST", "/ff2/_search", { docvalue_fields = { "a*" } })
      assert.equal(400, st)
      assert.same({ { type = "illegal_argument_exception", reason = "Trying to retrieve too many docvalue_fields. " ..
        "Must be less than or equal to: [1] but was [2]. This limit can be set by changing the " ..
        "[index.max_docvalue_fields_search] index level setting." } }, b.error.root_cause)
      -- a failing index's hits are left out, the others' kept, with the failure in _shards
      st, b = jreq("POST", "/ff,ff2/_search", { _source = false, docvalue_fields = { "a*" } })
      assert.equal(200, st)
      assert.same({ "1", "2" }, ids(b))
      assert.equal("ff", b.hits.hits[1]._index)
      assert.equal(2, b._shards.total)
      assert.equal(1, b._shards.failed)
      assert.equal("ff2", b._shards.failures[1].index)
      for _, dv in ipairs({ { "brand.name" }, { "brand.*" } }) do
        st, b = jreq("POST", "/ff/_search", { docvalue_fields = dv })
        assert.equal(400, st)
        assert.equal("search_phase_execution_exception", b.error.type)
        assert.same({ { type = "illegal_argument_exception", reason = reason } }, b.error.root_cause)
      end
    end)

    it("stored_fields: the values of the fields mapped with store true, in fields; no _source", function()
      assert.equal(200, (jreq("PUT", "/sf", { mappings = { properties = { code = { type = "keyword", store = true },
        n = { type = "long", store = true }, d = { type = "date", store = true }, plain = { type = "keyword" } } } })))
      put_doc("sf", "1", { code = "x", n = "5", d = "2024-05-01", plain = "p" })
      local st, b = jreq("POST", "/sf/_search?filter_path=hits.hits", { stored_fields = { "code", "n", "d", "plain", "nope" } })
      assert.equal(200, st)
      assert.same({ { _index = "sf", _id = "1", _score = 1,
        fields = { code = { "x" }, n = { 5 }, d = { "2024-05-01T00:00:00.000Z" } } } }, b.hits.hits)
      st, b = jreq("GET", "/sf/_search?filter_path=hits.hits&stored_fields=code,plain,_source")
      assert.same({ { _index = "sf", _id = "1", _score = 1, _source = { code = "x", n = "5", d = "2024-05-01", plain = "p" },
        fields = { code = { "x" } } } }, b.hits.hits)
      st, b = jreq("POST", "/sf/_search?filter_path=hits.hits", { stored_fields = "*" })
      assert.same({ { _index = "sf", _id = "1", _score = 1,
        fields = { code = { "x" }, n = { 5 }, d = { "2024-05-01T00:00:00.000Z" } } } }, b.hits.hits)
    end)

    it("returns 400 illegal_argument_exception when stored_fields combines _none_ with other names", function()
      put_doc("sf", "1", { a = "x" })
      local want = es_error(400, "illegal_argument_exception", "cannot combine _none_ with other fields")
      for _, r in ipairs({ { "/sf/_search", { stored_fields = { "_none_", "a" } } },
          { "/sf/_search", { stored_fields = { "a", "_none_" } } }, { "/sf/_search?stored_fields=_none_,_source" },
          { "/nope/_search?stored_fields=a,_none_" } }) do
        local st, b = jreq(r[2] and "POST" or "GET", r[1], r[2])
        assert.equal(400, st, r[1])
        assert.same(want, b, r[1])
      end
      -- "_none_" alone is fine; a value that is neither a name nor a list is ES's parsing_exception
      local st, b = jreq("POST", "/sf/_search", { stored_fields = { "_none_" } })
      assert.equal(200, st)
      assert.is_nil(b.hits.hits[1]._id)
      for _, v in ipairs({ { true, "VALUE_BOOLEAN" }, { 5, "VALUE_NUMBER" }, { { a = 1 }, "START_OBJECT" } }) do
        st, b = jreq("POST", "/sf/_search", { stored_fields = v[1] })
        assert.equal(400, st)
        assert.same(es_error(400, "parsing_exception", "Expected [VALUE_STRING] or [START_ARRAY] in [stored_fields] but found [" ..
          v[2] .. "]"), b)
      end
    end)

    it("returns 400 action_request_validation_exception when stored_fields _none_ comes with a requested _source or fields", function()
      put_doc("sf", "1", { a = "x" })
      local SRC = "[stored_fields] cannot be disabled if [_source] is requested"
      local FIELDS = "[stored_fields] cannot be disabled when using the [fields] option"
      local function validation(...)
        local parts = {}
        for i, m in ipairs({ ... }) do parts[#parts + 1] = i .. ": " .. m .. ";" end
        return es_error(400, "action_request_validation_exception", "Validation Failed: " .. table.concat(parts))
      end
      -- (SearchRequest.validate, before the indices are resolved: a missing index too)
      for _, r in ipairs({
          { "/sf/_search", { stored_fields = "_none_", _source = true }, validation(SRC) },
          { "/nope/_search", { stored_fields = { "_none_" }, _source = { "a" } }, validation(SRC) },
          { "/sf/_search", { stored_fields = "_none_", _source = { includes = { "a" } } }, validation(SRC) },
          { "/sf/_search?stored_fields=_none_&_source_includes=a", nil, validation(SRC) },
          { "/sf/_search?stored_fields=_none_&_source=a", { _source = false }, validation(SRC) },
          { "/sf/_search", { stored_fields = "_none_", fields = { "a" } }, validation(FIELDS) },
          { "/sf/_search", '{"stored_fields":"_none_","_source":true,"fields":[]}', validation(SRC, FIELDS) } }) do
        local st, b = jreq(r[2] and "POST" or "GET", r[1], r[2])
        assert.equal(400, st, r[1])
        assert.same(r[3], b, r[1])
      end
      local st, b = jreq("POST", "/_msearch", '{"index":"sf"}\n{"stored_fields":"_none_","fields":["a"]}\n', NDJSON)
      assert.equal(400, st)
      assert.same(validation(FIELDS), b)
      -- _source false (here the URL's, which replaces the body's) is no request for it
      for _, r in ipairs({ { "/sf/_search", { stored_fields = "_none_", _source = false } },
          { "/sf/_search?_source=false&stored_fields=_none_", { _source = true } },
          { "/sf/_search?_source=false&_source_includes=a", { stored_fields = "_none_" } } }) do
        st, b = jreq("POST", r[1], r[2])
        assert.equal(200, st, r[1])
        assert.same({ { _index = "sf", _score = 1 } }, b.hits.hits, r[1])
      end
    end)

    it("the URL's _source, _source_includes and _source_excludes replace the body's _source", function()
      put_doc("usrc", "1", { a = "x", n = 4 })
      -- RestSearchAction: FetchSourceContext.parseFromRestRequest, when any is given, is the
      -- search's whole source context (the body's includes and false are gone)
      for _, c in ipairs({ { "?_source_includes=a", { _source = false }, { a = "x" } },
          { "?_source_excludes=a", { _source = { "a" } }, { n = 4 } },
          { "?_source=n", { _source = { includes = { "a" } } }, { n = 4 } },
          { "?_source_includes=a", { stored_fields = { "n" } }, { a = "x" } } }) do
        local st, b = jreq("POST", "/usrc/_search" .. c[1], c[2])
        assert.equal(200, st, c[1])
        assert.same(c[3], b.hits.hits[1]._source, c[1])
      end
      local st, b = jreq("POST", "/usrc/_search?_source=false&_source_includes=a", { _source = true })
      assert.equal(200, st)
      assert.is_nil(b.hits.hits[1]._source)
    end)

    it("returns 500 illegal_state_exception when a stored_fields entry is null, an object or an array", function()
      put_doc("sf", "1", { a = "x" })
      -- ES 8.15's StoredFieldsContext reads each entry with parser.text(): Jackson's location
      -- of the token, 1-based (srv:request: the "no 500" spec watches req())
      for _, c in ipairs({ { '{"stored_fields":["a",null]}', "VALUE_NULL at 1:23" },
          { '{"stored_fields":["a",{"b":1}]}', "START_OBJECT at 1:23" },
          { '{"query":{"match_all":{}},\n  "stored_fields" : [ [ "a" ] ]}', "START_ARRAY at 2:23" },
          { '{"stored_fields":[[]]}', "START_ARRAY at 1:19" } }) do
        local st, _, raw = srv:request("POST", "/sf/_search", c[1], JSON)
        assert.equal(500, st, c[1])
        assert.same(es_error(500, "illegal_state_exception", "Can't get text on a " .. c[2]), cjson.decode(raw), c[1])
      end
      local st, _, raw = srv:request("POST", "/_msearch", '{}\n{"stored_fields":[1, true, null]}\n', NDJSON)
      assert.equal(500, st)
      assert.same(es_error(500, "illegal_state_exception", "Can't get text on a VALUE_NULL at 1:28"), cjson.decode(raw))
    end)

    it("fields / docvalue_fields parse errors are ES's", function()
      setup_ff()
      local st, b = jreq("POST", "/ff/_search", { fields = "when" })
      assert.equal(400, st)
      assert.same(es_error(400, "parsing_exception", "Unknown key for a VALUE_STRING in [fields]."), b)
      st, b = jreq("POST", "/ff/_search", { docvalue_fields = { when = 1 } })
      assert.same(es_error(400, "parsing_exception", "Unknown key for a START_OBJECT in [docvalue_fields]."), b)
      st, b = jreq("POST", "/ff/_search", { fields = { { field = "when", bogus = 1 } } })
      assert.equal(400, st)
      assert.same(es_error(400, "x_content_parse_exception", "[fetch_field_and_format] unknown field [bogus]"), b)
      st, b = jreq("POST", "/ff/_search", { fields = { { "when" } } })
      assert.same(es_error(400, "x_content_parse_exception", "[fetch_field_and_format] Expected START_OBJECT but was: START_ARRAY"), b)
    end)
  end)

  describe("aggregations", function()
    before_each(function()
      local lines = {}
      local docs = {
        { site = "a", ms = 10, ts = "2024-01-01T00:00:05Z", user = "u1" },
        { site = "a", ms = 20, ts = "2024-01-01T00:00:55Z", user = "u2" },
        { site = "a", ms = 30, ts = "2024-01-01T00:01:10Z", user = "u1" },
        { site = "b", ms = 5, ts = 1704067330000, user = "u3" },
        { site = "c", ms = 1, ts = "2024-01-01T00:03:00Z" },
      }
      for i, d in ipairs(docs) do
        lines[#lines + 1] = cjson.encode({ index = { _index = "agg", _id = tostring(i) } })
        lines[#lines + 1] = cjson.encode(d)
      end
      req("PUT", "/agg", { mappings = { properties = { site = { type = "keyword" }, user = { type = "keyword" }, ts = { type = "date" } } } })
      assert.equal(200, (req("POST", "/_bulk?refresh=true", table.concat(lines, "\n") .. "\n", NDJSON)))
    end)
    local function aggs(spec, query)
      local st, b = jreq("POST", "/agg/_search", { size = 0, aggs = spec, query = query })
      assert.equal(200, st, cjson.encode(b))
      return b.aggregations, b
    end

    it("terms on _index buckets the documents by their index's name, as ES does", function()
      put_doc("agg2", "1", { site = "z", ms = 7 })
      local st, b = jreq("POST", "/agg,agg2/_search", { size = 0,
        aggs = { x = { terms = { field = "_index" }, aggs = { t = { sum = { field = "ms" } } } } } })
      assert.equal(200, st, cjson.encode(b))
      assert.same({ { key = "agg", doc_count = 5, t = { value = 66 } }, { key = "agg2", doc_count = 1, t = { value = 7 } } },
        b.aggregations.x.buckets)
    end)
    it("_id has no field data to aggregate on in ES 8: the shard failure sort gives", function()
      local reason = "Fielddata access on the _id field is disallowed, you can re-enable it by updating the dynamic " ..
        "cluster setting: indices.id_field_data.enabled"
      for _, spec in ipairs({ { x = { terms = { field = "_id" } } }, { x = { cardinality = { field = "_id" } } },
          { x = { value_count = { field = "_id" } } } }) do
        local st, b = jreq("POST", "/agg/_search", { size = 0, aggs = spec })
        assert.equal(400, st, cjson.encode(spec))
        assert.equal("search_phase_execution_exception", b.error.type)
        assert.same({ { type = "illegal_argument_exception", reason = reason } }, b.error.root_cause)
        assert.equal("agg", b.error.failed_shards[1].index)
      end
    end)
    it("terms with size, sum_other_doc_count and sub-aggregations", function()
      local a, b = aggs({ sites = { terms = { field = "site", size = 2 }, aggs = { total = { sum = { field = "ms" } } } } })
      assert.same({}, b.hits.hits)
      assert.same({ doc_count_error_upper_bound = 0, sum_other_doc_count = 1, buckets = {
        { key = "a", doc_count = 3, total = { value = 60 } },
        { key = "b", doc_count = 1, total = { value = 5 } },
      } }, a.sites)
    end)
    it("terms order by _key and by a metric", function()
      local a = aggs({ s = { terms = { field = "site", order = { _key = "desc" } } } })
      assert.equal("c", a.s.buckets[1].key)
      a = aggs({ s = { terms = { field = "site", order = { m = "asc" } }, aggs = { m = { max = { field = "ms" } } } } })
      assert.same({ "c", "b", "a" }, { a.s.buckets[1].key, a.s.buckets[2].key, a.s.buckets[3].key })
    end)
    it("terms on a text field is refused", function()
      jreq("PUT", "/txt/_doc/1?refresh=true", { t = "hello" })
      local st, b = jreq("POST", "/txt/_search", { aggs = { x = { terms = { field = "t" } } } })
      assert.equal(400, st)
      assert.equal("search_phase_execution_exception", b.error.type)
      -- the failure names the index, as ES's shard failure does
      assert.equal("txt", b.error.failed_shards[1].index)
      assert.matches("^Fielddata is disabled on %[t%] in %[txt%]%.", b.error.root_cause[1].reason)
      -- the shard failed with Java's IllegalArgumentException: ES's caused_by is the
      -- ElasticsearchException guessRootCauses wraps it in, named after it and caused by it
      local r = b.error.root_cause[1].reason
      assert.same({ type = "illegal_argument_exception", reason = r }, b.error.failed_shards[1].reason)
      assert.same({ type = "illegal_argument_exception", reason = r,
        caused_by = { type = "illegal_argument_exception", reason = r } }, b.error.caused_by)
      -- with another index whose shards can aggregate, the search has partial results
      st, b = jreq("POST", "/txt,agg/_search", { aggs = { x = { value_count = { field = "t" } } } })
      assert.equal(200, st)
      assert.equal("txt", b._shards.failures[1].index)
      assert.equal(1, b._shards.failed)
      assert.equal(0, b.aggregations.x.value)
      local _, ok = jreq("POST", "/txt/_search", { aggs = { x = { terms = { field = "t.keyword" } } } })
      assert.same({ { key = "hello", doc_count = 1 } }, ok.aggregations.x.buckets)
    end)
    it("date_histogram with fixed_interval and calendar_interval", function()
      local a = aggs({ h = { date_histogram = { field = "ts", fixed_interval = "1m" } } })
      assert.same({ buckets = {
        { key_as_string = "2024-01-01T00:00:00.000Z", key = 1704067200000, doc_count = 2 },
        { key_as_string = "2024-01-01T00:01:00.000Z", key = 1704067260000, doc_count = 1 },
        { key_as_string = "2024-01-01T00:02:00.000Z", key = 1704067320000, doc_count = 1 },
        { key_as_string = "2024-01-01T00:03:00.000Z", key = 1704067380000, doc_count = 1 },
      } }, a.h)
      a = aggs({ h = { date_histogram = { field = "ts", calendar_interval = "hour" },
        aggs = { u = { cardinality = { field = "user" } } } } })
      assert.same({ buckets = { { key_as_string = "2024-01-01T00:00:00.000Z", key = 1704067200000, doc_count = 5,
        u = { value = 3 } } } }, a.h)
      a = aggs({ h = { date_histogram = { field = "ts", fixed_interval = "30s", min_doc_count = 1 } } })
      assert.equal(5, #a.h.buckets)
      a = aggs({ h = { date_histogram = { field = "ts", fixed_interval = "30s" } } })
      assert.equal(7, #a.h.buckets)
      assert.equal(0, a.h.buckets[4].doc_count)
      a = aggs({ h = { date_histogram = { field = "ts", calendar_interval = "1d" } } })
      assert.equal("2024-01-01T00:00:00.000Z", a.h.buckets[1].key_as_string)
      local st, b = jreq("POST", "/agg/_search", { size = 0, aggs = { h = { date_histogram = { field = "ts", fixed_interval = "1x" } } } })
      assert.equal(400, st)
      assert.equal("illegal_argument_exception", b.error.type)
    end)
    it("numeric metrics and histograms refuse keyword, text and ip fields, as ES's values source registry does", function()
      assert.equal(200, (req("PUT", "/aip", { mappings = { properties = { addr = { type = "ip" } } } })))
      put_doc("aip", "1", { addr = "::1" })
      for _, c in ipairs({ { "sum", { field = "site" }, "keyword" }, { "avg", { field = "user" }, "keyword" },
          { "min", { field = "addr" }, "ip", "aip" }, { "stats", { field = "site" }, "keyword" },
          { "histogram", { field = "site", interval = 1 }, "keyword" },
          { "date_histogram", { field = "site", fixed_interval = "1d" }, "keyword" } }) do
        local index = c[4] or "agg"
        local st, b = jreq("POST", "/" .. index .. "/_search", { size = 0, aggs = { x = { [c[1]] = c[2] } } })
        assert.equal(400, st, c[1])
        local r = "Field [" .. c[2].field .. "] of type [" .. c[3] .. "] is not supported for aggregation [" .. c[1] .. "]"
        assert.equal("search_phase_execution_exception", b.error.type)
        assert.same({ { type = "illegal_argument_exception", reason = r } }, b.error.root_cause)
        assert.equal(index, b.error.failed_shards[1].index)
      end
      -- a text field without fielddata fails on its field data first, histograms included
      jreq("PUT", "/txt/_doc/1?refresh=true", { t = "hello" })
      local st, b = jreq("POST", "/txt/_search", { aggs = { x = { date_histogram = { field = "t", fixed_interval = "1d" } } } })
      assert.equal(400, st)
      assert.matches("^Fielddata is disabled on %[t%] in %[txt%]%.", b.error.root_cause[1].reason)
      -- numbers, dates and booleans are fine; an unmapped field has no value
      local a = aggs({ s = { sum = { field = "ms" } }, m = { max = { field = "ts" } }, n = { sum = { field = "nope" } } })
      assert.same({ value = 66 }, a.s)
      assert.same({ value = 0 }, a.n)
    end)
    it("date_histogram on an epoch-millis long field has no key_as_string", function()
      req("POST", "/_bulk?refresh=true", '{"index":{"_index":"longts"}}\n{"t":1704067205000}\n{"index":{"_index":"longts"}}\n{"t":1704067265000}\n', NDJSON)
      local st, b = jreq("POST", "/longts/_search", { size = 0, aggs = { h = { date_histogram = { field = "t", fixed_interval = "1m" } } } })
      assert.equal(200, st)
      assert.same({ buckets = { { key = 1704067200000, doc_count = 1 }, { key = 1704067260000, doc_count = 1 } } }, b.aggregations.h)
    end)
    it("metrics: sum, min, max, avg, value_count, cardinality", function()
      local a = aggs({
        sum = { sum = { field = "ms" } }, min = { min = { field = "ms" } }, max = { max = { field = "ms" } },
        avg = { avg = { field = "ms" } }, cnt = { value_count = { field = "user" } }, card = { cardinality = { field = "user" } },
        nomin = { min = { field = "absent" } } })
      assert.same({ value = 66 }, a.sum)
      assert.same({ value = 1 }, a.min)
      assert.same({ value = 30 }, a.max)
      assert.same({ value = 13.2 }, a.avg)
      assert.same({ value = 4 }, a.cnt)
      assert.same({ value = 3 }, a.card)
      assert.same({ value = cjson.null }, a.nomin)
    end)
    it("metrics on a date or boolean field carry their values as strings: sum, avg, stats too", function()
      -- InternalSum / InternalAvg / InternalStats print *_as_string with the field's format
      -- whenever it is not RAW, as min and max do
      assert.equal(200, (req("PUT", "/dstats", { mappings = { properties = { d = { type = "date" } } } })))
      put_doc("dstats", "1", { d = "2024-01-01T00:00:00Z" }, false)
      put_doc("dstats", "2", { d = "2024-01-02T00:00:00.001Z" })
      local st, b = jreq("POST", "/dstats/_search", { size = 0, aggs = {
        s = { sum = { field = "d" } }, a = { avg = { field = "d" } }, st = { stats = { field = "d" } } } })
      assert.equal(200, st)
      local r = b.aggregations
      assert.same({ value = 3408220800001, value_as_string = "2078-01-01T00:00:00.001Z" }, r.s)
      assert.same({ value = 1704110400000.5, value_as_string = "2024-01-01T12:00:00.000Z" }, r.a)
      assert.same({ count = 2, min = 1704067200000, max = 1704153600001, avg = 1704110400000.5, sum = 3408220800001,
        min_as_string = "2024-01-01T00:00:00.000Z", max_as_string = "2024-01-02T00:00:00.001Z",
        avg_as_string = "2024-01-01T12:00:00.000Z", sum_as_string = "2078-01-01T00:00:00.001Z" }, r.st)
      -- and none without values
      st, b = jreq("POST", "/dstats/_search", { size = 0, query = { match_none = {} }, aggs = {
        a = { avg = { field = "d" } }, st = { stats = { field = "d" } } } })
      assert.same({ value = cjson.null }, b.aggregations.a)
      assert.is_nil(b.aggregations.st.min_as_string)
      -- a boolean field's DocValueFormat prints "true" for anything but 0
      put_doc("bstats", "1", { f = true }, false)
      put_doc("bstats", "2", { f = false })
      st, b = jreq("POST", "/bstats/_search", { size = 0, aggs = { mn = { min = { field = "f" } },
        a = { avg = { field = "f" } }, st = { stats = { field = "f" } } } })
      assert.same({ value = 0, value_as_string = "false" }, b.aggregations.mn)
      assert.same({ value = 0.5, value_as_string = "true" }, b.aggregations.a)
      assert.same({ count = 2, min = 0, max = 1, avg = 0.5, sum = 1, min_as_string = "false",
        max_as_string = "true", avg_as_string = "true", sum_as_string = "true" }, b.aggregations.st)
    end)
    it("returns 400 naming the aggregation, not its type, for a terms size or histogram interval out of range", function()
      local st, b = jreq("POST", "/_search", { size = 0, aggs = { by_site = { terms = { field = "site", size = 0 } } } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "[size] must be greater than 0. Found [0] in [by_site]"), b)
      st, b = jreq("POST", "/_search", { size = 0, aggs = { hist = { histogram = { field = "ms", interval = 0 } } } })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "[interval] must be >0 for histogram aggregation [hist]"), b)
    end)
    it("returns 400 for a terms order on _term, which ES 8 no longer takes for _key", function()
      local st, b = jreq("POST", "/_search", { size = 0, aggs = { s = { terms = { field = "site", order = { _term = "asc" } } } } })
      assert.equal(400, st)
      assert.matches("^Invalid aggregation order path %[_term%]%. The provided aggregation %[_term%] either does not exist",
        b.error.root_cause[1].reason)
      st, b = jreq("POST", "/_search", { size = 0, aggs = { s = { terms = { field = "site", order = { _key = "asc" } } } } })
      assert.equal(200, st)
    end)
    it("aggregations respect the query", function()
      local a = aggs({ s = { terms = { field = "site" } } }, { range = { ms = { gte = 10 } } })
      assert.same({ { key = "a", doc_count = 3 } }, a.s.buckets)
    end)
    it("aggregation options that ES does not know or esxd does not implement are refused", function()
      for _, c in ipairs({ { "terms", { field = "site", include = "a.*" } },
          { "terms", { field = "site", missing = "none" } },
          { "terms", { field = "site", sizee = 3 } },
          { "date_histogram", { field = "ts", fixed_interval = "1h", time_zone = "+01:00" } },
          { "date_histogram", { field = "ts", fixed_interval = "1h", offset = "+30m" } },
          { "date_histogram", { field = "ts", fixed_interval = "1h", extended_bounds = { min = 0, max = 1 } } },
          { "histogram", { field = "ms", interval = 2, keyed = true } },
          { "sum", { field = "ms", missing = 0 } },
          { "avg", { field = "ms", script = "x" } } }) do
        local st, b = jreq("POST", "/agg/_search", { size = 0, aggs = { x = { [c[1]] = c[2] } } })
        assert.equal(400, st, cjson.encode(c[2]))
        assert.equal("x_content_parse_exception", b.error.type, cjson.encode(c[2]))
        assert.matches("^%[" .. c[1] .. "%] unknown field %[", b.error.reason)
      end
      local st = jreq("POST", "/agg/_search", { size = 0, aggs = { x = { terms = { field = "site",
        shard_size = 5, execution_hint = "map", show_term_doc_count_error = false } },
        y = { date_histogram = { field = "ts", fixed_interval = "1h", time_zone = "UTC" } },
        z = { cardinality = { field = "ms", precision_threshold = 100 } } } })
      assert.equal(200, st)
    end)
    it("typed_keys prefixes aggregation names with their result type, sub-aggregations too", function()
      req("PUT", "/agg/_doc/9?refresh=true", { site = "d", ratio = 2.5, flag = true })
      local st, b = jreq("POST", "/agg/_search?typed_keys", { size = 0, aggs = {
        by_site = { terms = { field = "site" }, aggs = { total = { sum = { field = "ms" } },
          per_min = { date_histogram = { field = "ts", fixed_interval = "1m" } } } },
        by_ratio = { terms = { field = "ratio" } }, by_ms = { terms = { field = "ms" } }, by_flag = { terms = { field = "flag" } },
        by_ts = { terms = { field = "ts" } }, none = { terms = { field = "nope" } },
        h = { histogram = { field = "ms", interval = 10 } }, st = { stats = { field = "ms" } },
        c = { cardinality = { field = "user" } } } })
      assert.equal(200, st)
      local names = {}
      for k in pairs(b.aggregations) do names[#names + 1] = k end
      table.sort(names)
      assert.same({ "cardinality#c", "dterms#by_ratio", "histogram#h", "lterms#by_flag", "lterms#by_ms",
        "lterms#by_ts", "stats#st", "sterms#by_site", "umterms#none" }, names)
      local bucket = b.aggregations["sterms#by_site"].buckets[1]
      assert.is_table(bucket["sum#total"])
      assert.is_table(bucket["date_histogram#per_min"])
      assert.is_nil(bucket.total)
      _, b = jreq("POST", "/_msearch?typed_keys=true", '{"index":"agg"}\n{"size":0,"aggs":{"t":{"terms":{"field":"site"}}}}\n', NDJSON)
      assert.is_table(b.responses[1].aggregations["sterms#t"])
      _, b = jreq("POST", "/agg/_search?typed_keys=false", { size = 0, aggs = { t = { terms = { field = "site" } } } })
      assert.is_table(b.aggregations.t)
    end)
    it("returns ES's parse errors for aggregation definitions that are not objects, at any depth", function()
      local function perr(body, reason)
        local st, b = jreq("POST", "/agg/_search", body)
        assert.equal(400, st, body)
        assert.same(es_error(400, "parsing_exception", reason), b)
      end
      perr('{"aggs":{"a":[]}}', "Aggregation definition for [a starts with a [START_ARRAY], expected a [START_OBJECT].")
      perr('{"aggs":{"a":"x"}}', "Aggregation definition for [a starts with a [VALUE_STRING], expected a [START_OBJECT].")
      perr('{"aggs":{"a":{"terms":[]}}}', "Expected [START_OBJECT] under [terms], but got a [START_ARRAY] in [a]")
      perr('{"aggs":{"a":{"terms":{"field":"site"},"aggs":[]}}}', "Expected [START_OBJECT] under [aggs], but got a [START_ARRAY] in [a]")
      perr('{"aggs":{"a":{"terms":{"field":"site"},"meta":5}}}', "Expected [START_OBJECT] under [meta], but got a [VALUE_NUMBER] in [a]")
      perr('{"aggs":{"a":{"terms":{"field":"site"},"aggs":{"b":{"sum":[]}}}}}', "Expected [START_OBJECT] under [sum], but got a [START_ARRAY] in [b]")
      perr('{"aggs":{"a>b":{"terms":{"field":"site"}}}}',
        "Invalid aggregation name [a>b]. Aggregation names can contain any character except '[', ']', and '>'")
      perr('{"aggs":{"a":{"terms":{"field":"site"},"aggs":{},"aggregations":{}}}}', "Found two sub aggregation definitions under [a]")
    end)
    it("returns a 400 for a malformed sub-aggregation even where no bucket runs it, or the index is missing", function()
      -- ES parses the whole aggregation tree before any shard runs
      local st, b = jreq("POST", "/agg/_search", '{"query":{"match_none":{}},"aggs":{"a":{"terms":{"field":"site"},"aggs":{"b":{"bogus":{}}}}}}')
      assert.equal(400, st)
      assert.equal("Unknown aggregation type [bogus]", b.error.reason)
      st, b = jreq("POST", "/agg/_search", '{"query":{"match_none":{}},"aggs":{"a":{"terms":{"field":"site"},"aggs":{"b":{}}}}}')
      assert.equal(400, st)
      assert.same(es_error(400, "parsing_exception", "Missing definition for aggregation [b]"), b)
      st, b = jreq("POST", "/agg/_search", '{"query":{"match_none":{}},"aggs":{"a":{"terms":{"field":"site"},"aggs":{"b":{"sum":{"field":"ms","bogus":1}}}}}}')
      assert.equal(400, st)
      assert.same(es_error(400, "x_content_parse_exception", "[sum] unknown field [bogus]"), b)
      st, b = jreq("POST", "/missing/_search", '{"aggs":{"a":[]}}')
      assert.equal(400, st)
      assert.equal("parsing_exception", b.error.type)
    end)
    it("refuses a sub-aggregation under a metric aggregation with ES 8.14+'s illegal_argument_exception", function()
      -- LeafOnly.subAggregations throws IllegalArgumentException since elastic/elasticsearch#106074
      -- (before 8.14: aggregation_initialization_exception, a 500); parseAggregators parses the
      -- sub-aggregations first, so a malformed one is reported instead
      local reason = "Aggregator [m] of type [max] cannot accept sub-aggregations"
      local st, b = jreq("POST", "/agg/_search", '{"aggs":{"m":{"max":{"field":"ms"},"aggs":{"x":{"terms":{"field":"site"}}}}}}')
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", reason), b)
      st, b = jreq("POST", "/missing/_search", '{"aggs":{"s":{"terms":{"field":"site"},"aggs":{"m":{"max":{"field":"ms"},"aggs":{"x":{"avg":{"field":"ms"}}}}}}}}')
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", reason), b)
      st, b = jreq("POST", "/agg/_search", '{"aggs":{"m":{"max":{"field":"ms"},"aggs":{"x":{"bogus":{}}}}}}')
      assert.equal(400, st)
      assert.equal("Unknown aggregation type [bogus]", b.error.reason)
    end)
    it("returns ES's parsing_exception for an unknown aggregation type, with its suggestions", function()
      local function unknown(kind, reason)
        local st, b = jreq("POST", "/agg/_search", { aggs = { x = { [kind] = {} } } })
        assert.equal(400, st)
        local want = es_error(400, "parsing_exception", reason)
        want.error.caused_by = { type = "named_object_not_found_exception", reason = "[1:1] unknown field [" .. kind .. "]" }
        assert.same(want, b)
      end
      unknown("bogus", "Unknown aggregation type [bogus]")
      unknown("term", "Unknown aggregation type [term] did you mean [terms]?")
      unknown("avgg", "Unknown aggregation type [avgg] did you mean [avg]?")
    end)
  end)

  describe("allow_no_indices", function()
    it("returns 404 when allow_no_indices=false and _all, *, a wildcard or the whole expression match nothing", function()
      -- IndexNameExpressionResolver: each wildcard must match, and so must the expression
      -- (esxd let _all and * through, and checked only the whole expression)
      local all = es_error(404, "index_not_found_exception", "no such index [_all] and no indices exist",
        { ["resource.type"] = "index_or_alias", ["resource.id"] = "_all", index_uuid = "_na_", index = "_all" })
      for _, path in ipairs({ "/_search", "/_all/_search", "/_count", "/_all/_count" }) do
        local st, b = jreq("GET", path .. "?allow_no_indices=false")
        assert.equal(404, st, path)
        assert.same(all, b, path)
      end
      local st, b = jreq("GET", "/*/_search?allow_no_indices=false")
      assert.equal(404, st)
      assert.same(not_found("*"), b)
      st, b = jreq("POST", "/_msearch", '{"index":"_all","allow_no_indices":false}\n{}\n', NDJSON)
      assert.equal(200, st)
      assert.same(all, b.responses[1])
      put_doc("anx1", "1", { a = 1 })
      assert.equal(200, (jreq("GET", "/_all/_search?allow_no_indices=false")))
      assert.equal(200, (jreq("GET", "/*/_count?allow_no_indices=false")))
      -- a wildcard that matches nothing fails even beside indices that exist
      st, b = jreq("GET", "/anx1,nomatch-*/_search?allow_no_indices=false")
      assert.equal(404, st)
      assert.same(not_found("nomatch-*"), b)
      st, b = jreq("GET", "/nomatch-a*,nomatch-b*/_search?allow_no_indices=false")
      assert.same(not_found("nomatch-a*"), b)
      assert.equal(200, (jreq("GET", "/anx1,nomatch-*/_search")))
      -- several expressions resolving to nothing
      st, b = jreq("GET", "/anx*,-anx1/_search?allow_no_indices=false")
      assert.equal(404, st)
      assert.same(es_error(404, "index_not_found_exception", "no such index [null]",
        { ["resource.type"] = "index_expression", ["resource.id"] = { "anx*", "-anx1" } }), b)
      st, b = jreq("GET", "/nope1,nope2/_search?allow_no_indices=false&ignore_unavailable=true")
      assert.equal(404, st)
      assert.same({ "nope1", "nope2" }, b.error["resource.id"])
      assert.equal(200, (jreq("GET", "/nope1,nope2/_search?ignore_unavailable=true")))
    end)
  end)

  describe("_count and _msearch", function()
    before_each(function()
      req("POST", "/_bulk?refresh=true", '{"index":{"_index":"c1","_id":"1"}}\n{"k":"a"}\n{"index":{"_index":"c1","_id":"2"}}\n{"k":"b"}\n', NDJSON)
    end)
    it("_count with and without a query", function()
      local st, b = jreq("GET", "/c1/_count")
      assert.equal(200, st)
      assert.same({ count = 2, _shards = { total = 1, successful = 1, skipped = 0, failed = 0 } }, b)
      st, b = jreq("POST", "/c1/_count", { query = { term = { ["k.keyword"] = "a" } } })
      assert.equal(1, b.count)
      st, b = jreq("POST", "/_count", { query = { match_all = {} } })
      assert.equal(2, b.count)
      st, b = jreq("POST", "/c1/_count", { size = 1 })
      assert.equal(400, st)
      assert.equal("parsing_exception", b.error.type)
      st, b = jreq("GET", "/nope/_count")
      assert.equal(404, st)
      assert.same(not_found("nope"), b)
    end)
    it("_count fails a shard's query like _search does (search_phase_execution_exception)", function()
      -- ES's RestCountAction runs a size-0 search: a bound the date field cannot parse fails
      -- the shard, and the answer is "all shards failed" with a query_shard_exception caused by
      -- the parse_exception as root cause
      assert.equal(200, (req("PUT", "/cdate", { mappings = { properties = { d = { type = "date" } } } })))
      put_doc("cdate", "1", { d = "2024-01-01T00:00:00Z" })
      local q = { query = { range = { d = { gte = "abc" } } } }
      local _, sb = jreq("POST", "/cdate/_search", q)
      local st, b = jreq("POST", "/cdate/_count", q)
      assert.equal(400, st)
      assert.equal("search_phase_execution_exception", b.error.type)
      assert.equal("all shards failed", b.error.reason)
      query_shard_failure(b, "cdate", "parse_exception",
        "failed to parse date field [abc] with format [strict_date_optional_time||epoch_millis]")
      assert.same(sb, b)
    end)
    it("_msearch returns one response per header/body pair with status", function()
      local body = '{"index":"c1"}\n{"query":{"match_all":{}}}\n{"index":"missing"}\n{}\n{}\n{"size":0}\n'
      local st, b = jreq("POST", "/_msearch", body, NDJSON)
      assert.equal(200, st)
      assert.equal(3, #b.responses)
      assert.equal(200, b.responses[1].status)
      assert.equal(2, b.responses[1].hits.total.value)
      assert.same(not_found("missing"), b.responses[2])
      assert.equal(200, b.responses[3].status)
      st, b = jreq("POST", "/c1/_msearch", '{}\n{"query":{"term":{"k.keyword":"b"}}}\n', NDJSON)
      assert.same({ "2" }, ids(b.responses[1]))
      st, b = jreq("POST", "/_msearch", '{}\n{}', NDJSON)
      assert.equal(400, st)
      assert.equal("The msearch request must be terminated by a newline [\\n]", b.error.reason)
    end)
    it("_msearch: a malformed search body fails the whole request, a missing index only its item", function()
      local st, b = jreq("POST", "/_msearch", '{"index":"c1"}\n{}\n{"index":"c1"}\n{"query":{"nope":{}}}\n', NDJSON)
      assert.equal(400, st)
      assert.equal("parsing_exception", b.error.type)
      assert.equal("unknown query [nope]", b.error.reason)
      st, b = jreq("POST", "/_msearch", '{"index":"c1"}\n{"size":-1}\n', NDJSON)
      assert.equal(400, st)
      assert.equal("illegal_argument_exception", b.error.type)
      st, b = jreq("POST", "/_msearch", '{"index":"c1"}\n{"from":9999,"size":10}\n{"index":"zz"}\n{}\n', NDJSON)
      assert.equal(200, st)
      assert.equal("search_phase_execution_exception", b.responses[1].error.type)
      assert.same(not_found("zz"), b.responses[2])
    end)
    it("_msearch validates every search before running any: all their messages in one 400, in order", function()
      -- MultiSearchRequest.validate gathers each SearchRequest.validate's messages; nothing runs
      -- (a missing index is not an item error then), and a body that does not parse anywhere
      -- fails first, as RestMultiSearchAction parses the whole request before validating it
      local body = '{"index":"c1"}\n{"from":1,"sort":["k.keyword"],"search_after":["a"]}\n' ..
        '{"index":"missing"}\n{}\n' ..
        '{"index":"c1"}\n{"stored_fields":"_none_","_source":true,"fields":["k"]}\n'
      local st, b = jreq("POST", "/_msearch", body, NDJSON)
      assert.equal(400, st)
      assert.same(es_error(400, "action_request_validation_exception",
        "Validation Failed: 1: [from] parameter must be set to 0 when [search_after] is used;" ..
        "2: [stored_fields] cannot be disabled if [_source] is requested;" ..
        "3: [stored_fields] cannot be disabled when using the [fields] option;"), b)
      st, b = jreq("POST", "/_msearch", body .. '{}\n{"query":{"nope":{}}}\n', NDJSON)
      assert.equal(400, st)
      assert.equal("parsing_exception", b.error.type)
      -- a header without a search body adds no search: ES's "no requests added"
      st, b = jreq("POST", "/_msearch", '{"index":"c1"}\n', NDJSON)
      assert.equal(400, st)
      assert.same(es_error(400, "action_request_validation_exception", "Validation Failed: 1: no requests added;"), b)
    end)
    it("_msearch refuses header keys ES does not know, and honours allow_no_indices", function()
      local st, b = jreq("POST", "/_msearch", '{"index":"c1","size":1}\n{}\n', NDJSON)
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "key [size] is not supported in the metadata section"), b)
      st, b = jreq("POST", "/_msearch", '{"index":"nomatch-*","allow_no_indices":false,"preference":"x"}\n{}\n', NDJSON)
      assert.equal(200, st)
      assert.same(not_found("nomatch-*"), b.responses[1])
    end)
  end)

  describe("Elasticsearch YAML REST tests (es-spec/yaml-tests)", function()
    it("search/60_query_string: q with df, default_operator, wildcards, lenient", function()
      jreq("PUT", "/test", { mappings = { properties = { number = { type = "integer" } } } })
      jreq("PUT", "/test/_doc/1", { field = "foo bar" })
      jreq("POST", "/test/_refresh")
      local function total(qs)
        local st, b = jreq("GET", "/test/_search?rest_total_hits_as_int=true&" .. qs)
        assert.equal(200, st, qs)
        return b.hits.total
      end
      assert.equal(1, total("q=bar&df=field"))
      assert.equal(1, total("q=field:foo%20field:xyz"))
      assert.equal(0, total("q=field:foo%20field:xyz&default_operator=AND"))
      assert.equal(1, total("q=field:BA*"))
      assert.equal(0, total("q=number:foo&lenient=true"))
      local st = jreq("GET", "/test/_search?q=number:foo")
      assert.equal(400, st)
      local _, b = jreq("POST", "/test/_search", { query = { query_string = { query = '"foo bar"', default_field = "field" } } })
      assert.equal(1, b.hits.total.value)
    end)
    it("search/100_stored_fields", function()
      jreq("PUT", "/test/_doc/1?refresh=true", { foo = "bar" })
      local _, b = jreq("POST", "/test/_search", '{"stored_fields":[]}')
      assert.equal("1", b.hits.hits[1]._id)
      assert.is_nil(b.hits.hits[1]._source)
      _, b = jreq("POST", "/test/_search", { stored_fields = "_none_" })
      assert.is_nil(b.hits.hits[1]._id)
      assert.is_nil(b.hits.hits[1]._source)
      _, b = jreq("POST", "/test/_search", { stored_fields = { "_none_" } })
      assert.is_nil(b.hits.hits[1]._id)
    end)
    it("search/171_term_query: term on a blank keyword, case insensitive", function()
      jreq("PUT", "/kw", { mappings = { properties = { keyword_field = { type = "keyword" } } } })
      req("POST", "/_bulk?refresh=true", '{"index":{"_index":"kw","_id":"1"}}\n{"keyword_field":""}\n', NDJSON)
      local _, b = jreq("POST", "/kw/_search?rest_total_hits_as_int=true", { query = { term = { keyword_field = { value = "" } } } })
      assert.equal(1, b.hits.total)
      _, b = jreq("POST", "/kw/_search?rest_total_hits_as_int=true", { query = { term = { keyword_field = { value = "", case_insensitive = true } } } })
      assert.equal(1, b.hits.total)
    end)
    it("search/220_total_hits_object over _all", function()
      local lines = {}
      for _, d in ipairs({ { "test_1", "1", "bar" }, { "test_1", "3", "baz" }, { "test_1", "2", "bar" }, { "test_1", "4", "bar" },
        { "test_2", "42", "bar" }, { "test_2", "24", "baz" }, { "test_2", "36", "bar" } }) do
        lines[#lines + 1] = cjson.encode({ index = { _index = d[1], _id = d[2] } })
        lines[#lines + 1] = cjson.encode({ foo = d[3] })
      end
      req("POST", "/_bulk?refresh=true", table.concat(lines, "\n") .. "\n", NDJSON)
      local q = { query = { match = { foo = "bar" } } }
      local _, b = jreq("POST", "/_all/_search", q)
      assert.same({ value = 5, relation = "eq" }, b.hits.total)
      _, b = jreq("POST", "/test_1/_search", q)
      assert.same({ value = 3, relation = "eq" }, b.hits.total)
      _, b = jreq("POST", "/_search?track_total_hits=4", q)
      assert.same({ value = 4, relation = "gte" }, b.hits.total)
      _, b = jreq("POST", "/_search?track_total_hits=5&size=0", q)
      assert.same({ value = 5, relation = "eq" }, b.hits.total)
      _, b = jreq("POST", "/_all/_search?track_total_hits=false&rest_total_hits_as_int=true", q)
      assert.equal(-1, b.hits.total)
      _, b = jreq("POST", "/test_2/_search?rest_total_hits_as_int=true", q)
      assert.equal(2, b.hits.total)
    end)
    it("bulk/90_pipeline: a missing pipeline fails the item", function()
      local _, b = jreq("POST", "/_bulk?refresh=true", table.concat({
        '{"index": {"_index": "test_index", "_id": "test_id1"}}', '{"f1": "v1", "f2": 42}',
        '{"index": {"_index": "test_index", "_id": "test_id2", "pipeline": "mypipeline"}}', '{"f1": "v2", "f2": 47}' }, "\n") .. "\n", NDJSON)
      assert.is_true(b.errors)
      assert.equal("created", b.items[1].index.result)
      assert.equal(400, b.items[2].index.status)
      assert.equal("illegal_argument_exception", b.items[2].index.error.type)
      assert.equal("pipeline with id [mypipeline] does not exist", b.items[2].index.error.reason)
      local _, c = jreq("GET", "/test_index/_count")
      assert.equal(1, c.count)
    end)
    it("bulk/10_basic: empty _id with op_type create and auto ids", function()
      local _, b = jreq("POST", "/_bulk?refresh=true", table.concat({
        '{"index":{"_index":"test","_id":""}}', '{"f":1}', '{"index":{"_index":"test","_id":"id"}}', '{"f":2}',
        '{"index":{"_index":"test"}}', '{"f":3}', '{"create":{"_index":"test"}}', '{"f":4}',
        '{"index":{"_index":"test","op_type":"create"}}', '{"f":5}' }, "\n") .. "\n", NDJSON)
      assert.is_true(b.errors)
      assert.equal(400, b.items[1].index.status)
      assert.equal("if _id is specified it must not be empty", b.items[1].index.error.reason)
      assert.equal("created", b.items[2].index.result)
      assert.equal("created", b.items[3].index.result)
      assert.equal("created", b.items[4].create.result)
      assert.equal("created", b.items[5].create.result)
      local _, c = jreq("GET", "/test/_count")
      assert.equal(4, c.count)
    end)
  end)

  describe("routing", function()
    it("unknown paths are 400 no handler found", function()
      local st, b = jreq("GET", "/a/b/c/d")
      assert.equal(400, st)
      assert.same({ error = "no handler found for uri [/a/b/c/d] and method [GET]" }, b)
    end)
    it("/_x/_search and the other index APIs read \"_x\" as an index name, which ES refuses", function()
      -- ES has no /_x/... route, so /{index}/_search takes the request and the index
      -- resolver refuses the expression: 400 invalid_index_name_exception
      local want = es_error(400, "invalid_index_name_exception", "Invalid index name [_foo], must not start with '_'.",
        { index_uuid = "_na_", index = "_foo" })
      for _, r in ipairs({ { "GET", "/_foo/_search" }, { "POST", "/_foo/_search", {} }, { "GET", "/_foo/_count" },
          { "GET", "/_foo/_mapping" }, { "PUT", "/_foo/_mapping", { properties = {} } }, { "GET", "/_foo/_doc/1" },
          { "GET", "/_foo/_source/1" } }) do
        local st, b = jreq(r[1], r[2], r[3])
        assert.equal(400, st, r[1] .. " " .. r[2])
        assert.same(want, b, r[1] .. " " .. r[2])
      end
      assert.equal(400, (req("HEAD", "/_foo/_doc/1")))
      -- and so a method the index API does not take is its 405
      local st, b = jreq("DELETE", "/_foo/_search")
      assert.equal(405, st)
      assert.same({ error = "Incorrect HTTP method for uri [/_foo/_search] and method [DELETE], allowed: [GET, POST]", status = 405 }, b)
    end)
    it("ES APIs at /_x that esxd lacks are 400 no handler found, not 405 allowed: [PUT]", function()
      -- PUT /{index} takes any name (an invalid one is its 400), but esxd has no handler for
      -- GET /_alias, POST /_aliases, GET /_stats, ...: saying only PUT is allowed is untrue
      for _, r in ipairs({ { "GET", "/_alias" }, { "POST", "/_aliases" }, { "GET", "/_stats" },
          { "DELETE", "/_stats" }, { "GET", "/_alias?local=true" } }) do
        local st, b = jreq(r[1], r[2])
        assert.equal(400, st, r[2])
        assert.same({ error = "no handler found for uri [" .. r[2] .. "] and method [" .. r[1] .. "]" }, b)
      end
      local st, _, h = req("HEAD", "/_alias")
      assert.equal(400, st)
      assert.is_nil(h.allow)
      local b
      st, b = jreq("PUT", "/_alias")
      assert.equal(400, st)
      assert.equal("invalid_index_name_exception", b.error.type)
    end)
    it("returns 400 invalid_index_name_exception for /_x that is no ES API (GET /_foo, DELETE /_foo, HEAD /_cluster)", function()
      -- ES's path trie falls back to /{index} when no route ends at "/_x" (a typo, or
      -- "/_cluster", whose routes are deeper): the index APIs' resolver refuses the name
      local function want(name)
        return es_error(400, "invalid_index_name_exception", "Invalid index name [" .. name .. "], must not start with '_'.",
          { index_uuid = "_na_", index = name })
      end
      for _, r in ipairs({ { "GET", "/_foo", "_foo" }, { "DELETE", "/_foo", "_foo" }, { "GET", "/_cluster", "_cluster" },
          { "GET", "/_foo?pretty", "_foo" } }) do
        local st, b = jreq(r[1], r[2])
        assert.equal(400, st, r[1] .. " " .. r[2])
        assert.same(want(r[3]), b, r[1] .. " " .. r[2])
      end
      local st, _, b = req("HEAD", "/_foo")
      assert.equal(400, st)
      assert.equal("", b)
      -- a method /{index} does not take is its 405
      local h
      st, b, h = jreq("POST", "/_foo")
      assert.equal(405, st)
      assert.same({ error = "Incorrect HTTP method for uri [/_foo] and method [POST], allowed: [DELETE, GET, HEAD, PUT]", status = 405 }, b)
      assert.equal("DELETE,GET,HEAD,PUT", h.allow)
    end)
    it("wrong methods are 405", function()
      local st, b = jreq("DELETE", "/_search")
      assert.equal(405, st)
      assert.same({ error = "Incorrect HTTP method for uri [/_search] and method [DELETE], allowed: [GET, POST]", status = 405 }, b)
      -- each allowed method once, in the message and in Allow
      local h
      st, b, h = jreq("POST", "/some-index")
      assert.equal(405, st)
      assert.same({ error = "Incorrect HTTP method for uri [/some-index] and method [POST], allowed: [DELETE, GET, HEAD, PUT]", status = 405 }, b)
      assert.equal("DELETE,GET,HEAD,PUT", h.allow)
    end)
    it("the routing errors quote the whole URI, query string included (request.uri())", function()
      local st, b = jreq("GET", "/a/b/c/d?x=1&y")
      assert.equal(400, st)
      assert.same({ error = "no handler found for uri [/a/b/c/d?x=1&y] and method [GET]" }, b)
      st, b = jreq("DELETE", "/_search?q=a")
      assert.equal(405, st)
      assert.same({ error = "Incorrect HTTP method for uri [/_search?q=a] and method [DELETE], allowed: [GET, POST]", status = 405 }, b)
    end)
  end)

  describe("URL parameters (ES's BaseRestHandler checks)", function()
    local function bad_param(path, msg)
      return es_error(400, "illegal_argument_exception", "request [" .. path .. "] contains unrecognized " .. msg)
    end
    it("an unknown parameter is a 400 with ES's did-you-mean message, on every API", function()
      local st, b = jreq("GET", "/_search?sizee=5")
      assert.equal(400, st)
      assert.same(bad_param("/_search", "parameter: [sizee] -> did you mean [size]?"), b)
      st, b = jreq("GET", "/_search?zzz=1")
      assert.same(bad_param("/_search", "parameter: [zzz]"), b)
      st, b = jreq("PUT", "/p1/_doc/1?refesh=true", { a = 1 })
      assert.equal(400, st)
      assert.same(bad_param("/p1/_doc/1", "parameter: [refesh] -> did you mean [refresh]?"), b)
      assert.equal(404, (jreq("GET", "/p1/_doc/1")))            -- nothing was written
      st, b = jreq("POST", "/_bulk?foo=1&bar=2", '{"index":{"_index":"p1"}}\n{}\n', NDJSON)
      assert.equal(400, st)
      assert.same(bad_param("/_bulk", "parameters: [bar], [foo]"), b)
      for _, r in ipairs({ { "GET", "/?x=1" }, { "GET", "/_cluster/health?x=1" }, { "PUT", "/p2?x=1" },
          { "GET", "/p2?x=1" }, { "DELETE", "/p2?x=1" }, { "POST", "/_refresh?x=1" }, { "GET", "/_count?x=1" },
          { "DELETE", "/p2/_doc/1?x=1" }, { "GET", "/p2/_doc/1?x=1" }, { "GET", "/p2/_source/1?x=1" },
          { "POST", "/p2/_update/1?x=1" }, { "PUT", "/p2/_create/1?x=1" }, { "POST", "/_msearch?x=1" } }) do
        st, b = jreq(r[1], r[2])
        assert.equal(400, st, r[1] .. " " .. r[2])
        assert.same(bad_param(r[2]:match("^[^?]*"), "parameter: [x]"), b, r[1] .. " " .. r[2])
      end
      assert.equal(400, (req("HEAD", "/?x=1")))
      assert.equal(400, (req("HEAD", "/p2?x=1")))
      assert.equal(404, (jreq("GET", "/p2")))                     -- PUT /p2?x=1 created nothing
    end)
    it("_msearch has no preference parameter (only its header lines do)", function()
      local st, b = jreq("POST", "/_msearch?preference=_local", '{}\n{}\n', NDJSON)
      assert.equal(400, st)
      assert.same(bad_param("/_msearch", "parameter: [preference]"), b)
    end)
    it("lists several candidates as 'any of', best first", function()
      local st, b = jreq("GET", "/_search?_source_include=a")
      assert.equal(400, st)
      assert.same(bad_param("/_search",
        "parameter: [_source_include] -> did you mean any of [_source_includes, _source_excludes, _source_exclude_vectors]?"), b)
    end)
    it("documented parameters esxd does not implement are refused, not ignored", function()
      for _, q in ipairs({ "scroll=1m", "terminate_after=1", "analyzer=standard",
          "suggest_field=a", "explain=true" }) do
        local st, b = jreq("GET", "/_search?" .. q)
        assert.equal(400, st, q)
        assert.equal("illegal_argument_exception", b.error.type, q)
        assert.equal(1, string.find(b.error.reason, "request [/_search] contains unrecognized parameter: [" ..
          q:match("^[^=]+") .. "]", 1, true), q)
      end
      local st, b = jreq("PUT", "/p3/_doc/1?require_data_stream=true", { a = 1 })
      assert.equal(400, st)
      assert.equal(1, string.find(b.error.reason,
        "request [/p3/_doc/1] contains unrecognized parameter: [require_data_stream]", 1, true))
      assert.equal(404, (jreq("GET", "/p3")))
      -- their default values are what esxd does, so those are fine
      assert.equal(200, (jreq("GET", "/_search?explain=false")))
      assert.equal(201, (jreq("PUT", "/p3/_doc/1?require_data_stream=false", { a = 1 })))
      assert.equal(200, (jreq("GET", "/_cluster/health?level=cluster")))
    end)
    it("parameters that are no-ops on one node with one shard are accepted", function()
      assert.equal(201, (jreq("PUT", "/p4/_doc/1?routing=r&timeout=30s&wait_for_active_shards=1", { a = 1 })))
      assert.equal(200, (jreq("GET", "/p4/_search?preference=_local&request_cache=true&routing=r&" ..
        "search_type=query_then_fetch&allow_partial_search_results=false&timeout=1s&batched_reduce_size=5")))
      assert.equal(200, (jreq("GET", "/_cluster/health?wait_for_status=yellow&timeout=5s&local=true")))
      assert.equal(200, (jreq("GET", "/?pretty&human&error_trace=false&filter_path=name")))
    end)
    it("boolean parameters must be true or false", function()
      local st, b = jreq("GET", "/_search?ignore_unavailable=yes")
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception",
        "Failed to parse value [yes] as only [true] or [false] are allowed."), b)
      st, b = jreq("POST", "/_bulk?require_alias=1", '{"index":{"_index":"p5"}}\n{}\n', NDJSON)
      assert.same(es_error(400, "illegal_argument_exception",
        "Failed to parse value [1] as only [true] or [false] are allowed."), b)
    end)
    it("refresh must be true, false, wait_for or empty", function()
      local st, b = jreq("PUT", "/p6/_doc/1?refresh=yes", { a = 1 })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "Unknown value for refresh: [yes]."), b)
      assert.equal(404, (jreq("GET", "/p6/_doc/1")))
      st, b = jreq("PUT", "/p6/_doc/1?refresh", { a = 1 })
      assert.equal(201, st)
      assert.is_true(b.forced_refresh)
    end)
    it("numbers and time values are parsed like ES", function()
      local st, b = jreq("PUT", "/p7/_doc/1?if_seq_no=abc&if_primary_term=1", { a = 1 })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception",
        "Failed to parse long parameter [if_seq_no] with value [abc]"), b)
      st, b = jreq("GET", "/_search?size=1.5")
      assert.same(es_error(400, "illegal_argument_exception", "Failed to parse int parameter [size] with value [1.5]"), b)
      st, b = jreq("PUT", "/p7/_doc/1?timeout=10", { a = 1 })
      assert.equal(400, st)
      assert.same(es_error(400, "parse_exception",
        "failed to parse setting [timeout] with value [10] as a time value: unit is missing or unrecognized"), b)
      st, b = jreq("PUT", "/p7/_doc/1?timeout=1.5s", { a = 1 })
      assert.same(es_error(400, "parse_exception", "failed to parse [1.5s], fractional time values are not supported"), b)
      assert.equal(201, (jreq("PUT", "/p7/_doc/1?timeout=-1", { a = 1 })))
      st, b = jreq("PUT", "/p7/_doc/2?wait_for_active_shards=some", { a = 1 })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "cannot parse ActiveShardCount[some]"), b)
      assert.equal(503, (jreq("PUT", "/p7/_doc/2?wait_for_active_shards=all&timeout=0s", { a = 1 })))
      st, b = jreq("GET", "/_search?search_type=scan")
      assert.same(es_error(400, "illegal_argument_exception", "No search type for [scan]"), b)
      st, b = jreq("GET", "/_count?q=a&default_operator=xor")
      assert.same(es_error(400, "illegal_argument_exception",
        "No enum constant org.elasticsearch.index.query.Operator.XOR"), b)
      assert.equal(200, (jreq("GET", "/_search?q=a&default_operator=AND&search_type=dfs_query_then_fetch")))
    end)
    it("search honours track_scores, version and seq_no_primary_term given as URL parameters", function()
      put_doc("p8", "1", { n = 1 })
      local st, b = jreq("GET", "/p8/_search?sort=n&track_scores=true&version&seq_no_primary_term=true")
      assert.equal(200, st)
      local h = b.hits.hits[1]
      assert.equal(1, h._score)
      assert.equal(1, b.hits.max_score)
      assert.equal(1, h._version)
      assert.equal(0, h._seq_no)
      assert.equal(1, h._primary_term)
    end)
  end)

  describe("REST API conformance (es-spec/api)", function()
    local function illegal(reason) return es_error(400, "illegal_argument_exception", reason) end
    local function invalid(...)
      local parts = {}
      for i, m in ipairs({ ... }) do parts[i] = i .. ": " .. m .. ";" end
      return es_error(400, "action_request_validation_exception", "Validation Failed: " .. table.concat(parts))
    end
    it("_search refuses batched_reduce_size, pre_filter_shard_size and max_concurrent_shard_requests below ES's minimums", function()
      put_doc("c1", "1", { a = 1 })
      local st, b = jreq("GET", "/c1/_search?batched_reduce_size=1")
      assert.equal(400, st)
      assert.same(illegal("batchedReduceSize must be >= 2"), b)
      st, b = jreq("GET", "/c1/_search?pre_filter_shard_size=0")
      assert.same(illegal("preFilterShardSize must be >= 1"), b)
      st, b = jreq("GET", "/c1/_search?max_concurrent_shard_requests=0")
      assert.same(illegal("maxConcurrentShardRequests must be >= 1"), b)
      -- RestSearchAction reads both with paramAsInt, although the spec says long
      st, b = jreq("GET", "/c1/_search?batched_reduce_size=3000000000")
      assert.same(illegal("Failed to parse int parameter [batched_reduce_size] with value [3000000000]"), b)
      assert.equal(200, (jreq("GET", "/c1/_search?batched_reduce_size=2&pre_filter_shard_size=1&max_concurrent_shard_requests=1")))
    end)
    it("_msearch refuses max_concurrent_searches below 1, shard request limits below 1 and an unknown search_type in a header", function()
      put_doc("c2", "1", { a = 1 })
      local st, b = jreq("POST", "/c2/_msearch?max_concurrent_searches=0", '{}\n{}\n', NDJSON)
      assert.equal(400, st)
      assert.same(illegal("maxConcurrentSearchRequests must be positive"), b)
      st, b = jreq("POST", "/c2/_msearch?max_concurrent_shard_requests=0", '{}\n{}\n', NDJSON)
      assert.same(illegal("maxConcurrentShardRequests must be >= 1"), b)
      st, b = jreq("POST", "/c2/_msearch", '{}\n{}\n{"search_type":"scan"}\n{}\n', NDJSON)
      assert.equal(400, st)
      assert.same(illegal("No search type for [scan]"), b)
      st, b = jreq("POST", "/c2/_msearch?max_concurrent_searches=1", '{"search_type":"dfs_query_then_fetch"}\n{}\n', NDJSON)
      assert.equal(200, st)
      assert.equal(1, b.responses[1].hits.total.value)
    end)
    it("_cluster/health waits for wait_for_active_shards and wait_for_nodes (408 when not met), and checks wait_for_events", function()
      assert.equal(200, (jreq("PUT", "/c3", { settings = { number_of_shards = 2 } })))   -- 2 active, 2 unassigned
      local function health(q)
        local t0 = socket.gettime()
        local st, b = jreq("GET", "/_cluster/health?timeout=200ms&" .. q)
        return st, b, socket.gettime() - t0
      end
      local st, b, took = health("wait_for_active_shards=2")
      assert.equal(200, st)
      assert.is_false(b.timed_out)
      st, b, took = health("wait_for_active_shards=3")
      assert.equal(408, st)
      assert.is_true(b.timed_out)
      assert.equal(2, b.active_shards)
      assert.is_true(took >= 0.19)
      st, b = health("wait_for_active_shards=all")                  -- the replicas stay unassigned
      assert.equal(408, st)
      assert.equal(200, (health("wait_for_active_shards=0")))
      for _, q in ipairs({ "1", ">=1", "ge(1)", "<=1", "le(1)", ">0", "gt(0)", "<2", "lt(2)", "" }) do
        st, b = health("wait_for_nodes=" .. q:gsub("[<>=()]", function(c) return ("%%%02X"):format(c:byte()) end))
        assert.equal(200, st, q)
        assert.is_false(b.timed_out, q)
      end
      for _, q in ipairs({ "2", ">1", "gt(1)", ">=2", "<1", "lt(1)" }) do
        st, b = health("wait_for_nodes=" .. q:gsub("[<>=()]", function(c) return ("%%%02X"):format(c:byte()) end))
        assert.equal(408, st, q)
        assert.is_true(b.timed_out, q)
      end
      st, b = health("wait_for_nodes=two")
      assert.equal(400, st)
      assert.same(es_error(400, "number_format_exception", 'For input string: "two"'), b)
      st, b = health("wait_for_events=soon")
      assert.same(illegal("No enum constant org.elasticsearch.common.Priority.SOON"), b)
      assert.equal(200, (health("wait_for_events=LANGUID&wait_for_nodes=1&wait_for_active_shards=1")))
    end)
    it("_update refuses compare-and-set with retries or upserts, and doc_as_upsert without doc (UpdateRequest.validate)", function()
      put_doc("c4", "1", { a = 1 })
      local st, b = jreq("POST", "/c4/_update/1?if_seq_no=0&if_primary_term=1&retry_on_conflict=2", { doc = { a = 2 } })
      assert.equal(400, st)
      assert.same(invalid("compare and write operations can not be retried"), b)
      st, b = jreq("POST", "/c4/_update/1?if_seq_no=0&if_primary_term=1", { doc = { a = 2 }, doc_as_upsert = true })
      assert.same(invalid("compare and write operations can not be used with upsert"), b)
      st, b = jreq("POST", "/c4/_update/1?if_seq_no=0&if_primary_term=1", { doc = { a = 2 }, upsert = { a = 0 } })
      assert.same(invalid("upsert requests don't support `if_seq_no` and `if_primary_term`"), b)
      st, b = jreq("POST", "/c4/_update/1", { doc_as_upsert = true })
      assert.same(invalid("script or doc is missing", "doc must be specified if doc_as_upsert is enabled"), b)
      st, b = jreq("POST", "/c4/_update/1", { doc = { a = 2 }, script = "ctx._source.a = 2" })
      assert.same(invalid("can't provide both script and doc"), b)
      st, b = jreq("GET", "/c4/_doc/1")
      assert.same({ a = 1 }, b._source)                                -- nothing was applied
      st, b = jreq("POST", "/c4/_update/1?if_seq_no=0&if_primary_term=1&retry_on_conflict=0", { doc = { a = 2 } })
      assert.equal(200, st)
      assert.equal("updated", b.result)
    end)
    it("_update: a body that does not parse is the parser's x_content_parse_exception, not a document's error", function()
      -- _update's body is UpdateRequest's JSON: a syntax error is the parser's, not a document's
      local st, b = jreq("POST", "/c5u/_update/1", '{"doc":{"a":3},\n"doc x}', JSON)
      assert.equal(400, st)
      assert.equal("json_parse_exception", b.error.caused_by.type)
      assert.same({ { type = "x_content_parse_exception", reason = "[2:8] " .. b.error.caused_by.reason } }, b.error.root_cause)
      st, b = jreq("POST", "/c5u/_update/1", '{"doc":{"a":3},"doc":{"a":4}}', JSON)
      assert.equal(400, st)
      assert.equal("x_content_parse_exception", b.error.type)
      assert.matches("^%[1:21%] Duplicate field 'doc'", b.error.reason)
    end)
    it("_bulk: update versioning, dynamic_templates, unparsable update bodies and invalid updates fail the whole request", function()
      put_doc("c5", "1", { a = 1 })
      local function bulk(body) return jreq("POST", "/_bulk", body, NDJSON) end
      local st, b = bulk('{"index":{"_index":"c5","_id":"2"}}\n{"a":2}\n{"update":{"_index":"c5","_id":"1","version":2}}\n{"doc":{"a":3}}\n')
      assert.equal(400, st)
      assert.same(illegal("Update requests do not support versioning. Please use `if_seq_no` and `if_primary_term` instead"), b)
      st, b = bulk('{"update":{"_index":"c5","_id":"1","version_type":"external"}}\n{"doc":{"a":3}}\n')
      assert.same(illegal("Update requests do not support versioning. Please use `if_seq_no` and `if_primary_term` instead"), b)
      st, b = bulk('{"update":{"_index":"c5","_id":"1","require_data_stream":true}}\n{"doc":{"a":3}}\n')
      assert.same(illegal("Update requests do not support the `require_data_stream` flag, as data streams do not support update operations"), b)
      st, b = bulk('{"index":{"_index":"c5","_id":"2"}}\n{"a":2}\n{"update":{"_index":"c5","_id":"1","dynamic_templates":{"a":"t"}}}\n{"doc":{"a":3}}\n')
      assert.same(illegal("Update request in line [3] does not accept dynamic_templates"), b)
      st, b = bulk('{"delete":{"_index":"c5","_id":"1","dynamic_templates":{"a":"t"}}}\n')
      assert.same(illegal("Delete request in line [1] does not accept dynamic_templates"), b)
      st, b = bulk('{"index":{"_index":"c5","_id":"2"}}\n{"a":2}\n{"update":{"_index":"c5","_id":"1"}}\n{"doc":{"a":3},"dox":1}\n')
      assert.equal(400, st)
      assert.same(es_error(400, "x_content_parse_exception", "[1:2] [UpdateRequest] unknown field [dox]"), b)
      st, b = bulk('{"update":{"_index":"c5","_id":"1"}}\n{}\n{"update":{"_index":"c5","_id":"1","if_seq_no":0,"if_primary_term":1,"retry_on_conflict":1}}\n{"doc":{"a":3}}\n')
      assert.equal(400, st)
      assert.same(invalid("script or doc is missing", "compare and write operations can not be retried"), b)
      assert.equal(404, (jreq("GET", "/c5/_doc/2")))                 -- no item was applied
      st, b = bulk('{"update":{"_index":"c5","_id":"1","if_seq_no":0,"if_primary_term":1}}\n{"doc":{"a":3}}\n')
      assert.equal(200, st)
      assert.is_false(b.errors)
    end)
  end)

  describe("wait_for_active_shards (one node: only primaries are active)", function()
    local function unavailable(index, uuid, count, needed, timeout, request)
      return es_error(503, "unavailable_shards_exception", "[" .. index .. "][0] Not enough active copies to meet " ..
        "shard count of [" .. count .. "] (have 1, needed " .. needed .. "). Timeout: [" .. timeout .. "], request: [" ..
        request .. "]", { index_uuid = uuid, shard = "0", index = index })
    end
    local function uuid_of(index)
      local _, b = jreq("GET", "/" .. index)
      return b[index].settings.index.uuid
    end

    it("returns 503 unavailable_shards_exception after the timeout when a write needs 2 copies", function()
      local t0 = socket.gettime()
      local st, b = jreq("PUT", "/ws1/_doc/1?wait_for_active_shards=2&timeout=300ms", '{ "a": 1,\n "b": "x y" }')
      assert.equal(503, st)
      assert.is_true(socket.gettime() - t0 >= 0.3)
      assert.same(unavailable("ws1", uuid_of("ws1"), "2", 2, "300ms",   -- the index was auto-created
        'BulkShardRequest [[ws1][0]] containing [index {[ws1][1], source[{"a":1,"b":"x y"}]}]'), b)
      assert.equal(404, (jreq("GET", "/ws1/_doc/1")))                   -- nothing was written
      st, b = jreq("DELETE", "/ws1/_doc/1?wait_for_active_shards=all&timeout=0s&refresh=true")
      assert.equal(503, st)
      assert.same(unavailable("ws1", uuid_of("ws1"), "ALL", 2, "0s",
        "BulkShardRequest [[ws1][0]] containing [delete {[ws1][1]}] and a refresh"), b)
    end)
    it("returns 201 when the count is met: 1, 0, -1, or all without replicas", function()
      assert.equal(200, (jreq("PUT", "/ws2", { settings = { number_of_replicas = 0 } })))
      for i, n in ipairs({ "1", "0", "-1", "all" }) do
        assert.equal(201, (jreq("PUT", "/ws2/_doc/" .. i .. "?wait_for_active_shards=" .. n, { a = 1 })), n)
      end
      assert.equal(201, (jreq("PUT", "/ws3/_doc/1?wait_for_active_shards=1", { a = 1 })))  -- replicas 1
    end)
    it("returns 503 items for the bulk's index that lacks copies, after one wait", function()
      assert.equal(200, (jreq("PUT", "/ws4", { settings = { number_of_replicas = 0 } })))
      local t0 = socket.gettime()
      local st, b = jreq("POST", "/_bulk?wait_for_active_shards=all&timeout=200ms",
        '{"index":{"_index":"ws5","_id":"1"}}\n{"a":1}\n{"delete":{"_index":"ws5","_id":"2"}}\n' ..
        '{"index":{"_index":"ws4","_id":"1"}}\n{"a":1}\n', NDJSON)
      assert.equal(200, st)
      assert.is_true(socket.gettime() - t0 >= 0.2)
      assert.is_true(socket.gettime() - t0 < 2)
      assert.is_true(b.errors)
      local e = unavailable("ws5", uuid_of("ws5"), "ALL", 2, "200ms",
        "BulkShardRequest [[ws5][0]] containing [2] requests").error.root_cause[1]
      assert.same({ _index = "ws5", _id = "1", status = 503, error = e }, b.items[1].index)
      assert.same({ _index = "ws5", _id = "2", status = 503, error = e }, b.items[2].delete)
      assert.equal(201, b.items[3].index.status)                       -- ws4 has no replicas: all is 1
    end)
    it("returns shards_acknowledged false from index creation after the timeout", function()
      local t0 = socket.gettime()
      local st, b = jreq("PUT", "/ws6?wait_for_active_shards=2&timeout=200ms", { settings = { number_of_replicas = 1 } })
      assert.equal(200, st)
      assert.is_true(socket.gettime() - t0 >= 0.2)
      assert.same({ acknowledged = true, shards_acknowledged = false, index = "ws6" }, b)
      assert.equal(200, (jreq("HEAD", "/ws6")))                        -- created all the same
      st, b = jreq("PUT", "/ws7?wait_for_active_shards=all", { settings = { number_of_replicas = 0 } })
      assert.same({ acknowledged = true, shards_acknowledged = true, index = "ws7" }, b)
    end)
    it("returns 400 for timeout=-1, which would wait forever", function()
      local st, b = jreq("PUT", "/ws8/_doc/1?wait_for_active_shards=2&timeout=-1", { a = 1 })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", "esxd refuses timeout=-1 with " ..
        "wait_for_active_shards=[2]: on one node the missing shard copies never start, so the request would never end"), b)
      assert.equal(404, (jreq("GET", "/ws8/_doc/1")))                  -- the write is not applied
      st = jreq("PUT", "/ws9?wait_for_active_shards=2&timeout=-1", { settings = { number_of_replicas = 1 } })
      assert.equal(400, st)
      assert.equal(404, (jreq("HEAD", "/ws9")))                        -- nor creates the index
    end)
  end)

  describe("request bodies", function()
    it("APIs that take no body refuse one with ES's 400", function()
      put_doc("bd", "1", { a = 1 })
      for _, r in ipairs({ { "GET", "/" }, { "GET", "/_cluster/health" }, { "DELETE", "/bd/_doc/1" },
          { "GET", "/bd/_doc/1" }, { "GET", "/bd/_source/1" }, { "GET", "/bd" }, { "POST", "/bd/_refresh" },
          { "DELETE", "/bd" } }) do
        local st, b = jreq(r[1], r[2], { query = { match_all = {} } })
        assert.equal(400, st, r[1] .. " " .. r[2])
        assert.same(es_error(400, "illegal_argument_exception",
          "request [" .. r[1] .. " " .. r[2] .. "] does not support having a body"), b, r[1] .. " " .. r[2])
      end
      assert.equal(400, (req("HEAD", "/bd/_doc/1", "{}", JSON)))
      assert.equal(400, (req("HEAD", "/bd", "{}", JSON)))
      assert.equal(200, (jreq("GET", "/bd/_doc/1")))               -- the DELETEs did nothing
    end)
    it("_msearch without a body", function()
      local st, b = jreq("POST", "/_msearch", "", NDJSON)
      assert.equal(400, st)
      assert.same(es_error(400, "parse_exception", "request body or source parameter is required"), b)
    end)
  end)

  describe("media types and REST API compatibility (Accept, Content-Type)", function()
    local VND8 = "application/vnd.elasticsearch+json; compatible-with=8"
    local VND8_ND = "application/vnd.elasticsearch+x-ndjson; compatible-with=8"
    local V8 = { Accept = VND8, ["Content-Type"] = VND8 }
    local function header_error(names, cause_type, cause_reason)
      local b = es_error(400, "media_type_header_exception", "Invalid media-type value on headers [" .. names .. "]")
      b.error.caused_by = { type = cause_type, reason = cause_reason }
      return b
    end
    local function both_versioned(accept, ctype)
      return header_error("Accept, Content-Type", "status_exception", "A compatible version is required on both " ..
        "Content-Type and Accept headers if either one has requested a compatible version. Accept=" .. accept ..
        ", Content-Type=" .. ctype)
    end

    it("returns the vendor Content-Type when Accept and Content-Type ask for compatible-with=8", function()
      local st, b, h = jreq("PUT", "/mt/_doc/1?refresh=true", { a = 1 }, V8)
      assert.equal(201, st)
      assert.equal("application/vnd.elasticsearch+json;compatible-with=8", h["content-type"])
      assert.equal("created", b.result)
      st, b, h = jreq("POST", "/_bulk?refresh=true", '{"index":{"_index":"mt","_id":"2"}}\n{"a":2}\n',
        { Accept = VND8, ["Content-Type"] = VND8_ND })
      assert.equal(200, st)
      assert.equal("application/vnd.elasticsearch+json;compatible-with=8", h["content-type"])
      assert.is_false(b.errors)
      st, b, h = jreq("POST", "/mt/_search", { query = { match_all = {} } }, V8)
      assert.equal(200, st)
      assert.equal("application/vnd.elasticsearch+json;compatible-with=8", h["content-type"])
      assert.equal(2, b.hits.total.value)
      st, b, h = jreq("GET", "/mt/_doc/2", nil, { Accept = VND8 })   -- no body: Accept alone is enough
      assert.equal(200, st)
      assert.equal("application/vnd.elasticsearch+json;compatible-with=8", h["content-type"])
      assert.same({ a = 2 }, b._source)
    end)
    it("returns the vendor Content-Type on errors too", function()
      local st, b, h = jreq("GET", "/missing/_doc/1", nil, { Accept = VND8 })
      assert.equal(404, st)
      assert.equal("application/vnd.elasticsearch+json;compatible-with=8", h["content-type"])
      assert.equal("index_not_found_exception", b.error.type)
    end)
    it("returns application/json when Accept is absent, a list or */*, and echoes Accept's parameters", function()
      for _, accept in ipairs({ false, "*/*", "application/json, text/plain, */*", "text/html", "application/x-ndjson" }) do
        local st, _, h = jreq("GET", "/", nil, { Accept = accept or nil })
        assert.equal(200, st)
        assert.equal("application/json", h["content-type"], tostring(accept))
      end
      local _, _, h = jreq("GET", "/", nil, { Accept = "application/json; charset=UTF-8" })
      assert.equal("application/json;charset=utf-8", h["content-type"])
    end)
    it("returns 400 media_type_header_exception when only one of Accept and Content-Type has a version", function()
      local st, b, h = jreq("PUT", "/mt/_doc/1", { a = 1 }, { Accept = VND8, ["Content-Type"] = "application/json" })
      assert.equal(400, st)
      assert.equal("application/json", h["content-type"])
      assert.same(both_versioned(VND8, "application/json"), b)
      st, b = jreq("PUT", "/mt/_doc/1", { a = 1 }, { ["Content-Type"] = VND8 })
      assert.equal(400, st)
      assert.same(both_versioned("null", VND8), b)
      assert.equal(404, (jreq("GET", "/mt")))                      -- nothing was written
    end)
    it("returns 400 media_type_header_exception when the versions on Accept and Content-Type differ", function()
      local v7 = "application/vnd.elasticsearch+json;compatible-with=7"
      local st, b = jreq("POST", "/_search", { query = { match_all = {} } }, { Accept = VND8, ["Content-Type"] = v7 })
      assert.equal(400, st)
      assert.same(header_error("Accept, Content-Type", "status_exception", "A compatible version is required on " ..
        "both Content-Type and Accept headers if either one has requested a compatible version and the compatible " ..
        "versions must match. Accept=" .. VND8 .. ", Content-Type=" .. v7), b)
    end)
    it("returns 400 media_type_header_exception for a version other than 7 or 8", function()
      local v9 = "application/vnd.elasticsearch+json; compatible-with=9"
      local st, b = jreq("GET", "/", nil, { Accept = v9 })
      assert.equal(400, st)
      assert.same(header_error("Accept, Content-Type", "status_exception",
        "Accept version must be either version 8 or 7, but found 9. Accept=" .. v9), b)
      local v6 = "application/vnd.elasticsearch+json;compatible-with=6"
      st, b = jreq("POST", "/_search", { query = { match_all = {} } }, { Accept = VND8, ["Content-Type"] = v6 })
      assert.equal(400, st)
      assert.same(header_error("Accept, Content-Type", "status_exception",
        "Content-Type version must be either version 8 or 7, but found 6. Content-Type=" .. v6), b)
    end)
    it("returns 400 media_type_header_exception for a malformed Accept or Content-Type", function()
      local st, b = jreq("GET", "/", nil, { Accept = "json" })
      assert.equal(400, st)
      assert.same(header_error("Accept", "illegal_argument_exception", "invalid media-type [json]"), b)
      st, b = jreq("POST", "/_search", "{}", { ["Content-Type"] = "application/json; charset" })
      assert.equal(400, st)
      assert.same(header_error("Content-Type", "illegal_argument_exception",
        "invalid parameters for header [application/json; charset]"), b)
    end)
    it("returns 400 when compatible-with=7 asks for v7 REST compatibility (not implemented)", function()
      local v7 = "application/vnd.elasticsearch+json;compatible-with=7"
      local reason = "esxd does not implement REST API compatibility with version 7 (compatible-with=7); " ..
        "send compatible-with=8 or application/json"
      local st, b, h = jreq("GET", "/", nil, { Accept = v7 })
      assert.equal(400, st)
      assert.equal("application/json", h["content-type"])
      assert.same(es_error(400, "illegal_argument_exception", reason), b)
      st, b = jreq("PUT", "/mt/_doc/1", { a = 1 }, { Accept = v7, ["Content-Type"] = v7 })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception", reason), b)
      assert.equal(404, (jreq("GET", "/mt")))
    end)
    it("returns 400 when YAML, CBOR or Smile is asked for or sent (not implemented)", function()
      local st, b = jreq("GET", "/", nil, { Accept = "application/yaml" })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception",
        "esxd answers only in JSON; [application/yaml] asks for a YAML response, which is not implemented"), b)
      st, b = jreq("POST", "/_search", "a: 1", { ["Content-Type"] = "application/cbor" })
      assert.equal(400, st)
      assert.same(es_error(400, "illegal_argument_exception",
        "esxd reads only JSON request bodies; Content-Type [application/cbor] (CBOR) is not implemented"), b)
    end)
    it("returns ES's 406 for a body whose Content-Type ES does not read", function()
      local st, b = jreq("POST", "/_search", "{}", { ["Content-Type"] = "text/html" })
      assert.equal(406, st)
      assert.same({ error = "Content-Type header [text/html] is not supported", status = 406 }, b)
      assert.equal(200, (jreq("POST", "/_search", "{}", { ["Content-Type"] = "application/*" })))
    end)
  end)

  describe("response parameters: pretty, error_trace, filter_path on errors", function()
    it("?pretty indents like ES's XContent pretty printer, with a final newline", function()
      req("PUT", "/pr1")
      local st, _, body = req("GET", "/pr1?pretty")
      assert.equal(200, st)
      local uuid = cjson.decode(body).pr1.settings.index.uuid
      local created = cjson.decode(body).pr1.settings.index.creation_date
      assert.equal('{\n  "pr1" : {\n    "aliases" : { },\n    "mappings" : { },\n    "settings" : {\n' ..
        '      "index" : {\n        "creation_date" : "' .. created .. '",\n        "number_of_replicas" : "1",\n' ..
        '        "number_of_shards" : "1",\n        "provided_name" : "pr1",\n        "uuid" : "' .. uuid ..
        '"\n      }\n    }\n  }\n}\n', body)
      req("PUT", "/pr1/_doc/1", '{"a":[1,2.5],"s":"x,y:{}[]\\"z","e":[],"o":{},"n":null}')
      st, _, body = req("GET", "/pr1/_source/1?pretty=true")
      assert.equal('{\n  "a" : [\n    1,\n    2.5\n  ],\n  "s" : "x,y:{}[]\\"z",\n  "e" : [ ],\n  "o" : { },\n' ..
        '  "n" : null\n}\n', body)
      st, _, body = req("GET", "/nope?pretty")
      assert.equal(404, st)
      assert.matches('^{\n  "error" : {\n    "root_cause" : %[\n      {\n        "type" : "index_not_found_exception",', body)
      st, _, body = req("GET", "/pr1/_source/1?pretty=false")
      assert.equal('{"a":[1,2.5],"s":"x,y:{}[]\\"z","e":[],"o":{},"n":null}', body)
    end)
    it("?human adds the human-readable fields", function()
      local _, b = jreq("GET", "/_cluster/health?human")
      assert.equal("0s", b.task_max_waiting_in_queue)
      assert.equal("100.0%", b.active_shards_percent)
      _, b = jreq("GET", "/_cluster/health")
      assert.is_nil(b.task_max_waiting_in_queue)
      assert.is_nil(b.active_shards_percent)
      req("PUT", "/hu1")
      _, b = jreq("GET", "/hu1?human=true")
      local idx = b.hu1.settings.index
      assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ$", idx.creation_date_string)
      _, b = jreq("GET", "/hu1")
      assert.is_nil(b.hu1.settings.index.creation_date_string)
    end)
    it("?error_trace=true adds stack_trace to the error objects", function()
      local st, b = jreq("GET", "/nope/_search?error_trace=true")
      assert.equal(404, st)
      assert.equal("string", type(b.error.stack_trace))
      assert.equal("string", type(b.error.root_cause[1].stack_trace))
      assert.matches("no such index %[nope%]", b.error.stack_trace)
      st, b = jreq("GET", "/nope/_search")
      assert.is_nil(b.error.stack_trace)
      assert.is_nil(b.error.root_cause[1].stack_trace)
    end)
    it("filter_path does not apply to error responses (ES builds them unfiltered)", function()
      local st, b = jreq("GET", "/nope/_search?filter_path=took")
      assert.equal(404, st)
      assert.same(not_found("nope"), b)
      st, b = jreq("GET", "/_search?filter_path=took", "{", JSON)
      assert.equal(400, st)
      assert.equal("x_content_parse_exception", b.error.type)
      st, b = jreq("DELETE", "/_search?filter_path=took")
      assert.equal(405, st)
      assert.equal(405, b.status)
      -- a 404 that is not an error (found: false) is filtered as usual
      req("PUT", "/fp1")
      st, b = jreq("GET", "/fp1/_doc/x?filter_path=found")
      assert.equal(404, st)
      assert.same({ found = false }, b)
    end)
  end)

  describe("compression", function()
    it("accepts gzip request bodies", function()
      local st, b = jreq("POST", "/_bulk?refresh=true", '{"index":{"_index":"gz","_id":"1"}}\n{"a":1}\n', NDJSON, { gzip = true })
      assert.equal(200, st)
      assert.is_false(b.errors)
      local r = srv:requests("/_bulk").requests[1]
      assert.equal("gzip", r.headers["content-encoding"])
      assert.equal(#'{"index":{"_index":"gz","_id":"1"}}\n{"a":1}\n', r.body_bytes)
      assert.is_true(r.body_wire_bytes > 0)
      assert.are_not.equal(r.body_bytes, r.body_wire_bytes)
    end)
    it("rejects corrupt gzip with 400", function()
      local st, b = jreq("POST", "/_bulk", "\31\139\8\0garbage-not-gzip", { ["Content-Type"] = "application/x-ndjson", ["Content-Encoding"] = "gzip" })
      assert.equal(400, st)
      assert.equal("illegal_argument_exception", b.error.type)
      assert.matches("^Failed to decompress request body", b.error.reason)
    end)
    it("answers gzip when asked", function()
      local st, h, raw = req("GET", "/", nil, { ["Accept-Encoding"] = "gzip" }, { raw = true })
      assert.equal(200, st)
      assert.equal("gzip", h["content-encoding"])
      assert.equal("\31\139", raw:sub(1, 2))
      local b = cjson.decode(ds.gunzip(raw))
      assert.equal("You Know, for Search", b.tagline)
      st, h = req("GET", "/")
      assert.is_nil(h["content-encoding"])
    end)
  end)

  describe("faults", function()
    it("status with default ES error, headers and count", function()
      local id = srv:fault({ path = "/_bulk", method = "POST", count = 2, status = 429, headers = { ["Retry-After"] = "1" } })
      assert.equal("number", type(id))
      for _ = 1, 2 do
        local st, b, h = jreq("POST", "/_bulk", '{"index":{"_index":"f"}}\n{}\n', NDJSON)
        assert.equal(429, st)
        assert.equal("1", h["retry-after"])
        assert.equal("Elasticsearch", h["x-elastic-product"])
        assert.equal("es_rejected_execution_exception", b.error.type)
        assert.equal(429, b.status)
      end
      local st = jreq("POST", "/_bulk", '{"index":{"_index":"f"}}\n{}\n', NDJSON)
      assert.equal(200, st)
    end)
    it("method filter and '*' path, custom bodies, forever", function()
      srv:fault({ path = "*", method = "GET", count = -1, status = 503, body = { custom = true } })
      local st, b = jreq("GET", "/")
      assert.equal(503, st)
      assert.same({ custom = true }, b)
      st, b = jreq("GET", "/_cluster/health")
      assert.equal(503, st)
      st = jreq("PUT", "/notget")
      assert.equal(200, st)
      srv:clear_faults()
      srv:fault({ path = "/", status = 502, body = "plain text" })
      local _, _, raw = req("GET", "/")
      assert.equal("plain text", raw)
    end)
    it("rules match in order and are consumed", function()
      srv:fault({ path = "/", status = 504 })
      srv:fault({ path = "/", status = 503 })
      assert.equal(504, (req("GET", "/")))
      assert.equal(503, (req("GET", "/")))
      assert.equal(200, (req("GET", "/")))
    end)
    it("rejects invalid fault specs", function()
      local st, _, b = srv:request("POST", "/_esx/faults", '{"path":"/","bogus":1}', JSON)
      assert.equal(400, st)
      assert.matches("unknown fault field %[bogus%]", b)
      st = srv:request("POST", "/_esx/faults", "{nope", JSON)
      assert.equal(400, st)
      st = srv:request("POST", "/_esx/faults", '{"status":500}', JSON)
      assert.equal(400, st)
    end)
    it("stall_ms delays the response without blocking other requests", function()
      srv:fault({ path = "/", stall_ms = 400 })
      local t0 = socket.gettime()
      local st = req("GET", "/")
      local dt = socket.gettime() - t0
      assert.equal(200, st)
      assert.is_true(dt >= 0.35, "stall too short: " .. dt)
    end)
    it("stall with a timeout on the client side", function()
      srv:fault({ path = "/", stall_ms = 1500 })
      local st, _, _, err = req("GET", "/", nil, nil, { timeout = 0.2 })
      assert.is_nil(st)
      assert.equal("timeout", err)
      -- the server keeps serving while the stalled request sleeps
      local t0 = socket.gettime()
      assert.equal(200, (req("GET", "/_cluster/health")))
      assert.is_true(socket.gettime() - t0 < 0.5)
    end)
    it("drip sends the body in slices", function()
      srv:fault({ path = "/", drip = { bytes = 100, interval_ms = 20 } })
      local t0 = socket.gettime()
      local st, b = jreq("GET", "/")
      assert.equal(200, st)
      assert.equal("You Know, for Search", b.tagline)
      assert.is_true(socket.gettime() - t0 >= 0.06)
    end)
    it("close_after_bytes truncates the body and closes", function()
      srv:fault({ path = "/", close_after_bytes = 10 })
      local st, h, b, err = req("GET", "/")
      assert.equal(200, st)
      assert.is_true(tonumber(h["content-length"]) > 10)
      assert.equal(10, #b)
      assert.equal("closed", err)
    end)
    it("reset_after_bytes ends with a TCP reset", function()
      srv:fault({ path = "/", reset_after_bytes = 5 })
      local st, h, b, err = req("GET", "/")
      assert.equal(200, st)
      assert.is_true(tonumber(h["content-length"]) > 5)
      assert.is_true(#b <= 5)
      assert.is_truthy(err == "connection reset by peer" or err == "closed", tostring(err))
    end)
    it("corrupt_gzip answers a gzip body that does not inflate", function()
      srv:fault({ path = "/", corrupt_gzip = true })
      local st, h, raw = req("GET", "/", nil, { ["Accept-Encoding"] = "gzip" }, { raw = true })
      assert.equal(200, st)
      assert.equal("gzip", h["content-encoding"])
      assert.equal("\31\139", raw:sub(1, 2))
      assert.equal("", ds.gunzip(raw))
    end)
    it("gzip_members answers the body as that many gzip members", function()
      local _, _, plain = req("GET", "/")
      srv:fault({ path = "/", gzip_members = 3 })
      local st, h, raw = req("GET", "/", nil, { ["Accept-Encoding"] = "gzip" }, { raw = true })
      assert.equal(200, st)
      assert.equal("gzip", h["content-encoding"])
      assert.equal(3, select(2, raw:gsub("\31\139\8", "")))
      assert.equal(plain, ds.gunzip(raw))
      local bad, _, b = srv:request("POST", "/_esx/faults", '{"path":"/","gzip_members":0}', JSON)
      assert.equal(400, bad)
      assert.matches("%[gzip_members%] must be an integer 1..64", b)
    end)
    it("empty_reply closes without a response", function()
      srv:fault({ path = "/", empty_reply = true })
      local st, _, _, err = req("GET", "/")
      assert.is_nil(st)
      assert.equal("closed", err)
      assert.equal(200, (req("GET", "/")))
      local log = srv:requests("/")
      assert.equal(0, log.requests[1].status)
      assert.equal(200, log.requests[2].status)
    end)
    it("status combines with stall_ms, and faulted requests are logged with their status", function()
      srv:fault({ path = "/_search", status = 429, stall_ms = 200, headers = { ["Retry-After"] = "2" } })
      local t0 = socket.gettime()
      local st, b, h = jreq("POST", "/_search", { query = { match_all = {} } })
      assert.is_true(socket.gettime() - t0 >= 0.18)
      assert.equal(429, st)
      assert.equal("2", h["retry-after"])
      assert.equal("es_rejected_execution_exception", b.error.type)
      assert.equal(429, srv:requests("/_search").requests[1].status)
    end)
    it("GET /_esx/faults lists rules with their remaining count", function()
      srv:fault({ path = "/a", status = 502, count = -1 })
      srv:fault({ path = "/b", status = 503, count = 3 })
      req("GET", "/b")
      local _, _, raw = srv:request("GET", "/_esx/faults")
      local list = cjson.decode(raw).faults
      assert.equal(2, #list)
      assert.equal("/a", list[1].path)
      assert.equal(-1, list[1].count)
      assert.equal(2, list[2].count)
      srv:clear_faults()
      _, _, raw = srv:request("GET", "/_esx/faults")
      assert.same({}, cjson.decode(raw).faults)
    end)
    it("endless streams until the client goes away", function()
      srv:fault({ path = "/_search", endless = true })
      local st, h, b, err = req("GET", "/_search", nil, nil, { max_bytes = 200000 })
      assert.equal(200, st)
      assert.equal("chunked", h["transfer-encoding"])
      assert.equal("max_bytes", err)
      assert.is_true(#b >= 200000)
      assert.equal('{"took":1,"hits":[', b:sub(1, 18))
      assert.equal(200, (req("GET", "/")))
    end)
    it("item_status fails the first item_count bulk items and applies the rest", function()
      srv:fault({ path = "/_bulk", item_status = 429, item_count = 2 })
      local body = ""
      for i = 1, 3 do body = body .. '{"index":{"_index":"it","_id":"' .. i .. '"}}\n{"n":' .. i .. '}\n' end
      local st, b = jreq("POST", "/_bulk?refresh=true", body, NDJSON)
      assert.equal(200, st)
      assert.is_true(b.errors)
      assert.same({ index = { _index = "it", _id = "1", status = 429, error = {
        type = "es_rejected_execution_exception",
        reason = "rejected execution of primary operation [coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, primary_operation_bytes=0, max_coordinating_and_primary_bytes=0] (esxd injected fault)" } } },
        b.items[1])
      assert.equal(429, b.items[2].index.status)
      assert.equal(201, b.items[3].index.status)
      local _, c = jreq("GET", "/it/_count")
      assert.equal(1, c.count)
    end)
    it("item_status without item_count fails every item (400 as mapper_parsing_exception)", function()
      srv:fault({ path = "/_bulk", item_status = 400 })
      local _, b = jreq("POST", "/_bulk", '{"index":{"_index":"it2"}}\n{}\n{"delete":{"_index":"it2","_id":"x"}}\n', NDJSON)
      assert.equal(400, b.items[1].index.status)
      assert.equal("mapper_parsing_exception", b.items[1].index.error.type)
      assert.equal(400, b.items[2].delete.status)
    end)
  end)

  describe("control API", function()
    it("/_esx/health", function()
      local st, _, b = srv:request("GET", "/_esx/health")
      assert.equal(200, st)
      assert.same({ ok = true }, cjson.decode(b))
    end)
    it("records requests (last 1000) with counts, and is itself never recorded", function()
      req("GET", "/", nil, { ["X-Test"] = "yes" })
      req("PUT", "/rec/_doc/1?refresh=true", '{"a":1}', JSON)
      srv:request("GET", "/_esx/faults")
      local log = srv:requests()
      assert.same({ ["/"] = 1, ["/rec/_doc/1"] = 1 }, log.counts)
      assert.equal(2, #log.requests)
      local r = log.requests[2]
      assert.equal("PUT", r.method)
      assert.equal("/rec/_doc/1", r.path)
      assert.equal("refresh=true", r.query)
      assert.equal(7, r.body_bytes)
      assert.equal(7, r.body_wire_bytes)
      assert.equal(201, r.status)
      assert.equal("application/json", r.headers["content-type"])
      assert.equal("yes", log.requests[1].headers["x-test"])
      local only = srv:requests("/")
      assert.same({ ["/"] = 1 }, only.counts)
      assert.equal(1, #only.requests)
      srv:clear_requests()
      assert.equal(0, #srv:requests().requests)
    end)
    it("keeps only the last 1000 requests but counts all", function()
      for _ = 1, 1005 do srv:request("HEAD", "/") end
      local log = srv:requests()
      assert.equal(1005, log.counts["/"])
      assert.equal(1000, #log.requests)
    end)
    it("DELETE /_esx/data drops all indices", function()
      jreq("PUT", "/d1")
      local st = srv:request("DELETE", "/_esx/data")
      assert.equal(200, st)
      assert.equal(404, (req("HEAD", "/d1")))
    end)
    it("unknown control endpoints are 404", function()
      assert.equal(404, (srv:request("GET", "/_esx/nope")))
    end)
  end)

  describe("robustness", function()
    it("no request in these specs produced a 500", function()
      local bad = {}
      for _, s in ipairs(statuses) do
        if s[1] == 500 then bad[#bad + 1] = s[2] .. " " .. s[3] end
      end
      assert.same({}, bad)
      local f = assert(io.open(srv.dir .. "/error.log", "rb"))
      local log = f:read("*a"); f:close()
      assert.is_nil(log:find("esxd internal error", 1, true), log)
      assert.is_nil(log:find("[error]", 1, true), log)
    end)
  end)
end)

describe("esxd with authentication", function()
  local asrv
  setup(function() asrv = ds.start({ user = "elastic", password = "s3cret" }) end)
  teardown(function() if asrv then asrv:stop() end end)

  local function b64(s)
    local chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    return ((s:gsub(".", function(x)
      local r, byte = "", x:byte()
      for i = 8, 1, -1 do r = r .. (byte % 2 ^ i - byte % 2 ^ (i - 1) > 0 and "1" or "0") end
      return r
    end) .. "0000"):gsub("%d%d%d?%d?%d?%d?", function(x)
      if #x < 6 then return "" end
      local c = 0
      for i = 1, 6 do c = c + (x:sub(i, i) == "1" and 2 ^ (6 - i) or 0) end
      return chars:sub(c + 1, c + 1)
    end) .. ({ "", "==", "=" })[#s % 3 + 1])
  end

  it("401 without credentials, with the Basic challenge", function()
    local st, h, b = asrv:request("GET", "/")
    assert.equal(401, st)
    assert.equal('Basic realm="security" charset="UTF-8"', h["www-authenticate"])
    assert.equal("Elasticsearch", h["x-elastic-product"])
    local e = cjson.decode(b)
    assert.equal("security_exception", e.error.type)
    assert.equal("missing authentication credentials for REST request [/]", e.error.reason)
    assert.equal(401, e.status)
  end)
  it("401 with a wrong password", function()
    local st, _, b = asrv:request("GET", "/_cluster/health", nil, { Authorization = "Basic " .. b64("elastic:wrong") })
    assert.equal(401, st)
    assert.equal("unable to authenticate user [elastic] for REST request [/_cluster/health]", cjson.decode(b).error.reason)
  end)
  it("200 with Basic or ApiKey credentials", function()
    assert.equal(200, (asrv:request("GET", "/", nil, { Authorization = "Basic " .. b64("elastic:s3cret") })))
    assert.equal(200, (asrv:request("GET", "/", nil, { Authorization = "ApiKey " .. b64("elastic:s3cret") })))
    assert.equal(401, (asrv:request("GET", "/", nil, { Authorization = "ApiKey " .. b64("elastic:nope") })))
  end)
  it("HEAD without credentials is 401 with no body", function()
    local st, _, b = asrv:request("HEAD", "/")
    assert.equal(401, st)
    assert.equal("", b)
  end)
  it("the control API needs no credentials", function()
    assert.equal(200, (asrv:request("GET", "/_esx/health")))
    assert.equal(200, (asrv:request("GET", "/_esx/requests")))
  end)
end)

describe("esxd with --max-body", function()
  local msrv
  setup(function() msrv = ds.start({ max_body = 1024 }) end)
  teardown(function() if msrv then msrv:stop() end end)

  it("413 with an empty body for a larger request", function()
    local big = '{"index":{"_index":"m"}}\n{"a":"' .. string.rep("x", 2000) .. '"}\n'
    local st, h, b = msrv:request("POST", "/_bulk", big, NDJSON)
    assert.equal(413, st)
    assert.equal("", b)
    assert.equal("Elasticsearch", h["x-elastic-product"])
    local log = msrv:requests("/_bulk")
    assert.equal(413, log.requests[1].status)
  end)
  it("caps the inflated size of gzip bodies too", function()
    local big = '{"index":{"_index":"m"}}\n{"a":"' .. string.rep("x", 5000) .. '"}\n'
    local st, _, b = msrv:request("POST", "/_bulk", big, NDJSON, { gzip = true })
    assert.equal(413, st)
    assert.equal("", b)
  end)
  it("accepts a request under the limit", function()
    assert.equal(200, (msrv:request("POST", "/_bulk", '{"index":{"_index":"m"}}\n{"a":1}\n', NDJSON)))
  end)
end)

describe("esxd with --tls", function()
  local tsrv
  setup(function() tsrv = ds.start({ tls = true }) end)
  teardown(function() if tsrv then tsrv:stop() end end)

  it("serves https with a certificate for 127.0.0.1 and localhost", function()
    assert.matches("^https://127%.0%.0%.1:%d+$", tsrv.url)
    assert.matches("/esxd%-%d+/cert%.pem$", tsrv.ca_file)
    local st, _, b = tsrv:request("GET", "/")
    assert.equal(200, st)
    assert.equal("You Know, for Search", cjson.decode(b).tagline)
    local h = io.popen("openssl x509 -noout -text -in " .. tsrv.ca_file)
    local text = h:read("*a"); h:close()
    assert.matches("IP Address:127%.0%.0%.1", text)
    assert.matches("DNS:localhost", text)
  end)
end)

describe("esxd with --keepalive-timeout", function()
  local ksrv
  setup(function() ksrv = ds.start({ keepalive_timeout = 200 }) end)
  teardown(function() if ksrv then ksrv:stop() end end)

  it("closes idle keep-alive connections after the timeout", function()
    local sock = socket.tcp()
    sock:settimeout(2)
    assert(sock:connect("127.0.0.1", ksrv.port))
    assert(sock:send("GET /_esx/health HTTP/1.1\r\nHost: x\r\n\r\n"))
    local line = sock:receive("*l")
    assert.equal("HTTP/1.1 200 OK", line)
    local len
    repeat
      line = sock:receive("*l")
      len = len or tonumber(line:match("^[Cc]ontent%-[Ll]ength:%s*(%d+)"))
    until line == ""
    assert(sock:receive(len))
    local t0 = socket.gettime()
    local data, err = sock:receive(1)
    local dt = socket.gettime() - t0
    sock:close()
    assert.is_nil(data)
    assert.equal("closed", err)
    assert.is_true(dt >= 0.15 and dt < 1.5, "closed after " .. dt)
  end)
end)

describe("esxd command", function()
  local function run(args)
    local h = io.popen(ds.esxd .. " " .. args .. " 2>&1; echo \"rc=$?\"")
    local out = h:read("*a"); h:close()
    local rc = tonumber(out:match("rc=(%d+)%s*$"))
    return rc, out:gsub("rc=%d+%s*$", "")
  end

  it("start, status, double start, busy port, stop", function()
    local s = ds.start()
    local ok, err = pcall(function()
      local rc, out = run("status --port " .. s.port)
      assert.equal(0, rc)
      assert.matches("esxd running on port " .. s.port .. " %(pid %d+%)", out)
      rc, out = run("start --port " .. s.port)
      assert.equal(1, rc)
      assert.matches("esxd already running on port " .. s.port .. " %(pid %d+%)", out)
      -- a port held by something else
      local holder = socket.bind("127.0.0.1", 0)
      local _, hport = holder:getsockname()
      rc, out = run("start --port " .. hport)
      holder:close()
      assert.equal(1, rc)
      assert.matches("port " .. hport .. " is in use", out)
      rc = run("start")
      assert.equal(2, rc)
    end)
    s:stop()
    assert(ok, err)
    local rc, out = run("status --port " .. s.port)
    assert.equal(1, rc)
    assert.matches("not running", out)
    local h = io.popen("pgrep -f 'esxd-" .. s.port .. "/nginx[.]conf'")
    local left = h:read("*a"); h:close()
    assert.equal("", left)
  end)
end)

describe("esxd.errors.search_phase_all", function()
  -- the module itself (it needs only cjson), for what no HTTP request can reach yet: every
  -- shard failure esxd makes over HTTP is a 400
  local saved
  setup(function()
    saved = package.path
    package.path = "./devserver/lua/?.lua;" .. package.path
  end)
  teardown(function() package.path = saved end)

  it("returns the status SearchPhaseExecutionException.status gives: first 502-504, else the last 5xx", function()
    local errors = require "esxd.errors"
    local function failure(status)
      return errors.search_phase("i" .. status, errors.new(status, "exception", "failed with " .. status))
    end
    local function status_of(...)
      local list = {}
      for i, st in ipairs({ ... }) do list[i] = failure(st) end
      return errors.search_phase_all(list, "all shards failed").status
    end
    assert.equal(400, status_of(400, 404))
    assert.equal(404, status_of(404, 400))
    assert.equal(503, status_of(400, 500, 503, 502))   -- a retryable one wins over any other
    assert.equal(504, status_of(504, 503))
    assert.equal(501, status_of(500, 400, 501))        -- else the last 5xx, not the first
    assert.equal(500, status_of(429, 500))
    assert.equal(503, errors.search_phase_all({ failure(500), failure(503) }, "Partial shards failure").status)
  end)
end)
