-- bench/client/datagen.lua -- deterministic test data for the client benchmark (Lua 5.4).
--
--   lua5.4 bench/client/datagen.lua events   [bytes] > events.ndjson    browser-event bulk
--   lua5.4 bench/client/datagen.lua products [bytes] > products.ndjson  product-catalog bulk
--   lua5.4 bench/client/datagen.lua response         > search_response.json
--
-- Every byte comes from a fixed-seed splitmix64 generator written here (not math.random, whose
-- algorithm differs between Lua versions), and JSON is written field by field in a fixed order,
-- so the same command prints the same bytes on every machine.  A bulk stops at the first
-- document that takes it past `bytes` (default 1048576).
--
-- The data is shaped after what the systems in ../../../shared/seeds carry, not after any
-- compression target:
--   events   -- one beacon per document as the collector ships it: site/block/variant/type from
--               small vocabularies, a random 48-bit user id and a random 32-bit event id (the
--               document _id), client and server timestamps, page URL, referrer, user agent,
--               viewport.  Random ids are what real tags send, and gzip cannot shrink them.
--   products -- a fashion e-commerce catalog document (the seed's indexing batch feeds a
--               product search): goods id, Japanese name built from brand/colour/item words,
--               brand, category path, prices, sizes, colours with stock, tags, a description
--               made of catalogue sentences, image URLs, dates.

local MASK48 = (1 << 48) - 1
local MASK32 = (1 << 32) - 1

local function splitmix64(seed)
  local state = seed
  return function()
    state = state + 0x9E3779B97F4A7C15
    local z = state
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    return z ~ (z >> 31)
  end
end

local next64 = splitmix64(20260101)

-- uniform integer in [lo, hi]
local function int(lo, hi)
  return lo + (next64() >> 1) % (hi - lo + 1)
end

local function pick(list)
  return list[int(1, #list)]
end

-- Picks with a skew (a few values are common, most rare), like site traffic or brand sizes.
local function skewed_index(n)
  local a, b = int(1, n), int(1, n)
  return a < b and a or b
end

local function pick_skewed(list)
  return list[skewed_index(#list)]
end

local function chance(p) -- p in percent
  return int(1, 100) <= p
end

-- JSON string literal; the vocabularies below hold no quote, backslash or control character.
local function str(s) return '"' .. s .. '"' end

local function iso(ms)
  local s = ms // 1000
  return os.date("!%Y-%m-%dT%H:%M:%S", s) .. string.format(".%03dZ", ms % 1000)
end

------------------------------------------------------------------------------------------------
-- browser events

local SITES = {}
for i = 1, 60 do SITES[i] = string.format("site_%04x%02x", int(0, 0xffff), i) end
local PATHS = { "/", "/category/tops", "/category/outer", "/category/shoes", "/category/bags",
  "/sale", "/ranking", "/search", "/brand", "/item", "/cart", "/mypage", "/news", "/coupon",
  "/campaign/winter", "/campaign/new-year", "/feature/denim", "/feature/coat" }
local HOSTS = {}
for i, s in ipairs(SITES) do HOSTS[i] = "www." .. s:gsub("_", "-") .. ".example.jp" end
local BLOCK_KINDS = { "banner", "popup", "recommend", "coupon", "survey", "ranking", "chat", "nav" }
local TYPES = { "impression", "impression", "impression", "impression", "impression", "view",
  "view", "click", "click", "close", "conversion", "scroll" }
local VARIANTS = { "A", "B", "control" }
local UAS = {
  "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
  "Mozilla/5.0 (iPhone; CPU iPhone OS 16_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/16.6 Mobile/15E148 Safari/604.1",
  "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Mobile Safari/537.36",
  "Mozilla/5.0 (Linux; Android 13; SO-51C) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/123.0.0.0 Mobile Safari/537.36",
  "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
  "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36 Edg/124.0.0.0",
  "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15",
  "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
}
local VIEWPORTS = { { 390, 844 }, { 393, 852 }, { 430, 932 }, { 412, 915 }, { 360, 800 },
  { 1920, 1080 }, { 1536, 864 }, { 1440, 900 }, { 1366, 768 } }
local LANGS = { "ja-JP", "ja-JP", "ja-JP", "ja", "en-US", "zh-TW", "ko-KR" }
local REFERRERS = { "", "", "https://www.google.com/", "https://www.google.co.jp/",
  "https://search.yahoo.co.jp/", "https://t.co/", "https://www.instagram.com/",
  "https://line.me/" }

local function event_lines(clock)
  local si = skewed_index(#SITES)
  local site, host = SITES[si], HOSTS[si]
  local block = string.format("%s_%s_%03d", site:sub(6), pick(BLOCK_KINDS), int(1, 40))
  local user = next64() & MASK48
  local event = next64() & MASK32
  local path = pick(PATHS)
  if path == "/item" then path = path .. "/" .. int(1000000, 9999999) end
  local url = "https://" .. host .. path
  if chance(30) then url = url .. "?utm_source=" .. pick({ "line", "mail", "instagram", "x" }) end
  local received = clock.now
  clock.now = clock.now + int(0, 3)
  local ts = received - int(20, 1500)
  local vp = pick(VIEWPORTS)
  local meta = '{"index":{"_index":"events-' .. os.date("!%Y.%m.%d", received // 1000) ..
    '","_id":"' .. event .. '"}}'
  local doc = table.concat({
    '{"site_id":', str(site),
    ',"block_id":', str(block),
    ',"variant":', str(pick(VARIANTS)),
    ',"type":', str(pick(TYPES)),
    ',"user_id":', tostring(user),
    ',"event_id":', str(tostring(event)),
    ',"ts":', tostring(ts),
    ',"url":', str(url),
    ',"referrer":', str(pick(REFERRERS)),
    ',"ua":', str(pick(UAS)),
    ',"lang":', str(pick(LANGS)),
    ',"vw":', tostring(vp[1]), ',"vh":', tostring(vp[2]),
    ',"received_at":', tostring(received),
    '}' })
  return meta, doc
end

------------------------------------------------------------------------------------------------
-- product catalog

local BRANDS = {}
do
  local first = { "ATELIER", "URBAN", "NORTH", "BLUE", "GREEN", "MAISON", "STUDIO", "LABEL",
    "COMME", "BEAMS", "JOURNAL", "FREAK", "NANO", "SHIPS", "EDIFICE", "LOWRYS", "GLOBAL", "KNOT",
    "TOMORROW", "UNITED" }
  local second = { "ARROWS", "STANDARD", "WORKS", "DEPT", "FACTORY", "LAND", "HOUSE", "CLOTHING",
    "& CO", "TOKYO", "OSAKA", "MARKET", "SUPPLY", "PROJECT", "LAB" }
  local seen = {}
  while #BRANDS < 180 do
    local name = pick(first) .. " " .. pick(second)
    if not seen[name] then
      seen[name] = true
      BRANDS[#BRANDS + 1] = { id = int(100, 20000), name = name }
    end
  end
end
local CATEGORIES = {
  { "トップス", "tops", { "Tシャツ/カットソー", "シャツ/ブラウス", "ニット/セーター", "パーカー", "スウェット", "カーディガン" } },
  { "ジャケット/アウター", "outer", { "ダウンジャケット", "コート", "テーラードジャケット", "ブルゾン", "マウンテンパーカー" } },
  { "パンツ", "pants", { "デニムパンツ", "チノパンツ", "スラックス", "ワイドパンツ", "カーゴパンツ" } },
  { "スカート", "skirt", { "ロングスカート", "プリーツスカート", "デニムスカート" } },
  { "ワンピース", "onepiece", { "シャツワンピース", "ニットワンピース", "ワンピース" } },
  { "シューズ", "shoes", { "スニーカー", "ローファー", "ブーツ", "サンダル", "パンプス" } },
  { "バッグ", "bag", { "トートバッグ", "ショルダーバッグ", "リュック", "ハンドバッグ" } },
  { "ファッション雑貨", "goods", { "帽子", "マフラー", "手袋", "ベルト", "財布" } },
}
local COLORS = { { "ブラック", "black" }, { "ホワイト", "white" }, { "ネイビー", "navy" },
  { "グレー", "gray" }, { "ベージュ", "beige" }, { "ブラウン", "brown" }, { "カーキ", "khaki" },
  { "ブルー", "blue" }, { "レッド", "red" }, { "グリーン", "green" }, { "オフホワイト", "offwhite" },
  { "チャコール", "charcoal" }, { "アイボリー", "ivory" }, { "ピンク", "pink" } }
local SIZES = { { "XS", "S", "M", "L", "XL" }, { "S", "M", "L" }, { "FREE" },
  { "36", "38", "40", "42" }, { "23.0cm", "23.5cm", "24.0cm", "24.5cm", "25.0cm", "25.5cm",
    "26.0cm", "26.5cm", "27.0cm", "27.5cm", "28.0cm" } }
local ADJ = { "オーバーサイズ", "リラックス", "ストレッチ", "ヘビーウェイト", "ウォッシャブル", "撥水",
  "セットアップ対応", "2WAY", "ライトウェイト", "ヴィンテージ加工", "コットン100%", "ウール混",
  "別注", "WEB限定", "ユニセックス" }
local SENTENCES = {
  "程よいゆとりのあるシルエットで、幅広いコーディネートに合わせやすいアイテムです。",
  "肌触りの良い素材を使用し、一枚でも重ね着でも活躍します。",
  "ご自宅の洗濯機で洗えるので、毎日のデイリーユースに最適です。",
  "シーズンを問わず着用いただける定番のデザインに仕上げました。",
  "細部までこだわったディテールが、シンプルながらも上品な印象を与えます。",
  "撥水加工を施しているため、急な雨の日にも安心です。",
  "軽量で持ち運びやすく、旅行やアウトドアシーンにもおすすめです。",
  "同素材のパンツと合わせてセットアップとしてもお楽しみいただけます。",
  "今季のトレンドカラーを取り入れた、季節感のあるカラー展開です。",
  "※画像の商品はサンプルのため、実際の商品と仕様が異なる場合がございます。",
  "※モニターの発色の具合により、実際のものと色が異なる場合がございます。",
  "The relaxed fit and soft hand feel make it an easy everyday piece.",
}
local TAGS = { "新作", "セール", "送料無料", "予約", "再入荷", "ZOZO限定", "ギフト", "クーポン対象",
  "ポイント10倍", "大きいサイズ", "プチプラ", "サステナブル" }
local GENDERS = { "men", "women", "unisex", "kids" }

local function product_doc(goods_id, day0)
  local brand = pick_skewed(BRANDS)
  local cat = pick(CATEGORIES)
  local child = pick(cat[3])
  local color_n = int(1, 5)
  local colors, used = {}, {}
  while #colors < color_n do
    local c = pick(COLORS)
    if not used[c[2]] then used[c[2]] = true; colors[#colors + 1] = c end
  end
  local sizes = pick(SIZES)
  local price = int(19, 399) * 100 - (chance(50) and 10 or 0)
  local sale = chance(25) and (price * int(50, 90) // 100) or price
  local name = (chance(60) and (pick(ADJ) .. " ") or "") .. child .. (chance(40) and (" / " .. pick(ADJ)) or "")
  local color_json = {}
  for i, c in ipairs(colors) do
    local stock = {}
    for j, s in ipairs(sizes) do
      stock[j] = '{"size":' .. str(s) .. ',"stock":' .. (chance(20) and 0 or int(1, 120)) ..
        ',"sku":"' .. goods_id .. string.format("%02d%02d", i, j) .. '"}'
    end
    color_json[i] = '{"name":' .. str(c[1]) .. ',"code":' .. str(c[2]) .. ',"skus":[' ..
      table.concat(stock, ",") .. '],"image":"https://c.imgz.example.jp/goods/' ..
      (goods_id % 100) .. '/' .. goods_id .. '/' .. goods_id .. '_' .. c[2] .. '_500.jpg"}'
  end
  local tags = {}
  for _ = 1, int(0, 4) do tags[#tags + 1] = str(pick(TAGS)) end
  local desc = {}
  for _ = 1, int(2, 5) do desc[#desc + 1] = pick(SENTENCES) end
  local created = day0 - int(0, 400) * 86400000 - int(0, 86399) * 1000
  local updated = created + int(0, 30) * 86400000
  local doc = table.concat({
    '{"goods_id":', tostring(goods_id),
    ',"name":', str(name),
    ',"brand":{"id":', tostring(brand.id), ',"name":', str(brand.name), '}',
    ',"category":{"parent":', str(cat[1]), ',"parent_code":', str(cat[2]),
    ',"child":', str(child), '}',
    ',"gender":', str(pick(GENDERS)),
    ',"price":', tostring(price),
    ',"sale_price":', tostring(sale),
    ',"on_sale":', sale < price and "true" or "false",
    ',"colors":[', table.concat(color_json, ","), ']',
    ',"tags":[', table.concat(tags, ","), ']',
    ',"description":', str(table.concat(desc)),
    ',"rating":', string.format("%.1f", int(30, 50) / 10),
    ',"review_count":', tostring(int(0, 800)),
    ',"created_at":', str(iso(created)),
    ',"updated_at":', str(iso(updated)),
    '}' })
  return doc
end

------------------------------------------------------------------------------------------------

local DAY0 = 1795996800000 -- 2026-11-30T00:00:00Z in ms

local function bulk(kind, limit)
  local out, n = {}, 0
  local clock = { now = DAY0 + 9 * 3600000 }
  local goods_id = 6800000 + int(0, 99999)
  while n < limit do
    local meta, doc
    if kind == "events" then
      meta, doc = event_lines(clock)
    else
      goods_id = goods_id + int(1, 40)
      meta = '{"index":{"_index":"goods","_id":"' .. goods_id .. '"}}'
      doc = product_doc(goods_id, DAY0)
    end
    local line = meta .. "\n" .. doc .. "\n"
    out[#out + 1] = line
    n = n + #line
  end
  return table.concat(out)
end

-- A listing page asks only for the fields it shows ("_source": [...] in the query), so a hit
-- is a product summary, not the whole catalog document.
local function product_summary(goods_id)
  local brand = pick_skewed(BRANDS)
  local cat = pick(CATEGORIES)
  local child = pick(cat[3])
  local color = pick(COLORS)
  local price = int(19, 399) * 100 - (chance(50) and 10 or 0)
  local sale = chance(25) and (price * int(50, 90) // 100) or price
  local name = (chance(60) and (pick(ADJ) .. " ") or "") .. child
  return table.concat({
    '{"goods_id":', tostring(goods_id),
    ',"name":', str(name),
    ',"brand":{"name":', str(brand.name), '}',
    ',"price":', tostring(price),
    ',"sale_price":', tostring(sale),
    ',"image":"https://c.imgz.example.jp/goods/', tostring(goods_id % 100), '/',
    tostring(goods_id), '/', tostring(goods_id), '_', color[2], '_215.jpg"',
    '}' })
end

local function search_response()
  local hits = {}
  local goods_id = 6800000 + int(0, 99999)
  for i = 1, 10 do
    goods_id = goods_id + int(1, 40)
    hits[i] = '{"_index":"goods","_id":"' .. goods_id .. '","_score":' ..
      string.format("%.7f", 12.5 - i * 0.37 - int(0, 99) / 1000) .. ',"_source":' ..
      product_summary(goods_id) .. '}'
  end
  return '{"took":4,"timed_out":false,"_shards":{"total":3,"successful":3,"skipped":0,"failed":0},' ..
    '"hits":{"total":{"value":1873,"relation":"eq"},"max_score":12.1234567,"hits":[' ..
    table.concat(hits, ",") .. ']}}'
end

local what, bytes = arg[1], tonumber(arg[2] or "1048576")
if what == "events" or what == "products" then
  io.write(bulk(what, bytes))
elseif what == "response" then
  io.write(search_response(), "\n")
else
  io.stderr:write("usage: lua5.4 datagen.lua events|products [bytes] | response\n")
  os.exit(2)
end
