#include "obx/core/err.h"

const char *
obx_strerror(int code)
{
	switch (code) {
	case OBX_OK:
		return "success";
	case OBX_ENOMEM:
		return "out of memory";
	case OBX_EINVAL:
		return "invalid value";
	case OBX_ERANGE:
		return "value out of range";
	case OBX_EPROTO:
		return "malformed protocol message";
	case OBX_ENOENT:
		return "not found";
	case OBX_EFULL:
		return "container full";
	case OBX_EIO:
		return "input/output error";
	case OBX_ECONFIG:
		return "configuration error";
	case OBX_ESTATE:
		return "invalid state";
	case OBX_EBUSY:
		return "in use by another";
	case OBX_ETIMEDOUT:
		return "timed out";
	case OBX_EFENCED:
		return "fenced by another producer";
	case OBX_EABORT:
		return "transaction must be aborted";
	case OBX_EFATAL:
		return "unrecoverable failure";
	}
	return "unknown error";
}
