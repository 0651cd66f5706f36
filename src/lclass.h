/*
 * lclass.h -- the metatable of a userdata class seen by Lua, and userdata that own C heap
 * memory for the length of a call (so that a raise cannot leak it).
 */
#ifndef ESX_LCLASS_H
#define ESX_LCLASS_H

#include "buf.h"
#include "compat.h"

/* Registers the metatable `name` (once per Lua state): methods (may be NULL) as __index,
 * gc and tostring (each may be NULL) as __gc and __tostring, name as __name.  Leaves the
 * stack as it was; fails only by raising Lua's own memory error. */
void esx_lclass(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc,
                lua_CFunction tostring);

/* Pushes a new userdata holding one pointer, NULL at first, whose __gc frees what it points
 * to.  Push the box before allocating, keep the malloc'ed block in *box while Lua calls that
 * may raise run, then free it and set *box = NULL (or take it: set *box = NULL).  The box
 * owns the block; the caller owns nothing once it is stored.  Fails only by raising Lua's
 * memory error, before anything is stored. */
void **esx_lbox_push(lua_State *L);

/* The same for a growable buffer: pushes a userdata holding an esx_buf bounded by max
 * (esx_buf_init'ed, empty); its __gc frees the buffer's data.  The caller may esx_buf_free
 * it early; esx_buf_take hands the data to the caller, who then owns it.  Fails only by
 * raising Lua's memory error, before anything is allocated. */
esx_buf *esx_lbuf_push(lua_State *L, size_t max);

/* Objects with threads of their own -- a client (its I/O thread and wake-up socket pair), a
 * collector (its shipper) -- that Lua's collector sees as a small userdata.  In a big Lua
 * heap a cycle comes only after megabytes of Lua allocations, and such objects dropped
 * without close() meanwhile (thousands) all kept their threads and descriptors.  A
 * constructor calls esx_lthreaded_collect first: once as many of them were made as were
 * open after the last cycle forced here (at least 32), it forces a full one, so that the
 * dropped ones stay about as few as the live ones.  esx_lthreaded_add(&flag) counts a new
 * object open (flag = 1); esx_lthreaded_remove(&flag) uncounts it once, at close or __gc. */
void esx_lthreaded_collect(lua_State *L);
void esx_lthreaded_add(int *counted);
void esx_lthreaded_remove(int *counted);

#endif
