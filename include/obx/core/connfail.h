/*
 * connfail.h - what a failed connection attempt means (pure): whether the
 * refusal libpq reported can heal by itself.  libpq reports a connection
 * failure as text only (no SQLSTATE reaches the client before the session
 * exists), so the decision reads that text.
 */
#ifndef OBX_CONNFAIL_H
#define OBX_CONNFAIL_H

/*
 * Classifies msg, libpq's message for a connection that failed.  Returns
 * OBX_ECONFIG for what no retry heals (authentication, a database or role
 * that does not exist, pg_hba.conf, a certificate that does not verify, an
 * invalid option) and OBX_EIO for everything else: a refused connection, a
 * name that does not resolve yet (a Service being created, a DNS hiccup), a
 * TLS handshake cut short by a restarting server.
 */
int obx_connfail_class(const char *msg);

#endif
