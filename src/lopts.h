/*
 * lopts.h -- reading an options table that lua/esx/options.lua has already checked, into a
 * C config.  Names and types were validated in Lua (with messages naming the option); these
 * readers still raise, naming the constructor and option, if a value is not what C needs.
 */
#ifndef ESX_LOPTS_H
#define ESX_LOPTS_H

#include <stddef.h>
#include <stdint.h>

#include "compat.h"

/* t[name] as an integer, def when nil.  Raises when not an integer. */
int64_t esx_lopt_int(lua_State *L, int t, const char *ctor, const char *name, int64_t def);

/* t[name] as a number, def when nil.  Raises when not a number. */
double esx_lopt_num(lua_State *L, int t, const char *ctor, const char *name, double def);

/* t[name] as a boolean (Lua truthiness), def when nil. */
int esx_lopt_bool(lua_State *L, int t, const char *ctor, const char *name, int def);

/* Copies t[name] into out ("" when nil).  Raises when not a string, when it has a NUL, or
 * when it does not fit in outlen bytes. */
void esx_lopt_str(lua_State *L, int t, const char *ctor, const char *name, char *out,
                  size_t outlen);

#endif
