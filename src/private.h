/*
 * private.h -- files and directories only this process's user may touch: the spool and the
 * dead-letter file hold accepted events, and a spool segment is replayed into _bulk as it is,
 * so a path another local user could create, replace or link first must be refused, not used.
 */
#ifndef ESX_PRIVATE_H
#define ESX_PRIVATE_H

/* Creates dir and its missing parents (mode 0700) and checks that dir itself is a directory
 * -- not a symbolic link -- owned by this user (for root, also another user's in a directory
 * only root and that user may write: not /tmp) and writable by no one else, under directories
 * a third user cannot change (owned by root, this user or dir's owner; not writable by others
 * unless sticky).  Returns 0, or -1 with errno set (EPERM when it exists but is not private). */
int esx_private_dir(const char *dir);

/* Opens path for appending, and for reading what it ends with when this user may read it
 * (else write-only; created with mode 0600), refusing a symbolic link and a file
 * that is not a regular one owned by this user (for root, also another user's in a directory
 * only root and that user may write), with one link, that
 * others cannot write (a character device such as /dev/null is taken).  Returns the descriptor (the caller closes it), or -1 with
 * errno set (EPERM when the file is not private). */
int esx_private_append(const char *path);

/* Opens path for reading, with the same checks.  Returns the descriptor or -1 with errno. */
int esx_private_read(const char *path);

#endif
