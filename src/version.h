/* version.h -- the esx version (the Makefile and the version spec read it from here). */
#ifndef ESX_VERSION_H
#define ESX_VERSION_H
#define ESX_VERSION "0.1.0"
#endif
