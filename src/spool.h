/*
 * spool.h -- the collector's write-ahead log on disk.
 *
 * Each accepted request's events are appended to the current segment file (one record:
 * length, CRC-32, the request's bulk lines) before the request is answered, so a process
 * killed with SIGKILL loses nothing it acknowledged; fdatasync runs on an interval (for
 * power loss).  Segments are named seg-<pid>-<seq>.log; a segment is deleted once every
 * event in it is acknowledged by Elasticsearch.  On start, and periodically, a process
 * claims the segments of processes that no longer exist (atomic rename) and replays them.
 * A torn record at a segment's end (a write cut short) ends that segment's replay.
 */
#ifndef ESX_SPOOL_H
#define ESX_SPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct esx_segment {
    char path[600];
    int fd;                  /* open for appending while current, else -1 */
    size_t bytes;
    int64_t pending;         /* events from this segment not yet acknowledged */
    int sealed;              /* no more appends: deleted when pending reaches 0 */
    struct esx_segment *next;
} esx_segment;

typedef struct esx_spool {
    char dir[512];
    pid_t pid;
    uint64_t seq;
    size_t max_segment_bytes;
    esx_segment *current;
    esx_segment *segments;   /* every live segment, current included */
    int dirty;               /* written since the last fdatasync */
    uint64_t records_written, records_replayed, bytes_on_disk;
} esx_spool;

/* Opens (creating if needed, mode 0700) the spool directory for this process.  Returns
 * NULL with a reason in why (256 bytes). */
esx_spool *esx_spool_open(const char *dir, size_t max_segment_bytes, char *why);

/* Appends one record and returns the segment it went to in *seg (the caller counts the
 * events it holds in seg->pending).  Returns 0, or -1 with a reason in why (256 bytes)
 * when the write failed (the caller must not acknowledge the events then). */
int esx_spool_append(esx_spool *sp, const char *data, size_t len, esx_segment **seg,
                     char *why);

/* fdatasync of the current segment when it was written to. */
void esx_spool_sync(esx_spool *sp);

/* n events of seg were acknowledged; a segment with none left is deleted (the current one
 * too: the next append opens a new one). */
void esx_spool_release(esx_spool *sp, esx_segment *seg, int64_t n);

/* Claims the segments of dead processes and calls fn once per record (the record's bytes,
 * valid during the call); fn returns the number of events it took from the record (added
 * to the segment's pending count), or -1 to stop (the segment stays for a later claim).
 * Returns the number of records replayed. */
int esx_spool_claim_orphans(esx_spool *sp,
                            int64_t (*fn)(void *ud, esx_segment *seg, const char *data,
                                          size_t len),
                            void *ud);

/* Closes the files (segments with pending events stay on disk for replay) and frees. */
void esx_spool_close(esx_spool *sp);

/* In a forked child: forgets the parent's open files without touching them. */
void esx_spool_forget(esx_spool *sp);

#endif
