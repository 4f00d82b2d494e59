/*
 * err.h - the one error model of outboxd.
 *
 * Functions that can fail return int: 0 on success, a negative OBX_E* code
 * otherwise.  obx_strerror() turns a code into a short lowercase phrase.
 * Functions that have more to say also take (char *errbuf, size_t errlen)
 * as their last two parameters and write one line there (no secrets, no
 * trailing period); errbuf is left as it was on success unless the
 * contract says otherwise.  A caller decides by the code, never by the
 * text: the text is for the log.
 *
 * Decisions are not errors.  An enum whose values say what the caller does
 * next, where success is one choice among several, stays an enum: the
 * delivery policy's inputs and outcomes (enum obx_produce_result, enum
 * obx_report_status, enum obx_dlv_gate, enum obx_dlv_outcome), the poll
 * batch's actions and answers (enum obx_poll_action, enum obx_poll_report,
 * enum obx_poll_drain), restart de-duplication's verdicts (enum
 * obx_dd_verdict), the exactly-once steps (enum obx_core_commit, enum
 * obx_progress_fence, enum obx_progress_floor), how a session ends (enum
 * obx_core_end) and the run policy's verdicts (runpolicy.h).  A function
 * that either succeeds or fails in one of several ways returns an OBX_E*
 * code: a failure that the caller must tell apart gets its own code here.
 * A positive return is a count or "found" (1) and the contract says so.
 *
 * A failure is latched only where it cannot be returned: a delivery report
 * handed to a callback (run/snapshot.c) or a builder that checks once at
 * its end (core/pollsql.c's statement buffer).  The latch holds the first
 * OBX_E* code, never a bool or a string, and the next call that can return
 * it does.
 */
#ifndef OBX_ERR_H
#define OBX_ERR_H

enum obx_err {
	OBX_OK = 0,
	OBX_ENOMEM = -1,     /* allocation failed */
	OBX_EINVAL = -2,     /* invalid argument or value */
	OBX_ERANGE = -3,     /* value out of range */
	OBX_EPROTO = -4,     /* malformed or truncated protocol message */
	OBX_ENOENT = -5,     /* no such thing (key, relation, column) */
	OBX_EFULL = -6,      /* bounded container is full */
	OBX_EIO = -7,        /* I/O failure (socket, file); transient: a new session may cure it */
	OBX_ECONFIG = -8,    /* configuration error */
	OBX_ESTATE = -9,     /* call not valid in the current state */
	OBX_EBUSY = -10,     /* held by someone else (a replication slot in use) */
	OBX_ETIMEDOUT = -11, /* not done in the time given; still under way: call again */
	OBX_EFENCED = -12,   /* another producer with the same transactional.id took over */
	OBX_EABORT = -13,    /* the Kafka transaction cannot commit: abort it and rewind */
	OBX_EFATAL = -14,    /* cannot heal by retrying (a producer unusable, a permanent refusal) */
};

/* Returns a static string for code; never NULL, also for unknown codes. */
const char *obx_strerror(int code);

#endif
