/*
 * nodlclose.c -- preloaded under sanitizers and valgrind: Lua dlclose()s C modules at exit,
 * after which leak reports cannot name the module's functions.  Keeping modules mapped
 * until the process ends costs nothing and keeps every stack readable.
 */
int dlclose(void *handle);

int dlclose(void *handle)
{
    (void)handle;
    return 0;
}
