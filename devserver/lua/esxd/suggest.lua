-- esxd.suggest: ES's "did you mean" for unknown names (Lucene's LevenshteinDistance).
local _M = {}

-- 1 - edits / the longer length, as Lucene's LevenshteinDistance.getDistance.
function _M.similarity(a, b)
  local la, lb = #a, #b
  local prev = {}
  for j = 0, lb do prev[j] = j end
  for i = 1, la do
    local cur, ca = { [0] = i }, a:byte(i)
    for j = 1, lb do
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca == b:byte(j) and 0 or 1))
    end
    prev = cur
  end
  return 1 - prev[lb] / math.max(la, lb, 1)
end

-- The candidates closer to name than threshold, closest first (then by name).
function _M.close(name, candidates, threshold)
  local scored = {}
  for _, c in ipairs(candidates) do
    local d = _M.similarity(name, c)
    -- (a name ES has but esxd lacks is not suggested to itself)
    if d > threshold and c ~= name then scored[#scored + 1] = { d, c } end
  end
  table.sort(scored, function(a, b) if a[1] ~= b[1] then return a[1] > b[1] end return a[2] < b[2] end)
  local out = {}
  for i, s in ipairs(scored) do out[i] = s[2] end
  return out
end

-- SuggestingErrorOnUnknown.suggest: "", " did you mean [x]?" or " did you mean any of [x, y]?"
function _M.suffix(name, candidates, threshold)
  local keys = _M.close(name, candidates, threshold or 0.5)
  if #keys == 0 then return "" end
  if #keys == 1 then return " did you mean [" .. keys[1] .. "]?" end
  return " did you mean any of [" .. table.concat(keys, ", ") .. "]?"
end

return _M
