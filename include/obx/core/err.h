/*
 * err.h - the one error model of outboxd.
 *
 * Functions that can fail return int: 0 on success, a negative OBX_E* code
 * otherwise.  obx_strerror() turns a code into a short lowercase phrase.
 * Constructors and loaders that need more detail also take
 * (char *errbuf, size_t errlen) and write one line there.
 */
#ifndef OBX_ERR_H
#define OBX_ERR_H

enum obx_err {
	OBX_OK = 0,
	OBX_ENOMEM = -1,   /* allocation failed */
	OBX_EINVAL = -2,   /* invalid argument or value */
	OBX_ERANGE = -3,   /* value out of range */
	OBX_EPROTO = -4,   /* malformed or truncated protocol message */
	OBX_ENOENT = -5,   /* no such thing (key, relation, column) */
	OBX_EFULL = -6,    /* bounded container is full */
	OBX_EIO = -7,      /* I/O failure (socket, file) */
	OBX_ECONFIG = -8,  /* configuration error */
	OBX_ESTATE = -9,   /* call not valid in the current state */
	OBX_EBUSY = -10,   /* held by someone else (a replication slot in use) */
};

/* Returns a static string for code; never NULL, also for unknown codes. */
const char *obx_strerror(int code);

#endif
