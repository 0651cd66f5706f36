/*
 * lerror.h -- the esx error object seen by Lua.
 *
 * Run-time failures are returned as `nil, err` where err is a table
 * {kind=<string>, message=<string>, ...} with the shared metatable "esx.error", whose
 * __tostring gives "<kind>: <message>".  Caller mistakes are raised instead (luaL_argerror).
 */
#ifndef ESX_LERROR_H
#define ESX_LERROR_H

#include "compat.h"

/* Registers the "esx.error" metatable; called once from luaopen_esx_core. */
void esx_lerror_open(lua_State *L);

/* Pushes a new error table {kind=kind, message=<formatted>} (with the esx.error metatable)
 * onto the stack.  Never fails other than by raising Lua's own memory error. */
void esx_lerror_push(lua_State *L, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Pushes nil and a new error; returns 2 so a binding can `return esx_lerror_fail(...)`. */
int esx_lerror_fail(lua_State *L, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Lua: core.error(kind, message [, fields]) -> err.  Builds an error from Lua code, copying
 * the extra fields (status, body, node, ...) from the optional table. */
int esx_lerror_new(lua_State *L);

#endif
