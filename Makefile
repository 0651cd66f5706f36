# esx -- builds the C module twice from the same sources (Lua 5.4 and LuaJIT 2.1),
# runs the specs, the demo and the benchmarks.  `make help` lists the targets.

VERSION    := $(shell sed -n 's/^\#define ESX_VERSION "\(.*\)"/\1/p' src/version.h)
CC         ?= cc
CFLAGS     ?= -O2 -g
ESX_CFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -pthread -fvisibility=hidden \
              -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
              -Wno-unused-parameter
# -z nodelete: the module stays mapped when Lua dlclose()s it at exit (lua_close).  esx's
# threads can outlive the Lua state -- the I/O thread of a client kept alive by a collector's
# bulk still in flight, say -- and must not find their code unmapped under them.
ESX_LIBS   := -lcurl -lz -lroaring -pthread -Wl,-z,nodelete
LDFLAGS    ?=

LUA54_INC  := $(shell pkg-config --cflags lua5.4 2>/dev/null || echo -I/usr/include/lua5.4)
LUAJIT_INC := $(shell pkg-config --cflags luajit 2>/dev/null || echo -I/usr/include/luajit-2.1)

SRCS    := $(wildcard src/*.c)
HDRS    := $(wildcard src/*.h)
OBJS54  := $(patsubst src/%.c,build/lua5.4/obj/%.o,$(SRCS))
OBJSJIT := $(patsubst src/%.c,build/luajit/obj/%.o,$(SRCS))
SO54    := build/lua5.4/esx/core.so
SOJIT   := build/luajit/esx/core.so

# Relink when a source file is added or removed, not only when one changes.
SRCLIST := build/sources.txt
$(shell mkdir -p build && echo '$(SRCS)' | cmp -s - $(SRCLIST) || echo '$(SRCS)' > $(SRCLIST))

.PHONY: all build deps test test-lua54 test-luajit asan tsan valgrind fuzz demo bench rock rock-so rock-install clean help

all: build

build: $(SO54) $(SOJIT)

build/lua5.4/obj/%.o: src/%.c $(HDRS) Makefile
	@mkdir -p $(@D)
	$(CC) $(ESX_CFLAGS) $(CFLAGS) $(LUA54_INC) -c $< -o $@

build/luajit/obj/%.o: src/%.c $(HDRS) Makefile
	@mkdir -p $(@D)
	$(CC) $(ESX_CFLAGS) $(CFLAGS) $(LUAJIT_INC) -c $< -o $@

# A Lua C module never links liblua: the host (lua5.4, luajit, nginx) provides it.
$(SO54): $(OBJS54) $(SRCLIST)
	@mkdir -p $(@D)
	$(CC) -shared $(CFLAGS) $(LDFLAGS) -o $@ $(OBJS54) $(ESX_LIBS)

$(SOJIT): $(OBJSJIT) $(SRCLIST)
	@mkdir -p $(@D)
	$(CC) -shared $(CFLAGS) $(LDFLAGS) -o $@ $(OBJSJIT) $(ESX_LIBS)

deps:
	@tools/deps

test: deps build
	@tools/run-tests

# The module built with AddressSanitizer + UndefinedBehaviorSanitizer (Lua 5.4), and the
# suite run against it (tools/run-sanitized preloads the ASan runtime into lua5.4).
OBJSASAN := $(patsubst src/%.c,build/asan/obj/%.o,$(SRCS))
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
build/asan/obj/%.o: src/%.c $(HDRS) Makefile
	@mkdir -p $(@D)
	$(CC) $(ESX_CFLAGS) -O1 -g $(SANFLAGS) $(LUA54_INC) -c $< -o $@

build/asan/esx/core.so: $(OBJSASAN) $(SRCLIST)
	@mkdir -p $(@D)
	$(CC) -shared -g $(SANFLAGS) -o $@ $(OBJSASAN) $(ESX_LIBS)

# The module built with ThreadSanitizer (Lua 5.4), for `tools/run-sanitized tsan`: the I/O
# thread, the shipper thread and the Lua thread checked for data races (tools/tsan.supp).
OBJSTSAN := $(patsubst src/%.c,build/tsan/obj/%.o,$(SRCS))
TSANFLAGS := -fsanitize=thread -fno-omit-frame-pointer
build/tsan/obj/%.o: src/%.c $(HDRS) Makefile
	@mkdir -p $(@D)
	$(CC) $(ESX_CFLAGS) -O1 -g $(TSANFLAGS) $(LUA54_INC) -c $< -o $@

build/tsan/esx/core.so: $(OBJSTSAN) $(SRCLIST)
	@mkdir -p $(@D)
	$(CC) -shared -g $(TSANFLAGS) -o $@ $(OBJSTSAN) $(ESX_LIBS)

asan: deps build
	@tools/deps check
	@tools/run-sanitized asan

tsan: deps build
	@tools/deps check
	@tools/run-sanitized tsan

valgrind: deps build
	@tools/deps check
	@tools/run-sanitized valgrind

# libFuzzer: each target for SECONDS (default 60) from fuzz/corpus (see fuzz/README.md).
SECONDS ?= 60
fuzz: deps
	@tools/deps check
	@$(MAKE) -C fuzz run SECONDS=$(SECONDS)

test-lua54: build
	@tools/run-tests lua5.4

test-luajit: build
	@tools/run-tests luajit

demo: deps build
	@examples/demo/run $(if $(ES_URL),--es-url $(ES_URL))

bench: deps build
	@tools/deps bench
	@bench/run

# Builds and installs the rock into ./build/rocks (a local tree), for Lua 5.4.
rock:
	luarocks --lua-version=5.4 --tree=build/rocks make --deps-mode=none esx-scm-1.rockspec

# Used by luarocks (esx-scm-1.rockspec): one build for the Lua whose headers are in
# LUA_INCDIR, installed into the rock tree's INST_LIBDIR / INST_LUADIR.  Each LUA_INCDIR
# builds in a directory of its own: objects compiled against Lua 5.1's headers (a plain
# `luarocks make`, whose default Lua on Debian 12 is 5.1) were taken as up to date by a
# `luarocks --lua-version=5.4 make` (or `make rock`) after it, whose core.so then failed to
# load ("undefined symbol: lua_tointeger").
ROCKDIR  := build/rock/$(subst /,_,$(LUA_INCDIR))
OBJSROCK := $(patsubst src/%.c,$(ROCKDIR)/obj/%.o,$(SRCS))
$(ROCKDIR)/obj/%.o: src/%.c $(HDRS) Makefile
	@mkdir -p $(@D)
	$(CC) $(ESX_CFLAGS) $(CFLAGS) -I$(LUA_INCDIR) -c $< -o $@

$(ROCKDIR)/esx/core.so: $(OBJSROCK) $(SRCLIST)
	@mkdir -p $(@D)
	$(CC) -shared $(CFLAGS) $(LDFLAGS) -o $@ $(OBJSROCK) $(ESX_LIBS)

rock-so: $(ROCKDIR)/esx/core.so

rock-install: $(ROCKDIR)/esx/core.so
	install -d $(INST_LIBDIR)/esx $(INST_LUADIR)/esx
	install -m 755 $(ROCKDIR)/esx/core.so $(INST_LIBDIR)/esx/core.so
	install -m 644 lua/esx/*.lua $(INST_LUADIR)/esx/

clean:
	rm -rf build

help:
	@echo "make          build build/lua5.4/esx/core.so and build/luajit/esx/core.so"
	@echo "make deps     install the Debian packages esx needs (as root) when missing"
	@echo "make test     run every spec under Lua 5.4 and LuaJIT, and the nginx-hosted ones"
	@echo "make demo     start the dev server and nginx and drive the demo traffic"
	@echo "make bench    run the side-by-side benchmarks, write bench/results.md"
	@echo "make rock     luarocks make into build/rocks"
	@echo "make asan     the suite against an ASan+UBSan build"
	@echo "make tsan     the client, collector, h1, faults and cache specs under ThreadSanitizer"
	@echo "make valgrind the h1, event and json specs under valgrind (VALGRIND_SPECS for others)"
	@echo "make fuzz     every libFuzzer target for SECONDS (default 60)"
