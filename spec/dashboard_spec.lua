-- spec/dashboard_spec.lua -- the rollups dashboard in a real browser: demo-like traffic through
-- the example nginx (2 workers), then headless Chromium (Debian's, driven by playwright-core,
-- examples/dashboard/test/check.js) loads the page; the numbers it shows must be the rollups
-- merged by esx.collector.totals, the charts must be drawn, and a screenshot is saved to
-- build/dashboard-screenshot.png (the committed examples/dashboard/screenshot.png comes from a
-- full demo run; tests never rewrite tracked files).  Missing Chromium, node or npm fail this spec; they are
-- never a reason to skip it.
local ds = require "spec.support.devserver"
local socket = require "socket"
local free_port = require("spec.support.net").free_port
local run = require("spec.support.shell").run
local cjson = require "cjson"
local esx = require "esx"
local collector = require "esx.collector"

package.path = "./examples/demo/?.lua;./examples/?.lua;" .. package.path
local traffic = require "traffic"

local TEST_DIR = "examples/dashboard/test"
local SHOT = "build/dashboard-screenshot.png"

local function have(cmd) return (run("command -v " .. cmd)) end

-- Chromium, node and npm, and playwright-core in examples/dashboard/test/node_modules.
local function prerequisites()
  if not (have("/usr/bin/chromium") and have("node") and have("npm")) then
    local ok, out = run("tools/deps test")
    assert(ok, "the dashboard test needs chromium, nodejs and npm (tools/deps test):\n" .. out)
  end
  assert(have("/usr/bin/chromium"), "/usr/bin/chromium is missing: apt-get install chromium")
  assert(have("node") and have("npm"), "node and npm are missing: apt-get install nodejs npm")
  if not io.open(TEST_DIR .. "/node_modules/playwright-core/package.json") then
    local ok, out = run("cd " .. TEST_DIR .. " && npm ci --no-audit --no-fund")
    assert(ok, "npm ci in " .. TEST_DIR .. " failed:\n" .. out)
  end
end

describe("the rollups dashboard in headless Chromium #nginx", function()
  local es, client, port, dir, summary

  setup(function()
    prerequisites()
    es = ds.start{}
    client = assert(esx.client{ hosts = { es.url } })
    port, dir = free_port(), os.tmpname()
    os.remove(dir)
    local ok, out = run("lua5.4 examples/bulk_load.lua --es " .. es.url .. " --articles 20 --users 3000 --max-readers 500")
    assert(ok, out)
    ok, out = run(("examples/nginx/run start --port %d --es-url %s --dir %s --rollup-window 1000"):format(port, es.url, dir))
    assert(ok, out)
    summary = traffic.run{ url = "http://127.0.0.1:" .. port, duration = 6, rate = 200,
      concurrency = 16, users = 3000, articles = 20, run = "dashboardspec" }
    -- everything accepted is rolled up (both workers' rows) before the page is loaded
    local deadline = socket.gettime() + 20
    repeat
      client:refresh("rollups-*")
      local total = 0
      for _, site in ipairs(traffic.SITES) do
        for _, r in ipairs(assert(collector.totals(client, { site_id = site }))) do total = total + r.count end
      end
      if total == summary.accepted then break end
      socket.sleep(0.3)
    until socket.gettime() > deadline
  end)

  teardown(function()
    if port then run(("examples/nginx/run stop --port %d --dir %s"):format(port, dir)) end
    if dir then os.execute("rm -rf " .. dir) end
    if client then client:close() end
    if es then es:stop() end
  end)

  it("shows impressions, clicks, CTR and unique visitors per block and variant as esx.collector.totals merges them", function()
    assert.is_true(summary.accepted > 500)
    local ok, out = run(("node %s/check.js 'http://127.0.0.1:%d/dashboard/?site=news&range=all' %s"):format(TEST_DIR, port, SHOT))
    assert(ok, out)
    local shown = cjson.decode(out:match("(%b{})%s*$"))
    assert.same({}, shown.errors)
    assert.equal("news", shown.site)

    local want = {}
    for _, r in ipairs(assert(collector.totals(client, { site_id = "news" }))) do
      local k = r.block_id .. "/" .. r.variant
      want[k] = want[k] or { impressions = 0, clicks = 0, uniques = 0 }
      if r.type == "view" then want[k].impressions, want[k].uniques = r.count, r.uniques
      elseif r.type == "click" then want[k].clicks = r.count end
    end
    local n = 0
    for _, row in ipairs(shown.rows) do
      local w = assert(want[row.block .. "/" .. row.variant], "unexpected row " .. row.block .. "/" .. row.variant)
      assert.same({ w.impressions, w.clicks, w.uniques }, { row.impressions, row.clicks, row.uniques })
      -- two decimals, rounded: JS's toFixed takes the upper one on an exact tie (1/32 =
      -- 3.125 % shows 3.13 %) where C's %.2f takes the even one, so compare the value
      local ctr = tonumber(row.ctr:match("^(%d+%.%d%d) %%$"))
      assert(ctr, "CTR shown as " .. row.ctr)
      assert.is_true(math.abs(ctr - 100 * w.clicks / w.impressions) <= 0.005 + 1e-9,
        row.ctr .. " for " .. w.clicks .. " / " .. w.impressions)
      n = n + 1
    end
    assert.equal(6, n) -- 3 blocks x 2 variants
    assert.equal(3, shown.blocks)
    assert.equal(12, shown.charts)       -- impressions, clicks, CTR, uniques per block
    assert.equal(24, shown.lines)        -- one line per variant in each
    local f = assert(io.open(SHOT, "rb"))
    assert.equal("\137PNG", f:read(4))
    f:close()
  end)
end)
