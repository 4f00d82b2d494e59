/*
 * snapmark.h - the name of the marker of an unfinished snapshot of pending
 * rows ([source] snapshot = pending; pg/snapshot_mark.c keeps the marker, a
 * physical slot).  Pure.
 */
#ifndef OBX_SNAPMARK_H
#define OBX_SNAPMARK_H

#include <stdbool.h>
#include <stddef.h>

#define OBX_SNAPMARK_KEEP 54 /* the longest slot name kept whole: 63 minus "_snapshot" */

/*
 * Writes the marker's name for slot into out (len: 64 is enough):
 * SLOT_snapshot for a slot name of up to 54 characters, the name every
 * version gave it; for a longer one its first 37 characters, '_', 16 hex
 * digits of a 64-bit FNV-1a hash of the whole name and _snapshot, 63
 * characters in all, so that two slots sharing a long prefix get markers
 * of their own.
 */
void obx_snapmark_name(const char *slot, char *out, size_t len);

/*
 * Writes the name of slot's guard slot into out (len: 64 is enough): the
 * physical slot that records that slot existed when the publication's
 * comment cannot (docs/internals/design.md, "Slot guard"): SLOT_guard for a
 * name of up to 57 characters, else its first 40, '_', the 16 hex digits
 * of the same hash and _guard.
 */
void obx_snapmark_guard_name(const char *slot, char *out, size_t len);

/*
 * Writes the name earlier versions gave the marker of a slot named over 54
 * characters (the name cut to 54, then _snapshot), a name any slot sharing
 * those 54 characters shares, into out and returns true; for a shorter name
 * writes "" and returns false (its marker's name never changed).
 */
bool obx_snapmark_legacy_name(const char *slot, char *out, size_t len);

#endif
