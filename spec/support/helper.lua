-- spec/support/helper.lua -- loaded by busted before any spec (see .busted).
-- busted does not fail when a helper is broken, so this one exits loudly instead: a suite
-- that runs against the wrong build of esx.core must not pass.
local want = os.getenv("ESX_TEST_FLAVOUR")
local ok, core = pcall(require, "esx.core")
if not ok then
  io.stderr:write("spec helper: cannot load esx.core: ", tostring(core), "\n")
  os.exit(1)
end
if want and core.flavour ~= want then
  io.stderr:write("spec helper: esx.core is the ", core.flavour, " build, expected ", want, "\n")
  os.exit(1)
end
