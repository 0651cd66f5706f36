-- esxd.pretty: ?pretty output, re-indenting a compact JSON text the way ES's XContent
-- pretty printer (Jackson's DefaultPrettyPrinter, two-space indenter for objects and arrays)
-- writes it: "key" : value, one member or element per line, "{ }" / "[ ]" when empty, and a
-- final newline (lfAtEnd). Works on the text, so key order and number spelling are kept.
local _M = {}

local rep, concat, find, sub = string.rep, table.concat, string.find, string.sub

function _M.format(text)
  if text == "" then return text end
  local out, depth, i, n = {}, 0, 1, #text
  while i <= n do
    local c = sub(text, i, i)
    if c == '"' then
      local j = i + 1
      while true do
        local q = find(text, '["\\]', j)
        if not q then j = n; break end
        if sub(text, q, q) == "\\" then j = q + 2 else j = q; break end
      end
      out[#out + 1] = sub(text, i, j)
      i = j + 1
    elseif c == "{" or c == "[" then
      local close = c == "{" and "}" or "]"
      local k = find(text, "[^ \t\r\n]", i + 1)
      if k and sub(text, k, k) == close then
        out[#out + 1] = c .. " " .. close
        i = k + 1
      else
        depth = depth + 1
        out[#out + 1] = c .. "\n" .. rep("  ", depth)
        i = i + 1
      end
    elseif c == "}" or c == "]" then
      depth = depth - 1
      out[#out + 1] = "\n" .. rep("  ", depth) .. c
      i = i + 1
    elseif c == "," then
      out[#out + 1] = ",\n" .. rep("  ", depth)
      i = i + 1
    elseif c == ":" then
      out[#out + 1] = " : "
      i = i + 1
    elseif c == " " or c == "\t" or c == "\r" or c == "\n" then
      i = i + 1
    else
      local j = find(text, '[,:%]}%s"]', i) or n + 1
      out[#out + 1] = sub(text, i, j - 1)
      i = j
    end
  end
  out[#out + 1] = "\n"
  return concat(out)
end

return _M
